package checkpoint

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"testing/synctest"
	"time"

	"github.com/rs/zerolog"
)

// startNode starts an uploader rig as node rank of a world-node job, on instance host.
func startNode(t *testing.T, store Store, rank, world int, host string) *uploaderRig {
	t.Helper()
	return startUploaderWith(t, t.TempDir(), store, UploaderConfig{NodeRank: rank, WorldNodes: world, PartWait: 30 * time.Second,
		Host: func() Host { return Host{InstanceID: host} }})
}

// waitPart waits for the node's part of name to be committed and returns it.
func (r *uploaderRig) waitPart(name string) *Manifest {
	r.t.Helper()
	m := r.waitCommitted(name).Manifest
	if m.Part == nil {
		r.t.Fatalf("%s committed without a part: %+v", name, m)
	}
	return m
}

// putPart writes a node's part of job/name directly into s, as an agent would have before it
// died: its files under a commit of its own, then its part manifest.
func putPart(t testing.TB, s Store, name string, rank, world int, host string, files map[string][]byte, complete, committed time.Time) *Manifest {
	t.Helper()
	return putCommit(t, s, name, host, files, complete, committed, &Part{NodeRank: rank, WorldNodes: world})
}

// putCommit writes files under a new commit of job/name directly into s, then its part manifest
// (part set) or its manifest, and returns it.
func putCommit(t testing.TB, s Store, name, host string, files map[string][]byte, complete, committed time.Time, part *Part) *Manifest {
	t.Helper()
	commit := NewCommitID(committed)
	m := &Manifest{Version: ManifestVersion, Job: "job", Checkpoint: name, Commit: commit, Host: Host{InstanceID: host},
		Trigger: "periodic", CommittedAt: committed, Part: part}
	m.Timings.CompleteAt = &complete
	for rel, data := range files {
		key := DataKey("job", name, commit, rel)
		if _, err := s.PutBytes(t.Context(), key, data, Cond{}); err != nil {
			t.Fatal(err)
		}
		sum, _ := ChecksumOf(bytes.NewReader(data))
		m.Files = append(m.Files, File{Path: rel, Key: key, Size: int64(len(data)), Mode: "0644", Checksum: sum})
		m.TotalBytes += int64(len(data))
	}
	slices.SortFunc(m.Files, func(a, b File) int { return strings.Compare(a.Path, b.Path) })
	if err := m.Validate(); err != nil {
		t.Fatal(err)
	}
	write := writeManifest
	if part != nil {
		write = writePart
	}
	if err := write(t.Context(), s, m); err != nil {
		t.Fatal(err)
	}
	return m
}

// nodeFiles are node rank's files of a save: its own shard, a config every node writes alike,
// and the (empty) marker.
func nodeFiles(t *testing.T, rank int, config []byte) map[string][]byte {
	return map[string][]byte{fmt.Sprintf("shard-%d.bin", rank): randomBytes(t, 64<<10+rank), "config.json": config, "_COMPLETE": nil}
}

// withoutMarker returns files without the marker: writeCheckpoint writes it last, and written in
// the map's order as a file it could come before another file (which is then written after the
// marker, a new version of the checkpoint).
func withoutMarker(files map[string][]byte) map[string][]byte {
	delete(files, "_COMPLETE")
	return files
}

func mustNewFileStore(t *testing.T) *FileStore {
	t.Helper()
	s, err := NewFileStore(t.TempDir())
	if err != nil {
		t.Fatal(err)
	}
	return s
}

// Four agents, one per node, each with its own checkpoint directory, commit one save: each its
// part, one of them the job manifest (the others see it), LATEST on it; the store passes every
// invariant check; a restore returns every node's files, and --part one node's and the shared.
func TestMultiNodeCommit(t *testing.T) {
	store := mustNewFileStore(t)
	const world = 4
	config := []byte(`{"lr": 0.1}`)
	all := map[string][]byte{}
	var rigs []*uploaderRig
	for rank := range world {
		r := startNode(t, store, rank, world, fmt.Sprintf("i-node%d", rank))
		files := nodeFiles(t, rank, config)
		delete(files, "_COMPLETE") // writeCheckpoint writes the marker
		writeCheckpoint(t, r.dir, "step-000100", files)
		for rel, data := range files {
			all[rel] = data
		}
		rigs = append(rigs, r)
	}
	var writers int
	for rank, r := range rigs {
		if p := r.waitPart("step-000100"); p.Part.NodeRank != rank || p.Part.WorldNodes != world {
			t.Errorf("node %d's part says %+v", rank, p.Part)
		}
		ev := r.waitEvent(JobCheckpointCommitted, "step-000100")
		if !ev.Already {
			writers++
		}
	}
	if writers != 1 {
		t.Errorf("%d agents wrote the job manifest; want exactly one (the others see it)", writers)
	}

	cs, problems, err := ListCommitted(t.Context(), store, "job")
	if err != nil || len(problems) > 0 || len(cs) != 1 {
		t.Fatalf("ListCommitted = %d commits, %v, %v; want the one job checkpoint", len(cs), problems, err)
	}
	m := cs[0].Manifest
	if !cs[0].Latest || m.WorldNodes != world || len(m.Parts) != world || m.Commit != m.Parts[0].Commit {
		t.Errorf("job manifest: latest %v, world_nodes %d, %d parts, commit %s (rank 0's %s)", cs[0].Latest, m.WorldNodes, len(m.Parts), m.Commit, m.Parts[0].Commit)
	}
	for _, f := range m.Files {
		want := []int{0, 1, 2, 3}
		if strings.HasPrefix(f.Path, "shard-") {
			var r int
			fmt.Sscanf(f.Path, "shard-%d.bin", &r)
			want = []int{r}
		}
		if !slices.Equal(f.Nodes, want) {
			t.Errorf("%s: nodes %v; want %v", f.Path, f.Nodes, want)
		}
	}
	if v := CheckJob(t.Context(), store, "job", true); len(v) > 0 {
		t.Errorf("invariants: %v", v)
	}
	if inc, err := ListIncomplete(t.Context(), store, "job"); err != nil || len(inc) != 0 {
		t.Errorf("ListIncomplete = %+v, %v; want none", inc, err)
	}
	restoreAndCompare(t, store, "step-000100", all)

	// Only node 2's part: its shard, the config and the marker every node has.
	to := t.TempDir()
	two := 2
	res, err := Restore(t.Context(), store, RestoreOptions{Job: "job", To: to, Part: &two, Logger: zerolog.Nop()})
	if err != nil {
		t.Fatal(err)
	}
	entries, _ := os.ReadDir(filepath.Join(to, "step-000100"))
	var names []string
	for _, e := range entries {
		names = append(names, e.Name())
	}
	if !slices.Equal(names, []string{"_COMPLETE", "config.json", "shard-2.bin"}) || res.Files != 3 {
		t.Errorf("restore --part 2 gave %v (%d files); want node 2's shard and the shared files", names, res.Files)
	}
	if got, _ := os.ReadFile(filepath.Join(to, "step-000100", "shard-2.bin")); !bytes.Equal(got, all["shard-2.bin"]) {
		t.Error("restored shard-2.bin differs")
	}
}

