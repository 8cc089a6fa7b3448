//go:build linux

package trainer

import (
	"bufio"
	"encoding/json"
	"errors"
	"fmt"
	"io/fs"
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

// These tests start real processes — the example Python trainer, sleep, sh — and send them real
// signals. They never sleep: they poll with a deadline.

const pollTimeout = 30 * time.Second

// neverPID is a PID no process can have: Linux PIDs are below PID_MAX_LIMIT (4194304).
const neverPID = 4194304

// child is a started process that a goroutine waits for.
type child struct {
	cmd  *exec.Cmd
	out  string        // file with its stdout and stderr
	done chan struct{} // closed when Wait has returned
	err  error         // Wait's result, once done is closed
}

// start starts name with args, its output in a file of dir; t.Cleanup kills and reaps it.
func start(t *testing.T, dir, name string, args ...string) *child {
	t.Helper()
	out, err := os.CreateTemp(dir, "output-*.txt")
	if err != nil {
		t.Fatal(err)
	}
	defer out.Close()
	c := &child{cmd: exec.Command(name, args...), out: out.Name(), done: make(chan struct{})}
	c.cmd.Stdout, c.cmd.Stderr = out, out
	if err := c.cmd.Start(); err != nil {
		t.Fatalf("start %s: %v", name, err)
	}
	go func() {
		c.err = c.cmd.Wait()
		close(c.done)
	}()
	t.Cleanup(func() {
		_ = c.cmd.Process.Kill()
		<-c.done
	})
	return c
}

func (c *child) pid() int { return c.cmd.Process.Pid }

func (c *child) output() string {
	b, _ := os.ReadFile(c.out)
	return string(b)
}

// exited waits for the child to exit and returns Wait's error.
func (c *child) exited(t *testing.T) error {
	t.Helper()
	select {
	case <-c.done:
		return c.err
	case <-time.After(pollTimeout):
		t.Fatalf("pid %d did not exit within %v; output:\n%s", c.pid(), pollTimeout, c.output())
		return nil
	}
}

// waitFor polls cond until it is true. It fails the test at the deadline, or at once if c (may
// be nil) exits first.
func waitFor(t *testing.T, c *child, what string, cond func() bool) {
	t.Helper()
	var died <-chan struct{}
	if c != nil {
		died = c.done
	}
	deadline := time.NewTimer(pollTimeout)
	defer deadline.Stop()
	tick := time.NewTicker(5 * time.Millisecond)
	defer tick.Stop()
	for !cond() {
		select {
		case <-tick.C:
		case <-died:
			if cond() {
				return
			}
			t.Fatalf("waiting for %s: pid %d exited (%v); output:\n%s", what, c.pid(), c.err, c.output())
		case <-deadline.C:
			t.Fatalf("waiting for %s: not within %v", what, pollTimeout)
		}
	}
}

func python(t *testing.T) string {
	t.Helper()
	py, err := exec.LookPath("python3")
	if err != nil {
		t.Skipf("python3 is needed to run the example trainer: %v", err)
	}
	return py
}

// pyTrainer is a running examples/python/trainer.py.
type pyTrainer struct {
	*child
	dir, signalLog string
}

// startTrainer starts the example trainer with its own directory, ready file and signal log,
// plus args, and waits until it has installed its signal handlers.
func startTrainer(t *testing.T, args ...string) *pyTrainer {
	t.Helper()
	script, err := filepath.Abs("../../examples/python/trainer.py")
	if err != nil {
		t.Fatal(err)
	}
	dir, err := os.MkdirTemp(t.TempDir(), "trainer-")
	if err != nil {
		t.Fatal(err)
	}
	tr := &pyTrainer{dir: dir, signalLog: filepath.Join(dir, "signals.jsonl")}
	ready := filepath.Join(dir, "ready")
	args = append([]string{script, "--ready-file", ready, "--signal-log", tr.signalLog, "--step-seconds", "0.02"}, args...)
	tr.child = start(t, dir, python(t), args...)
	waitFor(t, tr.child, "the trainer's ready file", func() bool {
		_, err := os.Stat(ready)
		return err == nil
	})
	b, err := os.ReadFile(ready)
	if err != nil {
		t.Fatal(err)
	}
	if pid, ok := parsePID(string(b)); !ok || pid != tr.pid() {
		t.Fatalf("ready file of pid %d holds %q; want the trainer's own PID", tr.pid(), b)
	}
	return tr
}

// received returns how many times the trainer logged receiving sig.
func (tr *pyTrainer) received(t *testing.T, sig string) int {
	t.Helper()
	f, err := os.Open(tr.signalLog)
	if errors.Is(err, fs.ErrNotExist) {
		return 0
	}
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	n := 0
	sc := bufio.NewScanner(f)
	for sc.Scan() {
		var line struct {
			Signal string `json:"signal"`
			PID    int    `json:"pid"`
			TimeNS int64  `json:"time_ns"`
		}
		if err := json.Unmarshal(sc.Bytes(), &line); err != nil {
			// The handler writes a line at once; a partial line is read again at the next poll.
			continue
		}
		if line.PID != tr.pid() || line.TimeNS <= 0 {
			t.Errorf("signal log line %q; want pid %d and a time", sc.Text(), tr.pid())
		}
		if line.Signal == sig {
			n++
		}
	}
	return n
}

// waitReceived waits until the trainer logged sig n times.
func (tr *pyTrainer) waitReceived(t *testing.T, sig string, n int) {
	t.Helper()
	waitFor(t, tr.child, fmt.Sprintf("%d %s in the signal log", n, sig), func() bool { return tr.received(t, sig) >= n })
}

// startSleep starts sleep(1), which catches no signal.
func startSleep(t *testing.T) *child {
	t.Helper()
	c := start(t, t.TempDir(), "sleep", "1000")
	waitFor(t, c, "sleep to exec", func() bool {
		cmdline, _ := readCmdline("/proc", c.pid())
		return strings.HasPrefix(cmdline, "sleep ")
	})
	return c
}

// startZombie starts a process that exits at once and is not reaped until the test ends.
func startZombie(t *testing.T) int {
	t.Helper()
	cmd := exec.Command("sh", "-c", "exit 0")
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = cmd.Wait() })
	pid := cmd.Process.Pid
	waitFor(t, nil, "a zombie", func() bool {
		st, err := readStatus("/proc", pid)
		return err == nil && st.state == 'Z'
	})
	return pid
}

