package checkpoint

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"hash/fnv"
	"io/fs"
	"maps"
	"math"
	"math/rand/v2"
	"os"
	"path"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"time"

	"github.com/rs/zerolog"
)

// Defaults of UploaderConfig.
const (
	// DefaultBackgroundFiles is how many files are sent at once when no notice is pending: enough
	// to keep up with periodic checkpoints without taking the NIC from training traffic.
	DefaultBackgroundFiles = 2
	// DefaultUrgentFiles is how many files are sent at once after a notice: every connection.
	DefaultUrgentFiles = 16
	// ForecastWarn is the durable-after-notice forecast above which the uploader warns: a
	// 2-minute notice leaves about 100 s once detection and the trainer's reaction are paid.
	ForecastWarn = 100 * time.Second
	// DefaultStopBudget is how long a stop may drain: a little over the 2 minutes of a spot
	// notice (the instance lives until it is powered off), less than the unit's TimeoutStopSec.
	DefaultStopBudget = 140 * time.Second
)

// resumeWithin is how old an unfinished commit of this agent's (by its id) may be for a restarted
// agent to go on with it; an older one is deleted and the checkpoint committed anew.
const resumeWithin = 12 * time.Hour

// UploaderConfig configures an Uploader.
type UploaderConfig struct {
	Store Store
	// Job is store.job: the same on every instance of one training run.
	Job string
	// Dir is checkpoint.dir; Marker and Pattern as for the watcher.
	Dir, Marker, Pattern string
	// Keep is how many commits to keep in the store (0 keeps all), newest first by
	// Manifest.Order. LATEST's target and anything newer are never deleted.
	Keep int
	// Host says which instance wrote a checkpoint; called at each commit (the identity may
	// arrive after start).
	Host func() Host
	// BackgroundFiles and UrgentFiles bound the files in flight without and with a pending
	// notice (defaults DefaultBackgroundFiles and DefaultUrgentFiles).
	BackgroundFiles, UrgentFiles int
	// StateDir holds the journal (agent.runtime_dir), so that a restarted agent resumes its own
	// unfinished commits and knows what it committed without reading the files again. Empty:
	// no journal; after a restart uncommitted work is sent again under a new commit.
	StateDir string
	// StopBudget bounds how long Run goes on after its context ends, to drain: DefaultStopBudget
	// when zero, no drain at all when negative.
	StopBudget time.Duration
	// AwaitFirstRead: the events Run takes end each full read of the directory with a ReadDone
	// (WatchConfig.ReadDone). A stop that comes before the first one (a store slow to read at
	// start holds the events up) takes the rest of that read, within StopBudget, before it
	// decides whether to drain: a complete checkpoint on disk is drained, not left.
	AwaitFirstRead bool
	// TrainerAlive, if not nil, says whether a trainer process is still there. A stop waits for
	// the checkpoint the trainer was signalled for only while it is: once it is gone (seen so
	// twice, a second apart), nothing more will come, and the drain is what is complete.
	TrainerAlive func() bool
	Logger       zerolog.Logger
	// OnEvent, if not nil, is called (from the uploader's goroutines, never blocking it for
	// long) for each checkpoint that completes or commits, and for each commit that fails.
	OnEvent func(UploadEvent)
	// WorldNodes (store.world_nodes), when above 1, makes this a node of a multi-node job: it
	// commits its files as part NodeRank (store.node_rank) of each save, and the job manifest
	// once every rank's part is in (multinode.go). PartWait (store.part_wait; DefaultPartWait
	// when zero) is how long it tries to complete a save whose parts are not all there.
	NodeRank, WorldNodes int
	PartWait             time.Duration
	// WaitForClose (checkpoint.send_while_written false) sends every file only once it is
	// ready, never while it is written (fileGrowing).
	WaitForClose bool

	// seed, if not zero, seeds the retry jitter and the random bits of commit ids, each drawn
	// for what it is for (seeded), so that a seeded simulation replays whatever order
	// concurrent work ends in; zero: the runtime's generators.
	seed uint64
	// fileClock, if not nil, is the time by the clock that sets files' change times, for learn;
	// nil: time.Now. (The simulation's agents run on a fake clock, its file system on the real one.)
	fileClock func() time.Time
}

// UploadEventKind says what happened to a checkpoint.
type UploadEventKind int

// The kinds of UploadEvent.
const (
	// CheckpointComplete: its marker appeared (or the single file was renamed into place).
	CheckpointComplete UploadEventKind = iota + 1
	// CheckpointCommitted: its manifest is in the store; it exists.
	CheckpointCommitted
	// CheckpointFailed: it could not be committed (Err says why); it is retried.
	CheckpointFailed
	// UploadFailed: one of its files could not be sent (Err says why); it is retried.
	UploadFailed
	// JobCheckpointCommitted (multi-node jobs): the job manifest of a save this node has a part
	// in is in the store, written by this agent or another (Already); Manifest is it.
	JobCheckpointCommitted
	// JobCheckpointFailed (multi-node jobs): a save this node has a part in cannot be committed
	// as it is (Err: two instances with one rank, parts disagreeing, other parts in the job
	// manifest another agent wrote), or its other parts did not come within part_wait.
	JobCheckpointFailed
	// CheckpointWithheld: its marker is there, but it is not complete, and is not committed
	// until that is fixed: part of it could not be read, or a file of it cannot be stored
	// (ErrNotStorable; Err says which). At is the marker's modification time.
	CheckpointWithheld
	// CheckpointSplit: a single-node commit of this agent's (Manifest) is one piece of a save
	// other instances committed pieces of too, each with other files (Err, a *SplitSaveError):
	// the nodes of a multi-node job at store.world_nodes 1.
	// Said once per commit, when it commits or at the commit after it. At is its completion.
	CheckpointSplit
	// CheckpointWhole: a single-node commit of this agent's (Manifest), looked at again at the
	// commit after it, with other instances' commits of the same save in, is whole (not a
	// piece of a split save). At is its completion.
	CheckpointWhole
	// CheckpointRenamedAway: a complete checkpoint's directory was renamed away before its
	// commit (a staging directory renamed into place after its marker): it is not committed
	// under this name; renamed within the checkpoint directory, it completes again under its new
	// one (CheckpointComplete). At is when the uploader learned it.
	CheckpointRenamedAway
	// CheckpointDeleted: a complete checkpoint was deleted before its commit (the trainer's
	// rotation outran the upload, or someone deleted it): it is not committed. At is when the
	// uploader learned it.
	CheckpointDeleted
	// CheckpointFound: the job's newest commit (Manifest), read from the store when the
	// uploader starts (or, if the store did not answer then, once it does): what an earlier run
	// committed, or another instance. At is when it was read.
	CheckpointFound
	// LatestFailed: a commit of this agent's (Manifest) is in the store, but LATEST could not be
	// moved to it (Err says why). It is committed: restore takes it (the newest commit). LATEST
	// is moved again and again until it moves, or a newer commit moves it (LatestMoved).
	LatestFailed
	// LatestMoved: LATEST moved to a commit (Manifest), after LatestFailed.
	LatestMoved
	// DirRead: checkpoint.dir was read in full for the first time (WatchConfig.ReadDone): every
	// checkpoint complete on disk at start has been reported (CheckpointComplete) by now.
	DirRead
)

// UploadEvent reports progress of one checkpoint.
type UploadEvent struct {
	Kind       UploadEventKind
	Checkpoint string
	At         time.Time
	// CompletedAt is set for CheckpointComplete: when the trainer completed it, as its marker's
	// change time says (its modification time where that is unknown). At is when the uploader
	// learned it, which after a restart is long after.
	CompletedAt time.Time
	// Manifest is set for CheckpointCommitted, JobCheckpointCommitted (the job manifest),
	// JobCheckpointFailed (this node's part of the save), CheckpointSplit and CheckpointWhole
	// (this agent's commit).
	Manifest *Manifest
	// Already is set for CheckpointCommitted when nothing was sent: the store held a commit
	// with exactly these files (a restored checkpoint, or one committed before a restart).
	Already bool
	// Forecast is set for CheckpointCommitted: how long after a notice a checkpoint like this
	// one would be durable (the trainer's write time or the upload time, whichever is longer,
	// plus the commit).
	Forecast time.Duration
	// Throughput is the upload throughput of this checkpoint in bytes per second (0 if
	// nothing was sent).
	Throughput float64
	// SentWhileWritten is set for CheckpointCommitted: how many bytes of its files were in the
	// store before the files were closed (sent while the trainer wrote them, during a notice).
	SentWhileWritten int64
	Err              error
}

// Uploader streams checkpoint files to the Store as the watcher reports them ready, commits each
// checkpoint once it is complete and all its files are stored as they are on disk, keeps LATEST
// on the newest commit, and applies retention. The commit protocol and the invariants it keeps
// are in commit.go.
//
// Each local checkpoint has a generation: the files of one version of it and what has been done
// with them. A generation is
//   - matching, when the store already holds commits of its name (a restored checkpoint, a
//     restart without journal, a name saved again): its files are checksummed locally and
//     compared before anything is sent; when all of them match one commit it is adopted, and at
//     the first difference it becomes
//   - uploading: its files go to a commit of its own (J/C/<commit>/), then the manifest;
//   - committed; a change after that starts a new generation (a new commit).
//
// Work is queued per generation, newest generation first; one commit runs at a time.
type Uploader struct {
	cfg   UploaderConfig
	log   zerolog.Logger
	cache *manifestCache
	// storedEpoch counts the loop's turns that may have changed a generation's files (every turn
	// but one that only answers Status): storedAt's memos hold within one epoch.
	storedEpoch uint64
	// work is Run's context for the work (not cancelled by a stop; cancelled when Run returns).
	work context.Context
	// journalProblem is JournalProblem's.
	journalProblem atomic.Pointer[string]
	// markerHint is MarkerHint's.
	markerHint atomic.Pointer[string]
	// cleanup is the context of the clean-up passes: not cancelled by a stop, but stopGrace
	// after Run began to return.
	cleanup context.Context

	// Owned by the Run loop.
	gens map[string]*generation // the current generation of each local checkpoint
	// retentionSkipped counts the commits since the last one that applied retention (startCommit).
	retentionSkipped int
	// awaitMarkers are the checkpoints whose marker was on disk when a stop came but whose
	// Complete had not come from the watcher yet (markersOnDisk): the stop waits for them until
	// awaitMarkersUntil (stopMarkerWait), as for a complete checkpoint.
	awaitMarkers      map[string]bool
	awaitMarkersUntil time.Time
	seq               uint64
	queued            []*generation // generations with files waiting, by seq
	inflight          int           // files being read or sent
	growingN          int           // files sent while they are written (fileGrowing)
	commitQ           []*generation
	committing        *generation
	// lookups are the generations made with a lookup (newGen), by seq; those whose lookup is
	// over are dropped from the end as newestLookup comes to them.
	lookups []*generation
	// earlyDrops are the commits start dropped before the journal was open (journalCleanups);
	// earlyLates the late clean-ups it began then (startLate).
	earlyDrops []CommitRef
	earlyLates []lateCleanup
	// started is when Run began: a file modified before then was written while no agent
	// watched (completedAt).
	started time.Time
	// lateAbortWarned: a late clean-up failed and was said at warn level (goLateCleanup).
	lateAbortWarned atomic.Bool
	// known are commits this agent has learned of (learn), each with when it did: ascending in
	// both.
	known []knownOrder
	// index holds the committed manifests of each checkpoint name, newest first, as last read
	// (at start, at each new generation's lookup) or committed.
	index map[string][]*Manifest
	// retired are the manifests of the last retiredManifests commits this agent's retention
	// deleted, newest last: a checkpoint that comes back on disk with their bytes (a restore of
	// it into checkpoint.dir while retention deleted it) keeps its place in the order, not
	// committed as the newest (lookupDone, commit).
	retired []*Manifest
	// uncertain holds, by commit, when a manifest write of this run's failed without an answer,
	// or when this run found an earlier run's commit sealed in the journal (a write of it may
	// have been sent): it may still land, so retention keeps that commit for uncertainFor
	// (startCommit).
	uncertain map[string]time.Time
	resume    map[string]*journalEntry
	// stale are the journal's stale markers (journalStales) of names with no generation yet.
	stale   map[string]FileID
	journal *journal
	dirty   []*generation
	// active are the notices in force (SetNotices), most severe first; lastSignal is when the
	// trainer was last signalled for one (a stop waits for the checkpoint it writes).
	active     []ActiveNotice
	lastSignal time.Time
	// lastSignalPosted: lastSignal is a job notice's post (ActiveNotice.Posted), not a signal.
	lastSignalPosted bool
	// reach is how long the trainer took, at the last signal whose save was committed, from the
	// signal to that save's first file (its step boundary): part of every forecast since.
	reach   time.Duration
	reachOf time.Time // the signal reach was measured at
	// signalAnswered: a checkpoint begun and completed after lastSignal (or one begun after it vanished,
	// deleted by the trainer or by hand); a stop no longer waits for a marker.
	signalAnswered bool
	// answeredBy is the checkpoint whose completion answered lastSignal, "" when none did or
	// what answered it was not one this agent saw written (a commit in the store, one deleted):
	// only its save measures the trainer's time to begin (reach). After a restart during a
	// notice, a periodic save minutes after the signal was taken for it (a forecast of 105 s for
	// a save of 0.02 s; found from outside).
	answeredBy string
	// dirRead: checkpoint.dir was read in full once (its first ReadDone). Before, what the read
	// finds was written before this agent began, perhaps long before: its own time says when
	// (foundAt), not the moment it was found.
	dirRead bool
	// trainerAbsent counts the looks in a row (checkTrainer) that found no trainer; trainerGone:
	// two did, and a stop no longer waits for a marker either.
	trainerAbsent int
	trainerGone   bool

	results  chan fileResult
	commits  chan commitResult
	wake     chan func()
	notices  chan struct{} // poke: pending holds a new set of notices (capacity 1)
	syncs    chan struct{}
	noticeMu sync.Mutex
	pending  []ActiveNotice
	changed  bool
	statusCh chan chan UploaderStatus
	endDrain chan struct{} // closed by EndDrain
	endOnce  sync.Once
	wg       sync.WaitGroup

	// saves are this node's parts whose save is not committed yet, by commit (multi-node).
	saves map[string]*pendingSave
	// ownJobNewest is when this node's part of the newest job checkpoint committed that it
	// knows of completed: a save of this node's older than that, given up, was overtaken.
	ownJobNewest time.Time
	// lastOwn is the last single-node commit this agent made (checkSplit); splitSaid holds the
	// commits said to be pieces of a save committed in pieces, with their completion.
	lastOwn   *Manifest
	splitSaid map[string]time.Time
	// latest is what is known of a LATEST this agent could not move to its commit.
	latest latestLag
	// foreign are, by checkpoint name, the commits the other journals in agent.runtime_dir
	// (another store.job or store.url, an earlier run) hold as done (sayForeign).
	foreign map[string][]foreignCommit
	// lastSingle is the single-file checkpoint that completed last, and when its file was
	// modified; singleWarned: two were said to come together (noteSingle).
	lastSingle   singleSeen
	singleWarned bool
}

// singleSeen is a single-file checkpoint and its file's modification time.
type singleSeen struct {
	name string
	mod  time.Time
}

// pendingSave is a part of this node's whose job manifest is not seen yet.
type pendingSave struct {
	part    *Manifest
	running bool
	// committing: an attempt found every part in and wrote the job manifest (or tried to, and
	// it may have landed); LATEST is still to be moved to it. A stop waits for it (draining).
	committing bool
	// lastErr is the last error logged for it, so that a repeated one is logged once.
	lastErr string
	// missing are the ranks whose parts were missing at the last look that could tell.
	missing []int
	// storeErr is the store's error at the last look, if it failed (nil once one succeeds).
	storeErr error
	// job is the save's job checkpoint once committed with LATEST not moved to it yet: the next
	// attempts only move LATEST (whatever part_wait says: the save is committed).
	job *Manifest
}

// ActiveNotice is a notice in force that the uploader works for (one whose policy is
// checkpoint).
type ActiveNotice struct {
	// Key names it, e.g. "spot/terminate"; it labels the commits of checkpoints written for it.
	Key string
	// Deadline is when the instance is expected to go (zero: none). It orders the work and is
	// shown; a deadline already past never stops an upload or its retries.
	Deadline time.Time
	// SignalledAt is when the trainer was signalled for it (zero: not signalled): a stop waits
	// for the checkpoint the trainer writes after it (its marker, then its commit).
	SignalledAt time.Time
	// Posted: the trainer posted it (a job notice), and SignalledAt is when; no signal reached
	// the trainer, so its save's time to begin tells nothing of its answer to one (no reach).
	Posted bool
}

// genState is where a generation is.
type genState int

const (
	genMatching genState = iota
	genUploading
	genCommitted
	genAbandoned
)

// generation is one version of a local checkpoint and the work on it.
type generation struct {
	// storedMemo is stored()'s answer for a committed generation, as of the uploader's
	// storedEpoch it was computed at (status is asked for every few seconds, and a committed
	// checkpoint of 100 000 files cost a walk of them each time; found from outside).
	storedMemo struct {
		epoch              uint64
		files              int
		bytes, storedBytes int64
	}
	name   string
	seq    uint64
	single bool
	state  genState
	// commit is the commit its files go to (uploading; chosen when the first file is sent), or
	// the committed or adopted commit.
	commit string
	// sealed: a manifest PUT for commit was tried. Nothing is written into commit again.
	sealed  bool
	resumed bool // commit was begun by an earlier run of the agent
	files   map[string]*fileState
	queue   []string
	qhead   int
	queuedN int
	// inflight counts its files being read or sent, retrying those waiting out a backoff.
	inflight, retrying int
	inQueued           bool
	complete           bool
	completeSeen       time.Time // when the uploader learned it is complete
	lastFileAt         time.Time // when a file of it was last reported ready
	// withheld: its marker is there but it cannot be committed (CheckpointWithheld), until
	// another Complete; withheldAt: since when.
	withheld bool
	// heldBack: it was withheld since its save began. Its commit's times hold that wait (for a
	// fix, or for its marker again), not a save's and its upload's: they make no forecast.
	heldBack   bool
	withheldAt time.Time
	// recheck: withheld by its commit's scan (ErrNotStorable) while its marker is still the one
	// its Complete named: the next change to its files (the file itself back in place of a
	// symbolic link, a file made readable) completes it again, for the commit's scan to judge;
	// a file written again after the marker makes it stale instead (holdsMarker).
	recheck bool
	// marker is the version of the marker its completeness rests on: its Complete's, or for a
	// commit resumed from the journal, the one committed; zero for a single file, or none yet.
	// stale, if not zero, is a version of the marker that no longer vouches for it: a file was
	// written again after it (rewriteOf), so only another version of the marker completes it.
	marker, stale FileID
	// committedMarker is, for a version after a commit (nextGen), the marker that commit was
	// complete with: while the marker is still exactly it (Same: not even its ctime moved),
	// bytes other than the commit's were written after it (matched).
	committedMarker FileID
	// staleSaid is the stale marker withheldStale last reported.
	staleSaid FileID
	// notice is the key of the notice this version was written for (in force when its first file
	// or its marker came), "" for a periodic checkpoint.
	notice      string
	firstFileAt time.Time
	// begunAt is the earliest modification time of its files as reported (FileReady,
	// FileGrowing): about when the trainer began to write it. A save begun before the trainer
	// was signalled is not its answer to the signal (begunBefore).
	begunAt time.Time
	// candidates are the commits a matching generation may turn out to be.
	candidates []*Manifest
	// prior is the commit the generation before this one was (nextGen): a candidate too, even
	// once retention deleted it, so that a version with its bytes keeps its place in the order.
	prior *Manifest
	// completeAt, if not nil, is this version's completion time, from a deleted commit of the
	// same bytes (see commitResult.completeAt).
	completeAt *time.Time
	// lookup: the store's commits of its name are being read; until they are, it does nothing
	// (a name the store holds with these bytes must not be sent again), but during a notice.
	lookup      bool
	lookupFails int
	// unread: it is sent without the store's commits of its name having been read (the lookup
	// failed, or a notice did not wait for it). Its commit reads them first: a restored
	// checkpoint must not become a new, newer commit of bytes the store holds.
	unread     bool
	committing bool
	inCommitQ  bool
	commitWait bool // a failed commit waits out its backoff
	failures   int
	// failingSince: since when its files' uploads have failed with no file stored since (zero
	// when the last one ended well); see stuck.
	failingSince time.Time
	// deferred are watch events that arrived while it was committing.
	deferred []WatchEvent
	// strays are keys stored into commit for files that are no longer part of it.
	strays []string
	// vanished are files that left the checkpoint after its marker (fileVanished), each as it
	// was last seen: one that comes back as it was (made unreadable, then readable again) is
	// the same file, not one written after the marker.
	vanished map[string]FileID
	// refused are the versions of files that cannot be uploaded (errUnusable): while one is
	// there as it was, the checkpoint is not committed (ErrNotStorable).
	refused map[string]refusal
	// growing are the files being sent while they are written (fileGrowing), until their
	// upload takes them over (goUpload) or they are stopped (stopGrowing).
	growing  map[string]*growingFile
	manifest *Manifest
	ctx      context.Context
	cancel   context.CancelFunc
	// Upload statistics, for the manifest's upload_seconds and the forecast: when the first
	// file's send began and the last one's ended, and the sum of every file's send time.
	uploadStart, uploadEnd time.Time
	uploadBusy             time.Duration
	sent                   int64
	// progressSaid is the bytes stored that the last progress line of its commit said
	// (logProgress).
	progressSaid int64
}

// refusal is a version of a file that cannot be uploaded, and why (errUnusable).
type refusal struct {
	id  FileID
	err error
}

// fileState is one file of a generation.
type fileState struct {
	id       FileID // the version last reported
	queued   bool
	inflight bool
	again    bool // it changed while in flight: queue it again when the result comes
	// key is where an upload of it was last tried: if it leaves the generation, whatever
	// landed there is a stray.
	key      string
	done     *doneFile
	attempts int
}

// growingFile is a file sent while it is written: the transfer, the file's version when it
// began (its FileReady must be of the same device and inode for the transfer to be finished),
// and when it began (the upload's start, for the throughput: a transfer paced by the writer
// counts from there, rather than looking as fast as what was left at the close).
type growingFile struct {
	t     Growing
	id    FileID
	began time.Time
}

// doneFile is what was done with a file: stored (uploading; key set) or checksummed (matching),
// reading the version id, whose read began at readAt.
type doneFile struct {
	id       FileID
	checksum Checksum
	readAt   time.Time
	key      string
	grown    bool  // stored by a transfer begun while it was written (fileGrowing)
	kept     int64 // of which the bytes sent before its close (Growing.Kept)
}

