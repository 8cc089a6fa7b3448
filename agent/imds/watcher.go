package imds

import (
	"context"
	"errors"
	"fmt"
	"maps"
	"slices"
	"sync"
	"time"

	"github.com/rs/zerolog"
)

const (
	// DefaultPollInterval is Config.PollInterval when it is not set.
	DefaultPollInterval = time.Second
	// minDefaultRequestTimeout is the floor of the default per-request timeout.
	minDefaultRequestTimeout = 500 * time.Millisecond
	// maxStretchedTimeout caps how far a source's request timeout is stretched after reads
	// that timed out (unless the configured timeout is longer still).
	maxStretchedTimeout = 5 * time.Second
	// fastReadsToShrink is how many reads in a row must answer within a quarter of a
	// stretched timeout before it is halved.
	fastReadsToShrink = 3
	// HealthWindow is how long IMDS may fail before [Stats.Healthy] reports false.
	HealthWindow = 30 * time.Second
	// otherBackoffFactor times PollInterval caps the backoff of every source but spot.
	otherBackoffFactor = 10
)

// EventKind says whether a notice began, changed or ended.
type EventKind int

// The event kinds. The zero EventKind is none of them. A notice key has one Begin, then any
// number of Updates, then at most one End; after its End it may Begin again.
const (
	// Begin: a notice key became active.
	Begin EventKind = iota + 1
	// End: a successful read no longer shows an active notice key.
	End
	// Update: a notice key that is active was read properly (not Malformed) and either its
	// Deadline is earlier than the Deadline of the notice last delivered for it (by its Begin or
	// its last Update), or the notice last delivered was Malformed (a fail-safe guess, whatever
	// the new Deadline). A Deadline that moves later gives no event: AWS's simulator recomputes
	// "now + 2 minutes" on every read, so the earliest deadline wins. A Notice with no Deadline
	// (rebalance) never gives an Update.
	Update
)

// String returns "begin", "end", "update", or "EventKind(N)" for anything else.
func (k EventKind) String() string {
	switch k {
	case Begin:
		return "begin"
	case End:
		return "end"
	case Update:
		return "update"
	default:
		return fmt.Sprintf("EventKind(%d)", int(k))
	}
}

// Event is a change in the set of active notices, or in what is known of one.
type Event struct {
	Kind EventKind
	// Notice is the notice as read: for Begin the notice that began; for Update the notice as
	// now read (same Key, its new Deadline, Malformed false); for End the notice as it was last
	// seen before it ended.
	Notice Notice
	// At is when the watcher saw the change (the end of the poll that showed it).
	At time.Time
	// First is set on a Begin that comes from the first successful read of its source since
	// Run started: no read of that source had shown the notice absent, so it may have been in
	// force before the agent started. A restarted agent uses it to tell the notice its
	// previous run already handled from a new one. It is false on a Begin that follows a
	// successful read of the source (which did not show the notice), and on every Update and
	// End. A successful read is one that counts in [SourceStats.LastSuccess]: 404 or a body
	// read without error; failed reads (errors, timeouts, malformed bodies) do not count, so a
	// fail-safe notice read before any successful read is First too.
	First bool
}

// Config configures a [Watcher].
type Config struct {
	// Sources are the sources to poll. Empty means all [Sources]; duplicates are ignored;
	// an unknown source makes Run fail.
	Sources []Source
	// PollInterval is the time between the starts of two polls of one source.
	// Zero or negative means [DefaultPollInterval] (1 s).
	PollInterval time.Duration
	// SpotPollInterval is the spot source's own interval (it has the shortest notice). Zero or
	// negative means PollInterval.
	SpotPollInterval time.Duration
	// RequestTimeout bounds each IMDS request while IMDS answers in time. Zero or negative
	// means the source's interval, but at least 500 ms. Run stretches it, up to 5 s, for a
	// source whose reads time out (see [Watcher.Run]); [Watcher.Check] always uses it as is.
	RequestTimeout time.Duration
	// Logger receives the watcher's logs, with component=imds added. The zero Logger
	// discards them.
	Logger zerolog.Logger
}

