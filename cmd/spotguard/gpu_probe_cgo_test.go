//go:build linux && cgo

package main

import (
	"bytes"
	"encoding/json"
	"math"
	"os"
	"path/filepath"
	"runtime"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/spotguard/spotguard/nvml/cuda/cudatest"

	"github.com/spotguard/spotguard/nvml"
)

// fakeCUDA builds the fake CUDA driver: cudatest.FakeDriver.
func fakeCUDA(t *testing.T) string {
	t.Helper()
	return cudatest.FakeDriver(t)
}

// probeEnv sets the fake driver's environment: every FAKE_CUDA_* it reads, from env or empty.
// Each fake GPU reports 4 MiB free, so the probe copies 1 MiB buffers whatever --probe-bytes
// asks for (the fake copies in host memory).
func probeEnv(t *testing.T, env map[string]string) {
	t.Helper()
	for _, k := range []string{"FAKE_CUDA_DEVICES", "FAKE_CUDA_GBPS", "FAKE_CUDA_UUIDS", "FAKE_CUDA_NAMES", "FAKE_CUDA_CC",
		"FAKE_CUDA_MEM", "FAKE_CUDA_VERSION", "FAKE_CUDA_FAIL", "FAKE_CUDA_BARRIER", "FAKE_CUDA_PAUSE", "FAKE_CUDA_STATS"} {
		t.Setenv(k, env[k])
	}
	t.Setenv("FAKE_CUDA_FREE", "4194304")
}

// fakeH200s are n H200s as NVML sees them (testUUID(i)), with a peak of 40 GB/s: the fake
// driver's copies run at tens of GB/s, so every number is a hundredth of an H200's.
func fakeH200s(n int) []nvml.Facts {
	f := h200s(n)
	for i := range f {
		f[i].PeakMemBandwidth = 40e9
	}
	return f
}

// runProbeCLI runs `spotguard gpu --probe` with the fake NVML g and the fake driver lib.
func runProbeCLI(t *testing.T, g *fakeNVML, lib string, args ...string) (int, string, string) {
	t.Helper()
	cfg := filepath.Join(t.TempDir(), "empty.yaml")
	os.WriteFile(cfg, nil, 0o644)
	var stdout, stderr bytes.Buffer
	deps := gpuDeps{open: g.open, cudaLibrary: lib, probeSampleEvery: 2 * time.Millisecond}
	code := runGPU(t.Context(), append([]string{"--config", cfg, "--probe", "--probe-duration", "100ms"}, args...), nil, &stdout, &stderr, deps)
	if !g.closed.Load() {
		t.Errorf("Got(NVML closed) = false; want true")
	}
	return code, stdout.String(), stderr.String()
}

