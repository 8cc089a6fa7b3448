package agent

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io/fs"
	"net"
	"net/http"
	"net/http/httptest"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	dto "github.com/prometheus/client_model/go"
	"github.com/rs/zerolog"
	"go.uber.org/goleak"

	"github.com/spotguard/spotguard/agent/imds"
	"github.com/spotguard/spotguard/agent/trainer"
	"github.com/spotguard/spotguard/checkpoint"
)

func TestMain(m *testing.M) {
	goleak.VerifyTestMain(m)
}

// fakeIMDS serves fixed bodies by path; paths it does not know are 404.
type fakeIMDS struct {
	mu     sync.Mutex
	bodies map[string]string
}

func (f *fakeIMDS) Get(ctx context.Context, path string) ([]byte, bool, error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	b, ok := f.bodies[path]
	return []byte(b), ok, nil
}

func (f *fakeIMDS) set(path, body string) {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.bodies[path] = body
}

func (f *fakeIMDS) del(path string) {
	f.mu.Lock()
	defer f.mu.Unlock()
	delete(f.bodies, path)
}

func newFakeIMDS() *fakeIMDS {
	return &fakeIMDS{bodies: map[string]string{
		"instance-id":                 "i-0abc",
		"instance-type":               "p5.48xlarge",
		"placement/availability-zone": "us-east-1a",
	}}
}

// syncBuffer is a log sink safe for the agent's goroutines and the test's reads.
type syncBuffer struct {
	mu sync.Mutex
	b  bytes.Buffer
}

func (s *syncBuffer) Write(p []byte) (int, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.b.Write(p)
}

func (s *syncBuffer) String() string {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.b.String()
}

// eventually polls cond every 10 ms until it holds or 10 s pass.
func eventually(t *testing.T, what string, cond func() bool) {
	t.Helper()
	deadline := time.Now().Add(10 * time.Second)
	tick := time.NewTicker(10 * time.Millisecond)
	defer tick.Stop()
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatalf("timed out waiting for %s", what)
		}
		<-tick.C
	}
}

// shTrainer is a real process that records each SIGUSR1/SIGUSR2 it catches as a line in a file.
// With handler false it installs none (and would die of SIGUSR1).
type shTrainer struct {
	cmd     *exec.Cmd
	pidfile string
	log     string
	done    chan struct{}
}

func startShTrainer(t *testing.T, handler bool) *shTrainer {
	t.Helper()
	dir := t.TempDir()
	st := &shTrainer{pidfile: filepath.Join(dir, "pid"), log: filepath.Join(dir, "signals"), done: make(chan struct{})}
	ready := filepath.Join(dir, "ready")
	script := `echo $$ > "$1"; `
	if handler {
		script += `trap 'echo USR1 >> "$2"' USR1; trap 'echo USR2 >> "$2"' USR2; `
	}
	script += `touch "$3"; while :; do sleep 0.05; done`
	st.cmd = exec.Command("sh", "-c", script, "sh", st.pidfile, st.log, ready)
	if err := st.cmd.Start(); err != nil {
		t.Fatal(err)
	}
	go func() { st.cmd.Wait(); close(st.done) }()
	t.Cleanup(func() { st.cmd.Process.Kill(); <-st.done })
	eventually(t, "the trainer to start", func() bool { _, err := os.Stat(ready); return err == nil })
	return st
}

func (s *shTrainer) signals() []string {
	b, _ := os.ReadFile(s.log)
	return strings.Fields(string(b))
}

func (s *shTrainer) alive() bool {
	select {
	case <-s.done:
		return false
	default:
		return true
	}
}

type testAgent struct {
	a       *Agent
	imds    *fakeIMDS
	logs    *syncBuffer
	sigs    chan os.Signal
	cancel  context.CancelFunc
	done    chan error
	runtime string
	reload  func() (*Config, error)
}

// startAgent runs an agent with a fake IMDS and the given environment until the test ends.
func startAgent(t *testing.T, env ...string) *testAgent {
	t.Helper()
	return startAgentWith(t, nil, env...)
}

// startAgentWith is startAgent with deps changed by with (when not nil) before New.
func startAgentWith(t *testing.T, with func(*Deps), env ...string) *testAgent {
	t.Helper()
	runtimeDir := t.TempDir()
	env = append([]string{"SPOTGUARD_HTTP_LISTEN=127.0.0.1:0", "SPOTGUARD_AGENT_RUNTIME_DIR=" + runtimeDir, "SPOTGUARD_IMDS_POLL_INTERVAL=100ms"}, env...)
	cfg := mustLoad(t, LoadOptions{Environ: env})
	ta := &testAgent{imds: newFakeIMDS(), logs: &syncBuffer{}, sigs: make(chan os.Signal, 1), done: make(chan error, 1), runtime: runtimeDir}
	var mu sync.Mutex
	ta.reload = func() (*Config, error) { return cfg, nil }
	deps := Deps{
		Logger:  zerolog.New(ta.logs),
		IMDS:    ta.imds,
		Signals: ta.sigs,
		Reload: func() (*Config, error) {
			mu.Lock()
			defer mu.Unlock()
			return ta.reload()
		},
	}
	if with != nil {
		with(&deps)
	}
	a, err := New(cfg, deps)
	if err != nil {
		t.Fatal(err)
	}
	ta.a = a
	ctx, cancel := context.WithCancel(context.Background())
	ta.cancel = cancel
	go func() { ta.done <- a.Run(ctx) }()
	t.Cleanup(func() {
		cancel()
		if err := <-ta.done; err != nil {
			t.Errorf("Run() = %v; want nil", err)
		}
		if t.Failed() {
			t.Logf("agent log:\n%s", ta.logs.String())
		}
	})
	return ta
}

func (ta *testAgent) notice(key string) (NoticeStatus, bool) {
	for _, n := range ta.a.Status().Notices {
		if n.Key == key {
			return n, true
		}
	}
	return NoticeStatus{}, false
}

func (ta *testAgent) waitState(t *testing.T, key, state string) NoticeStatus {
	t.Helper()
	var ns NoticeStatus
	eventually(t, key+" in state "+state, func() bool {
		n, ok := ta.notice(key)
		ns = n
		return ok && n.State == state
	})
	return ns
}

