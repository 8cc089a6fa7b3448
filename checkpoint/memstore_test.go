package checkpoint

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"os"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
)

// memStore is an in-memory Store for tests. It is safe for concurrent use. Conditional writes
// behave as in the real stores, with the same ETags as FileStore (a digest of the bytes); it has
// no incomplete uploads. Knobs make it misbehave per key: fail (any method touching the key
// returns the error), corrupt (Download writes the object with one bit flipped), hang (the next
// Download blocks until its ctx ends). It counts its listings (stats).
type memStore struct {
	mu        sync.Mutex
	objs      map[string][]byte
	fail      map[string]error
	corrupt   map[string]bool
	hang      map[string]chan struct{}
	listErr   error
	downloads []string // keys passed to Download, in call order
	listed    memListStats
	maxKey    int // longer keys fail with errKeyTooLong, as S3 refuses keys over 1024 bytes; 0: any
}

// memListStats counts a memStore's listings, so tests and benchmarks can show how much of the
// store a caller reads.
type memListStats struct {
	Lists    int // List calls
	ListDirs int // ListDir calls
	Objects  int // ObjectInfos returned by List and ListDir
	Dirs     int // directory names returned by ListDir
}

var _ Store = (*memStore)(nil)

func newMemStore() *memStore {
	return &memStore{
		objs:    map[string][]byte{},
		fail:    map[string]error{},
		corrupt: map[string]bool{},
		hang:    map[string]chan struct{}{},
	}
}

// put stores data at key, as a test's setup.
func (s *memStore) put(key string, data []byte) {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.objs[key] = slices.Clone(data)
}

// remove deletes key, as a test's setup.
func (s *memStore) remove(key string) {
	s.mu.Lock()
	defer s.mu.Unlock()
	delete(s.objs, key)
}

// failKey makes every method that touches key return err.
func (s *memStore) failKey(key string, err error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.fail[key] = err
}

// corruptKey makes Download of key write the object with one bit flipped.
func (s *memStore) corruptKey(key string) {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.corrupt[key] = true
}

// hangKey makes the next Download of key block until its context ends. The channel it
// returns is closed when that Download has started blocking.
func (s *memStore) hangKey(key string) <-chan struct{} {
	s.mu.Lock()
	defer s.mu.Unlock()
	entered := make(chan struct{})
	s.hang[key] = entered
	return entered
}

// stats returns the listings counted so far.
func (s *memStore) stats() memListStats {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.listed
}

// downloaded returns the keys passed to Download so far.
func (s *memStore) downloaded() []string {
	s.mu.Lock()
	defer s.mu.Unlock()
	return slices.Clone(s.downloads)
}

func (s *memStore) URL() string { return "mem://bucket/prefix" }

// check refuses keys a real store would refuse and returns the knob error for key, if any.
// It must be called with s.mu held.
func (s *memStore) check(ctx context.Context, key string) error {
	if err := ctx.Err(); err != nil {
		return err
	}
	if key == "" || strings.HasPrefix(key, "/") || slices.Contains(strings.Split(key, "/"), "..") {
		return fmt.Errorf("memstore: key %q leaves the prefix", key)
	}
	if s.maxKey > 0 && len(key) > s.maxKey {
		return fmt.Errorf("memstore: key %q is %d bytes: %w", key, len(key), errKeyTooLong)
	}
	return s.fail[key]
}

