package checkpoint

import (
	"bytes"
	"context"
	"errors"
	"flag"
	"fmt"
	"io/fs"
	"maps"
	"math/rand/v2"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"testing/synctest"
	"time"

	"github.com/rs/zerolog"
)

// The simulation drives real Uploaders over real directories (a scripted trainer writes the
// files and plays the watcher, sending the events a Watcher would) against simBackend, an
// in-memory S3 with latency, 503s, lost answers and outages, under testing/synctest's fake
// clock. Agents are killed (kill -9: their store connection dies with their multipart uploads
// left behind, and a restart gets the journal as it was), stopped mid-upload, restarted, and a
// second agent writes to the same job. After every step it checks I1-I4 and I7 (simBackend checks
// the history as it happens; every manifest must be a version of its checkpoint the trainer had
// complete); at the end, with the faults off, I5 (every complete local checkpoint is committed
// with its current bytes within a bounded time), I6 (LATEST on the newest commit, every commit's
// prefix clean) and a restore of the newest commit, bit for bit.
//
// Every `go test` runs simFixedSeeds; a seed that ever found a bug stays there. A failure prints
// the command that replays it. A seed replays its run: the simulation's own draws, each request's
// fate (drawn for that request and the moment it is made, whatever order concurrent requests come
// in), and the agents' retry jitter and commit ids (UploaderConfig.seed) all come from it, and the
// scripted trainer lets the agents finish what they do at a moment before it acts (synctest.Wait).
// Two things are left to chance: the order in which an agent takes results that come at one
// moment (two files checksummed at once), which now and then changes which file goes next; and
// the files' change times, which the real clock sets (a checkpoint's complete_at, and so the
// order of commits), so two checkpoints saved within one tick of it may tie in one run and not in
// the next. Two runs of a seed, with -sim.log -sim.logall -sim.requests, show where they part.

var (
	simSeed   = flag.Uint64("sim.seed", 0, "run the simulation with only this seed")
	simSeeds  = flag.Int("sim.seeds", 0, "run the simulation with this many random seeds besides the fixed ones")
	simSteps  = flag.Int("sim.steps", 150, "trainer steps per simulated run")
	simLogTo  = flag.String("sim.log", "", "write the agents' log lines of a failed run to this file, .<test>.<seed> added")
	simLogAll = flag.Bool("sim.logall", false, "with -sim.log, write the log of every run, failed or not (to compare two runs of a seed)")
	simReqs   = flag.Bool("sim.requests", false, "log every request made of the store, with -sim.log")
)

// simFixedSeeds run on every `go test`: a few plain ones, then every seed that once found a bug
// (the comment says which).
var simFixedSeeds = []uint64{1, 2, 3, 4, 5, 6, 7, 8,
	16211997675706091952, // a lost manifest answer, then retention deleted the commit: its retry listed deleted objects
	14861186008314663954, // a notice made a matching generation upload what it had only checksummed (key-less files)
	11146604921167203464, // the same
	10330410405255659379, // the same
	9152897452918062928,  // the same
	3499550622715243477,  // a restored checkpoint committed again: the other agent's commit was not known
	270564685991213028,   // the same
	3093366355950704944,  // the same, during a notice
	5484251961388731054,  // failed once with an invariant violation that did not reproduce afterwards
	16891971049404788680, // the same
	9939144931670714093,  // the same
	1340621669700087182,  // the simulation restored a commit newer than the one it had checked
	8187882196667349893,  // retention deleted a commit newer than LATEST while LATEST named one it did not see
	16327607281750442949, // a restored checkpoint's commit was deleted by retention, then committed again as the newest
	1452147854637209157,  // a file gone after a lost manifest answer was deleted as a stray although that manifest listed it
	// Seed 5 also found (under -race) that a resumed commit's clean-up before its manifest deleted
	// the manifest an earlier try had written with its answer lost.
}

func TestSimulation(t *testing.T) {
	runSeeds(t, "TestSimulation", simFixedSeeds, func(t *testing.T, seed uint64, steps int) { runSim(t, seed, steps, false) })
}

// simTroubleSeeds run on every `go test` in the trouble mode: besides the faults above, writes
// the network holds and lands late (after the agent gave up on them, after it was killed), a
// store that answers nothing for a while, trainers that die after their signal, and notices that
// begin or end in the middle of a save. Its draws come from a generator of their own, so the
// seeds above replay as they did.
// Seed 7 found (in about 1 run in 12) that a restarted agent wrote a changed marker into, or
// deleted, a commit whose manifest PUT the killed run had sent and that landed later.
var simTroubleSeeds = []uint64{1, 2, 3, 4, 5, 6, 7, 8,
	15502045643967214264, // a stop waited for a LATEST repair against a hung store, past its budget
	6753539153906812938,  // a manifest write held past its timeout landed after retention deleted its commit: torn
	8532108675264824729,  // a held manifest write landed on a sealed commit left behind, over an incomplete upload
	2400494668816226632,  // (at 400 steps) a restart counted a sealed commit it found committed, and never looked for a held write landing torn
	7284664545487428755,  // a killed run's held write of a file gone before the commit landed under the commit a restart resumed: left for good
}

func TestSimulationTrouble(t *testing.T) {
	runSeeds(t, "TestSimulationTrouble", simTroubleSeeds, func(t *testing.T, seed uint64, steps int) { runSim(t, seed, steps, true) })
}

// runSeeds runs run under synctest for each of fixed (or -sim.seed alone) and -sim.seeds random
// seeds, each a subtest that prints the command replaying it when it fails.
func runSeeds(t *testing.T, name string, fixed []uint64, run func(t *testing.T, seed uint64, steps int)) {
	seeds := fixed
	if *simSeed != 0 {
		seeds = []uint64{*simSeed}
	}
	for range *simSeeds {
		seeds = append(seeds, rand.Uint64())
	}
	for _, seed := range seeds {
		t.Run(fmt.Sprintf("seed=%d", seed), func(t *testing.T) {
			t.Parallel() // each run is a world of its own: its store, directories and clock
			synctest.Test(t, func(t *testing.T) { run(t, seed, *simSteps) })
			if t.Failed() {
				t.Logf("replay: go test ./checkpoint -run '%s' -sim.seed=%d -v", name, seed)
			}
		})
	}
}

// sim is one simulated run.
type sim struct {
	t      *testing.T
	seed   uint64
	rng    *rand.Rand
	b      *simBackend
	root   string
	job    string
	keep   int
	agents []*simAgent
	step   int
	names  int
	// snaps are the versions of each checkpoint the trainer had complete: fingerprints of
	// (path, checksum) of every file.
	snaps   map[string]map[string]bool
	checked map[string]bool // manifests checked against snaps
	// reopened are the checkpoints ("agent:name") with a file written again since their marker
	// was last written: not complete (the agent waits for the marker), so I5 does
	// not ask for them; a commit of such a version is no fault (an agent that did not know the
	// marker it was complete with commits it, as before), so it is a snapshot too.
	reopened map[string]bool
	logs     *simLog
	// trouble is the trouble mode (TestSimulationTrouble); more draws its events.
	trouble bool
	more    *rand.Rand
	// grow draws how files are seen growing before they are ready (growing).
	grow *rand.Rand
	// odd draws the trouble mode's trainers that stage their saves under another name and files
	// the trainer cannot read (oddAct); locked are those files ("agent:checkpoint/path").
	odd    *rand.Rand
	locked map[string]bool
	// world > 1 is the multi-node mode (sim_nodes_test.go): one agent per node rank.
	world int
	// lastSave is when each name was last saved on the nodes, and with which marker (multi-node).
	lastSave   map[string]time.Time
	lastMarker map[string][]byte
}

