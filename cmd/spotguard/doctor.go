package main

import (
	"cmp"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"time"

	"github.com/aws/aws-sdk-go-v2/aws"
	"github.com/rs/zerolog"
	"golang.org/x/sys/unix"

	"github.com/spotguard/spotguard/agent"
	"github.com/spotguard/spotguard/agent/imds"
	"github.com/spotguard/spotguard/agent/trainer"
	"github.com/spotguard/spotguard/checkpoint"
	"github.com/spotguard/spotguard/nvml"
)

// The verdicts of one doctor check.
const (
	doctorPass = "PASS"
	doctorWarn = "WARN" // the agent runs, but something is off or cannot be checked
	doctorFail = "FAIL" // the agent would not do its job: a notice's checkpoint would be lost
)

// Bounds of the doctor's checks.
const (
	doctorIMDSTimeout  = 5 * time.Second
	doctorStoreTimeout = 20 * time.Second
	doctorAWSTimeout   = 5 * time.Second
)

// doctorCheck is one line of `spotguard doctor`.
type doctorCheck struct {
	Name   string `json:"name"`
	Status string `json:"status"`
	// Detail says what was checked and found; a config check may hold several lines.
	Detail string `json:"detail"`
	// Fix says what to do; empty on PASS.
	Fix string `json:"fix,omitempty"`
}

// doctorReport is `spotguard doctor --json`.
type doctorReport struct {
	Config string        `json:"config"`
	Pass   bool          `json:"pass"` // no FAIL
	Failed int           `json:"failed"`
	Warned int           `json:"warned"`
	Checks []doctorCheck `json:"checks"`
}

func (r *doctorReport) add(name, status, detail, fix string) {
	r.Checks = append(r.Checks, doctorCheck{Name: name, Status: status, Detail: detail, Fix: fix})
	switch status {
	case doctorFail:
		r.Failed++
	case doctorWarn:
		r.Warned++
	}
}

// doctorDeps are the doctor's connections to the world: the same as `spotguard run` uses, passed
// in so tests can supply their own.
type doctorDeps struct {
	loadAWS   func(ctx context.Context, imdsEndpoint string) (awsSetup, error)
	newIMDS   func(cfg aws.Config, endpoint string) imds.Getter
	openStore func(ctx context.Context, url, imdsEndpoint string, opts checkpoint.S3Options) (checkpoint.Store, error)
	openGPUs  gpuOpener
	// gpuAnswerLimit is how long opening NVML may take: 0 is gpuAnswerLimit.
	gpuAnswerLimit time.Duration
	// procRoot and cgroupRoot are "" for /proc and /sys/fs/cgroup.
	procRoot, cgroupRoot string
	// noUnitWarnings leaves out agent.Config.UnitWarnings (for tests, whose directories are in
	// /tmp).
	noUnitWarnings bool
}

func defaultDoctorDeps() doctorDeps {
	return doctorDeps{
		loadAWS: loadAWS,
		newIMDS: func(cfg aws.Config, endpoint string) imds.Getter {
			return imds.NewClient(cfg, endpoint)
		},
		openStore: openStore,
		openGPUs:  openNVML,
	}
}

func runDoctor(ctx context.Context, args, environ []string, stdout, stderr io.Writer, deps doctorDeps) int {
	fs, cf := newFlagSet("doctor", "Run every check the agent depends on once, with the agent's own code: IMDS (each notice source), the\nstore (list, write, conditional write, read and delete of a probe object under <job>/_spotguard/),\ntrainer discovery (found, catches the signal), checkpoint.dir, NVML and CloudWatch. Prints PASS,\nWARN or FAIL per check with the fix; exit 1 on any FAIL.", stdout, stderr)
	jsonOut := fs.Bool("json", false, "print the report as JSON")
	if code, ok := fs.parse(args); !ok {
		return code
	}
	rep := doctor(ctx, cf, environ, deps, stderr)
	if *jsonOut {
		enc := json.NewEncoder(stdout)
		enc.SetIndent("", "  ")
		enc.Encode(rep)
	} else {
		printDoctor(stdout, rep)
	}
	if !rep.Pass {
		return exitFail
	}
	return exitOK
}

