package e2e

import (
	"bytes"
	"fmt"
	"maps"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"
)

// torchrunBin returns torchrun, whose Python can import torch: Debian's python3-torch (CPU) does.
// A missing one fails the test under CI (.ci/run installs it) and skips it elsewhere.
func torchrunBin(t testing.TB) string {
	t.Helper()
	p, err := exec.LookPath("torchrun")
	if err == nil {
		if out, herr := exec.Command(p, "--help").CombinedOutput(); herr != nil {
			lines := strings.Split(strings.TrimSpace(string(out)), "\n")
			err = fmt.Errorf("%s --help: %v: %s", p, herr, lines[len(lines)-1])
		}
	}
	if err != nil {
		if os.Getenv("CI") != "" {
			t.Fatalf("torchrun missing under CI (.ci/run installs python3-torch): %v", err)
		}
		t.Skipf("torchrun not usable (apt-get install python3-torch): %v", err)
	}
	return p
}

// torchJob is examples/pytorch/dcp_signal.py under a real torchrun: two ranks on CPU (gloo).
type torchJob struct {
	cmd  *exec.Cmd
	done chan struct{}
	err  error
	mu   sync.Mutex
	out  bytes.Buffer // torchrun's output: rank 0's lines as "[default0]:..."
}

func (j *torchJob) Write(p []byte) (int, error) {
	j.mu.Lock()
	defer j.mu.Unlock()
	return j.out.Write(p)
}

func (j *torchJob) output() string {
	j.mu.Lock()
	defer j.mu.Unlock()
	return j.out.String()
}

// startTorchJob runs torchrun --nproc_per_node 2 dcp_signal.py --save-with torch with args, in a
// process group of its own that the test kills at the end, env on top of PATH and HOME.
func startTorchJob(t *testing.T, env []string, args ...string) *torchJob {
	t.Helper()
	// Per-rank redirects (0:1,1:1): PyTorch 1.13's single values do not parse on Python 3.11.
	return startTorchrun(t, env, []string{"--nproc_per_node", "2", "--master_addr", "127.0.0.1",
		"--master_port", strconv.Itoa(freePort(t)), "--redirects", "0:1,1:1", "--tee", "0:1,1:1"}, args...)
}

// startTorchrun runs torchrun with launch (its own options) and dcp_signal.py --save-with torch
// with args, in a process group of its own that the test kills at the end, env on top of PATH and
// HOME.
func startTorchrun(t *testing.T, env, launch []string, args ...string) *torchJob {
	t.Helper()
	bin := torchrunBin(t)
	cmdArgs := append(append(launch, "--log_dir", t.TempDir(),
		filepath.Join(repoRoot, "examples", "pytorch", "dcp_signal.py"), "--save-with", "torch"), args...)
	j := &torchJob{done: make(chan struct{})}
	j.cmd = exec.Command(bin, cmdArgs...)
	j.cmd.Env = append([]string{"PATH=" + os.Getenv("PATH"), "HOME=" + t.TempDir(), "OMP_NUM_THREADS=1",
		"PYTHONUNBUFFERED=1"}, env...)
	j.cmd.Stdout, j.cmd.Stderr = j, j
	j.cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true}
	if err := j.cmd.Start(); err != nil {
		t.Fatalf("start torchrun: %v", err)
	}
	go func() { j.err = j.cmd.Wait(); close(j.done) }()
	t.Cleanup(func() {
		syscall.Kill(-j.cmd.Process.Pid, syscall.SIGKILL)
		<-j.done
		if t.Failed() {
			t.Logf("torchrun %s:\n%s", strings.Join(args, " "), j.output())
		}
	})
	return j
}

// waitLine waits for rank 0 to print a line matching re and returns its submatches.
func (j *torchJob) waitLine(t *testing.T, within time.Duration, re *regexp.Regexp) []string {
	t.Helper()
	var m []string
	eventually(t, within, "torchrun to print "+re.String(), func() bool {
		m = re.FindStringSubmatch(j.output())
		select {
		case <-j.done:
			if m == nil {
				t.Fatalf("torchrun exited (%v) without printing %s", j.err, re)
			}
		default:
		}
		return m != nil
	})
	return m
}

// waitExitLine waits for rank 0 to say it exits after a checkpoint and returns its step and the
// checkpoint's name.
func (j *torchJob) waitExitLine(t *testing.T, within time.Duration) (int, string) {
	t.Helper()
	m := j.waitLine(t, within, regexp.MustCompile(`\[default0\]:exiting after the checkpoint at step (\d+)\n`))
	step, _ := strconv.Atoi(m[1])
	return step, fmt.Sprintf("step-%06d", step)
}

