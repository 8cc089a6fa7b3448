package checkpoint

import (
	"bytes"
	"errors"
	"fmt"
	"regexp"
	"strings"
	"testing"
	"time"
)

// listTestNames returns the checkpoint names of cs, with "*" after the one marked Latest.
func listTestNames(cs []Committed) []string {
	var names []string
	for _, c := range cs {
		n := c.Manifest.Checkpoint
		if c.Latest {
			n += "*"
		}
		names = append(names, n)
	}
	return names
}

func TestListCommitted(t *testing.T) {
	t0 := restoreTestT0
	tests := []struct {
		name     string
		setup    func(t *testing.T, s *memStore)
		want     []string // names, newest first, "*" on LATEST
		problems []string // one substring per problem, in order
	}{
		{"empty store", func(t *testing.T, s *memStore) {}, nil, nil},
		{"newest first, LATEST marked", func(t *testing.T, s *memStore) {
			restoreTestCommit(t, s, restoreTestJob, "step-9", t0, restoreTestFiles(1))
			restoreTestCommit(t, s, restoreTestJob, "step-10", t0.Add(2*time.Hour), restoreTestFiles(2))
			restoreTestCommit(t, s, restoreTestJob, "step-11", t0.Add(time.Hour), restoreTestFiles(3))
			restoreTestSetLatest(t, s, restoreTestJob, "step-11")
		}, []string{"step-10", "step-11*", "step-9"}, nil},
		{"equal times by name, no LATEST", func(t *testing.T, s *memStore) {
			restoreTestCommit(t, s, restoreTestJob, "a", t0, restoreTestFiles(1))
			restoreTestCommit(t, s, restoreTestJob, "b", t0, restoreTestFiles(2))
		}, []string{"b", "a"}, nil},
		{"only manifests count", func(t *testing.T, s *memStore) {
			restoreTestCommit(t, s, restoreTestJob, "step-1", t0, map[string]string{
				"a":                            "1",
				"sub/_spotguard/manifest.json": "a trainer's file, not a manifest",
			})
			s.put(DataKey(restoreTestJob, "step-2", restoreTestCommitID("step-2", t0), "model.pt"), []byte("uncommitted"))
			s.put(restoreTestJob+"/"+MetaDir+"/manifest.json", []byte("{"))
			restoreTestCommit(t, s, restoreTestJob+"-2", "step-3", t0, restoreTestFiles(3))
			restoreTestCommit(t, s, "x"+restoreTestJob, "step-4", t0, restoreTestFiles(4))
		}, []string{"step-1"}, nil},
		{"invalid manifests are problems", func(t *testing.T, s *memStore) {
			restoreTestCommit(t, s, restoreTestJob, "step-1", t0, restoreTestFiles(1))
			s.put(ManifestKey(restoreTestJob, "step-2", restoreTestCommitID("step-2", t0)), []byte("not json"))
			m := restoreTestManifest(t, restoreTestJob, "step-3", t0, map[string]string{"a": "1"})
			m.Files[0].Path = "../a"
			restoreTestPutJSON(t, s, ManifestKey(restoreTestJob, "step-3", restoreTestCommitID("step-3", t0)), m)
			m = restoreTestManifest(t, "other", "step-4", t0, map[string]string{"a": "1"})
			restoreTestPutJSON(t, s, ManifestKey(restoreTestJob, "step-4", restoreTestCommitID("step-4", t0)), m)
			restoreTestSetLatest(t, s, restoreTestJob, "step-1")
		}, []string{"step-1*"}, []string{
			ManifestKey(restoreTestJob, "step-2", restoreTestCommitID("step-2", t0)) + ": manifest is not valid JSON",
			ManifestKey(restoreTestJob, "step-3", restoreTestCommitID("step-3", t0)) + `: manifest of llama-70b/step-3 is invalid: a file's path: path "../a" has a ".." element`,
			ManifestKey(restoreTestJob, "step-4", restoreTestCommitID("step-4", t0)) + `: manifest names job "other" checkpoint "step-4"`,
		}},
		{"LATEST names a checkpoint without a valid manifest", func(t *testing.T, s *memStore) {
			restoreTestCommit(t, s, restoreTestJob, "step-1", t0, restoreTestFiles(1))
			s.put(ManifestKey(restoreTestJob, "step-2", restoreTestCommitID("step-2", t0)), []byte("{}"))
			restoreTestSetLatest(t, s, restoreTestJob, "step-2")
		}, []string{"step-1"}, []string{
			ManifestKey(restoreTestJob, "step-2", restoreTestCommitID("step-2", t0)) + ": manifest of / is invalid",
			LatestKey(restoreTestJob) + ` names checkpoint "step-2" commit ""`,
		}},
		{"LATEST names a missing checkpoint", func(t *testing.T, s *memStore) {
			restoreTestCommit(t, s, restoreTestJob, "step-1", t0, restoreTestFiles(1))
			restoreTestSetLatest(t, s, restoreTestJob, "step-2")
		}, []string{"step-1"}, []string{LatestKey(restoreTestJob) + ` names checkpoint "step-2"`}},
		{"LATEST not JSON", func(t *testing.T, s *memStore) {
			restoreTestCommit(t, s, restoreTestJob, "step-1", t0, restoreTestFiles(1))
			s.put(LatestKey(restoreTestJob), []byte("step-1"))
		}, []string{"step-1"}, []string{LatestKey(restoreTestJob) + " is not valid JSON"}},
		{"LATEST names a path", func(t *testing.T, s *memStore) {
			restoreTestCommit(t, s, restoreTestJob, "step-1", t0, restoreTestFiles(1))
			restoreTestSetLatest(t, s, restoreTestJob, "step-1/../../x")
		}, []string{"step-1"}, []string{LatestKey(restoreTestJob) + ": checkpoint:"}},
		{"a commit without its manifest is not committed", func(t *testing.T, s *memStore) {
			restoreTestCommit(t, s, restoreTestJob, "step-1", t0, restoreTestFiles(1))
			restoreTestCommit(t, s, restoreTestJob, "step-2", t0, restoreTestFiles(2))
			s.failKey(ManifestKey(restoreTestJob, "step-2", restoreTestCommitID("step-2", t0)), fmt.Errorf("deleted meanwhile: %w", ErrNotFound))
		}, []string{"step-1"}, nil},
		{"version 1 and version 2 commits together, ordered by completion", func(t *testing.T, s *memStore) {
			restoreTestCommitV1(t, s, restoreTestJob, "step-1", t0, restoreTestFiles(1))
			restoreTestCommit(t, s, restoreTestJob, "step-1", t0.Add(2*time.Hour), restoreTestFiles(2))
			restoreTestCommitV1(t, s, restoreTestJob, "step-2", t0.Add(time.Hour), restoreTestFiles(3))
			restoreTestSetLatest(t, s, restoreTestJob, "step-2")
		}, []string{"step-1", "step-2*", "step-1"}, nil},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			s := newMemStore()
			tt.setup(t, s)
			cs, problems, err := ListCommitted(t.Context(), s, restoreTestJob)
			if err != nil {
				t.Fatalf("ListCommitted() error: %v", err)
			}
			if got := listTestNames(cs); strings.Join(got, " ") != strings.Join(tt.want, " ") {
				t.Errorf("Got(%q) = %q; want %q", tt.name, got, tt.want)
			}
			for _, c := range cs {
				if want := ManifestKey(restoreTestJob, c.Manifest.Checkpoint, c.Manifest.Commit); c.Key != want {
					t.Errorf("Got(%q) = %q; want %q", "key", c.Key, want)
				}
			}
			if len(problems) != len(tt.problems) {
				t.Fatalf("Got(%q) = %q; want %d problems: %q", tt.name, problems, len(tt.problems), tt.problems)
			}
			for i, want := range tt.problems {
				if !strings.HasPrefix(problems[i].Error(), want) {
					t.Errorf("Got(%q) = %q; want it to start with %q", fmt.Sprint("problem ", i), problems[i], want)
				}
			}
		})
	}
}

