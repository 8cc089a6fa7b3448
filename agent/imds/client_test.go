package imds

import (
	"context"
	"fmt"
	"net"
	"net/http"
	"net/http/httptest"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/aws/aws-sdk-go-v2/aws"
	"github.com/aws/aws-sdk-go-v2/config"
	"github.com/rs/zerolog"
)

// fakeIMDS is an IMDSv2 server: PUT /latest/api/token with the TTL header returns a token;
// GET /latest/meta-data/PATH needs a valid token in X-aws-ec2-metadata-token (else 401) and
// answers values[PATH] or 404. Faults can be switched on while it serves.
type fakeIMDS struct {
	mu          sync.Mutex
	tokens      map[string]bool
	values      map[string]string // by metadata path
	tokenStatus int               // when non-zero, the token PUT answers this status
	fault       string            // "", "5xx", "hang" (until the request is cancelled), "garbage"
	delay       time.Duration     // when non-zero, every request is answered after this long
	puts        int               // token requests
	gets        int               // metadata requests
	unauth      int               // metadata requests answered 401
	released    chan struct{}     // closed to release hung handlers at cleanup
}

const unauthorizedBody = `<?xml version="1.0" encoding="UTF-8"?>
<!DOCTYPE html PUBLIC "-//W3C//DTD XHTML 1.0 Transitional//EN"
	"http://www.w3.org/TR/xhtml1/DTD/xhtml1-transitional.dtd">
<html xmlns="http://www.w3.org/1999/xhtml" xml:lang="en" lang="en">
 <head>
  <title>401 - Unauthorized</title>
 </head>
 <body>
  <h1>401 - Unauthorized</h1>
 </body>
</html>`

func newFakeIMDS(values map[string]string) *fakeIMDS {
	if values == nil {
		values = make(map[string]string)
	}
	return &fakeIMDS{tokens: make(map[string]bool), values: values, released: make(chan struct{})}
}

func (f *fakeIMDS) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	f.mu.Lock()
	delay := f.delay
	f.mu.Unlock()
	if delay > 0 {
		t := time.NewTimer(delay)
		defer t.Stop()
		select {
		case <-t.C:
		case <-r.Context().Done():
			return
		case <-f.released:
		}
	}
	switch {
	case r.Method == http.MethodPut && r.URL.Path == "/latest/api/token":
		f.mu.Lock()
		defer f.mu.Unlock()
		f.puts++
		if f.tokenStatus != 0 {
			http.Error(w, http.StatusText(f.tokenStatus), f.tokenStatus)
			return
		}
		ttl := r.Header.Get("X-aws-ec2-metadata-token-ttl-seconds")
		if ttl == "" {
			http.Error(w, "missing TTL", http.StatusBadRequest)
			return
		}
		tok := fmt.Sprintf("token-%d", f.puts)
		f.tokens[tok] = true
		w.Header().Set("X-aws-ec2-metadata-token-ttl-seconds", ttl)
		_, _ = fmt.Fprint(w, tok)
	case r.Method == http.MethodGet && strings.HasPrefix(r.URL.Path, "/latest/meta-data/"):
		f.mu.Lock()
		f.gets++
		if !f.tokens[r.Header.Get("X-aws-ec2-metadata-token")] {
			f.unauth++
			f.mu.Unlock()
			http.Error(w, unauthorizedBody, http.StatusUnauthorized)
			return
		}
		fault := f.fault
		body, ok := f.values[strings.TrimPrefix(r.URL.Path, "/latest/meta-data/")]
		f.mu.Unlock()
		switch fault {
		case "5xx":
			http.Error(w, "<html><body><h1>503 Service Unavailable</h1></body></html>", http.StatusServiceUnavailable)
		case "hang":
			select {
			case <-r.Context().Done():
			case <-f.released:
			}
		case "garbage":
			_, _ = fmt.Fprint(w, "<html><body><h1>502 Bad Gateway</h1></body></html>")
		case "cut":
			// A 200 that promises more than it sends: the body of the notice, cut short.
			w.Header().Set("Content-Length", strconv.Itoa(len(body)))
			w.WriteHeader(http.StatusOK)
			_, _ = fmt.Fprint(w, body[:len(body)/2])
		default:
			if !ok {
				http.Error(w, "<html><body><h1>404 - Not Found</h1></body></html>", http.StatusNotFound)
				return
			}
			_, _ = fmt.Fprint(w, body)
		}
	default:
		http.Error(w, "", http.StatusMethodNotAllowed)
	}
}

