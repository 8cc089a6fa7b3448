package main

import (
	"bytes"
	"cmp"
	"context"
	"errors"
	"fmt"
	"math"
	"os"
	"path/filepath"
	"reflect"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/rs/zerolog"

	"github.com/spotguard/spotguard/nvml"
	"github.com/spotguard/spotguard/nvml/cuda"
)

// h200s are n H200s as NVML sees them, with UUIDs GPU-0000000i-1111-2222-3333-444444444444 and
// a peak of 4800 GB/s.
func h200s(n int) []nvml.Facts {
	var out []nvml.Facts
	for i := range n {
		out = append(out, nvml.Facts{Index: i, UUID: testUUID(i), Name: "NVIDIA H200",
			MaxSMClockMHz: 1980, MaxMemClockMHz: 3201, PeakMemBandwidth: 4800e9})
	}
	return out
}

func testUUID(i int) string { return fmt.Sprintf("GPU-%08x-1111-2222-3333-444444444444", i) }

// probed is what the probe measured of the GPUs whose UUIDs are given, at these GB/s, in CUDA's
// order, on Hopper (9.0), copying from t0 to t0+1.5s.
func probed(t0 time.Time, uuids []string, gbps ...float64) cuda.Results {
	res := cuda.Results{DriverVersion: 12040, Bytes: 1 << 30, Duration: 1500 * time.Millisecond, Elapsed: 2 * time.Second}
	for i, g := range gbps {
		secs := 1.5
		res.Devices = append(res.Devices, cuda.DeviceResult{
			Device: cuda.DeviceInfo{Ordinal: i, UUID: uuids[i], Name: "NVIDIA H200", Major: 9, Minor: 0},
			Bytes:  1 << 30, Copies: int(g * 1e9 * secs / (2 << 30)), Seconds: secs, BytesPerSecond: g * 1e9,
			Setup: 500 * time.Millisecond, Start: t0, End: t0.Add(1500 * time.Millisecond),
		})
	}
	return res
}

// uuids are the UUIDs of NVML GPUs idx, in that order.
func uuids(idx ...int) []string {
	var out []string
	for _, i := range idx {
		out = append(out, testUUID(i))
	}
	return out
}

// sampleAt is a sample of NVML GPU i at t, at the SM clock sm with the given reasons.
func sampleAt(i int, t time.Time, sm uint32, reasons ...string) nvml.Sample {
	util := 100.0
	mem := uint32(3201)
	return nvml.Sample{Index: i, UUID: testUUID(i), At: t, SMClockMHz: &sm, MemClockMHz: &mem, GPUUtilPercent: &util, ClockEventReasons: reasons}
}

// quiet are samples of GPUs 0 to n-1 with nothing to say.
func quiet(n int, t time.Time) []nvml.Sample {
	var out []nvml.Sample
	for i := range n {
		out = append(out, sampleAt(i, t, 1980))
	}
	return out
}

// verdictOf is a short form of one GPU's verdict, for comparing: "healthy", or the rules fired,
// or "error" when it could not be probed.
func verdictOf(g probeGPU) string {
	switch {
	case g.Degraded:
		return strings.Join(g.Rules, ",")
	case g.Error != "":
		return "error"
	}
	return "healthy"
}