func TestListCommittedErrors(t *testing.T) {
	t0 := restoreTestT0
	errBoom := errors.New("boom")
	tests := []struct {
		name  string
		job   string
		setup func(s *memStore)
		is    error
	}{
		{"invalid job", "a/b", func(s *memStore) {}, nil},
		{"list fails", restoreTestJob, func(s *memStore) { s.listErr = errBoom }, errBoom},
		{"manifest read fails", restoreTestJob, func(s *memStore) {
			s.failKey(ManifestKey(restoreTestJob, "step-2", restoreTestCommitID("step-2", t0)), errBoom)
		}, errBoom},
		{"LATEST read fails", restoreTestJob, func(s *memStore) { s.failKey(LatestKey(restoreTestJob), errBoom) }, errBoom},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			s := newMemStore()
			restoreTestCommit(t, s, restoreTestJob, "step-1", restoreTestT0, restoreTestFiles(1))
			restoreTestCommit(t, s, restoreTestJob, "step-2", restoreTestT0, restoreTestFiles(2))
			tt.setup(s)
			cs, problems, err := ListCommitted(t.Context(), s, tt.job)
			if err == nil || cs != nil || problems != nil {
				t.Fatalf("Got(%q) = %v, %v, %v; want nil, nil, an error", tt.name, cs, problems, err)
			}
			if tt.is != nil && (!errors.Is(err, tt.is) || !strings.Contains(err.Error(), "mem://bucket/prefix") || !strings.Contains(err.Error(), restoreTestJob)) {
				t.Errorf("Got(%q) = %v; want %v, naming the store and job", tt.name, err, tt.is)
			}
		})
	}
}

