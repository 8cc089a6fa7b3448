package main

import (
	"bytes"
	"cmp"
	"context"
	"crypto/rand"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"io"
	"io/fs"
	"os"
	"os/exec"
	"os/signal"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"time"

	"github.com/aws/aws-sdk-go-v2/aws"
	awsconfig "github.com/aws/aws-sdk-go-v2/config"
	"github.com/rs/zerolog"

	"github.com/spotguard/spotguard/agent"
	"github.com/spotguard/spotguard/agent/imds"
	"github.com/spotguard/spotguard/agent/trainer"
	"github.com/spotguard/spotguard/checkpoint"
)

// drillWindow is the notice's 2 minutes; a drill passes when the checkpoint is committed and
// restored inside it.
var drillWindow = 2 * time.Minute // a variable for tests

// drillMarker is the marker the demo trainer writes last; the drill's agent waits for it,
// whatever checkpoint.marker says for the real trainer.
const drillMarker = "_COMPLETE"

// drillIMDSSilence is how long IMDS may fail before a drill waiting for a real notice says so.
const drillIMDSSilence = 10 * time.Second

// drillStopBudget is the drill's agent.stop_budget: a drill that failed says so without waiting
// out the configured drain.
const drillStopBudget = 5 * time.Second

// drillTrainerWait is how long the drill waits for a trainer of your own (--trainer-cmd) to catch
// the signal before it announces the interruption.
const drillTrainerWait = 30 * time.Second

// drillStoreTimeout bounds the store check that runs before the rehearsal.
const drillStoreTimeout = 20 * time.Second

// drillThinMargin is the margin under which the drill passes but warns.
const drillThinMargin = 30 * time.Second

// drillReport is what `spotguard drill --json` prints.
type drillReport struct {
	Pass   bool   `json:"pass"`
	Reason string `json:"reason,omitempty"`
	// Cause names what failed, for scripts: "store" (the store check before the rehearsal) with
	// the reason after a colon ("store:not_found", "store:denied", ...); empty otherwise.
	Cause string `json:"cause,omitempty"`
	Store string `json:"store"`
	// Job is the drill's own job in the store: a fresh one every run, so a drill never meets
	// another run's checkpoints (or a real job's).
	Job        string      `json:"job"`
	Checkpoint string      `json:"checkpoint,omitempty"`
	Commit     string      `json:"commit,omitempty"`
	Files      int         `json:"files"`
	Bytes      int64       `json:"bytes"`
	Timeline   []drillStep `json:"timeline"`
	// MarginS (the deadline less the commit's time, negative when late) and DurableS (the
	// commit's time less the notice's) are absent until a checkpoint is committed.
	MarginS    *float64 `json:"margin_seconds,omitempty"`
	DurableS   *float64 `json:"durable_after_notice_seconds,omitempty"`
	UploadMBs  float64  `json:"upload_mb_per_s,omitempty"`
	RestoreMBs float64  `json:"restore_mb_per_s,omitempty"`
	Advice     []string `json:"advice,omitempty"`
	Verified   bool     `json:"verified"`
	// Deadline is the notice's deadline, absent until a notice arrived.
	Deadline *time.Time `json:"deadline,omitempty"`
	// Nodes are the nodes of a multi-node drill (--nodes), each with its timeline.
	Nodes    []drillNode `json:"nodes,omitempty"`
	notice   time.Time   // when the notice was detected
	manifest *checkpoint.Manifest
	storeFix string // what to do about a failed store check
	// late is set when the drill failed because the checkpoint was not complete or committed
	// before the deadline: the advice about its size, how often to save and the upload applies.
	late bool
}

// noticed records when the notice was detected and its deadline (nil: the 2-minute window).
func (r *drillReport) noticed(at time.Time, deadline *time.Time) {
	r.notice = at
	d := at.Add(drillWindow)
	if deadline != nil {
		d = *deadline
	}
	r.Deadline = &d
}

// committed records when the checkpoint was committed: the margin left before the deadline
// and the time to durable.
func (r *drillReport) committed(at time.Time) {
	margin, durable := r.Deadline.Sub(at).Seconds(), at.Sub(r.notice).Seconds()
	r.MarginS, r.DurableS = &margin, &durable
}

// drillStep is one moment of the timeline, in seconds after the notice was detected.
type drillStep struct {
	Step    string  `json:"step"`
	Seconds float64 `json:"seconds"`
	Detail  string  `json:"detail,omitempty"`
}

