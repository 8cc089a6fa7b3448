package checkpoint

import (
	"bytes"
	"context"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"maps"
	"math/rand/v2"
	"os"
	"path/filepath"
	"runtime"
	"slices"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/rs/zerolog"
)

// restoreTestJob is the job of every restore and list test.
const restoreTestJob = "llama-70b"

// restoreTestT0 is the commit time of the tests' first checkpoint.
var restoreTestT0 = time.Date(2026, 3, 1, 12, 0, 0, 0, time.UTC)

// restoreTestFiles returns a checkpoint's files: several, nested, one empty, one large enough
// for several ranged writes, all different per seed.
func restoreTestFiles(seed uint64) map[string]string {
	r := rand.New(rand.NewPCG(seed, seed))
	big := make([]byte, 300_000+int(seed))
	for i := range big {
		big[i] = byte(r.Uint32())
	}
	return map[string]string{
		"model.pt":                   string(big),
		"optim/__0_0.distcp":         strings.Repeat("rank0 ", 1000+int(seed)),
		"optim/deep/er/__1_0.distcp": "rank1",
		"empty":                      "",
		".metadata":                  "metadata of step " + string(rune('0'+seed%10)),
	}
}

// restoreTestCommitID returns the commit id the fixtures give checkpoint cp committed at at.
func restoreTestCommitID(cp string, at time.Time) string {
	sum := sha256.Sum256([]byte(cp + at.String()))
	return at.UTC().Format(commitIDTime) + "-" + hex.EncodeToString(sum[:6])
}

// restoreTestManifest returns a valid manifest of files, completed and committed at at, in commit
// restoreTestCommitID(cp, at).
func restoreTestManifest(t testing.TB, job, cp string, at time.Time, files map[string]string) *Manifest {
	t.Helper()
	complete := at
	m := &Manifest{Version: ManifestVersion, Job: job, Checkpoint: cp, Commit: restoreTestCommitID(cp, at), Trigger: "periodic",
		CommittedAt: at, Timings: Timings{CompleteAt: &complete}}
	for _, p := range slices.Sorted(maps.Keys(files)) {
		sum, err := ChecksumOf(strings.NewReader(files[p]))
		if err != nil {
			t.Fatal(err)
		}
		m.Files = append(m.Files, File{Path: p, Key: DataKey(job, cp, m.Commit, p), Size: int64(len(files[p])), Mode: "0644", Checksum: sum})
		m.TotalBytes += int64(len(files[p]))
	}
	if err := m.Validate(); err != nil {
		t.Fatalf("test manifest is invalid: %v", err)
	}
	return m
}

// restoreTestCommit stores files and then the manifest of checkpoint cp of job, as the uploader
// does, and returns the manifest. LATEST is not touched.
func restoreTestCommit(t testing.TB, s *memStore, job, cp string, at time.Time, files map[string]string) *Manifest {
	t.Helper()
	m := restoreTestManifest(t, job, cp, at, files)
	for _, f := range m.Files {
		s.put(f.Key, []byte(files[f.Path]))
	}
	restoreTestPutJSON(t, s, ManifestKey(job, cp, m.Commit), m)
	return m
}

// restoreTestCommitTo is restoreTestCommit for any store: it writes files and then the manifest
// with PutBytes. LATEST is not touched.
func restoreTestCommitTo(t testing.TB, s Store, job, cp string, at time.Time, files map[string]string) *Manifest {
	t.Helper()
	m := restoreTestManifest(t, job, cp, at, files)
	for _, f := range m.Files {
		if _, err := s.PutBytes(t.Context(), f.Key, []byte(files[f.Path]), Cond{}); err != nil {
			t.Fatal(err)
		}
	}
	data, err := json.Marshal(m)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := s.PutBytes(t.Context(), ManifestKey(job, cp, m.Commit), data, Cond{IfAbsent: true}); err != nil {
		t.Fatal(err)
	}
	return m
}

// restoreTestCommitV1 stores files and a version 1 manifest (the layout before commit ids) of
// checkpoint cp of job, and returns the manifest.
func restoreTestCommitV1(t testing.TB, s *memStore, job, cp string, at time.Time, files map[string]string) *Manifest {
	t.Helper()
	m := &Manifest{Version: 1, Job: job, Checkpoint: cp, Trigger: "periodic", CommittedAt: at}
	for _, p := range slices.Sorted(maps.Keys(files)) {
		sum, _ := ChecksumOf(strings.NewReader(files[p]))
		m.Files = append(m.Files, File{Path: p, Size: int64(len(files[p])), Checksum: sum})
		m.TotalBytes += int64(len(files[p]))
		s.put(DataKey(job, cp, "", p), []byte(files[p]))
	}
	if err := m.Validate(); err != nil {
		t.Fatalf("test manifest is invalid: %v", err)
	}
	restoreTestPutJSON(t, s, ManifestKey(job, cp, ""), m)
	return m
}

// restoreTestPutJSON stores v as JSON at key, whatever it holds.
func restoreTestPutJSON(t testing.TB, s *memStore, key string, v any) {
	t.Helper()
	data, err := json.Marshal(v)
	if err != nil {
		t.Fatal(err)
	}
	s.put(key, data)
}

// restoreTestSetLatest points the job's LATEST at the newest commit of cp in s (at cp with no
// commit, a version 1 LATEST, when s has none).
func restoreTestSetLatest(t testing.TB, s *memStore, job, cp string) {
	t.Helper()
	l := Latest{Checkpoint: cp, CommittedAt: restoreTestT0}
	s.mu.Lock()
	var best *Manifest
	for k, data := range s.objs {
		if !strings.HasPrefix(k, job+"/"+cp+"/") || !strings.HasSuffix(k, "/"+MetaDir+"/manifest.json") {
			continue
		}
		if m, err := ParseManifest(data); err == nil && m.Checkpoint == cp && (best == nil || m.Order().After(best.Order())) {
			best = m
		}
	}
	s.mu.Unlock()
	if best != nil && best.Version == ManifestVersion {
		at := best.Order().At
		l = Latest{Version: ManifestVersion, Checkpoint: cp, Commit: best.Commit, CompleteAt: &at, CommittedAt: best.CommittedAt}
	}
	restoreTestPutJSON(t, s, LatestKey(job), l)
}

// restoreTestTree returns everything under dir (not following symlinks): files as
// "file:<content>", directories as "dir", symlinks as "symlink:<target>". A missing dir is an
// empty tree.
func restoreTestTree(t *testing.T, dir string) map[string]string {
	t.Helper()
	tree := map[string]string{}
	err := filepath.WalkDir(dir, func(p string, d fs.DirEntry, err error) error {
		if errors.Is(err, fs.ErrNotExist) && p == dir {
			return fs.SkipAll
		}
		if err != nil {
			return err
		}
		rel, err := filepath.Rel(dir, p)
		if err != nil {
			return err
		}
		rel = filepath.ToSlash(rel)
		switch {
		case rel == ".":
		case d.IsDir():
			tree[rel] = "dir"
		case d.Type()&fs.ModeSymlink != 0:
			target, err := os.Readlink(p)
			if err != nil {
				return err
			}
			tree[rel] = "symlink:" + target
		default:
			data, err := os.ReadFile(p)
			if err != nil {
				return err
			}
			tree[rel] = "file:" + string(data)
		}
		return nil
	})
	if err != nil {
		t.Fatalf("walk %s: %v", dir, err)
	}
	return tree
}

// restoreTestWant is the tree that files make under a directory.
func restoreTestWant(files map[string]string) map[string]string {
	tree := map[string]string{}
	for p, data := range files {
		tree[p] = "file:" + data
		for d := filepath.ToSlash(filepath.Dir(p)); d != "."; d = filepath.ToSlash(filepath.Dir(d)) {
			tree[d] = "dir"
		}
	}
	return tree
}

// restoreTestDiff describes how two trees differ, for failure messages ("" if equal).
func restoreTestDiff(got, want map[string]string) string {
	var b strings.Builder
	for _, k := range slices.Sorted(maps.Keys(got)) {
		if w, ok := want[k]; !ok {
			b.WriteString("\n  extra " + k)
		} else if got[k] != w {
			b.WriteString("\n  differs " + k)
		}
	}
	for _, k := range slices.Sorted(maps.Keys(want)) {
		if _, ok := got[k]; !ok {
			b.WriteString("\n  missing " + k)
		}
	}
	return b.String()
}

// restoreTestDirs returns a parent directory and the destination To inside it (created, empty).
func restoreTestDirs(t *testing.T) (parent, to string) {
	t.Helper()
	parent = t.TempDir()
	to = filepath.Join(parent, "restore")
	if err := os.Mkdir(to, 0o755); err != nil {
		t.Fatal(err)
	}
	return parent, to
}

// restoreTestOpts returns options for restoring the test job into to, logging into log.
func restoreTestOpts(to string, log *bytes.Buffer) RestoreOptions {
	return RestoreOptions{Job: restoreTestJob, To: to, Logger: zerolog.New(log)}
}

func TestRestoreLatest(t *testing.T) {
	hs := &hurriedStore{memStore: newMemStore()}
	s := hs.memStore
	restoreTestCommit(t, s, restoreTestJob, "step-000100", restoreTestT0, restoreTestFiles(1))
	files := restoreTestFiles(2)
	m := restoreTestCommit(t, s, restoreTestJob, "step-000200", restoreTestT0.Add(time.Hour), files)
	restoreTestSetLatest(t, s, restoreTestJob, "step-000200")
	_, to := restoreTestDirs(t)

	var mu sync.Mutex
	var calls [][2]int64
	var log bytes.Buffer
	opts := restoreTestOpts(to, &log)
	opts.Concurrency = 2
	opts.Progress = func(done, total int64) {
		mu.Lock()
		defer mu.Unlock()
		calls = append(calls, [2]int64{done, total})
	}
	res, err := Restore(t.Context(), hs, opts)
	if err != nil {
		t.Fatalf("Restore() error: %v", err)
	}
	want := RestoreResult{
		Checkpoint: "step-000200",
		Commit:     m.Commit,
		Dir:        filepath.Join(to, "step-000200"),
		Files:      len(files),
		Bytes:      m.TotalBytes,
		Elapsed:    res.Elapsed,
	}
	if res != want {
		t.Errorf("Got(%q) = %+v; want %+v", "result", res, want)
	}
	if hs.hurries.Load() == 0 {
		t.Error("the restore did not hurry the store (its concurrency would start low)")
	}
	if d := restoreTestDiff(restoreTestTree(t, res.Dir), restoreTestWant(files)); d != "" {
		t.Errorf("restored tree differs from the checkpoint:%s", d)
	}
	if got := restoreTestNames(t, to); !slices.Equal(got, []string{"step-000200"}) {
		t.Errorf("Got(%q) = %q; want %q (no staging directory left)", to, got, []string{"step-000200"})
	}

	mu.Lock()
	defer mu.Unlock()
	if len(calls) < 2 || calls[0] != [2]int64{0, m.TotalBytes} || calls[len(calls)-1] != [2]int64{m.TotalBytes, m.TotalBytes} {
		t.Fatalf("Got(%q) = %v; want from [0 %d] to [%d %d]", "progress", calls, m.TotalBytes, m.TotalBytes, m.TotalBytes)
	}
	for i := 1; i < len(calls); i++ {
		if calls[i][0] < calls[i-1][0] {
			t.Errorf("Got(%q) = %v after %v; want done never to decrease", "progress", calls[i], calls[i-1])
		}
	}
	if !strings.Contains(log.String(), `"message":"checkpoint restored"`) {
		t.Errorf("Got(%q) = %s; want the summary line", "log", log.String())
	}
}

