package main

import (
	"cmp"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"math"
	"slices"
	"strconv"
	"strings"
	"sync"
	"text/tabwriter"
	"time"

	"github.com/spotguard/spotguard/nvml"
	"github.com/spotguard/spotguard/nvml/cuda"
)

// probeSampleInterval is how often `spotguard gpu --probe` samples NVML while the copies run.
const probeSampleInterval = 250 * time.Millisecond

// The ranges of --probe-bytes and --probe-duration. Below 64 MiB a copy takes a few
// microseconds on a datacenter GPU and the probe measures the launch of copies, not memory.
const (
	minProbeBytes    = 64 << 20
	maxProbeBytes    = 64 << 30
	minProbeDuration = 100 * time.Millisecond
	maxProbeDuration = time.Minute
)

// The rules of the probe's bandwidth verdict. A verdict also carries nvml's immediate rules
// (lost, ECC, row remapping, XIDs, peak bandwidth among peers) from a sample taken after the
// copies, and nvml.RuleSlowdown from the samples taken during them.
const (
	ruleProbePeers = "probe_bandwidth_peers"
	ruleProbePeak  = "probe_bandwidth_peak"
)

// probeReport is `spotguard gpu --probe --json`; docs/gpu.md documents every field.
type probeReport struct {
	Mode string `json:"mode"` // "probe"
	// Off says why nothing was probed (no NVML, no CUDA driver, hung); GPUs is empty then.
	Off string `json:"off,omitempty"`
	// Hung says which call into NVML or the CUDA driver did not return in time (a hung GPU or
	// driver); the report is not healthy then.
	Hung    string `json:"hung,omitempty"`
	Healthy bool   `json:"healthy"`
	// Threshold is gpu.degraded_threshold, as applied.
	Threshold float64 `json:"threshold"`
	// CUDADriver is the CUDA version of the driver ("12.4").
	CUDADriver string `json:"cuda_driver,omitempty"`
	// Bytes and DurationS are what was asked of each GPU; ElapsedS is the whole probe.
	Bytes     int64      `json:"bytes"`
	DurationS float64    `json:"duration_s"`
	ElapsedS  float64    `json:"elapsed_s"`
	GPUs      []probeGPU `json:"gpus"`
}

// probeGPU is one GPU of the report: every NVML GPU, in NVML's order, then every CUDA device
// NVML does not show.
type probeGPU struct {
	Index             *int     `json:"index"`      // NVML's; null for a CUDA device NVML does not show
	CUDAIndex         *int     `json:"cuda_index"` // CUDA's ordinal; null when CUDA does not show the GPU
	UUID              string   `json:"uuid"`
	Name              string   `json:"name"`
	ComputeCapability string   `json:"compute_capability,omitempty"`
	Architecture      string   `json:"architecture,omitempty"`
	Probed            bool     `json:"probed"` // copies were timed in full
	Error             string   `json:"error,omitempty"`
	Bytes             int64    `json:"bytes"`
	Copies            int      `json:"copies"`
	Seconds           float64  `json:"seconds"`
	GBps              *float64 `json:"gbps"`
	PeakGBps          *float64 `json:"peak_gbps"`
	OfPeak            *float64 `json:"of_peak"`
	CopyEfficiency    *float64 `json:"copy_efficiency"`
	Peers             int      `json:"peers"`
	PeerMedianGBps    *float64 `json:"peer_median_gbps"`
	ExpectedGBps      *float64 `json:"expected_gbps"`
	Samples           int      `json:"samples"`
	SMClockMHz        *clocks  `json:"sm_clock_mhz"`
	MemClockMHz       *clocks  `json:"mem_clock_mhz"`
	ClockEventReasons []string `json:"clock_event_reasons"`
	XIDCritical       uint64   `json:"xid_critical"`
	LastXID           uint64   `json:"last_xid"`
	XIDRecoverable    uint64   `json:"xid_recoverable"`
	LastRecoverable   uint64   `json:"last_recoverable_xid"`
	Degraded          bool     `json:"degraded"`
	Reasons           []string `json:"reasons"`
	Rules             []string `json:"rules"`
	Unjudged          []string `json:"unjudged"`
}

// clocks are the clock readings of the samples taken while a GPU's copies ran, and its
// maximum (0 when NVML does not say).
type clocks struct {
	Min    uint32 `json:"min"`
	Median uint32 `json:"median"`
	Max    uint32 `json:"max"`
}

