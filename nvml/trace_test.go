//go:build linux && cgo

package nvml

import (
	"context"
	"fmt"
	"math/rand/v2"
	"strings"
	"testing"
	"testing/synctest"
	"time"

	gonvml "github.com/NVIDIA/go-nvml/pkg/nvml"
	"github.com/NVIDIA/go-nvml/pkg/nvml/mock/dgxh100"
	"github.com/NVIDIA/go-nvml/pkg/nvml/mock/server"
)

// Traces replayed through the adapter over go-nvml's mock of an 8 × H100 server, as the agent
// samples: every 5 s a Sample, Verdicts, a Judge with the defaults (3 of the last 5). Each trace is
// seeded and replayable; the readings follow what NVML reports in those phases of real training.

const (
	traceTick  = 5 * time.Second
	traceTicks = 60 // five minutes
	traceSeed  = 14
)

// Reason bits of nvml.h.
const (
	bitIdle        = 0x1
	bitPowerCap    = 0x4
	bitHWSlowdown  = 0x8
	bitSWThermal   = 0x20
	bitHWThermal   = 0x40
	bitPowerBrake  = 0x80
	h100MaxSM      = 1980
	h100MaxMem     = 2619
	h100PowerLimit = 700_000 // mW
)

// traceRig is a rig whose GPUs each count their own clock event time.
func traceRig(srv *server.Server) *rig {
	r := newRig(srv, h100State())
	for _, st := range r.gpus {
		st.viol = map[gonvml.PerfPolicyType]uint64{gonvml.PERF_POLICY_POWER: 0, gonvml.PERF_POLICY_THERMAL: 0}
	}
	return r
}

// gemm puts st in a GEMM at the power limit: busy, power-capped for the whole tick, the SM clock
// wherever the power limit holds it.
func gemm(st *gpuState, rng *rand.Rand) {
	st.util, st.reasons, st.sm = 100, bitPowerCap, uint32(1700+rng.IntN(120))
	st.powerMW, st.dramUtil = uint32(h100PowerLimit-rng.IntN(10_000)), float64(40+rng.IntN(30))
	st.viol[gonvml.PERF_POLICY_POWER] += uint64(traceTick) * uint64(80+rng.IntN(20)) / 100
}

// nccl puts st in an all-reduce: NCCL's kernels keep the GPU "busy", far below the power limit, at
// the maximum clock.
func nccl(st *gpuState, rng *rand.Rand) {
	st.util, st.reasons, st.sm = uint32(95+rng.IntN(6)), 0, h100MaxSM
	st.powerMW, st.dramUtil = uint32(330_000+rng.IntN(120_000)), float64(5+rng.IntN(15))
	st.viol[gonvml.PERF_POLICY_POWER] += uint64(traceTick) * uint64(rng.IntN(10)) / 100
}

// dataParallel is one tick of data-parallel training: every GPU is, at the instant it is sampled,
// in a GEMM (60 %) or in NCCL (40 %), independently of the others.
func dataParallel(r *rig, rng *rand.Rand) {
	for _, st := range r.gpus {
		if rng.IntN(10) < 6 {
			gemm(st, rng)
		} else {
			nccl(st, rng)
		}
		st.mem = h100MaxMem
	}
}

// replay runs ticks samples of r, calling step before each, and returns for each GPU the first
// tick at which it was degraded (-1: never) and its reasons then, and the last verdicts.
func replay(t *testing.T, r *rig, ticks int, step func(tick int)) (first []int, why [][]string, last []Verdict) {
	t.Helper()
	g := r.open(t, testLog(t))
	ctx, cancel := context.WithCancel(t.Context())
	events := make(chan struct{})
	go func() { g.RunEvents(ctx); close(events) }()
	defer func() { cancel(); <-events }()
	first = make([]int, len(r.gpus))
	why = make([][]string, len(r.gpus))
	for i := range first {
		first[i] = -1
	}
	var j Judge
	for tick := range ticks {
		step(tick)
		synctest.Wait() // XIDs sent by step are counted before the sample
		samples := g.Sample(t.Context())
		last = j.Judge(time.Now(), Verdicts(g.Facts(), samples, DefaultThreshold))
		for i, v := range last {
			if v.Degraded && first[i] < 0 {
				first[i], why[i] = tick, v.Reasons
			}
		}
		advance(traceTick)
	}
	return first, why, last
}

