// Package e2e runs the built spotguard binary against AWS's IMDS simulator (ec2-metadata-mock, a
// real subprocess in IMDSv2-only mode) and a real trainer process that records the signals it
// receives.
package e2e

import (
	"bufio"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/spotguard/spotguard/checkpoint"
)

var (
	repoRoot     string
	spotguardBin string
	aemmBin      string
	pythonBin    string
	setupErr     error
)

func TestMain(m *testing.M) {
	_, file, _, _ := runtime.Caller(0)
	repoRoot = filepath.Clean(filepath.Join(filepath.Dir(file), "..", ".."))
	dir, err := os.MkdirTemp("", "spotguard-e2e-")
	if err == nil {
		err = os.Chmod(dir, 0o755) // an agent run as another user (startAgentAs) runs the binary in it
	}
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		os.Exit(1)
	}
	code := func() int {
		defer os.RemoveAll(dir)
		setupErr = setup(dir)
		return m.Run()
	}()
	os.Exit(code)
}

// setup builds the agent and finds the peers. A missing peer is an error under CI (CI installs
// them) and a skip, with the reason, elsewhere.
func setup(dir string) error {
	spotguardBin = filepath.Join(dir, "spotguard")
	build := exec.Command("go", "build", "-o", spotguardBin, "./cmd/spotguard")
	build.Dir = repoRoot
	if out, err := build.CombinedOutput(); err != nil {
		return fmt.Errorf("build spotguard: %v\n%s", err, out)
	}
	if p, err := exec.LookPath(filepath.Join(repoRoot, "bin", "ec2-metadata-mock")); err == nil {
		aemmBin = p
	} else if p, err := exec.LookPath("ec2-metadata-mock"); err == nil {
		aemmBin = p
	} else {
		return fmt.Errorf("ec2-metadata-mock not found in bin/ or PATH (run `make tools`)")
	}
	p, err := exec.LookPath("python3")
	if err != nil {
		return fmt.Errorf("python3 not found: %w", err)
	}
	pythonBin = p
	return nil
}

// needPeers fails the test under CI, and skips it elsewhere, when a peer is missing.
func needPeers(t testing.TB) {
	t.Helper()
	if setupErr == nil {
		return
	}
	if os.Getenv("CI") != "" {
		t.Fatalf("end-to-end peers missing under CI: %v", setupErr)
	}
	t.Skipf("end-to-end peers missing: %v", setupErr)
}

// freePort returns a TCP port on 127.0.0.1 that was free a moment ago.
func freePort(t testing.TB) int {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer ln.Close()
	return ln.Addr().(*net.TCPAddr).Port
}

// eventually polls cond every 20 ms until it is true or the deadline passes.
func eventually(t testing.TB, within time.Duration, what string, cond func() bool) {
	t.Helper()
	deadline := time.Now().Add(within)
	tick := time.NewTicker(20 * time.Millisecond)
	defer tick.Stop()
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatalf("timed out after %s waiting for %s", within, what)
		}
		<-tick.C
	}
}

// imdsSim is one run of AWS's IMDS simulator on a fixed port, so it can be restarted in place.
type imdsSim struct {
	t    testing.TB
	port int
	cmd  *exec.Cmd
	done chan struct{}
}

func newIMDS(t testing.TB) *imdsSim {
	return &imdsSim{t: t, port: freePort(t)}
}

func (s *imdsSim) endpoint() string { return fmt.Sprintf("http://127.0.0.1:%d", s.port) }

// start runs the simulator with args (a subcommand and its flags) in IMDSv2-only mode, answering
// every client IP, and waits until it hands out tokens.
// startSpotTermination starts the simulator with a spot termination notice that begins 4 s from
// now (on a whole second), no rebalance recommendation, and extra arguments.
func (s *imdsSim) startSpotTermination(extra ...string) {
	s.t.Helper()
	trigger := time.Now().Truncate(time.Second).Add(4 * time.Second)
	s.start(append([]string{"spot", "-a", "terminate", "--mock-trigger-time", trigger.UTC().Format(time.RFC3339),
		"--rebalance-delay-sec", "100000"}, extra...)...)
}

