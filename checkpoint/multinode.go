package checkpoint

// Multi-node jobs: one checkpoint made of every node's files, committed once.
//
// With store.world_nodes = N > 1, each node's agent commits its own files of a checkpoint C as
// today, under a commit of its own (J/C/<commit>/), but writes a part manifest
// (J/C/<commit>/_spotguard/part.json, If-None-Match) instead of a manifest: a part is not a
// commit. Then it lists C's commits and reads their parts; when it sees one part per rank from
// the same save as its own, it writes the job manifest, If-None-Match, at the key of rank 0's
// part's commit (J/C/<commit of rank 0>/_spotguard/manifest.json), so every agent that sees the
// same save writes the same key and one wins; then LATEST. The job manifest lists every file with
// its key, so a restore needs nothing else, and it is a commit like any other for LATEST, list,
// restore and retention.
//
// No node's PUT can replace another node's object (each writes under its own commit), and a
// checkpoint saved again after a rollback is a new save (new commits), never a collision. Which
// parts are one save: parts of one name whose completion times all lie within SaveSpread of
// each other (the first to the last, not each to its neighbour) and whose marker files have the
// same bytes (a trainer that writes the same token into the marker on every node makes this
// exact; parts whose markers complete more than SaveSpread apart are never one save). Two parts
// of one rank in one save from two instances (in a job manifest already or not), parts that
// disagree on world_nodes, one path in two parts with different bytes, and a single-node commit
// of the save (an agent of the job left at store.world_nodes 1) are errors, never resolved by
// picking one. LATEST is never moved back from a single-node commit (I3): a save older than the
// one LATEST names is not committed, and when that is a single-node commit, it is an error.
//
// An agent that dies between its part and the job manifest is covered by the others: every
// agent whose part is not in a job manifest yet looks again (Uploader: every partRecheck, and at
// start) until part_wait has passed since its part. Parts that never made a save are garbage
// once 2 × part_wait old, and retention deletes them.

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"maps"
	"path"
	"slices"
	"strconv"
	"strings"
	"time"

	"github.com/rs/zerolog"
	"golang.org/x/sync/errgroup"
)

// SaveSpread is how far apart in completion time the parts of one save may be: every node
// completes the same step within seconds (the trainers save together and write their markers
// after the save returns everywhere), while the same name saved again after a rollback comes
// after a crash, a restart and a restore, minutes later at the least.
const SaveSpread = time.Minute

// partMargin is how much older than part_wait the parts of a job checkpoint must be before
// retention deletes it, and completeAttempt bounds one attempt to complete a save: an attempt
// that read a part while it was at most part_wait old has written its job manifest, or given up,
// long before retention may delete that part's save.
const (
	partMargin      = 10 * time.Minute
	completeAttempt = 5 * time.Minute
)

// DefaultPartWait is store.part_wait's default: how long an agent keeps trying to complete a save
// whose parts are not all there.
const DefaultPartWait = time.Hour

// PartKey is the key of a node's part manifest: J/C/<commit>/_spotguard/part.json.
func PartKey(job, checkpoint, commit string) string {
	return path.Join(job, checkpoint, commit, MetaDir, "part.json")
}

// readPart reads and validates the part manifest of ref (from cache when it holds it), with
// readManifest's three outcomes: the part; a problem (absent: wrapping ErrNotFound; invalid; not
// a part; naming another job, checkpoint or commit than its key); or a store error.
func readPart(ctx context.Context, s Store, job string, ref CommitRef, cache *manifestCache) (*Manifest, error, error) {
	return readMeta(ctx, s, PartKey(job, ref.Checkpoint, ref.Commit), cache, func(m *Manifest) error {
		if m.Part == nil || m.Version != ManifestVersion || m.Job != job || m.Checkpoint != ref.Checkpoint || m.Commit != ref.Commit {
			return fmt.Errorf("not the part of job %q checkpoint %q commit %q; left alone", job, ref.Checkpoint, ref.Commit)
		}
		return nil
	})
}

// writePart writes the part manifest m with If-None-Match. One already there with the same
// files and rank (a retry whose answer was lost) is success; anything else there is an error
// wrapping ErrExists.
func writePart(ctx context.Context, s Store, m *Manifest) error {
	data, err := json.MarshalIndent(m, "", "  ")
	if err != nil {
		return err
	}
	key := PartKey(m.Job, m.Checkpoint, m.Commit)
	_, err = s.PutBytes(ctx, key, data, Cond{IfAbsent: true})
	if !errors.Is(err, ErrExists) {
		return err
	}
	have, problem, rerr := readExisting(ctx, func() (*Manifest, error, error) {
		return readPart(ctx, s, m.Job, CommitRef{Checkpoint: m.Checkpoint, Commit: m.Commit}, nil)
	})
	switch {
	case rerr != nil:
		return fmt.Errorf("part %s exists but cannot be read: %w", key, rerr)
	case problem != nil:
		return fmt.Errorf("part %s exists but cannot be used: %v: %w", key, problem, ErrExists)
	case *have.Part != *m.Part || !sameFiles(have, m):
		return fmt.Errorf("part %s exists with other files; not writing over it: %w", key, ErrExists)
	}
	return nil
}

