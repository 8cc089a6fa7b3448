package metrics

import (
	"context"
	"errors"
	"fmt"
	"io"
	"math"
	"net/http"
	"reflect"
	"slices"
	"strings"
	"sync"
	"testing"
	"testing/synctest"
	"time"

	"github.com/aws/aws-sdk-go-v2/aws"
	"github.com/aws/aws-sdk-go-v2/credentials/ec2rolecreds"
	"github.com/aws/aws-sdk-go-v2/feature/ec2/imds"
	"github.com/aws/aws-sdk-go-v2/service/cloudwatch"
	"github.com/aws/smithy-go/encoding/cbor"
	"github.com/rs/zerolog"
)

// TestWireFormat sends a mix of notice and regular datums through the real SDK client to
// the fake endpoint on 127.0.0.1 and checks the request as CloudWatch would see it.
func TestWireFormat(t *testing.T) {
	f := newFakeCW(nil)
	var logs logBuffer
	c := NewCloudWatch(serverClient(t, f), CloudWatchConfig{
		Interval: time.Hour, // only FlushNow sends
		Base:     testBase,
		Logger:   zerolog.New(&logs),
	})
	stop := startRun(t, c)

	t0 := time.Now().UTC().Truncate(time.Second).Add(-time.Minute)
	gpu0 := map[string]string{"GPU": "0"}
	c.Record(
		Datum{Name: "GPUSMClockMHz", Unit: UnitNone, Value: 1980, Dimensions: gpu0, At: t0},
		Datum{Name: "GPUSMClockMHz", Unit: UnitNone, Value: 1410, Dimensions: gpu0, At: t0.Add(5 * time.Second)},
		Datum{Name: "NoticeToDurableSeconds", Unit: UnitSeconds, Value: 41.5, Dimensions: map[string]string{"Source": "spot"},
			At: t0.Add(30*time.Second + 250*time.Millisecond), HighRes: true},
		Datum{Name: "GPUSMClockMHz", Value: 1755, Dimensions: gpu0, At: t0.Add(10 * time.Second)}, // "" is None: same series
		Datum{Name: "GPUSMClockMHz", Unit: UnitNone, Value: 1980, Dimensions: map[string]string{"GPU": "1"}, At: t0.Add(10 * time.Second)},
		Datum{Name: "IMDSErrors", Unit: UnitCount, Value: 1, At: t0.Add(time.Second)},
		Datum{Name: "IMDSErrors", Unit: UnitCount, Value: 0, At: t0.Add(2 * time.Second)},
		Datum{Name: "DeadlineMarginSeconds", Unit: UnitSeconds, Value: 78.5, Dimensions: map[string]string{"Source": "spot"},
			At: t0.Add(31 * time.Second), HighRes: true},
		Datum{Name: "UploadThroughput", Unit: UnitBytesPerSecond, Value: 2.5e9, At: t0.Add(20 * time.Second)},
	)
	gpu0["GPU"] = "7" // Record copied the map
	c.FlushNow()
	calls := f.waitCalls(t, 1)
	waitSent(t, c, 1) // its answer in: a stop would cut it
	if err := stop(); err != nil {
		t.Fatalf("Run() = %v; want nil", err)
	}
	if got := f.got(); len(got) != 1 {
		t.Fatalf("endpoint got %d calls; want 1 (nothing left for the final flush)", len(got))
	}
	call := calls[0]
	if call.DecodeErr != nil {
		t.Fatalf("decode request: %v", call.DecodeErr)
	}
	for _, h := range []struct{ name, got, want string }{
		{"path", call.Path, "/service/GraniteServiceVersion20100801/operation/PutMetricData"},
		{"Smithy-Protocol", call.Protocol, "rpc-v2-cbor"},
		{"Content-Type", call.ContentType, "application/cbor"},
		{"X-Amzn-Query-Mode", call.QueryMode, "true"},
		{"Content-Encoding", call.ContentEncoding, ""}, // under 10240 bytes: not gzipped
		{"Namespace", call.Namespace, "SpotGuard"},
	} {
		if h.got != h.want {
			t.Errorf("Got(%s) = %q; want %q", h.name, h.got, h.want)
		}
	}
	if !call.Signed {
		t.Errorf("request has no Authorization header; want SigV4")
	}

	base := func(kv ...string) map[string]string { return baseWith(kv...) }
	want := []gotDatum{
		// HighRes first, in the order recorded, one each, resolution 1, own time.
		{Name: "NoticeToDurableSeconds", Unit: "Seconds", Dims: base("Source", "spot"), Value: f64(41.5), Res: 1,
			At: t0.Add(30*time.Second + 250*time.Millisecond)},
		{Name: "DeadlineMarginSeconds", Unit: "Seconds", Dims: base("Source", "spot"), Value: f64(78.5), Res: 1,
			At: t0.Add(31 * time.Second)},
		// Then one per series, sorted: a statistic set for several samples, a value for one,
		// stamped with the newest sample.
		{Name: "GPUSMClockMHz", Unit: "None", Dims: base("GPU", "0"), Stats: &[4]float64{3, 1980 + 1410 + 1755, 1410, 1980},
			At: t0.Add(10 * time.Second)},
		{Name: "GPUSMClockMHz", Unit: "None", Dims: base("GPU", "1"), Value: f64(1980), At: t0.Add(10 * time.Second)},
		{Name: "IMDSErrors", Unit: "Count", Dims: base(), Stats: &[4]float64{2, 1, 0, 1}, At: t0.Add(2 * time.Second)},
		{Name: "UploadThroughput", Unit: "Bytes/Second", Dims: base(), Value: f64(2.5e9), At: t0.Add(20 * time.Second)},
	}
	if !reflect.DeepEqual(call.Data, want) {
		t.Errorf("Got(datums) =\n%s\nwant\n%s", fmtData(call.Data), fmtData(want))
	}

	st := c.Stats()
	wantSt := Stats{Recorded: 9, Calls: 1, Sent: 6, SentSamples: 9}
	if st != wantSt {
		t.Errorf("Got(Stats) = %+v; want %+v", st, wantSt)
	}
	if s := logs.String(); strings.Contains(s, `"level":"warn"`) {
		t.Errorf("unexpected warnings:\n%s", s)
	}
}

