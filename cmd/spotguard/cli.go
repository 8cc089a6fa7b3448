package main

import (
	"context"
	"fmt"
	"io"
	"net"
	"os"
	"os/signal"
	"runtime/debug"
	"strings"
	"sync"
	"syscall"
	"time"

	"github.com/aws/aws-sdk-go-v2/aws"
	awsconfig "github.com/aws/aws-sdk-go-v2/config"
	"github.com/aws/aws-sdk-go-v2/service/cloudwatch"
	"github.com/rs/zerolog"

	"github.com/spotguard/spotguard/agent"
	"github.com/spotguard/spotguard/agent/imds"
	"github.com/spotguard/spotguard/agent/metrics"
	"github.com/spotguard/spotguard/checkpoint"
	"github.com/spotguard/spotguard/nvml"
	"github.com/spotguard/spotguard/systemd"
)

// version is set at build time with -ldflags "-X main.version=…".
var version = "dev"

// Exit codes.
const (
	exitOK    = 0
	exitFail  = 1
	exitUsage = 2
)

// command is one of spotguard's commands.
type command struct {
	name string
	// summary is its line in `spotguard -h` and in the README's CLI section.
	summary string
	run     func(ctx context.Context, args, environ []string, stdout, stderr io.Writer) int
}

// commands are spotguard's commands, in the order `spotguard -h` lists them.
func commands() []command {
	return []command{
		{"drill", "rehearse a reclaim on this machine: notice, signal, upload, commit, restore (PASS/FAIL)", runDrill},
		{"run", "run the agent: watch IMDS, signal the trainer on a notice, upload and commit checkpoints", runAgent},
		{"doctor", "check once everything the agent depends on: PASS/WARN/FAIL per check, with the fix",
			func(ctx context.Context, args, environ []string, stdout, stderr io.Writer) int {
				return runDoctor(ctx, args, environ, stdout, stderr, defaultDoctorDeps())
			}},
		{"restore", "download the newest committed checkpoint, verified, into --to DIR or checkpoint.dir", runRestore},
		{"list", "list the job's committed checkpoints, newest first", runList},
		{"notify", "hand the agent a notice the job learned from another node: urgent uploads, no signal", runNotify},
		{"gpu", "sample or --probe every GPU and judge it (exit 0 healthy, 3 degraded, 4 no NVML/CUDA)",
			func(ctx context.Context, args, environ []string, stdout, stderr io.Writer) int {
				return runGPU(ctx, args, environ, stdout, stderr, gpuDeps{open: openNVML})
			}},
		{"plan", "how often to checkpoint: Young and Daly intervals, expected losses and costs",
			func(_ context.Context, args, _ []string, stdout, stderr io.Writer) int {
				return runPlan(args, stdout, stderr)
			}},
		{"config", "print the effective configuration and every problem with it; -h lists every key", runConfig},
		{"version", "print the version (the same as spotguard --version)", runVersion},
	}
}

// printUsage writes `spotguard -h`: the commands, one line each.
func printUsage(w io.Writer, cmds []command) {
	fmt.Fprint(w, "spotguard keeps GPU training alive on EC2 Spot.\n\nUsage: spotguard <command> [flags]\n\nCommands:\n")
	for _, c := range cmds {
		fmt.Fprintf(w, "  %-10s%s\n", c.name, c.summary)
	}
	fmt.Fprint(w, `
Run 'spotguard <command> -h' for the flags of a command, 'spotguard config -h' for the
configuration keys: each is also a flag (--log.level debug) and an environment variable
(SPOTGUARD_LOG_LEVEL=debug).
`)
}

// commandNames is the one line that lists the commands after a mistake.
func commandNames(cmds []command) string {
	names := make([]string, len(cmds))
	for i, c := range cmds {
		names[i] = c.name
	}
	return "commands: " + strings.Join(names, ", ") + " (run 'spotguard -h' for what each does)"
}

