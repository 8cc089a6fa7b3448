package main

import (
	"bytes"
	"encoding/json"
	"math"
	"strings"
	"testing"
	"time"

	"github.com/spotguard/spotguard/checkpoint"
)

// planRun runs `spotguard plan args…` and returns the exit code, stdout and stderr.
func planRun(t *testing.T, args ...string) (int, string, string) {
	t.Helper()
	var out, errb bytes.Buffer
	code := run(t.Context(), append([]string{"plan"}, args...), nil, &out, &errb)
	return code, out.String(), errb.String()
}

func TestPlanText(t *testing.T) {
	code, stdout, stderr := planRun(t, "--mtbi", "24h", "--save-cost", "5m", "--price", "32.77", "--spot-price", "12.5")
	if code != exitOK {
		t.Fatalf("Got(exit) = %d; want %d; stderr %q", code, exitOK, stderr)
	}
	for _, want := range []string{
		"save cost C                        5m",
		"mean time between interruptions M  24h",
		"interruptions a month              30.4",
		"Young sqrt(2CM)                    2h ",
		"Daly (used below)                  1h 57m               6h 16m",
		"loss per interruption              1h 8m = τ/2 + R",
		"saving a month                     31.3 h (4.3%)",
		"lost a month                       34.6 h (4.7%)",
		"overhead a month                   65.9 h (9.0%)",
		"overhead cost a month              $824.08",
		"$32.77/h = $4.096 per GPU-hour (8 GPUs)",
		"$12.5/h = $1.562 per GPU-hour (8 GPUs)",
		"spot saving                        61.9% = 1 − spot/on-demand",
		"a month (730 h) at spot            $9125.00",
		"Checkpoint every 1h 57m (Daly; Young says 2h).",
		"With notice-triggered saves that succeed with probability 0.90, the interval becomes 6h 16m",
		"(1−q)·τ/2 + R = 28m 48s",
		"Assumptions:",
		"Interruptions are a Poisson process",
		"The restart R defaults to 10 min",
	} {
		if !strings.Contains(stdout, want) {
			t.Errorf("Got(stdout) lacks %q:\n%s", want, stdout)
		}
	}
	for _, line := range strings.Split(stdout, "\n") {
		if strings.HasSuffix(line, " ") {
			t.Errorf("Got(line %q) ends in a space; want none", line)
		}
	}
	if !strings.Contains(stderr, "warning: a save is in the store only 5m after it starts, later than the 2m Spot notice") {
		t.Errorf("Got(stderr) = %q; want the warning about a save longer than the notice", stderr)
	}
}

func TestPlanTextRateAndSize(t *testing.T) {
	code, stdout, stderr := planRun(t, "--interruption-rate", "5-10%", "--size", "40GiB", "--throughput", "250MB/s", "--restart", "15m", "--notice-success", "0")
	if code != exitOK {
		t.Fatalf("Got(exit) = %d; want %d; stderr %q", code, exitOK, stderr)
	}
	for _, want := range []string{
		"save cost C                        2m 52s (40GiB at 250MB/s)",
		"restart R                          15m",
		"390d 4h (interruption rate 5-10% a month, taken as 7.5%)",
		"M = 730 h / −ln(1 − p)",
		"size / throughput",
		"probability 0.00, the interval becomes 29h 52m",
	} {
		if !strings.Contains(stdout, want) {
			t.Errorf("Got(stdout) lacks %q:\n%s", want, stdout)
		}
	}
	for _, unwanted := range []string{"Price", "overhead cost", "defaults to 10 min"} {
		if strings.Contains(stdout, unwanted) {
			t.Errorf("Got(stdout) has %q; want it only when it applies:\n%s", unwanted, stdout)
		}
	}
	if stderr != "" {
		t.Errorf("Got(stderr) = %q; want nothing with q = 0", stderr)
	}
}

