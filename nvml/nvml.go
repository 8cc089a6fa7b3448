// Package nvml samples NVIDIA GPUs through NVML and judges whether a GPU is
// degraded: slowed by hardware or thermal limits, reporting memory errors or
// critical XIDs, lost, or clearly slower than its peers of the same model on
// the same instance (the "silicon lottery").
//
// The adapter over github.com/NVIDIA/go-nvml (type GPUs) is built only on
// Linux with cgo; elsewhere Open returns an error wrapping ErrUnavailable.
// The types and Verdicts in this file are pure and build everywhere.
//
// NVML must never be called after a failed Init: the process would die on a
// symbol lookup error. Open stops at the first failure and reports it.
package nvml

import (
	"cmp"
	"errors"
	"fmt"
	"math"
	"math/bits"
	"slices"
	"strings"
	"time"
)

// ErrUnavailable reports that GPU sampling is off. Open wraps it with the
// reason (no libnvidia-ml.so.1, driver mismatch, no permission, no GPUs,
// built without cgo), so errors.Is(err, ErrUnavailable) tells the agent to
// say so once and carry on without GPU metrics.
var ErrUnavailable = errors.New("nvml: GPU sampling is off")

// DefaultThreshold is the fraction below the peers' median at which Verdicts
// calls a GPU an outlier when it is given a threshold ≤ 0, ≥ 1 or NaN.
const DefaultThreshold = 0.10

// LoadPercent is the GPU utilisation (percent) from which a GPU counts as
// under load: peer comparisons of clocks apply only to GPUs at or above it,
// since idle GPUs lower their clocks on purpose.
const LoadPercent = 50

// EqualLoadPoints is how many percentage points of GPU utilisation two GPUs
// may differ by and still count as under comparable load when their clocks
// are compared.
const EqualLoadPoints = 10

// SlowdownShare is the part of the time between two samples that a thermal
// slowdown must have held the clocks down, by NVML's cumulative counter, for
// the slowdown rule to fire on that sample.
const SlowdownShare = 0.10

// ReasonPowerCap is the clock event reason of a GPU held at its power limit:
// normal under heavy load, never a fault by itself, but a GPU at its power
// limit and one below it are not under comparable load.
const ReasonPowerCap = "sw_power_cap"

// MinModelGPUs is the least number of GPUs of one model (the GPU itself
// included, lost GPUs and GPUs lacking the metric excluded) for a peer
// comparison: the GPU is compared with the median of the others, and a
// median of fewer than two values means nothing.
const MinModelGPUs = 3

// BandwidthGPM is the one source of Sample.AchievedMemBandwidth: GPM's DRAM
// bandwidth utilisation × the peak (Hopper and newer). Older GPUs have no
// counter of bytes moved; their memory controller duty cycle
// (Sample.MemUtilPercent) is the share of time memory was busy, not a
// bandwidth, and is never presented as one.
const BandwidthGPM = "gpm"

// Facts are what a GPU is; Open reads them once.
type Facts struct {
	// Index is the NVML device index.
	Index int
	// UUID is NVML's GPU UUID ("GPU-…"); empty if NVML could not say.
	UUID string
	// Name is the model as NVML names it ("NVIDIA H100 80GB HBM3"); peers
	// are GPUs with the same Name.
	Name string
	// MaxSMClockMHz and MaxMemClockMHz are the maximum clocks; 0 when
	// not supported.
	MaxSMClockMHz, MaxMemClockMHz uint32
	// MemBusWidthBits is the memory bus width; 0 when not supported.
	MemBusWidthBits uint32
	// PeakMemBandwidth is the theoretical peak in bytes/s, see
	// PeakMemBandwidth; 0 when a clock or the bus width is unknown.
	PeakMemBandwidth float64
	// MemoryTotalBytes is the framebuffer size; 0 when unknown.
	MemoryTotalBytes uint64
	// MIG is true when MIG mode is on; the parent (whole) GPU is sampled
	// then, and some metrics (utilisation, GPM) may be missing.
	MIG bool
}

