package agent

import (
	"bytes"
	"os"
	"path/filepath"
	"regexp"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/spotguard/spotguard/agent/imds"
)

func writeConfig(t *testing.T, text string) string {
	t.Helper()
	p := filepath.Join(t.TempDir(), "spotguard.yaml")
	if err := os.WriteFile(p, []byte(text), 0o644); err != nil {
		t.Fatal(err)
	}
	return p
}

func mustLoad(t *testing.T, opts LoadOptions) *Config {
	t.Helper()
	c, err := Load(opts)
	if err != nil {
		t.Fatalf("Load: %v", err)
	}
	return c
}

func TestLoadDefaults(t *testing.T) {
	c := mustLoad(t, LoadOptions{Environ: []string{"SPOTGUARD_TRAINER_MATCH=train.py"}})
	if err := c.Validate(); err != nil {
		t.Fatalf("Validate() = %v; want nil", err)
	}
	if c.IMDS.PollInterval != time.Second {
		t.Errorf("PollInterval = %v; want 1s", c.IMDS.PollInterval)
	}
	if c.Trainer.Signal != syscall.SIGUSR1 {
		t.Errorf("Signal = %v; want SIGUSR1", c.Trainer.Signal)
	}
	for _, src := range imds.Sources {
		if c.Notices[src] != PolicyCheckpoint {
			t.Errorf("Notices[%s] = %q; want checkpoint", src, c.Notices[src])
		}
	}
	if c.HTTP.Listen != "127.0.0.1:9402" || c.Checkpoint.Marker != "_COMPLETE" || c.Store.Job != "" {
		t.Errorf("defaults: listen %q marker %q job %q", c.HTTP.Listen, c.Checkpoint.Marker, c.Store.Job)
	}
}

// The order of precedence: defaults < file < environment < flags.
func TestLoadPrecedence(t *testing.T) {
	path := writeConfig(t, `
imds:
  poll_interval: 2s
trainer:
  pidfile: /file/trainer.pid
  signal: SIGUSR2
log:
  level: warn
`)
	c := mustLoad(t, LoadOptions{
		Path:    path,
		Environ: []string{"SPOTGUARD_IMDS_POLL_INTERVAL=3s", "SPOTGUARD_TRAINER_SIGNAL=SIGTERM", "OTHER=1"},
		Flags:   []KeyValue{{"imds.poll_interval", "4s"}},
	})
	if err := c.Validate(); err != nil {
		t.Fatalf("Validate() = %v", err)
	}
	tests := []struct {
		name      string
		got, want any
	}{
		{"poll_interval (flag)", c.IMDS.PollInterval, 4 * time.Second},
		{"signal (env)", c.Trainer.Signal, syscall.SIGTERM},
		{"pidfile (file)", c.Trainer.PIDFile, "/file/trainer.pid"},
		{"marker (default)", c.Checkpoint.Marker, "_COMPLETE"},
	}
	for _, tt := range tests {
		if tt.got != tt.want {
			t.Errorf("Got(%s) = %v; want %v", tt.name, tt.got, tt.want)
		}
	}
	y := c.YAML()
	for _, want := range []string{"poll_interval: 4s  # --imds.poll_interval", "signal: SIGTERM  # SPOTGUARD_TRAINER_SIGNAL", "pidfile: /file/trainer.pid  # " + path + ":5"} {
		if !strings.Contains(y, want) {
			t.Errorf("YAML() lacks %q:\n%s", want, y)
		}
	}
}