// startExited returns the PID of a process that has exited and been reaped.
func startExited(t *testing.T) int {
	t.Helper()
	cmd := exec.Command("sh", "-c", "exit 0")
	if err := cmd.Run(); err != nil {
		t.Fatal(err)
	}
	return cmd.Process.Pid
}

func writeFile(t *testing.T, path, content string) {
	t.Helper()
	if err := os.MkdirAll(filepath.Dir(path), 0o755); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(path, []byte(content), 0o644); err != nil {
		t.Fatal(err)
	}
}

func pids(procs []Process) []int {
	var p []int
	for _, pr := range procs {
		p = append(p, pr.PID)
	}
	return p
}

func reasons(problems []Problem) []string {
	var r []string
	for _, p := range problems {
		r = append(r, p.Reason)
	}
	return r
}

// checkFound checks that Find returned exactly wantPIDs, all via via, with the command lines of
// the processes, and the problems with wantReasons.
func checkFound(t *testing.T, f Finder, wantPIDs []int, via string, wantReasons ...string) []Problem {
	t.Helper()
	procs, problems := f.Find()
	slices.Sort(wantPIDs)
	if !slices.Equal(pids(procs), wantPIDs) {
		t.Errorf("Find(%+v) = %v; want PIDs %v", f, procs, wantPIDs)
	}
	for _, p := range procs {
		cmdline, _ := readCmdline("/proc", p.PID)
		if p.Via != via || p.Cmdline != cmdline || cmdline == "" {
			t.Errorf("Find(%+v): got %+v; want via %q and cmdline %q", f, p, via, cmdline)
		}
	}
	if !slices.Equal(reasons(problems), wantReasons) {
		t.Errorf("Find(%+v) problems = %v; want reasons %v", f, problems, wantReasons)
	}
	return problems
}

