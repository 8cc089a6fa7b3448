//go:build linux && cgo

package cuda

/*
#cgo LDFLAGS: -ldl
#include <dlfcn.h>
#include <stddef.h>
#include <stdlib.h>

// The few CUDA driver types the probe needs, declared here so that no CUDA header is needed to
// build (cuda.h declares the same): CUresult is an enum, CUdevice an int, the handles pointers,
// CUdeviceptr a 64-bit integer on 64-bit hosts.
typedef int CUresult;
typedef int CUdevice;
typedef void *CUcontext;
typedef unsigned long long CUdeviceptr;
typedef void *CUstream;
typedef void *CUevent;
typedef struct { char bytes[16]; } CUuuid;

static void *sg_dlopen(const char *path) { return dlopen(path, RTLD_NOW | RTLD_LOCAL); }
static const char *sg_dlerror(void) { return dlerror(); }
static void *sg_dlsym(void *h, const char *name) { return dlsym(h, name); }
static void sg_dlclose(void *h) { dlclose(h); }

// One trampoline per call: f is the function dlsym found.
static CUresult sg_cuInit(void *f, unsigned int flags) { return ((CUresult (*)(unsigned int))f)(flags); }
static CUresult sg_cuDriverGetVersion(void *f, int *v) { return ((CUresult (*)(int *))f)(v); }
static CUresult sg_cuDeviceGetCount(void *f, int *n) { return ((CUresult (*)(int *))f)(n); }
static CUresult sg_cuDeviceGet(void *f, CUdevice *d, int ordinal) { return ((CUresult (*)(CUdevice *, int))f)(d, ordinal); }
static CUresult sg_cuDeviceGetName(void *f, char *name, int len, CUdevice d) { return ((CUresult (*)(char *, int, CUdevice))f)(name, len, d); }
static CUresult sg_cuDeviceGetUuid(void *f, CUuuid *u, CUdevice d) { return ((CUresult (*)(CUuuid *, CUdevice))f)(u, d); }
static CUresult sg_cuDeviceGetAttribute(void *f, int *v, int attr, CUdevice d) { return ((CUresult (*)(int *, int, CUdevice))f)(v, attr, d); }
static CUresult sg_cuDeviceTotalMem(void *f, size_t *n, CUdevice d) { return ((CUresult (*)(size_t *, CUdevice))f)(n, d); }
static CUresult sg_cuCtxCreate(void *f, CUcontext *c, unsigned int flags, CUdevice d) { return ((CUresult (*)(CUcontext *, unsigned int, CUdevice))f)(c, flags, d); }
static CUresult sg_cuCtxDestroy(void *f, CUcontext c) { return ((CUresult (*)(CUcontext))f)(c); }
static CUresult sg_cuMemGetInfo(void *f, size_t *freeb, size_t *total) { return ((CUresult (*)(size_t *, size_t *))f)(freeb, total); }
static CUresult sg_cuMemAlloc(void *f, CUdeviceptr *p, size_t n) { return ((CUresult (*)(CUdeviceptr *, size_t))f)(p, n); }
static CUresult sg_cuMemFree(void *f, CUdeviceptr p) { return ((CUresult (*)(CUdeviceptr))f)(p); }
static CUresult sg_cuMemsetD8(void *f, CUdeviceptr p, unsigned char v, size_t n) { return ((CUresult (*)(CUdeviceptr, unsigned char, size_t))f)(p, v, n); }
static CUresult sg_cuStreamCreate(void *f, CUstream *s, unsigned int flags) { return ((CUresult (*)(CUstream *, unsigned int))f)(s, flags); }
static CUresult sg_cuStreamDestroy(void *f, CUstream s) { return ((CUresult (*)(CUstream))f)(s); }
static CUresult sg_cuEventCreate(void *f, CUevent *e, unsigned int flags) { return ((CUresult (*)(CUevent *, unsigned int))f)(e, flags); }
static CUresult sg_cuEventDestroy(void *f, CUevent e) { return ((CUresult (*)(CUevent))f)(e); }
static CUresult sg_cuEventRecord(void *f, CUevent e, CUstream s) { return ((CUresult (*)(CUevent, CUstream))f)(e, s); }
static CUresult sg_cuEventSynchronize(void *f, CUevent e) { return ((CUresult (*)(CUevent))f)(e); }
static CUresult sg_cuEventElapsedTime(void *f, float *ms, CUevent start, CUevent end) { return ((CUresult (*)(float *, CUevent, CUevent))f)(ms, start, end); }
static CUresult sg_cuGetErrorText(void *f, CUresult r, const char **s) { return ((CUresult (*)(CUresult, const char **))f)(r, s); }

// sg_copies enqueues n copies of bytes from src to dst on s between recording start and end,
// in one call from Go: the first failure stops it, and *failed says which step failed
// (0 the start event, 1 a copy, 2 the end event).
static CUresult sg_copies(void *record, void *copy, CUevent start, CUevent end, CUdeviceptr dst, CUdeviceptr src, size_t bytes, CUstream s, int n, int *failed) {
	CUresult r = sg_cuEventRecord(record, start, s);
	if (r) { *failed = 0; return r; }
	for (int i = 0; i < n; i++) {
		r = ((CUresult (*)(CUdeviceptr, CUdeviceptr, size_t, CUstream))copy)(dst, src, bytes, s);
		if (r) { *failed = 1; return r; }
	}
	r = sg_cuEventRecord(record, end, s);
	if (r) *failed = 2;
	return r;
}
*/
import "C"

