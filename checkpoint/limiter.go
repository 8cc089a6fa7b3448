package checkpoint

import (
	"context"
	"errors"
	"net"
	"net/url"
	"slices"
	"sort"
	"strings"
	"sync"
	"syscall"
	"time"

	"github.com/aws/aws-sdk-go-v2/aws"
	"github.com/aws/smithy-go"
	smithyhttp "github.com/aws/smithy-go/transport/http"
)

// How the S3 store's concurrency adapts. One connection to S3 carries about 80–90 MB/s, so a
// p5's NIC needs well over a hundred requests in flight; a server on the same host is itself the
// ceiling, and more requests there only queue. Neither can be known in advance, so the limit is
// found by measurement (as TCP finds its window):
//
//   - It starts at limiterStart (or the maximum, if lower), in slow start; at limiterHurry when
//     time matters more than sharing (a notice pending, a restore: hurry) and slow start has not
//     found the link shared yet. Each round of slow start waits for a part to complete: on real S3
//     a part of 64 MiB takes most of a second, and four rounds from 4 would take longer than
//     moving a checkpoint of a few GiB at the rate found.
//   - In slow start, while the requests take no longer per byte than limiterCongested × the
//     fastest seen (the link is not shared yet: S3, where each connection has its own limit),
//     every completion of a quarter of the limit doubles it. Once as many come back slower as a
//     quarter of the limit (and more than came back fast), the link is shared (a local server, a
//     full NIC): the limit goes back to the last one that was not, for limiterHold, and slow
//     start is over. So a 1 GiB checkpoint finds 64 requests in flight in a few part times
//     rather than a few windows.
//   - Free slots go in order (acquire): a newer checkpoint's parts first, then the file that
//     started first.
//   - Each window ends when as many parts have completed as the limit allows in flight (every
//     slot turned over once), and gives a throughput: bytes completed / the window's time.
//   - After a step up, a throughput at least limiterGain above the step's base keeps growing, at
//     most to the maximum (store.concurrency): ×2 after a step that gained limiterSteep or more
//     (the link still scales with the requests, as on S3 with its per-connection limit), else
//     ×1.5. A smaller gain means the link or the server is full: the limit goes back to the
//     base, and stays there for limiterHold before probing up again, so that it follows a link
//     that changes.
//   - A throttle (503 SlowDown) or a broken connection (reset, timeout) on any attempt, retried or
//     not, halves the limit at once, at most once per limiterBackoffGap, and holds it for
//     limiterHold.
//   - A window whose parts took more than limiterQueueing × the fastest seconds per byte seen is
//     queueing at the server (latency rising at no gain): the limit drops by a quarter.
const (
	limiterStart      = 4
	limiterHurry      = 32
	limiterMin        = 2
	limiterGain       = 1.10
	limiterSteep      = 1.60
	limiterHold       = 10 * time.Second
	limiterBackoffGap = 500 * time.Millisecond
	limiterQueueing   = 4.0
	limiterCongested  = 1.5
	limiterBestAging  = 1.02
)

// limiter bounds the S3 requests in flight (upload parts, single PutObjects, ranged GETs) with a
// limit that adapts between limiterMin and max; see above. Safe for concurrent use.
type limiter struct {
	max int
	now func() time.Time

	mu       sync.Mutex
	limit    int
	inflight int
	waiters  []*limitWaiter // by rank, order, then arrival; empty while inflight < limit

	win      window
	baseRate float64 // the throughput at base
	base     int     // the limit before the last step up; 0 when the last change was not one
	hold     time.Time
	backoff  time.Time // the last back-off
	bestSPB  float64   // the fewest seconds per byte a part has taken, aged each window
	slow     bool      // in slow start
	fast     int       // slow start: completions since the last change at most limiterCongested × bestSPB
	slowed   int       // slow start: completions since the last change slower than that

	stats LimiterStats
}

// window is the measurement in progress: since start (zero until its first request starts),
// parts requests completed, moving bytes in sec seconds summed over them.
type window struct {
	start time.Time
	bytes int64
	parts int
	sec   float64
}

// LimiterStats says how the S3 store's concurrency has adapted.
type LimiterStats struct {
	// Limit is the requests allowed in flight now, Max the most it may grow to.
	Limit int `json:"limit"`
	Max   int `json:"max"`
	// InFlight is the requests in flight now, PeakInFlight the most at any time.
	InFlight     int `json:"in_flight"`
	PeakInFlight int `json:"peak_in_flight"`
	// Raised counts steps up; Plateaus steps back after a step up that did not pay; Throttled
	// back-offs on 503 SlowDown or broken connections; Queueing drops on rising latency.
	Raised    uint64 `json:"raised"`
	Plateaus  uint64 `json:"plateaus"`
	Throttled uint64 `json:"throttled"`
	Queueing  uint64 `json:"queueing"`
}

