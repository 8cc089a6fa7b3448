package checkpoint

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/rs/zerolog"
)

func TestCommitIDs(t *testing.T) {
	at := time.Date(2026, 11, 30, 20, 37, 14, 999, time.FixedZone("CET", 3600))
	id := NewCommitID(at)
	if err := ValidCommitID(id); err != nil || id[:17] != "20261130T193714Z-" {
		t.Errorf("Got(%q) = %q (%v); want 20261130T193714Z-<12 hex>", "NewCommitID", id, err)
	}
	if NewCommitID(at) == id {
		t.Errorf("two commit ids of the same second are equal: %s", id)
	}
	for _, bad := range []string{"", "x", "20261130T193714Z", "20261130T193714Z-1f2e3d4c5b6", "20261130T193714Z-1f2e3d4c5b6G",
		"20261330T193714Z-1f2e3d4c5b6a", "_spotguard", "20261130T193714Z_1f2e3d4c5b6a"} {
		if ValidCommitID(bad) == nil {
			t.Errorf("Got(%q) = valid; want an error", bad)
		}
	}
}

func TestCommitOrder(t *testing.T) {
	t0 := restoreTestT0
	a := CommitOrder{At: t0, Commit: "20260301T120000Z-000000000001"}
	b := CommitOrder{At: t0, Commit: "20260301T120000Z-000000000002"}
	c := CommitOrder{At: t0.Add(time.Nanosecond), Commit: "20260301T115959Z-000000000000"}
	for _, tt := range []struct {
		x, y CommitOrder
		want bool
	}{{b, a, true}, {a, b, false}, {c, b, true}, {b, c, false}, {a, a, false}} {
		if got := tt.x.After(tt.y); got != tt.want {
			t.Errorf("Got(%q) = %v; want %v", fmt.Sprint(tt.x, " after ", tt.y), got, tt.want)
		}
	}
	v1 := &Manifest{Version: 1, CommittedAt: t0}
	if o := v1.Order(); !o.At.Equal(t0) || o.Commit != "" {
		t.Errorf("Got(%q) = %v; want the commit time", "version 1 order", o)
	}
}

// retainedNames returns the checkpoint names retention keeps, in the order of st.Commits.
func retainedNames(st *JobState, keep int) []string {
	kept := retained(st, keep)
	if kept == nil {
		return nil
	}
	var names []string
	for _, c := range st.Commits {
		if kept[c.Key] {
			names = append(names, c.Manifest.Checkpoint)
		}
	}
	return names
}

func TestRetained(t *testing.T) {
	t0 := restoreTestT0
	tests := []struct {
		name  string
		setup func(t *testing.T, s *memStore)
		keep  int
		want  []string // nil: everything kept, unknown
	}{
		{"keep newest", func(t *testing.T, s *memStore) {
			for i := range 4 {
				restoreTestCommit(t, s, restoreTestJob, fmt.Sprintf("step-%d", i), t0.Add(time.Duration(i)*time.Hour), restoreTestFiles(uint64(i)))
			}
			restoreTestSetLatest(t, s, restoreTestJob, "step-3")
		}, 2, []string{"step-3", "step-2"}},
		{"LATEST's target and everything newer", func(t *testing.T, s *memStore) {
			for i := range 4 {
				restoreTestCommit(t, s, restoreTestJob, fmt.Sprintf("step-%d", i), t0.Add(time.Duration(i)*time.Hour), restoreTestFiles(uint64(i)))
			}
			restoreTestSetLatest(t, s, restoreTestJob, "step-1")
		}, 1, []string{"step-3", "step-2", "step-1"}},
		{"no LATEST: the newest keep", func(t *testing.T, s *memStore) {
			for i := range 3 {
				restoreTestCommit(t, s, restoreTestJob, fmt.Sprintf("step-%d", i), t0.Add(time.Duration(i)*time.Hour), restoreTestFiles(uint64(i)))
			}
		}, 1, []string{"step-2"}},
		{"LATEST names a commit not listed, with its order", func(t *testing.T, s *memStore) {
			for i := range 3 {
				restoreTestCommit(t, s, restoreTestJob, fmt.Sprintf("step-%d", i), t0.Add(time.Duration(i)*time.Hour), restoreTestFiles(uint64(i)))
			}
			at := t0.Add(90 * time.Minute)
			restoreTestPutJSON(t, s, LatestKey(restoreTestJob), Latest{Version: 2, Checkpoint: "step-9", Commit: restoreTestCommitID("step-9", at), CompleteAt: &at})
		}, 1, []string{"step-2"}},
		{"LATEST names a commit not listed, without its order: keep all", func(t *testing.T, s *memStore) {
			for i := range 3 {
				restoreTestCommit(t, s, restoreTestJob, fmt.Sprintf("step-%d", i), t0.Add(time.Duration(i)*time.Hour), restoreTestFiles(uint64(i)))
			}
			restoreTestPutJSON(t, s, LatestKey(restoreTestJob), Latest{Checkpoint: "step-9"})
		}, 1, nil},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			s := newMemStore()
			tt.setup(t, s)
			st, err := readJob(t.Context(), s, restoreTestJob, nil)
			if err != nil {
				t.Fatal(err)
			}
			if got := retainedNames(st, tt.keep); !slices.Equal(got, tt.want) {
				t.Errorf("Got(%q) = %q; want %q", tt.name, got, tt.want)
			}
		})
	}
}

