package e2e

import (
	"encoding/json"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"
)

// writePeerNotice plays another node's trainer: it writes that node's notice where the example
// trainer's --peer-notice reads the job's notices (a stand-in for the collective).
func writePeerNotice(t *testing.T, path, action, deadline string) {
	t.Helper()
	b, _ := json.Marshal(map[string]string{"source": "spot", "action": action, "deadline": deadline, "from": "another-node:1"})
	tmp := path + ".tmp"
	if err := os.WriteFile(tmp, b, 0o644); err != nil {
		t.Fatal(err)
	}
	if err := os.Rename(tmp, path); err != nil {
		t.Fatal(err)
	}
}

// noticeTransitions is "detected → ... → committed" for the notice key in /status, and its signals.
func noticeTransitions(st agentStatus, key string) (string, int, bool) {
	for _, ns := range st.Notices {
		if ns.Key == key {
			var states []string
			for _, tr := range ns.Transitions {
				states = append(states, tr.State)
			}
			return strings.Join(states, " → "), len(ns.Signals), true
		}
	}
	return "", 0, false
}

// An agent whose own IMDS announces nothing is handed a notice by `spotguard notify` (a real
// process, the listener read from the configuration): it lists the notice in notice.json under
// source job, does not signal the trainer, turns urgent, and the checkpoint the trainer then writes
// (told by the job, here a peer-notice file) is committed in S3, labelled with the job notice.
func TestNotifyMakesTheAgentUploadUrgently(t *testing.T) {
	needPeers(t)
	s3 := startS3(t)
	sim := newIMDS(t)
	sim.start("spot", "-d", "100000", "--rebalance-delay-sec", "100000") // no notice for a day
	ckdir := t.TempDir()
	peer := filepath.Join(t.TempDir(), "peer-notice.json")
	tp := startTrainer(t, "--checkpoint-dir", ckdir, "--files", "3", "--checkpoint-mb", "6", "--write-seconds", "1", "--peer-notice", peer)
	storeURL := "s3://" + s3Bucket + "/job-notice"
	ap := startAgent(t, sim, append([]string{"SPOTGUARD_TRAINER_PIDFILE=" + tp.pidfile, "SPOTGUARD_CHECKPOINT_DIR=" + ckdir,
		"SPOTGUARD_STORE_URL=" + storeURL, "SPOTGUARD_STORE_JOB=e2e", "SPOTGUARD_STORE_PART_SIZE=5MiB"}, s3.env("")...)...)
	eventually(t, waitSignal, "the agent to find the trainer", func() bool { return len(ap.status(t).Trainers) == 1 })
	if st := ap.status(t); len(st.Notices) != 0 || st.Uploads == nil || st.Uploads.Urgent {
		t.Fatalf("/status before the notice: notices %+v, uploads %+v; want none, not urgent", st.Notices, st.Uploads)
	}

	deadline := time.Now().Add(2 * time.Minute).UTC().Truncate(time.Second).Format(time.RFC3339)
	listen := "SPOTGUARD_HTTP_LISTEN=" + strings.TrimPrefix(ap.base, "http://")
	code, stdout, stderr := runSpotguard(t, []string{listen}, "notify", "--config", ap.configPath, "--deadline", deadline)
	if code != 0 || !strings.HasPrefix(stdout, "notice job/terminate taken (new): deadline "+deadline) {
		t.Fatalf("spotguard notify: exit %d, stdout %q, stderr %q; want 0 and the new notice", code, stdout, stderr)
	}
	n := readNotice(t, ap)
	if n.Source != "job" || n.Action != "terminate" || n.Deadline == nil || n.Deadline.UTC().Format(time.RFC3339) != deadline {
		t.Errorf("notice.json = %+v; want source job, terminate, deadline %s", n, deadline)
	}
	st := ap.status(t)
	if tr, sigs, ok := noticeTransitions(st, "job/terminate"); !ok || tr != "detected" || sigs != 0 {
		t.Errorf("/status job/terminate: %q, %d signals (present %v); want detected, no signal", tr, sigs, ok)
	}
	if st.Uploads == nil || !st.Uploads.Urgent {
		t.Errorf("/status uploads = %+v; want urgent", st.Uploads)
	}
	if m := ap.metrics(t); !hasLine(m, `spotguard_notices_total{action="terminate",source="job"} 1`) {
		t.Errorf("/metrics lacks the job notice:\n%s", grepLines(m, "spotguard_notices_total"))
	}
	assertStillSignals(t, ap, tp, "spot", 0)

	// The same notice again (a second node's trainer, a retry): refreshed, not doubled.
	code, stdout, _ = runSpotguard(t, []string{listen}, "notify", "--config", ap.configPath, "--deadline", deadline, "--json")
	var reply struct {
		Result string `json:"result"`
		Notice struct {
			Posts int `json:"posts"`
		} `json:"notice"`
	}
	if err := json.Unmarshal([]byte(stdout), &reply); code != 0 || err != nil || reply.Result != "refreshed" || reply.Notice.Posts != 2 {
		t.Errorf("spotguard notify again: exit %d, %q; want refreshed, posted twice", code, stdout)
	}

	// The job tells the trainer to save (the collective; here the peer file): it is committed,
	// urgently, for the job notice.
	writePeerNotice(t, peer, "terminate", deadline)
	ap.waitNoticeState(t, "job/terminate", "committed", 60*time.Second)
	st = ap.status(t)
	if tr, sigs, _ := noticeTransitions(st, "job/terminate"); tr != "detected → checkpoint_written → committed" || sigs != 0 {
		t.Errorf("/status job/terminate: %q, %d signals; want detected → checkpoint_written → committed, no signal", tr, sigs)
	}
	ckpt := newestLocal(t, ckdir)
	if u := st.Uploads; u == nil || !u.Urgent || len(u.Checkpoints) != 1 || !u.Checkpoints[0].Committed || u.Checkpoints[0].FilesStored != 4 {
		t.Errorf("/status uploads = %+v; want urgent, %s committed with its 4 files", u, ckpt)
	}
	m := ap.metrics(t)
	for _, want := range []string{`spotguard_checkpoints_committed_total{trigger="notice"} 1`, `spotguard_notice_deadline_margin_seconds{source="job"}`,
		`spotguard_notices_total{action="terminate",source="job"} 1`} {
		if !hasLine(m, want) {
			t.Errorf("/metrics lacks %q", want)
		}
	}
	commit := latestCommit(t, s3.aws(t, "s3", "cp", "s3://"+s3Bucket+"/job-notice/e2e/LATEST", "-"), ckpt)
	var manifest struct{ Trigger, Notice string }
	raw := s3.aws(t, "s3", "cp", "s3://"+s3Bucket+"/job-notice/e2e/"+ckpt+"/"+commit+"/_spotguard/manifest.json", "-")
	if err := json.Unmarshal([]byte(raw), &manifest); err != nil || manifest.Trigger != "notice" || manifest.Notice != "job/terminate" {
		t.Errorf("manifest trigger %q notice %q (%v); want notice, job/terminate", manifest.Trigger, manifest.Notice, err)
	}
	if got := len(tp.signals(t)); got != 0 {
		t.Errorf("the trainer received %d signals; want none: the job notice came from the job", got)
	}
}

