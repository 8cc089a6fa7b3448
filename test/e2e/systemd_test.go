package e2e

import (
	"net"
	"net/http"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"
)

// notifySocket is a real unixgram socket standing in for systemd's NOTIFY_SOCKET.
type notifySocket struct {
	path string
	msgs chan string
}

func listenNotify(t *testing.T) *notifySocket {
	t.Helper()
	path := filepath.Join(t.TempDir(), "notify.sock")
	c, err := net.ListenUnixgram("unixgram", &net.UnixAddr{Name: path, Net: "unixgram"})
	if err != nil {
		t.Fatal(err)
	}
	ns := &notifySocket{path: path, msgs: make(chan string, 1024)}
	done := make(chan struct{})
	go func() {
		defer close(done)
		buf := make([]byte, 4096)
		for {
			n, err := c.Read(buf)
			if err != nil {
				return
			}
			ns.msgs <- string(buf[:n])
		}
	}()
	t.Cleanup(func() { c.Close(); <-done })
	return ns
}

// next returns the next message, failing the test after 20 s.
func (ns *notifySocket) next(t *testing.T) string {
	t.Helper()
	select {
	case m := <-ns.msgs:
		return m
	case <-time.After(20 * time.Second):
		t.Fatal("no sd_notify message within 20 s")
		return ""
	}
}

// until reads messages until one satisfies ok, returning all read.
func (ns *notifySocket) until(t *testing.T, what string, ok func(string) bool) []string {
	t.Helper()
	var seen []string
	deadline := time.After(60 * time.Second)
	for {
		select {
		case m := <-ns.msgs:
			seen = append(seen, m)
			if ok(m) {
				return seen
			}
		case <-deadline:
			t.Fatalf("no sd_notify message %s within 60 s; saw %q", what, seen)
		}
	}
}

// Under systemd (Type=notify): READY=1 first, then STATUS lines and WATCHDOG pings, a status
// that tells the notice's progress, and STOPPING=1 on SIGTERM.
func TestSdNotifyThroughANotice(t *testing.T) {
	needPeers(t)
	ns := listenNotify(t)
	sim := newIMDS(t)
	sim.startSpotTermination()
	ckdir := t.TempDir()
	tp := startTrainer(t, "--checkpoint-dir", ckdir, "--files", "2", "--checkpoint-mb", "2", "--write-seconds", "3")
	ap := startAgent(t, sim, "SPOTGUARD_TRAINER_PIDFILE="+tp.pidfile, "SPOTGUARD_NOTICES_REBALANCE=ignore",
		"SPOTGUARD_CHECKPOINT_DIR="+ckdir, "SPOTGUARD_STORE_URL=file://"+t.TempDir(), "SPOTGUARD_STORE_JOB=e2e",
		"NOTIFY_SOCKET="+ns.path, "WATCHDOG_USEC=2000000")
	// The store may not have been probed yet at READY: that is said (DESIGN: healthy only once
	// the probe passed), and a healthy watching status follows.
	if first := ns.next(t); !strings.HasPrefix(first, "READY=1\nSTATUS=") || !strings.Contains(first, "watching") ||
		(!strings.HasPrefix(first, "READY=1\nSTATUS=watching") && !strings.Contains(first, "not probed yet")) {
		t.Fatalf("first message %q; want READY=1 with a watching status (or the store not probed yet)", first)
	}
	ns.until(t, "a healthy watching status", func(m string) bool { return strings.HasPrefix(m, "STATUS=watching") })
	ns.until(t, "WATCHDOG=1", func(m string) bool { return m == "WATCHDOG=1" })
	ns.until(t, "a status about the notice", func(m string) bool { return strings.HasPrefix(m, "STATUS=notice spot/terminate") })
	ap.waitNoticeState(t, "spot/terminate", "committed", 30*time.Second)
	// The spot notice stays in force (the instance is going away): the status names it and
	// the checkpoint committed for it.
	ns.until(t, "a status naming the durable checkpoint", func(m string) bool {
		return strings.HasPrefix(m, "STATUS=notice spot/terminate in force: checkpoint step-")
	})
	ap.cmd.Process.Signal(syscall.SIGTERM)
	ns.until(t, "STOPPING=1", func(m string) bool { return strings.HasPrefix(m, "STOPPING=1") })
	<-ap.done
	if ap.exitErr != nil {
		t.Errorf("exit after SIGTERM: %v; want 0", ap.exitErr)
	}
}

