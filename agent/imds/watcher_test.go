package imds

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"testing"
	"testing/synctest"
	"time"

	"github.com/rs/zerolog"
)

// getterFunc is a Getter made of a function.
type getterFunc func(ctx context.Context, path string) ([]byte, bool, error)

func (f getterFunc) Get(ctx context.Context, path string) ([]byte, bool, error) { return f(ctx, path) }

// call is one Get on a stepGetter, waiting for the test to answer it.
type call struct {
	path     string
	at       time.Time
	deadline time.Time // of the read's context
	reply    chan reply
}

type reply struct {
	body  string
	found bool
	err   error
}

func (c *call) ok(body string) { c.reply <- reply{body: body, found: true} }
func (c *call) notFound()      { c.reply <- reply{} }
func (c *call) fail()          { c.reply <- reply{err: errIMDSDown} }

var errIMDSDown = errors.New("connection refused")

// stepGetter hands every Get to the test, which answers it: the test sets the pace and sees
// exactly when each read happens. Use it inside a synctest bubble.
type stepGetter struct{ calls chan *call }

func (g *stepGetter) Get(ctx context.Context, path string) ([]byte, bool, error) {
	deadline, _ := ctx.Deadline()
	c := &call{path: path, at: time.Now(), deadline: deadline, reply: make(chan reply, 1)}
	select {
	case g.calls <- c:
	case <-ctx.Done():
		return nil, false, ctx.Err()
	}
	select {
	case r := <-c.reply:
		if r.err != nil || !r.found {
			return nil, false, r.err
		}
		return []byte(r.body), true, nil
	case <-ctx.Done():
		return nil, false, ctx.Err()
	}
}

// harness runs a Watcher over a stepGetter inside a synctest bubble.
type harness struct {
	g      *stepGetter
	w      *Watcher
	out    chan Event
	logs   *logBuffer
	cancel context.CancelFunc
	done   chan error
}

// start runs a watcher with cfg (Logger replaced) and an out channel of capacity outCap.
func start(t *testing.T, cfg Config, outCap int) *harness {
	t.Helper()
	h := &harness{
		g:    &stepGetter{calls: make(chan *call)},
		out:  make(chan Event, outCap),
		logs: &logBuffer{},
		done: make(chan error, 1),
	}
	cfg.Logger = zerolog.New(h.logs).Level(zerolog.DebugLevel)
	h.w = NewWatcher(h.g, cfg)
	ctx, cancel := context.WithCancel(context.Background())
	h.cancel = cancel
	go func() { h.done <- h.w.Run(ctx, h.out) }()
	return h
}

// next returns the next read the watcher makes.
func (h *harness) next(t *testing.T) *call {
	t.Helper()
	return <-h.g.calls
}

// events returns the events emitted so far, once the watcher is idle.
func (h *harness) events() []Event {
	synctest.Wait()
	var evs []Event
	for {
		select {
		case ev := <-h.out:
			evs = append(evs, ev)
		default:
			return evs
		}
	}
}

// stop cancels Run and checks that it returns nil.
func (h *harness) stop(t *testing.T) {
	t.Helper()
	h.cancel()
	if err := <-h.done; err != nil {
		t.Errorf("Run() = %v; want nil after cancel", err)
	}
}

// advance lets d of fake time pass inside the bubble.
func advance(d time.Duration) {
	t := time.NewTimer(d)
	<-t.C
}

// wantEvents checks that got is the events want, as kind and key.
func wantEvents(t *testing.T, got []Event, want ...string) {
	t.Helper()
	var g []string
	for _, ev := range got {
		g = append(g, ev.Kind.String()+" "+ev.Notice.Key())
	}
	if !slices.Equal(g, want) {
		t.Errorf("events = %q; want %q", g, want)
	}
}

func spotBody(action string, at time.Time) string {
	return fmt.Sprintf("{\n\t\"action\": %q,\n\t\"time\": %q\n}", action, at.UTC().Format(time.RFC3339))
}

func TestRunPollCadence(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		h := start(t, Config{Sources: []Source{SourceSpot}, PollInterval: time.Second, RequestTimeout: 3 * time.Second}, 16)
		defer h.stop(t)
		t0 := time.Now()
		c := h.next(t)
		if c.path != "spot/instance-action" || !c.at.Equal(t0) {
			t.Errorf("first read = %q at +%v; want spot/instance-action at once", c.path, c.at.Sub(t0))
		}
		c.notFound()
		prev := c.at
		for range 5 {
			c = h.next(t)
			if gap := c.at.Sub(prev); gap != time.Second {
				t.Errorf("gap between reads = %v; want 1s", gap)
			}
			prev = c.at
			c.notFound()
		}
		// A slow read: the next starts 1 s after the slow one started, not after it ended.
		c = h.next(t)
		prev = c.at
		advance(300 * time.Millisecond)
		c.notFound()
		c = h.next(t)
		if gap := c.at.Sub(prev); gap != time.Second {
			t.Errorf("gap after a 300ms read = %v; want 1s from its start", gap)
		}
		c.notFound()
		// A read slower than the interval: the next one follows at once.
		c = h.next(t)
		advance(1500 * time.Millisecond)
		c.notFound()
		end := time.Now()
		c = h.next(t)
		if !c.at.Equal(end) {
			t.Errorf("read after a 1.5s read came %v after it; want at once", c.at.Sub(end))
		}
		c.notFound()
		if evs := h.events(); len(evs) != 0 {
			t.Errorf("events = %v; want none", evs)
		}
		if st := h.w.Stats().Sources[SourceSpot]; st.Polls != 10 || st.Errors != 0 || st.LastSuccess.IsZero() {
			t.Errorf("Stats() = %+v; want 10 polls, no errors, a LastSuccess", st)
		}
	})
}