// set changes the server state under its lock.
func (f *fakeIMDS) set(fn func(f *fakeIMDS)) {
	f.mu.Lock()
	defer f.mu.Unlock()
	fn(f)
}

// counts returns puts, gets, unauthorized gets.
func (f *fakeIMDS) counts() (puts, gets, unauth int) {
	f.mu.Lock()
	defer f.mu.Unlock()
	return f.puts, f.gets, f.unauth
}

// serve starts an httptest server for f on 127.0.0.1, closed at cleanup.
func serve(t *testing.T, f *fakeIMDS) *httptest.Server {
	t.Helper()
	srv := httptest.NewServer(f)
	t.Cleanup(func() {
		select {
		case <-f.released:
		default:
			close(f.released)
		}
		srv.Close()
	})
	return srv
}

func TestClientGet(t *testing.T) {
	f := newFakeIMDS(map[string]string{"instance-id": "i-1234567890abcdef0"})
	srv := serve(t, f)
	c := NewClient(aws.Config{}, srv.URL)
	ctx := t.Context()

	body, found, err := c.Get(ctx, "instance-id")
	if string(body) != "i-1234567890abcdef0" || !found || err != nil {
		t.Errorf("Get(%q) = %q, %v, %v; want the id, true, nil", "instance-id", body, found, err)
	}
	body, found, err = c.Get(ctx, "spot/instance-action")
	if body != nil || found || err != nil {
		t.Errorf("Get(%q) = %q, %v, %v; want nil, false, nil (404)", "spot/instance-action", body, found, err)
	}
	f.set(func(f *fakeIMDS) { f.fault = "5xx" })
	body, found, err = c.Get(ctx, "instance-id")
	if found || err == nil {
		t.Errorf("Get(%q) with 503 = %q, %v, %v; want an error", "instance-id", body, found, err)
	}
	if puts, gets, _ := f.counts(); puts != 1 || gets != 3 {
		t.Errorf("server saw %d token requests and %d gets; want 1 token (long-lived) and 3 gets (no SDK retries)", puts, gets)
	}
}

// TestClientWaitsForASlowAnswer: an IMDS that takes longer than 500 ms to answer (the SDK's
// own response-header timeout) is read, as long as ctx allows; ctx's deadline still ends a
// request that takes longer.
func TestClientWaitsForASlowAnswer(t *testing.T) {
	t.Parallel()
	f := newFakeIMDS(map[string]string{"instance-id": "i-1234567890abcdef0"})
	f.delay = 700 * time.Millisecond
	srv := serve(t, f)
	c := NewClient(aws.Config{}, srv.URL)

	ctx, cancel := context.WithTimeout(t.Context(), 5*time.Second)
	defer cancel()
	body, found, err := c.Get(ctx, "instance-id") // a token, then the value: 1.4 s
	if string(body) != "i-1234567890abcdef0" || !found || err != nil {
		t.Errorf("Get() from an IMDS answering in 700ms = %q, %v, %v; want the id", body, found, err)
	}

	ctx, cancel = context.WithTimeout(t.Context(), 200*time.Millisecond)
	defer cancel()
	t0 := time.Now()
	if _, found, err := c.Get(ctx, "instance-id"); found || err == nil {
		t.Errorf("Get() with a 200ms deadline = %v, %v; want an error", found, err)
	}
	if d := time.Since(t0); d > 600*time.Millisecond {
		t.Errorf("Get() with a 200ms deadline returned after %v; want about 200ms", d)
	}
}