// waitPolls waits for n more polls of src, so the test can assert nothing else happened.
func (ta *testAgent) waitPolls(t *testing.T, src imds.Source, n uint64) {
	t.Helper()
	start := ta.a.watcher.Stats().Sources[src].Polls
	eventually(t, "more polls", func() bool { return ta.a.watcher.Stats().Sources[src].Polls >= start+n })
}

const spotBody = `{"action": "terminate", "time": "2099-01-01T00:00:00Z"}`

func TestAgentSignalsTrainerOncePerNotice(t *testing.T) {
	tr := startShTrainer(t, true)
	ta := startAgent(t, "SPOTGUARD_TRAINER_PIDFILE="+tr.pidfile)
	ta.imds.set("spot/instance-action", spotBody)

	ns := ta.waitState(t, "spot/terminate", StateTrainerSignalled)
	eventually(t, "the trainer to record the signal", func() bool { return len(tr.signals()) == 1 })
	ta.waitPolls(t, imds.SourceSpot, 3)
	if got := tr.signals(); len(got) != 1 || got[0] != "USR1" {
		t.Errorf("trainer signals = %v; want exactly [USR1]", got)
	}
	if len(ns.Transitions) != 2 || ns.Transitions[0].State != StateDetected || ns.Transitions[1].State != StateTrainerSignalled {
		t.Errorf("transitions = %+v; want detected → trainer_signalled", ns.Transitions)
	}
	if ns.Deadline == nil || !ns.Deadline.Equal(time.Date(2099, 1, 1, 0, 0, 0, 0, time.UTC)) {
		t.Errorf("deadline = %v; want 2099-01-01", ns.Deadline)
	}
	var nf noticeFile
	b, err := os.ReadFile(filepath.Join(ta.runtime, NoticeFile))
	if err != nil {
		t.Fatalf("notice.json: %v", err)
	}
	if err := json.Unmarshal(b, &nf); err != nil || nf.Source != imds.SourceSpot || nf.Action != "terminate" || nf.Deadline == nil {
		t.Errorf("notice.json = %s (%v); want spot terminate with deadline", b, err)
	}

	// The notice goes away (404) and comes back: a new notice, a second signal.
	ta.imds.del("spot/instance-action")
	eventually(t, "the notice to end", func() bool { n, _ := ta.notice("spot/terminate"); return !n.Active })
	ta.imds.set("spot/instance-action", spotBody)
	eventually(t, "the second signal", func() bool { return len(tr.signals()) == 2 })
	if !tr.alive() {
		t.Error("trainer died")
	}
}

func TestAgentRefusesUncaughtSignal(t *testing.T) {
	tr := startShTrainer(t, false)
	ta := startAgent(t, "SPOTGUARD_TRAINER_PIDFILE="+tr.pidfile)
	eventually(t, "the start-up scan", func() bool { return len(ta.a.Status().Trainers) == 1 })
	if st := ta.a.Status(); st.Trainers[0].CatchesSignal {
		t.Errorf("trainer without handler reported as catching the signal")
	}
	// Just started, it may install its handler yet: said at info, then loudly at the notice.
	if !strings.Contains(ta.logs.String(), "does not catch the signal yet") {
		t.Errorf("no start-up message about the uncaught signal:\n%s", ta.logs.String())
	}
	ta.imds.set("spot/instance-action", spotBody)
	ns := ta.waitState(t, "spot/terminate", StateTrainerNotSignalled)
	if len(ns.Signals) != 1 || ns.Signals[0].Outcome != trainer.OutcomeNotCaught {
		t.Errorf("signals = %+v; want one not_caught", ns.Signals)
	}
	if !tr.alive() {
		t.Fatal("trainer without a handler was killed by the signal")
	}
	if !strings.Contains(ta.logs.String(), "does not catch the signal; NOT sent") {
		t.Errorf("no loud message at the notice about the uncaught signal:\n%s", ta.logs.String())
	}
}

func TestAgentNoTrainer(t *testing.T) {
	pidfile := filepath.Join(t.TempDir(), "pid")
	os.WriteFile(pidfile, []byte("2147483000\n"), 0o644)
	ta := startAgent(t, "SPOTGUARD_TRAINER_PIDFILE="+pidfile)
	ta.imds.set("autoscaling/target-lifecycle-state", "Terminated")
	ns := ta.waitState(t, "asg/Terminated", StateTrainerNotSignalled)
	if ns.Transitions[1].Detail != "no trainer process found" {
		t.Errorf("detail = %q; want 'no trainer process found'", ns.Transitions[1].Detail)
	}
	if !strings.Contains(ta.a.Status().TrainerProblems, "stale_pidfile") {
		t.Errorf("TrainerProblems = %q; want stale_pidfile", ta.a.Status().TrainerProblems)
	}
}

func TestAgentIgnorePolicyAndScheduledEnd(t *testing.T) {
	tr := startShTrainer(t, true)
	ta := startAgent(t, "SPOTGUARD_TRAINER_PIDFILE="+tr.pidfile, "SPOTGUARD_NOTICES_REBALANCE=ignore")
	ta.imds.set("events/recommendations/rebalance", `{"noticeTime": "2026-11-29T16:42:18Z"}`)
	ta.waitState(t, "rebalance/rebalance", StateIgnored)

	ev := `[{"Code": "system-reboot", "State": "%s", "EventId": "instance-event-1", "NotBefore": "29 Nov 2099 16:42:16 GMT"}]`
	ta.imds.set("events/maintenance/scheduled", strings.Replace(ev, "%s", "active", 1))
	ta.waitState(t, "scheduled/system-reboot/instance-event-1", StateTrainerSignalled)
	ta.imds.set("events/maintenance/scheduled", strings.Replace(ev, "%s", "canceled", 1))
	eventually(t, "the scheduled notice to end", func() bool {
		n, _ := ta.notice("scheduled/system-reboot/instance-event-1")
		return !n.Active && n.Transitions[len(n.Transitions)-1].State == StateEnded
	})
	ta.waitPolls(t, imds.SourceScheduled, 2)
	if got := tr.signals(); len(got) != 1 {
		t.Errorf("trainer signals = %v; want exactly one (rebalance ignored, scheduled once)", got)
	}
}

