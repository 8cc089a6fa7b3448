package e2e

import (
	"fmt"
	"os"
	"os/exec"
	"os/user"
	"path/filepath"
	"regexp"
	"slices"
	"syscall"
	"testing"
	"time"
)

// bystander is a process of another user (nobody) that catches SIGUSR1, writing its log file when
// it gets it, and whose command line holds a token.
type bystander struct {
	pid  int
	log  string
	done chan struct{}
}

// needRoot skips the test unless it runs as root, saying why it needs root (to do what); under
// CI, which runs as root, it fails instead: a test CI skips is a test that never runs.
func needRoot(t testing.TB, why string) {
	t.Helper()
	if os.Geteuid() != 0 {
		if os.Getenv("CI") != "" {
			t.Fatalf("this test needs root, %s (CI runs as root)", why)
		}
		t.Skipf("needs root, %s", why)
	}
}

// startBystander starts a shell as uid/gid 65534 whose $0 is name; it waits (reading stdin, a
// pipe kept open) until SIGUSR1, which it logs before it exits. It needs root; CI runs as root.
func startBystander(t *testing.T, name string) *bystander {
	t.Helper()
	needRoot(t, "to start a process of another user")
	dir, err := os.MkdirTemp("", "spotguard-bystander-")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { os.RemoveAll(dir) })
	if err := os.Chmod(dir, 0o777); err != nil { // nobody writes its files here
		t.Fatal(err)
	}
	b := &bystander{log: filepath.Join(dir, "signals.log"), done: make(chan struct{})}
	ready := filepath.Join(dir, "ready")
	cmd := exec.Command("sh", "-c", `trap 'echo USR1 >> "$1"; exit 0' USR1; echo $$ > "$2"; while read x; do :; done`, name, b.log, ready)
	cmd.SysProcAttr = &syscall.SysProcAttr{Credential: &syscall.Credential{Uid: 65534, Gid: 65534}}
	stdin, w, err := os.Pipe()
	if err != nil {
		t.Fatal(err)
	}
	cmd.Stdin = stdin
	if err := cmd.Start(); err != nil {
		t.Fatalf("start a process as nobody: %v", err)
	}
	stdin.Close()
	b.pid = cmd.Process.Pid
	go func() { cmd.Wait(); close(b.done) }()
	t.Cleanup(func() {
		cmd.Process.Kill()
		<-b.done
		w.Close()
	})
	eventually(t, 15*time.Second, "the bystander's trap", func() bool {
		_, err := os.Stat(ready)
		return err == nil
	})
	return b
}

// untouched fails the test if the bystander got a signal or is gone.
func (b *bystander) untouched(t *testing.T) {
	t.Helper()
	if data, err := os.ReadFile(b.log); err == nil {
		t.Errorf("the bystander (pid %d, uid 65534) was signalled: %q", b.pid, data)
	}
	select {
	case <-b.done:
		t.Errorf("the bystander (pid %d) exited", b.pid)
	default:
	}
}

