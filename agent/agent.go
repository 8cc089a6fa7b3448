// Package agent is the spotguard daemon: its configuration, the coordinator that turns
// interruption notices (from IMDS, and from the job: POST /notice) into trainer signals, the
// agent's own signal handling and its local /healthz, /status, /metrics and /notice listener.
package agent

import (
	"context"
	"errors"
	"fmt"
	"net"
	"net/http"
	"os"
	"sync"
	"sync/atomic"
	"syscall"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/rs/zerolog"
	"golang.org/x/sync/errgroup"

	"github.com/spotguard/spotguard/agent/imds"
	"github.com/spotguard/spotguard/agent/metrics"
	"github.com/spotguard/spotguard/agent/trainer"
	"github.com/spotguard/spotguard/checkpoint"
	"github.com/spotguard/spotguard/systemd"
)

// Deps are the agent's connections to the world, passed in so tests can supply their own.
type Deps struct {
	Logger zerolog.Logger
	// Version is the agent's version ("spotguard 1.2.0"), for /status; "" leaves it out.
	Version string
	// IMDS is the metadata service client (one, long-lived).
	IMDS imds.Getter
	// Reload loads the configuration again, for SIGHUP. Nil disables reloading.
	Reload func() (*Config, error)
	// SetLogLevel changes the level of Logger, for a reload that changes log.level; nil means
	// log.level needs a restart.
	SetLogLevel func(zerolog.Level)
	// Signals delivers the agent's own signals: SIGHUP (reload) and SIGUSR1 (sync now). May be nil.
	Signals <-chan os.Signal
	// Ready, if not nil, is called once the listener is up, the IMDS watcher runs and the
	// checkpoint watch is in place.
	Ready func(addr net.Addr)
	// Notify sends sd_notify messages (READY, STATUS, WATCHDOG, STOPPING); nil or a no-op
	// Notifier outside systemd.
	Notify *systemd.Notifier
	// UnderUnit says the agent runs under systemd (INVOCATION_ID is set): /healthz then also
	// warns of what goes wrong only under the shipped units (Config.UnitWarnings).
	UnderUnit bool
	// WatchdogInterval is how often to ping systemd's watchdog (half WATCHDOG_USEC); 0: never.
	WatchdogInterval time.Duration
	// ProcRoot and CgroupRoot default to /proc and /sys/fs/cgroup.
	ProcRoot, CgroupRoot string
	// TrainerTree, if not 0, confines the trainer to this process and its descendants: they are
	// all found, and nothing outside that tree is ever signalled, whatever the configuration
	// finds (spotguard drill, for the trainer it started).
	TrainerTree int
	// OpenStore opens the checkpoint store named by store.url. Needed only when it is set.
	OpenStore func(url string, opts checkpoint.S3Options) (checkpoint.Store, error)
	// OpenGPUs opens NVML; nil or an error means GPU sampling is off (said once, with the
	// reason). The agent closes what it opened when Run returns.
	OpenGPUs func(log zerolog.Logger) (GPUs, error)
	// CloudWatch is the CloudWatch client; nil means no CloudWatch (metrics.cloudwatch false).
	CloudWatch metrics.PutMetricDataAPI
	// NewCheckpointWatcher makes the checkpoint watcher; nil means checkpoint.NewWatcher.
	NewCheckpointWatcher func(checkpoint.WatchConfig) (CheckpointWatcher, error)
}

// GPUs is what the agent needs from NVML (nvml.GPUs).
type GPUs interface {
	gpuSampler
	Close()
}

