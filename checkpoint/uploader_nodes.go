package checkpoint

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"time"

	"github.com/rs/zerolog"
)

// The uploader's side of a multi-node save (multinode.go): after this node's part is in, look
// for the other parts until the save is committed, part_wait has passed, or it turns out it
// cannot be.

// partRecheck is how long the uploader waits before looking for a save's missing parts again:
// part_wait / 30 within [1 s, 30 s], and at most 2 s while urgent (a notice: the other nodes'
// parts come within its deadline).
func partRecheck(partWait time.Duration, urgent bool) time.Duration {
	d := min(max(partWait/30, time.Second), 30*time.Second)
	if urgent {
		d = min(d, 2*time.Second)
	}
	return d
}

// trackSave starts completing the save of this node's part p, at once.
func (u *Uploader) trackSave(ctx context.Context, p *Manifest) {
	if _, ok := u.saves[p.Commit]; ok {
		return
	}
	// A newer part of the same name supersedes an older one of this node's (the trainer saved
	// it again).
	for c, ps := range u.saves {
		if ps.part.Checkpoint == p.Checkpoint && p.Order().After(ps.part.Order()) && !ps.running {
			delete(u.saves, c)
		}
	}
	ps := &pendingSave{part: p}
	u.saves[p.Commit] = ps
	u.trySave(ctx, ps)
}

// trySave makes one attempt to complete ps's save, on a goroutine; saveDone takes the result.
func (u *Uploader) trySave(ctx context.Context, ps *pendingSave) {
	if ps.running || u.saves[ps.part.Commit] != ps {
		return
	}
	ps.running = true
	host := u.cfg.Host()
	job := ps.job
	u.wg.Go(func() {
		var r saveResult
		if job != nil {
			r.job = job
			r.latestMoved, r.latestErr = advanceLatest(ctx, u.cfg.Store, job, host, u.cache)
		} else {
			r = completeSave(ctx, u.cfg.Store, ps.part, u.cfg.Marker, host, u.cfg.PartWait, u.cache)
		}
		var ret retention
		if r.written && (u.cfg.Keep > 0 || u.cfg.PartWait > 0) {
			var err error
			if ret, err = applyRetention(ctx, u.cfg.Store, u.cfg.Job, u.cfg.Keep, u.cfg.PartWait, u.cache, nil, u.log); err != nil {
				u.log.Warn().Err(err).Msg("retention: cannot read the job")
			}
		}
		select {
		case u.wake <- func() { u.retentionDone(ctx, ret.Failed, ret.Watch); u.saveDone(ctx, ps, r) }:
		case <-ctx.Done():
		}
	})
}

// jobCommitted takes ps's save committed as r.job (LATEST moved to it, or not yet): learned,
// said and reported (JobCheckpointCommitted).
func (u *Uploader) jobCommitted(ps *pendingSave, r saveResult) {
	p, m := ps.part, r.job
	u.learn(m.Order())
	if at := p.Order().At; at.After(u.ownJobNewest) {
		u.ownJobNewest = at
	}
	if !slices.ContainsFunc(u.index[m.Checkpoint], func(x *Manifest) bool { return x.Commit == m.Commit }) {
		u.index[m.Checkpoint] = append([]*Manifest{m}, u.index[m.Checkpoint]...)
	}
	ev := u.log.Info().Str("checkpoint", p.Checkpoint).Str("commit", p.Commit).Int("node_rank", p.Part.NodeRank).Int("world_nodes", p.Part.WorldNodes).
		Str("job_commit", m.Commit).Int("files", len(m.Files)).Int64("bytes", m.TotalBytes).Bool("latest", r.latestMoved)
	if r.written {
		ev.Msg("job checkpoint committed: every node's part is in")
	} else {
		ev.Msg("job checkpoint committed (by another node's agent)")
	}
	u.emit(UploadEvent{Kind: JobCheckpointCommitted, Checkpoint: m.Checkpoint, At: time.Now(), Manifest: m, Already: !r.written})
}

