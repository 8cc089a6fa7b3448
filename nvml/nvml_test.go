package nvml

import (
	"math"
	"slices"
	"strings"
	"testing"
	"time"
)

func TestPeakMemBandwidth(t *testing.T) {
	tests := []struct {
		name        string
		clockMHz    uint32
		busBits     uint32
		wantGBPerS  float64
		wantExactly bool
	}{
		{name: "A100 80GB", clockMHz: 1593, busBits: 5120, wantGBPerS: 2039},
		{name: "H100 SXM", clockMHz: 2619, busBits: 5120, wantGBPerS: 3352},
		{name: "V100", clockMHz: 877, busBits: 4096, wantGBPerS: 898},
		{name: "T4", clockMHz: 5001, busBits: 256, wantGBPerS: 320},
		{name: "A10G", clockMHz: 6251, busBits: 384, wantGBPerS: 600},
		{name: "unknown clock", clockMHz: 0, busBits: 5120, wantGBPerS: 0, wantExactly: true},
		{name: "unknown bus", clockMHz: 2619, busBits: 0, wantGBPerS: 0, wantExactly: true},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			got := PeakMemBandwidth(tc.clockMHz, tc.busBits) / 1e9
			if tc.wantExactly {
				if got != tc.wantGBPerS {
					t.Errorf("PeakMemBandwidth(%d, %d) = %v GB/s; want %v", tc.clockMHz, tc.busBits, got, tc.wantGBPerS)
				}
				return
			}
			if math.Abs(got-tc.wantGBPerS)/tc.wantGBPerS > 0.001 {
				t.Errorf("PeakMemBandwidth(%d, %d) = %.1f GB/s; want %v within 0.1 %%", tc.clockMHz, tc.busBits, got, tc.wantGBPerS)
			}
		})
	}
}

func TestClockEventReasons(t *testing.T) {
	tests := []struct {
		mask uint64
		want []string
	}{
		{0, nil},
		{0x1, []string{"gpu_idle"}},
		{0x4, []string{"sw_power_cap"}},
		{0x8 | 0x40, []string{"hw_slowdown", "hw_thermal_slowdown"}},
		{0x80 | 0x20 | 0x10, []string{"sync_boost", "sw_thermal_slowdown", "hw_power_brake_slowdown"}},
		{0x2 | 0x100, []string{"applications_clocks_setting", "display_clocks_setting"}},
		{0x200 | 0x400, []string{"board_limit", "reliability"}},
		{0x800, []string{"unknown_0x800"}},
		{1 << 63, []string{"unknown_0x8000000000000000"}},
	}
	for _, tc := range tests {
		if got := ClockEventReasons(tc.mask); !slices.Equal(got, tc.want) {
			t.Errorf("ClockEventReasons(%#x) = %q; want %q", tc.mask, got, tc.want)
		}
	}
}

func TestXIDClass(t *testing.T) {
	for xid, want := range map[uint64]string{13: XIDApplication, 31: XIDApplication, 43: XIDApplication, 45: XIDApplication,
		63: XIDRecoverable, 64: XIDRecoverable, 92: XIDRecoverable, 94: XIDRecoverable, 154: XIDRecoverable,
		48: XIDFatal, 74: XIDFatal, 79: XIDFatal, 95: XIDFatal, 119: XIDFatal, 120: XIDFatal} {
		if got := XIDClass(xid); got != want {
			t.Errorf("XIDClass(%d) = %q; want %q", xid, got, want)
		}
	}
}

func TestIsApplicationXID(t *testing.T) {
	tests := []struct {
		xid  uint64
		want bool
	}{
		{13, true}, {31, true}, {43, true}, {45, true},
		{48, false}, {63, false}, {64, false}, {74, false}, {79, false}, {94, false}, {95, false}, {119, false},
	}
	for _, tc := range tests {
		if got := IsApplicationXID(tc.xid); got != tc.want {
			t.Errorf("IsApplicationXID(%d) = %v; want %v", tc.xid, got, tc.want)
		}
	}
}