// Agent is the running daemon.
type Agent struct {
	log      zerolog.Logger
	deps     Deps
	cfg      atomic.Pointer[Config]
	registry *prometheus.Registry
	watcher  *imds.Watcher
	coord    *Coordinator
	metrics  *promMetrics
	started  time.Time
	// ckptWatcher and uploader are nil when no store is configured.
	ckptWatcher *checkpointWatch
	uploader    *checkpoint.Uploader
	gpu         *gpuMonitor
	cw          *metrics.CloudWatch // nil when CloudWatch is off
	store       *storeHealth        // the store probe (health.go); nil when no store is configured
	// watchReady is closed when the checkpoint watch is in place.
	watchReady chan struct{}
	// newestCommit (Unix nanoseconds) and forecast (nanoseconds) are the last commit's, for the
	// periodic CloudWatch series; 0 until a checkpoint is committed.
	newestCommit, forecast atomic.Int64
	// runtimeDirProblem is why agent.runtime_dir could not be written at its last probe
	// (probeRuntimeDir), nil when it could.
	runtimeDirProblem atomic.Pointer[error]
	// runLock is agent.runtime_dir's lock, held while Run runs (nil without one); runLockProblem
	// is why it is not held now: another agent took it after its file was removed (checkRunLock).
	runLock        *runLock
	runLockProblem atomic.Pointer[error]
	// listenProblem is why http.listen could not be bound (tried again every listenRetry), nil
	// once it is, or when it was at start.
	listenProblem atomic.Pointer[error]

	mu         sync.Mutex
	identity   imds.Identity
	newestName string // the newest checkpoint this agent committed
	// newestOrder is newestName's commit's place in the order of commits.
	newestOrder checkpoint.CommitOrder
	// jobProblem is the last multi-node job checkpoint that could not be committed, until one
	// commits after it: /healthz is 503 meanwhile.
	jobProblem *checkpoint.UploadEvent
	// newestJobAt is the completion of the newest job checkpoint committed (multi-node).
	newestJobAt time.Time
	// withheld is the newest checkpoint whose marker is there but which cannot be committed
	// (CheckpointWithheld: a file of it cannot be stored, or part of it cannot be read), until
	// it or a checkpoint completed after it commits: /healthz is 503 meanwhile.
	withheld *checkpoint.UploadEvent
	// split is the newest commit of this agent's found to be one piece of a save committed in
	// pieces (CheckpointSplit), until a commit completed after it is found whole
	// (CheckpointWhole): /healthz is 503 meanwhile.
	split *checkpoint.UploadEvent
	// needRestart are the keys the last reload could not apply (their running values stay);
	// reloadedAt is when it was.
	needRestart []string
	reloadedAt  time.Time
	// reloadRefused says why the last reload was refused, until one succeeds.
	reloadRefused string
}

// New builds an agent from a valid configuration. It returns an error naming every problem if cfg
// does not validate.
func New(cfg *Config, deps Deps) (*Agent, error) {
	if err := cfg.Validate(); err != nil {
		return nil, fmt.Errorf("invalid config:\n%w", err)
	}
	if deps.ProcRoot == "" {
		deps.ProcRoot = "/proc"
	}
	if deps.CgroupRoot == "" {
		deps.CgroupRoot = "/sys/fs/cgroup"
	}
	a := &Agent{log: deps.Logger, deps: deps, registry: prometheus.NewRegistry(), started: time.Now(), watchReady: make(chan struct{})}
	a.cfg.Store(cfg)
	a.watcher = imds.NewWatcher(deps.IMDS, imds.Config{
		Sources:          enabledSources(cfg),
		PollInterval:     cfg.IMDS.PollInterval,
		SpotPollInterval: cfg.IMDS.SpotPollInterval,
		Logger:           deps.Logger,
	})
	a.metrics = newMetrics(a.registry, a.watcher.Stats)
	a.coord = newCoordinator(deps.Logger, a.metrics, a.cfg.Load,
		procTrainers{procRoot: deps.ProcRoot, cgroupRoot: deps.CgroupRoot, self: os.Getpid(), under: deps.TrainerTree})
	var err error
	if a.ckptWatcher, a.uploader, err = newUploader(cfg, deps, a); err != nil {
		return nil, err
	}
	if a.uploader != nil {
		a.metrics.health.uploads = a.uploadsStatus
	}
	if deps.CloudWatch != nil {
		a.cw = metrics.NewCloudWatch(deps.CloudWatch, metrics.CloudWatchConfig{
			Namespace: cfg.Metrics.Namespace, Interval: cfg.Metrics.CloudWatchInterval, Logger: deps.Logger,
			Base: a.baseDimensions, Aggregate: cfg.AggregateDimensions(),
		})
		a.coord.sink = a.cw
	}
	a.gpu = &gpuMonitor{interval: cfg.GPU.SampleInterval, threshold: cfg.GPU.DegradedThreshold, perGPU: cfg.Metrics.CloudWatchPerGPU,
		log: deps.Logger.With().Str("component", "gpu").Logger()}
	if a.cw != nil {
		a.gpu.sink = a.cw
	}
	a.gpu.off = "no NVML in this build"
	if deps.OpenGPUs != nil {
		// Beside the agent: a hung GPU or driver can block nvmlInit for good, and nothing else
		// waits for it.
		a.gpu.open(func() (GPUs, error) { return deps.OpenGPUs(deps.Logger) }, gpuOpenWait)
	}
	a.registry.MustRegister(newGPUCollector(a.gpu))
	if err := a.initHealth(cfg, deps); err != nil {
		return nil, err
	}
	return a, nil
}

