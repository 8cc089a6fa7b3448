package agent

import (
	"slices"
	"strings"
	"syscall"
	"testing"
	"testing/synctest"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/rs/zerolog"

	"github.com/spotguard/spotguard/agent/imds"
	"github.com/spotguard/spotguard/agent/trainer"
)

// Trainer discovery that hangs (a trainer.pidfile on NFS that hangs, /proc of a process stuck in
// the kernel) held the coordinator's loop: the IMDS watcher then waited to hand it the spot
// notice, and the notice was never acted on, with /healthz 200. The notice path waits at most
// discoveryWait for it, then signals the processes found last; it says so once, names the
// problem, looks no more while the hung look lasts, and says when it returns.
func TestHungDiscoverySignalsTheProcessesFoundLast(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		var logs syncBuffer
		r := startRigLogging(t, true, nil, &logs)
		hang := make(chan struct{})
		r.tr.mu.Lock()
		r.tr.hang = hang
		r.tr.mu.Unlock()
		passFakeTime(trainerScanInterval + discoveryWait + time.Second) // a scan hangs, and is given up
		if got := r.c.status().TrainerProblems; !strings.Contains(got, trainer.ReasonDiscoveryHung+": trainer discovery has not returned since") ||
			!strings.Contains(got, "using the 1 processes it found at") {
			t.Errorf("trainer problems %q; want %s, with the processes used", got, trainer.ReasonDiscoveryHung)
		}

		begun := time.Now()
		r.begin(imds.SourceSpot, "terminate", begun.Add(2*time.Minute))
		if pids := r.tr.signalledPIDs(); len(pids) != 1 || pids[0] != 4242 {
			t.Fatalf("signalled %v with discovery hung; want 4242, found before it hung", pids)
		}
		if at := r.tr.sentAt[0]; at.Sub(begun) > 0 {
			t.Errorf("signalled %s after the notice; want at once while discovery is known to hang", at.Sub(begun))
		}
		if n := strings.Count(logs.String(), "trainer discovery has not returned for"); n != 1 {
			t.Errorf("%d lines say discovery hangs; want 1:\n%s", n, logs.String())
		}

		close(hang)
		passFakeTime(trainerScanInterval + time.Second)
		if !strings.Contains(logs.String(), "trainer discovery returns again") {
			t.Errorf("no line says discovery returns again:\n%s", logs.String())
		}
		if got := r.c.status().TrainerProblems; got != "" {
			t.Errorf("trainer problems %q after discovery returned; want none", got)
		}
	})
}

// A notice that comes while discovery hangs for the first time waits discoveryWait for it, no
// more.
func TestNoticeWaitsForHungDiscoveryAtMostItsWait(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		r := startRigLogging(t, true, nil, nil)
		hang := make(chan struct{})
		defer close(hang)
		r.tr.mu.Lock()
		r.tr.hang = hang
		r.tr.mu.Unlock()
		begun := time.Now()
		r.begin(imds.SourceSpot, "terminate", begun.Add(2*time.Minute))
		passFakeTime(discoveryWait)
		if pids := r.tr.signalledPIDs(); len(pids) != 1 || r.tr.sentAt[0].Sub(begun) > discoveryWait {
			t.Fatalf("signalled %v at %v; want 4242 within %s of the notice", pids, r.tr.sentAt, discoveryWait)
		}
	})
}

// /healthz says so when the coordinator's loop has not gone round for more than loopStuck: the
// watchdog stopped being pinged, but the health said 200.
func TestHealthSaysTheNoticePathIsStuck(t *testing.T) {
	cfg := mustLoad(t, LoadOptions{Environ: []string{"SPOTGUARD_HTTP_LISTEN=", "SPOTGUARD_TRAINER_MATCH=x",
		"SPOTGUARD_AGENT_RUNTIME_DIR=" + t.TempDir()}})
	a, err := New(cfg, Deps{Logger: zerolog.Nop(), IMDS: newFakeIMDS()})
	if err != nil {
		t.Fatal(err)
	}
	now := time.Now()
	if v := a.health(now); strings.Contains(strings.Join(v.Reasons, "\n"), "notice path") {
		t.Errorf("before the loop runs: %q; want no word of it", v.Reasons)
	}
	a.coord.alive.Store(now.Add(-loopStuck + time.Second).UnixNano())
	if v := a.health(now); strings.Contains(strings.Join(v.Reasons, "\n"), "notice path") {
		t.Errorf("loop went round %s ago: %q; want no word of it", loopStuck-time.Second, v.Reasons)
	}
	a.coord.alive.Store(now.Add(-loopStuck - 2*time.Second).UnixNano())
	v := a.health(now)
	if v.Healthy || !strings.Contains(strings.Join(v.Reasons, "\n"), "the notice path's loop has not gone round for 12s: a notice would not be acted on") {
		t.Errorf("loop stuck for 12 s: healthy %v, %q; want unhealthy, saying so", v.Healthy, v.Reasons)
	}
}

