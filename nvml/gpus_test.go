//go:build linux && cgo

package nvml

import (
	"bytes"
	"context"
	"errors"
	"math"
	"reflect"
	"runtime"
	"slices"
	"strings"
	"sync"
	"testing"
	"testing/synctest"
	"time"

	gonvml "github.com/NVIDIA/go-nvml/pkg/nvml"
	"github.com/NVIDIA/go-nvml/pkg/nvml/mock"
	"github.com/NVIDIA/go-nvml/pkg/nvml/mock/dgxa100"
	"github.com/NVIDIA/go-nvml/pkg/nvml/mock/dgxh100"
	"github.com/NVIDIA/go-nvml/pkg/nvml/mock/gpus"
	"github.com/NVIDIA/go-nvml/pkg/nvml/mock/server"
	"github.com/rs/zerolog"
)

// gpuState is what one fake GPU reports; tests change it between samples.
// go-nvml's dgx* servers know names, UUIDs, memory and MIG but nothing we
// sample, so rig fills those in from here.
type gpuState struct {
	maxSM, maxMem, busWidth uint32
	sm, mem                 uint32
	util, memUtil           uint32
	tempC, powerMW          uint32
	reasons                 uint64
	ecc                     uint64
	remapPending            bool
	gpm                     bool // GpmQueryDeviceSupport says yes
	xid                     bool // XID events supported
	dramUtil                float64
	// viol are the cumulative clock event counters (ns) by policy; a policy missing from
	// the map is not supported.
	viol map[gonvml.PerfPolicyType]uint64

	unsupported map[string]bool // method name → ERROR_NOT_SUPPORTED
	lost        bool            // every call answers ERROR_GPU_IS_LOST
	calls       int             // calls made to this GPU
}

// h100State is a busy H100 SXM.
func h100State() gpuState {
	return gpuState{
		maxSM: 1980, maxMem: 2619, busWidth: 5120,
		sm: 1755, mem: 2619, util: 98, memUtil: 60, tempC: 64, powerMW: 612_000,
		reasons: 0x4, gpm: true, xid: true, dramUtil: 70,
	}
}

// a100State is a busy A100 SXM4 (no GPM).
func a100State() gpuState {
	return gpuState{
		maxSM: 1410, maxMem: 1215, busWidth: 5120,
		sm: 1410, mem: 1215, util: 97, memUtil: 55, tempC: 58, powerMW: 380_000, xid: true,
	}
}

// gpmTaken is one fake GPM sample.
type gpmTaken struct {
	dev int
	at  time.Time
}

// rig is a dgx* mock server with every method we call filled in.
type rig struct {
	srv  *server.Server
	devs []*server.Device
	gpus []*gpuState

	missing map[string]bool // symbols LookupSymbol reports missing

	mu        sync.Mutex
	gpmAt     map[gonvml.GpmSample]gpmTaken
	intervals []time.Duration // between the two samples of each GpmMetricsGet
	gpmFreed  int
	events    chan gonvml.EventData
	setFreed  int
}

func newRig(srv *server.Server, state gpuState) *rig {
	r := &rig{srv: srv, missing: map[string]bool{}, gpmAt: map[gonvml.GpmSample]gpmTaken{},
		events: make(chan gonvml.EventData, 16)}
	srv.LookupSymbolFunc = func(sym string) error {
		if r.missing[sym] {
			return errors.New("undefined symbol: " + sym)
		}
		return nil
	}
	srv.GpmSampleAllocFunc = func() (gonvml.GpmSample, gonvml.Return) {
		s := &mock.GpmSample{}
		s.FreeFunc = func() gonvml.Return {
			r.mu.Lock()
			defer r.mu.Unlock()
			r.gpmFreed++
			return gonvml.SUCCESS
		}
		return s, gonvml.SUCCESS
	}
	srv.GpmMetricsGetFunc = func(m *gonvml.GpmMetricsGetType) gonvml.Return {
		r.mu.Lock()
		defer r.mu.Unlock()
		a, okA := r.gpmAt[m.Sample1]
		b, okB := r.gpmAt[m.Sample2]
		if !okA || !okB || a.dev != b.dev || m.Version != gonvml.GPM_METRICS_GET_VERSION {
			return gonvml.ERROR_INVALID_ARGUMENT
		}
		r.intervals = append(r.intervals, b.at.Sub(a.at))
		for k := range m.NumMetrics {
			m.Metrics[k].NvmlReturn = uint32(gonvml.ERROR_NOT_SUPPORTED)
			if m.Metrics[k].MetricId == uint32(gonvml.GPM_METRIC_DRAM_BW_UTIL) {
				m.Metrics[k].Value, m.Metrics[k].NvmlReturn = r.gpus[a.dev].dramUtil, uint32(gonvml.SUCCESS)
			}
		}
		return gonvml.SUCCESS
	}
	srv.EventSetCreateFunc = func() (gonvml.EventSet, gonvml.Return) {
		return &mock.EventSet{
			WaitFunc: func(ms uint32) (gonvml.EventData, gonvml.Return) {
				t := time.NewTimer(time.Duration(ms) * time.Millisecond)
				defer t.Stop()
				select {
				case e := <-r.events:
					return e, gonvml.SUCCESS
				case <-t.C:
					return gonvml.EventData{}, gonvml.ERROR_TIMEOUT
				}
			},
			FreeFunc: func() gonvml.Return {
				r.mu.Lock()
				defer r.mu.Unlock()
				r.setFreed++
				return gonvml.SUCCESS
			},
		}, gonvml.SUCCESS
	}
	for i, h := range srv.Devices {
		st := state
		d := h.(*server.Device)
		r.devs, r.gpus = append(r.devs, d), append(r.gpus, &st)
		r.fill(i, d, &st)
	}
	return r
}