func TestRestoreExplicitCheckpoint(t *testing.T) {
	s := newMemStore()
	old := restoreTestFiles(1)
	restoreTestCommit(t, s, restoreTestJob, "step-000100", restoreTestT0, old)
	restoreTestCommit(t, s, restoreTestJob, "step-000200", restoreTestT0.Add(time.Hour), restoreTestFiles(2))
	restoreTestSetLatest(t, s, restoreTestJob, "step-000200")
	_, to := restoreTestDirs(t)

	var log bytes.Buffer
	opts := restoreTestOpts(to, &log)
	opts.Checkpoint = "step-000100"
	res, err := Restore(t.Context(), s, opts)
	if err != nil {
		t.Fatalf("Restore() error: %v", err)
	}
	if res.Checkpoint != "step-000100" || res.FellBack {
		t.Errorf("Got(%q) = %q, FellBack %v; want %q, false", "checkpoint", res.Checkpoint, res.FellBack, "step-000100")
	}
	if got := restoreTestNames(t, to); !slices.Equal(got, []string{"step-000100"}) {
		t.Errorf("Got(%q) = %q; want %q", to, got, []string{"step-000100"})
	}
	if d := restoreTestDiff(restoreTestTree(t, res.Dir), restoreTestWant(old)); d != "" {
		t.Errorf("restored tree differs from the checkpoint:%s", d)
	}
}

func TestRestoreExplicitCheckpointMissing(t *testing.T) {
	s := newMemStore()
	restoreTestCommit(t, s, restoreTestJob, "step-000100", restoreTestT0, restoreTestFiles(1))
	restoreTestSetLatest(t, s, restoreTestJob, "step-000100")
	// Data without a manifest: the checkpoint does not exist.
	s.put(DataKey(restoreTestJob, "step-000200", restoreTestCommitID("step-000200", restoreTestT0), "model.pt"), []byte("orphan"))
	parent, to := restoreTestDirs(t)
	before := restoreTestTree(t, parent)

	var log bytes.Buffer
	opts := restoreTestOpts(to, &log)
	opts.Checkpoint = "step-000200"
	_, err := Restore(t.Context(), s, opts)
	if err == nil {
		t.Fatal("Restore() succeeded; want an error")
	}
	for _, want := range []string{`"step-000200"`, "mem://bucket/prefix", restoreTestJob, "no valid manifest"} {
		if !strings.Contains(err.Error(), want) {
			t.Errorf("Got(%q) = %v; want it to contain %q", "error", err, want)
		}
	}
	if !errors.Is(err, ErrNotFound) || errors.Is(err, ErrNothingToRestore) {
		t.Errorf("Got(%q) = %v; want ErrNotFound, not ErrNothingToRestore", "error", err)
	}
	if d := restoreTestDiff(restoreTestTree(t, parent), before); d != "" {
		t.Errorf("the restore changed the file system:%s", d)
	}
}

func TestRestoreFallback(t *testing.T) {
	tests := []struct {
		name  string
		setup func(t *testing.T, s *memStore)
	}{
		{"LATEST missing", func(t *testing.T, s *memStore) {}},
		{"LATEST not JSON", func(t *testing.T, s *memStore) {
			s.put(LatestKey(restoreTestJob), []byte("step-000300"))
		}},
		{"LATEST names a path", func(t *testing.T, s *memStore) {
			restoreTestSetLatest(t, s, restoreTestJob, "../other-job/step-1")
		}},
		{"LATEST empty object", func(t *testing.T, s *memStore) {
			s.put(LatestKey(restoreTestJob), []byte("{}"))
		}},
		{"LATEST names a checkpoint without manifest", func(t *testing.T, s *memStore) {
			s.put(DataKey(restoreTestJob, "step-000300", restoreTestCommitID("step-000300", restoreTestT0), "model.pt"), []byte("torn"))
			restoreTestSetLatest(t, s, restoreTestJob, "step-000300")
		}},
		{"LATEST missing, and an older commit's manifest is unusable", func(t *testing.T, s *memStore) {
			// A commit that began before the newest usable one is older: it does not stop the
			// restore of the newest.
			s.put(ManifestKey(restoreTestJob, "step-000050", restoreTestCommitID("step-000050", restoreTestT0.Add(-time.Hour))), []byte("{"))
		}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			s := newMemStore()
			restoreTestCommit(t, s, restoreTestJob, "step-000100", restoreTestT0, restoreTestFiles(1))
			// The newest by completion time, although not the greatest name.
			newest := restoreTestFiles(2)
			restoreTestCommit(t, s, restoreTestJob, "latest-run-b", restoreTestT0.Add(time.Hour), newest)
			tt.setup(t, s)
			_, to := restoreTestDirs(t)

			var log bytes.Buffer
			res, err := Restore(t.Context(), s, restoreTestOpts(to, &log))
			if err != nil {
				t.Fatalf("Restore() error: %v", err)
			}
			if res.Checkpoint != "latest-run-b" || !res.FellBack {
				t.Errorf("Got(%q) = %q, FellBack %v; want %q, true", tt.name, res.Checkpoint, res.FellBack, "latest-run-b")
			}
			if d := restoreTestDiff(restoreTestTree(t, res.Dir), restoreTestWant(newest)); d != "" {
				t.Errorf("restored tree differs from the checkpoint:%s", d)
			}
			if !strings.Contains(log.String(), "LATEST is missing or unusable") {
				t.Errorf("Got(%q) = %s; want a warning that LATEST is unusable", "log", log.String())
			}
		})
	}
}

func TestRestoreNothingToRestore(t *testing.T) {
	tests := []struct {
		name  string
		setup func(t *testing.T, s *memStore)
	}{
		{"empty store", func(t *testing.T, s *memStore) {}},
		// A first run killed before its first commit. (With a LATEST, the job had a commit:
		// not nothing to restore, TestRestoreAllowEmptyRefusesAJobWhoseCommitsAreGone.)
		{"data without manifest", func(t *testing.T, s *memStore) {
			s.put(DataKey(restoreTestJob, "step-000100", restoreTestCommitID("step-000100", restoreTestT0), "model.pt"), []byte("torn"))
		}},
		{"only another job", func(t *testing.T, s *memStore) {
			restoreTestCommit(t, s, "other-job", "step-000100", restoreTestT0, restoreTestFiles(1))
			restoreTestSetLatest(t, s, "other-job", "step-000100")
		}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			s := newMemStore()
			tt.setup(t, s)
			parent := t.TempDir()
			var log bytes.Buffer
			_, err := Restore(t.Context(), s, restoreTestOpts(filepath.Join(parent, "restore"), &log))
			if !errors.Is(err, ErrNothingToRestore) {
				t.Fatalf("Got(%q) = %v; want ErrNothingToRestore", tt.name, err)
			}
			if want := "no complete checkpoint of job " + restoreTestJob + " in mem://bucket/prefix"; !strings.HasPrefix(err.Error(), want) {
				t.Errorf("Got(%q) = %q; want it to start with %q", tt.name, err, want)
			}
			if d := restoreTestDiff(restoreTestTree(t, parent), map[string]string{}); d != "" {
				t.Errorf("the restore changed the file system:%s", d)
			}
		})
	}
}

func TestRestoreRefusesHostileManifest(t *testing.T) {
	tests := []struct {
		name   string
		mutate func(m *Manifest)
		want   string
	}{
		{"parent path", func(m *Manifest) { m.Files[0].Path = "../x" }, `"../x" has a ".." element`},
		{"absolute path", func(m *Manifest) { m.Files[0].Path = "/etc/passwd" }, `"/etc/passwd" is absolute`},
		{"escape through a subdirectory", func(m *Manifest) { m.Files[0].Path = "a/../../b" }, `"a/../../b" is not clean`},
		{"backslash", func(m *Manifest) { m.Files[0].Path = `..\..\x` }, "backslash"},
		{"duplicate path", func(m *Manifest) {
			m.Files[1] = m.Files[0]
			m.TotalBytes = 2 * m.Files[0].Size
		}, "listed twice"},
		{"job mismatch", func(m *Manifest) {
			m.Job = "other-job"
			for i := range m.Files {
				m.Files[i].Key = "other-job" + strings.TrimPrefix(m.Files[i].Key, restoreTestJob)
			}
		}, `names job "other-job"`},
		{"key outside the job", func(m *Manifest) { m.Files[0].Key = "other-job/step-1/x" }, "is not a key inside job"},
		// Another commit's object (found from outside): that commit's retention deletes it.
		{"key in another commit", func(m *Manifest) {
			m.Files[0].Key = restoreTestJob + "/step-000099/20260301T110000Z-0123456789ab/model.pt"
		}, "is not under the commit's prefix"},
		{"setuid mode", func(m *Manifest) { m.Files[0].Mode = "4755" }, "not octal permission bits"},
		{"checkpoint mismatch", func(m *Manifest) { m.Checkpoint = "step-999999" }, `checkpoint "step-999999"`},
		{"spotguard's own directory", func(m *Manifest) { m.Files[0].Path = MetaDir + "/manifest.json" }, "inside _spotguard"},
		{"spotguard's own file", func(m *Manifest) { m.Files[0].Path = "sub/.spotguard-restore-1-abc" }, "are spotguard's own files"},
		{"file and directory", func(m *Manifest) { m.Files[0].Path = "a"; m.Files[1].Path = "a/b" }, "also a directory"},
		{"negative size", func(m *Manifest) { m.Files[0].Size = -1; m.TotalBytes = m.Files[1].Size - 1 }, "negative size"},
		{"unknown checksum", func(m *Manifest) { m.Files[0].Checksum.Algorithm = "MD5" }, "unsupported checksum"},
		{"checksum without a value", func(m *Manifest) { m.Files[0].Checksum.Value = "" }, "checksum CRC32C without a value"},
		{"total does not add up", func(m *Manifest) { m.TotalBytes++ }, "total_bytes"},
		{"unknown version", func(m *Manifest) { m.Version = 3 }, "version 3"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			s := newMemStore()
			files := map[string]string{"model.pt": "weights", "optim.pt": "state"}
			m := restoreTestCommit(t, s, restoreTestJob, "step-000100", restoreTestT0, files)
			tt.mutate(m)
			restoreTestPutJSON(t, s, ManifestKey(restoreTestJob, "step-000100", restoreTestCommitID("step-000100", restoreTestT0)), m)
			restoreTestSetLatest(t, s, restoreTestJob, "step-000100")
			parent, to := restoreTestDirs(t)
			before := restoreTestTree(t, parent)

			var log bytes.Buffer
			opts := restoreTestOpts(to, &log)
			opts.Checkpoint = "step-000100"
			_, err := Restore(t.Context(), s, opts)
			if err == nil || !strings.Contains(err.Error(), tt.want) || !strings.Contains(err.Error(), "mem://bucket/prefix") {
				t.Errorf("Got(%q) = %v; want an error naming the store and containing %q", tt.name, err, tt.want)
			}
			if d := restoreTestDiff(restoreTestTree(t, parent), before); d != "" {
				t.Errorf("the restore changed the file system:%s", d)
			}
			if got := s.downloaded(); len(got) != 0 {
				t.Errorf("Got(%q) = %q; want no downloads", "downloads", got)
			}

			// Through LATEST, the newest commit's manifest cannot be used: a refusal, never
			// "nothing to restore" (with --allow-empty the trainer would start from scratch).
			opts.Checkpoint = ""
			if _, err := Restore(t.Context(), s, opts); !errors.Is(err, ErrUnusableManifest) || errors.Is(err, ErrNothingToRestore) || !strings.Contains(err.Error(), tt.want) {
				t.Errorf("Got(%q) = %v; want ErrUnusableManifest containing %q", tt.name+" via LATEST", err, tt.want)
			}
			if d := restoreTestDiff(restoreTestTree(t, parent), before); d != "" {
				t.Errorf("the restore changed the file system:%s", d)
			}
		})
	}
}

