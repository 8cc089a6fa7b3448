// Package s3model is a scaled model of Amazon S3 for benchmarks: an HTTP reverse proxy in front
// of a local S3 server (versitygw) that gives each client connection the share of the server
// that one connection gets of real S3.
//
// On EC2 one S3 connection carries about 80–90 MB/s while a p5's NIC carries 100 Gb/s, so a
// client needs well over a hundred requests in flight to fill the NIC, and awscli's default of 10
// stays near 1 GB/s. On a small machine the loopback server is the bottleneck instead, and a
// client's concurrency hardly shows. The model restores the proportion: each TCP connection is
// capped at 1/ConnsToFill of what the server sustains here (Calibrate measures it), so a client
// with ConnsToFill connections busy reaches the server's ceiling and one with 10 a fifth of it
// (Scaled).
// (A p5's ratio is about 150: 12.5 GB/s over 85 MB/s; the benchmarks take ConnsToFill unless
// told otherwise.)
//
// What the model does, each part optional (Options):
//
//   - caps each client TCP connection at a rate each way, on the wire: the bytes it reads from
//     the connection (request headers and bodies, TLS records included) and the bytes it writes
//     to it (responses). Bodies stream through: nothing is buffered beyond one chunk, about 20 ms
//     at the rate. The server side is not capped.
//   - adds a first-byte latency to every request: the server's response header is held that long
//     before it is forwarded (a GET's time to first byte, a PUT's time from its last byte to its
//     answer), on a timer that ends with the request.
//   - answers 503 SlowDown, with S3's XML error body, to requests beyond a rate per key prefix
//     (see Prefix): a token bucket per prefix. Real S3 takes 3,500 writes and 5,500 reads a
//     second per prefix; the model's default is off.
//   - counts connections, requests, requests in flight, SlowDowns and bytes each way (Stats).
//
// Everything else is S3's own answer: the proxy forwards requests unchanged (path, query, the
// Host the client signed, Content-Length, Expect: 100-continue, Transfer-Encoding: chunked,
// aws-chunked bodies with trailing checksums) and responses unchanged; it only removes the
// hop-by-hop headers net/http/httputil.ReverseProxy removes.
//
// # TLS
//
// The realistic layout, and the one the benchmarks use, is client —TLS→ model —plain HTTP→
// versitygw: TLS ends at the model, as it ends at S3's front end, so the client pays for TLS as
// it would on EC2 and the server's CPU is not spent twice on a small machine. The model can also
// speak TLS to the server (Options.Upstream https://, Options.UpstreamCAs).
//
// What TLS changes for the client, read in the SDK sources (aws-sdk-go-v2 service/s3 v1.114,
// service/internal/checksum v1.11, aws/signer/v4) and botocore 1.43 (auth.py, httpchecksum.py),
// and checked by TestMultipartGoSDK and TestMultipartAWSCLI, which record each upload's
// x-amz-content-sha256:
//
//   - Plain HTTP. Go SDK: PutObject and UploadPart sign the payload. Before the request is sent
//     the SDK reads the whole body once to compute its SHA-256 (x-amz-content-sha256: the hex
//     digest) and rewinds it; when the caller gives no checksum, the same pass computes the
//     default CRC-32 and sends it as the x-amz-checksum-crc32 header. spotguard gives its own
//     CRC-32C (x-amz-checksum-crc32c, computed in a pass of its own), so over HTTP it reads each
//     part three times: its CRC-32C, the SDK's SHA-256, the send. awscli also always signs the
//     payload over HTTP (SHA-256) and sends its CRC-32 as a header.
//   - HTTPS. Go SDK: no SHA-256 of the payload. A request whose checksum header is already set
//     (spotguard's) is signed with x-amz-content-sha256: UNSIGNED-PAYLOAD and sent as is; one
//     without lets the SDK send the checksum as a trailer: x-amz-content-sha256:
//     STREAMING-UNSIGNED-PAYLOAD-TRAILER, Content-Encoding: aws-chunked,
//     x-amz-decoded-content-length, the CRC computed as the body streams out. awscli does the
//     same (aws-chunked with a trailing CRC-32, no SHA-256) for its streaming uploads.
//
// So plain-HTTP loopback overstates a client's CPU per GiB uploaded by a SHA-256 and a read of
// every byte (on this machine's SHA-NI, a few tenths of a CPU second per GiB), and understates
// it by TLS's encryption (AES-GCM, cheaper still). Downloads are the same either way but for
// decryption: a GET's payload is never signed.
package s3model