func runDrill(ctx context.Context, args, environ []string, stdout, stderr io.Writer) int {
	fs, cf := newFlagSet("drill", "Rehearse a spot reclaim end to end: a notice arrives, the trainer is signalled and writes a\ncheckpoint, spotguard streams and commits it, and it is restored and verified byte for byte. With\nno flags it runs on this machine alone (an in-process IMDS, a demo trainer, a file:// store in a\ntemp dir). PASS or FAIL; exit 1 on FAIL.", stdout, stderr)
	sizeFlag := fs.String("size", "512MiB", "demo trainer: total checkpoint `SIZE` (e.g. 512MiB, 4GiB)")
	files := fs.Int("files", 8, "demo trainer: `N` files per checkpoint")
	storeURL := fs.String("store", "", "where to commit, a `URL`: s3://bucket/prefix or file:///path (default: a file:// store in a temp dir);\nstore.url of the configuration is not used")
	trainerCmd := fs.String("trainer-cmd", "", "run this trainer `CMD` (sh -c 'exec CMD') instead of the demo one; it must catch the signal and write into --checkpoint-dir;\nit and the processes it starts (its workers) are the trainers, and nothing else is signalled")
	useTrainerConfig := fs.Bool("use-trainer-config", false, "find trainers as the agent does, too: keep your trainer.unit, trainer.match, trainer.container and trainer.user\n(trainer.pidfile is the drill's own), so every process they find is signalled, a job you are running included;\nwithout it only the drill's trainer and the processes it starts are")
	ckDir := fs.String("checkpoint-dir", "", "the `DIR` the trainer writes its checkpoints into (default: a temp dir); checkpoint.dir of the\nconfiguration is not used")
	imdsMode := fs.String("imds", "sim", "where the notice comes from, a `MODE`: sim, an in-process IMDS announces the reclaim; real, wait for\na real notice (e.g. an AWS FIS experiment)")
	jsonOut := fs.Bool("json", false, "print the report as JSON")
	keep := fs.Bool("keep", false, "keep the temp dir (checkpoints, store, restored copy)")
	// A drill has a store, a checkpoint directory, a job and nodes of its own, never the
	// configuration's (the demo trainer must not write into a directory a running agent watches):
	// one spelling each.
	fs.refuseKey("store.url", "its store is --store URL")
	fs.refuseKey("checkpoint.dir", "its trainer writes into --checkpoint-dir DIR")
	fs.refuseKey("store.job", "it commits under a job of its own (drill-<time>-<random>)")
	fs.refuseKey("store.world_nodes", "a job of N nodes is --nodes N")
	fs.refuseKey("store.node_rank", "--nodes N gives each node its rank")
	nodes := fs.Int("nodes", 1, "rehearse a job of `N` nodes on this machine: N agents and demo trainers, one node notified; each node's part and\nthe job checkpoint (store.world_nodes, docs/multinode.md), with per-node timelines and the job's time to durable")
	if code, ok := fs.parse(args); !ok {
		return code
	}
	if *storeURL != "" {
		if _, _, _, err := checkpoint.ParseStoreURL(*storeURL); err != nil {
			return fs.usageError("--store %q: %s", *storeURL, strings.TrimPrefix(err.Error(), fmt.Sprintf("store url %q: ", *storeURL)))
		}
	}
	size, err := parseDrillSize(*sizeFlag)
	switch {
	case err != nil:
		return fs.usageError("--size %q: %v", *sizeFlag, err)
	case *files < 1:
		return fs.usageError("--files %d: want at least 1", *files)
	case *imdsMode != "sim" && *imdsMode != "real":
		return fs.usageError("--imds %q: want sim or real", *imdsMode)
	case *nodes < 1 || *nodes > 64 || (*nodes > 1 && (*trainerCmd != "" || *ckDir != "" || *imdsMode != "sim")):
		return fs.usageError("--nodes %d: want 1 to 64, and above 1 only with the demo trainers and --imds sim", *nodes)
	case *trainerCmd != "" && *ckDir == "":
		return fs.usageError("--trainer-cmd needs --checkpoint-dir (where your trainer writes)")
	}

	tmp, err := os.MkdirTemp("", "spotguard-drill-")
	if err != nil {
		fmt.Fprintf(stderr, "spotguard drill: %v\n", err)
		return exitFail
	}
	if *keep {
		fmt.Fprintf(stderr, "keeping %s\n", tmp)
	} else {
		defer os.RemoveAll(tmp)
	}
	if *ckDir == "" {
		*ckDir = filepath.Join(tmp, "checkpoints")
	} else if abs, err := filepath.Abs(*ckDir); err == nil {
		*ckDir = abs // the agent's checkpoint.dir must be absolute; here it is where the user stands
	}
	if *storeURL == "" {
		*storeURL = "file://" + filepath.Join(tmp, "store")
	}
	if err := os.MkdirAll(*ckDir, 0o755); err != nil {
		fmt.Fprintf(stderr, "spotguard drill: %v\n", err)
		return exitFail
	}
	// The report says what happened; the agent's own log shows errors only (--log.level to see more).
	level := zerolog.ErrorLevel
	for _, kv := range cf.overrides {
		if kv.Key == "log.level" {
			if l, err := zerolog.ParseLevel(kv.Value); err == nil {
				level = l
			}
		}
	}
	if _, ok := stderr.(*os.File); !ok {
		// The trainer's output is copied into it from a goroutine of os/exec's while the agent
		// logs to it (a file is written by the child itself, and journald's is locked already).
		if _, ok := stderr.(*journalLines); !ok {
			stderr = &lockedWriter{w: stderr}
		}
	}
	log := newLogger(stderr, environ, level)
	rep := drillReport{Store: *storeURL, Job: "drill-" + checkpoint.NewCommitID(time.Now()), Timeline: []drillStep{}}
	plan := drillPlan{
		size: size, files: *files, trainerCmd: *trainerCmd, ckDir: *ckDir, store: *storeURL, job: rep.Job,
		realIMDS: *imdsMode == "real", tmp: tmp, environ: environ, configFlags: cf, progress: stderr,
		useTrainerConfig: *useTrainerConfig,
	}
	var pass bool
	if *nodes > 1 {
		pass = drillNodes(ctx, plan, *nodes, log, &rep)
	} else {
		pass = drill(ctx, plan, log, &rep)
	}
	rep.Pass = pass
	rep.Advice = drillAdvice(rep)
	slices.SortStableFunc(rep.Timeline, func(a, b drillStep) int { return cmp.Compare(a.Seconds, b.Seconds) })
	if *jsonOut {
		enc := json.NewEncoder(stdout)
		enc.SetIndent("", "  ")
		enc.Encode(rep)
	} else {
		printDrill(stdout, rep)
	}
	if !pass {
		return exitFail
	}
	return exitOK
}

