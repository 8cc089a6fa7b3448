package e2e

import (
	"encoding/json"
	"net/http"
	"os"
	"path/filepath"
	"regexp"
	"strings"
	"testing"
	"time"
)

const waitSignal = 15 * time.Second

// noticeJSON is notice.json as a trainer reads it.
type noticeJSON struct {
	Source   string     `json:"source"`
	Action   string     `json:"action"`
	EventID  string     `json:"event_id"`
	Deadline *time.Time `json:"deadline"`
}

func readNotice(t *testing.T, ap *agentProc) noticeJSON {
	t.Helper()
	b, err := os.ReadFile(filepath.Join(ap.runtimeDir, "notice.json"))
	if err != nil {
		t.Fatalf("read notice.json: %v", err)
	}
	var n noticeJSON
	if err := json.Unmarshal(b, &n); err != nil {
		t.Fatalf("notice.json %q: %v", b, err)
	}
	return n
}

// waitSignals waits for the trainer to have recorded n signals.
func waitSignals(t *testing.T, tp *trainerProc, n int) []signalRecord {
	t.Helper()
	eventually(t, waitSignal, "the trainer to record a signal", func() bool { return len(tp.signals(t)) >= n })
	return tp.signals(t)
}

// assertStillSignals checks, after the agent has read source three more times, that the trainer has
// still received exactly want signals: the notice is not re-sent on every poll.
func assertStillSignals(t *testing.T, ap *agentProc, tp *trainerProc, source string, want int) {
	t.Helper()
	ap.waitPolls(t, source, 3)
	if got := len(tp.signals(t)); got != want {
		t.Errorf("trainer received %d signals after 3 more polls of %s; want exactly %d", got, source, want)
	}
}

type noticeCase struct {
	name    string
	sim     []string // ec2-metadata-mock subcommand and flags
	env     []string // extra agent environment
	key     string   // the notice key that must be signalled
	source  string
	action  string
	hasDead bool // notice.json carries a deadline
}

func TestNoticeSignalsTrainer(t *testing.T) {
	needPeers(t)
	cases := []noticeCase{
		{name: "spot terminate", sim: []string{"spot", "-a", "terminate"}, env: []string{"SPOTGUARD_NOTICES_REBALANCE=ignore"},
			key: "spot/terminate", source: "spot", action: "terminate", hasDead: true},
		{name: "spot stop", sim: []string{"spot", "-a", "stop"}, env: []string{"SPOTGUARD_NOTICES_REBALANCE=ignore"},
			key: "spot/stop", source: "spot", action: "stop", hasDead: true},
		{name: "rebalance recommendation", sim: []string{"spot", "-d", "3600"},
			key: "rebalance/rebalance", source: "rebalance", action: "rebalance", hasDead: false},
		{name: "ASG Terminated", sim: []string{"asglifecycle"},
			key: "asg/Terminated", source: "asg", action: "Terminated", hasDead: true},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			sim := newIMDS(t)
			sim.start(tc.sim...)
			tp := startTrainer(t)
			ap := startAgent(t, sim, append([]string{"SPOTGUARD_TRAINER_PIDFILE=" + tp.pidfile}, tc.env...)...)

			sigs := waitSignals(t, tp, 1)
			if sigs[0].Signal != "SIGUSR1" || sigs[0].PID != tp.cmd.Process.Pid {
				t.Errorf("trainer recorded %+v; want SIGUSR1 to pid %d", sigs[0], tp.cmd.Process.Pid)
			}
			n := readNotice(t, ap)
			if n.Source != tc.source || n.Action != tc.action || (n.Deadline != nil) != tc.hasDead {
				t.Errorf("notice.json = %+v; want source %q action %q, deadline present %v", n, tc.source, tc.action, tc.hasDead)
			}
			if n.Deadline != nil {
				if left := time.Until(*n.Deadline); left < 30*time.Second || left > 3*time.Minute {
					t.Errorf("notice.json deadline %s is %s away; want about 2 minutes", n.Deadline, left)
				}
			}
			assertStillSignals(t, ap, tp, tc.source, 1)
			if !tp.alive() {
				t.Errorf("trainer died; a checkpoint signal must not end it")
			}

			st := ap.status(t)
			var found bool
			for _, ns := range st.Notices {
				if ns.Key != tc.key {
					continue
				}
				found = true
				if ns.State != "trainer_signalled" || !ns.Active {
					t.Errorf("/status notice %s: state %q active %v; want trainer_signalled, active", ns.Key, ns.State, ns.Active)
				}
				if len(ns.Transitions) < 2 || ns.Transitions[0].State != "detected" || ns.Transitions[1].State != "trainer_signalled" {
					t.Errorf("/status notice %s transitions %+v; want detected → trainer_signalled", ns.Key, ns.Transitions)
				}
				if len(ns.Signals) != 1 || ns.Signals[0].Outcome != "sent" {
					t.Errorf("/status notice %s signals %+v; want one sent", ns.Key, ns.Signals)
				}
			}
			if !found {
				t.Errorf("/status has no notice %s: %+v", tc.key, st.Notices)
			}
			if st.Instance.InstanceID != "i-1234567890abcdef0" || st.Instance.InstanceType == "" || st.Instance.AvailabilityZone == "" {
				t.Errorf("/status instance = %+v; want the simulator's identity", st.Instance)
			}
			if m := ap.metrics(t); !hasLine(m, `spotguard_notices_total{action="`+tc.action+`",source="`+tc.source+`"} 1`) {
				t.Errorf("/metrics lacks spotguard_notices_total for %s/%s = 1:\n%s", tc.source, tc.action, grepLines(m, "spotguard_notices_total"))
			}
		})
	}
}

