package systemd

import (
	"bufio"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"io/fs"
	"maps"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"slices"
	"strings"
	"testing"
)

// installScript runs systemd/install.sh with /bin/sh (dash on Debian: POSIX only) under destdir
// and returns its output and exit code.
func installScript(t *testing.T, destdir string, args ...string) (string, int) {
	t.Helper()
	cmd := exec.Command("sh", append([]string{filepath.Join(repoRoot(t), "systemd", "install.sh")}, args...)...)
	cmd.Env = append(os.Environ(), "DESTDIR="+destdir)
	out, err := cmd.CombinedOutput()
	var exit *exec.ExitError
	switch {
	case err == nil:
		return string(out), 0
	case errors.As(err, &exit):
		return string(out), exit.ExitCode()
	default:
		t.Fatalf("install.sh %v: %v", args, err)
		return "", -1
	}
}

// mustInstall runs install.sh and fails the test unless it exits 0.
func mustInstall(t *testing.T, destdir string, args ...string) string {
	t.Helper()
	out, code := installScript(t, destdir, args...)
	if code != 0 {
		t.Fatalf("install.sh %v: exit %d\n%s", args, code, out)
	}
	t.Logf("install.sh %v:\n%s", args, out)
	return out
}

// fakeBinary writes an executable stand-in for bin/spotguard that prints text when run without
// arguments, and nothing (checkpoint.dir unset, to install.sh) with them.
func fakeBinary(t *testing.T, text string) string {
	t.Helper()
	p := filepath.Join(t.TempDir(), "spotguard")
	if err := os.WriteFile(p, []byte("#!/bin/sh\n[ $# -gt 0 ] || echo "+text+"\n"), 0o700); err != nil {
		t.Fatal(err)
	}
	return p
}

// fileState is what the tests compare of an installed file.
type fileState struct {
	mode    fs.FileMode
	content string
	mtime   int64 // nanoseconds: a file written again, even with the same content, differs
}