// waitExit fails the test unless torchrun exits 0 within the time given.
func (j *torchJob) waitExit(t *testing.T, within time.Duration, when string) {
	t.Helper()
	select {
	case <-j.done:
		if j.err != nil {
			t.Errorf("torchrun %s: %v; want exit 0", when, j.err)
		}
	case <-time.After(within):
		t.Errorf("torchrun %s: still running after %v; want exit 0", when, within)
	}
}

// TestTorchrunNoticeCheckpointResumes runs the PyTorch example for real: two ranks of
// examples/pytorch/dcp_signal.py under torchrun (PyTorch on CPU, gloo), matched by the agent on
// their command line. A rebalance recommendation, then a spot notice, from the IMDS simulator:
// each time the agent signals both workers (not torchrun) and they agree on a step through their
// all-reduce, each saves its own file with torch.save and rank 0 writes _COMPLETE; after the
// rebalance they train on, after the spot notice they exit. The agent commits both checkpoints
// to a real S3 server; on the next instance `spotguard restore` brings back the spot notice's,
// bit for bit, and the same command resumes at its step.
func TestTorchrunNoticeCheckpointResumes(t *testing.T) {
	needPeers(t)
	torchrunBin(t)
	s3 := startS3(t)
	storeEnv := append([]string{"SPOTGUARD_STORE_URL=s3://" + s3Bucket + "/training", "SPOTGUARD_STORE_JOB=torch",
		"AWS_REGION=us-east-1"}, s3.env("")...)
	sim := newIMDS(t)
	sim.start("spot", "-d", "100000", "--rebalance-delay-sec", "100000") // notices come once the workers catch the signal
	ckdir := t.TempDir()
	ap := startAgent(t, sim, append([]string{
		// The workers (python3.11 -u .../dcp_signal.py), not torchrun (python3.11 /usr/bin/torchrun).
		`SPOTGUARD_TRAINER_MATCH=python[0-9.]* -u \S*dcp_signal\.py --save-with torch --checkpoint-dir ` + regexp.QuoteMeta(ckdir),
		"SPOTGUARD_TRAINER_SIGNAL=SIGUSR1", "SPOTGUARD_CHECKPOINT_DIR=" + ckdir, "SPOTGUARD_CHECKPOINT_MARKER=_COMPLETE"}, storeEnv...)...)
	job := startTorchJob(t, []string{"SPOTGUARD_AGENT_RUNTIME_DIR=" + ap.runtimeDir,
		"SPOTGUARD_HTTP_LISTEN=" + strings.TrimPrefix(ap.base, "http://")},
		"--checkpoint-dir", ckdir, "--save-every", "0")
	job.waitLine(t, 60*time.Second, regexp.MustCompile(`\[default0\]:starting at step 0\n`))
	eventually(t, 30*time.Second, "the agent to find both workers catching SIGUSR1", func() bool {
		n := 0
		for _, tr := range ap.status(t).Trainers {
			if tr.CatchesSignal {
				n++
			}
		}
		return n == 2
	})

	sim.stop()
	now := time.Now().Truncate(time.Second)
	sim.start("spot", "-a", "terminate", "--rebalance-trigger-time", now.Add(time.Second).UTC().Format(time.RFC3339),
		"--mock-trigger-time", now.Add(6*time.Second).UTC().Format(time.RFC3339))
	first := job.waitLine(t, 60*time.Second, regexp.MustCompile(`\[default0\]:saved \S*/(step-\d+) in [0-9.]+ s\n`))
	ap.waitNoticeState(t, "rebalance/rebalance", "committed", 60*time.Second)
	step, ckpt := job.waitExitLine(t, 60*time.Second)
	if ckpt <= first[1] {
		t.Fatalf("the spot notice's checkpoint %s is not after the rebalance's %s: training did not go on", ckpt, first[1])
	}
	ap.waitNoticeState(t, "spot/terminate", "committed", 60*time.Second)
	job.waitExit(t, 30*time.Second, "after the notice's checkpoint")
	if got := newestLocal(t, ckdir); got != ckpt {
		t.Fatalf("newest complete checkpoint on disk %q; rank 0 saved %q", got, ckpt)
	}
	for _, name := range []string{"rank-0.pt", "rank-1.pt", "_COMPLETE"} {
		if _, err := os.Stat(filepath.Join(ckdir, ckpt, name)); err != nil {
			t.Errorf("the notice's checkpoint lacks %s: %v", name, err)
		}
	}
	st := ap.status(t)
	for _, ns := range st.Notices {
		if len(ns.Signals) != 2 {
			t.Errorf("%s signalled %+v; want the two workers", ns.Key, ns.Signals)
		}
		for _, s := range ns.Signals {
			if s.Outcome != "sent" {
				t.Errorf("%s: signal to %d: %s; want sent", ns.Key, s.PID, s.Outcome)
			}
		}
	}
	committed := map[string]bool{}
	if u := st.Uploads; u != nil {
		for _, c := range u.Checkpoints {
			committed[c.Name] = c.Committed
		}
	}
	if !maps.Equal(committed, map[string]bool{first[1]: true, ckpt: true}) {
		t.Errorf("/status uploads: committed %v; want %s (rebalance) and %s (spot)", committed, first[1], ckpt)
	}

	// The next instance: restore, then the same command resumes at that step.
	to := t.TempDir()
	code, stdout, stderr := runSpotguard(t, storeEnv, "restore", "--config", ap.configPath, "--to", to)
	if code != 0 || !strings.Contains(stdout, "restored "+ckpt) {
		t.Fatalf("spotguard restore: exit %d\n%s%s", code, stdout, stderr)
	}
	sameTree(t, filepath.Join(ckdir, ckpt), filepath.Join(to, ckpt))
	next := startTorchJob(t, nil, "--checkpoint-dir", to, "--save-every", "0", "--steps", strconv.Itoa(step+2))
	next.waitLine(t, 60*time.Second, regexp.MustCompile(fmt.Sprintf(`\[default0\]:starting at step %d\n`, step)))
	next.waitExit(t, 60*time.Second, "resumed for two steps")
}

