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
