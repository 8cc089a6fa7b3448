package main

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/spotguard/spotguard/checkpoint"
)

// emptyConfig writes an empty configuration file, so that a drill reads no installed one.
func emptyConfig(t *testing.T) string {
	t.Helper()
	path := filepath.Join(t.TempDir(), "spotguard.yaml")
	if err := os.WriteFile(path, nil, 0o644); err != nil {
		t.Fatal(err)
	}
	return path
}

// A bad --store is a bad flag value: a usage error (exit 2) that names --store (drill has no
// --store.url), on stderr, before anything runs: no report, no advice about checkpoint sizes.
func TestDrillBadStoreIsAUsageError(t *testing.T) {
	conf := emptyConfig(t)
	for _, store := range []string{"bogus://x", "s3:/bucket", "file://rel", "s3://"} {
		for _, jsonFlag := range []string{"--json=false", "--json"} {
			code, stdout, stderr := runCLI(t, t.Context(), nil, "drill", "--config", conf, jsonFlag, "--store", store)
			if code != exitUsage {
				t.Errorf("Got(drill %s --store %s) exit %d; want %d", jsonFlag, store, code, exitUsage)
			}
			if stdout != "" {
				t.Errorf("Got(drill %s --store %s) stdout %q; want none", jsonFlag, store, stdout)
			}
			if want := fmt.Sprintf("spotguard drill: --store %q: ", store); !strings.HasPrefix(stderr, want) ||
				!strings.Contains(stderr, "run 'spotguard drill -h' for its flags") {
				t.Errorf("Got(drill %s --store %s) stderr %q; want it to start with %q, then where the flags are", jsonFlag, store, stderr, want)
			}
			if strings.Contains(stderr, "store.url") || strings.Contains(stderr, "Advice") || strings.Contains(stderr, "smaller checkpoint") {
				t.Errorf("Got(drill %s --store %s) stderr %q; want no store.url and no advice", jsonFlag, store, stderr)
			}
		}
	}
}

// A trainer command that exits at once (here: not found, status 127 from sh) fails the drill as
// soon as it exits, saying how it ended, without advice; the report has no deadline, margin or
// time to durable, as no notice came.
func TestDrillTrainerCommandThatExitsFailsAtOnce(t *testing.T) {
	conf := emptyConfig(t)
	start := time.Now()
	code, stdout, stderr := runCLI(t, t.Context(), nil, "drill", "--config", conf, "--json",
		"--trainer-cmd", "nonexistent-cmd-xyz-spotguard-test", "--checkpoint-dir", t.TempDir())
	elapsed := time.Since(start)
	if code != exitFail {
		t.Errorf("Got(drill) exit %d; want %d\nstderr: %s", code, exitFail, stderr)
	}
	var raw map[string]any
	if err := json.Unmarshal([]byte(stdout), &raw); err != nil {
		t.Fatalf("Got(drill --json) stdout %q: %v", stdout, err)
	}
	reason, _ := raw["reason"].(string)
	if !strings.Contains(reason, "the trainer command exited with status 127") || !strings.Contains(reason, "command not found") {
		t.Errorf("Got(drill) reason %q; want the trainer command's exit status 127, command not found", reason)
	}
	for _, key := range []string{"advice", "deadline", "margin_seconds", "durable_after_notice_seconds"} {
		if v, ok := raw[key]; ok {
			t.Errorf("Got(drill --json) %q = %v; want it absent", key, v)
		}
	}
	if raw["pass"] != false {
		t.Errorf("Got(drill --json) pass = %v; want false", raw["pass"])
	}
	// The drill gives the agent 10 s to find a trainer that runs; one that exited is not waited for.
	if elapsed >= 10*time.Second {
		t.Errorf("Got(drill) took %v; want it to fail as soon as the trainer exited", elapsed)
	}

	// The text report says the same, without an advice block.
	code, stdout, _ = runCLI(t, t.Context(), nil, "drill", "--config", conf,
		"--trainer-cmd", "sh -c 'exit 3'", "--checkpoint-dir", t.TempDir())
	if code != exitFail || !strings.Contains(stdout, "FAIL: the trainer command exited with status 3 before") || strings.Contains(stdout, "Advice") {
		t.Errorf("Got(drill --trainer-cmd \"sh -c 'exit 3'\") exit %d, stdout %q; want 1, FAIL with status 3 and no advice", code, stdout)
	}
}

