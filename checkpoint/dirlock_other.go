//go:build !linux

package checkpoint

import (
	"errors"
	"os"
)

// LockDir takes no lock where there is no flock(2) to take it with: spotguard runs on Linux.
func LockDir(dir string) (release func(), err error) {
	return nil, errors.New("no lock on the checkpoint directory on this system")
}

// lockOpenDir is LockDir on f, which it closes.
func lockOpenDir(f *os.File, dir string) (release func(), err error) {
	_ = f.Close()
	return LockDir(dir)
}