func TestFormatList(t *testing.T) {
	t0 := time.Date(2026, 3, 1, 12, 0, 0, 0, time.FixedZone("CET", 3600))
	mk := func(name, commit string, files int, size int64, trigger string, at time.Time) *Manifest {
		complete := at.Add(-time.Minute)
		return &Manifest{Checkpoint: name, Commit: commit, Files: make([]File, files), TotalBytes: size, Trigger: trigger, CommittedAt: at,
			Timings: Timings{CompleteAt: &complete}}
	}
	cs := []Committed{
		{Manifest: mk("step-000300", "20260301T125500Z-0123456789ab", 17, 3<<30+512<<20, "notice", t0.Add(2*time.Hour))},
		{Manifest: mk("step-000200", "20260301T115500Z-ba9876543210", 17, 1536<<10, "periodic", t0.Add(time.Hour)), Latest: true},
		{Manifest: &Manifest{Version: 1, Checkpoint: "step-000100-with-a-long-name", Files: make([]File, 1), CommittedAt: t0}},
	}
	var b bytes.Buffer
	FormatList(&b, cs)
	want := "" +
		"CHECKPOINT                    COMMIT                         FILES  SIZE     TRIGGER   COMPLETED AT\n" +
		"step-000300                   20260301T125500Z-0123456789ab  17     3.5 GiB  notice    2026-03-01T12:59:00Z\n" +
		"step-000200                   20260301T115500Z-ba9876543210  17     1.5 MiB  periodic  2026-03-01T11:59:00Z  LATEST\n" +
		"step-000100-with-a-long-name  -                              1      0 B      -         2026-03-01T11:00:00Z\n"
	if b.String() != want {
		t.Errorf("Got(%q) =\n%s; want\n%s", "FormatList", b.String(), want)
	}
	if regexp.MustCompile(` +\n`).MatchString(b.String()) {
		t.Errorf("Got(%q) = %q; want no trailing spaces", "FormatList", b.String())
	}

	// A name a terminal would not print as itself is quoted: a right-to-left override drew the
	// rest of its row reversed, LATEST included (found from outside).
	b.Reset()
	FormatList(&b, []Committed{{Manifest: mk("step-\u202e1", "20260301T125500Z-0123456789ab", 1, 1, "periodic", t0), Latest: true}})
	if !strings.Contains(b.String(), `"step-\u202e1"  20260301T125500Z-0123456789ab`) {
		t.Errorf("Got(%q) = %q; want the name quoted", "FormatList", b.String())
	}

	b.Reset()
	FormatList(&b, nil)
	if got, want := b.String(), "CHECKPOINT  COMMIT  FILES  SIZE  TRIGGER  COMPLETED AT\n"; got != want {
		t.Errorf("Got(%q) = %q; want %q", "FormatList(nil)", got, want)
	}
}

