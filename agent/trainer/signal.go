// Package trainer finds the training processes on this instance and signals them, never with a
// signal they do not catch.
//
// The default action of most signals ends the process: a Python trainer without a SIGUSR1
// handler dies on SIGUSR1. So [Signal] reads the handler mask (SigCgt in /proc/PID/status) of
// every process first and sends only to those that installed a handler.
package trainer

import (
	"errors"
	"fmt"
	"os"
	"strings"
	"syscall"
)

// ParseSignal returns the signal named by name, which is case-insensitive, may omit the "SIG"
// prefix and may have surrounding spaces: "SIGUSR1", "USR1" and "sigusr1" are all SIGUSR1.
// Only these are accepted: SIGHUP, SIGINT, SIGQUIT, SIGUSR1, SIGUSR2, SIGTERM, SIGALRM, SIGCONT,
// SIGWINCH and SIGURG.
//
// It returns a non-nil error naming the value, and signal 0, when name is empty, a number, an
// unknown name, a signal that cannot be caught (SIGKILL, SIGSTOP) or a signal that is not
// accepted for telling a trainer to checkpoint (SIGSEGV, SIGCHLD, ...).
func ParseSignal(name string) (syscall.Signal, error) {
	n := strings.ToUpper(strings.TrimSpace(name))
	if n == "" {
		return 0, errors.New("trainer: empty signal name; want one of " + acceptedSignals)
	}
	if !strings.HasPrefix(n, "SIG") {
		n = "SIG" + n
	}
	for sig := syscall.Signal(1); sig <= 64; sig++ {
		if SignalName(sig) != n {
			continue
		}
		switch sig {
		case syscall.SIGHUP, syscall.SIGINT, syscall.SIGQUIT, syscall.SIGUSR1, syscall.SIGUSR2,
			syscall.SIGTERM, syscall.SIGALRM, syscall.SIGCONT, syscall.SIGWINCH, syscall.SIGURG:
			return sig, nil
		case syscall.SIGKILL, syscall.SIGSTOP:
			return 0, fmt.Errorf("trainer: signal %q cannot be caught, so a trainer could never checkpoint on it; want one of %s", name, acceptedSignals)
		default:
			return 0, fmt.Errorf("trainer: signal %q is not accepted for trainers; want one of %s", name, acceptedSignals)
		}
	}
	return 0, fmt.Errorf("trainer: unknown signal %q; want one of %s", name, acceptedSignals)
}

// acceptedSignals lists, for error messages, the signals ParseSignal accepts.
const acceptedSignals = "SIGHUP, SIGINT, SIGQUIT, SIGUSR1, SIGUSR2, SIGTERM, SIGALRM, SIGCONT, SIGWINCH, SIGURG"

// SignalName returns the conventional name of sig, such as "SIGUSR1". For a signal without a
// portable name (a real-time signal, a platform-specific one, or an invalid number) it returns
// "signal N".
func SignalName(sig syscall.Signal) string {
	switch sig {
	case syscall.SIGHUP:
		return "SIGHUP"
	case syscall.SIGINT:
		return "SIGINT"
	case syscall.SIGQUIT:
		return "SIGQUIT"
	case syscall.SIGILL:
		return "SIGILL"
	case syscall.SIGTRAP:
		return "SIGTRAP"
	case syscall.SIGABRT:
		return "SIGABRT"
	case syscall.SIGBUS:
		return "SIGBUS"
	case syscall.SIGFPE:
		return "SIGFPE"
	case syscall.SIGKILL:
		return "SIGKILL"
	case syscall.SIGUSR1:
		return "SIGUSR1"
	case syscall.SIGSEGV:
		return "SIGSEGV"
	case syscall.SIGUSR2:
		return "SIGUSR2"
	case syscall.SIGPIPE:
		return "SIGPIPE"
	case syscall.SIGALRM:
		return "SIGALRM"
	case syscall.SIGTERM:
		return "SIGTERM"
	case syscall.SIGCHLD:
		return "SIGCHLD"
	case syscall.SIGCONT:
		return "SIGCONT"
	case syscall.SIGSTOP:
		return "SIGSTOP"
	case syscall.SIGTSTP:
		return "SIGTSTP"
	case syscall.SIGTTIN:
		return "SIGTTIN"
	case syscall.SIGTTOU:
		return "SIGTTOU"
	case syscall.SIGURG:
		return "SIGURG"
	case syscall.SIGXCPU:
		return "SIGXCPU"
	case syscall.SIGXFSZ:
		return "SIGXFSZ"
	case syscall.SIGVTALRM:
		return "SIGVTALRM"
	case syscall.SIGPROF:
		return "SIGPROF"
	case syscall.SIGWINCH:
		return "SIGWINCH"
	case syscall.SIGIO:
		return "SIGIO"
	case syscall.SIGSYS:
		return "SIGSYS"
	}
	return fmt.Sprintf("signal %d", int(sig))
}

