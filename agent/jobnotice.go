package agent

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"time"

	"github.com/spotguard/spotguard/agent/imds"
)

// SourceJob is the source of a notice the job hands over to its agent (POST /notice, `spotguard
// notify`): a notice another node's agent got from its IMDS, passed on by the trainers'
// collective. It is not polled; its policy is notices.job (checkpoint or ignore).
const SourceJob imds.Source = "job"

// JobNoticeGrace is how long a job notice stays in force after its deadline (or after it was
// posted, when its deadline had already passed): by then the instance that got the real notice is
// gone, and the job with it. A checkpoint written for it that is not committed yet stays urgent
// until it is.
const JobNoticeGrace = 2 * time.Minute

// MaxJobDeadlineAhead bounds a job notice's deadline: one further ahead is refused, since the
// notice would stay in force (uploads urgent) until then. EC2 announces scheduled events up to a
// few weeks ahead.
const MaxJobDeadlineAhead = 31 * 24 * time.Hour

// CheckJobDeadline reports why d cannot be a job notice's deadline at now, as words that follow
// it, or nil: no more than MaxJobDeadlineAhead ahead. One already past is due now, but not one
// before 2000: the zero time 0001-01-01 of a deadline never set, which would show in the log and
// /status.
func CheckJobDeadline(d, now time.Time) error {
	switch {
	case d.After(now.Add(MaxJobDeadlineAhead)):
		return fmt.Errorf("is more than %d days ahead: not a notice's deadline", int(MaxJobDeadlineAhead/(24*time.Hour)))
	case d.Year() < 2000:
		return errors.New("is before 2000: not a notice's deadline (a time never set?); one already past is due now: give the time the instance goes (the current time if it goes now)")
	}
	return nil
}

// jobActions are the actions a job notice may carry, the ones the IMDS sources use, each with its
// rank in notice.json (as noticeRank gives the IMDS notice with that action): spot's terminate,
// stop and hibernate, the scheduled event codes, ASG's Terminated and rebalance.
var jobActions = []struct {
	name string
	rank int
}{
	{"terminate", 0}, {"stop", 1}, {"hibernate", 2},
	{"instance-stop", 3}, {"instance-retirement", 3}, {"instance-reboot", 3}, {"system-reboot", 3}, {"system-maintenance", 3},
	{"Terminated", 4},
	{"rebalance", 5},
}

// JobActions lists the actions a job notice may carry, most severe first.
func JobActions() []string {
	out := make([]string, len(jobActions))
	for i, a := range jobActions {
		out[i] = a.name
	}
	return out
}

// ParseJobAction returns the action called name (any case, surrounding white space ignored) as
// the IMDS sources spell it, or an error naming the actions there are.
func ParseJobAction(name string) (string, error) {
	for _, a := range jobActions {
		if strings.EqualFold(strings.TrimSpace(name), a.name) {
			return a.name, nil
		}
	}
	return "", fmt.Errorf("unknown action %q (want one of %s)", name, strings.Join(JobActions(), ", "))
}

// jobActionRank is the rank of a job notice with action; an unknown one (none is accepted) ranks
// last.
func jobActionRank(action string) int {
	for _, a := range jobActions {
		if a.name == action {
			return a.rank
		}
	}
	return 6
}

// JobNoticeReply is the answer to an accepted POST /notice.
type JobNoticeReply struct {
	// Result is "new" (202: the notice began now) or "refreshed" (200: the same notice, source
	// job and this action, was already in force; the earlier deadline is kept).
	Result string `json:"result"`
	// Notice is the notice as the agent now holds it (as /status shows it).
	Notice NoticeStatus `json:"notice"`
	// MostSevere is the key of the notice notice.json now names at its top; empty when none with
	// policy checkpoint is in force (this one ignored by policy, and no other).
	MostSevere string `json:"most_severe,omitempty"`
}

// The results of a job notice.
const (
	JobNoticeNew       = "new"
	JobNoticeRefreshed = "refreshed"
)