func TestRestoreDownloadFailures(t *testing.T) {
	errBoom := errors.New("boom")
	files := restoreTestFiles(1)
	key := func(p string) string {
		return DataKey(restoreTestJob, "step-000100", restoreTestCommitID("step-000100", restoreTestT0), p)
	}
	wrongSum, err := ChecksumOf(strings.NewReader("something else"))
	if err != nil {
		t.Fatal(err)
	}
	corrupted := []byte(files["model.pt"])
	corrupted[len(corrupted)/2] ^= 0x01
	corruptSum, err := ChecksumOf(bytes.NewReader(corrupted))
	if err != nil {
		t.Fatal(err)
	}
	goodSum, err := ChecksumOf(strings.NewReader(files["model.pt"]))
	if err != nil {
		t.Fatal(err)
	}

	tests := []struct {
		name   string
		setup  func(s *memStore, m *Manifest)
		is     error
		wants  []string
		cancel bool
	}{
		{"data missing", func(s *memStore, m *Manifest) { s.remove(key("optim/deep/er/__1_0.distcp")) },
			ErrDamaged, []string{`"optim/deep/er/__1_0.distcp"`, "not in the store"}, false},
		{"data has another size", func(s *memStore, m *Manifest) { s.put(key("model.pt"), []byte("short")) },
			ErrDamaged, []string{`"model.pt"`}, false},
		{"corrupted in every download", func(s *memStore, m *Manifest) { s.corruptKey(key("model.pt")) },
			ErrDamaged, []string{`"model.pt"`, "checksum mismatch in two downloads", goodSum.Value, corruptSum.Value}, false},
		{"manifest checksum wrong", func(s *memStore, m *Manifest) {
			for i := range m.Files {
				if m.Files[i].Path == ".metadata" {
					m.Files[i].Checksum = wrongSum
				}
			}
		}, ErrDamaged, []string{`".metadata"`, "checksum mismatch", wrongSum.Value}, false},
		{"store error", func(s *memStore, m *Manifest) { s.failKey(key("optim/__0_0.distcp"), errBoom) },
			errBoom, []string{`"optim/__0_0.distcp"`}, false},
		{"store error while another download hangs", func(s *memStore, m *Manifest) {
			s.hangKey(key("model.pt"))
			s.failKey(key("optim/__0_0.distcp"), errBoom)
		}, errBoom, []string{`"optim/__0_0.distcp"`}, false},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			s := newMemStore()
			m := restoreTestCommit(t, s, restoreTestJob, "step-000100", restoreTestT0, files)
			tt.setup(s, m)
			restoreTestPutJSON(t, s, ManifestKey(restoreTestJob, "step-000100", restoreTestCommitID("step-000100", restoreTestT0)), m)
			restoreTestSetLatest(t, s, restoreTestJob, "step-000100")
			parent, to := restoreTestDirs(t)
			before := restoreTestTree(t, parent)

			var log bytes.Buffer
			_, err := Restore(t.Context(), s, restoreTestOpts(to, &log))
			if err == nil {
				t.Fatal("Restore() succeeded; want an error")
			}
			if tt.is != nil && !errors.Is(err, tt.is) {
				t.Errorf("Got(%q) = %v; want errors.Is %v", tt.name, err, tt.is)
			}
			if damaged := tt.is == ErrDamaged; errors.Is(err, ErrDamaged) != damaged {
				t.Errorf("Got(%q) = %v; want errors.Is ErrDamaged %v (a store error is no damage)", tt.name, err, damaged)
			}
			for _, want := range append(tt.wants, "mem://bucket/prefix", restoreTestJob, `"step-000100"`) {
				if !strings.Contains(err.Error(), want) {
					t.Errorf("Got(%q) = %v; want it to contain %q", tt.name, err, want)
				}
			}
			if d := restoreTestDiff(restoreTestTree(t, parent), before); d != "" {
				t.Errorf("the failed restore left something behind:%s", d)
			}
		})
	}
}

func TestRestoreCancelled(t *testing.T) {
	s := newMemStore()
	restoreTestCommit(t, s, restoreTestJob, "step-000100", restoreTestT0, restoreTestFiles(1))
	restoreTestSetLatest(t, s, restoreTestJob, "step-000100")
	entered := s.hangKey(DataKey(restoreTestJob, "step-000100", restoreTestCommitID("step-000100", restoreTestT0), "model.pt"))
	parent, to := restoreTestDirs(t)
	before := restoreTestTree(t, parent)

	ctx, cancel := context.WithCancel(t.Context())
	defer cancel()
	errc := make(chan error, 1)
	go func() {
		var log bytes.Buffer
		_, err := Restore(ctx, s, restoreTestOpts(to, &log))
		errc <- err
	}()
	<-entered
	cancel()
	if err := <-errc; !errors.Is(err, context.Canceled) {
		t.Fatalf("Got(%q) = %v; want context.Canceled", "error", err)
	}
	if d := restoreTestDiff(restoreTestTree(t, parent), before); d != "" {
		t.Errorf("the cancelled restore left something behind:%s", d)
	}
}

func TestRestoreStoreErrorDoesNotFallBack(t *testing.T) {
	errBoom := errors.New("boom")
	tests := []struct {
		name string
		key  string
	}{
		{"LATEST", LatestKey(restoreTestJob)},
		{"manifest LATEST names", ManifestKey(restoreTestJob, "step-000200", restoreTestCommitID("step-000200", restoreTestT0.Add(time.Hour)))},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			s := newMemStore()
			restoreTestCommit(t, s, restoreTestJob, "step-000100", restoreTestT0, restoreTestFiles(1))
			restoreTestCommit(t, s, restoreTestJob, "step-000200", restoreTestT0.Add(time.Hour), restoreTestFiles(2))
			restoreTestSetLatest(t, s, restoreTestJob, "step-000200")
			s.failKey(tt.key, errBoom)
			_, to := restoreTestDirs(t)

			var log bytes.Buffer
			_, err := Restore(t.Context(), s, restoreTestOpts(to, &log))
			if !errors.Is(err, errBoom) || !strings.Contains(err.Error(), "mem://bucket/prefix") {
				t.Errorf("Got(%q) = %v; want the store's error, naming the store", tt.name, err)
			}
			if got := s.downloaded(); len(got) != 0 {
				t.Errorf("Got(%q) = %q; want no downloads (no fallback to an older checkpoint)", "downloads", got)
			}
		})
	}
}

func TestRestoreExistingDestination(t *testing.T) {
	files := restoreTestFiles(1)
	tests := []struct {
		name string
		// prepare changes what is at dir, which holds the restored checkpoint (or removes it
		// and puts something else there).
		prepare func(t *testing.T, dir string)
		same    bool
		want    string
	}{
		{"identical", func(t *testing.T, dir string) {}, true, ""},
		{"identical plus an empty directory", func(t *testing.T, dir string) {
			restoreTestMust(t, os.Mkdir(filepath.Join(dir, "logs"), 0o755))
		}, true, ""},
		{"a file with other bytes", func(t *testing.T, dir string) {
			restoreTestMust(t, os.WriteFile(filepath.Join(dir, "optim", "deep", "er", "__1_0.distcp"), []byte("RANK1"), 0o644))
		}, false, `"optim/deep/er/__1_0.distcp" has checksum`},
		{"a file with another size", func(t *testing.T, dir string) {
			restoreTestMust(t, os.WriteFile(filepath.Join(dir, "empty"), []byte("x"), 0o644))
		}, false, `"empty" has 1 bytes`},
		{"an extra file", func(t *testing.T, dir string) {
			restoreTestMust(t, os.WriteFile(filepath.Join(dir, "optim", "notes.txt"), nil, 0o644))
		}, false, `"optim/notes.txt" is not in the checkpoint`},
		{"a missing file", func(t *testing.T, dir string) {
			restoreTestMust(t, os.Remove(filepath.Join(dir, ".metadata")))
		}, false, `".metadata" is missing`},
		{"a symlink instead of a file", func(t *testing.T, dir string) {
			restoreTestMust(t, os.Rename(filepath.Join(dir, "model.pt"), filepath.Join(dir, "..", "model.pt")))
			restoreTestMust(t, os.Symlink(filepath.Join("..", "model.pt"), filepath.Join(dir, "model.pt")))
		}, false, `"model.pt" is not a regular file`},
		{"an empty directory", func(t *testing.T, dir string) {
			restoreTestMust(t, os.RemoveAll(dir))
			restoreTestMust(t, os.Mkdir(dir, 0o755))
		}, false, "is missing"},
		{"a regular file", func(t *testing.T, dir string) {
			restoreTestMust(t, os.RemoveAll(dir))
			restoreTestMust(t, os.WriteFile(dir, []byte("not a checkpoint"), 0o644))
		}, false, "is not a directory"},
		{"a symlink to an identical copy", func(t *testing.T, dir string) {
			restoreTestMust(t, os.Rename(dir, dir+".real"))
			restoreTestMust(t, os.Symlink(filepath.Base(dir)+".real", dir))
		}, false, "is not a directory"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			s := newMemStore()
			restoreTestCommit(t, s, restoreTestJob, "step-000100", restoreTestT0, files)
			restoreTestSetLatest(t, s, restoreTestJob, "step-000100")
			parent, to := restoreTestDirs(t)
			var log bytes.Buffer
			first, err := Restore(t.Context(), s, restoreTestOpts(to, &log))
			if err != nil {
				t.Fatalf("first Restore() error: %v", err)
			}
			tt.prepare(t, first.Dir)
			before := restoreTestTree(t, parent)
			downloads := len(s.downloaded())

			res, err := Restore(t.Context(), s, restoreTestOpts(to, &log))
			switch {
			case tt.same && err != nil:
				t.Errorf("Got(%q) = %v; want success", tt.name, err)
			case tt.same && !res.AlreadyPresent:
				t.Errorf("Got(%q) = %+v; want AlreadyPresent", tt.name, res)
			case !tt.same && (err == nil || !strings.Contains(err.Error(), tt.want) || !strings.Contains(err.Error(), "not overwriting")):
				t.Errorf("Got(%q) = %v; want a refusal containing %q", tt.name, err, tt.want)
			}
			if d := restoreTestDiff(restoreTestTree(t, parent), before); d != "" {
				t.Errorf("the second restore changed the file system:%s", d)
			}
			if got := s.downloaded()[downloads:]; len(got) != 0 {
				t.Errorf("Got(%q) = %q; want no downloads", "downloads", got)
			}
		})
	}
}

func TestRestoreOptionsInvalid(t *testing.T) {
	tests := []struct {
		name string
		opts RestoreOptions
		want string
	}{
		{"no job", RestoreOptions{To: "x"}, "job"},
		{"job with a slash", RestoreOptions{Job: "a/b", To: "x"}, "job"},
		{"no destination", RestoreOptions{Job: restoreTestJob}, "no destination"},
		{"checkpoint with a path", RestoreOptions{Job: restoreTestJob, To: "x", Checkpoint: "../step-1"}, "checkpoint"},
		{"checkpoint is spotguard's directory", RestoreOptions{Job: restoreTestJob, To: "x", Checkpoint: MetaDir}, "reserved"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			s := newMemStore()
			_, err := Restore(t.Context(), s, tt.opts)
			if err == nil || !strings.Contains(err.Error(), tt.want) {
				t.Errorf("Got(%q) = %v; want an error containing %q", tt.name, err, tt.want)
			}
		})
	}
}

func TestRestoreCreatesDestination(t *testing.T) {
	s := newMemStore()
	files := map[string]string{"a": "1"}
	restoreTestCommit(t, s, restoreTestJob, "step-000100", restoreTestT0, files)
	restoreTestSetLatest(t, s, restoreTestJob, "step-000100")
	to := filepath.Join(t.TempDir(), "does", "not", "exist")

	var log bytes.Buffer
	res, err := Restore(t.Context(), s, restoreTestOpts(to, &log))
	if err != nil {
		t.Fatalf("Restore() error: %v", err)
	}
	if d := restoreTestDiff(restoreTestTree(t, res.Dir), restoreTestWant(files)); d != "" {
		t.Errorf("restored tree differs from the checkpoint:%s", d)
	}
}

func restoreTestMust(t *testing.T, err error) {
	t.Helper()
	if err != nil {
		t.Fatal(err)
	}
}

// restoreTestNames returns the names in dir.
func restoreTestNames(t *testing.T, dir string) []string {
	t.Helper()
	entries, err := os.ReadDir(dir)
	if err != nil {
		t.Fatal(err)
	}
	var names []string
	for _, e := range entries {
		names = append(names, e.Name())
	}
	return names
}