// simAgent is one agent (one instance's spotguard) and its checkpoint directory.
type simAgent struct {
	name, dir, state string
	incarnation      int
	rank             int // its node rank, in the multi-node mode
	store            *simStore
	up               *Uploader
	events           chan WatchEvent
	cancel           context.CancelFunc
	done             chan struct{}
	// noticed: this incarnation had a notice, which sends new checkpoints without looking for
	// them in the store first; inForce: one is in force now.
	noticed, inForce bool
	// trainerGone: its trainer died (trouble mode), until the next save.
	trainerGone atomic.Bool
}

// simClock stamps each log line with the fake clock's time, to the microsecond.
type simClock struct{}

func (simClock) Run(e *zerolog.Event, _ zerolog.Level, _ string) {
	e.Str("at", time.Now().UTC().Format("15:04:05.000000"))
}

// simLog keeps the agents' log lines, for a failure's report.
type simLog struct {
	mu  sync.Mutex
	buf bytes.Buffer
}

func (l *simLog) Write(p []byte) (int, error) {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.buf.Write(p)
}

func (l *simLog) tail(n int) string {
	l.mu.Lock()
	defer l.mu.Unlock()
	lines := strings.Split(strings.TrimSpace(l.buf.String()), "\n")
	return strings.Join(lines[max(0, len(lines)-n):], "\n")
}

// newSim returns a simulated run of seed: its store, with its first faults, and retention.
func newSim(t *testing.T, seed uint64) *sim {
	s := &sim{
		t: t, seed: seed, rng: rand.New(rand.NewPCG(seed, 7)), b: newSimBackend(seed), root: t.TempDir(), job: "sim",
		snaps: map[string]map[string]bool{}, checked: map[string]bool{}, reopened: map[string]bool{}, logs: &simLog{},
	}
	if s.rng.IntN(3) == 0 {
		s.keep = 1 + s.rng.IntN(3)
	}
	if *simReqs {
		s.b.requests = s.logs
	}
	s.b.setFaults(simFaults{errRate: 0.05, lostRate: 0.02, maxLatency: 300 * time.Millisecond})
	if *simLogAll {
		t.Cleanup(s.writeLog)
	}
	return s
}

func runSim(t *testing.T, seed uint64, steps int, trouble bool) {
	s := newSim(t, seed)
	s.trouble, s.more, s.grow = trouble, rand.New(rand.NewPCG(seed, 13)), rand.New(rand.NewPCG(seed, 17))
	s.odd, s.locked = rand.New(rand.NewPCG(seed, 19)), map[string]bool{}
	s.addAgent("a")
	defer func() {
		for _, a := range s.agents {
			s.stopAgent(a)
		}
		s.awaitLate()
	}()
	for s.step = 0; s.step < steps; s.step++ {
		s.act()
		synctest.Wait()
		s.check()
	}
	s.settle()
}

// trace writes a line saying what the simulation did at this step into the agents' log, for a
// failure's report.
func (s *sim) trace(what string, a *simAgent, name string) {
	agent := ""
	if a != nil {
		agent = a.name
	}
	fmt.Fprintf(s.logs, "{\"sim_step\":%d,\"do\":%q,\"on\":%q,\"checkpoint\":%q,\"at\":%q}\n", s.step, what, agent, name,
		time.Now().UTC().Format("15:04:05.000000"))
}

// fail stops the run with what went wrong and the agents' last log lines.
func (s *sim) fail(format string, args ...any) {
	s.t.Helper()
	s.writeLog()
	s.t.Fatalf("step %d: %s\nlast log lines:\n%s", s.step, fmt.Sprintf(format, args...), s.logs.tail(60))
}

// writeLog writes the run's log to -sim.log, if set.
func (s *sim) writeLog() {
	if *simLogTo == "" {
		return
	}
	s.logs.mu.Lock()
	defer s.logs.mu.Unlock()
	test, _, _ := strings.Cut(s.t.Name(), "/")
	_ = os.WriteFile(fmt.Sprintf("%s.%s.%d", *simLogTo, test, s.seed), s.logs.buf.Bytes(), 0o644)
}

func (s *sim) addAgent(name string) *simAgent {
	a := &simAgent{name: name, dir: filepath.Join(s.root, name, "ckpt"), state: filepath.Join(s.root, name, "run-0")}
	if err := os.MkdirAll(a.dir, 0o755); err != nil {
		s.t.Fatal(err)
	}
	if os.Geteuid() == 0 {
		// The trainer is another user than the agent (root), which reads what it cannot (lock).
		if err := os.Chown(a.dir, simTrainerUID, simTrainerUID); err != nil {
			s.t.Fatal(err)
		}
	}
	s.agents = append(s.agents, a)
	s.startAgent(a)
	return a
}

// fileClock returns the time by the clock that sets files' change times, the real one (the
// bubble's is fake): the change time of probe, written for it. One caller at a time per probe.
func fileClock(t *testing.T, probe string) func() time.Time {
	return func() time.Time {
		if err := os.WriteFile(probe, nil, 0o644); err != nil {
			t.Errorf("file clock: %v", err)
			return time.Now()
		}
		fi, err := os.Lstat(probe)
		if err != nil {
			t.Errorf("file clock: %v", err)
			return time.Now()
		}
		return FileIDOf(fi).ChangeTime
	}
}

// startAgent starts a's agent and sends it what the watcher's first scan would.
func (s *sim) startAgent(a *simAgent) {
	a.store = s.b.connect(fmt.Sprintf("%s#%d", a.name, a.incarnation))
	s.b.agentUp(a.name, true)
	a.noticed, a.inForce = false, false
	log := zerolog.New(s.logs).Hook(simClock{}).With().Str("agent", a.store.name).Logger()
	cfg := UploaderConfig{
		Store: a.store, Job: s.job, Dir: a.dir, Pattern: "*.pt", Keep: s.keep, StateDir: a.state,
		StopBudget: simStopBudget, Logger: log, Host: func() Host { return Host{Hostname: a.name} },
		seed:      seeded(s.seed, fmt.Sprint("agent ", a.store.conn)).Uint64(),
		fileClock: fileClock(s.t, filepath.Join(s.root, "clock-"+a.store.name)),
	}
	if s.world > 1 {
		cfg.NodeRank, cfg.WorldNodes, cfg.PartWait = a.rank, s.world, simPartWait
	}
	if s.trouble {
		cfg.TrainerAlive = func() bool { return !a.trainerGone.Load() }
	}
	a.up = NewUploader(cfg)
	ctx, cancel := context.WithCancel(context.Background())
	a.cancel, a.done, a.events = cancel, make(chan struct{}), make(chan WatchEvent)
	up, events, done := a.up, a.events, a.done
	go func() {
		if err := up.Run(ctx, events); err != nil {
			s.t.Errorf("Run: %v", err)
		}
		close(done)
	}()
	synctest.Wait()
	found, err := Scan(a.dir, "", "*.pt", zerolog.Nop())
	if err != nil {
		s.fail("scan: %v", err)
	}
	for _, lc := range found {
		for _, f := range lc.Files {
			s.send(a, WatchEvent{Kind: FileReady, Checkpoint: lc.Name, Path: f.Path, ID: f.ID})
		}
		if lc.Complete {
			s.complete(a, lc.Name)
		}
	}
}

