package checkpoint

import (
	"bytes"
	"errors"
	"fmt"
	"maps"
	"os"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/rs/zerolog"
)

// Scenarios found from outside (a real binary, versitygw, several agents as the nodes of one
// job): saves that must never be taken for one job checkpoint, and conflicts that must be
// named for what they are.

// putSingle writes a single-node commit of job/name directly into s (its files, then its
// manifest), as an agent with store.world_nodes 1 would, and returns its manifest.
func putSingle(t testing.TB, s Store, name, host string, files map[string][]byte, complete time.Time) *Manifest {
	t.Helper()
	return putCommit(t, s, name, host, files, complete, complete, nil)
}

// A node left at the default store.world_nodes (1) in a two-node job commits its own files of a
// save as a single-node checkpoint (torn: node 0's files are not in it), and moves LATEST to it.
// The multi-node agent of node 0 finds it beside its part of the same save: an error (event and
// log), never taken for the job checkpoint, and LATEST is left where the stray agent put it (not
// moved back). Whichever comes first, the single-node commit or node 0's part.
func TestMultiNodeSingleNodeCommitOfSameSave(t *testing.T) {
	for _, singleFirst := range []bool{true, false} {
		t.Run(fmt.Sprintf("single-node first=%v", singleFirst), func(t *testing.T) {
			store := newMemStore()
			config := []byte("c")
			u0 := startNode(t, store, 0, 2, "i-u0")
			u1 := startUploaderWith(t, t.TempDir(), store, UploaderConfig{Host: func() Host { return Host{InstanceID: "i-u1"} }})
			save := func(r *uploaderRig, rank int) {
				files := nodeFiles(t, rank, config)
				delete(files, "_COMPLETE")
				writeCheckpoint(t, r.dir, "step-000100", files)
			}
			var single *Manifest
			if singleFirst {
				save(u1, 1)
				single = u1.waitCommitted("step-000100").Manifest
				save(u0, 0)
				u0.waitPart("step-000100")
			} else {
				save(u0, 0)
				u0.waitPart("step-000100")
				save(u1, 1)
				single = u1.waitCommitted("step-000100").Manifest
			}
			if single.Part != nil || single.Parts != nil {
				t.Fatalf("the world_nodes-1 agent committed %+v; want a single-node manifest", single)
			}
			ev := u0.waitEvent(JobCheckpointFailed, "step-000100")
			for _, want := range []string{"single-node commit " + single.Commit, "i-u1", "store.world_nodes"} {
				if ev.Err == nil || !strings.Contains(ev.Err.Error(), want) {
					t.Errorf("node 0's job checkpoint failure = %v; want it to say %q", ev.Err, want)
				}
			}
			if !strings.Contains(u0.logs.String(), "single-node commit "+single.Commit) {
				t.Errorf("the error is not logged:\n%s", u0.logs)
			}
			cs, _, err := ListCommitted(t.Context(), store, "job")
			if err != nil || len(cs) != 1 || cs[0].Manifest.Commit != single.Commit || !cs[0].Latest {
				t.Errorf("commits = %d (%v); want the single-node one alone, LATEST (never moved back)", len(cs), err)
			}
			// Node 0's restore of its part never takes node 1's files for it, and the store
			// check says what is wrong.
			zero := 0
			if _, err := Restore(t.Context(), store, RestoreOptions{Job: "job", To: t.TempDir(), Part: &zero, Logger: zerolog.Nop()}); err == nil ||
				!strings.Contains(err.Error(), "single-node commit") {
				t.Errorf("restore --part 0 of a single-node commit = %v; want it refused", err)
			}
			if problems := CheckJob(t.Context(), store, "job", true); !slices.ContainsFunc(problems, func(err error) bool {
				return strings.Contains(err.Error(), "step-000100")
			}) {
				t.Errorf("store check = %v; want it to name the checkpoint saved both ways", problems)
			}
		})
	}
}

