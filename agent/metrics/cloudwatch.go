package metrics

import (
	"context"
	"maps"
	"sync"
	"time"

	"github.com/aws/aws-sdk-go-v2/service/cloudwatch"
	"github.com/rs/zerolog"
)

// Defaults of [CloudWatchConfig].
const (
	DefaultNamespace         = "SpotGuard"
	DefaultInterval          = 60 * time.Second
	DefaultMaxBuffer         = 20000
	DefaultNoticeCallTimeout = 2 * time.Second
	DefaultNoticeRetries     = 3
)

const (
	// periodicCallTimeout bounds one PutMetricData call of a periodic flush, the SDK's own
	// retries included.
	periodicCallTimeout = 20 * time.Second
	// finalFlushTimeout bounds the flush Run makes after its context ended: a stop waits for it
	// (docs/hardening.md: a stop within 2 s, all of it; 2 s here came to 2.33 s, seen from
	// outside).
	finalFlushTimeout = 1500 * time.Millisecond
	// retryBackoffBase and retryBackoffMax shape the waits between the retries of a notice
	// or final flush: exponential from 100 ms, at most 1 s, with equal jitter.
	retryBackoffBase = 100 * time.Millisecond
	retryBackoffMax  = time.Second
)

// CloudWatchConfig configures a [CloudWatch] sink. The zero value uses every default.
type CloudWatchConfig struct {
	// Namespace is the CloudWatch namespace; empty means "SpotGuard".
	Namespace string
	// Interval is the time between periodic flushes; zero or negative means 60 s.
	Interval time.Duration
	// Base returns the base dimensions added to every datum (InstanceId, InstanceType). It
	// is called at each flush, from Run's goroutines, because the instance identity may
	// arrive after start; it must be safe for concurrent use and must not block. Empty
	// values are skipped; nil means no base dimensions.
	Base func() map[string]string
	// Aggregate lists dimension sets, as the CloudWatch agent's aggregation_dimensions: a
	// datum with Aggregate set is also sent once per set, with only those base dimensions the
	// set names (plus its own dimensions), e.g. {"InstanceType"} for one series per instance
	// type across the fleet; an empty set keeps no base dimension. A copy whose dimensions
	// come out the same as those of the datum's own series or of an earlier copy (the base
	// lacks what the set leaves out, e.g. before the instance identity is known) is not sent:
	// no series counts a datum twice. Nil means no copies. Read once, by NewCloudWatch.
	Aggregate [][]string
	// Logger receives the sink's logs, with component=cloudwatch added. The zero Logger
	// discards them.
	Logger zerolog.Logger
	// MaxBuffer is the most datums held between flushes; zero or negative means 20000.
	MaxBuffer int
	// NoticeCallTimeout bounds each PutMetricData attempt of a notice flush (and of the
	// final flush); zero or negative means 2 s.
	NoticeCallTimeout time.Duration
	// NoticeRetries is the most retries of one PutMetricData call in a notice flush, on
	// throttling, 5xx, connection errors and attempts cut by NoticeCallTimeout; zero means
	// 3, negative means none.
	NoticeRetries int
}

// PutMetricDataAPI is the part of the CloudWatch client the sink uses; *cloudwatch.Client
// implements it. The client must be safe for concurrent use.
type PutMetricDataAPI interface {
	PutMetricData(ctx context.Context, in *cloudwatch.PutMetricDataInput, optFns ...func(*cloudwatch.Options)) (*cloudwatch.PutMetricDataOutput, error)
}

