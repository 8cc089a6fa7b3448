package e2e

import (
	"bytes"
	"context"
	"encoding/binary"
	"encoding/json"
	"errors"
	"fmt"
	"io/fs"
	"maps"
	"math/rand/v2"
	"net/http"
	"os"
	"os/signal"
	"path/filepath"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	awsconfig "github.com/aws/aws-sdk-go-v2/config"
	"github.com/aws/aws-sdk-go-v2/credentials"
	"github.com/aws/smithy-go/logging"
	"github.com/rs/zerolog"

	"github.com/spotguard/spotguard/checkpoint"
)

const (
	// soakShort is how long TestSoak runs when SPOTGUARD_SOAK is unset.
	soakShort = 20 * time.Second
	// soakSettle bounds how long the agent may take, undisturbed and at full speed, to commit
	// every complete local checkpoint at the end (I5).
	soakSettle = 60 * time.Second
	// soakStopWait bounds how long a SIGTERMed agent may take to exit: its stop budget, plus a
	// margin.
	soakStopWait = soakStopBudget + 15*time.Second
	// soakStopBudget is the agents' agent.stop_budget: shorter than the default, so a drain that
	// waits for a checkpoint the held-still trainer never writes does not hold a phase for long.
	soakStopBudget = 40 * time.Second
	// soakShortSeed is the seed of the short soak: the one that found that the watcher stopped on
	// SIGTERM while the trainer was still writing a notice's checkpoint.
	soakShortSeed = 15830099032595371875
	soakJob       = "soak"
	soakPrefix    = "soak"
	soakMarker    = "_COMPLETE"
)

// soakRates are the throttle's rates for a phase run over a slow link.
var soakRates = []int64{512 << 10, 2 << 20, 8 << 20}

// TestSoak runs the scenarios of checkpoint's seeded simulation (checkpoint/sim_test.go) against
// the real thing: the built `spotguard run` binary, with its real fsnotify watcher, uploads real
// files to versitygw, for as long as SPOTGUARD_SOAK says (a Go duration; `make soak` runs 10m).
// When SPOTGUARD_SOAK is unset it runs a short soak of about 20 s, so that every run of the
// end-to-end tests exercises it (it is never skipped for want of the variable). The run's choices
// come from one seed, SPOTGUARD_SOAK_SEED (random when a soak is asked for, a fixed one for the
// short soak), printed at the start and, with the
// command that replays it, on failure; the timing of real processes is not replayed, so a replay
// makes the same moves but may interleave them differently.
//
// A trainer (a goroutine) writes into checkpoint.dir all along: step-NNNNNN/ directories of 1–8
// files of up to a few MiB (some over the 5 MiB part size, so multipart uploads are used),
// written directly, in two halves with a pause, through a dot-temp name renamed into place, or
// through a visible NAME.tmp left quiet for over a second and then renamed; the marker last, and
// sometimes never (the trainer died). It rewrites files of complete checkpoints (same size,
// whole or a range in place, sometimes with the mtime set back), deletes checkpoints and files,
// saves an old name again (a rollback), keeps at most a few checkpoints on disk, writes
// single-file checkpoints (model-N.pt) through a temporary name, and now and then a checkpoint of
// 200–1000 small files. The agent finds the trainer by a pidfile naming the test process, so a
// notice's SIGUSR1 makes the trainer save at once.
//
// Meanwhile the run goes through phases. Each starts an agent (if none runs) with the runtime
// directory of the one before, straight to versitygw or through a throttled link; during a phase
// the IMDS simulator may start or end a spot notice (restarting it, so the agent also sees IMDS
// go away), the agent may be told to sync (SIGUSR1), and the link's rate may change. A phase ends
// with a SIGKILL, a SIGTERM (the agent must exit within its stop budget, with status 0) or
// nothing (the agent goes on into the next phase). LATEST is read twice a second throughout. A
// stop during a notice may take up to the stop budget (140 s), so a short soak can last minutes.
// When a stop spends the whole budget while the trainer held still, every complete local
// checkpoint must be committed by then unless the link is too slow for it (see term).
//
// After every phase it checks, on what the store holds: checkpoint.CheckJob (settled=false)
// finds no violation; every manifest lists a version of its checkpoint the trainer had
// complete (the same set of paths and CRC-32Cs); LATEST only moves forward
// (checkpoint.CheckLatestForward against every earlier reading). At the end, with the trainer
// stopped and the agent undisturbed at full speed: within soakSettle every complete local
// checkpoint's current version (or a superset of it: files deleted after a commit do not make a
// new version) is committed (I5); no multipart upload is left under a committed commit; then,
// with the agent stopped, CheckJob (settled=true) finds no violation, `spotguard restore` of the
// newest commit gives the files its manifest lists (restore verifies every checksum) and a
// version the trainer had, and a few older commits restored in-process do too.
//
// On failure it prints the agent log lines that name the checkpoint concerned and writes every
// agent's log to a file in the temporary directory.
func TestSoak(t *testing.T) {
	needPeers(t)
	awsBin(t)
	dur := soakShort
	if v := os.Getenv("SPOTGUARD_SOAK"); v != "" {
		d, err := time.ParseDuration(v)
		if err != nil || d <= 0 {
			t.Fatalf("SPOTGUARD_SOAK=%q: want a positive duration such as 10m", v)
		}
		dur = d
		if dl, ok := t.Deadline(); ok && time.Until(dl) < dur+5*time.Minute {
			t.Fatalf("SPOTGUARD_SOAK=%s does not fit in go test's -timeout (%s left): run `make soak SOAK=%s` or add -timeout 0",
				dur, time.Until(dl).Round(time.Second), v)
		}
	}
	// The short soak of every test run uses a fixed seed, so the suite does not change from run
	// to run; a soak asked for (SPOTGUARD_SOAK set) explores a new seed each time.
	seed := uint64(soakShortSeed)
	if os.Getenv("SPOTGUARD_SOAK") != "" {
		seed = rand.Uint64()
	}
	if v := os.Getenv("SPOTGUARD_SOAK_SEED"); v != "" {
		var err error
		if seed, err = strconv.ParseUint(v, 10, 64); err != nil {
			t.Fatalf("SPOTGUARD_SOAK_SEED=%q: want an unsigned integer", v)
		}
	}
	replay := fmt.Sprintf("SPOTGUARD_SOAK=%s SPOTGUARD_SOAK_SEED=%d PATH=$PWD/bin:$PATH go test -count=1 -run TestSoak -v -timeout 0 ./test/e2e/", dur, seed)
	t.Logf("soak: %s, seed %d", dur, seed)
	t.Cleanup(func() {
		if t.Failed() {
			t.Logf("soak seed %d; replay: %s", seed, replay)
		}
	})

	// The agent signals the trainer, which is this process: SIGUSR1 must be caught, not fatal,
	// until every agent is gone (this cleanup runs after theirs).
	sigs := make(chan os.Signal, 1)
	signal.Notify(sigs, syscall.SIGUSR1)
	t.Cleanup(func() { signal.Stop(sigs) })

	s := newSoak(t, seed)
	s.trainer.sigs = sigs
	s.run(dur)
}

