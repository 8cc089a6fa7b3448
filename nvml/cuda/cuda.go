// Package cuda measures the memory bandwidth of every NVIDIA GPU of this host with timed
// device-to-device copies, through the CUDA driver API: the launch check for the "silicon
// lottery", where two GPUs of the same model reach different bandwidths (the same A100 part
// measured 1.6 and 1.4 TB/s).
//
// The driver (libcuda.so.1) is loaded at run time with dlopen, as NVML is: nothing of CUDA is
// needed to build, and a host without the driver gets an error wrapping ErrUnavailable, not a
// process that fails to start. Every symbol is looked up before any is called, so a driver
// that lacks one is reported by name and never called. The loader needs Linux and cgo; other
// builds have a stub whose Open always fails with ErrUnavailable.
//
// Open loads the driver and reads every device's facts; Driver.Probe copies on all devices at
// once and returns each one's achieved bandwidth. ArchOf gives, per architecture, the share of
// the theoretical peak such a copy is assumed to reach.
package cuda

import (
	"errors"
	"fmt"
	"time"
)

// ErrUnavailable reports that the CUDA driver cannot be used: libcuda.so.1 is missing, lacks a
// symbol the probe needs, or cuInit failed (no device, no permission, a driver that does not
// match the kernel module), or the build has no cgo. Open wraps it with the reason.
var ErrUnavailable = errors.New("cuda: no CUDA driver")

// DefaultLibrary is the CUDA driver library Open loads when given "".
const DefaultLibrary = "libcuda.so.1"

// Defaults and limits of Options.
const (
	// DefaultBytes is the size of each of the two buffers a device copies between; Probe
	// uses at most a quarter of the device's free memory for each, half for both.
	DefaultBytes = 1 << 30
	// MinBytes is the smallest buffer Probe copies; a device with less than 4 × MinBytes
	// free fails its probe.
	MinBytes = 1 << 20
	// DefaultDuration is how long each device copies (GPU time), all devices at once.
	DefaultDuration = 1500 * time.Millisecond
	// maxBatch bounds the copies enqueued between two events.
	maxBatch = 10000
	// batchTime is the GPU time of one batch of copies: Probe notices a cancelled
	// context between batches, so within about this long.
	batchTime = 100 * time.Millisecond
)

// Result is a CUresult, the return code of every CUDA driver call.
type Result int32

// The CUresults this package names.
const (
	Success          Result = 0   // CUDA_SUCCESS
	ErrorOutOfMemory Result = 2   // CUDA_ERROR_OUT_OF_MEMORY
	ErrorNoDevice    Result = 100 // CUDA_ERROR_NO_DEVICE
)

// Error is a CUDA driver call that failed.
type Error struct {
	// Call is the driver function: "cuMemAlloc_v2".
	Call string
	// Result is what it returned.
	Result Result
	// Name and Text are cuGetErrorName's and cuGetErrorString's words for Result
	// ("CUDA_ERROR_OUT_OF_MEMORY", "out of memory"); empty when the driver has none.
	Name, Text string
}

// Error returns "cuMemAlloc_v2: CUDA_ERROR_OUT_OF_MEMORY (out of memory)", or the number when
// the driver has no name for it.
func (e *Error) Error() string {
	name := e.Name
	if name == "" {
		name = fmt.Sprintf("CUresult %d", e.Result)
	}
	if e.Text == "" {
		return e.Call + ": " + name
	}
	return fmt.Sprintf("%s: %s (%s)", e.Call, name, e.Text)
}

// Options are what Driver.Probe does.
type Options struct {
	// Bytes is the size of each of the two buffers copied between on each device; 0 means
	// DefaultBytes. A device uses at most a quarter of its free memory for each (rounded
	// down to whole MiB), so that both fit with room for others; less than MinBytes is an
	// error of that device.
	Bytes int64
	// Duration is how long each device copies, in GPU time measured by CUDA events; 0 means
	// DefaultDuration. Devices copy at the same time, so the probe takes about this long
	// (plus setting up, under a second) whatever the number of devices. A device also stops
	// after twice Duration of wall time, should its events report less time than passes.
	Duration time.Duration
}

