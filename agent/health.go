package agent

import (
	"context"
	"errors"
	"fmt"
	"maps"
	"os"
	"strings"
	"sync"
	"syscall"
	"time"

	"github.com/rs/zerolog"

	"github.com/spotguard/spotguard/agent/imds"
	"github.com/spotguard/spotguard/checkpoint"
)

// healthVerdict is what /healthz answers, and what /status, spotguard_healthy and the STATUS
// line say. The agent is healthy when the spot source answered within the last 30 s
// (imds.HealthWindow; every source when spot is not polled), the last store probe passed (with a
// store; before the first probe ends the store is not healthy yet), and the checkpoint side runs.
type healthVerdict struct {
	Healthy bool `json:"healthy"`
	// Reasons say why it is not healthy, each naming what failed and the error; empty when it is.
	Reasons []string `json:"reasons"`
	// Warnings are trouble that does not make the agent unhealthy: an IMDS source other than spot
	// that keeps failing (its notices are not seen), a checkpoint.dir not created yet.
	Warnings []string `json:"warnings,omitempty"`
	// short holds Reasons and then Warnings in a few words each, for the STATUS line.
	short []string
}

func (v *healthVerdict) reason(long, short string) {
	v.Reasons = append(v.Reasons, long)
	v.short = append(v.short, short)
}

// warn adds a warning; an empty short one is not on the STATUS line (which says it its own way).
func (v *healthVerdict) warn(long, short string) {
	v.Warnings = append(v.Warnings, long)
	if short != "" {
		v.short = append(v.short, short)
	}
}

// imdsUp is whether IMDS is up as /healthz judges it: the spot source answered within
// imds.HealthWindow (every source, when spot is not polled). Another source failing is a warning,
// and does not make IMDS down: spotguard_imds_up, CloudWatch's IMDSUp and /status say the same.
func imdsUp(st imds.Stats, now time.Time) bool {
	if spot, polled := st.Sources[imds.SourceSpot]; polled {
		return spot.Healthy(now)
	}
	return st.Healthy(now)
}

