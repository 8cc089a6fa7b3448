package main

import (
	"context"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"io"
	"math"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"time"

	"github.com/aws/smithy-go"
	"github.com/mattn/go-isatty"
	"github.com/rs/zerolog"

	"github.com/spotguard/spotguard/agent"
	"github.com/spotguard/spotguard/agent/trainer"
	"github.com/spotguard/spotguard/checkpoint"
)

// loadStoreConfig loads the configuration for a command that only reads the store: only the
// store's own keys, and the others it reads (uses), must be valid.
func loadStoreConfig(cf *configFlags, environ []string, stderr io.Writer, cmd string, uses ...string) (*agent.Config, bool) {
	cfg, err := cf.load(environ)
	if err != nil {
		fmt.Fprintf(stderr, "spotguard %s: %v\n", cmd, err)
		return nil, false
	}
	if err := cfg.ValidateStore(uses...); err != nil {
		fmt.Fprintf(stderr, "spotguard %s: invalid configuration:\n", cmd)
		for _, p := range storeProblems(err) {
			fmt.Fprintf(stderr, "  - %s\n", p)
		}
		return nil, false
	}
	return cfg, true
}

// storeProblems are the lines of ValidateStore's err but "store.url: not set" when another line
// says what is wrong with store.url: a URL that does not parse leaves store.url empty, and
// ValidateStore says both (agent.Config.ValidateStore should not: then this is a no-op).
func storeProblems(err error) []string {
	lines := strings.Split(err.Error(), "\n")
	notSet := func(p string) bool { return strings.HasPrefix(p, "store.url: not set") }
	if !slices.ContainsFunc(lines, func(p string) bool { return strings.HasPrefix(p, "store.url: ") && !notSet(p) }) {
		return lines
	}
	return slices.DeleteFunc(lines, notSet)
}