func TestPlanJSON(t *testing.T) {
	code, stdout, stderr := planRun(t, "--json", "--interruption-rate", "8.7%", "--size", "40GiB", "--throughput", "250MB/s",
		"--restart", "10m", "--price", "32.77", "--spot-price", "12.5", "--gpus", "8", "--notice-success", "90%")
	if code != exitOK {
		t.Fatalf("Got(exit) = %d; want %d; stderr %q", code, exitOK, stderr)
	}
	var r planJSON
	if err := json.Unmarshal([]byte(stdout), &r); err != nil {
		t.Fatalf("Got(stdout) not JSON: %v\n%s", err, stdout)
	}
	c := 40.0 * (1 << 30) / 250e6
	m := 730 * 3600 / -math.Log(1-0.087)
	tau := math.Sqrt(2*c*m)*(1+math.Sqrt(c/(2*m))/3+c/(2*m)/9) - c
	mq := m / (1 - 0.9)
	tauq := math.Sqrt(2*c*mq)*(1+math.Sqrt(c/(2*mq))/3+c/(2*mq)/9) - c
	n := 730 * 3600 / m
	deref := func(p *float64) float64 {
		if p == nil {
			return math.NaN()
		}
		return *p
	}
	tests := []struct {
		name      string
		got, want float64
	}{
		{"inputs.save_cost_s", r.Inputs.SaveCostS, c},
		{"inputs.size_bytes", deref(r.Inputs.SizeBytes), 40 * (1 << 30)},
		{"inputs.throughput_bytes_per_s", deref(r.Inputs.ThroughputBytesPerS), 250e6},
		{"inputs.restart_s", r.Inputs.RestartS, 600},
		{"inputs.mtbi_s", r.Inputs.MTBIS, m},
		{"inputs.monthly_interruption_probability", deref(r.Inputs.MonthlyInterruptionProbability), 0.087},
		{"inputs.notice_success", r.Inputs.NoticeSuccess, 0.9},
		{"inputs.price_per_hour", deref(r.Inputs.PricePerHour), 32.77},
		{"inputs.spot_price_per_hour", deref(r.Inputs.SpotPricePerHour), 12.5},
		{"inputs.gpus", float64(r.Inputs.GPUs), 8},
		{"month_s", r.MonthS, 730 * 3600},
		{"interruptions_per_month", r.InterruptionsPerMonth, n},
		{"periodic.young_interval_s", r.Periodic.YoungS, math.Sqrt(2 * c * m)},
		{"periodic.daly_interval_s", r.Periodic.DalyS, tau},
		{"periodic.loss_per_interruption_s", r.Periodic.LossPerInterruptionS, tau/2 + 600},
		{"periodic.saving_per_month_s", r.Periodic.SavingS, 730 * 3600 * c / tau},
		{"periodic.lost_per_month_s", r.Periodic.LostS, n * (tau/2 + 600)},
		{"periodic.overhead_share", r.Periodic.OverheadShare, c/tau + (tau/2+600)/m},
		{"periodic.overhead_per_month_usd", deref(r.Periodic.OverheadUSD), (730*c/tau + n*(tau/2+600)/3600) * 12.5},
		{"with_notice.mtbi_s", r.WithNotice.MTBIS, mq},
		{"with_notice.daly_interval_s", r.WithNotice.DalyS, tauq},
		{"with_notice.loss_per_interruption_s", r.WithNotice.LossPerInterruptionS, 0.1*tauq/2 + 600},
		{"with_notice.lost_per_month_s", r.WithNotice.LostS, n * (0.1*tauq/2 + 600)},
		{"prices.cost_price_per_hour", r.Prices.CostPricePerHour, 12.5},
		{"prices.per_gpu_hour", deref(r.Prices.PerGPUHour), 32.77 / 8},
		{"prices.spot_per_gpu_hour", deref(r.Prices.SpotPerGPUHour), 12.5 / 8},
		{"prices.spot_saving", deref(r.Prices.SpotSaving), 1 - 12.5/32.77},
		{"prices.month_usd", r.Prices.MonthUSD, 730 * 12.5},
	}
	for _, tt := range tests {
		if math.IsNaN(tt.got) || math.Abs(tt.got-tt.want) > 1e-6*math.Max(1, math.Abs(tt.want)) {
			t.Errorf("Got(%s) = %v; want %v", tt.name, tt.got, tt.want)
		}
	}
	if r.Inputs.InterruptionRate != "8.7%" {
		t.Errorf("Got(inputs.interruption_rate) = %q; want %q", r.Inputs.InterruptionRate, "8.7%")
	}
	if len(r.Assumptions) == 0 || len(r.Warnings) != 1 {
		t.Errorf("Got(assumptions, warnings) = %q, %q; want some assumptions and the notice warning", r.Assumptions, r.Warnings)
	}
}

func TestPlanJSONLeavesOutWhatWasNotGiven(t *testing.T) {
	code, stdout, stderr := planRun(t, "--json", "--mtbi", "6h", "--save-cost", "90s")
	if code != exitOK {
		t.Fatalf("Got(exit) = %d; want %d; stderr %q", code, exitOK, stderr)
	}
	for _, absent := range []string{"prices", "usd", "size_bytes", "interruption_rate", "price_per_hour"} {
		if strings.Contains(stdout, absent) {
			t.Errorf("Got(stdout) has %q; want it left out:\n%s", absent, stdout)
		}
	}
	var r planJSON
	if err := json.Unmarshal([]byte(stdout), &r); err != nil {
		t.Fatalf("Got(stdout) not JSON: %v", err)
	}
	// C = 90 s, M = 6 h: sqrt(2·90·21600)·(1 + ⅓·sqrt(90/43200) + ⅑·90/43200) − 90 ≈ 1912.3 s.
	if math.Abs(r.Periodic.DalyS-1912.3) > 0.1 {
		t.Errorf("Got(periodic.daly_interval_s) = %v; want ≈ 1912.3", r.Periodic.DalyS)
	}
	if r.Warnings == nil || len(r.Warnings) != 0 {
		t.Errorf("Got(warnings) = %#v; want an empty list", r.Warnings)
	}
}