// saveDone takes the result of an attempt to complete ps's save.
func (u *Uploader) saveDone(ctx context.Context, ps *pendingSave, r saveResult) {
	ps.running = false
	ps.committing = ps.committing || r.writing || r.job != nil && r.latestErr != nil
	p := ps.part
	log := u.log.With().Str("checkpoint", p.Checkpoint).Str("commit", p.Commit).Int("node_rank", p.Part.NodeRank).Int("world_nodes", p.Part.WorldNodes).Logger()
	for _, pr := range r.problems {
		log.Warn().Err(pr).Msg("store entry left alone")
	}
	retry := func() {
		u.after(ctx, partRecheck(u.cfg.PartWait, u.urgent()), func() { u.trySave(ctx, ps) })
	}
	switch {
	case r.job != nil && r.latestErr != nil:
		if ps.job == nil || r.latestErr.Error() != ps.lastErr {
			log.Error().Err(r.latestErr).Str("job_commit", r.job.Commit).
				Msg("job checkpoint committed but LATEST cannot be moved to it; retrying (restore takes it anyway)")
		}
		if ps.job == nil {
			// Committed: said so now (a notice's checkpoint is durable), not once LATEST moves.
			u.jobCommitted(ps, r)
		}
		ps.job, ps.lastErr = r.job, r.latestErr.Error()
		if ctx.Err() == nil {
			u.emit(UploadEvent{Kind: LatestFailed, Checkpoint: r.job.Checkpoint, At: time.Now(), Manifest: r.job, Err: r.latestErr})
		}
		retry()
	case r.job != nil && ps.job != nil:
		delete(u.saves, p.Commit)
		log.Info().Str("job_commit", r.job.Commit).Bool("latest", r.latestMoved).Msg("LATEST moved, after failing")
		u.emit(UploadEvent{Kind: LatestMoved, Checkpoint: r.job.Checkpoint, At: time.Now(), Manifest: r.job})
	case r.job != nil:
		delete(u.saves, p.Commit)
		u.jobCommitted(ps, r)
	case r.superseded:
		delete(u.saves, p.Commit)
		log.Info().Msg("a newer part of this checkpoint from this node is in the store; this one is not completed")
	case r.older:
		delete(u.saves, p.Commit)
		log.Warn().Msg("every node's part is in, but a newer job checkpoint is committed already (LATEST); this older one is not committed")
	case r.err != nil:
		var c *ConflictError
		conflicting := errors.As(r.err, &c)
		news := r.err.Error() != ps.lastErr
		if news {
			ps.lastErr = r.err.Error()
			if conflicting {
				log.Error().Err(r.err).Msg("job checkpoint cannot be committed; looking again until part_wait has passed")
			} else {
				log.Warn().Err(r.err).Msg("cannot look for the other nodes' parts now; trying again")
			}
		}
		if conflicting {
			if news { // not again at every look: one conflict, one failure
				u.emit(UploadEvent{Kind: JobCheckpointFailed, Checkpoint: p.Checkpoint, At: time.Now(), Manifest: p, Err: r.err})
			}
		} else {
			u.emit(UploadEvent{Kind: CheckpointFailed, Checkpoint: p.Checkpoint, At: time.Now(), Err: r.err})
		}
		if !conflicting {
			ps.storeErr = r.err
		}
		if time.Since(p.CommittedAt) > u.cfg.PartWait {
			delete(u.saves, p.Commit)
			if !conflicting { // a conflict was said as a failure when it came
				u.storeGaveOut(ps, log)
			}
			return
		}
		retry()
	default:
		// An attempt that looked (not one made after part_wait) says what is missing, and why
		// when more than a missing rank tells; the reason is kept (as the last thing logged) for
		// the message when the save is given up.
		if r.missing != nil || r.waiting != nil {
			ps.missing, ps.storeErr = r.missing, nil
			if r.waiting == nil {
				ps.lastErr = ""
			} else if msg := r.waiting.Error(); msg != ps.lastErr {
				ps.lastErr = msg
				log.Warn().Err(r.waiting).Ints("missing_node_ranks", r.missing).Msg("job checkpoint waits: parts of this checkpoint are in the store that it cannot take for this save (the error says why)")
			}
		}
		if time.Since(p.CommittedAt) > u.cfg.PartWait {
			delete(u.saves, p.Commit)
			if ps.storeErr != nil { // the last look the store answered is not the last one tried
				u.storeGaveOut(ps, log)
				return
			}
			what := fmt.Sprintf("the parts of node(s) %v did not come", ps.missing)
			if len(ps.missing) == 0 {
				what = "its parts did not make one save"
			}
			if ps.lastErr != "" {
				what = fmt.Sprintf("%s within part_wait (%v) (last said: %s)", what, u.cfg.PartWait, ps.lastErr)
			} else {
				what = fmt.Sprintf("%s within part_wait (%v)", what, u.cfg.PartWait)
			}
			if jc := u.committedJobOf(p.Checkpoint, ps.missing); jc != "" {
				// Their parts of this name came, for an earlier save of it that is committed:
				// this node saved the name again alone (found from outside: the message said
				// only that node 1's part did not come, though it had, 6 s earlier).
				what += fmt.Sprintf("; their parts of %s are in job commit %s, committed before: this node saved the name again alone, "+
					"and a save is assembled only from parts of one save (save again under a new name, a step number, on every node)", p.Checkpoint, jc)
			}
			if u.ownJobNewest.After(p.Order().At) {
				// A newer save of this node's is committed for the job: this one was overtaken
				// (the trainer deleted it on a slower node before its part went), and a save
				// older than LATEST's is never committed anyway. No failure.
				log.Warn().Str("why", what).Time("newer_own_part_complete_at", u.ownJobNewest).
					Msg("job checkpoint not committed, overtaken: a newer save of this node's is committed for the job")
				return
			}
			err := fmt.Errorf("checkpoint %s: %s; it is not committed for the job (LATEST stays where it is)", p.Checkpoint, what)
			log.Error().Err(err).Msg("job checkpoint given up")
			u.emit(UploadEvent{Kind: JobCheckpointFailed, Checkpoint: p.Checkpoint, At: time.Now(), Manifest: p, Err: err})
			return
		}
		if r.waiting == nil {
			log.Debug().Ints("missing_node_ranks", r.missing).Msg("job checkpoint waits for other nodes' parts")
		}
		retry()
	}
}