func TestRunPollsEverySource(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		h := start(t, Config{PollInterval: time.Second}, 16) // no Sources: all of them
		defer h.stop(t)
		t0 := time.Now()
		var paths []string
		for range 2 * len(Sources) {
			c := h.next(t)
			paths = append(paths, c.path)
			if want := t0.Add(time.Duration(len(paths)-1) / time.Duration(len(Sources)) * time.Second); !c.at.Equal(want) {
				t.Errorf("read %d (%s) at +%v; want +%v", len(paths), c.path, c.at.Sub(t0), want.Sub(t0))
			}
			c.notFound()
		}
		slices.Sort(paths)
		var want []string
		for _, s := range Sources {
			want = append(want, s.Path(), s.Path())
		}
		slices.Sort(want)
		if !slices.Equal(paths, want) {
			t.Errorf("read paths = %q; want each source twice: %q", paths, want)
		}
		if got := len(h.w.Stats().Sources); got != len(Sources) {
			t.Errorf("len(Stats().Sources) = %d; want %d", got, len(Sources))
		}
	})
}

func TestRunBackoff(t *testing.T) {
	ms := time.Millisecond
	tests := []struct {
		src   Source
		waits []time.Duration // the upper bound of each wait; each is drawn from [d/2, d]
	}{
		{SourceSpot, []time.Duration{100 * ms, 200 * ms, 400 * ms, 800 * ms, 1000 * ms, 1000 * ms, 1000 * ms}},
		{SourceRebalance, []time.Duration{100 * ms, 200 * ms, 400 * ms, 800 * ms, 1600 * ms, 3200 * ms, 6400 * ms, 10 * time.Second, 10 * time.Second}},
		{SourceASG, []time.Duration{100 * ms, 200 * ms, 400 * ms, 800 * ms, 1600 * ms, 3200 * ms, 6400 * ms, 10 * time.Second}},
	}
	for _, tt := range tests {
		t.Run(string(tt.src), func(t *testing.T) {
			synctest.Test(t, func(t *testing.T) {
				h := start(t, Config{Sources: []Source{tt.src}, PollInterval: time.Second}, 16)
				defer h.stop(t)
				c := h.next(t)
				failedAt := c.at
				c.fail()
				prev := c.at
				for i, d := range tt.waits {
					c = h.next(t)
					if gap := c.at.Sub(prev); gap < d/2 || gap > d {
						t.Errorf("wait %d = %v; want in [%v, %v]", i+1, gap, d/2, d)
					}
					prev = c.at
					c.fail()
				}
				synctest.Wait()
				st := h.w.Stats().Sources[tt.src]
				if n := uint64(len(tt.waits) + 1); st.Polls != n || st.Errors != n || st.Streak != int(n) || !st.FailingSince.Equal(failedAt) || st.LastError == "" {
					t.Errorf("Stats() = %+v; want %d polls, errors, streak, failing since the first", st, n)
				}
				if (h.w.Stats()).Healthy(time.Now().Add(HealthWindow)) {
					t.Errorf("Healthy(+30s) = true after a streak since %v; want false", failedAt)
				}
				// Success: the backoff resets and the cadence is back.
				c = h.next(t)
				c.notFound()
				prev = c.at
				c = h.next(t)
				if gap := c.at.Sub(prev); gap != time.Second {
					t.Errorf("gap after recovery = %v; want 1s", gap)
				}
				c.fail()
				prev = c.at
				c = h.next(t)
				if gap := c.at.Sub(prev); gap < 50*ms || gap > 100*ms {
					t.Errorf("first wait of a new streak = %v; want in [50ms, 100ms]", gap)
				}
				c.notFound()
				synctest.Wait()
				if st := h.w.Stats().Sources[tt.src]; st.Streak != 0 || !st.FailingSince.IsZero() || !st.LastSuccess.Equal(c.at) {
					t.Errorf("Stats() = %+v; want no streak, LastSuccess %v", st, c.at)
				}
			})
		})
	}
}

func TestRunBackoffJitter(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		h := start(t, Config{Sources: []Source{SourceSpot}, PollInterval: time.Second}, 16)
		defer h.stop(t)
		gaps := make(map[time.Duration]bool)
		var prev time.Time
		for i := range 30 {
			c := h.next(t)
			if i > 5 { // at the cap
				gaps[c.at.Sub(prev)] = true
			}
			prev = c.at
			c.fail()
		}
		if len(gaps) < 2 {
			t.Errorf("waits at the cap = %v; want jitter (different waits)", gaps)
		}
	})
}

// After an outage of IMDS, a source still backing off (the rebalance source's cap is 10 s)
// reads again as soon as another source recovers; a source that fails on its own (a
// malformed body) is not read any faster because the others succeed.
func TestRunRecoveryEndsEveryBackoff(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		h := start(t, Config{Sources: []Source{SourceSpot, SourceRebalance}, PollInterval: time.Second, SpotPollInterval: 250 * time.Millisecond}, 16)
		defer h.stop(t)
		t0 := time.Now()
		var c *call
		for { // IMDS refuses for 20 s: the rebalance source reaches its 10 s cap
			c = h.next(t)
			if c.path == "spot/instance-action" && c.at.Sub(t0) >= 20*time.Second {
				break
			}
			c.fail()
		}
		back := c.at
		c.notFound() // spot recovers
		c = h.next(t)
		if c.path != "events/recommendations/rebalance" || !c.at.Equal(back) {
			t.Fatalf("first read after spot recovered = %s at +%v; want the rebalance source at once", c.path, c.at.Sub(back))
		}
		c.ok(`{"noticeTime": "2020-10-27T08:22:00Z"}`)
		wantEvents(t, h.events(), "begin rebalance/rebalance")

		// The rebalance source fails on its own while spot answers: it backs off as before.
		var gaps []time.Duration
		prev := time.Time{}
		for len(gaps) < 8 {
			c = h.next(t)
			if c.path == "spot/instance-action" {
				c.notFound()
				continue
			}
			if !prev.IsZero() {
				gaps = append(gaps, c.at.Sub(prev))
			}
			prev = c.at
			c.ok(`{"noticeTime": 5}`)
		}
		if last := gaps[len(gaps)-1]; last < 5*time.Second {
			t.Errorf("waits of a source failing alone = %v; want growing to the cap (the last at least 5s)", gaps)
		}
	})
}

