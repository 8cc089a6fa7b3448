//go:build linux

package checkpoint

import (
	"errors"
	"io/fs"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"

	"github.com/rs/zerolog"
)

// skipReady returns the sorted "checkpoint/path" of the FileReady events in evs.
func skipReady(evs []WatchEvent) []string {
	var got []string
	for _, ev := range evs {
		if ev.Kind == FileReady {
			got = append(got, ev.Checkpoint+"/"+ev.Path)
		}
	}
	slices.Sort(got)
	return got
}

// skipOwnFiles writes, below dir, spotguard's own files (a restore's staging directory with a
// complete checkpoint in it, a file store temporary file that matches the pattern, and both
// inside the checkpoint ckpt) and the checkpoint ckpt with one file a.bin, complete.
func skipOwnFiles(t *testing.T, dir, ckpt, suffix string) {
	t.Helper()
	staging := filepath.Join(dir, restoreStagingPrefix+suffix)
	scanWrite(t, filepath.Join(staging, "step-9", "a.bin"), "restored")
	scanWrite(t, filepath.Join(staging, "step-9", "_COMPLETE"), "")
	scanWrite(t, filepath.Join(staging, "b.bin"), "b")
	scanWrite(t, filepath.Join(staging, "_COMPLETE"), "")
	scanWrite(t, filepath.Join(dir, fileTempPrefix+suffix+".pt"), "temp")
	ck := filepath.Join(dir, ckpt)
	scanWrite(t, filepath.Join(ck, restoreStagingPrefix+suffix, "c.bin"), "c")
	scanWrite(t, filepath.Join(ck, "sub", scanOwnPrefix+"anything"), "own")
	scanWrite(t, filepath.Join(ck, "a.bin"), "a")
	scanWrite(t, filepath.Join(ck, "_COMPLETE"), "")
}

// TestSpotguardOwnFilesAreNeverSeen is invariant I4 at its source: nothing spotguard names
// ".spotguard-..." below the checkpoint directory is a checkpoint or a file of one.
func TestSpotguardOwnFilesAreNeverSeen(t *testing.T) {
	for _, prefix := range []string{restoreStagingPrefix, fileTempPrefix} {
		if !strings.HasPrefix(prefix, scanOwnPrefix) || !scanSkipName(prefix+"x") {
			t.Errorf("spotguard's own name %q is not skipped", prefix+"x")
		}
	}
	for _, p := range []string{".spotguard-x", "a/.spotguard-x", ".spotguard-x/a", "a/.b.tmp/c"} {
		if !scanSkipPath(p) {
			t.Errorf("scanSkipPath(%q) = false; want true", p)
		}
	}
	for _, p := range []string{"a", "a/b", "spotguard-x", "a/x.spotguard-", ".spotguard", "a/.tmp.x"} {
		if scanSkipPath(p) {
			t.Errorf("scanSkipPath(%q) = true; want false", p)
		}
	}

	t.Run("Scan", func(t *testing.T) {
		dir := t.TempDir()
		skipOwnFiles(t, dir, "step-1", "x")
		logs := &scanLogs{}
		list, err := Scan(dir, "", "*.pt", zerolog.New(logs))
		if err != nil {
			t.Fatal(err)
		}
		if got, want := skipNames(list), []string{"step-1 complete=true", "step-1/a.bin"}; !slices.Equal(got, want) {
			t.Errorf("Scan() = %v; want %v", got, want)
		}
		if logs.String() != "" {
			t.Errorf("log lines for spotguard's own files:\n%s", logs)
		}
	})
	t.Run("watcher", func(t *testing.T) {
		dir := t.TempDir()
		skipOwnFiles(t, dir, "step-1", "x")
		h, evs := watchStart(t, dir, WatchConfig{})
		watchCheckReady(t, dir, "step-1", "_COMPLETE", evs, "a.bin")
		// After the start, seen by events.
		skipOwnFiles(t, dir, "step-2", "y")
		evs = h.untilComplete("step-2")
		watchCheckReady(t, dir, "step-2", "_COMPLETE", evs, "a.bin")
		if rest := h.barrier(); len(rest) != 0 {
			t.Errorf("events for spotguard's own files: %s", watchFormat(rest))
		}
		// Removing them is nothing either.
		if err := os.RemoveAll(filepath.Join(dir, restoreStagingPrefix+"x")); err != nil {
			t.Fatal(err)
		}
		if err := os.RemoveAll(filepath.Join(dir, "step-2", restoreStagingPrefix+"y")); err != nil {
			t.Fatal(err)
		}
		if rest := h.barrier(); len(rest) != 0 {
			t.Errorf("events for removing spotguard's own files: %s", watchFormat(rest))
		}
		if n := len(h.logs.lines(t, "warn", scanMsgBadName)) + len(h.logs.lines(t, "warn", scanMsgSpecial)); n != 0 {
			t.Errorf("skip lines for spotguard's own files = %d; want 0\n%s", n, h.logs)
		}
	})
}

