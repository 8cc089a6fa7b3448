//go:build linux && cgo

package nvml

import (
	"context"
	"fmt"
	"slices"
	"sync"
	"sync/atomic"
	"time"

	"github.com/NVIDIA/go-nvml/pkg/dl"
	gonvml "github.com/NVIDIA/go-nvml/pkg/nvml"
	"github.com/rs/zerolog"
)

// gpmInterval is the least time between the two GPM samples a metric is
// computed from: nvml.h asks for more than 100 ms between them, and a window
// at the limit is the noisiest.
const gpmInterval = 200 * time.Millisecond

// eventWait is how long one EventSetWait blocks; RunEvents notices a
// cancelled context within about this long.
const eventWait = 250 * time.Millisecond

// eventRetry is how long RunEvents pauses after an unexpected EventSetWait
// error, so that a failing call does not spin.
const eventRetry = time.Second

// Symbols newer than the oldest drivers we meet; each is looked up before
// its function is called, since calling a missing one kills the process.
const (
	symClocksEventReasons    = "nvmlDeviceGetCurrentClocksEventReasons"
	symClocksThrottleReasons = "nvmlDeviceGetCurrentClocksThrottleReasons"
	symRemappedRows          = "nvmlDeviceGetRemappedRows"
	symMemoryBusWidth        = "nvmlDeviceGetMemoryBusWidth"
	symTemperature           = "nvmlDeviceGetTemperature" // deprecated in NVML 13
)

// gpmSymbols must all be present for GPM to be used.
var gpmSymbols = [...]string{
	"nvmlGpmMetricsGet", "nvmlGpmSampleAlloc", "nvmlGpmSampleFree",
	"nvmlGpmSampleGet", "nvmlGpmQueryDeviceSupport",
}

// metric names one optional reading of a Sample, for logging once and for
// not asking again what a GPU does not support.
type metric uint8

const (
	metricSMClock metric = iota
	metricMemClock
	metricUtilization
	metricMemory
	metricTemperature
	metricPower
	metricClockReasons
	metricECC
	metricRemappedRows
	metricGPM
	metricViolation
)

// String returns the metric's name as logged.
func (m metric) String() string {
	switch m {
	case metricSMClock:
		return "sm_clock"
	case metricMemClock:
		return "mem_clock"
	case metricUtilization:
		return "utilization"
	case metricMemory:
		return "memory"
	case metricTemperature:
		return "temperature"
	case metricPower:
		return "power"
	case metricClockReasons:
		return "clock_event_reasons"
	case metricECC:
		return "ecc_uncorrected_volatile"
	case metricRemappedRows:
		return "remapped_rows"
	case metricGPM:
		return "gpm_dram_bw_util"
	case metricViolation:
		return "clock_event_times"
	}
	return fmt.Sprintf("metric(%d)", m)
}

// violationPolicies are the clock event counters read through
// nvmlDeviceGetViolationStatus, with the reason each counts, in the order of
// Sample.ClockEventTimes. NVML's field values for the hardware slowdown
// counters are not read: their IDs differ between drivers (251–253 in driver
// 580) and headers (269–271 in CUDA 13's nvml.h), and a wrong ID reads an
// unrelated power-smoothing field.
var violationPolicies = [...]struct {
	policy gonvml.PerfPolicyType
	reason string
}{
	{gonvml.PERF_POLICY_POWER, "sw_power_cap"},
	{gonvml.PERF_POLICY_THERMAL, "sw_thermal_slowdown"},
	{gonvml.PERF_POLICY_SYNC_BOOST, "sync_boost"},
	{gonvml.PERF_POLICY_BOARD_LIMIT, "board_limit"},
	{gonvml.PERF_POLICY_RELIABILITY, "reliability"},
}

// GPUs samples the NVIDIA GPUs of this host through NVML. Open or OpenWith
// make one; Close releases NVML. Its methods are safe for concurrent use,
// and all of them accept a nil *GPUs (doing nothing), so an agent without
// GPUs needs no special case.
type GPUs struct {
	lib gonvml.Interface
	log zerolog.Logger
	now func() time.Time // time.Now; a benchmark replaces it

	// reasons reads the clock event reasons with the newest symbol the
	// library has; nil when it has neither.
	reasons func(gonvml.Device) (uint64, gonvml.Return)
	gpmOK   bool // the GPM symbols are present

	devs  []*device // fixed at Open
	facts []Facts   // fixed at Open

	// life is entered by every NVML call after Open and closed by Close,
	// so that nothing calls NVML after Shutdown.
	life gate

	// mu serialises Sample and guards the sampling state of devs and
	// gpmGet.
	mu     sync.Mutex
	gpmGet gonvml.GpmMetricsGetType // reused: it is about 19 KB
}