// doctor runs every check and returns the report.
func doctor(ctx context.Context, cf *configFlags, environ []string, deps doctorDeps, stderr io.Writer) (rep doctorReport) {
	rep = doctorReport{Config: cf.path, Checks: []doctorCheck{}}
	defer func() { rep.Pass = rep.Failed == 0 }()
	path := cf.path
	if _, err := os.Stat(path); err != nil && path == agent.DefaultConfigPath {
		rep.Config = "(none: defaults; " + path + " does not exist)"
	}
	cfg, err := cf.load(environ)
	if err != nil {
		rep.add("config", doctorFail, err.Error(), "fix the file (spotguard config shows every problem)")
		return rep
	}
	if err := cfg.Validate(); err != nil {
		problems := strings.Split(err.Error(), "\n")
		rep.add("config", doctorFail, fmt.Sprintf("%d problem(s): the agent would not start:\n%s", len(problems), strings.Join(problems, "\n")),
			"fix each problem (spotguard config shows where each value came from)")
	} else {
		rep.add("config", doctorPass, "valid", "")
	}
	warnings := cfg.Warnings()
	if !deps.noUnitWarnings {
		warnings = append(warnings, cfg.UnitWarnings()...)
	}
	for _, w := range warnings {
		rep.add("config", doctorWarn, w.Text, w.Fix)
	}
	if cfg.FileUnread() {
		// Every key would be its default: the checks would be of those, not of what the file
		// sets (found from outside: a tab in one line made doctor probe IMDS at its default
		// address and say no store and no trainer were configured).
		rep.add("checks", doctorWarn, "not run: the file could not be read as YAML, so they would check the defaults, not what it sets",
			"fix the file, then run spotguard doctor again")
		return rep
	}
	// A check of a key whose value is invalid would check its default instead: said, not run.
	failed := cfg.InvalidKeys()
	skip := func(name string, keys ...string) bool {
		var bad []string
		for k := range failed {
			for _, want := range keys {
				if k == want || strings.HasSuffix(want, ".") && strings.HasPrefix(k, want) {
					bad = append(bad, k)
				}
			}
		}
		if len(bad) == 0 {
			return false
		}
		slices.Sort(bad)
		bad = slices.Compact(bad)
		rep.add(name, doctorWarn, "not checked: the value of "+strings.Join(bad, ", ")+" did not load (see config above), and its default is not what was meant",
			"fix "+strings.Join(bad, ", ")+", then run spotguard doctor again")
		return true
	}
	var (
		awsCfg   aws.Config
		awsErr   error
		instance string
	)
	if !skip("imds", "imds.endpoint") { // the region comes through it too
		setup, err := deps.loadAWS(ctx, cfg.IMDS.Endpoint)
		if err == nil && (strings.HasPrefix(cfg.Store.URL, "s3://") || cfg.Metrics.CloudWatch) {
			setup.resolveRegion(ctx)
		}
		doctorAWS(&rep, cfg, setup, err)
		awsCfg, awsErr = setup.cfg, err
		instance = doctorIMDS(ctx, &rep, cfg, deps.newIMDS(awsCfg, cfg.IMDS.Endpoint), envMap(environ))
	} else {
		awsErr = errors.New("imds.endpoint is invalid")
	}
	storeKeys := []string{"store."}
	if strings.HasPrefix(cfg.Store.URL, "s3://") {
		storeKeys = append(storeKeys, "imds.endpoint")
	}
	if !skip("store", storeKeys...) {
		doctorStore(ctx, &rep, cfg, deps, instance)
	}
	if !skip("trainer", "trainer.", "agent.runtime_dir") {
		doctorTrainer(&rep, cfg, deps)
	}
	if !skip("checkpoint.dir", "checkpoint.dir", "checkpoint.marker") {
		doctorCheckpointDir(&rep, cfg)
	}
	if !skip("runtime_dir", "agent.runtime_dir") {
		_, unit := envMap(environ)["INVOCATION_ID"] // set by systemd for a unit's processes
		doctorRuntimeDir(&rep, cfg, unit)
	}
	doctorNVML(&rep, deps, environ, stderr)
	if !cfg.Metrics.CloudWatch && !failed["metrics.cloudwatch"] || !skip("cloudwatch", "metrics.", "imds.endpoint") {
		doctorCloudWatch(ctx, &rep, cfg, awsCfg, awsErr)
	}
	return rep
}