// soak is one soak run. Everything but the trainer runs on the test goroutine.
type soak struct {
	t    *testing.T
	seed uint64
	rng  *rand.Rand // the run's choices (the trainer has its own)

	s3    *s3Server
	slow  *throttle
	imds  *imdsSim
	store checkpoint.Store
	ckdir string
	// runtimeDir is the agent's runtime directory, the same for every incarnation (as systemd
	// keeps /run/spotguard across restarts), so a restarted agent resumes its own commits.
	runtimeDir string
	pidfile    string

	trainer     *soakTrainer
	rec         *soakRecord
	trainerErr  chan error
	stopTrainer context.CancelFunc

	agent       *agentProc // the running agent, or nil
	incarnation int
	throttled   bool // the running agent goes through slow
	rate        int64
	noticeOn    bool
	logs        []string // every incarnation's log file, in order

	latest  *checkpoint.Latest // the last LATEST read
	checked map[string]bool    // manifests already checked against the trainer's record
	stats   soakStats
}

type soakStats struct {
	phases, kills, terms, keeps, syncs, notices, rateChanges, throttledRuns, transient, budgetSpent int
	// leftAtStop counts the checkpoints an agent said were complete and not committed when it
	// got SIGTERM, and that were still not committed when it had exited without a drain.
	leftAtStop  int
	longestStop time.Duration
}