func TestRunBeginOncePerKey(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		h := start(t, Config{Sources: []Source{SourceSpot}, PollInterval: time.Second}, 16)
		defer h.stop(t)
		// The simulator recomputes "time" on every request: still one notice.
		var first time.Time
		for i := range 4 {
			c := h.next(t)
			at := c.at.Add(2 * time.Minute).Truncate(time.Second)
			if i == 0 {
				first = at
			}
			c.ok(spotBody("terminate", at))
		}
		evs := h.events()
		wantEvents(t, evs, "begin spot/terminate")
		if len(evs) == 1 && (!evs[0].Notice.Deadline.Equal(first) || evs[0].Notice.Malformed) {
			t.Errorf("Begin notice = %+v; want deadline %v, not malformed", evs[0].Notice, first)
		}
		// The action changes: the new one begins before the old one ends.
		c := h.next(t)
		c.ok(spotBody("stop", c.at.Add(2*time.Minute)))
		wantEvents(t, h.events(), "begin spot/stop", "end spot/terminate")
		c = h.next(t)
		c.ok(spotBody("terminate", c.at.Add(2*time.Minute)))
		wantEvents(t, h.events(), "begin spot/terminate", "end spot/stop")
		// 404: the notice ends.
		c = h.next(t)
		c.notFound()
		evs = h.events()
		wantEvents(t, evs, "end spot/terminate")
		if len(evs) == 1 && !evs[0].At.Equal(c.at) {
			t.Errorf("End.At = %v; want %v", evs[0].At, c.at)
		}
	})
}

// TestRunUpdateWhenDeadlineMovesEarlier: a notice in force read again with a deadline earlier
// than the one last delivered gives an Update with the notice as now read; a deadline that
// moves later gives nothing (the earliest wins), and so does a fail-safe reading.
func TestRunUpdateWhenDeadlineMovesEarlier(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		h := start(t, Config{Sources: []Source{SourceSpot}, PollInterval: time.Second}, 16)
		defer h.stop(t)
		d0 := time.Now().Add(time.Hour).Truncate(time.Second)
		h.next(t).ok(spotBody("terminate", d0))
		wantEvents(t, h.events(), "begin spot/terminate")
		h.next(t).ok(spotBody("terminate", d0.Add(10*time.Second))) // later: noise
		wantEvents(t, h.events())
		c := h.next(t)
		c.ok(spotBody("terminate", d0.Add(-30*time.Second)))
		evs := h.events()
		wantEvents(t, evs, "update spot/terminate")
		if len(evs) == 1 && (!evs[0].Notice.Deadline.Equal(d0.Add(-30*time.Second)) || !evs[0].At.Equal(c.at) || evs[0].First) {
			t.Errorf("Update = %+v; want deadline %v, At %v, First false", evs[0], d0.Add(-30*time.Second), c.at)
		}
		h.next(t).ok(spotBody("terminate", d0.Add(-20*time.Second))) // earlier than the last read, not the last delivered
		h.next(t).ok(spotBody("terminate", d0))
		h.next(t).ok("<html>") // fail safe: due in 2 minutes, earlier, but a guess
		wantEvents(t, h.events())
		h.next(t).ok(spotBody("terminate", d0.Add(-31*time.Second)))
		wantEvents(t, h.events(), "update spot/terminate")
		h.next(t).notFound()
		evs = h.events()
		wantEvents(t, evs, "end spot/terminate")
		if len(evs) == 1 && !evs[0].Notice.Deadline.Equal(d0.Add(-31*time.Second)) {
			t.Errorf("End notice = %+v; want the notice last read", evs[0].Notice)
		}
		// A new notice is compared with its own Begin, not with the one that ended.
		h.next(t).ok(spotBody("terminate", d0.Add(time.Hour)))
		h.next(t).ok(spotBody("terminate", d0.Add(time.Hour)))
		wantEvents(t, h.events(), "begin spot/terminate")
	})
}

// TestRunUpdateScheduled: a scheduled event moved earlier is updated; a rebalance
// recommendation, which has no deadline, never is.
func TestRunUpdateScheduled(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		h := start(t, Config{Sources: []Source{SourceScheduled, SourceRebalance}, PollInterval: time.Second}, 16)
		defer h.stop(t)
		event := func(notBefore string) string {
			return `[{"Code":"instance-stop","State":"active","EventId":"e-1","NotBefore":"` + notBefore + `"}]`
		}
		answers := map[string][]string{
			SourceScheduled.Path(): {event("21 Jan 2019 09:00:43 GMT"), event("22 Jan 2019 09:00:43 GMT"), event("20 Jan 2019 09:00:43 GMT")},
			SourceRebalance.Path(): {`{"noticeTime": "2020-10-27T08:22:00Z"}`, `{"noticeTime": "2020-10-27T08:21:00Z"}`, `{"noticeTime": "2020-10-27T08:20:00Z"}`},
		}
		for range 6 {
			c := h.next(t)
			c.ok(answers[c.path][0])
			answers[c.path] = answers[c.path][1:]
		}
		var got []string
		for _, ev := range h.events() {
			got = append(got, ev.Kind.String()+" "+ev.Notice.Key()+" "+ev.Notice.Deadline.Format(time.DateOnly))
		}
		slices.Sort(got)
		// A scheduled event moved later is taken too (AWS reschedules events); a rebalance's
		// later time is not a deadline, and is not.
		want := []string{"begin rebalance/rebalance 0001-01-01", "begin scheduled/instance-stop/e-1 2019-01-21",
			"update scheduled/instance-stop/e-1 2019-01-20", "update scheduled/instance-stop/e-1 2019-01-22"}
		if !slices.Equal(got, want) {
			t.Errorf("events = %q; want %q", got, want)
		}
	})
}