// A save is parts whose completion times all lie within SaveSpread of each other: three or four
// ranks whose neighbours are each under a minute apart, but the first and the last more, are
// not one save, for every rank's agent; with every part within a minute it is.
func TestMultiNodeSaveSpanIsOneMinute(t *testing.T) {
	tests := []struct {
		name    string
		offsets []time.Duration // each rank's completion after the first's
		commit  bool
	}{
		{"3 ranks over 100 s", []time.Duration{0, 50 * time.Second, 100 * time.Second}, false},
		{"4 ranks over 70 s", []time.Duration{0, 20 * time.Second, 40 * time.Second, 70 * time.Second}, false},
		{"4 ranks out of order over 61 s", []time.Duration{40 * time.Second, 61 * time.Second, 0, 30 * time.Second}, false},
		{"3 ranks within 60 s", []time.Duration{0, 30 * time.Second, 60 * time.Second}, true},
		{"4 ranks within 55 s", []time.Duration{0, 20 * time.Second, 40 * time.Second, 55 * time.Second}, true},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			store := newMemStore()
			world := len(tt.offsets)
			t0 := time.Now().Add(-2 * time.Minute)
			var parts []*Manifest
			for rank, off := range tt.offsets {
				at := t0.Add(off)
				parts = append(parts, putPart(t, store, "step-000100", rank, world, fmt.Sprintf("i-node%d", rank), nodeFiles(t, rank, []byte("c")), at, at))
			}
			committed := 0
			for rank, p := range parts {
				r := completeSave(t.Context(), store, p, "_COMPLETE", Host{}, time.Hour, nil)
				if r.err != nil {
					t.Fatalf("node %d: completeSave error %v", rank, r.err)
				}
				if r.job == nil {
					if tt.commit {
						t.Errorf("node %d: not committed (missing %v, %v); want the job checkpoint", rank, r.missing, r.waiting)
					}
					// Every rank has a part in the store: a wait is explained, never bare.
					if r.waiting == nil || !strings.Contains(r.waiting.Error(), "apart") {
						t.Errorf("node %d: waits for %v saying %v; want it to say which parts are too far apart", rank, r.missing, r.waiting)
					}
					continue
				}
				committed++
				if !tt.commit {
					var spans []string
					for _, jp := range r.job.Parts {
						spans = append(spans, jp.CompleteAt.Sub(t0).String())
					}
					t.Fatalf("node %d: job manifest written of parts completed at +%v; want none: they span more than %v", rank, spans, SaveSpread)
				}
			}
			if tt.commit && committed != world {
				t.Errorf("%d of %d agents found the job checkpoint", committed, world)
			}
			if !tt.commit {
				if cs, _, _ := ListCommitted(t.Context(), store, "job"); len(cs) != 0 {
					t.Errorf("committed: %+v", cs[0].Manifest.Parts)
				}
			}
		})
	}
}

// The agent of a rank whose parts are all in but more than a minute apart says why it waits, and
// when part_wait has passed, gives up saying that (not that parts did not come).
func TestMultiNodeSaveSpanGivenUp(t *testing.T) {
	store := newMemStore()
	now := time.Now()
	putPart(t, store, "step-000100", 0, 3, "i-node0", nodeFiles(t, 0, []byte("c")), now.Add(-50*time.Second), now)
	putPart(t, store, "step-000100", 2, 3, "i-node2", nodeFiles(t, 2, []byte("c")), now.Add(50*time.Second), now)
	r := startUploaderWith(t, t.TempDir(), store, UploaderConfig{NodeRank: 1, WorldNodes: 3, PartWait: 3 * time.Second,
		Host: func() Host { return Host{InstanceID: "i-node1"} }})
	files := nodeFiles(t, 1, []byte("c"))
	delete(files, "_COMPLETE")
	writeCheckpoint(t, r.dir, "step-000100", files)
	r.waitPart("step-000100")
	ev := r.waitEvent(JobCheckpointFailed, "step-000100")
	if ev.Err == nil || !strings.Contains(ev.Err.Error(), "more than 1m0s apart") || strings.Contains(ev.Err.Error(), "did not come") ||
		!strings.Contains(ev.Err.Error(), "or a node's clock is that far off") {
		t.Errorf("given up with %v; want it to say the parts completed more than a minute apart, or a clock is off", ev.Err)
	}
	if !strings.Contains(r.logs.String(), "more than 1m0s apart") {
		t.Errorf("the wait is not explained in the log:\n%s", r.logs)
	}
}

