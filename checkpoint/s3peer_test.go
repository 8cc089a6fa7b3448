package checkpoint

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/http/httptest"
	"net/http/httputil"
	"net/url"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/aws/aws-sdk-go-v2/aws"
	"github.com/aws/aws-sdk-go-v2/credentials"
	"github.com/aws/aws-sdk-go-v2/service/s3"
)

// The S3 tests run against versitygw, a real S3 server on a POSIX directory, built into
// ../bin by `make tools`.

const (
	s3PeerAccess = "spotguard-test"
	s3PeerSecret = "spotguard-test-secret"
	s3PeerBucket = "checkpoints"
)

// s3Peer is a running versitygw with one bucket.
type s3Peer struct {
	endpoint string // http://127.0.0.1:PORT
	bucket   string
	// client talks to the server directly, for checks behind the store's back.
	client *s3.Client
}

// s3PeerBinary finds versitygw: ../bin/versitygw, else on PATH. It fails the test when CI is
// set and skips it otherwise.
func s3PeerBinary(t testing.TB) string {
	t.Helper()
	if p, err := filepath.Abs(filepath.Join("..", "bin", "versitygw")); err == nil {
		if _, err := os.Stat(p); err == nil {
			return p
		}
	}
	if p, err := exec.LookPath("versitygw"); err == nil {
		return p
	}
	const why = "versitygw not found in ../bin or on PATH; run `make tools`"
	if os.Getenv("CI") != "" {
		t.Fatal(why)
	}
	t.Skip(why)
	return ""
}

// s3FreePort returns a port on 127.0.0.1 that was free a moment ago.
func s3FreePort(t testing.TB) string {
	t.Helper()
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer l.Close()
	return l.Addr().String()
}

// s3TestConfig returns an aws.Config for endpoint with the peer's static credentials and an
// HTTP client whose idle connections are closed when the test ends.
func s3TestConfig(t testing.TB, endpoint string) aws.Config {
	tr := http.DefaultTransport.(*http.Transport).Clone()
	tr.MaxIdleConnsPerHost = 32
	t.Cleanup(tr.CloseIdleConnections)
	return aws.Config{
		Region:       "us-east-1",
		Credentials:  credentials.NewStaticCredentialsProvider(s3PeerAccess, s3PeerSecret, ""),
		BaseEndpoint: aws.String(endpoint),
		HTTPClient:   &http.Client{Transport: tr},
	}
}

// s3StartPeer starts versitygw on a free port, waits until it answers, creates a bucket, and
// stops it when the test ends.
func s3StartPeer(t testing.TB) *s3Peer {
	t.Helper()
	bin := s3PeerBinary(t)
	var lastErr error
	for range 3 { // the free port may be taken before versitygw binds it
		p, err := s3TryStartPeer(t, bin)
		if err == nil {
			return p
		}
		lastErr = err
	}
	t.Fatalf("start versitygw: %v", lastErr)
	return nil
}

func s3TryStartPeer(t testing.TB, bin string) (*s3Peer, error) {
	dir := t.TempDir()
	data, meta := filepath.Join(dir, "data"), filepath.Join(dir, "meta")
	for _, d := range []string{data, meta} {
		if err := os.Mkdir(d, 0o755); err != nil {
			return nil, err
		}
	}
	logf, err := os.Create(filepath.Join(dir, "versitygw.log"))
	if err != nil {
		return nil, err
	}
	defer logf.Close()
	addr := s3FreePort(t)
	cmd := exec.Command(bin, "--access", s3PeerAccess, "--secret", s3PeerSecret, "--port", addr, "--quiet",
		"posix", "--sidecar", meta, data)
	cmd.Stdout, cmd.Stderr = logf, logf
	if err := cmd.Start(); err != nil {
		return nil, err
	}
	exited := make(chan struct{})
	go func() {
		cmd.Wait()
		close(exited)
	}()
	stop := func() {
		cmd.Process.Kill()
		<-exited
	}
	endpoint := "http://" + addr
	if err := s3WaitUp(t.Context(), endpoint, exited); err != nil {
		stop()
		log, _ := os.ReadFile(logf.Name())
		return nil, fmt.Errorf("%w; log:\n%s", err, log)
	}
	t.Cleanup(stop)
	p := &s3Peer{endpoint: endpoint, bucket: s3PeerBucket}
	p.client = s3NewClient(s3TestConfig(t, endpoint), 4)
	if _, err := p.client.CreateBucket(t.Context(), &s3.CreateBucketInput{Bucket: &p.bucket}); err != nil {
		t.Fatalf("create bucket: %v", err)
	}
	return p, nil
}

