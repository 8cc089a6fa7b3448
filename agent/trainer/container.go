package trainer

import (
	"bufio"
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"maps"
	"net"
	"net/http"
	"net/url"
	"os"
	"path/filepath"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"sync"
	"time"
)

// DefaultDockerSocket is where Find asks Docker for the ID of a container given by name.
const DefaultDockerSocket = "/var/run/docker.sock"

// MinContainerIDPrefix is the shortest container ID prefix Find accepts as an ID (Docker's short
// IDs are 12 characters). A shorter string is taken for a container name.
const MinContainerIDPrefix = 12

// containerIDLen is the length of a full container ID: 64 hex digits (a SHA-256) for Docker,
// containerd, CRI-O and Podman alike.
const containerIDLen = 64

// dockerAPITimeout bounds the first lookup of a name through the Docker API.
const dockerAPITimeout = 2 * time.Second

// dockerAPIRecheckTimeout bounds a later lookup of a name: Find also runs on a notice, and a
// Docker daemon that is slow or gone must not hold the signal back, so past this (or when the
// API cannot be reached) the ID the name last resolved to is used.
const dockerAPIRecheckTimeout = 250 * time.Millisecond

// resolvedNames is the ID each container name last resolved to, by socket and name
// (socket + "\x00" + name).
var resolvedNames sync.Map

// containerName is a container name as Docker and nerdctl accept it (an optional leading slash
// is Docker's own way of writing names).
var containerName = regexp.MustCompile(`^/?[a-zA-Z0-9][a-zA-Z0-9_.-]+$`)

// cgroupPrefixes are the prefixes the container runtimes put before a container's ID in the name
// of its cgroup: with the systemd cgroup driver the cgroup is "<prefix>-<id>.scope"
// (docker-<id>.scope, cri-containerd-<id>.scope, crio-<id>.scope, libpod-<id>.scope,
// nerdctl-<id>.scope); with the cgroupfs driver CRI-O and Podman use "crio-<id>" and
// "libpod-<id>", and Docker and containerd use the bare ID (/docker/<id>,
// /<containerd namespace>/<id>, /kubepods/<qos>/pod<uid>/<id>). The monitors' own cgroups
// (crio-conmon-<id>, libpod-conmon-<id>) do not match: what follows the prefix must be an ID.
var cgroupPrefixes = []string{"", "docker-", "cri-containerd-", "crio-", "libpod-", "nerdctl-"}

// isContainerID reports whether s is a container ID or an ID prefix Find accepts: 12 to 64
// lowercase hex digits.
func isContainerID(s string) bool {
	if len(s) < MinContainerIDPrefix || len(s) > containerIDLen {
		return false
	}
	for _, c := range []byte(s) {
		if (c < '0' || c > '9') && (c < 'a' || c > 'f') {
			return false
		}
	}
	return true
}

// ValidContainer checks a trainer.container value: a container ID, a prefix of one of at least
// MinContainerIDPrefix lowercase hex digits, or a container name (letters, digits, '_', '.',
// '-'; at least 2 characters). Empty is valid (no container). It says nothing of whether the
// container exists.
func ValidContainer(ref string) error {
	switch {
	case ref == "" || isContainerID(ref):
		return nil
	case len(ref) > containerIDLen && strings.Trim(ref, "0123456789abcdef") == "":
		return fmt.Errorf("longer than a container ID (%d hex digits)", containerIDLen)
	case !containerName.MatchString(ref):
		return errors.New("want a container ID (at least 12 hex digits) or a container name")
	}
	return nil
}

// cgroupContainerIDs returns the container IDs named in a /proc/PID/cgroup file: every path
// component, in every hierarchy (v2 "0::/path" and v1 "N:controllers:/path" lines alike), that
// is a full ID with one of cgroupPrefixes before it and an optional ".scope" after it. A process
// in a nested container (Docker in Docker) is in both containers.
func cgroupContainerIDs(data []byte) []string {
	var ids []string
	sc := bufio.NewScanner(bytes.NewReader(data))
	for sc.Scan() {
		// hierarchy-ID:controller-list:cgroup-path; the path may hold colons.
		_, rest, ok := strings.Cut(sc.Text(), ":")
		if !ok {
			continue
		}
		_, path, ok := strings.Cut(rest, ":")
		if !ok {
			continue
		}
		for comp := range strings.SplitSeq(path, "/") {
			if id, ok := containerIDOf(comp); ok && !slices.Contains(ids, id) {
				ids = append(ids, id)
			}
		}
	}
	return ids
}

