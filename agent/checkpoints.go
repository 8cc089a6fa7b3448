package agent

import (
	"errors"
	"fmt"
	"maps"
	"os"
	"slices"
	"time"

	"github.com/spotguard/spotguard/agent/metrics"
	"github.com/spotguard/spotguard/checkpoint"
)

// The states a notice moves through once the trainer is signalled and checkpoints are uploaded.
const (
	// StateCheckpointWritten: a checkpoint completed (its marker appeared) after the notice.
	StateCheckpointWritten = "checkpoint_written"
	// StateCommitted: a checkpoint completed after the notice is committed in the store.
	StateCommitted = "committed"
)

// newUploader builds the checkpoint watcher and uploader when the config names a store; nil, nil
// when it does not (the agent then only signals).
func newUploader(cfg *Config, deps Deps, a *Agent) (*checkpointWatch, *checkpoint.Uploader, error) {
	if cfg.Store.URL == "" {
		return nil, nil, nil
	}
	if deps.OpenStore == nil {
		return nil, nil, fmt.Errorf("store.url is set but this agent cannot open stores")
	}
	store, err := deps.OpenStore(cfg.Store.URL, cfg.S3Options())
	if err != nil {
		return nil, nil, fmt.Errorf("store.url: %w", err)
	}
	if c, ok := store.(interface {
		Concurrency() checkpoint.LimiterStats
	}); ok {
		a.metrics.health.concurrency = c.Concurrency
	}
	if o, ok := store.(interface{ OnAttemptError(func(error)) }); ok {
		o.OnAttemptError(a.noteStoreAttempt)
	}
	newWatcher := deps.NewCheckpointWatcher
	if newWatcher == nil {
		newWatcher = newCheckpointWatcher
	}
	w := newCheckpointWatch(checkpoint.WatchConfig{
		Dir: cfg.Checkpoint.Dir, Marker: cfg.Checkpoint.Marker, Pattern: cfg.Checkpoint.Pattern, Logger: deps.Logger, Lock: true,
		ReadDone: true,
	}, newWatcher, deps.Logger, func() { close(a.watchReady) })
	hostname, _ := os.Hostname()
	u := checkpoint.NewUploader(checkpoint.UploaderConfig{
		Store: store, Job: cfg.Store.Job, Dir: cfg.Checkpoint.Dir, Marker: cfg.Checkpoint.Marker,
		Pattern: cfg.Checkpoint.Pattern, Keep: cfg.Checkpoint.Keep, Logger: deps.Logger, StateDir: cfg.Agent.RuntimeDir,
		WaitForClose: !cfg.Checkpoint.SendWhileWritten,
		StopBudget:   stopBudget(cfg.Agent.StopBudget),
		// A stop while the store holds the start up waits for the directory's first read: a
		// complete checkpoint on disk is drained (checkpointWatch sends a ReadDone of its own
		// when there is no directory to read).
		AwaitFirstRead: true,
		// A stop waits for the signalled trainer's checkpoint only while a trainer is there.
		TrainerAlive: a.coord.trainerThere,
		Host: func() checkpoint.Host {
			a.mu.Lock()
			defer a.mu.Unlock()
			return checkpoint.Host{InstanceID: a.identity.InstanceID, InstanceType: a.identity.InstanceType,
				AvailabilityZone: a.identity.AvailabilityZone, Hostname: hostname}
		},
		OnEvent:    a.onUpload,
		NodeRank:   cfg.Store.NodeRank,
		WorldNodes: cfg.Store.WorldNodes,
		PartWait:   cfg.Store.PartWait,
	})
	return w, u, nil
}

// stopBudget is agent.stop_budget for the uploader, whose zero means its default: 0s is no drain.
func stopBudget(d time.Duration) time.Duration {
	if d == 0 {
		return -1
	}
	return d
}

