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

// runLock is the lock on agent.runtime_dir a running agent holds (lockRuntimeDir).
type runLock struct {
	dir, path string
	f         *os.File
}

// lockRuntimeDir takes an exclusive flock(2) on dir's lock file and writes this process's PID in
// it, so that no second agent shares dir: it would remove the notice.json the first one wrote
// for its trainer and resume the first one's commits from the journal while it still writes
// them. It returns the lock (its release lets it go), an error wrapping errRuntimeDirInUse
// (naming the holder's PID) when another process holds it, or another error when the lock
// cannot be taken (the directory cannot be written, or its file system has no flock): the
// caller then runs without it.
func lockRuntimeDir(dir string) (*runLock, error) {
	path := filepath.Join(dir, runLockName)
	f, err := takeLock(dir, path)
	if err != nil {
		return nil, err
	}
	return &runLock{dir: dir, path: path, f: f}, nil
}

// takeLock opens (or creates) the lock file at path and takes its lock, as lockRuntimeDir says.
func takeLock(dir, path string) (*os.File, error) {
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
	return f, nil
}

// release lets the lock go (closing the file releases it).
func (l *runLock) release() { _ = l.f.Close() }

// check makes sure the lock file at its path is still the one held: agent.runtime_dir removed
// under the agent (rm -r /run/spotguard) took the lock file with it, and a second agent then
// started there and ran beside this one (found from outside). One gone or replaced is taken
// again: retaken is true then. err wraps errRuntimeDirInUse when another agent holds the new
// one; it is another error when it cannot be taken (the directory gone for good): then it is
// tried again at the next check.
func (l *runLock) check() (retaken bool, err error) {
	held, err := l.f.Stat()
	if err != nil {
		return false, err
	}
	if now, err := os.Lstat(l.path); err == nil && os.SameFile(held, now) {
		return false, nil
	}
	_ = os.MkdirAll(l.dir, 0o755)
	f, err := takeLock(l.dir, l.path)
	if err != nil {
		return false, err
	}
	_ = l.f.Close()
	l.f = f
	return true, nil
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