// SourceStats counts the polls of one source.
type SourceStats struct {
	// Polls counts completed reads, failed or not (a read cut short by the end of Run's
	// context is not counted).
	Polls uint64
	// Errors counts failed reads: Getter errors and malformed bodies (including the malformed
	// spot body that gave a fail-safe notice).
	Errors uint64
	// Streak is the number of consecutive failed reads up to now; 0 after a success.
	Streak int
	// LastSuccess is the end of the last successful read; zero if none yet.
	LastSuccess time.Time
	// FailingSince is the end of the first failed read of the current streak; zero when
	// Streak is 0.
	FailingSince time.Time
	// LastError is the text of the last error; it is kept after recovery.
	LastError string
	// LastMalformed: the last error was a body that could not be read (it wraps ErrMalformed):
	// IMDS answers, and for spot the agent holds the fail-safe notice.
	LastMalformed bool
}

// Healthy reports whether this source is usable as of now: true when it is not in an error
// streak (also before its first poll), or when its streak began within the last
// [HealthWindow] (30 s, a grace period that also covers start-up); false when it has failed
// for longer than that with no successful read since.
func (s SourceStats) Healthy(now time.Time) bool {
	return s.Streak == 0 || now.Sub(s.FailingSince) <= HealthWindow
}

// Stats is a snapshot of a Watcher's counters, for /healthz, /status and metrics.
type Stats struct {
	// Sources has one entry per enabled source.
	Sources map[Source]SourceStats
	// LastSuccess is the latest LastSuccess of any source; zero if none yet.
	LastSuccess time.Time
}

// Healthy reports whether IMDS is usable as of now. It returns:
//   - true when no source is in an error streak (also before the first poll);
//   - true when some source is failing but a read of any source succeeded, or the oldest
//     current streak began, within the last [HealthWindow] (30 s) — a grace period at start-up;
//   - false otherwise: IMDS has failed for longer than 30 s with no successful read.
func (s Stats) Healthy(now time.Time) bool {
	var since time.Time
	failing := false
	for _, ss := range s.Sources {
		if ss.Streak == 0 {
			continue
		}
		if !failing || ss.FailingSince.Before(since) {
			since = ss.FailingSince
		}
		failing = true
	}
	if !failing {
		return true
	}
	if s.LastSuccess.After(since) {
		since = s.LastSuccess
	}
	return now.Sub(since) <= HealthWindow
}

// Watcher polls IMDS notice sources and reports notices as they begin and end.
// Create it with [NewWatcher]. Check and Stats are safe for concurrent use; Run must not be
// called again before a previous call has returned.
type Watcher struct {
	g            Getter
	sources      []Source
	cfgErr       error // returned by Run
	interval     time.Duration
	spotInterval time.Duration
	timeout      time.Duration // 0: by source, see requestTimeout
	log          zerolog.Logger

	mu    sync.Mutex
	stats Stats // guarded by mu
	// back is closed (and replaced) when a source recovers from an error streak: IMDS
	// answers again, so the sources still backing off poll at once. Guarded by mu.
	back chan struct{}
}

// NewWatcher returns a Watcher that reads g as cfg says (see [Config] for the defaults).
// A bad cfg is reported by Run.
func NewWatcher(g Getter, cfg Config) *Watcher {
	w := &Watcher{
		g:            g,
		interval:     cfg.PollInterval,
		spotInterval: cfg.SpotPollInterval,
		timeout:      cfg.RequestTimeout,
		log:          cfg.Logger.With().Str("component", "imds").Logger(),
		stats:        Stats{Sources: make(map[Source]SourceStats)},
		back:         make(chan struct{}),
	}
	if w.interval <= 0 {
		w.interval = DefaultPollInterval
	}
	if w.spotInterval <= 0 {
		w.spotInterval = w.interval
	}
	srcs := cfg.Sources
	if len(srcs) == 0 {
		srcs = Sources
	}
	var errs []error
	for _, s := range srcs {
		if _, err := ParseSource(string(s)); err != nil {
			errs = append(errs, err)
			continue
		}
		if !slices.Contains(w.sources, s) {
			w.sources = append(w.sources, s)
			w.stats.Sources[s] = SourceStats{}
		}
	}
	w.cfgErr = errors.Join(errs...)
	return w
}