// onUpload turns the uploader's reports into metrics and notice transitions.
func (a *Agent) onUpload(ev checkpoint.UploadEvent) {
	a.noteUploadHealth(ev) // health.go: errors by reason, rate-limited log, store probe soon
	switch ev.Kind {
	case checkpoint.CheckpointCommitted:
		m := ev.Manifest
		if !ev.Already {
			a.metrics.committed.WithLabelValues(m.Trigger).Inc()
		}
		if m.Part == nil { // a node's part is not the job's checkpoint: JobCheckpointCommitted
			a.noteNewest(m)
		}
		a.mu.Lock()
		if w := a.withheld; w != nil && (m.Checkpoint == w.Checkpoint || !m.Order().At.Before(w.At)) {
			a.withheld = nil
		}
		a.mu.Unlock()
		if ev.Throughput > 0 {
			a.metrics.uploadBytes.Add(float64(m.TotalBytes))
			a.metrics.uploadEarly.Add(float64(ev.SentWhileWritten))
			a.metrics.uploadThroughput.Set(ev.Throughput)
			if ev.Forecast > 0 { // none from a checkpoint that was withheld
				a.metrics.forecast.Set(ev.Forecast.Seconds())
				a.forecast.Store(int64(ev.Forecast))
			}
			if m.Timings.FirstFileAt != nil && m.Timings.LastByteAt != nil {
				a.metrics.uploadSeconds.Observe(m.Timings.UploadSeconds)
			}
		}
	case checkpoint.CheckpointFound:
		// The job's newest commit, in the store at start (an earlier run's, or another
		// instance's): committed, and as old as it is, until this agent commits a newer one. In
		// a multi-node job, only a job checkpoint is the job's.
		if m := ev.Manifest; m != nil && m.Part == nil && (m.Parts != nil || a.Config().Store.WorldNodes <= 1) {
			a.noteNewest(m)
		}
	case checkpoint.CheckpointFailed:
		a.metrics.commitFailures.Inc()
	case checkpoint.CheckpointWithheld:
		a.metrics.withheld.Inc()
		a.mu.Lock()
		// One older than the newest commit is an error of its own (logged), not trouble now.
		if a.newestName == "" || a.newestOrder.At.Before(ev.At) {
			a.withheld = &ev
		}
		a.mu.Unlock()
	case checkpoint.CheckpointDeleted, checkpoint.CheckpointRenamedAway:
		a.mu.Lock()
		if w := a.withheld; w != nil && w.Checkpoint == ev.Checkpoint {
			// Gone, it no longer waits to be fixed (under a new name it is seen anew).
			a.withheld = nil
		}
		a.mu.Unlock()
	case checkpoint.CheckpointSplit:
		a.metrics.split.Inc()
		a.mu.Lock()
		if a.split == nil || ev.At.After(a.split.At) {
			a.split = &ev
		}
		a.mu.Unlock()
	case checkpoint.CheckpointWhole:
		a.mu.Lock()
		if a.split != nil && ev.At.After(a.split.At) {
			a.split = nil
		}
		a.mu.Unlock()
	case checkpoint.JobCheckpointCommitted:
		writer := "this"
		if ev.Already {
			writer = "other"
		}
		a.metrics.jobCommitted.WithLabelValues(writer).Inc()
		a.noteNewest(ev.Manifest)
		a.mu.Lock()
		at := ev.Manifest.Order().At
		if at.After(a.newestJobAt) {
			a.newestJobAt = at
		}
		if a.jobProblem != nil && !at.Before(saveAt(*a.jobProblem).Add(-checkpoint.SaveSpread)) {
			a.jobProblem = nil
		}
		a.mu.Unlock()
	case checkpoint.JobCheckpointFailed:
		a.metrics.jobFailures.Inc()
		a.mu.Lock()
		// A save older than the newest job checkpoint committed (looked at again until
		// part_wait passes) is an error of its own, not trouble now: checkpoints commit.
		if a.newestJobAt.IsZero() || saveAt(ev).Add(checkpoint.SaveSpread).After(a.newestJobAt) {
			a.jobProblem = &ev
		}
		a.mu.Unlock()
	}
	a.coord.onUpload(ev)
}

// saveAt is when the save of a JobCheckpointFailed completed on this node (its part's
// completion), or when the failure was seen.
func saveAt(ev checkpoint.UploadEvent) time.Time {
	if ev.Manifest != nil {
		return ev.Manifest.Order().At
	}
	return ev.At
}

// noteNewest records m as the newest checkpoint committed, unless one this agent committed or
// found committed before is newer in the order of commits (Manifest.Order, as LATEST's): a
// restart matches what it finds newest first, and an older checkpoint committed after a newer
// one (one found whose commit retention had deleted) does not make the newest any older.
func (a *Agent) noteNewest(m *checkpoint.Manifest) {
	a.mu.Lock()
	defer a.mu.Unlock()
	o := m.Order()
	if a.newestName != "" && !o.After(a.newestOrder) {
		return
	}
	a.newestName, a.newestOrder = m.Checkpoint, o
	a.metrics.newestCommitted.Set(float64(m.CommittedAt.Unix()))
	a.newestCommit.Store(m.CommittedAt.UnixNano())
}