// nameParts is what the store holds of one checkpoint name of a multi-node job.
type nameParts struct {
	// jobs are its commits (job manifests, or manifests of single-node saves).
	jobs []*Manifest
	// open are its parts that no job manifest lists.
	open []*Manifest
	// singles are its single-node commits: manifests without parts, of commits without a part
	// (an agent with store.world_nodes 1 wrote them).
	singles []*Manifest
	// problems are the manifests and parts left out.
	problems []error
}

// readNameParts reads the job manifests, parts and single-node commits of checkpoint name of
// job: one delimiter listing, then (readConcurrency at a time) each commit's part, and the
// manifest of each commit whose part is rank 0's (where a save's job manifest is) or that has no
// part (an upload in progress, or a single-node commit). Parts are read afresh; manifests come
// from cache when it holds them (they never change).
func readNameParts(ctx context.Context, s Store, job, name string, cache *manifestCache) (nameParts, error) {
	var np nameParts
	refs, err := listCommits(ctx, s, job, name)
	if err != nil {
		return np, fmt.Errorf("list commits of %s: %w", name, err)
	}
	refs = slices.DeleteFunc(refs, func(r CommitRef) bool { return r.Commit == "" })
	type read struct {
		part, job         *Manifest
		partProb, jobProb error
	}
	absent := func(problem error) bool { return errors.Is(problem, ErrNotFound) }
	reads := make([]read, len(refs))
	g, gctx := errgroup.WithContext(ctx)
	g.SetLimit(readConcurrency)
	for i, ref := range refs {
		g.Go(func() error {
			p, problem, err := readPart(gctx, s, job, ref, nil) // afresh: see completeSave
			if err != nil {
				return err
			}
			reads[i].part, reads[i].partProb = p, problem
			if (p == nil && !absent(problem)) || (p != nil && p.Part.NodeRank != 0) {
				return nil
			}
			m, problem, err := readManifest(gctx, s, job, ref, cache)
			reads[i].job, reads[i].jobProb = m, problem
			return err
		})
	}
	if err := g.Wait(); err != nil {
		return np, err
	}
	var parts []*Manifest
	for _, r := range reads {
		if r.part != nil {
			parts = append(parts, r.part)
		} else if !absent(r.partProb) {
			np.problems = append(np.problems, r.partProb)
		}
		switch {
		case r.job != nil && r.part != nil:
			np.jobs = append(np.jobs, r.job)
		case r.job != nil && r.job.Parts == nil:
			np.singles = append(np.singles, r.job)
		case r.job != nil:
			// A job manifest whose rank 0's part retention deleted: it is being deleted.
		case r.jobProb != nil && !absent(r.jobProb):
			np.problems = append(np.problems, r.jobProb)
		}
	}
	np.open = openParts(np.jobs, parts)
	return np, nil
}

// openParts returns the parts no job manifest of jobs lists.
func openParts(jobs, parts []*Manifest) []*Manifest {
	used := map[string]bool{}
	for _, m := range jobs {
		for _, p := range m.Parts {
			used[p.Commit] = true
		}
	}
	return slices.DeleteFunc(slices.Clone(parts), func(p *Manifest) bool { return used[p.Commit] })
}

// ConflictError is a save that cannot be committed as it is, whatever the store does: two
// instances claiming one rank, parts disagreeing, other parts in another agent's job manifest.
// Other errors of an attempt are the store's, and pass.
type ConflictError struct{ Err error }

func (e *ConflictError) Error() string { return e.Err.Error() }
func (e *ConflictError) Unwrap() error { return e.Err }

func conflict(err error) error { return &ConflictError{Err: err} }

// errSuperseded: the same instance wrote a newer part of the same rank for the same save; the
// older one is not completed.
var errSuperseded = errors.New("a newer part of this node for the same save exists")

// markerSum returns the checksum and size of the marker file in a part ("" when it has none).
func markerSum(p *Manifest, marker string) string {
	for _, f := range p.Files {
		if f.Path == marker {
			return fmt.Sprintf("%s:%s:%d", f.Checksum.Algorithm, f.Checksum.Value, f.Size)
		}
	}
	return ""
}

// sameSave reports whether part p may be of the same save as mine: completed within SaveSpread
// of it, with the same marker bytes (when both have the marker).
func sameSave(mine, p *Manifest, marker string) bool {
	a, b := mine.Order().At, p.Order().At
	if a.Sub(b).Abs() > SaveSpread {
		return false
	}
	ma, mb := markerSum(mine, marker), markerSum(p, marker)
	return ma == "" || mb == "" || ma == mb
}

// describePart names a part for messages: rank, commit and instance.
func describePart(p *Manifest) string {
	return fmt.Sprintf("node %d (commit %s, %s)", p.Part.NodeRank, p.Commit, describeHost(p.Host))
}

// describeHost names the instance of a host for messages: its instance id, else its host name.
func describeHost(h Host) string {
	switch {
	case h.InstanceID != "":
		return h.InstanceID
	case h.Hostname != "":
		return h.Hostname
	}
	return "unknown instance"
}

// apartError says why parts that are all there are not one save: two of them completed more
// than SaveSpread apart, or have markers with other bytes. It is no conflict: a part saved
// again may still make the save whole, so the save is looked at again until part_wait has passed.
type apartError struct{ a, b *Manifest }