// Sample is one reading of one GPU. Optional metrics are nil when NVML does
// not support them on this GPU or could not read them this time.
type Sample struct {
	// Index is the NVML device index, as in Facts.
	Index int
	// UUID is the GPU's UUID, as in Facts.
	UUID string
	// At is when the metrics were read.
	At time.Time
	// Lost is true when NVML reported ERROR_GPU_IS_LOST for this GPU, now
	// or earlier; a lost GPU has no metrics and is not queried again.
	Lost bool

	// SMClockMHz and MemClockMHz are the current clocks.
	SMClockMHz, MemClockMHz *uint32
	// GPUUtilPercent is the share of the last sample period in which a
	// kernel ran; MemUtilPercent is the memory controller's duty cycle: the
	// share of it in which device memory was read or written (not bytes
	// moved).
	GPUUtilPercent, MemUtilPercent *float64
	// DRAMBandwidthUtilPercent is GPM's DRAM bandwidth utilisation over
	// the time since the previous Sample (Hopper and newer).
	DRAMBandwidthUtilPercent *float64
	// AchievedMemBandwidth is in bytes/s: DRAMBandwidthUtilPercent × the
	// peak; nil without GPM or without the peak.
	AchievedMemBandwidth *float64
	// BandwidthSource is BandwidthGPM, or empty when AchievedMemBandwidth is
	// nil.
	BandwidthSource string
	// MemUsedBytes and MemTotalBytes are the framebuffer use.
	MemUsedBytes, MemTotalBytes *uint64
	// TemperatureC is the GPU core temperature.
	TemperatureC *float64
	// PowerW is the board power draw.
	PowerW *float64
	// ClockEventReasons are the active clock event (throttle) reasons,
	// decoded as by ClockEventReasons; empty when none is active or the
	// metric is not supported.
	ClockEventReasons []string
	// ClockEventTimes are NVML's cumulative clock event counters
	// (nvmlDeviceGetViolationStatus), one per reason this GPU counts, in
	// this order: sw_power_cap, sw_thermal_slowdown, sync_boost,
	// board_limit, reliability; nil where NVML counts none. Unlike the
	// reasons active at the instant of a sample, they say how long each
	// reason held the clocks down between two samples. The hardware
	// slowdowns have no counter here (their NVML field IDs differ between
	// driver versions); they are judged from the reasons at each sample.
	ClockEventTimes []ClockEventTime `json:",omitempty"`
	// ECCUncorrectedVolatile counts uncorrected ECC errors since the
	// driver was loaded.
	ECCUncorrectedVolatile *uint64
	// RemappedRowsPending is true when a row remap waits for a GPU reset.
	RemappedRowsPending *bool
	// RowRemapFailed is true when a row remap failed: the GPU should be
	// replaced.
	RowRemapFailed *bool
	// XIDCritical counts fatal XID events (XIDClass) seen on this GPU since
	// RunEvents started: NVIDIA's guidance for them is a GPU reset or a
	// node reboot, so they count for the agent's life. XIDs that
	// applications cause are not counted.
	XIDCritical uint64
	// LastXID is the latest XID counted in XIDCritical; 0 if none.
	LastXID uint64
	// XIDRecoverable counts recoverable XID events (XIDClass: ECC and row
	// remapping the driver handles) of the last XIDDecay, the last of them
	// LastRecoverableXID; both 0 once XIDDecay has passed since the last.
	XIDRecoverable     uint64 `json:",omitempty"`
	LastRecoverableXID uint64 `json:",omitempty"`
}

// ClockEventTime is one of NVML's cumulative clock event counters.
type ClockEventTime struct {
	// Reason is the reason's name as in ClockEventReasons.
	Reason string `json:"reason"`
	// Total is how long the reason has held the clocks down since the
	// driver was loaded.
	Total time.Duration `json:"total_ns"`
	// Window is the time since the previous sample of this GPU, and Share
	// the part of it during which the reason held the clocks down (0 to 1).
	// Both are 0 on a GPU's first sample, when the counter went backwards
	// (a driver reload) or when no time passed.
	Window time.Duration `json:"window_ns"`
	Share  float64       `json:"share"`
}

