//go:build linux

package checkpoint

import (
	"bytes"
	"io/fs"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"syscall"
	"testing"

	"github.com/rs/zerolog"
)

// A restore as root (the spotguard-restore unit) into a destination another user owns (the
// trainer's checkpoint.dir) gives every file and directory it writes to that user and group,
// with the modes the manifest lists. Restored as root's, a file the trainer saved as 0600
// (tempfile.mkstemp) could not be read by the trainer, nor a checkpoint it rotates away be
// deleted; and the agent, which never uploads what the owner of checkpoint.dir could not read,
// committed the restored checkpoint again without that file, as the newest commit. (Found from
// outside.) A destination of root's keeps root's files.
func TestRestoreAsRootGivesTheFilesToTheDestinationsOwner(t *testing.T) {
	needRoot(t, "to restore into another user's directory")
	const uid, gid = 12345, 23456
	files := map[string]string{"model.pt": "weights", "optimizer.pt": "state", "optim/deep/__0_0.distcp": "shard", "_COMPLETE": ""}
	s := newMemStore()
	m := restoreTestManifest(t, restoreTestJob, "step-1", restoreTestT0, files)
	for i := range m.Files {
		if m.Files[i].Path == "optimizer.pt" {
			m.Files[i].Mode = "0600"
		}
		s.put(m.Files[i].Key, []byte(files[m.Files[i].Path]))
	}
	restoreTestPutJSON(t, s, ManifestKey(restoreTestJob, "step-1", m.Commit), m)

	owned := func(t *testing.T, dir string) map[string][2]uint32 {
		t.Helper()
		got := map[string][2]uint32{}
		err := filepath.WalkDir(dir, func(p string, d fs.DirEntry, err error) error {
			if err != nil {
				return err
			}
			fi, err := os.Lstat(p)
			if err != nil {
				return err
			}
			st := fi.Sys().(*syscall.Stat_t)
			rel, _ := filepath.Rel(dir, p)
			got[rel] = [2]uint32{st.Uid, st.Gid}
			return nil
		})
		if err != nil {
			t.Fatal(err)
		}
		return got
	}

	t.Run("another user's", func(t *testing.T) {
		_, to := restoreTestDirs(t)
		if err := os.Chown(to, uid, gid); err != nil {
			t.Fatal(err)
		}
		var log bytes.Buffer
		res, err := Restore(t.Context(), s, restoreTestOpts(to, &log))
		if err != nil {
			t.Fatalf("Restore() error: %v", err)
		}
		got := owned(t, res.Dir)
		for _, rel := range []string{".", "model.pt", "optimizer.pt", "optim", "optim/deep", "optim/deep/__0_0.distcp", "_COMPLETE"} {
			if got[rel] != [2]uint32{uid, gid} {
				t.Errorf("%s belongs to %v; want %d:%d", rel, got[rel], uid, gid)
			}
		}
		if len(got) != 7 {
			t.Errorf("restored %d paths: %v; want 7", len(got), got)
		}
		if fi, err := os.Stat(filepath.Join(res.Dir, "optimizer.pt")); err != nil || fi.Mode().Perm() != 0o600 {
			t.Errorf("optimizer.pt mode %v (%v); want 0600", fi.Mode().Perm(), err)
		}
		// As the agent sees it: complete, every file there.
		list, err := Scan(to, "", "", zerolog.Nop())
		if err != nil {
			t.Fatal(err)
		}
		if names, want := skipNames(list), []string{"step-1 complete=true", "step-1/model.pt", "step-1/optim/deep/__0_0.distcp", "step-1/optimizer.pt"}; !slices.Equal(names, want) {
			t.Errorf("Scan of the restored checkpoint = %v; want %v", names, want)
		}
	})
	// sudo spotguard restore --to /home/ubuntu/ckpt on a new instance: the directories it has to
	// create are the owner's of the one they are made in, and so are the files. (Found from
	// outside: they were root's, and the trainer could not save into ckpt.)
	t.Run("created in another user's", func(t *testing.T) {
		_, home := restoreTestDirs(t)
		if err := os.Chown(home, uid, gid); err != nil {
			t.Fatal(err)
		}
		to := filepath.Join(home, "run", "ckpt")
		var log bytes.Buffer
		res, err := Restore(t.Context(), s, restoreTestOpts(to, &log))
		if err != nil {
			t.Fatalf("Restore() error: %v", err)
		}
		got := owned(t, home)
		for _, rel := range []string{"run", "run/ckpt", "run/ckpt/step-1", "run/ckpt/step-1/optimizer.pt", "run/ckpt/step-1/optim/deep"} {
			if got[rel] != [2]uint32{uid, gid} {
				t.Errorf("%s belongs to %v; want %d:%d", rel, got[rel], uid, gid)
			}
		}
		if res.Dir != filepath.Join(to, "step-1") {
			t.Errorf("restored into %s; want %s", res.Dir, filepath.Join(to, "step-1"))
		}
	})
	t.Run("created in root's", func(t *testing.T) {
		_, base := restoreTestDirs(t)
		to := filepath.Join(base, "run", "ckpt")
		var log bytes.Buffer
		if _, err := Restore(t.Context(), s, restoreTestOpts(to, &log)); err != nil {
			t.Fatalf("Restore() error: %v", err)
		}
		for rel, o := range owned(t, base) {
			if o != [2]uint32{0, 0} {
				t.Errorf("%s belongs to %v; want root's", rel, o)
			}
		}
	})
	// Under a root-owned mount point with trainer.user set (DirOwner): the directories it
	// creates, and so the files, are the trainer's (its group where the system knows the user,
	// else its own number, as a user namespace maps it: root's group was mapped to no group in
	// the trainer's container, found from outside). (Found from outside: checkpoints/ was root's,
	// and the trainer, running as another user, failed at its first save.)
	t.Run("created in root's for trainer.user", func(t *testing.T) {
		_, base := restoreTestDirs(t)
		to := filepath.Join(base, "run", "ckpt")
		var log bytes.Buffer
		opts := restoreTestOpts(to, &log)
		owner := uid
		opts.DirOwner = &owner
		if _, err := Restore(t.Context(), s, opts); err != nil {
			t.Fatalf("Restore() error: %v", err)
		}
		got := owned(t, base)
		if got["."] != [2]uint32{0, 0} {
			t.Errorf("the directory above belongs to %v; want root's, untouched", got["."])
		}
		for _, rel := range []string{"run", "run/ckpt", "run/ckpt/step-1", "run/ckpt/step-1/optimizer.pt"} {
			if got[rel] != [2]uint32{uid, uid} {
				t.Errorf("%s belongs to %v; want %d:%d (trainer.user, unknown here: its own number as its group)", rel, got[rel], uid, uid)
			}
		}
	})
	t.Run("root's", func(t *testing.T) {
		_, to := restoreTestDirs(t)
		var log bytes.Buffer
		res, err := Restore(t.Context(), s, restoreTestOpts(to, &log))
		if err != nil {
			t.Fatalf("Restore() error: %v", err)
		}
		for rel, o := range owned(t, res.Dir) {
			if o != [2]uint32{0, 0} {
				t.Errorf("%s belongs to %v; want root's", rel, o)
			}
		}
	})
}

