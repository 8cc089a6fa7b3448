package systemd

import (
	"errors"
	"io/fs"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
)

// debRoot is a DPKG_ROOT with what the .deb unpacks before its postinst runs: the agent, its
// unit and the configuration.
func debRoot(t *testing.T, bin, config string) string {
	t.Helper()
	root := t.TempDir()
	for _, f := range []struct {
		path, content string
		mode          fs.FileMode
	}{
		{"usr/bin/spotguard", readFile(t, bin), 0o755},
		{"usr/lib/systemd/system/spotguard.service", readFile(t, filepath.Join(repoRoot(t), "systemd", "spotguard.service")), 0o644},
		{"etc/spotguard/spotguard.yaml", config, 0o644},
	} {
		p := filepath.Join(root, f.path)
		if err := os.MkdirAll(filepath.Dir(p), 0o755); err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(p, []byte(f.content), f.mode); err != nil {
			t.Fatal(err)
		}
	}
	return root
}

// postinst runs systemd/deb/postinst with args under DPKG_ROOT root, with the real
// deb-systemd-helper, and returns its output.
func postinst(t *testing.T, root string, args ...string) string {
	t.Helper()
	cmd := exec.Command("sh", append([]string{filepath.Join(repoRoot(t), "systemd", "deb", "postinst")}, args...)...)
	cmd.Env = append(os.Environ(), dpkgEnv(root, "postinst")...)
	out, err := cmd.CombinedOutput()
	if err != nil {
		t.Fatalf("postinst %v: %v\n%s", args, err, out)
	}
	return string(out)
}

