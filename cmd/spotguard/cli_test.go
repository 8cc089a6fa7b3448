package main

import (
	"bytes"
	"context"
	"errors"
	"io/fs"
	"net"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/spotguard/spotguard/agent"
)

func runCLI(t *testing.T, ctx context.Context, env []string, args ...string) (int, string, string) {
	t.Helper()
	var stdout, stderr bytes.Buffer
	code := run(ctx, args, env, &stdout, &stderr)
	return code, stdout.String(), stderr.String()
}

func TestConfigCommand(t *testing.T) {
	dir := t.TempDir()
	good := filepath.Join(dir, "good.yaml")
	os.WriteFile(good, []byte("trainer:\n  match: train\\.py\nimds:\n  poll_interval: 500ms\n"), 0o644)
	code, stdout, stderr := runCLI(t, t.Context(), []string{"SPOTGUARD_TRAINER_SIGNAL=USR2"}, "config", "--config", good)
	if code != exitOK {
		t.Fatalf("config (good): exit %d, stderr %q", code, stderr)
	}
	for _, want := range []string{"poll_interval: 500ms  # " + good, "signal: USR2  # SPOTGUARD_TRAINER_SIGNAL", `match: train\.py`} {
		if !strings.Contains(stdout, want) {
			t.Errorf("config stdout lacks %q:\n%s", want, stdout)
		}
	}

	bad := filepath.Join(dir, "bad.yaml")
	os.WriteFile(bad, []byte("imds:\n  poll_interval: 10ms\n  colour: blue\n"), 0o644)
	code, _, stderr = runCLI(t, t.Context(), []string{"SPOTGUARD_TRAINER_SIGNAL=SIGSTOP"}, "config", "--config", bad)
	if code != exitFail {
		t.Errorf("config (bad): exit %d; want 1", code)
	}
	for _, want := range []string{"4 problem(s)", `imds.poll_interval: "10ms" from ` + bad + `:2: want 100ms to 5s`, "imds.colour: unknown key", "trainer.signal", "no way to find the trainer"} {
		if !strings.Contains(stderr, want) {
			t.Errorf("config (bad) stderr lacks %q:\n%s", want, stderr)
		}
	}

	// A file that is not YAML, or not a mapping of sections, is shown as nothing rather than as
	// every key at its default: the file sets them, `run` would refuse it.
	for name, text := range map[string]string{"notyaml.yaml": "store:\n  url: [\n", "list.yaml": "- store\n- trainer\n"} {
		path := filepath.Join(dir, name)
		os.WriteFile(path, []byte(text), 0o644)
		code, stdout, stderr = runCLI(t, t.Context(), nil, "config", "--config", path)
		if code != exitFail || stdout != "" || !strings.Contains(stderr, path+": ") {
			t.Errorf("config (%s): exit %d, stdout %q, stderr %q; want 1, nothing on stdout, the file named", name, code, stdout, stderr)
		}
	}

	code, _, stderr = runCLI(t, t.Context(), nil, "config", "--config", filepath.Join(dir, "absent.yaml"))
	if code != exitFail || !strings.Contains(stderr, "absent.yaml") {
		t.Errorf("config (absent file): exit %d, stderr %q; want 1 naming the file", code, stderr)
	}
}

// A bad config never starts the daemon: no listener is opened.
func TestRunRefusesBadConfig(t *testing.T) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	addr := ln.Addr().String()
	ln.Close()
	code, _, stderr := runCLI(t, t.Context(), []string{"SPOTGUARD_HTTP_LISTEN=" + addr, "SPOTGUARD_IMDS_POLL_INTERVAL=1ms"}, "run", "--config", agentDefaultPathForTest(t))
	if code != exitFail {
		t.Errorf("run (bad config): exit %d; want 1", code)
	}
	if !strings.Contains(stderr, "not starting") || !strings.Contains(stderr, "imds.poll_interval") || !strings.Contains(stderr, "no way to find the trainer") {
		t.Errorf("run (bad config) stderr = %q; want every problem listed", stderr)
	}
	if c, err := net.Dial("tcp", addr); err == nil {
		c.Close()
		t.Errorf("something listens on %s: the daemon started with a bad config", addr)
	}
}