// fill sets the methods of d that the dgx* server leaves nil, and makes the
// ones it sets answer ERROR_GPU_IS_LOST when st.lost.
func (r *rig) fill(i int, d *server.Device, st *gpuState) {
	d.MemoryInfo.Used = 30 << 30
	d.MemoryInfo.Free = d.MemoryInfo.Total - d.MemoryInfo.Used
	ret := func(method string) gonvml.Return {
		st.calls++
		switch {
		case st.lost:
			return gonvml.ERROR_GPU_IS_LOST
		case st.unsupported[method]:
			return gonvml.ERROR_NOT_SUPPORTED
		}
		return gonvml.SUCCESS
	}
	uuid, name, memInfo, migMode := d.GetUUIDFunc, d.GetNameFunc, d.GetMemoryInfoFunc, d.GetMigModeFunc
	d.GetUUIDFunc = func() (string, gonvml.Return) {
		s, _ := uuid()
		return s, ret("GetUUID")
	}
	d.GetNameFunc = func() (string, gonvml.Return) {
		s, _ := name()
		return s, ret("GetName")
	}
	d.GetMemoryInfoFunc = func() (gonvml.Memory, gonvml.Return) {
		m, _ := memInfo()
		return m, ret("GetMemoryInfo")
	}
	d.GetMigModeFunc = func() (int, int, gonvml.Return) {
		c, p, _ := migMode()
		return c, p, ret("GetMigMode")
	}
	d.GetMaxClockInfoFunc = func(c gonvml.ClockType) (uint32, gonvml.Return) {
		if c == gonvml.CLOCK_MEM {
			return st.maxMem, ret("GetMaxClockInfo")
		}
		return st.maxSM, ret("GetMaxClockInfo")
	}
	d.GetMemoryBusWidthFunc = func() (uint32, gonvml.Return) { return st.busWidth, ret("GetMemoryBusWidth") }
	d.GetClockInfoFunc = func(c gonvml.ClockType) (uint32, gonvml.Return) {
		if c == gonvml.CLOCK_MEM {
			return st.mem, ret("GetClockInfo")
		}
		return st.sm, ret("GetClockInfo")
	}
	d.GetUtilizationRatesFunc = func() (gonvml.Utilization, gonvml.Return) {
		return gonvml.Utilization{Gpu: st.util, Memory: st.memUtil}, ret("GetUtilizationRates")
	}
	d.GetTemperatureFunc = func(gonvml.TemperatureSensors) (uint32, gonvml.Return) { return st.tempC, ret("GetTemperature") }
	d.GetPowerUsageFunc = func() (uint32, gonvml.Return) { return st.powerMW, ret("GetPowerUsage") }
	d.GetCurrentClocksEventReasonsFunc = func() (uint64, gonvml.Return) {
		return st.reasons, ret("GetCurrentClocksEventReasons")
	}
	d.GetCurrentClocksThrottleReasonsFunc = func() (uint64, gonvml.Return) {
		return st.reasons, ret("GetCurrentClocksThrottleReasons")
	}
	d.GetViolationStatusFunc = func(p gonvml.PerfPolicyType) (gonvml.ViolationTime, gonvml.Return) {
		rv := ret("GetViolationStatus")
		ns, ok := st.viol[p]
		if rv == gonvml.SUCCESS && !ok {
			rv = gonvml.ERROR_NOT_SUPPORTED
		}
		return gonvml.ViolationTime{ReferenceTime: uint64(time.Now().UnixMicro()), ViolationTime: ns}, rv
	}
	d.GetTotalEccErrorsFunc = func(t gonvml.MemoryErrorType, c gonvml.EccCounterType) (uint64, gonvml.Return) {
		if t != gonvml.MEMORY_ERROR_TYPE_UNCORRECTED || c != gonvml.VOLATILE_ECC {
			return 0, gonvml.ERROR_INVALID_ARGUMENT
		}
		return st.ecc, ret("GetTotalEccErrors")
	}
	d.GetRemappedRowsFunc = func() (int, int, bool, bool, gonvml.Return) {
		return 0, 0, st.remapPending, false, ret("GetRemappedRows")
	}
	d.GpmQueryDeviceSupportFunc = func() (gonvml.GpmSupport, gonvml.Return) {
		s := gonvml.GpmSupport{Version: gonvml.GPM_SUPPORT_VERSION}
		if st.gpm {
			s.IsSupportedDevice = 1
		}
		return s, ret("GpmQueryDeviceSupport")
	}
	d.GpmSampleGetFunc = func(s gonvml.GpmSample) gonvml.Return {
		if rv := ret("GpmSampleGet"); rv != gonvml.SUCCESS {
			return rv
		}
		r.mu.Lock()
		defer r.mu.Unlock()
		r.gpmAt[s] = gpmTaken{dev: i, at: time.Now()}
		return gonvml.SUCCESS
	}
	d.GetSupportedEventTypesFunc = func() (uint64, gonvml.Return) {
		if !st.xid {
			return gonvml.EventTypeSingleBitEccError, ret("GetSupportedEventTypes")
		}
		return gonvml.EventTypeXidCriticalError | gonvml.EventTypeDoubleBitEccError, ret("GetSupportedEventTypes")
	}
	d.RegisterEventsFunc = func(uint64, gonvml.EventSet) gonvml.Return { return ret("RegisterEvents") }
}

// open opens the rig's GPUs, closing them at the end of the test.
func (r *rig) open(t testing.TB, log zerolog.Logger) *GPUs {
	t.Helper()
	g, err := OpenWith(r.srv, log)
	if err != nil {
		t.Fatalf("OpenWith(mock) = %v; want nil", err)
	}
	t.Cleanup(g.Close)
	return g
}

func testLog(t testing.TB) zerolog.Logger { return zerolog.New(zerolog.NewTestWriter(t)) }

