package imds

import (
	"context"
	"fmt"
	"strings"
	"time"

	"github.com/rs/zerolog"
)

const (
	// identityRequestTimeout bounds each identity read.
	identityRequestTimeout = 2 * time.Second
	// identityBackoffMax caps the wait between identity read attempts.
	identityBackoffMax = 2 * time.Second
)

// Identity names this instance, for the checkpoint manifest and metric dimensions.
type Identity struct {
	InstanceID       string // instance-id, e.g. "i-1234567890abcdef0"
	InstanceType     string // instance-type, e.g. "p4d.24xlarge"
	AvailabilityZone string // placement/availability-zone, e.g. "us-east-1a"
}

// FetchIdentity reads instance-id, instance-type and placement/availability-zone from g.
// While IMDS is not up yet it retries each read (2 s timeout per read) after a jittered
// backoff from 100 ms, capped at 2 s, logging one Warn at the first failure and one Info on
// success after failures. A 404, an empty value or one with characters other than letters,
// digits and ".-_:" counts as a failure. It returns:
//   - the identity, nil: all three values were read;
//   - a zero Identity and an error when ctx is done first; the error wraps ctx.Err() and,
//     if there was one, the last read error.
func FetchIdentity(ctx context.Context, g Getter, log zerolog.Logger) (Identity, error) {
	log = log.With().Str("component", "imds").Logger()
	var id Identity
	fields := []struct {
		path string
		dst  *string
	}{
		{"instance-id", &id.InstanceID},
		{"instance-type", &id.InstanceType},
		{"placement/availability-zone", &id.AvailabilityZone},
	}
	bo := backoff{max: identityBackoffMax}
	failures := 0
	var started time.Time
	for _, f := range fields {
		for {
			v, err := readIdentityValue(ctx, g, f.path)
			if err == nil {
				*f.dst = v
				break
			}
			if ctx.Err() != nil {
				return Identity{}, fmt.Errorf("fetch instance identity: %w (last error: %w)", ctx.Err(), err)
			}
			failures++
			if failures == 1 {
				started = time.Now()
				log.Warn().Err(err).Msg("imds identity not available yet; retrying with backoff")
			}
			if !wait(ctx, bo.next(), nil) {
				return Identity{}, fmt.Errorf("fetch instance identity: %w (last error: %w)", ctx.Err(), err)
			}
		}
	}
	if failures > 0 {
		log.Info().Int("errors", failures).Float64("failing_for_s", logSeconds(time.Since(started))).
			Str("instance_id", id.InstanceID).Msg("imds identity read")
	}
	return id, nil
}

// readIdentityValue reads one identity value and checks it looks like one.
// ReadIdentity reads the instance's identity once, without retries: an error if any of it cannot
// be read now.
func ReadIdentity(ctx context.Context, g Getter) (Identity, error) {
	var id Identity
	for _, f := range []struct {
		path string
		dst  *string
	}{{"instance-id", &id.InstanceID}, {"instance-type", &id.InstanceType}, {"placement/availability-zone", &id.AvailabilityZone}} {
		v, err := readIdentityValue(ctx, g, f.path)
		if err != nil {
			return Identity{}, err
		}
		*f.dst = v
	}
	return id, nil
}

func readIdentityValue(ctx context.Context, g Getter, path string) (string, error) {
	rctx, cancel := context.WithTimeout(ctx, identityRequestTimeout)
	defer cancel()
	body, found, err := g.Get(rctx, path)
	if err != nil {
		return "", fmt.Errorf("get %s: %w", path, err)
	}
	if !found {
		return "", fmt.Errorf("get %s: not found", path)
	}
	v := strings.TrimSpace(string(body))
	if !isIdentityValue(v) {
		return "", fmt.Errorf("%w: %s: %q", ErrMalformed, path, truncate([]byte(v)))
	}
	return v, nil
}

// isIdentityValue reports whether s is 1 to 128 characters of letters, digits and ".-_:".
func isIdentityValue(s string) bool {
	if len(s) == 0 || len(s) > 128 {
		return false
	}
	for i := 0; i < len(s); i++ {
		c := s[i]
		ok := 'a' <= c && c <= 'z' || 'A' <= c && c <= 'Z' || '0' <= c && c <= '9' ||
			c == '.' || c == '-' || c == '_' || c == ':'
		if !ok {
			return false
		}
	}
	return true
}

// logSeconds is d in seconds, to the millisecond, for a log field whose name ends in _s.
func logSeconds(d time.Duration) float64 { return d.Round(time.Millisecond).Seconds() }