// drillPlan is what one drill does.
type drillPlan struct {
	size              int64
	files             int
	trainerCmd, ckDir string
	store, tmp        string
	job               string
	realIMDS          bool
	environ           []string
	configFlags       *configFlags
	progress          io.Writer
	// useTrainerConfig keeps the configuration's trainer.unit, trainer.match, trainer.container
	// and trainer.user; without it only the drill's trainer and its descendants are signalled.
	useTrainerConfig bool
}

// drill runs the story and fills rep; it reports whether it passed.
func drill(ctx context.Context, p drillPlan, log zerolog.Logger, rep *drillReport) bool {
	fail := func(format string, a ...any) bool {
		if ctx.Err() != nil {
			// Whatever the wait that SIGINT or SIGTERM cut short would have said (found from
			// outside: a deadline missed, and advice on slow saves, 0.8 s into the drill).
			rep.Reason, rep.late, rep.Cause, rep.storeFix = interruptedText(ctx), false, "", ""
			return false
		}
		rep.Reason = fmt.Sprintf(format, a...)
		return false
	}
	late := func(format string, a ...any) bool {
		rep.late = true
		return fail(format, a...)
	}
	var sim *imds.Simulator
	endpoint := ""
	if !p.realIMDS {
		var err error
		if sim, err = imds.StartSimulator("127.0.0.1:0"); err != nil {
			return fail("start the IMDS simulator: %v", err)
		}
		defer sim.Close()
		endpoint = sim.Endpoint()
	}

	// The agent, as `spotguard run` would run it, pointed at the drill's pieces; it finds the
	// trainer (started below, after the store check) by its pidfile, and its workers as the
	// process tree below it (agent.Deps.TrainerTree). Nothing else on the machine is signalled,
	// unless --use-trainer-config keeps the configuration's ways to find trainers: the user's
	// trainer.match would find the job they are running, too.
	pidfile := filepath.Join(p.tmp, "trainer.pid")
	cfg, realEndpoint, err := drillConfig(p, pidfile, p.ckDir, filepath.Join(p.tmp, "run"), endpoint)
	if err != nil {
		return fail("%v", err)
	}
	var awsCfg aws.Config // for the IMDS client: the real IMDS only
	if p.realIMDS {
		if awsCfg, err = awsconfig.LoadDefaultConfig(ctx); err != nil {
			awsCfg = envOnlyAWS() // the IMDS client needs no profile
		}
	}
	store, err := drillStore(ctx, p, cfg, realEndpoint, rep)
	if err != nil {
		return fail("%v", err)
	}

	// The trainer: the demo one is this binary in a hidden mode, a real child process.
	ready := filepath.Join(p.tmp, "trainer.ready")
	var cmd *exec.Cmd
	if p.trainerCmd != "" {
		// exec: the shell becomes the trainer, so the PID the drill signals is the trainer's.
		script := p.trainerCmd
		if !strings.HasPrefix(strings.TrimSpace(script), "exec ") {
			script = "exec " + script
		}
		cmd = exec.Command("sh", "-c", script)
	} else {
		self, err := os.Executable()
		if err != nil {
			return fail("find own binary for the demo trainer: %v", err)
		}
		cmd = exec.Command(self, drillTrainerCmd, "--dir", p.ckDir, "--size", strconv.FormatInt(p.size, 10),
			"--files", strconv.Itoa(p.files), "--ready", ready)
	}
	cmd.Stdout, cmd.Stderr = p.progress, p.progress
	cmd.SysProcAttr = drillChildAttr()
	if err := cmd.Start(); err != nil {
		return fail("start the trainer: %v", err)
	}
	trainerDone := make(chan error, 1)
	go func() { trainerDone <- cmd.Wait() }()
	defer func() {
		cmd.Process.Signal(syscall.SIGTERM)
		select {
		case <-trainerDone:
		case <-time.After(10 * time.Second):
			cmd.Process.Kill()
			<-trainerDone
		}
	}()
	if err := os.WriteFile(pidfile, []byte(strconv.Itoa(cmd.Process.Pid)+"\n"), 0o644); err != nil {
		return fail("write the trainer's pidfile: %v", err)
	}
	// what names the trainer in a failure.
	what := "the trainer command"
	if p.trainerCmd == "" {
		what = "the demo trainer"
	}
	if p.trainerCmd == "" && !waitFile(ctx, ready, trainerDone, 30*time.Second) {
		if err, ok := exited(trainerDone); ok {
			return fail("%s %s before it was ready", what, describeExit(err))
		}
		return fail("the demo trainer did not start")
	}

	deps := agent.Deps{
		// The simulator's, or with --imds real the configured imds.endpoint (it was ignored:
		// the SDK's default took its place).
		Logger: log, IMDS: imds.NewClient(awsCfg, cfg.IMDS.Endpoint),
		OpenStore: func(string, checkpoint.S3Options) (checkpoint.Store, error) { return store, nil },
	}
	if !p.useTrainerConfig {
		deps.TrainerTree = cmd.Process.Pid
	}
	a, err := agent.New(cfg, deps)
	if err != nil {
		return fail("%v", err)
	}
	actx, stop := context.WithCancel(ctx)
	var agentErr error
	agentStopped := make(chan struct{})
	go func() { agentErr = a.Run(actx); close(agentStopped) }()
	defer func() { stop(); <-agentStopped }()
	// agentFailed reports whether the agent has stopped on its own (another agent holds its
	// runtime directory or watches the checkpoint directory, its listener failed), and why.
	agentFailed := func() (error, bool) {
		select {
		case <-agentStopped:
			if agentErr == nil {
				return errors.New("it stopped"), true
			}
			return agentErr, true
		default:
			return nil, false
		}
	}

	if sim != nil {
		// Give the agent a moment to be watching, as on a real instance, then announce.
		// A trainer that exits (a command not found, a crash at start) fails the drill at once.
		found := waitUntil(ctx, 10*time.Second, func() bool {
			_, gone := exited(trainerDone)
			_, failed := agentFailed()
			return gone || failed || len(a.Status().Trainers) > 0
		})
		if err, ok := agentFailed(); ok {
			return fail("the agent could not run: %v", err)
		}
		if err, ok := exited(trainerDone); ok {
			return fail("%s %s before the agent found it", what, describeExit(err))
		}
		if !found {
			return fail("the agent did not find the trainer (pid %d)", cmd.Process.Pid)
		}
		if p.trainerCmd != "" {
			// A trainer of your own takes a while to install its handler (Python's start, its
			// imports, a launcher starting its workers); a notice before that finds nothing to
			// signal. One that never does is reported as such once the wait is over.
			fmt.Fprintf(p.progress, "waiting up to %v for the trainer to catch %s\n", drillTrainerWait, trainer.SignalName(cfg.Trainer.Signal))
			waitUntil(ctx, drillTrainerWait, func() bool {
				_, gone := exited(trainerDone)
				return gone || slices.ContainsFunc(a.ScanTrainers(), func(t agent.TrainerStatus) bool { return t.CatchesSignal })
			})
			if err, ok := exited(trainerDone); ok {
				return fail("%s %s before it caught %s", what, describeExit(err), trainer.SignalName(cfg.Trainer.Signal))
			}
		}
		sim.Interrupt("terminate", drillWindow)
	} else {
		fmt.Fprintln(p.progress, "waiting for a real interruption notice (start an AWS FIS experiment, or Ctrl-C)")
	}

	// Follow the notice until it is committed, the trainer refuses, or the window closes.
	// A trainer that exits while the drill waits for a real notice ends the wait.
	var ns agent.NoticeStatus
	found := false
	imdsSaid := false
	waitUntil(ctx, 24*time.Hour, func() bool {
		st := a.Status()
		if spot, ok := st.IMDS.Sources[imds.SourceSpot]; ok && sim == nil && !imdsSaid && spot.Streak > 0 &&
			spot.FailingSince != nil && time.Since(*spot.FailingSince) >= drillIMDSSilence {
			// Waiting for a notice that cannot be read would be silent for ever (found from
			// outside: a container with the metadata hop limit at 1).
			imdsSaid = true
			fmt.Fprintf(p.progress, "IMDS does not answer (%s for %s): no notice can be read; on EC2, check the metadata options (enabled, hop limit 2 in a container) and imds.endpoint\n",
				spot.LastError, time.Since(*spot.FailingSince).Round(time.Second))
		}
		for _, n := range st.Notices {
			if n.Source == imds.SourceSpot && n.Active {
				ns, found = n, true
				return true
			}
		}
		_, gone := exited(trainerDone)
		_, failed := agentFailed()
		return gone || failed
	})
	if !found {
		if err, ok := agentFailed(); ok {
			return fail("the agent could not run: %v", err)
		}
		if err, ok := exited(trainerDone); ok {
			return fail("%s %s before the notice arrived", what, describeExit(err))
		}
		return fail("no notice arrived")
	}
	rep.noticed(ns.Transitions[0].At, ns.Deadline)
	rep.add("notice detected", rep.notice, ns.Key)
	var outcome string
	waitUntil(ctx, time.Until(*rep.Deadline)+time.Second, func() bool {
		for _, n := range a.Status().Notices {
			if n.Key == ns.Key {
				ns = n
			}
		}
		switch ns.State {
		case agent.StateTrainerNotSignalled, agent.StateCommitted:
			outcome = ns.State
			return true
		case agent.StateCheckpointMissing:
			if r := transitionDetailLast(ns, agent.StateCheckpointMissing); r == agent.MissingWithheld || r == agent.MissingDeleted {
				// The agent knows it will not commit it (a file written after the marker, or
				// one it cannot store; or the checkpoint deleted): no use waiting out the
				// deadline, to blame size and speed (found from outside).
				outcome = r
				return true
			}
		}
		select {
		case err := <-trainerDone:
			trainerDone <- err
			if ns.State != agent.StateCheckpointWritten && !markerSince(p.ckDir, cfg.Checkpoint.Marker, transitionAt(ns, agent.StateTrainerSignalled)) {
				outcome = "trainer_exited"
				return true
			}
			// A trainer that saves on the signal and exits at once: its marker is on disk,
			// perhaps not seen yet (found from outside: failed as "exited before writing a
			// complete checkpoint" in 5 of 18 runs). The agent commits it, or says why not.
		default:
		}
		return false
	})
	for _, tr := range ns.Transitions {
		switch tr.State {
		case agent.StateTrainerSignalled:
			rep.add("trainer signalled", tr.At, tr.Detail)
		case agent.StateCheckpointWritten:
			rep.add("checkpoint complete (marker)", tr.At, tr.Detail)
		}
	}
	switch outcome {
	case agent.StateTrainerNotSignalled:
		if err, ok := exited(trainerDone); ok {
			return fail("%s %s before it was signalled", what, describeExit(err))
		}
		detail := "no trainer process found"
		for _, s := range ns.Signals {
			if s.Outcome == "not_caught" {
				detail = fmt.Sprintf("the trainer (pid %d) does not catch %s, so it was not signalled: install a handler for it", s.PID, trainer.SignalName(cfg.Trainer.Signal))
			}
		}
		return fail("%s", detail)
	case "trainer_exited":
		err, _ := exited(trainerDone)
		return fail("%s %s before writing a complete checkpoint", what, describeExit(err))
	case agent.MissingWithheld, agent.MissingDeleted:
		return fail("%s", ns.Missing)
	case "":
		if ns.State == agent.StateTrainerSignalled || (ns.State == agent.StateCheckpointMissing && transitionDetail(ns, agent.StateCheckpointWritten) == "") {
			if signalled := transitionAt(ns, agent.StateTrainerSignalled); !signalled.IsZero() && !writtenSince(p.ckDir, signalled) {
				// Not a matter of size or speed (found from outside: README's drill gave the
				// trainer no directory, and the advice was to save smaller checkpoints).
				return fail("the trainer was signalled but wrote nothing into --checkpoint-dir %s before the deadline: does it save there? "+
					"(give it the directory, as in --trainer-cmd 'python train.py --ckpt %s', and make it save on %s)", p.ckDir, p.ckDir, trainer.SignalName(cfg.Trainer.Signal))
			}
			if entries, err := os.ReadDir(p.ckDir); err == nil {
				if top, below := doctorMarkerBelow(p.ckDir, entries, cfg.Checkpoint.Marker); top != "" {
					// Found from outside: the drill blamed size and speed.
					return fail("the trainer wrote %s, below the top of %s, which it does not complete: --checkpoint-dir looks one level too high (give %s, and the same as checkpoint.dir)",
						filepath.Join(top, below), filepath.Join(p.ckDir, top), filepath.Join(p.ckDir, top))
				}
			}
			return late("the trainer was signalled but no complete checkpoint (marker %s) appeared before the deadline", cfg.Checkpoint.Marker)
		}
		if r := transitionDetailLast(ns, agent.StateCheckpointMissing); ns.State == agent.StateCheckpointMissing && ns.Missing != "" && r != "no_marker" {
			// The agent says why, and what to do: not a matter of size or speed.
			return fail("%s", ns.Missing)
		}
		if st := a.Status().Store; st != nil && st.LastUploadError != nil {
			// The store refused the checkpoint's uploads while its probe's tiny write passed (a
			// full disk, a quota, a policy on some keys): that is the cause, not the link (found
			// from outside: the drill said "late" with advice on size and bandwidth).
			e := st.LastUploadError
			rep.Cause, rep.storeFix = "store:"+e.Reason, agent.StoreFix(e.Reason, p.store, nil)
			return fail("the checkpoint was not committed before the deadline (state %s): the store refused its %s of %s (%s): %s",
				ns.State, e.Kind, e.Checkpoint, e.Reason, e.Error)
		}
		return late("the checkpoint was not committed before the deadline (state %s)", ns.State)
	}

	// Committed: the manifest has the upload's own timings.
	name := strings.SplitN(transitionDetail(ns, agent.StateCommitted), ",", 2)[0]
	commits, _, err := checkpoint.ListCommitted(ctx, store, p.job)
	if err != nil {
		return fail("read the committed manifest: %v", err)
	}
	i := slices.IndexFunc(commits, func(c checkpoint.Committed) bool { return c.Manifest.Checkpoint == name })
	if i < 0 {
		return fail("the committed manifest of %s is not in the store", name)
	}
	m := commits[i].Manifest
	rep.manifest, rep.Checkpoint, rep.Commit, rep.Files, rep.Bytes = m, name, m.Commit, len(m.Files), m.TotalBytes
	if t := m.Timings.FirstFileAt; t != nil {
		rep.add("first file closed", *t, "")
	}
	if t := m.Timings.LastByteAt; t != nil {
		rep.add("last byte stored", *t, "")
		if m.Timings.FirstFileAt != nil && t.After(*m.Timings.FirstFileAt) {
			rep.UploadMBs = float64(m.TotalBytes) / t.Sub(*m.Timings.FirstFileAt).Seconds() / 1e6
		}
	}
	// Durable when the agent had written the manifest (and moved LATEST): the manifest's own
	// committed_at is when it was made, before it was sent (found from outside: 1.5 s early
	// behind a slow link, and the margin as much too large).
	committedAt := transitionAt(ns, agent.StateCommitted)
	rep.add("manifest committed", committedAt, fmt.Sprintf("%d files, %s", len(m.Files), checkpoint.HumanBytes(m.TotalBytes)))
	rep.committed(committedAt)

	// The next instance: restore and compare byte for byte.
	to := filepath.Join(p.tmp, "restored")
	start := time.Now()
	res, err := checkpoint.Restore(ctx, store, checkpoint.RestoreOptions{Job: p.job, Checkpoint: name, Commit: m.Commit, CommitSet: true, To: to, Logger: log})
	if err != nil {
		return fail("restore: %v", err)
	}
	rep.RestoreMBs = float64(res.Bytes) / max(time.Since(start).Seconds(), 1e-9) / 1e6
	rep.add("restored and verified", time.Now(), checkpoint.HumanBytes(res.Bytes))
	if err := sameFiles(filepath.Join(p.ckDir, name), res.Dir); err != nil {
		return fail("the restored checkpoint differs from what the trainer wrote: %v", err)
	}
	// The same bytes now, perhaps, but was the trainer still writing when its marker said the
	// save was whole? Then the commit may hold a torn file (found from outside: PASS 8 of 9 times
	// with a shard half written into the commit). Watched for drillSettle after the verify.
	var f string
	waitUntil(ctx, drillSettle, func() bool {
		f = writtenAfterMarker(filepath.Join(p.ckDir, name), cfg.Checkpoint.Marker)
		return f != ""
	})
	if f != "" {
		return fail("the trainer wrote %s after its checkpoint's marker: the marker says every file of the save is whole, so the commit holds what was there when it came, a torn checkpoint; write the marker last, after every file of the save", f)
	}
	rep.Verified = true
	if committedAt.After(*rep.Deadline) {
		return late("committed %.1f s after the deadline", -*rep.MarginS)
	}
	return true
}