func newSoak(t *testing.T, seed uint64) *soak {
	s := &soak{
		t: t, seed: seed, rng: rand.New(rand.NewPCG(seed, 1)),
		ckdir: t.TempDir(), checked: map[string]bool{}, trainerErr: make(chan error, 1),
	}
	state := t.TempDir()
	s.runtimeDir = filepath.Join(state, "run")
	s.pidfile = filepath.Join(state, "trainer.pid")
	if err := os.WriteFile(s.pidfile, []byte(strconv.Itoa(os.Getpid())+"\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	s.s3 = startS3(t)
	s.slow = startThrottle(t, strings.TrimPrefix(s.s3.endpoint, "http://"), soakRates[0])
	s.imds = newIMDS(t)
	s.imds.start(soakQuietIMDS...)

	// The checker's own client, straight to versitygw.
	cfg, err := awsconfig.LoadDefaultConfig(t.Context(), awsconfig.WithRegion("us-east-1"),
		awsconfig.WithCredentialsProvider(credentials.NewStaticCredentialsProvider(s3Access, s3Secret, "")),
		awsconfig.WithBaseEndpoint(s.s3.endpoint), awsconfig.WithLogger(logging.Nop{}))
	if err != nil {
		t.Fatal(err)
	}
	if s.store, err = checkpoint.OpenStore(s.storeURL(), cfg, checkpoint.S3Options{PartSize: 5 << 20}); err != nil {
		t.Fatal(err)
	}
	var b [32]byte
	seeder := rand.New(rand.NewPCG(seed, 3))
	for i := range 4 {
		binary.LittleEndian.PutUint64(b[8*i:], seeder.Uint64())
	}
	s.rec = &soakRecord{versions: map[string]map[string]bool{}}
	s.trainer = &soakTrainer{
		dir: s.ckdir, rng: rand.New(rand.NewPCG(seed, 2)), bytes: rand.NewChaCha8(b), rec: s.rec,
		model: map[string]map[string]string{}, complete: map[string]bool{},
	}
	return s
}

var (
	soakQuietIMDS  = []string{"spot", "-d", "100000", "--rebalance-delay-sec", "100000"}
	soakNoticeIMDS = []string{"spot", "-a", "terminate", "--rebalance-delay-sec", "100000"}
)

func (s *soak) storeURL() string { return "s3://" + s3Bucket + "/" + soakPrefix }

// run is the whole soak: phases for dur, then the settled checks.
func (s *soak) run(dur time.Duration) {
	ctx, cancel := context.WithCancel(context.Background())
	s.stopTrainer = cancel
	go func() { s.trainerErr <- s.trainer.run(ctx) }()
	s.t.Cleanup(s.haltTrainer)

	maxPhase := min(max(dur/5, 2*time.Second), 20*time.Second)
	begin := time.Now()
	for phase := 1; time.Since(begin) < dur; phase++ {
		s.stats.phases++
		if s.agent == nil {
			s.startAgent()
		}
		desc := s.describe()
		length := 200*time.Millisecond + time.Duration(s.rng.Int64N(int64(maxPhase)))
		if s.rng.IntN(10) == 0 {
			length = time.Duration(50+s.rng.IntN(700)) * time.Millisecond // mid start-up
		}
		var events []string
		parts := 1 + s.rng.IntN(3)
		for range parts {
			s.watch(length/time.Duration(parts), nil)
			if e := s.midPhase(); e != "" {
				events = append(events, e)
			}
		}
		s.check(fmt.Sprintf("phase %d", phase))
		var end string
		switch r := s.rng.IntN(100); {
		case r < 40:
			s.kill()
			end = "SIGKILL"
		case r < 75:
			took := s.term()
			end = fmt.Sprintf("SIGTERM (exited after %.1f s)", took.Seconds())
		default:
			s.stats.keeps++
			end = "goes on"
		}
		s.t.Logf("phase %d: %s, %.1f s%s; %s; store: %d commits, LATEST %s", phase, desc, length.Seconds(),
			strings.Join(append([]string{""}, events...), ", "), end, len(s.checked), s.latestName())
		if s.agent == nil && s.rng.IntN(2) == 0 {
			s.watch(time.Duration(s.rng.IntN(3000))*time.Millisecond, nil) // the trainer writes on while no agent runs
		}
	}
	s.settle()
}

func (s *soak) describe() string {
	link := "straight to versitygw"
	if s.throttled {
		link = fmt.Sprintf("through a %s/s link", checkpoint.HumanBytes(s.rate))
	}
	notice := ""
	if s.noticeOn {
		notice = ", spot notice on"
	}
	return fmt.Sprintf("agent #%d %s%s", s.incarnation, link, notice)
}

func (s *soak) latestName() string {
	if s.latest == nil {
		return "none"
	}
	return s.latest.Checkpoint + "/" + s.latest.Commit
}

// midPhase does one random thing to the running agent's world, and says what.
func (s *soak) midPhase() string {
	switch r := s.rng.IntN(100); {
	case r < 10:
		s.setNotice(!s.noticeOn)
		if s.noticeOn {
			return "spot notice starts"
		}
		return "spot notice ends"
	case r < 20:
		s.stats.syncs++
		s.agent.cmd.Process.Signal(syscall.SIGUSR1)
		return "SIGUSR1 (sync)"
	case r < 35 && s.throttled:
		s.stats.rateChanges++
		s.rate = soakRates[s.rng.IntN(len(soakRates))]
		s.slow.rate.Store(s.rate)
		return fmt.Sprintf("link now %s/s", checkpoint.HumanBytes(s.rate))
	}
	return ""
}

// setNotice restarts the IMDS simulator with a spot notice, or without one.
func (s *soak) setNotice(on bool) {
	s.imds.stop()
	if on {
		s.stats.notices++
		s.imds.start(soakNoticeIMDS...)
	} else {
		s.imds.start(soakQuietIMDS...)
	}
	s.noticeOn = on
}

// startAgent starts the next incarnation of the agent, with the runtime directory of the ones
// before, straight to versitygw or (sometimes) through the throttle.
func (s *soak) startAgent() {
	s.incarnation++
	s.throttled = s.rng.IntN(5) < 2
	endpoint := ""
	if s.throttled {
		s.stats.throttledRuns++
		s.rate = soakRates[s.rng.IntN(len(soakRates))]
		s.slow.rate.Store(s.rate)
		endpoint = s.slow.url()
	}
	s.startAgentVia(endpoint)
}

func (s *soak) startAgentVia(endpoint string) {
	env := append([]string{
		"SPOTGUARD_TRAINER_PIDFILE=" + s.pidfile,
		"SPOTGUARD_CHECKPOINT_DIR=" + s.ckdir,
		"SPOTGUARD_CHECKPOINT_PATTERN=*.pt",
		"SPOTGUARD_STORE_URL=" + s.storeURL(),
		"SPOTGUARD_STORE_JOB=" + soakJob,
		"SPOTGUARD_STORE_PART_SIZE=5MiB",
		"SPOTGUARD_AGENT_RUNTIME_DIR=" + s.runtimeDir,
		"SPOTGUARD_AGENT_STOP_BUDGET=" + soakStopBudget.String(),
	}, s.s3.env(endpoint)...)
	s.agent = startAgent(soakTB{s.t}, s.imds, env...)
	s.logs = append(s.logs, s.agent.logPath)
}

// soakTB is the soak's testing.TB for startAgent, whose cleanup prints an agent's whole log when
// the test has failed: the soak runs dozens of agents, so it reports the log lines that matter
// itself and writes every log to a file (see fail).
type soakTB struct{ testing.TB }

func (soakTB) Failed() bool { return false }

// kill is kill -9 of the running agent.
func (s *soak) kill() {
	s.stats.kills++
	s.agent.cmd.Process.Kill()
	<-s.agent.done
	s.agent = nil
}

// term sends SIGTERM to the running agent and waits until it exits (within its stop budget, with
// status 0); it returns how long that took. The trainer mostly holds still from then on (it
// finishes the move it is in), as a reclaimed instance's trainer would, so that a drain is not
// kept going by new checkpoints.
//
// When the trainer held still and the agent spent its whole stop budget, every complete local
// checkpoint must be committed by then unless the link is too slow for it (I5; DESIGN.md:
// "Stop (SIGTERM) drains ... every complete, uncommitted checkpoint", and the watcher keeps
// running during the drain). Without a drain, the complete checkpoints the agent had not
// committed when it got SIGTERM are counted (leftAtStop).
func (s *soak) term() time.Duration {
	s.stats.terms++
	held := s.noticeOn || s.rng.IntN(4) != 0
	if held {
		s.trainer.hold.Store(true)
		defer s.trainer.hold.Store(false)
	}
	pending := s.pendingInAgent()
	began := time.Now()
	s.agent.cmd.Process.Signal(syscall.SIGTERM)
	if !s.watch(soakStopWait, s.agent.done) {
		s.fail(nil, "the agent did not exit within %s of SIGTERM", soakStopWait)
	}
	took := time.Since(began)
	s.stats.longestStop = max(s.stats.longestStop, took)
	if err := s.agent.exitErr; err != nil {
		s.agent = nil
		s.fail(nil, "the agent exited with %v after SIGTERM; want status 0", err)
	}
	spent := strings.Contains(s.agent.log(s.t), "stop budget spent")
	s.agent = nil
	if spent {
		s.stats.budgetSpent++
		s.t.Logf("the agent spent its whole stop budget (it had %v complete and not committed at SIGTERM; the trainer held still: %v); every agent's log: %s",
			pending, held, s.saveLogs())
	}
	if !held {
		return took
	}
	ctx, cancel := context.WithTimeout(s.t.Context(), time.Minute)
	defer cancel()
	local := s.diskComplete()
	missing := uncommitted(local, s.checkManifests(ctx, "after SIGTERM"))
	if spent && len(missing) > 0 {
		var size int64
		for _, name := range missing {
			size += diskBytes(filepath.Join(s.ckdir, name))
		}
		rate := int64(32 << 20) // straight to versitygw: conservatively
		if s.throttled {
			rate = s.rate
		}
		if send := time.Duration(float64(size) / float64(rate) * float64(time.Second)); send < soakStopBudget/2 {
			s.fail(missing, "I5: after SIGTERM the agent drained for its whole stop budget (%s, exited after %.1f s) and left %s complete but not committed: "+
				"%s, which the link sends in %.1f s (the trainer held still; DESIGN.md: the drain commits every complete checkpoint and the watcher keeps running during it)",
				soakStopBudget, took.Seconds(), strings.Join(missing, ", "), checkpoint.HumanBytes(size), send.Seconds())
		}
	}
	if !spent {
		for _, name := range missing {
			if slices.Contains(pending, name) {
				s.stats.leftAtStop++
			}
		}
	}
	return took
}

// pendingInAgent returns the checkpoints the running agent says are complete and not committed.
func (s *soak) pendingInAgent() []string {
	ctx, cancel := context.WithTimeout(s.t.Context(), 5*time.Second)
	defer cancel()
	req, _ := http.NewRequestWithContext(ctx, http.MethodGet, s.agent.base+"/status", nil)
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		return nil
	}
	defer resp.Body.Close()
	var st struct {
		Uploads *checkpoint.UploaderStatus `json:"uploads"`
	}
	if json.NewDecoder(resp.Body).Decode(&st) != nil || st.Uploads == nil {
		return nil
	}
	var names []string
	for _, c := range st.Uploads.Checkpoints {
		if c.Complete && !c.Committed {
			names = append(names, c.Name)
		}
	}
	return names
}

// watch waits for d, or until until is closed (then it returns true), reading LATEST twice a
// second; it fails the test if the trainer fails or the agent exits while not asked to.
func (s *soak) watch(d time.Duration, until <-chan struct{}) bool {
	timer := time.NewTimer(d)
	defer timer.Stop()
	tick := time.NewTicker(500 * time.Millisecond)
	defer tick.Stop()
	var exited <-chan struct{}
	if s.agent != nil && until != s.agent.done {
		exited = s.agent.done
	}
	for {
		select {
		case <-until:
			return true
		case <-timer.C:
			return false
		case <-exited:
			err := s.agent.exitErr
			s.agent = nil
			s.fail(nil, "the agent exited by itself (%v)", err)
		case err := <-s.trainerErr:
			s.trainerErr = nil
			s.fail(nil, "the trainer stopped: %v", err)
		case <-tick.C:
			ctx, cancel := context.WithTimeout(s.t.Context(), 30*time.Second)
			s.checkLatest(ctx)
			cancel()
		}
	}
}

// checkLatest reads LATEST and checks that it moved only forward since the last reading (I3).
func (s *soak) checkLatest(ctx context.Context) {
	var data []byte
	err := s.read(func() (err error) {
		data, _, err = s.store.GetBytes(ctx, checkpoint.LatestKey(soakJob))
		if errors.Is(err, checkpoint.ErrNotFound) {
			data, err = nil, nil
		}
		return err
	})
	var l *checkpoint.Latest
	switch {
	case err != nil:
		s.fail(nil, "read LATEST: %v", err)
	case data != nil:
		l = new(checkpoint.Latest)
		if err := json.Unmarshal(data, l); err != nil {
			s.fail(nil, "LATEST is not valid JSON (%v): %s", err, data)
		}
	}
	if err := checkpoint.CheckLatestForward(s.latest, l); err != nil {
		var names []string
		if s.latest != nil {
			names = append(names, s.latest.Checkpoint)
		}
		if l != nil {
			names = append(names, l.Checkpoint)
		}
		s.fail(names, "%v", err)
	}
	if l != nil {
		s.latest = l
	}
}

// read runs a read of the store, again (for up to 5 s) if it fails. versitygw does not replace an
// object atomically: a GET that races a PUT of the same key (LATEST, as the agent moves it) can
// get the new bytes with the old checksum, which the SDK refuses; S3 itself has no such window.
func (s *soak) read(fn func() error) error {
	err := fn()
	for deadline := time.Now().Add(5 * time.Second); err != nil && time.Now().Before(deadline); {
		s.stats.transient++
		s.t.Logf("store read (read again): %v", err)
		<-time.After(200 * time.Millisecond)
		err = fn()
	}
	return err
}

var soakNameRE = regexp.MustCompile(`step-\d{6}|model-\d\.pt`)

// check checks the store after a phase: CheckJob (settled=false) finds nothing, every manifest
// lists a version its checkpoint had, LATEST moved forward.
func (s *soak) check(when string) {
	ctx, cancel := context.WithTimeout(s.t.Context(), soakStrayWait+2*time.Minute)
	defer cancel()
	s.checkLatest(ctx)
	problems := checkpoint.CheckJob(ctx, s.store, soakJob, false)
	// A reading is not atomic (a commit may land between its listings), so a problem must
	// last to count. An object under a commit that its manifest does not list (a write the slow
	// link held landing after its agent was killed, or after the commit) is cleared by the
	// committing agent's late passes, 5 s, 30 s and 2 minutes after the commit (resumed by the
	// next agent after a kill), so it counts only once it has outlasted them.
	began := time.Now()
	for deadline := began.Add(10 * time.Second); len(problems) > 0 && (time.Now().Before(deadline) ||
		onlyStrays(problems) && time.Since(began) < soakStrayWait); {
		s.stats.transient++
		s.t.Logf("%s: store check (read again): %v", when, errors.Join(problems...))
		s.watch(500*time.Millisecond, nil)
		problems = checkpoint.CheckJob(ctx, s.store, soakJob, false)
	}
	if len(problems) > 0 {
		msg := errors.Join(problems...).Error()
		s.fail(soakNameRE.FindAllString(msg, -1), "%s: the store breaks the invariants:\n  %s", when, strings.ReplaceAll(msg, "\n", "\n  "))
	}
	s.checkManifests(ctx, when)
}

// soakStrayWait is how long check waits for an object under a commit that its manifest does
// not list to go: the committing agent's last late pass, 2 minutes after the commit, and slack.
const soakStrayWait = 2*time.Minute + 15*time.Second

// onlyStrays reports whether every problem is an object under a commit that its manifest does
// not list (checkpoint.StrayObject).
func onlyStrays(problems []error) bool {
	for _, p := range problems {
		if _, ok := errors.AsType[*checkpoint.StrayObject](p); !ok {
			return false
		}
	}
	return true
}

// checkManifests checks every manifest not checked before against the trainer's record (I2, I4):
// its files are a version of its checkpoint that the trainer had complete.
func (s *soak) checkManifests(ctx context.Context, when string) []checkpoint.Committed {
	var cs []checkpoint.Committed
	var problems []error
	err := s.read(func() (err error) {
		cs, problems, err = checkpoint.ListCommitted(ctx, s.store, soakJob)
		return err
	})
	if err != nil {
		s.fail(nil, "%s: %v", when, err)
	}
	if len(problems) > 0 {
		msg := errors.Join(problems...).Error()
		s.fail(soakNameRE.FindAllString(msg, -1), "%s: listing the commits: %s", when, msg)
	}
	for _, c := range cs {
		if s.checked[c.Key] {
			continue
		}
		m := c.Manifest
		fp := manifestPrint(m)
		if !s.rec.has(m.Checkpoint, fp) {
			s.fail([]string{m.Checkpoint}, "%s: I2/I4: commit %s/%s lists a version of %s the trainer never had complete:\n%s\nthe versions it had:\n%s",
				when, m.Checkpoint, m.Commit, m.Checkpoint, indent(fp), indent(strings.Join(s.rec.list(m.Checkpoint), "\n--\n")))
		}
		s.checked[c.Key] = true
	}
	return cs
}

// settle stops the trainer, lets the agent run undisturbed at full speed until every complete
// local checkpoint is committed, then checks the settled store and restores from it.
func (s *soak) settle() {
	t := s.t
	s.haltTrainer()
	s.slow.rate.Store(0) // whatever a killed run left in the throttle lands now
	if s.agent != nil && s.throttled {
		s.term()
	}
	if s.agent == nil {
		s.incarnation++
		s.throttled = false
		s.startAgentVia("")
	}
	ctx, cancel := context.WithTimeout(t.Context(), 5*time.Minute)
	defer cancel()
	began := time.Now()
	local := s.localComplete()
	for {
		cs := s.checkManifests(ctx, "settling")
		missing := uncommitted(local, cs)
		if len(missing) == 0 {
			break
		}
		if time.Since(began) > soakSettle {
			var b strings.Builder
			for _, name := range missing {
				fmt.Fprintf(&b, "local %s:\n%s\n", name, indent(filePrint(local[name])))
				for _, c := range cs {
					if c.Manifest.Checkpoint == name {
						fmt.Fprintf(&b, "commit %s:\n%s\n", c.Manifest.Commit, indent(manifestPrint(c.Manifest)))
					}
				}
			}
			if u := s.agent.status(t).Uploads; u != nil {
				for _, c := range u.Checkpoints {
					if slices.Contains(missing, c.Name) {
						fmt.Fprintf(&b, "/status: %+v\n", c)
					}
				}
			}
			s.fail(missing, "I5: not committed %s after the trainer stopped (the agent undisturbed, at full speed): %s\n%s",
				soakSettle, strings.Join(missing, ", "), b.String())
		}
		s.watch(time.Second, nil)
	}
	t.Logf("settled: every complete local checkpoint (%s) committed %.1f s after the trainer stopped",
		strings.Join(slices.Sorted(maps.Keys(local)), " "), time.Since(began).Seconds())

	// No multipart upload is left under a committed commit (I7). A killed run's part may still
	// land late; the agent aborts those again a while after it resumes a commit.
	var stray []string
	for deadline := time.Now().Add(45 * time.Second); ; {
		stray = s.strayUploads(ctx)
		if len(stray) == 0 || time.Now().After(deadline) {
			break
		}
		s.watch(time.Second, nil)
	}
	if len(stray) > 0 {
		s.fail(soakNameRE.FindAllString(strings.Join(stray, " "), -1), "I7: incomplete multipart uploads are left under committed commits:\n  %s", strings.Join(stray, "\n  "))
	}

	// Stopped, so nothing is in flight while the store is checked as settled.
	s.term()
	s.checkLatest(ctx)
	cs := s.checkManifests(ctx, "settled")
	if problems := checkpoint.CheckJob(ctx, s.store, soakJob, true); len(problems) > 0 {
		msg := errors.Join(problems...).Error()
		s.fail(soakNameRE.FindAllString(msg, -1), "settled: the store breaks the invariants:\n  %s", strings.ReplaceAll(msg, "\n", "\n  "))
	}
	if len(cs) == 0 {
		t.Fatalf("nothing was committed in %d phases", s.stats.phases)
	}

	// The next instance restores the newest commit: the files its manifest lists, each verified.
	newest := cs[0].Manifest
	to := t.TempDir()
	code, stdout, stderr := runSpotguard(t, append([]string{"SPOTGUARD_STORE_URL=" + s.storeURL(), "SPOTGUARD_STORE_JOB=" + soakJob}, s.s3.env("")...),
		"restore", "--config", writeEmptyConfig(t), "--to", to)
	if code != 0 || !strings.Contains(stdout, "restored "+newest.Checkpoint) || !strings.Contains(stdout, "every checksum verified") {
		s.fail([]string{newest.Checkpoint}, "spotguard restore: exit %d; want newest commit %s/%s restored\n%s%s", code, newest.Checkpoint, newest.Commit, stdout, stderr)
	}
	s.checkRestored(newest, filepath.Join(to, newest.Checkpoint))
	// And a few older commits, in-process, to read their bytes back too (I2).
	older := cs[1:]
	for _, i := range s.rng.Perm(len(older))[:min(3, len(older))] {
		m := older[i].Manifest
		dir := t.TempDir()
		if _, err := checkpoint.Restore(ctx, s.store, checkpoint.RestoreOptions{Job: soakJob, Checkpoint: m.Checkpoint, Commit: m.Commit,
			CommitSet: true, To: dir, Logger: zerolog.Nop()}); err != nil {
			s.fail([]string{m.Checkpoint}, "restore of commit %s/%s: %v", m.Checkpoint, m.Commit, err)
		}
		s.checkRestored(m, filepath.Join(dir, m.Checkpoint))
	}

	var bytes int64
	for _, c := range cs {
		bytes += c.Manifest.TotalBytes
	}
	ts := s.trainer.stats
	t.Logf("soak done: %d phases (%d agents: %d SIGKILLed, %d SIGTERMed (longest stop %.1f s, %d spent the stop budget; %d complete checkpoints left uncommitted by a stop without a drain), %d went on; %d through the slow link, %d rate changes), %d spot notices, %d syncs; "+
		"trainer: %d checkpoints saved (%d rollbacks, %d of many files, %d died before the marker, %d single files), %d files (%d over 5 MiB, %d via visible .tmp), "+
		"%d rewrites (%d in place, %d with mtime set back, %d followed by the marker), %d checkpoints and %d files deleted, %d SIGUSR1 saves; "+
		"store: %d commits, %s; %d transient store readings",
		s.stats.phases, s.incarnation, s.stats.kills, s.stats.terms, s.stats.longestStop.Seconds(), s.stats.budgetSpent, s.stats.leftAtStop, s.stats.keeps, s.stats.throttledRuns, s.stats.rateChanges,
		s.stats.notices, s.stats.syncs, ts.saves, ts.rollbacks, ts.many, ts.died, ts.singles, ts.files, ts.multipart, ts.visibleTmp,
		ts.rewrites, ts.inPlace, ts.mtimeBack, ts.remarks, ts.deletes, ts.fileDeletes, ts.signalled, len(cs), checkpoint.HumanBytes(bytes), s.stats.transient)
}

// haltTrainer stops the trainer and waits for it; a trainer that failed fails the test.
func (s *soak) haltTrainer() {
	if s.stopTrainer == nil {
		return
	}
	s.stopTrainer()
	s.stopTrainer = nil
	if s.trainerErr == nil {
		return // it stopped already, and said why
	}
	if err := <-s.trainerErr; err != nil {
		s.t.Errorf("trainer: %v", err)
	}
	s.trainerErr = nil
}

// diskComplete reads the complete checkpoints in checkpoint.dir from disk: name → file →
// checksum. A checkpoint that changes while it is read is left out.
func (s *soak) diskComplete() map[string]map[string]string {
	entries, err := os.ReadDir(s.ckdir)
	if err != nil {
		s.t.Fatal(err)
	}
	out := map[string]map[string]string{}
	for _, e := range entries {
		name := e.Name()
		if strings.HasPrefix(name, ".") || e.IsDir() && !fileExists(filepath.Join(s.ckdir, name, soakMarker)) {
			continue
		}
		if files, err := treePrint(filepath.Join(s.ckdir, name), name); err == nil {
			out[name] = files
		}
	}
	return out
}

// localComplete is diskComplete once the trainer has stopped, checked against what the trainer
// thinks it wrote.
func (s *soak) localComplete() map[string]map[string]string {
	out := s.diskComplete()
	var model []string
	for name, ok := range s.trainer.complete {
		if ok {
			model = append(model, name)
		}
	}
	if got := slices.Sorted(maps.Keys(out)); !slices.Equal(got, slices.Sorted(slices.Values(model))) {
		s.t.Fatalf("the trainer's own record is off: complete on disk %v; it thinks %v", got, slices.Sorted(slices.Values(model)))
	}
	for name, files := range out {
		if filePrint(files) != filePrint(s.trainer.model[name]) {
			s.t.Fatalf("the trainer's own record of %s is off:\non disk:\n%s\nit thinks:\n%s", name, filePrint(files), filePrint(s.trainer.model[name]))
		}
	}
	return out
}

// diskBytes is the size of the regular files at or below p.
func diskBytes(p string) int64 {
	var n int64
	filepath.WalkDir(p, func(_ string, d fs.DirEntry, err error) error {
		if err == nil && d.Type().IsRegular() {
			if fi, err := d.Info(); err == nil {
				n += fi.Size()
			}
		}
		return nil
	})
	return n
}

// uncommitted lists the local checkpoints whose current files (path and checksum) are not all
// in one commit of theirs. A checkpoint from which the trainer deleted files after a commit is
// still that commit.
func uncommitted(local map[string]map[string]string, cs []checkpoint.Committed) []string {
	var missing []string
	for _, name := range slices.Sorted(maps.Keys(local)) {
		if !slices.ContainsFunc(cs, func(c checkpoint.Committed) bool {
			if c.Manifest.Checkpoint != name {
				return false
			}
			have := map[string]string{}
			for _, f := range c.Manifest.Files {
				have[f.Path] = f.Checksum.Value
			}
			for rel, sum := range local[name] {
				if have[rel] != sum {
					return false
				}
			}
			return true
		}) {
			missing = append(missing, name)
		}
	}
	return missing
}

// strayUploads lists the incomplete multipart uploads under committed commits, as awscli shows
// them.
func (s *soak) strayUploads(ctx context.Context) []string {
	var cs []checkpoint.Committed
	err := s.read(func() (err error) {
		cs, _, err = checkpoint.ListCommitted(ctx, s.store, soakJob)
		return err
	})
	if err != nil {
		s.fail(nil, "%v", err)
	}
	out := s.s3.aws(s.t, "s3api", "list-multipart-uploads", "--bucket", s3Bucket, "--prefix", soakPrefix+"/")
	var l struct {
		Uploads []struct{ Key, UploadId string }
	}
	if strings.TrimSpace(out) != "" {
		if err := json.Unmarshal([]byte(out), &l); err != nil {
			s.t.Fatalf("aws s3api list-multipart-uploads: %v\n%s", err, out)
		}
	}
	var stray []string
	for _, u := range l.Uploads {
		for _, c := range cs {
			m := c.Manifest
			if strings.HasPrefix(u.Key, soakPrefix+"/"+checkpoint.CommitPrefix(m.Job, m.Checkpoint, m.Commit)) {
				stray = append(stray, u.Key+" (upload "+u.UploadId+")")
			}
		}
	}
	return stray
}

// checkRestored checks that what a restore put at dir is the files m lists, and a version of
// its checkpoint that the trainer had.
func (s *soak) checkRestored(m *checkpoint.Manifest, dir string) {
	files, err := treePrint(dir, m.Checkpoint)
	if err != nil {
		s.fail([]string{m.Checkpoint}, "restored %s/%s: %v", m.Checkpoint, m.Commit, err)
	}
	got, want := filePrint(files), manifestPrint(m)
	if got != want {
		s.fail([]string{m.Checkpoint}, "restored %s/%s:\n%s\nits manifest:\n%s", m.Checkpoint, m.Commit, indent(got), indent(want))
	}
	if !s.rec.has(m.Checkpoint, got) {
		s.fail([]string{m.Checkpoint}, "restored %s/%s is no version the trainer had:\n%s", m.Checkpoint, m.Commit, indent(got))
	}
}

// fail stops the soak with what went wrong, the agent log lines that name the checkpoints in
// names (the last agent's last lines when there are none), and a file holding every agent's log.
func (s *soak) fail(names []string, format string, args ...any) {
	s.t.Helper()
	var b strings.Builder
	fmt.Fprintf(&b, format, args...)
	names = slices.Compact(slices.Sorted(slices.Values(names)))
	for _, name := range names {
		fmt.Fprintf(&b, "\n\nagent log lines naming %s (#incarnation):\n%s", name, s.logLines(func(l string) bool { return strings.Contains(l, name) }, 80))
	}
	if len(s.logs) > 0 {
		fmt.Fprintf(&b, "\n\nthe last agent's (#%d) last log lines:\n%s", len(s.logs), s.lastLines(s.logs[len(s.logs)-1], 25))
	}
	if p := s.saveLogs(); p != "" {
		fmt.Fprintf(&b, "\n\nevery agent's log: %s", p)
	}
	if s.agent != nil {
		s.agent.cmd.Process.Kill()
		<-s.agent.done
		s.agent = nil
	}
	s.t.Fatal(b.String())
}

// saveLogs writes every agent's log so far to a file in the temporary directory, which outlives
// the test, and returns its name ("" if it could not).
func (s *soak) saveLogs() string {
	f, err := os.CreateTemp("", fmt.Sprintf("spotguard-soak-%d-*.log", s.seed))
	if err != nil {
		return ""
	}
	defer f.Close()
	for i, p := range s.logs {
		data, _ := os.ReadFile(p)
		fmt.Fprintf(f, "=== agent #%d\n%s", i+1, data)
	}
	return f.Name()
}

// logLines returns the last n lines of every agent's log that match, each after its
// incarnation's number; of a run of lines with the same message only the first and the last
// are kept (a checkpoint of a thousand files logs a thousand "file stored").
func (s *soak) logLines(match func(string) bool, n int) string {
	var lines []string
	for i, p := range s.logs {
		data, _ := os.ReadFile(p)
		var run []string
		msg := ""
		flush := func() {
			switch {
			case len(run) > 2:
				lines = append(lines, run[0], fmt.Sprintf("#%d ... %d more %q", i+1, len(run)-2, msg), run[len(run)-1])
			default:
				lines = append(lines, run...)
			}
			run = nil
		}
		for l := range strings.SplitSeq(strings.TrimSpace(string(data)), "\n") {
			if !match(l) {
				continue
			}
			m := ""
			if sm := soakMessageRE.FindStringSubmatch(l); sm != nil {
				m = sm[1]
			}
			if m != msg {
				flush()
				msg = m
			}
			run = append(run, fmt.Sprintf("#%d %s", i+1, l))
		}
		flush()
	}
	return strings.Join(lines[max(0, len(lines)-n):], "\n")
}

var soakMessageRE = regexp.MustCompile(`"message":"((?:[^"\\]|\\.)*)"`)

// lastLines returns the last n lines of the log at path, IMDS polling aside.
func (s *soak) lastLines(path string, n int) string {
	data, _ := os.ReadFile(path)
	var lines []string
	for l := range strings.SplitSeq(strings.TrimSpace(string(data)), "\n") {
		if !strings.Contains(l, `"component":"imds"`) {
			lines = append(lines, l)
		}
	}
	return strings.Join(lines[max(0, len(lines)-n):], "\n")
}

// soakRecord holds every version of each checkpoint the trainer had complete: the fingerprint
// (filePrint) of its files. The trainer adds a version just before the write that makes it
// visible, so a commit read at any moment can only list recorded versions.
type soakRecord struct {
	mu       sync.Mutex
	versions map[string]map[string]bool
}

func (r *soakRecord) add(name string, files map[string]string) {
	r.mu.Lock()
	defer r.mu.Unlock()
	if r.versions[name] == nil {
		r.versions[name] = map[string]bool{}
	}
	r.versions[name][filePrint(files)] = true
}

func (r *soakRecord) has(name, fp string) bool {
	r.mu.Lock()
	defer r.mu.Unlock()
	return r.versions[name][fp]
}

func (r *soakRecord) list(name string) []string {
	r.mu.Lock()
	defer r.mu.Unlock()
	return slices.Sorted(maps.Keys(r.versions[name]))
}

// filePrint is the fingerprint of a version: "path checksum" lines, sorted.
func filePrint(files map[string]string) string {
	lines := make([]string, 0, len(files))
	for rel, sum := range files {
		lines = append(lines, rel+" "+sum)
	}
	slices.Sort(lines)
	return strings.Join(lines, "\n")
}

// manifestPrint is the fingerprint of the version a manifest lists; a checksum of another
// algorithm than the trainer's CRC-32C shows as such, and matches nothing.
func manifestPrint(m *checkpoint.Manifest) string {
	files := map[string]string{}
	for _, f := range m.Files {
		files[f.Path] = f.Checksum.Value
		if f.Checksum.Algorithm != checkpoint.ChecksumCRC32C {
			files[f.Path] = f.Checksum.Algorithm + ":" + f.Checksum.Value
		}
	}
	return filePrint(files)
}

// treePrint reads the checkpoint at p from disk: a single file (its path is name) or every
// regular file below the directory (spotguard's own _spotguard/ aside), path → CRC-32C.
func treePrint(p, name string) (map[string]string, error) {
	fi, err := os.Lstat(p)
	if err != nil {
		return nil, err
	}
	files := map[string]string{}
	if fi.Mode().IsRegular() {
		sum, err := fileSum(p)
		files[name] = sum
		return files, err
	}
	err = filepath.WalkDir(p, func(f string, d fs.DirEntry, err error) error {
		if err != nil || !d.Type().IsRegular() {
			return err
		}
		rel, _ := filepath.Rel(p, f)
		if rel = filepath.ToSlash(rel); strings.HasPrefix(rel, checkpoint.MetaDir+"/") {
			return nil
		}
		files[rel], err = fileSum(f)
		return err
	})
	return files, err
}

func fileSum(p string) (string, error) {
	f, err := os.Open(p)
	if err != nil {
		return "", err
	}
	defer f.Close()
	c, err := checkpoint.ChecksumOf(f)
	return c.Value, err
}

func sumOf(b []byte) string {
	c, _ := checkpoint.ChecksumOf(bytes.NewReader(b))
	return c.Value
}

func fileExists(p string) bool {
	_, err := os.Lstat(p)
	return err == nil
}

func indent(s string) string { return "    " + strings.ReplaceAll(s, "\n", "\n    ") }

// soakTrainer is the trainer: it writes checkpoints into dir until its context ends. It runs on
// its own goroutine and never touches the testing.T; run returns its first error.
type soakTrainer struct {
	dir   string
	rng   *rand.Rand
	bytes *rand.ChaCha8
	rec   *soakRecord
	sigs  <-chan os.Signal
	// hold, while set, keeps the trainer between moves (a stop is under way).
	hold  atomic.Bool
	steps int // the highest step saved, in hundreds
	// model is what the trainer has on disk (complete or not): checkpoint → file → checksum;
	// complete says which checkpoints have their marker.
	model    map[string]map[string]string
	complete map[string]bool
	stats    struct {
		saves, rollbacks, many, died, singles, files, multipart, visibleTmp    int
		rewrites, inPlace, mtimeBack, remarks, deletes, fileDeletes, signalled int
	}
}

// soakLocalKeep is how many step-* checkpoints the trainer keeps on disk.
const soakLocalKeep = 8

func (tr *soakTrainer) run(ctx context.Context) error {
	for {
		var err error
		select {
		case <-ctx.Done():
			return nil
		case <-tr.sigs:
			tr.stats.signalled++
			err = tr.save(ctx)
		default:
			err = tr.move(ctx)
		}
		if ctx.Err() != nil {
			return nil
		}
		if err != nil {
			return err
		}
		if !tr.pause(ctx, time.Duration(tr.rng.IntN(800))*time.Millisecond) {
			return nil
		}
		for tr.hold.Load() {
			if !tr.pause(ctx, 50*time.Millisecond) {
				return nil
			}
		}
	}
}

// pause waits for d; false if ctx ended first.
func (tr *soakTrainer) pause(ctx context.Context, d time.Duration) bool {
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case <-t.C:
		return true
	case <-ctx.Done():
		return false
	}
}

