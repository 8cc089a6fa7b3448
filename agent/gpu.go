package agent

import (
	"context"
	"slices"
	"strconv"
	"sync"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/rs/zerolog"

	"github.com/spotguard/spotguard/agent/metrics"
	"github.com/spotguard/spotguard/nvml"
)

// gpuSampler is what the monitor needs from the GPUs: nvml.GPUs, or a test's own.
type gpuSampler interface {
	Facts() []nvml.Facts
	Sample(ctx context.Context) []nvml.Sample
	RunEvents(ctx context.Context) error
}

// gpuMonitor samples the GPUs every gpu.sample_interval, judges them, keeps the latest readings
// for /status and /metrics, and records the GPU series into the sink.
type gpuMonitor struct {
	// gpus is nil while sampling is off (off says why) or NVML is being opened (opened is not
	// closed yet); set before Run, or by the open under mu.
	gpus      gpuSampler
	off       string
	opened    chan struct{} // closed when the open has returned; nil when there was none
	closeGPUs func()        // closes what the open returned; nil if nothing to close
	interval  time.Duration
	threshold float64
	sink      metrics.Sink // may be nil
	perGPU    bool         // metrics.cloudwatch_per_gpu: the per-GPU series too
	log       zerolog.Logger
	judge     nvml.Judge // owned by Tick's caller: one Tick at a time
	// sent are the constants sent to the sink, for gpuDatums; owned by Tick's caller. A
	// restarted agent starts empty and sends them once more.
	sent map[constKey]float64

	mu       sync.Mutex
	samples  []nvml.Sample
	verdicts []nvml.Verdict
	// busySince is when the sampling step in progress began (zero between steps); stalled is
	// set once it has taken gpuStallAfter, until it returns; abandoned once Run has returned
	// without it. NVML calls cannot be cancelled, and a hung driver or GPU blocks them for
	// minutes or for good.
	busySince time.Time
	stalled   bool
	abandoned bool
}

// NVML calls cannot be cancelled. A sampling step (a few milliseconds; GPM's first reading waits
// up to a second) that takes gpuStallAfter, or three sample intervals if that is longer, means a
// hung driver or GPU: the monitor says so (log, /status, /healthz warnings, spotguard_gpu_sampling_up
// 0, no readings in /metrics) and waits on. A stop waits gpuStopGrace for a step or the XID
// listener to return, then goes on without them (and without closing NVML, which would block
// too), so a hung GPU never holds the agent's exit.
const (
	gpuStallAfter = 30 * time.Second
	gpuStopGrace  = 2 * time.Second
)

// GPUStatus is one GPU in /status.
type GPUStatus struct {
	Facts   nvml.Facts   `json:"facts"`
	Sample  *nvml.Sample `json:"sample,omitempty"`
	Verdict nvml.Verdict `json:"verdict"`
}

// gpuStatus is the monitor's part of /status.
type gpuStatus struct {
	Sampling bool   `json:"sampling"`
	Off      string `json:"off,omitempty"`
	// NotAnsweringSince is when the sampling step that has not returned began, once it has taken
	// the stall time (see gpuStallAfter); the readings in GPUs are from before then.
	NotAnsweringSince *time.Time  `json:"not_answering_since,omitempty"`
	GPUs              []GPUStatus `json:"gpus,omitempty"`
}

// stallAfter is how long a sampling step may take before NVML counts as not answering.
func (m *gpuMonitor) stallAfter() time.Duration { return max(gpuStallAfter, 3*m.interval) }

// gpuOpenWait is how long New waits for NVML to open, so that a GPU machine's first /status is
// complete; NVML that takes longer (no persistence mode on many GPUs, or a hung GPU or driver)
// goes on opening while the agent runs, and sampling starts once it has.
const gpuOpenWait = time.Second