func runRestore(ctx context.Context, args, environ []string, stdout, stderr io.Writer) int {
	fs, cf := newFlagSet("restore", "Download the newest committed checkpoint (the newest commit: what LATEST names, or a newer one if\nLATEST lags) into DIR/<checkpoint>, verifying every checksum; nothing is put in place until all of\nit is verified. What is at DIR/<checkpoint> already is never overwritten: an incomplete save of\nthat name (no marker), or an older one, is moved aside (DIR/.spotguard-incomplete-* or -older-*);\na newer one (not committed yet) is left for the trainer to resume from, and nothing restored.", stdout, stderr)
	to := fs.String("to", "", "destination `DIR` (default: checkpoint.dir); the checkpoint lands in DIR/<checkpoint> (a single-file checkpoint as the file DIR/<name>)")
	noCreate := fs.Bool("no-create", false, "do not create a missing DIR unless its parent is a mount point: a disk not mounted yet fails\nloudly instead of filling the root volume under the mount point (the restore unit uses it)")
	mountWait := fs.Duration("mount-wait", 0, "with --no-create, wait up to `DURATION` for a missing DIR to appear or its parent to become a\nmount point (a disk mounted late at boot) before failing")
	name := fs.String("checkpoint", "", "restore this checkpoint `NAME` (its newest commit) instead of the newest")
	commit := fs.String("commit", "", "with --checkpoint, restore this commit `ID` of it (spotguard list shows them; - for a version 1 checkpoint's)")
	part := fs.Bool("part", false, "multi-node jobs: restore only this node's part (store.node_rank) and the files it shares with the other\nparts, not every node's files (for trainers whose ranks read only their own files, with static node ranks)")
	jsonOut := fs.Bool("json", false, "print the result as JSON")
	allowEmpty := fs.Bool("allow-empty", false, "exit 0 when the job has no committed checkpoint yet (a first run); other errors still fail")
	if code, ok := fs.parse(args); !ok {
		return code
	}
	set := map[string]bool{}
	fs.Visit(func(f *flag.Flag) { set[f.Name] = true })
	// An empty --to is checkpoint.dir, as without it: the spotguard-restore unit passes
	// --to=${RESTORE_TO}, empty unless set.
	for _, f := range []string{"checkpoint", "commit"} {
		if set[f] && fs.Lookup(f).Value.String() == "" {
			// An unset variable in a script ("--checkpoint $STEP"): restoring the newest
			// instead would resume from another step than the one asked for.
			return fs.usageError("--%s is empty: give a value, or leave the flag out", f)
		}
	}
	if *commit != "" && *name == "" {
		return fs.usageError("--commit needs --checkpoint")
	}
	if err := checkpoint.ValidName(*name); *name != "" && err != nil {
		return fs.usageError("--checkpoint %v (`spotguard list` shows the job's checkpoints)", err)
	}
	if err := checkpoint.ValidCommitID(*commit); *commit != "" && *commit != "-" && err != nil {
		return fs.usageError("--commit %v: want an id as `spotguard list` shows it (20261201T194432Z-0123456789ab)", err)
	}
	if *mountWait != 0 && !*noCreate {
		return fs.usageError("--mount-wait needs --no-create (without it a missing DIR is created at once)")
	}
	if *mountWait < 0 {
		return fs.usageError("--mount-wait %v: want a duration of 0 or more", *mountWait)
	}
	// checkpoint.dir: the default --to, and whether the agent's journal is told; trainer.user:
	// the owner of directories made under root's; agent.runtime_dir: the journal's.
	cfg, ok := loadStoreConfig(cf, environ, stderr, "restore", "checkpoint.dir", "checkpoint.marker", "trainer.user", "agent.runtime_dir")
	if !ok {
		return exitFail
	}
	if *to == "" {
		*to = cfg.Checkpoint.Dir
	}
	if *to == "" {
		return fs.usageError("--to DIR is required when checkpoint.dir is not set")
	}
	// Absolute, so that the messages and --json's "dir" say where it is wherever they are read.
	if abs, err := filepath.Abs(*to); err == nil {
		*to = abs
	}
	var partRank *int
	if *part {
		if cfg.Store.WorldNodes < 2 || cfg.Store.NodeRank >= cfg.Store.WorldNodes {
			return fs.usageError("--part needs store.world_nodes above 1 and store.node_rank below it (they are %d and %d)",
				cfg.Store.WorldNodes, cfg.Store.NodeRank)
		}
		partRank = &cfg.Store.NodeRank
	}
	if *noCreate {
		err := checkRestoreTarget(*to)
		if err != nil && *mountWait > 0 {
			fmt.Fprintf(atPriority(stderr, 5), "spotguard restore: %v; waiting up to %v for it\n", err, *mountWait)
			err = waitRestoreTarget(ctx, *to, *mountWait, time.Second)
		}
		if err != nil && ctx.Err() != nil {
			fmt.Fprintf(stderr, "spotguard restore: %s while waiting for %s; nothing restored\n", interruptedText(ctx), *to)
			return exitFail
		}
		if err != nil {
			fmt.Fprintf(stderr, "spotguard restore: %v\n", err)
			return exitFail
		}
	}
	if mounted, _ := isMountPoint(*to); mounted {
		// Safe now, with the disk mounted; not at a boot where a script mounts it late: --to is
		// then a directory of the root volume, restored into, and hidden by the mount.
		fmt.Fprintf(atPriority(stderr, 4), "spotguard restore: warning: %s\n", mountPointWarning("--to", *to))
	}
	store, err := openStoreToRead(ctx, cfg.Store.URL, cfg.IMDS.Endpoint, cfg.S3Options())
	if err != nil {
		fmt.Fprintf(stderr, "spotguard restore: %v\n", err)
		return exitFail
	}
	log := newLogger(stderr, environ, cfg.Log.Level)
	// The summary line says what restore's own info lines would; its warnings and errors still
	// go to stderr.
	level := max(cfg.Log.Level, zerolog.WarnLevel)
	if cfg.Log.Level == zerolog.DebugLevel {
		level = zerolog.DebugLevel
	}
	commitID := *commit
	if commitID == "-" {
		commitID = "" // how list shows a version 1 checkpoint's commit, which has no id
	}
	opts := checkpoint.RestoreOptions{Job: cfg.Store.Job, Checkpoint: *name, Commit: commitID, CommitSet: *commit != "", To: *to,
		Marker: cfg.Checkpoint.Marker, Logger: log.Level(level)}
	opts.Part = partRank
	opts.PartWait = cfg.Store.PartWait
	if partRank != nil {
		opts.WorldNodes = cfg.Store.WorldNodes
	}
	opts.DirOwner = cfg.Trainer.User   // a directory made under root's mount point is the trainer's
	opts.BootedAt = trainer.BootTime() // a save modified before the boot is not being written
	if cd := cfg.Checkpoint.Dir; cd != "" && filepath.Clean(cd) == *to && cfg.Agent.RuntimeDir != "" {
		// Into the agent's checkpoint.dir: its journal learns what was put there.
		opts.Journal = checkpoint.JournalPath(cfg.Agent.RuntimeDir, cfg.Store.Job, cd, store.URL())
	}
	// Progress: a bar on a terminal (none with --json); elsewhere (spotguard-restore.service, a
	// pipe) a log line every progressLogEvery and one at the end.
	var bar *progressBar
	var plog *progressLog
	f, ok := stderr.(*os.File)
	switch tty := ok && isatty.IsTerminal(f.Fd()); {
	case tty && !*jsonOut:
		bar = &progressBar{w: stderr, start: time.Now()}
		opts.Progress = bar.update
	case !tty:
		plog = &progressLog{log: log.With().Str("component", "restore").Str("store", store.URL()).Str("job", cfg.Store.Job).Logger(), now: time.Now}
		opts.Progress = plog.update
		tick := time.NewTicker(progressLogEvery)
		defer tick.Stop()
		pctx, stop := context.WithCancel(ctx)
		logged := make(chan struct{})
		go func() { defer close(logged); plog.run(pctx, tick.C) }()
		defer func() { stop(); <-logged }()
	}
	// The checkpoint's size, once known: what a full destination would have needed.
	var need atomic.Int64
	show := opts.Progress
	opts.Progress = func(done, total int64) {
		need.Store(total)
		if show != nil {
			show(done, total)
		}
	}
	res, err := checkpoint.Restore(ctx, restoreSource{store}, opts)
	bar.finish()
	plog.finish()
	// With --json, stdout has one object on exit 0 only: "restored" says whether a checkpoint is
	// in place (false: --allow-empty and nothing committed yet); errors stay on stderr.
	if err != nil && *allowEmpty && *name == "" && errors.Is(err, checkpoint.ErrNothingToRestore) {
		why := "nothing to restore (first run)"
		if errors.Is(err, checkpoint.ErrOnlyUncommittedSaves) {
			why = "nothing committed to restore: the job's saves are in the store, none committed (`spotguard list` says why); the trainer starts from scratch"
		}
		if *jsonOut {
			json.NewEncoder(stdout).Encode(map[string]any{
				"restored": false, "detail": err.Error() + "; " + why, "store": store.URL(), "job": cfg.Store.Job,
			})
			return exitOK
		}
		fmt.Fprintf(stdout, "%v; %s\n", err, why)
		return exitOK
	}
	if err != nil && ctx.Err() != nil {
		// SIGINT or SIGTERM (main's context): what failed then is only that it was cut short.
		fmt.Fprintf(stderr, "spotguard restore: %s; no checkpoint was put in %s: run it again to restore\n", interruptedText(ctx), *to)
		return exitFail
	}
	if err != nil {
		fmt.Fprintf(stderr, "spotguard restore: %s\n", err)
		notFound := ""
		switch {
		case *commit != "":
			notFound = fmt.Sprintf("checkpoint %q of job %s has no commit %s in %s: `spotguard list` shows the job's checkpoints and commits", *name, cfg.Store.Job, *commit, store.URL())
		case *name != "":
			notFound = fmt.Sprintf("job %s has no valid commit of checkpoint %q in %s: `spotguard list` shows the job's checkpoints and commits", cfg.Store.Job, *name, store.URL())
		}
		restoreHint(stderr, cfg.Store.URL, *to, err, notFound, need.Load(), freeSpace)
		if errors.Is(err, checkpoint.ErrOnlyUncommittedSaves) && *name == "" {
			fmt.Fprintf(stderr, "spotguard restore: fix: the job's saves are in the store but none was committed: `spotguard list` says why\n"+
				"(a store.part_wait shorter than the nodes' saves, parts that are not one save); --allow-empty exits 0 with\n"+
				"nothing restored, and the trainer then starts from scratch\n")
		} else if errors.Is(err, checkpoint.ErrNothingToRestore) && *name == "" {
			// A first run has nothing to restore: a boot-time restore should not fail on it.
			fmt.Fprintf(stderr, "spotguard restore: fix: if this is the job's first run, --allow-empty exits 0 with nothing to restore\n"+
				"(spotguard-restore.service passes it); otherwise check store.url and store.job against the agent's\n")
		}
		if de, ok := errors.AsType[*checkpoint.DestinationExistsError](err); ok && de.Recent {
			fmt.Fprintf(stderr, "spotguard restore: fix: stop what writes %s (a trainer saving into that name) and run restore again;\n"+
				"a save left alone for a minute, incomplete or older than the commit, is moved aside, and the commit put in its place\n", de.Path)
		} else if ok && de.NoMarker != "" {
			fmt.Fprintf(stderr, "spotguard restore: fix: give restore the agent's checkpoint.marker (--config with the agent's file, or\n"+
				"SPOTGUARD_CHECKPOINT_MARKER; .metadata for PyTorch DCP) and run restore again; it then leaves a newer save of\n"+
				"the name in place and moves an older one aside. Or move it away (mv %s %s.old)\n", de.Path, de.Path)
		} else if ok {
			fmt.Fprintf(stderr, "spotguard restore: fix: restore never overwrites what is there: move it away and run restore again\n"+
				"(mv %s %s.old). Without --commit, a save of this name is no obstacle: a newer one is left in place, an older one moved aside.\n", de.Path, de.Path)
		}
		if errors.Is(err, checkpoint.ErrSplitSave) {
			fmt.Fprintf(stderr, "spotguard restore: fix: a multi-node job: set store.world_nodes (the node count) and store.node_rank on every node's agent\n"+
				"(docs/multinode.md), so that its nodes' files make one checkpoint\n")
		}
		if errors.Is(err, checkpoint.ErrDamaged) {
			fmt.Fprintf(stderr, "spotguard restore: this commit cannot be restored; `spotguard list` shows the others, and\n"+
				"`spotguard restore --checkpoint NAME --commit ID` restores one of them.\n"+
				"`spotguard list --check` finds a file missing or of another size, not other bytes of the same size;\n"+
				"only a restore reads the bytes and verifies their checksums\n")
		}
		return exitFail
	}
	if *jsonOut {
		json.NewEncoder(stdout).Encode(map[string]any{
			"restored":   true,
			"checkpoint": res.Checkpoint, "commit": res.Commit, "dir": res.Dir, "files": res.Files, "bytes": res.Bytes,
			"seconds": res.Elapsed.Seconds(), "fell_back": res.FellBack, "already_present": res.AlreadyPresent, "deleted_while_restored": res.Deleted,
			"moved_aside": res.MovedAside, "newer_present": res.NewerPresent,
			"store": store.URL(), "job": cfg.Store.Job,
		})
		return exitOK
	}
	switch {
	case res.AlreadyPresent:
		fmt.Fprintf(stdout, "%s is already in %s with identical content; nothing to do\n", res.Checkpoint, res.Dir)
	case res.NewerPresent:
		fmt.Fprintf(stdout, "%s holds a newer save of %s than its newest commit %s in %s job %s, one not committed yet: left as it is for the trainer to resume from (the agent commits it); nothing restored\n",
			res.Dir, res.Checkpoint, res.Commit, store.URL(), cfg.Store.Job)
	default:
		rate := float64(res.Bytes) / max(res.Elapsed.Seconds(), 1e-9)
		note := ""
		if res.FellBack {
			note = " (LATEST was missing, unusable or older: restored the newest commit)"
		}
		if res.MovedAside != "" {
			note += fmt.Sprintf(" (an %s save of that name was there: moved to %s; delete it when done)", res.MovedAsideKind, res.MovedAside)
		}
		if res.Deleted > 0 {
			note += fmt.Sprintf(" (%d newest commit%s deleted from the store while restored, by an agent still running the job: restored the newest since)", res.Deleted, plural(res.Deleted))
		}
		fmt.Fprintf(stdout, "restored %s (%d file%s, %s) from %s job %s to %s in %.1f s (%s/s), every checksum verified%s\n",
			res.Checkpoint, res.Files, plural(res.Files), checkpoint.HumanBytes(res.Bytes), store.URL(), cfg.Store.Job, res.Dir, res.Elapsed.Seconds(), checkpoint.HumanBytes(int64(rate)), note)
	}
	return exitOK
}

