//go:build linux

package agent

import (
	"context"
	"errors"
	"os"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/rs/zerolog"
	"golang.org/x/sys/unix"
)

// agent.runtime_dir full (a tmpfs filled by something else): the probe created an empty file,
// which a full tmpfs takes, and said it was writable; notice.json then failed at the notice
// (found from outside). The probe writes a page, so a full directory is a /healthz warning, at
// start or found by the periodic probe, and the warning goes once there is room again.
func TestRuntimeDirFullIsAHealthWarning(t *testing.T) {
	if os.Geteuid() != 0 {
		t.Skip("needs root, to mount a small tmpfs as agent.runtime_dir")
	}
	dir := t.TempDir()
	if err := unix.Mount("tmpfs", dir, "tmpfs", 0, "size=64k,mode=0755"); err != nil {
		t.Fatalf("mount a tmpfs as root: %v", err)
	}
	t.Cleanup(func() { _ = unix.Unmount(dir, unix.MNT_DETACH) })
	ta := startAgent(t, "SPOTGUARD_TRAINER_MATCH=no-such-trainer", "SPOTGUARD_AGENT_RUNTIME_DIR="+dir)
	warned := func() bool {
		return strings.Contains(strings.Join(ta.a.health(time.Now()).Warnings, " "), "agent.runtime_dir "+dir+" cannot be written")
	}
	if warned() {
		t.Fatalf("warning with room in agent.runtime_dir: %v", ta.a.health(time.Now()).Warnings)
	}
	fill := filepath.Join(dir, "fill")
	f, err := os.Create(fill)
	if err != nil {
		t.Fatal(err)
	}
	for {
		if _, err := f.Write(make([]byte, 4096)); err != nil {
			if !errors.Is(err, syscall.ENOSPC) {
				t.Fatal(err)
			}
			break
		}
	}
	f.Close()
	ta.a.probeRuntimeDir()
	if !warned() || !strings.Contains(strings.Join(ta.a.health(time.Now()).Warnings, " "), "no space left") {
		t.Errorf("health with agent.runtime_dir full = %+v; want a warning that it cannot be written, saying why", ta.a.health(time.Now()))
	}
	if err := os.Remove(fill); err != nil {
		t.Fatal(err)
	}
	ta.a.probeRuntimeDir()
	if warned() {
		t.Errorf("warning after room was made again: %v", ta.a.health(time.Now()).Warnings)
	}
}

// agent.runtime_dir removed under a running agent took its lock file with it, and a second agent
// then started there and ran beside the first (found from outside). The lock is taken again when
// its file goes; one another agent took meanwhile is a /healthz reason until this one holds it.
func TestRunLockRemovedUnderTheAgentIsTakenAgain(t *testing.T) {
	dir := filepath.Join(t.TempDir(), "run")
	if err := os.Mkdir(dir, 0o755); err != nil {
		t.Fatal(err)
	}
	l, err := lockRuntimeDir(dir)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(l.release)
	if retaken, err := l.check(); retaken || err != nil {
		t.Fatalf("check() of a lock in place = %v, %v; want nothing done", retaken, err)
	}
	if err := os.RemoveAll(dir); err != nil {
		t.Fatal(err)
	}
	if retaken, err := l.check(); !retaken || err != nil {
		t.Fatalf("check() after agent.runtime_dir was removed = %v, %v; want the lock taken again", retaken, err)
	}
	if _, err := lockRuntimeDir(dir); !errors.Is(err, errRuntimeDirInUse) {
		t.Errorf("a second agent's lock after the first took its lock again = %v; want it refused", err)
	}

	// Another agent takes the directory before this one looks.
	a := newIdleAgent(t)
	a.runLock = l
	if err := os.RemoveAll(dir); err != nil {
		t.Fatal(err)
	}
	if err := os.Mkdir(dir, 0o755); err != nil {
		t.Fatal(err)
	}
	other, err := lockRuntimeDir(dir)
	if err != nil {
		t.Fatal(err)
	}
	a.checkRunLock()
	if v := a.health(time.Now()); v.Healthy || !strings.Contains(strings.Join(v.Reasons, " "), "another agent holds agent.runtime_dir now") {
		t.Errorf("health with another agent holding agent.runtime_dir = %+v; want unhealthy, saying so", v)
	}
	other.release()
	a.checkRunLock()
	if v := a.health(time.Now()); strings.Contains(strings.Join(v.Reasons, " "), "another agent holds") {
		t.Errorf("health once this agent holds the lock again = %+v; want the reason gone", v)
	}
}

