package checkpoint

// How often to checkpoint: the maths behind `spotguard plan`. Pure functions of the numbers
// given, no I/O.

import (
	"errors"
	"fmt"
	"math"
	"strconv"
	"strings"
	"time"
)

// PlanMonth is the month of AWS pricing and of the Spot Instance Advisor: 730 hours (8760 / 12).
const PlanMonth = 730 * time.Hour

// PlanSpotNotice is the warning EC2 gives before it reclaims a Spot instance.
const PlanSpotNotice = 2 * time.Minute

// planBuckets are the Spot Instance Advisor's "frequency of interruption" buckets (share of
// instances interrupted in a month) with the rate taken for each: the middle of the bucket, and
// 25 % for the open-ended ">20%".
func planBuckets() [5]planBucket {
	return [...]planBucket{{"<5%", 0.025}, {"5-10%", 0.075}, {"10-15%", 0.125}, {"15-20%", 0.175}, {">20%", 0.25}}
}

type planBucket struct {
	name string
	p    float64
}

// ParseInterruptionRate reads a monthly interruption probability p:
//
//   - a Spot Instance Advisor bucket: "<5%" → 0.025, "5-10%" → 0.075, "10-15%" → 0.125,
//     "15-20%" → 0.175, ">20%" → 0.25 (the middle of the bucket; 25 % for the open end);
//     an en dash ("5–10%") is read as a hyphen;
//   - a percentage such as "8.7%" → 0.087, which must be above 0 % and below 100 %.
//
// Anything else, including a bare number without "%", is an error naming the accepted forms.
func ParseInterruptionRate(s string) (float64, error) {
	s = strings.ReplaceAll(strings.TrimSpace(s), "–", "-")
	for _, b := range planBuckets() {
		if s == b.name {
			return b.p, nil
		}
	}
	num, ok := strings.CutSuffix(s, "%")
	if !ok || strings.ContainsAny(num, "<>") || strings.Contains(strings.TrimPrefix(num, "-"), "-") {
		return 0, fmt.Errorf("unknown interruption rate %q: want a bucket (<5%%, 5-10%%, 10-15%%, 15-20%%, >20%%) or a percentage such as 8.7%%", s)
	}
	v, err := strconv.ParseFloat(strings.TrimSpace(num), 64)
	if err != nil || math.IsNaN(v) || math.IsInf(v, 0) {
		return 0, fmt.Errorf("interruption rate %q is not a percentage (want e.g. 8.7%%)", s)
	}
	if v <= 0 || v >= 100 {
		return 0, fmt.Errorf("interruption rate %s must be above 0%% and below 100%%", s)
	}
	return v / 100, nil
}

// MTBIFromMonthlyRate is the mean time between interruptions M for a monthly interruption
// probability p, treating interruptions as a Poisson process: P(at least one in PlanMonth) =
// 1 − e^(−λ·730 h) = p, so λ = −ln(1 − p) / 730 h and M = 1/λ. It returns an error when p is not
// in (0, 1); an M beyond what a time.Duration holds (p below about 3e-5 %) is capped at the
// largest Duration (about 292 years).
func MTBIFromMonthlyRate(p float64) (time.Duration, error) {
	if math.IsNaN(p) || p <= 0 || p >= 1 {
		return 0, fmt.Errorf("monthly interruption probability %v must be above 0 and below 1", p)
	}
	return planDuration(PlanMonth.Seconds() / -math.Log1p(-p)), nil
}

// YoungInterval is Young's first-order optimum checkpoint interval sqrt(2·C·M) (Young 1974) for
// save cost c and mean time between interruptions m: the work between two saves that minimises
// C/τ + τ/(2M), the share of time spent saving plus the share lost to interruptions. It is 0
// when c or m is not positive.
func YoungInterval(c, m time.Duration) time.Duration {
	if c <= 0 || m <= 0 {
		return 0
	}
	return planDuration(planYoung(c.Seconds(), m.Seconds()))
}