// `spotguard gpu --probe` through the real loader and a fake driver: the CUDA devices are
// matched to NVML's GPUs by UUID, whatever CUDA's order, and the verdicts decide the exit code.
func TestGPUProbeVerdicts(t *testing.T) {
	lib := fakeCUDA(t)
	// CUDA's order is NVML's reversed.
	rev := strings.Join([]string{testUUID(3), testUUID(2), testUUID(1), testUUID(0)}, ",")
	for _, tt := range []struct {
		name   string
		nvml   *fakeNVML
		env    map[string]string
		code   int
		out    []string // in stdout
		stderr []string
	}{
		{
			name: "one of four 17 % slow",
			nvml: newFakeNVML(fakeH200s(4)),
			env:  map[string]string{"FAKE_CUDA_DEVICES": "4", "FAKE_CUDA_UUIDS": rev, "FAKE_CUDA_GBPS": "30,25,30,30"},
			code: exitGPUDegraded,
			out: []string{"achieved 25 GB/s is 17 % below the median of the 3 other NVIDIA H200 (30 GB/s): replace the instance",
				"DEGRADED: GPU 2 (" + testUUID(2) + "); replace this instance (exit 3)"},
			stderr: []string{"probing 4 GPUs: 1 GiB device-to-device copies for 0.1 s each, all at once (CUDA 12.4)\n", "probed 4 GPUs in ",
				"; buffers as small as 1 MiB (a quarter of a GPU's free memory)\n"},
		},
		{
			name: "healthy",
			nvml: newFakeNVML(fakeH200s(4)),
			env:  map[string]string{"FAKE_CUDA_DEVICES": "4", "FAKE_CUDA_UUIDS": rev, "FAKE_CUDA_GBPS": "30,29,30,31"},
			code: exitOK,
			out:  []string{"\nhealthy (exit 0)\n"},
		},
		{
			name: "two GPUs, one 13 % slower",
			nvml: newFakeNVML(fakeH200s(2)),
			env:  map[string]string{"FAKE_CUDA_DEVICES": "2", "FAKE_CUDA_UUIDS": testUUID(0) + "," + testUUID(1), "FAKE_CUDA_GBPS": "30,26"},
			code: exitGPUDegraded,
			out:  []string{"achieved 26 GB/s is 13 % below the median of the 1 other NVIDIA H200 (30 GB/s)", "DEGRADED: GPU 1 ("},
		},
		{
			name: "one GPU near peak × efficiency",
			nvml: newFakeNVML(fakeH200s(1)),
			env:  map[string]string{"FAKE_CUDA_UUIDS": testUUID(0), "FAKE_CUDA_GBPS": "30"},
			code: exitOK,
			out:  []string{"32: peak × 0.80", "\nhealthy (exit 0)\n"},
		},
		{
			name: "one GPU far below peak × efficiency",
			nvml: newFakeNVML(fakeH200s(1)),
			env:  map[string]string{"FAKE_CUDA_UUIDS": testUUID(0), "FAKE_CUDA_GBPS": "27"},
			code: exitGPUDegraded,
			out:  []string{"achieved 27 GB/s is 16 % below 32 GB/s, its peak 40 GB/s × 0.80 (Hopper's assumed copy efficiency)"},
		},
		{
			name: "an XID during the probe",
			nvml: func() *fakeNVML { g := newFakeNVML(fakeH200s(2)); g.xid = map[int]uint64{1: 79}; return g }(),
			env:  map[string]string{"FAKE_CUDA_DEVICES": "2", "FAKE_CUDA_UUIDS": testUUID(0) + "," + testUUID(1), "FAKE_CUDA_GBPS": "30"},
			code: exitGPUDegraded,
			out:  []string{"1 fatal (last 79)", "1 critical XID errors (last XID 79)", "DEGRADED: GPU 1 ("},
		},
		{
			name:   "a GPU hidden from CUDA",
			nvml:   newFakeNVML(fakeH200s(3)),
			env:    map[string]string{"FAKE_CUDA_DEVICES": "2", "FAKE_CUDA_UUIDS": testUUID(2) + "," + testUUID(0), "FAKE_CUDA_GBPS": "30"},
			code:   exitOK,
			out:    []string{"healthy; not probed: CUDA does not show this GPU (hidden by CUDA_VISIBLE_DEVICES?)"},
			stderr: []string{"probing 2 GPUs: "},
		},
		{
			name: "a GPU whose probe fails",
			nvml: newFakeNVML(fakeH200s(3)),
			env: map[string]string{"FAKE_CUDA_DEVICES": "3", "FAKE_CUDA_UUIDS": strings.Join(uuids(0, 1, 2), ","), "FAKE_CUDA_GBPS": "30",
				"FAKE_CUDA_FAIL": "cuMemAlloc_v2@1=2"},
			code: exitFail,
			out:  []string{"probe failed: cuMemAlloc_v2: CUDA_ERROR_OUT_OF_MEMORY (out of memory)", "not every GPU could be probed"},
		},
		{
			name:   "no CUDA device",
			nvml:   newFakeNVML(fakeH200s(1)),
			env:    map[string]string{"FAKE_CUDA_FAIL": "cuInit=100"},
			code:   exitNoNVML,
			stderr: []string{"spotguard gpu: no CUDA driver: cuInit: CUDA_ERROR_NO_DEVICE (no CUDA-capable device is detected)\n"},
		},
	} {
		t.Run(tt.name, func(t *testing.T) {
			probeEnv(t, tt.env)
			code, stdout, stderr := runProbeCLI(t, tt.nvml, lib)
			if code != tt.code {
				t.Errorf("Got(%q) = exit %d; want %d\n%s%s", tt.name, code, tt.code, stdout, stderr)
			}
			for _, want := range tt.out {
				if !strings.Contains(stdout, want) {
					t.Errorf("Got(%q) stdout lacks %q:\n%s", tt.name, want, stdout)
				}
			}
			for _, want := range tt.stderr {
				if !strings.Contains(stderr, want) {
					t.Errorf("Got(%q) stderr lacks %q:\n%s", tt.name, want, stderr)
				}
			}
		})
	}
}

// pausePipes are the pipes of FAKE_CUDA_PAUSE: the fake driver writes a byte to toTest when it
// pauses mid-copy and goes on when the test writes one to toFake; pause is the variable's value.
func pausePipes(t *testing.T) (toTest, toFake *os.File, pause string) {
	t.Helper()
	toTest, fromFake, err := os.Pipe()
	if err != nil {
		t.Fatal(err)
	}
	fromTest, toFake, err := os.Pipe()
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { toTest.Close(); fromFake.Close(); fromTest.Close(); toFake.Close() })
	return toTest, toFake, strings.Join([]string{itoa(fromFake.Fd()), itoa(fromTest.Fd())}, ",")
}