func (s *imdsSim) start(args ...string) {
	t := s.t
	t.Helper()
	if s.cmd != nil {
		t.Fatal("simulator already running")
	}
	full := append(append([]string{}, args...), "-I", "-x", "-1", "-n", "127.0.0.1", "-p", fmt.Sprint(s.port))
	cmd := exec.Command(aemmBin, full...)
	cmd.Dir = t.TempDir() // it looks for a config file in $HOME and the working dir
	cmd.Env = append(os.Environ(), "HOME="+cmd.Dir)
	logf, err := os.Create(filepath.Join(cmd.Dir, "aemm.log"))
	if err != nil {
		t.Fatal(err)
	}
	cmd.Stdout, cmd.Stderr = logf, logf
	if err := cmd.Start(); err != nil {
		t.Fatalf("start ec2-metadata-mock: %v", err)
	}
	s.cmd, s.done = cmd, make(chan struct{})
	go func(done chan struct{}) { cmd.Wait(); logf.Close(); close(done) }(s.done)
	t.Cleanup(s.stop)
	eventually(t, 15*time.Second, "ec2-metadata-mock to serve tokens", func() bool {
		req, _ := http.NewRequest(http.MethodPut, s.endpoint()+"/latest/api/token", nil)
		req.Header.Set("X-aws-ec2-metadata-token-ttl-seconds", "60")
		resp, err := http.DefaultClient.Do(req)
		if err != nil {
			return false
		}
		resp.Body.Close()
		return resp.StatusCode == http.StatusOK
	})
}

// stop kills the simulator and waits for it to exit.
func (s *imdsSim) stop() {
	if s.cmd == nil {
		return
	}
	s.cmd.Process.Kill()
	<-s.done
	s.cmd = nil
}

// trainerProc is the example Python trainer, recording every signal it receives.
type trainerProc struct {
	cmd       *exec.Cmd
	signalLog string
	pidfile   string
	done      chan struct{}
	tag       string // unique in its command line (its temp dir), for trainer.match
}

type signalRecord struct {
	Signal string `json:"signal"`
	PID    int    `json:"pid"`
	TimeNS int64  `json:"time_ns"`
}

// startTrainer starts examples/python/trainer.py with extra args and waits until its handlers are
// installed.
func startTrainer(t testing.TB, extra ...string) *trainerProc {
	t.Helper()
	dir := t.TempDir()
	tp := &trainerProc{
		signalLog: filepath.Join(dir, "signals.jsonl"),
		pidfile:   filepath.Join(dir, "trainer.pid"),
		done:      make(chan struct{}),
		tag:       dir,
	}
	ready := filepath.Join(dir, "ready")
	args := append([]string{filepath.Join(repoRoot, "examples", "python", "trainer.py"),
		"--signal-log", tp.signalLog, "--ready-file", ready, "--pidfile", tp.pidfile}, extra...)
	cmd := exec.Command(pythonBin, args...)
	out, err := os.Create(filepath.Join(dir, "trainer.out"))
	if err != nil {
		t.Fatal(err)
	}
	cmd.Stdout, cmd.Stderr = out, out
	if err := cmd.Start(); err != nil {
		t.Fatalf("start trainer: %v", err)
	}
	tp.cmd = cmd
	go func() { cmd.Wait(); out.Close(); close(tp.done) }()
	t.Cleanup(func() {
		cmd.Process.Kill()
		<-tp.done
	})
	eventually(t, 15*time.Second, "the trainer to install its handlers", func() bool {
		_, err := os.Stat(ready)
		return err == nil
	})
	return tp
}

// signals returns the signals the trainer has recorded so far.
func (tp *trainerProc) signals(t testing.TB) []signalRecord {
	t.Helper()
	f, err := os.Open(tp.signalLog)
	if os.IsNotExist(err) {
		return nil
	}
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	var recs []signalRecord
	sc := bufio.NewScanner(f)
	for sc.Scan() {
		var r signalRecord
		if err := json.Unmarshal(sc.Bytes(), &r); err != nil {
			continue // a line being written
		}
		recs = append(recs, r)
	}
	return recs
}

func (tp *trainerProc) alive() bool {
	select {
	case <-tp.done:
		return false
	default:
		return tp.cmd.Process.Signal(syscall.Signal(0)) == nil
	}
}

// agentProc is the built spotguard binary running `spotguard run`.
type agentProc struct {
	cmd        *exec.Cmd
	done       chan struct{}
	base       string // http://127.0.0.1:PORT
	runtimeDir string
	logPath    string
	configPath string
	exitErr    error
}

// startAgent runs `spotguard run` against sim with env (KEY=value) on top of a minimal environment,
// and waits for /healthz to answer.
func startAgent(t testing.TB, sim *imdsSim, env ...string) *agentProc {
	t.Helper()
	return startAgentWithConfig(t, sim, "# defaults\n", env...)
}

