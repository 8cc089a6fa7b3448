package checkpoint

import (
	"context"
	"crypto/rand"
	"crypto/sha256"
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
	"sync"
	"syscall"

	"golang.org/x/sync/errgroup"
)

// FileStore is a Store on a file system (file:///path), such as FSx for Lustre or EFS. Key k is
// the file root/k. Every write goes to a temporary file in the key's directory, is synced, and
// is renamed (or linked, for create-if-absent) into place, so a reader never sees a partial
// object. All access goes through os.Root, so neither a hostile key nor a symbolic link in the
// tree reaches outside root.
//
// Names that start with ".spotguard-" are the store's own: temporary files
// (".spotguard-tmp-…") and lock files (".spotguard-lock-<base name of the key>"). They are never
// objects: List, ListDir and Download do not show them, and a key with such an element is
// refused.
//
// An object's ETag is a digest of its bytes (the first 16 bytes of its SHA-256, in hex, quoted
// like S3's), so writing the same bytes again keeps the ETag.
//
// What conditional writes guarantee, for writers that all go through FileStore on a file system
// whose flock(2) works across its clients (local disks; EFS and NFSv4, where the kernel maps
// flock to NFS locks; Lustre only when mounted with the flock option, not localflock or
// noflock):
//   - IfAbsent: link(2) of the synced temporary file to the key fails if the key exists, so of
//     concurrent writers exactly one wins. It needs no lock.
//   - IfMatch: the writer takes an exclusive flock on the key's lock file (created next to the
//     key on first use and never removed, since removing a lock file could let two writers each
//     hold "the" lock), reads the object and compares its ETag under the lock, then renames
//     the synced temporary file into place and syncs the directory before unlocking. If-Match
//     writes of one key are therefore serialized, and of several with the same ETag exactly one
//     wins. They are also exact with respect to IfAbsent writes (one needs the object, the other
//     its absence). The flock waits without watching ctx; it is held for one small write.
//   - Unconditional PutBytes, PutFile and Delete take no lock: one that lands between an
//     If-Match write's check and its rename is overwritten by that write (a Delete is undone).
//     Write a key that is moved with If-Match only with IfAbsent and IfMatch.
//
// The store remembers the temporary files it has open, so AbortIncomplete never removes one.
type FileStore struct {
	root string

	// mu guards temps.
	mu sync.Mutex
	// temps holds the paths, relative to root, of the temporary files this store has created
	// (or is about to) and not yet renamed, linked or removed.
	temps map[string]struct{}
}

var _ Store = (*FileStore)(nil)

const (
	// fileReservedPrefix starts every name the store uses for itself; no key element may
	// start with it.
	fileReservedPrefix = ".spotguard-"
	// fileTempPrefix starts the name of every temporary file; AbortIncomplete removes those
	// this store value does not have open.
	fileTempPrefix = fileReservedPrefix + "tmp-"
	// fileLockPrefix starts the name of every lock file, followed by the base name of its key.
	fileLockPrefix = fileReservedPrefix + "lock-"
)

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
	return &FileStore{root: root, temps: map[string]struct{}{}}, nil
}

// URL returns "file://" and the root.
func (s *FileStore) URL() string { return "file://" + s.root }

// fileCheckKey is checkStoreKey plus the file store's own rule: no element may start with
// ".spotguard-", the names the store uses for itself.
func fileCheckKey(key string) error {
	if err := checkStoreKey(key); err != nil {
		return err
	}
	for el := range strings.SplitSeq(key, "/") {
		if strings.HasPrefix(el, fileReservedPrefix) {
			return fmt.Errorf("key %q has an element reserved for the store's own files (%s…)", key, fileReservedPrefix)
		}
	}
	return nil
}

