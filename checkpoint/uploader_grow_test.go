package checkpoint

import (
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"
)

// TestUploaderSendsFilesWhileTheyAreWritten: during a notice, the files of a checkpoint written
// in place (as torch DCP's ranks and torch.save to the final name write them) are sent to S3
// while they grow, so little is left when the marker comes. A part the trainer rewrote after
// it was sent is sent again, and a file deleted while it grew is left out, its upload aborted:
// the commit holds exactly what the trainer left, and no upload is left behind.
func TestUploaderSendsFilesWhileTheyAreWritten(t *testing.T) {
	peer, proxy, store, r, ck, files := startGrowingRig(t, "grow", UploaderConfig{}, "a.bin", "b.bin", "c.bin")
	// grow appends n MiB to the file, a MiB a write.
	grow := func(name string, n int) {
		f := files[name]
		for range n {
			f.write(t, int64(len(f.data)), randomBytes(t, 1<<20))
		}
	}
	t0 := time.Now()
	grow("a.bin", 9)
	grow("c.bin", 9)
	eventuallyUploader(t, "a part of a.bin and of c.bin sent while they are written", func() bool { return partsSeen(proxy) >= 2 })
	files["a.bin"].write(t, 1<<20, []byte("rewritten after its part was sent"))
	if err := os.Remove(filepath.Join(ck, "c.bin")); err != nil {
		t.Fatal(err)
	}
	delete(files, "c.bin")
	grow("a.bin", 7)
	grow("b.bin", 12)
	eventuallyUploader(t, "parts of b.bin sent while it is written", func() bool { return partsSeen(proxy) >= 4 })
	want := map[string][]byte{}
	for name, f := range files {
		if err := f.w.Close(); err != nil {
			t.Fatal(err)
		}
		want[name] = f.data
	}
	early := partsSeen(proxy)
	if err := os.WriteFile(filepath.Join(ck, "_COMPLETE"), nil, 0o644); err != nil {
		t.Fatal(err)
	}
	ev := r.waitCommitted("step-1")
	// The throughput counts the time the files were sent while written, not only what was left
	// at their close: the writer paced them (28 MiB over the test's writes and waits).
	if limit := 2 * float64(28<<20) / time.Since(t0).Seconds(); ev.Throughput > limit {
		t.Errorf("throughput = %.0f B/s; want at most %.0f (twice 28 MiB over the time since the first write)", ev.Throughput, limit)
	}
	restoreAndCompare(t, store, "step-1", want)
	eventuallyUploader(t, "no incomplete upload left", func() bool { return len(peer.incompleteUploads(t, "")) == 0 })
	// a.bin: 3 parts while written, part 1 again, its last MiB; b.bin: 2 while written, its
	// last 2 MiB; c.bin: 1 while written. So 6 parts before the marker (the test waited for 4),
	// 3 after it.
	if early < 4 {
		t.Errorf("parts sent before the marker = %d; want 4 or more", early)
	}
	if got := partsSeen(proxy); got != 9 {
		t.Errorf("parts sent in all = %d; want 9", got)
	}
	// Kept: a.bin's parts 2 and 3 and b.bin's 2, those of them sent before the close (at least
	// the 2 the test waited for); a.bin's part 1 was sent again, c.bin is gone.
	if kept := ev.SentWhileWritten; kept < 10<<20 || kept > 20<<20 || kept%(5<<20) != 0 {
		t.Errorf("bytes sent while written = %d; want 10, 15 or 20 MiB", kept)
	}
	for _, line := range strings.Split(strings.TrimSpace(r.logs.String()), "\n") {
		if !strings.Contains(line, "notice: uploading with every connection") {
			t.Errorf("warning or error logged: %s", line)
		}
	}
}

// TestUploaderGrowingCheckpointRemoved: a checkpoint moved away while its files are sent as they
// are written leaves nothing in the store: no upload, no object.
func TestUploaderGrowingCheckpointRemoved(t *testing.T) {
	// StopBudget -1: the stop at the end does not wait for a checkpoint that will never come.
	peer, proxy, store, _, ck, files := startGrowingRig(t, "removed", UploaderConfig{StopBudget: -1}, "a.bin")
	gf := files["a.bin"]
	for range 12 {
		gf.write(t, int64(len(gf.data)), randomBytes(t, 1<<20))
	}
	eventuallyUploader(t, "parts sent while a.bin is written", func() bool { return partsSeen(proxy) >= 2 })
	// Moved away whole (a rotation's mv, or rm -r on another file system's view): one Removed,
	// no FileGone for the file.
	if err := os.Rename(ck, filepath.Join(t.TempDir(), "step-1")); err != nil {
		t.Fatal(err)
	}
	eventuallyUploader(t, "the upload aborted", func() bool { return len(peer.incompleteUploads(t, "")) == 0 })
	objs, err := store.List(t.Context(), "")
	if err != nil {
		t.Fatal(err)
	}
	if len(objs) != 0 {
		t.Errorf("objects left = %v; want none", objs)
	}
}

// startGrowingRig runs an uploader with cfg into an S3 store under prefix (5 MiB parts), behind
// a proxy that counts its requests, with a notice in force and a watcher that looks at every
// write and never finds a file ready before the marker, however slow the machine. It creates the
// checkpoint directory step-1 and the named files in it, empty and open for writing.
func startGrowingRig(t *testing.T, prefix string, cfg UploaderConfig, names ...string) (*s3Peer, *s3FaultProxy, *S3Store, *uploaderRig, string, map[string]*growingTestFile) {
	t.Helper()
	peer := s3StartPeer(t)
	proxy := s3StartProxy(t, peer.endpoint)
	store := peer.openS3(t, proxy.URL(), prefix, S3Options{PartSize: 5 << 20, Concurrency: 8})
	dir := t.TempDir()
	r := startUploaderTweaked(t, dir, store, cfg, func(w *Watcher) {
		w.growEvery = 0
		w.debounce = time.Minute
	})
	r.up.SetNotices([]ActiveNotice{{Key: "spot/terminate", Deadline: time.Now().Add(2 * time.Minute), SignalledAt: time.Now()}})
	ck := filepath.Join(dir, "step-1")
	if err := os.Mkdir(ck, 0o755); err != nil {
		t.Fatal(err)
	}
	files := map[string]*growingTestFile{}
	for _, name := range names {
		f, err := os.Create(filepath.Join(ck, name))
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { f.Close() })
		files[name] = &growingTestFile{w: f}
	}
	return peer, proxy, store, r, ck, files
}
