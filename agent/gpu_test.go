package agent

import (
	"context"
	"fmt"
	"maps"
	"net/http"
	"net/http/httptest"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/rs/zerolog"

	"github.com/spotguard/spotguard/agent/metrics"
	"github.com/spotguard/spotguard/nvml"
)

// fakeGPUs is four H100s, the last one slow, as NVML would report them.
type fakeGPUs struct{ closed bool }

func ptr[T any](v T) *T { return &v }

func (f *fakeGPUs) Facts() []nvml.Facts {
	var out []nvml.Facts
	for i := range 4 {
		out = append(out, nvml.Facts{Index: i, UUID: "GPU-" + string(rune('a'+i)), Name: "NVIDIA H100 80GB HBM3",
			MaxSMClockMHz: 1980, MaxMemClockMHz: 2619, MemBusWidthBits: 5120, PeakMemBandwidth: nvml.PeakMemBandwidth(2619, 5120)})
	}
	return out
}

func (f *fakeGPUs) Sample(ctx context.Context) []nvml.Sample {
	var out []nvml.Sample
	for i := range 4 {
		clock := uint32(1980)
		if i == 3 {
			clock = 1500 // 24 % below its peers under the same load
		}
		s := nvml.Sample{Index: i, UUID: "GPU-" + string(rune('a'+i)), SMClockMHz: ptr(clock), MemClockMHz: ptr(uint32(2619)),
			GPUUtilPercent: ptr(100.0), TemperatureC: ptr(60.0), PowerW: ptr(650.0), ClockEventReasons: []string{"sw_power_cap"}}
		if i != 3 { // GPU 3's driver has no clock event counters
			s.ClockEventTimes = []nvml.ClockEventTime{{Reason: "sw_power_cap", Total: 90 * time.Second}}
		}
		out = append(out, s)
	}
	return out
}

func (f *fakeGPUs) RunEvents(ctx context.Context) error { <-ctx.Done(); return nil }
func (f *fakeGPUs) Close()                              { f.closed = true }

// recordSink keeps what it is given.
type recordSink struct {
	mu sync.Mutex
	ds []metrics.Datum
}

func (r *recordSink) Record(ds ...metrics.Datum) {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.ds = append(r.ds, ds...)
}

func TestGPUMonitorTick(t *testing.T) {
	for _, perGPU := range []bool{false, true} {
		t.Run(fmt.Sprintf("per_gpu=%v", perGPU), func(t *testing.T) {
			sink := &recordSink{}
			m := &gpuMonitor{gpus: &fakeGPUs{}, threshold: 0.10, sink: sink, perGPU: perGPU, log: zerolog.Nop()}
			// One reading does not decide: the slow GPU is degraded from the third sample on.
			for tick := range nvml.DefaultEvidenceK {
				m.Tick(t.Context())
				if st := m.status(); tick < nvml.DefaultEvidenceK-1 && st.GPUs[3].Verdict.Degraded {
					t.Fatalf("sample %d: GPU 3 degraded on %d reading(s): %v", tick, tick+1, st.GPUs[3].Verdict.Reasons)
				}
			}
			st := m.status()
			if !st.Sampling || len(st.GPUs) != 4 {
				t.Fatalf("status = %+v; want 4 GPUs sampled", st)
			}
			for i, g := range st.GPUs {
				if want := i == 3; g.Verdict.Degraded != want {
					t.Errorf("Got(GPU %d).Degraded = %v; want %v (reasons %v)", i, g.Verdict.Degraded, want, g.Verdict.Reasons)
				}
			}
			perInstance, perGPUNames := map[string]int{}, map[string]int{}
			var degraded []float64
			for _, d := range sink.ds {
				if d.Dimensions["GPU"] == "" {
					perInstance[d.Name]++
					if !d.Aggregate {
						t.Errorf("per-instance datum %s not marked Aggregate", d.Name)
					}
					if d.Name == "GPUDegradedCount" {
						degraded = append(degraded, d.Value)
					}
				} else {
					perGPUNames[d.Name]++
					if d.Aggregate {
						t.Errorf("per-GPU datum %s marked Aggregate", d.Name)
					}
				}
			}
			k := nvml.DefaultEvidenceK
			wantInstance := map[string]int{"GPUSMClockMHz": 4 * k, "GPUUtilization": 4 * k, "GPUTemperatureCelsius": 4 * k,
				"GPUDegradedCount": k, "GPULostCount": k}
			if !maps.Equal(perInstance, wantInstance) {
				t.Errorf("Got(per-instance datums) = %v; want %v (no achieved bandwidth: the sample has none)", perInstance, wantInstance)
			}
			if want := []float64{0, 0, 1}; !slices.Equal(degraded, want) {
				t.Errorf("Got(GPUDegradedCount) = %v; want %v", degraded, want)
			}
			wantGPU := map[string]int{}
			if perGPU {
				wantGPU = map[string]int{
					"GPUSMClockMHz": 4 * k, "GPUMemClockMHz": 4 * k, "GPUUtilization": 4 * k, "GPUTemperatureCelsius": 4 * k,
					"GPUPowerWatts": 4 * k, "GPUClockEventReasons": 4 * k, "GPUXIDCritical": 4 * k, "GPULost": 4 * k, "GPUDegraded": 4 * k,
					// Constants: once per GPU, not every sample.
					"GPUSMClockMaxMHz": 4, "GPUMemClockMaxMHz": 4, "GPUMemBandwidthPeak": 4,
				}
			}
			if !maps.Equal(perGPUNames, wantGPU) {
				t.Errorf("Got(per-GPU datums) = %v; want %v", perGPUNames, wantGPU)
			}
		})
	}
}