// SIGHUP reloads the config; an invalid one is refused and the old one kept.
func TestAgentReload(t *testing.T) {
	tr := startShTrainer(t, true)
	ta := startAgent(t, "SPOTGUARD_TRAINER_PIDFILE="+tr.pidfile)

	bad := mustLoad(t, LoadOptions{Environ: []string{"SPOTGUARD_TRAINER_SIGNAL=SIGKILL", "SPOTGUARD_IMDS_POLL_INTERVAL=1ms"}})
	ta.reload = func() (*Config, error) { return bad, nil }
	ta.sigs <- syscall.SIGHUP
	eventually(t, "the refused reload to be logged", func() bool {
		return strings.Count(ta.logs.String(), "config reload refused") >= 3
	})
	if ta.a.Config().Trainer.Signal != syscall.SIGUSR1 {
		t.Fatalf("invalid reload changed the signal to %v", ta.a.Config().Trainer.Signal)
	}
	// /healthz says so (a warning: the running configuration is fine) until a reload succeeds.
	if v := ta.a.health(time.Now()); !v.Healthy || !strings.Contains(strings.Join(v.Warnings, " "), "the last reload (SIGHUP) was refused") {
		t.Errorf("health after a refused reload = %+v; want healthy, with a warning", v)
	}

	good := mustLoad(t, LoadOptions{Environ: []string{"SPOTGUARD_TRAINER_PIDFILE=" + tr.pidfile, "SPOTGUARD_TRAINER_SIGNAL=SIGUSR2",
		"SPOTGUARD_AGENT_RUNTIME_DIR=" + ta.runtime}})
	ta.reload = func() (*Config, error) { return good, nil }
	ta.sigs <- syscall.SIGHUP
	eventually(t, "the reload", func() bool { return ta.a.Config().Trainer.Signal == syscall.SIGUSR2 })
	if v := ta.a.health(time.Now()); strings.Contains(strings.Join(v.Warnings, " "), "refused") {
		t.Errorf("health after a good reload = %+v; want the refusal gone", v)
	}
	ta.imds.set("spot/instance-action", spotBody)
	eventually(t, "the trainer to get SIGUSR2", func() bool {
		s := tr.signals()
		return len(s) == 1 && s[0] == "USR2"
	})
}

func TestAgentSyncRequest(t *testing.T) {
	ta := startAgent(t, "SPOTGUARD_TRAINER_MATCH=no-such-trainer")
	ta.sigs <- syscall.SIGUSR1
	eventually(t, "the sync request to be logged", func() bool { return strings.Contains(ta.logs.String(), "sync requested") })
}

func TestHTTPEndpoints(t *testing.T) {
	ta := startAgent(t, "SPOTGUARD_TRAINER_MATCH=no-such-trainer")
	ta.imds.set("spot/instance-action", "<html>garbage</html>")
	ta.waitState(t, "spot/terminate", StateTrainerNotSignalled)
	eventually(t, "the identity", func() bool { return ta.a.Status().Instance.InstanceID == "i-0abc" })
	srv := httptest.NewServer(ta.a.Handler())
	defer srv.Close()

	get := func(path string) (int, string) {
		resp, err := http.Get(srv.URL + path)
		if err != nil {
			t.Fatal(err)
		}
		defer resp.Body.Close()
		var b bytes.Buffer
		b.ReadFrom(resp.Body)
		return resp.StatusCode, b.String()
	}
	if code, body := get("/healthz"); code != 200 || !strings.Contains(body, `"healthy":true`) {
		t.Errorf("/healthz = %d %s", code, body)
	}
	code, body := get("/status")
	if code != 200 {
		t.Fatalf("/status = %d", code)
	}
	var st Status
	if err := json.Unmarshal([]byte(body), &st); err != nil {
		t.Fatal(err)
	}
	if len(st.Notices) != 1 || !st.Notices[0].Malformed || st.Notices[0].Deadline == nil {
		t.Errorf("/status notices = %+v; want the fail-safe malformed spot notice with a deadline", st.Notices)
	}
	if left := time.Until(*st.Notices[0].Deadline); left > 2*time.Minute || left < time.Minute {
		t.Errorf("fail-safe deadline %s away; want about 2 minutes", left)
	}
	code, body = get("/metrics")
	for _, want := range []string{
		`spotguard_notices_total{action="terminate",source="spot"} 1`,
		`spotguard_imds_polls_total{source="spot"}`,
		`spotguard_imds_errors_total{source="spot"}`,
		"spotguard_imds_up 1",
		`spotguard_trainer_discovery_problems_total{reason="no_match"}`,
	} {
		if code != 200 || !strings.Contains(body, want) {
			t.Errorf("/metrics lacks %q", want)
		}
	}
}

func TestNewRejectsInvalidConfig(t *testing.T) {
	cfg := mustLoad(t, LoadOptions{Environ: []string{"SPOTGUARD_IMDS_POLL_INTERVAL=1ms"}})
	_, err := New(cfg, Deps{Logger: zerolog.Nop(), IMDS: newFakeIMDS()})
	if err == nil || !strings.Contains(err.Error(), "imds.poll_interval") || !strings.Contains(err.Error(), "no way to find the trainer") {
		t.Errorf("New() = %v; want every problem", err)
	}
}

func TestWriteNoticeFileIsAtomic(t *testing.T) {
	dir := filepath.Join(t.TempDir(), "nested")
	ns := &NoticeStatus{Source: imds.SourceRebalance, Action: "rebalance"}
	if err := writeNoticeFile(dir, []*NoticeStatus{ns}, nil); err != nil {
		t.Fatal(err)
	}
	b, _ := os.ReadFile(filepath.Join(dir, NoticeFile))
	want := `{"source":"rebalance","action":"rebalance","deadline":null,"active":[{"source":"rebalance","action":"rebalance","deadline":null}]}`
	if got := strings.TrimSpace(string(b)); got != want {
		t.Errorf("notice.json = %s; want %s", got, want)
	}
	entries, _ := os.ReadDir(dir)
	if len(entries) != 1 {
		t.Errorf("runtime dir holds %d entries; want only notice.json (no temp files left)", len(entries))
	}
	if err := writeNoticeFile(dir, nil, nil); err != nil {
		t.Fatal(err)
	}
	if _, err := os.Stat(filepath.Join(dir, NoticeFile)); !errors.Is(err, fs.ErrNotExist) {
		t.Errorf("notice.json after every notice ended: %v; want it removed", err)
	}
}

