package main

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/aws/aws-sdk-go-v2/aws"
	awshttp "github.com/aws/aws-sdk-go-v2/aws/transport/http"
	"github.com/aws/smithy-go"
	smithyhttp "github.com/aws/smithy-go/transport/http"
	"github.com/rs/zerolog"

	"github.com/spotguard/spotguard/agent"
	"github.com/spotguard/spotguard/agent/imds"
	"github.com/spotguard/spotguard/checkpoint"
	"github.com/spotguard/spotguard/nvml"
)

var update = flag.Bool("update", false, "rewrite the golden files in testdata/")

// mapIMDS answers the paths it holds and 404 for the others; fail makes every read fail.
type mapIMDS struct {
	bodies map[string]string
	fail   error
}

func (m mapIMDS) Get(ctx context.Context, path string) ([]byte, bool, error) {
	if m.fail != nil {
		return nil, false, m.fail
	}
	b, ok := m.bodies[path]
	return []byte(b), ok, nil
}

// noBucketStore is a file store whose listing fails as S3 does for a bucket that does not exist.
type noBucketStore struct{ checkpoint.Store }

func (noBucketStore) URL() string { return "s3://nosuchbucket/x" }

func (noBucketStore) ListDir(context.Context, string) ([]string, []checkpoint.ObjectInfo, error) {
	return nil, nil, fmt.Errorf("list s3://nosuchbucket/x/job1/_spotguard/: %w", &awshttp.ResponseError{ResponseError: &smithyhttp.ResponseError{
		Response: &smithyhttp.Response{Response: &http.Response{StatusCode: 404}},
		Err:      &smithy.GenericAPIError{Code: "NoSuchBucket", Message: "The specified bucket does not exist"},
	}})
}

type doctorRig struct {
	tmp   string
	deps  doctorDeps
	imds  mapIMDS
	store func(dir string) checkpoint.Store
}

func newDoctorRig(t *testing.T) *doctorRig {
	r := &doctorRig{tmp: t.TempDir(), imds: mapIMDS{bodies: map[string]string{
		"instance-id":                      "i-0abc",
		"events/recommendations/rebalance": `{"noticeTime": "2030-01-01T00:00:00Z"}`,
	}}}
	r.store = func(dir string) checkpoint.Store {
		s, err := checkpoint.NewFileStore(dir)
		if err != nil {
			t.Fatal(err)
		}
		return s
	}
	r.deps = doctorDeps{
		loadAWS: func(context.Context, string) (awsSetup, error) { return awsSetup{}, nil },
		newIMDS: func(aws.Config, string) imds.Getter { return r.imds },
		openStore: func(ctx context.Context, url, imdsEndpoint string, opts checkpoint.S3Options) (checkpoint.Store, error) {
			return r.store(filepath.Join(r.tmp, "store")), nil
		},
		openGPUs: func(zerolog.Logger) (gpuSource, error) {
			return nil, fmt.Errorf("%w: libnvidia-ml.so.1 not found", nvml.ErrUnavailable)
		},
		noUnitWarnings: true, // its directories are in /tmp (TestDoctorWarnsOfTmpUnderTheUnit)
	}
	return r
}