// TestRunFirst: a Begin is First when no read of its source had succeeded before the read
// that showed it (the notice was in force when the watcher started); a notice that appears
// after a successful read of its source is not First, nor is any Update or End.
func TestRunFirst(t *testing.T) {
	spot := func(c *call) { c.ok(spotBody("terminate", c.at.Add(2*time.Minute))) }
	tests := []struct {
		name  string
		src   Source
		steps []func(*call)
		want  []string // "kind key first"
	}{
		{"in force at start", SourceSpot, []func(*call){spot, spot, (*call).notFound},
			[]string{"begin spot/terminate true", "end spot/terminate false"}},
		{"after failed reads", SourceSpot, []func(*call){(*call).fail, (*call).fail, spot},
			[]string{"begin spot/terminate true"}},
		{"after a 404", SourceSpot, []func(*call){(*call).notFound, spot},
			[]string{"begin spot/terminate false"}},
		{"begins again after its end", SourceSpot, []func(*call){spot, (*call).notFound, spot},
			[]string{"begin spot/terminate true", "end spot/terminate false", "begin spot/terminate false"}},
		{"fail-safe at start, then read", SourceSpot, []func(*call){func(c *call) { c.ok("<html>") }, spot},
			[]string{"begin spot/terminate true", "update spot/terminate false"}},
		{"fail-safe after a 404", SourceSpot, []func(*call){(*call).notFound, func(c *call) { c.ok("<html>") }},
			[]string{"begin spot/terminate false"}},
		{"after a malformed body", SourceRebalance, []func(*call){func(c *call) { c.ok("{}") }, func(c *call) { c.ok(`{"noticeTime": "2020-10-27T08:22:00Z"}`) }},
			[]string{"begin rebalance/rebalance true"}},
		{"every notice of the first read", SourceScheduled, []func(*call){
			func(c *call) {
				c.ok(`[{"Code":"instance-stop","State":"active","EventId":"e-1","NotBefore":"21 Jan 2019 09:00:43 GMT"},` +
					`{"Code":"system-reboot","State":"active","EventId":"e-2","NotBefore":"21 Jan 2019 09:00:43 GMT"}]`)
			},
			func(c *call) {
				c.ok(`[{"Code":"instance-stop","State":"active","EventId":"e-1","NotBefore":"21 Jan 2019 09:00:43 GMT"},` +
					`{"Code":"system-reboot","State":"active","EventId":"e-2","NotBefore":"21 Jan 2019 09:00:43 GMT"},` +
					`{"Code":"instance-retirement","State":"active","EventId":"e-3","NotBefore":"21 Jan 2019 09:00:43 GMT"}]`)
			},
		}, []string{"begin scheduled/instance-stop/e-1 true", "begin scheduled/system-reboot/e-2 true", "begin scheduled/instance-retirement/e-3 false"}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			synctest.Test(t, func(t *testing.T) {
				h := start(t, Config{Sources: []Source{tt.src}, PollInterval: time.Second}, 16)
				defer h.stop(t)
				var got []string
				for _, step := range tt.steps {
					step(h.next(t))
					for _, ev := range h.events() {
						got = append(got, fmt.Sprintf("%s %s %v", ev.Kind, ev.Notice.Key(), ev.First))
					}
				}
				if !slices.Equal(got, tt.want) {
					t.Errorf("events = %q; want %q", got, tt.want)
				}
			})
		})
	}
	// Each source counts its own reads: spot has read nothing but 404s, rebalance nothing yet.
	synctest.Test(t, func(t *testing.T) {
		h := start(t, Config{Sources: []Source{SourceSpot, SourceRebalance}, PollInterval: time.Second}, 16)
		defer h.stop(t)
		for {
			c := h.next(t)
			if c.path == SourceSpot.Path() {
				c.notFound()
				continue
			}
			c.ok(`{"noticeTime": "2020-10-27T08:22:00Z"}`)
			break
		}
		evs := h.events()
		wantEvents(t, evs, "begin rebalance/rebalance")
		if len(evs) == 1 && !evs[0].First {
			t.Errorf("Begin of the first read of rebalance after spot's reads: First = false; want true")
		}
	})
}

func TestRunEndWhenScheduledCanceled(t *testing.T) {
	for _, name := range []string{"scheduled-docs-canceled.json", "scheduled-docs-completed.json"} {
		t.Run(name, func(t *testing.T) {
			synctest.Test(t, func(t *testing.T) {
				h := start(t, Config{Sources: []Source{SourceScheduled}, PollInterval: time.Second}, 16)
				defer h.stop(t)
				for range 2 {
					h.next(t).ok(readTestdata(t, "scheduled-docs-active.json"))
				}
				evs := h.events()
				wantEvents(t, evs, "begin scheduled/system-reboot/instance-event-0d59937288b749b32")
				if len(evs) == 1 && evs[0].Notice.EventID != "instance-event-0d59937288b749b32" {
					t.Errorf("Begin notice = %+v; want the event id", evs[0].Notice)
				}
				h.next(t).ok(readTestdata(t, name))
				wantEvents(t, h.events(), "end scheduled/system-reboot/instance-event-0d59937288b749b32")
				h.next(t).ok(readTestdata(t, name))
				wantEvents(t, h.events())
			})
		})
	}
}

