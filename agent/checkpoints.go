package agent

import (
	"fmt"
	"os"
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
		Dir: cfg.Checkpoint.Dir, Marker: cfg.Checkpoint.Marker, Pattern: cfg.Checkpoint.Pattern, Logger: deps.Logger,
	}, newWatcher, deps.Logger, func() { close(a.watchReady) })
	hostname, _ := os.Hostname()
	u := checkpoint.NewUploader(checkpoint.UploaderConfig{
		Store: store, Job: cfg.Store.Job, Dir: cfg.Checkpoint.Dir, Marker: cfg.Checkpoint.Marker,
		Pattern: cfg.Checkpoint.Pattern, Keep: cfg.Checkpoint.Keep, Logger: deps.Logger, StateDir: cfg.Agent.RuntimeDir,
		WaitForClose: !cfg.Checkpoint.SendWhileWritten,
		StopBudget:   stopBudget(cfg.Agent.StopBudget),
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
			a.metrics.forecast.Set(ev.Forecast.Seconds())
			a.forecast.Store(int64(ev.Forecast))
			if m.Timings.FirstFileAt != nil && m.Timings.LastByteAt != nil {
				a.metrics.uploadSeconds.Observe(m.Timings.UploadSeconds)
			}
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
// trainer_signalled (or not) → checkpoint_written → committed; a checkpoint renamed away before
// its commit is awaited under its new name (checkpoint_written again, with it). In a multi-node
// job the notice's checkpoint is durable once the job's checkpoint is committed, not this node's
// part.
func (c *Coordinator) onUpload(ev checkpoint.UploadEvent) {
	durable := checkpoint.CheckpointCommitted
	if c.config().Store.WorldNodes > 1 {
		durable = checkpoint.JobCheckpointCommitted
	}
	c.mu.Lock()
	var affected []*NoticeStatus
	for _, ns := range c.notices {
		if ns.Policy != PolicyCheckpoint || ns.committed {
			continue
		}
		switch ev.Kind {
		case checkpoint.CheckpointComplete:
			// A checkpoint completed after the notice ended is not its (a trainer restarted
			// after a torn save, saving on its own).
			if ev.At.After(ns.detectedAt) && ns.written == "" && (ns.endedAt.IsZero() || ev.At.Before(ns.endedAt)) {
				ns.written = ev.Checkpoint
				affected = append(affected, ns)
			}
		case checkpoint.CheckpointWithheld:
			if ev.At.After(ns.detectedAt) && ns.written == "" && ns.endedAt.IsZero() {
				ns.withheld = ev.Checkpoint
			}
		case checkpoint.CheckpointRenamedAway:
			if ns.written == ev.Checkpoint {
				// A staging directory renamed into place after its marker: the notice's
				// checkpoint completes again under its new name.
				ns.written = ""
			}
		case durable:
			if ns.written == ev.Checkpoint {
				ns.committed = true
				affected = append(affected, ns)
			}
		}
	}
	c.mu.Unlock()
	for _, ns := range affected {
		switch ev.Kind {
		case checkpoint.CheckpointComplete:
			c.transition(ns, StateCheckpointWritten, ev.Checkpoint)
			if ns.signalledAt != nil {
				c.metrics.writeSeconds.Observe(ev.At.Sub(*ns.signalledAt).Seconds())
				c.record(metrics.Datum{Name: "CheckpointWriteSeconds", Unit: metrics.UnitSeconds, Value: ev.At.Sub(*ns.signalledAt).Seconds(),
					Dimensions: map[string]string{"Source": string(ns.Source)}})
			}
		case durable:
			detail := ev.Checkpoint
			c.metrics.timeToDurable.Observe(ev.At.Sub(ns.detectedAt).Seconds())
			durable := []metrics.Datum{{Name: "NoticeToDurableSeconds", Unit: metrics.UnitSeconds, Value: ev.At.Sub(ns.detectedAt).Seconds(),
				Dimensions: map[string]string{"Source": string(ns.Source)}}}
			if ns.Deadline != nil {
				durable = append(durable, metrics.Datum{Name: "DeadlineMarginSeconds", Unit: metrics.UnitSeconds, Value: ns.Deadline.Sub(ev.At).Seconds(),
					Dimensions: map[string]string{"Source": string(ns.Source)}})
			}
			if m := ev.Manifest; m != nil && m.Timings.UploadSeconds > 0 {
				durable = append(durable, metrics.Datum{Name: "UploadBytes", Unit: metrics.UnitBytes, Value: float64(m.TotalBytes)},
					metrics.Datum{Name: "UploadThroughput", Unit: metrics.UnitBytesPerSecond, Value: ev.Throughput})
			}
			c.record(durable...)
			if ns.Deadline != nil {
				margin := ns.Deadline.Sub(ev.At)
				c.metrics.deadlineMargin.WithLabelValues(string(ns.Source)).Set(margin.Seconds())
				switch {
				case margin >= 0:
					detail = fmt.Sprintf("%s, %.1f s before the deadline", ev.Checkpoint, margin.Seconds())
				case !ns.Deadline.After(ns.detectedAt):
					// Past when the notice came (a scheduled event due now, a notice read late):
					// nothing could have been on time.
					detail = fmt.Sprintf("%s; the deadline had passed when the notice was detected", ev.Checkpoint)
				default:
					detail = fmt.Sprintf("%s, %.1f s after the deadline", ev.Checkpoint, -margin.Seconds())
					c.log.Error().Str("notice", ns.Key).Float64("late_by_s", logSeconds(-margin)).Msg("checkpoint committed after the notice deadline")
				}
			}
			c.transition(ns, StateCommitted, detail)
			c.log.Warn().Str("notice", ns.Key).Str("checkpoint", ev.Checkpoint).
				Float64("notice_to_durable_s", logSeconds(ev.At.Sub(ns.detectedAt))).Msg("notice's checkpoint is durable")
		}
	}
}

// noticeUploader is told which notices with policy checkpoint are in force whenever that set
// changes, so the checkpoint the trainer writes for one gets every connection, is labelled with
// it, and holds a stop. SetNotices must not block.
type noticeUploader interface {
	SetNotices(active []checkpoint.ActiveNotice)
}