// jobKind says what a file job does.
type jobKind int

const (
	jobHash jobKind = iota + 1
	jobUpload
)

type fileResult struct {
	gen      *generation
	rel      string
	file     *fileState
	kind     jobKind
	done     doneFile
	start    time.Time
	duration time.Duration
	err      error
}

// NewUploader returns an Uploader. It does nothing until Run.
func NewUploader(cfg UploaderConfig) *Uploader {
	if cfg.BackgroundFiles <= 0 {
		cfg.BackgroundFiles = DefaultBackgroundFiles
	}
	if cfg.UrgentFiles <= 0 {
		cfg.UrgentFiles = DefaultUrgentFiles
	}
	if cfg.Marker == "" {
		cfg.Marker = scanDefaultMarker
	}
	if cfg.StopBudget == 0 {
		cfg.StopBudget = DefaultStopBudget
	}
	if cfg.Host == nil {
		cfg.Host = func() Host { return Host{} }
	}
	if cfg.PartWait <= 0 {
		cfg.PartWait = DefaultPartWait
	}
	return &Uploader{
		cfg:       cfg,
		log:       cfg.Logger.With().Str("component", "uploader").Str("store", cfg.Store.URL()).Str("job", cfg.Job).Logger(),
		cache:     &manifestCache{},
		gens:      map[string]*generation{},
		index:     map[string][]*Manifest{},
		uncertain: map[string]time.Time{},
		resume:    map[string]*journalEntry{},
		results:   make(chan fileResult),
		commits:   make(chan commitResult),
		wake:      make(chan func()),
		notices:   make(chan struct{}, 1),
		syncs:     make(chan struct{}),
		statusCh:  make(chan chan UploaderStatus),
		endDrain:  make(chan struct{}),
		saves:     map[string]*pendingSave{},
		splitSaid: map[string]time.Time{},
	}
}

// EndDrain ends the drain of a stop (a second SIGTERM): Run logs what was left and returns at
// once, and a stop that comes after it does not drain at all. What is committed stays committed;
// what is not is left for the next agent to resume or send again. It may be called from any
// goroutine, any number of times.
func (u *Uploader) EndDrain() {
	u.endOnce.Do(func() { close(u.endDrain) })
}

// SetNotices tells the uploader which notices are in force, most severe first, each time the set
// changes (a notice begins, the trainer is signalled for it, it ends). While any is, or while a
// checkpoint written for one is not committed, the uploader is urgent: every connection goes to
// the newest checkpoint (or the one the trainer completed since its signal, once begun: next)
// and failed work is retried sooner. Checkpoints written while a notice is
// in force are labelled with it (Manifest.Trigger "notice", Manifest.Notice its key): Run handles
// every event it takes after SetNotices returned with these notices in force. It never
// blocks, so the notice path does not wait on the uploader; it may be called from any goroutine,
// before or while Run runs.
func (u *Uploader) SetNotices(active []ActiveNotice) {
	u.noticeMu.Lock()
	u.pending, u.changed = slices.Clone(active), true
	u.noticeMu.Unlock()
	select {
	case u.notices <- struct{}{}:
	default: // a poke is already waiting
	}
}

// Sync asks for every complete checkpoint not yet in the store to be uploaded now: failed
// commits are retried at once. It returns at once if Run is not running.
func (u *Uploader) Sync(ctx context.Context) {
	select {
	case u.syncs <- struct{}{}:
	case <-ctx.Done():
	}
}

// UploaderStatus is a snapshot for /status.
type UploaderStatus struct {
	Urgent      bool               `json:"urgent"`
	Deadline    *time.Time         `json:"deadline,omitempty"`
	InFlight    int                `json:"files_in_flight"`
	Queued      int                `json:"files_queued"`
	Checkpoints []CheckpointStatus `json:"checkpoints"`
}

// CheckpointStatus is one local checkpoint the uploader tracks.
type CheckpointStatus struct {
	Name string `json:"name"`
	// Commit is the commit its files go to, or the commit it is (empty while nothing was sent).
	Commit      string `json:"commit,omitempty"`
	Files       int    `json:"files"`
	FilesStored int    `json:"files_stored"`
	Bytes       int64  `json:"bytes"`
	BytesStored int64  `json:"bytes_stored"`
	Complete    bool   `json:"complete"`
	// CompleteSince is when the uploader learned that the checkpoint is complete (or, for one
	// withheld, when its marker came).
	CompleteSince *time.Time `json:"complete_since,omitempty"`
	// LastFileAt is when a file of it was last reported written (ready to send).
	LastFileAt *time.Time `json:"last_file_at,omitempty"`
	Committed  bool       `json:"committed"`
	// Withheld is true while its marker is there but it cannot be committed: a file of it
	// cannot be stored (CheckpointWithheld).
	Withheld bool `json:"withheld,omitempty"`
}

// markerNames are the names trainers and libraries give a checkpoint's marker: a file of one of
// them at the top of a checkpoint whose own marker (UploaderConfig.Marker) has not come hints
// that the marker is configured wrong.
var markerNames = []string{"_COMPLETE", ".metadata", "COMPLETE", "_SUCCESS", "DONE", ".done"}

// MarkerHint says, when the newest checkpoint begun holds a file named as markers are, but not
// the configured marker, which checkpoint and which name ("step-23 holds _COMPLETE, not the
// configured marker .metadata"); "" otherwise. (Found from outside: a trainer that wrote
// _COMPLETE under checkpoint.marker .metadata was said to be gone before its checkpoint
// completed.) Safe to call from any goroutine.
func (u *Uploader) MarkerHint() string {
	if h := u.markerHint.Load(); h != nil {
		return *h
	}
	return ""
}

// noteMarkerName sets MarkerHint's hint when rel, a file of g reported ready, is named as markers
// are but is not the configured marker, while g has no marker of its own.
func (u *Uploader) noteMarkerName(g *generation, rel string) {
	if g == nil || g.single || rel == u.cfg.Marker || !slices.Contains(markerNames, rel) || g.complete || !g.marker.isZero() {
		return
	}
	h := fmt.Sprintf("%s holds %s, not the configured marker %s (checkpoint.marker)", g.name, rel, u.cfg.Marker)
	u.markerHint.Store(&h)
}

// Status returns a snapshot of the uploader's state; the zero status if Run is not running.
func (u *Uploader) Status(ctx context.Context) UploaderStatus {
	ch := make(chan UploaderStatus, 1)
	select {
	case u.statusCh <- ch:
		return <-ch
	case <-ctx.Done():
		return UploaderStatus{}
	}
}

// Run consumes watcher events until ctx is done. At start it reads the job from the store (its
// delimiter listings and manifests), repairs LATEST if a newer commit exists, and reads its
// journal, so a restart (even after kill -9 mid-upload) resumes its own unfinished commit and
// re-sends nothing that is committed. When ctx ends while a notice's checkpoint is still being
// written or uploaded, Run keeps going until it is committed, for at most StopBudget (stopping is
// not draining; a deadline that has passed does not end it: the instance lives until it is
// powered off). It returns nil after all its goroutines have exited.
func (u *Uploader) Run(ctx context.Context, events <-chan WatchEvent) error {
	work, cancelWork := context.WithCancel(context.WithoutCancel(ctx))
	cleanup, cancelCleanup := context.WithCancel(context.WithoutCancel(ctx))
	defer cancelCleanup()
	u.work, u.cleanup, u.started = work, cleanup, time.Now()
	defer func() {
		for _, g := range u.gens {
			u.stopAllGrowing(g)
		}
		cancelWork()
		waited := make(chan struct{})
		go func() { u.wg.Wait(); close(waited) }()
		t := time.NewTimer(stopGrace)
		defer t.Stop()
		select {
		case <-waited:
		case <-t.C:
			// A clean-up pass begun is let finish, but not for longer than this at a stop: a
			// store that hangs would hold the stop past its budget (the next agent does the pass
			// again, from its journal).
			u.log.Info().Msg("stopping: clean-up requests still in flight are cut short; the next agent does them again")
			cancelCleanup()
			<-waited
		}
		if err := u.journal.close(); err != nil {
			u.log.Warn().Err(err).Msg("journal could not be written")
		}
	}()
	u.start(work)
	done := ctx.Done()
	var drainTimer <-chan time.Time
	var markerTimer <-chan time.Time // awaitMarkersUntil
	var trainerTick <-chan time.Time // once draining, with TrainerAlive
	var endDrain chan struct{}       // u.endDrain once draining
	// batching: the last watch event said More (another of a full read of the directory
	// follows); nothing is dispatched until the last of them, or until batchWait fires
	// batchWaitMax after the last event seen (a read whose watcher stopped half way).
	batching := false
	batchWait := time.NewTimer(time.Hour)
	batchWait.Stop()
	defer batchWait.Stop()
	// reading: a stop came before the first full read of the directory was in (AwaitFirstRead);
	// it decides once the read's ReadDone comes.
	reading, firstRead := false, false
	stopTick := func() {}
	defer func() { stopTick() }()
	progress := time.NewTicker(commitProgressEvery)
	defer progress.Stop()
	// drain begins the drain of a stop, or says it does not: false when Run is to return.
	drain := func() bool {
		if !u.draining() {
			u.logUnfinished()
			return false
		}
		select {
		case <-u.endDrain:
			u.logLeft("stop requested after the drain was ended; stopping at once")
			return false
		default:
		}
		if u.cfg.TrainerAlive != nil {
			tick := time.NewTicker(time.Second)
			stopTick = tick.Stop
			trainerTick = tick.C
		}
		ev := logTime(u.log.Warn(), "deadline", u.deadline()).Float64("stop_budget_s", logSeconds(u.cfg.StopBudget)).Int("not_committed", u.notCommitted()).
			Int("job_saves_in_progress", u.savesInProgress())
		if u.awaitingSignal() {
			// Say what it waits for, and why a save completed since does not end it.
			ev = ev.Bool("awaiting_signalled_checkpoint", true)
			if before := u.completedButBegunBefore(); len(before) > 0 {
				ev = ev.Strs("begun_before_the_signal", logNames(before))
			}
		}
		ev.Msg("stop requested while checkpoints are being written or are not committed yet; finishing them first (a second SIGTERM stops at once)")
		endDrain = u.endDrain
		return true
	}
	answered := false // the last turn only answered Status
	for {
		if !answered {
			u.storedEpoch++
		}
		answered = false
		u.flushJournal()
		// A notice set before anything the loop takes next is in force when it is handled: select
		// picks at random among ready cases, and a checkpoint's events must not overtake the
		// notice the trainer wrote it for.
		u.handleNotices()
		select {
		case <-done:
			// A notice set before the stop may still wait in u.notices (select picks at random
			// among ready cases, and both are ready when the store held up start): it decides
			// whether to drain.
			u.handleNotices()
			// A marker written a moment before the stop (a trainer that saves on its own SIGTERM
			// and exits, stopped before the agent) may not have come from the watcher yet: the
			// stop waits for it a moment, as for a complete checkpoint. Without this, the last
			// save was left uncommitted, "no marker yet" (found from outside).
			if names := u.markersOnDisk(); len(names) > 0 && u.cfg.StopBudget >= 0 {
				u.awaitMarkers, u.awaitMarkersUntil = names, time.Now().Add(stopMarkerWait)
				markerWait := time.NewTimer(stopMarkerWait)
				defer markerWait.Stop()
				markerTimer = markerWait.C
				u.log.Info().Strs("checkpoints", logNames(slices.Sorted(maps.Keys(names)))).
					Msg("stop requested just as checkpoints got their marker; waiting for them to be read")
			}
			if u.cfg.StopBudget < 0 {
				u.logUnfinished()
				if left := u.completeLeft(); len(left) > 0 {
					u.log.Warn().Strs("not_committed", logNames(left)).
						Msg("stopping without a drain (agent.stop_budget 0s) with complete checkpoints not committed; the next agent on this disk commits them")
				}
				return nil
			}
			done = nil // keep going for the checkpoints, then stop
			t := time.NewTimer(u.cfg.StopBudget)
			defer t.Stop()
			drainTimer = t.C
			if u.cfg.AwaitFirstRead && !firstRead && events != nil {
				reading = true
				u.log.Info().Msg("stop requested before the checkpoint directory was read in full; reading the rest of it first")
				continue
			}
			if !drain() {
				return nil
			}
		case <-drainTimer:
			u.logLeft("stop budget spent before every checkpoint was committed (or the one the trainer was signalled for appeared); stopping")
			return nil
		case <-trainerTick:
			u.checkTrainer()
		case <-progress.C:
			u.logProgress()
		case <-markerTimer:
			markerTimer = nil
			if len(u.awaitMarkers) > 0 {
				u.log.Warn().Strs("checkpoints", logNames(slices.Sorted(maps.Keys(u.awaitMarkers)))).
					Msg("checkpoints whose marker was there at the stop did not complete in time (unreadable, still being read, or written after their marker); not waited for")
				u.awaitMarkers = nil
			}
		case <-endDrain:
			u.logLeft("drain ended by a second stop request; stopping")
			return nil
		case ev, ok := <-events:
			if !ok {
				events, batching = nil, false
				if reading {
					reading = false
					if !drain() {
						return nil
					}
				}
				continue
			}
			if ev.Kind == ReadDone {
				if !firstRead {
					u.emit(UploadEvent{Kind: DirRead, At: time.Now()})
				}
				firstRead, u.dirRead = true, true
				if reading {
					reading = false
					if !drain() {
						return nil
					}
				}
			} else {
				u.handleWatch(work, ev)
				if u.awaitMarkers != nil && (ev.Kind == Complete || ev.Kind == Withheld || ev.Kind == Removed) {
					delete(u.awaitMarkers, ev.Checkpoint) // known now: the drain judges it
				}
			}
			batching = ev.More
			if batching {
				batchWait.Reset(batchWaitMax)
			} else {
				batchWait.Stop()
			}
		case <-batchWait.C:
			batching = false
		case r := <-u.results:
			u.handleResult(work, r)
		case r := <-u.commits:
			u.handleCommit(work, r)
		case fn := <-u.wake:
			fn()
		case <-u.notices:
			u.handleNotices()
		case <-u.syncs:
			pending := 0
			for _, g := range u.gensInOrder() {
				g.failures = 0
				if g.commitWait {
					g.commitWait = false
					u.markDirty(g)
				}
				if g.complete && g.state != genCommitted {
					pending++
				}
			}
			u.log.Info().Int("complete_not_committed", pending).Int("files_queued", u.queuedFiles()).Msg("sync requested")
		case ch := <-u.statusCh:
			ch <- u.status()
			answered = true
		}
		if done == nil && !reading && !u.draining() {
			u.log.Info().Msg("nothing left to commit; stopping")
			return nil
		}
		if batching {
			// The rest of a full read of the directory follows at once: every checkpoint it
			// found is known before any is sent, so that the newest goes first.
			continue
		}
		u.dispatch(work)
	}
}

// logUnfinished says, at a stop that does not drain, which checkpoints are being written (files
// there, no marker yet): no notice asked for them, so the stop does not wait; what is complete
// of them later is committed by the next agent.
func (u *Uploader) logUnfinished() {
	var left, withheld []string
	for name, g := range u.gens {
		switch {
		case g.state != genMatching && g.state != genUploading || g.complete:
		case g.withheld:
			withheld = append(withheld, name)
		case len(g.files) > 0:
			left = append(left, name)
		}
	}
	if len(withheld) > 0 {
		slices.Sort(withheld)
		u.log.Error().Strs("withheld", logNames(withheld)).
			Msg("stopping with checkpoints that have their marker but cannot be committed: a file of each cannot be stored (logged when it was found)")
	}
	if len(left) == 0 {
		return
	}
	slices.Sort(left)
	u.log.Warn().Strs("not_complete", logNames(left)).
		Msg("stopping without waiting for checkpoints without their marker, still being written or a save left half done (no notice asked for them); the next agent commits any that completes")
}

// logNamesMax bounds the checkpoint names one log line lists.
const logNamesMax = 20

// logNames returns names for a log line: the first logNamesMax, then how many more (found from
// outside: a stop with 20 000 checkpoints without their marker logged a line of 260 KB, which
// the journal splits at 48 KiB, breaking its JSON).
func logNames(names []string) []string {
	if len(names) <= logNamesMax {
		return names
	}
	return append(slices.Clip(names[:logNamesMax]), fmt.Sprintf("(and %d more)", len(names)-logNamesMax))
}

// completeLeft returns the complete checkpoints not committed, sorted.
func (u *Uploader) completeLeft() []string {
	var left []string
	for name, g := range u.gens {
		if (g.state == genMatching || g.state == genUploading) && g.complete {
			left = append(left, name)
		}
	}
	slices.Sort(left)
	return left
}

// logLeft says why a drain ended and what it left: the checkpoints not committed (they stay on
// disk; the next agent resumes or re-sends them) and whether the one the trainer was signalled
// for never appeared.
func (u *Uploader) logLeft(why string) {
	var left []string
	for name, g := range u.gens {
		if g.state == genMatching || g.state == genUploading {
			left = append(left, name)
		}
	}
	slices.Sort(left)
	ev := u.log.Error().Float64("stop_budget_s", logSeconds(u.cfg.StopBudget)).Strs("not_committed", logNames(left)).
		Bool("signalled_checkpoint_missing", !u.lastSignal.IsZero() && !u.signalAnswered)
	if before := u.completedButBegunBefore(); !u.lastSignal.IsZero() && !u.signalAnswered && len(before) > 0 {
		// A trainer that took the save it was in when signalled for its answer, and saved no
		// more: that save is committed (or on its way), only none begun after the signal came.
		ev = ev.Strs("begun_before_the_signal", logNames(before))
	}
	ev.Msg(why)
}

// flushJournal writes out the journal's lines; after a write error it goes on without one.
func (u *Uploader) flushJournal() {
	if err := u.journal.flush(); err != nil {
		u.log.Warn().Err(err).Str("journal", u.journal.path).Msg("journal could not be written; a restart will send uncommitted files again")
		u.journalFailed(err)
		_ = u.journal.close()
		u.journal = nil
		return
	}
	if u.journal.gone() {
		path := u.journal.path
		j, err := u.journal.restore()
		_ = u.journal.close()
		u.journal = j
		if err != nil {
			u.log.Warn().Err(err).Str("journal", path).Msg("journal was removed under the agent and could not be written again; a restart will send uncommitted files again")
			u.journalFailed(err)
			u.journal = nil
			return
		}
		u.log.Warn().Str("journal", path).
			Msg("journal was removed under the agent (agent.runtime_dir deleted?); written there again")
	}
	if u.journal.grown() {
		u.compactJournal()
	}
}

// journalFailed records err, the journal's trouble, for JournalProblem.
func (u *Uploader) journalFailed(err error) {
	p := err.Error()
	u.journalProblem.Store(&p)
}

// JournalProblem is why the journal (in StateDir) is off, or "": the last error reading or
// writing it. A restart sends uncommitted files again. Safe to call from any goroutine.
func (u *Uploader) JournalProblem() string {
	if p := u.journalProblem.Load(); p != nil {
		return *p
	}
	return ""
}

// compactJournal writes the journal again with what a restart needs of it: the last commit of
// each checkpoint still tracked, and the clean-ups (and late clean-ups) not done yet.
func (u *Uploader) compactJournal() {
	path := u.journal.path
	entries, err := readJournal(path)
	if err == nil {
		maps.DeleteFunc(entries, func(name string, _ *journalEntry) bool { return u.gens[name] == nil })
		cleanups, lates := journalCleanups(path), journalLates(path, u.cfg.Job)
		_ = u.journal.close()
		var j *journal
		if j, err = writeJournal(path, entries); err == nil {
			for _, c := range cleanups {
				j.add(journalLine{Op: journalDrop, Checkpoint: c.Checkpoint, Commit: c.Commit})
			}
			for _, l := range lates {
				j.add(l.line())
			}
			for name, g := range u.gens {
				if !g.stale.isZero() {
					j.add(staleLine(name, g.stale))
				}
			}
			for name, id := range u.stale {
				j.add(staleLine(name, id))
			}
			err = j.flush()
		}
		u.journal = j
	}
	if err != nil {
		u.log.Warn().Err(err).Str("journal", path).Msg("journal could not be written again; a restart will send uncommitted files again")
		u.journalFailed(err)
		_ = u.journal.close()
		u.journal = nil
	}
}

func (u *Uploader) handleNotices() {
	u.noticeMu.Lock()
	active, changed := u.pending, u.changed
	u.changed = false
	u.noticeMu.Unlock()
	if !changed {
		return
	}
	u.storedEpoch++ // (turned urgent, what is queued may change)
	added := false
	for _, n := range active {
		if !slices.ContainsFunc(u.active, func(a ActiveNotice) bool { return a.Key == n.Key }) {
			added = true
		}
		if n.SignalledAt.After(u.lastSignal) {
			u.lastSignal, u.signalAnswered, u.answeredBy = n.SignalledAt, false, ""
			u.lastSignalPosted = n.Posted
			u.trainerAbsent, u.trainerGone = 0, false
			u.answeredByKnown()
		}
	}
	u.active = active
	keys := make([]string, len(active))
	for i, n := range active {
		keys[i] = n.Key
	}
	if !added {
		u.log.Info().Strs("notices", keys).Bool("urgent", u.urgent()).Msg("notices in force changed")
		return
	}
	logTime(u.log.Warn().Strs("notices", keys), "deadline", u.deadline()).Int("files_in_flight", u.inflight).
		Int("files_queued", u.queuedFiles()).Msg("notice: uploading with every connection")
	// Anything complete and not committed is now worth retrying at once.
	for _, g := range u.gensInOrder() {
		g.failures = 0
		if g.commitWait {
			g.commitWait = false
			u.markDirty(g)
		}
	}
}

// urgent reports whether a notice is in force or a checkpoint written for one is not committed.
func (u *Uploader) urgent() bool {
	if len(u.active) > 0 {
		return true
	}
	for _, g := range u.gens {
		if g.notice != "" && (g.state == genMatching || g.state == genUploading) {
			return true
		}
	}
	return false
}

// deadline is the earliest deadline still ahead among the notices in force; zero when there is
// none (a deadline that has passed is not one to work toward: the instance is still here).
func (u *Uploader) deadline() time.Time {
	now := time.Now()
	var d time.Time
	for _, n := range u.active {
		if n.Deadline.After(now) && (d.IsZero() || n.Deadline.Before(d)) {
			d = n.Deadline
		}
	}
	return d
}

