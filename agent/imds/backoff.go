package imds

import (
	"context"
	"math/rand/v2"
	"time"
)

// initialBackoff is the first wait after an error.
const initialBackoff = 100 * time.Millisecond

// backoff is an exponential backoff with "equal jitter": the n-th wait is drawn uniformly
// from [d/2, d], where d starts at min(initialBackoff, max) and doubles up to max.
// The zero value is not usable; set max. It is owned by one goroutine.
type backoff struct {
	max time.Duration // cap on d; at least 1ns
	cur time.Duration // current d; 0 before the first error of a streak
}

// next returns the wait before the next attempt and grows the backoff.
func (b *backoff) next() time.Duration {
	if b.cur == 0 {
		b.cur = min(initialBackoff, b.max)
	} else {
		b.cur = min(2*b.cur, b.max)
	}
	half := b.cur / 2
	return b.cur - half + rand.N(half+1)
}

// reset starts the next streak from the initial backoff.
func (b *backoff) reset() { b.cur = 0 }

// wait blocks for d, until cut is closed (nil: never), or until ctx is done. It reports
// whether ctx is still live: true means go on, false means stop.
func wait(ctx context.Context, d time.Duration, cut <-chan struct{}) bool {
	if d <= 0 {
		return ctx.Err() == nil
	}
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case <-t.C:
	case <-cut:
	case <-ctx.Done():
	}
	return ctx.Err() == nil
}
