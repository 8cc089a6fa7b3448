package checkpoint

import (
	"cmp"
	"container/list"
	"context"
	"errors"
	"fmt"
	"io/fs"
	"maps"
	"os"
	"path"
	"path/filepath"
	"slices"
	"strings"
	"syscall"
	"time"

	"github.com/fsnotify/fsnotify"
	"github.com/rs/zerolog"
)

// WatchConfig configures a Watcher.
type WatchConfig struct {
	// Dir is the checkpoint directory. It must exist and be a directory (it may be a symbolic
	// link to one; nothing below it is followed).
	Dir string
	// Marker is the file whose appearance at the top of a checkpoint directory makes it
	// complete; default "_COMPLETE" (".metadata" for torch DCP). It must be a single file name.
	Marker string
	// Pattern is a path.Match glob: a regular file at the top of Dir whose name matches it is a
	// complete single-file checkpoint once it has been quiet for Debounce. "" means none.
	Pattern string
	// Debounce is the quiet time after the last Create, Write or Chmod of a file before it
	// counts as ready (closed); default 500ms.
	Debounce time.Duration
	// Logger receives the watcher's log lines.
	Logger zerolog.Logger
	// Ready, if not nil, is called once by Run when the watches are in place and the first
	// full scan is done (the moment a service may say it is ready).
	Ready func()
	// GrowStep: a file of a checkpoint directory that is being written has a FileGrowing each
	// time it has grown by this many bytes since its last one; default watchGrowStep, and
	// negative for none.
	GrowStep int64
	// Unwatched, if not nil, is called by Run each time the number of directories it could
	// not watch changes: with what is wrong, in a sentence that names the cause (for the inotify
	// watch limit, fs.inotify.max_user_watches and how to raise it) and says they are polled
	// instead, while there are any; with "" once every directory is watched again, and when Run
	// returns after it said anything else. It must not block.
	Unwatched func(problem string)
	// Lock: Run holds an exclusive flock(2) on Dir while it watches (LockDir), and returns an
	// error wrapping ErrDirInUse when another holds it: another agent uploads the directory.
	Lock bool
	// ReadDone: each full read of Dir (at start, and after an event overflow) ends with a
	// ReadDone event, even when it found nothing.
	ReadDone bool
}

// ErrDirInUse is LockDir's (and a locking Watcher.Run's) error for a checkpoint directory whose
// lock another process holds.
var ErrDirInUse = errors.New("watched by another spotguard agent")

// watchDefaultDebounce is the Debounce used when none is configured.
const watchDefaultDebounce = 500 * time.Millisecond

// watchGrowStep is the GrowStep used when none is configured.
const watchGrowStep = 1 << 20

// watchGrowEvery is how often a file being written is looked at (Lstat) at most, for its
// FileGrowing: a trainer's every write is an fsnotify event.
const watchGrowEvery = 20 * time.Millisecond

// watchPollInterval is how often Run looks whether Dir is still the directory it opened, and
// polls the directories it could not watch.
const watchPollInterval = 2 * time.Second

// watchPollBudget bounds the names a poll of the directories without a watch reads (more when a
// single directory holds more): the rest wait for the next poll, in turn.
const watchPollBudget = 8192

// watchLimitLogEvery is how often the inotify watch limit is logged again at most, if every
// directory was watched again in between.
const watchLimitLogEvery = 10 * time.Minute

// watchMsgLimit is the Error log line of the inotify watch limit.
const watchMsgLimit = "inotify watch limit reached (fs.inotify.max_user_watches): directories beyond it are polled instead of watched"

// watchMsgAllWatched is the Info log line once every directory has its watch again.
const watchMsgAllWatched = "every directory of the checkpoint directory is watched again"

// watchLimitFix says how to raise the inotify watch limit.
const watchLimitFix = "raise it: sysctl -w fs.inotify.max_user_watches=1048576, and set it in /etc/sysctl.d/ to keep it after a reboot (each watch costs about 1 KiB of kernel memory); in a user namespace of its own (a rootless container), user.max_inotify_watches there as well"

// WatchEventKind says what a WatchEvent reports.
type WatchEventKind int

const (
	// FileReady: a regular file of a checkpoint has been written and closed (quiet for the
	// debounce time, or flushed because its checkpoint's marker appeared). It comes again if
	// the file changes later.
	FileReady WatchEventKind = iota + 1
	// Complete: the checkpoint's marker appeared (or its single file became ready). Every
	// file of the checkpoint has had its FileReady before it.
	Complete
	// Removed: the checkpoint's directory (or single file) was removed or renamed away, or
	// its single file can no longer be reported (see Run).
	Removed
	// FileGone: a file of a checkpoint directory that had a FileReady (or a FileGrowing) was
	// removed or renamed away (alone or with a directory above it) or can no longer be
	// reported, or the marker of a complete checkpoint was removed or renamed away: the
	// checkpoint is not complete any more.
	FileGone
	// FileGrowing: a regular file of a checkpoint directory (not its marker, nor a file at the
	// top of Dir) is being written, and has grown by GrowStep since its last FileGrowing. Its
	// FileReady follows once it is closed, unless it goes (FileGone). Size and ID are as Lstat
	// saw it; the file is not ready, and what it holds may still change anywhere.
	FileGrowing
	// Withheld: the marker of a checkpoint directory is there, but its Complete is withheld:
	// part of it could not be read, or a name or file in it cannot be stored (Err says which;
	// ErrNotStorable), or its own name cannot (ErrNameNotStorable: Checkpoint fails ValidName,
	// and no other event names it). Size, ModTime and ID are the marker's. It comes again only
	// with another reason (or marker); the Complete follows once the trouble is fixed.
	Withheld
	// ReadDone: a full read of Dir has sent all its events (WatchConfig.ReadDone). Only Kind and
	// At are set.
	ReadDone
)

// String returns the kind's name.
func (k WatchEventKind) String() string {
	switch k {
	case FileReady:
		return "FileReady"
	case Complete:
		return "Complete"
	case Removed:
		return "Removed"
	case FileGone:
		return "FileGone"
	case FileGrowing:
		return "FileGrowing"
	case Withheld:
		return "Withheld"
	case ReadDone:
		return "ReadDone"
	default:
		return fmt.Sprintf("WatchEventKind(%d)", int(k))
	}
}

// WatchEvent is one thing a Watcher saw happen to a checkpoint.
type WatchEvent struct {
	Kind WatchEventKind
	// Checkpoint is the checkpoint's sub-directory name, or the single file's name. It passes
	// ValidName, except in the Withheld of a checkpoint whose own name the store cannot hold.
	Checkpoint string
	// Path is, for FileReady, FileGrowing and FileGone, the file's path relative to the checkpoint's
	// directory, slash-separated and valid for ValidPath (the file's name for a single-file
	// checkpoint; FileGone never names one). For Complete it is the marker's name (the file's
	// name for a single-file checkpoint); so is it for the FileGone of a marker. For Removed
	// it is empty.
	Path string
	// Size and ModTime are the file's (FileReady, FileGrowing) or the marker's (Complete) as Lstat saw them
	// when the watcher decided; zero for Removed and FileGone. A consumer reads the file
	// itself and must check them again.
	Size    int64
	ModTime time.Time
	// ID identifies the version of the file (FileReady, FileGrowing) or marker (Complete) that Lstat saw,
	// as Size and ModTime; zero for Removed and FileGone. A consumer that opened the file
	// compares FileIDOf(its Stat) with ID.Same rather than trusting size and time alone.
	ID FileID
	// At is when the watcher decided.
	At time.Time
	// Moved is true for the Removed of a checkpoint directory that was renamed away (fsnotify
	// said so) rather than deleted: a trainer renaming a staging directory into place brings it
	// back under another name. A Removed the watcher found without its event (a rescan, a poll)
	// is never Moved.
	Moved bool
	// More is true when the event is one of those a full read of Dir sent at once (at start,
	// and after an event overflow) and another of them follows: a consumer that orders its work
	// across checkpoints can take them all before it begins any. A read sends the checkpoints
	// it found oldest first, by their latest change time (see Run).
	More bool
	// Err is, for Withheld, why the checkpoint is not complete.
	Err error
}

// Watcher watches a checkpoint directory with fsnotify and reports checkpoint files as they
// become ready and checkpoints as they complete. See Run.
type Watcher struct {
	dir         string // absolute and clean
	marker      string
	pattern     string
	debounce    time.Duration
	growStep    int64     // 0: no FileGrowing
	owner       scanOwner // of dir, when NewWatcher looked
	log         zerolog.Logger
	ready       func()
	onUnwatched func(problem string)
	lock        bool
	readDone    bool
	// growEvery is how often a file being written is looked at for its FileGrowing at most;
	// watchGrowEvery unless a test sets it.
	growEvery time.Duration
	// pollEvery is how often Run looks whether Dir is still the directory it opened, and polls
	// what it could not watch; watchPollInterval unless a test sets it.
	pollEvery time.Duration
	// addWatch adds an fsnotify watch on a directory; fw.Add unless a test sets it (to run out
	// of inotify watches without using them up).
	addWatch func(fw *fsnotify.Watcher, dir string) error
	// newInotify starts fsnotify; fsnotify.NewWatcher unless a test sets it (to have no inotify
	// instance without using them all up).
	newInotify func() (*fsnotify.Watcher, error)
}