// A save that can never be committed as it is (two instances claiming node rank 1, or parts
// disagreeing on world_nodes) is listed with why, and `list --check` (CheckJob) fails on it; a
// save that only waits for a part is neither.
func TestIncompleteSaveThatCanNeverCommitIsSaid(t *testing.T) {
	store := newMemStore()
	at := time.Now().Add(-time.Hour).Truncate(time.Second)
	files := map[string][]byte{"a.bin": []byte("a")}
	putPart(t, store, "step-000100", 0, 2, "i-a", files, at, at.Add(time.Second))
	putPart(t, store, "step-000100", 1, 2, "i-b", files, at.Add(time.Second), at.Add(2*time.Second))
	putPart(t, store, "step-000100", 1, 2, "i-c", files, at.Add(2*time.Second), at.Add(3*time.Second))
	putPart(t, store, "step-000200", 0, 2, "i-a", files, at.Add(10*time.Minute), at.Add(10*time.Minute))
	putPart(t, store, "step-000200", 1, 3, "i-b", files, at.Add(10*time.Minute), at.Add(10*time.Minute))
	// Rank 0 of the other count, by another instance (a job resized with its disks kept): not
	// rank 0 claimed twice, only the counts disagreeing.
	putPart(t, store, "step-000200", 0, 3, "i-c", files, at.Add(10*time.Minute), at.Add(10*time.Minute))
	putPart(t, store, "step-000300", 0, 2, "i-a", files, at.Add(20*time.Minute), at.Add(20*time.Minute))

	inc, err := ListIncomplete(t.Context(), store, "job")
	if err != nil || len(inc) != 3 {
		t.Fatalf("ListIncomplete = %+v, %v; want three saves", inc, err)
	}
	want := map[string]string{
		"step-000100": "node rank 1 is claimed by two instances, i-c and i-b: is store.node_rank set twice?",
		"step-000200": "parts disagree on world_nodes (2, 3): is store.world_nodes the same on every node, or was the job resized mid-save?",
		"step-000300": "",
	}
	for _, is := range inc {
		if is.Problem != want[is.Checkpoint] {
			t.Errorf("%s: problem %q; want %q", is.Checkpoint, is.Problem, want[is.Checkpoint])
		}
	}
	var table bytes.Buffer
	FormatIncomplete(&table, inc)
	if !strings.Contains(table.String(), "never committed as it is: node rank 1 is claimed by two instances") {
		t.Errorf("list's table does not say why step-000100 never commits:\n%s", table.String())
	}
	var found []string
	for _, v := range CheckJob(t.Context(), store, "job", true) {
		found = append(found, v.Error())
	}
	if len(found) != 2 || !strings.Contains(found[0]+found[1], "step-000100") || !strings.Contains(found[0]+found[1], "step-000200") {
		t.Errorf("CheckJob = %q; want a violation for step-000100 and step-000200, none for step-000300", found)
	}
}

// A node left at store.world_nodes 1 in a multi-node job commits its own files alone, beside the
// other nodes' parts of the same save, and moves LATEST there (torn); the other nodes said so, but
// it was silent and healthy. Its agent now says so (CheckpointSplit: an error, /healthz 503).
func TestSingleNodeCommitBesideMultiNodePartsIsSaid(t *testing.T) {
	store := newMemStore()
	now := time.Now()
	putPart(t, store, "step-000100", 0, 3, "i-a", map[string][]byte{"shard-0.bin": []byte("0")}, now, now)
	putPart(t, store, "step-000100", 1, 3, "i-b", map[string][]byte{"shard-1.bin": []byte("1")}, now, now)
	dir := t.TempDir()
	r := startUploaderWith(t, dir, store, UploaderConfig{})
	writeCheckpoint(t, dir, "step-000100", map[string][]byte{"shard-2.bin": []byte("2")})
	ev := r.waitEvent(CheckpointSplit, "step-000100")
	e, ok := errors.AsType[*SplitSaveError](ev.Err)
	if !ok || !e.Parts || len(e.Others) != 2 || !strings.Contains(e.Error(), "beside a multi-node save of it by other instances (part of node 0 of 3") {
		t.Errorf("CheckpointSplit error %v; want this node's commit beside the two parts", ev.Err)
	}
	if !strings.Contains(r.logs.String(), "this checkpoint is this node's files alone") {
		t.Errorf("no error in the log:\n%s", r.logs)
	}
}

// A restore that finds only parts of a save (of the name asked for, or of any) says so, with the
// nodes in and where to look, rather than "no valid manifest: not found".
func TestRestoreOfASaveWaitingForPartsSaysSo(t *testing.T) {
	store := newMemStore()
	at := time.Now().Add(-time.Hour)
	putPart(t, store, "step-000100", 0, 2, "i-a", map[string][]byte{"a.bin": []byte("a")}, at, at)
	want := "multi-node save of step-000100, completed at " + at.UTC().Format(time.RFC3339) + ", is not committed: parts 1/2 in (nodes 0)"
	_, err := Restore(t.Context(), store, RestoreOptions{Job: "job", To: t.TempDir(), Checkpoint: "step-000100", Logger: zerolog.Nop()})
	if !errors.Is(err, ErrNotFound) || !strings.Contains(fmt.Sprint(err), `checkpoint "step-000100" has no commit; the `+want) {
		t.Errorf("restore --checkpoint step-000100: %v; want ErrNotFound and %q", err, want)
	}
	// Another job with a LATEST is not named: the job's saves are there, its name is right.
	if _, err := store.PutBytes(t.Context(), LatestKey("other-run"), []byte(`{"checkpoint":"x"}`), Cond{}); err != nil {
		t.Fatal(err)
	}
	_, err = Restore(t.Context(), store, RestoreOptions{Job: "job", To: t.TempDir(), Logger: zerolog.Nop()})
	if !errors.Is(err, ErrNothingToRestore) || !errors.Is(err, ErrOnlyUncommittedSaves) || !strings.Contains(fmt.Sprint(err), "; the newest "+want) ||
		strings.Contains(fmt.Sprint(err), "other-run") {
		t.Errorf("restore: %v; want ErrNothingToRestore, ErrOnlyUncommittedSaves and %q, no other job named", err, want)
	}
}