// run is the whole program behind main: it returns the exit code.
func run(ctx context.Context, args, environ []string, stdout, stderr io.Writer) int {
	stderr = withJournalErrors(stderr, environ)
	cmds := commands()
	if len(args) == 0 {
		printUsage(stderr, cmds)
		return exitUsage
	}
	name, rest := args[0], args[1:]
	for _, c := range cmds {
		if c.name == name {
			return c.run(ctx, rest, environ, stdout, stderr)
		}
	}
	switch name {
	case drillTrainerCmd:
		return runDrillTrainer(ctx, rest, stderr)
	case "help", "-h", "-help", "--help":
		if name == "help" && len(rest) > 0 {
			// spotguard help CMD is spotguard CMD -h.
			if len(rest) > 1 {
				fmt.Fprintf(stderr, "spotguard help: unexpected argument %q\nrun 'spotguard -h' for the commands\n", rest[1])
				return exitUsage
			}
			return run(ctx, []string{rest[0], "-h"}, environ, stdout, stderr)
		}
		printUsage(stdout, cmds)
		return exitOK
	case "-version", "--version":
		return runVersion(ctx, rest, environ, stdout, stderr)
	}
	if strings.HasPrefix(name, "-") {
		fmt.Fprintf(stderr, "spotguard: %s before a command: flags go after the command (spotguard <command> %s ...)\n%s\n", name, name, commandNames(cmds))
		return exitUsage
	}
	fmt.Fprintf(stderr, "spotguard: unknown command %q\n%s\n", name, commandNames(cmds))
	return exitUsage
}

func runVersion(_ context.Context, args, _ []string, stdout, stderr io.Writer) int {
	fs := newPlainFlagSet("version", "Print the version of spotguard, as spotguard --version does.", stdout, stderr)
	fs.use = ""
	if code, ok := fs.parse(args); !ok {
		return code
	}
	fmt.Fprintln(stdout, versionString())
	return exitOK
}

func versionString() string {
	v := version
	if bi, ok := debug.ReadBuildInfo(); ok && v == "dev" && bi.Main.Version != "" && bi.Main.Version != "(devel)" {
		v = bi.Main.Version
	}
	return "spotguard " + v
}

// configFlags are the flags shared by every command that loads the configuration.
type configFlags struct {
	path      string
	overrides []agent.KeyValue
}

func (cf *configFlags) load(environ []string) (*agent.Config, error) {
	return agent.Load(agent.LoadOptions{Path: cf.path, Environ: environ, Flags: cf.overrides})
}

func runConfig(ctx context.Context, args, environ []string, stdout, stderr io.Writer) int {
	fs, cf := newFlagSet("config", "Print the effective configuration (with where each value came from; nothing when the file is not\nYAML), then every problem that would stop `spotguard run` from starting (exit 1) and every warning\n(exit 0).", stdout, stderr)
	get := fs.String("get", "", "print only the effective value of `KEY` (e.g. checkpoint.dir), for scripts; exit 1 if the configuration\ndoes not load (bad YAML, a duplicate or unknown key, a bad value), but checks across keys are skipped")
	isConfigured := fs.Bool("configured", false, "print nothing and exit 0 if anything sets a key (the file, SPOTGUARD_*, a flag) or the configuration\ndoes not load; exit 1, saying so, if nothing does yet (the shipped default): spotguard.service's ExecCondition=")
	if code, ok := fs.parse(args); !ok {
		return code
	}
	cfg, err := cf.load(environ)
	if err != nil {
		fmt.Fprintf(stderr, "spotguard config: %v\n", err)
		if *isConfigured {
			return exitOK // not known to be untouched: `spotguard run` fails on it, loudly
		}
		return exitFail
	}
	if *isConfigured {
		return configured(cfg, cf.path, stderr)
	}
	if *get != "" {
		if probs := cfg.LoadProblems(); len(probs) > 0 {
			for _, p := range probs {
				fmt.Fprintf(stderr, "spotguard config: %v\n", p)
			}
			return exitFail
		}
		for _, kv := range cfg.Effective() {
			if kv.Key == *get {
				fmt.Fprintln(stdout, kv.Value)
				return exitOK
			}
		}
		return fs.usageError("--get %s: no such key", *get)
	}
	// A file that could not be read would be shown as every key at its default: not what the
	// file sets, and not what `run` would do (it refuses to start).
	if !cfg.FileUnread() {
		if cfg.File() == "" {
			// Said: a newcomer saw only "no way to find the trainer" (found from outside).
			fmt.Fprintf(stdout, "# no configuration file: %s does not exist (defaults, SPOTGUARD_* variables and flags only)\n", cf.path)
		}
		fmt.Fprint(stdout, cfg.YAML())
	}
	var problems []string
	if err := cfg.Validate(); err != nil {
		problems = strings.Split(err.Error(), "\n")
	}
	// The AWS configuration as `run` loads it, without asking IMDS for the region (no network here).
	_, awsErr := awsconfig.LoadDefaultConfig(ctx)
	awsProblem, awsWarning := awsNeeds(cfg, awsConfigErr(awsErr))
	if awsProblem != "" {
		problems = append(problems, awsProblem)
	}
	var warnings []string
	for _, w := range append(cfg.Warnings(), cfg.UnitWarnings()...) {
		warnings = append(warnings, w.Text+": "+w.Fix)
	}
	if awsWarning != "" {
		warnings = append(warnings, awsWarning)
	}
	for _, w := range warnings {
		fmt.Fprintf(atPriority(stderr, 4), "warning: %s\n", w)
	}
	if len(problems) > 0 {
		fmt.Fprintf(stderr, "\n%d problem(s) in the configuration:\n", len(problems))
		for _, p := range problems {
			fmt.Fprintf(stderr, "  - %s\n", p)
		}
		return exitFail
	}
	return exitOK
}

