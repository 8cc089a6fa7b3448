package agent

import (
	"bytes"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"math"
	"net"
	"net/netip"
	"net/url"
	"os"
	"path/filepath"
	"regexp"
	"slices"
	"sort"
	"strconv"
	"strings"
	"syscall"
	"time"
	"unicode"
	"unicode/utf8"

	"github.com/rs/zerolog"
	"go.yaml.in/yaml/v3"

	"github.com/spotguard/spotguard/agent/imds"
	"github.com/spotguard/spotguard/agent/trainer"
	"github.com/spotguard/spotguard/checkpoint"
)

// DefaultConfigPath is where the daemon reads its configuration unless --config says otherwise.
const DefaultConfigPath = "/etc/spotguard/spotguard.yaml"

// The IMDS poll intervals Validate accepts: a spot notice gives 2 minutes, so a poll must come
// well inside them; above WarnPollInterval a warning says how much of them polling eats.
const (
	MinPollInterval  = 100 * time.Millisecond
	MaxPollInterval  = 5 * time.Second
	WarnPollInterval = 2 * time.Second
)

// Policy says what the agent does with a notice of one source.
type Policy string

// The notice policies.
const (
	// PolicyCheckpoint signals the trainer to checkpoint (and, later, uploads the checkpoint).
	PolicyCheckpoint Policy = "checkpoint"
	// PolicyIgnore records the notice (log, /status, metrics) but does nothing about it.
	PolicyIgnore Policy = "ignore"
	// PolicyOff does not poll the source at all (takes effect at start; a reload cannot turn a
	// source on or off).
	PolicyOff Policy = "off"
)

// Config is the agent's whole configuration. Load fills it from defaults, a YAML file, SPOTGUARD_*
// environment variables and flags, in that order; Validate reports every problem at once.
// AWS settings (region, credentials, endpoints) are not here: they come from the SDK's own
// environment and shared config.
type Config struct {
	IMDS struct {
		// Endpoint overrides the IMDS endpoint; empty means the SDK's choice
		// (AWS_EC2_METADATA_SERVICE_ENDPOINT, else http://169.254.169.254).
		Endpoint         string
		PollInterval     time.Duration
		SpotPollInterval time.Duration
	}
	// Notices holds the policy for each notice source: every IMDS source, and SourceJob.
	Notices map[imds.Source]Policy
	Trainer struct {
		PIDFile string
		Unit    string
		Match   *regexp.Regexp
		// User is the real uid whose processes alone are trainers; nil: any user's.
		User      *int
		Container string
		Signal    syscall.Signal
	}
	Checkpoint struct {
		Dir     string
		Marker  string
		Pattern string
		Keep    int
		// SendWhileWritten: during a notice, files written in place go to S3 as they grow.
		SendWhileWritten bool
	}
	Store struct {
		URL         string
		Job         string
		PartSize    int64
		Concurrency int
		// NodeRank and WorldNodes: this node's part of a multi-node job's checkpoints, and how
		// many nodes' parts make one (1: a single-node job). PartWait: how long to try to
		// complete a checkpoint whose parts are not all in.
		NodeRank, WorldNodes int
		PartWait             time.Duration
		// SSE and KMSKeyID: the server-side encryption every object written to an S3 store
		// asks for (checkpoint.S3Options).
		SSE, KMSKeyID string
	}
	HTTP struct {
		Listen string
		// PProf serves Go's profiles under /debug/pprof/ on Listen.
		PProf bool
	}
	Agent struct {
		// RuntimeDir holds notice.json, which trainers may read for the deadline, and the journal.
		RuntimeDir string
		// StopBudget bounds how long a stop drains (see checkpoint.UploaderConfig.StopBudget).
		StopBudget time.Duration
	}
	GPU struct {
		SampleInterval    time.Duration
		DegradedThreshold float64
	}
	Metrics struct {
		CloudWatch         bool
		CloudWatchInterval time.Duration
		// CloudWatchPerGPU adds the per-GPU series (dimension GPU) to the default set.
		CloudWatchPerGPU bool
		// CloudWatchAggregate names the aggregate dimension sets (AggregateInstanceType,
		// AggregateRegion), in the order given; empty for none. See AggregateDimensions.
		CloudWatchAggregate []string
		Namespace           string
	}
	Log struct {
		Level zerolog.Level
	}

	// values holds every key's effective text and where it came from, for `spotguard config`.
	values map[string]setting
	// problems are the parse problems met while loading; Validate reports them with the rest.
	problems []error
	// fileProblems are those of problems that concern the file as a whole (fileProblem).
	fileProblems []error
	// fileUnread is set when the config file is not a YAML mapping of sections, so that none of
	// its keys was read.
	fileUnread bool
	// unread are keys the file likely meant to set under a misspelt name (InvalidKeys).
	unread []string
	// file is the config file read, "" when there was none (File).
	file string
}

// File returns the path of the configuration file that was read, "" if none was (the default
// file is absent).
func (c *Config) File() string { return c.file }

// setting is one key's effective text value and its origin ("default", the file name, the env
// variable or the flag).
type setting struct {
	value  string
	origin string
}

// field describes one configuration key: its name, default, documentation and how to parse it.
type field struct {
	key  string // "section.key"
	def  string
	help string
	set  func(c *Config, v string) error
}

