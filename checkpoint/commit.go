package checkpoint

// The commit protocol: how a checkpoint becomes a commit in the store, how LATEST moves, and what
// retention may delete. Everything here keeps the invariants of DESIGN.md ("never lose a
// checkpoint"); the checks in invariants.go assert them, and the tests call the same checks.
//
//   - I1 Immutable. Every commit writes only below its own prefix J/C/<commit>/, whose id is
//     chosen by one agent when its first file is sent (NewCommitID), so no commit writes an
//     object another commit wrote. The manifest is written once, with If-None-Match; once a
//     manifest PUT has been tried, the uploader never writes into that commit again (a change
//     after it becomes a new commit).
//   - I2 True. A manifest lists only files whose stored bytes were read from the file while it
//     was the same version (device, inode, size, mtime, ctime) that is on disk when the commit
//     is checked; a file whose ctime is too close to the read to tell is read again and compared
//     by checksum (see racy).
//   - I3 LATEST moves forward. LATEST is written only after the manifest it names, with If-Match
//     on the ETag read (If-None-Match when absent), and only to a commit later in
//     Manifest.Order; retention keeps LATEST's target and every commit at or after it.
//   - I4 Only the trainer's files. The uploader sends only what the watcher reports, and the
//     watcher never reports spotguard's own files (".spotguard-*", dot-".tmp" files).
//   - I5 Live. A commit is retried until it succeeds; a file or checkpoint that vanishes leaves
//     tracking, so it never holds a commit or a stop.
//   - I6 Never silent, never stale. A name committed again with other bytes is a new commit
//     (logged); the newest commit by Manifest.Order is what restore takes, even when LATEST lags.
//   - I7 Exact cleanup. Only incomplete uploads under a prefix this agent owns (its own commits)
//     are aborted, and only those its store value is not running (Store.AbortIncomplete).
//   - I8 Scales. Reading a job (readJob) costs one delimiter listing of the job, one per
//     checkpoint name and one read per commit's manifest, never a listing of every object;
//     per-event work in the uploader does not grow with the number of files.

import (
	"context"
	"crypto/rand"
	"encoding/binary"
	"encoding/json"
	"errors"
	"fmt"
	"path"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"time"

	"github.com/rs/zerolog"
	"golang.org/x/sync/errgroup"
)

// MetaDir is the directory, inside a commit's prefix, that holds spotguard's own files. A
// trainer's file of that name is refused.
const MetaDir = "_spotguard"

// DataKey is the key of a checkpoint's file in commit: J/C/<commit>/<rel>. An empty commit gives
// the version 1 layout, J/C/<rel>.
func DataKey(job, checkpoint, commit, rel string) string {
	return path.Join(job, checkpoint, commit, rel)
}

// ManifestKey is the key of a commit's manifest: J/C/<commit>/_spotguard/manifest.json. An empty
// commit gives the version 1 key, J/C/_spotguard/manifest.json.
func ManifestKey(job, checkpoint, commit string) string {
	return path.Join(job, checkpoint, commit, MetaDir, "manifest.json")
}

// CommitPrefix is the prefix every object of a commit starts with: J/C/<commit>/.
func CommitPrefix(job, checkpoint, commit string) string {
	return path.Join(job, checkpoint, commit) + "/"
}

// LatestKey is the key of a job's LATEST pointer: J/LATEST.
func LatestKey(job string) string { return path.Join(job, "LATEST") }

// commitIDTime is the layout of the time at the start of a commit id.
const commitIDTime = "20060102T150405Z"

// commitIDLen is the length of a commit id: the time, a dash, 12 hex digits.
const commitIDLen = len(commitIDTime) + 1 + 12

// NewCommitID returns a fresh commit id: the UTC time now, to the second, then 48 random bits,
// e.g. "20261130T203714Z-1f2e3d4c5b6a". Ids sort by the time their commit began.
func NewCommitID(now time.Time) string {
	var b [8]byte
	_, _ = rand.Read(b[:]) // never fails on Linux
	return commitIDAt(now, binary.BigEndian.Uint64(b[:]))
}

// commitIDAt is the commit id of now with the low 48 bits of bits as its random part.
func commitIDAt(now time.Time, bits uint64) string {
	return fmt.Sprintf("%s-%012x", now.UTC().Format(commitIDTime), bits&(1<<48-1))
}

// ValidCommitID reports whether id has the form NewCommitID returns.
func ValidCommitID(id string) error {
	if len(id) != commitIDLen || id[len(commitIDTime)] != '-' {
		return fmt.Errorf("%q is not a commit id", id)
	}
	if _, err := time.Parse(commitIDTime, id[:len(commitIDTime)]); err != nil {
		return fmt.Errorf("%q is not a commit id", id)
	}
	for _, c := range id[len(commitIDTime)+1:] {
		if (c < '0' || c > '9') && (c < 'a' || c > 'f') {
			return fmt.Errorf("%q is not a commit id", id)
		}
	}
	return nil
}

// commitIDStarted returns the time a valid commit id began.
func commitIDStarted(id string) time.Time {
	t, _ := time.Parse(commitIDTime, id[:len(commitIDTime)])
	return t
}

// CommitRef names one commit of a checkpoint.
type CommitRef struct {
	Checkpoint, Commit string
}

// JobState is what a job holds in a store, as readJob read it.
type JobState struct {
	// Commits are the valid committed checkpoints, newest first by Manifest.Order, with
	// Latest set on the one LATEST names.
	Commits []Committed
	// Unfinished are version 2 commit prefixes without a manifest or a part (uploads in
	// progress, or abandoned), by checkpoint then commit.
	Unfinished []CommitRef
	// Parts are the parts of multi-node saves that no job manifest lists (saves waiting for
	// other nodes' parts, or that never completed), by checkpoint then commit.
	Parts []*Manifest
	// Latest is LATEST as read, nil when there is none or it is not valid JSON; LatestETag
	// is its ETag.
	Latest     *Latest
	LatestETag string
	// Problems are the things readJob skipped: invalid or mismatched manifests, a LATEST that
	// is unreadable or names no valid commit.
	Problems []error
}

// Newest returns the newest commit, or nil if there is none.
func (st *JobState) Newest() *Committed {
	if len(st.Commits) == 0 {
		return nil
	}
	return &st.Commits[0]
}

// latestUnusable returns the problem of the manifest of the commit LATEST names when there is one
// (the store holds that manifest, but it is not valid here: a newer spotguard's, or damaged), or
// nil.
func (st *JobState) latestUnusable() *ManifestProblem {
	if st.Latest == nil || st.LatestTarget() != nil {
		return nil
	}
	for _, p := range st.Problems {
		mp, ok := errors.AsType[*ManifestProblem](p)
		if ok && !mp.Part && mp.Ref.Checkpoint == st.Latest.Checkpoint && mp.Ref.Commit == st.Latest.Commit && !errors.Is(mp.Err, ErrNotFound) {
			return mp
		}
	}
	return nil
}

// LatestTarget returns the commit LATEST names, or nil.
func (st *JobState) LatestTarget() *Committed {
	for i := range st.Commits {
		if st.Commits[i].Latest {
			return &st.Commits[i]
		}
	}
	return nil
}

// manifestCache keeps manifests read from a store by key. A manifest is written once and never
// changed, so a cached one stays true until retention deletes it. Safe for concurrent use.
type manifestCache struct {
	mu sync.Mutex
	m  map[string]*Manifest
}

func (c *manifestCache) get(key string) *Manifest {
	if c == nil {
		return nil
	}
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.m[key]
}

func (c *manifestCache) put(key string, m *Manifest) {
	if c == nil {
		return
	}
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.m == nil {
		c.m = map[string]*Manifest{}
	}
	c.m[key] = m
}

func (c *manifestCache) drop(key string) {
	if c == nil {
		return
	}
	c.mu.Lock()
	defer c.mu.Unlock()
	delete(c.m, key)
}

// readConcurrency is how many listings or manifest reads readJob has in flight.
const readConcurrency = 16