// TestTorchrunSIGTERMSavesAndExits is `systemctl stop` of a trainer unit running torchrun
// (KillMode=control-group: SIGTERM to torchrun and every worker at once), with the agent
// watching: the workers agree to save at the same step and exit 0 before torchrun's grace period
// ends, and the agent commits that checkpoint.
func TestTorchrunSIGTERMSavesAndExits(t *testing.T) {
	needPeers(t)
	torchrunBin(t)
	sim := newIMDS(t)
	sim.start("spot", "-d", "100000", "--rebalance-delay-sec", "100000") // no notice for a day
	ckdir, store := t.TempDir(), t.TempDir()
	ap := startAgent(t, sim, "SPOTGUARD_TRAINER_MATCH=no-trainer-in-this-test", "SPOTGUARD_NOTICES_REBALANCE=ignore",
		"SPOTGUARD_CHECKPOINT_DIR="+ckdir, "SPOTGUARD_STORE_URL=file://"+store, "SPOTGUARD_STORE_JOB=torch")
	job := startTorchJob(t, []string{"SPOTGUARD_AGENT_RUNTIME_DIR=" + ap.runtimeDir,
		"SPOTGUARD_HTTP_LISTEN=" + strings.TrimPrefix(ap.base, "http://")},
		"--checkpoint-dir", ckdir, "--save-every", "0")
	job.waitLine(t, 60*time.Second, regexp.MustCompile(`\[default0\]:starting at step 0\n`))

	if err := syscall.Kill(-job.cmd.Process.Pid, syscall.SIGTERM); err != nil {
		t.Fatal(err)
	}
	_, ckpt := job.waitExitLine(t, 30*time.Second)
	eventually(t, 30*time.Second, ckpt+" committed", func() bool {
		u := ap.status(t).Uploads
		return u != nil && len(u.Checkpoints) == 1 && u.Checkpoints[0].Name == ckpt && u.Checkpoints[0].Committed
	})
	select {
	case <-job.done:
	case <-time.After(30 * time.Second):
		t.Fatalf("torchrun still running 30 s after the save; want the workers to exit and torchrun with them")
	}
	for _, name := range []string{"rank-0.pt", "rank-1.pt", "_COMPLETE"} {
		if _, err := os.Stat(filepath.Join(ckdir, ckpt, name)); err != nil {
			t.Errorf("the SIGTERM's checkpoint lacks %s: %v", name, err)
		}
	}
	if out := job.output(); strings.Contains(out, "forcefully") {
		t.Errorf("torchrun had to SIGKILL a worker:\n%s", out)
	}
}

