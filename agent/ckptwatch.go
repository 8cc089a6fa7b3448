package agent

import (
	"context"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"sync"
	"time"

	"github.com/rs/zerolog"

	"github.com/spotguard/spotguard/checkpoint"
)

// CheckpointWatcher is what the agent runs to see checkpoints (checkpoint.Watcher).
type CheckpointWatcher interface {
	Run(ctx context.Context, out chan<- checkpoint.WatchEvent) error
}

// Timings of the checkpoint watch's supervision.
const (
	// dirPollInterval is how often a checkpoint.dir that does not exist yet is looked for.
	dirPollInterval = 2 * time.Second
	// watchRetryMax caps the pause before the watcher is started again after a failure.
	watchRetryMax = 30 * time.Second
	// watchLogEvery is how often a failure that keeps coming back is logged again, with a count.
	watchLogEvery = time.Minute
)

// checkpointWatch runs the checkpoint watcher for as long as the agent runs. It waits for
// checkpoint.dir to exist (on a fresh instance the trainer creates it), runs the watcher, and when
// the watcher fails (fsnotify cannot start, an inotify limit) says so once per cause, with a
// count, and starts it again after a pause. When checkpoint.dir itself is removed (moved or
// deleted) it waits for it again, as for one not created yet, and the new watcher reads it in
// full. It never ends the agent: trouble on the checkpoint side must not stop IMDS polling and
// signalling.
type checkpointWatch struct {
	cfg        checkpoint.WatchConfig
	newWatcher func(checkpoint.WatchConfig) (CheckpointWatcher, error)
	log        zerolog.Logger
	// ready is called once: when the watch is first in place, or when waiting for the
	// directory begins (waiting is healthy).
	ready     func()
	readyOnce sync.Once

	mu       sync.Mutex
	state    string // "starting", "waiting", "watching" or "failing"
	lastErr  string
	since    time.Time
	failures int
	logged   time.Time // when the current failure was last logged
	// unwatched is what the watcher says about directories it cannot watch (the inotify watch
	// limit): they are polled instead; "" while every directory is watched.
	unwatched string
	// gone: checkpoint.dir was removed while watched, and has not been seen since.
	gone bool
	// read: Run sent a ReadDone of its own (noRead).
	read bool
}

// The states of a checkpointWatch.
const (
	watchStarting = "starting"
	watchWaiting  = "waiting"
	watchWatching = "watching"
	watchFailing  = "failing"
)

func newCheckpointWatch(cfg checkpoint.WatchConfig, newWatcher func(checkpoint.WatchConfig) (CheckpointWatcher, error), log zerolog.Logger, ready func()) *checkpointWatch {
	w := &checkpointWatch{newWatcher: newWatcher, log: log.With().Str("component", "checkpoint-watch").Logger(),
		ready: ready, state: watchStarting, since: time.Now()}
	cfg.Ready = func() { w.set(watchWatching, ""); w.readyOnce.Do(w.ready) }
	cfg.Unwatched = w.setUnwatched
	w.cfg = cfg
	return w
}

// newCheckpointWatcher is the real watcher.
func newCheckpointWatcher(cfg checkpoint.WatchConfig) (CheckpointWatcher, error) {
	return checkpoint.NewWatcher(cfg)
}

// Run watches until ctx is done; it returns nil then, and never before.
func (w *checkpointWatch) Run(ctx context.Context, out chan<- checkpoint.WatchEvent) error {
	attempt := 0
	for ctx.Err() == nil {
		if _, err := os.Stat(w.cfg.Dir); errors.Is(err, fs.ErrNotExist) {
			if w.set(watchWaiting, "") {
				if w.isGone() {
					w.log.Warn().Str("dir", w.cfg.Dir).Msg("checkpoint.dir was removed; waiting for it to be made again")
				} else {
					w.log.Warn().Str("dir", w.cfg.Dir).Msg("checkpoint.dir does not exist yet; waiting for it (the trainer creates it)")
				}
			}
			w.readyOnce.Do(w.ready)
			w.noRead(ctx, out)
			if !sleepCtx(ctx, dirPollInterval) {
				break
			}
			continue
		}
		err := w.runOnce(ctx, out)
		if ctx.Err() != nil {
			break
		}
		if errors.Is(err, checkpoint.ErrDirGone) {
			attempt = 0 // it will be waited for, or watched again at once if it is there again
			w.setGone(true)
			continue
		}
		attempt++
		w.fail(err)
		w.noRead(ctx, out)
		if !sleepCtx(ctx, min(time.Second<<min(attempt-1, 5), watchRetryMax)) {
			break
		}
	}
	return nil
}