// skipCheckLines checks that logs has exactly one skip line (scanMsgBadName) for each of
// paths, each naming want in its error, and none for other paths.
func skipCheckLines(t *testing.T, logs *scanLogs, want error, paths ...string) {
	t.Helper()
	got := logs.countPaths(t, "warn", scanMsgBadName)
	for _, p := range paths {
		if got[p] != 1 {
			t.Errorf("skip lines for %s = %d; want 1\n%s", p, got[p], logs)
		}
	}
	if len(got) != len(paths) {
		t.Errorf("skip lines for %v; want only %v\n%s", got, paths, logs)
	}
	for _, m := range logs.lines(t, "warn", scanMsgBadName) {
		if m["error"] != want.Error() {
			t.Errorf("skip line %v: error = %v; want %q", m, m["error"], want)
		}
	}
}

// TestHardLinksAreSkipped: a file with another name that is not the trainer's (the owner of the
// checkpoint directory) might be a file the trainer could not read (a link to a secret), so it is
// never reported; the trainer's own files with two names (cp -al of a checkpoint) are. (Those
// were skipped too, and a checkpoint made by cp -al was committed without them.)
func TestHardLinksAreSkipped(t *testing.T) {
	if os.Geteuid() != 0 {
		t.Skip("needs root: the checkpoint directory must belong to another user than the secret")
	}
	const trainer = 12345
	outside := t.TempDir()
	secret := filepath.Join(outside, "secret") // root's, readable by all: only its links decide
	scanWrite(t, secret, "secret")
	link := func(t *testing.T, old, name string) {
		t.Helper()
		if err := os.Link(old, name); err != nil {
			t.Skipf("cannot make hard links here: %v", err)
		}
	}
	own := func(t *testing.T, paths ...string) {
		t.Helper()
		for _, p := range paths {
			if err := os.Chown(p, trainer, trainer); err != nil {
				t.Fatal(err)
			}
		}
	}

	t.Run("Scan", func(t *testing.T) {
		dir := t.TempDir()
		ck := filepath.Join(dir, "step-1")
		scanWrite(t, filepath.Join(ck, "a.bin"), "a")
		scanWrite(t, filepath.Join(ck, "sub", "b.bin"), "b")
		link(t, secret, filepath.Join(ck, "sub", "secret.bin"))
		scanWrite(t, filepath.Join(ck, "twin-1.bin"), "twin")
		link(t, filepath.Join(ck, "twin-1.bin"), filepath.Join(ck, "twin-2.bin"))
		scanWrite(t, filepath.Join(ck, "_COMPLETE"), "")
		link(t, secret, filepath.Join(dir, "model.pt"))
		own(t, dir, ck, filepath.Join(ck, "sub"), filepath.Join(ck, "a.bin"), filepath.Join(ck, "sub", "b.bin"),
			filepath.Join(ck, "twin-1.bin"), filepath.Join(ck, "_COMPLETE"))
		logs := &scanLogs{}
		list, err := Scan(dir, "", "*.pt", zerolog.New(logs))
		if err != nil {
			t.Fatal(err)
		}
		// Not complete: committed without the link, it would be a torn checkpoint.
		if got, want := skipNames(list), []string{"step-1 complete=false", "step-1/a.bin", "step-1/sub/b.bin", "step-1/twin-1.bin", "step-1/twin-2.bin"}; !slices.Equal(got, want) {
			t.Errorf("Scan() = %v; want %v", got, want)
		}
		skipCheckLines(t, logs, errScanHardLink, filepath.Join(ck, "sub", "secret.bin"), filepath.Join(dir, "model.pt"))
		if err := os.Remove(filepath.Join(ck, "sub", "secret.bin")); err != nil {
			t.Fatal(err)
		}
		if list, _ := Scan(dir, "", "*.pt", zerolog.Nop()); !slices.Contains(skipNames(list), "step-1 complete=true") {
			t.Errorf("Scan() after the link is gone = %v; want step-1 complete", skipNames(list))
		}
	})
	t.Run("watcher", func(t *testing.T) {
		dir := t.TempDir()
		ck1 := filepath.Join(dir, "step-1")
		scanWrite(t, filepath.Join(ck1, "a.bin"), "a")
		link(t, secret, filepath.Join(ck1, "secret.bin"))
		scanWrite(t, filepath.Join(ck1, "_COMPLETE"), "")
		own(t, dir, ck1, filepath.Join(ck1, "a.bin"), filepath.Join(ck1, "_COMPLETE"))
		h, evs := watchStart(t, dir, WatchConfig{})
		// Withheld, naming the link, and complete once it is gone.
		if len(evs) == 0 || evs[0].Kind != Withheld || !errors.Is(evs[0].Err, ErrNotStorable) || !strings.Contains(evs[0].Err.Error(), "step-1/secret.bin") {
			t.Errorf("events at start = %s; want Withheld step-1 first, naming step-1/secret.bin", watchFormat(evs))
		}
		if err := os.Remove(filepath.Join(ck1, "secret.bin")); err != nil {
			t.Fatal(err)
		}
		h.untilComplete("step-1")

		// After the start: a link to the secret is skipped; the trainer's own file with a second
		// name is reported under both.
		ck2 := filepath.Join(dir, "step-2")
		scanWrite(t, filepath.Join(ck2, "a.bin"), "a")
		own(t, ck2, filepath.Join(ck2, "a.bin"))
		h.until("FileReady step-2 a.bin", func(ev WatchEvent) bool { return ev.Kind == FileReady && ev.Checkpoint == "step-2" })
		link(t, secret, filepath.Join(ck2, "secret.bin"))
		link(t, filepath.Join(ck2, "a.bin"), filepath.Join(ck2, "a-twin.bin"))
		link(t, secret, filepath.Join(dir, "model.pt"))
		// The trainer's marker, renamed into place (a chown after it would be a change of the
		// marker, which completes the checkpoint again).
		scanWrite(t, filepath.Join(ck2, ".marker.tmp"), "")
		own(t, filepath.Join(ck2, ".marker.tmp"))
		if err := os.Rename(filepath.Join(ck2, ".marker.tmp"), filepath.Join(ck2, "_COMPLETE")); err != nil {
			t.Fatal(err)
		}
		evs = h.until("Withheld step-2", func(ev WatchEvent) bool { return ev.Kind == Withheld && ev.Checkpoint == "step-2" })
		if err := os.Remove(filepath.Join(ck2, "secret.bin")); err != nil {
			t.Fatal(err)
		}
		evs = append(evs, h.untilComplete("step-2")...)
		ready := map[string]bool{}
		for _, ev := range evs {
			if ev.Kind == FileReady {
				ready[ev.Path] = true
			}
			// Withheld says it is there and cannot be stored, nothing of it.
			if (strings.Contains(ev.Path, "secret") || ev.Checkpoint == "model.pt") && ev.Kind != Withheld {
				t.Errorf("an event for a link to the secret: %s", watchFormat([]WatchEvent{ev}))
			}
		}
		if !ready["a-twin.bin"] {
			t.Errorf("events = %s; want a-twin.bin ready (the trainer's own file)", watchFormat(evs))
		}
		if rest := h.barrier(); len(rest) != 0 {
			t.Errorf("events after Complete: %s", watchFormat(rest))
		}
		skipCheckLines(t, h.logs, errScanHardLink, filepath.Join(ck1, "secret.bin"), filepath.Join(ck2, "secret.bin"),
			filepath.Join(dir, "model.pt"))
	})
}