// TestTorchrunTwoNodes is a two-node job on one machine: two torchruns (--nnodes 2, one rank
// each), each with its own agent, checkpoint.dir and IMDS simulator, one store. Only node 0's
// IMDS gives a spot notice. Its agent signals its rank; the ranks' all-reduce makes both save the
// same step and exit; node 1's rank hands the notice to its own agent (POST /notice, as
// SaveRequested does), which uploads toward it without signalling anyone; each node's local rank
// 0 writes the marker; the agents commit one checkpoint of both nodes' files, which a restore
// brings back whole.
func TestTorchrunTwoNodes(t *testing.T) {
	needPeers(t)
	torchrunBin(t)
	store := t.TempDir()
	storeEnv := []string{"SPOTGUARD_STORE_URL=file://" + store, "SPOTGUARD_STORE_JOB=torch2"}
	type node struct {
		sim   *imdsSim
		dir   string
		agent *agentProc
		job   *torchJob
	}
	nodes := make([]*node, 2)
	for rank := range nodes {
		n := &node{sim: newIMDS(t), dir: t.TempDir()}
		n.sim.start("spot", "-d", "100000", "--rebalance-delay-sec", "100000")
		n.agent = startAgent(t, n.sim, append([]string{
			`SPOTGUARD_TRAINER_MATCH=python[0-9.]* -u \S*dcp_signal\.py --save-with torch --checkpoint-dir ` + regexp.QuoteMeta(n.dir),
			"SPOTGUARD_CHECKPOINT_DIR=" + n.dir, "SPOTGUARD_NOTICES_REBALANCE=ignore", "SPOTGUARD_STORE_PART_WAIT=1m",
			fmt.Sprintf("SPOTGUARD_STORE_NODE_RANK=%d", rank), "SPOTGUARD_STORE_WORLD_NODES=2"}, storeEnv...)...)
		nodes[rank] = n
	}
	port := strconv.Itoa(freePort(t))
	for rank, n := range nodes {
		n.job = startTorchrun(t, []string{"SPOTGUARD_AGENT_RUNTIME_DIR=" + n.agent.runtimeDir,
			"SPOTGUARD_HTTP_LISTEN=" + strings.TrimPrefix(n.agent.base, "http://")},
			[]string{"--nnodes", "2", "--node_rank", strconv.Itoa(rank), "--nproc_per_node", "1",
				"--master_addr", "127.0.0.1", "--master_port", port, "--redirects", "0:1", "--tee", "0:1"},
			"--checkpoint-dir", n.dir, "--save-every", "0", "--marker-every-node")
	}
	nodes[0].job.waitLine(t, 60*time.Second, regexp.MustCompile(`\[default0\]:starting at step 0\n`))
	for rank, n := range nodes {
		eventually(t, 30*time.Second, fmt.Sprintf("node %d's agent to find its rank catching SIGUSR1", rank), func() bool {
			trs := n.agent.status(t).Trainers
			return len(trs) == 1 && trs[0].CatchesSignal
		})
	}

	nodes[0].sim.stop()
	nodes[0].sim.start("spot", "-a", "terminate", "--rebalance-delay-sec", "100000")
	step, ckpt := nodes[0].job.waitExitLine(t, 60*time.Second)
	nodes[0].agent.waitNoticeState(t, "spot/terminate", "committed", 60*time.Second)
	nodes[1].agent.waitNoticeState(t, "job/terminate", "committed", 60*time.Second)
	for rank, n := range nodes {
		n.job.waitExit(t, 30*time.Second, fmt.Sprintf("on node %d after the notice's checkpoint", rank))
		for _, name := range []string{fmt.Sprintf("rank-%d.pt", rank), "_COMPLETE"} {
			if _, err := os.Stat(filepath.Join(n.dir, ckpt, name)); err != nil {
				t.Errorf("node %d's part of %s lacks %s: %v", rank, ckpt, name, err)
			}
		}
	}
	for _, ns := range nodes[1].agent.status(t).Notices {
		if len(ns.Signals) != 0 {
			t.Errorf("node 1's agent signalled %+v for %s; a job notice signals no one", ns.Signals, ns.Key)
		}
	}
	m0, err0 := os.ReadFile(filepath.Join(nodes[0].dir, ckpt, "_COMPLETE"))
	m1, err1 := os.ReadFile(filepath.Join(nodes[1].dir, ckpt, "_COMPLETE"))
	if err0 != nil || err1 != nil || len(m0) == 0 || !bytes.Equal(m0, m1) {
		t.Errorf("markers %q (%v) and %q (%v); want the same body on both nodes", m0, err0, m1, err1)
	}

	to := t.TempDir()
	code, stdout, stderr := runSpotguard(t, storeEnv, "restore", "--config", writeEmptyConfig(t), "--to", to)
	if code != 0 || !strings.Contains(stdout, "restored "+ckpt) {
		t.Fatalf("spotguard restore: exit %d\n%s%s", code, stdout, stderr)
	}
	for rank, n := range nodes {
		for _, name := range []string{fmt.Sprintf("rank-%d.pt", rank), "_COMPLETE"} {
			want, _ := os.ReadFile(filepath.Join(n.dir, ckpt, name))
			if got, err := os.ReadFile(filepath.Join(to, ckpt, name)); err != nil || !bytes.Equal(got, want) {
				t.Errorf("restored %s/%s: %v; want node %d's bytes", ckpt, name, err, rank)
			}
		}
	}

	// The next two nodes restore their own parts (restore --part), each into a directory of its
	// own (node-local disks), and resume there: every rank loads rank 0's choice under its own
	// node's directory (it used to load rank 0's path, where node 1's file is not).
	port = strconv.Itoa(freePort(t))
	next := make([]*torchJob, len(nodes))
	for rank := range nodes {
		dir := t.TempDir()
		env := append([]string{fmt.Sprintf("SPOTGUARD_STORE_NODE_RANK=%d", rank), "SPOTGUARD_STORE_WORLD_NODES=2"}, storeEnv...)
		if code, stdout, stderr := runSpotguard(t, env, "restore", "--part", "--config", writeEmptyConfig(t), "--to", dir); code != 0 {
			t.Fatalf("node %d: spotguard restore: exit %d\n%s%s", rank, code, stdout, stderr)
		}
		next[rank] = startTorchrun(t, []string{"SPOTGUARD_AGENT_RUNTIME_DIR=" + t.TempDir()},
			[]string{"--nnodes", "2", "--node_rank", strconv.Itoa(rank), "--nproc_per_node", "1",
				"--master_addr", "127.0.0.1", "--master_port", port, "--redirects", "0:1", "--tee", "0:1"},
			"--checkpoint-dir", dir, "--save-every", "0", "--marker-every-node", "--steps", strconv.Itoa(step+2))
	}
	next[0].waitLine(t, 60*time.Second, regexp.MustCompile(fmt.Sprintf(`\[default0\]:starting at step %d\n`, step)))
	for rank, j := range next {
		j.waitExit(t, 60*time.Second, fmt.Sprintf("resumed on node %d", rank))
	}
}