func fmtData(ds []gotDatum) string {
	var b strings.Builder
	for _, d := range ds {
		fmt.Fprintf(&b, "  %v\n", d)
	}
	return b.String()
}

// TestBatchSplit checks the per-call limits: at most 1000 datums and at most 1 MB of body
// (by the real SDK's encoding), every datum delivered once, big bodies gzipped.
func TestBatchSplit(t *testing.T) {
	tests := []struct {
		name      string
		series    int
		ownDims   int   // own dimensions per datum besides the series id
		valueLen  int   // length of each own dimension value
		wantCalls []int // datums per call
	}{
		{name: "2500 series by count", series: 2500, wantCalls: []int{1000, 1000, 500}},
		{name: "100 wide series by size", series: 100, ownDims: 27, valueLen: 1000, wantCalls: []int{35, 35, 30}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			f := newFakeCW(nil)
			// The notice flush's 2 s per call is not what this tests: under -race on a loaded
			// machine, encoding and gzipping a call of nearly 1 MB took longer, and the call
			// was cut and sent again (a fourth call; seen in CI).
			c := NewCloudWatch(serverClient(t, f), CloudWatchConfig{Interval: time.Hour, Base: testBase, NoticeCallTimeout: time.Minute})
			stop := startRun(t, c)
			for i := range tt.series {
				dims := map[string]string{"Series": fmt.Sprint(i)}
				for j := range tt.ownDims {
					dims[fmt.Sprintf("Dim%02d", j)] = strings.Repeat(string(rune('a'+j%26)), tt.valueLen)
				}
				c.Record(Datum{Name: "Series", Unit: UnitCount, Value: float64(i), Dimensions: dims})
			}
			c.FlushNow()
			waitSent(t, c, uint64(tt.series)) // a stop would cut the notice flush
			if err := stop(); err != nil {
				t.Fatalf("Run() = %v; want nil", err)
			}
			calls := f.got()
			var sizes []int
			seen := make(map[string]int)
			for i, call := range calls {
				if call.DecodeErr != nil {
					t.Fatalf("call %d: decode: %v", i, call.DecodeErr)
				}
				sizes = append(sizes, len(call.Data))
				if len(call.Data) > MaxDatumsPerCall {
					t.Errorf("call %d has %d datums; want at most %d", i, len(call.Data), MaxDatumsPerCall)
				}
				if call.BodyBytes > MaxCallBytes {
					t.Errorf("call %d body is %d bytes; want at most %d", i, call.BodyBytes, MaxCallBytes)
				}
				if wantGzip := call.BodyBytes >= 10240; (call.ContentEncoding == "gzip") != wantGzip {
					t.Errorf("call %d: Content-Encoding %q for %d bytes; want gzip=%v", i, call.ContentEncoding, call.BodyBytes, wantGzip)
				}
				for _, d := range call.Data {
					seen[d.Dims["Series"]]++
					if len(d.Dims) != 3+tt.ownDims {
						t.Fatalf("datum has %d dimensions; want %d", len(d.Dims), 3+tt.ownDims)
					}
				}
				t.Logf("call %d: %d datums, %d bytes (%d on the wire, %s)", i, len(call.Data), call.BodyBytes, call.WireBytes, call.ContentEncoding)
			}
			if !slices.Equal(sizes, tt.wantCalls) {
				t.Errorf("Got(datums per call) = %v; want %v", sizes, tt.wantCalls)
			}
			if len(seen) != tt.series {
				t.Errorf("endpoint saw %d distinct series; want %d", len(seen), tt.series)
			}
			for k, n := range seen {
				if n != 1 {
					t.Fatalf("series %s sent %d times; want 1", k, n)
				}
			}
			if st := c.Stats(); st.SentSamples != uint64(tt.series) || st.Calls != uint64(len(calls)) {
				t.Errorf("Got(Stats) = %+v; want %d samples in %d calls", st, tt.series, len(calls))
			}
		})
	}
}

