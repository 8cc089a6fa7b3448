package checkpoint

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"math/rand/v2"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/aws/aws-sdk-go-v2/aws"
	awshttp "github.com/aws/aws-sdk-go-v2/aws/transport/http"
	"github.com/aws/aws-sdk-go-v2/config"
	"github.com/aws/aws-sdk-go-v2/credentials"
)

func TestParseStoreURL(t *testing.T) {
	tests := []struct {
		url                    string
		scheme, bucket, prefix string
		wantErr                string
	}{
		{url: "s3://bucket/prefix", scheme: "s3", bucket: "bucket", prefix: "prefix"},
		{url: "s3://bucket/a/b/", scheme: "s3", bucket: "bucket", prefix: "a/b"},
		{url: "s3://bucket", scheme: "s3", bucket: "bucket"},
		{url: "s3://bucket/", scheme: "s3", bucket: "bucket"},
		{url: "file:///mnt/fsx/ckpt", scheme: "file", prefix: "/mnt/fsx/ckpt"},
		{url: "file:///mnt/fsx/ckpt/", scheme: "file", prefix: "/mnt/fsx/ckpt"},
		{url: "file:///", scheme: "file", prefix: "/"},
		{url: "s3:///prefix", wantErr: "missing bucket"},
		{url: "s3://", wantErr: "missing bucket"},
		{url: "s3://bucket/a/../b", wantErr: `".." element`},
		{url: "s3://bucket/..", wantErr: `".." element`},
		{url: "s3://bucket/a//b", wantErr: "empty element"},
		{url: `s3://bucket/a\b`, wantErr: "backslash"},
		{url: "s3://bucket/ckpt\uffff/p", wantErr: "U+FFFE or U+FFFF"},
		{url: "s3://bucket/ckpt\ufffe", wantErr: "U+FFFE or U+FFFF"},
		{url: "s3://bucket/ck\tpt", wantErr: "control character"},
		{url: "s3://bucket/ck\xffpt", wantErr: "not valid UTF-8"},
		{url: "s3://bucket/p?versionId=1", wantErr: "query"},
		{url: "s3://user@bucket/p", wantErr: `invalid bucket name "user@bucket"`},
		{url: "s3://bucket:9000/p", wantErr: "AWS_ENDPOINT_URL_S3"},
		{url: "s3://my_Legacy.bucket-1/p", scheme: "s3", bucket: "my_Legacy.bucket-1", prefix: "p"},
		{url: "file://relative/path", wantErr: "absolute path"},
		{url: "file://host/abs", wantErr: "absolute path"},
		{url: "file:relative", wantErr: "want s3://bucket/prefix or file:///path"},
		{url: "file:///a/../etc", wantErr: `".." element`},
		{url: "gs://bucket/prefix", wantErr: `unsupported scheme "gs"`},
		{url: "/abs/path", wantErr: "want s3://bucket/prefix or file:///path"},
		{url: "", wantErr: "want s3://bucket/prefix or file:///path"},
	}
	for _, tc := range tests {
		t.Run(tc.url, func(t *testing.T) {
			scheme, bucket, prefix, err := ParseStoreURL(tc.url)
			if tc.wantErr != "" {
				if err == nil || !strings.Contains(err.Error(), tc.wantErr) {
					t.Fatalf("Got(%q) = %v; want an error containing %q", tc.url, err, tc.wantErr)
				}
				return
			}
			if err != nil {
				t.Fatalf("Got(%q) = %v; want no error", tc.url, err)
			}
			got := []string{scheme, bucket, prefix}
			if want := []string{tc.scheme, tc.bucket, tc.prefix}; !slices.Equal(got, want) {
				t.Errorf("Got(%q) = %q; want %q", tc.url, got, want)
			}
		})
	}
}

func TestCheckStoreKey(t *testing.T) {
	tests := []struct {
		key string
		ok  bool
	}{
		{"a", true},
		{"job/step-1/_spotguard/manifest.json", true},
		{"job/LATEST", true},
		{"a/.hidden", true},
		{"", false},
		{"/abs", false},
		{"../x", false},
		{"a/../../x", false},
		{"a/..", false},
		{"./a", false},
		{"a//b", false},
		{"a/", false},
		{`a\b`, false},
		{"a\x00b", false},
	}
	for _, tc := range tests {
		t.Run(tc.key, func(t *testing.T) {
			if err := checkStoreKey(tc.key); (err == nil) != tc.ok {
				t.Errorf("Got(%q) = %v; want ok %v", tc.key, err, tc.ok)
			}
		})
	}
}