import (
	"context"
	"crypto/tls"
	"crypto/x509"
	"errors"
	"fmt"
	"io"
	"log"
	"net"
	"net/http"
	"net/http/httputil"
	"net/url"
	"sync"
	"time"
)

const (
	// ConnsToFill is how many connections, each at the default cap, reach the server's ceiling.
	ConnsToFill = 50
	// DefaultFirstByteLatency is the model's default added latency per request.
	DefaultFirstByteLatency = 20 * time.Millisecond
)

// Ceiling is what the S3 server sustains here, in bytes a second, with as many connections as
// it likes: Up for uploads (PUT bodies), Down for downloads (GET bodies).
type Ceiling struct {
	Up, Down float64
}

// Options configure a Proxy. Zero values turn a feature off.
type Options struct {
	// Upstream is the S3 server: http://host:port or https://host:port. Required.
	Upstream string
	// UpstreamCAs are the roots that sign an https Upstream's certificate; nil: the system's.
	UpstreamCAs *x509.CertPool
	// TLS, when set, is the certificate the proxy serves TLS with; clients then use https.
	TLS *tls.Certificate
	// ConnUpRate caps what the proxy reads from each client connection (requests, their bodies
	// going up), ConnDownRate what it writes to one (responses), in bytes a second on the wire.
	// 0: no cap.
	ConnUpRate, ConnDownRate float64
	// FirstByteLatency is held before each response header is forwarded. 0: none.
	FirstByteLatency time.Duration
	// SlowDownRate is the requests a second each key prefix (Prefix with PrefixSegments) takes;
	// beyond it, and beyond SlowDownBurst requests at once (0: a second's worth, at least one),
	// requests are answered 503 SlowDown. 0: never.
	SlowDownRate   float64
	SlowDownBurst  int
	PrefixSegments int
	// Observe, when set, is called with every request before it is forwarded or refused (on the
	// request's goroutine; it must not read the body).
	Observe func(*http.Request)
	// ErrorLog receives the proxy's and its HTTP server's errors (a client that went away, an
	// upstream that failed); nil: they are dropped.
	ErrorLog *log.Logger
}

// Scaled returns the Options of the scaled model in front of upstream: each connection capped
// at 1/ConnsToFill of c's slower direction, both ways (one S3 connection carries about as much
// either way), DefaultFirstByteLatency, no SlowDown, plain HTTP to clients. The slower direction
// is the upload here: a local server reads back from the page cache several times faster than
// it writes, so a cap from the download rate would leave the clients' and the model's own CPU,
// not the cap, limiting restores on a small machine.
func Scaled(upstream string, c Ceiling) Options {
	perConn := min(c.Up, c.Down) / ConnsToFill
	return Options{
		Upstream:         upstream,
		ConnUpRate:       perConn,
		ConnDownRate:     perConn,
		FirstByteLatency: DefaultFirstByteLatency,
	}
}

// Stats are the proxy's counters since it started.
type Stats struct {
	// Conns is the client connections accepted; MaxConns the most open at once.
	Conns, MaxConns int64
	// Requests is the requests received; InFlight those being served now (from the request
	// header read to the response's last byte), MaxInFlight the most at once.
	Requests, InFlight, MaxInFlight int64
	// SlowDowns is the requests answered 503 SlowDown by the proxy itself.
	SlowDowns int64
	// UpstreamFailures is the requests the server could not be asked or answer (the proxy
	// answered 502), client disconnects included.
	UpstreamFailures int64
	// BytesIn and BytesOut are the bytes read from and written to clients on the wire: HTTP
	// headers and bodies, and TLS records with TLS.
	BytesIn, BytesOut int64
	// First is when the first request's header was read, Last when the latest request ended
	// (its response sent or abandoned); zero before any. Last-First is how long the client kept
	// the model busy, its own start-up and wind-down left out.
	First, Last time.Time
}

// Busy is Last-First: 0 before a request has ended.
func (s Stats) Busy() time.Duration {
	if s.First.IsZero() || s.Last.Before(s.First) {
		return 0
	}
	return s.Last.Sub(s.First)
}

