package checkpoint

import (
	"bytes"
	"cmp"
	"context"
	"crypto/rand"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"os"
	"os/user"
	"path"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"time"

	"github.com/rs/zerolog"
	"golang.org/x/sync/errgroup"
)

// ErrNothingToRestore is wrapped by Restore's error when the job has no complete checkpoint in
// the store. The error's message names the job and the store, e.g. "no complete checkpoint of
// job J in s3://bucket/prefix", so callers can print it as it is.
var ErrNothingToRestore = errors.New("checkpoint: nothing complete to restore")

// ErrOnlyUncommittedSaves is wrapped, with ErrNothingToRestore, by Restore's error when the job
// has no complete checkpoint but holds multi-node saves that are not committed: the job name is
// right, and this is not a first run.
var ErrOnlyUncommittedSaves = errors.New("checkpoint: the job's saves are not committed")

// ErrUnusableManifest is wrapped by Restore's error when the commit it should restore, the newest
// (of the checkpoint asked for), has a manifest in the store that this spotguard cannot use: a
// newer spotguard's format, not valid JSON, invalid, or naming another job, checkpoint or commit
// than its key. Restore then restores nothing: an older commit is restored only when asked for
// by its id. The error's message names the commit, says why, and says how to restore an older
// one.
var ErrUnusableManifest = errors.New("checkpoint: the newest commit's manifest cannot be used")

// ErrDestinationExists is wrapped by Restore's error when something else is already where the
// checkpoint goes (To/<checkpoint>): it is never overwritten.
var ErrDestinationExists = errors.New("checkpoint: the destination holds something else under the checkpoint's name")

// ErrDamaged marks a restore that failed because a committed file is missing from the store, or
// its size differs from the manifest's, or its bytes failed the manifest's checksum in two
// downloads (an object deleted or changed behind the agent's back): that commit cannot be
// restored; another may.
var ErrDamaged = errors.New("the commit is damaged in the store")

// restoreDefaultConcurrency is RestoreOptions.Concurrency when it is not positive.
const restoreDefaultConcurrency = 8

// restoreStagingPrefix starts the name of the staging directory that Restore creates in
// RestoreOptions.To: .spotguard-restore-<pid>-<random>. The watcher never looks at ".spotguard-*"
// names, so a staging directory is never taken for a checkpoint.
const restoreStagingPrefix = ".spotguard-restore-"

// RestoreOptions says what Restore restores and where.
type RestoreOptions struct {
	// Job is the job whose checkpoint is restored (store.job).
	Job string
	// Checkpoint is the checkpoint to restore: its newest commit (Manifest.Order). "" means the
	// newest commit of the job: the one LATEST names, or a newer one when LATEST lags (a reclaim
	// between a manifest and LATEST), is missing, is not valid JSON or names a commit without a
	// manifest. Either way, a newest commit whose manifest cannot be used is an error
	// (ErrUnusableManifest), never a reason to restore an older one.
	Checkpoint string
	// Commit, with Checkpoint, restores that commit of it ("" for a version 1 checkpoint when
	// CommitSet is true).
	Commit    string
	CommitSet bool
	// To is the destination directory, created if missing; the checkpoint is placed at
	// To/<checkpoint name>.
	To string
	// Concurrency is how many files are downloaded at once; 8 when not positive. The Store
	// parallelises ranged reads within a file.
	Concurrency int
	// Progress, if not nil, is called with the bytes written so far and the checkpoint's total
	// size: once with done 0 before the first download, then as bytes arrive. Calls are
	// serialised (never two at once) and done never decreases or exceeds total. It is not
	// called when To/<checkpoint> already holds the checkpoint.
	Progress func(done, total int64)
	// Logger receives the summary and warnings (a fallback, skipped manifests).
	Logger zerolog.Logger
	// Marker is checkpoint.marker ("" means "_COMPLETE"): at the top of a checkpoint directory,
	// it is downloaded once every other file is in and verified, so that a staging directory a
	// killed restore leaves behind never holds a marker beside files that are not.
	Marker string
	// Part, if not nil, restores of a multi-node job's checkpoint only the files of node rank
	// *Part (its own and those its part shares with others; Manifest.PartFiles). A single-node
	// commit (no parts: what a node left at store.world_nodes 1 commits) is refused, not taken
	// for the node's part.
	Part *int
	// WorldNodes, with Part, is the job's node count now (store.world_nodes): a checkpoint
	// saved by another count of nodes is refused (its parts do not map onto the nodes one to
	// one). 0: not checked.
	WorldNodes int
	// PartWait is store.part_wait, to say of a multi-node save without a commit that the agents
	// gave it up (IncompleteSave.GivenUp). 0: not said.
	PartWait time.Duration
	// Journal, when To is the agent's checkpoint.dir, is the agent's journal (JournalPath): the
	// restore tells it that the checkpoint in place is its commit (a single-node commit), as the
	// agent records one it finds committed, so that an agent that starts later knows the copy
	// for that commit even when the store no longer holds it.
	Journal string
	// DirOwner, if not nil, is the user (trainer.user) a restore run as root gives the
	// directories it creates where the nearest one that exists belongs to root (a disk's mount
	// point): the trainer can then save into the checkpoint.dir the restore made, and the
	// restored files are its too. Its group is the user's own, where this system knows the user.
	DirOwner *int
	// BootedAt, if not zero, is when this machine booted: a save in To modified before it is not
	// being written, however recent (found from outside: the restore unit failed at a boot that
	// came less than a minute after a save was cut short, and the trainer never started).
	BootedAt time.Time
}

// RestoreResult describes a successful restore.
type RestoreResult struct {
	// Checkpoint is the name of the restored checkpoint.
	Checkpoint string
	// Dir is To/<checkpoint>.
	Dir string
	// Files and Bytes are the checkpoint's file count and total size.
	Files int
	Bytes int64
	// Elapsed is the time Restore took, from its start.
	Elapsed time.Duration
	// Commit is the restored commit's id ("" for a version 1 checkpoint).
	Commit string
	// FellBack is true when Checkpoint was "" and the restored commit, the newest, is not the
	// one LATEST names: LATEST is missing, is not valid JSON or names no checkpoint, names a
	// commit that has no manifest (so does not exist), or names an older commit than the newest
	// (a reclaim between a manifest and LATEST; the agent repairs LATEST when it starts). It is
	// never true because a manifest could not be used: that is an error (ErrUnusableManifest).
	FellBack bool
	// AlreadyPresent is true when Dir already held the checkpoint (the same files, sizes and
	// checksums): nothing was downloaded or changed.
	AlreadyPresent bool
	// MovedAside is where a save of the checkpoint's name that was at Dir went, and
	// MovedAsideKind what it was: "incomplete" (restoreIncomplete) or "older" (restoreJudge);
	// both "" when none was there.
	MovedAside, MovedAsideKind string
	// NewerPresent is true when Dir held a newer save of the checkpoint's name than the commit,
	// one the agent had not committed yet (restoreJudge): it was left as it is, and nothing was
	// downloaded or changed.
	NewerPresent bool
	// Deleted is how many commits, each the newest when Restore began it, were deleted from the
	// store while they were restored (by the retention of an agent still running the job) before
	// this one.
	Deleted int
}

// Restore downloads a committed checkpoint of opts.Job from s into opts.To/<checkpoint>,
// verified. It resolves the commit (see RestoreOptions.Checkpoint; it reads the job's delimiter
// listings and manifests, so a commit newer than LATEST is found), downloads every file the
// manifest lists in parallel into a staging directory inside To (no path can leave it), fsyncs
// each file, checks each file's size and CRC-32C read back from disk against the manifest, sets
// its permission bits from the manifest (never setuid, setgid or sticky), and only then renames
// the staging directory to To/<checkpoint> (a single-file checkpoint, Manifest.SingleFile, is
// put back as the file To/<name>, as it was in the checkpoint directory). It never overwrites:
// if To/<checkpoint> exists already, Restore compares it with the manifest, except when it is an
// incomplete save of that name (a directory without the marker the commit has at its top, left
// alone for a minute): that is moved aside, to To/.spotguard-incomplete-<checkpoint>-<time>
// (RestoreResult.MovedAside; removed if it held nothing), as the commit is put in its place,
// and moved back if that fails. Without CommitSet, a complete save of that name with other
// content (restoreJudge) is left as it is when it is newer than the commit
// (RestoreResult.NewerPresent: nothing is downloaded), and moved aside like an incomplete one,
// to To/.spotguard-older-<checkpoint>-<time>, when it is older (to .spotguard-incomplete-* when
// it holds some of the commit's files and nothing else). It holds a lock on
// its staging directory for as long as the directory exists, and before it stages, it removes
// the staging directories in To that a killed restore left behind (.spotguard-restore-<pid>-*
// that no restore holds, in any PID namespace; see restoreRemoveStale); the agent never uploads
// them (the watcher skips ".spotguard-*").
//
// It returns:
//   - the result, nil: the checkpoint is at Dir, complete and verified; AlreadyPresent says
//     it was there already with identical content (a re-run is a no-op); NewerPresent that a
//     newer save of its name is there instead, left as it is;
//   - an error wrapping ErrNothingToRestore, whose message names the job and the store:
//     opts.Checkpoint is "" and the job has no manifest at all;
//   - an error wrapping ErrUnusableManifest, naming the commit, why and how to restore an older
//     one: the commit to restore has a manifest this spotguard cannot use (restoreBlocking);
//   - another error, naming the store and job: invalid options; an explicit opts.Checkpoint
//     (or commit) without a manifest (wrapping ErrNotFound) or with an invalid or mismatched one; a store
//     failure other than a missing object while resolving (no fallback then: a transient error
//     must not make it restore an older checkpoint); a missing data object (wrapping
//     ErrNotFound) or failed download; a size mismatch, or a checksum mismatch in two downloads
//     (naming the file, expected and actual; the first mismatch is logged and the file
//     downloaded again); To/<checkpoint> existing with other content (but a save of its name,
//     without CommitSet), or not as a directory (a regular file for a single-file checkpoint),
//     or modified within incompleteQuiet where it would be moved aside; a local
//     file system error; ctx ended.
//
// A read of the store (the job's listings and manifests, one file's download) that fails for a
// reason that passes (a connection refused, reset or timed out, HTTP 5xx, SlowDown; see
// restoreTransient) is tried again, with backoff, for up to 5 minutes from its first failure
// (restoreRun.retry); the log says when the store starts failing and when it answers again.
// Anything else fails at once.
//
// A commit deleted from the store while it is restored (its manifest gone as well as a data
// object: retention by an agent still running the job deletes commits beyond checkpoint.keep) is
// no damage: without a commit asked for, Restore starts again with the newest commit, with a
// warning, on at most restoreDeletedTries commits in all; with one, it fails saying so.
//
// On every error the staging directory is removed and To/<checkpoint> is untouched (To itself
// may have been created).
func Restore(ctx context.Context, s Store, opts RestoreOptions) (RestoreResult, error) {
	start := time.Now()
	url := s.URL()
	fail := func(err error) (RestoreResult, error) {
		return RestoreResult{}, fmt.Errorf("restore job %s from %s: %w", opts.Job, url, err)
	}
	if err := ValidName(opts.Job); err != nil {
		return fail(fmt.Errorf("job: %w", err))
	}
	if opts.To == "" {
		return fail(errors.New("no destination directory"))
	}
	if err := restoreLinkCheck(opts.To); err != nil {
		return fail(err)
	}
	if opts.Checkpoint != "" {
		if err := ValidName(opts.Checkpoint); err != nil {
			return fail(fmt.Errorf("checkpoint: %w", err))
		}
	}
	if opts.CommitSet && opts.Commit != "" {
		if err := ValidCommitID(opts.Commit); err != nil {
			return fail(fmt.Errorf("commit: %w", err))
		}
	}
	if opts.CommitSet && opts.Checkpoint == "" {
		return fail(errors.New("a commit needs its checkpoint"))
	}
	conc := opts.Concurrency
	if conc <= 0 {
		conc = restoreDefaultConcurrency
	}
	log := opts.Logger.With().Str("component", "restore").Str("store", url).Str("job", opts.Job).Logger()
	run := &restoreRun{log: log, dirOwner: opts.DirOwner}

	var last *Manifest // the commit deleted under the last try
	for tries := 1; ; tries++ {
		res, gone, err := restoreOnce(ctx, s, opts, conc, run, start)
		if gone == nil {
			res.Deleted = tries - 1
			if last != nil && opts.Checkpoint != "" && errors.Is(err, ErrNotFound) {
				// Its only commit went under it: say so, not that it "has no valid manifest"
				// (found from outside), which reads as damage.
				return fail(fmt.Errorf("checkpoint %q: its commit %s was deleted from the store while it was restored (retention by an agent still running the job, or a delete by hand), and it has no other: %w; `spotguard list` shows the commits left",
					opts.Checkpoint, last.Commit, ErrNotFound))
			}
			return res, err
		}
		last = gone
		what := fmt.Sprintf("checkpoint %q commit %s", gone.Checkpoint, gone.Commit)
		switch {
		case opts.CommitSet:
			return fail(fmt.Errorf("%s was deleted from the store while it was restored (retention by an agent still running the job, or a delete by hand); `spotguard list` shows the commits left", what))
		case tries == restoreDeletedTries:
			return fail(fmt.Errorf("%s, the newest commit, was deleted from the store while it was restored, and so were the %d newest before it: an agent still running the job deletes commits faster than they can be restored here; raise its checkpoint.keep, or restore an older commit by its id (`spotguard list`)", what, tries-1))
		}
		then := "restoring the newest commit now"
		if opts.Checkpoint != "" {
			then = "restoring the newest commit of this checkpoint now, if it has one" // (found from outside: "the newest commit", then a failure)
		}
		log.Warn().Str("checkpoint", gone.Checkpoint).Str("commit", gone.Commit).Int("try", tries).
			Msg("the commit being restored was deleted from the store (retention by an agent still running the job, or a delete by hand); " + then)
	}
}