func (tr *soakTrainer) move(ctx context.Context) error {
	switch r := tr.rng.IntN(100); {
	case r < 42:
		return tr.save(ctx)
	case r < 47:
		return tr.saveSingle()
	case r < 63:
		return tr.rewrite()
	case r < 70:
		return tr.deleteCheckpoint()
	case r < 74:
		return tr.deleteFile()
	default:
		tr.pause(ctx, time.Duration(300+tr.rng.IntN(1700))*time.Millisecond)
		return nil
	}
}

func (tr *soakTrainer) data(n int) []byte {
	b := make([]byte, n)
	tr.bytes.Read(b)
	return b
}

// size is a file's size: some empty, many small, some of a few MiB, some over the 5 MiB part size.
func (tr *soakTrainer) size() int {
	switch r := tr.rng.IntN(20); {
	case r == 0:
		return 0
	case r < 6:
		return 1 + tr.rng.IntN(4<<10)
	case r < 15:
		return 1 + tr.rng.IntN(1<<20)
	case r < 19:
		return 1<<20 + tr.rng.IntN(3<<20)
	default:
		return 5<<20 + 1 + tr.rng.IntN(2<<20)
	}
}

// name returns a new checkpoint name, or (a rollback) an old one.
func (tr *soakTrainer) name() string {
	if tr.steps > 0 && tr.rng.IntN(8) == 0 {
		return fmt.Sprintf("step-%06d", 100*(1+tr.rng.IntN(tr.steps)))
	}
	tr.steps++
	return fmt.Sprintf("step-%06d", 100*tr.steps)
}