// TestClientNoRedirect: a redirect is an error and is not followed, so the session token
// never leaves the endpoint. (The SDK's own HTTP client did not follow one either.)
func TestClientNoRedirect(t *testing.T) {
	var elsewhere atomic.Int64
	other := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		elsewhere.Add(1)
	}))
	defer other.Close()
	f := newFakeIMDS(nil)
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.Method == http.MethodGet {
			http.Redirect(w, r, other.URL+r.URL.Path, http.StatusFound)
			return
		}
		f.ServeHTTP(w, r)
	}))
	defer srv.Close()
	body, found, err := NewClient(aws.Config{}, srv.URL).Get(t.Context(), "instance-id")
	if body != nil || found || err == nil {
		t.Errorf("Get() answered by a redirect = %q, %v, %v; want an error", body, found, err)
	}
	if n := elsewhere.Load(); n != 0 {
		t.Errorf("the redirect's target saw %d requests; want 0", n)
	}
}

// TestClientRefreshesTokenOn401: when IMDS forgets the token, the same Get gets a new
// token and succeeds.
func TestClientRefreshesTokenOn401(t *testing.T) {
	f := newFakeIMDS(map[string]string{"instance-type": "p4d.24xlarge"})
	srv := serve(t, f)
	c := NewClient(aws.Config{}, srv.URL)
	if _, _, err := c.Get(t.Context(), "instance-type"); err != nil {
		t.Fatalf("Get() = %v", err)
	}
	f.set(func(f *fakeIMDS) { clear(f.tokens) })
	body, found, err := c.Get(t.Context(), "instance-type")
	if string(body) != "p4d.24xlarge" || !found || err != nil {
		t.Errorf("Get() after token loss = %q, %v, %v; want the value", body, found, err)
	}
	if puts, gets, unauth := f.counts(); puts != 2 || gets != 3 || unauth != 1 {
		t.Errorf("server saw %d puts, %d gets, %d unauthorized; want 2, 3, 1", puts, gets, unauth)
	}
	// A server that keeps answering 401 is an error, after one retry only.
	always401 := newFakeIMDS(nil)
	srv401 := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.Method == http.MethodPut {
			always401.ServeHTTP(w, r)
			return
		}
		always401.set(func(f *fakeIMDS) { f.gets++ })
		http.Error(w, unauthorizedBody, http.StatusUnauthorized)
	}))
	defer srv401.Close()
	c401 := NewClient(aws.Config{}, srv401.URL)
	if _, found, err := c401.Get(t.Context(), "instance-type"); found || err == nil {
		t.Errorf("Get() from an always-401 server = %v, %v; want an error", found, err)
	}
	if puts, gets, _ := always401.counts(); puts != 2 || gets != 2 {
		t.Errorf("always-401 server saw %d puts, %d gets; want 2 and 2 (one retry)", puts, gets)
	}
}

// TestClientNoIMDSv1Fallback: when the token request fails, no GET is sent without a token,
// and a 404 on the token request is not mistaken for "no notice".
func TestClientNoIMDSv1Fallback(t *testing.T) {
	for _, status := range []int{http.StatusForbidden, http.StatusNotFound, http.StatusMethodNotAllowed, http.StatusBadRequest, http.StatusInternalServerError} {
		t.Run(fmt.Sprint(status), func(t *testing.T) {
			f := newFakeIMDS(map[string]string{"spot/instance-action": `{"action":"terminate","time":"2017-09-18T08:22:00Z"}`})
			f.tokenStatus = status
			srv := serve(t, f)
			c := NewClient(aws.Config{}, srv.URL)
			for range 3 {
				body, found, err := c.Get(t.Context(), "spot/instance-action")
				if body != nil || found || err == nil {
					t.Errorf("Get() with token status %d = %q, %v, %v; want an error", status, body, found, err)
				}
			}
			if puts, gets, _ := f.counts(); puts != 3 || gets != 0 {
				t.Errorf("server saw %d token requests and %d gets; want 3 and 0 (no IMDSv1 fallback)", puts, gets)
			}
		})
	}
}