func TestOpenStore(t *testing.T) {
	dir := t.TempDir()
	tests := []struct {
		url     string
		opts    S3Options
		wantURL string
		wantErr string
	}{
		{url: "file://" + dir + "/store", wantURL: "file://" + dir + "/store"},
		{url: "s3://bucket/prefix/", wantURL: "s3://bucket/prefix"},
		{url: "s3://bucket", wantURL: "s3://bucket"},
		{url: "s3://bucket/p", opts: S3Options{PartSize: 5 << 20, Concurrency: 1}, wantURL: "s3://bucket/p"},
		{url: "s3://bucket/p", opts: S3Options{PartSize: 1 << 20}, wantErr: "part size"},
		{url: "s3://bucket/p", opts: S3Options{Concurrency: -1}, wantErr: "concurrency"},
		{url: "s3://bucket/p", opts: S3Options{SSE: SSES3}, wantURL: "s3://bucket/p"},
		{url: "s3://bucket/p", opts: S3Options{SSE: SSEKMS}, wantURL: "s3://bucket/p"},
		{url: "s3://bucket/p", opts: S3Options{SSE: SSEKMS, KMSKeyID: "alias/ckpt"}, wantURL: "s3://bucket/p"},
		{url: "s3://bucket/p", opts: S3Options{SSE: "aws:kms:dsse"}, wantErr: `server-side encryption "aws:kms:dsse"`},
		{url: "s3://bucket/p", opts: S3Options{SSE: SSES3, KMSKeyID: "alias/ckpt"}, wantErr: "only for server-side encryption aws:kms"},
		{url: "s3://bucket/p", opts: S3Options{KMSKeyID: "alias/ckpt"}, wantErr: "only for server-side encryption aws:kms"},
		{url: "s3://bucket/p", opts: S3Options{SSE: SSEKMS, KMSKeyID: "alias/a b"}, wantErr: `KMS key "alias/a b"`},
		{url: "ftp://x/y", wantErr: "unsupported scheme"},
	}
	for _, tc := range tests {
		t.Run(tc.url, func(t *testing.T) {
			s, err := OpenStore(tc.url, aws.Config{Region: "us-east-1"}, tc.opts)
			if tc.wantErr != "" {
				if err == nil || !strings.Contains(err.Error(), tc.wantErr) {
					t.Fatalf("Got(%q) = %v; want an error containing %q", tc.url, err, tc.wantErr)
				}
				return
			}
			if err != nil {
				t.Fatalf("Got(%q) = %v; want no error", tc.url, err)
			}
			if got := s.URL(); got != tc.wantURL {
				t.Errorf("Got(%q).URL() = %q; want %q", tc.url, got, tc.wantURL)
			}
		})
	}
	t.Run("defaults", func(t *testing.T) {
		s, err := OpenStore("s3://bucket/p", aws.Config{Region: "us-east-1"}, S3Options{})
		if err != nil {
			t.Fatal(err)
		}
		got := s.(*S3Store).opts
		if want := (S3Options{PartSize: 64 << 20, Concurrency: 16}); got != want {
			t.Errorf("Got(%q) options = %+v; want %+v", "s3://bucket/p", got, want)
		}
		if got := s.(*S3Store).Concurrency().Max; got != 16 {
			t.Errorf("Got(%q) concurrency max = %d; want 16", "s3://bucket/p", got)
		}
	})
}

// storeBackend opens fresh, empty stores of one kind for the conformance tests.
type storeBackend struct {
	// open returns a new, empty store.
	open func(t *testing.T) Store
	// leftovers returns what an interrupted write left behind in s: incomplete multipart
	// uploads, or temporary files.
	leftovers func(t *testing.T, s Store) []string
}

// TestStoreConformance runs the same behaviours against every Store backend: the file store
// always, S3 against a real versitygw, and the small-object and listing behaviours against the
// tests' memStore, so that tests using it see what the real stores do.
func TestStoreConformance(t *testing.T) {
	t.Run("mem", func(t *testing.T) {
		storeConformanceSmall(t, func(*testing.T) Store { return newMemStore() })
	})
	t.Run("file", func(t *testing.T) {
		storeConformance(t, storeBackend{
			open: func(t *testing.T) Store {
				s, err := OpenStore("file://"+filepath.Join(t.TempDir(), "store"), aws.Config{}, S3Options{})
				if err != nil {
					t.Fatal(err)
				}
				return s
			},
			leftovers: func(t *testing.T, s Store) []string { return fileTempFiles(t, s.(*FileStore)) },
		})
	})
	t.Run("s3", func(t *testing.T) {
		peer := s3StartPeer(t)
		var n atomic.Int64
		storeConformance(t, storeBackend{
			open: func(t *testing.T) Store {
				return peer.openS3(t, peer.endpoint, fmt.Sprintf("conformance/%d", n.Add(1)), S3Options{PartSize: 5 << 20, Concurrency: 4})
			},
			leftovers: func(t *testing.T, s Store) []string {
				return peer.incompleteUploads(t, s.(*S3Store).keyPrefix())
			},
		})
	})
}

// storeTestData returns n pseudo-random bytes, the same for the same seed.
func storeTestData(seed uint64, n int) []byte {
	b := make([]byte, n)
	r := rand.NewChaCha8([32]byte{byte(seed), byte(seed >> 8), byte(seed >> 16)})
	r.Read(b)
	return b
}

// storeTestFile writes data to a new file and returns it open for reading.
func storeTestFile(t testing.TB, data []byte) *os.File {
	t.Helper()
	name := filepath.Join(t.TempDir(), "src")
	if err := os.WriteFile(name, data, 0o644); err != nil {
		t.Fatal(err)
	}
	f, err := os.Open(name)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { f.Close() })
	return f
}

// storeTestWant returns the checksum of data.
func storeTestWant(t testing.TB, data []byte) Checksum {
	t.Helper()
	want, err := ChecksumOf(bytes.NewReader(data))
	if err != nil {
		t.Fatal(err)
	}
	return want
}

// storeTestDownload downloads key from s into a file and returns its content.
func storeTestDownload(t testing.TB, s Store, key string, size int64) []byte {
	t.Helper()
	name := filepath.Join(t.TempDir(), "dl")
	f, err := os.Create(name)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	if err := s.Download(t.Context(), key, f, size); err != nil {
		t.Fatalf("Download(%q) = %v; want no error", key, err)
	}
	got, err := os.ReadFile(name)
	if err != nil {
		t.Fatal(err)
	}
	return got
}