// Validate reports every problem at once, each naming its key.
func TestValidateReportsEveryProblem(t *testing.T) {
	// A file where a directory should be (a missing one is waited for: the trainer creates it).
	unreadable := filepath.Join(t.TempDir(), "a-file")
	if err := os.WriteFile(unreadable, nil, 0o644); err != nil {
		t.Fatal(err)
	}
	path := writeConfig(t, `
imds:
  poll_interval: 50ms
  pol_interval: 1s
trainer:
  signal: SIGKILL
notices:
  spot: maybe
checkpoint:
  dir: `+unreadable+`
  send_while_written: sometimes
bogus:
  key: 1
`)
	c := mustLoad(t, LoadOptions{
		Path:    path,
		Environ: []string{"SPOTGUARD_IMDS_TIMEOUT=1s", "SPOTGUARD_LOG_LEVEL=loud"},
		Flags:   []KeyValue{{"http.listen", "nonsense"}},
	})
	err := c.Validate()
	if err == nil {
		t.Fatal("Validate() = nil; want problems")
	}
	msg := err.Error()
	for _, want := range []string{
		`imds.poll_interval: "50ms" from ` + path + `:3: want 100ms to 5s`,
		"imds.pol_interval: unknown key",
		"trainer.signal: \"SIGKILL\"",
		"notices.spot: \"maybe\"",
		"checkpoint.dir: \"" + unreadable + "\" from " + path + ":",
		" is not a directory",
		`checkpoint.send_while_written: "sometimes" from ` + path + `:11: want true or false`,
		"unknown section bogus (line",
		"SPOTGUARD_IMDS_TIMEOUT: unknown environment variable",
		"log.level: \"loud\" from SPOTGUARD_LOG_LEVEL",
		"http.listen: \"nonsense\" from --http.listen",
		"no way to find the trainer",
		"store.url: must be set when checkpoint.dir is",
	} {
		if !strings.Contains(msg, want) {
			t.Errorf("Validate() lacks %q; got:\n%s", want, msg)
		}
	}
	if n := len(strings.Split(msg, "\n")); n != 12 {
		t.Errorf("Validate() gave %d problems; want 12:\n%s", n, msg)
	}
}