// enabledSources lists the sources to poll: every one whose policy is not off. Ignored ones are
// still polled, so their notices show in /status and the metrics, and a reload can switch them
// between ignore and checkpoint.
func enabledSources(cfg *Config) []imds.Source {
	var out []imds.Source
	for _, src := range imds.Sources {
		if cfg.Notices[src] != PolicyOff {
			out = append(out, src)
		}
	}
	return out
}

// lifecycle tells systemd (and deps.Ready) how the agent is doing: READY=1 once the listener
// is up, the IMDS watcher runs and the checkpoint watch is in place; a STATUS= line and a
// WATCHDOG=1 ping every heartbeat while the coordinator's loop goes round; STOPPING=1 when ctx
// ends, with pings going on while a notice's upload is finished. It returns when stopped is
// closed.
func (a *Agent) lifecycle(ctx context.Context, ln net.Listener, stopped <-chan struct{}) {
	if a.uploader == nil {
		close(a.watchReady)
	}
	select {
	case <-a.watchReady:
		var addr net.Addr
		if ln != nil {
			addr = ln.Addr()
		}
		if a.deps.Ready != nil {
			a.deps.Ready(addr)
		}
		a.notifyErr(a.deps.Notify.Ready(a.statusLine(ctx)))
	case <-ctx.Done():
	case <-stopped:
		return
	}
	every := 5 * time.Second
	if w := a.deps.WatchdogInterval; w > 0 && w < every {
		every = w
	}
	t := time.NewTicker(every)
	defer t.Stop()
	done := ctx.Done()
	probed := time.Now()
	for {
		select {
		case <-done:
			done = nil
			a.notifyErr(a.deps.Notify.Stopping("stopping; " + a.statusLine(context.Background())))
			continue
		case <-stopped:
			return
		case <-t.C:
		}
		if time.Since(probed) >= runtimeDirProbeEvery {
			probed = time.Now()
			a.probeRuntimeDir()
		}
		a.checkRunLock()
		// While running, ping only if the notice path's loop is alive; while stopping, the
		// loop is gone and the ping says the drain of a notice's upload goes on.
		if done == nil || a.coord.aliveWithin(2*every) {
			if a.deps.WatchdogInterval > 0 {
				a.notifyErr(a.deps.Notify.Watchdog())
			}
		} else {
			a.log.Error().Msg("the coordinator's loop is stuck; not pinging the watchdog")
		}
		a.notifyErr(a.deps.Notify.Status(a.statusLine(context.Background())))
	}
}

// runtimeDirProbeEvery is how often a running agent checks that agent.runtime_dir can still be
// written: a tmpfs filled by something else leaves notice.json unwritten at the next notice.
const runtimeDirProbeEvery = time.Minute