// Check is one synchronous poll of src: it reads src once, with the configured request
// timeout, and parses the body. It returns:
//   - nil, nil: 404, no notice;
//   - notices, nil: a successful read; notices may be empty (e.g. an ASG state other than
//     Terminated, or only canceled/completed scheduled events);
//   - nil, err: the read failed, or the body of a source other than spot was malformed
//     (errors.Is(err, ErrMalformed));
//   - notices, err: spot, a 200 whose body was malformed or cut short (the fail-safe notice, see
//     [ParseSpot]); scheduled, some events unreadable (the others, and fail-safe notices, see
//     [ParseScheduled]): the notices must be acted on, err (wrapping ErrMalformed) is for the
//     log.
//
// An unknown src is an error.
func (w *Watcher) Check(ctx context.Context, src Source) ([]Notice, error) {
	notices, _, err := w.read(ctx, src, w.requestTimeout(src))
	return notices, err
}

// readEnd says how the Get of one read ended.
type readEnd int

const (
	answered  readEnd = iota // IMDS answered: 2xx or 404, whatever the body
	timedOut                 // the read's own timeout ran out (not ctx)
	getFailed                // any other error of the Getter, or an unknown source
)

// read is Check with the request timeout given; it also says how the Get ended.
func (w *Watcher) read(ctx context.Context, src Source, timeout time.Duration) ([]Notice, readEnd, error) {
	path := src.Path()
	if path == "" {
		return nil, getFailed, fmt.Errorf("imds: unknown notice source %q", src)
	}
	rctx, cancel := context.WithTimeout(ctx, timeout)
	defer cancel()
	body, found, err := w.g.Get(rctx, path)
	if err != nil {
		end := getFailed
		// The SDK's errors do not always unwrap to the context's: ask the context itself.
		if ctx.Err() == nil && errors.Is(rctx.Err(), context.DeadlineExceeded) {
			end = timedOut
		}
		if src == SourceSpot && found && errors.Is(err, ErrBodyCut) && ctx.Err() == nil {
			// A notice whose body could not be read whole is a notice: the fail-safe one of a
			// malformed body, unless what was read parses.
			n, perr := ParseSpot(body, time.Now())
			if perr == nil {
				perr = ErrMalformed
			}
			return []Notice{n}, end, fmt.Errorf("get %s: %w (%w)", path, err, perr)
		}
		return nil, end, fmt.Errorf("get %s: %w", path, err)
	}
	if !found {
		return nil, answered, nil
	}
	notices, err := parse(src, body, time.Now())
	if err != nil {
		err = fmt.Errorf("%w (body %q)", err, excerpt(body))
	}
	return notices, answered, err
}

// parse runs the parser of src, a known source.
func parse(src Source, body []byte, now time.Time) ([]Notice, error) {
	switch src {
	case SourceSpot:
		n, err := ParseSpot(body, now)
		return []Notice{n}, err
	case SourceRebalance:
		n, err := ParseRebalance(body, now)
		if err != nil {
			return nil, err
		}
		return []Notice{n}, nil
	case SourceScheduled:
		return ParseScheduled(body, now)
	default: // SourceASG
		return ParseASG(body, now)
	}
}

// excerpt returns the start of body for an error message.
func excerpt(body []byte) string {
	const n = 200
	if len(body) > n {
		return string(body[:n]) + "..."
	}
	return string(body)
}