func TestValidateBadValues(t *testing.T) {
	tests := []struct {
		env  string
		want string
	}{
		{"SPOTGUARD_IMDS_POLL_INTERVAL=1", "imds.poll_interval: \"1\" from SPOTGUARD_IMDS_POLL_INTERVAL: not a duration"},
		{"SPOTGUARD_IMDS_POLL_INTERVAL=soon", "not a duration"},
		{"SPOTGUARD_TRAINER_SIGNAL=SIGFOO", "trainer.signal: \"SIGFOO\""},
		{"SPOTGUARD_TRAINER_MATCH=(", "trainer.match: \"(\" from SPOTGUARD_TRAINER_MATCH: not a regular expression"},
		{"SPOTGUARD_CHECKPOINT_PATTERN=[", "checkpoint.pattern: \"[\""},
		{"SPOTGUARD_CHECKPOINT_MARKER=a/b", "checkpoint.marker: \"a/b\" from SPOTGUARD_CHECKPOINT_MARKER: must be a single file name, with no slash"},
		// Markers and patterns the watcher refuses: `config` passed them and `run` failed for good.
		{"SPOTGUARD_CHECKPOINT_MARKER=..", "checkpoint.marker: \"..\" from SPOTGUARD_CHECKPOINT_MARKER: must be a single file name, not a directory's"},
		{"SPOTGUARD_CHECKPOINT_MARKER=.", "must be a single file name, not a directory's"},
		{"SPOTGUARD_CHECKPOINT_MARKER=.ckpt.tmp", "checkpoint.marker: \".ckpt.tmp\" from SPOTGUARD_CHECKPOINT_MARKER: must not be a name that is never uploaded"},
		{"SPOTGUARD_CHECKPOINT_MARKER=.spotguard-done", "must not be a name that is never uploaded"},
		{"SPOTGUARD_CHECKPOINT_MARKER=_spotguard", "must not be _spotguard, spotguard's own"},
		{"SPOTGUARD_CHECKPOINT_PATTERN=sub/*.pt", "checkpoint.pattern: \"sub/*.pt\" from SPOTGUARD_CHECKPOINT_PATTERN: must not contain a slash"},
		{"SPOTGUARD_GPU_DEGRADED_THRESHOLD=NaN", "gpu.degraded_threshold: \"NaN\" from SPOTGUARD_GPU_DEGRADED_THRESHOLD: want a fraction between 0 and 1"},
		{"SPOTGUARD_STORE_URL=http://x", "store.url: \"http://x\""},
		{"SPOTGUARD_STORE_JOB=a/b", "store.job: \"a/b\""},
		{"SPOTGUARD_STORE_JOB=LATEST", "store.job: \"LATEST\" from SPOTGUARD_STORE_JOB: want the run's name, one plain path element: \"LATEST\" is reserved"},
		{"SPOTGUARD_STORE_JOB=.spotguard-x", "names beginning with .spotguard- are spotguard's own"},
		{"SPOTGUARD_AGENT_RUNTIME_DIR=", "agent.runtime_dir: \"\""},
		// What `run` refused although the value parsed (issue 11).
		{"SPOTGUARD_STORE_URL=s3://", "store.url: \"s3://\" from SPOTGUARD_STORE_URL: missing bucket"},
		{"SPOTGUARD_STORE_URL=s3:///prefix", "missing bucket"},
		{"SPOTGUARD_STORE_URL=s3://b/a/../c", `has a ".." element`},
		{"SPOTGUARD_STORE_URL=file:///a/../b", `".." element`},
		{"SPOTGUARD_STORE_URL=file://host/x", "want an absolute path"},
		{"SPOTGUARD_IMDS_POLL_INTERVAL=10m", "imds.poll_interval: \"10m\" from SPOTGUARD_IMDS_POLL_INTERVAL: want 100ms to 5s"},
		{"SPOTGUARD_IMDS_POLL_INTERVAL=50ms", "want 100ms to 5s"},
		{"SPOTGUARD_IMDS_SPOT_POLL_INTERVAL=6s", "imds.spot_poll_interval: \"6s\" from SPOTGUARD_IMDS_SPOT_POLL_INTERVAL: want 100ms to 5s"},
		{"SPOTGUARD_IMDS_ENDPOINT=not a url", "imds.endpoint: \"not a url\" from SPOTGUARD_IMDS_ENDPOINT: want an http:// or https:// URL"},
		{"SPOTGUARD_IMDS_ENDPOINT=169.254.169.254", "imds.endpoint: \"169.254.169.254\""},
		{"SPOTGUARD_IMDS_ENDPOINT=127.0.0.1:1338", "imds.endpoint: \"127.0.0.1:1338\" from SPOTGUARD_IMDS_ENDPOINT: want an http:// or https:// URL: http://127.0.0.1:1338?"},
		{"SPOTGUARD_IMDS_ENDPOINT=ftp://x", "want an http:// or https:// URL"},
		{"SPOTGUARD_IMDS_ENDPOINT=http://", "want a host"},
		{"SPOTGUARD_IMDS_ENDPOINT=http://127.0.0.1:99999", "imds.endpoint: \"http://127.0.0.1:99999\" from SPOTGUARD_IMDS_ENDPOINT: port \"99999\": want 1 to 65535"},
		{"SPOTGUARD_IMDS_ENDPOINT=http://127.0.0.1:", "imds.endpoint: \"http://127.0.0.1:\" from SPOTGUARD_IMDS_ENDPOINT: port \"\": want 1 to 65535"},
		// Multi-node jobs.
		{"SPOTGUARD_STORE_NODE_RANK=1", "store.node_rank: \"1\" from SPOTGUARD_STORE_NODE_RANK must be less than store.world_nodes \"1\" from default: ranks are 0 to 0"},
		{"SPOTGUARD_STORE_NODE_RANK=-1", "store.node_rank: \"-1\" from SPOTGUARD_STORE_NODE_RANK: want a whole number, 0 or more"},
		{"SPOTGUARD_STORE_WORLD_NODES=0", "store.world_nodes: \"0\" from SPOTGUARD_STORE_WORLD_NODES: want a whole number from 1 to 4096"},
		{"SPOTGUARD_STORE_PART_WAIT=10s", "store.part_wait: \"10s\" from SPOTGUARD_STORE_PART_WAIT: want 1m to 168h"},
	}
	for _, tt := range tests {
		t.Run(tt.env, func(t *testing.T) {
			c := mustLoad(t, LoadOptions{Environ: []string{"SPOTGUARD_TRAINER_PIDFILE=/x", tt.env}})
			err := c.Validate()
			if err == nil || !strings.Contains(err.Error(), tt.want) {
				t.Errorf("Got(%q) = %v; want an error containing %q", tt.env, err, tt.want)
			}
		})
	}
}

