package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"net"
	"os"
	"os/signal"
	"runtime/debug"
	"strings"
	"syscall"
	"time"

	"github.com/aws/aws-sdk-go-v2/aws"
	awsconfig "github.com/aws/aws-sdk-go-v2/config"
	"github.com/aws/aws-sdk-go-v2/service/cloudwatch"
	"github.com/mattn/go-isatty"
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

const usageText = `spotguard keeps GPU training alive on EC2 Spot.

Usage:
  spotguard <command> [flags]

Commands:
  drill     rehearse a reclaim end to end on this machine: notice, signal, upload, commit, restore (PASS/FAIL)
  run       run the agent: watch IMDS for interruption notices, signal the trainer, upload checkpoints
  doctor    check everything the agent depends on once (IMDS, store, trainer, checkpoint.dir, NVML, CloudWatch): PASS/WARN/FAIL
  restore   download the newest committed checkpoint, verified (--to DIR)
  list      list the job's committed checkpoints
  notify    hand the agent a notice the job learned from another node (--deadline RFC3339): urgent uploads, no signal
  gpu       sample and judge every GPU (exit 0 healthy, 3 degraded, 4 no NVML)
  plan      how often to checkpoint: Young and Daly intervals, expected losses and costs
  config    print the effective configuration and every problem with it (exit 1 if any)
  version   print the version

Run 'spotguard <command> -h' for the flags of a command. Every configuration key is also a flag
(--imds.poll_interval 500ms) and an environment variable (SPOTGUARD_IMDS_POLL_INTERVAL=500ms);
flags win over the environment, which wins over the file.
`

