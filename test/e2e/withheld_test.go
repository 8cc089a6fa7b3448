package e2e

import (
	"maps"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"syscall"
	"testing"
	"time"
)

// A trainer running as root (a container's default) writes into a checkpoint.dir another user
// owns, and one of its files is 0600, as Python's tempfile.mkstemp makes them: the agent never
// uploads what the owner of checkpoint.dir could not read, and so it must not commit that
// checkpoint either, which restore would then present as complete without the file. The
// checkpoint is withheld: an error naming the file, /healthz 503, the counter; the commit before
// stays the newest. Once the file is readable, it is committed whole without the marker being
// written again. (Found from outside: step-2 was committed without optimizer.pt, and `spotguard
// restore` said every checksum verified.)
func TestFileTheOwnerCannotReadWithholdsTheCheckpoint(t *testing.T) {
	needPeers(t)
	needRoot(t, "to write files checkpoint.dir's owner cannot read")
	ts := newS3TestStore(startS3(t), "withheld")
	const job = "withheld"
	sim := quietIMDS(t)
	dir := t.TempDir()
	if err := os.Chown(dir, 65534, 65534); err != nil { // the trainer's user owns checkpoint.dir
		t.Fatal(err)
	}
	ap := startStoreAgent(t, sim, dir, ts, job, noTrainer)

	write := func(name string, files map[string]os.FileMode) {
		t.Helper()
		ck := filepath.Join(dir, name)
		if err := os.Mkdir(ck, 0o755); err != nil {
			t.Fatal(err)
		}
		for _, f := range slices.Sorted(maps.Keys(files)) {
			saveAtomically(t, filepath.Join(ck, f), files[f], -1) // root's, as a container's trainer
		}
		syncDir(t, ck)
		writeSynced(t, filepath.Join(ck, "_COMPLETE"), nil)
	}
	write("step-1", map[string]os.FileMode{"model.pt": 0o644, "optimizer.pt": 0o644})
	waitCommitted(t, ap, ts, job, "step-1", 15*time.Second)

	write("step-2", map[string]os.FileMode{"model.pt": 0o644, "optimizer.pt": 0o600})
	var reasons []string
	eventually(t, 15*time.Second, "/healthz to be 503 naming step-2/optimizer.pt", func() bool {
		code, h := ap.healthz(t)
		reasons = h.Reasons
		return code == 503 && slices.ContainsFunc(h.Reasons, func(r string) bool {
			return strings.Contains(r, "checkpoint step-2") && strings.Contains(r, "step-2/optimizer.pt")
		})
	})
	t.Logf("/healthz reasons: %q", reasons)
	if n := metricValue(t, ap.metrics(t), "spotguard_checkpoints_withheld_total"); n < 1 {
		t.Errorf("spotguard_checkpoints_withheld_total = %v; want at least 1", n)
	}
	if lines := ap.logLines(t, "marker is there but a file of the checkpoint cannot be stored; not complete, and never committed without it"); len(lines) == 0 ||
		lines[0]["level"] != "error" || !strings.Contains(lines[0]["error"].(string), "optimizer.pt") {
		t.Errorf("no error log line names step-2/optimizer.pt: %v", lines)
	}
	for _, c := range ts.list(t, job) {
		if c.Checkpoint == "step-2" {
			t.Fatalf("step-2 was committed without optimizer.pt: %+v", c)
		}
	}
	if u := ap.uploads(t); u == nil || !slices.ContainsFunc(u.Checkpoints, func(c checkpointStatus) bool {
		return c.Name == "step-2" && c.Withheld && !c.Complete && !c.Committed
	}) {
		t.Errorf("/status uploads = %+v; want step-2 withheld, not complete, not committed", u)
	}
	// LATEST, and so restore, stay on step-1.
	if out := ts.restore(t, job, t.TempDir()); !strings.Contains(out, "step-1") {
		t.Errorf("restore while step-2 is withheld: %s; want step-1", out)
	}

	// Readable now: committed whole, healthy again, and restored byte for byte.
	if err := os.Chmod(filepath.Join(dir, "step-2", "optimizer.pt"), 0o644); err != nil {
		t.Fatal(err)
	}
	waitCommitted(t, ap, ts, job, "step-2", 15*time.Second)
	for _, c := range ts.list(t, job) {
		if got, want := c.paths(), []string{"_COMPLETE", "model.pt", "optimizer.pt"}; c.Checkpoint == "step-2" && !slices.Equal(got, want) {
			t.Errorf("step-2 committed with %q; want %q", got, want)
		}
	}
	eventually(t, 15*time.Second, "/healthz to be 200 again", func() bool {
		code, _ := ap.healthz(t)
		return code == 200
	})
	to := t.TempDir()
	ts.restore(t, job, to)
	sameTree(t, filepath.Join(dir, "step-2"), filepath.Join(to, "step-2"))
}

