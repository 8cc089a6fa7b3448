//go:build unix

package checkpoint

import (
	"bytes"
	"context"
	"fmt"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"github.com/rs/zerolog"
)

// The benchmarks in this file measure invariant I8 (DESIGN.md): the cost per file of a commit
// does not grow with the number of files, and start-up reads manifests, not every object of the
// job's history. Run them one at a time, once per size:
//
//	go test -run '^$' -bench BenchmarkCommitManyFiles -benchtime 1x -timeout 30m ./checkpoint/
//	go test -run '^$' -bench BenchmarkStartupWithCommitted -count 3 ./checkpoint/
//
// SPOTGUARD_BENCH_TIMEOUT (a Go duration, default 5m) bounds how long one checkpoint may take to
// commit; a run that takes longer fails with "not committed within …".

// scaleBenchTimeout is how long a benchmark waits for its commit.
func scaleBenchTimeout(b *testing.B) time.Duration {
	b.Helper()
	s := os.Getenv("SPOTGUARD_BENCH_TIMEOUT")
	if s == "" {
		return 5 * time.Minute
	}
	d, err := time.ParseDuration(s)
	if err != nil {
		b.Fatalf("SPOTGUARD_BENCH_TIMEOUT=%q: %v", s, err)
	}
	return d
}

// scaleBenchDir returns a new empty directory on /dev/shm when it exists (writes to a disk would
// be slower and noisier than what is measured), else in b.TempDir; it is removed at cleanup.
func scaleBenchDir(b *testing.B) string {
	b.Helper()
	fi, err := os.Stat("/dev/shm")
	if err != nil || !fi.IsDir() {
		return b.TempDir()
	}
	dir, err := os.MkdirTemp("/dev/shm", "spotguard-bench-")
	if err != nil {
		return b.TempDir()
	}
	b.Cleanup(func() {
		if err := os.RemoveAll(dir); err != nil {
			b.Errorf("remove %s: %v", dir, err)
		}
	})
	return dir
}

// scaleCPU returns the CPU time (user and system) this process has used so far: unlike the wall
// time, it hardly moves when other processes share the cores.
func scaleCPU(b *testing.B) time.Duration {
	b.Helper()
	var ru syscall.Rusage
	if err := syscall.Getrusage(syscall.RUSAGE_SELF, &ru); err != nil {
		b.Fatal(err)
	}
	return time.Duration(ru.Utime.Nano() + ru.Stime.Nano())
}

// scaleLogCount counts the warnings and errors in zerolog JSON output and keeps the first few.
type scaleLogCount struct {
	mu    sync.Mutex
	warn  int
	first []string
}

func (l *scaleLogCount) Write(p []byte) (int, error) {
	if bytes.Contains(p, []byte(`"level":"warn"`)) || bytes.Contains(p, []byte(`"level":"error"`)) {
		l.mu.Lock()
		l.warn++
		if len(l.first) < 3 {
			l.first = append(l.first, strings.TrimSpace(string(p)))
		}
		l.mu.Unlock()
	}
	return len(p), nil
}

func (l *scaleLogCount) report(b *testing.B) {
	b.Helper()
	l.mu.Lock()
	defer l.mu.Unlock()
	b.ReportMetric(float64(l.warn), "warnings")
	for _, line := range l.first {
		b.Log(line)
	}
}

// scaleStore counts the calls a memStore does not count itself: GetBytes (manifests and LATEST
// read) and PutFile (files stored).
type scaleStore struct {
	*memStore
	gets, puts atomic.Int64
}

func (s *scaleStore) GetBytes(ctx context.Context, key string) ([]byte, string, error) {
	s.gets.Add(1)
	return s.memStore.GetBytes(ctx, key)
}

func (s *scaleStore) PutFile(ctx context.Context, key string, f *os.File, size int64, progress func(n int64)) (Checksum, error) {
	s.puts.Add(1)
	return s.memStore.PutFile(ctx, key, f, size, progress)
}

// scaleCounts is what a scaleStore has counted so far.
type scaleCounts struct {
	memListStats
	Gets, Puts int64
}