// Proxy is the model: an http.Handler in front of the upstream S3 server, and Serve to run it
// with its per-connection caps.
type Proxy struct {
	opts     Options
	rp       *httputil.ReverseProxy
	tr       *http.Transport
	slowDown *slowDown
	c        counters
}

// New returns a Proxy for opts. It returns an error for an Upstream that is not an http or
// https URL with a host, and for negative rates or latency.
func New(opts Options) (*Proxy, error) {
	up, err := url.Parse(opts.Upstream)
	if err != nil {
		return nil, fmt.Errorf("s3model: upstream: %w", err)
	}
	var problems []error
	if (up.Scheme != "http" && up.Scheme != "https") || up.Host == "" {
		problems = append(problems, fmt.Errorf("s3model: upstream %q: want http://host:port or https://host:port", opts.Upstream))
	}
	if opts.ConnUpRate < 0 || opts.ConnDownRate < 0 || opts.SlowDownRate < 0 || opts.FirstByteLatency < 0 {
		problems = append(problems, errors.New("s3model: negative rate or latency"))
	}
	if err := errors.Join(problems...); err != nil {
		return nil, err
	}
	p := &Proxy{opts: opts}
	if opts.SlowDownRate > 0 {
		p.slowDown = newSlowDown(opts.SlowDownRate, opts.SlowDownBurst, opts.PrefixSegments)
	}
	p.tr = &http.Transport{
		Proxy:                 nil, // never an HTTP_PROXY from the environment
		DialContext:           (&net.Dialer{Timeout: 10 * time.Second, KeepAlive: 30 * time.Second}).DialContext,
		MaxIdleConns:          0,
		MaxIdleConnsPerHost:   1024,
		IdleConnTimeout:       90 * time.Second,
		ExpectContinueTimeout: 5 * time.Second, // wait for the server's 100 Continue, as the client waits for ours
		DisableCompression:    true,            // no Accept-Encoding of our own: bodies pass untouched
		TLSClientConfig:       &tls.Config{RootCAs: opts.UpstreamCAs, MinVersion: tls.VersionTLS12},
		WriteBufferSize:       64 << 10,
		ReadBufferSize:        64 << 10,
	}
	errorLog := opts.ErrorLog
	if errorLog == nil {
		errorLog = log.New(io.Discard, "", 0)
	}
	p.rp = &httputil.ReverseProxy{
		Rewrite: func(r *httputil.ProxyRequest) {
			r.Out.URL.Scheme = up.Scheme
			r.Out.URL.Host = up.Host
			r.Out.Host = r.In.Host // what the client signed
		},
		Transport:      p.tr,
		FlushInterval:  -1, // a response's bytes go out as they come
		ErrorLog:       errorLog,
		ModifyResponse: p.holdFirstByte,
		ErrorHandler: func(w http.ResponseWriter, r *http.Request, err error) {
			p.c.upstreamFailures.Add(1)
			errorLog.Printf("s3model: %s %s: %v", r.Method, r.URL.Path, err)
			w.WriteHeader(http.StatusBadGateway)
		},
		BufferPool: newBufferPool(64 << 10),
	}
	return p, nil
}

// holdFirstByte holds a response header for the first-byte latency, or until the request ends.
func (p *Proxy) holdFirstByte(resp *http.Response) error {
	return p.wait(resp.Request.Context())
}

func (p *Proxy) wait(ctx context.Context) error {
	if p.opts.FirstByteLatency <= 0 {
		return nil
	}
	t := time.NewTimer(p.opts.FirstByteLatency)
	defer t.Stop()
	select {
	case <-t.C:
		return nil
	case <-ctx.Done():
		return fmt.Errorf("hold first byte: %w", ctx.Err())
	}
}

// ServeHTTP forwards r to the server, or answers 503 SlowDown when its prefix is over its rate.
func (p *Proxy) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	id := p.c.requests.Add(1)
	p.c.first.CompareAndSwap(0, time.Now().UnixNano())
	raise(&p.c.maxInFlight, p.c.inFlight.Add(1))
	defer func() {
		p.c.inFlight.Add(-1)
		raise(&p.c.last, time.Now().UnixNano())
	}()
	if p.opts.Observe != nil {
		p.opts.Observe(r)
	}
	if p.slowDown != nil && !p.slowDown.allow(Prefix(r.URL.Path, p.slowDown.segments), time.Now()) {
		p.c.slowDowns.Add(1)
		if p.wait(r.Context()) != nil {
			return
		}
		writeSlowDown(w, r, fmt.Sprintf("s3model-%d", id))
		return
	}
	p.c.upstreamRequests.Add(1)
	p.rp.ServeHTTP(w, r)
}