// The trainer's user owns checkpoint.dir and saves a file as 0600 (tempfile.mkstemp); on the next
// instance `spotguard restore` runs as root (the spotguard-restore unit) into that user's
// checkpoint.dir. The restored files belong to that user, so the trainer can read the 0600 file
// and delete what it rotates away, and the agent there finds the checkpoint committed already:
// nothing is sent, no new commit. (Found from outside: the files were root's, the trainer could
// not read optimizer.pt, and the agent committed the restored checkpoint again without it, as
// the newest commit, which LATEST then named.)
func TestRestoreAsRootIntoTheTrainersDirIsAdopted(t *testing.T) {
	needPeers(t)
	needRoot(t, "to restore as root into another user's directory")
	const trainer = 65534
	ts := newS3TestStore(startS3(t), "owner")
	const job = "restore-owner"
	sim := quietIMDS(t)
	dir1 := t.TempDir()
	if err := os.Chown(dir1, trainer, trainer); err != nil {
		t.Fatal(err)
	}
	ap1 := startStoreAgent(t, sim, dir1, ts, job, noTrainer)
	ck := filepath.Join(dir1, "step-1")
	if err := os.Mkdir(ck, 0o755); err != nil {
		t.Fatal(err)
	}
	for name, mode := range map[string]os.FileMode{"model.pt": 0o644, "optimizer.pt": 0o600} {
		saveAtomically(t, filepath.Join(ck, name), mode, trainer)
	}
	if err := os.Chown(ck, trainer, trainer); err != nil {
		t.Fatal(err)
	}
	writeSynced(t, filepath.Join(ck, "_COMPLETE"), nil)
	commit := waitCommitted(t, ap1, ts, job, "step-1", 15*time.Second)
	if got := ts.list(t, job); len(got) != 1 || len(got[0].Files) != 3 {
		t.Fatalf("spotguard list --json = %+v; want step-1 with its three files", got)
	}

	// The next instance: restore as root into the trainer's checkpoint.dir, then its agent.
	dir2 := t.TempDir()
	if err := os.Chown(dir2, trainer, trainer); err != nil {
		t.Fatal(err)
	}
	ts.restore(t, job, dir2)
	err := filepath.WalkDir(filepath.Join(dir2, "step-1"), func(p string, d os.DirEntry, err error) error {
		if err != nil {
			return err
		}
		fi, err := os.Lstat(p)
		if err != nil {
			return err
		}
		if st := fi.Sys().(*syscall.Stat_t); st.Uid != trainer || st.Gid != trainer {
			t.Errorf("restored %s belongs to %d:%d; want the trainer's user, %d:%d", p, st.Uid, st.Gid, trainer, trainer)
		}
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	if fi, err := os.Stat(filepath.Join(dir2, "step-1", "optimizer.pt")); err != nil || fi.Mode().Perm() != 0o600 {
		t.Errorf("restored optimizer.pt: mode %v (%v); want 0600, as saved", fi.Mode().Perm(), err)
	}
	ap2 := startStoreAgent(t, sim, dir2, ts, job, noTrainer)
	eventually(t, 15*time.Second, "the agent on the next instance to find step-1 committed", func() bool {
		return len(ap2.logLines(t, "checkpoint already committed with these bytes; nothing sent")) > 0
	})
	if got := ts.list(t, job); len(got) != 1 || got[0].Commit != commit {
		t.Errorf("spotguard list --json = %+v; want step-1's commit %s alone", got, commit)
	}
	if code, h := ap2.healthz(t); code != 200 {
		t.Errorf("/healthz %d on the next instance: %v", code, h.Reasons)
	}
}

// saveAtomically saves 1 MiB of random bytes at path as a trainer's atomic save does: written to
// a temporary name beside it (".NAME.tmp", which the agent never looks at) with its mode and, for
// uid not -1, its owner, then renamed into place; so the file never appears with another mode
// or owner than its own.
func saveAtomically(t testing.TB, path string, mode os.FileMode, uid int) {
	t.Helper()
	tmp := filepath.Join(filepath.Dir(path), "."+filepath.Base(path)+".tmp")
	writeSynced(t, tmp, randomBytes(t, 1<<20))
	if uid != -1 {
		if err := os.Chown(tmp, uid, uid); err != nil {
			t.Fatal(err)
		}
	}
	if err := os.Chmod(tmp, mode); err != nil {
		t.Fatal(err)
	}
	if err := os.Rename(tmp, path); err != nil {
		t.Fatal(err)
	}
}

// The agent runs as a user other than the trainer's, without root's rights (nobody here; the
// unit runs it as root), and the trainer, root, saves a checkpoint into a directory it made
// 0700 and another with a 0600 file: the agent may not read them. Neither is committed, and
// that is said: an error naming each and the fix, the counter, /healthz 503. Once the agent may
// read them they are committed whole, without their markers being written again. (Found from
// outside: the 0700 directory was never committed, with a warning alone and /healthz 200, and
// the 0600 file was taken for the store refusing, with the store's fix.)
func TestCheckpointTheAgentMayNotReadIsWithheld(t *testing.T) {
	needPeers(t)
	needRoot(t, "to run the agent as another user than the trainer")
	const agentUID = 65534
	ts := newS3TestStore(startS3(t), "agent-denied")
	const job = "agent-denied"
	sim := quietIMDS(t)
	dir, err := os.MkdirTemp("", "spotguard-ckpt-") // root's, as the trainer's; the agent may list it
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { os.RemoveAll(dir) })
	if err := os.Chmod(dir, 0o755); err != nil {
		t.Fatal(err)
	}
	env := append([]string{"SPOTGUARD_CHECKPOINT_DIR=" + dir, "SPOTGUARD_STORE_PART_SIZE=5MiB", noTrainer}, ts.jobEnv(job, "")...)
	ap := startAgentAs(t, sim, agentUID, "# defaults\n", env...)

	// step-1: a directory made 0700 before anything was written into it.
	step1 := filepath.Join(dir, "step-1")
	if err := os.Mkdir(step1, 0o700); err != nil {
		t.Fatal(err)
	}
	saveAtomically(t, filepath.Join(step1, "model.pt"), 0o644, -1)
	writeSynced(t, filepath.Join(step1, "_COMPLETE"), nil)
	eventually(t, 15*time.Second, "an error saying the agent may not read step-1", func() bool {
		return len(ap.logLines(t, "the agent may not read the checkpoint directory, complete or not: it is not committed while it cannot")) > 0
	})
	// Whether its marker is there the agent cannot see: /healthz does not say it is.
	eventually(t, 15*time.Second, "/healthz to be 503 for step-1, which may hold a save the agent may not read", func() bool {
		code, h := ap.healthz(t)
		return code == 503 && slices.ContainsFunc(h.Reasons, func(r string) bool {
			return strings.HasPrefix(r, "checkpoint step-1 may hold a save the agent may not read (")
		})
	})
	// step-2: a 0600 file in a directory the agent may read.
	step2 := filepath.Join(dir, "step-2")
	if err := os.Mkdir(step2, 0o755); err != nil {
		t.Fatal(err)
	}
	saveAtomically(t, filepath.Join(step2, "model.pt"), 0o644, -1)
	saveAtomically(t, filepath.Join(step2, "optimizer.pt"), 0o600, -1)
	syncDir(t, step2)
	writeSynced(t, filepath.Join(step2, "_COMPLETE"), nil)
	var reasons []string
	eventually(t, 15*time.Second, "/healthz to be 503 naming step-2/optimizer.pt, which the agent may not read", func() bool {
		code, h := ap.healthz(t)
		reasons = h.Reasons
		return code == 503 && slices.ContainsFunc(h.Reasons, func(r string) bool {
			return strings.Contains(r, "checkpoint step-2") && strings.Contains(r, "optimizer.pt") &&
				strings.Contains(r, "the agent may not read it") && strings.Contains(r, "run the agent as root")
		})
	})
	t.Logf("/healthz reasons: %q", reasons)
	lines := ap.logLines(t, "the agent may not read the checkpoint directory, complete or not: it is not committed while it cannot")
	if len(lines) == 0 || lines[0]["level"] != "error" || lines[0]["checkpoint"] != "step-1" ||
		!strings.Contains(lines[0]["error"].(string), "run the agent as root") {
		t.Errorf("log lines for step-1 = %v; want an error naming step-1 and the fix", lines)
	}
	for _, l := range ap.logLines(t, "checkpoint upload failing; retrying") {
		t.Errorf("the agent's own rights were taken for the store failing: %v", l)
	}
	if n := metricValue(t, ap.metrics(t), "spotguard_checkpoints_withheld_total"); n < 2 {
		t.Errorf("spotguard_checkpoints_withheld_total = %v; want at least 2", n)
	}
	if got := ts.list(t, job); len(got) != 0 {
		t.Fatalf("committed while the agent could not read them: %+v", got)
	}

	// The agent may read both now: both committed whole, healthy, restored byte for byte.
	if err := os.Chmod(step1, 0o755); err != nil {
		t.Fatal(err)
	}
	if err := os.Chmod(filepath.Join(step2, "optimizer.pt"), 0o644); err != nil {
		t.Fatal(err)
	}
	waitCommitted(t, ap, ts, job, "step-2", 20*time.Second)
	want := map[string][]string{"step-1": {"_COMPLETE", "model.pt"}, "step-2": {"_COMPLETE", "model.pt", "optimizer.pt"}}
	eventually(t, 15*time.Second, "step-1 to be committed too", func() bool {
		return slices.ContainsFunc(ts.list(t, job), func(c listedCommit) bool { return c.Checkpoint == "step-1" })
	})
	for _, c := range ts.list(t, job) {
		if got := c.paths(); !slices.Equal(got, want[c.Checkpoint]) {
			t.Errorf("%s committed with %q; want %q", c.Checkpoint, got, want[c.Checkpoint])
		}
	}
	eventually(t, 15*time.Second, "/healthz to be 200 again", func() bool {
		code, _ := ap.healthz(t)
		return code == 200
	})
	to := t.TempDir()
	ts.restore(t, job, to)
	sameTree(t, step2, filepath.Join(to, "step-2"))
}

// A file written again after its checkpoint's marker while the agent was stopped (systemctl
// restart, an upgrade, a crash loop during the trainer's save): the restarted agent withholds the
// checkpoint (503 naming the file) and commits nothing of it until the marker is written again;
// then the checkpoint as it is. (Found from outside: committed with the old marker, as LATEST,
// and restored torn.)
func TestFileWrittenAfterTheMarkerWhileTheAgentWasStoppedIsWithheld(t *testing.T) {
	needPeers(t)
	ts := newS3TestStore(startS3(t), "afterstop")
	const job = "afterstop"
	sim := quietIMDS(t)
	dir := t.TempDir()
	ap := startStoreAgent(t, sim, dir, ts, job, noTrainer)
	runtime := ap.runtimeDir
	ap.stop(t)

	ck := filepath.Join(dir, "step-1")
	if err := os.Mkdir(ck, 0o755); err != nil {
		t.Fatal(err)
	}
	writeSynced(t, filepath.Join(ck, "model.pt"), []byte("the save the marker vouches for"))
	writeSynced(t, filepath.Join(ck, "_COMPLETE"), nil)
	marker, err := os.Stat(filepath.Join(ck, "_COMPLETE"))
	if err != nil {
		t.Fatal(err)
	}
	markerAt := time.Unix(marker.Sys().(*syscall.Stat_t).Ctim.Unix())
	probe := filepath.Join(t.TempDir(), "tick")
	eventually(t, 5*time.Second, "the file clock past the marker's", func() bool {
		if err := os.WriteFile(probe, nil, 0o644); err != nil {
			t.Fatal(err)
		}
		fi, err := os.Stat(probe)
		return err == nil && fi.ModTime().After(markerAt)
	})
	later := []byte("a later save's bytes, written after the marker")
	writeInPlace(t, filepath.Join(ck, "model.pt"), later)

	ap = startStoreAgent(t, sim, dir, ts, job, noTrainer, "SPOTGUARD_AGENT_RUNTIME_DIR="+runtime)
	eventually(t, 15*time.Second, "/healthz to be 503 naming step-1/model.pt", func() bool {
		code, h := ap.healthz(t)
		return code == 503 && slices.ContainsFunc(h.Reasons, func(r string) bool {
			return strings.Contains(r, "checkpoint step-1") && strings.Contains(r, "step-1/model.pt")
		})
	})
	if cs := ts.list(t, job); len(cs) != 0 {
		t.Fatalf("committed %d checkpoints while step-1's marker does not vouch for it; want none", len(cs))
	}

	writeInPlace(t, filepath.Join(ck, "_COMPLETE"), []byte("again"))
	waitCommitted(t, ap, ts, job, "step-1", 15*time.Second)
	to := t.TempDir()
	ts.restore(t, job, to)
	if got, err := os.ReadFile(filepath.Join(to, "step-1", "model.pt")); err != nil || string(got) != string(later) {
		t.Errorf("restored model.pt %q, %v; want the bytes the marker written again vouches for", got, err)
	}
	ts.check(t, job)
}
