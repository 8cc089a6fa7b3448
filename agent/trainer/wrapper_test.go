//go:build linux

package trainer

import (
	"fmt"
	"maps"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"
)

// A command that wraps spotguard's own (timeout 20 spotguard doctor --trainer.match X, sudo
// spotguard doctor ...) has spotguard's command line at the end of its own: trainer.match used
// to find it and report it as a trainer that does not catch the signal. Only the ancestors whose
// argument list ends with spotguard's are left out: another ancestor that matches (a script that
// starts both) and a twin of the wrapper that is no ancestor are still found.
func TestFindLeavesOutTheWrappersOfSpotguard(t *testing.T) {
	t.Parallel()
	tree := fakeTree(t,
		fakeProc{pid: 1, cmdline: "/sbin/init splash"},
		fakeProc{pid: 90, cmdline: "bash run-train.sh", ppid: 1},
		fakeProc{pid: 91, cmdline: "sudo timeout 20 spotguard doctor --trainer.match train", ppid: 90},
		fakeProc{pid: 92, cmdline: "sudo timeout 20 spotguard doctor --trainer.match train", ppid: 91}, // sudo's pty monitor
		fakeProc{pid: 93, cmdline: "timeout 20 spotguard doctor --trainer.match train", ppid: 92},
		fakeProc{pid: fakeAgent, cmdline: "spotguard doctor --trainer.match train", ppid: 93},
		fakeProc{pid: 200, cmdline: "python3 train.py", ppid: 90},
		fakeProc{pid: 300, cmdline: "timeout 20 spotguard doctor --trainer.match train", ppid: 1}, // no ancestor
		fakeProc{pid: 301, cmdline: "spotguard doctor --trainer.match train --json", ppid: 1},     // another command
	)
	match := regexp.MustCompile(`train`)
	checkFind(t, Finder{Match: match, ProcRoot: tree, Self: fakeAgent},
		map[int]string{90: ViaMatch, 200: ViaMatch, 300: ViaMatch, 301: ViaMatch})

	// The wrappers never match, so a pattern that only they and spotguard match finds nothing.
	checkFind(t, Finder{Match: regexp.MustCompile(`doctor --trainer\.match train$`), ProcRoot: tree, Self: fakeAgent},
		map[int]string{300: ViaMatch})

	// A pidfile naming a wrapper is refused like one naming spotguard.
	pidfile := filepath.Join(t.TempDir(), "trainer.pid")
	writeFile(t, pidfile, "93\n")
	problems := checkFind(t, Finder{PIDFile: pidfile, ProcRoot: tree, Self: fakeAgent}, nil, ReasonStalePIDFile)
	if len(problems) == 1 && !strings.Contains(problems[0].Detail, "wrapper of spotguard") {
		t.Errorf("Got(pidfile of a wrapper) detail %q; want it to say it is a wrapper of spotguard", problems[0].Detail)
	}

	// A shell whose -c holds spotguard's command line is a wrapper too (found from outside:
	// doctor failed on the shell that ran it, "none catches SIGUSR1"); one that does not is not.
	shell := fakeTree(t,
		fakeProc{pid: 1, cmdline: "/sbin/init splash"},
		fakeProc{pid: 80, cmdline: "sh", argv: []string{"sh", "-c", "spotguard doctor --trainer.match train; true"}, ppid: 1},
		fakeProc{pid: fakeAgent, cmdline: "spotguard doctor --trainer.match train", ppid: 80},
		fakeProc{pid: 81, cmdline: "sh", argv: []string{"sh", "-c", "python3 train.py --ckpt /c; true"}, ppid: 1},
	)
	checkFind(t, Finder{Match: match, ProcRoot: shell, Self: fakeAgent}, map[int]string{81: ViaMatch})
	// The pattern quoted on the shell's command line, as patterns are (found from outside).
	quoted := fakeTree(t,
		fakeProc{pid: 1, cmdline: "/sbin/init splash"},
		fakeProc{pid: 80, cmdline: "sh", argv: []string{"sh", "-c", `spotguard doctor --trainer.match 'train \.py'; true`}, ppid: 1},
		fakeProc{pid: fakeAgent, cmdline: "spotguard", argv: []string{"spotguard", "doctor", "--trainer.match", `train \.py`}, ppid: 80},
		fakeProc{pid: 81, cmdline: "sh", argv: []string{"sh", "-c", "python3 train .py --ckpt /c; true"}, ppid: 1},
	)
	checkFind(t, Finder{Match: regexp.MustCompile(`train`), ProcRoot: quoted, Self: fakeAgent}, map[int]string{81: ViaMatch})

	// A script that passes the pattern on to spotguard in its own arguments matches only
	// through them (found from outside: doctor failed on the script that ran it); one that
	// matches by its own words is still found.
	script := fakeTree(t,
		fakeProc{pid: 1, cmdline: "/sbin/init splash"},
		fakeProc{pid: 70, cmdline: "bash train-all.sh", ppid: 1},
		fakeProc{pid: 80, cmdline: "bash ./check.sh --trainer.match train", ppid: 70},
		fakeProc{pid: fakeAgent, cmdline: "spotguard doctor --trainer.match train", ppid: 80},
		fakeProc{pid: 81, cmdline: "bash ./check.sh --trainer.match train", ppid: 1}, // no ancestor
	)
	checkFind(t, Finder{Match: match, ProcRoot: script, Self: fakeAgent}, map[int]string{70: ViaMatch, 81: ViaMatch})

	// An agent whose own argument list cannot be read has no wrappers.
	checkFind(t, Finder{Match: match, ProcRoot: tree, Self: neverPID},
		map[int]string{90: ViaMatch, 91: ViaMatch, 92: ViaMatch, 93: ViaMatch, fakeAgent: ViaMatch, 200: ViaMatch, 300: ViaMatch, 301: ViaMatch})
}