// TestPayloadEstimateIsUpperBound checks that the size estimate used for batching is at
// least what the SDK really sends, for the smallest and the largest datums.
func TestPayloadEstimateIsUpperBound(t *testing.T) {
	long := func(c byte, n int) string { return strings.Repeat(string(c), n) }
	wide := map[string]string{}
	for i := range maxDimensions - 2 { // plus the two base dimensions
		wide[fmt.Sprintf("%02d", i)+long('k', 253)] = long('v', maxDimValueLen)
	}
	tests := []struct {
		name string
		hi   []Datum
		lo   []Datum
	}{
		{name: "small value", lo: []Datum{{Name: "A", Value: 1}}},
		{name: "small notice", hi: []Datum{{Name: "A", Value: 1.5, HighRes: true}}},
		{name: "statistic sets", lo: repeat(50, func(i int) Datum {
			return Datum{Name: "GPUSMClockMHz", Unit: UnitNone, Value: float64(i) + 0.1, Dimensions: map[string]string{"GPU": fmt.Sprint(i % 8)}}
		})},
		{name: "widest notice", hi: repeat(3, func(i int) Datum {
			return Datum{Name: long('n', maxNameLen), Unit: UnitGigabytesPerSecond, Value: -math.MaxFloat64 / 1e200, Dimensions: wide, HighRes: true}
		})},
		{name: "widest statistic set", lo: repeat(6, func(i int) Datum {
			return Datum{Name: long('n', maxNameLen), Unit: UnitGigabytesPerSecond, Value: float64(i) * 1e100, Dimensions: wide}
		})},
	}
	f := newFakeCW(nil)
	c := NewCloudWatch(memClient(f), CloudWatchConfig{})
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			for i := range tt.hi {
				tt.hi[i].At = time.Now()
			}
			for i := range tt.lo {
				tt.lo[i].At = time.Now()
			}
			base, _ := baseDims(testBase())
			b := build(tt.hi, tt.lo, base, nil)
			if b.invalid != 0 || len(b.batches) != 1 {
				t.Fatalf("build: %d invalid (%v), %d batches; want 0, 1", b.invalid, b.firstErr, len(b.batches))
			}
			before := len(f.got())
			if err := c.put(t.Context(), modePeriodic, &b.batches[0]); err != nil {
				t.Fatalf("put: %v", err)
			}
			call := f.got()[before]
			if call.DecodeErr != nil {
				t.Fatalf("decode: %v", call.DecodeErr)
			}
			est := b.batches[0].size
			if call.BodyBytes > est {
				t.Errorf("body is %d bytes; estimate %d is below it", call.BodyBytes, est)
			}
			t.Logf("%d datums: body %d bytes, estimate %d (%.2fx)", len(call.Data), call.BodyBytes, est, float64(est)/float64(call.BodyBytes))
		})
	}
}

func repeat(n int, fn func(i int) Datum) []Datum {
	out := make([]Datum, n)
	for i := range out {
		out[i] = fn(i)
	}
	return out
}

