package metrics

import (
	"bufio"
	"bytes"
	"compress/gzip"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"sort"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/aws/aws-sdk-go-v2/aws"
	"github.com/aws/aws-sdk-go-v2/credentials"
	"github.com/aws/aws-sdk-go-v2/service/cloudwatch"
	"github.com/aws/smithy-go/encoding/cbor"
	"go.uber.org/goleak"
)

func TestMain(m *testing.M) {
	goleak.VerifyTestMain(m)
}

// logBuffer collects zerolog JSON output; it is safe for concurrent use.
type logBuffer struct {
	mu sync.Mutex
	b  bytes.Buffer
}

func (l *logBuffer) Write(p []byte) (int, error) {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.b.Write(p)
}

// lines returns the parsed log lines with the given level and message.
func (l *logBuffer) lines(t testing.TB, level, msg string) []map[string]any {
	t.Helper()
	l.mu.Lock()
	defer l.mu.Unlock()
	var out []map[string]any
	sc := bufio.NewScanner(bytes.NewReader(l.b.Bytes()))
	for sc.Scan() {
		var m map[string]any
		if err := json.Unmarshal(sc.Bytes(), &m); err != nil {
			t.Fatalf("log line %q is not JSON: %v", sc.Text(), err)
		}
		if m["level"] == level && m["message"] == msg {
			out = append(out, m)
		}
	}
	return out
}

func (l *logBuffer) String() string {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.b.String()
}

// reply is what the fake endpoint answers to one call.
type reply struct {
	status int               // 0 means 200
	header map[string]string // extra response headers
	body   []byte            // response body; nil means empty
	hang   bool              // wait until the client gives up instead
}

// replies for the error cases, as CloudWatch's rpc-v2-cbor answers look: a CBOR map with
// __type (the shape id) and message, and, CloudWatch being awsQueryCompatible, the
// X-Amzn-Query-Error header with the query error code that the SDK reports.
func cborError(status int, typ, queryCode, msg string) reply {
	h := map[string]string{"Content-Type": "application/cbor", "Smithy-Protocol": "rpc-v2-cbor"}
	if queryCode != "" {
		h["X-Amzn-Query-Error"] = queryCode + ";Sender"
	}
	return reply{
		status: status,
		header: h,
		body:   cbor.Encode(cbor.Map{"__type": cbor.String(typ), "message": cbor.String(msg)}),
	}
}

var (
	replyOK         = reply{}
	replyThrottling = cborError(400, "com.amazonaws.cloudwatch#ThrottlingException", "Throttling", "Rate exceeded")
	replyUnavail    = reply{status: 503}
	replyInternal   = cborError(500, "com.amazonaws.cloudwatch#InternalServiceFault", "", "internal failure")
	replyInvalid    = cborError(400, "com.amazonaws.cloudwatch#InvalidParameterValueException", "InvalidParameterValue", "bad value")
	replyBadToken   = cborError(403, "com.amazonaws.cloudwatch#UnrecognizedClientException", "UnrecognizedClientException", "The security token included in the request is invalid.")
	replyHang       = reply{hang: true}
)

// gotDatum is one decoded MetricDatum.
type gotDatum struct {
	Name  string
	Unit  string
	Dims  map[string]string
	Value *float64
	Stats *[4]float64 // SampleCount, Sum, Minimum, Maximum
	Res   int         // StorageResolution, 0 when absent
	At    time.Time   // Timestamp, zero when absent
}

func (d gotDatum) String() string {
	var v string
	switch {
	case d.Value != nil:
		v = fmt.Sprint(*d.Value)
	case d.Stats != nil:
		v = fmt.Sprint(*d.Stats)
	}
	keys := make([]string, 0, len(d.Dims))
	for k, dv := range d.Dims {
		keys = append(keys, k+"="+dv)
	}
	sort.Strings(keys)
	return fmt.Sprintf("{%s %s [%s] %s res=%d at=%s}", d.Name, d.Unit, strings.Join(keys, ","), v,
		d.Res, d.At.UTC().Format(time.RFC3339Nano))
}

// gotCall is one PutMetricData request as the fake endpoint saw it.
type gotCall struct {
	Start, End      time.Time // when the handler began and finished
	Path            string
	Protocol        string // Smithy-Protocol header
	ContentType     string
	ContentEncoding string
	QueryMode       string // X-Amzn-Query-Mode header
	Signed          bool   // an Authorization header was present
	WireBytes       int    // body as sent
	BodyBytes       int    // body after gunzip
	Namespace       string
	Data            []gotDatum
	DecodeErr       error
	Reply           reply
}

