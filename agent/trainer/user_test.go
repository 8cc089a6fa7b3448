//go:build linux

package trainer

import (
	"errors"
	"fmt"
	"io/fs"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strings"
	"syscall"
	"testing"
	"time"
)

func uidPtr(uid int) *int { return &uid }

// trainer.user limits every method to one user's processes; a method that found only other
// users' processes says so.
func TestFindUserFiltersEveryMethod(t *testing.T) {
	t.Parallel()
	aliceScope := "0::/system.slice/docker-" + ctrID + ".scope\n"
	bobScope := "0::/system.slice/docker-" + otherID + ".scope\n"
	proc := fakeTree(t,
		fakeProc{pid: 1, cmdline: "/sbin/init"},
		fakeProc{pid: 2000, cmdline: "python3 train.py --alice", uid: 1000, ppid: 1},
		fakeProc{pid: 2001, cmdline: "python3 train.py --bob", uid: 1001, ppid: 1},
		fakeProc{pid: 2002, cmdline: "python3 train.py --bob --worker", uid: 1001, ppid: 2001},
		fakeProc{pid: 3000, cmdline: "python3 ctr.py --alice", uid: 1000, nspid: []int{3000, 1}, ns: ctrNS, cgroup: aliceScope},
		fakeProc{pid: 3001, cmdline: "python3 ctr.py --root", uid: 0, nspid: []int{3001, 2}, ns: ctrNS, cgroup: aliceScope},
		fakeProc{pid: 3100, cmdline: "python3 ctr.py --bob", uid: 1001, nspid: []int{3100, 1}, ns: otherNS, cgroup: bobScope},
	)
	cgroups := t.TempDir()
	writeFile(t, filepath.Join(cgroups, "system.slice/alice.service/cgroup.procs"), "2000\n2001\n")
	writeFile(t, filepath.Join(cgroups, "system.slice/bob.service/cgroup.procs"), "2001\n2002\n")
	dir := t.TempDir()
	pidfile := func(pid int) string {
		p := filepath.Join(dir, fmt.Sprintf("%d.pid", pid))
		writeFile(t, p, fmt.Sprintf("%d\n", pid))
		return p
	}
	base := Finder{ProcRoot: proc, CgroupRoot: cgroups, Self: fakeAgent, User: uidPtr(1000)}
	with := func(f Finder) Finder {
		f.ProcRoot, f.CgroupRoot, f.Self = base.ProcRoot, base.CgroupRoot, base.Self
		if f.User == nil {
			f.User = base.User
		}
		return f
	}
	u1001 := describeUID(1001) // with its name, where a user has it on this machine
	tests := []struct {
		name   string
		f      Finder
		want   map[int]string
		reason string
		others string // the other users' processes the detail lists
	}{
		{"pidfile", with(Finder{PIDFile: pidfile(2000)}), map[int]string{2000: ViaPIDFile}, "", ""},
		{"pidfile of another user", with(Finder{PIDFile: pidfile(2001)}), nil, ReasonOtherUser, strings.ReplaceAll("2001 (uid 1001)", "uid 1001", u1001)},
		{"unit", with(Finder{Unit: "alice"}), map[int]string{2000: ViaUnit}, "", ""},
		{"unit of another user", with(Finder{Unit: "bob"}), nil, ReasonOtherUser, strings.ReplaceAll("2001 (uid 1001), 2002 (uid 1001)", "uid 1001", u1001)},
		{"match", with(Finder{Match: regexp.MustCompile(`train\.py`)}), map[int]string{2000: ViaMatch}, "", ""},
		{"match of another user", with(Finder{Match: regexp.MustCompile(`--bob`)}), nil, ReasonOtherUser, strings.ReplaceAll("2001 (uid 1001), 2002 (uid 1001), 3100 (uid 1001)", "uid 1001", u1001)},
		{"container", with(Finder{Container: ctrID[:12]}), map[int]string{3000: ViaContainer}, "", ""},
		{"container of another user", with(Finder{Container: otherID}), nil, ReasonOtherUser, strings.ReplaceAll("3100 (uid 1001)", "uid 1001", u1001)},
		{"root's", with(Finder{Container: ctrID[:12], User: uidPtr(0)}), map[int]string{3001: ViaContainer}, "", ""},
		{"tree", with(Finder{Under: 2001, User: uidPtr(1001)}), map[int]string{2001: ViaTree, 2002: ViaTree}, "", ""},
		{"tree of another user", with(Finder{Under: 2001}), nil, ReasonOtherUser, strings.ReplaceAll("2001 (uid 1001), 2002 (uid 1001)", "uid 1001", u1001)},
		{"any user", Finder{Match: regexp.MustCompile(`--bob`), ProcRoot: proc, Self: fakeAgent},
			map[int]string{2001: ViaMatch, 2002: ViaMatch, 3100: ViaMatch}, "", ""},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			var want []string
			if tt.reason != "" {
				want = []string{tt.reason}
			}
			problems := checkFind(t, tt.f, tt.want, want...)
			if tt.others == "" || len(problems) != 1 {
				return
			}
			for _, part := range []string{tt.others, "other users than trainer.user (uid " + fmt.Sprint(*tt.f.User), "never signalled"} {
				if !strings.Contains(problems[0].Detail, part) {
					t.Errorf("Find detail %q; want it to contain %q", problems[0].Detail, part)
				}
			}
		})
	}
	// Several methods: each one that found only other users' processes says so.
	f := with(Finder{PIDFile: pidfile(2001), Unit: "bob", Match: regexp.MustCompile(`--alice`)})
	checkFind(t, f, map[int]string{2000: ViaMatch, 3000: ViaMatch}, ReasonOtherUser, ReasonOtherUser)
}