// recordingInterface returns a mock.Interface whose every method records
// its name and returns zero values; Init returns initRet.
func recordingInterface(initRet gonvml.Return) (m *mock.Interface, calls func() []string, wired int) {
	m = &mock.Interface{}
	var mu sync.Mutex
	var names []string
	v := reflect.ValueOf(m).Elem()
	for i := range v.NumField() {
		f, sf := v.Field(i), v.Type().Field(i)
		if f.Kind() != reflect.Func || !f.CanSet() {
			continue
		}
		name, ft := strings.TrimSuffix(sf.Name, "Func"), f.Type()
		f.Set(reflect.MakeFunc(ft, func([]reflect.Value) []reflect.Value {
			mu.Lock()
			names = append(names, name)
			mu.Unlock()
			out := make([]reflect.Value, ft.NumOut())
			for j := range out {
				out[j] = reflect.Zero(ft.Out(j))
			}
			if name == "Init" {
				out[0] = reflect.ValueOf(initRet)
			}
			return out
		}))
		wired++
	}
	return m, func() []string { mu.Lock(); defer mu.Unlock(); return slices.Clone(names) }, wired
}

func TestOpenInitFailureMakesNoOtherCall(t *testing.T) {
	tests := []struct {
		ret  gonvml.Return
		want string
	}{
		{gonvml.ERROR_LIBRARY_NOT_FOUND, "libnvidia-ml.so.1 not found"},
		{gonvml.ERROR_DRIVER_NOT_LOADED, "driver is not loaded"},
		{gonvml.ERROR_LIB_RM_VERSION_MISMATCH, "differ in version"},
		{gonvml.ERROR_NO_PERMISSION, "no permission"},
		{gonvml.Return(9999), "NVML return code 9999"},
	}
	for _, tc := range tests {
		t.Run(tc.want, func(t *testing.T) {
			lib, calls, wired := recordingInterface(tc.ret)
			if wired < 300 {
				t.Fatalf("recordingInterface wired %d methods; want every method of mock.Interface (> 300)", wired)
			}
			g, err := OpenWith(lib, testLog(t))
			if g != nil || !errors.Is(err, ErrUnavailable) || !strings.Contains(err.Error(), tc.want) {
				t.Errorf("OpenWith(Init = %d) = %v, %v; want nil and ErrUnavailable saying %q", tc.ret, g, err, tc.want)
			}
			if got := calls(); !slices.Equal(got, []string{"Init"}) {
				t.Errorf("NVML calls after a failed Init = %q; want only [Init]", got)
			}
		})
	}
}

func TestOpenWithNil(t *testing.T) {
	if g, err := OpenWith(nil, testLog(t)); g != nil || !errors.Is(err, ErrUnavailable) {
		t.Errorf("OpenWith(nil) = %v, %v; want nil, ErrUnavailable", g, err)
	}
}

// TestOpenDefaultLibrary runs Open against whatever this host has: without
// libnvidia-ml.so.1 it must fail cleanly (not die); with it, it samples.
func TestOpenDefaultLibrary(t *testing.T) {
	g, err := Open(testLog(t))
	if err != nil {
		if !errors.Is(err, ErrUnavailable) {
			t.Fatalf("Open() = %v; want an error wrapping ErrUnavailable", err)
		}
		t.Logf("Open() = %v", err)
		return
	}
	defer g.Close()
	for _, f := range g.Facts() {
		t.Logf("facts: %+v", f)
	}
	for _, s := range g.Sample(t.Context()) {
		t.Logf("sample: GPU %d lost=%v sm=%v util=%v dram=%v bw=%v (%s) reasons=%q",
			s.Index, s.Lost, deref(s.SMClockMHz), deref(s.GPUUtilPercent), deref(s.DRAMBandwidthUtilPercent),
			deref(s.AchievedMemBandwidth), s.BandwidthSource, s.ClockEventReasons)
	}
}

func deref[T any](p *T) any {
	if p == nil {
		return nil
	}
	return *p
}

func TestOpenNoGPUs(t *testing.T) {
	srv := dgxh100.NewWithGPUs()
	r := newRig(srv, h100State())
	g, err := OpenWith(r.srv, testLog(t))
	if g != nil || !errors.Is(err, ErrUnavailable) || !strings.Contains(err.Error(), "no GPUs") {
		t.Errorf("OpenWith(0 GPUs) = %v, %v; want nil, ErrUnavailable: no GPUs", g, err)
	}
	if n := len(srv.ShutdownCalls()); n != 1 {
		t.Errorf("Shutdown calls after OpenWith(0 GPUs) = %d; want 1", n)
	}
}

func TestFacts(t *testing.T) {
	tests := []struct {
		name     string
		srv      *server.Server
		state    gpuState
		model    string
		peakGBps float64
		memGiB   uint64
	}{
		{"DGX H100", dgxh100.New(), h100State(), "NVIDIA H100 80GB HBM3", 3352, 80},
		{"DGX A100", dgxa100.New(), a100State(), "Mock NVIDIA A100-SXM4-40GB", 1555, 40},
		{"A100 80GB", dgxa100.NewWithGPUs(gpus.Multiple(2, gpus.A100_SXM4_80GB)...),
			gpuState{maxSM: 1410, maxMem: 1593, busWidth: 5120}, "NVIDIA A100-SXM4-80GB", 2039, 80},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			r := newRig(tc.srv, tc.state)
			g := r.open(t, testLog(t))
			facts := g.Facts()
			if len(facts) != len(r.devs) {
				t.Fatalf("len(Facts()) = %d; want %d", len(facts), len(r.devs))
			}
			for i, f := range facts {
				if f.Index != i || f.UUID != r.devs[i].UUID || f.Name != tc.model || f.MIG {
					t.Errorf("Facts()[%d] = %+v; want index %d, UUID %q, name %q, no MIG", i, f, i, r.devs[i].UUID, tc.model)
				}
				if math.Abs(f.PeakMemBandwidth/1e9-tc.peakGBps)/tc.peakGBps > 0.001 {
					t.Errorf("Facts()[%d].PeakMemBandwidth = %.0f GB/s; want %v", i, f.PeakMemBandwidth/1e9, tc.peakGBps)
				}
				if f.MemoryTotalBytes != tc.memGiB<<30 {
					t.Errorf("Facts()[%d].MemoryTotalBytes = %d; want %d GiB", i, f.MemoryTotalBytes, tc.memGiB)
				}
			}
			facts[0].Name = "changed"
			if g.Facts()[0].Name != tc.model {
				t.Errorf("Facts() returned its own slice; want a copy")
			}
		})
	}
}