func (s *scaleStore) counts() scaleCounts {
	return scaleCounts{memListStats: s.stats(), Gets: s.gets.Load(), Puts: s.puts.Load()}
}

func (c scaleCounts) minus(d scaleCounts) scaleCounts {
	return scaleCounts{
		memListStats: memListStats{Lists: c.Lists - d.Lists, ListDirs: c.ListDirs - d.ListDirs, Objects: c.Objects - d.Objects, Dirs: c.Dirs - d.Dirs},
		Gets:         c.Gets - d.Gets, Puts: c.Puts - d.Puts,
	}
}

// report reports the store calls of n operations as per-op metrics.
func (c scaleCounts) report(b *testing.B, n int) {
	b.Helper()
	per := func(v int64) float64 { return float64(v) / float64(n) }
	b.ReportMetric(per(int64(c.Lists)), "lists/op")
	b.ReportMetric(per(int64(c.ListDirs)), "listdirs/op")
	b.ReportMetric(per(int64(c.Objects)), "objects-listed/op")
	b.ReportMetric(per(int64(c.Dirs)), "dirs-listed/op")
	b.ReportMetric(per(c.Gets), "gets/op")
}

// scaleRun is one Uploader (and, if the benchmark has one, Watcher) at work.
type scaleRun struct {
	cancel    context.CancelFunc
	wg        sync.WaitGroup
	committed chan *Manifest // the manifest of the benchmark's checkpoint
	failed    atomic.Int64   // CheckpointFailed events
	errs      chan error     // what Run returned, for each component
}

// start runs u and, if w is not nil, w feeding it events; otherwise whatever is in events feeds
// it. The uploader's OnEvent must be r.onEvent.
func (r *scaleRun) start(w *Watcher, u *Uploader, events chan WatchEvent) {
	ctx, cancel := context.WithCancel(context.Background())
	r.cancel = cancel
	r.errs = make(chan error, 2)
	if w != nil {
		r.wg.Go(func() { r.errs <- w.Run(ctx, events) })
	}
	r.wg.Go(func() { r.errs <- u.Run(ctx, events) })
}

func newScaleRun() *scaleRun {
	return &scaleRun{committed: make(chan *Manifest, 1)}
}

func (r *scaleRun) onEvent(name string) func(UploadEvent) {
	return func(ev UploadEvent) {
		switch {
		case ev.Checkpoint != name:
		case ev.Kind == CheckpointCommitted:
			select {
			case r.committed <- ev.Manifest:
			default:
			}
		case ev.Kind == CheckpointFailed:
			r.failed.Add(1)
		}
	}
}

// stop cancels the run and waits for its goroutines.
func (r *scaleRun) stop(b *testing.B) {
	b.Helper()
	r.cancel()
	r.wg.Wait()
	close(r.errs)
	for err := range r.errs {
		if err != nil {
			b.Errorf("Run() = %v", err)
		}
	}
}

// wait waits for the commit, at most timeout. On timeout it stops the run and fails the
// benchmark, saying how far the store got.
func (r *scaleRun) wait(b *testing.B, timeout time.Duration, what string, s *scaleStore) *Manifest {
	b.Helper()
	t := time.NewTimer(timeout)
	defer t.Stop()
	select {
	case m := <-r.committed:
		return m
	case <-t.C:
		puts := s.puts.Load()
		r.stop(b)
		b.Fatalf("%s not committed within %v: %d files stored, %d failed commits", what, timeout, puts, r.failed.Load())
		return nil
	}
}