// TestDebPostinstEnablesOnlyAConfiguredAgent runs the .deb's postinst with the real
// deb-systemd-helper (init-system-helpers, Essential on Debian and Ubuntu) under DPKG_ROOT: a
// first install with the shipped configuration leaves spotguard.service disabled (it would be
// skipped, or fail, at every boot) and says what to do; a first install over a configuration
// that sets something enables it; upgrades keep whatever the admin chose.
func TestDebPostinstEnablesOnlyAConfiguredAgent(t *testing.T) {
	helper, err := exec.LookPath("deb-systemd-helper")
	if err != nil {
		if os.Getenv("CI") != "" {
			t.Fatalf("deb-systemd-helper is missing under CI (Debian package init-system-helpers): %v", err)
		}
		t.Skipf("deb-systemd-helper not found (Debian package init-system-helpers): %v", err)
	}
	t.Logf("using %s", helper)
	bin := buildSpotguard(t)
	shipped := readFile(t, filepath.Join(repoRoot(t), "systemd", "spotguard.yaml"))
	configured := shipped + "trainer:\n  unit: trainer.service\n"
	enabled := func(t *testing.T, root string) bool {
		t.Helper()
		_, err := os.Lstat(filepath.Join(root, "etc/systemd/system/multi-user.target.wants/spotguard.service"))
		if err != nil && !errors.Is(err, fs.ErrNotExist) {
			t.Fatal(err)
		}
		return err == nil
	}
	setConfig := func(t *testing.T, root, text string) {
		t.Helper()
		if err := os.WriteFile(filepath.Join(root, "etc/spotguard/spotguard.yaml"), []byte(text), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	disable := func(t *testing.T, root string) {
		t.Helper()
		if err := os.Remove(filepath.Join(root, "etc/systemd/system/multi-user.target.wants/spotguard.service")); err != nil {
			t.Fatal(err)
		}
	}

	t.Run("first_install_unconfigured", func(t *testing.T) {
		root := debRoot(t, bin, shipped)
		out := postinst(t, root, "configure")
		if enabled(t, root) {
			t.Errorf("spotguard.service enabled on a first install with the shipped configuration:\n%s", out)
		}
		if !strings.Contains(out, "not enabled: set the trainer") || !strings.Contains(out, "systemctl enable --now spotguard") {
			t.Errorf("postinst did not say how to enable it:\n%s", out)
		}
		// Configured later, the admin enables it; an upgrade keeps it enabled.
		setConfig(t, root, configured)
		if out := postinst(t, root, "configure", "0.0.1"); enabled(t, root) {
			t.Errorf("an upgrade enabled a unit the admin had not enabled:\n%s", out)
		}
		enable := exec.Command("deb-systemd-helper", "enable", "spotguard.service")
		enable.Env = append(os.Environ(), dpkgEnv(root, "postinst")...)
		mustRun(t, enable)
		if out := postinst(t, root, "configure", "0.0.2"); !enabled(t, root) {
			t.Errorf("an upgrade disabled the unit the admin enabled:\n%s", out)
		}
	})
	t.Run("first_install_configured", func(t *testing.T) {
		root := debRoot(t, bin, configured)
		out := postinst(t, root, "configure")
		if !enabled(t, root) {
			t.Errorf("spotguard.service not enabled on a first install over a configuration that sets the trainer:\n%s", out)
		}
		if !strings.Contains(out, "enabled at boot") {
			t.Errorf("postinst did not say it enabled the unit:\n%s", out)
		}
		// The admin disables it: an upgrade keeps it disabled.
		disable(t, root)
		if out := postinst(t, root, "configure", "0.0.1"); enabled(t, root) {
			t.Errorf("an upgrade enabled the unit the admin disabled:\n%s", out)
		}
	})
	t.Run("first_install_broken_config", func(t *testing.T) {
		// One that does not load is not "unconfigured": enabled, and it fails where it shows.
		root := debRoot(t, bin, "trainer: [\n")
		if out := postinst(t, root, "configure"); !enabled(t, root) {
			t.Errorf("a configuration that does not load was taken for the untouched default:\n%s", out)
		}
	})
	t.Run("upgrade_keeps_an_enabled_unconfigured_unit", func(t *testing.T) {
		// An earlier version enabled it unconfigured: left so (the unit's ExecCondition= skips it).
		root := debRoot(t, bin, configured)
		postinst(t, root, "configure")
		setConfig(t, root, shipped)
		if out := postinst(t, root, "configure", "0.0.1"); !enabled(t, root) {
			t.Errorf("an upgrade disabled an enabled unit:\n%s", out)
		}
	})
}

// dpkgEnv is the environment dpkg gives a maintainer script of spotguard, under DPKG_ROOT root.
func dpkgEnv(root, script string) []string {
	return []string{"DPKG_ROOT=" + root, "DPKG_MAINTSCRIPT_PACKAGE=spotguard", "DPKG_MAINTSCRIPT_NAME=" + script}
}

func mustRun(t *testing.T, cmd *exec.Cmd) {
	t.Helper()
	if out, err := cmd.CombinedOutput(); err != nil {
		t.Fatalf("%v: %v\n%s", cmd.Args, err, out)
	}
}

// The .deb's purge under DPKG_ROOT (dpkg --root) removes the state directory under that root,
// not the running machine's, and never calls the running machine's systemctl (found from
// outside: prerm and postrm ignored DPKG_ROOT, which postinst honours).
func TestDebRemoveAndPurgeStayUnderDPKGRoot(t *testing.T) {
	root := t.TempDir()
	state := filepath.Join(root, "var", "lib", "spotguard")
	if err := os.MkdirAll(state, 0o700); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(state, "x"), nil, 0o600); err != nil {
		t.Fatal(err)
	}
	// A systemctl that records its calls, first on PATH.
	bin, calls := t.TempDir(), filepath.Join(t.TempDir(), "calls")
	if err := os.WriteFile(filepath.Join(bin, "systemctl"), []byte("#!/bin/sh\necho \"$@\" >> "+calls+"\n"), 0o755); err != nil {
		t.Fatal(err)
	}
	for _, step := range []struct{ script, arg string }{{"prerm", "remove"}, {"postrm", "remove"}, {"postrm", "purge"}} {
		cmd := exec.Command("sh", filepath.Join(repoRoot(t), "systemd", "deb", step.script), step.arg)
		cmd.Env = append(os.Environ(), dpkgEnv(root, step.script)...)
		cmd.Env = append(cmd.Env, "PATH="+bin+":"+os.Getenv("PATH"))
		if out, err := cmd.CombinedOutput(); err != nil {
			t.Fatalf("%s %s: %v\n%s", step.script, step.arg, err, out)
		}
	}
	if _, err := os.Stat(state); !errors.Is(err, fs.ErrNotExist) {
		t.Errorf("after a purge under DPKG_ROOT, %s: %v; want it removed", state, err)
	}
	if data, err := os.ReadFile(calls); err == nil {
		t.Errorf("under DPKG_ROOT, the maintainer scripts ran the running machine's systemctl: %s", data)
	}
}
