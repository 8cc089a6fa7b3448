package checkpoint

import (
	"math"
	"strings"
	"testing"
	"time"
)

// planNear reports whether got is within tol of want.
func planNear(got, want, tol time.Duration) bool {
	d := got - want
	return -tol <= d && d <= tol
}

func planClose(got, want float64) bool {
	return math.Abs(got-want) <= 1e-9*math.Max(1, math.Abs(want))
}

func TestPlanDalyInterval(t *testing.T) {
	tests := []struct {
		name string
		c, m time.Duration
		want time.Duration // exact to the millisecond
		tol  time.Duration
	}{
		// The worked examples: ≈117 min and ≈57 min.
		{"M=24h C=5m", 5 * time.Minute, 24 * time.Hour, 117 * time.Minute, time.Minute},
		{"M=6h C=5m", 5 * time.Minute, 6 * time.Hour, 57 * time.Minute, time.Minute},
		// The same, to the second: 120·(1 + 1/72·(1/… )) − 5 min.
		{"M=24h C=5m exact", 5 * time.Minute, 24 * time.Hour, time.Duration(116.6898148 * float64(time.Minute)), time.Millisecond},
		{"M=6h C=5m exact", 5 * time.Minute, 6 * time.Hour, time.Duration(56.7129630 * float64(time.Minute)), time.Millisecond},
		{"C = 2M is M", 2 * time.Hour, time.Hour, time.Hour, 0},
		{"C > 2M is M", 5 * time.Hour, time.Hour, time.Hour, 0},
		{"zero C", 0, time.Hour, 0, 0},
		{"zero M", time.Minute, 0, 0, 0},
		{"negative C", -time.Minute, time.Hour, 0, 0},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			if got := DalyInterval(tt.c, tt.m); !planNear(got, tt.want, tt.tol) {
				t.Errorf("Got(%q) = %v; want %v ± %v", tt.name, got, tt.want, tt.tol)
			}
		})
	}
}

func TestPlanDalyNearYoungForSmallC(t *testing.T) {
	// For C ≪ M, sqrt(2CM)·(1/3)·sqrt(C/2M) = C/3, so Daly ≈ Young − 2C/3: the two agree to
	// first order.
	c, m := 10*time.Second, 30*24*time.Hour
	y, d := YoungInterval(c, m), DalyInterval(c, m)
	if want := y - 2*c/3; !planNear(d, want, 10*time.Millisecond) {
		t.Errorf("Got(Daly(%v, %v)) = %v; want ≈ Young − 2C/3 = %v", c, m, d, want)
	}
}

func TestPlanYoungInterval(t *testing.T) {
	tests := []struct {
		name string
		c, m time.Duration
		want time.Duration
	}{
		{"M=24h C=5m", 5 * time.Minute, 24 * time.Hour, 120 * time.Minute},
		{"M=6h C=5m", 5 * time.Minute, 6 * time.Hour, 60 * time.Minute},
		{"M=240h C=5m", 5 * time.Minute, 240 * time.Hour, time.Duration(math.Sqrt(2*300*864000) * 1e9)},
		{"zero", 0, time.Hour, 0},
		{"negative M", time.Minute, -time.Hour, 0},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			if got := YoungInterval(tt.c, tt.m); !planNear(got, tt.want, time.Microsecond) {
				t.Errorf("Got(%q) = %v; want %v", tt.name, got, tt.want)
			}
		})
	}
}

func TestPlanParseInterruptionRate(t *testing.T) {
	tests := []struct {
		in   string
		want float64
	}{
		{"<5%", 0.025},
		{"5-10%", 0.075},
		{"5–10%", 0.075}, // en dash, as the Advisor prints it
		{"10-15%", 0.125},
		{"15-20%", 0.175},
		{">20%", 0.25},
		{" >20% ", 0.25},
		{"8.7%", 0.087},
		{"34%", 0.34},
		{"99.9%", 0.999},
		{"0.5 %", 0.005},
	}
	for _, tt := range tests {
		t.Run(tt.in, func(t *testing.T) {
			got, err := ParseInterruptionRate(tt.in)
			if err != nil || !planClose(got, tt.want) {
				t.Errorf("Got(%q) = %v, %v; want %v", tt.in, got, err, tt.want)
			}
		})
	}
}

