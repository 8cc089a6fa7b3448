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

// commitAnHourAhead commits step-100 into s as an instance whose clock was an hour ahead would
// have, and returns its manifest.
func commitAnHourAhead(t *testing.T, s Store) *Manifest {
	t.Helper()
	a := startUploader(t, t.TempDir(), s, 0)
	writeCheckpoint(t, a.dir, "step-100", map[string][]byte{"a": randomBytes(t, 8<<10)})
	a.waitCommitted("step-100")
	a.stop()
	return shiftCommit(t, s, time.Hour)
}

// TestClockBehindTheLastWriterStillMakesTheNewestCheckpointNewest: commits are ordered by the
// completion time the writing instance's clock gave them. An instance whose clock is behind the
// one that wrote the job's newest commit (a clock not yet synchronized after boot, or set back)
// saves checkpoints after that commit that its clock dates before it. Taken as dated, LATEST stayed
// on the older commit, restore took it, and retention would delete the new instance's checkpoints
// first: training lost. A checkpoint completed after the agent learned of a commit is ordered after it,
// with a warning; one complete before the agent knew of the commit keeps its own time.
func TestClockBehindTheLastWriterStillMakesTheNewestCheckpointNewest(t *testing.T) {
	s := newMemStore()
	old := commitAnHourAhead(t, s)

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
	// Two saves in a row (the second may complete before the first is committed): both are
	// ordered after step-100, and in the order they completed in.
	writeCheckpoint(t, dir, "step-200", map[string][]byte{"a": randomBytes(t, 8<<10)})
	laterTick(t, dir, "step-200")
	writeCheckpoint(t, dir, "step-300", map[string][]byte{"a": randomBytes(t, 8<<10)})
	evs := b.waitCommittedAll("step-200", "step-300") // committed in either order
	second, third := evs["step-200"], evs["step-300"]
	if !second.Manifest.Order().After(old.Order()) {
		t.Fatalf("step-200, saved after step-100 was read, ordered before it: %v, %v", second.Manifest.Order().At, old.Order().At)
	}
	if !third.Manifest.Order().After(second.Manifest.Order()) {
		t.Fatalf("step-300 ordered before step-200: %v, %v", third.Manifest.Order().At, second.Manifest.Order().At)
	}
	latestIs(t, s, "step-300", third.Manifest.Commit)
	if logs := b.logs.String(); !strings.Contains(logs, "clock is behind") || !strings.Contains(logs, old.Commit) {
		t.Errorf("no warning naming the commit and the clock; logs:\n%s", logs)
	}

	// The next one, saved after those were committed, is after them, though this clock dates it
	// before all three.
	laterTick(t, dir, "step-300")
	writeCheckpoint(t, dir, "step-400", map[string][]byte{"a": randomBytes(t, 8<<10)})
	fourth := b.waitCommitted("step-400")
	if !fourth.Manifest.Order().After(third.Manifest.Order()) {
		t.Fatalf("step-400 ordered before step-300: %v, %v", fourth.Manifest.Order().At, third.Manifest.Order().At)
	}
	latestIs(t, s, "step-400", fourth.Manifest.Commit)
	// Retention (keep 2) deleted the old instance's step-100 and the older ones, not the newest.
	if got := jobNames(t, s); got != "step-400 step-300" {
		t.Errorf("commits after retention, newest first: %s; want step-400 step-300", got)
	}
}

// jobNames is the checkpoints of job's commits, newest first, space-separated.
func jobNames(t *testing.T, s Store) string {
	t.Helper()
	st, err := readJob(t.Context(), s, "job", nil)
	if err != nil {
		t.Fatal(err)
	}
	var names []string
	for _, c := range st.Commits {
		names = append(names, c.Manifest.Checkpoint)
	}
	return strings.Join(names, " ")
}

// afterKnown orders a version after every commit learned before it completed, shifted by the
// most any of them shows this clock behind, so that versions keep the order they completed in.
func TestAfterKnown(t *testing.T) {
	t0 := time.Date(2026, 12, 3, 12, 0, 0, 0, time.UTC)
	sec := func(n float64) time.Time { return t0.Add(time.Duration(n * float64(time.Second))) }
	known := []knownOrder{
		{order: CommitOrder{At: sec(-10), Commit: "a"}, at: sec(0)},   // completed before it was learned: no skew
		{order: CommitOrder{At: sec(3600), Commit: "b"}, at: sec(10)}, // completed an hour after it was learned: this clock 3590 s behind at least
		{order: CommitOrder{At: sec(3611), Commit: "c"}, at: sec(20)}, // this agent's own, ordered after b (as by 3591 s)
	}
	const ms = time.Millisecond
	for _, tc := range []struct {
		complete, want time.Duration // from t0
		by             string
	}{
		{-5 * time.Second, -5 * time.Second, ""},            // before anything was learned
		{5 * time.Second, 5 * time.Second, ""},              // after a alone: a clock that agrees
		{10 * time.Second, 10 * time.Second, ""},            // as b was learned: not after it
		{11 * time.Second, (11+3590)*time.Second + ms, "b"}, // after b: shifted past it
		{15 * time.Second, (15+3590)*time.Second + ms, "b"}, // later, shifted as much: the order kept
		{25 * time.Second, (25+3591)*time.Second + ms, "c"}, // after c, which shows more: past c too
	} {
		at, by, behind := afterKnown(known, t0.Add(tc.complete))
		if got := at.Sub(t0); got != tc.want || by.order.Commit != tc.by || behind != (tc.by != "") {
			t.Errorf("afterKnown(t0%+v) = t0%+v, by %q, %v; want t0%+v by %q", tc.complete, got, by.order.Commit, behind, tc.want, tc.by)
		}
	}
}

