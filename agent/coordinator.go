package agent

import (
	"cmp"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io/fs"
	"maps"
	"math"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"time"

	"github.com/rs/zerolog"

	"github.com/spotguard/spotguard/agent/imds"
	"github.com/spotguard/spotguard/agent/metrics"
	"github.com/spotguard/spotguard/agent/trainer"
	"github.com/spotguard/spotguard/checkpoint"
)

// trainerScanInterval is how often the coordinator looks for trainer processes between notices,
// so that a trainer that would not catch the signal is reported before a notice comes.
const trainerScanInterval = 10 * time.Second

// maxNoticeHistory bounds the notices kept for /status.
const maxNoticeHistory = 64

// NoticeFile is the name of the file, in agent.runtime_dir, that describes the notices in force
// (policy checkpoint): the most severe at the top, every one in "active". It is rewritten whenever
// that set changes (before the trainer is signalled for a new one) and removed when none is left.
const NoticeFile = "notice.json"

// The states of a notice. A notice moves detected → trainer_signalled (at least one process was
// signalled) or trainer_not_signalled (none found, or none catches the signal); ignored notices stop
// at ignored. Any of them may end (the source withdrew it, or a scheduled event was canceled or
// completed).
const (
	StateDetected            = "detected"
	StateIgnored             = "ignored"
	StateTrainerSignalled    = "trainer_signalled"
	StateTrainerNotSignalled = "trainer_not_signalled"
	StateEnded               = "ended"
	// StateCheckpointMissing: the trainer was signalled, and no checkpoint completed by the
	// deadline (or within checkpointDue of the signal): only what was saved before is there. A
	// checkpoint that completes later still moves the notice on.
	StateCheckpointMissing = "checkpoint_missing"
)

// checkpointDue is how long after the signal a notice without a deadline ahead of it waits for
// the trainer's checkpoint before it is reported missing: a spot notice's 2 minutes.
const checkpointDue = 2 * time.Minute

// Transition is one step of a notice's state machine.
type Transition struct {
	State string    `json:"state"`
	At    time.Time `json:"at"`
	// SinceDetectedMS is the time since the notice was detected, in milliseconds.
	SinceDetectedMS float64 `json:"since_detected_ms"`
	Detail          string  `json:"detail,omitempty"`
}

// NoticeStatus is one notice as /status shows it.
type NoticeStatus struct {
	Key      string      `json:"key"`
	Source   imds.Source `json:"source"`
	Action   string      `json:"action"`
	EventID  string      `json:"event_id,omitempty"`
	Policy   Policy      `json:"policy"`
	Deadline *time.Time  `json:"deadline"`
	// DetectedAt is when the agent first read the notice, as notice.json's detected_at: for one
	// in force across a restart of the agent, when its previous run did (the first transition
	// is this run's).
	DetectedAt  time.Time       `json:"detected_at"`
	Malformed   bool            `json:"malformed,omitempty"`
	State       string          `json:"state"`
	Active      bool            `json:"active"`
	Transitions []Transition    `json:"transitions"`
	Signals     []SignalOutcome `json:"signals"`
	// SignalsOmitted counts the outcomes dropped from Signals: those of processes gone, once
	// there are more than maxSignalRecords (a DataLoader's workers, new every epoch).
	SignalsOmitted int `json:"signals_omitted,omitempty"`
	// Posts counts the times a job notice was posted (POST /notice); 0 for IMDS notices.
	Posts int `json:"posts,omitempty"`
	// LastPostAt is when a job notice was last posted; absent for IMDS notices.
	LastPostAt *time.Time `json:"last_post_at,omitempty"`
	// Missing says, in checkpoint_missing, why the notice has no checkpoint and what to do: the
	// text of its error line.
	Missing string `json:"missing,omitempty"`
	// EndsAt is when a job notice ends unless posted again with a later deadline: its latest
	// deadline (or, if that had passed, the post) plus JobNoticeGrace; absent for IMDS notices,
	// which end when IMDS withdraws them.
	EndsAt *time.Time `json:"ends_at,omitempty"`

	notAfter   time.Time // a scheduled event's NotAfter
	detectedAt time.Time // for timings
	// readAt is when the notice was first read: at detectedAt, or earlier by the agent's previous
	// run, for one in force across a restart (its notice.json). A save asked for after it is the
	// notice's save (cover, savingFor).
	readAt      time.Time
	signalledAt *time.Time // when the trainer was signalled, if it was
	// notSignalledAt is when its signal found no trainer process it could signal (none found, or
	// none catches trainer.signal); zero when it did, or was not tried. Without a checkpoint by
	// the deadline, it is checkpoint_missing (not_signalled).
	notSignalledAt time.Time
	notSignalledBy string // why: what was found, and the discovery problems
	written        string // the checkpoint completed after the notice, once seen
	// writtenAt is when the trainer completed written (its marker's time), when known: after a
	// restart, long before the agent saw it.
	writtenAt time.Time
	// later are the checkpoints completed after written, while it is not committed, oldest first
	// (at most maxLater): one of them committed makes the notice durable too, and one takes
	// written's place when written is deleted or renamed away before its commit.
	later    []string
	withheld string // a checkpoint withheld after the notice (its marker came; not storable)
	// withheldErr is why withheld is: not storable, or written after its marker
	// (checkpoint.ErrWrittenAfterMarker).
	withheldErr error
	// withheldGone is the withheld checkpoint, once it was deleted (or renamed: under its new
	// name it completes anew) without another completing.
	withheldGone string
	// renamed is its checkpoint (or one completed after it), renamed away before its commit (at
	// renamedAt), awaited under a new name until a checkpoint completed when it did (renamedDone:
	// the same files) completes, or it is said missing.
	renamed     string
	renamedAt   time.Time
	renamedDone time.Time
	missingSaid bool      // reported as checkpoint_missing
	lateSaid    bool      // its deadline passed with written not committed, said (checkLate)
	endedAt     time.Time // when it ended; zero while active
	committed   bool      // written is committed
	committedAt time.Time // when this agent learned it was
	// inherited: the trainer was signalled for it by the agent's previous run (a restart during
	// the notice): its detection here is not the notice's, so no time to durable is measured.
	inherited bool
	problems  []trainer.Problem // discovery problems met when signalling
	// handled: begin has dealt with it (signalled, or found nothing to signal); from then on a
	// trainer process found that was not tried is signalled too (signalNew).
	handled bool
	// signalledPIDs are the trainer processes signalled for it (by this run, or by the previous
	// one, which a restart inherits); tried also has those that could not be, with their start
	// ticks (0: unknown), which tell them from a process that has the PID later (wasTried).
	signalledPIDs []int
	tried         map[int]uint64
	// notCaught are the processes found not catching the signal (yet): not tried, so the next
	// scan (signalNew) looks again; said once each.
	notCaught map[int]bool
	// heldUntil is when a notice held back (holdForReclaim) is acted on; zero when it is not
	// held. heldFirst is its Event.First.
	heldUntil time.Time
	heldFirst bool
}

// SignalOutcome is what happened to one trainer process on a notice.
type SignalOutcome struct {
	PID     int             `json:"pid"`
	Cmdline string          `json:"cmdline"`
	Outcome trainer.Outcome `json:"outcome"`
	Error   string          `json:"error,omitempty"`
	// At is when it was tried.
	At time.Time `json:"at"`
}

// TrainerStatus is one trainer process found by the last scan.
type TrainerStatus struct {
	PID     int    `json:"pid"`
	Cmdline string `json:"cmdline"`
	Via     string `json:"via"`
	// CatchesSignal is false when the process has no handler for trainer.signal: it will not be
	// signalled, because the default action would kill it.
	CatchesSignal bool   `json:"catches_signal"`
	Signal        string `json:"signal"`
	// young: found not catching the signal within handlerGrace of its start, said at Info;
	// said at Error at the first scan after that if it still does not.
	young bool
}

// handlerGrace is how long after its start a trainer process that does not catch the signal is
// taken for one still starting (Python's imports, a launcher starting its workers) rather than
// one without a handler: at the scan, a line at Info, not an error telling to install one.
const handlerGrace = 30 * time.Second

// noticeSink takes the notice path's datums; it must never block (metrics.CloudWatch).
type noticeSink interface {
	Record(ds ...metrics.Datum)
	FlushNow()
}

// trainers finds and signals the trainer processes.
type trainers interface {
	Find(cfg *Config) ([]trainer.Process, []trainer.Problem)
	Catches(pid int, sig syscall.Signal) (bool, error)
	Signal(procs []trainer.Process, sig syscall.Signal) []trainer.Result
}

// procTrainers is trainers on the real /proc and cgroup file systems.
type procTrainers struct {
	procRoot, cgroupRoot string
	self                 int
	// under, if not 0, confines the trainers to this process and its descendants (Deps.TrainerTree).
	under int
}

func (p procTrainers) Find(cfg *Config) ([]trainer.Process, []trainer.Problem) {
	f := trainer.Finder{
		PIDFile:    cfg.Trainer.PIDFile,
		Unit:       cfg.Trainer.Unit,
		Match:      cfg.Trainer.Match,
		Container:  cfg.Trainer.Container,
		User:       cfg.Trainer.User,
		Under:      p.under,
		ProcRoot:   p.procRoot,
		CgroupRoot: p.cgroupRoot,
		Self:       p.self,
	}
	return f.Find()
}

// discoveryWait is how long the notice path waits for trainer discovery: it reads the pidfile and
// /proc, and either can hang (a pidfile on a file system that does, the command line of a process
// stuck in the kernel with its memory locked). Past it, the processes of the last discovery that
// returned are used, and no other starts until the hung one returns.
const discoveryWait = 2 * time.Second

// discovery is the state of find: one trainers.Find at a time, and what the last one found.
type discovery struct {
	mu sync.Mutex
	// running is closed when the Find in flight returns; nil when none is. runningCfg is the
	// config it was begun with.
	running    chan struct{}
	runningCfg *Config
	procs      []trainer.Process
	problems   []trainer.Problem
	at         time.Time // when the last Find that returned did
	// hungSince is when the Find in flight was found not to return within discoveryWait; zero
	// when it did.
	hungSince time.Time
}

// find is trainers.Find, bounded by discoveryWait (see there). While a Find hangs, it returns at
// once the processes of the last one that returned, and a problem of reason
// trainer.ReasonDiscoveryHung; said once per hang, and again when it returns. A Find in flight
// begun with another config (before a reload) is not joined: find waits for it (within the same
// discoveryWait), then begins its own.
func (c *Coordinator) find(cfg *Config) ([]trainer.Process, []trainer.Problem) {
	d := &c.disc
	wait, cancel := context.WithTimeout(context.Background(), discoveryWait)
	defer cancel()
	d.mu.Lock()
	done := d.running
	if done != nil && d.runningCfg != cfg && d.hungSince.IsZero() {
		// The Find in flight was begun with the config before a reload (another pidfile or
		// match): its answer is not this config's. It returns in moments; then look again.
		d.mu.Unlock()
		select {
		case <-done:
		case <-wait.Done():
		}
		d.mu.Lock()
		done = d.running
	}
	if done == nil {
		done = make(chan struct{})
		d.running, d.runningCfg = done, cfg
		go func() {
			procs, problems := c.trainers.Find(cfg)
			d.mu.Lock()
			hung := d.hungSince
			d.procs, d.problems, d.at, d.running, d.hungSince = procs, problems, time.Now(), nil, time.Time{}
			d.mu.Unlock()
			if !hung.IsZero() {
				c.log.Warn().Float64("hung_s", logSeconds(time.Since(hung)+discoveryWait)).Msg("trainer discovery returns again")
			}
			close(done)
		}()
	}
	hung := !d.hungSince.IsZero()
	d.mu.Unlock()
	if !hung {
		select {
		case <-done:
		case <-wait.Done():
		}
	}
	d.mu.Lock()
	defer d.mu.Unlock()
	if d.running != done { // it returned
		return slices.Clone(d.procs), slices.Clone(d.problems)
	}
	if d.hungSince.IsZero() {
		d.hungSince = time.Now().Add(-discoveryWait)
		ev := c.log.Error().Ints("using_pids", pidsOf(d.procs))
		if !d.at.IsZero() {
			ev = ev.Time("found_at", d.at)
		}
		ev.Str("fix", "look for a trainer.pidfile on a file system that hangs (NFS), or a process stuck in the kernel (state D in ps)").
			Msgf("trainer discovery has not returned for %s; signalling the processes it found last", discoveryWait)
	}
	detail := fmt.Sprintf("trainer discovery has not returned since %s (a trainer.pidfile on a file system that hangs, or /proc of a process stuck in the kernel)",
		d.hungSince.UTC().Format(time.RFC3339))
	if d.at.IsZero() {
		detail += "; none found before it hung"
	} else {
		detail += fmt.Sprintf("; using the %d processes it found at %s", len(d.procs), d.at.UTC().Format(time.RFC3339))
	}
	return slices.Clone(d.procs), []trainer.Problem{{Reason: trainer.ReasonDiscoveryHung, Detail: detail}}
}

