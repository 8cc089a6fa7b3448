package agent

import (
	"errors"
	"fmt"
	"io"
	"io/fs"
	"os"
	"path/filepath"
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
	if err := checkRuntimeDirPath(dir, euid); err != nil {
		return err
	}
	switch {
	case int(st.Uid) != euid && st.Uid != 0:
		return fmt.Errorf("agent.runtime_dir %s is owned by uid %d, not by the agent's user (uid %d) or root: %w, and the agent trusts its upload journal and notice.json; "+
			"chown it to uid %d, or set agent.runtime_dir to a directory of the agent's own (the default /run/spotguard)", dir, st.Uid, euid, ErrRuntimeDirOpen, euid)
	case fi.Mode().Perm()&0o022 != 0:
		return fmt.Errorf("agent.runtime_dir %s may be written by its group or by others (mode %#o): %w, and the agent trusts its upload journal and notice.json; "+
			"chmod go-w %s, or set agent.runtime_dir to a directory of the agent's own (the default /run/spotguard)", dir, octalMode(fi.Mode()), ErrRuntimeDirOpen, dir)
	}
	return nil
}

// checkRuntimeDirPath returns an error (ErrRuntimeDirOpen) when a directory above dir, or a
// symbolic link on its way, belongs to a user other than euid and root, or a directory above it
// may be written by others without the sticky bit (/tmp's): that user could move dir away and put
// a directory of their own in its place (found from outside: a runtime dir inside another user's
// directory was taken, and the journal written into theirs once they swapped it).
func checkRuntimeDirPath(dir string, euid int) error {
	abs, err := filepath.Abs(dir)
	if err != nil {
		return nil
	}
	for p := abs; ; {
		if fi, err := os.Lstat(p); err == nil {
			if st, ok := fi.Sys().(*syscall.Stat_t); ok {
				link := fi.Mode().Type() == fs.ModeSymlink
				switch {
				case int(st.Uid) != euid && st.Uid != 0:
					what := "a directory above it"
					if link {
						what = "a symbolic link on its path"
					}
					return fmt.Errorf("agent.runtime_dir %s: %s, %s, is owned by uid %d, not by the agent's user (uid %d) or root: %w, and the agent trusts its upload journal and notice.json; "+
						"set agent.runtime_dir to a directory of the agent's own (the default /run/spotguard)", dir, what, p, st.Uid, euid, ErrRuntimeDirOpen)
				case p != abs && !link && fi.Mode().Perm()&0o002 != 0 && fi.Mode()&fs.ModeSticky == 0:
					return fmt.Errorf("agent.runtime_dir %s: the directory above it %s may be written by others without the sticky bit (mode %#o): %w, and the agent trusts its upload journal and notice.json; "+
						"chmod o-w %s, or set agent.runtime_dir to a directory of the agent's own (the default /run/spotguard)", dir, p, octalMode(fi.Mode()), ErrRuntimeDirOpen, p)
				}
			}
		}
		parent := filepath.Dir(p)
		if parent == p {
			return nil
		}
		p = parent
	}
}

// octalMode is m's permission bits with its sticky, setgid and setuid bits, as chmod takes them
// (1777, not 0777, for /tmp's).
func octalMode(m fs.FileMode) fs.FileMode {
	o := m.Perm()
	if m&fs.ModeSticky != 0 {
		o |= 0o1000
	}
	if m&fs.ModeSetgid != 0 {
		o |= 0o2000
	}
	if m&fs.ModeSetuid != 0 {
		o |= 0o4000
	}
	return o
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