// workerPID returns the pid of the torchrun worker of the given RANK running dcp_signal.py with
// --checkpoint-dir dir.
func workerPID(t *testing.T, dir string, rank int) int {
	t.Helper()
	want := fmt.Sprintf("RANK=%d", rank)
	pid := 0
	eventually(t, 30*time.Second, "worker "+want, func() bool {
		procs, _ := filepath.Glob("/proc/[0-9]*/cmdline")
		for _, p := range procs {
			cmd, err := os.ReadFile(p)
			if err != nil || !bytes.Contains(cmd, []byte("dcp_signal.py")) || !bytes.Contains(cmd, []byte(dir)) ||
				bytes.Contains(cmd, []byte("torchrun")) {
				continue
			}
			if pcmd, err := os.ReadFile(fmt.Sprintf("/proc/%d/cmdline", parentPID(filepath.Dir(p)))); err == nil && bytes.Equal(pcmd, cmd) {
				continue // a fork of the rank: its DataLoader's worker
			}
			env, err := os.ReadFile(filepath.Join(filepath.Dir(p), "environ"))
			if err == nil && slices.ContainsFunc(bytes.Split(env, []byte{0}), func(kv []byte) bool { return string(kv) == want }) {
				pid, _ = strconv.Atoi(filepath.Base(filepath.Dir(p)))
				return true
			}
		}
		return false
	})
	return pid
}

// parentPID is the parent's PID of the process whose /proc directory is dir (0 if gone).
func parentPID(dir string) int {
	stat, err := os.ReadFile(filepath.Join(dir, "stat"))
	if err != nil {
		return 0
	}
	// pid (comm) state ppid ...: comm may hold spaces and parentheses, so after the last ')'.
	f := strings.Fields(string(stat[bytes.LastIndexByte(stat, ')')+1:]))
	if len(f) < 2 {
		return 0
	}
	ppid, _ := strconv.Atoi(f[1])
	return ppid
}