// TestRestoreFileStore commits a checkpoint through a real FileStore, as the uploader does
// (PutFile for each file, then the manifest with the checksums it returned, then LATEST), and
// restores it bit for bit.
func TestRestoreFileStore(t *testing.T) {
	s, err := NewFileStore(filepath.Join(t.TempDir(), "store"))
	if err != nil {
		t.Fatal(err)
	}
	files := restoreTestFiles(7)
	src := t.TempDir()
	complete := restoreTestT0
	m := &Manifest{Version: ManifestVersion, Job: restoreTestJob, Checkpoint: "step-000700", Commit: restoreTestCommitID("step-000700", restoreTestT0),
		Trigger: "notice", CommittedAt: restoreTestT0, Timings: Timings{CompleteAt: &complete}}
	for _, p := range slices.Sorted(maps.Keys(files)) {
		name := filepath.Join(src, filepath.FromSlash(p))
		restoreTestMust(t, os.MkdirAll(filepath.Dir(name), 0o755))
		restoreTestMust(t, os.WriteFile(name, []byte(files[p]), 0o644))
		f, err := os.Open(name)
		if err != nil {
			t.Fatal(err)
		}
		sum, err := s.PutFile(t.Context(), DataKey(m.Job, m.Checkpoint, m.Commit, p), f, int64(len(files[p])), nil)
		f.Close()
		if err != nil {
			t.Fatalf("PutFile(%q) error: %v", p, err)
		}
		m.Files = append(m.Files, File{Path: p, Key: DataKey(m.Job, m.Checkpoint, m.Commit, p), Size: int64(len(files[p])), Checksum: sum})
		m.TotalBytes += int64(len(files[p]))
	}
	data, err := json.Marshal(m)
	if err != nil {
		t.Fatal(err)
	}
	_, err = s.PutBytes(t.Context(), ManifestKey(m.Job, m.Checkpoint, m.Commit), data, Cond{IfAbsent: true})
	restoreTestMust(t, err)
	data, err = json.Marshal(Latest{Version: ManifestVersion, Checkpoint: m.Checkpoint, Commit: m.Commit, CompleteAt: &complete, CommittedAt: m.CommittedAt})
	if err != nil {
		t.Fatal(err)
	}
	_, err = s.PutBytes(t.Context(), LatestKey(m.Job), data, Cond{})
	restoreTestMust(t, err)

	_, to := restoreTestDirs(t)
	var log bytes.Buffer
	res, err := Restore(t.Context(), s, restoreTestOpts(to, &log))
	if err != nil {
		t.Fatalf("Restore() error: %v", err)
	}
	if res.Checkpoint != m.Checkpoint || res.FellBack || res.Bytes != m.TotalBytes {
		t.Errorf("Got(%q) = %+v; want %s, not fallen back, %d bytes", "result", res, m.Checkpoint, m.TotalBytes)
	}
	if d := restoreTestDiff(restoreTestTree(t, res.Dir), restoreTestWant(files)); d != "" {
		t.Errorf("restored tree differs from the checkpoint:%s", d)
	}
}

// Restore gives every file the permission bits its manifest lists (0644 when it lists none, as a
// version 1 manifest), whatever the umask.
func TestRestoreAppliesPermissionBits(t *testing.T) {
	s := newMemStore()
	files := map[string]string{"secret.key": "k", "run.sh": "#!/bin/sh", "model.pt": "w", "plain": "p"}
	m := restoreTestManifest(t, restoreTestJob, "step-1", restoreTestT0, files)
	modes := map[string]string{"secret.key": "0600", "run.sh": "0755", "model.pt": "0444", "plain": ""}
	for i := range m.Files {
		m.Files[i].Mode = modes[m.Files[i].Path]
		s.put(m.Files[i].Key, []byte(files[m.Files[i].Path]))
	}
	restoreTestPutJSON(t, s, ManifestKey(restoreTestJob, "step-1", m.Commit), m)
	_, to := restoreTestDirs(t)
	var log bytes.Buffer
	res, err := Restore(t.Context(), s, restoreTestOpts(to, &log))
	if err != nil {
		t.Fatalf("Restore() error: %v", err)
	}
	want := map[string]fs.FileMode{"secret.key": 0o600, "run.sh": 0o755, "model.pt": 0o444, "plain": 0o644}
	for p, mode := range want {
		fi, err := os.Stat(filepath.Join(res.Dir, p))
		if err != nil || fi.Mode().Perm() != mode {
			t.Errorf("Got(%q) = %v (%v); want %v", p, fi.Mode().Perm(), err, mode)
		}
	}
}

// A version 1 checkpoint (the layout before commit ids) is restored like any other.
func TestRestoreVersion1(t *testing.T) {
	s := newMemStore()
	files := restoreTestFiles(3)
	restoreTestCommitV1(t, s, restoreTestJob, "step-000100", restoreTestT0, files)
	restoreTestSetLatest(t, s, restoreTestJob, "step-000100")
	_, to := restoreTestDirs(t)
	var log bytes.Buffer
	res, err := Restore(t.Context(), s, restoreTestOpts(to, &log))
	if err != nil {
		t.Fatalf("Restore() error: %v", err)
	}
	if res.Checkpoint != "step-000100" || res.Commit != "" || res.FellBack {
		t.Errorf("Got(%q) = %+v; want step-000100, no commit, from LATEST", "result", res)
	}
	if d := restoreTestDiff(restoreTestTree(t, res.Dir), restoreTestWant(files)); d != "" {
		t.Errorf("restored tree differs from the checkpoint:%s", d)
	}
	// Asked for by its checkpoint and its commit, which has no id ("-" in spotguard list, and
	// to restore --commit).
	_, to = restoreTestDirs(t)
	opts := restoreTestOpts(to, &log)
	opts.Checkpoint, opts.CommitSet = "step-000100", true
	if res, err := Restore(t.Context(), s, opts); err != nil || res.Checkpoint != "step-000100" || res.Commit != "" {
		t.Errorf("Restore(step-000100, commit \"\") = %+v, %v; want it restored", res, err)
	}
}

// restoreTestHold holds an exclusive flock on the directory dir, as a running restore holds one
// on its staging directory, until the test ends.
func restoreTestHold(t *testing.T, dir string) {
	t.Helper()
	f, err := os.Open(dir)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { f.Close() })
	if err := syscall.Flock(int(f.Fd()), syscall.LOCK_EX|syscall.LOCK_NB); err != nil {
		t.Fatalf("flock %s: %v", dir, err)
	}
}

// A killed restore's staging directory is removed by the next restore; one of a restore still
// running (it holds a lock on it) is left alone, whatever its pid, and so is a directory of the
// user's whose name only starts like one (found from outside: .spotguard-restore-notes was
// deleted).
func TestRestoreRemovesStaleStaging(t *testing.T) {
	s := newMemStore()
	restoreTestCommit(t, s, restoreTestJob, "step-1", restoreTestT0, restoreTestFiles(1))
	_, to := restoreTestDirs(t)
	stale := filepath.Join(to, ".spotguard-restore-999999999-"+strings.Repeat("A7", 13))
	live := filepath.Join(to, fmt.Sprintf(".spotguard-restore-%d-%s", os.Getpid(), strings.Repeat("B2", 13)))
	users := []string{filepath.Join(to, ".spotguard-restore-notes"), filepath.Join(to, ".spotguard-restore-999999999-mine")}
	for _, d := range append([]string{stale, live}, users...) {
		restoreTestMust(t, os.MkdirAll(filepath.Join(d, "sub"), 0o755))
		restoreTestMust(t, os.WriteFile(filepath.Join(d, "sub", "half.bin"), make([]byte, 100), 0o644))
	}
	restoreTestHold(t, live)
	var log bytes.Buffer
	if _, err := Restore(t.Context(), s, restoreTestOpts(to, &log)); err != nil {
		t.Fatalf("Restore() error: %v", err)
	}
	if _, err := os.Stat(stale); !errors.Is(err, fs.ErrNotExist) {
		t.Errorf("Got(%q) = %v; want the killed restore's staging removed", stale, err)
	}
	if _, err := os.Stat(live); err != nil {
		t.Errorf("Got(%q) = %v; want a live restore's staging left alone", live, err)
	}
	for _, d := range users {
		if _, err := os.Stat(filepath.Join(d, "sub", "half.bin")); err != nil {
			t.Errorf("Got(%q) = %v; want the user's directory left alone", d, err)
		}
	}

	// A restore that finds the checkpoint there, and downloads nothing, removes one too (found
	// from outside: a killed restore's 65 MiB stayed until a restore that downloaded).
	restoreTestMust(t, os.MkdirAll(filepath.Join(stale, "sub"), 0o755))
	if res, err := Restore(t.Context(), s, restoreTestOpts(to, &log)); err != nil || !res.AlreadyPresent {
		t.Fatalf("Restore() again = %+v, %v; want the checkpoint found there", res, err)
	}
	if _, err := os.Stat(stale); !errors.Is(err, fs.ErrNotExist) {
		t.Errorf("Got(%q) = %v; want the killed restore's staging removed by a restore that found the checkpoint there", stale, err)
	}
}

// TestRestoreStagingLockedAcrossPIDNamespaces: a running restore holds a lock on its staging
// directory for as long as it exists, and another restore leaves a locked one alone even when
// its pid names no process it can see (found from outside: a restore in a container, another PID
// namespace, removed a running restore's staging directory under it). Once nothing holds it, it
// is a killed restore's and is removed, even when its pid now names another process.
func TestRestoreStagingLockedAcrossPIDNamespaces(t *testing.T) {
	if runtime.GOOS != "linux" {
		t.Skip("staging directories are locked on Linux; elsewhere their pid says whether their restore runs")
	}
	s := newMemStore()
	files := restoreTestFiles(1)
	restoreTestCommit(t, s, restoreTestJob, "step-1", restoreTestT0, files)
	_, to := restoreTestDirs(t)
	// Another namespace's restore: a pid this one cannot see, a lock it holds.
	other := filepath.Join(to, ".spotguard-restore-999999999-"+strings.Repeat("C3", 13))
	restoreTestMust(t, os.MkdirAll(filepath.Join(other, "d19"), 0o755))
	restoreTestMust(t, os.WriteFile(filepath.Join(other, "d19", "f00018"), []byte("half"), 0o644))
	lock, err := os.Open(other)
	restoreTestMust(t, err)
	defer lock.Close()
	restoreTestMust(t, syscall.Flock(int(lock.Fd()), syscall.LOCK_EX|syscall.LOCK_NB))

	// While this restore downloads, its own staging directory is locked.
	var mu sync.Mutex
	var ownLock []error
	opts := restoreTestOpts(to, &bytes.Buffer{})
	opts.Progress = func(done, total int64) {
		if done == 0 {
			return
		}
		// Called on the downloads' goroutines: errors are kept, and checked on the test's.
		mu.Lock()
		defer mu.Unlock()
		entries, err := os.ReadDir(to)
		if err != nil {
			ownLock = append(ownLock, err)
		}
		for _, e := range entries {
			if p := filepath.Join(to, e.Name()); p != other && strings.HasPrefix(e.Name(), restoreStagingPrefix) {
				f, err := os.Open(p)
				if err == nil {
					err = syscall.Flock(int(f.Fd()), syscall.LOCK_EX|syscall.LOCK_NB)
					f.Close()
				}
				ownLock = append(ownLock, err)
			}
		}
	}
	res, err := Restore(t.Context(), s, opts)
	if err != nil {
		t.Fatalf("Restore() error: %v", err)
	}
	if got, err := os.ReadFile(filepath.Join(other, "d19", "f00018")); err != nil || string(got) != "half" {
		t.Errorf("Got(%q) = %q, %v; want the running restore's staging left alone", other, got, err)
	}
	mu.Lock()
	if len(ownLock) == 0 || slices.ContainsFunc(ownLock, func(err error) bool { return !errors.Is(err, syscall.EWOULDBLOCK) }) {
		t.Errorf("Got(%q) = %v; want EWOULDBLOCK each time (the restore holds its staging directory's lock)", "flock of the staging directory", ownLock)
	}
	mu.Unlock()

	// The other restore is killed: its lock goes with it. Its pid is now this process's (a pid
	// used again after a reboot): the lock, not the pid, says it is stale.
	restoreTestMust(t, lock.Close())
	reused := filepath.Join(to, fmt.Sprintf(".spotguard-restore-%d-%s", os.Getpid(), strings.Repeat("D4", 13)))
	restoreTestMust(t, os.Mkdir(reused, 0o755))
	restoreTestMust(t, os.RemoveAll(res.Dir))
	if _, err := Restore(t.Context(), s, restoreTestOpts(to, &bytes.Buffer{})); err != nil {
		t.Fatalf("second Restore() error: %v", err)
	}
	if got := restoreTestNames(t, to); !slices.Equal(got, []string{"step-1"}) {
		t.Errorf("Got(%q) = %q; want only %q (the killed restores' staging removed)", to, got, []string{"step-1"})
	}
}