// probeArgs are the flags of --probe.
type probeArgs struct {
	bytes     int64
	duration  time.Duration
	json      bool
	threshold float64
}

// runProbe is `spotguard gpu --probe` once NVML is open: it opens the CUDA driver, copies on
// every GPU at once while sampling NVML and listening for XIDs, and judges each GPU. It returns
// the exit code, or false when a call into NVML or the driver did not return in time (watch
// says which; nothing has been written to stdout).
func runProbe(ctx context.Context, stdout, stderr io.Writer, gpus gpuSource, deps gpuDeps, a probeArgs, watch *gpuWatch) (int, bool) {
	var drv *cuda.Driver
	var err error
	if !watch.do("the CUDA driver (cuInit)", 0, func() { drv, err = cuda.Open(deps.cudaLibrary) }) {
		return 0, false
	}
	if err != nil {
		reason := strings.TrimPrefix(err.Error(), cuda.ErrUnavailable.Error()+": ")
		if a.json {
			writeJSON(stdout, offProbe("no CUDA driver: "+reason, a))
		}
		fmt.Fprintf(stderr, "spotguard gpu: no CUDA driver: %s\n", reason)
		if !errors.Is(err, cuda.ErrUnavailable) {
			return exitFail, true
		}
		return exitNoNVML, true
	}
	facts := gpus.Facts()
	n := len(drv.Devices())
	fmt.Fprintf(stderr, "probing %d GPU%s: %s device-to-device copies for %s each, all at once (CUDA %s)\n",
		n, plural(n), iecBytes(a.bytes), seconds(a.duration), cuda.FormatVersion(drv.Version()))

	every := cmp.Or(deps.probeSampleEvery, probeSampleInterval)
	runCtx, stop := context.WithCancel(ctx)
	defer stop()
	var wg sync.WaitGroup
	var eventsErr error
	wg.Go(func() { eventsErr = gpus.RunEvents(runCtx) })
	var ticks [][]nvml.Sample // read once wg.Wait returns
	wg.Go(func() {
		t := time.NewTicker(every)
		defer t.Stop()
		for {
			// A sample that comes back after the copies ended is kept: judgeProbe counts it
			// only if it was taken while they ran.
			ticks = append(ticks, gpus.Sample(runCtx))
			if runCtx.Err() != nil {
				return
			}
			select {
			case <-runCtx.Done():
				return
			case <-t.C:
			}
		}
	})
	var res cuda.Results
	var perr error
	if !watch.do("the CUDA driver (the probe's copies)", 2*a.duration, func() {
		res, perr = drv.Probe(ctx, cuda.Options{Bytes: a.bytes, Duration: a.duration})
	}) {
		return 0, false
	}
	var final []nvml.Sample
	if perr == nil { // the XIDs heard during the copies, ECC, row remapping
		if !watch.do("NVML (a sample of every GPU)", 0, func() { final = gpus.Sample(ctx) }) {
			return 0, false
		}
	}
	stop()
	sampled := make(chan struct{})
	go func() {
		defer close(sampled)
		wg.Wait()
	}()
	if !watch.await("NVML (sampling and the XID listener)", 0, sampled) {
		return 0, false
	}
	if eventsErr != nil {
		fmt.Fprintf(stderr, "spotguard gpu: XIDs were not listened for: %v\n", eventsErr)
	}
	if perr != nil {
		fmt.Fprintf(stderr, "spotguard gpu: %v\n", perr)
		return exitFail, true
	}
	fmt.Fprintf(stderr, "probed %d GPU%s in %.1f s: %s\n", n, plural(n), res.Elapsed.Seconds(), probeTimings(res))

	rep := judgeProbe(facts, res, ticks, final, a.threshold)
	if a.json {
		writeJSON(stdout, rep)
	} else if err := printProbeTable(stdout, rep); err != nil {
		fmt.Fprintf(stderr, "spotguard gpu: write the report: %v\n", err)
	}
	return probeExit(rep), true
}

// offProbe is the report of a probe that could not run, and why.
func offProbe(why string, a probeArgs) probeReport {
	threshold := a.threshold
	if !(threshold > 0 && threshold < 1) {
		threshold = nvml.DefaultThreshold
	}
	return probeReport{Mode: "probe", Off: why, Threshold: threshold, Bytes: a.bytes, DurationS: a.duration.Seconds(), GPUs: []probeGPU{}}
}

