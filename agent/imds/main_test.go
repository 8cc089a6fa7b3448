package imds

import (
	"bufio"
	"bytes"
	"encoding/json"
	"sync"
	"testing"

	"go.uber.org/goleak"
)

func TestMain(m *testing.M) {
	goleak.VerifyTestMain(m)
}

// logBuffer collects zerolog JSON output; it is safe for concurrent use.
type logBuffer struct {
	mu sync.Mutex
	b  bytes.Buffer
}

func (l *logBuffer) Write(p []byte) (int, error) {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.b.Write(p)
}

// lines returns the parsed log lines with the given level and message whose "source" field
// is source (any source when source is "").
func (l *logBuffer) lines(t testing.TB, level, msg string, source Source) []map[string]any {
	t.Helper()
	l.mu.Lock()
	defer l.mu.Unlock()
	var out []map[string]any
	sc := bufio.NewScanner(bytes.NewReader(l.b.Bytes()))
	for sc.Scan() {
		var m map[string]any
		if err := json.Unmarshal(sc.Bytes(), &m); err != nil {
			t.Fatalf("log line %q is not JSON: %v", sc.Text(), err)
		}
		if m["level"] == level && m["message"] == msg && (source == "" || m["source"] == string(source)) {
			out = append(out, m)
		}
	}
	return out
}

func (l *logBuffer) String() string {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.b.String()
}

// The fixed log messages the tests count.
const (
	msgFailed    = "imds read failed; retrying with backoff"
	msgRecovered = "imds read recovered"
)
