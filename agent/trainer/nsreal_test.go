//go:build linux

package trainer

import (
	"bufio"
	"crypto/rand"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"
)

// These tests run the example trainer in a PID namespace of its own, made by unshare(1), as a
// container runtime would: it writes the PID it has there into its pidfile.

// nsTrainer is the example trainer in a PID namespace of its own.
type nsTrainer struct {
	unshare   *child
	hostPID   int // its PID here
	ownPID    int // its PID in its namespace: what it wrote into the pidfile
	pidfile   string
	signalLog string
}

// startNSTrainer starts the example trainer in a new PID namespace, as the namespace's PID 1
// (asInit) or as PID 2, the child of a shell that is PID 1 there. A missing unshare(1), or one
// that cannot make a PID namespace, fails the test: CI runs as root with util-linux installed.
func startNSTrainer(t *testing.T, asInit bool) *nsTrainer {
	t.Helper()
	if _, err := os.Stat("/proc/self/ns/pid"); errors.Is(err, fs.ErrNotExist) {
		t.Skip("this kernel has no PID namespaces (no /proc/self/ns/pid)")
	}
	unshare, err := exec.LookPath("unshare")
	if err != nil {
		t.Fatalf("this test needs unshare(1) from util-linux to run a trainer in a PID namespace of its own (apt-get install util-linux): %v", err)
	}
	py := python(t)
	script, err := filepath.Abs("../../examples/python/trainer.py")
	if err != nil {
		t.Fatal(err)
	}
	dir, err := os.MkdirTemp(t.TempDir(), "ns-trainer-")
	if err != nil {
		t.Fatal(err)
	}
	tr := &nsTrainer{pidfile: filepath.Join(dir, "trainer.pid"), signalLog: filepath.Join(dir, "signals.jsonl")}
	ready := filepath.Join(dir, "ready")
	args := []string{"--pid", "--fork", "--kill-child"}
	if os.Geteuid() != 0 {
		args = append([]string{"--user", "--map-root-user"}, args...)
	}
	trainer := []string{py, script, "--pidfile", tr.pidfile, "--ready-file", ready, "--signal-log", tr.signalLog, "--step-seconds", "0.02"}
	if asInit {
		args = append(args, trainer...)
	} else {
		args = append(args, append([]string{"sh", "-c", `"$@" & wait`, "sh"}, trainer...)...)
	}
	tr.unshare = start(t, dir, unshare, args...)
	need := "this test needs unshare(1) to create a PID namespace (root, or unprivileged user namespaces)"
	deadline := time.NewTimer(pollTimeout)
	defer deadline.Stop()
	tick := time.NewTicker(5 * time.Millisecond)
	defer tick.Stop()
	for {
		if _, err := os.Stat(ready); err == nil {
			break
		}
		select {
		case <-tr.unshare.done:
			t.Fatalf("%s: unshare %s exited (%v); output:\n%s", need, strings.Join(args, " "), tr.unshare.err, tr.unshare.output())
		case <-deadline.C:
			t.Fatalf("%s: the trainer in the new namespace did not start within %v; output:\n%s", need, pollTimeout, tr.unshare.output())
		case <-tick.C:
		}
	}
	b, err := os.ReadFile(tr.pidfile)
	if err != nil {
		t.Fatal(err)
	}
	if tr.ownPID, _ = parsePID(string(b)); tr.ownPID == 0 {
		t.Fatalf("pidfile holds %q", b)
	}
	// Its PID here: the process whose command line names its ready file and whose own PID in
	// its namespace (NSpid, checked by the caller) is the one it wrote. (unshare and the shell
	// have the ready file in their command lines too.)
	entries, _ := os.ReadDir("/proc")
	for _, e := range entries {
		pid, err := strconv.Atoi(e.Name())
		if err != nil {
			continue
		}
		cmdline, _ := readCmdline("/proc", pid)
		st, err := readStatus("/proc", pid)
		if own, _ := st.ownPID(); err == nil && len(st.nspid) > 1 && own == tr.ownPID && strings.Contains(cmdline, ready) {
			tr.hostPID = pid
		}
	}
	if tr.hostPID == 0 {
		t.Fatalf("no process here has %s in its command line", ready)
	}
	return tr
}

// signals returns the signals the namespaced trainer logged.
func (tr *nsTrainer) signals(t *testing.T) []string {
	t.Helper()
	f, err := os.Open(tr.signalLog)
	if errors.Is(err, fs.ErrNotExist) {
		return nil
	}
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	var sigs []string
	sc := bufio.NewScanner(f)
	for sc.Scan() {
		var line struct {
			Signal string `json:"signal"`
			PID    int    `json:"pid"`
		}
		if json.Unmarshal(sc.Bytes(), &line) == nil {
			if line.PID != tr.ownPID {
				t.Errorf("signal log line %q; want the trainer's own PID %d", sc.Text(), tr.ownPID)
			}
			sigs = append(sigs, line.Signal)
		}
	}
	return sigs
}

// nsProcesses returns the PIDs here of every process in the PID namespace of pid.
func nsProcesses(t *testing.T, pid int) []int {
	t.Helper()
	want, err := os.Readlink(fmt.Sprintf("/proc/%d/ns/pid", pid))
	if err != nil {
		t.Fatal(err)
	}
	var pids []int
	entries, _ := os.ReadDir("/proc")
	for _, e := range entries {
		p, err := strconv.Atoi(e.Name())
		if err != nil {
			continue
		}
		if link, err := os.Readlink(fmt.Sprintf("/proc/%d/ns/pid", p)); err == nil && link == want {
			pids = append(pids, p)
		}
	}
	slices.Sort(pids)
	return pids
}