// TestFilesTheOwnerCannotReadAreSkipped: the agent may read what the trainer (the owner of the
// checkpoint directory) could not; such a file is never reported.
func TestFilesTheOwnerCannotReadAreSkipped(t *testing.T) {
	root := os.Geteuid() == 0
	owner := uint32(os.Getuid())
	if root {
		owner = 12345
	}
	type file struct {
		name     string
		uid, gid uint32
		perm     fs.FileMode
		readable bool
	}
	files := []file{
		{"own.bin", owner, 0, 0o600, true},
		{"locked.bin", owner, 0, 0o000, false},
	}
	if root {
		files = append(files,
			file{"public.bin", 0, 0, 0o644, true},
			file{"group.bin", 0, owner, 0o640, true},
			file{"root-only.bin", 0, 0, 0o600, false},
			file{"other-user.bin", 23456, 23456, 0o640, false},
			file{"group-write-only.bin", 0, owner, 0o620, false},
		)
	}
	// make writes the files into ck through a staging directory on the same file system, so
	// that each has its owner and mode before it appears.
	place := func(t *testing.T, ck string) (readable, unreadable []string) {
		t.Helper()
		staging := t.TempDir()
		for _, f := range files {
			p := filepath.Join(staging, f.name)
			scanWrite(t, p, f.name)
			if root {
				if err := os.Chown(p, int(f.uid), int(f.gid)); err != nil {
					t.Fatal(err)
				}
			}
			if err := os.Chmod(p, f.perm); err != nil {
				t.Fatal(err)
			}
			if err := os.MkdirAll(ck, 0o755); err != nil {
				t.Fatal(err)
			}
			if err := os.Rename(p, filepath.Join(ck, f.name)); err != nil {
				t.Skipf("cannot rename across the two temporary directories: %v", err)
			}
			if f.readable {
				readable = append(readable, filepath.Base(ck)+"/"+f.name)
			} else {
				unreadable = append(unreadable, filepath.Join(ck, f.name))
			}
		}
		slices.Sort(readable)
		return readable, unreadable
	}
	newDir := func(t *testing.T) string {
		t.Helper()
		dir := t.TempDir()
		if root {
			if err := os.Chown(dir, int(owner), int(owner)); err != nil {
				t.Fatal(err)
			}
		}
		return dir
	}

	t.Run("Scan", func(t *testing.T) {
		dir := newDir(t)
		readable, unreadable := place(t, filepath.Join(dir, "step-1"))
		logs := &scanLogs{}
		list, err := Scan(dir, "", "", zerolog.New(logs))
		if err != nil {
			t.Fatal(err)
		}
		got := skipNames(list)
		if want := append([]string{"step-1 complete=false"}, readable...); !slices.Equal(got, want) {
			t.Errorf("Scan() = %v; want %v", got, want)
		}
		skipCheckLines(t, logs, errScanUnreadable, unreadable...)
	})
	t.Run("watcher", func(t *testing.T) {
		dir := newDir(t)
		h, _ := watchStart(t, dir, WatchConfig{})
		ck := filepath.Join(dir, "step-1")
		readable, unreadable := place(t, ck)
		evs := h.barrier()
		if got := skipReady(evs); !slices.Equal(got, readable) || len(evs) != len(readable) {
			t.Errorf("events = %s; want FileReady for %v", watchFormat(evs), readable)
		}
		scanWrite(t, filepath.Join(ck, "_COMPLETE"), "")
		// Not complete while they are there: committed without them, it would be torn.
		evs = h.until("Withheld step-1", func(ev WatchEvent) bool { return ev.Kind == Withheld })
		if len(evs) != 1 || evs[0].Checkpoint != "step-1" || !errors.Is(evs[0].Err, ErrNotStorable) {
			t.Errorf("events = %s (%v); want Withheld step-1, ErrNotStorable", watchFormat(evs), evs[len(evs)-1].Err)
		}
		if rest := h.barrier(); len(rest) != 0 {
			t.Errorf("events after Withheld: %s", watchFormat(rest))
		}
		skipCheckLines(t, h.logs, errScanUnreadable, unreadable...)
		// Made readable (chmod), they are reported, then the checkpoint is complete, without its
		// marker written again.
		for _, p := range unreadable {
			if err := os.Chmod(p, 0o644); err != nil {
				t.Fatal(err)
			}
		}
		evs = h.untilComplete("step-1")
		if got := skipReady(evs); len(got) != len(unreadable) {
			t.Errorf("events = %s; want a FileReady for each of %v, then Complete", watchFormat(evs), unreadable)
		}

		// A file made unreadable after its FileReady is taken back (its chmod is an event).
		if err := os.Chmod(filepath.Join(ck, "own.bin"), 0o200); err != nil {
			t.Fatal(err)
		}
		if got, want := watchFormat(h.barrier()), "[FileGone step-1 own.bin 0]"; got != want {
			t.Errorf("events = %s; want %s", got, want)
		}
	})
}