// Verdict is the judgement of one GPU.
type Verdict struct {
	// Index is the NVML device index, as in the Sample judged.
	Index int
	// UUID is the GPU's UUID, as in the Sample judged.
	UUID string
	// Degraded is true when at least one rule fired; Reasons then say
	// which, in words, with the numbers. Reasons is empty otherwise.
	Degraded bool
	Reasons  []string
	// Rules name, one per reason, the rule that gave it (the Rule* constants), so that a Judge can
	// follow each rule over time.
	Rules []string `json:"rules,omitempty"`
	// Unjudged says, in words, which rules could not be applied to this GPU
	// and why (MIG mode, a metric NVML does not give); a healthy verdict
	// covers only the rest.
	Unjudged []string `json:"unjudged,omitempty"`
}

// The rules of Verdicts. Immediate rules are facts NVML keeps (a lost GPU, uncorrected ECC errors,
// row remapping, critical XIDs): one reading is evidence enough. The others are readings of a
// moment (clocks, load, throttling) and a Judge takes them as evidence only when they hold in K
// of the last N samples.
const (
	RuleLost              = "lost"
	RuleECCUncorrected    = "ecc_uncorrected"
	RuleRowRemapPending   = "row_remap_pending"
	RuleRowRemapFailed    = "row_remap_failed"
	RuleXIDCritical       = "xid_critical"
	RuleXIDRecoverable    = "xid_recoverable"
	RuleSlowdown          = "slowdown"
	RulePeerSMClock       = "peer_sm_clock"
	RulePeerMemClock      = "peer_memory_clock"
	RulePeerPeakBandwidth = "peer_peak_bandwidth"
)

// Immediate reports whether rule is a fact NVML keeps rather than a reading of a moment.
func Immediate(rule string) bool {
	switch rule {
	case RuleLost, RuleECCUncorrected, RuleRowRemapPending, RuleRowRemapFailed, RuleXIDCritical, RuleXIDRecoverable, RulePeerPeakBandwidth:
		return true
	}
	return false
}

// finding is one rule that fired, and what it says.
type finding struct{ rule, text string }

// PeakMemBandwidth returns the theoretical peak memory bandwidth in bytes/s
// of a GPU whose maximum memory clock is memClockMHz and whose memory bus is
// busWidthBits wide: clock × 2 (double data rate) × bus width in bytes. It
// returns 0 when either input is 0 (unknown).
//
// NVML reports the memory clock such that this gives the datasheet figure
// (A100 80GB: 1593 MHz, 5120 bits → 2039 GB/s; T4: 5001 MHz, 256 bits →
// 320 GB/s), though some parts (H200) come out a little above their
// datasheet. Compare GPUs with peers, never with marketing numbers.
func PeakMemBandwidth(memClockMHz, busWidthBits uint32) float64 {
	return float64(memClockMHz) * 1e6 * 2 * float64(busWidthBits) / 8
}

// reasonNames names the clock event reason bits of nvml.h
// (nvmlClocksEventReason*), indexed by bit position.
var reasonNames = [...]string{
	"gpu_idle",
	"applications_clocks_setting",
	"sw_power_cap",
	"hw_slowdown",
	"sync_boost",
	"sw_thermal_slowdown",
	"hw_thermal_slowdown",
	"hw_power_brake_slowdown",
	"display_clocks_setting",
	"board_limit",
	"reliability",
}

// slowdownReasons are the reasons that mean hardware or cooling trouble
// when a GPU is held below its maximum clock.
var slowdownReasons = []string{"hw_slowdown", "hw_thermal_slowdown", "hw_power_brake_slowdown", "sw_thermal_slowdown"}