// readLatest returns the job's LATEST.
func readLatest(t *testing.T, s Store) *Latest {
	t.Helper()
	data, _, err := s.GetBytes(t.Context(), LatestKey(restoreTestJob))
	if err != nil {
		t.Fatal(err)
	}
	var l Latest
	if err := json.Unmarshal(data, &l); err != nil {
		t.Fatal(err)
	}
	return &l
}

// LATEST moves only forward, also with writers racing (I3).
func TestAdvanceLatest(t *testing.T) {
	s := newMemStore()
	t0 := restoreTestT0
	var ms []*Manifest
	for i := range 8 {
		ms = append(ms, restoreTestCommit(t, s, restoreTestJob, fmt.Sprintf("step-%d", i), t0.Add(time.Duration(i)*time.Minute), restoreTestFiles(uint64(i))))
	}
	if moved, err := advanceLatest(t.Context(), s, ms[3], Host{}, nil); !moved || err != nil {
		t.Fatalf("advanceLatest to step-3 = %v, %v; want moved", moved, err)
	}
	if moved, err := advanceLatest(t.Context(), s, ms[1], Host{}, nil); moved || err != nil {
		t.Fatalf("advanceLatest back to step-1 = %v, %v; want not moved", moved, err)
	}
	if l := readLatest(t, s); l.Checkpoint != "step-3" || l.Commit != ms[3].Commit {
		t.Fatalf("LATEST = %+v; want step-3", l)
	}
	// Every commit races to become LATEST: the newest wins, whatever the order of the writes.
	var wg sync.WaitGroup
	for _, m := range slices.Backward(ms) {
		wg.Go(func() {
			if _, err := advanceLatest(t.Context(), s, m, Host{}, nil); err != nil {
				t.Errorf("advanceLatest(%s): %v", m.Checkpoint, err)
			}
		})
	}
	wg.Wait()
	if l := readLatest(t, s); l.Checkpoint != "step-7" {
		t.Errorf("LATEST = %+v after the race; want step-7", l)
	}
}

// LATEST's own complete_at is not taken on trust: a LATEST written by hand with a time in the
// future, naming an older commit, does not hold LATEST there; nor does one naming a commit that
// does not exist.
func TestAdvanceLatestReadsTheOrderOfTheCommitNamed(t *testing.T) {
	for _, name := range []string{"step-0", "step-9"} { // an older commit; none
		s := newMemStore()
		t0 := restoreTestT0
		var ms []*Manifest
		for i := range 3 {
			ms = append(ms, restoreTestCommit(t, s, restoreTestJob, fmt.Sprintf("step-%d", i), t0.Add(time.Duration(i)*time.Minute), restoreTestFiles(uint64(i))))
		}
		future := t0.Add(1000 * time.Hour)
		restoreTestPutJSON(t, s, LatestKey(restoreTestJob), Latest{Version: ManifestVersion, Checkpoint: name, Commit: ms[0].Commit, CompleteAt: &future})
		if moved, err := advanceLatest(t.Context(), s, ms[2], Host{}, nil); !moved || err != nil {
			t.Errorf("LATEST naming %s with complete_at %v: advanceLatest to step-2 = %v, %v; want moved", name, future, moved, err)
		}
		if l := readLatest(t, s); l.Checkpoint != "step-2" {
			t.Errorf("LATEST = %+v; want step-2", l)
		}
	}
	// list --check names a LATEST whose time is not its commit's.
	s := newMemStore()
	m := restoreTestCommit(t, s, restoreTestJob, "step-0", restoreTestT0, restoreTestFiles(0))
	future := restoreTestT0.Add(1000 * time.Hour)
	restoreTestPutJSON(t, s, LatestKey(restoreTestJob), Latest{Version: ManifestVersion, Checkpoint: "step-0", Commit: m.Commit, CompleteAt: &future})
	if problems := CheckJob(t.Context(), s, restoreTestJob, false); len(problems) != 1 || !strings.Contains(problems[0].Error(), "its manifest says") {
		t.Errorf("CheckJob with a LATEST whose complete_at is not its commit's = %v; want that problem", problems)
	}
}

