//go:build linux

package agent

import (
	"bytes"
	"errors"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"strconv"
	"syscall"
)

// runLockName is the lock file in agent.runtime_dir that one running agent holds.
const runLockName = "agent.lock"

// errRuntimeDirInUse: another agent holds agent.runtime_dir.
var errRuntimeDirInUse = errors.New("in use by another spotguard agent")

// lockRuntimeDir takes an exclusive flock(2) on dir's lock file and writes this process's PID in
// it, so that no second agent shares dir: it would remove the notice.json the first one wrote
// for its trainer and resume the first one's commits from the journal while it still writes
// them. It returns the function that releases the lock, an error wrapping errRuntimeDirInUse
// (naming the holder's PID) when another process holds it, or another error when the lock
// cannot be taken (the directory cannot be written, or its file system has no flock): the
// caller then runs without it.
func lockRuntimeDir(dir string) (release func(), err error) {
	path := filepath.Join(dir, runLockName)
	f, err := os.OpenFile(path, os.O_RDWR|os.O_CREATE|syscall.O_NOFOLLOW|syscall.O_CLOEXEC, 0o644)
	if err != nil {
		return nil, fmt.Errorf("lock %s: %w", path, err)
	}
	for {
		err = syscall.Flock(int(f.Fd()), syscall.LOCK_EX|syscall.LOCK_NB)
		if !errors.Is(err, syscall.EINTR) {
			break
		}
	}
	if errors.Is(err, syscall.EWOULDBLOCK) {
		holder := "a process that did not write its PID"
		if b, rerr := os.ReadFile(path); rerr == nil {
			if pid, perr := strconv.Atoi(string(bytes.TrimSpace(b))); perr == nil && pid > 0 {
				holder = "PID " + strconv.Itoa(pid)
			}
		}
		f.Close()
		return nil, fmt.Errorf("agent.runtime_dir %s is %w (%s, holding %s): two agents there would overwrite each other's notice.json and journal; stop it, or give each agent its own agent.runtime_dir (and http.listen)",
			dir, errRuntimeDirInUse, holder, path)
	}
	if err != nil {
		f.Close()
		return nil, fmt.Errorf("lock %s: %w", path, err)
	}
	if err := f.Truncate(0); err == nil {
		_, _ = f.WriteAt([]byte(strconv.Itoa(os.Getpid())+"\n"), 0)
	}
	return func() { _ = f.Close() }, nil // closing the file releases the lock
}

// RunningAgentPID returns the PID of the agent that holds agent.runtime_dir dir now (its lock
// taken, its PID in it), or 0: none, or one that cannot be told. spotguard doctor leaves it out of
// the trainer processes, as the agent leaves itself out.
func RunningAgentPID(dir string) int {
	path := filepath.Join(dir, runLockName)
	f, err := os.OpenFile(path, os.O_RDONLY|syscall.O_NOFOLLOW|syscall.O_CLOEXEC, 0)
	if err != nil {
		return 0
	}
	defer f.Close()
	if err := syscall.Flock(int(f.Fd()), syscall.LOCK_SH|syscall.LOCK_NB); err == nil {
		_ = syscall.Flock(int(f.Fd()), syscall.LOCK_UN)
		return 0 // not held: the PID in it is an earlier agent's, and may be anyone's now
	} else if !errors.Is(err, syscall.EWOULDBLOCK) {
		return 0
	}
	b, err := io.ReadAll(io.LimitReader(f, 32))
	if err != nil {
		return 0
	}
	pid, err := strconv.Atoi(string(bytes.TrimSpace(b)))
	if err != nil || pid <= 0 {
		return 0
	}
	return pid
}