// doctorAWS checks the AWS configuration where the agent needs it: an s3:// store cannot do
// without it (FAIL), CloudWatch can (WARN: the agent runs without its metrics), signal-only mode
// with a file store does not need it at all. No region is a WARN: S3 may name the bucket's.
func doctorAWS(rep *doctorReport, cfg *agent.Config, s awsSetup, err error) {
	s3 := strings.HasPrefix(cfg.Store.URL, "s3://")
	if !s3 && !cfg.Metrics.CloudWatch {
		return
	}
	status := doctorWarn
	if s3 {
		status = doctorFail
	}
	switch {
	case err != nil:
		problem, warning := awsNeeds(cfg, err) // what `run` says
		rep.add("aws", status, problem+warning, "fix or unset AWS_PROFILE, AWS_CONFIG_FILE or ~/.aws/config (the SDK's own settings); on EC2 the instance profile needs none of them")
	case s.cfg.Region == "":
		// The store can do without (S3 names its bucket's region; the store check says whether it
		// did); CloudWatch cannot.
		rep.add("aws", doctorWarn, s.needRegion().Error()+"; CloudWatch needs one, and the store unless S3 names the bucket's region", "on EC2 make IMDS reachable (the region is read from placement/region), or set AWS_REGION for the service")
	default:
		rep.add("aws", doctorPass, fmt.Sprintf("region %s from %s", s.cfg.Region, s.regionFrom), "")
	}
}

// imdsEndpoint is the IMDS endpoint the agent uses, for messages.
func imdsEndpoint(cfg *agent.Config, env map[string]string) string {
	switch {
	case cfg.IMDS.Endpoint != "":
		return cfg.IMDS.Endpoint
	case env["AWS_EC2_METADATA_SERVICE_ENDPOINT"] != "":
		return env["AWS_EC2_METADATA_SERVICE_ENDPOINT"]
	}
	return "http://169.254.169.254"
}

