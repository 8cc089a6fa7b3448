package imds

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"strings"
	"time"
)

const (
	// FailSafeDelay is the deadline given, counted from detection, to a notice that carries
	// no usable time of its own: a malformed spot notice and an ASG termination. It is the
	// warning time a spot interruption gives.
	FailSafeDelay = 2 * time.Minute

	// maxRaw is how much of a body Notice.Raw keeps.
	maxRaw = 4 << 10

	// scheduledTimeLayout is how IMDS writes the times of scheduled events.
	scheduledTimeLayout = "2 Jan 2006 15:04:05 GMT"
)

// ParseSpot parses a spot/instance-action body, e.g.
// {"action": "terminate", "time": "2017-09-18T08:22:00Z"}. It is a pure function of its
// arguments. A 200 on this path always announces an interruption, so ParseSpot always
// returns a notice:
//   - a valid body (action terminate, stop or hibernate in any case; time in RFC 3339):
//     the notice with Action in lower case, Time and Deadline set to the body's time, nil error;
//   - anything else (empty, not JSON, wrong types, unknown or missing action, missing or bad
//     time): the fail-safe notice {Action: "terminate", Deadline: now + [FailSafeDelay],
//     Malformed: true} together with an error wrapping [ErrMalformed], for the caller to log.
//     The caller must still act on the notice.
func ParseSpot(body []byte, now time.Time) (Notice, error) {
	var v struct {
		Action *string `json:"action"`
		Time   *string `json:"time"`
	}
	n := Notice{Source: SourceSpot, Raw: truncate(body)}
	var cause error
	if err := json.Unmarshal(body, &v); err != nil {
		cause = err
	} else if !isObject(body) {
		cause = fmt.Errorf("not a JSON object")
	} else if v.Action == nil {
		cause = fmt.Errorf("missing action")
	} else if v.Time == nil {
		cause = fmt.Errorf("missing time")
	} else {
		action := strings.ToLower(strings.TrimSpace(*v.Action))
		t, err := time.Parse(time.RFC3339, strings.TrimSpace(*v.Time))
		switch {
		case action != "terminate" && action != "stop" && action != "hibernate":
			cause = fmt.Errorf("unknown action %q", *v.Action)
		case err != nil:
			cause = fmt.Errorf("bad time: %w", err)
		default:
			t = t.UTC() // said in UTC, as the agent's own times are
			n.Action, n.Time, n.Deadline = action, t, t
			return n, nil
		}
	}
	n.Action = "terminate"
	n.Deadline = failSafeDeadline(now)
	n.Malformed = true
	return n, fmt.Errorf("%w: %s: %w", ErrMalformed, SourceSpot.Path(), cause)
}

// failSafeDeadline is now + FailSafeDelay to the whole second below, as IMDS's own times are (and
// sooner, not later: fail safe).
func failSafeDeadline(now time.Time) time.Time { return now.Add(FailSafeDelay).Truncate(time.Second) }

// ParseRebalance parses an events/recommendations/rebalance body, e.g.
// {"noticeTime": "2020-10-27T08:22:00Z"}. It returns:
//   - a valid body: the notice {Action: "rebalance", Time: noticeTime} (no Deadline), nil error;
//   - anything else (empty, not a JSON object, missing or bad noticeTime): a zero Notice and
//     an error wrapping [ErrMalformed].
//
// now is unused; it is there so that every parser has the same shape.
func ParseRebalance(body []byte, now time.Time) (Notice, error) {
	var v struct {
		NoticeTime *string `json:"noticeTime"`
	}
	malformed := func(cause error) (Notice, error) {
		return Notice{}, fmt.Errorf("%w: %s: %w", ErrMalformed, SourceRebalance.Path(), cause)
	}
	if err := json.Unmarshal(body, &v); err != nil {
		return malformed(err)
	}
	if !isObject(body) {
		return malformed(fmt.Errorf("not a JSON object"))
	}
	if v.NoticeTime == nil {
		return malformed(fmt.Errorf("missing noticeTime"))
	}
	t, err := time.Parse(time.RFC3339, strings.TrimSpace(*v.NoticeTime))
	if err != nil {
		return malformed(fmt.Errorf("bad noticeTime: %w", err))
	}
	return Notice{Source: SourceRebalance, Action: "rebalance", Time: t.UTC(), Raw: truncate(body)}, nil
}