// The agent does not start on an agent.runtime_dir another user may write: the upload journal
// there says which objects of a commit to delete, and notice.json what was signalled (found
// from outside: three forged journal lines made the root agent delete committed checkpoints, and
// a FIFO as notice.json hung it at start). Nothing is written there then; one of its own starts.
func TestAgentRefusesARuntimeDirAnotherUserMayWrite(t *testing.T) {
	for _, tc := range []struct {
		name string
		set  func(t *testing.T, dir string)
		want string
	}{
		{"writable by others", func(t *testing.T, dir string) { chmod(t, dir, 0o777) }, "may be written by its group or by others (mode 0777)"},
		{"writable by its group", func(t *testing.T, dir string) { chmod(t, dir, 0o775) }, "chmod go-w " + "DIR"},
		{"writable by all, sticky", func(t *testing.T, dir string) { chmod(t, dir, os.ModeSticky|0o777) }, "(mode 01777)"},
		// What is above it too (found from outside: another user moved it away and put their
		// own in its place).
		{"in a directory others may write", func(t *testing.T, dir string) { chmod(t, filepath.Dir(dir), 0o777) }, "may be written by others without the sticky bit"},
		{"in another user's directory", func(t *testing.T, dir string) {
			if os.Geteuid() != 0 {
				t.Skip("needs root, to give the directory to another user")
			}
			if err := os.Chown(filepath.Dir(dir), 12345, 12345); err != nil {
				t.Fatal(err)
			}
		}, "a directory above it"},
		{"another user's", func(t *testing.T, dir string) {
			if os.Geteuid() != 0 {
				t.Skip("needs root, to give the directory to another user")
			}
			if err := os.Chown(dir, 12345, 12345); err != nil {
				t.Fatal(err)
			}
		}, "is owned by uid 12345, not by the agent's user"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			dir := filepath.Join(t.TempDir(), "run")
			if err := os.Mkdir(dir, 0o755); err != nil {
				t.Fatal(err)
			}
			tc.set(t, dir)
			cfg := mustLoad(t, LoadOptions{Environ: []string{"SPOTGUARD_HTTP_LISTEN=", "SPOTGUARD_AGENT_RUNTIME_DIR=" + dir,
				"SPOTGUARD_METRICS_CLOUDWATCH=false", "SPOTGUARD_TRAINER_MATCH=no-such-trainer"}})
			a, err := New(cfg, Deps{Logger: zerolog.Nop(), IMDS: newFakeIMDS()})
			if err != nil {
				t.Fatal(err)
			}
			ctx, cancel := context.WithTimeout(t.Context(), 10*time.Second) // not refused: it would run on
			defer cancel()
			err = a.Run(ctx)
			want := strings.ReplaceAll(tc.want, "DIR", dir)
			if !errors.Is(err, ErrRuntimeDirOpen) || !strings.Contains(err.Error(), want) {
				t.Fatalf("Run() on %s = %v; want it refused, saying %q", tc.name, err, want)
			}
			if names, _ := os.ReadDir(dir); len(names) != 0 {
				t.Errorf("Run() refused wrote %d files in %s; want none", len(names), dir)
			}
		})
	}
}

func chmod(t *testing.T, path string, mode os.FileMode) {
	t.Helper()
	if err := os.Chmod(path, mode); err != nil {
		t.Fatal(err)
	}
}

// notice.json is read at start only as the regular file the agent wrote: a FIFO in its place hung
// the agent at start, /dev/zero made it read without end (2.1 GB in 65 s), and a link was read
// through (found from outside). Each is said and left unread; the agent starts as without one.
func TestNoticeFileThatIsNoRegularFileIsNotRead(t *testing.T) {
	target := filepath.Join(t.TempDir(), "secret")
	if err := os.WriteFile(target, []byte(`{"active":[]}`), 0o600); err != nil {
		t.Fatal(err)
	}
	for _, tc := range []struct {
		name string
		make func(path string) error
	}{
		{"FIFO", func(p string) error { return unix.Mkfifo(p, 0o644) }},
		{"link to /dev/zero", func(p string) error { return os.Symlink("/dev/zero", p) }},
		{"link to a file", func(p string) error { return os.Symlink(target, p) }},
		{"over 1 MiB", func(p string) error { return os.WriteFile(p, make([]byte, maxNoticeFile+1), 0o644) }},
	} {
		t.Run(tc.name, func(t *testing.T) {
			dir := t.TempDir()
			if err := tc.make(filepath.Join(dir, NoticeFile)); err != nil {
				t.Fatal(err)
			}
			logs := &syncBuffer{}
			done := make(chan struct{})
			go func() {
				defer close(done)
				previous, seen, jobs, carried := readPrevious(dir, zerolog.New(logs))
				if previous != nil || seen != nil || jobs != nil || carried != nil {
					t.Errorf("readPrevious of a %s = %v %v %v %v; want nothing", tc.name, previous, seen, jobs, carried)
				}
			}()
			select {
			case <-done:
			case <-time.After(10 * time.Second):
				t.Fatalf("readPrevious of a %s still reading after 10 s", tc.name)
			}
			if !strings.Contains(logs.String(), "cannot be read") {
				t.Errorf("log %q; want it to say the notice file cannot be read", logs.String())
			}
		})
	}
}