func TestCheckpointDirNotADirectory(t *testing.T) {
	f := filepath.Join(t.TempDir(), "file")
	if err := os.WriteFile(f, nil, 0o644); err != nil {
		t.Fatal(err)
	}
	c := mustLoad(t, LoadOptions{Environ: []string{"SPOTGUARD_TRAINER_PIDFILE=/x", "SPOTGUARD_CHECKPOINT_DIR=" + f}})
	if err := c.Validate(); err == nil || !strings.Contains(err.Error(), "is not a directory") {
		t.Errorf("Validate() = %v; want 'is not a directory'", err)
	}
}

func TestLoadFileErrors(t *testing.T) {
	// An explicit path that does not exist is an error; the default path may be absent.
	if _, err := Load(LoadOptions{Path: filepath.Join(t.TempDir(), "nope.yaml")}); err == nil {
		t.Errorf("Load(missing explicit file) = nil error; want one")
	}
	for _, text := range []string{"imds: [1, 2]\n", "- a\n- b\n", "imds:\n  poll_interval: [1s]\n", "imds: {\n"} {
		c := mustLoad(t, LoadOptions{Path: writeConfig(t, text), Environ: []string{"SPOTGUARD_TRAINER_PIDFILE=/x"}})
		if err := c.Validate(); err == nil {
			t.Errorf("Got(%q) = nil; want a problem", text)
		}
	}
	// More than one document: a parser reading the first alone dropped the rest unread.
	for _, text := range []string{"trainer:\n  match: x\n---\nbogus:\n  x: 1\n", "trainer:\n  match: x\n---\ngarbage: [\n",
		"trainer:\n  match: x\n...\n---\nimds:\n  poll_interval: 50ms\n"} {
		path := writeConfig(t, text)
		c := mustLoad(t, LoadOptions{Path: path})
		err := c.Validate()
		if want := path + ": holds more than one YAML document"; err == nil || !strings.Contains(err.Error(), want) {
			t.Errorf("Got(%q) = %v; want %q", text, err, want)
		}
	}
	// Empty sections and empty files are fine, and so is a document's start marked.
	c := mustLoad(t, LoadOptions{Path: writeConfig(t, "---\ntrainer:\n  match: x\n...\n")})
	if err := c.Validate(); err != nil {
		t.Errorf("Validate(one document, marked) = %v; want nil", err)
	}
	c = mustLoad(t, LoadOptions{Path: writeConfig(t, "imds:\n"), Environ: []string{"SPOTGUARD_TRAINER_PIDFILE=/x"}})
	if err := c.Validate(); err != nil {
		t.Errorf("Validate(empty section) = %v; want nil", err)
	}
}

// restore and list (ValidateStore) report what is wrong with the file as a whole, whatever its
// name: they said nothing of a file not ending in .yaml, and read the store from a file that did
// not parse when the environment gave the store.
func TestValidateStoreReportsTheFile(t *testing.T) {
	for _, text := range []string{"store:\n  url: file:///st\n  job: j1\nimds: [\n", "store:\n  url: file:///st\nstore:\n  job: j1\n",
		"stroe:\n  url: file:///st\n", "store:\n  url: file:///st\n  job: j1\n---\nstore:\n  job: j2\n"} {
		for _, name := range []string{"spotguard.yaml", "spotguard.yml", "spotguard.conf"} {
			path := filepath.Join(t.TempDir(), name)
			if err := os.WriteFile(path, []byte(text), 0o644); err != nil {
				t.Fatal(err)
			}
			c := mustLoad(t, LoadOptions{Path: path, Environ: []string{"SPOTGUARD_STORE_URL=file:///st", "SPOTGUARD_STORE_JOB=j1"}})
			if err := c.ValidateStore(); err == nil || !strings.Contains(err.Error(), path+": ") {
				t.Errorf("ValidateStore(%s holding %q) = %v; want its problem, naming it", name, text, err)
			}
		}
	}
	// A key's own problem in another section is run's, not restore's.
	path := writeConfig(t, "store:\n  url: file:///st\n  job: j1\ngpu:\n  colour: blue\n  colour: red\n  sample_interval: [1s]\n")
	if err := mustLoad(t, LoadOptions{Path: path}).ValidateStore(); err != nil {
		t.Errorf("ValidateStore(unknown, doubled and list keys of gpu) = %v; want nil", err)
	}
}

