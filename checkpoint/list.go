package checkpoint

import (
	"context"
	"fmt"
	"io"
	"strconv"
	"strings"
	"text/tabwriter"
	"time"
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

// ListIncomplete returns the job's multi-node saves whose parts are not all in the store, newest
// first (see IncompleteSave), with the same reading and errors as ListCommitted.
func ListIncomplete(ctx context.Context, s Store, job string) ([]IncompleteSave, error) {
	st, err := readJob(ctx, s, job, nil)
	if err != nil {
		return nil, fmt.Errorf("list incomplete checkpoints: %w", err)
	}
	return incompleteSaves(st.Parts), nil
}

// FormatIncomplete writes saves as a table for `spotguard list`: the checkpoint's name, "parts
// 3/4" with the node ranks that are in, the size so far and the newest part's completion time.
func FormatIncomplete(w io.Writer, saves []IncompleteSave) {
	tw := tabwriter.NewWriter(w, 0, 0, 2, ' ', 0)
	fmt.Fprintln(tw, "INCOMPLETE\tPARTS\tNODES IN\tSIZE\tNEWEST PART COMPLETED AT")
	for _, is := range saves {
		ranks := make([]string, len(is.Ranks))
		for i, r := range is.Ranks {
			ranks[i] = strconv.Itoa(r)
		}
		fmt.Fprintf(tw, "%s\tparts %d/%d\t%s\t%s\t%s\n", is.Checkpoint, len(is.Ranks), is.WorldNodes, strings.Join(ranks, ","),
			HumanBytes(is.Bytes), is.Newest.UTC().Format(time.RFC3339))
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
		line := m.Checkpoint + "\t" + commit + "\t" + strconv.Itoa(len(m.Files)) + "\t" + HumanBytes(m.TotalBytes) +
			"\t" + trigger + "\t" + m.Order().At.UTC().Format(time.RFC3339)
		if c.Latest {
			line += "\tLATEST"
		}
		fmt.Fprintln(tw, line)
	}
	_ = tw.Flush()
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