func TestPlanParseInterruptionRateRejects(t *testing.T) {
	tests := []struct {
		in, want string
	}{
		{"100%", "below 100%"},
		{"150%", "below 100%"},
		{"0%", "above 0%"},
		{"-5%", "above 0%"},
		{"8.7", "unknown interruption rate"},
		{"3-7%", "unknown interruption rate"},
		{"<10%", "unknown interruption rate"},
		{"high", "unknown interruption rate"},
		{"", "unknown interruption rate"},
		{"abc%", "not a percentage"},
		{"NaN%", "not a percentage"},
		{"Inf%", "not a percentage"},
	}
	for _, tt := range tests {
		t.Run(tt.in, func(t *testing.T) {
			got, err := ParseInterruptionRate(tt.in)
			if err == nil || !strings.Contains(err.Error(), tt.want) {
				t.Errorf("Got(%q) = %v, %v; want an error containing %q", tt.in, got, err, tt.want)
			}
		})
	}
}

func TestPlanMTBIFromMonthlyRate(t *testing.T) {
	tests := []struct {
		name string
		p    float64
		want time.Duration
	}{
		// M = 730 h / −ln(1 − p).
		{"<5% bucket", 0.025, time.Duration(730 / -math.Log(0.975) * float64(time.Hour))},
		{"5-10% bucket", 0.075, time.Duration(730 / -math.Log(0.925) * float64(time.Hour))},
		{">20% bucket", 0.25, time.Duration(730 / -math.Log(0.75) * float64(time.Hour))},
		{"8.7%", 0.087, time.Duration(730 / -math.Log(0.913) * float64(time.Hour))},
		{"1 − 1/e is one a month", 1 - 1/math.E, 730 * time.Hour},
		{"tiny p is capped", 1e-12, math.MaxInt64},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			got, err := MTBIFromMonthlyRate(tt.p)
			if err != nil || !planNear(got, tt.want, time.Millisecond) {
				t.Errorf("Got(%v) = %v, %v; want %v", tt.p, got, err, tt.want)
			}
			if tt.want == math.MaxInt64 {
				return
			}
			// Round trip: the chance of at least one interruption in 730 h is p.
			if back := 1 - math.Exp(-PlanMonth.Hours()/got.Hours()); math.Abs(back-tt.p) > 1e-9 {
				t.Errorf("Got(P(≥1 in 730 h | M = %v)) = %v; want %v", got, back, tt.p)
			}
		})
	}
	// The bucket the SEEDS call typical: 5-10 % a month is about 390 days between interruptions.
	if m, _ := MTBIFromMonthlyRate(0.075); m.Hours() < 9363 || m.Hours() > 9364 {
		t.Errorf("Got(MTBI(7.5%%)) = %.1f h; want 9363.5 h", m.Hours())
	}
	for _, p := range []float64{0, 1, -0.1, 1.5, math.NaN()} {
		if got, err := MTBIFromMonthlyRate(p); err == nil {
			t.Errorf("Got(%v) = %v, nil; want an error", p, got)
		}
	}
}

func TestPlanNoticeMTBI(t *testing.T) {
	tests := []struct {
		q    float64
		want time.Duration
	}{
		{0, 24 * time.Hour},
		{0.5, 48 * time.Hour},
		{0.9, 240 * time.Hour},
		{0.99, 2400 * time.Hour},
	}
	for _, tt := range tests {
		got, err := NoticeMTBI(24*time.Hour, tt.q)
		if err != nil || !planNear(got, tt.want, time.Millisecond) {
			t.Errorf("Got(%v) = %v, %v; want %v", tt.q, got, err, tt.want)
		}
	}
	for _, q := range []float64{1, 1.1, -0.1, math.NaN()} {
		if got, err := NoticeMTBI(24*time.Hour, q); err == nil {
			t.Errorf("Got(%v) = %v, nil; want an error", q, got)
		}
	}
	// Capped, not wrapped, when M/(1−q) outgrows a Duration.
	if got, err := NoticeMTBI(200*365*24*time.Hour, 0.9); err != nil || got != math.MaxInt64 {
		t.Errorf("Got(200 years, 0.9) = %v, %v; want the largest Duration", got, err)
	}
}

