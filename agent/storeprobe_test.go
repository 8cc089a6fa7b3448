package agent

import (
	"context"
	"errors"
	"fmt"
	"io/fs"
	"net"
	"net/http"
	"os"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"testing"
	"testing/synctest"
	"time"

	awshttp "github.com/aws/aws-sdk-go-v2/aws/transport/http"
	"github.com/aws/smithy-go"
	smithyhttp "github.com/aws/smithy-go/transport/http"
	"github.com/rs/zerolog"

	"github.com/spotguard/spotguard/checkpoint"
)

// s3Err is an error as the S3 client returns it: an API error code inside an HTTP response error.
func s3Err(status int, code, msg string) error {
	return fmt.Errorf("operation error S3: ListObjectsV2: %w", &awshttp.ResponseError{
		ResponseError: &smithyhttp.ResponseError{
			Response: &smithyhttp.Response{Response: &http.Response{StatusCode: status}},
			Err:      &smithy.GenericAPIError{Code: code, Message: msg},
		},
		RequestID: "REQ123",
	})
}

// httpErr is a response error without an API error code.
func httpErr(status int) error {
	return &awshttp.ResponseError{ResponseError: &smithyhttp.ResponseError{
		Response: &smithyhttp.Response{Response: &http.Response{StatusCode: status}}, Err: errors.New("http error"),
	}}
}

func TestStoreErrorReason(t *testing.T) {
	for _, tc := range []struct {
		name string
		err  error
		want string
	}{
		{"nil", nil, ""},
		{"NoSuchBucket", s3Err(404, "NoSuchBucket", "The specified bucket does not exist"), StoreNotFound},
		{"AccessDenied", s3Err(403, "AccessDenied", "Access Denied"), StoreDenied},
		{"InvalidAccessKeyId", s3Err(403, "InvalidAccessKeyId", "no such key id"), StoreDenied},
		{"ExpiredToken", s3Err(400, "ExpiredToken", "expired"), StoreDenied},
		{"SlowDown", s3Err(503, "SlowDown", "Please reduce your request rate"), StoreThrottled},
		{"503 without code", httpErr(503), StoreThrottled},
		{"429", httpErr(429), StoreThrottled},
		{"403 without code", httpErr(403), StoreDenied},
		{"InternalError", s3Err(500, "InternalError", "We encountered an internal error"), StoreNetwork},
		{"502", httpErr(502), StoreNetwork},
		{"PreconditionFailed", s3Err(412, "PreconditionFailed", "At least one of the pre-conditions you specified did not hold"), StoreChanged},
		{"ErrPrecondition", fmt.Errorf("write LATEST: %w", checkpoint.ErrPrecondition), StoreChanged},
		{"ErrExists", fmt.Errorf("write manifest: %w", checkpoint.ErrExists), StoreChanged},
		{"file changed while sending", errors.New("send a/b: file changed while it was being read"), StoreChanged},
		{"ErrNotFound", fmt.Errorf("get x: %w", checkpoint.ErrNotFound), StoreNotFound},
		{"connection refused", &net.OpError{Op: "dial", Net: "tcp", Err: os.NewSyscallError("connect", syscall.ECONNREFUSED)}, StoreNetwork},
		{"DNS", fmt.Errorf("send: %w", &net.DNSError{Err: "no such host", Name: "s3.example"}), StoreNetwork},
		{"deadline", fmt.Errorf("put: %w", context.DeadlineExceeded), StoreNetwork},
		{"reset", fmt.Errorf("read: %w", syscall.ECONNRESET), StoreNetwork},
		{"no credentials", errors.New("operation error S3: PutObject, get identity: get credentials: failed to refresh cached credentials, no EC2 IMDS role found"), StoreDenied},
		{"file store permission", &fs.PathError{Op: "open", Path: "/store/x", Err: fs.ErrPermission}, StoreDenied},
		{"wrong region", s3Err(301, "PermanentRedirect", "The bucket you are attempting to access must be addressed using the specified endpoint"), StoreOther},
		{"disk full", &fs.PathError{Op: "write", Path: "/store/x", Err: syscall.ENOSPC}, StoreOther},
		// 403s that are no permission to grant (found from outside: classed denied).
		{"clock skewed", s3Err(403, "RequestTimeTooSkewed", "The difference between the request time and the current time is too large."), StoreOther},
		{"virtual-host only", s3Err(403, "SecondLevelDomainForbidden", "Please use virtual hosted style to access."), StoreOther},
		{"anything else", errors.New("something odd"), StoreOther},
	} {
		t.Run(tc.name, func(t *testing.T) {
			if got := StoreErrorReason(tc.err); got != tc.want {
				t.Errorf("StoreErrorReason(%v) = %q; want %q", tc.err, got, tc.want)
			}
		})
	}
}