// storeTestKeys returns the keys s lists under prefix.
func storeTestKeys(t testing.TB, s Store, prefix string) []string {
	t.Helper()
	objs, err := s.List(t.Context(), prefix)
	if err != nil {
		t.Fatalf("List(%q) = %v; want no error", prefix, err)
	}
	var keys []string
	for _, o := range objs {
		keys = append(keys, o.Key)
	}
	return keys
}

// storeTestHold starts a PutFile of data to key and holds it, mid-part, at the first progress
// it reports (S3: a part's body is being read; file: the temporary file has its first MiB). It
// returns once the PutFile is held; release lets it finish and returns its error (the test's
// clean-up releases it too).
func storeTestHold(t *testing.T, s Store, key string, data []byte) (release func() error) {
	t.Helper()
	held, resume := make(chan struct{}), make(chan struct{})
	var once sync.Once
	progress := func(int64) {
		once.Do(func() { close(held) })
		<-resume
	}
	f := storeTestFile(t, data)
	finished := make(chan struct{})
	var err error
	go func() {
		defer close(finished)
		_, err = s.PutFile(context.WithoutCancel(t.Context()), key, f, int64(len(data)), progress)
	}()
	release = sync.OnceValue(func() error {
		close(resume)
		<-finished
		return err
	})
	t.Cleanup(func() { release() })
	select {
	case <-held:
	case <-finished:
		t.Fatalf("PutFile(%q) = %v before it was held", key, err)
	}
	return release
}

// storeTestPut uploads data to key and checks the checksum and the progress reported.
func storeTestPut(t testing.TB, s Store, key string, data []byte) {
	t.Helper()
	var sent atomic.Int64
	got, err := s.PutFile(t.Context(), key, storeTestFile(t, data), int64(len(data)), func(n int64) { sent.Add(n) })
	if err != nil {
		t.Fatalf("PutFile(%q) = %v; want no error", key, err)
	}
	if want := storeTestWant(t, data); got != want {
		t.Errorf("PutFile(%q) = %v; want %v", key, got, want)
	}
	if got := sent.Load(); got != int64(len(data)) {
		t.Errorf("PutFile(%q) progress = %d bytes; want %d", key, got, len(data))
	}
}