// device is one GPU and the state kept for it between samples.
type device struct {
	h     gonvml.Device // nil when the GPU was lost at Open
	facts Facts
	log   zerolog.Logger

	lost atomic.Bool // ERROR_GPU_IS_LOST seen; never queried again

	// Guarded by GPUs.mu.
	skip    uint32 // bits of metrics that are not supported: not asked again
	warned  uint32 // bits of metrics whose other errors were logged
	gpm     bool   // GPM supported on this GPU
	gpmPrev gonvml.GpmSample
	gpmCur  gonvml.GpmSample
	gpmAt   time.Time // when gpmPrev was taken; zero when it holds none
	// The previous reading of each violation counter, when it was taken (zero: none yet), and
	// the counters NVML does not support on this GPU (bits of violationPolicies).
	violPrev [len(violationPolicies)]gonvml.ViolationTime
	violAt   [len(violationPolicies)]time.Time
	violSkip uint8

	// Written by RunEvents, read by Sample.
	xidCritical atomic.Uint64
	lastXID     atomic.Uint64
	// recoverable XIDs: how many since the streak began, the last one and when (guarded by xidMu).
	xidMu             sync.Mutex
	recoverable       uint64
	lastRecoverable   uint64
	lastRecoverableAt time.Time
}

// Open initialises NVML from the default library (libnvidia-ml.so.1) and
// reads the Facts of every GPU once. It returns:
//
//   - the GPUs and nil on success;
//   - nil and an error wrapping ErrUnavailable with the reason when Init
//     fails (no libnvidia-ml.so.1, driver not loaded, library and driver
//     versions differ, no permission). No other NVML call is made then:
//     calling NVML after a failed Init kills the process;
//   - nil and an error wrapping ErrUnavailable when NVML cannot count the
//     GPUs or finds none; NVML is shut down again then.
//
// A GPU that cannot be opened is logged and left out; one that is lost
// already is kept and reported Lost.
func Open(log zerolog.Logger) (*GPUs, error) {
	if sym, ok := missingSymbol(libraryName); ok {
		// Called, it would end the process: "symbol lookup error", exit 127 (found from
		// outside, with a library of that name that was not NVIDIA's).
		return nil, fmt.Errorf("%w: init NVML: %s lacks the NVML function %s (ERROR_FUNCTION_NOT_FOUND): not NVIDIA's library, or a broken driver install; reinstall the NVIDIA driver",
			ErrUnavailable, libraryName, sym)
	}
	return OpenWith(gonvml.New(), log)
}

// libraryName is the library Open loads, as go-nvml does.
const libraryName = "libnvidia-ml.so.1"

// requiredSymbols are the NVML functions that Open and the sampling call whatever the library's
// version, each as its alternatives: the versioned name go-nvml takes when the library has it,
// then the older one it falls back to. (The newer functions are looked up before each call.)
var requiredSymbols = [][]string{
	{"nvmlInit_v2", "nvmlInit"}, {"nvmlShutdown"}, {"nvmlErrorString"},
	{"nvmlDeviceGetCount_v2", "nvmlDeviceGetCount"}, {"nvmlDeviceGetHandleByIndex_v2", "nvmlDeviceGetHandleByIndex"},
	{"nvmlDeviceGetName"}, {"nvmlDeviceGetUUID"}, {"nvmlDeviceGetMaxClockInfo"}, {"nvmlDeviceGetClockInfo"},
	{"nvmlDeviceGetMemoryInfo"}, {"nvmlDeviceGetMigMode"}, {"nvmlDeviceGetUtilizationRates"},
	{"nvmlDeviceGetPowerUsage"}, {"nvmlDeviceGetTotalEccErrors"}, {"nvmlDeviceGetViolationStatus"},
	{"nvmlDeviceGetSupportedEventTypes"}, {"nvmlDeviceRegisterEvents"}, {"nvmlEventSetCreate"},
	{"nvmlEventSetWait_v2", "nvmlEventSetWait"}, {"nvmlEventSetFree"},
}

// missingSymbol opens the library name on its own and returns the first of requiredSymbols it
// lacks; ok is false when it has them all, or cannot be opened (Init then says why).
func missingSymbol(name string) (sym string, ok bool) {
	lib := dl.New(name, dl.RTLD_LAZY|dl.RTLD_LOCAL)
	if err := lib.Open(); err != nil {
		return "", false
	}
	defer func() { _ = lib.Close() }() // go-nvml opens it again, with its own handle
	for _, alts := range requiredSymbols {
		if !slices.ContainsFunc(alts, func(s string) bool { return lib.Lookup(s) == nil }) {
			return alts[0], true
		}
	}
	return "", false
}