// notCommitted counts the checkpoints not committed yet (complete or not).
func (u *Uploader) notCommitted() int {
	n := 0
	for _, g := range u.gens {
		if g.state == genMatching || g.state == genUploading {
			n++
		}
	}
	return n
}

// savesInProgress counts the multi-node saves a stop waits for (see draining).
func (u *Uploader) savesInProgress() int {
	n := 0
	for _, ps := range u.saves {
		if ps.running || ps.committing {
			n++
		}
	}
	return n
}

// draining reports whether a stop must wait: a checkpoint is complete and not committed, a job
// checkpoint is being committed by this agent (an attempt to complete a save runs, or one wrote
// its job manifest and LATEST is not on it yet: stopping then left LATEST behind for good when
// the other nodes' agents had stopped too), or the trainer was signalled for a notice and no
// checkpoint has completed since (its marker is still to come) nor been deleted (one renamed
// away is awaited under its new name). An incomplete
// checkpoint the trainer abandoned before the signal holds nothing up, nor does a save that
// waits for other nodes' parts between its looks; the stop budget bounds the wait.
func (u *Uploader) draining() bool {
	if len(u.awaitMarkers) > 0 && time.Now().Before(u.awaitMarkersUntil) {
		return true
	}
	for _, g := range u.gens {
		if (g.state == genMatching || g.state == genUploading) && g.complete {
			return true
		}
	}
	if u.savesInProgress() > 0 {
		return true
	}
	return u.awaitingSignal()
}

// retentionEvery is the most commits in a row that skip retention (startCommit), so that a
// backlog that never ends still has its old commits deleted.
const retentionEvery = 20

// stopMarkerWait bounds how long a stop waits for the Complete of a checkpoint whose marker was
// on disk when it came (markersOnDisk): the watcher reads a checkpoint as its marker appears. A
// variable for tests.
var stopMarkerWait = 5 * time.Second

// markersOnDisk returns the checkpoints in Dir, at its top, that look complete on disk (a
// directory with its marker, a single file that matches Pattern) while this uploader has not
// seen them complete: the newest generation of the name is not complete, or there is none. Read
// through an os.Root: nothing outside Dir is looked at.
func (u *Uploader) markersOnDisk() map[string]bool {
	root, err := os.OpenRoot(u.cfg.Dir)
	if err != nil {
		return nil
	}
	defer func() { _ = root.Close() }() // a directory handle: nothing to flush
	d, err := root.Open(".")
	if err != nil {
		return nil
	}
	entries, err := d.ReadDir(-1)
	_ = d.Close() // read only
	if err != nil {
		return nil
	}
	marker := u.cfg.Marker
	if marker == "" {
		marker = scanDefaultMarker
	}
	names := map[string]bool{}
	for _, e := range entries {
		name := e.Name()
		if scanSkipName(name) || name == MetaDir || ValidName(name) != nil {
			continue
		}
		g := u.gens[name]
		if g != nil && (g.complete || g.withheld) {
			continue // the drain judges it; a withheld one is said already
		}
		switch {
		case e.IsDir():
			fi, err := root.Lstat(name + "/" + marker)
			if err != nil || !fi.Mode().IsRegular() {
				continue
			}
			if g != nil && !g.stale.isZero() && FileIDOf(fi).Same(g.stale) {
				// The marker a file was written after: no Complete comes for it (waited for
				// 5 s at every stop, and said unreadable; found from outside).
				continue
			}
		case e.Type().IsRegular():
			if ok, _ := path.Match(u.cfg.Pattern, name); u.cfg.Pattern == "" || !ok {
				continue
			}
		default:
			continue
		}
		names[name] = true
	}
	return names
}

// checkTrainer looks, while a stop waits for the checkpoint the trainer was signalled for,
// whether the trainer is still there; gone at two looks in a row, it is not waited for.
func (u *Uploader) checkTrainer() {
	if u.cfg.TrainerAlive == nil || u.lastSignal.IsZero() || u.signalAnswered || u.trainerGone {
		return
	}
	if before := u.completedButBegunBefore(); len(before) > 0 && time.Since(u.lastWriteSeen()) >= earlierSaveQuiet {
		// The trainer took the save it was in when signalled for its answer: nothing written
		// since for a while. (A save for the signal begins at the trainer's next step.)
		u.signalAnswered = true
		u.log.Info().Strs("checkpoints", logNames(before)).Float64("quiet_s", logSeconds(earlierSaveQuiet)).
			Msg("nothing written since a save completed after the signal, though begun before it: taken for the trainer's answer; the stop no longer waits for another")
		return
	}
	if u.cfg.TrainerAlive() {
		u.trainerAbsent = 0
		return
	}
	if u.trainerAbsent++; u.trainerAbsent >= 2 {
		u.trainerGone = true
		if begun := u.begunSinceSignal(); len(begun) > 0 {
			// A save begun and never completed: the trainer died in it. Say which, and how
			// full checkpoint.dir's disk is, the likeliest cause (found from outside: a save
			// cut by ENOSPC was said as none written).
			ev := u.log.Warn().Strs("incomplete", logNames(begun))
			if free, ok := freeSpace(u.cfg.Dir); ok {
				ev = ev.Uint64("checkpoint_dir_free_bytes", free)
				if free < fullDisk {
					ev = ev.Str("fix", "checkpoint.dir's file system is full: free space there (df -h "+u.cfg.Dir+"), or keep fewer checkpoints on disk")
				}
			}
			if h := u.MarkerHint(); h != "" {
				ev = ev.Str("hint", h+": is checkpoint.marker the name the trainer writes last?")
			}
			ev.Msg("the trainer is gone, and the checkpoint it began since it was signalled never completed (no marker); the stop does not wait for it")
			return
		}
		u.log.Warn().Msg("the trainer is gone and wrote no checkpoint since it was signalled; the stop does not wait for one")
	}
}

// earlierSaveQuiet is how long checkpoint.dir must go unwritten after a save completed since the
// signal but begun before it, for a stop to take that save for the trainer's answer: a trainer
// that saves again for the signal (the examples do) begins at its next step; one that does not
// made a stop wait its whole budget (140 s). A variable for tests.
var earlierSaveQuiet = time.Minute

// lastWriteSeen returns when a file or marker of any checkpoint was last reported.
func (u *Uploader) lastWriteSeen() time.Time {
	var last time.Time
	for _, g := range u.gens {
		for _, t := range []time.Time{g.lastFileAt, g.completeSeen} {
			if t.After(last) {
				last = t
			}
		}
	}
	return last
}

// awaitingSignal reports whether a stop waits for the checkpoint the trainer was signalled for.
func (u *Uploader) awaitingSignal() bool {
	return !u.lastSignal.IsZero() && !u.signalAnswered && !u.trainerGone
}

// completedButBegunBefore returns the checkpoints completed since the last signal that were begun
// before it (begunBefore), by name: not the trainer's answer to it.
func (u *Uploader) completedButBegunBefore() []string {
	var out []string
	if u.lastSignal.IsZero() {
		return nil
	}
	for _, name := range slices.Sorted(maps.Keys(u.gens)) {
		g := u.gens[name]
		if (g.complete || g.state == genCommitted) && !g.completeSeen.Before(u.lastSignal) && u.begunBefore(g) {
			out = append(out, name)
		}
	}
	return out
}

// fullDisk is the free space below which checkpoint.dir's file system is said full when a save
// died half way.
const fullDisk = 64 << 20

// begunSinceSignal returns the checkpoints begun since the last signal (by their files' times)
// that are not complete, by name.
func (u *Uploader) begunSinceSignal() []string {
	var out []string
	for _, name := range slices.Sorted(maps.Keys(u.gens)) {
		g := u.gens[name]
		if !g.complete && g.state != genCommitted && len(g.files) > 0 && !g.begunAt.IsZero() && !u.begunBefore(g) {
			out = append(out, name)
		}
	}
	return out
}

// stopGrace is how long Run, returning, waits for clean-up requests in flight before it cuts
// them short.
const stopGrace = 2 * time.Second

// startReadTimeout bounds each store read of start: a store that does not answer (a route that
// drops packets) must not keep the uploader from its notices and events, nor a stop from
// stopping. The job is read again in the background. A variable for tests.
var startReadTimeout = 10 * time.Second

// start reads the journal and the job before the first event: which names have commits (the
// candidates of matching generations), whether LATEST lags the newest commit (then it is
// repaired), and which of the journal's commits are committed, resumable or to be cleaned up.
func (u *Uploader) start(ctx context.Context) {
	jpath := ""
	if u.cfg.StateDir != "" {
		jpath = JournalPath(u.cfg.StateDir, u.cfg.Job, u.cfg.Dir, u.cfg.Store.URL())
		entries, err := readJournal(jpath)
		if err != nil {
			u.log.Warn().Err(err).Str("journal", jpath).Msg("journal unreadable; starting without it")
			u.journalFailed(err)
		}
		u.resume, u.stale = entries, journalStales(jpath)
		u.foreign = foreignJournals(u.cfg.StateDir, jpath)
	}
	rctx, cancel := context.WithTimeout(ctx, startReadTimeout)
	st, err := readJob(rctx, u.cfg.Store, u.cfg.Job, u.cache)
	cancel()
	if err != nil {
		st = nil
		u.log.Error().Err(err).Msg("cannot read the job in the store; LATEST is checked again later (restore takes the newest commit in any case)")
		u.readJobLater(ctx, 1)
	} else {
		u.jobRead(ctx, st)
	}
	for _, name := range slices.Sorted(maps.Keys(u.resume)) {
		u.resolveJournal(ctx, name, u.resume[name], st)
	}
	if jpath != "" {
		cleanups, lates := journalCleanups(jpath), journalLates(jpath, u.cfg.Job)
		j, err := writeJournal(jpath, u.resume)
		if err != nil {
			u.log.Warn().Err(err).Str("journal", jpath).Msg("no journal: after a restart, uncommitted files are sent again")
			u.journalFailed(err)
		}
		u.journal = j
		for _, name := range slices.Sorted(maps.Keys(u.stale)) {
			u.journal.add(staleLine(name, u.stale[name]))
		}
		for _, c := range u.earlyDrops { // dropped by resolveJournal, before the journal was open
			u.journal.add(journalLine{Op: journalDrop, Checkpoint: c.Checkpoint, Commit: c.Commit})
		}
		for _, l := range u.earlyLates { // begun by resolveJournal, before the journal was open
			u.journal.add(l.line())
		}
		u.earlyDrops, u.earlyLates = nil, nil
		if len(lates) > 0 {
			u.log.Info().Int("commits", len(lates)).Msg("resuming an earlier run's late clean-ups (writes that may land after a commit)")
		}
		for _, l := range lates {
			if now := time.Now(); l.At.After(now) {
				l.At = now // a clock set back: not later than its last pass would be now
			}
			if t, ok := u.uncertain[l.Commit]; l.Sealed && (!ok || l.At.After(t)) {
				// A write of its manifest may still land: kept as in the run that wrote it.
				u.uncertain[l.Commit] = l.At
			}
			u.journal.add(l.line())
			u.goLateCleanup(ctx, l)
		}
		for _, c := range cleanups {
			if g := u.resume[c.Checkpoint]; g != nil && g.commit == c.Commit {
				continue // resumed (or committed) after all
			}
			u.cleanupCommit(ctx, c.Checkpoint, c.Commit, "an earlier run's abandoned commit, whose clean-up it did not finish")
		}
	}
}

// jobRead takes the job as read: the commits of each name, and a LATEST repair when it lags the
// newest commit.
func (u *Uploader) jobRead(ctx context.Context, st *JobState) {
	for _, p := range st.Problems {
		u.log.Warn().Err(p).Msg("store entry left alone")
	}
	clear(u.index)
	for _, c := range st.Commits { // newest first
		u.index[c.Manifest.Checkpoint] = append(u.index[c.Manifest.Checkpoint], c.Manifest)
	}
	if n := st.Newest(); n != nil {
		u.learnStoredManifest(n.Manifest)
		// A notice an earlier run signalled the trainer for may have had its checkpoint
		// committed by that run.
		u.emit(UploadEvent{Kind: CheckpointFound, Checkpoint: n.Manifest.Checkpoint, At: time.Now(), Manifest: n.Manifest})
	}
	u.log.Info().Int("commits", len(st.Commits)).Int("unfinished", len(st.Unfinished)).Int("open_parts", len(st.Parts)).Msg("store read")
	if n := st.Newest(); n != nil && !n.Latest {
		if p := st.latestUnusable(); p != nil {
			// A commit this spotguard cannot use (a newer spotguard's manifest, or a damaged
			// one) is not one the store lacks: LATEST is not moved back off it.
			u.log.Error().Err(p).Str("latest", st.Latest.Checkpoint+"/"+st.Latest.Commit).
				Str("newest_usable", n.Manifest.Checkpoint+"/"+n.Manifest.Commit).
				Msg("LATEST names a commit whose manifest this spotguard cannot use; LATEST is left on it (restore says why, and restores an older commit only when asked for one)")
		} else if u.cfg.WorldNodes > 1 && n.Manifest.Parts == nil {
			// A node left at store.world_nodes 1 committed its own files alone: not the job's.
			u.log.Error().Str("checkpoint", n.Manifest.Checkpoint).Str("commit", n.Manifest.Commit).Str("host", n.Manifest.Host.InstanceID).
				Msg("the job's newest commit is a single-node commit in a multi-node job (a node left at store.world_nodes 1?); LATEST is not moved to it")
		} else {
			// Off the loop: the listing and LATEST's read and write may each wait the store's
			// full timeout, and a stop must not wait for them (the work context ends them).
			m := n.Manifest
			u.wg.Go(func() { u.repairLatest(ctx, st, m) })
		}
	}
	if u.cfg.WorldNodes > 1 {
		// This rank's parts whose save is not committed: another node's part may have come
		// while this agent was down, or the agent died between its part and the job manifest.
		for _, p := range st.Parts {
			if p.Part.NodeRank == u.cfg.NodeRank && p.Part.WorldNodes == u.cfg.WorldNodes && time.Since(p.CommittedAt) < u.cfg.PartWait {
				// Complete, and not durable until its job checkpoint is: a notice read again
				// after a restart takes it for the save it asked for, as before the restart
				// (its marker came then; a generation the journal says is committed does not
				// report it again).
				u.emit(UploadEvent{Kind: CheckpointComplete, Checkpoint: p.Checkpoint, At: time.Now(), CompletedAt: p.Order().At})
				u.trackSave(ctx, p)
			}
		}
	}
}

// readJobLater reads the job again after a pause, in the background, until it succeeds.
func (u *Uploader) readJobLater(ctx context.Context, attempt int) {
	u.wg.Go(func() {
		t := time.NewTimer(u.retryDelay("job", attempt, false))
		defer t.Stop()
		select {
		case <-t.C:
		case <-ctx.Done():
			return
		}
		st, err := readJob(ctx, u.cfg.Store, u.cfg.Job, u.cache)
		select {
		case u.wake <- func() {
			if err != nil {
				u.readJobLater(ctx, attempt+1)
				return
			}
			u.jobRead(ctx, st)
		}:
		case <-ctx.Done():
		}
	})
}

// lookupAttempts is how often a generation's lookup may fail before it is sent as a new commit
// without knowing what the store holds of its name (a store that refuses listings must not keep
// checkpoints from being sent).
const lookupAttempts = 4

// goLookup reads the store's commits of g's name, on a goroutine; g waits for them (see
// lookupDone).
func (u *Uploader) goLookup(ctx context.Context, g *generation) {
	delay := time.Duration(0)
	if g.lookupFails > 0 {
		delay = u.retryDelay("lookup "+g.name, g.lookupFails, u.urgent())
	}
	u.wg.Go(func() {
		if delay > 0 {
			t := time.NewTimer(delay)
			defer t.Stop()
			select {
			case <-t.C:
			case <-g.ctx.Done():
				return
			}
		}
		ms, err := readName(g.ctx, u.cfg.Store, u.cfg.Job, g.name, u.cache)
		var parts []*Manifest
		if err == nil && u.cfg.WorldNodes > 1 {
			parts, err = u.ownParts(g.ctx, g.name)
		}
		select {
		case u.wake <- func() { u.lookupDone(ctx, g, ms, parts, err) }:
		case <-ctx.Done():
		}
	})
}

// ownParts returns this node's parts of name that no job manifest lists (a multi-node job): a
// node whose disk comes back without the journal (a reboot, a new instance with the old volume)
// finds the part it sent of a save not committed yet, rather than sending it again as another
// (under a new instance id, another instance's claim of its rank: a conflict, and the save
// never committed; found from outside).
func (u *Uploader) ownParts(ctx context.Context, name string) ([]*Manifest, error) {
	np, err := readNameParts(ctx, u.cfg.Store, u.cfg.Job, name, u.cache)
	if err != nil {
		return nil, err
	}
	return slices.DeleteFunc(np.open, func(p *Manifest) bool {
		return p.Part.NodeRank != u.cfg.NodeRank || p.Part.WorldNodes != u.cfg.WorldNodes
	}), nil
}

// lookupDone takes the store's commits of g's name (and, in a multi-node job, this node's parts
// of it no job manifest lists): with none, g is uploading; with some, it is matching them (what
// it checksummed already is compared now). A failed lookup is tried again after a pause; a
// notice does not wait for it (see dispatch).
func (u *Uploader) lookupDone(ctx context.Context, g *generation, ms, parts []*Manifest, err error) {
	if u.gens[g.name] != g || !g.lookup {
		return
	}
	if err != nil {
		g.lookupFails++
		// Counted and said as the store's failures are (found from outside: a policy that
		// denied listing the checkpoints, and 503s on those lists, counted nothing).
		if ctx.Err() == nil {
			u.emit(UploadEvent{Kind: UploadFailed, Checkpoint: g.name, At: time.Now(), Err: fmt.Errorf("read the store's commits of this checkpoint: %w", err)})
		}
		if g.lookupFails >= lookupAttempts {
			u.log.Warn().Err(err).Str("checkpoint", g.name).Int("attempts", g.lookupFails).
				Msg("cannot read the store's commits of this checkpoint; sending it, and reading them again before its commit")
			g.lookup, g.unread = false, true
			u.sendAll(g)
			return
		}
		u.log.Warn().Err(err).Str("checkpoint", g.name).Int("attempt", g.lookupFails).
			Msg("cannot read the store's commits of this checkpoint; trying again (a notice does not wait)")
		u.goLookup(ctx, g)
		return
	}
	g.lookup = false
	u.index[g.name] = ms
	if len(ms) > 0 {
		u.learnStoredManifest(ms[0])
	}
	u.markDirty(g)
	u.requeue(g)
	cands := append(slices.Clone(ms), parts...)
	if p := g.prior; p != nil && !slices.ContainsFunc(cands, func(m *Manifest) bool { return m.Commit == p.Commit }) {
		// Deleted since (retention): these bytes, if they are its, keep its place in the order
		// (a chmod -R changes every file's ctime, not its bytes), rather than coming back as
		// the newest checkpoint.
		cands = append(cands, p)
	}
	for _, r := range u.retiredOf(g.name) {
		if !slices.ContainsFunc(cands, func(m *Manifest) bool { return m.Commit == r.Commit }) {
			// The same for a commit of the name deleted while this copy of it came (a restore
			// into checkpoint.dir of a commit retention deleted meanwhile: found from outside,
			// committed as the newest, LATEST moved back and retention deleted newer commits).
			cands = append(cands, r)
		}
	}
	if len(cands) == 0 {
		u.sendAll(g)
		return
	}
	g.candidates = cands
	for _, rel := range g.paths() {
		if f := g.files[rel]; f.done != nil && g.state == genMatching {
			u.matched(g, rel, f)
		}
	}
}

// repairLatest moves LATEST to the newest commit m, which it lags.
func (u *Uploader) repairLatest(ctx context.Context, st *JobState, m *Manifest) {
	if m.Parts == nil {
		// A manifest this agent did not see written (another writer, a partial copy of a job)
		// may list objects that are not there: LATEST never names such a commit.
		missing, err := u.missingObjects(ctx, m)
		if err == nil && missing != "" {
			u.log.Error().Str("checkpoint", m.Checkpoint).Str("commit", m.Commit).Str("missing", missing).
				Str("host", m.Host.InstanceID).Str("hostname", m.Host.Hostname).
				Msg("the job's newest commit lists an object the store does not hold (a partial copy of a job? another writer?); LATEST is not moved to it, and restore refuses it as damaged: delete its manifest, or restore another commit with --checkpoint and --commit")
			return
		}
	}
	ev := u.log.Warn().Str("checkpoint", m.Checkpoint).Str("commit", m.Commit)
	if t := st.LatestTarget(); t != nil {
		ev = ev.Str("latest_was", t.Manifest.Checkpoint+"/"+t.Manifest.Commit)
	}
	moved, err := advanceLatest(ctx, u.cfg.Store, m, u.cfg.Host(), u.cache)
	switch {
	case err != nil:
		u.log.Error().Err(err).Msg("LATEST lags the newest commit and cannot be repaired; restore still takes the newest")
	case moved && st.LatestTarget() != nil:
		ev.Msg("LATEST named an older commit (a reclaim between a manifest and LATEST?); repaired")
	case moved && st.Latest != nil:
		ev.Str("latest_named", st.Latest.Checkpoint+"/"+st.Latest.Commit).
			Msg("LATEST named a commit the store does not hold (deleted by hand, or by another tool?); moved to the newest commit")
	case moved:
		ev.Msg("LATEST was missing or unreadable; written again, naming the newest commit")
	}
}

