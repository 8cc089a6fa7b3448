package checkpoint

import (
	"context"
	"errors"
	"fmt"
	"io"
	"slices"
	"strconv"
	"strings"
	"text/tabwriter"
	"time"
	"unicode"
)

// Committed is one committed checkpoint as listed.
type Committed struct {
	// Manifest is the checkpoint's manifest, validated.
	Manifest *Manifest
	// Key is the manifest's key in the store.
	Key string
	// Latest is true for the checkpoint that the job's LATEST pointer names.
	Latest bool
}

// ListCommitted returns the job's committed checkpoints: every valid manifest, of every commit
// (version 2: J/C/<commit>/_spotguard/manifest.json) and of version 1 checkpoints
// (J/C/_spotguard/manifest.json), newest first by Manifest.Order (the time the checkpoint
// completed, then the commit id), with Latest set on the one that LATEST names. It reads
// delimiter listings and manifests, never every object (readJob). It never trusts the store: a
// manifest that is not valid JSON, fails Validate, or names another job, checkpoint or commit
// than its key is left out.
//
// It returns:
//   - the checkpoints, nil problems, nil error: everything in the store was valid (no
//     checkpoints at all is nil, nil, nil; a missing LATEST is not a problem);
//   - the valid checkpoints (possibly none) and one problem per thing it skipped or could
//     not use: first each invalid or mismatched manifest, or one that vanished between the
//     listing and the read, in key order; then a LATEST that is not valid JSON, does not hold a
//     valid checkpoint name, or names a commit without a valid manifest (no Latest is set then);
//   - nil, nil and an error naming the store and job: job is not a valid name, ctx ended, or
//     the store failed to list or to read an object (any error but ErrNotFound), since a
//     listing with holes could make a restore pick an older checkpoint.
func ListCommitted(ctx context.Context, s Store, job string) ([]Committed, []error, error) {
	st, err := readJob(ctx, s, job, nil)
	if err != nil {
		return nil, nil, fmt.Errorf("list committed checkpoints: %w", err)
	}
	return st.Commits, st.Problems, nil
}

// ReadJob reads the job once, as ListCommitted does (with its errors), for a caller that shows
// more than one side of it: st.Commits and st.Problems are ListCommitted's, st.Incomplete()
// ListIncomplete's, and CheckJobRead checks it.
func ReadJob(ctx context.Context, s Store, job string) (*JobState, error) {
	st, err := readJob(ctx, s, job, nil)
	if err != nil {
		return nil, fmt.Errorf("list committed checkpoints: %w", err)
	}
	return st, nil
}

// Incomplete returns st's multi-node saves whose parts are not all in the store, newest first
// (see IncompleteSave); partWait (store.part_wait, or 0 if not known) says which were given up.
func (st *JobState) Incomplete(partWait time.Duration) []IncompleteSave {
	return incompleteSaves(st.Parts, st.Commits, partWait)
}

// ListIncomplete returns the job's multi-node saves whose parts are not all in the store, newest
// first (see IncompleteSave), with the same reading and errors as ListCommitted.
func ListIncomplete(ctx context.Context, s Store, job string) ([]IncompleteSave, error) {
	st, err := readJob(ctx, s, job, nil)
	if err != nil {
		return nil, fmt.Errorf("list incomplete checkpoints: %w", err)
	}
	return incompleteSaves(st.Parts, st.Commits, 0), nil
}

// checkNodeLayout checks that the job st holds commits of one layout, for `spotguard list
// --check`: single-node commits (manifests without parts) or multi-node ones (job manifests and
// parts), never both. Both is what a node of a multi-node job left at store.world_nodes 1 leaves
// behind: its own files committed alone as the job's checkpoint (torn), beside the other nodes'
// parts of the same saves; or a job resized to or from one node, which should give each size its
// own store.job (a restore would take either layout's newest commit). It returns nil, or one
// error naming the newest commit of each layout and the names saved both ways (a single-node
// commit within SaveSpread of a part of the same name).
func checkNodeLayout(st *JobState) error {
	type entry struct {
		name, commit, host string
		at                 time.Time
	}
	var singles, multi []entry
	jobs := 0
	for _, c := range st.Commits {
		m := c.Manifest
		if m.Parts == nil {
			singles = append(singles, entry{m.Checkpoint, m.Commit, describeHost(m.Host), m.Order().At})
			continue
		}
		jobs++
		for _, p := range m.Parts {
			multi = append(multi, entry{m.Checkpoint, p.Commit, fmt.Sprintf("node %d of %d, %s", p.NodeRank, m.WorldNodes, describeHost(p.Host)), p.CompleteAt})
		}
	}
	for _, p := range st.Parts {
		multi = append(multi, entry{p.Checkpoint, p.Commit, fmt.Sprintf("node %d of %d, %s", p.Part.NodeRank, p.Part.WorldNodes, describeHost(p.Host)), p.Order().At})
	}
	if len(singles) == 0 || len(multi) == 0 {
		return nil
	}
	newest := func(es []entry) entry {
		return slices.MaxFunc(es, func(a, b entry) int { return a.at.Compare(b.at) })
	}
	var both []string
	for _, s := range singles {
		if slices.Contains(both, s.name) {
			continue
		}
		if slices.ContainsFunc(multi, func(m entry) bool { return m.name == s.name && m.at.Sub(s.at).Abs() <= SaveSpread }) {
			both = append(both, s.name)
		}
	}
	ns, nm := newest(singles), newest(multi)
	msg := fmt.Sprintf("I6: the job holds single-node commits (%d, the newest %s/%s from %s) and multi-node ones (%d job checkpoints, %d parts in none of them; the newest part %s/%s from %s)",
		len(singles), ns.name, ns.commit, ns.host, jobs, len(st.Parts), nm.name, nm.commit, nm.host)
	if len(both) > 0 {
		slices.Sort(both)
		const show = 5
		list := strings.Join(both[:min(len(both), show)], ", ")
		if len(both) > show {
			list += fmt.Sprintf(" and %d more", len(both)-show)
		}
		msg += fmt.Sprintf("; saved both ways, a single-node commit beside the parts of the same save: %s", list)
	}
	msg += ": a node of a multi-node job with store.world_nodes unset (1) commits its own files alone as the job's checkpoint (torn); a job resized to or from one node should give each size its own store.job"
	return errors.New(msg)
}