// pidsOf returns the PIDs of procs.
func pidsOf(procs []trainer.Process) []int {
	pids := make([]int, len(procs))
	for i, p := range procs {
		pids[i] = p.PID
	}
	return pids
}

func (p procTrainers) Catches(pid int, sig syscall.Signal) (bool, error) {
	return trainer.Catches(p.procRoot, pid, sig)
}

func (p procTrainers) Signal(procs []trainer.Process, sig syscall.Signal) []trainer.Result {
	return trainer.Signal(p.procRoot, procs, sig)
}

// Coordinator turns notices into actions: for each notice it writes notice.json, then signals
// every trainer process exactly once, and keeps every transition with its timing for /status.
type Coordinator struct {
	log      zerolog.Logger
	metrics  *promMetrics
	config   func() *Config
	trainers trainers
	// uploader, if set, is told of each notice with policy checkpoint.
	uploader noticeUploader
	// sink, if set, gets the notice path's datums at 1-second resolution, flushed at once.
	sink noticeSink

	// alive is when the loop last went round (Unix nanoseconds).
	alive atomic.Int64
	// disc bounds trainer discovery (find).
	disc discovery
	// posts carries job notices (POST /notice) into the loop; stopped is closed when Run returns.
	posts   chan jobPost
	stopped chan struct{}

	mu           sync.Mutex
	notices      []*NoticeStatus          // oldest first, at most maxNoticeHistory
	active       map[string]*NoticeStatus // by key
	found        []TrainerStatus
	lastProblems string
	// stoppedCatching are the processes seen to stop catching the signal at the last scan, not said
	// yet: a Python process resets its handlers as it exits, so one exiting after its save is
	// said only if it is still there, not catching, at the next scan.
	stoppedCatching map[int]bool
	// scanned: Scan has looked for the trainer at least once.
	scanned bool
	// startedAt is when Run began; dirRead, whether the uploader has read checkpoint.dir in full
	// since (checkpoint.DirRead). Until then, or dirReadGrace, checkMissing says nothing: a
	// restarted agent judged a notice of its previous run's past its deadline before it had heard
	// of the checkpoint on disk (found from outside).
	startedAt time.Time
	dirRead   bool
	// scanSeq numbers the looks for the trainer as they begin; foundSeq is the number of the look
	// found, lastProblems and stoppedCatching are from. Looks run at once (the 10 s one, a
	// notice's, a reload's, /healthz's): one begun earlier that ends later is not kept.
	scanSeq, foundSeq uint64
	// previous holds, by key, when an earlier run signalled the trainer for a notice
	// (readPrevious); set before Run.
	previous map[string]signalRecord
	// previousSeen holds, by key, what an earlier run read of each notice in force
	// (readPrevious); set before Run.
	previousSeen map[string]seenRecord
	// previousJobs are the job notices an earlier run held (readPrevious); set before Run, which
	// takes back those not ended.
	previousJobs []jobRecord
	// carried are the IMDS notices an earlier run's notice.json named (readPrevious), set before
	// Run: notice.json keeps naming them, as that run wrote them, until this run has read their
	// source (settleCarried), so that a trainer never finds it missing, or without its signal,
	// across a restart (found from outside: removed at start, then written again without the
	// signal, in 8 of 8 restarts during a notice). carriedSeen counts, by source, the beats that
	// found it read.
	carried     []noticeEntry
	carriedSeen map[imds.Source]int
	// sourceRead reports whether the watcher polls src, and whether a read of it has succeeded
	// since the start; nil: every source is polled and read.
	sourceRead func(src imds.Source) (polled, read bool)
	// noticeFileErr is why the last write of notice.json failed; nil once one succeeds.
	// noticeFileTried: when retryNoticeFile last tried again (Run's loop).
	noticeFileErr   error
	noticeFileTried time.Time
	// writeTimed is the save (checkpoint, and the signal it answered) whose write time was last
	// observed: notices that share one save (cover) observe it once.
	writeTimed string
	// storeNewest is the newest commit of the job known: read from the store at the uploader's
	// start (CheckpointFound), or committed since.
	storeNewest *checkpoint.Manifest
	// complete holds the checkpoints complete and not committed (CheckpointComplete), with when
	// each completed: a notice read after the uploader reported them (an agent restarted
	// during a notice) may have one of them for its checkpoint. At most maxComplete.
	complete map[string]time.Time
	// renamed holds the complete checkpoints renamed away (a staging name renamed into place)
	// in the last renameGrace, by name: when each completed, and when it was renamed. A notice
	// that takes the checkpoints completed before it asked (adoptCompleted) awaits them under
	// their new names as it would have, had it seen the rename.
	renamed map[string]renamedCheckpoint
	// procSignals holds, by process, its last signal: when, and for which notice.
	procSignals map[int]procSignal
	// hold fires when a notice held back (holdForReclaim) is due; Run's loop owns it (nil when
	// Run is not running: nothing is held).
	hold *time.Timer
}

// noticeFileProblem returns why notice.json could not be written last, or nil.
func (c *Coordinator) noticeFileProblem() error {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.noticeFileErr
}

// setNoticeFileProblem records the outcome of a write of notice.json.
func (c *Coordinator) setNoticeFileProblem(err error) {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.noticeFileErr = err
}

func newCoordinator(log zerolog.Logger, m *promMetrics, config func() *Config, t trainers) *Coordinator {
	return &Coordinator{
		log:         log.With().Str("component", "coordinator").Logger(),
		metrics:     m,
		config:      config,
		trainers:    t,
		active:      map[string]*NoticeStatus{},
		complete:    map[string]time.Time{},
		renamed:     map[string]renamedCheckpoint{},
		procSignals: map[int]procSignal{},
		carriedSeen: map[imds.Source]int{},
		posts:       make(chan jobPost),
		stopped:     make(chan struct{}),
	}
}

// Run handles notices from events and from the job (Post), ends job notices when they expire,
// and rescans for trainers every trainerScanInterval until ctx is done. It returns nil.
func (c *Coordinator) Run(ctx context.Context, events <-chan imds.Event) error {
	defer close(c.stopped)
	c.mu.Lock()
	c.startedAt = time.Now()
	c.mu.Unlock()
	c.Scan()
	t := time.NewTicker(trainerScanInterval)
	defer t.Stop()
	beat := time.NewTicker(loopBeat)
	defer beat.Stop()
	expire := time.NewTimer(time.Hour)
	expire.Stop()
	defer expire.Stop()
	c.mu.Lock()
	previous := len(c.carried) > 0 || len(c.previousJobs) > 0
	c.mu.Unlock()
	c.resumeJobNotices(time.Now())
	if previous {
		// The earlier run's notice.json, replaced whole: the job notices taken back, the IMDS
		// ones carried until their sources are read, none that has ended.
		c.rewriteNoticeFile(c.config(), c.inForce())
	}
	c.armExpiry(expire)
	c.hold = time.NewTimer(time.Hour)
	c.hold.Stop()
	defer c.hold.Stop()
	for {
		c.alive.Store(time.Now().UnixNano())
		select {
		case <-ctx.Done():
			// A stop does not wait for a held notice's reclaim: it is signalled now, as it was
			// when it came.
			c.releaseHeld(time.Now().Add(time.Hour))
			return nil
		case ev := <-events:
			c.Handle(ev)
		case p := <-c.posts:
			p.reply <- c.TakeJobNotice(p.notice, time.Now())
			c.armExpiry(expire)
		case <-expire.C:
			c.ExpireJobNotices(time.Now())
			c.armExpiry(expire)
		case <-c.hold.C:
			c.releaseHeld(time.Now())
		case <-t.C:
			cfg := c.config()
			c.signalNew(cfg, c.scan(cfg), math.MaxInt)
		case <-beat.C:
			c.settleCarried(time.Now())
			c.retryNoticeFile(time.Now())
			if c.signalledInForce() {
				// During a notice the trainer is looked for every second: one restarted (or
				// started) since the signal is signalled too, while there is time to save.
				cfg := c.config()
				c.signalNew(cfg, c.scan(cfg), math.MaxInt)
			}
		}
		c.checkMissing(time.Now())
		c.checkLate(time.Now())
	}
}

// checkLate says, once per notice, an error when a checkpoint notice's deadline passes with the
// checkpoint written for it not committed yet: the instance may be gone any moment, and what the
// next one restores is the newest checkpoint committed before (a store too slow, or refusing).
// The upload goes on; "checkpoint committed after the notice deadline" says when it lands.
func (c *Coordinator) checkLate(now time.Time) {
	type late struct {
		key, written string
		by           time.Duration
		// trainerLate: the checkpoint completed after the deadline (the trainer was late,
		// not the store).
		trainerLate time.Duration
	}
	var due []late
	c.mu.Lock()
	for _, ns := range c.active {
		if ns.Policy != PolicyCheckpoint || ns.written == "" || ns.committed || ns.lateSaid || ns.Deadline == nil || !now.After(*ns.Deadline) {
			continue
		}
		if ns.State != StateCheckpointWritten {
			continue
		}
		ns.lateSaid = true
		l := late{key: ns.Key, written: ns.written, by: now.Sub(*ns.Deadline)}
		if !ns.writtenAt.IsZero() {
			l.trainerLate = ns.writtenAt.Sub(*ns.Deadline)
		} else {
			for _, tr := range slices.Backward(ns.Transitions) {
				if tr.State == StateCheckpointWritten {
					l.trainerLate = tr.At.Sub(*ns.Deadline)
					break
				}
			}
		}
		due = append(due, l)
	}
	c.mu.Unlock()
	for _, l := range due {
		ev := c.log.Error().Str("notice", l.key).Str("checkpoint", l.written).Float64("late_by_s", logSeconds(l.by))
		if l.trainerLate > 0 {
			// Not the store's doing (found from outside: the line sent the operator to the
			// store's errors, which had none).
			ev.Float64("completed_after_deadline_s", logSeconds(l.trainerLate)).
				Msg("the trainer completed the notice's checkpoint after the notice's deadline: its upload goes on while the instance runs, " +
					"and until it is committed a restore takes the newest checkpoint committed before it; save less on a notice, or save sooner")
			continue
		}
		ev.Msg("the notice's deadline passed and its checkpoint is not committed yet: its upload goes on while the instance runs, " +
			"and until it is committed a restore takes the newest checkpoint committed before it (see the store's errors, /status uploads)")
	}
}

// signalledInForce reports whether a checkpoint notice that begin handled is in force.
func (c *Coordinator) signalledInForce() bool {
	for _, ns := range c.inForce() {
		c.mu.Lock()
		handled := ns.handled && ns.Source != SourceJob
		c.mu.Unlock()
		if handled {
			return true
		}
	}
	return false
}

// loopBeat is how often the coordinator's loop shows it is alive when nothing happens.
const loopBeat = time.Second

// aliveWithin reports whether the coordinator's loop went round within d: the watchdog is
// pinged only then, so a stuck notice path gets the agent restarted.
func (c *Coordinator) aliveWithin(d time.Duration) bool {
	return time.Since(time.Unix(0, c.alive.Load())) <= d
}

// loopStuck is how long the coordinator's loop may go without going round before /healthz says
// the notice path is stuck (the loop goes round every loopBeat).
const loopStuck = 10 * time.Second

// stuckFor returns how long the coordinator's loop has not gone round as of now, and true when
// that is more than loopStuck while it runs (not before its start, nor after its end).
func (c *Coordinator) stuckFor(now time.Time) (time.Duration, bool) {
	at := c.alive.Load()
	if at == 0 {
		return 0, false
	}
	select {
	case <-c.stopped:
		return 0, false
	default:
	}
	d := now.Sub(time.Unix(0, at))
	return d, d > loopStuck
}