// The notices in force are ordered by severity, then by the earliest deadline: notice.json's top
// is what a trainer must act on.
func TestNoticesInForceBySeverity(t *testing.T) {
	at := func(s int) *time.Time { d := time.Unix(1_800_000_000+int64(s), 0); return &d }
	c := newCoordinator(zerolog.Nop(), nil, nil, nil)
	for _, ns := range []*NoticeStatus{
		{Key: "rebalance/rebalance", Source: imds.SourceRebalance, Action: "rebalance", Policy: PolicyCheckpoint},
		{Key: "scheduled/system-reboot/e2", Source: imds.SourceScheduled, Action: "system-reboot", Policy: PolicyCheckpoint, Deadline: at(50)},
		{Key: "scheduled/instance-stop/e1", Source: imds.SourceScheduled, Action: "instance-stop", Policy: PolicyCheckpoint, Deadline: at(10)},
		{Key: "spot/terminate", Source: imds.SourceSpot, Action: "terminate", Policy: PolicyCheckpoint, Deadline: at(120)},
		{Key: "asg/Terminated", Source: imds.SourceASG, Action: "Terminated", Policy: PolicyIgnore},
	} {
		c.active[ns.Key] = ns
	}
	var got []string
	for _, ns := range c.inForce() {
		got = append(got, ns.Key)
	}
	want := []string{"spot/terminate", "scheduled/instance-stop/e1", "scheduled/system-reboot/e2", "rebalance/rebalance"}
	if !slices.Equal(got, want) {
		t.Errorf("Got(%q) = %q; want %q (ignored notices left out)", "inForce", got, want)
	}
}

// fileStores opens file:// stores, for an agent under test.
func fileStores(d *Deps) {
	d.OpenStore = func(url string, _ checkpoint.S3Options) (checkpoint.Store, error) {
		return checkpoint.NewFileStore(strings.TrimPrefix(url, "file://"))
	}
}

// failingWatcher is a checkpoint watcher that cannot start, as with EMFILE or an inotify limit.
type failingWatcher struct{ starts *atomic.Int32 }

func (f failingWatcher) Run(context.Context, chan<- checkpoint.WatchEvent) error {
	f.starts.Add(1)
	return errors.New("start fsnotify: too many open files")
}

// Trouble on the checkpoint side never stops IMDS polling and signalling: a watcher that keeps
// failing is started again, said once, and reported unhealthy, while notices are still signalled.
func TestCheckpointWatcherFailureDoesNotStopNotices(t *testing.T) {
	tr := startShTrainer(t, true)
	var starts atomic.Int32
	ta := startAgentWith(t, func(d *Deps) {
		fileStores(d)
		d.NewCheckpointWatcher = func(checkpoint.WatchConfig) (CheckpointWatcher, error) { return failingWatcher{&starts}, nil }
	}, "SPOTGUARD_TRAINER_PIDFILE="+tr.pidfile, "SPOTGUARD_CHECKPOINT_DIR="+t.TempDir(), "SPOTGUARD_AGENT_STOP_BUDGET=1s",
		"SPOTGUARD_STORE_URL=file://"+t.TempDir(), "SPOTGUARD_STORE_JOB=j")
	eventually(t, "the watcher to be started again", func() bool { return starts.Load() >= 2 })
	ta.imds.set("spot/instance-action", spotBody)
	ta.waitState(t, "spot/terminate", StateTrainerSignalled)
	eventually(t, "the trainer to record the signal", func() bool { return len(tr.signals()) == 1 })
	if ok, reason := ta.a.ckptWatcher.health(); ok || !strings.Contains(reason, "too many open files") {
		t.Errorf("checkpoint watch health = %v %q; want failing, with the cause", ok, reason)
	}
	if n := strings.Count(ta.logs.String(), "checkpoint watcher failed"); n != 1 {
		t.Errorf("the failure was logged %d times; want once per cause (per minute)", n)
	}
}

// A checkpoint.dir that does not exist yet is waited for (healthy, and said so); once the trainer
// creates it, its checkpoints are committed.
func TestMissingCheckpointDirIsWaitedFor(t *testing.T) {
	tr := startShTrainer(t, true)
	dir := filepath.Join(t.TempDir(), "nvme", "ckpt")
	storeDir := t.TempDir()
	ta := startAgentWith(t, fileStores, "SPOTGUARD_TRAINER_PIDFILE="+tr.pidfile, "SPOTGUARD_CHECKPOINT_DIR="+dir,
		"SPOTGUARD_STORE_URL=file://"+storeDir, "SPOTGUARD_STORE_JOB=j")
	eventually(t, "the agent to wait for the directory", func() bool {
		ok, reason := ta.a.ckptWatcher.health()
		return ok && strings.Contains(reason, "waiting for checkpoint.dir")
	})
	if err := os.MkdirAll(filepath.Join(dir, "step-1"), 0o755); err != nil {
		t.Fatal(err)
	}
	os.WriteFile(filepath.Join(dir, "step-1", "w.bin"), []byte("weights"), 0o644)
	os.WriteFile(filepath.Join(dir, "step-1", "_COMPLETE"), nil, 0o644)
	eventually(t, "the checkpoint to be committed", func() bool {
		cs, _, err := checkpoint.ListCommitted(context.Background(), mustFileStore(t, storeDir), "j")
		return err == nil && len(cs) == 1
	})
	if ok, reason := ta.a.ckptWatcher.health(); !ok || reason != "" {
		t.Errorf("checkpoint watch health = %v %q; want watching", ok, reason)
	}
}

func mustFileStore(t *testing.T, dir string) checkpoint.Store {
	s, err := checkpoint.NewFileStore(dir)
	if err != nil {
		t.Fatal(err)
	}
	return s
}