func TestSampleReadsEveryMetric(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		r := newRig(dgxh100.New(), h100State())
		r.gpus[1].reasons = 0x4 | 0x40
		r.gpus[2].ecc, r.gpus[2].remapPending = 2, true
		g := r.open(t, testLog(t))
		samples := g.Sample(t.Context())
		if len(samples) != 8 {
			t.Fatalf("len(Sample()) = %d; want 8", len(samples))
		}
		s := samples[1]
		checks := []struct {
			name string
			got  any
			want any
		}{
			{"Index", s.Index, 1},
			{"UUID", s.UUID, r.devs[1].UUID},
			{"At", s.At, time.Now()},
			{"Lost", s.Lost, false},
			{"SMClockMHz", deref(s.SMClockMHz), uint32(1755)},
			{"MemClockMHz", deref(s.MemClockMHz), uint32(2619)},
			{"GPUUtilPercent", deref(s.GPUUtilPercent), 98.0},
			{"MemUtilPercent", deref(s.MemUtilPercent), 60.0},
			{"DRAMBandwidthUtilPercent", deref(s.DRAMBandwidthUtilPercent), 70.0},
			{"BandwidthSource", s.BandwidthSource, BandwidthGPM},
			{"MemUsedBytes", deref(s.MemUsedBytes), uint64(30 << 30)},
			{"MemTotalBytes", deref(s.MemTotalBytes), uint64(80 << 30)},
			{"TemperatureC", deref(s.TemperatureC), 64.0},
			{"PowerW", deref(s.PowerW), 612.0},
			{"ClockEventReasons", strings.Join(s.ClockEventReasons, ","), "sw_power_cap,hw_thermal_slowdown"},
			{"ECCUncorrectedVolatile", deref(s.ECCUncorrectedVolatile), uint64(0)},
			{"RemappedRowsPending", deref(s.RemappedRowsPending), false},
			{"RowRemapFailed", deref(s.RowRemapFailed), false},
			{"samples[2].ECCUncorrectedVolatile", deref(samples[2].ECCUncorrectedVolatile), uint64(2)},
			{"samples[2].RemappedRowsPending", deref(samples[2].RemappedRowsPending), true},
		}
		for _, c := range checks {
			if !reflect.DeepEqual(c.got, c.want) {
				t.Errorf("Sample()[1].%s = %v; want %v", c.name, c.got, c.want)
			}
		}
		wantBW := 0.70 * PeakMemBandwidth(2619, 5120)
		if s.AchievedMemBandwidth == nil || math.Abs(*s.AchievedMemBandwidth-wantBW) > 1 {
			t.Errorf("Sample()[1].AchievedMemBandwidth = %v; want %v", deref(s.AchievedMemBandwidth), wantBW)
		}
		// The reasons of one GPU must not be overwritten by the next.
		samples[1].ClockEventReasons = append(samples[1].ClockEventReasons, "x")
		if got := samples[2].ClockEventReasons; !slices.Equal(got, []string{"sw_power_cap"}) {
			t.Errorf("Sample()[2].ClockEventReasons = %q after appending to [1]'s; want [sw_power_cap]", got)
		}
	})
}

func TestSampleGPMWaitsMoreThan100ms(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		r := newRig(dgxh100.New(), h100State())
		g := r.open(t, testLog(t))
		ctx := t.Context()

		ticks := []struct {
			name     string
			before   time.Duration // time passing before the call
			wantWait time.Duration
			wantGap  time.Duration // between the two GPM samples used
		}{
			{"first call takes two samples 200 ms apart (nvml.h: more than 100 ms)", 0, 200 * time.Millisecond, 200 * time.Millisecond},
			{"later call reuses the previous sample", 10 * time.Second, 0, 10 * time.Second},
			{"call 30 ms later waits the rest", 30 * time.Millisecond, 170 * time.Millisecond, 200 * time.Millisecond},
		}
		for _, tc := range ticks {
			advance(tc.before)
			r.gpus[0].dramUtil += 1
			r.mu.Lock()
			r.intervals = nil
			r.mu.Unlock()
			start := time.Now()
			samples := g.Sample(ctx)
			if got := time.Since(start); got != tc.wantWait {
				t.Errorf("%s: Sample() took %v; want %v", tc.name, got, tc.wantWait)
			}
			if got := deref(samples[0].DRAMBandwidthUtilPercent); got != r.gpus[0].dramUtil {
				t.Errorf("%s: Sample()[0].DRAMBandwidthUtilPercent = %v; want %v", tc.name, got, r.gpus[0].dramUtil)
			}
			r.mu.Lock()
			gaps := slices.Clone(r.intervals)
			r.mu.Unlock()
			if len(gaps) != 8 || slices.ContainsFunc(gaps, func(d time.Duration) bool { return d != tc.wantGap }) {
				t.Errorf("%s: GPM sample gaps = %v; want 8 × %v", tc.name, gaps, tc.wantGap)
			}
		}
	})
}

func TestSampleGPMWaitEndsWithContext(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		r := newRig(dgxh100.New(), h100State())
		g := r.open(t, testLog(t))
		ctx, cancel := context.WithTimeout(t.Context(), 40*time.Millisecond)
		defer cancel()
		start := time.Now()
		samples := g.Sample(ctx)
		if got := time.Since(start); got != 40*time.Millisecond {
			t.Errorf("Sample(ctx ending at 40 ms) took %v; want 40ms", got)
		}
		if samples[0].DRAMBandwidthUtilPercent != nil || samples[0].AchievedMemBandwidth != nil || samples[0].BandwidthSource != "" ||
			samples[0].SMClockMHz == nil {
			t.Errorf("Sample(ctx ending) = DRAM %v, source %q, SM %v; want no GPM, no bandwidth, clocks",
				deref(samples[0].DRAMBandwidthUtilPercent), samples[0].BandwidthSource, deref(samples[0].SMClockMHz))
		}
		advance(time.Second)
		samples = g.Sample(t.Context())
		if samples[0].DRAMBandwidthUtilPercent == nil || time.Since(start) != 40*time.Millisecond+time.Second {
			t.Errorf("Sample() after an interrupted one = DRAM %v at %v; want GPM from the kept sample, no wait",
				deref(samples[0].DRAMBandwidthUtilPercent), time.Since(start))
		}
	})
}

