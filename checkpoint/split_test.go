package checkpoint

import (
	"bytes"
	"errors"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"
)

// splitTestCommit commits files as checkpoint cp, completed at at, by instance host (the
// manifest, its objects and LATEST, as an agent does), and returns the manifest.
func splitTestCommit(t *testing.T, s *memStore, host, cp string, at time.Time, files map[string]string) *Manifest {
	t.Helper()
	m := restoreTestManifest(t, restoreTestJob, cp, at, files)
	m.Host = Host{InstanceID: host}
	for _, f := range m.Files {
		s.put(f.Key, []byte(files[f.Path]))
	}
	restoreTestPutJSON(t, s, ManifestKey(restoreTestJob, cp, m.Commit), m)
	restoreTestSetLatest(t, s, restoreTestJob, cp)
	return m
}

// Every node of a multi-node job left at store.world_nodes 1 commits its own files alone, as a
// checkpoint of one node, under the same name within seconds: each commit is whole as one, and
// the newest was restored as the checkpoint, torn (the other node's files are in the other
// commit). Restore refuses it, naming the pieces and the newest whole commit before them;
// asked for by its commit, a piece is restored; `list --check` names the save. (Found from
// outside: two agents, one job, the default store.world_nodes.)
func TestSaveCommittedInPiecesIsNotRestored(t *testing.T) {
	s := newMemStore()
	whole := splitTestCommit(t, s, "i-0aaa", "step-50", restoreTestT0, map[string]string{"rank0.pt": "a50", "rank1.pt": "b50", "_COMPLETE": ""})
	node0 := splitTestCommit(t, s, "i-0aaa", "step-100", restoreTestT0.Add(10*time.Minute), map[string]string{"rank0.pt": "a100", "_COMPLETE": ""})
	node1 := splitTestCommit(t, s, "i-0bbb", "step-100", restoreTestT0.Add(10*time.Minute+3*time.Second), map[string]string{"rank1.pt": "b100", "_COMPLETE": ""})

	for _, name := range []string{"", "step-100"} {
		_, to := restoreTestDirs(t)
		var log bytes.Buffer
		opts := restoreTestOpts(to, &log)
		opts.Checkpoint = name
		_, err := Restore(t.Context(), s, opts)
		var split *SplitSaveError
		if !errors.Is(err, ErrSplitSave) || !errors.As(err, &split) {
			t.Fatalf("Restore(checkpoint %q) error = %v; want a SplitSaveError", name, err)
		}
		for _, want := range []string{"checkpoint step-100 was committed in 2 pieces by 2 instances within 3s",
			"commit " + node0.Commit + " by i-0aaa, 2 files; commit " + node1.Commit + " by i-0bbb, 2 files",
			"store.world_nodes unset", "--checkpoint step-50 --commit " + whole.Commit} {
			if name != "" && strings.Contains(want, "step-50") {
				continue // no older commit of step-100 to name
			}
			if !strings.Contains(err.Error(), want) {
				t.Errorf("Restore(checkpoint %q) error:\n%v\nwant it to say %q", name, err, want)
			}
		}
		if entries, _ := os.ReadDir(to); len(entries) != 0 {
			t.Errorf("Restore(checkpoint %q) left %v in the destination; want nothing", name, entries)
		}
	}

	_, to := restoreTestDirs(t)
	var log bytes.Buffer
	opts := restoreTestOpts(to, &log)
	opts.Checkpoint, opts.Commit, opts.CommitSet = "step-100", node1.Commit, true
	if _, err := Restore(t.Context(), s, opts); err != nil {
		t.Fatalf("Restore of the piece %s asked for: %v", node1.Commit, err)
	}
	if got, err := os.ReadFile(filepath.Join(to, "step-100", "rank1.pt")); err != nil || string(got) != "b100" {
		t.Errorf("restored rank1.pt = %q, %v; want b100", got, err)
	}

	cs, _, err := ListCommitted(t.Context(), s, restoreTestJob)
	if err != nil {
		t.Fatal(err)
	}
	errs := SplitSaves(cs, "")
	if len(errs) != 1 || !errors.Is(errs[0], ErrSplitSave) || !strings.Contains(errs[0].Error(), "checkpoint step-100 was committed in 2 pieces") {
		t.Errorf("SplitSaves = %v; want the one of step-100", errs)
	}
}

// What is no save in pieces: the same bytes from every node (a replicated model each node saves),
// the same paths with other bytes (two instances training the job at once, as in a capacity
// rebalance: the newest is restored), one save committed again with a file written after its
// marker (by an agent restarted in a container of another host name), one instance saving a name again (a rollback), another instance saving it minutes later (a
// resumed run), markers with other bytes (two saves), commits whose instance is unknown.
func TestSavesNotInPieces(t *testing.T) {
	t1 := restoreTestT0.Add(time.Minute)
	for _, tc := range []struct {
		name         string
		hostA, hostB string
		atB          time.Time
		a, b         map[string]string
	}{
		{"same bytes", "i-0aaa", "i-0bbb", t1, map[string]string{"model.pt": "w", "_COMPLETE": ""}, map[string]string{"model.pt": "w", "_COMPLETE": ""}},
		{"same paths", "i-0aaa", "i-0bbb", t1, map[string]string{"model.pt": "w1", "_COMPLETE": ""}, map[string]string{"model.pt": "w2", "_COMPLETE": ""}},
		{"a file more", "host-a", "host-b", t1, map[string]string{"__0_0.distcp": "a", ".metadata": ""}, map[string]string{"__0_0.distcp": "a", ".metadata": "", "metadata.json": "{}"}},
		{"one instance", "i-0aaa", "i-0aaa", t1, map[string]string{"model.pt": "w1", "_COMPLETE": ""}, map[string]string{"model.pt": "w2", "_COMPLETE": ""}},
		{"minutes apart", "i-0aaa", "i-0bbb", restoreTestT0.Add(5 * time.Minute), map[string]string{"rank0.pt": "a", "_COMPLETE": ""}, map[string]string{"rank1.pt": "b", "_COMPLETE": ""}},
		{"other markers", "i-0aaa", "i-0bbb", t1, map[string]string{"rank0.pt": "a", "_COMPLETE": "step 100"}, map[string]string{"rank1.pt": "b", "_COMPLETE": "step 101"}},
		{"unknown instance", "", "", t1, map[string]string{"rank0.pt": "a", "_COMPLETE": ""}, map[string]string{"rank1.pt": "b", "_COMPLETE": ""}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			s := newMemStore()
			splitTestCommit(t, s, tc.hostA, "step-100", restoreTestT0, tc.a)
			b := splitTestCommit(t, s, tc.hostB, "step-100", tc.atB, tc.b)
			_, to := restoreTestDirs(t)
			var log bytes.Buffer
			res, err := Restore(t.Context(), s, restoreTestOpts(to, &log))
			if err != nil || res.Commit != b.Commit {
				t.Errorf("Restore() = %s, %v; want the newest commit %s", res.Commit, err, b.Commit)
			}
			cs, _, err := ListCommitted(t.Context(), s, restoreTestJob)
			if err != nil {
				t.Fatal(err)
			}
			if errs := SplitSaves(cs, ""); len(errs) != 0 {
				t.Errorf("SplitSaves = %v; want none", errs)
			}
		})
	}
}