// exited reports whether the trainer has exited, with its Wait error, leaving that in done for
// the next look.
func exited(done chan error) (error, bool) {
	select {
	case err := <-done:
		done <- err
		return err, true
	default:
		return nil, false
	}
}

// describeExit says how a trainer ended, from its Wait error: "exited with status N" (127 and
// 126 with what the shell means by them), "was killed by SIGNAL", or the error.
func describeExit(err error) string {
	var ee *exec.ExitError
	switch {
	case err == nil:
		return "exited with status 0"
	case errors.As(err, &ee):
		if ws, ok := ee.Sys().(syscall.WaitStatus); ok && ws.Signaled() {
			return "was killed by " + trainer.SignalName(ws.Signal())
		}
		switch code := ee.ExitCode(); code {
		case 127:
			return "exited with status 127 (command not found: see the shell's message above)"
		case 126:
			return "exited with status 126 (found but not executable)"
		default:
			return fmt.Sprintf("exited with status %d", code)
		}
	default:
		return "ended: " + err.Error()
	}
}

// drillStore opens the drill's store and checks it first: a wrong bucket or a missing permission
// fails here, in seconds, with the real cause (in rep), rather than as a checkpoint that never
// commits.
func drillStore(ctx context.Context, p drillPlan, cfg *agent.Config, realEndpoint string, rep *drillReport) (checkpoint.Store, error) {
	sctx, cancel := context.WithTimeout(ctx, drillStoreTimeout)
	defer cancel()
	store, err := openStore(sctx, p.store, realEndpoint, cfg.S3Options())
	if err != nil {
		reason := agent.StoreErrorReason(err)
		rep.Cause, rep.storeFix = "store:"+reason, agent.StoreFix(reason, p.store, err)
		return nil, fmt.Errorf("store: %w", err)
	}
	host, _ := os.Hostname()
	if probe := agent.ProbeStore(sctx, store, p.job, host); !probe.OK() {
		rep.Cause, rep.storeFix = "store:"+probe.Reason, agent.StoreFix(probe.Reason, probe.URL, probe.Err)
		return nil, fmt.Errorf("store check failed before the rehearsal: %s", probe.Problem())
	}
	return store, nil
}