// slowdowns returns the slowdown reasons that held s's clocks: a reason
// with a counter whose window is known counts when it held them at least
// SlowdownShare of the window (said with its share); any other counts when
// it is active at the sample.
func slowdowns(s *Sample) []string {
	var held []string
	counted := map[string]bool{}
	for _, c := range s.ClockEventTimes {
		if !IsSlowdownReason(c.Reason) || c.Window <= 0 {
			continue
		}
		counted[c.Reason] = true
		if c.Share >= SlowdownShare {
			held = append(held, fmt.Sprintf("%s (%s of the last %v)", c.Reason, pct(c.Share), c.Window.Round(100*time.Millisecond)))
		}
	}
	for _, name := range s.ClockEventReasons {
		if IsSlowdownReason(name) && !counted[name] {
			held = append(held, name)
		}
	}
	return held
}

// IsSlowdownReason reports whether a clock event reason, as ClockEventReasons names it, means
// hardware or cooling trouble when it holds a GPU below its maximum clock: hw_slowdown,
// hw_thermal_slowdown, hw_power_brake_slowdown or sw_thermal_slowdown. Others (sw_power_cap,
// gpu_idle, applications_clocks_setting, ...) are how a healthy GPU runs.
func IsSlowdownReason(name string) bool { return slices.Contains(slowdownReasons, name) }

// ClockEventReasons decodes an NVML clock event (throttle) reason bitmask
// into names, lowest bit first: "gpu_idle", "applications_clocks_setting",
// "sw_power_cap", "hw_slowdown", "sync_boost", "sw_thermal_slowdown",
// "hw_thermal_slowdown", "hw_power_brake_slowdown", "display_clocks_setting",
// "board_limit", "reliability"; a bit unknown to this package becomes
// "unknown_0x…" with its value. It returns nil for 0 (no reason active).
func ClockEventReasons(mask uint64) []string {
	if mask == 0 {
		return nil
	}
	return appendClockEventReasons(make([]string, 0, bits.OnesCount64(mask)), mask)
}

// appendClockEventReasons appends the names of mask's bits to dst.
func appendClockEventReasons(dst []string, mask uint64) []string {
	for mask != 0 {
		i := bits.TrailingZeros64(mask)
		mask &^= 1 << i
		if i < len(reasonNames) {
			dst = append(dst, reasonNames[i])
		} else {
			dst = append(dst, fmt.Sprintf("unknown_%#x", uint64(1)<<i))
		}
	}
	return dst
}

// The classes of XIDClass.
const (
	XIDApplication = "application"
	XIDRecoverable = "recoverable"
	XIDFatal       = "fatal"
)

// XIDDecay is how long a recoverable XID counts as evidence after the last one.
const XIDDecay = time.Hour

// XIDClass classifies an XID after NVIDIA's XID catalog:
//
//	application  13 graphics engine exception, 31 GPU memory page fault, 43 GPU stopped
//	             processing, 45 preemptive cleanup: a trainer's own fault; logged, not counted
//	recoverable  63 ECC page retirement or row remapping recorded, 64 ECC page retirement or row
//	             remapper recording failure, 92 high single-bit ECC error rate, 94 contained ECC
//	             error (the application was stopped; the GPU goes on), 154 GPU recovery action
//	             changed: the driver handled it; the GPU's own state (pending or failed row
//	             remapping, uncorrected ECC counts) says whether it needs a reset, so these count
//	             for XIDDecay after the last one
//	fatal        every other XID reported as critical (48 double-bit ECC, 74 NVLink error, 79
//	             fallen off the bus, 95 uncontained ECC, 119/120 GSP errors, ...): a reset or a
//	             reboot is needed; they count until the agent restarts
func XIDClass(xid uint64) string {
	switch xid {
	case 13, 31, 43, 45:
		return XIDApplication
	case 63, 64, 92, 94, 154:
		return XIDRecoverable
	}
	return XIDFatal
}