func TestSampleWithoutGPM(t *testing.T) {
	tests := []struct {
		name    string
		srv     *server.Server
		state   gpuState
		missing string // symbol reported missing
	}{
		{"A100 has no GPM", dgxa100.New(), a100State(), ""},
		{"old driver lacks nvmlGpmMetricsGet", dgxh100.New(), h100State(), "nvmlGpmMetricsGet"},
		{"old driver lacks nvmlGpmQueryDeviceSupport", dgxh100.New(), h100State(), "nvmlGpmQueryDeviceSupport"},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			synctest.Test(t, func(t *testing.T) {
				r := newRig(tc.srv, tc.state)
				r.missing[tc.missing] = true
				g := r.open(t, testLog(t))
				start := time.Now()
				samples := g.Sample(t.Context())
				if got := time.Since(start); got != 0 {
					t.Errorf("Sample() without GPM took %v; want no wait", got)
				}
				s, f := samples[0], g.Facts()[0]
				// The duty cycle is a share of time, not bytes moved: it is reported as such, never as a bandwidth.
				if s.DRAMBandwidthUtilPercent != nil || s.BandwidthSource != "" || s.AchievedMemBandwidth != nil ||
					s.MemUtilPercent == nil || *s.MemUtilPercent != float64(tc.state.memUtil) || f.PeakMemBandwidth == 0 {
					t.Errorf("Sample()[0] = DRAM %v, bandwidth %v (%q), duty cycle %v, peak %v; want nil, nil, \"\", %d %%, a peak",
						deref(s.DRAMBandwidthUtilPercent), deref(s.AchievedMemBandwidth), s.BandwidthSource, deref(s.MemUtilPercent), f.PeakMemBandwidth, tc.state.memUtil)
				}
				if n := len(r.srv.GpmSampleAllocCalls()); n != 0 {
					t.Errorf("GpmSampleAlloc calls = %d; want 0", n)
				}
			})
		})
	}
}

func TestClockEventReasonsSymbolFallback(t *testing.T) {
	tests := []struct {
		name         string
		missing      []string
		want         []string
		wantEvent    int // calls of GetCurrentClocksEventReasons on GPU 0
		wantThrottle int // calls of GetCurrentClocksThrottleReasons on GPU 0
	}{
		{"new symbol", nil, []string{"hw_slowdown", "hw_thermal_slowdown"}, 1, 0},
		{"old driver", []string{symClocksEventReasons}, []string{"hw_slowdown", "hw_thermal_slowdown"}, 0, 1},
		{"neither", []string{symClocksEventReasons, symClocksThrottleReasons}, nil, 0, 0},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			synctest.Test(t, func(t *testing.T) {
				r := newRig(dgxh100.New(), h100State())
				for _, s := range tc.missing {
					r.missing[s] = true
				}
				r.gpus[0].reasons = 0x8 | 0x40
				g := r.open(t, testLog(t))
				got := g.Sample(t.Context())[0].ClockEventReasons
				if !slices.Equal(got, tc.want) {
					t.Errorf("Sample()[0].ClockEventReasons = %q; want %q", got, tc.want)
				}
				if n := len(r.devs[0].GetCurrentClocksEventReasonsCalls()); n != tc.wantEvent {
					t.Errorf("GetCurrentClocksEventReasons calls = %d; want %d", n, tc.wantEvent)
				}
				if n := len(r.devs[0].GetCurrentClocksThrottleReasonsCalls()); n != tc.wantThrottle {
					t.Errorf("GetCurrentClocksThrottleReasons calls = %d; want %d", n, tc.wantThrottle)
				}
			})
		})
	}
}

// TestReasonBitsMatchNVML checks our copy of nvml.h's bits against go-nvml's.
func TestReasonBitsMatchNVML(t *testing.T) {
	tests := []struct {
		bit  uint64
		want string
	}{
		{gonvml.ClocksEventReasonGpuIdle, "gpu_idle"},
		{gonvml.ClocksEventReasonApplicationsClocksSetting, "applications_clocks_setting"},
		{gonvml.ClocksEventReasonSwPowerCap, "sw_power_cap"},
		{gonvml.ClocksThrottleReasonHwSlowdown, "hw_slowdown"},
		{gonvml.ClocksEventReasonSyncBoost, "sync_boost"},
		{gonvml.ClocksEventReasonSwThermalSlowdown, "sw_thermal_slowdown"},
		{gonvml.ClocksThrottleReasonHwThermalSlowdown, "hw_thermal_slowdown"},
		{gonvml.ClocksThrottleReasonHwPowerBrakeSlowdown, "hw_power_brake_slowdown"},
		{gonvml.ClocksEventReasonDisplayClockSetting, "display_clocks_setting"},
		{gonvml.ClocksEventReasonBoardLimit, "board_limit"},
		{gonvml.ClocksEventReasonReliability, "reliability"},
	}
	all := uint64(0)
	for _, tc := range tests {
		all |= tc.bit
		if got := ClockEventReasons(tc.bit); !slices.Equal(got, []string{tc.want}) {
			t.Errorf("ClockEventReasons(%#x) = %q; want [%s]", tc.bit, got, tc.want)
		}
	}
	if all != gonvml.ClocksEventReasonAll {
		t.Errorf("known reason bits = %#x; want ClocksEventReasonAll %#x", all, gonvml.ClocksEventReasonAll)
	}
}

