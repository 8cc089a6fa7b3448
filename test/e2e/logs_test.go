package e2e

import (
	"encoding/json"
	"fmt"
	"os"
	"path/filepath"
	"regexp"
	"strings"
	"syscall"
	"testing"
	"time"
)

// journalStreamStderr, in the environment startAgentWithConfig gets, becomes JOURNAL_STREAM naming
// the agent's stderr, as systemd sets it for a unit whose StandardError is the journal.
const journalStreamStderr = "JOURNAL_STREAM=stderr"

// journalStreamOf is JOURNAL_STREAM for f: "DEVICE:INODE".
func journalStreamOf(t testing.TB, f *os.File) string {
	t.Helper()
	fi, err := f.Stat()
	if err != nil {
		t.Fatal(err)
	}
	st := fi.Sys().(*syscall.Stat_t)
	return fmt.Sprintf("%d:%d", st.Dev, st.Ino)
}

// journalLine is one line of the agent's stderr as journald reads it: the syslog priority of
// its "<N>" prefix and the JSON log line after it.
type journalLine struct {
	priority int
	fields   map[string]any
	text     string
}

var journalPrefix = regexp.MustCompile(`^<([0-7])>(.*)$`)

// journalLines parses every line of log, failing the test on one without a priority prefix or
// without JSON after it.
func journalLines(t *testing.T, log string) []journalLine {
	t.Helper()
	var out []journalLine
	for _, l := range strings.Split(strings.TrimSpace(log), "\n") {
		m := journalPrefix.FindStringSubmatch(l)
		if m == nil {
			t.Errorf("line without a journald priority prefix: %q", l)
			continue
		}
		jl := journalLine{priority: int(m[1][0] - '0'), text: l}
		if err := json.Unmarshal([]byte(m[2]), &jl.fields); err != nil {
			t.Errorf("line %q: not JSON after its prefix: %v", l, err)
			continue
		}
		out = append(out, jl)
	}
	return out
}

// TestJournalPriorities runs the agent as systemd would with StandardError=journal (JOURNAL_STREAM
// naming its stderr): every line carries the priority of its level, so `journalctl -p err` shows
// the errors (a notice with no trainer to signal), and the log speaks in seconds (*_s fields) and
// never shows the zero time for a notice without a deadline (a rebalance recommendation, which
// makes uploads urgent with no deadline).
func TestJournalPriorities(t *testing.T) {
	needPeers(t)
	sim := newIMDS(t)
	sim.start("spot", "-d", "100000") // a rebalance recommendation only
	ckdir := filepath.Join(t.TempDir(), "ckpt")
	if err := os.Mkdir(ckdir, 0o755); err != nil {
		t.Fatal(err)
	}
	ap := startAgent(t, sim, journalStreamStderr, noTrainer, "SPOTGUARD_CHECKPOINT_DIR="+ckdir,
		"SPOTGUARD_STORE_URL=file://"+t.TempDir(), "SPOTGUARD_STORE_JOB=logs")
	eventually(t, 20*time.Second, "uploads to turn urgent for the rebalance recommendation", func() bool {
		return strings.Contains(ap.log(t), `"message":"notice: uploading with every connection"`)
	})
	sim.stop()
	sim.start("spot", "-a", "terminate")
	eventually(t, 20*time.Second, "the spot notice to find no trainer", func() bool {
		for _, l := range strings.Split(ap.log(t), "\n") {
			if strings.Contains(l, `"notice":"spot/terminate"`) && strings.Contains(l, `"message":"no trainer process found`) {
				return true
			}
		}
		return false
	})
	ap.stop(t)

	log := ap.log(t)
	if strings.Contains(log, "0001-01-01") {
		t.Errorf("the log shows the zero time:\n%s", grepLines(log, "0001-01-01"))
	}
	want := map[string]int{"debug": 7, "info": 6, "warn": 4, "error": 3}
	byMsg := map[string][]journalLine{}
	for _, l := range journalLines(t, log) {
		level, _ := l.fields["level"].(string)
		if p, ok := want[level]; !ok || p != l.priority {
			t.Errorf("level %q has priority <%d>; want <%d>: %s", level, l.priority, p, l.text)
		}
		msg, _ := l.fields["message"].(string)
		byMsg[msg] = append(byMsg[msg], l)
		for k := range l.fields {
			if k == "since_detected" || k == "time_left" || k == "poll_interval" || k == "uptime" || k == "failing_for" {
				t.Errorf("duration field %q without its unit: %s", k, l.text)
			}
		}
	}
	one := func(msg string, prio int) journalLine {
		t.Helper()
		for _, l := range byMsg[msg] {
			if l.priority == prio {
				return l
			}
		}
		t.Errorf("no <%d> line %q", prio, msg)
		return journalLine{fields: map[string]any{}}
	}
	one("ready", 6)
	one("no trainer process found; the newest complete checkpoint is all there is", 3)
	if l := one("spotguard agent starting", 6); l.fields["poll_interval_s"] != 1.0 || l.fields["config"] != ap.configPath {
		t.Errorf("poll_interval_s = %v, config = %v; want 1 (seconds) and %s, the file read: %s", l.fields["poll_interval_s"], l.fields["config"], ap.configPath, l.text)
	}
	if l := one("bye", 6); l.fields["uptime_s"] == nil {
		t.Errorf("bye: no uptime_s: %s", l.text)
	}
	for _, l := range byMsg["notice: uploading with every connection"] {
		if _, ok := l.fields["deadline"]; ok && !strings.Contains(fmt.Sprint(l.fields["notices"]), "spot") {
			t.Errorf("uploads urgent for the rebalance recommendation alone, with a deadline: %s", l.text)
		}
	}
	for _, l := range byMsg["interruption notice detected"] {
		switch l.fields["source"] {
		case "rebalance":
			if _, ok := l.fields["deadline"]; ok || l.priority != 4 {
				t.Errorf("rebalance notice: want <4> and no deadline: %s", l.text)
			}
		case "spot":
			left, _ := l.fields["time_left_s"].(float64)
			if l.fields["deadline"] == nil || left <= 60 || left > 121 || l.priority != 4 {
				t.Errorf("spot notice: want <4>, a deadline and time_left_s in seconds (about 120): %s", l.text)
			}
		}
	}
	if len(byMsg["interruption notice detected"]) != 2 {
		t.Errorf("notices detected: %d lines; want the rebalance's and the spot's", len(byMsg["interruption notice detected"]))
	}
}
