//go:build linux

package trainer

import (
	"path/filepath"
	"strings"
	"testing"
)

// Container IDs of the fake trees. ctrA and ctrB share their first 12 digits.
const (
	ctrID    = "3f4a9c2b7d1e8f605a4b3c2d1e0f9a8b7c6d5e4f3a2b1c0d9e8f7a6b5c4d3e2f"
	otherID  = "9e8d7c6b5a4f3e2d1c0b9a8f7e6d5c4b3a2f1e0d9c8b7a6f5e4d3c2b1a0f9e8d"
	ctrA     = "abcdef0123456789aaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaa"
	ctrB     = "abcdef012345bbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbb"
	ctrScope = "0::/system.slice/docker-" + ctrID + ".scope\n"
)

// namespaceTree is a host with a trainer on the host (4321), a Docker container ctrID whose
// init (tini) and trainer have the PIDs 1 and 57 inside, and another container whose nginx
// has PID 3 inside. Host PID 57 is journald, which catches SIGUSR1. links false leaves out the
// ns/pid links, as for an agent without the right to read them: NSpid alone must do.
func namespaceTree(t *testing.T, links bool) string {
	ns := func(n string) string {
		if !links {
			return "-"
		}
		return n
	}
	return fakeTree(t,
		fakeProc{pid: fakeAgent, cmdline: "/usr/bin/spotguard run", ppid: 1, ns: ns(hostNS)},
		fakeProc{pid: 1, cmdline: "/sbin/init splash", ns: ns(hostNS)},
		fakeProc{pid: 57, cmdline: "/lib/systemd/systemd-journald", ppid: 1, ns: ns(hostNS)},
		fakeProc{pid: 4321, cmdline: "python3 train.py --on-host", uid: 1000, ppid: 1, ns: ns(hostNS)},
		fakeProc{pid: 5000, cmdline: "/sbin/docker-init -- python3 train.py", ppid: 4000, nspid: []int{5000, 1}, ns: ns(ctrNS), cgroup: ctrScope},
		fakeProc{pid: 5001, cmdline: "python3 train.py --in-container", ppid: 5000, nspid: []int{5001, 57}, ns: ns(ctrNS), cgroup: ctrScope},
		fakeProc{pid: 6000, cmdline: "nginx: master process", ppid: 5900, nspid: []int{6000, 3}, ns: ns(otherNS),
			cgroup: "0::/system.slice/docker-" + otherID + ".scope\n"},
	)
}

// A pidfile PID is trusted only when it can mean one process alone: not PID 1, not a process in
// another PID namespace, not a PID that a process in a container has as its own there. With
// trainer.container it is read in the container's PID namespace.
func TestFindPIDFileNamespaces(t *testing.T) {
	t.Parallel()
	tests := []struct {
		name      string
		content   string
		container string
		want      map[int]string
		reasons   []string
		detail    []string // parts of the first problem's detail
	}{
		{"init", "1\n", "", nil, []string{ReasonPIDFileInit}, []string{"holds PID 1", "init", "/sbin/init", pidfileHowTo}},
		{"ambiguous with a container's own PID", "57\n", "", nil, []string{ReasonPIDFileNamespace},
			[]string{"PID 57, which is ambiguous", "systemd-journald", "5001", "--in-container", "trainer.container", "--pid=host", "trainer.match or trainer.unit"}},
		{"host PID of a container's process", "5001\n", "", nil, []string{ReasonPIDFileNamespace},
			[]string{"in another PID namespace", "own PID is 57", pidfileHowTo}},
		{"only a container's own PID", "3\n", "", nil, []string{ReasonPIDFileNamespace},
			[]string{"no process has here", "6000", "nginx", pidfileHowTo}},
		{"host trainer", "4321\n", "", map[int]string{4321: ViaPIDFile}, nil, nil},
		{"dead", "9999\n", "", nil, []string{ReasonStalePIDFile}, []string{"not running"}},

		{"container: its trainer", "57\n", ctrID[:12], map[int]string{5000: ViaContainer, 5001: ViaPIDFile}, nil, nil},
		{"container: its init", "1\n", ctrID, map[int]string{5000: ViaPIDFile, 5001: ViaContainer}, nil, nil},
		{"container: no such PID in it", "3\n", ctrID[:12], map[int]string{5000: ViaContainer, 5001: ViaContainer},
			[]string{ReasonStalePIDFile}, []string{"PID 3", "no running process of container " + ctrID[:12]}},
		{"container: a host PID", "4321\n", ctrID[:12], map[int]string{5000: ViaContainer, 5001: ViaContainer},
			[]string{ReasonStalePIDFile}, []string{"PID 4321"}},
		{"container: not running", "57\n", otherID[:20] + "0", nil,
			[]string{ReasonStalePIDFile, ReasonContainerNotFound}, []string{"PID 57", "was not found"}},
	}
	for _, links := range []bool{true, false} {
		for _, tt := range tests {
			name := tt.name + "/ns links"
			if !links {
				name = tt.name + "/NSpid only"
			}
			t.Run(name, func(t *testing.T) {
				t.Parallel()
				proc := namespaceTree(t, links)
				pidfile := filepath.Join(t.TempDir(), "trainer.pid")
				writeFile(t, pidfile, tt.content)
				f := Finder{PIDFile: pidfile, Container: tt.container, ProcRoot: proc, Self: fakeAgent,
					DockerSocket: filepath.Join(t.TempDir(), "none.sock")}
				problems := checkFind(t, f, tt.want, tt.reasons...)
				for _, d := range tt.detail {
					if len(problems) == 0 || !strings.Contains(problems[0].Detail, d) {
						t.Errorf("Find(pidfile %q) problems %v; want the first one's detail to contain %q", tt.content, problems, d)
					}
				}
				if len(problems) > 0 && !strings.Contains(problems[0].Detail, pidfile) {
					t.Errorf("Find(pidfile %q) detail %q; want it to name the pidfile", tt.content, problems[0].Detail)
				}
			})
		}
	}
}

func TestReadStatusNamespaceFields(t *testing.T) {
	t.Parallel()
	proc := namespaceTree(t, true)
	st, err := readStatus(proc, 5001)
	if err != nil {
		t.Fatal(err)
	}
	if own, ok := st.ownPID(); !ok || own != 57 || len(st.nspid) != 2 || st.ppid != 5000 || st.uid != 0 {
		t.Errorf("readStatus(5001) = %+v; want NSpid [5001 57], own PID 57, PPid 5000, uid 0", st)
	}
	st, err = readStatus(proc, 4321)
	if own, _ := st.ownPID(); err != nil || own != 4321 || st.uid != 1000 {
		t.Errorf("readStatus(4321) = %+v, %v; want own PID 4321, uid 1000", st, err)
	}
	// Old kernels have no NSpid; a status without Uid has no uid.
	writeStatus(t, proc, "77", "Name:\tx\nState:\tS (sleeping)\nSigCgt:\t0000000000000000\n")
	st, err = readStatus(proc, 77)
	if _, ok := st.ownPID(); err != nil || ok || st.uid != -1 {
		t.Errorf("readStatus(no NSpid, no Uid) = %+v, %v; want no own PID and uid -1", st, err)
	}
}