func TestFindByPIDFile(t *testing.T) {
	t.Parallel()
	pidfile := filepath.Join(t.TempDir(), "trainer.pid")
	tr := startTrainer(t, "--pidfile", pidfile)
	checkFound(t, Finder{PIDFile: pidfile}, []int{tr.pid()}, ViaPIDFile)
	if p, _ := (Finder{PIDFile: pidfile}).Find(); len(p) == 1 && !strings.Contains(p[0].Cmdline, "trainer.py --ready-file") {
		t.Errorf("Find: Cmdline = %q; want the arguments separated by spaces", p[0].Cmdline)
	}

	// Found by two methods: once, via the pidfile.
	checkFound(t, Finder{PIDFile: pidfile, Match: regexp.MustCompile(regexp.QuoteMeta(tr.dir))}, []int{tr.pid()}, ViaPIDFile)
}

func TestFindPIDFileProblems(t *testing.T) {
	t.Parallel()
	dir := t.TempDir()
	zombie := startZombie(t)
	tests := []struct {
		name    string
		content string // "" means no pidfile at all
		reason  string
		detail  string // a part of the detail
	}{
		{"missing", "", ReasonPIDFileUnreadable, "no such file"},
		{"garbage", "python3\n", ReasonPIDFileUnreadable, `content "python3\n"`},
		{"empty", "\n", ReasonPIDFileUnreadable, `content "\n"`},
		{"zero", "0", ReasonPIDFileUnreadable, `content "0"`},
		{"negative", "-12", ReasonPIDFileUnreadable, `content "-12"`},
		{"two", "12 13\n", ReasonPIDFileUnreadable, `content "12 13\n"`},
		{"long", strings.Repeat("1", 5000), ReasonPIDFileUnreadable, `"...`},
		{"dead", fmt.Sprintf(" %d\n", neverPID), ReasonStalePIDFile, "not running"},
		{"zombie", strconv.Itoa(zombie), ReasonStalePIDFile, "not running"},
		{"self", strconv.Itoa(os.Getpid()), ReasonStalePIDFile, "spotguard itself"},
		// A named pipe nothing writes: opened, it used to wait for a writer for ever, and the
		// notice path with it.
		{"fifo", "", ReasonPIDFileUnreadable, "a named pipe (FIFO), not a regular file"},
		{"directory", "", ReasonPIDFileUnreadable, "not a regular file"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			path := filepath.Join(dir, tt.name+".pid")
			switch {
			case tt.content != "":
				writeFile(t, path, tt.content)
			case tt.name == "fifo":
				if err := syscall.Mkfifo(path, 0o644); err != nil {
					t.Fatal(err)
				}
			case tt.name == "directory":
				if err := os.Mkdir(path, 0o755); err != nil {
					t.Fatal(err)
				}
			}
			problems := checkFound(t, Finder{PIDFile: path}, nil, "", tt.reason)
			if len(problems) == 1 && (!strings.Contains(problems[0].Detail, path) || !strings.Contains(problems[0].Detail, tt.detail)) {
				t.Errorf("Find(%s) detail = %q; want one naming the file and containing %q", path, problems[0].Detail, tt.detail)
			}
		})
	}
}