// OpenWith is Open over any NVML implementation, such as go-nvml's
// pkg/nvml/mock. A nil lib gives an error wrapping ErrUnavailable.
func OpenWith(lib gonvml.Interface, log zerolog.Logger) (*GPUs, error) {
	if lib == nil {
		return nil, fmt.Errorf("%w: no NVML library", ErrUnavailable)
	}
	if ret := lib.Init(); ret != gonvml.SUCCESS {
		return nil, fmt.Errorf("%w: init NVML: %s", ErrUnavailable, initFailure(ret))
	}
	g := &GPUs{lib: lib, log: log.With().Str("component", "nvml").Logger(), now: time.Now}
	g.life.idle.L = &g.life.mu
	if err := g.open(); err != nil {
		g.debugFailed(lib.Shutdown(), "shut down NVML")
		return nil, fmt.Errorf("%w: %w", ErrUnavailable, err)
	}
	return g, nil
}

// initFailure explains a failed Init without asking NVML (whose
// ErrorString is an NVML call too).
func initFailure(ret gonvml.Return) string {
	switch ret {
	case gonvml.ERROR_LIBRARY_NOT_FOUND:
		return "libnvidia-ml.so.1 not found (ERROR_LIBRARY_NOT_FOUND); is the NVIDIA driver installed?"
	case gonvml.ERROR_DRIVER_NOT_LOADED:
		return "the NVIDIA kernel driver is not loaded (ERROR_DRIVER_NOT_LOADED)"
	case gonvml.ERROR_NO_PERMISSION:
		return "no permission to use the GPUs (ERROR_NO_PERMISSION)"
	case gonvml.ERROR_LIB_RM_VERSION_MISMATCH:
		return "libnvidia-ml.so.1 and the kernel driver differ in version (ERROR_LIB_RM_VERSION_MISMATCH); reboot or reload the driver"
	case gonvml.ERROR_FUNCTION_NOT_FOUND:
		return "libnvidia-ml.so.1 lacks an NVML function (ERROR_FUNCTION_NOT_FOUND)"
	case gonvml.ERROR_INSUFFICIENT_POWER:
		return "a GPU's external power cables are not connected (ERROR_INSUFFICIENT_POWER)"
	case gonvml.ERROR_IRQ_ISSUE:
		return "the kernel detected an interrupt problem with a GPU (ERROR_IRQ_ISSUE)"
	case gonvml.ERROR_GPU_IS_LOST:
		return "a GPU has fallen off the bus (ERROR_GPU_IS_LOST)"
	case gonvml.ERROR_UNKNOWN:
		return "unknown error (ERROR_UNKNOWN)"
	}
	return fmt.Sprintf("NVML return code %d", int32(ret))
}

// open finds the optional symbols and reads every GPU's facts.
func (g *GPUs) open() error {
	ext := g.lib.Extensions()
	has := func(sym string) bool { return ext.LookupSymbol(sym) == nil }
	switch {
	case has(symClocksEventReasons):
		g.reasons = gonvml.Device.GetCurrentClocksEventReasons
	case has(symClocksThrottleReasons):
		g.reasons = gonvml.Device.GetCurrentClocksThrottleReasons
	default:
		g.log.Info().Msg("this NVML reports no clock event reasons")
	}
	g.gpmOK = true
	for _, sym := range gpmSymbols {
		g.gpmOK = g.gpmOK && has(sym)
	}
	var skip uint32 // metrics whose functions the library lacks
	if !has(symRemappedRows) {
		skip |= 1 << metricRemappedRows
	}
	if !has(symTemperature) {
		skip |= 1 << metricTemperature
	}
	busWidthOK := has(symMemoryBusWidth)

	n, ret := g.lib.DeviceGetCount()
	if ret != gonvml.SUCCESS {
		return fmt.Errorf("count GPUs: %s", ret.Error())
	}
	if n == 0 {
		return fmt.Errorf("no GPUs found")
	}
	for i := range n {
		d := g.openDevice(i, busWidthOK)
		if d == nil {
			continue
		}
		d.skip |= skip
		g.devs = append(g.devs, d)
		g.facts = append(g.facts, d.facts)
	}
	if len(g.devs) == 0 {
		return fmt.Errorf("none of %d GPUs could be opened", n)
	}
	return nil
}