// TestClientEndpointFromEnvironment: with no endpoint argument the SDK's own resolution
// (AWS_EC2_METADATA_SERVICE_ENDPOINT through config.LoadDefaultConfig) applies; an explicit
// endpoint wins over it.
func TestClientEndpointFromEnvironment(t *testing.T) {
	f := newFakeIMDS(map[string]string{"placement/availability-zone": "us-east-1a"})
	srv := serve(t, f)
	dir := t.TempDir()
	t.Setenv("AWS_CONFIG_FILE", filepath.Join(dir, "config"))
	t.Setenv("AWS_SHARED_CREDENTIALS_FILE", filepath.Join(dir, "credentials"))
	t.Setenv("AWS_EC2_METADATA_DISABLED", "")
	t.Setenv("AWS_EC2_METADATA_V1_DISABLED", "false") // ours stays v2-only regardless
	t.Setenv("AWS_EC2_METADATA_SERVICE_ENDPOINT", srv.URL)
	cfg, err := config.LoadDefaultConfig(t.Context(), config.WithRegion("us-east-1"))
	if err != nil {
		t.Fatal(err)
	}
	body, found, err := NewClient(cfg, "").Get(t.Context(), "placement/availability-zone")
	if string(body) != "us-east-1a" || !found || err != nil {
		t.Errorf("Get() via the environment's endpoint = %q, %v, %v; want us-east-1a", body, found, err)
	}

	t.Setenv("AWS_EC2_METADATA_SERVICE_ENDPOINT", "http://127.0.0.1:1")
	cfg, err = config.LoadDefaultConfig(t.Context(), config.WithRegion("us-east-1"))
	if err != nil {
		t.Fatal(err)
	}
	body, found, err = NewClient(cfg, srv.URL).Get(t.Context(), "placement/availability-zone")
	if string(body) != "us-east-1a" || !found || err != nil {
		t.Errorf("Get() via the explicit endpoint = %q, %v, %v; want us-east-1a", body, found, err)
	}
}

// faultRun is a Watcher over the real SDK client against a fakeIMDS, with fast timings.
type faultRun struct {
	once   sync.Once
	w      *Watcher
	out    chan Event
	logs   *logBuffer
	cancel context.CancelFunc
	done   chan error
}

func startFaultRun(t *testing.T, endpoint string, sources ...Source) *faultRun {
	t.Helper()
	r := &faultRun{out: make(chan Event, 64), logs: &logBuffer{}, done: make(chan error, 1)}
	r.w = NewWatcher(NewClient(aws.Config{}, endpoint), Config{
		Sources:        sources,
		PollInterval:   20 * time.Millisecond,
		RequestTimeout: 100 * time.Millisecond,
		Logger:         zerolog.New(r.logs),
	})
	ctx, cancel := context.WithCancel(t.Context())
	r.cancel = cancel
	go func() { r.done <- r.w.Run(ctx, r.out) }()
	t.Cleanup(func() { r.stop(t) })
	return r
}

// stop cancels Run and checks that it returns nil; it may be called more than once.
func (r *faultRun) stop(t *testing.T) {
	t.Helper()
	r.once.Do(func() {
		r.cancel()
		if err := <-r.done; err != nil {
			t.Errorf("Run() = %v; want nil after cancel", err)
		}
	})
}

// eventually polls cond until it holds, failing the test after 10 s.
func eventually(t *testing.T, what string, cond func() bool) {
	t.Helper()
	deadline := time.NewTimer(10 * time.Second)
	defer deadline.Stop()
	tick := time.NewTicker(5 * time.Millisecond)
	defer tick.Stop()
	for !cond() {
		select {
		case <-tick.C:
		case <-deadline.C:
			t.Fatalf("timed out waiting for %s", what)
		}
	}
}

// waitEvent returns the next event, failing the test after 10 s.
func (r *faultRun) waitEvent(t *testing.T) Event {
	t.Helper()
	deadline := time.NewTimer(10 * time.Second)
	defer deadline.Stop()
	select {
	case ev := <-r.out:
		return ev
	case <-deadline.C:
		t.Fatalf("timed out waiting for an event\n%s", r.logs)
		return Event{}
	}
}