// SIGTERM while a notice's checkpoint is uploading (slowly, through a throttled link): the
// agent finishes it, commits, and only then exits 0.
func TestSIGTERMMidUploadStillCommits(t *testing.T) {
	needPeers(t)
	s3 := startS3(t)
	// 512 KiB/s a connection: 24 MiB in 5 MiB parts take about 8 s, longer than an awscli listing
	// takes to start under load (at 4 MiB/s the upload was done before it answered).
	slow := startThrottle(t, strings.TrimPrefix(s3.endpoint, "http://"), 512<<10)
	sim := newIMDS(t)
	sim.startSpotTermination()
	ckdir := t.TempDir()
	tp := startTrainer(t, "--checkpoint-dir", ckdir, "--files", "3", "--checkpoint-mb", "8")
	storeURL := "s3://" + s3Bucket + "/sigterm"
	ap := startAgent(t, sim, append([]string{"SPOTGUARD_TRAINER_PIDFILE=" + tp.pidfile, "SPOTGUARD_NOTICES_REBALANCE=ignore",
		"SPOTGUARD_CHECKPOINT_DIR=" + ckdir, "SPOTGUARD_STORE_URL=" + storeURL, "SPOTGUARD_STORE_JOB=e2e",
		"SPOTGUARD_STORE_PART_SIZE=5MiB"}, s3.env(slow.url())...)...)
	ap.waitNoticeState(t, "spot/terminate", "checkpoint_written", 30*time.Second)
	if ls, _ := s3.tryAWS(t, "s3", "ls", "--recursive", "s3://"+s3Bucket+"/sigterm/"); strings.Contains(ls, "manifest.json") {
		t.Fatalf("already committed before SIGTERM; the link is not slow enough:\n%s", ls)
	}
	ap.sigtermWithin(t, 120*time.Second, "mid-upload")
	ls := s3.aws(t, "s3", "ls", "--recursive", "s3://"+s3Bucket+"/sigterm/")
	if !strings.Contains(ls, "manifest.json") {
		t.Fatalf("no manifest after the agent exited: the upload was abandoned\n%s", ls)
	}
	if !strings.Contains(ap.log(t), "finishing them first") {
		t.Errorf("agent log does not say it finished the notice's upload before stopping")
	}
}