// IsApplicationXID reports whether an XID is one that applications
// commonly cause (13 graphics engine exception, 31 GPU memory page fault,
// 43 GPU stopped processing, 45 preemptive cleanup) rather than a hardware
// or driver fault. Such XIDs are logged but not counted in
// Sample.XIDCritical: a trainer with a bad kernel must not get a healthy
// instance replaced.
func IsApplicationXID(xid uint64) bool { return XIDClass(xid) == XIDApplication }

// Verdicts judges the GPUs in samples, returning one Verdict per Sample in
// the same order. facts supply each GPU's model and maxima; they are matched
// to samples by UUID, or by Index when a UUID is empty. A Sample without
// Facts is judged on the sample alone. threshold is the fraction below the
// peers' median that makes an outlier; ≤ 0, ≥ 1 or NaN means
// DefaultThreshold. One call judges one moment; a Judge weighs them over
// time.
//
// A GPU is degraded when any of these holds:
//
//   - it is lost (no other rule is checked then);
//   - it has uncorrected volatile ECC errors, a pending row remap or a failed
//     row remap;
//   - fatal XIDs were seen on it, or recoverable ones in the last XIDDecay;
//   - a hardware or thermal slowdown holds its SM clock below its maximum
//     (or either is unknown), at any load — an idle GPU stuck in a power
//     brake is as broken as a busy one: hw_slowdown, hw_thermal_slowdown or
//     hw_power_brake_slowdown active at the sample, or sw_thermal_slowdown
//     for at least SlowdownShare of the time since the previous sample by
//     NVML's counter (active at the sample where there is no counter);
//   - it is an outlier among its peers: with at least MinModelGPUs GPUs of
//     the same Name that are not lost, one of these is more than threshold
//     below the median of the other GPUs' values:
//     the SM clock and the memory clock, among GPUs under comparable load:
//     both under load (GPU util ≥ LoadPercent and not gpu_idle), their
//     utilisation within EqualLoadPoints, and both or neither held at their
//     power limit (ReasonPowerCap);
//     the peak memory bandwidth from Facts (no load needed).
//
// Achieved memory bandwidth is not judged: the GPUs of a synchronous job
// wait for each other and pipeline stages move different amounts of memory,
// so it follows the work, not the GPU (the launch probe measures it with the
// same copy on every GPU).
//
// Rules whose inputs are missing (nil metrics, unknown load, no Facts,
// too few peers) do not fire; Verdict.Unjudged names the ones a GPU could
// not be judged by and why.
func Verdicts(facts []Facts, samples []Sample, threshold float64) []Verdict {
	if !(threshold > 0 && threshold < 1) {
		threshold = DefaultThreshold
	}
	byUUID := make(map[string]*Facts, len(facts))
	byIndex := make(map[int]*Facts, len(facts))
	for i := range facts {
		f := &facts[i]
		if f.UUID != "" {
			byUUID[f.UUID] = f
		}
		byIndex[f.Index] = f
	}
	factsOf := make([]*Facts, len(samples))
	for i, s := range samples {
		if s.UUID != "" {
			factsOf[i] = byUUID[s.UUID]
		} else {
			factsOf[i] = byIndex[s.Index]
		}
	}

	out := make([]Verdict, len(samples))
	for i := range samples {
		s, f := &samples[i], factsOf[i]
		v := Verdict{Index: s.Index, UUID: s.UUID}
		var found []finding
		if s.Lost {
			found = append(found, finding{RuleLost, "GPU is lost (ERROR_GPU_IS_LOST): it no longer answers NVML"})
		} else {
			found = healthReasons(found, s, f)
			found = peerReasons(found, i, samples, factsOf, threshold)
			v.Unjudged = unjudged(s, f, i, samples, factsOf)
		}
		for _, fd := range found {
			v.Reasons, v.Rules = append(v.Reasons, fd.text), append(v.Rules, fd.rule)
		}
		v.Degraded = len(v.Reasons) > 0
		out[i] = v
	}
	return out
}