// probeRuntimeDir writes a probe into agent.runtime_dir (checkWritable) and records the outcome
// for /healthz, saying in the log when it changes.
func (a *Agent) probeRuntimeDir() {
	dir := a.cfg.Load().Agent.RuntimeDir
	err := checkWritable(dir)
	was := a.runtimeDirProblem.Load()
	switch {
	case err != nil && was == nil:
		a.log.Error().Err(err).Str("dir", dir).Msg("runtime dir cannot be written; notice.json would be missing at a notice")
	case err == nil && was != nil:
		a.log.Info().Str("dir", dir).Msg("runtime dir can be written again")
	}
	if err != nil {
		a.runtimeDirProblem.Store(&err)
	} else {
		a.runtimeDirProblem.Store(nil)
	}
}

// checkRunLock makes sure the agent still holds agent.runtime_dir's lock (runLock.check): taken
// again, with a warning, when the file went; another agent holding it then is an error, and a
// /healthz reason until this agent holds it again.
func (a *Agent) checkRunLock() {
	if a.runLock == nil {
		return
	}
	retaken, err := a.runLock.check()
	was := a.runLockProblem.Load()
	switch {
	case retaken:
		a.log.Warn().Str("lock", a.runLock.path).Msg("agent.runtime_dir's lock file was removed under the agent (the directory deleted?); taken again, so that a second agent there is refused")
	case errors.Is(err, errRuntimeDirInUse) && was == nil:
		a.log.Error().Err(err).Msg("agent.runtime_dir's lock file was removed under the agent, and another agent took it: both write notice.json and a journal there; stop one of them")
	}
	if errors.Is(err, errRuntimeDirInUse) {
		a.runLockProblem.Store(&err)
	} else {
		a.runLockProblem.Store(nil)
	}
}

func (a *Agent) notifyErr(err error) {
	if err != nil {
		a.log.Debug().Err(err).Msg("sd_notify failed")
	}
}

// statusLine is the one line systemctl status shows: what the agent is doing, after any trouble
// (health.go).
func (a *Agent) statusLine(ctx context.Context) (out string) {
	defer func() { out = a.withHealth(out) }()
	cs := a.coord.status()
	var uploads *checkpoint.UploaderStatus
	if a.uploader != nil {
		sctx, cancel := context.WithTimeout(ctx, 200*time.Millisecond)
		us := a.uploader.Status(sctx)
		cancel()
		uploads = &us
	}
	for i := len(cs.Notices) - 1; i >= 0; i-- {
		n := cs.Notices[i]
		if !n.Active || n.Policy != PolicyCheckpoint {
			continue
		}
		line := "notice " + n.Key + ": " + n.State
		if n.State == StateCommitted {
			// Still in force (a reclaim on its way, a scheduled event not over): say so.
			line = "notice " + n.Key + " in force: checkpoint " + n.written + " committed"
		} else if uploads != nil && uploads.Urgent {
			var total, stored int64
			for _, c := range uploads.Checkpoints {
				if !c.Committed {
					total += c.Bytes
					stored += c.BytesStored
				}
			}
			if total > 0 {
				line = fmt.Sprintf("notice %s: uploading %d %%", n.Key, stored*100/total)
			}
		}
		if n.Deadline != nil {
			if left := time.Until(*n.Deadline); left >= 0 {
				line += fmt.Sprintf(" (deadline in %.0f s)", left.Seconds())
			} else {
				line += fmt.Sprintf(" (deadline passed %.0f s ago)", -left.Seconds())
			}
		}
		return line
	}
	line := "watching"
	if a.uploader == nil {
		line += " (no store: signal only)"
	} else if c := a.newestCommit.Load(); c != 0 {
		a.mu.Lock()
		name := a.newestName
		a.mu.Unlock()
		line += "; last durable checkpoint " + name + " " + time.Since(time.Unix(0, c)).Round(time.Second).String() + " ago"
	} else {
		line += "; no checkpoint committed by this agent yet"
	}
	switch {
	case len(cs.Trainers) > 0:
	case a.coord.hasScanned():
		line += "; no trainer found"
	default:
		line += "; looking for the trainer" // READY can come before the first look
	}
	return line
}