// fields lists every configuration key. It drives defaults, the YAML keys, the SPOTGUARD_* names,
// the flags, `spotguard config` and the README's reference table.
var fields = []field{
	{"imds.endpoint", "", "IMDS endpoint URL (http:// or https://, e.g. http://[fd00:ec2::254] for IPv6); empty uses the SDK's (AWS_EC2_METADATA_SERVICE_ENDPOINT or http://169.254.169.254); the AWS region and the instance profile's credentials are read from it too", func(c *Config, v string) error {
		c.IMDS.Endpoint = ""
		if v == "" {
			return nil
		}
		if err := checkEndpoint(v); err != nil {
			return err
		}
		c.IMDS.Endpoint = v
		return nil
	}},
	{"imds.poll_interval", "1s", "how often each notice source is polled (100ms to 5s; a warning above 2s)", func(c *Config, v string) error {
		d, err := parsePollInterval(v)
		c.IMDS.PollInterval = d
		return err
	}},
	{"imds.spot_poll_interval", "250ms", "how often spot/instance-action, the 2-minute notice, is polled (100ms to 5s; a warning above 2s); one cached IMDSv2 token serves every poll", func(c *Config, v string) error {
		d, err := parsePollInterval(v)
		c.IMDS.SpotPollInterval = d
		return err
	}},
	{"notices.spot", "checkpoint", "policy for spot/instance-action (checkpoint, ignore or off)", policySetter(imds.SourceSpot)},
	{"notices.rebalance", "checkpoint", "policy for events/recommendations/rebalance (checkpoint, ignore or off); a proactive save, training goes on", policySetter(imds.SourceRebalance)},
	{"notices.scheduled", "checkpoint", "policy for events/maintenance/scheduled (checkpoint, ignore or off)", policySetter(imds.SourceScheduled)},
	{"notices.asg", "checkpoint", "policy for autoscaling/target-lifecycle-state Terminated (checkpoint, ignore or off)", policySetter(imds.SourceASG)},
	{"notices.job", "checkpoint", "policy for notices the job hands over (POST /notice, spotguard notify), learned from another node: checkpoint (urgent uploads, notice.json; the trainer is never signalled for one) or ignore", func(c *Config, v string) error {
		switch p := Policy(v); p {
		case PolicyCheckpoint, PolicyIgnore:
			c.Notices[SourceJob] = p
			return nil
		}
		return errors.New("want checkpoint or ignore (a job notice is not polled, so it cannot be off)")
	}},
	{"trainer.pidfile", "", "file holding the trainer's PID", func(c *Config, v string) error {
		c.Trainer.PIDFile = v
		return nil
	}},
	{"trainer.unit", "", "systemd unit of the trainer; every process in its cgroup is signalled", func(c *Config, v string) error {
		c.Trainer.Unit = v
		return nil
	}},
	{"trainer.match", "", "regular expression matched against /proc/PID/cmdline (arguments joined by spaces)", func(c *Config, v string) error {
		c.Trainer.Match = nil
		if v == "" {
			return nil
		}
		re, err := regexp.Compile(v)
		if err != nil {
			return fmt.Errorf("not a regular expression: %w", err)
		}
		c.Trainer.Match = re
		return nil
	}},
	{"trainer.user", "", "user name or numeric uid: only processes of this real user are trainers, whichever way they were found; empty: any user. A restore as root gives this user the directories it creates in a directory of root's (a disk's mount point)", func(c *Config, v string) error {
		uid, err := trainer.ParseUser(v)
		c.Trainer.User = uid
		return err
	}},
	{"trainer.container", "", "container of the trainer (ID, unique ID prefix of 12+ hex digits, or a Docker container name): every process in it is a trainer, and trainer.pidfile holds a PID of its PID namespace", func(c *Config, v string) error {
		c.Trainer.Container = v
		return trainer.ValidContainer(v)
	}},
	{"trainer.signal", "SIGUSR1", "signal sent to every trainer process on a notice; only sent to processes that catch it", func(c *Config, v string) error {
		sig, err := trainer.ParseSignal(v)
		c.Trainer.Signal = sig
		return err
	}},
	{"checkpoint.dir", "", "directory the trainer writes checkpoints into (one sub-directory per checkpoint); an absolute path", func(c *Config, v string) error {
		c.Checkpoint.Dir = v
		if v != "" && !filepath.IsAbs(v) {
			return errRelativePath
		}
		return nil
	}},
	{"checkpoint.marker", "_COMPLETE", "file whose appearance marks a checkpoint directory complete (.metadata for torch DCP)", func(c *Config, v string) error {
		if v != "" { // empty: Validate says it
			if err := checkpoint.CheckMarker(v); err != nil {
				return err
			}
		}
		c.Checkpoint.Marker = v
		return nil
	}},
	{"checkpoint.pattern", "", "glob for single-file checkpoints renamed into checkpoint.dir (e.g. *.pt); one written in place is warned of (checkpoints.md)", func(c *Config, v string) error {
		if err := checkpoint.CheckPattern(v); err != nil {
			return err
		}
		c.Checkpoint.Pattern = v
		return nil
	}},
	{"checkpoint.keep", "0", "committed checkpoints to keep in the store, newest first (0 keeps all); the one LATEST names is never deleted; while a notice is in force (a rebalance recommendation too) nothing is deleted, up to keep+20, and the store may hold that many", func(c *Config, v string) error {
		n, err := strconv.Atoi(v)
		if err != nil || n < 0 {
			return errors.New("want a whole number, 0 or more")
		}
		c.Checkpoint.Keep = n
		return nil
	}},
	{"checkpoint.send_while_written", "true", "during a notice, send a file written under its own name (as torch DCP writes its shards) to S3 while it grows, each part checked again at its close (checkpoints.md); false: only once it is closed", boolKey(func(c *Config) *bool { return &c.Checkpoint.SendWhileWritten })},
	{"store.url", "", "where checkpoints go: s3://bucket/prefix or file:///path; empty: no upload (signal only)", func(c *Config, v string) error {
		c.Store.URL = ""
		if v == "" {
			return nil
		}
		if _, _, _, err := checkpoint.ParseStoreURL(v); err != nil {
			return errors.New(strings.TrimPrefix(err.Error(), fmt.Sprintf("store url %q: ", v)))
		}
		c.Store.URL = v
		return nil
	}},
	{"store.job", "", "name of the training run (required with store.url): the same on every instance of one run, different for every run; at most 256 bytes (255 with a file:// store), no slashes or control characters", func(c *Config, v string) error {
		if v == "" {
			c.Store.Job = ""
			return nil
		}
		if err := checkJob(v); err != nil {
			return err
		}
		if err := checkpoint.ValidName(v); err != nil {
			return fmt.Errorf("want the run's name, one plain path element: %w", err)
		}
		c.Store.Job = v
		return nil
	}},
	{"store.part_size", "64MiB", "the largest multipart part for S3 (5MiB to 5GiB): a file goes in parts of 8MiB up to this, 16 of them where those sizes allow (finer, down to 5MiB, for the last file a notice waits for); parts are read straight from the file, not buffered", func(c *Config, v string) error {
		n, err := ParseSize(v)
		if err != nil {
			return err
		}
		if n < 5<<20 || n > 5<<30 {
			return errors.New("want between 5MiB and 5GiB")
		}
		c.Store.PartSize = n
		return nil
	}},
	{"store.concurrency", "128", "the most S3 requests (parts, ranged reads) in flight (1 to 1024); the store starts at 4 (32 with a notice pending or for a restore) and grows while throughput grows, backing off on SlowDown: 128 × ~85 MB/s per connection fills a p5's 100 Gb/s", func(c *Config, v string) error {
		n, err := strconv.Atoi(v)
		if err != nil || n < 1 || n > 1024 {
			return errors.New("want a whole number from 1 to 1024")
		}
		c.Store.Concurrency = n
		return nil
	}},
	{"store.node_rank", "0", "this node's part of a multi-node job's checkpoints, 0 to store.world_nodes-1: the node rank torchrun gets (static, not from a dynamic rendezvous)", func(c *Config, v string) error {
		n, err := strconv.Atoi(v)
		if err != nil || n < 0 {
			return errors.New("want a whole number, 0 or more")
		}
		c.Store.NodeRank = n
		return nil
	}},
	{"store.world_nodes", "1", "nodes whose parts make one checkpoint (torchrun --nnodes); 1: a single-node job, the layout and behaviour of one agent alone", func(c *Config, v string) error {
		n, err := strconv.Atoi(v)
		if err != nil || n < 1 || n > 4096 {
			return errors.New("want a whole number from 1 to 4096")
		}
		c.Store.WorldNodes = n
		return nil
	}},
	{"store.part_wait", "1h", "multi-node: how long an agent keeps trying to complete a checkpoint whose other nodes' parts are not all in; parts that never made one are deleted after twice this", func(c *Config, v string) error {
		d, err := parseDuration(v)
		if err != nil {
			return err
		}
		if d < time.Minute || d > 7*24*time.Hour {
			return errors.New("want 1m to 168h")
		}
		c.Store.PartWait = d
		return nil
	}},
	{"store.sse", "", "server-side encryption of every object written to an s3:// store: empty (the bucket's default encryption), AES256 (SSE-S3) or aws:kms (SSE-KMS); see docs/s3.md", func(c *Config, v string) error {
		c.Store.SSE = ""
		if err := checkpoint.CheckSSE(v, ""); err != nil {
			return errors.New("want empty, AES256 or aws:kms")
		}
		c.Store.SSE = v
		return nil
	}},
	{"store.kms_key_id", "", "the KMS key of store.sse aws:kms: key ID, key ARN, alias/NAME or alias ARN; empty: the AWS managed key aws/s3, not the bucket's default key (for that, leave store.sse empty)", func(c *Config, v string) error {
		c.Store.KMSKeyID = ""
		if err := checkpoint.CheckSSE(checkpoint.SSEKMS, v); err != nil {
			return errors.New("want a key ID, key ARN, alias/NAME or alias ARN, without spaces")
		}
		c.Store.KMSKeyID = v
		return nil
	}},
	{"http.listen", "127.0.0.1:9402", "host:port (port 0 to 65535) of the local /healthz, /status, /metrics and POST /notice listener, which has no authentication (a warning off loopback); empty disables it", func(c *Config, v string) error {
		if v != "" {
			if err := checkListen(v); err != nil {
				return err
			}
		}
		c.HTTP.Listen = v
		return nil
	}},
	{"http.pprof", "false", "also serve Go's profiles (CPU, heap, goroutines) under /debug/pprof/ on http.listen, to measure the agent's cost; anyone who can reach the listener can read them", boolKey(func(c *Config) *bool { return &c.HTTP.PProf })},
	{"agent.runtime_dir", "/run/spotguard", "directory for runtime state: notice.json, and the upload journal that lets a restarted agent resume its commits; one agent per directory (`agent.lock`); an absolute path, not inside checkpoint.dir, owned by the agent's user or root and not writable by group or others (the agent does not start on one another user may write)", func(c *Config, v string) error {
		if v == "" {
			return errors.New("must not be empty")
		}
		c.Agent.RuntimeDir = v
		if !filepath.IsAbs(v) {
			return errRelativePath
		}
		return nil
	}},
	{"agent.stop_budget", "140s", "how long a stop (SIGTERM) may go on committing (0s to 1h): the checkpoint the trainer was signalled for and every complete one not committed yet (0s: stop at once, with a warning naming the complete checkpoints left); keep it under the unit's TimeoutStopSec", func(c *Config, v string) error {
		d, err := parseDuration(v)
		if err == nil && (d < 0 || d > time.Hour) {
			err = errors.New("between 0s and 1h")
		}
		c.Agent.StopBudget = d
		return err
	}},
	{"gpu.sample_interval", "5s", "how often every GPU is sampled through NVML (at least 1s)", func(c *Config, v string) error {
		d, err := parseDuration(v)
		if err == nil && d < time.Second {
			err = errors.New("at least 1s")
		}
		c.GPU.SampleInterval = d
		return err
	}},
	{"gpu.degraded_threshold", "0.10", "a GPU more than this fraction below its peers' median (SM and memory clocks under comparable load, peak memory bandwidth) is degraded", func(c *Config, v string) error {
		f, err := strconv.ParseFloat(v, 64)
		if err != nil || !(f > 0 && f < 1) { // NaN too
			return errors.New("want a fraction between 0 and 1, e.g. 0.10")
		}
		c.GPU.DegradedThreshold = f
		return nil
	}},
	{"metrics.cloudwatch", "true", "send metrics to CloudWatch (credentials and region from the AWS SDK chain, e.g. the instance profile)", boolKey(func(c *Config) *bool { return &c.Metrics.CloudWatch })},
	{"metrics.cloudwatch_interval", "60s", "how often buffered metrics are sent to CloudWatch (GPU series as statistic sets); a notice flushes at once", func(c *Config, v string) error {
		d, err := parseDuration(v)
		if err == nil && d < time.Second {
			err = errors.New("at least 1s")
		}
		c.Metrics.CloudWatchInterval = d
		return err
	}},
	{"metrics.cloudwatch_per_gpu", "false", "also send every GPU reading to CloudWatch per GPU (dimension GPU): 14 more metrics per GPU, 16 with GPM (Hopper and newer), each billed; constants only when they change; see docs/metrics.md", boolKey(func(c *Config) *bool { return &c.Metrics.CloudWatchPerGPU })},
	{"metrics.cloudwatch_aggregate", AggregateInstanceType, "dimension sets without InstanceId that the default CloudWatch series are also sent with, for alarms across instances: InstanceType (one series per instance type), Region (one for every instance in the region), both as InstanceType,Region, or none", func(c *Config, v string) error {
		sets, err := parseAggregate(v)
		c.Metrics.CloudWatchAggregate = sets
		return err
	}},
	{"metrics.namespace", "SpotGuard", "CloudWatch namespace: at most 255 ASCII letters, digits, spaces and `. - _ / # :`, not beginning with `AWS/`", func(c *Config, v string) error {
		if err := checkNamespace(v); err != nil {
			return err
		}
		c.Metrics.Namespace = v
		return nil
	}},
	{"log.level", "info", "debug, info, warn or error", func(c *Config, v string) error {
		switch v {
		case "debug", "info", "warn", "error":
		default:
			return errors.New("want debug, info, warn or error")
		}
		lvl, err := zerolog.ParseLevel(v)
		c.Log.Level = lvl
		return err
	}},
}