// resolveJournal decides what the journal's entry e for checkpoint name is now: committed (kept,
// so its files are not read again), resumable (its stored files confirmed by a listing; any
// incomplete upload of an earlier run aborted), or neither (its objects deleted).
func (u *Uploader) resolveJournal(ctx context.Context, name string, e *journalEntry, st *JobState) {
	log := u.log.With().Str("checkpoint", name).Str("commit", e.commit).Logger()
	sctx, cancel := context.WithTimeout(ctx, startReadTimeout) // the store's part; clean-up goes on
	defer cancel()
	_, lerr := os.Lstat(filepath.Join(u.cfg.Dir, name))
	inStore := func() bool {
		return slices.ContainsFunc(u.index[name], func(m *Manifest) bool { return m.Commit == e.commit }) ||
			slices.ContainsFunc(st.Parts, func(p *Manifest) bool { return p.Checkpoint == name && p.Commit == e.commit }) ||
			slices.ContainsFunc(u.index[name], func(m *Manifest) bool {
				return slices.ContainsFunc(m.Parts, func(p JobPart) bool { return p.Commit == e.commit })
			})
	}
	if e.done {
		if lerr != nil {
			delete(u.resume, name) // committed, and no longer here: nothing to remember
			return
		}
		if st != nil && !inStore() && u.newerThanStore(name, st, e) {
			// Gone from the store (deleted by hand, a lifecycle rule, a prefix wiped to start
			// over), and newer than everything there, so not retention's doing: retention never
			// deletes the newest commit. The journal is a cache: committed again.
			log.Warn().Msg("the journal's commit of this checkpoint is not in the store, and nothing there is newer: committing it again")
			delete(u.resume, name)
		}
		return
	}
	if ValidCommitID(e.commit) != nil {
		delete(u.resume, name)
		return
	}
	if e.sealed {
		// The earlier run may have sent a write of the manifest whose answer it never had:
		// until such a write would have landed, this run's retention keeps the commit, as it
		// keeps one of its own, so the write cannot land over deleted objects after this run
		// commits the commit itself (resumed), or finds it committed.
		u.uncertain[e.commit] = time.Now()
	}
	committed, unknown := false, false
	if st != nil {
		committed = inStore()
	} else {
		key := ManifestKey(u.cfg.Job, name, e.commit)
		if u.cfg.WorldNodes > 1 {
			key = PartKey(u.cfg.Job, name, e.commit)
		}
		_, _, err := u.cfg.Store.GetBytes(sctx, key)
		switch {
		case err == nil:
			committed = true
		case !errors.Is(err, ErrNotFound):
			// Not resumed (it may be committed), and not forgotten: its incomplete uploads
			// and, once it is known not to be committed, its objects are cleared below.
			log.Warn().Err(err).Msg("cannot tell whether the journal's commit is committed; starting over")
			unknown = true
		}
	}
	if committed {
		e.done = true
		// The killed run's writes of files that left the checkpoint before its commit may land
		// after it (held by the network), and the keys it would have deleted then died with it:
		// the late passes delete what the manifest does not list. And it may have sent more than
		// one write of the manifest and had their answers lost: one the network holds can still
		// land, after another agent's retention deleted the commit, over deleted objects. Its
		// late passes look for that too, counted from when such a write would have had its
		// answer (a commit of this run's has them from its last write's answer on).
		u.startLate(ctx, lateCleanup{CommitRef: CommitRef{Checkpoint: name, Commit: e.commit}, Sealed: e.sealed, Listed: true,
			At: time.Now().Add(s3ResponseHeaderTimeout)})
		if lerr != nil {
			delete(u.resume, name) // as for one the journal says is done
		}
		return
	}
	prefix := CommitPrefix(u.cfg.Job, name, e.commit)
	if !unknown && lerr == nil && time.Since(commitIDStarted(e.commit)) < resumeWithin {
		objs, err := u.cfg.Store.List(sctx, prefix)
		if err == nil {
			have := map[string]int64{}
			for _, o := range objs {
				have[o.Key] = o.Size
			}
			for p, d := range e.files {
				if size, ok := have[d.key]; !ok || size != d.id.Size {
					delete(e.files, p)
				}
			}
			n, aerr := u.cfg.Store.AbortIncomplete(sctx, prefix)
			if aerr != nil {
				log.Warn().Err(aerr).Msg("cannot abort an earlier run's incomplete uploads")
			}
			log.Info().Int("files_stored", len(e.files)).Int("aborted_uploads", n).Msg("resuming this agent's unfinished commit")
			return
		}
		log.Warn().Err(err).Msg("cannot list the unfinished commit; starting over")
	}
	delete(u.resume, name)
	if e.sealed {
		u.goSealedCleanup(ctx, name, e.commit)
		return
	}
	u.cleanupCommit(ctx, name, e.commit, "an earlier run's unfinished commit that cannot be resumed")
}

// newerThanStore reports whether the checkpoint name on disk is complete and completed after the
// job's newest commit in the store (st). With the bytes the journal's done commit e of it was
// made of (journalEntry.holds: a chmod -R since changes nothing), it completed when that commit
// did (a restored copy, adopted as its commit, is not a newer save however new its files are to
// the file system); otherwise as a commit of it would say, with the span in which it was
// modified while no agent watched (restore dates a restored file to its commit).
func (u *Uploader) newerThanStore(name string, st *JobState, e *journalEntry) bool {
	lc, err := ScanCheckpoint(u.cfg.Dir, name, u.cfg.Marker, u.cfg.Pattern, u.log)
	if err != nil || !lc.Complete {
		return false
	}
	n := st.Newest()
	if n == nil {
		return true
	}
	before, after := u.unseen(name)
	at := completedAt(lc, before, after)
	if !e.completeAt.IsZero() && e.holds(lc) {
		at = e.completeAt
	}
	return at.After(n.Manifest.Order().At)
}

// cleanupCommit deletes, in the background, what this agent wrote into commit of name, which was
// never committed and never will be.
func (u *Uploader) cleanupCommit(ctx context.Context, name, commit, why string) {
	u.journal.add(journalLine{Op: journalDrop, Checkpoint: name, Commit: commit})
	if u.journal == nil && u.cfg.StateDir != "" {
		u.earlyDrops = append(u.earlyDrops, CommitRef{Checkpoint: name, Commit: commit})
	}
	log := u.log.With().Str("checkpoint", name).Str("commit", commit).Logger()
	prefix := CommitPrefix(u.cfg.Job, name, commit)
	u.goRetry(ctx, log, "cannot delete an abandoned commit's objects", commit, func() error {
		return deletePrefix(ctx, u.cfg.Store, prefix)
	}, func() {
		log.Info().Str("why", why).Msg("abandoned commit deleted")
		// Until this line is written, a restart deletes it again (journalCleanups).
		select {
		case u.wake <- func() {
			u.journal.add(journalLine{Op: journalCleaned, Checkpoint: name, Commit: commit})
			// Its cancelled uploads and held writes may still land.
			u.startLate(ctx, lateCleanup{CommitRef: CommitRef{Checkpoint: name, Commit: commit}, Abandoned: true})
		}:
		case <-ctx.Done():
		}
	})
}

// goSealedCleanup clears commit of name, which this agent left after a manifest PUT for it got no
// answer (its checkpoint changed or went, or a restart could not resume it). That PUT may still
// land: deleted now, the commit would list deleted objects. So its incomplete uploads are
// aborted now and later (goLateCleanup), and its objects are deleted once uncertainFor has
// passed, unless the manifest is there by then: the write landed after all, and the commit stands.
//
// An earlier write of the manifest may have landed, and another agent's retention deleted the
// commit since; a held write landing after that lists deleted objects. The late passes look for
// such a manifest (dropTorn), and so does the look after uncertainFor: a torn manifest is deleted,
// and the commit's objects with it.
func (u *Uploader) goSealedCleanup(ctx context.Context, name, commit string) {
	ref := CommitRef{Checkpoint: name, Commit: commit}
	u.startLate(ctx, lateCleanup{CommitRef: ref, Sealed: true})
	key := ManifestKey(u.cfg.Job, name, commit)
	if u.cfg.WorldNodes > 1 {
		key = PartKey(u.cfg.Job, name, commit)
	}
	log := u.log.With().Str("checkpoint", name).Str("commit", commit).Logger()
	u.wg.Go(func() {
		t := time.NewTimer(uncertainFor)
		select {
		case <-t.C:
		case <-ctx.Done():
			t.Stop()
			return
		}
		landed := false
		u.goRetry(ctx, log, "cannot tell whether a left commit's manifest landed; looking again", commit, func() error {
			if err := u.dropTorn(ctx, ref); err != nil {
				return err
			}
			_, _, err := u.cfg.Store.GetBytes(ctx, key)
			landed = err == nil
			if errors.Is(err, ErrNotFound) {
				return nil
			}
			return err
		}, func() {
			if landed {
				log.Info().Msg("a manifest write whose answer was lost landed after all: that commit stands")
				return
			}
			select {
			case u.wake <- func() {
				u.cleanupCommit(ctx, name, commit, "left after a manifest write whose answer was lost, which never landed")
			}:
			case <-ctx.Done():
			}
		})
	})
}

// goRetry runs fn on a goroutine until it succeeds (then done, if not nil) or ctx ends, with
// backoff between attempts and a warning (what) for each failure; commit names what it is for.
func (u *Uploader) goRetry(ctx context.Context, log zerolog.Logger, what, commit string, fn func() error, done func()) {
	u.wg.Go(func() {
		for attempt := 1; ; attempt++ {
			err := fn()
			if err == nil {
				if done != nil {
					done()
				}
				return
			}
			if ctx.Err() != nil {
				return
			}
			delay := u.retryDelay(what+" "+commit, attempt, false)
			log.Warn().Err(err).Int("attempt", attempt).Float64("retry_in_s", logSeconds(delay)).Msg(what)
			t := time.NewTimer(delay)
			select {
			case <-t.C:
			case <-ctx.Done():
				t.Stop()
				return
			}
		}
	})
}

// foreignCommit is a commit another journal holds as done: the journal's path and its entry.
type foreignCommit struct {
	journal string
	entry   *journalEntry
}

// foreignJournals reads the journals in stateDir other than own (those of another store.job or
// store.url: an earlier run's), for their done commits by checkpoint name. Any it cannot read
// is left out.
func foreignJournals(stateDir, own string) map[string][]foreignCommit {
	paths, _ := filepath.Glob(filepath.Join(stateDir, "uploads-*.jsonl"))
	var out map[string][]foreignCommit
	for _, p := range paths {
		if p == own {
			continue
		}
		entries, err := readJournal(p)
		if err != nil {
			continue
		}
		for name, e := range entries {
			if e.done {
				if out == nil {
					out = map[string][]foreignCommit{}
				}
				out[name] = append(out[name], foreignCommit{journal: p, entry: e})
			}
		}
	}
	return out
}

// sayForeign warns, once, when g, complete, has the very files (device, inode, size, modification
// time) of a commit another journal holds as done: a checkpoint an earlier run committed under
// another store.job (or store.url), found on this disk by a run with a new one. It is committed
// for this job too (a run that resumes from it needs it as its newest until it saves its own),
// but an old run's bytes must not become a new run's newest in silence (I6).
func (u *Uploader) sayForeign(g *generation) {
	for _, fc := range u.foreign[g.name] {
		if len(fc.entry.files) == 0 || len(fc.entry.files) != len(g.files) {
			continue
		}
		same := true
		for p, d := range fc.entry.files {
			f := g.files[p]
			if f == nil || !f.id.sameContent(d.id) {
				same = false
				break
			}
		}
		if !same {
			continue
		}
		delete(u.foreign, g.name)
		u.log.Warn().Str("checkpoint", g.name).Str("committed_as", fc.entry.commit).Str("journal", fc.journal).Str("job", u.cfg.Job).
			Str("fix", "if this run does not resume from it, delete it from checkpoint.dir (or give each run its own checkpoint.dir); if it does, nothing to do").
			Msg("checkpoint found on disk was committed by an earlier run under another store.job or store.url; committing it to this job too: until this run saves its own, it is this job's newest, and a restore of this job gives it")
		return
	}
}

// current returns the generation of checkpoint name, making it if there is none: from the
// journal, or new.
func (u *Uploader) current(name string) *generation {
	if g := u.gens[name]; g != nil {
		return g
	}
	e := u.resume[name]
	g := u.newGen(name, e == nil)
	if e != nil {
		delete(u.resume, name)
		g.commit = e.commit
		if e.done {
			g.state = genCommitted
			g.complete = true
			for _, m := range u.index[name] {
				if m.Commit == e.commit {
					g.manifest = m
				}
			}
		} else {
			g.state, g.resumed, g.sealed = genUploading, true, e.sealed
		}
		for p, d := range e.files {
			if g.manifest != nil {
				if _, ok := g.manifest.file(p); !ok {
					continue // left before the commit (a journal without its gone line)
				}
			}
			g.files[p] = &fileState{id: d.id, done: &d}
		}
		if f := g.files[u.cfg.Marker]; f != nil && e.done && !g.single {
			g.marker = f.id // the marker the commit was complete with
		}
		if g.manifest == nil && e.done && u.cfg.WorldNodes <= 1 {
			// Deleted from the store since (retention): what the journal knows of it, so that
			// these bytes, found again with other file times (a chmod -R at boot), keep its
			// place in the order (nextGen's prior) rather than coming back as the newest.
			g.manifest = e.manifest(u.cfg.Job, name)
		}
	}
	if id, ok := u.stale[name]; ok {
		// A file was written again after this marker before the restart (reopen).
		delete(u.stale, name)
		if !g.single {
			g.complete, g.stale = false, id
		}
	}
	return g
}

// newGen makes a new generation of name, current from now on: uploading, or with lookup, waiting
// for the store's commits of name (goLookup), then matching (when there are some) or uploading.
func (u *Uploader) newGen(name string, lookup bool) *generation {
	u.seq++
	g := &generation{name: name, seq: u.seq, files: map[string]*fileState{}, state: genUploading}
	g.ctx, g.cancel = context.WithCancel(u.work)
	if fi, err := os.Lstat(filepath.Join(u.cfg.Dir, name)); err == nil && fi.Mode().IsRegular() {
		g.single = true
	}
	u.gens[name] = g
	if lookup {
		g.state, g.lookup = genMatching, true
		u.lookups = append(u.lookups, g)
		u.goLookup(u.work, g)
	}
	return g
}

// newestLookup returns the seq of the newest current generation waiting for its first lookup,
// 0 if none. One whose lookup failed is not waited for: a store that refuses listings must not
// keep older checkpoints from being sent while newer ones keep coming.
func (u *Uploader) newestLookup() uint64 {
	for n := len(u.lookups); n > 0; n = len(u.lookups) {
		if g := u.lookups[n-1]; g.lookup && g.lookupFails == 0 && u.gens[g.name] == g {
			return g.seq
		}
		u.lookups[n-1] = nil
		u.lookups = u.lookups[:n-1]
	}
	return 0
}

// replaceSealed replaces g, whose commit was tried (it may exist), by a new generation that sends
// every file to a new commit: nothing is written into a commit after its manifest PUT.
func (u *Uploader) replaceSealed(g *generation) *generation {
	u.log.Warn().Str("checkpoint", g.name).Str("commit", g.commit).
		Msg("checkpoint changed after its commit was tried; committing it as a new commit")
	ng := u.newGen(g.name, false)
	ng.complete, ng.completeSeen, ng.firstFileAt, ng.notice = g.complete, g.completeSeen, g.firstFileAt, g.notice
	ng.marker, ng.stale = g.marker, g.stale
	for _, p := range g.paths() {
		nf := &fileState{id: g.files[p].id}
		ng.files[p] = nf
		u.enqueue(ng, p, nf)
	}
	g.state = genAbandoned
	u.stopAllGrowing(g)
	g.cancel()
	u.goSealedCleanup(u.work, g.name, g.commit)
	u.markDirty(ng)
	return ng
}

// nextGen replaces the committed generation old, which changed after its commit: the new one
// has old's files, and (matching against old's commit among the others) what is known of them.
func (u *Uploader) nextGen(old *generation) *generation {
	g := u.newGen(old.name, true)
	// begunAt is not old's: this version is begun by the files written again (a trainer that
	// saves into one directory every time, for a signal, after a periodic save).
	g.complete, g.completeSeen, g.firstFileAt = old.complete, time.Now(), old.firstFileAt
	g.marker, g.stale = old.marker, old.stale
	if old.state == genCommitted {
		g.prior, g.committedMarker = old.manifest, old.marker
	}
	if g.complete && !u.lastSignal.IsZero() {
		u.signalAnswered = true // a version completed after the signal
	}
	for p, of := range old.files {
		nf := &fileState{id: of.id}
		if g.state == genMatching && of.done != nil && of.done.id.Same(of.id) {
			d := *of.done
			d.key = ""
			nf.done = &d
		}
		g.files[p] = nf
		if nf.done == nil {
			u.enqueue(g, p, nf)
		}
	}
	return g
}

func (u *Uploader) handleWatch(ctx context.Context, ev WatchEvent) {
	if err := ValidName(ev.Checkpoint); err != nil {
		switch ev.Kind {
		case Withheld:
			// A checkpoint whose own name the store cannot hold: never committed under it.
			u.withheld(ev)
			return
		case Removed:
			// Such a checkpoint gone: its CheckpointWithheld no longer waits for a fix.
			u.emit(UploadEvent{Kind: CheckpointDeleted, Checkpoint: ev.Checkpoint, At: time.Now()})
			return
		}
		u.log.Warn().Str("checkpoint", ev.Checkpoint).Err(err).Msg("checkpoint name refused")
		return
	}
	if ev.Kind == FileReady || ev.Kind == FileGone || ev.Kind == FileGrowing {
		if err := StorablePath(ev.Path); err != nil {
			u.log.Warn().Str("checkpoint", ev.Checkpoint).Err(err).Msg("file refused")
			return
		}
	}
	if g := u.gens[ev.Checkpoint]; g != nil && g.committing {
		g.deferred = append(g.deferred, ev)
		return
	}
	switch ev.Kind {
	case FileGrowing:
		u.fileGrowing(ev)
	case FileReady:
		u.fileReady(ev)
		u.noteMarkerName(u.gens[ev.Checkpoint], ev.Path)
	case Complete:
		u.markerHint.Store(nil) // the marker is right
		u.fileReady(ev)
		g := u.gens[ev.Checkpoint]
		// First complete (no marker before, nothing refused or withheld): its files' times are
		// all that says what came after the marker (writtenAfter).
		first := g.marker.isZero() && g.stale.isZero() && len(g.refused) == 0 && !g.withheld && !g.recheck
		if !g.single {
			if !g.stale.isZero() && ev.ID.Same(g.stale) {
				// The marker a file was written again after (a rescan sends it again; an agent
				// restarted has it from its journal, and says so now).
				u.withheldStale(g, "")
				return
			}
			u.unstale(g)
			g.marker = ev.ID
		}
		g.withheld, g.withheldAt, g.recheck = false, time.Time{}, false
		if g.complete || g.state == genCommitted {
			return
		}
		if rel, ok := u.writtenAfter(g, ev.ID); ok && first {
			// A file last modified after this marker was written: a save into the directory
			// after it, while the agent did not run (found from outside: committed with the old
			// marker at the next start) or before it read the marker.
			g.complete = true // what reopen takes back
			u.reopen(g, rel)
			return
		}
		g.complete, g.completeSeen = true, u.foundAt(ev)
		// (completeSeen may be the marker's own time, which lags the clock by a tick.)
		if !u.lastSignal.IsZero() && !g.completeSeen.Before(u.lastSignal.Add(-FileTimeLag)) && !u.begunBefore(g) {
			if !u.signalAnswered {
				u.answeredBy = g.name
			}
			u.signalAnswered = true
		}
		u.labelNotice(g)
		u.markDirty(g)
		if g.single {
			u.noteSingle(g.name, ev.ModTime)
		}
		completed := ev.ID.ChangeTime
		if completed.IsZero() {
			completed = ev.ModTime
		}
		u.emit(UploadEvent{Kind: CheckpointComplete, Checkpoint: g.name, At: ev.At, CompletedAt: completed})
		u.sayForeign(g)
		if !u.hasData(g) {
			// Complete as the contract has it, and committed so; but a marker written first is
			// the likelier cause, and what comes after it is not committed without the marker
			// written again (newAfterMarker).
			u.log.Warn().Str("checkpoint", g.name).Str("fix", "write the marker last, after every file of the save").
				Msg(msgOnlyMarker)
		}
		u.log.Info().Str("checkpoint", g.name).Int("files", len(g.files)).Int("done", g.doneCount()).
			Msg("checkpoint complete; committing once every file is stored")
	case FileGone:
		g := u.gens[ev.Checkpoint]
		if g != nil && g.state == genCommitted && ev.Path == u.cfg.Marker && !g.single {
			// The trainer saves into it again, the marker taken away first: what it writes
			// now is not written after a marker (rewrittenAfterMarker).
			u.markerGone(g)
		}
		if g == nil || g.state == genCommitted || g.state == genAbandoned {
			return
		}
		delete(g.refused, ev.Path)
		u.stopGrowing(g, ev.Path)
		f := g.files[ev.Path]
		if f != nil && g.sealed {
			// Its manifest may list the file: its key must stay. The rest goes to a new commit.
			g = u.replaceSealed(g)
			f = g.files[ev.Path]
		}
		if f != nil {
			u.fileVanished(g, ev.Path, f)
		}
		if ev.Path == u.cfg.Marker || g.single {
			if g.complete && !g.single {
				u.log.Info().Str("checkpoint", g.name).Msg("marker removed before the commit; the checkpoint is no longer complete, and waits for its marker again")
			}
			u.markerGone(g)
		}
		u.markDirty(g)
	case Withheld:
		if g := u.current(ev.Checkpoint); g.state != genCommitted && g.state != genAbandoned {
			if g.complete {
				u.markerGone(g) // its marker no longer vouches for it
				u.markDirty(g)
			}
			if !g.withheld {
				g.withheldAt = ev.At
			}
			g.withheld, g.heldBack = true, true
		}
		u.withheld(ev)
	case Removed:
		delete(u.resume, ev.Checkpoint)
		delete(u.stale, ev.Checkpoint)
		g := u.gens[ev.Checkpoint]
		if g == nil {
			return
		}
		delete(u.gens, ev.Checkpoint)
		u.unstale(g)
		if ev.Moved {
			u.abandon(ctx, g, whyRenamedAway)
		} else {
			u.abandon(ctx, g, "checkpoint removed")
		}
	}
}

// withheld reports the Withheld ev, a checkpoint whose marker is there but that cannot be
// committed as it is: a CheckpointWithheld, unless it is an old save left behind (older than
// a commit: the watcher's error says it). A stop does not wait for the trainer's save any more
// once it is one: the trainer saved, and what it saved cannot be committed.
func (u *Uploader) withheld(ev WatchEvent) {
	if !u.lastSignal.IsZero() && !ev.At.Before(u.lastSignal) {
		u.signalAnswered = true
	}
	if n := len(u.known); n > 0 && u.known[n-1].order.At.After(ev.ModTime) {
		return
	}
	u.emit(UploadEvent{Kind: CheckpointWithheld, Checkpoint: ev.Checkpoint, At: ev.ModTime, Err: ev.Err})
}