// TestNoticeFlushRetries checks a notice flush against failing endpoints, in fake time: it
// starts at once, retries throttling, 5xx and hung attempts (each cut by
// NoticeCallTimeout) at most NoticeRetries times, and does not retry the rest.
func TestNoticeFlushRetries(t *testing.T) {
	const ms = time.Millisecond
	tests := []struct {
		name      string
		replies   []reply // for calls 0, 1, …; the last one repeats
		wantCalls int
		wantSent  bool
		// the last call ends within [minEnd, maxEnd] after FlushNow: backoffs are 50–100 ms,
		// 100–200 ms and 200–400 ms
		minEnd, maxEnd time.Duration
	}{
		{name: "ok", replies: []reply{replyOK}, wantCalls: 1, wantSent: true},
		{name: "throttling twice", replies: []reply{replyThrottling, replyThrottling, replyOK}, wantCalls: 3, wantSent: true, minEnd: 150 * ms, maxEnd: 300 * ms},
		{name: "503 once", replies: []reply{replyUnavail, replyOK}, wantCalls: 2, wantSent: true, minEnd: 50 * ms, maxEnd: 100 * ms},
		{name: "500 once", replies: []reply{replyInternal, replyOK}, wantCalls: 2, wantSent: true, minEnd: 50 * ms, maxEnd: 100 * ms},
		{name: "hang once", replies: []reply{replyHang, replyOK}, wantCalls: 2, wantSent: true, minEnd: 2050 * ms, maxEnd: 2100 * ms},
		{name: "throttling always", replies: []reply{replyThrottling}, wantCalls: 4, minEnd: 350 * ms, maxEnd: 700 * ms},
		{name: "hang always", replies: []reply{replyHang}, wantCalls: 4, minEnd: 8350 * ms, maxEnd: 8700 * ms},
		{name: "invalid parameter", replies: []reply{replyInvalid}, wantCalls: 1},
		{name: "bad token", replies: []reply{replyBadToken}, wantCalls: 1},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			synctest.Test(t, func(t *testing.T) {
				f := newFakeCW(func(n int) reply { return tt.replies[min(n, len(tt.replies)-1)] })
				c := NewCloudWatch(memClient(f), CloudWatchConfig{Interval: time.Hour, Base: testBase})
				stop := startRun(t, c)
				c.Record(
					Datum{Name: "NoticeToSignalSeconds", Unit: UnitSeconds, Value: 0.004, HighRes: true},
					Datum{Name: "GPUSMClockMHz", Value: 1980, Dimensions: map[string]string{"GPU": "0"}},
				)
				start := time.Now()
				c.FlushNow()
				advance(time.Minute) // fake time: far past every retry
				calls := f.got()
				if len(calls) != tt.wantCalls {
					t.Fatalf("endpoint got %d calls; want %d", len(calls), tt.wantCalls)
				}
				if d := calls[0].Start.Sub(start); d != 0 {
					t.Errorf("first call began %v after FlushNow; want at once", d)
				}
				if end := calls[len(calls)-1].End.Sub(start); end < tt.minEnd || end > tt.maxEnd {
					t.Errorf("last call ended %v after FlushNow; want within [%v, %v]", end, tt.minEnd, tt.maxEnd)
				}
				for i, call := range calls {
					if len(call.Data) != 2 || call.Data[0].Res != 1 {
						t.Errorf("call %d sent %v; want the notice datum at resolution 1 and the GPU datum", i, call.Data)
					}
				}
				st := c.Stats()
				want := Stats{Recorded: 2, Calls: uint64(tt.wantCalls), Errors: uint64(tt.wantCalls)}
				if tt.wantSent {
					want.Errors--
					want.Sent, want.SentSamples = 2, 2
				} else {
					want.DroppedFailed = 2
				}
				want.LastError, want.LastErrorAt = st.LastError, st.LastErrorAt
				if st != want {
					t.Errorf("Got(Stats) = %+v; want %+v", st, want)
				}
				if (st.LastError != "") != (want.Errors > 0) {
					t.Errorf("Got(LastError) = %q with %d errors", st.LastError, want.Errors)
				}
				if err := stop(); err != nil {
					t.Errorf("Run() = %v; want nil", err)
				}
				if n := len(f.got()); n != tt.wantCalls {
					t.Errorf("endpoint got %d calls after stop; want no more than %d", n, tt.wantCalls)
				}
			})
		})
	}
}

// TestNoticeRetriesOverTCP runs a hung attempt, throttling and a 503 through a real socket
// with a short NoticeCallTimeout.
func TestNoticeRetriesOverTCP(t *testing.T) {
	replies := []reply{replyHang, replyThrottling, replyUnavail, replyOK}
	f := newFakeCW(func(n int) reply { return replies[min(n, len(replies)-1)] })
	c := NewCloudWatch(serverClient(t, f), CloudWatchConfig{
		Interval:          time.Hour,
		NoticeCallTimeout: 500 * time.Millisecond,
		Base:              testBase,
	})
	stop := startRun(t, c)
	c.Record(Datum{Name: "NoticeToDurableSeconds", Unit: UnitSeconds, Value: 33, HighRes: true})
	c.FlushNow()
	f.waitCalls(t, 4)
	waitSent(t, c, 1)
	if err := stop(); err != nil {
		t.Fatalf("Run() = %v; want nil", err)
	}
	st := c.Stats()
	if st.Calls != 4 || st.Errors != 3 || st.Sent != 1 || st.Dropped() != 0 {
		t.Errorf("Got(Stats) = %+v; want 4 calls, 3 errors, 1 sent", st)
	}
}