// openDevice reads the facts of GPU i. It returns nil when the GPU cannot
// be opened, and a lost device when it is lost already.
func (g *GPUs) openDevice(i int, busWidthOK bool) *device {
	d := &device{facts: Facts{Index: i}, log: g.log.With().Int("gpu", i).Logger()}
	h, ret := g.lib.DeviceGetHandleByIndex(i)
	switch ret {
	case gonvml.SUCCESS:
	case gonvml.ERROR_GPU_IS_LOST:
		g.markLost(d, "open")
		return d
	default:
		d.log.Warn().Str("nvml", ret.Error()).Msg("cannot open GPU; leaving it out")
		return nil
	}
	d.h = h
	// fact reads one fact; false when it is not there.
	fact := func(what string, ret gonvml.Return) bool {
		switch {
		case ret == gonvml.SUCCESS:
			return !d.lost.Load()
		case ret == gonvml.ERROR_GPU_IS_LOST:
			g.markLost(d, what)
		case d.lost.Load():
		default:
			d.log.Debug().Str("fact", what).Str("nvml", ret.Error()).Msg("GPU fact unavailable")
		}
		return false
	}
	f := &d.facts
	if uuid, ret := h.GetUUID(); fact("uuid", ret) {
		f.UUID = uuid
		d.log = d.log.With().Str("uuid", uuid).Logger()
	}
	if name, ret := h.GetName(); fact("name", ret) {
		f.Name = name
	}
	if c, ret := h.GetMaxClockInfo(gonvml.CLOCK_SM); fact("max_sm_clock", ret) {
		f.MaxSMClockMHz = c
	}
	if c, ret := h.GetMaxClockInfo(gonvml.CLOCK_MEM); fact("max_mem_clock", ret) {
		f.MaxMemClockMHz = c
	}
	if busWidthOK && !d.lost.Load() {
		if w, ret := h.GetMemoryBusWidth(); fact("memory_bus_width", ret) {
			f.MemBusWidthBits = w
		}
	}
	f.PeakMemBandwidth = PeakMemBandwidth(f.MaxMemClockMHz, f.MemBusWidthBits)
	if m, ret := h.GetMemoryInfo(); fact("memory_total", ret) {
		f.MemoryTotalBytes = m.Total
	}
	if mode, _, ret := h.GetMigMode(); fact("mig_mode", ret) && mode == gonvml.DEVICE_MIG_ENABLE {
		f.MIG = true
	}
	if g.gpmOK && !d.lost.Load() {
		sup, ret := h.GpmQueryDeviceSupport()
		d.gpm = fact("gpm_support", ret) && sup.IsSupportedDevice != 0
	}
	if d.lost.Load() {
		return d
	}
	d.log.Info().Str("name", f.Name).
		Uint32("max_sm_clock_mhz", f.MaxSMClockMHz).Uint32("max_mem_clock_mhz", f.MaxMemClockMHz).
		Uint32("mem_bus_width_bits", f.MemBusWidthBits).Float64("peak_mem_bandwidth_gbps", f.PeakMemBandwidth/1e9).
		Uint64("memory_total_bytes", f.MemoryTotalBytes).Bool("gpm", d.gpm).Msg("GPU found")
	if f.MIG {
		d.log.Info().Msg("MIG mode is on: sampling the whole GPU, not its instances")
	}
	return d
}

// debugFailed logs at debug a call that failed where nothing else can be
// done about it.
func (g *GPUs) debugFailed(ret gonvml.Return, msg string) {
	if ret != gonvml.SUCCESS {
		g.log.Debug().Str("nvml", ret.Error()).Msg(msg)
	}
}

// markLost marks d lost and says so the first time.
func (g *GPUs) markLost(d *device, during string) {
	if !d.lost.Swap(true) {
		d.log.Error().Str("during", during).Msg("GPU is lost (ERROR_GPU_IS_LOST); no longer querying it")
	}
}

// Facts returns the facts read at Open, one per GPU, ordered by index.
// It returns nil for a nil GPUs.
func (g *GPUs) Facts() []Facts {
	if g == nil {
		return nil
	}
	return append([]Facts(nil), g.facts...)
}

// values backs the optional fields of one tick's samples, so that a tick
// allocates once for all of them.
type values struct {
	smClock, memClock                                 uint32
	gpuUtil, memUtil, dramUtil, bandwidth, temp, watt float64
	memUsed, memTotal, ecc                            uint64
	remapPending, remapFailed                         bool
}

