package checkpoint

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"strings"
	"time"
)

// The checks here assert the invariants of commit.go on what a store holds. The simulation and
// the end-to-end tests call them after every step; `spotguard list --check` runs CheckJob on a
// real store.

// CheckJob checks job in s against the invariants a snapshot of the store can show, and returns
// one error per violation (none: nil):
//   - I1: every file of a version 2 commit is an object under that commit's own prefix (in a
//     job manifest, the prefix of the commit of the part of its first node);
//   - I2 (the store's side): every file a manifest lists exists with the size it lists
//     (restore verifies the checksums);
//   - I3: LATEST, when there is a commit, names a commit whose manifest is valid;
//   - I4: no manifest lists a file of spotguard's own (".spotguard-*", or a dot-".tmp" file);
//   - I7: no committed commit's prefix (no part's, for a job manifest) holds an object its
//     manifest does not list, but the manifest and part manifests (they are
//     removed before the manifest is written; incomplete uploads are the store's to show: the
//     tests list them with the store's own client);
//   - I6, when settled (no commit in flight, since LATEST is written after the manifest): no
//     commit is newer than LATEST's target;
//   - I6: the job's commits are all single-node or all multi-node (checkNodeLayout): both is a
//     node left at store.world_nodes 1 beside the others, or a job resized;
//   - I6: no save's uncommitted parts claim one node rank from two instances or disagree on
//     world_nodes (IncompleteSave.Problem): the agents never commit such a save.
//
// It returns a single error if the job cannot be read.
func CheckJob(ctx context.Context, s Store, job string, settled bool) []error {
	st, err := readJob(ctx, s, job, nil)
	if err != nil {
		return []error{err}
	}
	return CheckJobRead(ctx, s, st, settled)
}

// CheckJobRead is CheckJob on the job as ReadJob read it from s: `spotguard list --check` reads
// the job once for the list and the check.
func CheckJobRead(ctx context.Context, s Store, st *JobState, settled bool) []error {
	problems := append([]error(nil), st.Problems...)
	if err := checkNodeLayout(st); err != nil {
		problems = append(problems, err)
	}
	for _, c := range st.Commits {
		found, err := checkCommit(ctx, s, c.Manifest)
		if err != nil {
			return append(problems, err)
		}
		problems = append(problems, found...)
	}
	for _, is := range incompleteSaves(st.Parts, st.Commits, 0) {
		if is.Problem != "" {
			problems = append(problems, fmt.Errorf("I6: the parts of %s completed at %s can never make one save: %s",
				is.Checkpoint, is.Newest.UTC().Format(time.RFC3339), is.Problem))
		}
	}
	newest, target := st.Newest(), st.LatestTarget()
	switch {
	case newest == nil:
	case target == nil:
		problems = append(problems, errors.New("I3: there are commits but LATEST names none of them"))
	case settled && newest != target:
		problems = append(problems, fmt.Errorf("I6: LATEST names %s/%s but %s/%s is newer",
			target.Manifest.Checkpoint, target.Manifest.Commit, newest.Manifest.Checkpoint, newest.Manifest.Commit))
	}
	if l := st.Latest; l != nil && target != nil && l.CompleteAt != nil && !l.CompleteAt.Equal(target.Manifest.Order().At) {
		problems = append(problems, fmt.Errorf("I3: LATEST says %s/%s completed at %s; its manifest says %s",
			target.Manifest.Checkpoint, target.Manifest.Commit, l.CompleteAt.UTC().Format(time.RFC3339Nano), target.Manifest.Order().At.UTC().Format(time.RFC3339Nano)))
	}
	return problems
}