// drillConfig is the agent's configuration for a drill, as `spotguard run` would load it, pointed
// at the drill's pieces: the trainer's pidfile, the checkpoint and runtime directories, the
// drill's store and job, a node alone (store.world_nodes 1: a multi-node drill says otherwise in
// extra), the IMDS simulator at endpoint (if not empty), no listener, no CloudWatch; extra keys
// last. It also returns the IMDS endpoint of the user's configuration, for
// the store's region (the real IMDS, as for `spotguard run`, even when the notices come from the
// drill's simulator).
func drillConfig(p drillPlan, pidfile, ckDir, runDir, endpoint string, extra ...agent.KeyValue) (*agent.Config, string, error) {
	overrides := append([]agent.KeyValue{}, p.configFlags.overrides...)
	if !p.useTrainerConfig {
		for _, key := range []string{"trainer.match", "trainer.unit", "trainer.container", "trainer.user"} {
			overrides = append(overrides, agent.KeyValue{Key: key, Value: ""})
		}
	}
	overrides = append(overrides,
		agent.KeyValue{Key: "trainer.pidfile", Value: pidfile},
		agent.KeyValue{Key: "checkpoint.dir", Value: ckDir}, agent.KeyValue{Key: "store.url", Value: p.store},
		agent.KeyValue{Key: "store.job", Value: p.job},
		agent.KeyValue{Key: "store.world_nodes", Value: "1"}, agent.KeyValue{Key: "store.node_rank", Value: "0"},
		agent.KeyValue{Key: "http.listen", Value: ""},
		agent.KeyValue{Key: "agent.runtime_dir", Value: runDir},
		agent.KeyValue{Key: "metrics.cloudwatch", Value: "false"}, agent.KeyValue{Key: "notices.rebalance", Value: "ignore"})
	if endpoint != "" {
		overrides = append(overrides, agent.KeyValue{Key: "imds.endpoint", Value: endpoint})
	}
	if p.trainerCmd == "" {
		// The demo trainer catches SIGUSR1 and writes _COMPLETE last, whatever the configuration
		// says for the real trainer (.metadata for DCP, another signal): with those the drill
		// waited out its window and failed, blaming the link (found from outside).
		overrides = append(overrides, agent.KeyValue{Key: "checkpoint.marker", Value: drillMarker},
			agent.KeyValue{Key: "trainer.signal", Value: "SIGUSR1"})
	}
	// A drill that failed does not drain for the configured budget (140 s by default) before it
	// says so.
	overrides = append(overrides, agent.KeyValue{Key: "agent.stop_budget", Value: drillStopBudget.String()})
	if !strings.HasPrefix(p.store, "s3://") {
		// Server-side encryption is S3's: a drill in a local store leaves the configured one out.
		overrides = append(overrides, agent.KeyValue{Key: "store.sse", Value: ""}, agent.KeyValue{Key: "store.kms_key_id", Value: ""})
	}
	overrides = append(overrides, extra...)
	path := p.configFlags.path
	if _, err := os.Stat(path); err != nil && path == agent.DefaultConfigPath {
		path = "" // no installed config: defaults
	}
	realEndpoint := ""
	if ucfg, err := agent.Load(agent.LoadOptions{Path: path, Environ: p.environ, Flags: p.configFlags.overrides}); err == nil {
		realEndpoint = ucfg.IMDS.Endpoint
	}
	cfg, err := agent.Load(agent.LoadOptions{Path: path, Environ: p.environ, Flags: overrides})
	if err != nil {
		return nil, "", err
	}
	if err := cfg.Validate(); err != nil {
		return nil, "", fmt.Errorf("invalid configuration: %w", err)
	}
	return cfg, realEndpoint, nil
}