func TestFindByMatch(t *testing.T) {
	t.Parallel()
	token := fmt.Sprintf("sgmatch-%d-%d", os.Getpid(), time.Now().UnixNano())
	a := startTrainer(t, "--checkpoint-dir", filepath.Join(t.TempDir(), token))
	b := startTrainer(t, "--checkpoint-dir", filepath.Join(t.TempDir(), token))
	startTrainer(t) // does not match

	checkFound(t, Finder{Match: regexp.MustCompile(regexp.QuoteMeta(token))}, []int{a.pid(), b.pid()}, ViaMatch)
	// Self is never returned.
	checkFound(t, Finder{Match: regexp.MustCompile(regexp.QuoteMeta(token)), Self: a.pid()}, []int{b.pid()}, ViaMatch)

	// Never the agent itself: the test binary's command line matches "trainer".
	self := Finder{Match: regexp.MustCompile(`trainer`), Self: 0}
	if procs, _ := self.Find(); slices.Contains(pids(procs), os.Getpid()) {
		t.Errorf("Find(%+v) = %v; want no PID %d (Self)", self, procs, os.Getpid())
	}

	// The expression as written, in backquotes: %q doubled its backslashes (found from outside).
	problems := checkFound(t, Finder{Match: regexp.MustCompile(token + `-nothing\.py`)}, nil, "", ReasonNoMatch)
	if len(problems) == 1 && !strings.Contains(problems[0].Detail, "`"+token+`-nothing\.py`+"`") {
		t.Errorf("Find detail = %q; want the expression in it, as written, in backquotes", problems[0].Detail)
	}
	checkFound(t, Finder{Match: regexp.MustCompile("."), ProcRoot: filepath.Join(t.TempDir(), "none")}, nil, "", ReasonNoMatch)
}

// Find says when each process started, from the kernel (its starttime after boot), no later than
// it did and within a second of it: a restarted agent tells by it a process it signalled from a
// new one that has its PID since. It says its parent too.
func TestFindSaysWhenAProcessStarted(t *testing.T) {
	t.Parallel()
	token := fmt.Sprintf("sgstarted-%d-%d", os.Getpid(), time.Now().UnixNano())
	before := time.Now()
	c := start(t, t.TempDir(), "sh", "-c", "sleep 30; : "+token)
	after := time.Now()
	// Until it has exec'd sh. (The fork sh makes to run sleep has its command line until it
	// execs: found too, at that moment.)
	var p Process
	for deadline := time.Now().Add(pollTimeout); p.PID == 0; {
		if time.Now().After(deadline) {
			t.Fatalf("Find found no %s with pid %d within %v", token, c.pid(), pollTimeout)
		}
		procs, _ := Finder{Match: regexp.MustCompile(regexp.QuoteMeta(token))}.Find()
		if i := slices.IndexFunc(procs, func(p Process) bool { return p.PID == c.pid() }); i >= 0 {
			p = procs[i]
		}
	}
	if got := p.Started; got.Before(before.Add(-time.Second-10*time.Millisecond)) || got.After(after) {
		t.Errorf("Started = %v; want between %v (less a second) and %v", got, before, after)
	}
	if got := p.PPID; got != os.Getpid() {
		t.Errorf("PPID = %d; want %d, the test that started it", got, os.Getpid())
	}
	if ppid, ticks := readStat(t.TempDir(), c.pid()); ppid != 0 || ticks != 0 {
		t.Errorf("readStat(no such proc) = %d, %d; want 0, 0", ppid, ticks)
	}
}

func TestFindNothingConfigured(t *testing.T) {
	t.Parallel()
	checkFound(t, Finder{}, nil, "", ReasonNoProcess)
}