func TestKeysAndEnvNames(t *testing.T) {
	seen := map[string]bool{}
	for _, k := range Keys() {
		if seen[k.Name] {
			t.Errorf("key %s listed twice", k.Name)
		}
		seen[k.Name] = true
		if want := "SPOTGUARD_" + strings.ToUpper(strings.ReplaceAll(k.Name, ".", "_")); k.Env != want {
			t.Errorf("Got(%q).Env = %q; want %q", k.Name, k.Env, want)
		}
		if k.Help == "" {
			t.Errorf("key %s has no help", k.Name)
		}
	}
}

func TestDiff(t *testing.T) {
	a := mustLoad(t, LoadOptions{Environ: []string{"SPOTGUARD_TRAINER_PIDFILE=/x"}})
	b := mustLoad(t, LoadOptions{Environ: []string{"SPOTGUARD_TRAINER_PIDFILE=/y", "SPOTGUARD_IMDS_POLL_INTERVAL=2s"}})
	got := strings.Join(a.Diff(b), ",")
	if got != "imds.poll_interval,trainer.pidfile" {
		t.Errorf("Diff() = %q; want imds.poll_interval,trainer.pidfile", got)
	}
}

func TestPolicyOff(t *testing.T) {
	c := mustLoad(t, LoadOptions{Environ: []string{"SPOTGUARD_TRAINER_PIDFILE=/x", "SPOTGUARD_NOTICES_ASG=off", "SPOTGUARD_NOTICES_SCHEDULED=off"}})
	if err := c.Validate(); err != nil {
		t.Fatalf("Validate() = %v", err)
	}
	if got := enabledSources(c); len(got) != 2 || got[0] != imds.SourceSpot || got[1] != imds.SourceRebalance {
		t.Errorf("enabledSources() = %v; want [spot rebalance]", got)
	}
	all := mustLoad(t, LoadOptions{Environ: []string{"SPOTGUARD_TRAINER_PIDFILE=/x", "SPOTGUARD_NOTICES_ASG=off",
		"SPOTGUARD_NOTICES_SCHEDULED=off", "SPOTGUARD_NOTICES_SPOT=off", "SPOTGUARD_NOTICES_REBALANCE=off"}})
	if err := all.Validate(); err == nil || !strings.Contains(err.Error(), "every source is off") {
		t.Errorf("Validate(all off) = %v; want 'every source is off'", err)
	}
}

// The example configuration must stay valid (its checkpoint dir aside, which is made by the demo).
func TestExampleConfigIsValid(t *testing.T) {
	c := mustLoad(t, LoadOptions{Path: "../examples/local.yaml", Flags: []KeyValue{{"checkpoint.dir", t.TempDir()}}})
	if err := c.Validate(); err != nil {
		t.Errorf("examples/local.yaml: %v", err)
	}
}

// The unit gives a stop more time than the agent's stop budget, so systemd never kills an agent
// that is still committing: TimeoutStopSec > agent.stop_budget's default plus the time to flush.
func TestStopBudgetFitsTheUnit(t *testing.T) {
	b, err := os.ReadFile("../systemd/spotguard.service")
	if err != nil {
		t.Fatal(err)
	}
	m := regexp.MustCompile(`(?m)^TimeoutStopSec=(\S+)$`).FindSubmatch(b)
	if m == nil {
		t.Fatal("spotguard.service has no TimeoutStopSec")
	}
	unit, err := time.ParseDuration(string(m[1]))
	if err != nil {
		t.Fatalf("TimeoutStopSec=%s: %v", m[1], err)
	}
	cfg := mustLoad(t, LoadOptions{})
	if margin := unit - cfg.Agent.StopBudget; margin < 5*time.Second {
		t.Errorf("TimeoutStopSec=%v leaves %v over agent.stop_budget %v; want at least 5s", unit, margin, cfg.Agent.StopBudget)
	}
}

