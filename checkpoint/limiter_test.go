package checkpoint

import (
	"context"
	"errors"
	"fmt"
	"net"
	"slices"
	"sync"
	"sync/atomic"
	"syscall"
	"testing"
	"testing/synctest"
	"time"

	"net/http"

	"github.com/aws/smithy-go"
	smithyhttp "github.com/aws/smithy-go/transport/http"
)

// link is a model of the path to a store, for the limiter: how long a request of n bytes takes
// when inflight requests (this one included) share it, and whether it is throttled.
type link struct {
	perConn  float64 // bytes/s one connection can carry (0: no per-connection cap)
	total    float64 // bytes/s the whole path can carry
	throttle int     // requests in flight above which the server answers 503 (0: never)
}

func (l link) duration(n int64, inflight int) time.Duration {
	rate := l.total / float64(inflight)
	if l.perConn > 0 && l.perConn < rate {
		rate = l.perConn
	}
	return time.Duration(float64(n) / rate * float64(time.Second))
}

// drive runs workers that keep requests of part bytes going through lim over l for d of fake time
// and returns the bytes moved in the last half (after the limiter has had time to settle).
func drive(t *testing.T, lim *limiter, l link, workers int, part int64, d time.Duration) (moved float64, rate float64) {
	t.Helper()
	ctx, cancel := context.WithTimeout(t.Context(), d)
	defer cancel()
	var inflight atomic.Int64
	var late atomic.Int64
	half := time.Now().Add(d / 2)
	var wg sync.WaitGroup
	for range workers {
		wg.Go(func() {
			for ctx.Err() == nil {
				if lim.acquire(ctx, 0, 0) != nil {
					return
				}
				n := int(inflight.Add(1))
				start := time.Now()
				if l.throttle > 0 && n > l.throttle {
					lim.observe(&smithy.GenericAPIError{Code: "SlowDown", Message: "Please reduce your request rate."})
					inflight.Add(-1)
					lim.release(0, time.Since(start), false)
					continue
				}
				select {
				case <-time.After(l.duration(part, n)):
				case <-ctx.Done():
					inflight.Add(-1)
					lim.release(0, time.Since(start), false)
					return
				}
				inflight.Add(-1)
				if time.Now().After(half) {
					late.Add(part)
				}
				lim.release(part, time.Since(start), true)
			}
		})
	}
	wg.Wait()
	moved = float64(late.Load())
	return moved, moved / (d / 2).Seconds()
}

// TestLimiterGrowsToFillAPerConnectionCappedLink: on a path where one connection carries 1/50 of
// what the whole path does (real S3 from a p5), the limit grows until the path is full.
func TestLimiterGrowsToFillAPerConnectionCappedLink(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		l := link{perConn: 80e6, total: 50 * 80e6}
		lim := newLimiter(128)
		_, rate := drive(t, lim, l, 200, 8<<20, 2*time.Minute)
		st := lim.Stats()
		t.Logf("rate %.0f MB/s, %+v", rate/1e6, st)
		if rate < 0.85*l.total || st.Limit < 45 || st.Limit > 128 {
			t.Errorf("on a per-connection capped link: rate %.0f MB/s (path %.0f), limit %d (%+v); want ≥ 85 %% of the path, limit ≥ 45",
				rate/1e6, l.total/1e6, st.Limit, st)
		}
	})
}

// TestLimiterStaysLowOnAServerBoundLink: where the server is the ceiling whatever the number of
// requests (a local server on two cores), more requests only queue: the limit stays low and the
// throughput is the server's.
func TestLimiterStaysLowOnAServerBoundLink(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		l := link{total: 400e6}
		lim := newLimiter(64)
		_, rate := drive(t, lim, l, 100, 8<<20, time.Minute)
		st := lim.Stats()
		t.Logf("rate %.0f MB/s, %+v", rate/1e6, st)
		if rate < 0.95*l.total || st.Limit > 16 || st.Plateaus == 0 {
			t.Errorf("on a server-bound link: rate %.0f MB/s (server %.0f), limit %d (%+v); want the server's rate, limit ≤ 16, plateaus",
				rate/1e6, l.total/1e6, st.Limit, st)
		}
	})
}