// The dimension sets of metrics.cloudwatch_aggregate: the default CloudWatch series are sent
// once with the instance's dimensions and once more per set named.
const (
	// AggregateInstanceType keeps the dimension InstanceType alone: one series per instance
	// type, gathering every instance of that type.
	AggregateInstanceType = "InstanceType"
	// AggregateRegion keeps no instance dimension: one series for every instance in the
	// account and region that sends to metrics.namespace.
	AggregateRegion = "Region"
)

// aggregateSets are the base dimensions each aggregate dimension set keeps.
var aggregateSets = map[string][]string{
	AggregateInstanceType: {"InstanceType"},
	AggregateRegion:       {},
}

// parseAggregate reads metrics.cloudwatch_aggregate: none, or a comma list of dimension sets,
// each once.
func parseAggregate(v string) ([]string, error) {
	const want = "want InstanceType, Region, a comma list of them (InstanceType,Region) or none"
	if strings.TrimSpace(v) == "none" {
		return nil, nil
	}
	if strings.TrimSpace(v) == "" {
		return nil, errors.New("empty: " + want)
	}
	var out []string
	for part := range strings.SplitSeq(v, ",") {
		name := strings.TrimSpace(part)
		switch _, known := aggregateSets[name]; {
		case name == "none":
			return nil, errors.New("none stands alone: " + want)
		case name == "":
			return nil, errors.New("an empty dimension set in the list: " + want)
		case !known:
			return nil, fmt.Errorf("unknown dimension set %q (names are case-sensitive): %s", name, want)
		case slices.Contains(out, name):
			return nil, fmt.Errorf("%s listed twice", name)
		}
		out = append(out, name)
	}
	return out, nil
}

// AggregateDimensions returns the base dimensions each set of metrics.cloudwatch_aggregate
// keeps, for metrics.CloudWatchConfig.Aggregate; nil for none.
func (c *Config) AggregateDimensions() [][]string {
	var out [][]string
	for _, name := range c.Metrics.CloudWatchAggregate {
		out = append(out, slices.Clone(aggregateSets[name]))
	}
	return out
}

func policySetter(src imds.Source) func(*Config, string) error {
	return func(c *Config, v string) error {
		switch p := Policy(v); p {
		case PolicyCheckpoint, PolicyIgnore, PolicyOff:
			c.Notices[src] = p
			return nil
		}
		return errors.New("want checkpoint, ignore or off")
	}
}

// ParseSize reads a whole, positive byte size such as 64MiB, 8MB, 1GiB or 1048576 (the units
// of checkpoint.ParseBytes).
func ParseSize(v string) (int64, error) {
	f, err := checkpoint.ParseBytes(v, false)
	if err != nil || f != math.Trunc(f) || f > math.MaxInt64 {
		return 0, errors.New("not a whole, positive size (want e.g. 64MiB, 8MB or 1048576)")
	}
	return int64(f), nil
}

