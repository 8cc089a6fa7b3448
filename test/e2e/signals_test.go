package e2e

import (
	"fmt"
	"net/http"
	"net/http/httptest"
	"net/http/httputil"
	"net/url"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"
)

// The agent's own signals, sent to the real process: SIGHUP reloads the config file (an invalid
// one is refused and the agent keeps running on the old one), SIGUSR1 requests a sync, SIGTERM
// stops it with exit 0.
func TestAgentSignals(t *testing.T) {
	needPeers(t)
	sim := newIMDS(t)
	sim.start("spot", "-d", "100000", "--rebalance-delay-sec", "100000")
	tp := startTrainer(t)
	ap := startAgentWithConfig(t, sim, "trainer:\n  match: no-such-trainer-anywhere\n")
	if got := len(ap.status(t).Trainers); got != 0 {
		t.Fatalf("trainers before reload = %d; want 0", got)
	}

	// An invalid config: refused with every problem, the agent goes on.
	writeFile(t, ap.configPath, "trainer:\n  pidfile: "+tp.pidfile+"\n  signal: SIGKILL\nimds:\n  poll_interval: 1ms\n")
	ap.cmd.Process.Signal(syscall.SIGHUP)
	eventually(t, waitSignal, "the refused reload in the log", func() bool {
		return strings.Count(ap.log(t), "config reload refused") == 2
	})
	if got := len(ap.status(t).Trainers); got != 0 {
		t.Errorf("trainers after a refused reload = %d; want 0 (old config kept)", got)
	}

	// A valid one: the trainer is found by its pidfile now.
	writeFile(t, ap.configPath, "trainer:\n  pidfile: "+tp.pidfile+"\n")
	ap.cmd.Process.Signal(syscall.SIGHUP)
	eventually(t, waitSignal, "the reloaded config to find the trainer", func() bool {
		tr := ap.status(t).Trainers
		return len(tr) == 1 && tr[0].PID == tp.cmd.Process.Pid && tr[0].CatchesSignal
	})
	if !hasLine(ap.metrics(t), `spotguard_config_reloads_total{result="invalid"} 1`) || !hasLine(ap.metrics(t), `spotguard_config_reloads_total{result="ok"} 1`) {
		t.Errorf("/metrics reload counters:\n%s", grepLines(ap.metrics(t), "reloads"))
	}

	ap.cmd.Process.Signal(syscall.SIGUSR1)
	eventually(t, waitSignal, "the sync request to be counted", func() bool {
		return hasLine(ap.metrics(t), "spotguard_sync_requests_total 1")
	})

	start := time.Now()
	ap.cmd.Process.Signal(syscall.SIGTERM)
	select {
	case <-ap.done:
	case <-time.After(5 * time.Second):
		t.Fatal("agent did not exit within 5 s of SIGTERM")
	}
	if ap.exitErr != nil {
		t.Errorf("agent exit after SIGTERM: %v; want 0", ap.exitErr)
	}
	if d := time.Since(start); d > 2*time.Second {
		t.Errorf("idle agent took %s to stop; want under 2 s", d)
	}
	if _, err := http.Get(ap.base + "/healthz"); err == nil {
		t.Errorf("listener still answers after exit")
	}
	if !tp.alive() {
		t.Errorf("trainer died")
	}
}

func writeFile(t *testing.T, path, text string) {
	t.Helper()
	if err := os.WriteFile(path, []byte(text), 0o644); err != nil {
		t.Fatal(err)
	}
}