// BenchmarkCommitManyFiles measures one checkpoint of n files of 1 KiB, already complete on disk
// (written before the timer, marker included), from the start of a Watcher and an Uploader until
// its commit: the watcher's first scan, a FileReady per file, n+1 uploads, the manifest, LATEST.
// I8 wants the time linear in n: ns/file (wall time) and cpu-ns/file (this process's CPU time,
// which other load on the machine disturbs less) flat across the sizes.
//
// The store is a memStore: its PutFile costs the same for every file (a copy and a checksum under
// one lock) and nothing on the disk, so what grows with n is the agent's own bookkeeping, not the
// store's. (A FileStore on tmpfs adds a temporary file, a sync and a rename per object, the same
// for every file, and its own directory walks.) The uploader keeps its journal (StateDir) on
// tmpfs, as the agent always has one.
func BenchmarkCommitManyFiles(b *testing.B) {
	for _, n := range []int{1000, 10000, 100000} {
		b.Run(strconv.Itoa(n), func(b *testing.B) {
			timeout := scaleBenchTimeout(b)
			dir := scaleBenchDir(b)
			const name = "step-000001"
			data := make([]byte, 1024)
			for i := range data {
				data[i] = byte(i)
			}
			if err := os.Mkdir(filepath.Join(dir, name), 0o755); err != nil {
				b.Fatal(err)
			}
			for i := range n {
				if err := os.WriteFile(filepath.Join(dir, name, fmt.Sprintf("shard-%06d.bin", i)), data, 0o644); err != nil {
					b.Fatal(err)
				}
			}
			if err := os.WriteFile(filepath.Join(dir, name, "_COMPLETE"), nil, 0o644); err != nil {
				b.Fatal(err)
			}

			b.ResetTimer()
			var elapsed, cpu time.Duration
			var calls scaleCounts
			for range b.N {
				b.StopTimer()
				store := &scaleStore{memStore: newMemStore()}
				state := scaleBenchDir(b)
				logs := &scaleLogCount{}
				log := zerolog.New(logs).Level(zerolog.InfoLevel)
				r := newScaleRun()
				b.StartTimer()

				start, cpu0 := time.Now(), scaleCPU(b)
				w, err := NewWatcher(WatchConfig{Dir: dir, Debounce: 10 * time.Millisecond, Logger: log})
				if err != nil {
					b.Fatal(err)
				}
				u := NewUploader(UploaderConfig{Store: store, Job: "bench", Dir: dir, BackgroundFiles: 64, StateDir: state,
					Logger: log, OnEvent: r.onEvent(name)})
				r.start(w, u, make(chan WatchEvent))
				m := r.wait(b, timeout, name, store)
				elapsed += time.Since(start)
				cpu += scaleCPU(b) - cpu0

				b.StopTimer()
				calls = store.counts()
				r.stop(b)
				if len(m.Files) != n+1 {
					b.Fatalf("manifest has %d files; want %d (+ marker)", len(m.Files), n)
				}
				logs.report(b)
				b.ReportMetric(float64(r.failed.Load()), "failed-commits")
				b.StartTimer()
			}
			b.StopTimer()
			files := float64(b.N) * float64(n+1)
			b.ReportMetric(float64(elapsed.Nanoseconds())/files, "ns/file")
			b.ReportMetric(files/elapsed.Seconds(), "files/s")
			b.ReportMetric(float64(cpu.Nanoseconds())/files, "cpu-ns/file")
			calls.report(b, 1) // of the last run
		})
	}
}

// scaleJob fills s with commits committed checkpoints of job, each of files files, one minute
// apart, and points LATEST at the newest.
func scaleJob(b *testing.B, s *memStore, job string, commits, files int) {
	b.Helper()
	var newest *Manifest
	for i := range commits {
		cp := fmt.Sprintf("step-%06d", i+1)
		fs := make(map[string]string, files)
		for j := range files {
			fs[fmt.Sprintf("shard-%03d.distcp", j)] = fmt.Sprintf("%s shard %d", cp, j)
		}
		fs["_COMPLETE"] = ""
		newest = restoreTestCommit(b, s, job, cp, restoreTestT0.Add(time.Duration(i)*time.Minute), fs)
	}
	restoreTestSetLatest(b, s, job, newest.Checkpoint)
}