// A second instance claiming rank 1 of a save whose job manifest is written already (with the
// first instance's part of rank 1): the documented two-instances error, at once, whether its
// part completed before or after the committed one, never a wait for rank 0's part (in the job
// manifest) until part_wait.
func TestMultiNodeRankClaimedAfterJobManifest(t *testing.T) {
	for _, later := range []bool{true, false} {
		t.Run(fmt.Sprintf("later=%v", later), func(t *testing.T) {
			store := newMemStore()
			now := time.Now().Add(-30 * time.Second)
			var parts []*Manifest
			for rank := range 2 {
				parts = append(parts, putPart(t, store, "step-000100", rank, 2, fmt.Sprintf("i-node%d", rank), nodeFiles(t, rank, []byte("c")), now, now))
			}
			if r := completeSave(t.Context(), store, parts[1], "_COMPLETE", Host{}, time.Hour, nil); !r.written {
				t.Fatalf("completeSave = %+v", r)
			}
			at := now.Add(10 * time.Second)
			if !later {
				at = now.Add(-10 * time.Second)
			}
			late := putPart(t, store, "step-000100", 1, 2, "i-other", nodeFiles(t, 1, []byte("c")), at, at)
			r := completeSave(t.Context(), store, late, "_COMPLETE", Host{}, time.Hour, nil)
			var c *ConflictError
			if !errors.As(r.err, &c) || !strings.Contains(r.err.Error(), "node rank 1 is claimed by two instances") ||
				!strings.Contains(r.err.Error(), "is store.node_rank set twice?") {
				t.Errorf("the second instance's completeSave = err %v, missing %v; want the two-instances conflict", r.err, r.missing)
			}
		})
	}

	// Through the agent: its event and its log say so.
	store := newMemStore()
	now := time.Now().Add(-time.Second)
	var parts []*Manifest
	for rank := range 2 {
		parts = append(parts, putPart(t, store, "step-000200", rank, 2, fmt.Sprintf("i-node%d", rank), nodeFiles(t, rank, []byte("c")), now, now))
	}
	if r := completeSave(t.Context(), store, parts[0], "_COMPLETE", Host{}, time.Hour, nil); !r.written {
		t.Fatalf("completeSave = %+v", r)
	}
	rig := startNode(t, store, 1, 2, "i-other")
	files := nodeFiles(t, 1, []byte("c"))
	delete(files, "_COMPLETE")
	writeCheckpoint(t, rig.dir, "step-000200", files)
	rig.waitPart("step-000200")
	ev := rig.waitEvent(JobCheckpointFailed, "step-000200")
	if ev.Err == nil || !strings.Contains(ev.Err.Error(), "node rank 1 is claimed by two instances") {
		t.Errorf("job checkpoint failure = %v; want the two-instances conflict", ev.Err)
	}
	if !strings.Contains(rig.logs.String(), "node rank 1 is claimed by two instances") {
		t.Errorf("the error is not logged:\n%s", rig.logs)
	}
}

