package trainer

import (
	"fmt"
	"io"
	"io/fs"
	"os"
	"os/user"
	"path/filepath"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"syscall"
	"time"
)

// How a Process was found: the values of Process.Via.
const (
	ViaPIDFile   = "pidfile"
	ViaUnit      = "unit"
	ViaMatch     = "match"
	ViaContainer = "container"
	ViaTree      = "tree"
)

// The reasons of a Problem. They are stable metric labels.
const (
	// ReasonPIDFileUnreadable: the pidfile is missing, unreadable, or does not hold one PID.
	ReasonPIDFileUnreadable = "pidfile_unreadable"
	// ReasonStalePIDFile: the pidfile names a process that is not running (or is a zombie, or is
	// spotguard itself or a wrapper of it, see Finder.Self); with Finder.Container, no process of
	// the container has that PID in its own PID namespace.
	ReasonStalePIDFile = "stale_pidfile"
	// ReasonPIDFileInit: the pidfile holds PID 1, which is init here (systemd), never the
	// trainer: a trainer that is PID 1 of a container wrote it, and Finder.Container is not set.
	ReasonPIDFileInit = "pidfile_init"
	// ReasonPIDFileNamespace: the pidfile's PID may be one from another PID namespace (a
	// container), so the process it names here may not be the one that wrote it, and
	// Finder.Container is not set. See Finder.PIDFile for the rule.
	ReasonPIDFileNamespace = "pidfile_namespace"
	// ReasonUnitNotFound: no cgroup of the unit exists (the unit is not running, or its name is
	// invalid).
	ReasonUnitNotFound = "unit_not_found"
	// ReasonNoMatch: no running process has a command line that matches the regular expression.
	ReasonNoMatch = "no_match"
	// ReasonNoProcess: the unit's cgroup holds no running process, the process tree of
	// Finder.Under is gone, or no method to find the trainer is configured at all.
	ReasonNoProcess = "no_process"
	// ReasonContainerNotFound: no running process is in the container of Finder.Container, or
	// its name could not be resolved to an ID.
	ReasonContainerNotFound = "container_not_found"
	// ReasonContainerAmbiguous: the ID prefix of Finder.Container matches several containers.
	ReasonContainerAmbiguous = "container_ambiguous"
	// ReasonOtherUser: a method found processes, but only of other users than Finder.User; they
	// are never signalled.
	ReasonOtherUser = "other_user"
	// ReasonDiscoveryHung: Find itself did not return in time (the agent's wait; a pidfile on a
	// file system that hangs, /proc of a process stuck in the kernel). Find never returns it: the
	// agent does, using the processes its last Find that returned found.
	ReasonDiscoveryHung = "discovery_hung"
)

// Reasons returns every Reason, in documentation order.
func Reasons() []string {
	return []string{
		ReasonPIDFileUnreadable, ReasonStalePIDFile, ReasonPIDFileInit, ReasonPIDFileNamespace,
		ReasonUnitNotFound, ReasonNoMatch, ReasonNoProcess, ReasonContainerNotFound,
		ReasonContainerAmbiguous, ReasonOtherUser, ReasonDiscoveryHung,
	}
}

// maxUnitDepth is how deep below a cgroup hierarchy's root Find looks for a unit's directory
// when it is not at system.slice/<unit>: deep enough for user services
// (user.slice/user-N.slice/user@N.service/app.slice/<unit> is 5 levels).
const maxUnitDepth = 6

// maxPIDFileSize bounds what Find reads of a pidfile: one PID needs a few bytes.
const maxPIDFileSize = 4096

// pidfileHowTo says how to find a trainer that runs in a container, for the pidfile problems.
const pidfileHowTo = "if the trainer runs in a container, set trainer.container to the container's ID or name " +
	"(the pidfile's PID is then looked up in that container's PID namespace); or run the container in the " +
	"host's PID namespace (docker run --pid=host), so that the PID the trainer writes is its PID here; " +
	"or find the trainer by trainer.match or trainer.unit instead"