func TestPlanSpotAboveOnDemandIsAWarning(t *testing.T) {
	code, stdout, stderr := planRun(t, "--mtbi", "6h", "--save-cost", "1m", "--price", "10", "--spot-price", "12")
	if code != exitOK {
		t.Fatalf("Got(exit) = %d; want %d; stderr %q", code, exitOK, stderr)
	}
	if !strings.Contains(stderr, "warning: the spot price $12/h is above the on-demand price $10/h") {
		t.Errorf("Got(stderr) = %q; want the spot-above-on-demand warning", stderr)
	}
	if !strings.Contains(stdout, "spot saving                        -20.0%") {
		t.Errorf("Got(stdout) lacks the negative saving:\n%s", stdout)
	}
}

func TestPlanRejects(t *testing.T) {
	ok := []string{"--mtbi", "24h", "--save-cost", "5m"}
	with := func(extra ...string) []string { return append(append([]string{}, ok...), extra...) }
	tests := []struct {
		name string
		args []string
		want string
	}{
		{"zero mtbi", []string{"--mtbi", "0s", "--save-cost", "5m"}, `invalid value "0s" for flag -mtbi: must be positive`},
		{"negative mtbi", []string{"--mtbi", "-1h", "--save-cost", "5m"}, `flag -mtbi: must be positive`},
		{"bad mtbi", []string{"--mtbi", "soon", "--save-cost", "5m"}, `flag -mtbi: not a duration`},
		{"zero save cost", []string{"--mtbi", "24h", "--save-cost", "0"}, `flag -save-cost: must be positive`},
		{"negative save cost", []string{"--mtbi", "24h", "--save-cost", "-5m"}, `flag -save-cost: must be positive`},
		{"zero restart", with("--restart", "0s"), `flag -restart: must be positive`},
		{"negative restart days", with("--restart", "-1d"), `flag -restart: must be positive`},
		{"zero gpus", with("--gpus", "0"), `flag -gpus: must be at least 1`},
		{"negative gpus", with("--gpus", "-8"), `flag -gpus: must be at least 1`},
		{"fractional gpus", with("--gpus", "1.5"), `flag -gpus: not a whole number`},
		{"rate 100%", []string{"--interruption-rate", "100%", "--save-cost", "5m"}, `flag -interruption-rate: interruption rate 100% must be above 0% and below 100%`},
		{"rate 150%", []string{"--interruption-rate", "150%", "--save-cost", "5m"}, `flag -interruption-rate: interruption rate 150%`},
		{"rate 0%", []string{"--interruption-rate", "0%", "--save-cost", "5m"}, `must be above 0%`},
		{"unknown bucket", []string{"--interruption-rate", "3-7%", "--save-cost", "5m"}, `flag -interruption-rate: unknown interruption rate "3-7%"`},
		{"bare number rate", []string{"--interruption-rate", "8.7", "--save-cost", "5m"}, `flag -interruption-rate: unknown interruption rate "8.7"`},
		{"both mtbi and rate", with("--interruption-rate", "5-10%"), "--mtbi and --interruption-rate both say how often"},
		{"neither mtbi nor rate", []string{"--save-cost", "5m"}, "need --mtbi or --interruption-rate"},
		{"no save cost", []string{"--mtbi", "24h"}, "need --save-cost, or --size with --throughput"},
		{"save cost and size", with("--size", "40GiB", "--throughput", "250MB/s"), "--save-cost and --size/--throughput both give the save cost"},
		{"save cost and throughput", with("--throughput", "250MB/s"), "--save-cost and --size/--throughput"},
		{"size without throughput", []string{"--mtbi", "24h", "--size", "40GiB"}, "--size needs --throughput"},
		{"throughput without size", []string{"--mtbi", "24h", "--throughput", "250MB/s"}, "--throughput needs --size"},
		{"zero size", []string{"--mtbi", "24h", "--size", "0GiB", "--throughput", "1GB/s"}, `flag -size: must be positive`},
		{"bad size", []string{"--mtbi", "24h", "--size", "big", "--throughput", "1GB/s"}, `flag -size: not a size`},
		{"bits are no size", []string{"--mtbi", "24h", "--size", "8Gbit", "--throughput", "1GB/s"}, `flag -size: not a size`},
		{"zero throughput", []string{"--mtbi", "24h", "--size", "1GiB", "--throughput", "0MB/s"}, `flag -throughput: must be positive`},
		{"q = 1", with("--notice-success", "1"), `flag -notice-success: must be at least 0 and below 1`},
		{"q = 100%", with("--notice-success", "100%"), `flag -notice-success: must be at least 0 and below 1`},
		{"q < 0", with("--notice-success", "-0.1"), `flag -notice-success: must be at least 0`},
		{"q not a number", with("--notice-success", "likely"), `flag -notice-success: not a probability`},
		{"negative price", with("--price", "-3"), `flag -price: a price cannot be negative`},
		{"zero price", with("--price", "0"), `flag -price: a price of 0`},
		{"negative spot price", with("--spot-price", "-1.5"), `flag -spot-price: a price cannot be negative`},
		{"bad price", with("--price", "cheap"), `flag -price: not a price`},
		{"unknown flag", with("--bogus"), "flag provided but not defined: -bogus"},
		{"stray argument", with("extra"), `unexpected argument "extra"`},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			code, stdout, stderr := planRun(t, tt.args...)
			if code != exitUsage {
				t.Errorf("Got(%q) exit = %d; want %d", tt.args, code, exitUsage)
			}
			if !strings.Contains(stderr, tt.want) {
				t.Errorf("Got(%q) stderr = %q; want it to contain %q", tt.args, stderr, tt.want)
			}
			if stdout != "" {
				t.Errorf("Got(%q) stdout = %q; want nothing", tt.args, stdout)
			}
		})
	}
}