// A manifest is never written over: a retry after a lost answer finds its own and succeeds, a
// different one is an error (I1).
func TestWriteManifestOnce(t *testing.T) {
	s := newMemStore()
	m := restoreTestCommit(t, s, restoreTestJob, "step-1", restoreTestT0, restoreTestFiles(1))
	again := *m
	again.CommittedAt = m.CommittedAt.Add(time.Second) // the retry's own manifest
	if err := writeManifest(t.Context(), s, &again); err != nil {
		t.Errorf("writeManifest of the same files again = %v; want nil", err)
	}
	other := restoreTestManifest(t, restoreTestJob, "step-1", restoreTestT0, restoreTestFiles(2))
	if err := writeManifest(t.Context(), s, other); !errors.Is(err, ErrExists) {
		t.Errorf("writeManifest of other files = %v; want ErrExists", err)
	}
	if got, err := ReadManifest(t.Context(), s, restoreTestJob, "step-1", m.Commit); err != nil || !sameFiles(got, m) {
		t.Errorf("the manifest changed: %v", err)
	}
}

// Retention deletes manifest first, never LATEST's target, and only what its order allows.
func TestApplyRetention(t *testing.T) {
	s := newMemStore()
	t0 := restoreTestT0
	for i := range 5 {
		restoreTestCommit(t, s, restoreTestJob, fmt.Sprintf("step-%d", i), t0.Add(time.Duration(i)*time.Hour), restoreTestFiles(uint64(i)))
	}
	restoreTestCommitV1(t, s, restoreTestJob, "old", t0.Add(-time.Hour), restoreTestFiles(9))
	restoreTestSetLatest(t, s, restoreTestJob, "step-3")
	ret, err := applyRetention(t.Context(), s, restoreTestJob, 1, 0, nil, nil, zerolog.Nop())
	if err != nil {
		t.Fatal(err)
	}
	deleted := ret.Deleted
	var names []string
	for _, d := range deleted {
		names = append(names, d.Checkpoint)
	}
	slices.Sort(names)
	if want := []string{"old", "step-0", "step-1", "step-2"}; !slices.Equal(names, want) {
		t.Errorf("Got(%q) = %q; want %q", "deleted", names, want)
	}
	cs, _, _ := ListCommitted(t.Context(), s, restoreTestJob)
	if len(cs) != 2 || cs[0].Manifest.Checkpoint != "step-4" || !cs[1].Latest {
		t.Errorf("after retention: %q; want step-4 and step-3 (LATEST)", listTestNames(cs))
	}
	if objs, _ := s.List(t.Context(), restoreTestJob+"/step-0/"); len(objs) != 0 {
		t.Errorf("step-0 still has %d objects", len(objs))
	}
	if objs, _ := s.List(t.Context(), restoreTestJob+"/old/"); len(objs) != 0 {
		t.Errorf("the version 1 checkpoint still has %d objects", len(objs))
	}
	if problems := CheckJob(t.Context(), s, restoreTestJob, false); len(problems) > 0 {
		t.Errorf("CheckJob: %v", problems)
	}
}

// readJob reads delimiter listings and manifests: the objects it lists do not grow with the
// files per checkpoint (I8).
func TestReadJobListsManifestsNotObjects(t *testing.T) {
	count := func(files int) memListStats {
		s := newMemStore()
		for i := range 20 {
			fs := map[string]string{}
			for j := range files {
				fs[fmt.Sprintf("f-%d", j)] = "x"
			}
			restoreTestCommit(t, s, restoreTestJob, fmt.Sprintf("step-%d", i), restoreTestT0.Add(time.Duration(i)*time.Minute), fs)
		}
		before := s.stats()
		if _, err := readJob(t.Context(), s, restoreTestJob, nil); err != nil {
			t.Fatal(err)
		}
		after := s.stats()
		return memListStats{Lists: after.Lists - before.Lists, ListDirs: after.ListDirs - before.ListDirs,
			Objects: after.Objects - before.Objects, Dirs: after.Dirs - before.Dirs}
	}
	few, many := count(2), count(200)
	if few != many || few.Lists != 0 {
		t.Errorf("reading a job: %+v with 2 files per checkpoint, %+v with 200; want the same, and no full listing", few, many)
	}
}

// readHookStore is a memStore that runs a hook registered for a key once, before the first read of
// that key.
type readHookStore struct {
	*memStore
	mu    sync.Mutex
	hooks map[string]func()
}

func (s *readHookStore) on(key string, hook func()) {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.hooks[key] = hook
}

