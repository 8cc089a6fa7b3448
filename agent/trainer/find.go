package trainer

import (
	"fmt"
	"io"
	"io/fs"
	"os"
	"path/filepath"
	"regexp"
	"slices"
	"strconv"
	"strings"
)

// How a Process was found: the values of Process.Via.
const (
	ViaPIDFile = "pidfile"
	ViaUnit    = "unit"
	ViaMatch   = "match"
)

// The reasons of a Problem. They are stable metric labels.
const (
	// ReasonPIDFileUnreadable: the pidfile is missing, unreadable, or does not hold one PID.
	ReasonPIDFileUnreadable = "pidfile_unreadable"
	// ReasonStalePIDFile: the pidfile names a process that is not running (or is a zombie, or is
	// spotguard itself).
	ReasonStalePIDFile = "stale_pidfile"
	// ReasonUnitNotFound: no cgroup of the unit exists (the unit is not running, or its name is
	// invalid).
	ReasonUnitNotFound = "unit_not_found"
	// ReasonNoMatch: no running process has a command line that matches the regular expression.
	ReasonNoMatch = "no_match"
	// ReasonNoProcess: the unit's cgroup holds no running process, or no method to find the
	// trainer is configured at all.
	ReasonNoProcess = "no_process"
)

// maxUnitDepth is how deep below a cgroup hierarchy's root Find looks for a unit's directory
// when it is not at system.slice/<unit>: deep enough for user services
// (user.slice/user-N.slice/user@N.service/app.slice/<unit> is 5 levels).
const maxUnitDepth = 6

// maxPIDFileSize bounds what Find reads of a pidfile: one PID needs a few bytes.
const maxPIDFileSize = 4096

// Finder finds the trainer processes by any combination of a pidfile, a systemd unit and a
// regular expression on the command line. The zero value finds nothing.
type Finder struct {
	// PIDFile (trainer.pidfile), if not empty, is a file holding one PID, surrounded by white
	// space or not.
	PIDFile string
	// Unit (trainer.unit), if not empty, is a systemd unit: every process in its cgroup and in
	// the cgroups below it is a trainer. A name without a unit type suffix gets ".service", as
	// systemctl does.
	Unit string
	// Match (trainer.match), if not nil, is matched against the command line of every process
	// (/proc/PID/cmdline with its NUL separators turned into spaces).
	Match *regexp.Regexp
	// ProcRoot is where proc(5) is mounted; empty means "/proc".
	ProcRoot string
	// CgroupRoot is where cgroups are mounted; empty means "/sys/fs/cgroup". The unit is
	// looked for in the cgroup v2 hierarchy at the root, the hybrid one at "unified/" and the v1
	// systemd one at "systemd/": first at system.slice/<unit>, then anywhere up to four levels
	// deep.
	CgroupRoot string
	// Self is the PID that is never returned (spotguard's own); 0 means os.Getpid().
	Self int
}

// Process is one trainer process.
type Process struct {
	PID int
	// Cmdline is /proc/PID/cmdline with its NUL separators turned into spaces.
	Cmdline string
	// Via is how it was found: ViaPIDFile, ViaUnit or ViaMatch. A process found by several
	// methods has the first of them in that order.
	Via string
}

// Problem is an expected trouble met by Find, to report rather than to fail on.
type Problem struct {
	// Reason is one of the Reason constants, a stable metric label.
	Reason string
	// Detail says what exactly happened, naming the file, unit or expression concerned.
	Detail string
}

// Find returns the running processes found by every configured method (PIDFile, Unit, Match),
// without duplicates, sorted by PID, and the problems met. Zombies and f.Self are never
// returned.
//
// Expected states are Problems, never a failure: a missing or garbled pidfile
// (ReasonPIDFileUnreadable), a pidfile naming a dead process (ReasonStalePIDFile), a unit
// without a cgroup (ReasonUnitNotFound) or with no process (ReasonNoProcess), a regular
// expression that matches nothing (ReasonNoMatch), and no method configured (ReasonNoProcess).
// Each configured method that finds nothing yields one Problem, even when another method found
// processes, so an empty process list always comes with at least one Problem.
func (f Finder) Find() ([]Process, []Problem) {
	s := finder{
		procRoot: orDefault(f.ProcRoot, defaultProcRoot),
		self:     f.Self,
		found:    map[int]Process{},
	}
	if s.self == 0 {
		s.self = os.Getpid()
	}
	if f.PIDFile == "" && f.Unit == "" && f.Match == nil {
		s.problem(ReasonNoProcess, "no way to find the trainer is configured: set trainer.pidfile, trainer.unit or trainer.match")
	}
	if f.PIDFile != "" {
		s.byPIDFile(f.PIDFile)
	}
	if f.Unit != "" {
		s.byUnit(orDefault(f.CgroupRoot, defaultCgroupRoot), f.Unit)
	}
	if f.Match != nil {
		s.byMatch(f.Match)
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
	found    map[int]Process
	problems []Problem
}

func (s *finder) problem(reason, format string, args ...any) {
	s.problems = append(s.problems, Problem{Reason: reason, Detail: fmt.Sprintf(format, args...)})
}

// add records pid as found via via and reports whether it is a running process other than
// s.self (already found or not).
func (s *finder) add(pid int, via string) bool {
	if pid == s.self {
		return false
	}
	if _, ok := s.found[pid]; ok {
		return true
	}
	if !running(s.procRoot, pid) {
		return false
	}
	cmdline, ok := readCmdline(s.procRoot, pid)
	if !ok {
		return false
	}
	s.found[pid] = Process{PID: pid, Cmdline: cmdline, Via: via}
	return true
}

func (s *finder) byPIDFile(path string) {
	fh, err := os.Open(path)
	if err != nil {
		s.problem(ReasonPIDFileUnreadable, "cannot read pidfile: %v", err)
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
	switch {
	case pid == s.self:
		s.problem(ReasonStalePIDFile, "pidfile %s holds PID %d, which is spotguard itself", path, pid)
	case !s.add(pid, ViaPIDFile):
		s.problem(ReasonStalePIDFile, "pidfile %s holds PID %d, which is not running", path, pid)
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
	n := 0
	for _, pid := range slices.Compact(pids) {
		if s.add(pid, ViaUnit) {
			n++
		}
	}
	if n == 0 {
		s.problem(ReasonNoProcess, "cgroup %s of unit %s holds no running process", dir, name)
	}
}

func (s *finder) byMatch(re *regexp.Regexp) {
	entries, err := os.ReadDir(s.procRoot)
	if err != nil {
		s.problem(ReasonNoMatch, "cannot list processes to match %q: %v", re, err)
		return
	}
	n := 0
	for _, e := range entries {
		pid, err := strconv.Atoi(e.Name())
		if err != nil || pid <= 0 || pid == s.self {
			continue
		}
		cmdline, ok := readCmdline(s.procRoot, pid)
		// Kernel threads and zombies have an empty command line.
		if !ok || cmdline == "" || !re.MatchString(cmdline) {
			continue
		}
		if s.add(pid, ViaMatch) {
			n++
		}
	}
	if n == 0 {
		s.problem(ReasonNoMatch, "no running process has a command line that matches %q", re)
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