// jobPost is one POST /notice on its way into the coordinator's loop.
type jobPost struct {
	notice imds.Notice
	reply  chan JobNoticeReply
}

// errStopping is the answer to a job notice posted while the agent stops.
var errStopping = errors.New("agent: stopping: no new notice is taken (the drain commits every complete checkpoint)")

// Post hands a job notice to the coordinator's loop and returns what TakeJobNotice answered. It
// returns errStopping once Run has returned, and ctx's error if ctx ends first.
func (c *Coordinator) Post(ctx context.Context, n imds.Notice) (JobNoticeReply, error) {
	p := jobPost{notice: n, reply: make(chan JobNoticeReply, 1)}
	select {
	case c.posts <- p:
	case <-c.stopped:
		return JobNoticeReply{}, errStopping
	case <-ctx.Done():
		return JobNoticeReply{}, ctx.Err()
	}
	return <-p.reply, nil
}

// jobEnd is when a job notice with deadline, posted at at, ends: the deadline, or the post if
// the deadline had passed, plus JobNoticeGrace.
func jobEnd(deadline, at time.Time) time.Time {
	if deadline.Before(at) {
		deadline = at
	}
	return deadline.Add(JobNoticeGrace)
}

// TakeJobNotice is one step of the state machine for a notice the job hands over (source job),
// posted at at. A new one begins as an IMDS notice does (detected; notice.json, urgent uploads,
// metrics, /status), but the trainer is not signalled: it sent the notice. The same notice
// (source job, same action) posted again while in force is refreshed, never doubled: the earliest
// deadline is kept (notice.json is rewritten when it moves earlier), and it ends at the latest
// jobEnd of its posts. Policy ignore records it only.
func (c *Coordinator) TakeJobNotice(n imds.Notice, at time.Time) JobNoticeReply {
	// One whose end has come is over, even if the loop has not ended it yet: this is a new one.
	c.ExpireJobNotices(at)
	cfg := c.config()
	key := n.Key()
	end := jobEnd(n.Deadline, at)
	c.mu.Lock()
	ns, ok := c.active[key]
	c.mu.Unlock()
	result := JobNoticeRefreshed
	if !ok {
		result = JobNoticeNew
		ns = c.detect(cfg, n, at, "handed over by the job (POST /notice); the trainer is not signalled, it sent the notice",
			func(ns *NoticeStatus) {
				d := n.Deadline // even the zero time, which is long past: due now
				ns.Deadline, ns.Posts, ns.LastPostAt, ns.EndsAt = &d, 1, &at, &end
			})
		if ns.Policy == PolicyCheckpoint {
			// Not signalled, so the time left is set when it is posted (and when its deadline
			// moves earlier), as it is at the signal of an IMDS notice.
			c.metrics.noticeDeadlineLeft.WithLabelValues(string(SourceJob)).Set(time.Until(n.Deadline).Seconds())
			c.noticesChanged(cfg)
		}
	} else {
		c.mu.Lock()
		ns.Posts++
		ns.LastPostAt = &at
		earlier := ns.Deadline == nil || n.Deadline.Before(*ns.Deadline)
		if earlier {
			d := n.Deadline
			ns.Deadline = &d
		}
		if ns.EndsAt == nil || end.After(*ns.EndsAt) {
			ns.EndsAt = &end
		}
		c.mu.Unlock()
		logTime(c.log.Info().Str("notice", key), "deadline", n.Deadline).Bool("earlier", earlier).
			Msg("job notice posted again: refreshed, not doubled")
		switch {
		case ns.Policy != PolicyCheckpoint:
		case earlier:
			c.metrics.noticeDeadlineLeft.WithLabelValues(string(SourceJob)).Set(time.Until(n.Deadline).Seconds())
			c.noticesChanged(cfg)
		default:
			// Its end, and how many times it was posted: for a restart, and for a reader of
			// notice.json (found from outside: "posts" lagged the count, 1 for 5).
			c.rewriteNoticeFile(cfg, c.inForce())
		}
	}
	reply := JobNoticeReply{Result: result}
	if top := c.inForce(); len(top) > 0 {
		reply.MostSevere = top[0].Key
	}
	c.mu.Lock()
	reply.Notice = snapshot(ns)
	c.mu.Unlock()
	return reply
}