// checkRestoreTarget is --no-create: dir must exist, or be missing in a parent that is a mount
// point (a fresh disk, mounted). A parent on the file system of its own parent is where a disk
// would be mounted if it were: restoring there would fill that file system (the root volume) and
// be hidden once the disk is mounted.
func checkRestoreTarget(dir string) error {
	dir = filepath.Clean(dir)
	fi, err := os.Stat(dir)
	switch {
	case err == nil && fi.IsDir():
		return nil
	case err == nil:
		return fmt.Errorf("--to %s is not a directory", dir)
	case !errors.Is(err, os.ErrNotExist):
		return fmt.Errorf("--to %s: %w", dir, err)
	}
	if fi, err := os.Lstat(dir); err == nil && fi.Mode()&os.ModeSymlink != 0 {
		// A link to a disk not mounted yet; mkdir -p, the fix below, fails on it (found from
		// outside).
		target, _ := os.Readlink(dir)
		return fmt.Errorf("--to %s is a symbolic link to %s, which does not exist: is the disk it leads to mounted? If it is, create %s (--no-create: not creating it)", dir, target, target)
	}
	parent := filepath.Dir(dir)
	if _, err := os.Stat(parent); err != nil {
		return fmt.Errorf("--to %s does not exist, nor does %s: is the disk it belongs on mounted? (--no-create: not creating it)", dir, parent)
	}
	mounted, err := isMountPoint(parent)
	if err != nil {
		return fmt.Errorf("--to %s does not exist and %s cannot be checked: %w", dir, parent, err)
	}
	if !mounted {
		return fmt.Errorf("--to %s does not exist and %s is not a mount point: if a disk is mounted there later, it is not mounted yet, "+
			"and a checkpoint restored now would fill the file system below and be hidden by the mount (--no-create: not creating it). "+
			"If the directory belongs on that file system, create it once: mkdir -p %s", dir, parent, dir)
	}
	return nil
}