// agentSeriesInterval is how often the agent's own state is sampled for CloudWatch (sent as
// statistic sets every metrics.cloudwatch_interval).
const agentSeriesInterval = 15 * time.Second

// recordAgentSeries samples the agent's state into CloudWatch until ctx is done.
func (a *Agent) recordAgentSeries(ctx context.Context) {
	t := time.NewTicker(agentSeriesInterval)
	defer t.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case <-t.C:
		}
		a.cw.Record(a.agentDatums(time.Now())...)
	}
}

// agentDatums are the agent's own series, all in the default set (marked Aggregate):
// IMDSUp (IMDS answered within 30 s, the rule of /healthz; an agent that stopped sending shows as
// missing data), TrainerProcesses and TrainerSignalUncaught (a notice would signal nobody, or
// not every rank), once a checkpoint is committed (or found in the store at start)
// NewestCheckpointAgeSeconds, and once this agent has committed one DurableForecastSeconds
// (would the next notice's checkpoint make it?). The IMDS error count is
// left to Prometheus and /status: it moves with every transient timeout, and what a notice
// needs is whether IMDS answers.
func (a *Agent) agentDatums(now time.Time) []metrics.Datum {
	st := a.watcher.Stats()
	cs := a.coord.status()
	uncaught := 0
	for _, tr := range cs.Trainers {
		if !tr.CatchesSignal {
			uncaught++
		}
	}
	ds := []metrics.Datum{
		{Name: "IMDSUp", Unit: metrics.UnitCount, Value: b2f(imdsUp(st, now)), At: now, Aggregate: true},
		{Name: "TrainerProcesses", Unit: metrics.UnitCount, Value: float64(len(cs.Trainers)), At: now, Aggregate: true},
		{Name: "TrainerSignalUncaught", Unit: metrics.UnitCount, Value: float64(uncaught), At: now, Aggregate: true},
	}
	if c := a.newestCommit.Load(); c != 0 {
		ds = append(ds, metrics.Datum{Name: "NewestCheckpointAgeSeconds", Unit: metrics.UnitSeconds, Value: now.Sub(time.Unix(0, c)).Seconds(), At: now, Aggregate: true})
	}
	if f := a.forecast.Load(); f != 0 {
		// Made by this agent's own commits: a commit found in the store at start has none.
		ds = append(ds, metrics.Datum{Name: "DurableForecastSeconds", Unit: metrics.UnitSeconds, Value: time.Duration(f).Seconds(), At: now, Aggregate: true})
	}
	return ds
}

// identityQuickRead bounds baseDimensions' own read of the instance's identity.
const identityQuickRead = 500 * time.Millisecond

// baseDimensions are every CloudWatch datum's dimensions: the instance, once known. Before the
// identity's own fetch has it, each flush tries one quick read: IMDS that failed since the start
// answers a notice's first read as it comes back, seconds before that fetch's backoff ends, and
// the notice's datums went without their instance, missed by the alarms per instance and per
// instance type (found from outside).
func (a *Agent) baseDimensions() map[string]string {
	a.mu.Lock()
	id := a.identity
	a.mu.Unlock()
	if id.InstanceID == "" && a.deps.IMDS != nil {
		ctx, cancel := context.WithTimeout(context.Background(), identityQuickRead)
		got, err := imds.ReadIdentity(ctx, a.deps.IMDS)
		cancel()
		if err == nil {
			a.mu.Lock()
			if a.identity.InstanceID == "" {
				a.identity = got
			}
			id = a.identity
			a.mu.Unlock()
		}
	}
	return map[string]string{"InstanceId": id.InstanceID, "InstanceType": id.InstanceType}
}

// Config returns the configuration in force.
func (a *Agent) Config() *Config { return a.cfg.Load() }

