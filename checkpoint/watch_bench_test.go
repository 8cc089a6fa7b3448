//go:build linux

package checkpoint

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"strconv"
	"testing"
	"time"

	"github.com/rs/zerolog"
)

// BenchmarkWatcherManyFiles writes n files of 1 KiB into one checkpoint directory while a
// Watcher with the default debounce watches, then the marker, and measures until its Complete
// arrives (invariant I8: the cost per file must not grow with the number of files). It reports
// files/s over the whole run, the time spent writing, the time from the marker to Complete and
// how often fsnotify's queue overflowed (each overflow is a full rescan). Run it once per size,
// on a tmpfs so that the writes do not hide the watcher's cost:
//
//	TMPDIR=/dev/shm go test -run '^$' -bench WatcherManyFiles -benchtime 1x ./checkpoint/
func BenchmarkWatcherManyFiles(b *testing.B) {
	for _, n := range []int{1000, 10000, 100000} {
		b.Run(strconv.Itoa(n), func(b *testing.B) {
			data := make([]byte, 1024)
			for i := range data {
				data[i] = byte(i)
			}
			for range b.N {
				b.StopTimer()
				dir := b.TempDir()
				ready := make(chan struct{})
				logs := &scanLogs{}
				log := zerolog.New(logs).Level(zerolog.WarnLevel)
				w, err := NewWatcher(WatchConfig{Dir: dir, Logger: log, Ready: func() { close(ready) }})
				if err != nil {
					b.Fatal(err)
				}
				ctx, cancel := context.WithCancel(context.Background())
				out := make(chan WatchEvent, 1024)
				runDone := make(chan error, 1)
				go func() { runDone <- w.Run(ctx, out) }()
				// The consumer reads every event, as the uploader does.
				type result struct {
					files    int
					complete time.Time
				}
				got := make(chan result, 1)
				go func() {
					seen := map[string]bool{}
					for {
						select {
						case ev := <-out:
							if ev.Kind == FileReady {
								seen[ev.Path] = true
							}
							if ev.Kind == Complete {
								got <- result{len(seen), time.Now()}
								return
							}
						case <-ctx.Done():
							got <- result{len(seen), time.Time{}}
							return
						}
					}
				}()
				select {
				case <-ready:
				case err := <-runDone:
					b.Fatalf("Run() = %v before it was ready", err)
				}
				ck := filepath.Join(dir, "step-1")
				if err := os.Mkdir(ck, 0o755); err != nil {
					b.Fatal(err)
				}
				b.StartTimer()
				start := time.Now()
				for i := range n {
					if err := os.WriteFile(filepath.Join(ck, fmt.Sprintf("shard-%06d.bin", i)), data, 0o644); err != nil {
						b.Fatal(err)
					}
				}
				marker := time.Now()
				if err := os.WriteFile(filepath.Join(ck, "_COMPLETE"), nil, 0o644); err != nil {
					b.Fatal(err)
				}
				var res result
				select {
				case res = <-got:
				case <-time.After(10 * time.Minute):
					b.Fatalf("no Complete after 10 minutes")
				}
				b.StopTimer()
				cancel()
				if err := <-runDone; err != nil {
					b.Errorf("Run() = %v", err)
				}
				if res.complete.IsZero() || res.files != n {
					b.Fatalf("Complete after FileReady for %d files; want %d", res.files, n)
				}
				elapsed := res.complete.Sub(start)
				b.ReportMetric(float64(n)/elapsed.Seconds(), "files/s")
				b.ReportMetric(float64(res.complete.Sub(marker).Milliseconds()), "marker-to-complete-ms")
				b.ReportMetric(float64(marker.Sub(start).Milliseconds()), "write-ms")
				b.ReportMetric(float64(len(logs.lines(b, "warn", "fsnotify events were lost; rescanning the checkpoint directory"))), "overflows")
			}
		})
	}
}