// health judges the agent as of now.
func (a *Agent) health(now time.Time) healthVerdict {
	v := healthVerdict{Reasons: []string{}}
	st := a.watcher.Stats()
	if spot, polled := st.Sources[imds.SourceSpot]; polled {
		switch {
		case spot.Healthy(now):
		case spot.LastMalformed:
			d := now.Sub(spot.FailingSince).Round(time.Second)
			v.reason(fmt.Sprintf("IMDS spot (%s) has answered with a body it cannot read for %s; the agent acts on a fail-safe notice (terminate, 2 minutes after it came): %s",
				imds.SourceSpot.Path(), d, spot.LastError), "IMDS spot unreadable for "+d.String())
		default:
			d := now.Sub(spot.FailingSince).Round(time.Second)
			v.reason(fmt.Sprintf("IMDS spot (%s) has failed for %s, so an interruption notice would not be seen: %s",
				imds.SourceSpot.Path(), d, spot.LastError), "IMDS spot failing for "+d.String())
		}
	} else if !st.Healthy(now) {
		v.reason("IMDS has failed for more than "+imds.HealthWindow.String()+" on every source", "IMDS failing")
	}
	if err := a.listenProblem.Load(); err != nil {
		addr := a.cfg.Load().HTTP.Listen
		v.reason(fmt.Sprintf("http.listen %s cannot be bound (%v): /healthz, /status, /metrics and POST /notice are not served (a multi-node job's notices from other nodes do not reach this agent); the notice path and uploads run; tried again every %s; free the port or set http.listen",
			addr, *err, listenRetry), "http.listen "+addr+" not bound")
	}
	if d, stuck := a.coord.stuckFor(now); stuck {
		v.reason(fmt.Sprintf("the notice path's loop has not gone round for %s: a notice would not be acted on (the log says what it waits for; the systemd watchdog restarts the agent)",
			d.Round(time.Second)), "notice path stuck for "+d.Round(time.Second).String())
	}
	for _, src := range imds.Sources {
		s, polled := st.Sources[src]
		if src == imds.SourceSpot || !polled || s.Healthy(now) {
			continue
		}
		d := now.Sub(s.FailingSince).Round(time.Second)
		v.warn(fmt.Sprintf("IMDS %s (%s) has failed for %s; its notices are not seen: %s", src, src.Path(), d, s.LastError),
			fmt.Sprintf("IMDS %s failing for %s", src, d))
	}
	if a.store != nil {
		switch ps := a.store.prober.state(); {
		case ps.Probes == 0:
			// Healthy means the store took a write: not before the first probe says so (it
			// takes a moment, unless the store does not answer).
			v.reason(fmt.Sprintf("store %s: the first probe (list and a tiny write under %s/_spotguard/) has not finished yet", a.store.url, a.store.job),
				fmt.Sprintf("store %s: not probed yet", a.store.url))
		case !ps.Last.OK():
			v.reason(ps.Last.Problem()+"; fix: "+StoreFix(ps.Last.Reason, ps.Last.URL, ps.Last.Err),
				fmt.Sprintf("store %s: %s failed: %s", ps.Last.URL, ps.Last.Step, shortStoreError(ps.Last.Err)))
		default:
			if name, run, ok := a.store.uploadsFailing(now, ps.RecoveredAt); ok && name == latestFailing {
				d := now.Sub(run.first).Round(time.Second)
				v.reason(fmt.Sprintf("store %s: LATEST cannot be moved to the newest commit for %s (%s: %s), though the store's probe passes; restore takes the newest commit anyway; healthy again once it moves",
					a.store.url, d, run.reason, run.err), fmt.Sprintf("LATEST failing for %s", d))
			} else if ok {
				d := now.Sub(run.first).Round(time.Second)
				v.reason(fmt.Sprintf("store %s: the uploads of checkpoint %s have failed for %s (%s: %s), though the store's probe passes; healthy again once it commits",
					a.store.url, name, d, run.reason, run.err), fmt.Sprintf("checkpoint %s: uploads failing for %s", name, d))
			}
		}
	}
	if a.store != nil {
		if ps := a.store.prober.state(); ps.ClockOff {
			// Said only in the log before (found from outside): an instance writing the job with
			// its clock off orders its commits by it.
			how := fmt.Sprintf("%s behind", ps.ClockOffset.Round(time.Second))
			if ps.ClockOffset < 0 {
				how = fmt.Sprintf("%s ahead of", (-ps.ClockOffset).Round(time.Second))
			}
			v.warn(fmt.Sprintf("this instance's clock is %s the store's (as of its last probe): commits are ordered by the clock of the instance that writes them; fix: %s", how, ClockFix),
				"clock "+how+" the store's")
		}
	}
	if ok, reason := a.checkpointHealth(); !ok {
		v.reason(reason, reason)
	} else if reason != "" {
		v.warn(reason, reason) // healthy, and said so: waiting for checkpoint.dir to be created
	}
	if a.uploader != nil {
		if w := a.markerless(now); w != "" {
			v.warn(w, "a checkpoint's marker has not come")
		}
		if p := a.uploader.JournalProblem(); p != "" {
			dir := a.cfg.Load().Agent.RuntimeDir
			v.warn(fmt.Sprintf("the upload journal in agent.runtime_dir %s cannot be used (%s): a restart sends uncommitted files again; fix the directory and restart the agent",
				dir, p), "upload journal off")
		}
	}
	if err := a.runLockProblem.Load(); err != nil {
		v.reason(fmt.Sprintf("another agent holds agent.runtime_dir now, since its lock file was removed under this one: %v", *err),
			"another agent on agent.runtime_dir")
	}
	if err := a.runtimeDirProblem.Load(); err != nil && a.coord.noticeFileProblem() == nil {
		dir := a.cfg.Load().Agent.RuntimeDir
		v.warn(fmt.Sprintf("agent.runtime_dir %s cannot be written (%v): at a notice, a trainer reading %s would find no notice and no deadline, and the upload journal cannot grow; %s",
			dir, *err, NoticeFile, RuntimeDirFix(dir, *err)), "runtime dir "+dir+" not writable")
	}
	if err := a.coord.noticeFileProblem(); err != nil {
		dir := a.cfg.Load().Agent.RuntimeDir
		v.warn(fmt.Sprintf("agent.runtime_dir %s cannot be written (%v): a trainer reading %s finds no notice and no deadline, and a restart sends uncommitted files again (no journal); %s",
			dir, err, NoticeFile, RuntimeDirFix(dir, err)), "runtime dir "+dir+" not writable")
	}
	for _, w := range a.coord.trainerWarnings() {
		v.warn(w[0], w[1])
	}
	if since, ok := a.gpu.notAnswering(); ok {
		d := now.Sub(since).Round(time.Second)
		v.warn(fmt.Sprintf("NVML has not answered for %s (since %s): a GPU or its driver hangs; GPU readings and verdicts stop until it answers (look for Xid errors in the kernel log)",
			d, since.UTC().Format(time.RFC3339)), "NVML not answering for "+d.String())
	}
	// What the configuration's own warnings say at start is in the log once; /healthz says it as
	// long as it holds (found from outside: a checkpoint.dir under /tmp, invisible to the agent
	// under PrivateTmp=yes, was said only in the first lines of the journal).
	cfg := a.cfg.Load()
	warnings := cfg.Warnings()
	if a.deps.UnderUnit {
		warnings = append(warnings, cfg.UnitWarnings()...)
	}
	for _, w := range warnings {
		key, _, _ := strings.Cut(w.Text, ":")
		v.warn(w.Text+"; fix: "+w.Fix, "configuration: "+key)
	}
	a.mu.Lock()
	pending := strings.Join(a.needRestart, ", ")
	jobProblem := a.jobProblem
	withheld := a.withheld
	split := a.split
	refused := a.reloadRefused
	a.mu.Unlock()
	if refused != "" {
		v.warn("the last reload (SIGHUP) was refused, and the running configuration stays: "+refused+"; fix the file (spotguard config shows every problem) and reload again",
			"last reload refused")
	}
	if jobProblem != nil {
		v.reason(fmt.Sprintf("job checkpoint %s could not be committed (%s): %v; healthy again once a job checkpoint commits",
			jobProblem.Checkpoint, jobProblem.At.UTC().Format(time.RFC3339), jobProblem.Err),
			"job checkpoint "+jobProblem.Checkpoint+" not committed")
	}
	if withheld != nil {
		what := "has its marker"
		if errors.Is(withheld.Err, checkpoint.ErrAgentDenied) {
			// Whether its marker is there the agent may not see (found from outside: a 0700
			// directory without one was said to have it).
			what = "may hold a save the agent may not read"
		}
		v.reason(fmt.Sprintf("checkpoint %s %s (%s) but is not committed: %v; healthy again once it or a checkpoint completed after it commits, or it is deleted",
			withheld.Checkpoint, what, withheld.At.UTC().Format(time.RFC3339), withheld.Err),
			"checkpoint "+withheld.Checkpoint+" not committed: "+withheldWhy(withheld.Err))
	}
	if split != nil {
		v.reason(fmt.Sprintf("%v; set store.world_nodes and store.node_rank on every node of a multi-node job (docs/multinode.md); healthy again once a checkpoint completed after it is found whole",
			split.Err), "checkpoint "+split.Checkpoint+" committed in pieces by several instances")
	}
	if pending != "" {
		v.warn("the configuration file changes "+pending+", which only a restart applies (systemctl restart spotguard); the running values stay until then",
			"restart to apply "+pending)
	}
	v.Healthy = len(v.Reasons) == 0
	return v
}