import (
	"context"
	"errors"
	"fmt"
	"runtime"
	"strings"
	"sync"
	"time"
	"unsafe"
)

// Driver API constants the probe uses (cuda.h).
const (
	attrComputeCapabilityMajor = 75 // CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MAJOR
	attrComputeCapabilityMinor = 76 // CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MINOR
	ctxSchedBlockingSync       = 4  // CU_CTX_SCHED_BLOCKING_SYNC: wait without spinning a core
	eventBlockingSync          = 1  // CU_EVENT_BLOCKING_SYNC
	streamDefault              = 0  // CU_STREAM_DEFAULT: ordered after cuMemsetD8 on the NULL stream
)

// The driver functions the probe calls, by index into Driver.fn. Each is the versioned symbol
// that cuda.h maps the plain name to on 64-bit hosts, except cuDeviceGetUuid: its _v2 gives
// the MIG instance's UUID under MIG, which NVML's GPUs do not have.
const (
	fnInit = iota
	fnDriverGetVersion
	fnDeviceGetCount
	fnDeviceGet
	fnDeviceGetName
	fnDeviceGetUuid
	fnDeviceGetAttribute
	fnDeviceTotalMem
	fnCtxCreate
	fnCtxDestroy
	fnMemGetInfo
	fnMemAlloc
	fnMemFree
	fnMemsetD8
	fnMemcpyDtoDAsync
	fnStreamCreate
	fnStreamDestroy
	fnEventCreate
	fnEventDestroy
	fnEventRecord
	fnEventSynchronize
	fnEventElapsedTime
	fnGetErrorName
	fnGetErrorString
	numFns
)

