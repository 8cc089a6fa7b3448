package checkpoint

import (
	"context"
	"errors"
	"fmt"
	"os"
	"strings"
	"testing"
	"time"

	"github.com/rs/zerolog"
)

// LockDir holds a directory for one open of it: another is refused, naming the holder's PID (this
// process's, from /proc/locks), until the first lets go.
func TestLockDirRefusesASecondHolder(t *testing.T) {
	dir := t.TempDir()
	release, err := LockDir(dir)
	if err != nil {
		t.Fatal(err)
	}
	_, err = LockDir(dir)
	if !errors.Is(err, ErrDirInUse) || !strings.Contains(err.Error(), fmt.Sprintf("(PID %d)", os.Getpid())) {
		t.Fatalf("LockDir while held = %v; want ErrDirInUse naming PID %d", err, os.Getpid())
	}
	release()
	again, err := LockDir(dir)
	if err != nil {
		t.Fatalf("LockDir once released = %v; want the lock", err)
	}
	again()
}

// A Watcher with Lock holds its directory while it runs: another with Lock returns ErrDirInUse at
// once. Once the first stops, the directory can be taken again.
func TestWatcherLockHoldsTheDirectory(t *testing.T) {
	dir := t.TempDir()
	ready := make(chan struct{})
	first, err := NewWatcher(WatchConfig{Dir: dir, Logger: zerolog.Nop(), Lock: true, Ready: func() { close(ready) }})
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(t.Context())
	done := make(chan error, 1)
	go func() { done <- first.Run(ctx, make(chan WatchEvent, 16)) }()
	select {
	case <-ready:
	case err := <-done:
		t.Fatalf("first watcher: %v", err)
	case <-time.After(10 * time.Second):
		t.Fatal("first watcher not ready within 10 s")
	}
	second, err := NewWatcher(WatchConfig{Dir: dir, Logger: zerolog.Nop(), Lock: true})
	if err != nil {
		t.Fatal(err)
	}
	if err := second.Run(t.Context(), make(chan WatchEvent, 16)); !errors.Is(err, ErrDirInUse) {
		t.Errorf("a second locking watcher: Run = %v; want ErrDirInUse", err)
	}
	cancel()
	if err := <-done; err != nil {
		t.Errorf("first watcher: %v", err)
	}
	release, err := LockDir(dir)
	if err != nil {
		t.Fatalf("LockDir once the watcher stopped = %v; want the lock", err)
	}
	release()
}