// The same with real processes: the "agent" is a shell run by timeout(1), itself run by a shell
// script, next to a twin timeout that is no ancestor of it.
func TestFindLeavesOutTheWrappersOfSpotguardRealProcesses(t *testing.T) {
	t.Parallel()
	if _, err := exec.LookPath("timeout"); err != nil {
		t.Skipf("timeout(1) (coreutils) is needed: %v", err)
	}
	token := fmt.Sprintf("sgwrap-%d-%d", os.Getpid(), time.Now().UnixNano())
	dir := t.TempDir()
	// Each inner shell marks itself with a file named for its PID; it does not exec its last
	// command, so it stays the process with this argument list.
	inner := `: > "$0/$$"; sleep 1000; :`
	// The script names the token in its own words too: an ancestor that matches only through
	// the arguments it passes on is left out (TestFindLeavesOutTheWrappersOfSpotguard).
	script := fmt.Sprintf(`timeout 1000 sh -c '%s' "$0" "$1"; : %s`, inner, token)
	outer := start(t, dir, "sh", "-c", script, dir, token)
	killTree(t, outer.pid())
	twin := start(t, dir, "timeout", "1000", "sh", "-c", inner, dir, token)
	killTree(t, twin.pid())

	var shells []int
	waitFor(t, nil, "both inner shells", func() bool {
		entries, err := os.ReadDir(dir)
		if err != nil {
			t.Fatal(err)
		}
		shells = shells[:0]
		for _, e := range entries {
			if pid, err := strconv.Atoi(e.Name()); err == nil {
				shells = append(shells, pid)
			}
		}
		if len(shells) != 2 {
			return false
		}
		// Each shell's sleep must have exec'd: until then the forked child still runs the
		// shell's argument list, token included, and would be found as a third shell.
		procs, err := os.ReadDir("/proc")
		if err != nil {
			t.Fatal(err)
		}
		sleeping := 0
		for _, e := range procs {
			pid, err := strconv.Atoi(e.Name())
			if err != nil {
				continue
			}
			st, err := readStatus("/proc", pid)
			if err != nil || (st.ppid != shells[0] && st.ppid != shells[1]) {
				continue
			}
			if argv, _ := readArgv("/proc", pid); len(argv) > 0 && argv[0] == "sleep" {
				sleeping++
			}
		}
		return sleeping == 2
	})
	st, err := readStatus("/proc", shells[0])
	if err != nil {
		t.Fatal(err)
	}
	self, twinShell := shells[0], shells[1]
	if st.ppid == twin.pid() {
		self, twinShell = shells[1], shells[0]
	}
	st, err = readStatus("/proc", self)
	if err != nil {
		t.Fatal(err)
	}
	wrapper := st.ppid
	if argv, _ := readArgv("/proc", wrapper); len(argv) == 0 || argv[0] != "timeout" {
		t.Fatalf("the parent %d of the agent's shell %d runs %q; want timeout", wrapper, self, argv)
	}

	checkFind(t, Finder{Match: regexp.MustCompile(regexp.QuoteMeta(token)), Self: self},
		map[int]string{outer.pid(): ViaMatch, twin.pid(): ViaMatch, twinShell: ViaMatch})
	// Without that agent, the wrapper is an ordinary process.
	checkFind(t, Finder{Match: regexp.MustCompile(regexp.QuoteMeta(token)), Self: twinShell},
		map[int]string{outer.pid(): ViaMatch, wrapper: ViaMatch, self: ViaMatch})
}

// killTree kills, at the end of the test, the process pid and every process below it, such as
// the children of a shell that the kill of the shell alone would leave running.
func killTree(t *testing.T, pid int) {
	t.Cleanup(func() {
		s := finder{procRoot: defaultProcRoot, status: map[int]procStatus{}}
		tree := s.descendants(pid)
		for p := range tree {
			_ = syscall.Kill(p, syscall.SIGKILL)
		}
		// The caller's start reaps pid; the others are reparented and reaped by init.
		waitFor(t, nil, "the killed processes to be gone", func() bool {
			return !slices.ContainsFunc(slices.Collect(maps.Keys(tree)), func(p int) bool {
				if p == pid {
					return false
				}
				st, err := readStatus(defaultProcRoot, p)
				return err == nil && st.state != 'Z' && st.state != 'X'
			})
		})
	})
}