// A restore that brings back an older commit while a newer multi-node save is not committed
// (waiting for parts, or given up) says so: a replacement resuming from an older step than the
// trainers saved for the reclaim must not do it silently (found from outside: exit 0, not a word).
func TestRestoreOfAnOlderCommitSaysANewerSaveIsNotCommitted(t *testing.T) {
	store := newMemStore()
	old := time.Now().Add(-2 * time.Hour)
	putCommit(t, store, "step-000050", "i-a", map[string][]byte{"a.bin": []byte("old"), "_COMPLETE": nil}, old, old, nil)
	at := time.Now().Add(-time.Hour)
	putPart(t, store, "step-000100", 0, 2, "i-a", map[string][]byte{"a.bin": []byte("a")}, at, at)
	var log bytes.Buffer
	res, err := Restore(t.Context(), store, RestoreOptions{Job: "job", To: t.TempDir(), Logger: zerolog.New(&log), PartWait: 2 * time.Minute})
	if err != nil || res.Checkpoint != "step-000050" {
		t.Fatalf("Restore() = %+v, %v; want step-000050 restored", res, err)
	}
	if l := log.String(); !strings.Contains(l, "a newer multi-node save is not committed, so an older checkpoint is restored") ||
		!strings.Contains(l, "step-000100") || !strings.Contains(l, "parts 1/2 in (nodes 0)") || !strings.Contains(l, `"level":"warn"`) {
		t.Errorf("log = %s; want a warning naming the newer save of step-000100 and why it is not committed", l)
	}
	// An older save waiting for parts is nothing to say.
	log.Reset()
	store2 := newMemStore()
	putPart(t, store2, "step-000010", 0, 2, "i-a", map[string][]byte{"a.bin": []byte("a")}, old.Add(-time.Hour), old.Add(-time.Hour))
	putCommit(t, store2, "step-000050", "i-a", map[string][]byte{"a.bin": []byte("old"), "_COMPLETE": nil}, old, old, nil)
	if _, err := Restore(t.Context(), store2, RestoreOptions{Job: "job", To: t.TempDir(), Logger: zerolog.New(&log)}); err != nil {
		t.Fatal(err)
	}
	if strings.Contains(log.String(), "newer multi-node save") {
		t.Errorf("log = %s; want no word of an older save", log.String())
	}
}

// A node whose part is not in: no job manifest, no LATEST, `list` shows parts 3/4; when the
// last node's part comes, the job checkpoint commits.
func TestMultiNodeWaitsForEveryPart(t *testing.T) {
	store := newMemStore()
	config := []byte("c")
	var rigs []*uploaderRig
	for _, rank := range []int{0, 1, 3} {
		r := startNode(t, store, rank, 4, fmt.Sprintf("i-node%d", rank))
		files := nodeFiles(t, rank, config)
		delete(files, "_COMPLETE")
		writeCheckpoint(t, r.dir, "step-000200", files)
		r.waitPart("step-000200")
		rigs = append(rigs, r)
	}
	inc, err := ListIncomplete(t.Context(), store, "job")
	if err != nil || len(inc) != 1 || !slices.Equal(inc[0].Ranks, []int{0, 1, 3}) || inc[0].WorldNodes != 4 || inc[0].Checkpoint != "step-000200" {
		t.Fatalf("ListIncomplete = %+v, %v; want step-000200 with nodes 0, 1, 3 of 4", inc, err)
	}
	if cs, _, _ := ListCommitted(t.Context(), store, "job"); len(cs) != 0 {
		t.Errorf("committed with a part missing: %+v", cs)
	}
	if _, _, err := store.GetBytes(t.Context(), LatestKey("job")); !errors.Is(err, ErrNotFound) {
		t.Errorf("LATEST with a part missing: %v", err)
	}

	late := startNode(t, store, 2, 4, "i-node2")
	files := nodeFiles(t, 2, config)
	delete(files, "_COMPLETE")
	writeCheckpoint(t, late.dir, "step-000200", files)
	late.waitPart("step-000200")
	late.waitEvent(JobCheckpointCommitted, "step-000200")
	for _, r := range rigs {
		r.waitEvent(JobCheckpointCommitted, "step-000200")
	}
	if v := CheckJob(t.Context(), store, "job", true); len(v) > 0 {
		t.Errorf("invariants: %v", v)
	}
}

// An agent that dies between its part and the job manifest: a surviving agent, still looking
// for the missing part, completes the save.
func TestMultiNodeSurvivorCompletes(t *testing.T) {
	store := newMemStore()
	config := []byte("c")
	var rigs []*uploaderRig
	for rank := range 3 {
		r := startNode(t, store, rank, 4, fmt.Sprintf("i-node%d", rank))
		files := nodeFiles(t, rank, config)
		delete(files, "_COMPLETE")
		writeCheckpoint(t, r.dir, "step-000300", files)
		r.waitPart("step-000300")
		rigs = append(rigs, r)
	}
	// Node 3's agent writes its part and is killed before it looks for the others.
	now := time.Now()
	putPart(t, store, "step-000300", 3, 4, "i-node3", nodeFiles(t, 3, config), now, now)
	var writers int
	for _, r := range rigs {
		if ev := r.waitEvent(JobCheckpointCommitted, "step-000300"); !ev.Already {
			writers++
		}
	}
	if writers != 1 {
		t.Errorf("%d surviving agents wrote the job manifest; want one", writers)
	}
	if v := CheckJob(t.Context(), store, "job", true); len(v) > 0 {
		t.Errorf("invariants: %v", v)
	}
}

// An agent restarted after its part, with every part in and no job manifest (all agents died
// before they looked): it finds its own part at start and completes the save.
func TestMultiNodeRestartCompletesOwnSave(t *testing.T) {
	store := newMemStore()
	now := time.Now()
	for rank := range 2 {
		putPart(t, store, "step-000400", rank, 2, fmt.Sprintf("i-node%d", rank), nodeFiles(t, rank, []byte("c")), now, now)
	}
	r := startNode(t, store, 1, 2, "i-node1")
	ev := r.waitEvent(JobCheckpointCommitted, "step-000400")
	if ev.Already || len(ev.Manifest.Parts) != 2 {
		t.Errorf("restarted agent: job event %+v; want it to write the job manifest of both parts", ev)
	}
	l, _, err := store.GetBytes(t.Context(), LatestKey("job"))
	if err != nil || !strings.Contains(string(l), ev.Manifest.Commit) {
		t.Errorf("LATEST = %s, %v; want the job commit %s", l, err, ev.Manifest.Commit)
	}
}

// An agent restarted after its part, before the job's checkpoint: it reports the part's save
// complete (a notice read again after the restart takes it for the save it asked for, not
// durable until the job's checkpoint is), then the job's checkpoint once the other part comes.
// (Found by TestNoticeSimulation with a multi-node job, seed 5791944304030103394: the notice
// said checkpoint_missing at its deadline while its save waited for the other node's part.)
func TestMultiNodeRestartReportsItsPendingSaveComplete(t *testing.T) {
	store := newMemStore()
	complete := time.Now().Add(-time.Minute).Truncate(time.Millisecond)
	putPart(t, store, "step-000500", 0, 2, "i-node0", nodeFiles(t, 0, []byte("c")), complete, time.Now())
	r := startNode(t, store, 0, 2, "i-node0")
	ev := r.waitEvent(CheckpointComplete, "step-000500")
	if !ev.CompletedAt.Equal(complete) {
		t.Errorf("reported complete at %v; want its part's completion, %v", ev.CompletedAt, complete)
	}
	putPart(t, store, "step-000500", 1, 2, "i-node1", nodeFiles(t, 1, []byte("c")), complete, time.Now())
	if ev := r.waitEvent(JobCheckpointCommitted, "step-000500"); len(ev.Manifest.Parts) != 2 {
		t.Errorf("job event %+v; want the job manifest of both parts", ev)
	}
}