// restoreDeletedTries bounds how often Restore starts again with the newest commit after the one it
// was restoring was deleted from the store under it.
const restoreDeletedTries = 5

// restoreOnce is one try of Restore: it restores the commit restoreResolve gives. deleted is that
// commit when the restore failed (err) because it was deleted from the store while it was
// restored (restoreDeleted), else nil.
func restoreOnce(ctx context.Context, s Store, opts RestoreOptions, conc int, run *restoreRun, start time.Time) (_ RestoreResult, deleted *Manifest, _ error) {
	url, log := s.URL(), run.log
	fail := func(err error) (RestoreResult, *Manifest, error) {
		return RestoreResult{}, nil, fmt.Errorf("restore job %s from %s: %w", opts.Job, url, err)
	}
	m, others, fellBack, err := restoreResolve(ctx, s, opts, run)
	if err != nil {
		if errors.Is(err, ErrNothingToRestore) {
			return RestoreResult{}, nil, err
		}
		return fail(err)
	}
	if opts.Part != nil && m.Parts == nil && m.Version == ManifestVersion {
		return fail(fmt.Errorf("checkpoint %q commit %s is a single-node commit (no parts): --part restores one node's part of a multi-node job's checkpoint; restore it whole, and check the job with spotguard list --check (a node left at store.world_nodes 1?)", m.Checkpoint, m.Commit))
	}
	if opts.Part != nil && m.Parts != nil {
		if opts.WorldNodes > 0 && opts.WorldNodes != m.WorldNodes {
			return fail(fmt.Errorf("checkpoint %q was saved by %d nodes, and store.world_nodes is %d now: with --part each node would get its own rank's part only, and the files of the other ranks no node; restore it whole on every node (without --part) for a trainer that reshards, or set store.world_nodes back to %d",
				m.Checkpoint, m.WorldNodes, opts.WorldNodes, m.WorldNodes))
		}
		if *opts.Part < 0 || *opts.Part >= m.WorldNodes {
			return fail(fmt.Errorf("checkpoint %q has parts of node ranks 0 to %d; there is no part %d", m.Checkpoint, m.WorldNodes-1, *opts.Part))
		}
		part := *m
		part.Files = m.PartFiles(*opts.Part)
		part.TotalBytes = 0
		for _, f := range part.Files {
			part.TotalBytes += f.Size
		}
		m = &part
	}
	res := RestoreResult{
		Checkpoint: m.Checkpoint,
		Commit:     m.Commit,
		Dir:        filepath.Join(opts.To, m.Checkpoint),
		Files:      len(m.Files),
		Bytes:      m.TotalBytes,
		FellBack:   fellBack,
	}
	failCP := func(err error) (RestoreResult, *Manifest, error) {
		return fail(fmt.Errorf("checkpoint %q: %w", m.Checkpoint, err))
	}

	if err := restoreMkdirAll(opts.To, run); err != nil {
		if link, target := danglingLinkOn(opts.To); link != "" {
			// mkdir's own error says only "file exists".
			return failCP(fmt.Errorf("create destination: %s is a symbolic link to %s, which does not exist: create %s, or give the directory itself", link, target, target))
		}
		return failCP(fmt.Errorf("create destination: %w", err))
	}
	to, err := os.OpenRoot(opts.To)
	if err != nil {
		return failCP(fmt.Errorf("open destination: %w", err))
	}
	defer func() { _ = to.Close() }() // a directory handle: nothing to flush
	if err := restoreOpenedCheck(opts.To, to); err != nil {
		return failCP(err)
	}
	run.owner = restoreOwnerOf(to)

	done := func(already bool) (RestoreResult, *Manifest, error) {
		if opts.Journal != "" && opts.Part == nil {
			if err := restoreTellJournal(to, m, opts.Journal); err != nil {
				// Not trouble: the agent checks the files against the store, as before (a restore
				// run by hand by a user who cannot write agent.runtime_dir says nothing of it).
				log.Info().Err(err).Str("checkpoint", m.Checkpoint).
					Msg("cannot tell the agent's journal what was restored; the agent checks the files against the store instead")
			}
		}
		res.AlreadyPresent = already
		res.Elapsed = time.Since(start)
		log.Info().Str("checkpoint", res.Checkpoint).Str("commit", res.Commit).Str("dir", res.Dir).Int("files", res.Files).
			Int64("bytes", res.Bytes).Float64("elapsed_s", logSeconds(res.Elapsed)).Bool("fell_back", res.FellBack).
			Bool("already_present", already).Msg("checkpoint restored")
		return res, nil, nil
	}

	// Never overwrite what is there; succeed only if it is this very checkpoint, or a newer save
	// of its name. An incomplete save of that name (a save cut short on this disk), or an older
	// save of it, goes aside as the commit is put in place.
	marker := cmp.Or(opts.Marker, scanDefaultMarker)
	if !m.SingleFile() && !slices.ContainsFunc(m.Files, func(f File) bool { return f.Path == marker }) {
		// Restored, it has no marker: a trainer that resumes from the newest save with its
		// marker does not take it (a manifest edited by hand; or checkpoint.marker is another
		// than the agent's, a restore without its --config).
		log.Warn().Str("checkpoint", m.Checkpoint).Str("commit", m.Commit).Str("marker", marker).
			Msg("the commit has no checkpoint.marker at its top: a trainer that resumes from a save with its marker will not take this one; is checkpoint.marker the agent's (restore --config)?")
	}
	// A killed restore's staging goes first, whatever this one finds there (found from outside:
	// one that found the checkpoint there left 65 MiB of it).
	restoreRemoveStale(to, log)
	aside, err := restoreIncomplete(to, m, marker, start, opts.BootedAt)
	if err != nil {
		return failCP(err)
	}
	if aside == nil {
		same, err := restoreExisting(ctx, to, m, conc)
		if errors.Is(err, ErrDestinationExists) && !opts.CommitSet {
			// Whatever else is there is refused (err), and so is any save with a commit asked for.
			newer, older, jerr := restoreJudge(ctx, to, m, others, opts.Part, marker, start, opts.BootedAt)
			switch {
			case jerr != nil:
				return failCP(jerr)
			case newer != "":
				res.NewerPresent, res.Elapsed = true, time.Since(start)
				log.Warn().Str("checkpoint", m.Checkpoint).Str("commit", m.Commit).Str("dir", res.Dir).
					Msg(newer + ": a save the agent had not committed yet; left as it is, and nothing restored: the trainer resumes from it, and the agent commits it")
				return res, nil, nil
			case older != nil:
				aside, err = older, nil
			default:
				err = restoreNoMarker(err, m, marker)
			}
		}
		if err != nil {
			return failCP(err)
		}
		if same {
			return done(true)
		}
	}

	staging, release, err := restoreStage(ctx, s, to, m, conc, opts.Marker, opts.Progress, run)
	if err != nil {
		if restoreDeleted(ctx, s, m, err, run) {
			return RestoreResult{}, m, err
		}
		return failCP(err)
	}
	// The lock on the staging directory is held until it has been renamed into place or removed.
	defer release()
	removeStaging := func() {
		if rerr := to.RemoveAll(staging); rerr != nil {
			log.Warn().Err(rerr).Str("dir", filepath.Join(opts.To, staging)).Msg("cannot remove the staging directory")
		}
	}
	place := func() error { return to.Rename(staging, m.Checkpoint) }
	if m.SingleFile() {
		place = func() error {
			defer removeStaging() // the file has left it, or failed to
			return restorePlaceFile(to, filepath.Join(staging, m.Checkpoint), m.Checkpoint)
		}
	}
	if aside != nil {
		if place, err = restoreAside(to, m, aside, marker, start, place, &res, log); err != nil {
			removeStaging()
			return failCP(err)
		}
	}
	if err := place(); err != nil {
		// Someone else may have put it there since the check (a concurrent restore). Renaming
		// a directory onto an empty directory replaces it; onto anything else it fails.
		removeStaging()
		same, cerr := restoreExisting(ctx, to, m, conc)
		if cerr != nil {
			return failCP(cerr)
		}
		if same {
			return done(true)
		}
		return failCP(fmt.Errorf("move into place: %w", err))
	}
	if err := restoreSyncDir(to, "."); err != nil {
		// The checkpoint is in place and verified; only the rename may not survive a crash.
		log.Warn().Err(err).Str("dir", opts.To).Msg("cannot sync the destination directory")
	}
	return done(false)
}

// restoreTellJournal appends to the agent's journal at path that the checkpoint m.Checkpoint in
// to is m's commit, adopted and done, with its place in the order: each file's FileID as it now
// is, so that a file changed since is not taken for it. Only a version 2 single-node commit. An
// agent running meanwhile may rewrite its journal without these lines: it then finds the commit
// in the store itself.
func restoreTellJournal(to *os.Root, m *Manifest, path string) error {
	if m.Version != ManifestVersion || m.Commit == "" || m.Parts != nil || m.Part != nil {
		return nil
	}
	e := &journalEntry{commit: m.Commit, files: map[string]doneFile{}, done: true, adopted: true, completeAt: m.Order().At}
	now := time.Now()
	for _, f := range m.Files {
		p := m.Checkpoint
		if !m.SingleFile() {
			p = filepath.Join(m.Checkpoint, filepath.FromSlash(f.Path))
		}
		fi, err := to.Lstat(p)
		if err != nil {
			return err
		}
		e.files[f.Path] = doneFile{id: FileIDOf(fi), checksum: f.Checksum, readAt: now, key: m.FileKey(f)}
	}
	var buf bytes.Buffer
	writeJournalEntry(&buf, m.Checkpoint, e)
	if err := os.MkdirAll(filepath.Dir(path), 0o755); err != nil {
		return err
	}
	_, absent := os.Lstat(path)
	f, err := os.OpenFile(path, os.O_WRONLY|os.O_APPEND|os.O_CREATE, 0o600)
	if err != nil {
		return err
	}
	if absent != nil && os.Geteuid() == 0 {
		// Made by root here (sudo spotguard restore): the journal of an agent that runs as the
		// directory's owner must stay its own to read and write.
		if dfi, err := os.Stat(filepath.Dir(path)); err == nil {
			if st, ok := fileStat(dfi); ok && st.uid != 0 {
				_ = f.Chown(int(st.uid), int(st.gid))
			}
		}
	}
	if _, err := f.Write(buf.Bytes()); err != nil {
		_ = f.Close()
		return err
	}
	return f.Close()
}

