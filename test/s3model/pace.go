package s3model

import (
	"net"
	"sync"
	"sync/atomic"
	"time"
)

// pacer lets the bytes of one direction of one connection through at no more than rate bytes a
// second. due is when the bytes let through so far would have finished at rate; a transfer
// waits until due before it starts and moves at most chunk bytes. A transfer that starts late
// (a timer that fired late, a peer that was slow to send) may catch up by one chunk, no more: so
// the connection is never ahead of rate by more than two chunks, and an idle one saves up no
// further credit.
type pacer struct {
	rate  float64 // bytes per second; 0: no limit
	chunk int
	slack time.Duration // one chunk's time at rate

	mu       sync.Mutex
	due      time.Time
	deadline time.Time     // the connection's deadline for this direction; zero: none
	kick     chan struct{} // closed, and replaced, when the deadline changes
}

func newPacer(rate float64) *pacer {
	// A chunk is about 20 ms at rate, between 1 KiB and 64 KiB: small enough that the rate holds
	// over a tenth of a second, large enough that a fast cap does not cost a wake-up per packet.
	chunk := min(max(int(rate/50), 1<<10), 64<<10)
	p := &pacer{rate: rate, chunk: chunk, kick: make(chan struct{})}
	if rate > 0 {
		p.slack = time.Duration(float64(chunk) / rate * float64(time.Second))
	}
	return p
}

// wait blocks until the direction may move its next chunk, until its deadline is past (then the
// transfer itself fails at once), or until closed is closed. It returns how many bytes the next
// transfer may move, at most n.
func (p *pacer) wait(n int, closed <-chan struct{}) int {
	if p.rate <= 0 || n == 0 {
		return n
	}
	for {
		p.mu.Lock()
		now := time.Now()
		d := p.due.Sub(now)
		if !p.deadline.IsZero() && !p.deadline.After(now) {
			d = 0
		}
		kick := p.kick
		p.mu.Unlock()
		if d <= 0 {
			return min(n, p.chunk)
		}
		t := time.NewTimer(d)
		select {
		case <-t.C:
		case <-kick:
			t.Stop()
		case <-closed:
			t.Stop()
			return min(n, p.chunk)
		}
	}
}

// charge counts n bytes moved now.
func (p *pacer) charge(n int) {
	if p.rate <= 0 || n <= 0 {
		return
	}
	p.mu.Lock()
	defer p.mu.Unlock()
	if floor := time.Now().Add(-p.slack); p.due.Before(floor) {
		p.due = floor
	}
	p.due = p.due.Add(time.Duration(float64(n) / p.rate * float64(time.Second)))
}

// setDeadline records the connection's deadline for this direction and wakes a waiting transfer.
func (p *pacer) setDeadline(t time.Time) {
	p.mu.Lock()
	defer p.mu.Unlock()
	p.deadline = t
	close(p.kick)
	p.kick = make(chan struct{})
}

// counters are the proxy's tallies; every field is updated atomically.
type counters struct {
	conns, openConns, maxConns         atomic.Int64
	requests, inFlight, maxInFlight    atomic.Int64
	slowDowns                          atomic.Int64
	bytesIn, bytesOut                  atomic.Int64
	upstreamRequests, upstreamFailures atomic.Int64
	first, last                        atomic.Int64 // Unix nanoseconds; 0: none yet
}

// raise sets peak to v if v is larger.
func raise(peak *atomic.Int64, v int64) {
	for {
		old := peak.Load()
		if v <= old || peak.CompareAndSwap(old, v) {
			return
		}
	}
}

// pacedListener accepts connections whose reads (requests going up) and writes (responses going
// down) are paced at the proxy's per-connection rates and counted.
type pacedListener struct {
	net.Listener
	up, down float64
	c        *counters
}

func (l *pacedListener) Accept() (net.Conn, error) {
	conn, err := l.Listener.Accept()
	if err != nil {
		return nil, err
	}
	l.c.conns.Add(1)
	raise(&l.c.maxConns, l.c.openConns.Add(1))
	return &pacedConn{Conn: conn, in: newPacer(l.up), out: newPacer(l.down), c: l.c, closed: make(chan struct{})}, nil
}

// pacedConn is one client connection, paced each way. Reads and writes go through in chunks;
// deadlines are honoured while a transfer waits for its turn.
type pacedConn struct {
	net.Conn
	in, out   *pacer
	c         *counters
	closed    chan struct{}
	closeOnce sync.Once
}

func (c *pacedConn) Read(b []byte) (int, error) {
	n, err := c.Conn.Read(b[:c.in.wait(len(b), c.closed)])
	c.in.charge(n)
	c.c.bytesIn.Add(int64(n))
	return n, err
}

func (c *pacedConn) Write(b []byte) (int, error) {
	var total int
	for len(b) > 0 {
		n, err := c.Conn.Write(b[:c.out.wait(len(b), c.closed)])
		c.out.charge(n)
		c.c.bytesOut.Add(int64(n))
		total += n
		b = b[n:]
		if err != nil {
			return total, err
		}
	}
	return total, nil
}

func (c *pacedConn) Close() error {
	c.closeOnce.Do(func() {
		close(c.closed)
		c.c.openConns.Add(-1)
	})
	return c.Conn.Close()
}

func (c *pacedConn) SetDeadline(t time.Time) error {
	c.in.setDeadline(t)
	c.out.setDeadline(t)
	return c.Conn.SetDeadline(t)
}

func (c *pacedConn) SetReadDeadline(t time.Time) error {
	c.in.setDeadline(t)
	return c.Conn.SetReadDeadline(t)
}

func (c *pacedConn) SetWriteDeadline(t time.Time) error {
	c.out.setDeadline(t)
	return c.Conn.SetWriteDeadline(t)
}

// CloseWrite half-closes a TCP connection, which net/http uses to let a client read the answer
// to a request whose body it did not read (a 503 SlowDown) before the connection goes.
func (c *pacedConn) CloseWrite() error {
	if cw, ok := c.Conn.(interface{ CloseWrite() error }); ok {
		return cw.CloseWrite()
	}
	return nil
}