func TestPlanNewPlan(t *testing.T) {
	in := PlanInput{
		SaveCost:      5 * time.Minute,
		Restart:       10 * time.Minute,
		MTBI:          24 * time.Hour,
		NoticeSuccess: 0.9,
		Price:         32.77,
		SpotPrice:     12.5,
		GPUs:          8,
	}
	p, err := NewPlan(in)
	if err != nil {
		t.Fatalf("NewPlan: %v", err)
	}
	month := 730.0 // hours
	checkF := func(name string, got, want float64) {
		t.Helper()
		if !planClose(got, want) && math.Abs(got-want) > 1e-6 {
			t.Errorf("Got(%q) = %v; want %v", name, got, want)
		}
	}
	checkD := func(name string, got, want time.Duration) {
		t.Helper()
		if !planNear(got, want, time.Microsecond) {
			t.Errorf("Got(%q) = %v; want %v", name, got, want)
		}
	}
	checkF("interruptions per month", p.InterruptionsPerMonth, month/24)

	// Periodic saves only, at Daly's interval.
	tau := DalyInterval(in.SaveCost, in.MTBI)
	checkD("periodic MTBI", p.Periodic.MTBI, in.MTBI)
	checkD("periodic Young", p.Periodic.Young, 2*time.Hour)
	checkD("periodic Daly", p.Periodic.Daly, tau)
	checkD("periodic loss", p.Periodic.LossPerInterruption, tau/2+in.Restart)
	saving := month * 5 / tau.Minutes() // hours
	lost := month / 24 * (tau/2 + in.Restart).Hours()
	checkF("periodic saving h", p.Periodic.Saving.Hours(), saving)
	checkF("periodic lost h", p.Periodic.Lost.Hours(), lost)
	checkF("periodic overhead h", p.Periodic.Overhead.Hours(), saving+lost)
	checkF("periodic saving share", p.Periodic.SavingShare, saving/month)
	checkF("periodic lost share", p.Periodic.LostShare, lost/month)
	checkF("periodic overhead share", p.Periodic.OverheadShare, (saving+lost)/month)
	checkF("periodic saving USD", p.Periodic.SavingCost, saving*12.5)
	checkF("periodic lost USD", p.Periodic.LostCost, lost*12.5)
	checkF("periodic overhead USD", p.Periodic.OverheadCost, (saving+lost)*12.5)
	if s := p.Periodic.SavingShare; s < 0.042 || s > 0.043 { // 5 / 116.7
		t.Errorf("Got(saving share) = %v; want ≈ 4.3 %%", s)
	}

	// With notice saves: M/(1−q) = 240 h for the interval, (1−q)·τ/2 + R per interruption, and
	// still 730/24 interruptions a month.
	tq := DalyInterval(in.SaveCost, 240*time.Hour)
	checkD("notice MTBI", p.Notice.MTBI, 240*time.Hour)
	checkD("notice Young", p.Notice.Young, YoungInterval(in.SaveCost, 240*time.Hour))
	checkD("notice Daly", p.Notice.Daly, tq)
	if tq.Minutes() < 375 || tq.Minutes() > 377 {
		t.Errorf("Got(notice Daly) = %v; want ≈ 6h16m", tq)
	}
	nloss := time.Duration(0.1*float64(tq)/2) + in.Restart
	checkD("notice loss", p.Notice.LossPerInterruption, nloss)
	nsaving := month * 5 / tq.Minutes()
	nlost := month / 24 * nloss.Hours()
	checkF("notice saving h", p.Notice.Saving.Hours(), nsaving)
	checkF("notice lost h", p.Notice.Lost.Hours(), nlost)
	checkF("notice overhead USD", p.Notice.OverheadCost, (nsaving+nlost)*12.5)
	if p.Notice.OverheadShare >= p.Periodic.OverheadShare {
		t.Errorf("Got(notice overhead %v ≥ periodic %v); want notice saves to cut the overhead", p.Notice.OverheadShare, p.Periodic.OverheadShare)
	}

	// Prices.
	checkF("cost price", p.CostPrice, 12.5)
	checkF("per GPU-hour", p.PerGPUHour, 32.77/8)
	checkF("spot per GPU-hour", p.SpotPerGPUHour, 12.5/8)
	checkF("spot saving", p.SpotSaving, 1-12.5/32.77)
	checkF("month cost", p.MonthCost, 730*12.5)
	if len(p.Warnings) != 1 || !strings.Contains(p.Warnings[0], "Spot notice") {
		t.Errorf("Got(warnings) = %q; want only the one about a save longer than the notice", p.Warnings)
	}
}