// symbols are the names of the driver functions, by index.
var symbols = [numFns]string{
	fnInit:               "cuInit",
	fnDriverGetVersion:   "cuDriverGetVersion",
	fnDeviceGetCount:     "cuDeviceGetCount",
	fnDeviceGet:          "cuDeviceGet",
	fnDeviceGetName:      "cuDeviceGetName",
	fnDeviceGetUuid:      "cuDeviceGetUuid",
	fnDeviceGetAttribute: "cuDeviceGetAttribute",
	fnDeviceTotalMem:     "cuDeviceTotalMem_v2",
	fnCtxCreate:          "cuCtxCreate_v2",
	fnCtxDestroy:         "cuCtxDestroy_v2",
	fnMemGetInfo:         "cuMemGetInfo_v2",
	fnMemAlloc:           "cuMemAlloc_v2",
	fnMemFree:            "cuMemFree_v2",
	fnMemsetD8:           "cuMemsetD8_v2",
	fnMemcpyDtoDAsync:    "cuMemcpyDtoDAsync_v2",
	fnStreamCreate:       "cuStreamCreate",
	fnStreamDestroy:      "cuStreamDestroy_v2",
	fnEventCreate:        "cuEventCreate",
	fnEventDestroy:       "cuEventDestroy_v2",
	fnEventRecord:        "cuEventRecord",
	fnEventSynchronize:   "cuEventSynchronize",
	fnEventElapsedTime:   "cuEventElapsedTime",
	fnGetErrorName:       "cuGetErrorName",
	fnGetErrorString:     "cuGetErrorString",
}

// Driver is a loaded CUDA driver and the devices it shows. Its methods are safe for
// concurrent use. The library stays loaded for the life of the process: the CUDA driver
// starts threads of its own that run its code, so it is never unloaded.
type Driver struct {
	path    string
	fn      [numFns]unsafe.Pointer
	version int
	devs    []DeviceInfo
}

// Open loads the CUDA driver from path (DefaultLibrary when ""), initialises it and reads
// every device's facts. It returns:
//
//   - the Driver and nil, also when some device's facts could not be read (DeviceInfo.Err;
//     that device is not probed);
//   - nil and an error wrapping ErrUnavailable when the library cannot be loaded (not
//     installed: the NVIDIA driver is missing or not in the loader's path), when it lacks a
//     function the probe calls (every missing one named; none is called then), when cuInit
//     fails (CUDA_ERROR_NO_DEVICE: no GPU, or CUDA_VISIBLE_DEVICES hides them all; a driver
//     and kernel module of different versions; no permission), or when it counts no device.
func Open(path string) (*Driver, error) {
	if path == "" {
		path = DefaultLibrary
	}
	d := &Driver{path: path}
	cpath := C.CString(path)
	defer C.free(unsafe.Pointer(cpath))
	h := C.sg_dlopen(cpath)
	if h == nil {
		return nil, fmt.Errorf("%w: load %s: %s", ErrUnavailable, path, C.GoString(C.sg_dlerror()))
	}
	var missing []string
	for i, name := range symbols {
		cname := C.CString(name)
		d.fn[i] = C.sg_dlsym(h, cname)
		C.free(unsafe.Pointer(cname))
		if d.fn[i] == nil {
			missing = append(missing, name)
		}
	}
	if len(missing) > 0 {
		C.sg_dlclose(h) // nothing of it has run yet
		return nil, fmt.Errorf("%w: %s lacks %s (a driver older than the probe needs?)", ErrUnavailable, path, strings.Join(missing, ", "))
	}
	if err := d.check("cuInit", C.sg_cuInit(d.fn[fnInit], 0)); err != nil {
		return nil, fmt.Errorf("%w: %w", ErrUnavailable, err)
	}
	var v, n C.int
	if err := d.check("cuDriverGetVersion", C.sg_cuDriverGetVersion(d.fn[fnDriverGetVersion], &v)); err != nil {
		return nil, fmt.Errorf("%w: %w", ErrUnavailable, err)
	}
	d.version = int(v)
	if err := d.check("cuDeviceGetCount", C.sg_cuDeviceGetCount(d.fn[fnDeviceGetCount], &n)); err != nil {
		return nil, fmt.Errorf("%w: %w", ErrUnavailable, err)
	}
	if n == 0 {
		return nil, fmt.Errorf("%w: the CUDA driver counts no device", ErrUnavailable)
	}
	for i := range int(n) {
		d.devs = append(d.devs, d.deviceInfo(i))
	}
	return d, nil
}

