package main

import (
	"fmt"
	"os"
	"path/filepath"
	"regexp"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/spotguard/spotguard/agent"
)

// helpGolden is where the help of command name is kept; "spotguard" is `spotguard -h`.
func helpGolden(name string) string {
	return filepath.Join("testdata", "help", name+".golden")
}

// helpMaxLines is the most lines a command's help may have: it fits in a screen. `config -h`,
// which lists every configuration key, is the exception.
const helpMaxLines = 50

// Every command's -h is kept in testdata/help/<command>.golden, so that a change in help is a
// reviewed diff (go test ./cmd/spotguard -run TestHelpGolden -update rewrites them). The help
// lists the command's own flags and none of the configuration keys (only `config -h` does), fits
// in a screen, and no line is wider than helpWidth.
func TestHelpGolden(t *testing.T) {
	cases := map[string][]string{"spotguard": {"-h"}}
	for _, c := range commands() {
		cases[c.name] = []string{c.name, "-h"}
	}
	for name, args := range cases {
		t.Run(name, func(t *testing.T) {
			code, stdout, stderr := runCLI(t, t.Context(), nil, args...)
			if code != exitOK || stderr != "" {
				t.Fatalf("Got(%q) = %d, stderr %q; want 0, help on stdout and nothing on stderr", args, code, stderr)
			}
			golden := helpGolden(name)
			if *update {
				if err := os.MkdirAll(filepath.Dir(golden), 0o755); err != nil {
					t.Fatal(err)
				}
				if err := os.WriteFile(golden, []byte(stdout), 0o644); err != nil {
					t.Fatal(err)
				}
			}
			want, err := os.ReadFile(golden)
			if err != nil {
				t.Fatalf("%s has no golden help file: %v (go test ./cmd/spotguard -run TestHelpGolden -update writes it; review it)", name, err)
			}
			if stdout != string(want) {
				t.Errorf("Got(%q) differs from %s (go test ./cmd/spotguard -run TestHelpGolden -update to accept):\n--- got\n%s--- want\n%s", args, golden, stdout, want)
			}

			for i, line := range strings.Split(strings.TrimSuffix(stdout, "\n"), "\n") {
				if len(line) > helpWidth {
					t.Errorf("Got(%q) line %d is %d wide; want at most %d: %q", args, i+1, len(line), helpWidth, line)
				}
			}
			if n := strings.Count(stdout, "\n"); n > helpMaxLines && name != "config" {
				t.Errorf("Got(%q) has %d lines; want at most %d (a screen)", args, n, helpMaxLines)
			}
			// A key is listed when a line starts with its flag; only config lists them, all of them.
			for _, k := range agent.Keys() {
				listed := regexp.MustCompile(`(?m)^\s*--?` + regexp.QuoteMeta(k.Name) + `\b`).MatchString(stdout)
				if want := name == "config"; listed != want {
					t.Errorf("Got(%q) lists the configuration key --%s: %v; want %v (only spotguard config -h lists keys)", args, k.Name, listed, want)
				}
			}
		})
	}

	// No golden file is left for a command that is gone.
	files, err := filepath.Glob(filepath.Join("testdata", "help", "*.golden"))
	if err != nil {
		t.Fatal(err)
	}
	for _, f := range files {
		if name := strings.TrimSuffix(filepath.Base(f), ".golden"); cases[name] == nil {
			t.Errorf("%s is the help of no command; remove it", f)
		}
	}
}

// `spotguard config -h` is where every configuration key is listed: with its flag, its default
// and its environment variable, each on the key's line.
func TestConfigHelpListsEveryKey(t *testing.T) {
	code, stdout, _ := runCLI(t, t.Context(), nil, "config", "-h")
	if code != exitOK {
		t.Fatalf("config -h = %d; want 0", code)
	}
	for _, k := range agent.Keys() {
		def := k.Default
		if def == "" {
			def = "empty"
		}
		want := fmt.Sprintf("\n  --%s (default %s, env %s)\n", k.Name, def, k.Env)
		if !strings.Contains(stdout, want) {
			t.Errorf("config -h lacks %q", want)
		}
	}
}