// gpuDatums per GPU: a constant goes out on the first sample and again only when it changes
// (not when a lost GPU stops reporting it); GPUSlowdownPercent only from clock event counters
// with a window; readings NVML lacks are not sent.
func TestGPUDatumsConstantsAndSlowdown(t *testing.T) {
	facts := []nvml.Facts{{Index: 0, UUID: "GPU-a", Name: "NVIDIA H100 80GB HBM3", MaxSMClockMHz: 1980, MaxMemClockMHz: 2619,
		MemBusWidthBits: 5120, PeakMemBandwidth: nvml.PeakMemBandwidth(2619, 5120)}}
	verdicts := []nvml.Verdict{{Index: 0, UUID: "GPU-a"}}
	reading := func(mem uint64, times []nvml.ClockEventTime) nvml.Sample {
		return nvml.Sample{Index: 0, UUID: "GPU-a", SMClockMHz: ptr(uint32(1980)), MemTotalBytes: ptr(mem), ClockEventTimes: times}
	}
	window := func(shares ...float64) []nvml.ClockEventTime {
		reasons := []string{"sw_power_cap", "hw_thermal_slowdown", "hw_power_brake_slowdown", "sw_thermal_slowdown"}
		var out []nvml.ClockEventTime
		for i, sh := range shares {
			out = append(out, nvml.ClockEventTime{Reason: reasons[i], Total: time.Minute, Window: 5 * time.Second, Share: sh})
		}
		return out
	}
	lost := nvml.Sample{Index: 0, UUID: "GPU-a", Lost: true}
	sent := map[constKey]float64{}
	tests := []struct {
		name string
		s    nvml.Sample
		want map[string]float64 // per-GPU datums beyond the ones every sample has
	}{
		{"first sample: every constant", reading(80e9, nil),
			map[string]float64{"GPUSMClockMaxMHz": 1980, "GPUMemClockMaxMHz": 2619, "GPUMemBandwidthPeak": facts[0].PeakMemBandwidth, "GPUMemTotal": 80e9}},
		{"same again: none", reading(80e9, nil), map[string]float64{}},
		{"counters without a window yet", reading(80e9, []nvml.ClockEventTime{{Reason: "hw_thermal_slowdown", Total: time.Second}}), map[string]float64{}},
		{"counters with a window", reading(80e9, window(0.9, 0.25, 0.5, 0.125)), map[string]float64{"GPUSlowdownPercent": 50}},
		{"only the power cap held them", reading(80e9, window(1)), map[string]float64{}},
		{"memory size changed: that one", reading(79e9, window(0, 0)), map[string]float64{"GPUMemTotal": 79e9, "GPUSlowdownPercent": 0}},
		{"lost: no readings, constants from facts not again", lost, map[string]float64{}},
		{"back with the last size: not again", reading(79e9, nil), map[string]float64{}},
	}
	for _, tt := range tests {
		ds := gpuDatums(facts, []nvml.Sample{tt.s}, verdicts, true, sent)
		got := map[string]float64{}
		for _, d := range ds {
			if d.Dimensions["GPU"] != "0" {
				continue
			}
			switch d.Name {
			case "GPUClockEventReasons", "GPUXIDCritical", "GPULost", "GPUDegraded", "GPUSMClockMHz":
			default:
				got[d.Name] = d.Value
			}
		}
		if !maps.Equal(got, tt.want) {
			t.Errorf("Got(%q) = %v; want %v", tt.name, got, tt.want)
		}
	}
	// A restarted agent starts with nothing sent: every constant goes out once more.
	restart := map[constKey]float64{}
	n := 0
	for _, d := range gpuDatums(facts, []nvml.Sample{reading(79e9, nil)}, verdicts, true, restart) {
		if strings.Contains(d.Name, "Max") || d.Name == "GPUMemBandwidthPeak" || d.Name == "GPUMemTotal" {
			n++
		}
	}
	if n != 4 {
		t.Errorf("Got(%q) = %d constants; want 4", "after a restart", n)
	}
	// The per-instance counts see the lost GPU.
	for _, d := range gpuDatums(facts, []nvml.Sample{lost}, []nvml.Verdict{{Index: 0, UUID: "GPU-a", Degraded: true}}, false, nil) {
		switch d.Name {
		case "GPULostCount", "GPUDegradedCount":
			if d.Value != 1 || len(d.Dimensions) != 0 {
				t.Errorf("Got(%q) = %v %v; want 1 without dimensions", d.Name, d.Value, d.Dimensions)
			}
		default:
			t.Errorf("Got(%q) from a lost GPU; want only the counts", d.Name)
		}
	}
}