func agentDefaultPathForTest(t *testing.T) string {
	p := filepath.Join(t.TempDir(), "empty.yaml")
	os.WriteFile(p, nil, 0o644)
	return p
}

// run with a good config starts, serves /healthz, and exits 0 when its context ends.
func TestRunStartsAndStops(t *testing.T) {
	imdsSrv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.Method == http.MethodPut {
			w.Write([]byte("token"))
			return
		}
		http.NotFound(w, r)
	}))
	defer imdsSrv.Close()
	ln, _ := net.Listen("tcp", "127.0.0.1:0")
	addr := ln.Addr().String()
	ln.Close()
	env := []string{
		"AWS_EC2_METADATA_SERVICE_ENDPOINT=" + imdsSrv.URL, "AWS_REGION=us-east-1", "HOME=" + t.TempDir(),
		"SPOTGUARD_HTTP_LISTEN=" + addr, "SPOTGUARD_TRAINER_MATCH=no-such-trainer-xyz",
		"SPOTGUARD_AGENT_RUNTIME_DIR=" + t.TempDir(), "SPOTGUARD_METRICS_CLOUDWATCH=false",
	}
	ctx, cancel := context.WithCancel(t.Context())
	done := make(chan int)
	var stderr bytes.Buffer
	go func() {
		done <- run(ctx, []string{"run", "--config", agentDefaultPathForTest(t)}, env, &bytes.Buffer{}, &stderr)
	}()
	deadline := time.Now().Add(10 * time.Second)
	for {
		resp, err := http.Get("http://" + addr + "/healthz")
		if err == nil {
			resp.Body.Close()
			if resp.StatusCode != http.StatusOK {
				t.Errorf("/healthz = %d; want 200", resp.StatusCode)
			}
			break
		}
		if time.Now().After(deadline) {
			cancel()
			<-done
			t.Fatalf("agent never listened on %s:\n%s", addr, stderr.String())
		}
		select {
		case code := <-done:
			t.Fatalf("run exited early with %d:\n%s", code, stderr.String())
		case <-time.After(10 * time.Millisecond):
		}
	}
	cancel()
	if code := <-done; code != exitOK {
		t.Errorf("run exit = %d after cancel; want 0\n%s", code, stderr.String())
	}
}

// An AWS configuration that cannot be loaded (a profile that does not exist) is a problem only
// where AWS is needed: `config` and `run` refuse an s3:// store with the same message, and only
// warn (CloudWatch off) without one.
func TestUnusableAWSProfile(t *testing.T) {
	dir := t.TempDir()
	t.Setenv("AWS_CONFIG_FILE", filepath.Join(dir, "aws-config"))
	t.Setenv("AWS_SHARED_CREDENTIALS_FILE", filepath.Join(dir, "aws-credentials"))
	t.Setenv("AWS_PROFILE", "nosuch")
	os.WriteFile(filepath.Join(dir, "aws-config"), []byte("[profile other]\nregion = eu-west-1\n"), 0o644)
	cfgPath := filepath.Join(dir, "spotguard.yaml")
	os.WriteFile(cfgPath, []byte("trainer:\n  match: train\\.py\n"), 0o644)
	ckdir := t.TempDir()
	s3env := []string{"SPOTGUARD_STORE_URL=s3://bucket/p", "SPOTGUARD_STORE_JOB=j", "SPOTGUARD_CHECKPOINT_DIR=" + ckdir}
	const want = "store.url: s3://bucket/p needs AWS: cannot load the AWS configuration from AWS_PROFILE=nosuch"

	code, _, stderr := runCLI(t, t.Context(), s3env, "config", "--config", cfgPath)
	if code != exitFail || !strings.Contains(stderr, want) || !strings.Contains(stderr, "nosuch") {
		t.Errorf("config with an s3 store: exit %d; want 1 and %q:\n%s", code, want, stderr)
	}
	code, _, runErr := runCLI(t, t.Context(), append(s3env, "SPOTGUARD_HTTP_LISTEN="), "run", "--config", cfgPath)
	if code != exitFail || !strings.Contains(runErr, want) {
		t.Errorf("run with an s3 store: exit %d; want 1 and %q:\n%s", code, want, runErr)
	}

	code, _, stderr = runCLI(t, t.Context(), nil, "config", "--config", cfgPath)
	if code != exitOK || !strings.Contains(stderr, "warning: metrics.cloudwatch: CloudWatch metrics are off (everything else runs): cannot load the AWS configuration from AWS_PROFILE=nosuch") {
		t.Errorf("config without a store: exit %d; want 0 and a warning:\n%s", code, stderr)
	}
	code, _, stderr = runCLI(t, t.Context(), []string{"SPOTGUARD_METRICS_CLOUDWATCH=false"}, "config", "--config", cfgPath)
	if code != exitOK || strings.Contains(stderr, "warning") {
		t.Errorf("config signal-only without CloudWatch: exit %d; want 0 and no warning:\n%s", code, stderr)
	}
}

