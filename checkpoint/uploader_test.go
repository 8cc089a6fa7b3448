package checkpoint

import (
	"bytes"
	"context"
	"crypto/rand"
	"encoding/json"
	"errors"
	"fmt"
	"io/fs"
	"maps"
	"os"
	"path"
	"path/filepath"
	"runtime"
	"slices"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"testing/synctest"
	"time"

	"github.com/rs/zerolog"
)

// uploaderRig runs a real Watcher on a real directory and an Uploader into a FileStore.
type uploaderRig struct {
	t      *testing.T
	dir    string
	store  Store
	up     *Uploader
	events chan UploadEvent
	cancel context.CancelFunc
	done   chan struct{}
	logs   *rigLog // the uploader's log, warnings and errors only
	// failed counts the UploadFailed events (the agent counts them as store failures).
	failed atomic.Int32
}

// rigLog is a log sink safe for the uploader's goroutines.
type rigLog struct {
	mu  sync.Mutex
	buf bytes.Buffer
}

func (l *rigLog) Write(p []byte) (int, error) {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.buf.Write(p)
}

// reset forgets what was written so far.
func (l *rigLog) reset() {
	l.mu.Lock()
	defer l.mu.Unlock()
	l.buf.Reset()
}

func (l *rigLog) String() string {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.buf.String()
}

func startUploader(t *testing.T, dir string, store Store, keep int) *uploaderRig {
	t.Helper()
	return startUploaderWith(t, dir, store, UploaderConfig{Keep: keep})
}

// startUploaderWith is startUploader with more of the uploader's configuration (Store, Job,
// Dir, Logger, Host and OnEvent are the rig's).
func startUploaderWith(t *testing.T, dir string, store Store, cfg UploaderConfig) *uploaderRig {
	t.Helper()
	return startUploaderTweaked(t, dir, store, cfg, nil)
}

// startUploaderTweaked is startUploaderWith that lets tweak, if not nil, change the Watcher
// before it runs.
func startUploaderTweaked(t *testing.T, dir string, store Store, cfg UploaderConfig, tweak func(*Watcher)) *uploaderRig {
	t.Helper()
	// A *.pt file at the top is a single-file checkpoint.
	w, err := NewWatcher(WatchConfig{Dir: dir, Pattern: "*.pt", Debounce: 30 * time.Millisecond, Logger: zerolog.Nop()})
	if err != nil {
		t.Fatal(err)
	}
	if tweak != nil {
		tweak(w)
	}
	r := newUploaderRig(t, dir, store, cfg)
	r.run(w)
	return r
}

// run runs r's uploader on what w sees; cleanup stops both.
func (r *uploaderRig) run(w *Watcher) {
	ctx, cancel := context.WithCancel(context.Background())
	r.cancel = cancel
	files := make(chan WatchEvent)
	// As in the agent, the watcher runs until the uploader is done: a stop drains with it.
	watchCtx, stopWatch := context.WithCancel(context.Background())
	var wg sync.WaitGroup
	wg.Go(func() { w.Run(watchCtx, files) })
	wg.Go(func() { defer stopWatch(); r.up.Run(ctx, files) })
	go func() { wg.Wait(); close(r.done) }()
	r.t.Cleanup(r.stop)
}

// startUploaderFed is startUploaderWith with no watcher: the uploader runs on the events the test
// sends on the channel returned.
func startUploaderFed(t *testing.T, dir string, store Store, cfg UploaderConfig) (*uploaderRig, chan<- WatchEvent) {
	t.Helper()
	return startUploaderFedAt(t, dir, store, cfg, zerolog.WarnLevel)
}

// startUploaderFedAt is startUploaderFed whose r.logs has the lines of level and above.
func startUploaderFedAt(t *testing.T, dir string, store Store, cfg UploaderConfig, level zerolog.Level) (*uploaderRig, chan<- WatchEvent) {
	t.Helper()
	r := newUploaderRigAt(t, dir, store, cfg, level)
	ctx, cancel := context.WithCancel(context.Background())
	r.cancel = cancel
	events := make(chan WatchEvent, 16)
	go func() { r.up.Run(ctx, events); close(r.done) }()
	t.Cleanup(r.stop)
	return r, events
}

// newUploaderRig is the rig of an uploader of dir into store with cfg, not running yet.
func newUploaderRig(t *testing.T, dir string, store Store, cfg UploaderConfig) *uploaderRig {
	return newUploaderRigAt(t, dir, store, cfg, zerolog.WarnLevel)
}

// newUploaderRigAt is newUploaderRig whose r.logs has the lines of level and above.
func newUploaderRigAt(t *testing.T, dir string, store Store, cfg UploaderConfig, level zerolog.Level) *uploaderRig {
	keep := cfg.Keep
	r := &uploaderRig{t: t, dir: dir, store: store, events: make(chan UploadEvent, 64), done: make(chan struct{}), logs: &rigLog{}}
	cfg.Store, cfg.Job, cfg.Dir, cfg.Keep, cfg.Logger = store, "job", dir, keep, zerolog.New(r.logs).Level(level)
	cfg.Pattern = "*.pt"
	if cfg.Host == nil {
		cfg.Host = func() Host { return Host{InstanceID: "i-test"} }
	}
	if cfg.fileClock == nil { // in a synctest bubble, time.Now is not the clock of files' times
		cfg.fileClock = fileClock(t, filepath.Join(t.TempDir(), "clock"))
	}
	cfg.OnEvent = func(ev UploadEvent) {
		if ev.Kind != UploadFailed { // one per failed try: the rig waits for the others only
			r.events <- ev
		} else {
			r.failed.Add(1)
		}
	}
	r.up = NewUploader(cfg)
	return r
}

func (r *uploaderRig) stop() {
	r.cancel()
	<-r.done
}

// waitDone waits for Run (and the watcher) to return; not within 10 s, it fails with what.
func (r *uploaderRig) waitDone(what string) {
	r.t.Helper()
	select {
	case <-r.done:
	case <-time.After(10 * time.Second):
		r.t.Fatal(what)
	}
}

// waitCommitted waits for the checkpoint to be committed and returns its event.
func (r *uploaderRig) waitCommitted(name string) UploadEvent {
	r.t.Helper()
	return r.waitEvent(CheckpointCommitted, name)
}

// waitCommittedAll waits until every one of names is committed, in whatever order, and returns
// their events by name.
func (r *uploaderRig) waitCommittedAll(names ...string) map[string]UploadEvent {
	r.t.Helper()
	got := map[string]UploadEvent{}
	timeout := time.After(20 * time.Second)
	for len(got) < len(names) {
		select {
		case ev := <-r.events:
			if ev.Kind == CheckpointCommitted && slices.Contains(names, ev.Checkpoint) {
				got[ev.Checkpoint] = ev
			}
		case <-timeout:
			r.t.Fatalf("of %v, only %d committed within 20 s", names, len(got))
		}
	}
	return got
}

// waitEvent waits for an event of kind for the checkpoint and returns it (kind 0: the next event,
// whatever it is).
func (r *uploaderRig) waitEvent(kind UploadEventKind, name string) UploadEvent {
	r.t.Helper()
	return r.waitEventWithin(kind, name, 20*time.Second)
}

// waitEventWithin is waitEvent that waits up to within.
func (r *uploaderRig) waitEventWithin(kind UploadEventKind, name string, within time.Duration) UploadEvent {
	r.t.Helper()
	timeout := time.After(within)
	for {
		select {
		case ev := <-r.events:
			if kind == 0 || ev.Kind == kind && ev.Checkpoint == name {
				return ev
			}
		case <-timeout:
			r.t.Fatalf("no event %d for checkpoint %s within %v\n%s", kind, name, within, r.logs)
		}
	}
}

// writeCheckpoint writes files (name → content) into dir/name, then the marker.
func writeCheckpoint(t *testing.T, dir, name string, files map[string][]byte) {
	t.Helper()
	for rel, data := range files {
		p := filepath.Join(dir, name, filepath.FromSlash(rel))
		if err := os.MkdirAll(filepath.Dir(p), 0o755); err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(p, data, 0o644); err != nil {
			t.Fatal(err)
		}
	}
	if err := os.WriteFile(filepath.Join(dir, name, "_COMPLETE"), nil, 0o644); err != nil {
		t.Fatal(err)
	}
}

// waitFileClockAfter returns once a file written now gets a modification time after t (polling,
// at most 5 s).
func waitFileClockAfter(tb *testing.T, t time.Time) {
	tb.Helper()
	probe := filepath.Join(tb.TempDir(), "clock")
	deadline := time.Now().Add(5 * time.Second)
	for {
		if err := os.WriteFile(probe, nil, 0o644); err != nil {
			tb.Fatal(err)
		}
		fi, err := os.Stat(probe)
		if err != nil {
			tb.Fatal(err)
		}
		if fi.ModTime().After(t) {
			return
		}
		if time.Now().After(deadline) {
			tb.Fatalf("the file clock stayed at %v for 5 s", t)
		}
		runtime.Gosched()
	}
}

func randomBytes(t *testing.T, n int) []byte {
	b := make([]byte, n)
	rand.Read(b)
	return b
}

// restoreAndCompare restores name from the store and checks every file bit for bit.
func restoreAndCompare(t *testing.T, store Store, name string, want map[string][]byte) {
	t.Helper()
	to := t.TempDir()
	res, err := Restore(t.Context(), store, RestoreOptions{Job: "job", Checkpoint: name, To: to, Logger: zerolog.Nop()})
	if err != nil {
		t.Fatalf("Restore(%s): %v", name, err)
	}
	if res.Files != len(want)+1 { // the marker is part of the checkpoint
		t.Errorf("restored %d files; want %d (+ marker)", res.Files, len(want))
	}
	for rel, data := range want {
		got, err := os.ReadFile(filepath.Join(to, name, filepath.FromSlash(rel)))
		if err != nil || !bytes.Equal(got, data) {
			t.Errorf("restored %s differs from what the trainer wrote (err %v)", rel, err)
		}
	}
}

func TestUploaderCommitsCheckpoint(t *testing.T) {
	dir, storeDir := t.TempDir(), t.TempDir()
	store, err := NewFileStore(storeDir)
	if err != nil {
		t.Fatal(err)
	}
	r := startUploader(t, dir, store, 0)
	files := map[string][]byte{"model.bin": randomBytes(t, 3<<20), "optim/state.bin": randomBytes(t, 1<<20), "empty": nil}
	writeCheckpoint(t, dir, "step-000100", files)
	ev := r.waitCommitted("step-000100")

	m := ev.Manifest
	if m.Job != "job" || m.Checkpoint != "step-000100" || m.Trigger != "periodic" || m.Host.InstanceID != "i-test" {
		t.Errorf("manifest = %+v", m)
	}
	if len(m.Files) != 4 || m.TotalBytes != 4<<20 {
		t.Errorf("manifest lists %d files, %d bytes; want 4 files, %d bytes", len(m.Files), m.TotalBytes, 4<<20)
	}
	for _, f := range m.Files {
		if data, ok := files[f.Path]; ok {
			sum, _ := ChecksumOf(bytes.NewReader(data))
			if f.Checksum != sum {
				t.Errorf("manifest checksum of %s = %v; want %v", f.Path, f.Checksum, sum)
			}
		}
	}
	latest, _, err := store.GetBytes(t.Context(), LatestKey("job"))
	var l Latest
	if err != nil || json.Unmarshal(latest, &l) != nil || l.Checkpoint != "step-000100" {
		t.Errorf("LATEST = %s (%v); want step-000100", latest, err)
	}
	if ev.Forecast <= 0 || ev.Throughput <= 0 {
		t.Errorf("forecast %v, throughput %v; want both positive", ev.Forecast, ev.Throughput)
	}
	restoreAndCompare(t, store, "step-000100", files)
}

// A file rewritten after the marker (before the commit saw it) is sent again: the manifest
// never lists bytes other than the ones stored.
func TestUploaderResendsFileChangedAfterMarker(t *testing.T) {
	dir := t.TempDir()
	store := newMemStore()
	r := startUploader(t, dir, store, 0)
	files := map[string][]byte{"a.bin": randomBytes(t, 1<<20)}
	writeCheckpoint(t, dir, "step-1", files)
	r.waitCommitted("step-1")

	// A second checkpoint whose file changes after its marker.
	files2 := map[string][]byte{"a.bin": randomBytes(t, 1<<20)}
	writeCheckpoint(t, dir, "step-2", files2)
	files2["a.bin"] = randomBytes(t, 2<<20)
	if err := os.WriteFile(filepath.Join(dir, "step-2", "a.bin"), files2["a.bin"], 0o644); err != nil {
		t.Fatal(err)
	}
	writeMarker(t, filepath.Join(dir, "step-2")) // the marker last, as a trainer saving again writes it
	ev := r.waitCommitted("step-2")
	if ev.Manifest.TotalBytes != 2<<20 {
		// Committed before the rewrite was seen: then the store holds the first version,
		// consistently. Either way the bytes restored match the manifest.
		t.Logf("committed the first version (%d bytes) before the rewrite", ev.Manifest.TotalBytes)
	}
	to := t.TempDir()
	if _, err := Restore(t.Context(), store, RestoreOptions{Job: "job", Checkpoint: "step-2", To: to, Logger: zerolog.Nop()}); err != nil {
		t.Fatalf("Restore: %v (the manifest does not match the stored bytes)", err)
	}
}

// writeMarker writes the marker of the checkpoint directory ck again, as a trainer does at the
// end of a save: a new file renamed into place.
func writeMarker(t *testing.T, ck string) {
	t.Helper()
	tmp := filepath.Join(ck, "._COMPLETE.tmp")
	if err := os.WriteFile(tmp, nil, 0o644); err != nil {
		t.Fatal(err)
	}
	if err := os.Rename(tmp, filepath.Join(ck, "_COMPLETE")); err != nil {
		t.Fatal(err)
	}
}

// rewriteLater writes data over the file p in place, with a modification time a second after
// the one it had, as a save some time later would leave it.
func rewriteLater(t *testing.T, p string, data []byte) {
	t.Helper()
	fi, err := os.Stat(p)
	if err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(p, data, 0o644); err != nil {
		t.Fatal(err)
	}
	if err := os.Chtimes(p, fi.ModTime().Add(time.Second), fi.ModTime().Add(time.Second)); err != nil {
		t.Fatal(err)
	}
}

// waitRewriteSeen waits (20 s at most) for the uploader to say that a file of checkpoint name
// was written again after its marker. A commit of name meanwhile fails the test: the directory
// holds files of two saves.
func (r *uploaderRig) waitRewriteSeen(name string) {
	r.t.Helper()
	r.waitSaidNotComplete(name, msgRewrittenAfterMarker)
}

// waitStored waits (20 s at most) for the store to hold an object whose key begins with prefix
// and ends with suffix: a file sent.
func waitStored(t *testing.T, store *memStore, prefix, suffix string) {
	t.Helper()
	for deadline := time.Now().Add(20 * time.Second); ; {
		store.mu.Lock()
		found := slices.ContainsFunc(slices.Collect(maps.Keys(store.objs)), func(k string) bool {
			return strings.HasPrefix(k, prefix) && strings.HasSuffix(k, suffix)
		})
		store.mu.Unlock()
		if found {
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("no %s...%s in the store within 20 s", prefix, suffix)
		}
		<-time.After(5 * time.Millisecond) // poll
	}
}

// waitSaidNotComplete waits (20 s at most) for the uploader to log msg, which says checkpoint
// name is not complete. A commit of name meanwhile fails the test.
func (r *uploaderRig) waitSaidNotComplete(name, msg string) {
	r.t.Helper()
	deadline := time.Now().Add(20 * time.Second)
	for !strings.Contains(r.logs.String(), msg) {
		if time.Now().After(deadline) {
			r.t.Fatalf("%s not said within 20 s: %q", name, msg)
		}
		select {
		case ev := <-r.events:
			if ev.Kind == CheckpointCommitted && ev.Checkpoint == name {
				r.t.Fatalf("%s committed as %s half way through a save into it again: a mix of two saves", name, ev.Manifest.Commit)
			}
		case <-time.After(5 * time.Millisecond):
		}
	}
}

// A trainer that saves into a complete checkpoint directory again (a rollback saving a step
// again, one directory for every save) while the marker of the last save stays: half way, the
// directory holds some files of each save. The checkpoint is not complete until the marker is
// written again, and then its commit is the new save whole, never a mix of the two. The second
// save's first write is a file written again, or a file the first save did not have (a set of
// shards that changed, as DCP's after a change of world size: before, the new file was sent and
// committed with the old ones, a mix of two saves as LATEST; found from outside).
func TestUploaderWaitsForTheMarkerAfterARewrite(t *testing.T) {
	for _, newFile := range []bool{false, true} {
		for _, restart := range []bool{false, true} {
			name := map[bool]string{false: "rewrite", true: "new file"}[newFile] + map[bool]string{false: ", running", true: ", restarted"}[restart]
			t.Run(name, func(t *testing.T) {
				dir, state := t.TempDir(), t.TempDir()
				store := newMemStore()
				cfg := UploaderConfig{StateDir: state, StopBudget: -1}
				r := startUploaderWith(t, dir, store, cfg)
				save1 := map[string][]byte{"a.bin": randomBytes(t, 64<<10), "b.bin": randomBytes(t, 64<<10)}
				writeCheckpoint(t, dir, "step-1", save1)
				first := r.waitCommitted("step-1").Manifest
				if restart {
					r.stop()
				}

				// The second save has written its first file when the agent looks (or,
				// restarted, comes back).
				ck := filepath.Join(dir, "step-1")
				save2 := map[string][]byte{"a.bin": randomBytes(t, 64<<10), "b.bin": randomBytes(t, 64<<10)}
				if newFile {
					save2["c.bin"] = randomBytes(t, 64<<10)
					if err := os.WriteFile(filepath.Join(ck, "c.bin"), save2["c.bin"], 0o644); err != nil {
						t.Fatal(err)
					}
				} else {
					rewriteLater(t, filepath.Join(ck, "a.bin"), save2["a.bin"])
				}
				if restart {
					r = startUploaderWith(t, dir, store, cfg)
				}
				r.waitRewriteSeen("step-1")
				if newFile {
					rewriteLater(t, filepath.Join(ck, "a.bin"), save2["a.bin"])
				}
				rewriteLater(t, filepath.Join(ck, "b.bin"), save2["b.bin"])
				writeMarker(t, ck)
				ev := r.waitCommitted("step-1")
				if ev.Manifest.Commit == first.Commit {
					t.Fatalf("the second save was taken for the first one's commit %s", first.Commit)
				}
				restoreAndCompare(t, store, "step-1", save2)
				cs := commitsOf(t, store, "step-1")
				if len(cs) != 2 || cs[0].Commit != ev.Manifest.Commit {
					t.Errorf("%d commits of step-1, newest %s; want 2, the second save's %s newest", len(cs), cs[0].Commit, ev.Manifest.Commit)
				}
			})
		}
	}
}

// A trainer that writes its marker first, into an empty directory: a checkpoint with nothing but
// its marker, complete as the contract has it (committed, with a warning). A file that comes
// after the marker is not part of the save it vouches for: the checkpoint is not complete again
// until the marker is written again. Before, each file was committed with the marker as it
// came. (Found from outside.)
func TestUploaderWaitsForTheMarkerWrittenFirst(t *testing.T) {
	for _, restart := range []bool{false, true} {
		t.Run(map[bool]string{false: "marker first", true: "marker first, restarted"}[restart], func(t *testing.T) {
			dir := t.TempDir()
			store := newMemStore()
			cfg := UploaderConfig{StateDir: t.TempDir(), StopBudget: -1}
			r := startUploaderWith(t, dir, store, cfg)
			ck := filepath.Join(dir, "step-2")
			if err := os.MkdirAll(ck, 0o755); err != nil {
				t.Fatal(err)
			}
			writeMarker(t, ck)
			r.waitCommitted("step-2") // complete with nothing but its marker, as the contract has it
			if !strings.Contains(r.logs.String(), msgOnlyMarker) {
				t.Errorf("no warning that step-2 has nothing but its marker")
			}
			save := map[string][]byte{"a.bin": randomBytes(t, 64<<10), "b.bin": randomBytes(t, 64<<10)}
			if err := os.WriteFile(filepath.Join(ck, "a.bin"), save["a.bin"], 0o644); err != nil {
				t.Fatal(err)
			}
			r.waitRewriteSeen("step-2")
			if restart {
				// The restarted agent finds the file and the marker together; the journal says
				// the file came after that marker.
				r.stop()
				r = startUploaderWith(t, dir, store, cfg)
			}
			waitStored(t, store, "job/step-2/", "/a.bin")
			if err := os.WriteFile(filepath.Join(ck, "b.bin"), save["b.bin"], 0o644); err != nil {
				t.Fatal(err)
			}
			waitStored(t, store, "job/step-2/", "/b.bin")
			writeMarker(t, ck) // written again, last: now it vouches for a.bin and b.bin
			r.waitCommitted("step-2")
			restoreAndCompare(t, store, "step-2", save)
			for _, c := range commitsOf(t, store, "step-2") {
				if n := len(c.Files); n != 1 && n != 3 {
					t.Errorf("commit %s of step-2 has %d files; want the marker alone or the whole save", c.Commit, n)
				}
			}
		})
	}
}