// A second SIGTERM ends the drain: the agent, uploading a notice's checkpoint through a link
// far too slow to finish, exits 0 at once, saying what it left; nothing torn is committed.
func TestSecondSIGTERMEndsDrain(t *testing.T) {
	needPeers(t)
	s3 := startS3(t)
	slow := startThrottle(t, strings.TrimPrefix(s3.endpoint, "http://"), 256<<10) // 256 KiB/s: ~90 s for 24 MiB
	sim := newIMDS(t)
	sim.startSpotTermination()
	ckdir := t.TempDir()
	tp := startTrainer(t, "--checkpoint-dir", ckdir, "--files", "3", "--checkpoint-mb", "8")
	storeURL := "s3://" + s3Bucket + "/sigterm2"
	ap := startAgent(t, sim, append([]string{"SPOTGUARD_TRAINER_PIDFILE=" + tp.pidfile, "SPOTGUARD_NOTICES_REBALANCE=ignore",
		"SPOTGUARD_CHECKPOINT_DIR=" + ckdir, "SPOTGUARD_STORE_URL=" + storeURL, "SPOTGUARD_STORE_JOB=e2e",
		"SPOTGUARD_STORE_PART_SIZE=5MiB"}, s3.env(slow.url())...)...)
	ap.waitNoticeState(t, "spot/terminate", "checkpoint_written", 30*time.Second)
	ap.cmd.Process.Signal(syscall.SIGTERM)
	eventually(t, 10*time.Second, "the agent to say it drains", func() bool { return strings.Contains(ap.log(t), "finishing them first") })
	select {
	case <-ap.done:
		t.Fatalf("the agent exited on the first SIGTERM with the notice's checkpoint uploading; want a drain\n%s", ap.log(t))
	default:
	}
	// While it drains, the listener still answers: /status shows the checkpoint being uploaded,
	// and a job notice is refused with 503, as the docs say, not with a refused connection.
	if u := ap.uploads(t); u == nil || len(u.Checkpoints) == 0 {
		t.Errorf("/status while draining: uploads %+v; want the checkpoint being uploaded", u)
	}
	resp, err := http.Post(ap.base+"/notice", "application/json", strings.NewReader(`{"deadline": "`+time.Now().Add(time.Minute).UTC().Format(time.RFC3339)+`"}`))
	if err != nil {
		t.Errorf("POST /notice while draining: %v; want 503", err)
	} else {
		resp.Body.Close()
		if resp.StatusCode != http.StatusServiceUnavailable {
			t.Errorf("POST /notice while draining: %s; want 503", resp.Status)
		}
	}
	sent := time.Now()
	ap.cmd.Process.Signal(syscall.SIGTERM)
	select {
	case <-ap.done:
	case <-time.After(10 * time.Second):
		t.Fatal("agent still draining 10 s after a second SIGTERM")
	}
	if ap.exitErr != nil {
		t.Errorf("exit after a second SIGTERM: %v; want 0", ap.exitErr)
	}
	t.Logf("exited %v after the second SIGTERM", time.Since(sent).Round(time.Millisecond))
	log := ap.log(t)
	if !strings.Contains(log, "drain ended by a second stop request") || !strings.Contains(log, `"not_committed":["step-`) {
		t.Errorf("agent log does not say the drain was ended and which checkpoint it left:\n%s", log)
	}
	if ls, _ := s3.tryAWS(t, "s3", "ls", "--recursive", "s3://"+s3Bucket+"/sigterm2/"); strings.Contains(ls, "manifest.json") {
		t.Errorf("a manifest exists although the upload was cut:\n%s", ls)
	}
}

// SIGTERM right after the trainer was signalled, while it is still writing the checkpoint the
// notice asked for (the marker comes after the SIGTERM): the agent waits for it with the watcher
// running, commits it, and only then exits 0.
func TestSIGTERMBeforeMarkerStillCommits(t *testing.T) {
	needPeers(t)
	sim := newIMDS(t)
	sim.startSpotTermination()
	ckdir, storeDir := t.TempDir(), t.TempDir()
	// 4 files over 6 s: the first is there well before the marker.
	tp := startTrainer(t, "--checkpoint-dir", ckdir, "--files", "4", "--checkpoint-mb", "2", "--write-seconds", "6")
	ap := startAgent(t, sim, "SPOTGUARD_TRAINER_PIDFILE="+tp.pidfile, "SPOTGUARD_NOTICES_REBALANCE=ignore",
		"SPOTGUARD_CHECKPOINT_DIR="+ckdir, "SPOTGUARD_STORE_URL=file://"+storeDir, "SPOTGUARD_STORE_JOB=e2e")
	ap.waitNoticeState(t, "spot/terminate", "trainer_signalled", 30*time.Second)
	// SIGTERM at once: the trainer may not have closed its first file yet.
	if marks, _ := filepath.Glob(filepath.Join(ckdir, "step-*", "_COMPLETE")); len(marks) > 0 {
		t.Fatalf("the marker is there already; the trainer is not slow enough: %v", marks)
	}
	ap.sigtermWithin(t, 60*time.Second, "before the marker")
	wantNewestCommitted(t, ckdir, storeDir, "")
}

// wantNewestCommitted fails the test unless the newest complete checkpoint in ckdir is committed
// in the file store storeDir (job e2e), by spotguard list --check; what says which it is.
func wantNewestCommitted(t *testing.T, ckdir, storeDir, what string) {
	t.Helper()
	ckpt := newestLocal(t, ckdir)
	code, stdout, stderr := runSpotguard(t, []string{"SPOTGUARD_STORE_URL=file://" + storeDir, "SPOTGUARD_STORE_JOB=e2e"},
		"list", "--check", "--config", writeEmptyConfig(t))
	if code != 0 || !strings.Contains(stdout, ckpt) {
		t.Fatalf("after the agent exited, list: exit %d\n%s%s; want %s%s committed", code, stdout, stderr, ckpt, what)
	}
}