func TestStoreErrorSummaryAndFix(t *testing.T) {
	err := s3Err(404, "NoSuchBucket", "The specified bucket does not exist")
	if got, want := StoreErrorSummary(err), "NoSuchBucket: The specified bucket does not exist (HTTP 404)"; got != want {
		t.Errorf("StoreErrorSummary = %q; want %q", got, want)
	}
	for _, tc := range []struct {
		reason, url string
		err         error
		want        string
	}{
		{StoreNotFound, "s3://nosuchbucket/x", err, "the bucket nosuchbucket does not exist"},
		{StoreDenied, "s3://b/runs", s3Err(403, "AccessDenied", "Access Denied"), "arn:aws:s3:::b/runs/*"},
		{StoreDenied, "s3://b/runs", errors.New("get credentials: failed to refresh cached credentials"), "no AWS credentials"},
		{StoreDenied, "s3://b/runs", s3Err(403, "SignatureDoesNotMatch", "The request signature we calculated does not match"), "the secret access key does not belong to the access key id"},
		{StoreDenied, "s3://b/runs", s3Err(403, "InvalidAccessKeyId", "no such key id"), "S3 does not know the access key id"},
		// Expired credentials are no permission to grant (found from outside).
		{StoreDenied, "s3://b/runs", s3Err(400, "ExpiredToken", "The provided token has expired."), "S3 says the credentials have expired"},
		{StoreOther, "s3://b", s3Err(301, "PermanentRedirect", "elsewhere"), "AWS_REGION"},
		{StoreOther, "s3://Ckpt/runs", s3Err(400, "InvalidBucketName", "The specified bucket is not valid."), `S3 does not take "Ckpt" as a bucket name`},
		{StoreNetwork, "s3://b", errors.New("dial tcp: connection refused"), "AWS_ENDPOINT_URL_S3"},
		// A certificate not trusted is no route to fix, nor is plain HTTP behind https:// (found from outside).
		{StoreNetwork, "s3://b", errors.New(`Get "https://127.0.0.1:9000/b": tls: failed to verify certificate: x509: certificate signed by unknown authority`), "SSL_CERT_FILE (or AWS_CA_BUNDLE)"},
		{StoreNetwork, "s3://b", errors.New(`Get "https://127.0.0.1:9000/b": http: server gave HTTP response to HTTPS client`), "use http:// in AWS_ENDPOINT_URL_S3"},
		// Trusted, for another name: not a CA to add (found from outside).
		{StoreNetwork, "s3://b", errors.New(`Get "https://s3.internal:9000/b": tls: failed to verify certificate: x509: certificate is valid for minio.internal, not s3.internal`), "the store's certificate is for another host name"},
		{StoreThrottled, "s3://b", nil, "store.concurrency"},
		{StoreChanged, "s3://b", nil, "store.job"},
		{StoreDenied, "file:///mnt/ckpt", nil, "cannot write /mnt/ckpt"},
		// A read-only file system under the unit is its sandbox, most likely (found from outside).
		{StoreDenied, "file:///mnt/ckpt", nil, "ReadWritePaths= says: add /mnt/ckpt there"},
		// A 404 about an object, or from an S3-compatible server about a user, is not a
		// missing bucket.
		{StoreNotFound, "s3://b/runs", s3Err(404, "NoSuchKey", "The specified key does not exist."), "spotguard list --check"},
		{StoreNotFound, "s3://b/runs", s3Err(404, "XAdminUserNotFound", "user not found"), "not about the bucket"},
		// Found from outside, each given advice on IAM or store.url before.
		{StoreOther, "s3://b", s3Err(403, "RequestTimeTooSkewed", "The difference between the request time and the current time is too large."), "chronyc tracking"},
		{StoreOther, "s3://b", s3Err(403, "SecondLevelDomainForbidden", "Please use virtual hosted style to access."), "path-style"},
		{StoreOther, "s3://b", s3Err(501, "NotImplemented", "A header you provided implies functionality that is not implemented"), "conditional writes (If-None-Match, If-Match) and CRC-32C checksums"},
		{StoreOther, "s3://b", s3Err(400, "InvalidArgument", "Header 'x-amz-checksum-crc32c' is not supported"), "conditional writes (If-None-Match, If-Match) and CRC-32C checksums"},
		{StoreOther, "s3://b", ErrNoConditionalWrites, "conditional writes (If-None-Match, If-Match)"},
		{StoreNotFound, "s3://b", fmt.Errorf("%w: %w", ErrNoReadAfterWrite, checkpoint.ErrNotFound), "read-after-write"},
	} {
		if got := StoreFix(tc.reason, tc.url, tc.err); !strings.Contains(got, tc.want) {
			t.Errorf("StoreFix(%q, %q, %v) = %q; want it to contain %q", tc.reason, tc.url, tc.err, got, tc.want)
		}
	}
}