// dockerLikeCgroup makes a real cgroup (v2) named as Docker's systemd driver names a
// container's, docker-<id>.scope, and returns its directory and the ID; it skips the test when
// cgroups cannot be made here. The cgroup is removed when the test ends, after the processes
// moved into it have exited.
func dockerLikeCgroup(t *testing.T) (dir, id string) {
	t.Helper()
	base := ""
	for _, b := range []string{"/sys/fs/cgroup/unified", "/sys/fs/cgroup"} {
		if _, err := os.Stat(filepath.Join(b, "cgroup.controllers")); err == nil {
			base = b
			break
		}
	}
	if base == "" {
		t.Skip("no cgroup v2 hierarchy to make a container-like cgroup in")
	}
	raw := make([]byte, 32)
	rand.Read(raw)
	id = hex.EncodeToString(raw)
	slice := filepath.Join(base, fmt.Sprintf("spotguard-test-%d-%s.slice", os.Getpid(), id[:8]))
	if err := os.Mkdir(slice, 0o755); err != nil {
		t.Skipf("cannot create a cgroup: %v", err)
	}
	dir = filepath.Join(slice, "docker-"+id+".scope")
	if err := os.Mkdir(dir, 0o755); err != nil {
		os.Remove(slice)
		t.Skipf("cannot create a cgroup: %v", err)
	}
	t.Cleanup(func() {
		for _, d := range []string{dir, slice} {
			waitFor(t, nil, "rmdir "+d, func() bool {
				err := os.Remove(d)
				return err == nil || errors.Is(err, fs.ErrNotExist)
			})
		}
	})
	return dir, id
}

// A trainer in a PID namespace of its own writes the PID it has there. The agent, without
// trainer.container, refuses that pidfile (never signalling the process that has the PID here),
// and says how to configure it. NSpid on the real /proc links the two PIDs; with
// trainer.container set to a container-like cgroup holding the namespace, the pidfile finds the
// trainer, and only it of the two is signalled.
func TestFindPIDFileFromAnotherPIDNamespace(t *testing.T) {
	t.Parallel()
	for _, asInit := range []bool{false, true} {
		name := "trainer is PID 2 there"
		if asInit {
			name = "trainer is PID 1 there"
		}
		t.Run(name, func(t *testing.T) {
			t.Parallel()
			cgroup, id := "", ""
			if os.Geteuid() == 0 {
				cgroup, id = dockerLikeCgroup(t) // before the trainer: removed after it exited
			}
			tr := startNSTrainer(t, asInit)
			wantOwn := 2
			if asInit {
				wantOwn = 1
			}
			st, err := readStatus("/proc", tr.hostPID)
			if err != nil {
				t.Fatal(err)
			}
			if own, ok := st.ownPID(); !ok || own != tr.ownPID || own != wantOwn || len(st.nspid) != 2 || st.nspid[0] != tr.hostPID {
				t.Fatalf("NSpid of the trainer (pid %d here) = %v; want [%d %d] (its pidfile holds %d)", tr.hostPID, st.nspid, tr.hostPID, wantOwn, tr.ownPID)
			}

			procs, problems := Finder{PIDFile: tr.pidfile}.Find()
			if len(procs) != 0 {
				t.Errorf("Find(pidfile %d from another PID namespace) = %v; want nothing: PID %d here is not the trainer", tr.ownPID, procs, tr.ownPID)
			}
			wantReason, wantDetail := ReasonPIDFileNamespace, []string{strconv.Itoa(tr.hostPID), "trainer.container", "--pid=host", "trainer.match"}
			if asInit {
				wantReason, wantDetail = ReasonPIDFileInit, []string{"holds PID 1", "trainer.container", "--pid=host", "trainer.match"}
			}
			if len(problems) != 1 || problems[0].Reason != wantReason {
				t.Fatalf("Find problems = %v; want one %s", problems, wantReason)
			}
			for _, d := range wantDetail {
				if !strings.Contains(problems[0].Detail, d) {
					t.Errorf("Find problem detail %q; want it to contain %q", problems[0].Detail, d)
				}
			}
			if got := tr.signals(t); len(got) != 0 {
				t.Errorf("the trainer received %v; want nothing", got)
			}

			if cgroup == "" {
				t.Skip("not root: cannot make a container-like cgroup for the rest")
			}
			members := nsProcesses(t, tr.hostPID)
			for _, pid := range members {
				if err := os.WriteFile(filepath.Join(cgroup, "cgroup.procs"), []byte(strconv.Itoa(pid)), 0o644); err != nil {
					t.Skipf("cannot move a process into a cgroup: %v", err)
				}
			}
			f := Finder{PIDFile: tr.pidfile, Container: id[:MinContainerIDPrefix]}
			procs, problems = f.Find()
			want := map[int]string{}
			for _, pid := range members {
				want[pid] = ViaContainer
			}
			want[tr.hostPID] = ViaPIDFile
			got := map[int]string{}
			for _, p := range procs {
				got[p.PID] = p.Via
			}
			if fmt.Sprint(got) != fmt.Sprint(want) || len(problems) != 0 {
				t.Fatalf("Find(%+v) = %v, %v; want %v and no problem", f, got, problems, want)
			}
			for _, r := range Signal("", procs, syscall.SIGUSR1) {
				wantOutcome := OutcomeNotCaught // the shell
				if r.PID == tr.hostPID {
					wantOutcome = OutcomeSent
				}
				if r.Outcome != wantOutcome {
					t.Errorf("Signal: pid %d: %s, %v; want %s", r.PID, r.Outcome, r.Err, wantOutcome)
				}
			}
			waitFor(t, tr.unshare, "SIGUSR1 in the namespaced trainer's log", func() bool {
				return slices.Equal(tr.signals(t), []string{"SIGUSR1"})
			})
		})
	}
}