func TestSampleNotSupportedDropsOneMetric(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		r := newRig(dgxh100.New(), h100State())
		r.gpus[2].unsupported = map[string]bool{"GetPowerUsage": true}
		var logs bytes.Buffer
		g := r.open(t, zerolog.New(&logs).Level(zerolog.DebugLevel))
		for range 3 {
			samples := g.Sample(t.Context())
			for i, s := range samples {
				if got, want := s.PowerW == nil, i == 2; got != want {
					t.Errorf("Sample()[%d].PowerW = %v; want nil: %v", i, deref(s.PowerW), want)
				}
				if s.SMClockMHz == nil || s.TemperatureC == nil || s.AchievedMemBandwidth == nil || s.Lost {
					t.Errorf("Sample()[%d] = %+v; want every other metric", i, s)
				}
			}
			advance(time.Second)
		}
		if n := len(r.devs[2].GetPowerUsageCalls()); n != 1 {
			t.Errorf("GetPowerUsage calls on GPU 2 = %d; want 1 (not asked again)", n)
		}
		if n := strings.Count(logs.String(), `"metric":"power","message":"metric not supported on this GPU"`); n != 1 {
			t.Errorf("log lines for power not supported = %d; want 1\n%s", n, logs.String())
		}
	})
}

func TestSampleOtherErrorIsRetried(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		r := newRig(dgxh100.New(), h100State())
		var logs bytes.Buffer
		g := r.open(t, zerolog.New(&logs))
		r.devs[3].GetTemperatureFunc = func(gonvml.TemperatureSensors) (uint32, gonvml.Return) { return 0, gonvml.ERROR_UNKNOWN }
		g.Sample(t.Context())
		s := g.Sample(t.Context())[3]
		if s.TemperatureC != nil || s.PowerW == nil {
			t.Errorf("Sample()[3] = temperature %v, power %v; want nil, present", deref(s.TemperatureC), deref(s.PowerW))
		}
		if n := len(r.devs[3].GetTemperatureCalls()); n != 2 {
			t.Errorf("GetTemperature calls = %d; want 2 (retried)", n)
		}
		if n := strings.Count(logs.String(), "cannot read metric"); n != 1 {
			t.Errorf("warnings = %d; want 1\n%s", n, logs.String())
		}
	})
}

func TestSampleGPUIsLost(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		r := newRig(dgxh100.New(), h100State())
		g := r.open(t, testLog(t))
		g.Sample(t.Context())
		r.gpus[4].lost = true
		for tick := range 3 {
			advance(time.Second)
			before := r.gpus[4].calls
			samples := g.Sample(t.Context())
			for i, s := range samples {
				if s.Lost != (i == 4) {
					t.Errorf("tick %d: Sample()[%d].Lost = %v; want %v", tick, i, s.Lost, i == 4)
				}
				if i == 4 && (s.SMClockMHz != nil || s.UUID != r.devs[4].UUID) {
					t.Errorf("tick %d: lost Sample()[4] = %+v; want UUID and no metrics", tick, s)
				}
				if i != 4 && (s.SMClockMHz == nil || s.DRAMBandwidthUtilPercent == nil) {
					t.Errorf("tick %d: Sample()[%d] = %+v; want metrics", tick, i, s)
				}
			}
			calls := r.gpus[4].calls - before
			if tick == 0 && calls != 1 {
				t.Errorf("tick 0: calls to lost GPU 4 = %d; want 1 (the one that found it lost)", calls)
			}
			if tick > 0 && calls != 0 {
				t.Errorf("tick %d: calls to lost GPU 4 = %d; want 0", tick, calls)
			}
		}
		v := Verdicts(g.Facts(), g.Sample(t.Context()), 0)
		if !v[4].Degraded || v[3].Degraded {
			t.Errorf("Verdicts: GPU 4 degraded %v, GPU 3 degraded %v; want true, false", v[4].Degraded, v[3].Degraded)
		}
	})
}

func TestOpenWithLostGPU(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		r := newRig(dgxh100.New(), h100State())
		r.gpus[1].lost = true
		g := r.open(t, testLog(t))
		if n := len(g.Facts()); n != 8 {
			t.Fatalf("len(Facts()) = %d; want 8 (lost GPU kept)", n)
		}
		before := r.gpus[1].calls
		samples := g.Sample(t.Context())
		if !samples[1].Lost || samples[0].Lost || r.gpus[1].calls != before {
			t.Errorf("Sample() = lost %v/%v, %d calls to GPU 1; want true/false, none", samples[1].Lost, samples[0].Lost, r.gpus[1].calls-before)
		}
	})
}

func TestMIGSamplesParent(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		srv := dgxh100.New()
		parent := srv.Devices[1].(*server.Device)
		parent.SetMigMode(gonvml.DEVICE_MIG_ENABLE)
		info, _ := parent.GetGpuInstanceProfileInfo(gonvml.GPU_INSTANCE_PROFILE_3_SLICE)
		if _, ret := parent.CreateGpuInstance(&info); ret != gonvml.SUCCESS {
			t.Fatalf("CreateGpuInstance = %v", ret)
		}
		r := newRig(srv, h100State())
		// In MIG mode NVML has no whole-GPU utilisation.
		r.gpus[1].unsupported = map[string]bool{"GetUtilizationRates": true}
		var logs bytes.Buffer
		g := r.open(t, zerolog.New(&logs))
		for range 2 {
			samples := g.Sample(t.Context())
			s := samples[1]
			if s.UUID != parent.UUID || s.SMClockMHz == nil || s.DRAMBandwidthUtilPercent == nil || s.GPUUtilPercent != nil {
				t.Errorf("Sample()[1] = UUID %q, SM %v, DRAM %v, util %v; want the parent %q with clocks and GPM, no util",
					s.UUID, deref(s.SMClockMHz), deref(s.DRAMBandwidthUtilPercent), deref(s.GPUUtilPercent), parent.UUID)
			}
			advance(time.Second)
		}
		facts := g.Facts()
		if !facts[1].MIG || facts[0].MIG {
			t.Errorf("Facts()[0,1].MIG = %v, %v; want false, true", facts[0].MIG, facts[1].MIG)
		}
		if n := strings.Count(logs.String(), "MIG mode is on"); n != 1 {
			t.Errorf("MIG log lines = %d; want 1\n%s", n, logs.String())
		}
	})
}