func (e *apartError) Error() string {
	a, b := e.a, e.b
	if b.Order().At.Before(a.Order().At) {
		a, b = b, a
	}
	if d := b.Order().At.Sub(a.Order().At); d > SaveSpread {
		return fmt.Sprintf("%s and %s completed more than %v apart (%v): never one save; the trainer writes the marker on every node once the save returned everywhere, or a node's clock is that far off (a part's time is its node's file times: compare the nodes' clocks, chronyc tracking)",
			describePart(a), describePart(b), SaveSpread, d.Round(time.Second))
	}
	return fmt.Sprintf("%s and %s have markers with other bytes: not one save", describePart(a), describePart(b))
}

// jobPartManifest returns part p of job manifest m as a part manifest (without keys), for
// sameSave and sameInstance: its rank, commit, host, completion time and files.
func jobPartManifest(m *Manifest, p JobPart) *Manifest {
	complete := p.CompleteAt
	pm := &Manifest{Job: m.Job, Checkpoint: m.Checkpoint, Commit: p.Commit, Host: p.Host, Files: m.PartFiles(p.NodeRank),
		CommittedAt: p.CommittedAt, Part: &Part{NodeRank: p.NodeRank, WorldNodes: m.WorldNodes}}
	pm.Timings.CompleteAt = &complete
	return pm
}

// sameInstance reports whether two parts were written by one instance (by instance id, else
// host name); unknown is never the same.
func sameInstance(a, b *Manifest) bool {
	switch {
	case a.Host.InstanceID != "" || b.Host.InstanceID != "":
		return a.Host.InstanceID == b.Host.InstanceID
	case a.Host.Hostname != "":
		return a.Host.Hostname == b.Host.Hostname
	}
	return false
}

// assembleSave returns the parts of the save mine belongs to, one per rank sorted by rank, from
// open (the name's parts no job manifest lists; mine among them or not). A save is a set of
// parts whose completion times all lie within SaveSpread of each other (the whole span, not
// each one's neighbours) and whose markers, where they have one, have the same bytes. It returns
//   - the ranks still missing when there is no part of some rank within SaveSpread of mine;
//   - an *apartError when every rank has a part near mine, but two of them are not of one save
//     (more than SaveSpread apart, or other markers);
//   - errSuperseded when the same instance wrote a newer part of mine's rank for this save;
//   - an error for a save that can never be committed as it is: two instances claiming one
//     rank, parts disagreeing on world_nodes, or one path in two parts with different bytes.
func assembleSave(mine *Manifest, open []*Manifest, marker string) ([]*Manifest, []int, error) {
	world := mine.Part.WorldNodes
	byRank := make([]*Manifest, world)
	byRank[mine.Part.NodeRank] = mine
	var problems []error
	for _, p := range open {
		if p.Commit == mine.Commit || !sameSave(mine, p, marker) {
			continue
		}
		if p.Part.WorldNodes != world {
			problems = append(problems, fmt.Errorf("parts disagree on world_nodes: %s has %d, %s has %d",
				describePart(p), p.Part.WorldNodes, describePart(mine), world))
			continue
		}
		r := p.Part.NodeRank
		cur := byRank[r]
		switch {
		case cur == nil:
			byRank[r] = p
		case !sameInstance(cur, p):
			problems = append(problems, fmt.Errorf("node rank %d is claimed by two instances for one save: %s and %s (is store.node_rank set twice?)",
				r, describePart(cur), describePart(p)))
		case p.Order().After(cur.Order()):
			if cur == mine {
				return nil, nil, errSuperseded
			}
			byRank[r] = p
		}
	}
	if len(problems) > 0 {
		return nil, nil, errors.Join(problems...)
	}
	var missing []int
	for r, p := range byRank {
		if p == nil {
			missing = append(missing, r)
		}
	}
	if len(missing) > 0 {
		return nil, missing, nil
	}
	// Each part is near mine; all of them must be near each other.
	for i, p := range byRank {
		for _, q := range byRank[i+1:] {
			if !sameSave(p, q, marker) {
				return nil, nil, &apartError{a: p, b: q}
			}
		}
	}
	// One path in two parts: the same bytes (shared, e.g. a marker on every node) or an error.
	for _, d := range pathsApart(byRank) {
		problems = append(problems, fmt.Errorf("%s is in two parts with different bytes: %s (%d bytes) and %s (%d bytes)",
			d.path, describePart(d.a), d.fa.Size, describePart(d.b), d.fb.Size))
	}
	if len(problems) > 0 {
		return nil, nil, errors.Join(problems...)
	}
	return byRank, nil, nil
}

// pathApart is one path that two parts of a save hold with different bytes: a's file fa, b's fb.
type pathApart struct {
	path   string
	a, b   *Manifest
	fa, fb File
}

// pathsApart returns the paths that two of parts (one per rank, by rank) hold with different
// bytes (size or checksum): each later part against the first that holds the path. The same
// bytes are a shared file (a marker on every node); other bytes mean the parts are not one save.
func pathsApart(parts []*Manifest) []pathApart {
	var out []pathApart
	first := map[string]*Manifest{}
	firstFile := map[string]File{}
	for _, p := range parts {
		for _, f := range p.Files {
			q, ok := first[f.Path]
			if !ok {
				first[f.Path], firstFile[f.Path] = p, f
				continue
			}
			if g := firstFile[f.Path]; g.Size != f.Size || g.Checksum != f.Checksum {
				out = append(out, pathApart{path: f.Path, a: q, b: p, fa: g, fb: f})
			}
		}
	}
	return out
}