// errorsOf returns the error count of src.
func (r *faultRun) errorsOf(src Source) uint64 { return r.w.Stats().Sources[src].Errors }

// checkStreakLogs checks that src logged exactly warns Warn and infos Info streak lines.
func (r *faultRun) checkStreakLogs(t *testing.T, src Source, warns, infos int) {
	t.Helper()
	if got := len(r.logs.lines(t, "warn", msgFailed, src)); got != warns {
		t.Errorf("%s: %d Warn lines; want %d\n%s", src, got, warns, r.logs)
	}
	if got := len(r.logs.lines(t, "info", msgRecovered, src)); got != infos {
		t.Errorf("%s: %d Info lines; want %d\n%s", src, got, infos, r.logs)
	}
}

const spotNotice = `{"action": "terminate", "time": "2017-09-18T08:22:00Z"}`

// TestFaults runs the watcher through the real SDK client while IMDS misbehaves, and checks
// in each case that the errors are counted, logged once per streak, and that a notice that
// appears afterwards is still caught.
func TestFaults(t *testing.T) {
	tests := []struct {
		fault string
		src   Source
		body  string // the notice that appears when the fault clears
		key   string
	}{
		{"5xx", SourceSpot, spotNotice, "spot/terminate"},
		{"5xx", SourceScheduled, readTestdata(t, "scheduled-aemm.json"), "scheduled/system-reboot/instance-event-1234567890abcdef0"},
		{"hang", SourceSpot, spotNotice, "spot/terminate"},
		{"hang", SourceRebalance, readTestdata(t, "rebalance-aemm.json"), "rebalance/rebalance"},
		{"garbage", SourceASG, "Terminated", "asg/Terminated"},
		{"garbage", SourceScheduled, readTestdata(t, "scheduled-aemm.json"), "scheduled/system-reboot/instance-event-1234567890abcdef0"},
	}
	for _, tt := range tests {
		t.Run(tt.fault+"/"+string(tt.src), func(t *testing.T) {
			t.Parallel()
			f := newFakeIMDS(map[string]string{"autoscaling/target-lifecycle-state": "InService"})
			srv := serve(t, f)
			r := startFaultRun(t, srv.URL, tt.src)
			eventually(t, "a clean poll", func() bool { return r.w.Stats().Sources[tt.src].Polls >= 2 })
			f.set(func(f *fakeIMDS) { f.fault = tt.fault })
			eventually(t, "3 errors", func() bool { return r.errorsOf(tt.src) >= 3 })
			f.set(func(f *fakeIMDS) { f.fault = ""; f.values[tt.src.Path()] = tt.body })
			ev := r.waitEvent(t)
			if ev.Kind != Begin || ev.Notice.Key() != tt.key {
				t.Fatalf("event = %v %q; want begin %q", ev.Kind, ev.Notice.Key(), tt.key)
			}
			eventually(t, "the streak to end", func() bool { return r.w.Stats().Sources[tt.src].Streak == 0 })
			r.checkStreakLogs(t, tt.src, 1, 1)
			if st := r.w.Stats(); !st.Healthy(time.Now()) || st.Sources[tt.src].LastError == "" {
				t.Errorf("Stats() = %+v; want healthy with the last error kept", st)
			}
		})
	}
}