func (s *memStore) PutFile(ctx context.Context, key string, f *os.File, size int64, progress func(n int64)) (Checksum, error) {
	data := make([]byte, size)
	if _, err := f.ReadAt(data, 0); err != nil && (!errors.Is(err, io.EOF) || size != 0) {
		return Checksum{}, fmt.Errorf("memstore: read %s: %w", f.Name(), err)
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	if err := s.check(ctx, key); err != nil {
		return Checksum{}, err
	}
	s.objs[key] = data
	if progress != nil {
		progress(size)
	}
	return ChecksumOf(bytes.NewReader(data))
}

func (s *memStore) PutBytes(ctx context.Context, key string, data []byte, cond Cond) (string, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if err := s.check(ctx, key); err != nil {
		return "", err
	}
	if err := cond.check(); err != nil {
		return "", fmt.Errorf("memstore: put %s: %w", key, err)
	}
	cur, ok := s.objs[key]
	switch {
	case cond.IfAbsent && ok:
		return "", fmt.Errorf("memstore: put %s: %w", key, ErrExists)
	case cond.IfMatch != "" && (!ok || fileETag(cur) != cond.IfMatch):
		return "", fmt.Errorf("memstore: put %s: if-match %s: %w", key, cond.IfMatch, ErrPrecondition)
	}
	s.objs[key] = slices.Clone(data)
	return fileETag(data), nil
}

func (s *memStore) GetBytes(ctx context.Context, key string) ([]byte, string, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if err := s.check(ctx, key); err != nil {
		return nil, "", err
	}
	data, ok := s.objs[key]
	if !ok {
		return nil, "", fmt.Errorf("memstore: get %s: %w", key, ErrNotFound)
	}
	return slices.Clone(data), fileETag(data), nil
}

// Download writes the object in up to four ranges, concurrently, like a ranged-GET store.
func (s *memStore) Download(ctx context.Context, key string, w io.WriterAt, size int64) error {
	s.mu.Lock()
	s.downloads = append(s.downloads, key)
	err := s.check(ctx, key)
	data, ok := s.objs[key]
	data = slices.Clone(data)
	hang := s.hang[key]
	if hang != nil {
		delete(s.hang, key) // close the channel once
	}
	if s.corrupt[key] && len(data) > 0 {
		data[len(data)/2] ^= 0x01
	}
	s.mu.Unlock()
	switch {
	case err != nil:
		return err
	case hang != nil:
		close(hang)
		<-ctx.Done()
		return ctx.Err()
	case !ok:
		return fmt.Errorf("memstore: download %s: %w", key, ErrNotFound)
	case int64(len(data)) != size:
		return fmt.Errorf("memstore: download %s: %w: object has %d bytes; want %d", key, ErrDamaged, len(data), size)
	}

	const parts = 4
	chunk := max((size+parts-1)/parts, 1)
	errs := make([]error, parts)
	var wg sync.WaitGroup
	for i := range parts {
		off := int64(i) * chunk
		if off >= size {
			break
		}
		end := min(off+chunk, size)
		wg.Go(func() {
			_, errs[i] = w.WriteAt(data[off:end], off)
		})
	}
	wg.Wait()
	return errors.Join(errs...)
}

func (s *memStore) List(ctx context.Context, prefix string) ([]ObjectInfo, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if err := ctx.Err(); err != nil {
		return nil, err
	}
	if s.listErr != nil {
		return nil, s.listErr
	}
	var out []ObjectInfo
	for k, v := range s.objs {
		if strings.HasPrefix(k, prefix) {
			out = append(out, ObjectInfo{Key: k, Size: int64(len(v))})
		}
	}
	slices.SortFunc(out, func(a, b ObjectInfo) int { return strings.Compare(a.Key, b.Key) })
	s.listed.Lists++
	s.listed.Objects += len(out)
	return out, nil
}

func (s *memStore) ListDir(ctx context.Context, prefix string) ([]string, []ObjectInfo, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if err := ctx.Err(); err != nil {
		return nil, nil, err
	}
	if s.listErr != nil {
		return nil, nil, s.listErr
	}
	if err := checkDirPrefix(prefix); err != nil {
		return nil, nil, fmt.Errorf("memstore: list %q: %w", prefix, err)
	}
	var dirs []string
	var objs []ObjectInfo
	for k, v := range s.objs {
		rest, ok := strings.CutPrefix(k, prefix)
		if !ok {
			continue
		}
		if dir, _, deeper := strings.Cut(rest, "/"); deeper {
			dirs = append(dirs, dir)
		} else {
			objs = append(objs, ObjectInfo{Key: k, Size: int64(len(v))})
		}
	}
	slices.Sort(dirs)
	dirs = slices.Compact(dirs)
	slices.SortFunc(objs, func(a, b ObjectInfo) int { return strings.Compare(a.Key, b.Key) })
	s.listed.ListDirs++
	s.listed.Objects += len(objs)
	s.listed.Dirs += len(dirs)
	return dirs, objs, nil
}

func (s *memStore) Delete(ctx context.Context, keys ...string) error {
	s.mu.Lock()
	defer s.mu.Unlock()
	for _, k := range keys {
		if err := s.check(ctx, k); err != nil {
			return err
		}
		delete(s.objs, k)
	}
	return nil
}

// AbortIncomplete checks prefix as the real stores do; there is nothing to abort.
func (s *memStore) AbortIncomplete(ctx context.Context, prefix string) (int, error) {
	if err := checkDirPrefix(prefix); err != nil || prefix == "" {
		return 0, fmt.Errorf("memstore: abort incomplete %q: bad prefix: %v", prefix, err)
	}
	return 0, ctx.Err()
}

func TestMemStoreStats(t *testing.T) {
	s := newMemStore()
	for _, k := range []string{"j/LATEST", "j/c/1/a", "j/c/1/b", "j/c/2/a"} {
		s.put(k, []byte(k))
	}
	if _, err := s.List(t.Context(), "j/"); err != nil {
		t.Fatal(err)
	}
	if _, _, err := s.ListDir(t.Context(), "j/"); err != nil {
		t.Fatal(err)
	}
	if _, _, err := s.ListDir(t.Context(), "j/c/"); err != nil {
		t.Fatal(err)
	}
	want := memListStats{Lists: 1, ListDirs: 2, Objects: 4 + 1, Dirs: 1 + 2}
	if got := s.stats(); got != want {
		t.Errorf("Got(%q) stats = %+v; want %+v", "j/", got, want)
	}
}

// hurriedStore is a memStore that counts the times it was told to hurry (S3Store.Hurry).
type hurriedStore struct {
	*memStore
	hurries atomic.Int64
}

func (s *hurriedStore) Hurry() { s.hurries.Add(1) }

// rankedStore is a memStore that records the rank (withRank) each PutFile came with, by key.
type rankedStore struct {
	*memStore
	mu    sync.Mutex
	ranks map[string]uint64
}

func (s *rankedStore) PutFile(ctx context.Context, key string, f *os.File, size int64, progress func(n int64)) (Checksum, error) {
	s.mu.Lock()
	s.ranks[key] = rankOf(ctx)
	s.mu.Unlock()
	return s.memStore.PutFile(ctx, key, f, size, progress)
}

// rankOfFile is the rank the file path of checkpoint cp was put with; ok is false if it was not.
func (s *rankedStore) rankOfFile(cp, path string) (rank uint64, ok bool) {
	s.mu.Lock()
	defer s.mu.Unlock()
	for k, r := range s.ranks {
		if strings.Contains(k, "/"+cp+"/") && strings.HasSuffix(k, "/"+path) {
			return r, true
		}
	}
	return 0, false
}
