package trainer

import (
	"errors"
	"io/fs"
	"os"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
)

func TestParseSignal(t *testing.T) {
	tests := []struct {
		name    string
		want    syscall.Signal
		wantErr string // a part of the error; "" means no error
	}{
		{"SIGUSR1", syscall.SIGUSR1, ""},
		{"USR1", syscall.SIGUSR1, ""},
		{"sigusr1", syscall.SIGUSR1, ""},
		{"SigUsr2", syscall.SIGUSR2, ""},
		{" usr2\n", syscall.SIGUSR2, ""},
		{"HUP", syscall.SIGHUP, ""},
		{"SIGINT", syscall.SIGINT, ""},
		{"quit", syscall.SIGQUIT, ""},
		{"TERM", syscall.SIGTERM, ""},
		{"SIGALRM", syscall.SIGALRM, ""},
		{"cont", syscall.SIGCONT, ""},
		{"SIGWINCH", syscall.SIGWINCH, ""},
		{"urg", syscall.SIGURG, ""},
		{"SIGKILL", 0, `"SIGKILL" cannot be caught`},
		{"kill", 0, `"kill" cannot be caught`},
		{"SIGSTOP", 0, `"SIGSTOP" cannot be caught`},
		{"SIGSEGV", 0, `"SIGSEGV" is not accepted`},
		{"SIGCHLD", 0, `"SIGCHLD" is not accepted`},
		{"", 0, "empty signal name"},
		{"   ", 0, "empty signal name"},
		{"SIGFOO", 0, `unknown signal "SIGFOO"`},
		{"SIG", 0, `unknown signal "SIG"`},
		{"10", 0, `unknown signal "10"`},
		{"-10", 0, `unknown signal "-10"`},
		{"SIG10", 0, `unknown signal "SIG10"`},
		{"SIGRTMIN", 0, `unknown signal "SIGRTMIN"`},
		{"USR1 USR2", 0, `unknown signal "USR1 USR2"`},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			got, err := ParseSignal(tt.name)
			if got != tt.want {
				t.Errorf("ParseSignal(%q) = %v; want %v", tt.name, got, tt.want)
			}
			switch {
			case tt.wantErr == "" && err != nil:
				t.Errorf("ParseSignal(%q) error = %v; want nil", tt.name, err)
			case tt.wantErr != "" && (err == nil || !strings.Contains(err.Error(), tt.wantErr)):
				t.Errorf("ParseSignal(%q) error = %v; want one containing %q", tt.name, err, tt.wantErr)
			}
		})
	}
}

func TestSignalName(t *testing.T) {
	tests := []struct {
		sig  syscall.Signal
		want string
	}{
		{syscall.SIGUSR1, "SIGUSR1"},
		{syscall.SIGTERM, "SIGTERM"},
		{syscall.SIGKILL, "SIGKILL"},
		{0, "signal 0"},
		{99, "signal 99"},
	}
	for _, tt := range tests {
		if got := SignalName(tt.sig); got != tt.want {
			t.Errorf("SignalName(%d) = %q; want %q", int(tt.sig), got, tt.want)
		}
	}
	// Every name ParseSignal accepts comes back from SignalName.
	for _, name := range strings.Split(acceptedSignals, ", ") {
		sig, err := ParseSignal(name)
		if err != nil || SignalName(sig) != name {
			t.Errorf("SignalName(ParseSignal(%q)) = %q, %v; want %q, nil", name, SignalName(sig), err, name)
		}
	}
}

// writeStatus writes a fake procRoot/PID/status with the given State and SigCgt lines.
func writeStatus(t *testing.T, procRoot string, pid, status string) {
	t.Helper()
	dir := filepath.Join(procRoot, pid)
	if err := os.MkdirAll(dir, 0o755); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(dir, "status"), []byte(status), 0o644); err != nil {
		t.Fatal(err)
	}
}

func TestCatchesFakeProc(t *testing.T) {
	proc := t.TempDir()
	const head = "Name:\tpython3\nState:\tS (sleeping)\nSigQ:\t0/1\nSigPnd:\t0000000000000000\nSigBlk:\t0000000000000000\nSigIgn:\t0000000001001000\n"
	// 0x8000000000004201: signals 1 (HUP), 10 (USR1), 15 (TERM) and 64.
	writeStatus(t, proc, "100", head+"SigCgt:\t8000000000004201\n")
	writeStatus(t, proc, "101", head+"SigCgt:\t0000000000000000\n")
	writeStatus(t, proc, "102", head+"SigCgt:\tnot-hex\n")
	writeStatus(t, proc, "103", head)
	writeStatus(t, proc, "104", "Name:\tzombie\nState:\tZ (zombie)\nSigCgt:\t0000000000000000\n")

	tests := []struct {
		pid     int
		sig     syscall.Signal
		want    bool
		wantErr bool
		notExit bool // the error wraps fs.ErrNotExist
	}{
		{100, syscall.SIGHUP, true, false, false},
		{100, syscall.SIGUSR1, true, false, false},
		{100, syscall.SIGTERM, true, false, false},
		{100, 64, true, false, false},
		{100, syscall.SIGUSR2, false, false, false},
		{100, syscall.SIGINT, false, false, false},
		{101, syscall.SIGUSR1, false, false, false},
		{104, syscall.SIGUSR1, false, false, false},
		{102, syscall.SIGUSR1, false, true, false},
		{103, syscall.SIGUSR1, false, true, false},
		{999, syscall.SIGUSR1, false, true, true},
		{100, 0, false, true, false},
		{100, 65, false, true, false},
	}
	for _, tt := range tests {
		got, err := Catches(proc, tt.pid, tt.sig)
		if got != tt.want || (err != nil) != tt.wantErr || errors.Is(err, fs.ErrNotExist) != tt.notExit {
			t.Errorf("Catches(%d, %d) = %v, %v; want %v, error %v (not exist %v)", tt.pid, int(tt.sig), got, err, tt.want, tt.wantErr, tt.notExit)
		}
	}
}