// fileETag returns the ETag of an object with the bytes data: the first 16 bytes of their
// SHA-256, in hex, in double quotes.
func fileETag(data []byte) string {
	sum := sha256.Sum256(data)
	return `"` + hex.EncodeToString(sum[:16]) + `"`
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

// createTemp creates the key's directory and a new temporary file in it, entered in s.temps
// before it exists; the caller calls setTemp(name, false) once the file is renamed, linked or
// removed. A concurrent Delete may prune the directory between the two steps, so it tries a few
// times.
func (s *FileStore) createTemp(r *os.Root, key string) (*os.File, string, error) {
	dir := path.Dir(key)
	var err error
	for range 3 {
		if err = r.MkdirAll(dir, 0o755); err != nil {
			continue
		}
		name := fileTempName(dir)
		s.setTemp(name, true)
		var f *os.File
		f, err = r.OpenFile(name, os.O_CREATE|os.O_EXCL|os.O_WRONLY, 0o644)
		if err == nil {
			return f, name, nil
		}
		s.setTemp(name, false)
	}
	return nil, "", fmt.Errorf("create temporary file for %s: %w", key, err)
}

// setTemp enters the temporary file name in s.temps, or removes it.
func (s *FileStore) setTemp(name string, open bool) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if open {
		s.temps[name] = struct{}{}
	} else {
		delete(s.temps, name)
	}
}

// isTemp reports whether name is one of this store's temporary files in use.
func (s *FileStore) isTemp(name string) bool {
	s.mu.Lock()
	defer s.mu.Unlock()
	_, ok := s.temps[name]
	return ok
}

// fileLockName returns the name of key's lock file.
func fileLockName(key string) string {
	return path.Join(path.Dir(key), fileLockPrefix+path.Base(key))
}

// lockKey takes an exclusive flock on key's lock file, creating it if needed, and returns the
// function that releases it. It returns an error wrapping fs.ErrNotExist (or ENOTDIR) if key's
// directory does not exist, and an error for any other I/O error.
func (s *FileStore) lockKey(r *os.Root, key string) (unlock func(), err error) {
	f, err := r.OpenFile(fileLockName(key), os.O_CREATE|os.O_RDWR|syscall.O_NOFOLLOW, 0o644)
	if err != nil {
		return nil, err
	}
	for {
		err = syscall.Flock(int(f.Fd()), syscall.LOCK_EX)
		if err != syscall.EINTR {
			break
		}
	}
	if err != nil {
		f.Close()
		return nil, fmt.Errorf("lock %s: %w", f.Name(), err)
	}
	return func() {
		_ = syscall.Flock(int(f.Fd()), syscall.LOCK_UN)
		f.Close() // releases the lock too
	}, nil
}