func storeConformance(t *testing.T, b storeBackend) {
	for _, size := range []int{0, 1000, 12<<20 + 123} {
		t.Run(fmt.Sprintf("PutFile/%d", size), func(t *testing.T) {
			s := b.open(t)
			data := storeTestData(uint64(size), size)
			storeTestPut(t, s, "job/c/file.bin", data)
			if got := storeTestDownload(t, s, "job/c/file.bin", int64(size)); !bytes.Equal(got, data) {
				t.Errorf("Download(%q) differs from what PutFile sent (%d bytes, want %d)", "job/c/file.bin", len(got), len(data))
			}
			objs, err := s.List(t.Context(), "job/")
			if err != nil || len(objs) != 1 || objs[0].Key != "job/c/file.bin" || objs[0].Size != int64(size) {
				t.Errorf("List(%q) = %+v, %v; want job/c/file.bin of %d bytes", "job/", objs, err, size)
			}
			if left := b.leftovers(t, s); len(left) != 0 {
				t.Errorf("Got(%q) leftovers = %q; want none", "job/c/file.bin", left)
			}
		})
	}

	t.Run("PutFile/replaces", func(t *testing.T) {
		s := b.open(t)
		storeTestPut(t, s, "k", []byte("first version"))
		second := storeTestData(2, 6<<20)
		storeTestPut(t, s, "k", second)
		if got, _, err := s.GetBytes(t.Context(), "k"); err != nil || !bytes.Equal(got, second) {
			t.Errorf("GetBytes(%q) = %d bytes, %v; want the second version", "k", len(got), err)
		}
	})

	t.Run("PutFile/short file", func(t *testing.T) {
		s := b.open(t)
		data := storeTestData(3, 1000)
		_, err := s.PutFile(t.Context(), "k", storeTestFile(t, data), 2000, nil)
		if err == nil {
			t.Fatalf("PutFile(%q) of 1000 bytes as 2000 = nil; want an error", "k")
		}
		if keys := storeTestKeys(t, s, ""); len(keys) != 0 {
			t.Errorf("List(%q) = %q; want nothing", "", keys)
		}
	})

	t.Run("PutFile/prefix of a larger file", func(t *testing.T) {
		s := b.open(t)
		data := storeTestData(4, 7<<20)
		got, err := s.PutFile(t.Context(), "k", storeTestFile(t, data), 6<<20, nil)
		if want := storeTestWant(t, data[:6<<20]); err != nil || got != want {
			t.Fatalf("PutFile(%q) = %v, %v; want %v", "k", got, err, want)
		}
		if got := storeTestDownload(t, s, "k", 6<<20); !bytes.Equal(got, data[:6<<20]) {
			t.Errorf("Download(%q) differs from the first 6 MiB", "k")
		}
	})

	for _, tc := range []struct {
		name       string
		size       int
		precancel  bool
		cancelWhen int64 // cancel once this many bytes were reported
	}{
		{name: "cancelled before", size: 12 << 20, precancel: true},
		{name: "cancelled during small", size: 1 << 20, cancelWhen: 1},
		{name: "cancelled during multipart", size: 12 << 20, cancelWhen: 1},
	} {
		t.Run("PutFile/"+tc.name, func(t *testing.T) {
			s := b.open(t)
			data := storeTestData(5, tc.size)
			ctx, cancel := context.WithCancel(t.Context())
			defer cancel()
			if tc.precancel {
				cancel()
			}
			var sent atomic.Int64
			progress := func(n int64) {
				if sent.Add(n) >= tc.cancelWhen {
					cancel()
				}
			}
			_, err := s.PutFile(ctx, "job/c/big", storeTestFile(t, data), int64(len(data)), progress)
			if !errors.Is(err, context.Canceled) {
				t.Errorf("PutFile(%q) = %v; want context.Canceled", "job/c/big", err)
			}
			if keys := storeTestKeys(t, s, ""); len(keys) != 0 {
				t.Errorf("List(%q) = %q; want nothing", "", keys)
			}
			if left := b.leftovers(t, s); len(left) != 0 {
				t.Errorf("Got(%q) leftovers = %q; want none", "job/c/big", left)
			}
		})
	}

	storeConformanceSmall(t, b.open)

	t.Run("GetBytes/missing", func(t *testing.T) {
		s := b.open(t)
		if _, err := s.PutBytes(t.Context(), "job/c/x", []byte("x"), Cond{}); err != nil {
			t.Fatal(err)
		}
		for _, key := range []string{"nope", "job/c", "job/c/x/y", "job/c/y"} {
			if _, _, err := s.GetBytes(t.Context(), key); !errors.Is(err, ErrNotFound) {
				t.Errorf("GetBytes(%q) = %v; want ErrNotFound", key, err)
			}
			if err := s.Download(t.Context(), key, storeDiscardAt{}, 1); !errors.Is(err, ErrNotFound) {
				t.Errorf("Download(%q) = %v; want ErrNotFound", key, err)
			}
		}
	})

	t.Run("Download/wrong size", func(t *testing.T) {
		s := b.open(t)
		data := storeTestData(6, 1<<20)
		storeTestPut(t, s, "k", data)
		for _, size := range []int64{0, 1<<20 - 1, 1<<20 + 1, 100 << 20} {
			err := s.Download(t.Context(), "k", storeDiscardAt{}, size)
			if err == nil || errors.Is(err, ErrNotFound) {
				t.Errorf("Download(%q, %d) of %d bytes = %v; want a size error", "k", size, len(data), err)
			}
		}
	})

	t.Run("List", func(t *testing.T) {
		s := b.open(t)
		keys := []string{"j/c1/b/c", "j/c10/x", "j/LATEST", "j/c1/a", "k/y", "j/c1/_spotguard/manifest.json", "j2"}
		for _, k := range keys {
			if _, err := s.PutBytes(t.Context(), k, []byte(k), Cond{}); err != nil {
				t.Fatalf("PutBytes(%q) = %v; want no error", k, err)
			}
		}
		tests := []struct {
			prefix string
			want   []string
		}{
			{"", []string{"j/LATEST", "j/c1/_spotguard/manifest.json", "j/c1/a", "j/c1/b/c", "j/c10/x", "j2", "k/y"}},
			{"j/", []string{"j/LATEST", "j/c1/_spotguard/manifest.json", "j/c1/a", "j/c1/b/c", "j/c10/x"}},
			{"j", []string{"j/LATEST", "j/c1/_spotguard/manifest.json", "j/c1/a", "j/c1/b/c", "j/c10/x", "j2"}},
			{"j/c1/", []string{"j/c1/_spotguard/manifest.json", "j/c1/a", "j/c1/b/c"}},
			{"j/c1", []string{"j/c1/_spotguard/manifest.json", "j/c1/a", "j/c1/b/c", "j/c10/x"}},
			{"j/c1/b/c", []string{"j/c1/b/c"}},
			{"j/c2/", nil},
			{"zzz", nil},
			{"../", nil},
		}
		for _, tc := range tests {
			if got := storeTestKeys(t, s, tc.prefix); !slices.Equal(got, tc.want) {
				t.Errorf("List(%q) = %q; want %q", tc.prefix, got, tc.want)
			}
		}
		objs, err := s.List(t.Context(), "k/")
		if err != nil || len(objs) != 1 || objs[0].Size != 3 || objs[0].LastModified.IsZero() {
			t.Errorf("List(%q) = %+v, %v; want k/y, 3 bytes, with a time", "k/", objs, err)
		}
	})

	t.Run("Delete", func(t *testing.T) {
		s := b.open(t)
		for _, k := range []string{"j/c/a", "j/c/d/e", "j/LATEST"} {
			if _, err := s.PutBytes(t.Context(), k, []byte(k), Cond{}); err != nil {
				t.Fatal(err)
			}
		}
		if err := s.Delete(t.Context(), "j/c/a", "j/c/d/e", "j/c/missing", "never/was"); err != nil {
			t.Errorf("Delete = %v; want no error", err)
		}
		if got := storeTestKeys(t, s, ""); !slices.Equal(got, []string{"j/LATEST"}) {
			t.Errorf("List(%q) after Delete = %q; want [j/LATEST]", "", got)
		}
		if err := s.Delete(t.Context()); err != nil {
			t.Errorf("Delete() = %v; want no error", err)
		}
		many := make([]string, 1500)
		for i := range many {
			many[i] = fmt.Sprintf("m/%04d", i)
		}
		for _, k := range many[:20] {
			if _, err := s.PutBytes(t.Context(), k, nil, Cond{}); err != nil {
				t.Fatal(err)
			}
		}
		if err := s.Delete(t.Context(), many...); err != nil {
			t.Errorf("Delete(1500 keys) = %v; want no error", err)
		}
		if got := storeTestKeys(t, s, "m/"); len(got) != 0 {
			t.Errorf("List(%q) after Delete = %q; want nothing", "m/", got)
		}
	})

	t.Run("hostile keys", func(t *testing.T) {
		s := b.open(t)
		f := storeTestFile(t, []byte("payload"))
		for _, key := range []string{"../x", "a/../../x", "/abs", "/etc/passwd", `a\b`, "a\x00b", "", "a//b", "./a", "a/."} {
			if _, err := s.PutFile(t.Context(), key, f, 7, nil); err == nil {
				t.Errorf("PutFile(%q) = nil; want an error", key)
			}
			if _, err := s.PutBytes(t.Context(), key, []byte("x"), Cond{}); err == nil {
				t.Errorf("PutBytes(%q) = nil; want an error", key)
			}
			if _, err := s.PutBytes(t.Context(), key, []byte("x"), Cond{IfAbsent: true}); err == nil || errors.Is(err, ErrExists) {
				t.Errorf("PutBytes(%q, ifAbsent) = %v; want a key error", key, err)
			}
			if _, _, err := s.GetBytes(t.Context(), key); err == nil || errors.Is(err, ErrNotFound) {
				t.Errorf("GetBytes(%q) = %v; want a key error", key, err)
			}
			if err := s.Download(t.Context(), key, storeDiscardAt{}, 7); err == nil || errors.Is(err, ErrNotFound) {
				t.Errorf("Download(%q) = %v; want a key error", key, err)
			}
			if err := s.Delete(t.Context(), "fine", key); err == nil {
				t.Errorf("Delete(%q) = nil; want an error", key)
			}
		}
		if keys := storeTestKeys(t, s, ""); len(keys) != 0 {
			t.Errorf("List(%q) = %q; want nothing", "", keys)
		}
	})
}