// fakeCW is a fake CloudWatch endpoint: it decodes each PutMetricData request (gunzipping
// when asked) with smithy-go's CBOR decoder and answers as respond says for the n-th call
// begun (from 0); nil respond answers 200 with an empty body.
type fakeCW struct {
	notify chan struct{} // one send per finished call (dropped when full)

	mu      sync.Mutex
	respond func(n int) reply
	started int       // calls begun
	calls   []gotCall // calls finished, in the order they finished
}

func newFakeCW(respond func(n int) reply) *fakeCW {
	return &fakeCW{respond: respond, notify: make(chan struct{}, 10000)}
}

func (f *fakeCW) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	c := gotCall{
		Start:           time.Now(),
		Path:            r.URL.Path,
		Protocol:        r.Header.Get("Smithy-Protocol"),
		ContentType:     r.Header.Get("Content-Type"),
		ContentEncoding: r.Header.Get("Content-Encoding"),
		QueryMode:       r.Header.Get("X-Amzn-Query-Mode"),
		Signed:          r.Header.Get("Authorization") != "",
	}
	raw, err := io.ReadAll(r.Body)
	c.WireBytes = len(raw)
	body := raw
	if err == nil && c.ContentEncoding == "gzip" {
		var zr *gzip.Reader
		if zr, err = gzip.NewReader(bytes.NewReader(raw)); err == nil {
			body, err = io.ReadAll(zr)
		}
	}
	c.BodyBytes = len(body)
	if err == nil {
		c.Namespace, c.Data, err = decodePut(body)
	}
	c.DecodeErr = err

	f.mu.Lock()
	n := f.started
	f.started++
	respond := f.respond
	f.mu.Unlock()
	rep := replyOK
	if respond != nil {
		rep = respond(n)
	}
	c.Reply = rep
	if rep.hang {
		<-r.Context().Done()
	} else {
		for k, v := range rep.header {
			w.Header().Set(k, v)
		}
		w.WriteHeader(cmpOr(rep.status, http.StatusOK))
		_, _ = w.Write(rep.body)
	}
	c.End = time.Now()
	f.mu.Lock()
	f.calls = append(f.calls, c)
	f.mu.Unlock()
	select {
	case f.notify <- struct{}{}:
	default:
	}
}

func cmpOr(a, b int) int {
	if a != 0 {
		return a
	}
	return b
}

// setRespond replaces the answers.
func (f *fakeCW) setRespond(respond func(n int) reply) {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.respond = respond
}

// got returns the calls so far.
func (f *fakeCW) got() []gotCall {
	f.mu.Lock()
	defer f.mu.Unlock()
	return append([]gotCall(nil), f.calls...)
}

// waitCalls waits (real time, at most 10 s) until the endpoint has finished n calls.
func (f *fakeCW) waitCalls(t *testing.T, n int) []gotCall {
	t.Helper()
	deadline := time.NewTimer(10 * time.Second)
	defer deadline.Stop()
	for {
		if got := f.got(); len(got) >= n {
			return got
		}
		select {
		case <-f.notify:
		case <-deadline.C:
			t.Fatalf("endpoint got %d calls in 10 s; want %d", len(f.got()), n)
		}
	}
}

// decodePut decodes a PutMetricData body into the namespace and the datums.
func decodePut(body []byte) (string, []gotDatum, error) {
	v, err := cbor.Decode(body)
	if err != nil {
		return "", nil, fmt.Errorf("cbor decode: %w", err)
	}
	m, ok := v.(cbor.Map)
	if !ok {
		return "", nil, fmt.Errorf("body is %T, want map", v)
	}
	ns, _ := m["Namespace"].(cbor.String)
	list, ok := m["MetricData"].(cbor.List)
	if !ok {
		return "", nil, fmt.Errorf("MetricData is %T, want list", m["MetricData"])
	}
	var out []gotDatum
	for _, item := range list {
		dm, ok := item.(cbor.Map)
		if !ok {
			return "", nil, fmt.Errorf("datum is %T, want map", item)
		}
		var d gotDatum
		for k, fv := range dm {
			switch k {
			case "MetricName":
				d.Name = string(fv.(cbor.String))
			case "Unit":
				d.Unit = string(fv.(cbor.String))
			case "Value":
				x, err := cbor.AsFloat64(fv)
				if err != nil {
					return "", nil, fmt.Errorf("Value: %w", err)
				}
				d.Value = &x
			case "StorageResolution":
				x, err := cbor.AsInt64(fv)
				if err != nil {
					return "", nil, fmt.Errorf("StorageResolution: %w", err)
				}
				d.Res = int(x)
			case "Timestamp":
				if d.At, err = cbor.AsTime(fv); err != nil {
					return "", nil, fmt.Errorf("Timestamp: %w", err)
				}
				d.At = d.At.UTC()
			case "Dimensions":
				d.Dims = map[string]string{}
				for _, dv := range fv.(cbor.List) {
					dd := dv.(cbor.Map)
					d.Dims[string(dd["Name"].(cbor.String))] = string(dd["Value"].(cbor.String))
				}
			case "StatisticValues":
				sm := fv.(cbor.Map)
				var st [4]float64
				for i, name := range []string{"SampleCount", "Sum", "Minimum", "Maximum"} {
					if st[i], err = cbor.AsFloat64(sm[name]); err != nil {
						return "", nil, fmt.Errorf("StatisticValues.%s: %w", name, err)
					}
				}
				d.Stats = &st
			default:
				return "", nil, fmt.Errorf("unexpected datum member %q", k)
			}
		}
		out = append(out, d)
	}
	return string(ns), out, nil
}