// A trainer signalled for a notice that writes no checkpoint by the notice's deadline is said:
// an error naming the reason, the state checkpoint_missing and its metric; with the trainer
// gone, the reason says so, and with the checkpoint it wrote withheld (a file of it cannot be
// stored, or its name cannot), so does it, and /healthz is 503. A trainer that does not catch
// the signal, so was not signalled, and saved nothing is counted too (not_signalled): the alarm on
// CheckpointMissing must fire for it. A checkpoint that completes later still moves the notice on.
func TestCheckpointMissingByTheDeadlineIsSaid(t *testing.T) {
	for _, tc := range []string{"no_marker", "trainer_gone", "withheld", "withheld name", "not_signalled"} {
		reason := strings.Fields(tc)[0]
		t.Run(tc, func(t *testing.T) {
			tr := startShTrainer(t, tc != "not_signalled")
			dir := t.TempDir()
			cw := &recordingCW{}
			ta := startAgentWith(t, func(d *Deps) { fileStores(d); d.CloudWatch = cw }, "SPOTGUARD_TRAINER_PIDFILE="+tr.pidfile, "SPOTGUARD_CHECKPOINT_DIR="+dir,
				"SPOTGUARD_STORE_URL=file://"+t.TempDir(), "SPOTGUARD_STORE_JOB=j", "SPOTGUARD_AGENT_STOP_BUDGET=1s")
			deadline := time.Now().Add(2 * time.Second).UTC().Truncate(time.Second).Add(time.Second)
			ta.imds.set("spot/instance-action", `{"action": "terminate", "time": "`+deadline.Format(time.RFC3339)+`"}`)
			if tc == "not_signalled" {
				ta.waitState(t, "spot/terminate", StateTrainerNotSignalled)
			} else {
				ta.waitState(t, "spot/terminate", StateTrainerSignalled)
			}
			switch tc {
			case "trainer_gone":
				tr.cmd.Process.Kill()
				<-tr.done
			case "withheld":
				os.MkdirAll(filepath.Join(dir, "step-0"), 0o755)
				if err := os.WriteFile(filepath.Join(dir, "step-0", "caf\xe9.bin"), []byte("x"), 0o644); err != nil {
					t.Skipf("this file system refuses names that are not UTF-8: %v", err)
				}
				os.WriteFile(filepath.Join(dir, "step-0", "_COMPLETE"), nil, 0o644)
			case "withheld name":
				os.MkdirAll(filepath.Join(dir, "LATEST"), 0o755)
				os.WriteFile(filepath.Join(dir, "LATEST", "w.bin"), []byte("weights"), 0o644)
				os.WriteFile(filepath.Join(dir, "LATEST", "_COMPLETE"), nil, 0o644)
			}
			ns := ta.waitState(t, "spot/terminate", StateCheckpointMissing)
			if strings.HasPrefix(tc, "withheld") {
				why := map[string]string{"withheld": "a file cannot be stored", "withheld name": "its name cannot be stored"}[tc]
				if v := ta.a.health(time.Now()); v.Healthy || !strings.Contains(strings.Join(v.short, "; "), why) {
					t.Errorf("health = %+v; want 503: %s", v, why)
				}
				if tc == "withheld name" && !strings.Contains(ta.logs.String(), "the store cannot hold that name") {
					t.Errorf("log does not say the checkpoint's name cannot be stored:\n%s", ta.logs)
				}
				// /status lists it as withheld, whether the uploader took it in or not (its name).
				name := map[string]string{"withheld": "step-0", "withheld name": "LATEST"}[tc]
				if us := ta.a.Status().Uploads; us == nil || !slices.ContainsFunc(us.Checkpoints, func(c checkpoint.CheckpointStatus) bool { return c.Name == name && c.Withheld }) {
					t.Errorf("/status uploads %+v; want %s listed as withheld", us, name)
				}
				// Deleted, it no longer waits to be fixed: healthy again.
				os.RemoveAll(filepath.Join(dir, map[string]string{"withheld": "step-0", "withheld name": "LATEST"}[tc]))
				eventually(t, "healthy again once the withheld checkpoint is deleted", func() bool { return ta.a.health(time.Now()).Healthy })
			}
			if last := ns.Transitions[len(ns.Transitions)-1]; last.Detail != reason || last.At.Before(deadline) {
				t.Errorf("last transition = %+v; want checkpoint_missing (%s) at the deadline %v or after", last, reason, deadline)
			}
			said := "no checkpoint completed since the trainer was signalled"
			switch tc {
			case "no_marker":
				// Said at the deadline, seconds after the signal: a save that takes longer, not
				// a trainer that ignores the signal (found from outside).
				said += " for this notice: the trainer is still running and its checkpoint's marker had not come by the notice's deadline"
			case "not_signalled":
				said = "no checkpoint completed for this notice (the trainer was not signalled for it): no trainer process could be signalled for it (PID " +
					strconv.Itoa(tr.cmd.Process.Pid) + " does not catch SIGUSR1"
			}
			if log := ta.logs.String(); !strings.Contains(log, said) ||
				!strings.Contains(log, `"reason":"`+reason+`"`) {
				t.Errorf("log does not say the checkpoint is missing, and why (%s):\n%s", reason, log)
			}
			var m dto.Metric
			ta.a.metrics.checkpointMissing.WithLabelValues("spot", reason).Write(&m)
			if n := m.GetCounter().GetValue(); n != 1 {
				t.Errorf("spotguard_notice_checkpoint_missing_total{spot,%s} = %v; want 1", reason, n)
			}
			// And CloudWatch hears of it: no NoticeToDurableSeconds comes for this notice, so the
			// alarms on it had nothing to fire on (found from outside).
			eventually(t, "CheckpointMissing sent to CloudWatch", func() bool {
				cw.mu.Lock()
				defer cw.mu.Unlock()
				for _, c := range cw.calls {
					for _, d := range c.data {
						if d.name == "CheckpointMissing" && slices.Contains(d.dims, "Source=spot") && slices.Contains(d.dims, "Reason="+reason) {
							return true
						}
					}
				}
				return false
			})
			// A checkpoint that comes late is still followed.
			os.MkdirAll(filepath.Join(dir, "step-1"), 0o755)
			os.WriteFile(filepath.Join(dir, "step-1", "w.bin"), []byte("weights"), 0o644)
			os.WriteFile(filepath.Join(dir, "step-1", "_COMPLETE"), nil, 0o644)
			ta.waitState(t, "spot/terminate", StateCommitted)
		})
	}
}

