//go:build !linux

package agent

import "errors"

// errRuntimeDirInUse: another agent holds agent.runtime_dir.
var errRuntimeDirInUse = errors.New("in use by another spotguard agent")

// lockRuntimeDir takes no lock where there is no flock(2) to take it with: spotguard runs on
// Linux.
func lockRuntimeDir(dir string) (release func(), err error) {
	return nil, errors.New("no lock on agent.runtime_dir on this system")
}

// RunningAgentPID returns 0 where there is no lock to tell the running agent by.
func RunningAgentPID(dir string) int { return 0 }