// A file written into a complete checkpoint directory after its marker, before its commit (a
// marker written first, its data milliseconds later): the checkpoint is not complete until the
// marker is written again, and that is said as a CheckpointWithheld naming the file. Before, it
// was a warning alone: a notice saved for it stayed "checkpoint written" past its deadline, and
// then said its upload went on, though every file was stored (found from outside).
func TestFileWrittenAfterTheMarkerBeforeTheCommitIsWithheld(t *testing.T) {
	dir := t.TempDir()
	mem := newMemStore()
	bs := &blockingStore{Store: mem, started: make(chan string, 1), release: make(chan struct{})}
	r := startUploader(t, dir, bs, 0)
	files := writtenAfterMarker(t, r, bs, "step-1", "b.bin")
	close(bs.release)
	writeMarker(t, filepath.Join(dir, "step-1")) // written again, last
	r.waitCommitted("step-1")
	restoreAndCompare(t, mem, "step-1", files)
}

// writtenAfterMarker writes checkpoint name into r's directory, whose store bs holds its first
// file's upload (no commit can come), then the file late into it after its marker: the
// checkpoint must be withheld, naming it. It returns the files written.
func writtenAfterMarker(t *testing.T, r *uploaderRig, bs *blockingStore, name, late string) map[string][]byte {
	t.Helper()
	files := map[string][]byte{"a.bin": randomBytes(t, 64<<10)}
	writeCheckpoint(t, r.dir, name, files)
	<-bs.started // a.bin's upload, held: no commit before the next file is seen
	r.waitEvent(CheckpointComplete, name)
	files[late] = randomBytes(t, 64<<10)
	if err := os.WriteFile(filepath.Join(r.dir, name, late), files[late], 0o644); err != nil {
		t.Fatal(err)
	}
	if ev := r.waitEvent(CheckpointWithheld, name); !errors.Is(ev.Err, ErrWrittenAfterMarker) || !strings.Contains(ev.Err.Error(), name+"/"+late) {
		t.Errorf("withheld for %v; want ErrWrittenAfterMarker naming %s/%s", ev.Err, name, late)
	}
	return files
}

// An agent restarted with such a checkpoint in its journal (its marker stale) held it back and said
// nothing until a stop, which called it unreadable (found from outside). It says it withheld as
// it starts.
func TestRestartWithACheckpointWrittenAfterItsMarkerSaysItWithheld(t *testing.T) {
	dir, state := t.TempDir(), t.TempDir()
	mem := newMemStore()
	bs := &blockingStore{Store: mem, started: make(chan string, 1), release: make(chan struct{})}
	r := startUploaderWith(t, dir, bs, UploaderConfig{StateDir: state, StopBudget: -1})
	writtenAfterMarker(t, r, bs, "step-1", "b.bin")
	r.stop()

	r = startUploaderWith(t, dir, mem, UploaderConfig{StateDir: state, StopBudget: -1})
	if ev := r.waitEvent(CheckpointWithheld, "step-1"); !errors.Is(ev.Err, ErrWrittenAfterMarker) {
		t.Errorf("restarted: step-1 withheld for %v; want ErrWrittenAfterMarker", ev.Err)
	}
	if l := r.logs.String(); !strings.Contains(l, `"checkpoint":"step-1"`) || !strings.Contains(l, "the journal of an earlier run says so") {
		t.Errorf("restarted: no line says why step-1 is withheld:\n%s", l)
	}
	if got := commitsOf(t, mem, "step-1"); len(got) != 0 {
		t.Errorf("step-1 has %d commits; want none until its marker is written again", len(got))
	}
}

// A stop with such a checkpoint on disk: its marker is no new one to wait for. A stop waited 5 s
// for it, then said it unreadable or still being read (found from outside).
func TestStopDoesNotWaitForAMarkerAFileWasWrittenAfter(t *testing.T) {
	bs := &blockingStore{Store: newMemStore(), started: make(chan string, 1), release: make(chan struct{})}
	r := startUploader(t, t.TempDir(), bs, 0)
	writtenAfterMarker(t, r, bs, "step-1", "late.bin")
	r.stop()
	if l := r.logs.String(); strings.Contains(l, "did not complete in time") {
		t.Errorf("the stop waited for the marker a file was written after:\n%s", l)
	}
}

// The journal is a cache of what the store holds: a restarted agent whose journal says its
// newest checkpoint is committed, while the store no longer holds that commit (its manifest
// deleted by hand, a prefix wiped, a lifecycle rule) and nothing there is newer, commits it again.
// Before, the journal won: the checkpoint was never sent again, /status said it was committed,
// and LATEST went back to the one before. A commit retention deleted (older than what the store
// keeps) is not sent again. (Found from outside, with awscli.)
func TestRestartCommitsAgainWhatTheStoreLost(t *testing.T) {
	dir, state := t.TempDir(), t.TempDir()
	store := newMemStore()
	cfg := UploaderConfig{StateDir: state, StopBudget: -1, Keep: 2}
	r := startUploaderWith(t, dir, store, cfg)
	saves := map[string]map[string][]byte{}
	var last *Manifest
	for _, name := range []string{"step-1", "step-2", "step-3"} {
		if last != nil {
			// Saves some time apart, as a trainer's are: each completes after the last commit's
			// completion (the clock read, not waited on for an event).
			for !time.Now().After(last.Order().At.Add(10 * time.Millisecond)) {
				<-time.After(time.Millisecond)
			}
		}
		saves[name] = map[string][]byte{"a.bin": randomBytes(t, 4<<10)}
		writeCheckpoint(t, dir, name, saves[name])
		last = r.waitCommitted(name).Manifest
	}
	r.stop()
	if cs := commitsOf(t, store, "step-1"); len(cs) != 0 {
		t.Fatalf("step-1 not deleted by retention (checkpoint.keep 2): %d commits", len(cs))
	}
	store.remove(ManifestKey("job", "step-3", last.Commit))

	r = startUploaderWith(t, dir, store, cfg)
	again := r.waitCommitted("step-3").Manifest
	if again.Commit == last.Commit {
		t.Errorf("step-3 committed as %s again; want a new commit", again.Commit)
	}
	restoreAndCompare(t, store, "step-3", saves["step-3"])
	var l Latest
	if data, _, err := store.GetBytes(t.Context(), LatestKey("job")); err != nil || json.Unmarshal(data, &l) != nil || l.Checkpoint != "step-3" || l.Commit != again.Commit {
		t.Errorf("LATEST = %s (%v); want step-3 %s", data, err, again.Commit)
	}
	r.stop()
	if cs := commitsOf(t, store, "step-1"); len(cs) != 0 {
		t.Errorf("step-1, deleted by retention, sent again: %d commits", len(cs))
	}
}

// commitThenStage commits step-1 from dirB (an agent with cfg, stopped after) and writes a second
// save, name2, into a staging directory it returns: completed now, to be moved into dirB and sent
// later. It returns once the clock is past that save's completion, so that what comes next (a
// restore) comes after it (the clock read, not waited on for an event: file times advance in
// ticks).
func commitThenStage(t *testing.T, dirB string, store Store, cfg UploaderConfig, name2 string) (first *Manifest, stage string, save2 map[string][]byte) {
	t.Helper()
	b := startUploaderWith(t, dirB, store, cfg)
	writeCheckpoint(t, dirB, "step-1", map[string][]byte{"a.bin": randomBytes(t, 4<<10)})
	first = b.waitCommitted("step-1").Manifest
	b.stop()
	stage = filepath.Join(t.TempDir(), "stage")
	save2 = map[string][]byte{"a.bin": randomBytes(t, 4<<10)}
	writeCheckpoint(t, stage, name2, save2)
	fi, err := os.Stat(filepath.Join(stage, name2, "_COMPLETE"))
	if err != nil {
		t.Fatal(err)
	}
	for !time.Now().After(fi.ModTime().Add(20 * time.Millisecond)) {
		<-time.After(time.Millisecond)
	}
	return first, stage, save2
}

// waitStatusCommitted waits until /status says checkpoint name is committed, and returns its
// status.
func (r *uploaderRig) waitStatusCommitted(name string) CheckpointStatus {
	r.t.Helper()
	var got CheckpointStatus
	eventuallyUploader(r.t, name+" committed in the status", func() bool {
		for _, c := range r.up.Status(r.t.Context()).Checkpoints {
			if c.Name == name && c.Committed {
				got = c
				return true
			}
		}
		return false
	})
	return got
}

// A restored copy of a commit is not a newer save than a commit that completed before the
// restore. Instance B commits step-1 and completes step-2, whose upload is slow; its replacement
// A restores step-1 (the newest commit then), and its agent takes it as committed; B then commits
// step-2, and retention (checkpoint.keep 1) deletes step-1. A's agent, restarted, took its
// restored copy, dated by the restore, for newer than step-2: it committed step-1 again as
// LATEST, and retention deleted step-2. A second restore onto a disk that kept the first one's
// copy (a trainer saving into one name) took that copy for a newer save and restored nothing.
// Restored files are dated to their commit's completion now, and the journal keeps a done
// commit's place.
func TestRestoredCopyKeepsItsCommitsPlace(t *testing.T) {
	for _, name2 := range []string{"step-2", "step-1"} { // a new name, or the same name saved again
		t.Run(name2, func(t *testing.T) {
			dirA, dirB, stateA := t.TempDir(), t.TempDir(), t.TempDir()
			store := newMemStore()
			cfg := UploaderConfig{StopBudget: -1, Keep: 1}
			first, stage, save2 := commitThenStage(t, dirB, store, cfg, name2)
			if _, err := Restore(t.Context(), store, RestoreOptions{Job: "job", To: dirA, Logger: zerolog.Nop()}); err != nil {
				t.Fatal(err)
			}
			a := startUploaderWith(t, dirA, store, UploaderConfig{StopBudget: -1, Keep: 1, StateDir: stateA})
			a.waitStatusCommitted("step-1")
			a.stop()
			if err := os.Rename(filepath.Join(stage, name2), filepath.Join(dirB, name2+".moving")); err != nil {
				t.Fatal(err)
			}
			if name2 == "step-1" {
				if err := os.RemoveAll(filepath.Join(dirB, "step-1")); err != nil {
					t.Fatal(err)
				}
			}
			if err := os.Rename(filepath.Join(dirB, name2+".moving"), filepath.Join(dirB, name2)); err != nil {
				t.Fatal(err)
			}
			b := startUploaderWith(t, dirB, store, cfg)
			var second *Manifest
			eventuallyUploader(t, "B to commit the second save", func() bool {
				for _, m := range commitsOf(t, store, name2) {
					if m.Commit != first.Commit {
						second = m
						return true
					}
				}
				return false
			})
			b.stop()

			a = startUploaderWith(t, dirA, store, UploaderConfig{StopBudget: -1, Keep: 1, StateDir: stateA})
			a.stop()
			var l Latest
			if data, _, err := store.GetBytes(t.Context(), LatestKey("job")); err != nil || json.Unmarshal(data, &l) != nil ||
				l.Checkpoint != name2 || l.Commit != second.Commit {
				t.Errorf("LATEST = %s (%v); want %s %s, the second save\n%s", data, err, name2, second.Commit, a.logs)
			}
			if strings.Contains(a.logs.String(), "committing it again") {
				t.Errorf("A committed its restored copy again:\n%s", a.logs)
			}
			restoreAndCompare(t, store, name2, save2)
			// Dated to its commit: a restore onto A's disk, which holds the first restore's
			// copy, takes it for an older save than the second (restoreJudge), not a newer one.
			for _, rel := range []string{"a.bin", "_COMPLETE"} {
				fi, err := os.Stat(filepath.Join(dirA, "step-1", rel))
				if err != nil || !fi.ModTime().Equal(first.Order().At) {
					t.Errorf("restored %s: modified %v (%v); want %v, when its commit completed", rel, fi.ModTime(), err, first.Order().At)
				}
			}
		})
	}
}

// slowStartStore holds the uploader's first directory listing of the store (its start's read of
// the job) until release is closed; listed is closed when it begins.
type slowStartStore struct {
	*memStore
	listed, release chan struct{}
	once            sync.Once
}

func (s *slowStartStore) ListDir(ctx context.Context, prefix string) ([]string, []ObjectInfo, error) {
	s.once.Do(func() {
		close(s.listed)
		select {
		case <-s.release:
		case <-ctx.Done():
		}
	})
	return s.memStore.ListDir(ctx, prefix)
}

// A stop that comes while the store holds up the uploader's start, with a complete checkpoint on
// disk that no commit holds (the agent restarted after a crash, then the instance's shutdown):
// the events of the directory's first read were not in yet, so the stop found nothing to drain
// (or the checkpoint without its marker) and left it. It reads the rest of the directory first,
// and drains it.
func TestStopDuringStartDrainsACompleteCheckpoint(t *testing.T) {
	dir := t.TempDir()
	files := map[string][]byte{"a.bin": randomBytes(t, 4<<10), "b.bin": randomBytes(t, 4<<10)}
	writeCheckpoint(t, dir, "step-1", files)
	store := &slowStartStore{memStore: newMemStore(), listed: make(chan struct{}), release: make(chan struct{})}
	r := startUploaderTweaked(t, dir, store, UploaderConfig{StopBudget: 10 * time.Second, AwaitFirstRead: true},
		func(w *Watcher) { w.readDone = true })
	<-store.listed
	r.cancel() // SIGTERM
	close(store.release)
	r.waitDone("the stop's drain")
	if ms := commitsOf(t, store.memStore, "step-1"); len(ms) != 1 {
		t.Fatalf("step-1 has %d commits after the stop; want 1, drained\n%s", len(ms), r.logs)
	}
	restoreAndCompare(t, store.memStore, "step-1", files)
}

// deletedBeforeAdoption is a store in which retention (another agent's) deletes a commit just
// before the uploader reads its manifest for the second time: after it looked the checkpoint up,
// as it adopts a restored copy of it.
type deletedBeforeAdoption struct {
	*memStore
	manifest, prefix string
	reads            atomic.Int32
}

func (s *deletedBeforeAdoption) GetBytes(ctx context.Context, key string) ([]byte, string, error) {
	if key == s.manifest && s.reads.Add(1) == 2 {
		var keys []string
		s.mu.Lock()
		for k := range s.objs {
			if strings.HasPrefix(k, s.prefix) {
				keys = append(keys, k)
			}
		}
		s.mu.Unlock()
		if err := s.memStore.Delete(ctx, keys...); err != nil {
			return nil, "", err
		}
	}
	return s.memStore.GetBytes(ctx, key)
}

// A restored copy whose commit retention deletes while the agent adopts it is committed again, in
// its place, and the warning names the deleted commit (it had an empty "commit" field).
func TestRestoredCopyWhoseCommitIsDeletedIsCommittedAgainNamingIt(t *testing.T) {
	dirA, dirB := t.TempDir(), t.TempDir()
	store := newMemStore()
	b := startUploaderWith(t, dirB, store, UploaderConfig{StopBudget: -1})
	files := map[string][]byte{"a.bin": randomBytes(t, 4<<10)}
	writeCheckpoint(t, dirB, "step-1", files)
	first := b.waitCommitted("step-1").Manifest
	b.stop()
	if _, err := Restore(t.Context(), store, RestoreOptions{Job: "job", To: dirA, Logger: zerolog.Nop()}); err != nil {
		t.Fatal(err)
	}
	ds := &deletedBeforeAdoption{memStore: store, manifest: ManifestKey("job", "step-1", first.Commit),
		prefix: CommitPrefix("job", "step-1", first.Commit)}
	a := startUploaderWith(t, dirA, ds, UploaderConfig{StopBudget: -1})
	again := a.waitCommitted("step-1").Manifest
	a.stop()
	if again.Commit == first.Commit || !again.Order().At.Equal(first.Order().At) {
		t.Errorf("committed again as %s at %v; want a new commit in %s's place, %v", again.Commit, again.Order().At, first.Commit, first.Order().At)
	}
	logs := a.logs.String()
	if !strings.Contains(logs, "committing it again, in its place") || !strings.Contains(logs, `"deleted_commit":"`+first.Commit+`"`) ||
		strings.Contains(logs, `"commit":""`) {
		t.Errorf("want the warning naming the deleted commit %s, and no empty commit field:\n%s", first.Commit, logs)
	}
	restoreAndCompare(t, store, "step-1", files)
}

// A restore into the agent's checkpoint.dir tells the agent's journal what it put there, so an
// agent that starts only after another instance committed a newer save of the same name (and
// retention deleted the restored commit) knows the restored copy for that older commit. Before,
// that agent took the copy (its files new to the file system, the store holding another version
// of its name) for a newer save: committed as LATEST, and retention deleted the newer one.
// (Found from outside.)
func TestRestoreTellsTheAgentsJournal(t *testing.T) {
	dirA, dirB, stateA := t.TempDir(), t.TempDir(), t.TempDir()
	store := newMemStore()
	cfg := UploaderConfig{StopBudget: -1, Keep: 1}
	first, stage, save2 := commitThenStage(t, dirB, store, cfg, "step-1")
	opts := RestoreOptions{Job: "job", To: dirA, Logger: zerolog.Nop(), Journal: JournalPath(stateA, "job", dirA, store.URL())}
	if res, err := Restore(t.Context(), store, opts); err != nil || res.Commit != first.Commit {
		t.Fatalf("Restore = %+v, %v; want %s", res, err, first.Commit)
	}
	if err := os.RemoveAll(filepath.Join(dirB, "step-1")); err != nil {
		t.Fatal(err)
	}
	if err := os.Rename(filepath.Join(stage, "step-1"), filepath.Join(dirB, "step-1")); err != nil {
		t.Fatal(err)
	}
	b := startUploaderWith(t, dirB, store, cfg)
	second := b.waitCommitted("step-1").Manifest
	b.stop()
	if cs := commitsOf(t, store, "step-1"); len(cs) != 1 || cs[0].Commit != second.Commit {
		t.Fatalf("step-1's commits = %d; want the second save's alone (checkpoint.keep 1)", len(cs))
	}

	a := startUploaderWith(t, dirA, store, UploaderConfig{StopBudget: -1, Keep: 1, StateDir: stateA})
	got := a.waitStatusCommitted("step-1")
	a.stop()
	if got.Commit != first.Commit {
		t.Errorf("A's step-1 is commit %s; want %s, the restored one", got.Commit, first.Commit)
	}
	var l Latest
	if data, _, err := store.GetBytes(t.Context(), LatestKey("job")); err != nil || json.Unmarshal(data, &l) != nil || l.Commit != second.Commit {
		t.Errorf("LATEST = %s (%v); want %s, the second save\n%s", data, err, second.Commit, a.logs)
	}
	restoreAndCompare(t, store, "step-1", save2)
}

// An agent restarted half way through a save into a complete directory again, after it had
// seen the first file written again and begun to send it to a new commit, still waits for the
// marker: the journal says which marker no longer vouches for the files.
func TestUploaderRestartMidRewriteWaitsForTheMarker(t *testing.T) {
	dir, store := t.TempDir(), newMemStore()
	r, cfg, first := commitWithJournal(t, dir, store, "step-1", map[string][]byte{"a.bin": randomBytes(t, 64<<10), "b.bin": randomBytes(t, 64<<10)})
	ck := filepath.Join(dir, "step-1")
	save2 := map[string][]byte{"a.bin": randomBytes(t, 64<<10), "b.bin": randomBytes(t, 64<<10)}
	rewriteLater(t, filepath.Join(ck, "a.bin"), save2["a.bin"])
	r.waitRewriteSeen("step-1")
	eventuallyUploader(t, "the new a.bin stored in a new commit", func() bool {
		for _, c := range r.up.Status(t.Context()).Checkpoints {
			if c.Name == "step-1" && c.Commit != "" && c.Commit != first.Commit && c.FilesStored > 0 {
				return true
			}
		}
		return false
	})
	r.stop()

	r = startUploaderWith(t, dir, store, cfg)
	var st CheckpointStatus
	eventuallyUploader(t, "the restarted agent to store what it found", func() bool {
		for _, c := range r.up.Status(t.Context()).Checkpoints {
			if c.Name == "step-1" {
				st = c
			}
		}
		return st.Commit != first.Commit && (st.Committed || (st.Files == 3 && st.FilesStored == 3))
	})
	if st.Committed || st.Complete {
		t.Fatalf("restarted half way through the second save, step-1 is %+v; want not complete (a mix of two saves)", st)
	}
	rewriteLater(t, filepath.Join(ck, "b.bin"), save2["b.bin"])
	writeMarker(t, ck)
	r.waitCommitted("step-1")
	restoreAndCompare(t, store, "step-1", save2)
	if cs := commitsOf(t, store, "step-1"); len(cs) != 2 {
		t.Errorf("%d commits of step-1; want 2, one per save", len(cs))
	}
}

