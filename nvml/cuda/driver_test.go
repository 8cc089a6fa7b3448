//go:build linux && cgo

package cuda

import (
	"context"
	"errors"
	"math"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/spotguard/spotguard/nvml/cuda/cudatest"
)

// fakeDriver builds the fake driver with the given -D defines: cudatest.FakeDriver.
func fakeDriver(t *testing.T, defines ...string) string {
	t.Helper()
	return cudatest.FakeDriver(t, defines...)
}

// fakeEnv sets the fake driver's environment for the test, and FAKE_CUDA_STATS to a file it
// returns the path of.
func fakeEnv(t *testing.T, env map[string]string) (stats string) {
	t.Helper()
	stats = filepath.Join(t.TempDir(), "stats")
	for _, k := range []string{"FAKE_CUDA_DEVICES", "FAKE_CUDA_GBPS", "FAKE_CUDA_UUIDS", "FAKE_CUDA_NAMES", "FAKE_CUDA_CC",
		"FAKE_CUDA_MEM", "FAKE_CUDA_FREE", "FAKE_CUDA_VERSION", "FAKE_CUDA_FAIL", "FAKE_CUDA_BARRIER", "FAKE_CUDA_PAUSE"} {
		t.Setenv(k, env[k])
	}
	t.Setenv("FAKE_CUDA_STATS", stats)
	return stats
}

// checkFreed fails the test unless the fake driver's live objects are all gone and at most
// maxContexts (and at least minContexts) contexts were ever alive at once.
func checkFreed(t *testing.T, stats string, minContexts, maxContexts int) {
	t.Helper()
	b, err := os.ReadFile(stats)
	if errors.Is(err, os.ErrNotExist) && maxContexts == 0 {
		return // nothing was ever made
	}
	if err != nil {
		t.Fatal(err)
	}
	var live = map[string]int{}
	f := strings.Fields(string(b))
	for i := 0; i+1 < len(f); i += 2 {
		n, err := strconv.Atoi(f[i+1])
		if err != nil {
			t.Fatalf("fake driver stats %q: %v", b, err)
		}
		live[f[i]] = n
	}
	for _, k := range []string{"contexts", "allocations", "streams", "events"} {
		if live[k] != 0 {
			t.Errorf("Got(live %s) = %d; want 0 (everything freed): %s", k, live[k], b)
		}
	}
	if m := live["max_contexts"]; m < minContexts || m > maxContexts {
		t.Errorf("Got(contexts alive at once) = %d; want %d to %d", m, minContexts, maxContexts)
	}
}

// near reports whether got is within 0.1 % of want.
func near(got, want float64) bool { return math.Abs(got-want) <= want*1e-3 }

