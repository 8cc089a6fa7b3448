// Package imds polls the EC2 instance metadata service (IMDSv2 only) for interruption notices.
//
// Four sources are watched (see [Sources]); each is read with one long-lived IMDSv2 client
// ([Client]) behind the small [Getter] interface, parsed by a pure function ([ParseSpot],
// [ParseRebalance], [ParseScheduled], [ParseASG]) and de-duplicated by [Notice.Key] in the
// [Watcher], which emits a Begin [Event] when a notice appears and an End event when a
// successful read shows it gone. 404 means "no notice": a value, not an error.
package imds

import (
	"context"
	"errors"
	"fmt"
	"time"
)

// Source names one IMDS notice source.
type Source string

// The notice sources, named as in the configuration.
const (
	SourceSpot      Source = "spot"      // spot/instance-action
	SourceRebalance Source = "rebalance" // events/recommendations/rebalance
	SourceScheduled Source = "scheduled" // events/maintenance/scheduled
	SourceASG       Source = "asg"       // autoscaling/target-lifecycle-state
)

// Sources lists every known source, in a fixed order. Do not modify it.
var Sources = []Source{SourceSpot, SourceRebalance, SourceScheduled, SourceASG}

// Path returns the metadata path of s below /latest/meta-data/, e.g. "spot/instance-action".
// It returns "" for an unknown source.
func (s Source) Path() string {
	switch s {
	case SourceSpot:
		return "spot/instance-action"
	case SourceRebalance:
		return "events/recommendations/rebalance"
	case SourceScheduled:
		return "events/maintenance/scheduled"
	case SourceASG:
		return "autoscaling/target-lifecycle-state"
	default:
		return ""
	}
}

// ParseSource returns the source called name. The name must match exactly one of the
// [Sources] ("spot", "rebalance", "scheduled", "asg"); anything else returns an error.
func ParseSource(name string) (Source, error) {
	s := Source(name)
	if s.Path() == "" {
		return "", fmt.Errorf("imds: unknown notice source %q (want one of spot, rebalance, scheduled, asg)", name)
	}
	return s, nil
}

// Notice is one interruption notice as announced by IMDS.
type Notice struct {
	// Source is where the notice was read.
	Source Source
	// Action is what will happen: spot: "terminate", "stop" or "hibernate";
	// rebalance: "rebalance"; scheduled: the event Code (e.g. "system-reboot");
	// asg: "Terminated".
	Action string
	// EventID is the scheduled event's EventId; empty for other sources.
	EventID string
	// Time is the time the notice carries: spot: "time"; rebalance: "noticeTime";
	// scheduled: NotBefore; asg and malformed spot: zero.
	Time time.Time
	// Deadline is when the instance is expected to go: spot: Time (detection + 2 min when
	// Malformed); scheduled: NotBefore; asg: detection + 2 min; rebalance: zero (no deadline).
	Deadline time.Time
	// NotAfter is a scheduled event's NotAfter (when its window ends); zero otherwise.
	NotAfter time.Time
	// Malformed is set for a notice read fail-safe from what could not be parsed: on spot, a
	// 200 whose body could not be parsed, treated as "terminate" 2 minutes after detection; on
	// scheduled, an event whose NotBefore could not be read, treated as due at detection.
	Malformed bool
	// Raw is the body as received, truncated to 4 KiB.
	Raw string
}

// Key identifies a notice for de-duplication: "source/action", plus "/EventID" for
// scheduled events. It deliberately omits the time field: AWS's simulator recomputes the
// time on every request and the key must stay stable across polls.
func (n Notice) Key() string {
	k := string(n.Source) + "/" + n.Action
	if n.Source == SourceScheduled {
		k += "/" + n.EventID
	}
	return k
}

// Getter is what the watcher needs from IMDS.
type Getter interface {
	// Get reads path below /latest/meta-data/. It returns:
	//   - body, true, nil: a 2xx response;
	//   - nil, false, nil: 404, the path does not exist now (for notices: no notice);
	//   - body, true, err: a 2xx response whose body could not be read whole (cut short, or its
	//     read timed out): what was read, and an error wrapping [ErrBodyCut];
	//   - nil, false, err: anything else (timeout, connection error, other status).
	Get(ctx context.Context, path string) (body []byte, found bool, err error)
}

// ErrBodyCut is wrapped by a Getter's error for a 2xx answer whose body could not be read whole.
// On spot/instance-action that is a notice read badly, never no notice: the fail-safe notice of a
// malformed body (see [ParseSpot]).
var ErrBodyCut = errors.New("imds: the body of a 2xx answer was cut short")

// ErrMalformed is wrapped by every error about a body that could not be parsed.
var ErrMalformed = errors.New("imds: malformed body")