// Finder finds the trainer processes by any combination of a pidfile, a systemd unit, a regular
// expression on the command line, a container and a process tree, optionally only those of one
// user. The zero value finds nothing.
type Finder struct {
	// PIDFile (trainer.pidfile), if not empty, is a file holding one PID, surrounded by white
	// space or not.
	//
	// Without Container the PID is trusted only when it can mean one process alone, the one
	// that wrote it. A PID is what getpid() returned in the writer's own PID namespace, and a
	// trainer in a container has a PID namespace of its own: its PID there names an unrelated
	// process here. The kernel tells which namespace a process is in (/proc/PID/ns/pid; NSpid
	// in /proc/PID/status lists its PID in each namespace from this one down to its own), so a
	// PID P is refused when:
	//   - P is 1 (ReasonPIDFileInit): here that is init, never the trainer; a trainer that is
	//     PID 1 of its container wrote it;
	//   - the process P here is in another PID namespace than the agent's (a container's;
	//     ReasonPIDFileNamespace): it did not write P, as its own PID is another number, so P
	//     came from elsewhere (from inside some container, or a host tool such as docker
	//     inspect; Container is the exact way to name a container's processes);
	//   - some process in another PID namespace has P as its own PID there
	//     (ReasonPIDFileNamespace): that process, in a container, may have written P, and the
	//     process P here would be an unrelated one. This holds even when the process P here
	//     is in the agent's namespace (then the PID is ambiguous), and when none is (then it
	//     is not merely stale).
	// Without NSpid (Linux before 4.1) only the first two rules apply.
	//
	// With Container, P is a PID in the container's PID namespace: the processes of the
	// container whose own PID (the last NSpid entry) is P are found. A container that shares
	// the host's PID namespace (--pid=host) has its own PIDs equal to the host's.
	PIDFile string
	// Unit (trainer.unit), if not empty, is a systemd unit: every process in its cgroup and in
	// the cgroups below it is a trainer. A name without a unit type suffix gets ".service", as
	// systemctl does.
	Unit string
	// Match (trainer.match), if not nil, is matched against the command line of every process
	// (/proc/PID/cmdline with its NUL separators turned into spaces).
	Match *regexp.Regexp
	// Container (trainer.container), if not empty, is a container: every process in it is a
	// trainer. It is a full container ID, a unique prefix of one (at least
	// MinContainerIDPrefix lowercase hex digits), or a container name, which is looked up
	// through the Docker API at DockerSocket. The processes are those whose cgroup
	// (/proc/PID/cgroup, any hierarchy: cgroup v2, v1, hybrid) has a directory named for the
	// container by Docker, containerd (nerdctl, Kubernetes), CRI-O or Podman, with the systemd
	// or the cgroupfs driver (see cgroupPrefixes).
	Container string
	// DockerSocket is the Docker API's unix socket, used to look up a Container given by name;
	// empty means DefaultDockerSocket.
	DockerSocket string
	// User (trainer.user), if not nil, is a user ID: only processes whose real user ID (the
	// first field of Uid in /proc/PID/status) is *User are returned, whatever method found
	// them. Processes of other users are left out, with a ReasonOtherUser Problem when a
	// method found only such processes.
	User *int
	// Under, if not 0, confines Find to one process tree: the process Under and its
	// descendants (followed through the PPid of every process). Every running process of that
	// tree is found (ViaTree), and what the other methods find outside it is left out.
	// spotguard drill sets it to the trainer it started.
	Under int
	// ProcRoot is where proc(5) is mounted; empty means "/proc".
	ProcRoot string
	// CgroupRoot is where cgroups are mounted; empty means "/sys/fs/cgroup". The unit is
	// looked for in the cgroup v2 hierarchy at the root, the hybrid one at "unified/" and the v1
	// systemd one at "systemd/": first at system.slice/<unit>, then anywhere up to four levels
	// deep. (Container reads the cgroup of each process in ProcRoot instead.)
	CgroupRoot string
	// Self is the PID that is never returned (spotguard's own); 0 means os.Getpid(). Its PID
	// namespace is the agent's, for the PIDFile rules.
	//
	// The wrappers of Self are never returned either: its ancestors (followed through PPid)
	// whose argument list (/proc/PID/cmdline, split at its NULs) ends with Self's own, such as
	// the timeout in "timeout 20 spotguard doctor --trainer.match X" or the sudo in "sudo
	// spotguard doctor": their command lines hold spotguard's, so trainer.match would find
	// them; so are those with an argument that holds spotguard's command line, as a shell's -c
	// does (sh -c "spotguard doctor --trainer.match X; true"). Nor is an ancestor that
	// trainer.match matches only through the arguments it passed on to Self (a script run as
	// "check.sh --trainer.match X" that runs "spotguard doctor "$@""). Other ancestors (a shell
	// script that starts both the agent and the trainer, and matches by its own words) are
	// not wrappers.
	Self int
	// Agent, if not 0, is the PID of the running spotguard agent, when Find runs in another
	// process (spotguard doctor): never returned either, as the agent never returns itself (a
	// trainer.match that matches its command line, a pidfile that holds its PID).
	Agent int
}