// Finder.Under confines every method to one process tree, and finds all of it.
func TestFindUnderTree(t *testing.T) {
	t.Parallel()
	proc := fakeTree(t,
		fakeProc{pid: 1, cmdline: "/sbin/init"},
		fakeProc{pid: 2000, cmdline: "sh -c torchrun train.py", ppid: 1},
		fakeProc{pid: 2001, cmdline: "torchrun train.py", ppid: 2000},
		fakeProc{pid: 2002, cmdline: "python3 train.py --local-rank 0", ppid: 2001},
		fakeProc{pid: 2003, cmdline: "python3 train.py --local-rank 1", ppid: 2001},
		fakeProc{pid: 2004, cmdline: "python3 train.py --zombie", ppid: 2001, state: "Z (zombie)"},
		fakeProc{pid: 3000, cmdline: "python3 train.py --users-own-job", ppid: 1},
		fakeProc{pid: 3001, cmdline: "python3 train.py --users-own-job --worker", ppid: 3000},
	)
	tree := map[int]string{2000: ViaTree, 2001: ViaTree, 2002: ViaTree, 2003: ViaTree}
	pidfile := filepath.Join(t.TempDir(), "pid")
	writeFile(t, pidfile, "2000\n")
	tests := []struct {
		name   string
		f      Finder
		want   map[int]string
		reason string
	}{
		{"tree", Finder{Under: 2000}, tree, ""},
		{"subtree", Finder{Under: 2001}, map[int]string{2001: ViaTree, 2002: ViaTree, 2003: ViaTree}, ""},
		{"pidfile of the root", Finder{Under: 2000, PIDFile: pidfile}, map[int]string{2000: ViaPIDFile, 2001: ViaTree, 2002: ViaTree, 2003: ViaTree}, ""},
		{"match in and out of the tree", Finder{Under: 2000, Match: regexp.MustCompile(`train\.py`)},
			map[int]string{2000: ViaMatch, 2001: ViaMatch, 2002: ViaMatch, 2003: ViaMatch}, ""},
		{"match only out of the tree", Finder{Under: 2000, Match: regexp.MustCompile(`users-own-job`)}, tree, ReasonNoMatch},
		{"gone", Finder{Under: 9999}, nil, ReasonNoProcess},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			f := tt.f
			f.ProcRoot, f.Self = proc, fakeAgent
			var want []string
			if tt.reason != "" {
				want = []string{tt.reason}
			}
			problems := checkFind(t, f, tt.want, want...)
			if tt.reason == ReasonNoMatch && len(problems) == 1 && !strings.Contains(problems[0].Detail, "2 process(es) it found are outside the process tree") {
				t.Errorf("Find detail %q; want it to say 2 processes were left out of the tree", problems[0].Detail)
			}
		})
	}
}

// catcher is a shell that catches SIGUSR1 and then writes its log file; it reads stdin, a pipe
// the test holds open, until then.
type catcher struct {
	*child
	log string
}

// startCatcher starts a catcher named name (its $0, in its command line) as cred's user (nil: ours)
// in dir, and waits until its trap is set.
func startCatcher(t *testing.T, dir, name string, cred *syscall.Credential) *catcher {
	t.Helper()
	c := &catcher{log: filepath.Join(dir, name+".log")}
	ready := filepath.Join(dir, name+".ready")
	cmd := exec.Command("sh", "-c", `trap 'echo USR1 >> "$1"; exit 0' USR1; echo $$ > "$2"; while read x; do :; done`, name, c.log, ready)
	cmd.SysProcAttr = &syscall.SysProcAttr{Credential: cred}
	stdin, w, err := os.Pipe()
	if err != nil {
		t.Fatal(err)
	}
	cmd.Stdin = stdin
	c.child = &child{cmd: cmd, out: filepath.Join(dir, name+".out"), done: make(chan struct{})}
	out, err := os.Create(c.out)
	if err != nil {
		t.Fatal(err)
	}
	cmd.Stdout, cmd.Stderr = out, out
	if err := cmd.Start(); err != nil {
		t.Fatalf("start %s: %v", name, err)
	}
	stdin.Close()
	out.Close()
	go func() {
		c.err = cmd.Wait()
		close(c.done)
	}()
	t.Cleanup(func() {
		_ = cmd.Process.Kill()
		<-c.done
		w.Close()
	})
	waitFor(t, c.child, name+"'s trap", func() bool {
		_, err := os.Stat(ready)
		return err == nil
	})
	return c
}