// A trainer that takes the marker away before it saves into the directory again does what it
// should: the new save is committed once its marker is there, with no warning.
func TestUploaderSaveIntoADirectoryAgainMarkerRemovedFirst(t *testing.T) {
	dir := t.TempDir()
	store := newMemStore()
	r := startUploader(t, dir, store, 0)
	writeCheckpoint(t, dir, "step-1", map[string][]byte{"a.bin": randomBytes(t, 64<<10), "b.bin": randomBytes(t, 64<<10)})
	first := r.waitCommitted("step-1").Manifest
	ck := filepath.Join(dir, "step-1")
	if err := os.Remove(filepath.Join(ck, "_COMPLETE")); err != nil {
		t.Fatal(err)
	}
	eventuallyUploader(t, "the marker's removal seen", func() bool {
		for _, c := range r.up.Status(t.Context()).Checkpoints {
			if c.Name == "step-1" && !c.Complete {
				return true
			}
		}
		return false
	})
	save2 := map[string][]byte{"a.bin": randomBytes(t, 64<<10), "b.bin": randomBytes(t, 64<<10)}
	rewriteLater(t, filepath.Join(ck, "a.bin"), save2["a.bin"])
	rewriteLater(t, filepath.Join(ck, "b.bin"), save2["b.bin"])
	writeMarker(t, ck)
	if ev := r.waitCommitted("step-1"); ev.Manifest.Commit == first.Commit {
		t.Fatalf("the second save was taken for the first one's commit %s", first.Commit)
	}
	restoreAndCompare(t, store, "step-1", save2)
	if strings.Contains(r.logs.String(), msgRewrittenAfterMarker) {
		t.Errorf("warned of a file written after the marker, which had been taken away first:\n%s", r.logs.String())
	}
}

// A file written again after the marker but before its watch event (its debounce) is found by
// the commit's last look at the directory: the checkpoint is not committed as it is then (the
// new file beside the old save's others), but once its marker is written again.
func TestUploaderCommitFindsARewriteAfterTheMarker(t *testing.T) {
	dir := t.TempDir()
	store := newMemStore()
	r, events := startUploaderFed(t, dir, store, UploaderConfig{})
	ck := filepath.Join(dir, "step-1")
	save1 := map[string][]byte{"a.bin": randomBytes(t, 64<<10), "b.bin": randomBytes(t, 64<<10)}
	writeCheckpoint(t, dir, "step-1", save1)
	ready := func(rel string) { sendReady(t, events, dir, "step-1", rel) }
	ready("a.bin")
	ready("b.bin")
	eventuallyUploader(t, "both files stored", func() bool {
		store.mu.Lock()
		defer store.mu.Unlock()
		return len(store.objs) >= 2
	})
	save2 := map[string][]byte{"a.bin": randomBytes(t, 64<<10), "b.bin": randomBytes(t, 64<<10)}
	rewriteLater(t, filepath.Join(ck, "a.bin"), save2["a.bin"])
	ready("_COMPLETE") // the marker of the first save: its commit looks at the directory once more
	r.waitRewriteSeen("step-1")
	rewriteLater(t, filepath.Join(ck, "b.bin"), save2["b.bin"])
	writeMarker(t, ck)
	ready("a.bin")
	ready("b.bin")
	ready("_COMPLETE")
	r.waitCommitted("step-1")
	restoreAndCompare(t, store, "step-1", save2)
	if cs := commitsOf(t, store, "step-1"); len(cs) != 1 {
		t.Errorf("%d commits of step-1; want 1, the second save", len(cs))
	}
}

// After a restart the uploader commits what is complete but not committed, and sends nothing
// for what is already committed.
func TestUploaderRecoversAfterRestart(t *testing.T) {
	dir, storeDir := t.TempDir(), t.TempDir()
	store, err := NewFileStore(storeDir)
	if err != nil {
		t.Fatal(err)
	}
	old := map[string][]byte{"w": randomBytes(t, 1<<20)}
	writeCheckpoint(t, dir, "step-1", old)
	r := startUploader(t, dir, store, 0)
	r.waitCommitted("step-1")
	r.stop()

	// While the agent was down: a new complete checkpoint, and a manifest-less partial upload.
	newer := map[string][]byte{"w": randomBytes(t, 1<<20)}
	writeCheckpoint(t, dir, "step-2", newer)
	r2 := startUploader(t, dir, store, 0)
	ev := r2.waitCommitted("step-2")
	if ev.Manifest.Trigger != "periodic" {
		t.Errorf("trigger = %q", ev.Manifest.Trigger)
	}
	// step-1 is found committed once its files have been checksummed against the store's commit,
	// which may end after step-2's commit: poll, with a deadline.
	deadline := time.Now().Add(20 * time.Second)
	tick := time.NewTicker(10 * time.Millisecond)
	defer tick.Stop()
	for {
		var pending []string
		for _, c := range r2.up.Status(t.Context()).Checkpoints {
			if !c.Committed {
				pending = append(pending, c.Name)
			}
		}
		if len(pending) == 0 {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("checkpoints %q not committed 20 s after the restart", pending)
		}
		<-tick.C
	}
	restoreAndCompare(t, store, "step-2", newer)
}

// A file stored and then renamed away before the marker (a trainer's visible temporary file)
// is not part of the commit, for the journal either: after a restart, the checkpoint restored
// into the directory again is found to be that commit, and nothing is sent.
func TestUploaderRestartKnowsOnlyTheCommittedFiles(t *testing.T) {
	dir, state := t.TempDir(), t.TempDir()
	store := newMemStore()
	cfg := UploaderConfig{StateDir: state, StopBudget: -1}
	r, events := startUploaderFed(t, dir, store, cfg)
	ck := filepath.Join(dir, "step-1")
	if err := os.MkdirAll(ck, 0o755); err != nil {
		t.Fatal(err)
	}
	// ready sends the FileReady (or, for the marker, Complete) of the files of step-1 under dir.
	ready := func(events chan<- WatchEvent, dir string, rels ...string) {
		sendReady(t, events, dir, "step-1", rels...)
	}
	w := randomBytes(t, 64<<10)
	if err := os.WriteFile(filepath.Join(ck, "w.tmp"), w, 0o644); err != nil {
		t.Fatal(err)
	}
	ready(events, dir, "w.tmp")
	eventuallyUploader(t, "w.tmp stored", func() bool {
		store.mu.Lock()
		defer store.mu.Unlock()
		for k := range store.objs {
			if strings.HasSuffix(k, "/w.tmp") {
				return true
			}
		}
		return false
	})
	if err := os.Rename(filepath.Join(ck, "w.tmp"), filepath.Join(ck, "w")); err != nil {
		t.Fatal(err)
	}
	events <- WatchEvent{Kind: FileGone, Checkpoint: "step-1", Path: "w.tmp", At: time.Now()}
	if err := os.WriteFile(filepath.Join(ck, "_COMPLETE"), nil, 0o644); err != nil {
		t.Fatal(err)
	}
	ready(events, dir, "w", "_COMPLETE")
	first := r.waitCommitted("step-1").Manifest
	r.stop()
	entries, err := readJournal(JournalPath(state, "job", dir, store.URL()))
	if err != nil {
		t.Fatal(err)
	}
	if e := entries["step-1"]; e == nil || !e.done || len(e.files) != 2 || e.files["w.tmp"].key != "" {
		t.Fatalf("journal of step-1: %+v; want its commit done with w and the marker only", e)
	}

	// The agent was killed after its manifest landed, before the journal said so (its done line
	// is lost); the checkpoint is deleted; the agent restarts while the store cannot list, so it
	// knows the commit from its journal and the manifest's key alone; and the commit is restored
	// into the directory again (by hand, or spotguard-restore on the same instance).
	jpath := JournalPath(state, "job", dir, store.URL())
	lines, err := os.ReadFile(jpath)
	if err != nil {
		t.Fatal(err)
	}
	var kept []string
	for l := range strings.Lines(string(lines)) {
		if !strings.Contains(l, `"op":"done"`) {
			kept = append(kept, l)
		}
	}
	if err := os.WriteFile(jpath, []byte(strings.Join(kept, "")), 0o600); err != nil {
		t.Fatal(err)
	}
	if err := os.RemoveAll(ck); err != nil {
		t.Fatal(err)
	}
	store.mu.Lock()
	store.listErr = errors.New("503 SlowDown")
	store.mu.Unlock()
	r2, events2 := startUploaderFed(t, dir, store, cfg)
	eventuallyUploader(t, "the restarted agent to fail to read the job", func() bool { return strings.Contains(r2.logs.String(), "cannot read the job") })
	store.mu.Lock()
	store.listErr = nil
	store.mu.Unlock()
	if _, err := Restore(t.Context(), store, RestoreOptions{Job: "job", Checkpoint: "step-1", To: dir, Logger: zerolog.Nop()}); err != nil {
		t.Fatal(err)
	}
	ready(events2, dir, "w", "_COMPLETE")
	if ev := r2.waitCommitted("step-1"); !ev.Already || ev.Manifest.Commit != first.Commit {
		t.Errorf("restored step-1: committed as %s (already in the store: %v); want found to be %s, nothing sent", ev.Manifest.Commit, ev.Already, first.Commit)
	}
}

func TestUploaderRetention(t *testing.T) {
	dir := t.TempDir()
	store := newMemStore()
	r := startUploader(t, dir, store, 2)
	var last time.Time
	for _, name := range []string{"step-1", "step-2", "step-3", "step-4"} {
		// Commits are ordered by their marker's time, and two markers written within one tick of
		// the kernel's file clock (4 ms) tie, to be ordered by the random part of the commit id.
		waitFileClockAfter(t, last)
		writeCheckpoint(t, dir, name, map[string][]byte{"w": randomBytes(t, 64<<10)})
		fi, err := os.Stat(filepath.Join(dir, name, "_COMPLETE"))
		if err != nil {
			t.Fatal(err)
		}
		last = fi.ModTime()
		r.waitCommitted(name)
	}
	cs, problems, err := ListCommitted(t.Context(), store, "job")
	if err != nil || len(problems) > 0 {
		t.Fatalf("ListCommitted: %v %v", err, problems)
	}
	var names []string
	for _, c := range cs {
		names = append(names, c.Manifest.Checkpoint)
	}
	if len(names) != 2 || names[0] != "step-4" || names[1] != "step-3" || !cs[0].Latest {
		t.Errorf("after retention: %v (latest %v); want [step-4 step-3], step-4 LATEST", names, cs[0].Latest)
	}
	objs, _ := store.List(t.Context(), "job/step-1/")
	if len(objs) != 0 {
		t.Errorf("step-1 still has %d objects after retention", len(objs))
	}
}

// blockingStore holds every PutFile until released, to stop the agent mid-upload.
type blockingStore struct {
	Store
	started chan string
	release chan struct{}
}

func (b *blockingStore) PutFile(ctx context.Context, key string, f *os.File, size int64, progress func(int64)) (Checksum, error) {
	select {
	case b.started <- key:
	default:
	}
	select {
	case <-b.release:
	case <-ctx.Done():
		return Checksum{}, ctx.Err()
	}
	return b.Store.PutFile(ctx, key, f, size, progress)
}

// Stopping is not draining: with a notice pending, cancelling Run does not abandon the upload;
// the checkpoint is committed before Run returns.
func TestUploaderFinishesNoticeUploadAfterStop(t *testing.T) {
	dir := t.TempDir()
	mem := newMemStore()
	bs := &blockingStore{Store: mem, started: make(chan string, 1), release: make(chan struct{})}
	r := startUploader(t, dir, bs, 0)
	r.up.SetNotices([]ActiveNotice{{Key: "spot/terminate", Deadline: time.Now().Add(time.Minute), SignalledAt: time.Now()}})
	files := map[string][]byte{"w": randomBytes(t, 1<<20)}
	writeCheckpoint(t, dir, "step-9", files)
	select {
	case <-bs.started:
	case <-time.After(10 * time.Second):
		t.Fatal("upload never started")
	}
	r.waitEvent(CheckpointComplete, "step-9") // the watcher stops with the rig: let it see the marker first
	r.cancel()                                // SIGTERM
	select {
	case <-r.done:
		t.Fatal("Run returned while the notice's upload was in flight")
	default:
	}
	close(bs.release)
	<-r.done
	ev := r.waitCommitted("step-9")
	if _, _, err := mem.GetBytes(t.Context(), ManifestKey("job", "step-9", ev.Manifest.Commit)); err != nil {
		t.Fatalf("manifest after stop: %v; want it committed", err)
	}
	if ev.Manifest.Trigger != "notice" || ev.Manifest.Notice != "spot/terminate" {
		t.Errorf("trigger %q notice %q; want notice spot/terminate", ev.Manifest.Trigger, ev.Manifest.Notice)
	}
}

// A stop drains for at most the stop budget: with the store stuck, Run returns when it is spent,
// and no manifest exists.
func TestUploaderStopBudgetEndsDrain(t *testing.T) {
	dir := t.TempDir()
	mem := newMemStore()
	bs := &blockingStore{Store: mem, started: make(chan string, 1), release: make(chan struct{})}
	r := startUploaderWith(t, dir, bs, UploaderConfig{StopBudget: 500 * time.Millisecond})
	r.up.SetNotices([]ActiveNotice{{Key: "spot/terminate", Deadline: time.Now().Add(time.Minute), SignalledAt: time.Now()}})
	writeCheckpoint(t, dir, "step-9", map[string][]byte{"w": randomBytes(t, 1<<20)})
	<-bs.started
	r.waitEvent(CheckpointComplete, "step-9")
	r.cancel()
	<-r.done // returns when the budget is spent; release never comes
	if cs, _, err := ListCommitted(t.Context(), mem, "job"); err != nil || len(cs) != 0 {
		t.Fatalf("ListCommitted = %v, %v; want nothing committed", cs, err)
	}
}

// A second stop request (EndDrain) ends the drain at once: Run returns with the store still
// stuck, nothing is committed, and the log names the checkpoint it left.
func TestUploaderEndDrainStopsAtOnce(t *testing.T) {
	dir := t.TempDir()
	mem := newMemStore()
	bs := &blockingStore{Store: mem, started: make(chan string, 1), release: make(chan struct{})}
	defer close(bs.release)
	r := startUploader(t, dir, bs, 0)
	r.up.SetNotices([]ActiveNotice{{Key: "spot/terminate", Deadline: time.Now().Add(time.Minute), SignalledAt: time.Now()}})
	writeCheckpoint(t, dir, "step-9", map[string][]byte{"w": randomBytes(t, 1<<20)})
	<-bs.started
	r.waitEvent(CheckpointComplete, "step-9")
	r.cancel() // the first SIGTERM: Run drains (it still answers)
	ctx, cancel := context.WithTimeout(t.Context(), 10*time.Second)
	defer cancel()
	if st := r.up.Status(ctx); len(st.Checkpoints) != 1 {
		t.Fatalf("status after the stop = %+v; want Run draining step-9", st)
	}
	r.up.EndDrain() // the second
	r.up.EndDrain() // and a third changes nothing
	r.waitDone("Run still draining 10 s after EndDrain")
	if got := commitsOf(t, mem, "step-9"); len(got) != 0 {
		t.Errorf("step-9 has %d commits; want none (the store never answered)", len(got))
	}
	if log := r.logs.String(); !strings.Contains(log, "drain ended by a second stop request") || !strings.Contains(log, `"not_committed":["step-9"]`) {
		t.Errorf("log does not say the drain was ended and what it left:\n%s", log)
	}
}

// EndDrain before the stop: the stop does not drain at all.
func TestUploaderEndDrainBeforeStop(t *testing.T) {
	dir := t.TempDir()
	mem := newMemStore()
	bs := &blockingStore{Store: mem, started: make(chan string, 1), release: make(chan struct{})}
	defer close(bs.release)
	r := startUploader(t, dir, bs, 0)
	writeCheckpoint(t, dir, "step-1", map[string][]byte{"w": randomBytes(t, 64<<10)})
	<-bs.started
	r.waitEvent(CheckpointComplete, "step-1")
	r.up.EndDrain()
	r.cancel()
	r.waitDone("Run drained although the drain was ended before the stop")
	if log := r.logs.String(); !strings.Contains(log, `"not_committed":["step-1"]`) {
		t.Errorf("log does not name what was left:\n%s", log)
	}
}

// A marker caught by the watcher while still being written (size 0 in the event) is sent as it
// is on disk, and the checkpoint commits: the upload's own view of the file supersedes the
// event's older one.
func TestUploaderMarkerSeenWhileWritten(t *testing.T) {
	dir := t.TempDir()
	writeCheckpoint(t, dir, "step-1", map[string][]byte{"w": randomBytes(t, 1<<10)})
	marker := filepath.Join(dir, "step-1", "_COMPLETE")
	if err := os.WriteFile(marker, []byte("{\"step\": 1}\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	wfi, _ := os.Stat(filepath.Join(dir, "step-1", "w"))
	store := newMemStore()
	committed := make(chan UploadEvent, 4)
	up := NewUploader(UploaderConfig{Store: store, Job: "job", Dir: dir, Logger: zerolog.Nop(),
		OnEvent: func(ev UploadEvent) {
			if ev.Kind == CheckpointCommitted {
				committed <- ev
			}
		}})
	events := make(chan WatchEvent)
	ctx, cancel := context.WithCancel(t.Context())
	done := make(chan struct{})
	go func() { up.Run(ctx, events); close(done) }()
	defer func() { cancel(); <-done }()
	now := time.Now()
	events <- WatchEvent{Kind: FileReady, Checkpoint: "step-1", Path: "w", Size: wfi.Size(), ModTime: wfi.ModTime(), At: now}
	events <- WatchEvent{Kind: Complete, Checkpoint: "step-1", Path: "_COMPLETE", Size: 0, ModTime: now.Add(-time.Hour), At: now}
	select {
	case ev := <-committed:
		if len(ev.Manifest.Files) != 2 {
			t.Errorf("manifest files = %+v; want w and the marker", ev.Manifest.Files)
		}
	case <-time.After(10 * time.Second):
		t.Fatal("not committed: the stale marker event made the uploader resend forever")
	}
}

// An incomplete checkpoint the trainer abandoned before the notice does not hold up a stop once
// the notice's own checkpoint is committed.
func TestUploaderStopsAfterNoticeCommitDespiteAbandonedDir(t *testing.T) {
	dir := t.TempDir()
	os.MkdirAll(filepath.Join(dir, "step-0"), 0o755)
	os.WriteFile(filepath.Join(dir, "step-0", "partial.bin"), randomBytes(t, 1<<10), 0o644) // never completed
	r := startUploader(t, dir, newMemStore(), 0)
	r.up.SetNotices([]ActiveNotice{{Key: "spot/terminate", Deadline: time.Now().Add(time.Minute), SignalledAt: time.Now()}})
	writeCheckpoint(t, dir, "step-1", map[string][]byte{"w": randomBytes(t, 1<<10)})
	r.waitCommitted("step-1")
	r.cancel()
	select {
	case <-r.done:
	case <-time.After(5 * time.Second):
		t.Fatal("Run held the stop for an abandoned, incomplete checkpoint")
	}
}

// commitsOf returns the committed manifests of name in store, newest first.
func commitsOf(t *testing.T, store Store, name string) []*Manifest {
	t.Helper()
	cs, problems, err := ListCommitted(t.Context(), store, "job")
	if err != nil || len(problems) > 0 {
		t.Fatalf("ListCommitted: %v %v", err, problems)
	}
	var out []*Manifest
	for _, c := range cs {
		if c.Manifest.Checkpoint == name {
			out = append(out, c.Manifest)
		}
	}
	return out
}

// A file rewritten after its checkpoint was committed, with the same size and its modification
// time set back, is written after the marker the commit was complete with: not committed until
// the marker is written again (found from outside: committed anew under the old marker, the
// new bytes beside a save's others, as LATEST). Then it becomes a new commit with the new bytes,
// and the first commit's objects are never written again (I1, I2).
func TestUploaderSameSizeRewriteWithMtimeSetBack(t *testing.T) {
	dir := t.TempDir()
	store := newMemStore()
	r := startUploader(t, dir, store, 0)
	first := map[string][]byte{"w.bin": randomBytes(t, 64<<10)}
	writeCheckpoint(t, dir, "step-1", first)
	ev := r.waitCommitted("step-1")
	firstKey := ev.Manifest.Files[len(ev.Manifest.Files)-1].Key
	before, _, _ := store.GetBytes(t.Context(), firstKey)

	p := filepath.Join(dir, "step-1", "w.bin")
	fi, _ := os.Stat(p)
	second := randomBytes(t, 64<<10)
	if err := os.WriteFile(p, second, 0o644); err != nil {
		t.Fatal(err)
	}
	if err := os.Chtimes(p, fi.ModTime(), fi.ModTime()); err != nil {
		t.Fatal(err)
	}
	if w := r.waitEvent(CheckpointWithheld, "step-1"); !errors.Is(w.Err, ErrWrittenAfterMarker) {
		t.Fatalf("step-1 withheld for %v; want ErrWrittenAfterMarker", w.Err)
	}
	if got := commitsOf(t, store, "step-1"); len(got) != 1 {
		t.Fatalf("step-1 has %d commits before its marker is written again; want 1", len(got))
	}
	// Not said to be committed as a new commit while it is withheld (found from outside: the
	// line came 9 ms after the one saying it is not complete).
	if l := r.logs.String(); strings.Contains(l, "committing these as a new commit") {
		t.Errorf("log says the withheld rewrite is committed as a new commit:\n%s", l)
	}
	writeMarker(t, filepath.Join(dir, "step-1"))
	ev2 := r.waitCommitted("step-1")
	if ev2.Manifest.Commit == ev.Manifest.Commit {
		t.Fatalf("the rewrite was committed into the first commit %s", ev.Manifest.Commit)
	}
	if after, _, _ := store.GetBytes(t.Context(), firstKey); !bytes.Equal(before, after) {
		t.Errorf("the first commit's object %s was written again", firstKey)
	}
	restoreAndCompare(t, store, "step-1", map[string][]byte{"w.bin": second})
	if got := commitsOf(t, store, "step-1"); len(got) != 2 || got[0].Commit != ev2.Manifest.Commit {
		t.Errorf("commits of step-1 = %d, newest %v; want 2, the rewrite newest", len(got), got)
	}
}

// A checkpoint deleted while its files are being sent leaves tracking: nothing of it is
// committed, its objects are cleaned up, and a stop is not held up by it (I5).
func TestUploaderCheckpointDeletedMidUpload(t *testing.T) {
	dir := t.TempDir()
	mem := newMemStore()
	bs := &blockingStore{Store: mem, started: make(chan string, 1), release: make(chan struct{})}
	r := startUploader(t, dir, bs, 0)
	writeCheckpoint(t, dir, "step-1", map[string][]byte{"w": randomBytes(t, 1<<20), "v": randomBytes(t, 1<<10)})
	<-bs.started
	if err := os.RemoveAll(filepath.Join(dir, "step-1")); err != nil {
		t.Fatal(err)
	}
	eventuallyUploader(t, "step-1 to leave tracking", func() bool {
		return len(r.up.Status(t.Context()).Checkpoints) == 0
	})
	close(bs.release)
	writeCheckpoint(t, dir, "step-2", map[string][]byte{"w": randomBytes(t, 1<<10)})
	r.waitCommitted("step-2")
	if got := commitsOf(t, mem, "step-1"); len(got) != 0 {
		t.Errorf("step-1 was committed after it was deleted: %v", got)
	}
}

// eventuallyUploader polls cond every few milliseconds for up to 20 s.
func eventuallyUploader(t *testing.T, what string, cond func() bool) {
	t.Helper()
	deadline := time.Now().Add(20 * time.Second)
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatalf("%s: not within 20 s", what)
		}
		select {
		case <-time.After(5 * time.Millisecond):
		case <-t.Context().Done():
		}
	}
}