// Process is one trainer process.
type Process struct {
	// PID is the process's PID in the agent's PID namespace, the one to signal.
	PID int
	// Cmdline is /proc/PID/cmdline with its NUL separators turned into spaces.
	Cmdline string
	// Via is how it was found: ViaPIDFile, ViaUnit, ViaMatch, ViaContainer or ViaTree. A
	// process found by several methods has the first of them in that order.
	Via string
	// StartTicks is when the process started, in clock ticks after boot (0 if unknown): with the
	// PID, it tells the process from another that has the PID later.
	StartTicks uint64
	// Started is the same as a time, no later than the process started (to within a second);
	// zero if unknown. A process that started after something happened to a PID is not the one
	// that had the PID then.
	Started time.Time
	// PPID is its parent's PID (0 if unknown): a process whose parent is a trainer process with
	// its command line is a fork of it, such as a DataLoader's worker.
	PPID int
}

// Problem is an expected trouble met by Find, to report rather than to fail on.
type Problem struct {
	// Reason is one of the Reason constants, a stable metric label.
	Reason string
	// Detail says what exactly happened, naming the file, unit, expression, container or user
	// concerned, and for a pidfile refused by the namespace rules, what to configure instead.
	Detail string
}

// Find returns the running processes found by every configured method (PIDFile, Unit, Match,
// Container, Under), without duplicates, sorted by PID, and the problems met. Zombies, f.Self
// and its wrappers (see Finder.Self) are never returned, nor processes of other users than
// f.User, nor processes outside the tree of f.Under.
//
// Expected states are Problems, never a failure: a missing or garbled pidfile
// (ReasonPIDFileUnreadable), a pidfile naming a dead process (ReasonStalePIDFile), PID 1
// (ReasonPIDFileInit) or a PID that may be from another PID namespace
// (ReasonPIDFileNamespace), a unit without a cgroup (ReasonUnitNotFound) or with no process
// (ReasonNoProcess), a regular expression that matches nothing (ReasonNoMatch), a container
// that is not running or whose name cannot be resolved (ReasonContainerNotFound) or an ID prefix
// of several (ReasonContainerAmbiguous), a method that found only processes of other users
// (ReasonOtherUser), a tree root that is gone (ReasonNoProcess), and no method configured
// (ReasonNoProcess). Each configured method that finds nothing yields one Problem, even when
// another method found processes, so an empty process list always comes with at least one
// Problem.
func (f Finder) Find() ([]Process, []Problem) {
	s := finder{
		procRoot: orDefault(f.ProcRoot, defaultProcRoot),
		self:     f.Self,
		agent:    f.Agent,
		user:     f.User,
		found:    map[int]Process{},
		status:   map[int]procStatus{},
	}
	if s.self == 0 {
		s.self = os.Getpid()
	}
	s.wrappers = s.wrappersOf(s.self)
	if f.Under != 0 {
		s.tree = s.descendants(f.Under)
	}
	if f.PIDFile == "" && f.Unit == "" && f.Match == nil && f.Container == "" && f.Under == 0 {
		s.problem(ReasonNoProcess, "no way to find the trainer is configured: set trainer.pidfile, trainer.unit, trainer.match or trainer.container")
	}
	var cs *containerSet
	if f.Container != "" {
		c := findContainer(s.procRoot, f.DockerSocket, f.Container)
		cs = &c
	}
	if f.PIDFile != "" {
		s.byPIDFile(f.PIDFile, f.Container, cs)
	}
	if f.Unit != "" {
		s.byUnit(orDefault(f.CgroupRoot, defaultCgroupRoot), f.Unit)
	}
	if f.Match != nil {
		s.byMatch(f.Match)
	}
	if cs != nil {
		s.byContainer(f.Container, *cs)
	}
	if f.Under != 0 {
		s.byTree(f.Under)
	}
	procs := make([]Process, 0, len(s.found))
	for _, p := range s.found {
		procs = append(procs, p)
	}
	slices.SortFunc(procs, func(a, b Process) int { return a.PID - b.PID })
	return procs, s.problems
}