// committedJobOf returns the newest job commit of checkpoint name this agent knows of that holds
// a part of every node rank in ranks, or "" if none does.
func (u *Uploader) committedJobOf(name string, ranks []int) string {
	if len(ranks) == 0 {
		return ""
	}
	for _, m := range u.index[name] {
		if m.Parts == nil {
			continue
		}
		if !slices.ContainsFunc(ranks, func(r int) bool {
			return !slices.ContainsFunc(m.Parts, func(jp JobPart) bool { return jp.NodeRank == r })
		}) {
			return m.Commit
		}
	}
	return ""
}

// storeGaveOut gives up ps's save, whose last look for the other nodes' parts the store failed
// (ps.storeErr), part_wait having passed: an error, and JobCheckpointFailed.
func (u *Uploader) storeGaveOut(ps *pendingSave, log zerolog.Logger) {
	p := ps.part
	err := fmt.Errorf("checkpoint %s: the store did not let this agent look for the other nodes' parts within part_wait (%v) (last said: %w); "+
		"it is not committed for the job (LATEST stays where it is), even if every node's part is in: "+
		"parts older than part_wait are never assembled (their collection may have begun)", p.Checkpoint, u.cfg.PartWait, ps.storeErr)
	log.Error().Err(err).Msg("job checkpoint given up")
	u.emit(UploadEvent{Kind: JobCheckpointFailed, Checkpoint: p.Checkpoint, At: time.Now(), Manifest: p, Err: err})
}