// containerIDOf returns the container ID a cgroup directory name stands for, if it is one of the
// shapes described at cgroupPrefixes.
func containerIDOf(comp string) (string, bool) {
	comp = strings.TrimSuffix(comp, ".scope")
	for _, p := range cgroupPrefixes {
		if id, ok := strings.CutPrefix(comp, p); ok && len(id) == containerIDLen && isContainerID(id) {
			return id, true
		}
	}
	return "", false
}

// containerSet is what Find found of trainer.container: the processes in the container, or the
// problem that kept it from finding them.
type containerSet struct {
	id      string // the full container ID; "" when not found
	pids    []int  // every process in the container, sorted
	problem *Problem
}

// findContainer finds the processes of the container ref (see Finder.Container): a name is
// resolved to an ID through the Docker API at socket first; then every process whose cgroup
// (procRoot/PID/cgroup) names a container whose ID starts with the ID is in it.
func findContainer(procRoot, socket, ref string) containerSet {
	ref = strings.TrimPrefix(ref, "/")
	id := ref
	if !isContainerID(ref) {
		key := orDefault(socket, DefaultDockerSocket) + "\x00" + ref
		timeout := dockerAPITimeout
		last, known := resolvedNames.Load(key)
		if known {
			timeout = dockerAPIRecheckTimeout
		}
		resolved, prob, unreachable := resolveContainerName(socket, ref, timeout)
		switch {
		case prob == nil:
			resolvedNames.Store(key, resolved)
			id = resolved
		case known && unreachable:
			// Docker did not answer (in time): its last answer stands. A container that has
			// gone since has no process, which the cgroups below show.
			id = last.(string)
		default:
			resolvedNames.Delete(key)
			return containerSet{problem: prob}
		}
	}
	entries, err := os.ReadDir(procRoot)
	if err != nil {
		return containerSet{problem: &Problem{ReasonContainerNotFound, fmt.Sprintf("cannot list processes to find container %s: %v", ref, err)}}
	}
	byID := map[string][]int{}
	for _, e := range entries {
		pid, err := strconv.Atoi(e.Name())
		if err != nil || pid <= 0 {
			continue
		}
		data, err := os.ReadFile(filepath.Join(procRoot, e.Name(), "cgroup"))
		if err != nil {
			continue // exited, or not a process
		}
		for _, cid := range cgroupContainerIDs(data) {
			if strings.HasPrefix(cid, id) {
				byID[cid] = append(byID[cid], pid)
			}
		}
	}
	switch len(byID) {
	case 0:
		what := "whose ID starts with " + id
		if id != ref {
			what = fmt.Sprintf("%s (ID %s, from the Docker API)", ref, shortID(id))
		}
		return containerSet{problem: &Problem{ReasonContainerNotFound, fmt.Sprintf(
			"no process runs in a container %s: no cgroup in %s/*/cgroup names it "+
				"(docker-<id>.scope, /docker/<id>, cri-containerd-<id>.scope, crio-<id>.scope, nerdctl-<id>.scope, /<namespace>/<id>, ...); is the container running?",
			what, procRoot)}}
	case 1:
		for cid, pids := range byID {
			slices.Sort(pids)
			return containerSet{id: cid, pids: pids}
		}
	}
	full := slices.Sorted(maps.Keys(byID))
	ids := make([]string, 0, len(full))
	for _, cid := range full {
		ids = append(ids, distinctID(cid, full))
	}
	return containerSet{problem: &Problem{ReasonContainerAmbiguous, fmt.Sprintf(
		"container ID prefix %s matches %d running containers (%s): set trainer.container to a longer prefix or the full ID",
		id, len(ids), strings.Join(ids, ", "))}}
}