// doctorIMDS checks that IMDS hands out an IMDSv2 token and answers, then reads every notice
// source the agent polls once, with the agent's own parsing. It returns the instance id ("" if
// IMDS did not answer).
func doctorIMDS(ctx context.Context, rep *doctorReport, cfg *agent.Config, g imds.Getter, env map[string]string) string {
	endpoint := imdsEndpoint(cfg, env)
	rctx, cancel := context.WithTimeout(ctx, doctorIMDSTimeout)
	body, found, err := g.Get(rctx, "instance-id")
	cancel()
	if err == nil && !found {
		err = errors.New("instance-id: 404 not found")
	}
	if err != nil {
		fix := "on EC2: enable the metadata service (aws ec2 modify-instance-metadata-options --http-endpoint enabled); in a container, raise the hop limit to 2 (--http-put-response-hop-limit 2); elsewhere, set imds.endpoint or AWS_EC2_METADATA_SERVICE_ENDPOINT"
		what := "IMDS does not answer at " + endpoint
		// The SDK's token error does not unwrap to the network error: read its text.
		msg := err.Error()
		unreachable := errors.Is(err, context.DeadlineExceeded) || strings.Contains(msg, "request send failed") ||
			strings.Contains(msg, "dial tcp") || strings.Contains(msg, "deadline exceeded")
		if !unreachable && strings.Contains(msg, "API token") {
			what = "IMDSv2 session token refused or unreachable at " + endpoint
			fix = "spotguard uses IMDSv2 only: allow tokens (--http-tokens required or optional) and, in a container, raise the hop limit to 2 (--http-put-response-hop-limit 2)"
		}
		rep.add("imds", doctorFail, what+": "+err.Error()+"; notices cannot be seen, so the notice sources were not checked", fix)
		return ""
	}
	instance := strings.TrimSpace(string(body))
	rep.add("imds", doctorPass, fmt.Sprintf("IMDSv2 token and instance-id %s from %s", instance, endpoint), "")

	var sources []imds.Source
	for _, src := range imds.Sources {
		if cfg.Notices[src] != agent.PolicyOff {
			sources = append(sources, src)
		}
	}
	w := imds.NewWatcher(g, imds.Config{Sources: sources, PollInterval: cfg.IMDS.PollInterval, RequestTimeout: doctorIMDSTimeout})
	for _, src := range sources {
		name := "imds " + string(src)
		notices, err := w.Check(ctx, src)
		switch {
		case err != nil && errors.Is(err, imds.ErrMalformed):
			what := "a body that cannot be read is a failed read: while it lasts, this source's notices are not seen"
			switch src {
			case imds.SourceSpot:
				what = "a spot body that cannot be read counts as a notice 2 minutes out"
			case imds.SourceScheduled:
				what = "a scheduled event that cannot be read counts as due at once"
			}
			rep.add(name, doctorFail, fmt.Sprintf("%s answers with a body that cannot be parsed: %v", src.Path(), err),
				"is imds.endpoint a real IMDS? ("+what+")")
		case err != nil:
			rep.add(name, doctorFail, fmt.Sprintf("%s fails: %v; its notices would not be seen", src.Path(), err),
				"check the instance's metadata options (aws ec2 describe-instances ... MetadataOptions) and any firewall in front of "+endpoint)
		case len(notices) > 0:
			var acts []string
			for _, n := range notices {
				a := n.Action
				if !n.Deadline.IsZero() {
					a += " at " + n.Deadline.UTC().Format(time.RFC3339)
				}
				acts = append(acts, a)
			}
			fix := "this instance is being interrupted or has an event scheduled: make sure the newest checkpoint is committed (spotguard list)"
			switch {
			case cfg.Notices[src] == agent.PolicyIgnore:
				// The configuration chose to ignore it: "save now" told the user otherwise
				// (found from outside).
				fix = "notices." + string(src) + " is ignore: the agent does not act on it; set it to checkpoint for a save when it comes"
			case src == imds.SourceRebalance:
				fix = "AWS says this instance is at elevated risk of interruption: save now, and consider moving the job"
			}
			rep.add(name, doctorWarn, fmt.Sprintf("%s answers: a notice is active now: %s (policy %s)", src.Path(), strings.Join(acts, ", "), cfg.Notices[src]), fix)
		default:
			rep.add(name, doctorPass, fmt.Sprintf("%s answers: no notice (policy %s)", src.Path(), cfg.Notices[src]), "")
		}
	}
	return instance
}

// doctorStore opens the store as `spotguard run` does and probes it as the agent does.
func doctorStore(ctx context.Context, rep *doctorReport, cfg *agent.Config, deps doctorDeps, instance string) {
	if cfg.Store.URL == "" {
		rep.add("store", doctorWarn, "no store.url: checkpoints are not uploaded, the trainer is only signalled",
			"set store.url (s3://bucket/prefix) and store.job to make checkpoints durable")
		return
	}
	if cfg.Store.Job == "" {
		rep.add("store", doctorFail, cfg.Store.URL+": store.job is not set", "set store.job: the same on every instance of one training run")
		return
	}
	sctx, cancel := context.WithTimeout(ctx, doctorStoreTimeout)
	defer cancel()
	store, err := deps.openStore(sctx, cfg.Store.URL, cfg.IMDS.Endpoint, cfg.S3Options())
	if err != nil {
		rep.add("store", doctorFail, cfg.Store.URL+": cannot open: "+err.Error(), agent.StoreFix(agent.StoreErrorReason(err), cfg.Store.URL, err))
		return
	}
	host := instance
	if host == "" {
		host, _ = os.Hostname()
	}
	p := agent.ProbeStore(sctx, store, cfg.Store.Job, host)
	if !p.OK() {
		rep.add("store", doctorFail, p.Problem(), agent.StoreFix(p.Reason, p.URL, p.Err))
		return
	}
	rep.add("store", doctorPass, fmt.Sprintf("%s job %s: list, write, conditional write, read and delete of %s/%s/probe-* work",
		p.URL, p.Job, p.Job, checkpoint.MetaDir), "")
	switch off := p.ClockOffset; {
	case !p.ClockKnown:
	case off.Abs() >= agent.ClockWarn:
		how := "behind"
		if off < 0 {
			how = "ahead of"
		}
		rep.add("clock", doctorWarn, fmt.Sprintf("this instance's clock is at least %.0f s %s the store's (the probe object's last-modified time): commits are ordered by the clock of the instance that writes them, so checkpoints saved here and on other instances can be ordered wrongly",
			off.Abs().Seconds(), how), agent.ClockFix)
	default:
		rep.add("clock", doctorPass, fmt.Sprintf("within %.0f s of the store's (the probe object's last-modified time)", agent.ClockWarn.Seconds()), "")
	}
}