func TestRunEventsCountsXIDs(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		r := newRig(dgxh100.New(), h100State())
		r.gpus[5].xid = false
		g := r.open(t, testLog(t))
		ctx, cancel := context.WithCancel(t.Context())
		done := make(chan error)
		go func() { done <- g.RunEvents(ctx) }()

		xid := func(dev int, id uint64) {
			r.events <- gonvml.EventData{Device: r.devs[dev], EventType: gonvml.EventTypeXidCriticalError, EventData: id}
		}
		xid(2, 48)
		xid(2, 79)
		xid(3, 13) // an application's fault: not counted
		xid(4, 63) // recoverable: counted for an hour
		xid(4, 94)
		r.events <- gonvml.EventData{Device: r.devs[6], EventType: gonvml.EventTypeDoubleBitEccError}
		advance(time.Second)
		synctest.Wait()

		samples := g.Sample(t.Context())
		want := map[int][4]uint64{2: {2, 79, 0, 0}, 4: {0, 0, 2, 94}}
		for i, s := range samples {
			if got := [4]uint64{s.XIDCritical, s.LastXID, s.XIDRecoverable, s.LastRecoverableXID}; got != want[i] {
				t.Errorf("Sample()[%d] XIDCritical, LastXID, XIDRecoverable, LastRecoverableXID = %v; want %v", i, got, want[i])
			}
		}
		// An hour after the last recoverable XID it no longer counts; a fatal one still does.
		advance(XIDDecay)
		samples = g.Sample(t.Context())
		if s := samples[4]; s.XIDRecoverable != 0 || s.LastRecoverableXID != 0 {
			t.Errorf("an hour later, Sample()[4] recoverable XIDs = %d (last %d); want none", s.XIDRecoverable, s.LastRecoverableXID)
		}
		if s := samples[2]; s.XIDCritical != 2 {
			t.Errorf("an hour later, Sample()[2].XIDCritical = %d; want 2 (fatal XIDs need a reset)", s.XIDCritical)
		}
		if n := len(r.devs[5].RegisterEventsCalls()); n != 0 {
			t.Errorf("RegisterEvents on a GPU without XID events: %d calls; want 0", n)
		}

		cancel()
		start := time.Now()
		if err := <-done; err != nil {
			t.Errorf("RunEvents() = %v; want nil", err)
		}
		if got := time.Since(start); got > eventWait {
			t.Errorf("RunEvents returned %v after cancel; want ≤ %v", got, eventWait)
		}
		r.mu.Lock()
		defer r.mu.Unlock()
		if r.setFreed != 1 {
			t.Errorf("event set freed %d times; want 1", r.setFreed)
		}
	})
}

func TestRunEventsNotSupported(t *testing.T) {
	tests := []struct {
		name  string
		setup func(r *rig)
	}{
		{"no event set", func(r *rig) {
			r.srv.EventSetCreateFunc = func() (gonvml.EventSet, gonvml.Return) { return nil, gonvml.ERROR_NOT_SUPPORTED }
		}},
		{"no GPU has XID events", func(r *rig) {
			for _, st := range r.gpus {
				st.xid = false
			}
		}},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			synctest.Test(t, func(t *testing.T) {
				r := newRig(dgxh100.New(), h100State())
				tc.setup(r)
				var logs bytes.Buffer
				g := r.open(t, zerolog.New(&logs))
				start := time.Now()
				if err := g.RunEvents(t.Context()); err != nil || time.Since(start) != 0 {
					t.Errorf("RunEvents() = %v after %v; want nil at once", err, time.Since(start))
				}
				if n := strings.Count(logs.String(), "not counting XID errors"); n != 1 {
					t.Errorf("log lines = %d; want 1\n%s", n, logs.String())
				}
			})
		})
	}
}

func TestRunEventsWaitErrorBacksOff(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		r := newRig(dgxh100.New(), h100State())
		waits := 0
		r.srv.EventSetCreateFunc = func() (gonvml.EventSet, gonvml.Return) {
			return &mock.EventSet{
				WaitFunc: func(uint32) (gonvml.EventData, gonvml.Return) {
					waits++
					return gonvml.EventData{}, gonvml.ERROR_UNKNOWN
				},
				FreeFunc: func() gonvml.Return { return gonvml.SUCCESS },
			}, gonvml.SUCCESS
		}
		g := r.open(t, testLog(t))
		ctx, cancel := context.WithTimeout(t.Context(), 10*time.Second+time.Millisecond)
		defer cancel()
		if err := g.RunEvents(ctx); err != nil {
			t.Errorf("RunEvents() = %v; want nil", err)
		}
		if waits != 11 {
			t.Errorf("EventSetWait calls in 10 s of errors = %d; want 11 (one a second)", waits)
		}
	})
}

func TestClose(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		r := newRig(dgxh100.New(), h100State())
		g, err := OpenWith(r.srv, testLog(t))
		if err != nil {
			t.Fatal(err)
		}
		g.Sample(t.Context())
		g.Close()
		g.Close()
		if n := len(r.srv.ShutdownCalls()); n != 1 {
			t.Errorf("Shutdown calls after two Close = %d; want 1", n)
		}
		r.mu.Lock()
		freed := r.gpmFreed
		r.mu.Unlock()
		if freed != 16 {
			t.Errorf("GPM samples freed = %d; want 16", freed)
		}
		if s := g.Sample(t.Context()); s != nil {
			t.Errorf("Sample() after Close = %v; want nil", s)
		}
		if err := g.RunEvents(t.Context()); err != nil {
			t.Errorf("RunEvents() after Close = %v; want nil", err)
		}
		if n := len(r.srv.EventSetCreateCalls()); n != 0 {
			t.Errorf("EventSetCreate calls after Close = %d; want 0", n)
		}
	})
}