// Handle is one step of the state machine: a notice begins or ends.
func (c *Coordinator) Handle(ev imds.Event) {
	switch ev.Kind {
	case imds.Begin:
		c.begin(ev)
	case imds.End:
		c.end(ev)
	case imds.Update:
		c.update(ev)
	}
}

// update takes a notice in force read again with an earlier deadline, readable where its
// deadline was a fail-safe guess, or a scheduled event rescheduled (earlier or later):
// notice.json, the uploads and /status get the new deadline. The trainer is not signalled again.
func (c *Coordinator) update(ev imds.Event) {
	c.mu.Lock()
	ns, ok := c.active[ev.Notice.Key()]
	if !ok {
		c.mu.Unlock()
		return
	}
	was := ns.Deadline
	if !ev.Notice.Deadline.IsZero() {
		d := ev.Notice.Deadline
		ns.Deadline = &d
	}
	ns.Malformed = ev.Notice.Malformed
	if ns.Source == imds.SourceScheduled {
		ns.notAfter = ev.Notice.NotAfter
	}
	policy := ns.Policy
	c.mu.Unlock()
	ev2 := c.log.Warn().Str("notice", ns.Key).Time("deadline", ev.Notice.Deadline).
		Float64("time_left_s", logSeconds(time.Until(ev.Notice.Deadline)))
	if was != nil {
		ev2 = ev2.Time("was", *was)
	}
	msg := "notice's deadline moved earlier (or was a guess): acting on the new one"
	if was != nil && ev.Notice.Deadline.After(*was) {
		msg = "scheduled event rescheduled later: acting on its new time"
	}
	ev2.Msg(msg)
	if policy != PolicyCheckpoint {
		return
	}
	if ns.Deadline != nil {
		c.metrics.noticeDeadlineLeft.WithLabelValues(string(ns.Source)).Set(time.Until(*ns.Deadline).Seconds())
	}
	c.noticesChanged(c.config())
}

func (c *Coordinator) begin(ev imds.Event) {
	cfg := c.config()
	ns := c.detect(cfg, ev.Notice, ev.At, "", func(ns *NoticeStatus) {
		c.mu.Lock()
		defer c.mu.Unlock()
		// In force at this run's first read, and read earlier by its previous run: a save that
		// run asked for after it read the notice is the notice's save (a restart during its
		// hold); and the earliest deadline wins, as within one run (AWS's simulator gives a
		// spot notice's time anew at every read, an ASG termination's is 2 minutes after it was
		// read).
		if seen, ok := c.previousSeen[ns.Key]; ok && ev.First {
			if seen.read.Before(ns.readAt) {
				ns.readAt = seen.read
			}
			// (A scheduled event's time is what IMDS says now: rescheduled while the agent was
			// down, it is taken as read.)
			if seen.deadline != nil && ns.Deadline != nil && seen.deadline.Before(*ns.Deadline) && ns.Source != imds.SourceScheduled {
				d := *seen.deadline
				ns.Deadline = &d
			}
		}
		delete(c.previousSeen, ns.Key)
	})
	if ns.Policy == PolicyIgnore {
		return
	}

	// One the agent's previous run signalled the trainer for: notice.json says so from its first
	// write by this run (found from outside: written first without the signal).
	if c.inherit(cfg, ns, ev.First) {
		return
	}
	// Before signalling: the files the trainer writes now get every connection, and notice.json
	// says what to act on.
	c.noticesChanged(cfg)
	if c.holdForReclaim(ns, cfg, ev.First) {
		return
	}
	c.act(cfg, ns, ev.First, ns.detectedAt)
}

// holdForReclaim holds back the signal of ns, a notice of a source read every poll_interval (a
// rebalance recommendation, a scheduled event, an ASG termination), while the spot source, read
// four times as often, is polled, for holdFor: AWS may send a reclaim notice at the same time
// (the rebalance recommendation with it or after it, the ASG termination of a reclaimed
// instance), and when both come together the trainer is signalled once, for the reclaim (ns then
// shares its save: cover), not for ns first and the reclaim a moment later, which a trainer takes
// for two saves (one to keep training, then one to exit). ns's uploads are urgent at once. It
// reports whether ns was held; releaseHeld acts on it.
func (c *Coordinator) holdForReclaim(ns *NoticeStatus, cfg *Config, first bool) bool {
	if ns.Source == imds.SourceSpot || ns.Source == SourceJob || c.hold == nil || cfg.Notices[imds.SourceSpot] == PolicyOff {
		return false
	}
	d := max(holdFor, 2*cfg.IMDS.SpotPollInterval)
	c.mu.Lock()
	ns.heldUntil, ns.heldFirst = ns.detectedAt.Add(d), first
	c.mu.Unlock()
	c.armHold()
	c.log.Info().Str("notice", ns.Key).Float64("for_s", d.Seconds()).
		Msg("notice: the trainer is signalled after a short wait for a reclaim notice that comes with it, so that it saves once")
	return true
}

// holdFor is the least time a notice's signal is held back (holdForReclaim): the spot source
// is read at least twice meanwhile (every 250 ms by default).
const holdFor = time.Second

// armHold sets the hold timer for the earliest held notice, if any.
func (c *Coordinator) armHold() {
	c.mu.Lock()
	var next time.Time
	for _, ns := range c.active {
		if !ns.heldUntil.IsZero() && (next.IsZero() || ns.heldUntil.Before(next)) {
			next = ns.heldUntil
		}
	}
	c.mu.Unlock()
	if !next.IsZero() {
		c.hold.Reset(time.Until(next))
	}
}

// releaseHeld acts on every notice held back (holdForReclaim) whose time has come, as begin does
// on a notice that is not held; one that ended meanwhile is not there any more.
func (c *Coordinator) releaseHeld(now time.Time) {
	c.mu.Lock()
	var due []*NoticeStatus
	for _, ns := range c.active {
		if !ns.heldUntil.IsZero() && !now.Before(ns.heldUntil) {
			due = append(due, ns)
		}
	}
	// One that a more severe notice still held came after (read in the next poll) waits for
	// it, and then shares its save: acted on first, it had the trainer signalled twice.
	due = slices.DeleteFunc(due, func(ns *NoticeStatus) bool {
		for _, o := range c.active {
			if o.heldUntil.After(now) && noticeRank(o) < noticeRank(ns) {
				ns.heldUntil = o.heldUntil
				return true
			}
		}
		return false
	})
	c.mu.Unlock()
	// The most severe first: notices read in the same round (a scheduled event and an ASG
	// termination) are held together, and the others then share its save (cover); the less
	// severe first, the trainer was signalled for both.
	slices.SortFunc(due, func(a, b *NoticeStatus) int {
		if r := cmp.Compare(noticeRank(a), noticeRank(b)); r != 0 {
			return r
		}
		return a.detectedAt.Compare(b.detectedAt)
	})
	cfg := c.config()
	for _, ns := range due {
		c.mu.Lock()
		first, from := ns.heldFirst, ns.heldUntil
		ns.heldUntil = time.Time{}
		c.mu.Unlock()
		c.act(cfg, ns, first, from)
	}
	c.armHold()
}

// inherit takes ns, a notice that begins, as signalled, if the agent's previous run signalled
// the trainer for it (a restart during the notice) and trainer processes it signalled are still
// there: they saved for it, or are saving; asked again, they would save twice in the window. It
// reports whether it did; then ns is in notice.json and the uploads' urgency, with its signal.
func (c *Coordinator) inherit(cfg *Config, ns *NoticeStatus, first bool) bool {
	c.mu.Lock()
	_, had := c.previous[ns.Key]
	c.mu.Unlock()
	if !had {
		return false
	}
	log := c.log.With().Str("notice", ns.Key).Logger()
	procs, _ := c.find(cfg)
	prev, ok := c.previousSignal(ns.Key, procs, first)
	if !ok {
		return false
	}
	// A restart (a crash, kill -9) during the notice, with trainer processes it signalled
	// still there: they saved for it, or are saving; asked again, they would save twice in
	// the window.
	c.mu.Lock()
	ns.signalledAt = &prev.At
	ns.signalledPIDs = slices.Clone(prev.PIDs) // carried on in notice.json, for the next restart
	ns.tried = map[int]uint64{}
	for _, pid := range prev.PIDs {
		ns.tried[pid] = 0 // not there now: any process with the PID later counts as it
	}
	for _, p := range procs {
		if prev.holds(p) {
			ns.tried[p.PID] = p.StartTicks
		}
	}
	ns.handled, ns.inherited = true, true
	c.mu.Unlock()
	detail := "signalled by the agent's previous run at " + prev.At.UTC().Format(time.RFC3339) + "; not again"
	c.transition(ns, StateTrainerSignalled, detail)
	log.Info().Time("signalled_at", prev.At).Ints("pids", prev.PIDs).
		Msg("the trainer was signalled for this notice before the agent restarted; not signalled again")
	c.noticesChanged(cfg) // a stop waits for its checkpoint, as for one signalled now
	// Its checkpoint may have been committed before the restart, or be complete and not
	// committed yet, reported by the uploader as it started, before the notice was read.
	c.adoptCompleted(prev.At)
	c.signalNew(cfg, procs, noticeRank(ns)) // those it did not signal (found since), alone
	return true
}

// act signals the trainer for ns, a checkpoint notice that begins (detected, and in notice.json
// and the uploads' urgency already), unless its previous run did (a restart during the notice)
// or the trainer saves for another notice already (cover). first is the notice's Event.First;
// the signal latency is measured from from: its detection, or the end of its hold
// (holdForReclaim), which is the agent's choice, not its delay.
func (c *Coordinator) act(cfg *Config, ns *NoticeStatus, first bool, from time.Time) {
	log := c.log.With().Str("notice", ns.Key).Logger()
	procs, problems := c.find(cfg)
	for _, p := range problems {
		c.metrics.discoveryProblems.WithLabelValues(p.Reason).Inc()
		log.Error().Str("reason", p.Reason).Str("detail", p.Detail).Msg("trainer discovery problem")
	}
	// Processes found since a notice at least as severe was signalled (a trainer restarted) are
	// signalled for it first, as its next scan would: this notice may then share that save.
	c.signalNew(cfg, procs, noticeRank(ns))
	if c.cover(ns, procs, log) {
		c.noticesChanged(cfg) // notice.json carries its signal record, for a restart
		return
	}
	c.mu.Lock()
	ns.problems, ns.handled = problems, true
	// A process signalled for another notice whose save it is making (one found since that
	// notice came, signalled on its own) saves for this one too.
	var fresh []trainer.Process
	var sharedAt *time.Time
	saving := ""
	for _, p := range procs {
		key, at := c.savingFor(p.PID, ns)
		if key == "" {
			fresh = append(fresh, p)
			continue
		}
		if ns.tried == nil {
			ns.tried = map[int]uint64{}
		}
		ns.tried[p.PID] = p.StartTicks
		ns.signalledPIDs = append(ns.signalledPIDs, p.PID)
		if sharedAt == nil || at.Before(*sharedAt) {
			sharedAt, saving = &at, key
		}
	}
	if len(fresh) == 0 && sharedAt != nil {
		ns.signalledAt = sharedAt
	}
	c.mu.Unlock()
	if len(fresh) == 0 && sharedAt != nil {
		c.transition(ns, StateTrainerSignalled, fmt.Sprintf("not signalled again: its processes are saving for %s (since %s), and that save is this notice's too",
			saving, sharedAt.UTC().Format(time.RFC3339Nano)))
		log.Info().Str("covered_by", saving).Msg("notice came while the trainer's processes save for a notice at least as severe: not signalled again")
		c.noticesChanged(cfg)
		c.adoptCompleted(*sharedAt) // that save may be complete already
		return
	}
	sent, results := c.signal(ns, fresh, cfg.Trainer.Signal, log, nil)
	if sent == 0 {
		detail := "no trainer process found"
		if len(results) > 0 {
			detail = "no trainer process could be signalled"
		}
		c.mu.Lock()
		ns.notSignalledAt, ns.notSignalledBy = time.Now(), notSignalledWhy(results, problems, cfg)
		c.mu.Unlock()
		c.transition(ns, StateTrainerNotSignalled, detail)
		log.Error().Int("found", len(procs)).Msg(detail + "; the newest complete checkpoint is all there is")
		return
	}
	latency := time.Since(from)
	c.metrics.signalLatency.Observe(latency.Seconds())
	now := time.Now()
	c.mu.Lock()
	ns.signalledAt = &now
	c.mu.Unlock()
	c.noticesChanged(cfg) // a stop now waits for the checkpoint the trainer writes
	if ns.Deadline != nil {
		c.metrics.noticeDeadlineLeft.WithLabelValues(string(ns.Source)).Set(time.Until(*ns.Deadline).Seconds())
	}
	c.transition(ns, StateTrainerSignalled, fmt.Sprintf("%d of %d processes", sent, len(results)))
	c.record(metrics.Datum{Name: "SignalLatencySeconds", Unit: metrics.UnitSeconds, Value: latency.Seconds(),
		Dimensions: map[string]string{"Source": string(ns.Source)}})
	log.Info().Int("signalled", sent).Int("found", len(results)).Float64("since_detected_s", logSeconds(time.Since(ns.detectedAt))).Msg("notice handled: trainer signalled")
}