// SIGHUP applies what it can and names the rest: adding a store, a checkpoint.dir and a GPU
// sample interval (read only at start) is reported in the log, /status and /healthz and changes
// nothing, while the trainer's pidfile (live) is applied at once; the store comes with a restart.
func TestReloadNamesWhatNeedsARestart(t *testing.T) {
	needPeers(t)
	sim := newIMDS(t)
	sim.start("spot", "-d", "100000", "--rebalance-delay-sec", "100000")
	tp := startTrainer(t)
	ap := startAgentWithConfig(t, sim, "trainer:\n  match: no-such-trainer-anywhere\n")
	storeDir, ckdir := t.TempDir(), t.TempDir()
	writeFile(t, ap.configPath, "trainer:\n  pidfile: "+tp.pidfile+"\ngpu:\n  sample_interval: 30s\n"+
		"store:\n  url: file://"+storeDir+"\n  job: e2e\ncheckpoint:\n  dir: "+ckdir+"\n")
	ap.cmd.Process.Signal(syscall.SIGHUP)
	eventually(t, waitSignal, "the reload to find the trainer", func() bool {
		tr := ap.status(t).Trainers
		return len(tr) == 1 && tr[0].PID == tp.cmd.Process.Pid
	})
	want := "checkpoint.dir,gpu.sample_interval,store.job,store.url"
	if got := strings.Join(ap.status(t).Config.NeedRestart, ","); got != want {
		t.Errorf("/status config.need_restart = %q; want %q", got, want)
	}
	if lines := ap.logLines(t, "config reloaded"); len(lines) != 1 || fmt.Sprint(lines[0]["applied"]) != "[trainer.match trainer.pidfile]" {
		t.Errorf("config reloaded log lines = %v; want one applying trainer.match and trainer.pidfile", lines)
	}
	if code, h := ap.healthz(t); code != http.StatusOK || !strings.Contains(strings.Join(h.Warnings, " "), "store.url") {
		t.Errorf("/healthz = %d %+v; want 200 with a warning naming store.url", code, h)
	}
	if ap.status(t).Uploads != nil {
		t.Errorf("/status shows uploads: the store was taken up without a restart")
	}
}

// A SIGHUP and a SIGUSR1 that come while the agent is still starting (here: while it asks IMDS
// for its region) are handled once it runs, not their default action: a script or trainer that
// signals an agent just started killed it (found from outside: exit 129, no log line).
func TestSignalsWhileTheAgentStartsAreHandledOnceItRuns(t *testing.T) {
	needPeers(t)
	sim := quietIMDS(t)
	target, err := url.Parse(sim.endpoint())
	if err != nil {
		t.Fatal(err)
	}
	reached, release := make(chan struct{}), make(chan struct{})
	var once sync.Once
	proxy := httputil.NewSingleHostReverseProxy(target)
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if strings.HasSuffix(r.URL.Path, "/placement/region") {
			first := false
			once.Do(func() { first = true; close(reached) })
			if first {
				select {
				case <-release:
				case <-r.Context().Done():
					return
				}
			}
		}
		proxy.ServeHTTP(w, r)
	}))
	t.Cleanup(srv.Close)
	endpoint := "AWS_EC2_METADATA_SERVICE_ENDPOINT=" + srv.URL
	go func() {
		select {
		case <-reached:
		case <-time.After(20 * time.Second):
			return // startAgent fails: the agent never asked
		}
		defer close(release)
		pid := pidWithEnv(endpoint)
		if pid == 0 {
			return // the test fails below: no reload is logged
		}
		syscall.Kill(pid, syscall.SIGHUP)
		syscall.Kill(pid, syscall.SIGUSR1)
	}()
	ap := startAgentWithConfig(t, sim, "trainer:\n  match: no-such-trainer-anywhere\n", endpoint)
	eventually(t, waitSignal, "the early SIGHUP's reload and SIGUSR1's sync to be counted", func() bool {
		m := ap.metrics(t)
		return hasLine(m, `spotguard_config_reloads_total{result="ok"} 1`) && hasLine(m, "spotguard_sync_requests_total 1")
	})
	select {
	case <-ap.done:
		t.Fatalf("the agent exited: %v", ap.exitErr)
	default:
	}
}

// pidWithEnv returns the pid of a process whose environment holds kv, or 0.
func pidWithEnv(kv string) int {
	procs, _ := filepath.Glob("/proc/[0-9]*/environ")
	for _, p := range procs {
		data, err := os.ReadFile(p)
		if err != nil || !slices.Contains(strings.Split(string(data), "\x00"), kv) {
			continue
		}
		pid, _ := strconv.Atoi(filepath.Base(filepath.Dir(p)))
		return pid
	}
	return 0
}
