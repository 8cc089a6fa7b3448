package checkpoint

import (
	"io/fs"
	"syscall"
	"time"
)

// fileStat returns what fi.Sys() says about the file, if it is a *syscall.Stat_t.
func fileStat(fi fs.FileInfo) (fileStatT, bool) {
	st, ok := fi.Sys().(*syscall.Stat_t)
	if !ok || st == nil {
		return fileStatT{}, false
	}
	sec, nsec := st.Ctim.Unix()
	return fileStatT{
		dev:   uint64(st.Dev),
		ino:   uint64(st.Ino),
		nlink: uint64(st.Nlink), // uint32 on some architectures
		uid:   st.Uid,
		gid:   st.Gid,
		ctime: time.Unix(sec, nsec),
	}, true
}