// restoreDeleted reports whether err, from restoring commit m, is a missing data object because m
// was deleted from the store while it was restored: its manifest is gone too (retention deletes
// the manifest first; an agent still running the job deletes commits beyond checkpoint.keep). A
// manifest still there means the commit is damaged.
func restoreDeleted(ctx context.Context, s Store, m *Manifest, err error, run *restoreRun) bool {
	if !errors.Is(err, ErrNotFound) || ctx.Err() != nil {
		return false
	}
	gone := false
	rerr := run.retry(ctx, "manifest", func(ctx context.Context) (err error) {
		gone, err = commitDeleted(ctx, s, m)
		return err
	})
	return rerr == nil && gone
}

// restoreResolve returns the manifest to restore. With a commit asked for, it is that commit or
// an error. Otherwise it is the newest usable commit by Manifest.Order (of the checkpoint asked
// for, if any): normally the one LATEST names (fellBack false); when LATEST is missing, unusable,
// names a commit without a manifest or names an older commit (a reclaim between the manifest and
// LATEST), the newest commit (fellBack true, with a warning). It returns an error wrapping
// ErrUnusableManifest when a commit whose manifest cannot be used may be newer than that one
// (restoreBlocking), an error wrapping ErrNothingToRestore when the job has no commit, and an
// error for a store failure other than ErrNotFound in every case (retried while it passes).
// others are the job's other commits of that checkpoint's name (none with a commit asked for).
func restoreResolve(ctx context.Context, s Store, opts RestoreOptions, run *restoreRun) (m *Manifest, others []*Manifest, fellBack bool, err error) {
	job, log := opts.Job, run.log
	if opts.CommitSet {
		var m *Manifest
		err := run.retry(ctx, "manifest", func(ctx context.Context) (err error) {
			m, err = ReadManifest(ctx, s, job, opts.Checkpoint, opts.Commit)
			return err
		})
		if err != nil {
			commit := opts.Commit
			if commit == "" {
				commit = "-" // a version 1 commit, as list shows it and --commit takes it
			}
			return nil, nil, false, fmt.Errorf("checkpoint %q commit %s: %w", opts.Checkpoint, commit, err)
		}
		return m, nil, false, nil
	}
	var st *JobState
	err = run.retry(ctx, "job", func(ctx context.Context) (err error) {
		st, err = readJob(ctx, s, job, nil)
		return err
	})
	if err != nil {
		return nil, nil, false, err
	}
	for _, p := range st.Problems {
		log.Warn().Err(p).Msg("skipping unusable store entry")
	}
	// The newest usable commit (of the checkpoint asked for).
	var newest *Committed
	for i, c := range st.Commits {
		if opts.Checkpoint == "" || c.Manifest.Checkpoint == opts.Checkpoint {
			newest = &st.Commits[i]
			break
		}
	}
	if blocking := restoreBlocking(restoreUnusableCommits(st), opts.Checkpoint, newest); len(blocking) > 0 {
		return nil, nil, false, restoreUnusableErr(ctx, s, job, opts.Checkpoint, blocking, newest)
	}
	if newest != nil {
		if err := restoreTornSingle(st, newest.Manifest, opts.Marker); err != nil {
			return nil, nil, false, err
		}
	}
	if newest != nil {
		if err := restoreSplit(st, opts, newest.Manifest); err != nil {
			return nil, nil, false, err
		}
		for _, c := range st.Commits {
			if c.Manifest.Checkpoint == newest.Manifest.Checkpoint && c.Manifest != newest.Manifest {
				others = append(others, c.Manifest)
			}
		}
	}
	if opts.Checkpoint != "" {
		if newest != nil {
			return newest.Manifest, others, false, nil
		}
		// Say why: the problems with its manifests, if it has any, and its saves waiting for
		// parts.
		why := []error{ErrNotFound}
		for _, p := range st.Problems {
			if mp, ok := errors.AsType[*ManifestProblem](p); ok && mp.Ref.Checkpoint == opts.Checkpoint {
				why = append(why, p)
			}
		}
		for _, is := range incompleteSaves(st.Parts, st.Commits, opts.PartWait) {
			if is.Checkpoint == opts.Checkpoint {
				return nil, nil, false, fmt.Errorf("checkpoint %q has no commit; the %s: %w", opts.Checkpoint, is.describe(), errors.Join(why...))
			}
		}
		return nil, nil, false, fmt.Errorf("checkpoint %q has no valid manifest: %w", opts.Checkpoint, errors.Join(why...))
	}
	if newest == nil && st.LatestETag != "" {
		// LATEST is written after a manifest: the job had a checkpoint, and it is gone. Not a
		// first run: --allow-empty must not start the trainer from scratch.
		named := "not valid JSON"
		if st.Latest != nil {
			named = fmt.Sprintf("naming checkpoint %q", st.Latest.Checkpoint)
			if st.Latest.Commit != "" {
				named += " commit " + st.Latest.Commit
			}
		}
		return nil, nil, false, fmt.Errorf("job %s in %s has a LATEST (%s) but no complete checkpoint: the job had one, and its commits are gone from the store "+
			"(an S3 lifecycle rule, a hand delete, another tool?); this is not a first run, so nothing is restored, with --allow-empty too: "+
			"look for the commits (a versioned bucket keeps deleted objects as noncurrent versions), or delete %s to start the job from scratch",
			job, s.URL(), named, LatestKey(job))
	}
	if newest == nil {
		e := &restoreNothingError{job: job, url: s.URL(), problems: len(st.Problems), others: OtherJobs(ctx, s, job)}
		if inc := incompleteSaves(st.Parts, st.Commits, opts.PartWait); len(inc) > 0 {
			e.incomplete = inc[0].describe()
		}
		return nil, nil, false, e
	}
	restoreSayNewerSaves(log, st, newest.Manifest, opts.PartWait)
	if newest.Latest {
		return newest.Manifest, others, false, nil
	}
	ev := log.Warn().Str("newest", newest.Manifest.Checkpoint).Str("newest_commit", newest.Manifest.Commit)
	if t := st.LatestTarget(); t != nil && time.Since(newest.Manifest.CommittedAt) < latestLagNormal {
		// Written moments ago: an agent between the manifest and LATEST, as every commit is for
		// a moment (found from outside: a restore beside a running agent said "a reclaim?").
		ev.Str("latest", t.Manifest.Checkpoint).Str("latest_commit", t.Manifest.Commit).
			Msg("LATEST names an older commit (the newest was committed moments ago, and LATEST is being moved to it); restoring the newest")
	} else if t != nil {
		ev.Str("latest", t.Manifest.Checkpoint).Str("latest_commit", t.Manifest.Commit).
			Msg("LATEST names an older commit (a reclaim between a manifest and LATEST?); restoring the newest")
	} else {
		ev.Msg("LATEST is missing or unusable; restoring the newest commit")
	}
	return newest.Manifest, others, true, nil
}

// latestLagNormal is how long after a manifest's commit LATEST may still name an older commit
// with the agent well: it moves LATEST right after the manifest, retried for that long at most
// while the store fails.
const latestLagNormal = 30 * time.Second

// restoreSayNewerSaves warns of the multi-node saves of st newer than m, the commit a restore
// is about to bring back, that are not committed (waiting for parts, given up, or parts that are
// not one save): multinode.md promises restore says so, and a replacement that resumes from an
// older step than the trainers saved for the reclaim must not do it silently (found from
// outside: exit 0, not a word).
func restoreSayNewerSaves(log zerolog.Logger, st *JobState, m *Manifest, partWait time.Duration) {
	at := m.Order().At
	for _, is := range incompleteSaves(st.Parts, st.Commits, partWait) {
		if !is.Newest.After(at) {
			continue
		}
		log.Warn().Str("restoring", m.Checkpoint).Str("newer", is.Checkpoint).
			Msg("a newer multi-node save is not committed, so an older checkpoint is restored: the newer " + is.describe())
	}
}

// restoreTornSingle returns an error when m, the newest commit, is a single-node commit of a
// save that other nodes of a multi-node job wrote parts of (an agent left at store.world_nodes 1
// in that job: the agents say so, and `list --check` fails): one node's files alone, a torn
// checkpoint, which a restore must not present as complete. A job resized to one node writes no
// parts of the same save.
func restoreTornSingle(st *JobState, m *Manifest, marker string) error {
	if m.Parts != nil || m.Part != nil {
		return nil
	}
	if marker == "" {
		marker = scanDefaultMarker
	}
	parts := slices.Clone(st.Parts)
	for _, c := range st.Commits {
		for _, p := range c.Manifest.Parts {
			parts = append(parts, jobPartManifest(c.Manifest, p))
		}
	}
	var ranks []int
	for _, p := range parts {
		if p.Checkpoint == m.Checkpoint && p.Part != nil && sameSave(m, p, marker) && !slices.Contains(ranks, p.Part.NodeRank) {
			ranks = append(ranks, p.Part.NodeRank)
		}
	}
	if len(ranks) == 0 {
		return nil
	}
	slices.Sort(ranks)
	return fmt.Errorf("the newest commit, %s of %s (%s), is a single-node commit of a save that node(s) %v of this multi-node job wrote parts of: "+
		"one node's files alone, a torn checkpoint; not restored. An agent with store.world_nodes 1 (unset?) wrote it: fix that node's configuration; "+
		"`spotguard list` shows the job's checkpoints, and `spotguard restore --checkpoint NAME --commit ID` restores one of them",
		m.Commit, m.Checkpoint, describeHost(m.Host), ranks)
}

// restoreSplit returns an error wrapping a *SplitSaveError when m, the newest commit (of the
// checkpoint asked for), is one piece of a save committed in pieces (splitWith): none of the
// pieces is the whole checkpoint, and a restore of one would put a torn checkpoint in place as
// complete. The error names every piece with its instance, and the newest whole commit before
// that save, if there is one, as the one to ask for instead. nil when m is whole.
func restoreSplit(st *JobState, opts RestoreOptions, m *Manifest) error {
	ms := manifestsOf(st.Commits)
	marker, byName := cmp.Or(opts.Marker, scanDefaultMarker), commitsByName(ms)
	others := splitWith(m, byName[m.Checkpoint], marker)
	if len(others) == 0 {
		return nil
	}
	split := &SplitSaveError{Commit: m, Others: others}
	first := others[0].Order() // the save's first piece
	if first.After(m.Order()) {
		first = m.Order()
	}
	var older *Manifest
	for _, o := range ms { // newest first
		if first.After(o.Order()) && (opts.Checkpoint == "" || o.Checkpoint == opts.Checkpoint) && len(splitWith(o, byName[o.Checkpoint], marker)) == 0 {
			older = o
			break
		}
	}
	msg := "to resume from it, restore on each node the piece that holds that node's files (spotguard list --json shows each commit's files): spotguard restore --checkpoint " + m.Checkpoint + " --commit ID"
	if older != nil {
		msg += fmt.Sprintf(", or the newest whole commit before it: --checkpoint %s --commit %s", older.Checkpoint, older.Commit)
	}
	return fmt.Errorf("the newest commit cannot be restored as the checkpoint: %w; %s", split, msg)
}

