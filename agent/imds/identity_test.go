package imds

import (
	"context"
	"errors"
	"testing"
	"testing/synctest"
	"time"

	"github.com/aws/aws-sdk-go-v2/aws"
	"github.com/rs/zerolog"
)

const (
	msgIdentityWaiting = "imds identity not available yet; retrying with backoff"
	msgIdentityRead    = "imds identity read"
)

func TestFetchIdentity(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		g := &stepGetter{calls: make(chan *call)}
		logs := &logBuffer{}
		type result struct {
			id  Identity
			err error
		}
		done := make(chan result, 1)
		go func() {
			id, err := FetchIdentity(t.Context(), g, zerolog.New(logs))
			done <- result{id, err}
		}()
		ms := time.Millisecond
		steps := []struct {
			path   string
			answer func(*call)
			maxGap time.Duration // upper bound of the wait before this read; 0: at once
		}{
			{"instance-id", (*call).fail, 0},
			{"instance-id", (*call).notFound, 100 * ms},
			{"instance-id", func(c *call) { c.ok("<html>") }, 200 * ms},
			{"instance-id", func(c *call) { c.ok("i-1234567890abcdef0\n") }, 400 * ms},
			{"instance-type", func(c *call) { c.ok("p4d.24xlarge") }, 0},
			{"placement/availability-zone", func(c *call) { c.ok("") }, 0},
			{"placement/availability-zone", (*call).fail, 800 * ms},
			{"placement/availability-zone", func(c *call) { c.ok("us-east-1a") }, 1600 * ms},
		}
		var prev time.Time
		for i, s := range steps {
			c := <-g.calls
			if c.path != s.path {
				t.Fatalf("read %d = %q; want %q", i, c.path, s.path)
			}
			if gap := c.at.Sub(prev); i > 0 && (gap < s.maxGap/2 || gap > s.maxGap) {
				t.Errorf("wait before read %d = %v; want in [%v, %v]", i, gap, s.maxGap/2, s.maxGap)
			}
			prev = c.at
			s.answer(c)
		}
		r := <-done
		want := Identity{InstanceID: "i-1234567890abcdef0", InstanceType: "p4d.24xlarge", AvailabilityZone: "us-east-1a"}
		if r.id != want || r.err != nil {
			t.Errorf("FetchIdentity() = %+v, %v; want %+v, nil", r.id, r.err, want)
		}
		if w, i := len(logs.lines(t, "warn", msgIdentityWaiting, "")), len(logs.lines(t, "info", msgIdentityRead, "")); w != 1 || i != 1 {
			t.Errorf("%d Warn and %d Info lines; want 1 and 1\n%s", w, i, logs)
		}
	})
}

func TestFetchIdentityGivesUp(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		var reads []time.Time
		down := getterFunc(func(ctx context.Context, path string) ([]byte, bool, error) {
			reads = append(reads, time.Now())
			return nil, false, errIMDSDown
		})
		ctx, cancel := context.WithTimeout(t.Context(), 30*time.Second)
		defer cancel()
		id, err := FetchIdentity(ctx, down, zerolog.Nop())
		if id != (Identity{}) || !errors.Is(err, context.DeadlineExceeded) || !errors.Is(err, errIMDSDown) {
			t.Errorf("FetchIdentity() = %+v, %v; want zero, an error wrapping DeadlineExceeded and the last error", id, err)
		}
		for i := 1; i < len(reads); i++ {
			if gap := reads[i].Sub(reads[i-1]); gap > 2*time.Second {
				t.Errorf("wait %d = %v; want at most 2s", i, gap)
			}
		}
		if len(reads) < 15 {
			t.Errorf("%d reads in 30s; want at least 15 (backoff capped at 2s)", len(reads))
		}
	})
}

func TestFetchIdentityRealClient(t *testing.T) {
	f := newFakeIMDS(map[string]string{
		"instance-id":                 "i-1234567890abcdef0",
		"instance-type":               "m4.xlarge",
		"placement/availability-zone": "us-east-1a",
	})
	srv := serve(t, f)
	id, err := FetchIdentity(t.Context(), NewClient(aws.Config{}, srv.URL), zerolog.Nop())
	want := Identity{InstanceID: "i-1234567890abcdef0", InstanceType: "m4.xlarge", AvailabilityZone: "us-east-1a"}
	if id != want || err != nil {
		t.Errorf("FetchIdentity() = %+v, %v; want %+v, nil", id, err, want)
	}
}