func (s *sim) running(a *simAgent) bool { return a.events != nil }

// stopAgent cancels a's agent and waits for Run to return: it drains for at most its stop
// budget, whatever the store does.
func (s *sim) stopAgent(a *simAgent) {
	if !s.running(a) {
		return
	}
	start := time.Now()
	a.cancel()
	<-a.done
	synctest.Wait()
	a.events = nil
	s.b.agentUp(a.name, false)
	if took := time.Since(start); took > simStopBudget+simStopSlack {
		s.fail("agent %s took %v to stop; its stop budget is %v", a.name, took, simStopBudget)
	}
}

// simStopBudget is the agents' agent.stop_budget; simStopSlack what a stop may take beyond it: a
// clean-up pass begun is finished, within s3AbortTimeout.
const (
	simStopBudget = 30 * time.Second
	simStopSlack  = s3AbortTimeout + time.Second
)

// killAgent is kill -9: the agent's store connection dies (its multipart uploads stay behind),
// and the next incarnation gets the journal as it was at that moment.
func (s *sim) killAgent(a *simAgent) {
	if !s.running(a) {
		return
	}
	a.store.kill()
	a.incarnation++
	next := filepath.Join(s.root, a.name, fmt.Sprintf("run-%d", a.incarnation))
	copyDir(s.t, a.state, next)
	a.state = next
	s.stopAgent(a)
}

func copyDir(t *testing.T, from, to string) {
	if err := os.MkdirAll(to, 0o755); err != nil {
		t.Fatal(err)
	}
	entries, _ := os.ReadDir(from)
	for _, e := range entries {
		if e.Type().IsRegular() && !strings.HasSuffix(e.Name(), ".tmp") {
			b, err := os.ReadFile(filepath.Join(from, e.Name()))
			if err != nil {
				t.Fatal(err)
			}
			if err := os.WriteFile(filepath.Join(to, e.Name()), b, 0o600); err != nil {
				t.Fatal(err)
			}
		}
	}
}

// send delivers a watch event to a's agent if it runs (a stopped agent's watcher sees nothing; its
// next start scans).
func (s *sim) send(a *simAgent, ev WatchEvent) {
	if !s.running(a) {
		return
	}
	ev.At = time.Now()
	a.events <- ev
	synctest.Wait()
}

func (s *sim) fileID(p string) FileID {
	fi, err := os.Lstat(p)
	if err != nil {
		s.fail("lstat %s: %v", p, err)
	}
	return FileIDOf(fi)
}

// complete sends the Complete of checkpoint name and records its version.
func (s *sim) complete(a *simAgent, name string) {
	p := filepath.Join(a.dir, name)
	marker := "_COMPLETE"
	if fi, err := os.Lstat(p); err == nil && fi.Mode().IsRegular() {
		marker = name
	} else {
		p = filepath.Join(p, marker)
	}
	if s.hasLocked(a, name) {
		// The watcher withholds its Complete while a file of it cannot be read by the trainer.
		fi, err := os.Lstat(p)
		if err != nil {
			s.fail("%v", err)
		}
		s.send(a, WatchEvent{Kind: Withheld, Checkpoint: name, Path: marker, Size: fi.Size(), ModTime: fi.ModTime(), ID: FileIDOf(fi), Err: ErrNotStorable})
		return
	}
	s.send(a, WatchEvent{Kind: Complete, Checkpoint: name, Path: marker, ID: s.fileID(p)})
}

// snapshot records the version of every complete checkpoint of a as one the trainer had.
func (s *sim) snapshot(a *simAgent) {
	entries, _ := os.ReadDir(a.dir)
	for _, e := range entries {
		if fp, ok := s.fingerprint(a, e.Name()); ok {
			if s.snaps[e.Name()] == nil {
				s.snaps[e.Name()] = map[string]bool{}
			}
			s.snaps[e.Name()][fp] = true
		}
	}
}

// fingerprint reads checkpoint name of a and returns its (path, checksum) list, if complete.
func (s *sim) fingerprint(a *simAgent, name string) (string, bool) {
	p := filepath.Join(a.dir, name)
	fi, err := os.Lstat(p)
	if err != nil {
		return "", false
	}
	var lines []string
	sum := func(file, rel string) {
		b, err := os.ReadFile(file)
		if err != nil {
			s.fail("read %s: %v", file, err)
		}
		c, _ := ChecksumOf(bytes.NewReader(b))
		lines = append(lines, rel+" "+c.Value)
	}
	if fi.Mode().IsRegular() {
		sum(p, name)
		return strings.Join(lines, "\n"), true
	}
	if _, err := os.Lstat(filepath.Join(p, "_COMPLETE")); err != nil {
		return "", false
	}
	filepath.WalkDir(p, func(f string, d fs.DirEntry, err error) error {
		if err == nil && d.Type().IsRegular() {
			rel, _ := filepath.Rel(p, f)
			sum(f, filepath.ToSlash(rel))
		}
		return nil
	})
	slices.Sort(lines)
	return strings.Join(lines, "\n"), true
}

func manifestFingerprint(m *Manifest) string {
	var lines []string
	for _, f := range m.Files {
		lines = append(lines, f.Path+" "+f.Checksum.Value)
	}
	slices.Sort(lines)
	return strings.Join(lines, "\n")
}

// check asserts the invariants after a step.
func (s *sim) check() {
	s.t.Helper()
	s.b.checkTorn(false)
	if v := s.b.takeViolations(); len(v) > 0 {
		s.fail("invariants violated:\n  %s", strings.Join(v, "\n  "))
	}
	for _, m := range s.b.manifests() {
		key := ManifestKey(m.Job, m.Checkpoint, m.Commit)
		if s.checked[key] {
			continue
		}
		s.checked[key] = true
		if !s.snaps[m.Checkpoint][manifestFingerprint(m)] {
			var parts []string
			for _, p := range m.Parts {
				parts = append(parts, fmt.Sprintf("node %d: commit %s by %s, complete %s, committed %s", p.NodeRank, p.Commit,
					p.Host.Hostname, p.CompleteAt.Format("15:04:05.000"), p.CommittedAt.Format("15:04:05.000")))
			}
			s.fail("I2/I4: commit %s/%s lists a version of the checkpoint the trainer never had complete:\n%s\nparts:\n  %s",
				m.Checkpoint, m.Commit, manifestFingerprint(m), strings.Join(parts, "\n  "))
		}
	}
}

// pickAgent returns a running agent, or nil.
func (s *sim) pickAgent() *simAgent {
	var up []*simAgent
	for _, a := range s.agents {
		if s.running(a) {
			up = append(up, a)
		}
	}
	if len(up) == 0 {
		return nil
	}
	return up[s.rng.IntN(len(up))]
}

