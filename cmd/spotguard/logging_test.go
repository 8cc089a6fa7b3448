package main

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"os"
	"path/filepath"
	"regexp"
	"strings"
	"syscall"
	"testing"

	"github.com/rs/zerolog"
)

// journalStreamOf is what systemd would put in JOURNAL_STREAM for f: "DEVICE:INODE".
func journalStreamOf(t *testing.T, f *os.File) string {
	t.Helper()
	fi, err := f.Stat()
	if err != nil {
		t.Fatal(err)
	}
	st := fi.Sys().(*syscall.Stat_t)
	return fmt.Sprintf("%d:%d", st.Dev, st.Ino)
}

func createFile(t *testing.T, name string) *os.File {
	t.Helper()
	f, err := os.Create(filepath.Join(t.TempDir(), name))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { f.Close() })
	return f
}

// openPTY opens the master side of a new pseudo-terminal (a terminal to isatty), or skips.
func openPTY(t *testing.T) *os.File {
	t.Helper()
	f, err := os.OpenFile("/dev/ptmx", os.O_RDWR, 0)
	if err != nil {
		t.Skipf("no pseudo-terminal to test the console format on: %v", err)
	}
	t.Cleanup(func() { f.Close() })
	return f
}

func TestLogOutputOf(t *testing.T) {
	file := createFile(t, "stderr")
	other := createFile(t, "other")
	stream, otherStream := journalStreamOf(t, file), journalStreamOf(t, other)
	dev, _, _ := strings.Cut(stream, ":")
	tty := openPTY(t)
	r, w, err := os.Pipe()
	if err != nil {
		t.Fatal(err)
	}
	defer r.Close()
	defer w.Close()
	tests := []struct {
		name   string
		w      io.Writer
		stream string
		want   logOutput
	}{
		{"buffer", &bytes.Buffer{}, "", logJSON},
		{"buffer under systemd", &bytes.Buffer{}, stream, logJSON},
		{"file", file, "", logJSON},
		{"pipe", w, "", logJSON},
		{"journal stream", file, stream, logJournal},
		{"another file's stream (stderr redirected in a child)", file, otherStream, logJSON},
		{"same device, other inode", file, dev + ":1", logJSON},
		{"stream without inode", file, dev, logJSON},
		{"stream not numbers", file, "a:b", logJSON},
		{"terminal", tty, "", logConsole},
		{"terminal with another stream", tty, stream, logConsole},
		{"terminal that is the stream", tty, journalStreamOf(t, tty), logJournal},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			if got := logOutputOf(tt.w, tt.stream); got != tt.want {
				t.Errorf("Got(%q) = %v; want %v", tt.stream, got, tt.want)
			}
		})
	}
}

func TestJournalPriority(t *testing.T) {
	tests := []struct {
		level zerolog.Level
		want  int
	}{
		{zerolog.TraceLevel, 7},
		{zerolog.DebugLevel, 7},
		{zerolog.InfoLevel, 6},
		{zerolog.NoLevel, 6},
		{zerolog.WarnLevel, 4},
		{zerolog.ErrorLevel, 3},
		{zerolog.FatalLevel, 2},
		{zerolog.PanicLevel, 2},
	}
	for _, tt := range tests {
		if got := journalPriority(tt.level); got != tt.want {
			t.Errorf("Got(%v) = %d; want %d", tt.level, got, tt.want)
		}
	}
}