// A single-file checkpoint (model.pt renamed into checkpoint.dir) is put back as the file
// To/model.pt, where the trainer loads it and renames its next save, not as a directory; a
// second restore finds it in place, and anything else there is never overwritten.
func TestRestoreSingleFile(t *testing.T) {
	body := strings.Repeat("weights ", 40_000)
	files := map[string]string{"model.pt": body}
	tests := []struct {
		name    string
		prepare func(t *testing.T, p string) // p: To/model.pt, restored
		same    bool
		want    string
	}{
		{"identical", func(t *testing.T, p string) {}, true, ""},
		{"other bytes, its commit asked for", func(t *testing.T, p string) {
			// Not asked for, a save of its name is left or moved aside: TestRestoreJudgesASaveOfItsName.
			restoreTestMust(t, os.WriteFile(p, []byte(strings.ToUpper(body)), 0o644))
		}, false, "exists with other content"},
		{"a directory", func(t *testing.T, p string) {
			restoreTestMust(t, os.Remove(p))
			restoreTestMust(t, os.Mkdir(p, 0o755))
			restoreTestMust(t, os.WriteFile(filepath.Join(p, "model.pt"), []byte(body), 0o644))
		}, false, "is not a regular file (a directory)"},
		{"a symlink to an identical copy", func(t *testing.T, p string) {
			restoreTestMust(t, os.Rename(p, p+".real"))
			restoreTestMust(t, os.Symlink("model.pt.real", p))
		}, false, "is not a regular file"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			s := newMemStore()
			m := restoreTestCommit(t, s, restoreTestJob, "model.pt", restoreTestT0, files)
			restoreTestSetLatest(t, s, restoreTestJob, "model.pt")
			if !m.SingleFile() {
				t.Fatalf("SingleFile() = false for %+v", m.Files)
			}
			parent, to := restoreTestDirs(t)
			var log bytes.Buffer
			res, err := Restore(t.Context(), s, restoreTestOpts(to, &log))
			if err != nil {
				t.Fatalf("Restore() error: %v", err)
			}
			if want := filepath.Join(to, "model.pt"); res.Dir != want || res.Files != 1 || res.AlreadyPresent {
				t.Errorf("Restore() = %+v; want Dir %s, 1 file, downloaded", res, want)
			}
			if d := restoreTestDiff(restoreTestTree(t, to), map[string]string{"model.pt": "file:" + body}); d != "" {
				t.Fatalf("restored tree differs (want the file itself, no staging left):%s", d)
			}
			tt.prepare(t, res.Dir)
			before := restoreTestTree(t, parent)
			downloads := len(s.downloaded())

			opts := restoreTestOpts(to, &log)
			if strings.HasSuffix(tt.name, "asked for") {
				opts.Checkpoint, opts.Commit, opts.CommitSet = m.Checkpoint, m.Commit, true
			}
			res, err = Restore(t.Context(), s, opts)
			switch {
			case tt.same && (err != nil || !res.AlreadyPresent):
				t.Errorf("second Restore() = %+v, %v; want AlreadyPresent", res, err)
			case !tt.same && (err == nil || !strings.Contains(err.Error(), tt.want) || !strings.Contains(err.Error(), "not overwriting")):
				t.Errorf("second Restore() error = %v; want a refusal containing %q", err, tt.want)
			}
			if d := restoreTestDiff(restoreTestTree(t, parent), before); d != "" {
				t.Errorf("the second restore changed the file system:%s", d)
			}
			if got := s.downloaded()[downloads:]; len(got) != 0 {
				t.Errorf("downloads = %q; want none", got)
			}
		})
	}
}

// restorePlaceFile never replaces what is at its destination, even when it appeared after
// Restore looked (a concurrent restore, the trainer).
func TestRestorePlaceFileNeverOverwrites(t *testing.T) {
	dir := t.TempDir()
	restoreTestMust(t, os.WriteFile(filepath.Join(dir, "staged"), []byte("restored"), 0o644))
	restoreTestMust(t, os.WriteFile(filepath.Join(dir, "model.pt"), []byte("the trainer's"), 0o644))
	root, err := os.OpenRoot(dir)
	restoreTestMust(t, err)
	defer root.Close()
	if err := restorePlaceFile(root, "staged", "model.pt"); !errors.Is(err, fs.ErrExist) {
		t.Errorf("restorePlaceFile onto a file = %v; want an error wrapping fs.ErrExist", err)
	}
	if got, _ := os.ReadFile(filepath.Join(dir, "model.pt")); string(got) != "the trainer's" {
		t.Errorf("model.pt = %q after the refusal; want it untouched", got)
	}
	if err := restorePlaceFile(root, "staged", "free.pt"); err != nil {
		t.Fatalf("restorePlaceFile to a free name: %v", err)
	}
	if got, _ := os.ReadFile(filepath.Join(dir, "free.pt")); string(got) != "restored" {
		t.Errorf("free.pt = %q; want the staged file", got)
	}
}

// orderStore records, at each Download of a key ending in marker, how many other downloads had
// returned.
type orderStore struct {
	Store
	marker string
	mu     sync.Mutex
	done   int
	before []int
}

func (s *orderStore) Download(ctx context.Context, key string, w io.WriterAt, size int64) error {
	if strings.HasSuffix(key, "/"+s.marker) {
		s.mu.Lock()
		s.before = append(s.before, s.done)
		s.mu.Unlock()
		return s.Store.Download(ctx, key, w, size)
	}
	err := s.Store.Download(ctx, key, w, size)
	s.mu.Lock()
	s.done++
	s.mu.Unlock()
	return err
}

// TestRestoreMarkerLast: the marker is downloaded once every other file is in and verified, so
// a staging directory a killed restore leaves never holds a marker beside files that are not.
// (Found from outside: after a kill -9 half way, staging held the marker and two shards of other
// bytes; a trainer that looks for the marker itself would have loaded it.)
func TestRestoreMarkerLast(t *testing.T) {
	mem := newMemStore()
	dir := t.TempDir()
	files := map[string][]byte{}
	for i := range 12 {
		files[fmt.Sprintf("shard-%d.bin", i)] = []byte(fmt.Sprintf("shard %d", i))
	}
	r := startUploader(t, dir, mem, 0)
	writeCheckpoint(t, dir, "step-1", files)
	r.waitCommitted("step-1")
	// checkpoint.marker as configured: the default, or another name.
	for marker, last := range map[string]string{"": "_COMPLETE", "shard-3.bin": "shard-3.bin"} {
		s := &orderStore{Store: mem, marker: last}
		if _, err := Restore(t.Context(), s, RestoreOptions{Job: "job", To: t.TempDir(), Marker: marker, Concurrency: 4, Logger: zerolog.Nop()}); err != nil {
			t.Fatal(err)
		}
		if want := []int{12}; !slices.Equal(s.before, want) {
			t.Errorf("marker %q: downloads done before the marker's = %v; want %v", last, s.before, want)
		}
	}
}

// flakyBytesStore is a memStore whose Download of key writes the object with one bit flipped
// the first bad times, as a network or a proxy that damages a response would; the object in the
// store is intact. It counts the Downloads of key.
type flakyBytesStore struct {
	*memStore
	key string

	mu    sync.Mutex
	bad   int
	calls int
}

func (s *flakyBytesStore) Download(ctx context.Context, key string, w io.WriterAt, size int64) error {
	s.mu.Lock()
	flip := key == s.key && s.calls < s.bad
	if key == s.key {
		s.calls++
	}
	s.mu.Unlock()
	if !flip {
		return s.memStore.Download(ctx, key, w, size)
	}
	data, _, err := s.GetBytes(ctx, key)
	if err != nil {
		return err
	}
	data[len(data)/2] ^= 0x01
	_, err = w.WriteAt(data, 0)
	return err
}

func (s *flakyBytesStore) downloads() int {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.calls
}

// TestRestoreDownloadsAgainAfterAChecksumMismatch: a file whose bytes arrive damaged once is
// downloaded again, and restored when the second download matches; only a file that fails its
// checksum twice makes the commit damaged, and the error says so (found from outside: one GET
// answered with a changed byte made restore call an intact commit damaged in the store and
// suggest an older one).
func TestRestoreDownloadsAgainAfterAChecksumMismatch(t *testing.T) {
	files := restoreTestFiles(1)
	for _, bad := range []int{1, 2} {
		t.Run(fmt.Sprintf("damaged %d times", bad), func(t *testing.T) {
			mem := newMemStore()
			m := restoreTestCommit(t, mem, restoreTestJob, "step-000100", restoreTestT0, files)
			restoreTestSetLatest(t, mem, restoreTestJob, "step-000100")
			key := DataKey(restoreTestJob, "step-000100", m.Commit, "model.pt")
			s := &flakyBytesStore{memStore: mem, key: key, bad: bad}
			parent, to := restoreTestDirs(t)
			before := restoreTestTree(t, parent)

			var log bytes.Buffer
			var last [2]int64
			opts := restoreTestOpts(to, &log)
			opts.Progress = func(done, total int64) { last = [2]int64{done, total} }
			res, err := Restore(t.Context(), s, opts)
			if got := s.downloads(); got != 2 {
				t.Errorf("Got(%q) = %d; want 2 (once more after the mismatch, no more)", "downloads of model.pt", got)
			}
			if !strings.Contains(log.String(), `"file":"model.pt"`) || !strings.Contains(log.String(), "checksum") {
				t.Errorf("Got(%q) = %s; want a warning naming the file that failed its checksum", "log", log.String())
			}
			if bad == 2 {
				if !errors.Is(err, ErrDamaged) || !strings.Contains(err.Error(), `"model.pt"`) || !strings.Contains(err.Error(), "checksum mismatch in two downloads") {
					t.Errorf("Got(%q) = %v; want ErrDamaged naming model.pt and saying it failed twice", "error", err)
				}
				if d := restoreTestDiff(restoreTestTree(t, parent), before); d != "" {
					t.Errorf("the failed restore left something behind:%s", d)
				}
				return
			}
			if err != nil {
				t.Fatalf("Restore() error: %v; want the second download restored", err)
			}
			if d := restoreTestDiff(restoreTestTree(t, res.Dir), restoreTestWant(files)); d != "" {
				t.Errorf("restored tree differs from the checkpoint:%s", d)
			}
			if want := [2]int64{m.TotalBytes, m.TotalBytes}; last != want {
				t.Errorf("Got(%q) = %v; want %v (a file downloaded twice counts once)", "progress", last, want)
			}
		})
	}
}