// TestLimiterBacksOffOnSlowDown: a server that answers 503 SlowDown above 12 requests in flight
// keeps the limit near 12, however much a per-connection cap would reward more.
func TestLimiterBacksOffOnSlowDown(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		l := link{perConn: 80e6, total: 50 * 80e6, throttle: 12}
		lim := newLimiter(128)
		_, rate := drive(t, lim, l, 200, 8<<20, time.Minute)
		st := lim.Stats()
		t.Logf("rate %.0f MB/s, %+v", rate/1e6, st)
		if st.Throttled == 0 || st.Limit > 24 || rate < 0.5*12*l.perConn {
			t.Errorf("with SlowDown above 12: limit %d, rate %.0f MB/s (%+v); want back-offs, limit ≤ 24, ≥ half of 12 connections' rate",
				st.Limit, rate/1e6, st)
		}
	})
}

func TestLimiterNeverAboveMax(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		lim := newLimiter(5)
		drive(t, lim, link{perConn: 80e6, total: 1e12}, 50, 1<<20, 30*time.Second)
		if st := lim.Stats(); st.PeakInFlight > 5 || st.Limit != 5 || st.InFlight != 0 {
			t.Errorf("newLimiter(5) after a run: %+v; want peak ≤ 5, limit 5, none in flight", st)
		}
		if st := newLimiter(0).Stats(); st.Limit != 1 || st.Max != 1 {
			t.Errorf("newLimiter(0) = %+v; want limit and max 1", st)
		}
		one := newLimiter(1)
		one.observe(&smithy.GenericAPIError{Code: "SlowDown"})
		if st := one.Stats(); st.Limit != 1 || st.Throttled != 1 {
			t.Errorf("newLimiter(1) after a SlowDown = %+v; want limit 1 (never above max), one back-off", st)
		}
	})
}

func TestLimiterAcquireEndsWithContext(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		lim := newLimiter(1)
		if err := lim.acquire(t.Context(), 0, 0); err != nil {
			t.Fatal(err)
		}
		ctx, cancel := context.WithTimeout(t.Context(), time.Second)
		defer cancel()
		if err := lim.acquire(ctx, 0, 0); !errors.Is(err, context.DeadlineExceeded) {
			t.Errorf("acquire on a full limiter = %v; want the context's deadline", err)
		}
		lim.release(1, time.Millisecond, true)
		if err := lim.acquire(t.Context(), 0, 0); err != nil {
			t.Errorf("acquire after release = %v; want nil", err)
		}
	})
}

// Free slots go to the waiter of the highest rank, then the lowest order, then the first come;
// one that gave up takes none.
func TestLimiterAcquireOrder(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		lim := newLimiter(2)
		lim.set(2)
		for range 2 {
			if err := lim.acquire(t.Context(), 0, 5); err != nil {
				t.Fatal(err)
			}
		}
		got := make(chan string, 8)
		wait := func(name string, rank, order uint64, ctx context.Context) {
			go func() {
				if lim.acquire(ctx, rank, order) == nil {
					got <- name
				}
			}()
			synctest.Wait() // queued before the next one
		}
		gone, cancel := context.WithCancel(t.Context())
		wait("a9", 0, 9, t.Context())
		wait("b3", 0, 3, t.Context())
		wait("gone1", 0, 1, gone)
		wait("c3", 0, 3, t.Context())
		wait("d9", 0, 9, t.Context())
		wait("newer9", 1, 9, t.Context())
		wait("newer3", 1, 3, t.Context())
		cancel()
		synctest.Wait()
		var order []string
		for range 6 {
			lim.release(1, time.Millisecond, true)
			synctest.Wait()
			order = append(order, <-got)
		}
		if want := []string{"newer3", "newer9", "b3", "c3", "a9", "d9"}; !slices.Equal(order, want) {
			t.Errorf("slots went to %v; want %v", order, want)
		}
		if st := lim.Stats(); st.InFlight != 2 {
			t.Errorf("in flight %d; want 2 (6 released, 6 given)", st.InFlight)
		}
	})
}