// A --checkpoint-dir another agent watches (the service's own checkpoint.dir) fails the drill at
// once with the agent's reason. Before, the drill waited for its agent to find the trainer, which
// it never did (the agent had stopped), and said "the agent did not find the trainer".
func TestDrillOnADirectoryAnotherAgentWatchesFailsWithWhy(t *testing.T) {
	dir := t.TempDir()
	release, err := checkpoint.LockDir(dir)
	if err != nil {
		t.Fatal(err)
	}
	defer release()
	code, stdout, stderr := runCLI(t, t.Context(), nil, "drill", "--config", emptyConfig(t), "--json", "--trainer-cmd", "sleep 30", "--checkpoint-dir", dir)
	if code != exitFail {
		t.Errorf("Got(drill) exit %d; want %d\nstderr: %s", code, exitFail, stderr)
	}
	var raw map[string]any
	if err := json.Unmarshal([]byte(stdout), &raw); err != nil {
		t.Fatalf("Got(drill --json) stdout %q: %v", stdout, err)
	}
	want := fmt.Sprintf("the agent could not run: checkpoint.dir %s: watched by another spotguard agent (PID %d)", dir, os.Getpid())
	if reason, _ := raw["reason"].(string); !strings.HasPrefix(reason, want) {
		t.Errorf("Got(drill) reason %q; want it to start with %q", reason, want)
	}
}

// The advice about checkpoint size, frequency and upload speed is for a thin margin or a
// checkpoint not committed in time, not for failures it cannot fix.
func TestDrillAdviceOnlyWhereItHelps(t *testing.T) {
	margin := func(s float64) *float64 { return &s }
	tests := []struct {
		name    string
		rep     drillReport
		generic bool // the advice about size, frequency and upload
		want    string
	}{
		{"pass with room", drillReport{Pass: true, MarginS: margin(100)}, false, ""},
		{"pass with a thin margin", drillReport{Pass: true, MarginS: margin(5)}, true, "smaller checkpoint"},
		{"late", drillReport{Reason: "the checkpoint was not committed before the deadline", late: true}, true, "smaller checkpoint"},
		{"trainer exited", drillReport{Reason: "the trainer command exited with status 127 before the agent found it"}, false, ""},
		{"invalid configuration", drillReport{Reason: "invalid configuration: trainer.signal: ..."}, false, ""},
		{"no handler", drillReport{Reason: "the trainer (pid 7) does not catch SIGUSR1"}, false, "handle the signal"},
		{"store", drillReport{Cause: "store:not_found", storeFix: "create the bucket"}, false, "create the bucket"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			got := drillAdvice(tt.rep)
			all := strings.Join(got, "\n")
			if strings.Contains(all, "smaller checkpoint") != tt.generic {
				t.Errorf("Got(%s) advice %q; want the advice about size and frequency: %v", tt.name, got, tt.generic)
			}
			if tt.want == "" && len(got) > 0 || !strings.Contains(all, tt.want) {
				t.Errorf("Got(%s) advice %q; want %q", tt.name, got, tt.want)
			}
		})
	}
}

// A trainer that catches the signal but writes nothing into --checkpoint-dir fails the drill
// saying so, not as late with advice on size and speed (found from outside: README's drill gave
// the trainer no directory, and the advice was to save smaller checkpoints).
func TestDrillTrainerThatWritesNothingIsSaid(t *testing.T) {
	dir := t.TempDir()
	code, raw, reason, _ := drillWithTrainer(t, 5*time.Second, `sh -c 'trap "echo signalled" USR1; while :; do sleep 0.1; done'`, dir)
	if code != exitFail || !strings.Contains(reason, "the trainer was signalled but wrote nothing into --checkpoint-dir "+dir) {
		t.Errorf("Got(drill, a trainer that writes nothing) exit %d, reason %q; want 1, saying it wrote nothing into %s", code, reason, dir)
	}
	if _, ok := raw["advice"]; ok {
		t.Errorf("Got(drill --json) advice %v; want none: size and speed are not the cause", raw["advice"])
	}
}