// Run polls every enabled source on its own goroutine until ctx is done, sending an Event
// on out (a send waits for the receiver or for ctx) whenever:
//   - Begin: a notice key becomes active; a key stays active however often its time changes.
//     First is set when no read of the source had succeeded before (see [Event.First]);
//   - Update: an active key is read properly with a Deadline earlier than the one last
//     delivered, or properly after it was delivered Malformed (see [Update]);
//   - End: a successful read (404, or a body without it, e.g. a scheduled event turned
//     canceled or completed) no longer shows an active key; so does a scheduled answer some of
//     whose events are unreadable, each with a Code (their fail-safe notices stay).
//
// Each source is polled at once, then every PollInterval (SpotPollInterval for spot) from the
// start of the previous poll. A failed read never changes the active set (the fail-safe spot
// notice of a malformed body is added, as a successful read would add it), and a fail-safe
// (Malformed) notice never replaces one already active; a failed read is counted and
// followed by a jittered exponential backoff from 100 ms, capped at SpotPollInterval for spot
// and at 10 × PollInterval for other sources, measured from the end of the failed read. A
// source that recovers from an error streak ends the backoff of every other source: they poll
// at once (after an outage of IMDS, a rebalance recommendation is not left unread for 10 s
// because its source backed off further than spot's). Each error streak logs one Warn at its
// first error and one Info when the source recovers.
//
// Each read is bounded by its source's request timeout, which starts at RequestTimeout (see
// [Config]) and adapts to how fast IMDS answers that source, so that an IMDS that answers
// slowly is read, late, rather than never:
//   - after a read that timed out, the source's timeout doubles, up to 5 s (or RequestTimeout,
//     if that is longer);
//   - after 3 reads in a row that IMDS answered (2xx or 404) within a quarter of a stretched
//     timeout, it is halved, but never below RequestTimeout. Other failures change nothing.
//
// A healthy IMDS keeps RequestTimeout. A source logs one Warn when its timeout is first
// stretched and one Info when it is back at RequestTimeout (the steps between are Debug).
//
// Run returns an error at once, polling nothing, when the Config named an unknown source.
// Otherwise it returns nil, once ctx is done and all its goroutines have exited.
func (w *Watcher) Run(ctx context.Context, out chan<- Event) error {
	if w.cfgErr != nil {
		return w.cfgErr
	}
	var wg sync.WaitGroup
	for _, src := range w.sources {
		wg.Go(func() { w.watch(ctx, src, out) })
	}
	wg.Wait()
	return nil
}

// Stats returns a snapshot of the counters.
func (w *Watcher) Stats() Stats {
	w.mu.Lock()
	defer w.mu.Unlock()
	s := w.stats
	s.Sources = maps.Clone(w.stats.Sources)
	return s
}

// sourceState is what the goroutine of one source owns.
type sourceState struct {
	src          Source
	active       map[string]Notice // by Notice.Key: as last read
	delivered    map[string]Notice // by Notice.Key: as last sent in a Begin or Update
	bo           backoff
	streak       int
	failingSince time.Time
	// unhealthySaid: the streak's error line (past HealthWindow) is written.
	unhealthySaid bool
	limit         readLimit
	succeeded     bool // a read has succeeded since Run started; see Event.First
}

// readLimit is the request timeout of one source, stretched while IMDS answers it slowly.
type readLimit struct {
	base time.Duration // the configured or default timeout, where cur starts and returns
	max  time.Duration // the cap on cur: maxStretchedTimeout, or base if longer
	cur  time.Duration // the timeout of the next read
	fast int           // reads in a row that answered within cur/4, while cur > base
}

// newReadLimit returns the limit of a source whose request timeout is base.
func newReadLimit(base time.Duration) readLimit {
	return readLimit{base: base, max: max(base, maxStretchedTimeout), cur: base}
}

// observe adapts cur to a read that ended as end after took, and reports whether cur changed.
func (l *readLimit) observe(end readEnd, took time.Duration) bool {
	prev := l.cur
	switch {
	case end == timedOut:
		l.fast = 0
		l.cur = min(2*l.cur, l.max)
	case end == answered && l.cur > l.base && took <= l.cur/4:
		l.fast++
		if l.fast >= fastReadsToShrink {
			l.fast = 0
			l.cur = max(l.cur/2, l.base)
		}
	default:
		l.fast = 0
	}
	return l.cur != prev
}

