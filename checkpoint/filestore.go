package checkpoint

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"os"
	"path"
	"path/filepath"
	"slices"
	"strings"
	"syscall"
	"time"

	"golang.org/x/sync/errgroup"
)

// FileStore is a Store on a file system (file:///path), such as FSx for Lustre or EFS. Key k is
// the file root/k. Every write goes to a temporary file in the key's directory, is synced, and
// is renamed (or linked, for create-if-absent) into place, so a reader never sees a partial
// object. All access goes through os.Root, so neither a hostile key nor a symbolic link in the
// tree reaches outside root.
type FileStore struct {
	root string
}

var _ Store = (*FileStore)(nil)

// fileTempPrefix starts the name of every temporary file; List skips them, AbortIncomplete
// removes old ones, and keys whose last element starts with it are refused.
const fileTempPrefix = ".spotguard-tmp-"

const (
	fileCopyBuffer    = 1 << 20
	fileDownloadChunk = 8 << 20
	fileDownloadConc  = 8
)

// NewFileStore returns the store at root, creating the directory if it is missing. It returns
// an error if root is not absolute or cannot be created.
func NewFileStore(root string) (*FileStore, error) {
	if !filepath.IsAbs(root) {
		return nil, fmt.Errorf("file store root %q is not absolute", root)
	}
	root = filepath.Clean(root)
	if err := os.MkdirAll(root, 0o755); err != nil {
		return nil, fmt.Errorf("create file store root: %w", err)
	}
	return &FileStore{root: root}, nil
}

// URL returns "file://" and the root.
func (s *FileStore) URL() string { return "file://" + s.root }

// fileCheckKey is checkStoreKey plus the file store's own rule: no temporary file names.
func fileCheckKey(key string) error {
	if err := checkStoreKey(key); err != nil {
		return err
	}
	if strings.HasPrefix(path.Base(key), fileTempPrefix) {
		return fmt.Errorf("key %q has a name reserved for temporary files", key)
	}
	return nil
}

// open validates key and opens the store's root.
func (s *FileStore) open(key string) (*os.Root, error) {
	if err := fileCheckKey(key); err != nil {
		return nil, err
	}
	r, err := os.OpenRoot(s.root)
	if err != nil {
		return nil, fmt.Errorf("open file store root: %w", err)
	}
	return r, nil
}

// fileCloseRoot closes a root opened for one call; closing a directory handle fails only for
// a bad handle, which says nothing about the call's result.
func fileCloseRoot(r *os.Root) { _ = r.Close() }

// fileTempName returns a fresh temporary file name in dir.
func fileTempName(dir string) string {
	var b [8]byte
	_, _ = rand.Read(b[:])
	return path.Join(dir, fileTempPrefix+hex.EncodeToString(b[:]))
}

// createTemp creates the key's directory and a new temporary file in it. A concurrent Delete
// may prune the directory between the two steps, so it tries a few times.
func (s *FileStore) createTemp(r *os.Root, key string) (*os.File, string, error) {
	dir := path.Dir(key)
	var err error
	for range 3 {
		if err = r.MkdirAll(dir, 0o755); err != nil {
			continue
		}
		name := fileTempName(dir)
		var f *os.File
		f, err = r.OpenFile(name, os.O_CREATE|os.O_EXCL|os.O_WRONLY, 0o644)
		if err == nil {
			return f, name, nil
		}
	}
	return nil, "", fmt.Errorf("create temporary file for %s: %w", key, err)
}

// fileSyncDir flushes the directory of key, so a rename or link in it is durable.
func fileSyncDir(r *os.Root, key string) error {
	d, err := r.Open(path.Dir(key))
	if err != nil {
		return err
	}
	defer d.Close()
	return d.Sync()
}

// fileCtxReader fails reads once ctx is done.
type fileCtxReader struct {
	ctx context.Context
	r   io.Reader
}

func (c fileCtxReader) Read(p []byte) (int, error) {
	if err := c.ctx.Err(); err != nil {
		return 0, err
	}
	return c.r.Read(p)
}

// fileProgressWriter reports every write to progress.
type fileProgressWriter struct {
	w        io.Writer
	progress func(int64)
}

