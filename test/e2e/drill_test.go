package e2e

import (
	"bufio"
	"bytes"
	"encoding/json"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"
)

type drillJSON struct {
	Pass       bool    `json:"pass"`
	Reason     string  `json:"reason"`
	Job        string  `json:"job"`
	Checkpoint string  `json:"checkpoint"`
	Commit     string  `json:"commit"`
	Files      int     `json:"files"`
	Bytes      int64   `json:"bytes"`
	MarginS    float64 `json:"margin_seconds"`
	DurableS   float64 `json:"durable_after_notice_seconds"`
	Verified   bool    `json:"verified"`
	Timeline   []struct {
		Step    string  `json:"step"`
		Seconds float64 `json:"seconds"`
	} `json:"timeline"`
	Advice []string `json:"advice"`
}

func runDrill(t *testing.T, env []string, args ...string) (int, drillJSON, string) {
	t.Helper()
	code, stdout, stderr := runSpotguard(t, env, append([]string{"drill", "--json", "--config", writeEmptyConfig(t)}, args...)...)
	var r drillJSON
	if err := json.Unmarshal([]byte(stdout), &r); err != nil {
		t.Fatalf("drill --json output %q: %v\nstderr: %s", stdout, err, stderr)
	}
	return code, r, stderr
}

func checkDrillPass(t *testing.T, code int, r drillJSON, size int64, stderr string) {
	t.Helper()
	if code != 0 || !r.Pass || !r.Verified {
		t.Fatalf("drill: exit %d, %+v\nstderr: %s", code, r, stderr)
	}
	if r.Bytes < size || r.Files < 8 || r.MarginS <= 0 || r.DurableS <= 0 || r.MarginS+r.DurableS > 121 {
		t.Errorf("drill report: %+v", r)
	}
	var steps []string
	for _, s := range r.Timeline {
		steps = append(steps, s.Step)
	}
	for _, want := range []string{"notice detected", "trainer signalled", "first file closed", "checkpoint complete (marker)", "last byte stored", "manifest committed", "restored and verified"} {
		if !strings.Contains(strings.Join(steps, "|"), want) {
			t.Errorf("timeline lacks %q: %v", want, steps)
		}
	}
}

// The README's first set-up command, with its embedded default (a file:// store in a temp dir),
// at a size CI can afford.
func TestDrillEmbeddedDefault(t *testing.T) {
	needPeers(t)
	code, r, stderr := runDrill(t, nil, "--size", "96MiB")
	checkDrillPass(t, code, r, 96<<20, stderr)
}

// --checkpoint-dir is taken from where the user stands: a relative one works (the agent's
// checkpoint.dir must be absolute, so drill makes it so).
func TestDrillRelativeCheckpointDir(t *testing.T) {
	needPeers(t)
	wd, err := os.Getwd()
	if err != nil {
		t.Fatal(err)
	}
	rel, err := filepath.Rel(wd, filepath.Join(t.TempDir(), "ckpt"))
	if err != nil || filepath.IsAbs(rel) {
		t.Fatalf("no relative path to a temp dir: %q, %v", rel, err)
	}
	code, r, stderr := runDrill(t, nil, "--size", "16MiB", "--checkpoint-dir", rel)
	checkDrillPass(t, code, r, 16<<20, stderr)
}

// A drill on an instance of a multi-node job (store.world_nodes and store.node_rank in its
// configuration) rehearses one node alone unless --nodes says otherwise: it used to take the
// job's world_nodes, wait for parts no other node writes, and fail with the advice of a slow
// upload.
func TestDrillOnAMultiNodeJobsInstance(t *testing.T) {
	needPeers(t)
	code, r, stderr := runDrill(t, []string{"SPOTGUARD_STORE_WORLD_NODES=4", "SPOTGUARD_STORE_NODE_RANK=2"}, "--size", "16MiB")
	checkDrillPass(t, code, r, 16<<20, stderr)
}

// A drill on an instance configured for DCP (checkpoint.marker .metadata) and another signal:
// the demo trainer writes _COMPLETE and catches SIGUSR1 whatever the configuration says for the
// real trainer, and the drill's agent waited for the configured marker and signal, so the drill
// waited out its window and failed, blaming the link (found from outside). It passes now.
func TestDrillOnAnInstanceConfiguredForDCP(t *testing.T) {
	needPeers(t)
	code, r, stderr := runDrill(t, []string{"SPOTGUARD_CHECKPOINT_MARKER=.metadata", "SPOTGUARD_TRAINER_SIGNAL=SIGUSR2"}, "--size", "16MiB")
	checkDrillPass(t, code, r, 16<<20, stderr)
}

func TestDrillS3(t *testing.T) {
	needPeers(t)
	s3 := startS3(t)
	code, r, stderr := runDrill(t, s3.env(""), "--size", "96MiB", "--store", "s3://"+s3Bucket+"/drill")
	checkDrillPass(t, code, r, 96<<20, stderr)
	want := r.Job + "/" + r.Checkpoint + "/" + r.Commit + "/_spotguard/manifest.json"
	if ls := s3.aws(t, "s3", "ls", "--recursive", "s3://"+s3Bucket+"/drill/"); !strings.HasPrefix(r.Job, "drill-") || !strings.Contains(ls, want) {
		t.Errorf("awscli does not see the drill's manifest %s (job %q):\n%s", want, r.Job, ls)
	}
	// A second drill on the same store gets a job of its own: it never meets the first one's
	// checkpoints.
	code, r2, stderr := runDrill(t, s3.env(""), "--size", "8MiB", "--store", "s3://"+s3Bucket+"/drill")
	checkDrillPass(t, code, r2, 8<<20, stderr)
	if r2.Job == r.Job {
		t.Errorf("two drills used the same job %q", r.Job)
	}
}