// Markers, like completion times, must agree across the whole save: a part without a marker
// (DCP's .metadata is on node 0 only) is near parts with either of two tokens, but those are two
// saves, never one.
func TestAssembleSaveMarkersAcrossTheSave(t *testing.T) {
	now := time.Now()
	part := func(rank int, marker string) *Manifest {
		m := &Manifest{Version: ManifestVersion, Job: "job", Checkpoint: "c", Commit: NewCommitID(now), Host: Host{InstanceID: fmt.Sprint("i-", rank)},
			CommittedAt: now, Part: &Part{NodeRank: rank, WorldNodes: 3}}
		m.Timings.CompleteAt = &now
		m.Files = []File{{Path: fmt.Sprintf("shard-%d", rank), Size: 1, Checksum: Checksum{Algorithm: ChecksumCRC32C, Value: "x"}}}
		if marker != "" {
			m.Files = append(m.Files, File{Path: "_COMPLETE", Size: int64(len(marker)), Checksum: Checksum{Algorithm: ChecksumCRC32C, Value: marker}})
		}
		return m
	}
	mine := part(1, "")
	_, missing, err := assembleSave(mine, []*Manifest{part(0, "run-a"), mine, part(2, "run-b")}, "_COMPLETE")
	var apart *apartError
	if !errors.As(err, &apart) || missing != nil || !strings.Contains(err.Error(), "markers with other bytes") {
		t.Errorf("assembleSave = missing %v, %v; want the parts found not of one save (other markers)", missing, err)
	}
	if got, _, err := assembleSave(mine, []*Manifest{part(0, "run-a"), mine, part(2, "run-a")}, "_COMPLETE"); err != nil || len(got) != 3 {
		t.Errorf("assembleSave with one token = %d parts, %v; want the save", len(got), err)
	}
}

// LATEST on a single-node commit (a stray node's, see above): a job save older than it is an
// error naming it, not committed, and LATEST is not moved back; a newer job save commits and
// moves LATEST forward, onto the job's checkpoint.
func TestMultiNodeLatestOnSingleNodeCommit(t *testing.T) {
	store := newMemStore()
	now := time.Now()
	single := putSingle(t, store, "step-000150", "i-stray", nodeFiles(t, 1, nil), now.Add(-time.Minute))
	if moved, err := advanceLatest(t.Context(), store, single, Host{}, nil); !moved || err != nil {
		t.Fatalf("advanceLatest(single-node commit) = %v, %v", moved, err)
	}
	save := func(name string, at time.Time) saveResult {
		var p *Manifest
		for rank := range 2 {
			p = putPart(t, store, name, rank, 2, fmt.Sprintf("i-node%d", rank), nodeFiles(t, rank, nil), at, now)
		}
		return completeSave(t.Context(), store, p, "_COMPLETE", Host{}, time.Hour, nil)
	}
	latest := func() string {
		l, _, err := store.GetBytes(t.Context(), LatestKey("job"))
		if err != nil {
			t.Fatal(err)
		}
		return string(l)
	}

	r := save("step-000100", now.Add(-2*time.Minute))
	var c *ConflictError
	if !errors.As(r.err, &c) || !strings.Contains(r.err.Error(), "LATEST names a newer checkpoint that is a single-node commit "+single.Commit) || r.older {
		t.Errorf("older job save = err %v, older %v; want a conflict naming the single-node commit LATEST is on", r.err, r.older)
	}
	if l := latest(); !strings.Contains(l, single.Commit) {
		t.Errorf("LATEST = %s; want it left on %s", l, single.Commit)
	}

	r = save("step-000200", now)
	if r.err != nil || !r.written || !r.latestMoved {
		t.Fatalf("newer job save = %+v; want it committed, LATEST moved", r)
	}
	if l := latest(); !strings.Contains(l, r.job.Commit) {
		t.Errorf("LATEST = %s; want the job checkpoint %s", l, r.job.Commit)
	}
}