// readJob reads what job holds in s: one delimiter listing of J/, one of each J/C/, and each
// commit's manifest (from cache when it holds it; cache may be nil). It never lists every
// object. A manifest that is not valid, or names another job, checkpoint or commit than its key,
// is a problem and left out; so is a LATEST that cannot be used. A LATEST that names a commit
// the listing did not show (committed while it read) has that commit's manifest read too, and
// the commit taken. It returns an error (and no state) when job is not a valid name, ctx ends,
// or the store fails to list or read (any error but ErrNotFound): a state with holes could make
// a restore pick an older checkpoint.
func readJob(ctx context.Context, s Store, job string, cache *manifestCache) (*JobState, error) {
	if err := ValidName(job); err != nil {
		return nil, fmt.Errorf("job: %w", err)
	}
	fail := func(err error) (*JobState, error) {
		return nil, fmt.Errorf("read job %s in %s: %w", job, s.URL(), err)
	}
	names, _, err := s.ListDir(ctx, job+"/")
	if err != nil {
		return fail(err)
	}
	names = slices.DeleteFunc(names, func(n string) bool { return ValidName(n) != nil })

	// Every commit of every name: version 2 commit directories, and the version 1 manifest.
	refs := make([][]CommitRef, len(names))
	g, gctx := errgroup.WithContext(ctx)
	g.SetLimit(readConcurrency)
	for i, name := range names {
		g.Go(func() (err error) {
			refs[i], err = listCommits(gctx, s, job, name)
			return err
		})
	}
	if err := g.Wait(); err != nil {
		return fail(err)
	}
	var all []CommitRef
	for _, r := range refs {
		all = append(all, r...)
	}

	type read struct {
		m, part *Manifest
		problem error
		absent  bool
		// partProblem: problem is the part manifest's (the commit has no manifest).
		partProblem bool
	}
	reads := make([]read, len(all))
	g, gctx = errgroup.WithContext(ctx)
	g.SetLimit(readConcurrency)
	for i, ref := range all {
		g.Go(func() error {
			m, problem, err := readManifest(gctx, s, job, ref, cache)
			if err != nil {
				return err
			}
			reads[i] = read{m: m, problem: problem, absent: errors.Is(problem, ErrNotFound)}
			if !reads[i].absent || ref.Commit == "" {
				return nil
			}
			// No manifest: a node's part of a multi-node save, or an unfinished commit.
			part, problem, err := readPart(gctx, s, job, ref, cache)
			switch {
			case err != nil:
				return err
			case part != nil:
				reads[i].part = part
			case !errors.Is(problem, ErrNotFound):
				reads[i] = read{problem: problem, partProblem: true}
			}
			return nil
		})
	}
	var latest *Latest
	var latestETag string
	var latestProblem error
	g.Go(func() (err error) {
		latest, latestETag, latestProblem, err = getLatest(gctx, s, job)
		return err
	})
	if err := g.Wait(); err != nil {
		return fail(err)
	}
	// A LATEST that names a commit this reading has no manifest of was read in the middle of a
	// commit (its manifest written after the listing or the read of it, then LATEST), or of a
	// retention that deleted its target after LATEST moved on. The manifest is read itself, from
	// the store (a cached copy may be of a commit deleted since); if it is not there, LATEST once
	// more.
	for range latestRereads {
		if latest == nil || latestProblem != nil || ValidName(latest.Checkpoint) != nil ||
			slices.ContainsFunc(reads, func(r read) bool {
				return r.m != nil && r.m.Checkpoint == latest.Checkpoint && r.m.Commit == latest.Commit
			}) {
			break
		}
		ref := CommitRef{Checkpoint: latest.Checkpoint, Commit: latest.Commit}
		m, problem, err := readManifest(ctx, s, job, ref, nil)
		if err != nil {
			return fail(err)
		}
		if m != nil && problem == nil {
			i := slices.Index(all, ref)
			if i < 0 {
				all, reads = append(all, ref), append(reads, read{})
				i = len(all) - 1
			}
			reads[i] = read{m: m}
			break
		}
		l, etag, lproblem, err := getLatest(ctx, s, job)
		if err != nil {
			return fail(err)
		}
		if etag == latestETag {
			break // it names a commit without a valid manifest: a problem, below
		}
		latest, latestETag, latestProblem = l, etag, lproblem
	}

	st := &JobState{Latest: latest, LatestETag: latestETag}
	var parts []*Manifest
	for i, r := range reads {
		switch {
		case r.m != nil:
			st.Commits = append(st.Commits, Committed{Manifest: r.m, Key: ManifestKey(job, all[i].Checkpoint, all[i].Commit)})
		case r.part != nil:
			parts = append(parts, r.part)
		case r.absent && all[i].Commit != "":
			st.Unfinished = append(st.Unfinished, all[i])
		case r.absent:
			// A version 1 MetaDir without a manifest: nothing was committed there.
		default:
			st.Problems = append(st.Problems, &ManifestProblem{Ref: all[i], Part: r.partProblem, Err: r.problem})
		}
	}
	sortCommits(st.Commits)
	jobs := make([]*Manifest, len(st.Commits))
	for i, c := range st.Commits {
		jobs[i] = c.Manifest
	}
	st.Parts = openParts(jobs, parts)
	switch {
	case latestProblem != nil:
		st.Problems = append(st.Problems, latestProblem)
	case latest != nil:
		if err := ValidName(latest.Checkpoint); err != nil {
			st.Problems = append(st.Problems, fmt.Errorf("%s: checkpoint: %w", LatestKey(job), err))
			break
		}
		i := slices.IndexFunc(st.Commits, func(c Committed) bool {
			return c.Manifest.Checkpoint == latest.Checkpoint && c.Manifest.Commit == latest.Commit
		})
		if i < 0 {
			st.Problems = append(st.Problems, fmt.Errorf("%s names checkpoint %q commit %q, which has no valid manifest",
				LatestKey(job), latest.Checkpoint, latest.Commit))
			break
		}
		st.Commits[i].Latest = true
	}
	return st, nil
}

// latestRereads bounds how often readJob reads LATEST again when it names a commit the reading
// did not find.
const latestRereads = 3

// getLatest reads job's LATEST: nil and no problem when there is none, a problem when it is not
// valid JSON (or too large to be a LATEST), an error when the store fails.
func getLatest(ctx context.Context, s Store, job string) (*Latest, string, error, error) {
	data, etag, err := s.GetBytes(ctx, LatestKey(job))
	switch {
	case errors.Is(err, ErrNotFound):
		return nil, "", nil, nil
	case errors.Is(err, ErrTooLarge):
		return nil, etag, err, nil
	case errors.Is(err, ErrUnreadableObject):
		return nil, "", fmt.Errorf("read %s: %w", LatestKey(job), err), nil
	case err != nil:
		return nil, "", nil, fmt.Errorf("read %s: %w", LatestKey(job), err)
	}
	var l Latest
	if err := json.Unmarshal(data, &l); err != nil {
		return nil, etag, fmt.Errorf("%s is not valid JSON: %w", LatestKey(job), err), nil
	}
	return &l, etag, nil, nil
}

// listCommits lists the commits of checkpoint name with one delimiter listing: version 2 commit
// directories, and the version 1 manifest's directory (commit ""), with or without a manifest.
func listCommits(ctx context.Context, s Store, job, name string) ([]CommitRef, error) {
	dirs, _, err := s.ListDir(ctx, job+"/"+name+"/")
	if err != nil {
		return nil, err
	}
	var refs []CommitRef
	for _, d := range dirs {
		switch {
		case d == MetaDir:
			refs = append(refs, CommitRef{Checkpoint: name})
		case ValidCommitID(d) == nil:
			refs = append(refs, CommitRef{Checkpoint: name, Commit: d})
		}
	}
	return refs, nil
}

// readName returns the committed manifests of checkpoint name of job, newest first: one delimiter
// listing and a read of each commit's manifest (from cache when it holds it). Invalid manifests
// are left out. It returns an error if the store fails or ctx ends.
func readName(ctx context.Context, s Store, job, name string, cache *manifestCache) ([]*Manifest, error) {
	refs, err := listCommits(ctx, s, job, name)
	if err != nil {
		return nil, fmt.Errorf("list commits of %s: %w", name, err)
	}
	var cs []Committed
	for _, ref := range refs {
		m, _, err := readManifest(ctx, s, job, ref, cache)
		if err != nil {
			return nil, err
		}
		if m != nil {
			cs = append(cs, Committed{Manifest: m})
		}
	}
	sortCommits(cs)
	ms := make([]*Manifest, len(cs))
	for i, c := range cs {
		ms[i] = c.Manifest
	}
	return ms, nil
}

// sortCommits sorts cs newest first by Manifest.Order.
func sortCommits(cs []Committed) {
	slices.SortStableFunc(cs, func(a, b Committed) int {
		ao, bo := a.Manifest.Order(), b.Manifest.Order()
		switch {
		case ao.After(bo):
			return -1
		case bo.After(ao):
			return 1
		}
		return strings.Compare(b.Manifest.Checkpoint, a.Manifest.Checkpoint)
	})
}

// readManifest reads and validates the manifest of ref (from cache when it holds it). It returns:
//   - the manifest, nil, nil: valid, and it names job, ref's checkpoint and ref's commit;
//   - nil, a problem, nil: no manifest (the problem wraps ErrNotFound), not valid JSON, invalid,
//     or naming another job, checkpoint or commit than its key; the problem names the key;
//   - nil, nil, an error: the store failed otherwise, or ctx ended.
func readManifest(ctx context.Context, s Store, job string, ref CommitRef, cache *manifestCache) (*Manifest, error, error) {
	return readMeta(ctx, s, ManifestKey(job, ref.Checkpoint, ref.Commit), cache, func(m *Manifest) error {
		if m.Job != job || m.Checkpoint != ref.Checkpoint || m.Commit != ref.Commit || (ref.Commit == "") != (m.Version == 1) || m.Part != nil {
			return fmt.Errorf("manifest names job %q checkpoint %q commit %q; refusing a manifest that does not match its key",
				m.Job, m.Checkpoint, m.Commit)
		}
		if m.Version == ManifestVersion && m.Parts == nil {
			// Every file under the commit's own prefix (I1): one elsewhere is another commit's
			// object, which that commit's retention deletes. (A job manifest's keys are its
			// parts' commits', checked by Validate.)
			prefix := CommitPrefix(m.Job, m.Checkpoint, m.Commit)
			for _, f := range m.Files {
				if !strings.HasPrefix(f.Key, prefix) {
					return fmt.Errorf("file %q: key %q is not under the commit's prefix %s; refusing a manifest that lists another commit's objects", f.Path, f.Key, prefix)
				}
			}
		}
		return nil
	})
}