// faultyStore is a real file store whose small-object operations fail with err at the steps
// named in fail ("list", "write", "read", "delete"); it counts the probes that reach its list.
type faultyStore struct {
	checkpoint.Store
	url   string // what URL says, if not empty
	mu    sync.Mutex
	fail  map[string]error
	lists int
	// ignoreCond writes as if no condition was asked for.
	ignoreCond bool
	// denyListOf is a prefix whose list is denied (a policy that lets J/_spotguard/ be listed
	// alone).
	denyListOf string
}

func newFaultyStore(t *testing.T) *faultyStore {
	fsStore, err := checkpoint.NewFileStore(t.TempDir())
	if err != nil {
		t.Fatal(err)
	}
	return &faultyStore{Store: fsStore, fail: map[string]error{}}
}

func (s *faultyStore) URL() string {
	if s.url != "" {
		return s.url
	}
	return s.Store.URL()
}

func (s *faultyStore) set(step string, err error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if err == nil {
		delete(s.fail, step)
	} else {
		s.fail[step] = err
	}
}

func (s *faultyStore) err(step string) error {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.fail[step]
}

func (s *faultyStore) listCount() int {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.lists
}

func (s *faultyStore) ListDir(ctx context.Context, prefix string) ([]string, []checkpoint.ObjectInfo, error) {
	if strings.HasSuffix(prefix, "/"+checkpoint.MetaDir+"/") || prefix == checkpoint.MetaDir+"/" {
		s.mu.Lock()
		s.lists++ // one a probe
		s.mu.Unlock()
	}
	if err := s.err(ProbeList); err != nil {
		return nil, nil, err
	}
	if s.denyListOf != "" && prefix == s.denyListOf {
		return nil, nil, s3Err(403, "AccessDenied", "Access Denied")
	}
	return s.Store.ListDir(ctx, prefix)
}