// A checkpoint.dir or file:// store under /tmp is a warning: the units' PrivateTmp=yes gives
// each a /tmp of its own (found from outside: only hardening.md said so); config says it too.
func TestDoctorWarnsOfTmpUnderTheUnit(t *testing.T) {
	r := newDoctorRig(t)
	r.deps.noUnitWarnings = false
	_, out := r.run(t, "--checkpoint.dir", "/tmp/ckpt", "--store.url", "file:///var/tmp/store", "--agent.runtime_dir", "/tmp/rt")
	for _, want := range []string{
		"WARN  config            checkpoint.dir: /tmp/ckpt is under /tmp or /var/tmp: under spotguard.service (PrivateTmp=yes)",
		"WARN  config            store.url: file:///var/tmp/store is under /tmp or /var/tmp",
		"WARN  config            agent.runtime_dir: /tmp/rt is under /tmp or /var/tmp",
	} {
		if !strings.Contains(out, want) {
			t.Errorf("doctor with checkpoint.dir and store under /tmp:\n%s\nwant %q", out, want)
		}
	}
	if _, out := r.run(t, "--checkpoint.dir", "/opt/ckpt", "--store.url", "file:///opt/store", "--agent.runtime_dir", "/run/spotguard"); strings.Contains(out, "PrivateTmp") {
		t.Errorf("doctor with checkpoint.dir and store outside /tmp warned:\n%s", out)
	}
	path := filepath.Join(t.TempDir(), "c.yaml")
	os.WriteFile(path, []byte("trainer:\n  match: x\ncheckpoint:\n  dir: /tmp/ckpt\nstore:\n  url: file:///mnt/s\n  job: j\n"), 0o644)
	if _, _, stderr := runCLI(t, t.Context(), nil, "config", "--config", path); !strings.Contains(stderr, "warning: checkpoint.dir: /tmp/ckpt is under /tmp") {
		t.Errorf("config with checkpoint.dir under /tmp: stderr\n%s\nwant the warning", stderr)
	}
}

// run runs `spotguard doctor` with the rig's store, checkpoint.dir and trainer pidfile, plus args.
func (r *doctorRig) run(t *testing.T, args ...string) (int, string) {
	t.Helper()
	cfgPath := filepath.Join(r.tmp, "spotguard.yaml")
	os.WriteFile(cfgPath, nil, 0o644)
	args = append([]string{"--config", cfgPath, "--store.url", "file://" + filepath.Join(r.tmp, "store"), "--store.job", "job1",
		"--checkpoint.dir", filepath.Join(r.tmp, "checkpoints"), "--trainer.pidfile", filepath.Join(r.tmp, "trainer.pid"),
		"--agent.runtime_dir", filepath.Join(r.tmp, "run", "spotguard"), "--metrics.cloudwatch", "false"}, args...)
	var stdout, stderr bytes.Buffer
	code := runDoctor(t.Context(), args, nil, &stdout, &stderr, r.deps)
	return code, strings.ReplaceAll(stdout.String(), r.tmp, "$TMP")
}

// runConfig runs `spotguard doctor --config path` with the rig's deps and nothing else set.
func (r *doctorRig) runConfig(t *testing.T, path string) (int, string) {
	t.Helper()
	var stdout, stderr bytes.Buffer
	code := runDoctor(t.Context(), []string{"--config", path}, nil, &stdout, &stderr, r.deps)
	return code, strings.ReplaceAll(stdout.String(), r.tmp, "$TMP")
}