// A trainer that does not handle the signal fails the drill, and the drill says why.
func TestDrillTrainerIgnoresSignal(t *testing.T) {
	needPeers(t)
	code, r, _ := runDrill(t, nil, "--trainer-cmd", "sleep 300", "--checkpoint-dir", t.TempDir())
	if code != 1 || r.Pass || !strings.Contains(r.Reason, "does not catch") {
		t.Errorf("drill with a trainer without a handler: exit %d, %+v; want FAIL saying it does not catch the signal", code, r)
	}
	if len(r.Advice) == 0 {
		t.Errorf("no advice on FAIL")
	}
}

// A trainer of your own that installs its handler a second after it starts (a shell that sleeps,
// then becomes the Python trainer; a real one imports its framework first): the drill waits for
// the handler before it announces the interruption, instead of finding nothing to signal.
func TestDrillWaitsForTheTrainersHandler(t *testing.T) {
	needPeers(t)
	dir := t.TempDir()
	cmd := "sh -c 'sleep 1; exec " + pythonBin + " " + repoRoot + "/examples/python/trainer.py --checkpoint-dir " + dir + " --files 8 --checkpoint-mb 2'"
	code, r, stderr := runDrill(t, nil, "--trainer-cmd", cmd, "--checkpoint-dir", dir)
	checkDrillPass(t, code, r, 16<<20, stderr)
}

// A trainer of your own (the Python example here) instead of the demo one.
func TestDrillOwnTrainer(t *testing.T) {
	needPeers(t)
	dir := t.TempDir()
	cmd := pythonBin + " " + repoRoot + "/examples/python/trainer.py --checkpoint-dir " + dir + " --files 8 --checkpoint-mb 2"
	code, r, stderr := runDrill(t, nil, "--trainer-cmd", cmd, "--checkpoint-dir", dir)
	checkDrillPass(t, code, r, 16<<20, stderr)
}

// A drill waiting for a real notice with IMDS not answering (a container with the metadata hop
// limit at 1) waited in silence for ever (found from outside). It says so once IMDS has failed
// for 10 s, and goes on waiting (an interrupt ends it).
func TestDrillRealIMDSNotAnsweringIsSaid(t *testing.T) {
	needPeers(t)
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	closed := ln.Addr().String()
	ln.Close() // nothing listens there now
	cmd := exec.Command(spotguardBin, "drill", "--config", writeEmptyConfig(t), "--imds", "real", "--size", "1MiB")
	cmd.Env = []string{"PATH=" + os.Getenv("PATH"), "HOME=" + t.TempDir(), "SPOTGUARD_IMDS_ENDPOINT=http://" + closed}
	out, err := cmd.StderrPipe() // where the drill says how it goes
	if err != nil {
		t.Fatal(err)
	}
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	defer func() {
		// Killed, the drill takes its demo trainer with it: it was left running for ever.
		trainers := drillTrainersOf(t, cmd.Process.Pid)
		cmd.Process.Kill()
		cmd.Wait()
		if len(trainers) == 0 {
			t.Error("no demo trainer found under the drill")
		}
		deadline := time.Now().Add(15 * time.Second)
		for _, pid := range trainers {
			for syscall.Kill(pid, 0) == nil {
				if time.Now().After(deadline) {
					syscall.Kill(pid, syscall.SIGKILL)
					t.Errorf("the demo trainer %d still runs 15 s after its drill was killed", pid)
					break
				}
				<-time.After(20 * time.Millisecond)
			}
		}
	}()
	said := make(chan string, 1)
	go func() {
		sc := bufio.NewScanner(out)
		for sc.Scan() {
			if strings.HasPrefix(sc.Text(), "IMDS does not answer") {
				said <- sc.Text()
				return
			}
		}
	}()
	select {
	case line := <-said:
		if !strings.Contains(line, "hop limit") {
			t.Errorf("line %q; want the fix (the metadata options)", line)
		}
	case <-time.After(60 * time.Second):
		t.Fatal("the drill did not say within 60 s that IMDS does not answer")
	}
}

// drillTrainersOf returns the demo trainers the drill ppid started (its children running
// __drill-trainer).
func drillTrainersOf(t *testing.T, ppid int) []int {
	t.Helper()
	entries, err := os.ReadDir("/proc")
	if err != nil {
		t.Fatal(err)
	}
	var pids []int
	for _, e := range entries {
		pid, err := strconv.Atoi(e.Name())
		if err != nil {
			continue
		}
		stat, err := os.ReadFile(filepath.Join("/proc", e.Name(), "stat"))
		if err != nil {
			continue
		}
		// pid (comm) state ppid ...: the fields after the last ')'.
		fields := strings.Fields(string(stat[bytes.LastIndexByte(stat, ')')+1:]))
		if len(fields) < 2 || fields[1] != strconv.Itoa(ppid) {
			continue
		}
		if cmdline, err := os.ReadFile(filepath.Join("/proc", e.Name(), "cmdline")); err == nil && bytes.Contains(cmdline, []byte("__drill-trainer")) {
			pids = append(pids, pid)
		}
	}
	return pids
}