// A checkpoint whose name and bytes the store already holds (restored by the next instance) is
// adopted: nothing is sent, no new commit. With other bytes under the same name (a new run
// reusing the job), it is a new commit, and the newest (I6).
func TestUploaderAdoptsRestoredCheckpointAndCommitsOtherBytes(t *testing.T) {
	store := newMemStore()
	src := t.TempDir()
	files := map[string][]byte{"w": randomBytes(t, 32<<10), "sub/v": randomBytes(t, 1<<10)}
	writeCheckpoint(t, src, "step-1", files)
	r := startUploader(t, src, store, 0)
	orig := r.waitCommitted("step-1")
	r.stop()

	// The next instance: restore, then its agent starts.
	dir := t.TempDir()
	if _, err := Restore(t.Context(), store, RestoreOptions{Job: "job", To: dir, Logger: zerolog.Nop()}); err != nil {
		t.Fatal(err)
	}
	r2 := startUploader(t, dir, store, 0)
	ev := r2.waitCommitted("step-1")
	if !ev.Already || ev.Manifest.Commit != orig.Manifest.Commit {
		t.Errorf("restored checkpoint: Already %v commit %s; want adopted as %s", ev.Already, ev.Manifest.Commit, orig.Manifest.Commit)
	}
	r2.stop()
	if got := commitsOf(t, store, "step-1"); len(got) != 1 {
		t.Fatalf("commits of step-1 = %d; want 1 (nothing sent for a restored checkpoint)", len(got))
	}

	// A new run reusing the job saves step-1 again, with other bytes.
	dir3 := t.TempDir()
	other := map[string][]byte{"w": randomBytes(t, 32<<10), "sub/v": randomBytes(t, 1<<10)}
	writeCheckpoint(t, dir3, "step-1", other)
	r3 := startUploader(t, dir3, store, 0)
	ev3 := r3.waitCommitted("step-1")
	if ev3.Already || ev3.Manifest.Commit == orig.Manifest.Commit {
		t.Fatalf("other bytes under a committed name: Already %v commit %s; want a new commit", ev3.Already, ev3.Manifest.Commit)
	}
	res, err := Restore(t.Context(), store, RestoreOptions{Job: "job", To: t.TempDir(), Logger: zerolog.Nop()})
	if err != nil || res.Commit != ev3.Manifest.Commit {
		t.Errorf("restore took %s (%v); want the new run's commit %s", res.Commit, err, ev3.Manifest.Commit)
	}
	restoreAndCompare(t, store, "step-1", other)
}

// Two agents on one job commit the same name each under its own commit: neither adopts the
// other's manifest with its own files in none, and LATEST names the one completed later (I1, I3).
func TestUploaderTwoAgentsOneJob(t *testing.T) {
	store, err := NewFileStore(t.TempDir())
	if err != nil {
		t.Fatal(err)
	}
	dirA, dirB := t.TempDir(), t.TempDir()
	a := startUploader(t, dirA, store, 0)
	b := startUploader(t, dirB, store, 0)
	filesA := map[string][]byte{"rank-0.bin": randomBytes(t, 16<<10)}
	filesB := map[string][]byte{"rank-1.bin": randomBytes(t, 16<<10)}
	writeCheckpoint(t, dirA, "step-1", filesA)
	evA := a.waitCommitted("step-1")
	writeCheckpoint(t, dirB, "step-1", filesB)
	evB := b.waitCommitted("step-1")
	if evA.Manifest.Commit == evB.Manifest.Commit {
		t.Fatalf("both agents committed into %s", evA.Manifest.Commit)
	}
	for _, ev := range []UploadEvent{evA, evB} {
		if ev.Already {
			t.Errorf("a commit was adopted across agents: %+v", ev.Manifest)
		}
	}
	if problems := CheckJob(t.Context(), store, "job", true); len(problems) > 0 {
		t.Errorf("CheckJob: %v", problems)
	}
	res, err := Restore(t.Context(), store, RestoreOptions{Job: "job", To: t.TempDir(), Logger: zerolog.Nop()})
	if err != nil || res.Commit != evB.Manifest.Commit {
		t.Errorf("restore took %s (%v); want the later commit %s", res.Commit, err, evB.Manifest.Commit)
	}
}

// A hard link in a checkpoint to a file that is not the trainer's (the agent may read what the
// trainer could not) is never uploaded (case 12), and the checkpoint is not committed without
// it, which would present a torn checkpoint as complete: it is withheld, saying which file, until
// the link goes. A checkpoint made of the trainer's own files linked (cp -al of the one before,
// a new file in place of one) is committed whole: its files were left out, and the newest
// commit lacked its shards.
func TestUploaderSkipsHardLinks(t *testing.T) {
	if os.Geteuid() != 0 {
		t.Skip("needs root: the checkpoint directory must belong to another user than the secret")
	}
	const trainer = 12345
	dir := t.TempDir()
	secret := filepath.Join(t.TempDir(), "secret")
	if err := os.WriteFile(secret, []byte("not the trainer's"), 0o644); err != nil {
		t.Fatal(err)
	}
	if err := os.MkdirAll(filepath.Join(dir, "step-1"), 0o755); err != nil {
		t.Fatal(err)
	}
	if err := os.Link(secret, filepath.Join(dir, "step-1", "linked")); err != nil {
		t.Skipf("hard links not possible here: %v", err)
	}
	chown := func(paths ...string) {
		for _, p := range paths {
			if err := os.Chown(p, trainer, trainer); err != nil {
				t.Fatal(err)
			}
		}
	}
	chown(dir, filepath.Join(dir, "step-1"))
	store := newMemStore()
	r := startUploader(t, dir, store, 0)
	files := map[string][]byte{"w": randomBytes(t, 1<<10), "x": randomBytes(t, 1<<10)}
	for rel, data := range files {
		p := filepath.Join(dir, "step-1", rel)
		if err := os.WriteFile(p, data, 0o644); err != nil {
			t.Fatal(err)
		}
		chown(p)
	}
	if err := os.WriteFile(filepath.Join(dir, "step-1", "_COMPLETE"), nil, 0o644); err != nil {
		t.Fatal(err)
	}
	chown(filepath.Join(dir, "step-1", "_COMPLETE"))
	ev := r.waitEvent(CheckpointWithheld, "step-1")
	if !errors.Is(ev.Err, ErrNotStorable) || !strings.Contains(ev.Err.Error(), "step-1/linked") {
		t.Errorf("withheld for %v; want ErrNotStorable naming step-1/linked", ev.Err)
	}
	objs, _ := store.List(t.Context(), "job/")
	for _, o := range objs {
		if strings.HasSuffix(o.Key, "/linked") || strings.HasSuffix(o.Key, "manifest.json") {
			t.Errorf("%s is in the store while the checkpoint is withheld", o.Key)
		}
	}
	// The link deleted, the checkpoint is complete as it is now, without waiting for its marker
	// to be written again.
	if err := os.Remove(filepath.Join(dir, "step-1", "linked")); err != nil {
		t.Fatal(err)
	}
	ev = r.waitCommitted("step-1")
	if got, want := manifestPaths(ev.Manifest), []string{"_COMPLETE", "w", "x"}; !slices.Equal(got, want) {
		t.Errorf("step-1 committed with %v; want %v", got, want)
	}

	// cp -al step-1 step-2, then x written anew and a new marker.
	step2 := filepath.Join(dir, "step-2")
	if err := os.Mkdir(step2, 0o755); err != nil {
		t.Fatal(err)
	}
	chown(step2)
	if err := os.Link(filepath.Join(dir, "step-1", "w"), filepath.Join(step2, "w")); err != nil {
		t.Fatal(err)
	}
	x := randomBytes(t, 1<<10)
	if err := os.WriteFile(filepath.Join(step2, "x"), x, 0o644); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(step2, "_COMPLETE"), nil, 0o644); err != nil {
		t.Fatal(err)
	}
	chown(filepath.Join(step2, "x"), filepath.Join(step2, "_COMPLETE"))
	ev = r.waitCommitted("step-2")
	if got, want := manifestPaths(ev.Manifest), []string{"_COMPLETE", "w", "x"}; !slices.Equal(got, want) {
		t.Errorf("step-2 (cp -al of step-1) committed with %v; want %v", got, want)
	}
}

// A deadline already past (a scheduled event whose start has passed, a fast clock) never makes an
// upload give up: both checkpoints written while it is in force are committed, labelled with it.
func TestUploaderPastDeadlineNeverStopsCommits(t *testing.T) {
	dir := t.TempDir()
	store := newMemStore()
	r := startUploader(t, dir, store, 0)
	r.up.SetNotices([]ActiveNotice{{Key: "scheduled/system-maintenance/e1", Deadline: time.Now().Add(-time.Hour), SignalledAt: time.Now()}})
	for _, name := range []string{"step-1", "step-2"} {
		writeCheckpoint(t, dir, name, map[string][]byte{"w": randomBytes(t, 256<<10)})
		ev := r.waitCommitted(name)
		if ev.Manifest.Trigger != "notice" || ev.Manifest.Notice != "scheduled/system-maintenance/e1" {
			t.Errorf("%s: trigger %q notice %q; want the scheduled event", name, ev.Manifest.Trigger, ev.Manifest.Notice)
		}
	}
	if st := r.up.Status(t.Context()); !st.Urgent || st.Deadline != nil {
		t.Errorf("status: urgent %v deadline %v; want urgent, and no deadline ahead", st.Urgent, st.Deadline)
	}
}

// Urgency lasts while a notice is in force; once it ends (and its checkpoint is committed), the
// uploader is back to the background pace and later commits are periodic.
func TestUploaderUrgencyEndsWithTheNotice(t *testing.T) {
	dir := t.TempDir()
	r := startUploader(t, dir, newMemStore(), 0)
	r.up.SetNotices([]ActiveNotice{{Key: "rebalance/rebalance"}})
	writeCheckpoint(t, dir, "step-1", map[string][]byte{"w": randomBytes(t, 1<<10)})
	if ev := r.waitCommitted("step-1"); ev.Manifest.Trigger != "notice" {
		t.Errorf("step-1 trigger %q; want notice", ev.Manifest.Trigger)
	}
	r.up.SetNotices(nil)
	eventuallyUploader(t, "urgency to end", func() bool { return !r.up.Status(t.Context()).Urgent })
	writeCheckpoint(t, dir, "step-2", map[string][]byte{"w": randomBytes(t, 1<<10)})
	if ev := r.waitCommitted("step-2"); ev.Manifest.Trigger != "periodic" || ev.Manifest.Notice != "" {
		t.Errorf("step-2 trigger %q notice %q; want periodic", ev.Manifest.Trigger, ev.Manifest.Notice)
	}
}

// A notice set before the uploader handles a checkpoint's events is in force for it, however
// busy the uploader was when both came: the checkpoint is labelled with the notice. (The notice
// and the events wait for the same loop; it must not take the events first.)
func TestUploaderNoticeSetBeforeTheEventsLabelsTheCheckpoint(t *testing.T) {
	for i := range 8 { // before the fix, each run failed one time in two
		dir := t.TempDir()
		r, events := startUploaderFed(t, dir, newMemStore(), UploaderConfig{StopBudget: -1})
		unblock := make(chan struct{})
		r.up.wake <- func() { <-unblock } // the loop is busy
		r.up.SetNotices([]ActiveNotice{{Key: "spot/terminate", Deadline: time.Now().Add(2 * time.Minute), SignalledAt: time.Now()}})
		name := fmt.Sprintf("step-%d", i)
		writeCheckpoint(t, dir, name, map[string][]byte{"w": randomBytes(t, 1<<10)})
		for _, rel := range []string{"w", "_COMPLETE"} {
			fi, err := os.Lstat(filepath.Join(dir, name, rel))
			if err != nil {
				t.Fatal(err)
			}
			ev := WatchEvent{Kind: FileReady, Checkpoint: name, Path: rel, Size: fi.Size(), ModTime: fi.ModTime(), ID: FileIDOf(fi)}
			if rel == "_COMPLETE" {
				ev.Kind = Complete
			}
			events <- ev
		}
		close(unblock)
		if ev := r.waitCommitted(name); ev.Manifest.Trigger != "notice" || ev.Manifest.Notice != "spot/terminate" {
			t.Fatalf("run %d: trigger %q notice %q; want the notice set before the checkpoint was seen", i, ev.Manifest.Trigger, ev.Manifest.Notice)
		}
		r.stop()
	}
}

// A stop right after the trainer was signalled waits for the checkpoint it writes (its marker,
// then its commit), although nothing of it was there yet when the stop came.
func TestUploaderStopWaitsForTheSignalledCheckpoint(t *testing.T) {
	dir := t.TempDir()
	store := newMemStore()
	r := startUploader(t, dir, store, 0)
	r.up.SetNotices([]ActiveNotice{{Key: "spot/terminate", Deadline: time.Now().Add(2 * time.Minute), SignalledAt: time.Now()}})
	eventuallyUploader(t, "the notice to be taken", func() bool { return r.up.Status(t.Context()).Urgent })
	stopped := make(chan struct{})
	go func() { r.cancel(); <-r.done; close(stopped) }() // SIGTERM before the first file
	writeCheckpoint(t, dir, "step-1", map[string][]byte{"w": randomBytes(t, 64<<10)})
	<-stopped
	if got := commitsOf(t, store, "step-1"); len(got) != 1 {
		t.Errorf("after the stop, step-1 has %d commits; want it committed before Run returned", len(got))
	}
}

// signalDuringASave writes the first file of checkpoint name into r's directory, waits for the
// uploader to see it, then signals the trainer for a spot notice (well after the file's time)
// and waits for the uploader to take the notice: a notice that comes during a save.
func signalDuringASave(t *testing.T, r *uploaderRig, name string) {
	t.Helper()
	if err := os.MkdirAll(filepath.Join(r.dir, name), 0o755); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(r.dir, name, "w"), randomBytes(t, 16<<10), 0o644); err != nil {
		t.Fatal(err)
	}
	eventuallyUploader(t, name+"'s first file to be seen", func() bool {
		st := r.up.Status(t.Context())
		return len(st.Checkpoints) == 1 && st.Checkpoints[0].Files == 1
	})
	waitFileClockAfter(t, time.Now().Add(3*FileTimeLag))
	r.up.SetNotices([]ActiveNotice{{Key: "spot/terminate", Deadline: time.Now().Add(2 * time.Minute), SignalledAt: time.Now()}})
	eventuallyUploader(t, "the notice to be taken", func() bool { return r.up.Status(t.Context()).Urgent })
}

// A save in progress when the trainer is signalled (a periodic one), completed after the signal,
// is not the trainer's answer to it: a stop still waits for the save the trainer makes for the
// signal. Before, the stop ended once the periodic save was committed, and the trainer's save
// for the notice, a step later, was never sent (found from outside).
func TestStopWaitsPastASaveBegunBeforeTheSignal(t *testing.T) {
	dir := t.TempDir()
	store := newMemStore()
	r := startUploader(t, dir, store, 0)
	signalDuringASave(t, r, "step-50")
	stopped := make(chan struct{})
	go func() { r.cancel(); <-r.done; close(stopped) }()
	if err := os.WriteFile(filepath.Join(dir, "step-50", "_COMPLETE"), nil, 0o644); err != nil {
		t.Fatal(err)
	}
	r.waitCommitted("step-50")
	// The trainer's save for the signal, at its next step boundary.
	writeCheckpoint(t, dir, "step-51", map[string][]byte{"w": randomBytes(t, 16<<10)})
	<-stopped
	if got := commitsOf(t, store, "step-51"); len(got) != 1 {
		t.Errorf("after the stop, step-51 (the save begun after the signal) has %d commits; want the stop to have waited for it", len(got))
	}
}

// A trainer that takes the save it was in when signalled for its answer, and saves no more: the
// stop waits its budget for a save begun after the signal, and says why, naming the save begun
// before it (it gave no reason: "not_committed 0", then "signalled_checkpoint_missing"; found from
// outside).
func TestStopAwaitingTheSignalledCheckpointSaysWhy(t *testing.T) {
	dir := t.TempDir()
	r := startUploaderWith(t, dir, newMemStore(), UploaderConfig{StopBudget: 2 * time.Second, TrainerAlive: func() bool { return true }})
	signalDuringASave(t, r, "step-50")
	writeMarker(t, filepath.Join(dir, "step-50"))
	r.waitCommitted("step-50")
	r.cancel()
	r.waitDone("the stop to end at its budget")
	l := r.logs.String()
	if !strings.Contains(l, `"awaiting_signalled_checkpoint":true,"begun_before_the_signal":["step-50"]`) ||
		!strings.Contains(l, `"signalled_checkpoint_missing":true,"begun_before_the_signal":["step-50"]`) {
		t.Errorf("log:\n%s\nwant the stop to say it awaits a save begun after the signal, step-50 begun before it", l)
	}
}

// The same trainer, with nothing written for earlierSaveQuiet after that save: the save begun
// before the signal is taken for its answer, and the stop ends without spending its budget.
func TestStopTakesASaveBegunBeforeTheSignalOnceTheTrainerIsQuiet(t *testing.T) {
	was := earlierSaveQuiet
	earlierSaveQuiet = 2 * time.Second
	t.Cleanup(func() { earlierSaveQuiet = was })
	dir := t.TempDir()
	r := startUploaderWith(t, dir, newMemStore(), UploaderConfig{StopBudget: time.Minute, TrainerAlive: func() bool { return true }})
	signalDuringASave(t, r, "step-50")
	writeMarker(t, filepath.Join(dir, "step-50"))
	r.waitCommitted("step-50")
	r.cancel()
	r.waitDone("the stop to end once nothing was written for earlierSaveQuiet")
	if l := r.logs.String(); strings.Contains(l, "stop budget spent") {
		t.Errorf("log:\n%s\nwant the stop to end before its budget", l)
	}
}