// DalyInterval is Daly's higher-order optimum checkpoint interval (Daly 2006, "A higher order
// estimate of the optimum checkpoint interval for restart dumps") for save cost c and
// mean time between interruptions m:
//
//   - c < 2m: τ = sqrt(2CM)·[1 + (1/3)·sqrt(C/(2M)) + (1/9)·(C/(2M))] − C;
//   - c ≥ 2m: τ = M (saving costs so much that one save per expected lifetime is the best);
//   - c or m not positive: 0.
//
// For M = 24 h and C = 5 min it is 116.7 min; for M = 6 h and C = 5 min, 56.7 min.
func DalyInterval(c, m time.Duration) time.Duration {
	if c <= 0 || m <= 0 {
		return 0
	}
	return planDuration(planDaly(c.Seconds(), m.Seconds()))
}

// NoticeMTBI is the mean time between interruptions that cost half an interval when a
// notice-triggered save succeeds with probability q: only the failed fraction (1 − q) of
// interruptions lose work since the last periodic save, so for the interval it is as if M were
// M / (1 − q). It is m itself for q = 0, an error for q outside [0, 1), and capped at the largest
// Duration when the quotient does not fit.
func NoticeMTBI(m time.Duration, q float64) (time.Duration, error) {
	if math.IsNaN(q) || q < 0 || q >= 1 {
		return 0, fmt.Errorf("notice-save success probability %v must be at least 0 and below 1", q)
	}
	return planDuration(m.Seconds() / (1 - q)), nil
}

// PlanInput is what a plan is computed from.
type PlanInput struct {
	SaveCost      time.Duration // C: how long one periodic save stalls training; > 0
	Restart       time.Duration // R: from the interruption to training again on a new instance; > 0
	MTBI          time.Duration // M: mean time between interruptions; > 0
	NoticeSuccess float64       // q: probability that a notice-triggered save succeeds; in [0, 1)
	Price         float64       // on-demand instance price, USD per hour; 0 when not given
	SpotPrice     float64       // Spot instance price, USD per hour; 0 when not given
	GPUs          int           // GPUs in the instance; > 0
}

// Validate returns every problem with in, joined; nil when there is none.
func (in PlanInput) Validate() error {
	var errs []error
	if in.SaveCost <= 0 {
		errs = append(errs, fmt.Errorf("save cost %v must be positive", in.SaveCost))
	}
	if in.Restart <= 0 {
		errs = append(errs, fmt.Errorf("restart time %v must be positive", in.Restart))
	}
	if in.MTBI <= 0 {
		errs = append(errs, fmt.Errorf("mean time between interruptions %v must be positive", in.MTBI))
	}
	if math.IsNaN(in.NoticeSuccess) || in.NoticeSuccess < 0 || in.NoticeSuccess >= 1 {
		errs = append(errs, fmt.Errorf("notice-save success probability %v must be at least 0 and below 1", in.NoticeSuccess))
	}
	if math.IsNaN(in.Price) || math.IsInf(in.Price, 0) || in.Price < 0 {
		errs = append(errs, fmt.Errorf("on-demand price %v must not be negative", in.Price))
	}
	if math.IsNaN(in.SpotPrice) || math.IsInf(in.SpotPrice, 0) || in.SpotPrice < 0 {
		errs = append(errs, fmt.Errorf("spot price %v must not be negative", in.SpotPrice))
	}
	if in.GPUs <= 0 {
		errs = append(errs, fmt.Errorf("GPU count %d must be positive", in.GPUs))
	}
	return errors.Join(errs...)
}

// PlanPolicy is the outcome of one checkpoint policy over a PlanMonth, at the Daly interval.
type PlanPolicy struct {
	MTBI                time.Duration // the M the intervals use: M, or M/(1−q) with notice saves
	Young               time.Duration // sqrt(2·C·MTBI)
	Daly                time.Duration // Daly's interval for C and MTBI; the one used below
	LossPerInterruption time.Duration // τ/2 + R, or (1−q)·τ/2 + R with notice saves
	Saving              time.Duration // time spent saving per month: 730 h · C/τ
	Lost                time.Duration // work redone and restarts per month: interruptions · loss
	Overhead            time.Duration // Saving + Lost
	SavingShare         float64       // Saving / 730 h
	LostShare           float64       // Lost / 730 h
	OverheadShare       float64       // Overhead / 730 h; can exceed 1 when interruptions outpace progress
	SavingCost          float64       // USD per month at Plan.CostPrice; 0 without a price
	LostCost            float64       // USD per month at Plan.CostPrice; 0 without a price
	OverheadCost        float64       // USD per month at Plan.CostPrice; 0 without a price
}