// One unreadable scheduled event (a bad NotBefore: a fail-safe notice) hid the end of the others:
// the answer counted as a failed read, and no notice of the source ended. Every other event of
// the answer counts: one canceled ends. An event without a Code cannot be told from any notice,
// so with one nothing ends.
func TestRunScheduledUnreadableEventDoesNotHideAnEnd(t *testing.T) {
	const (
		a       = `{"Code":"system-reboot","State":"%s","EventId":"e-a","NotBefore":"21 Jan 2030 09:00:43 GMT"}`
		badB    = `{"Code":"instance-stop","State":"active","EventId":"e-b","NotBefore":"soon"}`
		noCodeC = `{"State":"active","EventId":"e-c","NotBefore":"21 Jan 2030 09:00:43 GMT"}`
	)
	synctest.Test(t, func(t *testing.T) {
		h := start(t, Config{Sources: []Source{SourceScheduled}, PollInterval: time.Second}, 16)
		defer h.stop(t)
		h.next(t).ok("[" + fmt.Sprintf(a, "active") + "]")
		wantEvents(t, h.events(), "begin scheduled/system-reboot/e-a")
		h.next(t).ok("[" + fmt.Sprintf(a, "active") + "," + badB + "]")
		wantEvents(t, h.events(), "begin scheduled/instance-stop/e-b")
		h.next(t).ok("[" + fmt.Sprintf(a, "canceled") + "," + badB + "]")
		wantEvents(t, h.events(), "end scheduled/system-reboot/e-a")
		h.next(t).ok("[" + noCodeC + "]")
		wantEvents(t, h.events())
	})
}

func TestRunNoEndOnErrors(t *testing.T) {
	tests := []struct {
		src     Source
		notice  string
		garbage string
		none    func(*call)
		key     string
	}{
		{SourceSpot, `{"action": "terminate", "time": "2017-09-18T08:22:00Z"}`, "<html>", (*call).notFound, "spot/terminate"},
		{SourceRebalance, `{"noticeTime": "2020-10-27T08:22:00Z"}`, "{}", (*call).notFound, "rebalance/rebalance"},
		{SourceScheduled, `[{"Code":"instance-stop","State":"active","EventId":"e-1","NotBefore":"21 Jan 2019 09:00:43 GMT"}]`, "[{]", func(c *call) { c.ok("[]") }, "scheduled/instance-stop/e-1"},
		{SourceASG, "Terminated", "<html>", func(c *call) { c.ok("InService") }, "asg/Terminated"},
	}
	for _, tt := range tests {
		t.Run(string(tt.src), func(t *testing.T) {
			synctest.Test(t, func(t *testing.T) {
				h := start(t, Config{Sources: []Source{tt.src}, PollInterval: time.Second}, 16)
				defer h.stop(t)
				h.next(t).ok(tt.notice)
				evs := h.events()
				wantEvents(t, evs, "begin "+tt.key)
				h.next(t).fail()
				h.next(t).fail()
				h.next(t).ok(tt.garbage)
				wantEvents(t, h.events())
				if st := h.w.Stats().Sources[tt.src]; st.Errors != 3 || st.Streak != 3 {
					t.Errorf("Stats() = %+v; want 3 errors in a streak", st)
				}
				tt.none(h.next(t))
				evs = h.events()
				wantEvents(t, evs, "end "+tt.key)
				if len(evs) == 1 && evs[0].Notice.Malformed {
					t.Errorf("End notice = %+v; want the notice as last read successfully", evs[0].Notice)
				}
			})
		})
	}
}

func TestRunMalformedSpot(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		h := start(t, Config{Sources: []Source{SourceSpot}, PollInterval: time.Second}, 16)
		defer h.stop(t)
		h.next(t).notFound()
		c := h.next(t)
		c.ok(readTestdata(t, "error-page.html"))
		evs := h.events()
		wantEvents(t, evs, "begin spot/terminate")
		if len(evs) == 1 {
			n := evs[0].Notice
			if !n.Malformed || !n.Deadline.Equal(c.at.Add(2*time.Minute)) || n.Raw != readTestdata(t, "error-page.html") {
				t.Errorf("Begin notice = %+v; want malformed, deadline %v, the raw body", n, c.at.Add(2*time.Minute))
			}
		}
		h.next(t).ok("{")
		h.next(t).ok("")
		wantEvents(t, h.events())
		if got := len(h.logs.lines(t, "warn", msgFailed, SourceSpot)); got != 1 {
			t.Errorf("%d Warn lines for 3 malformed bodies; want 1\n%s", got, h.logs)
		}
		if st := h.w.Stats().Sources[SourceSpot]; st.Errors != 3 || st.Polls != 4 {
			t.Errorf("Stats() = %+v; want 3 errors in 4 polls", st)
		}
		// A real notice follows: same key, an Update with its real deadline, though later than
		// the guess; it recovers the streak.
		h.next(t).ok(`{"action": "terminate", "time": "2017-09-18T08:22:00Z"}`)
		evs = h.events()
		wantEvents(t, evs, "update spot/terminate")
		if len(evs) == 1 && (evs[0].Notice.Malformed || !evs[0].Notice.Deadline.Equal(utc("2017-09-18T08:22:00Z"))) {
			t.Errorf("Update notice = %+v; want the well-formed notice", evs[0].Notice)
		}
		// Read again, even later: nothing.
		h.next(t).ok(`{"action": "terminate", "time": "2017-09-18T08:23:00Z"}`)
		wantEvents(t, h.events())
		if got := len(h.logs.lines(t, "info", msgRecovered, SourceSpot)); got != 1 {
			t.Errorf("%d Info lines after recovery; want 1\n%s", got, h.logs)
		}
		h.next(t).notFound()
		evs = h.events()
		wantEvents(t, evs, "end spot/terminate")
		if len(evs) == 1 && (evs[0].Notice.Malformed || !evs[0].Notice.Time.Equal(utc("2017-09-18T08:23:00Z"))) {
			t.Errorf("End notice = %+v; want the well-formed notice last read", evs[0].Notice)
		}
	})
}