// TestSlowIMDSNoticeIsDelivered: an IMDS that answers every request (the token PUT and each
// GET) after 1.5 s, three times the SDK's header timeout and the spot source's default request
// timeout, still delivers its spot notice: the watcher, with the agent's settings, stretches its
// timeout until the reads get through.
func TestSlowIMDSNoticeIsDelivered(t *testing.T) {
	t.Parallel()
	f := newFakeIMDS(map[string]string{"spot/instance-action": spotNotice})
	f.delay = 1500 * time.Millisecond
	srv := serve(t, f)
	logs := &logBuffer{}
	w := NewWatcher(NewClient(aws.Config{}, srv.URL), Config{
		Sources:          []Source{SourceSpot, SourceRebalance},
		PollInterval:     time.Second,
		SpotPollInterval: 250 * time.Millisecond,
		Logger:           zerolog.New(logs),
	})
	out := make(chan Event, 16)
	ctx, cancel := context.WithCancel(t.Context())
	done := make(chan error, 1)
	go func() { done <- w.Run(ctx, out) }()
	defer func() {
		cancel()
		if err := <-done; err != nil {
			t.Errorf("Run() = %v; want nil after cancel", err)
		}
	}()

	// 0.5 s, 1 s and 2 s time out (the last after the token came), 4 s gets the notice:
	// about 6 s in all.
	deadline := time.NewTimer(20 * time.Second)
	defer deadline.Stop()
	select {
	case ev := <-out:
		if ev.Kind != Begin || ev.Notice.Key() != "spot/terminate" {
			t.Fatalf("event = %v %q; want begin spot/terminate", ev.Kind, ev.Notice.Key())
		}
	case <-deadline.C:
		t.Fatalf("no event within 20 s from an IMDS answering in 1.5 s; stats %+v\n%s", w.Stats(), logs)
	}
	if got := len(logs.lines(t, "warn", msgSlow, SourceSpot)); got != 1 {
		t.Errorf("%d Warn lines about a slow IMDS for spot; want 1\n%s", got, logs)
	}
}

// TestFaultGarbageSpot: a 200 with garbage on spot is a fail-safe notice, logged once.
func TestFaultGarbageSpot(t *testing.T) {
	f := newFakeIMDS(nil)
	srv := serve(t, f)
	r := startFaultRun(t, srv.URL, SourceSpot)
	eventually(t, "a clean poll", func() bool { return r.w.Stats().Sources[SourceSpot].Polls >= 2 })
	f.set(func(f *fakeIMDS) { f.fault = "garbage" })
	ev := r.waitEvent(t)
	if ev.Kind != Begin || ev.Notice.Key() != "spot/terminate" || !ev.Notice.Malformed {
		t.Fatalf("event = %v %+v; want begin of a malformed spot/terminate", ev.Kind, ev.Notice)
	}
	if d := ev.Notice.Deadline.Sub(ev.At); d > FailSafeDelay || d < FailSafeDelay-time.Second {
		t.Errorf("deadline = detection + %v; want + 2m", d)
	}
	eventually(t, "3 errors", func() bool { return r.errorsOf(SourceSpot) >= 3 })
	f.set(func(f *fakeIMDS) { f.fault = "" }) // 404: the notice ends
	ev = r.waitEvent(t)
	if ev.Kind != End || ev.Notice.Key() != "spot/terminate" {
		t.Fatalf("event = %v %q; want end spot/terminate", ev.Kind, ev.Notice.Key())
	}
	r.checkStreakLogs(t, SourceSpot, 1, 1)
}