// withDefaults fills in the defaults and checks the rest.
func (o Options) withDefaults() (Options, error) {
	if o.Bytes == 0 {
		o.Bytes = DefaultBytes
	}
	if o.Duration == 0 {
		o.Duration = DefaultDuration
	}
	if o.Bytes < MinBytes {
		return o, fmt.Errorf("probe: %d bytes per buffer: want at least %d", o.Bytes, MinBytes)
	}
	if o.Duration < 0 {
		return o, fmt.Errorf("probe: duration %v: want more than 0", o.Duration)
	}
	return o, nil
}

// DeviceInfo is what Open reads of one CUDA device.
type DeviceInfo struct {
	// Ordinal is the CUDA device ordinal. CUDA orders devices fastest first and numbers
	// only those CUDA_VISIBLE_DEVICES shows, so it need not be NVML's index: match devices
	// by UUID.
	Ordinal int
	// Name is the model as the driver names it ("NVIDIA H200").
	Name string
	// UUID is the GPU's UUID in NVML's form ("GPU-xxxxxxxx-xxxx-xxxx-xxxx-xxxxxxxxxxxx"),
	// from cuDeviceGetUuid; under MIG every instance of a GPU has the GPU's UUID here.
	UUID string
	// Major and Minor are the compute capability (9.0 for Hopper).
	Major, Minor int
	// TotalBytes is the device memory.
	TotalBytes uint64
	// Err is set when a fact could not be read; such a device is not probed.
	Err error
}

// DeviceResult is what Probe measured on one device.
type DeviceResult struct {
	Device DeviceInfo
	// Bytes is the size of each of the two buffers; 0 when none was allocated.
	Bytes int64
	// Copies is the number of timed copies of Bytes each; the warm-up copy is not counted.
	Copies int
	// Seconds is the GPU time the timed copies took, from CUDA events recorded around each
	// batch of copies on one stream.
	Seconds float64
	// BytesPerSecond is the achieved bandwidth, counted as CUDA's bandwidthTest counts a
	// device-to-device copy: every byte copied is read once and written once, so 2 × Bytes ×
	// Copies / Seconds. 0 when nothing was timed. When Err says the probe stopped early it
	// covers the copies made until then.
	BytesPerSecond float64
	// Setup is the wall time from the start of the probe until this device was ready to
	// copy: context, buffers, warm-up copy.
	Setup time.Duration
	// Start and End are the wall clock times of the timed copies: all devices start
	// together, once every one of them is set up (or failed).
	Start, End time.Time
	// Err is why the device could not be probed, or stopped early (wrapping the context's
	// error when it ended); nil when it was probed in full. It is often an *Error.
	Err error
}

// Results are what Probe measured.
type Results struct {
	// DriverVersion is cuDriverGetVersion's: 12040 is CUDA 12.4.
	DriverVersion int
	// Bytes and Duration are the Options used, defaults filled in; a device may have used
	// smaller buffers (DeviceResult.Bytes).
	Bytes    int64
	Duration time.Duration
	// Devices are the results, one per CUDA device, in CUDA's order.
	Devices []DeviceResult
	// Elapsed is the wall time of the whole probe.
	Elapsed time.Duration
}

// FormatUUID writes the 16 bytes of cuDeviceGetUuid as NVML writes a GPU's UUID:
// "GPU-" and the bytes in hex, grouped 4-2-2-2-6.
func FormatUUID(b [16]byte) string {
	return fmt.Sprintf("GPU-%x-%x-%x-%x-%x", b[0:4], b[4:6], b[6:8], b[8:10], b[10:16])
}

// FormatVersion writes a CUDA driver version (12040) as "12.4".
func FormatVersion(v int) string {
	return fmt.Sprintf("%d.%d", v/1000, v%1000/10)
}

// bufferBytes is the size of each buffer a device with free bytes free copies between when
// want are asked for: want, or a quarter of free rounded down to whole MiB when that is less.
func bufferBytes(want int64, free uint64) int64 {
	limit := free / 4
	if uint64(want) <= limit {
		return want
	}
	return int64(limit &^ (MinBytes - 1))
}

// batchCopies returns how many copies of per each fill about target: at least 1, at most
// maxBatch.
func batchCopies(target, per time.Duration) int {
	if per <= 0 {
		return 1
	}
	n := int64((target + per - 1) / per)
	return int(max(1, min(n, maxBatch)))
}

// bandwidth is the 2× count: bytes copied n times in d, read and written.
func bandwidth(bytes int64, n int, d time.Duration) float64 {
	if n == 0 || d <= 0 {
		return 0
	}
	return 2 * float64(bytes) * float64(n) / d.Seconds()
}
