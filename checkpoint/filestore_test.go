package checkpoint

import (
	"bytes"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"syscall"
	"testing"
	"time"
)

// fileTempFiles returns the temporary files under the store's root.
func fileTempFiles(t testing.TB, s *FileStore) []string {
	t.Helper()
	var temps []string
	err := s.walk(t.Context(), "", true, func(_ *os.Root, key string, _ fs.FileInfo) error {
		temps = append(temps, key)
		return nil
	})
	if err != nil {
		t.Fatalf("walk %s: %v", s.root, err)
	}
	return temps
}

// fileTree returns every path under dir, directories with a trailing slash.
func fileTree(t testing.TB, dir string) []string {
	t.Helper()
	var paths []string
	err := filepath.WalkDir(dir, func(p string, d fs.DirEntry, err error) error {
		if err != nil || p == dir {
			return err
		}
		rel, _ := filepath.Rel(dir, p)
		if d.IsDir() {
			rel += "/"
		}
		paths = append(paths, filepath.ToSlash(rel))
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	return paths
}

func TestNewFileStore(t *testing.T) {
	tests := []struct {
		root string
		ok   bool
	}{
		{root: filepath.Join(t.TempDir(), "a", "b"), ok: true},
		{root: "relative/dir", ok: false},
		{root: "", ok: false},
	}
	for _, tc := range tests {
		t.Run(tc.root, func(t *testing.T) {
			s, err := NewFileStore(tc.root)
			if (err == nil) != tc.ok {
				t.Fatalf("Got(%q) = %v; want ok %v", tc.root, err, tc.ok)
			}
			if err != nil {
				return
			}
			if fi, err := os.Stat(tc.root); err != nil || !fi.IsDir() {
				t.Errorf("Got(%q) root = %v; want a directory", tc.root, err)
			}
			if got, want := s.URL(), "file://"+tc.root; got != want {
				t.Errorf("Got(%q).URL() = %q; want %q", tc.root, got, want)
			}
		})
	}
}

func TestFileStoreDeletePrunesEmptyDirs(t *testing.T) {
	root := filepath.Join(t.TempDir(), "store")
	s, err := NewFileStore(root)
	if err != nil {
		t.Fatal(err)
	}
	for _, k := range []string{"j/c/a/b/file", "j/c/other", "j/LATEST"} {
		if _, err := s.PutBytes(t.Context(), k, []byte("x"), Cond{}); err != nil {
			t.Fatal(err)
		}
	}
	tests := []struct {
		key  string
		want []string
	}{
		{"j/c/a/b/file", []string{"j/", "j/LATEST", "j/c/", "j/c/other"}},
		{"j/c/other", []string{"j/", "j/LATEST"}},
		{"j/LATEST", nil},
	}
	for _, tc := range tests {
		if err := s.Delete(t.Context(), tc.key); err != nil {
			t.Fatalf("Delete(%q) = %v; want no error", tc.key, err)
		}
		if got := fileTree(t, root); !slices.Equal(got, tc.want) {
			t.Errorf("Delete(%q) left %q; want %q", tc.key, got, tc.want)
		}
	}
	if _, err := os.Stat(root); err != nil {
		t.Errorf("Delete of everything removed the root: %v", err)
	}
}

// fileTestWrite writes a file at rel below root, as something other than the store would.
func fileTestWrite(t *testing.T, root, rel, data string) {
	t.Helper()
	p := filepath.Join(root, rel)
	if err := os.MkdirAll(filepath.Dir(p), 0o755); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(p, []byte(data), 0o644); err != nil {
		t.Fatal(err)
	}
}

// TestFileStoreAbortIncomplete: AbortIncomplete removes exactly the temporary files under the
// commit's prefix that the store value does not have open, whatever their age, and nothing
// else: not a write in flight, not lock files, not a sibling prefix that starts with the same
// characters.
func TestFileStoreAbortIncomplete(t *testing.T) {
	root := filepath.Join(t.TempDir(), "store")
	s, err := NewFileStore(root)
	if err != nil {
		t.Fatal(err)
	}
	etag, err := s.PutBytes(t.Context(), "j/c/shard_1/LATEST", []byte("x"), Cond{})
	if err != nil {
		t.Fatal(err)
	}
	if _, err := s.PutBytes(t.Context(), "j/c/shard_1/LATEST", []byte("y"), Cond{IfMatch: etag}); err != nil {
		t.Fatal(err) // creates the lock file
	}
	// A killed run's temporary files, with this instant's modification time.
	for _, rel := range []string{
		"j/c/shard_1/" + fileTempPrefix + "stale",
		"j/c/shard_1/sub/" + fileTempPrefix + "stale2",
		"j/c/shard_10/" + fileTempPrefix + "other",
		"j/c/" + fileTempPrefix + "parent",
		"k/" + fileTempPrefix + "elsewhere",
	} {
		fileTestWrite(t, root, rel, "partial")
	}
	data := storeTestData(40, 3<<20)
	release := storeTestHold(t, s, "j/c/shard_1/big", data)
	held := fileTempFiles(t, s)
	if got := storeTestKeys(t, s, ""); !slices.Equal(got, []string{"j/c/shard_1/LATEST"}) {
		t.Errorf("List(%q) = %q; want only [j/c/shard_1/LATEST], no temporary or lock files", "", got)
	}

	n, err := s.AbortIncomplete(t.Context(), "j/c/shard_1/")
	if err != nil || n != 2 {
		t.Errorf("AbortIncomplete(%q) = %d, %v; want 2", "j/c/shard_1/", n, err)
	}
	if err := release(); err != nil {
		t.Fatalf("PutFile(%q) held during AbortIncomplete = %v; want no error", "j/c/shard_1/big", err)
	}
	if got := storeTestDownload(t, s, "j/c/shard_1/big", int64(len(data))); !bytes.Equal(got, data) {
		t.Errorf("Download(%q) differs from what PutFile sent", "j/c/shard_1/big")
	}
	want := []string{
		"j/",
		"j/c/",
		"j/c/" + fileTempPrefix + "parent",
		"j/c/shard_1/",
		"j/c/shard_1/" + fileLockPrefix + "LATEST",
		"j/c/shard_1/LATEST",
		"j/c/shard_1/big",
		"j/c/shard_10/",
		"j/c/shard_10/" + fileTempPrefix + "other",
		"k/",
		"k/" + fileTempPrefix + "elsewhere",
	}
	if got := fileTree(t, root); !slices.Equal(got, want) {
		t.Errorf("AbortIncomplete(%q) with %q held left %q; want %q", "j/c/shard_1/", held, got, want)
	}
	if n, err := s.AbortIncomplete(t.Context(), "j/"); err != nil || n != 2 {
		t.Errorf("AbortIncomplete(%q) = %d, %v; want 2", "j/", n, err)
	}
	if len(s.temps) != 0 {
		t.Errorf("temporary files the store has open = %q; want none", s.temps)
	}
}

// TestFileStoreOwnFiles: names that start with ".spotguard-" are the store's own: never
// listed, never keys.
func TestFileStoreOwnFiles(t *testing.T) {
	root := filepath.Join(t.TempDir(), "store")
	s, err := NewFileStore(root)
	if err != nil {
		t.Fatal(err)
	}
	for _, k := range []string{"j/LATEST", "j/c/x"} {
		if _, err := s.PutBytes(t.Context(), k, []byte(k), Cond{}); err != nil {
			t.Fatal(err)
		}
	}
	for _, rel := range []string{
		"j/" + fileLockPrefix + "LATEST",
		"j/" + fileTempPrefix + "abc",
		"j/.spotguard-future",
		"j/.spotguard-dir/inside",
		".spotguard-top",
	} {
		fileTestWrite(t, root, rel, "own")
	}
	if got := storeTestKeys(t, s, ""); !slices.Equal(got, []string{"j/LATEST", "j/c/x"}) {
		t.Errorf("List(%q) = %q; want [j/LATEST j/c/x]", "", got)
	}
	for _, tc := range []struct {
		prefix   string
		wantDirs []string
		wantObjs []string
	}{
		{"", []string{"j"}, nil},
		{"j/", []string{"c"}, []string{"j/LATEST"}},
	} {
		dirs, objs, err := s.ListDir(t.Context(), tc.prefix)
		var keys []string
		for _, o := range objs {
			keys = append(keys, o.Key)
		}
		if err != nil || !slices.Equal(dirs, tc.wantDirs) || !slices.Equal(keys, tc.wantObjs) {
			t.Errorf("ListDir(%q) = %q, %q, %v; want %q, %q", tc.prefix, dirs, keys, err, tc.wantDirs, tc.wantObjs)
		}
	}
	for _, key := range []string{"j/" + fileLockPrefix + "LATEST", "j/" + fileTempPrefix + "abc", "j/.spotguard-future", ".spotguard-dir/x", "j/.spotguard-dir/inside"} {
		if _, err := s.PutBytes(t.Context(), key, []byte("x"), Cond{}); err == nil {
			t.Errorf("PutBytes(%q) = nil; want an error for a reserved name", key)
		}
		if _, _, err := s.GetBytes(t.Context(), key); err == nil || errors.Is(err, ErrNotFound) {
			t.Errorf("GetBytes(%q) = %v; want an error for a reserved name", key, err)
		}
		if err := s.Delete(t.Context(), key); err == nil {
			t.Errorf("Delete(%q) = nil; want an error for a reserved name", key)
		}
	}
	if got := fileTempFiles(t, s); !slices.Equal(got, []string{"j/" + fileTempPrefix + "abc"}) {
		t.Errorf("temporary files = %q; want [j/%sabc]", got, fileTempPrefix)
	}
}

// TestFileStoreETag: an object's ETag is the quoted hex of the first 16 bytes of its SHA-256,
// however it was written; an If-Match write creates the key's lock file next to it.
func TestFileStoreETag(t *testing.T) {
	root := filepath.Join(t.TempDir(), "store")
	s, err := NewFileStore(root)
	if err != nil {
		t.Fatal(err)
	}
	data := []byte("spotguard")
	sum := sha256.Sum256(data)
	want := `"` + hex.EncodeToString(sum[:16]) + `"`
	storeTestPut(t, s, "j/file", data)
	if _, got, err := s.GetBytes(t.Context(), "j/file"); err != nil || got != want {
		t.Errorf("GetBytes(%q) ETag = %q, %v; want %q", "j/file", got, err, want)
	}
	got, err := s.PutBytes(t.Context(), "j/file", []byte("next"), Cond{IfMatch: want})
	if err != nil || got != fileETag([]byte("next")) {
		t.Errorf("PutBytes(%q, IfMatch %s) = %q, %v; want %q", "j/file", want, got, err, fileETag([]byte("next")))
	}
	// The ETag is compared verbatim: without its quotes it does not match.
	if _, err := s.PutBytes(t.Context(), "j/file", []byte("x"), Cond{IfMatch: strings.Trim(got, `"`)}); !errors.Is(err, ErrPrecondition) {
		t.Errorf("PutBytes(%q, IfMatch without quotes) = %v; want ErrPrecondition", "j/file", err)
	}
	if fi, err := os.Lstat(filepath.Join(root, "j", fileLockPrefix+"file")); err != nil || !fi.Mode().IsRegular() {
		t.Errorf("lock file of %q = %v; want a regular file", "j/file", err)
	}
}

// TestFileStoreSymlinks: links inside the root that point outside it are never followed, for
// reading or writing.
func TestFileStoreSymlinks(t *testing.T) {
	dir := t.TempDir()
	outside := filepath.Join(dir, "outside")
	if err := os.Mkdir(outside, 0o755); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(outside, "secret"), []byte("secret"), 0o600); err != nil {
		t.Fatal(err)
	}
	root := filepath.Join(dir, "store")
	s, err := NewFileStore(root)
	if err != nil {
		t.Fatal(err)
	}
	if err := os.Symlink(outside, filepath.Join(root, "linkdir")); err != nil {
		t.Fatal(err)
	}
	if err := os.Symlink(filepath.Join(outside, "secret"), filepath.Join(root, "linkfile")); err != nil {
		t.Fatal(err)
	}
	for _, key := range []string{"linkdir/new", "linkdir/secret"} {
		if _, err := s.PutBytes(t.Context(), key, []byte("x"), Cond{}); err == nil {
			t.Errorf("PutBytes(%q) = nil; want an error", key)
		}
		if _, err := s.PutFile(t.Context(), key, storeTestFile(t, []byte("x")), 1, nil); err == nil {
			t.Errorf("PutFile(%q) = nil; want an error", key)
		}
	}
	for _, key := range []string{"linkdir/secret", "linkfile"} {
		if got, _, err := s.GetBytes(t.Context(), key); err == nil {
			t.Errorf("GetBytes(%q) = %q; want an error", key, got)
		}
		if err := s.Download(t.Context(), key, storeDiscardAt{}, 6); err == nil {
			t.Errorf("Download(%q) = nil; want an error", key)
		}
	}
	if err := s.Delete(t.Context(), "linkdir/secret"); err == nil {
		t.Errorf("Delete(%q) = nil; want an error", "linkdir/secret")
	}
	if got := storeTestKeys(t, s, ""); len(got) != 0 {
		t.Errorf("List(%q) = %q; want nothing (links are not objects)", "", got)
	}
	for _, prefix := range []string{"", "linkdir/"} {
		if dirs, objs, err := s.ListDir(t.Context(), prefix); err != nil || len(dirs)+len(objs) != 0 {
			t.Errorf("ListDir(%q) = %q, %v, %v; want nothing (links are neither objects nor directories)", prefix, dirs, objs, err)
		}
	}
	if dirs, objs, err := s.ListDir(t.Context(), "linkdir/deeper/"); err == nil && len(dirs)+len(objs) != 0 {
		t.Errorf("ListDir(%q) = %q, %v; want nothing or an error", "linkdir/deeper/", dirs, objs)
	}
	if got := fileTree(t, outside); !slices.Equal(got, []string{"secret"}) {
		t.Errorf("outside the root: %q; want only [secret]", got)
	}
	if data, err := os.ReadFile(filepath.Join(outside, "secret")); err != nil || string(data) != "secret" {
		t.Errorf("outside the root: secret = %q, %v; want it unchanged", data, err)
	}
}

func TestFileStorePutFileOverDirectory(t *testing.T) {
	s, err := NewFileStore(filepath.Join(t.TempDir(), "store"))
	if err != nil {
		t.Fatal(err)
	}
	if _, err := s.PutBytes(t.Context(), "a/b", []byte("x"), Cond{}); err != nil {
		t.Fatal(err)
	}
	if _, err := s.PutFile(t.Context(), "a", storeTestFile(t, []byte("y")), 1, nil); err == nil {
		t.Errorf("PutFile(%q) over a directory = nil; want an error", "a")
	}
	if _, err := s.PutBytes(t.Context(), "a/b/c", []byte("x"), Cond{IfAbsent: true}); err == nil || errors.Is(err, ErrExists) {
		t.Errorf("PutBytes(%q) under a file = %v; want an I/O error", "a/b/c", err)
	}
	if temps := fileTempFiles(t, s); len(temps) != 0 {
		t.Errorf("temporary files left: %q; want none", temps)
	}
}

// TestFileStoreNamedPipe: a named pipe where an object should be is refused at once, not opened
// and waited on for a writer that never comes (found from outside: a FIFO in place of a data
// object, a manifest or LATEST hung restore for good, and SIGTERM did not end it).
func TestFileStoreNamedPipe(t *testing.T) {
	for _, key := range []string{"j/LATEST", "j/step-1/" + restoreTestCommitID("step-1", restoreTestT0) + "/_spotguard/manifest.json", "j/step-1/shard.bin"} {
		t.Run(key, func(t *testing.T) {
			root := filepath.Join(t.TempDir(), "store")
			s, err := NewFileStore(root)
			if err != nil {
				t.Fatal(err)
			}
			fifo := filepath.Join(root, filepath.FromSlash(key))
			if err := os.MkdirAll(filepath.Dir(fifo), 0o755); err != nil {
				t.Fatal(err)
			}
			if err := syscall.Mkfifo(fifo, 0o644); err != nil {
				t.Skipf("mkfifo: %v", err)
			}
			calls := map[string]func() error{
				"GetBytes": func() error { _, _, err := s.GetBytes(t.Context(), key); return err },
				"Download": func() error { return s.Download(t.Context(), key, storeDiscardAt{}, 0) },
				"PutBytes IfMatch": func() error {
					_, err := s.PutBytes(t.Context(), key, []byte("x"), Cond{IfMatch: `"x"`})
					return err
				},
			}
			for name, call := range calls {
				errc := make(chan error, 1)
				go func() { errc <- call() }()
				var err error
				select {
				case err = <-errc:
				case <-time.After(10 * time.Second):
					// Let the blocked open return, so that the goroutine ends.
					w, _ := os.OpenFile(fifo, os.O_WRONLY|syscall.O_NONBLOCK, 0)
					err = <-errc
					if w != nil {
						w.Close()
					}
					t.Fatalf("%s(%q) waited on the named pipe; want an error at once (then: %v)", name, key, err)
				}
				if err == nil || !strings.Contains(err.Error(), "not a regular file") || !strings.Contains(err.Error(), key) {
					t.Errorf("%s(%q) = %v; want an error naming the key and saying it is not a regular file", name, key, err)
				}
			}
		})
	}
}

// TestFileStoreListsWhileDirectoriesGo: List and ListDir of prefixes whose directories are
// removed while they are read (retention deleting commits, which prunes their emptied
// directories) give what is there, never an error. (Found from outside: `spotguard list --check`
// on a file:// store failed with "readdirent ...: no such file or directory" while the agent's
// retention deleted commits.)
func TestFileStoreListsWhileDirectoriesGo(t *testing.T) {
	s, err := NewFileStore(t.TempDir())
	if err != nil {
		t.Fatal(err)
	}
	ctx := t.Context()
	const rounds = 300
	done := make(chan error, 1)
	go func() {
		for i := range rounds {
			keys := []string{fmt.Sprintf("job/step-%d/c/a", i%4), fmt.Sprintf("job/step-%d/c/d/b", i%4)}
			for _, k := range keys {
				if _, err := s.PutBytes(ctx, k, []byte("x"), Cond{}); err != nil {
					done <- err
					return
				}
			}
			if err := s.Delete(ctx, keys...); err != nil {
				done <- err
				return
			}
		}
		done <- nil
	}()
	for n := 0; ; n++ {
		select {
		case err := <-done:
			if err != nil {
				t.Fatal(err)
			}
			t.Logf("%d listings while %d commits came and went", n, rounds)
			return
		default:
		}
		prefix := fmt.Sprintf("job/step-%d/", n%4)
		if _, _, err := s.ListDir(ctx, prefix); err != nil {
			t.Fatalf("ListDir(%q) while its directories come and go: %v; want what is there", prefix, err)
		}
		if _, _, err := s.ListDir(ctx, prefix+"c/"); err != nil {
			t.Fatalf("ListDir(%q) while its directories come and go: %v; want what is there", prefix+"c/", err)
		}
		if _, err := s.List(ctx, "job/"); err != nil {
			t.Fatalf("List(job/) while its directories come and go: %v; want what is there", err)
		}
	}
}