func TestScanOwnerCanRead(t *testing.T) {
	o := scanOwner{uid: 1000, gid: 2000}
	tests := []struct {
		name     string
		owner    scanOwner
		uid, gid uint32
		perm     fs.FileMode
		want     bool
	}{
		{"root owner reads anything", scanOwner{}, 5, 5, 0, true},
		{"owner bit", o, 1000, 9, 0o400, true},
		{"owner without its bit", o, 1000, 9, 0o200, false},
		{"group bit", o, 9, 2000, 0o040, true},
		{"group bit of another group", o, 9, 9, 0o040, false},
		{"other bit", o, 9, 9, 0o004, true},
		{"owner bit of another user", o, 9, 9, 0o400, false},
		{"nothing", o, 1000, 2000, 0o000, false},
		{"write and execute only", o, 1000, 2000, 0o333, false},
		// As the kernel decides: the owner's bits alone count for the owner, the group's for
		// the group.
		{"owner without its bit, though the others have it", o, 1000, 9, 0o044, false},
		{"group without its bit, though the others have it", o, 9, 2000, 0o404, false},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			if got := tt.owner.canRead(tt.uid, tt.gid, tt.perm); got != tt.want {
				t.Errorf("%+v.canRead(%d, %d, %v) = %v; want %v", tt.owner, tt.uid, tt.gid, tt.perm, got, tt.want)
			}
		})
	}
}