// run is the whole program behind main: it returns the exit code.
func run(ctx context.Context, args, environ []string, stdout, stderr io.Writer) int {
	if len(args) == 0 {
		fmt.Fprint(stderr, usageText)
		return exitUsage
	}
	switch cmd, rest := args[0], args[1:]; cmd {
	case "run":
		return runAgent(ctx, rest, environ, stderr)
	case "config":
		return runConfig(ctx, rest, environ, stdout, stderr)
	case "restore":
		return runRestore(ctx, rest, environ, stdout, stderr)
	case "list":
		return runList(ctx, rest, environ, stdout, stderr)
	case "notify":
		return runNotify(ctx, rest, environ, stdout, stderr)
	case "drill":
		return runDrill(ctx, rest, environ, stdout, stderr)
	case "doctor":
		return runDoctor(ctx, rest, environ, stdout, stderr, defaultDoctorDeps())
	case drillTrainerCmd:
		return runDrillTrainer(ctx, rest, stderr)
	case "gpu":
		return runGPU(ctx, rest, environ, stdout, stderr, openNVML)
	case "plan":
		return runPlan(rest, stdout, stderr)
	case "version":
		if len(rest) > 0 {
			fmt.Fprintf(stderr, "spotguard version: unexpected argument %q\n", rest[0])
			return exitUsage
		}
		fmt.Fprintln(stdout, versionString())
		return exitOK
	case "help", "-h", "-help", "--help":
		fmt.Fprint(stdout, usageText)
		return exitOK
	default:
		fmt.Fprintf(stderr, "spotguard: unknown command %q\n\n%s", cmd, usageText)
		return exitUsage
	}
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

// newFlagSet returns a flag set with --config and one flag per configuration key.
func newFlagSet(name, summary string, stderr io.Writer) (*flag.FlagSet, *configFlags) {
	cf := &configFlags{}
	fs := flag.NewFlagSet("spotguard "+name, flag.ContinueOnError)
	fs.SetOutput(stderr)
	fs.StringVar(&cf.path, "config", agent.DefaultConfigPath, "configuration `file` (YAML)")
	fs.Func("log-level", "the same as --log.level: debug, info, warn or error", func(v string) error {
		cf.overrides = append(cf.overrides, agent.KeyValue{Key: "log.level", Value: v})
		return nil
	})
	for _, k := range agent.Keys() {
		fs.Func(k.Name, fmt.Sprintf("%s (env %s, default %q)", k.Help, k.Env, k.Default), func(v string) error {
			cf.overrides = append(cf.overrides, agent.KeyValue{Key: k.Name, Value: v})
			return nil
		})
	}
	fs.Usage = func() {
		fmt.Fprintf(fs.Output(), "Usage: spotguard %s [flags]\n\n%s\n\nFlags:\n", name, summary)
		fs.PrintDefaults()
	}
	return fs, cf
}

// parseFlags parses args; it returns the exit code to use when the command must not go on.
func parseFlags(fs *flag.FlagSet, args []string) (int, bool) {
	if err := fs.Parse(args); err != nil {
		if errors.Is(err, flag.ErrHelp) {
			return exitOK, false
		}
		return exitUsage, false
	}
	if fs.NArg() > 0 {
		fmt.Fprintf(fs.Output(), "%s: unexpected argument %q\n", fs.Name(), fs.Arg(0))
		fs.Usage()
		return exitUsage, false
	}
	return 0, true
}

func (cf *configFlags) load(environ []string) (*agent.Config, error) {
	return agent.Load(agent.LoadOptions{Path: cf.path, Environ: environ, Flags: cf.overrides})
}

func runConfig(ctx context.Context, args, environ []string, stdout, stderr io.Writer) int {
	fs, cf := newFlagSet("config", "Print the effective configuration (with where each value came from), then every problem that would stop\n`spotguard run` from starting (exit 1) and every warning (exit 0).", stderr)
	get := fs.String("get", "", "print only the effective value of `KEY` (e.g. checkpoint.dir), for scripts; exit 1 if the configuration\ndoes not load (bad YAML, a duplicate or unknown key, a bad value), but checks across keys are skipped")
	isConfigured := fs.Bool("configured", false, "print nothing and exit 0 if anything sets a key (the file, SPOTGUARD_*, a flag) or the configuration\ndoes not load; exit 1, saying so, if nothing does yet (the shipped default): spotguard.service's ExecCondition=")
	if code, ok := parseFlags(fs, args); !ok {
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
		fmt.Fprintf(stderr, "spotguard config: --get %s: no such key (spotguard config lists them)\n", *get)
		return exitUsage
	}
	fmt.Fprint(stdout, cfg.YAML())
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
	warnings := cfg.Warnings()
	if awsWarning != "" {
		warnings = append(warnings, awsWarning)
	}
	for _, w := range warnings {
		fmt.Fprintf(stderr, "warning: %s\n", w)
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

func runAgent(ctx context.Context, args, environ []string, stderr io.Writer) int {
	// Counted from the start, so that the SIGTERM that ends ctx is the first.
	stops := make(chan os.Signal, 2)
	signal.Notify(stops, syscall.SIGTERM, syscall.SIGINT)
	defer signal.Stop(stops)
	fs, cf := newFlagSet("run", "Run the agent until SIGTERM or SIGINT (a second one ends the drain of uncommitted checkpoints).", stderr)
	if code, ok := parseFlags(fs, args); !ok {
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
		return exitFail
	}
	// The level is the process's, so that a reload can change it (log.level is live).
	log := newLogger(stderr, zerolog.DebugLevel)
	defer zerolog.SetGlobalLevel(zerolog.GlobalLevel())
	zerolog.SetGlobalLevel(cfg.Log.Level)
	for _, w := range cfg.Warnings() {
		log.Warn().Msg(w)
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
	if err == nil {
		setup.resolveRegion(ctx)
	}
	switch {
	case err != nil:
	case setup.cfg.Region != "":
		log.Info().Str("region", setup.cfg.Region).Str("from", setup.regionFrom).Msg("AWS region")
	case strings.HasPrefix(cfg.Store.URL, "s3://") || cfg.Metrics.CloudWatch:
		log.Warn().Err(setup.needRegion()).Msg("no AWS region: S3 and CloudWatch requests will fail")
	}
	awsCfg := setup.cfg
	// The store's own AWS configuration (its bucket's region), decided once.
	storeCfg, storeErr := storeAWS(ctx, &setup, cfg.Store.URL, func(msg string) { log.Info().Str("store", cfg.Store.URL).Msg(msg) })
	env := envMap(environ)
	watchdog, err := systemd.WatchdogInterval(env["WATCHDOG_USEC"], env["WATCHDOG_PID"], os.Getpid())
	if err != nil {
		log.Warn().Err(err).Msg("ignoring the watchdog settings")
	}
	notify := systemd.NewNotifier(env["NOTIFY_SOCKET"])
	defer notify.Close()
	sigs := make(chan os.Signal, 4)
	signal.Notify(sigs, syscall.SIGHUP, syscall.SIGUSR1)
	defer signal.Stop(sigs)

	a, err := agent.New(cfg, agent.Deps{
		Logger: log,
		IMDS:   imds.NewClient(awsCfg, cfg.IMDS.Endpoint),
		OpenStore: func(url string, opts checkpoint.S3Options) (checkpoint.Store, error) {
			if storeErr != nil {
				return nil, storeErr
			}
			return checkpoint.OpenStore(url, storeCfg, opts)
		},
		OpenGPUs: func(log zerolog.Logger) (agent.GPUs, error) {
			g, err := nvml.Open(log)
			if err != nil {
				return nil, err
			}
			return g, nil
		},
		CloudWatch:       cloudWatchClient(cfg, awsCfg),
		Notify:           notify,
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
	log.Info().Dur("uptime", time.Since(start)).Msg("bye")
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

// cloudWatchClient is the CloudWatch client, or nil when metrics.cloudwatch is off. Region and
// credentials come from the SDK chain; when they cannot be had the sink says so once and the
// agent runs on.
func cloudWatchClient(cfg *agent.Config, awsCfg aws.Config) metrics.PutMetricDataAPI {
	if !cfg.Metrics.CloudWatch {
		return nil
	}
	return cloudwatch.NewFromConfig(awsCfg)
}

// newLogger logs JSON to w (for journald), or a human console format when w is a terminal.
// Writes are serialized: the agent logs from several goroutines.
func newLogger(w io.Writer, level zerolog.Level) zerolog.Logger {
	if f, ok := w.(*os.File); ok && isatty.IsTerminal(f.Fd()) {
		w = zerolog.ConsoleWriter{Out: f, TimeFormat: time.TimeOnly}
	}
	return zerolog.New(zerolog.SyncWriter(w)).Level(level).With().Timestamp().Logger()
}