// TestRecordNeverBlocks fills the buffer while the endpoint hangs: Record and FlushNow
// return without any (fake) time passing, the buffer stays bounded, the oldest regular
// datums are the ones dropped, and what is kept is sent once the endpoint answers.
func TestRecordNeverBlocks(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		var mu sync.Mutex
		hang := true
		f := newFakeCW(func(int) reply {
			mu.Lock()
			defer mu.Unlock()
			if hang {
				return replyHang
			}
			return replyOK
		})
		var logs logBuffer
		c := NewCloudWatch(memClient(f), CloudWatchConfig{Interval: time.Hour, MaxBuffer: 100, Logger: zerolog.New(&logs)})
		stop := startRun(t, c)

		c.Record(Datum{Name: "NoticeReceived", Unit: UnitCount, Value: 1, HighRes: true})
		c.FlushNow()
		synctest.Wait() // the notice flush now hangs in the endpoint

		t0 := time.Now()
		for i := range 150 {
			c.Record(Datum{Name: "GPUUtilizationPercent", Unit: UnitPercent, Value: float64(i), Dimensions: map[string]string{"GPU": fmt.Sprint(i % 8)}})
			c.FlushNow()
		}
		for i := range 10 {
			c.Record(Datum{Name: "NoticeStage", Unit: UnitSeconds, Value: float64(i), HighRes: true})
		}
		if d := time.Since(t0); d != 0 {
			t.Fatalf("Record and FlushNow took %v of fake time; want none", d)
		}
		st := c.Stats()
		if st.Buffered != 100 || st.DroppedFull != 60 || st.Recorded != 161 {
			t.Fatalf("Got(Stats) = %+v; want 100 buffered, 60 dropped for room, 161 recorded", st)
		}

		advance(10 * time.Second) // the first notice flush gave up at 8.35–8.7 s; the second hangs
		mu.Lock()
		hang = false
		mu.Unlock()
		advance(time.Minute) // it gives up; the pending FlushNow sends the buffer
		calls := f.got()
		last := calls[len(calls)-1]
		var notices, samples int
		minUtil := math.Inf(1)
		for _, d := range last.Data {
			switch d.Name {
			case "NoticeStage":
				notices++
			case "GPUUtilizationPercent":
				samples += int(d.Stats[0])
				minUtil = min(minUtil, d.Stats[2])
			}
		}
		if notices != 10 || samples != 90 || minUtil != 60 {
			t.Errorf("last call: %d notice datums, %d GPU samples, oldest value %v; want 10, 90, 60", notices, samples, minUtil)
		}
		st = c.Stats()
		if st.DroppedFailed != 1 || st.SentSamples != 100 || st.Buffered != 0 {
			t.Errorf("Got(Stats) = %+v; want 1 lost to the hung flush, 100 sent", st)
		}
		if sum := st.Buffered + int(st.SentSamples+st.Dropped()); uint64(sum) != st.Recorded {
			t.Errorf("buffered+sent+dropped = %d; want recorded %d", sum, st.Recorded)
		}
		if n := len(logs.lines(t, "warn", msgOverflow)); n != 1 {
			t.Errorf("got %d %q warnings; want 1", n, msgOverflow)
		}
		if err := stop(); err != nil {
			t.Errorf("Run() = %v; want nil", err)
		}
	})
}

// TestRecordOverflowOrder checks which datum makes room when the buffer is full.
func TestRecordOverflowOrder(t *testing.T) {
	hi := func(v float64) Datum { return Datum{Name: "N", Value: v, HighRes: true} }
	lo := func(v float64) Datum { return Datum{Name: "R", Value: v} }
	tests := []struct {
		name             string
		record           []Datum
		wantHi, wantLo   []float64
		wantDroppedCount uint64
	}{
		{"fits", []Datum{lo(1), hi(2), lo(3)}, []float64{2}, []float64{1, 3}, 0},
		{"oldest regular first", []Datum{lo(1), lo(2), hi(3), lo(4)}, []float64{3}, []float64{2, 4}, 1},
		{"regulars before notices", []Datum{hi(1), lo(2), lo(3), hi(4), hi(5)}, []float64{1, 4, 5}, nil, 2},
		{"incoming regular when all are notices", []Datum{hi(1), hi(2), hi(3), lo(4)}, []float64{1, 2, 3}, nil, 1},
		{"oldest notice when all are notices", []Datum{hi(1), hi(2), hi(3), hi(4), hi(5)}, []float64{3, 4, 5}, nil, 2},
	}
	values := func(ds []Datum) []float64 {
		var out []float64
		for _, d := range ds {
			out = append(out, d.Value)
		}
		return out
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			c := NewCloudWatch(nil, CloudWatchConfig{MaxBuffer: 3})
			for _, d := range tt.record { // one at a time and all at once must agree
				c.Record(d)
			}
			c2 := NewCloudWatch(nil, CloudWatchConfig{MaxBuffer: 3})
			c2.Record(tt.record...)
			for _, c := range []*CloudWatch{c, c2} {
				st := c.Stats()
				gotHi, gotLo := c.take()
				if !slices.Equal(values(gotHi), tt.wantHi) || !slices.Equal(values(gotLo), tt.wantLo) {
					t.Errorf("Got(buffer) = %v, %v; want %v, %v", values(gotHi), values(gotLo), tt.wantHi, tt.wantLo)
				}
				if st.DroppedFull != tt.wantDroppedCount || st.Buffered != len(tt.wantHi)+len(tt.wantLo) {
					t.Errorf("Got(Stats) = %+v; want %d dropped", st, tt.wantDroppedCount)
				}
			}
		})
	}
}