// A trainer that saves into one directory every time: its save for the signal, into the
// directory its periodic save was committed from, answers the signal, though the directory's
// first version was begun before it; a stop ends once it is committed.
func TestStopEndsWithASaveForTheSignalIntoTheSameDirectory(t *testing.T) {
	dir := t.TempDir()
	store := newMemStore()
	r := startUploader(t, dir, store, 0)
	ck := filepath.Join(dir, "latest")
	writeCheckpoint(t, dir, "latest", map[string][]byte{"w": randomBytes(t, 16<<10)})
	ev := r.waitCommitted("latest")
	waitFileClockAfter(t, ev.Manifest.Order().At.Add(3*FileTimeLag)) // the signal well after that save
	r.up.SetNotices([]ActiveNotice{{Key: "spot/terminate", Deadline: time.Now().Add(2 * time.Minute), SignalledAt: time.Now()}})
	eventuallyUploader(t, "the notice to be taken", func() bool { return r.up.Status(t.Context()).Urgent })
	go r.cancel()
	if err := os.Remove(filepath.Join(ck, "_COMPLETE")); err != nil {
		t.Fatal(err)
	}
	waitFileClockAfter(t, time.Now())
	if err := os.WriteFile(filepath.Join(ck, "w"), randomBytes(t, 16<<10), 0o644); err != nil {
		t.Fatal(err)
	}
	writeMarker(t, ck)
	r.waitDone("the stop to end once the save for the signal was committed")
	if got := commitsOf(t, store, "latest"); len(got) != 2 {
		t.Errorf("latest has %d commits; want the periodic save and the one for the signal", len(got))
	}
}

// A notice without a deadline (a rebalance recommendation) logs none, never the zero time
// 0001-01-01T00:00:00Z: neither when uploads turn urgent nor when a stop waits for the checkpoint
// the trainer was signalled for. Durations are in seconds, in fields named *_s.
func TestUploaderNoticeWithoutDeadlineLogsNone(t *testing.T) {
	dir := t.TempDir()
	store := newMemStore()
	r := startUploader(t, dir, store, 0)
	r.up.SetNotices([]ActiveNotice{{Key: "rebalance/rebalance", SignalledAt: time.Now()}})
	eventuallyUploader(t, "the notice to be taken", func() bool { return r.up.Status(t.Context()).Urgent })
	stopped := make(chan struct{})
	go func() { r.cancel(); <-r.done; close(stopped) }() // SIGTERM before the checkpoint
	const drainMsg = "stop requested while checkpoints are being written or are not committed yet; finishing them first (a second SIGTERM stops at once)"
	eventuallyUploader(t, "the stop to wait for the checkpoint", func() bool { return strings.Contains(r.logs.String(), drainMsg) })
	writeCheckpoint(t, dir, "step-1", map[string][]byte{"w": randomBytes(t, 1<<10)})
	<-stopped

	logs := r.logs.String()
	if strings.Contains(logs, "0001-01-01") {
		t.Errorf("the log shows the zero time:\n%s", logs)
	}
	seen := map[string]map[string]any{}
	for _, l := range strings.Split(strings.TrimSpace(logs), "\n") {
		var m map[string]any
		if err := json.Unmarshal([]byte(l), &m); err != nil {
			t.Fatalf("log line %q: %v", l, err)
		}
		seen[m["message"].(string)] = m
	}
	for _, msg := range []string{"notice: uploading with every connection", drainMsg} {
		m, ok := seen[msg]
		if !ok {
			t.Errorf("no log line %q in:\n%s", msg, logs)
			continue
		}
		if d, ok := m["deadline"]; ok {
			t.Errorf("%q: deadline = %v; want no deadline field", msg, d)
		}
	}
	if m := seen[drainMsg]; m != nil && m["stop_budget_s"] != DefaultStopBudget.Seconds() {
		t.Errorf("stop_budget_s = %v; want %v (seconds)", m["stop_budget_s"], DefaultStopBudget.Seconds())
	}
}

// Without any notice a stop still commits what is complete (the store was slow): a complete
// checkpoint is never left behind while the budget lasts.
func TestUploaderStopDrainsCompleteCheckpoints(t *testing.T) {
	dir := t.TempDir()
	mem := newMemStore()
	bs := &blockingStore{Store: mem, started: make(chan string, 1), release: make(chan struct{})}
	r := startUploader(t, dir, bs, 0)
	writeCheckpoint(t, dir, "step-1", map[string][]byte{"w": randomBytes(t, 64<<10)})
	<-bs.started
	r.waitEvent(CheckpointComplete, "step-1")
	r.cancel()
	// Run still answers (it would not, had it returned): it drains.
	ctx, cancel := context.WithTimeout(t.Context(), 10*time.Second)
	defer cancel()
	if st := r.up.Status(ctx); len(st.Checkpoints) != 1 || st.Checkpoints[0].Committed {
		t.Fatalf("status after the stop = %+v; want Run draining step-1", st)
	}
	close(bs.release)
	<-r.done
	if got := commitsOf(t, mem, "step-1"); len(got) != 1 {
		t.Errorf("step-1 has %d commits after the stop; want 1", len(got))
	}
}

// The store is told to hurry (S3Store.Hurry: its concurrency starts higher) while a notice is in
// force, and never in the background.
func TestUploaderHurriesTheStoreOnlyWithANotice(t *testing.T) {
	dir := t.TempDir()
	store := &hurriedStore{memStore: newMemStore()}
	r := startUploader(t, dir, store, 0)
	writeCheckpoint(t, dir, "step-1", map[string][]byte{"w": randomBytes(t, 1<<10)})
	r.waitCommitted("step-1")
	if n := store.hurries.Load(); n != 0 {
		t.Errorf("a periodic checkpoint hurried the store %d times; want none", n)
	}
	r.up.SetNotices([]ActiveNotice{{Key: "spot/terminate", Deadline: time.Now().Add(2 * time.Minute), SignalledAt: time.Now()}})
	writeCheckpoint(t, dir, "step-2", map[string][]byte{"w": randomBytes(t, 1<<10)})
	if ev := r.waitCommitted("step-2"); ev.Manifest.Trigger != "notice" {
		t.Errorf("step-2 trigger %q; want notice", ev.Manifest.Trigger)
	}
	if store.hurries.Load() == 0 {
		t.Error("a notice's checkpoint went without hurrying the store")
	}
}

// A newer checkpoint's files are put at a higher rank than an older one's, so that where the store
// bounds its requests (S3Store) they get free slots first.
func TestUploaderRanksNewerCheckpointsFirst(t *testing.T) {
	dir := t.TempDir()
	store := &rankedStore{memStore: newMemStore(), ranks: map[string]uint64{}}
	r := startUploader(t, dir, store, 0)
	writeCheckpoint(t, dir, "step-1", map[string][]byte{"w": randomBytes(t, 1<<10)})
	r.waitCommitted("step-1")
	writeCheckpoint(t, dir, "step-2", map[string][]byte{"w": randomBytes(t, 1<<10)})
	r.waitCommitted("step-2")
	r1, ok1 := store.rankOfFile("step-1", "w")
	r2, ok2 := store.rankOfFile("step-2", "w")
	if !ok1 || !ok2 || r2 <= r1 || r1 == 0 {
		t.Errorf("ranks: step-1 %d (put %v), step-2 %d (put %v); want both put, step-2's higher, neither 0", r1, ok1, r2, ok2)
	}
}

// urgencyStore records, for each data file it is given, whether its context said a notice
// waits for it, and how often it was sent; it holds the file named hold until release is
// closed, and tells started of every file.
type urgencyStore struct {
	Store
	hold    string
	started chan string
	release chan struct{}

	mu     sync.Mutex
	urgent map[string]bool // by file name
	puts   map[string]int  // by file name
}

func (s *urgencyStore) PutFile(ctx context.Context, key string, f *os.File, size int64, progress func(int64)) (Checksum, error) {
	s.mu.Lock()
	s.urgent[path.Base(key)] = urgentOf(ctx)
	s.puts[path.Base(key)]++
	s.mu.Unlock()
	s.started <- path.Base(key)
	if path.Base(key) == s.hold {
		<-s.release
	}
	return s.Store.PutFile(ctx, key, f, size, progress)
}

// A file written while a notice is in force reaches the store as urgent (S3Store cuts it finer)
// when it is all there is to send and another file of its checkpoint is stored already, or it is
// a single-file checkpoint; one written before the notice, the first of a directory checkpoint,
// or one written while another file is being sent, does not.
func TestUploaderTellsTheStoreOfUrgency(t *testing.T) {
	dir := t.TempDir()
	us := &urgencyStore{Store: newMemStore(), hold: "first.bin", started: make(chan string, 16), release: make(chan struct{}),
		urgent: map[string]bool{}, puts: map[string]int{}}
	r := startUploader(t, dir, us, 0)
	writeCheckpoint(t, dir, "step-1", map[string][]byte{"calm.bin": randomBytes(t, 1<<10)})
	r.waitCommitted("step-1")
	r.up.SetNotices([]ActiveNotice{{Key: "spot/terminate", Deadline: time.Now().Add(time.Minute), SignalledAt: time.Now()}})
	if err := os.MkdirAll(filepath.Join(dir, "step-2"), 0o755); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(dir, "step-2", "leading.bin"), randomBytes(t, 1<<10), 0o644); err != nil {
		t.Fatal(err)
	}
	stored := func(st UploaderStatus) bool { // leading.bin stored, as the uploader sees it
		for _, c := range st.Checkpoints {
			if c.Name == "step-2" && c.FilesStored == 1 {
				return true
			}
		}
		return false
	}
	for deadline := time.Now().Add(20 * time.Second); ; {
		st := r.up.Status(t.Context())
		if stored(st) {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("leading.bin not stored within 20 s: %+v", st)
		}
		runtime.Gosched()
	}
	writeCheckpoint(t, dir, "step-2", map[string][]byte{"alone.bin": randomBytes(t, 1<<10)})
	r.waitCommitted("step-2")

	// first.bin is held in the store while second.bin is written: that one is not alone.
	if err := os.MkdirAll(filepath.Join(dir, "step-3"), 0o755); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(dir, "step-3", "first.bin"), randomBytes(t, 1<<10), 0o644); err != nil {
		t.Fatal(err)
	}
	for name := ""; name != "first.bin"; name = <-us.started {
	}
	writeCheckpoint(t, dir, "step-3", map[string][]byte{"second.bin": randomBytes(t, 1<<10)})
	for name := ""; name != "second.bin"; name = <-us.started {
	}
	close(us.release)
	r.waitCommitted("step-3")

	// A single-file checkpoint is its own last file: alone, it is cut finer; and it is sent once.
	tmp := filepath.Join(dir, ".model.pt.tmp")
	if err := os.WriteFile(tmp, randomBytes(t, 1<<10), 0o644); err != nil {
		t.Fatal(err)
	}
	if err := os.Rename(tmp, filepath.Join(dir, "model.pt")); err != nil {
		t.Fatal(err)
	}
	r.waitCommitted("model.pt")
	us.mu.Lock()
	defer us.mu.Unlock()
	want := map[string]bool{"calm.bin": false, "leading.bin": false, "alone.bin": true, "first.bin": false, "second.bin": false, "model.pt": true}
	if n := us.puts["model.pt"]; n != 1 {
		t.Errorf("model.pt sent %d times; want once", n)
	}
	for name, w := range want {
		if got, ok := us.urgent[name]; !ok || got != w {
			t.Errorf("%s: urgent %v (sent %v); want %v", name, got, ok, w)
		}
	}
}

// A single-file checkpoint written after a notice is sent once. The watcher reports it twice
// (FileReady once quiet, then Complete); under a notice the first report starts the upload at
// once (no lookup of the name's commits first), and the second, arriving while it was in
// flight, used to send the same version again: twice the bytes, and twice the time to durable.
func TestUploaderSendsASingleFileOnce(t *testing.T) {
	dir := t.TempDir()
	us := &urgencyStore{Store: newMemStore(), hold: "model.pt", started: make(chan string, 16), release: make(chan struct{}),
		urgent: map[string]bool{}, puts: map[string]int{}}
	r := startUploader(t, dir, us, 0)
	r.up.SetNotices([]ActiveNotice{{Key: "spot/terminate", Deadline: time.Now().Add(time.Minute), SignalledAt: time.Now()}})
	tmp := filepath.Join(dir, ".model.pt.tmp")
	if err := os.WriteFile(tmp, randomBytes(t, 1<<20), 0o644); err != nil {
		t.Fatal(err)
	}
	if err := os.Rename(tmp, filepath.Join(dir, "model.pt")); err != nil {
		t.Fatal(err)
	}
	<-us.started                                // the upload is in flight, held
	r.waitEvent(CheckpointComplete, "model.pt") // the second report has come
	close(us.release)
	r.waitCommitted("model.pt")
	us.mu.Lock()
	defer us.mu.Unlock()
	if n := us.puts["model.pt"]; n != 1 {
		t.Errorf("model.pt sent %d times; want once", n)
	}
}