// Run runs the agent until ctx is done: the IMDS watcher, the coordinator, the identity lookup,
// the agent's own signals and the HTTP listener. It returns after all of them have stopped; the
// error is non-nil only if another agent holds agent.runtime_dir (lockRuntimeDir) or watches
// checkpoint.dir (checkpoint.LockDir), another user may write agent.runtime_dir
// (CheckRuntimeDirOwner), or the listener failed once serving (one that cannot be bound is tried
// again, and the agent runs on meanwhile).
func (a *Agent) Run(ctx context.Context) error {
	cfg := a.cfg.Load()
	_ = os.MkdirAll(cfg.Agent.RuntimeDir, 0o755) // a failure is said below
	if fi, err := os.Stat(cfg.Agent.RuntimeDir); err == nil {
		if err := CheckRuntimeDirOwner(cfg.Agent.RuntimeDir, fi, os.Geteuid()); err != nil {
			return err
		}
	}
	switch lock, err := lockRuntimeDir(cfg.Agent.RuntimeDir); {
	case errors.Is(err, errRuntimeDirInUse):
		return err
	case err != nil:
		a.log.Warn().Err(err).Msg("agent.runtime_dir cannot be locked: a second agent started on it would not be refused")
	default:
		a.runLock = lock // lifecycle checks it
		defer lock.release()
	}
	if a.uploader != nil {
		// Another agent uploading checkpoint.dir: refused, as on agent.runtime_dir. (One made
		// after the start is locked by the watcher, which says so while another holds it.)
		if release, err := checkpoint.LockDir(cfg.Checkpoint.Dir); errors.Is(err, checkpoint.ErrDirInUse) {
			return dirInUse(err)
		} else if err == nil {
			release() // the watcher takes it
		}
	}
	// A listener that cannot be bound (another program on the port) is trouble to say, not a
	// reason to leave the instance without its notice path and uploads: the agent runs on
	// without it, and binds it once it can.
	var ln net.Listener
	if cfg.HTTP.Listen != "" {
		var err error
		ln, err = (&net.ListenConfig{}).Listen(ctx, "tcp", cfg.HTTP.Listen)
		if err != nil {
			a.listenProblem.Store(&err)
			a.log.Error().Err(err).Str("listen", cfg.HTTP.Listen).Float64("retry_every_s", listenRetry.Seconds()).
				Msg("http.listen cannot be bound: /healthz, /status, /metrics and POST /notice are not served until it can (tried again); the notice path and uploads run; free the port or set http.listen")
		}
	}
	// What an earlier run signalled the trainer for (its notice.json): not signalled again; and
	// the job notices it held, in force until they end.
	var carried []noticeEntry
	a.coord.previous, a.coord.previousSeen, a.coord.previousJobs, carried = readPrevious(cfg.Agent.RuntimeDir, a.log)
	a.coord.carried = carried
	a.coord.sourceRead = func(src imds.Source) (polled, read bool) {
		st, polled := a.watcher.Stats().Sources[src]
		return polled, !st.LastSuccess.IsZero()
	}
	if err := os.MkdirAll(cfg.Agent.RuntimeDir, 0o755); err != nil {
		a.log.Error().Err(err).Str("dir", cfg.Agent.RuntimeDir).Msg("cannot create runtime dir; notice.json will be missing")
		a.coord.setNoticeFileProblem(err)
	} else if len(carried) > 0 || len(a.coord.previousJobs) > 0 {
		// A notice.json an earlier run left naming notices stays as it is, never missing: the
		// coordinator writes it again as it starts, with the job notices it takes back (those not
		// ended) and the IMDS ones until it has read their sources (Coordinator.settleCarried).
		a.probeRuntimeDir()
	} else if err := writeNoticeFile(cfg.Agent.RuntimeDir, nil, nil); err != nil {
		// None in force: a notice.json an earlier run left with nothing it can take back (one
		// it cannot read) is removed.
		a.log.Error().Err(err).Msg("cannot remove the notice file an earlier run left")
		a.coord.setNoticeFileProblem(err)
	} else {
		a.probeRuntimeDir()
	}
	file := cfg.File()
	if file == "" {
		file = "(none: " + DefaultConfigPath + " does not exist)"
	}
	a.log.Info().Str("config", file).Float64("poll_interval_s", logSeconds(cfg.IMDS.PollInterval)).Str("listen", cfg.HTTP.Listen).
		Str("signal", trainer.SignalName(cfg.Trainer.Signal)).Msg("spotguard agent starting")

	g, ctx := errgroup.WithContext(ctx)
	g.Go(func() error { return a.gpu.Run(ctx) })
	if a.cw != nil {
		// CloudWatch outlives ctx by its final flush: the story of a notice must reach it.
		g.Go(func() error { return a.cw.Run(ctx) })
		g.Go(func() error { a.recordAgentSeries(ctx); return nil })
	}
	// drained is done when a stop has nothing more to wait for: at once without an uploader,
	// else when the uploader's drain is over. The listener serves until then (/status shows the
	// drain, POST /notice answers 503).
	drained := ctx.Done()
	// The coordinator ends first at a stop: it signals the trainer for a notice it held back
	// (holdForReclaim) as it ends, and the uploader's stop, which decides whether to wait for
	// the checkpoint the trainer was signalled for, must see that signal.
	coordDone := make(chan struct{})
	if a.uploader != nil {
		a.coord.uploader = a.uploader
		files := make(chan checkpoint.WatchEvent)
		// The watcher keeps running while the uploader drains after a stop: the checkpoint the
		// trainer was signalled for may complete after SIGTERM.
		watchCtx, stopWatch := context.WithCancel(context.WithoutCancel(ctx))
		uploaded := make(chan struct{})
		drained = uploaded
		g.Go(func() error { return a.ckptWatcher.Run(watchCtx, files) })
		upCtx, stopUploads := context.WithCancel(context.WithoutCancel(ctx))
		g.Go(func() error {
			<-ctx.Done()
			select {
			case <-coordDone:
			case <-time.After(coordStopWait):
			}
			stopUploads()
			return nil
		})
		g.Go(func() error {
			defer close(uploaded)
			defer stopWatch()
			defer stopUploads()
			return a.uploader.Run(upCtx, files)
		})
		a.log.Info().Str("dir", cfg.Checkpoint.Dir).Str("store", cfg.Store.URL).Str("job", cfg.Store.Job).
			Msg("checkpoint upload on")
	} else {
		a.log.Warn().Msg("no store.url: checkpoints are not uploaded, the trainer is only signalled")
	}
	events := make(chan imds.Event)
	g.Go(func() error { return a.watcher.Run(ctx, events) })
	g.Go(func() error { defer close(coordDone); return a.coord.Run(ctx, events) })
	g.Go(func() error {
		id, err := imds.FetchIdentity(ctx, a.deps.IMDS, a.log)
		if err != nil {
			return nil // ctx done before IMDS answered
		}
		a.mu.Lock()
		a.identity = id
		a.mu.Unlock()
		a.log.Info().Str("instance_id", id.InstanceID).Str("instance_type", id.InstanceType).
			Str("availability_zone", id.AvailabilityZone).Msg("instance identity read")
		return nil
	})
	g.Go(func() error { a.handleSignals(ctx, drained); return nil })
	g.Go(func() error { return a.runStoreProbe(ctx) })
	if cfg.HTTP.Listen != "" {
		srv := &http.Server{Handler: a.Handler(), ReadHeaderTimeout: 5 * time.Second}
		g.Go(func() error {
			l := ln
			if l == nil {
				if l = a.listenAgain(ctx, cfg.HTTP.Listen); l == nil {
					return nil // stopped before it could
				}
			}
			if err := srv.Serve(l); err != nil && !errors.Is(err, http.ErrServerClosed) {
				return fmt.Errorf("http listener: %w", err)
			}
			return nil
		})
		g.Go(func() error {
			<-ctx.Done()
			<-drained
			shutdownCtx, cancel := context.WithTimeout(context.WithoutCancel(ctx), time.Second)
			defer cancel()
			return srv.Shutdown(shutdownCtx)
		})
		if ln != nil {
			a.log.Info().Str("addr", ln.Addr().String()).Msg("listening")
		}
	}
	stopped := make(chan struct{})
	var life sync.WaitGroup
	life.Go(func() { a.lifecycle(ctx, ln, stopped) })
	err := g.Wait()
	close(stopped)
	life.Wait()
	a.log.Info().Msg("spotguard agent stopped")
	return err
}