// A trainer that saves one level below --checkpoint-dir (run1/step-N/_COMPLETE) fails the drill
// saying so, not as late with advice on size and speed (found from outside).
func TestDrillCheckpointDirOneLevelTooHighIsSaid(t *testing.T) {
	dir := t.TempDir()
	trainer := `sh -c 'trap "mkdir -p ` + dir + `/run1/step-1 && echo w > ` + dir + `/run1/step-1/w.bin && touch ` + dir + `/run1/step-1/_COMPLETE" USR1; while :; do sleep 0.1; done'`
	code, raw, reason, _ := drillWithTrainer(t, 5*time.Second, trainer, dir)
	if code != exitFail || !strings.Contains(reason, "run1/step-1/_COMPLETE, below the top of "+dir+"/run1") || !strings.Contains(reason, "looks one level too high") {
		t.Errorf("Got(drill, a save one level down) exit %d, reason %q; want 1, saying --checkpoint-dir is one level too high", code, reason)
	}
	if _, ok := raw["advice"]; ok {
		t.Errorf("Got(drill --json) advice %v; want none", raw["advice"])
	}
}

// A drill that SIGINT or SIGTERM ends says so, with no verdict on the checkpoint's speed (found
// from outside: "no complete checkpoint appeared before the deadline", and advice on slow
// saves, for a drill stopped 0.8 s in).
func TestDrillInterruptedSaysSo(t *testing.T) {
	conf := emptyConfig(t)
	dir := t.TempDir()
	signalled := filepath.Join(dir, "signalled")
	ctx, cancel := context.WithCancelCause(t.Context())
	defer cancel(nil)
	go func() {
		deadline := time.Now().Add(60 * time.Second)
		for time.Now().Before(deadline) {
			if _, err := os.Stat(signalled); err == nil {
				break
			}
			<-time.After(20 * time.Millisecond)
		}
		cancel(errors.New("interrupt signal received"))
	}()
	code, stdout, stderr := runCLI(t, ctx, nil, "drill", "--config", conf, "--json", "--checkpoint-dir", filepath.Join(dir, "ckpt"),
		"--trainer-cmd", fmt.Sprintf(`sh -c 'trap "touch %s" USR1; while :; do sleep 0.05; done'`, signalled))
	var rep struct {
		Reason string   `json:"reason"`
		Advice []string `json:"advice"`
		Cause  string   `json:"cause"`
	}
	if err := json.Unmarshal([]byte(stdout), &rep); err != nil {
		t.Fatalf("drill --json: %v\n%s\nstderr: %s", err, stdout, stderr)
	}
	if _, err := os.Stat(signalled); err != nil {
		t.Fatalf("the trainer was not signalled before the drill was interrupted: %v\n%s", err, stderr)
	}
	if code != exitFail || rep.Reason != "interrupted (interrupt signal received)" || len(rep.Advice) != 0 || rep.Cause != "" {
		t.Errorf("Got(drill, interrupted) exit %d, reason %q, advice %q, cause %q; want 1, \"interrupted (interrupt signal received)\", no advice and no cause",
			code, rep.Reason, rep.Advice, rep.Cause)
	}
}

// A trainer that saves on the signal and exits at once passes: its marker is on disk before it
// exits, and the agent commits it (found from outside: failed as "exited before writing a
// complete checkpoint" in 5 of 18 runs, when the drill saw the exit before the agent saw the
// marker).
func TestDrillTrainerThatSavesAndExitsPasses(t *testing.T) {
	defer func(d time.Duration) { drillWindow = d }(drillWindow)
	drillWindow = 20 * time.Second
	for i := range 3 {
		dir := t.TempDir()
		ck := dir + "/step-1"
		trainer := `sh -c 'trap "mkdir -p ` + ck + ` && echo w > ` + ck + `/w.bin && touch ` + ck + `/_COMPLETE && exit 0" USR1; while :; do sleep 0.01; done'`
		code, stdout, stderr := runCLI(t, t.Context(), nil, "drill", "--config", emptyConfig(t), "--json", "--trainer-cmd", trainer, "--checkpoint-dir", dir)
		var rep struct {
			Pass     bool    `json:"pass"`
			Reason   string  `json:"reason"`
			Files    int     `json:"files"`
			DurableS float64 `json:"durable_after_notice_seconds"`
			Timeline []struct {
				Step    string  `json:"step"`
				Seconds float64 `json:"seconds"`
			} `json:"timeline"`
		}
		if err := json.Unmarshal([]byte(stdout), &rep); err != nil {
			t.Fatalf("Got(drill --json) stdout %q: %v\nstderr: %s", stdout, err, stderr)
		}
		if code != exitOK || !rep.Pass || rep.Files != 2 {
			t.Errorf("run %d: Got(drill, a trainer that saves and exits) exit %d, %+v; want PASS with its file and marker", i+1, code, rep)
		}
		// Durable once the manifest was sent, after the last byte: not when the manifest was
		// made (found from outside: the two were one time, 1.5 s before the store had the
		// manifest behind a slow link).
		at := map[string]float64{}
		for _, s := range rep.Timeline {
			at[s.Step] = s.Seconds
		}
		if last, committed := at["last byte stored"], at["manifest committed"]; committed <= last || rep.DurableS != committed {
			t.Errorf("run %d: last byte stored at %v s, manifest committed at %v s, durable after %v s; want the commit after the last byte, and durable then",
				i+1, last, committed, rep.DurableS)
		}
	}
}