// ManifestProblem is a commit's manifest (or, with Part, its part manifest) in the store that
// cannot be used: not valid JSON, invalid, of a newer version, naming another job, checkpoint or
// commit than its key. Its text is the problem's, which begins with the key.
type ManifestProblem struct {
	Ref  CommitRef
	Part bool
	Err  error
}

func (p *ManifestProblem) Error() string { return p.Err.Error() }
func (p *ManifestProblem) Unwrap() error { return p.Err }

// readMeta reads the manifest (or part) at key, from cache when it holds it, parses and
// validates it and checks it with match, with readManifest's three outcomes; a problem names key.
func readMeta(ctx context.Context, s Store, key string, cache *manifestCache, match func(*Manifest) error) (*Manifest, error, error) {
	if m := cache.get(key); m != nil {
		return m, nil, nil
	}
	data, _, err := s.GetBytes(ctx, key)
	switch {
	case errors.Is(err, ErrNotFound):
		return nil, fmt.Errorf("%s: %w", key, err), nil
	case errors.Is(err, ErrTooLarge), errors.Is(err, ErrUnreadableObject):
		return nil, err, nil
	case err != nil:
		return nil, nil, fmt.Errorf("read %s: %w", key, err)
	}
	m, err := ParseManifest(data)
	if err == nil {
		err = match(m)
	}
	if err != nil {
		return nil, fmt.Errorf("%s: %w", key, err), nil
	}
	cache.put(key, m)
	return m, nil, nil
}

// ReadManifest reads and validates the manifest of commit (empty: the version 1 manifest) of
// checkpoint name of job. It returns the manifest, or an error naming the key: no manifest
// (wrapping ErrNotFound), not valid JSON, invalid, naming another job, checkpoint or commit
// than its key, or the store failing.
func ReadManifest(ctx context.Context, s Store, job, name, commit string) (*Manifest, error) {
	m, problem, err := readManifest(ctx, s, job, CommitRef{Checkpoint: name, Commit: commit}, nil)
	if err != nil {
		return nil, err
	}
	if problem != nil {
		return nil, problem
	}
	return m, nil
}

// commitDeleted reports whether m's commit has no manifest in s any more: deleted (retention
// deletes the manifest first, then the objects). It returns an error when the store cannot tell
// (the error of reading the manifest, also when one is there but cannot be used).
func commitDeleted(ctx context.Context, s Store, m *Manifest) (bool, error) {
	_, err := ReadManifest(ctx, s, m.Job, m.Checkpoint, m.Commit)
	if errors.Is(err, ErrNotFound) {
		return true, nil
	}
	return false, err
}

// writeManifest writes m's manifest with If-None-Match. If one is there already (a retry after
// an answer that was lost), it is m's commit when it lists the same files with the same keys,
// sizes and checksums: that is success. Anything else there is an error wrapping ErrExists: a
// manifest is never written over (I1).
func writeManifest(ctx context.Context, s Store, m *Manifest) error {
	data, err := json.MarshalIndent(m, "", "  ")
	if err != nil {
		return err
	}
	key := ManifestKey(m.Job, m.Checkpoint, m.Commit)
	_, err = s.PutBytes(ctx, key, data, Cond{IfAbsent: true})
	if !errors.Is(err, ErrExists) {
		return err
	}
	have, problem, rerr := readExisting(ctx, func() (*Manifest, error, error) {
		return readManifest(ctx, s, m.Job, CommitRef{Checkpoint: m.Checkpoint, Commit: m.Commit}, nil)
	})
	if rerr == nil {
		rerr = problem
	}
	if rerr != nil {
		return fmt.Errorf("manifest %s exists but cannot be read: %w", key, rerr)
	}
	if !sameFiles(have, m) {
		return fmt.Errorf("manifest %s exists with other files; not writing over it: %w", key, ErrExists)
	}
	return nil
}

// existsReads is how often readExisting reads an object a conditional write was told exists.
const existsReads = 6

// readExisting reads, with read (readMeta's three outcomes), an object that a write with
// If-None-Match was just told exists: a retry whose answer was lost wrote it, or another writer
// did first. While it reads as not found it reads again, briefly (20, 40, … ms): a server may
// answer 412 while the other write is still being put in place (versitygw does), and only a
// real S3 is read-after-write consistent at that instant.
func readExisting(ctx context.Context, read func() (*Manifest, error, error)) (*Manifest, error, error) {
	for attempt := 1; ; attempt++ {
		m, problem, err := read()
		if err != nil || !errors.Is(problem, ErrNotFound) || attempt == existsReads {
			return m, problem, err
		}
		t := time.NewTimer(time.Duration(attempt) * 20 * time.Millisecond)
		select {
		case <-t.C:
		case <-ctx.Done():
			t.Stop()
			return nil, nil, ctx.Err()
		}
	}
}

// sameFiles reports whether a and b list the same files (paths, keys, sizes, checksums).
func sameFiles(a, b *Manifest) bool {
	return slices.EqualFunc(a.Files, b.Files, func(x, y File) bool {
		return x.Path == y.Path && a.FileKey(x) == b.FileKey(y) && x.Size == y.Size && x.Checksum == y.Checksum
	})
}

// latestAttempts bounds how often advanceLatest re-reads LATEST after losing a race.
const latestAttempts = 20

// advanceLatest points LATEST at m's commit, which must be committed, unless LATEST already names
// a commit that is not older by Manifest.Order (I3). It reads LATEST with its ETag and writes with
// If-Match (If-None-Match when there is none), so two writers cannot move it back; after losing a
// race it reads again. A LATEST that cannot be used (not JSON, naming no valid manifest) is
// replaced. It returns whether it moved LATEST, and an error naming LATEST if the store failed or
// the race was lost latestAttempts times in a row.
func advanceLatest(ctx context.Context, s Store, m *Manifest, host Host, cache *manifestCache) (bool, error) {
	moved, _, err := advanceLatestOrder(ctx, s, m, host, cache)
	return moved, err
}

// advanceLatestOrder is advanceLatest that also returns, when LATEST was not moved because it
// names a commit that is not older, that commit's order (nil otherwise).
func advanceLatestOrder(ctx context.Context, s Store, m *Manifest, host Host, cache *manifestCache) (bool, *CommitOrder, error) {
	key := LatestKey(m.Job)
	for range latestAttempts {
		data, etag, err := s.GetBytes(ctx, key)
		cond := Cond{IfMatch: etag}
		switch {
		case errors.Is(err, ErrNotFound):
			cond = Cond{IfAbsent: true}
		case errors.Is(err, ErrTooLarge):
			// Not a LATEST spotguard writes: replaced, as one that is not JSON is.
		case err != nil:
			return false, nil, fmt.Errorf("read %s: %w", key, err)
		default:
			if cur, ok := latestOrder(ctx, s, m.Job, data, cache); ok && !m.Order().After(cur) {
				return false, &cur, nil
			}
		}
		complete := m.Order().At
		l := Latest{Version: ManifestVersion, Checkpoint: m.Checkpoint, Commit: m.Commit, CompleteAt: &complete,
			CommittedAt: m.CommittedAt, Host: host}
		b, err := json.Marshal(l)
		if err != nil {
			return false, nil, err
		}
		_, err = s.PutBytes(ctx, key, b, cond)
		switch {
		case err == nil:
			return true, nil, nil
		case errors.Is(err, ErrPrecondition) || errors.Is(err, ErrExists):
			continue // someone else moved it: look again
		default:
			return false, nil, fmt.Errorf("write %s: %w", key, err)
		}
	}
	return false, nil, fmt.Errorf("write %s: it changed under every one of %d attempts", key, latestAttempts)
}

// latestOrder returns the order of the commit that LATEST (data) names, from that commit's
// manifest (read once, then cached), and false when LATEST cannot be used: not JSON, no valid
// name, or no readable manifest of the commit it names. LATEST's own complete_at is not taken on
// trust: one written by hand, or by a faulty writer, must not hold LATEST back. Only when the
// store fails is it taken, so that a transient error does not move LATEST back.
func latestOrder(ctx context.Context, s Store, job string, data []byte, cache *manifestCache) (CommitOrder, bool) {
	var l Latest
	if json.Unmarshal(data, &l) != nil || ValidName(l.Checkpoint) != nil {
		return CommitOrder{}, false
	}
	m, problem, err := readManifest(ctx, s, job, CommitRef{Checkpoint: l.Checkpoint, Commit: l.Commit}, cache)
	switch {
	case err == nil && problem == nil:
		return m.Order(), true
	case err != nil && !errors.Is(err, ErrNotFound) && l.CompleteAt != nil && ValidCommitID(l.Commit) == nil:
		return CommitOrder{At: *l.CompleteAt, Commit: l.Commit}, true
	}
	return CommitOrder{}, false
}