// restore --no-create (the restore unit's): a missing --to is created only in a parent that is a
// mount point (a fresh disk); under a plain directory (a disk not mounted yet) it fails naming
// the directory and creates nothing. Without --to, checkpoint.dir is the destination.
func TestRestoreNoCreate(t *testing.T) {
	store := t.TempDir()
	env := []string{"SPOTGUARD_STORE_URL=file://" + store, "SPOTGUARD_STORE_JOB=j"}
	cfgPath := filepath.Join(t.TempDir(), "empty.yaml")
	os.WriteFile(cfgPath, nil, 0o644)

	unmounted := filepath.Join(t.TempDir(), "nvme") // a mount point's directory, nothing mounted
	os.Mkdir(unmounted, 0o755)
	to := filepath.Join(unmounted, "checkpoints")
	code, _, stderr := runCLI(t, t.Context(), env, "restore", "--config", cfgPath, "--allow-empty", "--no-create", "--to", to)
	if code != exitFail || !strings.Contains(stderr, to+" does not exist and "+unmounted+" is not a mount point") || !strings.Contains(stderr, "mkdir -p "+to) {
		t.Errorf("restore --no-create into an unmounted disk: exit %d, stderr %q; want 1 naming both and the fix", code, stderr)
	}
	if _, err := os.Stat(to); !os.IsNotExist(err) {
		t.Errorf("%s was created: %v", to, err)
	}
	code, _, stderr = runCLI(t, t.Context(), env, "restore", "--config", cfgPath, "--allow-empty", "--no-create", "--to", filepath.Join(unmounted, "a", "b"))
	if code != exitFail || !strings.Contains(stderr, "is the disk it belongs on mounted?") {
		t.Errorf("restore --no-create two levels down: exit %d, stderr %q", code, stderr)
	}

	// A link to a disk not mounted yet is said so: mkdir -p, the fix above, fails on it (found
	// from outside).
	link, target := filepath.Join(t.TempDir(), "ckpt"), filepath.Join(unmounted, "not-yet", "checkpoints")
	if err := os.Symlink(target, link); err != nil {
		t.Fatal(err)
	}
	code, _, stderr = runCLI(t, t.Context(), env, "restore", "--config", cfgPath, "--allow-empty", "--no-create", "--to", link)
	if code != exitFail || !strings.Contains(stderr, "--to "+link+" is a symbolic link to "+target+", which does not exist: is the disk it leads to mounted?") || strings.Contains(stderr, "mkdir -p") {
		t.Errorf("restore --no-create into a link to nowhere: exit %d, stderr %q; want 1 naming the link and where it leads", code, stderr)
	}

	// Interactive restore still creates it.
	code, stdout, stderr := runCLI(t, t.Context(), env, "restore", "--config", cfgPath, "--allow-empty", "--to", to)
	if code != exitOK || !strings.Contains(stdout, "nothing to restore") {
		t.Errorf("restore without --no-create: exit %d %q %q", code, stdout, stderr)
	}
	// An existing one is fine; with no --to it is checkpoint.dir.
	if err := os.MkdirAll(to, 0o755); err != nil {
		t.Fatal(err)
	}
	code, stdout, stderr = runCLI(t, t.Context(), append(env, "SPOTGUARD_CHECKPOINT_DIR="+to), "restore", "--config", cfgPath, "--allow-empty", "--no-create", "--to=")
	if code != exitOK || !strings.Contains(stdout, "nothing to restore") {
		t.Errorf("restore --no-create --to= into checkpoint.dir: exit %d %q %q", code, stdout, stderr)
	}
	code, _, stderr = runCLI(t, t.Context(), env, "restore", "--config", cfgPath, "--allow-empty")
	if code != exitUsage || !strings.Contains(stderr, "--to DIR is required when checkpoint.dir is not set") {
		t.Errorf("restore with neither --to nor checkpoint.dir: exit %d %q", code, stderr)
	}
	// Without --allow-empty, nothing committed fails, and the fix names it (found from outside:
	// the error said nothing of it).
	code, _, stderr = runCLI(t, t.Context(), env, "restore", "--config", cfgPath, "--to", to)
	if code != exitFail || !strings.Contains(stderr, "if this is the job's first run, --allow-empty exits 0") {
		t.Errorf("restore with nothing committed: exit %d %q; want 1, the fix naming --allow-empty", code, stderr)
	}
}

