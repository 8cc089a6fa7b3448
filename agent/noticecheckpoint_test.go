package agent

import (
	"fmt"
	"strings"
	"testing"
	"testing/synctest"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	dto "github.com/prometheus/client_model/go"

	"github.com/spotguard/spotguard/agent/imds"
	"github.com/spotguard/spotguard/checkpoint"
)

// A notice's checkpoint is the first one completed after it. A trainer that keeps training saves
// again while that one is uploaded, and may delete it (keeping the newest on disk); in urgent mode
// the newest goes first. The notice is durable once its checkpoint or one completed after it is
// committed; its checkpoint deleted before its commit gives its place to one completed since, or,
// with none, moves the notice to checkpoint_missing (deleted). Before, the notice waited for ever
// in checkpoint_written, and its time to durable and deadline margin were never recorded.
func TestNoticeCheckpointOvertakenOrDeleted(t *testing.T) {
	spot := "spot/terminate"
	type step struct {
		kind checkpoint.UploadEventKind
		name string
	}
	for _, c := range []struct {
		name       string
		steps      []step
		state      string // of spot/terminate after the steps
		detail     string // prefix of its last transition's detail
		rebalance  bool   // a rebalance recommendation comes during the save, and shares it
		thenCommit string // then this one completes and commits: committed with it
	}{
		{name: "a later checkpoint committed first",
			steps: []step{{checkpoint.CheckpointComplete, "step-10"}, {checkpoint.CheckpointComplete, "step-11"}, {checkpoint.CheckpointCommitted, "step-11"}},
			state: StateCommitted, detail: "step-11, "},
		{name: "a later checkpoint committed first, shared by a covered notice", rebalance: true,
			steps: []step{{checkpoint.CheckpointComplete, "step-10"}, {checkpoint.CheckpointComplete, "step-11"}, {checkpoint.CheckpointCommitted, "step-11"}},
			state: StateCommitted, detail: "step-11"}, // the recommendation has no deadline to say
		{name: "its checkpoint deleted, a later one there",
			steps: []step{{checkpoint.CheckpointComplete, "step-10"}, {checkpoint.CheckpointComplete, "step-11"}, {checkpoint.CheckpointDeleted, "step-10"}},
			state: StateCheckpointWritten, detail: "step-11 (step-10, written first, was deleted before its commit)", thenCommit: "step-11"},
		{name: "its checkpoint and the later one deleted",
			steps: []step{{checkpoint.CheckpointComplete, "step-10"}, {checkpoint.CheckpointComplete, "step-11"}, {checkpoint.CheckpointDeleted, "step-11"}, {checkpoint.CheckpointDeleted, "step-10"}},
			state: StateCheckpointMissing, detail: MissingDeleted, thenCommit: "step-12"},
		{name: "its checkpoint deleted, none since",
			steps: []step{{checkpoint.CheckpointComplete, "step-10"}, {checkpoint.CheckpointDeleted, "step-10"}},
			state: StateCheckpointMissing, detail: MissingDeleted, thenCommit: "step-12"},
		{name: "staged, its new name seen complete before the rename",
			steps: []step{{checkpoint.CheckpointComplete, "tmp-step-10"}, {checkpoint.CheckpointComplete, "step-10"}, {checkpoint.CheckpointRenamedAway, "tmp-step-10"}, {checkpoint.CheckpointCommitted, "step-10"}},
			state: StateCommitted, detail: "step-10, "},
		{name: "its checkpoint committed after a later one: once",
			steps: []step{{checkpoint.CheckpointComplete, "step-10"}, {checkpoint.CheckpointComplete, "step-11"}, {checkpoint.CheckpointCommitted, "step-11"}, {checkpoint.CheckpointCommitted, "step-10"}},
			state: StateCommitted, detail: "step-11, "},
	} {
		t.Run(c.name, func(t *testing.T) {
			synctest.Test(t, func(t *testing.T) {
				r := startSpotRig(t)
				if c.rebalance {
					r.begin(imds.SourceRebalance, "rebalance", time.Time{})
				}
				passFakeTime(time.Second)
				for _, s := range c.steps {
					r.upload(s.kind, s.name)
				}
				keys := []string{spot}
				if c.rebalance {
					keys = append(keys, "rebalance/rebalance")
				}
				for _, key := range keys {
					n := r.notice(t, key)
					last := n.Transitions[len(n.Transitions)-1]
					if n.State != c.state || !strings.HasPrefix(last.Detail, c.detail) {
						t.Errorf("%s: state %s (%q); want %s (%q...)", key, n.State, last.Detail, c.state, c.detail)
					}
					if n.State == StateCommitted && strings.Count(strings.Join(transitionStates(n), " "), StateCommitted) != 1 {
						t.Errorf("%s: transitions %v; want committed once", key, transitionStates(n))
					}
				}
				if got := counterValue(t, r.c.metrics.checkpointMissing.WithLabelValues("spot", MissingDeleted)); (c.state == StateCheckpointMissing) != (got == 1) {
					t.Errorf("checkpoint_missing_total{spot,deleted} = %v in state %s", got, c.state)
				}
				if c.thenCommit == "" {
					return
				}
				if c.thenCommit != "step-11" {
					r.upload(checkpoint.CheckpointComplete, c.thenCommit)
				}
				r.upload(checkpoint.CheckpointCommitted, c.thenCommit)
				if n := r.notice(t, spot); n.State != StateCommitted || !strings.HasPrefix(n.Transitions[len(n.Transitions)-1].Detail, c.thenCommit+", ") {
					t.Errorf("after %s committed: state %s, transitions %+v; want committed with it", c.thenCommit, n.State, n.Transitions)
				}
			})
		})
	}
}

