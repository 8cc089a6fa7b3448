//go:build linux

package main

import (
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/spotguard/spotguard/agent"
	"golang.org/x/sys/unix"
)

// doctor's agent.runtime_dir check of a full directory.
func TestDoctorRuntimeDirFull(t *testing.T) {
	if os.Geteuid() != 0 {
		t.Skip("needs root, to mount a small tmpfs")
	}
	// Full (a tmpfs filled by something else): writable, and nothing fits. Before, PASS, and
	// notice.json failed at the notice (found from outside).
	full := filepath.Join(t.TempDir(), "full")
	os.Mkdir(full, 0o755)
	if err := unix.Mount("tmpfs", full, "tmpfs", 0, "size=64k"); err != nil {
		t.Fatalf("mount a tmpfs as root: %v", err)
	}
	defer unix.Unmount(full, unix.MNT_DETACH)
	f, err := os.Create(filepath.Join(full, "fill"))
	if err != nil {
		t.Fatal(err)
	}
	for _, werr := f.Write(make([]byte, 4096)); werr == nil; _, werr = f.Write(make([]byte, 4096)) {
	}
	f.Close()
	var rep doctorReport
	cfg := &agent.Config{}
	cfg.Agent.RuntimeDir = full
	doctorRuntimeDir(&rep, cfg)
	if len(rep.Checks) != 1 || rep.Checks[0].Status != doctorFail || !strings.Contains(rep.Checks[0].Detail, "is full (0 bytes") {
		t.Errorf("doctorRuntimeDir of a full directory = %+v; want FAIL, full", rep.Checks)
	}
}
