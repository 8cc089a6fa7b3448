package main

import (
	"bytes"
	"context"
	"encoding/json"
	"maps"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/rs/zerolog"

	"github.com/spotguard/spotguard/checkpoint"
)

// progressLines decodes the JSON log lines in b.
func progressLines(t *testing.T, b *bytes.Buffer) []map[string]any {
	t.Helper()
	var out []map[string]any
	for _, l := range strings.Split(strings.TrimSpace(b.String()), "\n") {
		if l == "" {
			continue
		}
		var m map[string]any
		if err := json.Unmarshal([]byte(l), &m); err != nil {
			t.Fatalf("log line %q: %v", l, err)
		}
		out = append(out, m)
	}
	return out
}

// TestProgressLog: each line says where the download stands on the fake clock: bytes done and
// in all, percent, MB/s since the first byte was asked for, seconds elapsed and left at that
// rate (none while nothing has arrived; 0 at the end). Nothing before the download starts, and
// nothing after the last line.
func TestProgressLog(t *testing.T) {
	var buf bytes.Buffer
	t0 := time.Date(2026, 11, 29, 16, 44, 18, 0, time.UTC)
	now := t0
	p := &progressLog{log: zerolog.New(&buf), now: func() time.Time { return now }}

	p.line(t0, false) // resolving the manifest: nothing to say yet
	if buf.Len() != 0 {
		t.Fatalf("a line before the download started: %s", buf.String())
	}
	const total = 2000e6
	p.update(0, total)                 // the download starts at t0
	p.line(t0.Add(time.Second), false) // nothing arrived yet: no rate, no time left
	p.update(500e6, total)
	p.line(t0.Add(5*time.Second), false)
	p.update(1000e6, total)
	p.line(t0.Add(10*time.Second), false)
	p.line(t0.Add(20*time.Second), false) // stalled: the rate falls
	p.update(total, total)
	now = t0.Add(32 * time.Second)
	p.finish()
	p.finish()                            // once
	p.line(t0.Add(35*time.Second), false) // a tick after the end
	var nilLog *progressLog
	nilLog.finish() // the bar was used instead

	want := []struct {
		done, pct, rate, elapsed float64
		eta                      any // nil: no field
	}{
		{0, 0, 0, 1, nil},
		{500e6, 25, 100, 5, 15.0},
		{1000e6, 50, 100, 10, 10.0},
		{1000e6, 50, 50, 20, 20.0},
		{2000e6, 100, 62.5, 32, 0.0},
	}
	lines := progressLines(t, &buf)
	if len(lines) != len(want) {
		t.Fatalf("got %d lines; want %d:\n%s", len(lines), len(want), buf.String())
	}
	for i, w := range want {
		l := lines[i]
		if l["message"] != "restore progress" || l["level"] != "info" || l["bytes_done"] != w.done || l["bytes_total"] != float64(total) ||
			l["percent"] != w.pct || l["mb_per_s"] != w.rate || l["elapsed_s"] != w.elapsed || l["eta_s"] != w.eta {
			t.Errorf("line %d = %v; want bytes_done %v of %v, percent %v, mb_per_s %v, elapsed_s %v, eta_s %v",
				i, l, w.done, float64(total), w.pct, w.rate, w.elapsed, w.eta)
		}
	}
}

// TestProgressLogTicks: run logs one line per tick of the ticker it is given, as of the tick's
// time, until its context ends.
func TestProgressLogTicks(t *testing.T) {
	var buf bytes.Buffer
	t0 := time.Date(2026, 11, 29, 16, 44, 18, 0, time.UTC)
	p := &progressLog{log: zerolog.New(&buf), now: func() time.Time { return t0 }}
	p.update(0, 100e6) // starts at t0
	p.update(40e6, 100e6)

	tick := make(chan time.Time)
	ctx, cancel := context.WithCancel(t.Context())
	done := make(chan struct{})
	go func() { defer close(done); p.run(ctx, tick) }()
	for i := 1; i <= 3; i++ {
		tick <- t0.Add(time.Duration(i) * progressLogEvery)
	}
	cancel()
	<-done // run wrote the line of every tick it took before it returned

	lines := progressLines(t, &buf)
	if len(lines) != 3 {
		t.Fatalf("got %d lines for 3 ticks; want 3:\n%s", len(lines), buf.String())
	}
	for i, want := range []struct{ elapsed, rate, eta float64 }{{5, 8, 7.5}, {10, 4, 15}, {15, 2.7, 22.5}} {
		if l := lines[i]; l["elapsed_s"] != want.elapsed || l["mb_per_s"] != want.rate || l["eta_s"] != want.eta || l["percent"] != 40.0 {
			t.Errorf("line %d = %v; want elapsed_s %v, mb_per_s %v, eta_s %v, percent 40", i, l, want.elapsed, want.rate, want.eta)
		}
	}
}

