package s3model

import (
	"errors"
	"io"
	"net"
	"os"
	"testing"
	"testing/synctest"
	"time"
)

// pipe returns a paced end of a net.Pipe (rates up and down) and the plain other end.
func pipe(t *testing.T, up, down float64) (*pacedConn, net.Conn, *counters) {
	a, b := net.Pipe()
	c := &counters{}
	pc := &pacedConn{Conn: a, in: newPacer(up), out: newPacer(down), c: c, closed: make(chan struct{})}
	t.Cleanup(func() { pc.Close(); b.Close() })
	return pc, b, c
}

func TestPacedWriteHoldsRate(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		const rate, size = 1e6, 1 << 20 // 1 MB/s, 1 MiB
		pc, other, c := pipe(t, 0, rate)
		got := make(chan int64)
		go func() {
			n, _ := io.Copy(io.Discard, other)
			got <- n
		}()
		start := time.Now()
		if n, err := pc.Write(make([]byte, size)); n != size || err != nil {
			t.Fatalf("Write = %d, %v; want %d, nil", n, err, size)
		}
		elapsed := time.Since(start)
		pc.Close()
		if n := <-got; n != size {
			t.Fatalf("read %d bytes; want %d", n, size)
		}
		// The first two chunks go at once, each next one when the bytes before it would have
		// finished at the rate.
		chunk := pc.out.chunk
		lo := time.Duration(float64(size-2*chunk) / rate * float64(time.Second))
		hi := time.Duration(float64(size) / rate * float64(time.Second))
		if elapsed < lo || elapsed > hi {
			t.Errorf("%d bytes at %.0f B/s took %s; want between %s and %s", size, rate, elapsed, lo, hi)
		}
		if got := c.bytesOut.Load(); got != size {
			t.Errorf("bytesOut = %d; want %d", got, size)
		}
	})
}

func TestPacedReadHoldsRate(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		const rate, size = 2e6, 3 << 20
		pc, other, c := pipe(t, rate, 0)
		go func() {
			other.Write(make([]byte, size))
			other.Close()
		}()
		start := time.Now()
		n, err := io.Copy(io.Discard, pc)
		elapsed := time.Since(start)
		if n != size || err != nil {
			t.Fatalf("read %d, %v; want %d, nil", n, err, size)
		}
		want := time.Duration(float64(size) / rate * float64(time.Second))
		if elapsed < want*9/10 || elapsed > want {
			t.Errorf("%d bytes at %.0f B/s took %s; want about %s", size, rate, elapsed, want)
		}
		if got := c.bytesIn.Load(); got != size {
			t.Errorf("bytesIn = %d; want %d", got, size)
		}
	})
}

// An idle connection saves up no more than a chunk of credit: after a pause it goes on at the
// rate, not faster.
func TestPacerSavesNoCredit(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		p := newPacer(1e6)
		p.charge(p.chunk)
		<-time.NewTimer(10 * time.Second).C // the bubble's clock: no real time passes
		start := time.Now()
		for range 10 {
			p.charge(p.wait(p.chunk, nil))
		}
		// The first two of the ten go at once; the eight after them wait a chunk's time each.
		want := 8 * time.Duration(float64(p.chunk)/1e6*float64(time.Second))
		if got := time.Since(start); got != want {
			t.Errorf("ten chunks after a pause took %s; want %s", got, want)
		}
	})
}

// A transfer that starts late (a timer that fired late, a slow peer) does not lower the rate:
// small transfers, each a little late, still reach it.
func TestPacerCatchesUpLateStarts(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		const rate, piece, pieces = 1e6, 1000, 1000 // 1 MB/s in 1 kB pieces: a second
		p := newPacer(rate)
		start := time.Now()
		for range pieces {
			n := p.wait(piece, nil)
			<-time.NewTimer(100 * time.Microsecond).C // late by a tenth of a piece's time
			p.charge(n)
		}
		if got, want := time.Since(start), time.Second; got > want {
			t.Errorf("%d pieces of %d bytes at %.0f B/s, each started 100µs late, took %s; want at most %s", pieces, piece, rate, got, want)
		}
	})
}

// A read waiting for its turn returns as soon as its deadline is moved into the past, as net/http
// does to end its background read; Close ends a wait too.
func TestPacedReadHonoursDeadlineAndClose(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		pc, _, _ := pipe(t, 1e3, 0) // 1 KB/s: a 1 KiB chunk is a second's debt
		pc.in.charge(10 << 10)      // ten seconds of debt
		done := make(chan error)
		go func() {
			_, err := pc.Read(make([]byte, 1))
			done <- err
		}()
		synctest.Wait()
		start := time.Now()
		pc.SetReadDeadline(start)
		err := <-done
		if !errors.Is(err, os.ErrDeadlineExceeded) {
			t.Errorf("Read after the deadline passed = %v; want a deadline error", err)
		}
		if waited := time.Since(start); waited != 0 {
			t.Errorf("Read returned %s after its deadline passed; want at once", waited)
		}

		pc.SetReadDeadline(time.Time{})
		go func() {
			_, err := pc.Read(make([]byte, 1))
			done <- err
		}()
		synctest.Wait()
		pc.Close()
		if err := <-done; err == nil {
			t.Error("Read on a closed connection succeeded")
		}
	})
}

func TestPrefix(t *testing.T) {
	for _, tt := range []struct {
		path string
		n    int
		want string
	}{
		{"/b/a/b/c/d", 2, "b/a/b/"},
		{"/b/a/x", 2, "b/a/"},
		{"/b/x", 2, "b/"},
		{"/b/a/b/c/d", 0, "b/"},
		{"/b", 1, "b/"},
		{"/b/", 1, "b/"},
		{"/", 1, "/"},
		{"/b/job/step-1/shard-0.bin", 1, "b/job/"},
	} {
		if got := Prefix(tt.path, tt.n); got != tt.want {
			t.Errorf("Prefix(%q, %d) = %q; want %q", tt.path, tt.n, got, tt.want)
		}
	}
}

func TestSlowDownTokenBucket(t *testing.T) {
	s := newSlowDown(2, 3, 1) // 2 a second, 3 at once
	t0 := time.Unix(1000, 0)
	for i := range 3 {
		if !s.allow("b/x/", t0) {
			t.Fatalf("request %d of a burst of 3 refused", i+1)
		}
	}
	if s.allow("b/x/", t0) {
		t.Error("fourth request at once allowed; want refused")
	}
	if !s.allow("b/y/", t0) {
		t.Error("another prefix refused; want its own bucket")
	}
	if !s.allow("b/x/", t0.Add(500*time.Millisecond)) {
		t.Error("request after half a second at 2/s refused")
	}
	if s.allow("b/x/", t0.Add(500*time.Millisecond)) {
		t.Error("second request after half a second at 2/s allowed")
	}
	if !s.allow("b/x/", t0.Add(time.Hour)) || !s.allow("b/x/", t0.Add(time.Hour)) || !s.allow("b/x/", t0.Add(time.Hour)) ||
		s.allow("b/x/", t0.Add(time.Hour)) {
		t.Error("after an hour: want exactly the burst of 3")
	}
}