// awsConfigErr is awsConfigError of a non-nil err, else nil.
func awsConfigErr(err error) error {
	if err == nil {
		return nil
	}
	return awsConfigError(err)
}

// awsNeeds says what an AWS configuration that cannot be loaded (err) means for cfg: a problem
// that stops the agent when an s3:// store needs it; a warning (CloudWatch off) when only
// metrics.cloudwatch does; nothing in signal-only mode. `run` and `config` say the same.
func awsNeeds(cfg *agent.Config, err error) (problem, warning string) {
	switch {
	case err == nil:
	case strings.HasPrefix(cfg.Store.URL, "s3://"):
		problem = fmt.Sprintf("store.url: %s needs AWS: %v", cfg.Store.URL, err)
	case cfg.Metrics.CloudWatch:
		warning = fmt.Sprintf("metrics.cloudwatch: CloudWatch metrics are off (everything else runs): %v", err)
	}
	return problem, warning
}

func runAgent(ctx context.Context, args, environ []string, stdout, stderr io.Writer) int {
	// Counted from the start, so that the SIGTERM that ends ctx is the first.
	stops := make(chan os.Signal, 2)
	signal.Notify(stops, syscall.SIGTERM, syscall.SIGINT)
	defer signal.Stop(stops)
	// Caught from the start too, and handled once the agent runs: a SIGHUP or SIGUSR1 before
	// that (a script signalling an agent just started) used to kill it, their default action
	// (found from outside: exit 129, no log line).
	sigs := make(chan os.Signal, 4)
	signal.Notify(sigs, syscall.SIGHUP, syscall.SIGUSR1)
	defer signal.Stop(sigs)
	fs, cf := newFlagSet("run", "Run the agent until SIGTERM or SIGINT (a second one ends the drain of uncommitted checkpoints).", stdout, stderr)
	if code, ok := fs.parse(args); !ok {
		return code
	}
	cfg, err := cf.load(environ)
	if err != nil {
		fmt.Fprintf(stderr, "spotguard run: %v\n", err)
		return exitFail
	}
	if err := cfg.Validate(); err != nil {
		fmt.Fprintf(stderr, "spotguard run: invalid configuration, not starting:\n")
		for _, p := range strings.Split(err.Error(), "\n") {
			fmt.Fprintf(stderr, "  - %s\n", p)
		}
		if cfg.File() == "" {
			// Found from outside: a newcomer saw only "no way to find the trainer".
			fmt.Fprintf(stderr, "  (there is no %s: defaults, SPOTGUARD_* variables and flags only)\n", cf.path)
		}
		return exitFail
	}
	// The level is the process's, so that a reload can change it (log.level is live).
	log := newLogger(stderr, environ, zerolog.DebugLevel)
	defer zerolog.SetGlobalLevel(zerolog.GlobalLevel())
	zerolog.SetGlobalLevel(cfg.Log.Level)
	warnings := cfg.Warnings()
	if envMap(environ)["INVOCATION_ID"] != "" { // under systemd: the unit's sandbox is this agent's
		warnings = append(warnings, cfg.UnitWarnings()...)
	}
	for _, w := range warnings {
		log.Warn().Str("fix", w.Fix).Msg(w.Text)
	}

	// Only what talks to AWS needs its configuration: an S3 store cannot start without; CloudWatch
	// is turned off; the notice path (IMDS) does not need it.
	setup, err := loadAWS(ctx, cfg.IMDS.Endpoint)
	if problem, warning := awsNeeds(cfg, err); problem != "" {
		fmt.Fprintf(stderr, "spotguard run: invalid configuration, not starting:\n  - %s\n", problem)
		return exitFail
	} else if warning != "" {
		log.Warn().Msg(warning)
		cfg.Metrics.CloudWatch = false
	}
	// The region, when the SDK's sources name none, is the instance's: read from IMDS in the
	// background, as everything that needs it (the store, CloudWatch) waits for it, so that
	// notices are polled from the start (found from outside: with IMDS slow, the read held the
	// start for its 5 s, with no notice polling and no READY=1 meanwhile).
	// setup is the region read's until regionSet is closed; IMDS's client needs no region.
	regionSet := make(chan struct{})
	awsErr, imdsCfg := err, setup.cfg
	go func() {
		defer close(regionSet)
		if awsErr != nil {
			return
		}
		setup.resolveRegion(ctx)
		switch {
		case setup.cfg.Region != "":
			log.Info().Str("region", setup.cfg.Region).Str("from", setup.regionFrom).Msg("AWS region")
		case strings.HasPrefix(cfg.Store.URL, "s3://") || cfg.Metrics.CloudWatch:
			log.Warn().Err(setup.needRegion()).Msg("no AWS region: S3 and CloudWatch requests will fail")
		}
	}()
	// The store's own AWS configuration (its bucket's region), decided once, in the background:
	// S3 may take up to 10 s to say (or not answer at all), and IMDS is polled meanwhile.
	var storeCfg aws.Config
	var storeErr error
	storeSet := make(chan struct{})
	go func() {
		defer close(storeSet)
		<-regionSet
		s := setup
		storeCfg, storeErr = storeAWS(context.WithoutCancel(ctx), &s, cfg.Store.URL, func(msg string) { log.Info().Str("store", cfg.Store.URL).Msg(msg) })
	}()
	env := envMap(environ)
	watchdog, err := systemd.WatchdogInterval(env["WATCHDOG_USEC"], env["WATCHDOG_PID"], os.Getpid())
	if err != nil {
		log.Warn().Err(err).Msg("ignoring the watchdog settings")
	}
	notify := systemd.NewNotifier(env["NOTIFY_SOCKET"])
	defer notify.Close()
	var cwClient metrics.PutMetricDataAPI
	if cfg.Metrics.CloudWatch {
		cwClient = &afterRegionCloudWatch{set: regionSet, api: sync.OnceValue(func() metrics.PutMetricDataAPI {
			if setup.cfg.Region == "" && setup.regionErr != nil {
				return &regionLaterCloudWatch{setup: setup, every: regionRetryEvery}
			}
			return cloudwatch.NewFromConfig(setup.cfg)
		})}
	}

	a, err := agent.New(cfg, agent.Deps{
		Logger:  log,
		Version: versionString(),
		IMDS:    imds.NewClient(imdsCfg, cfg.IMDS.Endpoint),
		OpenStore: func(url string, opts checkpoint.S3Options) (checkpoint.Store, error) {
			if !strings.HasPrefix(url, "s3://") {
				return checkpoint.OpenStore(url, aws.Config{}, opts)
			}
			return openLazy(url, func() (checkpoint.Store, error) {
				<-storeSet
				if storeErr != nil {
					return nil, storeErr
				}
				return checkpoint.OpenStore(url, storeCfg, opts)
			}), nil
		},
		OpenGPUs: func(log zerolog.Logger) (agent.GPUs, error) {
			g, err := nvml.Open(log)
			if err != nil {
				return nil, err
			}
			return g, nil
		},
		CloudWatch:       cwClient,
		Notify:           notify,
		UnderUnit:        env["INVOCATION_ID"] != "",
		WatchdogInterval: watchdog,
		Signals:          sigs,
		Reload:           func() (*agent.Config, error) { return cf.load(environ) },
		SetLogLevel:      zerolog.SetGlobalLevel,
		Ready: func(addr net.Addr) {
			log.Info().Str("version", versionString()).Msg("ready")
		},
	})
	if err != nil {
		log.Error().Err(err).Msg("cannot start")
		return exitFail
	}
	// The first SIGTERM or SIGINT ends ctx (main's NotifyContext) and the agent drains; a second
	// one ends the drain.
	quit := make(chan struct{})
	defer close(quit)
	go func() {
		n := 0
		for {
			select {
			case <-quit:
				return
			case <-stops:
				if n++; n == 2 {
					log.Warn().Msg("second stop signal: ending the drain")
					a.EndDrain()
				}
			}
		}
	}()
	start := time.Now()
	if err := a.Run(ctx); err != nil {
		log.Error().Err(err).Msg("agent failed")
		return exitFail
	}
	log.Info().Float64("uptime_s", logSeconds(time.Since(start))).Msg("bye")
	return exitOK
}