// judgeProbe's verdicts: peers of the same model when there are any (the other GPUs' median),
// else peak × the architecture's copy efficiency; slowdown reasons only from the samples taken
// while the copies ran; XIDs, ECC and the rest of nvml's immediate rules from the sample after.
func TestJudgeProbe(t *testing.T) {
	t0 := time.Date(2026, 12, 1, 0, 0, 0, 0, time.UTC)
	during, before, after := t0.Add(500*time.Millisecond), t0.Add(-time.Second), t0.Add(2*time.Second)
	withFinal := func(n int, edit func(s []nvml.Sample)) []nvml.Sample {
		s := quiet(n, after)
		edit(s)
		return s
	}
	for _, tt := range []struct {
		name   string
		facts  []nvml.Facts
		res    cuda.Results
		ticks  [][]nvml.Sample
		final  []nvml.Sample
		want   []string // verdictOf per GPU, in the report's order
		exit   int
		reason string // in the reasons of the first degraded GPU
	}{
		{
			name: "healthy", facts: h200s(4), res: probed(t0, uuids(0, 1, 2, 3), 3900, 3910, 3890, 3905),
			want: []string{"healthy", "healthy", "healthy", "healthy"}, exit: exitOK,
		},
		{
			name: "one of four 17 % slow", facts: h200s(4), res: probed(t0, uuids(0, 1, 2, 3), 3000, 3000, 2500, 3000),
			want: []string{"healthy", "healthy", ruleProbePeers, "healthy"}, exit: exitGPUDegraded,
			reason: "achieved 2500 GB/s is 17 % below the median of the 3 other NVIDIA H200 (3000 GB/s): replace the instance",
		},
		{
			name: "matched by UUID, not by order", facts: h200s(4), res: probed(t0, uuids(3, 2, 1, 0), 3000, 3000, 2500, 3000),
			want: []string{"healthy", ruleProbePeers, "healthy", "healthy"}, exit: exitGPUDegraded,
		},
		{
			name: "two GPUs, one 13 % slower", facts: h200s(2), res: probed(t0, uuids(0, 1), 3000, 2600),
			want: []string{"healthy", ruleProbePeers}, exit: exitGPUDegraded, reason: "13 % below the median of the 1 other",
		},
		{
			name: "two GPUs within the threshold", facts: h200s(2), res: probed(t0, uuids(0, 1), 3000, 2800),
			want: []string{"healthy", "healthy"}, exit: exitOK,
		},
		{
			name: "one GPU near peak × efficiency", facts: h200s(1), res: probed(t0, uuids(0), 3500),
			want: []string{"healthy"}, exit: exitOK,
		},
		{
			name: "one GPU far below peak × efficiency", facts: h200s(1), res: probed(t0, uuids(0), 3400),
			want: []string{ruleProbePeak}, exit: exitGPUDegraded,
			reason: "achieved 3400 GB/s is 11 % below 3840 GB/s, its peak 4800 GB/s × 0.80 (Hopper's assumed copy efficiency)",
		},
		{
			name: "fatal XID during the probe", facts: h200s(2), res: probed(t0, uuids(0, 1), 3000, 3000),
			final: withFinal(2, func(s []nvml.Sample) { s[1].XIDCritical, s[1].LastXID = 1, 79 }),
			want:  []string{"healthy", nvml.RuleXIDCritical}, exit: exitGPUDegraded, reason: "1 critical XID errors (last XID 79)",
		},
		{
			name: "recoverable XID during the probe", facts: h200s(2), res: probed(t0, uuids(0, 1), 3000, 3000),
			final: withFinal(2, func(s []nvml.Sample) { s[0].XIDRecoverable, s[0].LastRecoverableXID = 1, 94 }),
			want:  []string{nvml.RuleXIDRecoverable, "healthy"}, exit: exitGPUDegraded,
		},
		{
			name: "uncorrected ECC", facts: h200s(2), res: probed(t0, uuids(0, 1), 3000, 3000),
			final: withFinal(2, func(s []nvml.Sample) { n := uint64(2); s[0].ECCUncorrectedVolatile = &n }),
			want:  []string{nvml.RuleECCUncorrected, "healthy"}, exit: exitGPUDegraded,
		},
		{
			name: "slowdown while the copies ran", facts: h200s(2), res: probed(t0, uuids(0, 1), 3000, 3000),
			ticks: [][]nvml.Sample{
				{sampleAt(0, during, 1980, "sw_power_cap"), sampleAt(1, during, 1500, "hw_thermal_slowdown")},
				{sampleAt(0, during, 1980), sampleAt(1, during, 1700, "hw_thermal_slowdown", "sw_power_cap")},
			},
			want: []string{"healthy", nvml.RuleSlowdown}, exit: exitGPUDegraded,
			reason: "hw_thermal_slowdown held the SM clock below its max in 2 of 2 samples while the copies ran (SM clock min 1500, max 1980 MHz)",
		},
		{
			name: "slowdown before the copies, or at max clock, or sw_power_cap", facts: h200s(2), res: probed(t0, uuids(0, 1), 3000, 3000),
			ticks: [][]nvml.Sample{
				{sampleAt(0, before, 1200, "hw_slowdown"), sampleAt(1, after, 1200, "hw_slowdown")},
				{sampleAt(0, during, 1980, "hw_slowdown"), sampleAt(1, during, 1800, "sw_power_cap")},
			},
			want: []string{"healthy", "healthy"}, exit: exitOK,
		},
		{
			name: "GPUs hidden from CUDA are not probed", facts: h200s(4), res: probed(t0, uuids(1, 3), 3000, 2500),
			want: []string{"healthy", "healthy", "healthy", ruleProbePeers}, exit: exitGPUDegraded,
		},
		{
			name: "a CUDA device NVML does not show", facts: h200s(1),
			res:  probed(t0, []string{testUUID(0), "GPU-ffffffff-1111-2222-3333-444444444444"}, 3800, 3800),
			want: []string{"healthy", "error"}, exit: exitFail,
		},
		{
			name: "a GPU whose probe failed", facts: h200s(4),
			res: func() cuda.Results {
				r := probed(t0, uuids(0, 1, 2, 3), 3000, 3000, 3000, 0)
				r.Devices[3].Err = &cuda.Error{Call: "cuMemAlloc_v2", Result: cuda.ErrorOutOfMemory, Name: "CUDA_ERROR_OUT_OF_MEMORY"}
				return r
			}(),
			want: []string{"healthy", "healthy", "healthy", "error"}, exit: exitFail,
		},
		{
			name: "MIG is not judged on bandwidth",
			facts: func() []nvml.Facts {
				f := h200s(2)
				f[1].MIG = true
				return f
			}(),
			res:  probed(t0, uuids(0, 1), 3800, 1000),
			want: []string{"healthy", "healthy"}, exit: exitOK,
		},
	} {
		t.Run(tt.name, func(t *testing.T) {
			rep := judgeProbe(tt.facts, tt.res, tt.ticks, tt.final, 0.10)
			var got []string
			for _, g := range rep.GPUs {
				got = append(got, verdictOf(g))
			}
			if !slices.Equal(got, tt.want) || probeExit(rep) != tt.exit || rep.Healthy != (tt.exit != exitGPUDegraded) {
				t.Fatalf("Got(%q) = %v, exit %d, healthy %v; want %v, exit %d\n%+v", tt.name, got, probeExit(rep), rep.Healthy, tt.want, tt.exit, rep.GPUs)
			}
			if tt.reason == "" {
				return
			}
			for _, g := range rep.GPUs {
				if g.Degraded {
					if !strings.Contains(strings.Join(g.Reasons, "\n"), tt.reason) {
						t.Errorf("Got(%q) reasons = %q; want %q", tt.name, g.Reasons, tt.reason)
					}
					return
				}
			}
		})
	}
}