// wantDegraded checks that exactly the GPUs in want were degraded, each first at a tick ≤ its
// bound, with a reason containing its text.
func wantDegraded(t *testing.T, first []int, why [][]string, want map[int]struct {
	by   int
	text string
}) {
	t.Helper()
	for i, f := range first {
		w, bad := want[i]
		switch {
		case !bad && f >= 0:
			t.Errorf("GPU %d degraded at tick %d: %q; want never", i, f, why[i])
		case bad && (f < 0 || f > w.by):
			t.Errorf("GPU %d first degraded at tick %d (%q); want by tick %d", i, f, why[i], w.by)
		case bad && !strings.Contains(strings.Join(why[i], "; "), w.text):
			t.Errorf("GPU %d degraded for %q; want a reason containing %q", i, why[i], w.text)
		}
	}
}

type want = map[int]struct {
	by   int
	text string
}

func TestTraceDataParallelPowerCapping(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		rng := rand.New(rand.NewPCG(traceSeed, 1))
		r := traceRig(dgxh100.New())
		first, why, _ := replay(t, r, traceTicks, func(tick int) {
			dataParallel(r, rng)
			if tick%7 == 3 {
				// Issue 14's case: one GPU power-capped at 1740 MHz in a GEMM, seven at 1980 in NCCL.
				for i, st := range r.gpus {
					if i == 4 {
						gemm(st, rng)
						st.sm = 1740
					} else {
						nccl(st, rng)
					}
				}
			}
		})
		wantDegraded(t, first, why, nil)
	})
}

func TestTraceJobEndsGPUsFallIdle(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		rng := rand.New(rand.NewPCG(traceSeed, 2))
		r := traceRig(dgxh100.New())
		first, why, _ := replay(t, r, 40, func(tick int) {
			dataParallel(r, rng)
			for i, st := range r.gpus {
				switch idle := tick - 10 - 2*i; {
				case idle == 0:
					// Utilisation covers the last period, the clock is read now: 100 % busy at 345 MHz.
					st.util, st.reasons, st.sm, st.powerMW, st.dramUtil = 100, bitIdle, 345, 95_000, 0
				case idle > 0:
					st.util, st.reasons, st.sm, st.powerMW, st.dramUtil = 0, bitIdle, 345, 70_000, 0
				}
			}
		})
		wantDegraded(t, first, why, nil)
	})
}

func TestTracePipelineStages(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		rng := rand.New(rand.NewPCG(traceSeed, 3))
		r := traceRig(dgxh100.New())
		first, why, _ := replay(t, r, traceTicks, func(int) {
			for i, st := range r.gpus {
				st.mem = h100MaxMem
				st.dramUtil = float64(15 + 10*i + rng.IntN(8)) // each stage moves its own share of memory
				if i%2 == 0 {
					gemm(st, rng) // attention and MLP stages at the power limit
					st.util = uint32(85 + rng.IntN(16))
				} else {
					nccl(st, rng) // embedding, loss and memory-bound stages below it
					st.util = uint32(70 + rng.IntN(31))
					st.sm = uint32(h100MaxSM - rng.IntN(60))
				}
			}
		})
		wantDegraded(t, first, why, nil)
	})
}

func TestTraceMIG(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		rng := rand.New(rand.NewPCG(traceSeed, 4))
		srv := dgxh100.New()
		for _, d := range srv.Devices {
			d.(*server.Device).SetMigMode(gonvml.DEVICE_MIG_ENABLE)
		}
		r := traceRig(srv)
		for _, st := range r.gpus {
			st.unsupported = map[string]bool{"GetUtilizationRates": true, "GpmQueryDeviceSupport": true}
		}
		first, why, last := replay(t, r, traceTicks, func(int) {
			for _, st := range r.gpus {
				// Instances busy or idle: the parent's clock follows its busiest instance.
				st.sm, st.reasons = uint32(345+rng.IntN(h100MaxSM-345)), 0
				if rng.IntN(3) == 0 {
					st.reasons = bitPowerCap
				}
			}
		})
		wantDegraded(t, first, why, nil)
		for i, v := range last {
			if len(v.Unjudged) == 0 || !strings.Contains(v.Unjudged[0], "MIG mode") {
				t.Errorf("GPU %d in MIG mode: Unjudged = %q; want the MIG note", i, v.Unjudged)
			}
		}
	})
}