// restoreUnusable is a commit whose manifest is in the store but cannot be used.
type restoreUnusable struct {
	ref CommitRef
	// latest is true when LATEST names it.
	latest bool
	// problem is readJob's: it names the manifest's key and says why.
	problem error
	// version is the manifest's "version", when restoreUnusableErr could read one.
	version int
}

// restoreUnusableCommits returns the commits whose manifest readJob read and could not use, the
// latest commit id first (other problems, LATEST's or a part's, are not manifests of a commit).
func restoreUnusableCommits(st *JobState) []restoreUnusable {
	var us []restoreUnusable
	for _, p := range st.Problems {
		mp, ok := errors.AsType[*ManifestProblem](p)
		if !ok || mp.Part {
			continue
		}
		latest := st.Latest != nil && st.Latest.Checkpoint == mp.Ref.Checkpoint && st.Latest.Commit == mp.Ref.Commit
		us = append(us, restoreUnusable{ref: mp.Ref, latest: latest, problem: p})
	}
	slices.SortStableFunc(us, func(a, b restoreUnusable) int { return strings.Compare(b.ref.Commit, a.ref.Commit) })
	return us
}

// restoreBlocking returns the commits of us (of checkpoint, when it is not "") that may be newer
// than newest, the newest usable commit (nil when there is none), so that restoring newest could
// restore an older checkpoint than the job's newest. A manifest that cannot be read gives no
// completion time, so a commit's place is judged by what is known without it:
//   - every one when there is no usable commit: something was committed, and it is not nothing
//     to restore;
//   - the one LATEST names: it was the newest when LATEST was written;
//   - one whose commit id began (NewCommitID) no earlier than newest's (its completion time
//     for a version 1 commit, which has no id). One that began earlier is taken for older: a
//     hand-edited or damaged old commit never blocks the restores that come after it.
//
// A version 1 commit (no id) that LATEST does not name blocks only when there is no usable commit.
func restoreBlocking(us []restoreUnusable, checkpoint string, newest *Committed) []restoreUnusable {
	var began time.Time
	if newest != nil {
		began = newest.Manifest.Order().At
		if id := newest.Manifest.Commit; id != "" {
			began = commitIDStarted(id)
		}
	}
	var blocking []restoreUnusable
	for _, u := range us {
		if checkpoint != "" && u.ref.Checkpoint != checkpoint {
			continue
		}
		if newest == nil || u.latest || (u.ref.Commit != "" && !commitIDStarted(u.ref.Commit).Before(began)) {
			blocking = append(blocking, u)
		}
	}
	return blocking
}

// restoreUnusableShown is how many unusable commits an error names.
const restoreUnusableShown = 3

// restoreUnusableErr returns the error for the blocking commits, with older, the newest usable
// commit (nil if none), as the one to ask for instead. It reads the "version" of each manifest it
// names, so that it can say one was written by a newer spotguard (a read that fails says nothing).
func restoreUnusableErr(ctx context.Context, s Store, job, checkpoint string, blocking []restoreUnusable, older *Committed) error {
	for i := range blocking[:min(len(blocking), restoreUnusableShown)] {
		u := &blocking[i]
		data, _, err := s.GetBytes(ctx, ManifestKey(job, u.ref.Checkpoint, u.ref.Commit))
		var v struct {
			Version int `json:"version"`
		}
		if err == nil && json.Unmarshal(data, &v) == nil {
			u.version = v.Version
		}
	}
	e := &restoreUnusableError{checkpoint: checkpoint, blocking: blocking}
	if older != nil {
		e.older = older.Manifest
	}
	return e
}

// restoreUnusableError is Restore's error when the commit to restore has a manifest it cannot
// use (restoreBlocking).
type restoreUnusableError struct {
	checkpoint string // the checkpoint asked for, or ""
	blocking   []restoreUnusable
	older      *Manifest // the newest usable commit, nil if none
}

func (e *restoreUnusableError) Error() string {
	var b strings.Builder
	if e.checkpoint == "" {
		b.WriteString("the newest commit cannot be restored: ")
	} else {
		fmt.Fprintf(&b, "the newest commit of checkpoint %q cannot be restored: ", e.checkpoint)
	}
	for i, u := range e.blocking[:min(len(e.blocking), restoreUnusableShown)] {
		if i > 0 {
			b.WriteString("; ")
		}
		commit := u.ref.Commit
		if commit == "" {
			commit = "- (version 1)"
		}
		fmt.Fprintf(&b, "checkpoint %q commit %s", u.ref.Checkpoint, commit)
		if u.latest {
			b.WriteString(" (named by LATEST)")
		}
		fmt.Fprintf(&b, " has a manifest this spotguard cannot use: %v", u.problem)
		if u.version > ManifestVersion {
			fmt.Fprintf(&b, ": written by a newer spotguard (manifest version %d; this one reads versions 1 to %d): upgrade spotguard to restore it",
				u.version, ManifestVersion)
		}
	}
	if n := len(e.blocking) - restoreUnusableShown; n > 0 {
		fmt.Fprintf(&b, "; and %d more like these", n)
	}
	switch {
	case e.older == nil:
		b.WriteString(". There is no older commit this spotguard can use; `spotguard list` shows the job's commits")
	case e.older.Commit == "":
		fmt.Fprintf(&b, ". An older commit is restored only when asked for: `spotguard restore --checkpoint %s` restores the newest this spotguard can use; `spotguard list` shows them all",
			e.older.Checkpoint)
	default:
		fmt.Fprintf(&b, ". An older commit is restored only when asked for: `spotguard restore --checkpoint %s --commit %s` restores the newest this spotguard can use; `spotguard list` shows them all",
			e.older.Checkpoint, e.older.Commit)
	}
	return b.String()
}

func (e *restoreUnusableError) Unwrap() error { return ErrUnusableManifest }

// restoreNothingError is the error of a restore with nothing to restore.
type restoreNothingError struct {
	job, url string
	problems int
	// incomplete describes the newest multi-node save waiting for parts, if any.
	incomplete string
	// others are other jobs at the top of the store that have a LATEST (OtherJobs).
	others []string
}

func (e *restoreNothingError) Error() string {
	msg := fmt.Sprintf("no complete checkpoint of job %s in %s", e.job, e.url)
	if e.problems > 0 {
		msg += fmt.Sprintf(" (%d unusable entries skipped; see the log)", e.problems)
	}
	if e.incomplete != "" {
		msg += "; the newest " + e.incomplete
	}
	if len(e.others) > 0 && e.incomplete == "" {
		msg += fmt.Sprintf("; the store holds the checkpoints of other jobs: %s (is store.job the training run's name?", QuoteJobs(e.others))
		if slices.Contains(e.others, "default") {
			msg += ` job "default" is where an agent without store.job committed, before the key was required`
		}
		msg += ")"
	}
	return msg
}

// otherJobsMax bounds the names OtherJobs looks at, and says.
const otherJobsMax = 10

// OtherJobs returns the names at the top of s, other than job's first element, that hold a
// LATEST: jobs a restore that found nothing may have meant (a store.job mistyped, or set anew
// after an upgrade from a version with a default: training restarted from scratch, found from
// outside). The otherJobsMax names closest to job's are looked at (the same but for case first,
// then the longest prefix in common: in a bucket of many jobs, the first ten in the alphabet
// named runs unlike the one meant; found from outside), and returned in that order; none when
// the store cannot be listed.
func OtherJobs(ctx context.Context, s Store, job string) []string {
	dirs, _, err := s.ListDir(ctx, "")
	if err != nil {
		return nil
	}
	own, _, _ := strings.Cut(job, "/")
	dirs = slices.DeleteFunc(slices.Clone(dirs), func(d string) bool { return d == own || ValidName(d) != nil })
	closeness := func(d string) (bool, int) {
		if strings.EqualFold(d, own) {
			return true, len(d)
		}
		n := 0
		for n < len(d) && n < len(own) && d[n] == own[n] {
			n++
		}
		return false, n
	}
	slices.SortStableFunc(dirs, func(a, b string) int {
		fa, na := closeness(a)
		fb, nb := closeness(b)
		switch {
		case fa != fb && fa:
			return -1
		case fa != fb:
			return 1
		}
		return cmp.Or(cmp.Compare(nb, na), strings.Compare(a, b))
	})
	var found []string
	for i, d := range dirs {
		if i == otherJobsMax {
			if len(found) > 0 {
				found = append(found, "…")
			}
			break
		}
		if _, _, err := s.GetBytes(ctx, LatestKey(d)); err == nil || errors.Is(err, ErrTooLarge) {
			found = append(found, d)
		}
	}
	return found
}

// QuoteJobs is names as a message lists them: each quoted (a trailing space, or a comma in a
// name, shows), but the "…" OtherJobs ends with when it looked at no more.
func QuoteJobs(names []string) string {
	q := make([]string, len(names))
	for i, n := range names {
		q[i] = n
		if n != "…" {
			q[i] = strconv.Quote(n)
		}
	}
	return strings.Join(q, ", ")
}

func (e *restoreNothingError) Unwrap() []error {
	if e.incomplete != "" {
		return []error{ErrNothingToRestore, ErrOnlyUncommittedSaves}
	}
	return []error{ErrNothingToRestore}
}

// restorePlaceFile moves the staged file from (inside to) to name, never over anything there: a
// hard link, which fails if name exists, then the staged name goes with the staging directory.
// Where the file system has no hard links, it renames after checking that name is free.
func restorePlaceFile(to *os.Root, from, name string) error {
	err := to.Link(from, name)
	if err == nil || errors.Is(err, fs.ErrExist) {
		return err
	}
	if _, lerr := to.Lstat(name); !errors.Is(lerr, fs.ErrNotExist) {
		return err
	}
	return to.Rename(from, name)
}

// lastWritten is the later of last and t, a modification time, unless t is in the future by
// more than FileTimeLag: a file written now is dated now, so one dated later (a clock set back
// since, a commit of an instance whose clock was ahead restored as it was) is not being written
// (found from outside: the restore unit failed at every boot on such files, "modified -8m55s
// ago: it may be being written"); nor is one dated before booted, when the machine booted (if
// known): nothing writes across a boot.
func lastWritten(last, t, now, booted time.Time) time.Time {
	if t.After(now.Add(FileTimeLag)) || !t.After(last) || (!booted.IsZero() && t.Before(booted)) {
		return last
	}
	return t
}

// agoText says when something modified d ago was: "1m5s ago", or for a time in the future (a
// clock set back since), "1m5s in the future by this clock".
func agoText(d time.Duration) string {
	if d <= -time.Second {
		return (-d).Round(time.Second).String() + " in the future by this clock"
	}
	return d.Round(time.Second).String() + " ago"
}

// incompleteQuiet is how long an incomplete save at To/<checkpoint> must have been left alone
// before a restore moves it aside: one modified more recently may be being written.
const incompleteQuiet = time.Minute

// restoreSave is a save of the checkpoint's name that is at To/<checkpoint> and goes aside as the
// commit is put in its place (restoreAside).
type restoreSave struct {
	kind string      // "incomplete" or "older": in the name it goes to (restoreAsideName)
	fi   fs.FileInfo // what was judged: it goes only if it is still there
	what string      // what the warning says it is
	// noMarker: a directory without the marker at its top (restoreIncomplete); it goes only
	// while the marker is still missing, and is removed instead if it holds nothing.
	noMarker bool
}