// transitionStates lists n's states in order.
func transitionStates(n NoticeStatus) []string {
	var out []string
	for _, tr := range n.Transitions {
		out = append(out, tr.State)
	}
	return out
}

// An agent restarted during a notice (kill -9, a crash, the watchdog) does not signal the trainer
// again for it, and the checkpoint the trainer wrote for it may be committed already (by the
// previous run: found in the store at start) or be committed by this run without its completion
// being seen (found complete at start, before the notice was read). Either way the notice is
// committed with it. Before, it stayed trainer_signalled and went to checkpoint_missing
// (no_marker) 2 minutes after the signal, an error saying the trainer saved nothing when its
// checkpoint was in the store (found from outside, kill -9 during a reclaim notice).
func TestNoticeCheckpointOfThePreviousRun(t *testing.T) {
	for _, c := range []struct {
		name string
		// found: the commit is in the store when the agent starts; its store read answers
		// before IMDS (foundFirst) or after. Else this run commits it.
		found, foundFirst bool
		// completedBefore: the commit completed before the previous run's signal (a periodic
		// save): not the notice's.
		completedBefore bool
	}{
		{name: "committed by the previous run, found after the notice", found: true},
		{name: "committed by the previous run, found before the notice", found: true, foundFirst: true},
		{name: "committed by this run, its completion not seen", found: false},
		{name: "a commit completed before the signal", found: true, completedBefore: true},
	} {
		t.Run(c.name, func(t *testing.T) {
			synctest.Test(t, func(t *testing.T) {
				signalled := time.Now().Add(-20 * time.Second)
				r := startRestartedRig(t, true, map[string]signalRecord{"spot/terminate": {At: signalled, PIDs: []int{4242}}})
				complete, committed := signalled.Add(4*time.Second), signalled.Add(9*time.Second)
				if c.completedBefore {
					complete = signalled.Add(-time.Second)
				}
				if !c.found {
					committed = time.Now().Add(3 * time.Second)
				}
				m := &checkpoint.Manifest{Checkpoint: "step-10", Commit: "20261205T000000Z-000000000001", CommittedAt: committed,
					Timings: checkpoint.Timings{CompleteAt: &complete}}
				found := func() {
					r.c.onUpload(checkpoint.UploadEvent{Kind: checkpoint.CheckpointFound, Checkpoint: m.Checkpoint, At: time.Now(), Manifest: m})
					synctest.Wait()
				}
				if c.foundFirst {
					found()
				}
				deadline := time.Now().Add(100 * time.Second)
				r.beginRead(imds.SourceSpot, "terminate", deadline, true)
				if c.found && !c.foundFirst {
					found()
				}
				if !c.found {
					passFakeTime(3 * time.Second)
					r.c.onUpload(checkpoint.UploadEvent{Kind: checkpoint.CheckpointCommitted, Checkpoint: m.Checkpoint, At: time.Now(), Manifest: m})
					synctest.Wait()
				}
				passFakeTime(3 * time.Minute) // past the deadline, and 2 minutes after the signal
				n := r.notice(t, "spot/terminate")
				if got := r.tr.signals(); got != 0 {
					t.Errorf("signals = %d; want 0 (the previous run signalled)", got)
				}
				missing := counterValue(t, r.c.metrics.checkpointMissing.WithLabelValues("spot", "no_marker"))
				if c.completedBefore {
					if n.State != StateCheckpointMissing || missing != 1 {
						t.Errorf("state %s, checkpoint_missing_total{no_marker} %v; want checkpoint_missing: that commit is older than the signal", n.State, missing)
					}
					return
				}
				want := fmt.Sprintf("step-10, %.1f s before the deadline", deadline.Sub(committed).Seconds())
				if last := n.Transitions[len(n.Transitions)-1]; n.State != StateCommitted || last.Detail != want || missing != 0 {
					t.Errorf("state %s (%q), checkpoint_missing_total %v; want committed (%q), nothing missing", n.State, last.Detail, missing, want)
				}
				if got := histogramCount(t, r.c.metrics.timeToDurable); got != 0 {
					t.Errorf("time to durable observed %d times; want none: the notice was detected before this run", got)
				}
			})
		})
	}
}