// Saves that can never be committed as they are fail loudly and commit nothing: one path with
// different bytes on two nodes, one rank claimed by two instances, parts disagreeing on
// world_nodes.
func TestMultiNodeConflicts(t *testing.T) {
	type node struct {
		rank, world int
		host        string
		files       map[string][]byte
	}
	tests := []struct {
		name  string
		nodes []node // their parts land in this order; the last one's agent finds the conflict
		want  string
	}{
		{"same path, other bytes", []node{
			{0, 2, "i-a", map[string][]byte{"config.json": []byte("lr=0.1")}},
			{1, 2, "i-b", map[string][]byte{"config.json": []byte("lr=0.2")}},
		}, "config.json is in two parts with different bytes"},
		{"rank claimed twice", []node{
			{0, 2, "i-a", map[string][]byte{"a.bin": []byte("a")}},
			{0, 2, "i-b", map[string][]byte{"b.bin": []byte("b")}},
			{1, 2, "i-c", map[string][]byte{"c.bin": []byte("c")}},
		}, "node rank 0 is claimed by two instances"},
		{"world_nodes changed", []node{
			{0, 2, "i-a", map[string][]byte{"a.bin": []byte("a")}},
			{1, 3, "i-b", map[string][]byte{"b.bin": []byte("b")}},
		}, "parts disagree on world_nodes"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			store := newMemStore()
			var last *uploaderRig
			for _, n := range tt.nodes {
				last = startNode(t, store, n.rank, n.world, n.host)
				writeCheckpoint(t, last.dir, "step-1", n.files)
				last.waitPart("step-1")
			}
			ev := last.waitEvent(JobCheckpointFailed, "step-1")
			if ev.Err == nil || !strings.Contains(ev.Err.Error(), tt.want) {
				t.Errorf("job checkpoint failure = %v; want it to say %q", ev.Err, tt.want)
			}
			if !strings.Contains(last.logs.String(), tt.want) {
				t.Errorf("the error is not logged:\n%s", last.logs)
			}
			if cs, _, _ := ListCommitted(t.Context(), store, "job"); len(cs) != 0 {
				t.Errorf("committed despite the conflict: %+v", cs[0].Manifest)
			}
			if _, _, err := store.GetBytes(t.Context(), LatestKey("job")); !errors.Is(err, ErrNotFound) {
				t.Errorf("LATEST written despite the conflict: %v", err)
			}
		})
	}
}

// Agents racing for the job manifest (on versitygw: a real server's If-None-Match): exactly one write wins each time; an agent that found the
// same parts accepts the winner's, one that found other parts reports an error naming both.
func TestJobManifestRace(t *testing.T) {
	for _, sc := range []struct {
		name string
		// stores returns a function that gives a fresh, empty store for each round.
		stores func(t *testing.T) func() Store
	}{
		{"file", func(t *testing.T) func() Store { return func() Store { return mustNewFileStore(t) } }},
		{"mem", func(t *testing.T) func() Store { return func() Store { return newMemStore() } }},
		{"s3", func(t *testing.T) func() Store {
			peer, n := s3StartPeer(t), 0
			return func() Store {
				n++
				return peer.openS3(t, peer.endpoint, fmt.Sprintf("race-%d", n), S3Options{})
			}
		}},
	} {
		t.Run(sc.name, func(t *testing.T) {
			fresh := sc.stores(t)
			for round := range 20 {
				store := fresh()
				name := fmt.Sprintf("step-%d", round)
				now := time.Now()
				var parts []*Manifest
				for rank := range 4 {
					parts = append(parts, putPart(t, store, name, rank, 4, fmt.Sprintf("i-node%d", rank), nodeFiles(t, rank, []byte("c")), now, now))
				}
				// Node 1 saved again on the same instance: a newer part of the same save.
				newer := putPart(t, store, name, 1, 4, "i-node1", nodeFiles(t, 1, []byte("c")), now.Add(time.Second), now.Add(time.Second))

				results := make([]saveResult, 8)
				var wg sync.WaitGroup
				for i := range results {
					wg.Go(func() {
						results[i] = completeSave(t.Context(), store, parts[i%4], "_COMPLETE", Host{InstanceID: "i-x"}, time.Hour, nil)
					})
				}
				wg.Wait()
				written := 0
				for i, r := range results {
					switch {
					case i%4 == 1 && r.superseded:
						// Node 1's older part: superseded by its newer one.
					case r.err != nil:
						t.Fatalf("round %d: agent %d: %v", round, i, r.err)
					case r.job == nil || r.job.Parts[1].Commit != newer.Commit:
						t.Fatalf("round %d: agent %d: job %+v; want the save with node 1's newer part", round, i, r.job)
					case r.written:
						written++
					}
				}
				if written != 1 {
					t.Fatalf("round %d: %d agents wrote the job manifest; want exactly 1", round, written)
				}

				// Another agent that assembled other parts for the same key is refused.
				other := buildJobManifest([]*Manifest{parts[0], parts[1], parts[2], parts[3]}, Host{}, now)
				if w, err := writeJobManifest(t.Context(), store, other); w || !errors.Is(err, ErrExists) || !strings.Contains(err.Error(), "other parts") {
					t.Fatalf("round %d: writing a job manifest of other parts over the winner's = %v, %v; want an ErrExists naming both", round, w, err)
				}
			}
		})
	}
}

func TestAssembleSave(t *testing.T) {
	now := time.Now()
	part := func(rank, world int, host string, complete time.Time, marker string) *Manifest {
		m := &Manifest{Version: ManifestVersion, Job: "job", Checkpoint: "c", Commit: NewCommitID(complete), Host: Host{InstanceID: host},
			CommittedAt: complete, Part: &Part{NodeRank: rank, WorldNodes: world}}
		m.Timings.CompleteAt = &complete
		m.Files = []File{{Path: fmt.Sprintf("shard-%d", rank), Size: 1, Checksum: Checksum{Algorithm: ChecksumCRC32C, Value: "x"}},
			{Path: "_COMPLETE", Size: int64(len(marker)), Checksum: Checksum{Algorithm: ChecksumCRC32C, Value: marker}}}
		return m
	}
	mine := part(0, 2, "a", now, "s1")
	tests := []struct {
		name        string
		open        []*Manifest
		wantRanks   []string // hosts by rank; nil when none
		wantMissing []int
		wantErr     string
		superseded  bool
	}{
		{"complete", []*Manifest{part(1, 2, "b", now.Add(time.Second), "s1")}, []string{"a", "b"}, nil, "", false},
		{"other part too old: another save", []*Manifest{part(1, 2, "b", now.Add(-SaveSpread-time.Second), "s1")}, nil, []int{1}, "", false},
		{"other marker: another save", []*Manifest{part(1, 2, "b", now, "s0")}, nil, []int{1}, "", false},
		{"newest of one instance", []*Manifest{part(1, 2, "b", now, "s1"), part(1, 2, "b", now.Add(time.Second), "s1")}, []string{"a", "b"}, nil, "", false},
		{"two instances for one rank", []*Manifest{part(1, 2, "b", now, "s1"), part(1, 2, "c", now, "s1")}, nil, nil, "node rank 1 is claimed by two instances", false},
		{"this node saved again", []*Manifest{part(0, 2, "a", now.Add(time.Second), "s1")}, nil, nil, "", true},
		{"another instance with this rank", []*Manifest{part(0, 2, "z", now, "s1")}, nil, nil, "node rank 0 is claimed by two instances", false},
		{"world_nodes", []*Manifest{part(1, 3, "b", now, "s1")}, nil, nil, "parts disagree on world_nodes", false},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			got, missing, err := assembleSave(mine, append([]*Manifest{mine}, tt.open...), "_COMPLETE")
			if tt.superseded != errors.Is(err, errSuperseded) {
				t.Fatalf("superseded = %v (%v); want %v", errors.Is(err, errSuperseded), err, tt.superseded)
			}
			if tt.wantErr != "" && (err == nil || !strings.Contains(err.Error(), tt.wantErr)) {
				t.Errorf("err = %v; want %q", err, tt.wantErr)
			}
			if tt.wantErr == "" && !tt.superseded && err != nil {
				t.Errorf("err = %v", err)
			}
			if !slices.Equal(missing, tt.wantMissing) {
				t.Errorf("missing = %v; want %v", missing, tt.wantMissing)
			}
			var hosts []string
			for _, p := range got {
				hosts = append(hosts, p.Host.InstanceID)
			}
			if !slices.Equal(hosts, tt.wantRanks) {
				t.Errorf("parts by rank from %v; want %v", hosts, tt.wantRanks)
			}
		})
	}
}