// Two "nodes" on one machine, each its own agent, IMDS and store; their trainers share a
// peer-notice file for a collective. Node A's IMDS announces a spot reclaim: its agent signals
// trainer A, which passes the notice on; trainer B hands it to agent B (POST /notice from the
// example trainer) and saves. Agent B, whose IMDS announced nothing, commits B's checkpoint for
// the job notice with A's deadline, and never signals trainer B.
func TestTrainerHandsAnotherNodesNoticeToItsAgent(t *testing.T) {
	needPeers(t)
	simA, simB := newIMDS(t), newIMDS(t)
	simA.start("spot", "-d", "100000", "--rebalance-delay-sec", "100000")
	simB.start("spot", "-d", "100000", "--rebalance-delay-sec", "100000")
	peer := filepath.Join(t.TempDir(), "peer-notice.json")
	ckA, ckB, storeA, storeB := t.TempDir(), t.TempDir(), t.TempDir(), t.TempDir()
	pidA, pidB := filepath.Join(t.TempDir(), "a.pid"), filepath.Join(t.TempDir(), "b.pid")
	apA := startAgent(t, simA, "SPOTGUARD_TRAINER_PIDFILE="+pidA, "SPOTGUARD_NOTICES_REBALANCE=ignore", "SPOTGUARD_CHECKPOINT_DIR="+ckA,
		"SPOTGUARD_STORE_URL=file://"+storeA, "SPOTGUARD_STORE_JOB=node-a")
	apB := startAgent(t, simB, "SPOTGUARD_TRAINER_PIDFILE="+pidB, "SPOTGUARD_CHECKPOINT_DIR="+ckB,
		"SPOTGUARD_STORE_URL=file://"+storeB, "SPOTGUARD_STORE_JOB=node-b")
	tpA := startTrainer(t, "--pidfile", pidA, "--checkpoint-dir", ckA, "--peer-notice", peer,
		"--notice-file", filepath.Join(apA.runtimeDir, "notice.json"))
	tpB := startTrainer(t, "--pidfile", pidB, "--checkpoint-dir", ckB, "--peer-notice", peer,
		"--notice-file", filepath.Join(apB.runtimeDir, "notice.json"), "--notify-agent", strings.TrimPrefix(apB.base, "http://"))

	// Node A is reclaimed.
	simA.stop()
	simA.start("spot", "-a", "terminate", "--rebalance-delay-sec", "100000")
	waitSignals(t, tpA, 1)
	apA.waitNoticeState(t, "spot/terminate", "committed", 60*time.Second)
	apB.waitNoticeState(t, "job/terminate", "committed", 60*time.Second)

	nA, nB := readNotice(t, apA), readNotice(t, apB)
	if nB.Source != "job" || nB.Action != "terminate" || nB.Deadline == nil || nA.Deadline == nil || !nB.Deadline.Equal(*nA.Deadline) {
		t.Errorf("node B's notice.json = %+v; want source job, terminate, node A's deadline %v", nB, nA.Deadline)
	}
	if tr, sigs, _ := noticeTransitions(apB.status(t), "job/terminate"); tr != "detected → checkpoint_written → committed" || sigs != 0 {
		t.Errorf("node B's job/terminate: %q, %d signals; want detected → checkpoint_written → committed, no signal", tr, sigs)
	}
	if !hasLine(apB.metrics(t), `spotguard_checkpoints_committed_total{trigger="notice"} 1`) {
		t.Errorf("node B committed no checkpoint for the notice:\n%s", grepLines(apB.metrics(t), "committed"))
	}
	assertStillSignals(t, apB, tpB, "spot", 0)
	// Node A's agent holds its own notice only: trainer A did not post it back.
	for _, ns := range apA.status(t).Notices {
		if ns.Source == "job" {
			t.Errorf("node A's agent holds a job notice %s; want only its own", ns.Key)
		}
	}
	if got := len(tpA.signals(t)); got != 1 {
		t.Errorf("trainer A received %d signals; want 1", got)
	}
	b, _ := os.ReadFile(filepath.Join(filepath.Dir(tpB.signalLog), "trainer.out"))
	if !strings.Contains(string(b), "agent 127.0.0.1:") || !strings.Contains(string(b), "took the notice: new job/terminate") {
		t.Errorf("trainer B's output does not say the agent took the notice:\n%s", b)
	}
}