// cfgTrainers finds by trainer.match: "old" finds PID 1, anything else PID 2. Find with "old"
// waits for findOld, Catches of PID 1 for catchOld (each closed to let them go).
type cfgTrainers struct {
	fakeTrainers
	findOld, catchOld chan struct{}
}

func (f *cfgTrainers) Find(cfg *Config) ([]trainer.Process, []trainer.Problem) {
	if cfg.Trainer.Match.String() == "old" {
		<-f.findOld
		return []trainer.Process{{PID: 1, Cmdline: "python old.py", Via: trainer.ViaMatch}}, nil
	}
	return []trainer.Process{{PID: 2, Cmdline: "python new.py", Via: trainer.ViaMatch}}, nil
}

func (f *cfgTrainers) Catches(pid int, _ syscall.Signal) (bool, error) {
	if pid == 1 {
		<-f.catchOld
	}
	return true, nil
}

// A look for the trainer begun before a reload ends after the reload's own look: its answer, of
// the old trainer.pidfile or match, was the reload's (the reload joined the Find in flight), or
// stood over the reload's answer until the next look, 10 s later. (Found by a flaky test.)
func TestLookBeforeAReloadDoesNotAnswerForIt(t *testing.T) {
	load := func(match string) *Config {
		cfg := mustLoad(t, LoadOptions{Environ: []string{"SPOTGUARD_TRAINER_MATCH=" + match, "SPOTGUARD_AGENT_RUNTIME_DIR=" + t.TempDir()}})
		if err := cfg.Validate(); err != nil {
			t.Fatal(err)
		}
		return cfg
	}
	oldCfg, newCfg := load("old"), load("new")
	pids := func(ts []TrainerStatus) []int {
		var out []int
		for _, t := range ts {
			out = append(out, t.PID)
		}
		return out
	}

	// start returns a coordinator whose config is newCfg, on cfgTrainers.
	start := func() (*cfgTrainers, *Coordinator) {
		ft := &cfgTrainers{findOld: make(chan struct{}), catchOld: make(chan struct{})}
		return ft, newCoordinator(zerolog.Nop(), newMetrics(prometheus.NewRegistry(), func() imds.Stats { return imds.Stats{} }),
			func() *Config { return newCfg }, ft)
	}

	t.Run("the reload's look waits for the old Find", func(t *testing.T) {
		synctest.Test(t, func(t *testing.T) {
			ft, c := start()
			close(ft.catchOld)
			go c.scan(oldCfg)
			synctest.Wait() // the old look's Find is in flight
			got := make(chan []trainer.Process)
			go func() { got <- c.scan(newCfg) }()
			synctest.Wait()
			close(ft.findOld)
			if procs := <-got; len(procs) != 1 || procs[0].PID != 2 {
				t.Errorf("the reload's look found %v; want PID 2, of the new match", procs)
			}
			synctest.Wait()
			if found := pids(c.status().Trainers); !slices.Equal(found, []int{2}) {
				t.Errorf("trainers found %v; want [2]", found)
			}
		})
	})
	t.Run("the old look ending last is not kept", func(t *testing.T) {
		synctest.Test(t, func(t *testing.T) {
			ft, c := start()
			close(ft.findOld)
			oldDone := make(chan struct{})
			go func() { c.scan(oldCfg); close(oldDone) }()
			synctest.Wait() // the old look asks whether PID 1 catches the signal
			c.scan(newCfg)
			close(ft.catchOld)
			<-oldDone
			if found := pids(c.status().Trainers); !slices.Equal(found, []int{2}) {
				t.Errorf("trainers found %v after the old look ended last; want [2], the newer look's", found)
			}
		})
	})
}