// listenRetry is how often an http.listen that could not be bound is tried again. A variable,
// so that a test can shorten it.
var listenRetry = 10 * time.Second

// listenAgain binds addr, trying every listenRetry until it can (then it says so and clears
// listenProblem) or ctx is done (nil).
func (a *Agent) listenAgain(ctx context.Context, addr string) net.Listener {
	t := time.NewTicker(listenRetry)
	defer t.Stop()
	for {
		select {
		case <-ctx.Done():
			return nil
		case <-t.C:
		}
		ln, err := (&net.ListenConfig{}).Listen(ctx, "tcp", addr)
		if err != nil {
			a.listenProblem.Store(&err)
			continue
		}
		a.listenProblem.Store(nil)
		a.log.Info().Str("addr", ln.Addr().String()).Msg("http.listen bound at last: listening")
		return ln
	}
}

// coordStopWait bounds how long a stop waits for the coordinator to end (it signals the notices
// it held back as it does) before the uploader's stop begins.
const coordStopWait = 5 * time.Second

// EndDrain ends the drain after a stop (the CLI calls it on a second SIGTERM or SIGINT): the
// agent stops without waiting for uncommitted checkpoints, and logs what it left.
func (a *Agent) EndDrain() {
	if a.uploader != nil {
		a.uploader.EndDrain()
	}
}