// Four devices are probed at once (the fake's barrier passes only when all four wait in
// cuEventSynchronize together), each at its own rate, counted the 2× way, with its UUID,
// name and compute capability, and everything is freed.
func TestProbeMeasuresEveryDeviceAtOnce(t *testing.T) {
	lib := fakeDriver(t)
	stats := fakeEnv(t, map[string]string{
		"FAKE_CUDA_DEVICES": "4",
		"FAKE_CUDA_GBPS":    "3,3,2.5,3",
		"FAKE_CUDA_UUIDS":   "GPU-00000000-1111-2222-3333-444444444444,GPU-10000000-1111-2222-3333-444444444444,GPU-20000000-1111-2222-3333-444444444444,GPU-30000000-1111-2222-3333-abcdefabcdef",
		"FAKE_CUDA_NAMES":   "NVIDIA H200",
		"FAKE_CUDA_CC":      "9.0,9.0,9.0,8.0",
		"FAKE_CUDA_VERSION": "12080",
		"FAKE_CUDA_BARRIER": "4",
	})
	d, err := Open(lib)
	if err != nil {
		t.Fatalf("Open(fake) = %v", err)
	}
	if d.Version() != 12080 || d.Path() != lib || len(d.Devices()) != 4 {
		t.Fatalf("Got(Open) = version %d, path %s, %d devices; want 12080, %s, 4", d.Version(), d.Path(), len(d.Devices()), lib)
	}
	res, err := d.Probe(t.Context(), Options{Bytes: MinBytes, Duration: 50 * time.Millisecond})
	if err != nil {
		t.Fatalf("Probe() = %v", err)
	}
	if res.Bytes != MinBytes || res.Duration != 50*time.Millisecond || res.DriverVersion != 12080 || len(res.Devices) != 4 {
		t.Fatalf("Got(Probe) = %+v; want 1 MiB, 50ms, 12080 and 4 devices", res)
	}
	for i, r := range res.Devices {
		want := []float64{3e9, 3e9, 2.5e9, 3e9}[i]
		if r.Err != nil || !near(r.BytesPerSecond, want) {
			t.Errorf("Got(device %d) = %.4g B/s, %v; want %.4g and no error", i, r.BytesPerSecond, r.Err, want)
		}
		if r.Bytes != MinBytes || r.Copies < 1 || r.Seconds < 0.05 || r.Seconds > 0.06 {
			t.Errorf("Got(device %d) = %d bytes, %d copies in %.3f s; want 1 MiB, copies for 50 to 60 ms", i, r.Bytes, r.Copies, r.Seconds)
		}
		if got := 2 * float64(r.Bytes) * float64(r.Copies) / r.Seconds; !near(got, r.BytesPerSecond) {
			t.Errorf("Got(device %d) = %.4g B/s; want 2 × bytes × copies / seconds = %.4g", i, r.BytesPerSecond, got)
		}
		if r.Start.IsZero() || r.End.Before(r.Start) || r.Setup <= 0 {
			t.Errorf("Got(device %d) = start %v, end %v, setup %v; want the timed copies' wall times", i, r.Start, r.End, r.Setup)
		}
		dev := r.Device
		wantUUID := []string{"GPU-00000000-1111-2222-3333-444444444444", "GPU-10000000-1111-2222-3333-444444444444",
			"GPU-20000000-1111-2222-3333-444444444444", "GPU-30000000-1111-2222-3333-abcdefabcdef"}[i]
		if dev.Ordinal != i || dev.UUID != wantUUID || dev.Name != "NVIDIA H200" || dev.TotalBytes != 80<<30 {
			t.Errorf("Got(device %d) = %+v; want ordinal %d, %s, NVIDIA H200, 80 GiB", i, dev, i, wantUUID)
		}
		if wantMajor := []int{9, 9, 9, 8}[i]; dev.Major != wantMajor || dev.Minor != 0 {
			t.Errorf("Got(device %d) = compute capability %d.%d; want %d.0", i, dev.Major, dev.Minor, wantMajor)
		}
	}
	// All started together, once all were set up.
	for _, r := range res.Devices[1:] {
		if r.Start.Sub(res.Devices[0].Start).Abs() > time.Second {
			t.Errorf("Got(starts) = %v and %v; want the timed copies to start together", r.Start, res.Devices[0].Start)
		}
	}
	checkFreed(t, stats, 4, 4)
}

// Open fails with ErrUnavailable, naming the reason, when the library is missing, lacks a
// symbol (and none is called then), or cuInit fails.
func TestOpenUnavailable(t *testing.T) {
	full := fakeDriver(t)
	noEvents := fakeDriver(t, "NO_EVENTS")
	for _, tt := range []struct {
		name string
		lib  string
		env  map[string]string
		want string
		code Result
	}{
		{"no library", filepath.Join(t.TempDir(), "libcuda.so.1"), nil, "libcuda.so.1: cannot open shared object file", 0},
		{"missing symbol", noEvents, map[string]string{"FAKE_CUDA_FAIL": "cuInit=999"}, "lacks cuEventElapsedTime", 0},
		{"cuInit fails", full, map[string]string{"FAKE_CUDA_FAIL": "cuInit=100"}, "cuInit: CUDA_ERROR_NO_DEVICE (no CUDA-capable device is detected)", ErrorNoDevice},
		{"no device", full, map[string]string{"FAKE_CUDA_DEVICES": "0"}, "cuInit: CUDA_ERROR_NO_DEVICE", ErrorNoDevice},
		{"count fails", full, map[string]string{"FAKE_CUDA_FAIL": "cuDeviceGetCount=999"}, "cuDeviceGetCount: CUDA_ERROR_UNKNOWN (unknown error)", 999},
	} {
		t.Run(tt.name, func(t *testing.T) {
			fakeEnv(t, tt.env)
			d, err := Open(tt.lib)
			if d != nil || !errors.Is(err, ErrUnavailable) || !strings.Contains(fmtErr(err), tt.want) {
				t.Fatalf("Got(%q) = %v, %v; want nil and ErrUnavailable with %q", tt.name, d, err, tt.want)
			}
			var ce *Error
			if got := errors.As(err, &ce); got != (tt.code != 0) || got && ce.Result != tt.code {
				t.Errorf("Got(%q) = %#v; want a cuda.Error with %d: %v", tt.name, ce, tt.code, tt.code != 0)
			}
		})
	}
}