// s3WaitUp polls endpoint until it answers any HTTP response, versitygw exits, or 20 s pass.
func s3WaitUp(ctx context.Context, endpoint string, exited <-chan struct{}) error {
	ctx, cancel := context.WithTimeout(ctx, 20*time.Second)
	defer cancel()
	tr := &http.Transport{DisableKeepAlives: true}
	defer tr.CloseIdleConnections()
	c := &http.Client{Transport: tr}
	tick := time.NewTicker(10 * time.Millisecond)
	defer tick.Stop()
	for {
		req, _ := http.NewRequestWithContext(ctx, http.MethodGet, endpoint, nil)
		if resp, err := c.Do(req); err == nil {
			resp.Body.Close()
			return nil
		}
		select {
		case <-exited:
			return errors.New("versitygw exited")
		case <-ctx.Done():
			return fmt.Errorf("versitygw did not answer: %w", ctx.Err())
		case <-tick.C:
		}
	}
}

// openS3 opens the store s3://bucket/prefix on endpoint (the peer, or a proxy in front of it).
func (p *s3Peer) openS3(t testing.TB, endpoint, prefix string, opts S3Options) *S3Store {
	t.Helper()
	s, err := OpenStore("s3://"+p.bucket+"/"+prefix, s3TestConfig(t, endpoint), opts)
	if err != nil {
		t.Fatal(err)
	}
	return s.(*S3Store)
}

// incompleteUploads returns the keys of the incomplete multipart uploads under prefix.
func (p *s3Peer) incompleteUploads(t testing.TB, prefix string) []string {
	t.Helper()
	out, err := p.client.ListMultipartUploads(context.WithoutCancel(t.Context()), &s3.ListMultipartUploadsInput{Bucket: &p.bucket, Prefix: &prefix})
	if err != nil {
		t.Fatalf("list multipart uploads: %v", err)
	}
	var keys []string
	for _, u := range out.Uploads {
		keys = append(keys, aws.ToString(u.Key))
	}
	return keys
}

// s3FaultProxy forwards requests to an S3 server and injects faults on request.
type s3FaultProxy struct {
	srv *httptest.Server
	rp  *httputil.ReverseProxy

	mu sync.Mutex
	// slowDown answers the next slowDown requests with 503 SlowDown.
	slowDown int
	// slowDownParts answers the next slowDownParts part uploads with 503 SlowDown.
	slowDownParts int
	// noFullObject refuses multipart uploads with a FULL_OBJECT checksum, as servers without
	// full-object checksums do.
	noFullObject bool
	// cutGets cuts the next cutGets ranged reads off after 1 MiB of the response body.
	cutGets int
	// resetParts cuts the connection of the next resetParts part uploads after 1 MiB of body.
	resetParts int
	// trickleParts reads the body of the next trickleParts part uploads at 200 KiB/s, and then
	// forwards them: a connection that moves, but slowly.
	trickleParts int
	// closing is closed as the test ends: a trickling handler stops (what the client sent into
	// the loopback's buffers before it gave up would otherwise keep it reading for long).
	closing chan struct{}
	// loseResponses lets the server handle the next loseResponses object PUTs (not parts) and
	// then resets the connection instead of answering, as a network that fails after the
	// server acted does.
	loseResponses int
	// down closes every connection at once.
	down bool
	// downOnPart sets down at the first part upload.
	downOnPart bool
	// refuseSSE answers every request that asks for server-side encryption with 400
	// InvalidArgument, as a server that does not offer it does.
	refuseSSE bool
	// seen counts what the proxy did: "slowdown", "reset", "cut", "lose", "down", "abort",
	// "nosse", "forward".
	seen map[string]int
	// writes lists every write request that reached the proxy, in order.
	writes []s3Write
}

