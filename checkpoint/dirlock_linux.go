//go:build linux

package checkpoint

import (
	"bufio"
	"errors"
	"fmt"
	"os"
	"strconv"
	"strings"
	"syscall"

	"golang.org/x/sys/unix"
)

// LockDir takes an exclusive flock(2) on the directory dir, without waiting, and returns the
// function that releases it. It returns an error wrapping ErrDirInUse, naming the holder where
// /proc/locks shows it, when another open of the directory holds the lock (another agent
// watching it), and another error when the lock cannot be taken on this file system (NFS and EFS
// lock only files opened for writing; Lustre mounted without flock has none): the caller then
// goes on without it.
func LockDir(dir string) (release func(), err error) {
	f, err := os.OpenFile(dir, os.O_RDONLY|syscall.O_DIRECTORY|syscall.O_CLOEXEC, 0)
	if err != nil {
		return nil, err
	}
	return lockOpenDir(f, dir)
}

// lockOpenDir is LockDir on f, the directory dir already open (a Watcher's os.Root on it, so that
// the lock is on the directory watched even if dir's path is changed meanwhile). It takes f: the
// release closes it, and so does a failure.
func lockOpenDir(f *os.File, dir string) (release func(), err error) {
	for {
		err = syscall.Flock(int(f.Fd()), syscall.LOCK_EX|syscall.LOCK_NB)
		if !errors.Is(err, syscall.EINTR) {
			break
		}
	}
	if errors.Is(err, syscall.EWOULDBLOCK) {
		holder := "another process"
		if fi, serr := f.Stat(); serr == nil {
			if st, ok := fi.Sys().(*syscall.Stat_t); ok {
				if pid := flockHolder(uint64(st.Dev), st.Ino); pid > 0 {
					holder = "PID " + strconv.Itoa(pid)
				}
			}
		}
		f.Close()
		return nil, fmt.Errorf("%s: %w (%s)", dir, ErrDirInUse, holder)
	}
	if err != nil {
		f.Close()
		return nil, fmt.Errorf("lock %s: %w", dir, err)
	}
	return func() { _ = f.Close() }, nil // closing the directory releases the lock
}

// flockHolder returns the PID /proc/locks gives for the flock(2) on the file dev:ino, or 0.
func flockHolder(dev, ino uint64) int {
	f, err := os.Open("/proc/locks")
	if err != nil {
		return 0
	}
	defer f.Close()
	want := fmt.Sprintf("%02x:%02x:%d", unix.Major(dev), unix.Minor(dev), ino)
	sc := bufio.NewScanner(f)
	for sc.Scan() {
		// 1: FLOCK  ADVISORY  WRITE 3119 fd:01:1234567 0 EOF
		fields := strings.Fields(sc.Text())
		if len(fields) >= 6 && fields[1] == "FLOCK" && fields[5] == want {
			if pid, err := strconv.Atoi(fields[4]); err == nil {
				return pid
			}
		}
	}
	return 0
}