// probeTimings says how long the slowest device took to set up, and how long the copies ran.
func probeTimings(res cuda.Results) string {
	var setup time.Duration
	var start, end time.Time
	for _, d := range res.Devices {
		setup = max(setup, d.Setup)
		if d.Start.IsZero() {
			continue
		}
		if start.IsZero() || d.Start.Before(start) {
			start = d.Start
		}
		if d.End.After(end) {
			end = d.End
		}
	}
	if start.IsZero() {
		return fmt.Sprintf("set up in %.1f s, no copies timed", setup.Seconds())
	}
	s := fmt.Sprintf("set up in %.1f s (slowest GPU), then copies for %.1f s", setup.Seconds(), end.Sub(start).Seconds())
	smallest := res.Bytes
	for _, d := range res.Devices {
		if d.Bytes > 0 {
			smallest = min(smallest, d.Bytes)
		}
	}
	if smallest < res.Bytes {
		s += fmt.Sprintf("; buffers as small as %s (a quarter of a GPU's free memory)", iecBytes(smallest))
	}
	return s
}

// probeExit is the exit code of a probe: 3 when a GPU is degraded, else 1 when one could
// not be probed or matched, else 0.
func probeExit(rep probeReport) int {
	if !rep.Healthy {
		return exitGPUDegraded
	}
	for _, g := range rep.GPUs {
		if g.Error != "" {
			return exitFail
		}
	}
	return exitOK
}

// probeRow is a GPU being judged.
type probeRow struct {
	rec   probeGPU
	facts *nvml.Facts        // nil for a CUDA device NVML does not show
	dev   *cuda.DeviceResult // nil when CUDA does not show the GPU
	cudas int                // CUDA devices with this GPU's UUID
	mig   bool               // bandwidth not judged: MIG
	gbps  float64            // achieved, when rec.Probed
	seen  []nvml.Sample      // samples taken while its copies ran
}

// judgeProbe matches the CUDA devices of res to the NVML GPUs of facts by UUID and judges
// each GPU. ticks are NVML samples taken during the probe (one slice per tick, all GPUs),
// final one taken after it. threshold is gpu.degraded_threshold (≤ 0, ≥ 1 or NaN: nvml's
// default). A GPU is degraded when
//
//   - its achieved bandwidth is more than threshold below the median of the other probed GPUs
//     of its model (same NVML name), when it has any; or, alone of its model, more than
//     threshold below its peak × its architecture's copy efficiency (cuda.ArchOf);
//   - a slowdown reason (nvml.IsSlowdownReason) held its SM clock below its maximum (or either
//     is unknown) in a sample taken while its copies ran;
//   - nvml.Verdicts of the final sample gives an immediate rule: lost, ECC errors, row
//     remapping, a fatal or recoverable XID heard during the probe, a lower peak than its peers.
//
// A GPU under MIG, or one CUDA does not show (CUDA_VISIBLE_DEVICES), is not judged on
// bandwidth, and says so.
func judgeProbe(facts []nvml.Facts, res cuda.Results, ticks [][]nvml.Sample, final []nvml.Sample, threshold float64) probeReport {
	if !(threshold > 0 && threshold < 1) {
		threshold = nvml.DefaultThreshold
	}
	rep := probeReport{
		Mode: "probe", Healthy: true, Threshold: threshold, CUDADriver: cuda.FormatVersion(res.DriverVersion),
		Bytes: res.Bytes, DurationS: res.Duration.Seconds(), ElapsedS: res.Elapsed.Seconds(), GPUs: []probeGPU{},
	}
	byUUID := map[string][]int{}
	for i, d := range res.Devices {
		byUUID[d.Device.UUID] = append(byUUID[d.Device.UUID], i)
	}
	matched := make([]bool, len(res.Devices))
	var rows []*probeRow
	for i := range facts {
		f := &facts[i]
		r := &probeRow{facts: f}
		r.rec.Index, r.rec.UUID, r.rec.Name = &f.Index, f.UUID, f.Name
		if idx := byUUID[f.UUID]; f.UUID != "" && len(idx) > 0 {
			r.dev, r.cudas = &res.Devices[idx[0]], len(idx)
			for _, j := range idx {
				matched[j] = true
			}
		}
		rows = append(rows, r)
	}
	for i := range res.Devices {
		if !matched[i] {
			d := &res.Devices[i]
			r := &probeRow{dev: d}
			r.rec.UUID, r.rec.Name = d.Device.UUID, d.Device.Name
			rows = append(rows, r)
		}
	}
	verdicts := nvml.Verdicts(facts, final, threshold)
	for _, r := range rows {
		r.measure()
		r.window(ticks)
		r.nvmlFacts(final, verdicts)
	}
	judgeBandwidth(rows, threshold)
	for _, r := range rows {
		r.rec.Degraded = len(r.rec.Reasons) > 0
		if r.rec.Degraded {
			rep.Healthy = false
		}
		rep.GPUs = append(rep.GPUs, r.rec)
	}
	return rep
}