// The report says, per GPU, what it is compared with, the clocks and reasons of the samples
// taken while its copies ran (only those), and what could not be judged and why.
func TestJudgeProbeReportsWhatItSaw(t *testing.T) {
	t0 := time.Date(2026, 12, 1, 0, 0, 0, 0, time.UTC)
	facts := h200s(3)
	facts[2].Name = "NVIDIA A100-SXM4-80GB"
	res := probed(t0, uuids(0, 1, 2), 3900, 3800, 1600)
	res.Devices[2].Device.Major = 6 // no copy efficiency known
	ticks := [][]nvml.Sample{
		{sampleAt(0, t0.Add(-time.Second), 300, "gpu_idle")},
		{sampleAt(0, t0.Add(time.Second), 1900, "sw_power_cap"), sampleAt(2, t0.Add(time.Second), 1400)},
		{sampleAt(0, t0.Add(1200*time.Millisecond), 1980)},
		{sampleAt(0, t0.Add(1400*time.Millisecond), 1700, "sw_power_cap")},
	}
	rep := judgeProbe(facts, res, ticks, nil, 0)
	if rep.Threshold != nvml.DefaultThreshold || rep.CUDADriver != "12.4" || rep.Mode != "probe" {
		t.Errorf("Got(report) = threshold %v, driver %q, mode %q; want %v, 12.4, probe", rep.Threshold, rep.CUDADriver, rep.Mode, nvml.DefaultThreshold)
	}
	g := rep.GPUs[0]
	if g.Samples != 3 || *g.SMClockMHz != (clocks{Min: 1700, Median: 1900, Max: 1980}) || !slices.Equal(g.ClockEventReasons, []string{"sw_power_cap"}) {
		t.Errorf("Got(GPU 0 samples) = %d, %+v, %q; want 3 in the window, SM 1700/1900/1980, sw_power_cap", g.Samples, g.SMClockMHz, g.ClockEventReasons)
	}
	if g.Peers != 1 || *g.PeerMedianGBps != 3800 || g.ExpectedGBps != nil || math.Abs(*g.OfPeak-3900.0/4800) > 1e-9 || *g.CopyEfficiency != 0.8 || g.Architecture != "Hopper" {
		t.Errorf("Got(GPU 0) = %+v; want compared with 1 peer at 3800, of peak 0.81, Hopper at 0.8", g)
	}
	a := rep.GPUs[2]
	if a.Degraded || len(a.Unjudged) != 1 || !strings.Contains(a.Unjudged[0], "no copy efficiency is known for compute capability 6.0") || a.CopyEfficiency != nil {
		t.Errorf("Got(lone A100 of unknown architecture) = %+v; want healthy, unjudged for want of a copy efficiency", a)
	}
}