// restoreIncomplete returns To/<checkpoint> (inside to) when it is an incomplete save of m's
// name: a directory without the marker m has at its top (a save into that name cut short, on a
// disk that outlived its instance's stop, by a trainer that saves into one directory every time
// or saved that name again). It is not a checkpoint, and nothing of it is committed; it must not
// keep the commit from being restored, so Restore moves it aside (restoreAside) as it puts the
// commit in place. One that was modified less than incompleteQuiet before now (the directory or
// what is at its top) may be being written: an error then. nil, nil: it is not.
func restoreIncomplete(to *os.Root, m *Manifest, marker string, now, booted time.Time) (*restoreSave, error) {
	if m.SingleFile() || !slices.ContainsFunc(m.Files, func(f File) bool { return f.Path == marker }) {
		return nil, nil
	}
	fi, err := to.Lstat(m.Checkpoint)
	if err != nil || !fi.IsDir() {
		return nil, nil // restoreExisting says
	}
	if _, err := to.Lstat(m.Checkpoint + "/" + marker); !errors.Is(err, fs.ErrNotExist) {
		return nil, nil
	}
	dir := filepath.Join(to.Name(), m.Checkpoint)
	latest := lastWritten(time.Time{}, fi.ModTime(), now, booted)
	if names, err := scanReadDir(to, m.Checkpoint); err == nil {
		for _, name := range names {
			if fi, err := to.Lstat(m.Checkpoint + "/" + name); err == nil {
				latest = lastWritten(latest, fi.ModTime(), now, booted)
			}
		}
	}
	if ago := now.Sub(latest); ago < incompleteQuiet {
		return nil, &DestinationExistsError{Path: dir, Recent: true,
			msg: fmt.Sprintf("destination %s holds an incomplete save (no %s at its top), modified %s: it may be being written; not moving it aside",
				dir, marker, agoText(ago))}
	}
	return &restoreSave{kind: "incomplete", fi: fi, noMarker: true,
		what: "an incomplete save of this name was there (no " + marker + " at its top: a save cut short)"}, nil
}

// restoreJudge judges what restoreExisting found at To/<checkpoint> with other content than m,
// the newest commit (of the job, or of the checkpoint asked for), when it is a complete save of
// m's name: nothing but regular files, with the marker at the top of a directory, or the file of
// a single-file checkpoint. That is the trainer's own save (an instance stopped and started again
// with its disk; a trainer that saves into one name every time, a latest/ directory or
// Lightning's last.ckpt), and spotguard-restore.service must not fail on it: with Requires= the
// trainer would not start. It returns:
//   - newer (what it is, in words): it is newer than m: written (its files' latest modification
//     time) after m completed, and not the bytes of another commit of its name (others; their
//     files of node rank *part with a part asked for). The agent had not committed it: the
//     trainer resumes from it and the agent commits it. It is left as it is.
//   - older: it is older than m: the bytes of another commit of its name, or written before m
//     completed; or some of m's own files and nothing else (a node's part of a multi-node
//     checkpoint restored whole, files the trainer deleted since), an incomplete copy of m. It
//     goes aside as m is put in place, unless it was modified less than incompleteQuiet before
//     now (it may be being written): an error then.
//   - neither, nil: it is no such save; restoreExisting's error stands.
func restoreJudge(ctx context.Context, to *os.Root, m *Manifest, others []*Manifest, part *int, marker string, now, booted time.Time) (newer string, older *restoreSave, _ error) {
	fi, err := to.Lstat(m.Checkpoint)
	if err != nil {
		return "", nil, nil
	}
	type local struct {
		size int64
		sums map[string]Checksum // by algorithm
	}
	files := map[string]*local{}
	written := fi.ModTime()
	// recent is the last write that may be now's (lastWritten).
	recent := lastWritten(time.Time{}, written, now, booted)
	var newest string      // the file modified last, in a directory
	var markerAt time.Time // its marker's modification time
	root := to
	switch {
	case m.SingleFile() && fi.Mode().IsRegular():
		files[m.Files[0].Path] = &local{size: fi.Size()}
	case !m.SingleFile() && fi.IsDir():
		dir, err := to.OpenRoot(m.Checkpoint)
		if err != nil {
			return "", nil, nil
		}
		defer func() { _ = dir.Close() }() // a directory handle: nothing to flush
		root, written, recent = dir, time.Time{}, time.Time{}
		found, err := restoreLocalFiles(dir)
		if err != nil {
			return "", nil, nil // no save
		}
		for _, l := range found {
			files[l.path] = &local{size: l.fi.Size()}
			if l.fi.ModTime().After(written) {
				written, newest = l.fi.ModTime(), l.path
			}
			recent = lastWritten(recent, l.fi.ModTime(), now, booted)
			if l.path == marker {
				markerAt = l.fi.ModTime()
			}
		}
		if files[marker] == nil {
			return "", nil, nil
		}
	default:
		return "", nil, nil
	}
	name := filepath.Join(to.Name(), m.Checkpoint)
	at := func(t time.Time) string { return t.UTC().Format(time.RFC3339) }
	sum := func(l *local, p, alg string) (Checksum, error) {
		if got, ok := l.sums[alg]; ok {
			return got, nil
		}
		if err := ctx.Err(); err != nil {
			return Checksum{}, err
		}
		got, _, err := restoreChecksumFile(root, p, alg)
		if err != nil {
			return Checksum{}, fmt.Errorf("inspect existing destination: %w", err)
		}
		if l.sums == nil {
			l.sums = map[string]Checksum{}
		}
		l.sums[alg] = got
		return got, nil
	}
	// Some of m's own files and nothing else (a node's part of a multi-node checkpoint restored
	// whole, files the trainer deleted since): m is all of it.
	kind, what, held := "older", "", ""
	if !markerAt.IsZero() && written.After(markerAt) {
		// A file modified after the marker: a save into the name again (over a restored copy,
		// or the trainer's own last save) cut short before its marker was written again, the
		// files of two saves mixed. No save, whatever its times: an incomplete one, as the agent
		// takes it (its marker no longer vouches for it).
		kind, what = "incomplete", fmt.Sprintf("a save written into this name after its marker was there (%s modified %s, after its marker, %s): its marker does not vouch for it",
			newest, at(written), at(markerAt))
		held = "a save written into this name after its marker"
	}
	if len(files) < len(m.Files) && what == "" {
		var in []File // m's files that are there, with their sizes
		for _, f := range m.Files {
			if l := files[f.Path]; l != nil && l.size == f.Size {
				in = append(in, f)
			}
		}
		copyOf := len(in) == len(files) // nothing else
		for _, f := range in {
			if !copyOf {
				break
			}
			got, err := sum(files[f.Path], f.Path, f.Checksum.Algorithm)
			if err != nil {
				return "", nil, err
			}
			copyOf = got == f.Checksum
		}
		if copyOf {
			kind, what = "incomplete", fmt.Sprintf("an incomplete copy of commit %s was there (%d of its %d files, the rest missing)", m.Commit, len(files), len(m.Files))
		}
	}
	for _, o := range others {
		if what != "" {
			break
		}
		want := o.Files
		if part != nil && o.Parts != nil {
			want = o.PartFiles(*part) // as restored
		}
		if len(want) != len(files) || slices.ContainsFunc(want, func(f File) bool { l := files[f.Path]; return l == nil || l.size != f.Size }) {
			continue
		}
		same := true
		for _, f := range want {
			got, err := sum(files[f.Path], f.Path, f.Checksum.Algorithm)
			if err != nil {
				return "", nil, err
			}
			if got != f.Checksum {
				same = false
				break
			}
		}
		if same {
			what = fmt.Sprintf("an older save of this name was there: the bytes of its commit %s (completed %s), before commit %s (completed %s)",
				o.Commit, at(o.Order().At), m.Commit, at(m.Order().At))
			break
		}
	}
	// m's completion by the clock of the instance that wrote it, which is the clock of the local
	// save's times when it wrote both (an instance stopped and started with its disk): not its
	// order, moved after a commit from a clock ahead (found from outside: the save made after it
	// was called older, moved aside, and the trainer resumed one save back).
	completed := m.Order().At
	if h := m.Timings.CompleteAtHere; h != nil {
		completed = *h
	}
	switch {
	case what == "" && written.After(completed):
		return fmt.Sprintf("a newer save of this name is there (written %s, after commit %s completed, %s)", at(written), m.Commit, at(completed)), nil, nil
	case what == "":
		what = fmt.Sprintf("an older save of this name was there (written %s, before commit %s completed, %s)", at(written), m.Commit, at(completed))
	}
	if ago := now.Sub(recent); ago < incompleteQuiet {
		if held == "" {
			held = map[string]string{"older": "an older save of this name than commit " + m.Commit, "incomplete": "an incomplete copy of commit " + m.Commit}[kind]
		}
		return "", nil, &DestinationExistsError{Path: name, Recent: true,
			msg: fmt.Sprintf("destination %s holds %s, modified %s: it may be being written; not moving it aside", name, held, agoText(ago))}
	}
	return "", &restoreSave{kind: kind, fi: fi, what: what}, nil
}

// restoreAside moves the save at To/<checkpoint> (restoreIncomplete, restoreJudge) aside, if it
// is still there (a concurrent restore may have put the commit there since), and says where it
// went (res.MovedAside, a warning) before the commit goes in its place: a restore killed in
// between leaves it there, said. One without its marker that holds nothing is removed instead. It
// returns place made to move it back if placing the commit fails.
func restoreAside(to *os.Root, m *Manifest, save *restoreSave, marker string, now time.Time, place func() error, res *RestoreResult, log zerolog.Logger) (func() error, error) {
	if fi, err := to.Lstat(m.Checkpoint); err != nil || !os.SameFile(fi, save.fi) {
		return place, nil // gone, or another in its place: place says
	}
	if save.noMarker {
		if _, err := to.Lstat(m.Checkpoint + "/" + marker); !errors.Is(err, fs.ErrNotExist) || to.Remove(m.Checkpoint) == nil {
			return place, nil
		}
	}
	aside := restoreAsideName(save.kind, m.Checkpoint, now)
	for n := 2; ; n++ {
		// Taken by a save moved aside in the same second (restores one after another): a
		// rename would replace a file there (lost) or fail on a directory. (Two restores
		// racing for one name between this look and the rename is left to the rename.)
		if _, err := to.Lstat(aside); errors.Is(err, fs.ErrNotExist) {
			break
		}
		aside = restoreAsideName(save.kind, m.Checkpoint, now) + "-" + strconv.Itoa(n)
	}
	switch err := to.Rename(m.Checkpoint, aside); {
	case errors.Is(err, fs.ErrNotExist):
		return place, nil
	case err != nil:
		return nil, fmt.Errorf("move the %s save %s aside: %w", save.kind, filepath.Join(to.Name(), m.Checkpoint), err)
	}
	res.MovedAside, res.MovedAsideKind = filepath.Join(to.Name(), aside), save.kind
	log.Warn().Str("checkpoint", m.Checkpoint).Str("moved_to", res.MovedAside).
		Msg(save.what + "; moved aside, kept for you to look at, and never uploaded: delete it when done")
	return func() error {
		err := place()
		if err != nil && to.Rename(aside, m.Checkpoint) == nil { // untouched on error, as far as it can be
			log.Info().Str("checkpoint", m.Checkpoint).Msg("the save moved aside is back in place: the commit could not be put there")
			res.MovedAside, res.MovedAsideKind = "", ""
		}
		return err
	}, nil
}

// MovedAside reports whether name, in a restore's destination, is a save a restore moved aside
// (restoreAsideName): an incomplete save, or an older one, of a checkpoint's name that it put a
// commit in place of.
func MovedAside(name string) bool {
	return strings.HasPrefix(name, ".spotguard-incomplete-") || strings.HasPrefix(name, ".spotguard-older-")
}