// parsePollInterval reads an IMDS poll interval, MinPollInterval to MaxPollInterval.
func parsePollInterval(v string) (time.Duration, error) {
	d, err := parseDuration(v)
	if err == nil && (d < MinPollInterval || d > MaxPollInterval) {
		err = fmt.Errorf("want %s to %s: a spot notice gives 2 minutes, and polling must see it early", MinPollInterval, MaxPollInterval)
	}
	return d, err
}

// checkEndpoint accepts an absolute http or https URL with a host and nothing after it but a
// path.
func checkEndpoint(v string) error {
	if v != "" && !strings.Contains(v, "://") {
		// 127.0.0.1:1338 did not parse, and the error did not say why (found from outside).
		return fmt.Errorf("want an http:// or https:// URL: http://%s?", v)
	}
	u, err := url.Parse(v)
	switch {
	case err != nil:
		return fmt.Errorf("not a URL: %w", err)
	case u.Scheme != "http" && u.Scheme != "https":
		return errors.New("want an http:// or https:// URL, e.g. http://169.254.169.254")
	case u.Host == "":
		return errors.New("want a host, e.g. http://169.254.169.254")
	case u.RawQuery != "" || u.Fragment != "" || u.User != nil:
		return errors.New("want no user, query or fragment")
	}
	if p := u.Port(); p != "" || strings.HasSuffix(u.Host, ":") {
		if n, err := strconv.Atoi(p); err != nil || n < 1 || n > 65535 {
			return fmt.Errorf("port %q: want 1 to 65535", p)
		}
	}
	return nil
}

// errRelativePath is the problem of a relative checkpoint.dir or agent.runtime_dir.
var errRelativePath = errors.New("must be an absolute path: a relative one is taken from the working directory, which is / under systemd")

// maxJobBytes bounds store.job: it begins every key the agent writes (JOB/CHECKPOINT/COMMIT/FILE,
// under the store's prefix), and S3 keys are at most 1024 bytes.
const maxJobBytes = 256

// maxFileName is the longest file name Linux's file systems take (NAME_MAX): a file:// store's
// directory of store.job.
const maxFileName = 255

// checkJob refuses a store.job that makes no good key (checkpoint.ValidName then refuses
// slashes and reserved names): not UTF-8, only white space, with control characters (a newline, a tab, DEL, C1) or
// U+FFFE or U+FFFF, or
// longer than maxJobBytes.
func checkJob(v string) error {
	switch {
	case !utf8.ValidString(v):
		return errors.New("not valid UTF-8")
	case strings.TrimSpace(v) == "":
		return errors.New("want a name, not only white space")
	case strings.ContainsFunc(v, unicode.IsControl):
		return errors.New("must not contain control characters (such as a newline or a tab)")
	case strings.ContainsAny(v, "\uFFFE\uFFFF"):
		return errors.New("must not contain U+FFFE or U+FFFF (S3's XML lists cannot carry them)")
	case len(v) > maxJobBytes:
		return fmt.Errorf("%d bytes long: want at most %d (it begins every key in the store, and an S3 key is at most 1024 bytes)", len(v), maxJobBytes)
	case strings.HasPrefix(v, ".spotguard-"):
		return errors.New("names beginning with .spotguard- are spotguard's own (a file:// store's temporary files, a restore's staging)")
	}
	return nil
}

// checkNamespace refuses a CloudWatch namespace that CloudWatch refuses (every PutMetricData
// would fail): empty or only spaces, longer than 255 characters, AWS's own (AWS/), or with a
// character other than ASCII letters, digits, space and . - _ / # :.
func checkNamespace(v string) error {
	switch {
	case strings.TrimSpace(v) == "":
		return errors.New("want a namespace, not only white space")
	case len(v) > 255:
		return fmt.Errorf("%d characters long: CloudWatch takes at most 255", len(v))
	case strings.HasPrefix(v, "AWS/"):
		return errors.New("namespaces beginning with AWS/ are AWS's own")
	}
	if i := strings.IndexFunc(v, func(r rune) bool {
		return !(r >= 'a' && r <= 'z' || r >= 'A' && r <= 'Z' || r >= '0' && r <= '9' || strings.ContainsRune(" .-_/#:", r))
	}); i >= 0 {
		r, _ := utf8.DecodeRuneInString(v[i:])
		return fmt.Errorf("%q is not a character CloudWatch takes in a namespace: ASCII letters, digits, space and . - _ / # :", r)
	}
	return nil
}

// checkListen accepts what http.listen's net.Listen("tcp", v) can listen on, as far as its form
// goes: host:port with a port number from 0 to 65535 (0: any free port). A service name or an
// empty port, which net.Listen would take, is refused too.
func checkListen(v string) error {
	_, port, err := net.SplitHostPort(v)
	if err != nil {
		return fmt.Errorf("not host:port: %w", err)
	}
	if _, err := strconv.ParseUint(port, 10, 16); err != nil {
		return fmt.Errorf("port %q: want a number from 0 to 65535", port)
	}
	return nil
}

// isLoopbackHost reports whether host (of host:port) is a loopback address or localhost; an
// empty host (every address) or any other name is not.
func isLoopbackHost(host string) bool {
	if strings.EqualFold(strings.TrimSuffix(host, "."), "localhost") {
		return true
	}
	ip, err := netip.ParseAddr(host)
	return err == nil && ip.IsLoopback()
}

func parseDuration(v string) (time.Duration, error) {
	d, err := time.ParseDuration(v)
	if err != nil {
		return 0, fmt.Errorf("not a duration (want e.g. 1s or 500ms)")
	}
	return d, nil
}

// EnvName is the environment variable that overrides key ("imds.poll_interval" →
// "SPOTGUARD_IMDS_POLL_INTERVAL").
func EnvName(key string) string {
	return "SPOTGUARD_" + strings.ToUpper(strings.ReplaceAll(key, ".", "_"))
}

// Key describes one configuration key for documentation and flags.
type Key struct {
	Name    string // "section.key", also the flag name
	Default string
	Env     string
	Help    string
}

// Keys lists every configuration key in documentation order.
func Keys() []Key {
	keys := make([]Key, len(fields))
	for i, f := range fields {
		keys[i] = Key{Name: f.key, Default: f.def, Env: EnvName(f.key), Help: f.help}
	}
	return keys
}

// defaultOf returns the default of key, a name in fields.
func defaultOf(key string) string {
	i := slices.IndexFunc(fields, func(f field) bool { return f.key == key })
	return fields[i].def
}

// LoadOptions says where Load takes its values from.
type LoadOptions struct {
	// Path is the YAML file. If it is DefaultConfigPath and does not exist, defaults are used.
	Path string
	// Environ is the process environment as "KEY=value" strings.
	Environ []string
	// Flags are overrides by key name, applied last, in order.
	Flags []KeyValue
}

// KeyValue is one flag override.
type KeyValue struct{ Key, Value string }

