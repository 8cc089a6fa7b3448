//go:build linux

package checkpoint

import (
	"errors"
	"os"
	"path/filepath"
	"slices"
	"testing"
	"time"

	"github.com/rs/zerolog"
)

// The checkpoint directory itself deleted (rm -r, or rmdir of an empty one), even while the
// watcher holds it open and no inotify IN_DELETE_SELF comes: every checkpoint it held is Removed
// and Run returns ErrDirGone, as for a move, so the agent waits for the directory and watches it
// (and rescans it) again. So is a directory deleted and made again before the watcher looked.
func TestWatchDirDeletedEndsRun(t *testing.T) {
	tests := []struct {
		name string
		// ckpts are made before Run; want their Removed.
		ckpts []string
		del   func(t *testing.T, dir string)
	}{
		{"rm -r", []string{"step-1", "step-2"}, func(t *testing.T, dir string) {
			if err := os.RemoveAll(dir); err != nil {
				t.Fatal(err)
			}
		}},
		{"rmdir of an empty dir", nil, func(t *testing.T, dir string) {
			if err := os.Remove(dir); err != nil {
				t.Fatal(err)
			}
		}},
		{"rm -r then mkdir", []string{"step-1"}, func(t *testing.T, dir string) {
			if err := os.RemoveAll(dir); err != nil {
				t.Fatal(err)
			}
			if err := os.Mkdir(dir, 0o755); err != nil {
				t.Fatal(err)
			}
		}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			dir := filepath.Join(t.TempDir(), "ck")
			if err := os.Mkdir(dir, 0o755); err != nil {
				t.Fatal(err)
			}
			for _, c := range tt.ckpts {
				scanWrite(t, filepath.Join(dir, c, "a.bin"), "a")
				scanWrite(t, filepath.Join(dir, c, "_COMPLETE"), "")
			}
			watchAge(t, dir, time.Hour)
			logs := &scanLogs{}
			ready := make(chan struct{})
			w, err := NewWatcher(WatchConfig{Dir: dir, Debounce: 20 * time.Millisecond, Logger: zerolog.New(logs),
				Ready: func() { close(ready) }})
			if err != nil {
				t.Fatal(err)
			}
			w.pollEvery = 20 * time.Millisecond
			out := make(chan WatchEvent, 64)
			done := make(chan error, 1)
			go func() { done <- w.Run(t.Context(), out) }()
			select {
			case <-ready:
			case err := <-done:
				t.Fatalf("Run() = %v before it was ready", err)
			}
			tt.del(t, dir)
			select {
			case err := <-done:
				if !errors.Is(err, ErrDirGone) {
					t.Fatalf("Run() = %v; want ErrDirGone", err)
				}
			case <-time.After(watchWait):
				t.Fatalf("Run did not return %v after its directory was deleted\nlog:\n%s", watchWait, logs)
			}
			var removed []string
			for len(out) > 0 {
				if ev := <-out; ev.Kind == Removed {
					removed = append(removed, ev.Checkpoint)
				}
			}
			slices.Sort(removed) // rm -r removes in the directory's order
			if !slices.Equal(removed, tt.ckpts) {
				t.Errorf("Removed events %v; want %v", removed, tt.ckpts)
			}
			if n := len(logs.lines(t, "error", "checkpoint directory was removed or moved")); n != 1 {
				t.Errorf("error lines %q = %d; want 1\nlog:\n%s", "checkpoint directory was removed or moved", n, logs)
			}
		})
	}
}