// withheldWhy says in a few words why a checkpoint was withheld (checkpoint.CheckpointWithheld).
func withheldWhy(err error) string {
	switch {
	case errors.Is(err, checkpoint.ErrNameNotStorable):
		return "its name cannot be stored"
	case errors.Is(err, checkpoint.ErrAgentDenied):
		return "the agent may not read it"
	case errors.Is(err, checkpoint.ErrWrittenAfterMarker):
		return "a file was written after its marker"
	case errors.Is(err, checkpoint.ErrNotStorable):
		return "a file cannot be stored"
	}
	return "part cannot be read"
}

// shortStoreError is the S3 error code, or the classified reason, of err: a word or two.
func shortStoreError(err error) string {
	if code := storeErrorCode(err); code != "" {
		return code
	}
	return StoreErrorReason(err)
}

// checkpointHealth says whether the checkpoint watch is as it should be (see
// checkpointWatch.health): false with the reason while the watcher keeps failing; true with a
// reason while it waits for a checkpoint.dir not created yet; true, "" otherwise, and when no
// store is configured.
func (a *Agent) checkpointHealth() (ok bool, reason string) {
	if a.ckptWatcher == nil {
		return true, ""
	}
	return a.ckptWatcher.health()
}

// withHealth puts the trouble, if any, in front of the STATUS line: "UNHEALTHY: store
// s3://b/p: list failed: NoSuchBucket; watching; ...", or "IMDS rebalance failing for 1m0s;
// watching; ..." for a warning alone.
func (a *Agent) withHealth(line string) string {
	v := a.health(time.Now())
	if len(v.short) == 0 {
		return line
	}
	trouble := strings.Join(v.short, "; ")
	if !v.Healthy {
		trouble = "UNHEALTHY: " + trouble
	}
	return trouble + "; " + line
}