// storeConformanceSmall runs the behaviours of small objects (conditional writes, ETags),
// ListDir and AbortIncomplete's prefix rule against the stores open returns.
func storeConformanceSmall(t *testing.T, open func(t *testing.T) Store) {
	t.Run("PutBytes/ifAbsent", func(t *testing.T) {
		s := open(t)
		key := ManifestKey("job", "c", "")
		if _, err := s.PutBytes(t.Context(), key, []byte("first"), Cond{IfAbsent: true}); err != nil {
			t.Fatalf("PutBytes(%q, ifAbsent) = %v; want no error", key, err)
		}
		if _, err := s.PutBytes(t.Context(), key, []byte("second"), Cond{IfAbsent: true}); !errors.Is(err, ErrExists) {
			t.Errorf("PutBytes(%q, ifAbsent) again = %v; want ErrExists", key, err)
		}
		if got, _, err := s.GetBytes(t.Context(), key); err != nil || string(got) != "first" {
			t.Errorf("GetBytes(%q) = %q, %v; want %q", key, got, err, "first")
		}
		if _, err := s.PutBytes(t.Context(), key, []byte("third"), Cond{}); err != nil {
			t.Errorf("PutBytes(%q) = %v; want no error", key, err)
		}
		if got, _, err := s.GetBytes(t.Context(), key); err != nil || string(got) != "third" {
			t.Errorf("GetBytes(%q) = %q, %v; want %q", key, got, err, "third")
		}
		if keys := storeTestKeys(t, s, ""); !slices.Equal(keys, []string{key}) {
			t.Errorf("List(%q) = %q; want [%q]", "", keys, key)
		}
	})

	t.Run("PutBytes/ifAbsent races", func(t *testing.T) {
		s := open(t)
		const writers = 8
		errs := make([]error, writers)
		var wg sync.WaitGroup
		for i := range writers {
			wg.Go(func() {
				_, errs[i] = s.PutBytes(t.Context(), "LATEST", fmt.Appendf(nil, "writer %d", i), Cond{IfAbsent: true})
			})
		}
		wg.Wait()
		won := -1
		for i, err := range errs {
			switch {
			case err == nil && won >= 0:
				t.Errorf("PutBytes(%q, ifAbsent) by writers %d and %d = nil; want one winner", "LATEST", won, i)
			case err == nil:
				won = i
			case !errors.Is(err, ErrExists):
				t.Errorf("PutBytes(%q, ifAbsent) by writer %d = %v; want nil or ErrExists", "LATEST", i, err)
			}
		}
		if won < 0 {
			t.Fatalf("PutBytes(%q, ifAbsent) by %d writers: none won; want one", "LATEST", writers)
		}
		if got, _, err := s.GetBytes(t.Context(), "LATEST"); err != nil || string(got) != fmt.Sprintf("writer %d", won) {
			t.Errorf("GetBytes(%q) = %q, %v; want the winner's, writer %d", "LATEST", got, err, won)
		}
	})

	t.Run("PutBytes/ETag", func(t *testing.T) {
		s := open(t)
		e1, err := s.PutBytes(t.Context(), "j/LATEST", []byte("one"), Cond{})
		if err != nil || e1 == "" {
			t.Fatalf("PutBytes(%q) = %q, %v; want an ETag", "j/LATEST", e1, err)
		}
		if data, got, err := s.GetBytes(t.Context(), "j/LATEST"); err != nil || string(data) != "one" || got != e1 {
			t.Errorf("GetBytes(%q) = %q, %q, %v; want %q with the ETag PutBytes returned, %q", "j/LATEST", data, got, err, "one", e1)
		}
		e2, err := s.PutBytes(t.Context(), "j/LATEST", []byte("two"), Cond{})
		if err != nil || e2 == "" || e2 == e1 {
			t.Errorf("PutBytes(%q) of other bytes = %q, %v; want an ETag other than %q", "j/LATEST", e2, err, e1)
		}
		if _, got, err := s.GetBytes(t.Context(), "j/LATEST"); err != nil || got != e2 {
			t.Errorf("GetBytes(%q) ETag = %q, %v; want %q", "j/LATEST", got, err, e2)
		}
	})

	t.Run("PutBytes/ifMatch", func(t *testing.T) {
		s := open(t)
		const key = "j/LATEST"
		first, err := s.PutBytes(t.Context(), key, []byte("first"), Cond{IfAbsent: true})
		if err != nil {
			t.Fatal(err)
		}
		second, err := s.PutBytes(t.Context(), key, []byte("second"), Cond{IfMatch: first})
		if err != nil || second == "" {
			t.Fatalf("PutBytes(%q, IfMatch the current ETag) = %q, %v; want a new ETag", key, second, err)
		}
		if data, etag, err := s.GetBytes(t.Context(), key); err != nil || string(data) != "second" || etag != second {
			t.Errorf("GetBytes(%q) = %q, %q, %v; want %q, %q", key, data, etag, err, "second", second)
		}
		tests := []struct {
			name string
			key  string
			cond Cond
			want error // ErrPrecondition, ErrExists, or nil for another error
		}{
			{name: "stale ETag", key: key, cond: Cond{IfMatch: first}, want: ErrPrecondition},
			{name: "made-up ETag", key: key, cond: Cond{IfMatch: `"0123456789abcdef0123456789abcdef"`}, want: ErrPrecondition},
			{name: "no object", key: "j/missing", cond: Cond{IfMatch: second}, want: ErrPrecondition},
			{name: "no directory", key: "nodir/deeper/LATEST", cond: Cond{IfMatch: second}, want: ErrPrecondition},
			{name: "IfAbsent on an object", key: key, cond: Cond{IfAbsent: true}, want: ErrExists},
			{name: "both conditions", key: key, cond: Cond{IfAbsent: true, IfMatch: second}},
			{name: "both conditions, no object", key: "j/other", cond: Cond{IfAbsent: true, IfMatch: second}},
			{name: "IfMatch *", key: key, cond: Cond{IfMatch: "*"}},
		}
		for _, tc := range tests {
			t.Run(tc.name, func(t *testing.T) {
				etag, err := s.PutBytes(t.Context(), tc.key, []byte("refused"), tc.cond)
				switch {
				case tc.want != nil && !errors.Is(err, tc.want):
					t.Errorf("PutBytes(%q, %+v) = %q, %v; want %v", tc.key, tc.cond, etag, err, tc.want)
				case tc.want == nil && (err == nil || errors.Is(err, ErrPrecondition) || errors.Is(err, ErrExists)):
					t.Errorf("PutBytes(%q, %+v) = %q, %v; want an error for the Cond itself", tc.key, tc.cond, etag, err)
				case etag != "":
					t.Errorf("PutBytes(%q, %+v) ETag = %q; want none with an error", tc.key, tc.cond, etag)
				}
			})
		}
		if data, etag, err := s.GetBytes(t.Context(), key); err != nil || string(data) != "second" || etag != second {
			t.Errorf("GetBytes(%q) after refused writes = %q, %q, %v; want %q, %q", key, data, etag, err, "second", second)
		}
		if got := storeTestKeys(t, s, ""); !slices.Equal(got, []string{key}) {
			t.Errorf("List(%q) after refused writes = %q; want [%q]", "", got, key)
		}
		// A deleted object matches no ETag.
		if err := s.Delete(t.Context(), key); err != nil {
			t.Fatal(err)
		}
		if _, err := s.PutBytes(t.Context(), key, []byte("again"), Cond{IfMatch: second}); !errors.Is(err, ErrPrecondition) {
			t.Errorf("PutBytes(%q, IfMatch) after Delete = %v; want ErrPrecondition", key, err)
		}
		if _, _, err := s.GetBytes(t.Context(), key); !errors.Is(err, ErrNotFound) {
			t.Errorf("GetBytes(%q) = %v; want ErrNotFound", key, err)
		}
	})

	// Writers that read the same ETag race to move the object on; exactly one wins each round,
	// and an if-absent writer in the race always loses.
	t.Run("PutBytes/ifMatch races", func(t *testing.T) {
		s := open(t)
		const (
			key     = "j/LATEST"
			rounds  = 100
			writers = 4
		)
		etag, err := s.PutBytes(t.Context(), key, []byte("start"), Cond{IfAbsent: true})
		if err != nil {
			t.Fatal(err)
		}
		for round := range rounds {
			start := make(chan struct{})
			etags := make([]string, writers)
			errs := make([]error, writers)
			var absentErr error
			var wg sync.WaitGroup
			for i := range writers {
				wg.Go(func() {
					<-start
					etags[i], errs[i] = s.PutBytes(t.Context(), key, fmt.Appendf(nil, "round %d writer %d", round, i), Cond{IfMatch: etag})
				})
			}
			wg.Go(func() {
				<-start
				_, absentErr = s.PutBytes(t.Context(), key, []byte("absent"), Cond{IfAbsent: true})
			})
			close(start)
			wg.Wait()
			if !errors.Is(absentErr, ErrExists) {
				t.Errorf("round %d: PutBytes(%q, IfAbsent) = %v; want ErrExists", round, key, absentErr)
			}
			won := -1
			for i, err := range errs {
				switch {
				case err == nil && won >= 0:
					t.Fatalf("round %d: PutBytes(%q, IfMatch %s) by writers %d and %d = nil; want one winner", round, key, etag, won, i)
				case err == nil:
					won = i
				case !errors.Is(err, ErrPrecondition):
					t.Fatalf("round %d: PutBytes(%q, IfMatch) by writer %d = %v; want nil or ErrPrecondition", round, key, i, err)
				}
			}
			if won < 0 {
				t.Fatalf("round %d: PutBytes(%q, IfMatch %s) by %d writers: none won; want one", round, key, etag, writers)
			}
			data, got, err := s.GetBytes(t.Context(), key)
			if want := fmt.Sprintf("round %d writer %d", round, won); err != nil || string(data) != want || got != etags[won] {
				t.Fatalf("round %d: GetBytes(%q) = %q, %q, %v; want the winner's %q, %q", round, key, data, got, err, want, etags[won])
			}
			etag = got
		}
	})

	t.Run("ListDir", func(t *testing.T) {
		s := open(t)
		keys := []string{"j/c1/b/c", "j/c10/x", "j/LATEST", "j/c1/a", "k/y", "j/c1/_spotguard/manifest.json", "j2", "j/c1/b/d"}
		for _, k := range keys {
			if _, err := s.PutBytes(t.Context(), k, []byte(k), Cond{}); err != nil {
				t.Fatalf("PutBytes(%q) = %v; want no error", k, err)
			}
		}
		tests := []struct {
			prefix   string
			wantDirs []string
			wantObjs []string
		}{
			{"", []string{"j", "k"}, []string{"j2"}},
			{"j/", []string{"c1", "c10"}, []string{"j/LATEST"}},
			{"j/c1/", []string{"_spotguard", "b"}, []string{"j/c1/a"}},
			{"j/c1/b/", nil, []string{"j/c1/b/c", "j/c1/b/d"}},
			{"j/c2/", nil, nil},
			{"j2/", nil, nil},
			{"j/LATEST/", nil, nil},
		}
		for _, tc := range tests {
			dirs, objs, err := s.ListDir(t.Context(), tc.prefix)
			if err != nil {
				t.Errorf("ListDir(%q) = %v; want no error", tc.prefix, err)
				continue
			}
			var keys []string
			for _, o := range objs {
				keys = append(keys, o.Key)
				if o.Size != int64(len(o.Key)) {
					t.Errorf("ListDir(%q) size of %q = %d; want %d", tc.prefix, o.Key, o.Size, len(o.Key))
				}
			}
			if !slices.Equal(dirs, tc.wantDirs) || !slices.Equal(keys, tc.wantObjs) {
				t.Errorf("ListDir(%q) = %q, %q; want %q, %q", tc.prefix, dirs, keys, tc.wantDirs, tc.wantObjs)
			}
		}
		for _, prefix := range []string{"j", "j/c1", "/", "/j/", "j//", "../", "./", "j/../"} {
			if dirs, objs, err := s.ListDir(t.Context(), prefix); err == nil {
				t.Errorf("ListDir(%q) = %q, %v, nil; want an error", prefix, dirs, objs)
			}
		}
	})

	t.Run("AbortIncomplete/prefix", func(t *testing.T) {
		s := open(t)
		for _, prefix := range []string{"", "j", "j/c/shard_1", "/j/", "j//", "../", "/"} {
			if n, err := s.AbortIncomplete(t.Context(), prefix); err == nil {
				t.Errorf("AbortIncomplete(%q) = %d, nil; want an error", prefix, n)
			}
		}
		if n, err := s.AbortIncomplete(t.Context(), "j/c/shard_1/"); err != nil || n != 0 {
			t.Errorf("AbortIncomplete(%q) = %d, %v; want 0, nil", "j/c/shard_1/", n, err)
		}
	})
}