// localCheckpoints returns the names in a's checkpoint directory.
func localCheckpoints(a *simAgent) []string {
	entries, _ := os.ReadDir(a.dir)
	var names []string
	for _, e := range entries {
		names = append(names, e.Name())
	}
	return names
}

// act takes one random step.
func (s *sim) act() {
	a := s.pickAgent()
	if s.trouble && s.more.IntN(100) < 8 {
		s.troubleAct(a) // as well: the steps below draw as they did
	}
	if s.trouble && s.odd.IntN(100) < 5 {
		s.oddAct(a) // as well, from a generator of its own
	}
	switch r := s.rng.IntN(100); {
	case r < 30:
		s.save(s.anyAgent(a))
	case r < 34:
		s.saveSingle(s.anyAgent(a))
	case r < 44:
		s.rewrite(s.anyAgent(a))
	case r < 51:
		s.deleteCheckpoint(s.anyAgent(a))
	case r < 54:
		s.deleteFile(s.anyAgent(a))
	case r < 58:
		s.toggleNotice(a)
	case r < 64:
		if a != nil {
			s.killAgent(a)
		}
	case r < 67:
		if a != nil {
			s.stopAgent(a)
		}
	case r < 74:
		s.startAll()
	case r < 80:
		s.randomFaults()
	case r < 83:
		s.restore(a)
	case r < 85:
		if len(s.agents) < 2 {
			s.addAgent("b")
		}
	default:
		advance(time.Duration(s.rng.IntN(30_000)) * time.Millisecond)
	}
}

// toggleNotice ends a's notice if one is in force (a rebalance withdrawn, a scheduled event
// canceled), else gives it a spot notice the trainer was signalled for.
func (s *sim) toggleNotice(a *simAgent) {
	switch {
	case a == nil:
	case a.inForce:
		a.up.SetNotices(nil)
		a.inForce = false
	default:
		now := time.Now()
		a.up.SetNotices([]ActiveNotice{{Key: "spot/terminate", Deadline: now.Add(2 * time.Minute), SignalledAt: now}})
		a.noticed, a.inForce = true, true
	}
	synctest.Wait()
}

// startAll starts every agent that is not running.
func (s *sim) startAll() {
	for _, a := range s.agents {
		if !s.running(a) {
			s.startAgent(a)
		}
	}
}

// randomFaults sets new random fault rates, latency and sometimes an outage.
func (s *sim) randomFaults() {
	errRate, lost := s.rng.Float64()*0.3, s.rng.Float64()*0.1
	f := simFaults{errRate: errRate, lostRate: lost, maxLatency: time.Duration(s.rng.IntN(800)) * time.Millisecond, outage: s.rng.IntN(8) == 0}
	if s.trouble {
		if s.more.IntN(2) == 0 {
			f.lateRate = s.more.Float64() * 0.15
		}
		if !f.outage && s.more.IntN(10) == 0 {
			f.hang = true
		}
	}
	s.b.setFaults(f)
}

// anyAgent returns a, or when no agent runs, any agent: the trainer writes whether or not its
// agent is up.
func (s *sim) anyAgent(a *simAgent) *simAgent {
	if a != nil {
		return a
	}
	return s.agents[s.rng.IntN(len(s.agents))]
}

// name returns a new checkpoint name, or (a rollback, a new run reusing the job) an old one.
func (s *sim) name() string {
	if s.names > 0 && s.rng.IntN(8) == 0 {
		return fmt.Sprintf("step-%06d", 100*(1+s.rng.IntN(s.names)))
	}
	s.names++
	return fmt.Sprintf("step-%06d", 100*s.names)
}

func (s *sim) writeFile(p string, size int) { s.fileFrom(s.rng, p, size) }

// fileFrom writes size random bytes drawn from rng to p, as the trainer (s.own).
func (s *sim) fileFrom(rng *rand.Rand, p string, size int) {
	b := make([]byte, size)
	for i := range b {
		b[i] = byte(rng.Uint32())
	}
	if err := os.MkdirAll(filepath.Dir(p), 0o755); err != nil {
		s.fail("%v", err)
	}
	if err := os.WriteFile(p, b, 0o644); err != nil {
		s.fail("%v", err)
	}
	s.own(p)
}

func (s *sim) size() int {
	switch r := s.rng.IntN(10); {
	case r == 0:
		return 0
	case r < 4:
		return 1 + s.rng.IntN(4<<10)
	default:
		return 1 + s.rng.IntN(200<<10) // many are multipart (64 KiB parts)
	}
}

// save writes a checkpoint directory file by file (some through temporary names), then its
// marker; sometimes the trainer dies before the marker.
func (s *sim) save(a *simAgent) {
	a.trainerGone.Store(false)
	name := s.name()
	s.trace("save", a, name)
	dir := filepath.Join(a.dir, name)
	if _, err := os.Lstat(dir); err == nil {
		os.RemoveAll(dir)
		s.send(a, WatchEvent{Kind: Removed, Checkpoint: name})
	}
	delete(s.reopened, a.name+":"+name)
	s.forgetLocks(a, name)
	n := 1 + s.rng.IntN(6)
	if s.rng.IntN(10) == 0 {
		n = 20 + s.rng.IntN(100)
	}
	for i := range n {
		rel := fmt.Sprintf("shard-%d.bin", i)
		if s.rng.IntN(4) == 0 {
			rel = fmt.Sprintf("optim/rank-%d/state.bin", i)
		}
		p := filepath.Join(dir, filepath.FromSlash(rel))
		switch s.rng.IntN(6) {
		case 0: // a dot-temp file renamed into place: the watcher never sees the temp
			tmp := filepath.Join(filepath.Dir(p), "."+filepath.Base(p)+".tmp")
			s.writeFile(tmp, s.size())
			os.Rename(tmp, p)
		case 1: // a visible temp file, ready long enough to be sent, then renamed
			tmp := p + ".tmp"
			s.writeFile(tmp, s.size())
			s.send(a, WatchEvent{Kind: FileReady, Checkpoint: name, Path: rel + ".tmp", ID: s.fileID(tmp)})
			advance(time.Duration(s.rng.IntN(3000)) * time.Millisecond)
			os.Rename(tmp, p)
			s.send(a, WatchEvent{Kind: FileGone, Checkpoint: name, Path: rel + ".tmp"})
		default:
			s.writeFile(p, s.size())
			if s.grow.IntN(3) == 0 {
				s.growing(a, name, rel, p)
			}
		}
		s.send(a, WatchEvent{Kind: FileReady, Checkpoint: name, Path: rel, ID: s.fileID(p)})
		if n < 10 {
			advance(time.Duration(s.rng.IntN(2000)) * time.Millisecond)
		}
		if s.trouble && s.running(a) && s.more.IntN(12) == 0 {
			s.toggleNotice(a) // a notice begins, or ends, while the trainer writes
		}
	}
	if s.rng.IntN(10) == 0 {
		a.trainerGone.Store(true) // the trainer died before its marker
		return
	}
	s.writeFile(filepath.Join(dir, "_COMPLETE"), s.rng.IntN(64))
	s.snapshot(a)
	s.complete(a, name)
}

