package nvml

import (
	"strings"
	"testing"
	"time"
)

// One reading never decides: a reading-of-a-moment rule degrades a GPU only once it fired in K of
// the last N samples (its reason saying so and since when), and lets go when it no longer does;
// an immediate rule degrades at once.
func TestJudgeEvidenceOverTime(t *testing.T) {
	var j Judge // defaults: 3 of 5
	t0 := time.Date(2026, 12, 1, 0, 0, 0, 0, time.UTC)
	slow := Verdict{Index: 0, UUID: "GPU-a", Degraded: true, Reasons: []string{"SM clock 1740 MHz is 12 % below the median"}, Rules: []string{RulePeerSMClock}}
	fine := Verdict{Index: 0, UUID: "GPU-a"}
	steps := []struct {
		in   Verdict
		want bool
	}{
		{slow, false}, // one reading: a power cap during a GEMM while the peers were in NCCL
		{fine, false},
		{slow, false}, // 2 of 3
		{slow, true},  // 3 of 4
		{fine, true},  // 3 of 5
		{fine, false}, // 2 of the last 5
	}
	for i, st := range steps {
		got := j.Judge(t0.Add(time.Duration(i)*5*time.Second), []Verdict{st.in})[0]
		if got.Degraded != st.want {
			t.Fatalf("sample %d: Degraded = %v (%v); want %v", i, got.Degraded, got.Reasons, st.want)
		}
		if i == 3 && (len(got.Reasons) != 1 || !strings.Contains(got.Reasons[0], "(in 3 of the last 4 samples, since 2026-12-01T00:00:15Z)")) {
			t.Errorf("sample 3: reasons %q; want the evidence and since when", got.Reasons)
		}
	}

	// An immediate rule: at once, and on another GPU than the one above.
	ecc := Verdict{Index: 1, UUID: "GPU-b", Degraded: true, Reasons: []string{"2 uncorrected ECC errors"}, Rules: []string{RuleECCUncorrected}}
	if got := j.Judge(t0, []Verdict{ecc})[0]; !got.Degraded || got.Reasons[0] != "2 uncorrected ECC errors" {
		t.Errorf("immediate rule: %+v; want degraded at once", got)
	}
	if got := (&Judge{K: 1, N: 1}).Judge(t0, []Verdict{slow})[0]; !got.Degraded {
		t.Errorf("K=1, N=1 (one reading decides, when asked for): %+v", got)
	}
}

// A GPU that has just gone idle reads 100 % util (the last period) at its idle clock and
// gpu_idle: it is not under load, so it is not compared with busy peers.
func TestJustIdleIsNotUnderLoad(t *testing.T) {
	facts := []Facts{}
	var samples []Sample
	for i := range 8 {
		facts = append(facts, Facts{Index: i, UUID: string(rune('a' + i)), Name: "NVIDIA A100-SXM4-80GB", MaxSMClockMHz: 1410})
		clock, reasons := uint32(1410), []string(nil)
		if i == 7 {
			clock, reasons = 345, []string{"gpu_idle"}
		}
		util := 100.0
		samples = append(samples, Sample{Index: i, UUID: string(rune('a' + i)), SMClockMHz: &clock, GPUUtilPercent: &util, ClockEventReasons: reasons})
	}
	for _, v := range Verdicts(facts, samples, 0.1) {
		if v.Degraded {
			t.Errorf("GPU %d degraded: %v", v.Index, v.Reasons)
		}
	}
	// Without gpu_idle the same reading is an outlier: the rule is there, it is the idle that
	// keeps it out.
	samples[7].ClockEventReasons = nil
	if v := Verdicts(facts, samples, 0.1)[7]; !v.Degraded || v.Rules[0] != RulePeerSMClock {
		t.Errorf("busy at 345 MHz: %+v; want the peer SM clock rule", v)
	}
}
