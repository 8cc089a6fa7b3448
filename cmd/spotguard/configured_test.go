package main

import (
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/spotguard/spotguard/agent"
)

// TestConfigConfigured: `spotguard config --configured`, spotguard.service's ExecCondition=,
// exits 1 (systemd skips the unit) only for a configuration nobody has set anything in, the
// shipped default among them; anything set anywhere, and any configuration that does not load,
// exits 0, so that `spotguard run` refuses it loudly instead of the unit being skipped quietly.
func TestConfigConfigured(t *testing.T) {
	dir := t.TempDir()
	write := func(name, text string) string {
		t.Helper()
		p := filepath.Join(dir, name)
		if err := os.WriteFile(p, []byte(text), 0o644); err != nil {
			t.Fatal(err)
		}
		return p
	}
	shipped, err := filepath.Abs("../../systemd/spotguard.yaml")
	if err != nil {
		t.Fatal(err)
	}
	for _, c := range []struct {
		name     string
		path     string
		env      []string
		flags    []string
		wantCode int
	}{
		{"shipped_default", shipped, nil, nil, exitFail},
		{"empty_file", write("empty.yaml", ""), nil, nil, exitFail},
		{"comments_and_empty_sections", write("comments.yaml", "# nothing yet\nimds:\ntrainer:\n"), nil, nil, exitFail},
		{"a_key_in_the_file", write("key.yaml", "log:\n  level: debug\n"), nil, nil, exitOK},
		{"a_key_set_to_its_default", write("default.yaml", "trainer:\n  signal: SIGUSR1\n"), nil, nil, exitOK},
		{"valid", write("valid.yaml", "trainer:\n  unit: trainer.service\n"), nil, nil, exitOK},
		{"an_environment_variable", shipped, []string{"SPOTGUARD_TRAINER_UNIT=trainer.service"}, nil, exitOK},
		{"a_flag", shipped, nil, []string{"--trainer.unit", "trainer.service"}, exitOK},
		{"not_yaml", write("broken.yaml", "trainer: [\n"), nil, nil, exitOK},
		{"unknown_key", write("unknown.yaml", "trainer:\n  colour: blue\n"), nil, nil, exitOK},
		{"unknown_variable", shipped, []string{"SPOTGUARD_NO_SUCH=1"}, nil, exitOK},
		{"missing_file", filepath.Join(dir, "absent.yaml"), nil, nil, exitOK},
	} {
		t.Run(c.name, func(t *testing.T) {
			args := append([]string{"config", "--configured", "--config", c.path}, c.flags...)
			code, stdout, stderr := runCLI(t, t.Context(), c.env, args...)
			if code != c.wantCode {
				t.Errorf("Got(%q) exit = %d; want %d (stderr %q)", args, code, c.wantCode, stderr)
			}
			if stdout != "" {
				t.Errorf("Got(%q) stdout = %q; want nothing", args, stdout)
			}
			if c.wantCode == exitFail && !strings.Contains(stderr, "not configured yet: "+c.path+" sets no key") {
				t.Errorf("Got(%q) stderr = %q; want it to say the configuration is not set yet", args, stderr)
			}
			if c.wantCode == exitOK && c.name == "valid" && stderr != "" {
				t.Errorf("Got(%q) stderr = %q; want nothing for a configured agent", args, stderr)
			}
		})
	}
}

// With no file at the default path (loaded as no key set), --configured says there is none,
// not that the file sets no key.
func TestConfigConfiguredWithoutAFile(t *testing.T) {
	cfg, err := agent.Load(agent.LoadOptions{})
	if err != nil {
		t.Fatal(err)
	}
	absent := filepath.Join(t.TempDir(), "spotguard.yaml")
	var stderr strings.Builder
	if code := configured(cfg, absent, &stderr); code != exitFail || !strings.Contains(stderr.String(), "not configured yet: there is no "+absent+" (") {
		t.Errorf("configured(no file) = %d, %q; want %d saying there is no %s", code, stderr.String(), exitFail, absent)
	}
}