// The probe's flags are checked before anything is opened: a usage error names the flag and its
// range (exit 2).
func TestGPUProbeFlags(t *testing.T) {
	opened := false
	deps := gpuDeps{open: func(zerolog.Logger) (gpuSource, error) { opened = true; return nil, errors.New("not reached") }}
	for _, tt := range []struct {
		args []string
		want string
	}{
		{[]string{"--probe", "--probe-bytes", "1MiB"}, "--probe-bytes 1MiB: want 64 MiB to 64 GiB"},
		{[]string{"--probe", "--probe-bytes", "65GiB"}, "--probe-bytes 65GiB: want 64 MiB to 64 GiB"},
		{[]string{"--probe", "--probe-bytes", "lots"}, `--probe-bytes "lots": not a whole, positive size`},
		{[]string{"--probe", "--probe-duration", "10ms"}, "--probe-duration 10ms: want 100ms to 1m0s"},
		{[]string{"--probe", "--probe-duration", "2m"}, "--probe-duration 2m0s: want 100ms to 1m0s"},
		{[]string{"--probe-bytes", "1GiB"}, "--probe-bytes and --probe-duration need --probe"},
		{[]string{"--probe-duration", "1s"}, "--probe-bytes and --probe-duration need --probe"},
		{[]string{"--probe", "--samples", "3"}, "--samples and --interval are not used with --probe"},
		{[]string{"--probe", "--interval", "2s"}, "--samples and --interval are not used with --probe"},
	} {
		var stdout, stderr bytes.Buffer
		code := runGPU(t.Context(), tt.args, nil, &stdout, &stderr, deps)
		if code != exitUsage || !strings.HasPrefix(stderr.String(), "spotguard gpu: "+tt.want) || stdout.Len() != 0 {
			t.Errorf("Got(%q) = %d, %q; want %d and %q", tt.args, code, stderr.String(), exitUsage, tt.want)
		}
	}
	if opened {
		t.Errorf("Got(NVML opened) = true; want the flags refused first")
	}
}

// No CUDA driver: exit 4 with the reason, in JSON too; NVML is closed.
func TestGPUProbeWithoutCUDA(t *testing.T) {
	cfg := filepath.Join(t.TempDir(), "empty.yaml")
	os.WriteFile(cfg, nil, 0o644)
	g := newFakeNVML(h200s(2))
	deps := gpuDeps{open: g.open, cudaLibrary: filepath.Join(t.TempDir(), "libcuda.so.1")}
	var stdout, stderr bytes.Buffer
	code := runGPU(t.Context(), []string{"--config", cfg, "--probe", "--json"}, nil, &stdout, &stderr, deps)
	if code != exitNoNVML || !strings.Contains(stderr.String(), "spotguard gpu: no CUDA driver: ") {
		t.Errorf("Got(--probe without libcuda) = %d, %q; want %d and the reason", code, stderr.String(), exitNoNVML)
	}
	if !strings.Contains(stdout.String(), `"off": "no CUDA driver: `) || !strings.Contains(stdout.String(), `"gpus": []`) {
		t.Errorf("Got(--probe --json without libcuda) = %s; want off with the reason and no GPUs", stdout.String())
	}
	if !g.closed.Load() {
		t.Errorf("Got(NVML closed) = false; want true")
	}
}

// fakeNVML is NVML for the probe's tests: GPUs with the given facts, sampled at their maximum
// clocks under full load unless sm and reasons say otherwise, which hear an XID (xid) as soon as
// RunEvents listens. Sample waits (10 s at most) until RunEvents listens, so that XIDs are heard
// without a race.
type fakeNVML struct {
	facts   []nvml.Facts
	sm      map[int]uint32   // SM clock by NVML index
	reasons map[int][]string // clock event reasons by NVML index
	xid     map[int]uint64   // the XID GPU i hears once RunEvents listens
	// during, when set, is called by the first Sample with the function that reads the GPUs;
	// it calls it while the probe's copies are under way.
	during func(read func())
	// late makes the Sample that called during return only once its ctx is done, as a sampler
	// that the scheduler leaves alone until the copies have ended would.
	late bool

	listening chan struct{}
	listen    sync.Once
	first     sync.Once
	heard     atomic.Bool
	closed    atomic.Bool
	samples   atomic.Int64
}

func newFakeNVML(facts []nvml.Facts) *fakeNVML {
	return &fakeNVML{facts: facts, listening: make(chan struct{})}
}

func (g *fakeNVML) open(zerolog.Logger) (gpuSource, error) { return g, nil }