// retained returns the commits of st to keep with keep > 0 (by manifest key), or nil when it
// cannot tell (keep everything): the keep newest by Manifest.Order, always the newest, and LATEST's
// target and every commit at or after it in that order (I3). LATEST's place in the order comes
// from LATEST itself (a version 2 LATEST carries it) or its target's manifest; a LATEST that
// names a commit this reading does not show (it was read in the middle of a commit) and does
// not carry its order keeps everything this time.
func retained(st *JobState, keep int) map[string]bool {
	var floor *CommitOrder
	switch l := st.Latest; {
	case l != nil && l.CompleteAt != nil && ValidCommitID(l.Commit) == nil:
		floor = &CommitOrder{At: *l.CompleteAt, Commit: l.Commit}
	case st.LatestTarget() != nil:
		o := st.LatestTarget().Manifest.Order()
		floor = &o
	case l != nil:
		return nil
	}
	kept := map[string]bool{}
	for i, c := range st.Commits {
		if i < max(keep, 1) || (floor != nil && !floor.After(c.Manifest.Order())) || c.Latest {
			kept[c.Key] = true
		}
	}
	return kept
}

// applyRetention deletes every commit of the job that retained does not keep. It reads the job
// first (readJob). A commit is deleted manifest first (a job manifest after its parts' part
// manifests, which no agent may take again), so it stops existing before its data goes;
// then its data: for a version 2 commit everything under its prefix (only its commit wrote
// there), for a version 1 commit the keys its manifest lists. It returns the commits deleted, and
// an error if the job could not be read; a commit that could not be deleted in full is logged and
// left for the next time.
//
// With partWait > 0 (a multi-node job), it then deletes the parts that never made a save
// (collectParts).
//
// It also returns the deletes that failed: a store that refuses them (an IAM policy without
// delete) must be seen, and data left behind after its manifest went is no commit's any more,
// so only this run can clear it (the caller clears those prefixes again, goLateCleanup).
//
// A commit in hold (by commit id) is kept this time: a manifest write of it whose answer was lost
// may still land, and would then list deleted objects.
//
// The prefixes of the commits it deleted that were committed within lateExpiry are in Watch: a
// write of such a commit's manifest by another agent, whose answer that agent lost, may still
// land there over deleted objects (the caller looks again later, lateCleanup.Deleted).
func applyRetention(ctx context.Context, s Store, job string, keep int, partWait time.Duration, cache *manifestCache, hold map[string]bool, log zerolog.Logger) (retention, error) {
	st, err := readJob(ctx, s, job, cache)
	if err != nil {
		return retention{}, err
	}
	var r retention
	if partWait > 0 {
		r.Deleted = collectParts(ctx, s, st, partWait, log)
	}
	if keep <= 0 {
		return r, nil
	}
	for _, p := range st.Problems {
		log.Warn().Err(p).Msg("retention: left alone")
	}
	kept := retained(st, keep)
	if kept == nil {
		log.Info().Msg("retention: LATEST names a commit not seen yet; nothing deleted this time")
		return r, nil
	}
	if st.Latest != nil {
		log.Debug().Str("latest", st.Latest.Checkpoint+"/"+st.Latest.Commit).Int("commits", len(st.Commits)).Int("kept", len(kept)).Msg("retention")
	}
	for _, c := range st.Commits {
		if kept[c.Key] {
			continue
		}
		if hold[c.Manifest.Commit] {
			log.Debug().Str("checkpoint", c.Manifest.Checkpoint).Str("commit", c.Manifest.Commit).
				Msg("retention: kept while a write of its manifest may still land")
			continue
		}
		if young := youngPart(c.Manifest, partWait, time.Now()); young != nil {
			log.Debug().Str("checkpoint", c.Manifest.Checkpoint).Str("commit", c.Manifest.Commit).Int("node_rank", young.NodeRank).
				Msg("retention: a job checkpoint's part is younger than part_wait; kept until it is not")
			continue
		}
		m := c.Manifest
		clog := log.With().Str("checkpoint", m.Checkpoint).Str("commit", m.Commit).Logger()
		if len(m.Parts) > 0 {
			// A job manifest: its parts first, so that no agent can assemble them into the
			// same save again once the job manifest is gone (it would list deleted data).
			if err := s.Delete(ctx, partKeys(m)...); err != nil {
				clog.Warn().Err(err).Msg("retention: cannot delete the parts of a job checkpoint")
				r.Failed = append(r.Failed, retentionFailure{Checkpoint: m.Checkpoint, Err: err})
				continue
			}
		}
		if err := s.Delete(ctx, c.Key); err != nil {
			clog.Warn().Err(err).Msg("retention: cannot delete manifest")
			r.Failed = append(r.Failed, retentionFailure{Checkpoint: m.Checkpoint, Err: err})
			continue
		}
		cache.drop(c.Key)
		if err := deleteCommitData(ctx, s, m); err != nil {
			clog.Warn().Err(err).Msg("retention: manifest deleted but data left behind; deleting it again later")
			r.Failed = append(r.Failed, retentionFailure{Checkpoint: m.Checkpoint, Err: err, Left: commitDataRefs(m)})
			continue
		}
		if revived, err := clearRevived(ctx, s, m); err != nil {
			clog.Warn().Err(err).Msg("retention: cannot look again at a deleted commit's prefix; clearing it again later")
			r.Failed = append(r.Failed, retentionFailure{Checkpoint: m.Checkpoint, Err: err, Left: commitDataRefs(m)})
			continue
		} else if revived {
			clog.Error().Msg("retention: another agent wrote this commit's manifest again (a retry whose first answer it lost) while the commit was deleted; that manifest listed deleted objects and is deleted too")
		}
		r.Deleted = append(r.Deleted, CommitRef{Checkpoint: m.Checkpoint, Commit: m.Commit})
		if m.Parts == nil && m.Part == nil {
			r.Retired = append(r.Retired, m)
		}
		if time.Since(m.CommittedAt) < lateExpiry {
			r.Watch = append(r.Watch, commitDataRefs(m)...)
		}
		clog.Info().Int("keep", keep).Msg("retention: old checkpoint deleted")
	}
	return r, nil
}

// retention is what applyRetention did.
type retention struct {
	// Deleted are the commits deleted (and the parts collected).
	Deleted []CommitRef
	// Retired are the manifests of the single-node commits deleted.
	Retired []*Manifest
	// Failed are the deletes that failed.
	Failed []retentionFailure
	// Watch are the prefixes of commits deleted that a manifest write held by the network may
	// still revive.
	Watch []CommitRef
}

// retentionFailure is a delete of retention's that failed.
type retentionFailure struct {
	Checkpoint string
	Err        error
	// Left are the commits whose data is left behind after their manifest went.
	Left []CommitRef
}

// commitDataRefs are the commits whose prefixes deleteCommitData clears for m (its parts' for a
// job checkpoint; none for a version 1 manifest, whose keys are listed).
func commitDataRefs(m *Manifest) []CommitRef {
	if len(m.Parts) > 0 {
		out := make([]CommitRef, 0, len(m.Parts))
		for _, p := range m.Parts {
			out = append(out, CommitRef{Checkpoint: m.Checkpoint, Commit: p.Commit})
		}
		return out
	}
	if m.Version == 1 {
		return nil
	}
	return []CommitRef{{Checkpoint: m.Checkpoint, Commit: m.Commit}}
}

// commitDataPrefixes are the prefixes deleteCommitData clears for m (commitDataRefs).
func commitDataPrefixes(m *Manifest) []string {
	var out []string
	for _, r := range commitDataRefs(m) {
		out = append(out, CommitPrefix(m.Job, r.Checkpoint, r.Commit))
	}
	return out
}

// clearRevived lists the prefixes of m's commit once more after its manifest and data went, and
// deletes what is there, manifests first; it reports whether a manifest was. Another agent that
// lost the answer to a write of this manifest writes it again (If-None-Match) when the commit's
// objects are all there: between retention's delete of the manifest and of the data, that write
// succeeds, and S3 cannot make the two deletes one step. The writer lists the objects after its
// write and deletes its manifest when they are gone (Uploader.commit); this catches the write
// that landed before that look. A version 1 commit (listed keys) has nothing to look at: no agent
// writes one now.
func clearRevived(ctx context.Context, s Store, m *Manifest) (bool, error) {
	prefixes := commitDataPrefixes(m)
	if len(prefixes) == 0 {
		return false, nil
	}
	if own := CommitPrefix(m.Job, m.Checkpoint, m.Commit); !slices.Contains(prefixes, own) {
		prefixes = append(prefixes, own)
	}
	revived := false
	for _, p := range prefixes {
		objs, err := s.List(ctx, p)
		if err != nil {
			return revived, err
		}
		var meta, data []string
		for _, o := range objs {
			if strings.HasPrefix(o.Key, p+MetaDir+"/") {
				meta = append(meta, o.Key)
				revived = revived || path.Base(o.Key) == "manifest.json"
			} else {
				data = append(data, o.Key)
			}
		}
		for _, keys := range [][]string{meta, data} {
			if len(keys) == 0 {
				continue
			}
			if err := s.Delete(ctx, keys...); err != nil {
				return revived, err
			}
		}
	}
	return revived, nil
}

// deleteCommitData deletes the data of m's commit (its manifest must be gone already); for a job
// manifest, every part's commit (its part manifests must be gone already too).
func deleteCommitData(ctx context.Context, s Store, m *Manifest) error {
	if len(m.Parts) > 0 {
		var errs []error
		for _, p := range m.Parts {
			errs = append(errs, deletePrefix(ctx, s, CommitPrefix(m.Job, m.Checkpoint, p.Commit)))
		}
		return errors.Join(errs...)
	}
	if m.Version == 1 {
		keys := make([]string, 0, len(m.Files))
		for _, f := range m.Files {
			keys = append(keys, m.FileKey(f))
		}
		return s.Delete(ctx, keys...)
	}
	return deletePrefix(ctx, s, CommitPrefix(m.Job, m.Checkpoint, m.Commit))
}