// Values at the edges of what is allowed are accepted; slow polling only warns.
func TestValidateGoodValuesAndWarnings(t *testing.T) {
	c := mustLoad(t, LoadOptions{Environ: []string{"SPOTGUARD_TRAINER_PIDFILE=/x", "SPOTGUARD_IMDS_POLL_INTERVAL=5s",
		"SPOTGUARD_IMDS_SPOT_POLL_INTERVAL=100ms", "SPOTGUARD_IMDS_ENDPOINT=http://[fd00:ec2::254]", "SPOTGUARD_STORE_URL=s3://bucket",
		"SPOTGUARD_STORE_JOB=j", "SPOTGUARD_CHECKPOINT_DIR=" + t.TempDir()}})
	if err := c.Validate(); err != nil {
		t.Fatalf("Validate() = %v; want nil", err)
	}
	if c.IMDS.PollInterval != 5*time.Second || c.IMDS.SpotPollInterval != 100*time.Millisecond || c.IMDS.Endpoint != "http://[fd00:ec2::254]" {
		t.Errorf("imds = %+v", c.IMDS)
	}
	w := c.Warnings()
	if len(w) != 1 || !strings.HasPrefix(w[0].Text, "imds.poll_interval: 5s: a rebalance recommendation, a scheduled event or an ASG termination may be seen 5s late") || w[0].Fix != "set imds.poll_interval to 1s (the default) or less" {
		t.Errorf("Warnings() = %q; want one for imds.poll_interval", w)
	}
	if w := mustLoad(t, LoadOptions{}).Warnings(); len(w) != 0 {
		t.Errorf("Warnings() of the defaults = %q; want none", w)
	}
	// DCP's .metadata as the marker of a multi-node job: node 0 alone has it, and nothing is
	// ever committed; before, config said nothing (found from outside).
	w = mustLoad(t, LoadOptions{Environ: []string{"SPOTGUARD_CHECKPOINT_MARKER=.metadata", "SPOTGUARD_STORE_WORLD_NODES=2"}}).Warnings()
	if len(w) != 1 || !strings.Contains(w[0].Text, "DCP writes .metadata on node 0 only") || !strings.Contains(w[0].Fix, "_COMPLETE") {
		t.Errorf("Warnings() with .metadata in a 2-node job = %q; want one, saying to use _COMPLETE", w)
	}
	if w := mustLoad(t, LoadOptions{Environ: []string{"SPOTGUARD_CHECKPOINT_MARKER=.metadata"}}).Warnings(); len(w) != 0 {
		t.Errorf("Warnings() with .metadata in a single-node job = %q; want none", w)
	}
}

// A key set twice, or a section written twice, is a problem naming both lines: a YAML parser
// that merges them silently keeps one half.
func TestDuplicateKeysAreErrors(t *testing.T) {
	path := writeConfig(t, `imds:
  poll_interval: 1s
store:
  url: s3://b/p
imds:
  endpoint: http://127.0.0.1:1338
trainer:
  pidfile: /a
  pidfile: /b
`)
	err := mustLoad(t, LoadOptions{Path: path}).Validate()
	if err == nil {
		t.Fatal("Validate() = nil; want the duplicates reported")
	}
	for _, want := range []string{path + ": section imds appears twice (lines 1 and 5)", "trainer.pidfile: set twice (" + path + " lines 8 and 9)"} {
		if !strings.Contains(err.Error(), want) {
			t.Errorf("Validate() lacks %q:\n%v", want, err)
		}
	}
}

// YAML's own syntax met in a value is said for what it is (found from outside): an unquoted
// pattern: *.pt (the docs' own example) is an alias, marker: !done a tag and an empty value, and
// anchors, aliases and merge keys are not supported; a byte-order mark in a section's name (two
// files joined) is shown.
func TestYAMLSyntaxInValuesIsSaid(t *testing.T) {
	for _, tt := range []struct{ text, want string }{
		{"checkpoint:\n  pattern: *.pt\n", "a value that begins with *, &, !, |, >, % or @ must be quoted: pattern: '*.pt'"},
		{"checkpoint:\n  pattern: '@x'\n  marker: @done\n", "a value that begins with *, &, !, |, >, % or @ must be quoted"},
		{"checkpoint:\n  marker: !done\n", "checkpoint.marker: !done is a YAML tag"},
		{"imds:\n  poll_interval: &p 1s\n  spot_poll_interval: *p\n", "imds.spot_poll_interval: YAML anchors and aliases (*name) are not supported"},
		{"d: &d\n  poll_interval: 1s\nimds:\n  <<: *d\n", "imds.<<: YAML merge keys (<<: *anchor) are not supported"},
		{"imds:\n  poll_interval: 1s\n\ufefflog:\n  level: info\n", `unknown section "\ufefflog"`},
	} {
		err := mustLoad(t, LoadOptions{Path: writeConfig(t, tt.text), Environ: []string{"SPOTGUARD_TRAINER_PIDFILE=/x"}}).Validate()
		if err == nil || !strings.Contains(err.Error(), tt.want) {
			t.Errorf("Validate(%q) = %v; want %q", tt.text, err, tt.want)
		}
	}
}