// buildJobManifest makes the job manifest of a save from its parts (one per rank, by rank),
// written by host at now.
func buildJobManifest(parts []*Manifest, host Host, now time.Time) *Manifest {
	p0 := parts[0]
	m := &Manifest{Version: ManifestVersion, Job: p0.Job, Checkpoint: p0.Checkpoint, Commit: p0.Commit, Host: host,
		Trigger: p0.Trigger, Notice: p0.Notice, CommittedAt: now, WorldNodes: len(parts)}
	files := map[string]*File{}
	for _, p := range parts {
		if p.Trigger == "notice" && m.Trigger != "notice" {
			m.Trigger, m.Notice = p.Trigger, p.Notice
		}
		complete := p.Order().At
		m.Parts = append(m.Parts, JobPart{NodeRank: p.Part.NodeRank, Commit: p.Commit, Host: p.Host, Files: len(p.Files),
			Bytes: p.TotalBytes, CompleteAt: complete, CommittedAt: p.CommittedAt})
		t := p.Timings
		if t.FirstFileAt != nil && (m.Timings.FirstFileAt == nil || t.FirstFileAt.Before(*m.Timings.FirstFileAt)) {
			m.Timings.FirstFileAt = t.FirstFileAt
		}
		if m.Timings.CompleteAt == nil || complete.After(*m.Timings.CompleteAt) {
			m.Timings.CompleteAt = &complete
		}
		if t.LastByteAt != nil && (m.Timings.LastByteAt == nil || t.LastByteAt.After(*m.Timings.LastByteAt)) {
			m.Timings.LastByteAt = t.LastByteAt
		}
		m.Timings.UploadSeconds = max(m.Timings.UploadSeconds, t.UploadSeconds)
		for _, f := range p.Files {
			if have := files[f.Path]; have != nil {
				have.Nodes = append(have.Nodes, p.Part.NodeRank)
				continue
			}
			f.Nodes = []int{p.Part.NodeRank}
			files[f.Path] = &f
			m.TotalBytes += f.Size
		}
	}
	for _, f := range files {
		m.Files = append(m.Files, *f)
	}
	slices.SortFunc(m.Files, func(a, b File) int { return strings.Compare(a.Path, b.Path) })
	return m
}

// sameParts reports whether two job manifests are made of the same parts.
func sameParts(a, b *Manifest) bool {
	return slices.EqualFunc(a.Parts, b.Parts, func(x, y JobPart) bool { return x.NodeRank == y.NodeRank && x.Commit == y.Commit })
}

// writeJobManifest writes the job manifest m with If-None-Match. One already there made of the
// same parts (another agent saw the same save first) is success; one of other parts is an
// error wrapping ErrExists, naming both.
func writeJobManifest(ctx context.Context, s Store, m *Manifest) (written bool, err error) {
	data, err := json.MarshalIndent(m, "", "  ")
	if err != nil {
		return false, err
	}
	key := ManifestKey(m.Job, m.Checkpoint, m.Commit)
	_, err = s.PutBytes(ctx, key, data, Cond{IfAbsent: true})
	if err == nil {
		return true, nil
	}
	if !errors.Is(err, ErrExists) {
		return false, err
	}
	have, problem, rerr := readExisting(ctx, func() (*Manifest, error, error) {
		return readManifest(ctx, s, m.Job, CommitRef{Checkpoint: m.Checkpoint, Commit: m.Commit}, nil)
	})
	if rerr == nil {
		rerr = problem
	}
	if rerr != nil {
		return false, fmt.Errorf("job manifest %s exists but cannot be read: %w", key, rerr)
	}
	if !sameParts(have, m) {
		return false, fmt.Errorf("job manifest %s was written by another agent with other parts (%s) than this one found (%s); not accepting it: %w",
			key, partList(have), partList(m), ErrExists)
	}
	return false, nil
}

// partList lists a job manifest's parts for messages: "0:<commit> 1:<commit> ...".
func partList(m *Manifest) string {
	var b strings.Builder
	for i, p := range m.Parts {
		if i > 0 {
			b.WriteByte(' ')
		}
		fmt.Fprintf(&b, "%d:%s", p.NodeRank, p.Commit)
	}
	return b.String()
}

// saveResult is what an attempt to complete a save (completeSave) found or did.
type saveResult struct {
	// job is the job manifest the part is in (written now, by this agent or another, or found).
	job *Manifest
	// written: this agent wrote job; latestMoved: and moved LATEST to it.
	written, latestMoved bool
	// missing are the ranks without a part yet.
	missing []int
	// waiting says why the save is not whole yet when more than a missing rank tells: parts of
	// the missing ranks that are of other saves, or parts of every rank that are not of one
	// save (apartError). It is no conflict: the save is looked at again.
	waiting error
	// superseded: this instance wrote a newer part of the save; this one is dropped.
	superseded bool
	// older: the save is complete but older than LATEST's target; it is not committed.
	older bool
	// problems are the store entries left out (invalid parts or manifests).
	problems []error
	err      error
	// latestErr: job is committed, but LATEST could not be moved to it (it is tried again).
	latestErr error
	// writing: every part was in and the job manifest was written, or its write was tried
	// and may have landed: the save is being committed, and a stop waits for it (draining).
	writing bool
}