// restoreAsideName is the name a save of checkpoint name is moved to, by its kind (incomplete,
// older; restoreSave): spotguard's own (".spotguard-", never uploaded, never looked at by the trainer's glob), with the time.
func restoreAsideName(kind, name string, now time.Time) string {
	const most = 200 // NAME_MAX is 255 bytes
	if len(name) > most {
		name = strings.ToValidUTF8(name[:most], "")
	}
	return ".spotguard-" + kind + "-" + name + "-" + now.UTC().Format("20060102T150405Z")
}

// existsError is a *DestinationExistsError for path saying what fmt.Sprintf(format, args) says.
func existsError(path, format string, args ...any) error {
	return &DestinationExistsError{Path: path, msg: fmt.Sprintf(format, args...)}
}

// DestinationExistsError is Restore's error when something else is already at Path, where the
// checkpoint goes (To/<checkpoint>); it wraps ErrDestinationExists.
type DestinationExistsError struct {
	Path string
	// Recent: what is there is a save that would be moved aside, an incomplete one or an older
	// one of the checkpoint's name, but it was modified too recently: it may be being written
	// (see restoreIncomplete, restoreJudge).
	Recent bool
	// NoMarker is the marker restore looked for when the commit has none at its top
	// (checkpoint.marker not the agent's): what is there could not be judged a save of the name.
	NoMarker string
	msg      string
}

func (e *DestinationExistsError) Error() string { return e.msg }

// restoreNoMarker adds to err, what is at a checkpoint's place that restoreJudge could not judge,
// that the commit m has no marker at its top when that is why: a restore whose checkpoint.marker
// is not the agent's (a DCP save's .metadata) cannot tell a save of the name from anything else.
func restoreNoMarker(err error, m *Manifest, marker string) error {
	de, ok := errors.AsType[*DestinationExistsError](err)
	if !ok || m.SingleFile() || slices.ContainsFunc(m.Files, func(f File) bool { return f.Path == marker }) {
		return err
	}
	var top []string
	for _, f := range m.Files {
		if !strings.Contains(f.Path, "/") && len(top) < 5 {
			top = append(top, f.Path)
		}
	}
	cp := *de
	cp.NoMarker = marker
	cp.msg = fmt.Sprintf("%s; and the commit has no %s (checkpoint.marker) at its top, so a save of its name there cannot be told from other content: is checkpoint.marker the agent's? (at the commit's top: %s)",
		de.msg, marker, strings.Join(top, ", "))
	return &cp
}
func (e *DestinationExistsError) Unwrap() error { return ErrDestinationExists }

// restoreExisting reports whether To/<checkpoint> (inside to) holds exactly m's files. It
// returns:
//   - false, nil: there is nothing at To/<checkpoint>;
//   - true, nil: it is a directory holding exactly m's files (regular files with m's sizes and
//     checksums; directories without files do not count), or for a single-file checkpoint
//     (Manifest.SingleFile) the file itself, with its size and checksum;
//   - false, an error: it exists but differs (the error says how, and that it is not
//     overwritten), or it could not be read, or ctx ended.
func restoreExisting(ctx context.Context, to *os.Root, m *Manifest, conc int) (bool, error) {
	fi, err := to.Lstat(m.Checkpoint)
	switch {
	case errors.Is(err, fs.ErrNotExist):
		return false, nil
	case err != nil:
		return false, fmt.Errorf("inspect existing destination: %w", err)
	case m.SingleFile() && !fi.Mode().IsRegular():
		return false, existsError(filepath.Join(to.Name(), m.Checkpoint), "destination %s exists and is not a regular file (%s); not overwriting it",
			filepath.Join(to.Name(), m.Checkpoint), typeWords(fi.Mode()))
	case m.SingleFile():
		f := m.Files[0]
		got, size, err := restoreChecksumFile(to, f.Path, f.Checksum.Algorithm)
		switch {
		case err != nil:
			return false, fmt.Errorf("inspect existing destination: %w", err)
		case size != f.Size || got != f.Checksum:
			return false, existsError(filepath.Join(to.Name(), m.Checkpoint), "destination %s exists with other content (%d bytes, checksum %s %s; the checkpoint's has %d, %s %s); not overwriting it",
				filepath.Join(to.Name(), m.Checkpoint), size, got.Algorithm, got.Value, f.Size, f.Checksum.Algorithm, f.Checksum.Value)
		}
		return true, nil
	case !fi.IsDir():
		return false, existsError(filepath.Join(to.Name(), m.Checkpoint), "destination %s exists and is not a directory (%s); not overwriting it",
			filepath.Join(to.Name(), m.Checkpoint), typeWords(fi.Mode()))
	}
	dir, err := to.OpenRoot(m.Checkpoint)
	if err != nil {
		return false, fmt.Errorf("open existing destination: %w", err)
	}
	defer func() { _ = dir.Close() }() // a directory handle: nothing to flush
	differs := func(format string, args ...any) (bool, error) {
		return false, existsError(filepath.Join(to.Name(), m.Checkpoint), "destination %s exists with other content (%s); not overwriting it",
			filepath.Join(to.Name(), m.Checkpoint), fmt.Sprintf(format, args...))
	}

	want := make(map[string]File, len(m.Files))
	for _, f := range m.Files {
		want[f.Path] = f
	}
	local, err := restoreLocalFiles(dir)
	if err != nil {
		return differs("%v", err)
	}
	have := make([]string, 0, len(local))
	for _, l := range local {
		if _, ok := want[l.path]; !ok {
			return differs("file %q is not in the checkpoint", l.path)
		}
		have = append(have, l.path)
	}
	if len(have) != len(want) {
		for _, f := range m.Files {
			if !slices.Contains(have, f.Path) {
				return differs("file %q is missing", f.Path)
			}
		}
	}

	g, gctx := errgroup.WithContext(ctx)
	g.SetLimit(conc)
	for _, f := range m.Files {
		g.Go(func() error {
			if err := gctx.Err(); err != nil {
				return err
			}
			got, size, err := restoreChecksumFile(dir, f.Path, f.Checksum.Algorithm)
			switch {
			case err != nil:
				return err
			case size != f.Size:
				return fmt.Errorf("file %q has %d bytes; the checkpoint's has %d", f.Path, size, f.Size)
			case got != f.Checksum:
				return fmt.Errorf("file %q has checksum %s %s; the checkpoint's has %s %s",
					f.Path, got.Algorithm, got.Value, f.Checksum.Algorithm, f.Checksum.Value)
			}
			return nil
		})
	}
	if err := g.Wait(); err != nil {
		if ctx.Err() != nil {
			return false, ctx.Err()
		}
		return differs("%v", err)
	}
	return true, nil
}

// restoreLocalFile is a regular file below a directory at the destination, by its slash-separated
// path there.
type restoreLocalFile struct {
	path string
	fi   fs.FileInfo
}

// restoreLocalFiles lists the regular files below dir, in lexical order; anything else there but
// directories (a symbolic link, a device) is an error naming it.
func restoreLocalFiles(dir *os.Root) ([]restoreLocalFile, error) {
	var out []restoreLocalFile
	err := fs.WalkDir(dir.FS(), ".", func(p string, d fs.DirEntry, err error) error {
		switch {
		case err != nil:
			return err
		case d.IsDir():
			return nil
		case !d.Type().IsRegular():
			return fmt.Errorf("%q is not a regular file (%s)", p, typeWords(d.Type()))
		}
		fi, err := d.Info()
		if err != nil {
			return err
		}
		out = append(out, restoreLocalFile{path: p, fi: fi})
		return nil
	})
	return out, err
}

// restoreChecksumFile returns the checksum with algorithm alg (checksumAs) and size of the file
// rel (slash-separated) in dir.
func restoreChecksumFile(dir *os.Root, rel, alg string) (Checksum, int64, error) {
	f, err := dir.Open(filepath.FromSlash(rel))
	if err != nil {
		return Checksum{}, 0, err
	}
	defer f.Close()
	fi, err := f.Stat()
	if err != nil {
		return Checksum{}, 0, err
	}
	sum, err := checksumAs(alg, f)
	if err != nil {
		return Checksum{}, 0, fmt.Errorf("read %q: %w", rel, err)
	}
	return sum, fi.Size(), nil
}

// restoreStage creates a staging directory in to, locked (restoreMkStaging), downloads and
// verifies m's files into it and fsyncs them and its directories. It returns the staging
// directory's name (relative to to) and the function that releases its lock, which the caller
// calls once the directory has been renamed or removed; or an error after removing it.
func restoreStage(ctx context.Context, s Store, to *os.Root, m *Manifest, conc int, marker string, progress func(done, total int64), run *restoreRun) (string, func(), error) {
	log := run.log
	hurry(s) // the instance waits for its checkpoint
	name, release, err := restoreMkStaging(to, log)
	if err != nil {
		return "", nil, err
	}
	staged := false
	defer func() {
		if staged {
			return
		}
		if err := to.RemoveAll(name); err != nil {
			log.Warn().Err(err).Str("dir", filepath.Join(to.Name(), name)).Msg("cannot remove the staging directory")
		}
		release()
	}()
	stage, err := to.OpenRoot(name)
	if err != nil {
		return "", nil, fmt.Errorf("open staging directory: %w", err)
	}
	defer func() { _ = stage.Close() }() // a directory handle: nothing to flush

	// Directories first, in order (a parent sorts before its children), so that the
	// downloads do not race to create them.
	dirs := restoreDirs(m)
	for _, d := range dirs {
		if err := stage.MkdirAll(filepath.FromSlash(d), 0o755); err != nil {
			return "", nil, fmt.Errorf("create directory %q: %w", d, err)
		}
	}

	var prog *restoreProgress
	if progress != nil {
		prog = &restoreProgress{fn: progress, total: m.TotalBytes}
		prog.add(0)
	}
	if marker == "" {
		marker = scanDefaultMarker
	}
	// The marker last: a staging directory left by a killed restore never holds it beside files
	// not all there and verified (a trainer that looks for it itself would take it for whole).
	isMarker := func(f File) bool { return f.Path == marker && !m.SingleFile() }
	// The files' times: when the commit completed, but never after now (found from outside: a
	// commit by an instance whose clock was ahead dated every restored file in the future, so a
	// save into the directory after its marker, cut short, had files older than the marker, and
	// was committed torn after a reboot).
	restoredTime := m.Order().At
	if now := time.Now(); restoredTime.After(now) {
		restoredTime = now
	}
	for _, last := range []bool{false, true} {
		g, gctx := errgroup.WithContext(ctx)
		g.SetLimit(conc)
		for _, f := range m.Files {
			if isMarker(f) != last {
				continue
			}
			g.Go(func() error {
				return restoreFile(gctx, s, stage, m.FileKey(f), f, restoredTime, prog, run)
			})
		}
		if err := g.Wait(); err != nil {
			return "", nil, err
		}
	}
	for _, d := range slices.Backward(append([]string{"."}, dirs...)) {
		if err := restoreSyncDir(stage, filepath.FromSlash(d)); err != nil {
			return "", nil, err
		}
		// The directories last, deepest first: until then the trainer's user cannot change
		// what is in them (a name replaced by a link to a file of root's, chowned in its place).
		run.chownDir(stage, filepath.FromSlash(d))
	}
	staged = true
	return name, release, nil
}

// errRestoreStagingTaken says that a staging directory just made was locked or removed by
// another restore before this one could lock it.
var errRestoreStagingTaken = errors.New("staging directory taken by another restore")

// restoreMkStagingTries bounds how often restoreMkStaging makes a staging directory that another
// restore takes before it is locked.
const restoreMkStagingTries = 3