// onUpload moves every active notice detected before the checkpoint completed along:
// trainer_signalled (or not) → checkpoint_written → committed. The notice's checkpoint is the
// first one completed after it; it is durable when that one, or one completed after it, is
// committed (checkpoint.Uploader orders the uploads). One renamed away before its commit is awaited
// under its new name (checkpoint_written again, with it); one deleted before its commit gives its
// place to the next one completed, or, when none did, moves the notice to checkpoint_missing
// (deleted). In a multi-node job the notice's checkpoint is durable once the job's checkpoint is
// committed, not this node's part.
func (c *Coordinator) onUpload(ev checkpoint.UploadEvent) {
	durable := checkpoint.CheckpointCommitted
	if c.config().Store.WorldNodes > 1 {
		durable = checkpoint.JobCheckpointCommitted
	}
	type change struct {
		ns     *NoticeStatus
		state  string // StateCheckpointWritten, StateCommitted or StateCheckpointMissing
		name   string // the checkpoint
		detail string // for StateCheckpointWritten and StateCheckpointMissing
		again  bool   // StateCheckpointMissing said before (and a checkpoint came since): not counted or logged again
		err    error  // StateCheckpointMissing: the event's error (why its checkpoint is withheld)
	}
	var changes []change
	c.mu.Lock()
	if ev.Kind == checkpoint.DirRead {
		c.dirRead = true
	}
	c.noteComplete(ev, durable)
	for _, ns := range c.notices {
		if ns.Policy != PolicyCheckpoint || ns.committed || !ns.heldUntil.IsZero() {
			// A notice held back (holdForReclaim) has not asked for its save yet: a checkpoint
			// completed meanwhile is not it.
			continue
		}
		switch ev.Kind {
		case checkpoint.CheckpointComplete:
			// When it completed decides, not when it was reported: one completed before the
			// notice's save began may be reported after it (found by an agent restarted during
			// the notice, by a rescan, or by a poll of a directory without a watch), and one
			// completed after the signal may be reported before the notice was read (an agent
			// restarted during the notice). One completed after the notice ended is not its (a
			// trainer restarted after a torn save, saving on its own).
			at := ev.CompletedAt
			if at.IsZero() {
				at = ev.At
			}
			if !completedAfter(at, ns) {
				continue
			}
			if ns.renamed != "" && (ns.renamedDone.IsZero() || at.Sub(ns.renamedDone).Abs() <= checkpoint.FileTimeLag) {
				// The checkpoint renamed away came back under its new name (its files complete
				// when they did). Another completing does not end the wait: withheld or deleted,
				// it would leave the notice with nothing while the renamed one is on its way.
				ns.renamed = ""
			}
			switch {
			case ns.written == "":
				ns.written, ns.writtenAt = ev.Checkpoint, at
				changes = append(changes, change{ns: ns, state: StateCheckpointWritten, name: ev.Checkpoint, detail: ev.Checkpoint})
			case ev.Checkpoint != ns.written && !slices.Contains(ns.later, ev.Checkpoint):
				// Saved again while the notice's checkpoint is uploaded (a trainer that keeps
				// training, the newest going first in urgent mode).
				ns.later = append(ns.later, ev.Checkpoint)
				if len(ns.later) > maxLater {
					ns.later = slices.Delete(ns.later, 0, len(ns.later)-maxLater)
				}
			}
		case checkpoint.CheckpointRenamedAway, checkpoint.CheckpointDeleted, checkpoint.CheckpointWithheld:
			wasLater := slices.Contains(ns.later, ev.Checkpoint)
			ns.later = slices.DeleteFunc(ns.later, func(n string) bool { return n == ev.Checkpoint })
			if ns.written != ev.Checkpoint {
				if wasLater && ev.Kind == checkpoint.CheckpointRenamedAway {
					// One completed since the notice's checkpoint, renamed away: awaited under its
					// new name as the notice's own would be, should that one not be committed.
					ns.renamed, ns.renamedAt, ns.renamedDone = ev.Checkpoint, ev.At, c.renamed[ev.Checkpoint].completed
				}
				switch {
				case ev.Kind == checkpoint.CheckpointWithheld && ev.At.After(ns.detectedAt) && ns.written == "" && ns.endedAt.IsZero():
					ns.withheld, ns.withheldErr, ns.withheldGone = ev.Checkpoint, ev.Err, ""
				case ev.Kind != checkpoint.CheckpointWithheld && ns.withheld == ev.Checkpoint && ns.written == "":
					// Gone: it is no longer what keeps the notice from its checkpoint (renamed
					// within the directory, it completes anew under its new name).
					ns.withheld, ns.withheldGone = "", ev.Checkpoint
				}
				continue
			}
			// Withheld: found as it was sent, a file of it cannot be stored (a key too long for
			// the store, a file the agent cannot read); it is not committed as it is.
			why := map[checkpoint.UploadEventKind]string{
				checkpoint.CheckpointRenamedAway: "was renamed away before its commit",
				checkpoint.CheckpointDeleted:     "was deleted before its commit",
				checkpoint.CheckpointWithheld:    "is withheld: a file of it cannot be stored",
			}[ev.Kind]
			if errors.Is(ev.Err, checkpoint.ErrWrittenAfterMarker) {
				why = "is withheld: a file of it was written after its marker, and it is not complete until the marker is written again"
			}
			if ev.Kind == checkpoint.CheckpointRenamedAway {
				// A staging directory renamed into place after its marker: the notice's
				// checkpoint completes again under its new name, awaited even when one completed
				// since takes its place now. Renamed out of the directory, it never does.
				ns.renamed, ns.renamedAt, ns.renamedDone = ev.Checkpoint, ev.At, c.renamed[ev.Checkpoint].completed
			}
			if len(ns.later) > 0 {
				// One completed since is the notice's checkpoint now.
				next := ns.later[0]
				ns.written, ns.writtenAt, ns.later = next, time.Time{}, ns.later[1:]
				changes = append(changes, change{ns: ns, state: StateCheckpointWritten, name: next,
					detail: fmt.Sprintf("%s (%s, written first, %s)", next, ev.Checkpoint, why)})
				continue
			}
			ns.written = ""
			reason := MissingDeleted
			if ev.Kind == checkpoint.CheckpointWithheld {
				ns.withheld, ns.withheldErr, reason = ev.Checkpoint, ev.Err, MissingWithheld
			}
			if ns.renamed != "" {
				// One renamed away is awaited under its new name, and said missing in time if
				// it never comes (checkMissing: renamed out of the directory).
				continue
			}
			// Nothing completed since: what was committed before is all there is, unless the
			// trainer saves again (or writes the withheld one's marker again) while the notice is
			// in force. (Said and counted once: a notice said missing before, whose checkpoint
			// came since, says it again, and that is all.)
			changes = append(changes, change{ns: ns, state: StateCheckpointMissing, name: ev.Checkpoint, detail: reason, again: ns.missingSaid, err: ev.Err})
			ns.missingSaid = true
		case durable, checkpoint.CheckpointFound:
			// Its checkpoint, or one completed after it (as good: restored, it is newer
			// still), or any completed after the signal: after an agent restarted during the
			// notice, the trainer's save may have been committed by its previous run (found in
			// the store now), or be committed by this run, which found it complete as it
			// started, before it read the notice.
			if !(ev.Kind == durable && (ns.written == ev.Checkpoint || slices.Contains(ns.later, ev.Checkpoint))) &&
				!(ev.Manifest != nil && completedAfter(ev.Manifest.Order().At, ns)) {
				continue
			}
			if ns.written == "" {
				ns.written = ev.Checkpoint
				if ev.Manifest != nil {
					ns.writtenAt = ev.Manifest.Order().At
				}
				changes = append(changes, change{ns: ns, state: StateCheckpointWritten, name: ev.Checkpoint, detail: ev.Checkpoint})
			}
			if !ns.committed {
				ns.committedAt = time.Now()
			}
			ns.committed = true
			changes = append(changes, change{ns: ns, state: StateCommitted, name: ev.Checkpoint})
		}
	}
	if (ev.Kind == durable || ev.Kind == checkpoint.CheckpointFound) && ev.Manifest != nil &&
		(c.storeNewest == nil || ev.Manifest.Order().After(c.storeNewest.Order())) {
		c.storeNewest = ev.Manifest
	}
	c.mu.Unlock()
	for _, ch := range changes {
		ns := ch.ns
		switch ch.state {
		case StateCheckpointWritten:
			c.transition(ns, StateCheckpointWritten, ch.detail)
			c.mu.Lock() // the coordinator's loop may signal for it meanwhile
			signalled, timed := ns.signalledAt, false
			if signalled != nil {
				save := ch.name + "\x00" + signalled.String()
				timed, c.writeTimed = c.writeTimed == save, save
			}
			c.mu.Unlock()
			if signalled != nil && ch.detail == ch.name && !timed {
				c.metrics.writeSeconds.Observe(ev.At.Sub(*signalled).Seconds())
				c.record(metrics.Datum{Name: "CheckpointWriteSeconds", Unit: metrics.UnitSeconds, Value: ev.At.Sub(*signalled).Seconds(),
					Dimensions: map[string]string{"Source": string(ns.Source)}})
			}
		case StateCheckpointMissing:
			if ch.again {
				c.transition(ns, StateCheckpointMissing, ch.detail)
				continue
			}
			c.countMissing(ns, ch.detail)
			msg := "the checkpoint written for this notice was deleted before it was committed, and none completed since: " +
				"only checkpoints committed before (or still being uploaded) will be there to restore; keep the newest checkpoints on disk until they are committed"
			switch {
			case ch.detail == MissingWithheld && errors.Is(ch.err, checkpoint.ErrWrittenAfterMarker):
				// Not a file that cannot be stored (found from outside: a marker written first
				// was said to be one, sending the user to a line not shown).
				msg = "the checkpoint written for this notice is withheld, and none completed since: " + withheldAfterMarker(ch.err) +
					"; only checkpoints committed before (or still being uploaded) will be there to restore"
			case ch.detail == MissingWithheld:
				msg = "a file of the checkpoint written for this notice cannot be stored, so it is withheld, not committed, and none completed since " +
					"(the uploader's error says which file and what to do; written again with its marker, it is committed): " +
					"only checkpoints committed before (or still being uploaded) will be there to restore"
			}
			c.log.Error().Str("notice", ns.Key).Str("reason", ch.detail).Str("checkpoint", ch.name).Msg(msg)
			c.missing(ns, ch.detail, msg)
		case StateCommitted:
			if ev.Kind == checkpoint.CheckpointFound {
				// Committed when its manifest says, not when it was found.
				ev.At = ev.Manifest.CommittedAt
			}
			c.committed(ns, ev)
		}
	}
}