func TestPlanPrices(t *testing.T) {
	base := PlanInput{SaveCost: time.Minute, Restart: 5 * time.Minute, MTBI: 6 * time.Hour, NoticeSuccess: 0.9, GPUs: 4}
	tests := []struct {
		name                  string
		price, spot           float64
		cost, perGPU, spotGPU float64
		saving, monthCost     float64
		warn                  string // "" for none
	}{
		{name: "no price"},
		{name: "on-demand only", price: 40, cost: 40, perGPU: 10, monthCost: 29200},
		{name: "spot only", spot: 12, cost: 12, spotGPU: 3, monthCost: 8760},
		{name: "both", price: 40, spot: 12, cost: 12, perGPU: 10, spotGPU: 3, saving: 0.7, monthCost: 8760},
		{name: "spot above on-demand", price: 10, spot: 12, cost: 12, perGPU: 2.5, spotGPU: 3, saving: -0.2, monthCost: 8760, warn: "above the on-demand price"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			in := base
			in.Price, in.SpotPrice = tt.price, tt.spot
			p, err := NewPlan(in)
			if err != nil {
				t.Fatalf("Got(%q) error %v; want none", tt.name, err)
			}
			for _, c := range []struct {
				what      string
				got, want float64
			}{
				{"cost price", p.CostPrice, tt.cost},
				{"per GPU-hour", p.PerGPUHour, tt.perGPU},
				{"spot per GPU-hour", p.SpotPerGPUHour, tt.spotGPU},
				{"spot saving", p.SpotSaving, tt.saving},
				{"month cost", p.MonthCost, tt.monthCost},
				{"periodic overhead cost", p.Periodic.OverheadCost, p.Periodic.Overhead.Hours() * tt.cost},
				{"notice overhead cost", p.Notice.OverheadCost, p.Notice.Overhead.Hours() * tt.cost},
			} {
				if !planClose(c.got, c.want) {
					t.Errorf("Got(%q %s) = %v; want %v", tt.name, c.what, c.got, c.want)
				}
			}
			joined := strings.Join(p.Warnings, "\n")
			if tt.warn == "" && joined != "" || tt.warn != "" && !strings.Contains(joined, tt.warn) {
				t.Errorf("Got(%q warnings) = %q; want %q", tt.name, joined, tt.warn)
			}
		})
	}
}

func TestPlanWarnings(t *testing.T) {
	tests := []struct {
		name string
		in   PlanInput
		want []string
	}{
		{"quick save, no warning", PlanInput{SaveCost: time.Minute, Restart: time.Minute, MTBI: 24 * time.Hour, NoticeSuccess: 0.9, GPUs: 1}, nil},
		{"slow save but no notice saves", PlanInput{SaveCost: 10 * time.Minute, Restart: time.Minute, MTBI: 24 * time.Hour, GPUs: 1}, nil},
		{"save longer than the notice", PlanInput{SaveCost: 3 * time.Minute, Restart: time.Minute, MTBI: 24 * time.Hour, NoticeSuccess: 0.5, GPUs: 1}, []string{"later than the 2m Spot notice"}},
		{"save at least 2M", PlanInput{SaveCost: 2 * time.Hour, Restart: time.Minute, MTBI: time.Hour, GPUs: 1}, []string{"at least twice", "no progress"}},
		// A save that costs next to nothing gets an interval shorter than its commit.
		{"interval shorter than the commit", PlanInput{SaveCost: time.Nanosecond, Commit: time.Second, Restart: time.Minute, MTBI: 72 * time.Hour, NoticeSuccess: 0.9, GPUs: 1},
			[]string{"a save is in the store only 1s after it starts, longer than the interval (100ms): the next save starts before the last one is in the store; save no more often than every 1s"}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			p, err := NewPlan(tt.in)
			if err != nil {
				t.Fatalf("Got(%q) error %v; want none", tt.name, err)
			}
			if len(p.Warnings) != len(tt.want) {
				t.Fatalf("Got(%q) = %q; want %d warning(s) %q", tt.name, p.Warnings, len(tt.want), tt.want)
			}
			for i, w := range tt.want {
				if !strings.Contains(p.Warnings[i], w) {
					t.Errorf("Got(%q)[%d] = %q; want it to contain %q", tt.name, i, p.Warnings[i], w)
				}
			}
		})
	}
	// C ≥ 2M: Daly's interval is M itself.
	p, _ := NewPlan(tests[3].in)
	if p.Periodic.Daly != time.Hour {
		t.Errorf("Got(Daly for C = 2M) = %v; want M = 1h", p.Periodic.Daly)
	}
}