// finder is the state of one Find.
type finder struct {
	procRoot string
	self     int
	agent    int          // Finder.Agent
	wrappers map[int]bool // the ancestors of self that wrap its command (see Finder.Self)
	// ancestors are self's other ancestors, and ownArgs self's arguments after its name (see
	// passesOn).
	ancestors map[int]bool
	ownArgs   []string
	user      *int
	tree      map[int]bool // Finder.Under and its descendants; nil without Under
	found     map[int]Process
	problems  []Problem
	status    map[int]procStatus // read so far; a missing process is not cached
	// all is every process's status, read once on demand (scanned is true then).
	all     map[int]procStatus
	scanned bool
	boot    *time.Time // when the machine booted, read once on demand (zero if unknown)
}

func (s *finder) problem(reason, format string, args ...any) {
	s.problems = append(s.problems, Problem{Reason: reason, Detail: fmt.Sprintf(format, args...)})
}

// statusOf reads (once) the status of pid; ok is false when it does not exist.
func (s *finder) statusOf(pid int) (procStatus, bool) {
	if st, ok := s.status[pid]; ok {
		return st, true
	}
	st, err := readStatus(s.procRoot, pid)
	if err != nil {
		return procStatus{}, false
	}
	s.status[pid] = st
	return st, true
}

// processes returns the status of every process in procRoot, read once per Find.
func (s *finder) processes() map[int]procStatus {
	if s.scanned {
		return s.all
	}
	s.scanned = true
	s.all = map[int]procStatus{}
	entries, err := os.ReadDir(s.procRoot)
	if err != nil {
		return s.all
	}
	for _, e := range entries {
		pid, err := strconv.Atoi(e.Name())
		if err != nil || pid <= 0 {
			continue
		}
		if st, ok := s.statusOf(pid); ok {
			s.all[pid] = st
		}
	}
	return s.all
}

// tally counts what one method found.
type tally struct {
	added   int      // processes returned
	others  []string // processes of other users, described
	outside int      // processes outside the tree of Finder.Under
}

// consider adds pid as found via via if it is a running process other than s.self and its
// wrappers, of s.user (when set) and in s.tree (when set); t counts what became of it.
func (s *finder) consider(t *tally, pid int, via string) {
	if pid == s.self || s.wrappers[pid] || (s.agent != 0 && pid == s.agent) {
		return
	}
	st, ok := s.statusOf(pid)
	if !ok || st.state == 'Z' || st.state == 'X' {
		return
	}
	if s.tree != nil && !s.tree[pid] {
		t.outside++
		return
	}
	if s.user != nil && st.uid != *s.user {
		if len(t.others) < 5 {
			t.others = append(t.others, fmt.Sprintf("%d (%s)", pid, describeUID(st.uid)))
		} else if len(t.others) == 5 {
			t.others = append(t.others, "...")
		}
		return
	}
	if _, ok := s.found[pid]; ok {
		t.added++
		return
	}
	cmdline, ok := readCmdline(s.procRoot, pid)
	if !ok {
		return
	}
	if s.boot == nil {
		boot := readBootTime(s.procRoot)
		s.boot = &boot
	}
	ppid, ticks := readStat(s.procRoot, pid)
	s.found[pid] = Process{PID: pid, Cmdline: cmdline, Via: via, StartTicks: ticks, Started: startedAt(*s.boot, ticks), PPID: ppid}
	t.added++
}