// NewWatcher checks cfg and returns a Watcher for it. It returns an error, listing every
// problem, if cfg.Dir does not exist or is not a directory, if Marker is not a single valid
// file name, if Pattern is not a valid glob, or if Debounce is negative. The owner of cfg.Dir
// as NewWatcher sees it is the one every reported file must be readable by (see Run).
func NewWatcher(cfg WatchConfig) (*Watcher, error) {
	var problems []error
	var owner scanOwner
	dir, err := filepath.Abs(cfg.Dir)
	if err != nil || cfg.Dir == "" {
		problems = append(problems, fmt.Errorf("checkpoint dir %q: not a usable path", cfg.Dir))
	} else if fi, err := os.Stat(dir); err != nil {
		problems = append(problems, fmt.Errorf("checkpoint dir: %w", err))
	} else if !fi.IsDir() {
		problems = append(problems, fmt.Errorf("checkpoint dir %s is not a directory", dir))
	} else {
		owner = scanOwnerOfPath(dir, fi)
	}
	marker, err := scanCheckNames(cfg.Marker, cfg.Pattern)
	if err != nil {
		problems = append(problems, err)
	}
	debounce := cfg.Debounce
	if debounce < 0 {
		problems = append(problems, fmt.Errorf("debounce %v is negative", debounce))
	} else if debounce == 0 {
		debounce = watchDefaultDebounce
	}
	if err := errors.Join(problems...); err != nil {
		return nil, err
	}
	growStep := cfg.GrowStep
	switch {
	case growStep == 0:
		growStep = watchGrowStep
	case growStep < 0:
		growStep = 0
	}
	return &Watcher{
		dir:         dir,
		marker:      marker,
		pattern:     cfg.Pattern,
		debounce:    debounce,
		growStep:    growStep,
		owner:       owner,
		log:         cfg.Logger.With().Str("component", "checkpoint-watcher").Logger(),
		ready:       cfg.Ready,
		onUnwatched: cfg.Unwatched,
		lock:        cfg.Lock,
		readDone:    cfg.ReadDone,
		growEvery:   watchGrowEvery,
		pollEvery:   watchPollInterval,
		addWatch:    (*fsnotify.Watcher).Add,
		newInotify:  fsnotify.NewWatcher,
	}, nil
}

// Run watches the checkpoint directory until ctx is done and sends what it sees to out, in
// order. It never closes out. Only one Run of a Watcher may be active at a time.
//
// It first watches the directory and sends what a full scan finds (see Scan): for each
// checkpoint, oldest first by the latest change time of its files and marker (names tied by it
// in name order), a FileReady for each of its regular files in path order, then a Complete if
// it is complete (always for single-file checkpoints); every event of the scan but its last has
// More set. Only a file modified less
// than Debounce ago in a checkpoint without its marker (or a single file modified that
// recently) is not sent at once: it may still be being written, and is reported like a file
// seen by its events, after its debounce. Then it sends events as they happen:
//   - FileReady when a file of a checkpoint directory (at any depth) has had no Create, Write
//     or Chmod for Debounce; again if it changes after that (with a Warn log line "file changed
//     after its checkpoint was complete" if the checkpoint was complete). A file whose FileID
//     is the Same as its last FileReady's is not reported again (events for a file a scan
//     already reported). Anything else is a change, even with the same size and modification
//     time: a rewrite that sets the time back, another file renamed over it, a chmod or chown
//     (each moves the file's change time; the permission bits are part of the checkpoint).
//   - Complete when the marker appears in a checkpoint directory (created or renamed into
//     place; a regular file that may be reported, like any other): the checkpoint is read
//     again at once, a FileGone is sent for each file reported before that is no longer there
//     (or may no longer be reported), a FileReady for each of its files not yet reported as it
//     is now, without waiting for the debounce, then Complete. If part of it cannot be read,
//     or a name or regular file in it is skipped with an error (ErrNotStorable: committed
//     without it, the checkpoint would be torn), Complete is withheld (Error log line and a
//     Withheld event, once for each reason) until the marker changes again, a new directory
//     appears in the checkpoint, something in it changes (it is read again at the next poll),
//     or a rescan.
//   - FileReady then Complete for a single-file checkpoint (a regular file at the top of Dir
//     matching Pattern) once it has been quiet for Debounce, and again each time it changes.
//   - FileGone when a file of a checkpoint directory that had a FileReady is removed or renamed
//     away, or when a directory above it inside the checkpoint is (then one FileGone for each
//     such file below the directory, in path order), or when the file can no longer be reported
//     (it became unreadable for the owner of Dir, a symbolic link or another non-regular file,
//     or got another name; with the skip's log line). A new name for a file (a hard link, made
//     anywhere) changes only the file's own inode, which the watches of its directory do not
//     see: the new name, if in Dir, is skipped like any hard link, and the file is taken back
//     when it has an event of its own, its checkpoint's marker appears, or a rescan. A file
//     renamed inside its checkpoint is a FileGone of the old path and a new file at the new one
//     (FileReady after its debounce). Removing the marker of a complete checkpoint (or renaming
//     it away, or it no longer being a file that can be reported) gives FileGone with Path the
//     marker and a Debug log line "marker removed; the checkpoint is no longer complete"; a
//     marker that appears again gives another Complete, and so does the marker of a complete
//     checkpoint written again (another version of it: its checkpoint is read again at once). Removing a checkpoint directory with
//     everything in it (rm -r) gives a FileGone for each reported file and for the marker, then
//     Removed.
//   - Removed when a checkpoint directory or single file is removed or renamed away, or the
//     single file, once reported, can no longer be reported. Pending events for it are
//     dropped. It may name a checkpoint no other event named. Renaming a checkpoint directory
//     is a Removed of the old name (without FileGone events; Moved) and a new checkpoint.
//
// A new sub-directory is watched, then read at once (only it, not its whole checkpoint), so
// files written before its watch was added are seen too. Names are skipped as Scan skips them:
// silently the dot-prefixed ".tmp" names and spotguard's own ".spotguard-" names (at any depth,
// with everything below them) and MetaDir at the top; with one Warn log line per path (again
// only if the reason changes, or after the path was reported in between) invalid names,
// symbolic links and other non-regular files, and regular files with more than one hard link or
// that the owner of Dir (as NewWatcher saw it) could not read. Nothing outside Dir is reported,
// and no symbolic link is followed. A single-file checkpoint skipped for either of the last two
// reasons gets a Withheld (and an Error log line): the trainer saved it, and it is never
// committed as it is. So does an entry at the top of Dir whose own name the store cannot hold
// (named LATEST, with a backslash, not UTF-8): it is not watched, but looked at every 2 s, and a
// checkpoint directory of that name whose marker is there (a single file of that name matching
// Pattern) gets a Withheld, once for each version of its marker, whose Checkpoint is that name.
//
// On fsnotify.ErrEventOverflow it logs a Warn, scans again in full and sends everything again
// as at the start, then continues: first Removed for the checkpoints that are gone; then, for
// each checkpoint directory still there that could be read in full, a FileGone for each file
// reported before that is no longer there (and one for the marker if it was complete and its
// marker is gone), before its FileReady and Complete events. Other fsnotify errors are logged
// and watching continues.
//
// If Dir itself is removed or moved, it logs an Error, sends a Removed for every checkpoint it
// held, and returns ErrDirGone. A move is an event; a deletion (rm -r, rmdir) is not while
// anything holds the directory open (Run itself does, and so does a process working in it), so
// every 2 s (watchPollInterval) Run also looks whether Dir's path still leads to the directory
// it opened: a Dir deleted, or deleted and made again, is seen within that time.
//
// A directory whose watch cannot be added (past the inotify watch limit,
// fs.inotify.max_user_watches: ENOSPC, which reads "no space left on device") is polled instead,
// every 2 s, and its watch is tried again then: the marker of every checkpoint directory without a watch is looked at, and
// then the directories without a watch are read in turn, at most watchPollBudget names a poll,
// and what changed in them is reported as its events would have (a file is reported once its
// modification time is Debounce old, since its writes are not seen). So a checkpoint completes
// within a poll even where nothing can be watched, Dir itself included. The limit is logged
// once, with how to raise it, not once per directory; WatchConfig.Unwatched is told how many
// directories are without a watch, and when none is any more. Any other error adding a watch is
// logged for its directory, which is polled the same way.
//
// The cost of an event does not grow with the number of files watched (invariant I8): a file's
// event costs the same beside ten files or a million, a directory removed costs time linear in
// what was below it, a marker time linear in its checkpoint's files, and only a rescan reads
// everything. A poll costs nothing while every directory is watched but a look at Dir.
//
// Events wait in memory while out is not read; reading the file system never waits on out.
//
// Run returns nil when ctx is done, ErrDirGone as above, and an error if the watch cannot be set
// up (fsnotify cannot start, Dir cannot be opened or read, or watched for another reason than the
// watch limit). Run returns only after its goroutines (and fsnotify's) have exited.
func (w *Watcher) Run(ctx context.Context, out chan<- WatchEvent) error {
	fw, err := w.newInotify()
	switch {
	case errors.Is(err, syscall.EMFILE):
		// No inotify instance to be had (fs.inotify.max_user_instances, per user and shared by
		// every container of that user, or the open file limit): everything is polled, as a
		// directory beyond the watch limit is. Before, nothing was ever uploaded (found from
		// outside).
		w.log.Error().Err(err).Float64("poll_interval_s", logSeconds(w.pollEvery)).Str("fix", watchInstanceFix).
			Msg(watchMsgNoInstance)
		fw = nil
	case err != nil:
		return fmt.Errorf("start fsnotify: %w", err)
	default:
		defer func() { _ = fw.Close() }() // waits for fsnotify's goroutine
	}
	root, err := os.OpenRoot(w.dir)
	if err != nil {
		return fmt.Errorf("open checkpoint dir: %w", err)
	}
	defer func() { _ = root.Close() }()
	self, err := root.Stat(".")
	if err != nil {
		return fmt.Errorf("stat checkpoint dir: %w", err)
	}
	if w.lock {
		switch release, err := lockRoot(root, w.dir); {
		case errors.Is(err, ErrDirInUse):
			return err
		case err != nil:
			w.log.Warn().Err(err).Msg("the checkpoint directory cannot be locked here: a second agent watching it would not be refused")
		default:
			defer release()
		}
	}
	r := newWatchRun(w, fw, root)
	r.self = self
	defer r.deb.Stop()
	if err := r.add(w.dir); err != nil {
		if !errors.Is(err, syscall.ENOSPC) && !errors.Is(err, errNoInotify) {
			return fmt.Errorf("watch checkpoint dir %s: %w", w.dir, err)
		}
		r.topUnwatched = true
		r.couldNotWatch(w.dir, err)
	}
	defer r.unwatchedGone()
	if err := r.rescan(); err != nil {
		return err
	}
	r.sayUnwatched()
	if w.ready != nil {
		w.ready()
	}
	return r.loop(ctx, out)
}

