package e2e

import (
	"fmt"
	"math/rand/v2"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"
)

// BenchmarkNoticeToSignal measures, over 20 notices, the time from a spot notice becoming visible
// in AWS's simulator (its --mock-trigger-time, a whole second) to the trainer receiving the signal
// (the trainer's own clock, same host). Each notice gets a fresh simulator and a fresh agent,
// started at a random phase within the second. It also reports the agent's own part: from the
// IMDS answer to the signal (/status since_detected_ms).
// Target: p99 ≤ poll interval + 50 ms.
//
//	make bench   (or: go test -run '^$' -bench NoticeToSignal -benchtime 1x ./test/e2e/)
func BenchmarkNoticeToSignal(b *testing.B) {
	needPeers(b)
	const notices = 20
	tp := startTrainer(b)
	b.ResetTimer()
	for range b.N {
		var visibleToSignal, readToSignal []float64 // milliseconds
		for i := range notices {
			sim := newIMDS(b)
			trigger := time.Now().Truncate(time.Second).Add(3 * time.Second)
			sim.start("spot", "-a", "terminate", "--mock-trigger-time", trigger.UTC().Format(time.RFC3339),
				"--rebalance-delay-sec", "100000")
			// A fresh agent, started at a random phase within the second, so that its polls
			// fall at a random point relative to the notice's whole-second trigger time, as
			// they would on EC2.
			<-time.After(time.Duration(rand.Int64N(int64(time.Second))))
			ap := startAgent(b, sim, "SPOTGUARD_TRAINER_PIDFILE="+tp.pidfile, "SPOTGUARD_NOTICES_REBALANCE=ignore",
				"SPOTGUARD_LOG_LEVEL=warn")
			sigs := waitSignalsB(b, tp, i+1)
			got := time.Unix(0, sigs[i].TimeNS)
			visibleToSignal = append(visibleToSignal, float64(got.Sub(trigger).Microseconds())/1000)
			for _, ns := range ap.status(b).Notices {
				for _, tr := range ns.Transitions {
					if ns.Key == "spot/terminate" && tr.State == "trainer_signalled" {
						readToSignal = append(readToSignal, tr.SinceDetectedMS)
					}
				}
			}
			ap.stop(b)
			sim.stop()
		}
		slices.Sort(visibleToSignal)
		slices.Sort(readToSignal)
		b.ReportMetric(percentile(visibleToSignal, 50), "p50_visible_to_signal_ms")
		b.ReportMetric(percentile(visibleToSignal, 99), "p99_visible_to_signal_ms")
		b.ReportMetric(visibleToSignal[len(visibleToSignal)-1], "max_visible_to_signal_ms")
		b.ReportMetric(percentile(readToSignal, 50), "p50_read_to_signal_ms")
		b.ReportMetric(percentile(readToSignal, 99), "p99_read_to_signal_ms")
		b.Logf("visible→signal ms (sorted): %v", visibleToSignal)
	}
}

func waitSignalsB(b *testing.B, tp *trainerProc, n int) []signalRecord {
	b.Helper()
	eventually(b, 30*time.Second, fmt.Sprintf("signal #%d", n), func() bool { return len(tp.signals(b)) >= n })
	return tp.signals(b)
}

// percentile of sorted values, nearest rank.
func percentile(sorted []float64, p float64) float64 {
	if len(sorted) == 0 {
		return 0
	}
	rank := int(p/100*float64(len(sorted))+0.999999) - 1
	return sorted[max(0, min(rank, len(sorted)-1))]
}

// BenchmarkIdleCost runs `spotguard run` for 60 s (BENCH_IDLE_SECONDS to change it) at the default
// poll interval against the simulator with no notice, with a trainer and a watched checkpoint
// directory and file:// store, and reports CPU seconds used, the share of one core, and peak RSS
// (VmHWM). Targets: ≤ 0.5 % of one core, ≤ 30 MiB.
func BenchmarkIdleCost(b *testing.B) {
	needPeers(b)
	window := 60 * time.Second
	if s := os.Getenv("BENCH_IDLE_SECONDS"); s != "" {
		n, err := strconv.Atoi(s)
		if err != nil {
			b.Fatalf("BENCH_IDLE_SECONDS=%q: %v", s, err)
		}
		window = time.Duration(n) * time.Second
	}
	sim := newIMDS(b)
	sim.start("spot", "-d", "100000", "--rebalance-delay-sec", "100000")
	tp := startTrainer(b)
	// The whole agent: IMDS polling, trainer scans, and the checkpoint watcher on a directory
	// holding one committed checkpoint (uploaded at start, before the window).
	ckdir := b.TempDir()
	os.MkdirAll(filepath.Join(ckdir, "step-000001"), 0o755)
	os.WriteFile(filepath.Join(ckdir, "step-000001", "w.bin"), make([]byte, 1<<20), 0o644)
	os.WriteFile(filepath.Join(ckdir, "step-000001", "_COMPLETE"), nil, 0o644)
	ap := startAgent(b, sim, "SPOTGUARD_TRAINER_PIDFILE="+tp.pidfile, "SPOTGUARD_LOG_LEVEL=info",
		"SPOTGUARD_CHECKPOINT_DIR="+ckdir, "SPOTGUARD_STORE_URL=file://"+b.TempDir(), "SPOTGUARD_STORE_JOB=bench")
	eventually(b, 30*time.Second, "the existing checkpoint to be committed", func() bool {
		return hasLine(ap.metrics(b), `spotguard_checkpoints_committed_total{trigger="periodic"} 1`)
	})
	pid := ap.cmd.Process.Pid
	b.ResetTimer()
	for range b.N {
		cpu0 := cpuSeconds(b, pid)
		start := time.Now()
		<-time.After(window) // the measurement window itself, not a wait for an event
		cpu := cpuSeconds(b, pid) - cpu0
		elapsed := time.Since(start).Seconds()
		polls := ap.status(b).polls("spot")
		b.ReportMetric(cpu, "cpu_seconds")
		b.ReportMetric(100*cpu/elapsed, "pct_of_one_core")
		b.ReportMetric(float64(procStatusKB(b, pid, "VmHWM"))/1024, "peak_rss_MiB")
		b.ReportMetric(float64(polls), "spot_polls")
	}
}

// cpuSeconds is user + system CPU time of pid, from /proc/PID/stat.
func cpuSeconds(b *testing.B, pid int) float64 {
	b.Helper()
	data, err := os.ReadFile(fmt.Sprintf("/proc/%d/stat", pid))
	if err != nil {
		b.Fatal(err)
	}
	// Fields after the command name, which is in parentheses and may hold spaces.
	fields := strings.Fields(string(data[strings.LastIndexByte(string(data), ')')+2:]))
	utime, _ := strconv.ParseFloat(fields[11], 64)
	stime, _ := strconv.ParseFloat(fields[12], 64)
	const clkTck = 100 // USER_HZ on Linux
	return (utime + stime) / clkTck
}

// procStatusKB reads one "kB" line of /proc/PID/status.
func procStatusKB(b *testing.B, pid int, name string) int {
	b.Helper()
	data, err := os.ReadFile(fmt.Sprintf("/proc/%d/status", pid))
	if err != nil {
		b.Fatal(err)
	}
	for _, line := range strings.Split(string(data), "\n") {
		if v, ok := strings.CutPrefix(line, name+":"); ok {
			n, _ := strconv.Atoi(strings.TrimSpace(strings.TrimSuffix(strings.TrimSpace(v), "kB")))
			return n
		}
	}
	b.Fatalf("no %s in /proc/%d/status", name, pid)
	return 0
}