func (p fileProgressWriter) Write(b []byte) (int, error) {
	n, err := p.w.Write(b)
	if n > 0 {
		p.progress(int64(n))
	}
	return n, err
}

// PutFile copies the first size bytes of f to key through a temporary file (synced, then
// renamed into place, then the directory synced) and returns its CRC-32C, computed while
// copying. It returns an error, and leaves no file behind, for an invalid key, a file shorter
// than size, any I/O error, and when ctx is done before the copy is complete.
func (s *FileStore) PutFile(ctx context.Context, key string, f *os.File, size int64, progress func(n int64)) (Checksum, error) {
	r, err := s.open(key)
	if err != nil {
		return Checksum{}, fmt.Errorf("put %s: %w", key, err)
	}
	defer fileCloseRoot(r)
	if err := ctx.Err(); err != nil {
		return Checksum{}, fmt.Errorf("put %s: %w", key, err)
	}
	tmp, tmpName, err := s.createTemp(r, key)
	if err != nil {
		return Checksum{}, err
	}
	ok := false
	defer func() {
		if !ok {
			tmp.Close()
			_ = r.Remove(tmpName)
		}
	}()
	h := NewCRC32C()
	dst := io.MultiWriter(tmp, h)
	if progress != nil {
		dst = fileProgressWriter{w: dst, progress: progress}
	}
	src := fileCtxReader{ctx: ctx, r: io.NewSectionReader(f, 0, size)}
	n, err := io.CopyBuffer(dst, src, make([]byte, fileCopyBuffer))
	if err != nil {
		return Checksum{}, fmt.Errorf("put %s: copy: %w", key, err)
	}
	if n != size {
		return Checksum{}, fmt.Errorf("put %s: %s has %d bytes; want %d", key, f.Name(), n, size)
	}
	if err := tmp.Sync(); err != nil {
		return Checksum{}, fmt.Errorf("put %s: sync: %w", key, err)
	}
	if err := tmp.Close(); err != nil {
		return Checksum{}, fmt.Errorf("put %s: close: %w", key, err)
	}
	if err := ctx.Err(); err != nil {
		return Checksum{}, fmt.Errorf("put %s: %w", key, err)
	}
	if err := r.Rename(tmpName, key); err != nil {
		return Checksum{}, fmt.Errorf("put %s: %w", key, err)
	}
	ok = true
	if err := fileSyncDir(r, key); err != nil {
		return Checksum{}, fmt.Errorf("put %s: sync directory: %w", key, err)
	}
	return CRC32CChecksum(h.Sum32()), nil
}

// PutBytes writes data to key through a synced temporary file. Without ifAbsent it renames the
// file into place, replacing any object there. With ifAbsent it hard-links the file to key,
// which fails if key exists, so exactly one of several concurrent writers wins; the others get
// ErrExists and the object is unchanged. It returns an error for an invalid key and any I/O
// error; no temporary file is left behind.
func (s *FileStore) PutBytes(ctx context.Context, key string, data []byte, ifAbsent bool) error {
	r, err := s.open(key)
	if err != nil {
		return fmt.Errorf("put %s: %w", key, err)
	}
	defer fileCloseRoot(r)
	if err := ctx.Err(); err != nil {
		return fmt.Errorf("put %s: %w", key, err)
	}
	tmp, tmpName, err := s.createTemp(r, key)
	if err != nil {
		return err
	}
	defer func() { _ = r.Remove(tmpName) }() // fails, harmlessly, after a rename
	_, err = tmp.Write(data)
	if err == nil {
		err = tmp.Sync()
	}
	if cerr := tmp.Close(); err == nil {
		err = cerr
	}
	if err != nil {
		return fmt.Errorf("put %s: %w", key, err)
	}
	if ifAbsent {
		if err := r.Link(tmpName, key); err != nil {
			if errors.Is(err, fs.ErrExist) {
				return fmt.Errorf("put %s: %w", key, ErrExists)
			}
			return fmt.Errorf("put %s: %w", key, err)
		}
	} else if err := r.Rename(tmpName, key); err != nil {
		return fmt.Errorf("put %s: %w", key, err)
	}
	if err := fileSyncDir(r, key); err != nil {
		return fmt.Errorf("put %s: sync directory: %w", key, err)
	}
	return nil
}