// TestSpotIgnoresRebalanceWhenSoConfigured: with both notices served, an ignored source is recorded
// but never signals.
func TestIgnoredSourceIsRecordedNotSignalled(t *testing.T) {
	needPeers(t)
	sim := newIMDS(t)
	sim.start("spot", "-d", "3600")
	tp := startTrainer(t)
	ap := startAgent(t, sim, "SPOTGUARD_TRAINER_PIDFILE="+tp.pidfile, "SPOTGUARD_NOTICES_REBALANCE=ignore")
	eventually(t, waitSignal, "the rebalance notice in /status", func() bool {
		for _, ns := range ap.status(t).Notices {
			if ns.Key == "rebalance/rebalance" && ns.State == "ignored" {
				return true
			}
		}
		return false
	})
	assertStillSignals(t, ap, tp, "rebalance", 0)
}

func TestTrainerFoundByMatch(t *testing.T) {
	needPeers(t)
	sim := newIMDS(t)
	sim.start("spot", "-a", "terminate")
	tp := startTrainer(t)
	other := startTrainer(t) // not matched: must not be signalled
	ap := startAgent(t, sim, "SPOTGUARD_TRAINER_MATCH="+regexp.QuoteMeta(tp.tag), "SPOTGUARD_NOTICES_REBALANCE=ignore")
	waitSignals(t, tp, 1)
	assertStillSignals(t, ap, tp, "spot", 1)
	if got := len(other.signals(t)); got != 0 {
		t.Errorf("unmatched process received %d signals; want 0", got)
	}
}

func TestScheduledEventThenCanceled(t *testing.T) {
	needPeers(t)
	sim := newIMDS(t)
	sim.start("events", "-o", "instance-stop", "-t", "active")
	tp := startTrainer(t)
	ap := startAgent(t, sim, "SPOTGUARD_TRAINER_PIDFILE="+tp.pidfile)
	waitSignals(t, tp, 1)
	n := readNotice(t, ap)
	if n.Source != "scheduled" || n.Action != "instance-stop" || n.EventID == "" || n.Deadline == nil {
		t.Errorf("notice.json = %+v; want scheduled instance-stop with event id and deadline", n)
	}

	// The same event, now canceled: the notice ends, nothing is sent again.
	sim.stop()
	sim.start("events", "-o", "instance-stop", "-t", "canceled")
	eventually(t, waitSignal, "the scheduled notice to end", func() bool {
		for _, ns := range ap.status(t).Notices {
			if strings.HasPrefix(ns.Key, "scheduled/instance-stop/") && !ns.Active {
				return ns.Transitions[len(ns.Transitions)-1].State == "ended"
			}
		}
		return false
	})
	assertStillSignals(t, ap, tp, "scheduled", 1)
}