func (s *faultyStore) PutBytes(ctx context.Context, key string, data []byte, cond checkpoint.Cond) (string, error) {
	if err := s.err(ProbeWrite); err != nil {
		return "", err
	}
	if cond.IfAbsent {
		if err := s.err(ProbeConditional); err != nil {
			return "", err
		}
		s.mu.Lock()
		ignore := s.ignoreCond
		s.mu.Unlock()
		if ignore {
			cond = checkpoint.Cond{}
		}
	}
	return s.Store.PutBytes(ctx, key, data, cond)
}

func (s *faultyStore) GetBytes(ctx context.Context, key string) ([]byte, string, error) {
	if err := s.err(ProbeRead); err != nil {
		return nil, "", err
	}
	return s.Store.GetBytes(ctx, key)
}

func (s *faultyStore) Delete(ctx context.Context, keys ...string) error {
	if err := s.err(ProbeDelete); err != nil {
		return err
	}
	return s.Store.Delete(ctx, keys...)
}

func TestProbeStore(t *testing.T) {
	ctx := t.Context()
	t.Run("passes and leaves nothing", func(t *testing.T) {
		s := newFaultyStore(t)
		p := ProbeStore(ctx, s, "job1", "i-0abc/host")
		if !p.OK() || p.Problem() != "" {
			t.Fatalf("ProbeStore = %+v; want OK", p)
		}
		if !strings.HasPrefix(p.Key, "job1/_spotguard/probe-i-0abc-host-") {
			t.Errorf("probe key %q; want job1/_spotguard/probe-<host>-<random>", p.Key)
		}
		if objs, err := s.List(ctx, "job1/"); err != nil || len(objs) != 0 {
			t.Errorf("after the probe the job holds %v (%v); want nothing", objs, err)
		}
		// The probe is not a checkpoint: the job has none.
		if cs, problems, err := checkpoint.ListCommitted(ctx, s, "job1"); err != nil || len(cs)+len(problems) != 0 {
			t.Errorf("ListCommitted after a probe = %v, %v, %v; want nothing", cs, problems, err)
		}
	})
	t.Run("deletes its own stale probes only", func(t *testing.T) {
		s := newFaultyStore(t)
		for _, k := range []string{"job1/_spotguard/probe-h1-old", "job1/_spotguard/probe-h2-old"} {
			if _, err := s.PutBytes(ctx, k, []byte("{}"), checkpoint.Cond{}); err != nil {
				t.Fatal(err)
			}
		}
		// Both are an hour old; only h1's is this host's.
		old := time.Now().Add(-time.Hour)
		os.Chtimes(s.pathOf(t, "job1/_spotguard/probe-h1-old"), old, old)
		os.Chtimes(s.pathOf(t, "job1/_spotguard/probe-h2-old"), old, old)
		if p := ProbeStore(ctx, s, "job1", "h1"); !p.OK() {
			t.Fatalf("ProbeStore = %+v", p)
		}
		objs, _ := s.List(ctx, "job1/")
		if len(objs) != 1 || objs[0].Key != "job1/_spotguard/probe-h2-old" {
			t.Errorf("after the probe: %v; want only the other host's probe", objs)
		}
	})
	// A server that refuses conditional writes, or ignores them, or does not read its own
	// writes, fails the probe saying so (found from outside: it passed, and no commit was ever
	// made, or LATEST could be moved back by two writers; and a lag was said a missing bucket).
	t.Run("refuses conditional writes", func(t *testing.T) {
		s := newFaultyStore(t)
		s.set(ProbeConditional, s3Err(501, "NotImplemented", "A header you provided implies functionality that is not implemented"))
		p := ProbeStore(ctx, s, "job1", "h")
		if p.Step != ProbeConditional || !strings.Contains(StoreFix(p.Reason, "s3://b", p.Err), "conditional writes") {
			t.Errorf("ProbeStore = step %q err %v; want the conditional write's, its fix naming conditional writes", p.Step, p.Err)
		}
		if objs, _ := s.List(ctx, "job1/"); len(objs) != 0 {
			t.Errorf("a failed probe left %v", objs)
		}
	})
	t.Run("ignores conditional writes", func(t *testing.T) {
		s := newFaultyStore(t)
		s.ignoreCond = true
		p := ProbeStore(ctx, s, "job1", "h")
		if p.Step != ProbeConditional || !errors.Is(p.Err, ErrNoConditionalWrites) || !strings.Contains(StoreFix(p.Reason, "s3://b", p.Err), "conditional writes") {
			t.Errorf("ProbeStore = step %q err %v; want ErrNoConditionalWrites at the conditional write", p.Step, p.Err)
		}
	})
	// A policy that denies the list restore makes: of the job's checkpoints, or of a
	// checkpoint's commits.
	for name, denied := range map[string]string{"may not list the job's checkpoints": "job1/", "may not list a checkpoint's commits": "job1/step-1/"} {
		t.Run(name, func(t *testing.T) {
			s := newFaultyStore(t)
			if _, err := s.PutBytes(ctx, "job1/step-1/c1/a.bin", []byte("a"), checkpoint.Cond{}); err != nil {
				t.Fatal(err)
			}
			s.denyListOf = denied
			p := ProbeStore(ctx, s, "job1", "h")
			if p.Step != ProbeList || p.Reason != StoreDenied || !strings.Contains(p.Problem(), "list "+denied+" failed") {
				t.Errorf("ProbeStore = step %q err %v (%s); want the list of %s denied", p.Step, p.Err, p.Problem(), denied)
			}
		})
	}
	t.Run("does not read its own writes", func(t *testing.T) {
		s := newFaultyStore(t)
		s.set(ProbeRead, fmt.Errorf("get %s: %w", "job1/_spotguard/probe", checkpoint.ErrNotFound))
		p := ProbeStore(ctx, s, "job1", "h")
		if fix := StoreFix(p.Reason, "s3://b", p.Err); p.Step != ProbeRead || !errors.Is(p.Err, ErrNoReadAfterWrite) || strings.Contains(fix, "does not exist") {
			t.Errorf("ProbeStore = step %q err %v, fix %q; want ErrNoReadAfterWrite at the read, not a missing bucket", p.Step, p.Err, fix)
		}
	})
	for _, step := range []string{ProbeList, ProbeWrite, ProbeRead, ProbeDelete} {
		t.Run("fails at "+step, func(t *testing.T) {
			s := newFaultyStore(t)
			s.set(step, s3Err(403, "AccessDenied", "Access Denied"))
			p := ProbeStore(ctx, s, "job1", "h")
			if p.OK() || p.Step != step || p.Reason != StoreDenied {
				t.Fatalf("ProbeStore = step %q reason %q err %v; want step %q reason denied", p.Step, p.Reason, p.Err, step)
			}
			if !strings.Contains(p.Problem(), "AccessDenied") || !strings.Contains(p.Problem(), "job job1") {
				t.Errorf("Problem() = %q; want the store, the job and the error code", p.Problem())
			}
			if step == ProbeRead { // the object written is removed all the same
				if objs, _ := s.List(ctx, "job1/"); len(objs) != 0 {
					t.Errorf("a failed read left %v", objs)
				}
			}
		})
	}
}