// A missing directory in a mount point is a fresh disk: allowed. /proc is one on every Linux.
func TestCheckRestoreTargetUnderAMountPoint(t *testing.T) {
	if err := checkRestoreTarget("/proc/spotguard-no-such-dir"); err != nil {
		t.Errorf("checkRestoreTarget under /proc = %v; want nil (a mount point)", err)
	}
	if m, err := isMountPoint("/"); m || err != nil {
		t.Errorf("isMountPoint(/) = %v, %v; want false: the root volume is what --no-create protects", m, err)
	}
}

func TestConfigGet(t *testing.T) {
	cfgPath := filepath.Join(t.TempDir(), "c.yaml")
	os.WriteFile(cfgPath, []byte("checkpoint:\n  dir: /data/ckpt\n"), 0o644)
	code, stdout, _ := runCLI(t, t.Context(), nil, "config", "--config", cfgPath, "--get", "checkpoint.dir")
	if code != exitOK || stdout != "/data/ckpt\n" {
		t.Errorf("config --get checkpoint.dir: exit %d, %q; want 0 and the value (the config is incomplete: no trainer, no store)", code, stdout)
	}
	code, _, stderr := runCLI(t, t.Context(), nil, "config", "--config", cfgPath, "--get", "checkpoint.nope")
	if code != exitUsage || !strings.Contains(stderr, "checkpoint.nope: no such key") {
		t.Errorf("config --get of an unknown key: exit %d, %q", code, stderr)
	}
	// A file that does not load gives no value: here a second checkpoint section, which would
	// otherwise be dropped and the value read as empty.
	os.WriteFile(cfgPath, []byte("checkpoint:\n  # dir: /x\ncheckpoint:\n  dir: /data/ckpt\n"), 0o644)
	code, stdout, stderr = runCLI(t, t.Context(), nil, "config", "--config", cfgPath, "--get", "checkpoint.dir")
	if code != exitFail || stdout != "" || !strings.Contains(stderr, "section checkpoint appears twice") {
		t.Errorf("config --get with a duplicate section: exit %d, %q, %q; want 1, nothing, the problem", code, stdout, stderr)
	}
}

// --mount-wait: a destination that appears while restore waits (a disk mounted late, with the
// directory on it) is used; one that never does fails after the wait, naming both.
func TestWaitRestoreTarget(t *testing.T) {
	parent := filepath.Join(t.TempDir(), "nvme")
	os.Mkdir(parent, 0o755)
	to := filepath.Join(parent, "checkpoints")
	err := waitRestoreTarget(t.Context(), to, 30*time.Millisecond, time.Millisecond)
	if err == nil || !strings.Contains(err.Error(), "after waiting 30ms") || !strings.Contains(err.Error(), "is not a mount point") {
		t.Errorf("waitRestoreTarget on a never-mounted disk = %v", err)
	}
	if _, err := os.Stat(to); !os.IsNotExist(err) {
		t.Errorf("%s was created while waiting: %v", to, err)
	}

	done := make(chan error, 1)
	go func() { done <- waitRestoreTarget(t.Context(), to, time.Minute, time.Millisecond) }()
	if err := os.Mkdir(to, 0o755); err != nil {
		t.Fatal(err)
	}
	if err := <-done; err != nil {
		t.Errorf("waitRestoreTarget after the directory appeared = %v", err)
	}
}