// storeHealth is the agent's view of the store: the probe, and the failures the uploader reports.
type storeHealth struct {
	url, job string
	prober   *storeProber
	limiter  *logLimiter
	log      zerolog.Logger

	mu sync.Mutex
	// uploadErrors counts failed uploads and commits by reason.
	uploadErrors map[string]uint64
	// lastUploadError is the newest of them; nil if none.
	lastUploadError *uploadErrorStatus
	// failures counts the failures of each checkpoint not committed since.
	failures map[string]int
	// failing is, by checkpoint, its current run of failures: a store that refuses its writes
	// while the probe's tiny write passes (a full disk, a quota, a policy on some keys) must
	// make /healthz 503 too (uploadsFailing).
	failing map[string]failRun
}

// failRun is a run of failures of one checkpoint's uploads or commit: the first and the last.
// A failure more than failRunGap after the last begins a new run.
type failRun struct {
	first, last time.Time
	reason, err string
}

// The health of a checkpoint's failing uploads: a run of failures longer than failingFor, the
// last one no older than failRunGap, makes the agent unhealthy. failRunGap is longer than one
// failure can take to be said: a read whose answer stalls is cut after 30 s and tried three
// times (found from outside: LATEST reads that kept stalling failed 90 s apart, each a run of its
// own, and /healthz stayed 200 for minutes).
const (
	failingFor = time.Minute
	failRunGap = 2 * time.Minute
)

// latestFailing is the key of storeHealth's failures and failing runs for LATEST that cannot be
// moved (no checkpoint's: checkpoint.ValidName refuses the name LATEST).
const latestFailing = "LATEST"

// uploadsFailing returns, as of now, the checkpoint whose uploads (or commit) have failed the
// longest without a pause, when that is more than failingFor; ok is false when none has. A run
// whose last failure came before recovered (the store's probe passing again after failing) is
// not one: nothing was tried since the store came back. (It was: /healthz went back to 503 for
// seconds after an outage ended, until the uploader's next retry; found from outside.)
func (s *storeHealth) uploadsFailing(now, recovered time.Time) (name string, run failRun, ok bool) {
	s.mu.Lock()
	defer s.mu.Unlock()
	for n, r := range s.failing {
		if now.Sub(r.last) > failRunGap || now.Sub(r.first) <= failingFor || !r.last.After(recovered) {
			continue
		}
		if !ok || r.first.Before(run.first) || r.first.Equal(run.first) && n < name {
			name, run, ok = n, r, true
		}
	}
	return name, run, ok
}