// fileIsNotFound reports whether err means that a path does not exist, including a path through
// a file (ENOTDIR).
func fileIsNotFound(err error) bool {
	return errors.Is(err, fs.ErrNotExist) || errors.Is(err, syscall.ENOTDIR)
}

// openObject opens the regular file of key. It returns ErrNotFound if there is none (a
// directory is not an object).
func (s *FileStore) openObject(r *os.Root, key string) (*os.File, fs.FileInfo, error) {
	f, err := r.Open(key)
	if fileIsNotFound(err) {
		return nil, nil, ErrNotFound
	}
	if err != nil {
		return nil, nil, err
	}
	fi, err := f.Stat()
	if err != nil {
		f.Close()
		return nil, nil, err
	}
	if !fi.Mode().IsRegular() {
		f.Close()
		return nil, nil, ErrNotFound
	}
	return f, fi, nil
}

// GetBytes returns the content of key. It returns ErrNotFound if there is no such file, and an
// error for an invalid key and any I/O error.
func (s *FileStore) GetBytes(ctx context.Context, key string) ([]byte, error) {
	r, err := s.open(key)
	if err != nil {
		return nil, fmt.Errorf("get %s: %w", key, err)
	}
	defer fileCloseRoot(r)
	if err := ctx.Err(); err != nil {
		return nil, fmt.Errorf("get %s: %w", key, err)
	}
	f, _, err := s.openObject(r, key)
	if err != nil {
		return nil, fmt.Errorf("get %s: %w", key, err)
	}
	defer f.Close()
	data, err := io.ReadAll(f)
	if err != nil {
		return nil, fmt.Errorf("get %s: %w", key, err)
	}
	return data, nil
}

// Download copies key into w with parallel ReadAt/WriteAt of 8 MiB chunks. It returns
// ErrNotFound if there is no such file, and an error for an invalid key, a file whose size is
// not size, any I/O error, and when ctx is done first.
func (s *FileStore) Download(ctx context.Context, key string, w io.WriterAt, size int64) error {
	r, err := s.open(key)
	if err != nil {
		return fmt.Errorf("download %s: %w", key, err)
	}
	defer fileCloseRoot(r)
	f, fi, err := s.openObject(r, key)
	if err != nil {
		return fmt.Errorf("download %s: %w", key, err)
	}
	defer f.Close()
	if fi.Size() != size {
		return fmt.Errorf("download %s: object has %d bytes; want %d", key, fi.Size(), size)
	}
	g, gctx := errgroup.WithContext(ctx)
	g.SetLimit(fileDownloadConc)
	for off := int64(0); off < size; off += fileDownloadChunk {
		if gctx.Err() != nil {
			break
		}
		n := min(fileDownloadChunk, size-off)
		g.Go(func() error {
			src := fileCtxReader{ctx: gctx, r: io.NewSectionReader(f, off, n)}
			got, err := io.CopyBuffer(io.NewOffsetWriter(w, off), src, make([]byte, fileCopyBuffer))
			if err != nil {
				return err
			}
			if got != n {
				return fmt.Errorf("read %d bytes at %d; want %d (file changed?)", got, off, n)
			}
			return nil
		})
	}
	if err := g.Wait(); err != nil {
		return fmt.Errorf("download %s: %w", key, err)
	}
	if err := ctx.Err(); err != nil {
		return fmt.Errorf("download %s: %w", key, err)
	}
	return nil
}