func TestFindByUnitFakeCgroup(t *testing.T) {
	t.Parallel()
	tr := startTrainer(t)
	sl := startSleep(t)
	zombie := startZombie(t)
	inUnit := fmt.Sprintf("%d\n%d\n%d\n\n", tr.pid(), zombie, neverPID)
	inSub := fmt.Sprintf("%d\n", sl.pid())
	both := []int{tr.pid(), sl.pid()}

	tests := []struct {
		name   string
		files  map[string]string // path under the cgroup root → content
		unit   string
		want   []int
		reason string // "" means no problem
	}{
		{"v2", map[string]string{
			"cgroup.procs":                               "1\n",
			"system.slice/test.service/cgroup.procs":     inUnit,
			"system.slice/test.service/sub/cgroup.procs": inSub,
			"system.slice/other.service/cgroup.procs":    "1\n",
		}, "test.service", both, ""},
		{"no suffix", map[string]string{
			"system.slice/test.service/cgroup.procs":     inUnit,
			"system.slice/test.service/sub/cgroup.procs": inSub,
		}, "test", both, ""},
		{"hybrid", map[string]string{
			"unified/system.slice/test.service/cgroup.procs":       inUnit,
			"unified/system.slice/test.service/a/b/c/cgroup.procs": inSub,
		}, "test.service", both, ""},
		{"v1", map[string]string{
			"systemd/system.slice/test.service/cgroup.procs":   inUnit,
			"systemd/system.slice/test.service/x/cgroup.procs": inSub,
		}, "test.service", both, ""},
		{"walk", map[string]string{
			"unified/cgroup.procs": "",
			"unified/user.slice/user-0.slice/user@0.service/test.service/cgroup.procs": inUnit,
		}, "test.service", []int{tr.pid()}, ""},
		{"user service", map[string]string{
			"cgroup.procs": "",
			"user.slice/user-1000.slice/user@1000.service/app.slice/test.service/cgroup.procs": inUnit,
		}, "test.service", []int{tr.pid()}, ""},
		{"shallowest wins", map[string]string{
			"cgroup.procs": "",
			"a.slice/b.slice/c.slice/test.scope/cgroup.procs": inSub,
			"z.slice/test.scope/cgroup.procs":                 inUnit,
		}, "test.scope", []int{tr.pid()}, ""},
		{"too deep", map[string]string{
			"unified/cgroup.procs": "",
			"unified/a.slice/b.slice/c.slice/d.slice/e.slice/f.slice/test.service/cgroup.procs": inUnit,
		}, "test.service", nil, ReasonUnitNotFound},
		{"not a hierarchy", map[string]string{
			"cpu/system.slice/x/test.service/cgroup.procs": inUnit,
		}, "test.service", nil, ReasonUnitNotFound},
		{"missing", map[string]string{
			"system.slice/other.service/cgroup.procs": inUnit,
		}, "test.service", nil, ReasonUnitNotFound},
		{"escape", map[string]string{
			"system.slice/test.service/cgroup.procs": inUnit,
		}, "../system.slice/test.service", nil, ReasonUnitNotFound},
		{"empty", map[string]string{
			"system.slice/test.service/cgroup.procs":     "",
			"system.slice/test.service/sub/cgroup.procs": fmt.Sprintf("%d\n", zombie),
		}, "test.service", nil, ReasonNoProcess},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			root := t.TempDir()
			for path, content := range tt.files {
				writeFile(t, filepath.Join(root, path), content)
			}
			var want []string
			if tt.reason != "" {
				want = []string{tt.reason}
			}
			checkFound(t, Finder{Unit: tt.unit, CgroupRoot: root}, tt.want, ViaUnit, want...)
		})
	}
}