// TestPeriodicFlushAggregates samples two GPUs every 5 s for two minutes in fake time: each
// flush sends one statistic set per GPU, every Interval and at once on FlushNow.
func TestPeriodicFlushAggregates(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		f := newFakeCW(nil)
		c := NewCloudWatch(memClient(f), CloudWatchConfig{Base: testBase}) // default Interval 60 s
		start := time.Now()
		stop := startRun(t, c)
		advance(2500 * time.Millisecond)
		for i := range 24 { // samples at 2.5 s, 7.5 s, …, 117.5 s
			if i == 18 { // at 90 s: between the samples at 87.5 s and 92.5 s
				advance(2500 * time.Millisecond)
				c.FlushNow()
				advance(2500 * time.Millisecond)
			} else if i > 0 {
				advance(5 * time.Second)
			}
			for g := range 2 {
				c.Record(Datum{Name: "GPUSMClockMHz", Unit: UnitNone, Value: float64(1000 + 10*i + g), Dimensions: map[string]string{"GPU": fmt.Sprint(g)}})
			}
		}
		advance(time.Until(start.Add(121 * time.Second)))
		if err := stop(); err != nil {
			t.Errorf("Run() = %v; want nil", err)
		}
		calls := f.got()
		wantAt := []time.Duration{60 * time.Second, 90 * time.Second, 120 * time.Second}
		wantFirst := []int{0, 12, 18} // index of the first sample in each flush
		wantN := []int{12, 6, 6}
		if len(calls) != len(wantAt) {
			t.Fatalf("endpoint got %d calls; want %d", len(calls), len(wantAt))
		}
		for i, call := range calls {
			if at := call.Start.Sub(start); at != wantAt[i] {
				t.Errorf("call %d at %v; want %v", i, at, wantAt[i])
			}
			var want []gotDatum
			for g := range 2 {
				first, last := wantFirst[i], wantFirst[i]+wantN[i]-1
				sum := 0.0
				for s := first; s <= last; s++ {
					sum += float64(1000 + 10*s + g)
				}
				want = append(want, gotDatum{
					Name: "GPUSMClockMHz", Unit: "None", Dims: baseWith("GPU", fmt.Sprint(g)),
					Stats: &[4]float64{float64(wantN[i]), sum, float64(1000 + 10*first + g), float64(1000 + 10*last + g)},
					At:    start.Add(2500*time.Millisecond + time.Duration(last)*5*time.Second).UTC(),
				})
			}
			if !reflect.DeepEqual(call.Data, want) {
				t.Errorf("call %d: Got(datums) =\n%s\nwant\n%s", i, fmtData(call.Data), fmtData(want))
			}
		}
	})
}

// TestNoticeFlushNotDelayedByPeriodic: a notice flush goes out at once while a periodic
// flush hangs.
func TestNoticeFlushNotDelayedByPeriodic(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		f := newFakeCW(func(n int) reply {
			if n == 0 {
				return replyHang // the periodic flush at 60 s
			}
			return replyOK
		})
		c := NewCloudWatch(memClient(f), CloudWatchConfig{Base: testBase})
		start := time.Now()
		stop := startRun(t, c)
		c.Record(Datum{Name: "GPUPowerWatts", Value: 690, Dimensions: map[string]string{"GPU": "3"}})
		advance(61 * time.Second)
		c.Record(Datum{Name: "NoticesReceived", Unit: UnitCount, Value: 1, Dimensions: map[string]string{"Source": "spot"}, HighRes: true})
		c.FlushNow()
		advance(time.Minute)
		if err := stop(); err != nil {
			t.Errorf("Run() = %v; want nil", err)
		}
		calls := f.got()
		if len(calls) != 2 {
			t.Fatalf("endpoint got %d calls; want 2", len(calls))
		}
		notice, periodic := calls[0], calls[1] // in the order they ended
		if at := notice.Start.Sub(start); at != 61*time.Second || notice.Data[0].Name != "NoticesReceived" {
			t.Errorf("notice call at %v with %v; want at 61s with NoticesReceived", at, notice.Data)
		}
		if at := periodic.End.Sub(start); at != 80*time.Second || periodic.Data[0].Name != "GPUPowerWatts" {
			t.Errorf("periodic call ended at %v with %v; want at 80s (its timeout) with GPUPowerWatts", at, periodic.Data)
		}
		if st := c.Stats(); st.Sent != 1 || st.DroppedFailed != 1 {
			t.Errorf("Got(Stats) = %+v; want 1 sent, 1 dropped", st)
		}
	})
}

// A notice flush in progress at the stop (a CloudWatch that hangs) is cut, and what it did not
// send goes in the final flush: the stop is held 1.5 s at most (found from outside: 13 to 17 s,
// the notice flush's retries and then the final flush's).
func TestNoticeFlushAtTheStopIsCutAndTakenOverByTheFinalFlush(t *testing.T) {
	for _, tt := range []struct {
		name     string
		replies  []reply
		wantSent uint64
	}{
		{"the endpoint answers again", []reply{replyHang, replyOK}, 1},
		{"the endpoint hangs", []reply{replyHang}, 0},
	} {
		t.Run(tt.name, func(t *testing.T) {
			synctest.Test(t, func(t *testing.T) {
				f := newFakeCW(func(n int) reply { return tt.replies[min(n, len(tt.replies)-1)] })
				c := NewCloudWatch(memClient(f), CloudWatchConfig{Interval: time.Hour, Base: testBase})
				stop := startRun(t, c)
				c.Record(Datum{Name: "NoticeToDurableSeconds", Unit: UnitSeconds, Value: 33, HighRes: true})
				c.FlushNow()
				advance(500 * time.Millisecond) // its first call hangs
				t0 := time.Now()
				if err := stop(); err != nil {
					t.Errorf("Run() = %v; want nil", err)
				}
				if d := time.Since(t0); d > finalFlushTimeout {
					t.Errorf("Run returned %v after cancel; want %v at most", d, finalFlushTimeout)
				}
				if st := c.Stats(); st.SentSamples != tt.wantSent || st.SentSamples+st.Dropped() != 1 {
					t.Errorf("Got(Stats) = %+v; want %d sent, the rest dropped", st, tt.wantSent)
				}
			})
		})
	}
}