// ParseScheduled parses an events/maintenance/scheduled body: a JSON array of events with
// Code, Description, State, EventId, NotBefore, NotAfter and (optionally) NotBeforeDeadline,
// times written like "2 Jan 2006 15:04:05 GMT". It returns:
//   - one notice per event whose State is "active" or empty (case-insensitive), in body order,
//     without duplicate keys, with Action = Code, EventID = EventId, Time = Deadline =
//     NotBefore and NotAfter (zero when missing or unreadable); events in any other State
//     ("canceled", "completed") are not notices, which is how an earlier notice ends. An empty
//     array gives no notices. The error is nil;
//   - when some active events are unreadable, the notices of the others, fail-safe notices of
//     those with a Code but a missing or unparsable NotBefore (Malformed, due now: Deadline is
//     now, Time zero), and an error wrapping [ErrMalformed] naming each unreadable event (one
//     without Code cannot be named, and is left out). One bad event hides no other;
//   - for a body that is not a JSON array of events (empty, wrong types): nil and an error
//     wrapping [ErrMalformed].
func ParseScheduled(body []byte, now time.Time) ([]Notice, error) {
	var events []struct {
		Code      string
		State     string
		EventID   string `json:"EventId"`
		NotBefore string
		NotAfter  string
	}
	malformed := func(cause error) ([]Notice, error) {
		return nil, fmt.Errorf("%w: %s: %w", ErrMalformed, SourceScheduled.Path(), cause)
	}
	if err := json.Unmarshal(body, &events); err != nil {
		return malformed(err)
	}
	if t := bytes.TrimSpace(body); len(t) == 0 || t[0] != '[' {
		return malformed(fmt.Errorf("not a JSON array"))
	}
	var notices []Notice
	var problems []error
	seen := make(map[string]bool)
	raw := truncate(body)
	for i, e := range events {
		switch strings.ToLower(strings.TrimSpace(e.State)) {
		case "", "active":
		default: // "canceled", "completed": over, not a notice.
			continue
		}
		code := strings.TrimSpace(e.Code)
		if code == "" {
			problems = append(problems, fmt.Errorf("event %d: %w", i, errUnnamedEvent))
			continue
		}
		n := Notice{
			Source:  SourceScheduled,
			Action:  code,
			EventID: strings.TrimSpace(e.EventID),
			Raw:     raw,
		}
		if t, err := parseScheduledTime(e.NotBefore); err != nil {
			// Fail safe: an event whose start cannot be read is due now.
			problems = append(problems, fmt.Errorf("event %d (%s): bad NotBefore, taken as due now: %w", i, n.Key(), err))
			n.Deadline, n.Malformed = now, true
		} else {
			n.Time, n.Deadline = t, t
		}
		if after, err := parseScheduledTime(e.NotAfter); err == nil {
			n.NotAfter = after // optional: an unreadable NotAfter does not make the event malformed
		}
		if k := n.Key(); !seen[k] {
			seen[k] = true
			notices = append(notices, n)
		}
	}
	if len(problems) > 0 {
		return notices, fmt.Errorf("%w: %s: %w", ErrMalformed, SourceScheduled.Path(), errors.Join(problems...))
	}
	return notices, nil
}

// errUnnamedEvent is ParseScheduled's problem with an active event without a Code: it cannot be
// told which notice it is, so the answer does not say which notices ended.
var errUnnamedEvent = errors.New("missing Code")

// partialRead reports whether err, with notices, is a ParseScheduled answer that names every
// active event (some unreadable, each a fail-safe notice): what it lacks has ended, as after a
// read without error.
func partialRead(src Source, notices []Notice, err error) bool {
	return src == SourceScheduled && notices != nil && errors.Is(err, ErrMalformed) && !errors.Is(err, errUnnamedEvent) &&
		!errors.Is(err, ErrBodyCut)
}

// parseScheduledTime parses a scheduled event time, "2 Jan 2006 15:04:05 GMT", and for
// robustness also RFC 3339.
func parseScheduledTime(s string) (time.Time, error) {
	s = strings.TrimSpace(s)
	t, err := time.Parse(scheduledTimeLayout, s)
	if err == nil {
		return t, nil
	}
	if t, err2 := time.Parse(time.RFC3339, s); err2 == nil {
		return t.UTC(), nil
	}
	return time.Time{}, err
}

// ParseASG parses an autoscaling/target-lifecycle-state body: a bare lifecycle state such as
// "InService" or "Terminated". It returns:
//   - "Terminated" (surrounding white space ignored, any case): one notice {Action:
//     "Terminated", Deadline: now + [FailSafeDelay]}, nil error;
//   - any other well-formed state (letters, optionally "Prefix:State", e.g. "InService",
//     "Pending:Wait", "Warmed:Running"): nil, nil;
//   - anything else (empty, white space, HTML, JSON, ...): nil and an error wrapping
//     [ErrMalformed].
func ParseASG(body []byte, now time.Time) ([]Notice, error) {
	state := strings.TrimSpace(string(body))
	if strings.EqualFold(state, "Terminated") {
		return []Notice{{
			Source:   SourceASG,
			Action:   "Terminated",
			Deadline: failSafeDeadline(now),
			Raw:      truncate(body),
		}}, nil
	}
	if !isLifecycleState(state) {
		return nil, fmt.Errorf("%w: %s: not a lifecycle state: %q", ErrMalformed, SourceASG.Path(), truncate([]byte(state)))
	}
	return nil, nil
}

// isLifecycleState reports whether s looks like an Auto Scaling lifecycle state:
// 1 to 64 ASCII letters, with at most one ':' between two non-empty parts.
func isLifecycleState(s string) bool {
	if len(s) == 0 || len(s) > 64 {
		return false
	}
	colons := 0
	for i := 0; i < len(s); i++ {
		c := s[i]
		switch {
		case 'a' <= c && c <= 'z', 'A' <= c && c <= 'Z':
		case c == ':' && i > 0 && i < len(s)-1 && colons == 0:
			colons++
		default:
			return false
		}
	}
	return true
}

// isObject reports whether body, which must already be valid JSON, is an object (not null).
func isObject(body []byte) bool {
	t := bytes.TrimSpace(body)
	return len(t) > 0 && t[0] == '{'
}

// truncate returns body as a string, cut to maxRaw bytes.
func truncate(body []byte) string {
	if len(body) > maxRaw {
		body = body[:maxRaw]
	}
	return string(body)
}