func TestPlanRejects(t *testing.T) {
	good := PlanInput{SaveCost: 5 * time.Minute, Restart: 10 * time.Minute, MTBI: 24 * time.Hour, NoticeSuccess: 0.9, Price: 32.77, SpotPrice: 12.5, GPUs: 8}
	tests := []struct {
		name string
		edit func(*PlanInput)
		want string
	}{
		{"zero save cost", func(in *PlanInput) { in.SaveCost = 0 }, "save cost 0s must be positive"},
		{"negative save cost", func(in *PlanInput) { in.SaveCost = -time.Minute }, "save cost -1m0s must be positive"},
		{"zero restart", func(in *PlanInput) { in.Restart = 0 }, "restart time 0s must be positive"},
		{"negative restart", func(in *PlanInput) { in.Restart = -time.Second }, "restart time -1s must be positive"},
		{"zero MTBI", func(in *PlanInput) { in.MTBI = 0 }, "mean time between interruptions 0s must be positive"},
		{"negative MTBI", func(in *PlanInput) { in.MTBI = -time.Hour }, "mean time between interruptions -1h0m0s must be positive"},
		{"q = 1", func(in *PlanInput) { in.NoticeSuccess = 1 }, "notice-save success probability 1 must be at least 0 and below 1"},
		{"q > 1", func(in *PlanInput) { in.NoticeSuccess = 1.5 }, "notice-save success probability 1.5"},
		{"q < 0", func(in *PlanInput) { in.NoticeSuccess = -0.1 }, "notice-save success probability -0.1"},
		{"q NaN", func(in *PlanInput) { in.NoticeSuccess = math.NaN() }, "notice-save success probability NaN"},
		{"negative price", func(in *PlanInput) { in.Price = -1 }, "on-demand price -1 must not be negative"},
		{"infinite price", func(in *PlanInput) { in.Price = math.Inf(1) }, "on-demand price +Inf"},
		{"negative spot price", func(in *PlanInput) { in.SpotPrice = -2 }, "spot price -2 must not be negative"},
		{"zero GPUs", func(in *PlanInput) { in.GPUs = 0 }, "GPU count 0 must be positive"},
		{"negative GPUs", func(in *PlanInput) { in.GPUs = -8 }, "GPU count -8 must be positive"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			in := good
			tt.edit(&in)
			p, err := NewPlan(in)
			if err == nil || !strings.Contains(err.Error(), tt.want) {
				t.Errorf("Got(%q) = %+v, %v; want an error containing %q", tt.name, p, err, tt.want)
			}
		})
	}
	// Every problem at once.
	err := PlanInput{NoticeSuccess: 2, Price: -1, SpotPrice: -1}.Validate()
	if err == nil || strings.Count(err.Error(), "\n") != 6 {
		t.Errorf("Got(every field bad) = %v; want 7 problems, one a line", err)
	}
	if err := good.Validate(); err != nil {
		t.Errorf("Got(good) = %v; want nil", err)
	}
}

// planWant is the plan for in, failing the test on an error.
func planWant(t *testing.T, in PlanInput) Plan {
	t.Helper()
	p, err := NewPlan(in)
	if err != nil {
		t.Fatalf("NewPlan(%+v): %v", in, err)
	}
	return p
}