// none reports that a method (what, e.g. "trainer.match \"x\"") found nothing: a
// ReasonOtherUser Problem when it found processes of other users only, else reason with detail,
// noting the processes left out as outside the tree.
func (s *finder) none(t tally, what, reason, format string, args ...any) {
	if len(t.others) > 0 {
		s.problem(ReasonOtherUser, "%s found only processes of other users than trainer.user (%s): %s; they are never signalled",
			what, describeUID(*s.user), strings.Join(t.others, ", "))
		return
	}
	detail := fmt.Sprintf(format, args...)
	if t.outside > 0 {
		detail += fmt.Sprintf(" (%d process(es) it found are outside the process tree this search is confined to, and left out)", t.outside)
	}
	s.problem(reason, "%s", detail)
}

// describeUID names a user ID for a message: "uid 1000 (alice)", or "uid 1000" when it has no
// name here.
func describeUID(uid int) string {
	if uid < 0 {
		return "no uid"
	}
	if u, err := user.LookupId(strconv.Itoa(uid)); err == nil {
		return fmt.Sprintf("uid %d (%s)", uid, u.Username)
	}
	return fmt.Sprintf("uid %d", uid)
}

// describe is "PID (command line)" of a process for a message.
func (s *finder) describe(pid int) string {
	cmdline, _ := readCmdline(s.procRoot, pid)
	return fmt.Sprintf("%d (%s)", pid, quoteShort([]byte(cmdline)))
}

// agentNS returns the agent's PID namespace: the target of procRoot/<self>/ns/pid ("" when it
// cannot be read) and its NSpid depth (1 when unknown).
func (s *finder) agentNS() (link string, depth int) {
	link, _ = os.Readlink(filepath.Join(s.procRoot, strconv.Itoa(s.self), "ns", "pid"))
	depth = 1
	if st, ok := s.statusOf(s.self); ok && len(st.nspid) > 0 {
		depth = len(st.nspid)
	}
	return link, depth
}

// otherNS reports whether process pid, with status st, is in another PID namespace than the
// agent: its ns/pid link differs from the agent's, or, where either link cannot be read (it
// needs the right to ptrace), its NSpid has another number of entries. Without NSpid (before
// Linux 4.1) and without the links it reports false.
func (s *finder) otherNS(pid int, st procStatus, agentLink string, agentDepth int) bool {
	if agentLink != "" {
		if link, err := os.Readlink(filepath.Join(s.procRoot, strconv.Itoa(pid), "ns", "pid")); err == nil {
			return link != agentLink
		}
	}
	return len(st.nspid) > 0 && len(st.nspid) != agentDepth
}

