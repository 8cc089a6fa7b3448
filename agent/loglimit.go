package agent

import (
	"strings"
	"sync"
	"time"

	"github.com/rs/zerolog"
)

// logLimiter lets the first of a run of identical log lines through, then at most one per
// interval, and says how many were held back in between; so a failure that repeats every few
// milliseconds (a store that refuses every upload) is one line a minute with a count, not
// hundreds. Lines are identical when their keys are: the caller builds the key from what makes a
// failure the same (kind, checkpoint, reason, error code), never from text that changes on every
// attempt such as request ids. It is safe for concurrent use.
type logLimiter struct {
	interval time.Duration

	mu   sync.Mutex
	runs map[string]*logRun
}

// logRun is one key's state: when a line with it was last let through, and how many lines were
// held back since.
type logRun struct {
	logged time.Time
	held   int
}

// maxLogRuns bounds the keys kept; past it, keys idle for more than 10 intervals are dropped.
const maxLogRuns = 256

func newLogLimiter(interval time.Duration) *logLimiter {
	return &logLimiter{interval: interval, runs: map[string]*logRun{}}
}

// allow reports whether a line with key may be logged at now. It returns:
//   - true, 0: the first line with key (or the first after forget, or after a quiet interval);
//   - true, n: a line with key was logged at least one interval ago; n lines were held back
//     since, to be reported with this one;
//   - false, n: a line with key was logged less than an interval ago; this one is held back, and
//     n counts it.
func (l *logLimiter) allow(key string, now time.Time) (bool, int) {
	l.mu.Lock()
	defer l.mu.Unlock()
	r, ok := l.runs[key]
	if !ok {
		if len(l.runs) >= maxLogRuns {
			for k, r := range l.runs {
				if now.Sub(r.logged) > 10*l.interval {
					delete(l.runs, k)
				}
			}
		}
		l.runs[key] = &logRun{logged: now}
		return true, 0
	}
	if now.Sub(r.logged) < l.interval {
		r.held++
		return false, r.held
	}
	held := r.held
	r.logged, r.held = now, 0
	return true, held
}

// forget ends the runs of every key that starts with prefix (the failure is over) and returns
// how many of their lines were held back and never reported.
func (l *logLimiter) forget(prefix string) int {
	l.mu.Lock()
	defer l.mu.Unlock()
	held := 0
	for k, r := range l.runs {
		if strings.HasPrefix(k, prefix) {
			held += r.held
			delete(l.runs, k)
		}
	}
	return held
}

// logSeconds is d in seconds, to the millisecond, for a log field whose name ends in _s (every
// duration the agent logs is one).
func logSeconds(d time.Duration) float64 { return d.Round(time.Millisecond).Seconds() }

// logTime adds t to e as key, unless t is the zero time (a notice without a deadline): the log
// never shows 0001-01-01T00:00:00Z.
func logTime(e *zerolog.Event, key string, t time.Time) *zerolog.Event {
	if t.IsZero() {
		return e
	}
	return e.Time(key, t)
}