// histogramCount is how many observations a Prometheus histogram has.
func histogramCount(t *testing.T, h prometheus.Histogram) uint64 {
	t.Helper()
	var m dto.Metric
	if err := h.Write(&m); err != nil {
		t.Fatal(err)
	}
	return m.GetHistogram().GetSampleCount()
}

// An agent restarted during a notice, whose trainer's checkpoint for it is complete but not
// committed (the store is down): the uploader reports it complete as it starts, before the
// notice is read again. The notice takes it (its marker is younger than the previous run's
// signal) and is not said missing 2 minutes after the signal. Before, it went to
// checkpoint_missing (no_marker) at once, the deadline having passed.
func TestNoticeCheckpointCompleteBeforeTheRestartIsNotMissing(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		signalled := time.Now().Add(-3 * time.Minute)
		r := startRestartedRig(t, true, map[string]signalRecord{"spot/terminate": {At: signalled, PIDs: []int{4242}}})
		r.c.onUpload(checkpoint.UploadEvent{Kind: checkpoint.CheckpointComplete, Checkpoint: "step-9", At: time.Now(), CompletedAt: signalled.Add(-time.Second)})
		r.c.onUpload(checkpoint.UploadEvent{Kind: checkpoint.CheckpointComplete, Checkpoint: "step-10", At: time.Now(), CompletedAt: signalled.Add(5 * time.Second)})
		synctest.Wait()
		r.beginRead(imds.SourceSpot, "terminate", signalled.Add(2*time.Minute), true)
		passFakeTime(time.Minute)
		n := r.notice(t, "spot/terminate")
		if last := n.Transitions[len(n.Transitions)-1]; n.State != StateCheckpointWritten || last.Detail != "step-10" {
			t.Errorf("state %s (%q); want checkpoint_written step-10 (step-9 completed before the signal)", n.State, last.Detail)
		}
		if got := counterValue(t, r.c.metrics.checkpointMissing.WithLabelValues("spot", "no_marker")); got != 0 {
			t.Errorf("checkpoint_missing_total{no_marker} = %v; want 0", got)
		}
	})
}

// The same restart, with the uploader's start reporting the complete checkpoints after the notice
// was read again (a rescan of many files takes a while): step-9, completed before the previous
// run's signal, is not the notice's checkpoint, though it is reported after the notice was
// detected; step-10, completed after the signal, is. Before, the notice took step-9 (reported
// after its detection) and was committed with a checkpoint older than its save.
func TestNoticeCheckpointReportedAfterARestartIsOlderThanTheSignal(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		signalled := time.Now().Add(-30 * time.Second)
		r := startRestartedRig(t, true, map[string]signalRecord{"spot/terminate": {At: signalled, PIDs: []int{4242}}})
		r.tr.setPIDs(4242)
		r.beginRead(imds.SourceSpot, "terminate", signalled.Add(2*time.Minute), true)
		passFakeTime(200 * time.Millisecond)
		r.c.onUpload(checkpoint.UploadEvent{Kind: checkpoint.CheckpointComplete, Checkpoint: "step-9", At: time.Now(), CompletedAt: signalled.Add(-time.Second)})
		synctest.Wait()
		if n := r.notice(t, "spot/terminate"); n.State != StateTrainerSignalled {
			t.Errorf("state %s (%q) after step-9, completed before the signal, was reported; want trainer_signalled", n.State, n.Transitions[len(n.Transitions)-1].Detail)
		}
		complete := signalled.Add(-time.Second)
		r.c.onUpload(checkpoint.UploadEvent{Kind: checkpoint.CheckpointCommitted, Checkpoint: "step-9", At: time.Now(),
			Manifest: &checkpoint.Manifest{Checkpoint: "step-9", Commit: "c-9", CommittedAt: time.Now(), Timings: checkpoint.Timings{CompleteAt: &complete}}})
		synctest.Wait()
		if n := r.notice(t, "spot/terminate"); n.State != StateTrainerSignalled {
			t.Errorf("state %s (%q) after step-9 was committed; want trainer_signalled: step-9 is older than the save", n.State, n.Transitions[len(n.Transitions)-1].Detail)
		}
		r.c.onUpload(checkpoint.UploadEvent{Kind: checkpoint.CheckpointComplete, Checkpoint: "step-10", At: time.Now(), CompletedAt: signalled.Add(5 * time.Second)})
		synctest.Wait()
		if n := r.notice(t, "spot/terminate"); n.State != StateCheckpointWritten || n.Transitions[len(n.Transitions)-1].Detail != "step-10" {
			t.Errorf("state %s (%q); want checkpoint_written step-10", n.State, n.Transitions[len(n.Transitions)-1].Detail)
		}
		if got := r.tr.signals(); got != 0 {
			t.Errorf("signals = %d; want 0 (the previous run signalled)", got)
		}
	})
}

