package agent

import (
	"bytes"
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/rs/zerolog"
)

func TestLogLimiter(t *testing.T) {
	l := newLogLimiter(time.Minute)
	t0 := time.Date(2030, 1, 1, 0, 0, 0, 0, time.UTC)
	type step struct {
		at       time.Duration
		key      string
		wantOK   bool
		wantHeld int
	}
	for i, s := range []step{
		{0, "a", true, 0},                 // the first of a run goes through
		{time.Second, "a", false, 1},      // held back, counted
		{2 * time.Second, "a", false, 2},  // held back, counted
		{2 * time.Second, "b", true, 0},   // another key is another run
		{59 * time.Second, "a", false, 3}, // still within the interval
		{60 * time.Second, "a", true, 3},  // one interval later: logged, with the 3 held back
		{61 * time.Second, "a", false, 1}, // and the count starts again
		{5 * time.Minute, "a", true, 1},   // a quiet spell: the next is logged with the one held
		{5 * time.Minute, "b", true, 0},
	} {
		ok, held := l.allow(s.key, t0.Add(s.at))
		if ok != s.wantOK || held != s.wantHeld {
			t.Errorf("step %d: allow(%q, +%s) = %v, %d; want %v, %d", i, s.key, s.at, ok, held, s.wantOK, s.wantHeld)
		}
	}
	if ok, _ := l.allow("a", t0.Add(5*time.Minute+time.Second)); ok {
		t.Errorf("allow right after a logged line = true; want false")
	}
	if held := l.forget("a"); held != 1 {
		t.Errorf("forget(a) = %d; want the 1 line held back", held)
	}
	if ok, held := l.allow("a", t0.Add(5*time.Minute+2*time.Second)); !ok || held != 0 {
		t.Errorf("allow after forget = %v, %d; want a new run: true, 0", ok, held)
	}

	// Keys are bounded: idle ones are dropped when there are too many.
	for i := range 2 * maxLogRuns {
		l.allow(fmt.Sprint("k", i), t0.Add(time.Duration(i)*time.Hour))
	}
	if n := len(l.runs); n > maxLogRuns+1 {
		t.Errorf("runs kept = %d; want at most %d", n, maxLogRuns+1)
	}
}

func TestLogSeconds(t *testing.T) {
	tests := []struct {
		d    time.Duration
		want string
	}{
		{time.Second, `"x_s":1`},
		{1531823456 * time.Nanosecond, `"x_s":1.532`},
		{119408823 * time.Microsecond, `"x_s":119.409`},
		{-250 * time.Millisecond, `"x_s":-0.25`},
		{0, `"x_s":0`},
	}
	for _, tt := range tests {
		var b bytes.Buffer
		log := zerolog.New(&b)
		log.Info().Float64("x_s", logSeconds(tt.d)).Send()
		if !strings.Contains(b.String(), tt.want) {
			t.Errorf("Got(%v) = %s; want %s", tt.d, b.String(), tt.want)
		}
	}
}

// TestLogTime: a zero time (a notice without a deadline) is no field, never 0001-01-01.
func TestLogTime(t *testing.T) {
	at := time.Date(2026, 11, 29, 16, 44, 18, 0, time.UTC)
	tests := []struct {
		name string
		t    time.Time
		want string
	}{
		{"zero", time.Time{}, `{"level":"info"}`},
		{"set", at, `{"level":"info","deadline":"2026-11-29T16:44:18Z"}`},
	}
	for _, tt := range tests {
		var b bytes.Buffer
		log := zerolog.New(&b)
		logTime(log.Info(), "deadline", tt.t).Send()
		if got := strings.TrimSpace(b.String()); got != tt.want {
			t.Errorf("Got(%s) = %s; want %s", tt.name, got, tt.want)
		}
	}
}