// TestNewLoggerJournal: under journald every line carries the priority of its level, before
// the JSON line it always was.
func TestNewLoggerJournal(t *testing.T) {
	f := createFile(t, "stderr")
	log := newLogger(f, []string{"JOURNAL_STREAM=" + journalStreamOf(t, f)}, zerolog.DebugLevel)
	log.Debug().Msg("a debug line")
	log.Info().Str("k", "v").Msg("an info line")
	log.Warn().Msg("a warning")
	log.Error().Str("err", "boom").Msg("an error")
	log.Log().Msg("no level")

	b, err := os.ReadFile(f.Name())
	if err != nil {
		t.Fatal(err)
	}
	want := []struct{ prefix, level, msg string }{
		{"<7>", "debug", "a debug line"},
		{"<6>", "info", "an info line"},
		{"<4>", "warn", "a warning"},
		{"<3>", "error", "an error"},
		{"<6>", "", "no level"},
	}
	lines := strings.Split(strings.TrimSuffix(string(b), "\n"), "\n")
	if len(lines) != len(want) {
		t.Fatalf("got %d lines; want %d:\n%s", len(lines), len(want), b)
	}
	for i, l := range lines {
		rest, ok := strings.CutPrefix(l, want[i].prefix)
		if !ok {
			t.Errorf("line %d = %q; want prefix %s", i, l, want[i].prefix)
			continue
		}
		var m map[string]any
		if err := json.Unmarshal([]byte(rest), &m); err != nil {
			t.Errorf("line %d after its prefix is not JSON: %q: %v", i, rest, err)
			continue
		}
		if m["message"] != want[i].msg || (want[i].level != "" && m["level"] != want[i].level) || m["time"] == nil {
			t.Errorf("line %d = %v; want level %q, message %q and a time", i, m, want[i].level, want[i].msg)
		}
		// In UTC to the millisecond: a notice's detection, signal and first file come within a
		// second (found from outside: a second's resolution told them apart by nothing).
		if ts, _ := m["time"].(string); len(ts) != len("2006-01-02T15:04:05.000Z") || !strings.HasSuffix(ts, "Z") || ts[19] != '.' {
			t.Errorf("line %d time %q; want RFC 3339 in UTC with milliseconds", i, m["time"])
		}
	}
}

// TestNewLoggerNotJournal: without journald (a pipe, a file, a stream that is not stderr's)
// lines are JSON as they always were, without a prefix.
func TestNewLoggerNotJournal(t *testing.T) {
	f := createFile(t, "stderr")
	other := createFile(t, "other")
	for name, env := range map[string][]string{
		"no JOURNAL_STREAM":     nil,
		"another file's stream": {"JOURNAL_STREAM=" + journalStreamOf(t, other)},
	} {
		t.Run(name, func(t *testing.T) {
			if err := f.Truncate(0); err != nil {
				t.Fatal(err)
			}
			if _, err := f.Seek(0, 0); err != nil {
				t.Fatal(err)
			}
			log := newLogger(f, env, zerolog.InfoLevel)
			log.Error().Msg("an error")
			b, err := os.ReadFile(f.Name())
			if err != nil {
				t.Fatal(err)
			}
			var m map[string]any
			if err := json.Unmarshal(b, &m); err != nil || m["level"] != "error" {
				t.Errorf("line = %q; want a JSON line of level error (%v)", b, err)
			}
		})
	}
}

// TestLogDurationsInSeconds: every duration our code logs is in seconds, in a field whose name
// ends in _s (Float64("x_s", logSeconds(d))), never zerolog's Dur, whose unit is a process-wide
// setting (milliseconds unless main says otherwise) that no field name shows.
func TestLogDurationsInSeconds(t *testing.T) {
	root := filepath.Join("..", "..")
	durCall := regexp.MustCompile(`(?:^\s*|\.)(Dur|Durs|TimeDiff)\(`) // also a chain continued on the next line
	fieldS := regexp.MustCompile(`\.Float64\("([a-z0-9_]+)", logSeconds\(`)
	for _, dir := range []string{"agent", "checkpoint", "cmd", "nvml", "systemd"} {
		err := filepath.WalkDir(filepath.Join(root, dir), func(p string, d fs.DirEntry, err error) error {
			if err != nil || d.IsDir() || !strings.HasSuffix(p, ".go") || strings.HasSuffix(p, "_test.go") {
				return err
			}
			b, err := os.ReadFile(p)
			if err != nil {
				return err
			}
			for i, l := range strings.Split(string(b), "\n") {
				if m := durCall.FindStringSubmatch(l); m != nil {
					t.Errorf("%s:%d: %s logs a duration without its unit; use Float64(\"name_s\", logSeconds(d))", p, i+1, m[1])
				}
				for _, m := range fieldS.FindAllStringSubmatch(l, -1) {
					if !strings.HasSuffix(m[1], "_s") {
						t.Errorf("%s:%d: duration field %q; want its name to end in _s (seconds)", p, i+1, m[1])
					}
				}
			}
			return nil
		})
		if err != nil {
			t.Fatal(err)
		}
	}
}