// A notice can save the work since the last periodic save only when a save is in the store
// within the notice: max(write, upload) + commit ≤ 2 min. Otherwise the recommendation is the
// interval for q = 0, whatever q was given, and says why.
func TestPlanRecommendation(t *testing.T) {
	base := PlanInput{SaveCost: 30 * time.Second, Commit: time.Second, Restart: 10 * time.Minute, MTBI: 24 * time.Hour, NoticeSuccess: 0.9, GPUs: 8}
	tests := []struct {
		name       string
		edit       func(*PlanInput)
		durable    time.Duration
		withNotice bool
		reason     []string
		warn       string // "" for no warning
	}{
		{"quick save fits", func(in *PlanInput) {}, 31 * time.Second, true,
			[]string{"with notice-triggered saves", "31s (stall 30s + commit 1s)", "within the 2m Spot notice", "q = 0.90 only 10% of interruptions", "M/(1−q) = 10d"}, ""},
		{"upload in the background fits", func(in *PlanInput) { in.Upload = 90 * time.Second }, 91 * time.Second, true,
			[]string{"1m 31s (max(write 30s, upload 1m 30s) + commit 1s)", "within the 2m Spot notice"}, ""},
		{"exactly the notice fits", func(in *PlanInput) { in.Upload = 119 * time.Second }, 2 * time.Minute, true,
			[]string{"within the 2m Spot notice"}, ""},
		{"a second over the notice", func(in *PlanInput) { in.Upload = 2 * time.Minute }, 2*time.Minute + time.Second, false,
			[]string{"periodic saves only", "2m 1s (max(write 30s, upload 2m) + commit 1s)", "later than the 2m Spot notice", "q = 0.90 does not apply (q = 0)"},
			"later than the 2m Spot notice"},
		{"save longer than the notice", func(in *PlanInput) { in.SaveCost = 5 * time.Minute }, 5*time.Minute + time.Second, false,
			[]string{"periodic saves only", "5m 1s (stall 5m + commit 1s)", "a notice cannot save it", "would allow every 6h 16m at q = 0.90 (overhead 3.3% instead of 9.0%)"},
			"the notice-save success probability 0.90 is not used"},
		{"quick write, slow upload", func(in *PlanInput) { in.Upload = 3 * time.Minute }, 3*time.Minute + time.Second, false,
			[]string{"max(write 30s, upload 3m) + commit 1s", "a notice cannot save it"}, "a notice cannot save it"},
		{"q = 0", func(in *PlanInput) { in.NoticeSuccess = 0 }, 31 * time.Second, false,
			[]string{"periodic saves only: the notice-save success probability q is 0"}, ""},
		{"q = 0 and a slow save", func(in *PlanInput) { in.NoticeSuccess, in.SaveCost = 0, 5*time.Minute }, 5*time.Minute + time.Second, false,
			[]string{"q is 0"}, ""},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			in := base
			tt.edit(&in)
			p := planWant(t, in)
			rec := p.Recommendation
			if p.Save.Durable != tt.durable || p.Save.FitsNotice != (tt.durable <= 2*time.Minute) {
				t.Errorf("Got(%q save) = %+v; want durable %v", tt.name, p.Save, tt.durable)
			}
			if rec.WithNotice != tt.withNotice {
				t.Errorf("Got(%q WithNotice) = %v; want %v", tt.name, rec.WithNotice, tt.withNotice)
			}
			// The interval is Daly's for C and M/(1−q), q the one recommended.
			wantQ, want := 0.0, p.Periodic
			if tt.withNotice {
				wantQ, want = in.NoticeSuccess, p.Notice
			}
			if rec.NoticeSuccess != wantQ || rec.PlanPolicy != want {
				t.Errorf("Got(%q recommendation) = q %v, %+v; want q %v, %+v", tt.name, rec.NoticeSuccess, rec.PlanPolicy, wantQ, want)
			}
			mq, _ := NoticeMTBI(in.MTBI, wantQ)
			if d := DalyInterval(in.SaveCost, mq); !planNear(rec.Daly, d, time.Microsecond) {
				t.Errorf("Got(%q interval) = %v; want DalyInterval(C, M/(1−%v)) = %v", tt.name, rec.Daly, wantQ, d)
			}
			for _, r := range tt.reason {
				if !strings.Contains(rec.Reason, r) {
					t.Errorf("Got(%q reason) = %q; want it to contain %q", tt.name, rec.Reason, r)
				}
			}
			if rec.UpperBound || rec.Caveat != "" {
				t.Errorf("Got(%q caveat) = %v, %q; want none for an M given", tt.name, rec.UpperBound, rec.Caveat)
			}
			joined := strings.Join(p.Warnings, "\n")
			if tt.warn == "" && joined != "" || tt.warn != "" && !strings.Contains(joined, tt.warn) {
				t.Errorf("Got(%q warnings) = %q; want %q", tt.name, joined, tt.warn)
			}
		})
	}
}

// The stall C sets the interval and the time spent saving; the upload runs in the background and
// only decides whether a notice's save is in the store in time.
func TestPlanUploadIsNotTheStall(t *testing.T) {
	in := PlanInput{SaveCost: 40 * time.Second, Restart: 10 * time.Minute, MTBI: 24 * time.Hour, NoticeSuccess: 0.9, GPUs: 8}
	quick := planWant(t, in)
	in.Upload = 172 * time.Second // 40 GiB at 250 MB/s
	slow := planWant(t, in)
	if slow.Periodic != quick.Periodic || slow.Notice != quick.Notice {
		t.Errorf("Got(periodic, notice with a 172 s upload) = %+v, %+v; want the same as without: %+v, %+v", slow.Periodic, slow.Notice, quick.Periodic, quick.Notice)
	}
	if !quick.Save.FitsNotice || slow.Save.FitsNotice {
		t.Errorf("Got(fits the notice) = %v without the upload, %v with it; want true, false", quick.Save.FitsNotice, slow.Save.FitsNotice)
	}
	if !quick.Recommendation.WithNotice || slow.Recommendation.WithNotice {
		t.Errorf("Got(with notice) = %v, %v; want true, false", quick.Recommendation.WithNotice, slow.Recommendation.WithNotice)
	}
	if want := DalyInterval(40*time.Second, 24*time.Hour); slow.Recommendation.Daly != want {
		t.Errorf("Got(interval) = %v; want Daly for the 40 s stall, %v", slow.Recommendation.Daly, want)
	}
	// An upload longer than the interval falls behind.
	in.MTBI, in.Upload = time.Hour, time.Hour
	p := planWant(t, in)
	if j := strings.Join(p.Warnings, "\n"); !strings.Contains(j, "takes longer than the interval") {
		t.Errorf("Got(warnings) = %q; want the upload that falls behind", j)
	}
}