// BenchmarkStartupWithCommitted measures an Uploader starting on a job that already has commits
// committed checkpoints of files files each, until it has committed one new checkpoint of one
// file (fed to it as a FileReady and a Complete; no watcher). It reports the store calls of that
// start-up and commit: I8 wants start-up to read manifests (gets/op grows with the commits), not
// every object (objects-listed/op must not grow with the files per checkpoint).
//
// The memStore's ListDir looks at every key it holds, so with tens of thousands of objects its own
// cost (not the uploader's, and not a real store's) shows in ns/op.
func BenchmarkStartupWithCommitted(b *testing.B) {
	for _, c := range []struct{ commits, files int }{{100, 8}, {1000, 8}, {100, 64}, {1000, 64}} {
		b.Run(fmt.Sprintf("commits=%d_files=%d", c.commits, c.files), func(b *testing.B) {
			timeout := scaleBenchTimeout(b)
			dir := b.TempDir()
			const name = "step-999999"
			if err := os.Mkdir(filepath.Join(dir, name), 0o755); err != nil {
				b.Fatal(err)
			}
			file := filepath.Join(dir, name, "model.pt")
			marker := filepath.Join(dir, name, "_COMPLETE")
			if err := os.WriteFile(file, []byte("the new checkpoint"), 0o644); err != nil {
				b.Fatal(err)
			}
			if err := os.WriteFile(marker, nil, 0o644); err != nil {
				b.Fatal(err)
			}
			event := func(kind WatchEventKind, p string) WatchEvent {
				fi, err := os.Lstat(p)
				if err != nil {
					b.Fatal(err)
				}
				return WatchEvent{Kind: kind, Checkpoint: name, Path: filepath.Base(p), Size: fi.Size(), ModTime: fi.ModTime(),
					ID: FileIDOf(fi), At: time.Now()}
			}

			b.ResetTimer()
			var calls scaleCounts
			for range b.N {
				b.StopTimer()
				store := &scaleStore{memStore: newMemStore()}
				scaleJob(b, store.memStore, "bench", c.commits, c.files)
				logs := &scaleLogCount{}
				log := zerolog.New(logs).Level(zerolog.InfoLevel)
				r := newScaleRun()
				events := make(chan WatchEvent, 2)
				events <- event(FileReady, file)
				events <- event(Complete, marker)
				u := NewUploader(UploaderConfig{Store: store, Job: "bench", Dir: dir, BackgroundFiles: 64, StateDir: b.TempDir(),
					Logger: log, OnEvent: r.onEvent(name)})
				before := store.counts()
				b.StartTimer()

				r.start(nil, u, events)
				m := r.wait(b, timeout, name, store)

				b.StopTimer()
				calls = store.counts().minus(before)
				r.stop(b)
				if len(m.Files) != 2 {
					b.Fatalf("manifest has %d files; want 2", len(m.Files))
				}
				logs.report(b)
				b.StartTimer()
			}
			b.StopTimer()
			calls.report(b, 1) // of the last run
			// Each commit's files, marker and manifest, and LATEST.
			b.ReportMetric(float64(c.commits*(c.files+2)+1), "objects-in-store")
		})
	}
}

// BenchmarkStatusOfACommittedCheckpoint is the uploader's Status with a committed checkpoint of
// 100 000 files on disk, as the agent asks it every few seconds (the systemd status line, and
// /healthz): within one turn of the loop that changed nothing, the checkpoint's counts are
// remembered (found from outside: an idle agent used 2 % of a core beside such a checkpoint).
// "fresh" counts them anew each time, as a turn that changed something does.
func BenchmarkStatusOfACommittedCheckpoint(b *testing.B) {
	g := &generation{name: "step-1", state: genCommitted, files: map[string]*fileState{}}
	for i := range 100_000 {
		d := &doneFile{id: FileID{Size: 1024}, key: fmt.Sprint("k", i)}
		g.files[fmt.Sprintf("s%03d/f%05d.bin", i/1000, i)] = &fileState{id: d.id, done: d}
	}
	u := &Uploader{gens: map[string]*generation{g.name: g}, storedEpoch: 1}
	for _, fresh := range []bool{false, true} {
		b.Run(map[bool]string{false: "remembered", true: "fresh"}[fresh], func(b *testing.B) {
			for b.Loop() {
				if fresh {
					u.storedEpoch++
				}
				if st := u.status(); len(st.Checkpoints) != 1 || st.Checkpoints[0].FilesStored != 100_000 {
					b.Fatalf("status = %+v", st)
				}
			}
		})
	}
}