// Load builds a Config from defaults, the YAML file, SPOTGUARD_* variables and flags, later ones
// winning. It returns an error only when the file cannot be read at all; every problem with a
// value (unknown keys, bad durations, …) is kept for Validate, so all of them can be reported at
// once.
func Load(opts LoadOptions) (*Config, error) {
	c := &Config{Notices: map[imds.Source]Policy{}, values: map[string]setting{}}
	byKey := map[string]field{}
	for _, f := range fields {
		byKey[f.key] = f
		c.apply(f, f.def, "default")
	}

	if opts.Path != "" {
		data, err := readConfigFile(opts.Path)
		switch {
		case errors.Is(err, os.ErrNotExist) && opts.Path == DefaultConfigPath:
			// No file at the default place: defaults, environment and flags only.
		case err != nil:
			return nil, fmt.Errorf("read config: %w", err)
		default:
			c.file = opts.Path
			c.loadYAML(data, opts.Path, byKey)
		}
	}

	envByName := map[string]field{}
	for _, f := range fields {
		envByName[EnvName(f.key)] = f
	}
	for _, kv := range opts.Environ {
		name, value, ok := strings.Cut(kv, "=")
		if !ok || !strings.HasPrefix(name, "SPOTGUARD_") {
			continue
		}
		f, known := envByName[name]
		if !known {
			c.problems = append(c.problems, fmt.Errorf("%s: unknown environment variable (no such config key)", name))
			continue
		}
		c.apply(f, value, name)
	}

	for _, kv := range opts.Flags {
		f, known := byKey[kv.Key]
		if !known {
			c.problems = append(c.problems, fmt.Errorf("--%s: unknown config key", kv.Key))
			continue
		}
		c.apply(f, kv.Value, "--"+kv.Key)
	}
	return c, nil
}

// apply sets one key, recording a problem that names the key and the value's origin.
func (c *Config) apply(f field, value, origin string) {
	c.values[f.key] = setting{value: value, origin: origin}
	if err := f.set(c, value); err != nil {
		c.problems = append(c.problems, fmt.Errorf("%s: %q from %s: %w", f.key, redactURL(value), origin, err))
	}
}

// loadYAML reads a two-level mapping (section → key → scalar), one YAML document.
func (c *Config) loadYAML(data []byte, path string, byKey map[string]field) {
	dec := yaml.NewDecoder(bytes.NewReader(data))
	var doc yaml.Node
	if err := dec.Decode(&doc); errors.Is(err, io.EOF) {
		return // empty file
	} else if err != nil {
		hint := ""
		if strings.Contains(err.Error(), "did not find expected alphabetic or numeric character") || strings.Contains(err.Error(), "found character that cannot start any token") {
			// An alias to YAML: pattern: *.pt (found from outside, with the docs' own example).
			hint = " (a value that begins with *, &, !, |, >, % or @ must be quoted: pattern: '*.pt')"
		}
		c.fileProblem(fmt.Errorf("%s: not valid YAML: %w%s", path, err, hint))
		c.fileUnread = true
		return
	}
	var more yaml.Node
	if err := dec.Decode(&more); !errors.Is(err, io.EOF) {
		line := 0
		if err == nil {
			line = more.Line
		}
		// A parser that reads the first document alone would drop the rest unread.
		c.fileProblem(fmt.Errorf("%s: holds more than one YAML document (a line --- or ... ends the first; the next begins near line %d): "+
			"put every section in one", path, line))
	}
	if len(doc.Content) == 0 {
		return // empty document
	}
	root := doc.Content[0]
	if root.Kind != yaml.MappingNode {
		c.fileProblem(fmt.Errorf("%s: want a mapping of sections at the top level", path))
		c.fileUnread = true
		return
	}
	sections, keys := map[string]int{}, map[string]int{}
	// misspelt are the keys that a misspelt section or key likely meant: their values were not
	// read (unless the file sets them too), which InvalidKeys says.
	var misspelt []string
	defer func() {
		for _, key := range misspelt {
			if keys[key] == 0 {
				c.unread = append(c.unread, key)
			}
		}
	}()
	for i := 0; i+1 < len(root.Content); i += 2 {
		section, body := root.Content[i].Value, root.Content[i+1]
		if first, dup := sections[section]; dup {
			// YAML forbids it, and a parser that merges the two silently would keep one half.
			c.fileProblem(fmt.Errorf("%s: section %s appears twice (lines %d and %d): merge them into one",
				path, section, first, root.Content[i].Line))
			continue
		}
		sections[section] = root.Content[i].Line
		if !knownSection(section) {
			meant := closestName(section, configSections())
			hint := ""
			if meant != "" {
				hint = "; did you mean " + meant + "?"
				if body.Kind == yaml.MappingNode {
					for j := 0; j+1 < len(body.Content); j += 2 {
						if key := meant + "." + body.Content[j].Value; isKey(key) {
							misspelt = append(misspelt, key)
						}
					}
				}
			}
			c.fileProblem(fmt.Errorf("%s: unknown section %s (line %d): the sections are %s%s", path, shownName(section),
				root.Content[i].Line, strings.Join(configSections(), ", "), hint))
			continue
		}
		if body.Kind != yaml.MappingNode {
			if body.Tag == "!!null" {
				continue // "section:" with nothing under it
			}
			c.fileProblem(fmt.Errorf("%s: %s (line %d): want a mapping of keys", path, section, body.Line))
			continue
		}
		for j := 0; j+1 < len(body.Content); j += 2 {
			k, v := body.Content[j], body.Content[j+1]
			key := section + "." + k.Value
			if first, dup := keys[key]; dup {
				c.problems = append(c.problems, fmt.Errorf("%s: set twice (%s lines %d and %d): keep one", key, path, first, k.Line))
				continue
			}
			keys[key] = k.Line
			f, known := byKey[key]
			switch {
			case !known && k.Value == "<<":
				c.problems = append(c.problems, fmt.Errorf("%s: YAML merge keys (<<: *anchor) are not supported (%s line %d): write each key", key, path, k.Line))
				continue
			case !known:
				hint := ""
				if meant := closestName(k.Value, sectionKeys(section)); meant != "" {
					hint = "; did you mean " + section + "." + meant + "?"
					misspelt = append(misspelt, section+"."+meant)
				}
				c.problems = append(c.problems, fmt.Errorf("%s: unknown key (%s line %d)%s", shownName(key), path, k.Line, hint))
				continue
			case v.Kind == yaml.AliasNode:
				c.problems = append(c.problems, fmt.Errorf("%s: YAML anchors and aliases (*name) are not supported (%s line %d): write the value; one that begins with * is quoted ('*.pt')", key, path, v.Line))
				continue
			case v.Kind != yaml.ScalarNode:
				c.problems = append(c.problems, fmt.Errorf("%s: want a single value (%s line %d)", key, path, v.Line))
				continue
			case strings.HasPrefix(v.Tag, "!") && !strings.HasPrefix(v.Tag, "!!"):
				// marker: !done is a tag and an empty value to YAML (found from outside).
				c.problems = append(c.problems, fmt.Errorf("%s: %s is a YAML tag (%s line %d): quote a value that begins with ! ('%s')", key, v.Tag, path, v.Line, v.Tag))
				continue
			}
			value := v.Value
			if v.Tag == "!!null" {
				value = ""
			}
			c.apply(f, value, fmt.Sprintf("%s:%d", path, v.Line))
		}
	}
}

// shownName is a section or key name for a problem: quoted when it holds what cannot be seen (a
// byte-order mark in the middle of a file, two files joined; found from outside).
func shownName(name string) string {
	for _, r := range name {
		if !unicode.IsPrint(r) || r == '\ufeff' {
			return strconv.Quote(name)
		}
	}
	return name
}

// fileProblem records a problem with the config file as a whole (not YAML, an unknown section),
// which any command reading the file reports, whatever keys it needs.
func (c *Config) fileProblem(err error) {
	c.problems = append(c.problems, err)
	c.fileProblems = append(c.fileProblems, err)
}

// errJobRequired is the problem of a store without a job.
var errJobRequired = errors.New("store.job: required with store.url: set it to the training run's name " +
	"(the same on every instance of the run, different for every run), so that another run's checkpoints are never taken for this one's")