// growing replays the writing of the file p (rel of checkpoint name), written whole just now, as
// the watcher sees a file written in place: it is cut back to a part or more, seen growing,
// sometimes has bytes already seen overwritten (a writer that seeks back), then is written
// whole again. Its FileReady is the caller's.
func (s *sim) growing(a *simAgent, name, rel, p string) {
	data, err := os.ReadFile(p)
	part := int(s.b.partSize)
	if err != nil || len(data) <= part {
		return
	}
	cut := part + s.grow.IntN(len(data)-part+1)
	if err := os.Truncate(p, int64(cut)); err != nil {
		s.fail("%v", err)
	}
	s.trace(fmt.Sprintf("grow %s to %d of %d", rel, cut, len(data)), a, name)
	s.send(a, WatchEvent{Kind: FileGrowing, Checkpoint: name, Path: rel, Size: int64(cut), ID: s.fileID(p)})
	advance(time.Duration(s.grow.IntN(1500)) * time.Millisecond)
	f, err := os.OpenFile(p, os.O_WRONLY, 0)
	if err != nil {
		s.fail("%v", err)
	}
	defer f.Close()
	if s.grow.IntN(3) == 0 {
		junk := make([]byte, 1+s.grow.IntN(100))
		for i := range junk {
			junk[i] = byte(s.grow.Uint32())
		}
		at := s.grow.IntN(cut - len(junk) + 1)
		if _, err := f.WriteAt(junk, int64(at)); err != nil {
			s.fail("%v", err)
		}
		advance(time.Duration(s.grow.IntN(500)) * time.Millisecond)
	}
	if _, err := f.WriteAt(data, 0); err != nil {
		s.fail("%v", err)
	}
	s.send(a, WatchEvent{Kind: FileGrowing, Checkpoint: name, Path: rel, Size: int64(len(data)), ID: s.fileID(p)})
}

// saveSingle writes a single-file checkpoint through a temporary name.
func (s *sim) saveSingle(a *simAgent) {
	name := fmt.Sprintf("model-%d.pt", s.rng.IntN(4))
	s.trace("save a single file", a, name)
	tmp := filepath.Join(a.dir, "."+name+".tmp")
	s.writeFile(tmp, s.size())
	if fi, err := os.Lstat(filepath.Join(a.dir, name)); err == nil && fi.IsDir() {
		return
	}
	os.Rename(tmp, filepath.Join(a.dir, name))
	s.snapshot(a)
	s.send(a, WatchEvent{Kind: FileReady, Checkpoint: name, Path: name, ID: s.fileID(filepath.Join(a.dir, name))})
	s.complete(a, name)
}

// rewrite changes one file of a complete checkpoint after its marker: same size, and sometimes
// with its modification time set back.
func (s *sim) rewrite(a *simAgent) {
	name, ok := s.pickCheckpoint(a)
	if !ok {
		return
	}
	if _, ok := s.fingerprint(a, name); !ok {
		return
	}
	root := filepath.Join(a.dir, name)
	files := regularFiles(root, func(p string) bool { return filepath.Base(p) != "_COMPLETE" })
	if len(files) == 0 {
		return
	}
	p := files[s.rng.IntN(len(files))]
	if s.lockedPath(a, name, p) {
		return // written by the other user, it stays what the trainer cannot read: nothing to see
	}
	fi, _ := os.Lstat(p)
	s.trace("rewrite "+p, a, name)
	if FileIDOf(fi).Nlink > 1 {
		os.Remove(p) // written anew, not through the other name too (linkCopy)
	}
	s.writeFile(p, int(fi.Size()))
	if s.rng.IntN(2) == 0 {
		os.Chtimes(p, fi.ModTime(), fi.ModTime())
	}
	if p != root {
		// Other bytes after the marker, even with the file's time set back: withheld until the
		// marker is written again once the agent knows the commit it was complete with (or
		// sent again and committed, before that commit: a snapshot too).
		s.reopened[a.name+":"+name] = true
	}
	s.snapshot(a)
	rel := name
	if p != root {
		r, _ := filepath.Rel(root, p)
		rel = filepath.ToSlash(r)
	}
	s.send(a, WatchEvent{Kind: FileReady, Checkpoint: name, Path: rel, ID: s.fileID(p)})
	if rel == name {
		s.complete(a, name)
	}
}

// pickCheckpoint returns one of a's local checkpoints, at random, or false when there is none.
func (s *sim) pickCheckpoint(a *simAgent) (string, bool) {
	names := localCheckpoints(a)
	if len(names) == 0 {
		return "", false
	}
	return names[s.rng.IntN(len(names))], true
}

// regularFiles returns the regular files at or below root (root itself when it is one) for which
// keep is true.
func regularFiles(root string, keep func(p string) bool) []string {
	var files []string
	filepath.WalkDir(root, func(p string, d fs.DirEntry, err error) error {
		if err == nil && d.Type().IsRegular() && keep(p) {
			files = append(files, p)
		}
		return nil
	})
	return files
}

func (s *sim) deleteCheckpoint(a *simAgent) {
	name, ok := s.pickCheckpoint(a)
	if !ok {
		return
	}
	s.trace("delete", a, name)
	delete(s.reopened, a.name+":"+name)
	s.forgetLocks(a, name)
	os.RemoveAll(filepath.Join(a.dir, name))
	s.send(a, WatchEvent{Kind: Removed, Checkpoint: name})
}

func (s *sim) deleteFile(a *simAgent) {
	name, ok := s.pickCheckpoint(a)
	if !ok {
		return
	}
	root := filepath.Join(a.dir, name)
	files := regularFiles(root, func(p string) bool { return p != root })
	if len(files) == 0 {
		return
	}
	p := files[s.rng.IntN(len(files))]
	s.trace("delete "+p, a, name)
	locked := s.lockedPath(a, name, p)
	os.Remove(p)
	s.snapshot(a)
	r, _ := filepath.Rel(root, p)
	if locked {
		// The watcher reads a checkpoint it withholds again when something in it changes: with
		// no file left that the trainer cannot read, it is complete.
		delete(s.locked, a.name+":"+name+"/"+filepath.ToSlash(r))
		if _, ok := s.fingerprint(a, name); ok && !s.hasLocked(a, name) {
			s.complete(a, name)
		}
		return
	}
	s.send(a, WatchEvent{Kind: FileGone, Checkpoint: name, Path: filepath.ToSlash(r)})
}