// open opens the GPUs with open beside the caller, and waits for it at most wait. Run starts
// sampling once it has returned; while it has not, the monitor is not answering from the start
// (see gpuStallAfter).
func (m *gpuMonitor) open(open func() (GPUs, error), wait time.Duration) {
	start := time.Now()
	m.opened = make(chan struct{})
	m.busySince, m.off = start, "NVML is being opened"
	go func() {
		defer close(m.opened)
		g, err := open()
		m.mu.Lock()
		defer m.mu.Unlock()
		if err != nil {
			m.off = err.Error()
		} else {
			m.gpus, m.closeGPUs, m.off = g, g.Close, ""
		}
		m.answered(start)
	}()
	t := time.NewTimer(wait)
	defer t.Stop()
	select {
	case <-m.opened:
	case <-t.C:
	}
}

// sampler returns the GPUs, or nil while sampling is off or NVML is being opened.
func (m *gpuMonitor) sampler() gpuSampler {
	m.mu.Lock()
	defer m.mu.Unlock()
	return m.gpus
}

// Run samples until ctx is done; with sampling off it returns at once. It returns nil. NVML
// still opening is waited for, and a step NVML does not return from is reported after
// stallAfter; neither holds Run past ctx's end by more than gpuStopGrace (see gpuStallAfter).
// NVML is closed at the end, unless a call into it has not returned.
func (m *gpuMonitor) Run(ctx context.Context) error {
	defer func() {
		m.mu.Lock()
		closeGPUs, hung := m.closeGPUs, m.abandoned
		m.mu.Unlock()
		if closeGPUs != nil && !hung { // closing would wait for the call that does not return
			closeGPUs()
		}
	}()
	if m.opened != nil {
		if opening := m.wait(ctx, m.opened); opening != nil {
			m.stop(opening, nil)
			return nil
		}
	}
	gpus := m.sampler()
	if gpus == nil {
		m.log.Warn().Str("reason", m.off).Msg("GPU sampling is off; everything else runs")
		return nil
	}
	m.log.Info().Int("gpus", len(gpus.Facts())).Float64("interval_s", logSeconds(m.interval)).Msg("GPU sampling on")
	events := make(chan struct{})
	go func() {
		defer close(events)
		if err := gpus.RunEvents(ctx); err != nil {
			m.log.Warn().Err(err).Msg("GPU XID events unavailable")
		}
	}()
	t := time.NewTicker(m.interval)
	defer t.Stop()
	for {
		if stepping := m.step(ctx); stepping != nil {
			m.stop(stepping, events)
			return nil
		}
		select {
		case <-ctx.Done():
			m.stop(nil, events)
			return nil
		case <-t.C:
		}
	}
}

// stop waits after ctx is done for the step still running (nil: none) and the XID listener,
// which return at once, and within a step of its wait, unless NVML hangs: then it waits
// gpuStopGrace in all and marks the monitor abandoned (NVML must not be closed).
func (m *gpuMonitor) stop(stepping, events <-chan struct{}) {
	grace := time.NewTimer(gpuStopGrace)
	defer grace.Stop()
	for _, ch := range []<-chan struct{}{stepping, events} {
		if ch == nil {
			continue
		}
		select {
		case <-ch:
		case <-grace.C:
			m.mu.Lock()
			m.abandoned = true
			m.mu.Unlock()
			m.log.Warn().Float64("waited_s", logSeconds(gpuStopGrace)).Msg("NVML does not answer: GPU sampling stops without it")
			return
		}
	}
}

// step runs one Tick and waits for it (see wait). It returns nil when the Tick has returned, or
// a channel closed when it does if ctx ended first.
func (m *gpuMonitor) step(ctx context.Context) <-chan struct{} {
	start := time.Now()
	m.mu.Lock()
	m.busySince = start
	m.mu.Unlock()
	done := make(chan struct{})
	go func() {
		defer close(done)
		m.Tick(ctx)
		m.mu.Lock()
		defer m.mu.Unlock()
		m.answered(start)
	}()
	return m.wait(ctx, done)
}

