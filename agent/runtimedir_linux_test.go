//go:build linux

package agent

import (
	"errors"
	"os"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

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
	if err := unix.Mount("tmpfs", dir, "tmpfs", 0, "size=64k"); err != nil {
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