// tree returns every regular file and symbolic link under root, by path relative to root.
func tree(t *testing.T, root string) map[string]fileState {
	t.Helper()
	files := map[string]fileState{}
	err := filepath.WalkDir(root, func(path string, d fs.DirEntry, err error) error {
		if err != nil || d.IsDir() {
			return err
		}
		info, err := d.Info()
		if err != nil {
			return err
		}
		var content string
		if info.Mode().IsRegular() {
			data, err := os.ReadFile(path)
			if err != nil {
				return err
			}
			content = string(data)
		}
		rel, _ := filepath.Rel(root, path)
		files[rel] = fileState{mode: info.Mode(), content: content, mtime: info.ModTime().UnixNano()}
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	return files
}

func readFile(t *testing.T, path string) string {
	t.Helper()
	data, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	return string(data)
}

func sha256Hex(s string) string {
	sum := sha256.Sum256([]byte(s))
	return hex.EncodeToString(sum[:])
}

const (
	binPath  = "usr/local/bin/spotguard"
	confPath = "etc/spotguard/spotguard.yaml"
	sumPath  = "etc/spotguard/.spotguard.yaml.default.sha256"
)

// TestInstall installs into a temporary DESTDIR and follows one life cycle: install, install
// again (nothing changes), edit the config (it is kept), a new binary (only it changes),
// uninstall (only the edited config stays), remove that config and uninstall again (nothing
// of ours is left).
func TestInstall(t *testing.T) {
	root := repoRoot(t)
	dest := t.TempDir()
	bin := fakeBinary(t, "v1")
	shippedConf := readFile(t, filepath.Join(root, "systemd", "spotguard.yaml"))

	out := mustInstall(t, dest, "--binary", bin)
	want := map[string]struct {
		mode    fs.FileMode
		content string
	}{
		binPath:                                {0o755, readFile(t, bin)},
		"etc/systemd/system/spotguard.service": {0o644, readFile(t, filepath.Join(root, "systemd", "spotguard.service"))},
		"etc/systemd/system/spotguard-restore.service": {0o644, readFile(t, filepath.Join(root, "systemd", "spotguard-restore.service"))},
		confPath: {0o644, shippedConf},
		sumPath:  {0o644, sha256Hex(shippedConf) + "  spotguard.yaml\n"},
	}
	got := tree(t, dest)
	if !slices.Equal(slices.Sorted(maps.Keys(got)), slices.Sorted(maps.Keys(want))) {
		t.Fatalf("installed files = %v; want %v", slices.Sorted(maps.Keys(got)), slices.Sorted(maps.Keys(want)))
	}
	for p, w := range want {
		if got[p].mode != w.mode {
			t.Errorf("Mode(%q) = %v; want %v", p, got[p].mode, w.mode)
		}
		if got[p].content != w.content {
			t.Errorf("Content(%q) differs from what was shipped", p)
		}
	}
	if !strings.Contains(out, "skipped    systemctl (DESTDIR is set)") {
		t.Errorf("install.sh with DESTDIR did not say it skipped systemctl:\n%s", out)
	}

	// Again: nothing is written, and it says so.
	before := tree(t, dest)
	out = mustInstall(t, dest, "--binary", bin)
	if !strings.Contains(out, "nothing to do") {
		t.Errorf("second install.sh did not say there was nothing to do:\n%s", out)
	}
	if after := tree(t, dest); !maps.Equal(before, after) {
		t.Errorf("second install.sh changed files:\nbefore %v\nafter  %v", before, after)
	}

	// An edited config is left as it is, and it says so.
	edited := shippedConf + "trainer:\n  unit: trainer.service\n"
	if err := os.WriteFile(filepath.Join(dest, confPath), []byte(edited), 0o644); err != nil {
		t.Fatal(err)
	}
	before = tree(t, dest)
	out = mustInstall(t, dest, "--binary", bin)
	if !strings.Contains(out, "kept       "+filepath.Join(dest, confPath)) {
		t.Errorf("install.sh over an edited config did not say it kept it:\n%s", out)
	}
	if after := tree(t, dest); !maps.Equal(before, after) {
		t.Errorf("install.sh over an edited config changed files:\nbefore %v\nafter  %v", before, after)
	}

	// A new binary replaces the old one; nothing else changes.
	bin2 := fakeBinary(t, "v2")
	out = mustInstall(t, dest, "--binary", bin2)
	if !strings.Contains(out, "updated    "+filepath.Join(dest, binPath)) {
		t.Errorf("install.sh with a new binary did not say it updated it:\n%s", out)
	}
	after := tree(t, dest)
	for p := range before {
		if changed := before[p] != after[p]; changed != (p == binPath) {
			t.Errorf("after a new binary, Changed(%q) = %v; want %v", p, changed, p == binPath)
		}
	}
	if after[binPath].content != readFile(t, bin2) {
		t.Errorf("%s is not the new binary", binPath)
	}

	// Uninstall: everything goes but the edited config.
	out = mustInstall(t, dest, "--uninstall")
	if !strings.Contains(out, "kept       "+filepath.Join(dest, confPath)) {
		t.Errorf("uninstall did not say it kept the edited config:\n%s", out)
	}
	if got := slices.Sorted(maps.Keys(tree(t, dest))); !slices.Equal(got, []string{confPath}) {
		t.Errorf("after uninstall, files = %v; want only the edited %s", got, confPath)
	}
	if got := readFile(t, filepath.Join(dest, confPath)); got != edited {
		t.Errorf("uninstall changed the edited config")
	}

	// Without it, uninstall leaves nothing of ours, /etc/spotguard included; a third run has
	// nothing to do.
	if err := os.Remove(filepath.Join(dest, confPath)); err != nil {
		t.Fatal(err)
	}
	mustInstall(t, dest, "--uninstall")
	if got := tree(t, dest); len(got) != 0 {
		t.Errorf("after the second uninstall, files = %v; want none", slices.Sorted(maps.Keys(got)))
	}
	if _, err := os.Stat(filepath.Join(dest, "etc", "spotguard")); !errors.Is(err, fs.ErrNotExist) {
		t.Errorf("after the second uninstall, Stat(etc/spotguard) = %v; want it gone", err)
	}
	if out := mustInstall(t, dest, "--uninstall"); !strings.Contains(out, "nothing to do") {
		t.Errorf("a third uninstall did not say there was nothing to do:\n%s", out)
	}
}

// TestInstallUneditedOldDefault: a config that is the unedited default of an earlier version
// (its checksum is the recorded one) is replaced by the new default, and uninstall removes it.
func TestInstallUneditedOldDefault(t *testing.T) {
	dest := t.TempDir()
	bin := fakeBinary(t, "v1")
	mustInstall(t, dest, "--binary", bin)

	old := "# the default of an earlier version\nimds:\n"
	if err := os.WriteFile(filepath.Join(dest, confPath), []byte(old), 0o644); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(dest, sumPath), []byte(sha256Hex(old)+"  spotguard.yaml\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	out := mustInstall(t, dest, "--binary", bin)
	shipped := readFile(t, filepath.Join(repoRoot(t), "systemd", "spotguard.yaml"))
	if got := readFile(t, filepath.Join(dest, confPath)); got != shipped {
		t.Errorf("an unedited old default was not replaced by the shipped one:\n%s", out)
	}
	if got := readFile(t, filepath.Join(dest, sumPath)); got != sha256Hex(shipped)+"  spotguard.yaml\n" {
		t.Errorf("checksum file = %q; want the shipped default's", got)
	}
	mustInstall(t, dest, "--uninstall")
	if got := tree(t, dest); len(got) != 0 {
		t.Errorf("after uninstall, files = %v; want none (the config was not edited)", slices.Sorted(maps.Keys(got)))
	}
}

// TestInstallArguments covers --help, a bad argument and a missing binary.
func TestInstallArguments(t *testing.T) {
	for _, c := range []struct {
		name     string
		args     []string
		wantCode int
		wantOut  string
	}{
		{"help", []string{"--help"}, 0, "DESTDIR"},
		{"unknown_argument", []string{"--now"}, 2, "unknown argument: --now"},
		{"binary_without_path", []string{"--binary"}, 2, "--binary needs a PATH"},
		{"missing_binary", []string{"--binary", "/nonexistent/spotguard"}, 1, "no binary at /nonexistent/spotguard"},
	} {
		t.Run(c.name, func(t *testing.T) {
			dest := t.TempDir()
			out, code := installScript(t, dest, c.args...)
			if code != c.wantCode || !strings.Contains(out, c.wantOut) {
				t.Errorf("install.sh %v = exit %d, %q; want exit %d and %q", c.args, code, out, c.wantCode, c.wantOut)
			}
			if c.wantCode != 0 {
				if files := tree(t, dest); len(files) != 0 {
					t.Errorf("install.sh %v wrote %v", c.args, slices.Sorted(maps.Keys(files)))
				}
			}
		})
	}
}

// buildSpotguard builds the agent from this checkout into a temporary directory.
func buildSpotguard(t *testing.T) string {
	t.Helper()
	bin := filepath.Join(t.TempDir(), "spotguard")
	cmd := exec.Command("go", "build", "-o", bin, "./cmd/spotguard")
	cmd.Dir = repoRoot(t)
	if out, err := cmd.CombinedOutput(); err != nil {
		t.Fatalf("go build ./cmd/spotguard: %v\n%s", err, out)
	}
	return bin
}

// configOutput runs `spotguard config --config path` and returns each key's value, as
// "section.key" → value, and the problems it lists.
func configOutput(t *testing.T, bin, path string) (values map[string]string, problems []string) {
	t.Helper()
	cmd := exec.Command(bin, "config", "--config", path)
	cmd.Env = []string{"PATH=" + os.Getenv("PATH")} // no SPOTGUARD_* from the test's environment
	var stdout, stderr strings.Builder
	cmd.Stdout, cmd.Stderr = &stdout, &stderr
	err := cmd.Run()
	var exit *exec.ExitError
	if err != nil && !errors.As(err, &exit) {
		t.Fatal(err)
	}
	values = map[string]string{}
	section := ""
	sc := bufio.NewScanner(strings.NewReader(stdout.String()))
	for sc.Scan() {
		line := sc.Text()
		switch {
		case strings.HasPrefix(line, "  "):
			k, v, _ := strings.Cut(strings.TrimSpace(line), ": ")
			v, _, _ = strings.Cut(v, "  # ")
			values[section+"."+k] = v
		case strings.HasSuffix(line, ":"):
			section = strings.TrimSuffix(line, ":")
		}
	}
	for _, line := range strings.Split(stderr.String(), "\n") {
		if p, ok := strings.CutPrefix(line, "  - "); ok {
			problems = append(problems, p)
		}
	}
	if (err == nil) != (len(problems) == 0) {
		t.Fatalf("spotguard config --config %s: %v with problems %q", path, err, problems)
	}
	return values, problems
}

// keyLine is a commented-out key in systemd/spotguard.yaml: "  # key: value".
var keyLine = regexp.MustCompile(`(?m)^  # ([a-z_]+): (.*)$`)

// TestDefaultConfig checks systemd/spotguard.yaml against the binary: as shipped, its only
// problem is that the trainer cannot be found (the service must refuse to start until that is
// set); with every key uncommented it is valid, names every key the agent has, and each value
// is the agent's default, but for the trainer examples.
func TestDefaultConfig(t *testing.T) {
	bin := buildSpotguard(t)
	shipped := filepath.Join(repoRoot(t), "systemd", "spotguard.yaml")

	_, problems := configOutput(t, bin, shipped)
	if len(problems) != 1 || !strings.HasPrefix(problems[0], "trainer: no way to find the trainer") {
		t.Errorf("spotguard config on the shipped default: problems %q; want only that the trainer cannot be found", problems)
	}

	uncommented := filepath.Join(t.TempDir(), "spotguard.yaml")
	if err := os.WriteFile(uncommented, []byte(keyLine.ReplaceAllString(readFile(t, shipped), "  $1: $2")), 0o644); err != nil {
		t.Fatal(err)
	}
	got, problems := configOutput(t, bin, uncommented)
	if len(problems) != 0 {
		t.Errorf("spotguard config with every key uncommented: problems %q; want none", problems)
	}
	empty := filepath.Join(t.TempDir(), "empty.yaml")
	if err := os.WriteFile(empty, nil, 0o644); err != nil {
		t.Fatal(err)
	}
	defaults, _ := configOutput(t, bin, empty)
	if len(defaults) == 0 {
		t.Fatal("spotguard config printed no keys")
	}
	examples := map[string]bool{"trainer.unit": true, "trainer.pidfile": true, "trainer.match": true}
	for key, def := range defaults {
		switch v, ok := got[key]; {
		case !ok:
			t.Errorf("key %s: missing from spotguard config's output", key)
		case examples[key]:
			if v == "" || v == `""` {
				t.Errorf("key %s: want an example in the shipped config", key)
			}
		case v != def:
			t.Errorf("key %s: the shipped config says %s; the default is %s", key, v, def)
		}
	}
	// Every key must be in the file, not only in the defaults.
	inFile := map[string]bool{}
	section := ""
	for _, line := range strings.Split(readFile(t, shipped), "\n") {
		if s, ok := strings.CutSuffix(line, ":"); ok && !strings.HasPrefix(line, " ") && !strings.HasPrefix(line, "#") {
			section = s
		}
		if m := keyLine.FindStringSubmatch(line); m != nil {
			inFile[section+"."+m[1]] = true
		}
	}
	for key := range defaults {
		if !inFile[key] {
			t.Errorf("key %s: not in systemd/spotguard.yaml", key)
		}
	}
}

// TestInstallRestoreMounts: with the real binary, install.sh orders the restore unit after the
// mount of its destination (checkpoint.dir, or RESTORE_TO), follows changes to either when run
// again, removes the drop-in when neither is set, and uninstall removes it.
func TestInstallRestoreMounts(t *testing.T) {
	bin := filepath.Join(t.TempDir(), "spotguard")
	build := exec.Command("go", "build", "-o", bin, "./cmd/spotguard")
	build.Dir = repoRoot(t)
	if out, err := build.CombinedOutput(); err != nil {
		t.Fatalf("go build: %v\n%s", err, out)
	}
	dest := t.TempDir()
	dropin := filepath.Join(dest, "etc/systemd/system/spotguard-restore.service.d/10-spotguard-mounts.conf")
	requires := func() string {
		t.Helper()
		data, err := os.ReadFile(dropin)
		if errors.Is(err, fs.ErrNotExist) {
			return "(none)"
		}
		if err != nil {
			t.Fatal(err)
		}
		for line := range strings.SplitSeq(string(data), "\n") {
			if v, ok := strings.CutPrefix(line, "RequiresMountsFor="); ok {
				return v
			}
		}
		t.Fatalf("%s has no RequiresMountsFor=:\n%s", dropin, data)
		return ""
	}

	// The shipped default has no checkpoint.dir: no drop-in.
	mustInstall(t, dest, "--binary", bin)
	if got := requires(); got != "(none)" {
		t.Errorf("with the shipped config, RequiresMountsFor=%s; want no drop-in", got)
	}

	conf := filepath.Join(dest, confPath)
	shipped := readFile(t, conf)
	if err := os.WriteFile(conf, []byte("checkpoint:\n  dir: /opt/dlami/nvme/100%/ckpt\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	out := mustInstall(t, dest, "--binary", bin)
	if got := requires(); got != "/opt/dlami/nvme/100%%/ckpt" {
		t.Errorf("with checkpoint.dir set, RequiresMountsFor=%s; want the directory, %% escaped", got)
	}
	if !strings.Contains(out, "installed  "+dropin) {
		t.Errorf("install.sh did not say it installed the drop-in:\n%s", out)
	}
	if out := mustInstall(t, dest, "--binary", bin); !strings.Contains(out, "nothing to do") {
		t.Errorf("a second install.sh changed something:\n%s", out)
	}

	// RESTORE_TO wins over checkpoint.dir.
	envfile := filepath.Join(dest, "etc/default/spotguard-restore")
	os.MkdirAll(filepath.Dir(envfile), 0o755)
	if err := os.WriteFile(envfile, []byte("# where\nRESTORE_TO=\"/mnt/scratch/ckpt\"\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	mustInstall(t, dest, "--binary", bin)
	if got := requires(); got != "/mnt/scratch/ckpt" {
		t.Errorf("with RESTORE_TO set, RequiresMountsFor=%s; want RESTORE_TO", got)
	}

	// A RESTORE_TO that is not an absolute path: the drop-in is left as it was, and it says so,
	// naming what it still says (found from outside: left silently).
	if err := os.WriteFile(envfile, []byte("RESTORE_TO=ckpt\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	out = mustInstall(t, dest, "--binary", bin)
	if got := requires(); got != "/mnt/scratch/ckpt" || !strings.Contains(out, "is not an absolute path") ||
		!strings.Contains(out, "left as it was: the drop-in there still says RequiresMountsFor=/mnt/scratch/ckpt") {
		t.Errorf("with a relative RESTORE_TO, RequiresMountsFor=%s; want it untouched, and said:\n%s", got, out)
	}

	// A configuration that does not load: the drop-in is left as it was, and it says why.
	os.Remove(envfile)
	if err := os.WriteFile(conf, []byte("checkpoint:\n  dir: [\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	out = mustInstall(t, dest, "--binary", bin)
	if got := requires(); got != "/mnt/scratch/ckpt" || !strings.Contains(out, "left as it was") {
		t.Errorf("with a broken config, RequiresMountsFor=%s; want it untouched, and said:\n%s", got, out)
	}

	// Neither set: the drop-in goes, its directory with it.
	if err := os.WriteFile(conf, []byte(shipped+"# edited\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	mustInstall(t, dest, "--binary", bin)
	if got := requires(); got != "(none)" {
		t.Errorf("with neither set, RequiresMountsFor=%s; want no drop-in", got)
	}
	if _, err := os.Stat(filepath.Dir(dropin)); !errors.Is(err, fs.ErrNotExist) {
		t.Errorf("the empty drop-in directory was left: %v", err)
	}

	// Uninstall removes it.
	os.WriteFile(conf, []byte("checkpoint:\n  dir: /data/ckpt\n"), 0o644)
	mustInstall(t, dest, "--binary", bin)
	if got := requires(); got != "/data/ckpt" {
		t.Fatalf("RequiresMountsFor=%s; want /data/ckpt", got)
	}
	mustInstall(t, dest, "--uninstall")
	if _, err := os.Stat(filepath.Dir(dropin)); !errors.Is(err, fs.ErrNotExist) {
		t.Errorf("uninstall left %s: %v", filepath.Dir(dropin), err)
	}
}
