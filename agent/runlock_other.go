//go:build !linux

package agent

import "errors"

// errRuntimeDirInUse: another agent holds agent.runtime_dir.
var errRuntimeDirInUse = errors.New("in use by another spotguard agent")

// runLock is the lock on agent.runtime_dir: none on this system.
type runLock struct{ path string }

// lockRuntimeDir takes no lock where there is no flock(2) to take it with: spotguard runs on
// Linux.
func lockRuntimeDir(dir string) (*runLock, error) {
	return nil, errors.New("no lock on agent.runtime_dir on this system")
}

func (l *runLock) release() {}

func (l *runLock) check() (retaken bool, err error) { return false, nil }

// RunningAgentPID returns 0 where there is no lock to tell the running agent by.
func RunningAgentPID(dir string) int { return 0 }