// checkpoint.dir one level above the trainer's checkpoints (Hugging Face's output_dir
// checkpoints/run1 under checkpoint.dir checkpoints): its markers are below the top of run1,
// which never completes, so nothing is ever committed. The watcher says so once per checkpoint
// directory, with the checkpoint.dir to set, whether it finds it at its start or as it is written.
func TestMarkerBelowTheTopIsWarnedOf(t *testing.T) {
	const msg = "a file named like the marker is below the top of a checkpoint directory, which it does not complete: nothing of it is committed; checkpoint.dir looks too high"
	dir := t.TempDir()
	scanWrite(t, filepath.Join(dir, "run1", "checkpoint-100", "model.safetensors"), "w")
	scanWrite(t, filepath.Join(dir, "run1", "checkpoint-100", "_COMPLETE"), "")
	scanWrite(t, filepath.Join(dir, "step-1", "a.bin"), "a") // at the right level: no warning
	scanWrite(t, filepath.Join(dir, "step-1", "_COMPLETE"), "")
	h, evs := watchStart(t, dir, WatchConfig{})
	// Live: a save one level down in another run, and a second one in run1.
	scanWrite(t, filepath.Join(dir, "run2", "checkpoint-5", "deep", "model.safetensors"), "w")
	scanWrite(t, filepath.Join(dir, "run2", "checkpoint-5", "deep", "_COMPLETE"), "")
	scanWrite(t, filepath.Join(dir, "run1", "checkpoint-200", "_COMPLETE"), "")
	evs = append(evs, h.barrier()...)
	for _, ev := range evs {
		if ev.Kind == Complete && ev.Checkpoint != "step-1" {
			t.Errorf("%s complete: %s", ev.Checkpoint, watchFormat([]WatchEvent{ev}))
		}
	}
	lines := h.logs.lines(t, "warn", msg)
	got := map[string]string{}
	for _, l := range lines {
		got[l["checkpoint"].(string)] = l["fix"].(string)
	}
	want := map[string]string{
		"run1": "set checkpoint.dir to " + filepath.Join(dir, "run1") + ", if that is the directory the trainer writes its checkpoint directories into; " +
			"otherwise write _COMPLETE at the top of " + filepath.Join(dir, "run1") + " once all of it is written",
		"run2": "set checkpoint.dir to " + filepath.Join(dir, "run2", "checkpoint-5") + ", if that is the directory the trainer writes its checkpoint directories into; " +
			"otherwise write _COMPLETE at the top of " + filepath.Join(dir, "run2") + " once all of it is written",
	}
	if len(lines) != 2 || got["run1"] != want["run1"] || got["run2"] != want["run2"] {
		t.Errorf("warnings %v; want one for run1 and one for run2: %v", lines, want)
	}
}