func TestLimiterBackOffErrors(t *testing.T) {
	resp := func(code int) error {
		return &smithyhttp.ResponseError{Response: &smithyhttp.Response{Response: &http.Response{StatusCode: code}}, Err: errors.New("x")}
	}
	tests := []struct {
		err  error
		want bool
	}{
		{&smithy.GenericAPIError{Code: "SlowDown"}, true},
		{&smithy.GenericAPIError{Code: "RequestTimeout"}, true},
		{&smithy.GenericAPIError{Code: "AccessDenied"}, false},
		{resp(503), true},
		{resp(429), true},
		{resp(500), false},
		{fmt.Errorf("upload part 3: %w", syscall.ECONNRESET), true},
		{&net.OpError{Op: "read", Err: timeoutErr{}}, true},
		{context.Canceled, false},
		{fmt.Errorf("part: %w", context.DeadlineExceeded), false},
		{errors.New("read tcp 127.0.0.1:1->127.0.0.1:2: read: connection reset by peer"), true},
		{errors.New("checksum mismatch"), false},
	}
	for _, tc := range tests {
		if got := limiterBackOff(tc.err); got != tc.want {
			t.Errorf("limiterBackOff(%v) = %v; want %v", tc.err, got, tc.want)
		}
	}
}

type timeoutErr struct{}

func (timeoutErr) Error() string   { return "i/o timeout" }
func (timeoutErr) Timeout() bool   { return true }
func (timeoutErr) Temporary() bool { return true }

// TestLimiterSlowStartRampsInAFewPartTimes: on a link where each connection has its own limit, the
// limit doubles with every quarter of it that completes unhurried, so a short upload (a 1 GiB
// checkpoint after a notice) has many requests in flight within a few part times.
func TestLimiterSlowStartRampsInAFewPartTimes(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		l := link{perConn: 80e6, total: 100 * 80e6} // 8 MiB parts: about 0.1 s each
		lim := newLimiter(128)
		drive(t, lim, l, 200, 8<<20, 600*time.Millisecond)
		if st := lim.Stats(); st.PeakInFlight < 64 {
			t.Errorf("after 0.6 s (6 part times): %+v; want 64 or more in flight at the peak", st)
		}
	})
}

// TestLimiterHurry: with a notice pending or a restore waiting, a limiter that has not found the
// link shared starts at limiterHurry at once instead of a part time later; one that has keeps the
// limit it found; a server-bound link brings a hurried limit back down.
func TestLimiterHurry(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		capped := link{perConn: 10e6, total: 50 * 10e6} // 8 MiB parts: about 0.8 s each
		lim := newLimiter(128)
		lim.hurry()
		drive(t, lim, capped, 200, 8<<20, 500*time.Millisecond) // less than a part time
		if st := lim.Stats(); st.PeakInFlight != limiterHurry {
			t.Errorf("hurried, before the first part completes: %+v; want %d in flight", st, limiterHurry)
		}

		bound := link{total: 400e6}
		lim = newLimiter(128)
		lim.hurry()
		_, rate := drive(t, lim, bound, 100, 8<<20, time.Minute)
		if st := lim.Stats(); st.Limit > 16 || rate < 0.95*bound.total {
			t.Errorf("hurried on a server-bound link, after a minute: %+v, %.0f MB/s; want limit ≤ 16, the server's %.0f MB/s", st, rate/1e6, bound.total/1e6)
		}
		found := lim.Stats().Limit
		lim.hurry()
		if st := lim.Stats(); st.Limit != found {
			t.Errorf("hurry after slow start found the link shared: limit %d; want %d kept", st.Limit, found)
		}

		small := newLimiter(8)
		small.hurry()
		if st := small.Stats(); st.Limit != 8 {
			t.Errorf("newLimiter(8) hurried: limit %d; want 8 (max)", st.Limit)
		}
	})
}