// Sample reads one Sample per GPU, in the order of Facts. It returns nil
// for a nil or closed GPUs.
//
// DRAM bandwidth utilisation comes from GPM (Hopper and newer) and needs two
// GPM samples at least gpmInterval (200 ms) apart: Sample keeps each tick's GPM sample for
// the next. On the first call, or when the previous call was less than
// gpmInterval ago, it waits out the rest of gpmInterval (one wait for all GPUs).
// If ctx ends during that wait, the samples come without GPM metrics.
// Metrics a GPU does not support are nil and not asked for again; a GPU
// reporting ERROR_GPU_IS_LOST comes back Lost, now and in every later call.
func (g *GPUs) Sample(ctx context.Context) []Sample {
	if g == nil || g.lib == nil {
		return nil
	}
	g.mu.Lock()
	defer g.mu.Unlock()
	if !g.life.enter() {
		return nil
	}
	defer g.life.leave()

	gpmReady := g.gpmFirst(ctx)
	at := g.now()
	out := make([]Sample, len(g.devs))
	vals := make([]values, len(g.devs))
	arena := make([]string, 0, 2*len(g.devs))
	times := make([]ClockEventTime, 0, len(violationPolicies)*len(g.devs))
	for i, d := range g.devs {
		out[i] = g.sampleDevice(d, &vals[i], at, gpmReady, &arena, &times)
	}
	return out
}

// gpmFirst takes a first GPM sample on every GPU that has none and waits
// until the newest first sample is gpmInterval old. It returns false when
// ctx ended first.
func (g *GPUs) gpmFirst(ctx context.Context) bool {
	var newest time.Time
	for _, d := range g.devs {
		if !d.gpm || !g.want(d, metricGPM) {
			continue
		}
		if d.gpmPrev == nil {
			if !g.gpmAlloc(d) {
				continue
			}
		}
		if d.gpmAt.IsZero() {
			if !g.ok(d, metricGPM, d.h.GpmSampleGet(d.gpmPrev)) {
				continue
			}
			d.gpmAt = g.now()
		}
		if d.gpmAt.After(newest) {
			newest = d.gpmAt
		}
	}
	if newest.IsZero() {
		return true
	}
	wait := gpmInterval - g.now().Sub(newest)
	if wait <= 0 {
		return true
	}
	t := time.NewTimer(wait)
	defer t.Stop()
	select {
	case <-t.C:
		return true
	case <-ctx.Done():
		return false
	}
}

// gpmAlloc allocates d's two GPM sample buffers; on failure GPM is off for
// d.
func (g *GPUs) gpmAlloc(d *device) bool {
	prev, ret := g.lib.GpmSampleAlloc()
	if ret == gonvml.SUCCESS {
		var cur gonvml.GpmSample
		if cur, ret = g.lib.GpmSampleAlloc(); ret == gonvml.SUCCESS {
			d.gpmPrev, d.gpmCur = prev, cur
			return true
		}
		g.debugFailed(prev.Free(), "free GPM sample")
	}
	d.gpm = false
	d.log.Warn().Str("nvml", ret.Error()).Msg("cannot allocate GPM samples; no DRAM bandwidth utilisation for this GPU")
	return false
}

// want reports whether metric m should be read from d.
func (g *GPUs) want(d *device, m metric) bool {
	return !d.lost.Load() && d.skip&(1<<m) == 0
}

// ok reports whether ret is SUCCESS. Otherwise it handles the failure of
// metric m on d: NOT_SUPPORTED drops the metric for good (logged once at
// debug), GPU_IS_LOST marks d lost, anything else is logged once per
// (GPU, metric) at warn and tried again next time.
func (g *GPUs) ok(d *device, m metric, ret gonvml.Return) bool {
	switch ret {
	case gonvml.SUCCESS:
		return true
	case gonvml.ERROR_NOT_SUPPORTED:
		d.skip |= 1 << m
		d.log.Debug().Stringer("metric", m).Msg("metric not supported on this GPU")
	case gonvml.ERROR_GPU_IS_LOST:
		g.markLost(d, m.String())
	default:
		if d.warned&(1<<m) == 0 {
			d.warned |= 1 << m
			d.log.Warn().Stringer("metric", m).Str("nvml", ret.Error()).Msg("cannot read metric")
		}
	}
	return false
}

