package main

import (
	"context"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"os"
	"path/filepath"
	"strings"
	"syscall"

	"golang.org/x/sys/unix"

	"github.com/spotguard/spotguard/checkpoint"
)

// restoreSource is the store a restore reads, with every error a call of the store returns marked
// as the store's (storeFailure), and every error of a write into the destination during a
// download marked as the destination's (destinationFailure). A file system error that is neither
// came from the restore's own work in the destination directory. Without the marks a local
// EACCES or EROFS looked like a store that refused access (an IAM fix for a read-only --to).
//
// It forwards Hurry, the one optional method checkpoint.Restore looks for on a store.
type restoreSource struct{ checkpoint.Store }

func (s restoreSource) Hurry() {
	if h, ok := s.Store.(interface{ Hurry() }); ok {
		h.Hurry()
	}
}

func (s restoreSource) PutFile(ctx context.Context, key string, f *os.File, size int64, progress func(n int64)) (checkpoint.Checksum, error) {
	sum, err := s.Store.PutFile(ctx, key, f, size, progress)
	return sum, markStore(err)
}

func (s restoreSource) PutBytes(ctx context.Context, key string, data []byte, cond checkpoint.Cond) (string, error) {
	etag, err := s.Store.PutBytes(ctx, key, data, cond)
	return etag, markStore(err)
}

func (s restoreSource) GetBytes(ctx context.Context, key string) ([]byte, string, error) {
	data, etag, err := s.Store.GetBytes(ctx, key)
	return data, etag, markStore(err)
}

func (s restoreSource) Download(ctx context.Context, key string, w io.WriterAt, size int64) error {
	err := s.Store.Download(ctx, key, destinationWriter{w}, size)
	if df := (*destinationFailure)(nil); errors.As(err, &df) {
		return err
	}
	return markStore(err)
}

func (s restoreSource) List(ctx context.Context, prefix string) ([]checkpoint.ObjectInfo, error) {
	objs, err := s.Store.List(ctx, prefix)
	return objs, markStore(err)
}

func (s restoreSource) ListDir(ctx context.Context, prefix string) ([]string, []checkpoint.ObjectInfo, error) {
	dirs, objs, err := s.Store.ListDir(ctx, prefix)
	return dirs, objs, markStore(err)
}

func (s restoreSource) Delete(ctx context.Context, keys ...string) error {
	return markStore(s.Store.Delete(ctx, keys...))
}

func (s restoreSource) AbortIncomplete(ctx context.Context, prefix string) (int, error) {
	n, err := s.Store.AbortIncomplete(ctx, prefix)
	return n, markStore(err)
}

// storeFailure marks an error a store call returned.
type storeFailure struct{ err error }

func (e *storeFailure) Error() string { return e.err.Error() }
func (e *storeFailure) Unwrap() error { return e.err }

// markStore is err marked as the store's; nil for nil.
func markStore(err error) error {
	if err == nil {
		return nil
	}
	return &storeFailure{err}
}

// destinationFailure marks an error of a write into a file of the destination.
type destinationFailure struct{ err error }

func (e *destinationFailure) Error() string { return e.err.Error() }
func (e *destinationFailure) Unwrap() error { return e.err }

// destinationWriter marks the errors of w's writes as the destination's.
type destinationWriter struct{ w io.WriterAt }

func (d destinationWriter) WriteAt(b []byte, off int64) (int, error) {
	n, err := d.w.WriteAt(b, off)
	if err != nil {
		err = &destinationFailure{err}
	}
	return n, err
}

// isDestinationError reports whether err, from checkpoint.Restore reading a restoreSource, is
// the local file system's in the destination directory: a write into a file being downloaded,
// or a file system error (a path, link or system call error, an errno) that no store call
// returned. Anything else (the store's errors, a damaged commit, a checkpoint that is not
// there, content in the way) is not.
func isDestinationError(err error) bool {
	if df := (*destinationFailure)(nil); errors.As(err, &df) {
		return true
	}
	if sf := (*storeFailure)(nil); errors.As(err, &sf) {
		return false
	}
	var (
		pe    *fs.PathError
		le    *os.LinkError
		se    *os.SyscallError
		errno syscall.Errno
	)
	return errors.As(err, &pe) || errors.As(err, &le) || errors.As(err, &se) || errors.As(err, &errno)
}

// diskSpace is what statfs says of a file system: bytes free to this user, inodes free.
type diskSpace struct {
	ok            bool // false: not known
	bytes, inodes uint64
}

// freeSpace is the space free in the file system of dir, or of its nearest ancestor that exists
// (dir itself may not have been created).
func freeSpace(dir string) diskSpace {
	for d := filepath.Clean(dir); ; d = filepath.Dir(d) {
		var st unix.Statfs_t
		if err := unix.Statfs(d, &st); err == nil {
			return diskSpace{ok: true, bytes: st.Bavail * uint64(st.Bsize), inodes: st.Ffree}
		}
		if d == filepath.Dir(d) {
			return diskSpace{}
		}
	}
}

