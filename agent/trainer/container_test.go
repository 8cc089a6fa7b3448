//go:build linux

package trainer

import (
	"encoding/json"
	"net"
	"net/http"
	"net/http/httptest"
	"path/filepath"
	"slices"
	"strings"
	"sync/atomic"
	"testing"
)

// The cgroup of a container's process, as /proc/PID/cgroup shows it on the host, for each runtime,
// cgroup driver and hierarchy. The shapes are those of runc's systemd driver ("slice:prefix:name"
// becomes <prefix>-<name>.scope: Docker "system.slice:docker:<id>", containerd's CRI plugin
// "kubepods-...slice:cri-containerd:<id>", CRI-O "crio", nerdctl "system.slice:nerdctl:<id>",
// Podman "libpod") and of the cgroupfs driver (Docker /docker/<id>, containerd's default
// /<namespace>/<id>, the kubelet's /kubepods/<qos>/pod<uid>/<id>, CRI-O crio-<id>, Podman
// /libpod_parent/libpod-<id>).
func TestCgroupContainerIDs(t *testing.T) {
	t.Parallel()
	const id = ctrID
	tests := []struct {
		name, cgroup string
		want         []string
	}{
		{"docker, systemd driver, cgroup v2", "0::/system.slice/docker-" + id + ".scope\n", []string{id}},
		{"docker, systemd driver, cgroup v1", "12:pids:/system.slice/docker-" + id + ".scope\n11:memory:/system.slice/docker-" + id + ".scope\n1:name=systemd:/system.slice/docker-" + id + ".scope\n", []string{id}},
		{"docker, systemd driver, hybrid", "1:name=systemd:/system.slice/docker-" + id + ".scope\n0::/system.slice/docker-" + id + ".scope\n", []string{id}},
		{"docker, cgroupfs driver, cgroup v1", "12:pids:/docker/" + id + "\n4:memory:/docker/" + id + "\n1:name=systemd:/docker/" + id + "\n", []string{id}},
		{"docker, cgroupfs driver, cgroup v2", "0::/docker/" + id + "\n", []string{id}},
		{"docker rootless, systemd driver", "0::/user.slice/user-1000.slice/user@1000.service/user.slice/docker-" + id + ".scope\n", []string{id}},
		{"docker, a sub-cgroup inside the container", "0::/system.slice/docker-" + id + ".scope/init.scope\n", []string{id}},
		{"containerd CRI, systemd driver", "0::/kubepods.slice/kubepods-burstable.slice/kubepods-burstable-pod0f1e2d3c_4b5a_6978_8796_a5b4c3d2e1f0.slice/cri-containerd-" + id + ".scope\n", []string{id}},
		{"containerd CRI, cgroupfs driver, cgroup v1", "9:cpu,cpuacct:/kubepods/burstable/pod0f1e2d3c-4b5a-6978-8796-a5b4c3d2e1f0/" + id + "\n1:name=systemd:/kubepods/burstable/pod0f1e2d3c-4b5a-6978-8796-a5b4c3d2e1f0/" + id + "\n", []string{id}},
		{"containerd (ctr, nerdctl), cgroupfs driver", "0::/default/" + id + "\n", []string{id}},
		{"nerdctl, systemd driver", "0::/system.slice/nerdctl-" + id + ".scope\n", []string{id}},
		{"nerdctl, systemd driver, cgroup v1", "1:name=systemd:/system.slice/nerdctl-" + id + ".scope\n", []string{id}},
		{"CRI-O, systemd driver", "0::/kubepods.slice/kubepods-besteffort.slice/kubepods-besteffort-pod1234.slice/crio-" + id + ".scope\n", []string{id}},
		{"CRI-O, cgroupfs driver", "0::/kubepods/besteffort/pod1234/crio-" + id + "\n", []string{id}},
		{"CRI-O's conmon is not the container", "0::/kubepods.slice/crio-conmon-" + id + ".scope\n", nil},
		{"podman, systemd driver", "0::/machine.slice/libpod-" + id + ".scope/container\n", []string{id}},
		{"podman's conmon is not the container", "0::/machine.slice/libpod-conmon-" + id + ".scope\n", nil},
		{"podman, cgroupfs driver", "0::/libpod_parent/libpod-" + id + "\n", []string{id}},
		{"docker in docker", "0::/docker/" + otherID + "/docker/" + id + "\n", []string{otherID, id}},
		{"a host process", "0::/system.slice/ssh.service\n", nil},
		{"the docker daemon", "0::/system.slice/docker.service\n", nil},
		{"a short ID is no ID", "0::/docker/" + id[:12] + "\n", nil},
		{"uppercase is no ID", "0::/docker/" + strings.ToUpper(id) + "\n", nil},
		{"an unknown prefix", "0::/system.slice/runner-" + id + ".scope\n", nil},
		{"garbage", "no colons here\n0:\n", nil},
	}
	for _, tt := range tests {
		if got := cgroupContainerIDs([]byte(tt.cgroup)); !slices.Equal(got, tt.want) {
			t.Errorf("Got(%q) = %v; want %v", tt.name, got, tt.want)
		}
	}
}