// startAgentWithConfig is startAgent with a config file holding config (ap.configPath).
func startAgentWithConfig(t testing.TB, sim *imdsSim, config string, env ...string) *agentProc {
	t.Helper()
	return startAgentAs(t, sim, 0, config, env...)
}

// startAgentAs is startAgentWithConfig with the agent running as the user and group uid (0:
// the test's own); its files (config, runtime_dir, HOME) are in a directory that user owns.
func startAgentAs(t testing.TB, sim *imdsSim, uid int, config string, env ...string) *agentProc {
	t.Helper()
	dir := t.TempDir()
	if uid != 0 {
		needRoot(t, "to run the agent as another user")
		// t.TempDir's parent is the test's own, 0700: this directory is one the user can reach.
		d, err := os.MkdirTemp("", "spotguard-agent-")
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { os.RemoveAll(d) })
		if err := os.Chmod(d, 0o755); err != nil {
			t.Fatal(err)
		}
		if err := os.Chown(d, uid, uid); err != nil {
			t.Fatal(err)
		}
		dir = d
	}
	port := freePort(t)
	ap := &agentProc{
		done:       make(chan struct{}),
		base:       fmt.Sprintf("http://127.0.0.1:%d", port),
		runtimeDir: filepath.Join(dir, "run"),
		logPath:    filepath.Join(dir, "agent.log"),
	}
	ap.configPath = filepath.Join(dir, "spotguard.yaml")
	if err := os.WriteFile(ap.configPath, []byte(config), 0o644); err != nil {
		t.Fatal(err)
	}
	cmd := exec.Command(spotguardBin, "run", "--config", ap.configPath)
	if uid != 0 {
		cmd.SysProcAttr = &syscall.SysProcAttr{Credential: &syscall.Credential{Uid: uint32(uid), Gid: uint32(uid)}}
	}
	cmd.Env = append([]string{
		"PATH=" + os.Getenv("PATH"),
		"HOME=" + dir,
		"AWS_EC2_METADATA_SERVICE_ENDPOINT=" + sim.endpoint(), // and no AWS_REGION: the region comes from the simulator
		"SPOTGUARD_HTTP_LISTEN=" + fmt.Sprintf("127.0.0.1:%d", port),
		"SPOTGUARD_AGENT_RUNTIME_DIR=" + ap.runtimeDir,
		"SPOTGUARD_LOG_LEVEL=debug",
		"SPOTGUARD_METRICS_CLOUDWATCH=false", // tests never reach AWS; the CloudWatch test turns it on with a local endpoint
	}, env...)
	logf, err := os.Create(ap.logPath)
	if err != nil {
		t.Fatal(err)
	}
	cmd.Stdout, cmd.Stderr = logf, logf
	for i, kv := range cmd.Env {
		if kv == journalStreamStderr {
			cmd.Env[i] = "JOURNAL_STREAM=" + journalStreamOf(t, logf)
		}
	}
	if err := cmd.Start(); err != nil {
		t.Fatalf("start spotguard: %v", err)
	}
	ap.cmd = cmd
	go func() { ap.exitErr = cmd.Wait(); logf.Close(); close(ap.done) }()
	t.Cleanup(func() {
		ap.stop(t)
		if t.Failed() {
			log, _ := os.ReadFile(ap.logPath)
			t.Logf("agent log:\n%s", log)
		}
	})
	eventually(t, 20*time.Second, "spotguard to answer /healthz", func() bool {
		select {
		case <-ap.done:
			log, _ := os.ReadFile(ap.logPath)
			t.Fatalf("spotguard exited early: %v\n%s", ap.exitErr, log)
		default:
		}
		resp, err := http.Get(ap.base + "/healthz")
		if err != nil {
			return false
		}
		resp.Body.Close()
		return true
	})
	return ap
}

// stop sends SIGTERM and waits for the agent to exit, failing the test if it does not within 5 s.
func (ap *agentProc) stop(t testing.TB) {
	select {
	case <-ap.done:
		return
	default:
	}
	ap.cmd.Process.Signal(syscall.SIGTERM)
	select {
	case <-ap.done:
		if ap.exitErr != nil {
			t.Errorf("spotguard exited with %v after SIGTERM; want 0", ap.exitErr)
		}
	case <-time.After(5 * time.Second):
		ap.cmd.Process.Kill()
		<-ap.done
		t.Errorf("spotguard did not stop within 5s of SIGTERM")
	}
}