// mountPointWarning says why dir (named by what: --to, checkpoint.dir), itself the mount point
// of a file system, is a hazard: at a boot where the disk is mounted late, by a script with no
// mount unit (RequiresMountsFor= cannot wait for it), the restore finds dir on the root volume,
// restores there, and the mount hides it: the trainer starts from scratch.
func mountPointWarning(what, dir string) string {
	return fmt.Sprintf("%s %s is itself a mount point: at a boot where its disk is mounted late (by a script, with no mount unit), "+
		"the restore finds %s on the root volume, restores into it, and the mount then hides the checkpoint: the trainer starts from scratch; "+
		"use a directory below the mount point (%s) for checkpoint.dir and the restore's --to, which --no-create then waits for",
		what, dir, dir, filepath.Join(dir, "checkpoints"))
}

// waitRestoreTarget polls checkRestoreTarget every tick until it passes, wait has gone by (its
// last error) or ctx ends.
func waitRestoreTarget(ctx context.Context, dir string, wait, tick time.Duration) error {
	deadline := time.NewTimer(wait)
	defer deadline.Stop()
	t := time.NewTicker(tick)
	defer t.Stop()
	for {
		err := checkRestoreTarget(dir)
		if err == nil {
			return nil
		}
		select {
		case <-ctx.Done():
			return err
		case <-deadline.C:
			return fmt.Errorf("after waiting %v: %w", wait, err)
		case <-t.C:
		}
	}
}

