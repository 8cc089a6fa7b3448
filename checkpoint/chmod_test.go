package checkpoint

import (
	"errors"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"
)

// chmodTree gives every file below dir/name group write permission: a chmod -R, which changes
// every file's ctime and none of its bytes.
func chmodTree(t *testing.T, dir, name string) {
	t.Helper()
	err := filepath.WalkDir(filepath.Join(dir, name), func(p string, d os.DirEntry, err error) error {
		if err != nil || d.IsDir() {
			return err
		}
		return os.Chmod(p, 0o664)
	})
	if err != nil {
		t.Fatal(err)
	}
}

// laterTick waits until a file written now gets a later change time than dir/name's marker: the
// kernel's file times move in ticks of a few milliseconds, and two checkpoints completed in one
// tick are ordered by their commit ids alone.
func laterTick(t *testing.T, dir, name string) {
	t.Helper()
	fi, err := os.Lstat(filepath.Join(dir, name, "_COMPLETE"))
	if err != nil {
		t.Fatal(err)
	}
	marker := FileIDOf(fi).ChangeTime
	probe := filepath.Join(t.TempDir(), "tick")
	deadline := time.Now().Add(5 * time.Second)
	for {
		if err := os.WriteFile(probe, nil, 0o644); err != nil {
			t.Fatal(err)
		}
		if pi, err := os.Lstat(probe); err == nil && FileIDOf(pi).ChangeTime.After(marker) {
			return
		}
		if time.Now().After(deadline) {
			t.Fatal("the file system's clock did not move in 5 s")
		}
	}
}

// ageTree sets the modification time of every file below dir/name to age ago.
func ageTree(t *testing.T, dir, name string, age time.Duration) {
	t.Helper()
	at := time.Now().Add(-age)
	err := filepath.WalkDir(filepath.Join(dir, name), func(p string, d os.DirEntry, err error) error {
		if err != nil || d.IsDir() {
			return err
		}
		return os.Chtimes(p, at, at)
	})
	if err != nil {
		t.Fatal(err)
	}
}

// latestIs fails unless LATEST names name and the commit named is there.
func latestIs(t *testing.T, s Store, name, commit string) {
	t.Helper()
	st, err := readJob(t.Context(), s, "job", nil)
	if err != nil {
		t.Fatal(err)
	}
	if st.Latest == nil || st.Latest.Checkpoint != name || st.Latest.Commit != commit {
		t.Fatalf("LATEST is %+v; want %s/%s", st.Latest, name, commit)
	}
	if _, _, err := s.GetBytes(t.Context(), ManifestKey("job", name, commit)); err != nil {
		t.Fatalf("the newest commit %s/%s is gone: %v", name, commit, err)
	}
}

// notSentAgain waits until r says that name on disk is a copy of a commit retention deleted,
// and checks that the store holds no commit of it.
func notSentAgain(t *testing.T, r *uploaderRig, s Store, name string) {
	t.Helper()
	eventuallyUploader(t, name+" taken for its deleted commit", func() bool {
		return strings.Contains(r.logs.String(), `"checkpoint":"`+name+`"`) && strings.Contains(r.logs.String(), "not sent again")
	})
	if cs := commitsOf(t, s, name); len(cs) != 0 {
		t.Errorf("%s has %d commits; want none: retention deleted its commit, older than the one it keeps", name, len(cs))
	}
}

// TestChmodOfAnOldCheckpointKeepsItsPlace: with checkpoint.keep, retention deletes old commits
// while their checkpoints stay on disk. A chmod -R of checkpoint.dir then changes every file's
// ctime: the old checkpoints are not the newest; they are those deleted commits, not sent again
// (retention would delete them at once), or, without retention, committed again in their place
// in the order; LATEST stays, and the newest commit is never deleted. (Found from outside:
// LATEST went back to an old step and the newest commit was deleted, live and after a restart.)
func TestChmodOfAnOldCheckpointKeepsItsPlace(t *testing.T) {
	t.Run("live", func(t *testing.T) {
		s, dir := newMemStore(), t.TempDir()
		r := startUploader(t, dir, s, 1)
		writeCheckpoint(t, dir, "step-1", map[string][]byte{"a": randomBytes(t, 8<<10)})
		r.waitCommitted("step-1")
		laterTick(t, dir, "step-1")
		writeCheckpoint(t, dir, "step-2", map[string][]byte{"a": randomBytes(t, 8<<10)})
		newest := r.waitCommitted("step-2")
		latestIs(t, s, "step-2", newest.Manifest.Commit)

		chmodTree(t, dir, "step-1")
		notSentAgain(t, r, s, "step-1")
		latestIs(t, s, "step-2", newest.Manifest.Commit)
	})
	t.Run("during a notice, the store not listing", func(t *testing.T) {
		// A notice sends a changed checkpoint without reading the store's commits of it first,
		// and its commit, unable to read them, writes a new one: with the place of the commit
		// these bytes were (found by the simulation).
		s, dir := newMemStore(), t.TempDir()
		r := startUploader(t, dir, s, 0)
		writeCheckpoint(t, dir, "step-1", map[string][]byte{"a": randomBytes(t, 8<<10)})
		r.waitCommitted("step-1")
		laterTick(t, dir, "step-1")
		writeCheckpoint(t, dir, "step-2", map[string][]byte{"a": randomBytes(t, 8<<10)})
		newest := r.waitCommitted("step-2")

		r.up.SetNotices([]ActiveNotice{{Key: "spot/terminate", Deadline: time.Now().Add(2 * time.Minute), SignalledAt: time.Now()}})
		s.mu.Lock()
		s.listErr = errors.New("memstore: 503 SlowDown")
		s.mu.Unlock()
		chmodTree(t, dir, "step-1")
		again := r.waitCommitted("step-1")
		if again.Manifest.Order().After(newest.Manifest.Order()) {
			t.Errorf("step-1 committed again completed at %v, after step-2 (%v)", again.Manifest.Order().At, newest.Manifest.Order().At)
		}
		s.mu.Lock()
		s.listErr = nil
		s.mu.Unlock()
		latestIs(t, s, "step-2", newest.Manifest.Commit)
	})
	t.Run("after a restart", func(t *testing.T) {
		s, dir, state := newMemStore(), t.TempDir(), t.TempDir()
		r := startUploaderWith(t, dir, s, UploaderConfig{Keep: 1, StateDir: state})
		writeCheckpoint(t, dir, "step-1", map[string][]byte{"a": randomBytes(t, 8<<10)})
		r.waitCommitted("step-1")
		laterTick(t, dir, "step-1")
		writeCheckpoint(t, dir, "step-2", map[string][]byte{"a": randomBytes(t, 8<<10)})
		newest := r.waitCommitted("step-2")
		r.stop()

		// The checkpoints were written a while before the agent restarts (say, before a reboot).
		ageTree(t, dir, "step-1", 2*time.Minute)
		ageTree(t, dir, "step-2", time.Minute)
		chmodTree(t, dir, "step-1")
		chmodTree(t, dir, "step-2")
		r = startUploaderWith(t, dir, s, UploaderConfig{Keep: 1, StateDir: state})
		notSentAgain(t, r, s, "step-1")
		latestIs(t, s, "step-2", newest.Manifest.Commit)

		// And live, in the restarted agent.
		r.logs.reset()
		chmodTree(t, dir, "step-1")
		notSentAgain(t, r, s, "step-1")
		latestIs(t, s, "step-2", newest.Manifest.Commit)
	})
}
