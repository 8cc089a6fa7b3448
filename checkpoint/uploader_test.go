package checkpoint

import (
	"bytes"
	"context"
	"crypto/rand"
	"encoding/json"
	"os"
	"path/filepath"
	"sync"
	"testing"
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
}

func startUploader(t *testing.T, dir string, store Store, keep int) *uploaderRig {
	t.Helper()
	return startUploaderWith(t, dir, store, UploaderConfig{Keep: keep})
}

// startUploaderWith is startUploader with more of the uploader's configuration (Store, Job,
// Dir, Logger, Host and OnEvent are the rig's).
func startUploaderWith(t *testing.T, dir string, store Store, cfg UploaderConfig) *uploaderRig {
	t.Helper()
	keep := cfg.Keep
	r := &uploaderRig{t: t, dir: dir, store: store, events: make(chan UploadEvent, 64), done: make(chan struct{})}
	w, err := NewWatcher(WatchConfig{Dir: dir, Debounce: 30 * time.Millisecond, Logger: zerolog.Nop()})
	if err != nil {
		t.Fatal(err)
	}
	cfg.Store, cfg.Job, cfg.Dir, cfg.Keep, cfg.Logger = store, "job", dir, keep, zerolog.Nop()
	cfg.Host = func() Host { return Host{InstanceID: "i-test"} }
	cfg.OnEvent = func(ev UploadEvent) { r.events <- ev }
	r.up = NewUploader(cfg)
	ctx, cancel := context.WithCancel(context.Background())
	r.cancel = cancel
	files := make(chan WatchEvent)
	var wg sync.WaitGroup
	wg.Go(func() { w.Run(ctx, files) })
	wg.Go(func() { r.up.Run(ctx, files) })
	go func() { wg.Wait(); close(r.done) }()
	t.Cleanup(r.stop)
	return r
}

func (r *uploaderRig) stop() {
	r.cancel()
	<-r.done
}

// waitCommitted waits for the checkpoint to be committed and returns its event.
func (r *uploaderRig) waitCommitted(name string) UploadEvent {
	r.t.Helper()
	return r.waitEvent(CheckpointCommitted, name)
}

// waitEvent waits for an event of kind for the checkpoint and returns it.
func (r *uploaderRig) waitEvent(kind UploadEventKind, name string) UploadEvent {
	r.t.Helper()
	timeout := time.After(20 * time.Second)
	for {
		select {
		case ev := <-r.events:
			if ev.Kind == kind && ev.Checkpoint == name {
				return ev
			}
		case <-timeout:
			r.t.Fatalf("no event %d for checkpoint %s within 20 s", kind, name)
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
	for _, c := range r2.up.Status(t.Context()).Checkpoints {
		if !c.Committed {
			t.Errorf("checkpoint %s not committed after restart", c.Name)
		}
	}
	restoreAndCompare(t, store, "step-2", newer)
}

func TestUploaderRetention(t *testing.T) {
	dir := t.TempDir()
	store := newMemStore()
	r := startUploader(t, dir, store, 2)
	for _, name := range []string{"step-1", "step-2", "step-3", "step-4"} {
		writeCheckpoint(t, dir, name, map[string][]byte{"w": randomBytes(t, 64<<10)})
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
	r.up.Notice("spot/terminate", time.Now().Add(time.Minute))
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
	r.up.Notice("spot/terminate", time.Now().Add(time.Minute))
	writeCheckpoint(t, dir, "step-9", map[string][]byte{"w": randomBytes(t, 1<<20)})
	<-bs.started
	r.waitEvent(CheckpointComplete, "step-9")
	r.cancel()
	<-r.done // returns when the budget is spent; release never comes
	if cs, _, err := ListCommitted(t.Context(), mem, "job"); err != nil || len(cs) != 0 {
		t.Fatalf("ListCommitted = %v, %v; want nothing committed", cs, err)
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
	r.up.Notice("spot/terminate", time.Now().Add(time.Minute))
	writeCheckpoint(t, dir, "step-1", map[string][]byte{"w": randomBytes(t, 1<<10)})
	r.waitCommitted("step-1")
	r.cancel()
	select {
	case <-r.done:
	case <-time.After(5 * time.Second):
		t.Fatal("Run held the stop for an abandoned, incomplete checkpoint")
	}
}