// watchMsgNoInstance is Run's line when it can have no inotify instance.
const watchMsgNoInstance = "no inotify instance (fs.inotify.max_user_instances, or the open file limit, is reached): checkpoint.dir is polled instead of watched"

// errNoInotify is add's error when Run has no inotify instance: every directory is polled.
var errNoInotify = errors.New("no inotify instance")

// watchInstanceFix says how to raise the inotify instance limit.
const watchInstanceFix = "raise it (sysctl -w fs.inotify.max_user_instances=1024, and a line in /etc/sysctl.d/ to keep it), then restart the agent to watch again"

// add adds a watch on the directory dir (addWatch), or returns errNoInotify without an inotify
// instance.
func (r *watchRun) add(dir string) error {
	if r.fw == nil {
		return errNoInotify
	}
	return r.addWatch(r.fw, dir)
}

// lockRoot is LockDir on the directory root holds open (the one watched), named dir.
func lockRoot(root *os.Root, dir string) (release func(), err error) {
	f, err := root.Open(".")
	if err != nil {
		return nil, err
	}
	return lockOpenDir(f, dir)
}

// watchMsgInPlace starts the warning for a single-file checkpoint written in place.
const watchMsgInPlace = "single-file checkpoint written in place, not renamed into checkpoint.dir"

// ErrDirGone is returned by Watcher.Run when the checkpoint directory itself was removed or moved
// (after a Removed for every checkpoint it held): a caller may wait for it to come back and run a
// new Watcher.
var ErrDirGone = errors.New("checkpoint: the checkpoint directory was removed or moved")

// watchCkpt is what a watchRun knows about one checkpoint.
type watchCkpt struct {
	single bool
	// complete is true once its Complete was sent, until its marker goes; marker is the version
	// of the marker that Complete named.
	complete bool
	marker   FileID
	// inPlace: a single file seen being written under its own name (warned once).
	inPlace bool
	// withheld is the error its Complete was last withheld for (Withheld), "" if none; retry:
	// something in it changed since, so the next tick reads it again to try the Complete.
	withheld string
	retry    bool
	// nestedSaid: a file named like the marker below its top was warned of (nestedMarker).
	nestedSaid bool
}

// watchNode is what a watchRun keeps about one path below Dir: a file it reported, a
// directory it watches or could not watch, a path it logged as skipped, a file waiting for its
// debounce, and the directories on the way to them. The nodes form a tree, so that everything
// below a directory is found in time linear in its number, and a node with nothing to keep is
// removed (prune).
type watchNode struct {
	rel    string     // relative to Dir, slash-separated
	parent *watchNode // nil at the top of Dir
	kids   map[string]*watchNode
	// stamp is the FileID of the file's last FileReady; zero if it has none.
	stamp FileID
	// grown is the size of the file's last FileGrowing since its last FileReady, 0 if none;
	// grewAt is when it was last looked at for one.
	grown  int64
	grewAt time.Time
	// warned is the reason of the path's skip log line; "" if none.
	warned string
	// watched is true for a directory with an fsnotify watch.
	watched bool
	// unwatched is, for a directory whose watch could not be added, its element (value the
	// node) in the watchRun's list of them; nil otherwise.
	unwatched *list.Element
}

// keeps reports whether n keeps something: a stamp, a FileGrowing sent, a skip log line, a watch
// or a failed one, a pending debounce (deb's), or nodes below it.
func (n *watchNode) keeps(deb *watchDebouncer) bool {
	return len(n.kids) > 0 || !n.stamp.isZero() || n.grown > 0 || n.warned != "" || n.watched || n.unwatched != nil || deb.Pending(n.rel)
}

// watchRun is the state of one Run. Only Run's goroutine uses it.
type watchRun struct {
	*Watcher
	// strayFileSaid: a file at the top of Dir that looks like a checkpoint but is none was said
	// (strayFile), once a run.
	strayFileSaid bool
	fw            *fsnotify.Watcher
	walker        *scanWalker
	deb           *watchDebouncer
	ckpts         map[string]*watchCkpt
	// nodes are the watchNodes by relative path; a node's parent is there too.
	nodes map[string]*watchNode
	queue []WatchEvent
	// dirGone: Dir was removed or moved; Run returns ErrDirGone once the queue is sent.
	dirGone bool
	// self is Dir as Run opened it (nil when a test makes a watchRun by hand): Dir is gone
	// once its path no longer leads to this directory.
	self fs.FileInfo

	// unwatched lists the nodes of the directories below Dir whose watch could not be added, in
	// the order they are polled (see poll); topUnwatched is true while Dir itself has none.
	unwatched    list.List
	topUnwatched bool
	// limitHit: a watch could not be added for the inotify watch limit since every directory
	// was last watched, first for limitPath; limitSaid: that was logged (or left unlogged for
	// watchLimitLogEvery); limitLogged: when it was last logged.
	limitHit, limitSaid bool
	limitPath           string
	limitLogged         time.Time
	// saidUnwatched is the number of unwatched directories last passed to Unwatched.
	saidUnwatched int
	// badNames are the entries at the top of Dir whose names the store cannot hold (ValidName),
	// each with the marker (the file, for a single-file checkpoint) whose Withheld was sent for
	// it; zero while it has none. They are skipped, not watched, and looked at every tick
	// (checkBadName).
	badNames map[string]FileID
}

func newWatchRun(w *Watcher, fw *fsnotify.Watcher, root *os.Root) *watchRun {
	r := &watchRun{
		Watcher:  w,
		fw:       fw,
		deb:      newWatchDebouncer(w.debounce),
		ckpts:    map[string]*watchCkpt{},
		nodes:    map[string]*watchNode{},
		badNames: map[string]FileID{},
	}
	r.walker = &scanWalker{
		root:    root,
		dir:     w.dir,
		marker:  w.marker,
		pattern: w.pattern,
		owner:   w.owner,
		skip:    r.skip,
		onDir:   r.watchDir,
	}
	return r
}

// loop is Run's select loop.
func (r *watchRun) loop(ctx context.Context, out chan<- WatchEvent) error {
	tick := time.NewTicker(r.pollEvery)
	defer tick.Stop()
	var fwEvents <-chan fsnotify.Event // none without an inotify instance: all is polled
	var fwErrors <-chan error
	if r.fw != nil {
		fwEvents, fwErrors = r.fw.Events, r.fw.Errors
	}
	for {
		r.sayUnwatched()
		var send chan<- WatchEvent
		var next WatchEvent
		if len(r.queue) > 0 {
			send, next = out, r.queue[0]
		}
		if r.dirGone && len(r.queue) == 0 {
			return ErrDirGone
		}
		select {
		case <-ctx.Done():
			return nil
		case send <- next:
			r.queue[0] = WatchEvent{}
			r.queue = r.queue[1:]
			if len(r.queue) == 0 {
				r.queue = nil
			}
		case ev, ok := <-fwEvents:
			if !ok {
				return errors.New("fsnotify stopped")
			}
			r.handle(ev)
		case err, ok := <-fwErrors:
			if !ok {
				return errors.New("fsnotify stopped")
			}
			r.fsError(err)
		case <-r.deb.C():
			for _, key := range r.deb.Due() {
				r.ready(key)
			}
		case <-tick.C:
			r.tick()
		}
	}
}

// tick is the periodic step of a run: Dir gone (see dirStillThere) ends it; otherwise what has
// no watch is polled.
func (r *watchRun) tick() {
	if r.dirGone {
		return
	}
	if !r.dirStillThere() {
		r.dirRemoved()
		return
	}
	r.poll()
	for _, name := range slices.Sorted(maps.Keys(r.badNames)) {
		r.checkBadName(name)
	}
	for _, name := range slices.Sorted(maps.Keys(r.ckpts)) {
		if c := r.ckpts[name]; c.retry {
			c.retry = false
			if !c.complete && c.withheld != "" {
				r.refresh(name, c)
			}
		}
	}
}

// dirStillThere reports whether Dir's path still leads to the directory the run opened. It does
// not when the path is gone or is another directory (or file) now: Dir deleted, perhaps made
// again, or moved and replaced. The kernel says IN_DELETE_SELF only once the last reference to
// a deleted directory is gone, and the run's own handle on Dir (or a process whose working
// directory it is) holds one: so a deleted Dir is seen here, by looking, not by an event. It
// reports true when it cannot tell (an error other than the path not being there).
func (r *watchRun) dirStillThere() bool {
	if r.self == nil {
		return true
	}
	fi, err := os.Stat(r.dir)
	if errors.Is(err, fs.ErrNotExist) || errors.Is(err, syscall.ENOTDIR) {
		return false
	}
	return err != nil || os.SameFile(fi, r.self)
}

