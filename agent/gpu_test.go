package agent

import (
	"context"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync"
	"testing"

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
		out = append(out, nvml.Sample{Index: i, UUID: "GPU-" + string(rune('a'+i)), SMClockMHz: ptr(clock), MemClockMHz: ptr(uint32(2619)),
			GPUUtilPercent: ptr(100.0), TemperatureC: ptr(60.0), PowerW: ptr(650.0), ClockEventReasons: []string{"sw_power_cap"}})
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
	sink := &recordSink{}
	m := &gpuMonitor{gpus: &fakeGPUs{}, threshold: 0.10, sink: sink, log: zerolog.Nop()}
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
	names := map[string]int{}
	for _, d := range sink.ds {
		names[d.Name]++
		if d.Dimensions["GPU"] == "" {
			t.Errorf("datum %s has no GPU dimension", d.Name)
		}
	}
	for _, want := range []string{"GPUSMClockMHz", "GPUSMClockMaxMHz", "GPUMemBandwidthPeak", "GPUTemperatureCelsius", "GPUPowerWatts", "GPUDegraded"} {
		if names[want] != 4*nvml.DefaultEvidenceK {
			t.Errorf("datums %s: %d; want one per GPU and sample", want, names[want])
		}
	}
	if names["GPUMemBandwidthAchieved"] != 0 {
		t.Errorf("achieved bandwidth sent although the sample has none")
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
	} {
		if !strings.Contains(text, want) {
			t.Errorf("/metrics lacks %s", want)
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