// Stats is a snapshot of a sink's counters since it was made, for /status and Prometheus.
// Datum counts are in recorded datums (one per Datum given to Record), except Sent.
// Recorded = Buffered + SentSamples + DroppedFull + DroppedInvalid + DroppedFailed, once
// no flush is in progress.
type Stats struct {
	// Recorded counts datums given to Record.
	Recorded uint64
	// Buffered is the number of datums waiting for the next flush.
	Buffered int
	// Calls counts PutMetricData calls made; each retry of a notice flush is a call, the
	// SDK's own retries within a periodic call are not.
	Calls uint64
	// Errors counts calls that returned an error.
	Errors uint64
	// Sent counts datums on the wire in calls that succeeded: an aggregated series is one,
	// and so is each aggregate copy (CloudWatchConfig.Aggregate).
	Sent uint64
	// SentSamples counts the recorded datums those calls carried.
	SentSamples uint64
	// DroppedFull counts datums dropped because the buffer was full.
	DroppedFull uint64
	// DroppedInvalid counts datums CloudWatch would reject (name, unit, value, dimensions),
	// dropped before sending.
	DroppedInvalid uint64
	// DroppedFailed counts datums in calls given up after errors (credentials or region
	// missing, rejected, retries exhausted, timed out).
	DroppedFailed uint64
	// LastError is the text of the newest call error, kept after recovery; "" if none.
	LastError string
	// LastErrorAt is when LastError happened; zero if none.
	LastErrorAt time.Time
}

// Dropped returns every datum dropped, for whatever reason.
func (s Stats) Dropped() uint64 { return s.DroppedFull + s.DroppedInvalid + s.DroppedFailed }

var _ Sink = (*CloudWatch)(nil)

// CloudWatch is a [Sink] that sends to CloudWatch. Create it with [NewCloudWatch] and call
// [CloudWatch.Run] once. Record, FlushNow and Stats are safe for concurrent use and never
// wait for CloudWatch.
type CloudWatch struct {
	api     PutMetricDataAPI
	ns      string
	every   time.Duration
	base    func() map[string]string
	aggs    [][]string
	log     zerolog.Logger
	max     int
	timeout time.Duration
	retries int
	poke    chan struct{} // capacity 1: a pending FlushNow

	mu sync.Mutex
	// hi holds HighRes datums, lo the others, each oldest first; len(hi)+len(lo) <= max.
	hi, lo []Datum
	st     Stats
	logs   logState
}

// logState keeps the logs from repeating; guarded by CloudWatch.mu.
type logState struct {
	setupWarned   bool   // the credentials/region warning was logged
	otherWarned   bool   // a put error was logged at Warn since the last success
	streak        int    // failed calls since the last success
	overflowed    uint64 // DroppedFull when the last take looked
	overflowing   bool   // the last take saw new overflow drops
	invalidWarned bool   // the first invalid datum was logged
	badBaseWarned bool   // the first invalid base dimension was logged
}

// NewCloudWatch returns a sink that sends to api (not nil) as cfg says (see
// [CloudWatchConfig] for the defaults). It sends nothing before Run.
func NewCloudWatch(api PutMetricDataAPI, cfg CloudWatchConfig) *CloudWatch {
	c := &CloudWatch{
		api:     api,
		ns:      cfg.Namespace,
		every:   cfg.Interval,
		base:    cfg.Base,
		aggs:    cloneSets(cfg.Aggregate),
		log:     cfg.Logger.With().Str("component", "cloudwatch").Logger(),
		max:     cfg.MaxBuffer,
		timeout: cfg.NoticeCallTimeout,
		retries: cfg.NoticeRetries,
		poke:    make(chan struct{}, 1),
	}
	if c.ns == "" {
		c.ns = DefaultNamespace
	}
	if c.every <= 0 {
		c.every = DefaultInterval
	}
	if c.max <= 0 {
		c.max = DefaultMaxBuffer
	}
	if c.timeout <= 0 {
		c.timeout = DefaultNoticeCallTimeout
	}
	switch {
	case c.retries == 0:
		c.retries = DefaultNoticeRetries
	case c.retries < 0:
		c.retries = 0
	}
	return c
}

// cloneSets copies dimension sets deeply.
func cloneSets(sets [][]string) [][]string {
	if sets == nil {
		return nil
	}
	out := make([][]string, len(sets))
	for i, s := range sets {
		out[i] = append([]string{}, s...)
	}
	return out
}