// Retention of a multi-node job: an old job checkpoint goes whole (parts, job manifest, every
// part's data), but only once its parts are older than part_wait and a margin (an agent may still
// be assembling the same save until then); parts that never made a save go once 2 × part_wait
// old, younger ones stay.
func TestMultiNodeRetention(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		store := newMemStore()
		partWait := time.Hour
		commitSave := func(name string) *Manifest {
			now := time.Now()
			var mine *Manifest
			for rank := range 2 {
				mine = putPart(t, store, name, rank, 2, fmt.Sprintf("i-node%d", rank), nodeFiles(t, rank, []byte("c")), now, now)
			}
			r := completeSave(t.Context(), store, mine, "_COMPLETE", Host{}, partWait, nil)
			if r.err != nil || !r.written {
				t.Fatalf("completeSave(%s) = %+v", name, r)
			}
			return r.job
		}
		stale := putPart(t, store, "step-050", 0, 2, "i-node0", nodeFiles(t, 0, []byte("c")), time.Now(), time.Now())
		old := commitSave("step-100")
		<-time.After(time.Minute)
		commitSave("step-200")

		// Young: nothing goes yet, though step-100 is beyond keep.
		ret, err := applyRetention(t.Context(), store, "job", 1, partWait, nil, nil, zerolog.Nop())
		deleted := ret.Deleted
		if err != nil || len(deleted) != 0 {
			t.Fatalf("retention with young parts deleted %v (%v); want nothing", deleted, err)
		}

		<-time.After(partWait + partMargin + time.Minute)
		young := putPart(t, store, "step-300", 0, 2, "i-node0", nodeFiles(t, 0, []byte("c")), time.Now(), time.Now())
		ret, err = applyRetention(t.Context(), store, "job", 1, partWait, nil, nil, zerolog.Nop())
		deleted = ret.Deleted
		if err != nil {
			t.Fatal(err)
		}
		if !slices.Contains(deleted, CommitRef{Checkpoint: "step-100", Commit: old.Commit}) || len(deleted) != 1 {
			t.Errorf("deleted %v; want step-100's job checkpoint (the stale part is not 2 × part_wait old yet)", deleted)
		}
		for _, p := range old.Parts {
			if objs, _ := store.List(t.Context(), CommitPrefix("job", "step-100", p.Commit)); len(objs) > 0 {
				t.Errorf("step-100 part %d left %d objects", p.NodeRank, len(objs))
			}
		}

		<-time.After(partWait)
		ret, err = applyRetention(t.Context(), store, "job", 1, partWait, nil, nil, zerolog.Nop())
		deleted = ret.Deleted
		if err != nil || !slices.Equal(deleted, []CommitRef{{Checkpoint: "step-050", Commit: stale.Commit}}) {
			t.Errorf("deleted %v (%v); want the stale part of step-050 alone", deleted, err)
		}
		if objs, _ := store.List(t.Context(), CommitPrefix("job", "step-050", stale.Commit)); len(objs) > 0 {
			t.Errorf("the stale part left %d objects", len(objs))
		}
		if _, _, err := store.GetBytes(t.Context(), PartKey("job", "step-300", young.Commit)); err != nil {
			t.Errorf("a part younger than 2 × part_wait was deleted: %v", err)
		}
		cs, _, _ := ListCommitted(t.Context(), store, "job")
		if len(cs) != 1 || cs[0].Manifest.Checkpoint != "step-200" || !cs[0].Latest {
			t.Errorf("after retention: %d commits; want step-200, LATEST", len(cs))
		}
		if v := CheckJob(t.Context(), store, "job", true); len(v) > 0 {
			t.Errorf("invariants: %v", v)
		}
	})
}

// A save whose parts are all in but which is older than LATEST's target is not committed: a
// newer job checkpoint is, and writing it could bring back a save retention deleted.
func TestCompleteSaveOlderThanLatest(t *testing.T) {
	store := newMemStore()
	now := time.Now()
	var older, newer []*Manifest
	for rank := range 2 {
		older = append(older, putPart(t, store, "step-100", rank, 2, fmt.Sprintf("i-node%d", rank), nodeFiles(t, rank, nil), now.Add(-2*SaveSpread), now))
		newer = append(newer, putPart(t, store, "step-200", rank, 2, fmt.Sprintf("i-node%d", rank), nodeFiles(t, rank, nil), now, now))
	}
	if r := completeSave(t.Context(), store, newer[1], "_COMPLETE", Host{}, time.Hour, nil); !r.written || !r.latestMoved {
		t.Fatalf("completeSave(step-200) = %+v", r)
	}
	r := completeSave(t.Context(), store, older[1], "_COMPLETE", Host{}, time.Hour, nil)
	if !r.older || r.written || r.job != nil {
		t.Errorf("completeSave(step-100, older than LATEST) = %+v; want it left uncommitted as older", r)
	}
	if cs, _, _ := ListCommitted(t.Context(), store, "job"); len(cs) != 1 {
		t.Errorf("%d commits; want step-200 alone", len(cs))
	}
}

