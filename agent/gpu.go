package agent

import (
	"context"
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
	gpus      gpuSampler // nil when sampling is off
	off       string     // why it is off
	interval  time.Duration
	threshold float64
	sink      metrics.Sink // may be nil
	log       zerolog.Logger
	judge     nvml.Judge // owned by Tick's caller: one Tick at a time

	mu       sync.Mutex
	samples  []nvml.Sample
	verdicts []nvml.Verdict
}

// GPUStatus is one GPU in /status.
type GPUStatus struct {
	Facts   nvml.Facts   `json:"facts"`
	Sample  *nvml.Sample `json:"sample,omitempty"`
	Verdict nvml.Verdict `json:"verdict"`
}

// gpuStatus is the monitor's part of /status.
type gpuStatus struct {
	Sampling bool        `json:"sampling"`
	Off      string      `json:"off,omitempty"`
	GPUs     []GPUStatus `json:"gpus,omitempty"`
}

// Run samples until ctx is done; with sampling off it returns at once. It returns nil.
func (m *gpuMonitor) Run(ctx context.Context) error {
	if m.gpus == nil {
		return nil
	}
	var wg sync.WaitGroup
	defer wg.Wait()
	wg.Go(func() {
		if err := m.gpus.RunEvents(ctx); err != nil {
			m.log.Warn().Err(err).Msg("GPU XID events unavailable")
		}
	})
	t := time.NewTicker(m.interval)
	defer t.Stop()
	for {
		m.Tick(ctx)
		select {
		case <-ctx.Done():
			return nil
		case <-t.C:
		}
	}
}

// Tick is one sampling step: read every GPU, judge them, keep and record the results. A GPU
// whose verdict turns degraded (or healthy again) is logged once per change.
func (m *gpuMonitor) Tick(ctx context.Context) {
	samples := m.gpus.Sample(ctx)
	if ctx.Err() != nil {
		return
	}
	facts := m.gpus.Facts()
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
		m.sink.Record(gpuDatums(facts, samples, verdicts)...)
	}
}

