package checkpoint

import (
	"cmp"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"slices"
	"strconv"
	"strings"
	"text/tabwriter"
	"time"

	"golang.org/x/sync/errgroup"
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

// listReadConcurrency is how many manifests ListCommitted reads at once.
const listReadConcurrency = 16

// ListCommitted returns the job's committed checkpoints: every valid manifest at
// job/C/_spotguard/manifest.json, newest CommittedAt first (equal times: greater name first),
// with Latest set on the one that job/LATEST names. It never trusts the store: a manifest
// that is not valid JSON, fails Validate, or names another job or checkpoint than its key is
// left out.
//
// It returns:
//   - the checkpoints, nil problems, nil error: everything in the store was valid (no
//     checkpoints at all is nil, nil, nil; a missing LATEST is not a problem);
//   - the valid checkpoints (possibly none) and one problem per thing it skipped or could
//     not use: first each invalid or mismatched manifest, or one that vanished between List
//     and read, in key order; then a LATEST that is not valid JSON, does not hold a valid
//     checkpoint name, or names a checkpoint without a valid manifest (no Latest is set then);
//   - nil, nil and an error naming the store and job: job is not a valid name, ctx ended, or
//     the store failed to list or to read an object (any error but ErrNotFound), since a
//     listing with holes could make a restore pick an older checkpoint.
func ListCommitted(ctx context.Context, s Store, job string) ([]Committed, []error, error) {
	if err := ValidName(job); err != nil {
		return nil, nil, fmt.Errorf("list committed checkpoints: job: %w", err)
	}
	fail := func(err error) ([]Committed, []error, error) {
		return nil, nil, fmt.Errorf("list committed checkpoints of job %s in %s: %w", job, s.URL(), err)
	}
	objs, err := s.List(ctx, job+"/")
	if err != nil {
		return fail(err)
	}
	var names []string
	for _, o := range objs {
		if name, ok := listManifestName(job, o.Key); ok {
			names = append(names, name)
		}
	}

	// Read the manifests in parallel; results land by index, so the order stays by key.
	type read struct {
		m       *Manifest
		problem error
	}
	reads := make([]read, len(names))
	g, gctx := errgroup.WithContext(ctx)
	g.SetLimit(listReadConcurrency)
	for i, name := range names {
		g.Go(func() error {
			m, problem, err := listReadManifest(gctx, s, job, name)
			reads[i] = read{m: m, problem: problem}
			return err
		})
	}
	latest, latestProblem, err := listReadLatest(ctx, s, job)
	if werr := g.Wait(); werr != nil {
		return fail(werr)
	}
	if err != nil {
		return fail(err)
	}

	var cs []Committed
	var problems []error
	for i, r := range reads {
		if r.problem != nil {
			problems = append(problems, r.problem)
			continue
		}
		cs = append(cs, Committed{
			Manifest: r.m,
			Key:      ManifestKey(job, names[i]),
			Latest:   latest != "" && names[i] == latest,
		})
	}
	if latestProblem != nil {
		problems = append(problems, latestProblem)
	} else if latest != "" && !slices.ContainsFunc(cs, func(c Committed) bool { return c.Latest }) {
		problems = append(problems, fmt.Errorf("%s names checkpoint %q, which has no valid manifest", LatestKey(job), latest))
	}
	slices.SortStableFunc(cs, func(a, b Committed) int {
		if c := b.Manifest.CommittedAt.Compare(a.Manifest.CommittedAt); c != 0 {
			return c
		}
		return cmp.Compare(b.Manifest.Checkpoint, a.Manifest.Checkpoint)
	})
	return cs, problems, nil
}

// listManifestName returns C when key is exactly job/C/_spotguard/manifest.json, and false
// for every other key (data files, a trainer's own sub/_spotguard/manifest.json, LATEST).
func listManifestName(job, key string) (string, bool) {
	rest, ok := strings.CutPrefix(key, job+"/")
	if !ok {
		return "", false
	}
	parts := strings.Split(rest, "/")
	if len(parts) != 3 || parts[1] != MetaDir || parts[2] != "manifest.json" || parts[0] == "" {
		return "", false
	}
	return parts[0], true
}

// listReadManifest reads and validates the manifest of checkpoint name of job. It returns:
//   - the manifest, nil, nil: valid, and it names job and name;
//   - nil, a problem, nil: no manifest (the problem wraps ErrNotFound), not valid JSON,
//     invalid, or it names another job or checkpoint than its key; the problem names the key;
//   - nil, nil, an error: the store failed otherwise, or ctx ended.
func listReadManifest(ctx context.Context, s Store, job, name string) (*Manifest, error, error) {
	key := ManifestKey(job, name)
	data, _, err := s.GetBytes(ctx, key)
	switch {
	case errors.Is(err, ErrNotFound):
		return nil, fmt.Errorf("%s: %w", key, err), nil
	case err != nil:
		return nil, nil, fmt.Errorf("read %s: %w", key, err)
	}
	m, err := ParseManifest(data)
	if err != nil {
		return nil, fmt.Errorf("%s: %w", key, err), nil
	}
	if m.Job != job || m.Checkpoint != name {
		return nil, fmt.Errorf("%s: manifest names job %q checkpoint %q; refusing a manifest that does not match its key", key, m.Job, m.Checkpoint), nil
	}
	return m, nil, nil
}

// ReadManifest reads and validates the manifest of checkpoint name of job. It returns the
// manifest, or an error naming the key: no manifest (wrapping ErrNotFound), not valid JSON,
// invalid, naming another job or checkpoint than its key, or the store failing.
func ReadManifest(ctx context.Context, s Store, job, name string) (*Manifest, error) {
	m, problem, err := listReadManifest(ctx, s, job, name)
	if err != nil {
		return nil, err
	}
	if problem != nil {
		return nil, problem
	}
	return m, nil
}

// listReadLatest reads the job's LATEST pointer. It returns:
//   - the checkpoint name, nil, nil: LATEST names a valid checkpoint name (whose manifest may
//     still be missing or invalid);
//   - "", nil, nil: there is no LATEST;
//   - "", a problem, nil: LATEST is not valid JSON or does not hold a valid name;
//   - "", nil, an error: the store failed otherwise, or ctx ended.
func listReadLatest(ctx context.Context, s Store, job string) (string, error, error) {
	key := LatestKey(job)
	data, _, err := s.GetBytes(ctx, key)
	switch {
	case errors.Is(err, ErrNotFound):
		return "", nil, nil
	case err != nil:
		return "", nil, fmt.Errorf("read %s: %w", key, err)
	}
	var l Latest
	if err := json.Unmarshal(data, &l); err != nil {
		return "", fmt.Errorf("%s is not valid JSON: %w", key, err), nil
	}
	if err := ValidName(l.Checkpoint); err != nil {
		return "", fmt.Errorf("%s: checkpoint: %w", key, err), nil
	}
	return l.Checkpoint, nil, nil
}

// FormatList writes cs as a table for `spotguard list`: a header line, then one line per
// checkpoint in the order given with its name, file count, total size (binary units, e.g.
// "1.5 GiB"), trigger ("-" if none), commit time (RFC 3339, UTC) and "LATEST" on the one
// LATEST names. With no checkpoints it writes the header alone. Write errors are ignored (the
// caller's writer is a terminal or a buffer).
func FormatList(w io.Writer, cs []Committed) {
	tw := tabwriter.NewWriter(w, 0, 0, 2, ' ', 0)
	fmt.Fprintln(tw, "CHECKPOINT\tFILES\tSIZE\tTRIGGER\tCOMMITTED AT")
	for _, c := range cs {
		m := c.Manifest
		trigger := m.Trigger
		if trigger == "" {
			trigger = "-"
		}
		line := m.Checkpoint + "\t" + strconv.Itoa(len(m.Files)) + "\t" + HumanBytes(m.TotalBytes) +
			"\t" + trigger + "\t" + m.CommittedAt.UTC().Format(time.RFC3339)
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