// storeDiscardAt is an io.WriterAt that drops what it gets.
type storeDiscardAt struct{}

func (storeDiscardAt) WriteAt(p []byte, _ int64) (int, error) { return len(p), nil }

// TestOpenStoreEndpointFromEnv: an endpoint set the SDK's way (AWS_ENDPOINT_URL_S3) works with
// a local server, which needs path-style addressing.
func TestOpenStoreEndpointFromEnv(t *testing.T) {
	peer := s3StartPeer(t)
	for k, v := range map[string]string{
		"AWS_ENDPOINT_URL_S3":         strings.Replace(peer.endpoint, "127.0.0.1", "localhost", 1),
		"AWS_ENDPOINT_URL":            "",
		"AWS_ACCESS_KEY_ID":           s3PeerAccess,
		"AWS_SECRET_ACCESS_KEY":       s3PeerSecret,
		"AWS_SESSION_TOKEN":           "",
		"AWS_REGION":                  "us-east-1",
		"AWS_PROFILE":                 "",
		"AWS_CONFIG_FILE":             filepath.Join(t.TempDir(), "none"),
		"AWS_SHARED_CREDENTIALS_FILE": filepath.Join(t.TempDir(), "none"),
		"AWS_EC2_METADATA_DISABLED":   "true",
	} {
		t.Setenv(k, v)
	}
	cfg, err := config.LoadDefaultConfig(t.Context())
	if err != nil {
		t.Fatal(err)
	}
	if cfg.BaseEndpoint != nil {
		t.Fatalf("Got(%q) BaseEndpoint = %q; want nil (the S3 endpoint is resolved by the S3 client)", "AWS_ENDPOINT_URL_S3", *cfg.BaseEndpoint)
	}
	cfg.HTTPClient = s3TestConfig(t, peer.endpoint).HTTPClient // closed when the test ends
	s, err := OpenStore("s3://"+peer.bucket+"/env", cfg, S3Options{})
	if err != nil {
		t.Fatal(err)
	}
	if _, err := s.PutBytes(t.Context(), "j/LATEST", []byte("env"), Cond{IfAbsent: true}); err != nil {
		t.Fatalf("PutBytes(%q) = %v; want no error", "j/LATEST", err)
	}
	if got, _, err := s.GetBytes(t.Context(), "j/LATEST"); err != nil || string(got) != "env" {
		t.Errorf("GetBytes(%q) = %q, %v; want %q", "j/LATEST", got, err, "env")
	}
}