// SIGTERM while a rebalance recommendation is held back for a reclaim that may come with it (two
// spot polls: 10 s here): the stop signals the trainer at once, and then waits for that
// checkpoint and commits it, as for a notice signalled before the stop. Before, the agent
// signalled the trainer and exited 0.2 s later without a commit: its uploader had decided there
// was nothing to wait for before the held notice was signalled. (Found from outside.)
func TestSIGTERMDuringAHeldNoticeStillCommits(t *testing.T) {
	needPeers(t)
	sim := newIMDS(t)
	sim.start("spot", "-d", "100000") // the rebalance recommendation alone
	ckdir, storeDir := t.TempDir(), t.TempDir()
	tp := startTrainer(t, "--checkpoint-dir", ckdir, "--files", "2", "--checkpoint-mb", "2", "--write-seconds", "3")
	ap := startAgent(t, sim, "SPOTGUARD_TRAINER_PIDFILE="+tp.pidfile, "SPOTGUARD_IMDS_SPOT_POLL_INTERVAL=5s",
		"SPOTGUARD_CHECKPOINT_DIR="+ckdir, "SPOTGUARD_STORE_URL=file://"+storeDir, "SPOTGUARD_STORE_JOB=e2e")
	ap.waitNoticeState(t, "rebalance/rebalance", "detected", 30*time.Second)
	if got := tp.signals(t); len(got) != 0 {
		t.Fatalf("the trainer was signalled during the hold: %+v", got)
	}
	ap.sigtermWithin(t, 60*time.Second, "during the hold")
	if got := tp.signals(t); len(got) != 1 {
		t.Fatalf("the trainer got %d signals; want 1, at the stop", len(got))
	}
	eventually(t, 30*time.Second, "the trainer's checkpoint to be complete", func() bool {
		marks, _ := filepath.Glob(filepath.Join(ckdir, "step-*", "_COMPLETE"))
		return len(marks) > 0
	})
	wantNewestCommitted(t, ckdir, storeDir, ", saved at the stop,")
}

// SIGTERM after the trainer was signalled and then died without a checkpoint (killed, OOM): no
// marker will come, so the stop does not wait out the stop budget (140 s) for one; it exits
// within seconds, saying why.
func TestSIGTERMAfterTheTrainerDiedExitsPromptly(t *testing.T) {
	needPeers(t)
	sim := newIMDS(t)
	trigger := time.Now().Truncate(time.Second).Add(3 * time.Second)
	sim.start("spot", "-a", "terminate", "--mock-trigger-time", trigger.UTC().Format(time.RFC3339), "--rebalance-delay-sec", "100000")
	tp := startTrainer(t) // logs the signal, writes no checkpoint
	ap := startAgent(t, sim, "SPOTGUARD_TRAINER_PIDFILE="+tp.pidfile, "SPOTGUARD_NOTICES_REBALANCE=ignore",
		"SPOTGUARD_CHECKPOINT_DIR="+t.TempDir(), "SPOTGUARD_STORE_URL=file://"+t.TempDir(), "SPOTGUARD_STORE_JOB=e2e")
	ap.waitNoticeState(t, "spot/terminate", "trainer_signalled", 30*time.Second)
	tp.cmd.Process.Kill()
	<-tp.done
	sent := time.Now()
	ap.cmd.Process.Signal(syscall.SIGTERM)
	select {
	case <-ap.done:
	case <-time.After(30 * time.Second):
		t.Fatalf("agent still waiting 30 s after SIGTERM for the checkpoint of a trainer that is gone\n%s", ap.log(t))
	}
	if ap.exitErr != nil {
		t.Errorf("exit: %v; want 0", ap.exitErr)
	}
	if log := ap.log(t); !strings.Contains(log, "the trainer is gone") {
		t.Errorf("the agent did not say why it stopped waiting:\n%s", log)
	}
	t.Logf("exited %v after SIGTERM", time.Since(sent).Round(time.Millisecond))
}
