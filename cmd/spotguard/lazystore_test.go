package main

import (
	"context"
	"errors"
	"path/filepath"
	"sync/atomic"
	"testing"
	"time"

	"github.com/spotguard/spotguard/checkpoint"
)

// hurriedFileStore is a file store that counts Hurry calls.
type hurriedFileStore struct {
	*checkpoint.FileStore
	hurries  atomic.Int32
	onFailed atomic.Pointer[func(error)]
}

func (s *hurriedFileStore) Hurry() { s.hurries.Add(1) }

func (s *hurriedFileStore) OnAttemptError(f func(error)) { s.onFailed.Store(&f) }

// A lazyStore's calls wait for the store, or for their ctx; a Hurry before the store is open
// reaches it once it is; a store that could not be opened answers every call with why.
func TestLazyStore(t *testing.T) {
	fs, err := checkpoint.NewFileStore(filepath.Join(t.TempDir(), "store"))
	if err != nil {
		t.Fatal(err)
	}
	inner := &hurriedFileStore{FileStore: fs}
	release := make(chan struct{})
	l := openLazy("s3://b/p", func() (checkpoint.Store, error) { <-release; return inner, nil })
	if l.URL() != "s3://b/p" {
		t.Errorf("URL() = %q before the store is open; want the URL", l.URL())
	}
	l.Hurry() // a notice before the store is open
	var told atomic.Int32
	l.OnAttemptError(func(error) { told.Add(1) }) // the agent's, before the store is open
	ctx, cancel := context.WithTimeout(t.Context(), 50*time.Millisecond)
	defer cancel()
	if _, _, err := l.GetBytes(ctx, "j/LATEST"); !errors.Is(err, context.DeadlineExceeded) {
		t.Errorf("GetBytes before the store is open = %v; want ctx's error", err)
	}
	if got := l.Concurrency(); got != (checkpoint.LimiterStats{}) {
		t.Errorf("Concurrency() before the store is open = %+v; want zero", got)
	}
	close(release)
	if _, err := l.PutBytes(t.Context(), "j/LATEST", []byte("x"), checkpoint.Cond{}); err != nil {
		t.Fatalf("PutBytes once open: %v", err)
	}
	if got, _, err := l.GetBytes(t.Context(), "j/LATEST"); err != nil || string(got) != "x" {
		t.Errorf("GetBytes once open = %q, %v; want x", got, err)
	}
	if n := inner.hurries.Load(); n != 1 {
		t.Errorf("Hurry reached the store %d times; want 1", n)
	}
	if f := inner.onFailed.Load(); f == nil {
		t.Error("OnAttemptError given before the store opened did not reach it")
	} else if (*f)(errors.New("timeout")); told.Load() != 1 {
		t.Error("the store's failed attempt did not reach the function given")
	}
	l.Hurry()
	if n := inner.hurries.Load(); n != 2 {
		t.Errorf("Hurry after the store opened reached it %d times in all; want 2", n)
	}

	why := errors.New("no AWS region")
	bad := openLazy("s3://b/p", func() (checkpoint.Store, error) { return nil, why })
	bad.Hurry()
	if _, err := bad.List(t.Context(), "j/"); !errors.Is(err, why) {
		t.Errorf("List on a store that could not be opened = %v; want %v", err, why)
	}
}