// walk calls fn for every regular file (not temporary ones, if temps is false; only temporary
// ones, if it is true) whose key starts with prefix. A prefix that no valid key can have
// matches nothing.
func (s *FileStore) walk(ctx context.Context, prefix string, temps bool, fn func(r *os.Root, key string, fi fs.FileInfo) error) error {
	r, err := os.OpenRoot(s.root)
	if err != nil {
		return fmt.Errorf("open file store root: %w", err)
	}
	defer fileCloseRoot(r)
	start := "."
	if i := strings.LastIndex(prefix, "/"); i >= 0 {
		start = prefix[:i]
		if checkStoreKey(start) != nil {
			return nil
		}
	}
	err = fs.WalkDir(r.FS(), start, func(p string, d fs.DirEntry, err error) error {
		if err != nil {
			if p == start && fileIsNotFound(err) {
				return fs.SkipAll
			}
			return err
		}
		if err := ctx.Err(); err != nil {
			return err
		}
		if d.IsDir() {
			// Skip directories that cannot lead to a match.
			if p != start && !strings.HasPrefix(p+"/", prefix) && !strings.HasPrefix(prefix, p+"/") {
				return fs.SkipDir
			}
			return nil
		}
		if !d.Type().IsRegular() || !strings.HasPrefix(p, prefix) ||
			strings.HasPrefix(d.Name(), fileTempPrefix) != temps {
			return nil
		}
		fi, err := d.Info()
		if fileIsNotFound(err) {
			return nil // removed meanwhile
		}
		if err != nil {
			return err
		}
		return fn(r, p, fi)
	})
	return err
}

// List returns every object whose key starts with prefix, sorted by key. Temporary files,
// directories, symbolic links and other non-regular files are not objects. It returns an error
// for an I/O error and when ctx is done first.
func (s *FileStore) List(ctx context.Context, prefix string) ([]ObjectInfo, error) {
	var out []ObjectInfo
	err := s.walk(ctx, prefix, false, func(_ *os.Root, key string, fi fs.FileInfo) error {
		out = append(out, ObjectInfo{Key: key, Size: fi.Size(), LastModified: fi.ModTime()})
		return nil
	})
	if err != nil {
		return nil, fmt.Errorf("list %q: %w", prefix, err)
	}
	slices.SortFunc(out, func(a, b ObjectInfo) int { return strings.Compare(a.Key, b.Key) })
	return out, nil
}

// Delete removes the files of keys, then each one's parent directories up to root while they
// are empty. Keys that do not exist, or name a directory, are not an error. It returns an error
// for an invalid key (before removing anything) and for an I/O error.
func (s *FileStore) Delete(ctx context.Context, keys ...string) error {
	for _, key := range keys {
		if err := fileCheckKey(key); err != nil {
			return fmt.Errorf("delete: %w", err)
		}
	}
	r, err := os.OpenRoot(s.root)
	if err != nil {
		return fmt.Errorf("open file store root: %w", err)
	}
	defer fileCloseRoot(r)
	for _, key := range keys {
		if err := ctx.Err(); err != nil {
			return fmt.Errorf("delete: %w", err)
		}
		fi, err := r.Lstat(key)
		if fileIsNotFound(err) || (err == nil && fi.IsDir()) {
			continue
		}
		if err != nil {
			return fmt.Errorf("delete %s: %w", key, err)
		}
		if err := r.Remove(key); err != nil && !fileIsNotFound(err) {
			return fmt.Errorf("delete %s: %w", key, err)
		}
		filePruneDirs(r, path.Dir(key))
	}
	return nil
}

// filePruneDirs removes dir and its parents, up to but not including the root, while they are
// empty.
func filePruneDirs(r *os.Root, dir string) {
	for ; dir != "." && dir != "/"; dir = path.Dir(dir) {
		if r.Remove(dir) != nil { // not empty, or gone
			return
		}
	}
}

// AbortIncomplete removes the temporary files, left by writes that never finished, whose path
// starts with prefix and that were last modified before olderThan. It returns how many it
// removed, and an error for an I/O error and when ctx is done first (with the count so far).
func (s *FileStore) AbortIncomplete(ctx context.Context, prefix string, olderThan time.Time) (int, error) {
	n := 0
	err := s.walk(ctx, prefix, true, func(r *os.Root, p string, fi fs.FileInfo) error {
		if !fi.ModTime().Before(olderThan) {
			return nil
		}
		if err := r.Remove(p); err != nil && !fileIsNotFound(err) {
			return err
		}
		n++
		filePruneDirs(r, path.Dir(p))
		return nil
	})
	if err != nil {
		return n, fmt.Errorf("abort incomplete %q: %w", prefix, err)
	}
	return n, nil
}