// measure fills in what the probe measured.
func (r *probeRow) measure() {
	rec := &r.rec
	rec.ClockEventReasons, rec.Reasons, rec.Rules, rec.Unjudged = []string{}, []string{}, []string{}, []string{}
	if r.facts != nil && r.facts.PeakMemBandwidth > 0 {
		rec.PeakGBps = ptr(r.facts.PeakMemBandwidth / 1e9)
	}
	d := r.dev
	if d == nil {
		rec.Unjudged = append(rec.Unjudged, "not probed: CUDA does not show this GPU (hidden by CUDA_VISIBLE_DEVICES?)")
		return
	}
	rec.CUDAIndex = &d.Device.Ordinal
	if d.Device.Err == nil {
		rec.ComputeCapability = fmt.Sprintf("%d.%d", d.Device.Major, d.Device.Minor)
		if arch, ok := cuda.ArchOf(d.Device.Major, d.Device.Minor); ok {
			rec.Architecture, rec.CopyEfficiency = arch.Name, ptr(arch.CopyEfficiency)
		}
	}
	rec.Bytes, rec.Copies, rec.Seconds = d.Bytes, d.Copies, d.Seconds
	switch {
	case r.facts == nil:
		rec.Error = fmt.Sprintf("CUDA device %d (%s) is none of NVML's GPUs: not judged", d.Device.Ordinal, d.Device.UUID)
	case d.Err != nil:
		rec.Error = "probe failed: " + d.Err.Error()
	case d.BytesPerSecond <= 0:
		rec.Error = "probe failed: no copy was timed"
	default:
		rec.Probed = true
		r.gbps = d.BytesPerSecond / 1e9
		rec.GBps = ptr(r.gbps)
		if rec.PeakGBps != nil {
			rec.OfPeak = ptr(r.gbps / *rec.PeakGBps)
		}
	}
	switch {
	case r.facts != nil && r.facts.MIG:
		r.mig = true
		rec.Unjudged = append(rec.Unjudged, "bandwidth: MIG mode is on, and a copy within one MIG instance is not the GPU's bandwidth")
	case r.cudas > 1:
		r.mig = true
		rec.Unjudged = append(rec.Unjudged, fmt.Sprintf("bandwidth: %d CUDA devices have this GPU's UUID (MIG instances?): the first was probed", r.cudas))
	}
}

// window keeps the samples of this GPU taken while its copies ran, and judges the slowdown
// reasons seen in them.
func (r *probeRow) window(ticks [][]nvml.Sample) {
	if r.facts == nil || r.dev == nil || r.dev.Start.IsZero() {
		return
	}
	for _, tick := range ticks {
		for _, s := range tick {
			if r.is(s) && !s.At.Before(r.dev.Start) && !s.At.After(r.dev.End) {
				r.seen = append(r.seen, s)
			}
		}
	}
	rec := &r.rec
	rec.Samples = len(r.seen)
	rec.SMClockMHz = clockStats(r.seen, func(s nvml.Sample) *uint32 { return s.SMClockMHz }, r.facts.MaxSMClockMHz)
	rec.MemClockMHz = clockStats(r.seen, func(s nvml.Sample) *uint32 { return s.MemClockMHz }, r.facts.MaxMemClockMHz)
	slowed := map[string]int{}
	var slowNames []string
	n := 0
	for _, s := range r.seen {
		held := false
		for _, reason := range s.ClockEventReasons {
			if !slices.Contains(rec.ClockEventReasons, reason) {
				rec.ClockEventReasons = append(rec.ClockEventReasons, reason)
			}
			if !nvml.IsSlowdownReason(reason) || s.SMClockMHz != nil && r.facts.MaxSMClockMHz > 0 && *s.SMClockMHz >= r.facts.MaxSMClockMHz {
				continue
			}
			if slowed[reason] == 0 {
				slowNames = append(slowNames, reason)
			}
			slowed[reason]++
			held = true
		}
		if held {
			n++
		}
	}
	if n > 0 {
		text := fmt.Sprintf("%s held the SM clock below its max in %d of %d samples while the copies ran", strings.Join(slowNames, ", "), n, len(r.seen))
		if c := rec.SMClockMHz; c != nil && c.Max > 0 {
			text += fmt.Sprintf(" (SM clock min %d, max %d MHz)", c.Min, c.Max)
		}
		r.add(nvml.RuleSlowdown, text)
	}
}