// A restore as root that makes the agent's journal (sudo spotguard restore, the agent running as
// the owner of agent.runtime_dir) gives it to that owner: the agent must go on reading and
// appending to it.
func TestRestoreAsRootGivesTheJournalToItsDirectorysOwner(t *testing.T) {
	needRoot(t, "to make a file for another user")
	const uid, gid = 12345, 23456
	s := newMemStore()
	m := restoreTestCommit(t, s, restoreTestJob, "step-1", restoreTestT0, map[string]string{"model.pt": "weights", "_COMPLETE": ""})
	state := t.TempDir()
	if err := os.Chown(state, uid, gid); err != nil {
		t.Fatal(err)
	}
	to := t.TempDir()
	journal := JournalPath(state, restoreTestJob, to, s.URL())
	if _, err := Restore(t.Context(), s, RestoreOptions{Job: restoreTestJob, To: to, Logger: zerolog.Nop(), Journal: journal}); err != nil {
		t.Fatal(err)
	}
	fi, err := os.Stat(journal)
	if err != nil {
		t.Fatalf("the journal was not written: %v", err)
	}
	if st := fi.Sys().(*syscall.Stat_t); st.Uid != uid || st.Gid != gid {
		t.Errorf("journal owned by %d:%d; want %d:%d, its directory's owner", st.Uid, st.Gid, uid, gid)
	}
	entries, err := readJournal(journal)
	if e := entries["step-1"]; err != nil || e == nil || !e.done || !e.adopted || e.commit != m.Commit || !e.completeAt.Equal(m.Order().At) || len(e.files) != 2 {
		t.Errorf("journal entry = %+v, %v; want step-1's commit %s, adopted and done, at its place, with its 2 files", e, err, m.Commit)
	}
}

