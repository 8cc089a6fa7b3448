//go:build linux

package trainer

import (
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"testing"
)

// A fake proc(5) tree: status, cmdline, cgroup and ns/pid of each process, as the kernel shows
// them, so that PID namespaces, containers and other users can be laid out at will.

// The PID namespaces of the fake trees, as the ns/pid links show them.
const (
	hostNS  = "pid:[4026531836]"
	ctrNS   = "pid:[4026532201]" // a container's
	otherNS = "pid:[4026532299]" // another container's
)

// fakeAgent is the agent's own PID in the fake trees (Finder.Self).
const fakeAgent = 100

// fakeProc is one process of a fake tree.
type fakeProc struct {
	pid     int
	cmdline string   // arguments separated by spaces; "" for a kernel thread
	argv    []string // the arguments, if one has a space (then cmdline only names the process)
	uid     int
	ppid    int
	nspid   []int  // NSpid; nil means {pid} (the agent's namespace)
	ns      string // the ns/pid link; "" means hostNS, "-" means none (unreadable)
	state   string // "" means "S (sleeping)"
	cgroup  string // the cgroup file; "" means "0::/"
}

// fakeTree writes procs into a new fake proc root, plus the agent itself (fakeAgent, uid 0, in
// hostNS) unless procs has it.
func fakeTree(t *testing.T, procs ...fakeProc) string {
	t.Helper()
	root := t.TempDir()
	if !slices.ContainsFunc(procs, func(p fakeProc) bool { return p.pid == fakeAgent }) {
		procs = append(procs, fakeProc{pid: fakeAgent, cmdline: "/usr/bin/spotguard run", ppid: 1})
	}
	for _, p := range procs {
		dir := filepath.Join(root, strconv.Itoa(p.pid))
		nspid := p.nspid
		if nspid == nil {
			nspid = []int{p.pid}
		}
		var ns []string
		for _, n := range nspid {
			ns = append(ns, strconv.Itoa(n))
		}
		state := p.state
		if state == "" {
			state = "S (sleeping)"
		}
		name, _, _ := strings.Cut(filepath.Base(strings.Fields(p.cmdline + " kthread")[0]), " ")
		status := fmt.Sprintf("Name:\t%s\nUmask:\t0022\nState:\t%s\nTgid:\t%d\nNgid:\t0\nPid:\t%d\nPPid:\t%d\nTracerPid:\t0\n"+
			"Uid:\t%d\t%d\t%d\t%d\nGid:\t%d\t%d\t%d\t%d\nNStgid:\t%s\nNSpid:\t%s\nNSpgid:\t%s\nNSsid:\t%s\n"+
			"SigQ:\t0/31015\nSigPnd:\t0000000000000000\nShdPnd:\t0000000000000000\nSigBlk:\t0000000000000000\nSigIgn:\t0000000001001000\nSigCgt:\t0000000180004202\n",
			name, state, p.pid, p.pid, p.ppid, p.uid, p.uid, p.uid, p.uid, p.uid, p.uid, p.uid, p.uid,
			strings.Join(ns, "\t"), strings.Join(ns, "\t"), strings.Join(ns, "\t"), strings.Join(ns, "\t"))
		writeFile(t, filepath.Join(dir, "status"), status)
		cmdline := strings.ReplaceAll(p.cmdline, " ", "\x00") + strings.Repeat("\x00", min(len(p.cmdline), 1))
		if p.argv != nil {
			cmdline = strings.Join(p.argv, "\x00") + "\x00"
		}
		writeFile(t, filepath.Join(dir, "cmdline"), cmdline)
		cg := p.cgroup
		if cg == "" {
			cg = "0::/\n"
		}
		writeFile(t, filepath.Join(dir, "cgroup"), cg)
		link := p.ns
		if link == "" {
			link = hostNS
		}
		if link != "-" {
			if err := os.MkdirAll(filepath.Join(dir, "ns"), 0o755); err != nil {
				t.Fatal(err)
			}
			if err := os.Symlink(link, filepath.Join(dir, "ns", "pid")); err != nil {
				t.Fatal(err)
			}
		}
	}
	return root
}

// checkFind checks that f finds exactly want (PID → via) and problems with wantReasons, and
// returns the problems.
func checkFind(t *testing.T, f Finder, want map[int]string, wantReasons ...string) []Problem {
	t.Helper()
	procs, problems := f.Find()
	got := map[int]string{}
	for _, p := range procs {
		got[p.PID] = p.Via
		if p.Cmdline == "" {
			t.Errorf("Find(%+v): %+v has no command line", f, p)
		}
	}
	if fmt.Sprint(got) != fmt.Sprint(want) { // a nil map and an empty one print alike
		t.Errorf("Find(%+v) = %v; want %v (problems %v)", f, got, want, problems)
	}
	if !slices.Equal(reasons(problems), wantReasons) {
		t.Errorf("Find(%+v) problems = %v; want reasons %v", f, problems, wantReasons)
	}
	return problems
}