// uploadErrorStatus is a failed upload or commit, for /status.
type uploadErrorStatus struct {
	At         time.Time `json:"at"`
	Kind       string    `json:"kind"` // "upload" (a file), "commit" or "latest" (LATEST not moved to a commit)
	Checkpoint string    `json:"checkpoint"`
	Reason     string    `json:"reason"`
	Error      string    `json:"error"`
}

// initHealth sets up the store probe (when a store is configured) and the health metrics. The
// probe opens a store of its own, so it never waits behind the uploader's transfers.
func (a *Agent) initHealth(cfg *Config, deps Deps) error {
	a.metrics.health.verdict = a.health
	if cfg.Store.URL == "" || deps.OpenStore == nil {
		return nil
	}
	store, err := deps.OpenStore(cfg.Store.URL, cfg.S3Options())
	if err != nil {
		return fmt.Errorf("store.url: %w", err)
	}
	hostname, _ := os.Hostname()
	host := func() string {
		a.mu.Lock()
		defer a.mu.Unlock()
		if a.identity.InstanceID != "" {
			return a.identity.InstanceID
		}
		return hostname
	}
	s := &storeHealth{
		url: store.URL(), job: cfg.Store.Job,
		prober:       newStoreProber(store, cfg.Store.Job, host, deps.Logger),
		limiter:      newLogLimiter(time.Minute),
		log:          deps.Logger.With().Str("component", "store").Logger(),
		uploadErrors: map[string]uint64{},
		failures:     map[string]int{},
		failing:      map[string]failRun{},
	}
	s.prober.onProbe = func(p StoreProbe) {
		if !p.OK() {
			a.metrics.storeProbeFailures.Inc()
		}
	}
	a.store = s
	a.metrics.health.store = s.prober.state
	return nil
}

// runStoreProbe probes the store until ctx is done (at once when no store is configured). It
// returns nil: store trouble never stops the agent.
func (a *Agent) runStoreProbe(ctx context.Context) error {
	if a.store == nil {
		return nil
	}
	return a.store.prober.Run(ctx)
}

// noteStoreAttempt hears of every failed attempt of the uploader's store requests, the SDK's
// retries included. A request the store does not answer, or a connection that breaks, has the
// store probed soon: the SDK retries such a request for minutes before the uploader hears of it,
// and a store that went dark must be a /healthz 503 within a probe's time, not after. It is
// logged at most once a minute.
func (a *Agent) noteStoreAttempt(err error) {
	s := a.store
	if s == nil || StoreErrorReason(err) != StoreNetwork {
		return // an answer (not found, denied, a throttle) is the caller's to judge
	}
	if ok, held := s.limiter.allow("attempt|"+StoreNetwork, time.Now()); ok {
		s.log.Warn().Str("store", s.url).Str("reason", StoreNetwork).Err(err).Int("repeats_not_logged", held).
			Msg("a store request failed; retrying it, and probing the store")
	}
	s.prober.Kick()
}