// TestFaultCutSpot: a 200 on spot whose body is cut short is a notice read badly, the fail-safe
// one, as a garbage body is (it was an ordinary failed read: no notice, and /healthz 503 after
// 30 s). On another source it is a failed read.
func TestFaultCutSpot(t *testing.T) {
	t.Run("spot", func(t *testing.T) {
		f := newFakeIMDS(nil)
		srv := serve(t, f)
		r := startFaultRun(t, srv.URL, SourceSpot)
		eventually(t, "a clean poll", func() bool { return r.w.Stats().Sources[SourceSpot].Polls >= 2 })
		f.set(func(f *fakeIMDS) { f.fault = "cut"; f.values[SourceSpot.Path()] = spotNotice })
		ev := r.waitEvent(t)
		if ev.Kind != Begin || ev.Notice.Key() != "spot/terminate" || !ev.Notice.Malformed {
			t.Fatalf("event = %v %+v; want begin of a malformed spot/terminate", ev.Kind, ev.Notice)
		}
		if d := ev.Notice.Deadline.Sub(ev.At); d > FailSafeDelay || d < FailSafeDelay-time.Second {
			t.Errorf("deadline = detection + %v; want + 2m", d)
		}
		if st := r.w.Stats().Sources[SourceSpot]; !strings.Contains(st.LastError, "cut short") {
			t.Errorf("last error %q; want it to say the body was cut short", st.LastError)
		}
		f.set(func(f *fakeIMDS) { f.fault = "" }) // read whole: the real deadline
		ev = r.waitEvent(t)
		if ev.Kind != Update || ev.Notice.Malformed || !ev.Notice.Deadline.Equal(time.Date(2017, 9, 18, 8, 22, 0, 0, time.UTC)) {
			t.Fatalf("event = %v %+v; want an update to the deadline read", ev.Kind, ev.Notice)
		}
	})
	t.Run("rebalance", func(t *testing.T) {
		f := newFakeIMDS(nil)
		srv := serve(t, f)
		r := startFaultRun(t, srv.URL, SourceRebalance)
		eventually(t, "a clean poll", func() bool { return r.w.Stats().Sources[SourceRebalance].Polls >= 2 })
		f.set(func(f *fakeIMDS) {
			f.fault = "cut"
			f.values[SourceRebalance.Path()] = readTestdata(t, "rebalance-aemm.json")
		})
		eventually(t, "3 errors", func() bool { return r.errorsOf(SourceRebalance) >= 3 })
		select {
		case ev := <-r.out:
			t.Errorf("event %v %+v from a cut rebalance body; want none", ev.Kind, ev.Notice)
		default:
		}
	})
}

// TestFault5xxAllSources: every source has its own streak, logged once each.
func TestFault5xxAllSources(t *testing.T) {
	f := newFakeIMDS(map[string]string{"autoscaling/target-lifecycle-state": "InService"})
	srv := serve(t, f)
	r := startFaultRun(t, srv.URL) // all sources
	eventually(t, "a clean poll of each source", func() bool {
		for _, s := range Sources {
			if r.w.Stats().Sources[s].Polls < 2 {
				return false
			}
		}
		return true
	})
	f.set(func(f *fakeIMDS) { f.fault = "5xx" })
	eventually(t, "2 errors on each source", func() bool {
		for _, s := range Sources {
			if r.errorsOf(s) < 2 {
				return false
			}
		}
		return true
	})
	f.set(func(f *fakeIMDS) { f.fault = ""; f.values["spot/instance-action"] = spotNotice })
	if ev := r.waitEvent(t); ev.Kind != Begin || ev.Notice.Key() != "spot/terminate" {
		t.Fatalf("event = %v %q; want begin spot/terminate", ev.Kind, ev.Notice.Key())
	}
	eventually(t, "every streak to end", func() bool {
		for _, s := range Sources {
			if r.w.Stats().Sources[s].Streak != 0 {
				return false
			}
		}
		return true
	})
	for _, s := range Sources {
		r.checkStreakLogs(t, s, 1, 1)
	}
}

// TestFaultTokenExpiry: IMDS forgets the token mid-run; the SDK fetches a new one on the 401
// and the watcher catches a notice that appears afterwards, without an error streak.
func TestFaultTokenExpiry(t *testing.T) {
	f := newFakeIMDS(nil)
	srv := serve(t, f)
	r := startFaultRun(t, srv.URL, SourceSpot)
	eventually(t, "a clean poll", func() bool { return r.w.Stats().Sources[SourceSpot].Polls >= 2 })
	f.set(func(f *fakeIMDS) { clear(f.tokens) })
	eventually(t, "a 401", func() bool { _, _, unauth := f.counts(); return unauth >= 1 })
	f.set(func(f *fakeIMDS) { f.values["spot/instance-action"] = spotNotice })
	if ev := r.waitEvent(t); ev.Kind != Begin || ev.Notice.Key() != "spot/terminate" {
		t.Fatalf("event = %v %q; want begin spot/terminate", ev.Kind, ev.Notice.Key())
	}
	if puts, _, _ := f.counts(); puts != 2 {
		t.Errorf("server saw %d token requests; want 2 (one refresh)", puts)
	}
	if n := r.errorsOf(SourceSpot); n != 0 {
		t.Errorf("errors = %d; want 0 (the 401 is retried with a fresh token)", n)
	}
	r.checkStreakLogs(t, SourceSpot, 0, 0)
}