// Validate reports every problem with the configuration at once, each naming its key: values that
// did not parse, unknown keys, and rules across keys. It returns nil for a config the daemon can
// run with.
func (c *Config) Validate() error {
	problems := append([]error(nil), c.problems...)
	failed := problemKeys(c.problems)
	off := 0
	for _, p := range c.Notices {
		if p == PolicyOff {
			off++
		}
	}
	if off == len(imds.Sources) {
		problems = append(problems, errors.New("notices: every source is off, so there is nothing to watch"))
	}
	// A file that could not be read leaves every key of it unknown: what it lacks is not said.
	if c.Trainer.PIDFile == "" && c.Trainer.Unit == "" && c.Trainer.Match == nil && c.Trainer.Container == "" && !failed["trainer.match"] && !failed["trainer.container"] && !c.fileUnread {
		problems = append(problems, errors.New("trainer: no way to find the trainer: set trainer.pidfile, trainer.unit, trainer.match or trainer.container"))
	}
	if c.Checkpoint.Dir != "" && !failed["checkpoint.dir"] {
		// One that does not exist yet is waited for: the trainer creates it.
		if err := checkReadableDir(c.Checkpoint.Dir); err != nil && !errors.Is(err, fs.ErrNotExist) {
			problems = append(problems, fmt.Errorf("checkpoint.dir: %s %w", c.valueFrom("checkpoint.dir"), err))
		}
	}
	problems = append(problems, c.ownWritesProblems(failed)...)
	if c.Store.URL != "" && c.Store.Job == "" && !failed["store.job"] {
		problems = append(problems, errJobRequired)
	}
	switch {
	case c.Store.URL != "" && c.Checkpoint.Dir == "" && !failed["checkpoint.dir"]:
		problems = append(problems, errors.New("checkpoint.dir: must be set when store.url is (the directory to upload from)"))
	case c.Store.URL == "" && c.Checkpoint.Dir != "" && !failed["store.url"]:
		problems = append(problems, errors.New("store.url: must be set when checkpoint.dir is (where to upload to)"))
	}
	if c.Store.NodeRank >= c.Store.WorldNodes && !failed["store.node_rank"] && !failed["store.world_nodes"] {
		problems = append(problems, fmt.Errorf("store.node_rank: %s must be less than store.world_nodes %s: ranks are 0 to %d",
			c.valueFrom("store.node_rank"), c.valueFrom("store.world_nodes"), c.Store.WorldNodes-1))
	}
	problems = append(problems, c.storeProblems(failed)...)
	if c.Checkpoint.Marker == "" && !failed["checkpoint.marker"] {
		problems = append(problems, fmt.Errorf("checkpoint.marker: %s must be a plain file name", c.valueFrom("checkpoint.marker")))
	}
	return errors.Join(problems...)
}

// InvalidKeys returns the keys whose values did not load (each named by a problem of
// LoadProblems), and those that a misspelt section or key in the file likely meant (chekpoint:
// dir: is checkpoint.dir): what a check would see of them is their default, not what was meant.
func (c *Config) InvalidKeys() map[string]bool {
	keys := problemKeys(c.problems)
	for _, k := range c.unread {
		keys[k] = true
	}
	return keys
}

// problemKeys returns what each of problems names first, before its colon: a key, a variable,
// or the file.
func problemKeys(problems []error) map[string]bool {
	keys := map[string]bool{}
	for _, p := range problems {
		if k, _, ok := strings.Cut(p.Error(), ":"); ok {
			keys[k] = true
		}
	}
	return keys
}

// FileUnread reports whether the config file was there but not a YAML mapping of sections (it
// does not parse, or holds a list or a scalar), so that none of its keys was read: the effective
// values are then the defaults and the environment's, not what the file meant to set.
func (c *Config) FileUnread() bool {
	return c.fileUnread
}

// LoadProblems returns the problems met while loading (a file that is not valid YAML, a
// duplicate or unknown key, a value that does not parse), without the checks across keys that
// Validate adds; Validate reports them too.
func (c *Config) LoadProblems() []error {
	return slices.Clone(c.problems)
}

// Warning is something allowed but risky in a configuration: Text names its key and says what
// the risk is; Fix says what to do about it.
type Warning struct {
	Text string
	Fix  string
}

// Warnings lists what is allowed but risky, each naming its key: polling so slow that a good
// part of a spot notice's 2 minutes goes by before it is seen, and a listener (which has no
// authentication) on an address that is not loopback.
func (c *Config) Warnings() []Warning {
	var w []Warning
	if host, _, err := net.SplitHostPort(c.HTTP.Listen); err == nil && !isLoopbackHost(host) {
		what := "read /status and /metrics and POST /notice"
		if c.HTTP.PProf {
			what = "read /status, /metrics and Go's profiles (/debug/pprof/) and POST /notice"
		}
		w = append(w, Warning{
			Text: fmt.Sprintf("http.listen: %s: not a loopback address, and the listener has no authentication: whoever can reach it can %s", c.HTTP.Listen, what),
			Fix:  "keep http.listen on 127.0.0.1 (the default) or [::1]",
		})
	}
	if c.Store.WorldNodes > 1 && c.Checkpoint.Marker == ".metadata" {
		w = append(w, Warning{
			Text: fmt.Sprintf("checkpoint.marker: .metadata with store.world_nodes %d: DCP writes .metadata on node 0 only, so the other nodes' saves never complete and no job checkpoint is ever committed", c.Store.WorldNodes),
			Fix:  "set checkpoint.marker to _COMPLETE on every node, written by each node's local rank 0 once dcp.save returns (docs/multinode.md)",
		})
	}
	for _, p := range []struct {
		key, what string
		d         time.Duration
	}{
		// imds.spot_poll_interval polls the spot notice; imds.poll_interval the others.
		{"imds.poll_interval", "a rebalance recommendation, a scheduled event or an ASG termination may be seen %s late (an ASG termination gives 2 minutes too)", c.IMDS.PollInterval},
		{"imds.spot_poll_interval", "a spot notice may be seen %s late, out of the 2 minutes it gives", c.IMDS.SpotPollInterval},
	} {
		if p.d > WarnPollInterval && p.d <= MaxPollInterval { // above it, a problem
			w = append(w, Warning{
				Text: fmt.Sprintf("%s: %s: "+p.what, p.key, p.d, p.d),
				Fix:  fmt.Sprintf("set %s to %s (the default) or less", p.key, defaultOf(p.key)),
			})
		}
	}
	return w
}

// UnitWarnings lists what goes wrong only under the shipped units (spotguard.service and
// spotguard-restore.service), each naming its key: a checkpoint.dir or a file:// store under /tmp
// or /var/tmp, which PrivateTmp=yes gives each unit a private copy of, where the trainer's
// checkpoints never appear (found from outside: nothing said so but hardening.md).
func (c *Config) UnitWarnings() []Warning {
	var w []Warning
	private := func(p string) bool {
		p = filepath.Clean(p)
		return p == "/tmp" || p == "/var/tmp" || strings.HasPrefix(p, "/tmp/") || strings.HasPrefix(p, "/var/tmp/")
	}
	if d := c.Checkpoint.Dir; d != "" && filepath.IsAbs(d) && private(d) {
		w = append(w, Warning{
			Text: fmt.Sprintf("checkpoint.dir: %s is under /tmp or /var/tmp: under spotguard.service (PrivateTmp=yes) the agent has a /tmp of its own, where the trainer's checkpoints never appear", d),
			Fix:  "put checkpoint.dir elsewhere (a disk, or the trainer's home); outside the unit this does not matter",
		})
	}
	if d := c.Agent.RuntimeDir; filepath.IsAbs(d) && private(d) {
		w = append(w, Warning{
			Text: fmt.Sprintf("agent.runtime_dir: %s is under /tmp or /var/tmp: under spotguard.service (PrivateTmp=yes) the agent has a /tmp of its own, so a trainer reading %s there never finds it", d, NoticeFile),
			Fix:  "leave agent.runtime_dir at /run/spotguard; outside the unit this does not matter",
		})
	}
	if scheme, _, root, err := checkpoint.ParseStoreURL(c.Store.URL); err == nil && scheme == "file" && private(root) {
		w = append(w, Warning{
			Text: fmt.Sprintf("store.url: %s is under /tmp or /var/tmp: spotguard.service and spotguard-restore.service (PrivateTmp=yes) each have a /tmp of their own, so the restore would not find what the agent committed", c.Store.URL),
			Fix:  "put a file:// store elsewhere (a shared file system, with ReadWritePaths=); outside the units this does not matter",
		})
	}
	return w
}