// deviceInfo reads the facts of device ordinal.
func (d *Driver) deviceInfo(ordinal int) DeviceInfo {
	info := DeviceInfo{Ordinal: ordinal}
	var dev C.CUdevice
	if info.Err = d.check("cuDeviceGet", C.sg_cuDeviceGet(d.fn[fnDeviceGet], &dev, C.int(ordinal))); info.Err != nil {
		return info
	}
	var name [256]C.char
	var uuid C.CUuuid
	var major, minor C.int
	var total C.size_t
	info.Err = errors.Join(
		d.check("cuDeviceGetName", C.sg_cuDeviceGetName(d.fn[fnDeviceGetName], &name[0], C.int(len(name)), dev)),
		d.check("cuDeviceGetUuid", C.sg_cuDeviceGetUuid(d.fn[fnDeviceGetUuid], &uuid, dev)),
		d.check("cuDeviceGetAttribute", C.sg_cuDeviceGetAttribute(d.fn[fnDeviceGetAttribute], &major, attrComputeCapabilityMajor, dev)),
		d.check("cuDeviceGetAttribute", C.sg_cuDeviceGetAttribute(d.fn[fnDeviceGetAttribute], &minor, attrComputeCapabilityMinor, dev)),
		d.check("cuDeviceTotalMem_v2", C.sg_cuDeviceTotalMem(d.fn[fnDeviceTotalMem], &total, dev)),
	)
	name[len(name)-1] = 0
	info.Name = C.GoString(&name[0])
	var b [16]byte
	for i := range b {
		b[i] = byte(uuid.bytes[i])
	}
	info.UUID = FormatUUID(b)
	info.Major, info.Minor, info.TotalBytes = int(major), int(minor), uint64(total)
	return info
}

// check turns the result r of call into an *Error, nil for CUDA_SUCCESS.
func (d *Driver) check(call string, r C.CUresult) error {
	if r == 0 {
		return nil
	}
	e := &Error{Call: call, Result: Result(r)}
	var s *C.char
	if C.sg_cuGetErrorText(d.fn[fnGetErrorName], r, &s) == 0 && s != nil {
		e.Name = C.GoString(s)
	}
	s = nil
	if C.sg_cuGetErrorText(d.fn[fnGetErrorString], r, &s) == 0 && s != nil {
		e.Text = C.GoString(s)
	}
	return e
}

// Path returns the library the driver was loaded from.
func (d *Driver) Path() string { return d.path }

// Version returns cuDriverGetVersion's answer: 12040 is CUDA 12.4 (FormatVersion).
func (d *Driver) Version() int { return d.version }

// Devices returns the facts Open read, one per CUDA device, in CUDA's order.
func (d *Driver) Devices() []DeviceInfo { return append([]DeviceInfo(nil), d.devs...) }