func TestRunLogsOncePerStreak(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		h := start(t, Config{Sources: []Source{SourceRebalance}, PollInterval: time.Second}, 16)
		defer h.stop(t)
		for range 3 {
			h.next(t).fail()
		}
		h.next(t).notFound()
		h.next(t).notFound()
		for range 2 {
			h.next(t).fail()
		}
		h.next(t).ok("{}") // malformed: still the same streak
		h.next(t).notFound()
		synctest.Wait()
		warns := h.logs.lines(t, "warn", msgFailed, SourceRebalance)
		infos := h.logs.lines(t, "info", msgRecovered, SourceRebalance)
		if len(warns) != 2 || len(infos) != 2 {
			t.Fatalf("%d Warn and %d Info lines for 2 streaks; want 2 and 2\n%s", len(warns), len(infos), h.logs)
		}
		if warns[0]["error"] == nil || warns[0]["component"] != "imds" {
			t.Errorf("Warn line = %v; want error and component fields", warns[0])
		}
		if infos[0]["errors"] != 3.0 || infos[1]["errors"] != 3.0 || infos[0]["failing_for_s"] == nil {
			t.Errorf("Info lines = %v; want errors 3 and 3 and failing_for_s", infos)
		}
	})
}

// A source failing for longer than HealthWindow makes /healthz 503; that is an error line too,
// once per streak (it was warnings alone; found from outside).
func TestRunSaysAnUnhealthySourceAtErrorOnce(t *testing.T) {
	const msgUnhealthy = "imds reads have failed for longer than the agent stays healthy; its notices are not seen while they fail"
	synctest.Test(t, func(t *testing.T) {
		h := start(t, Config{Sources: []Source{SourceRebalance}, PollInterval: time.Second}, 16)
		defer h.stop(t)
		h.answerPastHealthWindow(t, (*call).fail)
		synctest.Wait()
		if got := len(h.logs.lines(t, "error", msgUnhealthy, SourceRebalance)); got != 1 {
			t.Errorf("%d Error lines for a source failing past HealthWindow; want 1\n%s", got, h.logs)
		}
		h.next(t).notFound()
		h.next(t).fail()
		synctest.Wait()
		if got := len(h.logs.lines(t, "error", msgUnhealthy, SourceRebalance)); got != 1 {
			t.Errorf("%d Error lines after a short streak; want still 1\n%s", got, h.logs)
		}
	})
}

// answerPastHealthWindow answers every read with answer until twice HealthWindow has passed since
// the first.
func (h *harness) answerPastHealthWindow(t *testing.T, answer func(*call)) {
	t.Helper()
	first := h.next(t)
	answer(first)
	for {
		c := h.next(t)
		answer(c)
		if c.at.Sub(first.at) > 2*HealthWindow {
			return
		}
	}
}

// A spot answer that cannot be read is acted on as a notice 2 minutes out: its error line says so,
// not that its notices are not seen (found from outside).
func TestRunSaysAnUnreadableSpotAnswerIsActedOn(t *testing.T) {
	const msg = "imds reads have failed for longer than the agent stays healthy: its answer cannot be read, and is taken for a notice 2 minutes out while it lasts (fail-safe)"
	synctest.Test(t, func(t *testing.T) {
		h := start(t, Config{Sources: []Source{SourceSpot}, PollInterval: time.Second}, 64)
		defer h.stop(t)
		h.answerPastHealthWindow(t, func(c *call) { c.ok("<html>not json</html>") })
		synctest.Wait()
		if got := len(h.logs.lines(t, "error", msg, SourceSpot)); got != 1 {
			t.Errorf("%d Error lines %q for a spot answer unreadable past HealthWindow; want 1\n%s", got, msg, h.logs)
		}
	})
}

func TestRunStops(t *testing.T) {
	tests := []struct {
		name string
		step func(t *testing.T, h *harness) // leaves the watcher blocked somewhere
	}{
		{"in Get", func(t *testing.T, h *harness) { h.next(t) }},
		{"in backoff", func(t *testing.T, h *harness) { h.next(t).fail(); synctest.Wait() }},
		{"in interval", func(t *testing.T, h *harness) { h.next(t).notFound(); synctest.Wait() }},
		{"sending an event", func(t *testing.T, h *harness) {
			h.next(t).ok(`{"action": "stop", "time": "2017-09-18T08:22:00Z"}`)
			synctest.Wait()
		}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			synctest.Test(t, func(t *testing.T) {
				h := start(t, Config{Sources: []Source{SourceSpot}, PollInterval: time.Second}, 0)
				tt.step(t, h)
				h.stop(t) // Run must return; synctest.Test fails if a goroutine is left.
				if st := h.w.Stats().Sources[SourceSpot]; st.Polls > 1 {
					t.Errorf("Stats() = %+v; want at most 1 poll (an aborted read is not counted)", st)
				}
			})
		})
	}
}