// completeSave tries to complete the save of part mine: when the store holds a part of every
// rank for it, it writes the job manifest (or finds it written) and moves LATEST. Parts older
// than partWait (by their commit time) are not taken: the garbage collection of parts may
// delete them (at twice that age).
//
// Retention must never let it write a job manifest again once deleted (over deleted data): it
// takes only parts at most partWait old and runs for at most completeAttempt, while retention
// deletes a job checkpoint only once all its parts are older than partWait + partMargin
// (youngPart). It also reads the parts afresh (a cached one may be deleted since), and never
// writes a job manifest older than LATEST's target: a newer checkpoint is committed.
func completeSave(ctx context.Context, s Store, mine *Manifest, marker string, host Host, partWait time.Duration, cache *manifestCache) saveResult {
	if time.Since(mine.CommittedAt) > partWait {
		return saveResult{} // too old to be completed (see youngPart); the caller gives up
	}
	ctx, cancel := context.WithTimeout(ctx, completeAttempt)
	defer cancel()
	np, err := readNameParts(ctx, s, mine.Job, mine.Checkpoint, cache)
	if err != nil {
		return saveResult{err: err}
	}
	r := saveResult{problems: np.problems}
	for _, m := range np.jobs {
		if slices.ContainsFunc(m.Parts, func(p JobPart) bool { return p.Commit == mine.Commit }) {
			// Committed, by this agent or another; LATEST may not be on it yet (its writer
			// died, or failed, between the two).
			r.job = m
			r.latestMoved, r.latestErr = advanceLatest(ctx, s, m, host, cache)
			return r
		}
	}
	// A job checkpoint of this save committed with another part of this rank: a newer one of
	// this instance's (this one is superseded), or another instance's (a conflict, whichever
	// completed first). An older one of this instance's: the trainer saved again after the
	// save was committed; the other nodes' parts saved again may make a new save with this one.
	// One of another world_nodes: the other nodes committed the save without this node's files
	// (a conflict: that commit is torn).
	var conflicts []error
	for _, m := range np.jobs {
		if m.WorldNodes != mine.Part.WorldNodes {
			if err := worldApart(m, mine, marker); err != nil {
				conflicts = append(conflicts, err)
			}
			continue
		}
		for _, p := range m.Parts {
			if p.NodeRank != mine.Part.NodeRank {
				continue
			}
			other := jobPartManifest(m, p)
			switch {
			case !sameSave(mine, other, marker):
				// Another save of this name.
			case !sameInstance(mine, other):
				conflicts = append(conflicts, fmt.Errorf("node rank %d is claimed by two instances for one save: %s, in job commit %s, and %s (is store.node_rank set twice?)",
					p.NodeRank, describePart(other), m.Commit, describePart(mine)))
			case other.Order().After(mine.Order()):
				r.superseded = true
				return r
			}
		}
	}
	// A single-node commit of this save: an agent of this job with store.world_nodes 1 (unset)
	// committed its node's files alone. It is never this save's job checkpoint, nor made one.
	for _, m := range np.singles {
		if sameSave(mine, m, marker) {
			conflicts = append(conflicts, singleNodeError(m, mine))
		}
	}
	if len(conflicts) > 0 {
		r.err = conflict(fmt.Errorf("checkpoint %s cannot be committed for the job: %w", mine.Checkpoint, errors.Join(conflicts...)))
		return r
	}
	now := time.Now()
	var aged []int // ranks of parts of this save left out for their age
	open := slices.DeleteFunc(np.open, func(p *Manifest) bool {
		old := p.Commit != mine.Commit && now.Sub(p.CommittedAt) > partWait
		if old && p.Part.WorldNodes == mine.Part.WorldNodes && sameSave(mine, p, marker) && !slices.Contains(aged, p.Part.NodeRank) {
			aged = append(aged, p.Part.NodeRank)
		}
		return old
	})
	parts, missing, err := assembleSave(mine, open, marker)
	var apart *apartError
	switch {
	case errors.Is(err, errSuperseded):
		r.superseded = true
		return r
	case errors.As(err, &apart):
		r.waiting = fmt.Errorf("every node's part is in, but not of one save: %w", err)
		return r
	case err != nil:
		r.err = conflict(fmt.Errorf("checkpoint %s cannot be committed for the job: %w", mine.Checkpoint, err))
		return r
	case len(missing) > 0:
		r.missing = missing
		r.waiting = otherSaves(mine, open, missing)
		if late := slices.DeleteFunc(slices.Clone(missing), func(rank int) bool { return !slices.Contains(aged, rank) }); len(late) > 0 {
			slices.Sort(late)
			// Not missing: in the store, too old to be taken (their collection may begin).
			r.waiting = errors.Join(fmt.Errorf("the part(s) of node(s) %v of this save are in the store, but were committed more than part_wait (%v) before this look, "+
				"and a part older than part_wait is never assembled: set store.part_wait above the time from the first node's part to the last one's, uploads included", late, partWait), r.waiting)
		}
		return r
	}
	m := buildJobManifest(parts, host, now)
	if err := m.Validate(); err != nil {
		r.err = conflict(fmt.Errorf("refusing to write the job manifest of %s: %w", mine.Checkpoint, err))
		return r
	}
	data, _, err := s.GetBytes(ctx, LatestKey(mine.Job))
	switch {
	case errors.Is(err, ErrNotFound), errors.Is(err, ErrTooLarge): // none, or none usable
	case err != nil:
		r.err = fmt.Errorf("read %s: %w", LatestKey(mine.Job), err)
		return r
	default:
		if cur, ok := latestOrder(ctx, s, mine.Job, data, cache); ok && !m.Order().After(cur) && cur.Commit != m.Commit {
			if single := latestSingle(ctx, s, mine.Job, data, cache); single != nil {
				// Not moved back (I3), nor taken for the job's: said, as a conflict.
				r.err = conflict(fmt.Errorf("checkpoint %s cannot be committed for the job: LATEST names a newer checkpoint that is %w",
					mine.Checkpoint, singleNodeError(single, mine)))
				return r
			}
			r.older = true
			return r
		}
	}
	r.writing = true
	written, err := writeJobManifest(ctx, s, m)
	if err != nil {
		if errors.Is(err, ErrExists) {
			err = conflict(err) // another agent's job manifest of other parts
			r.writing = false   // this save is not being committed
		}
		r.err = err
		return r
	}
	if !written {
		if m, err = ReadManifest(ctx, s, m.Job, m.Checkpoint, m.Commit); err != nil {
			r.err = err
			return r
		}
	}
	r.job, r.written = m, written
	cache.put(ManifestKey(m.Job, m.Checkpoint, m.Commit), m)
	r.latestMoved, r.latestErr = advanceLatest(ctx, s, m, host, cache)
	return r
}