// A save complete under another marker than checkpoint.marker is said so when the notice's
// checkpoint is missing: not a trainer that died in its save (found from outside: a trainer
// writing _COMPLETE under checkpoint.marker .metadata was said to be gone before its checkpoint
// completed).
func TestCheckpointMissingUnderAnotherMarkerIsSaid(t *testing.T) {
	tr := startShTrainer(t, true)
	dir := t.TempDir()
	ta := startAgentWith(t, fileStores, "SPOTGUARD_TRAINER_PIDFILE="+tr.pidfile, "SPOTGUARD_CHECKPOINT_DIR="+dir,
		"SPOTGUARD_CHECKPOINT_MARKER=.metadata", "SPOTGUARD_STORE_URL=file://"+t.TempDir(), "SPOTGUARD_STORE_JOB=j", "SPOTGUARD_AGENT_STOP_BUDGET=1s")
	deadline := time.Now().Add(2 * time.Second).UTC().Truncate(time.Second).Add(time.Second)
	ta.imds.set("spot/instance-action", `{"action": "terminate", "time": "`+deadline.Format(time.RFC3339)+`"}`)
	ta.waitState(t, "spot/terminate", StateTrainerSignalled)
	os.MkdirAll(filepath.Join(dir, "step-23"), 0o755)
	os.WriteFile(filepath.Join(dir, "step-23", "rank-0.pt"), []byte("weights"), 0o644)
	os.WriteFile(filepath.Join(dir, "step-23", "_COMPLETE"), nil, 0o644)
	ta.waitState(t, "spot/terminate", StateCheckpointMissing)
	want := "but step-23 holds _COMPLETE, not the configured marker .metadata (checkpoint.marker): is checkpoint.marker the name the trainer writes last?"
	if log := ta.logs.String(); !strings.Contains(log, want) {
		t.Errorf("log does not say the checkpoint holds another marker (%q):\n%s", want, log)
	}
}

// An agent.runtime_dir that cannot be created (a file in its path): the agent runs and signals,
// and /healthz warns that notice.json cannot be written, until it can.
func TestRuntimeDirNotWritableIsSaid(t *testing.T) {
	file := filepath.Join(t.TempDir(), "file")
	os.WriteFile(file, nil, 0o644)
	tr := startShTrainer(t, true)
	ta := startAgent(t, "SPOTGUARD_TRAINER_PIDFILE="+tr.pidfile, "SPOTGUARD_AGENT_RUNTIME_DIR="+filepath.Join(file, "run"))
	ta.imds.set("spot/instance-action", spotBody)
	ta.waitState(t, "spot/terminate", StateTrainerSignalled)
	v := ta.a.health(time.Now())
	if !v.Healthy || !strings.Contains(strings.Join(v.Warnings, " "), "cannot be written") || !strings.Contains(strings.Join(v.Warnings, " "), NoticeFile) {
		t.Errorf("health = %+v; want healthy, with a warning that %s cannot be written", v, NoticeFile)
	}
}

// A checkpoint that completes after its notice ended is not that notice's: the notice stays
// ended, and its deadline margin is not set by an ordinary save.
func TestCheckpointAfterTheNoticeEndedIsNotItsCheckpoint(t *testing.T) {
	tr := startShTrainer(t, true)
	dir := t.TempDir()
	ta := startAgentWith(t, fileStores, "SPOTGUARD_TRAINER_PIDFILE="+tr.pidfile, "SPOTGUARD_CHECKPOINT_DIR="+dir,
		"SPOTGUARD_STORE_URL=file://"+t.TempDir(), "SPOTGUARD_STORE_JOB=j", "SPOTGUARD_AGENT_STOP_BUDGET=1s")
	ta.imds.set("spot/instance-action", spotBody)
	ta.waitState(t, "spot/terminate", StateTrainerSignalled)
	ta.imds.del("spot/instance-action")
	eventually(t, "the notice to end", func() bool { n, _ := ta.notice("spot/terminate"); return !n.Active })
	os.MkdirAll(filepath.Join(dir, "step-1"), 0o755)
	os.WriteFile(filepath.Join(dir, "step-1", "w.bin"), []byte("weights"), 0o644)
	os.WriteFile(filepath.Join(dir, "step-1", "_COMPLETE"), nil, 0o644)
	eventually(t, "step-1 to be committed", func() bool {
		u := ta.a.uploader.Status(context.Background())
		return len(u.Checkpoints) == 1 && u.Checkpoints[0].Committed
	})
	ns, _ := ta.notice("spot/terminate")
	for _, tr := range ns.Transitions {
		if tr.State == StateCheckpointWritten || tr.State == StateCommitted {
			t.Errorf("transitions = %+v; want none crediting step-1, completed after the notice ended", ns.Transitions)
		}
	}
}

// manifestGate is a file store whose manifest writes fail while closed is set: a store that takes
// the data and refuses the commit.
type manifestGate struct {
	checkpoint.Store
	closed atomic.Bool
}

func (g *manifestGate) PutBytes(ctx context.Context, key string, data []byte, cond checkpoint.Cond) (string, error) {
	if g.closed.Load() && strings.HasSuffix(key, "/manifest.json") {
		return "", errors.New("503 SlowDown")
	}
	return g.Store.PutBytes(ctx, key, data, cond)
}

// A complete checkpoint that is not committed shows in the metrics, with how long it has waited,
// so an alert can say the agent is behind (a store that refuses, a trainer saving faster than the
// store takes its checkpoints) before the newest commit is old; it goes back to 0 once committed.
func TestCheckpointsNotCommittedMetric(t *testing.T) {
	dir := t.TempDir()
	gate := &manifestGate{}
	gate.closed.Store(true)
	ta := startAgentWith(t, func(d *Deps) {
		d.OpenStore = func(url string, _ checkpoint.S3Options) (checkpoint.Store, error) {
			s, err := checkpoint.NewFileStore(strings.TrimPrefix(url, "file://"))
			gate.Store = s
			return gate, err
		}
	}, "SPOTGUARD_CHECKPOINT_DIR="+dir, "SPOTGUARD_STORE_URL=file://"+t.TempDir(), "SPOTGUARD_STORE_JOB=j", "SPOTGUARD_TRAINER_MATCH=no-such-trainer")
	metric := func(name string) float64 {
		for _, l := range strings.Split(scrape(t, ta.a), "\n") {
			if v, ok := strings.CutPrefix(l, name+" "); ok {
				f, err := strconv.ParseFloat(v, 64)
				if err != nil {
					t.Fatalf("%s: %v", l, err)
				}
				return f
			}
		}
		return -1
	}
	if n := metric("spotguard_checkpoints_not_committed"); n != 0 {
		t.Fatalf("spotguard_checkpoints_not_committed = %v before any checkpoint; want 0", n)
	}
	os.MkdirAll(filepath.Join(dir, "step-1"), 0o755)
	os.WriteFile(filepath.Join(dir, "step-1", "w.bin"), []byte("weights"), 0o644)
	os.WriteFile(filepath.Join(dir, "step-1", "_COMPLETE"), nil, 0o644)
	eventually(t, "step-1 to wait, complete, for its commit", func() bool {
		return metric("spotguard_checkpoints_not_committed") == 1 && metric("spotguard_checkpoint_not_committed_seconds") > 0
	})
	gate.closed.Store(false)
	eventually(t, "step-1 to be committed and the metrics back to 0", func() bool {
		return metric("spotguard_checkpoints_not_committed") == 0 && metric("spotguard_checkpoint_not_committed_seconds") == 0
	})

	// One withheld for its own name (the store cannot hold it) is not committed either: it was
	// not counted, so an alarm on the metric never fired for it (found from outside). A later
	// commit ends it, as it ends its /healthz reason.
	os.MkdirAll(filepath.Join(dir, "LATEST"), 0o755)
	os.WriteFile(filepath.Join(dir, "LATEST", "w.bin"), []byte("weights"), 0o644)
	os.WriteFile(filepath.Join(dir, "LATEST", "_COMPLETE"), nil, 0o644)
	eventually(t, "the checkpoint named LATEST to be counted not committed", func() bool {
		return metric("spotguard_checkpoints_not_committed") == 1 && metric("spotguard_checkpoint_not_committed_seconds") > 0
	})
	os.MkdirAll(filepath.Join(dir, "step-2"), 0o755)
	os.WriteFile(filepath.Join(dir, "step-2", "w.bin"), []byte("weights"), 0o644)
	os.WriteFile(filepath.Join(dir, "step-2", "_COMPLETE"), nil, 0o644)
	eventually(t, "a later commit to end it", func() bool { return metric("spotguard_checkpoints_not_committed") == 0 })
}