// intervalOf is the poll interval of src.
func (w *Watcher) intervalOf(src Source) time.Duration {
	if src == SourceSpot {
		return w.spotInterval
	}
	return w.interval
}

// requestTimeout bounds one read of src.
func (w *Watcher) requestTimeout(src Source) time.Duration {
	if w.timeout > 0 {
		return w.timeout
	}
	return max(w.intervalOf(src), minDefaultRequestTimeout)
}

// watch is the loop of one source: poll, then wait for the cadence or the backoff.
func (w *Watcher) watch(ctx context.Context, src Source, out chan<- Event) {
	interval := w.intervalOf(src)
	bmax := interval
	if src != SourceSpot {
		bmax *= otherBackoffFactor
	}
	s := &sourceState{src: src, active: make(map[string]Notice), delivered: make(map[string]Notice),
		bo: backoff{max: max(bmax, 1)}, limit: newReadLimit(w.requestTimeout(src))}
	for {
		start := time.Now()
		back := w.backCh() // taken before the read: a recovery during it ends the backoff too
		failed, live := w.poll(ctx, s, out)
		if !live {
			return
		}
		if !failed {
			s.bo.reset()
			if !wait(ctx, interval-time.Since(start), nil) {
				return
			}
			continue
		}
		if !wait(ctx, s.bo.next(), back) {
			return
		}
	}
}

// backCh returns the channel that the next recovery of any source closes.
func (w *Watcher) backCh() <-chan struct{} {
	w.mu.Lock()
	defer w.mu.Unlock()
	return w.back
}

// poll is one step of watch: a read with the current timeout of s, then bookkeeping, logging
// and events. It reports whether the read failed, and live=false when ctx ended (the step was
// then abandoned).
func (w *Watcher) poll(ctx context.Context, s *sourceState, out chan<- Event) (failed, live bool) {
	start := time.Now()
	notices, end, err := w.read(ctx, s.src, s.limit.cur)
	if ctx.Err() != nil {
		return false, false // stopping: an aborted read says nothing about IMDS
	}
	now := time.Now()
	w.adapt(s, end, now.Sub(start))
	w.record(s, now, err)

	current := make(map[string]Notice, len(notices))
	for _, n := range notices {
		current[n.Key()] = n
	}
	var events []Event
	for _, k := range slices.Sorted(maps.Keys(current)) {
		n := current[k]
		_, ok := s.active[k]
		switch {
		case !ok:
			events = append(events, Event{Kind: Begin, Notice: n, At: now, First: !s.succeeded})
			s.delivered[k] = n
		case n.Malformed:
			continue // a fail-safe guess: keep the notice as last read properly
		case updates(s.delivered[k], n):
			events = append(events, Event{Kind: Update, Notice: n, At: now})
			s.delivered[k] = n
		}
		s.active[k] = n
	}
	if err == nil {
		s.succeeded = true
	}
	if err == nil || partialRead(s.src, notices, err) {
		// A scheduled answer with an unreadable event still says which of the others are over
		// (canceled, completed, gone).
		for _, k := range slices.Sorted(maps.Keys(s.active)) {
			if _, ok := current[k]; !ok {
				events = append(events, Event{Kind: End, Notice: s.active[k], At: now})
				delete(s.active, k)
				delete(s.delivered, k)
			}
		}
	}
	for _, ev := range events {
		w.log.Debug().Str("source", string(s.src)).Str("event", ev.Kind.String()).
			Str("key", ev.Notice.Key()).Bool("malformed", ev.Notice.Malformed).Bool("first", ev.First).Msg("notice")
		select {
		case out <- ev:
		case <-ctx.Done():
			return err != nil, false
		}
	}
	return err != nil, true
}