func (r *drillReport) add(step string, at time.Time, detail string) {
	r.Timeline = append(r.Timeline, drillStep{Step: step, Seconds: at.Sub(r.notice).Seconds(), Detail: detail})
}

func transitionDetail(ns agent.NoticeStatus, state string) string {
	for _, tr := range ns.Transitions {
		if tr.State == state {
			return tr.Detail
		}
	}
	return ""
}

// sameFiles compares every regular file under want with its copy under got.
func sameFiles(want, got string) error {
	return filepath.WalkDir(want, func(p string, d os.DirEntry, err error) error {
		if err != nil || !d.Type().IsRegular() {
			return err
		}
		rel, _ := filepath.Rel(want, p)
		a, err := os.ReadFile(p)
		if err != nil {
			return err
		}
		b, err := os.ReadFile(filepath.Join(got, rel))
		if err != nil {
			return err
		}
		if !bytes.Equal(a, b) {
			return fmt.Errorf("%s differs", rel)
		}
		return nil
	})
}

// drillAdvice says what to change when the margin is thin, or the drill failed on something
// advice can fix: the store check, a trainer that does not catch the signal, a checkpoint not
// committed in time. Other failures (a trainer that exited, a configuration the agent refuses)
// say all there is in the reason.
func drillAdvice(r drillReport) []string {
	var out []string
	if strings.HasPrefix(r.Cause, "store") {
		return []string{r.storeFix}
	}
	if !r.Pass && strings.Contains(r.Reason, "does not catch") {
		return []string{"handle the signal in the trainer (see examples/python/trainer.py): set a flag, save at the next step boundary"}
	}
	if r.Pass && r.MarginS != nil && *r.MarginS >= drillThinMargin.Seconds() || !r.Pass && !r.late {
		return nil
	}
	out = append(out,
		"save a smaller checkpoint on notice (model and optimizer state only; skip data-loader and metrics state)",
		"save periodically more often, so a notice finds most of the history already in the store (spotguard plan says how often)",
		"react to rebalance recommendations (notices.rebalance: checkpoint): they often come minutes before the reclaim",
		"raise store.concurrency (and use an instance with more network bandwidth) if the upload is the long part")
	return out
}

