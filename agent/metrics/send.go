package metrics

import (
	"context"
	"errors"
	"fmt"
	"math/rand/v2"
	"strings"
	"time"

	"github.com/aws/aws-sdk-go-v2/aws"
	"github.com/aws/aws-sdk-go-v2/aws/retry"
	v4 "github.com/aws/aws-sdk-go-v2/aws/signer/v4"
	"github.com/aws/aws-sdk-go-v2/service/cloudwatch"
	"github.com/aws/smithy-go"
)

// The fixed log messages.
const (
	msgOverflow  = "metrics buffer full; dropped the oldest datums"
	msgInvalid   = "metric datum invalid for cloudwatch; dropped"
	msgBadBase   = "base dimension invalid for cloudwatch; skipped"
	msgSetup     = "cloudwatch credentials, region or permission missing; metrics are dropped until fixed"
	msgPutFailed = "cloudwatch put failed"
	msgRecovered = "cloudwatch put recovered"
)

// mode is the kind of flush.
type mode int

const (
	modePeriodic mode = iota // every Interval: one call per batch, the SDK's retries
	modeNotice               // on FlushNow: NoticeCallTimeout per attempt, NoticeRetries
	modeFinal                // after Run's context ended: as notice, within 1.5 s in all
)

func (m mode) String() string {
	switch m {
	case modePeriodic:
		return "periodic"
	case modeNotice:
		return "notice"
	case modeFinal:
		return "final"
	default:
		return "unknown"
	}
}

// flush sends carry, then everything buffered, as m says. A call that fails is dropped
// (counted in DroppedFailed); when the failure says the endpoint or the setup is broken
// (credentials or region missing, throttling or 5xx after the retries, timeouts, connection
// errors), the rest of the flush is dropped too rather than waiting on each call in turn.
// It returns, for a periodic or notice flush cut by ctx, the batches it did not finish (the one
// in flight included) so that the final flush sends them; nil otherwise.
func (c *CloudWatch) flush(ctx context.Context, m mode, carry []batch) []batch {
	hi, lo := c.take()
	var base []dim
	if c.base != nil {
		var bad []string
		base, bad = baseDims(c.base())
		if len(bad) > 0 && c.firstTime(&c.logs.badBaseWarned) {
			c.log.Warn().Strs("dimensions", bad).Msg(msgBadBase)
		}
	}
	b := build(hi, lo, base, c.aggs)
	if b.invalid > 0 {
		c.mu.Lock()
		c.st.DroppedInvalid += uint64(b.invalid)
		c.mu.Unlock()
		if c.firstTime(&c.logs.invalidWarned) {
			c.log.Warn().Err(b.firstErr).Int("dropped", b.invalid).Msg(msgInvalid)
		}
	}
	batches := append(carry, b.batches...)
	for i := range batches {
		err := c.put(ctx, m, &batches[i])
		if err == nil {
			continue
		}
		if m != modeFinal && ctx.Err() != nil {
			return batches[i:]
		}
		if !abandons(err) {
			c.drop(batches[i : i+1])
			continue
		}
		c.drop(batches[i:])
		return nil
	}
	return nil
}

// firstTime sets *flag (a field of c.logs) and reports whether it was unset.
func (c *CloudWatch) firstTime(flag *bool) bool {
	c.mu.Lock()
	defer c.mu.Unlock()
	first := !*flag
	*flag = true
	return first
}

// drop counts the datums of bs as lost to failed calls.
func (c *CloudWatch) drop(bs []batch) {
	n := 0
	for _, b := range bs {
		n += b.samples
	}
	c.mu.Lock()
	c.st.DroppedFailed += uint64(n)
	c.mu.Unlock()
}

// noSDKRetries turns off the SDK's retries for one call: a notice flush retries itself,
// with a fresh NoticeCallTimeout per attempt.
func noSDKRetries(o *cloudwatch.Options) { o.Retryer = aws.NopRetryer{} }

// put sends one batch. A periodic call is one SDK call (with the client's own retries)
// bounded by periodicCallTimeout. A notice or final call is up to 1+NoticeRetries SDK
// calls without the SDK's retries, each bounded by NoticeCallTimeout and ctx, retried after
// a jittered backoff (100 ms doubling to 1 s) when the error is throttling, 5xx, a
// connection error or the attempt's timeout. It returns the last error, nil on success.
func (c *CloudWatch) put(ctx context.Context, m mode, b *batch) error {
	in := &cloudwatch.PutMetricDataInput{Namespace: aws.String(c.ns), MetricData: b.data}
	if m == modePeriodic {
		cctx, cancel := context.WithTimeout(ctx, periodicCallTimeout)
		err := c.call(cctx, in)
		cancel()
		c.note(m, 0, b, err, ctx.Err() != nil)
		return err
	}
	for attempt := 0; ; attempt++ {
		cctx, cancel := context.WithTimeout(ctx, c.timeout)
		err := c.call(cctx, in, noSDKRetries)
		timedOut := cctx.Err() != nil && ctx.Err() == nil
		cancel()
		c.note(m, attempt, b, err, m == modeNotice && ctx.Err() != nil) // cut by the stop: the final flush sends it
		if err == nil {
			return nil
		}
		again := timedOut || retryable(err)
		if attempt >= c.retries || isSetup(err) || !again {
			return err
		}
		if !wait(ctx, backoff(attempt)) {
			return err
		}
	}
}