func TestListHumanBytes(t *testing.T) {
	tests := []struct {
		n    int64
		want string
	}{
		{0, "0 B"},
		{1, "1 B"},
		{1023, "1023 B"},
		{1024, "1.0 KiB"},
		{1536, "1.5 KiB"},
		{1<<20 - 1, "1.0 MiB"},
		{5 << 30, "5.0 GiB"},
		{1 << 40, "1.0 TiB"},
		{1<<63 - 1, "8.0 EiB"},
		{-5, "-5 B"},
	}
	for _, tt := range tests {
		if got := HumanBytes(tt.n); got != tt.want {
			t.Errorf("Got(%q) = %q; want %q", fmt.Sprint(tt.n), got, tt.want)
		}
	}
}

// `list --check` (CheckJob) flags a job that holds single-node commits and multi-node ones (job
// manifests or parts): a node of a multi-node job left at store.world_nodes 1, whose torn
// commits of the same saves it names; a job of one layout passes.
func TestCheckNodeLayout(t *testing.T) {
	t0 := time.Now().Add(-time.Hour)
	jobSave := func(t *testing.T, s Store, name string, at time.Time) {
		var p *Manifest
		for rank := range 2 {
			p = putPart(t, s, name, rank, 2, fmt.Sprintf("i-node%d", rank), nodeFiles(t, rank, []byte("c")), at, time.Now())
		}
		if r := completeSave(t.Context(), s, p, "_COMPLETE", Host{}, time.Hour, nil); !r.written {
			t.Fatalf("completeSave(%s) = %+v", name, r)
		}
	}
	tests := []struct {
		name  string
		setup func(t *testing.T, s Store)
		want  []string // substrings of the one error; nil: none
	}{
		{"single-node only", func(t *testing.T, s Store) {
			putSingle(t, s, "step-000100", "i-a", nodeFiles(t, 0, nil), t0)
			putSingle(t, s, "step-000200", "i-a", nodeFiles(t, 0, nil), t0.Add(time.Minute))
		}, nil},
		{"multi-node only", func(t *testing.T, s Store) {
			jobSave(t, s, "step-000100", t0)
			putPart(t, s, "step-000200", 0, 2, "i-node0", nodeFiles(t, 0, nil), t0.Add(time.Minute), time.Now())
		}, nil},
		{"a node left at world_nodes 1", func(t *testing.T, s Store) {
			putPart(t, s, "step-000100", 0, 2, "i-u0", nodeFiles(t, 0, nil), t0, time.Now())
			putSingle(t, s, "step-000100", "i-u1", nodeFiles(t, 1, nil), t0.Add(2*time.Second))
		}, []string{"single-node commits (1, the newest step-000100/", "from i-u1", "0 job checkpoints, 1 parts in none of them",
			"saved both ways, a single-node commit beside the parts of the same save: step-000100", "store.world_nodes unset"}},
		{"beside job checkpoints", func(t *testing.T, s Store) {
			jobSave(t, s, "step-000100", t0)
			putSingle(t, s, "step-000100", "i-u1", nodeFiles(t, 1, nil), t0.Add(30*time.Second))
			jobSave(t, s, "step-000200", t0.Add(10*time.Minute))
		}, []string{"2 job checkpoints", "saved both ways", "step-000100"}},
		{"resized from one node", func(t *testing.T, s Store) {
			putSingle(t, s, "step-000100", "i-a", nodeFiles(t, 0, nil), t0)
			jobSave(t, s, "step-000200", t0.Add(10*time.Minute))
		}, []string{"single-node commits (1", "1 job checkpoints", "give each size its own store.job"}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			s := newMemStore()
			tt.setup(t, s)
			st, err := readJob(t.Context(), s, "job", nil)
			if err != nil {
				t.Fatal(err)
			}
			err = checkNodeLayout(st)
			if tt.want == nil {
				if err != nil {
					t.Errorf("checkNodeLayout = %v; want nil", err)
				}
				return
			}
			for _, w := range tt.want {
				if err == nil || !strings.Contains(err.Error(), w) {
					t.Errorf("checkNodeLayout = %v; want it to say %q", err, w)
				}
			}
			if strings.Contains(tt.name, "resized") && err != nil && strings.Contains(err.Error(), "saved both ways") {
				t.Errorf("checkNodeLayout = %v; names no save both ways (none is)", err)
			}
		})
	}
}