// A node that restored the job's checkpoint (every node's files, or its part alone) takes it for
// what it is: committed. Nothing is sent, no new part is written.
func TestMultiNodeRestoredCheckpointNotSentAgain(t *testing.T) {
	for _, part := range []bool{false, true} {
		t.Run(fmt.Sprintf("part=%v", part), func(t *testing.T) {
			store := newMemStore()
			now := time.Now().Add(-time.Minute)
			var mine *Manifest
			for rank := range 2 {
				mine = putPart(t, store, "step-000500", rank, 2, fmt.Sprintf("i-node%d", rank), nodeFiles(t, rank, []byte("c")), now, now)
			}
			if r := completeSave(t.Context(), store, mine, "_COMPLETE", Host{}, time.Hour, nil); !r.written {
				t.Fatalf("completeSave = %+v", r)
			}
			dir := t.TempDir()
			opts := RestoreOptions{Job: "job", To: dir, Logger: zerolog.Nop()}
			if part {
				one := 1
				opts.Part = &one
			}
			if _, err := Restore(t.Context(), store, opts); err != nil {
				t.Fatal(err)
			}
			before, _ := listCommits(t.Context(), store, "job", "step-000500")
			r := startUploaderWith(t, dir, store, UploaderConfig{NodeRank: 1, WorldNodes: 2, PartWait: 30 * time.Second,
				Host: func() Host { return Host{InstanceID: "i-replacement"} }})
			if ev := r.waitCommitted("step-000500"); !ev.Already || ev.Manifest.Parts == nil {
				t.Errorf("restored checkpoint: %+v; want it taken for the job checkpoint it is (already committed)", ev)
			}
			after, _ := listCommits(t.Context(), store, "job", "step-000500")
			if !slices.Equal(before, after) {
				t.Errorf("commits of step-000500 went from %v to %v; want nothing new", before, after)
			}
		})
	}
}

// latestHeldStore holds the first write of LATEST until release is closed or the request's
// context ends (as an S3 request does when its context is cancelled); arrived is closed when it
// comes.
type latestHeldStore struct {
	Store
	arrived, release chan struct{}
	once             sync.Once
}

func (s *latestHeldStore) PutBytes(ctx context.Context, key string, data []byte, cond Cond) (string, error) {
	if key == LatestKey("job") {
		held := false
		s.once.Do(func() { held = true; close(s.arrived) })
		if held {
			select {
			case <-s.release:
			case <-ctx.Done():
				return "", ctx.Err()
			}
		}
	}
	return s.Store.PutBytes(ctx, key, data, cond)
}

// A stop that comes while this node's agent commits the job checkpoint (its part was the last,
// the job manifest is written, LATEST is on its way) waits for LATEST. The agent used to stop at
// once, its write of LATEST cancelled: with the other nodes' agents stopped too, LATEST stayed on
// an older checkpoint for good (found by the multi-node simulation, seed 1 at 400 steps).
func TestMultiNodeStopWaitsForTheJobCommitInProgress(t *testing.T) {
	mem := newMemStore()
	now := time.Now()
	putPart(t, mem, "step-000500", 0, 2, "i-node0", nodeFiles(t, 0, []byte("c")), now, now)
	store := &latestHeldStore{Store: mem, arrived: make(chan struct{}), release: make(chan struct{})}
	r := startNode(t, store, 1, 2, "i-node1")
	writeCheckpoint(t, r.dir, "step-000500", withoutMarker(nodeFiles(t, 1, []byte("c"))))
	select {
	case <-store.arrived:
	case <-time.After(10 * time.Second):
		t.Fatal("LATEST was not written within 10 s of the checkpoint")
	}
	r.cancel() // the stop, while LATEST is being written
	eventuallyUploader(t, "the stop to be taken (drained or done)", func() bool {
		select {
		case <-r.done:
			return true
		default:
			return strings.Contains(r.logs.String(), "finishing them first")
		}
	})
	close(store.release)
	r.waitDone("the stop did not end once LATEST was written")
	jobs, _, err := ListCommitted(t.Context(), mem, "job")
	if err != nil || len(jobs) != 1 || len(jobs[0].Manifest.Parts) != 2 {
		t.Fatalf("ListCommitted = %+v, %v; want the job checkpoint of both parts", jobs, err)
	}
	l, _, err := mem.GetBytes(t.Context(), LatestKey("job"))
	if err != nil || !strings.Contains(string(l), jobs[0].Manifest.Commit) {
		t.Errorf("LATEST = %s, %v; want the job commit %s", l, err, jobs[0].Manifest.Commit)
	}
	if v := CheckJob(t.Context(), mem, "job", true); len(v) > 0 {
		t.Errorf("invariants: %v", v)
	}
}

// `list --check` on a job checkpoint that retention has begun to delete (its part manifests
// first, then a stop): the shared files' copies under a part whose part manifest is gone are the
// part's own, as the job manifest's ranks say; an object no file accounts for is still flagged.
func TestCheckJobWithAPartManifestDeleted(t *testing.T) {
	store := newMemStore()
	now := time.Now()
	var parts []*Manifest
	for rank := range 2 {
		parts = append(parts, putPart(t, store, "step-000600", rank, 2, fmt.Sprintf("i-node%d", rank), nodeFiles(t, rank, []byte("c")), now, now))
	}
	m := buildJobManifest(parts, Host{InstanceID: "i-node0"}, now)
	if _, err := writeJobManifest(t.Context(), store, m); err != nil {
		t.Fatal(err)
	}
	if _, err := advanceLatest(t.Context(), store, m, Host{InstanceID: "i-node0"}, nil); err != nil {
		t.Fatal(err)
	}
	if v := CheckJob(t.Context(), store, "job", true); len(v) > 0 {
		t.Fatalf("invariants of the whole job checkpoint: %v", v)
	}
	if err := store.Delete(t.Context(), PartKey("job", "step-000600", parts[1].Commit)); err != nil {
		t.Fatal(err)
	}
	if v := CheckJob(t.Context(), store, "job", true); len(v) > 0 {
		t.Errorf("invariants with node 1's part manifest deleted: %v; want none", v)
	}
	stray := DataKey("job", "step-000600", parts[1].Commit, "stray.bin")
	if _, err := store.PutBytes(t.Context(), stray, []byte("x"), Cond{}); err != nil {
		t.Fatal(err)
	}
	v := CheckJob(t.Context(), store, "job", true)
	if len(v) != 1 || !strings.Contains(v[0].Error(), "I7: ") || !strings.Contains(v[0].Error(), stray) {
		t.Errorf("invariants with a stray object under node 1's part = %v; want one I7 naming %s", v, stray)
	}
}

// partLossStore fails every part manifest write while down (the write not done), and does the
// next one after that but answers it with an error (the answer lost). It records the part
// manifests deleted.
type partLossStore struct {
	Store
	down, lose atomic.Bool
	mu         sync.Mutex
	deleted    []string
}

func (s *partLossStore) PutBytes(ctx context.Context, key string, data []byte, cond Cond) (string, error) {
	if !strings.HasSuffix(key, "/"+MetaDir+"/part.json") {
		return s.Store.PutBytes(ctx, key, data, cond)
	}
	if s.down.Load() {
		return "", errors.New("connect: connection refused")
	}
	etag, err := s.Store.PutBytes(ctx, key, data, cond)
	if err == nil && s.lose.CompareAndSwap(true, false) {
		return "", errors.New("connection reset after the request was sent")
	}
	return etag, err
}

func (s *partLossStore) Delete(ctx context.Context, keys ...string) error {
	s.mu.Lock()
	for _, k := range keys {
		if strings.HasSuffix(k, "/"+MetaDir+"/part.json") {
			s.deleted = append(s.deleted, k)
		}
	}
	s.mu.Unlock()
	return s.Store.Delete(ctx, keys...)
}