func TestValidContainer(t *testing.T) {
	t.Parallel()
	for _, ok := range []string{"", ctrID, ctrID[:12], ctrID[:40], "trainer", "my_trainer.1-a", "/trainer", "abc123", "Trainer"} {
		if err := ValidContainer(ok); err != nil {
			t.Errorf("ValidContainer(%q) = %v; want nil", ok, err)
		}
	}
	for _, bad := range []string{ctrID + "0", "a", "-x", "my trainer", "a/b", "x:y", "../x"} {
		if err := ValidContainer(bad); err == nil {
			t.Errorf("ValidContainer(%q) = nil; want an error", bad)
		}
	}
}

// containerTree has the containers ctrID (two processes), ctrA and ctrB (whose IDs share 12
// digits), each in a cgroup of another runtime's shape.
func containerTree(t *testing.T) string {
	return fakeTree(t,
		fakeProc{pid: 1, cmdline: "/sbin/init"},
		fakeProc{pid: 4321, cmdline: "python3 train.py --on-host", ppid: 1},
		fakeProc{pid: 5000, cmdline: "/sbin/docker-init -- python3 train.py", nspid: []int{5000, 1}, ns: ctrNS, cgroup: "1:name=systemd:/docker/" + ctrID + "\n"},
		fakeProc{pid: 5001, cmdline: "python3 train.py --in-container", ppid: 5000, nspid: []int{5001, 7}, ns: ctrNS, cgroup: "1:name=systemd:/docker/" + ctrID + "\n"},
		fakeProc{pid: 5002, cmdline: "python3 zombie", ppid: 5000, nspid: []int{5002, 8}, ns: ctrNS, state: "Z (zombie)", cgroup: "1:name=systemd:/docker/" + ctrID + "\n"},
		fakeProc{pid: 6000, cmdline: "python3 a.py", nspid: []int{6000, 1}, ns: otherNS, cgroup: "0::/kubepods.slice/cri-containerd-" + ctrA + ".scope\n"},
		fakeProc{pid: 6100, cmdline: "python3 b.py", nspid: []int{6100, 1}, ns: "pid:[4026532300]", cgroup: "0::/system.slice/crio-" + ctrB + ".scope\n"},
	)
}

// containerCase is one trainer.container value, what Find must find, and the problem it must
// report (reason, and a part of the detail), if any.
type containerCase struct {
	container string
	want      map[int]string
	reason    string
	detail    string
}

// check runs Find for c on the fake proc tree with the Docker API at sock, and returns the
// problems.
func (c containerCase) check(t *testing.T, proc, sock string) []Problem {
	t.Helper()
	f := Finder{Container: c.container, ProcRoot: proc, Self: fakeAgent, DockerSocket: sock}
	var want []string
	if c.reason != "" {
		want = []string{c.reason}
	}
	problems := checkFind(t, f, c.want, want...)
	if c.detail != "" && (len(problems) != 1 || !strings.Contains(problems[0].Detail, c.detail)) {
		t.Errorf("Find(container %q) problems %v; want the detail to contain %q", c.container, problems, c.detail)
	}
	return problems
}

func TestFindContainerByID(t *testing.T) {
	t.Parallel()
	proc := containerTree(t)
	noSocket := filepath.Join(t.TempDir(), "docker.sock")
	tests := []containerCase{
		{ctrID, map[int]string{5000: ViaContainer, 5001: ViaContainer}, "", ""},
		{ctrID[:12], map[int]string{5000: ViaContainer, 5001: ViaContainer}, "", ""},
		{ctrA, map[int]string{6000: ViaContainer}, "", ""},
		{ctrA[:13], map[int]string{6000: ViaContainer}, "", ""},
		{ctrB[:13], map[int]string{6100: ViaContainer}, "", ""},
		{ctrA[:12], nil, ReasonContainerAmbiguous, "matches 2 running containers (" + ctrA[:13] + ", " + ctrB[:13] + ")"},
		{otherID[:12], nil, ReasonContainerNotFound, "whose ID starts with " + otherID[:12]},
		{ctrID[:11], nil, ReasonContainerNotFound, "is not a container ID"},
		{"trainer", nil, ReasonContainerNotFound, "no Docker API socket is at " + noSocket},
	}
	for _, tt := range tests {
		problems := tt.check(t, proc, noSocket)
		if tt.reason == ReasonContainerNotFound && strings.Contains(tt.detail, "not a container ID") && !strings.Contains(problems[0].Detail, "set trainer.container to the container's ID") {
			t.Errorf("Find(container %q) detail %q; want it to say to use the ID", tt.container, problems[0].Detail)
		}
	}
	// Every process of the container is found by the container, even one the pidfile names.
	pidfile := filepath.Join(t.TempDir(), "pid")
	writeFile(t, pidfile, "7\n")
	checkFind(t, Finder{PIDFile: pidfile, Container: ctrID[:12], ProcRoot: proc, Self: fakeAgent},
		map[int]string{5000: ViaContainer, 5001: ViaPIDFile})
}