// children are the PIDs of pid's child processes now.
func children(pid int) map[int]bool {
	out := map[int]bool{}
	data, _ := os.ReadFile(fmt.Sprintf("/proc/%d/task/%d/children", pid, pid))
	for _, f := range strings.Fields(string(data)) {
		n, _ := strconv.Atoi(f)
		out[n] = true
	}
	return out
}

// TestTorchrunAgentKilledDuringANoticeDoesNotAskAgain: two ranks that draw their inputs from a
// DataLoader with two workers each, started again every two steps (forks of the rank, with its
// command line: trainer.match finds them, and they catch SIGUSR1 with the rank's handler). A
// rebalance recommendation: the agent signals the ranks, and the job saves once and trains on.
// The agent is killed (kill -9) and started again while the recommendation is in force; its
// previous run signalled the ranks for it, so it does not signal them again, though the workers
// it finds now are new: those it signals alone, as a running agent does. (Found from outside with
// a DataLoader: one process not signalled before made the restarted agent signal every one again,
// and the job saved a second time.)
func TestTorchrunAgentKilledDuringANoticeDoesNotAskAgain(t *testing.T) {
	needPeers(t)
	torchrunBin(t)
	sim := newIMDS(t)
	sim.start("spot", "-d", "100000", "--rebalance-delay-sec", "100000")
	ckdir, store := t.TempDir(), t.TempDir()
	env := []string{`SPOTGUARD_TRAINER_MATCH=python[0-9.]* -u \S*dcp_signal\.py --save-with torch --checkpoint-dir ` + regexp.QuoteMeta(ckdir),
		"SPOTGUARD_CHECKPOINT_DIR=" + ckdir, "SPOTGUARD_STORE_URL=file://" + store, "SPOTGUARD_STORE_JOB=torch"}
	ap := startAgent(t, sim, env...)
	job := startTorchJob(t, []string{"SPOTGUARD_AGENT_RUNTIME_DIR=" + ap.runtimeDir, "SPOTGUARD_HTTP_LISTEN=127.0.0.1:9"},
		"--checkpoint-dir", ckdir, "--save-every", "0", "--loader-workers", "2")
	job.waitLine(t, 60*time.Second, regexp.MustCompile(`\[default0\]:starting at step 0\n`))
	ranks := []int{workerPID(t, ckdir, 0), workerPID(t, ckdir, 1)}
	eventually(t, 30*time.Second, "the agent to find both ranks catching SIGUSR1", func() bool {
		n := 0
		for _, tr := range ap.status(t).Trainers {
			if slices.Contains(ranks, tr.PID) && tr.CatchesSignal {
				n++
			}
		}
		return n == 2
	})

	sim.stop()
	sim.start("spot", "-a", "terminate", "--rebalance-trigger-time", time.Now().UTC().Format(time.RFC3339),
		"--mock-trigger-time", time.Now().Add(time.Hour).UTC().Format(time.RFC3339))
	saved := regexp.MustCompile(`\[default0\]:saved \S*/(step-\d+) in`)
	job.waitLine(t, 60*time.Second, saved)
	ap.waitNoticeState(t, "rebalance/rebalance", "committed", 60*time.Second)
	signalled := map[int]bool{}
	for _, ns := range ap.status(t).Notices {
		for _, s := range ns.Signals {
			signalled[s.PID] = true
		}
	}
	if !signalled[ranks[0]] || !signalled[ranks[1]] {
		t.Fatalf("the agent signalled %v; want both ranks %v", slices.Sorted(maps.Keys(signalled)), ranks)
	}
	ap.kill9(t)
	eventually(t, 30*time.Second, "a DataLoader worker the agent did not signal", func() bool {
		for pid := range children(ranks[0]) {
			if !signalled[pid] {
				return true
			}
		}
		return false
	})

	again := startAgent(t, sim, append(env, "SPOTGUARD_AGENT_RUNTIME_DIR="+ap.runtimeDir)...)
	var workers map[int]bool
	eventually(t, 30*time.Second, "the restarted agent to signal a worker found since", func() bool {
		st := again.status(t)
		for _, ns := range st.Notices {
			for _, s := range ns.Signals {
				if s.Outcome == "sent" && !slices.Contains(ranks, s.PID) {
					workers = children(ranks[0])
					return true
				}
			}
		}
		return false
	})
	for _, ns := range again.status(t).Notices {
		for _, s := range ns.Signals {
			if slices.Contains(ranks, s.PID) {
				t.Errorf("the restarted agent signalled rank %d (%s) for %s; its previous run had", s.PID, s.Outcome, ns.Key)
			}
		}
		if ns.Key == "rebalance/rebalance" && !strings.Contains(fmt.Sprint(ns.Transitions), "signalled by the agent's previous run") {
			t.Errorf("rebalance/rebalance transitions %+v; want it taken from the previous run", ns.Transitions)
		}
	}
	// Two steps on, rank 0 starts new workers: it has polled since the restarted agent signalled.
	eventually(t, 30*time.Second, "rank 0 to train on", func() bool {
		for pid := range children(ranks[0]) {
			if !workers[pid] {
				return true
			}
		}
		return false
	})
	if got := saved.FindAllStringSubmatch(job.output(), -1); len(got) != 1 {
		t.Errorf("the job saved %d times; want once, for the rebalance recommendation", len(got))
	}
}