// save writes a checkpoint directory file by file, then its marker (unless the trainer "dies"
// first).
func (tr *soakTrainer) save(ctx context.Context) error {
	name := tr.name()
	dir := filepath.Join(tr.dir, name)
	if fileExists(dir) {
		tr.stats.rollbacks++
		if err := os.RemoveAll(dir); err != nil {
			return err
		}
	}
	files := map[string]string{}
	tr.model[name], tr.complete[name] = files, false
	n, many := 1+tr.rng.IntN(8), tr.rng.IntN(30) == 0
	if many {
		tr.stats.many++
		n = 200 + tr.rng.IntN(801)
	}
	for i := range n {
		rel := fmt.Sprintf("shard-%d.bin", i)
		size := tr.size()
		switch {
		case many:
			rel, size = fmt.Sprintf("shards/%02d/part-%04d.bin", i/100, i), tr.rng.IntN(8<<10)
		case tr.rng.IntN(4) == 0:
			rel = fmt.Sprintf("optim/rank-%d/state.bin", i)
		}
		if err := tr.writeFile(ctx, dir, rel, size, !many, files); err != nil {
			return err
		}
		if !many && !tr.pause(ctx, time.Duration(tr.rng.IntN(300))*time.Millisecond) {
			return ctx.Err()
		}
	}
	if tr.rng.IntN(12) == 0 {
		tr.stats.died++
		return nil
	}
	// The marker: empty, written, or renamed into place.
	var marker []byte
	if tr.rng.IntN(2) == 0 {
		marker = tr.data(1 + tr.rng.IntN(64))
	}
	sum := sumOf(marker)
	tr.rec.add(name, withFile(files, soakMarker, sum))
	p := filepath.Join(dir, soakMarker)
	if tr.rng.IntN(3) == 0 {
		tmp := filepath.Join(dir, "."+soakMarker+".tmp")
		if err := os.WriteFile(tmp, marker, 0o644); err != nil {
			return err
		}
		if err := os.Rename(tmp, p); err != nil {
			return err
		}
	} else if err := os.WriteFile(p, marker, 0o644); err != nil {
		return err
	}
	files[soakMarker], tr.complete[name] = sum, true
	tr.stats.saves++
	return tr.trim(name)
}