// A checkpoint the agent withholds (here, a symbolic link in it, which is never stored) fails the
// drill with the agent's reason, the file named, not with advice on size and speed, nor sending
// the user to a log line the drill does not show (found from outside, with a file written after
// the marker, which fails the drill at once: that notice's wording is tested with it).
func TestDrillWithheldCheckpointIsSaid(t *testing.T) {
	dir := t.TempDir()
	ck := dir + "/step-1"
	trainer := `sh -c 'trap "mkdir -p ` + ck + ` && echo a > ` + ck + `/a.bin && ln -s a.bin ` + ck + `/link.bin && touch ` + ck + `/_COMPLETE" USR1; while :; do sleep 0.01; done'`
	code, raw, reason, stderr := drillWithTrainer(t, 5*time.Second, trainer, dir)
	t.Logf("drill reason: %s", reason)
	if code != exitFail || !strings.Contains(reason, "withheld") || !strings.Contains(reason, "link.bin") {
		t.Errorf("Got(drill, a checkpoint with a symbolic link) exit %d, reason %q; want 1, saying it is withheld and which file\nstderr: %s", code, reason, stderr)
	}
	if _, ok := raw["advice"]; ok {
		t.Errorf("Got(drill --json) advice %v; want none: size and speed are not the cause", raw["advice"])
	}
}

// A trainer that writes its marker while a file of the save is still being written fails the
// drill, whether the agent committed the save before the last write or withheld it after: it
// passed 8 of 9 times from outside, when the comparison came before the last write.
func TestDrillTrainerStillWritingAfterItsMarkerFails(t *testing.T) {
	dir := t.TempDir()
	ck := dir + "/step-1"
	trainer := `sh -c 'trap "mkdir -p ` + ck + ` && echo a > ` + ck + `/a.bin && touch ` + ck + `/_COMPLETE && sleep 0.05 && echo more >> ` + ck + `/a.bin" USR1; while :; do sleep 0.01; done'`
	code, raw, reason, stderr := drillWithTrainer(t, 20*time.Second, trainer, dir)
	if code != exitFail || !strings.Contains(reason, "a.bin") || !strings.Contains(reason, "after its") || !strings.Contains(reason, "marker") {
		t.Errorf("Got(drill, a file written after the marker) exit %d, reason %q; want 1, naming a.bin written after the marker\nstderr: %s", code, reason, stderr)
	}
	if _, ok := raw["advice"]; ok {
		t.Errorf("Got(drill --json) advice %v; want none: size and speed are not the cause", raw["advice"])
	}
}

// drillWithTrainer runs drill --json with the trainer command trainer writing into dir, the
// notice's window being window, and returns its exit code, its report, the report's reason and
// its stderr.
func drillWithTrainer(t *testing.T, window time.Duration, trainer, dir string) (code int, raw map[string]any, reason, stderr string) {
	t.Helper()
	defer func(d time.Duration) { drillWindow = d }(drillWindow)
	drillWindow = window
	code, stdout, stderr := runCLI(t, t.Context(), nil, "drill", "--config", emptyConfig(t), "--json", "--trainer-cmd", trainer, "--checkpoint-dir", dir)
	if err := json.Unmarshal([]byte(stdout), &raw); err != nil {
		t.Fatalf("Got(drill --json) stdout %q: %v\nstderr: %s", stdout, err, stderr)
	}
	reason, _ = raw["reason"].(string)
	return code, raw, reason, stderr
}