// A second agent started on the agent.runtime_dir of a running one is refused, naming the first
// one's PID: it would have removed the notice.json the first one wrote for its trainer, and
// resumed the first one's commits from their journal while it still wrote them. Once the first
// one has stopped, an agent starts there again.
func TestSecondAgentOnARuntimeDirIsRefused(t *testing.T) {
	ta := startAgent(t, "SPOTGUARD_TRAINER_MATCH=no-such-trainer")
	ta.imds.set("spot/instance-action", spotBody)
	notice := filepath.Join(ta.runtime, NoticeFile)
	eventually(t, "notice.json to be written", func() bool { _, err := os.Stat(notice); return err == nil })
	second := func() (*Agent, *Config) {
		cfg := mustLoad(t, LoadOptions{Environ: []string{"SPOTGUARD_HTTP_LISTEN=", "SPOTGUARD_AGENT_RUNTIME_DIR=" + ta.runtime,
			"SPOTGUARD_METRICS_CLOUDWATCH=false", "SPOTGUARD_TRAINER_MATCH=no-such-trainer"}})
		a, err := New(cfg, Deps{Logger: zerolog.Nop(), IMDS: newFakeIMDS()})
		if err != nil {
			t.Fatal(err)
		}
		return a, cfg
	}
	b, _ := second()
	bctx, bcancel := context.WithTimeout(t.Context(), 10*time.Second) // not refused: it would run on
	defer bcancel()
	err := b.Run(bctx)
	if !errors.Is(err, errRuntimeDirInUse) || !strings.Contains(err.Error(), "PID "+strconv.Itoa(os.Getpid())) {
		t.Fatalf("second agent's Run() = %v; want it refused, naming PID %d", err, os.Getpid())
	}
	if _, err := os.Stat(notice); err != nil {
		t.Errorf("the first agent's notice.json after the second one was refused: %v; want it kept", err)
	}

	ta.cancel()
	if err := <-ta.done; err != nil {
		t.Fatalf("first agent's Run() = %v", err)
	}
	ta.done <- nil // for the cleanup
	c, _ := second()
	ctx, cancel := context.WithCancel(t.Context())
	done := make(chan error, 1)
	go func() { done <- c.Run(ctx) }()
	eventually(t, "the next agent to poll IMDS", func() bool { return c.watcher.Stats().Sources[imds.SourceSpot].Polls > 0 })
	cancel()
	if err := <-done; err != nil {
		t.Errorf("an agent on the runtime dir after the first one stopped: Run() = %v; want nil", err)
	}
}

// An agent that finds the job's newest checkpoint committed in the store (a restart, or a
// replacement instance after a restore) says how old it is: before, the newest-committed gauge
// (and CloudWatch's NewestCheckpointAgeSeconds) stayed at 0 until it committed one itself (found
// from outside).
func TestNewestCommittedFoundAtStart(t *testing.T) {
	storeDir := t.TempDir()
	env := []string{"SPOTGUARD_TRAINER_MATCH=no-such-trainer", "SPOTGUARD_STORE_URL=file://" + storeDir, "SPOTGUARD_STORE_JOB=j"}
	first := startAgentWith(t, fileStores, append(env, "SPOTGUARD_CHECKPOINT_DIR="+t.TempDir())...)
	ck := filepath.Join(first.a.Config().Checkpoint.Dir, "step-000100")
	if err := os.MkdirAll(ck, 0o755); err != nil {
		t.Fatal(err)
	}
	os.WriteFile(filepath.Join(ck, "w.bin"), []byte("weights"), 0o644)
	os.WriteFile(filepath.Join(ck, "_COMPLETE"), nil, 0o644)
	var committed *checkpoint.Manifest
	eventually(t, "step-000100 committed", func() bool {
		cs, _, err := checkpoint.ListCommitted(context.Background(), mustFileStore(t, storeDir), "j")
		if err == nil && len(cs) == 1 {
			committed = cs[0].Manifest
		}
		return committed != nil
	})
	first.cancel()
	<-first.done
	first.done <- nil // for the cleanup

	second := startAgentWith(t, fileStores, append(env, "SPOTGUARD_CHECKPOINT_DIR="+t.TempDir())...)
	want := float64(committed.CommittedAt.Unix())
	eventually(t, "the newest-committed gauge to be the commit found", func() bool {
		var m dto.Metric
		return second.a.metrics.newestCommitted.Write(&m) == nil && m.GetGauge().GetValue() == want
	})
}