// envMap turns "KEY=value" strings into a map.
func envMap(environ []string) map[string]string {
	m := make(map[string]string, len(environ))
	for _, kv := range environ {
		if k, v, ok := strings.Cut(kv, "="); ok {
			m[k] = v
		}
	}
	return m
}

// afterRegionCloudWatch is the CloudWatch client of an agent whose region is read as it starts:
// a call waits for that read (or its own ctx), then goes to api, decided once the read is over.
type afterRegionCloudWatch struct {
	set <-chan struct{} // closed once the start's region read is over
	api func() metrics.PutMetricDataAPI
}

func (c *afterRegionCloudWatch) PutMetricData(ctx context.Context, in *cloudwatch.PutMetricDataInput, optFns ...func(*cloudwatch.Options)) (*cloudwatch.PutMetricDataOutput, error) {
	select {
	case <-c.set:
	case <-ctx.Done():
		return nil, fmt.Errorf("the instance's region is not read from IMDS yet: %w", ctx.Err())
	}
	return c.api().PutMetricData(ctx, in, optFns...)
}

// regionLaterCloudWatch is the CloudWatch client of an agent that had no region at start (IMDS
// down or slow then): each call until one is had asks IMDS placement/region again, at most every
// regionRetryEvery, and fails as a call without a region does. (Found from outside: CloudWatch
// failed for the agent's whole life, though IMDS answered seconds later.)
type regionLaterCloudWatch struct {
	setup awsSetup // with no region
	mu    sync.Mutex
	api   metrics.PutMetricDataAPI // once the region is had
	next  time.Time                // when IMDS is asked again
	err   error                    // why the region is not had yet
	every time.Duration            // regionRetryEvery; 0 in tests: every call
}

// regionRetryEvery is how often a regionLaterCloudWatch asks IMDS for the region.
const regionRetryEvery = 30 * time.Second

func (l *regionLaterCloudWatch) PutMetricData(ctx context.Context, in *cloudwatch.PutMetricDataInput, optFns ...func(*cloudwatch.Options)) (*cloudwatch.PutMetricDataOutput, error) {
	l.mu.Lock()
	api := l.api
	if api == nil && !time.Now().Before(l.next) {
		s := l.setup
		s.regionErr = nil
		s.resolveRegion(ctx)
		if s.cfg.Region != "" {
			l.api = cloudwatch.NewFromConfig(s.cfg)
			api = l.api
		} else {
			l.next, l.err = time.Now().Add(l.every), s.needRegion()
		}
	}
	err := l.err
	l.mu.Unlock()
	if api == nil {
		return nil, fmt.Errorf("%w: %w", &aws.MissingRegionError{}, err)
	}
	return api.PutMetricData(ctx, in, optFns...)
}