// dirRemoved handles Dir itself removed or moved: everything it held is gone with it, as far as
// anyone watching can tell. Run returns ErrDirGone once the queue is sent.
func (r *watchRun) dirRemoved() {
	if r.dirGone {
		return
	}
	r.log.Error().Str("dir", r.dir).Msg("checkpoint directory was removed or moved")
	for _, name := range slices.Sorted(maps.Keys(r.ckpts)) {
		r.emit(WatchEvent{Kind: Removed, Checkpoint: name})
	}
	r.dirGone = true
}

// emit queues ev for out.
func (r *watchRun) emit(ev WatchEvent) {
	ev.At = time.Now()
	r.queue = append(r.queue, ev)
}

// abs returns the absolute path of rel.
func (r *watchRun) abs(rel string) string {
	return filepath.Join(r.dir, filepath.FromSlash(rel))
}

// node returns the node of rel, making it (and the nodes above it) if need be.
func (r *watchRun) node(rel string) *watchNode {
	if n := r.nodes[rel]; n != nil {
		return n
	}
	n := &watchNode{rel: rel}
	if i := strings.LastIndexByte(rel, '/'); i >= 0 {
		n.parent = r.node(rel[:i])
		if n.parent.kids == nil {
			n.parent.kids = map[string]*watchNode{}
		}
		n.parent.kids[rel[i+1:]] = n
	}
	r.nodes[rel] = n
	return n
}

// prune removes n, and then the nodes above it, as long as they keep nothing.
func (r *watchRun) prune(n *watchNode) {
	for n != nil && !n.keeps(r.deb) {
		delete(r.nodes, n.rel)
		p := n.parent
		if p != nil {
			delete(p.kids, n.rel[len(p.rel)+1:])
		}
		n = p
	}
}

// checkNodes returns the first thing wrong with r's nodes, or nil. Every node is linked from
// the node above it and to the nodes below it, every key waiting for its debounce has a node,
// every node keeps something (see keeps), and the list of unwatched directories holds exactly
// the nodes that say they are in it: so dropping a directory finds everything below it, and the
// run's memory and the cost of a drop stay linear in what is below (invariant I8).
func (r *watchRun) checkNodes() error {
	for rel, n := range r.nodes {
		if n.rel != rel {
			return fmt.Errorf("node %q is filed as %q", n.rel, rel)
		}
		if i := strings.LastIndexByte(rel, '/'); i < 0 {
			if n.parent != nil {
				return fmt.Errorf("top-level node %q has a parent %q", rel, n.parent.rel)
			}
		} else if p := r.nodes[rel[:i]]; p == nil || n.parent != p || p.kids[rel[i+1:]] != n {
			return fmt.Errorf("node %q is not linked from %q", rel, rel[:i])
		}
		for name, k := range n.kids {
			if k.parent != n || k.rel != rel+"/"+name || r.nodes[k.rel] != k {
				return fmt.Errorf("node %q has a stray kid %q", rel, name)
			}
		}
		if !n.keeps(r.deb) {
			return fmt.Errorf("node %q keeps nothing", rel)
		}
		if n.unwatched != nil && (n.watched || n.unwatched.Value != n) {
			return fmt.Errorf("node %q is listed as unwatched wrongly", rel)
		}
	}
	listed := 0
	for e := r.unwatched.Front(); e != nil; e = e.Next() {
		n := e.Value.(*watchNode)
		if r.nodes[n.rel] != n || n.unwatched != e {
			return fmt.Errorf("unwatched %q has no node that lists it", n.rel)
		}
		listed++
	}
	if listed != r.unwatched.Len() {
		return fmt.Errorf("unwatched list of %d holds %d", r.unwatched.Len(), listed)
	}
	for key := range r.deb.keys {
		if r.nodes[key] == nil {
			return fmt.Errorf("%q waits for its debounce without a node", key)
		}
	}
	return nil
}

// pruneRel prunes the node of rel, if there is one.
func (r *watchRun) pruneRel(rel string) {
	if n := r.nodes[rel]; n != nil {
		r.prune(n)
	}
}

// stamp returns the FileID of the last FileReady of rel; zero if it has none.
func (r *watchRun) stamp(rel string) FileID {
	if n := r.nodes[rel]; n != nil {
		return n.stamp
	}
	return FileID{}
}

// watched reports whether the directory rel has a watch.
func (r *watchRun) watched(rel string) bool {
	n := r.nodes[rel]
	return n != nil && n.watched
}

// touch (re)starts the debounce of the file rel.
func (r *watchRun) touch(rel string) {
	r.node(rel)
	r.deb.Touch(rel)
}

// report sends a FileReady for the file whose node is n, path sub of checkpoint name, which
// Lstat described as fi, with id its FileID, and remembers it.
func (r *watchRun) report(n *watchNode, name, sub string, fi fs.FileInfo, id FileID) {
	r.nestedMarker(name, sub)
	n.stamp = id
	n.grown = 0
	n.warned = "" // a later skip is a new one, worth a log line
	r.emit(WatchEvent{Kind: FileReady, Checkpoint: name, Path: sub, Size: fi.Size(), ModTime: fi.ModTime(), ID: id})
}

// nestedMarker warns, once per checkpoint directory, of a file sub named like the marker below
// the top of the checkpoint directory name, which is not complete: only a marker at its top
// completes it, so nothing of it is ever committed. That is what a checkpoint.dir one level (or
// more) above the trainer's checkpoints looks like (checkpoint.dir set to checkpoints while Hugging
// Face's output_dir is checkpoints/run1): each of its saves is sent, as part of run1, and never
// committed.
func (r *watchRun) nestedMarker(name, sub string) {
	c := r.ckpts[name]
	if c == nil || c.single || c.complete || c.nestedSaid || !strings.Contains(sub, "/") || path.Base(sub) != r.marker {
		return
	}
	c.nestedSaid = true
	want := filepath.Join(r.dir, name, filepath.FromSlash(path.Dir(path.Dir(sub))))
	r.log.Warn().Str("checkpoint", name).Str("marker", sub).Str("checkpoint_dir", r.dir).
		Str("fix", "set checkpoint.dir to "+want+", if that is the directory the trainer writes its checkpoint directories into; "+
			"otherwise write "+r.marker+" at the top of "+filepath.Join(r.dir, name)+" once all of it is written").
		Msg("a file named like the marker is below the top of a checkpoint directory, which it does not complete: nothing of it is committed; checkpoint.dir looks too high")
}

// skip logs a skipped path once (again only if the reason changes).
func (r *watchRun) skip(rel, kind string, err error) {
	if err != nil && !strings.Contains(rel, "/") && ValidName(rel) != nil {
		if _, ok := r.badNames[rel]; !ok {
			r.badNames[rel] = FileID{}
		}
		defer r.checkBadName(rel) // after its skip's line
	}
	reason := kind
	if err != nil {
		reason = err.Error()
	}
	n := r.node(rel)
	if n.warned == reason {
		return
	}
	n.warned = reason
	scanLogSkip(r.log, r.abs(rel), kind, err, isMarkerPath(rel, r.marker))
	if err != nil && !strings.Contains(rel, "/") && r.walker.isSingle(rel) && (errors.Is(err, errScanUnreadable) || errors.Is(err, errScanHardLink)) {
		r.singleWithheld(rel, err)
	}
}

// singleWithheld sends the Withheld of the single-file checkpoint name, a regular file matching
// the pattern that is skipped because of err (the owner of Dir could not read it, or it is
// another user's hard link): a checkpoint the trainer saved that is never committed, which must
// be an error, not a warning alone.
func (r *watchRun) singleWithheld(name string, err error) {
	fi, lerr := r.walker.root.Lstat(name)
	if lerr != nil || !fi.Mode().IsRegular() {
		return
	}
	err = fmt.Errorf("%w: %s: %w; %s", ErrNotStorable, name, err, notStorableFix)
	r.log.Error().Err(err).Str("checkpoint", name).Msg("single-file checkpoint cannot be stored; never committed as it is")
	r.emit(WatchEvent{Kind: Withheld, Checkpoint: name, Path: name, Size: fi.Size(), ModTime: fi.ModTime(), ID: FileIDOf(fi), Err: err})
}

// checkBadName looks at name, at the top of Dir, whose name the store cannot hold (a checkpoint
// named LATEST, with a backslash, or not UTF-8): once a checkpoint directory of that name has its
// marker (or a regular file of that name matches Pattern), the trainer saved a checkpoint that is
// never committed under that name, which must be an error, not the skip's warning alone. It
// sends its Withheld (ErrNameNotStorable), once for each version of the marker. A name that is gone
// is forgotten, with a Removed if it had a Withheld.
func (r *watchRun) checkBadName(name string) {
	said, ok := r.badNames[name]
	if !ok {
		return
	}
	fi, err := r.walker.root.Lstat(name)
	if errors.Is(err, fs.ErrNotExist) {
		if said.known() {
			r.emit(WatchEvent{Kind: Removed, Checkpoint: name}) // its Withheld is void
		}
		delete(r.badNames, name)
		if n := r.nodes[name]; n != nil {
			n.warned = "" // made again, it is said again
			r.prune(n)
		}
		return
	}
	if err != nil {
		return
	}
	marker, rel := fi, name
	switch {
	case fi.IsDir():
		rel = r.marker
		marker, err = r.walker.root.Lstat(name + "/" + r.marker)
		if err != nil || !marker.Mode().IsRegular() {
			return // a marker written later (another version) is said
		}
	case !fi.Mode().IsRegular() || !r.walker.isSingle(name):
		return
	}
	id := FileIDOf(marker)
	if said.Same(id) {
		return
	}
	r.badNames[name] = id
	err = fmt.Errorf("%w: %w; rename it to a name the store can hold (valid UTF-8, without a backslash or control character, not LATEST): it is committed under its new name",
		ErrNameNotStorable, ValidName(name))
	r.log.Error().Err(err).Str("checkpoint", name).Msg("marker is there but the checkpoint's own name cannot be stored; never committed under this name")
	r.emit(WatchEvent{Kind: Withheld, Checkpoint: name, Path: rel, Size: marker.Size(), ModTime: marker.ModTime(), ID: id, Err: err})
}