// A file whose key is longer than the store accepts (S3: 1024 bytes) is not retried (retrying
// cannot make the key fit, and the agent used to retry it for ever), and its checkpoint is not
// committed without it, which would present a torn checkpoint as complete: it is withheld, with an
// error naming the file, until the file has another name and the marker is written again.
func TestUploaderWithholdsACheckpointWithAKeyTooLong(t *testing.T) {
	dir := t.TempDir()
	store := newMemStore()
	store.maxKey = 200
	r := startUploader(t, dir, store, 0)
	deep := path.Join(strings.Repeat("d", 60), strings.Repeat("e", 60), strings.Repeat("f", 60), "shard.bin")
	for _, rel := range []string{"model.bin", deep} {
		p := filepath.Join(dir, "step-1", filepath.FromSlash(rel))
		if err := os.MkdirAll(filepath.Dir(p), 0o755); err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(p, []byte(rel), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	// The marker last, renamed into place: written in place, it could be seen empty, withheld,
	// then seen with its bytes, a marker written again, and tried once more.
	writeMarker(t, filepath.Join(dir, "step-1"))
	ev := r.waitEvent(CheckpointWithheld, "step-1")
	if !errors.Is(ev.Err, ErrNotStorable) || !strings.Contains(ev.Err.Error(), "shard.bin") || !strings.Contains(ev.Err.Error(), "key too long") {
		t.Errorf("withheld for %v; want ErrNotStorable naming shard.bin and its key too long", ev.Err)
	}
	if logs := r.logs.String(); !strings.Contains(logs, `"level":"error"`) || !strings.Contains(logs, "checkpoint not committed: a file of it cannot be stored") {
		t.Errorf("no error says the checkpoint is not committed:\n%s", logs)
	}
	if _, _, err := store.GetBytes(t.Context(), "job/LATEST"); err == nil {
		t.Error("LATEST was written while the checkpoint was withheld")
	}
	if st := r.up.Status(t.Context()); len(st.Checkpoints) != 1 || !st.Checkpoints[0].Withheld || st.Checkpoints[0].Complete {
		t.Errorf("status %+v; want step-1 withheld, not complete", st.Checkpoints)
	}
	// The trainer moves the file up and writes the marker again: the checkpoint is committed
	// whole.
	if err := os.Rename(filepath.Join(dir, "step-1", filepath.FromSlash(deep)), filepath.Join(dir, "step-1", "shard.bin")); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(dir, "step-1", "_COMPLETE"), []byte("again"), 0o644); err != nil {
		t.Fatal(err)
	}
	ev = r.waitCommitted("step-1")
	if got, want := manifestPaths(ev.Manifest), []string{"_COMPLETE", "model.bin", "shard.bin"}; !slices.Equal(got, want) {
		t.Errorf("committed %q, want %q", got, want)
	}
}

// manifestPaths returns the paths of m's files, in its order.
func manifestPaths(m *Manifest) []string {
	var paths []string
	for _, f := range m.Files {
		paths = append(paths, f.Path)
	}
	return paths
}

// gateStore holds every PutFile until the test lets it through, and tells the test its key.
type gateStore struct {
	*memStore
	puts    chan string
	release chan struct{}
}

func (s *gateStore) PutFile(ctx context.Context, key string, f *os.File, size int64, progress func(n int64)) (Checksum, error) {
	select {
	case s.puts <- key:
	case <-ctx.Done():
		return Checksum{}, ctx.Err()
	}
	select {
	case <-s.release:
	case <-ctx.Done():
		return Checksum{}, ctx.Err()
	}
	return s.memStore.PutFile(ctx, key, f, size, progress)
}

// A file of a checkpoint, sent, that the trainer replaces by a directory of the same name before
// the marker (or a directory by a file): the stored object of what left was in the way of the new
// key until just before the manifest, and a file store (and S3 servers that store objects as
// files) refused the new one for ever, so the checkpoint was never committed. (Found from
// outside: a model saved again into latest/ as model/ shards where model was one file.)
func TestFileBecomingADirectoryBeforeTheMarkerCommits(t *testing.T) {
	for _, tt := range []struct{ name, first, then string }{
		{"file to directory", "w.bin", "w.bin/x"},
		{"directory to file", "sub/a", "sub"},
	} {
		t.Run(tt.name, func(t *testing.T) {
			dir := t.TempDir()
			store, err := NewFileStore(t.TempDir())
			if err != nil {
				t.Fatal(err)
			}
			r := startUploaderWith(t, dir, store, UploaderConfig{})
			ck := filepath.Join(dir, "step-3")
			write := func(rel string, data []byte) {
				t.Helper()
				p := filepath.Join(ck, filepath.FromSlash(rel))
				if err := os.MkdirAll(filepath.Dir(p), 0o755); err != nil {
					t.Fatal(err)
				}
				if err := os.WriteFile(p, data, 0o644); err != nil {
					t.Fatal(err)
				}
			}
			write(tt.first, []byte("first"))
			eventuallyUploader(t, tt.first+" to be stored", func() bool {
				objs, err := store.List(t.Context(), "job/step-3/")
				return err == nil && slices.ContainsFunc(objs, func(o ObjectInfo) bool { return strings.HasSuffix(o.Key, "/"+tt.first) })
			})
			top := strings.Split(tt.first, "/")[0]
			if err := os.RemoveAll(filepath.Join(ck, top)); err != nil {
				t.Fatal(err)
			}
			then := randomBytes(t, 1<<10)
			write(tt.then, then)
			write("_COMPLETE", nil)
			m := r.waitCommitted("step-3").Manifest
			if _, ok := m.file(tt.then); !ok || len(m.Files) != 2 {
				t.Errorf("committed %+v; want %s and the marker", m.Files, tt.then)
			}
			restoreAndCompare(t, store, "step-3", map[string][]byte{tt.then: then})
		})
	}
}

// hangingAbortStore hangs AbortIncomplete, once hang is set, until its context ends; entered is
// closed when the first such call begins.
type hangingAbortStore struct {
	*memStore
	hang    atomic.Bool
	entered chan struct{}
	once    sync.Once
}

func (s *hangingAbortStore) AbortIncomplete(ctx context.Context, prefix string) (int, error) {
	if s.hang.Load() {
		s.once.Do(func() { close(s.entered) })
		<-ctx.Done()
		return 0, ctx.Err()
	}
	return s.memStore.AbortIncomplete(ctx, prefix)
}

// A stop while a clean-up pass after a commit waits on a store that hangs waited for the pass's
// own timeout (10 s), past the stop budget and the 2 s a stop with nothing to drain takes; it
// waits stopGrace at most.
func TestStopDoesNotWaitForAHungCleanUpPass(t *testing.T) {
	dir := t.TempDir()
	s := &hangingAbortStore{memStore: newMemStore(), entered: make(chan struct{})}
	r := startUploaderWith(t, dir, s, UploaderConfig{})
	writeCheckpoint(t, dir, "step-1", map[string][]byte{"a.bin": randomBytes(t, 1<<10)})
	r.waitCommitted("step-1")
	s.hang.Store(true)
	<-s.entered // the first pass, 5 s after the commit
	began := time.Now()
	r.stop()
	if took := time.Since(began); took > stopGrace+time.Second {
		t.Errorf("the stop took %s with a clean-up pass hung; want at most %s", took, stopGrace)
	}
}

// A stop with no drain (agent.stop_budget 0s) names the complete checkpoints it leaves
// uncommitted; it said nothing of them.
func TestStopWithoutDrainNamesTheCompleteCheckpointsLeft(t *testing.T) {
	dir := t.TempDir()
	s := &gateStore{memStore: newMemStore(), puts: make(chan string, 100), release: make(chan struct{})}
	r := startUploaderWith(t, dir, s, UploaderConfig{StopBudget: -1})
	writeCheckpoint(t, dir, "step-1", map[string][]byte{"a.bin": randomBytes(t, 1<<10)})
	r.waitEvent(CheckpointComplete, "step-1")
	<-s.puts
	r.stop()
	if logs := r.logs.String(); !strings.Contains(logs, `"not_committed":["step-1"]`) || !strings.Contains(logs, "stopping without a drain") {
		t.Errorf("the stop does not name step-1, complete and not committed:\n%s", logs)
	}
}

// Without a notice, a checkpoint whose upload has begun is sent to the end before a newer one
// takes the connections: a trainer that saves faster than the store takes its checkpoints, and
// deletes its older ones, otherwise had each overtaken by the next and deleted before its
// commit, and none was ever committed (found from outside: 0 of 90). With a notice that came
// after the begun one completed, the newest (the notice's) goes first
// (TestUrgentNoticeCheckpointKeepsItsTurn has one completed after the signal).
func TestUploaderFinishesTheCheckpointItBegan(t *testing.T) {
	for _, notice := range []bool{false, true} {
		t.Run("notice="+strconv.FormatBool(notice), func(t *testing.T) {
			dir := t.TempDir()
			s := &gateStore{memStore: newMemStore(), puts: make(chan string), release: make(chan struct{})}
			r := startUploaderWith(t, dir, s, UploaderConfig{BackgroundFiles: 1, UrgentFiles: 1})
			writeCheckpoint(t, dir, "step-1", map[string][]byte{"a": randomBytes(t, 1<<10), "b": randomBytes(t, 1<<10)})
			var order []string
			timeout := time.After(20 * time.Second)
			take := func() {
				t.Helper()
				select {
				case k := <-s.puts:
					order = append(order, k)
				case <-timeout:
					t.Fatalf("no upload within 20 s; so far %q", order)
				}
			}
			take() // step-1's first file, held
			if notice {
				r.waitEvent(CheckpointComplete, "step-1")
				r.up.SetNotices([]ActiveNotice{{Key: "spot/terminate", Deadline: time.Now().Add(2 * time.Minute), SignalledAt: time.Now()}})
			}
			writeCheckpoint(t, dir, "step-2", map[string][]byte{"c": randomBytes(t, 1<<10), "d": randomBytes(t, 1<<10)})
			r.waitEvent(CheckpointComplete, "step-2")
			for len(order) < 6 {
				s.release <- struct{}{}
				take()
			}
			close(s.release)
			var names []string
			for _, k := range order {
				names = append(names, strings.Split(k, "/")[1])
			}
			want := []string{"step-1", "step-1", "step-1", "step-2", "step-2", "step-2"}
			if notice {
				want = []string{"step-1", "step-2", "step-2", "step-2", "step-1", "step-1"}
			}
			if !slices.Equal(names, want) {
				t.Errorf("uploads went to %q; want %q", names, want)
			}
		})
	}
}

// TestUploaderNextKeepsTheBegunCheckpoint: without a notice the files of the newest generation
// whose upload has begun go next, before those of a newer one not begun (the starvation above);
// with a notice, the newest's.
func TestUploaderNextKeepsTheBegunCheckpoint(t *testing.T) {
	u := &Uploader{gens: map[string]*generation{}}
	for i, name := range []string{"step-1", "step-2", "step-3"} {
		g := &generation{name: name, seq: uint64(i + 1), state: genUploading}
		u.gens[name] = g
		u.queued = append(u.queued, g)
	}
	u.queued[0].commit = "20261201T000000Z-000000000001" // step-1 has begun
	if i := u.next(false); u.queued[i].name != "step-1" {
		t.Errorf("next without a notice = %s; want step-1, whose upload has begun", u.queued[i].name)
	}
	if i := u.next(true); u.queued[i].name != "step-3" {
		t.Errorf("next with a notice = %s; want step-3, the newest", u.queued[i].name)
	}
	u.queued[0].commit = ""
	if i := u.next(false); u.queued[i].name != "step-3" {
		t.Errorf("next without a notice, none begun = %s; want step-3, the newest", u.queued[i].name)
	}
}

// TestRetentionLeftoversAreDeletedAgain: retention deletes an old commit's manifest, then its
// data; when the data delete fails (a throttled or refused DeleteObjects), the failure is reported
// as a failed upload (counted, in /status) and the prefix is cleared again later, once the store
// lets it. (Found from outside: the data stayed in the bucket for good, and nothing said so.)
func TestRetentionLeftoversAreDeletedAgain(t *testing.T) {
	t.Cleanup(func(l []time.Duration) func() { return func() { lateAborts = l } }(lateAborts)) // after the uploader stops
	lateAborts = []time.Duration{0, 200 * time.Millisecond, 500 * time.Millisecond}
	s, dir := newMemStore(), t.TempDir()
	r := startUploader(t, dir, s, 1)
	writeCheckpoint(t, dir, "step-1", map[string][]byte{"a": randomBytes(t, 1<<10)})
	old := r.waitCommitted("step-1").Manifest
	data := old.Files[0].Key
	if old.Files[0].Path == "_COMPLETE" {
		data = old.Files[1].Key
	}
	s.failKey(data, errors.New("memstore: 503 SlowDown"))
	laterTick(t, dir, "step-1")
	writeCheckpoint(t, dir, "step-2", map[string][]byte{"a": randomBytes(t, 1<<10)})
	r.waitCommitted("step-2")
	eventuallyUploader(t, "retention's failed delete to be reported", func() bool { return r.failed.Load() > 0 })
	if _, _, err := s.GetBytes(t.Context(), ManifestKey("job", "step-1", old.Commit)); !errors.Is(err, ErrNotFound) {
		t.Fatalf("step-1's manifest: %v; want it deleted by retention", err)
	}
	s.failKey(data, nil)
	eventuallyUploader(t, "step-1's data to be deleted again", func() bool {
		objs, err := s.List(t.Context(), CommitPrefix("job", "step-1", old.Commit))
		return err == nil && len(objs) == 0
	})
}

// TestLatestIsNotRepairedOntoATornCommit: a manifest newer than LATEST's commit that lists objects
// the store does not hold (a partial copy of a job, another writer) is not where a starting agent
// moves LATEST. (Found from outside: LATEST was "repaired" onto it, and the boot restore failed.)
func TestLatestIsNotRepairedOntoATornCommit(t *testing.T) {
	s, dir := newMemStore(), t.TempDir()
	good := restoreTestCommit(t, s, "job", "step-1", restoreTestT0, map[string]string{"a": "good"})
	restoreTestPutJSON(t, s, "job/LATEST", Latest{Version: ManifestVersion, Checkpoint: good.Checkpoint, Commit: good.Commit,
		CompleteAt: good.Timings.CompleteAt, CommittedAt: good.CommittedAt})
	// Completed later than anything this agent will commit (another writer's clock ahead).
	torn := restoreTestManifest(t, "job", "step-2", time.Now().Add(time.Hour), map[string]string{"a": "gone"})
	restoreTestPutJSON(t, s, ManifestKey("job", "step-2", torn.Commit), torn) // no data
	r := startUploader(t, dir, s, 0)
	writeCheckpoint(t, dir, "step-3", map[string][]byte{"a": randomBytes(t, 1<<10)})
	r.waitCommitted("step-3") // the store was read, and LATEST looked at, before
	st, err := readJob(t.Context(), s, "job", nil)
	if err != nil {
		t.Fatal(err)
	}
	if st.Latest == nil || st.Latest.Checkpoint == "step-2" {
		t.Errorf("LATEST = %+v; want it never on the torn step-2", st.Latest)
	}
}

// A starting agent whose job's LATEST names a commit with a manifest it cannot use (a newer
// spotguard's, version 3) moved LATEST back to the newest commit it could use, saying the store
// did not hold the other: LATEST went back (I3), and awscli's reading of the store and restore
// disagreed. It is left where it is, and said.
func TestLatestOnAnUnusableManifestIsNotMovedBack(t *testing.T) {
	s, dir := newMemStore(), t.TempDir()
	old := restoreTestCommit(t, s, "job", "step-1", restoreTestT0, map[string]string{"a": "old"})
	newer := restoreTestCommit(t, s, "job", "step-2", restoreTestT0.Add(time.Minute), map[string]string{"a": "newer"})
	newer.Version = ManifestVersion + 1
	restoreTestPutJSON(t, s, ManifestKey("job", "step-2", newer.Commit), newer)
	latest := Latest{Version: ManifestVersion, Checkpoint: newer.Checkpoint, Commit: newer.Commit, CompleteAt: newer.Timings.CompleteAt, CommittedAt: newer.CommittedAt}
	restoreTestPutJSON(t, s, "job/LATEST", latest)
	r := startUploader(t, dir, s, 0)
	const said = "LATEST names a commit whose manifest this spotguard cannot use; LATEST is left on it"
	var st *JobState
	eventuallyUploader(t, "the agent to say LATEST is left, or to move it", func() bool {
		var err error
		st, err = readJob(t.Context(), s, "job", nil)
		return err == nil && (st.Latest == nil || st.Latest.Commit != newer.Commit) || strings.Contains(r.logs.String(), said)
	})
	r.stop()
	if !strings.Contains(r.logs.String(), said) {
		t.Errorf("the agent does not say LATEST is left:\n%s", r.logs)
	}
	if st.Latest == nil || st.Latest.Commit != newer.Commit {
		t.Errorf("LATEST = %+v; want it left on %s, not moved back to %s", st.Latest, newer.Commit, old.Commit)
	}
	if strings.Contains(r.logs.String(), "does not hold") {
		t.Errorf("the agent says the store does not hold a commit it holds:\n%s", r.logs)
	}
}

// A file deleted from a complete checkpoint before its commit is a warning (the marker had
// declared it part of it), once, when the checkpoint is committed without it; the whole
// checkpoint deleted (its marker too) is not one warning per file.
func TestUploaderVanishedFilesOfADeletedCheckpoint(t *testing.T) {
	dir := t.TempDir()
	s := &gateStore{memStore: newMemStore(), puts: make(chan string, 100), release: make(chan struct{})}
	r := startUploaderWith(t, dir, s, UploaderConfig{BackgroundFiles: 1})
	files := map[string][]byte{}
	for i := range 6 {
		files[fmt.Sprintf("shard-%d.bin", i)] = []byte{byte(i)}
	}
	writeCheckpoint(t, dir, "step-1", files)
	writeCheckpoint(t, dir, "step-2", files)
	r.waitEvent(CheckpointComplete, "step-1")
	r.waitEvent(CheckpointComplete, "step-2")
	if err := os.RemoveAll(filepath.Join(dir, "step-1")); err != nil {
		t.Fatal(err)
	}
	if err := os.Remove(filepath.Join(dir, "step-2", "shard-3.bin")); err != nil {
		t.Fatal(err)
	}
	eventuallyUploader(t, "step-2 to leave shard-3.bin out", func() bool {
		for _, c := range r.up.Status(t.Context()).Checkpoints {
			if c.Name == "step-2" && c.Files == 6 { // 5 shards and the marker
				return true
			}
		}
		return false
	})
	close(s.release)
	m := r.waitCommitted("step-2").Manifest
	if len(m.Files) != 6 {
		t.Errorf("step-2 committed with %d files; want 6", len(m.Files))
	}
	logs := r.logs.String()
	if n := strings.Count(logs, `"checkpoint":"step-2","files":["shard-3.bin"],"count":1`); n != 1 {
		t.Errorf("%d warnings naming step-2's one deleted file; want 1:\n%s", n, logs)
	}
	if n := strings.Count(logs, `"checkpoint":"step-1","file`); n != 0 {
		t.Errorf("%d file warnings for step-1, deleted whole; want none:\n%s", n, logs)
	}
}

// TestUploaderForgetsCommitsOfNamesGone: without checkpoint.keep, the store's commits of
// checkpoints no longer on disk are forgotten once there are many; a name that comes back is
// looked up again, and a restored checkpoint is still found committed.
func TestUploaderForgetsCommitsOfNamesGone(t *testing.T) {
	t.Cleanup(func(n int) func() { return func() { indexKeep = n } }(indexKeep)) // after the uploader stops
	indexKeep = 4
	s, dir := newMemStore(), t.TempDir()
	r := startUploader(t, dir, s, 0)
	first := map[string][]byte{"a": randomBytes(t, 1<<10)}
	for i := range 12 {
		name := fmt.Sprintf("step-%03d", i)
		files := map[string][]byte{"a": randomBytes(t, 1<<10)}
		if i == 0 {
			files = first
		}
		writeCheckpoint(t, dir, name, files)
		r.waitCommitted(name)
		if i < 11 {
			if err := os.RemoveAll(filepath.Join(dir, name)); err != nil { // the trainer's rotation
				t.Fatal(err)
			}
		}
	}
	eventuallyUploader(t, "the index to shrink", func() bool {
		n := make(chan int)
		r.up.wake <- func() { n <- len(r.up.index) }
		return <-n <= indexKeep+1
	})
	// step-000 restored: found committed, nothing sent.
	writeCheckpoint(t, dir, "step-000", first)
	ev := r.waitCommitted("step-000")
	if !ev.Already {
		t.Errorf("step-000 written again with the bytes of its commit was committed anew (%s); want it found committed", ev.Manifest.Commit)
	}
}

// heldManifestStore loses the answer of the first manifest write of checkpoint name: it is not
// stored then, and land puts it in the store later, as a write the network held does.
type heldManifestStore struct {
	*memStore
	name string
	mu   sync.Mutex
	key  string
	data []byte
}

func (s *heldManifestStore) PutBytes(ctx context.Context, key string, data []byte, cond Cond) (string, error) {
	s.mu.Lock()
	if s.key == "" && strings.HasPrefix(key, "job/"+s.name+"/") && strings.HasSuffix(key, "/"+MetaDir+"/manifest.json") {
		s.key, s.data = key, slices.Clone(data)
		s.mu.Unlock()
		return "", errors.New("heldstore: timeout awaiting response headers")
	}
	s.mu.Unlock()
	return s.memStore.PutBytes(ctx, key, data, cond)
}

// land stores the held manifest write.
func (s *heldManifestStore) land() {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.memStore.put(s.key, s.data)
}

// commitTwoKeepOne runs an uploader on s with checkpoint.keep 1 and commits step-1, then step-2
// (completed later, so retention then deletes step-1); it returns the uploader and step-1's
// manifest as committed.
func commitTwoKeepOne(t *testing.T, s Store) (*uploaderRig, *Manifest) {
	t.Helper()
	dir := t.TempDir()
	r := startUploader(t, dir, s, 1)
	writeCheckpoint(t, dir, "step-1", map[string][]byte{"a": randomBytes(t, 1<<10)})
	old := r.waitCommitted("step-1").Manifest
	laterTick(t, dir, "step-1")
	writeCheckpoint(t, dir, "step-2", map[string][]byte{"a": randomBytes(t, 1<<10)})
	r.waitCommitted("step-2")
	return r, old
}

// A commit whose manifest write lost its answer is kept by retention for uncertainFor: that write
// may land late, and would otherwise list the objects retention deleted (found by the
// simulation: a torn commit).
func TestRetentionKeepsACommitWhoseManifestMayStillLand(t *testing.T) {
	t.Cleanup(func(d time.Duration) func() { return func() { uncertainFor = d } }(uncertainFor)) // after the uploader stops
	uncertainFor = time.Hour
	s := &heldManifestStore{memStore: newMemStore(), name: "step-1"}
	r, old := commitTwoKeepOne(t, s)
	s.land()
	if missing, err := r.up.missingObjects(t.Context(), old); err != nil || missing != "" {
		t.Errorf("step-1's commit after its held manifest write landed: missing %q (%v); want it whole", missing, err)
	}
}

// revivingStore writes a commit's manifest back after its delete, just before the delete of its
// data (after their listing), as another agent does that lost the answer to its write of that
// manifest and writes it again while retention deletes the commit (found by the simulation: two
// agents on one job).
type revivingStore struct {
	*memStore
	name    string
	mu      sync.Mutex
	key     string
	data    []byte
	revived int
}

func (s *revivingStore) Delete(ctx context.Context, keys ...string) error {
	s.mu.Lock()
	for _, k := range keys {
		switch {
		case !strings.HasPrefix(k, "job/"+s.name+"/"):
		case strings.HasSuffix(k, "/"+MetaDir+"/manifest.json") && s.key == "":
			if data, _, err := s.memStore.GetBytes(ctx, k); err == nil {
				s.key, s.data = k, data
			}
		case s.key != "" && s.revived == 0 && !strings.Contains(k, "/"+MetaDir+"/"):
			s.memStore.put(s.key, s.data)
			s.revived++
		}
	}
	s.mu.Unlock()
	return s.memStore.Delete(ctx, keys...)
}

// Retention that deletes a commit whose manifest another agent writes again between the delete
// of the manifest and of the data leaves no manifest over deleted objects.
func TestRetentionDeletesAManifestWrittenAgainMeanwhile(t *testing.T) {
	s := &revivingStore{memStore: newMemStore(), name: "step-1"}
	_, old := commitTwoKeepOne(t, s)
	s.mu.Lock()
	revived := s.revived
	s.mu.Unlock()
	if revived != 1 {
		t.Fatalf("step-1's manifest was written back %d times; want once (the test's premise)", revived)
	}
	if _, _, err := s.GetBytes(t.Context(), ManifestKey(old.Job, old.Checkpoint, old.Commit)); !errors.Is(err, ErrNotFound) {
		t.Errorf("step-1's manifest after retention: %v; want it deleted (its objects are)", err)
	}
	if problems := CheckJob(t.Context(), s, "job", true); len(problems) > 0 {
		t.Errorf("job after retention: %v", problems)
	}
}

// The uploader says, as it starts, which commit of the job is the newest (CheckpointFound): a
// notice the agent's previous run signalled the trainer for may have had its checkpoint committed
// by that run.
func TestUploaderReportsTheJobsNewestCommitAtStart(t *testing.T) {
	s := newMemStore()
	dir := t.TempDir()
	r := startUploader(t, dir, s, 0)
	files := map[string][]byte{"w.bin": randomBytes(t, 4<<10)}
	writeCheckpoint(t, dir, "step-2", files)
	want := r.waitCommitted("step-2").Manifest
	laterTick(t, dir, "step-2")              // the file clock moves on: step-1 completes later
	writeCheckpoint(t, dir, "step-1", files) // a rollback's name, completed later: the newest
	want2 := r.waitCommitted("step-1").Manifest
	if !want2.Order().After(want.Order()) {
		t.Fatalf("step-1 %v is not after step-2 %v (the test's premise)", want2.Order(), want.Order())
	}
	r.stop()

	r2 := startUploader(t, t.TempDir(), s, 0)
	ev := r2.waitEvent(CheckpointFound, "step-1")
	if ev.Manifest == nil || ev.Manifest.Commit != want2.Commit {
		t.Errorf("CheckpointFound manifest %+v; want step-1's commit %s", ev.Manifest, want2.Commit)
	}
}

// An agent restarted during a notice inherits the signal its previous run sent; when the
// trainer's checkpoint for it was committed by that run, a stop does not wait for another one.
// Before, it waited its whole stop budget, and said the signalled checkpoint was missing (found
// from outside: 140 s).
func TestUploaderStopAfterARestartFindsTheSignalAnswered(t *testing.T) {
	s := newMemStore()
	dir, state := t.TempDir(), t.TempDir()
	r := startUploaderWith(t, dir, s, UploaderConfig{StateDir: state})
	signalled := time.Now()
	writeCheckpoint(t, dir, "step-1", map[string][]byte{"w.bin": randomBytes(t, 4<<10)})
	if m := r.waitCommitted("step-1").Manifest; m.Order().At.Before(signalled.Add(-10 * time.Millisecond)) {
		t.Fatalf("step-1 completed at %v, before the signal at %v (the test's premise)", m.Order().At, signalled)
	}
	r.stop()

	// Its journal says step-1 is committed, so it is not reported complete again.
	r2 := startUploaderWith(t, dir, s, UploaderConfig{StateDir: state, StopBudget: time.Minute})
	r2.waitEvent(CheckpointFound, "step-1")
	r2.up.SetNotices([]ActiveNotice{{Key: "spot/terminate", Deadline: signalled.Add(2 * time.Minute), SignalledAt: signalled}})
	r2.cancel() // SIGTERM
	r2.waitDone("a stop waited for a checkpoint the previous run committed")
	if logs := r2.logs.String(); strings.Contains(logs, `"signalled_checkpoint_missing":true`) {
		t.Errorf("the stop said the signalled checkpoint was missing:\n%s", logs)
	}
}

// A complete checkpoint deleted before its commit is reported (CheckpointDeleted: a notice whose
// checkpoint it was stops waiting for it); one deleted after its commit, or before its marker,
// is not.
func TestUploaderReportsACompleteCheckpointDeletedBeforeItsCommit(t *testing.T) {
	dir := t.TempDir()
	s := &gateStore{memStore: newMemStore(), puts: make(chan string, 100), release: make(chan struct{})}
	r := startUploader(t, dir, s, 0)
	files := map[string][]byte{"w.bin": randomBytes(t, 64<<10)}
	writeCheckpoint(t, dir, "step-1", files)
	r.waitEvent(CheckpointComplete, "step-1")
	<-s.puts // its upload has begun, and is held
	if err := os.RemoveAll(filepath.Join(dir, "step-1")); err != nil {
		t.Fatal(err)
	}
	r.waitEvent(CheckpointDeleted, "step-1")
	close(s.release)

	writeCheckpoint(t, dir, "step-2", files)
	r.waitCommitted("step-2")
	if err := os.MkdirAll(filepath.Join(dir, "step-3"), 0o755); err != nil { // no marker: never complete
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(dir, "step-3", "w.bin"), files["w.bin"], 0o644); err != nil {
		t.Fatal(err)
	}
	eventuallyUploader(t, "step-3 to be tracked", func() bool {
		return slices.ContainsFunc(r.up.Status(t.Context()).Checkpoints, func(c CheckpointStatus) bool { return c.Name == "step-3" })
	})
	for _, name := range []string{"step-2", "step-3"} {
		if err := os.RemoveAll(filepath.Join(dir, name)); err != nil {
			t.Fatal(err)
		}
	}
	eventuallyUploader(t, "step-2 and step-3 to leave tracking", func() bool {
		return !slices.ContainsFunc(r.up.Status(t.Context()).Checkpoints, func(c CheckpointStatus) bool { return c.Name == "step-2" || c.Name == "step-3" })
	})
	writeCheckpoint(t, dir, "step-4", files)
	for {
		ev := r.waitEvent(0, "")
		if ev.Kind == CheckpointDeleted {
			t.Errorf("CheckpointDeleted for %s; want none: committed before, or never complete", ev.Checkpoint)
		}
		if ev.Kind == CheckpointCommitted && ev.Checkpoint == "step-4" {
			break
		}
	}
}

// A complete checkpoint directory renamed before its commit (a staging name renamed into place
// after the marker was written in it) is committed under its new name only: the commit begun
// under the old name is abandoned and its objects deleted, and the warning says what to do.
// Staged under a dot-".tmp" name instead, the directory is never looked at before its rename.
func TestUploaderCheckpointDirectoryRenamedBeforeItsCommit(t *testing.T) {
	dir := t.TempDir()
	s := &gateStore{memStore: newMemStore(), puts: make(chan string, 100), release: make(chan struct{})}
	r := startUploader(t, dir, s, 0)
	files := map[string][]byte{"w.bin": randomBytes(t, 64<<10), "sub/v.bin": randomBytes(t, 1<<10)}
	writeCheckpoint(t, dir, "tmp-step-1", files)
	r.waitEvent(CheckpointComplete, "tmp-step-1")
	<-s.puts // its upload has begun
	if err := os.Rename(filepath.Join(dir, "tmp-step-1"), filepath.Join(dir, "step-1")); err != nil {
		t.Fatal(err)
	}
	eventuallyUploader(t, "tmp-step-1 to leave tracking", func() bool {
		return !slices.ContainsFunc(r.up.Status(t.Context()).Checkpoints, func(c CheckpointStatus) bool { return c.Name == "tmp-step-1" })
	})
	r.waitEvent(CheckpointRenamedAway, "tmp-step-1") // a notice it was written for waits for step-1
	close(s.release)
	r.waitCommitted("step-1")
	restoreAndCompare(t, s.memStore, "step-1", files)

	writeCheckpoint(t, dir, ".step-2.tmp", files)
	if err := os.Rename(filepath.Join(dir, ".step-2.tmp"), filepath.Join(dir, "step-2")); err != nil {
		t.Fatal(err)
	}
	r.waitCommitted("step-2")
	r.stop()

	for _, name := range []string{"tmp-step-1", ".step-2.tmp"} {
		if got := commitsOf(t, s.memStore, name); len(got) != 0 {
			t.Errorf("%s committed %d times after it was renamed away; want never", name, len(got))
		}
	}
	objs, err := s.memStore.List(context.Background(), "job/")
	if err != nil {
		t.Fatal(err)
	}
	for _, o := range objs {
		if strings.HasPrefix(o.Key, "job/tmp-step-1/") || strings.HasPrefix(o.Key, "job/.step-2.tmp/") {
			t.Errorf("object %s of a staging name left in the store", o.Key)
		}
	}
	logs := r.logs.String()
	if n := strings.Count(logs, `"checkpoint":"tmp-step-1","why":"checkpoint renamed away"`); n != 1 {
		t.Errorf("%d warnings for tmp-step-1 renamed before its commit; want 1:\n%s", n, logs)
	}
	if !strings.Contains(logs, `write the marker after renaming the directory into place`) {
		t.Errorf("the warning does not say to write the marker after the rename:\n%s", logs)
	}
	if strings.Contains(logs, `.step-2.tmp`) {
		t.Errorf("a dot-.tmp staging directory was looked at:\n%s", logs)
	}
}

// A stop that comes while the trainer writes the checkpoint it was signalled for under a staging
// name, renamed into place before its marker (as Hugging Face's Trainer did with
// tmp-checkpoint-N), waits for the checkpoint under its new name: the staging name renamed away
// is not a checkpoint deleted, after which nothing is awaited.
func TestUploaderStopWaitsForASignalledCheckpointRenamedIntoPlace(t *testing.T) {
	dir := t.TempDir()
	store := newMemStore()
	r := startUploaderWith(t, dir, store, UploaderConfig{StopBudget: time.Minute})
	r.up.SetNotices([]ActiveNotice{{Key: "spot/terminate", Deadline: time.Now().Add(2 * time.Minute), SignalledAt: time.Now()}})
	eventuallyUploader(t, "the notice to be taken", func() bool { return r.up.Status(t.Context()).Urgent })
	files := map[string][]byte{"w.bin": randomBytes(t, 64<<10), "v.bin": randomBytes(t, 1<<10)}
	for rel, data := range files {
		p := filepath.Join(dir, "tmp-step-1", rel)
		if err := os.MkdirAll(filepath.Dir(p), 0o755); err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(p, data, 0o644); err != nil {
			t.Fatal(err)
		}
	}
	eventuallyUploader(t, "the staging directory's files to be stored", func() bool {
		st := r.up.Status(t.Context())
		return len(st.Checkpoints) == 1 && st.Checkpoints[0].FilesStored == 2
	})
	stopped := make(chan struct{})
	go func() { r.cancel(); <-r.done; close(stopped) }() // SIGTERM while the trainer saves
	const drainMsg = "stop requested while checkpoints are being written or are not committed yet; finishing them first (a second SIGTERM stops at once)"
	eventuallyUploader(t, "the stop to wait for the checkpoint", func() bool { return strings.Contains(r.logs.String(), drainMsg) })
	if err := os.Rename(filepath.Join(dir, "tmp-step-1"), filepath.Join(dir, "step-1")); err != nil {
		t.Fatal(err)
	}
	running, endStatus := context.WithCancel(t.Context()) // Status waits for a Run that has returned
	go func() { <-stopped; endStatus() }()
	eventuallyUploader(t, "the renamed checkpoint to be tracked", func() bool {
		cs := r.up.Status(running).Checkpoints
		select {
		case <-stopped:
			t.Fatalf("the stop ended when the staging directory was renamed, before the marker:\n%s", r.logs)
		default:
		}
		return len(cs) == 1 && cs[0].Name == "step-1" && cs[0].Files == 2
	})
	if err := os.WriteFile(filepath.Join(dir, "step-1", "_COMPLETE"), nil, 0o644); err != nil {
		t.Fatal(err)
	}
	<-stopped
	if got := commitsOf(t, store, "step-1"); len(got) != 1 {
		t.Errorf("after the stop, step-1 has %d commits; want it committed before Run returned", len(got))
	}
	if got := commitsOf(t, store, "tmp-step-1"); len(got) != 0 {
		t.Errorf("the staging name has %d commits; want none", len(got))
	}
}

// A save that writes a file per rank into checkpoint.dir (rank0.pt, rank1.pt) is that many
// single-file checkpoints, and a restore brings back the newest alone: the agent warns, once, when
// two single-file checkpoints are written within 2 s of each other. (Found from outside: the
// other ranks' files were missing after a restore, without a word.) Saves far apart are not said.
func TestSingleFilesWrittenTogetherAreWarnedOf(t *testing.T) {
	dir := t.TempDir()
	r := startUploader(t, dir, newMemStore(), 0)
	save := func(name string, mod time.Time) {
		t.Helper()
		tmp := filepath.Join(dir, "."+name+".tmp")
		if err := os.WriteFile(tmp, []byte(name), 0o644); err != nil {
			t.Fatal(err)
		}
		if err := os.Chtimes(tmp, mod, mod); err != nil {
			t.Fatal(err)
		}
		if err := os.Rename(tmp, filepath.Join(dir, name)); err != nil {
			t.Fatal(err)
		}
		r.waitCommitted(name)
	}
	const warning = "two single-file checkpoints were written within 2 s of each other"
	t0 := time.Now().Add(-time.Hour)
	save("step-100.pt", t0)
	save("step-200.pt", t0.Add(10*time.Minute))
	if strings.Contains(r.logs.String(), warning) {
		t.Fatalf("warned of single-file checkpoints 10 minutes apart:\n%s", r.logs)
	}
	save("rank0-step-300.pt", t0.Add(20*time.Minute))
	save("rank1-step-300.pt", t0.Add(20*time.Minute+300*time.Millisecond))
	save("rank2-step-300.pt", t0.Add(20*time.Minute+600*time.Millisecond))
	if n := strings.Count(r.logs.String(), warning); n != 1 {
		t.Errorf("warned %d times of single-file checkpoints written together; want once:\n%s", n, r.logs)
	}
}

// sendReady sends an uploader fed by events the FileReady (for the marker, Complete) of each of
// rels, files of checkpoint name under dir, as its watcher would.
func sendReady(t *testing.T, events chan<- WatchEvent, dir, name string, rels ...string) {
	t.Helper()
	for _, rel := range rels {
		fi, err := os.Lstat(filepath.Join(dir, name, rel))
		if err != nil {
			t.Fatal(err)
		}
		ev := WatchEvent{Kind: FileReady, Checkpoint: name, Path: rel, Size: fi.Size(), ModTime: fi.ModTime(), ID: FileIDOf(fi), At: time.Now()}
		if rel == "_COMPLETE" {
			ev.Kind = Complete
		}
		events <- ev
	}
}

// slowPutStore is a memStore whose PutFile takes d (of the clock: a synctest bubble's).
type slowPutStore struct {
	*memStore
	d time.Duration
}

func (s slowPutStore) PutFile(ctx context.Context, key string, f *os.File, size int64, progress func(n int64)) (Checksum, error) {
	<-time.After(s.d)
	return s.memStore.PutFile(ctx, key, f, size, progress)
}

// A manifest's upload_seconds is how long the upload took, from the first file's send to the
// last one's end, not the sum of every file's send time: four files and the marker, sent two at a
// time, each taking 1 s, took 3 s at most, not 5.
func TestUploaderUploadSecondsIsWallTime(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		dir := t.TempDir()
		store := slowPutStore{memStore: newMemStore(), d: time.Second}
		r, events := startUploaderFed(t, dir, store, UploaderConfig{BackgroundFiles: 2})
		files := map[string][]byte{}
		for i := range 4 {
			files[fmt.Sprintf("shard-%d.bin", i)] = randomBytes(t, 4<<10)
		}
		writeCheckpoint(t, dir, "step-1", files)
		sendReady(t, events, dir, "step-1", append(slices.Sorted(maps.Keys(files)), "_COMPLETE")...)
		m := r.waitCommitted("step-1").Manifest
		if got := m.Timings.UploadSeconds; got < 2 || got > 3.5 {
			t.Errorf("upload_seconds = %v; want the wall time, 2 to 3 s (5 files of 1 s, 2 at a time), not their sum (5 s)", got)
		}
	})
}