// checkCommit checks the commit of m as CheckJob does, and returns its violations. A commit that
// was deleted while it was checked (an agent's retention deletes a manifest, then the commit's
// objects) has none: its objects missing are its deletion, not damage.
func checkCommit(ctx context.Context, s Store, m *Manifest) ([]error, error) {
	var problems []error
	name := m.Checkpoint + "/" + m.Commit
	listed := map[string]int64{}
	// A commit's prefix, or every part's commit's prefix for a job manifest; each file must
	// be under its own (its first node's).
	var prefixes []string
	var objs []ObjectInfo
	if m.Version == ManifestVersion {
		prefixes = []string{CommitPrefix(m.Job, m.Checkpoint, m.Commit)}
		if len(m.Parts) > 0 {
			prefixes = prefixes[:0]
			for _, p := range m.Parts {
				prefixes = append(prefixes, CommitPrefix(m.Job, m.Checkpoint, p.Commit))
			}
		}
		for _, prefix := range prefixes {
			o, err := s.List(ctx, prefix)
			if err != nil {
				return nil, err
			}
			objs = append(objs, o...)
		}
	}
	for _, f := range m.Files {
		key := m.FileKey(f)
		listed[key] = f.Size
		if m.Version == ManifestVersion {
			prefix := prefixes[0]
			if len(m.Parts) > 0 && len(f.Nodes) > 0 && f.Nodes[0] < len(prefixes) {
				prefix = prefixes[f.Nodes[0]]
			}
			if !strings.HasPrefix(key, prefix) {
				problems = append(problems, fmt.Errorf("I1: commit %s lists %s outside its prefix %s", name, key, prefix))
				// Not looked for below: only the commit's prefixes are listed, and an object
				// outside them would be said "not in the store" whether it is or not.
				delete(listed, key)
			}
		}
		if ownFile(f.Path) {
			problems = append(problems, fmt.Errorf("I4: commit %s lists spotguard's own file %s", name, f.Path))
		}
	}
	if m.Version != ManifestVersion {
		return problems, nil
	}
	have := map[string]int64{}
	for _, o := range objs {
		have[o.Key] = o.Size
	}
	for key, size := range listed {
		got, ok := have[key]
		switch {
		case !ok:
			problems = append(problems, fmt.Errorf("I2: commit %s lists %s, which is not in the store", name, key))
		case got != size:
			problems = append(problems, fmt.Errorf("I2: commit %s lists %s with %d bytes; the object has %d", name, key, size, got))
		}
	}
	own := map[string]bool{ManifestKey(m.Job, m.Checkpoint, m.Commit): true}
	for _, p := range m.Parts {
		ref := CommitRef{Checkpoint: m.Checkpoint, Commit: p.Commit}
		own[PartKey(m.Job, m.Checkpoint, p.Commit)] = true
		// A file the job manifest lists once may be in several parts (the same bytes): each
		// part's copy is its own. The job manifest names the ranks that have it, which tells
		// even when the part manifest is gone: retention deletes a job checkpoint's part
		// manifests first, and a stop between that and the rest leaves it so until the next.
		for _, f := range m.Files {
			if slices.Contains(f.Nodes, p.NodeRank) {
				own[DataKey(m.Job, m.Checkpoint, p.Commit, f.Path)] = true
			}
		}
		part, _, err := readPart(ctx, s, m.Job, ref, nil)
		if err != nil {
			return nil, err
		}
		if part != nil {
			for _, f := range part.Files {
				own[f.Key] = true
			}
		}
	}
	for _, o := range objs {
		if _, ok := listed[o.Key]; !ok && !own[o.Key] {
			problems = append(problems, &StrayObject{Commit: name, Key: o.Key})
		}
	}
	if len(problems) > 0 {
		if gone, _ := commitDeleted(ctx, s, m); gone {
			return nil, nil // deleted since the job was read
		}
	}
	return problems, nil
}

// ownFile reports whether rel names a file of spotguard's own or a writer's temporary file, which
// is never part of a checkpoint.
func ownFile(rel string) bool {
	for el := range strings.SplitSeq(rel, "/") {
		if strings.HasPrefix(el, ".spotguard-") || scanSkipName(el) {
			return true
		}
	}
	return false
}

// CheckLatestForward checks I3 across two readings of LATEST, prev then next: LATEST never moves
// to a commit earlier in Manifest.Order. Either may be nil (no LATEST yet).
func CheckLatestForward(prev, next *Latest) error {
	if prev == nil || prev.CompleteAt == nil {
		return nil
	}
	if next == nil {
		return fmt.Errorf("I3: LATEST (%s/%s) vanished", prev.Checkpoint, prev.Commit)
	}
	if next.CompleteAt == nil {
		return fmt.Errorf("I3: LATEST moved from %s/%s to %s/%s, which has no completion time", prev.Checkpoint, prev.Commit, next.Checkpoint, next.Commit)
	}
	p := CommitOrder{At: *prev.CompleteAt, Commit: prev.Commit}
	n := CommitOrder{At: *next.CompleteAt, Commit: next.Commit}
	if p.After(n) {
		return fmt.Errorf("I3: LATEST moved back from %s/%s (%s) to %s/%s (%s)", prev.Checkpoint, prev.Commit,
			p.At.Format("15:04:05.000"), next.Checkpoint, next.Commit, n.At.Format("15:04:05.000"))
	}
	return nil
}

// StrayObject is CheckJob's problem for an object under a commit that its manifest does not
// list: a leftover, or a write that landed after the commit and that the committing agent's late
// clean-up passes have not deleted yet.
type StrayObject struct {
	Commit string // checkpoint/commit
	Key    string
}

func (e *StrayObject) Error() string {
	return fmt.Sprintf("I7: commit %s holds %s, which its manifest does not list", e.Commit, e.Key)
}