// writeFile writes one file of a checkpoint in one of the ways trainers do; slow ways only when
// slowOK.
func (tr *soakTrainer) writeFile(ctx context.Context, dir, rel string, size int, slowOK bool, files map[string]string) error {
	p := filepath.Join(dir, filepath.FromSlash(rel))
	if err := os.MkdirAll(filepath.Dir(p), 0o755); err != nil {
		return err
	}
	data := tr.data(size)
	tr.stats.files++
	if size > 5<<20 {
		tr.stats.multipart++
	}
	switch k := tr.rng.IntN(8); {
	case k == 0: // a dot-temp name renamed into place: the watcher never reports the temp
		tmp := filepath.Join(filepath.Dir(p), "."+filepath.Base(p)+".tmp")
		if err := os.WriteFile(tmp, data, 0o644); err != nil {
			return err
		}
		if err := os.Rename(tmp, p); err != nil {
			return err
		}
	case k == 1 && slowOK: // a visible NAME.tmp, quiet long enough to count as closed, then renamed
		tr.stats.visibleTmp++
		if err := os.WriteFile(p+".tmp", data, 0o644); err != nil {
			return err
		}
		if !tr.pause(ctx, time.Duration(1100+tr.rng.IntN(1400))*time.Millisecond) {
			return ctx.Err()
		}
		if err := os.Rename(p+".tmp", p); err != nil {
			return err
		}
	case k == 2 && slowOK: // in two halves with a pause, which may pass for the file being closed
		f, err := os.Create(p)
		if err != nil {
			return err
		}
		half := size / 2
		if _, err := f.Write(data[:half]); err != nil {
			f.Close()
			return err
		}
		if !tr.pause(ctx, time.Duration(tr.rng.IntN(900))*time.Millisecond) {
			f.Close()
			return ctx.Err()
		}
		if _, err := f.Write(data[half:]); err != nil {
			f.Close()
			return err
		}
		if err := f.Close(); err != nil {
			return err
		}
	default:
		if err := os.WriteFile(p, data, 0o644); err != nil {
			return err
		}
	}
	files[rel] = sumOf(data)
	return nil
}