// Key flags are parsed by every command that loads the configuration, though no help but
// `config -h` lists them; --log-level, the old spelling of --log.level, still works too.
func TestKeyFlagsWorkOnEveryCommand(t *testing.T) {
	cfgPath := filepath.Join(t.TempDir(), "empty.yaml")
	os.WriteFile(cfgPath, nil, 0o644)
	for _, args := range [][]string{
		{"config", "--config", cfgPath, "--get", "checkpoint.keep", "--checkpoint.keep", "7"},
		{"config", "--config", cfgPath, "--checkpoint.keep=7", "--get", "checkpoint.keep"},
	} {
		code, stdout, stderr := runCLI(t, t.Context(), nil, args...)
		if code != exitOK || stdout != "7\n" {
			t.Errorf("Got(%q) = %d, %q, %q; want 0 and 7", args, code, stdout, stderr)
		}
	}
	code, stdout, stderr := runCLI(t, t.Context(), nil, "config", "--config", cfgPath, "--log-level", "debug", "--get", "log.level")
	if code != exitOK || stdout != "debug\n" {
		t.Errorf("config --log-level debug --get log.level = %d, %q, %q; want 0 and debug", code, stdout, stderr)
	}
	// Every command that loads the configuration parses them (-h after them: nothing runs), the
	// others do not have them.
	for _, c := range commands() {
		args := []string{c.name, "--log.level", "debug", "--imds.poll_interval=2s", "--log-level", "warn", "-h"}
		code, _, stderr := runCLI(t, t.Context(), nil, args...)
		want := exitOK
		if c.name == "plan" || c.name == "version" {
			want = exitUsage
		}
		if code != want {
			t.Errorf("Got(%q) = %d, %q; want %d", args, code, stderr, want)
		}
	}
	// And the value reaches the configuration (here a store that cannot be, or a listener that is
	// not one) rather than being refused as an unknown flag.
	for _, args := range [][]string{
		{"run", "--config", cfgPath, "--trainer.match", "x", "--store.url", "ftp://nowhere", "--http.listen", ""},
		{"config", "--config", cfgPath, "--store.url", "ftp://nowhere"},
		{"restore", "--config", cfgPath, "--store.url", "ftp://nowhere", "--store.job", "j", "--to", t.TempDir()},
		{"list", "--config", cfgPath, "--store.url", "ftp://nowhere", "--store.job", "j"},
		{"notify", "--config", cfgPath, "--http.listen", "nonsense", "--deadline", time.Now().Add(time.Minute).UTC().Format(time.RFC3339)},
	} {
		code, _, stderr := runCLI(t, t.Context(), nil, args...)
		if code != exitFail || strings.Contains(stderr, "not defined") || !strings.Contains(stderr, "nowhere") && !strings.Contains(stderr, "nonsense") {
			t.Errorf("Got(%q) = %d, %q; want 1 and the key's value refused by the configuration, not the flag", args, code, stderr)
		}
	}
}

// A usage error is two lines on stderr: the problem, and where the flags are; exit 2, nothing
// on stdout. Every command answers so.
func TestUsageErrorsAreTwoLines(t *testing.T) {
	type tc struct {
		args []string
		want []string // the two lines
	}
	var tests []tc
	for _, c := range commands() {
		tests = append(tests, tc{[]string{c.name, "--no-such-flag"}, []string{
			"spotguard " + c.name + ": flag provided but not defined: --no-such-flag",
			"run 'spotguard " + c.name + " -h' for its flags",
		}})
	}
	names := "commands: drill, run, doctor, restore, list, notify, gpu, plan, config, version (run 'spotguard -h' for what each does)"
	tests = append(tests,
		tc{[]string{"frobnicate"}, []string{`spotguard: unknown command "frobnicate"`, names}},
		tc{[]string{"--store.url", "s3://b/p", "run"}, []string{"spotguard: --store.url before a command: flags go after the command (spotguard <command> --store.url ...)", names}},
		tc{[]string{"config", "extra"}, []string{`spotguard config: unexpected argument "extra"`, "run 'spotguard config -h' for its flags"}},
		tc{[]string{"version", "x"}, []string{`spotguard version: unexpected argument "x"`, "run 'spotguard version -h' for its flags"}},
		tc{[]string{"restore", "--to"}, []string{"spotguard restore: flag needs an argument: --to", "run 'spotguard restore -h' for its flags"}},
		tc{[]string{"restore", "--commit", "c1"}, []string{"spotguard restore: --commit needs --checkpoint", "run 'spotguard restore -h' for its flags"}},
		tc{[]string{"restore", "--checkpoint", ""}, []string{"spotguard restore: --checkpoint is empty: give a value, or leave the flag out", "run 'spotguard restore -h' for its flags"}},
		tc{[]string{"restore", "--checkpoint", "step-1", "--commit="}, []string{"spotguard restore: --commit is empty: give a value, or leave the flag out", "run 'spotguard restore -h' for its flags"}},
		tc{[]string{"restore", "--imds.pollinterval", "1s"}, []string{"spotguard restore: flag provided but not defined: --imds.pollinterval", "run 'spotguard config -h' for the configuration keys"}},
		tc{[]string{"drill", "--files", "0"}, []string{"spotguard drill: --files 0: want at least 1", "run 'spotguard drill -h' for its flags"}},
		tc{[]string{"help", "restore", "x"}, []string{`spotguard help: unexpected argument "x"`, "run 'spotguard -h' for the commands"}},
	)
	for _, tt := range tests {
		t.Run(strings.Join(tt.args, " "), func(t *testing.T) {
			code, stdout, stderr := runCLI(t, t.Context(), nil, tt.args...)
			if code != exitUsage {
				t.Errorf("Got(%q) exit = %d; want %d", tt.args, code, exitUsage)
			}
			if got := strings.Split(strings.TrimSuffix(stderr, "\n"), "\n"); !slices.Equal(got, tt.want) {
				t.Errorf("Got(%q) stderr = %q; want the two lines %q", tt.args, got, tt.want)
			}
			if stdout != "" {
				t.Errorf("Got(%q) stdout = %q; want nothing", tt.args, stdout)
			}
		})
	}
}