// TestTorchrunLateSignalSavesOnce plays the agent's part against two real ranks: it signals rank
// 0, and rank 1 only once the job has saved, as happens when the agent's signal to rank 1 lands
// just after rank 1's poll. That signal is part of the save just made: the job, run to its last
// step, has saved once, not again at the next step. (A new notice within the window is a new save:
// TestTorchrunNoticeCheckpointResumes's spot notice, 5 s after its rebalance.)
func TestTorchrunLateSignalSavesOnce(t *testing.T) {
	needPeers(t)
	torchrunBin(t)
	ckdir := t.TempDir()
	job := startTorchJob(t, []string{"SPOTGUARD_AGENT_RUNTIME_DIR=" + t.TempDir(), "SPOTGUARD_HTTP_LISTEN=127.0.0.1:9"},
		"--checkpoint-dir", ckdir, "--save-every", "0", "--same-signal", "60", "--steps", "200")
	job.waitLine(t, 60*time.Second, regexp.MustCompile(`\[default0\]:starting at step 0\n`))
	rank0, rank1 := workerPID(t, ckdir, 0), workerPID(t, ckdir, 1)
	saved := regexp.MustCompile(`\[default0\]:saved \S*/(step-\d+) in`)

	if err := syscall.Kill(rank0, syscall.SIGUSR1); err != nil {
		t.Fatal(err)
	}
	job.waitLine(t, 30*time.Second, saved)
	if err := syscall.Kill(rank1, syscall.SIGUSR1); err != nil { // late: the same signal
		t.Fatalf("signal rank 1 (the job had ended; give it more --steps): %v", err)
	}
	job.waitExit(t, 120*time.Second, "run to its last step")
	var steps []string
	for _, m := range saved.FindAllStringSubmatch(job.output(), -1) {
		steps = append(steps, m[1])
	}
	if len(steps) != 1 {
		t.Errorf("saves %v; want one: rank 1's late signal is part of the save rank 0's made", steps)
	}
}