func (m *gpuMonitor) status() gpuStatus {
	if m.gpus == nil {
		return gpuStatus{Off: m.off}
	}
	m.mu.Lock()
	defer m.mu.Unlock()
	st := gpuStatus{Sampling: true}
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

// gpuSeries are the GPU metrics, named once for Prometheus (snake case, unit in the name) and
// once for CloudWatch (CamelCase, dimension GPU).
var gpuSeries = []struct {
	prom, cw, help string
	unit           metrics.Unit
	value          func(f *nvml.Facts, s *nvml.Sample, v *nvml.Verdict) (float64, bool)
}{
	{"spotguard_gpu_sm_clock_mhz", "GPUSMClockMHz", "Current SM clock.", metrics.UnitNone, func(f *nvml.Facts, s *nvml.Sample, v *nvml.Verdict) (float64, bool) { return u32(s.SMClockMHz) }},
	{"spotguard_gpu_sm_clock_max_mhz", "GPUSMClockMaxMHz", "Maximum SM clock.", metrics.UnitNone, func(f *nvml.Facts, s *nvml.Sample, v *nvml.Verdict) (float64, bool) {
		return float64(f.MaxSMClockMHz), f.MaxSMClockMHz > 0
	}},
	{"spotguard_gpu_memory_clock_mhz", "GPUMemClockMHz", "Current memory clock.", metrics.UnitNone, func(f *nvml.Facts, s *nvml.Sample, v *nvml.Verdict) (float64, bool) { return u32(s.MemClockMHz) }},
	{"spotguard_gpu_memory_clock_max_mhz", "GPUMemClockMaxMHz", "Maximum memory clock.", metrics.UnitNone, func(f *nvml.Facts, s *nvml.Sample, v *nvml.Verdict) (float64, bool) {
		return float64(f.MaxMemClockMHz), f.MaxMemClockMHz > 0
	}},
	{"spotguard_gpu_memory_bandwidth_peak_bytes_per_second", "GPUMemBandwidthPeak", "Theoretical peak memory bandwidth: max memory clock × 2 × bus width.", metrics.UnitBytesPerSecond, func(f *nvml.Facts, s *nvml.Sample, v *nvml.Verdict) (float64, bool) {
		return f.PeakMemBandwidth, f.PeakMemBandwidth > 0
	}},
	{"spotguard_gpu_memory_bandwidth_achieved_bytes_per_second", "GPUMemBandwidthAchieved", "Achieved memory bandwidth: DRAM bandwidth utilization (GPM; else memory duty cycle) × peak.", metrics.UnitBytesPerSecond, func(f *nvml.Facts, s *nvml.Sample, v *nvml.Verdict) (float64, bool) {
		return f64(s.AchievedMemBandwidth)
	}},
	{"spotguard_gpu_utilization_percent", "GPUUtilization", "Share of time a kernel ran.", metrics.UnitPercent, func(f *nvml.Facts, s *nvml.Sample, v *nvml.Verdict) (float64, bool) { return f64(s.GPUUtilPercent) }},
	{"spotguard_gpu_memory_utilization_percent", "GPUMemUtilization", "Memory controller duty cycle.", metrics.UnitPercent, func(f *nvml.Facts, s *nvml.Sample, v *nvml.Verdict) (float64, bool) { return f64(s.MemUtilPercent) }},
	{"spotguard_gpu_dram_bandwidth_utilization_percent", "GPUDRAMBandwidthUtilization", "DRAM bandwidth utilization from GPM (Hopper and newer).", metrics.UnitPercent, func(f *nvml.Facts, s *nvml.Sample, v *nvml.Verdict) (float64, bool) {
		return f64(s.DRAMBandwidthUtilPercent)
	}},
	{"spotguard_gpu_memory_used_bytes", "GPUMemUsed", "Framebuffer memory in use.", metrics.UnitBytes, func(f *nvml.Facts, s *nvml.Sample, v *nvml.Verdict) (float64, bool) { return u64(s.MemUsedBytes) }},
	{"spotguard_gpu_memory_total_bytes", "GPUMemTotal", "Framebuffer memory.", metrics.UnitBytes, func(f *nvml.Facts, s *nvml.Sample, v *nvml.Verdict) (float64, bool) { return u64(s.MemTotalBytes) }},
	{"spotguard_gpu_temperature_celsius", "GPUTemperatureCelsius", "GPU core temperature.", metrics.UnitNone, func(f *nvml.Facts, s *nvml.Sample, v *nvml.Verdict) (float64, bool) { return f64(s.TemperatureC) }},
	{"spotguard_gpu_power_watts", "GPUPowerWatts", "Board power draw.", metrics.UnitNone, func(f *nvml.Facts, s *nvml.Sample, v *nvml.Verdict) (float64, bool) { return f64(s.PowerW) }},
	{"spotguard_gpu_clock_event_reasons", "GPUClockEventReasons", "Active clock-event (throttle) reasons; the Prometheus series has one per reason (label reason).", metrics.UnitCount, func(f *nvml.Facts, s *nvml.Sample, v *nvml.Verdict) (float64, bool) {
		return float64(len(s.ClockEventReasons)), true
	}},
	{"spotguard_gpu_ecc_uncorrected_errors", "GPUECCUncorrected", "Volatile uncorrected ECC errors since the driver loaded.", metrics.UnitCount, func(f *nvml.Facts, s *nvml.Sample, v *nvml.Verdict) (float64, bool) {
		return u64(s.ECCUncorrectedVolatile)
	}},
	{"spotguard_gpu_remapped_rows_pending", "GPURemappedRowsPending", "1 when a row remap waits for a GPU reset.", metrics.UnitCount, func(f *nvml.Facts, s *nvml.Sample, v *nvml.Verdict) (float64, bool) {
		if s.RemappedRowsPending == nil {
			return 0, false
		}
		return b2f(*s.RemappedRowsPending), true
	}},
	{"spotguard_gpu_xid_critical_errors", "GPUXIDCritical", "Critical XID events since the agent started.", metrics.UnitCount, func(f *nvml.Facts, s *nvml.Sample, v *nvml.Verdict) (float64, bool) {
		return float64(s.XIDCritical), true
	}},
	{"spotguard_gpu_lost", "GPULost", "1 when NVML reported the GPU lost.", metrics.UnitCount, func(f *nvml.Facts, s *nvml.Sample, v *nvml.Verdict) (float64, bool) {
		return b2f(s.Lost), true
	}},
	{"spotguard_gpu_degraded", "GPUDegraded", "1 when the GPU is judged degraded (see /status for the reasons).", metrics.UnitCount, func(f *nvml.Facts, s *nvml.Sample, v *nvml.Verdict) (float64, bool) {
		return b2f(v.Degraded), true
	}},
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

// gpuDatums turns one tick into CloudWatch datums, dimension GPU = index.
func gpuDatums(facts []nvml.Facts, samples []nvml.Sample, verdicts []nvml.Verdict) []metrics.Datum {
	out := make([]metrics.Datum, 0, len(samples)*len(gpuSeries))
	for i := range samples {
		if i >= len(facts) || i >= len(verdicts) {
			break
		}
		f, s, v := &facts[i], &samples[i], &verdicts[i]
		dims := map[string]string{"GPU": strconv.Itoa(s.Index)}
		for _, g := range gpuSeries {
			if val, ok := g.value(f, s, v); ok {
				out = append(out, metrics.Datum{Name: g.cw, Unit: g.unit, Value: val, Dimensions: dims, At: s.At})
			}
		}
	}
	return out
}

// gpuCollector exports the latest readings to Prometheus at scrape time.
type gpuCollector struct {
	m     *gpuMonitor
	descs []*prometheus.Desc
	up    *prometheus.Desc
}

func newGPUCollector(m *gpuMonitor) *gpuCollector {
	c := &gpuCollector{m: m,
		up: prometheus.NewDesc("spotguard_gpu_sampling_up", "1 when GPU sampling through NVML works, 0 when it is off (no libnvidia-ml, no GPU, no permission).", nil, nil),
	}
	for _, g := range gpuSeries {
		labels := []string{"gpu", "uuid", "model"}
		if g.prom == "spotguard_gpu_clock_event_reasons" {
			labels = append(labels, "reason")
		}
		c.descs = append(c.descs, prometheus.NewDesc(g.prom, g.help, labels, nil))
	}
	return c
}

func (c *gpuCollector) Describe(ch chan<- *prometheus.Desc) {
	ch <- c.up
	for _, d := range c.descs {
		ch <- d
	}
}

func (c *gpuCollector) Collect(ch chan<- prometheus.Metric) {
	if c.m.gpus == nil {
		ch <- prometheus.MustNewConstMetric(c.up, prometheus.GaugeValue, 0)
		return
	}
	ch <- prometheus.MustNewConstMetric(c.up, prometheus.GaugeValue, 1)
	facts := c.m.gpus.Facts()
	c.m.mu.Lock()
	samples, verdicts := c.m.samples, c.m.verdicts
	c.m.mu.Unlock()
	for i := range samples {
		if i >= len(facts) || i >= len(verdicts) {
			break
		}
		f, s, v := &facts[i], &samples[i], &verdicts[i]
		labels := []string{strconv.Itoa(s.Index), s.UUID, f.Name}
		for j, g := range gpuSeries {
			if g.prom == "spotguard_gpu_clock_event_reasons" {
				for _, r := range s.ClockEventReasons {
					ch <- prometheus.MustNewConstMetric(c.descs[j], prometheus.GaugeValue, 1, append(labels, r)...)
				}
				continue
			}
			if val, ok := g.value(f, s, v); ok {
				ch <- prometheus.MustNewConstMetric(c.descs[j], prometheus.GaugeValue, val, labels...)
			}
		}
	}
}