// completedAfter reports whether a checkpoint completed at at completed after the trainer was
// signalled for ns (after its detection, if it was not signalled) and before ns ended. Called
// with c.mu held.
func completedAfter(at time.Time, ns *NoticeStatus) bool {
	since := ns.detectedAt
	if ns.signalledAt != nil {
		since = *ns.signalledAt
	}
	return !at.Before(since.Add(-checkpoint.FileTimeLag)) && (ns.endedAt.IsZero() || at.Add(checkpoint.FileTimeLag).Before(ns.endedAt))
}

// maxComplete bounds Coordinator.complete.
const maxComplete = 64

// noteComplete keeps Coordinator.complete up to date with ev. Called with c.mu held.
func (c *Coordinator) noteComplete(ev checkpoint.UploadEvent, durable checkpoint.UploadEventKind) {
	switch ev.Kind {
	case checkpoint.CheckpointComplete:
		at := ev.CompletedAt
		if at.IsZero() {
			at = ev.At
		}
		c.complete[ev.Checkpoint] = at
		for len(c.complete) > maxComplete {
			var oldest string
			for name, t := range c.complete {
				if oldest == "" || t.Before(c.complete[oldest]) {
					oldest = name
				}
			}
			delete(c.complete, oldest)
		}
	case durable, checkpoint.CheckpointDeleted, checkpoint.CheckpointRenamedAway, checkpoint.CheckpointWithheld:
		// Withheld, it is not committed as it is: complete again (its marker written again),
		// it is reported again.
		if at, ok := c.complete[ev.Checkpoint]; ok && ev.Kind == checkpoint.CheckpointRenamedAway {
			c.renamed[ev.Checkpoint] = renamedCheckpoint{completed: at, at: ev.At}
		}
		delete(c.complete, ev.Checkpoint)
	}
	maps.DeleteFunc(c.renamed, func(_ string, r renamedCheckpoint) bool { return time.Since(r.at) > renameGrace })
}