// Stats returns the counters so far.
func (p *Proxy) Stats() Stats {
	return Stats{
		Conns:            p.c.conns.Load(),
		MaxConns:         p.c.maxConns.Load(),
		Requests:         p.c.requests.Load(),
		InFlight:         p.c.inFlight.Load(),
		MaxInFlight:      p.c.maxInFlight.Load(),
		SlowDowns:        p.c.slowDowns.Load(),
		UpstreamFailures: p.c.upstreamFailures.Load(),
		BytesIn:          p.c.bytesIn.Load(),
		BytesOut:         p.c.bytesOut.Load(),
		First:            unixNano(p.c.first.Load()),
		Last:             unixNano(p.c.last.Load()),
	}
}

// ResetStats starts the counters afresh, as if the proxy had just started with the connections
// and requests it has open now: a benchmark that warms a client up through the proxy measures
// what follows. It is meant for a moment with no request in flight (Stats.InFlight 0); one that
// is counts towards MaxInFlight, not towards Requests or First.
func (p *Proxy) ResetStats() {
	c := &p.c
	c.conns.Store(c.openConns.Load())
	c.maxConns.Store(c.openConns.Load())
	c.requests.Store(0)
	c.maxInFlight.Store(c.inFlight.Load())
	c.slowDowns.Store(0)
	c.bytesIn.Store(0)
	c.bytesOut.Store(0)
	c.upstreamRequests.Store(0)
	c.upstreamFailures.Store(0)
	c.first.Store(0)
	c.last.Store(0)
}

func unixNano(ns int64) time.Time {
	if ns == 0 {
		return time.Time{}
	}
	return time.Unix(0, ns)
}

// Serve accepts client connections on ln, paced at the per-connection caps and, with
// Options.TLS, over TLS, and serves them until ctx is done. It then closes ln and every
// connection, and returns nil once every request has ended; it returns an error, the same way,
// when ln fails.
func (p *Proxy) Serve(ctx context.Context, ln net.Listener) error {
	var l net.Listener = &pacedListener{Listener: ln, up: p.opts.ConnUpRate, down: p.opts.ConnDownRate, c: &p.c}
	if p.opts.TLS != nil {
		l = tls.NewListener(l, &tls.Config{
			Certificates: []tls.Certificate{*p.opts.TLS},
			NextProtos:   []string{"http/1.1"}, // S3 speaks HTTP/1.1
			MinVersion:   tls.VersionTLS12,
		})
	}
	// Every handler is waited for: one that starts after the server stopped returns at once.
	var (
		gate     sync.RWMutex
		stopped  bool
		handlers sync.WaitGroup
	)
	srv := &http.Server{
		Handler: http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
			gate.RLock()
			if stopped {
				gate.RUnlock()
				return
			}
			handlers.Add(1)
			gate.RUnlock()
			defer handlers.Done()
			p.ServeHTTP(w, r)
		}),
		BaseContext:       func(net.Listener) context.Context { return ctx },
		ReadHeaderTimeout: time.Minute,
		IdleTimeout:       2 * time.Minute,
		ErrorLog:          p.opts.ErrorLog,
	}
	if srv.ErrorLog == nil {
		srv.ErrorLog = log.New(io.Discard, "", 0)
	}
	served := make(chan error, 1)
	go func() { served <- srv.Serve(l) }()
	var err error
	select {
	case <-ctx.Done():
		srv.Close()
		<-served
	case err = <-served:
		srv.Close()
		err = fmt.Errorf("s3model: serve: %w", err)
	}
	gate.Lock()
	stopped = true
	gate.Unlock()
	handlers.Wait()
	p.tr.CloseIdleConnections()
	return err
}

// bufferPool hands out the ReverseProxy's copy buffers.
type bufferPool struct{ pool sync.Pool }

func newBufferPool(size int) *bufferPool {
	return &bufferPool{pool: sync.Pool{New: func() any { return make([]byte, size) }}}
}

func (b *bufferPool) Get() []byte  { return b.pool.Get().([]byte) }
func (b *bufferPool) Put(v []byte) { b.pool.Put(v) } //nolint:staticcheck // a slice header is small next to the copy it saves