func (s *finder) byPIDFile(path, container string, cs *containerSet) {
	// Not blocking: a FIFO would wait for a writer for ever, and Find with it.
	fh, err := os.OpenFile(path, os.O_RDONLY|syscall.O_NONBLOCK, 0)
	if err != nil {
		s.problem(ReasonPIDFileUnreadable, "cannot read pidfile: %v", err)
		return
	}
	if fi, err := fh.Stat(); err != nil || !fi.Mode().IsRegular() {
		_ = fh.Close()
		what := "not a regular file"
		if err != nil {
			what = err.Error()
		} else if fi.Mode()&fs.ModeNamedPipe != 0 {
			what = "a named pipe (FIFO), not a regular file"
		}
		s.problem(ReasonPIDFileUnreadable, "cannot read pidfile %s: %s", path, what)
		return
	}
	data, err := io.ReadAll(io.LimitReader(fh, maxPIDFileSize+1))
	_ = fh.Close()
	if err != nil {
		s.problem(ReasonPIDFileUnreadable, "cannot read pidfile %s: %v", path, err)
		return
	}
	pid, ok := parsePID(string(data))
	if !ok || len(data) > maxPIDFileSize {
		s.problem(ReasonPIDFileUnreadable, "pidfile %s does not hold one PID: content %s", path, quoteShort(data))
		return
	}
	what := "pidfile " + path
	var t tally

	if cs != nil {
		// The PID is the trainer's own, in the container's PID namespace.
		if cs.problem != nil {
			s.problem(ReasonStalePIDFile, "pidfile %s holds PID %d, a PID in container %s, which was not found: %s", path, pid, container, cs.problem.Detail)
			return
		}
		for _, p := range cs.pids {
			if st, ok := s.statusOf(p); ok {
				if own, ok := st.ownPID(); ok && own == pid {
					s.consider(&t, p, ViaPIDFile)
				}
			}
		}
		if t.added == 0 {
			s.none(t, what, ReasonStalePIDFile, "pidfile %s holds PID %d, but no running process of container %s (%s) has that PID in its PID namespace", path, pid, container, shortID(cs.id))
		}
		return
	}

	if pid == s.self {
		s.problem(ReasonStalePIDFile, "pidfile %s holds PID %d, which is spotguard itself", path, pid)
		return
	}
	if s.agent != 0 && pid == s.agent {
		s.problem(ReasonStalePIDFile, "pidfile %s holds PID %d, which is the running spotguard agent", path, pid)
		return
	}
	if s.wrappers[pid] {
		s.problem(ReasonStalePIDFile, "pidfile %s holds PID %d, which is %s, a wrapper of spotguard itself (its command line ends with spotguard's)", path, pid, s.describe(pid))
		return
	}
	if pid == 1 {
		s.problem(ReasonPIDFileInit, "pidfile %s holds PID 1: here that is init %s, never the trainer; a trainer that is PID 1 of a container wrote it, and that PID means nothing here: %s",
			path, s.describe(1), pidfileHowTo)
		return
	}
	agentLink, agentDepth := s.agentNS()
	// Processes in another PID namespace whose own PID is pid: any of them may have written it.
	var writers []string
	for p, st := range s.processes() {
		if own, ok := st.ownPID(); ok && own == pid && p != pid && s.otherNS(p, st, agentLink, agentDepth) {
			writers = append(writers, s.describe(p))
		}
	}
	slices.Sort(writers)
	st, running := s.statusOf(pid)
	running = running && st.state != 'Z' && st.state != 'X'
	switch {
	case running && s.otherNS(pid, st, agentLink, agentDepth):
		own, _ := st.ownPID()
		s.problem(ReasonPIDFileNamespace, "pidfile %s holds PID %d: here that is process %s in another PID namespace (a container), where its own PID is %d, so it did not write this PID and may not be the trainer: %s",
			path, pid, s.describe(pid), own, pidfileHowTo)
	case len(writers) > 0 && running:
		s.problem(ReasonPIDFileNamespace, "pidfile %s holds PID %d, which is ambiguous: here it is process %s, but in another PID namespace (a container) it is the own PID of %s, which may have written it: %s",
			path, pid, s.describe(pid), strings.Join(writers, ", "), pidfileHowTo)
	case len(writers) > 0:
		s.problem(ReasonPIDFileNamespace, "pidfile %s holds PID %d, which no process has here, but in another PID namespace (a container) it is the own PID of %s: %s",
			path, pid, strings.Join(writers, ", "), pidfileHowTo)
	case !running:
		s.problem(ReasonStalePIDFile, "pidfile %s holds PID %d, which is not running", path, pid)
	default:
		s.consider(&t, pid, ViaPIDFile)
		if t.added == 0 {
			s.none(t, what, ReasonStalePIDFile, "pidfile %s holds PID %d, which is not running", path, pid)
		}
	}
}

func (s *finder) byUnit(cgroupRoot, unit string) {
	name, ok := unitName(unit)
	if !ok {
		s.problem(ReasonUnitNotFound, "invalid unit name %q", unit)
		return
	}
	dir := unitCgroup(cgroupRoot, name)
	if dir == "" {
		s.problem(ReasonUnitNotFound, "no cgroup of unit %s under %s (is the unit running?)", name, cgroupRoot)
		return
	}
	var pids []int
	// WalkDir does not follow symbolic links; cgroup directories that vanish during the walk
	// are skipped.
	_ = filepath.WalkDir(dir, func(path string, d fs.DirEntry, err error) error {
		if err != nil || !d.IsDir() {
			return nil
		}
		data, err := os.ReadFile(filepath.Join(path, "cgroup.procs"))
		if err != nil {
			return nil
		}
		for line := range strings.SplitSeq(string(data), "\n") {
			if pid, ok := parsePID(line); ok {
				pids = append(pids, pid)
			}
		}
		return nil
	})
	slices.Sort(pids)
	var t tally
	for _, pid := range slices.Compact(pids) {
		s.consider(&t, pid, ViaUnit)
	}
	if t.added == 0 {
		s.none(t, "trainer.unit "+name, ReasonNoProcess, "cgroup %s of unit %s holds no running process", dir, name)
	}
}

