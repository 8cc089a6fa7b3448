//go:build linux

package checkpoint

import (
	"errors"
	"os"
	"syscall"

	"github.com/rs/zerolog"
)

// restoreLockStaging takes an exclusive flock(2) on the staging directory name in to, which this
// restore has just created, and returns the function that releases it (by closing the handle
// that holds it). The lock is what tells another restore, in any PID namespace, that the
// directory is in use (restoreLockStale). It returns errRestoreStagingTaken when another restore
// holds the lock or has removed the directory since it was made (it took it for a killed
// restore's before this one locked it): the caller makes another. Where the file system has no
// flock (some network file systems), the directory stays unlocked, with a warning, and release
// only closes the handle.
func restoreLockStaging(to *os.Root, name string, log zerolog.Logger) (release func(), err error) {
	f, err := to.OpenFile(name, os.O_RDONLY|syscall.O_DIRECTORY|syscall.O_NOFOLLOW, 0)
	if errors.Is(err, os.ErrNotExist) {
		return nil, errRestoreStagingTaken
	}
	if err != nil {
		return nil, err
	}
	release = func() { _ = f.Close() } // a directory handle: closing it releases the lock
	switch err := restoreFlock(f, syscall.LOCK_EX|syscall.LOCK_NB); {
	case errors.Is(err, syscall.EWOULDBLOCK):
		release()
		return nil, errRestoreStagingTaken
	case err != nil:
		log.Warn().Err(err).Str("dir", f.Name()).
			Msg("cannot lock the staging directory; a restore in another PID namespace could take it for a killed restore's")
		return release, nil
	}
	// Still the directory at name: another restore may have locked, removed and unlocked it
	// between the mkdir and the lock.
	held, err := f.Stat()
	if err != nil {
		release()
		return nil, err
	}
	if now, err := to.Lstat(name); err != nil || !os.SameFile(held, now) {
		release()
		return nil, errRestoreStagingTaken
	}
	return release, nil
}

// restoreLockStale tries to lock the staging directory name in to (restoreStagingPID matched it)
// without waiting, to tell whether a restore still works in it. It returns:
//   - a release function, restoreStaleFree: nothing holds it (its restore was killed); the caller
//     removes it and then releases the lock;
//   - nil, restoreStaleHeld: a running restore, in any PID namespace, holds it;
//   - nil, restoreStaleUnknown: it cannot be locked here (no flock on this file system, or it
//     cannot be opened); the caller falls back on the pid in its name.
func restoreLockStale(to *os.Root, name string) (func(), restoreStaleState) {
	f, err := to.OpenFile(name, os.O_RDONLY|syscall.O_DIRECTORY|syscall.O_NOFOLLOW, 0)
	if err != nil {
		return nil, restoreStaleUnknown
	}
	switch err := restoreFlock(f, syscall.LOCK_EX|syscall.LOCK_NB); {
	case errors.Is(err, syscall.EWOULDBLOCK):
		_ = f.Close()
		return nil, restoreStaleHeld
	case err != nil:
		_ = f.Close()
		return nil, restoreStaleUnknown
	}
	return func() { _ = f.Close() }, restoreStaleFree
}

// restoreFlock applies flock(2) how to f's descriptor, retrying when a signal interrupts it.
func restoreFlock(f *os.File, how int) error {
	rc, err := f.SyscallConn()
	if err != nil {
		return err
	}
	var ferr error
	if err := rc.Control(func(fd uintptr) {
		for {
			ferr = syscall.Flock(int(fd), how)
			if ferr != syscall.EINTR {
				return
			}
		}
	}); err != nil {
		return err
	}
	return ferr
}