// restore puts the job's newest commit into a's checkpoint directory, as a replacement instance
// would, when it is not there yet; the agent must take it for what it is (already committed) and
// send nothing.
func (s *sim) restore(a *simAgent) {
	if a == nil {
		return
	}
	clean := s.b.connect("restore")
	st, err := readJob(s.t.Context(), clean, s.job, nil)
	if err != nil || st.Newest() == nil {
		return
	}
	m := st.Newest().Manifest
	if _, err := os.Lstat(filepath.Join(a.dir, m.Checkpoint)); err == nil || strings.HasSuffix(m.Checkpoint, ".pt") {
		return
	}
	prev := s.commitsOf(m)
	s.trace("restore "+m.Commit, a, m.Checkpoint)
	synctest.Wait() // the agents' requests of this moment see the faults they saw so far
	s.b.setFaults(simFaults{})
	res, err := Restore(s.t.Context(), clean, RestoreOptions{Job: s.job, Checkpoint: m.Checkpoint, Commit: m.Commit, CommitSet: true,
		To: a.dir, Logger: zerolog.Nop()})
	if errors.Is(err, ErrNotFound) {
		return // retention deleted it meanwhile
	}
	if err != nil {
		s.fail("restore: %v", err)
	}
	s.snapshot(a)
	found, _ := Scan(a.dir, "", "*.pt", zerolog.Nop())
	for _, lc := range found {
		if lc.Name != res.Checkpoint {
			continue
		}
		for _, f := range lc.Files {
			s.send(a, WatchEvent{Kind: FileReady, Checkpoint: lc.Name, Path: f.Path, ID: f.ID})
		}
		s.complete(a, lc.Name)
	}
	// Give the agent time to look at it; nothing may be sent as a new commit.
	advance(time.Minute)
	synctest.Wait()
	gone := false // retention deleted the restored commit meanwhile: committing it again is right
	if _, _, err := clean.GetBytes(s.t.Context(), ManifestKey(m.Job, m.Checkpoint, m.Commit)); errors.Is(err, ErrNotFound) {
		gone = true
	}
	if got := s.commitsOf(m); got != prev && !a.noticed && !gone {
		if fp, ok := s.fingerprint(a, m.Checkpoint); ok && fp == manifestFingerprint(m) {
			s.fail("a restored checkpoint %s was committed again (%d manifests written with its bytes; %d before)", m.Checkpoint, got, prev)
		}
	}
}

// commitsOf counts the manifests ever written with m's checkpoint name and files: another agent
// may commit other bytes under the same name meanwhile.
func (s *sim) commitsOf(m *Manifest) int {
	s.b.mu.Lock()
	defer s.b.mu.Unlock()
	fp := manifestFingerprint(m)
	n := 0
	for _, v := range s.b.everCommitted[m.Checkpoint] {
		if v == fp {
			n++
		}
	}
	return n
}

// settle turns the faults off, starts every agent, and checks that everything complete locally
// is committed with its current bytes within a bounded time (I5); then I6 and a restore.
func (s *sim) settle() {
	s.b.setFaults(simFaults{maxLatency: 50 * time.Millisecond})
	for _, a := range s.agents {
		if !s.running(a) {
			s.startAgent(a)
		}
	}
	for _, a := range s.agents {
		s.unlockAll(a) // the trainer's files, readable again, are committed too
	}
	const bound = 20 * time.Minute
	deadline := time.Now().Add(bound)
	for {
		advance(10 * time.Second)
		synctest.Wait()
		s.check()
		missing := s.uncommitted()
		if len(missing) == 0 {
			break
		}
		if time.Now().After(deadline) {
			var status []string
			for _, a := range s.agents {
				st := a.up.Status(s.t.Context())
				for _, c := range st.Checkpoints {
					status = append(status, fmt.Sprintf("%s: %+v", a.name, c))
				}
			}
			var lines []string
			for _, l := range strings.Split(s.logs.tail(100000), "\n") {
				for _, m := range missing {
					if strings.Contains(l, `"checkpoint":"`+strings.SplitN(m, ":", 2)[1]+`"`) {
						lines = append(lines, l)
					}
				}
			}
			var versions []string
			for _, m := range missing {
				agent, name, _ := strings.Cut(m, ":")
				for _, a := range s.agents {
					if a.name == agent {
						fp, _ := s.fingerprint(a, name)
						versions = append(versions, "local "+m+":\n"+fp)
					}
				}
				for _, man := range s.b.manifests() {
					if man.Checkpoint == name {
						versions = append(versions, "commit "+man.Commit+" by "+man.Host.Hostname+":\n"+manifestFingerprint(man))
					}
				}
			}
			s.fail("I5: not committed %v after the store came back: %s\nstatus:\n  %s\nversions:\n%s\nits log lines:\n%s", bound,
				strings.Join(missing, ", "), strings.Join(status, "\n  "), strings.Join(versions, "\n"), strings.Join(lines[max(0, len(lines)-40):], "\n"))
		}
	}
	// Quiet: every agent idle. Stop them, so no retention or cleanup runs while we look, and let
	// every held write land.
	for _, a := range s.agents {
		s.stopAgent(a)
	}
	s.awaitLate()
	if s.b.tornLeft() {
		// A held write landed over deleted objects after its agents stopped: no agent runs to
		// see it, and S3 cannot refuse it. The next run of each resumes its journal's late
		// clean-ups, which look for such manifests: run them once more, as the job's next runs.
		s.t.Logf("a manifest landed over deleted objects after the agents stopped; running them once more")
		for _, a := range s.agents {
			s.startAgent(a)
		}
		for deadline := time.Now().Add(tornFor); s.b.tornLeft() && time.Now().Before(deadline); {
			advance(time.Second)
		}
		for _, a := range s.agents {
			s.stopAgent(a)
		}
		s.awaitLate()
	}
	s.b.checkTorn(true)
	if s.b.tears > 0 {
		s.t.Logf("%d manifests were written over deleted objects by two agents' race, and deleted by them", s.b.tears)
	}
	s.check()
	clean := s.b.connect("check")
	if left := append(s.lateStrays(clean), s.incompleteLeft()...); len(left) > 0 {
		// Held writes landed under commits after the agents stopped, or an upload whose abort
		// failed is left under one while the store refused every late pass until the agents
		// stopped (their late passes end with them): the next run of each resumes its
		// journal's late clean-ups. Run them once more, as the job's next runs, for as long as
		// those passes take.
		s.t.Logf("leftovers under commits after the agents stopped (%s); running them once more", strings.Join(left, ", "))
		for _, a := range s.agents {
			s.startAgent(a)
		}
		for deadline := time.Now().Add(lateAborts[len(lateAborts)-1] + 30*time.Second); len(s.lateStrays(clean))+len(s.incompleteLeft()) > 0 && time.Now().Before(deadline); {
			advance(time.Second)
		}
		for _, a := range s.agents {
			s.stopAgent(a)
		}
		s.awaitLate()
	}
	s.storeCheck(clean)
	for _, k := range s.incompleteLeft() {
		s.fail("I7: an incomplete upload is left under a commit: %s", k)
	}
	to := filepath.Join(s.root, "restored")
	res, err := Restore(s.t.Context(), clean, RestoreOptions{Job: s.job, To: to, Logger: zerolog.Nop()})
	st, _ := readJob(s.t.Context(), clean, s.job, nil)
	if errors.Is(err, ErrSplitSave) && st.Newest() != nil {
		// Agents a and b share the job: the same name saved by both within a minute, each with
		// paths the other lacks, is a save in pieces, never restored as the checkpoint.
		if len(splitWith(st.Newest().Manifest, manifestsOf(st.Commits), scanDefaultMarker)) > 0 {
			return
		}
	}
	if err != nil {
		if len(s.b.manifests()) == 0 {
			return
		}
		s.fail("restore of the newest commit: %v", err)
	}
	if n := st.Newest().Manifest; n.Commit != res.Commit || n.Checkpoint != res.Checkpoint {
		s.fail("I6: restore took %s/%s, not the newest commit %s/%s", res.Checkpoint, res.Commit, n.Checkpoint, n.Commit)
	}
}