func fmtErr(err error) string {
	if err == nil {
		return ""
	}
	return err.Error()
}

// A device that fails says why in its result; the others are measured all the same, and
// every device frees what it made.
func TestProbePerDeviceErrors(t *testing.T) {
	lib := fakeDriver(t)
	for _, tt := range []struct {
		name  string
		fail  string
		bad   int
		want  string
		code  Result
		bytes int64
	}{
		{"out of memory", "cuMemAlloc_v2@2=2", 2, "cuMemAlloc_v2: CUDA_ERROR_OUT_OF_MEMORY (out of memory)", ErrorOutOfMemory, 0},
		{"timer fails in the warm-up", "cuEventElapsedTime@1=999", 1, "warm-up copy: cuEventElapsedTime: CUDA_ERROR_UNKNOWN", 999, MinBytes},
		{"copy fails", "cuMemcpyDtoDAsync_v2@0=214", 0, "cuMemcpyDtoDAsync_v2: CUDA_ERROR_ECC_UNCORRECTABLE", 214, MinBytes},
		{"no context", "cuCtxCreate_v2@3=201", 3, "cuCtxCreate_v2: CUDA_ERROR_INVALID_CONTEXT", 201, 0},
		{"no UUID", "cuDeviceGetUuid@1=1", 1, "cuDeviceGetUuid: CUDA_ERROR_INVALID_VALUE", 1, 0},
	} {
		t.Run(tt.name, func(t *testing.T) {
			stats := fakeEnv(t, map[string]string{"FAKE_CUDA_DEVICES": "4", "FAKE_CUDA_GBPS": "2", "FAKE_CUDA_FAIL": tt.fail})
			d, err := Open(lib)
			if err != nil {
				t.Fatalf("Open(fake) = %v", err)
			}
			res, err := d.Probe(t.Context(), Options{Bytes: MinBytes, Duration: 20 * time.Millisecond})
			if err != nil {
				t.Fatalf("Probe() = %v; want per-device errors only", err)
			}
			for i, r := range res.Devices {
				if i != tt.bad {
					if r.Err != nil || !near(r.BytesPerSecond, 2e9) {
						t.Errorf("Got(%q: device %d) = %.4g B/s, %v; want 2e9 and no error", tt.name, i, r.BytesPerSecond, r.Err)
					}
					continue
				}
				var ce *Error
				if !strings.Contains(fmtErr(r.Err), tt.want) || !errors.As(r.Err, &ce) || ce.Result != tt.code {
					t.Errorf("Got(%q: device %d) = %v; want %q (CUresult %d)", tt.name, i, r.Err, tt.want, tt.code)
				}
				if r.Copies != 0 || r.BytesPerSecond != 0 || r.Bytes != tt.bytes {
					t.Errorf("Got(%q: device %d) = %d copies, %g B/s, %d bytes; want none measured, %d bytes", tt.name, i, r.Copies, r.BytesPerSecond, r.Bytes, tt.bytes)
				}
			}
			checkFreed(t, stats, 1, 4)
		})
	}
}

// Each buffer is at most a quarter of the free memory; a device with too little free fails
// its probe, saying how much it had.
func TestProbeUsesAQuarterOfFreeMemory(t *testing.T) {
	lib := fakeDriver(t)
	stats := fakeEnv(t, map[string]string{"FAKE_CUDA_DEVICES": "2", "FAKE_CUDA_GBPS": "2", "FAKE_CUDA_FREE": "9437184,3145728"})
	d, err := Open(lib)
	if err != nil {
		t.Fatalf("Open(fake) = %v", err)
	}
	res, err := d.Probe(t.Context(), Options{Bytes: 16 << 20, Duration: 10 * time.Millisecond})
	if err != nil {
		t.Fatalf("Probe() = %v", err)
	}
	if r := res.Devices[0]; r.Err != nil || r.Bytes != 2<<20 || !near(r.BytesPerSecond, 2e9) {
		t.Errorf("Got(9 MiB free) = %d bytes, %.4g B/s, %v; want 2 MiB buffers at 2e9", r.Bytes, r.BytesPerSecond, r.Err)
	}
	if r := res.Devices[1]; !strings.Contains(fmtErr(r.Err), "only 3 MiB of device memory free: want at least 4 MiB") || r.Bytes != 0 {
		t.Errorf("Got(3 MiB free) = %d bytes, %v; want no buffers and an error saying 3 MiB", r.Bytes, r.Err)
	}
	checkFreed(t, stats, 1, 2)
}