// s3Write is one write request as the proxy saw it: its kind ("put", "create", "part",
// "complete") and its server-side encryption headers.
type s3Write struct {
	kind, key, sse, kmsKeyID string
}

// s3WriteKind says which write r is, or "" for anything else.
func s3WriteKind(r *http.Request) string {
	q := r.URL.Query()
	switch {
	case r.Method == http.MethodPut && q.Has("partNumber"):
		return "part"
	case r.Method == http.MethodPut && !q.Has("uploadId") && r.Header.Get("X-Amz-Copy-Source") == "":
		return "put"
	case r.Method == http.MethodPost && q.Has("uploads"):
		return "create"
	case r.Method == http.MethodPost && q.Has("uploadId"):
		return "complete"
	}
	return ""
}

// writesSeen returns the write requests the proxy saw.
func (p *s3FaultProxy) writesSeen() []s3Write {
	p.mu.Lock()
	defer p.mu.Unlock()
	return slices.Clone(p.writes)
}

// s3StartProxy starts a fault proxy in front of target; it is closed when the test ends.
func s3StartProxy(t testing.TB, target string) *s3FaultProxy {
	u, err := url.Parse(target)
	if err != nil {
		t.Fatal(err)
	}
	tr := http.DefaultTransport.(*http.Transport).Clone()
	p := &s3FaultProxy{seen: map[string]int{}, closing: make(chan struct{})}
	p.rp = &httputil.ReverseProxy{
		Rewrite: func(pr *httputil.ProxyRequest) {
			pr.SetURL(u)
			pr.Out.Host = pr.In.Host // the client signed the proxy's host
		},
		Transport: tr,
		ErrorLog:  nil,
		ErrorHandler: func(w http.ResponseWriter, r *http.Request, err error) {
			w.WriteHeader(http.StatusBadGateway)
		},
	}
	p.srv = httptest.NewServer(p)
	t.Cleanup(func() {
		close(p.closing)
		p.srv.Close()
		tr.CloseIdleConnections()
	})
	return p
}

func (p *s3FaultProxy) URL() string { return p.srv.URL }

func (p *s3FaultProxy) set(f func(p *s3FaultProxy)) {
	p.mu.Lock()
	defer p.mu.Unlock()
	f(p)
}

// count returns how often the proxy did what.
func (p *s3FaultProxy) count(what string) int {
	p.mu.Lock()
	defer p.mu.Unlock()
	return p.seen[what]
}

