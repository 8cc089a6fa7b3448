package checkpoint

import (
	"context"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"math/rand/v2"
	"net/http"
	"time"

	"github.com/aws/aws-sdk-go-v2/aws"
	"github.com/aws/aws-sdk-go-v2/aws/retry"
)

// restoreRetryFor is how long Restore keeps trying one read of the store (the job's listings and
// manifests, one file's download) that fails for a reason that passes (restoreTransient), from
// its first failure. spotguard-restore.service is a oneshot the trainer needs: a store that
// refuses connections for a few seconds at boot must not keep training from starting. A
// variable for tests.
var restoreRetryFor = 5 * time.Minute

const (
	// restoreRetryFirst is the wait before the first retry; it doubles up to restoreRetryMax,
	// each wait drawn between half and all of it.
	restoreRetryFirst = time.Second
	restoreRetryMax   = 15 * time.Second
)

// restoreRetryDelay is the wait before retry attempt (1, 2, …): 1 s doubling to 15 s, jittered.
func restoreRetryDelay(attempt int) time.Duration {
	d := min(restoreRetryFirst<<min(max(attempt, 1)-1, 8), restoreRetryMax)
	return d/2 + rand.N(d/2+1)
}

// restoreSlowRead is how long a read of the job (its listings, LATEST, a manifest) may go
// unanswered before the log says so, once: the S3 client's own attempts at a store that never
// answers take minutes before the first failure. A variable for tests.
var restoreSlowRead = 30 * time.Second

// retry runs fn, one read of the store, until it succeeds, fails for a reason that does not
// pass, or has failed for restoreRetryFor since its first failure; it waits restoreRetryDelay
// between attempts. The SDK has retried each request of fn already (OpenStore: 10 attempts);
// this rides out an outage longer than those. After the first failure, an attempt at a read of
// the job (what not "file": a download may rightly take longer) is cut at the end of
// restoreRetryFor, so a store that never answers fails the restore then, not an attempt later.
// It returns:
//   - nil: fn succeeded (at once or after retries);
//   - fn's error, as it is: it does not pass (restoreTransient false: access denied, no such
//     bucket or key, a damaged or invalid object, a local error), or ctx ended;
//   - fn's last error, wrapped with how long the store failed: it kept failing for
//     restoreRetryFor;
//   - an error wrapping ctx.Err() and naming fn's last error: ctx ended while waiting to retry.
//
// The log gets one warning when the store starts failing (the first read of the restore to
// fail while none is failing) and one line when it answers again (the last failing read
// succeeded), not a line per attempt: reads that fail together are one outage. A read of the
// job unanswered for restoreSlowRead is a warning too, once a restore.
func (r *restoreRun) retry(ctx context.Context, what string, fn func(context.Context) error) error {
	var first time.Time
	var last error
	for attempt := 1; ; attempt++ {
		actx, cancel := ctx, context.CancelFunc(func() {})
		if !first.IsZero() && what != "file" {
			actx, cancel = context.WithDeadline(ctx, first.Add(restoreRetryFor))
		}
		slow := r.watchSlow(what)
		err := fn(actx)
		slow()
		cut := err != nil && actx.Err() != nil && ctx.Err() == nil
		cancel()
		if cut {
			r.outageEnd(false)
			return fmt.Errorf("the store kept failing for %.0f s (restore retries for %v): %w", time.Since(first).Seconds(), restoreRetryFor, last)
		}
		if err == nil || ctx.Err() != nil || !restoreTransient(err) {
			if !first.IsZero() {
				r.outageEnd(err == nil)
			}
			return err
		}
		last = err
		now := time.Now()
		if first.IsZero() {
			first = now
			r.outageBegin(what, err)
		}
		failing := now.Sub(first)
		if failing >= restoreRetryFor {
			r.outageEnd(false)
			return fmt.Errorf("the store kept failing for %.0f s (restore retries for %v): %w", failing.Seconds(), restoreRetryFor, err)
		}
		t := time.NewTimer(min(restoreRetryDelay(attempt), restoreRetryFor-failing))
		select {
		case <-t.C:
		case <-ctx.Done():
			t.Stop()
			r.outageEnd(false)
			return fmt.Errorf("%w while waiting to retry a failed read of the store (%v)", ctx.Err(), err)
		}
	}
}

// watchSlow says, once a restore, that a read of the job (what not "file") has gone unanswered
// for restoreSlowRead, if it has by the time the returned function is called.
func (r *restoreRun) watchSlow(what string) (stop func()) {
	if what == "file" {
		return func() {}
	}
	t := time.AfterFunc(restoreSlowRead, func() {
		r.mu.Lock()
		defer r.mu.Unlock()
		if r.slowSaid {
			return
		}
		r.slowSaid = true
		r.log.Warn().Str("read", what).Float64("unanswered_s", logSeconds(restoreSlowRead)).Float64("retry_for_s", logSeconds(restoreRetryFor)).
			Msg("the store has not answered a read of the job yet; restore keeps trying (the S3 client's own attempts, then up to retry_for_s more)")
	})
	return func() { t.Stop() }
}

// outageBegin counts one more read that is failing, and logs the outage if it is the first.
func (r *restoreRun) outageBegin(what string, err error) {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.failing++
	if r.failing > 1 {
		return
	}
	r.failingSince = time.Now()
	r.log.Warn().Err(err).Str("read", what).Float64("retry_for_s", logSeconds(restoreRetryFor)).
		Msg("the store is failing; restore keeps trying")
}

// outageEnd counts one read less that is failing: it succeeded (ok) or gave up. When the last
// one succeeds, it logs that the store answers again.
func (r *restoreRun) outageEnd(ok bool) {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.failing--
	if r.failing > 0 || !ok {
		return
	}
	// At the failing line's level: where one is shown, so is its end (the CLI shows warnings).
	r.log.Warn().Float64("outage_s", logSeconds(time.Since(r.failingSince))).
		Msg("the store answers again; restore goes on")
}

// restoreTransient reports whether err, from a read of the store, says the store could not be
// reached or was overloaded for a while, so that trying again later may succeed: a connection
// refused, reset or timed out, a DNS lookup that failed for now, a response body that broke off
// or stalled, HTTP 5xx or 429, S3's SlowDown and other throttling or retryable error codes (the
// SDK's own judgement of an error, retry.DefaultRetryables). It is false for everything a wait
// does not fix: access denied, wrong credentials, no such bucket or key, an object that is
// damaged, changed or invalid, a local file system error (the file store's, the destination's),
// and a cancelled context.
func restoreTransient(err error) bool {
	var pathErr *fs.PathError
	switch {
	case err == nil, errors.Is(err, context.Canceled),
		errors.Is(err, ErrNotFound), errors.Is(err, ErrDamaged), errors.Is(err, ErrExists), errors.Is(err, ErrPrecondition),
		errors.As(err, &pathErr):
		return false
	case errors.Is(err, errStalled), errors.Is(err, io.ErrUnexpectedEOF):
		return true
	case certificateNotTrusted(err) == aws.FalseTernary:
		// No try makes it trusted (found from outside: a restore retried an untrusted
		// certificate for its 5 minutes, holding the trainer's start).
		return false
	}
	if s3HTTPStatus(err) == http.StatusTooManyRequests {
		return true
	}
	return retry.IsErrorRetryables(retry.DefaultRetryables).IsErrorRetryable(err) == aws.TrueTernary
}