// drill has a store, a checkpoint directory and a job of its own, never the configuration's: the
// key flags that would name them are refused, pointing to drill's own flag, before anything runs
// (they used to be taken and silently replaced by the drill's).
func TestDrillRefusesTheKeyFlagsItOwns(t *testing.T) {
	for _, tt := range []struct {
		args []string
		want string
	}{
		{[]string{"--store.url", "s3://my-bucket/ckpt"}, "spotguard drill: --store.url is not used by drill: its store is --store URL"},
		{[]string{"--checkpoint.dir=/data/ckpt"}, "spotguard drill: --checkpoint.dir is not used by drill: its trainer writes into --checkpoint-dir DIR"},
		{[]string{"--store.job", "llama"}, "spotguard drill: --store.job is not used by drill: it commits under a job of its own (drill-<time>-<random>)"},
		{[]string{"--store.world_nodes", "4"}, "spotguard drill: --store.world_nodes is not used by drill: a job of N nodes is --nodes N"},
		{[]string{"--store.node_rank=1"}, "spotguard drill: --store.node_rank is not used by drill: --nodes N gives each node its rank"},
	} {
		code, stdout, stderr := runCLI(t, t.Context(), nil, append([]string{"drill", "--size", "1MiB"}, tt.args...)...)
		want := tt.want + "\nrun 'spotguard drill -h' for its flags\n"
		if code != exitUsage || stderr != want || stdout != "" {
			t.Errorf("Got(%q) = %d, %q, %q; want %d and %q", tt.args, code, stdout, stderr, exitUsage, want)
		}
	}
}

// --version and -version print what `spotguard version` prints; help CMD is CMD -h.
func TestVersionAndHelp(t *testing.T) {
	_, want, _ := runCLI(t, t.Context(), nil, "version")
	if !strings.HasPrefix(want, "spotguard ") {
		t.Fatalf("version = %q; want spotguard <version>", want)
	}
	for _, flag := range []string{"--version", "-version"} {
		code, stdout, stderr := runCLI(t, t.Context(), nil, flag)
		if code != exitOK || stdout != want || stderr != "" {
			t.Errorf("Got(%s) = %d, %q, %q; want 0 and %q", flag, code, stdout, stderr, want)
		}
	}
	for _, args := range [][]string{{"help"}, {"-h"}, {"--help"}, {"-help"}} {
		code, stdout, _ := runCLI(t, t.Context(), nil, args...)
		if code != exitOK || !strings.Contains(stdout, "Commands:\n  drill ") {
			t.Errorf("Got(%q) = %d, %q; want 0 and the commands", args, code, stdout)
		}
	}
	_, restoreHelp, _ := runCLI(t, t.Context(), nil, "restore", "-h")
	code, stdout, _ := runCLI(t, t.Context(), nil, "help", "restore")
	if code != exitOK || stdout != restoreHelp {
		t.Errorf("help restore = %d, %q; want restore -h", code, stdout)
	}
	// No command at all: the commands, on stderr, exit 2.
	code, stdout, stderr := runCLI(t, t.Context(), nil)
	if code != exitUsage || stdout != "" || !strings.Contains(stderr, "Commands:") {
		t.Errorf("no command = %d, %q, %q; want 2 and the commands on stderr", code, stdout, stderr)
	}
}