// TestRestoreNeverSkipsAnUnusableNewestCommit: when the newest commit's manifest cannot be used
// (a newer spotguard's format, a hand edit, garbage), restore refuses and says which commit and
// why, and how to restore an older one on purpose; it never restores an older commit instead
// and says it restored the newest (found from outside: a "version": 3 manifest named by LATEST
// made restore take the previous checkpoint, exit 0, and report the newest).
func TestRestoreNeverSkipsAnUnusableNewestCommit(t *testing.T) {
	t1, t2 := restoreTestT0.Add(time.Hour), restoreTestT0.Add(2*time.Hour)
	newID := restoreTestCommitID("step-000200", t2)
	newKey := ManifestKey(restoreTestJob, "step-000200", newID)
	// newer writes step-000200's commit at t2 with its manifest changed by edit.
	newer := func(edit func(m *Manifest)) func(t *testing.T, s *memStore) {
		return func(t *testing.T, s *memStore) {
			m := restoreTestCommit(t, s, restoreTestJob, "step-000200", t2, restoreTestFiles(2))
			edit(m)
			restoreTestPutJSON(t, s, newKey, m)
		}
	}
	tests := []struct {
		name       string
		setup      func(t *testing.T, s *memStore)
		checkpoint string // --checkpoint
		latest     string // the checkpoint LATEST names, "" for none
		wants      []string
	}{
		{"a newer spotguard's manifest, named by LATEST", newer(func(m *Manifest) { m.Version = 3 }), "", "step-000200",
			[]string{"named by LATEST", "manifest version 3", "written by a newer spotguard", "upgrade spotguard"}},
		{"a newer spotguard's manifest, LATEST not moved yet", newer(func(m *Manifest) { m.Version = 3 }), "", "step-000100",
			[]string{"manifest version 3", "written by a newer spotguard"}},
		{"a newer spotguard's manifest, LATEST missing", newer(func(m *Manifest) { m.Version = 3 }), "", "",
			[]string{"manifest version 3", "written by a newer spotguard"}},
		{"a manifest that is not JSON", func(t *testing.T, s *memStore) { s.put(newKey, []byte("{")) }, "", "",
			[]string{"not valid JSON"}},
		{"a hostile manifest", newer(func(m *Manifest) { m.Files[0].Path = "../../etc/cron.d/x" }), "", "",
			[]string{`has a ".." element`}},
		{"a manifest of another job", newer(func(m *Manifest) { m.Job = "other-job" }), "", "",
			[]string{"other-job"}},
		{"a total that does not add up", newer(func(m *Manifest) { m.TotalBytes++ }), "", "step-000100",
			[]string{"total_bytes"}},
		{"the newest commit of the checkpoint asked for", func(t *testing.T, s *memStore) {
			restoreTestCommit(t, s, restoreTestJob, "step-000200", t1, restoreTestFiles(3))
			newer(func(m *Manifest) { m.Version = 3 })(t, s)
		}, "step-000200", "", []string{"manifest version 3", "--checkpoint step-000200 --commit " + restoreTestCommitID("step-000200", t1)}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			s := newMemStore()
			older := restoreTestCommit(t, s, restoreTestJob, "step-000100", restoreTestT0, restoreTestFiles(1))
			tt.setup(t, s)
			if tt.latest != "" {
				// LATEST names the commit whatever its manifest holds.
				id := newID
				if tt.latest == "step-000100" {
					id = older.Commit
				}
				restoreTestPutJSON(t, s, LatestKey(restoreTestJob), Latest{Version: ManifestVersion, Checkpoint: tt.latest, Commit: id, CommittedAt: t2})
			}
			parent, to := restoreTestDirs(t)
			before := restoreTestTree(t, parent)

			var log bytes.Buffer
			opts := restoreTestOpts(to, &log)
			opts.Checkpoint = tt.checkpoint
			res, err := Restore(t.Context(), s, opts)
			if err == nil {
				t.Fatalf("Restore() = %+v; want a refusal (an older commit restored in place of the newest)", res)
			}
			if !errors.Is(err, ErrUnusableManifest) || errors.Is(err, ErrNothingToRestore) {
				t.Errorf("Got(%q) = %v; want ErrUnusableManifest, not ErrNothingToRestore", tt.name, err)
			}
			wants := append([]string{`checkpoint "step-000200" commit ` + newID, "mem://bucket/prefix", "spotguard list"}, tt.wants...)
			if tt.checkpoint == "" {
				wants = append(wants, "--checkpoint step-000100 --commit "+older.Commit)
			}
			for _, want := range wants {
				if !strings.Contains(err.Error(), want) {
					t.Errorf("Got(%q) = %v; want it to contain %q", tt.name, err, want)
				}
			}
			if got := s.downloaded(); len(got) != 0 {
				t.Errorf("Got(%q) = %q; want no downloads", "downloads", got)
			}
			if d := restoreTestDiff(restoreTestTree(t, parent), before); d != "" {
				t.Errorf("the refused restore changed the file system:%s", d)
			}

			// The fix the error gives: the older commit, asked for by name.
			opts.Checkpoint, opts.Commit, opts.CommitSet = "step-000100", older.Commit, true
			if res, err := Restore(t.Context(), s, opts); err != nil || res.Commit != older.Commit {
				t.Errorf("Restore(--checkpoint step-000100 --commit %s) = %+v, %v; want it restored", older.Commit, res, err)
			}
		})
	}
}

// TestRestoreNoUsableCommitIsNotNothing: a job whose only commits have manifests this spotguard
// cannot use has something to restore: the restore refuses, and never says "nothing committed"
// (with --allow-empty, spotguard-restore.service would then start the trainer from scratch).
func TestRestoreNoUsableCommitIsNotNothing(t *testing.T) {
	s := newMemStore()
	m := restoreTestCommit(t, s, restoreTestJob, "step-000100", restoreTestT0, restoreTestFiles(1))
	m.Version = 3
	restoreTestPutJSON(t, s, ManifestKey(restoreTestJob, "step-000100", m.Commit), m)
	restoreTestSetLatest(t, s, restoreTestJob, "step-000100")
	var log bytes.Buffer
	_, err := Restore(t.Context(), s, restoreTestOpts(filepath.Join(t.TempDir(), "restore"), &log))
	if !errors.Is(err, ErrUnusableManifest) || errors.Is(err, ErrNothingToRestore) {
		t.Fatalf("Got(%q) = %v; want ErrUnusableManifest, not ErrNothingToRestore", "error", err)
	}
	for _, want := range []string{"written by a newer spotguard", "no older commit"} {
		if !strings.Contains(err.Error(), want) {
			t.Errorf("Got(%q) = %v; want it to contain %q", "error", err, want)
		}
	}
}

// A trainer that saves into one directory every time (or saves a step's name again), cut short on
// a disk that outlived its instance (a spot stop, a reboot), leaves a directory of the commit's
// name without its marker. Restore refused it ("exists with other content"), so the restore unit
// failed and the trainer did not start until someone moved it by hand. It is moved aside now, and
// kept, as the commit takes its place: unless it was modified within the last minute (it may be
// being written), or the restore fails, when it is left as it was. An empty directory of that
// name goes; one with its marker is a save of its own (TestRestoreJudgesASaveOfItsName).
func TestRestoreMovesAnIncompleteSaveAside(t *testing.T) {
	files := restoreTestFiles(1)
	files["_COMPLETE"] = ""
	torn := map[string]string{"model.pt": "half of a save", "optim/__0_0.distcp": "rank0"}
	old := time.Now().Add(-2 * incompleteQuiet)
	tests := []struct {
		name    string
		prepare func(t *testing.T, dir string) // dir: To/step-000100, not there yet
		fail    bool                           // a file of the commit cannot be downloaded
		aside   map[string]string              // what is moved aside; nil: nothing is
		refused string                         // the error; "": restored
		booted  time.Time                      // RestoreOptions.BootedAt
	}{
		{"incomplete", func(t *testing.T, dir string) { restoreTestWrite(t, dir, torn, old) }, false, restoreTestWant(torn), "", time.Time{}},
		{"empty", func(t *testing.T, dir string) { restoreTestWrite(t, dir, nil, old) }, false, nil, "", time.Time{}},
		{"incomplete, written a moment ago", func(t *testing.T, dir string) { restoreTestWrite(t, dir, torn, time.Now()) }, false, nil,
			"holds an incomplete save (no _COMPLETE at its top), modified", time.Time{}},
		{"incomplete, a download fails", func(t *testing.T, dir string) { restoreTestWrite(t, dir, torn, old) }, true, nil, "boom", time.Time{}},
		// Dated in the future (a clock set back since, a commit of a clock ahead restored as it
		// was): not being written, which dates a file now (found from outside: the restore unit
		// failed at every boot, "modified -8m55s ago").
		{"incomplete, dated in the future", func(t *testing.T, dir string) { restoreTestWrite(t, dir, torn, time.Now().Add(10*time.Minute)) }, false, restoreTestWant(torn), "", time.Time{}},
		// Cut short less than a minute before a boot: nothing writes across a boot (found from
		// outside: the restore unit failed at that boot, and the trainer never started).
		{"incomplete, written a moment before the boot", func(t *testing.T, dir string) { restoreTestWrite(t, dir, torn, time.Now().Add(-20*time.Second)) }, false,
			restoreTestWant(torn), "", time.Now().Add(-10 * time.Second)},
		{"incomplete, written a moment ago, after the boot", func(t *testing.T, dir string) { restoreTestWrite(t, dir, torn, time.Now()) }, false, nil,
			"holds an incomplete save (no _COMPLETE at its top), modified", time.Now().Add(-10 * time.Second)},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			s := newMemStore()
			m := restoreTestCommit(t, s, restoreTestJob, "step-000100", restoreTestT0, files)
			restoreTestSetLatest(t, s, restoreTestJob, "step-000100")
			if tt.fail {
				s.failKey(m.FileKey(m.Files[0]), errors.New("boom"))
			}
			_, to := restoreTestDirs(t)
			dir := filepath.Join(to, "step-000100")
			tt.prepare(t, dir)
			before := restoreTestTree(t, to)
			var log bytes.Buffer
			opts := restoreTestOpts(to, &log)
			opts.BootedAt = tt.booted
			res, err := Restore(t.Context(), s, opts)
			if tt.refused != "" {
				var de *DestinationExistsError
				if err == nil || !strings.Contains(err.Error(), tt.refused) ||
					(strings.Contains(tt.name, "moment") && (!errors.As(err, &de) || !de.Recent)) {
					t.Errorf("Restore() = %+v, %v; want an error containing %q", res, err, tt.refused)
				}
				if d := restoreTestDiff(restoreTestTree(t, to), before); d != "" {
					t.Errorf("a refused restore changed the destination:%s", d)
				}
				return
			}
			if err != nil {
				t.Fatalf("Restore() error: %v", err)
			}
			want := map[string]string{}
			for p, v := range restoreTestWant(files) {
				want["step-000100/"+p] = v
			}
			want["step-000100"] = "dir"
			if tt.aside != nil {
				if filepath.Dir(res.MovedAside) != to || !strings.HasPrefix(filepath.Base(res.MovedAside), ".spotguard-incomplete-step-000100-") {
					t.Fatalf("MovedAside = %q; want %s/.spotguard-incomplete-step-000100-<time>", res.MovedAside, to)
				}
				want[filepath.Base(res.MovedAside)] = "dir"
				for p, v := range tt.aside {
					want[filepath.Base(res.MovedAside)+"/"+p] = v
				}
				if !strings.Contains(log.String(), "an incomplete save of this name was there") {
					t.Errorf("log does not say the incomplete save was moved aside:\n%s", log.String())
				}
			} else if res.MovedAside != "" {
				t.Errorf("MovedAside = %q; want \"\" (nothing kept)", res.MovedAside)
			}
			if d := restoreTestDiff(restoreTestTree(t, to), want); d != "" {
				t.Errorf("the destination differs from the commit, and what was moved aside:%s", d)
			}
		})
	}
}