// unreport takes back the FileReady of the file rel, which can no longer be reported (it is
// not a regular file that may be reported): a FileGone for a file of a checkpoint directory,
// Removed for a single-file checkpoint. It does nothing if rel had no FileReady (nor a
// FileGrowing since).
func (r *watchRun) unreport(rel string) {
	n := r.nodes[rel]
	if n == nil || (n.stamp.isZero() && n.grown == 0) {
		return
	}
	n.stamp, n.grown = FileID{}, 0
	name, sub, nested := strings.Cut(rel, "/")
	if nested {
		r.emit(WatchEvent{Kind: FileGone, Checkpoint: name, Path: sub})
	} else {
		// Its node stays, with the skip's log line.
		r.deb.Forget(name)
		delete(r.ckpts, name)
		r.emit(WatchEvent{Kind: Removed, Checkpoint: name})
	}
	r.prune(n)
}

// markerGone handles the marker of the complete checkpoint name going away.
func (r *watchRun) markerGone(name string, c *watchCkpt) {
	c.complete = false
	// Debug: the uploader says it where it matters, a checkpoint not committed yet; the trainer
	// deleting committed checkpoints made a sixth of the log of this line (found from outside).
	r.log.Debug().Str("checkpoint", name).Msg("marker removed; the checkpoint is no longer complete")
	r.emit(WatchEvent{Kind: FileGone, Checkpoint: name, Path: r.marker})
}

// watchDir adds a watch on the directory rel, unless it has one. A directory whose watch cannot
// be added (for the inotify watch limit, most likely) is listed as unwatched, to be polled and
// tried again (see poll), and said once (see couldNotWatch).
func (r *watchRun) watchDir(rel string) {
	n := r.node(rel)
	if n.watched {
		return
	}
	err := r.add(r.abs(rel))
	switch {
	case err == nil:
		r.unlist(n)
		n.watched = true
	case errors.Is(err, fs.ErrNotExist):
		r.unlist(n)
		r.prune(n)
	case n.unwatched == nil:
		n.unwatched = r.unwatched.PushBack(n)
		r.couldNotWatch(r.abs(rel), err)
	}
}

// unlist takes n off the list of unwatched directories, if it is on it.
func (r *watchRun) unlist(n *watchNode) {
	if n.unwatched != nil {
		r.unwatched.Remove(n.unwatched)
		n.unwatched = nil
	}
}

// couldNotWatch says that the directory abs could not be watched for err. The inotify watch
// limit (ENOSPC from inotify_add_watch; it reads "no space left on device" but has nothing to
// do with the disk) is logged once for all directories by sayUnwatched; any other error is
// logged for the directory at once.
func (r *watchRun) couldNotWatch(abs string, err error) {
	if errors.Is(err, errNoInotify) {
		return // said once, as Run began
	}
	if errors.Is(err, syscall.ENOSPC) {
		if !r.limitHit {
			r.limitHit, r.limitPath = true, abs
		}
		return
	}
	r.log.Error().Err(err).Str("path", abs).Float64("poll_interval_s", logSeconds(r.pollEvery)).
		Msg("cannot watch directory; it is polled instead")
}

// unwatchedCount is the number of directories without a watch, Dir itself included.
func (r *watchRun) unwatchedCount() int {
	n := r.unwatched.Len()
	if r.topUnwatched {
		n++
	}
	return n
}

// sayUnwatched logs and passes on (WatchConfig.Unwatched) a change in the number of directories
// without a watch: the inotify watch limit once (again only after every directory was watched
// in between, and at most once every watchLimitLogEvery), with how to raise it; an Info line
// once every directory is watched again.
func (r *watchRun) sayUnwatched() {
	n := r.unwatchedCount()
	if r.limitHit && !r.limitSaid && n > 0 {
		r.limitSaid = true
		if r.limitLogged.IsZero() || time.Since(r.limitLogged) >= watchLimitLogEvery {
			r.limitLogged = time.Now()
			ev := r.log.Error().Err(syscall.ENOSPC).Str("path", r.limitPath).Int("unwatched_dirs", n).
				Float64("poll_interval_s", logSeconds(r.pollEvery)).Str("fix", watchLimitFix)
			if limit, ok := watchLimit("/proc/sys/fs/inotify/max_user_watches"); ok {
				ev = ev.Str("max_user_watches", limit)
				// In a user namespace of its own (a rootless container), the namespace's limit
				// counts too, and can be the lower.
				if ns, ok := watchLimit("/proc/sys/user/max_inotify_watches"); ok && ns != limit {
					ev = ev.Str("user_namespace_max_inotify_watches", ns)
				}
			}
			ev.Msg(watchMsgLimit)
		}
	}
	if n == r.saidUnwatched {
		return
	}
	if n == 0 {
		r.log.Info().Msg(watchMsgAllWatched)
		r.limitHit, r.limitSaid = false, false
	}
	r.saidUnwatched = n
	if r.onUnwatched != nil {
		r.onUnwatched(r.unwatchedProblem(n))
	}
}

// unwatchedProblem is the sentence passed to WatchConfig.Unwatched for n directories without a
// watch: "" for none.
func (r *watchRun) unwatchedProblem(n int) string {
	if n == 0 {
		return ""
	}
	if r.fw == nil {
		return fmt.Sprintf("checkpoint.dir cannot be watched: no inotify instance could be had (fs.inotify.max_user_instances, or the open file limit, is reached), so its %d directories are polled every %v instead; %s",
			n, r.pollEvery, watchInstanceFix)
	}
	if r.limitHit {
		return fmt.Sprintf("%d directories of checkpoint.dir cannot be watched: the inotify watch limit (fs.inotify.max_user_watches) is reached, so they are polled every %v instead; %s",
			n, r.pollEvery, watchLimitFix)
	}
	return fmt.Sprintf("%d directories of checkpoint.dir cannot be watched (see the log), so they are polled every %v instead", n, r.pollEvery)
}

// unwatchedGone tells WatchConfig.Unwatched, when Run returns, that this run's unwatched
// directories are none of its business any more.
func (r *watchRun) unwatchedGone() {
	if r.saidUnwatched != 0 && r.onUnwatched != nil {
		r.onUnwatched("")
	}
}

// poll looks at what has no watch, at a cost bounded by the number of checkpoints and
// watchPollBudget names (nothing at all while every directory is watched):
//   - Dir itself, if it has no watch: its watch is tried again, and its top level is read as its
//     events would have told it (see pollTop);
//   - the marker of every checkpoint directory without a watch, so that a checkpoint completes
//     (or stops being complete) within one poll, however many directories wait;
//   - then the directories without a watch in turn, from where the last poll stopped, until
//     watchPollBudget names are read: each is given its watch if it can be (until one fails in
//     this poll: the limit is still reached), then read as its events would have told it (see
//     pollDir).
func (r *watchRun) poll() {
	if r.unwatchedCount() == 0 {
		return
	}
	adding := r.fw != nil
	if r.topUnwatched {
		err := r.add(r.dir)
		if err == nil {
			r.topUnwatched = false
		} else if errors.Is(err, syscall.ENOSPC) {
			adding = false
		}
		r.pollTop(err == nil)
	}
	r.pollMarkers()
	budget := watchPollBudget
	for range r.unwatched.Len() {
		e := r.unwatched.Front()
		if e == nil || budget <= 0 {
			break
		}
		n := e.Value.(*watchNode)
		r.unwatched.MoveToBack(e)
		watched := false
		if adding {
			switch err := r.add(r.abs(n.rel)); {
			case err == nil:
				r.unlist(n)
				n.watched = true
				watched = true
			case errors.Is(err, syscall.ENOSPC):
				adding = false // still past the limit
			}
		}
		budget -= r.pollDir(n.rel, watched)
	}
}

// pollMarkers looks at the marker of every checkpoint directory without a watch, as its events
// would have told it: a marker that appeared completes its checkpoint (see changed), and one that
// went (or is no longer a regular file) takes its Complete back.
func (r *watchRun) pollMarkers() {
	var names []string
	for name, c := range r.ckpts {
		if n := r.nodes[name]; !c.single && n != nil && n.unwatched != nil {
			names = append(names, name)
		}
	}
	slices.Sort(names)
	for _, name := range names {
		c := r.ckpts[name]
		rel := name + "/" + r.marker
		fi, err := r.walker.lstat(rel)
		switch {
		case err == nil && (!c.complete || !fi.Mode().IsRegular()):
			r.changed(rel)
		case errors.Is(err, fs.ErrNotExist) && c.complete:
			r.gone(rel, false)
		}
	}
}