// TestFindByUnitRealCgroup puts real processes into a real cgroup (v2) and finds them from the
// real cgroup root. It needs permission to create cgroups (root).
func TestFindByUnitRealCgroup(t *testing.T) {
	t.Parallel()
	const root = "/sys/fs/cgroup"
	var base string
	for _, b := range []string{filepath.Join(root, "unified"), root} {
		if _, err := os.Stat(filepath.Join(b, "cgroup.controllers")); err == nil {
			base = b
			break
		}
	}
	if base == "" {
		t.Skipf("no cgroup v2 hierarchy at %s or %s/unified", root, root)
	}
	slice := filepath.Join(base, fmt.Sprintf("spotguard-test-%d.slice", os.Getpid()))
	unit := fmt.Sprintf("spotguard-test-%d.service", os.Getpid())
	if err := os.Mkdir(slice, 0o755); err != nil {
		t.Skipf("cannot create a cgroup: %v", err)
	}
	dirs := []string{slice, filepath.Join(slice, unit), filepath.Join(slice, unit, "sub")}
	for _, d := range dirs[1:] {
		if err := os.Mkdir(d, 0o755); err != nil {
			t.Fatal(err)
		}
	}
	t.Cleanup(func() {
		// The children were reaped by their own cleanups, which run first; the kernel may take
		// a moment to drop them from the cgroup.
		for _, d := range slices.Backward(dirs) {
			waitFor(t, nil, "rmdir "+d, func() bool {
				err := os.Remove(d)
				return err == nil || errors.Is(err, fs.ErrNotExist)
			})
		}
	})

	tr := startTrainer(t)
	sl := startSleep(t)
	move := func(pid int, dir string) {
		t.Helper()
		if err := os.WriteFile(filepath.Join(dir, "cgroup.procs"), []byte(strconv.Itoa(pid)), 0o644); err != nil {
			t.Skipf("cannot move a process into a cgroup: %v", err)
		}
	}
	move(tr.pid(), dirs[1])
	move(sl.pid(), dirs[2])

	checkFound(t, Finder{Unit: unit}, []int{tr.pid(), sl.pid()}, ViaUnit)
	checkFound(t, Finder{Unit: "spotguard-test-none.service"}, nil, "", ReasonUnitNotFound)

	// The whole chain on the real unit: found, checked, signalled.
	procs, _ := Finder{Unit: unit}.Find()
	results := Signal("", procs, syscall.SIGUSR1)
	want := map[int]Outcome{tr.pid(): OutcomeSent, sl.pid(): OutcomeNotCaught}
	for _, r := range results {
		if r.Outcome != want[r.PID] || r.Err != nil {
			t.Errorf("Signal(unit %s): pid %d: %s, %v; want %s", unit, r.PID, r.Outcome, r.Err, want[r.PID])
		}
	}
	tr.waitReceived(t, "SIGUSR1", 1)
}

func TestCatches(t *testing.T) {
	t.Parallel()
	handler := startTrainer(t)
	noHandler := startTrainer(t, "--no-handler")
	usr2 := startTrainer(t, "--signal", "usr2")
	sl := startSleep(t)
	zombie := startZombie(t)

	tests := []struct {
		name string
		pid  int
		sig  syscall.Signal
		want bool
	}{
		{"trainer USR1", handler.pid(), syscall.SIGUSR1, true},
		{"trainer TERM", handler.pid(), syscall.SIGTERM, true},
		{"trainer USR2", handler.pid(), syscall.SIGUSR2, false},
		{"trainer INT (Python's KeyboardInterrupt)", handler.pid(), syscall.SIGINT, true},
		{"no-handler USR1", noHandler.pid(), syscall.SIGUSR1, false},
		{"no-handler TERM", noHandler.pid(), syscall.SIGTERM, true},
		{"usr2 trainer USR2", usr2.pid(), syscall.SIGUSR2, true},
		{"usr2 trainer USR1", usr2.pid(), syscall.SIGUSR1, false},
		{"sleep USR1", sl.pid(), syscall.SIGUSR1, false},
		{"sleep TERM", sl.pid(), syscall.SIGTERM, false},
		{"zombie", zombie, syscall.SIGUSR1, false},
	}
	for _, tt := range tests {
		got, err := Catches("/proc", tt.pid, tt.sig)
		if got != tt.want || err != nil {
			t.Errorf("Catches(%s: pid %d, %s) = %v, %v; want %v, nil", tt.name, tt.pid, SignalName(tt.sig), got, err, tt.want)
		}
	}
	if got, err := Catches("", neverPID, syscall.SIGUSR1); got || !errors.Is(err, fs.ErrNotExist) {
		t.Errorf("Catches(no such pid) = %v, %v; want false, an error wrapping fs.ErrNotExist", got, err)
	}
}

func checkResults(t *testing.T, got []Result, want ...Result) {
	t.Helper()
	if len(got) != len(want) {
		t.Fatalf("Signal = %+v; want %+v", got, want)
	}
	for i := range got {
		g, w := got[i], want[i]
		if g.PID != w.PID || g.Cmdline != w.Cmdline || g.Outcome != w.Outcome || (g.Err != nil) != (w.Outcome == OutcomeFailed) {
			t.Errorf("Signal: result %d = %+v; want %+v", i, g, w)
		}
	}
}