// worldApart returns the error of job manifest m, of another world_nodes than mine's, if a part
// of it is of mine's save: that job checkpoint was committed without mine's files.
func worldApart(m, mine *Manifest, marker string) error {
	for _, p := range m.Parts {
		if sameSave(mine, jobPartManifest(m, p), marker) {
			return fmt.Errorf("parts disagree on world_nodes: job commit %s of this save was made of %d nodes' parts with world_nodes %d, and %s has world_nodes %d: that commit lacks this node's files (is store.world_nodes the same on every node, or was the job resized mid-save?)",
				m.Commit, len(m.Parts), m.WorldNodes, describePart(mine), mine.Part.WorldNodes)
		}
	}
	return nil
}

// singleNodeError describes single, a single-node commit found by the agent of part mine, in a
// job of mine's world_nodes.
func singleNodeError(single, mine *Manifest) error {
	return fmt.Errorf("a single-node commit %s of %s (%s, no parts), in this job of world_nodes %d: an agent with store.world_nodes 1 committed its own node's files alone (is store.world_nodes unset on that node?); it is not taken for the job's checkpoint, and LATEST is not moved back from it",
		single.Commit, single.Checkpoint, describeHost(single.Host), mine.Part.WorldNodes)
}

// latestSingle returns the manifest LATEST (data) names when it is a single-node commit (a
// manifest without parts); nil when it is a job manifest or cannot be read.
func latestSingle(ctx context.Context, s Store, job string, data []byte, cache *manifestCache) *Manifest {
	var l Latest
	if json.Unmarshal(data, &l) != nil || ValidName(l.Checkpoint) != nil || (l.Commit != "" && ValidCommitID(l.Commit) != nil) {
		return nil
	}
	m, _, err := readManifest(ctx, s, job, CommitRef{Checkpoint: l.Checkpoint, Commit: l.Commit}, cache)
	if err != nil || m == nil || m.Parts != nil {
		return nil
	}
	return m
}

// otherSaves explains, for the missing ranks of mine's save, the parts of those ranks in open
// that are of other saves (more than SaveSpread from mine, or with other marker bytes): the
// nearest of each rank. It returns nil when there are none.
func otherSaves(mine *Manifest, open []*Manifest, missing []int) error {
	var notes []error
	for _, r := range missing {
		var near *Manifest
		for _, p := range open {
			if p.Part.NodeRank != r || p.Part.WorldNodes != mine.Part.WorldNodes {
				continue
			}
			if near == nil || p.Order().At.Sub(mine.Order().At).Abs() < near.Order().At.Sub(mine.Order().At).Abs() {
				near = p
			}
		}
		if near != nil {
			notes = append(notes, &apartError{a: mine, b: near})
		}
	}
	if len(notes) == 0 {
		return nil
	}
	return fmt.Errorf("parts of the missing node(s) are of other saves: %w", errors.Join(notes...))
}