// pathOf is where the file store keeps key.
func (s *faultyStore) pathOf(t *testing.T, key string) string {
	t.Helper()
	return strings.TrimPrefix(s.Store.URL(), "file://") + "/" + key
}

// passFakeTime lets d pass on the bubble's fake clock and waits until every goroutine of the
// bubble is blocked again. Only inside synctest.Test.
func passFakeTime(d time.Duration) {
	<-time.After(d)
	synctest.Wait()
}

// The probe runs at start, every 5 minutes (± 10 %) while the store works, every 30 s while it
// fails, and soon after a kick, but never more than once per 10 s however many kicks come.
func TestStoreProbeSchedule(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		s := newFaultyStore(t)
		p := newStoreProber(s, "job1", func() string { return "h" }, zerolog.Nop())
		var results []StoreProbe
		var mu sync.Mutex
		p.onProbe = func(r StoreProbe) { mu.Lock(); results = append(results, r); mu.Unlock() }
		ctx, cancel := context.WithCancel(t.Context())
		done := make(chan error)
		go func() { done <- p.Run(ctx) }()

		synctest.Wait()
		if n := s.listCount(); n != 1 {
			t.Fatalf("probes at start = %d; want 1", n)
		}
		// A burst of failures right after that probe: one probe, 10 s after it.
		for range 100 {
			p.Kick()
		}
		passFakeTime(9 * time.Second)
		if n := s.listCount(); n != 1 {
			t.Errorf("probes 9 s after the start and 100 kicks = %d; want still 1 (10 s apart at least)", n)
		}
		passFakeTime(2 * time.Second)
		if n := s.listCount(); n != 2 {
			t.Errorf("probes 11 s after the start and 100 kicks = %d; want 2", n)
		}

		s.set(ProbeWrite, s3Err(404, "NoSuchBucket", "The specified bucket does not exist"))
		p.Kick() // 1 s after the last probe: the next comes 10 s after that one
		last := p.state().Last.At
		passFakeTime(time.Until(last.Add(9 * time.Second)))
		if n := s.listCount(); n != 2 {
			t.Errorf("probes 9 s after the last one = %d; want still 2", n)
		}
		passFakeTime(2 * time.Second)
		if n := s.listCount(); n != 3 {
			t.Errorf("probes 11 s after the last one and a kick = %d; want 3", n)
		}
		st := p.state()
		if st.Last.OK() || st.Last.Step != ProbeWrite || st.Last.Reason != StoreNotFound || st.Failures != 1 || st.FailingSince.IsZero() {
			t.Errorf("state after a failed probe = %+v; want failing at write with not_found", st)
		}

		// While failing: every 30 s ± 10 %, so a fixed store is seen soon.
		passFakeTime(time.Until(st.Last.At.Add(26 * time.Second)))
		if n := s.listCount(); n != 3 {
			t.Errorf("probes 26 s after the failure = %d; want 3", n)
		}
		s.set(ProbeWrite, nil)
		passFakeTime(8 * time.Second)
		if n := s.listCount(); n != 4 {
			t.Errorf("probes 34 s after the failure = %d; want 4", n)
		}
		st = p.state()
		if !st.Last.OK() || !st.FailingSince.IsZero() || st.LastOK.IsZero() || st.Probes != 4 {
			t.Errorf("state after recovery = %+v; want OK", st)
		}

		// While it works: every 5 minutes ± 10 %.
		passFakeTime(time.Until(st.Last.At.Add(4*time.Minute + 29*time.Second)))
		if n := s.listCount(); n != 4 {
			t.Errorf("probes 4.5 min after the last one = %d; want 4 (every 5 min ± 10 %%)", n)
		}
		passFakeTime(62 * time.Second)
		if n := s.listCount(); n != 5 {
			t.Errorf("probes 5.5 min after the last one = %d; want 5", n)
		}
		cancel()
		if err := <-done; err != nil {
			t.Errorf("Run() = %v; want nil", err)
		}
		mu.Lock()
		defer mu.Unlock()
		if len(results) != 5 {
			t.Errorf("onProbe called %d times; want 5", len(results))
		}
	})
}