// A complete save of the checkpoint's name where the newest commit goes, with other content, is
// the trainer's own: an instance stopped and started again with its disk, whose last save the
// agent had not committed, or a trainer that saves into one name every time. Restore refused it
// ("exists with other content"), so the restore unit failed and the trainer did not start. Now a
// newer save (written after the commit completed, and not the bytes of another commit) is left for
// the trainer to resume from, with nothing downloaded; an older one (written before, or the bytes
// of an older commit, whatever its times say) is moved aside, kept, as the commit takes its place,
// unless it was modified within the last minute; so is some of the commit's own files (a node's
// part of a multi-node checkpoint restored whole), as an incomplete copy, whatever its times say.
// With its commit asked for, and for what is no save (a symbolic link in it), the refusal stands.
func TestRestoreJudgesASaveOfItsName(t *testing.T) {
	withMarker := func(files map[string]string) map[string]string {
		files["_COMPLETE"] = ""
		return files
	}
	older, newest, other := withMarker(restoreTestFiles(1)), withMarker(restoreTestFiles(2)), withMarker(restoreTestFiles(3))
	part := maps.Clone(newest) // a node's part of a multi-node checkpoint: some of its files
	delete(part, "model.pt")
	delete(part, "optim/deep/er/__1_0.distcp")
	single := func(body string) map[string]string { return map[string]string{"model.pt": body} }
	linked := func(t *testing.T, p string) { restoreTestMust(t, os.Symlink("model.pt", filepath.Join(p, "link"))) }
	// A save into the name again, cut short before its marker was written again: a file newer
	// than the marker (found from outside: restore left such a mix as "a newer save", and the
	// agent committed it as LATEST).
	reSaved := func(t *testing.T, p string) {
		at := restoreTestT0.Add(2 * time.Hour)
		restoreTestMust(t, os.Chtimes(filepath.Join(p, "model.pt"), at, at))
	}
	before, after, now := restoreTestT0.Add(-30*time.Minute), restoreTestT0.Add(time.Hour), time.Now()
	tests := []struct {
		name    string
		cp      string
		local   map[string]string
		at      time.Time
		more    func(t *testing.T, p string) // after writing local
		asked   bool                         // the commit asked for by its id
		outcome string                       // "newer", "older" or "incomplete" (moved aside so), or the refusal
		log     string
	}{
		{"newer", "step-000100", other, after, nil, false, "newer", "a newer save of this name is there (written 2026-03-01T13:00:00Z, after commit"},
		{"newer, written a moment ago", "step-000100", other, now, nil, false, "newer", "a newer save of this name is there"},
		{"a file written after its marker", "step-000100", other, after, reSaved, false, "incomplete",
			"a save written into this name after its marker was there (model.pt modified 2026-03-01T14:00:00Z, after its marker, 2026-03-01T13:00:00Z)"},
		{"older", "step-000100", other, before, nil, false, "older", "an older save of this name was there (written 2026-03-01T11:30:00Z, before commit"},
		{"the bytes of an older commit", "step-000100", older, after, nil, false, "older", "an older save of this name was there: the bytes of its commit " +
			restoreTestCommitID("step-000100", restoreTestT0.Add(-time.Hour))},
		{"some of the commit's files", "step-000100", part, after, nil, false, "incomplete",
			"an incomplete copy of commit " + restoreTestCommitID("step-000100", restoreTestT0) + " was there (4 of its 6 files, the rest missing)"},
		{"some of the commit's files, written a moment ago", "step-000100", part, now, nil, false,
			"holds an incomplete copy of commit " + restoreTestCommitID("step-000100", restoreTestT0) + ", modified ", ""},
		{"the bytes of an older commit, written a moment ago", "step-000100", older, now, nil, false,
			"holds an older save of this name than commit " + restoreTestCommitID("step-000100", restoreTestT0) + ", modified ", ""},
		{"newer, its commit asked for", "step-000100", other, after, nil, true, "exists with other content", ""},
		{"older, with a symbolic link", "step-000100", other, before, linked, false, "is not a regular file (a symbolic link)", ""},
		{"a single file, newer", "model.pt", single("other weights"), after, nil, false, "newer", "a newer save of this name is there"},
		{"a single file, older", "model.pt", single("other weights"), before, nil, false, "older", "an older save of this name was there"},
		{"a single file, the bytes of an older commit", "model.pt", single("older weights"), after, nil, false, "older", "the bytes of its commit"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			s := newMemStore()
			first, last := older, newest
			if tt.cp == "model.pt" {
				first, last = single("older weights"), single("newest weights")
			}
			restoreTestCommit(t, s, restoreTestJob, tt.cp, restoreTestT0.Add(-time.Hour), first)
			m := restoreTestCommit(t, s, restoreTestJob, tt.cp, restoreTestT0, last)
			restoreTestSetLatest(t, s, restoreTestJob, tt.cp)
			_, to := restoreTestDirs(t)
			p := filepath.Join(to, tt.cp)
			if tt.cp == "model.pt" {
				restoreTestMust(t, os.WriteFile(p, []byte(tt.local["model.pt"]), 0o644))
				restoreTestMust(t, os.Chtimes(p, tt.at, tt.at))
			} else {
				restoreTestWrite(t, p, tt.local, tt.at)
			}
			if tt.more != nil {
				tt.more(t, p)
			}
			was := restoreTestTree(t, to)
			var log bytes.Buffer
			opts := restoreTestOpts(to, &log)
			if tt.asked {
				opts.Checkpoint, opts.Commit, opts.CommitSet = m.Checkpoint, m.Commit, true
			}
			res, err := Restore(t.Context(), s, opts)
			switch tt.outcome {
			case "newer":
				if err != nil || !res.NewerPresent || res.AlreadyPresent || res.MovedAside != "" || res.Commit != m.Commit {
					t.Fatalf("Restore() = %+v, %v; want NewerPresent, of commit %s", res, err, m.Commit)
				}
				if got := s.downloaded(); len(got) != 0 {
					t.Errorf("downloads = %q; want none", got)
				}
				if d := restoreTestDiff(restoreTestTree(t, to), was); d != "" {
					t.Errorf("a newer save was changed:%s", d)
				}
			case "older", "incomplete":
				if err != nil || res.NewerPresent || res.MovedAsideKind != tt.outcome || filepath.Dir(res.MovedAside) != to ||
					!strings.HasPrefix(filepath.Base(res.MovedAside), ".spotguard-"+tt.outcome+"-"+tt.cp+"-") {
					t.Fatalf("Restore() = %+v, %v; want the save moved to %s/.spotguard-%s-%s-<time>", res, err, to, tt.outcome, tt.cp)
				}
				want := map[string]string{}
				for k, v := range was {
					want[strings.Replace(k, tt.cp, filepath.Base(res.MovedAside), 1)] = v
				}
				if tt.cp == "model.pt" {
					want["model.pt"] = "file:" + last["model.pt"]
				} else {
					want[tt.cp] = "dir"
					for k, v := range restoreTestWant(last) {
						want[tt.cp+"/"+k] = v
					}
				}
				if d := restoreTestDiff(restoreTestTree(t, to), want); d != "" {
					t.Errorf("the destination is not the commit beside the older save moved aside:%s", d)
				}
			default:
				if err == nil || !strings.Contains(err.Error(), tt.outcome) {
					t.Fatalf("Restore() = %+v, %v; want an error containing %q", res, err, tt.outcome)
				}
				var de *DestinationExistsError
				if !errors.As(err, &de) || de.Recent != strings.Contains(tt.name, "a moment ago") {
					t.Errorf("Restore() error %v: want a *DestinationExistsError, Recent %v", err, strings.Contains(tt.name, "a moment ago"))
				}
				if d := restoreTestDiff(restoreTestTree(t, to), was); d != "" {
					t.Errorf("a refused restore changed the destination:%s", d)
				}
			}
			if !strings.Contains(log.String(), tt.log) {
				t.Errorf("the log lacks %q:\n%s", tt.log, log.String())
			}
		})
	}
}

// restoreTestWrite makes the directory dir holding files, everything in it modified at at.
func restoreTestWrite(t *testing.T, dir string, files map[string]string, at time.Time) {
	t.Helper()
	restoreTestMust(t, os.MkdirAll(dir, 0o755))
	for p, data := range files {
		f := filepath.Join(dir, filepath.FromSlash(p))
		restoreTestMust(t, os.MkdirAll(filepath.Dir(f), 0o755))
		restoreTestMust(t, os.WriteFile(f, []byte(data), 0o644))
	}
	restoreTestMust(t, filepath.WalkDir(dir, func(p string, _ fs.DirEntry, err error) error {
		if err != nil {
			return err
		}
		return os.Chtimes(p, at, at)
	}))
}

// Saves moved aside within one second of each other (a retry loop restoring again and again) got
// one name: a single file moved over the one before, which was lost, and a directory failed to
// move, with a misleading fix (found from outside). A name taken gets a number.
func TestRestoreAsideNameTakenIsNotOverwritten(t *testing.T) {
	s := newMemStore()
	restoreTestCommit(t, s, restoreTestJob, "model.pt", restoreTestT0.Add(-time.Hour), map[string]string{"model.pt": "older weights"})
	restoreTestCommit(t, s, restoreTestJob, "model.pt", restoreTestT0, map[string]string{"model.pt": "newest weights"})
	restoreTestSetLatest(t, s, restoreTestJob, "model.pt")
	_, to := restoreTestDirs(t)
	p := filepath.Join(to, "model.pt")
	restoreTestMust(t, os.WriteFile(p, []byte("the trainer's own save"), 0o644))
	before := restoreTestT0.Add(-30 * time.Minute)
	restoreTestMust(t, os.Chtimes(p, before, before))
	// Earlier restores' saves, moved aside this second and the next two.
	now := time.Now()
	var taken []string
	for i := range 3 {
		q := filepath.Join(to, restoreAsideName("older", "model.pt", now.Add(time.Duration(i)*time.Second)))
		restoreTestMust(t, os.WriteFile(q, []byte("kept"), 0o644))
		taken = append(taken, q)
	}
	var log bytes.Buffer
	res, err := Restore(t.Context(), s, restoreTestOpts(to, &log))
	if err != nil || res.MovedAside == "" || slices.Contains(taken, res.MovedAside) {
		t.Fatalf("Restore() = %+v, %v; want the save moved aside under a name of its own", res, err)
	}
	for _, q := range taken {
		if b, err := os.ReadFile(q); err != nil || string(b) != "kept" {
			t.Errorf("%s = %q, %v; want what an earlier restore moved aside, kept", q, b, err)
		}
	}
	if b, err := os.ReadFile(res.MovedAside); err != nil || string(b) != "the trainer's own save" {
		t.Errorf("moved aside = %q, %v; want the trainer's own save", b, err)
	}
}

// A commit without checkpoint.marker at its top (a manifest edited by hand; or a restore without
// the agent's --config, its marker another) restores a directory no trainer resuming from a save
// with its marker takes: it was restored without a word (found from outside). It is restored,
// with a warning naming the marker; a commit with it is restored without one.
func TestRestoreOfACommitWithoutTheMarkerWarns(t *testing.T) {
	for _, tc := range []struct {
		marker string
		warn   bool
	}{{"_COMPLETE", true}, {"model.pt", false}} {
		s := newMemStore()
		restoreTestCommit(t, s, restoreTestJob, "step-000100", restoreTestT0, restoreTestFiles(1))
		_, to := restoreTestDirs(t)
		var log bytes.Buffer
		opts := restoreTestOpts(to, &log)
		opts.Marker = tc.marker
		if _, err := Restore(t.Context(), s, opts); err != nil {
			t.Fatal(err)
		}
		if got := strings.Contains(log.String(), "the commit has no checkpoint.marker at its top"); got != tc.warn {
			t.Errorf("marker %s: warned %v; want %v:\n%s", tc.marker, got, tc.warn, log.String())
		}
	}
}

// A restore that finds nothing for its job names the other jobs the store holds: a store.job
// mistyped, or set anew after an upgrade from a version that committed to job "default" without
// it, restored nothing and (with --allow-empty) restarted training from scratch, without a word
// of the checkpoints beside it (found from outside).
func TestRestoreOfAnEmptyJobNamesTheOtherJobs(t *testing.T) {
	s := newMemStore()
	at := time.Now().Add(-time.Minute)
	putCommit(t, s, "step-000100", "i-a", map[string][]byte{"a.bin": []byte("a")}, at, at, nil) // job "job", no LATEST
	for _, job := range []string{"default", "other-run"} {
		if _, err := s.PutBytes(t.Context(), LatestKey(job), []byte(`{"checkpoint":"step-000100"}`), Cond{}); err != nil {
			t.Fatal(err)
		}
	}
	_, err := Restore(t.Context(), s, RestoreOptions{Job: "my-run", To: t.TempDir(), Logger: zerolog.Nop()})
	if !errors.Is(err, ErrNothingToRestore) || !strings.Contains(err.Error(), `the store holds the checkpoints of other jobs: "default", "other-run" (`) ||
		!strings.Contains(err.Error(), `job "default" is where an agent without store.job committed`) {
		t.Errorf("Restore(my-run) = %v; want nothing to restore, naming the jobs with a LATEST the store holds", err)
	}
}