// doctorTrainer finds the trainer as the agent does and checks that it catches the signal.
func doctorTrainer(rep *doctorReport, cfg *agent.Config, deps doctorDeps) {
	f := trainer.Finder{PIDFile: cfg.Trainer.PIDFile, Unit: cfg.Trainer.Unit, Match: cfg.Trainer.Match,
		Container: cfg.Trainer.Container, User: cfg.Trainer.User, ProcRoot: deps.procRoot, CgroupRoot: deps.cgroupRoot,
		Agent: agent.RunningAgentPID(cfg.Agent.RuntimeDir)} // the running agent is no trainer, as it says itself
	if f.PIDFile == "" && f.Unit == "" && f.Match == nil && f.Container == "" {
		rep.add("trainer", doctorFail, "no way to find the trainer is configured", "set trainer.pidfile, trainer.unit, trainer.match or trainer.container")
		return
	}
	procs, problems := f.Find()
	sig := trainer.SignalName(cfg.Trainer.Signal)
	if len(procs) == 0 {
		var ps []string
		for _, p := range problems {
			ps = append(ps, p.Detail)
		}
		rep.add("trainer", doctorWarn, "no trainer process found now: "+strings.Join(ps, "; "),
			"start the trainer (the agent looks for it every 10 s), or fix trainer.pidfile, trainer.unit, trainer.match, trainer.container or trainer.user")
		return
	}
	procRoot := deps.procRoot
	if procRoot == "" {
		procRoot = "/proc"
	}
	var catching, deaf []string
	for _, p := range procs {
		desc := fmt.Sprintf("%d (%s)", p.PID, truncate(p.Cmdline, 60))
		ok, err := trainer.Catches(procRoot, p.PID, cfg.Trainer.Signal)
		switch {
		case err != nil:
			deaf = append(deaf, desc+": "+err.Error())
		case ok:
			catching = append(catching, desc)
		default:
			deaf = append(deaf, desc)
		}
	}
	const fix = "install a handler for it in the trainer (examples/python/trainer.py), set trainer.signal to the one it handles, or narrow the discovery to the processes that do"
	switch {
	case len(deaf) == 0:
		rep.add("trainer", doctorPass, fmt.Sprintf("%d process(es) found, all catch %s: %s", len(procs), sig, strings.Join(catching, ", ")), "")
	case len(catching) == 0:
		rep.add("trainer", doctorFail, fmt.Sprintf("%d process(es) found, none catches %s, so none would be signalled: %s", len(procs), sig, strings.Join(deaf, ", ")), fix)
	default:
		rep.add("trainer", doctorWarn, fmt.Sprintf("%d process(es) catch %s (%s); these do not and would not be signalled: %s",
			len(catching), sig, strings.Join(catching, ", "), strings.Join(deaf, ", ")), "if these are workers that must save, "+fix)
	}
}

func truncate(s string, n int) string {
	if len(s) <= n {
		return s
	}
	return s[:n] + "..."
}