// Record buffers ds for the next flush. It never blocks on CloudWatch: it copies each
// datum's Dimensions, stamps a zero At with the current time and appends under a mutex
// that is only ever held for memory operations. When the buffer (MaxBuffer) is full, room
// is made by dropping, in this order: the oldest datum that is not HighRes; the incoming
// datum itself when it is not HighRes and everything buffered is; the oldest HighRes
// datum. Drops are counted in [Stats].DroppedFull and logged at the next flush.
func (c *CloudWatch) Record(ds ...Datum) {
	if len(ds) == 0 {
		return
	}
	now := time.Now()
	cp := make([]Datum, len(ds))
	for i, d := range ds {
		if d.At.IsZero() {
			d.At = now
		}
		if d.Dimensions != nil {
			d.Dimensions = maps.Clone(d.Dimensions)
		}
		cp[i] = d
	}
	c.mu.Lock()
	defer c.mu.Unlock()
	c.st.Recorded += uint64(len(cp))
	for _, d := range cp {
		if len(c.hi)+len(c.lo) >= c.max {
			c.st.DroppedFull++
			switch {
			case len(c.lo) > 0:
				c.lo[0] = Datum{} // let the dropped maps go
				c.lo = c.lo[1:]
			case !d.HighRes:
				continue
			default:
				c.hi[0] = Datum{}
				c.hi = c.hi[1:]
			}
		}
		if d.HighRes {
			c.hi = append(c.hi, d)
		} else {
			c.lo = append(c.lo, d)
		}
	}
}

// FlushNow asks Run for an immediate flush, on a notice: everything buffered is sent at
// once, HighRes datums first at StorageResolution 1, then the others aggregated as in a
// periodic flush; each PutMetricData call is bounded by NoticeCallTimeout and retried at
// most NoticeRetries times on throttling, 5xx, connection errors and timeouts. FlushNow
// never blocks: it leaves a request for Run and returns. Requests made while one is
// pending are merged into it; a request made while a notice flush is in progress starts
// another one after it; a request made before Run starts is served when it starts.
func (c *CloudWatch) FlushNow() {
	select {
	case c.poke <- struct{}{}:
	default:
	}
}

// Run sends the buffer until ctx is done, then returns nil (always). It flushes every
// Interval, and on FlushNow in a goroutine of its own so that a slow periodic flush never
// delays a notice flush. A notice flush in progress when ctx ends is finished (bounded by
// its timeouts and retries); a periodic one is cut and what it had not sent is sent by the
// final flush: one last flush of everything buffered, bounded by 1.5 s. Run returns only
// after its goroutines have exited. It must not be called again before a previous call
// has returned.
func (c *CloudWatch) Run(ctx context.Context) error {
	// A notice flush in progress at the stop is cut, as a periodic one is, and what it did not
	// send goes in the final flush: a CloudWatch that hangs held the stop through its retries,
	// then the final flush's (found from outside: 13 to 17 s after the last commit).
	var wg sync.WaitGroup
	var noticeCarry []batch
	wg.Go(func() {
		for {
			select {
			case <-ctx.Done():
				return
			case <-c.poke:
				noticeCarry = c.flush(ctx, modeNotice, nil)
			}
		}
	})

	var carry []batch // what a periodic flush cut by ctx did not send
	t := time.NewTicker(c.every)
	for running := true; running; {
		select {
		case <-ctx.Done():
			running = false
		case <-t.C:
			carry = c.flush(ctx, modePeriodic, nil)
		}
	}
	t.Stop()
	wg.Wait()

	fctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), finalFlushTimeout)
	defer cancel()
	c.flush(fctx, modeFinal, append(noticeCarry, carry...))
	return nil
}

// Stats returns a snapshot of the counters.
func (c *CloudWatch) Stats() Stats {
	c.mu.Lock()
	defer c.mu.Unlock()
	s := c.st
	s.Buffered = len(c.hi) + len(c.lo)
	return s
}

// take empties the buffer and returns what it held. It logs (outside the mutex, which
// Record needs) when datums were dropped for room since the last take, once per run of
// takes that see drops.
func (c *CloudWatch) take() (hi, lo []Datum) {
	c.mu.Lock()
	hi, lo = c.hi, c.lo
	c.hi, c.lo = nil, nil
	dropped := c.st.DroppedFull - c.logs.overflowed
	warn := dropped > 0 && !c.logs.overflowing
	c.logs.overflowing = dropped > 0
	c.logs.overflowed = c.st.DroppedFull
	c.mu.Unlock()
	if warn {
		c.log.Warn().Uint64("dropped", dropped).Int("max_buffer", c.max).Msg(msgOverflow)
	}
	return hi, lo
}