// pollDir reads the directory rel of a checkpoint directory, which has no watch (or, if watched,
// was given one just now), and handles what changed in it since it was last looked at as its
// events would have told it: a name that is gone is gone (see gone); a new directory is read and
// watched if it can be (see changed); a file neither pending nor reported as it is now waits for
// its debounce, but in a directory without a watch only once its modification time is Debounce
// old (its writes are not seen: a file still being written waits for a later poll rather than
// being reported half written); the marker completes its checkpoint at once. It returns the
// number of names it read, at least 1.
func (r *watchRun) pollDir(rel string, watched bool) int {
	name, _, _ := strings.Cut(rel, "/")
	c := r.ckpts[name]
	if c == nil || c.single {
		return 1
	}
	fi, err := r.walker.lstat(rel)
	switch {
	case errors.Is(err, fs.ErrNotExist):
		r.gone(rel, false)
		return 1
	case err != nil:
		return 1 // tried again at the next poll
	case !fi.IsDir():
		r.gone(rel, false)
		r.changed(rel) // what is there now
		return 1
	}
	d, err := r.walker.root.OpenRoot(rel)
	if err != nil {
		return 1
	}
	defer func() { _ = d.Close() }() // a directory: nothing was written
	if got, err := d.Stat("."); err != nil || !os.SameFile(fi, got) {
		return 1 // replaced while it was opened: the next poll looks again
	}
	names, err := scanReadDir(d, ".")
	if err != nil {
		return 1
	}
	present := make(map[string]bool, len(names))
	for _, base := range names {
		present[base] = true
	}
	if n := r.nodes[rel]; n != nil {
		for _, base := range slices.Sorted(maps.Keys(n.kids)) {
			if !present[base] {
				r.gone(rel+"/"+base, false)
			}
		}
	}
	now := time.Now()
	for _, base := range names {
		child := rel + "/" + base
		if scanSkipName(base) || r.deb.Pending(child) {
			continue
		}
		cfi, err := d.Lstat(base)
		if err != nil {
			continue
		}
		k := r.nodes[child]
		switch {
		case cfi.IsDir():
			if k != nil && (k.watched || k.unwatched != nil) {
				continue // it has its own watch, or its own turn
			}
		case !cfi.Mode().IsRegular():
		case rel == name && base == r.marker:
			if c.complete {
				continue
			}
		case k != nil && k.stamp.Same(FileIDOf(cfi)):
			continue
		case !watched && now.Sub(cfi.ModTime()) < r.debounce:
			continue
		}
		r.changed(child)
	}
	return max(len(names), 1)
}

// pollTop reads the top of Dir, which had no watch (and, if watched, was given one just now), as
// its events would have told it: a checkpoint that is gone is Removed, a new checkpoint directory
// is read (see changedTop), and a single-file checkpoint neither pending nor reported as it is
// now waits for its debounce (without a watch, only once its modification time is Debounce old,
// as in pollDir).
func (r *watchRun) pollTop(watched bool) {
	names, err := scanReadDir(r.walker.root, ".")
	if err != nil {
		return
	}
	present := make(map[string]bool, len(names))
	for _, name := range names {
		present[name] = true
	}
	for _, name := range slices.Sorted(maps.Keys(r.ckpts)) {
		if !present[name] {
			r.gone(name, false)
		}
	}
	now := time.Now()
	for _, name := range names {
		if scanSkipName(name) || name == MetaDir || r.deb.Pending(name) {
			continue
		}
		fi, err := r.walker.root.Lstat(name)
		if err != nil {
			continue
		}
		c := r.ckpts[name]
		switch {
		case fi.IsDir():
			if c != nil && !c.single {
				continue // its own watch, or its own turn
			}
		case !fi.Mode().IsRegular():
		case c == nil && !r.walker.isSingle(name):
			continue // not a checkpoint
		case r.stamp(name).Same(FileIDOf(fi)):
			continue
		case !watched && now.Sub(fi.ModTime()) < r.debounce:
			continue
		}
		r.changedTop(name)
	}
}

// watchLimit returns the inotify watch limit at path (fs.inotify.max_user_watches, or the user
// namespace's user.max_inotify_watches), if it can be read.
func watchLimit(path string) (string, bool) {
	b, err := os.ReadFile(path)
	if err != nil {
		return "", false
	}
	return strings.TrimSpace(string(b)), true
}

// fsError handles an error from fsnotify.
func (r *watchRun) fsError(err error) {
	if !errors.Is(err, fsnotify.ErrEventOverflow) {
		r.log.Error().Err(err).Msg("fsnotify error; watching on")
		return
	}
	r.log.Warn().Err(err).Msg("fsnotify events were lost; rescanning the checkpoint directory")
	if err := r.rescan(); err != nil {
		r.log.Error().Err(err).Msg("rescan failed; watching on")
	}
}

// rescan reads Dir in full and sends everything it finds, as at the start: Removed for the
// checkpoints that are gone (or changed between directory and single file), then for each
// checkpoint FileGone for what it no longer has, its files and its Complete. Every watch below
// Dir is set up again, so a directory replaced while events were lost is watched anew.
func (r *watchRun) rescan() (err error) {
	for _, n := range r.nodes {
		if n.watched {
			_ = r.fw.Remove(r.abs(n.rel))
			n.watched = false
		}
		r.unlist(n) // tried again below
	}
	found, err := r.walker.all()
	if err != nil {
		return err
	}
	// Oldest first, as a consumer numbers what it meets in turn: the checkpoint written last is
	// the newest whatever its name (Hugging Face's checkpoint-1000 sorts before checkpoint-500).
	changed := make(map[string]time.Time, len(found))
	for _, f := range found {
		changed[f.name] = f.changedAt()
	}
	slices.SortStableFunc(found, func(a, b scanFound) int { return changed[a.name].Compare(changed[b.name]) })
	first := len(r.queue)
	defer func() {
		if err == nil && r.readDone {
			r.queue = append(r.queue, WatchEvent{Kind: ReadDone, At: time.Now()})
		}
		for i := first; i < len(r.queue)-1; i++ {
			r.queue[i].More = true
		}
	}()
	present := map[string]bool{}
	for _, f := range found {
		present[f.name] = f.single
	}
	for _, name := range slices.Sorted(maps.Keys(r.ckpts)) {
		if single, ok := present[name]; !ok || single != r.ckpts[name].single {
			r.drop(name, false)
			delete(r.ckpts, name)
			r.emit(WatchEvent{Kind: Removed, Checkpoint: name})
		}
	}
	r.deb.Reset()
	for _, f := range found {
		old := r.ckpts[f.name]
		c := &watchCkpt{single: f.single}
		r.ckpts[f.name] = c
		switch {
		case f.err != nil && f.marker != nil:
			if old != nil {
				c.withheld = old.withheld
			}
			r.notComplete(c, f)
		case f.err != nil:
			r.log.Error().Err(f.err).Str("checkpoint", f.name).Msg(notReadMsg(f.err))
		case old != nil && !f.single:
			r.goneSince(f)
			if old.complete && f.marker == nil {
				r.markerGone(f.name, c)
			}
		}
		r.emitFound(c, f, false)
	}
	for _, n := range r.nodes {
		r.prune(n) // what waited for its debounce and is not there now
	}
	return nil
}

// emitFound sends a FileReady for every file of f (only those that changed since their last
// FileReady if onlyChanged), then a Complete if f is complete. Without a marker, a file
// modified less than Debounce ago may still be being written: it waits for its debounce
// instead, like a file seen by its events (a single-file checkpoint is its own marker, so its
// Complete then waits too).
func (r *watchRun) emitFound(c *watchCkpt, f scanFound, onlyChanged bool) {
	now := time.Now()
	waits := func(fi fs.FileInfo) bool {
		return (f.single || !f.complete()) && now.Sub(fi.ModTime()) < r.debounce
	}
	for _, sf := range f.files {
		key := f.name
		if !f.single {
			key = f.name + "/" + sf.Path
		}
		r.deb.Forget(key)
		n := r.node(key)
		if onlyChanged && n.stamp.Same(sf.ID) {
			continue
		}
		if waits(sf.info) {
			n.stamp = FileID{} // reported again once quiet, as it is then
			r.deb.Touch(key)
			continue
		}
		r.report(n, f.name, sf.Path, sf.info, sf.ID)
	}
	if !f.complete() || (f.single && waits(f.marker)) {
		return
	}
	c.complete, c.marker, c.withheld = true, FileIDOf(f.marker), ""
	markerPath := r.marker
	if f.single {
		markerPath = f.name
	}
	r.emit(WatchEvent{Kind: Complete, Checkpoint: f.name, Path: markerPath, Size: f.marker.Size(), ModTime: f.marker.ModTime(), ID: FileIDOf(f.marker)})
}

// goneSince sends a FileGone, in path order, for every file of the checkpoint directory f
// that had a FileReady but that f, read in full just now, does not have, and forgets its
// stamp. It costs time linear in what the run keeps below f.
func (r *watchRun) goneSince(f scanFound) {
	top := r.nodes[f.name]
	if top == nil {
		return
	}
	has := make(map[string]bool, len(f.files))
	for _, sf := range f.files {
		has[sf.Path] = true
	}
	var lost []*watchNode
	var walk func(n *watchNode)
	walk = func(n *watchNode) {
		for _, k := range n.kids {
			if !k.stamp.isZero() && !has[k.rel[len(f.name)+1:]] {
				lost = append(lost, k)
			}
			walk(k)
		}
	}
	walk(top)
	slices.SortFunc(lost, func(a, b *watchNode) int { return strings.Compare(a.rel, b.rel) })
	for _, n := range lost {
		n.stamp = FileID{}
		r.emit(WatchEvent{Kind: FileGone, Checkpoint: f.name, Path: n.rel[len(f.name)+1:]})
	}
	for _, n := range lost {
		r.prune(n)
	}
}