const h100 = "NVIDIA H100 80GB HBM3"

// fleet returns n H100 facts and samples of GPUs under equal load.
func fleet(n int) ([]Facts, []Sample) {
	facts := make([]Facts, n)
	samples := make([]Sample, n)
	for i := range n {
		facts[i] = Facts{
			Index: i, UUID: "GPU-" + string(rune('a'+i)), Name: h100,
			MaxSMClockMHz: 1980, MaxMemClockMHz: 2619, MemBusWidthBits: 5120,
			PeakMemBandwidth: PeakMemBandwidth(2619, 5120),
		}
		samples[i] = Sample{
			Index: i, UUID: facts[i].UUID,
			SMClockMHz: ptr[uint32](1755), MemClockMHz: ptr[uint32](2619),
			GPUUtilPercent: ptr(98.0), MemUtilPercent: ptr(60.0),
			DRAMBandwidthUtilPercent: ptr(70.0),
			AchievedMemBandwidth:     ptr(0.70 * facts[i].PeakMemBandwidth), BandwidthSource: BandwidthGPM,
			ECCUncorrectedVolatile: ptr[uint64](0), RemappedRowsPending: ptr(false), RowRemapFailed: ptr(false),
			ClockEventReasons: []string{"sw_power_cap"},
		}
	}
	return facts, samples
}

func ptr[T any](v T) *T { return &v }