// noteSingle warns, once, when single-file checkpoint name, whose file was modified at mod, and
// the one that completed before it were written within singleTogether of each other. A save
// that writes a file per rank (rank0.pt, rank1.pt), or model and optimizer apart, into
// checkpoint.dir is that many checkpoints, each committed on its own, and a restore brings back
// the newest alone: the others are missing when the trainer resumes.
func (u *Uploader) noteSingle(name string, mod time.Time) {
	last := u.lastSingle
	u.lastSingle = singleSeen{name: name, mod: mod}
	if u.singleWarned || last.name == "" || last.name == name || mod.IsZero() || last.mod.IsZero() || mod.Sub(last.mod).Abs() > singleTogether {
		return
	}
	u.singleWarned = true
	u.log.Warn().Str("checkpoint", name).Str("other", last.name).Float64("apart_s", logSeconds(mod.Sub(last.mod).Abs())).
		Msg("two single-file checkpoints were written within 2 s of each other: if they are one save (a file per rank, or model and optimizer apart), each is a checkpoint of its own and a restore brings back only the newest; write such a save into a directory of its own with the marker last (docs/checkpoints.md)")
}

// singleTogether is how close in time two single-file checkpoints are taken for one save.
const singleTogether = 2 * time.Second

// fileReady records that a file of ev's checkpoint is (again) ready as ev.ID.
func (u *Uploader) fileReady(ev WatchEvent) {
	g := u.current(ev.Checkpoint)
	f := g.files[ev.Path]
	// A file refused as it was (the agent could not read it) back with its bytes as they were, a
	// chmod later, is no file new since the marker (found from outside: it was taken for one,
	// and the checkpoint waited for its marker).
	why, refused := g.refused[ev.Path]
	fixed := refused && (sameVersion(why.id, ev.ID) || !why.id.known()) // unknown: refused by a commit's scan (no regular file then)
	if (f != nil && u.rewrittenAfterMarker(g, ev.Path, f.id, ev.ID) || f == nil && u.newAfterMarker(g, ev.Path) && !fixed && !u.cameBack(g, ev.Path, ev.ID)) && u.markerStill(g) {
		u.reopen(g, ev.Path)
	}
	if g.state == genCommitted {
		if f != nil && f.done != nil && f.done.id.Same(ev.ID) {
			return // still the committed version
		}
		// A restore puts the same bytes back as new files; a trainer may have written other
		// bytes: the matching says which (and warns of other bytes).
		u.log.Info().Str("checkpoint", g.name).Str("commit", g.commit).Str("file", ev.Path).
			Msg("checkpoint's files are not the version committed (changed, or restored): checking them against the store; the commit stays as it is")
		g = u.nextGen(g)
		f = g.files[ev.Path]
	}
	if why, ok := g.refused[ev.Path]; ok {
		if why.id.Same(ev.ID) {
			return // refused already, and said so
		}
		delete(g.refused, ev.Path)
	}
	u.recheck(g, ev.Path)
	if g.sealed && (f == nil || f.done == nil || !f.done.id.Same(ev.ID)) {
		g = u.replaceSealed(g)
		f = g.files[ev.Path]
	}
	if f == nil {
		f = &fileState{}
		g.files[ev.Path] = f
	}
	if f.done != nil && !f.done.id.Same(ev.ID) && g.notice != "" && !u.inForce(g.notice) {
		// A file stored once is written again after the notice it was written for ended: a new
		// save (a trainer restarted after a torn one), not that notice's checkpoint.
		u.log.Info().Str("checkpoint", g.name).Str("notice", g.notice).Str("file", ev.Path).
			Msg("checkpoint written again after its notice ended; it is no longer that notice's")
		g.notice, g.firstFileAt, g.begunAt = "", time.Time{}, time.Time{}
		g.uploadStart, g.uploadEnd, g.uploadBusy, g.sent, g.heldBack = time.Time{}, time.Time{}, 0, 0, false // the forecast is of this save
	}
	if g.firstFileAt.IsZero() {
		g.firstFileAt = u.foundAt(ev)
	}
	g.wroteAt(ev.ModTime)
	g.lastFileAt = ev.At
	u.labelNotice(g)
	f.id = ev.ID
	if f.done != nil && f.done.id.Same(ev.ID) {
		return
	}
	u.enqueue(g, ev.Path, f)
	u.markDirty(g)
}

// rewriteOf reports whether now is the file that was old written again, not only its metadata
// changed (a chmod, a chown, a new link): another inode, size or modification time.
func rewriteOf(old, now FileID) bool {
	return old.known() && now.known() && !old.sameContent(now)
}

// rewrittenAfterMarker reports whether the file rel of g, last seen as old, now written again as
// now (rewriteOf), is the trainer writing into the complete checkpoint directory g anew (a
// rollback saving a step again, a trainer saving into one directory each time) while its marker
// stays: the marker no longer says the files are one save, and committing them now could mix
// two saves.
func (u *Uploader) rewrittenAfterMarker(g *generation, rel string, old, now FileID) bool {
	return g.holdsMarker() && rel != u.cfg.Marker && rewriteOf(old, now)
}

// newAfterMarker reports whether rel, a file g did not have, reported now, is the trainer writing
// into the complete checkpoint directory g after its marker: the watcher reports every file
// there is when the marker appears before its Complete, so one reported after it came later (a
// save into the directory again whose first file is a new one, a marker written first).
func (u *Uploader) newAfterMarker(g *generation, rel string) bool {
	return g.holdsMarker() && rel != u.cfg.Marker
}

// writtenAfter returns a file of g, the checkpoint directory whose marker is marker, that was
// last modified after the marker was written (its modification or change time, whichever is
// later: a marker renamed into place changes only the latter; a restored checkpoint's files and
// marker all have its commit's time). Both are the kernel's file times, of one clock. A
// modification time in the future is no write's (set by hand, a tar from a clock ahead): it
// says nothing, and never withholds a checkpoint for good.
func (u *Uploader) writtenAfter(g *generation, marker FileID) (string, bool) {
	if g.single {
		return "", false
	}
	at := marker.ModTime
	if marker.ChangeTime.After(at) {
		at = marker.ChangeTime
	}
	if at.IsZero() {
		return "", false
	}
	now := u.fileNow().Add(FileTimeLag)
	for _, rel := range g.paths() {
		if f := g.files[rel]; rel != u.cfg.Marker && f.id.ModTime.After(at) && !f.id.ModTime.After(now) {
			return rel, true
		}
	}
	return "", false
}

// markerStill reports whether the marker on disk is still the version g's completeness rests on
// (g.marker): one removed or written again since, whose own event is still to come (a full read
// of the directory reports the files before the marker: a restarted agent), says a new save,
// not a file written after the marker (found from outside: a trainer that took its marker away,
// saved and wrote it again while the agent was stopped was told to do just that).
func (u *Uploader) markerStill(g *generation) bool {
	fi, err := os.Lstat(filepath.Join(u.cfg.Dir, g.name, u.cfg.Marker))
	return err == nil && sameVersion(g.marker, FileIDOf(fi)) // a chmod of it alone is no new version
}

// holdsMarker reports whether g is a checkpoint directory whose marker still vouches for its
// files as they were when it came: complete, or withheld by its commit's scan alone (recheck).
func (g *generation) holdsMarker() bool {
	return (g.complete || g.recheck) && !g.single && !g.marker.isZero()
}

// cameBack reports whether rel, a file g no longer had, reported now as id, is the version of it
// that vanished after the marker (fileVanished), back as it was: made unreadable to the trainer,
// then readable again, its bytes untouched (a chmod changes its ctime alone). That is no write
// after the marker.
func (u *Uploader) cameBack(g *generation, rel string, id FileID) bool {
	if !sameVersion(g.vanished[rel], id) {
		return false
	}
	delete(g.vanished, rel)
	return true
}

// sameVersion reports whether the file now, as id, is the version old that was seen before (a
// zero old: none was): the same file, with the same size and modification time.
func sameVersion(old, id FileID) bool {
	return old.known() && id.known() && !rewriteOf(old, id)
}

// reopen takes the completeness of g back, after its file rel was written again after its marker
// (rewrittenAfterMarker), or came after it (newAfterMarker): g is complete again only with
// another version of the marker (written again, renamed into place, touched). Its files go on
// being sent as they are written.
func (u *Uploader) reopen(g *generation, rel string) { u.reopenSaying(g, rel, msgRewrittenAfterMarker) }

// reopenSaying is reopen, with msg as the log line's message.
func (u *Uploader) reopenSaying(g *generation, rel, msg string) {
	g.complete, g.stale, g.recheck = false, g.marker, false
	g.begunAt = time.Time{} // a save into it again begins now (fileReady takes the file's time)
	u.journal.add(staleLine(g.name, g.stale))
	u.flushJournal()
	u.log.Warn().Str("checkpoint", g.name).Str("file", rel).
		Str("fix", "write the marker last, and remove it before writing into the checkpoint directory again").
		Msg(msg)
	if g.state != genCommitted {
		u.withheldStale(g, rel)
	}
}

// withheldStale reports g, complete and not committed until a file (rel, "" if not known: one
// the journal of an earlier run holds) was written after its marker, withheld until its marker is
// written again (CheckpointWithheld, once per marker version): a notice saved for it said its
// checkpoint written until its deadline, and then that its upload went on, though every file was
// stored and the store was fine (found from outside: a marker written before the data).
func (u *Uploader) withheldStale(g *generation, rel string) {
	if g.stale.isZero() || g.staleSaid.Same(g.stale) {
		return
	}
	g.staleSaid = g.stale
	what := "a file"
	if rel != "" {
		what = rel
	} else {
		// Known from an earlier run's journal: said here, or nowhere (found from outside: the
		// withheld counter rose at a restart without a line).
		u.log.Warn().Str("checkpoint", g.name).Str("fix", "write the marker again once the checkpoint is whole").
			Msg("checkpoint's marker is one a file was written after (the journal of an earlier run says so): " + msgRewrittenAfterMarker)
	}
	err := fmt.Errorf("%w: %s/%s", ErrWrittenAfterMarker, g.name, what)
	u.emit(UploadEvent{Kind: CheckpointWithheld, Checkpoint: g.name, At: g.stale.ModTime, Err: err})
}

// markerGone takes the completeness of g back, its marker gone (or g itself): whatever marker
// comes next is another.
func (u *Uploader) markerGone(g *generation) {
	u.unstale(g)
	g.complete, g.marker, g.recheck = false, FileID{}, false
}

// recheck completes g again after its file rel was reported again while its commit's scan
// withheld it (generation.recheck), unless a file of it still cannot be stored as it was: its
// commit's scan judges it anew. A file gone is not enough: the trainer may be putting it back.
// (Found from outside: a symbolic link put in place of a file for a moment after the marker,
// then the file again, kept a checkpoint withheld for good, for the link, long gone; and a file
// made readable waited for the marker.)
func (u *Uploader) recheck(g *generation, rel string) {
	if !g.recheck || rel == u.cfg.Marker || len(g.refused) > 0 || g.state == genCommitted || g.state == genAbandoned {
		return // a marker's own Complete completes it
	}
	g.recheck = false
	g.complete, g.withheld, g.withheldAt = true, false, time.Time{}
	u.log.Info().Str("checkpoint", g.name).Str("file", rel).
		Msg("a file of the checkpoint changed since its commit was withheld; looking at the checkpoint again")
	u.markDirty(g)
}

// unstale ends g's stale marker, if it has one, in the journal too: another marker came, the
// marker went, or the checkpoint did.
func (u *Uploader) unstale(g *generation) {
	if !g.stale.isZero() {
		u.journal.add(staleLine(g.name, FileID{}))
		g.stale = FileID{}
	}
}

// msgOnlyMarker is logged for a checkpoint directory complete with nothing but its marker.
const msgOnlyMarker = "checkpoint directory is complete with nothing but its marker (committed so): if the marker was written first, the files that come after it are not committed until it is written again"

// msgRewrittenAfterMarker is reopen's log line.
// msgDeletedAfterMarker is the log line of a file of a complete checkpoint deleted after its
// marker was written (a save into the directory again, or its removal, cut short).
const msgDeletedAfterMarker = "file deleted after its checkpoint's marker: the checkpoint is not complete until its marker is written again"

const msgRewrittenAfterMarker = "file written again after its checkpoint's marker: the checkpoint is not complete until its marker is written again"

// growingMax bounds the files sent while they are written at once (each holds an open file).
const growingMax = 256

// fileGrowing begins sending a file of ev's checkpoint while it is written (GrowingStore), or
// tells its transfer how far it has grown: during a notice only, for a file the checkpoint has
// not had a FileReady of, of a checkpoint whose files go to a commit (not one matching the
// store's commits of its name, nor one whose commit was tried). The file's FileReady then
// finishes the transfer (goUpload); anything else stops it.
func (u *Uploader) fileGrowing(ev WatchEvent) {
	g := u.gens[ev.Checkpoint]
	if g != nil {
		g.wroteAt(ev.ModTime)
		if gf := g.growing[ev.Path]; gf != nil {
			gf.t.Grew(ev.Size)
			return
		}
	}
	gs, ok := u.cfg.Store.(GrowingStore)
	if !ok || u.cfg.WaitForClose || !u.urgent() || u.growingN >= growingMax {
		return
	}
	if g == nil {
		g = u.current(ev.Checkpoint)
	}
	if g.lookup {
		// As dispatch does during a notice: the store's commits of the name are read at commit.
		g.lookup, g.unread = false, true
		u.sendAll(g)
	}
	if g.state != genUploading || g.lookup || g.sealed || g.single || g.files[ev.Path] != nil {
		return
	}
	f, id, err := openLocal(u.cfg.Dir, g.localPath(ev.Path))
	if err != nil {
		return // its FileReady says what is wrong with it
	}
	u.beginCommit(g)
	t := gs.StartGrowing(withRank(g.ctx, g.seq), DataKey(u.cfg.Job, g.name, g.commit, ev.Path), f)
	if t == nil {
		f.Close()
		return
	}
	if g.growing == nil {
		g.growing = map[string]*growingFile{}
	}
	g.growing[ev.Path] = &growingFile{t: t, id: id, began: time.Now()}
	u.growingN++
	u.labelNotice(g)
	t.Grew(ev.Size)
}

// takeGrowing removes the transfer of rel from g and returns it (nil if there is none).
func (u *Uploader) takeGrowing(g *generation, rel string) *growingFile {
	gf := g.growing[rel]
	if gf != nil {
		delete(g.growing, rel)
		u.growingN--
	}
	return gf
}

// stopGrowing aborts the transfer of rel, if there is one, in the background.
func (u *Uploader) stopGrowing(g *generation, rel string) {
	if gf := u.takeGrowing(g, rel); gf != nil {
		u.wg.Go(gf.t.Abort)
	}
}

// stopAllGrowing aborts every transfer of g's files, in the background.
func (u *Uploader) stopAllGrowing(g *generation) {
	for rel := range g.growing {
		u.stopGrowing(g, rel)
	}
}

// beginCommit chooses g's commit if it has none, and writes it to the journal before anything
// is sent to it: a restart must know every commit it began.
func (u *Uploader) beginCommit(g *generation) {
	if g.commit != "" {
		return
	}
	g.commit = u.newCommitID(g, time.Now())
	u.journal.add(journalLine{Op: journalCommit, Checkpoint: g.name, Commit: g.commit})
	u.flushJournal()
}

// inForce reports whether the notice key is in force.
func (u *Uploader) inForce(key string) bool {
	return slices.ContainsFunc(u.active, func(n ActiveNotice) bool { return n.Key == key })
}

// labelNotice marks g as written for the most severe notice in force, if there is one and g has
// no label yet.
func (u *Uploader) labelNotice(g *generation) {
	if g.notice == "" && len(u.active) > 0 {
		g.notice = u.active[0].Key
	}
}

// whyRenamedAway is abandon's why for a checkpoint directory renamed away: a trainer renaming
// a staging directory into place brings it back under another name.
const whyRenamedAway = "checkpoint renamed away"

// msgRenamedBeforeCommitFix is the advice given when a complete checkpoint's directory is
// renamed before its commit.
const msgRenamedBeforeCommitFix = "write the marker after renaming the directory into place, or write the directory " +
	"under a name that starts with \".\" and ends in \".tmp\" (never looked at): a directory renamed after its marker " +
	"is a complete checkpoint under both names, and is sent again under its new one"

// abandon forgets g, whose checkpoint is gone: its work is cancelled and what it wrote into its
// own (never committed) commit is deleted.
func (u *Uploader) abandon(ctx context.Context, g *generation, why string) {
	if g.state == genCommitted || g.state == genAbandoned {
		return
	}
	g.state = genAbandoned
	u.stopAllGrowing(g)
	g.cancel()
	moved := why == whyRenamedAway
	// Deleted whole (rm -r, shutil.rmtree), its files go first, the marker among them: it was
	// complete if its marker came.
	wasComplete := g.complete || !g.completeSeen.IsZero()
	if !moved && !u.lastSignal.IsZero() && !g.firstFileAt.Before(u.lastSignal) {
		// The checkpoint written for the signal is deleted: nothing to wait for. One renamed
		// away is awaited under its new name (a staging directory renamed into place).
		u.signalAnswered = true
	}
	switch {
	case wasComplete && g.commit != "" && moved:
		// The trainer renamed a staging directory into place after writing the marker in it.
		u.log.Warn().Str("checkpoint", g.name).Str("why", why).Int("files", len(g.files)).Int("stored", g.doneCount()).
			Str("fix", msgRenamedBeforeCommitFix).
			Msg("complete checkpoint's directory renamed away before it was committed; renamed within checkpoint.dir, it is committed under its new name")
	case wasComplete && moved:
		// Renamed before anything of it was sent (a marker seen under the path a watch had, the
		// directory renamed into place just before it was written): it is sent under its new name.
		u.log.Info().Str("checkpoint", g.name).Str("why", why).
			Msg("complete checkpoint's directory renamed away before its upload began; committed under its new name")
	case wasComplete && (g.commit != "" || !u.superseded(g)):
		// Complete and gone before its commit, begun or still waiting its turn (found from
		// outside: those said only "no longer tracked"): the trainer's own rotation outran the
		// upload (a store slower than the trainer saves), or someone deleted it. Its files went
		// first (counted as vanished), so how many were stored is not known.
		u.log.Warn().Str("checkpoint", g.name).Str("why", why).Int("files", len(g.files)+len(g.vanished)).Bool("begun", g.commit != "").
			Msg("complete checkpoint gone before it was committed: if the trainer deletes its older checkpoints, it saves faster than the store takes them; keep more of them on disk, or save less often")
	default:
		u.log.Info().Str("checkpoint", g.name).Str("why", why).Msg("checkpoint no longer tracked")
	}
	switch {
	case wasComplete && moved:
		// A notice whose checkpoint this was waits for it under its new name.
		u.emit(UploadEvent{Kind: CheckpointRenamedAway, Checkpoint: g.name, At: time.Now()})
	case wasComplete:
		// A notice whose checkpoint this was no longer waits for it.
		u.emit(UploadEvent{Kind: CheckpointDeleted, Checkpoint: g.name, At: time.Now()})
	case g.withheld:
		// Its CheckpointWithheld no longer waits for a fix.
		u.emit(UploadEvent{Kind: CheckpointDeleted, Checkpoint: g.name, At: time.Now()})
	}
	switch {
	case g.commit != "" && !g.sealed:
		u.cleanupCommit(ctx, g.name, g.commit, why)
	case g.commit != "":
		u.goSealedCleanup(ctx, g.name, g.commit)
	}
}

// superseded reports whether a commit this uploader knows of completed after g did: g, not
// begun, was no longer needed (a trainer's rotation deleting a save that a newer commit made
// old is no loss).
func (u *Uploader) superseded(g *generation) bool {
	at := g.marker.ModTime
	if at.IsZero() {
		at = g.completeSeen
	}
	n := len(u.known)
	return n > 0 && !at.IsZero() && u.known[n-1].order.At.After(at)
}

// fileVanished drops rel, which is no longer on disk, from g. From a complete checkpoint that is
// said at warn level (never silent, I6): the checkpoint is committed without the file, which its
// marker had declared part of it (a trainer deleting files after its marker, or a checkpoint
// being deleted while it is committed).
func (u *Uploader) fileVanished(g *generation, rel string, f *fileState) {
	if g.holdsMarker() && rel != u.cfg.Marker {
		// Said when the checkpoint is committed without them (sayVanished), not now: a whole
		// checkpoint being deleted (a trainer's rotation, rm -r) is not committed, and a warning
		// per file said nothing but that (found from outside: 38 000 lines in 2.5 minutes).
		if g.vanished == nil {
			g.vanished = map[string]FileID{}
		}
		g.vanished[rel] = f.id
	}
	u.dropFile(g, rel, f)
}

// sayVanished logs, at warn level, the files that left g after its marker and are not in m, its
// commit: said once the commit landed, not when it began, as a file that can no longer be read
// (made unreadable, not deleted) keeps the checkpoint from being committed at all.
func (u *Uploader) sayVanished(g *generation, m *Manifest) {
	var gone []string
	for rel := range g.vanished {
		if _, ok := m.file(rel); !ok {
			gone = append(gone, rel)
		}
	}
	g.vanished = nil
	if len(gone) == 0 {
		return
	}
	slices.Sort(gone)
	u.log.Warn().Str("checkpoint", g.name).Strs("files", gone[:min(len(gone), 10)]).Int("count", len(gone)).Str("commit", m.Commit).
		Msg("files vanished from a complete checkpoint after its marker; it was committed without them")
}

// dropFile removes rel from g (it vanished, or cannot be used); a stored copy becomes a stray.
func (u *Uploader) dropFile(g *generation, rel string, f *fileState) {
	delete(g.files, rel)
	u.stopGrowing(g, rel)
	if f.queued {
		f.queued = false
		g.queuedN--
	}
	stored := ""
	switch {
	case f.key != "":
		stored = f.key
	case f.done != nil && f.done.key != "":
		stored = f.done.key
	}
	if stored != "" {
		g.strays = append(g.strays, stored)
		// Journalled as stored: a restart must not count it in the commit.
		u.journal.add(journalLine{Op: journalGone, Checkpoint: g.name, Commit: g.commit, Path: rel})
	}
}

// paths returns the paths of g's files in order: work on them is queued in this order, the
// same in every run.
func (g *generation) paths() []string { return slices.Sorted(maps.Keys(g.files)) }

// gensInOrder returns the current generations, oldest first.
func (u *Uploader) gensInOrder() []*generation {
	gens := slices.Collect(maps.Values(u.gens))
	slices.SortFunc(gens, func(a, b *generation) int { return cmp.Compare(a.seq, b.seq) })
	return gens
}

func (g *generation) doneCount() int {
	n := 0
	for _, f := range g.files {
		if f.done != nil {
			n++
		}
	}
	return n
}

// enqueue queues rel of g for its next step (checksum or upload), once; a file in flight is
// queued again when its result comes.
func (u *Uploader) enqueue(g *generation, rel string, f *fileState) {
	if f.inflight {
		f.again = true
		return
	}
	if f.queued {
		return
	}
	f.queued = true
	g.queue = append(g.queue, rel)
	g.queuedN++
	u.requeue(g)
}