// notSignalledWhy says why a notice's signal reached no trainer process: what was found, and
// what kept it from being signalled (the checkpoint_missing line of such a notice).
func notSignalledWhy(results []trainer.Result, problems []trainer.Problem, cfg *Config) string {
	var parts []string
	for _, r := range results {
		switch r.Outcome {
		case trainer.OutcomeNotCaught:
			parts = append(parts, fmt.Sprintf("PID %d does not catch %s: install a handler in the trainer", r.PID, trainer.SignalName(cfg.Trainer.Signal)))
		case trainer.OutcomeGone:
			parts = append(parts, fmt.Sprintf("PID %d exited before its signal", r.PID))
		case trainer.OutcomeFailed:
			parts = append(parts, fmt.Sprintf("PID %d could not be signalled: %v", r.PID, r.Err))
		}
	}
	for _, p := range problems {
		parts = append(parts, p.Reason+": "+p.Detail)
	}
	if len(parts) == 0 {
		return "no trainer process found: see trainer.pidfile, trainer.unit, trainer.match or trainer.container"
	}
	return strings.Join(parts, "; ")
}

// cover takes ns, a notice just detected, as covered by the save the trainer is making for
// another notice in force at least as severe (a spot reclaim, then the rebalance recommendation
// AWS may send with it or after it): a save signalled for whose checkpoint is not durable yet.
// Signalled again, a trainer that keeps training after a save would save twice in the window,
// and its second save's uploads would compete with the first's, which could then miss the
// deadline. So ns is not signalled: the trainer's save for the other notice is ns's save too (its
// signal record, the checkpoint written for it, once committed its commit), and the processes
// found now count as signalled for it. A more severe notice is signalled as always (the trainer
// learns from notice.json what it must do, e.g. exit after saving), and so is any notice once the
// other's checkpoint is durable (a new save can then only add; but not when the other's signal
// came after ns was read, as for a reclaim read during ns's hold: that save is ns's, committed)
// or went missing (but not the spot answer read properly after its fail-safe guess: one
// reclaim), or when the other was signalled more than checkpointDue ago (without a store,
// when the agent sees no checkpoint, that alone decides). A job notice covers nothing: a script
// may post one while the trainer saves nothing. Processes found since the other's signal (a
// trainer restarted) are signalled for it before (act), so that they save for it too. It reports
// whether ns was covered.
func (c *Coordinator) cover(ns *NoticeStatus, procs []trainer.Process, log zerolog.Logger) bool {
	c.mu.Lock()
	var by *NoticeStatus
	for _, o := range c.active {
		if o == ns || o.Policy != PolicyCheckpoint || noticeRank(o) > noticeRank(ns) || (o.written == "" && o.missingSaid) {
			continue
		}
		if o.Source == SourceJob || o.signalledAt == nil || time.Since(*o.signalledAt) > checkpointDue {
			// Not signalled (no trainer found, or it did not catch the signal); a job notice
			// (posted by the trainer as its save begins, or by a script, whose trainer may not
			// save); or signalled too long ago: a save older than a reclaim's window (a scheduled
			// event's, days before; one a store that is down holds back) is not a fresh one.
			continue
		}
		// The spot answer read properly after its fail-safe guess (a body that could not be
		// read): the same reclaim, whose save the trainer made, however its action reads.
		sameReclaim := o.Source == imds.SourceSpot && ns.Source == imds.SourceSpot && o.Malformed && !ns.Malformed
		if o.committed && o.signalledAt.Before(ns.readAt) && !o.committedAt.After(ns.readAt) && !sameReclaim {
			// Its save was asked for and durable before ns came: a new one can only add. (One
			// not durable yet when ns came, ns's hold included, is ns's save too, however
			// quickly it was committed since: a rebalance read while the reclaim's save was
			// written, committed during the rebalance's hold, was a second save.)
			continue
		}
		if by == nil || noticeRank(o) < noticeRank(by) || (noticeRank(o) == noticeRank(by) && o.Key < by.Key) {
			by = o
		}
	}
	if by == nil {
		c.mu.Unlock()
		return false
	}
	at := *by.signalledAt
	ns.signalledAt, ns.signalledPIDs, ns.handled = &at, slices.Clone(by.signalledPIDs), true
	ns.tried = maps.Clone(by.tried)
	if ns.tried == nil {
		ns.tried = map[int]uint64{}
	}
	for _, p := range procs {
		// One that did not catch the signal is not saving: once it does, it is signalled for
		// the notices in force (signalNew), this one too if the other has ended by then.
		if !by.notCaught[p.PID] {
			ns.tried[p.PID] = p.StartTicks
		}
	}
	saving, why := "is saving", "notice came while the trainer's save for a notice at least as severe is not durable yet"
	if by.committed {
		saving, why = "saved, after this notice came,", "the trainer saved for a notice at least as severe after this notice came"
	}
	c.mu.Unlock()
	c.transition(ns, StateTrainerSignalled, fmt.Sprintf("not signalled again: the trainer %s for %s (since %s), and that save is this notice's too",
		saving, by.Key, at.UTC().Format(time.RFC3339Nano)))
	log.Info().Str("covered_by", by.Key).Msg(why + ": not signalled again, so that it does not save twice in the window")
	// Its checkpoint is the first completed since that signal: not necessarily the other's, which
	// may have completed before it (the other notice came with no trainer to signal, and took
	// the next checkpoint completed).
	c.adoptCompleted(at)
	return true
}

// adoptCompleted tells onUpload again of the checkpoints completed since since that it heard of
// before a notice whose save began then was there to take them: the job's newest commit (found in
// the store at start, or committed since) and every complete checkpoint not committed, oldest
// first. A notice inherited from the agent's previous run, or sharing a save that began before it
// came, takes them as its checkpoint; the others are not moved (they saw them, or completedAfter
// says they are not theirs).
func (c *Coordinator) adoptCompleted(since time.Time) {
	c.mu.Lock()
	found := c.storeNewest
	var names []string
	for name, at := range c.complete {
		if !at.Before(since.Add(-checkpoint.FileTimeLag)) {
			names = append(names, name)
		}
	}
	slices.SortFunc(names, func(a, b string) int { return c.complete[a].Compare(c.complete[b]) })
	at := make([]time.Time, len(names))
	for i, name := range names {
		at[i] = c.complete[name]
	}
	c.mu.Unlock()
	if found != nil {
		c.onUpload(checkpoint.UploadEvent{Kind: checkpoint.CheckpointFound, Checkpoint: found.Checkpoint, At: time.Now(), Manifest: found})
	}
	for i, name := range names {
		c.onUpload(checkpoint.UploadEvent{Kind: checkpoint.CheckpointComplete, Checkpoint: name, At: at[i], CompletedAt: at[i]})
	}
	// One completed since and renamed away before the notice could see it (held, or read only
	// now) completes again under its new name: awaited as the notice's own would be.
	c.mu.Lock()
	defer c.mu.Unlock()
	for name, r := range c.renamed {
		if r.completed.Before(since.Add(-checkpoint.FileTimeLag)) || time.Since(r.at) > renameGrace {
			continue
		}
		for _, ns := range c.notices {
			if ns.Policy == PolicyCheckpoint && !ns.committed && ns.heldUntil.IsZero() && ns.renamed == "" && completedAfter(r.completed, ns) {
				ns.renamed, ns.renamedAt, ns.renamedDone = name, r.at, r.completed
			}
		}
	}
}

// procSignal is a trainer process's last signal: when, and for which notice (and its rank).
type procSignal struct {
	at   time.Time
	key  string
	rank int
}

// msgTrainerStopsCatchingDuringNotice is scan's line for a process that no longer catches the
// signal at two looks while a notice this agent did not signal for is in force (a job notice).
const msgTrainerStopsCatchingDuringNotice = "trainer process no longer catches the signal while a notice is in force: exiting after its save, most likely (Python resets its handlers as it shuts down); it is not signalled while so"

// msgTrainerSignalledStopsCatching is scan's line for a process signalled for a notice that no
// longer catches the signal at two looks.
const msgTrainerSignalledStopsCatching = "trainer process signalled for a notice no longer catches the signal: exiting after its save, most likely (Python resets its handlers as it shuts down); it is not signalled while so"

// savingFor returns the notice process pid is saving for, and when it was signalled for it, if
// that save is ns's too: the process was signalled for another notice in force at least as severe
// less than checkpointDue ago, and no checkpoint completed since is committed (as cover, for one
// process: one found during a notice is signalled on its own, after the notice's first signal).
// "" if not. Called with c.mu held.
func (c *Coordinator) savingFor(pid int, ns *NoticeStatus) (string, time.Time) {
	ps, ok := c.procSignals[pid]
	if !ok || ps.key == ns.Key || ps.rank > noticeRank(ns) || time.Since(ps.at) > checkpointDue {
		return "", time.Time{}
	}
	if c.active[ps.key] == nil {
		return "", time.Time{} // ended
	}
	if n := c.storeNewest; n != nil && !n.Order().At.Before(ps.at.Add(-checkpoint.FileTimeLag)) && ps.at.Before(ns.readAt) {
		return "", time.Time{} // its save is durable and was asked for before ns came: a new one can only add
	}
	return ps.key, ps.at
}