func TestVerdicts(t *testing.T) {
	tests := []struct {
		name      string
		n         int
		threshold float64
		edit      func(f []Facts, s []Sample)
		// want maps GPU index → substrings its reasons must contain; GPUs
		// not listed must be healthy.
		want map[int][]string
	}{
		{name: "all equal", n: 8, edit: func([]Facts, []Sample) {}},
		{
			name: "SM clock 15 % slow", n: 8,
			edit: func(_ []Facts, s []Sample) { *s[3].SMClockMHz = 1492 },
			want: map[int][]string{3: {"SM clock 1492 MHz is 15 % below the median of 7 NVIDIA H100 80GB HBM3 peers (1755 MHz) under comparable load (GPU util within 10 points of 98 %, at its power limit)"}},
		},
		{
			name: "SM clock 8 % slow is within threshold", n: 8,
			edit: func(_ []Facts, s []Sample) { *s[3].SMClockMHz = 1615 },
		},
		{
			name: "SM clock 8 % slow at threshold 0.05", n: 8, threshold: 0.05,
			edit: func(_ []Facts, s []Sample) { *s[3].SMClockMHz = 1615 },
			want: map[int][]string{3: {"SM clock 1615 MHz is 8 % below"}},
		},
		{
			name: "threshold out of range means the default", n: 8, threshold: 1.5,
			edit: func(_ []Facts, s []Sample) { *s[3].SMClockMHz = 1615 },
		},
		{
			name: "idle GPU with low clocks is healthy", n: 8,
			edit: func(_ []Facts, s []Sample) {
				*s[2].SMClockMHz, *s[2].GPUUtilPercent, s[2].ClockEventReasons = 345, 0, []string{"gpu_idle"}
			},
		},
		{
			name: "loaded GPU not compared with idle peers", n: 8,
			edit: func(_ []Facts, s []Sample) {
				for i := 1; i < 8; i++ {
					*s[i].SMClockMHz, *s[i].GPUUtilPercent = 1980, 5
				}
				*s[0].SMClockMHz = 1500
			},
		},
		{
			name: "two GPUs of a model are too few to compare", n: 2,
			edit: func(_ []Facts, s []Sample) { *s[1].SMClockMHz = 1000 },
		},
		{
			name: "three GPUs are enough", n: 3,
			edit: func(_ []Facts, s []Sample) { *s[1].SMClockMHz = 1000 },
			want: map[int][]string{1: {"SM clock 1000 MHz is 43 % below the median of 2 NVIDIA H100 80GB HBM3 peers"}},
		},
		{
			name: "other models are not peers", n: 8,
			edit: func(f []Facts, s []Sample) {
				for i := 4; i < 8; i++ {
					f[i].Name, f[i].MaxSMClockMHz = "NVIDIA A100-SXM4-80GB", 1410
					f[i].MaxMemClockMHz, f[i].PeakMemBandwidth = 1593, PeakMemBandwidth(1593, 5120)
					*s[i].SMClockMHz, *s[i].MemClockMHz = 1410, 1593
					*s[i].AchievedMemBandwidth = 0.7 * f[i].PeakMemBandwidth
				}
			},
		},
		{
			name: "lost peers are left out", n: 4,
			edit: func(_ []Facts, s []Sample) {
				s[2] = Sample{Index: 2, UUID: s[2].UUID, Lost: true}
				*s[1].SMClockMHz = 1000
			},
			want: map[int][]string{1: {"median of 2 "}, 2: {"GPU is lost"}},
		},
		{
			name: "memory clock slow under load", n: 8,
			edit: func(_ []Facts, s []Sample) { *s[5].MemClockMHz = 1900 },
			want: map[int][]string{5: {"memory clock 1900 MHz is 27 % below the median of 7 NVIDIA H100 80GB HBM3 peers (2619 MHz) under comparable load"}},
		},
		{
			// In a synchronous job the GPUs wait for each other, and pipeline stages move different
			// amounts of memory: achieved bandwidth follows the work, so it is exported, not judged.
			name: "achieved bandwidth low at equal load is not judged", n: 8,
			edit: func(f []Facts, s []Sample) {
				*s[6].AchievedMemBandwidth = 0.55 * f[6].PeakMemBandwidth
				*s[6].GPUUtilPercent = 92
			},
		},
		{
			name: "bandwidth low at lower load is not compared", n: 8,
			edit: func(f []Facts, s []Sample) {
				*s[6].AchievedMemBandwidth = 0.55 * f[6].PeakMemBandwidth
				*s[6].GPUUtilPercent = 70
			},
		},
		{
			name: "peak bandwidth below peers", n: 8,
			edit: func(f []Facts, _ []Sample) {
				f[7].MaxMemClockMHz = 2000
				f[7].PeakMemBandwidth = PeakMemBandwidth(2000, 5120)
			},
			want: map[int][]string{7: {"peak memory bandwidth 2560 GB/s is 24 % below the median of 7 NVIDIA H100 80GB HBM3 peers (3352 GB/s)"}},
		},
		{
			name: "peak bandwidth above the datasheet on every GPU is fine", n: 8,
			edit: func(f []Facts, _ []Sample) {
				for i := range f {
					f[i].Name, f[i].MaxMemClockMHz, f[i].MemBusWidthBits = "NVIDIA H200", 3201, 6144
					f[i].PeakMemBandwidth = PeakMemBandwidth(3201, 6144) // 4917 GB/s; datasheet 4800
				}
			},
		},
		{
			name: "thermal slowdown under load", n: 1,
			edit: func(_ []Facts, s []Sample) {
				*s[0].SMClockMHz = 1410
				s[0].ClockEventReasons = []string{"sw_power_cap", "hw_thermal_slowdown"}
			},
			want: map[int][]string{0: {"SM clock 1410 MHz is held 29 % below its max 1980 MHz at 98 % GPU util by hw_thermal_slowdown"}},
		},
		{
			name: "hw slowdown and power brake under load", n: 1,
			edit: func(_ []Facts, s []Sample) {
				*s[0].SMClockMHz = 1100
				s[0].ClockEventReasons = []string{"hw_slowdown", "hw_power_brake_slowdown"}
			},
			want: map[int][]string{0: {"by hw_slowdown, hw_power_brake_slowdown"}},
		},
		{
			name: "slowdown reason with unknown clock", n: 1,
			edit: func(_ []Facts, s []Sample) {
				s[0].SMClockMHz = nil
				s[0].ClockEventReasons = []string{"sw_thermal_slowdown"}
			},
			want: map[int][]string{0: {"sw_thermal_slowdown at 98 % GPU util"}},
		},
		{
			// A GPU idling in a thermal slowdown or a power brake is broken too: the rule
			// needs no load.
			name: "thermal slowdown while idle", n: 1,
			edit: func(_ []Facts, s []Sample) {
				*s[0].SMClockMHz, *s[0].GPUUtilPercent = 1410, 10
				s[0].ClockEventReasons = []string{"hw_thermal_slowdown"}
			},
			want: map[int][]string{0: {"SM clock 1410 MHz is held 29 % below its max 1980 MHz at 10 % GPU util by hw_thermal_slowdown"}},
		},
		{
			name: "power brake with no utilisation reading", n: 1,
			edit: func(_ []Facts, s []Sample) {
				*s[0].SMClockMHz, s[0].GPUUtilPercent = 345, nil
				s[0].ClockEventReasons = []string{"gpu_idle", "hw_slowdown", "hw_power_brake_slowdown"}
			},
			want: map[int][]string{0: {"at idle by hw_slowdown, hw_power_brake_slowdown"}},
		},
		{
			name: "sw thermal slowdown counted over the window", n: 1,
			edit: func(_ []Facts, s []Sample) {
				*s[0].SMClockMHz = 1500
				s[0].ClockEventTimes = []ClockEventTime{
					{Reason: "sw_power_cap", Total: time.Hour, Window: 5 * time.Second, Share: 0.9},
					{Reason: "sw_thermal_slowdown", Total: time.Minute, Window: 5 * time.Second, Share: 0.34},
				}
			},
			want: map[int][]string{0: {"held 24 % below its max 1980 MHz at 98 % GPU util by sw_thermal_slowdown (34 % of the last 5s)"}},
		},
		{
			// The counter says how long; the bit is only the instant. A bit set at the sample
			// while the counter says 2 % of the window is a brush, not a slowdown.
			name: "sw thermal counter below the share wins over the bit", n: 1,
			edit: func(_ []Facts, s []Sample) {
				*s[0].SMClockMHz = 1500
				s[0].ClockEventReasons = []string{"sw_thermal_slowdown"}
				s[0].ClockEventTimes = []ClockEventTime{{Reason: "sw_thermal_slowdown", Total: time.Minute, Window: 5 * time.Second, Share: 0.02}}
			},
		},
		{
			name: "a counter without a window falls back on the bit", n: 1,
			edit: func(_ []Facts, s []Sample) {
				*s[0].SMClockMHz = 1500
				s[0].ClockEventReasons = []string{"sw_thermal_slowdown"}
				s[0].ClockEventTimes = []ClockEventTime{{Reason: "sw_thermal_slowdown", Total: time.Minute}}
			},
			want: map[int][]string{0: {"by sw_thermal_slowdown"}},
		},
		{
			name: "slowdown with the clock at max costs nothing", n: 1,
			edit: func(_ []Facts, s []Sample) {
				*s[0].SMClockMHz = 1980
				s[0].ClockEventReasons = []string{"hw_slowdown"}
			},
		},
		{
			// Issue 14: one GPU power-capped at 1740 MHz in a GEMM while seven read 1980 MHz
			// in an NCCL phase is not slow; its load is not comparable.
			name: "power-capped GPU is not compared with peers below their power limit", n: 8,
			edit: func(_ []Facts, s []Sample) {
				for i := range s {
					*s[i].SMClockMHz, s[i].ClockEventReasons = 1980, nil
				}
				*s[4].SMClockMHz, s[4].ClockEventReasons = 1740, []string{"sw_power_cap"}
			},
		},
		{
			name: "GPU that has just gone idle is not compared", n: 8,
			edit: func(_ []Facts, s []Sample) {
				*s[2].SMClockMHz, s[2].ClockEventReasons = 345, []string{"gpu_idle"} // util still 98 from the last period
			},
		},
		{
			name: "peers at another load are not compared", n: 8,
			edit: func(_ []Facts, s []Sample) {
				*s[1].SMClockMHz, *s[1].GPUUtilPercent = 1400, 70
			},
		},
		{
			name: "power cap under load is fine", n: 1,
			edit: func(_ []Facts, s []Sample) { *s[0].SMClockMHz = 1410 },
		},
		{
			name: "uncorrected ECC errors", n: 2,
			edit: func(_ []Facts, s []Sample) { *s[1].ECCUncorrectedVolatile = 2 },
			want: map[int][]string{1: {"2 uncorrected ECC errors"}},
		},
		{
			name: "row remap pending", n: 2,
			edit: func(_ []Facts, s []Sample) { *s[0].RemappedRowsPending = true },
			want: map[int][]string{0: {"row remapping is pending"}},
		},
		{
			name: "row remap failed", n: 2,
			edit: func(_ []Facts, s []Sample) { *s[0].RowRemapFailed = true },
			want: map[int][]string{0: {"row remapping failed"}},
		},
		{
			name: "critical XID", n: 2,
			edit: func(_ []Facts, s []Sample) { s[1].XIDCritical, s[1].LastXID = 3, 79 },
			want: map[int][]string{1: {"3 critical XID errors (last XID 79): a GPU reset or a reboot is needed"}},
		},
		{
			name: "recoverable XID", n: 2,
			edit: func(_ []Facts, s []Sample) { s[0].XIDRecoverable, s[0].LastRecoverableXID = 1, 94 },
			want: map[int][]string{0: {"1 recoverable XID errors in the last 1h0m0s (last XID 94: ECC or row remapping)"}},
		},
		{
			name: "lost", n: 2,
			edit: func(_ []Facts, s []Sample) { s[0] = Sample{Index: 0, UUID: s[0].UUID, Lost: true} },
			want: map[int][]string{0: {"GPU is lost"}},
		},
		{
			name: "samples without facts are judged alone", n: 3,
			edit: func(f []Facts, s []Sample) {
				*s[0].ECCUncorrectedVolatile = 1
				*s[0].SMClockMHz = 500
				clear(f)
			},
			want: map[int][]string{0: {"1 uncorrected ECC errors"}},
		},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			facts, samples := fleet(tc.n)
			tc.edit(facts, samples)
			got := Verdicts(facts, samples, tc.threshold)
			if len(got) != len(samples) {
				t.Fatalf("len(Verdicts(%q)) = %d; want %d", tc.name, len(got), len(samples))
			}
			for i, v := range got {
				want, bad := tc.want[i]
				if v.Index != i || v.UUID != samples[i].UUID {
					t.Errorf("Verdicts(%q)[%d] names GPU %d %q; want %d %q", tc.name, i, v.Index, v.UUID, i, samples[i].UUID)
				}
				if v.Degraded != bad || v.Degraded != (len(v.Reasons) > 0) {
					t.Errorf("Verdicts(%q)[%d].Degraded = %v (reasons %q); want %v", tc.name, i, v.Degraded, v.Reasons, bad)
				}
				for _, w := range want {
					if !slices.ContainsFunc(v.Reasons, func(r string) bool { return strings.Contains(r, w) }) {
						t.Errorf("Verdicts(%q)[%d].Reasons = %q; want one containing %q", tc.name, i, v.Reasons, w)
					}
				}
			}
		})
	}
}