// noRead sends, once, the ReadDone of a read that cannot be made (checkpoint.dir not there, or
// the watcher failing): a stop then waits for nothing on disk
// (checkpoint.UploaderConfig.AwaitFirstRead). One after a watcher's own is taken for nothing.
func (w *checkpointWatch) noRead(ctx context.Context, out chan<- checkpoint.WatchEvent) {
	if w.read || !w.cfg.ReadDone {
		return
	}
	w.read = true
	select {
	case out <- checkpoint.WatchEvent{Kind: checkpoint.ReadDone, At: time.Now()}:
	case <-ctx.Done():
	}
}

// runOnce makes a watcher and runs it until it returns.
func (w *checkpointWatch) runOnce(ctx context.Context, out chan<- checkpoint.WatchEvent) error {
	cw, err := w.newWatcher(w.cfg)
	if err != nil {
		return err
	}
	err = cw.Run(ctx, out)
	if err == nil && ctx.Err() == nil {
		err = errors.New("checkpoint watcher stopped")
	}
	return dirInUse(err)
}

// dirInUse explains err when it says that another agent watches checkpoint.dir
// (checkpoint.ErrDirInUse); other errors are returned as they are.
func dirInUse(err error) error {
	if !errors.Is(err, checkpoint.ErrDirInUse) {
		return err
	}
	return fmt.Errorf("checkpoint.dir %w: two agents uploading one directory commit every checkpoint twice, and both signal the trainer; stop the other, or give each agent its own checkpoint.dir", err)
}

// set moves to state (with the error text of a failure) and reports whether the state changed.
func (w *checkpointWatch) set(state, errText string) bool {
	w.mu.Lock()
	defer w.mu.Unlock()
	if state == watchWatching {
		w.gone = false
	}
	if w.state == state && w.lastErr == errText {
		return false
	}
	if state != watchFailing {
		w.failures = 0
	}
	w.state, w.lastErr, w.since = state, errText, time.Now()
	return true
}

// setUnwatched takes what the watcher says about the directories it cannot watch
// (checkpoint.WatchConfig.Unwatched): "" when there are none.
func (w *checkpointWatch) setUnwatched(problem string) {
	w.mu.Lock()
	defer w.mu.Unlock()
	w.unwatched = problem
}

// setGone records whether checkpoint.dir was removed while watched.
func (w *checkpointWatch) setGone(gone bool) {
	w.mu.Lock()
	defer w.mu.Unlock()
	w.gone = gone
}

// isGone reports whether checkpoint.dir was removed while watched and not seen since.
func (w *checkpointWatch) isGone() bool {
	w.mu.Lock()
	defer w.mu.Unlock()
	return w.gone
}

// fail records a failure and logs it: at once for a new cause, then once per watchLogEvery with
// the count of failures since.
func (w *checkpointWatch) fail(err error) {
	w.mu.Lock()
	newCause := w.state != watchFailing || w.lastErr != err.Error()
	if newCause {
		w.state, w.lastErr, w.since, w.failures = watchFailing, err.Error(), time.Now(), 0
	}
	w.failures++
	n, since := w.failures, w.since
	logNow := newCause || time.Since(w.logged) >= watchLogEvery
	if logNow {
		w.logged = time.Now()
	}
	w.mu.Unlock()
	if logNow {
		w.log.Error().Err(err).Int("failures", n).Time("since", since).
			Msg("checkpoint watcher failed; starting it again (IMDS polling and signalling go on)")
	}
}

// health says whether the checkpoint watch is as it should be: watching, or waiting for a
// checkpoint.dir not created yet or removed (healthy, and said so); not while the watcher keeps
// failing. Watching with directories that cannot be watched (the inotify watch limit: they are
// polled, so checkpoints are still seen, a little later) is healthy, and said so.
func (w *checkpointWatch) health() (ok bool, detail string) {
	w.mu.Lock()
	defer w.mu.Unlock()
	switch w.state {
	case watchFailing:
		return false, fmt.Sprintf("checkpoint watcher failing since %s (%d failures): %s", w.since.UTC().Format(time.RFC3339), w.failures, w.lastErr)
	case watchWaiting:
		if w.gone {
			return true, "checkpoint.dir " + w.cfg.Dir + " was removed; waiting for it to be made again"
		}
		return true, "waiting for checkpoint.dir " + w.cfg.Dir + " to be created"
	}
	if w.unwatched != "" {
		return true, "checkpoint watcher: " + w.unwatched
	}
	return true, ""
}

// sleepCtx waits d or until ctx is done; it reports whether d passed (at once for d <= 0,
// unless ctx is done).
func sleepCtx(ctx context.Context, d time.Duration) bool {
	if d <= 0 {
		return ctx.Err() == nil
	}
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case <-t.C:
		return true
	case <-ctx.Done():
		return false
	}
}