func TestCloseStopsRunEvents(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		r := newRig(dgxh100.New(), h100State())
		g, err := OpenWith(r.srv, testLog(t))
		if err != nil {
			t.Fatal(err)
		}
		done := make(chan error)
		go func() { done <- g.RunEvents(t.Context()) }()
		synctest.Wait()
		g.Close()
		if err := <-done; err != nil {
			t.Errorf("RunEvents() after Close = %v; want nil", err)
		}
		r.mu.Lock()
		defer r.mu.Unlock()
		if r.setFreed != 0 {
			t.Errorf("event set freed %d times after Shutdown; want 0 (Shutdown frees it)", r.setFreed)
		}
	})
}

func TestNilGPUs(t *testing.T) {
	var g *GPUs
	if g.Facts() != nil || g.Sample(t.Context()) != nil || g.RunEvents(t.Context()) != nil {
		t.Errorf("nil *GPUs methods returned something; want nil")
	}
	g.Close()
}

// BenchmarkSampleTick samples the 8 GPUs of a DGX H100 mock with GPM on.
// The mock's call recording allocates too, so allocs/gpu is an upper bound.
func BenchmarkSampleTick(b *testing.B) {
	r := newRig(dgxh100.New(), h100State())
	g := r.open(b, zerolog.Nop())
	clock := time.Unix(1_700_000_000, 0)
	g.now = func() time.Time { clock = clock.Add(time.Second); return clock } // no GPM wait
	ctx := b.Context()
	g.Sample(ctx)
	n := len(g.Facts())
	b.ReportAllocs()
	var m0, m1 runtime.MemStats
	runtime.ReadMemStats(&m0)
	for b.Loop() {
		g.Sample(ctx)
	}
	runtime.ReadMemStats(&m1)
	b.ReportMetric(float64(b.Elapsed().Nanoseconds())/float64(b.N*n), "ns/gpu")
	b.ReportMetric(float64(m1.Mallocs-m0.Mallocs)/float64(b.N*n), "allocs/gpu")
}

// advance moves a synctest bubble's fake clock on by d (the bubble's goroutines run until they
// are durably blocked, and the timers due by then fire); no real time passes. Use it only inside
// synctest.Test.
func advance(d time.Duration) { <-time.After(d) }

// TestSampleClockEventTimes: NVML's cumulative counters become per-window shares; a policy NVML does
// not support is left out and not asked again; a counter that goes backwards (a driver reload)
// starts over.
func TestSampleClockEventTimes(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		r := newRig(dgxh100.New(), h100State())
		for _, st := range r.gpus {
			st.viol = map[gonvml.PerfPolicyType]uint64{
				gonvml.PERF_POLICY_POWER: uint64(time.Hour), gonvml.PERF_POLICY_THERMAL: 0, gonvml.PERF_POLICY_SYNC_BOOST: 0,
			}
		}
		g := r.open(t, testLog(t))
		check := func(step string, got []ClockEventTime, want []ClockEventTime) {
			t.Helper()
			if len(got) != len(want) {
				t.Fatalf("%s: ClockEventTimes = %+v; want %+v", step, got, want)
			}
			for i := range want {
				if got[i].Reason != want[i].Reason || got[i].Total != want[i].Total || got[i].Window != want[i].Window ||
					math.Abs(got[i].Share-want[i].Share) > 1e-9 {
					t.Errorf("%s: ClockEventTimes[%d] = %+v; want %+v", step, i, got[i], want[i])
				}
			}
		}
		s := g.Sample(t.Context()) // waits out the first GPM window: 200 ms
		check("first sample", s[0].ClockEventTimes, []ClockEventTime{
			{Reason: "sw_power_cap", Total: time.Hour}, {Reason: "sw_thermal_slowdown"}, {Reason: "sync_boost"},
		})

		advance(5 * time.Second)
		st := r.gpus[0]
		st.viol[gonvml.PERF_POLICY_POWER] += uint64(5 * time.Second)
		st.viol[gonvml.PERF_POLICY_THERMAL] += uint64(2 * time.Second)
		s = g.Sample(t.Context())
		check("after 5 s", s[0].ClockEventTimes, []ClockEventTime{
			{Reason: "sw_power_cap", Total: time.Hour + 5*time.Second, Window: 5 * time.Second, Share: 1},
			{Reason: "sw_thermal_slowdown", Total: 2 * time.Second, Window: 5 * time.Second, Share: 0.4},
			{Reason: "sync_boost", Window: 5 * time.Second},
		})

		advance(5 * time.Second)
		st.viol[gonvml.PERF_POLICY_THERMAL] = uint64(time.Second) // the driver was reloaded
		s = g.Sample(t.Context())
		check("after a reload", s[0].ClockEventTimes, []ClockEventTime{
			{Reason: "sw_power_cap", Total: time.Hour + 5*time.Second, Window: 5 * time.Second},
			{Reason: "sw_thermal_slowdown", Total: time.Second},
			{Reason: "sync_boost", Window: 5 * time.Second},
		})

		// 3 samples × 5 policies asked, the 2 unsupported ones only on the first.
		if n := len(r.devs[0].GetViolationStatusCalls()); n != 3+3+3+2 {
			t.Errorf("GetViolationStatus calls on GPU 0 = %d; want 11 (unsupported policies asked once)", n)
		}
	})
}

func TestSampleWithoutClockEventCounters(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		r := newRig(dgxa100.New(), a100State()) // viol nil: no policy supported
		g := r.open(t, testLog(t))
		for range 3 {
			if s := g.Sample(t.Context()); s[0].ClockEventTimes != nil || s[0].SMClockMHz == nil {
				t.Errorf("Sample()[0].ClockEventTimes = %+v, SM %v; want nil, a clock", s[0].ClockEventTimes, deref(s[0].SMClockMHz))
			}
			advance(time.Second)
		}
		if n := len(r.devs[0].GetViolationStatusCalls()); n != len(violationPolicies) {
			t.Errorf("GetViolationStatus calls = %d; want %d (each policy once)", n, len(violationPolicies))
		}
	})
}