// commitForTest commits checkpoint cp of job with files (path → content) to the file store at
// dir, as the uploader would: data first, then the manifest. LATEST is not written (restore
// finds the newest commit without it).
func commitForTest(t *testing.T, dir, job, cp string, files map[string][]byte) {
	t.Helper()
	s, err := checkpoint.NewFileStore(dir)
	if err != nil {
		t.Fatal(err)
	}
	at := time.Now().UTC()
	m := &checkpoint.Manifest{Version: checkpoint.ManifestVersion, Job: job, Checkpoint: cp, Commit: checkpoint.NewCommitID(at),
		Trigger: "periodic", CommittedAt: at, Timings: checkpoint.Timings{CompleteAt: &at}}
	for _, p := range slices.Sorted(maps.Keys(files)) {
		sum, err := checkpoint.ChecksumOf(bytes.NewReader(files[p]))
		if err != nil {
			t.Fatal(err)
		}
		f := checkpoint.File{Path: p, Key: checkpoint.DataKey(job, cp, m.Commit, p), Size: int64(len(files[p])), Mode: "0644", Checksum: sum}
		if _, err := s.PutBytes(t.Context(), f.Key, files[p], checkpoint.Cond{}); err != nil {
			t.Fatal(err)
		}
		m.Files = append(m.Files, f)
		m.TotalBytes += f.Size
	}
	if err := m.Validate(); err != nil {
		t.Fatal(err)
	}
	data, err := json.Marshal(m)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := s.PutBytes(t.Context(), checkpoint.ManifestKey(job, cp, m.Commit), data, checkpoint.Cond{IfAbsent: true}); err != nil {
		t.Fatal(err)
	}
}

// TestRestoreProgressInTheJournal: `spotguard restore` without a terminal (the restore unit's
// journal stream here) logs its progress on the logger every command uses, so journald files it
// as info; the last line has every byte.
func TestRestoreProgressInTheJournal(t *testing.T) {
	store := t.TempDir()
	files := map[string][]byte{"model.pt": bytes.Repeat([]byte("w"), 3<<20), "optim.pt": []byte("o")}
	commitForTest(t, store, "j", "step-000100", files)
	cfgPath := filepath.Join(t.TempDir(), "empty.yaml")
	if err := os.WriteFile(cfgPath, nil, 0o644); err != nil {
		t.Fatal(err)
	}
	stderr := createFile(t, "stderr")
	env := []string{"SPOTGUARD_STORE_URL=file://" + store, "SPOTGUARD_STORE_JOB=j", "JOURNAL_STREAM=" + journalStreamOf(t, stderr)}
	var stdout bytes.Buffer
	to := t.TempDir()
	if code := run(t.Context(), []string{"restore", "--config", cfgPath, "--to", to}, env, &stdout, stderr); code != exitOK {
		b, _ := os.ReadFile(stderr.Name())
		t.Fatalf("restore: exit %d; want 0\n%s", code, b)
	}
	b, err := os.ReadFile(stderr.Name())
	if err != nil {
		t.Fatal(err)
	}
	var last map[string]any
	for _, l := range strings.Split(strings.TrimSpace(string(b)), "\n") {
		rest, ok := strings.CutPrefix(l, "<6>")
		if !ok || !strings.Contains(rest, `"message":"restore progress"`) {
			continue
		}
		last = nil
		if err := json.Unmarshal([]byte(rest), &last); err != nil {
			t.Fatalf("progress line %q: %v", l, err)
		}
	}
	const total = 3<<20 + 1
	if last == nil || last["bytes_done"] != float64(total) || last["bytes_total"] != float64(total) || last["percent"] != 100.0 ||
		last["eta_s"] != 0.0 || last["component"] != "restore" || last["job"] != "j" {
		t.Errorf("last progress line = %v; want <6> and every one of %d bytes, in:\n%s", last, total, b)
	}
	if !strings.Contains(stdout.String(), "restored step-000100") {
		t.Errorf("stdout = %q; want the summary", stdout.String())
	}
}