func (s *readHookStore) GetBytes(ctx context.Context, key string) ([]byte, string, error) {
	s.mu.Lock()
	hook := s.hooks[key]
	delete(s.hooks, key)
	s.mu.Unlock()
	if hook != nil {
		hook()
	}
	return s.memStore.GetBytes(ctx, key)
}

// A reading of the job is not one step: an agent can commit between its listing and its read of
// LATEST, and its retention can then delete what LATEST named. readJob still gives LATEST's
// target, with no problem (`spotguard list --check` on a live job, and the soak, saw "LATEST
// names ... which has no valid manifest").
func TestReadJobWhileAnAgentCommits(t *testing.T) {
	t0 := restoreTestT0
	commit := func(t *testing.T, s Store, name string, at time.Time) *Manifest {
		m := putSingle(t, s, name, "i-a", map[string][]byte{"a": randomBytes(t, 1<<10)}, at)
		if _, err := advanceLatest(t.Context(), s, m, m.Host, nil); err != nil {
			t.Fatal(err)
		}
		return m
	}
	for _, tt := range []struct {
		name string
		// race registers what happens during the reading.
		race func(t *testing.T, s *readHookStore)
	}{
		{"committed after the listing", func(t *testing.T, s *readHookStore) {
			s.on(LatestKey("job"), func() { commit(t, s, "step-2", t0.Add(2*time.Minute)) })
		}},
		{"committed after the listing, then LATEST moved on and retention deleted it", func(t *testing.T, s *readHookStore) {
			s.on(LatestKey("job"), func() {
				x := commit(t, s, "step-2", t0.Add(2*time.Minute))
				s.on(ManifestKey("job", x.Checkpoint, x.Commit), func() {
					commit(t, s, "step-3", t0.Add(3*time.Minute))
					s.remove(ManifestKey("job", x.Checkpoint, x.Commit))
					for _, f := range x.Files {
						s.remove(x.FileKey(f))
					}
				})
			})
		}},
	} {
		t.Run(tt.name, func(t *testing.T) {
			s := &readHookStore{memStore: newMemStore(), hooks: map[string]func(){}}
			commit(t, s, "step-1", t0.Add(time.Minute))
			tt.race(t, s)
			st, err := readJob(t.Context(), s, "job", nil)
			if err != nil {
				t.Fatal(err)
			}
			if len(st.Problems) > 0 {
				t.Errorf("problems: %v; want none", st.Problems)
			}
			target := st.LatestTarget()
			if target == nil || st.Latest == nil {
				t.Fatalf("no LATEST target (LATEST %+v)", st.Latest)
			}
			if n := len(s.hooks); n > 0 {
				t.Errorf("%d hooks did not run: the reading did not go as the test means", n)
			}
			data, _, err := s.GetBytes(t.Context(), LatestKey("job"))
			if err != nil {
				t.Fatal(err)
			}
			var l Latest
			if err := json.Unmarshal(data, &l); err != nil {
				t.Fatal(err)
			}
			if target.Manifest.Commit != l.Commit || st.Latest.Commit != l.Commit {
				t.Errorf("LATEST target %s, LATEST as read %s; want LATEST's %s/%s", target.Key, st.Latest.Commit, l.Checkpoint, l.Commit)
			}
		})
	}
}

// A LATEST whose target was deleted by hand (the whole commit) names no valid manifest, also for
// a reader whose cache still holds that manifest (the agent's, which committed it): the agent
// then moves LATEST to the newest commit there is.
func TestReadJobLatestTargetDeletedByHand(t *testing.T) {
	s := newMemStore()
	old := putSingle(t, s, "step-1", "i-a", map[string][]byte{"a": randomBytes(t, 1<<10)}, restoreTestT0)
	m := putSingle(t, s, "step-2", "i-a", map[string][]byte{"a": randomBytes(t, 1<<10)}, restoreTestT0.Add(time.Minute))
	if _, err := advanceLatest(t.Context(), s, m, m.Host, nil); err != nil {
		t.Fatal(err)
	}
	cache := &manifestCache{}
	key := ManifestKey("job", m.Checkpoint, m.Commit)
	cache.put(key, m)
	s.remove(key)
	for _, f := range m.Files {
		s.remove(m.FileKey(f))
	}
	st, err := readJob(t.Context(), s, "job", cache)
	if err != nil {
		t.Fatal(err)
	}
	if len(st.Commits) != 1 || st.Commits[0].Manifest.Commit != old.Commit {
		t.Errorf("commits %v; want only step-1's", st.Commits)
	}
	if len(st.Problems) != 1 || !strings.Contains(st.Problems[0].Error(), "which has no valid manifest") {
		t.Errorf("problems %v; want LATEST naming no valid manifest", st.Problems)
	}
}
