//go:build linux

package main

import (
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

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
	if err := unix.Mount("tmpfs", full, "tmpfs", 0, "size=64k,mode=0755"); err != nil {
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
	doctorRuntimeDir(&rep, cfg, true)
	if len(rep.Checks) != 1 || rep.Checks[0].Status != doctorFail || !strings.Contains(rep.Checks[0].Detail, "is full (0 bytes") {
		t.Errorf("doctorRuntimeDir of a full directory = %+v; want FAIL, full", rep.Checks)
	}
}

// doctor's agent.runtime_dir check of a read-only file system (the unit's sandbox, a read-only
// mount) names ReadWritePaths=, not free space and permissions (found from outside); and of
// /proc, which is not "full" but holds no files.
func TestDoctorRuntimeDirReadOnly(t *testing.T) {
	var rep doctorReport
	cfg := &agent.Config{}
	cfg.Agent.RuntimeDir = "/proc/spotguard"
	doctorRuntimeDir(&rep, cfg, true)
	if len(rep.Checks) != 1 || rep.Checks[0].Status != doctorFail || strings.Contains(rep.Checks[0].Detail, "full") ||
		!strings.Contains(rep.Checks[0].Detail, "holds no files of its own") {
		t.Errorf("doctorRuntimeDir(/proc/spotguard) = %+v; want FAIL, holding no files, not full", rep.Checks)
	}
	if os.Geteuid() != 0 {
		t.Skip("needs root, to mount a read-only tmpfs")
	}
	ro := filepath.Join(t.TempDir(), "ro")
	os.Mkdir(ro, 0o755)
	if err := unix.Mount("tmpfs", ro, "tmpfs", unix.MS_RDONLY, "size=64k,mode=0755"); err != nil {
		t.Fatalf("mount a read-only tmpfs as root: %v", err)
	}
	defer unix.Unmount(ro, unix.MNT_DETACH)
	rep = doctorReport{}
	cfg.Agent.RuntimeDir = filepath.Join(ro, "run")
	doctorRuntimeDir(&rep, cfg, true)
	if len(rep.Checks) != 1 || rep.Checks[0].Status != doctorFail || !strings.Contains(rep.Checks[0].Fix, "ReadWritePaths=") ||
		!strings.Contains(rep.Checks[0].Detail, "read-only file system") {
		t.Errorf("doctorRuntimeDir on a read-only file system = %+v; want FAIL, its fix naming ReadWritePaths=", rep.Checks)
	}
}

// A checkpoint.dir that is itself a mount point: at a boot where a script mounts the disk late,
// the restore wrote onto the root volume under it and the mount hid the checkpoint (found from
// outside: the trainer started from scratch, and retention then deleted the job's progress).
// doctor warns, and restore says so as it restores there; a directory below it is fine.
func TestCheckpointDirThatIsAMountPointIsWarnedOf(t *testing.T) {
	if os.Geteuid() != 0 {
		t.Skip("needs root, to mount a tmpfs")
	}
	mnt := filepath.Join(t.TempDir(), "nvme")
	os.Mkdir(mnt, 0o755)
	if err := unix.Mount("tmpfs", mnt, "tmpfs", 0, "size=1m"); err != nil {
		t.Fatalf("mount a tmpfs as root: %v", err)
	}
	defer unix.Unmount(mnt, unix.MNT_DETACH)
	below := filepath.Join(mnt, "checkpoints")
	os.Mkdir(below, 0o755)
	for _, tc := range []struct {
		dir  string
		want string
	}{{mnt, doctorWarn}, {below, doctorPass}} {
		var rep doctorReport
		cfg := &agent.Config{}
		cfg.Checkpoint.Dir, cfg.Checkpoint.Marker = tc.dir, "_COMPLETE"
		doctorCheckpointDir(&rep, cfg)
		if len(rep.Checks) != 1 || rep.Checks[0].Status != tc.want ||
			(tc.want == doctorWarn && (!strings.Contains(rep.Checks[0].Detail, "is itself a mount point") || !strings.Contains(rep.Checks[0].Fix, below))) {
			t.Errorf("doctor's checkpoint.dir %s = %+v; want %v", tc.dir, rep.Checks, tc.want)
		}
	}
	store := t.TempDir()
	env := []string{"SPOTGUARD_STORE_URL=file://" + store, "SPOTGUARD_STORE_JOB=j"}
	for _, tc := range []struct {
		to   string
		warn bool
	}{{mnt, true}, {below, false}} {
		_, _, stderr := runCLI(t, t.Context(), env, "restore", "--allow-empty", "--no-create", "--to", tc.to)
		if got := strings.Contains(stderr, "warning: --to "+mnt+" is itself a mount point"); got != tc.warn {
			t.Errorf("restore --to %s: warned %v; want %v:\n%s", tc.to, got, tc.warn, stderr)
		}
	}
}

// The running agent is no trainer for doctor either: a pidfile that holds its PID, or a
// trainer.match that matches its command line, had doctor PASS with the agent as the trainer,
// while the agent, which leaves itself out, would signal no one (found from outside).
func TestDoctorLeavesTheRunningAgentOut(t *testing.T) {
	runtime := t.TempDir()
	ready := filepath.Join(t.TempDir(), "ready")
	// Stands in for the agent: it holds agent.lock with its PID in it, and catches SIGUSR1.
	a := exec.Command("python3", "-c", `import fcntl, os, signal, sys, time
signal.signal(signal.SIGUSR1, lambda *a: None)
f = open(sys.argv[1], "w")
fcntl.flock(f, fcntl.LOCK_EX)
f.write(str(os.getpid()) + "\n")
f.flush()
open(sys.argv[2], "w").close()
time.sleep(60)
`, filepath.Join(runtime, "agent.lock"), ready, "sgdoctor-agent-"+filepath.Base(runtime))
	if err := a.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { a.Process.Kill(); a.Wait() })
	for deadline := time.Now().Add(10 * time.Second); ; {
		if _, err := os.Stat(ready); err == nil {
			break
		}
		if time.Now().After(deadline) {
			t.Fatal("the stand-in agent did not start")
		}
		<-time.After(10 * time.Millisecond)
	}
	pidfile := filepath.Join(t.TempDir(), "trainer.pid")
	os.WriteFile(pidfile, []byte(strconv.Itoa(a.Process.Pid)+"\n"), 0o644)
	for _, tc := range []struct{ name, want string }{{"pidfile", "which is the running spotguard agent"}, {"match", "no running process has a command line that matches"}} {
		cfg := &agent.Config{}
		cfg.Agent.RuntimeDir = runtime
		cfg.Trainer.Signal = syscall.SIGUSR1
		if tc.name == "pidfile" {
			cfg.Trainer.PIDFile = pidfile
		} else {
			cfg.Trainer.Match = regexp.MustCompile("sgdoctor-agent-" + filepath.Base(runtime))
		}
		var rep doctorReport
		doctorTrainer(&rep, cfg, doctorDeps{})
		if len(rep.Checks) != 1 || rep.Checks[0].Status != doctorWarn || !strings.Contains(rep.Checks[0].Detail, tc.want) {
			t.Errorf("doctor's trainer check with the running agent's PID by %s = %+v; want WARN, %q", tc.name, rep.Checks, tc.want)
		}
	}
}

// doctor FAILs on an agent.runtime_dir another user may write, as the agent does not start on
// one (the upload journal there says which objects to delete).
func TestDoctorRuntimeDirOthersMayWrite(t *testing.T) {
	dir := filepath.Join(t.TempDir(), "run")
	if err := os.Mkdir(dir, 0o755); err != nil {
		t.Fatal(err)
	}
	if err := os.Chmod(dir, 0o777); err != nil {
		t.Fatal(err)
	}
	var rep doctorReport
	cfg := &agent.Config{}
	cfg.Agent.RuntimeDir = dir
	doctorRuntimeDir(&rep, cfg, true)
	if len(rep.Checks) != 1 || rep.Checks[0].Status != doctorFail || !strings.Contains(rep.Checks[0].Detail, "may be written by its group or by others") ||
		!strings.Contains(rep.Checks[0].Detail, "the agent does not start on it") {
		t.Errorf("doctorRuntimeDir of a 0777 directory = %+v; want FAIL, others may write it", rep.Checks)
	}
}