func TestTraceApplicationXIDStorm(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		rng := rand.New(rand.NewPCG(traceSeed, 5))
		r := traceRig(dgxh100.New())
		app := []uint64{13, 31, 43, 45}
		first, why, _ := replay(t, r, traceTicks, func(tick int) {
			dataParallel(r, rng)
			if tick >= 10 && tick < 20 { // a bad kernel faults on every rank, ten times a tick
				for range 10 {
					for dev := range r.devs {
						r.events <- gonvml.EventData{Device: r.devs[dev], EventType: gonvml.EventTypeXidCriticalError, EventData: app[rng.IntN(len(app))]}
					}
				}
			}
		})
		wantDegraded(t, first, why, nil)
	})
}

// TestTraceFaultsAreCaught: real faults in the same noisy training are caught within the judge's
// window (by the third sample that shows them), and nothing else is.
func TestTraceFaultsAreCaught(t *testing.T) {
	tests := []struct {
		name  string
		fault func(r *rig, rng *rand.Rand, tick int)
		want  want
	}{
		{
			name: "memory clock and bandwidth 15 % low",
			fault: func(r *rig, _ *rand.Rand, _ int) {
				st := r.gpus[5]
				st.mem, st.dramUtil = h100MaxMem*85/100, st.dramUtil*0.85
			},
			want: want{5: {4, "memory clock 2226 MHz is 15 % below the median"}},
		},
		{
			// The silicon lottery: a leaky chip always at its power limit, 15 % below its peers'
			// clock in the same GEMMs.
			name: "SM clock 15 % low at the power limit",
			fault: func(r *rig, rng *rand.Rand, _ int) {
				st := r.gpus[3]
				gemm(st, rng)
				st.sm = st.sm * 85 / 100
			},
			want: want{3: {2, "under comparable load (GPU util within 10 points of 100 %, at its power limit)"}},
		},
		{
			name: "cooling failure: sw thermal slowdown 40 % of the time",
			fault: func(r *rig, _ *rand.Rand, _ int) {
				st := r.gpus[6]
				st.viol[gonvml.PERF_POLICY_THERMAL] += uint64(traceTick) * 40 / 100
				st.sm, st.reasons = 1500, bitPowerCap|bitSWThermal
			},
			want: want{6: {2, "sw_thermal_slowdown (40 % of the last 5s)"}},
		},
		{
			name: "idle GPU stuck in a power brake",
			fault: func(r *rig, _ *rand.Rand, _ int) {
				st := r.gpus[1]
				st.util, st.reasons, st.sm, st.powerMW = 0, bitIdle|bitHWSlowdown|bitPowerBrake, 345, 60_000
			},
			want: want{1: {2, "by hw_slowdown, hw_power_brake_slowdown"}},
		},
		{
			name: "a fatal XID",
			fault: func(r *rig, _ *rand.Rand, _ int) {
				r.events <- gonvml.EventData{Device: r.devs[7], EventType: gonvml.EventTypeXidCriticalError, EventData: 79}
			},
			want: want{7: {0, "critical XID errors (last XID 79)"}},
		},
		{
			// A thermal blip of one sample in five is weather, not a fault.
			name: "a one-tick thermal blip is not a fault",
			fault: func(r *rig, _ *rand.Rand, tick int) {
				if tick%5 == 2 {
					r.gpus[2].sm, r.gpus[2].reasons = 1400, bitHWThermal
				}
			},
		},
	}
	for k, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			synctest.Test(t, func(t *testing.T) {
				rng := rand.New(rand.NewPCG(traceSeed, uint64(10+k)))
				r := traceRig(dgxh100.New())
				first, why, _ := replay(t, r, 20, func(tick int) {
					dataParallel(r, rng)
					tc.fault(r, rng, tick)
				})
				wantDegraded(t, first, why, tc.want)
			})
		})
	}
}

// TestTraceReplayable: the same seed gives the same verdicts.
func TestTraceReplayable(t *testing.T) {
	run := func() string {
		var out string
		synctest.Test(t, func(t *testing.T) {
			rng := rand.New(rand.NewPCG(traceSeed, 99))
			r := traceRig(dgxh100.New())
			first, why, _ := replay(t, r, 10, func(int) {
				dataParallel(r, rng)
				r.gpus[0].mem = 2000
			})
			out = fmt.Sprint(first, why)
		})
		return out
	}
	if a, b := run(), run(); a != b {
		t.Errorf("two replays of one seed differ:\n%s\n%s", a, b)
	}
}