// healthReasons appends the reasons that need no peers.
func healthReasons(r []finding, s *Sample, f *Facts) []finding {
	if s.ECCUncorrectedVolatile != nil && *s.ECCUncorrectedVolatile > 0 {
		r = append(r, finding{RuleECCUncorrected, fmt.Sprintf("%d uncorrected ECC errors since the driver was loaded", *s.ECCUncorrectedVolatile)})
	}
	if s.RemappedRowsPending != nil && *s.RemappedRowsPending {
		r = append(r, finding{RuleRowRemapPending, "row remapping is pending: the GPU needs a reset"})
	}
	if s.RowRemapFailed != nil && *s.RowRemapFailed {
		r = append(r, finding{RuleRowRemapFailed, "row remapping failed: the GPU should be replaced"})
	}
	if s.XIDCritical > 0 {
		r = append(r, finding{RuleXIDCritical, fmt.Sprintf("%d critical XID errors (last XID %d): a GPU reset or a reboot is needed", s.XIDCritical, s.LastXID)})
	}
	if s.XIDRecoverable > 0 {
		r = append(r, finding{RuleXIDRecoverable, fmt.Sprintf("%d recoverable XID errors in the last %v (last XID %d: ECC or row remapping)",
			s.XIDRecoverable, XIDDecay, s.LastRecoverableXID)})
	}
	var maxSM uint32
	if f != nil {
		maxSM = f.MaxSMClockMHz
	}
	if held := slowdowns(s); len(held) > 0 {
		load := "idle"
		if s.GPUUtilPercent != nil {
			load = fmt.Sprintf("%.0f %% GPU util", *s.GPUUtilPercent)
		}
		by := strings.Join(held, ", ")
		switch {
		case s.SMClockMHz != nil && maxSM > 0 && *s.SMClockMHz < maxSM:
			r = append(r, finding{RuleSlowdown, fmt.Sprintf("SM clock %d MHz is held %s below its max %d MHz at %s by %s",
				*s.SMClockMHz, pct(1-float64(*s.SMClockMHz)/float64(maxSM)), maxSM, load, by)})
		case s.SMClockMHz == nil || maxSM == 0:
			r = append(r, finding{RuleSlowdown, fmt.Sprintf("%s at %s", by, load)})
		}
	}
	return r
}

// peerReasons appends the reasons from comparing samples[i] with its peers.
func peerReasons(r []finding, i int, samples []Sample, factsOf []*Facts, threshold float64) []finding {
	f := factsOf[i]
	if f == nil || f.Name == "" {
		return r
	}
	s := &samples[i]
	peers := make([]int, 0, len(samples))
	for j := range samples {
		if j != i && !samples[j].Lost && factsOf[j] != nil && factsOf[j].Name == f.Name {
			peers = append(peers, j)
		}
	}
	if len(peers)+1 < MinModelGPUs {
		return r
	}
	vals := make([]float64, 0, len(peers))
	// compare appends a reason when own is more than threshold below the
	// median of the peers' values that get returns (ok false: skip).
	compare := func(rule, what, unit string, own float64, scale float64, suffix string, get func(j int) (float64, bool)) {
		vals = vals[:0]
		for _, j := range peers {
			if x, ok := get(j); ok {
				vals = append(vals, x)
			}
		}
		if len(vals)+1 < MinModelGPUs {
			return
		}
		med := median(vals)
		if med <= 0 || own >= med*(1-threshold) {
			return
		}
		r = append(r, finding{rule, fmt.Sprintf("%s %s %s is %s below the median of %d %s peers (%s %s)%s",
			what, num(own/scale), unit, pct(1-own/med), len(vals), f.Name, num(med/scale), unit, suffix)})
	}

	if loaded(s) {
		capped := slices.Contains(s.ClockEventReasons, ReasonPowerCap)
		state := "not at its power limit"
		if capped {
			state = "at its power limit"
		}
		suffix := fmt.Sprintf(" under comparable load (GPU util within %d points of %.0f %%, %s)", EqualLoadPoints, *s.GPUUtilPercent, state)
		if s.SMClockMHz != nil {
			compare(RulePeerSMClock, "SM clock", "MHz", float64(*s.SMClockMHz), 1, suffix, func(j int) (float64, bool) {
				p := &samples[j]
				if !comparable(s, p) || p.SMClockMHz == nil {
					return 0, false
				}
				return float64(*p.SMClockMHz), true
			})
		}
		if s.MemClockMHz != nil {
			compare(RulePeerMemClock, "memory clock", "MHz", float64(*s.MemClockMHz), 1, suffix, func(j int) (float64, bool) {
				p := &samples[j]
				if !comparable(s, p) || p.MemClockMHz == nil {
					return 0, false
				}
				return float64(*p.MemClockMHz), true
			})
		}
	}
	if f.PeakMemBandwidth > 0 {
		compare(RulePeerPeakBandwidth, "peak memory bandwidth", "GB/s", f.PeakMemBandwidth, 1e9, "", func(j int) (float64, bool) {
			p := factsOf[j].PeakMemBandwidth
			return p, p > 0
		})
	}
	return r
}

