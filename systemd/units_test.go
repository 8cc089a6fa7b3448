package systemd

import (
	"bufio"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"
)

// The unit files this package ships, and the example trainer unit that pairs with them.
var unitFiles = []string{
	"systemd/spotguard.service",
	"systemd/spotguard-restore.service",
	"examples/systemd/trainer.service",
}

// maxExposure is the highest `systemd-analyze security` exposure a shipped unit may have:
// the top of the "OK" band.
const maxExposure = 4.0

// repoRoot is the repository root; tests run in the package directory.
func repoRoot(t *testing.T) string {
	t.Helper()
	root, err := filepath.Abs("..")
	if err != nil {
		t.Fatal(err)
	}
	return root
}

// needSystemdAnalyze returns the path of systemd-analyze. It skips the test when the tool is
// missing, except under CI (CI=true), which installs it (Debian package "systemd").
func needSystemdAnalyze(t *testing.T) string {
	t.Helper()
	p, err := exec.LookPath("systemd-analyze")
	if err != nil {
		if os.Getenv("CI") != "" {
			t.Fatalf("systemd-analyze is missing under CI (install the Debian package systemd): %v", err)
		}
		t.Skipf("systemd-analyze not found (Debian package systemd): %v", err)
	}
	return p
}

// stageUnits copies every unit into one temporary directory, where they find each other by
// name, and returns that directory. systemd-analyze verify insists that each command's binary
// exists, so spotguard's path (never installed on a test machine) points at a stand-in
// executable, and so do /bin/kill and /usr/bin/python3 where this machine lacks them.
func stageUnits(t *testing.T) string {
	t.Helper()
	root := repoRoot(t)
	dir := t.TempDir()
	stub := filepath.Join(dir, "bin", "stub")
	if err := os.MkdirAll(filepath.Dir(stub), 0o755); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(stub, []byte("#!/bin/sh\nexit 0\n"), 0o755); err != nil {
		t.Fatal(err)
	}
	replace := []string{"/usr/local/bin/spotguard", stub}
	for _, p := range []string{"/bin/kill", "/usr/bin/python3"} {
		if _, err := os.Stat(p); err != nil {
			t.Logf("%s is missing here; the staged units use a stand-in for it", p)
			replace = append(replace, p, stub)
		}
	}
	r := strings.NewReplacer(replace...)
	for _, f := range unitFiles {
		data, err := os.ReadFile(filepath.Join(root, f))
		if err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(filepath.Join(dir, filepath.Base(f)), []byte(r.Replace(string(data))), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	return dir
}

// analyze runs systemd-analyze with args and returns its combined output and exit error.
func analyze(t *testing.T, tool string, args ...string) (string, error) {
	t.Helper()
	cmd := exec.Command(tool, args...)
	cmd.Env = append(os.Environ(), "SYSTEMD_COLORS=0", "SYSTEMD_PAGER=", "SYSTEMD_LOG_COLOR=0")
	out, err := cmd.CombinedOutput()
	return string(out), err
}

// TestUnitsVerify runs `systemd-analyze verify` on every unit. It needs no running systemd.
// verify exits 0 even after warnings such as "Unknown key" or an unparsable value, so any
// output about our units fails the test too.
func TestUnitsVerify(t *testing.T) {
	tool := needSystemdAnalyze(t)
	dir := stageUnits(t)
	for _, f := range unitFiles {
		name := filepath.Base(f)
		t.Run(name, func(t *testing.T) {
			out, err := analyze(t, tool, "verify", "--man=no", filepath.Join(dir, name))
			var ours []string
			for _, line := range strings.Split(strings.TrimSpace(out), "\n") {
				if line == "" {
					continue
				}
				if strings.Contains(line, dir) || slices.ContainsFunc(unitFiles, func(u string) bool {
					return strings.Contains(line, filepath.Base(u))
				}) {
					ours = append(ours, line)
				} else {
					t.Logf("about another unit: %s", line)
				}
			}
			if err != nil || len(ours) > 0 {
				t.Errorf("systemd-analyze verify %s: %v\n%s", f, err, strings.Join(ours, "\n"))
			}
		})
	}

	// The check is not vacuous: the same call reports a broken unit.
	t.Run("reports_a_broken_unit", func(t *testing.T) {
		bad := filepath.Join(t.TempDir(), "broken.service")
		if err := os.WriteFile(bad, []byte("[Service]\nExecStart=/bin/true\nProtectSystem=strictly\n"), 0o644); err != nil {
			t.Fatal(err)
		}
		out, _ := analyze(t, tool, "verify", "--man=no", bad)
		if !strings.Contains(out, "ProtectSystem") && !strings.Contains(out, "protect system") {
			t.Errorf("verify of a unit with ProtectSystem=strictly said nothing about it:\n%s", out)
		}
	})
}

var exposureRE = regexp.MustCompile(`Overall exposure level for \S+: ([0-9]+(?:\.[0-9]+)?)`)

// TestUnitsSecurity rates each spotguard unit with `systemd-analyze security --offline=true`
// and fails above maxExposure.
func TestUnitsSecurity(t *testing.T) {
	tool := needSystemdAnalyze(t)
	dir := stageUnits(t)
	for _, name := range []string{"spotguard.service", "spotguard-restore.service"} {
		t.Run(name, func(t *testing.T) {
			out, err := analyze(t, tool, "security", "--offline=true", "--no-pager", filepath.Join(dir, name))
			m := exposureRE.FindStringSubmatch(out)
			if m == nil {
				t.Fatalf("systemd-analyze security %s: %v; no overall exposure in:\n%s", name, err, out)
			}
			got, err := strconv.ParseFloat(m[1], 64)
			if err != nil {
				t.Fatal(err)
			}
			t.Logf("%s: exposure %.1f", name, got)
			if got > maxExposure {
				t.Errorf("Exposure(%q) = %.1f; want at most %.1f\n%s", name, got, maxExposure, out)
			}
		})
	}
}

// unit is a parsed unit file: section → key → every value, in order.
type unit map[string]map[string][]string

// parseUnit reads a unit file: sections, Key=Value lines, comments; no line continuations.
func parseUnit(t *testing.T, path string) unit {
	t.Helper()
	f, err := os.Open(path)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	u := unit{}
	section := ""
	sc := bufio.NewScanner(f)
	for n := 1; sc.Scan(); n++ {
		line := strings.TrimSpace(sc.Text())
		switch {
		case line == "" || strings.HasPrefix(line, "#") || strings.HasPrefix(line, ";"):
		case strings.HasPrefix(line, "[") && strings.HasSuffix(line, "]"):
			section = line[1 : len(line)-1]
			u[section] = map[string][]string{}
		case strings.HasSuffix(line, `\`):
			t.Fatalf("%s:%d: line continuations are not used in our units", path, n)
		default:
			k, v, ok := strings.Cut(line, "=")
			if !ok || section == "" {
				t.Fatalf("%s:%d: not Key=Value in a section: %q", path, n, line)
			}
			u[section][k] = append(u[section][k], v)
		}
	}
	if err := sc.Err(); err != nil {
		t.Fatal(err)
	}
	return u
}

// last is the effective value of a single-valued setting ("" when unset).
func (u unit) last(section, key string) string {
	vs := u[section][key]
	if len(vs) == 0 {
		return ""
	}
	return vs[len(vs)-1]
}

// words is every word of a list-valued setting, over all its lines.
func (u unit) words(section, key string) []string {
	var ws []string
	for _, v := range u[section][key] {
		ws = append(ws, strings.Fields(v)...)
	}
	return ws
}

// seconds parses a systemd time span of the forms the units use: "150", "150s", "2min".
func seconds(t *testing.T, v string) time.Duration {
	t.Helper()
	if _, err := strconv.Atoi(v); err == nil {
		v += "s"
	}
	d, err := time.ParseDuration(strings.Replace(v, "min", "m", 1))
	if err != nil {
		t.Fatalf("time span %q: %v", v, err)
	}
	return d
}

// TestUnitDecisions pins the settings that the agent's behaviour depends on, and keeps out the
// hardening settings that would silently break it (each with the reason).
func TestUnitDecisions(t *testing.T) {
	root := repoRoot(t)
	agent := parseUnit(t, filepath.Join(root, "systemd/spotguard.service"))
	restore := parseUnit(t, filepath.Join(root, "systemd/spotguard-restore.service"))
	trainer := parseUnit(t, filepath.Join(root, "examples/systemd/trainer.service"))

	t.Run("agent", func(t *testing.T) {
		for _, c := range []struct{ key, want, why string }{
			{"Type", "notify", "the agent sends READY=1, STATUS=, WATCHDOG=1, STOPPING=1"},
			{"NotifyAccess", "main", "only the agent itself speaks sd_notify"},
			{"ExecStart", "/usr/local/bin/spotguard run --config /etc/spotguard/spotguard.yaml", "install.sh puts the binary and the config there"},
			{"ExecCondition", "/usr/local/bin/spotguard config --configured --config /etc/spotguard/spotguard.yaml", "an agent nobody configured yet is skipped, not failed at every boot"},
			{"ExecReload", "/bin/kill -HUP $MAINPID", "SIGHUP reloads the configuration"},
			{"Restart", "always", "the agent must come back after any exit"},
			{"KillMode", "mixed", "SIGTERM to the agent only; it finishes a notice's upload, then exits"},
			{"RuntimeDirectory", "spotguard", "agent.runtime_dir defaults to /run/spotguard, where notice.json goes"},
			{"RuntimeDirectoryMode", "0755", "trainers of any user read notice.json"},
			{"ProtectSystem", "strict", "hardening"},
			{"ProtectHome", "read-only", "checkpoints may live under /home: readable, never writable"},
			{"ProtectControlGroups", "yes", "read-only, still readable: trainer.unit is found through cgroup.procs"},
			{"ProtectProc", "default", "trainer discovery reads /proc/PID/status and cmdline of other users"},
			{"ProcSubset", "all", "trainer discovery reads /proc/PID/..."},
			{"DevicePolicy", "closed", "only the NVIDIA devices"},
			{"NoNewPrivileges", "yes", "hardening"},
			{"MemoryDenyWriteExecute", "yes", "hardening"},
		} {
			if got := agent.last("Service", c.key); got != c.want {
				t.Errorf("spotguard.service %s=%q; want %q (%s)", c.key, got, c.want, c.why)
			}
		}
		if d := seconds(t, agent.last("Service", "TimeoutStopSec")); d < 150*time.Second {
			t.Errorf("spotguard.service TimeoutStopSec=%s; want at least 150s (a notice's upload is finished before exit)", d)
		}
		if agent.last("Service", "WatchdogSec") == "" {
			t.Error("spotguard.service has no WatchdogSec; the agent pings the watchdog")
		}
		if agent.last("Unit", "StartLimitBurst") == "" || agent.last("Unit", "StartLimitIntervalSec") == "" {
			t.Error("spotguard.service has no StartLimitBurst/StartLimitIntervalSec: a crash loop would never show as failed")
		}
		caps := agent.words("Service", "CapabilityBoundingSet")
		for _, c := range []string{"CAP_KILL", "CAP_DAC_READ_SEARCH"} {
			if !slices.Contains(caps, c) {
				t.Errorf("spotguard.service CapabilityBoundingSet=%v lacks %s", caps, c)
			}
		}
		if !slices.ContainsFunc(agent.words("Service", "DeviceAllow"), func(w string) bool { return strings.HasPrefix(w, "char-nvidia") }) {
			t.Error("spotguard.service DeviceAllow= does not allow the NVIDIA devices: NVML would fail")
		}
		af := agent.words("Service", "RestrictAddressFamilies")
		for _, f := range []string{"AF_INET", "AF_INET6", "AF_UNIX"} {
			if !slices.Contains(af, f) {
				t.Errorf("spotguard.service RestrictAddressFamilies=%v lacks %s", af, f)
			}
		}
		for _, c := range []struct{ key, why string }{
			{"PrivateDevices", "hides /dev/nvidia*: GPU sampling would be off"},
			{"PrivateUsers", "capabilities would stop at the user namespace: CAP_KILL would reach no trainer"},
			{"PrivateNetwork", "IMDS, S3 and CloudWatch are on the network"},
			{"IPAddressDeny", "S3 endpoints are not a fixed set of addresses"},
			{"ReadWritePaths", "the agent writes only its state and runtime directories (a file:// store is a drop-in)"},
		} {
			if v := agent.last("Service", c.key); v != "" && v != "no" {
				t.Errorf("spotguard.service sets %s=%s: %s", c.key, v, c.why)
			}
		}
	})

	t.Run("restore", func(t *testing.T) {
		for _, c := range []struct{ key, want string }{
			{"Type", "oneshot"},
			{"RemainAfterExit", "yes"},
			{"EnvironmentFile", "-/etc/default/spotguard-restore"},
		} {
			if got := restore.last("Service", c.key); got != c.want {
				t.Errorf("spotguard-restore.service %s=%q; want %q", c.key, got, c.want)
			}
		}
		cmdline := restore.last("Service", "ExecStart")
		for _, w := range []string{"/usr/local/bin/spotguard restore ", "--config /etc/spotguard/spotguard.yaml", "--allow-empty", "--no-create", "--mount-wait=", "--to=${RESTORE_TO}"} {
			if !strings.Contains(cmdline, w) {
				t.Errorf("spotguard-restore.service ExecStart=%q lacks %q", cmdline, w)
			}
		}
		// Empty by default: --to= restores into checkpoint.dir, the directory the agent watches.
		if !slices.Contains(restore["Service"]["Environment"], "RESTORE_TO=") {
			t.Errorf("spotguard-restore.service Environment=%q; want RESTORE_TO= (empty: checkpoint.dir)", restore["Service"]["Environment"])
		}
	})

	t.Run("trainer", func(t *testing.T) {
		for _, c := range []struct {
			key  string
			want []string
		}{
			{"Requires", []string{"spotguard-restore.service"}},
			{"After", []string{"spotguard-restore.service", "spotguard.service"}},
		} {
			got := trainer.words("Unit", c.key)
			for _, w := range c.want {
				if !slices.Contains(got, w) {
					t.Errorf("trainer.service %s=%v lacks %s", c.key, got, w)
				}
			}
		}
		if got := trainer.last("Service", "KillSignal"); got != "SIGTERM" {
			t.Errorf("trainer.service KillSignal=%q; want SIGTERM", got)
		}
		if d := seconds(t, trainer.last("Service", "TimeoutStopSec")); d < 60*time.Second {
			t.Errorf("trainer.service TimeoutStopSec=%s; want time for its own save", d)
		}
	})
}