// drop forgets rel and everything below it: pending debounces, stamps, watches and skip log
// lines. If gone (rel is inside a checkpoint directory), it first sends a FileGone, in path
// order, for every file at or below rel that had a FileReady. It costs time linear in what
// the run keeps below rel.
func (r *watchRun) drop(rel string, gone bool) {
	n := r.nodes[rel]
	if n == nil {
		return
	}
	var lost []string
	var walk func(n *watchNode)
	walk = func(n *watchNode) {
		for _, k := range n.kids {
			walk(k)
		}
		r.deb.Forget(n.rel)
		if n.watched {
			// The watch is gone already if the directory was removed; a moved one still has it.
			_ = r.fw.Remove(r.abs(n.rel))
		}
		r.unlist(n)
		if gone && (!n.stamp.isZero() || n.grown > 0) {
			lost = append(lost, n.rel)
		}
		delete(r.nodes, n.rel)
	}
	walk(n)
	if p := n.parent; p != nil {
		delete(p.kids, n.rel[len(p.rel)+1:])
		r.prune(p)
	}
	slices.Sort(lost)
	for _, k := range lost {
		name, sub, _ := strings.Cut(k, "/")
		r.emit(WatchEvent{Kind: FileGone, Checkpoint: name, Path: sub})
	}
}

// handle handles one fsnotify event.
func (r *watchRun) handle(ev fsnotify.Event) {
	rel, err := filepath.Rel(r.dir, ev.Name)
	if err != nil || rel == ".." || strings.HasPrefix(rel, ".."+string(filepath.Separator)) {
		return
	}
	rel = filepath.ToSlash(rel)
	if rel == "." {
		if ev.Has(fsnotify.Remove) || ev.Has(fsnotify.Rename) {
			r.dirRemoved()
		}
		return
	}
	top, _, _ := strings.Cut(rel, "/")
	if c := r.ckpts[top]; c != nil && c.withheld != "" {
		// Whatever changed may be what kept it from being complete (a chmod, of the checkpoint
		// directory too, a file deleted or renamed): read it again at the next tick, once for
		// any number of events (chmod -R).
		c.retry = true
	}
	if ev.Has(fsnotify.Remove) || ev.Has(fsnotify.Rename) {
		r.gone(rel, ev.Has(fsnotify.Rename) && !ev.Has(fsnotify.Remove))
	}
	if ev.Has(fsnotify.Create) || ev.Has(fsnotify.Write) || ev.Has(fsnotify.Chmod) {
		r.changed(rel)
	}
	if ev.Has(fsnotify.Write) {
		r.writtenInPlace(rel)
		r.grew(rel)
	}
}

// grew sends a FileGrowing for rel, a file of a checkpoint directory just written to and waiting
// for its debounce, if it has grown by growStep since its last one (looking at most every
// growEvery).
func (r *watchRun) grew(rel string) {
	name, sub, nested := strings.Cut(rel, "/")
	if r.growStep == 0 || !nested || sub == r.marker {
		return
	}
	c := r.ckpts[name]
	n := r.nodes[rel]
	if c == nil || c.single || c.complete || n == nil || !r.deb.Pending(rel) {
		return
	}
	now := time.Now()
	if n.grewAt.IsZero() && r.growEvery > 0 {
		// Its first write: a file written whole within growEvery (most are) costs no Lstat.
		n.grewAt = now
		return
	}
	if now.Sub(n.grewAt) < r.growEvery {
		return
	}
	n.grewAt = now
	fi, err := r.walker.lstat(rel)
	if err != nil || !fi.Mode().IsRegular() || fi.Size() < n.grown+r.growStep || r.walker.owner.check(fi) != nil {
		return // what is wrong with it is said at its debounce
	}
	n.grown = fi.Size()
	r.emit(WatchEvent{Kind: FileGrowing, Checkpoint: name, Path: sub, Size: fi.Size(), ModTime: fi.ModTime(), ID: FileIDOf(fi)})
}

// writtenInPlace warns, once per single-file checkpoint, that rel is one being written under
// its own name (torch.save(obj, path)) rather than renamed into place: such a file is taken as
// complete once quiet for the debounce, so a save that pauses that long or dies half way would
// be committed torn, and nothing can tell.
func (r *watchRun) writtenInPlace(rel string) {
	c := r.ckpts[rel]
	if c == nil || !c.single || c.inPlace {
		return
	}
	c.inPlace = true
	r.log.Warn().Str("checkpoint", rel).
		Str("risk", fmt.Sprintf("it counts as complete once quiet for %v: a save that pauses that long, or dies half way, is committed torn", r.debounce)).
		Str("fix", `write it under a temporary name, then rename it: torch.save(obj, d + "/.model.pt.tmp"); os.replace(d + "/.model.pt.tmp", d + "/model.pt")`).
		Msg(watchMsgInPlace)
}

// gone handles the removal (or renaming away) of rel; moved says fsnotify reported a rename
// (the Removed of a checkpoint directory is then Moved).
func (r *watchRun) gone(rel string, moved bool) {
	name, sub, nested := strings.Cut(rel, "/")
	c := r.ckpts[name]
	switch {
	case c == nil:
		r.drop(rel, false) // its skip log lines
	case !nested:
		r.drop(name, false)
		delete(r.ckpts, name)
		r.emit(WatchEvent{Kind: Removed, Checkpoint: name, Moved: moved && !c.single})
	case c.single:
	default:
		r.drop(rel, true)
		if sub == r.marker {
			c.withheld = "" // the next marker's trouble, if any, is said again
			if c.complete {
				r.markerGone(name, c)
			}
		}
	}
}

// changed handles the creation or change of rel.
func (r *watchRun) changed(rel string) {
	name, sub, nested := strings.Cut(rel, "/")
	if !nested {
		r.changedTop(name)
		return
	}
	c := r.ckpts[name]
	if c == nil || c.single {
		return
	}
	if r.deb.Pending(rel) {
		r.deb.Touch(rel)
		return
	}
	if scanSkipPath(sub) {
		return
	}
	if err := StorablePath(sub); err != nil {
		r.skip(rel, "", err)
		return
	}
	fi, err := r.walker.lstat(rel)
	switch {
	case errors.Is(err, fs.ErrNotExist):
	case errors.Is(err, fs.ErrPermission) || errors.Is(err, errScanUnreadable):
		// The agent may not look at it (its directory is the trainer's, 0700), or the owner of
		// Dir could not reach it (a root trainer's 0700 directory): what it holds, the marker
		// perhaps, is never committed; the checkpoint is withheld until that changes.
		r.skip(rel, "", agentDenied(err))
		r.notUsable(name, sub, c)
		if sub == r.marker && !c.complete {
			r.refresh(name, c) // once for the checkpoint, not once for each of its files
		}
	case err != nil:
		r.skip(rel, "", err)
		r.notUsable(name, sub, c)
	case fi.IsDir():
		if sub == r.marker {
			r.skip(rel, "directory", nil) // never completes it; its files are the checkpoint's
		}
		if !r.watched(rel) {
			r.refreshDir(name, c, rel, fi)
		}
	case fi.Mode().IsRegular():
		switch {
		case sub != r.marker:
			r.touch(rel)
		case !c.complete:
			r.refresh(name, c)
		case !r.walker.usable(rel, fi):
			r.markerGone(name, c)
		case !FileIDOf(fi).Same(c.marker):
			// The marker written again (another token, a rename over it): the checkpoint
			// completes again, as this version, with the marker's new bytes.
			c.complete = false
			r.refresh(name, c)
		}
	default:
		kind, err := irregularSkip(fi.Mode(), sub == r.marker) // a link withholds its checkpoint when its marker comes (walkDir)
		r.skip(rel, kind, err)
		r.notUsable(name, sub, c)
	}
}

// notUsable handles the path sub of checkpoint directory name, which is now skipped with a
// log line: a file reported before, or the marker of a complete checkpoint, is gone.
func (r *watchRun) notUsable(name, sub string, c *watchCkpt) {
	if sub == r.marker {
		if c.complete {
			r.markerGone(name, c)
		}
		return
	}
	r.unreport(name + "/" + sub)
}

// checkpointFileExts are the extensions of the files trainers save checkpoints in.
var checkpointFileExts = []string{".pt", ".pth", ".bin", ".safetensors", ".ckpt", ".distcp", ".pkl", ".npz", ".h5"}

// strayFile says, once a run, that name, a file at the top of Dir whose extension is a
// checkpoint's, is not part of any checkpoint: not in a checkpoint's directory, and not matching
// Pattern. (Found from outside: a trainer's torch.save into checkpoint.dir was never uploaded, and
// nothing said why.)
func (r *watchRun) strayFile(name string) {
	if r.strayFileSaid || !slices.Contains(checkpointFileExts, strings.ToLower(path.Ext(name))) {
		return
	}
	r.strayFileSaid = true
	fix := "save each checkpoint into a directory of its own in checkpoint.dir, writing the marker " + r.marker + " last"
	if r.pattern == "" {
		fix += ", or, for checkpoints of one file each, set checkpoint.pattern (e.g. '*" + path.Ext(name) + "') and write each to a temporary name (." + name + ".tmp), then rename it into place"
	} else {
		fix += ", or name it to match checkpoint.pattern " + r.pattern
	}
	r.log.Warn().Str("file", name).Str("fix", fix).
		Msg("a file at the top of checkpoint.dir is not part of any checkpoint, and is not uploaded (said once)")
}