// sigtermWithin sends SIGTERM and waits for the agent to exit: the test fails at once if it is
// still running after within, and fails unless it exits 0 (when says what the SIGTERM came
// during).
func (ap *agentProc) sigtermWithin(t testing.TB, within time.Duration, when string) {
	t.Helper()
	ap.cmd.Process.Signal(syscall.SIGTERM)
	select {
	case <-ap.done:
	case <-time.After(within):
		t.Fatalf("agent still running %v after SIGTERM", within)
	}
	if ap.exitErr != nil {
		t.Errorf("exit after SIGTERM %s: %v; want 0", when, ap.exitErr)
	}
}

// agentStatus is the part of /status the tests read.
type agentStatus struct {
	Config struct {
		NeedRestart []string `json:"need_restart"`
	} `json:"config"`
	Instance struct {
		InstanceID       string `json:"instance_id"`
		InstanceType     string `json:"instance_type"`
		AvailabilityZone string `json:"availability_zone"`
	} `json:"instance"`
	IMDS struct {
		Healthy bool `json:"healthy"`
		Sources map[string]struct {
			Polls  int64 `json:"polls"`
			Errors int64 `json:"errors"`
		} `json:"sources"`
	} `json:"imds"`
	Trainers []struct {
		PID           int  `json:"pid"`
		CatchesSignal bool `json:"catches_signal"`
	} `json:"trainers"`
	Uploads *struct {
		Urgent      bool `json:"urgent"`
		Checkpoints []struct {
			Name        string `json:"name"`
			Files       int    `json:"files"`
			FilesStored int    `json:"files_stored"`
			Committed   bool   `json:"committed"`
		} `json:"checkpoints"`
	} `json:"uploads"`
	Store struct {
		Concurrency *checkpoint.LimiterStats `json:"concurrency"`
	} `json:"store"`
	Notices []struct {
		Key         string     `json:"key"`
		Source      string     `json:"source"`
		Action      string     `json:"action"`
		State       string     `json:"state"`
		Active      bool       `json:"active"`
		Deadline    *time.Time `json:"deadline"`
		DetectedAt  time.Time  `json:"detected_at"`
		Transitions []struct {
			State           string  `json:"state"`
			SinceDetectedMS float64 `json:"since_detected_ms"`
			Detail          string  `json:"detail"`
		} `json:"transitions"`
		Signals []struct {
			PID     int    `json:"pid"`
			Outcome string `json:"outcome"`
		} `json:"signals"`
	} `json:"notices"`
}

func (ap *agentProc) status(t testing.TB) agentStatus {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	req, _ := http.NewRequestWithContext(ctx, http.MethodGet, ap.base+"/status", nil)
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatalf("GET /status: %v", err)
	}
	defer resp.Body.Close()
	var st agentStatus
	if err := json.NewDecoder(resp.Body).Decode(&st); err != nil {
		t.Fatalf("decode /status: %v", err)
	}
	return st
}

// polls is how many times the agent has read a source so far.
func (st agentStatus) polls(source string) int64 { return st.IMDS.Sources[source].Polls }

// waitPolls waits until the agent has polled source n more times than it had at the call, so that
// "nothing more happened" can be asserted without sleeping.
func (ap *agentProc) waitPolls(t testing.TB, source string, n int64) {
	t.Helper()
	start := ap.status(t).polls(source)
	eventually(t, 20*time.Second, fmt.Sprintf("%d more polls of %s", n, source), func() bool {
		return ap.status(t).polls(source) >= start+n
	})
}

func (ap *agentProc) log(t testing.TB) string {
	b, err := os.ReadFile(ap.logPath)
	if err != nil {
		t.Fatal(err)
	}
	return string(b)
}

// metric returns the text of /metrics.
func (ap *agentProc) metrics(t testing.TB) string {
	t.Helper()
	resp, err := http.Get(ap.base + "/metrics")
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	b, _ := io.ReadAll(resp.Body)
	return string(b)
}

// metricValue returns the value of the series name (with its labels, if any) in metrics, the
// text /metrics serves; the test fails if it is not there.
func metricValue(t testing.TB, metrics, name string) float64 {
	t.Helper()
	for _, l := range strings.Split(metrics, "\n") {
		if v, ok := strings.CutPrefix(l, name+" "); ok {
			f, err := strconv.ParseFloat(v, 64)
			if err != nil {
				t.Fatalf("%s: %v", name, err)
			}
			return f
		}
	}
	t.Fatalf("no series %s in the metrics", name)
	return 0
}

// hasLine reports whether text has a line starting with prefix.
func hasLine(text, prefix string) bool {
	for _, l := range strings.Split(text, "\n") {
		if strings.HasPrefix(l, prefix) {
			return true
		}
	}
	return false
}