func printDrill(w io.Writer, r drillReport) {
	fmt.Fprintf(w, "spotguard drill: store %s, job %s (a fresh job for this drill)\n\n", r.Store, r.Job)
	for _, s := range r.Timeline {
		d := ""
		if s.Detail != "" {
			d = "  " + s.Detail
		}
		fmt.Fprintf(w, "  %+7.2f s  %s%s\n", s.Seconds, s.Step, d)
	}
	for _, n := range r.Nodes {
		what := "told by the job (POST /notice)"
		if n.Notified {
			what = "notified by its IMDS"
		}
		fmt.Fprintf(w, "\n  node %d, %s (committed: its part):\n", n.Rank, what)
		for _, st := range n.Timeline {
			fmt.Fprintf(w, "    %+7.2f s  %s  %s\n", st.Seconds, st.Step, st.Detail)
		}
	}
	if len(r.Nodes) > 0 && r.DurableS != nil {
		fmt.Fprintf(w, "\n  the job's checkpoint (every node's part) was durable %.1f s after the notice\n", *r.DurableS)
	}
	if r.UploadMBs > 0 || r.RestoreMBs > 0 {
		fmt.Fprintf(w, "\n  upload %.0f MB/s (first file closed → last byte), restore %.0f MB/s with every checksum verified\n", r.UploadMBs, r.RestoreMBs)
	}
	if r.Checkpoint != "" && r.MarginS != nil {
		fmt.Fprintf(w, "  margin: %.1f s of the 2-minute window left when %s was committed\n", *r.MarginS, r.Checkpoint)
	}
	if r.Pass && r.DurableS != nil {
		fmt.Fprintf(w, "\nPASS: the checkpoint was durable %.1f s after the notice and restored byte for byte\n", *r.DurableS)
	} else if r.Pass {
		fmt.Fprintln(w, "\nPASS")
	} else {
		fmt.Fprintf(w, "\nFAIL: %s\n", r.Reason)
	}
	if len(r.Advice) > 0 {
		fmt.Fprintln(w, "\nAdvice:")
		for _, a := range r.Advice {
			fmt.Fprintf(w, "  - %s\n", a)
		}
	}
}

// waitFile waits until path exists, the process ends, or within passes.
func waitFile(ctx context.Context, path string, done chan error, within time.Duration) bool {
	return waitUntil(ctx, within, func() bool {
		select {
		case err := <-done:
			done <- err
			return false
		default:
		}
		_, err := os.Stat(path)
		return err == nil
	})
}

// waitUntil polls cond every 20 ms until it holds (true), or within passes or ctx ends (false).
func waitUntil(ctx context.Context, within time.Duration, cond func() bool) bool {
	deadline := time.NewTimer(within)
	defer deadline.Stop()
	tick := time.NewTicker(20 * time.Millisecond)
	defer tick.Stop()
	for !cond() {
		select {
		case <-ctx.Done():
			return false
		case <-deadline.C:
			return cond()
		case <-tick.C:
		}
	}
	return true
}

func parseDrillSize(v string) (int64, error) {
	n, err := agent.ParseSize(v)
	if err != nil {
		return 0, err
	}
	if n <= 0 {
		return 0, errors.New("want more than 0 bytes")
	}
	return n, nil
}