func (s *finder) byMatch(re *regexp.Regexp) {
	entries, err := os.ReadDir(s.procRoot)
	if err != nil {
		s.problem(ReasonNoMatch, "cannot list processes to match `%s`: %v", re, err)
		return
	}
	var t tally
	for _, e := range entries {
		pid, err := strconv.Atoi(e.Name())
		if err != nil || pid <= 0 || pid == s.self || s.wrappers[pid] || (s.agent != 0 && pid == s.agent) {
			continue
		}
		cmdline, ok := readCmdline(s.procRoot, pid)
		// Kernel threads and zombies have an empty command line.
		if !ok || cmdline == "" || !re.MatchString(cmdline) || s.passesOn(pid, re) {
			continue
		}
		s.consider(&t, pid, ViaMatch)
	}
	if t.added == 0 {
		// In backquotes, as written in the configuration: %q doubled every backslash of the
		// pattern, and a JSON log line doubled them again (found from outside).
		s.none(t, fmt.Sprintf("trainer.match `%s`", re), ReasonNoMatch, "no running process has a command line that matches `%s`", re)
	}
}

func (s *finder) byContainer(container string, cs containerSet) {
	if cs.problem != nil {
		s.problems = append(s.problems, *cs.problem)
		return
	}
	var t tally
	for _, pid := range cs.pids {
		s.consider(&t, pid, ViaContainer)
	}
	if t.added == 0 {
		s.none(t, "trainer.container "+container, ReasonContainerNotFound, "container %s (%s) holds no running process", container, shortID(cs.id))
	}
}

// wrappersOf returns the ancestors of pid (followed through PPid) whose argument list ends with
// pid's own, or has an argument that holds pid's command line: the commands that wrap pid's, such
// as timeout, sudo, strace or time, or a shell's -c (nil when there is none, or pid's argument
// list cannot be read).
func (s *finder) wrappersOf(pid int) map[int]bool {
	own, ok := readArgv(s.procRoot, pid)
	if !ok || len(own) == 0 {
		return nil
	}
	// A shell's command line that holds pid's (sh -c "spotguard doctor --trainer.match X; ..."),
	// found from outside: doctor failed on the shell that ran it.
	line := unquoted(strings.Join(own, " "))
	var wrappers map[int]bool
	s.ownArgs = own[1:]
	seen := map[int]bool{pid: true}
	st, ok := s.statusOf(pid)
	for ok && st.ppid > 0 && !seen[st.ppid] {
		parent := st.ppid
		seen[parent] = true
		if argv, ok := readArgv(s.procRoot, parent); ok && (len(argv) >= len(own) && slices.Equal(argv[len(argv)-len(own):], own) ||
			slices.ContainsFunc(argv, func(a string) bool { return strings.Contains(unquoted(a), line) })) {
			if wrappers == nil {
				wrappers = map[int]bool{}
			}
			wrappers[parent] = true
		} else {
			if s.ancestors == nil {
				s.ancestors = map[int]bool{}
			}
			s.ancestors[parent] = true
		}
		st, ok = s.statusOf(parent)
	}
	return wrappers
}

// passesOn reports whether pid, an ancestor of self, matches re only through the arguments it
// passed on to self: a script that runs "spotguard doctor "$@"", run as "check.sh
// --trainer.match train" (found from outside: doctor failed on the script that ran it). An
// ancestor that matches by its own words (a script that starts both the agent and the trainer)
// is still found.
func (s *finder) passesOn(pid int, re *regexp.Regexp) bool {
	if !s.ancestors[pid] || len(s.ownArgs) == 0 {
		return false
	}
	argv, ok := readArgv(s.procRoot, pid)
	if !ok {
		return false
	}
	kept := slices.DeleteFunc(slices.Clone(argv), func(a string) bool { return slices.Contains(s.ownArgs, a) })
	return len(kept) < len(argv) && !re.MatchString(strings.Join(kept, " "))
}