// Probe measures the memory bandwidth of every device, all at once: one goroutine per device,
// locked to its OS thread (a CUDA context is current per thread), with a context of its own.
// Each device
//
//  1. makes a context and allocates two buffers of opts.Bytes (at most a quarter of its free
//     memory each), fills both with cuMemsetD8, and copies once to warm up, timing that copy;
//  2. waits until every device is set up (or failed), so that all copy at the same time, as
//     they do in training, under the same power and heat;
//  3. copies from one buffer to the other, cuMemcpyDtoDAsync on one stream, in batches of
//     about 100 ms with a CUDA event recorded before and after each batch, until the events
//     add up to opts.Duration (or twice that passed on the wall clock);
//  4. frees everything it made, in reverse order.
//
// The bandwidth is counted as bandwidthTest counts a device-to-device copy: 2 × bytes copied
// / GPU time (each byte is read and written). Probe returns one result per device, in CUDA's
// order; a device that fails says why in its Err and does not stop the others. Probe stops
// each device between batches when ctx ends, and then returns the results so far and an
// error wrapping ctx's; it returns an error also for invalid opts (nothing is run then).
// A device whose context cannot be destroyed leaves its thread locked, so that the thread
// ends with its goroutine and no other goroutine runs on it with that context current.
func (d *Driver) Probe(ctx context.Context, opts Options) (Results, error) {
	opts, err := opts.withDefaults()
	if err != nil {
		return Results{}, err
	}
	res := Results{DriverVersion: d.version, Bytes: opts.Bytes, Duration: opts.Duration, Devices: make([]DeviceResult, len(d.devs))}
	began := time.Now()
	var ready, done sync.WaitGroup
	ready.Add(len(d.devs))
	start := make(chan struct{})
	for i, info := range d.devs {
		done.Go(func() {
			res.Devices[i] = d.probeDevice(ctx, info, opts, began, ready.Done, start)
		})
	}
	ready.Wait()
	close(start)
	done.Wait()
	res.Elapsed = time.Since(began)
	if err := ctx.Err(); err != nil {
		return res, fmt.Errorf("probe: %w", err)
	}
	return res, nil
}

// probeDevice runs the probe on one device; it calls ready once, when it is set up or has
// failed, and starts its timed copies when start is closed.
func (d *Driver) probeDevice(ctx context.Context, info DeviceInfo, opts Options, began time.Time, ready func(), start <-chan struct{}) (r DeviceResult) {
	r.Device = info
	var once sync.Once
	setUp := func() {
		once.Do(func() {
			r.Setup = time.Since(began)
			ready()
		})
	}
	defer setUp()
	if info.Err != nil {
		r.Err = info.Err
		return r
	}
	if err := ctx.Err(); err != nil {
		r.Err = fmt.Errorf("probe stopped before it began: %w", err)
		return r
	}

	runtime.LockOSThread()
	unlock := true
	defer func() {
		if unlock {
			runtime.UnlockOSThread()
		}
	}()
	// fail records the first error; cleanup errors are joined to it.
	fail := func(err error) {
		r.Err = errors.Join(r.Err, err)
	}
	var dev C.CUdevice
	if err := d.check("cuDeviceGet", C.sg_cuDeviceGet(d.fn[fnDeviceGet], &dev, C.int(info.Ordinal))); err != nil {
		fail(err)
		return r
	}
	var cctx C.CUcontext
	if err := d.check("cuCtxCreate_v2", C.sg_cuCtxCreate(d.fn[fnCtxCreate], &cctx, ctxSchedBlockingSync, dev)); err != nil {
		fail(err)
		return r
	}
	defer func() {
		if err := d.check("cuCtxDestroy_v2", C.sg_cuCtxDestroy(d.fn[fnCtxDestroy], cctx)); err != nil {
			fail(err)
			unlock = false
		}
	}()
	var free, total C.size_t
	if err := d.check("cuMemGetInfo_v2", C.sg_cuMemGetInfo(d.fn[fnMemGetInfo], &free, &total)); err != nil {
		fail(err)
		return r
	}
	bytes := bufferBytes(opts.Bytes, uint64(free))
	if bytes < MinBytes {
		fail(fmt.Errorf("only %d MiB of device memory free: want at least %d MiB", uint64(free)>>20, 4*MinBytes>>20))
		return r
	}
	var bufs [2]C.CUdeviceptr
	for i := range bufs {
		if err := d.check("cuMemAlloc_v2", C.sg_cuMemAlloc(d.fn[fnMemAlloc], &bufs[i], C.size_t(bytes))); err != nil {
			fail(err)
			return r
		}
		defer func() {
			if err := d.check("cuMemFree_v2", C.sg_cuMemFree(d.fn[fnMemFree], bufs[i])); err != nil {
				fail(err)
			}
		}()
		if err := d.check("cuMemsetD8_v2", C.sg_cuMemsetD8(d.fn[fnMemsetD8], bufs[i], C.uchar(0xa5-i), C.size_t(bytes))); err != nil {
			fail(err)
			return r
		}
	}
	r.Bytes = bytes
	var stream C.CUstream
	if err := d.check("cuStreamCreate", C.sg_cuStreamCreate(d.fn[fnStreamCreate], &stream, streamDefault)); err != nil {
		fail(err)
		return r
	}
	defer func() {
		if err := d.check("cuStreamDestroy_v2", C.sg_cuStreamDestroy(d.fn[fnStreamDestroy], stream)); err != nil {
			fail(err)
		}
	}()
	var events [2]C.CUevent
	for i := range events {
		if err := d.check("cuEventCreate", C.sg_cuEventCreate(d.fn[fnEventCreate], &events[i], eventBlockingSync)); err != nil {
			fail(err)
			return r
		}
		defer func() {
			if err := d.check("cuEventDestroy_v2", C.sg_cuEventDestroy(d.fn[fnEventDestroy], events[i])); err != nil {
				fail(err)
			}
		}()
	}
	c := copier{d: d, dst: bufs[1], src: bufs[0], bytes: C.size_t(bytes), stream: stream, start: events[0], end: events[1]}

	per, err := c.time(1) // warm-up
	if err != nil {
		fail(fmt.Errorf("warm-up copy: %w", err))
		return r
	}
	setUp()
	select {
	case <-start:
	case <-ctx.Done():
		fail(fmt.Errorf("probe stopped before the timed copies: %w", ctx.Err()))
		return r
	}

	r.Start = time.Now()
	var gpu time.Duration
	for {
		if err := ctx.Err(); err != nil {
			fail(fmt.Errorf("probe stopped after %d copies: %w", r.Copies, err))
			break
		}
		n := batchCopies(min(batchTime, opts.Duration-gpu), per)
		t, err := c.time(n)
		if err != nil {
			fail(fmt.Errorf("after %d timed copies: %w", r.Copies, err))
			break
		}
		r.Copies += n
		gpu += t
		per = t / time.Duration(n)
		if gpu >= opts.Duration || time.Since(r.Start) >= 2*opts.Duration {
			break
		}
	}
	r.End = time.Now()
	r.Seconds = gpu.Seconds()
	r.BytesPerSecond = bandwidth(bytes, r.Copies, gpu)
	return r
}