// A job whose LATEST is there but whose commits are gone (an S3 lifecycle rule, a hand delete)
// had a checkpoint: restore --allow-empty exited 0 as for a first run, and the trainer started
// from scratch. It fails now, saying so and what to do, with a LATEST that is garbage too.
// (Found from outside.)
func TestRestoreAllowEmptyRefusesAJobWhoseCommitsAreGone(t *testing.T) {
	for _, latest := range []string{`{"version":2,"checkpoint":"step-9","commit":"20260101T000000Z-0123456789ab"}`, "garbage"} {
		store := t.TempDir()
		if err := os.MkdirAll(filepath.Join(store, "j"), 0o755); err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(filepath.Join(store, "j", "LATEST"), []byte(latest), 0o644); err != nil {
			t.Fatal(err)
		}
		env := []string{"SPOTGUARD_STORE_URL=file://" + store, "SPOTGUARD_STORE_JOB=j"}
		code, stdout, stderr := runCLI(t, t.Context(), env, "restore", "--allow-empty", "--to", t.TempDir())
		if code != exitFail || !strings.Contains(stderr, "has a LATEST") || !strings.Contains(stderr, "this is not a first run") ||
			!strings.Contains(stderr, "delete j/LATEST to start the job from scratch") || strings.Contains(stdout, "first run") {
			t.Errorf("restore --allow-empty with LATEST %s and no commit: exit %d, stdout %q, stderr %q; want 1, saying the commits are gone", latest, code, stdout, stderr)
		}
	}
}

// An empty --config (an unset variable in a script, --config "$CFG") is a usage error for every
// command that loads the configuration: it read no file at all, every key at its default, and
// said nothing (found from outside).
func TestEmptyConfigFlagIsAUsageError(t *testing.T) {
	for _, cmd := range []string{"run", "config", "doctor", "restore", "list", "drill", "notify"} {
		code, _, stderr := runCLI(t, t.Context(), nil, cmd, "--config", "")
		if code != exitUsage || !strings.Contains(stderr, "--config is empty") {
			t.Errorf("Got(%s --config \"\") exit %d, stderr %q; want %d and \"--config is empty\"", cmd, code, stderr, exitUsage)
		}
	}
}

// `config` says so when there is no configuration file at all: a newcomer saw only "no way to
// find the trainer" (found from outside).
func TestConfigSaysThereIsNoFile(t *testing.T) {
	const line = "# no configuration file: " + agent.DefaultConfigPath + " does not exist"
	_, err := os.Stat(agent.DefaultConfigPath)
	code, stdout, stderr := runCLI(t, t.Context(), []string{"SPOTGUARD_TRAINER_MATCH=x"}, "config")
	switch {
	case errors.Is(err, fs.ErrNotExist):
		if code != exitOK || !strings.HasPrefix(stdout, line) {
			t.Errorf("config without %s: exit %d, stdout:\n%s\nstderr %q; want 0 and a first line %q", agent.DefaultConfigPath, code, stdout, stderr, line)
		}
	case err == nil: // this machine has one: not said
		if strings.Contains(stdout, line) {
			t.Errorf("config with %s there said:\n%s", agent.DefaultConfigPath, stdout)
		}
	}
	if errors.Is(err, fs.ErrNotExist) { // run says so too, refusing what it lacks
		_, _, stderr := runCLI(t, t.Context(), nil, "run")
		if want := "(there is no " + agent.DefaultConfigPath + ": defaults, SPOTGUARD_* variables and flags only)"; !strings.Contains(stderr, want) {
			t.Errorf("run without %s: stderr\n%s\nwant %q", agent.DefaultConfigPath, stderr, want)
		}
	}
	path := filepath.Join(t.TempDir(), "spotguard.yaml")
	os.WriteFile(path, []byte("trainer:\n  match: x\n"), 0o644)
	if _, stdout, _ := runCLI(t, t.Context(), nil, "config", "--config", path); strings.Contains(stdout, "# no configuration file") {
		t.Errorf("config --config %s said there is no file:\n%s", path, stdout)
	}
}