// TestFinalFlush checks the flush after Run's context ends.
func TestFinalFlush(t *testing.T) {
	tests := []struct {
		name      string
		replies   []reply
		cancelAt  time.Duration
		wantCalls int
		wantSent  uint64
		wantRunAt time.Duration // how long after cancel Run returns
	}{
		{name: "sends what is buffered", replies: []reply{replyOK}, cancelAt: 10 * time.Second, wantCalls: 1, wantSent: 1},
		{name: "bounded when hung", replies: []reply{replyHang}, cancelAt: 10 * time.Second, wantCalls: 1, wantRunAt: finalFlushTimeout},
		{name: "takes over a cut periodic flush", replies: []reply{replyHang, replyOK}, cancelAt: 65 * time.Second, wantCalls: 2, wantSent: 1},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			synctest.Test(t, func(t *testing.T) {
				f := newFakeCW(func(n int) reply { return tt.replies[min(n, len(tt.replies)-1)] })
				c := NewCloudWatch(memClient(f), CloudWatchConfig{Base: testBase})
				stop := startRun(t, c)
				c.Record(Datum{Name: "AgentUp", Value: 1})
				advance(tt.cancelAt)
				t0 := time.Now()
				if err := stop(); err != nil {
					t.Errorf("Run() = %v; want nil", err)
				}
				if d := time.Since(t0); d != tt.wantRunAt {
					t.Errorf("Run returned %v after cancel; want %v", d, tt.wantRunAt)
				}
				if n := len(f.got()); n != tt.wantCalls {
					t.Errorf("endpoint got %d calls; want %d", n, tt.wantCalls)
				}
				if st := c.Stats(); st.SentSamples != tt.wantSent || st.SentSamples+st.Dropped() != 1 {
					t.Errorf("Got(Stats) = %+v; want %d sent, the rest dropped", st, tt.wantSent)
				}
			})
		})
	}
}

// TestSetupErrorsWarnOnce: with no credentials, no region or rejected credentials, the sink
// says so once, keeps running and dropping (counted), and says when it works again.
func TestSetupErrorsWarnOnce(t *testing.T) {
	tests := []struct {
		name string
		// client returns the client and a function that fixes the problem (nil: cannot).
		client func(f *fakeCW) (PutMetricDataAPI, func())
	}{
		{name: "credentials chain fails", client: func(f *fakeCW) (PutMetricDataAPI, func()) {
			var mu sync.Mutex
			fixed := false
			creds := aws.NewCredentialsCache(aws.CredentialsProviderFunc(func(ctx context.Context) (aws.Credentials, error) {
				mu.Lock()
				defer mu.Unlock()
				if !fixed {
					return aws.Credentials{}, errors.New("no EC2 IMDS role found, operation error ec2imds: GetMetadata, http response error StatusCode: 404")
				}
				return testCredentials.Retrieve(ctx)
			}))
			return memClient(f, func(o *cloudwatch.Options) { o.Credentials = creds }), func() {
				mu.Lock()
				fixed = true
				mu.Unlock()
			}
		}},
		{name: "instance without a role", client: func(f *fakeCW) (PutMetricDataAPI, func()) {
			// The real IMDS role provider against an IMDS that has no instance profile.
			imdsFake := http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
				switch {
				case r.Method == http.MethodPut && r.URL.Path == "/latest/api/token":
					w.Header().Set("X-Aws-Ec2-Metadata-Token-Ttl-Seconds", "21600")
					_, _ = io.WriteString(w, "token")
				default:
					http.NotFound(w, r)
				}
			})
			role := ec2rolecreds.New(func(o *ec2rolecreds.Options) {
				o.Client = imds.New(imds.Options{Endpoint: "http://169.254.169.254", HTTPClient: doer{imdsFake}})
			})
			creds := aws.NewCredentialsCache(role)
			return memClient(f, func(o *cloudwatch.Options) { o.Credentials = creds }), nil
		}},
		{name: "no region", client: func(f *fakeCW) (PutMetricDataAPI, func()) {
			return memClient(f, func(o *cloudwatch.Options) { o.Region, o.BaseEndpoint = "", nil }), nil
		}},
		{name: "credentials rejected", client: func(f *fakeCW) (PutMetricDataAPI, func()) {
			f.setRespond(func(int) reply { return replyBadToken })
			return memClient(f), func() { f.setRespond(nil) }
		}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			synctest.Test(t, func(t *testing.T) {
				f := newFakeCW(nil)
				api, fix := tt.client(f)
				var logs logBuffer
				c := NewCloudWatch(api, CloudWatchConfig{Base: testBase, Logger: zerolog.New(&logs)})
				stop := startRun(t, c)
				record := func(d time.Duration) {
					for range d / (10 * time.Second) {
						c.Record(Datum{Name: "AgentUp", Value: 1})
						advance(10 * time.Second)
					}
				}
				advance(5 * time.Second) // records at 5 s, 15 s, …: never at a flush
				record(5 * time.Minute)  // five periodic flushes
				c.Record(Datum{Name: "NoticesReceived", Value: 1, HighRes: true})
				c.FlushNow() // a notice flush: not retried
				synctest.Wait()
				st := c.Stats()
				if st.Calls != 6 || st.Errors != 6 || st.Sent != 0 || st.DroppedFailed != 31 {
					t.Errorf("Got(Stats) = %+v; want 6 failed calls, 31 dropped", st)
				}
				if warns := logs.lines(t, "warn", msgSetup); len(warns) != 1 {
					t.Errorf("got %d %q warnings; want 1\n%s", len(warns), msgSetup, logs.String())
				} else {
					t.Logf("warning: %v", warns[0]["error"])
				}
				if n := len(logs.lines(t, "warn", msgPutFailed)); n != 0 {
					t.Errorf("got %d %q warnings; want none", n, msgPutFailed)
				}
				if fix != nil {
					fix()
					record(2 * time.Minute)
					if st := c.Stats(); st.Sent != 2 {
						t.Errorf("Got(Stats) = %+v; want 2 sent after the fix", st)
					}
					if n := len(logs.lines(t, "info", msgRecovered)); n != 1 {
						t.Errorf("got %d %q lines; want 1", n, msgRecovered)
					}
				}
				if err := stop(); err != nil {
					t.Errorf("Run() = %v; want nil", err)
				}
			})
		})
	}
}