// skewedStore is a file store whose listings give last-modified times d later: the clock of a
// store d ahead of this instance's (behind, for a negative d).
type skewedStore struct {
	checkpoint.Store
	d atomic.Int64
}

func (s *skewedStore) List(ctx context.Context, prefix string) ([]checkpoint.ObjectInfo, error) {
	objs, err := s.Store.List(ctx, prefix)
	for i := range objs {
		objs[i].LastModified = objs[i].LastModified.Add(time.Duration(s.d.Load()))
	}
	return objs, err
}

func TestClockOffset(t *testing.T) {
	at := func(s string) time.Time {
		v, err := time.Parse("15:04:05.000", s)
		if err != nil {
			t.Fatal(err)
		}
		return v
	}
	for _, tc := range []struct {
		modified, sent, written string
		want                    time.Duration
	}{
		{"12:00:00.000", "12:00:00.300", "12:00:00.500", 0},                               // within the second S3 rounds down to
		{"12:00:00.000", "11:59:59.900", "12:00:00.100", 0},                               // a round trip across it
		{"12:00:00.000", "11:59:50.000", "11:59:50.200", 9800 * time.Millisecond},         // this clock 9.8 s behind at least
		{"12:00:00.000", "12:00:10.000", "12:00:10.200", -9 * time.Second},                // 9 s ahead at least
		{"12:00:00.000", "11:00:00.000", "11:00:00.050", time.Hour - 50*time.Millisecond}, // an hour behind
	} {
		if got := clockOffset(at(tc.modified), at(tc.sent), at(tc.written)); got != tc.want {
			t.Errorf("clockOffset(%s, %s, %s) = %v; want %v", tc.modified, tc.sent, tc.written, got, tc.want)
		}
	}
}

