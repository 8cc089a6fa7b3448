package checkpoint

import (
	"fmt"
	"maps"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"testing/synctest"
	"time"

	"github.com/rs/zerolog"
)

// The simulation's multi-node mode: one agent per node rank of a job (store.world_nodes), every
// node saving the same step into its own directory (its shard, a file every node writes alike,
// the marker, sometimes with a token, sometimes empty), one node sometimes dying before its
// marker, agents killed, stopped and restarted, notices, faults, retention. After every step the
// same checks as the single-node run (simBackend's history checks; every job manifest must be a
// whole save the nodes had complete: the union of every node's files of one save); at the end I5
// for every save complete on every node and newer than LATEST's target, I6, the store check and a
// restore.

// simPartWait is store.part_wait in the multi-node simulation: short enough that retention and
// the collection of parts that never made a save happen within a run.
const simPartWait = 10 * time.Minute

// simNodeSeeds run on every `go test`; the world size is 2 + seed % 3.
var simNodeSeeds = []uint64{1, 2, 3, 4, 5, 6}

func TestSimulationNodes(t *testing.T) {
	runSeeds(t, "TestSimulationNodes", simNodeSeeds, runNodeSim)
}

func runNodeSim(t *testing.T, seed uint64, steps int) {
	s := newSim(t, seed)
	s.world, s.lastSave, s.lastMarker = 2+int(seed%3), map[string]time.Time{}, map[string][]byte{}
	for rank := range s.world {
		a := &simAgent{name: fmt.Sprintf("n%d", rank), rank: rank}
		a.dir, a.state = filepath.Join(s.root, a.name, "ckpt"), filepath.Join(s.root, a.name, "run-0")
		if err := os.MkdirAll(a.dir, 0o755); err != nil {
			t.Fatal(err)
		}
		s.agents = append(s.agents, a)
		s.startAgent(a)
	}
	defer func() {
		for _, a := range s.agents {
			s.stopAgent(a)
		}
		s.awaitLate()
	}()
	for s.step = 0; s.step < steps; s.step++ {
		s.actNodes()
		synctest.Wait()
		s.check()
	}
	s.settleNodes()
}

// actNodes takes one random step of the multi-node mode.
func (s *sim) actNodes() {
	a := s.pickAgent()
	switch r := s.rng.IntN(100); {
	case r < 35:
		s.saveNodes()
	case r < 42:
		s.toggleNotice(a)
	case r < 50:
		if a != nil {
			s.killAgent(a)
		}
	case r < 53:
		if a != nil {
			s.stopAgent(a)
		}
	case r < 62:
		s.startAll()
	case r < 68:
		s.randomFaults()
	default:
		advance(time.Duration(s.rng.IntN(30_000)) * time.Millisecond)
	}
}

// saveNodes has every node save the same step: its files, then (but on a node that dies first)
// its marker, the same on every node: a token, or empty. A name is saved again (a rollback) only
// with another token.
func (s *sim) saveNodes() {
	var marker []byte
	if s.rng.IntN(2) == 0 {
		marker = fmt.Appendf(nil, "%016x", s.rng.Uint64())
	}
	// Files get real change times, which order commits and group parts into saves, while the
	// bubble's clock is fake: every save of a run completes within a second of real time. So a
	// name is saved again only with tokens in both saves' markers (then they are told apart
	// exactly); the one-minute rule for empty markers is TestAssembleSave's.
	name := s.name()
	if _, ok := s.lastSave[name]; ok && (len(marker) == 0 || len(s.lastMarker[name]) == 0) {
		s.names++
		name = fmt.Sprintf("step-%06d", 100*s.names)
	}
	dies := -1
	if s.rng.IntN(10) == 0 {
		dies = s.rng.IntN(s.world)
	}
	shared := s.size()
	sharedData := make([]byte, shared)
	for i := range sharedData {
		sharedData[i] = byte(s.rng.Uint32())
	}
	for _, a := range s.agents {
		dir := filepath.Join(a.dir, name)
		if _, err := os.Lstat(dir); err == nil {
			os.RemoveAll(dir)
			s.send(a, WatchEvent{Kind: Removed, Checkpoint: name})
		}
		for i := range 1 + s.rng.IntN(3) {
			rel := fmt.Sprintf("shard-%d-%d.bin", a.rank, i)
			p := filepath.Join(dir, rel)
			s.writeFile(p, s.size())
			s.send(a, WatchEvent{Kind: FileReady, Checkpoint: name, Path: rel, ID: s.fileID(p)})
		}
		p := filepath.Join(dir, "config.json")
		if err := os.WriteFile(p, sharedData, 0o644); err != nil {
			s.fail("%v", err)
		}
		s.send(a, WatchEvent{Kind: FileReady, Checkpoint: name, Path: "config.json", ID: s.fileID(p)})
		advance(time.Duration(s.rng.IntN(1000)) * time.Millisecond)
	}
	for _, a := range s.agents {
		if a.rank == dies {
			continue
		}
		if err := os.WriteFile(filepath.Join(a.dir, name, "_COMPLETE"), marker, 0o644); err != nil {
			s.fail("%v", err)
		}
		s.complete(a, name)
		advance(time.Duration(s.rng.IntN(500)) * time.Millisecond)
	}
	s.lastSave[name], s.lastMarker[name] = time.Now(), marker
	if fp, ok := s.saveFingerprint(name); ok {
		if s.snaps[name] == nil {
			s.snaps[name] = map[string]bool{}
		}
		s.snaps[name][fp] = true
	}
}