// is reports whether s is this GPU's sample.
func (r *probeRow) is(s nvml.Sample) bool {
	if r.facts.UUID != "" {
		return s.UUID == r.facts.UUID
	}
	return s.Index == r.facts.Index
}

// nvmlFacts takes the XIDs and nvml's immediate rules from the sample after the copies.
func (r *probeRow) nvmlFacts(final []nvml.Sample, verdicts []nvml.Verdict) {
	if r.facts == nil {
		return
	}
	for i := range final {
		if !r.is(final[i]) {
			continue
		}
		s := &final[i]
		r.rec.XIDCritical, r.rec.LastXID = s.XIDCritical, s.LastXID
		r.rec.XIDRecoverable, r.rec.LastRecoverable = s.XIDRecoverable, s.LastRecoverableXID
		if i < len(verdicts) {
			v := verdicts[i]
			for k, rule := range v.Rules {
				if nvml.Immediate(rule) {
					r.add(rule, v.Reasons[k])
				}
			}
		}
		return
	}
}

// add records a rule that fired.
func (r *probeRow) add(rule, text string) {
	r.rec.Rules = append(r.rec.Rules, rule)
	r.rec.Reasons = append(r.rec.Reasons, text)
}

// judgeBandwidth judges each probed GPU's bandwidth against the other probed GPUs of its
// model, or, alone of its model, against its peak × its architecture's copy efficiency.
func judgeBandwidth(rows []*probeRow, threshold float64) {
	for _, r := range rows {
		if !r.rec.Probed || r.mig {
			continue
		}
		var others []float64
		for _, o := range rows {
			if o != r && o.rec.Probed && !o.mig && o.facts.Name == r.facts.Name {
				others = append(others, o.gbps)
			}
		}
		rec := &r.rec
		if len(others) > 0 {
			med := median(others)
			rec.Peers, rec.PeerMedianGBps = len(others), ptr(med)
			if r.gbps < med*(1-threshold) {
				r.add(ruleProbePeers, fmt.Sprintf("achieved %.0f GB/s is %.0f %% below the median of the %d other %s (%.0f GB/s): replace the instance",
					r.gbps, 100*(1-r.gbps/med), len(others), r.facts.Name, med))
			}
			continue
		}
		if rec.PeakGBps == nil || rec.CopyEfficiency == nil {
			why := "NVML does not give its peak bandwidth"
			if rec.PeakGBps != nil {
				why = fmt.Sprintf("no copy efficiency is known for compute capability %s", rec.ComputeCapability)
			}
			rec.Unjudged = append(rec.Unjudged, "bandwidth: no other GPU of its model was probed, and "+why)
			continue
		}
		want := *rec.PeakGBps * *rec.CopyEfficiency
		rec.ExpectedGBps = ptr(want)
		if r.gbps < want*(1-threshold) {
			r.add(ruleProbePeak, fmt.Sprintf("achieved %.0f GB/s is %.0f %% below %.0f GB/s, its peak %.0f GB/s × %.2f (%s's assumed copy efficiency), with no other %s to compare with",
				r.gbps, 100*(1-r.gbps/want), want, *rec.PeakGBps, *rec.CopyEfficiency, rec.Architecture, r.facts.Name))
		}
	}
}

// clockStats returns the min and median of the clock get reads from samples, and max; nil
// when no sample has it.
func clockStats(samples []nvml.Sample, get func(nvml.Sample) *uint32, maxMHz uint32) *clocks {
	var vals []float64
	for _, s := range samples {
		if p := get(s); p != nil {
			vals = append(vals, float64(*p))
		}
	}
	if len(vals) == 0 {
		return nil
	}
	return &clocks{Min: uint32(slices.Min(vals)), Median: uint32(median(vals)), Max: maxMHz}
}

// median returns the median of vals (len ≥ 1), without changing vals.
func median(vals []float64) float64 {
	v := slices.Sorted(slices.Values(vals))
	n := len(v)
	if n%2 == 1 {
		return v[n/2]
	}
	return (v[n/2-1] + v[n/2]) / 2
}

func ptr[T any](v T) *T { return &v }

// writeJSON writes v as indented JSON.
func writeJSON(w io.Writer, v any) {
	enc := json.NewEncoder(w)
	enc.SetIndent("", "  ")
	enc.Encode(v)
}