// TestJournalLines: what a command writes to journald's stream itself gets the priority prefix
// of its kind on every line, however the lines are split between writes; the logger's lines,
// which carry their own, pass as they are.
func TestJournalLines(t *testing.T) {
	var b bytes.Buffer
	j := &journalLines{w: &b, prio: 3}
	for _, s := range []string{
		"spotguard run: invalid configuration, not starting:\n",
		"  - store.url: missing\n  - checkpoint.dir: missing\n",
		"<6>{\"level\":\"info\"}\n",
		"half a ", "line\n",
		"\n",
	} {
		if n, err := j.Write([]byte(s)); n != len(s) || err != nil {
			t.Fatalf("Write(%q) = %d, %v; want %d, nil", s, n, err, len(s))
		}
	}
	fmt.Fprintf(atPriority(j, 5), "waiting\n")
	want := "<3>spotguard run: invalid configuration, not starting:\n" +
		"<3>  - store.url: missing\n<3>  - checkpoint.dir: missing\n" +
		"<6>{\"level\":\"info\"}\n" +
		"<3>half a line\n" +
		"<3>\n" +
		"<5>waiting\n"
	if b.String() != want {
		t.Errorf("written:\n%s\nwant:\n%s", b.String(), want)
	}
	var plain bytes.Buffer
	if w := atPriority(&plain, 5); w != io.Writer(&plain) {
		t.Errorf("atPriority of a writer that is not the journal's = %T; want it as it is", w)
	}
}

// TestCommandErrorsInTheJournal: under systemd (stderr is the stream JOURNAL_STREAM names) a
// command's own error reaches journald as an error, a notice that it waits as a notice, and its
// log lines keep their levels; anywhere else the same lines have no prefix.
func TestCommandErrorsInTheJournal(t *testing.T) {
	cfgPath := filepath.Join(t.TempDir(), "empty.yaml")
	if err := os.WriteFile(cfgPath, nil, 0o644); err != nil {
		t.Fatal(err)
	}
	to := filepath.Join(t.TempDir(), "not-mounted", "checkpoints")
	args := []string{"restore", "--config", cfgPath, "--to", to, "--no-create", "--mount-wait", "1ms"}
	env := []string{"SPOTGUARD_STORE_URL=file://" + t.TempDir(), "SPOTGUARD_STORE_JOB=j"}

	stderr := createFile(t, "stderr")
	if code := run(t.Context(), args, append(env, "JOURNAL_STREAM="+journalStreamOf(t, stderr)), io.Discard, stderr); code != exitFail {
		t.Errorf("restore into a directory never mounted: exit %d; want %d", code, exitFail)
	}
	b, err := os.ReadFile(stderr.Name())
	if err != nil {
		t.Fatal(err)
	}
	lines := strings.Split(strings.TrimSuffix(string(b), "\n"), "\n")
	if len(lines) != 2 || !strings.HasPrefix(lines[0], "<5>spotguard restore: ") || !strings.Contains(lines[0], "waiting up to 1ms") ||
		!strings.HasPrefix(lines[1], "<3>spotguard restore: ") || !strings.Contains(lines[1], "after waiting 1ms") {
		t.Errorf("stderr under journald:\n%s\nwant a <5> line saying it waits, then a <3> line with the error", b)
	}

	plain := createFile(t, "plain")
	run(t.Context(), args, env, io.Discard, plain)
	b, err = os.ReadFile(plain.Name())
	if err != nil {
		t.Fatal(err)
	}
	if !strings.HasPrefix(string(b), "spotguard restore: ") || strings.Contains(string(b), "<3>") || strings.Contains(string(b), "<5>") {
		t.Errorf("stderr without journald:\n%s\nwant the lines without a priority prefix", b)
	}
}