// TestRunSlowSourceGetsLongerTimeouts: a source whose reads time out waits twice as long on
// each next read, up to 5 s, and comes back to its default once IMDS answers well in time
// again; it logs one Warn and one Info for the whole stretch.
func TestRunSlowSourceGetsLongerTimeouts(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		h := start(t, Config{Sources: []Source{SourceSpot}, PollInterval: time.Second, SpotPollInterval: 250 * time.Millisecond}, 16)
		defer h.stop(t)
		ms := time.Millisecond
		// timeout returns the timeout of the next read, and leaves that read unanswered.
		timeout := func() time.Duration {
			c := h.next(t)
			return c.deadline.Sub(c.at)
		}
		// read returns the timeout of the next read, and answers it (404) after took.
		read := func(took time.Duration) time.Duration {
			c := h.next(t)
			advance(took)
			c.notFound()
			return c.deadline.Sub(c.at)
		}
		var got []time.Duration
		for range 6 { // IMDS answers nothing in time: 500ms, then doubling up to 5s
			got = append(got, timeout())
		}
		got = append(got, read(2*time.Second)) // answered in 2 s: not well within 5 s
		for range 2 * fastReadsToShrink {      // answered at once: halved every 3 reads
			got = append(got, read(0))
		}
		got = append(got, timeout()) // too slow again: doubled
		for range 3 * fastReadsToShrink {
			got = append(got, read(10*ms))
		}
		for range 3 {
			got = append(got, read(0))
		}
		want := []time.Duration{500 * ms, 1000 * ms, 2000 * ms, 4000 * ms, 5000 * ms, 5000 * ms,
			5000 * ms, 5000 * ms, 5000 * ms, 5000 * ms, 2500 * ms, 2500 * ms, 2500 * ms,
			1250 * ms,
			2500 * ms, 2500 * ms, 2500 * ms, 1250 * ms, 1250 * ms, 1250 * ms, 625 * ms, 625 * ms, 625 * ms,
			500 * ms, 500 * ms, 500 * ms}
		if !slices.Equal(got, want) {
			t.Errorf("timeouts of successive reads = %v; want %v", got, want)
		}
		synctest.Wait()
		warns := h.logs.lines(t, "warn", msgSlow, SourceSpot)
		infos := h.logs.lines(t, "info", msgInTime, SourceSpot)
		if len(warns) != 1 || len(infos) != 1 {
			t.Fatalf("%d Warn and %d Info lines for one stretch; want 1 and 1\n%s", len(warns), len(infos), h.logs)
		}
		if warns[0]["timeout_s"] != 1.0 || warns[0]["default_timeout_s"] != 0.5 || infos[0]["timeout_s"] != 0.5 {
			t.Errorf("Warn, Info = %v, %v; want timeout_s 1 and default_timeout_s 0.5, then timeout_s 0.5", warns[0], infos[0])
		}
		if st := h.w.Stats().Sources[SourceSpot]; st.Errors != 7 {
			t.Errorf("Stats() = %+v; want 7 errors (the reads that timed out)", st)
		}
	})
}

// TestRunHealthySourceKeepsDefaultTimeout: reads that answer in time, however slowly, and
// failures other than timeouts leave the request timeout as configured.
func TestRunHealthySourceKeepsDefaultTimeout(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		h := start(t, Config{Sources: []Source{SourceRebalance}, PollInterval: time.Second}, 16)
		defer h.stop(t)
		steps := []func(c *call){
			(*call).notFound,
			func(c *call) { advance(999 * time.Millisecond); c.notFound() },
			(*call).fail,
			(*call).fail,
			func(c *call) { c.ok("{}") }, // malformed
			func(c *call) { advance(900 * time.Millisecond); c.fail() },
			(*call).notFound,
		}
		for i, step := range steps {
			c := h.next(t)
			if d := c.deadline.Sub(c.at); d != time.Second {
				t.Errorf("read %d: timeout %v; want 1s", i, d)
			}
			step(c)
		}
		synctest.Wait()
		if lines := h.logs.lines(t, "warn", msgSlow, ""); len(lines) != 0 {
			t.Errorf("%d Warn lines about a slow IMDS; want 0\n%s", len(lines), h.logs)
		}
	})
}

func TestRunUnknownSource(t *testing.T) {
	w := NewWatcher(getterFunc(func(context.Context, string) ([]byte, bool, error) {
		t.Error("Get called; want no read with a bad config")
		return nil, false, nil
	}), Config{Sources: []Source{SourceSpot, "bogus"}})
	if err := w.Run(t.Context(), make(chan Event)); err == nil {
		t.Errorf("Run() with an unknown source = nil; want an error")
	}
}

func TestNewWatcherDefaults(t *testing.T) {
	w := NewWatcher(getterFunc(nil), Config{Sources: []Source{SourceASG, SourceSpot, SourceASG}})
	if !slices.Equal(w.sources, []Source{SourceASG, SourceSpot}) {
		t.Errorf("sources = %q; want [asg spot]", w.sources)
	}
	if w.interval != time.Second || w.intervalOf(SourceSpot) != time.Second || w.requestTimeout(SourceASG) != time.Second {
		t.Errorf("interval, spot interval, timeout = %v, %v, %v; want 1s, 1s, 1s", w.interval, w.intervalOf(SourceSpot), w.requestTimeout(SourceASG))
	}
	if got := len(w.Stats().Sources); got != 2 {
		t.Errorf("len(Stats().Sources) = %d; want 2", got)
	}
	// The spot source on its own interval; each source's request timeout follows its own.
	w = NewWatcher(getterFunc(nil), Config{PollInterval: 3 * time.Second, SpotPollInterval: 200 * time.Millisecond})
	if got := []time.Duration{w.intervalOf(SourceSpot), w.intervalOf(SourceRebalance), w.requestTimeout(SourceSpot), w.requestTimeout(SourceScheduled)}; !slices.Equal(got,
		[]time.Duration{200 * time.Millisecond, 3 * time.Second, 500 * time.Millisecond, 3 * time.Second}) {
		t.Errorf("spot interval, rebalance interval, spot timeout, scheduled timeout = %v; want [200ms 3s 500ms 3s]", got)
	}
}