// wait waits for done, closed when the call into NVML that began at busySince has returned
// (and cleared busySince), and says when it has taken stallAfter. It returns nil once done is
// closed, or done if ctx ended first.
func (m *gpuMonitor) wait(ctx context.Context, done chan struct{}) <-chan struct{} {
	m.mu.Lock()
	since := m.busySince
	m.mu.Unlock()
	stall := time.NewTimer(m.stallAfter() - time.Since(since))
	defer stall.Stop()
	for {
		select {
		case <-done:
			return nil
		case <-stall.C:
			m.mu.Lock()
			m.stalled = !m.busySince.IsZero()
			stalled := m.stalled
			m.mu.Unlock()
			if stalled {
				m.log.Error().Float64("waited_s", logSeconds(time.Since(since))).Time("since", since).
					Msg("NVML does not answer: a GPU or its driver hangs (look for Xid errors in the kernel log); GPU readings stop until it answers")
			}
		case <-ctx.Done():
			return done
		}
	}
}

// answered ends the call into NVML that began at start: it is no longer busy, and if it had
// stalled, the log says NVML answers again. m.mu must be held.
func (m *gpuMonitor) answered(start time.Time) {
	if m.stalled {
		m.log.Info().Float64("after_s", logSeconds(time.Since(start))).Msg("NVML answers again; GPU sampling goes on")
	}
	m.busySince, m.stalled = time.Time{}, false
}

// hung reports whether Run returned without a call into NVML returning: then NVML must not be
// closed (that would block too).
func (m *gpuMonitor) hung() bool {
	m.mu.Lock()
	defer m.mu.Unlock()
	return m.abandoned
}

// notAnswering returns when the sampling step that has stalled began, and whether one has.
func (m *gpuMonitor) notAnswering() (time.Time, bool) {
	m.mu.Lock()
	defer m.mu.Unlock()
	return m.busySince, m.stalled
}

// Tick is one sampling step: read every GPU, judge them, keep and record the results. A GPU
// whose verdict turns degraded (or healthy again) is logged once per change.
func (m *gpuMonitor) Tick(ctx context.Context) {
	gpus := m.sampler()
	samples := gpus.Sample(ctx)
	if ctx.Err() != nil {
		return
	}
	facts := gpus.Facts()
	// One reading never decides: the judge wants a rule to hold in 3 of the last 5 samples.
	verdicts := m.judge.Judge(time.Now(), nvml.Verdicts(facts, samples, m.threshold))
	m.mu.Lock()
	prev := m.verdicts
	m.samples, m.verdicts = samples, verdicts
	m.mu.Unlock()
	for i, v := range verdicts {
		was := i < len(prev) && prev[i].Degraded
		switch {
		case v.Degraded && !was:
			m.log.Warn().Int("gpu", v.Index).Str("uuid", v.UUID).Strs("reasons", v.Reasons).Msg("GPU degraded")
		case !v.Degraded && was:
			m.log.Info().Int("gpu", v.Index).Str("uuid", v.UUID).Msg("GPU healthy again")
		}
	}
	if m.sink != nil {
		if m.sent == nil {
			m.sent = map[constKey]float64{}
		}
		m.sink.Record(gpuDatums(facts, samples, verdicts, m.perGPU, m.sent)...)
	}
}

func (m *gpuMonitor) status() gpuStatus {
	m.mu.Lock()
	defer m.mu.Unlock()
	var st gpuStatus
	if m.stalled {
		since := m.busySince.UTC()
		st.NotAnsweringSince = &since
	}
	if m.gpus == nil {
		st.Off = m.off
		return st
	}
	st.Sampling = true
	for i, f := range m.gpus.Facts() {
		g := GPUStatus{Facts: f, Verdict: nvml.Verdict{Index: f.Index, UUID: f.UUID}}
		if i < len(m.samples) {
			s := m.samples[i]
			g.Sample = &s
		}
		if i < len(m.verdicts) {
			g.Verdict = m.verdicts[i]
		}
		st.GPUs = append(st.GPUs, g)
	}
	return st
}