// requeue puts g among the generations with files waiting (ordered by seq), if it has some.
func (u *Uploader) requeue(g *generation) {
	if g.inQueued || g.queuedN == 0 {
		return
	}
	g.inQueued = true
	i, _ := slices.BinarySearchFunc(u.queued, g.seq, func(a *generation, seq uint64) int {
		switch {
		case a.seq < seq:
			return -1
		case a.seq > seq:
			return 1
		}
		return 0
	})
	u.queued = slices.Insert(u.queued, i, g)
}

// pop returns g's next queued file, or false.
func (g *generation) pop() (string, *fileState, bool) {
	for g.qhead < len(g.queue) {
		rel := g.queue[g.qhead]
		g.queue[g.qhead] = ""
		g.qhead++
		if g.qhead == len(g.queue) {
			g.queue, g.qhead = g.queue[:0], 0
		}
		if f := g.files[rel]; f != nil && f.queued {
			f.queued = false
			g.queuedN--
			return rel, f, true
		}
	}
	return "", nil, false
}

func (u *Uploader) queuedFiles() int {
	n := 0
	for _, g := range u.queued {
		n += g.queuedN
	}
	return n
}

func (u *Uploader) markDirty(g *generation) { u.dirty = append(u.dirty, g) }

// ready reports whether g can be committed (or adopted) now.
func (u *Uploader) ready(g *generation) bool {
	return u.gens[g.name] == g && (g.state == genMatching || g.state == genUploading) && g.complete &&
		!g.committing && !g.commitWait && g.queuedN == 0 && g.inflight == 0 && g.retrying == 0 && len(g.files) > 0
}

// hasData reports whether g has a file besides its marker: a checkpoint directory with nothing
// but its marker is complete, but more likely a marker written before the save's files.
func (u *Uploader) hasData(g *generation) bool {
	for rel := range g.files {
		if g.single || rel != u.cfg.Marker {
			return true
		}
	}
	return false
}

// next returns the index in u.queued of the generation whose files go next, or -1 for none now.
//
// After a notice, the newest, which is the one that matters, except that a checkpoint completed
// since the trainer was last signalled whose upload has begun keeps its turn over every other
// one until its files are sent (the oldest such first; none other begins meanwhile): it is the
// notice's checkpoint, or one completed after it, and a
// trainer that saves faster than the link and saves on after its signal would otherwise have
// each save overtaken by the next, so that none is committed, not even the notice's (found from
// outside). One that is stuck (its uploads all failing for stuckAfterUrgent) keeps no turn.
//
// Without one, a complete checkpoint goes before one still being written, and a generation whose
// upload has begun keeps its turn over newer ones (a complete one first) until its files are
// sent: a trainer that saves faster than the store takes them, and deletes its older
// checkpoints, would otherwise have each overtaken by the next and deleted before it is
// committed, so that none ever is; and a checkpoint being written (a directory of 20 000 files)
// held a complete one back for as long as it had files waiting (both found from outside). Nor
// does an older one begin while a newer one waits for its lookup: the checkpoints a restart
// finds come back from their lookups in any order, and the first back would keep its turn over
// the newest (found from outside). Nor does one that is stuck (stuckAfter).
func (u *Uploader) next(urgent bool) int {
	newest := len(u.queued) - 1
	now := time.Now()
	begun := func(g *generation) bool {
		return g.state == genUploading && !g.lookup && g.commit != "" && u.gens[g.name] == g && !g.stuck(now, urgent)
	}
	if urgent {
		if !u.lastSignal.IsZero() {
			// The oldest such is sent to its end alone: its files fill the slots, and no other
			// checkpoint's begin while its last ones are in flight (sharing the link, every
			// save since the signal was in flight at once and none was committed: found from
			// outside).
			var turn *generation
			for _, g := range u.gens {
				if g.complete && begun(g) && !g.completeSeen.Before(u.lastSignal) && (g.queuedN > 0 || g.inflight > 0 || g.retrying > 0) &&
					(turn == nil || g.seq < turn.seq) {
					turn = g
				}
			}
			if turn != nil {
				return slices.Index(u.queued, turn) // -1 while its last files are in flight
			}
		}
		return newest
	}
	for i := newest; i >= 0; i-- {
		if g := u.queued[i]; g.complete && begun(g) {
			return i
		}
	}
	for i := newest; i >= 0; i-- {
		if g := u.queued[i]; g.complete && !g.lookup && u.gens[g.name] == g {
			return u.unlessNewerLookup(i)
		}
	}
	if u.completeLookup() {
		return -1 // a complete checkpoint reading the store's commits of its name goes first
	}
	for i := newest; i >= 0; i-- {
		if begun(u.queued[i]) {
			return i
		}
	}
	return u.unlessNewerLookup(newest)
}

// stuckAfter is how long a begun checkpoint's uploads may all fail, none stored since, before it
// no longer keeps its turn over newer checkpoints (next), and stuckAfterUrgent the same while a
// notice is in force: one whose uploads can never succeed (a key the store refuses for good)
// held every later checkpoint back, the notice's included, for as long as it was there (found
// from outside). It is still tried; the newer ones go first. Variables for tests.
var stuckAfter, stuckAfterUrgent = 2 * time.Minute, 20 * time.Second

// stuck reports whether g's uploads have failed for stuckAfter (stuckAfterUrgent when urgent),
// with none of its files stored since.
func (g *generation) stuck(now time.Time, urgent bool) bool {
	d := stuckAfter
	if urgent {
		d = stuckAfterUrgent
	}
	return !g.failingSince.IsZero() && now.Sub(g.failingSince) >= d
}

// completeLookup reports whether a complete checkpoint waits for its lookup (newestLookup's
// kind: not failed, still the checkpoint's generation).
func (u *Uploader) completeLookup() bool {
	return slices.ContainsFunc(u.lookups, func(g *generation) bool {
		return g.complete && g.lookup && g.lookupFails == 0 && u.gens[g.name] == g
	})
}

// unlessNewerLookup returns i, or -1 while a generation newer than u.queued[i] waits for its
// lookup (lookupDone dispatches again).
func (u *Uploader) unlessNewerLookup(i int) int {
	if u.newestLookup() > u.queued[i].seq {
		return -1
	}
	return i
}

// dispatch starts the next commit and queued file jobs while there are free slots: the files of
// the generation next picks.
func (u *Uploader) dispatch(ctx context.Context) {
	for _, g := range u.dirty {
		if !g.inCommitQ && u.ready(g) {
			g.inCommitQ = true
			u.commitQ = append(u.commitQ, g)
		}
	}
	clear(u.dirty)
	u.dirty = u.dirty[:0]
	for u.committing == nil && len(u.commitQ) > 0 {
		g := u.commitQ[0]
		u.commitQ[0] = nil
		u.commitQ = u.commitQ[1:]
		g.inCommitQ = false
		if u.ready(g) {
			u.startCommit(ctx, g)
		}
	}
	limit := u.cfg.BackgroundFiles
	urgent := u.urgent()
	if urgent {
		limit = u.cfg.UrgentFiles
		hurry(u.cfg.Store)
	}
	for u.inflight < limit && len(u.queued) > 0 {
		i := u.next(urgent)
		if i < 0 {
			break
		}
		g := u.queued[i]
		if g.lookup && urgent && u.gens[g.name] == g {
			// A notice does not wait for the store's commits of the name: it is sent, and its
			// commit reads them.
			g.lookup, g.unread = false, true
			u.sendAll(g)
		}
		if g.lookup {
			u.queued = slices.Delete(u.queued, i, i+1)
			g.inQueued = false
			continue
		}
		rel, f, ok := g.pop()
		if !ok || u.gens[g.name] != g || (g.state != genMatching && g.state != genUploading) {
			g.inQueued = false
			u.queued = slices.Delete(u.queued, i, i+1)
			continue
		}
		f.inflight = true
		g.inflight++
		u.inflight++
		if g.state == genMatching {
			u.goHash(ctx, g, rel, f)
			continue
		}
		u.beginCommit(g)
		u.goUpload(ctx, g, rel, f)
	}
}

// batchWaitMax is how long the uploader waits for the next event of a full read of the
// directory (WatchEvent.More) before it goes on without the rest.
var batchWaitMax = time.Second

// uncertainFor is how long retention keeps a commit after a write of its manifest whose answer
// was lost: a write the network held may land that long after (the late clean-up's last pass).
var uncertainFor = 2 * time.Minute

// indexKeep is how many checkpoint names the uploader keeps the store's commits of in memory
// (index, and their manifests in cache) before it forgets those of names no longer on disk.
var indexKeep = 64

// forgetGone forgets, once more than indexKeep names are known, the store's commits of names no
// longer on disk. Without checkpoint.keep the store keeps every commit, and their manifests grew
// the agent's memory for as long as it ran (found from outside: about 55 KB a commit of 200
// files). A name that comes back (a restore, a rollback) is looked up in the store again.
func (u *Uploader) forgetGone() {
	if u.cfg.Keep > 0 || len(u.index) <= indexKeep {
		return // retention bounds the commits, and reads their manifests at every pass
	}
	for name, ms := range u.index {
		if u.gens[name] != nil {
			continue
		}
		for _, m := range ms {
			u.cache.drop(ManifestKey(m.Job, m.Checkpoint, m.Commit))
		}
		delete(u.index, name)
	}
}

// retentionDone reports retention's failed deletes as failed uploads (counted by reason, in
// /status: a store that refuses deletes lets the bucket grow without end), and clears the data
// left behind after a manifest went again, as an abandoned commit's (goLateCleanup). It watches
// the prefixes of the commits deleted that a held manifest write may revive (lateCleanup.Deleted).
func (u *Uploader) retentionDone(ctx context.Context, failed []retentionFailure, watch []CommitRef) {
	for _, f := range failed {
		u.emit(UploadEvent{Kind: UploadFailed, Checkpoint: f.Checkpoint, At: time.Now(), Err: fmt.Errorf("retention: %w", f.Err)})
		for _, c := range f.Left {
			u.startLate(ctx, lateCleanup{CommitRef: c, Abandoned: true})
		}
	}
	for _, c := range watch {
		u.startLate(ctx, lateCleanup{CommitRef: c, Deleted: true})
	}
}

// unseen is the span in which a version of name last modified was modified while no agent watched
// (completedAt): before a second before Run began (the kernel's file times lag the clock by a
// tick), for a name the store holds no commit of. When it holds one, a version different from it
// is newer, however its modification times were set: no span (zero times).
func (u *Uploader) unseen(name string) (before, after time.Time) {
	if len(u.index[name]) > 0 {
		return time.Time{}, time.Time{}
	}
	return u.started.Add(-time.Second), time.Time{}
}

// knownOrder is a commit's place in the order (Manifest.Order) and when this agent learned of it,
// by this instance's clock.
type knownOrder struct {
	order CommitOrder
	at    time.Time
	// here is the commit's completion by this instance's clock (Timings.CompleteAtHere of a
	// commit this instance wrote, its order moved after a clock ahead), zero if not known.
	here time.Time
	// mono is when it was learned by the monotonic clock (since monoStart), 0 if not known: what
	// tells a wall clock set back since (knownNow).
	mono time.Duration
}

// monoStart is the reference of knownOrder.mono.
var monoStart = time.Now()

// knownNow returns u.known as of the wall clock now (knownAsOf).
func (u *Uploader) knownNow() []knownOrder {
	if u.cfg.fileClock != nil {
		return slices.Clone(u.known) // a test's clock: no monotonic one beside it
	}
	return knownAsOf(u.known, time.Now().Round(0), time.Since(monoStart))
}

// knownAsOf returns known with the moment each was learned in terms of the wall clock at wall
// (monotonic time mono): a wall clock set back since (by more than a second: NTP's slews aside)
// moves the moment back as much, so that a version completed after it, by the clock as it is
// now, is ordered after it (found from outside: a clock stepped back under a running agent, its
// own commits dated by the clock before, dated its next checkpoints before them; LATEST stayed
// and retention deleted the new ones).
func knownAsOf(known []knownOrder, wall time.Time, mono time.Duration) []knownOrder {
	out := slices.Clone(known)
	for i, k := range out {
		if k.mono == 0 {
			continue
		}
		if step := wall.Sub(k.at) - (mono - k.mono); step < -time.Second {
			out[i].at = k.at.Add(step)
		}
	}
	return out
}

// retentionWouldDelete reports whether retention would delete a commit completing at place now:
// it keeps checkpoint.keep commits, and this agent has learned of that many newer ones.
func (u *Uploader) retentionWouldDelete(place time.Time) bool {
	if u.cfg.Keep <= 0 {
		return false
	}
	newer := 0
	for _, k := range u.known {
		if k.order.At.After(place) {
			newer++
		}
	}
	return newer >= u.cfg.Keep
}

// retiredOf returns the manifests of u.retired of checkpoint name.
func (u *Uploader) retiredOf(name string) []*Manifest {
	return slices.DeleteFunc(slices.Clone(u.retired), func(m *Manifest) bool { return m.Checkpoint != name })
}

// retiredManifests bounds Uploader.retired: a restore reads a commit that is there when it
// begins, so what retention deleted while it ran is among the last few deletions.
const retiredManifests = 16

// knownOrders bounds Uploader.known: the oldest entries matter only to a version completed long
// ago and still not committed.
const knownOrders = 64

// learn records that the agent knows, from now on, of a commit in order o (read from the store or
// written by it). A version completed after that completed after the commit, whatever the clock of
// the instance that wrote the commit said (afterKnown).
func (u *Uploader) learn(o CommitOrder) { u.learnHere(o, time.Time{}) }

// learnHere is learn of o, whose completion by this instance's clock is here (zero: not known).
func (u *Uploader) learnHere(o CommitOrder, here time.Time) {
	if n := len(u.known); n > 0 && !o.After(u.known[n-1].order) {
		return // a newer one was known before
	}
	k := knownOrder{order: o, at: u.fileNow(), here: here}
	if u.cfg.fileClock == nil {
		k.mono = time.Since(monoStart)
	}
	u.known = append(u.known, k)
	if n := len(u.known); n > knownOrders {
		u.known = slices.Delete(u.known, 0, n-knownOrders)
	}
}

// fileNow is the time by the clock that sets files' times (time.Now, but in tests).
func (u *Uploader) fileNow() time.Time {
	if u.cfg.fileClock != nil {
		return u.cfg.fileClock().Round(0)
	}
	return time.Now().Round(0)
}

// learnStored is learn of o, the order of a commit read from the store: it may be the answer to
// the signal (answeredByKnown).
func (u *Uploader) learnStored(o CommitOrder) {
	u.learn(o)
	u.answeredByKnown()
}

// learnStoredManifest is learnStored of m's order, with its completion by this instance's clock
// when this instance wrote it and moved its order after a clock ahead (found from outside: a
// restarted agent ordered the save the trainer made after that commit before it, and its
// retention deleted the new commit at once, LATEST staying on the older save).
func (u *Uploader) learnStoredManifest(m *Manifest) {
	var here time.Time
	if t := m.Timings.CompleteAtHere; t != nil && u.cfg.Host != nil && m.Host.InstanceID != "" && m.Host.InstanceID == u.cfg.Host().InstanceID {
		here = *t
	}
	u.learnHere(m.Order(), here)
	u.answeredByKnown()
}

// learnOwn is learn of o, the order of g's commit: the answer to the signal if it completed after
// it and was not begun before it (begunBefore; the signal may have come after g's Complete, as
// at a restart).
func (u *Uploader) learnOwn(g *generation, o CommitOrder) {
	u.learn(o)
	if !u.begunBefore(g) {
		was := u.signalAnswered
		u.answeredByKnown()
		if !was && u.signalAnswered {
			u.answeredBy = g.name
		}
	}
}

// answeredByKnown takes the trainer's signal (lastSignal) as answered when the newest commit
// known completed after it: a restarted agent (kill -9, the watchdog) inherits the signal its
// previous run sent, and finds the checkpoint the trainer wrote for it committed by that run,
// in the store, not on its own; a stop then waited its whole budget for one more (found from
// outside: 140 s, and an error saying the signalled checkpoint was missing). File times may lag
// the clock by a tick.
func (u *Uploader) answeredByKnown() {
	if n := len(u.known); n > 0 && !u.lastSignal.IsZero() && !u.known[n-1].order.At.Before(u.lastSignal.Add(-FileTimeLag)) {
		u.signalAnswered = true
	}
}

// afterKnown returns the place in the order of a version completed at complete by this
// instance's clock. A commit completed before the agent learned of it; so one whose order is not
// before the moment the agent learned of it, by this clock, shows this clock behind the one that
// wrote it (set back, or not yet synchronized after boot) by at least the difference. A version
// completed after that moment is ordered as if this clock were ahead by the most any commit learned
// before it shows, and 1 ms (and known is the commit that shows it, behind true): after every
// commit learned before it, in the order the versions completed in. Taken as it stands, complete
// would order the version before an older commit: LATEST would stay there, restore would take the
// older commit, and retention would delete the newer ones first.
func afterKnown(known []knownOrder, complete time.Time) (at time.Time, by knownOrder, behind bool) {
	most := time.Duration(-1)
	for _, k := range known { // ascending in at
		if !complete.After(k.at) {
			break
		}
		if d := k.order.At.Sub(k.at); d > most {
			most, by = d, k
		}
	}
	// A commit of this instance's, moved after a clock ahead: a version completed after it by
	// this clock (here) is after it, though completed before the agent learned of it (a save
	// the trainer made while the agent was down).
	for _, k := range known {
		if d := k.order.At.Sub(k.here); !k.here.IsZero() && d > 0 && complete.After(k.here) && d > most {
			most, by = d, k
		}
	}
	if most < 0 {
		return complete, knownOrder{}, false
	}
	return complete.Add(most + time.Millisecond), by, true
}

// localPath is the file's path relative to Dir.
func (g *generation) localPath(rel string) string {
	if g.single {
		return g.name
	}
	return filepath.Join(g.name, filepath.FromSlash(rel))
}

// goHash checksums one file of a matching generation.
func (u *Uploader) goHash(ctx context.Context, g *generation, rel string, f *fileState) {
	local := g.localPath(rel)
	gctx := g.ctx
	u.wg.Go(func() {
		start := time.Now()
		d, err := hashFile(gctx, u.cfg.Dir, local)
		u.send(ctx, fileResult{gen: g, rel: rel, file: f, kind: jobHash, done: d, start: start, duration: time.Since(start), err: err})
	})
}

// goUpload sends one file to g's commit.
func (u *Uploader) goUpload(ctx context.Context, g *generation, rel string, f *fileState) {
	local := g.localPath(rel)
	key := DataKey(u.cfg.Job, g.name, g.commit, rel)
	f.key = key
	gf := u.takeGrowing(g, rel)
	gctx := withRank(g.ctx, g.seq) // a newer checkpoint's parts go first
	if u.urgent() && u.inflight == 1 && u.queuedFiles() == 0 && (g.sent > 0 || g.single) {
		// A notice waits for this file, it is all there is to send, and a file of its
		// checkpoint is stored already (the trainer's next file, closed just now; the last
		// one is what the commit waits for) or it is the whole checkpoint: in finer parts, so
		// that they all run at once and end sooner. With more to send, the requests in flight
		// are full anyway, and finer parts would only add requests. Nor the first file of a
		// directory checkpoint: when a whole checkpoint appears at once (renamed into place),
		// its first file is alone only until the others are seen, and its finer parts made
		// more requests than may run at once, so the last ones ran after the rest (1 GiB
		// through the model of S3: a median of 80 % of the allowed rate over 7 runs, against
		// 88 % with the usual parts).
		gctx = withUrgency(gctx)
	}
	// A file that became a directory of the same name (or the other way round) before the
	// commit: the stored object of what left is in the way of the new key (a file store, and S3
	// servers that store objects as files, refuse both), and went only just before the manifest,
	// so the commit never came. It goes first.
	var inWay []string
	for _, k := range g.strays {
		if strings.HasPrefix(key, k+"/") || strings.HasPrefix(k, key+"/") {
			inWay = append(inWay, k)
		}
	}
	u.wg.Go(func() {
		start := time.Now()
		if gf != nil {
			start = gf.began
		}
		var d doneFile
		var err error
		if len(inWay) > 0 {
			if err = u.cfg.Store.Delete(gctx, inWay...); err != nil {
				err = fmt.Errorf("delete %s, in the way of %s: %w", strings.Join(inWay, ", "), key, err)
			}
		}
		if err == nil {
			d, err = uploadFile(gctx, u.cfg.Store, u.cfg.Dir, local, key, gf)
		}
		u.send(ctx, fileResult{gen: g, rel: rel, file: f, kind: jobUpload, done: d, start: start, duration: time.Since(start), err: err})
	})
}

func (u *Uploader) send(ctx context.Context, r fileResult) {
	select {
	case u.results <- r:
	case <-ctx.Done():
	}
}

// errUnusable marks a file that must not be uploaded (a hard link, or not a regular file) or
// cannot be (its key is longer than the store accepts).
var errUnusable = errors.New("not uploaded")

// errKeyTooLong is a store's error for a key longer than it accepts (S3: 1024 bytes, the store's
// prefix included).
var errKeyTooLong = errors.New("key too long for the store")

// errChangedWhileSending is returned when a file changed while it was being read.
var errChangedWhileSending = errors.New("file changed while it was being read")