// renamedCheckpoint is a complete checkpoint renamed away: when it completed, and when it was
// renamed.
type renamedCheckpoint struct {
	completed, at time.Time
}

// maxLater bounds NoticeStatus.later.
const maxLater = 16

// MissingDeleted is the checkpoint_missing reason of a notice whose checkpoint was deleted
// before its commit.
const MissingDeleted = "deleted"

// MissingWithheld is the checkpoint_missing reason of a notice whose checkpoint is withheld (a
// file of it cannot be stored, or was written after its marker).
const MissingWithheld = "withheld"

// missingRenamedAway is the checkpoint_missing reason of a notice whose checkpoint was renamed
// away before its commit, and nothing completed since (renamed out of checkpoint.dir).
const missingRenamedAway = "renamed_away"

// missingNotSignalled is the checkpoint_missing reason of a notice whose signal reached no
// trainer process (none found, or none catches trainer.signal), and no checkpoint completed.
const missingNotSignalled = "not_signalled"

// renameGrace is how long a notice's checkpoint renamed away is awaited under its new name
// (checkMissing) after the notice's own time is up: a staging directory renamed into place is
// seen under its new name within a scan.
const renameGrace = 10 * time.Second

// committed records ns as durable with ev's commit: its time to durable, its deadline margin,
// and its state.
func (c *Coordinator) committed(ns *NoticeStatus, ev checkpoint.UploadEvent) {
	detail := ev.Checkpoint
	var durable []metrics.Datum
	c.mu.Lock()
	inherited := ns.inherited
	var deadline *time.Time // moved earlier by the coordinator's loop, under c.mu
	if ns.Deadline != nil {
		d := *ns.Deadline
		deadline = &d
	}
	c.mu.Unlock()
	if !inherited {
		// A notice the agent's previous run signalled for was detected before this run's
		// detection: how long before is not known.
		c.metrics.timeToDurable.Observe(ev.At.Sub(ns.detectedAt).Seconds())
		durable = append(durable, metrics.Datum{Name: "NoticeToDurableSeconds", Unit: metrics.UnitSeconds, Value: ev.At.Sub(ns.detectedAt).Seconds(),
			Dimensions: map[string]string{"Source": string(ns.Source)}})
	}
	if deadline != nil {
		durable = append(durable, metrics.Datum{Name: "DeadlineMarginSeconds", Unit: metrics.UnitSeconds, Value: deadline.Sub(ev.At).Seconds(),
			Dimensions: map[string]string{"Source": string(ns.Source)}})
	}
	if m := ev.Manifest; m != nil && m.Timings.UploadSeconds > 0 && ev.Throughput > 0 { // not one committed before
		durable = append(durable, metrics.Datum{Name: "UploadBytes", Unit: metrics.UnitBytes, Value: float64(m.TotalBytes)},
			metrics.Datum{Name: "UploadThroughput", Unit: metrics.UnitBytesPerSecond, Value: ev.Throughput})
	}
	if len(durable) > 0 {
		c.record(durable...)
	}
	if deadline != nil {
		margin := deadline.Sub(ev.At)
		c.metrics.deadlineMargin.WithLabelValues(string(ns.Source)).Set(margin.Seconds())
		switch {
		case margin >= 0:
			detail = fmt.Sprintf("%s, %.1f s before the deadline", ev.Checkpoint, margin.Seconds())
		case !deadline.After(ns.readAt):
			// Past when the notice came (a scheduled event due now, a notice read late):
			// nothing could have been on time. (When it was first read: by the agent's
			// previous run, for one in force across a restart.)
			detail = fmt.Sprintf("%s; the deadline had passed when the notice was detected", ev.Checkpoint)
		default:
			detail = fmt.Sprintf("%s, %.1f s after the deadline", ev.Checkpoint, -margin.Seconds())
			c.log.Error().Str("notice", ns.Key).Float64("late_by_s", logSeconds(-margin)).Msg("checkpoint committed after the notice deadline")
		}
	}
	c.transition(ns, StateCommitted, detail)
	l := c.log.Warn().Str("notice", ns.Key).Str("checkpoint", ev.Checkpoint)
	if !inherited {
		l = l.Float64("notice_to_durable_s", logSeconds(ev.At.Sub(ns.detectedAt)))
	}
	l.Msg("notice's checkpoint is durable")
}

// noticeUploader is told which notices with policy checkpoint are in force whenever that set
// changes, so the checkpoint the trainer writes for one gets every connection, is labelled with
// it, and holds a stop. SetNotices must not block.
type noticeUploader interface {
	SetNotices(active []checkpoint.ActiveNotice)
	// MarkerHint says whether the newest checkpoint holds a marker by another name than
	// checkpoint.marker (checkpoint.Uploader.MarkerHint).
	MarkerHint() string
}