// doctorCheckpointDir checks checkpoint.dir: a readable directory, or not there yet (the agent
// waits for it).
func doctorCheckpointDir(rep *doctorReport, cfg *agent.Config) {
	dir := cfg.Checkpoint.Dir
	if dir == "" {
		rep.add("checkpoint.dir", doctorWarn, "not set: checkpoints are not watched or uploaded", "set checkpoint.dir to where the trainer writes its checkpoints (with store.url)")
		return
	}
	fi, err := os.Stat(dir)
	switch {
	case errors.Is(err, os.ErrNotExist):
		rep.add("checkpoint.dir", doctorWarn, dir+" does not exist yet: the agent waits for it to be created",
			"nothing to do if the trainer creates it; otherwise check checkpoint.dir")
		return
	case err != nil:
		rep.add("checkpoint.dir", doctorFail, dir+": "+err.Error(), "make it readable by the agent's user")
		return
	case !fi.IsDir():
		rep.add("checkpoint.dir", doctorFail, dir+" is not a directory", "point checkpoint.dir at the directory the trainer writes checkpoints into")
		return
	}
	entries, err := os.ReadDir(dir)
	if err != nil {
		rep.add("checkpoint.dir", doctorFail, dir+" cannot be read: "+err.Error(), "make it readable by the agent's user")
		return
	}
	if top, below := doctorMarkerBelow(dir, entries, cfg.Checkpoint.Marker); top != "" {
		rep.add("checkpoint.dir", doctorWarn, fmt.Sprintf("%s holds %s, below the top of %s, which it does not complete: nothing of it is ever committed (checkpoint.dir looks one level too high)",
			dir, filepath.Join(top, below), top),
			"set checkpoint.dir to "+filepath.Join(dir, top)+", if that is the directory the trainer writes its checkpoint directories into; otherwise write the marker at the top of "+filepath.Join(dir, top))
		return
	}
	if names, size := movedAside(dir); len(names) > 0 {
		rep.add("checkpoint.dir", doctorWarn, fmt.Sprintf("%s holds %d save%s that restores moved aside, taking %s (%s): incomplete or older saves of a checkpoint's name, kept, never uploaded",
			dir, len(names), plural(len(names)), checkpoint.HumanBytes(size), strings.Join(names, ", ")),
			"look at them, and delete them: the trainer does not resume from them, and they fill the disk")
		return
	}
	if mounted, _ := isMountPoint(dir); mounted {
		rep.add("checkpoint.dir", doctorWarn, mountPointWarning("checkpoint.dir", dir),
			"set checkpoint.dir to "+filepath.Join(dir, "checkpoints")+" (and RESTORE_TO, if set), or give the disk a mount unit (an /etc/fstab line) so that RequiresMountsFor= orders the restore after it")
		return
	}
	rep.add("checkpoint.dir", doctorPass, fmt.Sprintf("%s is a readable directory (%d entries)", dir, len(entries)), "")
}

// doctorMarkerBelow looks, in each directory at the top of checkpoint.dir dir (its entries) that
// has no marker at its top, for a directory just below with the marker at its top: the trainer's
// checkpoints one level down (top/below). It returns the first, or "", "".
func doctorMarkerBelow(dir string, entries []os.DirEntry, marker string) (top, below string) {
	if marker == "" {
		marker = "_COMPLETE"
	}
	for _, e := range entries {
		if !e.IsDir() {
			continue
		}
		if _, err := os.Lstat(filepath.Join(dir, e.Name(), marker)); err == nil {
			continue
		}
		subs, err := os.ReadDir(filepath.Join(dir, e.Name()))
		if err != nil {
			continue
		}
		for _, sub := range subs {
			if fi, err := os.Lstat(filepath.Join(dir, e.Name(), sub.Name(), marker)); sub.IsDir() && err == nil && fi.Mode().IsRegular() {
				return e.Name(), filepath.Join(sub.Name(), marker)
			}
		}
	}
	return "", ""
}

// runtimeDirRoom is the free space below which doctor takes agent.runtime_dir for full: room for
// notice.json and some lines of the journal.
const runtimeDirRoom = 64 << 10