func TestVerdictsLostHasOnlyThatReason(t *testing.T) {
	facts, samples := fleet(4)
	samples[1].Lost = true // stale metrics must not add reasons
	*samples[1].ECCUncorrectedVolatile = 9
	got := Verdicts(facts, samples, 0)
	if want := 1; len(got[1].Reasons) != want {
		t.Errorf("Verdicts(lost).Reasons = %q; want %d reason", got[1].Reasons, want)
	}
}

func TestVerdictsSayWhatTheyCannotJudge(t *testing.T) {
	tests := []struct {
		name string
		n    int
		edit func(f []Facts, s []Sample)
		want []string // substrings of GPU 0's Unjudged, in order
	}{
		{name: "eight GPUs with every metric", n: 8, edit: func([]Facts, []Sample) {}},
		{name: "a single GPU has no peers", n: 1, edit: func([]Facts, []Sample) {},
			want: []string{"peer comparisons: 1 GPU(s) of this model, 3 needed"}},
		{name: "MIG mode gives no utilisation", n: 8,
			edit: func(f []Facts, s []Sample) {
				for i := range s {
					f[i].MIG, s[i].GPUUtilPercent, s[i].MemUtilPercent = true, nil, nil
				}
			},
			want: []string{"peer clock comparisons: MIG mode, where NVML gives no utilisation of the whole GPU (throttling, ECC, row remapping and XIDs are judged)"}},
		{name: "no model", n: 3, edit: func(f []Facts, _ []Sample) { f[0].Name = "" },
			want: []string{"peer comparisons: the GPU's model is unknown"}},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			facts, samples := fleet(tc.n)
			tc.edit(facts, samples)
			v := Verdicts(facts, samples, 0)[0]
			if len(v.Unjudged) != len(tc.want) {
				t.Fatalf("Verdicts(%q)[0].Unjudged = %q; want %d entries like %q", tc.name, v.Unjudged, len(tc.want), tc.want)
			}
			for i, w := range tc.want {
				if !strings.Contains(v.Unjudged[i], w) {
					t.Errorf("Verdicts(%q)[0].Unjudged[%d] = %q; want it to contain %q", tc.name, i, v.Unjudged[i], w)
				}
			}
		})
	}
}