// A configuration file that is not YAML (or sets a key twice) leaves its keys unknown: the
// problem is the file, not a trainer nobody said how to find. (Found from outside: a reload with
// a syntax error reported both.)
func TestBrokenFileReportsOnlyItself(t *testing.T) {
	for _, text := range []string{"trainer:\n  match: [unclosed\n", "trainer:\n  match: a\n  match: b\n"} {
		c := mustLoad(t, LoadOptions{Path: writeConfig(t, text)})
		err := c.Validate()
		if err == nil {
			t.Errorf("%q: Validate() = nil; want the file's problem", text)
			continue
		}
		if strings.Contains(err.Error(), "no way to find the trainer") {
			t.Errorf("%q: Validate() = %v; want the file's problem alone", text, err)
		}
	}
}

// A password in a URL value (a proxy-style imds.endpoint, a store URL with userinfo) is not
// printed: `spotguard config` and the problem lines go to terminals and the journal (found from
// outside: both showed it whole). `config --get` still gives the value as set.
func TestConfigPrintsNoPasswordOfAURL(t *testing.T) {
	c := mustLoad(t, LoadOptions{Environ: []string{"SPOTGUARD_IMDS_ENDPOINT=http://u:SuperSecret@127.0.0.1:1"}})
	if y := c.YAML(); strings.Contains(y, "SuperSecret") || !strings.Contains(y, "http://u:xxxxx@127.0.0.1:1") {
		t.Errorf("YAML() shows the password, or not the redacted URL:\n%s", y)
	}
	if err := c.Validate(); err == nil || strings.Contains(err.Error(), "SuperSecret") || !strings.Contains(err.Error(), "imds.endpoint") {
		t.Errorf("Validate() = %v; want the problem with imds.endpoint, without its password", err)
	}
	for _, kv := range c.Effective() {
		if kv.Key == "imds.endpoint" && kv.Value != "http://u:SuperSecret@127.0.0.1:1" {
			t.Errorf("Effective() imds.endpoint = %q; want the value as set (config --get)", kv.Value)
		}
	}
	if got := redactURL("s3://bucket/prefix"); got != "s3://bucket/prefix" {
		t.Errorf("redactURL(s3://bucket/prefix) = %q; want it as it is", got)
	}
}

// metrics.namespace takes what CloudWatch takes: a tab, a newline or a letter outside ASCII
// passed, and every PutMetricData then failed, while doctor said PASS (found from outside); an
// overlong one did not say its limit.
func TestMetricsNamespaceIsOneCloudWatchTakes(t *testing.T) {
	for _, tt := range []struct{ v, want string }{
		{"SpotGuard", ""},
		{"Team A/train-1:v2.0_#3", ""},
		{"Spot\tGuard", `'\t' is not a character CloudWatch takes`},
		{"Spot\nGuard", `'\n' is not a character CloudWatch takes`},
		{"Spöt", `'ö' is not a character CloudWatch takes`},
		{"   ", "not only white space"},
		{"AWS/EC2", "AWS's own"},
		{strings.Repeat("n", 256), "256 characters long: CloudWatch takes at most 255"},
	} {
		c := mustLoad(t, LoadOptions{Environ: []string{"SPOTGUARD_TRAINER_MATCH=x", "SPOTGUARD_METRICS_NAMESPACE=" + tt.v}})
		err := c.Validate()
		switch {
		case tt.want == "" && err != nil:
			t.Errorf("namespace %q: %v; want it taken", tt.v, err)
		case tt.want != "" && (err == nil || !strings.Contains(err.Error(), tt.want) || !strings.Contains(err.Error(), "metrics.namespace")):
			t.Errorf("namespace %q: %v; want a problem of metrics.namespace containing %q", tt.v, err, tt.want)
		}
	}
}