// A complete checkpoint whose commit takes long says how far it is every commitProgressEvery
// (found from outside: a commit of 100 000 files logged nothing for the 339 s between "checkpoint
// complete" and its commit), and says nothing when nothing more was stored.
func TestUploaderSaysHowFarALongCommitIs(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		dir := t.TempDir()
		store := slowPutStore{memStore: newMemStore(), d: 20 * time.Second}
		r, events := startUploaderFedAt(t, dir, store, UploaderConfig{BackgroundFiles: 1}, zerolog.InfoLevel)
		files := map[string][]byte{}
		for i := range 4 {
			files[fmt.Sprintf("shard-%d.bin", i)] = randomBytes(t, 1<<10)
		}
		writeCheckpoint(t, dir, "step-1", files)
		sendReady(t, events, dir, "step-1", append(slices.Sorted(maps.Keys(files)), "_COMPLETE")...)
		r.waitEventWithin(CheckpointCommitted, "step-1", 5*time.Minute) // of the bubble's clock: the commit takes 100 s
		var said []map[string]any
		for line := range strings.Lines(r.logs.String()) {
			var l map[string]any
			if json.Unmarshal([]byte(line), &l) == nil && l["message"] == "committing: stored so far" {
				said = append(said, l)
			}
		}
		// 5 files of 20 s, one at a time: stored at 20, 40, 60, 80 and 100 s; said at 30, 60 and
		// 90 s (at 60 s, the third file's store and the tick come together).
		if len(said) < 2 || len(said) > 3 {
			t.Fatalf("%d progress lines; want 2 or 3 (every 30 s of a 100 s commit, when more was stored):\n%s", len(said), r.logs)
		}
		first := said[0]
		if first["checkpoint"] != "step-1" || first["files"] != 5.0 || first["files_stored"] != 1.0 || first["bytes_stored"] != 1024.0 ||
			first["bytes"].(float64) < 4096 || first["since_complete_s"].(float64) < 30 {
			t.Errorf("first progress line = %v; want step-1, 1 of 5 files stored (1024 bytes of 4096 and more) 30 s after it was complete", first)
		}
		for i := 1; i < len(said); i++ {
			if said[i]["bytes_stored"].(float64) <= said[i-1]["bytes_stored"].(float64) {
				t.Errorf("progress line %d says %v bytes stored after %v; want only lines that say more", i, said[i]["bytes_stored"], said[i-1]["bytes_stored"])
			}
		}
	})
}

// /status's uploads.checkpoints is a list, [] before any checkpoint, never null: a script
// iterating it (jq '.uploads.checkpoints[]') fails on null.
func TestUploaderStatusListsNoCheckpointAsEmpty(t *testing.T) {
	r := startUploaderWith(t, t.TempDir(), newMemStore(), UploaderConfig{})
	b, err := json.Marshal(r.up.Status(t.Context()))
	if err != nil {
		t.Fatal(err)
	}
	if !strings.Contains(string(b), `"checkpoints":[]`) {
		t.Errorf("status = %s; want \"checkpoints\":[]", b)
	}
}

// A running agent that finds LATEST on another instance's commit whose clock is ahead (LATEST not
// moved to its own newer commit) knows of that commit from then on: a checkpoint it completes
// later is ordered after it, with the clock warning, and becomes LATEST. It used to learn of such
// a commit only at start: every later checkpoint stayed behind it, and with checkpoint.keep 1
// retention deleted each as it was committed. (Found from outside.)
func TestRunningAgentLearnsOfACommitFromAClockAhead(t *testing.T) {
	dir := t.TempDir()
	store := newMemStore()
	r := startUploaderWith(t, dir, store, UploaderConfig{StopBudget: -1, Keep: 1})
	now := time.Now()
	ahead := putCommit(t, store, "step-100", "i-ahead", map[string][]byte{"a.bin": randomBytes(t, 1<<10), "_COMPLETE": nil},
		now.Add(time.Hour), now.Add(time.Hour), nil)
	if moved, err := advanceLatest(t.Context(), store, ahead, Host{InstanceID: "i-ahead"}, nil); !moved || err != nil {
		t.Fatalf("advanceLatest(the commit from a clock ahead) = %v, %v", moved, err)
	}
	writeCheckpoint(t, dir, "step-200", map[string][]byte{"a.bin": randomBytes(t, 1<<10)})
	r.waitCommitted("step-200")
	learned := time.Now()
	for !time.Now().After(learned.Add(20 * time.Millisecond)) { // the clock read, not waited on for an event
		<-time.After(time.Millisecond)
	}
	writeCheckpoint(t, dir, "step-300", map[string][]byte{"a.bin": randomBytes(t, 1<<10)})
	third := r.waitCommitted("step-300").Manifest
	r.stop()
	var l Latest
	if data, _, err := store.GetBytes(t.Context(), LatestKey("job")); err != nil || json.Unmarshal(data, &l) != nil || l.Commit != third.Commit {
		t.Errorf("LATEST = %s (%v); want step-300 %s, completed after the agent read the commit from a clock ahead", data, err, third.Commit)
	}
	if cs := commitsOf(t, store, "step-300"); len(cs) != 1 {
		t.Errorf("step-300 has %d commits; want it kept (retention keeps the newest)", len(cs))
	}
	if !strings.Contains(r.logs.String(), "this instance's clock is behind the one that wrote a commit the agent knew of") {
		t.Errorf("no clock warning:\n%s", r.logs)
	}
}

// A checkpoint whose commit retention deleted (another instance saved its name again, and
// newer), its files' change times moved by a chmod -R while the agent was down, does not come
// back as the newest when the agent starts again: the journal knows its bytes and its place.
// It used to be committed again as LATEST ("nothing there is newer"), and retention deleted the
// other instance's newer save of its name. (Found from outside.)
func TestChmodWhileDownKeepsAJournalCommitsPlace(t *testing.T) {
	dirA, dirB, stateA := t.TempDir(), t.TempDir(), t.TempDir()
	store := newMemStore()
	cfgA := UploaderConfig{StopBudget: -1, Keep: 2, StateDir: stateA}
	a := startUploaderWith(t, dirA, store, cfgA)
	writeCheckpoint(t, dirA, "step-300", map[string][]byte{"a.bin": randomBytes(t, 4<<10)})
	old := a.waitCommitted("step-300").Manifest
	a.stop()
	b := startUploaderWith(t, dirB, store, UploaderConfig{StopBudget: -1, Keep: 2})
	for !time.Now().After(old.Order().At.Add(20 * time.Millisecond)) { // the clock read, not waited on for an event
		<-time.After(time.Millisecond)
	}
	writeCheckpoint(t, dirB, "step-300", map[string][]byte{"a.bin": randomBytes(t, 4<<10)})
	newer := b.waitCommitted("step-300").Manifest
	for !time.Now().After(newer.Order().At.Add(20 * time.Millisecond)) { // not in the same tick of the file clock
		<-time.After(time.Millisecond)
	}
	writeCheckpoint(t, dirB, "step-400", map[string][]byte{"a.bin": randomBytes(t, 4<<10)})
	newest := b.waitCommitted("step-400").Manifest
	b.stop()
	if cs := commitsOf(t, store, "step-300"); len(cs) != 1 || cs[0].Commit != newer.Commit {
		t.Fatalf("step-300's commits before the restart = %v; want B's alone (A's deleted by retention)", cs)
	}
	if err := filepath.WalkDir(dirA, func(p string, _ fs.DirEntry, err error) error {
		if err != nil {
			return err
		}
		return os.Chmod(p, 0o775) // every ctime now, no byte changed
	}); err != nil {
		t.Fatal(err)
	}
	a = startUploaderWith(t, dirA, store, cfgA)
	eventuallyUploader(t, "A's step-300 to be settled", func() bool {
		for _, c := range a.up.Status(t.Context()).Checkpoints {
			if c.Name == "step-300" {
				return c.Committed
			}
		}
		return false
	})
	a.stop()
	var l Latest
	if data, _, err := store.GetBytes(t.Context(), LatestKey("job")); err != nil || json.Unmarshal(data, &l) != nil || l.Commit != newest.Commit {
		t.Errorf("LATEST = %s (%v); want step-400 %s\n%s", data, err, newest.Commit, a.logs)
	}
	if cs := commitsOf(t, store, "step-300"); !slices.ContainsFunc(cs, func(m *Manifest) bool { return m.Commit == newer.Commit }) {
		t.Errorf("B's step-300 %s was deleted\n%s", newer.Commit, a.logs)
	}
	if strings.Contains(a.logs.String(), "nothing there is newer") {
		t.Errorf("A took its old step-300 for newer than the store:\n%s", a.logs)
	}
}

// A stop that comes as a checkpoint gets its marker, before the watcher has said so (a trainer
// that saves on its own SIGTERM and exits, stopped before the agent, as the systemd units order
// it): the stop returned at once, "no marker yet", and the trainer's last save was never
// committed (found from outside: 4 of 10 runs). The stop now looks for markers on disk and waits
// for their checkpoints to be read, then commits them.
func TestStopJustAfterTheMarkerWaitsForTheCheckpoint(t *testing.T) {
	dir := t.TempDir()
	store := newMemStore()
	r, events := startUploaderFed(t, dir, store, UploaderConfig{StopBudget: time.Minute})
	save := map[string][]byte{"a.bin": randomBytes(t, 64<<10)}
	writeCheckpoint(t, dir, "step-1", save) // the marker too
	sendReady(t, events, dir, "step-1", "a.bin")
	eventuallyUploader(t, "the file stored", func() bool {
		store.mu.Lock()
		defer store.mu.Unlock()
		return len(store.objs) >= 1
	})
	r.cancel() // the stop, before the watcher's word of the marker
	stopped := false
	eventuallyUploader(t, "the stop to be decided", func() bool {
		select {
		case <-r.done:
			stopped = true
			return true
		default:
			return strings.Contains(r.logs.String(), "finishing them first")
		}
	})
	if stopped {
		t.Fatalf("the uploader stopped with step-1's marker on disk, not read yet:\n%s", r.logs.String())
	}
	sendReady(t, events, dir, "step-1", "_COMPLETE") // the watcher's word, a moment late
	r.waitCommitted("step-1")
	r.waitDone("the uploader did not stop once step-1 was committed")
	restoreAndCompare(t, store, "step-1", save)
}