// trim deletes the oldest step-* checkpoints beyond soakLocalKeep (but not keep), as trainers
// do to bound their disk.
func (tr *soakTrainer) trim(keep string) error {
	var steps []string
	for name := range tr.model {
		if strings.HasPrefix(name, "step-") && name != keep {
			steps = append(steps, name)
		}
	}
	slices.Sort(steps)
	for len(steps) >= soakLocalKeep {
		if err := tr.remove(steps[0]); err != nil {
			return err
		}
		steps = steps[1:]
	}
	return nil
}

func (tr *soakTrainer) remove(name string) error {
	delete(tr.model, name)
	delete(tr.complete, name)
	return os.RemoveAll(filepath.Join(tr.dir, name))
}

// saveSingle writes a single-file checkpoint (model-N.pt) through a temporary name.
func (tr *soakTrainer) saveSingle() error {
	name := fmt.Sprintf("model-%d.pt", tr.rng.IntN(3))
	data := tr.data(tr.size())
	tmp := filepath.Join(tr.dir, "."+name+".tmp")
	if err := os.WriteFile(tmp, data, 0o644); err != nil {
		return err
	}
	files := map[string]string{name: sumOf(data)}
	tr.rec.add(name, files)
	if err := os.Rename(tmp, filepath.Join(tr.dir, name)); err != nil {
		return err
	}
	tr.model[name], tr.complete[name] = files, true
	tr.stats.singles++
	return nil
}