// stopAfter is a context whose Err reports Canceled from its (n+1)th call on, with Done closed
// then, so that a test stops a probe at a known point without any timing.
type stopAfter struct {
	context.Context
	n    atomic.Int64
	once sync.Once
	done chan struct{}
}

func newStopAfter(ctx context.Context, n int64) *stopAfter {
	c := &stopAfter{Context: ctx, done: make(chan struct{})}
	c.n.Store(n)
	return c
}

func (c *stopAfter) Err() error {
	if c.n.Add(-1) < 0 {
		c.once.Do(func() { close(c.done) })
		return context.Canceled
	}
	return nil
}

func (c *stopAfter) Done() <-chan struct{} { return c.done }

// Probe checks its context between batches: a context that ends stops every device at the
// next batch, with the copies made so far, and everything is freed. One that ended before
// makes nothing at all.
func TestProbeStopsWhenContextEnds(t *testing.T) {
	lib := fakeDriver(t)
	t.Run("during the copies", func(t *testing.T) {
		stats := fakeEnv(t, map[string]string{"FAKE_CUDA_DEVICES": "1", "FAKE_CUDA_GBPS": "1"})
		d, err := Open(lib)
		if err != nil {
			t.Fatalf("Open(fake) = %v", err)
		}
		// One Err before the device starts, then one per batch: three batches run.
		ctx := newStopAfter(t.Context(), 4)
		res, err := d.Probe(ctx, Options{Bytes: MinBytes, Duration: time.Hour})
		if !errors.Is(err, context.Canceled) {
			t.Fatalf("Probe() = %v; want context.Canceled", err)
		}
		r := res.Devices[0]
		// 1 MiB at 1 GB/s (2×): 2.1 ms a copy, 48 copies a 100 ms batch.
		if !errors.Is(r.Err, context.Canceled) || !strings.Contains(r.Err.Error(), "stopped after 144 copies") || r.Copies != 144 || !near(r.BytesPerSecond, 1e9) {
			t.Errorf("Got(device) = %d copies, %.4g B/s, %v; want 3 batches of 48 at 1e9, stopped by the context", r.Copies, r.BytesPerSecond, r.Err)
		}
		checkFreed(t, stats, 1, 1)
	})
	t.Run("before", func(t *testing.T) {
		stats := fakeEnv(t, map[string]string{"FAKE_CUDA_DEVICES": "3"})
		d, err := Open(lib)
		if err != nil {
			t.Fatalf("Open(fake) = %v", err)
		}
		ctx, cancel := context.WithCancel(t.Context())
		cancel()
		res, err := d.Probe(ctx, Options{})
		if !errors.Is(err, context.Canceled) || len(res.Devices) != 3 {
			t.Fatalf("Probe() = %d devices, %v; want 3 and context.Canceled", len(res.Devices), err)
		}
		for i, r := range res.Devices {
			if !errors.Is(r.Err, context.Canceled) || r.Bytes != 0 {
				t.Errorf("Got(device %d) = %d bytes, %v; want nothing made, context.Canceled", i, r.Bytes, r.Err)
			}
		}
		checkFreed(t, stats, 0, 0)
	})
}

func TestProbeRejectsBadOptions(t *testing.T) {
	lib := fakeDriver(t)
	stats := fakeEnv(t, map[string]string{"FAKE_CUDA_DEVICES": "2"})
	d, err := Open(lib)
	if err != nil {
		t.Fatalf("Open(fake) = %v", err)
	}
	for _, o := range []Options{{Bytes: 1000}, {Duration: -1}} {
		if _, err := d.Probe(t.Context(), o); err == nil {
			t.Errorf("Got(%+v) = nil error; want one", o)
		}
	}
	checkFreed(t, stats, 0, 0)
}