func TestIMDSRestartsMidRun(t *testing.T) {
	needPeers(t)
	sim := newIMDS(t)
	sim.start("spot", "-a", "terminate")
	tp := startTrainer(t)
	ap := startAgent(t, sim, "SPOTGUARD_TRAINER_PIDFILE="+tp.pidfile, "SPOTGUARD_NOTICES_REBALANCE=ignore")
	waitSignals(t, tp, 1)

	sim.stop()
	before := ap.status(t).IMDS.Sources["spot"].Errors
	eventually(t, waitSignal, "the agent to count IMDS errors", func() bool {
		return ap.status(t).IMDS.Sources["spot"].Errors > before
	})
	sim.start("spot", "-a", "terminate")
	// The notice is still there after the restart (with a new time): still one signal.
	assertStillSignals(t, ap, tp, "spot", 1)
	resp, err := http.Get(ap.base + "/healthz")
	if err != nil {
		t.Fatal(err)
	}
	resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		t.Errorf("/healthz = %d after IMDS came back; want 200", resp.StatusCode)
	}
	if log := ap.log(t); strings.Count(log, `"message":"imds read failed; retrying with backoff"`) > 4 {
		t.Errorf("agent logged the IMDS failure %d times; want once per streak per source", strings.Count(log, `"message":"imds read failed; retrying with backoff"`))
	}
}

func TestAgentStartsBeforeIMDS(t *testing.T) {
	needPeers(t)
	sim := newIMDS(t) // not started yet: connections are refused
	tp := startTrainer(t)
	ap := startAgent(t, sim, "SPOTGUARD_TRAINER_PIDFILE="+tp.pidfile, "SPOTGUARD_NOTICES_REBALANCE=ignore")
	eventually(t, waitSignal, "IMDS errors to be counted", func() bool {
		return ap.status(t).IMDS.Sources["spot"].Errors > 0
	})
	sim.start("spot", "-a", "terminate")
	waitSignals(t, tp, 1)
	eventually(t, waitSignal, "the instance identity", func() bool {
		return ap.status(t).Instance.InstanceID == "i-1234567890abcdef0"
	})
}

func TestUncaughtSignalIsNotSent(t *testing.T) {
	needPeers(t)
	sim := newIMDS(t)
	sim.start("spot", "-a", "terminate")
	tp := startTrainer(t, "--no-handler")
	ap := startAgent(t, sim, "SPOTGUARD_TRAINER_PIDFILE="+tp.pidfile, "SPOTGUARD_NOTICES_REBALANCE=ignore")
	eventually(t, waitSignal, "the notice to be handled", func() bool {
		for _, ns := range ap.status(t).Notices {
			if ns.Key == "spot/terminate" && ns.State == "trainer_not_signalled" {
				return len(ns.Signals) == 1 && ns.Signals[0].Outcome == "not_caught"
			}
		}
		return false
	})
	if !tp.alive() {
		t.Fatalf("trainer without a SIGUSR1 handler died: the agent sent a signal it does not catch")
	}
	st := ap.status(t)
	if len(st.Trainers) != 1 || st.Trainers[0].CatchesSignal {
		t.Errorf("/status trainers = %+v; want one that does not catch the signal", st.Trainers)
	}
	if m := ap.metrics(t); !hasLine(m, "spotguard_trainer_signal_uncaught_processes 1") {
		t.Errorf("/metrics: want spotguard_trainer_signal_uncaught_processes 1:\n%s", grepLines(m, "uncaught"))
	}
	if log := ap.log(t); !strings.Contains(log, "does not catch the signal; NOT sent") {
		t.Errorf("agent log does not say loudly that the trainer does not catch the signal")
	}
}

func TestStalePidfileIsReportedNotFatal(t *testing.T) {
	needPeers(t)
	sim := newIMDS(t)
	sim.start("spot", "-a", "terminate")
	pidfile := filepath.Join(t.TempDir(), "trainer.pid")
	if err := os.WriteFile(pidfile, []byte("999999999\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	ap := startAgent(t, sim, "SPOTGUARD_TRAINER_PIDFILE="+pidfile, "SPOTGUARD_NOTICES_REBALANCE=ignore")
	eventually(t, waitSignal, "the notice to be handled without a trainer", func() bool {
		for _, ns := range ap.status(t).Notices {
			if ns.Key == "spot/terminate" && ns.State == "trainer_not_signalled" {
				return true
			}
		}
		return false
	})
	if m := ap.metrics(t); !hasLine(m, `spotguard_trainer_discovery_problems_total{reason="stale_pidfile"}`) {
		t.Errorf("/metrics lacks the stale pidfile problem:\n%s", grepLines(m, "discovery"))
	}
}

func grepLines(text, substr string) string {
	var out []string
	for _, l := range strings.Split(text, "\n") {
		if strings.Contains(l, substr) {
			out = append(out, l)
		}
	}
	return strings.Join(out, "\n")
}