// isMountPoint reports whether dir is the root of a mounted file system other than "/": its
// device differs from its parent's.
func isMountPoint(dir string) (bool, error) {
	dir = filepath.Clean(dir)
	if dir == "/" {
		return false, nil
	}
	a, err := os.Stat(dir)
	if err != nil {
		return false, err
	}
	b, err := os.Stat(filepath.Dir(dir))
	if err != nil {
		return false, err
	}
	sa, oka := a.Sys().(*syscall.Stat_t)
	sb, okb := b.Sys().(*syscall.Stat_t)
	if !oka || !okb {
		return false, errors.New("no device numbers on this system")
	}
	return sa.Dev != sb.Dev, nil
}

// listSlowRead is how long list waits on the store before it says it is waiting. A variable
// for tests.
var listSlowRead = 30 * time.Second

func runList(ctx context.Context, args, environ []string, stdout, stderr io.Writer) int {
	fs, cf := newFlagSet("list", "List the job's commits, newest first (by completion time): checkpoint, commit id, file count, size,\ntrigger.", stdout, stderr)
	jsonOut := fs.Bool("json", false, "print the manifests as JSON")
	check := fs.Bool("check", false, "also check the job against spotguard's invariants (every listed object there with its size, nothing\nelse under a commit, LATEST on a valid commit, no spotguard file in a checkpoint, single-node and\nmulti-node commits not mixed in one job, no save's parts claiming one node rank twice); exit 1 on a violation.\nIt reads no object's bytes: a file overwritten with as many bytes passes (restore verifies checksums)")
	if code, ok := fs.parse(args); !ok {
		return code
	}
	cfg, ok := loadStoreConfig(cf, environ, stderr, "list", "checkpoint.marker")
	if !ok {
		return exitFail
	}
	store, err := openStoreToRead(ctx, cfg.Store.URL, cfg.IMDS.Endpoint, cfg.S3Options())
	if err != nil {
		fmt.Fprintf(stderr, "spotguard list: %v\n", err)
		return exitFail
	}
	// The job is read once: the list, the check and the saves waiting for parts are of one
	// reading (store-layout.md, Reading a job).
	said := make(chan struct{})
	slow := time.AfterFunc(listSlowRead, func() {
		defer close(said)
		// The S3 client's own attempts at a store that never answers take minutes: not silence.
		fmt.Fprintf(stderr, "spotguard list: the store has not answered for %.0f s; still trying (the S3 client's attempts)\n", listSlowRead.Seconds())
	})
	st, err := checkpoint.ReadJob(ctx, store, cfg.Store.Job)
	if !slow.Stop() {
		<-said // it fired: its line is written before any other
	}
	if err != nil && ctx.Err() != nil {
		// Said as restore says it (found from outside: "context canceled" from the S3 client).
		fmt.Fprintf(stderr, "spotguard list: %s\n", interruptedText(ctx))
		return exitFail
	}
	if err != nil {
		fmt.Fprintf(stderr, "spotguard list: %v\n", err)
		storeHint(stderr, "list", cfg.Store.URL, err, "")
		return exitFail
	}
	cs, problems := st.Commits, st.Problems
	for _, p := range problems {
		fmt.Fprintf(stderr, "spotguard list: skipped: %v\n", p)
	}
	code := exitOK
	split := checkpoint.SplitSaves(cs, cfg.Checkpoint.Marker)
	if !*check {
		for _, e := range split {
			fmt.Fprintf(atPriority(stderr, 4), "spotguard list: warning: %v (restore refuses it; set store.world_nodes and store.node_rank on every node, docs/multinode.md)\n", e)
		}
	}
	if *check {
		violations := checkpoint.CheckJobRead(ctx, store, st, false)
		violations = append(violations, split...)
		for _, v := range violations {
			fmt.Fprintf(stderr, "spotguard list: check: %v\n", v)
		}
		if len(violations) > 0 {
			code = exitFail
		} else {
			// Said: the table alone did not tell a check that passed (found from outside).
			fmt.Fprintf(stderr, "spotguard list: check: passed: %d commit(s) of job %s, every object there with its size, nothing else\n", len(cs), cfg.Store.Job)
		}
	}
	incomplete := st.Incomplete(cfg.Store.PartWait)
	if *jsonOut {
		type entry struct {
			*checkpoint.Manifest
			Latest bool `json:"latest"`
		}
		// Incomplete multi-node saves come last, so the first entry is still the newest commit.
		type partial struct {
			checkpoint.IncompleteSave
			Incomplete bool   `json:"incomplete"`
			Parts      string `json:"parts"`
		}
		out := make([]any, 0, len(cs)+len(incomplete))
		for _, c := range cs {
			out = append(out, entry{c.Manifest, c.Latest})
		}
		for _, is := range incomplete {
			out = append(out, partial{is, true, fmt.Sprintf("%d/%d", len(is.Ranks), is.WorldNodes)})
		}
		enc := json.NewEncoder(stdout)
		enc.SetIndent("", "  ")
		enc.Encode(out)
		return code
	}
	if len(cs) == 0 {
		fmt.Fprintf(stdout, "no committed checkpoint of job %s in %s\n", cfg.Store.Job, store.URL())
		if others := checkpoint.OtherJobs(ctx, store, cfg.Store.Job); len(others) > 0 && len(incomplete) == 0 {
			// As restore says it: a mistyped store.job, or one set anew, lists nothing.
			fmt.Fprintf(stdout, "the store holds the checkpoints of other jobs: %s (is store.job the training run's name?)\n", checkpoint.QuoteJobs(others))
		}
	} else {
		checkpoint.FormatList(stdout, cs)
	}
	if len(incomplete) > 0 {
		fmt.Fprintln(stdout)
		checkpoint.FormatIncomplete(stdout, incomplete)
	}
	return code
}