// collectParts deletes the parts of job that never made a save: not listed by any job manifest,
// committed more than 2 × partWait ago (completeSave no longer takes them after partWait). Part
// manifest first, so no agent takes it any more, then the part's commit. It returns the commits
// deleted; one that could not be deleted is logged and left for the next time.
func collectParts(ctx context.Context, s Store, st *JobState, partWait time.Duration, log zerolog.Logger) []CommitRef {
	var deleted []CommitRef
	now := time.Now()
	for _, p := range st.Parts {
		if now.Sub(p.CommittedAt) <= 2*partWait {
			continue
		}
		plog := log.With().Str("checkpoint", p.Checkpoint).Str("commit", p.Commit).Int("node_rank", p.Part.NodeRank).Logger()
		if err := s.Delete(ctx, PartKey(p.Job, p.Checkpoint, p.Commit)); err != nil {
			plog.Warn().Err(err).Msg("retention: cannot delete a part that never made a job checkpoint")
			continue
		}
		if err := deletePrefix(ctx, s, CommitPrefix(p.Job, p.Checkpoint, p.Commit)); err != nil {
			plog.Warn().Err(err).Msg("retention: part deleted but its data left behind")
			continue
		}
		deleted = append(deleted, CommitRef{Checkpoint: p.Checkpoint, Commit: p.Commit})
		plog.Warn().Float64("part_wait_s", logSeconds(partWait)).Msg("retention: deleted a part that never made a job checkpoint (the other nodes' parts never came)")
	}
	return deleted
}

// IncompleteSave is a multi-node save whose parts are not all in the store (yet): the parts of
// one checkpoint name within SaveSpread of the newest of them, for `spotguard list`.
type IncompleteSave struct {
	Checkpoint string `json:"checkpoint"`
	// Ranks are the node ranks whose parts are there; WorldNodes how many make the save.
	Ranks      []int     `json:"ranks"`
	WorldNodes int       `json:"world_nodes"`
	Commits    []string  `json:"commits"`
	Bytes      int64     `json:"bytes"`
	Newest     time.Time `json:"newest_complete_at"`
	// Problem says why the save can never be committed as it is (a node rank claimed by two
	// instances, parts disagreeing on world_nodes); empty when it only waits for parts.
	Problem string `json:"problem,omitempty"`
	// GivenUp says, when the save's parts are older than store.part_wait, that the agents gave it
	// up: no agent assembles a part that old, so it is never committed (which parts, and when
	// every part is in, how far apart they came). Empty when part_wait is not known.
	GivenUp string `json:"given_up,omitempty"`
}

// incompleteSaves groups st's open parts into saves, newest first: for each name, the parts
// within SaveSpread of the newest one form one save, and so on with the rest. Each save's
// Problem is also what its parts make of the job checkpoints of commits made of the same save
// (committedProblems). partWait, if not 0, is store.part_wait: a save with a part older than that
// is said given up (GivenUp).
func incompleteSaves(parts []*Manifest, commits []Committed, partWait time.Duration) []IncompleteSave {
	byName := map[string][]*Manifest{}
	for _, p := range parts {
		byName[p.Checkpoint] = append(byName[p.Checkpoint], p)
	}
	var out []IncompleteSave
	now := time.Now()
	for name, ps := range byName {
		slices.SortFunc(ps, func(a, b *Manifest) int { return b.Order().At.Compare(a.Order().At) })
		for len(ps) > 0 {
			newest := ps[0]
			s := IncompleteSave{Checkpoint: name, WorldNodes: newest.Part.WorldNodes, Newest: newest.Order().At}
			rest, group := ps[:0:0], ps[:0:0]
			for _, p := range ps {
				if newest.Order().At.Sub(p.Order().At) > SaveSpread {
					rest = append(rest, p)
					continue
				}
				if !slices.Contains(s.Ranks, p.Part.NodeRank) {
					s.Ranks = append(s.Ranks, p.Part.NodeRank)
				}
				s.Commits = append(s.Commits, p.Commit)
				s.Bytes += p.TotalBytes
				group = append(group, p)
			}
			slices.Sort(s.Ranks)
			s.Problem = strings.Join(append(saveProblems(group), committedProblems(group, commits)...), "; ")
			s.GivenUp = givenUp(group, s, partWait, now)
			out = append(out, s)
			ps = rest
		}
	}
	slices.SortFunc(out, func(a, b IncompleteSave) int { return b.Newest.Compare(a.Newest) })
	return out
}

// givenUp says why the parts of one save (group, of save s) are never assembled, when one of them
// was committed more than partWait before now: an agent takes no part that old (completeSave), so
// the save waits for nothing (the late last part of a save whose first came more than part_wait
// before it; found from outside: "parts 3/3" with no word why). "" when none is, or partWait is 0.
func givenUp(group []*Manifest, s IncompleteSave, partWait time.Duration, now time.Time) string {
	if partWait <= 0 {
		return ""
	}
	var aged []string
	first, last := group[0].CommittedAt, group[0].CommittedAt
	for _, p := range group {
		if now.Sub(p.CommittedAt) > partWait {
			aged = append(aged, strconv.Itoa(p.Part.NodeRank))
		}
		if p.CommittedAt.Before(first) {
			first = p.CommittedAt
		}
		if p.CommittedAt.After(last) {
			last = p.CommittedAt
		}
	}
	if len(aged) == 0 {
		return ""
	}
	slices.Sort(aged)
	aged = slices.Compact(aged)
	msg := fmt.Sprintf("the part(s) of node(s) %s were committed more than store.part_wait (%v) ago, and no agent assembles a part that old", strings.Join(aged, ", "), partWait)
	if len(s.Ranks) == s.WorldNodes && last.Sub(first) > partWait {
		msg += fmt.Sprintf(": its last part came %v after its first; store.part_wait must cover the time from the first node's part to the last one's, uploads included",
			last.Sub(first).Round(time.Second))
	}
	return msg
}