// needRoot skips t when it does not run as root (it needs root why), but fails it in CI, which
// runs as root: a test skipped there would never run.
func needRoot(t *testing.T, why string) {
	t.Helper()
	if os.Geteuid() != 0 {
		if os.Getenv("CI") != "" {
			t.Fatalf("this test needs root, %s (CI runs as root)", why)
		}
		t.Skipf("needs root, %s", why)
	}
}

// A restore as root whose destination passes through a symbolic link of another user's (the
// trainer's checkpoint.dir made a link) writes nothing where the link points unless that is a
// directory of the same user's: that user could point it at /etc/systemd/system, and root would
// write directories and files of the trainer's choosing there. (Found from outside: a restore
// wrote root's files into a root directory through the trainer's link.)
func TestRestoreAsRootDoesNotFollowAnotherUsersLinkElsewhere(t *testing.T) {
	needRoot(t, "to restore through another user's link")
	const uid = 12345
	s := newMemStore()
	restoreTestCommit(t, s, restoreTestJob, "step-1", restoreTestT0, map[string]string{"model.pt": "weights", "_COMPLETE": ""})
	userDir := func(t *testing.T) string {
		t.Helper()
		d := t.TempDir()
		if err := os.Chown(d, uid, uid); err != nil {
			t.Fatal(err)
		}
		return d
	}
	link := func(t *testing.T, target string) string {
		t.Helper()
		l := filepath.Join(userDir(t), "ckpt")
		if err := os.Symlink(target, l); err != nil {
			t.Fatal(err)
		}
		if err := os.Lchown(l, uid, uid); err != nil {
			t.Fatal(err)
		}
		return l
	}

	for _, dest := range []string{"", "sub/deeper"} { // the link's target itself, or below it
		t.Run("to root's directory/"+dest, func(t *testing.T) {
			rootDir := t.TempDir() // root's
			to := filepath.Join(link(t, rootDir), dest)
			var log bytes.Buffer
			_, err := Restore(t.Context(), s, restoreTestOpts(to, &log))
			if err == nil || !strings.Contains(err.Error(), "passes through the symbolic link") || !strings.Contains(err.Error(), "uid 12345") {
				t.Fatalf("Restore(%s) error = %v; want it refused, naming the link and its owner", to, err)
			}
			if names, _ := os.ReadDir(rootDir); len(names) != 0 {
				t.Errorf("root's directory holds %v after the refused restore; want nothing", names)
			}
		})
	}
	// A directory of root's inside one of the user's: the user could swap it for a link between
	// the check of the path and the open (found from outside: 16 of 100 such races wrote root's
	// files into a root directory), so it is refused whatever the path holds now.
	t.Run("root's directory in the user's", func(t *testing.T) {
		home := userDir(t)
		to := filepath.Join(home, "ckpt")
		if err := os.Mkdir(to, 0o755); err != nil { // root's
			t.Fatal(err)
		}
		var log bytes.Buffer
		_, err := Restore(t.Context(), s, restoreTestOpts(to, &log))
		if err == nil || !strings.Contains(err.Error(), "is root's, but "+home+" on its path is uid 12345's") {
			t.Fatalf("Restore(%s) error = %v; want it refused, naming the user's directory on the path", to, err)
		}
		if names, _ := os.ReadDir(to); len(names) != 0 {
			t.Errorf("%s holds %v after the refused restore; want nothing", to, names)
		}
	})
	t.Run("to the same user's directory", func(t *testing.T) {
		var log bytes.Buffer
		res, err := Restore(t.Context(), s, restoreTestOpts(link(t, userDir(t)), &log))
		if err != nil {
			t.Fatalf("Restore() error: %v", err)
		}
		if fi, err := os.Stat(filepath.Join(res.Dir, "model.pt")); err != nil || fi.Sys().(*syscall.Stat_t).Uid != uid {
			t.Errorf("model.pt: %v, %v; want it restored, the user's", fi, err)
		}
	})
}