// signal sends sig to procs for ns, records each outcome in ns (Signals, signalledPIDs, tried)
// and the metrics, logs it, and returns how many were sent. A process in forks (see forksOf) that
// is sent the signal is logged at Debug.
func (c *Coordinator) signal(ns *NoticeStatus, procs []trainer.Process, sig syscall.Signal, log zerolog.Logger, forks map[int]bool) (int, []trainer.Result) {
	results := c.trainers.Signal(procs, sig)
	ticks := make(map[int]uint64, len(procs))
	for _, p := range procs {
		ticks[p.PID] = p.StartTicks
	}
	sent := 0
	// A process not catching the signal beside one that was sent it is a launcher or a shell
	// (torchrun's agent, bash -c): a warning, as scan says it. An error at every notice, for a
	// trainer.match that also matches torchrun, cried wolf (found from outside).
	// One sent it earlier for the notice (by the agent's previous run too, for one whose
	// processes found since are signalled alone) counts: found from outside, tini was an error
	// after a restart, its trainer signalled before.
	c.mu.Lock()
	beside := len(ns.signalledPIDs) > 0
	c.mu.Unlock()
	beside = beside || slices.ContainsFunc(results, func(r trainer.Result) bool { return r.Outcome == trainer.OutcomeSent })
	for _, r := range results {
		out := SignalOutcome{PID: r.PID, Cmdline: r.Cmdline, Outcome: r.Outcome, At: time.Now()}
		if r.Err != nil {
			out.Error = r.Err.Error()
		}
		c.mu.Lock()
		again := ns.notCaught[r.PID]
		if r.Outcome == trainer.OutcomeNotCaught {
			// Not tried: a trainer still starting up (a launcher or a shim that execs the
			// interpreter, imports that take seconds) installs its handler later, and the next
			// scan looks again.
			if ns.notCaught == nil {
				ns.notCaught = map[int]bool{}
			}
			ns.notCaught[r.PID] = true
		} else {
			if ns.tried == nil {
				ns.tried = map[int]uint64{}
			}
			ns.tried[r.PID] = ticks[r.PID]
		}
		if r.Outcome == trainer.OutcomeSent {
			ns.signalledPIDs = append(ns.signalledPIDs, r.PID)
			now := time.Now()
			maps.DeleteFunc(c.procSignals, func(_ int, ps procSignal) bool { return now.Sub(ps.at) > checkpointDue })
			c.procSignals[r.PID] = procSignal{at: now, key: ns.Key, rank: noticeRank(ns)}
		}
		if !again || r.Outcome != trainer.OutcomeNotCaught {
			ns.Signals = append(ns.Signals, out)
		}
		c.mu.Unlock()
		if again && r.Outcome == trainer.OutcomeNotCaught {
			continue // said when first found
		}
		c.metrics.signals.WithLabelValues(string(r.Outcome)).Inc()
		l := log.With().Int("pid", r.PID).Str("signal", trainer.SignalName(sig)).Str("cmdline", r.Cmdline).Logger()
		switch r.Outcome {
		case trainer.OutcomeSent:
			sent++
			switch {
			case again:
				l.Warn().Msg("trainer signalled once it caught the signal (it did not when the notice came)")
			case forks[r.PID]:
				l.Debug().Msg("trainer signalled, a fork of a trainer process signalled before")
			default:
				l.Info().Msg("trainer signalled")
			}
		case trainer.OutcomeNotCaught:
			if beside {
				l.Warn().Msg("process found that does not catch the signal, beside one that was sent it: NOT sent (its default action would kill it); fine for a launcher or a shell, which the trainer.* keys need not match")
				break
			}
			l.Error().Msg("trainer does not catch the signal; NOT sent, because its default action would kill the trainer; looked at again every second while the notice is in force")
		case trainer.OutcomeGone:
			l.Warn().Msg("trainer process exited before it could be signalled")
		default:
			l.Error().Err(r.Err).Msg("cannot signal trainer")
		}
	}
	return sent, results
}

// signalNew (called on the coordinator's loop only, as begin is) signals, for every checkpoint
// notice in force that begin has handled, the trainer
// processes among procs not tried for it yet: a trainer restarted during the notice (torchrun's
// workers after a crash have new PIDs), one started after the notice came, or one that did not
// catch the signal when last looked at. Each is signalled once per notice, as those found when it
// came were. Only notices at least as severe as rank (noticeRank) are looked at.
func (c *Coordinator) signalNew(cfg *Config, procs []trainer.Process, rank int) {
	changed := false
	alive := make(map[int]bool, len(procs))
	for _, p := range procs {
		alive[p.PID] = true
	}
	// A process is signalled once here, for the most severe notice that had not tried it; the
	// others count it as signalled for them too (one save, as at a notice that comes while the
	// trainer saves for another: cover).
	sentFor := map[int]string{}
	for _, ns := range c.inForce() {
		if noticeRank(ns) > rank {
			continue
		}
		c.mu.Lock()
		ns.trimGone(alive)
		var fresh []trainer.Process
		other := ""
		if ns.handled && ns.Source != SourceJob {
			for _, p := range procs {
				if key, _ := c.savingFor(p.PID, ns); key != "" && sentFor[p.PID] == "" {
					sentFor[p.PID] = key // signalled before this round, for a notice at least as severe
				}
				switch {
				case ns.wasTried(p):
				case sentFor[p.PID] != "":
					if ns.tried == nil {
						ns.tried = map[int]uint64{}
					}
					ns.tried[p.PID] = p.StartTicks
					ns.signalledPIDs = append(ns.signalledPIDs, p.PID)
					other = sentFor[p.PID]
				default:
					fresh = append(fresh, p)
				}
			}
		}
		first := ns.signalledAt == nil
		state := ns.State
		c.mu.Unlock()
		if other != "" {
			changed = true // notice.json lists the processes
		}
		log := c.log.With().Str("notice", ns.Key).Logger()
		sent, results := 0, []trainer.Result(nil)
		forks := forksOf(fresh, procs)
		if len(fresh) > 0 {
			sent, results = c.signal(ns, fresh, cfg.Trainer.Signal, log, forks)
			for _, r := range results {
				if r.Outcome == trainer.OutcomeSent {
					sentFor[r.PID] = ns.Key
				}
			}
		}
		if sent == 0 {
			if other != "" && first {
				// Its processes that can save are saving for other: so is it. (The others, not
				// catching the signal yet, are tried again at the next scan.)
				c.mu.Lock()
				if ns.signalledAt == nil {
					now := time.Now()
					ns.signalledAt = &now // the checkpoint_missing timer starts now
				}
				state = ns.State
				c.mu.Unlock()
				if state == StateTrainerNotSignalled { // not a notice further on (its checkpoint written, or committed)
					c.transition(ns, StateTrainerSignalled, "signalled for "+other+", whose save is this notice's too; not twice")
				}
			}
			continue
		}
		changed = true
		now := time.Now()
		c.mu.Lock()
		if ns.signalledAt == nil {
			ns.signalledAt = &now // the checkpoint_missing timer starts now
		}
		state = ns.State
		c.mu.Unlock()
		detail := fmt.Sprintf("%d of %d trainer processes found after the notice came", sent, len(results))
		if state == StateTrainerSignalled || state == StateTrainerNotSignalled {
			c.transition(ns, StateTrainerSignalled, detail)
		}
		lev := log.Warn()
		if len(forks) == len(fresh) {
			lev = log.Debug() // a DataLoader's new workers, their parents signalled before
		}
		lev.Int("signalled", sent).Bool("first", first).
			Msg("trainer processes found during the notice that were not signalled for it (restarted, or started since); signalled now")
	}
	if changed {
		c.noticesChanged(cfg) // notice.json names them; a stop waits for their checkpoint
	}
}

// forksOf returns the PIDs of those of fresh that are a fork of a process in procs that is not in
// fresh, with its command line: a DataLoader's worker whose rank was signalled before.
func forksOf(fresh, procs []trainer.Process) map[int]bool {
	byPID := make(map[int]trainer.Process, len(procs))
	for _, p := range procs {
		byPID[p.PID] = p
	}
	for _, p := range fresh {
		delete(byPID, p.PID)
	}
	forks := map[int]bool{}
	for _, p := range fresh {
		if parent, ok := byPID[p.PPID]; ok && parent.Cmdline == p.Cmdline {
			forks[p.PID] = true
		}
	}
	return forks
}

// wasTried reports whether p was tried for ns: its PID was, by p (the same start ticks; one
// started since has the PID reused), or by a process whose start is unknown. Called with c.mu
// held.
func (ns *NoticeStatus) wasTried(p trainer.Process) bool {
	ticks, ok := ns.tried[p.PID]
	return ok && (ticks == 0 || p.StartTicks == 0 || ticks == p.StartTicks)
}

// maxSignalRecords bounds what a notice keeps of the trainer processes it signalled or tried
// (signalledPIDs, tried, notCaught, Signals): a DataLoader starts new workers every epoch (forks
// of the rank, with its command line: found, and signalled, too), and a rebalance recommendation
// stays in force for the instance's life.
const maxSignalRecords = 256

// trimGone drops the records of processes not alive now (not found by the last scan) from each
// of ns's records that holds more than maxSignalRecords, counting the outcomes dropped from
// Signals in SignalsOmitted. A process found again with a PID dropped is a new one (the PID
// reused), signalled as such. Called with c.mu held.
func (ns *NoticeStatus) trimGone(alive map[int]bool) {
	gone := func(pid int) bool { return !alive[pid] }
	if len(ns.signalledPIDs) > maxSignalRecords {
		ns.signalledPIDs = slices.DeleteFunc(ns.signalledPIDs, gone)
	}
	if len(ns.tried) > maxSignalRecords {
		maps.DeleteFunc(ns.tried, func(pid int, _ uint64) bool { return gone(pid) })
	}
	if len(ns.notCaught) > maxSignalRecords {
		maps.DeleteFunc(ns.notCaught, func(pid int, _ bool) bool { return gone(pid) })
	}
	if n := len(ns.Signals); n > maxSignalRecords {
		ns.Signals = slices.DeleteFunc(ns.Signals, func(o SignalOutcome) bool { return gone(o.PID) })
		ns.SignalsOmitted += n - len(ns.Signals)
	}
}

// detect records a notice that begins at at: a new active NoticeStatus in state detected (with
// detail), counted in the metrics and logged; with policy ignore it moves on to ignored at once.
// with, if not nil, fills in more of it before anyone else can see it.
func (c *Coordinator) detect(cfg *Config, n imds.Notice, at time.Time, detail string, with func(*NoticeStatus)) *NoticeStatus {
	policy := cfg.Notices[n.Source]
	ns := &NoticeStatus{
		Key: n.Key(), Source: n.Source, Action: n.Action, EventID: n.EventID,
		Policy: policy, Malformed: n.Malformed, Active: true, detectedAt: at, readAt: at, notAfter: n.NotAfter,
	}
	if !n.Deadline.IsZero() {
		d := n.Deadline
		ns.Deadline = &d
	}
	if with != nil {
		with(ns)
	}
	log := c.log.With().Str("notice", ns.Key).Logger()
	c.metrics.notices.WithLabelValues(string(n.Source), n.Action).Inc()
	c.record(metrics.Datum{Name: "Notices", Unit: metrics.UnitCount, Value: 1,
		Dimensions: map[string]string{"Source": string(n.Source), "Action": n.Action}})
	if ns.readAt.Before(at) && detail == "" {
		detail = "in force since before the agent restarted: its previous run read it at " + ns.readAt.UTC().Format(time.RFC3339Nano)
	}
	c.add(ns, StateDetected, at, detail)
	ev := log.Warn().Str("source", string(n.Source)).Str("action", n.Action).Str("policy", string(policy))
	if ns.Deadline != nil {
		ev = ev.Time("deadline", *ns.Deadline).Float64("time_left_s", logSeconds(time.Until(*ns.Deadline)))
	}
	if ns.readAt.Before(at) {
		// Read by the agent's previous run (a restart during the notice): the same notice, not
		// another (found from outside: a pipeline counting this line counted one reclaim per
		// restart).
		ev.Bool("malformed", n.Malformed).Time("detected_at", ns.readAt).Msg("interruption notice in force since before the agent restarted")
	} else {
		ev.Bool("malformed", n.Malformed).Msg("interruption notice detected")
	}
	if policy == PolicyIgnore {
		c.transition(ns, StateIgnored, "policy is ignore")
		log.Info().Msg("notice ignored by policy")
	}
	return ns
}

func (c *Coordinator) end(ev imds.Event) {
	key := ev.Notice.Key()
	c.mu.Lock()
	ns, ok := c.active[key]
	c.mu.Unlock()
	if !ok {
		return
	}
	c.transition(ns, StateEnded, "withdrawn by IMDS")
	c.log.Info().Str("notice", key).Msg("notice ended")
	if ns.Policy == PolicyCheckpoint {
		c.noticesChanged(c.config())
	}
}

// inForce returns the notices in force whose policy is checkpoint, most severe first: spot
// terminate, stop, hibernate, then scheduled events, ASG, rebalance (a job notice ranks as its
// action does); the earliest deadline first among equals, and the agent's own (IMDS) notice before
// a job notice of the same rank and deadline.
func (c *Coordinator) inForce() []*NoticeStatus {
	c.mu.Lock()
	defer c.mu.Unlock()
	var out []*NoticeStatus
	for _, ns := range c.active {
		if ns.Policy == PolicyCheckpoint {
			out = append(out, ns)
		}
	}
	slices.SortFunc(out, noticeOrder)
	return out
}

// noticeOrder orders notices most severe first (noticeRank), then the earliest deadline first,
// then the agent's own (IMDS) notice before a job notice, then by key.
func noticeOrder(a, b *NoticeStatus) int {
	if r := cmp.Compare(noticeRank(a), noticeRank(b)); r != 0 {
		return r
	}
	switch {
	case a.Deadline != nil && b.Deadline == nil:
		return -1
	case a.Deadline == nil && b.Deadline != nil:
		return 1
	case a.Deadline != nil && !a.Deadline.Equal(*b.Deadline):
		return a.Deadline.Compare(*b.Deadline)
	}
	if aj, bj := a.Source == SourceJob, b.Source == SourceJob; aj != bj {
		if aj {
			return 1
		}
		return -1
	}
	return cmp.Compare(a.Key, b.Key)
}