// saveFingerprint is the (path, checksum) list of the save of name that every node holds, as
// a job manifest of it lists it; false when some node's copy is not complete.
func (s *sim) saveFingerprint(name string) (string, bool) {
	lines := map[string]bool{}
	for _, a := range s.agents {
		fp, ok := s.fingerprint(a, name)
		if !ok {
			return "", false
		}
		for l := range strings.SplitSeq(fp, "\n") {
			lines[l] = true
		}
	}
	return strings.Join(slices.Sorted(maps.Keys(lines)), "\n"), true
}

// settleNodes turns the faults off, starts every agent, and checks that every save complete on
// every node, newer than LATEST's target and made at most part_wait / 2 before, is committed as a
// job checkpoint within a bounded time (I5); then the store check,
// I6 and a restore of the newest job checkpoint.
func (s *sim) settleNodes() {
	s.b.setFaults(simFaults{maxLatency: 50 * time.Millisecond})
	for _, a := range s.agents {
		if !s.running(a) {
			s.startAgent(a)
		}
	}
	const bound = 20 * time.Minute
	deadline := time.Now().Add(bound)
	// A save whose nodes' agents were down until now may have parts more than part_wait apart:
	// it is given up, by design. Every later one must commit.
	since := time.Now().Add(-simPartWait / 2)
	for {
		advance(10 * time.Second)
		synctest.Wait()
		s.check()
		// A save older than LATEST's target need not be committed: a newer one is (and one
		// completed after it is never written; see completeSave).
		var missing []string
		s.b.mu.Lock()
		have := maps.Clone(s.b.everCommitted)
		var floor time.Time
		if l := s.b.latest; l != nil && l.CompleteAt != nil {
			floor = *l.CompleteAt
		}
		s.b.mu.Unlock()
		for name, at := range s.lastSave {
			if fp, ok := s.saveFingerprint(name); ok && at.After(floor) && at.After(since) && !slices.Contains(have[name], fp) {
				missing = append(missing, name)
			}
		}
		if len(missing) == 0 {
			break
		}
		if time.Now().After(deadline) {
			slices.Sort(missing)
			var lines []string
			for _, l := range strings.Split(s.logs.tail(100000), "\n") {
				for _, m := range missing {
					if strings.Contains(l, `"checkpoint":"`+m+`"`) {
						lines = append(lines, l)
					}
				}
			}
			s.fail("I5: saves complete on every node not committed for the job %v after the store came back: %s\nits log lines:\n%s",
				bound, strings.Join(missing, ", "), strings.Join(lines[max(0, len(lines)-60):], "\n"))
		}
	}
	for _, a := range s.agents {
		s.stopAgent(a)
	}
	s.check()
	clean := s.b.connect("check")
	s.storeCheck(clean)
	if len(s.b.manifests()) == 0 {
		return
	}
	to := filepath.Join(s.root, "restored")
	res, err := Restore(s.t.Context(), clean, RestoreOptions{Job: s.job, To: to, Logger: zerolog.Nop()})
	if err != nil {
		s.fail("restore of the newest job checkpoint: %v", err)
	}
	st, _ := readJob(s.t.Context(), clean, s.job, nil)
	if n := st.Newest().Manifest; n.Commit != res.Commit || n.Checkpoint != res.Checkpoint || len(n.Parts) != s.world {
		s.fail("I6: restore took %s/%s, not the newest job checkpoint %s/%s of %d parts", res.Checkpoint, res.Commit, n.Checkpoint, n.Commit, len(n.Parts))
	}
}