// call makes one PutMetricData call. A panic in the client becomes an error wrapping
// errClientPanic: the SDK (smithy-go v1.28.9) panics on a 200 answer whose CBOR body has a
// member PutMetricDataOutput does not know, and metrics must never take the agent down.
func (c *CloudWatch) call(ctx context.Context, in *cloudwatch.PutMetricDataInput, optFns ...func(*cloudwatch.Options)) (err error) {
	defer func() {
		if p := recover(); p != nil {
			err = fmt.Errorf("%w: %v", errClientPanic, p)
		}
	}()
	_, err = c.api.PutMetricData(ctx, in, optFns...)
	return err
}

// errClientPanic marks a PutMetricData call that panicked.
var errClientPanic = errors.New("metrics: cloudwatch client panicked")

// note counts a call and logs what needs saying: the first setup error (credentials,
// region, permission) of the sink's life; the first other error after a success (or at
// start); the first success after errors. Everything else goes to Debug. quiet (a call cut
// by the end of Run's context) counts without logging.
func (c *CloudWatch) note(m mode, attempt int, b *batch, err error, quiet bool) {
	c.mu.Lock()
	c.st.Calls++
	if err == nil {
		c.st.Sent += uint64(len(b.data))
		c.st.SentSamples += uint64(b.samples)
		streak := c.logs.streak
		c.logs.streak = 0
		c.logs.otherWarned = false
		c.mu.Unlock()
		if streak > 0 {
			c.log.Info().Int("failed_calls", streak).Stringer("flush", m).Msg(msgRecovered)
		}
		return
	}
	c.st.Errors++
	c.st.LastError = err.Error()
	c.st.LastErrorAt = time.Now()
	if quiet {
		c.mu.Unlock()
		return
	}
	c.logs.streak++
	setup := isSetup(err)
	var warn bool
	if setup {
		warn = !c.logs.setupWarned
		c.logs.setupWarned = true
	} else {
		warn = !c.logs.otherWarned
		c.logs.otherWarned = true
	}
	c.mu.Unlock()
	ev := c.log.Debug()
	msg := msgPutFailed
	if warn {
		ev = c.log.Warn()
	}
	if setup {
		msg = msgSetup
	}
	ev.Err(err).Stringer("flush", m).Int("attempt", attempt).Int("datums", len(b.data)).Msg(msg)
}

// isSetup reports whether err says the client cannot work as configured: no credentials
// (the SDK's "get credentials", "failed to refresh cached credentials", "no EC2 IMDS role
// found"), no region or endpoint ("Missing Region", "failed to resolve service endpoint"),
// or CloudWatch rejecting the credentials or the permission (403-style error codes).
// Retrying such a call does not help. Note that the SDK sends a request with no
// credentials provider unsigned, and with no region but a BaseEndpoint signed for region
// ""; CloudWatch's answer (an auth error code) is what tells then.
func isSetup(err error) bool {
	var mr *aws.MissingRegionError
	var se *v4.SigningError
	if errors.As(err, &mr) || errors.As(err, &se) {
		return true
	}
	var ae smithy.APIError
	if errors.As(err, &ae) {
		switch ae.ErrorCode() {
		case "UnrecognizedClientException", "InvalidClientTokenId", "MissingAuthenticationToken",
			"IncompleteSignature", "InvalidSignatureException", "SignatureDoesNotMatch",
			"ExpiredToken", "ExpiredTokenException", "AccessDenied", "AccessDeniedException":
			return true
		}
	}
	msg := strings.ToLower(err.Error())
	for _, s := range [...]string{
		"get credentials",                      // the SDK's identity step, any provider
		"failed to retrieve credentials",       // SigV4 signer
		"failed to refresh cached credentials", // CredentialsCache (the default chain)
		"no ec2 imds role found",               // ec2rolecreds without an instance profile
		"missing region",                       // endpoint rules without a region
		"region is required",                   // aws.MissingRegionError, SigV4 adapter
		"failed to resolve service endpoint",   // a region or endpoint the rules reject
	} {
		if strings.Contains(msg, s) {
			return true
		}
	}
	return false
}

// retryable reports whether the SDK's standard retryer would retry err: throttling
// codes, 5xx and 429 statuses, transient connection errors.
func retryable(err error) bool {
	return retry.IsErrorRetryables(retry.DefaultRetryables).IsErrorRetryable(err) == aws.TrueTernary
}

// abandons reports whether err makes the rest of a flush pointless: a setup error, or an
// error that means the endpoint is struggling or unreachable (anything retryable, or a
// timeout). Errors about the call itself (e.g. 400 InvalidParameterValue) do not.
func abandons(err error) bool {
	return isSetup(err) || retryable(err) || errors.Is(err, context.DeadlineExceeded) ||
		errors.Is(err, context.Canceled)
}

// backoff returns the wait before retry attempt+1: 100 ms doubling per attempt up to 1 s,
// drawn uniformly from [d/2, d].
func backoff(attempt int) time.Duration {
	d := retryBackoffMax
	if attempt < 10 {
		d = min(retryBackoffBase<<attempt, retryBackoffMax)
	}
	half := d / 2
	return d - half + rand.N(half+1)
}

// wait blocks for d or until ctx is done; it reports whether ctx is still live.
func wait(ctx context.Context, d time.Duration) bool {
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case <-t.C:
		return ctx.Err() == nil
	case <-ctx.Done():
		return false
	}
}