// storeCheck runs CheckJob: every problem is a fault, an object a held write landed in a commit
// too, once the agents ran their late clean-ups to the end (see lateStrays).
func (s *sim) storeCheck(clean Store) {
	var problems []string
	for _, p := range CheckJob(s.t.Context(), clean, s.job, true) {
		problems = append(problems, p.Error())
	}
	if len(problems) > 0 {
		s.fail("store check:\n  %s", strings.Join(problems, "\n  "))
	}
}

// incompleteLeft lists the keys of the incomplete uploads under commits: the late clean-ups of
// the agent that wrote the commit abort them, while it runs.
func (s *sim) incompleteLeft() []string {
	committed := map[string]bool{}
	for _, m := range s.b.manifests() {
		committed[CommitPrefix(m.Job, m.Checkpoint, m.Commit)] = true
	}
	var keys []string
	for _, k := range s.b.incomplete() {
		for p := range committed {
			if strings.HasPrefix(k, p) {
				keys = append(keys, k)
				break
			}
		}
	}
	return keys
}

// lateStrays lists the objects under commits that their manifests do not list and that a held
// write landed: the late clean-ups of the agent that wrote the commit delete them, while it runs.
func (s *sim) lateStrays(clean Store) []string {
	var keys []string
	for _, p := range CheckJob(s.t.Context(), clean, s.job, true) {
		if stray, ok := errors.AsType[*StrayObject](p); ok {
			s.b.mu.Lock()
			late := s.b.lateKeys[stray.Key]
			s.b.mu.Unlock()
			if late {
				keys = append(keys, stray.Key)
			}
		}
	}
	return keys
}

// uncommitted lists the complete local checkpoints whose current bytes were never committed. A
// checkpoint from which the trainer deleted files after a commit is still that commit (its
// files are a subset of it): deleting files is not a new version worth a commit, which would
// take the newest place from the whole one.
func (s *sim) uncommitted() []string {
	s.b.mu.Lock()
	have := maps.Clone(s.b.everCommitted) // retention may have deleted it since: that is its job
	s.b.mu.Unlock()
	var missing []string
	for _, a := range s.agents {
		for _, name := range localCheckpoints(a) {
			fp, ok := s.fingerprint(a, name)
			if !ok || s.reopened[a.name+":"+name] || s.hasLocked(a, name) {
				continue
			}
			local := strings.Split(fp, "\n")
			if !slices.ContainsFunc(have[name], func(v string) bool {
				lines := strings.Split(v, "\n")
				return !slices.ContainsFunc(local, func(l string) bool { return !slices.Contains(lines, l) })
			}) {
				missing = append(missing, a.name+":"+name)
			}
		}
	}
	return missing
}

// awaitLate lets every write the network held land.
func (s *sim) awaitLate() {
	for {
		s.b.mu.Lock()
		n := s.b.late
		s.b.mu.Unlock()
		if n == 0 {
			return
		}
		advance(time.Second)
	}
}

// advance lets d pass on the bubble's fake clock (the agents run meanwhile), and waits for what
// the agents do at its end.
func advance(d time.Duration) {
	<-time.After(d)
	synctest.Wait()
}

func errStrings(errs []error) []string {
	out := make([]string, len(errs))
	for i, e := range errs {
		out[i] = e.Error()
	}
	return out
}

// troubleAct takes one of the trouble mode's steps that change a checkpoint directory besides a
// save: a chmod -R of it, a marker written again, a checkpoint copied with hard links (cp -al).
// Its draws come from s.more.
func (s *sim) troubleAct(a *simAgent) {
	if a == nil {
		a = s.agents[s.more.IntN(len(s.agents))]
	}
	switch s.more.IntN(3) {
	case 0:
		s.chmodAll(a)
	case 1:
		s.rewriteMarker(a)
	default:
		s.linkCopy(a)
	}
}

// moreFile writes size random bytes from s.more to p.
func (s *sim) moreFile(p string, size int) { s.fileFrom(s.more, p, size) }

// pickComplete returns one of a's complete checkpoint directories (not single files), drawn from
// s.more, or false.
func (s *sim) pickComplete(a *simAgent) (string, bool) { return s.pickCompleteFrom(s.more, a) }

// pickCompleteFrom is pickComplete drawing from rng.
func (s *sim) pickCompleteFrom(rng *rand.Rand, a *simAgent) (string, bool) {
	var names []string
	for _, name := range localCheckpoints(a) {
		fi, err := os.Lstat(filepath.Join(a.dir, name))
		if _, ok := s.fingerprint(a, name); ok && err == nil && fi.IsDir() {
			names = append(names, name)
		}
	}
	if len(names) == 0 {
		return "", false
	}
	return names[rng.IntN(len(names))], true
}

// sendAll sends what the watcher sends when every file of checkpoint name changed its
// attributes or appeared at once: each file ready, and the marker completing it.
func (s *sim) sendAll(a *simAgent, name string) {
	root := filepath.Join(a.dir, name)
	for _, p := range regularFiles(root, func(p string) bool { return p == root || filepath.Base(p) != "_COMPLETE" }) {
		rel := name
		if p != root {
			r, _ := filepath.Rel(root, p)
			rel = filepath.ToSlash(r)
		}
		if s.locked[a.name+":"+name+"/"+rel] {
			continue // skipped by the watcher
		}
		s.send(a, WatchEvent{Kind: FileReady, Checkpoint: name, Path: rel, ID: s.fileID(p)})
	}
	if _, ok := s.fingerprint(a, name); ok {
		s.complete(a, name)
	}
}

// chmodAll is chmod -R of a's checkpoint directory: every file's change time moves, and no byte.
func (s *sim) chmodAll(a *simAgent) {
	mode := fs.FileMode(0o640)
	if s.more.IntN(2) == 0 {
		mode = 0o644
	}
	s.trace("chmod -R", a, "")
	s.unlockAll(a)
	names := localCheckpoints(a)
	for _, name := range names {
		for _, p := range regularFiles(filepath.Join(a.dir, name), func(string) bool { return true }) {
			os.Chmod(p, mode)
		}
	}
	for _, name := range names {
		s.sendAll(a, name)
	}
}

// rewriteMarker writes the marker of a complete checkpoint again, with other bytes (another
// token), after its commit perhaps.
func (s *sim) rewriteMarker(a *simAgent) {
	name, ok := s.pickComplete(a)
	if !ok {
		return
	}
	// Of another size: the simulation runs through its steps within the file system's timestamp
	// granularity, where a rewrite of the same size in place leaves the file's FileID as it was
	// (which a real trainer, writing the marker once per save, never does within a tick of its
	// commit).
	s.trace("rewrite the marker", a, name)
	p := filepath.Join(a.dir, name, "_COMPLETE")
	fi, err := os.Lstat(p)
	if err != nil {
		s.fail("%v", err)
	}
	if FileIDOf(fi).Nlink > 1 {
		// Written anew, not through the other name too (linkCopy): a write in place would change
		// the other checkpoint without a watch event for it, as it would for a real watcher.
		os.Remove(p)
	}
	s.moreFile(p, int(fi.Size())+1+s.more.IntN(64))
	delete(s.reopened, a.name+":"+name)
	s.snapshot(a)
	s.complete(a, name)
}