// gpuSeries are the per-GPU metrics, named once for Prometheus (snake case, unit in the name,
// labels gpu, uuid, model) and once for CloudWatch (CamelCase, dimension GPU). An empty prom is
// CloudWatch only. In CloudWatch the per-GPU series are sent only with metrics.cloudwatch_per_gpu;
// a constant (a property of the GPU) only on its first sample and when it changes, since
// CloudWatch bills a metric for every hour it receives data. The readings marked instance are
// also recorded, once per GPU per tick, into the default per-instance series of the same name
// without the GPU dimension, whose statistic set gives the minimum, maximum and average across
// the GPUs (see gpuDatums).
var gpuSeries = []struct {
	prom, cw, help string
	unit           metrics.Unit
	constant       bool
	instance       bool
	value          func(f *nvml.Facts, s *nvml.Sample, v *nvml.Verdict) (float64, bool)
}{
	{prom: "spotguard_gpu_sm_clock_mhz", cw: "GPUSMClockMHz", help: "Current SM clock.", unit: metrics.UnitNone, instance: true,
		value: func(f *nvml.Facts, s *nvml.Sample, v *nvml.Verdict) (float64, bool) { return u32(s.SMClockMHz) }},
	{prom: "spotguard_gpu_sm_clock_max_mhz", cw: "GPUSMClockMaxMHz", help: "Maximum SM clock.", unit: metrics.UnitNone, constant: true,
		value: func(f *nvml.Facts, s *nvml.Sample, v *nvml.Verdict) (float64, bool) {
			return float64(f.MaxSMClockMHz), f.MaxSMClockMHz > 0
		}},
	{prom: "spotguard_gpu_memory_clock_mhz", cw: "GPUMemClockMHz", help: "Current memory clock.", unit: metrics.UnitNone,
		value: func(f *nvml.Facts, s *nvml.Sample, v *nvml.Verdict) (float64, bool) { return u32(s.MemClockMHz) }},
	{prom: "spotguard_gpu_memory_clock_max_mhz", cw: "GPUMemClockMaxMHz", help: "Maximum memory clock.", unit: metrics.UnitNone, constant: true,
		value: func(f *nvml.Facts, s *nvml.Sample, v *nvml.Verdict) (float64, bool) {
			return float64(f.MaxMemClockMHz), f.MaxMemClockMHz > 0
		}},
	{prom: "spotguard_gpu_memory_bandwidth_peak_bytes_per_second", cw: "GPUMemBandwidthPeak", help: "Theoretical peak memory bandwidth: max memory clock × 2 × bus width.", unit: metrics.UnitBytesPerSecond, constant: true,
		value: func(f *nvml.Facts, s *nvml.Sample, v *nvml.Verdict) (float64, bool) {
			return f.PeakMemBandwidth, f.PeakMemBandwidth > 0
		}},
	{prom: "spotguard_gpu_memory_bandwidth_achieved_bytes_per_second", cw: "GPUMemBandwidthAchieved", help: "Achieved memory bandwidth: GPM's DRAM bandwidth utilization × peak. GPM only (Hopper and newer); absent on older GPUs, which count no bytes moved.", unit: metrics.UnitBytesPerSecond, instance: true,
		value: func(f *nvml.Facts, s *nvml.Sample, v *nvml.Verdict) (float64, bool) {
			return f64(s.AchievedMemBandwidth)
		}},
	{prom: "spotguard_gpu_utilization_percent", cw: "GPUUtilization", help: "Share of the last sample period in which a kernel ran.", unit: metrics.UnitPercent, instance: true,
		value: func(f *nvml.Facts, s *nvml.Sample, v *nvml.Verdict) (float64, bool) { return f64(s.GPUUtilPercent) }},
	{prom: "spotguard_gpu_memory_utilization_percent", cw: "GPUMemDutyCycle", help: "Memory controller duty cycle: share of the last sample period in which device memory was read or written; not bytes moved.", unit: metrics.UnitPercent,
		value: func(f *nvml.Facts, s *nvml.Sample, v *nvml.Verdict) (float64, bool) { return f64(s.MemUtilPercent) }},
	{prom: "spotguard_gpu_dram_bandwidth_utilization_percent", cw: "GPUDRAMBandwidthUtilization", help: "DRAM bandwidth utilization from GPM (Hopper and newer).", unit: metrics.UnitPercent,
		value: func(f *nvml.Facts, s *nvml.Sample, v *nvml.Verdict) (float64, bool) {
			return f64(s.DRAMBandwidthUtilPercent)
		}},
	{prom: "spotguard_gpu_memory_used_bytes", cw: "GPUMemUsed", help: "Framebuffer memory in use.", unit: metrics.UnitBytes,
		value: func(f *nvml.Facts, s *nvml.Sample, v *nvml.Verdict) (float64, bool) { return u64(s.MemUsedBytes) }},
	{prom: "spotguard_gpu_memory_total_bytes", cw: "GPUMemTotal", help: "Framebuffer memory.", unit: metrics.UnitBytes, constant: true,
		value: func(f *nvml.Facts, s *nvml.Sample, v *nvml.Verdict) (float64, bool) { return u64(s.MemTotalBytes) }},
	{prom: "spotguard_gpu_temperature_celsius", cw: "GPUTemperatureCelsius", help: "GPU core temperature.", unit: metrics.UnitNone, instance: true,
		value: func(f *nvml.Facts, s *nvml.Sample, v *nvml.Verdict) (float64, bool) { return f64(s.TemperatureC) }},
	{prom: "spotguard_gpu_power_watts", cw: "GPUPowerWatts", help: "Board power draw.", unit: metrics.UnitNone,
		value: func(f *nvml.Facts, s *nvml.Sample, v *nvml.Verdict) (float64, bool) { return f64(s.PowerW) }},
	{prom: "spotguard_gpu_clock_event_reasons", cw: "GPUClockEventReasons", help: "Active clock-event (throttle) reasons; the Prometheus series has one per reason (label reason).", unit: metrics.UnitCount,
		value: func(f *nvml.Facts, s *nvml.Sample, v *nvml.Verdict) (float64, bool) {
			return float64(len(s.ClockEventReasons)), true
		}},
	{cw: "GPUSlowdownPercent", unit: metrics.UnitPercent,
		value: func(f *nvml.Facts, s *nvml.Sample, v *nvml.Verdict) (float64, bool) {
			return slowdownPercent(s.ClockEventTimes)
		}},
	{prom: "spotguard_gpu_ecc_uncorrected_errors", cw: "GPUECCUncorrected", help: "Volatile uncorrected ECC errors since the driver loaded.", unit: metrics.UnitCount,
		value: func(f *nvml.Facts, s *nvml.Sample, v *nvml.Verdict) (float64, bool) {
			return u64(s.ECCUncorrectedVolatile)
		}},
	{prom: "spotguard_gpu_remapped_rows_pending", cw: "GPURemappedRowsPending", help: "1 when a row remap waits for a GPU reset.", unit: metrics.UnitCount,
		value: func(f *nvml.Facts, s *nvml.Sample, v *nvml.Verdict) (float64, bool) {
			if s.RemappedRowsPending == nil {
				return 0, false
			}
			return b2f(*s.RemappedRowsPending), true
		}},
	{prom: "spotguard_gpu_xid_critical_errors", cw: "GPUXIDCritical", help: "Critical XID events since the agent started.", unit: metrics.UnitCount,
		value: func(f *nvml.Facts, s *nvml.Sample, v *nvml.Verdict) (float64, bool) {
			return float64(s.XIDCritical), true
		}},
	{prom: "spotguard_gpu_lost", cw: "GPULost", help: "1 when NVML reported the GPU lost.", unit: metrics.UnitCount,
		value: func(f *nvml.Facts, s *nvml.Sample, v *nvml.Verdict) (float64, bool) {
			return b2f(s.Lost), true
		}},
	{prom: "spotguard_gpu_degraded", cw: "GPUDegraded", help: "1 when the GPU is judged degraded (see /status for the reasons).", unit: metrics.UnitCount,
		value: func(f *nvml.Facts, s *nvml.Sample, v *nvml.Verdict) (float64, bool) {
			return b2f(v.Degraded), true
		}},
}