// A configuration path that is not a regular file: a named pipe blocked every command for ever
// (SIGTERM too), and /dev/zero was read until memory ran out (found from outside). Each is an
// error naming what it is; a directory too.
func TestLoadRefusesAConfigurationThatIsNoFile(t *testing.T) {
	dir := t.TempDir()
	fifo := filepath.Join(dir, "fifo")
	if err := syscall.Mkfifo(fifo, 0o644); err != nil {
		t.Fatal(err)
	}
	big := filepath.Join(dir, "big.yaml")
	if err := os.WriteFile(big, bytes.Repeat([]byte("# x\n"), maxConfigSize/4+1), 0o644); err != nil {
		t.Fatal(err)
	}
	for path, want := range map[string]string{fifo: "is a named pipe", "/dev/zero": "is a device", dir: "is a directory", big: "is larger than 1024 KiB"} {
		_, err := Load(LoadOptions{Path: path})
		if err == nil || !strings.Contains(err.Error(), want) {
			t.Errorf("Load(%s) = %v; want an error: %s", path, err, want)
		}
	}
}

// A misspelt section or key is refused, with the name it likely meant; the key it meant is among
// InvalidKeys (its value was not read), unless the file sets it too. (Found from outside: doctor
// checked the default of checkpoint.dir under a "chekpoint:" section and said none was set.)
func TestMisspeltNamesSayWhatTheyLikelyMeant(t *testing.T) {
	path := writeConfig(t, "chekpoint:\n  dir: /data/ckpt\n  marker: _DONE\nstore:\n  url: file:///data/store\n  jbo: run1\nimds:\n  Spot_Poll_Intervall: 1s\n  pol: 1s\nhttp:\n  listen: 127.0.0.1:9402\n  lisen: 127.0.0.1:9403\nqwerty:\n  a: b\n")
	c := mustLoad(t, LoadOptions{Path: path})
	problems := c.Validate().Error()
	for _, want := range []string{
		"unknown section chekpoint (line 1): the sections are imds, notices, trainer, checkpoint, store, http, agent, gpu, metrics, log; did you mean checkpoint?",
		"store.jbo: unknown key (" + path + " line 6); did you mean store.job?",
		"imds.Spot_Poll_Intervall: unknown key (" + path + " line 8); did you mean imds.spot_poll_interval?",
		"imds.pol: unknown key (" + path + " line 9)\n", // two letters short of poll_interval: no guess
		"http.lisen: unknown key (" + path + " line 12); did you mean http.listen?",
		"unknown section qwerty (line 13): the sections are imds, notices, trainer, checkpoint, store, http, agent, gpu, metrics, log\n",
	} {
		if !strings.Contains(problems+"\n", want) {
			t.Errorf("problems lack %q:\n%s", want, problems)
		}
	}
	got := c.InvalidKeys()
	for _, k := range []string{"checkpoint.dir", "checkpoint.marker", "store.job", "imds.spot_poll_interval"} {
		if !got[k] {
			t.Errorf("InvalidKeys() lacks %s: %v", k, got)
		}
	}
	if got["http.listen"] || got["checkpoint.keep"] {
		t.Errorf("InvalidKeys() = %v; want neither http.listen (set in the file) nor checkpoint.keep (not written)", got)
	}
}

func TestClosestName(t *testing.T) {
	names := []string{"dir", "marker", "pattern", "keep", "send_while_written"}
	for s, want := range map[string]string{
		"dri": "dir", "DIR": "dir", "markr": "marker", "makrer": "marker", "patern": "pattern", "kep": "keep",
		"send_while_writen": "send_while_written", "mark": "marker", "keeper": "keep", "d": "", "x": "", "patterns_glob": "",
	} {
		if got := closestName(s, names); got != want {
			t.Errorf("closestName(%q) = %q; want %q", s, got, want)
		}
	}
	if got := closestName("ab", []string{"ac", "ad"}); got != "" {
		t.Errorf("closestName(ab, [ac ad]) = %q; want none, two being as close", got)
	}
}