// youngPart returns a part of job manifest m committed less than partWait (DefaultPartWait when
// zero) plus partMargin before now, or nil: while one is, an agent may still be assembling the
// same save (completeSave takes parts up to partWait old), and deleting the job manifest could
// let it write the job manifest again over deleted data.
func youngPart(m *Manifest, partWait time.Duration, now time.Time) *JobPart {
	if partWait <= 0 {
		partWait = DefaultPartWait
	}
	for i, p := range m.Parts {
		if now.Sub(p.CommittedAt) <= partWait+partMargin {
			return &m.Parts[i]
		}
	}
	return nil
}

// partKeys are the keys of the part manifests of job manifest m.
func partKeys(m *Manifest) []string {
	keys := make([]string, 0, len(m.Parts))
	for _, p := range m.Parts {
		keys = append(keys, PartKey(m.Job, m.Checkpoint, p.Commit))
	}
	return keys
}

// deletePrefix aborts the incomplete uploads under prefix (a commit of this agent's) and deletes
// every object under it.
func deletePrefix(ctx context.Context, s Store, prefix string) error {
	_, aerr := s.AbortIncomplete(ctx, prefix)
	_, err := deleteObjects(ctx, s, prefix)
	return errors.Join(aerr, err)
}

// deleteObjects deletes every object under prefix and returns how many there were.
func deleteObjects(ctx context.Context, s Store, prefix string) (int, error) {
	objs, err := s.List(ctx, prefix)
	if err != nil || len(objs) == 0 {
		return 0, err
	}
	keys := make([]string, 0, len(objs))
	for _, o := range objs {
		keys = append(keys, o.Key)
	}
	return len(keys), s.Delete(ctx, keys...)
}

// The uploader's side of a commit: what it checks on disk, then the protocol above.

// commitResult is what a commit (Uploader.commit) found or did: at most one of changed/gone,
// notComplete, noMatch, err, or success (manifest; adopted when it was a commit already there).
type commitResult struct {
	gen         *generation
	manifest    *Manifest
	adopted     bool
	noMatch     bool
	notComplete error
	changed     []LocalFile
	gone        []string
	// rewritten, with changed, names a file written again since it was stored while the marker
	// stayed as it was (rewrittenAfterMarker): the checkpoint is not complete.
	rewritten   string
	attempted   bool
	err         error
	latestMoved bool
	// latestErr is why LATEST could not be moved to the commit just made (its manifest is
	// written: it is committed); handleCommit has it retried (latestFailed).
	latestErr error
	// latestNewer is the order of the commit LATEST names when it was not moved, being newer:
	// read from the store, it is a commit the agent knows of from now on (Uploader.learn), as
	// it knows those it reads at start (another instance's, whose clock may be ahead).
	latestNewer *CommitOrder
	// deleted are commits found deleted or deleted by retention: no longer candidates.
	deleted []CommitRef
	// retired are the manifests retention deleted (retention.Retired).
	retired []*Manifest
	// retiredMatch is the deleted commit whose bytes an adopted checkpoint holds (with
	// completeAt its place), when it is a single-node one.
	retiredMatch *Manifest
	// retentionFailed are retention's deletes that failed (handleCommit reports them).
	retentionFailed []retentionFailure
	// watch are the prefixes of commits retention deleted that a held write may revive
	// (handleCommit watches them).
	watch []CommitRef
	// late, once the manifest is written, is the commit's late clean-up (handleCommit starts it).
	late *lateCleanup
	// completeAt, with noMatch, is when a deleted commit with exactly these files completed: the
	// new commit of them takes it as its own.
	completeAt *time.Time
	// deletedAfter, with noMatch, is a file of commit deletedFrom that the checkpoint on disk,
	// complete when that commit was, no longer has: that save, a file of it deleted after its
	// marker (deletedSince).
	deletedAfter, deletedFrom string
}

// startLate begins l, a commit's late clean-up (goLateCleanup), and writes it in the journal,
// where it stays until it is over: a write held by the network can land after this agent
// stopped, and the next one resumes it (Uploader.start). On the Run loop only.
func (u *Uploader) startLate(ctx context.Context, l lateCleanup) {
	if l.At.IsZero() {
		l.At = time.Now()
	}
	u.journal.add(l.line())
	if u.journal == nil && u.cfg.StateDir != "" {
		u.earlyLates = append(u.earlyLates, l) // start: written once the journal is open
	}
	u.goLateCleanup(ctx, l)
}

// goLateCleanup clears l's commit prefix at each of lateAborts after l.At, on a goroutine: nothing
// of this agent's may still write there, so whatever is there and not the commit's is a leftover.
// It aborts the incomplete uploads under it and deletes l.Strays (keys of files that left a
// committed checkpoint, whose writes may land after the commit), or, for an abandoned commit
// (l.Abandoned), every object under it. For a commit this agent's retention deleted
// (l.Deleted), it only deletes a manifest written there again over deleted objects
// (dropRevived), and skips the first pass: retention looked as it deleted (clearRevived). Of passes already due (a clean-up an earlier run began),
// only the last is run. While the last pass fails (a store that is down), it is tried again every
// lateRetry until lateExpiry after l.At. The first failure is a warning, the next ones debug
// lines (a policy without s3:ListBucketMultipartUploads would otherwise warn at every commit).
// Then journalLateDone is written; until then a restart resumes it.
func (u *Uploader) goLateCleanup(ctx context.Context, l lateCleanup) {
	prefix := CommitPrefix(u.cfg.Job, l.Checkpoint, l.Commit)
	log := u.log.With().Str("prefix", prefix).Logger()
	wait := func(at time.Time) bool {
		if ctx.Err() != nil {
			// Stopped: no pass begins now, even one already due (select would pick between a
			// timer that fired and the stop at random, and each pass may take s3AbortTimeout).
			return false
		}
		t := time.NewTimer(time.Until(at))
		defer t.Stop()
		select {
		case <-t.C:
			return true
		case <-ctx.Done():
			return false
		}
	}
	pass := func() error {
		// A pass begun is finished (within s3AbortTimeout) even when a stop comes, but for no
		// longer than the stop's grace (stopGrace; the next agent does it again, from its
		// journal): a request cut half way is one more failure for the store to see.
		base := u.cleanup
		if base == nil {
			base = context.WithoutCancel(ctx)
		}
		actx, cancel := context.WithTimeout(base, s3AbortTimeout)
		defer cancel()
		var n, objs int
		var err, derr error
		if !l.Deleted {
			// A commit another agent wrote may be resumed by it: its uploads are its own.
			n, err = u.cfg.Store.AbortIncomplete(actx, prefix)
		}
		switch {
		case l.Deleted:
			derr = u.dropRevived(actx, l.CommitRef)
		case l.Abandoned:
			objs, derr = deleteObjects(actx, u.cfg.Store, prefix)
		case len(l.Strays) > 0:
			derr = u.cfg.Store.Delete(actx, l.Strays...)
		}
		if l.Sealed && !l.Abandoned {
			derr = errors.Join(derr, u.dropTorn(actx, l.CommitRef))
		}
		if l.Listed && !l.Abandoned && !l.Deleted {
			derr = errors.Join(derr, u.dropUnlisted(actx, l.CommitRef))
		}
		err = errors.Join(err, derr)
		switch {
		case err != nil && ctx.Err() != nil:
		case err != nil && u.lateAbortWarned.CompareAndSwap(false, true):
			log.Warn().Err(err).Msg("cannot clear the commit's prefix of leftovers (said once; later failures are debug lines)")
		case err != nil:
			log.Debug().Err(err).Msg("cannot clear the commit's prefix of leftovers")
		}
		if n > 0 {
			log.Info().Int("aborted", n).Msg("aborted incomplete uploads left under the commit (a killed run's, or one whose abort failed)")
		}
		if objs > 0 {
			log.Info().Int("deleted", objs).Msg("deleted objects that landed in an abandoned commit after it was deleted")
		}
		return err
	}
	started := time.Now()
	u.wg.Go(func() {
		passes, retry, expiry := lateAborts, lateRetry, lateExpiry
		var err error
		for i, at := range passes {
			if i+1 < len(passes) && !time.Now().Before(l.At.Add(passes[i+1])) {
				continue // the next pass is due as well: one pass for both
			}
			if l.Deleted && at == 0 {
				continue // retention looked as it deleted the commit (clearRevived)
			}
			// A pass due when the clean-up started was begun then: a stop that comes before this
			// goroutine runs does not skip it.
			if l.At.Add(at).After(started) && !wait(l.At.Add(at)) {
				return
			}
			err = pass()
		}
		for err != nil && time.Now().Add(retry).Before(l.At.Add(expiry)) {
			if !wait(time.Now().Add(retry)) {
				return
			}
			err = pass()
		}
		if ctx.Err() != nil {
			return // a pass cut short by the stop: the next agent runs it
		}
		select {
		case u.wake <- func() {
			u.journal.add(journalLine{Op: journalLateDone, Checkpoint: l.Checkpoint, Commit: l.Commit, Abandoned: l.Abandoned, Deleted: l.Deleted})
		}:
		case <-ctx.Done():
		}
	})
}