// ValidateStore reports the problems that matter to a command that only reads the store
// (restore, list): the store.* and log.* keys, imds.endpoint (the region comes through it), the
// other keys the command reads (uses, by name), and store.url being set. (Found from outside: a
// restore took a relative checkpoint.dir from its working directory, and dropped a trainer.user
// that does not exist and a checkpoint.marker with a slash for the default, where run refused
// them.)
func (c *Config) ValidateStore(uses ...string) error {
	var problems []error
	for _, p := range c.problems {
		text := p.Error()
		key, _, _ := strings.Cut(text, ":")
		if strings.HasPrefix(text, "store.") || strings.HasPrefix(text, "log.") || strings.HasPrefix(text, "SPOTGUARD_") ||
			key == "imds.endpoint" || slices.Contains(uses, key) || slices.Contains(c.fileProblems, p) {
			problems = append(problems, p)
		}
	}
	if c.Store.URL == "" {
		problems = append(problems, errors.New("store.url: not set: where are the checkpoints? (s3://bucket/prefix or file:///path)"))
	}
	if c.Store.Job == "" && !slices.ContainsFunc(problems, func(p error) bool { return strings.HasPrefix(p.Error(), "store.job") }) {
		problems = append(problems, errJobRequired)
	}
	problems = append(problems, c.storeProblems(problemKeys(problems))...)
	return errors.Join(problems...)
}

// storeProblems reports store.sse and store.kms_key_id that contradict each other or the store,
// and a store.job too long for a file:// store, leaving out keys whose values did not parse
// (failed).
func (c *Config) storeProblems(failed map[string]bool) []error {
	var problems []error
	if c.Store.KMSKeyID != "" && c.Store.SSE != checkpoint.SSEKMS && !failed["store.sse"] && !failed["store.kms_key_id"] {
		problems = append(problems, fmt.Errorf("store.kms_key_id: %s is only for store.sse aws:kms; store.sse is %s",
			c.valueFrom("store.kms_key_id"), c.valueFrom("store.sse")))
	}
	if c.Store.SSE != "" && c.Store.URL != "" && !strings.HasPrefix(c.Store.URL, "s3://") && !failed["store.url"] {
		problems = append(problems, fmt.Errorf("store.sse: %s is only for an s3:// store; store.url is %s", c.Store.SSE, c.Store.URL))
	}
	if len(c.Store.Job) > maxFileName && strings.HasPrefix(c.Store.URL, "file://") && !failed["store.job"] && !failed["store.url"] {
		problems = append(problems, fmt.Errorf("store.job: %d bytes long: a file:// store keeps it as a directory name, at most %d bytes (store.url %s)",
			len(c.Store.Job), maxFileName, c.valueFrom("store.url")))
	}
	return problems
}

// S3Options are the options of the store that store.* configure, for every command that opens
// it: part size, concurrency and server-side encryption.
func (c *Config) S3Options() checkpoint.S3Options {
	return checkpoint.S3Options{
		PartSize:    c.Store.PartSize,
		Concurrency: c.Store.Concurrency,
		SSE:         c.Store.SSE,
		KMSKeyID:    c.Store.KMSKeyID,
	}
}

// ownWritesProblems reports what would have the agent upload what it writes itself (I4): a
// file:// store or agent.runtime_dir at or inside checkpoint.dir, and a checkpoint.dir at or
// inside the directory a file:// store writes the job into. Paths are compared cleaned, and again
// with the symlinks of their existing part resolved. Keys whose values did not parse (failed)
// are left out.
func (c *Config) ownWritesProblems(failed map[string]bool) []error {
	if c.Checkpoint.Dir == "" || failed["checkpoint.dir"] {
		return nil
	}
	var problems []error
	if !failed["agent.runtime_dir"] {
		if how, detail, ok := pathWithin(c.Agent.RuntimeDir, c.Checkpoint.Dir); ok {
			problems = append(problems, fmt.Errorf("agent.runtime_dir: %s %s checkpoint.dir %s%s: the agent would upload its own notice.json and upload journal; put agent.runtime_dir outside checkpoint.dir",
				c.valueFrom("agent.runtime_dir"), how, c.valueFrom("checkpoint.dir"), detail))
		}
	}
	if c.Store.URL == "" || failed["store.url"] {
		return problems
	}
	scheme, _, root, err := checkpoint.ParseStoreURL(c.Store.URL)
	if err != nil || scheme != "file" {
		return problems
	}
	if how, detail, ok := pathWithin(root, c.Checkpoint.Dir); ok {
		problems = append(problems, fmt.Errorf("store.url: %s %s checkpoint.dir %s%s: the agent would upload its own store into itself; put the store outside checkpoint.dir",
			c.valueFrom("store.url"), how, c.valueFrom("checkpoint.dir"), detail))
	} else if c.Store.Job != "" && !failed["store.job"] {
		jobDir := filepath.Join(root, c.Store.Job)
		if how, detail, ok := pathWithin(c.Checkpoint.Dir, jobDir); ok {
			problems = append(problems, fmt.Errorf("checkpoint.dir: %s %s the store's directory of job %s, %s (store.url %s, store.job %s)%s: the agent would upload what it writes into the store; put checkpoint.dir elsewhere",
				c.valueFrom("checkpoint.dir"), how, c.Store.Job, jobDir, c.valueFrom("store.url"), c.valueFrom("store.job"), detail))
		}
	}
	return problems
}

// valueFrom is key's effective value, quoted, and where it came from: `"/data/ckpt" from
// /etc/spotguard/spotguard.yaml:12`.
func (c *Config) valueFrom(key string) string {
	s := c.values[key]
	return fmt.Sprintf("%q from %s", redactURL(s.value), s.origin)
}

// redactURL returns v with the password of a URL in it (scheme://user:password@host) replaced
// by xxxxx, for what is printed: `spotguard config` and problems go to terminals and the journal.
// Anything else is returned as it is.
func redactURL(v string) string {
	if !strings.Contains(v, "://") || !strings.Contains(v, "@") {
		return v
	}
	u, err := url.Parse(v)
	if err != nil || u.User == nil {
		return v
	}
	if _, ok := u.User.Password(); !ok {
		return v
	}
	return u.Redacted()
}

// pathWithin reports whether the absolute path child is parent or inside it, comparing them
// cleaned and, failing that, with the symlinks of their longest existing prefixes resolved. how
// is "is the same directory as" or "is inside"; detail, when only the resolved paths say so,
// names them (" (with symlinks resolved: A is inside B)"). A relative path is within nothing.
func pathWithin(child, parent string) (how, detail string, ok bool) {
	if !filepath.IsAbs(child) || !filepath.IsAbs(parent) {
		return "", "", false
	}
	child, parent = filepath.Clean(child), filepath.Clean(parent)
	if how, ok := pathRelation(child, parent); ok {
		return how, "", true
	}
	rc, rp := resolvedPath(child), resolvedPath(parent)
	if how, ok := pathRelation(rc, rp); ok {
		return how, fmt.Sprintf(" (with symlinks resolved: %s %s %s)", rc, how, rp), true
	}
	return "", "", false
}