// doer serves the SDK's requests in memory with a handler, so that tests in a synctest
// bubble can use the real SDK client (a real socket would keep the bubble from ever being
// idle). The handler sees the request's context, so a hanging handler ends when the SDK
// gives up.
type doer struct{ h http.Handler }

func (d doer) Do(r *http.Request) (*http.Response, error) {
	rec := httptest.NewRecorder()
	d.h.ServeHTTP(rec, r)
	if err := r.Context().Err(); err != nil {
		return nil, err
	}
	return rec.Result(), nil
}

// testCredentials are static credentials for the fake endpoint.
var testCredentials = credentials.NewStaticCredentialsProvider("AKIDTEST", "SECRETTEST", "")

// sdkOptions are the client options of the tests: region, static credentials, and
// compression from 10240 bytes as config.LoadDefaultConfig sets it.
func sdkOptions(endpoint string) cloudwatch.Options {
	return cloudwatch.Options{
		Region:                      "us-east-1",
		Credentials:                 testCredentials,
		BaseEndpoint:                aws.String(endpoint),
		RequestMinCompressSizeBytes: 10240,
	}
}

// serverClient starts f on a 127.0.0.1 httptest server and returns a real SDK client for it.
func serverClient(t *testing.T, f *fakeCW) *cloudwatch.Client {
	t.Helper()
	srv := httptest.NewServer(f)
	tr := http.DefaultTransport.(*http.Transport).Clone()
	t.Cleanup(func() {
		tr.CloseIdleConnections()
		srv.Close()
	})
	o := sdkOptions(srv.URL)
	o.HTTPClient = &http.Client{Transport: tr}
	return cloudwatch.New(o)
}

// memClient returns a real SDK client that reaches f in memory (for synctest bubbles).
func memClient(f http.Handler, opts ...func(*cloudwatch.Options)) *cloudwatch.Client {
	o := sdkOptions("http://cloudwatch.test")
	o.HTTPClient = doer{f}
	for _, fn := range opts {
		fn(&o)
	}
	return cloudwatch.New(o)
}

// testBase is the base dimensions of the tests; AvailabilityZone is empty and skipped.
func testBase() map[string]string {
	return map[string]string{"InstanceId": "i-0123456789abcdef0", "InstanceType": "p5.48xlarge", "AvailabilityZone": ""}
}

// baseWith returns the base dimensions plus kv pairs.
func baseWith(kv ...string) map[string]string {
	m := map[string]string{"InstanceId": "i-0123456789abcdef0", "InstanceType": "p5.48xlarge"}
	for i := 0; i+1 < len(kv); i += 2 {
		m[kv[i]] = kv[i+1]
	}
	return m
}

// startRun runs c.Run in a goroutine and returns a stop function that cancels it and
// returns Run's error; the test fails if Run is still running at cleanup.
func startRun(t *testing.T, c *CloudWatch) (stop func() error) {
	t.Helper()
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- c.Run(ctx) }()
	var once sync.Once
	var err error
	stop = func() error {
		once.Do(func() {
			cancel()
			err = <-done
		})
		return err
	}
	t.Cleanup(func() { _ = stop() })
	return stop
}

func f64(v float64) *float64 { return &v }

// advance moves a synctest bubble's fake clock on by d (the bubble's goroutines run until they
// are durably blocked, and the timers due by then fire); no real time passes. Use it only inside
// synctest.Test.
func advance(d time.Duration) { <-time.After(d) }

// waitSent waits (polling, at most 10 s) until c has sent n samples: a notice flush done, before
// a stop would cut it.
func waitSent(t *testing.T, c *CloudWatch, n uint64) {
	t.Helper()
	for deadline := time.Now().Add(10 * time.Second); c.Stats().SentSamples < n; <-time.After(5 * time.Millisecond) {
		if time.Now().After(deadline) {
			t.Fatalf("Got(Stats) = %+v after 10 s; want %d samples sent", c.Stats(), n)
		}
	}
}