// pick returns one of names (sorted first, so that a seed makes the same choice), or "".
func (tr *soakTrainer) pick(names []string) string {
	if len(names) == 0 {
		return ""
	}
	slices.Sort(names)
	return names[tr.rng.IntN(len(names))]
}

// rewrite changes one file of a complete checkpoint after its marker, keeping its size: the whole
// file, or a range in place; sometimes with its modification time set back. A file of a checkpoint
// directory written again (its modification time moved) takes the checkpoint's completeness back
// until its marker is written again, which the trainer then does, as one that saves into the
// directory again would (sometimes after a change the agent sees by its change time alone too).
func (tr *soakTrainer) rewrite() error {
	var names []string
	for name, ok := range tr.complete {
		if ok {
			names = append(names, name)
		}
	}
	name := tr.pick(names)
	if name == "" {
		return nil
	}
	root := filepath.Join(tr.dir, name)
	var rels []string
	for rel := range tr.model[name] {
		if rel != soakMarker {
			rels = append(rels, rel)
		}
	}
	rel := tr.pick(rels)
	if rel == "" {
		return nil
	}
	p := root
	if rel != name {
		p = filepath.Join(root, filepath.FromSlash(rel))
	}
	old, err := os.ReadFile(p)
	if err != nil || len(old) == 0 {
		return err
	}
	fi, err := os.Stat(p)
	if err != nil {
		return err
	}
	inPlace := tr.rng.IntN(3) == 0
	data := tr.data(len(old))
	var at int
	if inPlace {
		at = tr.rng.IntN(len(old))
		data = data[:1+tr.rng.IntN(min(len(old)-at, 64<<10))]
		data[0] = old[at] + 1 // a change, however short
	}
	next := slices.Clone(old)
	copy(next[at:], data)
	files := withFile(tr.model[name], rel, sumOf(next))
	tr.rec.add(name, files)
	if inPlace {
		tr.stats.inPlace++
		f, err := os.OpenFile(p, os.O_WRONLY, 0)
		if err != nil {
			return err
		}
		if _, err := f.WriteAt(data, int64(at)); err != nil {
			f.Close()
			return err
		}
		if err := f.Close(); err != nil {
			return err
		}
	} else if err := os.WriteFile(p, next, 0o644); err != nil {
		return err
	}
	setBack := tr.rng.IntN(2) == 0
	if setBack {
		tr.stats.mtimeBack++
		if err := os.Chtimes(p, fi.ModTime(), fi.ModTime()); err != nil {
			return err
		}
	}
	tr.model[name] = files
	tr.stats.rewrites++
	if rel != name && (!setBack || tr.rng.IntN(2) == 0) {
		return tr.remark(name)
	}
	return nil
}

// remark writes the marker of the checkpoint directory name again (other bytes, renamed into
// place), as at the end of a save.
func (tr *soakTrainer) remark(name string) error {
	marker := tr.data(1 + tr.rng.IntN(64))
	files := withFile(tr.model[name], soakMarker, sumOf(marker))
	tr.rec.add(name, files)
	dir := filepath.Join(tr.dir, name)
	tmp := filepath.Join(dir, "."+soakMarker+".tmp")
	if err := os.WriteFile(tmp, marker, 0o644); err != nil {
		return err
	}
	if err := os.Rename(tmp, filepath.Join(dir, soakMarker)); err != nil {
		return err
	}
	tr.model[name] = files
	tr.stats.remarks++
	return nil
}

func (tr *soakTrainer) deleteCheckpoint() error {
	name := tr.pick(slices.Collect(maps.Keys(tr.model)))
	if name == "" {
		return nil
	}
	tr.stats.deletes++
	return tr.remove(name)
}

// deleteFile deletes one file of a checkpoint directory; the marker too, which makes it
// incomplete.
func (tr *soakTrainer) deleteFile() error {
	var names []string
	for name := range tr.model {
		if strings.HasPrefix(name, "step-") {
			names = append(names, name)
		}
	}
	name := tr.pick(names)
	if name == "" {
		return nil
	}
	rel := tr.pick(slices.Collect(maps.Keys(tr.model[name])))
	if rel == "" {
		return nil
	}
	files := maps.Clone(tr.model[name])
	delete(files, rel)
	if rel == soakMarker {
		tr.complete[name] = false
	} else if tr.complete[name] {
		tr.rec.add(name, files)
	}
	if err := os.Remove(filepath.Join(tr.dir, name, filepath.FromSlash(rel))); err != nil {
		return err
	}
	tr.model[name] = files
	tr.stats.fileDeletes++
	return nil
}

// withFile returns a copy of files with rel's checksum set to sum.
func withFile(files map[string]string, rel, sum string) map[string]string {
	out := maps.Clone(files)
	if out == nil {
		out = map[string]string{}
	}
	out[rel] = sum
	return out
}