func (g *fakeNVML) Facts() []nvml.Facts { return g.facts }

func (g *fakeNVML) Sample(ctx context.Context) []nvml.Sample {
	select {
	case <-g.listening:
	case <-ctx.Done():
	case <-time.After(10 * time.Second):
	}
	var out []nvml.Sample
	read := func() {
		g.samples.Add(1)
		at := time.Now()
		for _, f := range g.facts {
			sm, mem, util := cmp.Or(g.sm[f.Index], f.MaxSMClockMHz), f.MaxMemClockMHz, 100.0
			s := nvml.Sample{Index: f.Index, UUID: f.UUID, At: at, SMClockMHz: &sm, MemClockMHz: &mem, GPUUtilPercent: &util,
				ClockEventReasons: g.reasons[f.Index]}
			if xid := g.xid[f.Index]; xid != 0 && g.heard.Load() {
				s.XIDCritical, s.LastXID = 1, xid
			}
			out = append(out, s)
		}
	}
	called := false
	if g.during != nil {
		g.first.Do(func() { called = true; g.during(read) })
	}
	if !called {
		read()
	} else if g.late {
		<-ctx.Done()
	}
	return out
}

func (g *fakeNVML) RunEvents(ctx context.Context) error {
	g.heard.Store(len(g.xid) > 0)
	g.listen.Do(func() { close(g.listening) })
	<-ctx.Done()
	return nil
}

func (g *fakeNVML) Close() { g.closed.Store(true) }

// docs/gpu.md's launch-check section documents every field of `spotguard gpu --probe --json`.
func TestProbeJSONDocumented(t *testing.T) {
	b, err := os.ReadFile(filepath.Join("..", "..", "docs", "gpu.md"))
	if err != nil {
		t.Fatal(err)
	}
	_, section, ok := strings.Cut(string(b), "\n## Launch check: `spotguard gpu --probe`\n")
	if !ok {
		t.Fatal("docs/gpu.md has no section \"## Launch check: `spotguard gpu --probe`\"")
	}
	for _, typ := range []reflect.Type{reflect.TypeFor[probeReport](), reflect.TypeFor[probeGPU](), reflect.TypeFor[clocks]()} {
		for f := range typ.Fields() {
			name, _, _ := strings.Cut(f.Tag.Get("json"), ",")
			if !strings.Contains(section, "`"+name+"`") {
				t.Errorf("Got(docs/gpu.md) lacks the --json field `%s` (%s.%s)", name, typ.Name(), f.Name)
			}
		}
	}
	for _, rule := range []string{ruleProbePeers, ruleProbePeak, nvml.RuleSlowdown, nvml.RuleXIDCritical, nvml.RuleXIDRecoverable} {
		if !strings.Contains(section, "`"+rule+"`") {
			t.Errorf("Got(docs/gpu.md) lacks the rule `%s`", rule)
		}
	}
}

// A configuration that does not load is exit 1, naming each problem, before NVML is opened: a
// gpu.degraded_threshold of "5%" (or a file that is not YAML, an unknown key) was passed over,
// and the GPUs judged at the default threshold without a word (found from outside).
func TestGPURefusesAConfigurationThatDoesNotLoad(t *testing.T) {
	opened := false
	deps := gpuDeps{open: func(zerolog.Logger) (gpuSource, error) { opened = true; return nil, errors.New("not reached") }}
	dir := t.TempDir()
	notYAML, unknown, empty := filepath.Join(dir, "not.yaml"), filepath.Join(dir, "unknown.yaml"), filepath.Join(dir, "empty.yaml")
	os.WriteFile(notYAML, []byte("gpu: [\n"), 0o644)
	os.WriteFile(empty, nil, 0o644)
	os.WriteFile(unknown, []byte("gpu:\n  degraded_treshold: 0.2\n"), 0o644)
	for _, tt := range []struct {
		args []string
		want string
	}{
		{[]string{"--config", notYAML}, "not.yaml"},
		{[]string{"--config", unknown}, "degraded_treshold"},
		{[]string{"--config", empty, "--gpu.degraded_threshold", "5%"}, "gpu.degraded_threshold"},
	} {
		var stdout, stderr bytes.Buffer
		code := runGPU(t.Context(), tt.args, nil, &stdout, &stderr, deps)
		if code != exitFail || !strings.Contains(stderr.String(), tt.want) {
			t.Errorf("Got(%q) = %d, %q; want %d naming %s", tt.args, code, stderr.String(), exitFail, tt.want)
		}
	}
	if opened {
		t.Errorf("Got(NVML opened) = true; want the configuration refused first")
	}
}