// printProbeTable writes the probe's report as a table, then its verdict.
func printProbeTable(w io.Writer, rep probeReport) error {
	tw := tabwriter.NewWriter(w, 0, 0, 2, ' ', 0)
	fmt.Fprintln(tw, "GPU\tCUDA\tMODEL\tGB/s\tPEAK GB/s\tOF PEAK\tCOMPARED WITH\tSM MHz min/med\tMEM MHz min/med\tREASONS\tXIDS\tVERDICT")
	for _, g := range rep.GPUs {
		verdict := "healthy"
		switch {
		case g.Degraded:
			verdict = "DEGRADED: " + strings.Join(g.Reasons, "; ")
		case g.Error != "":
			verdict = g.Error
		case len(g.Unjudged) > 0:
			verdict = "healthy; " + strings.Join(g.Unjudged, "; ")
		}
		fmt.Fprintf(tw, "%s\t%s\t%s\t%s\t%s\t%s\t%s\t%s\t%s\t%s\t%s\t%s\n",
			optInt(g.Index), optInt(g.CUDAIndex), g.Name, optNum(g.GBps, "%.0f"), optNum(g.PeakGBps, "%.0f"),
			optNum(ptrScale(g.OfPeak, 100), "%.0f %%"), comparedWith(g), clockPair(g.SMClockMHz), clockPair(g.MemClockMHz),
			orDash(strings.Join(g.ClockEventReasons, ",")), xids(g), verdict)
	}
	if err := tw.Flush(); err != nil {
		return err
	}
	switch code := probeExit(rep); code {
	case exitGPUDegraded:
		var bad []string
		for _, g := range rep.GPUs {
			if g.Degraded {
				bad = append(bad, fmt.Sprintf("GPU %s (%s)", optInt(g.Index), g.UUID))
			}
		}
		fmt.Fprintf(w, "\nDEGRADED: %s; replace this instance (exit 3)\n", strings.Join(bad, ", "))
	case exitFail:
		fmt.Fprintln(w, "\nnot every GPU could be probed, and none was found degraded (exit 1)")
	default:
		fmt.Fprintln(w, "\nhealthy (exit 0)")
	}
	return nil
}

func comparedWith(g probeGPU) string {
	switch {
	case g.PeerMedianGBps != nil:
		return fmt.Sprintf("%.0f: median of %d", *g.PeerMedianGBps, g.Peers)
	case g.ExpectedGBps != nil:
		return fmt.Sprintf("%.0f: peak × %.2f", *g.ExpectedGBps, *g.CopyEfficiency)
	}
	return "-"
}

func xids(g probeGPU) string {
	var parts []string
	if g.XIDCritical > 0 {
		parts = append(parts, fmt.Sprintf("%d fatal (last %d)", g.XIDCritical, g.LastXID))
	}
	if g.XIDRecoverable > 0 {
		parts = append(parts, fmt.Sprintf("%d recoverable (last %d)", g.XIDRecoverable, g.LastRecoverable))
	}
	return orDash(strings.Join(parts, ", "))
}

func clockPair(c *clocks) string {
	if c == nil {
		return "-"
	}
	return fmt.Sprintf("%d/%d", c.Min, c.Median)
}

func optInt(p *int) string {
	if p == nil {
		return "-"
	}
	return strconv.Itoa(*p)
}

func optNum(p *float64, format string) string {
	if p == nil {
		return "-"
	}
	return fmt.Sprintf(format, *p)
}

func ptrScale(p *float64, k float64) *float64 {
	if p == nil {
		return nil
	}
	return ptr(*p * k)
}

// iecBytes writes a size in GiB or MiB: "1 GiB", "1.5 GiB", "256 MiB".
func iecBytes(n int64) string {
	for _, u := range []struct {
		unit  string
		bytes int64
	}{{"GiB", 1 << 30}, {"MiB", 1 << 20}, {"KiB", 1 << 10}} {
		if n >= u.bytes {
			return strconv.FormatFloat(math.Round(100*float64(n)/float64(u.bytes))/100, 'f', -1, 64) + " " + u.unit
		}
	}
	return strconv.FormatInt(n, 10) + " bytes"
}

// seconds writes a duration in seconds: "1.5 s".
func seconds(d time.Duration) string {
	return strconv.FormatFloat(d.Seconds(), 'f', -1, 64) + " s"
}

func plural(n int) string {
	if n == 1 {
		return ""
	}
	return "s"
}
