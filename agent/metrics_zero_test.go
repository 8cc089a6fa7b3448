package agent

import (
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/spotguard/spotguard/agent/imds"
	"github.com/spotguard/spotguard/agent/trainer"
	"github.com/spotguard/spotguard/checkpoint"
)

// Counters whose labels are a fixed set are exported at 0 from the start, so that a rate or an
// alert on one has a series before its first event: every trainer discovery problem, both job
// checkpoint writers, every signal outcome, both reload results and both commit triggers.
func TestFixedLabelCountersStartAtZero(t *testing.T) {
	reg := prometheus.NewRegistry()
	newMetrics(reg, func() imds.Stats { return imds.Stats{} })
	families, err := reg.Gather()
	if err != nil {
		t.Fatal(err)
	}
	got := map[string]map[string]bool{}
	for _, f := range families {
		for _, m := range f.GetMetric() {
			if m.GetCounter() == nil || m.GetCounter().GetValue() != 0 {
				continue
			}
			for _, l := range m.GetLabel() {
				if got[f.GetName()] == nil {
					got[f.GetName()] = map[string]bool{}
				}
				got[f.GetName()][l.GetValue()] = true
			}
		}
	}
	want := map[string][]string{
		"spotguard_trainer_discovery_problems_total": trainer.Reasons(),
		"spotguard_job_checkpoints_committed_total":  {"this", "other"},
		"spotguard_trainer_signals_total":            {"sent", "not_caught", "gone", "failed"},
		"spotguard_config_reloads_total":             {"ok", "invalid"},
		"spotguard_checkpoints_committed_total":      {"periodic", "notice"},
	}
	for name, values := range want {
		for _, v := range values {
			if !got[name][v] {
				t.Errorf("%s{…=%q} is not exported at 0 from the start", name, v)
			}
		}
	}
}

// A withheld checkpoint (its marker there, a file of it cannot be stored) is a complete checkpoint
// not committed: before, the gauges left it out, and the alarm on
// spotguard_checkpoint_not_committed_seconds never heard of it (found from outside).
func TestNotCommittedCountsWithheldCheckpoints(t *testing.T) {
	now := time.Now()
	since := now.Add(-10 * time.Minute)
	st := checkpoint.UploaderStatus{Checkpoints: []checkpoint.CheckpointStatus{
		{Name: "step-1", Complete: true, Committed: true},
		{Name: "step-2", Withheld: true, CompleteSince: &since},
		{Name: "step-3"}, // being written
	}}
	if n, oldest := notCommitted(st, now); n != 1 || oldest != 10*time.Minute {
		t.Errorf("notCommitted = %d, %v; want 1 (step-2, withheld), 10m0s", n, oldest)
	}
}