// restoreMkStaging creates a staging directory in to, .spotguard-restore-<pid>-<random>, and
// locks it (restoreLockStaging) for as long as it exists; another restore, in this PID namespace
// or another (a container sharing the volume), never takes it for a killed restore's while the
// lock is held. It returns the directory's name and the function that releases the lock.
func restoreMkStaging(to *os.Root, log zerolog.Logger) (string, func(), error) {
	for try := 1; ; try++ {
		name := fmt.Sprintf("%s%d-%s", restoreStagingPrefix, os.Getpid(), rand.Text())
		if err := to.Mkdir(name, 0o755); err != nil {
			return "", nil, fmt.Errorf("create staging directory: %w", err)
		}
		release, err := restoreLockStaging(to, name, log)
		switch {
		case err == nil:
			return name, release, nil
		case errors.Is(err, errRestoreStagingTaken) && try < restoreMkStagingTries:
			continue // the restore that took it removes it
		case errors.Is(err, errRestoreStagingTaken):
			return "", nil, fmt.Errorf("create staging directory: %w %d times; is a restore running in a loop?", err, try)
		}
		if rerr := to.RemoveAll(name); rerr != nil {
			log.Warn().Err(rerr).Str("dir", filepath.Join(to.Name(), name)).Msg("cannot remove the staging directory")
		}
		return "", nil, fmt.Errorf("lock staging directory: %w", err)
	}
}

// restoreStaleState is what restoreLockStale found out about a staging directory.
type restoreStaleState int

const (
	restoreStaleFree    restoreStaleState = iota // locked now by the caller: its restore is gone
	restoreStaleHeld                             // a running restore holds it
	restoreStaleUnknown                          // cannot be locked here: go by its pid
)

// restoreRemoveStale removes the staging directories in to that a restore killed mid-way left
// behind: those named as restoreMkStaging names them (restoreStagingPID) that no restore holds,
// which it can lock itself without waiting (restoreLockStale; a running restore, in any PID
// namespace, holds the lock on its own); where locks cannot tell (not Linux, a file system
// without flock), those whose pid names no process. Anything else at such a name (a symlink, a
// file: a restore never makes one) is removed too, never followed. Failures are logged; they do
// not stop the restore.
func restoreRemoveStale(to *os.Root, log zerolog.Logger) {
	names, err := scanReadDir(to, ".")
	if err != nil {
		return
	}
	for _, name := range names {
		pid, ok := restoreStagingPID(name)
		if !ok {
			continue // not a staging directory's name (the user's own)
		}
		release := func() {}
		fi, err := to.Lstat(name)
		switch {
		case errors.Is(err, fs.ErrNotExist):
			continue // removed by another restore meanwhile
		case err == nil && fi.IsDir():
			unlock, state := restoreLockStale(to, name)
			switch {
			case state == restoreStaleHeld:
				continue // its restore runs
			case state == restoreStaleUnknown && processAlive(pid):
				continue // its restore may run
			case state == restoreStaleFree:
				release = unlock
			}
		}
		err = to.RemoveAll(name)
		release()
		if err != nil {
			log.Warn().Err(err).Str("dir", filepath.Join(to.Name(), name)).Msg("cannot remove a killed restore's staging directory")
			continue
		}
		log.Info().Str("dir", filepath.Join(to.Name(), name)).Msg("removed a killed restore's staging directory")
	}
}

// restoreStagingPID returns the pid in name if name is a staging directory's, as restoreStage
// makes it: restoreStagingPrefix, a pid, "-" and rand.Text()'s 26 base32 characters. A name that
// only starts like one (".spotguard-restore-notes") is not.
func restoreStagingPID(name string) (int, bool) {
	rest, ok := strings.CutPrefix(name, restoreStagingPrefix)
	if !ok {
		return 0, false
	}
	pidText, random, ok := strings.Cut(rest, "-")
	pid, err := strconv.Atoi(pidText)
	if !ok || err != nil || pid <= 0 || strconv.Itoa(pid) != pidText || len(random) != 26 ||
		strings.TrimLeft(random, "ABCDEFGHIJKLMNOPQRSTUVWXYZ234567") != "" {
		return 0, false
	}
	return pid, true
}

// processAlive reports whether a process with this pid exists.
func processAlive(pid int) bool {
	err := syscall.Kill(pid, 0)
	return err == nil || errors.Is(err, syscall.EPERM)
}

// restoreDirs returns every directory that m's files need, sorted, without ".".
func restoreDirs(m *Manifest) []string {
	seen := map[string]bool{}
	for _, f := range m.Files {
		for d := path.Dir(f.Path); d != "." && !seen[d]; d = path.Dir(d) {
			seen[d] = true
		}
	}
	dirs := make([]string, 0, len(seen))
	for d := range seen {
		dirs = append(dirs, d)
	}
	slices.Sort(dirs)
	return dirs
}

// restoreAllocate is allocateFile; a variable for tests.
var restoreAllocate = allocateFile

// allocatingWriter writes to f, whose size bytes (allocateFile) it allocates at its first write.
type allocatingWriter struct {
	f    *os.File
	size int64
	path string
	once sync.Once
	err  error
}

func (a *allocatingWriter) WriteAt(p []byte, off int64) (int, error) {
	a.once.Do(func() {
		if err := restoreAllocate(a.f, a.size); err != nil {
			a.err = fmt.Errorf("allocate file %q (%d bytes): %w", a.path, a.size, err)
		}
	})
	if a.err != nil {
		return 0, a.err
	}
	return a.f.WriteAt(p, off)
}

// restoreFile downloads key into the new file f.Path in stage, fsyncs it and checks its size and
// CRC-32C, read back from disk, against f. A file whose checksum does not match is downloaded
// once more, over the same file: bytes damaged on their way (a proxy, a flipped bit in a NIC) are
// no damage in the store, and only a second mismatch makes the error wrap ErrDamaged. Its
// modification time is completed, when its commit completed.
func restoreFile(ctx context.Context, s Store, stage *os.Root, key string, f File, completed time.Time, prog *restoreProgress, run *restoreRun) error {
	out, err := stage.OpenFile(filepath.FromSlash(f.Path), os.O_RDWR|os.O_CREATE|os.O_EXCL, 0o644)
	if err != nil {
		return fmt.Errorf("create file %q: %w", f.Path, err)
	}
	defer out.Close()
	// Its space is allocated at the first write, once the download has found the object of
	// the size the manifest says (found from outside: a manifest that said 2 GiB for an object
	// of 6 bytes took 2 GiB of the disk before the download said it was damaged).
	var w io.WriterAt = &allocatingWriter{f: out, size: f.Size, path: f.Path}
	if prog != nil {
		w = &restoreCountingWriter{w: w, prog: prog, size: f.Size}
	}
	var first Checksum
	for attempt := 1; ; attempt++ {
		err := run.retry(ctx, "file", func(ctx context.Context) error { return s.Download(ctx, key, w, f.Size) })
		if err != nil {
			if errors.Is(err, ErrNotFound) {
				return fmt.Errorf("download file %q: %w: %w", f.Path, ErrDamaged, err)
			}
			return fmt.Errorf("download file %q: %w", f.Path, err)
		}
		if err := out.Sync(); err != nil {
			return fmt.Errorf("sync file %q: %w", f.Path, err)
		}
		fi, err := out.Stat()
		if err != nil {
			return fmt.Errorf("stat file %q: %w", f.Path, err)
		}
		if fi.Size() != f.Size {
			return fmt.Errorf("%w: file %q: %d bytes after download; the manifest says %d", ErrDamaged, f.Path, fi.Size(), f.Size)
		}
		got, err := checksumAs(f.Checksum.Algorithm, io.NewSectionReader(out, 0, f.Size))
		if err != nil {
			return fmt.Errorf("read back file %q: %w", f.Path, err)
		}
		if got == f.Checksum {
			break
		}
		if attempt == restoreChecksumTries {
			return fmt.Errorf("%w: file %q: checksum mismatch in two downloads: the manifest says %s %s; the first download had %s, the second %s",
				ErrDamaged, f.Path, f.Checksum.Algorithm, f.Checksum.Value, first.Value, got.Value)
		}
		first = got
		run.warn(func(log zerolog.Logger) {
			log.Warn().Str("file", f.Path).Str("key", key).Str("want", f.Checksum.Value).Str("got", got.Value).
				Msg("a downloaded file failed its checksum; downloading it again")
		})
	}
	if err := out.Chmod(f.Perm()); err != nil {
		return fmt.Errorf("set mode of file %q: %w", f.Path, err)
	}
	// Its modification time is when its commit completed, not now: a restored copy of a commit
	// is not a newer save than a commit that completed before the restore (restoreJudge, and the
	// agent's order of a checkpoint whose commit retention deleted: completedAt). Before the
	// chown, as the mode; through the staging directory, which only root can change yet.
	if err := stage.Chtimes(filepath.FromSlash(f.Path), completed, completed); err != nil {
		return fmt.Errorf("set modification time of file %q: %w", f.Path, err)
	}
	// After the mode (permission bits only: a chown would clear no set-id bit), which a root
	// without CAP_FOWNER, as in the spotguard-restore unit, can no longer set once it is not
	// the file's owner; through the file itself, never its name.
	run.chown(out)
	if err := out.Close(); err != nil {
		return fmt.Errorf("close file %q: %w", f.Path, err)
	}
	return nil
}

// restoreChecksumTries is how often restoreFile downloads a file whose checksum does not match.
const restoreChecksumTries = 2

// restoreRun is what the reads of one restore share: its log, which they write one line at a
// time (the caller's writer need not be safe for concurrent use), and the outage they retry
// through (retry).
type restoreRun struct {
	log zerolog.Logger
	// owner, if not nil, is whom the files and directories the restore writes are made to
	// belong to (restoreOwnerOf).
	owner *restoreOwner
	// dirOwner is RestoreOptions.DirOwner.
	dirOwner *int

	mu           sync.Mutex // guards the log's writes and what follows
	failing      int        // reads that failed and are being retried
	failingSince time.Time  // when failing last went from 0 to 1
	slowSaid     bool       // a read unanswered for restoreSlowRead was said (watchSlow)
}

// restoreOwner is a user and group that a restore makes what it writes belong to.
type restoreOwner struct {
	uid, gid int
	failed   bool // a chown failed, and was logged: the rest are not tried
}

// restoreOwnerOf returns the owner of the destination to when the restore runs as root and to
// belongs to another user (the trainer's checkpoint.dir): a restore as root (the
// spotguard-restore unit) then makes the files and directories it writes belong to that user
// and group, as if the trainer had written them. The trainer can then read the files it saved
// as 0600 (tempfile.mkstemp) and delete the checkpoints it rotates away, and the agent, which
// never uploads what the owner of checkpoint.dir could not read, finds the restored checkpoint
// whole. It returns nil otherwise: what is written belongs to this user.
func restoreOwnerOf(to *os.Root) *restoreOwner {
	if os.Geteuid() != 0 {
		return nil
	}
	fi, err := to.Stat(".")
	if err != nil {
		return nil
	}
	st, ok := fileStat(fi)
	if !ok || st.uid == 0 {
		return nil
	}
	return &restoreOwner{uid: int(st.uid), gid: int(st.gid)}
}