// progressBar draws restore progress on a terminal, at most ten times a second.
type progressBar struct {
	w     io.Writer
	start time.Time
	mu    sync.Mutex
	last  time.Time
	drawn bool
}

func (p *progressBar) update(done, total int64) {
	p.mu.Lock()
	defer p.mu.Unlock()
	now := time.Now()
	if now.Sub(p.last) < 100*time.Millisecond && done != total {
		return
	}
	p.last = now
	pct := 100.0
	if total > 0 {
		pct = 100 * float64(done) / float64(total)
	}
	rate := float64(done) / max(now.Sub(p.start).Seconds(), 1e-9)
	fmt.Fprintf(p.w, "\r%s / %s (%3.0f%%) %s/s ", checkpoint.HumanBytes(done), checkpoint.HumanBytes(total), pct, checkpoint.HumanBytes(int64(rate)))
	p.drawn = true
}

func (p *progressBar) finish() {
	if p == nil {
		return
	}
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.drawn {
		fmt.Fprintln(p.w)
	}
}

// progressLogEvery is how often a restore without a terminal logs its progress.
const progressLogEvery = 5 * time.Second

// progressLog logs restore progress where no terminal shows a bar (under systemd, in a pipe): a
// line on every tick of run and one at the end (finish), each with the bytes done and in all,
// the percentage, the rate in MB/s since the first byte was asked for, and the time left at that
// rate. Nothing is logged before the download starts, nor for a checkpoint already in place.
type progressLog struct {
	log zerolog.Logger
	now func() time.Time

	mu          sync.Mutex
	start       time.Time // of the first update; zero before
	done, total int64
	ended       bool
}