func (p *s3FaultProxy) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	isPart := r.Method == http.MethodPut && r.URL.Query().Has("partNumber")
	isRangedGet := r.Method == http.MethodGet && r.Header.Get("Range") != ""
	isObjectPut := r.Method == http.MethodPut && !r.URL.Query().Has("partNumber") && !r.URL.Query().Has("uploadId")
	isFullObjectCreate := r.Method == http.MethodPost && r.URL.Query().Has("uploads") &&
		r.Header.Get("X-Amz-Checksum-Type") == "FULL_OBJECT"
	wantsSSE := r.Header.Get("X-Amz-Server-Side-Encryption") != ""
	p.mu.Lock()
	if kind := s3WriteKind(r); kind != "" {
		p.writes = append(p.writes, s3Write{kind: kind, key: r.URL.Path,
			sse: r.Header.Get("X-Amz-Server-Side-Encryption"), kmsKeyID: r.Header.Get("X-Amz-Server-Side-Encryption-Aws-Kms-Key-Id")})
	}
	if isPart && p.downOnPart {
		p.downOnPart, p.down = false, true
	}
	var what string
	switch {
	case p.down:
		what = "down"
	case p.slowDown > 0:
		p.slowDown--
		what = "slowdown"
	case isPart && p.slowDownParts > 0:
		p.slowDownParts--
		what = "slowdown"
	case isFullObjectCreate && p.noFullObject:
		what = "nofullobject"
	case wantsSSE && p.refuseSSE:
		what = "nosse"
	case isRangedGet && p.cutGets > 0:
		p.cutGets--
		what = "cut"
	case isPart && p.resetParts > 0:
		p.resetParts--
		what = "reset"
	case isPart && p.trickleParts > 0:
		p.trickleParts--
		what = "trickle"
	case isObjectPut && p.loseResponses > 0:
		p.loseResponses--
		what = "lose"
	case r.Method == http.MethodDelete && r.URL.Query().Has("uploadId"):
		what = "abort"
	default:
		what = "forward"
	}
	p.seen[what]++
	p.mu.Unlock()

	switch what {
	case "down":
		s3CloseConn(w)
	case "slowdown":
		io.Copy(io.Discard, r.Body)
		w.Header().Set("Content-Type", "application/xml")
		w.WriteHeader(http.StatusServiceUnavailable)
		io.WriteString(w, `<?xml version="1.0" encoding="UTF-8"?>`+
			`<Error><Code>SlowDown</Code><Message>Please reduce your request rate.</Message>`+
			`<RequestId>spotguard-test</RequestId></Error>`)
	case "nofullobject":
		w.Header().Set("Content-Type", "application/xml")
		w.WriteHeader(http.StatusBadRequest)
		io.WriteString(w, `<?xml version="1.0" encoding="UTF-8"?>`+
			`<Error><Code>InvalidRequest</Code><Message>Checksum type FULL_OBJECT is not supported.</Message>`+
			`<RequestId>spotguard-test</RequestId></Error>`)
	case "nosse":
		io.Copy(io.Discard, r.Body)
		w.Header().Set("Content-Type", "application/xml")
		w.WriteHeader(http.StatusBadRequest)
		io.WriteString(w, `<?xml version="1.0" encoding="UTF-8"?>`+
			`<Error><Code>InvalidArgument</Code><Message>The encryption method specified is not supported</Message>`+
			`<RequestId>spotguard-test</RequestId></Error>`)
	case "reset":
		io.CopyN(io.Discard, r.Body, 1<<20)
		s3CloseConn(w)
	case "trickle":
		tick := time.NewTicker(20 * time.Millisecond)
		defer tick.Stop()
		var body bytes.Buffer
		buf := make([]byte, 4<<10)
		for {
			select {
			case <-tick.C:
			case <-r.Context().Done():
				return
			case <-p.closing:
				return
			}
			n, err := r.Body.Read(buf)
			body.Write(buf[:n])
			if errors.Is(err, io.EOF) {
				break
			}
			if err != nil {
				return // the client gave up on it
			}
		}
		r.Body = io.NopCloser(&body)
		p.rp.ServeHTTP(w, r)
	case "lose":
		p.rp.ServeHTTP(httptest.NewRecorder(), r)
		s3CloseConn(w)
	case "cut":
		// ReverseProxy aborts the response (and the connection) when a body write fails.
		p.rp.ServeHTTP(&s3CutWriter{ResponseWriter: w, left: 1 << 20}, r)
	default:
		p.rp.ServeHTTP(w, r)
	}
}

// s3CloseConn resets the request's connection.
func s3CloseConn(w http.ResponseWriter) {
	conn, _, err := http.NewResponseController(w).Hijack()
	if err != nil {
		panic(err)
	}
	if tc, ok := conn.(*net.TCPConn); ok {
		tc.SetLinger(0) // RST, not FIN
	}
	conn.Close()
}

// s3CutWriter fails writes once left bytes were written.
type s3CutWriter struct {
	http.ResponseWriter
	left int
}

func (c *s3CutWriter) Write(b []byte) (int, error) {
	if len(b) > c.left {
		n, _ := c.ResponseWriter.Write(b[:c.left])
		c.left = 0
		return n, errors.New("cut off by the test")
	}
	c.left -= len(b)
	return c.ResponseWriter.Write(b)
}

func (c *s3CutWriter) Unwrap() http.ResponseWriter { return c.ResponseWriter }

// s3DescribeSeen lists what the proxy did, for messages.
func s3DescribeSeen(p *s3FaultProxy) string {
	p.mu.Lock()
	defer p.mu.Unlock()
	var b strings.Builder
	for k, v := range p.seen {
		fmt.Fprintf(&b, "%s=%d ", k, v)
	}
	return b.String()
}