// dropTorn deletes the manifest (part manifest, in a multi-node job) of this agent's commit ref
// if it names objects the store does not hold. A write of it whose answer was lost can land
// after another agent's retention deleted the commit, manifest first: the write succeeds then
// (If-None-Match), over deleted objects. The look commit takes after its write, and retention's
// look after its delete (clearRevived), both come before such a write lands.
func (u *Uploader) dropTorn(ctx context.Context, ref CommitRef) error {
	key := ManifestKey(u.cfg.Job, ref.Checkpoint, ref.Commit)
	if u.cfg.WorldNodes > 1 {
		key = PartKey(u.cfg.Job, ref.Checkpoint, ref.Commit)
	}
	return u.dropTornKey(ctx, ref, key, "a manifest write of this commit whose answer was lost landed after its objects were deleted (by another agent's retention); deleting that manifest")
}

// dropRevived deletes the manifest, part manifest or job manifest of commit ref, which this
// agent's retention deleted, if one is there again and names objects the store does not hold:
// another agent's write of it whose answer was lost, held by the network, landed after the
// delete (dropTorn is that agent's own look, which it cannot take once it is gone: a reclaim
// often comes with the lost answers). Nothing else under the prefix is touched: that agent may
// be resuming the commit, and a manifest whose objects are all there is its commit made again.
func (u *Uploader) dropRevived(ctx context.Context, ref CommitRef) error {
	meta := CommitPrefix(u.cfg.Job, ref.Checkpoint, ref.Commit) + MetaDir + "/"
	objs, err := u.cfg.Store.List(ctx, meta)
	if err != nil {
		return fmt.Errorf("list %s: %w", meta, err)
	}
	var errs []error
	for _, o := range objs {
		if b := path.Base(o.Key); b == "manifest.json" || b == "part.json" {
			errs = append(errs, u.dropTornKey(ctx, ref, o.Key, "a manifest of a commit this agent's retention deleted was written again since, over deleted objects (another agent's write whose answer was lost, held by the network); deleting it"))
		}
	}
	return errors.Join(errs...)
}

// dropUnlisted deletes every object under the prefix of commit ref, this agent's and committed,
// that its manifest (its part manifest, in a multi-node job) does not list: a write of a file that
// left the checkpoint before the commit, sent by an earlier run of this agent (whose list of such
// keys died with it) and held by the network, that landed after the commit. The manifest is read
// once (a manifest never changes; the cache keeps it for the next passes). Without a manifest of
// this commit's there (deleted since, by this agent's retention, which drops it from the cache),
// nothing is touched; another agent's retention deleting the commit meanwhile leaves only the
// commit's own objects for this pass to keep, and it deletes nothing else.
func (u *Uploader) dropUnlisted(ctx context.Context, ref CommitRef) error {
	key := ManifestKey(u.cfg.Job, ref.Checkpoint, ref.Commit)
	if u.cfg.WorldNodes > 1 {
		key = PartKey(u.cfg.Job, ref.Checkpoint, ref.Commit)
	}
	m := u.cache.get(key)
	if m == nil {
		data, _, err := u.cfg.Store.GetBytes(ctx, key)
		if errors.Is(err, ErrNotFound) || errors.Is(err, ErrTooLarge) {
			return nil // none, or not a manifest: not this agent's to judge
		}
		if err != nil {
			return fmt.Errorf("read %s: %w", key, err)
		}
		if m, err = ParseManifest(data); err != nil {
			return nil // not a manifest: not this agent's to judge
		}
	}
	if m.Job != u.cfg.Job || m.Checkpoint != ref.Checkpoint || m.Commit != ref.Commit {
		return nil // not a manifest of this commit's: not this agent's to judge
	}
	u.cache.put(key, m)
	prefix := CommitPrefix(u.cfg.Job, ref.Checkpoint, ref.Commit)
	objs, err := u.cfg.Store.List(ctx, prefix)
	if err != nil {
		return fmt.Errorf("list %s: %w", prefix, err)
	}
	keep := commitKeeps(m)
	var strays []string
	for _, o := range objs {
		if !keep[o.Key] {
			strays = append(strays, o.Key)
		}
	}
	if len(strays) == 0 {
		return nil
	}
	u.log.Info().Str("checkpoint", ref.Checkpoint).Str("commit", ref.Commit).Strs("keys", strays[:min(len(strays), 10)]).Int("objects", len(strays)).
		Msg("deleting objects under the commit that its manifest does not list (writes of files that left the checkpoint, landed after the commit)")
	return u.cfg.Store.Delete(ctx, strays...)
}

// commitKeeps is the set of keys under m's commit prefix that are the commit's: its files, and
// its manifest or part manifest (a job manifest lives under the commit of its save's part of
// rank 0).
func commitKeeps(m *Manifest) map[string]bool {
	keep := make(map[string]bool, len(m.Files)+2)
	for _, f := range m.Files {
		keep[m.FileKey(f)] = true
	}
	keep[ManifestKey(m.Job, m.Checkpoint, m.Commit)] = true
	keep[PartKey(m.Job, m.Checkpoint, m.Commit)] = true
	return keep
}

// dropTornKey deletes the manifest at key, of commit ref, if it names objects the store does not
// hold, with the error line msg.
func (u *Uploader) dropTornKey(ctx context.Context, ref CommitRef, key, msg string) error {
	data, _, err := u.cfg.Store.GetBytes(ctx, key)
	if errors.Is(err, ErrNotFound) {
		return nil // deleted, by retention: nothing landed (yet)
	}
	if errors.Is(err, ErrTooLarge) {
		return nil // not a manifest: not this agent's to judge
	}
	if err != nil {
		return fmt.Errorf("read %s: %w", key, err)
	}
	m, err := ParseManifest(data)
	if err != nil || m.Job != u.cfg.Job || m.Checkpoint != ref.Checkpoint || m.Commit != ref.Commit {
		return nil // not a manifest of this commit's: not this agent's to judge
	}
	missing, err := u.missingObjects(ctx, m)
	if err != nil || missing == "" {
		return err
	}
	u.log.Error().Str("checkpoint", ref.Checkpoint).Str("commit", ref.Commit).Str("key", key).Str("missing", missing).Msg(msg)
	u.cache.drop(key)
	return u.cfg.Store.Delete(ctx, key)
}

// msgCommittedAgainInPlace says that a checkpoint holds the bytes of a commit deleted since, and
// is committed again with that commit's place in the order.
const msgCommittedAgainInPlace = "checkpoint's commit was deleted (retention) since it was restored or committed; committing it again, in its place in the order"

// commitJob is what a commit needs, copied from the Run loop's state.
type commitJob struct {
	// retain: applyRetention runs after the commit (startCommit decides).
	retain bool
	// retired are the manifests of the name that this agent's retention deleted lately
	// (Uploader.retired).
	retired       []*Manifest
	name, commit  string
	single, adopt bool
	resumed       bool
	// sealed: a manifest PUT was tried before; its answer was lost, and the commit may exist
	// (and may have been deleted since, by retention).
	sealed bool
	// completeAt, if not nil, is the version's completion time (see commitResult.completeAt).
	completeAt *time.Time
	// unseenBefore and unseenAfter: see Uploader.unseen and completedAt.
	unseenBefore, unseenAfter time.Time
	// known: see Uploader.known and afterKnown.
	known []knownOrder
	// unread: the store's commits of the name were not read before its files were sent
	// (generation.unread); the commit reads them and adopts one with exactly these files.
	unread bool
	// marker is the version of the marker the checkpoint is complete with (generation.marker).
	marker FileID

	files map[string]doneFile
	// refused are versions of files that cannot be uploaded (generation.refused).
	refused map[string]refusal
	// vanished are files that left the checkpoint after its marker (generation.vanished): one
	// back as it was is not new since the marker.
	vanished map[string]FileID
	// prior is the commit the generation before was (generation.prior), or nil.
	prior *Manifest
	// uncertain are this run's commits with a manifest write whose answer was lost lately
	// (Uploader.uncertain): retention keeps them.
	uncertain       map[string]bool
	candidates      []*Manifest
	strays          []string
	timings         Timings
	trigger, notice string
}

