package agent

import (
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/spotguard/spotguard/checkpoint"
)

// The newest checkpoint committed, and its age, follow the order of commits, not the order the
// commits were seen in: a restart matches the checkpoints it finds newest first, then the older
// ones (found already committed), and a checkpoint whose commit retention had deleted is
// committed anew; neither made the newest older (the age alarm would have fired on a healthy job).
func TestNewestCheckpointNeverMovesBack(t *testing.T) {
	a := newIdleAgent(t)
	base := time.Date(2026, 12, 3, 4, 0, 0, 0, time.UTC)
	commit := func(name string, complete, committed time.Time, already bool) {
		a.onUpload(checkpoint.UploadEvent{Kind: checkpoint.CheckpointCommitted, Checkpoint: name, At: committed, Already: already,
			Manifest: &checkpoint.Manifest{Checkpoint: name, Commit: "c-" + name, CommittedAt: committed,
				Timings: checkpoint.Timings{CompleteAt: &complete}}})
	}
	check := func(when, wantName string, wantCommitted time.Time) {
		t.Helper()
		a.mu.Lock()
		name := a.newestName
		a.mu.Unlock()
		if name != wantName {
			t.Errorf("%s: newest checkpoint %q; want %q", when, name, wantName)
		}
		const gauge = "spotguard_checkpoint_newest_committed_timestamp_seconds "
		var got float64
		for line := range strings.Lines(scrape(t, a)) {
			if v, ok := strings.CutPrefix(line, gauge); ok {
				if _, err := fmt.Sscan(v, &got); err != nil {
					t.Fatalf("%s: %q: %v", when, line, err)
				}
			}
		}
		if want := float64(wantCommitted.Unix()); got != want {
			t.Errorf("%s: %s%v; want %v", when, gauge, got, want)
		}
		if got := a.newestCommit.Load(); got != wantCommitted.UnixNano() {
			t.Errorf("%s: newest commit %v; want %v", when, time.Unix(0, got).UTC(), wantCommitted)
		}
	}
	commit("checkpoint-1000", base.Add(-10*time.Minute), base.Add(-9*time.Minute), true)
	check("the newest found committed", "checkpoint-1000", base.Add(-9*time.Minute))
	commit("checkpoint-500", base.Add(-70*time.Minute), base.Add(-69*time.Minute), true)
	check("an older one found committed after it", "checkpoint-1000", base.Add(-9*time.Minute))
	commit("checkpoint-250", base.Add(-130*time.Minute), base, false)
	check("an older one committed anew after it", "checkpoint-1000", base.Add(-9*time.Minute))
	commit("checkpoint-1500", base.Add(time.Minute), base.Add(2*time.Minute), false)
	check("a newer one", "checkpoint-1500", base.Add(2*time.Minute))
}
