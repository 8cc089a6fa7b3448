package checkpoint

import (
	"io/fs"
	"time"
)

// FileID identifies one version of a file as Lstat (or Stat of an open file) saw it: which file
// (device and inode) and its size, modification time and status-change time (ctime, which a
// writer cannot set back), link count and permission bits.
//
// Size and modification time alone do not tell two versions of a file apart: a writer can
// rewrite a file with the same size and set its modification time back (os.Chtimes), or
// rename another file with the same size and time over it. The inode tells the second case
// apart and the change time the first: any write, chmod, chown, link or rename moves the
// change time forward, and nothing but the clock sets it. This is how the watcher keeps
// invariant I2's "change detection does not trust size + mtime alone".
type FileID struct {
	Dev, Ino   uint64
	Size       int64
	ModTime    time.Time
	ChangeTime time.Time
	Nlink      uint64
	Perm       fs.FileMode // permission bits only (fi.Mode().Perm())
}

// FileIDOf returns the FileID of fi. Device, inode, change time and link count come from
// fi.Sys(), a *syscall.Stat_t on Linux; for a FileInfo without one (another system, a fake)
// they are zero, and such a FileID is never the same as anything (see Same).
func FileIDOf(fi fs.FileInfo) FileID {
	id := FileID{Size: fi.Size(), ModTime: fi.ModTime(), Perm: fi.Mode().Perm()}
	if st, ok := fileStat(fi); ok {
		id.Dev, id.Ino, id.Nlink, id.ChangeTime = st.dev, st.ino, st.nlink, st.ctime
	}
	return id
}

// Same reports whether a and b are the same version of the same file: equal device, inode,
// size, modification time and change time. A zero FileID is never the same as anything, and
// neither is one without a device and inode (see FileIDOf). Link count and permission bits
// are not compared: changing them moves the change time.
func (a FileID) Same(b FileID) bool {
	if !a.known() || !b.known() {
		return false
	}
	return a.Dev == b.Dev && a.Ino == b.Ino && a.Size == b.Size &&
		a.ModTime.Equal(b.ModTime) && a.ChangeTime.Equal(b.ChangeTime)
}

// sameContent reports whether a and b are the same file (device and inode) with the same size
// and modification time: its bytes as they were, whatever its change time says (a chmod or
// chown -R moves it, and no byte). Unlike Same, it does not ask whether they are known.
func (a FileID) sameContent(b FileID) bool {
	return a.Dev == b.Dev && a.Ino == b.Ino && a.Size == b.Size && a.ModTime.Equal(b.ModTime)
}

// known reports whether a says which file it is.
func (a FileID) known() bool { return a.Dev != 0 || a.Ino != 0 }

// isZero reports whether a is the zero FileID.
func (a FileID) isZero() bool { return a == FileID{} }

// fileStatT is what FileIDOf and the readability check need from fi.Sys().
type fileStatT struct {
	dev, ino, nlink uint64
	uid, gid        uint32
	ctime           time.Time
}