// TestFaultConnectionRefused: IMDS goes away (connection refused), then comes back on the
// same address with no memory of the old token.
func TestFaultConnectionRefused(t *testing.T) {
	f := newFakeIMDS(nil)
	srv := httptest.NewServer(f)
	addr := srv.Listener.Addr().String()
	r := startFaultRun(t, srv.URL, SourceSpot)
	eventually(t, "a clean poll", func() bool { return r.w.Stats().Sources[SourceSpot].Polls >= 2 })
	srv.Close()
	eventually(t, "3 errors", func() bool { return r.errorsOf(SourceSpot) >= 3 })
	if st := r.w.Stats().Sources[SourceSpot]; !strings.Contains(st.LastError, "refused") {
		t.Errorf("LastError = %q; want connection refused", st.LastError)
	}

	f.set(func(f *fakeIMDS) { clear(f.tokens); f.values["spot/instance-action"] = spotNotice })
	l, err := net.Listen("tcp", addr)
	if err != nil {
		t.Fatalf("listen again on %s: %v", addr, err)
	}
	srv2 := httptest.NewUnstartedServer(f)
	if err := srv2.Listener.Close(); err != nil {
		t.Fatal(err)
	}
	srv2.Listener = l
	srv2.Start()
	t.Cleanup(func() { close(f.released); srv2.Close() })

	if ev := r.waitEvent(t); ev.Kind != Begin || ev.Notice.Key() != "spot/terminate" {
		t.Fatalf("event = %v %q; want begin spot/terminate", ev.Kind, ev.Notice.Key())
	}
	eventually(t, "the streak to end", func() bool { return r.w.Stats().Sources[SourceSpot].Streak == 0 })
	r.checkStreakLogs(t, SourceSpot, 1, 1)
}

// TestFaultNoToken: an IMDS that refuses tokens (v1 only) gives errors, never a notice read
// without a token.
func TestFaultNoToken(t *testing.T) {
	f := newFakeIMDS(map[string]string{"spot/instance-action": spotNotice})
	f.tokenStatus = http.StatusForbidden
	srv := serve(t, f)
	r := startFaultRun(t, srv.URL, SourceSpot)
	eventually(t, "3 errors", func() bool { return r.errorsOf(SourceSpot) >= 3 })
	r.stop(t)
	if _, gets, _ := f.counts(); gets != 0 {
		t.Errorf("server saw %d gets; want 0", gets)
	}
	select {
	case ev := <-r.out:
		t.Errorf("event %v %q; want none", ev.Kind, ev.Notice.Key())
	default:
	}
	r.checkStreakLogs(t, SourceSpot, 1, 0)
}

// TestClientIgnoresHTTPProxy: IMDS is link-local; a proxy in the environment must never see
// the polls. (net/http never proxies loopback addresses, so the endpoint is a name that does not
// resolve: through a proxy the request would reach it; without one it fails to dial.)
func TestClientIgnoresHTTPProxy(t *testing.T) {
	var proxied atomic.Int64
	proxy := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		proxied.Add(1)
		http.Error(w, "proxy", http.StatusBadGateway)
	}))
	defer proxy.Close()
	for _, k := range []string{"HTTP_PROXY", "http_proxy"} {
		t.Setenv(k, proxy.URL)
	}
	for _, k := range []string{"NO_PROXY", "no_proxy"} {
		t.Setenv(k, "")
	}
	c := NewClient(aws.Config{}, "http://imds.invalid")
	ctx, cancel := context.WithTimeout(t.Context(), 5*time.Second)
	defer cancel()
	if _, _, err := c.Get(ctx, "instance-id"); err == nil {
		t.Errorf("Get via an unresolvable endpoint succeeded; want a dial error")
	}
	if n := proxied.Load(); n != 0 {
		t.Errorf("proxy saw %d requests; want 0", n)
	}
}