// TestTorchrunLateSignalSavesOnceWhateverTheAgentWrites plays the agent's part as
// TestTorchrunLateSignalSavesOnce does, with notice.json as the agent writes it: before it signals,
// and again after, with the processes it signalled (or removed for a moment, as it restarts).
// Neither is a new notice: rank 1's late signal is part of the save rank 0's made. A notice that
// comes after is a new save. (Found in CI: rank 1's signal landed after the job's save, notice.json
// had been rewritten with the signalled PIDs since, and the job saved again the next step.)
func TestTorchrunLateSignalSavesOnceWhateverTheAgentWrites(t *testing.T) {
	needPeers(t)
	torchrunBin(t)
	ckdir, rundir := t.TempDir(), t.TempDir()
	job := startTorchJob(t, []string{"SPOTGUARD_AGENT_RUNTIME_DIR=" + rundir, "SPOTGUARD_HTTP_LISTEN=127.0.0.1:9"},
		"--checkpoint-dir", ckdir, "--save-every", "0", "--same-signal", "60", "--loader-workers", "2")
	job.waitLine(t, 60*time.Second, regexp.MustCompile(`\[default0\]:starting at step 0\n`))
	rank0, rank1 := workerPID(t, ckdir, 0), workerPID(t, ckdir, 1)
	saved := regexp.MustCompile(`\[default0\]:saved \S*/(step-\d+) in`)
	saves := func() int { return len(saved.FindAllStringSubmatch(job.output(), -1)) }
	notice := filepath.Join(rundir, "notice.json")
	write := func(body string) {
		t.Helper()
		if err := os.WriteFile(notice+".tmp", []byte(body), 0o644); err != nil {
			t.Fatal(err)
		}
		if err := os.Rename(notice+".tmp", notice); err != nil {
			t.Fatal(err)
		}
	}
	kill := func(pid int) {
		t.Helper()
		if err := syscall.Kill(pid, syscall.SIGUSR1); err != nil {
			t.Fatalf("signal rank %d: %v", pid, err)
		}
	}
	// trainedOn waits until rank 1 has started new DataLoader workers (every two steps) twice: it
	// has polled since its signal, and rank 0 (a step behind at most: the all-reduce) has printed
	// any save that poll made.
	trainedOn := func() {
		t.Helper()
		for range 2 {
			before := children(rank1)
			eventually(t, 30*time.Second, "rank 1 to train on", func() bool {
				for pid := range children(rank1) {
					if !before[pid] {
						return true
					}
				}
				return false
			})
		}
	}
	const rebalance = `{"source":"rebalance","action":"rebalance","deadline":null,"detected_at":"2026-12-06T10:00:00Z"%s}`
	one := fmt.Sprintf(rebalance, "")
	write(`{"source":"rebalance","action":"rebalance","deadline":null,"detected_at":"2026-12-06T10:00:00Z","active":[` + one + `]}`)
	kill(rank0)
	eventually(t, 30*time.Second, "the job to save for the rebalance", func() bool { return saves() == 1 })
	signalled := fmt.Sprintf(rebalance, fmt.Sprintf(`,"signalled_at":"2026-12-06T10:00:01Z","signalled_pids":[%d,%d]`, rank0, rank1))
	write(signalled[:len(signalled)-1] + `,"active":[` + signalled + `]}`)
	kill(rank1) // late, and notice.json rewritten with the PIDs signalled: the same notice
	trainedOn()
	if n := saves(); n != 1 {
		t.Fatalf("saves %d after rank 1's late signal with notice.json rewritten; want 1", n)
	}

	// A scheduled event an hour away: a new notice within same_signal, so a new save.
	deadline := time.Now().Add(time.Hour).UTC().Format(time.RFC3339)
	event := `{"source":"scheduled","action":"system-reboot","event_id":"instance-event-1","deadline":"` + deadline +
		`","detected_at":"2026-12-06T10:00:05Z"}`
	write(event[:len(event)-1] + `,"active":[` + event + `,` + signalled + `]}`)
	kill(rank0)
	eventually(t, 30*time.Second, "the job to save for the scheduled event", func() bool { return saves() == 2 })
	if err := os.Remove(notice); err != nil { // the agent restarting
		t.Fatal(err)
	}
	kill(rank1)
	trainedOn()
	if n := saves(); n != 2 {
		t.Errorf("saves %d after rank 1's late signal with notice.json removed; want 2", n)
	}
}

// The trainer.match line in dcp_signal.py's header, pasted into YAML as it stands (single quotes:
// backslashes kept), matches the workers torchrun starts, not torchrun itself. It used to carry
// doubled backslashes, which matched no worker.
func TestDCPSignalHeaderMatchesTheWorkers(t *testing.T) {
	src, err := os.ReadFile(filepath.Join(repoRoot, "examples", "pytorch", "dcp_signal.py"))
	if err != nil {
		t.Fatal(err)
	}
	m := regexp.MustCompile(`(?m)^\s+match: '([^']*)'`).FindSubmatch(src)
	if m == nil {
		t.Fatal("no `match: '...'` line in dcp_signal.py's header")
	}
	re, err := regexp.Compile(string(m[1]))
	if err != nil {
		t.Fatalf("trainer.match %q: %v", m[1], err)
	}
	worker := "/usr/bin/python3.11 -u /opt/job/dcp_signal.py --checkpoint-dir /opt/ml/checkpoints"
	launcher := "/usr/bin/python3.11 /usr/local/bin/torchrun --nproc-per-node=8 dcp_signal.py --checkpoint-dir /opt/ml/checkpoints"
	if !re.MatchString(worker) || re.MatchString(launcher) {
		t.Errorf("trainer.match %q: matches the worker %v (want true), torchrun %v (want false)", m[1], re.MatchString(worker), re.MatchString(launcher))
	}
}