// noteUploadHealth counts the uploader's failures by reason, logs a run of identical ones once a
// minute with a count, and has the store probed soon after a failure (and after a commit while
// the probe is failing, so a store that works again turns healthy soon).
func (a *Agent) noteUploadHealth(ev checkpoint.UploadEvent) {
	s := a.store
	if s == nil {
		return
	}
	switch ev.Kind {
	case checkpoint.UploadFailed, checkpoint.CheckpointFailed, checkpoint.LatestFailed:
		if ev.Err == nil || errors.Is(ev.Err, context.Canceled) {
			return
		}
		kind, key := "upload", ev.Checkpoint
		switch ev.Kind {
		case checkpoint.CheckpointFailed:
			kind = "commit"
		case checkpoint.LatestFailed:
			// The checkpoint is committed; LATEST is what fails, for whichever commit.
			kind, key = "latest", latestFailing
		}
		reason := StoreErrorReason(ev.Err)
		a.metrics.uploadErrors.WithLabelValues(reason).Inc()
		at := ev.At
		if at.IsZero() {
			at = time.Now()
		}
		s.mu.Lock()
		s.uploadErrors[reason]++
		s.lastUploadError = &uploadErrorStatus{At: at, Kind: kind, Checkpoint: ev.Checkpoint, Reason: reason, Error: ev.Err.Error()}
		s.failures[key]++
		n := s.failures[key]
		r := s.failing[key]
		if r.last.IsZero() || at.Sub(r.last) > failRunGap {
			r.first = at
		}
		r.last, r.reason, r.err = at, reason, ev.Err.Error()
		s.failing[key] = r
		s.mu.Unlock()
		if ok, held := s.limiter.allow(key+"|"+kind+"|"+reason+"|"+storeErrorCode(ev.Err), time.Now()); ok {
			s.log.Warn().Str("store", s.url).Str("checkpoint", ev.Checkpoint).Str("failed", kind).Str("reason", reason).
				Err(ev.Err).Int("failures", n).Int("repeats_not_logged", held).Str("fix", StoreFix(reason, s.url, ev.Err)).
				Msg("checkpoint upload failing; retrying")
		}
		s.prober.Kick()
	case checkpoint.CheckpointCommitted:
		held := s.limiter.forget(ev.Checkpoint + "|")
		s.mu.Lock()
		n := s.failures[ev.Checkpoint]
		delete(s.failures, ev.Checkpoint)
		delete(s.failing, ev.Checkpoint)
		s.mu.Unlock()
		if n > 0 {
			s.log.Info().Str("checkpoint", ev.Checkpoint).Int("failures", n).Int("repeats_not_logged", held).
				Msg("checkpoint committed after upload failures")
		}
		if ps := s.prober.state(); ps.Probes > 0 && !ps.Last.OK() {
			s.prober.Kick()
		}
	case checkpoint.LatestMoved:
		s.limiter.forget(latestFailing + "|")
		s.mu.Lock()
		delete(s.failures, latestFailing)
		delete(s.failing, latestFailing)
		s.mu.Unlock()
	case checkpoint.CheckpointDeleted:
		// Never committed now: its failures are not counted on for a later one of the name.
		s.limiter.forget(ev.Checkpoint + "|")
		s.mu.Lock()
		delete(s.failures, ev.Checkpoint)
		delete(s.failing, ev.Checkpoint)
		s.mu.Unlock()
	}
}

// storeStatus is the "store" section of /status.
type storeStatus struct {
	URL string `json:"url"`
	Job string `json:"job"`
	// OK is true when the last probe passed; false before the first one ends (LastProbe null).
	OK           bool       `json:"ok"`
	LastProbe    *time.Time `json:"last_probe"`
	LastOK       *time.Time `json:"last_ok"`
	FailingSince *time.Time `json:"failing_since"`
	// FailedStep, Reason, Error and Fix describe the last probe when it failed.
	FailedStep    string `json:"failed_step,omitempty"`
	Reason        string `json:"reason,omitempty"`
	Error         string `json:"error,omitempty"`
	Fix           string `json:"fix,omitempty"`
	Probes        uint64 `json:"probes"`
	ProbeFailures uint64 `json:"probe_failures"`
	// UploadErrors counts the uploader's failed uploads and commits by reason.
	UploadErrors    map[string]uint64  `json:"upload_errors"`
	LastUploadError *uploadErrorStatus `json:"last_upload_error,omitempty"`
	// Concurrency says how the S3 store's requests in flight have adapted; absent for file://.
	Concurrency *checkpoint.LimiterStats `json:"concurrency,omitempty"`
}