// The text report: a line per check with its verdict and, when not PASS, the fix; a summary.
// Warnings alone exit 0.
func TestDoctorOutput(t *testing.T) {
	r := newDoctorRig(t)
	code, out := r.run(t)
	golden := filepath.Join("testdata", "doctor.golden")
	if *update {
		if err := os.WriteFile(golden, []byte(out), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	want, err := os.ReadFile(golden)
	if err != nil {
		t.Fatal(err)
	}
	if out != string(want) {
		t.Errorf("doctor output differs from %s (go test -run TestDoctorOutput -update to accept):\n--- got\n%s--- want\n%s", golden, out, want)
	}
	if code != exitOK {
		t.Errorf("doctor exit = %d with warnings only; want 0", code)
	}
}

// Each configuration warning comes with its own fix: the listener's says to keep it on loopback,
// and a slow poll names its key and that key's default (the spot source's is 250ms, not 1s).
func TestDoctorConfigWarningsSayTheirFix(t *testing.T) {
	for _, tc := range []struct {
		args      []string
		text, fix string
	}{
		{[]string{"--http.listen", "0.0.0.0:9402"}, "http.listen: 0.0.0.0:9402: not a loopback address", "keep http.listen on 127.0.0.1 (the default) or [::1]"},
		{[]string{"--imds.poll_interval", "3s"}, "imds.poll_interval: 3s: a rebalance recommendation, a scheduled event or an ASG termination may be seen 3s late", "set imds.poll_interval to 1s (the default) or less"},
		{[]string{"--imds.spot_poll_interval", "3s"}, "imds.spot_poll_interval: 3s: a spot notice may be seen 3s late", "set imds.spot_poll_interval to 250ms (the default) or less"},
	} {
		r := newDoctorRig(t)
		code, out := r.run(t, append(tc.args, "--json")...)
		var rep doctorReport
		if err := json.Unmarshal([]byte(out), &rep); err != nil {
			t.Fatalf("%v: %v\n%s", tc.args, err, out)
		}
		i := slices.IndexFunc(rep.Checks, func(c doctorCheck) bool { return c.Name == "config" && c.Status == doctorWarn })
		if i < 0 {
			t.Errorf("%v: no config WARN in %s", tc.args, out)
			continue
		}
		if c := rep.Checks[i]; !strings.HasPrefix(c.Detail, tc.text) || c.Fix != tc.fix {
			t.Errorf("%v: config WARN %q, fix %q; want %q…, fix %q", tc.args, c.Detail, c.Fix, tc.text, tc.fix)
		}
		if code != exitOK {
			t.Errorf("%v: doctor exit = %d with a warning; want 0", tc.args, code)
		}
	}
}

// laterStore is a file store whose listings give last-modified times d later: a store whose clock
// is d ahead of this instance's.
type laterStore struct {
	checkpoint.Store
	d time.Duration
}

func (s laterStore) List(ctx context.Context, prefix string) ([]checkpoint.ObjectInfo, error) {
	objs, err := s.Store.List(ctx, prefix)
	for i := range objs {
		objs[i].LastModified = objs[i].LastModified.Add(s.d)
	}
	return objs, err
}

// This instance's clock an hour off the store's is a WARN naming the offset, with the fix; the
// agent still runs (exit 0 with warnings alone).
func TestDoctorClockOffFromTheStore(t *testing.T) {
	for _, tc := range []struct {
		d    time.Duration
		want string
	}{
		{time.Hour, "this instance's clock is at least 3600 s behind the store's"},
		{-time.Hour, "this instance's clock is at least 3599 s ahead of the store's"},
	} {
		r := newDoctorRig(t)
		r.store = func(dir string) checkpoint.Store {
			s, err := checkpoint.NewFileStore(dir)
			if err != nil {
				t.Fatal(err)
			}
			return laterStore{s, tc.d}
		}
		code, out := r.run(t)
		if !strings.Contains(out, "\nWARN  clock ") || !strings.Contains(out, tc.want) || !strings.Contains(out, "fix: synchronize the clock: chronyc tracking") {
			t.Errorf("store %v off: doctor said\n%s\nwant a WARN clock line %q with the fix", tc.d, out, tc.want)
		}
		if code != exitOK {
			t.Errorf("store %v off: doctor exit = %d; want 0 (a warning)", tc.d, code)
		}
	}
}

// A bucket that does not exist is a FAIL naming the bucket and the error, with the fix; exit 1.
func TestDoctorMissingBucketFails(t *testing.T) {
	r := newDoctorRig(t)
	r.store = func(dir string) checkpoint.Store {
		s, _ := checkpoint.NewFileStore(dir)
		return noBucketStore{s}
	}
	code, out := r.run(t)
	if code != exitFail {
		t.Errorf("doctor exit = %d; want 1", code)
	}
	want := "FAIL  store             store s3://nosuchbucket/x job job1: list job1/_spotguard/ failed: NoSuchBucket: The specified bucket does not exist (HTTP 404)"
	if !strings.Contains(out, want) || !strings.Contains(out, "fix: the bucket nosuchbucket does not exist") {
		t.Errorf("doctor output lacks %q and its fix:\n%s", want, out)
	}
	if !strings.HasSuffix(out, "FAIL: 1 failed, 4 warning(s), 7 passed\n") {
		t.Errorf("doctor summary:\n%s", out)
	}
}

// IMDS that does not answer: one FAIL, the sources are not read; --json says the same.
func TestDoctorIMDSDownJSON(t *testing.T) {
	r := newDoctorRig(t)
	r.imds.fail = errors.New(`operation error ec2imds: GetMetadata, failed to get API token, request send failed, dial tcp 169.254.169.254:80: i/o timeout`)
	code, out := r.run(t, "--json")
	var rep doctorReport
	if err := json.Unmarshal([]byte(out), &rep); err != nil {
		t.Fatalf("doctor --json output %q: %v", out, err)
	}
	if code != exitFail || rep.Pass || rep.Failed != 1 {
		t.Errorf("doctor --json: exit %d, %+v; want exit 1 and one FAIL", code, rep)
	}
	var names []string
	for _, c := range rep.Checks {
		names = append(names, c.Name+"="+c.Status)
		if c.Name == "imds" && (!strings.Contains(c.Detail, "does not answer") || !strings.Contains(c.Fix, "hop limit")) {
			t.Errorf("imds check = %+v; want it unreachable with the fix", c)
		}
	}
	if got, want := strings.Join(names, " "), "config=PASS imds=FAIL store=PASS clock=PASS trainer=WARN checkpoint.dir=WARN runtime_dir=PASS nvml=WARN cloudwatch=PASS"; got != want {
		t.Errorf("checks = %s; want %s", got, want)
	}
}

// startSignalTrainer is a real process; with handler it catches SIGUSR1.
func startSignalTrainer(t *testing.T, handler bool) int {
	t.Helper()
	ready := filepath.Join(t.TempDir(), "ready")
	script := `touch "$1"; while :; do sleep 0.05; done`
	if handler {
		script = `trap 'echo USR1' USR1; ` + script
	}
	cmd := exec.Command("sh", "-c", script, "sh", ready)
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	done := make(chan struct{})
	go func() { cmd.Wait(); close(done) }()
	t.Cleanup(func() { cmd.Process.Kill(); <-done })
	deadline := time.Now().Add(10 * time.Second)
	tick := time.NewTicker(10 * time.Millisecond)
	defer tick.Stop()
	for {
		if _, err := os.Stat(ready); err == nil {
			return cmd.Process.Pid
		}
		if time.Now().After(deadline) {
			t.Fatal("the trainer did not start")
		}
		<-tick.C
	}
}

// A trainer that catches the signal passes; one that does not fails: it would not be signalled.
func TestDoctorTrainer(t *testing.T) {
	for _, tc := range []struct {
		handler bool
		want    string
	}{
		{true, "PASS  trainer           1 process(es) found, all catch SIGUSR1"},
		{false, "FAIL  trainer           1 process(es) found, none catches SIGUSR1, so none would be signalled"},
	} {
		t.Run(strconv.FormatBool(tc.handler), func(t *testing.T) {
			r := newDoctorRig(t)
			pid := startSignalTrainer(t, tc.handler)
			os.WriteFile(filepath.Join(r.tmp, "trainer.pid"), []byte(strconv.Itoa(pid)), 0o644)
			_, out := r.run(t)
			if !strings.Contains(out, tc.want) {
				t.Errorf("doctor output lacks %q:\n%s", tc.want, out)
			}
		})
	}
}

// NVML whose nvmlInit does not return (a hung GPU or driver) fails the nvml check within the
// answer limit, naming the call and the fix; before, doctor waited for it for ever.
func TestDoctorNVMLHangs(t *testing.T) {
	r := newDoctorRig(t)
	release := make(chan struct{})
	defer close(release)
	r.deps.openGPUs = func(zerolog.Logger) (gpuSource, error) {
		<-release
		return nil, errors.New("unreachable")
	}
	r.deps.gpuAnswerLimit = 50 * time.Millisecond
	code, out := r.run(t)
	want := "NVML (nvmlInit) has not returned after 0.05 s: a GPU or its driver hangs"
	if code != exitFail || !strings.Contains(out, want) || !strings.Contains(out, "replace the instance") {
		t.Errorf("doctor with a hung nvmlInit: exit %d\n%s\nwant %d with %q and the fix", code, out, exitFail, want)
	}
}

// doctor checks agent.runtime_dir without writing anything: writable, or creatable above, or
// not (notice.json and the journal would be missing).
func TestDoctorRuntimeDir(t *testing.T) {
	tmp := t.TempDir()
	ro := filepath.Join(tmp, "ro")
	os.Mkdir(ro, 0o500)
	file := filepath.Join(tmp, "file")
	os.WriteFile(file, nil, 0o644)
	for _, tc := range []struct {
		dir, state, want string
	}{
		{tmp, doctorPass, "is writable"},
		{filepath.Join(tmp, "a", "b"), doctorPass, "the agent creates it in " + tmp},
		{filepath.Join(file, "x"), doctorFail, "not a directory"},
	} {
		var rep doctorReport
		cfg := &agent.Config{}
		cfg.Agent.RuntimeDir = tc.dir
		doctorRuntimeDir(&rep, cfg, true)
		if len(rep.Checks) != 1 || rep.Checks[0].Status != tc.state || !strings.Contains(rep.Checks[0].Detail, tc.want) {
			t.Errorf("doctorRuntimeDir(%s) = %+v; want %s containing %q", tc.dir, rep.Checks, tc.state, tc.want)
		}
	}
	// Run by hand, outside the unit, a directory other than /run/spotguard is said to need
	// ReadWritePaths= under it (found from outside: it passed, and the agent could not write it).
	var rep doctorReport
	cfg := &agent.Config{}
	cfg.Agent.RuntimeDir = tmp
	doctorRuntimeDir(&rep, cfg, false)
	if len(rep.Checks) != 1 || rep.Checks[0].Status != doctorPass || !strings.Contains(rep.Checks[0].Detail, "it also needs ReadWritePaths="+tmp) {
		t.Errorf("doctorRuntimeDir(%s) outside the unit = %+v; want PASS, saying it needs ReadWritePaths= under the unit", tmp, rep.Checks)
	}
	if os.Geteuid() != 0 { // root writes anywhere
		var rep doctorReport
		cfg := &agent.Config{}
		cfg.Agent.RuntimeDir = filepath.Join(ro, "run")
		doctorRuntimeDir(&rep, cfg, true)
		if len(rep.Checks) != 1 || rep.Checks[0].Status != doctorFail {
			t.Errorf("doctorRuntimeDir under a read-only directory = %+v; want FAIL", rep.Checks)
		}
	}
}

// doctor warns of a checkpoint.dir one level above the trainer's checkpoints (Hugging Face's
// output_dir checkpoints/run1 under checkpoint.dir checkpoints): its markers are below the top of
// run1, which never completes, and nothing is committed. Checkpoints at the right level pass.
func TestDoctorCheckpointDirTooHigh(t *testing.T) {
	write := func(t *testing.T, p string) {
		t.Helper()
		if err := os.MkdirAll(filepath.Dir(p), 0o755); err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(p, nil, 0o644); err != nil {
			t.Fatal(err)
		}
	}
	for _, tc := range []struct {
		name   string
		files  []string
		marker string
		state  string
		want   string
	}{
		{"right level", []string{"step-1/_COMPLETE", "step-2/a.bin"}, "", doctorPass, "readable directory (2 entries)"},
		{"one level too high", []string{"run1/checkpoint-100/_COMPLETE", "run1/checkpoint-100/model.safetensors"}, "", doctorWarn,
			"holds run1/checkpoint-100/_COMPLETE, below the top of run1"},
		{"DCP marker", []string{"run1/step-100/.metadata"}, ".metadata", doctorWarn, "holds run1/step-100/.metadata"},
		{"in progress", []string{"step-3/sub/a.bin"}, "", doctorPass, "readable directory"},
		{"saves moved aside", []string{"step-1/_COMPLETE", ".spotguard-incomplete-step-1-20261206T000000Z/a.bin", ".spotguard-older-model.pt-20261206T000000Z"},
			"", doctorWarn, "holds 2 saves that restores moved aside, taking 0 B ("},
	} {
		t.Run(tc.name, func(t *testing.T) {
			dir := t.TempDir()
			for _, f := range tc.files {
				write(t, filepath.Join(dir, filepath.FromSlash(f)))
			}
			var rep doctorReport
			cfg := &agent.Config{}
			cfg.Checkpoint.Dir, cfg.Checkpoint.Marker = dir, tc.marker
			doctorCheckpointDir(&rep, cfg)
			if len(rep.Checks) != 1 || rep.Checks[0].Status != tc.state || !strings.Contains(rep.Checks[0].Detail, tc.want) {
				t.Fatalf("doctorCheckpointDir = %+v; want %s containing %q", rep.Checks, tc.state, tc.want)
			}
			if tc.name == "saves moved aside" {
				if want := filepath.Join(dir, ".spotguard-incomplete-step-1-20261206T000000Z"); !strings.Contains(rep.Checks[0].Detail, want) || !strings.HasPrefix(rep.Checks[0].Fix, "look at them, and delete them") {
					t.Errorf("doctorCheckpointDir = %+v; want %s named, and to delete them", rep.Checks, want)
				}
			} else if tc.state == doctorWarn && !strings.HasPrefix(rep.Checks[0].Fix, "set checkpoint.dir to "+filepath.Join(dir, "run1")+", if that is") {
				t.Errorf("fix %q; want checkpoint.dir %s", rep.Checks[0].Fix, filepath.Join(dir, "run1"))
			}
		})
	}
}

// A notice source answering with a body that cannot be parsed fails, and the fix line says what
// the agent makes of such a body for that source: before, every source's said a spot body's
// rule (a notice 2 minutes out), which is not what a garbled rebalance or ASG answer does (found
// from outside).
func TestDoctorGarbledSourceSaysWhatTheAgentMakesOfIt(t *testing.T) {
	for _, tc := range []struct{ path, want string }{
		{"spot/instance-action", "a spot body that cannot be read counts as a notice 2 minutes out"},
		{"events/maintenance/scheduled", "a scheduled event that cannot be read counts as due at once"},
		{"events/recommendations/rebalance", "while it lasts, this source's notices are not seen"},
	} {
		r := newDoctorRig(t)
		r.imds.bodies[tc.path] = "<html>proxy error</html>"
		code, out := r.run(t)
		if code != exitFail || !strings.Contains(out, "answers with a body that cannot be parsed") || !strings.Contains(out, tc.want) {
			t.Errorf("doctor with %s garbled: exit %d\n%s\nwant %d, the fix saying %q", tc.path, code, out, exitFail, tc.want)
		}
	}
}

// An active notice of a source the configuration ignores is said, with the policy, not with a
// fix telling the user to save now (found from outside: a rebalance under notices.rebalance:
// ignore).
func TestDoctorNoticeOfAnIgnoredSource(t *testing.T) {
	r := newDoctorRig(t)
	_, out := r.run(t, "--notices.rebalance", "ignore")
	if !strings.Contains(out, "(policy ignore)") || !strings.Contains(out, "notices.rebalance is ignore: the agent does not act on it") || strings.Contains(out, "save now") {
		t.Errorf("doctor with a rebalance notice ignored:\n%s", out)
	}
	if _, out := r.run(t); !strings.Contains(out, "save now") {
		t.Errorf("doctor with a rebalance notice:\n%s\nwant the fix to save now", out)
	}
}

// A relative checkpoint.dir fails the config check; the checkpoint.dir check said too that the
// agent waits for it to be created, looking from doctor's working directory (found from outside).
// It is not checked: its value is invalid.
func TestDoctorRelativeCheckpointDir(t *testing.T) {
	r := newDoctorRig(t)
	code, out := r.run(t, "--checkpoint.dir", "h29/ck1")
	if code == exitOK || strings.Contains(out, "the agent waits for it") || !strings.Contains(out, `checkpoint.dir: "h29/ck1" from --checkpoint.dir: must be an absolute path`) ||
		!strings.Contains(out, "checkpoint.dir    not checked: the value of checkpoint.dir did not load") {
		t.Errorf("doctor with a relative checkpoint.dir: exit %d\n%s", code, out)
	}
}

// A check of a key whose value is invalid, or of a file that is not YAML, would check the
// defaults: it is said not checked, not run (found from outside: a tab in one line made doctor
// probe IMDS at its default address and say no store.url and no trainer were configured; a bad
// store.url was "no store.url").
func TestDoctorDoesNotCheckTheDefaultsOfBadValues(t *testing.T) {
	r := newDoctorRig(t)
	code, out := r.run(t, "--store.url", "s3://b:9000/x", "--trainer.signal", "SIGNOPE")
	for _, want := range []string{
		"store             not checked: the value of store.url did not load",
		"trainer           not checked: the value of trainer.signal did not load",
		"PASS  imds ", // the rest is checked
	} {
		if !strings.Contains(out, want) {
			t.Errorf("doctor with a bad store.url and trainer.signal: exit %d\n%s\nwant %q", code, out, want)
		}
	}
	if strings.Contains(out, "no store.url") || code == exitOK {
		t.Errorf("doctor with a bad store.url: exit %d\n%s\nwant 1, and not \"no store.url\"", code, out)
	}
	code, out = r.run(t, "--imds.endpoint", "ftp://x")
	if !strings.Contains(out, "imds              not checked: the value of imds.endpoint did not load") || strings.Contains(out, "IMDSv2 session token refused") ||
		!strings.Contains(out, "PASS  cloudwatch        off") ||
		!strings.Contains(out, "PASS  store ") { // a file:// store needs no IMDS
		t.Errorf("doctor with a bad imds.endpoint: exit %d\n%s\nwant IMDS not checked, at no default address, and the file store checked", code, out)
	}
	// A misspelt section: its keys were not read, so their defaults are not checked.
	misspelt := filepath.Join(t.TempDir(), "misspelt.yaml")
	if err := os.WriteFile(misspelt, []byte("chekpoint:\n  dir: /data/ckpt\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	code, out = r.runConfig(t, misspelt)
	if code == exitOK || !strings.Contains(out, "did you mean checkpoint?") ||
		!strings.Contains(out, "checkpoint.dir    not checked: the value of checkpoint.dir did not load") {
		t.Errorf("doctor with a misspelt section: exit %d\n%s\nwant the section's likely name, and checkpoint.dir not checked", code, out)
	}
	path := filepath.Join(t.TempDir(), "tabbed.yaml")
	if err := os.WriteFile(path, []byte("store:\n  url: file:///tmp/x\n\tjob: j\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	code, out = r.runConfig(t, path)
	if code == exitOK || !strings.Contains(out, "not valid YAML") || !strings.Contains(out, "checks            not run: the file could not be read as YAML") ||
		strings.Contains(out, "imds") || strings.Contains(out, "no store.url") {
		t.Errorf("doctor with a file that is not YAML: exit %d\n%s\nwant its problem, and no check of the defaults", code, out)
	}
}