// drillTrainerCmd is the hidden subcommand the drill runs as its demo trainer.
const drillTrainerCmd = "__drill-trainer"

// runDrillTrainer is the demo trainer: it catches SIGUSR1, and on it writes a checkpoint of size
// bytes in files files (each written to a temp name and renamed, the marker last), then trains on
// until SIGTERM.
func runDrillTrainer(ctx context.Context, args []string, stderr io.Writer) int {
	fs := flag.NewFlagSet(drillTrainerCmd, flag.ContinueOnError)
	fs.SetOutput(stderr)
	dir := fs.String("dir", "", "")
	size := fs.Int64("size", 512<<20, "")
	files := fs.Int("files", 8, "")
	ready := fs.String("ready", "", "")
	rank := fs.Int("rank", -1, "")
	if err := fs.Parse(args); err != nil || *dir == "" {
		return exitUsage
	}
	sigs := make(chan os.Signal, 4)
	signal.Notify(sigs, syscall.SIGUSR1, syscall.SIGTERM)
	defer signal.Stop(sigs)
	if *ready != "" {
		os.WriteFile(*ready, []byte("ok\n"), 0o644)
	}
	step := 0
	for {
		select {
		case <-ctx.Done():
			return exitOK
		case sig := <-sigs:
			if sig == syscall.SIGTERM {
				return exitOK
			}
			step++
			if err := writeDrillCheckpoint(filepath.Join(*dir, fmt.Sprintf("step-%06d", step)), *size, *files, *rank); err != nil {
				fmt.Fprintf(stderr, "demo trainer: %v\n", err)
				return exitFail
			}
		}
	}
}

// writeDrillCheckpoint writes dir with files shards of size bytes in all, then the marker. With a
// rank (0 or more: one node of several) the shards are shard-R-NN.bin.
func writeDrillCheckpoint(dir string, size int64, files, rank int) error {
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return err
	}
	per := size / int64(files)
	for i := range files {
		n := per
		if i == files-1 {
			n = size - per*int64(files-1)
		}
		name := fmt.Sprintf("shard-%02d.bin", i)
		if rank >= 0 {
			name = fmt.Sprintf("shard-%d-%02d.bin", rank, i)
		}
		final, tmp := filepath.Join(dir, name), filepath.Join(dir, "."+name+".tmp")
		f, err := os.Create(tmp)
		if err != nil {
			return err
		}
		_, err = io.CopyN(f, rand.Reader, n)
		if err == nil {
			err = f.Sync()
		}
		if cerr := f.Close(); err == nil {
			err = cerr
		}
		if err != nil {
			return err
		}
		if err := os.Rename(tmp, final); err != nil {
			return err
		}
	}
	return os.WriteFile(filepath.Join(dir, drillMarker), []byte("{}\n"), 0o644)
}

// lockedWriter serializes the Writes to w.
type lockedWriter struct {
	mu sync.Mutex
	w  io.Writer
}

func (l *lockedWriter) Write(p []byte) (int, error) {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.w.Write(p)
}

// transitionAt returns when ns first entered state, zero if it never did.
func transitionAt(ns agent.NoticeStatus, state string) time.Time {
	for _, tr := range ns.Transitions {
		if tr.State == state {
			return tr.At
		}
	}
	return time.Time{}
}

// transitionDetailLast is the detail of ns's last transition to state ("" if none).
func transitionDetailLast(ns agent.NoticeStatus, state string) string {
	for _, tr := range slices.Backward(ns.Transitions) {
		if tr.State == state {
			return tr.Detail
		}
	}
	return ""
}

// markerSince reports whether a checkpoint directory at the top of dir holds marker, written at
// t or after (less the file system's time granularity).
func markerSince(dir, marker string, t time.Time) bool {
	entries, err := os.ReadDir(dir)
	if err != nil || t.IsZero() {
		return false
	}
	for _, e := range entries {
		if fi, err := os.Lstat(filepath.Join(dir, e.Name(), marker)); err == nil && fi.Mode().IsRegular() && !fi.ModTime().Before(t.Add(-checkpoint.FileTimeLag)) {
			return true
		}
	}
	return false
}

// drillSettle is how long the drill watches the trainer's checkpoint after it verified the restored
// copy, for a file written after the marker.
const drillSettle = time.Second

// writtenAfterMarker returns a file under dir (a checkpoint directory) modified after its marker
// (beyond the file system's time granularity), "" if none.
func writtenAfterMarker(dir, marker string) string {
	m, err := os.Lstat(filepath.Join(dir, marker))
	if err != nil {
		return ""
	}
	var found string
	_ = filepath.WalkDir(dir, func(p string, d os.DirEntry, err error) error {
		if err != nil || found != "" || !d.Type().IsRegular() {
			return nil
		}
		if fi, err := d.Info(); err == nil && fi.ModTime().After(m.ModTime().Add(checkpoint.FileTimeLag)) {
			found, _ = filepath.Rel(dir, p)
		}
		return nil
	})
	return found
}

// writtenSince reports whether anything under dir (dir's own entries included) was modified at
// t or after (less the file system's time granularity).
func writtenSince(dir string, t time.Time) bool {
	t = t.Add(-checkpoint.FileTimeLag)
	found := false
	_ = filepath.WalkDir(dir, func(path string, d fs.DirEntry, err error) error {
		if err != nil || found {
			return filepath.SkipAll
		}
		if fi, err := d.Info(); err == nil && !fi.ModTime().Before(t) && path != dir {
			found = true
			return filepath.SkipAll
		}
		return nil
	})
	return found
}