// noticeRank orders notices by severity: lower is more severe. A job notice ranks as an IMDS
// notice with its action would (jobActionRank).
func noticeRank(ns *NoticeStatus) int {
	switch ns.Source {
	case SourceJob:
		return jobActionRank(ns.Action)
	case imds.SourceSpot:
		switch ns.Action {
		case "stop":
			return 1
		case "hibernate":
			return 2
		}
		return 0 // terminate, and a malformed spot notice
	case imds.SourceScheduled:
		return 3
	case imds.SourceASG:
		return 4
	case imds.SourceRebalance:
		return 5
	}
	return 6
}

// noticesChanged tells the uploader which notices are in force and rewrites notice.json (removes
// it when none is).
func (c *Coordinator) noticesChanged(cfg *Config) {
	active := c.inForce()
	if c.uploader != nil {
		un := make([]checkpoint.ActiveNotice, 0, len(active))
		c.mu.Lock()
		for _, ns := range active {
			n := checkpoint.ActiveNotice{Key: ns.Key}
			if ns.Deadline != nil {
				n.Deadline = *ns.Deadline
			}
			if ns.signalledAt != nil {
				n.SignalledAt = *ns.signalledAt
			}
			if ns.Source == SourceJob {
				// The trainer sent it: it is writing a checkpoint for it, and a stop waits for
				// that checkpoint as for one the agent signalled.
				n.SignalledAt, n.Posted = ns.detectedAt, true
			}
			un = append(un, n)
		}
		c.mu.Unlock()
		c.uploader.SetNotices(un)
	}
	c.rewriteNoticeFile(cfg, active)
}

// rewriteNoticeFile writes notice.json for active, the notices in force.
func (c *Coordinator) rewriteNoticeFile(cfg *Config, active []*NoticeStatus) {
	err := c.writeNoticeFile(cfg, active)
	if err != nil {
		// The signal matters more than the file: go on.
		c.log.Error().Err(err).Msg("cannot write notice file")
	}
	c.setNoticeFileProblem(err)
}

// writeNoticeFile writes notice.json for active, with their signals, and the notices an earlier
// run's notice.json named that this run has not read the source of yet (carried).
func (c *Coordinator) writeNoticeFile(cfg *Config, active []*NoticeStatus) error {
	signalled := map[*NoticeStatus]signalRecord{}
	c.mu.Lock()
	for _, ns := range active {
		if ns.signalledAt == nil {
			continue
		}
		signalled[ns] = signalRecord{At: *ns.signalledAt, PIDs: slices.Clone(ns.signalledPIDs)}
	}
	if len(c.carried) > 0 {
		all := slices.Clone(active)
		// One this run holds is written as it holds it, and no longer carried: it may end.
		c.carried = slices.DeleteFunc(c.carried, func(e noticeEntry) bool {
			return slices.ContainsFunc(active, func(ns *NoticeStatus) bool { return ns.Key == e.key() })
		})
		for _, e := range c.carried {
			ns := e.status()
			all = append(all, ns)
			if e.SignalledAt != nil {
				signalled[ns] = signalRecord{At: *e.SignalledAt, PIDs: e.SignalledPIDs}
			}
		}
		slices.SortFunc(all, noticeOrder)
		active = all
	}
	c.mu.Unlock()
	return writeNoticeFile(cfg.Agent.RuntimeDir, active, signalled)
}

// carriedReads is how many of the loop's beats must find a source read (its first read by this
// run done) before a notice an earlier run's notice.json named of it is no longer carried: the
// notice, if that read had it, has been acted on by then (the read's events are sent after its
// stats are kept).
const carriedReads = 2

// settleCarried stops carrying, and rewrites notice.json without, each notice an earlier run's
// notice.json named whose source this run has read (carriedReads beats ago: were the notice
// still in force, this run holds it now), or no longer polls, or that has been carried for
// previousSignalWithin (its source failing all along).
func (c *Coordinator) settleCarried(now time.Time) {
	c.mu.Lock()
	if len(c.carried) == 0 {
		c.mu.Unlock()
		return
	}
	n := len(c.carried)
	c.carried = slices.DeleteFunc(c.carried, func(e noticeEntry) bool {
		polled, read := true, true
		if c.sourceRead != nil {
			polled, read = c.sourceRead(e.Source)
		}
		if read {
			c.carriedSeen[e.Source]++
		}
		return !polled || c.carriedSeen[e.Source] >= carriedReads || now.Sub(c.startedAt) >= previousSignalWithin
	})
	settled := len(c.carried) < n
	c.mu.Unlock()
	if settled {
		c.rewriteNoticeFile(c.config(), c.inForce())
	}
}

// noticeFileRetry is how often notice.json is written again while its last write failed.
const noticeFileRetry = 5 * time.Second

// retryNoticeFile writes notice.json again, if its last write failed and noticeFileRetry has
// passed since the last try: it was written only when the notices changed, so an
// agent.runtime_dir full (or read-only) at a notice and fixed seconds later left the trainer
// without the notice's deadline, and a restart without the record of its signal, for the whole
// notice (found from outside). A failure again is not logged again: the first one was, and
// /healthz says it.
func (c *Coordinator) retryNoticeFile(now time.Time) {
	if c.noticeFileProblem() == nil || now.Sub(c.noticeFileTried) < noticeFileRetry {
		return
	}
	c.noticeFileTried = now
	err := c.writeNoticeFile(c.config(), c.inForce())
	if err == nil {
		c.log.Info().Msg("notice file written, after failing")
	}
	c.setNoticeFileProblem(err)
}

// countMissing counts ns's checkpoint gone missing, for reason: the metric, and CloudWatch's one
// datum of such a notice (no NoticeToDurableSeconds or DeadlineMarginSeconds comes for it, so an
// alarm on those has nothing to fire on).
func (c *Coordinator) countMissing(ns *NoticeStatus, reason string) {
	c.metrics.checkpointMissing.WithLabelValues(string(ns.Source), reason).Inc()
	c.record(metrics.Datum{Name: "CheckpointMissing", Unit: metrics.UnitCount, Value: 1,
		Dimensions: map[string]string{"Source": string(ns.Source), "Reason": reason}})
}

// record sends notice-path datums at 1-second resolution and flushes the sink at once, so the
// story reaches CloudWatch before the instance is gone. They are in the default set, with
// aggregate copies (metrics.cloudwatch_aggregate): a fleet's notices and margins in one series.
// It never waits on the sink.
func (c *Coordinator) record(ds ...metrics.Datum) {
	if c.sink == nil {
		return
	}
	now := time.Now()
	for i := range ds {
		ds[i].HighRes = true
		ds[i].Aggregate = true
		ds[i].At = now
	}
	c.sink.Record(ds...)
	c.sink.FlushNow()
}

// add puts a new notice in its first state.
func (c *Coordinator) add(ns *NoticeStatus, state string, at time.Time, detail string) {
	c.mu.Lock()
	defer c.mu.Unlock()
	ns.State = state
	ns.Transitions = append(ns.Transitions, Transition{State: state, At: at, Detail: detail})
	c.notices = append(c.notices, ns)
	if len(c.notices) > maxNoticeHistory {
		c.notices = slices.Delete(c.notices, 0, len(c.notices)-maxNoticeHistory)
	}
	c.active[ns.Key] = ns
}

// missing moves ns to checkpoint_missing (reason), what its error line said (msg) kept for
// /status.
func (c *Coordinator) missing(ns *NoticeStatus, reason, msg string) {
	c.mu.Lock()
	ns.Missing = msg
	c.mu.Unlock()
	c.transition(ns, StateCheckpointMissing, reason)
}

// withheldAfterMarker says why a checkpoint is withheld whose error err (ErrWrittenAfterMarker)
// names the file written after its marker.
func withheldAfterMarker(err error) string {
	return "a file of it was written after its marker (" + strings.TrimPrefix(err.Error(), checkpoint.ErrWrittenAfterMarker.Error()+": ") +
		"), so it is not complete and not committed: write the marker last, after every file of the save (written again with its marker, it is committed)"
}

func (c *Coordinator) transition(ns *NoticeStatus, state, detail string) {
	now := time.Now()
	c.mu.Lock()
	defer c.mu.Unlock()
	ns.Transitions = append(ns.Transitions, Transition{
		State: state, At: now, Detail: detail,
		SinceDetectedMS: float64(now.Sub(ns.detectedAt).Microseconds()) / 1000,
	})
	if state == StateCommitted {
		ns.Missing = "" // its checkpoint came late, and is committed
	}
	if state == StateEnded {
		ns.Active, ns.endedAt = false, now
		delete(c.active, ns.Key)
		return
	}
	ns.State = state
	c.log.Info().Str("notice", ns.Key).Str("state", state).Str("detail", detail).
		Float64("since_detected_s", logSeconds(now.Sub(ns.detectedAt))).Msg("notice state changed")
}

// trainerThere reports whether a trainer process is running now, found as at a notice: the
// checkpoint_missing reason, and whether a stop still waits for the signalled checkpoint.
func (c *Coordinator) trainerThere() bool {
	procs, _ := c.find(c.config())
	return len(procs) > 0
}

// checkMissing reports, once per notice, a trainer signalled for a checkpoint notice that wrote
// no checkpoint by the notice's deadline (or within checkpointDue of the signal, when the
// deadline had passed or is further): an error log, spotguard_notice_checkpoint_missing_total and
// the state checkpoint_missing. What was committed before, and any complete checkpoint being
// uploaded, is all the next instance will have.
// dirReadGrace is how long after its start checkMissing waits for the uploader's first full read
// of checkpoint.dir (a directory that is not there, or a read that hangs, is not waited for
// longer).
const dirReadGrace = 10 * time.Second