// unquoted is a shell command line without its quotes and backslashes: the words of
// sh -c "spotguard doctor --trainer.match 'train.py'", as spotguard's argument list holds them
// (found from outside: a pattern in quotes kept the shell from being taken for a wrapper).
func unquoted(line string) string {
	return strings.NewReplacer(`'`, "", `"`, "", `\`, "").Replace(line)
}

// descendants returns root and every process below it, following the PPid of every process.
func (s *finder) descendants(root int) map[int]bool {
	children := map[int][]int{}
	for pid, st := range s.processes() {
		children[st.ppid] = append(children[st.ppid], pid)
	}
	tree := map[int]bool{root: true}
	queue := []int{root}
	for len(queue) > 0 {
		pid := queue[0]
		queue = queue[1:]
		for _, c := range children[pid] {
			if !tree[c] {
				tree[c] = true
				queue = append(queue, c)
			}
		}
	}
	return tree
}

func (s *finder) byTree(root int) {
	pids := make([]int, 0, len(s.tree))
	for pid := range s.tree {
		pids = append(pids, pid)
	}
	slices.Sort(pids)
	var t tally
	for _, pid := range pids {
		s.consider(&t, pid, ViaTree)
	}
	if t.added == 0 {
		s.none(t, fmt.Sprintf("the process tree of PID %d", root), ReasonNoProcess, "process %d and its descendants are not running", root)
	}
}

// hasUnitType reports whether name ends in the suffix of a systemd unit type.
func hasUnitType(name string) bool {
	switch filepath.Ext(name) {
	case ".service", ".socket", ".device", ".mount", ".automount", ".swap", ".target",
		".path", ".timer", ".slice", ".scope":
		return true
	}
	return false
}

// unitName returns unit as the name of its cgroup directory: ".service" appended when it has
// no unit type suffix. ok is false for a name that could escape the cgroup tree.
func unitName(unit string) (name string, ok bool) {
	name = strings.TrimSpace(unit)
	if name == "" || name == "." || name == ".." || strings.ContainsAny(name, "/\x00") {
		return "", false
	}
	if !hasUnitType(name) {
		name += ".service"
	}
	return name, true
}

// unitCgroup returns the cgroup directory of the unit named name under cgroupRoot, or "" when
// there is none. It looks in the v2 (root), hybrid ("unified") and v1 ("systemd") hierarchies,
// first at system.slice/<name>, then breadth-first down to maxUnitDepth levels.
func unitCgroup(cgroupRoot, name string) string {
	bases := []string{
		cgroupRoot,
		filepath.Join(cgroupRoot, "unified"),
		filepath.Join(cgroupRoot, "systemd"),
	}
	for _, base := range bases {
		if dir := filepath.Join(base, "system.slice", name); isDir(dir) {
			return dir
		}
	}
	for _, base := range bases {
		// Walk only cgroup hierarchies: with cgroup v1 the root is a tmpfs that holds one
		// hierarchy per controller, which are not where systemd keeps every unit.
		if _, err := os.Lstat(filepath.Join(base, "cgroup.procs")); err != nil {
			continue
		}
		if dir := findDir(base, name, maxUnitDepth); dir != "" {
			return dir
		}
	}
	return ""
}

// findDir returns the shallowest directory named name below root, at most depth levels down
// (the first in lexical order at that level), or "" when there is none. Symbolic links are not
// followed.
func findDir(root, name string, depth int) string {
	level := []string{root}
	for range depth {
		var next []string
		for _, dir := range level {
			entries, err := os.ReadDir(dir)
			if err != nil {
				continue
			}
			for _, e := range entries {
				if !e.IsDir() {
					continue
				}
				path := filepath.Join(dir, e.Name())
				if e.Name() == name {
					return path
				}
				next = append(next, path)
			}
		}
		level = next
	}
	return ""
}

// isDir reports whether path is a directory, not following a final symbolic link.
func isDir(path string) bool {
	fi, err := os.Lstat(path)
	return err == nil && fi.IsDir()
}

// quoteShort quotes data for a message, cut to 64 bytes.
func quoteShort(data []byte) string {
	const max = 64
	if len(data) > max {
		return strconv.Quote(string(data[:max])) + "..."
	}
	return strconv.Quote(string(data))
}