// sampleDevice reads every metric of d that it supports.
func (g *GPUs) sampleDevice(d *device, v *values, at time.Time, gpmReady bool, arena *[]string, times *[]ClockEventTime) Sample {
	s := Sample{Index: d.facts.Index, UUID: d.facts.UUID, At: at}
	if d.lost.Load() {
		s.Lost = true
		return s
	}
	h := d.h
	if g.want(d, metricSMClock) {
		if c, ret := h.GetClockInfo(gonvml.CLOCK_SM); g.ok(d, metricSMClock, ret) {
			v.smClock = c
			s.SMClockMHz = &v.smClock
		}
	}
	if g.want(d, metricMemClock) {
		if c, ret := h.GetClockInfo(gonvml.CLOCK_MEM); g.ok(d, metricMemClock, ret) {
			v.memClock = c
			s.MemClockMHz = &v.memClock
		}
	}
	if g.want(d, metricUtilization) {
		if u, ret := h.GetUtilizationRates(); g.ok(d, metricUtilization, ret) {
			v.gpuUtil, v.memUtil = float64(u.Gpu), float64(u.Memory)
			s.GPUUtilPercent, s.MemUtilPercent = &v.gpuUtil, &v.memUtil
		}
	}
	if g.want(d, metricMemory) {
		if m, ret := h.GetMemoryInfo(); g.ok(d, metricMemory, ret) {
			v.memUsed, v.memTotal = m.Used, m.Total
			s.MemUsedBytes, s.MemTotalBytes = &v.memUsed, &v.memTotal
		}
	}
	if g.want(d, metricTemperature) {
		if t, ret := h.GetTemperature(gonvml.TEMPERATURE_GPU); g.ok(d, metricTemperature, ret) {
			v.temp = float64(t)
			s.TemperatureC = &v.temp
		}
	}
	if g.want(d, metricPower) {
		if mw, ret := h.GetPowerUsage(); g.ok(d, metricPower, ret) {
			v.watt = float64(mw) / 1000
			s.PowerW = &v.watt
		}
	}
	if g.reasons != nil && g.want(d, metricClockReasons) {
		if mask, ret := g.reasons(h); g.ok(d, metricClockReasons, ret) && mask != 0 {
			start := len(*arena)
			*arena = appendClockEventReasons(*arena, mask)
			s.ClockEventReasons = (*arena)[start:len(*arena):len(*arena)]
		}
	}
	if g.want(d, metricViolation) {
		start := len(*times)
		*times = g.clockEventTimes(d, at, *times)
		if len(*times) > start {
			s.ClockEventTimes = (*times)[start:len(*times):len(*times)]
		}
	}
	if g.want(d, metricECC) {
		if n, ret := h.GetTotalEccErrors(gonvml.MEMORY_ERROR_TYPE_UNCORRECTED, gonvml.VOLATILE_ECC); g.ok(d, metricECC, ret) {
			v.ecc = n
			s.ECCUncorrectedVolatile = &v.ecc
		}
	}
	if g.want(d, metricRemappedRows) {
		if _, _, pending, failed, ret := h.GetRemappedRows(); g.ok(d, metricRemappedRows, ret) {
			v.remapPending, v.remapFailed = pending, failed
			s.RemappedRowsPending, s.RowRemapFailed = &v.remapPending, &v.remapFailed
		}
	}
	if gpmReady && d.gpm && !d.gpmAt.IsZero() && g.want(d, metricGPM) {
		if util, ok := g.gpmDRAM(d); ok {
			v.dramUtil = util
			s.DRAMBandwidthUtilPercent = &v.dramUtil
		}
	}
	if d.lost.Load() {
		return Sample{Index: s.Index, UUID: s.UUID, At: at, Lost: true}
	}
	if peak := d.facts.PeakMemBandwidth; peak > 0 && s.DRAMBandwidthUtilPercent != nil {
		v.bandwidth = v.dramUtil / 100 * peak
		s.AchievedMemBandwidth, s.BandwidthSource = &v.bandwidth, BandwidthGPM
	}
	s.XIDCritical, s.LastXID = d.xidCritical.Load(), d.lastXID.Load()
	d.xidMu.Lock()
	if d.recoverable > 0 && g.now().Sub(d.lastRecoverableAt) < XIDDecay {
		s.XIDRecoverable, s.LastRecoverableXID = d.recoverable, d.lastRecoverable
	}
	d.xidMu.Unlock()
	return s
}

// clockEventTimes appends d's clock event counters to dst, each with its
// share of the time since the previous reading. The window is measured by
// NVML's own reference time (µs) when it moved forward, else by the sample
// times. A counter that went backwards (a driver reload) starts over: no
// window, no share.
func (g *GPUs) clockEventTimes(d *device, at time.Time, dst []ClockEventTime) []ClockEventTime {
	for k, p := range violationPolicies {
		if d.violSkip&(1<<k) != 0 {
			continue
		}
		vt, ret := d.h.GetViolationStatus(p.policy)
		if ret == gonvml.ERROR_NOT_SUPPORTED {
			d.violSkip |= 1 << k
			if d.violSkip == 1<<len(violationPolicies)-1 {
				g.ok(d, metricViolation, ret) // none supported: not asked again
			}
			continue
		}
		if !g.ok(d, metricViolation, ret) {
			if d.lost.Load() {
				return dst
			}
			continue
		}
		c := ClockEventTime{Reason: p.reason, Total: time.Duration(vt.ViolationTime)}
		prev, prevAt := d.violPrev[k], d.violAt[k]
		if !prevAt.IsZero() && vt.ViolationTime >= prev.ViolationTime {
			c.Window = at.Sub(prevAt)
			if vt.ReferenceTime > prev.ReferenceTime && prev.ReferenceTime > 0 {
				c.Window = time.Duration(vt.ReferenceTime-prev.ReferenceTime) * time.Microsecond
			}
			if c.Window > 0 {
				c.Share = min(1, float64(vt.ViolationTime-prev.ViolationTime)/float64(c.Window))
			} else {
				c.Window = 0
			}
		}
		d.violPrev[k], d.violAt[k] = vt, at
		dst = append(dst, c)
	}
	return dst
}