// TestConfigWarningsInTheJournal: under systemd, `spotguard config`'s warnings reach journald as
// warnings, not errors (as plan's do). (Found from outside: they were at <3>.)
func TestConfigWarningsInTheJournal(t *testing.T) {
	stderr := createFile(t, "stderr")
	cfgPath := filepath.Join(t.TempDir(), "spotguard.yaml")
	if err := os.WriteFile(cfgPath, []byte("trainer:\n  pidfile: /x\nhttp:\n  listen: 0.0.0.0:9402\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	args := []string{"config", "--config", cfgPath}
	if code := run(t.Context(), args, []string{"JOURNAL_STREAM=" + journalStreamOf(t, stderr)}, io.Discard, stderr); code != exitOK {
		t.Fatalf("config with a warning: exit %d; want %d", code, exitOK)
	}
	b, err := os.ReadFile(stderr.Name())
	if err != nil {
		t.Fatal(err)
	}
	if !strings.HasPrefix(string(b), "<4>warning: http.listen: 0.0.0.0:9402: not a loopback address") {
		t.Errorf("stderr under journald:\n%s\nwant the warning at <4>", b)
	}
}

// `config --configured` (spotguard.service's ExecCondition=) says an install not configured yet
// at notice priority under journald: the expected state, not an error in journalctl -p err (found
// from outside).
func TestConfigNotConfiguredYetIsANoticeInTheJournal(t *testing.T) {
	stderr := createFile(t, "stderr")
	cfgPath := filepath.Join(t.TempDir(), "spotguard.yaml")
	if err := os.WriteFile(cfgPath, []byte("# nothing set yet\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	args := []string{"config", "--configured", "--config", cfgPath}
	if code := run(t.Context(), args, []string{"JOURNAL_STREAM=" + journalStreamOf(t, stderr)}, io.Discard, stderr); code != exitFail {
		t.Fatalf("config --configured, nothing set: exit %d; want %d", code, exitFail)
	}
	b, err := os.ReadFile(stderr.Name())
	if err != nil {
		t.Fatal(err)
	}
	if !strings.HasPrefix(string(b), "<5>spotguard config: not configured yet: ") {
		t.Errorf("stderr under journald:\n%s\nwant the line at <5>", b)
	}
}

// On a terminal, a value is shown as it is: a regular expression's backslashes were doubled by
// zerolog's quoting (found from outside, trainer.match on `spotguard run` in a shell).
func TestConsoleShowsValuesAsTheyAre(t *testing.T) {
	t.Setenv("NO_COLOR", "1")
	var buf bytes.Buffer
	log := zerolog.New(consoleWriter(&buf))
	log.Info().
		Str("match", `python3 .*train\.py`).
		Str("dir", `C:\ckpt`).
		Str("quoted", `say "hi"`).
		Str("tab", "a\tb").
		Str("plain", "step-7").
		Err(errors.New(`open /x\y: no such file`)).
		Msg("found")
	got := buf.String()
	for _, want := range []string{
		`match="python3 .*train\.py"`,
		`dir="C:\ckpt"`,
		`quoted="say \"hi\""`, // a quote inside keeps Go's escapes, else where it ends is lost
		`tab="a\tb"`,
		`plain=step-7`,
		`error="open /x\y: no such file"`,
	} {
		if !strings.Contains(got, want) {
			t.Errorf("console line lacks %s:\n%s", want, got)
		}
	}
}