// commit verifies the checkpoint on disk against what was stored or checksummed (c.files), then
// adopts a candidate commit with exactly these files, or writes the manifest, moves LATEST and
// cleans up: strays, incomplete uploads under the commit, retention.
func (u *Uploader) commit(ctx context.Context, c commitJob) commitResult {
	lc, err := ScanCheckpoint(u.cfg.Dir, c.name, u.cfg.Marker, u.cfg.Pattern, u.log)
	if err != nil {
		return commitResult{notComplete: err}
	}
	for _, lf := range lc.Files {
		if why, ok := c.refused[lf.Path]; ok && why.id.Same(lf.ID) {
			// Still the version that could not be stored: committing the checkpoint without
			// it would present a torn checkpoint as complete.
			return commitResult{notComplete: fmt.Errorf("checkpoint %s: %w: %s: %w; %s", c.name, ErrNotStorable, lf.Path, why.err, notStorableFixFor(why.err))}
		}
	}
	var r commitResult
	local := make(map[string]LocalFile, len(lc.Files))
	for _, lf := range lc.Files {
		local[lf.Path] = lf
		d, ok := c.files[lf.Path]
		if !ok || !d.id.Same(lf.ID) {
			r.changed = append(r.changed, lf)
			// Written again since it was read, or new since the marker came (the watcher reported
			// every file there was then): a save into the directory after the marker.
			if r.rewritten == "" && lf.Path != u.cfg.Marker && (!ok && !sameVersion(c.vanished[lf.Path], lf.ID) || ok && rewriteOf(d.id, lf.ID)) {
				r.rewritten = lf.Path
			}
			continue
		}
		if racy(d.id, d.readAt) {
			rel := c.name
			if !c.single {
				rel = filepath.Join(c.name, filepath.FromSlash(lf.Path))
			}
			again, err := hashFile(ctx, u.cfg.Dir, rel)
			if err != nil || !again.id.Same(lf.ID) || again.checksum != d.checksum {
				r.changed = append(r.changed, lf)
			}
		}
	}
	for p := range c.files {
		if _, ok := local[p]; !ok {
			r.gone = append(r.gone, p)
		}
	}
	if r.rewritten != "" && (c.single || c.marker.isZero() || !local[u.cfg.Marker].ID.Same(c.marker)) {
		r.rewritten = "" // the marker was written again too: its Complete comes
	}
	if len(r.changed) > 0 || len(r.gone) > 0 {
		return r
	}
	if c.unread && !c.adopt && !c.sealed {
		// Sent without knowing what the store holds of the name (a store that did not answer
		// the lookup, a notice that did not wait): a checkpoint restored from the store must be
		// found committed, not become a new commit that completed now, newer than everything.
		ms, err := readName(ctx, u.cfg.Store, u.cfg.Job, c.name, u.cache)
		switch {
		case err != nil:
			u.log.Warn().Err(err).Str("checkpoint", c.name).
				Msg("cannot read the store's commits of this checkpoint before committing it; committing it as a new commit")
		default:
			for _, m := range ms {
				if u.matchesDone(m, c.files) {
					return commitResult{manifest: m, adopted: true}
				}
			}
			if len(ms) > 0 {
				u.logNewCommitOfName(c.name, "its files differ from every commit of this checkpoint in the store")
			}
		}
	}
	if p := c.prior; p != nil && !c.adopt && c.completeAt == nil && u.matchesDone(p, c.files) {
		// The bytes of the commit this checkpoint was (a chmod -R since changed every file's
		// ctime), which the store could not show (or a try of this commit was cut short) or no
		// longer holds: committed again, they keep its place in the order rather than
		// becoming the newest.
		at := u.placeOf(p)
		c.completeAt = &at
	}
	for _, p := range c.retired {
		if c.adopt || c.completeAt != nil {
			break
		}
		if u.matchesDone(p, c.files) {
			// The same for a commit of the name retention deleted while this copy of it came
			// (a restore into checkpoint.dir, its lookup after the delete: found from outside,
			// committed as the newest; LATEST moved back, and retention deleted newer commits).
			at := u.placeOf(p)
			c.completeAt = &at
			u.log.Warn().Str("checkpoint", c.name).Str("deleted_commit", p.Commit).
				Msg(msgCommittedAgainInPlace)
		}
	}
	if c.adopt {
		for _, m := range c.candidates {
			if !u.matchesDone(m, c.files) {
				continue
			}
			// Still there? Retention (ours or another agent's) may have deleted it.
			key := ManifestKey(m.Job, m.Checkpoint, m.Commit)
			if m.Part != nil {
				key = PartKey(m.Job, m.Checkpoint, m.Commit)
			}
			_, _, err := u.cfg.Store.GetBytes(ctx, key)
			switch {
			case err == nil:
				return commitResult{manifest: m, adopted: true}
			case errors.Is(err, ErrNotFound):
				// These bytes were committed as m, completed then: committed again, they keep
				// that place in the order (a restored checkpoint's files are new to the file
				// system, but not a newer version).
				r.deleted = append(r.deleted, CommitRef{Checkpoint: m.Checkpoint, Commit: m.Commit})
				at := u.placeOf(m)
				r.completeAt = &at
				if m.Part == nil && m.Parts == nil {
					r.retiredMatch = m
				}
			default:
				r.err = fmt.Errorf("read manifest of the matching commit: %w", err)
				return r
			}
		}
		r.noMatch = true
		if r.completeAt == nil {
			if m, gone := deletedSince(lc, completedAt(lc, c.unseenBefore, c.unseenAfter), c.candidates, local); m != nil {
				r.deletedAfter, r.deletedFrom = gone, m.Commit
			}
		}
		return r
	}

	now := time.Now()
	m := &Manifest{Version: ManifestVersion, Job: u.cfg.Job, Checkpoint: c.name, Commit: c.commit, Host: u.cfg.Host(),
		Trigger: c.trigger, Notice: c.notice, Timings: c.timings, CommittedAt: now}
	for _, lf := range lc.Files {
		d := c.files[lf.Path]
		m.Files = append(m.Files, File{Path: lf.Path, Key: d.key, Size: d.id.Size, Mode: FormatPerm(lf.ID.Perm), Checksum: d.checksum})
		m.TotalBytes += d.id.Size
	}
	slices.SortFunc(m.Files, func(a, b File) int {
		switch {
		case a.Path < b.Path:
			return -1
		case a.Path > b.Path:
			return 1
		}
		return 0
	})
	complete := completedAt(lc, c.unseenBefore, c.unseenAfter)
	if ff := m.Timings.FirstFileAt; ff != nil && ff.After(complete) {
		// Seen after the marker's time (a directory renamed into place with its files, seen at
		// once): its first file was ready by then (found from outside: first_file_at after
		// complete_at, a negative write time in a dashboard).
		first := complete
		m.Timings.FirstFileAt = &first
	}
	if c.completeAt != nil {
		complete = *c.completeAt
	} else if at, k, behind := afterKnown(c.known, complete); behind {
		u.log.Warn().Str("checkpoint", c.name).Time("complete_at_here", complete).Time("complete_at", at).
			Str("after_commit", k.order.Commit).Time("after_complete_at", k.order.At).Time("learned_at", k.at).
			Float64("clock_behind_s", logSeconds(at.Sub(complete)-time.Millisecond)).
			Str("fix", "synchronize this instance's clock (chronyc tracking; on EC2 the Amazon Time Sync Service at 169.254.169.123)").
			Msg("this instance's clock is behind the one that wrote a commit the agent knew of before this checkpoint completed; ordering the checkpoint after that commit, as if this clock were that much ahead")
		here := complete
		m.Timings.CompleteAtHere = &here
		complete = at
	}
	m.Timings.CompleteAt = &complete
	m.Timings.LastByteAt = &now
	if u.cfg.WorldNodes > 1 {
		m.Part = &Part{NodeRank: u.cfg.NodeRank, WorldNodes: u.cfg.WorldNodes}
	}
	if err := m.Validate(); err != nil {
		return commitResult{err: fmt.Errorf("refusing to commit: %w", err)}
	}
	// A manifest of this commit may have been written before: by a try whose answer was lost
	// (sealed), or by an earlier run (resumed), whose request may even land after it was killed.
	// Retention (this agent's or another's) may have deleted that commit since, manifest first:
	// writing the manifest again would list deleted objects. Only a commit whose objects are all
	// there is written; otherwise it starts over as a new one.
	maybeWritten := c.sealed || c.resumed
	if maybeWritten {
		missing, err := u.missingObjects(ctx, m)
		if err != nil {
			return commitResult{err: err}
		}
		if missing != "" {
			// A write of this manifest by an earlier try may have landed over them (its look
			// after the write failed): it must not stay.
			key := ManifestKey(m.Job, m.Checkpoint, m.Commit)
			if m.Part != nil {
				key = PartKey(m.Job, m.Checkpoint, m.Commit)
			}
			if err := u.cfg.Store.Delete(ctx, key); err != nil {
				return commitResult{err: fmt.Errorf("delete the manifest of a commit whose objects are gone: %w", err)}
			}
			return commitResult{changed: lc.Files}
		}
	}
	strays, err := u.removeStrays(ctx, c, m)
	if err != nil {
		return commitResult{err: fmt.Errorf("clean the commit's prefix before its manifest: %w", err)}
	}
	r.attempted = true
	// A node of a multi-node job writes its part, and the job manifest comes once every part is
	// in (the Run loop's trackSave); a single node writes the manifest.
	write, key, what := writeManifest, ManifestKey(m.Job, m.Checkpoint, m.Commit), "manifest"
	if m.Part != nil {
		write, key, what = writePart, PartKey(m.Job, m.Checkpoint, m.Commit), "part"
	}
	if err := write(ctx, u.cfg.Store, m); err != nil {
		if errors.Is(err, ErrExists) {
			// A try whose answer was lost committed another version of the checkpoint here (it
			// changed since): that commit stands; this version goes to a new one.
			return commitResult{attempted: true, changed: lc.Files}
		}
		r.err = fmt.Errorf("write %s: %w", what, err)
		return r
	}
	if maybeWritten {
		// Another agent's retention may have deleted the earlier commit between the look above
		// and the write: then this manifest lists deleted objects, and goes at once.
		missing, err := u.missingObjects(ctx, m)
		if err != nil {
			// Not known to be whole: the commit is tried again (the write then finds this
			// manifest, and this look is taken again).
			return commitResult{attempted: true, err: fmt.Errorf("look at the objects of a commit written again: %w", err)}
		}
		if missing != "" {
			u.log.Error().Str("checkpoint", c.name).Str("commit", c.commit).Str("missing", missing).
				Msg("commit's objects were deleted (by retention) as its manifest was written again; deleting that manifest and committing the checkpoint anew")
			if derr := u.cfg.Store.Delete(ctx, key); derr != nil {
				return commitResult{attempted: true, err: fmt.Errorf("delete the manifest of a commit whose objects are gone: %w", derr)}
			}
			return commitResult{attempted: true, changed: lc.Files}
		}
	}
	r.manifest = m
	u.cache.put(key, m)
	r.late = &lateCleanup{CommitRef: CommitRef{Checkpoint: m.Checkpoint, Commit: m.Commit}, Strays: strays, Sealed: maybeWritten,
		Listed: c.resumed, At: time.Now()}
	if m.Part != nil {
		return r
	}
	// The manifest is the commit: the result goes back now, and a LATEST that cannot be moved
	// is retried apart (latestFailed), not holding the commit's report, a notice's state or a
	// stop's drain while it fails.
	r.latestMoved, r.latestNewer, r.latestErr = advanceLatestOrder(ctx, u.cfg.Store, m, m.Host, u.cache)
	if c.retain {
		ret, err := applyRetention(ctx, u.cfg.Store, u.cfg.Job, u.cfg.Keep, 0, u.cache, c.uncertain, u.log)
		if err != nil {
			u.log.Warn().Err(err).Msg("retention: cannot read the job")
		}
		r.deleted = append(r.deleted, ret.Deleted...)
		r.retired = ret.Retired
		r.retentionFailed, r.watch = ret.Failed, ret.Watch
	}
	return r
}