// gpmDRAM takes a GPM sample of d and returns the DRAM bandwidth
// utilisation (percent) since the previous one, which it replaces.
func (g *GPUs) gpmDRAM(d *device) (float64, bool) {
	if !g.ok(d, metricGPM, d.h.GpmSampleGet(d.gpmCur)) {
		return 0, false
	}
	now := g.now()
	m := &g.gpmGet
	m.Version = gonvml.GPM_METRICS_GET_VERSION
	m.NumMetrics = 1
	m.Sample1, m.Sample2 = d.gpmPrev, d.gpmCur
	m.Metrics[0] = gonvml.GpmMetric{MetricId: uint32(gonvml.GPM_METRIC_DRAM_BW_UTIL)}
	ret := g.lib.GpmMetricsGet(m)
	m.Sample1, m.Sample2 = nil, nil
	d.gpmPrev, d.gpmCur, d.gpmAt = d.gpmCur, d.gpmPrev, now
	if ret == gonvml.SUCCESS {
		ret = gonvml.Return(m.Metrics[0].NvmlReturn)
	}
	if !g.ok(d, metricGPM, ret) {
		return 0, false
	}
	return m.Metrics[0].Value, true
}

// RunEvents counts critical XID errors per GPU (they feed
// Sample.XIDCritical and Sample.LastXID) until ctx is done. It registers
// one event set for XID events on every GPU that supports them and waits
// on it in steps of 250 ms, so it returns within about that long after ctx
// ends, or after Close. It returns nil in every case:
//
//   - when ctx is done or the GPUs are closed;
//   - at once, after logging it, when no GPU supports XID events or NVML
//     cannot make an event set;
//   - at once for a nil GPUs.
//
// XIDs that applications cause (IsApplicationXID) are logged, not counted.
// Run it on its own goroutine; Close may be called while it runs.
func (g *GPUs) RunEvents(ctx context.Context) error {
	if g == nil || g.lib == nil {
		return nil
	}
	set := g.registerEvents()
	if set == nil {
		return nil
	}
	defer g.freeEvents(set)
	warned := false
	for ctx.Err() == nil {
		ret, closed := g.eventStep(set)
		switch {
		case closed:
			return nil
		case ret == gonvml.SUCCESS, ret == gonvml.ERROR_TIMEOUT:
		default:
			if !warned {
				warned = true
				g.log.Warn().Str("nvml", ret.Error()).Msg("wait for GPU events")
			}
			t := time.NewTimer(eventRetry)
			select {
			case <-ctx.Done():
			case <-t.C:
			}
			t.Stop()
		}
	}
	return nil
}

// registerEvents makes an event set with XID events registered on every
// GPU that supports them. It returns nil, after logging why, when there is
// none.
func (g *GPUs) registerEvents() gonvml.EventSet {
	if !g.life.enter() {
		return nil
	}
	defer g.life.leave()
	set, ret := g.lib.EventSetCreate()
	if ret != gonvml.SUCCESS {
		g.log.Info().Str("nvml", ret.Error()).Msg("GPU events not supported; not counting XID errors")
		return nil
	}
	n := 0
	for _, d := range g.devs {
		if d.lost.Load() {
			continue
		}
		types, ret := d.h.GetSupportedEventTypes()
		if ret == gonvml.SUCCESS && types&gonvml.EventTypeXidCriticalError != 0 {
			ret = d.h.RegisterEvents(gonvml.EventTypeXidCriticalError, set)
		} else if ret == gonvml.SUCCESS {
			ret = gonvml.ERROR_NOT_SUPPORTED
		}
		switch ret {
		case gonvml.SUCCESS:
			n++
		case gonvml.ERROR_GPU_IS_LOST:
			g.markLost(d, "register events")
		default:
			d.log.Debug().Str("nvml", ret.Error()).Msg("XID events not supported on this GPU")
		}
	}
	if n == 0 {
		g.debugFailed(set.Free(), "free event set")
		g.log.Info().Msg("no GPU supports XID events; not counting XID errors")
		return nil
	}
	return set
}