// newLimiter returns a limiter that grows to most (at least 1) requests in flight.
func newLimiter(most int) *limiter {
	most = max(most, 1)
	return &limiter{max: most, limit: min(limiterStart, most), now: time.Now, slow: true}
}

// hurry raises the limit to limiterHurry (at most max) if it is lower and slow start has not
// found the link shared: a notice is pending or a restore is waiting, and one round of slow
// start costs a part time. A link found shared keeps the limit it found.
func (l *limiter) hurry() {
	l.mu.Lock()
	defer l.mu.Unlock()
	if !l.slow || l.limit >= limiterHurry || l.limit >= l.max {
		return
	}
	l.set(limiterHurry)
	l.fast, l.slowed = 0, 0
	l.win = window{start: l.now()}
	l.stats.Raised++
}

// limitWaiter is an acquire waiting for a slot: ch is closed when one is given to it.
type limitWaiter struct {
	rank, order uint64
	ch          chan struct{}
}

// before reports whether w is served before a waiter of rank and order.
func (w *limitWaiter) before(rank, order uint64) bool {
	return w.rank > rank || w.rank == rank && w.order <= order
}

// acquire takes a slot; it returns ctx's error if ctx is done first. Free slots go to the waiter
// of the highest rank, then of the lowest order, then the first come. The uploader ranks a file
// by its checkpoint (a newer one first: after a notice the newest is the one that matters) and
// the S3 store gives every file it moves the next order, so the parts of the file that started
// first get the slots before a later file's: files finish one after another rather than all at
// the end, and each one's completion (a multipart upload's CompleteMultipartUpload, a restored
// file's fsync) overlaps the others' transfers.
func (l *limiter) acquire(ctx context.Context, rank, order uint64) error {
	l.mu.Lock()
	if l.inflight < l.limit && len(l.waiters) == 0 {
		l.take()
		l.mu.Unlock()
		return nil
	}
	w := &limitWaiter{rank: rank, order: order, ch: make(chan struct{})}
	i := sort.Search(len(l.waiters), func(i int) bool { return !l.waiters[i].before(rank, order) })
	l.waiters = slices.Insert(l.waiters, i, w)
	l.mu.Unlock()
	select {
	case <-w.ch:
		return nil
	case <-ctx.Done():
		l.mu.Lock()
		defer l.mu.Unlock()
		select {
		case <-w.ch: // given a slot meanwhile: hand it on
			l.inflight--
			l.grant()
		default:
			l.waiters = slices.DeleteFunc(l.waiters, func(x *limitWaiter) bool { return x == w })
		}
		return ctx.Err()
	}
}

// take counts a request in flight.
func (l *limiter) take() {
	l.inflight++
	l.stats.PeakInFlight = max(l.stats.PeakInFlight, l.inflight)
	if l.win.start.IsZero() {
		l.win.start = l.now()
	}
}

// grant gives free slots to the waiters, first first.
func (l *limiter) grant() {
	for l.inflight < l.limit && len(l.waiters) > 0 {
		w := l.waiters[0]
		l.waiters[0] = nil
		l.waiters = l.waiters[1:]
		l.take()
		close(w.ch)
	}
}

// release gives a slot back. A request that moved n bytes in d and succeeded feeds the
// measurement; a failed one (n is then ignored) only frees its slot: its failure reached the
// limiter through observe already, as every attempt's does.
func (l *limiter) release(n int64, d time.Duration, ok bool) {
	l.mu.Lock()
	defer l.mu.Unlock()
	l.inflight--
	if ok && n > 0 {
		l.win.bytes += n
		l.win.parts++
		l.win.sec += d.Seconds()
		if spb := d.Seconds() / float64(n); d > 0 {
			if l.bestSPB == 0 || spb < l.bestSPB {
				l.bestSPB = spb
			}
			if l.slow {
				l.slowStart(spb)
			}
		}
		if l.win.parts >= l.limit {
			l.endWindow()
		}
	}
	l.grant()
}

// slowStart takes one completion's seconds per byte while in slow start.
func (l *limiter) slowStart(spb float64) {
	quarter := max(1, l.limit/4)
	if spb <= limiterCongested*l.bestSPB {
		l.fast++
	} else {
		l.slowed++
	}
	now := l.now()
	switch {
	case l.slowed >= max(2, quarter) && l.slowed > l.fast:
		// Shared: back to the limit before the last doubling, and on by windows from there.
		l.slow = false
		l.set(l.limit / 2)
		l.base, l.hold = 0, now.Add(limiterHold)
		l.stats.Plateaus++
	case l.fast >= quarter && l.fast > l.slowed && l.limit < l.max:
		l.set(l.limit * 2)
		l.fast, l.slowed = 0, 0
		l.stats.Raised++
	default:
		return
	}
	// The window in progress measured the old limit.
	l.win = window{start: now}
}