// A plain restore of a job whose newest commit is a single-node commit of a save that the other
// nodes wrote parts of (a node left at store.world_nodes 1) refuses it, naming it: one node's
// files alone. It used to restore it, exit 0, as complete. --commit still restores it when asked.
// (Found from outside.)
func TestRestoreRefusesATornSingleNodeCommit(t *testing.T) {
	store := newMemStore()
	now := time.Now()
	older := putSingle(t, store, "step-000050", "i-node0", nodeFiles(t, 0, nil), now.Add(-time.Hour)) // a job resized, say
	for _, rank := range []int{0, 2} {
		putPart(t, store, "step-000100", rank, 3, fmt.Sprintf("i-node%d", rank), nodeFiles(t, rank, nil), now.Add(-time.Second), now)
	}
	single := putSingle(t, store, "step-000100", "i-stray", nodeFiles(t, 1, nil), now)
	if moved, err := advanceLatest(t.Context(), store, single, Host{}, nil); !moved || err != nil {
		t.Fatalf("advanceLatest(single-node commit) = %v, %v", moved, err)
	}
	for _, name := range []string{"", "step-000100"} {
		to := t.TempDir()
		_, err := Restore(t.Context(), store, RestoreOptions{Job: "job", Checkpoint: name, To: to, Logger: zerolog.Nop()})
		if err == nil || !strings.Contains(err.Error(), "is a single-node commit of a save that node(s) [0 2] of this multi-node job wrote parts of") ||
			!strings.Contains(err.Error(), single.Commit) {
			t.Errorf("Restore(checkpoint %q) = %v; want the torn single-node commit %s refused, naming it", name, err, single.Commit)
		}
		if ents, _ := os.ReadDir(to); len(ents) != 0 {
			t.Errorf("Restore(checkpoint %q) left %v", name, ents)
		}
	}
	if _, err := Restore(t.Context(), store, RestoreOptions{Job: "job", Checkpoint: "step-000100", Commit: single.Commit, CommitSet: true,
		To: t.TempDir(), Logger: zerolog.Nop()}); err != nil {
		t.Errorf("Restore(--commit %s) = %v; want it restored when asked for", single.Commit, err)
	}
	if _, err := Restore(t.Context(), store, RestoreOptions{Job: "job", Checkpoint: "step-000050", To: t.TempDir(), Logger: zerolog.Nop()}); err != nil {
		t.Errorf("Restore(step-000050, %s) = %v; want a single-node commit of no multi-node save restored", older.Commit, err)
	}
}

// A node at another store.world_nodes than the others, whose part comes after theirs made a job
// checkpoint of the same save: that commit lacks this node's files. Before, it went unnoticed
// (the node looked at the committed parts of its own rank alone), LATEST named the torn
// checkpoint, every agent stayed healthy and `list --check` passed (found from outside: nodes 0
// and 1 at world_nodes 2, node 2 at 3). Now this node's agent says so (a conflict), `list`
// names the save's problem, and `list --check` fails.
func TestMultiNodeWorldNodesDisagreeingWithACommittedSave(t *testing.T) {
	store := newMemStore()
	now := time.Now().Add(-30 * time.Second)
	parts := committedSave(t, store, "step-000100", 2, now)
	late := putPart(t, store, "step-000100", 2, 3, "i-node2", nodeFiles(t, 2, []byte("c")), now.Add(5*time.Second), now.Add(5*time.Second))
	r := completeSave(t.Context(), store, late, "_COMPLETE", Host{}, time.Hour, nil)
	var c *ConflictError
	if !errors.As(r.err, &c) || !strings.Contains(r.err.Error(), "parts disagree on world_nodes") || !strings.Contains(r.err.Error(), "lacks this node's files") {
		t.Errorf("node 2's completeSave = err %v, missing %v; want the world_nodes conflict with the committed save", r.err, r.missing)
	}
	inc, err := ListIncomplete(t.Context(), store, "job")
	if err != nil || len(inc) != 1 || !strings.Contains(inc[0].Problem, "job commit "+parts[0].Commit+" of this save was made with world_nodes 2") {
		t.Errorf("ListIncomplete = %+v, %v; want node 2's part, its problem the committed save of world_nodes 2", inc, err)
	}
	if v := CheckJob(t.Context(), store, "job", true); !slices.ContainsFunc(v, func(err error) bool { return strings.Contains(err.Error(), "world_nodes") }) {
		t.Errorf("CheckJob = %v; want a violation naming world_nodes", v)
	}
}

// committedSave writes the parts of a save of name by nodes i-node0… of a world-node job, all
// completed at at, and its job manifest, as their agents would have; it returns the parts.
func committedSave(t *testing.T, store Store, name string, world int, at time.Time) []*Manifest {
	t.Helper()
	var parts []*Manifest
	for rank := range world {
		parts = append(parts, putPart(t, store, name, rank, world, fmt.Sprintf("i-node%d", rank), nodeFiles(t, rank, []byte("c")), at, at))
	}
	if r := completeSave(t.Context(), store, parts[0], "_COMPLETE", Host{}, time.Hour, nil); !r.written {
		t.Fatalf("completeSave = %+v", r)
	}
	return parts
}

