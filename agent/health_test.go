package agent

import (
	"context"
	"errors"
	"net/http"
	"net/http/httptest"
	"os"
	"slices"
	"strings"
	"testing"
	"testing/synctest"
	"time"

	"github.com/rs/zerolog"

	"github.com/spotguard/spotguard/agent/imds"
)

// downIMDS fails every read, as an unreachable IMDS does.
type downIMDS struct{}

func (downIMDS) Get(ctx context.Context, path string) ([]byte, bool, error) {
	return nil, false, errors.New("dial tcp 169.254.169.254:80: connect: connection refused")
}

// garbageSpotIMDS answers spot/instance-action with a page no notice is read from, and 404 on the
// other sources.
type garbageSpotIMDS struct{}

func (garbageSpotIMDS) Get(ctx context.Context, path string) ([]byte, bool, error) {
	if path == imds.SourceSpot.Path() {
		return []byte("<html>502 Bad Gateway</html>"), true, nil
	}
	return nil, false, nil
}

// A spot answer the agent cannot read for 30 s is a 503 as a failing source is, but it said
// "an interruption notice would not be seen" while the agent acted on its fail-safe notice; it
// says that it does.
func TestHealthzDuringAnUnreadableSpotAnswerSaysTheFailSafeNoticeIsActedOn(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		a, stop := runBubbleAgent(t, garbageSpotIMDS{})
		<-time.After(31 * time.Second)
		synctest.Wait()
		v := a.health(time.Now())
		reasons := strings.Join(v.Reasons, "\n")
		if v.Healthy || !strings.Contains(reasons, "has answered with a body it cannot read for 31s; the agent acts on a fail-safe notice") ||
			strings.Contains(reasons, "would not be seen") {
			t.Errorf("health after 31 s of unreadable spot answers: %v %q; want unhealthy, saying the fail-safe notice is acted on", v.Healthy, v.Reasons)
		}
		stop()
	})
}

// runBubbleAgent runs an agent without a listener or a store on the IMDS g, its trainer a fake
// one (a notice signals no real process), in the synctest bubble of t; stop ends it and checks
// that Run returned nil.
func runBubbleAgent(t *testing.T, g imds.Getter) (a *Agent, stop func()) {
	t.Helper()
	return runSignalAgentLog(t, t.TempDir(), g, &fakeTrainers{}, zerolog.Nop())
}

// /healthz stays healthy through 30 s of IMDS failure (start-up grace), then turns 503; the agent
// keeps running throughout.
func TestHealthzTurnsUnhealthyAfter30s(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		a, stop := runBubbleAgent(t, downIMDS{})
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
		stop()
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

// The configuration's warnings were said only in the agent's first lines: /healthz says them, as
// warnings (healthy), those of the shipped units' sandbox only under systemd.
func TestHealthzSaysTheConfigurationsWarnings(t *testing.T) {
	for _, underUnit := range []bool{false, true} {
		runtime, err := os.MkdirTemp("/tmp", "spotguard-health-")
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { os.RemoveAll(runtime) })
		ta := startAgentWith(t, func(d *Deps) { d.UnderUnit = underUnit },
			"SPOTGUARD_TRAINER_PIDFILE=/nonexistent", "SPOTGUARD_AGENT_RUNTIME_DIR="+runtime, "SPOTGUARD_IMDS_SPOT_POLL_INTERVAL=5s")
		v := ta.a.health(time.Now())
		warnings := strings.Join(v.Warnings, "\n")
		if !strings.Contains(warnings, "imds.spot_poll_interval: 5s: a spot notice may be seen 5s late") || !strings.Contains(warnings, "; fix: set imds.spot_poll_interval to") ||
			!slices.Contains(v.short, "configuration: imds.spot_poll_interval") {
			t.Errorf("under a unit %v: warnings %q, short %q; want the slow spot polling said, with its fix", underUnit, v.Warnings, v.short)
		}
		if got := strings.Contains(warnings, "agent.runtime_dir: "+runtime+" is under /tmp"); got != underUnit {
			t.Errorf("under a unit %v: agent.runtime_dir under /tmp said %v; want %v: %q", underUnit, got, underUnit, v.Warnings)
		}
	}
}