// A process of another user whose command line matches trainer.match is never signalled when
// trainer.user is set; the user's own is.
func TestFindUserRealProcesses(t *testing.T) {
	t.Parallel()
	if os.Geteuid() != 0 {
		if os.Getenv("CI") != "" {
			t.Fatal("this test needs root, to start a process of another user (CI runs as root)")
		}
		t.Skip("needs root, to start a process of another user")
	}
	dir, err := os.MkdirTemp("", "spotguard-user-")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { os.RemoveAll(dir) })
	if err := os.Chmod(dir, 0o777); err != nil { // the other user writes its files here
		t.Fatal(err)
	}
	token := fmt.Sprintf("sguser-%d-%d", os.Getpid(), time.Now().UnixNano())
	own := startCatcher(t, dir, token+"-own", nil)
	other := startCatcher(t, dir, token+"-nobody", &syscall.Credential{Uid: 65534, Gid: 65534})
	re := regexp.MustCompile(regexp.QuoteMeta(token))

	// Without trainer.user both match.
	checkFound(t, Finder{Match: re}, []int{own.pid(), other.pid()}, ViaMatch)

	uid := os.Getuid()
	checkFound(t, Finder{Match: re, User: &uid}, []int{own.pid()}, ViaMatch)
	found, _ := Finder{Match: re, User: &uid}.Find()
	if len(found) != 1 {
		t.Fatalf("Find(trainer.user %d) = %v; want only pid %d", uid, found, own.pid())
	}
	checkResults(t, Signal("", found, syscall.SIGUSR1), Result{PID: own.pid(), Cmdline: found[0].Cmdline, Outcome: OutcomeSent})
	if err := own.exited(t); err != nil {
		t.Errorf("own catcher after SIGUSR1: %v; want exit 0", err)
	}
	if b, err := os.ReadFile(own.log); err != nil || string(b) != "USR1\n" {
		t.Errorf("own catcher's log = %q, %v; want USR1", b, err)
	}
	// The other user's process was never signalled: alive, nothing logged.
	if st, err := readStatus("/proc", other.pid()); err != nil || st.state == 'Z' || st.uid != 65534 {
		t.Errorf("the other user's catcher: %+v, %v; want it running as uid 65534", st, err)
	}
	if _, err := os.Stat(other.log); !errors.Is(err, fs.ErrNotExist) {
		t.Errorf("the other user's catcher logged a signal (%v); want none", err)
	}

	// Only the other user's process matches: the problem says why nothing is signalled.
	problems := checkFound(t, Finder{Match: regexp.MustCompile(regexp.QuoteMeta(token + "-nobody")), User: &uid}, nil, "", ReasonOtherUser)
	if len(problems) == 1 && !strings.Contains(problems[0].Detail, fmt.Sprintf("%d (uid 65534", other.pid())) {
		t.Errorf("Find detail %q; want it to name pid %d of uid 65534", problems[0].Detail, other.pid())
	}
}

func TestParseUser(t *testing.T) {
	t.Parallel()
	tests := []struct {
		in      string
		want    int // -1: nil
		wantErr string
	}{
		{"", -1, ""},
		{"  ", -1, ""},
		{"root", 0, ""},
		{"nobody", 65534, ""},
		{"0", 0, ""},
		{"1000", 1000, ""},
		{" 4242 ", 4242, ""},
		{"4294967295", -1, "out of range"},
		{"99999999999", -1, "out of range"},
		{"no-such-user-spotguard", -1, `no user "no-such-user-spotguard" here`},
	}
	for _, tt := range tests {
		got, err := ParseUser(tt.in)
		gotN := -1
		if got != nil {
			gotN = *got
		}
		if gotN != tt.want || (err == nil) != (tt.wantErr == "") || (err != nil && !strings.Contains(err.Error(), tt.wantErr)) {
			t.Errorf("ParseUser(%q) = %d, %v; want %d, error containing %q", tt.in, gotN, err, tt.want, tt.wantErr)
		}
	}
}