// fileSyncDir flushes the directory of key, so a rename or link in it is durable.
func fileSyncDir(r *os.Root, key string) error {
	d, err := r.OpenFile(path.Dir(key), os.O_RDONLY|syscall.O_DIRECTORY, 0)
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
	defer s.setTemp(tmpName, false) // after the removal below
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

// PutBytes writes data to key through a synced temporary file and returns its ETag (see
// FileStore). Unconditionally, it renames the file into place, replacing any object there. With
// cond.IfAbsent it hard-links the file to key, which fails if key exists; with cond.IfMatch it
// compares the ETag and renames under the key's lock (see FileStore for what is atomic); then it
// syncs the directory. It returns:
//   - the ETag, nil: data is now the object at key;
//   - "", an error wrapping ErrExists: cond.IfAbsent and key exists; it is unchanged;
//   - "", an error wrapping ErrPrecondition: cond.IfMatch and the object at key has another
//     ETag, or there is none (its directory included); nothing is changed, but a lock file may
//     have been created in an existing directory;
//   - "", another error: an invalid key or Cond, ctx done before the write, or an I/O error
//     (without IfMatch: such as a key below a file, or a directory at key).
//
// No temporary file is left behind.
func (s *FileStore) PutBytes(ctx context.Context, key string, data []byte, cond Cond) (string, error) {
	if err := cond.check(); err != nil {
		return "", fmt.Errorf("put %s: %w", key, err)
	}
	r, err := s.open(key)
	if err != nil {
		return "", fmt.Errorf("put %s: %w", key, err)
	}
	defer fileCloseRoot(r)
	if err := ctx.Err(); err != nil {
		return "", fmt.Errorf("put %s: %w", key, err)
	}
	if cond.IfMatch != "" {
		unlock, err := s.lockKey(r, key)
		if fileIsNotFound(err) {
			return "", fmt.Errorf("put %s: if-match %s: no object: %w", key, cond.IfMatch, ErrPrecondition)
		}
		if err != nil {
			return "", fmt.Errorf("put %s: %w", key, err)
		}
		defer unlock()
		_, etag, err := s.read(r, key)
		if errors.Is(err, ErrTooLarge) {
			err = nil // its ETag is what the condition is about
		}
		switch {
		case errors.Is(err, ErrNotFound):
			return "", fmt.Errorf("put %s: if-match %s: no object: %w", key, cond.IfMatch, ErrPrecondition)
		case err != nil:
			return "", fmt.Errorf("put %s: %w", key, err)
		case etag != cond.IfMatch:
			return "", fmt.Errorf("put %s: if-match %s: the object has ETag %s: %w", key, cond.IfMatch, etag, ErrPrecondition)
		}
	}
	tmp, tmpName, err := s.createTemp(r, key)
	if err != nil {
		return "", err
	}
	defer s.setTemp(tmpName, false)          // after the removal below
	defer func() { _ = r.Remove(tmpName) }() // fails, harmlessly, after a rename
	_, err = tmp.Write(data)
	if err == nil {
		err = tmp.Sync()
	}
	if cerr := tmp.Close(); err == nil {
		err = cerr
	}
	if err != nil {
		return "", fmt.Errorf("put %s: %w", key, err)
	}
	if cond.IfAbsent {
		if err := r.Link(tmpName, key); err != nil {
			if errors.Is(err, fs.ErrExist) {
				return "", fmt.Errorf("put %s: %w", key, ErrExists)
			}
			return "", fmt.Errorf("put %s: %w", key, err)
		}
	} else if err := r.Rename(tmpName, key); err != nil {
		return "", fmt.Errorf("put %s: %w", key, err)
	}
	if err := fileSyncDir(r, key); err != nil {
		return "", fmt.Errorf("put %s: sync directory: %w", key, err)
	}
	return fileETag(data), nil
}

// fileIsNotFound reports whether err means that a path does not exist, including a path through
// a file (ENOTDIR).
func fileIsNotFound(err error) bool {
	return errors.Is(err, fs.ErrNotExist) || errors.Is(err, syscall.ENOTDIR)
}

// openObject opens the regular file of key for reading. It returns ErrNotFound if there is
// none (a directory is not an object), and an error for anything else that is not a regular
// file (a named pipe, a socket, a device): it opens without blocking (O_NONBLOCK) and checks the
// type of what it opened before anything reads it, so a named pipe never holds a reader waiting
// for a writer that does not come.
func (s *FileStore) openObject(r *os.Root, key string) (*os.File, fs.FileInfo, error) {
	f, err := r.OpenFile(key, os.O_RDONLY|syscall.O_NONBLOCK, 0)
	switch {
	case fileIsNotFound(err):
		return nil, nil, ErrNotFound
	case errors.Is(err, syscall.ENXIO):
		// A socket, or a device without its driver: nothing to read either way.
		return nil, nil, fmt.Errorf("%s is not a regular file (%w); a store holds only regular files: %w", key, err, ErrUnreadableObject)
	case errors.Is(err, fs.ErrPermission):
		return nil, nil, fmt.Errorf("%s: %w: %w", key, err, ErrUnreadableObject)
	case escapesRoot(err):
		return nil, nil, fmt.Errorf("%s: %w (a symbolic link out of the store): %w", key, err, ErrUnreadableObject)
	case err != nil:
		return nil, nil, err
	}
	fi, err := f.Stat()
	if err != nil {
		f.Close()
		return nil, nil, err
	}
	switch {
	case fi.IsDir():
		f.Close()
		return nil, nil, ErrNotFound
	case !fi.Mode().IsRegular():
		f.Close()
		return nil, nil, fmt.Errorf("%s is not a regular file (%s); a store holds only regular files: %w", key, typeWords(fi.Mode()), ErrUnreadableObject)
	}
	return f, fi, nil
}

// escapesRoot reports whether err is an os.Root's refusal of a path that leaves it (a symbolic
// link out of the store): os has no exported error for it, so its text is compared.
func escapesRoot(err error) bool {
	for ; err != nil; err = errors.Unwrap(err) {
		if err.Error() == "path escapes from parent" {
			return true
		}
	}
	return false
}

// read returns the content of key and its ETag; ErrNotFound if there is no such regular file.
func (s *FileStore) read(r *os.Root, key string) ([]byte, string, error) {
	f, fi, err := s.openObject(r, key)
	if err != nil {
		return nil, "", err
	}
	defer f.Close()
	limit := smallObjectLimit(key)
	if fi.Size() > limit {
		// Its ETag all the same (PutBytes If-Match replaces an unusable LATEST), hashed as read.
		h := sha256.New()
		if _, err := io.Copy(h, f); err != nil {
			return nil, "", err
		}
		return nil, `"` + hex.EncodeToString(h.Sum(nil)[:16]) + `"`, tooLarge(key, fi.Size())
	}
	data, err := io.ReadAll(io.LimitReader(f, limit+1))
	if err != nil {
		return nil, "", err
	}
	if int64(len(data)) > limit {
		return nil, "", tooLarge(key, -1) // grown since it was opened
	}
	return data, fileETag(data), nil
}

// GetBytes returns the content of key and its ETag (see FileStore). It returns ErrNotFound if
// there is no such file (a directory or a symbolic link is not one), and an error for an
// invalid key, something at key that is not a regular file (a named pipe: see openObject), ctx
// done first, and any I/O error.
func (s *FileStore) GetBytes(ctx context.Context, key string) ([]byte, string, error) {
	r, err := s.open(key)
	if err != nil {
		return nil, "", fmt.Errorf("get %s: %w", key, err)
	}
	defer fileCloseRoot(r)
	if err := ctx.Err(); err != nil {
		return nil, "", fmt.Errorf("get %s: %w", key, err)
	}
	data, etag, err := s.read(r, key)
	if err != nil {
		return nil, etag, fmt.Errorf("get %s: %w", key, err)
	}
	return data, etag, nil
}

// Download copies key into w with parallel ReadAt/WriteAt of 8 MiB chunks. It returns
// ErrNotFound if there is no such file, and an error for an invalid key, something at key that
// is not a regular file (see openObject), a file whose size is not size, any I/O error, and
// when ctx is done first.
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
		return fmt.Errorf("download %s: %w: object has %d bytes; want %d", key, ErrDamaged, fi.Size(), size)
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

// walk calls fn for every regular file whose key starts with prefix: the objects (no name that
// starts with ".spotguard-") if temps is false, only the temporary files if it is true. It does
// not descend into directories with such names, nor follow symbolic links. A prefix that no
// valid key can have matches nothing.
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
			switch {
			case !fileIsNotFound(err):
				return err
			case p == start:
				return fs.SkipAll
			case d != nil && d.IsDir():
				return fs.SkipDir // removed while it was walked (retention, a clean-up)
			}
			return nil
		}
		if err := ctx.Err(); err != nil {
			return err
		}
		if d.IsDir() {
			// Skip directories that cannot lead to a match.
			if p != start && (!strings.HasPrefix(p+"/", prefix) && !strings.HasPrefix(prefix, p+"/") ||
				strings.HasPrefix(d.Name(), fileReservedPrefix)) {
				return fs.SkipDir
			}
			return nil
		}
		if !d.Type().IsRegular() || !strings.HasPrefix(p, prefix) {
			return nil
		}
		if temps != strings.HasPrefix(d.Name(), fileTempPrefix) ||
			!temps && strings.HasPrefix(d.Name(), fileReservedPrefix) {
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

// List returns every object whose key starts with prefix, sorted by key, walking every
// directory below prefix. The store's own files (".spotguard-…"), directories, symbolic links
// and other non-regular files are not objects. It returns an error for an I/O error and when
// ctx is done first.
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

// ListDir lists one level below prefix with one read of its directory: sub-directories are the
// dirs, regular files the objs (with their whole keys), both sorted. The store's own names
// (".spotguard-…"), names that cannot be a key element, symbolic links and other files are
// skipped. Unlike S3, which lists only prefixes with objects below them, it lists every
// sub-directory, also one that holds no object (only a lock file, or a write in progress). A
// missing directory, or a prefix through a file or whose last element is a symbolic link, gives
// nothing and no error. It returns an error for a prefix that is neither "" nor a valid key
// followed by "/", for an I/O error (such as a prefix through a symbolic link that leaves the
// root), and when ctx is done first.
func (s *FileStore) ListDir(ctx context.Context, prefix string) ([]string, []ObjectInfo, error) {
	if err := checkDirPrefix(prefix); err != nil {
		return nil, nil, fmt.Errorf("list %q: %w", prefix, err)
	}
	if err := ctx.Err(); err != nil {
		return nil, nil, fmt.Errorf("list %q: %w", prefix, err)
	}
	r, err := os.OpenRoot(s.root)
	if err != nil {
		return nil, nil, fmt.Errorf("open file store root: %w", err)
	}
	defer fileCloseRoot(r)
	dir := "."
	if prefix != "" {
		dir = strings.TrimSuffix(prefix, "/")
	}
	if dir != "." {
		fi, err := r.Lstat(dir)
		if fileIsNotFound(err) || err == nil && !fi.IsDir() {
			return nil, nil, nil // nothing, a file, or a symbolic link
		}
		if err != nil {
			return nil, nil, fmt.Errorf("list %q: %w", prefix, err)
		}
	}
	d, err := r.OpenFile(dir, os.O_RDONLY|syscall.O_DIRECTORY|syscall.O_NOFOLLOW, 0)
	if fileIsNotFound(err) || errors.Is(err, syscall.ELOOP) {
		return nil, nil, nil
	}
	if err != nil {
		return nil, nil, fmt.Errorf("list %q: %w", prefix, err)
	}
	defer d.Close()
	entries, err := d.ReadDir(-1)
	if fileIsNotFound(err) {
		return nil, nil, nil // removed since it was opened (retention, a clean-up)
	}
	if err != nil {
		return nil, nil, fmt.Errorf("list %q: %w", prefix, err)
	}
	var dirs []string
	var objs []ObjectInfo
	for _, e := range entries {
		name := e.Name()
		if strings.HasPrefix(name, fileReservedPrefix) || checkStoreKey(name) != nil {
			continue
		}
		switch {
		case e.IsDir():
			dirs = append(dirs, name)
		case e.Type().IsRegular():
			fi, err := e.Info()
			if fileIsNotFound(err) {
				continue // removed meanwhile
			}
			if err != nil {
				return nil, nil, fmt.Errorf("list %q: %w", prefix, err)
			}
			objs = append(objs, ObjectInfo{Key: prefix + name, Size: fi.Size(), LastModified: fi.ModTime()})
		}
	}
	slices.Sort(dirs)
	slices.SortFunc(objs, func(a, b ObjectInfo) int { return strings.Compare(a.Key, b.Key) })
	return dirs, objs, nil
}

// Delete removes the files of keys, then each one's parent directories up to root while they
// are empty. A key's lock file (see FileStore) is left, and so is its directory. Keys that do not
// exist, or name a directory, are not an error. It returns an error for an invalid key (before
// removing anything) and for an I/O error.
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
// starts with prefix, which must be a valid key followed by "/", except those this store value
// has open now (lock files are not touched), then each one's parent directories while they are
// empty. It returns how many it removed. It returns an error for any other prefix, and, with the
// count so far, for an I/O error and when ctx is done first.
func (s *FileStore) AbortIncomplete(ctx context.Context, prefix string) (int, error) {
	if err := checkDirPrefix(prefix); err != nil || prefix == "" {
		if err == nil {
			err = errors.New("empty prefix")
		}
		return 0, fmt.Errorf("abort incomplete %q: %w", prefix, err)
	}
	n := 0
	err := s.walk(ctx, prefix, true, func(r *os.Root, p string, _ fs.FileInfo) error {
		if s.isTemp(p) {
			return nil
		}
		if err := r.Remove(p); err != nil {
			if fileIsNotFound(err) {
				return nil
			}
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
