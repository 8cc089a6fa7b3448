package agent

import (
	"errors"
	"fmt"
	"io"
	"io/fs"
	"os"
	"syscall"
)

// ErrRuntimeDirOpen is the error of an agent.runtime_dir another user may write: the agent
// trusts what it finds there (the upload journal tells it which objects of a commit to delete,
// notice.json what it signalled), so it does not start on one.
var ErrRuntimeDirOpen = errors.New("another user may write it")

// CheckRuntimeDirOwner returns an error (ErrRuntimeDirOpen) when the directory fi, at path dir,
// is owned by a user other than the agent's (euid) and root, or may be written by its group or
// the others: that user could forge upload journal lines, which make the agent delete a
// committed checkpoint's objects, or put a FIFO or /dev/zero in place of notice.json (found from
// outside: the root agent deleted committed checkpoints after three forged lines, and hung at
// start on a FIFO). Owners and bits that cannot be read are not judged.
func CheckRuntimeDirOwner(dir string, fi fs.FileInfo, euid int) error {
	st, ok := fi.Sys().(*syscall.Stat_t)
	if !ok {
		return nil
	}
	switch {
	case int(st.Uid) != euid && st.Uid != 0:
		return fmt.Errorf("agent.runtime_dir %s is owned by uid %d, not by the agent's user (uid %d) or root: %w, and the agent trusts its upload journal and notice.json; "+
			"chown it to uid %d, or set agent.runtime_dir to a directory of the agent's own (the default /run/spotguard)", dir, st.Uid, euid, ErrRuntimeDirOpen, euid)
	case fi.Mode().Perm()&0o022 != 0:
		return fmt.Errorf("agent.runtime_dir %s may be written by its group or by others (mode %#o): %w, and the agent trusts its upload journal and notice.json; "+
			"chmod go-w %s, or set agent.runtime_dir to a directory of the agent's own (the default /run/spotguard)", dir, fi.Mode().Perm(), ErrRuntimeDirOpen, dir)
	}
	return nil
}

// maxNoticeFile bounds the notice.json read at start: the agent writes a few KiB.
const maxNoticeFile = 1 << 20

// readStoredNoticeFile reads the notice file at path as the agent left it: a regular file, not through
// a symbolic link, at most maxNoticeFile bytes, and when it was written. A FIFO or a device in its
// place (/dev/zero) is refused, not read: the agent hung at start on one, or read without end.
func readStoredNoticeFile(path string) ([]byte, fs.FileInfo, error) {
	f, err := os.OpenFile(path, os.O_RDONLY|syscall.O_NOFOLLOW|syscall.O_NONBLOCK, 0)
	if err != nil {
		return nil, nil, err
	}
	defer f.Close()
	fi, err := f.Stat()
	if err != nil {
		return nil, nil, err
	}
	if !fi.Mode().IsRegular() {
		return nil, nil, fmt.Errorf("%s is not a regular file (%s)", path, fi.Mode().Type())
	}
	data, err := io.ReadAll(io.LimitReader(f, maxNoticeFile+1))
	if err != nil {
		return nil, nil, err
	}
	if len(data) > maxNoticeFile {
		return nil, nil, fmt.Errorf("%s is over %d bytes: not one the agent wrote", path, maxNoticeFile)
	}
	return data, fi, nil
}