// update is checkpoint.RestoreOptions.Progress.
func (p *progressLog) update(done, total int64) {
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.start.IsZero() {
		p.start = p.now()
	}
	p.done, p.total = done, total
}

// run logs a line on every tick, as of the tick's time, until ctx ends.
func (p *progressLog) run(ctx context.Context, tick <-chan time.Time) {
	for {
		select {
		case <-ctx.Done():
			return
		case now := <-tick:
			p.line(now, false)
		}
	}
}

// finish logs the last line, once; nil does nothing.
func (p *progressLog) finish() {
	if p == nil {
		return
	}
	p.line(p.now(), true)
}

// line logs where the download stands at now (once more with end, never after it).
func (p *progressLog) line(now time.Time, end bool) {
	p.mu.Lock()
	if p.start.IsZero() || p.ended {
		p.mu.Unlock()
		return
	}
	p.ended = end
	done, total, elapsed := p.done, p.total, now.Sub(p.start)
	p.mu.Unlock()
	pct := 100.0
	if total > 0 {
		pct = 100 * float64(done) / float64(total)
	}
	rate := 0.0 // bytes a second
	if elapsed > 0 {
		rate = float64(done) / elapsed.Seconds()
	}
	ev := p.log.Info().Int64("bytes_done", done).Int64("bytes_total", total).Float64("percent", math.Round(pct*10)/10).
		Float64("mb_per_s", math.Round(rate/1e5)/10).Float64("elapsed_s", logSeconds(elapsed))
	switch {
	case done >= total:
		ev = ev.Float64("eta_s", 0)
	case rate > 0:
		ev = ev.Float64("eta_s", logSeconds(time.Duration(float64(total-done)/rate*float64(time.Second))))
	}
	ev.Msg("restore progress")
}