// eventStep waits up to eventWait for one event and records it. closed
// is true when the GPUs are closed (no call is made then).
func (g *GPUs) eventStep(set gonvml.EventSet) (ret gonvml.Return, closed bool) {
	if !g.life.enter() {
		return ret, true
	}
	defer g.life.leave()
	data, ret := set.Wait(uint32(eventWait / time.Millisecond))
	if ret == gonvml.SUCCESS {
		g.recordEvent(data)
	}
	return ret, false
}

// freeEvents frees set unless Close shut NVML down (which freed it).
func (g *GPUs) freeEvents(set gonvml.EventSet) {
	if g.life.enter() {
		g.debugFailed(set.Free(), "free event set")
		g.life.leave()
	}
}

// recordEvent counts a critical XID event on its GPU.
func (g *GPUs) recordEvent(e gonvml.EventData) {
	if e.EventType&gonvml.EventTypeXidCriticalError == 0 {
		return
	}
	d := g.deviceOf(e.Device)
	xid := e.EventData
	switch {
	case d == nil:
		g.log.Warn().Uint64("xid", xid).Msg("XID error on an unknown GPU")
	case XIDClass(xid) == XIDApplication:
		d.log.Info().Uint64("xid", xid).Msg("XID error caused by an application; not counted")
	case XIDClass(xid) == XIDRecoverable:
		now := g.now()
		d.xidMu.Lock()
		if now.Sub(d.lastRecoverableAt) >= XIDDecay {
			d.recoverable = 0 // a new streak
		}
		d.recoverable++
		d.lastRecoverable, d.lastRecoverableAt = xid, now
		d.xidMu.Unlock()
		d.log.Warn().Uint64("xid", xid).Msg("recoverable XID error (ECC or row remapping); it counts for an hour")
	default:
		d.xidCritical.Add(1)
		d.lastXID.Store(xid)
		d.log.Error().Uint64("xid", xid).Msg("critical XID error")
	}
}

// deviceOf finds the GPU an event names, by handle or else by UUID.
func (g *GPUs) deviceOf(h gonvml.Device) *device {
	if h == nil {
		return nil
	}
	for _, d := range g.devs {
		if d.h == h {
			return d
		}
	}
	uuid, ret := h.GetUUID()
	if ret != gonvml.SUCCESS {
		return nil
	}
	for _, d := range g.devs {
		if d.facts.UUID == uuid {
			return d
		}
	}
	return nil
}

// Close frees what Sample holds and shuts NVML down, once; later calls do
// nothing, and Sample and RunEvents return nil afterwards. It first waits
// for a Sample or an event wait in progress (at most 250 ms for the
// latter). A nil GPUs is fine.
func (g *GPUs) Close() {
	if g == nil || g.lib == nil {
		return
	}
	if !g.life.close() {
		return
	}
	// No Sample or event wait runs now, and none will start.
	for _, d := range g.devs {
		for _, s := range []gonvml.GpmSample{d.gpmPrev, d.gpmCur} {
			if s != nil {
				g.debugFailed(s.Free(), "free GPM sample")
			}
		}
		d.gpmPrev, d.gpmCur = nil, nil
	}
	if ret := g.lib.Shutdown(); ret != gonvml.SUCCESS {
		g.log.Warn().Str("nvml", ret.Error()).Msg("shut down NVML")
	}
}

// gate lets NVML calls run concurrently until it is closed, and lets the
// closer wait for those in progress. (A sync.RWMutex would do, but a
// goroutine blocked on a mutex is not durably blocked under
// testing/synctest, so a test could not let an event wait time out while
// Close waits for it.)
type gate struct {
	mu     sync.Mutex
	idle   sync.Cond // L is &mu; signalled when active drops to 0
	active int
	closed bool
}

// enter reports whether the gate is open, counting the caller in if so;
// leave must follow.
func (g *gate) enter() bool {
	g.mu.Lock()
	defer g.mu.Unlock()
	if g.closed {
		return false
	}
	g.active++
	return true
}

// leave counts a caller of enter out.
func (g *gate) leave() {
	g.mu.Lock()
	defer g.mu.Unlock()
	g.active--
	if g.active == 0 {
		g.idle.Broadcast()
	}
}

// close closes the gate and waits until no caller is in. It returns false
// when the gate was closed already.
func (g *gate) close() bool {
	g.mu.Lock()
	defer g.mu.Unlock()
	if g.closed {
		return false
	}
	g.closed = true
	for g.active > 0 {
		g.idle.Wait()
	}
	return true
}