// TestMIGSlowdownIsJudged: in MIG mode NVML gives no utilisation of the whole GPU, but its throttling
// and memory health are the parent's, and they are judged.
func TestMIGSlowdownIsJudged(t *testing.T) {
	facts, samples := fleet(8)
	for i := range samples {
		facts[i].MIG, samples[i].GPUUtilPercent, samples[i].MemUtilPercent = true, nil, nil
	}
	*samples[3].SMClockMHz, samples[3].ClockEventReasons = 1200, []string{"hw_thermal_slowdown"}
	*samples[5].SMClockMHz = 900 // no utilisation: not compared with peers, however low
	var j Judge
	var vs []Verdict
	for k := range DefaultEvidenceN {
		vs = j.Judge(time.Unix(int64(k), 0), Verdicts(facts, samples, 0))
	}
	for i, v := range vs {
		if want := i == 3; v.Degraded != want {
			t.Errorf("GPU %d in MIG mode: Degraded = %v (%q); want %v", i, v.Degraded, v.Reasons, want)
		}
		if len(v.Unjudged) == 0 || !strings.Contains(v.Unjudged[0], "MIG mode") {
			t.Errorf("GPU %d in MIG mode: Unjudged = %q; want the MIG note", i, v.Unjudged)
		}
	}
}

func TestIsSlowdownReason(t *testing.T) {
	for name, want := range map[string]bool{
		"hw_slowdown": true, "hw_thermal_slowdown": true, "hw_power_brake_slowdown": true, "sw_thermal_slowdown": true,
		"sw_power_cap": false, "gpu_idle": false, "applications_clocks_setting": false, "sync_boost": false, "unknown_0x800": false,
	} {
		if got := IsSlowdownReason(name); got != want {
			t.Errorf("Got(%q) = %v; want %v", name, got, want)
		}
	}
}