// A file of the notice's checkpoint may turn out, as it is sent, not to be storable (its key too
// long for the store, a file the agent cannot read): the checkpoint is withheld after it was
// reported complete. The notice does not wait for its commit for ever (it said checkpoint_written
// and never moved on): with none completed since, it is checkpoint_missing (withheld) at once,
// and moves on again if the trainer writes the marker again (the checkpoint completes again) or
// saves again; with one completed since, that one is its checkpoint.
func TestNoticeCheckpointWithheldAfterItCompleted(t *testing.T) {
	for _, later := range []bool{false, true} {
		t.Run(fmt.Sprintf("a later one=%v", later), func(t *testing.T) {
			synctest.Test(t, func(t *testing.T) {
				r := startSpotRig(t)
				passFakeTime(3 * time.Second)
				r.upload(checkpoint.CheckpointComplete, "step-5")
				if later {
					passFakeTime(time.Second)
					r.upload(checkpoint.CheckpointComplete, "step-6")
				}
				passFakeTime(time.Second)
				r.upload(checkpoint.CheckpointWithheld, "step-5")
				n := r.notice(t, "spot/terminate")
				last := n.Transitions[len(n.Transitions)-1]
				missing := counterValue(t, r.c.metrics.checkpointMissing.WithLabelValues("spot", "withheld"))
				if later {
					if n.State != StateCheckpointWritten || !strings.HasPrefix(last.Detail, "step-6 (step-5") || missing != 0 {
						t.Errorf("state %s (%q), missing %v; want checkpoint_written step-6, naming step-5", n.State, last.Detail, missing)
					}
					r.upload(checkpoint.CheckpointCommitted, "step-6")
				} else {
					if n.State != StateCheckpointMissing || last.Detail != "withheld" || missing != 1 {
						t.Errorf("state %s (%q), checkpoint_missing_total{withheld} %v; want checkpoint_missing (withheld), counted once", n.State, last.Detail, missing)
					}
					// Its marker is written again as it was (the file still there): complete again,
					// withheld again.
					passFakeTime(time.Second)
					r.upload(checkpoint.CheckpointComplete, "step-5")
					r.upload(checkpoint.CheckpointWithheld, "step-5")
					if n := r.notice(t, "spot/terminate"); n.State != StateCheckpointMissing {
						t.Errorf("state %s after step-5 was withheld again; want checkpoint_missing", n.State)
					}
					passFakeTime(5 * time.Second) // the trainer moves the file and writes the marker again
					r.upload(checkpoint.CheckpointComplete, "step-5")
					if n := r.notice(t, "spot/terminate"); n.State != StateCheckpointWritten {
						t.Errorf("state %s after step-5 completed again; want checkpoint_written", n.State)
					}
					r.upload(checkpoint.CheckpointCommitted, "step-5")
				}
				if n := r.notice(t, "spot/terminate"); n.State != StateCommitted {
					t.Errorf("state %s after the commit; want committed", n.State)
				}
				passFakeTime(3 * time.Minute)
				if got := counterValue(t, r.c.metrics.checkpointMissing.WithLabelValues("spot", "withheld")); got != map[bool]float64{false: 1, true: 0}[later] {
					t.Errorf("checkpoint_missing_total{withheld} = %v at the end", got)
				}
			})
		})
	}
}