// A trainer that is not there, or does not catch trainer.signal, is a /healthz warning (found
// from outside: /healthz was 200 and said nothing while a notice would have signalled no one).
// A trainer that catches it is no warning; the agent stays healthy throughout, as it starts
// before the trainer.
func TestTrainerNotThereOrNotCatchingIsAHealthWarning(t *testing.T) {
	bare := startShTrainer(t, false)
	pidfile := filepath.Join(t.TempDir(), "trainer.pid")
	os.WriteFile(pidfile, []byte(strconv.Itoa(bare.cmd.Process.Pid)+"\n"), 0o644)
	ta := startAgent(t, "SPOTGUARD_TRAINER_PIDFILE="+pidfile)
	warned := func(want string) func() bool {
		return func() bool {
			ta.a.coord.Scan()
			v := ta.a.health(time.Now())
			return v.Healthy && strings.Contains(strings.Join(v.Warnings, " "), want)
		}
	}
	eventually(t, "a warning that the trainer does not catch the signal", warned(fmt.Sprintf("trainer process %d (sh -c", bare.cmd.Process.Pid)))
	if v := ta.a.health(time.Now()); !strings.Contains(strings.Join(v.Warnings, " "), "does not catch SIGUSR1") || !slices.Contains(v.short, fmt.Sprintf("trainer %d does not catch SIGUSR1", bare.cmd.Process.Pid)) {
		t.Errorf("health = %+v; want it to say the trainer does not catch SIGUSR1", v)
	}
	bare.cmd.Process.Kill()
	<-bare.done
	eventually(t, "a warning that no trainer is found, with the stale pidfile", warned("no trainer process found (stale_pidfile"))
	good := startShTrainer(t, true)
	os.WriteFile(pidfile, []byte(strconv.Itoa(good.cmd.Process.Pid)+"\n"), 0o644)
	eventually(t, "no trainer warning once one that catches the signal runs", func() bool {
		ta.a.coord.Scan()
		v := ta.a.health(time.Now())
		return v.Healthy && !strings.Contains(strings.Join(v.Warnings, " "), "trainer")
	})
}

// An http.listen another program holds made `run` exit: under systemd, a restart loop with the
// instance unprotected, for a port conflict. The agent runs on now, acts on a notice, says why it
// is not serving (a /healthz reason, for the STATUS line and CloudWatch), and binds the port once
// it is free.
func TestListenerInUseIsTriedAgainWhileTheAgentRuns(t *testing.T) {
	was := listenRetry
	listenRetry = 20 * time.Millisecond
	t.Cleanup(func() { listenRetry = was })
	held, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	addr := held.Addr().String()
	tr := startShTrainer(t, true)
	ta := startAgent(t, "SPOTGUARD_TRAINER_PIDFILE="+tr.pidfile, "SPOTGUARD_HTTP_LISTEN="+addr)
	ta.imds.set("spot/instance-action", spotBody)
	ta.waitState(t, "spot/terminate", StateTrainerSignalled)
	if v := ta.a.health(time.Now()); v.Healthy || !slices.Contains(v.short, "http.listen "+addr+" not bound") ||
		!strings.Contains(strings.Join(v.Reasons, " "), "address already in use") {
		t.Errorf("health with the port held = %+v; want unhealthy, saying http.listen is not bound and why", v)
	}
	if !strings.Contains(ta.logs.String(), "http.listen cannot be bound") {
		t.Errorf("log does not say http.listen cannot be bound:\n%s", ta.logs)
	}
	held.Close()
	eventually(t, "the agent to serve /healthz once the port is free", func() bool {
		resp, err := http.Get("http://" + addr + "/healthz")
		if err != nil {
			return false
		}
		resp.Body.Close()
		return true
	})
	if v := ta.a.health(time.Now()); slices.ContainsFunc(v.short, func(s string) bool { return strings.HasPrefix(s, "http.listen") }) {
		t.Errorf("health once bound = %+v; want no http.listen reason", v)
	}
}

// A process that does not catch the signal beside one that does (torchrun's launcher, or tini as
// `docker run --init` starts it) is no /healthz warning: the notice signals the trainer.
func TestLauncherBesideATrainerIsNoHealthWarning(t *testing.T) {
	startShTrainer(t, false) // its temporary directory, in its command line, names this test
	startShTrainer(t, true)
	ta := startAgent(t, "SPOTGUARD_TRAINER_MATCH=TestLauncherBesideATrainerIsNoHealthWarning.*/pid")
	eventually(t, "both found", func() bool {
		ta.a.coord.Scan()
		return len(ta.a.Status().Trainers) == 2
	})
	if v := ta.a.health(time.Now()); strings.Contains(strings.Join(v.Warnings, " "), "trainer") {
		t.Errorf("health = %+v; want no trainer warning with a process that catches the signal", v)
	}
}

// /status says which spotguard answers: nothing running said it but the start-up log line, and a
// store written by several versions could not be told apart by their agents (found from outside).
func TestStatusSaysTheVersion(t *testing.T) {
	cfg := mustLoad(t, LoadOptions{Environ: []string{"SPOTGUARD_HTTP_LISTEN=", "SPOTGUARD_TRAINER_MATCH=no-such-trainer",
		"SPOTGUARD_AGENT_RUNTIME_DIR=" + t.TempDir(), "SPOTGUARD_METRICS_CLOUDWATCH=false"}})
	a, err := New(cfg, Deps{Logger: zerolog.Nop(), IMDS: newFakeIMDS(), Version: "spotguard 1.2.3"})
	if err != nil {
		t.Fatal(err)
	}
	if _, body := get(a, "/status"); !strings.Contains(body, `"version": "spotguard 1.2.3"`) {
		t.Errorf("/status = %s; want the version", body)
	}
}

// A notice that signalled no one lists its signals as [] in /status, not null (found from
// outside: a consumer's loop over them failed on exactly the notices an operator looks at).
func TestStatusSignalsIsAListWhenNoneWasSignalled(t *testing.T) {
	ta := startAgent(t, "SPOTGUARD_TRAINER_PIDFILE="+filepath.Join(t.TempDir(), "none.pid"))
	ta.imds.set("spot/instance-action", spotBody)
	ta.waitState(t, "spot/terminate", StateTrainerNotSignalled)
	b, err := json.Marshal(ta.a.Status())
	if err != nil {
		t.Fatal(err)
	}
	if !strings.Contains(string(b), `"signals":[]`) || strings.Contains(string(b), `"signals":null`) {
		t.Errorf("/status of a notice that signalled no one: %s; want \"signals\":[]", b)
	}
}