func (c *Coordinator) checkMissing(now time.Time) {
	if c.uploader == nil {
		return // signal only: the agent does not see checkpoints
	}
	c.mu.Lock()
	if !c.dirRead && !c.startedAt.IsZero() && now.Sub(c.startedAt) < dirReadGrace {
		c.mu.Unlock()
		return // what is on disk is not known yet
	}
	// A notice due, with what its line says, read under the lock (onUpload sets them).
	type missing struct {
		ns                *NoticeStatus
		again             bool
		renamed, withheld string
		withheldErr       error
		withheldGone      string
		signalledAt       time.Time
		notSignalled      bool
		notSignalledBy    string
		// atDeadline: said at the notice's deadline, sooner than checkpointDue after the signal.
		atDeadline bool
	}
	var due []missing
	for _, ns := range c.active {
		// A checkpoint renamed away is awaited under its new name for renameGrace, and said
		// missing then if it never completed (moved out of the directory), even when the
		// notice was said missing before it came, and when the trainer was not signalled for
		// it (a job notice, or no trainer found): it was the notice's checkpoint all the same.
		// One whose signal found no trainer to signal is said missing as a signalled one is,
		// from when it was tried.
		renamed := ns.renamed != ""
		notSignalled := ns.signalledAt == nil && !ns.notSignalledAt.IsZero()
		if (ns.signalledAt == nil && !renamed && !notSignalled) || ns.written != "" || ns.Policy != PolicyCheckpoint {
			continue
		}
		if ns.missingSaid && !renamed {
			continue
		}
		var by, signalledAt, from time.Time
		switch {
		case ns.signalledAt != nil:
			signalledAt = *ns.signalledAt
			from = signalledAt
		case notSignalled && !renamed: // (renamed away, it is awaited as before: renameGrace)
			from = ns.notSignalledAt
		}
		atDeadline := false
		if !from.IsZero() {
			by = from.Add(checkpointDue)
			if ns.Deadline != nil && ns.Deadline.After(from) && ns.Deadline.Before(by) {
				by, atDeadline = *ns.Deadline, true
			}
		}
		if renamed && ns.renamedAt.Add(renameGrace).After(by) {
			by = ns.renamedAt.Add(renameGrace)
		}
		if now.Before(by) {
			continue
		}
		m := missing{ns: ns, again: ns.missingSaid, withheld: ns.withheld, withheldErr: ns.withheldErr, withheldGone: ns.withheldGone, signalledAt: signalledAt,
			notSignalled: notSignalled && !renamed, notSignalledBy: ns.notSignalledBy, atDeadline: atDeadline && !renamed}
		m.renamed, ns.renamed = ns.renamed, "" // said once per rename
		ns.missingSaid = true
		due = append(due, m)
	}
	c.mu.Unlock()
	if len(due) == 0 {
		return
	}
	there := c.trainerThere()
	for _, m := range due {
		ns := m.ns
		reason := "trainer_gone"
		why := "the trainer is gone (it exited or was killed before its checkpoint completed)"
		switch {
		case m.renamed != "": // awaited under its new name (the notice's own time is up)
			reason = missingRenamedAway
			why = "the trainer wrote " + m.renamed + " and its marker, and it was renamed away before its commit, but nothing completed since under a new name in " +
				c.config().Checkpoint.Dir + " (moved out of it?): rename a checkpoint within checkpoint.dir, and move it elsewhere only once it is committed"
		case m.withheldGone != "" && m.withheld == "":
			reason = MissingDeleted
			why = "the trainer wrote " + m.withheldGone + " and its marker, but it was withheld, not committed (a file of it, or its name, cannot be stored), and it is gone since (deleted, or renamed out of " +
				c.config().Checkpoint.Dir + ")"
		case m.withheld != "":
			reason = MissingWithheld
			what := "a file of it cannot be stored, so it is withheld, not committed (its error says which file and what to do)"
			if m.withheldErr != nil {
				// Said here too (found from outside: the drill shows errors only, and its
				// reason sent the user to the uploader's line it did not show).
				what = "a file of it cannot be stored (" + m.withheldErr.Error() + "), so it is withheld, not committed"
			}
			if errors.Is(m.withheldErr, checkpoint.ErrWrittenAfterMarker) {
				what = withheldAfterMarker(m.withheldErr)
			}
			if checkpoint.ValidName(m.withheld) != nil {
				what = "the store cannot hold that name, so it is withheld, not committed: rename the checkpoint (its error says why)"
			}
			why = "the trainer wrote " + m.withheld + " and its marker, but " + what
		case m.notSignalled:
			reason = missingNotSignalled
			why = "no trainer process could be signalled for it (" + m.notSignalledBy + "), and the trainer saved nothing on its own"
		case there && m.atDeadline:
			// A deadline sooner than a save takes (found from outside: for one 0.28 s away, the
			// advice was to catch the signal, and the save came 1.8 s later).
			reason = "no_marker"
			why = fmt.Sprintf("the trainer is still running and its checkpoint's marker had not come by the notice's deadline, %s after the signal: "+
				"a save that completes now is still committed, but too late for this notice if the instance goes at its deadline (save more often, or faster); if none comes, check that it saves on %s and writes %s last",
				now.Sub(m.signalledAt).Round(10*time.Millisecond), trainer.SignalName(c.config().Trainer.Signal), c.config().Checkpoint.Marker)
		case there:
			reason = "no_marker"
			why = "the trainer is still running but its checkpoint's marker never came: check that it saves on " +
				trainer.SignalName(c.config().Trainer.Signal) + " and writes " + c.config().Checkpoint.Marker + " last"
		}
		if h := c.markerHint(); h != "" && (reason == "trainer_gone" || reason == "no_marker") {
			// A save complete under another name than checkpoint.marker is no crash (found from
			// outside: a trainer writing _COMPLETE under .metadata was said to be gone).
			why += "; but " + h + ": is checkpoint.marker the name the trainer writes last?"
		}
		if m.again {
			// Said and counted once: a notice said missing before, whose checkpoint came since
			// and was renamed away, says it again, and that is all.
			c.transition(ns, StateCheckpointMissing, reason)
			continue
		}
		c.countMissing(ns, reason)
		ev := c.log.Error().Str("notice", ns.Key).Str("reason", reason)
		since := "since the trainer was signalled for this notice"
		if m.signalledAt.IsZero() {
			since = "for this notice (the trainer was not signalled for it)"
		} else {
			ev.Float64("since_signal_s", logSeconds(now.Sub(m.signalledAt)))
		}
		msg := "no checkpoint completed " + since + ": " + why +
			"; only checkpoints saved before (committed, or still being uploaded) will be there to restore"
		ev.Msg(msg)
		c.missing(ns, reason, msg)
	}
}

// markerHint is the uploader's MarkerHint, "" without an uploader.
func (c *Coordinator) markerHint() string {
	if c.uploader == nil {
		return ""
	}
	return c.uploader.MarkerHint()
}

// Scan looks for trainer processes and reports, loudly, each newly found one that does not catch
// trainer.signal. Problems (no match, stale pidfile, …) are logged when they change.
// hasScanned reports whether Scan has looked for the trainer yet.
func (c *Coordinator) hasScanned() bool {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.scanned
}

// activeOf returns the keys of the notices of src in force with a policy other than policy.
func (c *Coordinator) activeOf(src imds.Source, policy Policy) []string {
	c.mu.Lock()
	defer c.mu.Unlock()
	var keys []string
	for _, ns := range c.active {
		if ns.Source == src && ns.Policy != policy {
			keys = append(keys, ns.Key)
		}
	}
	slices.Sort(keys)
	return keys
}

func (c *Coordinator) Scan() { c.scan(c.config()) }

// scan is Scan with cfg; it returns the processes found.
func (c *Coordinator) scan(cfg *Config) []trainer.Process {
	c.mu.Lock()
	c.scanSeq++
	seq := c.scanSeq
	c.mu.Unlock()
	procs, problems := c.find(cfg)
	sig := cfg.Trainer.Signal
	c.mu.Lock()
	prev := map[int]TrainerStatus{}
	for _, t := range c.found {
		prev[t.PID] = t
	}
	wasStopped := c.stoppedCatching
	c.mu.Unlock()

	stopped := map[int]bool{}
	cmdlines := make(map[int]string, len(procs))
	for _, p := range procs {
		cmdlines[p.PID] = p.Cmdline
	}
	found := make([]TrainerStatus, 0, len(procs))
	uncaught := 0
	catches := make(map[int]bool, len(procs))
	anyCatches := false
	for _, p := range procs {
		caught, err := c.trainers.Catches(p.PID, sig)
		if err != nil {
			continue // exited since Find
		}
		catches[p.PID] = caught
		anyCatches = anyCatches || caught
	}
	// The processes signalled for a notice lately: one that stops catching the signal after it
	// is most likely exiting after its save.
	c.mu.Lock()
	sent := make(map[int]bool, len(c.procSignals))
	for pid := range c.procSignals {
		sent[pid] = true
	}
	c.mu.Unlock()
	// A notice in force that this agent did not signal for (a job notice: the other node's
	// trainers were signalled, and these ranks save and exit with it).
	noticeNow := len(c.inForce()) > 0
	for _, p := range procs {
		caught, ok := catches[p.PID]
		if !ok {
			continue
		}
		ts := TrainerStatus{PID: p.PID, Cmdline: p.Cmdline, Via: p.Via, CatchesSignal: caught, Signal: trainer.SignalName(sig)}
		old, seen := prev[p.PID]
		ts.young = !caught && !p.Started.IsZero() && time.Since(p.Started) < handlerGrace
		switch {
		case !seen || caught || old.Signal != ts.Signal || !old.CatchesSignal:
			// Said as it is (new, catching, or not catching before either).
		case !wasStopped[p.PID]:
			// It caught the signal at the last scan: exiting, most likely (Python resets its
			// handlers as it shuts down). Said at the next scan if it is still there.
			stopped[p.PID] = true
			ts.CatchesSignal = true
			found = append(found, ts)
			c.log.Debug().Int("pid", p.PID).Str("cmdline", p.Cmdline).Str("signal", ts.Signal).
				Msg("trainer process no longer catches the signal (exiting?); said at the next look if it is still there")
			continue
		}
		found = append(found, ts)
		if !caught {
			uncaught++
		}
		if seen && old.CatchesSignal == caught && old.Signal == ts.Signal && (caught || old.young == ts.young) {
			continue
		}
		l := c.log.With().Int("pid", p.PID).Str("via", p.Via).Str("cmdline", p.Cmdline).Str("signal", ts.Signal).Logger()
		switch parent, ok := cmdlines[p.PPID]; {
		case caught && ok && parent == p.Cmdline:
			// A fork of a trainer process: a DataLoader's workers are new every epoch, and a
			// line at Info for each would be noise.
			l.Debug().Int("parent", p.PPID).Msg(msgTrainerFork)
		case caught:
			l.Info().Msg("trainer found; it catches the signal")
		case ts.young:
			l.Info().Float64("since_start_s", logSeconds(time.Since(p.Started))).
				Msg("trainer found; it does not catch the signal yet (a trainer installs its handler as it starts); looked at again at every scan")
		case anyCatches:
			l.Warn().Msg(msgTrainerBeside)
		case seen && old.CatchesSignal && old.Signal == ts.Signal && sent[p.PID]:
			// Signalled, it caught the signal; its teardown (torch, gloo, a DataLoader's workers)
			// may take seconds with its handlers reset: an error telling the user to install a
			// handler they have was wrong (found from outside, with torchrun).
			l.Warn().Msg(msgTrainerSignalledStopsCatching)
		case seen && old.CatchesSignal && old.Signal == ts.Signal && noticeNow:
			// (Another trainer.signal since a reload is another question: the error below.)
			// The same, on a node told of the notice by another (POST /notice), whose trainer
			// saves and exits with the job (found from outside: the error line).
			l.Warn().Msg(msgTrainerStopsCatchingDuringNotice)
		default:
			l.Error().Msg("trainer found but it does NOT catch the signal: on a notice it will not be signalled (the default action would kill it); install a handler in the trainer")
		}
	}
	var reasons []string
	for _, p := range problems {
		reasons = append(reasons, p.Reason+": "+p.Detail)
	}
	problemText := strings.Join(reasons, "; ")

	c.mu.Lock()
	if seq < c.foundSeq {
		// A newer look ended first: its answer stands.
		c.mu.Unlock()
		return procs
	}
	changed := problemText != c.lastProblems
	c.lastProblems = problemText
	c.found, c.scanned, c.stoppedCatching, c.foundSeq = found, true, stopped, seq
	// Set under mu, so that the gauges are the answer kept.
	c.metrics.trainerProcesses.Set(float64(len(found)))
	c.metrics.trainerUncaught.Set(float64(uncaught))
	c.mu.Unlock()

	if changed && problemText != "" {
		for _, p := range problems {
			c.metrics.discoveryProblems.WithLabelValues(p.Reason).Inc()
		}
		if len(found) > 0 {
			// Found another way (trainer.match, with a pidfile not written yet): not "not found"
			// (found from outside).
			c.log.Warn().Str("problems", problemText).Int("found", len(found)).
				Msg("a way of finding the trainer found nothing; the trainer was found another way")
		} else {
			c.log.Warn().Str("problems", problemText).Msg("trainer not found")
		}
	}
	return procs
}

// trainerWarnings are the /healthz warnings on the trainer as the last scan found it, each long
// and short: no process found (with the discovery problems), or processes found of which none
// catches trainer.signal. A notice now would signal none: its checkpoint would be missing. They
// are warnings, not reasons: the agent starts before the trainer, and runs on between its runs.
func (c *Coordinator) trainerWarnings() [][2]string {
	sig := trainer.SignalName(c.config().Trainer.Signal)
	c.mu.Lock()
	defer c.mu.Unlock()
	if !c.scanned {
		return nil
	}
	var ws [][2]string
	if len(c.found) == 0 {
		why := "no process matches trainer.pidfile, trainer.unit, trainer.match or trainer.container"
		if c.lastProblems != "" {
			why = c.lastProblems
		}
		ws = append(ws, [2]string{"no trainer process found (" + why + "): a notice now would signal no one, and its checkpoint would be missing; fine before the trainer starts",
			""}) // the STATUS line says "no trainer found" already
	}
	if slices.ContainsFunc(c.found, func(t TrainerStatus) bool { return t.CatchesSignal }) {
		// Beside those that catch it, a process that does not is a launcher (torchrun's
		// agent) or an init (tini, which waits for signals and forwards them): the scan's
		// line says it, and doctor lists it.
		return ws
	}
	for _, t := range c.found {
		if len(t.Cmdline) > 120 {
			t.Cmdline = t.Cmdline[:120] + "…"
		}
		ws = append(ws, [2]string{fmt.Sprintf("trainer process %d (%s) does not catch %s, nor does any other found: a notice now would signal none of them (the default action would kill them), and its checkpoint would be missing; install a handler in the trainer (docs/trainers.md)",
			t.PID, t.Cmdline, sig), fmt.Sprintf("trainer %d does not catch %s", t.PID, sig)})
	}
	return ws
}