// matchesDone reports whether commit m holds exactly the files done. A job manifest matches a
// node that has every node's files (a full restore) or only its own part's (restore --part).
// A node of a multi-node job never takes a single-node commit (one a node left at world_nodes 1
// wrote) for its part.
func (u *Uploader) matchesDone(m *Manifest, done map[string]doneFile) bool {
	if m.Part != nil {
		// A part (ownParts): this node's, of this job's world, with exactly these files.
		return u.cfg.WorldNodes > 1 && *m.Part == (Part{NodeRank: u.cfg.NodeRank, WorldNodes: u.cfg.WorldNodes}) && sameAsDone(m.Files, done)
	}
	if u.cfg.WorldNodes > 1 && m.Parts == nil {
		return false
	}
	return sameAsDone(m.Files, done) || (m.Parts != nil && u.cfg.WorldNodes > 1 && sameAsDone(m.PartFiles(u.cfg.NodeRank), done))
}

// sameAsDone reports whether files are exactly the files done (same paths, sizes, checksums).
func sameAsDone(files []File, done map[string]doneFile) bool {
	return len(files) == len(done) && !slices.ContainsFunc(files, func(f File) bool {
		d, ok := done[f.Path]
		return !ok || d.id.Size != f.Size || d.checksum != f.Checksum
	})
}

// completedAt is when the version of lc being committed was completed, the first half of its
// order: the latest change time (ctime) of its files, the marker's unless a file changed after it.
// A file rewritten after the marker makes a later version than the one committed before, even if
// its modification time was set back; where ctime is unknown, the marker's modification time.
//
// But a checkpoint whose files were all last modified before unseenBefore (before the agent
// started) and after unseenAfter (the newest commit of its name the store holds) was written
// while no agent watched, and its ctimes may be later than its bytes: a chmod -R or chown -R at
// boot sets every file's ctime to now. Taken as its completion, an old checkpoint whose commit
// retention deleted would come back as the newest one, LATEST would move back to it, and
// retention would delete the truly newest. Its latest modification time is taken then. (One
// modified before the newest commit of its name is a rewrite of that commit's checkpoint with
// its modification times set back: newer than that commit, so its ctime.)
func completedAt(lc LocalCheckpoint, unseenBefore, unseenAfter time.Time) time.Time {
	at, modified := lc.CompleteAt, lc.CompleteAt
	for _, f := range lc.Files {
		if f.ID.ChangeTime.After(at) {
			at = f.ID.ChangeTime
		}
		if f.ID.ModTime.After(modified) {
			modified = f.ID.ModTime
		}
	}
	if modified.Before(unseenBefore) && modified.After(unseenAfter) && modified.Before(at) {
		return modified
	}
	return at
}

// deletedSince returns the commit of ms that completed at complete, by its writer's clock, and a
// file of it that local (the checkpoint lc's files) does not have: lc is that commit's save, a
// file of it deleted since. A file written since, or a marker written again, would have made lc
// complete later (its change time); a deletion changes no time of what is left. Nil if none.
func deletedSince(lc LocalCheckpoint, complete time.Time, ms []*Manifest, local map[string]LocalFile) (*Manifest, string) {
	if lc.CompleteAt.IsZero() {
		return nil, ""
	}
	for _, m := range ms {
		at := m.Timings.CompleteAt
		if h := m.Timings.CompleteAtHere; h != nil {
			at = h
		}
		if at == nil || !at.Equal(complete) {
			continue
		}
		for _, f := range m.Files {
			if _, ok := local[f.Path]; !ok {
				return m, f.Path
			}
		}
	}
	return nil, ""
}

// placeOf is the completion time a version with the bytes of commit m keeps when it is committed
// again: m's, or in a multi-node job this node's part's.
func (u *Uploader) placeOf(m *Manifest) time.Time {
	if r := u.cfg.NodeRank; m.Parts != nil && u.cfg.WorldNodes > 1 && r < len(m.Parts) {
		return m.Parts[r].CompleteAt // this node's part's place, not the job's
	}
	return m.Order().At
}

// missingObjects lists m's commit prefix (a job manifest's: its parts') and returns the first of
// m's files whose object is not there with its size, or "".
func (u *Uploader) missingObjects(ctx context.Context, m *Manifest) (string, error) {
	prefixes := commitDataPrefixes(m)
	if len(prefixes) == 0 {
		prefixes = []string{CommitPrefix(m.Job, m.Checkpoint, m.Commit)}
	}
	have := map[string]int64{}
	for _, p := range prefixes {
		objs, err := u.cfg.Store.List(ctx, p)
		if err != nil {
			return "", fmt.Errorf("list the commit's objects: %w", err)
		}
		for _, o := range objs {
			have[o.Key] = o.Size
		}
	}
	for _, f := range m.Files {
		if size, ok := have[f.Key]; !ok || size != f.Size {
			return f.Key, nil
		}
	}
	return "", nil
}

// removeStrays makes m's commit prefix hold nothing but m's files (and its manifest or part
// manifest, which a try whose answer was lost may have written) before its manifest is written:
// it deletes the keys stored for files that left the checkpoint, and in a commit an earlier run
// began, everything else there and every incomplete upload under it (none of this agent's is
// running for it now). In a commit of this run's alone, a failed PutFile aborts its
// own upload, and goLateCleanup clears whatever is left after the commit. It returns the keys
// it deleted: a write of one may still land (goLateCleanup).
func (u *Uploader) removeStrays(ctx context.Context, c commitJob, m *Manifest) ([]string, error) {
	// The manifest or part manifest itself may be there already: a try whose answer was lost.
	keep := commitKeeps(m)
	prefix := CommitPrefix(m.Job, m.Checkpoint, m.Commit)
	strays := slices.DeleteFunc(slices.Clone(c.strays), func(k string) bool { return keep[k] })
	if c.resumed {
		objs, err := u.cfg.Store.List(ctx, prefix)
		if err != nil {
			return nil, err
		}
		for _, o := range objs {
			if !keep[o.Key] {
				strays = append(strays, o.Key)
			}
		}
	}
	if len(strays) > 0 {
		if err := u.cfg.Store.Delete(ctx, strays...); err != nil {
			return nil, err
		}
	}
	if !c.resumed {
		return strays, nil
	}
	_, err := u.cfg.Store.AbortIncomplete(ctx, prefix)
	return strays, err
}

// lateAborts are when, after each commit (and after an abandoned commit is deleted), its prefix is
// cleared of incomplete uploads, and of objects that are not the commit's: requests sent earlier
// can still be on their way (in a proxy's buffers, held by a network that dropped packets and
// retried by the SDK on another connection, or from a killed run) and create an upload or an
// object when they land; a part landing after an abort can bring an upload back on some servers;
// and a failed upload's own abort fails when the store is down. Each such upload or object stays,
// and costs, until aborted or deleted.
var lateAborts = []time.Duration{0, 5 * time.Second, 30 * time.Second, 2 * time.Minute}

// lateRetry and lateExpiry: after the last of lateAborts failed (the store down), the pass is
// tried again every lateRetry, until lateExpiry after the commit. An upload left by a store that
// never lets it be aborted (a policy without s3:ListBucketMultipartUploads or s3:AbortMultipartUpload)
// is the bucket's lifecycle rule's to end (docs/s3.md).
var lateRetry, lateExpiry = 2 * time.Minute, time.Hour