// In a bucket of many jobs, the jobs named are those closest to the one asked for (the same but
// for case, then the longest prefix in common), quoted: they were the first ten in the alphabet,
// unlike the one meant, and a trailing space could not be seen (found from outside).
func TestRestoreOfAnEmptyJobNamesTheClosestJobs(t *testing.T) {
	s := newMemStore()
	jobs := []string{"train-run", "train-run-2 ", "Train-Run-3"}
	for i := range 20 {
		jobs = append(jobs, fmt.Sprintf("a-%02d", i))
	}
	for _, job := range jobs {
		if _, err := s.PutBytes(t.Context(), LatestKey(job), []byte(`{"checkpoint":"step-000100"}`), Cond{}); err != nil {
			t.Fatal(err)
		}
	}
	_, err := Restore(t.Context(), s, RestoreOptions{Job: "train-run-3", To: t.TempDir(), Logger: zerolog.Nop()})
	want := `other jobs: "Train-Run-3", "train-run-2 ", "train-run", "a-00", `
	if !errors.Is(err, ErrNothingToRestore) || !strings.Contains(err.Error(), want) || !strings.Contains(err.Error(), `"a-06", … (`) {
		t.Errorf("Restore(train-run-3) = %v; want the ten closest jobs first, quoted: %s… and then an ellipsis", err, want)
	}
}

// A manifest with an unsafe path is refused with one line naming the path, and only that: its
// size still counts toward total_bytes (it said a second, spurious problem, and errors.Join's
// newline broke the restore's one-line error; found from outside).
func TestManifestWithAnUnsafePathIsOneProblemOnOneLine(t *testing.T) {
	m := restoreTestManifest(t, restoreTestJob, "step-1", restoreTestT0, map[string]string{"a.bin": "aaaa", "b.bin": "bb"})
	for i := range m.Files {
		if m.Files[i].Path == "b.bin" {
			m.Files[i].Path = "../../escape.bin"
		}
	}
	err := m.Validate()
	if err == nil || strings.Contains(err.Error(), "\n") || strings.Contains(err.Error(), "total_bytes") ||
		!strings.Contains(err.Error(), `a file's path: path "../../escape.bin"`) {
		t.Errorf("Validate() = %q; want one line naming the path alone", err)
	}
	m.Version = 7
	if err := m.Validate(); err == nil || strings.Contains(err.Error(), "\n") || !strings.Contains(err.Error(), "manifest version 7; ") {
		t.Errorf("Validate() of two problems = %q; want them on one line", err)
	}
}

// A --to that is, or passes through, a symbolic link leading nowhere is refused naming the link
// and where it leads: mkdir's own error said only "file exists" (found from outside).
func TestRestoreToADanglingLinkSaysSo(t *testing.T) {
	for _, tt := range []struct{ name, to string }{
		{"the destination", "ckpt"},
		{"a directory above it", "ckpt/run-1"},
	} {
		t.Run(tt.name, func(t *testing.T) {
			s := newMemStore()
			restoreTestCommit(t, s, restoreTestJob, "step-000100", restoreTestT0, restoreTestFiles(1))
			restoreTestSetLatest(t, s, restoreTestJob, "step-000100")
			parent := t.TempDir()
			link, target := filepath.Join(parent, "ckpt"), filepath.Join(parent, "gone", "disk")
			if err := os.Symlink(target, link); err != nil {
				t.Fatal(err)
			}
			var log bytes.Buffer
			_, err := Restore(t.Context(), s, restoreTestOpts(filepath.Join(parent, tt.to), &log))
			want := fmt.Sprintf("create destination: %s is a symbolic link to %s, which does not exist", link, target)
			if err == nil || !strings.Contains(err.Error(), want) {
				t.Fatalf("Restore(--to %s, a link to nowhere) = %v; want an error saying %q", tt.to, err, want)
			}
			if _, err := os.Lstat(target); !errors.Is(err, fs.ErrNotExist) {
				t.Errorf("the restore made the link's target: %v", err)
			}
		})
	}
}

// A commit whose order its agent moved an hour after a commit from a clock ahead (its
// complete_at) keeps its completion by its own clock (complete_at_here): a save of its name
// written on the same disk after that completion is newer, left in place, though written before
// the moved time (found from outside: called older, moved aside, and the trainer resumed one save
// back).
func TestRestoreJudgesASaveByTheCommitsOwnClock(t *testing.T) {
	s := newMemStore()
	const cp = "latest"
	m := restoreTestCommit(t, s, restoreTestJob, cp, restoreTestT0, restoreTestFiles(2))
	here, moved := restoreTestT0, restoreTestT0.Add(time.Hour)
	m.Timings.CompleteAt, m.Timings.CompleteAtHere = &moved, &here
	restoreTestPutJSON(t, s, ManifestKey(restoreTestJob, cp, m.Commit), m)
	restoreTestSetLatest(t, s, restoreTestJob, cp)
	_, to := restoreTestDirs(t)
	local := restoreTestFiles(3)
	local["_COMPLETE"] = ""
	restoreTestWrite(t, filepath.Join(to, cp), local, restoreTestT0.Add(30*time.Minute))
	var log bytes.Buffer
	res, err := Restore(t.Context(), s, restoreTestOpts(to, &log))
	if err != nil || !res.NewerPresent || res.MovedAside != "" {
		t.Fatalf("Restore() = %+v, %v; want the save written after the commit completed (by its clock) left as newer\n%s", res, err, log.String())
	}
	if !strings.Contains(log.String(), "a newer save of this name is there (written 2026-03-01T12:30:00Z, after commit "+m.Commit+" completed, 2026-03-01T12:00:00Z)") {
		t.Errorf("log does not say the save is newer than the commit's own completion:\n%s", log.String())
	}
}

// A commit by an instance whose clock was ahead completed in the future, by this clock: its
// restored files are dated now, not then (found from outside: a save into the restored directory
// after its marker, cut short, had files older than the marker, and was committed torn after a
// reboot, where the agent has only the files' times to go by).
func TestRestoreDatesNoFileInTheFuture(t *testing.T) {
	s := newMemStore()
	ahead := time.Now().Add(10 * time.Minute)
	putCommit(t, s, "step-000100", "i-ahead", map[string][]byte{"a.bin": []byte("a"), "_COMPLETE": nil}, ahead, ahead, nil)
	to := t.TempDir()
	if _, err := Restore(t.Context(), s, RestoreOptions{Job: "job", To: to, Logger: zerolog.Nop()}); err != nil {
		t.Fatal(err)
	}
	after := time.Now()
	for _, name := range []string{"a.bin", "_COMPLETE"} {
		fi, err := os.Lstat(filepath.Join(to, "step-000100", name))
		if err != nil {
			t.Fatal(err)
		}
		if fi.ModTime().After(after) {
			t.Errorf("restored %s dated %v, after the restore ended (%v); want no time in the future", name, fi.ModTime(), after)
		}
	}
}

// In a file:// store, a manifest of an older commit that is no object this user can read (a
// named pipe, a symbolic link out of the store, another user's 0600 file on a shared file
// system) makes that commit unusable, not the job: the newer checkpoint is listed and restored,
// and the old commit is said. Before, every restore and list of the job failed on it (found
// from outside), and a LATEST that was a named pipe failed restore too.
func TestFileStoreManifestThatCannotBeReadIsAnUnusableCommit(t *testing.T) {
	outside := filepath.Join(t.TempDir(), "secret")
	if err := os.WriteFile(outside, []byte("{}"), 0o600); err != nil {
		t.Fatal(err)
	}
	for _, tc := range []struct {
		name string
		put  func(path string) error
		want string
	}{
		{"a named pipe", func(p string) error { return syscall.Mkfifo(p, 0o644) }, "not a regular file"},
		{"a link out of the store", func(p string) error { return os.Symlink(outside, p) }, "a symbolic link out of the store"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			root := t.TempDir()
			s, err := NewFileStore(root)
			if err != nil {
				t.Fatal(err)
			}
			old := restoreTestCommitTo(t, s, restoreTestJob, "step-000100", restoreTestT0, restoreTestFiles(1))
			files := restoreTestFiles(2)
			newer := restoreTestCommitTo(t, s, restoreTestJob, "step-000200", restoreTestT0.Add(time.Hour), files)
			manifest := filepath.Join(root, filepath.FromSlash(ManifestKey(restoreTestJob, "step-000100", old.Commit)))
			if err := os.Remove(manifest); err != nil {
				t.Fatal(err)
			}
			if err := tc.put(manifest); err != nil {
				t.Fatal(err)
			}
			latest := filepath.Join(root, filepath.FromSlash(LatestKey(restoreTestJob)))
			if err := syscall.Mkfifo(latest, 0o644); err != nil {
				t.Fatal(err)
			}

			cs, problems, err := ListCommitted(t.Context(), s, restoreTestJob)
			if err != nil || len(cs) != 1 || cs[0].Manifest.Commit != newer.Commit {
				t.Fatalf("ListCommitted = %v, %v; want step-000200 alone", cs, err)
			}
			if len(problems) != 2 || !strings.Contains(problems[0].Error(), tc.want) || !strings.Contains(problems[1].Error(), "LATEST is not a regular file") {
				t.Errorf("problems = %v; want the old manifest's, saying %q, and LATEST's", problems, tc.want)
			}
			_, to := restoreTestDirs(t)
			var log bytes.Buffer
			res, err := Restore(t.Context(), s, restoreTestOpts(to, &log))
			if err != nil || res.Checkpoint != "step-000200" {
				t.Fatalf("Restore() = %+v, %v; want step-000200 restored", res, err)
			}
			if d := restoreTestDiff(restoreTestTree(t, res.Dir), restoreTestWant(files)); d != "" {
				t.Errorf("restored tree differs from the checkpoint:%s", d)
			}
			if !strings.Contains(log.String(), "skipping unusable store entry") {
				t.Errorf("log:\n%s\nwant the unusable manifest said", log.String())
			}
		})
	}
}

// A restore beside a running agent may read the newest manifest before the agent has moved
// LATEST to it, as it does right after every manifest: that is said as such, not as "a reclaim
// between a manifest and LATEST?" (found from outside). One committed long ago still is.
func TestRestoreSaysALatestBeingMoved(t *testing.T) {
	for _, tc := range []struct {
		name string
		at   time.Time
		want string
	}{
		{"moments ago", time.Now().Add(-time.Second), "LATEST is being moved to it"},
		{"long ago", restoreTestT0.Add(time.Hour), "a reclaim between a manifest and LATEST?"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			s := newMemStore()
			older := restoreTestCommit(t, s, restoreTestJob, "step-000100", tc.at.Add(-time.Minute), restoreTestFiles(1))
			restoreTestCommit(t, s, restoreTestJob, "step-000200", tc.at, restoreTestFiles(2))
			restoreTestPutJSON(t, s, LatestKey(restoreTestJob), Latest{Version: ManifestVersion, Checkpoint: "step-000100", Commit: older.Commit, CommittedAt: older.CommittedAt})
			_, to := restoreTestDirs(t)
			var log bytes.Buffer
			res, err := Restore(t.Context(), s, restoreTestOpts(to, &log))
			if err != nil || res.Checkpoint != "step-000200" {
				t.Fatalf("Restore() = %+v, %v; want step-000200", res, err)
			}
			if !strings.Contains(log.String(), tc.want) {
				t.Errorf("log:\n%s\nwant it to say %q", log.String(), tc.want)
			}
		})
	}
}