// destinationFix says what to do about err, an error of the local file system in the
// destination dir (see isDestinationError), naming dir: never the store's fix. need is the
// checkpoint's size (0: not known yet) and free the space left where dir is, for a file
// system that is full:
//   - read-only: mount it read-write, or another --to;
//   - permission denied: fix dir's owner or permissions, or another --to;
//   - no space left: what the checkpoint needs and what is free (or that no inode is);
//   - over quota: the quota;
//   - anything else: check that dir is a directory this user can write.
func destinationFix(dir string, err error, need int64, free diskSpace) string {
	why := ""
	if errno := syscall.Errno(0); errors.As(err, &errno) {
		why = " (" + errno.Error() + ")"
	}
	needs := ""
	if need > 0 {
		needs = "the checkpoint needs " + checkpoint.HumanBytes(need) + "; "
	}
	switch {
	case errors.Is(err, syscall.EROFS):
		return fmt.Sprintf("cannot write the destination %s%s: mount it read-write, or choose another --to", dir, why)
	case errors.Is(err, fs.ErrPermission):
		return fmt.Sprintf("this user (uid %d) cannot write the destination %s%s: fix its owner or permissions (chown, chmod), restore as its owner, or choose another --to",
			os.Geteuid(), dir, why)
	case errors.Is(err, syscall.EDQUOT):
		return fmt.Sprintf("the destination %s is over this user's disk quota: %sraise the quota (quota -s) or free space, or choose another --to", dir, needs)
	case errors.Is(err, syscall.ENOSPC) && free.ok && free.inodes == 0:
		return fmt.Sprintf("the file system of the destination %s has no inode left for another file (df -i %s): %sdelete files there, or choose another --to", dir, dir, needs)
	case errors.Is(err, syscall.ENOSPC) && free.ok && need > 0 && uint64(need) > free.bytes:
		return fmt.Sprintf("the destination %s is too small: the checkpoint needs %s and %s is free (df -h %s): free space there, or choose another --to",
			dir, checkpoint.HumanBytes(need), humanBytesU(free.bytes), dir)
	case errors.Is(err, syscall.ENOSPC) && free.ok:
		return fmt.Sprintf("the file system of the destination %s is full: %s%s and %d inodes (files) are free now (df -h %s; df -i %s): free space or inodes there, or choose another --to",
			dir, needs, humanBytesU(free.bytes), free.inodes, dir, dir)
	case errors.Is(err, syscall.ENOSPC):
		return fmt.Sprintf("the file system of the destination %s is full: %sfree space there, or choose another --to", dir, needs)
	}
	return fmt.Sprintf("cannot write the destination %s%s: check that it and its parents are directories this user can write, or choose another --to", dir, why)
}

// humanBytesU is checkpoint.HumanBytes of an unsigned count.
func humanBytesU(n uint64) string {
	return checkpoint.HumanBytes(int64(min(n, 1<<63-1)))
}

// restoreHint follows a failed restore's error (from a restoreSource) with its fix: for an error
// of the destination's file system, destinationFix for dir, with the checkpoint's size need
// (0: not known) and the space space says dir has left; for any other, storeHint's.
func restoreHint(w io.Writer, url, dir string, err error, notFound string, need int64, space func(dir string) diskSpace) {
	if !isDestinationError(err) {
		storeHint(w, "restore", url, err, notFound)
		return
	}
	var free diskSpace
	if errors.Is(err, syscall.ENOSPC) {
		free = space(dir)
	}
	fmt.Fprintf(w, "spotguard restore: fix: %s\n", destinationFix(dir, err, need, free))
	if errors.Is(err, syscall.ENOSPC) || errors.Is(err, syscall.EDQUOT) {
		if names, size := movedAside(dir); len(names) > 0 {
			fmt.Fprintf(w, "spotguard restore: %d save%s that earlier restores moved aside take %s there (%s): delete what you have looked at\n",
				len(names), plural(len(names)), checkpoint.HumanBytes(size), strings.Join(names, ", "))
		}
	}
}

// movedAside returns the saves restores moved aside in dir (checkpoint.MovedAside: an incomplete
// save, or an older one, of a checkpoint's name that a restore put a commit in place of), by
// path, and the bytes their files take.
func movedAside(dir string) ([]string, int64) {
	entries, err := os.ReadDir(dir)
	if err != nil {
		return nil, 0
	}
	var names []string
	var size int64
	for _, e := range entries {
		if !checkpoint.MovedAside(e.Name()) {
			continue
		}
		p := filepath.Join(dir, e.Name())
		names = append(names, p)
		_ = filepath.WalkDir(p, func(_ string, d fs.DirEntry, err error) error {
			if err == nil && d.Type().IsRegular() {
				if fi, err := d.Info(); err == nil {
					size += fi.Size()
				}
			}
			return nil // what cannot be read is not counted
		})
	}
	return names, size
}

// interruptedText says that a command was interrupted: with the signal when ctx's cause names
// it ("interrupt signal received"), as signal.NotifyContext's does.
func interruptedText(ctx context.Context) string {
	cause := context.Cause(ctx)
	if cause == nil || cause == context.Canceled { // a plain cancel, no signal named
		return "interrupted"
	}
	return "interrupted (" + cause.Error() + ")"
}