func TestS3PartSize(t *testing.T) {
	const mib = 1 << 20
	for _, tc := range []struct {
		max, size, want int64
	}{
		{64 * mib, 1 * mib, 8 * mib},    // one PutObject
		{64 * mib, 8 * mib, 8 * mib},    // still one
		{64 * mib, 12 * mib, 8 * mib},   // 2 parts
		{64 * mib, 128 * mib, 8 * mib},  // 16 parts of 8 MiB
		{64 * mib, 256 * mib, 16 * mib}, // 16 of 16 MiB
		{64 * mib, 300 * mib, 19 * mib}, // whole MiB
		{64 * mib, 16 << 30, 64 * mib},  // 256 of 64 MiB
		{5 * mib, 100 * mib, 5 * mib},   // a smaller store.part_size wins
		{128 * mib, 4 << 30, 128 * mib}, // and a larger one
		{16 * mib, 1 << 30, 16 * mib},
	} {
		s := &S3Store{opts: S3Options{PartSize: tc.max}, lim: newLimiter(128)}
		for _, urgent := range []bool{false, true} { // a limit of 4: urgent or not, the same
			if got := s.partSize(tc.size, urgent); got != tc.want {
				t.Errorf("partSize(%d MiB, urgent %v) with part_size %d MiB = %d MiB; want %d MiB", tc.size/mib, urgent, tc.max/mib, got/mib, tc.want/mib)
			}
		}
	}
}

// A file a notice waits for is cut into as many parts as the limiter lets run at once, when that
// is more than 16, of at least 5 MiB (S3's least) and at most store.part_size.
func TestS3PartSizeUrgent(t *testing.T) {
	const mib = 1 << 20
	for _, tc := range []struct {
		max, size  int64
		limit      int
		want, calm int64
	}{
		{64 * mib, 128 * mib, 32, 5 * mib, 8 * mib},   // 26 parts rather than 16
		{64 * mib, 128 * mib, 16, 8 * mib, 8 * mib},   // no more than 16 at once: as calm
		{64 * mib, 1 << 30, 32, 32 * mib, 64 * mib},   // 32 of 32 MiB
		{64 * mib, 6 << 30, 128, 48 * mib, 64 * mib},  // 128 of 48 MiB
		{64 * mib, 64 << 30, 128, 64 * mib, 64 * mib}, // store.part_size still caps it
		{64 * mib, 12 * mib, 128, 5 * mib, 8 * mib},   // 5 and 7 MiB
		{4 * mib, 128 * mib, 32, 4 * mib, 4 * mib},    // a store.part_size below 5 MiB wins
	} {
		lim := newLimiter(128)
		lim.set(tc.limit)
		s := &S3Store{opts: S3Options{PartSize: tc.max}, lim: lim}
		if got := s.partSize(tc.size, true); got != tc.want {
			t.Errorf("partSize(%d MiB, urgent) at a limit of %d, part_size %d MiB = %d MiB; want %d MiB", tc.size/mib, tc.limit, tc.max/mib, got/mib, tc.want/mib)
		}
		if got := s.partSize(tc.size, false); got != tc.calm {
			t.Errorf("partSize(%d MiB) at a limit of %d, part_size %d MiB = %d MiB; want %d MiB", tc.size/mib, tc.limit, tc.max/mib, got/mib, tc.calm/mib)
		}
	}
}

// waiting returns how many acquire calls wait for a slot.
func (l *limiter) waiting() int {
	l.mu.Lock()
	defer l.mu.Unlock()
	return len(l.waiters)
}