// endWindow judges the window that has just ended and starts the next.
func (l *limiter) endWindow() {
	now := l.now()
	w := l.win
	l.win = window{}
	rate := 0.0
	if elapsed := now.Sub(w.start).Seconds(); elapsed > 0 {
		rate = float64(w.bytes) / elapsed
	}
	spb := w.sec / float64(w.bytes)
	l.bestSPB *= limiterBestAging // so that a best from another time does not count for ever
	if rate == 0 || l.slow {
		return
	}
	switch {
	case l.bestSPB > 0 && spb > limiterQueueing*l.bestSPB && l.limit > limiterMin && (l.base == 0 || rate < l.baseRate*limiterGain):
		l.set(l.limit - max(1, l.limit/4))
		l.base, l.baseRate, l.hold = 0, rate, now.Add(limiterHold)
		l.stats.Queueing++
	case l.base > 0 && rate < l.baseRate*limiterGain:
		// The last step up did not pay: back to where it was, for a while.
		l.set(l.base)
		l.base, l.hold = 0, now.Add(limiterHold)
		l.stats.Plateaus++
	case l.limit < l.max && !now.Before(l.hold):
		step := max(1, l.limit/2)
		if l.base > 0 && rate >= l.baseRate*limiterSteep {
			step = l.limit
		}
		l.base, l.baseRate = l.limit, rate
		l.set(l.limit + step)
		l.stats.Raised++
	default:
		l.base, l.baseRate = 0, rate
	}
}

// observe takes the outcome of one attempt of a request (the SDK's retries included): a throttle
// or a broken connection halves the limit.
func (l *limiter) observe(err error) {
	if err == nil || !limiterBackOff(err) {
		return
	}
	l.mu.Lock()
	defer l.mu.Unlock()
	now := l.now()
	if !l.backoff.IsZero() && now.Sub(l.backoff) < limiterBackoffGap {
		return
	}
	l.backoff, l.hold = now, now.Add(limiterHold)
	l.set(max(limiterMin, l.limit/2))
	l.base, l.slow = 0, false
	l.win = window{}
	l.stats.Throttled++
}

// set changes the limit, kept within [limiterMin, max] (max alone when it is lower), and gives
// the waiters the slots it added.
func (l *limiter) set(limit int) {
	limit = min(max(limit, limiterMin), l.max)
	l.limit = limit
	l.grant()
}

// Stats returns how the limit has adapted.
func (l *limiter) Stats() LimiterStats {
	l.mu.Lock()
	defer l.mu.Unlock()
	st := l.stats
	st.Limit, st.Max, st.InFlight = l.limit, l.max, l.inflight
	return st
}

// limiterBackOff reports whether err says the server or the path is overloaded: an S3 throttle
// (SlowDown, 503, 429, RequestTimeout) or a connection reset, refused mid-run, or timed out. A
// cancelled context is not.
func limiterBackOff(err error) bool {
	if errors.Is(err, context.Canceled) || errors.Is(err, context.DeadlineExceeded) && !transportTimeout(err) {
		return false // the caller gave up; that says nothing about the link
	}
	var ae smithy.APIError
	if errors.As(err, &ae) {
		switch ae.ErrorCode() {
		case "SlowDown", "Throttling", "ThrottlingException", "RequestTimeout", "ServiceUnavailable", "TooManyRequests":
			return true
		}
	}
	var re *smithyhttp.ResponseError
	if errors.As(err, &re) {
		if c := re.HTTPStatusCode(); c == 503 || c == 429 {
			return true
		}
	}
	if errors.Is(err, syscall.ECONNRESET) || errors.Is(err, syscall.EPIPE) {
		return true
	}
	var ne net.Error
	if errors.As(err, &ne) && ne.Timeout() {
		return true
	}
	return strings.Contains(err.Error(), "connection reset")
}

// transportTimeout reports whether err is the HTTP transport's own timeout (no answer within
// ResponseHeaderTimeout, a dial that timed out), which errors.Is takes for
// context.DeadlineExceeded too, rather than the caller's deadline.
func transportTimeout(err error) bool {
	for e := err; e != nil; e = errors.Unwrap(e) {
		if e == context.DeadlineExceeded {
			return false
		}
		if _, ok := e.(*url.Error); ok {
			continue // its Timeout is its inner error's
		}
		if t, ok := e.(interface{ Timeout() bool }); ok && t.Timeout() {
			return true
		}
	}
	return false
}

// observingRetryer is the SDK's retryer, told of every failed attempt first: the SDK asks
// IsErrorRetryable of each one, retried or not.
type observingRetryer struct {
	aws.RetryerV2
	observe func(error)
}

func (r observingRetryer) IsErrorRetryable(err error) bool {
	r.observe(err)
	return r.RetryerV2.IsErrorRetryable(err)
}
