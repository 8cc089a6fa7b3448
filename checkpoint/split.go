package checkpoint

import (
	"cmp"
	"errors"
	"fmt"
	"slices"
	"strings"
	"time"
)

// A save committed in pieces. The nodes of a multi-node job that all run with store.world_nodes
// 1 (unset) each commit their own files alone, as the checkpoint of one node, under the same name
// and within seconds of each other: every commit is whole as a single-node commit, and none is
// the job's checkpoint, whose other files are in the other commits. Restoring the newest would
// restore a torn checkpoint as complete.
//
// Nothing in one commit shows it; side by side they do: single-node commits of one name by
// different instances, of one save (completed within SaveSpread, with the same marker bytes), and
// each with paths the others lack, as every multi-node layout gives each node files named by its
// ranks (DCP's __<rank>_0.distcp, DeepSpeed's zero_pp_rank_<rank>_*, Hugging Face's
// rng_state_<rank>.pth). Commits with the same paths are no pieces: copies of the same bytes
// (every node saving the same replicated model), or two whole saves with other bytes (two
// instances training the same job at once, as during a capacity rebalance: the newest stays the
// one restored). Nor is a commit whose paths another's include: the same save committed again
// with a file written after its marker (by an agent restarted in a container of another name).

// ErrSplitSave is wrapped by the errors that say a commit is one piece of a save committed in
// pieces (see [SplitSaveError]).
var ErrSplitSave = errors.New("checkpoint: a save was committed in pieces by several instances")

// SplitSaveError says that Commit is one piece of a save that Others, committed by other
// instances, are pieces of too.
type SplitSaveError struct {
	Commit *Manifest
	Others []*Manifest
	// Parts: Others are parts (or job manifests) of a multi-node save of the name, which Commit,
	// a single-node commit, was made beside: its node alone at store.world_nodes 1.
	Parts bool
}

func (e *SplitSaveError) Error() string {
	if e.Parts {
		var b strings.Builder
		fmt.Fprintf(&b, "checkpoint %s was committed by this instance alone (commit %s, %d files, store.world_nodes 1) beside a multi-node save of it by other instances (",
			e.Commit.Checkpoint, e.Commit.Commit, len(e.Commit.Files))
		for i, m := range e.Others {
			if i > 0 {
				b.WriteString("; ")
			}
			if m.Part != nil {
				fmt.Fprintf(&b, "part of node %d of %d, commit %s by %s", m.Part.NodeRank, m.Part.WorldNodes, m.Commit, describeHost(m.Host))
			} else {
				fmt.Fprintf(&b, "job checkpoint %s of %d nodes", m.Commit, len(m.Parts))
			}
		}
		b.WriteString("): this commit is not the whole checkpoint")
		return b.String()
	}
	pieces := append([]*Manifest{e.Commit}, e.Others...)
	slices.SortFunc(pieces, byOrder)
	first, last := pieces[0].Order().At, pieces[len(pieces)-1].Order().At
	instances := map[string]bool{}
	for _, m := range pieces {
		instances[describeHost(m.Host)] = true
	}
	var b strings.Builder
	fmt.Fprintf(&b, "checkpoint %s was committed in %d pieces by %d instances within %v of each other, each with other files (",
		e.Commit.Checkpoint, len(pieces), len(instances), last.Sub(first).Round(time.Millisecond))
	for i, m := range pieces {
		if i > 0 {
			b.WriteString("; ")
		}
		fmt.Fprintf(&b, "commit %s by %s, %d files", m.Commit, describeHost(m.Host), len(m.Files))
	}
	b.WriteString("): the nodes of a multi-node job with store.world_nodes unset (1); no one of them is the whole checkpoint")
	return b.String()
}

func (e *SplitSaveError) Unwrap() error { return ErrSplitSave }

// splitWith returns the commits among ms that are other pieces of the save that m is a piece of
// (see above), oldest first; nil when m is whole. Only version 2 single-node commits by known
// instances (an instance id or a host name) are judged: a commit without its instance cannot be
// told from one of the same instance, which saves the same name again only after a rollback.
func splitWith(m *Manifest, ms []*Manifest, marker string) []*Manifest {
	if !splittable(m) {
		return nil
	}
	var others []*Manifest
	for _, o := range ms {
		if o.Checkpoint != m.Checkpoint || o.Commit == m.Commit || !splittable(o) || sameInstance(m, o) ||
			!sameSave(m, o, marker) || !ownPaths(m, o) || !ownPaths(o, m) {
			continue
		}
		others = append(others, o)
	}
	slices.SortFunc(others, byOrder)
	return others
}

// byOrder orders manifests oldest first (Manifest.Order).
func byOrder(a, b *Manifest) int {
	switch ao, bo := a.Order(), b.Order(); {
	case bo.After(ao):
		return -1
	case ao.After(bo):
		return 1
	}
	return 0
}

// manifestsOf returns the manifests of cs, in cs's order.
func manifestsOf(cs []Committed) []*Manifest {
	ms := make([]*Manifest, 0, len(cs))
	for _, c := range cs {
		ms = append(ms, c.Manifest)
	}
	return ms
}

// commitsByName groups ms by checkpoint name, each in ms's order.
func commitsByName(ms []*Manifest) map[string][]*Manifest {
	by := map[string][]*Manifest{}
	for _, m := range ms {
		by[m.Checkpoint] = append(by[m.Checkpoint], m)
	}
	return by
}

// splittable reports whether m may be a piece of a split save: a version 2 single-node commit
// (no parts) whose instance is known.
func splittable(m *Manifest) bool {
	return m.Commit != "" && m.Part == nil && m.Parts == nil && (m.Host.InstanceID != "" || m.Host.Hostname != "")
}

// ownPaths reports whether a lists a path that b does not.
func ownPaths(a, b *Manifest) bool {
	for _, f := range a.Files {
		if _, ok := b.file(f.Path); !ok {
			return true
		}
	}
	return false
}

// SplitSaves returns one *SplitSaveError per save committed in pieces among cs (as ListCommitted
// returns them, newest first), newest first, each naming its newest piece and the others;
// marker is checkpoint.marker ("" means "_COMPLETE"). For `spotguard list` (a warning) and
// `list --check` (a violation).
func SplitSaves(cs []Committed, marker string) []error {
	marker = cmp.Or(marker, scanDefaultMarker)
	ms := manifestsOf(cs)
	byName := commitsByName(ms)
	seen := map[string]bool{}
	var errs []error
	for _, m := range ms {
		if seen[m.Commit] {
			continue
		}
		others := splitWith(m, byName[m.Checkpoint], marker)
		if len(others) == 0 {
			continue
		}
		for _, o := range others {
			seen[o.Commit] = true
		}
		errs = append(errs, &SplitSaveError{Commit: m, Others: others})
	}
	return errs
}