// TestOtherErrorsLoggedOncePerStreak: 5xx answers are logged when a streak begins and when
// it ends, not at every flush.
func TestOtherErrorsLoggedOncePerStreak(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		var mu sync.Mutex
		failing := true
		f := newFakeCW(func(int) reply {
			mu.Lock()
			defer mu.Unlock()
			if failing {
				return replyInternal
			}
			return replyOK
		})
		set := func(v bool) {
			mu.Lock()
			failing = v
			mu.Unlock()
		}
		var logs logBuffer
		c := NewCloudWatch(memClient(f), CloudWatchConfig{Base: testBase, Logger: zerolog.New(&logs)})
		stop := startRun(t, c)
		minute := func() {
			c.Record(Datum{Name: "AgentUp", Value: 1})
			advance(time.Minute)
		}
		advance(30 * time.Second) // records at 30 s, 90 s, …: never at a flush
		minute()                  // fails (with the SDK's retries)
		minute()                  // fails
		minute()                  // fails
		set(false)
		minute() // recovers
		set(true)
		minute() // fails: a new streak
		if err := stop(); err != nil {
			t.Errorf("Run() = %v; want nil", err)
		}
		st := c.Stats()
		if st.Errors != 4 || st.Sent != 1 || st.DroppedFailed != 4 {
			t.Errorf("Got(Stats) = %+v; want 4 errors, 1 sent, 4 dropped", st)
		}
		if n := len(f.got()); n != 4*3+1 {
			t.Errorf("endpoint got %d calls; want 13 (the SDK tries each failing call 3 times)", n)
		}
		if n := len(logs.lines(t, "warn", msgPutFailed)); n != 2 {
			t.Errorf("got %d %q warnings; want 2\n%s", n, msgPutFailed, logs.String())
		}
		if n := len(logs.lines(t, "info", msgRecovered)); n != 1 {
			t.Errorf("got %d %q lines; want 1", n, msgRecovered)
		}
	})
}

// TestClientPanicRecovered: the SDK panics on a 200 answer with a member it does not know;
// the sink counts an error and goes on.
func TestClientPanicRecovered(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		odd := reply{header: map[string]string{"Content-Type": "application/cbor"}, body: cbor.Encode(cbor.Map{"Unexpected": cbor.Uint(1)})}
		f := newFakeCW(func(n int) reply {
			if n == 0 {
				return odd
			}
			return replyOK
		})
		c := NewCloudWatch(memClient(f), CloudWatchConfig{Interval: time.Hour})
		stop := startRun(t, c)
		c.Record(Datum{Name: "A", Value: 1})
		c.FlushNow()
		synctest.Wait()
		c.Record(Datum{Name: "B", Value: 1})
		c.FlushNow()
		synctest.Wait()
		if err := stop(); err != nil {
			t.Errorf("Run() = %v; want nil", err)
		}
		st := c.Stats()
		if st.Errors != 1 || st.Sent != 1 || !strings.Contains(st.LastError, "panicked") {
			t.Errorf("Got(Stats) = %+v; want 1 error (a panic), 1 sent", st)
		}
	})
}