// changedTop handles the creation or change of name at the top of Dir.
func (r *watchRun) changedTop(name string) {
	if scanSkipName(name) || name == MetaDir {
		return
	}
	if err := ValidName(name); err != nil {
		r.skip(name, "", err)
		return
	}
	c := r.ckpts[name]
	if c != nil && c.single && r.deb.Pending(name) {
		r.deb.Touch(name)
		return
	}
	fi, err := r.walker.root.Lstat(name)
	switch {
	case errors.Is(err, fs.ErrNotExist):
	case err != nil:
		r.skip(name, "", agentDenied(err))
		r.unreport(name)
	case fi.IsDir():
		if c != nil && !c.single {
			return
		}
		if c != nil {
			r.gone(name, false)
		}
		c = &watchCkpt{}
		r.ckpts[name] = c
		r.refresh(name, c)
	case fi.Mode().IsRegular():
		if !r.walker.isSingle(name) {
			r.strayFile(name)
			return
		}
		if c != nil && !c.single {
			r.gone(name, false)
			c = nil
		}
		if c == nil {
			r.ckpts[name] = &watchCkpt{single: true}
		}
		r.touch(name)
	default:
		r.skip(name, scanKind(fi.Mode()), nil)
		r.unreport(name)
	}
}

// refresh reads the checkpoint directory name again, watching any new sub-directory, and
// sends a FileGone for each file reported before that is no longer there (if it could be read
// in full). If its marker is there, it is not complete yet and it could be read in full, it
// sends a FileReady for each file not yet reported as it is now, without waiting for the
// debounce, then Complete. Otherwise it starts the debounce of every file that is neither
// pending nor reported as it is now.
func (r *watchRun) refresh(name string, c *watchCkpt) {
	f, ok := r.walker.top(name)
	if !ok || f.single {
		return
	}
	if f.err == nil {
		r.goneSince(f)
	}
	if f.marker != nil && !c.complete {
		if f.err == nil {
			// Writers write the marker last: whatever is still pending has been written.
			r.emitFound(c, f, true)
			return
		}
		r.notComplete(c, f)
	} else if f.err != nil {
		r.log.Error().Err(f.err).Str("checkpoint", name).Msg(notReadMsg(f.err))
	}
	r.touchNew(name, f.files)
}

// notComplete logs and sends the Withheld of the checkpoint directory f (c), read in full or
// not, whose marker is there while f.err keeps it from being complete: once for each reason.
func (r *watchRun) notComplete(c *watchCkpt, f scanFound) {
	if c.withheld == f.err.Error() {
		return
	}
	c.withheld = f.err.Error()
	msg := "marker is there but the checkpoint directory could not be read in full; not complete"
	switch {
	case errors.Is(f.err, ErrAgentDenied):
		msg = "the agent may not read the checkpoint directory, complete or not: it is not committed while it cannot"
	case errors.Is(f.err, ErrNotStorable):
		msg = "marker is there but a file of the checkpoint cannot be stored; not complete, and never committed without it"
	}
	r.log.Error().Err(f.err).Str("checkpoint", f.name).Msg(msg)
	r.emit(WatchEvent{Kind: Withheld, Checkpoint: f.name, Path: r.marker, Size: f.marker.Size(), ModTime: f.marker.ModTime(),
		ID: FileIDOf(f.marker), Err: f.err})
}

// notReadMsg is the log message for the error err of a checkpoint directory without its marker.
func notReadMsg(err error) string {
	if errors.Is(err, ErrNotStorable) {
		return "a file of the checkpoint directory cannot be stored; it is not complete until that is fixed"
	}
	return "checkpoint directory could not be read in full"
}

// refreshDir reads the new sub-directory rel of the checkpoint directory name (Lstat saw it
// as fi), watching it and the directories below it, and starts the debounce of every file in
// it that is neither pending nor reported as it is now: it costs time linear in what is below
// rel, not in the checkpoint's files. Only when the checkpoint is not complete although its
// marker is there (its Complete was withheld) does it read the whole checkpoint (refresh), to
// try the Complete again.
func (r *watchRun) refreshDir(name string, c *watchCkpt, rel string, fi fs.FileInfo) {
	if !c.complete {
		if mfi, err := r.walker.lstat(name + "/" + r.marker); err == nil && mfi.Mode().IsRegular() {
			r.refresh(name, c)
			return
		}
	}
	var files []scanFile
	if err := r.walker.walkDir(r.walker.root, rel, fi, name, rel[len(name)+1:], &files); err != nil {
		r.log.Error().Err(err).Str("checkpoint", name).Msg("checkpoint directory could not be read in full")
	}
	r.touchNew(name, files)
}

// touchNew starts the debounce of every file of the checkpoint directory name among files
// that is neither pending nor reported as it is now.
func (r *watchRun) touchNew(name string, files []scanFile) {
	for _, sf := range files {
		key := name + "/" + sf.Path
		if !r.deb.Pending(key) && !r.stamp(key).Same(sf.ID) {
			r.touch(key)
		}
	}
}

// ready handles the end of the debounce of key: a file of a checkpoint directory, or a
// single-file checkpoint.
func (r *watchRun) ready(key string) {
	name, sub, nested := strings.Cut(key, "/")
	c := r.ckpts[name]
	if c == nil || c.single == nested {
		r.pruneRel(key)
		return
	}
	fi, err := r.walker.lstat(key)
	switch {
	case errors.Is(err, fs.ErrNotExist):
		// Its Remove (or its directory's) comes, or came, as an event.
		r.pruneRel(key)
		return
	case err != nil:
		r.skip(key, "", agentDenied(err))
		r.unreport(key)
		return
	case !fi.Mode().IsRegular():
		if !fi.IsDir() {
			kind, err := irregularSkip(fi.Mode(), sub == r.marker)
			r.skip(key, kind, err)
		}
		r.unreport(key)
		r.pruneRel(key)
		return
	case !r.walker.usable(key, fi):
		r.unreport(key)
		return
	}
	id := FileIDOf(fi)
	n := r.node(key)
	if n.stamp.Same(id) {
		return
	}
	if !nested {
		sub = name
	}
	if c.complete {
		r.log.Warn().Str("checkpoint", name).Str("path", sub).Msg("file changed after its checkpoint was complete")
	}
	r.report(n, name, sub, fi, id)
	if !nested {
		c.complete = true
		r.emit(WatchEvent{Kind: Complete, Checkpoint: name, Path: name, Size: fi.Size(), ModTime: fi.ModTime(), ID: id})
	}
}

// watchDebouncer holds a deadline per key: a key is due when it has not been touched for the
// quiet time. Every deadline is the time of a Touch plus the same quiet time, so the keys wait
// in a list in the order of their deadlines: Touch, Pending and Forget take constant time and
// Due time linear in the keys it returns, however many keys wait (invariant I8). It has one
// timer, armed for the earliest deadline (or earlier) while any key is pending. It is not safe
// for concurrent use.
type watchDebouncer struct {
	quiet time.Duration
	keys  map[string]*list.Element // values *watchDue
	order list.List                // of *watchDue, earliest deadline first
	timer *time.Timer
	armed bool
}

// watchDue is a key waiting in a watchDebouncer.
type watchDue struct {
	key string
	at  time.Time
}

func newWatchDebouncer(quiet time.Duration) *watchDebouncer {
	t := time.NewTimer(quiet)
	t.Stop()
	return &watchDebouncer{quiet: quiet, keys: map[string]*list.Element{}, timer: t}
}

// C returns the channel on which the timer fires; receive from it, then call Due. It is nil
// while nothing is pending, so a select never wakes for it.
func (d *watchDebouncer) C() <-chan time.Time {
	if !d.armed {
		return nil
	}
	return d.timer.C
}

// Touch (re)starts the quiet time of key.
func (d *watchDebouncer) Touch(key string) {
	at := time.Now().Add(d.quiet)
	if e, ok := d.keys[key]; ok {
		e.Value.(*watchDue).at = at
		d.order.MoveToBack(e)
	} else {
		d.keys[key] = d.order.PushBack(&watchDue{key: key, at: at})
	}
	// Every deadline is now+quiet, so one set earlier is never later than this one.
	if !d.armed {
		d.timer.Reset(d.quiet)
		d.armed = true
	}
}

// Pending reports whether key is waiting.
func (d *watchDebouncer) Pending(key string) bool {
	_, ok := d.keys[key]
	return ok
}

// Due removes and returns the keys whose quiet time is over, earliest deadline first (then by
// key), and arms the timer for the next one. Call it after C fired.
func (d *watchDebouncer) Due() []string {
	d.armed = false
	now := time.Now()
	var due []watchDue
	for e := d.order.Front(); e != nil; e = d.order.Front() {
		w := e.Value.(*watchDue)
		if w.at.After(now) {
			d.timer.Reset(w.at.Sub(now))
			d.armed = true
			break
		}
		d.order.Remove(e)
		delete(d.keys, w.key)
		due = append(due, *w)
	}
	slices.SortFunc(due, func(a, b watchDue) int {
		return cmp.Or(a.at.Compare(b.at), strings.Compare(a.key, b.key))
	})
	keys := make([]string, len(due))
	for i, w := range due {
		keys[i] = w.key
	}
	return keys
}

// Forget drops key (only key itself) without it becoming due.
func (d *watchDebouncer) Forget(key string) {
	if e, ok := d.keys[key]; ok {
		d.order.Remove(e)
		delete(d.keys, key)
	}
}

// Reset drops every key.
func (d *watchDebouncer) Reset() {
	clear(d.keys)
	d.order.Init()
}

// Stop stops the timer.
func (d *watchDebouncer) Stop() {
	d.timer.Stop()
	d.armed = false
}