// TestS3ClientKeepsAConnectionPerRequest: the client keeps as many idle connections as requests
// may be in flight, with the SDK's default client and with the one the SDK's config builds for
// AWS_CA_BUNDLE; a client the caller made is left alone, but for the watch on its answers.
func TestS3ClientKeepsAConnectionPerRequest(t *testing.T) {
	own := &http.Client{}
	for _, tc := range []struct {
		name string
		in   aws.HTTPClient
		want int // MaxIdleConnsPerHost; -1: the caller's client, untouched
	}{
		{"no client", nil, 64},
		{"the SDK's, as AWS_CA_BUNDLE makes it", awshttp.NewBuildableClient(), 64},
		{"the caller's", own, -1},
	} {
		c := s3NewClient(aws.Config{Region: "us-east-1", HTTPClient: tc.in}, 64)
		// Every client's answers are watched for a body that stalls.
		sc, ok := c.Options().HTTPClient.(stallingClient)
		if !ok {
			t.Fatalf("Got(%q) client = %T; want its answers' bodies watched (stallingClient)", tc.name, c.Options().HTTPClient)
		}
		got := sc.c
		if tc.want < 0 {
			if got != own {
				t.Errorf("Got(%q) client = %T; want the caller's", tc.name, got)
			}
			continue
		}
		bc, ok := got.(*awshttp.BuildableClient)
		if !ok {
			t.Fatalf("Got(%q) client = %T; want *BuildableClient", tc.name, got)
		}
		if n := bc.GetTransport().MaxIdleConnsPerHost; n != tc.want {
			t.Errorf("Got(%q) MaxIdleConnsPerHost = %d; want %d", tc.name, n, tc.want)
		}
	}
}