// A hardware slowdown seen while the copies run makes the GPU degraded. The fake driver stops
// after the first timed batch until NVML has been read, so the sample is under the probe's load
// without any timing. The sample comes back only after the copies have ended, as it does when
// the sampler is not scheduled in time on a loaded machine: it counts all the same.
func TestGPUProbeSlowdownUnderLoad(t *testing.T) {
	lib := fakeCUDA(t)
	toTest, toFake, pause := pausePipes(t)
	probeEnv(t, map[string]string{"FAKE_CUDA_UUIDS": testUUID(0), "FAKE_CUDA_GBPS": "31",
		"FAKE_CUDA_PAUSE": pause})
	g := newFakeNVML(fakeH200s(1))
	g.sm = map[int]uint32{0: 1500}
	g.reasons = map[int][]string{0: {"hw_thermal_slowdown", "sw_power_cap"}}
	g.late = true
	g.during = func(read func()) {
		var b [1]byte
		if _, err := toTest.Read(b[:]); err != nil { // the first timed batch is done
			t.Errorf("read from the fake driver: %v", err)
		}
		read()
		if _, err := toFake.Write(b[:]); err != nil {
			t.Errorf("write to the fake driver: %v", err)
		}
	}
	code, stdout, stderr := runProbeCLI(t, g, lib, "--json")
	if code != exitGPUDegraded {
		t.Fatalf("Got(slowdown under load) = exit %d; want %d\n%s%s", code, exitGPUDegraded, stdout, stderr)
	}
	var rep probeReport
	if err := json.Unmarshal([]byte(stdout), &rep); err != nil {
		t.Fatalf("--json: %v\n%s", err, stdout)
	}
	gpu := rep.GPUs[0]
	if gpu.Samples < 1 || !slices.Equal(gpu.Rules, []string{nvml.RuleSlowdown}) || gpu.SMClockMHz == nil || gpu.SMClockMHz.Min != 1500 ||
		!slices.Equal(gpu.ClockEventReasons, []string{"hw_thermal_slowdown", "sw_power_cap"}) {
		t.Errorf("Got(GPU 0) = %+v; want the slowdown rule from a sample under load at 1500 MHz", gpu)
	}
	if !strings.Contains(strings.Join(gpu.Reasons, ""), "hw_thermal_slowdown held the SM clock below its max in") {
		t.Errorf("Got(reasons) = %q; want the slowdown named", gpu.Reasons)
	}
}

func itoa(fd uintptr) string { return strconv.FormatUint(uint64(fd), 10) }

// --json in probe mode: every field of the schema docs/gpu.md documents, snake_case, with its
// value.
func TestGPUProbeJSON(t *testing.T) {
	lib := fakeCUDA(t)
	probeEnv(t, map[string]string{"FAKE_CUDA_DEVICES": "2", "FAKE_CUDA_UUIDS": testUUID(1) + "," + testUUID(0), "FAKE_CUDA_GBPS": "30,25",
		"FAKE_CUDA_VERSION": "12080"})
	code, stdout, stderr := runProbeCLI(t, newFakeNVML(fakeH200s(2)), lib, "--json", "--probe-bytes", "256MiB")
	if code != exitGPUDegraded {
		t.Fatalf("Got(--json) = exit %d; want %d\n%s%s", code, exitGPUDegraded, stdout, stderr)
	}
	var rep map[string]any
	if err := json.Unmarshal([]byte(stdout), &rep); err != nil {
		t.Fatalf("--json: %v\n%s", err, stdout)
	}
	wantTop := []string{"bytes", "cuda_driver", "duration_s", "elapsed_s", "gpus", "healthy", "mode", "threshold"}
	if got := keys(rep); !slices.Equal(got, wantTop) {
		t.Errorf("Got(report keys) = %q; want %q", got, wantTop)
	}
	if rep["mode"] != "probe" || rep["healthy"] != false || rep["cuda_driver"] != "12.8" || rep["bytes"] != float64(256<<20) ||
		rep["duration_s"] != 0.1 || rep["threshold"] != 0.1 {
		t.Errorf("Got(report) = %v; want probe, unhealthy, CUDA 12.8, 256 MiB, 0.1 s, threshold 0.1", rep)
	}
	gpus := rep["gpus"].([]any)
	wantGPU := []string{"architecture", "bytes", "clock_event_reasons", "compute_capability", "copies", "copy_efficiency", "cuda_index",
		"degraded", "expected_gbps", "gbps", "index", "last_recoverable_xid", "last_xid", "mem_clock_mhz", "name", "of_peak", "peak_gbps",
		"peer_median_gbps", "peers", "probed", "reasons", "rules", "samples", "seconds", "sm_clock_mhz", "unjudged", "uuid",
		"xid_critical", "xid_recoverable"}
	g1 := gpus[1].(map[string]any)
	if got := keys(g1); !slices.Equal(got, wantGPU) {
		t.Errorf("Got(GPU keys) = %q; want %q", got, wantGPU)
	}
	for k, want := range map[string]any{
		"index": 1.0, "cuda_index": 0.0, "uuid": testUUID(1), "name": "NVIDIA H200", "compute_capability": "9.0", "architecture": "Hopper",
		"probed": true, "bytes": float64(1 << 20), "peak_gbps": 40.0, "copy_efficiency": 0.8, "peers": 1.0,
		"expected_gbps": nil, "degraded": false, "xid_critical": 0.0,
	} {
		if g1[k] != want {
			t.Errorf("Got(gpus[1].%s) = %v; want %v", k, g1[k], want)
		}
	}
	for k, want := range map[string]float64{"gbps": 30, "peer_median_gbps": 25, "of_peak": 0.75} {
		if got, _ := g1[k].(float64); math.Abs(got-want) > want*1e-3 {
			t.Errorf("Got(gpus[1].%s) = %v; want %v", k, g1[k], want)
		}
	}
	g0 := gpus[0].(map[string]any)
	if g0["degraded"] != true || !slices.Equal(g0["rules"].([]any), []any{ruleProbePeers}) {
		t.Errorf("Got(gpus[0]) = %v; want degraded by %s", g0, ruleProbePeers)
	}
}