// On a shared machine, trainer.match also matches other people's trainers; with trainer.user set,
// only the user's own processes are signalled, and a scan that found only other users' processes
// says why nothing would be.
func TestTrainerUserLeavesOtherUsersAlone(t *testing.T) {
	needPeers(t)
	token := fmt.Sprintf("sg-shared-%d-%d", os.Getpid(), time.Now().UnixNano())
	b := startBystander(t, token+"-someone-elses-trainer")
	me, err := user.Current()
	if err != nil {
		t.Fatal(err)
	}
	sim := newIMDS(t)
	sim.start("spot", "-d", "100000", "--rebalance-delay-sec", "100000")
	ap := startAgent(t, sim, "SPOTGUARD_TRAINER_MATCH="+regexp.QuoteMeta(token), "SPOTGUARD_TRAINER_USER="+me.Username,
		"SPOTGUARD_NOTICES_REBALANCE=ignore")
	eventually(t, waitSignal, "an other_user discovery problem", func() bool {
		return hasLine(ap.metrics(t), `spotguard_trainer_discovery_problems_total{reason="other_user"}`)
	})

	tp := startTrainer(t, "--checkpoint-dir", filepath.Join(t.TempDir(), token))
	eventually(t, 30*time.Second, "the agent to find the user's trainer, and only it", func() bool {
		tr := ap.status(t).Trainers
		return len(tr) == 1 && tr[0].PID == tp.cmd.Process.Pid
	})

	// The notice: the user's trainer is signalled, the other user's process is not.
	sim.stop()
	sim.start("spot", "-a", "terminate")
	sigs := waitSignals(t, tp, 1)
	if sigs[0].Signal != "SIGUSR1" {
		t.Errorf("trainer recorded %+v; want SIGUSR1", sigs[0])
	}
	var signalled []int
	for _, ns := range ap.status(t).Notices {
		if ns.Key == "spot/terminate" {
			for _, s := range ns.Signals {
				signalled = append(signalled, s.PID)
			}
		}
	}
	if !slices.Equal(signalled, []int{tp.cmd.Process.Pid}) {
		t.Errorf("/status: the notice signalled %v; want only the user's trainer %d (not the bystander %d)", signalled, tp.cmd.Process.Pid, b.pid)
	}
	b.untouched(t)
}

// A drill of your own trainer signals only that trainer (and what it starts), never a process
// your trainer.match also matches, such as the job you are running; --use-trainer-config opts
// back into your configured discovery.
func TestDrillLeavesRunningJobAlone(t *testing.T) {
	needPeers(t)
	token := fmt.Sprintf("sg-running-job-%d-%d", os.Getpid(), time.Now().UnixNano())
	job := startTrainer(t, "--checkpoint-dir", filepath.Join(t.TempDir(), token))
	env := []string{"SPOTGUARD_TRAINER_MATCH=" + regexp.QuoteMeta(token)}

	dir := t.TempDir()
	cmd := pythonBin + " " + repoRoot + "/examples/python/trainer.py --checkpoint-dir " + dir + " --files 8 --checkpoint-mb 2"
	code, r, stderr := runDrill(t, env, "--trainer-cmd", cmd, "--checkpoint-dir", dir)
	checkDrillPass(t, code, r, 16<<20, stderr)
	if got := job.signals(t); len(got) != 0 || !job.alive() {
		t.Errorf("the running job (pid %d, matched by trainer.match) received %+v during the drill (alive %v); want nothing", job.cmd.Process.Pid, got, job.alive())
	}

	dir = t.TempDir()
	cmd = pythonBin + " " + repoRoot + "/examples/python/trainer.py --checkpoint-dir " + dir + " --files 8 --checkpoint-mb 2"
	code, r, stderr = runDrill(t, env, "--trainer-cmd", cmd, "--checkpoint-dir", dir, "--use-trainer-config")
	checkDrillPass(t, code, r, 16<<20, stderr)
	if got := waitSignals(t, job, 1); got[0].Signal != "SIGUSR1" || got[0].PID != job.cmd.Process.Pid {
		t.Errorf("with --use-trainer-config the running job recorded %+v; want SIGUSR1", got)
	}
}

// A trainer of your own that is a launcher (a shell here, as torchrun would be) whose worker
// catches the signal: the drill finds the worker as a descendant of what it started, with no
// trainer.match or trainer.unit configured.
func TestDrillSignalsItsTrainersWorkers(t *testing.T) {
	needPeers(t)
	dir := t.TempDir()
	worker := pythonBin + " " + repoRoot + "/examples/python/trainer.py --checkpoint-dir " + dir + " --files 8 --checkpoint-mb 2"
	// The launcher does not catch SIGUSR1; it passes the drill's final SIGTERM on and waits.
	launcher := `sh -c 'trap "kill \$p" TERM; ` + worker + ` & p=$!; wait $p; wait $p'`
	code, r, stderr := runDrill(t, nil, "--trainer-cmd", launcher, "--checkpoint-dir", dir)
	checkDrillPass(t, code, r, 16<<20, stderr)
}