// pathRelation compares two clean absolute paths.
func pathRelation(child, parent string) (string, bool) {
	switch {
	case child == parent:
		return "is the same directory as", true
	case parent == string(filepath.Separator) || strings.HasPrefix(child, parent+string(filepath.Separator)):
		return "is inside", true
	}
	return "", false
}

// resolvedPath is the clean absolute path p with the symlinks of its longest existing prefix
// resolved (filepath.EvalSymlinks); the rest, which does not exist yet, is kept as written.
func resolvedPath(p string) string {
	rest := ""
	for dir := p; ; {
		if r, err := filepath.EvalSymlinks(dir); err == nil {
			return filepath.Join(r, rest)
		}
		parent := filepath.Dir(dir)
		if parent == dir {
			return p
		}
		rest = filepath.Join(filepath.Base(dir), rest)
		dir = parent
	}
}

func checkReadableDir(dir string) error {
	f, err := os.Open(dir)
	if err != nil {
		return fmt.Errorf("cannot be read: %w", err)
	}
	defer f.Close()
	fi, err := f.Stat()
	if err != nil {
		return fmt.Errorf("cannot be read: %w", err)
	}
	if !fi.IsDir() {
		return errors.New("is not a directory")
	}
	if _, err := f.ReadDir(1); err != nil && !errors.Is(err, io.EOF) {
		return fmt.Errorf("cannot be listed: %w", err)
	}
	return nil
}

// Effective returns every key with its effective value and origin, sorted in documentation order,
// for `spotguard config`.
func (c *Config) Effective() []KeyValueOrigin {
	out := make([]KeyValueOrigin, 0, len(fields))
	for _, f := range fields {
		s := c.values[f.key]
		out = append(out, KeyValueOrigin{Key: f.key, Value: s.value, Origin: s.origin})
	}
	return out
}

// KeyValueOrigin is one effective setting.
type KeyValueOrigin struct{ Key, Value, Origin string }

// YAML renders the effective configuration as a YAML document, one comment per key saying where
// its value came from.
func (c *Config) YAML() string {
	var b strings.Builder
	section := ""
	for _, kv := range c.Effective() {
		sec, key, _ := strings.Cut(kv.Key, ".")
		if sec != section {
			if section != "" {
				b.WriteByte('\n')
			}
			fmt.Fprintf(&b, "%s:\n", sec)
			section = sec
		}
		val, _ := yaml.Marshal(redactURL(kv.Value))
		fmt.Fprintf(&b, "  %s: %s  # %s\n", key, strings.TrimSpace(string(val)), kv.Origin)
	}
	return b.String()
}

// Diff lists the keys whose effective values differ between c and other, sorted.
func (c *Config) Diff(other *Config) []string {
	var keys []string
	for _, f := range fields {
		if c.values[f.key].value != other.values[f.key].value {
			keys = append(keys, f.key)
		}
	}
	sort.Strings(keys)
	return keys
}

// configSections returns the configuration's sections (the part of each key before its dot), in
// the order of Keys.
func configSections() []string {
	var out []string
	for _, k := range Keys() {
		if sec, _, ok := strings.Cut(k.Name, "."); ok && !slices.Contains(out, sec) {
			out = append(out, sec)
		}
	}
	return out
}

// isKey reports whether key (section.name) is one of the configuration's.
func isKey(key string) bool {
	return slices.ContainsFunc(Keys(), func(k Key) bool { return k.Name == key })
}

// sectionKeys are the names of section's keys, without the section (dir, marker, ...).
func sectionKeys(section string) []string {
	var out []string
	for _, k := range Keys() {
		if sec, name, ok := strings.Cut(k.Name, "."); ok && sec == section {
			out = append(out, name)
		}
	}
	return out
}

// closestName returns the one of names that s most likely misspells: the same but for case, or
// at most two letters added, dropped, changed or swapped in a name of four or more (one in a
// shorter one); "" when none is, or two are as close.
func closestName(s string, names []string) string {
	best, bestD, tie := "", 3, false
	for _, n := range names {
		d := editDistance(strings.ToLower(s), n)
		limit := 2
		if len(n) < 4 {
			limit = 1
		}
		switch {
		case d > limit || d > bestD:
		case d == bestD:
			tie = true
		default:
			best, bestD, tie = n, d, false
		}
	}
	if tie {
		return ""
	}
	return best
}

// editDistance is the optimal string alignment distance between a and b (bytes): the letters
// added, dropped, changed, or two neighbours swapped, to make one the other.
func editDistance(a, b string) int {
	d := make([][]int, len(a)+1)
	for i := range d {
		d[i] = make([]int, len(b)+1)
		d[i][0] = i
	}
	for j := range d[0] {
		d[0][j] = j
	}
	for i := 1; i <= len(a); i++ {
		for j := 1; j <= len(b); j++ {
			cost := 1
			if a[i-1] == b[j-1] {
				cost = 0
			}
			d[i][j] = min(d[i-1][j]+1, d[i][j-1]+1, d[i-1][j-1]+cost)
			if i > 1 && j > 1 && a[i-1] == b[j-2] && a[i-2] == b[j-1] {
				d[i][j] = min(d[i][j], d[i-2][j-2]+1)
			}
		}
	}
	return d[len(a)][len(b)]
}

// knownSection reports whether section is one of the configuration's.
func knownSection(section string) bool { return slices.Contains(configSections(), section) }

// boolKey is the setter of a key that is true or false, into the field that field returns.
func boolKey(field func(c *Config) *bool) func(*Config, string) error {
	return func(c *Config, v string) error {
		b, err := strconv.ParseBool(v)
		if err != nil {
			return errors.New("want true or false")
		}
		*field(c) = b
		return nil
	}
}

// maxConfigSize bounds the configuration file: a few KiB in practice.
const maxConfigSize = 1 << 20

// readConfigFile reads the configuration file at path: a regular file of at most maxConfigSize
// bytes. A FIFO blocked every command for ever (SIGTERM too), and /dev/zero was read until memory
// ran out (found from outside).
func readConfigFile(path string) ([]byte, error) {
	f, err := os.OpenFile(path, os.O_RDONLY|syscall.O_NONBLOCK, 0)
	if err != nil {
		return nil, err
	}
	defer f.Close() // read only
	fi, err := f.Stat()
	if err != nil {
		return nil, err
	}
	if !fi.Mode().IsRegular() {
		what := "not a regular file"
		switch t := fi.Mode().Type(); {
		case t&fs.ModeDir != 0:
			what = "a directory"
		case t&fs.ModeNamedPipe != 0:
			what = "a named pipe"
		case t&(fs.ModeDevice|fs.ModeCharDevice) != 0:
			what = "a device"
		case t&fs.ModeSocket != 0:
			what = "a socket"
		}
		return nil, fmt.Errorf("%s is %s, not a configuration file", path, what)
	}
	data, err := io.ReadAll(io.LimitReader(f, maxConfigSize+1))
	if err != nil {
		return nil, err
	}
	if len(data) > maxConfigSize {
		return nil, fmt.Errorf("%s is larger than %d KiB: not a configuration file", path, maxConfigSize>>10)
	}
	return data, nil
}