// handleSignals serves SIGHUP (reload) and SIGUSR1 (sync now) until ctx is done, then says of
// each that comes while the agent drains (until drained) that it is not acted on.
func (a *Agent) handleSignals(ctx context.Context, drained <-chan struct{}) {
	for {
		select {
		case <-ctx.Done():
			a.signalsWhileStopping(drained)
			return
		case sig, ok := <-a.deps.Signals:
			if !ok {
				<-ctx.Done()
				return
			}
			switch sig {
			case syscall.SIGHUP:
				a.reload()
			case syscall.SIGUSR1:
				a.metrics.syncRequests.Inc()
				a.sync(ctx)
			}
		}
	}
}

// signalsWhileStopping logs each SIGHUP and SIGUSR1 that comes after a stop, until drained: a
// reload or a sync during the drain would be silently dropped otherwise (found from outside).
func (a *Agent) signalsWhileStopping(drained <-chan struct{}) {
	for {
		select {
		case <-drained:
			return
		case sig, ok := <-a.deps.Signals:
			if !ok {
				return
			}
			switch sig {
			case syscall.SIGHUP:
				a.log.Warn().Msg("config reload (SIGHUP) not done: the agent is stopping, and its next start reads the configuration")
			case syscall.SIGUSR1:
				a.metrics.syncRequests.Inc()
				a.log.Info().Msg("sync requested (SIGUSR1) while the agent stops: the stop already waits for what it drains (docs/checkpoints.md)")
			}
		}
	}
}

// sync answers SIGUSR1: every complete checkpoint not yet in the store is uploaded now.
func (a *Agent) sync(ctx context.Context) {
	if a.uploader == nil {
		a.log.Warn().Msg("sync requested but no store.url is set; nothing to upload")
		return
	}
	a.uploader.Sync(ctx)
}

// splitJoined undoes errors.Join so each problem can be logged on its own line.
func splitJoined(err error) []error {
	if j, ok := err.(interface{ Unwrap() []error }); ok {
		var out []error
		for _, e := range j.Unwrap() {
			out = append(out, splitJoined(e)...)
		}
		return out
	}
	return []error{err}
}