// openLocal opens the regular file rel below dir through an os.Root, so nothing outside dir is
// ever read even if the trainer swaps a directory for a symlink. It refuses a symlink as the file
// itself, anything that is not a regular file, and what the owner of dir could not read (a
// directory on the way it could not search, a file it could not read, a file with more than one
// hard link that it does not own: scanOwner.check), as judged on what was opened, directory by
// directory: the agent may read what the trainer could not, and the scan's judgement is of what
// was there then (found from outside: a trainer that swapped its file with another user's 0600
// one got that file's bytes into the store, 4 of 14). It returns the file's FileID. A file the
// agent may not open (permission denied) is errUnusable too.
func openLocal(dir, rel string) (*os.File, FileID, error) {
	local := filepath.Join(dir, rel)
	root, err := os.OpenRoot(dir)
	if err != nil {
		return nil, FileID{}, fmt.Errorf("open %s: %w", dir, err)
	}
	defer func() { root.Close() }()
	ds, err := root.Stat(".")
	if err != nil {
		return nil, FileID{}, fmt.Errorf("stat %s: %w", dir, err)
	}
	owner := scanOwnerOfPath(dir, ds)
	// Each directory on the way is opened, and judged, as itself.
	name := rel
	for {
		i := strings.IndexByte(name, filepath.Separator)
		if i < 0 {
			break
		}
		sub, err := root.OpenRoot(name[:i])
		if err != nil {
			return nil, FileID{}, openLocalErr(root, name[:i], local, err)
		}
		// OpenRoot follows a symbolic link that stays inside root: make sure it opened the
		// very directory that is there under the name.
		li, lerr := root.Lstat(name[:i])
		fi, err := sub.Stat(".")
		root.Close()
		root, name = sub, name[i+1:]
		if err != nil {
			return nil, FileID{}, fmt.Errorf("stat %s: %w", local, err)
		}
		if lerr != nil || !li.IsDir() || !os.SameFile(li, fi) {
			return nil, FileID{}, fmt.Errorf("open %s: a directory on its path was replaced: %w", local, errChangedWhileSending)
		}
		if !owner.canSearch(fi) {
			return nil, FileID{}, fmt.Errorf("%s: a directory on its path: %w: %w", local, errScanUnreadable, errUnusable)
		}
	}
	f, err := root.OpenFile(name, os.O_RDONLY|syscall.O_NOFOLLOW|syscall.O_NONBLOCK, 0)
	if err != nil {
		return nil, FileID{}, openLocalErr(root, name, local, err)
	}
	fi, err := f.Stat()
	if err != nil {
		f.Close()
		return nil, FileID{}, fmt.Errorf("stat %s: %w", local, err)
	}
	id := FileIDOf(fi)
	if !fi.Mode().IsRegular() {
		f.Close()
		return nil, FileID{}, fmt.Errorf("%s is not a regular file: %w", local, errUnusable)
	}
	if err := owner.check(fi); err != nil {
		f.Close()
		if errors.Is(err, errScanHardLink) {
			return nil, FileID{}, fmt.Errorf("%s has %d hard links and is not the owner's of %s: %w", local, id.Nlink, dir, errUnusable)
		}
		return nil, FileID{}, fmt.Errorf("%s: %w: %w", local, err, errUnusable)
	}
	return f, id, nil
}

// openLocalErr is the error of openLocal when name below root, on the way to local, could not
// be opened.
func openLocalErr(root *os.Root, name, local string, err error) error {
	if errors.Is(err, fs.ErrPermission) {
		// The agent's own rights, not the store's: no retry helps until the file changes.
		return fmt.Errorf("open %s: %w: %w", local, ErrAgentDenied, errUnusable)
	}
	if li, lerr := root.Lstat(name); lerr == nil && !li.Mode().IsRegular() && !li.IsDir() || lerr != nil && !errors.Is(lerr, fs.ErrNotExist) {
		// A symbolic link in its place, or on its path, now: the trainer's doing, not the
		// store failing (found from outside: it was said to be, with the store's fix).
		return fmt.Errorf("open %s: %w: %w", local, err, errChangedWhileSending)
	}
	return fmt.Errorf("open %s: %w", local, err)
}

// readDone finishes a read of f that began at readAt as version before: it fails if the file is no
// longer that version.
func readDone(f *os.File, before FileID, readAt time.Time, sum Checksum) (doneFile, error) {
	fi, err := f.Stat()
	if err != nil {
		return doneFile{}, fmt.Errorf("stat %s: %w", f.Name(), err)
	}
	if !FileIDOf(fi).Same(before) {
		return doneFile{}, fmt.Errorf("%s: %w", f.Name(), errChangedWhileSending)
	}
	return doneFile{id: before, checksum: sum, readAt: readAt}, nil
}

// uploadFile sends the file rel below dir to key (see openLocal) and fails if the file changed
// while it was being sent. gf, if not nil, is the file's transfer begun while it was written: it
// is finished if the file is still the one it began with, and aborted otherwise.
func uploadFile(ctx context.Context, s Store, dir, rel, key string, gf *growingFile) (doneFile, error) {
	f, before, err := openLocal(dir, rel)
	if err != nil {
		if gf != nil {
			gf.t.Abort()
		}
		return doneFile{}, err
	}
	defer f.Close()
	readAt := time.Now()
	var sum Checksum
	grown, kept := false, int64(0)
	switch {
	case gf != nil && gf.id.Dev == before.Dev && gf.id.Ino == before.Ino && before.Ino != 0:
		sum, err = gf.t.Finish(ctx, f, before.Size, nil)
		grown, kept = true, gf.t.Kept()
	case gf != nil:
		gf.t.Abort()
		fallthrough
	default:
		sum, err = s.PutFile(ctx, key, f, before.Size, nil)
	}
	if errors.Is(err, errKeyTooLong) {
		// No retry makes it fit: the path is too deep or too long for the store.
		return doneFile{}, fmt.Errorf("upload %s: %w (shorten the path, the prefix of store.url or store.job): %w", filepath.Join(dir, rel), err, errUnusable)
	}
	if err != nil {
		if ctx.Err() == nil {
			if _, cerr := readDone(f, before, readAt, sum); errors.Is(cerr, errChangedWhileSending) {
				// The file changed under the send (truncated, rewritten in place): that is
				// why it failed, not the store (the store's fix was given for it, and it was
				// counted an upload error; found from outside).
				return doneFile{}, cerr
			}
		}
		return doneFile{}, fmt.Errorf("upload %s: %w", filepath.Join(dir, rel), err)
	}
	d, err := readDone(f, before, readAt, sum)
	d.key, d.grown, d.kept = key, grown, kept
	return d, err
}

// hashFile checksums the file rel below dir (see openLocal) and fails if it changed meanwhile.
func hashFile(ctx context.Context, dir, rel string) (doneFile, error) {
	f, before, err := openLocal(dir, rel)
	if err != nil {
		return doneFile{}, err
	}
	defer f.Close()
	readAt := time.Now()
	sum, err := ChecksumOf(&fileCtxReader{ctx: ctx, r: f})
	if err != nil {
		return doneFile{}, fmt.Errorf("read %s: %w", filepath.Join(dir, rel), err)
	}
	return readDone(f, before, readAt, sum)
}

// FileTimeLag is how far a file's times may lag the clock on file systems with fine timestamps:
// the kernel's clock for them ticks that coarsely at worst. A file written right after a moment
// may seem to have been written that much before it.
const FileTimeLag = 10 * time.Millisecond

// racy reports whether a change to a file right after it was read from readAt could leave its
// FileID as it was: its ctime is within the file system's timestamp granularity of the read
// (10 ms on file systems with fine timestamps, whose kernel clock ticks that coarsely at worst;
// 2 s where ctime has no sub-second part, as on Lustre or ext3). Such a file is read again at
// commit and compared by checksum.
func racy(id FileID, readAt time.Time) bool {
	g := FileTimeLag
	if id.ChangeTime.Nanosecond() == 0 {
		g = 2 * time.Second
	}
	return id.ChangeTime.After(readAt.Add(-g))
}

func (u *Uploader) handleResult(ctx context.Context, r fileResult) {
	g, f := r.gen, r.file
	f.inflight = false
	g.inflight--
	u.inflight--
	u.markDirty(g)
	if u.gens[g.name] != g || g.files[r.rel] != f || g.state == genCommitted || g.state == genAbandoned {
		return // forgotten meanwhile
	}
	again := f.again
	f.again = false
	log := u.log.With().Str("checkpoint", g.name).Str("file", r.rel).Logger()
	if r.kind == jobHash && g.state != genMatching {
		u.enqueue(g, r.rel, f) // it became an upload meanwhile
		return
	}
	if r.err != nil {
		switch {
		case ctx.Err() != nil:
			return
		case errors.Is(r.err, fs.ErrNotExist):
			log.Info().Msg("file vanished before it was read; no longer part of the checkpoint unless it comes back")
			u.fileVanished(g, r.rel, f)
			return
		case errors.Is(r.err, errUnusable):
			log.Error().Err(r.err).Str("fix", notStorableFixFor(r.err)).
				Msg("file cannot be stored: its checkpoint is not committed while the file is there as it is")
			if g.refused == nil {
				g.refused = map[string]refusal{}
			}
			g.refused[r.rel] = refusal{id: f.id, err: r.err} // the commit's scan finds it again
			if errors.Is(r.err, errKeyTooLong) {
				f.key = "" // nothing can be stored there: not a stray to delete
			}
			u.dropFile(g, r.rel, f)
			return
		}
		f.attempts++
		delay := u.retryDelay(g.name+"/"+r.rel, f.attempts, u.urgent())
		if errors.Is(r.err, errChangedWhileSending) {
			// Still being written (a marker read between its creation and its write, a file
			// written again): the trainer's doing, not a failure of the store's.
			log.Debug().Err(r.err).Int("attempt", f.attempts).Float64("retry_in_s", logSeconds(delay)).Msg("file changed while it was read; reading it again")
		} else {
			// The agent counts these by reason and logs them once per interval (OnEvent).
			log.Debug().Err(r.err).Int("attempt", f.attempts).Float64("retry_in_s", logSeconds(delay)).Msg("upload failed; retrying")
			u.emit(UploadEvent{Kind: UploadFailed, Checkpoint: g.name, At: time.Now(), Err: r.err})
			if g.failingSince.IsZero() {
				g.failingSince = time.Now()
			}
		}
		g.retrying++
		u.after(ctx, delay, func() {
			g.retrying--
			u.markDirty(g)
			if u.gens[g.name] == g && g.files[r.rel] == f {
				u.enqueue(g, r.rel, f)
			}
		})
		return
	}
	f.attempts = 0
	g.failingSince = time.Time{}
	d := r.done
	f.done = &d
	if again && !d.id.Same(f.id) {
		u.enqueue(g, r.rel, f) // it changed after the read began: send the new version
	} else {
		// The read's view is the newest: an older event (a marker caught mid-write) is
		// superseded, and one that reported the version just read again (a single file's
		// Complete after its FileReady) asks for nothing. A version written after the marker
		// (its event still to come) is a save into the directory again.
		if u.rewrittenAfterMarker(g, r.rel, f.id, d.id) && u.markerStill(g) {
			u.reopen(g, r.rel)
		}
		f.id = d.id
	}
	if r.kind == jobHash {
		u.matched(g, r.rel, f)
		return
	}
	if g.uploadStart.IsZero() || r.start.Before(g.uploadStart) {
		g.uploadStart = r.start
	}
	if end := r.start.Add(r.duration); end.After(g.uploadEnd) {
		g.uploadEnd = end
	}
	g.uploadBusy += r.duration
	g.sent += d.id.Size
	u.journal.file(g.name, g.commit, r.rel, d)
	log.Debug().Int64("bytes", d.id.Size).Float64("took_s", logSeconds(r.duration)).Bool("sent_while_written", d.grown).
		Int64("bytes_sent_while_written", d.kept).Msg("file stored")
}

// matched narrows a matching generation's candidates by the checksum of rel; with none left, the
// checkpoint holds bytes the store does not, and it is committed anew.
func (u *Uploader) matched(g *generation, rel string, f *fileState) {
	committed := slices.ContainsFunc(g.candidates, func(m *Manifest) bool { return m.Part == nil })
	g.candidates = slices.DeleteFunc(g.candidates, func(m *Manifest) bool {
		mf, ok := m.file(rel)
		return !ok || mf.Size != f.done.id.Size || mf.Checksum != f.done.checksum
	})
	switch {
	case len(g.candidates) > 0:
	case committed:
		if rel != u.cfg.Marker && g.holdsMarker() && g.stale.isZero() && !g.committedMarker.isZero() && g.marker.Same(g.committedMarker) && u.markerStill(g) {
			// Other bytes under the very marker its commit was complete with: written after it,
			// whatever the file's times say (found from outside: a file rewritten in place, its
			// modification time put back, was committed anew with the old marker, a torn
			// checkpoint restored as the newest). Sent, and committed once the marker is
			// written again: not "committing these as a new commit" now (found from outside,
			// 9 ms after the line that says it is not complete).
			u.reopen(g, rel)
			u.sendAll(g)
			return
		}
		u.toUploading(g, "file "+rel+" differs from every commit of this checkpoint in the store")
	default:
		u.sendAll(g) // this node's parts of the name were of other saves: no commit of it differs
	}
}

// toUploading turns a matching generation into an uploading one: every file is sent to a new
// commit. This is a name committed before with other bytes (a rollback, a resumed run saving a
// step again, a new run reusing the job), so it is logged.
func (u *Uploader) toUploading(g *generation, why string) {
	u.logNewCommitOfName(g.name, why)
	u.sendAll(g)
}

// logNewCommitOfName says that checkpoint name, committed before with other bytes, gets a new
// commit (never silent, I6).
func (u *Uploader) logNewCommitOfName(name, why string) {
	u.log.Warn().Str("checkpoint", name).Str("why", why).
		Msg("checkpoint name already committed with other bytes; committing these as a new commit (the earlier commits stay)")
}

// sendAll makes g uploading: every file goes to its commit (what was only checksummed is sent).
func (u *Uploader) sendAll(g *generation) {
	g.state, g.candidates = genUploading, nil
	for _, rel := range g.paths() {
		if f := g.files[rel]; f.done == nil || f.done.key == "" {
			f.done = nil
			u.enqueue(g, rel, f)
		}
	}
	u.requeue(g)
	u.markDirty(g)
}

// retryDelay is the wait before retry attempt of what (a name for it): 250 ms doubling, capped
// at 2 s during a notice and 30 s otherwise, drawn between half and all of it.
func (u *Uploader) retryDelay(what string, attempt int, urgent bool) time.Duration {
	capd := 30 * time.Second
	if urgent {
		capd = 2 * time.Second
	}
	d := 250 * time.Millisecond << min(max(attempt, 1)-1, 10)
	d = min(d, capd)
	if u.cfg.seed == 0 {
		return d/2 + rand.N(d/2+1)
	}
	return d/2 + time.Duration(seeded(u.cfg.seed, fmt.Sprint("retry ", what, " ", attempt)).Int64N(int64(d/2+1)))
}

// newCommitID is NewCommitID for g, its random bits seeded (by g's name and sequence number)
// when cfg.seed is set.
func (u *Uploader) newCommitID(g *generation, now time.Time) string {
	if u.cfg.seed == 0 {
		return NewCommitID(now)
	}
	return commitIDAt(now, seeded(u.cfg.seed, fmt.Sprint("commit ", g.name, " ", g.seq)).Uint64())
}

// seeded returns a generator seeded by seed and the name of what draws from it.
func seeded(seed uint64, name string) *rand.Rand {
	h := fnv.New64a()
	h.Write([]byte(name))
	return rand.New(rand.NewPCG(seed, h.Sum64()))
}

// after runs fn on the Run loop once d has passed, unless ctx ends first.
func (u *Uploader) after(ctx context.Context, d time.Duration, fn func()) {
	u.wg.Go(func() {
		t := time.NewTimer(d)
		defer t.Stop()
		select {
		case <-t.C:
		case <-ctx.Done():
			return
		}
		select {
		case u.wake <- fn:
		case <-ctx.Done():
		}
	})
}

// startCommit checks g once more and commits (or adopts) it, on a goroutine; g takes no more
// work until the result is in (events for it wait in deferred).
func (u *Uploader) startCommit(ctx context.Context, g *generation) {
	c := commitJob{name: g.name, commit: g.commit, single: g.single, adopt: g.state == genMatching, resumed: g.resumed, sealed: g.sealed,
		completeAt: g.completeAt, unread: g.unread, marker: g.marker, known: u.knownNow(),
		files: make(map[string]doneFile, len(g.files)), refused: maps.Clone(g.refused), vanished: maps.Clone(g.vanished), prior: g.prior, candidates: g.candidates, strays: g.strays,
		retired: u.retiredOf(g.name),
		timings: Timings{UploadSeconds: g.uploadEnd.Sub(g.uploadStart).Seconds()}}
	c.unseenBefore, c.unseenAfter = u.unseen(g.name)
	// Retention reads the whole job: after every commit of a backlog (a restart that finds a
	// thousand checkpoints, a trainer saving faster than the store takes them) it held each
	// commit for seconds, and a notice's checkpoint waited behind them past its deadline (found
	// from outside). It runs after the last commit of a run of them (none other complete and not
	// committed; at least every retentionEvery commits), and not during a notice: it only
	// deletes, and can wait.
	if u.cfg.Keep > 0 {
		// (One still matching is most likely committed already, and adopted without a commit
		// of its own, so without a retention after it: not counted.)
		more := false
		for _, o := range u.gens {
			if o != g && o.complete && !o.withheld && o.state == genUploading {
				more = true
				break
			}
		}
		if !more && !u.urgent() || u.retentionSkipped >= retentionEvery {
			c.retain, u.retentionSkipped = true, 0
		} else {
			u.retentionSkipped++
		}
	}
	now := time.Now()
	maps.DeleteFunc(u.uncertain, func(_ string, at time.Time) bool { return now.Sub(at) > uncertainFor })
	for id := range u.uncertain {
		if c.uncertain == nil {
			c.uncertain = map[string]bool{}
		}
		c.uncertain[id] = true
	}
	var missing []string
	for rel, f := range g.files {
		if f.done == nil { // never so when ready; checked here once rather than at every event
			missing = append(missing, rel)
			continue
		}
		c.files[rel] = *f.done
	}
	slices.Sort(missing)
	for _, rel := range missing {
		u.enqueue(g, rel, g.files[rel])
	}
	if g.queuedN > 0 {
		return
	}
	// A file that grew and never became ready is not part of it: nothing of it may land once
	// the manifest is written.
	u.stopAllGrowing(g)
	if !g.firstFileAt.IsZero() {
		t := g.firstFileAt
		c.timings.FirstFileAt = &t
	}
	c.trigger = "periodic"
	if g.notice != "" {
		c.trigger, c.notice = "notice", g.notice
	}
	if !c.adopt && !g.sealed {
		// Written out before the manifest PUT can be sent: a request of a killed run can land
		// after the restart, which must then neither write into this commit nor delete it.
		u.journal.add(journalLine{Op: journalSeal, Checkpoint: g.name, Commit: g.commit})
		u.flushJournal()
	}
	g.committing = true
	u.committing = g
	u.wg.Go(func() {
		r := u.commit(ctx, c)
		r.gen = g
		select {
		case u.commits <- r:
		case <-ctx.Done():
		}
	})
}