// A node's part manifest is never taken for a stray of its own commit. A restarted agent resumes
// its commit and, before the part manifest, clears that commit's prefix of what is not its own;
// a write of the part manifest whose answer was lost had put it there, and it was deleted as a
// stray, written again, and deleted once more by the late clean-up, so that the save could no
// longer be assembled from it. (Found by TestSimulationNodes, 400 steps, seed
// 172556476682931846: the part manifest was written again after the job manifest that listed it.)
func TestMultiNodePartManifestIsNotAStray(t *testing.T) {
	t.Cleanup(func(l []time.Duration) func() { return func() { lateAborts = l } }(lateAborts)) // after the uploaders stop
	lateAborts = []time.Duration{0, 50 * time.Millisecond}
	store := &partLossStore{Store: newMemStore()}
	store.down.Store(true)
	dir, state := t.TempDir(), t.TempDir()
	cfg := UploaderConfig{NodeRank: 0, WorldNodes: 2, PartWait: 30 * time.Second, StateDir: state, StopBudget: -1,
		Host: func() Host { return Host{InstanceID: "i-node0"} }}
	first := startUploaderWith(t, dir, store, cfg)
	writeCheckpoint(t, dir, "step-000600", withoutMarker(nodeFiles(t, 0, []byte("c"))))
	first.waitEvent(CheckpointFailed, "step-000600")
	first.stop()

	store.lose.Store(true)
	store.down.Store(false)
	second := startUploaderWith(t, dir, store, cfg)
	m := second.waitPart("step-000600")
	key := PartKey("job", "step-000600", m.Commit)
	eventuallyUploader(t, "the late clean-up of the part's commit to be over", func() bool {
		entries, _ := os.ReadFile(JournalPath(state, "job", dir, store.URL()))
		return strings.Contains(string(entries), `"op":"late_done","ckpt":"step-000600","commit":"`+m.Commit+`"`)
	})
	store.mu.Lock()
	deleted := slices.Clone(store.deleted)
	store.mu.Unlock()
	if len(deleted) > 0 {
		t.Errorf("part manifests deleted: %v; want none (the part's own, %s, is not a stray)", deleted, key)
	}
	if _, _, err := store.GetBytes(t.Context(), key); err != nil {
		t.Errorf("the part manifest: %v; want it in the store", err)
	}
}

// latestFailingStore answers every write of the job's LATEST with an error while failing is set,
// and counts those writes.
type latestFailingStore struct {
	Store
	failing atomic.Bool
	tries   atomic.Int32
}

func (s *latestFailingStore) PutBytes(ctx context.Context, key string, data []byte, cond Cond) (string, error) {
	if key == LatestKey("job") && s.failing.Load() {
		s.tries.Add(1)
		return "", errors.New("503 SlowDown")
	}
	return s.Store.PutBytes(ctx, key, data, cond)
}

// A job checkpoint committed while LATEST cannot be written for longer than part_wait is still a
// committed checkpoint: its agent keeps moving LATEST to it until it can. It used to give the
// save up once part_wait had passed, saying its parts "did not make one save", a failure on
// /healthz for a committed checkpoint, and stopped trying. (Found from outside.)
func TestMultiNodeLatestFailingLongerThanPartWait(t *testing.T) {
	mem := newMemStore()
	now := time.Now()
	putPart(t, mem, "step-000700", 0, 2, "i-node0", nodeFiles(t, 0, []byte("c")), now, now)
	store := &latestFailingStore{Store: mem}
	store.failing.Store(true)
	// Long enough that a first look, however late under load, comes within it.
	const partWait = 6 * time.Second
	r := startUploaderWith(t, t.TempDir(), store, UploaderConfig{NodeRank: 1, WorldNodes: 2, PartWait: partWait,
		Host: func() Host { return Host{InstanceID: "i-node1"} }})
	writeCheckpoint(t, r.dir, "step-000700", withoutMarker(nodeFiles(t, 1, []byte("c"))))
	part := r.waitPart("step-000700")
	// Past part_wait with LATEST still failing (the clock read, not waited on for an event).
	for deadline := time.Now().Add(30 * time.Second); time.Since(part.CommittedAt) <= partWait+time.Second || store.tries.Load() < 2; {
		if time.Now().After(deadline) {
			t.Fatalf("LATEST written %d times, failing, in 30 s; want 2 or more past part_wait\n%s", store.tries.Load(), r.logs)
		}
		<-time.After(5 * time.Millisecond)
	}
	store.failing.Store(false)
	for {
		ev := r.waitEvent(0, "")
		if ev.Kind == JobCheckpointFailed {
			t.Fatalf("the committed job checkpoint was given up: %v\n%s", ev.Err, r.logs)
		}
		if ev.Kind == JobCheckpointCommitted {
			break
		}
	}
	eventuallyUploader(t, "LATEST on the job checkpoint", func() bool {
		jobs, _, err := ListCommitted(t.Context(), mem, "job")
		l, _, lerr := mem.GetBytes(t.Context(), LatestKey("job"))
		return err == nil && lerr == nil && len(jobs) == 1 && strings.Contains(string(l), jobs[0].Manifest.Commit)
	})
	if v := CheckJob(t.Context(), mem, "job", true); len(v) > 0 {
		t.Errorf("invariants: %v", v)
	}
}

// listFailingStore fails every listing of one prefix; with slow set, every one after the first
// answers only once slow has passed (a store retrying and failing for a while).
type listFailingStore struct {
	Store
	prefix string
	slow   time.Time
	calls  atomic.Int32
}

func (s *listFailingStore) ListDir(ctx context.Context, prefix string) ([]string, []ObjectInfo, error) {
	if prefix != s.prefix {
		return s.Store.ListDir(ctx, prefix)
	}
	if s.calls.Add(1) > 1 {
		for time.Now().Before(s.slow) && ctx.Err() == nil { // the clock read, a slow answer
			<-time.After(time.Millisecond)
		}
	}
	return nil, nil, errors.New("503 SlowDown")
}

// A save whose parts the agent could not look for (the store failing) until part_wait passed is
// given up loudly, naming the store's error, whether the last look failed after part_wait (a
// slow failure) or before: an error, JobCheckpointFailed (a failure on /healthz). The first used
// to be dropped without a word, the second said its parts "did not make one save". (Found from
// outside.)
func TestMultiNodeStoreFailingPastPartWaitIsAFailure(t *testing.T) {
	for _, slow := range []bool{false, true} {
		t.Run(fmt.Sprintf("slow=%v", slow), func(t *testing.T) {
			mem := newMemStore()
			now := time.Now()
			putPart(t, mem, "step-000800", 0, 2, "i-node0", nodeFiles(t, 0, []byte("c")), now, now)
			// Long enough that a first look, however late under load, comes within it.
			const partWait = 6 * time.Second
			store := &listFailingStore{Store: mem, prefix: "job/step-000800/"}
			if slow {
				store.slow = time.Now().Add(partWait + 500*time.Millisecond)
			}
			r := startUploaderWith(t, t.TempDir(), store, UploaderConfig{NodeRank: 1, WorldNodes: 2, PartWait: partWait,
				Host: func() Host { return Host{InstanceID: "i-node1"} }})
			writeCheckpoint(t, r.dir, "step-000800", withoutMarker(nodeFiles(t, 1, []byte("c"))))
			r.waitPart("step-000800")
			ev := r.waitEvent(JobCheckpointFailed, "step-000800")
			if ev.Err == nil || !strings.Contains(ev.Err.Error(), "did not let this agent look for the other nodes' parts within part_wait (6s)") ||
				!strings.Contains(ev.Err.Error(), "503 SlowDown") {
				t.Errorf("given up with %v; want it to say the store did not answer within part_wait, and what it said", ev.Err)
			}
			if !strings.Contains(r.logs.String(), "job checkpoint given up") {
				t.Errorf("not said in the log:\n%s", r.logs)
			}
		})
	}
}