// doctorRuntimeDir checks that agent.runtime_dir can be written (or created): notice.json, the
// trainer's deadline, and the upload journal live there. It writes nothing: an existing directory
// must be writable, a missing one creatable in the nearest directory above it that exists.
// Checked outside the unit (not underUnit), a directory other than /run/spotguard is said to need
// ReadWritePaths= under it.
func doctorRuntimeDir(rep *doctorReport, cfg *agent.Config, underUnit bool) {
	dir := cfg.Agent.RuntimeDir
	fix := "make it writable by the agent's user (the unit's RuntimeDirectory= creates /run/spotguard), or set agent.runtime_dir"
	probe := dir
	for {
		fi, err := os.Stat(probe)
		switch {
		case err == nil && !fi.IsDir():
			rep.add("runtime_dir", doctorFail, probe+" is not a directory: notice.json and the upload journal cannot be written", fix)
			return
		case err == nil:
			if probe == dir {
				if err := agent.CheckRuntimeDirOwner(dir, fi, os.Geteuid()); err != nil {
					rep.add("runtime_dir", doctorFail, err.Error()+": the agent does not start on it", "")
					return
				}
			}
			if err := unix.Access(probe, unix.W_OK|unix.X_OK); err != nil {
				what := dir + " is not writable"
				if probe != dir {
					what = dir + " cannot be created: " + probe + " is not writable"
				}
				rep.add("runtime_dir", doctorFail, what+" by this user ("+err.Error()+"): notice.json and the upload journal would be missing", agent.RuntimeDirFix(dir, err))
				return
			}
			var st unix.Statfs_t
			if err := unix.Statfs(probe, &st); err == nil && st.Blocks == 0 {
				// /proc, /sys: no room for files at all, and not "full" (found from outside).
				rep.add("runtime_dir", doctorFail, fmt.Sprintf("%s is on a file system that holds no files of its own (type %#x, as /proc and /sys): notice.json and the upload journal could not be written",
					probe, st.Type), "set agent.runtime_dir to a directory on a real file system (the default /run/spotguard)")
				return
			}
			if err := unix.Statfs(probe, &st); err == nil && (uint64(st.Bavail)*uint64(st.Bsize) < runtimeDirRoom || st.Files > 0 && st.Ffree == 0) {
				// Writable, and full: notice.json's bytes would not fit (a tmpfs filled by
				// something else).
				rep.add("runtime_dir", doctorFail, fmt.Sprintf("%s is full (%d bytes, %d inodes free): notice.json and the upload journal could not be written",
					probe, uint64(st.Bavail)*uint64(st.Bsize), st.Ffree), "free space in "+probe+", or set agent.runtime_dir")
				return
			}
			what := dir + " is writable"
			if probe != dir {
				what = dir + " does not exist yet; the agent creates it in " + probe
			}
			if !underUnit && !strings.HasPrefix(filepath.Clean(dir)+"/", "/run/spotguard/") {
				// Run by hand, outside the unit's sandbox, where it may not be (found from outside).
				what += "; that is here, as this user: under spotguard.service, whose sandbox (ProtectSystem=strict) lets the agent write only in /run/spotguard and where ReadWritePaths= says, it also needs ReadWritePaths=" + dir
			}
			rep.add("runtime_dir", doctorPass, what, "")
			return
		case !errors.Is(err, os.ErrNotExist):
			rep.add("runtime_dir", doctorFail, probe+": "+err.Error(), fix)
			return
		}
		parent := filepath.Dir(probe)
		if parent == probe {
			rep.add("runtime_dir", doctorFail, dir+" cannot be created: no directory above it exists", fix)
			return
		}
		probe = parent
	}
}