func TestGPUMetricsExported(t *testing.T) {
	cfg := mustLoad(t, LoadOptions{Environ: []string{"SPOTGUARD_HTTP_LISTEN=", "SPOTGUARD_TRAINER_MATCH=x", "SPOTGUARD_AGENT_RUNTIME_DIR=" + t.TempDir()}})
	gpus := &fakeGPUs{}
	a, err := New(cfg, Deps{Logger: zerolog.Nop(), IMDS: newFakeIMDS(), OpenGPUs: func(zerolog.Logger) (GPUs, error) { return gpus, nil }})
	if err != nil {
		t.Fatal(err)
	}
	for range nvml.DefaultEvidenceK {
		a.gpu.Tick(t.Context())
	}
	text := scrape(t, a)
	for _, want := range []string{
		"spotguard_gpu_sampling_up 1",
		`spotguard_gpu_sm_clock_mhz{gpu="3",model="NVIDIA H100 80GB HBM3",uuid="GPU-d"} 1500`,
		`spotguard_gpu_degraded{gpu="3",model="NVIDIA H100 80GB HBM3",uuid="GPU-d"} 1`,
		`spotguard_gpu_degraded{gpu="0",model="NVIDIA H100 80GB HBM3",uuid="GPU-a"} 0`,
		`spotguard_gpu_clock_event_reasons{gpu="0",model="NVIDIA H100 80GB HBM3",reason="sw_power_cap",uuid="GPU-a"} 1`,
		`spotguard_gpu_memory_bandwidth_peak_bytes_per_second{gpu="0",model="NVIDIA H100 80GB HBM3",uuid="GPU-a"} 3.35232e+12`,
		"# TYPE spotguard_gpu_clock_event_seconds_total counter",
		`spotguard_gpu_clock_event_seconds_total{gpu="0",model="NVIDIA H100 80GB HBM3",reason="sw_power_cap",uuid="GPU-a"} 90`,
	} {
		if !strings.Contains(text, want) {
			t.Errorf("/metrics lacks %s", want)
		}
	}
	// The help says what the numbers are: a duty cycle is not bytes moved; bandwidth only from GPM.
	helps := map[string]string{}
	for i, d := range newGPUCollector(a.gpu).descs {
		if d != nil {
			helps[gpuSeries[i].prom] = d.String()
		}
	}
	for name, want := range map[string]string{
		"spotguard_gpu_memory_utilization_percent":                 `help: "Memory controller duty cycle: share of the last sample period in which device memory was read or written; not bytes moved."`,
		"spotguard_gpu_memory_bandwidth_achieved_bytes_per_second": "GPM only (Hopper and newer)",
	} {
		if !strings.Contains(helps[name], want) {
			t.Errorf("Got(%q) = %s; want a help with %q", name, helps[name], want)
		}
	}
	for _, unwanted := range []string{`spotguard_gpu_clock_event_seconds_total{gpu="3"`, "slowdown_percent"} {
		if strings.Contains(text, unwanted) {
			t.Errorf("/metrics has %s; want none (no counters on GPU 3; GPUSlowdownPercent is CloudWatch only)", unwanted)
		}
	}
}

func TestGPUSamplingOff(t *testing.T) {
	cfg := mustLoad(t, LoadOptions{Environ: []string{"SPOTGUARD_HTTP_LISTEN=", "SPOTGUARD_TRAINER_MATCH=x", "SPOTGUARD_AGENT_RUNTIME_DIR=" + t.TempDir()}})
	a, err := New(cfg, Deps{Logger: zerolog.Nop(), IMDS: newFakeIMDS(), OpenGPUs: func(zerolog.Logger) (GPUs, error) {
		return nil, nvml.ErrUnavailable
	}})
	if err != nil {
		t.Fatal(err)
	}
	if st := a.gpu.status(); st.Sampling || st.Off == "" {
		t.Errorf("status = %+v; want off with the reason", st)
	}
	if text := scrape(t, a); !strings.Contains(text, "spotguard_gpu_sampling_up 0") {
		t.Errorf("/metrics lacks spotguard_gpu_sampling_up 0")
	}
}

func scrape(t *testing.T, a *Agent) string {
	t.Helper()
	rec := httptestRecorder()
	a.Handler().ServeHTTP(rec, httptestRequest("/metrics"))
	return rec.Body.String()
}

func httptestRecorder() *httptest.ResponseRecorder { return httptest.NewRecorder() }

func httptestRequest(path string) *http.Request {
	return httptest.NewRequest(http.MethodGet, path, nil)
}