// slowdownReasons are the clock event counters GPUSlowdownPercent watches: cooling and power
// trouble, not the power cap or low load.
var slowdownReasons = []string{"hw_thermal_slowdown", "hw_power_brake_slowdown", "sw_thermal_slowdown"}

// slowdownPercent returns 100 × the largest share of the last sample period that one of
// slowdownReasons held the clocks down. It reports false when none of them has a window: NVML
// has no such counters (times is nil: drivers before 535, some GPUs), or this is the GPU's first
// sample, or the counter went backwards.
func slowdownPercent(times []nvml.ClockEventTime) (float64, bool) {
	var share float64
	ok := false
	for _, ct := range times {
		if ct.Window > 0 && slices.Contains(slowdownReasons, ct.Reason) {
			share, ok = max(share, ct.Share), true
		}
	}
	return 100 * share, ok
}

func u32(p *uint32) (float64, bool) {
	if p == nil {
		return 0, false
	}
	return float64(*p), true
}

func u64(p *uint64) (float64, bool) {
	if p == nil {
		return 0, false
	}
	return float64(*p), true
}

func f64(p *float64) (float64, bool) {
	if p == nil {
		return 0, false
	}
	return *p, true
}

func b2f(b bool) float64 {
	if b {
		return 1
	}
	return 0
}