// fakeDocker serves the Docker API's GET /containers/<name>/json on a unix socket in a temp dir,
// from containers (name → the JSON answer; absent: 404), and returns the socket's path.
func fakeDocker(t *testing.T, containers map[string]string) string {
	t.Helper()
	sock := filepath.Join(t.TempDir(), "docker.sock")
	ln, err := net.Listen("unix", sock)
	if err != nil {
		t.Fatal(err)
	}
	srv := httptest.NewUnstartedServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		name, ok := strings.CutPrefix(r.URL.Path, "/containers/")
		name, ok2 := strings.CutSuffix(name, "/json")
		body, known := containers[name]
		switch {
		case r.Method != http.MethodGet || !ok || !ok2:
			http.Error(w, `{"message":"page not found"}`, http.StatusNotFound)
		case !known:
			http.Error(w, `{"message":"No such container: `+name+`"}`, http.StatusNotFound)
		case body == "500":
			http.Error(w, `{"message":"server error"}`, http.StatusInternalServerError)
		default:
			w.Header().Set("Content-Type", "application/json")
			w.Write([]byte(body))
		}
	}))
	srv.Listener.Close()
	srv.Listener = ln
	srv.Start()
	t.Cleanup(srv.Close)
	return sock
}

func inspect(id string, running bool) string {
	b, _ := json.Marshal(map[string]any{"Id": id, "Name": "/x", "State": map[string]any{"Running": running, "Pid": 5000}})
	return string(b)
}

func TestFindContainerByName(t *testing.T) {
	t.Parallel()
	proc := containerTree(t)
	sock := fakeDocker(t, map[string]string{
		"trainer": inspect(ctrID, true),
		"abc123":  inspect(ctrA, true), // a short hex string is a name
		"stopped": inspect(ctrID, false),
		"gone":    inspect(otherID, true),
		"broken":  "500",
		"garbage": `{"Id": "not-an-id"}`,
	})
	tests := []containerCase{
		{"trainer", map[int]string{5000: ViaContainer, 5001: ViaContainer}, "", ""},
		{"/trainer", map[int]string{5000: ViaContainer, 5001: ViaContainer}, "", ""},
		{"abc123", map[int]string{6000: ViaContainer}, "", ""},
		{"nosuch", nil, ReasonContainerNotFound, `knows no container "nosuch"`},
		{"stopped", nil, ReasonContainerNotFound, `"stopped" (` + ctrID[:12] + ") is not running"},
		{"gone", nil, ReasonContainerNotFound, "gone (ID " + otherID[:12] + ", from the Docker API)"},
		{"broken", nil, ReasonContainerNotFound, "500 Internal Server Error"},
		{"garbage", nil, ReasonContainerNotFound, "answered no container ID"},
	}
	for _, tt := range tests {
		tt.check(t, proc, sock)
	}
	// A socket that is not there, or not a socket, is no way to resolve a name.
	for _, s := range []string{filepath.Join(t.TempDir(), "none.sock"), proc} {
		problems := checkFind(t, Finder{Container: "trainer", ProcRoot: proc, Self: fakeAgent, DockerSocket: s}, nil, ReasonContainerNotFound)
		if len(problems) == 1 && !strings.Contains(problems[0].Detail, "no Docker API socket is at "+s) {
			t.Errorf("Find(container name, socket %s) detail %q; want it to say there is no socket", s, problems[0].Detail)
		}
	}
}

// A name resolved once keeps working on a notice when Docker stops answering (its last answer
// stands, after at most dockerAPIRecheckTimeout), but a definite answer (no such container)
// ends it.
func TestFindContainerNameWhenDockerStopsAnswering(t *testing.T) {
	t.Parallel()
	proc := containerTree(t)
	sock := filepath.Join(t.TempDir(), "docker.sock")
	ln, err := net.Listen("unix", sock)
	if err != nil {
		t.Fatal(err)
	}
	var mode atomic.Value // "ok", "hang" or "gone"
	mode.Store("ok")
	release := make(chan struct{})
	srv := httptest.NewUnstartedServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		switch mode.Load() {
		case "hang":
			select {
			case <-release:
			case <-r.Context().Done():
			}
		case "gone":
			http.Error(w, `{"message":"No such container: trainer"}`, http.StatusNotFound)
		default:
			w.Write([]byte(inspect(ctrID, true)))
		}
	}))
	srv.Listener.Close()
	srv.Listener = ln
	srv.Start()
	t.Cleanup(srv.Close)
	t.Cleanup(func() { close(release) }) // before srv.Close: it waits for the handlers

	want := map[int]string{5000: ViaContainer, 5001: ViaContainer}
	f := Finder{Container: "trainer", ProcRoot: proc, Self: fakeAgent, DockerSocket: sock}
	checkFind(t, f, want)
	mode.Store("hang")
	checkFind(t, f, want)
	mode.Store("gone")
	checkFind(t, f, nil, ReasonContainerNotFound)
	if _, ok := resolvedNames.Load(sock + "\x00trainer"); ok {
		t.Error("after Docker said there is no such container, its last ID is still remembered")
	}
}