// A second instance's part of a rank already in a committed job checkpoint of the same save:
// `list` names the double claim and `list --check` fails. Before, they looked at parts no job
// manifest lists alone, and passed (found from outside).
func TestListSaysARankClaimedAgainstACommittedSave(t *testing.T) {
	store := newMemStore()
	now := time.Now().Add(-30 * time.Second)
	parts := committedSave(t, store, "step-000100", 2, now)
	putPart(t, store, "step-000100", 1, 2, "i-other", nodeFiles(t, 1, []byte("c")), now.Add(3*time.Second), now.Add(3*time.Second))
	// The same instance saving its rank again is no claim of another's.
	putPart(t, store, "step-000100", 0, 2, "i-node0", nodeFiles(t, 0, []byte("c")), now.Add(4*time.Second), now.Add(4*time.Second))
	inc, err := ListIncomplete(t.Context(), store, "job")
	if err != nil || len(inc) != 1 || !strings.Contains(inc[0].Problem, "node rank 1 is claimed by two instances, i-node1 (in job commit "+parts[0].Commit+") and i-other") ||
		strings.Contains(inc[0].Problem, "node rank 0") {
		t.Errorf("ListIncomplete = %+v, %v; want the save with node rank 1 claimed twice, against the committed one, and nothing of rank 0", inc, err)
	}
	if v := CheckJob(t.Context(), store, "job", true); !slices.ContainsFunc(v, func(err error) bool { return strings.Contains(err.Error(), "claimed by two instances") }) {
		t.Errorf("CheckJob = %v; want a violation naming the double claim", v)
	}
}

// A save of this node's whose other parts never came, while a newer save of this node's made a
// job checkpoint (a slower node's trainer deleted the older save before its part went): given up
// after part_wait, it was an error and a job checkpoint failure, /healthz 503 until the next job
// commit, saying LATEST "stays where it is" while it was on the newer one (found from outside).
// Overtaken, it is a warning, and no failure.
func TestMultiNodeSaveOvertakenByANewerJobCheckpointIsNoFailure(t *testing.T) {
	store := newMemStore()
	r := startUploaderWith(t, t.TempDir(), store, UploaderConfig{NodeRank: 0, WorldNodes: 2, PartWait: 2 * time.Second,
		Host: func() Host { return Host{InstanceID: "i-node0"} }})
	files := withoutMarker(nodeFiles(t, 0, []byte("c")))
	writeCheckpoint(t, r.dir, "step-000010", files)
	r.waitPart("step-000010")
	writeCheckpoint(t, r.dir, "step-000011", files)
	p := r.waitPart("step-000011")
	putPart(t, store, "step-000011", 1, 2, "i-node1", withoutMarker(nodeFiles(t, 1, []byte("c"))), p.Order().At, time.Now())
	var failed []string
	deadline := time.After(20 * time.Second)
	for !strings.Contains(r.logs.String(), "job checkpoint not committed, overtaken") {
		select {
		case ev := <-r.events:
			if ev.Kind == JobCheckpointFailed {
				failed = append(failed, ev.Checkpoint+": "+ev.Err.Error())
			}
		case <-deadline:
			t.Fatalf("step-000010 not said to be overtaken within 20 s; failures %v\n%s", failed, r.logs)
		case <-time.After(10 * time.Millisecond): // the log is polled
		}
	}
	if len(failed) > 0 {
		t.Errorf("job checkpoint failures %v; want none: step-000010 was overtaken by step-000011", failed)
	}
	if cs, _, err := ListCommitted(t.Context(), store, "job"); err != nil || len(cs) != 1 || cs[0].Manifest.Checkpoint != "step-000011" {
		t.Errorf("committed %v, %v; want step-000011's job checkpoint", cs, err)
	}
}