// Plan is how often to checkpoint, and what it costs, for a PlanInput.
type Plan struct {
	Input                 PlanInput
	InterruptionsPerMonth float64    // 730 h / M
	Periodic              PlanPolicy // periodic saves only: every interruption loses τ/2 + R
	Notice                PlanPolicy // periodic saves plus notice-triggered saves that succeed with probability q

	// CostPrice is the hourly price the costs are computed at: the spot price when given, else the
	// on-demand price, else 0 (and every cost is 0).
	CostPrice float64
	// PerGPUHour is Price / GPUs, SpotPerGPUHour SpotPrice / GPUs; 0 when that price is not given.
	PerGPUHour, SpotPerGPUHour float64
	// SpotSaving is 1 − SpotPrice/Price when both are given, else 0; negative when spot costs more.
	SpotSaving float64
	// MonthCost is 730 h at CostPrice.
	MonthCost float64
	// Warnings are things that make the plan dubious but not impossible, one sentence each.
	Warnings []string
}

// NewPlan computes the plan for in. It returns in.Validate()'s error when in is invalid. Every
// interval is Daly's; Young's is given for comparison.
func NewPlan(in PlanInput) (Plan, error) {
	if err := in.Validate(); err != nil {
		return Plan{}, err
	}
	c, r, m := in.SaveCost.Seconds(), in.Restart.Seconds(), in.MTBI.Seconds()
	month := PlanMonth.Seconds()
	p := Plan{
		Input:                 in,
		InterruptionsPerMonth: month / m,
		CostPrice:             in.Price,
	}
	if in.SpotPrice > 0 {
		p.CostPrice = in.SpotPrice
	}
	p.Periodic = planPolicy(c, r, m, 0, p.InterruptionsPerMonth, p.CostPrice)
	p.Notice = planPolicy(c, r, m, in.NoticeSuccess, p.InterruptionsPerMonth, p.CostPrice)
	g := float64(in.GPUs)
	p.PerGPUHour, p.SpotPerGPUHour = in.Price/g, in.SpotPrice/g
	if in.Price > 0 && in.SpotPrice > 0 {
		p.SpotSaving = 1 - in.SpotPrice/in.Price
	}
	p.MonthCost = month / 3600 * p.CostPrice

	if c >= 2*m {
		p.Warnings = append(p.Warnings, fmt.Sprintf("a save (%v) takes at least twice the mean time between interruptions (%v): Daly's interval is M itself, and the job will rarely get ahead", planRound(in.SaveCost), planRound(in.MTBI)))
	}
	if p.Periodic.OverheadShare >= 1 {
		p.Warnings = append(p.Warnings, fmt.Sprintf("with periodic saves alone the expected overhead is %.0f%% of the time: the job makes no progress", 100*p.Periodic.OverheadShare))
	}
	if in.NoticeSuccess > 0 && in.SaveCost > PlanSpotNotice {
		p.Warnings = append(p.Warnings, fmt.Sprintf("a save (%v) takes longer than the %v Spot notice: a notice-triggered save succeeds only if it is quicker than a periodic one; check the notice-save success probability %.2f", planRound(in.SaveCost), PlanSpotNotice, in.NoticeSuccess))
	}
	if in.Price > 0 && in.SpotPrice > in.Price {
		p.Warnings = append(p.Warnings, fmt.Sprintf("the spot price $%.4g/h is above the on-demand price $%.4g/h: on-demand is cheaper and is never interrupted", in.SpotPrice, in.Price))
	}
	return p, nil
}