func TestSignalCaught(t *testing.T) {
	t.Parallel()
	tr := startTrainer(t)
	p := Process{PID: tr.pid(), Cmdline: "trainer", Via: ViaMatch}

	// Listed twice, signalled once.
	checkResults(t, Signal("/proc", []Process{p, p}, syscall.SIGUSR1), Result{PID: p.PID, Cmdline: "trainer", Outcome: OutcomeSent})
	tr.waitReceived(t, "SIGUSR1", 1)
	checkResults(t, Signal("/proc", []Process{p}, syscall.SIGUSR1), Result{PID: p.PID, Cmdline: "trainer", Outcome: OutcomeSent})
	tr.waitReceived(t, "SIGUSR1", 2)
	checkResults(t, Signal("/proc", []Process{p}, syscall.SIGTERM), Result{PID: p.PID, Cmdline: "trainer", Outcome: OutcomeSent})
	if err := tr.exited(t); err != nil {
		t.Fatalf("trainer after SIGTERM: %v; want exit 0; output:\n%s", err, tr.output())
	}
	// The log is final now: exactly one line per call.
	if got := tr.received(t, "SIGUSR1"); got != 2 {
		t.Errorf("Got(%q) = %d; want 2", "SIGUSR1 lines", got)
	}
	if got := tr.received(t, "SIGTERM"); got != 1 {
		t.Errorf("Got(%q) = %d; want 1", "SIGTERM lines", got)
	}

	// Exited and reaped: gone, not an error.
	checkResults(t, Signal("/proc", []Process{p}, syscall.SIGUSR1), Result{PID: p.PID, Cmdline: "trainer", Outcome: OutcomeGone})
}

func TestSignalNotCaught(t *testing.T) {
	t.Parallel()
	tr := startTrainer(t, "--no-handler")
	sl := startSleep(t)
	procs := []Process{{PID: tr.pid()}, {PID: sl.pid()}}
	checkResults(t, Signal("/proc", procs, syscall.SIGUSR1),
		Result{PID: tr.pid(), Outcome: OutcomeNotCaught},
		Result{PID: sl.pid(), Outcome: OutcomeNotCaught})

	// Had SIGUSR1 been sent, it would have ended both (its default action) before any later
	// signal. The trainer catches SIGTERM: it must log it and exit 0.
	checkResults(t, Signal("/proc", procs[:1], syscall.SIGTERM), Result{PID: tr.pid(), Outcome: OutcomeSent})
	if err := tr.exited(t); err != nil {
		t.Errorf("no-handler trainer after SIGTERM: %v; want exit 0 (alive until then); output:\n%s", err, tr.output())
	}
	if got := tr.received(t, "SIGUSR1"); got != 0 {
		t.Errorf("Got(%q) = %d; want 0", "SIGUSR1 lines", got)
	}
	if got := tr.received(t, "SIGTERM"); got != 1 {
		t.Errorf("Got(%q) = %d; want 1", "SIGTERM lines", got)
	}
	// sleep catches nothing: SIGTERM, not SIGUSR1, must be what ends it.
	checkResults(t, Signal("/proc", procs[1:], syscall.SIGTERM), Result{PID: sl.pid(), Outcome: OutcomeNotCaught})
	if err := sl.cmd.Process.Signal(syscall.SIGTERM); err != nil {
		t.Fatal(err)
	}
	var exit *exec.ExitError
	if err := sl.exited(t); !errors.As(err, &exit) || exit.Sys().(syscall.WaitStatus).Signal() != syscall.SIGTERM {
		t.Errorf("sleep ended by %v; want SIGTERM (it must still have been alive)", err)
	}
}