// doctorNVML opens NVML as the agent does; without it the agent runs, so it is a warning. One
// that does not answer (a hung GPU or driver) fails, and is left open: closing it would block.
func doctorNVML(rep *doctorReport, deps doctorDeps, environ []string, stderr io.Writer) {
	var g gpuSource
	var err error
	watch := &gpuWatch{limit: cmp.Or(deps.gpuAnswerLimit, gpuAnswerLimit)}
	if !watch.do("NVML (nvmlInit)", 0, func() { g, err = deps.openGPUs(newLogger(stderr, environ, zerolog.ErrorLevel)) }) {
		rep.add("nvml", doctorFail, watch.hungCall()+": a GPU or its driver hangs; GPU sampling would stop, the agent runs without it",
			"look for Xid errors in the kernel log (journalctl -k | grep -i xid) and replace the instance")
		return
	}
	if err != nil {
		reason := strings.TrimPrefix(err.Error(), nvml.ErrUnavailable.Error()+": ")
		rep.add("nvml", doctorWarn, "GPU sampling is off: "+reason+"; the agent runs without it",
			"on a GPU instance, install the NVIDIA driver (libnvidia-ml.so.1) and give the agent access to /dev/nvidia*")
		return
	}
	defer g.Close()
	facts := g.Facts()
	if len(facts) == 0 {
		rep.add("nvml", doctorWarn, "NVML works but reports no GPU", "check nvidia-smi")
		return
	}
	rep.add("nvml", doctorPass, fmt.Sprintf("%d GPU(s): %s", len(facts), facts[0].Name), "")
}

// doctorCloudWatch resolves the region and credentials CloudWatch would use. Whether
// PutMetricData is allowed cannot be checked without sending a datum.
func doctorCloudWatch(ctx context.Context, rep *doctorReport, cfg *agent.Config, awsCfg aws.Config, awsErr error) {
	switch {
	case !cfg.Metrics.CloudWatch:
		rep.add("cloudwatch", doctorPass, "off (metrics.cloudwatch false)", "")
		return
	case awsErr != nil:
		rep.add("cloudwatch", doctorWarn, "cannot be checked: no AWS configuration", "see the aws check")
		return
	case awsCfg.Region == "":
		rep.add("cloudwatch", doctorWarn, "no AWS region: metrics would not be sent",
			"set AWS_REGION (or region in the profile) for the service, or metrics.cloudwatch: false")
		return
	case awsCfg.Credentials == nil:
		rep.add("cloudwatch", doctorWarn, "no AWS credentials provider: metrics would not be sent", "attach an instance profile, or metrics.cloudwatch: false")
		return
	}
	cctx, cancel := context.WithTimeout(ctx, doctorAWSTimeout)
	defer cancel()
	creds, err := awsCfg.Credentials.Retrieve(cctx)
	if err != nil {
		rep.add("cloudwatch", doctorWarn, "no AWS credentials: "+err.Error()+"; metrics would not be sent",
			"attach an instance profile (IAM role) allowing cloudwatch:PutMetricData, or metrics.cloudwatch: false")
		return
	}
	rep.add("cloudwatch", doctorPass, fmt.Sprintf("namespace %s in %s with credentials from %s (cloudwatch:PutMetricData itself is not tried)",
		cfg.Metrics.Namespace, awsCfg.Region, creds.Source), "")
}

// printDoctor writes the report: a line per check (PASS/WARN/FAIL, name, detail), its fix below
// it, and a summary line.
func printDoctor(w io.Writer, rep doctorReport) {
	fmt.Fprintf(w, "spotguard doctor: config %s\n\n", rep.Config)
	const indent = "                        "
	for _, c := range rep.Checks {
		lines := strings.Split(c.Detail, "\n")
		fmt.Fprintf(w, "%-4s  %-16s  %s\n", c.Status, c.Name, lines[0])
		for _, l := range lines[1:] {
			fmt.Fprintf(w, "%s- %s\n", indent, l)
		}
		if c.Fix != "" && c.Status != doctorPass {
			fmt.Fprintf(w, "%sfix: %s\n", indent, c.Fix)
		}
	}
	passed := len(rep.Checks) - rep.Failed - rep.Warned
	if rep.Pass {
		fmt.Fprintf(w, "\nPASS: %d passed, %d warning(s)\n", passed, rep.Warned)
	} else {
		fmt.Fprintf(w, "\nFAIL: %d failed, %d warning(s), %d passed\n", rep.Failed, rep.Warned, passed)
	}
}