// Every node's part in, one path with different bytes in two of them (the nodes' markers with
// other tokens, a config written differently): restore said "its other nodes' parts are not in
// the store", and list gave no reason (found from outside). Both say what is wrong.
func TestIncompleteSaveWithEveryPartInSaysWhy(t *testing.T) {
	store := newMemStore()
	now := time.Now().Add(-time.Minute)
	putPart(t, store, "step-000100", 0, 2, "i-node0", map[string][]byte{"shard-0.bin": []byte("0"), "_COMPLETE": []byte("token-a")}, now, now)
	putPart(t, store, "step-000100", 1, 2, "i-node1", map[string][]byte{"shard-1.bin": []byte("1"), "_COMPLETE": []byte("token-b")}, now, now)
	inc, err := ListIncomplete(t.Context(), store, "job")
	if err != nil || len(inc) != 1 || !strings.Contains(inc[0].Problem, "_COMPLETE is in the parts of node 0 and node 1 with different bytes") {
		t.Fatalf("ListIncomplete = %+v, %v; want the save, its problem the marker's bytes", inc, err)
	}
	_, err = Restore(t.Context(), store, RestoreOptions{Job: "job", To: t.TempDir(), Logger: zerolog.Nop()})
	if err == nil || strings.Contains(err.Error(), "parts are not in the store") || !strings.Contains(err.Error(), "different bytes") {
		t.Errorf("Restore = %v; want it to say why the parts are no save, not that they are missing", err)
	}
	// Two parts of one rank close together (a name saved again 10 s later, the other node slower): no
	// problem, the other node's next part may still come.
	store = newMemStore()
	putPart(t, store, "step-000200", 0, 2, "i-node0", map[string][]byte{"_COMPLETE": []byte("token-a")}, now, now)
	putPart(t, store, "step-000200", 0, 2, "i-node0", map[string][]byte{"_COMPLETE": []byte("token-b")}, now.Add(10*time.Second), now.Add(10*time.Second))
	putPart(t, store, "step-000200", 1, 2, "i-node1", map[string][]byte{"_COMPLETE": []byte("token-a")}, now, now)
	if inc, err := ListIncomplete(t.Context(), store, "job"); err != nil || slices.ContainsFunc(inc, func(is IncompleteSave) bool { return is.Problem != "" }) {
		t.Errorf("ListIncomplete = %+v, %v; want no problem", inc, err)
	}
}

// A node whose disk comes back without its journal (a reboot, or a new instance given the old
// volume) holds a checkpoint whose part it sent before, in a save not committed yet. It sent the
// same bytes again as another part of its rank: under a new instance id, the two parts were two
// instances claiming one rank, a conflict on every node, and the save was never committed
// (found from outside). It now finds its part in the store, sends nothing, and the save is
// committed once the other node's part comes.
func TestMultiNodeNodeBackWithoutItsJournalFindsItsPart(t *testing.T) {
	store := newMemStore()
	config := []byte("c")
	files := nodeFiles(t, 1, config) // the marker among them, empty, as writeCheckpoint writes it
	at := time.Now().Add(-10 * time.Second)
	old := putPart(t, store, "step-000100", 1, 2, "i-old", files, at, at)
	r := startUploaderWith(t, t.TempDir(), store, UploaderConfig{NodeRank: 1, WorldNodes: 2, PartWait: time.Minute, // a look every 2 s
		Host: func() Host { return Host{InstanceID: "i-new"} }})
	writeCheckpoint(t, r.dir, "step-000100", withoutMarker(maps.Clone(files))) // the part's bytes, on the disk
	if ev := r.waitCommitted("step-000100"); ev.Manifest.Commit != old.Commit || !ev.Already {
		t.Errorf("step-000100 committed as %s (already %v); want node 1's part in the store, %s, found", ev.Manifest.Commit, ev.Already, old.Commit)
	}
	putPart(t, store, "step-000100", 0, 2, "i-node0", withoutMarker(nodeFiles(t, 0, config)), at, time.Now())
	ev := r.waitEvent(JobCheckpointCommitted, "step-000100")
	if ev.Manifest == nil || len(ev.Manifest.Parts) != 2 || ev.Manifest.Parts[1].Commit != old.Commit {
		t.Fatalf("job checkpoint %+v; want node 1's part the one in the store, %s", ev.Manifest, old.Commit)
	}
	if ps := openPartsOf(t, store, "step-000100"); len(ps) != 0 {
		t.Errorf("parts no job manifest lists: %v; want none (node 1 sent nothing again)", ps)
	}
	if strings.Contains(r.logs.String(), "claimed by two instances") {
		t.Errorf("a conflict was said:\n%s", r.logs)
	}
}