// storeStatus is nil without a store.
func (a *Agent) storeStatus() *storeStatus {
	s := a.store
	if s == nil {
		return nil
	}
	ps := s.prober.state()
	out := &storeStatus{
		URL: s.url, Job: s.job, Probes: ps.Probes, ProbeFailures: ps.Failures,
		LastOK: timePtr(ps.LastOK), FailingSince: timePtr(ps.FailingSince), UploadErrors: map[string]uint64{},
	}
	if ps.Probes > 0 {
		out.LastProbe = timePtr(ps.Last.At)
		out.OK = ps.Last.OK()
		if !out.OK {
			out.FailedStep, out.Reason, out.Error = ps.Last.Step, ps.Last.Reason, ps.Last.Err.Error()
			out.Fix = StoreFix(ps.Last.Reason, ps.Last.URL, ps.Last.Err)
		}
	}
	if c := a.metrics.health.concurrency; c != nil {
		st := c()
		out.Concurrency = &st
	}
	s.mu.Lock()
	maps.Copy(out.UploadErrors, s.uploadErrors)
	if e := s.lastUploadError; e != nil {
		cp := *e
		out.LastUploadError = &cp
	}
	s.mu.Unlock()
	return out
}

// markerWait is how long after the last of a checkpoint's files, all of them stored, /healthz
// waits for its marker before it says the marker has not come. A variable for tests.
var markerWait = 10 * time.Minute

// markerless says, for /healthz, the checkpoints whose files were all written and stored more
// than markerWait ago and whose marker never came: not committed, and nothing else says so but
// one log line (found from outside: DCP's .metadata while the agent waits for _COMPLETE, or
// checkpoint.dir one level too high, uploaded everything and committed nothing, /healthz 200).
// "" when there are none, or the uploader does not answer at once.
func (a *Agent) markerless(now time.Time) string {
	ctx, cancel := context.WithTimeout(context.Background(), 100*time.Millisecond)
	defer cancel()
	var names []string
	var oldest time.Time
	for _, c := range a.uploader.Status(ctx).Checkpoints {
		if c.Complete || c.Committed || c.Withheld || c.Files == 0 || c.FilesStored < c.Files || c.LastFileAt == nil || now.Sub(*c.LastFileAt) < markerWait {
			continue
		}
		names = append(names, c.Name)
		if oldest.IsZero() || c.LastFileAt.Before(oldest) {
			oldest = *c.LastFileAt
		}
	}
	if len(names) == 0 {
		return ""
	}
	shown := names[:min(len(names), 3)]
	more := ""
	if len(names) > len(shown) {
		more = fmt.Sprintf(" and %d more", len(names)-len(shown))
	}
	cfg := a.cfg.Load()
	return fmt.Sprintf("checkpoint %s%s: every file written (the last %s ago) and stored, and no marker %s: not committed. "+
		"If the trainer's marker is another file (DCP's .metadata), set checkpoint.marker; if checkpoint.dir %s holds directories of checkpoints, set it to the one that holds them; a save that died half way can be deleted",
		strings.Join(shown, ", "), more, now.Sub(oldest).Round(time.Second), cfg.Checkpoint.Marker, cfg.Checkpoint.Dir)
}

// RuntimeDirFix says how to make agent.runtime_dir dir writable, for err, why it is not. (Found
// from outside: a read-only one, the unit's sandbox, was told to free space or fix permissions.)
func RuntimeDirFix(dir string, err error) string {
	switch {
	case errors.Is(err, syscall.EROFS):
		return "it is on a read-only file system: under systemd, the unit's sandbox (ProtectSystem=strict) lets the agent write only in /run/spotguard and where ReadWritePaths= says: add " +
			dir + " there (sudo systemctl edit spotguard), or leave agent.runtime_dir at /run/spotguard"
	case errors.Is(err, syscall.ENOSPC), errors.Is(err, syscall.EDQUOT):
		return "free space there, or set agent.runtime_dir"
	}
	return "fix its owner or permissions (the agent's user must write it), or set agent.runtime_dir"
}
