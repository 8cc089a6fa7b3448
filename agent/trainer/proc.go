package trainer

import (
	"bufio"
	"bytes"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"time"
)

const (
	defaultProcRoot   = "/proc"
	defaultCgroupRoot = "/sys/fs/cgroup"
)

func orDefault(s, def string) string {
	if s == "" {
		return def
	}
	return s
}

// procStatus is what we use of /proc/PID/status.
type procStatus struct {
	state  byte   // first letter of State: R, S, D, Z, T, ...
	sigCgt uint64 // caught signals: bit n-1 set for signal n
	// uid is the real user ID (the first field of Uid), -1 when there is no Uid line.
	uid  int
	ppid int // the parent's PID (PPid); 0 for init and kernel threads, or when absent
	// nspid is NSpid: the PID in every PID namespace the process is in, from the namespace of
	// this proc mount (first) to the process's own (last). One entry: the process is in the
	// proc mount's namespace. Empty on kernels before 4.1, which have no NSpid line.
	nspid []int
}

// ownPID returns the PID the process has in its own PID namespace (the last NSpid entry): what
// getpid() returns to it, so what it writes into a pidfile. ok is false without NSpid.
func (st procStatus) ownPID() (pid int, ok bool) {
	if len(st.nspid) == 0 {
		return 0, false
	}
	return st.nspid[len(st.nspid)-1], true
}

// readStatus reads procRoot/PID/status. An error wraps os.ErrNotExist when the process does not
// exist (or exited while the file was read).
func readStatus(procRoot string, pid int) (procStatus, error) {
	path := filepath.Join(procRoot, strconv.Itoa(pid), "status")
	data, err := os.ReadFile(path)
	if errors.Is(err, syscall.ESRCH) {
		// The process was reaped between open and read.
		return procStatus{}, fmt.Errorf("trainer: read %s: process exited: %w", path, os.ErrNotExist)
	}
	if err != nil {
		return procStatus{}, fmt.Errorf("trainer: read process status: %w", err)
	}
	st := procStatus{uid: -1}
	var haveState, haveSigCgt bool
	sc := bufio.NewScanner(bytes.NewReader(data))
	for sc.Scan() {
		key, val, ok := strings.Cut(sc.Text(), ":")
		if !ok {
			continue
		}
		val = strings.TrimSpace(val)
		switch key {
		case "State":
			if val != "" {
				st.state, haveState = val[0], true
			}
		case "SigCgt":
			st.sigCgt, err = strconv.ParseUint(val, 16, 64)
			if err != nil {
				return procStatus{}, fmt.Errorf("trainer: %s: bad SigCgt %q: %w", path, val, err)
			}
			haveSigCgt = true
		case "Uid":
			if f := strings.Fields(val); len(f) > 0 {
				if uid, err := strconv.ParseUint(f[0], 10, 32); err == nil {
					st.uid = int(uid)
				}
			}
		case "PPid":
			st.ppid, _ = strconv.Atoi(val)
		case "NSpid":
			for _, f := range strings.Fields(val) {
				pid, err := strconv.Atoi(f)
				if err != nil {
					st.nspid = nil
					break
				}
				st.nspid = append(st.nspid, pid)
			}
		}
	}
	if !haveState || !haveSigCgt {
		return procStatus{}, fmt.Errorf("trainer: %s: no State or SigCgt line", path)
	}
	return st, nil
}

// readCmdline returns the command line of pid with its NUL separators turned into spaces. ok is
// false when the process does not exist (any more) or the file cannot be read.
func readCmdline(procRoot string, pid int) (cmdline string, ok bool) {
	data, err := os.ReadFile(filepath.Join(procRoot, strconv.Itoa(pid), "cmdline"))
	if err != nil {
		return "", false
	}
	data = bytes.TrimRight(data, "\x00")
	return string(bytes.ReplaceAll(data, []byte{0}, []byte{' '})), true
}

// userHZ is the unit of the times in /proc/PID/stat: USER_HZ, 100 on every Linux architecture.
const userHZ = 100

// BootTime returns when this machine booted (btime in /proc/stat, to the second; zero if it
// cannot be read).
func BootTime() time.Time { return readBootTime(defaultProcRoot) }

// readBootTime returns when the machine booted (btime in procRoot/stat, to the second; zero if
// it cannot be read).
func readBootTime(procRoot string) time.Time {
	data, err := os.ReadFile(filepath.Join(procRoot, "stat"))
	if err != nil {
		return time.Time{}
	}
	for line := range strings.Lines(string(data)) {
		if v, ok := strings.CutPrefix(line, "btime "); ok {
			if sec, err := strconv.ParseInt(strings.TrimSpace(v), 10, 64); err == nil && sec > 0 {
				return time.Unix(sec, 0)
			}
		}
	}
	return time.Time{}
}

// readStat returns pid's parent's PID (ppid, the 4th field of procRoot/PID/stat) and when pid
// started, in clock ticks after boot (starttime, the 22nd field); 0 for what cannot be read. With
// its PID the start names one process: a PID used again is used by a process with other start
// ticks.
func readStat(procRoot string, pid int) (ppid int, ticks uint64) {
	data, err := os.ReadFile(filepath.Join(procRoot, strconv.Itoa(pid), "stat"))
	if err != nil {
		return 0, 0
	}
	// pid (comm) state ppid ...: comm may hold spaces and parentheses, so after the last ')';
	// there the state is field 3, the ppid field 4 and starttime field 22.
	i := bytes.LastIndexByte(data, ')')
	if i < 0 {
		return 0, 0
	}
	f := strings.Fields(string(data[i+1:]))
	if len(f) < 20 {
		return 0, 0
	}
	ppid, err = strconv.Atoi(f[1])
	if err != nil {
		ppid = 0
	}
	ticks, err = strconv.ParseUint(f[19], 10, 64)
	if err != nil {
		ticks = 0
	}
	return ppid, ticks
}

// startedAt turns start ticks into a time: boot plus ticks, no later than the process started
// (boot is read to the second, and truncated). Zero if either is unknown.
func startedAt(boot time.Time, ticks uint64) time.Time {
	if boot.IsZero() || ticks == 0 {
		return time.Time{}
	}
	return boot.Add(time.Duration(ticks) * time.Second / userHZ)
}

// readArgv returns the argument list of pid: /proc/PID/cmdline split at its NUL separators (an
// empty argument stays one). ok is false when the process does not exist (any more) or the file
// cannot be read; a kernel thread or a zombie has an empty list.
func readArgv(procRoot string, pid int) (argv []string, ok bool) {
	data, err := os.ReadFile(filepath.Join(procRoot, strconv.Itoa(pid), "cmdline"))
	if err != nil {
		return nil, false
	}
	if len(data) == 0 {
		return nil, true
	}
	return strings.Split(string(bytes.TrimSuffix(data, []byte{0})), "\x00"), true
}

// parsePID parses a PID as written in a pidfile or cgroup.procs: decimal, positive, with
// surrounding white space allowed.
func parsePID(s string) (int, bool) {
	pid, err := strconv.Atoi(strings.TrimSpace(s))
	if err != nil || pid <= 0 {
		return 0, false
	}
	return pid, true
}