// linkCopy copies a complete checkpoint under a new name with hard links (cp -al), as a trainer
// keeping a "best" copy does.
func (s *sim) linkCopy(a *simAgent) {
	from, ok := s.pickComplete(a)
	if !ok || s.hasLocked(a, from) {
		return
	}
	s.names++
	name := fmt.Sprintf("step-%06d", 100*s.names)
	s.trace("cp -al "+from, a, name)
	src, dst := filepath.Join(a.dir, from), filepath.Join(a.dir, name)
	for _, p := range regularFiles(src, func(string) bool { return true }) {
		rel, _ := filepath.Rel(src, p)
		if err := os.MkdirAll(filepath.Dir(filepath.Join(dst, rel)), 0o755); err != nil {
			s.fail("%v", err)
		}
		if err := os.Link(p, filepath.Join(dst, rel)); err != nil {
			s.fail("%v", err)
		}
	}
	s.snapshot(a)
	s.sendAll(a, name)
}

// simTrainerUID owns the agents' checkpoint directories when the simulation runs as root: the
// trainer's user, another than the agent's.
const simTrainerUID = 12345

// own gives p, a file the trainer wrote, to the trainer's user when the simulation runs as root.
func (s *sim) own(p string) {
	if os.Geteuid() != 0 {
		return
	}
	if err := os.Chown(p, simTrainerUID, simTrainerUID); err != nil {
		s.fail("%v", err)
	}
}

// oddAct is one step of a trainer doing something less usual, in the trouble mode, drawn from
// s.odd: a save staged under another name and renamed into place, a file of a complete
// checkpoint the trainer cannot read (only as root: the agent reads what the trainer cannot),
// or such files made readable again.
func (s *sim) oddAct(a *simAgent) {
	a = s.anyAgent(a)
	switch r := s.odd.IntN(10); {
	case r < 5:
		s.stagedSave(a)
	case r < 8:
		if os.Geteuid() == 0 {
			s.lock(a)
		}
	default:
		s.unlockAll(a)
	}
}

// oddFile writes size random bytes from s.odd to p.
func (s *sim) oddFile(p string, size int) { s.fileFrom(s.odd, p, size) }

// stagedSave writes a checkpoint under a staging name (tmp-step-N), then renames the directory
// into place, as trainers that stage their saves do (Hugging Face's tmp-checkpoint-N): its marker
// is written before the rename (a complete checkpoint under the staging name, committed or not
// by the time it is renamed) or after it.
func (s *sim) stagedSave(a *simAgent) {
	a.trainerGone.Store(false)
	s.names++
	name := fmt.Sprintf("step-%06d", 100*s.names)
	stage := "tmp-" + name
	s.trace("save staged as "+stage, a, name)
	dir := filepath.Join(a.dir, stage)
	for i := range 1 + s.odd.IntN(4) {
		rel := fmt.Sprintf("shard-%d.bin", i)
		p := filepath.Join(dir, rel)
		s.oddFile(p, 1+s.odd.IntN(150<<10))
		s.send(a, WatchEvent{Kind: FileReady, Checkpoint: stage, Path: rel, ID: s.fileID(p)})
		advance(time.Duration(s.odd.IntN(1500)) * time.Millisecond)
	}
	early := s.odd.IntN(2) == 0
	if early {
		s.oddFile(filepath.Join(dir, "_COMPLETE"), s.odd.IntN(64))
		s.snapshot(a)
		s.complete(a, stage)
		advance(time.Duration(s.odd.IntN(4000)) * time.Millisecond)
		synctest.Wait()
	}
	if err := os.Rename(dir, filepath.Join(a.dir, name)); err != nil {
		s.fail("%v", err)
	}
	s.send(a, WatchEvent{Kind: Removed, Checkpoint: stage, Moved: true})
	if !early {
		s.oddFile(filepath.Join(a.dir, name, "_COMPLETE"), s.odd.IntN(64))
	}
	s.snapshot(a)
	s.sendAll(a, name)
}

// lock makes one file of a complete checkpoint of a unreadable to the trainer (another user's,
// mode 200), as a save run by another user leaves it: the watcher takes it back (FileGone), and
// the checkpoint is withheld, never committed without it, until it is readable again.
func (s *sim) lock(a *simAgent) {
	name, ok := s.pickCompleteFrom(s.odd, a)
	if !ok {
		return
	}
	root := filepath.Join(a.dir, name)
	files := regularFiles(root, func(p string) bool { return filepath.Base(p) != "_COMPLETE" && !s.lockedPath(a, name, p) })
	if len(files) == 0 {
		return
	}
	p := files[s.odd.IntN(len(files))]
	fi, err := os.Lstat(p)
	if err != nil || FileIDOf(fi).Nlink > 1 {
		return // a hard link (linkCopy): the other checkpoint's file would change with it
	}
	r, _ := filepath.Rel(root, p)
	rel := filepath.ToSlash(r)
	s.trace("chmod 200 "+rel, a, name)
	if err := os.Chown(p, 0, 0); err != nil {
		s.fail("%v", err)
	}
	if err := os.Chmod(p, 0o200); err != nil {
		s.fail("%v", err)
	}
	s.locked[a.name+":"+name+"/"+rel] = true
	s.send(a, WatchEvent{Kind: FileGone, Checkpoint: name, Path: rel})
}

// unlockAll makes every file of a that the trainer could not read readable again: the watcher
// reports each, then each checkpoint that has its marker and no other such file is complete,
// without its marker written again.
func (s *sim) unlockAll(a *simAgent) {
	var names []string
	for _, k := range slices.Sorted(maps.Keys(s.locked)) { // in one order: the seed replays
		agent, path, _ := strings.Cut(k, ":")
		if agent != a.name {
			continue
		}
		name, rel, _ := strings.Cut(path, "/")
		delete(s.locked, k)
		p := filepath.Join(a.dir, name, filepath.FromSlash(rel))
		if err := os.Chmod(p, 0o644); err != nil {
			s.fail("%v", err)
		}
		s.own(p)
		names = append(names, name)
		s.trace("chmod 644 "+rel, a, name)
		s.send(a, WatchEvent{Kind: FileReady, Checkpoint: name, Path: rel, ID: s.fileID(p)})
	}
	slices.Sort(names)
	for _, name := range slices.Compact(names) {
		if _, ok := s.fingerprint(a, name); ok {
			s.complete(a, name)
		}
	}
}

// lockedPath reports whether p, a file of a's checkpoint name, is one the trainer cannot read.
func (s *sim) lockedPath(a *simAgent, name, p string) bool {
	r, err := filepath.Rel(filepath.Join(a.dir, name), p)
	return err == nil && s.locked[a.name+":"+name+"/"+filepath.ToSlash(r)]
}

// hasLocked reports whether a's checkpoint name has a file the trainer cannot read.
func (s *sim) hasLocked(a *simAgent, name string) bool {
	prefix := a.name + ":" + name + "/"
	for k := range s.locked {
		if strings.HasPrefix(k, prefix) {
			return true
		}
	}
	return false
}

// forgetLocks forgets the files of a's checkpoint name that the trainer could not read: it was
// deleted, or is written anew.
func (s *sim) forgetLocks(a *simAgent, name string) {
	prefix := a.name + ":" + name + "/"
	maps.DeleteFunc(s.locked, func(k string, _ bool) bool { return strings.HasPrefix(k, prefix) })
}