// The probe tells how far this instance's clock is from the store's, by the last-modified time
// the store gives its probe object; the agent warns once when it is ClockWarn or more off, and
// says so when it agrees again.
func TestProbeStoreClockOffset(t *testing.T) {
	fsStore, err := checkpoint.NewFileStore(t.TempDir())
	if err != nil {
		t.Fatal(err)
	}
	s := &skewedStore{Store: fsStore}
	p := ProbeStore(t.Context(), s, "job1", "h")
	if !p.OK() || !p.ClockKnown || p.ClockOffset != 0 {
		t.Fatalf("a store on this clock: ProbeStore = ok %v, known %v, offset %v; want ok, known, 0", p.OK(), p.ClockKnown, p.ClockOffset)
	}
	for _, d := range []time.Duration{time.Hour, -time.Hour} {
		s.d.Store(int64(d))
		p := ProbeStore(t.Context(), s, "job1", "h")
		if !p.OK() || !p.ClockKnown || (p.ClockOffset-d).Abs() > 2*time.Second {
			t.Errorf("a store %v off: ProbeStore = ok %v, known %v, offset %v; want ok, known, about %v", d, p.OK(), p.ClockKnown, p.ClockOffset, d)
		}
	}

	var logs syncBuffer
	s.d.Store(int64(time.Hour))
	pr := newStoreProber(s, "job1", func() string { return "h" }, zerolog.New(&logs))
	pr.Check(t.Context())
	pr.Check(t.Context())
	const warn = "this instance's clock is off from the store's (negative clock_behind_s: ahead): commits are ordered by the clock of the instance that writes them"
	if n := strings.Count(logs.String(), warn); n != 1 || !strings.Contains(logs.String(), `"level":"warn"`) {
		t.Errorf("two probes an hour off logged the warning %d times; want once, at warn level:\n%s", n, logs.String())
	}
	s.d.Store(0)
	pr.Check(t.Context())
	if !strings.Contains(logs.String(), "this instance's clock agrees with the store's again") {
		t.Errorf("no line when the clock agrees again:\n%s", logs.String())
	}
}