// constKey names one constant of one GPU in gpuMonitor.sent.
type constKey struct {
	gpu    string // the UUID, or "#index" when NVML gave none
	series string
}

// gpuDatums turns one tick into CloudWatch datums:
//
//   - always, the per-instance series, without the GPU dimension and marked Aggregate:
//     GPUDegradedCount (GPUs judged degraded) and GPULostCount (GPUs NVML lost), one datum
//     each, and each reading of gpuSeries marked instance, one datum per GPU that has it, so
//     that the flush's statistic set gives the minimum, maximum and average across GPUs and
//     samples (a lost GPU has no readings: it drops out of them and shows in the counts);
//   - with perGPU, every series of gpuSeries per GPU (dimension GPU = index); a constant only
//     when sent (by GPU and series) lacks it or holds another value, and sent is updated (a nil
//     sent sends every constant every time). A constant the GPU no longer reports (a lost
//     GPU's memory size) is not sent and keeps its entry, so the same value coming back is not
//     sent again.
//
// Facts and verdicts are matched to samples by position. No samples, no datums.
func gpuDatums(facts []nvml.Facts, samples []nvml.Sample, verdicts []nvml.Verdict, perGPU bool, sent map[constKey]float64) []metrics.Datum {
	n := min(len(samples), len(facts), len(verdicts))
	if n == 0 {
		return nil
	}
	per := 0
	if perGPU {
		per = len(gpuSeries)
	}
	out := make([]metrics.Datum, 0, 2+n*(4+per))
	var degraded, lost float64
	for i := range n {
		f, s, v := &facts[i], &samples[i], &verdicts[i]
		degraded += b2f(v.Degraded)
		lost += b2f(s.Lost)
		gpu := map[string]string{"GPU": strconv.Itoa(s.Index)}
		id := s.UUID
		if id == "" {
			id = "#" + strconv.Itoa(s.Index)
		}
		for _, g := range gpuSeries {
			val, ok := g.value(f, s, v)
			if !ok {
				continue
			}
			if g.instance {
				out = append(out, metrics.Datum{Name: g.cw, Unit: g.unit, Value: val, At: s.At, Aggregate: true})
			}
			if !perGPU {
				continue
			}
			if g.constant && sent != nil {
				k := constKey{id, g.cw}
				if last, seen := sent[k]; seen && last == val {
					continue
				}
				sent[k] = val
			}
			out = append(out, metrics.Datum{Name: g.cw, Unit: g.unit, Value: val, Dimensions: gpu, At: s.At})
		}
	}
	at := samples[0].At
	out = append(out,
		metrics.Datum{Name: "GPUDegradedCount", Unit: metrics.UnitCount, Value: degraded, At: at, Aggregate: true},
		metrics.Datum{Name: "GPULostCount", Unit: metrics.UnitCount, Value: lost, At: at, Aggregate: true})
	return out
}

