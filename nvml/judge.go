package nvml

import (
	"fmt"
	"time"
)

// Defaults of a Judge: a reading-of-a-moment rule is evidence when it fires in 3 of the last 5
// samples (the agent samples every gpu.sample_interval, 5 s: 15 s of 25; `spotguard gpu` takes 5
// samples a second apart).
const (
	DefaultEvidenceK = 3
	DefaultEvidenceN = 5
)

// Judge turns each sample's Verdicts into verdicts from evidence over time: an immediate rule
// (Immediate) degrades a GPU at once; any other degrades it only when it fired in K of the last
// N samples of that GPU, and its reason then says so and since when. One reading never decides:
// a GPU power-capped for one tick of a GEMM while its peers were in an NCCL phase, or a pipeline
// stage with other memory intensity for a moment, is not degraded. The zero value uses the
// defaults. Not safe for concurrent use.
type Judge struct {
	K, N int
	gpus map[string]*gpuHistory
}

// gpuHistory is what a Judge remembers of one GPU: the rules fired in its last N samples, oldest
// first, the latest text of each, and since when each has been evidence.
type gpuHistory struct {
	ticks [][]string
	text  map[string]string
	since map[string]time.Time
}

// Judge takes the verdicts of one sample taken at now (Verdicts' output, in any order) and
// returns the verdicts from evidence. GPUs are told apart by UUID, else by index.
func (j *Judge) Judge(now time.Time, vs []Verdict) []Verdict {
	k, n := j.K, j.N
	if n < 1 {
		n = DefaultEvidenceN
	}
	if k < 1 || k > n {
		k = min(DefaultEvidenceK, n)
	}
	if j.gpus == nil {
		j.gpus = map[string]*gpuHistory{}
	}
	out := make([]Verdict, len(vs))
	for i, v := range vs {
		key := v.UUID
		if key == "" {
			key = fmt.Sprintf("#%d", v.Index)
		}
		h := j.gpus[key]
		if h == nil {
			h = &gpuHistory{text: map[string]string{}, since: map[string]time.Time{}}
			j.gpus[key] = h
		}
		h.ticks = append(h.ticks, v.Rules)
		if len(h.ticks) > n {
			h.ticks = h.ticks[len(h.ticks)-n:]
		}
		for r, rule := range v.Rules {
			h.text[rule] = v.Reasons[r]
		}
		count := map[string]int{}
		var order []string
		for _, rules := range h.ticks {
			for _, rule := range rules {
				if count[rule] == 0 {
					order = append(order, rule)
				}
				count[rule]++
			}
		}
		jv := Verdict{Index: v.Index, UUID: v.UUID, Unjudged: v.Unjudged}
		for _, rule := range order {
			fired := false
			for _, r := range v.Rules {
				fired = fired || r == rule
			}
			switch {
			case Immediate(rule) && fired:
				jv.Reasons, jv.Rules = append(jv.Reasons, h.text[rule]), append(jv.Rules, rule)
			case !Immediate(rule) && count[rule] >= k:
				if _, ok := h.since[rule]; !ok {
					h.since[rule] = now
				}
				jv.Reasons = append(jv.Reasons, fmt.Sprintf("%s (in %d of the last %d samples, since %s)",
					h.text[rule], count[rule], len(h.ticks), h.since[rule].UTC().Format(time.RFC3339)))
				jv.Rules = append(jv.Rules, rule)
			}
		}
		for rule := range h.since {
			if count[rule] < k {
				delete(h.since, rule)
			}
		}
		jv.Degraded = len(jv.Reasons) > 0
		out[i] = jv
	}
	return out
}