// Catches reports whether process pid has a handler installed for sig, read from the SigCgt mask
// in procRoot/PID/status (bit sig-1). procRoot is normally "/proc"; empty means "/proc".
//
// It returns:
//   - true, nil: the process has a handler for sig;
//   - false, nil: it has none: sig has its default action (which for most signals ends the
//     process), is ignored, or the process is a zombie (which has no handlers left);
//   - false, an error wrapping [io/fs.ErrNotExist]: there is no such process;
//   - false, another error: sig is not a valid signal number (1 to 64), or the status file
//     cannot be read or has no SigCgt line.
func Catches(procRoot string, pid int, sig syscall.Signal) (bool, error) {
	if sig < 1 || sig > 64 {
		return false, fmt.Errorf("trainer: invalid signal number %d", int(sig))
	}
	st, err := readStatus(orDefault(procRoot, defaultProcRoot), pid)
	if err != nil {
		return false, err
	}
	return st.sigCgt&(1<<(uint(sig)-1)) != 0, nil
}

// Outcome is what [Signal] did with one process. Its values are stable metric labels.
type Outcome string

// The outcomes of [Signal].
const (
	// OutcomeSent: the process catches the signal and it was sent.
	OutcomeSent Outcome = "sent"
	// OutcomeNotCaught: the process has no handler for the signal, so it was not sent: the
	// default action would have ended it (or, for an ignored signal, done nothing).
	OutcomeNotCaught Outcome = "not_caught"
	// OutcomeGone: the process had exited (or is a zombie) before it could be signalled.
	OutcomeGone Outcome = "gone"
	// OutcomeFailed: the signal could not be checked or sent; Result.Err says why.
	OutcomeFailed Outcome = "failed"
)

// Result is what [Signal] did with one process.
type Result struct {
	PID     int
	Cmdline string
	Outcome Outcome
	// Err is nil unless Outcome is OutcomeFailed.
	Err error
}

// Signal sends sig to every process in procs that catches it, each process once even where
// procs names a PID more than once. procRoot is normally "/proc"; empty means "/proc".
//
// It returns one Result per distinct PID, in the order of procs. For each process it opens a
// handle first ([os.FindProcess]: a pidfd on Linux 5.3 and later), then checks that the process
// is alive and catches sig (see [Catches]), then signals through the handle: if the process
// exits and its PID is reused once the handle is open, the newcomer is not signalled. (Where
// pidfds are not available, Go falls back to the plain PID and this guard is lost.)
// Each Result's Outcome is:
//   - OutcomeSent: the process catches sig and was signalled;
//   - OutcomeNotCaught: the process does not catch sig and was not signalled, since the default
//     action of most signals (SIGUSR1 included) would end a healthy run;
//   - OutcomeGone: the process had exited or is a zombie; not an error, Err is nil;
//   - OutcomeFailed: sig is not a valid signal number, or the status could not be read, or the
//     kernel refused the signal (for example EPERM); Err says which.
func Signal(procRoot string, procs []Process, sig syscall.Signal) []Result {
	procRoot = orDefault(procRoot, defaultProcRoot)
	results := make([]Result, 0, len(procs))
	seen := make(map[int]bool, len(procs))
	for _, p := range procs {
		if seen[p.PID] {
			continue
		}
		seen[p.PID] = true
		r := Result{PID: p.PID, Cmdline: p.Cmdline}
		r.Outcome, r.Err = signalOne(procRoot, p.PID, sig)
		results = append(results, r)
	}
	return results
}

// signalOne checks and signals one process; see Signal for the outcomes.
func signalOne(procRoot string, pid int, sig syscall.Signal) (Outcome, error) {
	if sig < 1 || sig > 64 {
		return OutcomeFailed, fmt.Errorf("trainer: invalid signal number %d", int(sig))
	}
	if pid <= 0 {
		return OutcomeFailed, fmt.Errorf("trainer: invalid pid %d", pid)
	}
	// Open the handle before the check: on Linux it is a pidfd, which keeps referring to this
	// process even if it exits and its PID is reused before the signal is sent.
	p, err := os.FindProcess(pid)
	if err != nil {
		return OutcomeFailed, fmt.Errorf("trainer: find process %d: %w", pid, err)
	}
	defer func() { _ = p.Release() }()

	st, err := readStatus(procRoot, pid)
	switch {
	case errors.Is(err, os.ErrNotExist):
		return OutcomeGone, nil
	case err != nil:
		return OutcomeFailed, err
	case st.state == 'Z' || st.state == 'X':
		return OutcomeGone, nil
	case st.sigCgt&(1<<(uint(sig)-1)) == 0:
		return OutcomeNotCaught, nil
	}
	err = p.Signal(sig)
	switch {
	case err == nil:
		return OutcomeSent, nil
	case errors.Is(err, os.ErrProcessDone), errors.Is(err, syscall.ESRCH):
		return OutcomeGone, nil
	default:
		return OutcomeFailed, fmt.Errorf("trainer: send %s to pid %d: %w", SignalName(sig), pid, err)
	}
}