// ranks returns the node ranks that are in, joined by sep.
func (is IncompleteSave) ranks(sep string) string {
	rs := make([]string, len(is.Ranks))
	for i, r := range is.Ranks {
		rs[i] = strconv.Itoa(r)
	}
	return strings.Join(rs, sep)
}

// describe says what is of the save and what is missing, for a restore that finds no commit:
// "multi-node save of step-000100, completed at T, is not committed: parts 1/2 in (nodes 0)".
func (is IncompleteSave) describe() string {
	msg := fmt.Sprintf("multi-node save of %s, completed at %s, is not committed: parts %d/%d in (nodes %s)",
		is.Checkpoint, is.Newest.UTC().Format(time.RFC3339), len(is.Ranks), is.WorldNodes, is.ranks(", "))
	switch {
	case is.Problem != "":
		return msg + ", and it never will be as it is: " + is.Problem
	case is.GivenUp != "":
		return msg + ", and it never will be: " + is.GivenUp
	case len(is.Ranks) == is.WorldNodes:
		return msg + ": every node's part is in, but they do not make one save (`spotguard list`; the agents' logs say why)"
	}
	return msg + "; its other nodes' parts are not in the store (`spotguard list`)"
}

// saveProblems say why the parts of one save (by time, as incompleteSaves groups them) can never
// make a job checkpoint as they are, as the agents find it: parts disagreeing on world_nodes
// (that alone), two instances claiming one node rank, or one path in two nodes' parts with other
// bytes. None when none.
func saveProblems(parts []*Manifest) []string {
	var problems []string
	worlds := map[int]bool{}
	for _, p := range parts {
		worlds[p.Part.WorldNodes] = true
	}
	if len(worlds) > 1 {
		var ws []string
		for _, w := range slices.Sorted(maps.Keys(worlds)) {
			ws = append(ws, strconv.Itoa(w))
		}
		// Ranks of two counts of nodes are not one numbering: no rank is claimed twice, nor a
		// path in two nodes' parts, across them (a job resized with its disks kept was said to
		// have a store.node_rank set twice; found from outside).
		return append(problems, "parts disagree on world_nodes ("+strings.Join(ws, ", ")+"): is store.world_nodes the same on every node, or was the job resized mid-save?")
	}
	byRank := map[int]*Manifest{}
	claimed := map[int]bool{}
	for _, p := range parts {
		r := p.Part.NodeRank
		switch cur := byRank[r]; {
		case cur == nil:
			byRank[r] = p
		case !sameInstance(cur, p) && !claimed[r]:
			claimed[r] = true
			problems = append(problems, fmt.Sprintf("node rank %d is claimed by two instances, %s and %s: is store.node_rank set twice?",
				r, describeHost(cur.Host), describeHost(p.Host)))
		}
	}
	// One path in the parts of two nodes with different bytes (the marker's token, a config
	// every node writes): as assembleSave finds it, the parts are not one save. Only where each
	// rank has one part here: with two of a rank (saves close together), another grouping may
	// still make one.
	if len(byRank) != len(parts) {
		return problems
	}
	ranked := make([]*Manifest, 0, len(byRank))
	for _, r := range slices.Sorted(maps.Keys(byRank)) {
		ranked = append(ranked, byRank[r])
	}
	said := map[string]bool{}
	for _, d := range pathsApart(ranked) {
		if !said[d.path] && len(said) < 3 {
			said[d.path] = true
			problems = append(problems, fmt.Sprintf("%s is in the parts of node %d and node %d with different bytes: not one save (is the marker written on every node once the save returned everywhere, with the same token?)",
				d.path, d.a.Part.NodeRank, d.b.Part.NodeRank))
		}
	}
	return problems
}

// committedProblems say why the parts of one save (group), which no job manifest lists, show a
// job checkpoint of the same save in commits to be torn, as the agents of those parts find it
// (completeSave): one made with another world_nodes (without the group's nodes' files), or with
// a part of a rank another instance claims in the group. A part of the same instance and rank
// as the committed one is that node saving again: no problem.
func committedProblems(group []*Manifest, commits []Committed) []string {
	var problems []string
	for _, c := range commits {
		m := c.Manifest
		if m == nil || m.Parts == nil || m.Checkpoint != group[0].Checkpoint {
			continue
		}
		worldSaid := false
		for _, p := range m.Parts {
			cp := jobPartManifest(m, p)
			for _, q := range group {
				switch {
				case !sameSave(q, cp, ""):
				case q.Part.WorldNodes != m.WorldNodes && !worldSaid:
					worldSaid = true
					problems = append(problems, fmt.Sprintf("job commit %s of this save was made with world_nodes %d, without these parts of world_nodes %d: it lacks their files (is store.world_nodes the same on every node?)",
						m.Commit, m.WorldNodes, q.Part.WorldNodes))
				case q.Part.WorldNodes == m.WorldNodes && q.Part.NodeRank == p.NodeRank && !sameInstance(q, cp):
					problems = append(problems, fmt.Sprintf("node rank %d is claimed by two instances, %s (in job commit %s) and %s: is store.node_rank set twice?",
						p.NodeRank, describeHost(cp.Host), m.Commit, describeHost(q.Host)))
				}
			}
		}
	}
	return slices.Compact(problems)
}