// storeHint follows a failed command's error, when the store refused or could not be reached,
// with S3's answer in short and what to do about it, as doctor and /healthz say them. An object
// that is not there (see [objectMissing]) is not the store's fault: the fix is then notFound, or
// none when notFound is "" (the error says what is missing); a missing bucket is advised on only
// when S3 said NoSuchBucket.
func storeHint(w io.Writer, cmd, url string, err error, notFound string) {
	reason := agent.StoreErrorReason(err)
	if reason == "" || reason == agent.StoreOther && !agent.StoreFixKnown(err) || errors.Is(err, checkpoint.ErrDamaged) || errors.Is(err, context.Canceled) {
		return
	}
	if objectMissing(err) {
		if notFound != "" {
			fmt.Fprintf(w, "spotguard %s: fix: %s\n", cmd, notFound)
		}
		return
	}
	var ae smithy.APIError
	if errors.As(err, &ae) {
		fmt.Fprintf(w, "spotguard %s: S3 said %s\n", cmd, agent.StoreErrorSummary(err))
	}
	fmt.Fprintf(w, "spotguard %s: fix: %s\n", cmd, agent.StoreFix(reason, url, err))
}

// objectMissing reports whether err says that an object is not in the store (a checkpoint or
// commit asked for that is not there): it wraps checkpoint.ErrNotFound or S3's NoSuchKey, and S3
// did not say NoSuchBucket.
func objectMissing(err error) bool {
	var ae smithy.APIError
	if errors.As(err, &ae) {
		switch ae.ErrorCode() {
		case "NoSuchBucket":
			return false
		case "NoSuchKey":
			return true
		}
	}
	return errors.Is(err, checkpoint.ErrNotFound)
}