// An M from a monthly rate is an upper bound: the recommendation says so and shows the M used.
func TestPlanRecommendationFromRate(t *testing.T) {
	base := PlanInput{SaveCost: 5 * time.Minute, Restart: 10 * time.Minute, NoticeSuccess: 0.9, GPUs: 8}
	tests := []struct {
		rate   string
		p      float64
		caveat []string
	}{
		{"<5%", 0.025, []string{"M = 1201d 9h comes from the Spot Instance Advisor's bucket <5% (taken at 2.5%)", "one instance type in one region", "not an estimate", "lower bound on your rate", "M and the interval are upper bounds", "(--mtbi)"}},
		{"5–10%", 0.075, []string{"M = 390d 4h comes from the Spot Instance Advisor's bucket 5-10% (taken at 7.5%)"}},
		{">20%", 0.25, []string{"bucket >20% (taken at 25%)"}},
		{"8.7%", 0.087, []string{"comes from the monthly interruption rate 8.7%:", "upper bounds"}},
	}
	for _, tt := range tests {
		t.Run(tt.rate, func(t *testing.T) {
			in := base
			in.InterruptionRate = tt.rate
			p := planWant(t, in)
			m, _ := MTBIFromMonthlyRate(tt.p)
			if p.Input.MTBI != m || !planClose(p.MonthlyRate, tt.p) {
				t.Errorf("Got(%q M, p) = %v, %v; want %v, %v", tt.rate, p.Input.MTBI, p.MonthlyRate, m, tt.p)
			}
			rec := p.Recommendation
			if !rec.UpperBound {
				t.Errorf("Got(%q UpperBound) = false; want true", tt.rate)
			}
			for _, c := range tt.caveat {
				if !strings.Contains(rec.Caveat, c) {
					t.Errorf("Got(%q caveat) = %q; want it to contain %q", tt.rate, rec.Caveat, c)
				}
			}
			// A 5-minute save does not fit in the notice: periodic saves at M.
			if want := DalyInterval(5*time.Minute, m); rec.WithNotice || rec.Daly != want {
				t.Errorf("Got(%q interval) = %v (with notice %v); want %v for periodic saves", tt.rate, rec.Daly, rec.WithNotice, want)
			}
		})
	}
	// The <5% bucket with a 2-minute save and periodic saves only: every 43 h, as the user saw,
	// now with its caveat.
	in := base
	in.InterruptionRate, in.SaveCost, in.NoticeSuccess = "<5%", 2*time.Minute, 0
	if got := planWant(t, in).Recommendation.Daly; got.Hours() < 43 || got.Hours() >= 44 {
		t.Errorf("Got(<5%% interval) = %v; want 43 h and some", got)
	}
	for _, bad := range []PlanInput{
		{SaveCost: time.Minute, Restart: time.Minute, GPUs: 1, InterruptionRate: "<5%", MTBI: time.Hour},
		{SaveCost: time.Minute, Restart: time.Minute, GPUs: 1, InterruptionRate: "often"},
	} {
		if _, err := NewPlan(bad); err == nil {
			t.Errorf("Got(NewPlan(%+v)) = nil error; want one", bad)
		}
	}
}