// A marker on disk at the stop whose checkpoint never completes (the watcher never says so) holds
// the stop for stopMarkerWait, not its whole budget, and is said.
func TestStopWaitsForAMarkerOnDiskOnlyAMoment(t *testing.T) {
	was := stopMarkerWait
	stopMarkerWait = 200 * time.Millisecond
	t.Cleanup(func() { stopMarkerWait = was })
	dir := t.TempDir()
	r, _ := startUploaderFed(t, dir, newMemStore(), UploaderConfig{StopBudget: time.Hour})
	writeCheckpoint(t, dir, "step-1", map[string][]byte{"a.bin": randomBytes(t, 1<<10)})
	r.cancel()
	r.waitDone("the stop waited on past stopMarkerWait for a checkpoint that never completed")
	if !strings.Contains(r.logs.String(), "did not complete in time") {
		t.Errorf("log does not say the checkpoint with its marker did not complete:\n%s", r.logs.String())
	}
}

// truncatingStore truncates the file it is given to half before it sends it: a trainer
// truncating a file while it is uploaded.
type truncatingStore struct{ Store }

func (s truncatingStore) PutFile(ctx context.Context, key string, f *os.File, size int64, progress func(int64)) (Checksum, error) {
	if err := os.Truncate(f.Name(), size/2); err != nil {
		return Checksum{}, err
	}
	return s.Store.PutFile(ctx, key, f, size, progress)
}

// A file truncated while it was sent failed the store's PutFile ("has N bytes; want M"), and that
// was said as the store's failure, with the store's fix, and counted an upload error (found from
// outside): it is the file that changed.
func TestFileTruncatedWhileSentIsAChangeNotAStoreFailure(t *testing.T) {
	dir := t.TempDir()
	if err := os.WriteFile(filepath.Join(dir, "big.bin"), randomBytes(t, 1<<20), 0o644); err != nil {
		t.Fatal(err)
	}
	fs, err := NewFileStore(t.TempDir())
	if err != nil {
		t.Fatal(err)
	}
	_, err = uploadFile(t.Context(), truncatingStore{fs}, dir, "big.bin", "job/step-1/c/big.bin", nil)
	if !errors.Is(err, errChangedWhileSending) {
		t.Errorf("uploadFile of a file truncated as it was sent = %v; want errChangedWhileSending", err)
	}
}

// A complete checkpoint deleted while it waits its turn, none of it sent yet, is as lost as one
// deleted half sent: both are warned of (found from outside: one still queued said only
// "checkpoint no longer tracked", at info level, though the docs say the log warns).
func TestCompleteCheckpointDeletedWhileQueuedIsWarnedOf(t *testing.T) {
	s := &gateStore{memStore: newMemStore(), puts: make(chan string, 100), release: make(chan struct{})}
	dir := t.TempDir()
	r := startUploaderWith(t, dir, s, UploaderConfig{BackgroundFiles: 1})
	// step-1's upload begins (and is held), then step-2 waits its turn behind it: the newer one
	// is queued, so its loss is no older checkpoint superseded (which is not warned of). Both
	// written at once, step-2 went first at times, and step-1, deleted, was superseded: no
	// warning, and the test failed (2 of 20).
	writeCheckpoint(t, dir, "step-1", map[string][]byte{"a.bin": randomBytes(t, 1<<10)})
	select {
	case <-s.puts:
	case <-time.After(20 * time.Second):
		t.Fatal("no upload began within 20 s")
	}
	writeCheckpoint(t, dir, "step-2", map[string][]byte{"a.bin": randomBytes(t, 1<<10)})
	queued := "step-2"
	eventuallyUploader(t, "step-2 seen complete", func() bool {
		for _, c := range r.up.Status(t.Context()).Checkpoints {
			if c.Name == queued && c.CompleteSince != nil {
				return true
			}
		}
		return false
	})
	if err := os.RemoveAll(filepath.Join(dir, queued)); err != nil {
		t.Fatal(err)
	}
	msg := "complete checkpoint gone before it was committed"
	for deadline := time.Now().Add(20 * time.Second); !strings.Contains(r.logs.String(), msg); <-time.After(5 * time.Millisecond) {
		if time.Now().After(deadline) {
			close(s.release)
			t.Fatalf("no warning of %s, deleted while queued, within 20 s:\n%s", queued, r.logs)
		}
	}
	close(s.release)
	if l := r.logs.String(); !strings.Contains(l, `"checkpoint":"`+queued+`"`) || !strings.Contains(l, `"begun":false`) {
		t.Errorf("log = %s; want the warning naming %s, not begun", l, queued)
	}
}

// A checkpoint holding a file named as markers are (_COMPLETE), but not the configured marker
// (.metadata), gives MarkerHint, which the messages of a save that never completes carry (found
// from outside: a trainer writing _COMPLETE under checkpoint.marker .metadata was said to be gone
// before its checkpoint completed). Its own marker ends the hint.
func TestUploaderHintsAtAMarkerOfAnotherName(t *testing.T) {
	dir := t.TempDir()
	r := startUploaderTweaked(t, dir, newMemStore(), UploaderConfig{Marker: ".metadata"}, func(w *Watcher) { w.marker = ".metadata" })
	writeCheckpoint(t, dir, "step-23", map[string][]byte{"rank-0.pt": randomBytes(t, 1<<10)})
	want := "step-23 holds _COMPLETE, not the configured marker .metadata (checkpoint.marker)"
	for deadline := time.Now().Add(20 * time.Second); r.up.MarkerHint() != want; <-time.After(5 * time.Millisecond) {
		if time.Now().After(deadline) {
			t.Fatalf("MarkerHint = %q after 20 s; want %q", r.up.MarkerHint(), want)
		}
	}
	if err := os.WriteFile(filepath.Join(dir, "step-23", ".metadata"), nil, 0o644); err != nil {
		t.Fatal(err)
	}
	r.waitCommitted("step-23")
	if h := r.up.MarkerHint(); h != "" {
		t.Errorf("MarkerHint = %q once the checkpoint completed with its own marker; want none", h)
	}
}

// A job notice's post is no signal: the trainer's save after it does not give the forecast the
// time the trainer took to answer a signal (found from outside: the wait for the trainer's next
// periodic save after `spotguard notify` was counted in every forecast until the next signal).
func TestUploaderForecastTakesNoReachFromAPostedNotice(t *testing.T) {
	for _, posted := range []bool{false, true} {
		t.Run(fmt.Sprintf("posted=%v", posted), func(t *testing.T) {
			synctest.Test(t, func(t *testing.T) {
				dir := t.TempDir()
				// Sends take time, as on a real link: a forecast needs a throughput.
				r, events := startUploaderFed(t, dir, slowPutStore{memStore: newMemStore(), d: time.Second}, UploaderConfig{})
				r.up.SetNotices([]ActiveNotice{{Key: "job/terminate", SignalledAt: time.Now(), Posted: posted}})
				<-time.After(5 * time.Second) // the trainer's step, to its save
				writeCheckpoint(t, dir, "step-1", map[string][]byte{"a.bin": randomBytes(t, 1<<10)})
				sendReady(t, events, dir, "step-1", "a.bin", "_COMPLETE")
				ev := r.waitCommitted("step-1")
				switch {
				case ev.Forecast <= 0:
					t.Errorf("forecast %v; want one", ev.Forecast)
				case !posted && ev.Forecast < 5*time.Second:
					t.Errorf("forecast %v after a signal answered 5 s later; want the 5 s in it", ev.Forecast)
				case posted && ev.Forecast >= 5*time.Second:
					t.Errorf("forecast %v after a posted notice; want no time taken for the trainer's answer to a signal", ev.Forecast)
				}
			})
		})
	}
}

// A file written again after its checkpoint's marker while no agent ran (a restart, a crash
// loop, an upgrade during the trainer's save): its modification time is after the marker's, and
// the checkpoint is withheld until its marker is written again, not committed with the old
// marker (found from outside: committed, and restored as the newest).
func TestCheckpointWrittenAfterItsMarkerWhileNoAgentRanIsWithheld(t *testing.T) {
	dir, state := t.TempDir(), t.TempDir()
	mem := newMemStore()
	writeCheckpoint(t, dir, "step-1", map[string][]byte{"a.pt": randomBytes(t, 4<<10), "b.pt": randomBytes(t, 4<<10)})
	marker, err := os.Stat(filepath.Join(dir, "step-1", "_COMPLETE"))
	if err != nil {
		t.Fatal(err)
	}
	waitFileClockAfter(t, FileIDOf(marker).ChangeTime)
	later := randomBytes(t, 3<<10)
	if err := os.WriteFile(filepath.Join(dir, "step-1", "b.pt"), later, 0o644); err != nil {
		t.Fatal(err)
	}

	r := startUploaderWith(t, dir, mem, UploaderConfig{StateDir: state, StopBudget: -1})
	if ev := r.waitEvent(CheckpointWithheld, "step-1"); !errors.Is(ev.Err, ErrWrittenAfterMarker) || !strings.Contains(ev.Err.Error(), "step-1/b.pt") {
		t.Errorf("step-1 withheld for %v; want ErrWrittenAfterMarker naming step-1/b.pt", ev.Err)
	}
	if got := commitsOf(t, mem, "step-1"); len(got) != 0 {
		t.Fatalf("step-1 has %d commits; want none until its marker is written again", len(got))
	}
	// The marker written again: the checkpoint as it is now is committed.
	if err := os.WriteFile(filepath.Join(dir, "step-1", "_COMPLETE"), []byte("again"), 0o644); err != nil {
		t.Fatal(err)
	}
	r.waitCommitted("step-1")
	r.stop()
	a, err := os.ReadFile(filepath.Join(dir, "step-1", "a.pt"))
	if err != nil {
		t.Fatal(err)
	}
	restoreAndCompare(t, mem, "step-1", map[string][]byte{"a.pt": a, "b.pt": later})
}

// A file of a committed checkpoint deleted while no agent ran, and the journal lost with it (a
// reboot: a re-save or a rotation's rmtree cut short by the power off, the marker left): what is
// left is that commit's save, torn, complete at the very time it was; it is withheld until its
// marker is written again, not committed as the newest (found from outside: committed, LATEST
// moved to it, 5 of 5).
func TestFileDeletedAfterTheMarkerBeforeARebootIsWithheld(t *testing.T) {
	dir, mem := t.TempDir(), newMemStore()
	writeCheckpoint(t, dir, "step-1", map[string][]byte{"a.pt": randomBytes(t, 4<<10), "b.pt": randomBytes(t, 4<<10), "c.pt": randomBytes(t, 4<<10)})
	r := startUploaderWith(t, dir, mem, UploaderConfig{StateDir: t.TempDir(), StopBudget: -1})
	r.waitCommitted("step-1")
	r.stop()
	if err := os.Remove(filepath.Join(dir, "step-1", "b.pt")); err != nil {
		t.Fatal(err)
	}

	r = startUploaderWith(t, dir, mem, UploaderConfig{StateDir: t.TempDir(), StopBudget: -1}) // the journal lost
	if ev := r.waitEvent(CheckpointWithheld, "step-1"); !errors.Is(ev.Err, ErrWrittenAfterMarker) || !strings.Contains(ev.Err.Error(), "step-1/b.pt") {
		t.Errorf("step-1 withheld for %v; want ErrWrittenAfterMarker naming step-1/b.pt", ev.Err)
	}
	if got := commitsOf(t, mem, "step-1"); len(got) != 1 {
		t.Fatalf("step-1 has %d commits; want the first alone until its marker is written again", len(got))
	}
	if !strings.Contains(r.logs.String(), "file deleted after its checkpoint's marker") {
		t.Errorf("log does not say a file was deleted after the marker:\n%s", r.logs)
	}
	// The marker written again: the checkpoint as it is now is a new save, committed.
	if err := os.WriteFile(filepath.Join(dir, "step-1", "_COMPLETE"), []byte("again"), 0o644); err != nil {
		t.Fatal(err)
	}
	r.waitCommitted("step-1")
	r.stop()
	if got := commitsOf(t, mem, "step-1"); len(got) != 2 {
		t.Errorf("step-1 has %d commits; want 2 once the marker was written again", len(got))
	}
}

// feedCheckpoint sends events what a watcher would of dir/name, on disk: a FileReady for each
// file, then the Complete of its marker.
func feedCheckpoint(t *testing.T, events chan<- WatchEvent, dir, name string) {
	t.Helper()
	entries, err := os.ReadDir(filepath.Join(dir, name))
	if err != nil {
		t.Fatal(err)
	}
	id := func(rel string) FileID {
		fi, err := os.Lstat(filepath.Join(dir, name, rel))
		if err != nil {
			t.Fatal(err)
		}
		return FileIDOf(fi)
	}
	for _, e := range entries {
		if e.Name() != "_COMPLETE" {
			fid := id(e.Name())
			events <- WatchEvent{Kind: FileReady, Checkpoint: name, Path: e.Name(), Size: fid.Size, ModTime: fid.ModTime, ID: fid, At: time.Now()}
		}
	}
	fid := id("_COMPLETE")
	events <- WatchEvent{Kind: Complete, Checkpoint: name, Path: "_COMPLETE", Size: fid.Size, ModTime: fid.ModTime, ID: fid, At: time.Now()}
}

// A commit's line has fixed text, its numbers in fields (found from outside: the forecast in the
// text made several messages of one event, which a log pipeline could not select).
func TestCommitLineIsFixedText(t *testing.T) {
	dir := t.TempDir()
	r, events := startUploaderFedAt(t, dir, newMemStore(), UploaderConfig{}, zerolog.InfoLevel)
	writeCheckpoint(t, dir, "step-1", map[string][]byte{"a.pt": randomBytes(t, 4<<10)})
	feedCheckpoint(t, events, dir, "step-1")
	r.waitCommitted("step-1")
	r.stop()
	var found bool
	for _, l := range strings.Split(r.logs.String(), "\n") {
		var m map[string]any
		if json.Unmarshal([]byte(l), &m) != nil || m["checkpoint"] != "step-1" || !strings.Contains(fmt.Sprint(m["message"]), "committed") {
			continue
		}
		found = true
		if _, ok := m["durable_after_notice_forecast_s"].(float64); m["message"] != "checkpoint committed" || !ok || m["trigger"] != "periodic" {
			t.Errorf("commit line %s; want the message \"checkpoint committed\", with the forecast and the trigger in fields", l)
		}
	}
	if !found {
		t.Errorf("no commit line for step-1:\n%s", r.logs.String())
	}
}

// nameBlockingStore is a Store whose listings under the checkpoint name wait for release: the
// uploader's look at the store's commits of that name (before it sends a file of it) waits.
type nameBlockingStore struct {
	Store
	name    string
	release chan struct{}
}

func (s *nameBlockingStore) wait(ctx context.Context, prefix string) error {
	if !strings.Contains(prefix, "/"+s.name+"/") {
		return nil
	}
	select {
	case <-s.release:
		return nil
	case <-ctx.Done():
		return ctx.Err()
	}
}

func (s *nameBlockingStore) List(ctx context.Context, prefix string) ([]ObjectInfo, error) {
	if err := s.wait(ctx, prefix); err != nil {
		return nil, err
	}
	return s.Store.List(ctx, prefix)
}

func (s *nameBlockingStore) ListDir(ctx context.Context, prefix string) ([]string, []ObjectInfo, error) {
	if err := s.wait(ctx, prefix); err != nil {
		return nil, nil, err
	}
	return s.Store.ListDir(ctx, prefix)
}

// A staging directory renamed into place (its marker written after the rename) may be seen
// complete under its staging name, its marker's event coming under the path its watch had: renamed
// away before anything of it was sent, it is no checkpoint the trainer outran the store with
// (found from outside: a warning saying so, and to keep more checkpoints on disk).
func TestStagingNameRenamedAwayBeforeItsSendIsNoLoss(t *testing.T) {
	dir := t.TempDir()
	bs := &nameBlockingStore{Store: newMemStore(), name: "step-1.tmp", release: make(chan struct{})}
	defer close(bs.release)
	r, events := startUploaderFedAt(t, dir, bs, UploaderConfig{}, zerolog.InfoLevel)
	writeCheckpoint(t, dir, "step-1.tmp", map[string][]byte{"a.pt": randomBytes(t, 4<<10)})
	feedCheckpoint(t, events, dir, "step-1.tmp")
	r.waitEvent(CheckpointComplete, "step-1.tmp")
	if err := os.Rename(filepath.Join(dir, "step-1.tmp"), filepath.Join(dir, "step-1")); err != nil {
		t.Fatal(err)
	}
	events <- WatchEvent{Kind: Removed, Checkpoint: "step-1.tmp", Moved: true, At: time.Now()}
	r.waitEvent(CheckpointRenamedAway, "step-1.tmp")
	if l := r.logs.String(); strings.Contains(l, "gone before it was committed") || !strings.Contains(l, "renamed away before its upload began") {
		t.Errorf("log of a staging name renamed away before its send:\n%s\nwant it said renamed away, not gone", l)
	}
}

// A checkpoint renamed into place whole is seen after its marker was written: its first file
// was ready by then, and first_file_at is never after complete_at (found from outside: 1–2 ms
// after, a negative write time in a dashboard).
func TestFirstFileAtIsNeverAfterCompleteAt(t *testing.T) {
	dir := t.TempDir()
	r := startUploader(t, dir, newMemStore(), 0)
	writeCheckpoint(t, dir, ".step-1.tmp", map[string][]byte{"a.pt": randomBytes(t, 4<<10)})
	laterTick(t, dir, ".step-1.tmp")
	if err := os.Rename(filepath.Join(dir, ".step-1.tmp"), filepath.Join(dir, "step-1")); err != nil {
		t.Fatal(err)
	}
	m := r.waitCommitted("step-1").Manifest
	if tm := m.Timings; tm.FirstFileAt == nil || tm.CompleteAt == nil || tm.FirstFileAt.After(*tm.CompleteAt) {
		t.Errorf("timings first_file_at %v, complete_at %v; want the first file ready no later than the checkpoint completed", tm.FirstFileAt, tm.CompleteAt)
	}
}

// commitWithJournal runs an uploader of dir into store with a journal (and no stop budget), and
// commits name with files: it returns the running rig, its configuration for a restart, and the
// commit.
func commitWithJournal(t *testing.T, dir string, store Store, name string, files map[string][]byte) (*uploaderRig, UploaderConfig, *Manifest) {
	t.Helper()
	cfg := UploaderConfig{StateDir: t.TempDir(), StopBudget: -1}
	r := startUploaderWith(t, dir, store, cfg)
	writeCheckpoint(t, dir, name, files)
	return r, cfg, r.waitCommitted(name).Manifest
}

// A trainer that saves into one directory again as it should (marker taken away, files written,
// marker written again) while the agent is stopped: the restarted agent reads the files before
// the new marker, and said "file written again after its checkpoint's marker", with the advice to
// do what the trainer did (found from outside, 3 of 3). The new save is committed, no warning.
func TestResaveWhileTheAgentWasStoppedIsNoWriteAfterTheMarker(t *testing.T) {
	dir, mem := t.TempDir(), newMemStore()
	r, cfg, first := commitWithJournal(t, dir, mem, "latest", map[string][]byte{"a.pt": randomBytes(t, 4<<10), "b.pt": randomBytes(t, 4<<10)})
	r.stop()

	ck := filepath.Join(dir, "latest")
	if err := os.Remove(filepath.Join(ck, "_COMPLETE")); err != nil {
		t.Fatal(err)
	}
	save2 := map[string][]byte{"a.pt": randomBytes(t, 4<<10), "b.pt": randomBytes(t, 4<<10)}
	for _, f := range []string{"a.pt", "b.pt"} {
		if err := os.WriteFile(filepath.Join(ck, f), save2[f], 0o644); err != nil {
			t.Fatal(err)
		}
	}
	writeMarker(t, ck)

	r = startUploaderWith(t, dir, mem, cfg)
	if ev := r.waitCommitted("latest"); ev.Manifest.Commit == first.Commit {
		t.Fatalf("the second save was taken for the first one's commit %s", first.Commit)
	}
	r.stop()
	restoreAndCompare(t, mem, "latest", save2)
	if l := r.logs.String(); strings.Contains(l, msgRewrittenAfterMarker) {
		t.Errorf("a save whose marker was taken away and written again was said written after its marker:\n%s", l)
	}
}

// A checkpoint whose commits in the store cannot be read (a policy that denies listing them, a
// list answered 503) counts as a failure of the store, as a failed upload does: it was only in
// the log (found from outside: the error metric stayed at 0 and /healthz at 200).
func TestCommitsThatCannotBeReadAreAStoreFailure(t *testing.T) {
	dir, mem := t.TempDir(), newMemStore()
	mem.mu.Lock()
	mem.listErr = errors.New("AccessDenied: listing denied")
	mem.mu.Unlock()
	writeCheckpoint(t, dir, "step-1", map[string][]byte{"a.pt": randomBytes(t, 4<<10)})
	r := startUploaderWith(t, dir, mem, UploaderConfig{StateDir: t.TempDir(), StopBudget: -1})
	deadline := time.Now().Add(20 * time.Second)
	for r.failed.Load() == 0 && time.Now().Before(deadline) {
		<-time.After(10 * time.Millisecond)
	}
	if n := r.failed.Load(); n == 0 {
		t.Errorf("no UploadFailed in 20 s while the store's commits of step-1 could not be read\n%s", r.logs)
	}
	mem.mu.Lock()
	mem.listErr = nil
	mem.mu.Unlock()
	r.waitCommitted("step-1")
	r.stop()
}