// updates reports whether n, read properly for the key of last (the notice last delivered),
// deserves an Update: last was a fail-safe guess, or n's Deadline is earlier (a zero Deadline
// is no deadline, later than any), or, for a scheduled event (one EventId), its window moved
// either way: AWS reschedules events, and what IMDS says now is the event's time.
func updates(last, n Notice) bool {
	if n.Malformed {
		return false
	}
	if last.Malformed {
		return true
	}
	if n.Source == SourceScheduled && (!n.Deadline.Equal(last.Deadline) || !n.NotAfter.Equal(last.NotAfter)) {
		return true
	}
	return !n.Deadline.IsZero() && (last.Deadline.IsZero() || n.Deadline.Before(last.Deadline))
}

// adapt stretches or shrinks the request timeout of s after a read that ended as end after
// took, and logs when the timeout leaves its base and when it returns to it.
func (w *Watcher) adapt(s *sourceState, end readEnd, took time.Duration) {
	prev := s.limit.cur
	if !s.limit.observe(end, took) {
		return
	}
	l := s.limit
	switch {
	case prev == l.base:
		w.log.Warn().Str("source", string(s.src)).Float64("timeout_s", logSeconds(l.cur)).
			Float64("default_timeout_s", logSeconds(l.base)).Msg(msgSlow)
	case l.cur == l.base:
		w.log.Info().Str("source", string(s.src)).Float64("timeout_s", logSeconds(l.cur)).Msg(msgInTime)
	default:
		w.log.Debug().Str("source", string(s.src)).Float64("timeout_s", logSeconds(l.cur)).
			Float64("took_s", logSeconds(took)).Msg("imds request timeout changed")
	}
}

// The messages of adapt, at the start and the end of a stretch.
const (
	msgSlow   = "imds answers slowly; waiting longer for each read"
	msgInTime = "imds answers in time again; reads back to the default timeout"
)

// record updates the counters after a read that ended at now, logs the first error of a
// streak and the recovery that ends it, and on a recovery ends every source's backoff.
func (w *Watcher) record(s *sourceState, now time.Time, err error) {
	recovered := err == nil && s.streak > 0
	switch {
	case err != nil:
		s.streak++
		if s.streak == 1 {
			s.failingSince = now
			s.unhealthySaid = false
			w.log.Warn().Str("source", string(s.src)).Err(err).Msg("imds read failed; retrying with backoff")
		}
		if !s.unhealthySaid && now.Sub(s.failingSince) > HealthWindow {
			// As /healthz turns 503 for it: an error line too, where journalctl -p err looks
			// (only warnings said it; found from outside).
			s.unhealthySaid = true
			msg := "imds reads have failed for longer than the agent stays healthy; its notices are not seen while they fail"
			if s.src == SourceSpot && errors.Is(err, ErrMalformed) {
				// A spot body that cannot be read is acted on, as a notice 2 minutes out (found
				// from outside: the line said its notices were not seen).
				msg = "imds reads have failed for longer than the agent stays healthy: its answer cannot be read, and is taken for a notice 2 minutes out while it lasts (fail-safe)"
			}
			w.log.Error().Str("source", string(s.src)).Err(err).Float64("failing_for_s", logSeconds(now.Sub(s.failingSince))).
				Msg(msg)
		}
	case s.streak > 0:
		w.log.Info().Str("source", string(s.src)).Int("errors", s.streak).
			Float64("failing_for_s", logSeconds(now.Sub(s.failingSince))).Msg("imds read recovered")
		s.streak = 0
		s.failingSince = time.Time{}
	}

	w.mu.Lock()
	defer w.mu.Unlock()
	st := w.stats.Sources[s.src]
	st.Polls++
	st.Streak = s.streak
	st.FailingSince = s.failingSince
	if err != nil {
		st.Errors++
		st.LastError = err.Error()
		st.LastMalformed = errors.Is(err, ErrMalformed)
	} else {
		st.LastSuccess = now
		w.stats.LastSuccess = now
		if recovered {
			close(w.back)
			w.back = make(chan struct{})
		}
	}
	w.stats.Sources[s.src] = st
}