// Each sensitivity row is the formula at M' = f·M: Daly's interval for C and M'/(1−q), and the
// month's overhead 730 h·C/τ + (730 h/M')·((1−q)·τ/2 + R), at that interval and at the
// recommended one.
func TestPlanSensitivity(t *testing.T) {
	tests := []struct {
		name string
		in   PlanInput
		q    float64 // the recommendation's q
	}{
		{"notice saves", PlanInput{SaveCost: 40 * time.Second, Upload: 70 * time.Second, Commit: time.Second, Restart: 10 * time.Minute, MTBI: 24 * time.Hour, NoticeSuccess: 0.9, SpotPrice: 12.5, GPUs: 8}, 0.9},
		{"save longer than the notice", PlanInput{SaveCost: 5 * time.Minute, Restart: 10 * time.Minute, MTBI: 24 * time.Hour, NoticeSuccess: 0.9, Price: 32.77, GPUs: 8}, 0},
		{"bucket", PlanInput{SaveCost: 5 * time.Minute, Restart: 10 * time.Minute, InterruptionRate: "<5%", NoticeSuccess: 0.5, GPUs: 8}, 0},
		{"no price", PlanInput{SaveCost: 10 * time.Second, Restart: 5 * time.Minute, MTBI: 6 * time.Hour, NoticeSuccess: 0.5, GPUs: 1}, 0.5},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			p := planWant(t, tt.in)
			if p.Recommendation.NoticeSuccess != tt.q {
				t.Fatalf("Got(%q q) = %v; want %v", tt.name, p.Recommendation.NoticeSuccess, tt.q)
			}
			if len(p.Sensitivity) != 2 || p.Sensitivity[0].Factor != 0.5 || p.Sensitivity[1].Factor != 2 {
				t.Fatalf("Got(%q sensitivity) = %+v; want rows for M × ½ and M × 2", tt.name, p.Sensitivity)
			}
			c, r, m := tt.in.SaveCost.Seconds(), tt.in.Restart.Seconds(), p.Input.MTBI.Seconds()
			month, q := 730*3600.0, tt.q
			tau0 := p.Recommendation.Daly.Seconds()
			overhead := func(mf, tau float64) float64 { return month*c/tau + month/mf*((1-q)*tau/2+r) }
			for _, s := range p.Sensitivity {
				mf := s.Factor * m
				tau := DalyInterval(tt.in.SaveCost, time.Duration(mf/(1-q)*1e9)).Seconds()
				for _, c := range []struct {
					what      string
					got, want float64
				}{
					{"M'", s.MTBI.Seconds(), mf},
					{"interruptions a month", s.InterruptionsPerMonth, month / mf},
					{"interval", s.Interval.Seconds(), tau},
					{"optimal loss", s.Optimal.LossPerInterruption.Seconds(), (1-q)*tau/2 + r},
					{"optimal overhead", s.Optimal.Overhead.Seconds(), overhead(mf, tau)},
					{"optimal share", s.Optimal.OverheadShare, overhead(mf, tau) / month},
					{"optimal cost", s.Optimal.OverheadCost, overhead(mf, tau) / 3600 * p.CostPrice},
					{"kept loss", s.AtRecommended.LossPerInterruption.Seconds(), (1-q)*tau0/2 + r},
					{"kept overhead", s.AtRecommended.Overhead.Seconds(), overhead(mf, tau0)},
					{"kept share", s.AtRecommended.OverheadShare, overhead(mf, tau0) / month},
					{"kept cost", s.AtRecommended.OverheadCost, overhead(mf, tau0) / 3600 * p.CostPrice},
				} {
					if math.Abs(c.got-c.want) > 1e-6*math.Max(1, math.Abs(c.want)) {
						t.Errorf("Got(%q M × %v %s) = %v; want %v", tt.name, s.Factor, c.what, c.got, c.want)
					}
				}
				// Re-optimising for the true M never costs more than keeping the interval.
				if s.Optimal.OverheadShare > s.AtRecommended.OverheadShare {
					t.Errorf("Got(%q M × %v) optimal %v > kept %v; want the optimum no worse", tt.name, s.Factor, s.Optimal.OverheadShare, s.AtRecommended.OverheadShare)
				}
			}
			// More interruptions: a shorter interval and more overhead; fewer: the other way.
			lo, hi := p.Sensitivity[0], p.Sensitivity[1]
			if lo.Interval >= p.Recommendation.Daly || p.Recommendation.Daly >= hi.Interval {
				t.Errorf("Got(%q intervals) = %v, %v, %v; want increasing with M", tt.name, lo.Interval, p.Recommendation.Daly, hi.Interval)
			}
			if lo.Optimal.OverheadShare <= p.Recommendation.OverheadShare || p.Recommendation.OverheadShare <= hi.Optimal.OverheadShare {
				t.Errorf("Got(%q overheads) = %v, %v, %v; want decreasing with M", tt.name, lo.Optimal.OverheadShare, p.Recommendation.OverheadShare, hi.Optimal.OverheadShare)
			}
		})
	}
}

func TestPlanHumanDuration(t *testing.T) {
	tests := []struct {
		in   time.Duration
		want string
	}{
		{0, "0s"},
		{1500 * time.Millisecond, "1.5s"},
		{59960 * time.Millisecond, "1m"},
		{5 * time.Minute, "5m"},
		{4*time.Minute + 30*time.Second, "4m 30s"},
		{59*time.Minute + 59700*time.Millisecond, "1h"},
		{6 * time.Hour, "6h"},
		{time.Duration(116.69 * float64(time.Minute)), "1h 57m"},
		{240 * time.Hour, "10d"},
		{9363*time.Hour + 30*time.Minute, "390d 4h"},
		{100 * 365 * 24 * time.Hour, "100 years"},
		{math.MaxInt64, "292 years"},
	}
	for _, tt := range tests {
		if got := PlanHumanDuration(tt.in); got != tt.want {
			t.Errorf("Got(%v) = %q; want %q", tt.in, got, tt.want)
		}
	}
}