// openPartsOf returns the commits of name's parts that no job manifest lists.
func openPartsOf(t *testing.T, s Store, name string) []string {
	t.Helper()
	np, err := readNameParts(t.Context(), s, "job", name, nil)
	if err != nil {
		t.Fatal(err)
	}
	var out []string
	for _, p := range np.open {
		out = append(out, p.Commit)
	}
	return out
}

// A save whose last part was committed more than part_wait after its first: no agent assembles
// the older parts any more, so it is never committed. `list` showed it as "parts 3/3" waiting,
// with no word why, and `restore` said every part was in but not one save (found from outside).
// Both now say it was given up, and why; `list --check` still passes it (nothing torn).
func TestListSaysASaveWithAPartPastPartWaitIsGivenUp(t *testing.T) {
	store := newMemStore()
	saved := time.Now().Add(-75 * time.Second)
	for rank := range 2 {
		putPart(t, store, "step-000100", rank, 3, fmt.Sprintf("i-node%d", rank), nodeFiles(t, rank, []byte("c")), saved, saved.Add(time.Second))
	}
	late := putPart(t, store, "step-000100", 2, 3, "i-node2", nodeFiles(t, 2, []byte("c")), saved, saved.Add(70*time.Second))
	if r := completeSave(t.Context(), store, late, "_COMPLETE", Host{}, time.Minute, nil); r.written || r.job != nil {
		t.Fatalf("completeSave of the late part = %+v; want the save not committed (its other parts are past part_wait)", r)
	}
	st, err := ReadJob(t.Context(), store, "job")
	if err != nil {
		t.Fatal(err)
	}
	inc := st.Incomplete(time.Minute)
	if len(inc) != 1 || len(inc[0].Ranks) != 3 || inc[0].Problem != "" ||
		!strings.Contains(inc[0].GivenUp, "node(s) 0, 1 were committed more than store.part_wait (1m0s) ago") ||
		!strings.Contains(inc[0].GivenUp, "its last part came 1m9s after its first") {
		t.Errorf("Incomplete(1m) = %+v; want parts 3/3, given up: nodes 0 and 1 past part_wait, the last part 1m9s after the first", inc)
	}
	var out bytes.Buffer
	FormatIncomplete(&out, inc)
	if !strings.Contains(out.String(), "given up: the part(s) of node(s) 0, 1") {
		t.Errorf("list shows\n%s\nwant the save given up", out.String())
	}
	if inc := st.Incomplete(time.Hour); len(inc) != 1 || inc[0].GivenUp != "" {
		t.Errorf("Incomplete(1h) = %+v; want the save waiting, not given up, within part_wait", inc)
	}
	_, err = Restore(t.Context(), store, RestoreOptions{Job: "job", Checkpoint: "step-000100", To: t.TempDir(), PartWait: time.Minute, Logger: zerolog.Nop()})
	if err == nil || !strings.Contains(err.Error(), "parts 3/3 in") || !strings.Contains(err.Error(), "it never will be: the part(s) of node(s) 0, 1") {
		t.Errorf("Restore(step-000100) = %v; want no commit, the save given up", err)
	}
	if v := CheckJob(t.Context(), store, "job", true); len(v) != 0 {
		t.Errorf("CheckJob = %v; want none: a save given up breaks no invariant", v)
	}
}