func (u *Uploader) handleCommit(ctx context.Context, r commitResult) {
	g := r.gen
	g.committing = false
	u.committing = nil
	u.markDirty(g)
	if r.late != nil {
		u.startLate(ctx, *r.late)
	}
	u.retentionDone(ctx, r.retentionFailed, r.watch)
	if r.attempted && r.err != nil {
		u.uncertain[g.commit] = time.Now()
	}
	u.retired = append(u.retired, r.retired...)
	if len(u.retired) > retiredManifests {
		u.retired = slices.Delete(u.retired, 0, len(u.retired)-retiredManifests)
	}
	for _, d := range r.deleted {
		u.index[d.Checkpoint] = slices.DeleteFunc(u.index[d.Checkpoint], func(m *Manifest) bool { return m.Commit == d.Commit })
		if len(u.index[d.Checkpoint]) == 0 {
			delete(u.index, d.Checkpoint)
		}
	}
	lc := u.log.With().Str("checkpoint", g.name)
	if g.commit != "" { // none yet: bytes of a commit in the store, being adopted
		lc = lc.Str("commit", g.commit)
	}
	log := lc.Logger()
	if r.attempted {
		g.sealed = true
	}
	switch {
	case len(r.changed) > 0 || len(r.gone) > 0:
		if g.sealed {
			g = u.replaceSealed(g)
		}
		for _, p := range r.gone {
			if f := g.files[p]; f != nil {
				u.fileVanished(g, p, f)
			}
		}
		for _, lf := range r.changed {
			f := g.files[lf.Path]
			if f == nil {
				f = &fileState{}
				g.files[lf.Path] = f
			} else if f.done != nil {
				// An upload goes over the earlier one, in the same uncommitted commit.
				log.Warn().Str("file", lf.Path).Msg("file changed after it was read; reading it again before committing")
			}
			f.id, f.done = lf.ID, nil
			u.enqueue(g, lf.Path, f)
		}
		for _, p := range g.paths() {
			if f := g.files[p]; f.done == nil {
				u.enqueue(g, p, f)
			}
		}
		if r.rewritten != "" && g.complete && g.marker.Same(r.gen.marker) {
			u.reopen(g, r.rewritten)
		}
		u.markDirty(g)
	case errors.Is(r.notComplete, ErrNotStorable):
		msg := "checkpoint not committed: a file of it cannot be stored; committed once that file is fixed"
		if errors.Is(r.notComplete, errKeyTooLong) {
			msg = "checkpoint not committed: a file of it cannot be stored; waiting for its marker to be written again"
		}
		log.Error().Err(r.notComplete).Msg(msg)
		if !g.withheld {
			g.withheldAt = time.Now()
		}
		if rel, ok := refusedPath(r.notComplete); ok {
			// Whatever comes at that path next (the file itself in a link's place) is its fix,
			// not a file new since the marker (found at times by its test: the checkpoint waited
			// for its marker instead of being committed as it is).
			if g.refused == nil {
				g.refused = map[string]refusal{}
			}
			if _, ok := g.refused[rel]; !ok {
				g.refused[rel] = refusal{err: r.notComplete}
			}
		}
		g.complete, g.withheld, g.recheck, g.heldBack = false, true, !g.single && !g.marker.isZero(), true
		u.emit(UploadEvent{Kind: CheckpointWithheld, Checkpoint: g.name, At: g.completeSeen, Err: r.notComplete})
	case r.notComplete != nil:
		log.Warn().Err(r.notComplete).Msg("checkpoint is no longer complete on disk; waiting for its marker")
		g.complete = false
	case r.noMatch && r.completeAt != nil && r.retiredMatch != nil && u.retentionWouldDelete(*r.completeAt):
		// Retention deleted its commit, and has kept checkpoint.keep newer ones since: sent
		// again, it would be deleted at once, after the whole checkpoint went up (found from
		// outside: restores of an older commit into checkpoint.dir sent 128 MiB again each
		// time, and during a notice, when retention is off, such a copy competes with the
		// notice's checkpoint). It is that commit's, deleted: as a generation whose commit
		// retention deleted, it is not sent again.
		m := r.retiredMatch
		g.state, g.commit, g.manifest = genCommitted, m.Commit, m
		// As an adopted commit's, so that a restart knows it too (its place, older than what
		// the store holds, is not sent again).
		u.journal.add(journalLine{Op: journalAdopt, Checkpoint: g.name, Commit: g.commit})
		for p, f := range g.files {
			if f.done != nil {
				u.journal.file(g.name, g.commit, p, *f.done)
			}
		}
		u.journal.add(journalLine{Op: journalDone, Checkpoint: g.name, Commit: g.commit, At: u.placeOf(m)})
		log.Warn().Str("deleted_commit", m.Commit).Int("keep", u.cfg.Keep).
			Msg("checkpoint is a copy of a commit retention deleted, older than the checkpoints it keeps; not sent again")
	case r.noMatch && r.completeAt != nil:
		ev := log.Warn()
		if n := len(r.deleted); n > 0 {
			ev = ev.Str("deleted_commit", r.deleted[n-1].Commit)
		}
		ev.Msg(msgCommittedAgainInPlace)
		g.completeAt = r.completeAt
		u.sendAll(g)
	case r.noMatch && r.deletedAfter != "":
		// The save its commit was, with a file deleted since: its marker vouches for files no
		// longer there (found from outside: after a reboot, which loses the journal, a re-save
		// or rotation cut short was committed torn, and LATEST moved to it).
		u.reopenSaying(g, r.deletedAfter, msgDeletedAfterMarker)
		u.log.Info().Str("checkpoint", g.name).Str("commit", r.deletedFrom).
			Msg("the checkpoint on disk is that commit's save with a file deleted since; the commit stays, and this is not committed until the marker is written again")
		u.markDirty(g)
	case r.noMatch:
		u.toUploading(g, "its files differ from every commit of this checkpoint in the store")
	case r.err != nil:
		g.failures++
		// The agent logs it, once per interval and cause (OnEvent).
		log.Debug().Err(r.err).Int("failures", g.failures).Msg("commit failed")
		u.emit(UploadEvent{Kind: CheckpointFailed, Checkpoint: g.name, At: time.Now(), Err: r.err})
		g.commitWait = true
		u.after(ctx, u.retryDelay("commit "+g.name, g.failures, u.urgent()), func() {
			g.commitWait = false
			u.markDirty(g)
		})
	case r.adopted:
		own := g.commit
		g.state, g.commit, g.manifest = genCommitted, r.manifest.Commit, r.manifest
		u.learnOwn(g, r.manifest.Order())
		if own != "" && own != g.commit {
			// Sent without knowing the store had these bytes: the copy goes.
			u.cleanupCommit(ctx, g.name, own, "the store has these bytes committed already")
		}
		u.journal.add(journalLine{Op: journalAdopt, Checkpoint: g.name, Commit: g.commit})
		for p, f := range g.files {
			u.journal.file(g.name, g.commit, p, *f.done)
		}
		u.journal.add(journalLine{Op: journalDone, Checkpoint: g.name, Commit: g.commit, At: u.placeOf(r.manifest)})
		u.log.Info().Str("checkpoint", g.name).Str("commit", g.commit).Msg("checkpoint already committed with these bytes; nothing sent")
		u.emit(UploadEvent{Kind: CheckpointCommitted, Checkpoint: g.name, At: time.Now(), Manifest: r.manifest, Already: true})
		if r.manifest.Part != nil {
			// This node's part, sent before (the journal lost): its save is completed as any.
			u.trackSave(ctx, r.manifest)
		}
	default:
		m := r.manifest
		g.state, g.manifest = genCommitted, m
		u.learnOwn(g, m.Order())
		if r.latestNewer != nil {
			u.learnStored(*r.latestNewer)
		}
		if m.Part == nil {
			u.index[g.name] = append([]*Manifest{m}, u.index[g.name]...)
			u.forgetGone()
		}
		u.journal.add(journalLine{Op: journalDone, Checkpoint: g.name, Commit: g.commit, At: u.placeOf(m)})
		u.sayVanished(g, m)
		ev := UploadEvent{Kind: CheckpointCommitted, Checkpoint: g.name, At: time.Now(), Manifest: m}
		if s := u.lastSignal; !s.IsZero() && !u.lastSignalPosted && u.answeredBy == g.name && !g.firstFileAt.Before(s) && g.firstFileAt.Sub(s) < reachMax {
			// A save begun after the trainer was signalled: how long it took to begin. The first
			// one after the signal is its answer; one the trainer made later on its own (a
			// periodic save minutes after) is not. A job notice's post is no signal (found from
			// outside: the wait for the trainer's next periodic save after `spotguard notify` was
			// counted as its answer to one).
			if d := g.firstFileAt.Sub(s); !u.reachOf.Equal(s) || d < u.reach {
				u.reach, u.reachOf = d, s
			}
		}
		ev.Throughput, ev.Forecast = forecast(g, m)
		reached := false
		if ev.Forecast > 0 && u.reach > 0 {
			ev.Forecast += u.reach
			reached = true
		}
		for _, mf := range m.Files {
			if f := g.files[mf.Path]; f != nil && f.done != nil && f.done.checksum == mf.Checksum {
				ev.SentWhileWritten += f.done.kept
			}
		}
		ev2 := log.Info()
		if ev.Forecast > ForecastWarn && !g.heldBack {
			// Said why (found from outside: a warning with no reason in it). (A checkpoint held
			// back has no forecast: its times hold the wait.)
			ev2 = log.Warn().Str("why", fmt.Sprintf("a checkpoint like this one, saved at a notice, would be durable %s after it, past the %s a 2-minute Spot notice leaves once it is read and the trainer reacts",
				ev.Forecast.Round(time.Second), ForecastWarn)).
				Str("fix", "save less on a notice (model and optimizer state), or save periodically more often so a notice finds most of it in the store")
		}
		if ev.SentWhileWritten > 0 {
			ev2 = ev2.Int64("bytes_sent_while_written", ev.SentWhileWritten)
		}
		if reached {
			ev2 = ev2.Float64("signal_to_first_file_s", logSeconds(u.reach)) // part of the forecast
		}
		ev2 = ev2.Int("files", len(m.Files)).Int64("bytes", m.TotalBytes).Bool("latest", r.latestMoved).
			Float64("throughput_mb_per_s", ev.Throughput/1e6).Str("trigger", m.Trigger)
		if m.Notice != "" {
			ev2 = ev2.Str("notice", m.Notice)
		}
		if m.Part != nil {
			ev2 = ev2.Int("node_rank", m.Part.NodeRank).Int("world_nodes", m.Part.WorldNodes)
		}
		// Fixed text, the numbers in fields (found from outside: the forecast in the text made
		// five messages of one event, which a log pipeline could not select).
		if g.heldBack {
			ev2 = ev2.Str("forecast", "none: withheld until then, its times hold that wait")
		} else {
			ev2 = ev2.Float64("durable_after_notice_forecast_s", logSeconds(ev.Forecast))
		}
		ev2.Msg(what(m) + " committed")
		u.emit(ev)
		if m.Part != nil {
			u.trackSave(ctx, m)
		} else {
			u.checkSplit(ctx, m)
			switch {
			case r.latestErr != nil && ctx.Err() != nil:
				// Stopping: the next start repairs LATEST (repairLatest).
			case r.latestErr != nil:
				u.latestFailed(ctx, m, r.latestErr)
			default:
				u.latestMovedTo(m)
			}
		}
	}
	deferred := g.deferred
	g.deferred = nil
	for _, ev := range deferred {
		u.handleWatch(ctx, ev)
	}
}

// latestFailed takes a failure to move LATEST to m, a commit of this agent's: said (at once, then
// once a minute while it fails alike), reported (LatestFailed), and tried again after a delay,
// with the newest commit that lags LATEST.
func (u *Uploader) latestFailed(ctx context.Context, m *Manifest, err error) {
	l := &u.latest
	if l.lag == nil || !l.lag.Order().After(m.Order()) {
		l.lag = m
	}
	l.failures++
	if msg := err.Error(); msg != l.lastErr || time.Since(l.logged) >= time.Minute {
		u.log.Error().Err(err).Str("checkpoint", l.lag.Checkpoint).Str("commit", l.lag.Commit).Int("failures", l.failures).
			Int("repeats_not_logged", l.held).
			Msg("checkpoint committed but LATEST cannot be moved to it; retrying (restore takes it anyway: it is the newest commit)")
		l.lastErr, l.logged, l.held = msg, time.Now(), 0
	} else {
		l.held++
	}
	u.emit(UploadEvent{Kind: LatestFailed, Checkpoint: m.Checkpoint, At: time.Now(), Manifest: m, Err: err})
	u.retryLatest(ctx)
}

// retryLatest tries, after a delay and on a goroutine, to move LATEST to the newest commit that
// lags it; latestFailed or latestMovedTo takes the result.
func (u *Uploader) retryLatest(ctx context.Context) {
	l := &u.latest
	if l.retrying || l.lag == nil {
		return
	}
	l.retrying = true
	// At most latestRetryMax apart, so that a LATEST that keeps failing is one run of failures
	// to the agent's health, which a pause of 30 s ends.
	u.after(ctx, min(u.retryDelay("LATEST", l.failures, u.urgent()), latestRetryMax), func() {
		m := l.lag
		if m == nil {
			l.retrying = false
			return
		}
		u.wg.Go(func() {
			_, newer, err := advanceLatestOrder(ctx, u.cfg.Store, m, m.Host, u.cache)
			select {
			case u.wake <- func() {
				l.retrying = false
				switch {
				case err != nil && ctx.Err() != nil:
				case err != nil:
					u.latestFailed(ctx, m, err)
				default:
					if newer != nil {
						u.learnStored(*newer)
					}
					u.latestMovedTo(m)
					u.retryLatest(ctx) // a newer one that lags still
				}
			}:
			case <-ctx.Done():
			}
		})
	})
}

// latestMovedTo takes LATEST moved to m (or found naming a newer commit): the commits that
// lagged it up to m no longer do; said, and reported (LatestMoved), when one did.
func (u *Uploader) latestMovedTo(m *Manifest) {
	l := &u.latest
	if l.lag == nil || l.lag.Order().After(m.Order()) {
		return
	}
	u.log.Info().Str("checkpoint", m.Checkpoint).Str("commit", m.Commit).Int("failures", l.failures).Msg("LATEST moved, after failing")
	u.emit(UploadEvent{Kind: LatestMoved, Checkpoint: m.Checkpoint, At: time.Now(), Manifest: m})
	*l = latestLag{retrying: l.retrying}
}

// latestRetryMax is the longest wait between two tries to move LATEST (retryLatest).
const latestRetryMax = 10 * time.Second

// latestLag is what the uploader knows of a LATEST it could not move.
type latestLag struct {
	// lag is the newest commit of this agent's that LATEST could not be moved to; nil when none.
	lag *Manifest
	// failures counts the failures since LATEST last moved; held, those not logged.
	failures, held int
	lastErr        string
	logged         time.Time
	// retrying: a retry is scheduled or in flight.
	retrying bool
}

// checkSplit looks, on a goroutine, whether m, a single-node commit this agent just made, or the
// one it made before m is one piece of a save committed in pieces by several instances
// (splitWith: the nodes of a multi-node job each at store.world_nodes 1); splitChecked takes the
// result. Each reads its name's commits from the store: a delimiter listing, and the manifests
// not read before. The commit before m is looked at again because another node's piece of it
// may have landed after it was first looked at: so every commit is judged, with the others'
// pieces in, by the next commit at the latest. A store that fails leaves it to the next commit.
// A stop does not cut the reads short (a request dropped half way is a failure to the store's
// side), but they end within splitCheckFor.
func (u *Uploader) checkSplit(ctx context.Context, m *Manifest) {
	prev := u.lastOwn
	u.lastOwn = m
	u.wg.Go(func() {
		rctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), splitCheckFor)
		defer cancel()
		var split []*SplitSaveError
		var whole *Manifest
		for _, c := range []*Manifest{prev, m} {
			if c == nil {
				continue
			}
			ms, err := readName(rctx, u.cfg.Store, u.cfg.Job, c.Checkpoint, u.cache)
			var beside []*Manifest
			if err == nil && u.cfg.WorldNodes <= 1 {
				beside, err = u.multiNodeBeside(rctx, c)
			}
			switch others := splitWith(c, ms, u.cfg.Marker); {
			case err != nil:
				u.log.Debug().Err(err).Str("checkpoint", c.Checkpoint).Msg("cannot read the checkpoint's commits to look for pieces of its save from other instances; the next commit looks again")
			case len(others) > 0:
				split = append(split, &SplitSaveError{Commit: c, Others: others})
			case len(beside) > 0:
				split = append(split, &SplitSaveError{Commit: c, Others: beside, Parts: true})
			case c == prev:
				whole = c
			}
		}
		select {
		case u.wake <- func() { u.splitChecked(split, whole) }:
		case <-ctx.Done():
		}
	})
}

// multiNodeBeside returns the parts and job manifests of a multi-node save of c's name that c,
// a single-node commit of this agent's, belongs to by time and marker (sameSave), made by other
// instances: this node left at store.world_nodes 1 in a multi-node job commits its own files
// alone, and LATEST on that commit is torn. None for a job that has no parts.
func (u *Uploader) multiNodeBeside(ctx context.Context, c *Manifest) ([]*Manifest, error) {
	np, err := readNameParts(ctx, u.cfg.Store, u.cfg.Job, c.Checkpoint, u.cache)
	if err != nil {
		return nil, err
	}
	var beside []*Manifest
	for _, m := range append(slices.Clone(np.open), np.jobs...) {
		if (m.Part != nil || len(m.Parts) > 0) && !sameInstance(c, m) && sameSave(c, m, u.cfg.Marker) {
			beside = append(beside, m)
		}
	}
	slices.SortFunc(beside, byOrder)
	slices.SortStableFunc(beside, func(a, b *Manifest) int { // parts by node, then job manifests
		return cmp.Compare(besideRank(a), besideRank(b))
	})
	return beside, nil
}

// besideRank orders multiNodeBeside's manifests: parts by their node's rank, job manifests after.
func besideRank(m *Manifest) int {
	if m.Part != nil {
		return m.Part.NodeRank
	}
	return math.MaxInt
}

// splitChecked says once of each commit in split that it is one piece of a save committed in
// pieces (CheckpointSplit), and of whole, a commit looked at again by the commit after it, that
// it is whole (CheckpointWhole).
func (u *Uploader) splitChecked(split []*SplitSaveError, whole *Manifest) {
	maps.DeleteFunc(u.splitSaid, func(_ string, at time.Time) bool { return time.Since(at) > splitSaidFor })
	for _, e := range split {
		m := e.Commit
		if _, said := u.splitSaid[m.Commit]; said {
			continue
		}
		u.splitSaid[m.Commit] = m.Order().At
		msg := "this checkpoint is one piece of a save other instances committed pieces of, each with its own files: no commit of it is the whole checkpoint, and restore refuses it. Set store.world_nodes and store.node_rank on every node of a multi-node job (docs/multinode.md)"
		if e.Parts {
			msg = "this checkpoint is this node's files alone, committed beside the other nodes' parts of a multi-node save of it: it is not the whole checkpoint, and restore refuses it (LATEST may name it). Set store.world_nodes and store.node_rank on this node as on the others (docs/multinode.md)"
		}
		u.log.Error().Err(e).Str("checkpoint", m.Checkpoint).Str("commit", m.Commit).Msg(msg)
		u.emit(UploadEvent{Kind: CheckpointSplit, Checkpoint: m.Checkpoint, At: m.Order().At, Manifest: m, Err: e})
	}
	if whole != nil {
		u.emit(UploadEvent{Kind: CheckpointWhole, Checkpoint: whole.Checkpoint, At: whole.Order().At, Manifest: whole})
	}
}

// splitCheckFor bounds the reads of one checkSplit.
const splitCheckFor = 5 * time.Second

// splitSaidFor is how long a commit said to be a piece of a split save is remembered, so that
// it is said once: far longer than between two commits.
const splitSaidFor = 6 * time.Hour

// what names what a commit of m made durable, for the log: fixed text (a part's node_rank and
// world_nodes are fields).
func what(m *Manifest) string {
	if m.Part != nil {
		return "this node's part of the checkpoint"
	}
	return "checkpoint"
}

// reachMax bounds what is taken for the trainer's time from its signal to its save's first file
// (Uploader.reach): a save begun later is one of its own.
const reachMax = 10 * time.Minute

// forecast returns the checkpoint's upload throughput (bytes/s) and how long after a notice a
// checkpoint like it would be durable once the trainer begins to write it: the trainer's write
// time (first file ready → complete) or the time to send it all at this throughput, whichever is
// longer, plus the commit. The caller adds the trainer's time to begin (Uploader.reach). A
// checkpoint that was withheld (generation.heldBack) makes none: 0.
func forecast(g *generation, m *Manifest) (float64, time.Duration) {
	if g.uploadBusy <= 0 || m.TotalBytes == 0 || g.sent == 0 {
		return 0, 0
	}
	wall := g.uploadBusy
	if !g.uploadStart.IsZero() && m.Timings.LastByteAt != nil {
		wall = min(wall, m.Timings.LastByteAt.Sub(g.uploadStart))
	}
	wall = max(wall, time.Microsecond)
	throughput := float64(g.sent) / wall.Seconds()
	if g.heldBack {
		// Found from outside: a checkpoint of 1 KiB withheld for 17 s, until its file was made
		// readable, forecast 17 s.
		return throughput, 0
	}
	send := time.Duration(float64(m.TotalBytes) / throughput * float64(time.Second))
	var write time.Duration
	if !g.firstFileAt.IsZero() && !g.completeSeen.IsZero() {
		write = g.completeSeen.Sub(g.firstFileAt)
	}
	commit := time.Since(*m.Timings.LastByteAt)
	return throughput, max(write, send) + commit
}

// wroteAt takes mod, the modification time of a file of g as reported, into g.begunAt.
func (g *generation) wroteAt(mod time.Time) {
	if !mod.IsZero() && (g.begunAt.IsZero() || mod.Before(g.begunAt)) {
		g.begunAt = mod
	}
}

// begunBefore reports whether g was begun before the trainer's last signal: a save in progress
// when the notice came (a periodic one), completed after it, is not the trainer's answer, and a
// stop still waits for the save the trainer makes for the signal. Taken for its answer, a stop
// during the notice ended at once, and the trainer's save for the notice, a step later, was never
// sent (found from outside).
func (u *Uploader) begunBefore(g *generation) bool {
	return !g.begunAt.IsZero() && g.begunAt.Before(u.lastSignal.Add(-FileTimeLag))
}

// foundAt returns when ev's file (or marker) was written, for the times a save is judged by (its
// first file, its completion): when the watcher saw it, or for one the first read of
// checkpoint.dir found (the events end each read with a ReadDone: AwaitFirstRead), its
// modification time if earlier. A restarted agent finds the save the
// trainer made while it was down, and its own time would count its downtime as the trainer's (a
// forecast of 18.7 s for a save of a second, found from outside); a save older than the signal
// would answer it.
func (u *Uploader) foundAt(ev WatchEvent) time.Time {
	if u.cfg.AwaitFirstRead && !u.dirRead && !ev.ModTime.IsZero() && ev.ModTime.Before(ev.At) {
		return ev.ModTime
	}
	return ev.At
}

func (u *Uploader) emit(ev UploadEvent) {
	if u.cfg.OnEvent != nil {
		u.cfg.OnEvent(ev)
	}
}

func (u *Uploader) status() UploaderStatus {
	st := UploaderStatus{Urgent: u.urgent(), InFlight: u.inflight, Queued: u.queuedFiles(),
		Checkpoints: []CheckpointStatus{}} // [] in /status, not null
	if d := u.deadline(); !d.IsZero() {
		st.Deadline = &d
	}
	for _, name := range slices.Sorted(maps.Keys(u.gens)) {
		g := u.gens[name]
		cs := CheckpointStatus{Name: name, Commit: g.commit, Files: len(g.files), Complete: g.complete, Committed: g.state == genCommitted,
			Withheld: g.withheld && !g.complete}
		switch {
		case g.complete && !g.completeSeen.IsZero():
			t := g.completeSeen
			cs.CompleteSince = &t
		case cs.Withheld && !g.withheldAt.IsZero():
			t := g.withheldAt // its marker came then; it waits for a fix since
			cs.CompleteSince = &t
		}
		if !g.lastFileAt.IsZero() {
			t := g.lastFileAt
			cs.LastFileAt = &t
		}
		cs.FilesStored, cs.Bytes, cs.BytesStored = g.storedAt(u.storedEpoch)
		st.Checkpoints = append(st.Checkpoints, cs)
	}
	return st
}

// storedAt is stored, remembered for a committed generation within the uploader's storedEpoch
// epoch.
func (g *generation) storedAt(epoch uint64) (files int, bytes, storedBytes int64) {
	if g.state != genCommitted {
		return g.stored()
	}
	if m := &g.storedMemo; m.epoch == epoch && epoch != 0 {
		return m.files, m.bytes, m.storedBytes
	}
	files, bytes, storedBytes = g.stored()
	g.storedMemo.epoch, g.storedMemo.files, g.storedMemo.bytes, g.storedMemo.storedBytes = epoch, files, bytes, storedBytes
	return files, bytes, storedBytes
}

// stored returns how many of g's files are stored, and its bytes in all and stored.
func (g *generation) stored() (files int, bytes, storedBytes int64) {
	for _, f := range g.files {
		bytes += f.id.Size
		if f.done != nil && (f.done.key != "" || g.state == genCommitted) {
			files++
			storedBytes += f.done.id.Size
		}
	}
	return files, bytes, storedBytes
}

// commitProgressEvery is how often a complete checkpoint's commit that takes long says how far
// it is (found from outside: a commit of 100 000 files logged nothing for the 339 s between
// "checkpoint complete" and its commit).
var commitProgressEvery = 30 * time.Second

// commitProgressMax bounds the progress lines of one tick.
const commitProgressMax = 5

// logProgress says, for each complete checkpoint whose commit has taken commitProgressEvery or
// more, how much of it is stored, when more is than its last line said. A commit that stores
// nothing (a refusing store) has its own lines, and a withheld one its error.
func (u *Uploader) logProgress() {
	now, said := time.Now(), 0
	for _, g := range u.gensInOrder() {
		if !g.complete || g.state == genCommitted || g.state == genAbandoned || g.completeSeen.IsZero() ||
			now.Sub(g.completeSeen) < commitProgressEvery {
			continue
		}
		files, bytes, stored := g.stored()
		if stored == 0 || stored == g.progressSaid {
			continue
		}
		g.progressSaid = stored
		if said++; said > commitProgressMax {
			continue
		}
		u.log.Info().Str("checkpoint", g.name).Int("files_stored", files).Int("files", len(g.files)).
			Int64("bytes_stored", stored).Int64("bytes", bytes).Float64("since_complete_s", logSeconds(now.Sub(g.completeSeen))).
			Msg("committing: stored so far")
	}
}