// A notice whose deadline passes with its checkpoint written but not committed (a store too slow
// or refusing) is said, once, as an error: the instance may be gone any moment. It used to pass
// in silence, the notice staying checkpoint_written. (Found from outside.)
func TestNoticeDeadlinePassingWithItsCheckpointUncommittedIsSaid(t *testing.T) {
	for _, commit := range []bool{false, true} {
		t.Run(fmt.Sprintf("committed before=%v", commit), func(t *testing.T) {
			synctest.Test(t, func(t *testing.T) {
				logs := &syncBuffer{}
				r := startRigLogging(t, true, nil, logs)
				r.begin(imds.SourceSpot, "terminate", time.Now().Add(2*time.Minute))
				passFakeTime(time.Second)
				r.upload(checkpoint.CheckpointComplete, "step-10")
				if commit {
					r.upload(checkpoint.CheckpointCommitted, "step-10")
				}
				passFakeTime(2*time.Minute + 5*time.Second)
				const msg = "the notice's deadline passed and its checkpoint is not committed yet"
				want := map[bool]int{false: 1, true: 0}[commit]
				if got := strings.Count(logs.String(), msg); got != want {
					t.Errorf("lines %q = %d; want %d\n%s", msg, got, want, logs)
				}
				if !commit && !strings.Contains(logs.String(), `"checkpoint":"step-10"`) {
					t.Errorf("the line does not name the checkpoint:\n%s", logs)
				}
			})
		})
	}
}

// A checkpoint the trainer completed after the notice's deadline, not committed yet when the loop
// looks, is the trainer's lateness: the line sent the operator to the store's errors, which had
// none (found from outside). It says so now.
func TestNoticeCheckpointCompletedAfterTheDeadlineIsTheTrainersLateness(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		logs := &syncBuffer{}
		r := startRigLogging(t, true, nil, logs)
		r.begin(imds.SourceSpot, "terminate", time.Now().Add(10*time.Second))
		passFakeTime(15 * time.Second) // a long step: the save begins after the deadline
		r.upload(checkpoint.CheckpointComplete, "step-10")
		passFakeTime(2 * time.Second)
		if l := logs.String(); strings.Contains(l, "see the store's errors") || !strings.Contains(l, "the trainer completed the notice's checkpoint after the notice's deadline") {
			t.Errorf("log: want the trainer's lateness said, not the store blamed:\n%s", l)
		}
	})
}

// An agent restarted during a notice after its trainer saved for it and exited (a container
// stopped once its save was committed): no trainer is found, and the notice is the previous
// run's signal's, committed with the checkpoint saved after it. Before, the restarted agent
// logged that no trainer was found, as an error, and the notice went to checkpoint_missing
// (found from outside, 3 of 3 restarts).
func TestRestartAfterTheTrainerSavedAndExitedIsNotMissing(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		signalled := time.Now().Add(-20 * time.Second)
		logs := &syncBuffer{}
		r := startRigLogging(t, true, map[string]signalRecord{"spot/terminate": {At: signalled, PIDs: []int{4242}}}, logs)
		r.tr.setPIDs() // the trainer has exited
		complete, committed := signalled.Add(4*time.Second), signalled.Add(9*time.Second)
		m := &checkpoint.Manifest{Checkpoint: "step-10", Commit: "20261205T000000Z-000000000001", CommittedAt: committed,
			Timings: checkpoint.Timings{CompleteAt: &complete}}
		r.c.onUpload(checkpoint.UploadEvent{Kind: checkpoint.CheckpointFound, Checkpoint: m.Checkpoint, At: time.Now(), Manifest: m})
		synctest.Wait()
		deadline := time.Now().Add(100 * time.Second)
		r.beginRead(imds.SourceSpot, "terminate", deadline, true)
		passFakeTime(3 * time.Minute)
		n := r.notice(t, "spot/terminate")
		if n.State != StateCommitted || counterValue(t, r.c.metrics.checkpointMissing.WithLabelValues("spot", "no_marker")) != 0 {
			t.Errorf("state %s (%+v); want committed with step-10, nothing missing", n.State, n.Transitions)
		}
		if l := logs.String(); strings.Contains(l, "no trainer process found") || strings.Contains(l, `"level":"error"`) {
			t.Errorf("the restarted agent logged an error:\n%s", l)
		}
	})
}
