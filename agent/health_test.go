package agent

import (
	"context"
	"errors"
	"net/http"
	"net/http/httptest"
	"testing"
	"testing/synctest"
	"time"

	"github.com/rs/zerolog"
)

// downIMDS fails every read, as an unreachable IMDS does.
type downIMDS struct{}

func (downIMDS) Get(ctx context.Context, path string) ([]byte, bool, error) {
	return nil, false, errors.New("dial tcp 169.254.169.254:80: connect: connection refused")
}

// /healthz stays healthy through 30 s of IMDS failure (start-up grace), then turns 503; the agent
// keeps running throughout.
func TestHealthzTurnsUnhealthyAfter30s(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		cfg := mustLoad(t, LoadOptions{Environ: []string{"SPOTGUARD_HTTP_LISTEN=", "SPOTGUARD_TRAINER_MATCH=no-such-trainer",
			"SPOTGUARD_AGENT_RUNTIME_DIR=" + t.TempDir()}})
		a, err := New(cfg, Deps{Logger: zerolog.Nop(), IMDS: downIMDS{}})
		if err != nil {
			t.Fatal(err)
		}
		ctx, cancel := context.WithCancel(t.Context())
		done := make(chan error)
		go func() { done <- a.Run(ctx) }()

		healthz := func() int {
			rec := httptest.NewRecorder()
			a.Handler().ServeHTTP(rec, httptest.NewRequest(http.MethodGet, "/healthz", nil))
			return rec.Code
		}
		<-time.After(29 * time.Second) // fake time: the bubble's clock jumps
		synctest.Wait()
		if code := healthz(); code != http.StatusOK {
			t.Errorf("/healthz after 29 s of failures = %d; want 200", code)
		}
		<-time.After(2 * time.Second)
		synctest.Wait()
		if code := healthz(); code != http.StatusServiceUnavailable {
			t.Errorf("/healthz after 31 s of failures = %d; want 503", code)
		}
		if st := a.watcher.Stats().Sources["spot"]; st.Errors < 31 {
			t.Errorf("spot errors after 31 s = %d; want at least one per second (backoff capped at the poll interval)", st.Errors)
		}
		cancel()
		if err := <-done; err != nil {
			t.Errorf("Run() = %v; want nil", err)
		}
	})
}

// /debug/pprof/ is served only with http.pprof.
func TestPProfOnlyWhenAsked(t *testing.T) {
	for _, tc := range []struct {
		env  string
		want int
	}{{"SPOTGUARD_HTTP_PPROF=false", http.StatusNotFound}, {"SPOTGUARD_HTTP_PPROF=true", http.StatusOK}} {
		cfg := mustLoad(t, LoadOptions{Environ: []string{"SPOTGUARD_HTTP_LISTEN=", "SPOTGUARD_TRAINER_MATCH=no-such-trainer",
			"SPOTGUARD_AGENT_RUNTIME_DIR=" + t.TempDir(), tc.env}})
		a, err := New(cfg, Deps{Logger: zerolog.Nop(), IMDS: downIMDS{}})
		if err != nil {
			t.Fatal(err)
		}
		for _, path := range []string{"/debug/pprof/", "/debug/pprof/heap"} {
			rec := httptest.NewRecorder()
			a.Handler().ServeHTTP(rec, httptest.NewRequest(http.MethodGet, path, nil))
			if rec.Code != tc.want {
				t.Errorf("Got(%q) GET %s = %d; want %d", tc.env, path, rec.Code, tc.want)
			}
		}
	}
}