func TestPlanHelp(t *testing.T) {
	code, stdout, stderr := planRun(t, "-h")
	if code != exitOK || stdout != "" || !strings.Contains(stderr, "-interruption-rate bucket") {
		t.Errorf("Got(plan -h) = %d, %q, %q; want 0 and the flags on stderr", code, stdout, stderr)
	}
	var out bytes.Buffer
	if code := run(t.Context(), []string{"help"}, nil, &out, &out); code != exitOK || !strings.Contains(out.String(), "  plan      how often to checkpoint") {
		t.Errorf("Got(help) = %d, %q; want plan listed", code, out.String())
	}
}

func TestPlanParseDuration(t *testing.T) {
	tests := []struct {
		in   string
		want time.Duration
	}{
		{"90s", 90 * time.Second},
		{"1h30m", 90 * time.Minute},
		{"1d", 24 * time.Hour},
		{"1.5d", 36 * time.Hour},
		{"2d12h", 60 * time.Hour},
		{" 3d ", 72 * time.Hour},
	}
	for _, tt := range tests {
		got, err := planParsePositiveDuration(tt.in)
		if err != nil || got != tt.want {
			t.Errorf("Got(%q) = %v, %v; want %v", tt.in, got, err, tt.want)
		}
	}
	for _, bad := range []string{"", "d", "1dd", "1d-2h", "1d+2h", "xd", "1e9d", "NaNd", "-1d", "0d", "5"} {
		if got, err := planParsePositiveDuration(bad); err == nil {
			t.Errorf("Got(%q) = %v, nil; want an error", bad, got)
		}
	}
}

func TestPlanParseBytes(t *testing.T) {
	tests := []struct {
		in   string
		rate bool
		want float64
	}{
		{"40GiB", false, 40 << 30},
		{"512MiB", false, 512 << 20},
		{"2.5GB", false, 2.5e9},
		{"1048576", false, 1 << 20},
		{"100 kb", false, 1e5},
		{"1TiB", false, 1 << 40},
		{"250MB/s", true, 250e6},
		{"1GiB/s", true, 1 << 30},
		{"10Gbit/s", true, 10e9 / 8},
		{"10Gbps", true, 10e9 / 8},
		{"800mbit", true, 100e6},
	}
	for _, tt := range tests {
		got, err := checkpoint.ParseBytes(tt.in, tt.rate)
		if err != nil || math.Abs(got-tt.want) > 1e-6 {
			t.Errorf("Got(%q) = %v, %v; want %v", tt.in, got, err, tt.want)
		}
	}
}

func TestPlanHuman(t *testing.T) {
	tests := []struct {
		in   time.Duration
		want string
	}{
		{1500 * time.Millisecond, "1.5s"},
		{5 * time.Minute, "5m"},
		{4*time.Minute + 30*time.Second, "4m 30s"},
		{6 * time.Hour, "6h"},
		{time.Duration(116.69 * float64(time.Minute)), "1h 57m"},
		{240 * time.Hour, "10d"},
		{9363*time.Hour + 30*time.Minute, "390d 4h"},
		{100 * 365 * 24 * time.Hour, "100 years"},
	}
	for _, tt := range tests {
		if got := planHuman(tt.in); got != tt.want {
			t.Errorf("Got(%v) = %q; want %q", tt.in, got, tt.want)
		}
	}
}