// /healthz warns of a clock off from the store's while it is (found from outside: said only in
// the log, where fleet monitoring does not look).
func TestHealthzWarnsOfAClockOffFromTheStores(t *testing.T) {
	fsStore, err := checkpoint.NewFileStore(t.TempDir())
	if err != nil {
		t.Fatal(err)
	}
	s := &skewedStore{Store: fsStore}
	s.d.Store(int64(2 * time.Hour))
	a := newStoreAgent(t, s, &syncBuffer{})
	a.store.prober.Check(t.Context())
	v := a.health(time.Now())
	if w := strings.Join(v.Warnings, "\n"); !v.Healthy || !strings.Contains(w, "this instance's clock is 2h0m0s behind the store's") || !strings.Contains(w, "chronyc") {
		t.Errorf("health with the clock 2 h behind the store's: healthy %v, warnings %q; want healthy, warned, with the fix", v.Healthy, v.Warnings)
	}
	s.d.Store(0)
	a.store.prober.Check(t.Context())
	if v := a.health(time.Now()); strings.Contains(strings.Join(v.Warnings, "\n"), "clock") {
		t.Errorf("health once the clock agrees: warnings %q; want no clock warning", v.Warnings)
	}
}

// An endpoint with a path puts the path before the bucket: a server not served under it answers
// NoSuchBucket for a bucket that exists, and the fix said to create it (found from outside).
func TestStoreFixNamesAnEndpointWithAPath(t *testing.T) {
	err := s3Err(404, "NoSuchBucket", "The specified bucket does not exist")
	t.Setenv("AWS_ENDPOINT_URL", "")
	t.Setenv("AWS_ENDPOINT_URL_S3", "http://127.0.0.1:9000/some/path")
	if got := StoreFix(StoreNotFound, "s3://ckpt/runs", err); !strings.Contains(got, "AWS_ENDPOINT_URL_S3=http://127.0.0.1:9000/some/path has a path (/some/path)") {
		t.Errorf("StoreFix with an endpoint with a path = %q; want it named", got)
	}
	for _, endpoint := range []string{"http://127.0.0.1:9000", "http://127.0.0.1:9000/"} {
		t.Setenv("AWS_ENDPOINT_URL_S3", endpoint)
		if got := StoreFix(StoreNotFound, "s3://ckpt/runs", err); !strings.Contains(got, "the bucket ckpt does not exist") {
			t.Errorf("StoreFix with endpoint %s = %q; want the bucket said not to exist", endpoint, got)
		}
	}
	t.Setenv("AWS_ENDPOINT_URL_S3", "")
	t.Setenv("AWS_ENDPOINT_URL", "https://s3.example/prefix")
	if got := StoreFix(StoreNotFound, "s3://ckpt/runs", err); !strings.Contains(got, "AWS_ENDPOINT_URL=https://s3.example/prefix has a path") {
		t.Errorf("StoreFix with AWS_ENDPOINT_URL with a path = %q; want it named", got)
	}
}

// No credentials behind a proxy whose NO_PROXY leaves out IMDS: the fix names NO_PROXY (found from
// outside: the notices bypass the proxy, the SDK's credentials did not, and the fix said to attach
// an instance profile, which was attached).
func TestStoreFixNamesNoProxyForCredentials(t *testing.T) {
	err := errors.New("get credentials: failed to refresh cached credentials, no EC2 IMDS role found")
	for _, k := range []string{"HTTPS_PROXY", "https_proxy", "HTTP_PROXY", "http_proxy", "NO_PROXY", "no_proxy"} {
		t.Setenv(k, "")
	}
	if got := StoreFix(StoreDenied, "s3://b/runs", err); !strings.Contains(got, "attach an instance profile") {
		t.Errorf("StoreFix without a proxy = %q; want the instance profile", got)
	}
	t.Setenv("HTTPS_PROXY", "http://proxy.internal:3128")
	if got := StoreFix(StoreDenied, "s3://b/runs", err); !strings.Contains(got, "add NO_PROXY=169.254.169.254") {
		t.Errorf("StoreFix behind a proxy = %q; want NO_PROXY named", got)
	}
	t.Setenv("NO_PROXY", "localhost, 169.254.169.254")
	if got := StoreFix(StoreDenied, "s3://b/runs", err); !strings.Contains(got, "attach an instance profile") {
		t.Errorf("StoreFix behind a proxy that IMDS bypasses = %q; want the instance profile", got)
	}
}