// copier times batches of copies on one device; its methods run on the device's thread.
type copier struct {
	d          *Driver
	dst, src   C.CUdeviceptr
	bytes      C.size_t
	stream     C.CUstream
	start, end C.CUevent
}

// time copies n times between two events and returns the GPU time between them. A time of
// 0 or less, which no copy takes, is an error: the driver's timer cannot be trusted then.
func (c *copier) time(n int) (time.Duration, error) {
	d := c.d
	var failed C.int
	if r := C.sg_copies(d.fn[fnEventRecord], d.fn[fnMemcpyDtoDAsync], c.start, c.end, c.dst, c.src, c.bytes, c.stream, C.int(n), &failed); r != 0 {
		return 0, d.check([...]string{"cuEventRecord", "cuMemcpyDtoDAsync_v2", "cuEventRecord"}[failed], r)
	}
	if err := d.check("cuEventSynchronize", C.sg_cuEventSynchronize(d.fn[fnEventSynchronize], c.end)); err != nil {
		return 0, err
	}
	var ms C.float
	if err := d.check("cuEventElapsedTime", C.sg_cuEventElapsedTime(d.fn[fnEventElapsedTime], &ms, c.start, c.end)); err != nil {
		return 0, err
	}
	t := time.Duration(float64(ms) * float64(time.Millisecond))
	if t <= 0 {
		return 0, fmt.Errorf("cuEventElapsedTime: %v ms for %d copies", float64(ms), n)
	}
	return t, nil
}
