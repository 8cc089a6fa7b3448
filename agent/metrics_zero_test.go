package agent

import (
	"testing"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/spotguard/spotguard/agent/imds"
	"github.com/spotguard/spotguard/agent/trainer"
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