// distinctID is id as short as tells it from every other of ids, and no shorter than shortID's:
// the IDs a prefix matches share it, and their 12-digit forms alone may be one string (found from
// outside: "matches 2 running containers (cccc37cccccc, cccc37cccccc)").
func distinctID(id string, ids []string) string {
	n := MinContainerIDPrefix
	for _, o := range ids {
		if o == id {
			continue
		}
		common := 0
		for common < len(id) && common < len(o) && id[common] == o[common] {
			common++
		}
		n = max(n, common+1)
	}
	return id[:min(n, len(id))]
}

// shortID is the 12-digit form of a container ID, as docker ps shows it.
func shortID(id string) string {
	if len(id) > MinContainerIDPrefix {
		return id[:MinContainerIDPrefix]
	}
	return id
}

// resolveContainerName asks the Docker API on the unix socket for the ID of the container named
// name (GET /containers/<name>/json), within timeout. It returns a Problem
// (ReasonContainerNotFound) when there is no socket, the API cannot be reached or answers
// otherwise than with a running container's ID; unreachable is true when it gave no answer at
// all (no connection, or none in time).
func resolveContainerName(socket, name string, timeout time.Duration) (id string, prob *Problem, unreachable bool) {
	socket = orDefault(socket, DefaultDockerSocket)
	useID := fmt.Sprintf("set trainer.container to the container's ID instead (docker inspect -f '{{.Id}}' %s; at least %d hex digits)", name, MinContainerIDPrefix)
	if fi, err := os.Stat(socket); err != nil || fi.Mode().Type() != os.ModeSocket {
		return "", &Problem{ReasonContainerNotFound, fmt.Sprintf(
			"trainer.container %q is not a container ID (%d to %d lowercase hex digits), and no Docker API socket is at %s to look the name up: %s",
			name, MinContainerIDPrefix, containerIDLen, socket, useID)}, true
	}
	ctx, cancel := context.WithTimeout(context.Background(), timeout)
	defer cancel()
	tr := &http.Transport{
		DialContext: func(ctx context.Context, _, _ string) (net.Conn, error) {
			var d net.Dialer
			return d.DialContext(ctx, "unix", socket)
		},
		DisableKeepAlives: true,
	}
	defer tr.CloseIdleConnections()
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, "http://docker/containers/"+url.PathEscape(name)+"/json", nil)
	if err != nil {
		return "", &Problem{ReasonContainerNotFound, fmt.Sprintf("container name %q: %v", name, err)}, false
	}
	resp, err := (&http.Client{Transport: tr}).Do(req)
	if err != nil {
		return "", &Problem{ReasonContainerNotFound, fmt.Sprintf("cannot look up container %q through the Docker API at %s: %v; %s", name, socket, err, useID)}, true
	}
	defer resp.Body.Close()
	body, err := io.ReadAll(io.LimitReader(resp.Body, 1<<20))
	if err != nil {
		return "", &Problem{ReasonContainerNotFound, fmt.Sprintf("cannot look up container %q through the Docker API at %s: %v; %s", name, socket, err, useID)}, true
	}
	if resp.StatusCode == http.StatusNotFound {
		return "", &Problem{ReasonContainerNotFound, fmt.Sprintf("the Docker API at %s knows no container %q", socket, name)}, false
	}
	if resp.StatusCode != http.StatusOK {
		return "", &Problem{ReasonContainerNotFound, fmt.Sprintf("the Docker API at %s answered %s for container %q: %s; %s", socket, resp.Status, name, quoteShort(body), useID)}, false
	}
	var c struct {
		ID    string `json:"Id"`
		State struct {
			Running bool
		}
	}
	if err := json.Unmarshal(body, &c); err != nil || len(c.ID) != containerIDLen || !isContainerID(c.ID) {
		return "", &Problem{ReasonContainerNotFound, fmt.Sprintf("the Docker API at %s answered no container ID for %q: %s", socket, name, quoteShort(body))}, false
	}
	if !c.State.Running {
		return "", &Problem{ReasonContainerNotFound, fmt.Sprintf("container %q (%s) is not running", name, shortID(c.ID))}, false
	}
	return c.ID, nil, false
}