// gpuCollector exports the latest readings to Prometheus at scrape time.
type gpuCollector struct {
	m          *gpuMonitor
	descs      []*prometheus.Desc // by gpuSeries index; nil where prom is empty
	up         *prometheus.Desc
	eventTimes *prometheus.Desc
}

func newGPUCollector(m *gpuMonitor) *gpuCollector {
	c := &gpuCollector{m: m,
		up: prometheus.NewDesc("spotguard_gpu_sampling_up", "1 when GPU sampling through NVML works, 0 when it is off (no libnvidia-ml, no GPU, no permission) or NVML does not answer (a hung GPU or driver; the per-GPU series are absent then).", nil, nil),
		eventTimes: prometheus.NewDesc("spotguard_gpu_clock_event_seconds_total",
			"Time each clock-event reason has held the clocks down since the driver loaded (NVML's clock event counters; absent where NVML has none: drivers before 535, some GPUs).",
			[]string{"gpu", "uuid", "model", "reason"}, nil),
	}
	c.descs = make([]*prometheus.Desc, len(gpuSeries))
	for i, g := range gpuSeries {
		if g.prom == "" {
			continue
		}
		labels := []string{"gpu", "uuid", "model"}
		if g.prom == "spotguard_gpu_clock_event_reasons" {
			labels = append(labels, "reason")
		}
		c.descs[i] = prometheus.NewDesc(g.prom, g.help, labels, nil)
	}
	return c
}

func (c *gpuCollector) Describe(ch chan<- *prometheus.Desc) {
	ch <- c.up
	ch <- c.eventTimes
	for _, d := range c.descs {
		if d != nil {
			ch <- d
		}
	}
}

func (c *gpuCollector) Collect(ch chan<- prometheus.Metric) {
	c.m.mu.Lock()
	gpus, samples, verdicts, stalled := c.m.gpus, c.m.samples, c.m.verdicts, c.m.stalled
	c.m.mu.Unlock()
	// Off, or NVML not answering: then the readings would be from before it stopped; none rather
	// than stale ones.
	if gpus == nil || stalled {
		ch <- prometheus.MustNewConstMetric(c.up, prometheus.GaugeValue, 0)
		return
	}
	ch <- prometheus.MustNewConstMetric(c.up, prometheus.GaugeValue, 1)
	facts := gpus.Facts()
	for i := range samples {
		if i >= len(facts) || i >= len(verdicts) {
			break
		}
		f, s, v := &facts[i], &samples[i], &verdicts[i]
		labels := []string{strconv.Itoa(s.Index), s.UUID, f.Name}
		for j, g := range gpuSeries {
			switch {
			case c.descs[j] == nil:
			case g.prom == "spotguard_gpu_clock_event_reasons":
				for _, r := range s.ClockEventReasons {
					ch <- prometheus.MustNewConstMetric(c.descs[j], prometheus.GaugeValue, 1, append(labels, r)...)
				}
			default:
				if val, ok := g.value(f, s, v); ok {
					ch <- prometheus.MustNewConstMetric(c.descs[j], prometheus.GaugeValue, val, labels...)
				}
			}
		}
		for _, ct := range s.ClockEventTimes {
			ch <- prometheus.MustNewConstMetric(c.eventTimes, prometheus.CounterValue, ct.Total.Seconds(), append(labels, ct.Reason)...)
		}
	}
}