// jobRecord is a job notice an earlier run of the agent held (notice.json).
type jobRecord struct {
	notice           imds.Notice
	postedAt, endsAt time.Time
	posts            int
}

// resumeJobNotices takes back the job notices the agent's previous run held (previousJobs) that
// have not ended by now: a job notice only lives in the agent that took it, and an agent
// restarted during one (a crash, kill -9, the watchdog) would otherwise drop its urgency, its
// line in notice.json, and the stop's wait for the checkpoint the trainer writes for it. Each
// keeps its first post as its detection (its checkpoint is the first completed after it), its
// deadline and its end.
func (c *Coordinator) resumeJobNotices(now time.Time) {
	cfg := c.config()
	changed := false
	var since time.Time // the first post of those taken back
	for _, r := range c.previousJobs {
		if !r.endsAt.After(now) {
			continue
		}
		c.mu.Lock()
		_, ok := c.active[r.notice.Key()]
		c.mu.Unlock()
		if ok {
			continue
		}
		ns := c.detect(cfg, r.notice, r.postedAt, "handed over by the job before the agent restarted (its notice.json); in force until it ends",
			func(ns *NoticeStatus) {
				d, posted, ends := r.notice.Deadline, r.postedAt, r.endsAt
				ns.Deadline, ns.Posts, ns.LastPostAt, ns.EndsAt = &d, r.posts, &posted, &ends
			})
		c.log.Warn().Str("notice", ns.Key).Time("posted_at", r.postedAt).Time("ends_at", r.endsAt).
			Msg("job notice taken back from the agent's previous run")
		changed = changed || ns.Policy == PolicyCheckpoint
		if since.IsZero() || r.postedAt.Before(since) {
			since = r.postedAt
		}
	}
	c.previousJobs = nil
	if changed {
		c.noticesChanged(cfg)
		// Their checkpoints may be complete already, reported by the uploader as it started.
		c.adoptCompleted(since)
	}
}

// ExpireJobNotices ends every job notice whose EndsAt is not after now.
func (c *Coordinator) ExpireJobNotices(now time.Time) {
	var ended []*NoticeStatus
	c.mu.Lock()
	for _, ns := range c.active {
		if ns.Source == SourceJob && ns.EndsAt != nil && !ns.EndsAt.After(now) {
			ended = append(ended, ns)
		}
	}
	c.mu.Unlock()
	changed := false
	for _, ns := range ended {
		c.transition(ns, StateEnded, fmt.Sprintf("its deadline (or its post) + %s has passed", JobNoticeGrace))
		c.log.Info().Str("notice", ns.Key).Msg("job notice ended")
		changed = changed || ns.Policy == PolicyCheckpoint
	}
	if changed {
		c.noticesChanged(c.config())
	}
}

// armExpiry sets t to fire when the next job notice ends, or stops it when none is in force.
func (c *Coordinator) armExpiry(t *time.Timer) {
	var next time.Time
	c.mu.Lock()
	for _, ns := range c.active {
		if ns.Source == SourceJob && ns.EndsAt != nil && (next.IsZero() || ns.EndsAt.Before(next)) {
			next = *ns.EndsAt
		}
	}
	c.mu.Unlock()
	if next.IsZero() {
		t.Stop()
		return
	}
	t.Reset(time.Until(next))
}

// snapshot copies ns for a reader outside the coordinator; c.mu must be held.
func snapshot(ns *NoticeStatus) NoticeStatus {
	cp := *ns
	cp.Transitions = append([]Transition{}, ns.Transitions...)
	cp.Signals = append([]SignalOutcome{}, ns.Signals...)
	return cp
}