func TestCheck(t *testing.T) {
	errDown := errors.New("down")
	tests := []struct {
		name    string
		src     Source
		body    string
		found   bool
		err     error
		want    []string // keys
		wantErr error    // checked with errors.Is; nil means no error
	}{
		{"spot 404", SourceSpot, "", false, nil, nil, nil},
		{"spot notice", SourceSpot, `{"action": "hibernate", "time": "2017-09-18T08:22:00Z"}`, true, nil, []string{"spot/hibernate"}, nil},
		{"spot malformed fails safe", SourceSpot, "<html>", true, nil, []string{"spot/terminate"}, ErrMalformed},
		{"spot error", SourceSpot, "", false, errDown, nil, errDown},
		{"rebalance notice", SourceRebalance, `{"noticeTime": "2020-10-27T08:22:00Z"}`, true, nil, []string{"rebalance/rebalance"}, nil},
		{"rebalance malformed", SourceRebalance, `{"noticeTime": 5}`, true, nil, nil, ErrMalformed},
		{"scheduled 404", SourceScheduled, "", false, nil, nil, nil},
		{"scheduled canceled", SourceScheduled, `[{"Code":"system-reboot","State":"canceled","EventId":"e","NotBefore":"21 Jan 2019 09:00:43 GMT"}]`, true, nil, nil, nil},
		{"scheduled malformed", SourceScheduled, `[`, true, nil, nil, ErrMalformed},
		{"asg in service", SourceASG, "InService", true, nil, nil, nil},
		{"asg terminated", SourceASG, "Terminated", true, nil, []string{"asg/Terminated"}, nil},
		{"asg error", SourceASG, "", false, errDown, nil, errDown},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			w := NewWatcher(getterFunc(func(ctx context.Context, path string) ([]byte, bool, error) {
				if path != tt.src.Path() {
					t.Errorf("Get(%q); want %q", path, tt.src.Path())
				}
				if _, ok := ctx.Deadline(); !ok {
					t.Errorf("Get without a deadline; want the request timeout")
				}
				return []byte(tt.body), tt.found, tt.err
			}), Config{})
			got, err := w.Check(t.Context(), tt.src)
			var keys []string
			for _, n := range got {
				keys = append(keys, n.Key())
			}
			if !slices.Equal(keys, tt.want) {
				t.Errorf("Check(%q) = %q; want %q", tt.src, keys, tt.want)
			}
			if (err == nil) != (tt.wantErr == nil) || !errors.Is(err, tt.wantErr) {
				t.Errorf("Check(%q) error = %v; want %v", tt.src, err, tt.wantErr)
			}
		})
	}
	t.Run("unknown source", func(t *testing.T) {
		w := NewWatcher(getterFunc(nil), Config{})
		if _, err := w.Check(t.Context(), "bogus"); err == nil {
			t.Errorf("Check(%q) error = nil; want an error", "bogus")
		}
	})
}

func TestCheckRequestTimeout(t *testing.T) {
	tests := []struct {
		interval, timeout, want time.Duration
	}{
		{time.Second, 0, time.Second},
		{100 * time.Millisecond, 0, 500 * time.Millisecond},
		{2 * time.Second, 0, 2 * time.Second},
		{time.Second, 50 * time.Millisecond, 50 * time.Millisecond},
	}
	for _, tt := range tests {
		t.Run(fmt.Sprintf("%v,%v", tt.interval, tt.timeout), func(t *testing.T) {
			synctest.Test(t, func(t *testing.T) {
				hang := getterFunc(func(ctx context.Context, path string) ([]byte, bool, error) {
					<-ctx.Done()
					return nil, false, ctx.Err()
				})
				w := NewWatcher(hang, Config{PollInterval: tt.interval, RequestTimeout: tt.timeout})
				t0 := time.Now()
				_, err := w.Check(t.Context(), SourceSpot)
				if got := time.Since(t0); got != tt.want || !errors.Is(err, context.DeadlineExceeded) {
					t.Errorf("Check() = %v after %v; want DeadlineExceeded after %v", err, got, tt.want)
				}
			})
		})
	}
}

func TestStatsHealthy(t *testing.T) {
	t0 := time.Date(2026, 11, 29, 16, 0, 0, 0, time.UTC)
	ok := SourceStats{LastSuccess: t0}
	failing := func(since time.Time) SourceStats { return SourceStats{Streak: 3, FailingSince: since} }
	tests := []struct {
		name  string
		stats Stats
		now   time.Time
		want  bool
	}{
		{"not started", Stats{}, t0, true},
		{"all fine", Stats{Sources: map[Source]SourceStats{SourceSpot: ok}, LastSuccess: t0}, t0.Add(time.Hour), true},
		{"failing 10s, never succeeded", Stats{Sources: map[Source]SourceStats{SourceSpot: failing(t0)}}, t0.Add(10 * time.Second), true},
		{"failing 30s exactly", Stats{Sources: map[Source]SourceStats{SourceSpot: failing(t0)}}, t0.Add(30 * time.Second), true},
		{"failing 31s, never succeeded", Stats{Sources: map[Source]SourceStats{SourceSpot: failing(t0)}}, t0.Add(31 * time.Second), false},
		{"failing 31s after a success", Stats{Sources: map[Source]SourceStats{SourceSpot: failing(t0.Add(time.Second))}, LastSuccess: t0}, t0.Add(32 * time.Second), false},
		{"one source failing long, another reads", Stats{Sources: map[Source]SourceStats{
			SourceASG: failing(t0), SourceSpot: {LastSuccess: t0.Add(59 * time.Second)}}, LastSuccess: t0.Add(59 * time.Second)}, t0.Add(time.Minute), true},
		{"all failing, oldest streak counts", Stats{Sources: map[Source]SourceStats{
			SourceASG: failing(t0), SourceSpot: failing(t0.Add(50 * time.Second))}}, t0.Add(time.Minute), false},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			if got := tt.stats.Healthy(tt.now); got != tt.want {
				t.Errorf("Healthy(%v) = %v; want %v", tt.now.Sub(t0), got, tt.want)
			}
		})
	}
}

func BenchmarkCheckSpot(b *testing.B) {
	body := []byte(readTestdata(b, "spot-aemm.json"))
	w := NewWatcher(getterFunc(func(context.Context, string) ([]byte, bool, error) {
		return body, true, nil
	}), Config{})
	ctx := context.Background()
	b.ReportAllocs()
	for b.Loop() {
		if _, err := w.Check(ctx, SourceSpot); err != nil {
			b.Fatal(err)
		}
	}
}