// planPolicy is one policy at Daly's interval for save cost c, restart r, mean time between
// interruptions m (seconds), notice-save success q, n interruptions a month and price USD/h.
func planPolicy(c, r, m, q, n, price float64) PlanPolicy {
	me := m / (1 - q)
	tau := planDaly(c, me)
	loss := (1-q)*tau/2 + r
	month := PlanMonth.Seconds()
	saving, lost := month*c/tau, n*loss
	return PlanPolicy{
		MTBI:                planDuration(me),
		Young:               planDuration(planYoung(c, me)),
		Daly:                planDuration(tau),
		LossPerInterruption: planDuration(loss),
		Saving:              planDuration(saving),
		Lost:                planDuration(lost),
		Overhead:            planDuration(saving + lost),
		SavingShare:         saving / month,
		LostShare:           lost / month,
		OverheadShare:       (saving + lost) / month,
		SavingCost:          saving / 3600 * price,
		LostCost:            lost / 3600 * price,
		OverheadCost:        (saving + lost) / 3600 * price,
	}
}

// planYoung is sqrt(2·c·m), in seconds.
func planYoung(c, m float64) float64 { return math.Sqrt(2 * c * m) }

// planDaly is Daly's interval for c and m in seconds (see DalyInterval).
func planDaly(c, m float64) float64 {
	if c >= 2*m {
		return m
	}
	x := c / (2 * m)
	return math.Sqrt(2*c*m)*(1+math.Sqrt(x)/3+x/9) - c
}

// planRound rounds d for a message: to the second from a minute up, else to the millisecond.
func planRound(d time.Duration) time.Duration {
	if d >= time.Minute {
		return d.Round(time.Second)
	}
	return d.Round(time.Millisecond)
}

// planDuration converts seconds to a Duration, rounded to the nanosecond and capped at the
// largest Duration.
func planDuration(s float64) time.Duration {
	if ns := s * 1e9; ns < math.MaxInt64 {
		return time.Duration(math.Round(ns))
	}
	return math.MaxInt64
}

// ParseBytes reads a positive byte count ("40GiB", "512MiB", "2.5GB", "1048576"; units are
// case-insensitive and decimal KB/MB/GB/TB or binary KiB/MiB/GiB/TiB) or, when rate, a throughput
// with an optional "/s" that may also be in bits ("10Gbit/s", "10Gbps").
func ParseBytes(v string, rate bool) (float64, error) {
	want := "a size (want e.g. 40GiB, 512MiB or 2.5GB)"
	s := strings.ToLower(strings.TrimSpace(v))
	if rate {
		want = "a throughput (want e.g. 250MB/s, 1GiB/s or 10Gbit/s)"
		s = strings.TrimSuffix(s, "/s")
		if n, ok := strings.CutSuffix(s, "bps"); ok {
			s = n + "bit"
		}
	}
	// Units, matched case-insensitively, longest first; "bit" units are for throughputs only.
	units := [...]struct {
		suffix string
		mult   float64
		bits   bool
	}{
		{"kbit", 1e3 / 8, true}, {"mbit", 1e6 / 8, true}, {"gbit", 1e9 / 8, true}, {"tbit", 1e12 / 8, true},
		{"kib", 1 << 10, false}, {"mib", 1 << 20, false}, {"gib", 1 << 30, false}, {"tib", 1 << 40, false},
		{"kb", 1e3, false}, {"mb", 1e6, false}, {"gb", 1e9, false}, {"tb", 1e12, false},
		{"b", 1, false},
	}
	num, mult := s, 1.0
	for _, u := range units {
		if n, ok := strings.CutSuffix(s, u.suffix); ok {
			if u.bits && !rate {
				return 0, fmt.Errorf("not %s", want)
			}
			num, mult = n, u.mult
			break
		}
	}
	n, err := strconv.ParseFloat(strings.TrimSpace(num), 64)
	if err != nil || math.IsNaN(n) || math.IsInf(n, 0) {
		return 0, fmt.Errorf("not %s", want)
	}
	if n <= 0 {
		return 0, errors.New("must be positive")
	}
	return n * mult, nil
}
