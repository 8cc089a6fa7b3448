package main

import (
	"context"
	"io"
	"os"
	"sync"

	"github.com/spotguard/spotguard/checkpoint"
)

// lazyStore is a store whose opening (for S3: asking which region the bucket is in, up to 10 s
// when S3 does not answer) goes on in the background, so that `spotguard run` polls IMDS and can
// signal the trainer from its first second. Every call waits for the store (or for its ctx); a
// store that could not be opened answers every call with why.
type lazyStore struct {
	url   string
	ready chan struct{} // closed once store or err is set
	store checkpoint.Store
	err   error

	mu       sync.Mutex
	hurrying bool        // Hurry came before the store
	onFailed func(error) // OnAttemptError came before the store
}

var _ checkpoint.Store = (*lazyStore)(nil)

// openLazy returns a lazyStore for url that open opens on a goroutine of its own.
func openLazy(url string, open func() (checkpoint.Store, error)) *lazyStore {
	l := &lazyStore{url: url, ready: make(chan struct{})}
	go func() {
		s, err := open()
		l.mu.Lock()
		l.store, l.err = s, err
		close(l.ready)
		hurry, onFailed := l.hurrying, l.onFailed
		l.mu.Unlock()
		if h, ok := s.(interface{ Hurry() }); ok && hurry && err == nil {
			h.Hurry()
		}
		if o, ok := s.(attemptObserver); ok && onFailed != nil && err == nil {
			o.OnAttemptError(onFailed)
		}
	}()
	return l
}

// get waits for the store; it returns ctx's error if ctx ends first.
func (l *lazyStore) get(ctx context.Context) (checkpoint.Store, error) {
	select {
	case <-l.ready:
		return l.store, l.err
	case <-ctx.Done():
		return nil, ctx.Err()
	}
}

// opened returns the store if it is open, without waiting.
func (l *lazyStore) opened() checkpoint.Store {
	select {
	case <-l.ready:
		return l.store
	default:
		return nil
	}
}

func (l *lazyStore) URL() string { return l.url }

func (l *lazyStore) PutFile(ctx context.Context, key string, f *os.File, size int64, progress func(n int64)) (checkpoint.Checksum, error) {
	s, err := l.get(ctx)
	if err != nil {
		return checkpoint.Checksum{}, err
	}
	return s.PutFile(ctx, key, f, size, progress)
}

func (l *lazyStore) PutBytes(ctx context.Context, key string, data []byte, cond checkpoint.Cond) (string, error) {
	s, err := l.get(ctx)
	if err != nil {
		return "", err
	}
	return s.PutBytes(ctx, key, data, cond)
}

func (l *lazyStore) GetBytes(ctx context.Context, key string) ([]byte, string, error) {
	s, err := l.get(ctx)
	if err != nil {
		return nil, "", err
	}
	return s.GetBytes(ctx, key)
}

func (l *lazyStore) Download(ctx context.Context, key string, w io.WriterAt, size int64) error {
	s, err := l.get(ctx)
	if err != nil {
		return err
	}
	return s.Download(ctx, key, w, size)
}

func (l *lazyStore) List(ctx context.Context, prefix string) ([]checkpoint.ObjectInfo, error) {
	s, err := l.get(ctx)
	if err != nil {
		return nil, err
	}
	return s.List(ctx, prefix)
}

func (l *lazyStore) ListDir(ctx context.Context, prefix string) ([]string, []checkpoint.ObjectInfo, error) {
	s, err := l.get(ctx)
	if err != nil {
		return nil, nil, err
	}
	return s.ListDir(ctx, prefix)
}

func (l *lazyStore) Delete(ctx context.Context, keys ...string) error {
	s, err := l.get(ctx)
	if err != nil {
		return err
	}
	return s.Delete(ctx, keys...)
}

func (l *lazyStore) AbortIncomplete(ctx context.Context, prefix string) (int, error) {
	s, err := l.get(ctx)
	if err != nil {
		return 0, err
	}
	return s.AbortIncomplete(ctx, prefix)
}

// Hurry passes a notice's urgency on to the store, at once or as soon as it is open.
func (l *lazyStore) Hurry() {
	l.mu.Lock()
	select {
	case <-l.ready:
	default:
		l.hurrying = true
		l.mu.Unlock()
		return
	}
	l.mu.Unlock()
	if h, ok := l.store.(interface{ Hurry() }); ok {
		h.Hurry()
	}
}

// Concurrency is the store's limiter's state; zero until it is open.
func (l *lazyStore) Concurrency() checkpoint.LimiterStats {
	if s, ok := l.opened().(interface {
		Concurrency() checkpoint.LimiterStats
	}); ok {
		return s.Concurrency()
	}
	return checkpoint.LimiterStats{}
}

// attemptObserver is a store that tells of every failed attempt (checkpoint.S3Store).
type attemptObserver interface{ OnAttemptError(func(error)) }

// OnAttemptError passes f on to the store, at once or as soon as it is open.
func (l *lazyStore) OnAttemptError(f func(error)) {
	l.mu.Lock()
	select {
	case <-l.ready:
	default:
		l.onFailed = f
		l.mu.Unlock()
		return
	}
	l.mu.Unlock()
	if o, ok := l.store.(attemptObserver); ok {
		o.OnAttemptError(f)
	}
}

// StartGrowing begins a transfer of a file being written, if the store is open and can
// (checkpoint.GrowingStore); nil otherwise: the file is then sent once it is closed.
func (l *lazyStore) StartGrowing(ctx context.Context, key string, f *os.File) checkpoint.Growing {
	if gs, ok := l.opened().(checkpoint.GrowingStore); ok {
		return gs.StartGrowing(ctx, key, f)
	}
	return nil
}