// firstRequestHangs starts a server whose first request is never answered and whose others
// are answered "ok", and returns an AWS config for it and the count of requests it got.
func firstRequestHangs(t *testing.T) (aws.Config, func() int) {
	var mu sync.Mutex
	requests := 0
	release := make(chan struct{})
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		mu.Lock()
		requests++
		n := requests
		mu.Unlock()
		if n == 1 {
			select { // the first request hangs
			case <-release:
			case <-r.Context().Done():
			}
			return
		}
		w.Header().Set("ETag", `"e1"`)
		w.Header().Set("Content-Length", "2")
		w.Write([]byte("ok"))
	}))
	t.Cleanup(srv.Close)
	t.Cleanup(func() { close(release) })
	cfg := aws.Config{Region: "us-east-1", BaseEndpoint: aws.String(srv.URL),
		Credentials: aws.NewCredentialsCache(credentials.NewStaticCredentialsProvider("k", "s", ""))}
	return cfg, func() int {
		mu.Lock()
		defer mu.Unlock()
		return requests
	}
}

// A request the store accepts and never answers is given up after s3ResponseHeaderTimeout and
// retried, on the SDK's own client: it does not hold the caller for as long as the connection
// lives (a route that drops packets, a server that hangs).
func TestS3ClientGivesUpOnARequestNeverAnswered(t *testing.T) {
	defer func(d time.Duration) { s3ResponseHeaderTimeout = d }(s3ResponseHeaderTimeout)
	s3ResponseHeaderTimeout = 200 * time.Millisecond
	cfg, requests := firstRequestHangs(t)
	s, err := OpenStore("s3://bucket/p", cfg, S3Options{})
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(t.Context(), 20*time.Second)
	defer cancel()
	got, _, err := s.GetBytes(ctx, "j/LATEST")
	if err != nil || string(got) != "ok" {
		t.Fatalf("GetBytes with the first request never answered = %q, %v; want the retry's answer", got, err)
	}
	if n := requests(); n != 2 {
		t.Errorf("requests = %d; want 2 (one never answered, one retried)", n)
	}
}

// TestS3StoreTellsOfEveryFailedAttempt: a request the store never answers is retried by the SDK
// for minutes before the caller hears of it; OnAttemptError hears of each failed attempt as it
// fails (the agent has the store probed then), and a timeout is one the limiter backs off from.
func TestS3StoreTellsOfEveryFailedAttempt(t *testing.T) {
	defer func(d time.Duration) { s3ResponseHeaderTimeout = d }(s3ResponseHeaderTimeout)
	s3ResponseHeaderTimeout = 200 * time.Millisecond
	cfg, _ := firstRequestHangs(t)
	st, err := OpenStore("s3://bucket/p", cfg, S3Options{})
	if err != nil {
		t.Fatal(err)
	}
	s := st.(*S3Store)
	failed := make(chan error, 10)
	s.OnAttemptError(func(err error) { failed <- err })
	if _, _, err := s.GetBytes(t.Context(), "j/LATEST"); err != nil {
		t.Fatalf("GetBytes: %v; want the retry's answer", err)
	}
	select {
	case err := <-failed:
		if !limiterBackOff(err) {
			t.Errorf("the limiter does not back off from an attempt never answered: %v", err)
		}
	default:
		t.Fatal("the attempt never answered was not told of")
	}
	if len(failed) != 0 {
		t.Errorf("%d more failed attempts told of; want 1", len(failed))
	}
	// A request the caller cancels is not the store's failure.
	ctx, cancel := context.WithCancel(t.Context())
	cancel()
	s.GetBytes(ctx, "j/LATEST")
	if len(failed) != 0 {
		t.Errorf("a cancelled request was told of as a failed attempt: %v", <-failed)
	}
}