// restoreLinkCheck refuses, when the restore runs as root, a destination to whose path passes
// through a symbolic link that a user other than root owns, to a directory that is not that
// user's: that user could point it anywhere (at /etc/systemd/system), and root would write the
// checkpoint's directories and files there, with names and bytes the trainer chose (found from
// outside). The agent counts such a link's owner as the owner of checkpoint.dir
// (scanOwnerOfPath); a link of the trainer's to a directory of its own is fine. The nearest
// directory of to that exists is what is looked at.
func restoreLinkCheck(to string) error {
	if os.Geteuid() != 0 {
		return nil
	}
	abs, err := filepath.Abs(to)
	if err != nil {
		return nil
	}
	base := abs
	fi, err := os.Stat(base)
	for errors.Is(err, fs.ErrNotExist) && filepath.Dir(base) != base {
		base = filepath.Dir(base)
		fi, err = os.Stat(base)
	}
	if err != nil {
		return nil // the restore says what is wrong with it
	}
	link, o := userLinkOnPath(base)
	if link == "" {
		return nil
	}
	if st, ok := fileStat(fi); ok && st.uid == o.uid {
		return nil
	}
	real, err := filepath.EvalSymlinks(base)
	if err != nil {
		real = base
	}
	return fmt.Errorf("destination %s passes through the symbolic link %s, which uid %d owns, to %s, which is not that user's: "+
		"a restore as root does not write where another user's link points (give the real path, or make the directory that user's)",
		to, link, o.uid, real)
}

// restoreOpenedCheck refuses, when the restore runs as root, the destination directory opened
// as to (the one every file is written through) when it is root's while a user other than root
// owns something on the path to it, a directory or a link: that user could have pointed the path
// there between restoreLinkCheck and the open (found from outside: a directory swapped for a link
// to a root directory while restores ran got root's files in 16 of 100). A destination of that
// user's own gets the files as that user's (restoreOwnerOf).
func restoreOpenedCheck(dest string, to *os.Root) error {
	if os.Geteuid() != 0 {
		return nil
	}
	fi, err := to.Stat(".")
	if err != nil {
		return nil
	}
	if st, ok := fileStat(fi); !ok || st.uid != 0 {
		return nil
	}
	abs, err := filepath.Abs(dest)
	if err != nil {
		return nil
	}
	if p, o := userOnPath(abs, func(fs.FileInfo) bool { return true }); p != "" {
		return fmt.Errorf("destination %s is root's, but %s on its path is uid %d's, who could point the path elsewhere: "+
			"a restore as root does not write there (make the destination that user's, or give a path only root controls)", dest, p, o.uid)
	}
	return nil
}

// userLinkOnPath returns the first symbolic link on the path abs that a user other than root
// owns, and its owner; "" if there is none.
func userLinkOnPath(abs string) (string, scanOwner) {
	return userOnPath(abs, func(li fs.FileInfo) bool { return li.Mode()&fs.ModeSymlink != 0 })
}

// userOnPath returns the first element of the path abs (each prefix as Lstat sees it) that kind
// accepts and a user other than root owns, and its owner; "" if there is none.
func userOnPath(abs string, kind func(fs.FileInfo) bool) (string, scanOwner) {
	p := string(filepath.Separator)
	for _, el := range strings.Split(abs, string(filepath.Separator)) {
		if el == "" {
			continue
		}
		p = filepath.Join(p, el)
		li, err := os.Lstat(p)
		if err != nil || !kind(li) {
			continue
		}
		if o := scanOwnerOf(li); o.uid != 0 {
			return p, o
		}
	}
	return "", scanOwner{}
}

// danglingLinkOn returns the first symbolic link on dir's path (dir itself included) that leads
// nowhere, and where it leads; "" if none does.
func danglingLinkOn(dir string) (link, target string) {
	dir = filepath.Clean(dir)
	var path []string
	for p := dir; ; p = filepath.Dir(p) {
		path = append(path, p)
		if filepath.Dir(p) == p {
			break
		}
	}
	for _, p := range slices.Backward(path) {
		fi, err := os.Lstat(p)
		if err != nil || fi.Mode()&fs.ModeSymlink == 0 {
			continue
		}
		if _, err := os.Stat(p); errors.Is(err, fs.ErrNotExist) {
			t, _ := os.Readlink(p)
			return p, t
		}
	}
	return "", ""
}

// restoreMkdirAll creates dir and the parents it lacks, as os.MkdirAll does. Run as root, the
// directories it creates belong to the owner (and group) of the nearest directory above them
// that exists, as if that user had made them, unless that is root: `sudo spotguard restore --to
// /home/ubuntu/ckpt` on a new instance leaves a ckpt the trainer (ubuntu) can save into, and
// [restoreOwnerOf] then gives it the restored files too. Where that directory is root's (a
// disk's mount point), they belong to run.dirOwner (trainer.user) when it is set, else to root. Each directory is created and given
// away through a handle below that existing directory, and only when it is still the empty
// directory of root's just made: a user who swaps a name for a link meanwhile gets nothing
// outside the directory it owns.
func restoreMkdirAll(dir string, run *restoreRun) error {
	if os.Geteuid() != 0 {
		return os.MkdirAll(dir, 0o755)
	}
	base, missing := filepath.Clean(dir), []string(nil)
	for {
		fi, err := os.Stat(base)
		if err == nil {
			if !fi.IsDir() {
				return os.MkdirAll(dir, 0o755) // which says what is in the way
			}
			break
		}
		parent := filepath.Dir(base)
		if !errors.Is(err, fs.ErrNotExist) || parent == base {
			return os.MkdirAll(dir, 0o755)
		}
		missing, base = append(missing, filepath.Base(base)), parent
	}
	if len(missing) == 0 {
		return nil
	}
	fi, err := os.Stat(base)
	if err != nil {
		return err
	}
	st, ok := fileStat(fi)
	if !ok {
		return os.MkdirAll(dir, 0o755)
	}
	owner := &restoreOwner{uid: int(st.uid), gid: int(st.gid)}
	if st.uid == 0 {
		if run.dirOwner == nil || *run.dirOwner == 0 {
			return os.MkdirAll(dir, 0o755)
		}
		// Root's (a disk's mount point): the trainer's user, so that it can save there.
		// A uid this system has no user of (a container's remapped one, 100000) gets its own
		// number as its group, as user namespaces map them, not root's (found from outside).
		owner = &restoreOwner{uid: *run.dirOwner, gid: primaryGroup(*run.dirOwner, *run.dirOwner)}
	}
	root, err := os.OpenRoot(base)
	if err != nil {
		return err
	}
	defer func() { _ = root.Close() }() // a directory handle: nothing to flush
	rel := ""
	for i := len(missing) - 1; i >= 0; i-- {
		rel = filepath.Join(rel, missing[i])
		if err := root.Mkdir(rel, 0o755); err != nil {
			if errors.Is(err, fs.ErrExist) {
				continue // made meanwhile by someone else: theirs
			}
			return err
		}
		if err := restoreGiveDir(root, rel, owner); err != nil {
			run.warn(func(log zerolog.Logger) {
				log.Warn().Err(err).Str("dir", filepath.Join(base, rel)).Int("uid", owner.uid).Int("gid", owner.gid).
					Msg("cannot give the directory the restore created to the owner of the directory it is in (or trainer.user); it belongs to root")
			})
		}
	}
	return nil
}

// primaryGroup returns the primary group of user uid where this system knows the user, else def.
func primaryGroup(uid, def int) int {
	u, err := user.LookupId(strconv.Itoa(uid))
	if err != nil {
		return def
	}
	gid, err := strconv.Atoi(u.Gid)
	if err != nil {
		return def
	}
	return gid
}

// restoreGiveDir gives the directory name in root, just made by this (root) process, to owner,
// through a handle, if it is still that: a directory of root's with nothing in it.
func restoreGiveDir(root *os.Root, name string, owner *restoreOwner) error {
	d, err := root.Open(name)
	if err != nil {
		return err
	}
	defer func() { _ = d.Close() }() // a directory handle: nothing to flush
	fi, err := d.Stat()
	if err != nil {
		return err
	}
	st, ok := fileStat(fi)
	if !fi.IsDir() || !ok || st.uid != 0 {
		return fmt.Errorf("%s is no longer the directory the restore created", filepath.Join(root.Name(), name))
	}
	if _, err := d.Readdirnames(1); !errors.Is(err, io.EOF) {
		return fmt.Errorf("%s is no longer the empty directory the restore created", filepath.Join(root.Name(), name))
	}
	return d.Chown(owner.uid, owner.gid)
}

// chown makes the file f belong to r.owner, if there is one. A failure (a file system that
// refuses it, such as NFS squashing root) is logged once and leaves what follows as it is: the
// checkpoint is still restored, belonging to root.
func (r *restoreRun) chown(f *os.File) {
	r.mu.Lock()
	defer r.mu.Unlock()
	if o := r.owner; o != nil && !o.failed {
		if err := f.Chown(o.uid, o.gid); err != nil {
			r.chownFailed(err)
		}
	}
}

// chownDir is chown of the directory name in root, opened as one.
func (r *restoreRun) chownDir(root *os.Root, name string) {
	if r.owner == nil {
		return
	}
	d, err := root.Open(name)
	if err == nil {
		defer func() { _ = d.Close() }() // a directory handle: nothing to flush
		if fi, serr := d.Stat(); serr != nil || !fi.IsDir() {
			err = fmt.Errorf("%s is no longer a directory", filepath.Join(root.Name(), name))
		}
	}
	if err != nil {
		r.mu.Lock()
		defer r.mu.Unlock()
		if !r.owner.failed {
			r.chownFailed(err)
		}
		return
	}
	r.chown(d)
}

// chownFailed logs that what the restore writes cannot be given to r.owner, and that it is not
// tried again. r.mu is held.
func (r *restoreRun) chownFailed(err error) {
	o := r.owner
	o.failed = true
	r.log.Warn().Err(err).Int("uid", o.uid).Int("gid", o.gid).
		Msg("cannot give the restored files to the owner of the destination; they belong to root, and a trainer of that user may not read or delete them")
}

// warn has fn write to the log, alone.
func (r *restoreRun) warn(fn func(log zerolog.Logger)) {
	r.mu.Lock()
	defer r.mu.Unlock()
	fn(r.log)
}

// restoreSyncDir fsyncs the directory name in root, so that the entries in it are durable.
func restoreSyncDir(root *os.Root, name string) error {
	d, err := root.Open(name)
	if err != nil {
		return fmt.Errorf("open directory %q to sync: %w", name, err)
	}
	defer d.Close()
	if err := d.Sync(); err != nil {
		return fmt.Errorf("sync directory %q: %w", name, err)
	}
	return nil
}

// restoreProgress adds up the bytes written by several downloads and reports them, one call
// at a time.
type restoreProgress struct {
	fn func(done, total int64)

	mu          sync.Mutex
	done, total int64
}

// add counts n more bytes and reports the sum, capped at the total.
func (p *restoreProgress) add(n int64) {
	p.mu.Lock()
	defer p.mu.Unlock()
	p.done = min(p.done+n, p.total)
	p.fn(p.done, p.total)
}

// addFile counts n more bytes written into a file of size bytes of which *counted were counted
// already, at most size in all: a store that retries writes a range twice, and a file
// downloaded again is written whole again.
func (p *restoreProgress) addFile(n int64, counted *int64, size int64) {
	p.mu.Lock()
	defer p.mu.Unlock()
	n = min(n, size-*counted)
	if n <= 0 {
		return
	}
	*counted += n
	p.done = min(p.done+n, p.total)
	p.fn(p.done, p.total)
}

// restoreCountingWriter reports to prog the bytes written through it into a file of size bytes,
// each of them once (restoreProgress.addFile).
type restoreCountingWriter struct {
	w       io.WriterAt
	prog    *restoreProgress
	size    int64
	counted int64 // guarded by prog.mu
}

func (c *restoreCountingWriter) WriteAt(b []byte, off int64) (int, error) {
	n, err := c.w.WriteAt(b, off)
	if n > 0 {
		c.prog.addFile(int64(n), &c.counted, c.size)
	}
	return n, err
}