// TestFilesInADirectoryTheOwnerCannotEnterAreSkipped: a file the trainer (the owner of the
// checkpoint directory) could not reach, because a directory above it is one it could not enter,
// is one it could not read, whatever its own bits: never reported, and its checkpoint withheld.
// (Found from outside: a root-owned 0644 file in a root trainer's 0700 directory was sent while
// it was written, committed, and restored to the user, readable.)
func TestFilesInADirectoryTheOwnerCannotEnterAreSkipped(t *testing.T) {
	needRoot(t, "for files of another user than the checkpoint directory's owner")
	const owner = 12345
	// place writes step-1 into dir as the h29 trainers did: the owner's a.bin, a 0700 directory
	// of root's with a 0644 file, and a directory of the owner's made 000 after a file was
	// written into it. It returns the paths of the files the owner could not read.
	place := func(t *testing.T, dir string) []string {
		t.Helper()
		ck := filepath.Join(dir, "step-1")
		for _, d := range []string{ck, filepath.Join(ck, "locked")} {
			if err := os.Mkdir(d, 0o755); err != nil {
				t.Fatal(err)
			}
			if err := os.Chown(d, owner, owner); err != nil {
				t.Fatal(err)
			}
		}
		scanWrite(t, filepath.Join(ck, "a.bin"), "the owner's")
		if err := os.Mkdir(filepath.Join(ck, "rootdir"), 0o700); err != nil {
			t.Fatal(err)
		}
		scanWrite(t, filepath.Join(ck, "rootdir", "f.bin"), "root's secret")
		scanWrite(t, filepath.Join(ck, "locked", "h.bin"), "the owner's, locked away")
		if err := os.Chmod(filepath.Join(ck, "locked"), 0); err != nil {
			t.Fatal(err)
		}
		return []string{filepath.Join(ck, "locked"), filepath.Join(ck, "rootdir")}
	}
	newDir := func(t *testing.T) string {
		t.Helper()
		dir := t.TempDir()
		if err := os.Chown(dir, owner, owner); err != nil {
			t.Fatal(err)
		}
		return dir
	}

	t.Run("Scan", func(t *testing.T) {
		dir := newDir(t)
		unreachable := place(t, dir)
		scanWrite(t, filepath.Join(dir, "step-1", "_COMPLETE"), "")
		logs := &scanLogs{}
		list, err := Scan(dir, "", "", zerolog.New(logs))
		if err != nil {
			t.Fatal(err)
		}
		if got, want := skipNames(list), []string{"step-1 complete=false", "step-1/a.bin"}; !slices.Equal(got, want) {
			t.Errorf("Scan() = %v; want %v", got, want)
		}
		skipCheckLines(t, logs, errScanUnreadable, unreachable...)
	})
	t.Run("watcher", func(t *testing.T) {
		dir := newDir(t)
		h, _ := watchStart(t, dir, WatchConfig{})
		place(t, dir)
		if got, want := skipReady(h.barrier()), []string{"step-1/a.bin"}; !slices.Equal(got, want) {
			t.Errorf("FileReady for %v; want only %v", got, want)
		}
		ck := filepath.Join(dir, "step-1")
		scanWrite(t, filepath.Join(ck, "_COMPLETE"), "")
		evs := h.until("Withheld step-1", func(ev WatchEvent) bool { return ev.Kind == Withheld })
		if last := evs[len(evs)-1]; len(evs) != 1 || !errors.Is(last.Err, ErrNotStorable) || !errors.Is(last.Err, errScanUnreadable) {
			t.Errorf("events = %s (%v); want Withheld step-1, the owner could not read it", watchFormat(evs), last.Err)
		}
		// Opened to the owner: the files are reported, and the checkpoint is complete without its
		// marker written again.
		for _, d := range []string{"rootdir", "locked"} {
			if err := os.Chmod(filepath.Join(ck, d), 0o755); err != nil {
				t.Fatal(err)
			}
		}
		evs = h.untilComplete("step-1")
		if got, want := skipReady(evs), []string{"step-1/locked/h.bin", "step-1/rootdir/f.bin"}; !slices.Equal(got, want) {
			t.Errorf("events = %s; want FileReady for %v, then Complete", watchFormat(evs), want)
		}
	})
}