func TestSignalGoneAndFailed(t *testing.T) {
	t.Parallel()
	tr := startTrainer(t)
	exited := startExited(t)
	zombie := startZombie(t)
	procs := []Process{{PID: exited}, {PID: tr.pid()}, {PID: zombie}, {PID: neverPID}, {PID: 0}}
	checkResults(t, Signal("/proc", procs, syscall.SIGUSR1),
		Result{PID: exited, Outcome: OutcomeGone},
		Result{PID: tr.pid(), Outcome: OutcomeSent},
		Result{PID: zombie, Outcome: OutcomeGone},
		Result{PID: neverPID, Outcome: OutcomeGone},
		Result{PID: 0, Outcome: OutcomeFailed})
	tr.waitReceived(t, "SIGUSR1", 1)

	for _, sig := range []syscall.Signal{0, 65} {
		checkResults(t, Signal("", procs[1:2], sig), Result{PID: tr.pid(), Outcome: OutcomeFailed})
	}
	checkResults(t, Signal("", nil, syscall.SIGUSR1))
}

// TestTrainerScript checks the example trainer as a peer: a signal makes a complete checkpoint,
// training goes on, SIGTERM saves and exits 0, and a new run resumes from the newest one.
func TestTrainerScript(t *testing.T) {
	t.Parallel()
	ckpt := filepath.Join(t.TempDir(), "ckpt")
	tr := startTrainer(t, "--checkpoint-dir", ckpt, "--files", "3", "--checkpoint-mb", "0.01")
	p := []Process{{PID: tr.pid()}}

	complete := func() []string {
		m, _ := filepath.Glob(filepath.Join(ckpt, "step-*", "_COMPLETE"))
		return m
	}
	checkResults(t, Signal("", p, syscall.SIGUSR1), Result{PID: tr.pid(), Outcome: OutcomeSent})
	waitFor(t, tr.child, "a complete checkpoint", func() bool { return len(complete()) == 1 })
	// Wait until the save has returned: a SIGTERM during a save stops right after it, with
	// nothing new to save.
	first := filepath.Dir(complete()[0])
	waitFor(t, tr.child, "the end of the save", func() bool { return strings.Contains(tr.output(), first+" written") })
	checkResults(t, Signal("", p, syscall.SIGTERM), Result{PID: tr.pid(), Outcome: OutcomeSent})
	if err := tr.exited(t); err != nil {
		t.Fatalf("trainer after SIGTERM: %v; want exit 0; output:\n%s", err, tr.output())
	}
	markers := complete()
	if len(markers) != 2 {
		t.Fatalf("Got(%q) = %v; want 2 complete checkpoints; output:\n%s", ckpt, markers, tr.output())
	}
	for _, m := range markers {
		dir := filepath.Dir(m)
		entries, err := os.ReadDir(dir)
		if err != nil {
			t.Fatal(err)
		}
		var got []string
		for _, e := range entries {
			info, err := e.Info()
			if err != nil {
				t.Fatal(err)
			}
			got = append(got, fmt.Sprintf("%s:%d", e.Name(), info.Size()))
		}
		var want []string
		for i := range 3 {
			want = append(want, fmt.Sprintf("shard-%d.bin:%d", i, (1<<20)/100 /* int(0.01 MiB) */))
		}
		step, _ := strconv.Atoi(strings.TrimPrefix(filepath.Base(dir), "step-"))
		want = append([]string{fmt.Sprintf("_COMPLETE:%d", len(fmt.Sprintf("{\"step\": %d}\n", step)))}, want...)
		if !slices.Equal(got, want) {
			t.Errorf("Got(%q) = %v; want %v", dir, got, want)
		}
	}

	// An incomplete, newer checkpoint is not resumed from.
	writeFile(t, filepath.Join(ckpt, "step-999999", "shard-0.bin"), "torn")
	newest := filepath.Dir(markers[len(markers)-1])
	step, _ := strconv.Atoi(strings.TrimPrefix(filepath.Base(newest), "step-"))
	next := startTrainer(t, "--resume-from", ckpt)
	wantLine := fmt.Sprintf("resumed from %s at step %d\n", newest, step)
	if got := next.output(); !strings.Contains(got, wantLine) {
		t.Errorf("Got(%q) = %q; want it to contain %q", "resume output", got, wantLine)
	}
}