func keys(m map[string]any) []string {
	var out []string
	for k := range m {
		out = append(out, k)
	}
	slices.Sort(out)
	return out
}

// A GPU whose copies hang (the fake driver stops after the first timed batch and is never let
// go on while the command runs): the probe ends with exit 3 once the copies have taken the
// answer limit beyond twice --probe-duration, names the call on stderr and in --json's hung, and
// leaves NVML open. Before, the command waited for the driver for ever.
func TestGPUProbeCUDAHangs(t *testing.T) {
	lib := fakeCUDA(t)
	toTest, toFake, pause := pausePipes(t)
	stats := filepath.Join(t.TempDir(), "stats")
	probeEnv(t, map[string]string{"FAKE_CUDA_UUIDS": testUUID(0), "FAKE_CUDA_GBPS": "31", "FAKE_CUDA_STATS": stats,
		"FAKE_CUDA_PAUSE": pause})
	g := newFakeNVML(fakeH200s(1))
	cfg := filepath.Join(t.TempDir(), "empty.yaml")
	os.WriteFile(cfg, nil, 0o644)
	var stdout, stderr bytes.Buffer
	deps := gpuDeps{open: g.open, cudaLibrary: lib, probeSampleEvery: 2 * time.Millisecond, answerLimit: 50 * time.Millisecond}
	code := runGPU(t.Context(), []string{"--config", cfg, "--probe", "--probe-duration", "100ms", "--json"}, nil, &stdout, &stderr, deps)
	// Let the fake driver go on, and wait for the probe left behind to free its context, so
	// that it does not run into the next test (which sets the driver's environment anew).
	var b [1]byte
	if _, err := toTest.Read(b[:]); err != nil {
		t.Errorf("read from the fake driver: %v", err)
	}
	if _, err := toFake.Write(b[:]); err != nil {
		t.Errorf("write to the fake driver: %v", err)
	}
	for deadline := time.Now().Add(10 * time.Second); ; {
		if got, _ := os.ReadFile(stats); strings.HasPrefix(string(got), "contexts 0 ") {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("the probe left behind did not free its context within 10 s")
		}
		runtime.Gosched()
	}
	want := "the CUDA driver (the probe's copies) has not returned after 0.25 s"
	if code != exitGPUDegraded || !strings.Contains(stderr.String(), want+": a GPU or its driver hangs") {
		t.Errorf("Got(copies that hang) = exit %d; want %d saying %q\n%s", code, exitGPUDegraded, want, stderr.String())
	}
	var rep probeReport
	if err := json.Unmarshal(stdout.Bytes(), &rep); err != nil || rep.Hung != want || rep.Healthy || len(rep.GPUs) != 0 {
		t.Errorf("--json = %s (%v); want hung %q, not healthy, no GPUs", stdout.String(), err, want)
	}
	if g.closed.Load() {
		t.Errorf("NVML closed while the probe hangs; want it left open")
	}
}
