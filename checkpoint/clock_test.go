package checkpoint

import (
	"encoding/json"
	"strings"
	"testing"
	"time"
)

// shiftCommit moves the place in the order of the commit LATEST names by d, in its manifest and in
// LATEST: what an instance whose clock was d ahead would have written. It returns the commit.
func shiftCommit(t *testing.T, s Store, d time.Duration) *Manifest {
	t.Helper()
	ctx := t.Context()
	data, _, err := s.GetBytes(ctx, LatestKey("job"))
	if err != nil {
		t.Fatal(err)
	}
	var l Latest
	if err := json.Unmarshal(data, &l); err != nil {
		t.Fatal(err)
	}
	key := ManifestKey("job", l.Checkpoint, l.Commit)
	mdata, _, err := s.GetBytes(ctx, key)
	if err != nil {
		t.Fatal(err)
	}
	m, err := ParseManifest(mdata)
	if err != nil {
		t.Fatal(err)
	}
	at := m.Timings.CompleteAt.Add(d)
	m.Timings.CompleteAt, l.CompleteAt = &at, &at
	m.CommittedAt, l.CommittedAt = m.CommittedAt.Add(d), l.CommittedAt.Add(d)
	for k, v := range map[string]any{key: m, LatestKey("job"): l} {
		b, err := json.Marshal(v)
		if err != nil {
			t.Fatal(err)
		}
		if _, err := s.PutBytes(ctx, k, b, Cond{}); err != nil {
			t.Fatal(err)
		}
	}
	return m
}

// TestClockBehindTheLastWriterStillMakesTheNewestCheckpointNewest: commits are ordered by the
// completion time the writing instance's clock gave them. An instance whose clock is behind the
// one that wrote the job's newest commit (a clock not yet synchronized after boot, or set back)
// saves checkpoints after that commit that its clock dates before it. Taken as dated, LATEST stayed
// on the older commit, restore took it, and retention deleted the new instance's checkpoints first:
// training lost. A checkpoint completed after the agent learned of a commit is ordered after it,
// with a warning; one complete before the agent knew of the commit keeps its own time.
func TestClockBehindTheLastWriterStillMakesTheNewestCheckpointNewest(t *testing.T) {
	s := newMemStore()
	a := startUploader(t, t.TempDir(), s, 0)
	writeCheckpoint(t, a.dir, "step-100", map[string][]byte{"a": randomBytes(t, 8<<10)})
	a.waitCommitted("step-100")
	a.stop()
	// The instance that wrote step-100 had its clock an hour ahead.
	old := shiftCommit(t, s, time.Hour)

	dir := t.TempDir()
	// On the new instance's disk before its agent starts: complete before the agent knew of
	// step-100, so by its own time (which it keeps) older than step-100.
	writeCheckpoint(t, dir, "step-050", map[string][]byte{"a": randomBytes(t, 8<<10)})
	b := startUploader(t, dir, s, 2)
	before := b.waitCommitted("step-050")
	if before.Manifest.Order().After(old.Order()) {
		t.Errorf("step-050, complete before the agent started, ordered after step-100 (%v, %v)", before.Manifest.Order().At, old.Order().At)
	}
	latestIs(t, s, "step-100", old.Commit)

	b.up.Status(t.Context()) // the agent has read the job
	waitFileClockAfter(t, time.Now())
	writeCheckpoint(t, dir, "step-200", map[string][]byte{"a": randomBytes(t, 8<<10)})
	second := b.waitCommitted("step-200")
	if !second.Manifest.Order().After(old.Order()) {
		t.Fatalf("step-200, saved after step-100 was read, ordered before it: %v, %v", second.Manifest.Order().At, old.Order().At)
	}
	latestIs(t, s, "step-200", second.Manifest.Commit)
	if logs := b.logs.String(); !strings.Contains(logs, "clock is behind") || !strings.Contains(logs, old.Commit) {
		t.Errorf("no warning naming the commit and the clock; logs:\n%s", logs)
	}

	// The next one is after step-200, though this clock dates it before both.
	laterTick(t, dir, "step-200")
	writeCheckpoint(t, dir, "step-300", map[string][]byte{"a": randomBytes(t, 8<<10)})
	third := b.waitCommitted("step-300")
	if !third.Manifest.Order().After(second.Manifest.Order()) {
		t.Fatalf("step-300 ordered before step-200: %v, %v", third.Manifest.Order().At, second.Manifest.Order().At)
	}
	latestIs(t, s, "step-300", third.Manifest.Commit)
	// Retention (keep 2) deleted the old instance's step-100 and step-050, not the new ones.
	st, err := readJob(t.Context(), s, "job", nil)
	if err != nil {
		t.Fatal(err)
	}
	var names []string
	for _, c := range st.Commits {
		names = append(names, c.Manifest.Checkpoint)
	}
	if got := strings.Join(names, " "); got != "step-300 step-200" {
		t.Errorf("commits after retention, newest first: %s; want step-300 step-200", got)
	}
}