// FormatIncomplete writes saves as a table for `spotguard list`: the checkpoint's name, "parts
// 3/4" with the node ranks that are in, the size so far and the newest part's completion time,
// then, for a save that can never be committed as it is, why (IncompleteSave.Problem), and for
// one the agents gave up, that (IncompleteSave.GivenUp).
func FormatIncomplete(w io.Writer, saves []IncompleteSave) {
	tw := tabwriter.NewWriter(w, 0, 0, 2, ' ', 0)
	fmt.Fprintln(tw, "INCOMPLETE\tPARTS\tNODES IN\tSIZE\tNEWEST PART COMPLETED AT")
	for _, is := range saves {
		line := fmt.Sprintf("%s\tparts %d/%d\t%s\t%s\t%s", is.Checkpoint, len(is.Ranks), is.WorldNodes, is.ranks(","),
			HumanBytes(is.Bytes), is.Newest.UTC().Format(time.RFC3339))
		if is.Problem != "" {
			line += "\tnever committed as it is: " + is.Problem
		}
		if is.GivenUp != "" {
			line += "\tgiven up: " + is.GivenUp
		}
		fmt.Fprintln(tw, line)
	}
	_ = tw.Flush()
}

// FormatList writes cs as a table for `spotguard list`: a header line, then one line per
// commit in the order given with the checkpoint's name, the commit id ("-" for a version 1
// checkpoint), file count, total size (binary units, e.g. "1.5 GiB"), trigger ("-" if none),
// completion time (RFC 3339, UTC; what orders commits) and "LATEST" on the one LATEST names.
// With no checkpoints it writes the header alone. Write errors are ignored (the caller's writer
// is a terminal or a buffer).
func FormatList(w io.Writer, cs []Committed) {
	tw := tabwriter.NewWriter(w, 0, 0, 2, ' ', 0)
	fmt.Fprintln(tw, "CHECKPOINT\tCOMMIT\tFILES\tSIZE\tTRIGGER\tCOMPLETED AT")
	for _, c := range cs {
		m := c.Manifest
		trigger := m.Trigger
		if trigger == "" {
			trigger = "-"
		}
		commit := m.Commit
		if commit == "" {
			commit = "-"
		}
		line := listName(m.Checkpoint) + "\t" + commit + "\t" + strconv.Itoa(len(m.Files)) + "\t" + HumanBytes(m.TotalBytes) +
			"\t" + trigger + "\t" + m.Order().At.UTC().Format(time.RFC3339)
		if c.Latest {
			line += "\tLATEST"
		}
		fmt.Fprintln(tw, line)
	}
	_ = tw.Flush()
}

// listName is a checkpoint's name as FormatList shows it: as it is, or quoted (Go syntax) when it
// holds a character a terminal does not print as itself (a right-to-left override drew the rest
// of its row reversed, found from outside; a control character of a manifest older than the rule
// against them).
func listName(name string) string {
	if strings.ContainsFunc(name, func(r rune) bool { return !unicode.IsPrint(r) }) {
		return strconv.Quote(name)
	}
	return name
}

// HumanBytes formats n bytes in binary units: "0 B", "1023 B", "1.0 KiB", "1.5 GiB".
// Negative n (never in a valid manifest) is formatted as a plain byte count.
func HumanBytes(n int64) string {
	const unit = 1024
	if n < unit {
		return strconv.FormatInt(n, 10) + " B"
	}
	f, exp := float64(n)/unit, 0
	for f >= unit-0.05 && exp < 5 { // 1023.96 KiB would print as "1024.0 KiB"
		f /= unit
		exp++
	}
	return fmt.Sprintf("%.1f %ciB", f, "KMGTPE"[exp])
}