// loaded reports whether s is under load; unknown load is not, nor is a GPU NVML says is idle
// (gpu_idle): utilisation covers the last sampling period while the clocks are read now, so a
// GPU that has just gone idle reads 100 % busy at its idle clock.
func loaded(s *Sample) bool {
	return s.GPUUtilPercent != nil && *s.GPUUtilPercent >= LoadPercent && !slices.Contains(s.ClockEventReasons, "gpu_idle")
}

// comparable reports whether p is under load comparable to s's (which is
// loaded): loaded too, its utilisation within EqualLoadPoints, and both or
// neither at their power limit. A GPU power-capped in a GEMM and peers in
// an NCCL phase are not, nor are a GPU that has just gone idle and busy
// ones.
func comparable(s, p *Sample) bool {
	return loaded(p) && math.Abs(*p.GPUUtilPercent-*s.GPUUtilPercent) <= EqualLoadPoints &&
		slices.Contains(p.ClockEventReasons, ReasonPowerCap) == slices.Contains(s.ClockEventReasons, ReasonPowerCap)
}

// unjudged says which rules s could not be judged by, and why.
func unjudged(s *Sample, f *Facts, i int, samples []Sample, factsOf []*Facts) []string {
	var out []string
	switch {
	case f == nil || f.Name == "":
		out = append(out, "peer comparisons: the GPU's model is unknown")
	default:
		n := 1
		for j := range samples {
			if j != i && !samples[j].Lost && factsOf[j] != nil && factsOf[j].Name == f.Name {
				n++
			}
		}
		if n < MinModelGPUs {
			out = append(out, fmt.Sprintf("peer comparisons: %d GPU(s) of this model, %d needed", n, MinModelGPUs))
		}
	}
	switch {
	case s.GPUUtilPercent == nil && f != nil && f.MIG:
		out = append(out, "peer clock comparisons: MIG mode, where NVML gives no utilisation of the whole GPU (throttling, ECC, row remapping and XIDs are judged)")
	case s.GPUUtilPercent == nil:
		out = append(out, "peer clock comparisons: NVML gives no utilisation for this GPU")
	}
	return out
}

// median returns the median of vals (len ≥ 1), reordering vals.
func median(vals []float64) float64 {
	slices.SortFunc(vals, cmp.Compare)
	n := len(vals)
	if n%2 == 1 {
		return vals[n/2]
	}
	return (vals[n/2-1] + vals[n/2]) / 2
}

// pct formats a fraction as whole percent ("18 %").
func pct(frac float64) string { return fmt.Sprintf("%.0f %%", frac*100) }

// num formats a value without decimals when it has none worth showing.
func num(x float64) string {
	if x >= 100 || x == math.Trunc(x) {
		return fmt.Sprintf("%.0f", x)
	}
	return fmt.Sprintf("%.1f", x)
}