// msgTrainerBeside is scan's line, at Warn, for a process found that does not catch the signal
// while another found does: a launcher or an init, most likely.
const msgTrainerBeside = "trainer process found that does not catch the signal, beside one that does: it is not signalled; fine for a launcher (torchrun's agent) or an init (tini), which the trainer.* keys need not match"

// msgTrainerFork is scan's line, at Debug, for a process found that is a fork of a trainer
// process with its command line and catches the signal.
const msgTrainerFork = "trainer found, a fork of a trainer process (such as a DataLoader's worker); it catches the signal"

// coordinatorStatus is the coordinator's part of /status.
type coordinatorStatus struct {
	Trainers        []TrainerStatus `json:"trainers"`
	TrainerProblems string          `json:"trainer_problems,omitempty"`
	Notices         []NoticeStatus  `json:"notices"`
}

func (c *Coordinator) status() coordinatorStatus {
	c.mu.Lock()
	defer c.mu.Unlock()
	st := coordinatorStatus{
		Trainers:        slices.Clone(c.found),
		TrainerProblems: c.lastProblems,
		Notices:         make([]NoticeStatus, 0, len(c.notices)),
	}
	for _, n := range c.notices {
		cp := *n
		cp.DetectedAt = n.readAt
		cp.Transitions = slices.Clone(n.Transitions)
		cp.Signals = append([]SignalOutcome{}, n.Signals...) // [] when none: a list, as documented
		st.Notices = append(st.Notices, cp)
	}
	return st
}

// noticeFile is the JSON of notice.json: the most severe notice in force, and all of them.
type noticeFile struct {
	noticeEntry
	Active []noticeEntry `json:"active"`
}

// noticeEntry is one notice in notice.json.
type noticeEntry struct {
	Source   imds.Source `json:"source"`
	Action   string      `json:"action"`
	EventID  string      `json:"event_id,omitempty"`
	Deadline *time.Time  `json:"deadline"`
	// NotAfter is when a scheduled event's window ends; omitted for other notices.
	NotAfter *time.Time `json:"not_after,omitempty"`
	// DetectedAt is when the agent first read it (its previous run, for one in force across a
	// restart).
	DetectedAt *time.Time `json:"detected_at,omitempty"`
	// SignalledAt is when the agent signalled the trainer for it; omitted before, or when it
	// did not. A restarted agent does not signal again for a notice its previous run did.
	SignalledAt *time.Time `json:"signalled_at,omitempty"`
	// SignalledPIDs are the trainer processes it signalled.
	SignalledPIDs []int `json:"signalled_pids,omitempty"`
	// PostedAt, EndsAt and Posts are, for a job notice, when it was first posted, when it ends
	// (a restarted agent keeps it until then) and how many times it was posted. Omitted for
	// other notices.
	PostedAt *time.Time `json:"posted_at,omitempty"`
	EndsAt   *time.Time `json:"ends_at,omitempty"`
	Posts    int        `json:"posts,omitempty"`
}

// key is the entry's notice's key.
func (e noticeEntry) key() string {
	return imds.Notice{Source: e.Source, Action: e.Action, EventID: e.EventID}.Key()
}

// status is the entry as a notice in force, for notice.json alone (carried).
func (e noticeEntry) status() *NoticeStatus {
	ns := &NoticeStatus{Key: e.key(), Source: e.Source, Action: e.Action, EventID: e.EventID, Policy: PolicyCheckpoint, Active: true}
	if e.Deadline != nil {
		d := *e.Deadline
		ns.Deadline = &d
	}
	if e.DetectedAt != nil {
		ns.readAt = *e.DetectedAt
	}
	if e.NotAfter != nil {
		ns.notAfter = *e.NotAfter
	}
	return ns
}

// seenRecord is what an earlier run read of a notice in force: when it first read it, and its
// deadline (nil if none).
type seenRecord struct {
	read     time.Time
	deadline *time.Time
}

// signalRecord is when, and which trainer processes, the agent signalled for a notice.
type signalRecord struct {
	At   time.Time
	PIDs []int
	// written is when an earlier run wrote the notice.json it was read from (its modification
	// time): each of PIDs was held then by the process it signalled.
	written time.Time
}

// writeNoticeFile writes notice.json for the notices in force (most severe first) atomically
// (temp file, fsync, rename) so a trainer never reads half of it, or removes it when there are
// none. A scheduled event whose start has passed is due now: its deadline stays its start, and
// not_after says when its window ends.
func writeNoticeFile(dir string, active []*NoticeStatus, signalled map[*NoticeStatus]signalRecord) error {
	path := filepath.Join(dir, NoticeFile)
	if len(active) == 0 {
		if _, err := os.Lstat(path); errors.Is(err, fs.ErrNotExist) {
			return nil // none to remove (a read-only directory refuses even that, as EROFS)
		}
		if err := os.Remove(path); err != nil && !errors.Is(err, fs.ErrNotExist) {
			return fmt.Errorf("remove notice file: %w", err)
		}
		return nil
	}
	entry := func(ns *NoticeStatus) noticeEntry {
		e := noticeEntry{Source: ns.Source, Action: ns.Action, EventID: ns.EventID}
		if !ns.readAt.IsZero() && ns.Source != SourceJob {
			at := ns.readAt.UTC()
			e.DetectedAt = &at
		}
		if ns.Deadline != nil {
			d := ns.Deadline.UTC()
			e.Deadline = &d
		}
		if !ns.notAfter.IsZero() {
			d := ns.notAfter.UTC()
			e.NotAfter = &d
		}
		if rec, ok := signalled[ns]; ok {
			at := rec.At.UTC()
			e.SignalledAt, e.SignalledPIDs = &at, rec.PIDs
		}
		if ns.Source == SourceJob && ns.EndsAt != nil {
			posted, ends := ns.detectedAt.UTC(), ns.EndsAt.UTC()
			e.PostedAt, e.EndsAt, e.Posts = &posted, &ends, ns.Posts
		}
		return e
	}
	nf := noticeFile{noticeEntry: entry(active[0])}
	for _, ns := range active {
		nf.Active = append(nf.Active, entry(ns))
	}
	data, err := json.Marshal(nf)
	if err != nil {
		return err
	}
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return fmt.Errorf("create runtime dir: %w", err)
	}
	tmp, err := os.CreateTemp(dir, ".notice-*.json")
	if err != nil {
		return fmt.Errorf("write notice file: %w", err)
	}
	defer os.Remove(tmp.Name())
	if _, err := tmp.Write(append(data, '\n')); err != nil {
		tmp.Close()
		return fmt.Errorf("write notice file: %w", err)
	}
	if err := tmp.Chmod(0o644); err != nil {
		tmp.Close()
		return fmt.Errorf("write notice file: %w", err)
	}
	if err := tmp.Sync(); err != nil {
		tmp.Close()
		return fmt.Errorf("write notice file: %w", err)
	}
	if err := tmp.Close(); err != nil {
		return fmt.Errorf("write notice file: %w", err)
	}
	if err := os.Rename(tmp.Name(), path); err != nil {
		return fmt.Errorf("write notice file: %w", err)
	}
	return nil
}

// msgNoticeFileUnreadable is readPrevious's warning for a notice file it cannot use.
const msgNoticeFileUnreadable = "the notice file an earlier run left cannot be read; a notice in force is signalled again, and a job notice it held is lost"

// readPrevious reads the notice.json an earlier run left in dir (killed, or restarted, during a
// notice): the notices it signalled the trainer for, by key, and when; what it read of each
// notice in force, by key; and the job notices it held (their ends are not looked at here).
func readPrevious(dir string, log zerolog.Logger) (map[string]signalRecord, map[string]seenRecord, []jobRecord, []noticeEntry) {
	path := filepath.Join(dir, NoticeFile)
	data, fi, err := readStoredNoticeFile(path)
	if errors.Is(err, fs.ErrNotExist) {
		return nil, nil, nil, nil
	}
	if err != nil {
		log.Warn().Err(err).Msg(msgNoticeFileUnreadable)
		return nil, nil, nil, nil
	}
	written := fi.ModTime()
	var nf noticeFile
	if err := json.Unmarshal(data, &nf); err != nil {
		log.Warn().Err(err).Msg(msgNoticeFileUnreadable)
		return nil, nil, nil, nil
	}
	out, read := map[string]signalRecord{}, map[string]seenRecord{}
	var jobs []jobRecord
	var carried []noticeEntry
	for _, e := range nf.Active {
		key := e.key()
		if e.SignalledAt != nil {
			out[key] = signalRecord{At: *e.SignalledAt, PIDs: e.SignalledPIDs, written: written}
		}
		if e.DetectedAt != nil && e.Source != SourceJob {
			read[key] = seenRecord{read: *e.DetectedAt, deadline: e.Deadline}
		}
		if e.Source != SourceJob { // a job notice is taken back whole (jobs), or has ended
			carried = append(carried, e)
		}
		if e.Source == SourceJob && e.PostedAt != nil && e.EndsAt != nil && e.Deadline != nil {
			jobs = append(jobs, jobRecord{notice: imds.Notice{Source: SourceJob, Action: e.Action, Time: *e.Deadline, Deadline: *e.Deadline},
				postedAt: *e.PostedAt, endsAt: *e.EndsAt, posts: max(e.Posts, 1)})
		}
	}
	return out, read, jobs, carried
}

// previousSignalWithin bounds how long ago an earlier run's signal for a notice may be for a
// restarted agent not to signal again: a notice still in force after that is asked for anew.
const previousSignalWithin = 10 * time.Minute

// previousSignal returns what an earlier run signalled for the notice key (its notice.json), if
// it did within previousSignalWithin, the notice was in force when this run first read its
// source (first: imds.Event.First; one that appeared later is a new notice, even of the same
// key), and a trainer process found now (procs) is one it signalled, or none is found: a trainer
// restarted whole since has not been asked. Once per key.
func (c *Coordinator) previousSignal(key string, procs []trainer.Process, first bool) (signalRecord, bool) {
	c.mu.Lock()
	defer c.mu.Unlock()
	prev, ok := c.previous[key]
	delete(c.previous, key)
	if !ok || !first || time.Since(prev.At) >= previousSignalWithin {
		return prev, false
	}
	if len(procs) == 0 {
		// None left: those it signalled exited (a container stopped once its save was committed,
		// a trainer that exits after saving), and there is no one to ask again; what they saved
		// is the notice's (found from outside: an error, no trainer found, and the notice said
		// missing its checkpoint, committed by the previous run). One started later is a
		// process found since, signalled alone.
		return prev, true
	}
	// One of the processes it signalled still there is enough: the others are new since (a data
	// loader's worker, a rank restarted on its own), signalled alone as a running agent signals
	// one found during a notice (signalNew). A trainer restarted whole has none of them left.
	// A process started after notice.json was written is not the one it signalled under its PID
	// (the PID reused: a DataLoader's workers go through PIDs quickly).
	for _, p := range procs {
		if prev.holds(p) {
			return prev, true
		}
	}
	return prev, false
}

// holds reports whether p is a process the record says was signalled: one of its PIDs, held by a
// process that started before the record was written (or either time is unknown).
func (r signalRecord) holds(p trainer.Process) bool {
	return slices.Contains(r.PIDs, p.PID) && (p.Started.IsZero() || r.written.IsZero() || p.Started.Before(r.written))
}

// checkWritable reports whether a file can be written in dir: it creates one, writes a page
// into it (a full file system takes an empty file, not notice.json's bytes) and removes it.
func checkWritable(dir string) error {
	f, err := os.CreateTemp(dir, ".spotguard-probe-*")
	if err != nil {
		return err
	}
	name := f.Name()
	_, err = f.Write(make([]byte, 4096))
	err = errors.Join(err, f.Close())
	return errors.Join(err, os.Remove(name))
}
