package checkpoint

import (
	"context"
	"errors"
	"os"
	"path"
	"path/filepath"
	"testing"
	"time"
)

// startOrderStore is a blockingStore whose ListDir refuses to list the commits of refuse.
type startOrderStore struct {
	blockingStore
	refuse string
}

func (s *startOrderStore) ListDir(ctx context.Context, prefix string) ([]string, []ObjectInfo, error) {
	if s.refuse != "" && prefix == "job/"+s.refuse+"/" {
		return nil, nil, errors.New("AccessDenied: not allowed to list")
	}
	return s.Store.ListDir(ctx, prefix)
}

// Checkpoints found at start (a restarted agent, a new instance with the trainer's disk) are
// taken newest first by when they completed, not by name: trainers number their saves without
// padding (Hugging Face's checkpoint-500, checkpoint-1000), and the name that sorts last is then
// an older save. With a notice the newest is the one that matters; without one, it is the one
// that must not wait behind the older saves (found from outside: an older save went first).
func TestUploaderStartsWithTheNewestCheckpointNotTheLastName(t *testing.T) {
	for _, tt := range []struct {
		name   string
		urgent bool
		// refuse: the store refuses to list this checkpoint's commits (its lookup fails).
		refuse string
		first  string
	}{
		{name: "background", first: "checkpoint-750"},
		{name: "notice", urgent: true, first: "checkpoint-750"},
		// A newer checkpoint whose lookup failed is not waited for: the newest of the others goes.
		{name: "newest lookup refused", refuse: "checkpoint-750", first: "checkpoint-1000"},
	} {
		t.Run(tt.name, func(t *testing.T) {
			dir := t.TempDir()
			writeCheckpoint(t, dir, "checkpoint-500", map[string][]byte{"w": randomBytes(t, 1<<10)})
			laterTick(t, dir, "checkpoint-500")
			writeCheckpoint(t, dir, "checkpoint-1000", map[string][]byte{"w": randomBytes(t, 1<<10)})
			laterTick(t, dir, "checkpoint-1000")
			writeCheckpoint(t, dir, "checkpoint-750", map[string][]byte{"w": randomBytes(t, 1<<10)})
			// checkpoint-750 completed last: a rollback saved it after checkpoint-1000.
			s := &startOrderStore{blockingStore{Store: newMemStore(), started: make(chan string, 16), release: make(chan struct{})}, tt.refuse}
			cfg := UploaderConfig{BackgroundFiles: 1, UrgentFiles: 1}
			r := newUploaderRig(t, dir, s, cfg)
			if tt.urgent {
				r.up.SetNotices([]ActiveNotice{{Key: "spot/terminate", Deadline: time.Now().Add(2 * time.Minute), SignalledAt: time.Now()}})
			}
			w, err := NewWatcher(WatchConfig{Dir: dir, Debounce: 30 * time.Millisecond})
			if err != nil {
				t.Fatal(err)
			}
			r.run(w)

			select {
			case key := <-s.started:
				if got := path.Base(path.Dir(path.Dir(key))); got != tt.first { // job/<checkpoint>/<commit>/<file>
					t.Errorf("the first file sent was checkpoint %s's; want %s's", got, tt.first)
				}
			case <-time.After(20 * time.Second):
				t.Fatal("no file was sent within 20 s")
			}
			close(s.release)
			committed := map[string]bool{}
			timeout := time.After(20 * time.Second)
			for len(committed) < 3 {
				select {
				case ev := <-r.events:
					if ev.Kind == CheckpointCommitted {
						committed[ev.Checkpoint] = true
					}
				case <-timeout:
					t.Fatalf("committed within 20 s: %v; want all three", committed)
				}
			}
		})
	}
}

// A full read of the directory sends the checkpoints it finds oldest first by their latest
// change time, whatever their names, and every event of it but the last says More.
func TestWatchReadSendsOldestFirstWithMore(t *testing.T) {
	dir := t.TempDir()
	scanWrite(t, filepath.Join(dir, "checkpoint-500", "w"), "5")
	scanWrite(t, filepath.Join(dir, "checkpoint-500", "_COMPLETE"), "")
	laterTick(t, dir, "checkpoint-500")
	scanWrite(t, filepath.Join(dir, "checkpoint-1000", "w"), "10")
	scanWrite(t, filepath.Join(dir, "checkpoint-1000", "_COMPLETE"), "")
	laterTick(t, dir, "checkpoint-1000")
	scanWrite(t, filepath.Join(dir, "checkpoint-750", "w"), "75")
	scanWrite(t, filepath.Join(dir, "checkpoint-750", "_COMPLETE"), "")
	w, err := NewWatcher(WatchConfig{Dir: dir, Debounce: time.Nanosecond})
	if err != nil {
		t.Fatal(err)
	}
	r := testWatchRun(t, w, dir)
	r.queue = []WatchEvent{{Kind: FileReady, Checkpoint: "before", Path: "x"}} // not the read's
	if err := r.rescan(); err != nil {
		t.Fatalf("rescan() error: %v", err)
	}
	want := "[FileReady before x 0, FileReady checkpoint-500 w 1, Complete checkpoint-500 _COMPLETE 0, " +
		"FileReady checkpoint-1000 w 2, Complete checkpoint-1000 _COMPLETE 0, " +
		"FileReady checkpoint-750 w 2, Complete checkpoint-750 _COMPLETE 0]"
	if got := watchFormat(r.queue); got != want {
		t.Errorf("read = %s; want %s", got, want)
	}
	for i, ev := range r.queue {
		if want := i > 0 && i < len(r.queue)-1; ev.More != want {
			t.Errorf("event %d (%s %s %s) More = %v; want %v", i, ev.Kind, ev.Checkpoint, ev.Path, ev.More, want)
		}
	}
}

// A full read of the directory whose last event never comes (its watcher stopped half way, and
// the next cannot read the directory) does not hold the uploads for good: the uploader goes on
// batchWaitMax after the read's last event seen.
func TestUploaderGoesOnWhenAReadStopsHalfWay(t *testing.T) {
	dir := t.TempDir()
	writeCheckpoint(t, dir, "step-1", map[string][]byte{"w": randomBytes(t, 1<<10)})
	r, events := startUploaderFed(t, dir, newMemStore(), UploaderConfig{})
	for _, rel := range []string{"w", "_COMPLETE"} {
		fi, err := os.Lstat(filepath.Join(dir, "step-1", rel))
		if err != nil {
			t.Fatal(err)
		}
		ev := WatchEvent{Kind: FileReady, Checkpoint: "step-1", Path: rel, Size: fi.Size(), ModTime: fi.ModTime(), ID: FileIDOf(fi), At: time.Now(), More: true}
		if rel == "_COMPLETE" {
			ev.Kind = Complete
		}
		events <- ev
	}
	r.waitCommitted("step-1")
}