// A part of the save committed more than part_wait before the last node's (parts 50 s apart, the
// last one's upload slow) is in the store, but never assembled: the agent says so, and what to
// change, instead of waiting for a "missing" rank whose part is there. (Found from outside.)
func TestMultiNodePartOlderThanPartWaitIsSaid(t *testing.T) {
	store := newMemStore()
	now := time.Now()
	const partWait = 6 * time.Second // a first look, however late under load, within it
	putPart(t, store, "step-000900", 0, 2, "i-node0", nodeFiles(t, 0, []byte("c")), now.Add(-7*time.Second), now.Add(-7*time.Second))
	r := startUploaderWith(t, t.TempDir(), store, UploaderConfig{NodeRank: 1, WorldNodes: 2, PartWait: partWait,
		Host: func() Host { return Host{InstanceID: "i-node1"} }})
	writeCheckpoint(t, r.dir, "step-000900", withoutMarker(nodeFiles(t, 1, []byte("c"))))
	r.waitPart("step-000900")
	ev := r.waitEvent(JobCheckpointFailed, "step-000900")
	const want = "the part(s) of node(s) [0] of this save are in the store, but were committed more than part_wait (6s) before this look"
	if ev.Err == nil || !strings.Contains(ev.Err.Error(), want) || !strings.Contains(ev.Err.Error(), "set store.part_wait above") {
		t.Errorf("given up with %v; want it to say %q, and what to set", ev.Err, want)
	}
}

// Two ways a node's files went to no node (found from outside): restore --part at another
// count of nodes than the save's, and a job manifest that lost one node's files (hand edited, or
// by a faulty writer) but still says that every part is in, restored as the whole save with
// every checksum verified (restore --part of that node gave it the marker alone). Each part's
// files and bytes must be those the files list for its rank.
func TestJobCheckpointIsRestoredOnlyWithEveryNodesFiles(t *testing.T) {
	store := mustNewFileStore(t)
	config := []byte(`{"lr": 0.1}`)
	var rigs []*uploaderRig
	for rank := range 2 {
		r := startNode(t, store, rank, 2, fmt.Sprintf("i-node%d", rank))
		writeCheckpoint(t, r.dir, "step-000100", withoutMarker(nodeFiles(t, rank, config)))
		rigs = append(rigs, r)
	}
	for _, r := range rigs {
		r.waitEvent(JobCheckpointCommitted, "step-000100")
	}
	cs, problems, err := ListCommitted(t.Context(), store, "job")
	if err != nil || len(problems) > 0 || len(cs) != 1 {
		t.Fatalf("ListCommitted = %d commits, %v, %v; want the job checkpoint", len(cs), problems, err)
	}
	m := cs[0].Manifest
	if err := m.Validate(); err != nil {
		t.Fatalf("the job manifest as written: %v", err)
	}
	// Restored part by part with another count of nodes (a job shrunk to one node, or grown to
	// three), a part's files would go to no node: refused (found from outside).
	one := 1
	for _, world := range []int{1, 3} {
		_, err := Restore(t.Context(), store, RestoreOptions{Job: "job", To: t.TempDir(), Logger: zerolog.Nop(), Part: &one, WorldNodes: world})
		if want := fmt.Sprintf("was saved by 2 nodes, and store.world_nodes is %d now", world); err == nil || !strings.Contains(err.Error(), want) {
			t.Errorf("Restore of part 1 at world_nodes %d = %v; want it refused, saying %q", world, err, want)
		}
	}
	if _, err := Restore(t.Context(), store, RestoreOptions{Job: "job", To: t.TempDir(), Logger: zerolog.Nop(), Part: &one, WorldNodes: 2}); err != nil {
		t.Errorf("Restore of part 1 at world_nodes 2: %v", err)
	}

	key := ManifestKey("job", m.Checkpoint, m.Commit)
	m.Files = slices.DeleteFunc(m.Files, func(f File) bool {
		if f.Path == "shard-1.bin" {
			m.TotalBytes -= f.Size
			return true
		}
		return false
	})
	data, err := json.Marshal(m)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := store.PutBytes(t.Context(), key, data, Cond{}); err != nil {
		t.Fatal(err)
	}

	want := "part 1 has 3 files of"
	if _, problems, err := ListCommitted(t.Context(), store, "job"); err != nil || !slices.ContainsFunc(problems, func(p error) bool { return strings.Contains(p.Error(), want) }) {
		t.Errorf("ListCommitted after the edit: problems %v, %v; want %q", problems, err, want)
	}
	for _, part := range []*int{nil, &one} {
		_, err := Restore(t.Context(), store, RestoreOptions{Job: "job", To: t.TempDir(), Logger: zerolog.Nop(), Part: part})
		if err == nil || !strings.Contains(err.Error(), want) {
			t.Errorf("Restore (part %v) of the edited job manifest: %v; want it refused, saying %q", part != nil, err, want)
		}
	}
}

// A node that saves a name again alone after the job committed it (its trainer saved the step
// again) has its new part given up after part_wait, as before; the error said only that the
// other node's part did not come, though it had, for the save committed before. It now says so,
// and what to do. (Found from outside.)
func TestMultiNodeNameSavedAgainAloneSaysTheOtherPartsAreCommitted(t *testing.T) {
	store := newMemStore()
	config := []byte("c")
	var rigs []*uploaderRig
	for rank := range 2 {
		r := startUploaderWith(t, t.TempDir(), store, UploaderConfig{NodeRank: rank, WorldNodes: 2, PartWait: 4 * time.Second,
			Host: func() Host { return Host{InstanceID: fmt.Sprintf("i-node%d", rank)} }})
		writeCheckpoint(t, r.dir, "step-000050", withoutMarker(nodeFiles(t, rank, config)))
		rigs = append(rigs, r)
	}
	first := rigs[0].waitEvent(JobCheckpointCommitted, "step-000050").Manifest
	// Node 0's trainer saves the step again, alone.
	writeCheckpoint(t, rigs[0].dir, "step-000050", withoutMarker(nodeFiles(t, 0, config)))
	ev := rigs[0].waitEvent(JobCheckpointFailed, "step-000050")
	if ev.Err == nil || !strings.Contains(ev.Err.Error(), "their parts of step-000050 are in job commit "+first.Commit) {
		t.Errorf("given up with %v; want it to say node 1's part is in job commit %s", ev.Err, first.Commit)
	}
}