// An agent whose clock is behind a commit's writer orders its checkpoints after that commit (its
// complete_at moved, its own completion kept as complete_at_here). Restarted, with a save the
// trainer made while no agent ran on the disk, it orders that save after its own moved commit:
// before, it took the save for older (complete before the agent learned of the commit), LATEST
// stayed on the older save and retention deleted the new commit at once (found from outside).
func TestClockBehindAgentRestartedOrdersTheNextSaveAfterItsOwnCommit(t *testing.T) {
	s := newMemStore()
	commitAnHourAhead(t, s)

	dir := t.TempDir()
	b := startUploader(t, dir, s, 2)
	b.up.Status(t.Context()) // the agent has read the job
	waitFileClockAfter(t, time.Now())
	writeCheckpoint(t, dir, "step-200", map[string][]byte{"a": randomBytes(t, 8<<10)})
	second := b.waitCommitted("step-200").Manifest
	if h := second.Timings.CompleteAtHere; h == nil || !second.Timings.CompleteAt.After(h.Add(59*time.Minute)) {
		t.Fatalf("step-200 complete_at %v, complete_at_here %v; want it moved an hour past its own", second.Timings.CompleteAt, h)
	}
	b.stop()

	laterTick(t, dir, "step-200")
	writeCheckpoint(t, dir, "step-300", map[string][]byte{"a": randomBytes(t, 8<<10)}) // no agent runs
	c := startUploader(t, dir, s, 2)
	third := c.waitCommitted("step-300").Manifest
	c.stop()
	if !third.Order().After(second.Order()) {
		t.Fatalf("step-300, saved after step-200, ordered before it: %v, %v", third.Order().At, second.Order().At)
	}
	latestIs(t, s, "step-300", third.Commit)
	if got := jobNames(t, s); got != "step-300 step-200" {
		t.Errorf("commits after retention, newest first: %s; want step-300 step-200", got)
	}
}

// A wall clock set back under a running agent: its own commits, learned by the clock before,
// are moved back as much (knownAsOf), so that a checkpoint completed after them by the clock as
// it is now is ordered after them (afterKnown), not before (found from outside: dated before, it
// was deleted by retention while LATEST stayed on the older commit).
func TestClockSetBackUnderARunningAgent(t *testing.T) {
	t0 := time.Date(2026, 12, 7, 12, 0, 0, 0, time.UTC)
	// Committed and learned at 12:00 by a clock a day ahead (its order 12:00 too), 10 s into
	// the agent's life; the clock is then set back a day.
	known := []knownOrder{{order: CommitOrder{At: t0.Add(-time.Second), Commit: "own"}, at: t0, mono: 10 * time.Second}}
	wall, mono := t0.Add(-24*time.Hour+time.Minute), 70*time.Second // a minute later, by both clocks
	now := knownAsOf(known, wall, mono)
	if want := t0.Add(-24 * time.Hour); !now[0].at.Equal(want) {
		t.Fatalf("knownAsOf: learned at %v; want %v, the clock set back a day", now[0].at, want)
	}
	complete := wall.Add(-30 * time.Second) // the next checkpoint, completed by the clock as it is now
	at, by, behind := afterKnown(now, complete)
	if !behind || by.order.Commit != "own" || !at.After(known[0].order.At) {
		t.Errorf("afterKnown = %v by %q, %v; want after the own commit (%v)", at, by.order.Commit, behind, known[0].order.At)
	}
	// Taken as learned, it was ordered before its own commit.
	if at, _, _ := afterKnown(known, complete); at.After(known[0].order.At) {
		t.Errorf("without knownAsOf: %v; the test's premise is a checkpoint ordered before the commit", at)
	}
	// A clock that agrees (or was slewed by less than a second) changes nothing.
	if got := knownAsOf(known, t0.Add(time.Minute-500*time.Millisecond), mono); !got[0].at.Equal(t0) {
		t.Errorf("knownAsOf with the clock half a second behind the monotonic one: %v; want %v", got[0].at, t0)
	}
}
