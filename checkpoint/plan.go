package checkpoint

// How often to checkpoint: the maths behind `spotguard plan`. Pure functions of the numbers
// given, no I/O. docs/plan.md explains the model; in short, with
//
//	C  the stall of one save (the local write; the upload runs in the background)
//	U  the upload of one checkpoint, K the commit after its last byte
//	M  the mean time between interruptions (Poisson), R the restart
//	q  the probability that a notice-triggered save is committed
//	τ  the training time between two periodic saves
//
// a save is in the store D = max(C, U) + K after it starts; a notice can save only when
// D ≤ 2 min, and otherwise q counts as 0. Only (1 − q) of interruptions lose work since the last
// periodic save, so the interval is Daly's for C and M/(1 − q):
//
//	τ = sqrt(2·C·M')·[1 + ⅓·sqrt(C/(2M')) + ⅑·C/(2M')] − C,  M' = M/(1 − q)   (τ = M' when C ≥ 2M')
//
// and a 730-hour month costs 730 h·C/τ saving plus (730 h/M)·((1 − q)·τ/2 + R) lost.

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

// planBucketOf returns the Advisor bucket s names, with an en dash read as a hyphen.
func planBucketOf(s string) (planBucket, bool) {
	s = strings.ReplaceAll(strings.TrimSpace(s), "–", "-")
	for _, b := range planBuckets() {
		if s == b.name {
			return b, true
		}
	}
	return planBucket{}, false
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
	s = strings.TrimSpace(s)
	if b, ok := planBucketOf(s); ok {
		return b.p, nil
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

// PlanMaxNoticeSuccess is the largest notice-save success probability a plan takes.
const PlanMaxNoticeSuccess = 0.999

// PlanQ formats a notice-save success probability: two decimals, three above 0.99 (0.999 is
// not 1.00).
func PlanQ(q float64) string {
	if q > 0.99 {
		return strconv.FormatFloat(q, 'f', 3, 64)
	}
	return strconv.FormatFloat(q, 'f', 2, 64)
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
	// SaveCost is C: how long one save stalls training, which is the time to write the checkpoint
	// locally (the upload runs in the background, while training goes on); > 0.
	SaveCost time.Duration
	// Upload is U: how long one checkpoint takes to upload; ≥ 0, and 0 when not known (a save is
	// then taken to be in the store when its stall ends).
	Upload time.Duration
	// Commit is K: from the last byte uploaded to the commit (the manifest, then LATEST); ≥ 0.
	Commit time.Duration
	// Restart is R: from the interruption to training again on a new instance; > 0.
	Restart time.Duration
	// MTBI is M, the mean time between interruptions: > 0, or 0 when InterruptionRate gives it.
	MTBI time.Duration
	// InterruptionRate is a monthly interruption rate in a form ParseInterruptionRate reads (a Spot
	// Instance Advisor bucket such as "<5%", or a percentage such as "8.7%"); M is then
	// MTBIFromMonthlyRate of it, and MTBI must be 0. "" when MTBI is given.
	InterruptionRate string
	NoticeSuccess    float64 // q: probability that a notice-triggered save succeeds; in [0, 1)
	Price            float64 // on-demand instance price, USD per hour; 0 when not given
	SpotPrice        float64 // Spot instance price, USD per hour; 0 when not given
	GPUs             int     // GPUs in the instance; > 0
}

// Validate returns every problem with in, joined; nil when there is none.
func (in PlanInput) Validate() error {
	var errs []error
	if in.SaveCost <= 0 {
		errs = append(errs, fmt.Errorf("save cost %v must be positive", in.SaveCost))
	}
	if in.Upload < 0 {
		errs = append(errs, fmt.Errorf("upload time %v must not be negative", in.Upload))
	}
	if in.Commit < 0 {
		errs = append(errs, fmt.Errorf("commit time %v must not be negative", in.Commit))
	}
	if in.Restart <= 0 {
		errs = append(errs, fmt.Errorf("restart time %v must be positive", in.Restart))
	}
	switch {
	case in.InterruptionRate != "" && in.MTBI != 0:
		errs = append(errs, errors.New("give the mean time between interruptions or an interruption rate, not both"))
	case in.InterruptionRate != "":
		if _, err := ParseInterruptionRate(in.InterruptionRate); err != nil {
			errs = append(errs, err)
		}
	case in.MTBI <= 0:
		errs = append(errs, fmt.Errorf("mean time between interruptions %v must be positive", in.MTBI))
	}
	switch q := in.NoticeSuccess; {
	case math.IsNaN(q) || q < 0 || q >= 1:
		errs = append(errs, fmt.Errorf("notice-save success probability %v must be at least 0 and below 1", q))
	case q > PlanMaxNoticeSuccess:
		// Found from outside: 0.999999 made M/(1−q) 2739 years, shown as 292 (the largest
		// Duration), and a q of 1.00 and 0% lost.
		errs = append(errs, fmt.Errorf("notice-save success probability %v must be at most %v: closer to 1, M/(1−q) is beyond any run (and no notice path is that sure)", q, PlanMaxNoticeSuccess))
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

// PlanSave is how one save behaves, from PlanInput.
type PlanSave struct {
	Stall   time.Duration // C: training stalls while the checkpoint is written locally
	Upload  time.Duration // U: the upload, in the background; 0 when not known
	Commit  time.Duration // K: the manifest and LATEST after the last byte
	Durable time.Duration // from the start of a save to its commit: max(C, U) + K
	// FitsNotice is Durable ≤ PlanSpotNotice: a save started when a notice comes is committed
	// before the instance is reclaimed. When false a notice cannot save the work since the last
	// periodic save, whatever --notice-success says.
	FitsNotice bool
}

// PlanCost is what one checkpoint interval τ costs over a PlanMonth, for n = 730 h / M
// interruptions a month (first order, as in Young):
//
//	loss per interruption L = (1 − q)·τ/2 + R
//	saving S = 730 h · C/τ    lost = n · L    overhead = S + lost
//
// with each share the time over 730 h and each cost the time in hours times the price.
type PlanCost struct {
	LossPerInterruption time.Duration // (1 − q)·τ/2 + R
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

// PlanPolicy is the outcome of one checkpoint policy over a PlanMonth, at the Daly interval.
type PlanPolicy struct {
	MTBI     time.Duration // the M the intervals use: M, or M/(1−q) with notice saves
	Young    time.Duration // sqrt(2·C·MTBI)
	Daly     time.Duration // Daly's interval for C and MTBI; the one PlanCost is for
	PlanCost               // at the Daly interval
}

// PlanRecommendation is the interval to use and why: the headline of a plan.
type PlanRecommendation struct {
	// PlanPolicy is the recommended policy: Plan.Notice when WithNotice, else Plan.Periodic. Its
	// Daly is the interval to checkpoint at.
	PlanPolicy
	// WithNotice is true when notice-triggered saves are counted: q > 0 and a save fits in the
	// notice (PlanSave.FitsNotice). False means periodic saves only.
	WithNotice bool
	// NoticeSuccess is the q the interval is for: PlanInput.NoticeSuccess when WithNotice, else 0.
	NoticeSuccess float64
	// Reason says why this policy, in a sentence or two; when a save does not fit in the notice it
	// also says what a save that fitted would allow.
	Reason string
	// UpperBound is true when M comes from a monthly interruption rate (PlanInput.InterruptionRate):
	// that rate is a lower bound on the rate a job sees, so M and the interval are upper bounds.
	UpperBound bool
	// Caveat says what UpperBound means and what to do about it; "" when UpperBound is false.
	Caveat string
}

// PlanSensitivity is the recommendation's policy (its q) when M is off by Factor.
type PlanSensitivity struct {
	Factor                float64       // M' = Factor · M
	MTBI                  time.Duration // M'
	InterruptionsPerMonth float64       // 730 h / M'
	// Interval is Daly's interval re-optimised for M', with the recommendation's q:
	// DalyInterval(C, M'/(1 − q)).
	Interval time.Duration
	// Optimal is the cost at Interval for M'.
	Optimal PlanCost
	// AtRecommended is the cost at the recommended interval (Plan.Recommendation.Daly) kept as it
	// is, when M is M': what a wrong M costs.
	AtRecommended PlanCost
}

// Plan is how often to checkpoint, and what it costs, for a PlanInput.
type Plan struct {
	// Input is the input, with MTBI set to the M used (computed from InterruptionRate when given).
	Input PlanInput
	// MonthlyRate is the monthly interruption probability p that M was computed from; 0 when M
	// was given.
	MonthlyRate           float64
	Save                  PlanSave
	InterruptionsPerMonth float64    // 730 h / M
	Periodic              PlanPolicy // periodic saves only: every interruption loses τ/2 + R
	// Notice is periodic saves plus notice-triggered saves that succeed with probability q. When a
	// save does not fit in the notice this is what a save that did fit would give, not a plan.
	Notice PlanPolicy
	// Recommendation is the policy to use: Notice when q > 0 and a save fits in the notice, else
	// Periodic.
	Recommendation PlanRecommendation
	// Sensitivity is the recommendation for M × ½ and M × 2, in that order.
	Sensitivity []PlanSensitivity

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
//
// The recommendation is Notice when q > 0 and a save is durable within the notice
// (max(C, U) + K ≤ 2 min), else Periodic: a save that cannot be committed before the instance
// is reclaimed saves nothing, so q counts as 0.
func NewPlan(in PlanInput) (Plan, error) {
	if err := in.Validate(); err != nil {
		return Plan{}, err
	}
	p := Plan{Input: in}
	if in.InterruptionRate != "" {
		p.MonthlyRate, _ = ParseInterruptionRate(in.InterruptionRate) // checked by Validate
		m, err := MTBIFromMonthlyRate(p.MonthlyRate)
		if err != nil { // ParseInterruptionRate returns rates in (0, 1) only
			return Plan{}, err
		}
		p.Input.MTBI = m
	}
	c, r, m := in.SaveCost.Seconds(), in.Restart.Seconds(), p.Input.MTBI.Seconds()
	month := PlanMonth.Seconds()
	p.InterruptionsPerMonth = month / m
	p.CostPrice = in.Price
	if in.SpotPrice > 0 {
		p.CostPrice = in.SpotPrice
	}
	p.Save = PlanSave{Stall: in.SaveCost, Upload: in.Upload, Commit: in.Commit}
	p.Save.Durable = max(in.SaveCost, in.Upload) + in.Commit
	p.Save.FitsNotice = p.Save.Durable <= PlanSpotNotice

	p.Periodic = planPolicy(c, r, m, 0, p.CostPrice)
	p.Notice = planPolicy(c, r, m, in.NoticeSuccess, p.CostPrice)
	p.Recommendation = p.recommend()
	q := p.Recommendation.NoticeSuccess
	for _, f := range [...]float64{0.5, 2} {
		mf := f * m
		tau := planDaly(c, mf/(1-q))
		p.Sensitivity = append(p.Sensitivity, PlanSensitivity{
			Factor:                f,
			MTBI:                  planDuration(mf),
			InterruptionsPerMonth: month / mf,
			Interval:              planDuration(tau),
			Optimal:               planCost(c, r, mf, q, tau, p.CostPrice),
			AtRecommended:         planCost(c, r, mf, q, p.Recommendation.Daly.Seconds(), p.CostPrice),
		})
	}

	g := float64(in.GPUs)
	p.PerGPUHour, p.SpotPerGPUHour = in.Price/g, in.SpotPrice/g
	if in.Price > 0 && in.SpotPrice > 0 {
		p.SpotSaving = 1 - in.SpotPrice/in.Price
	}
	p.MonthCost = month / 3600 * p.CostPrice

	if c >= 2*m {
		p.Warnings = append(p.Warnings, fmt.Sprintf("a save (%s) takes at least twice the mean time between interruptions (%s): Daly's interval is M itself, and the job will rarely get ahead", PlanHumanDuration(in.SaveCost), PlanHumanDuration(p.Input.MTBI)))
	}
	if p.Periodic.OverheadShare >= 1 {
		p.Warnings = append(p.Warnings, fmt.Sprintf("with periodic saves alone the expected overhead is %.0f%% of the time: the job makes no progress", 100*p.Periodic.OverheadShare))
	}
	if in.NoticeSuccess > 0 && !p.Save.FitsNotice {
		p.Warnings = append(p.Warnings, fmt.Sprintf("a save is in the store only %s after it starts, later than the %s Spot notice: a notice cannot save it, so the notice-save success probability %s is not used and the plan is for periodic saves only", PlanHumanDuration(p.Save.Durable), PlanHumanDuration(PlanSpotNotice), PlanQ(in.NoticeSuccess)))
	}
	if in.Upload > p.Recommendation.Daly {
		p.Warnings = append(p.Warnings, fmt.Sprintf("an upload (%s) takes longer than the interval (%s): the next save starts before the last one is in the store, so the store falls behind; upload faster or save less often", PlanHumanDuration(in.Upload), PlanHumanDuration(p.Recommendation.Daly)))
	} else if p.Save.Durable > p.Recommendation.Daly && in.SaveCost < p.Recommendation.Daly { // a longer save is said above
		p.Warnings = append(p.Warnings, fmt.Sprintf("a save is in the store only %s after it starts, longer than the interval (%s): the next save starts before the last one is in the store; save no more often than every %s", PlanHumanDuration(p.Save.Durable), PlanHumanDuration(p.Recommendation.Daly), PlanHumanDuration(p.Save.Durable)))
	}
	if in.Price > 0 && in.SpotPrice > in.Price {
		p.Warnings = append(p.Warnings, fmt.Sprintf("the spot price $%.4g/h is above the on-demand price $%.4g/h: on-demand is cheaper and is never interrupted", in.SpotPrice, in.Price))
	}
	return p, nil
}

// recommend picks the policy to use, with the reason and, for an M from a monthly rate, the
// caveat.
func (p Plan) recommend() PlanRecommendation {
	q := p.Input.NoticeSuccess
	s := p.Save
	durable := fmt.Sprintf("%s (stall %s", PlanHumanDuration(s.Durable), PlanHumanDuration(s.Stall))
	if s.Upload > 0 {
		durable = fmt.Sprintf("%s (max(write %s, upload %s)", PlanHumanDuration(s.Durable), PlanHumanDuration(s.Stall), PlanHumanDuration(s.Upload))
	}
	durable += fmt.Sprintf(" + commit %s)", PlanHumanDuration(s.Commit))
	notice := PlanHumanDuration(PlanSpotNotice)
	var rec PlanRecommendation
	switch {
	case q == 0:
		rec = PlanRecommendation{PlanPolicy: p.Periodic,
			Reason: "periodic saves only: the notice-save success probability q is 0, so every interruption loses half an interval."}
	case !s.FitsNotice:
		rec = PlanRecommendation{PlanPolicy: p.Periodic,
			Reason: fmt.Sprintf("periodic saves only: a save is in the store %s after it starts, later than the %s Spot notice, so a notice cannot save it and q = %s does not apply (q = 0). "+
				"A save in the store within the notice would allow every %s at q = %s (overhead %s instead of %s).",
				durable, notice, PlanQ(q), PlanHumanDuration(p.Notice.Daly), PlanQ(q), planPercent(p.Notice.OverheadShare), planPercent(p.Periodic.OverheadShare))}
	default:
		rec = PlanRecommendation{PlanPolicy: p.Notice, WithNotice: true, NoticeSuccess: q,
			Reason: fmt.Sprintf("with notice-triggered saves: a save is in the store %s after it starts, within the %s Spot notice, so with success probability q = %s only %s of interruptions lose half an interval, as if M were M/(1−q) = %s.",
				durable, notice, PlanQ(q), planLostPercent(1-q), PlanHumanDuration(p.Notice.MTBI))}
	}
	if p.Input.InterruptionRate != "" {
		rec.UpperBound = true
		rate := strings.TrimSpace(p.Input.InterruptionRate)
		what := fmt.Sprintf("the monthly interruption rate %s", rate)
		if b, ok := planBucketOf(rate); ok {
			what = fmt.Sprintf("the Spot Instance Advisor's bucket %s (taken at %.3g%%)", b.name, 100*b.p)
		}
		rec.Caveat = fmt.Sprintf("M = %s comes from %s: a monthly frequency of interruption for one instance type in one region, "+
			"a bound over everyone's instances and not an estimate of how often your job is interrupted, which can be far more often. "+
			"Take it as a lower bound on your rate, so M and the interval are upper bounds: checkpoint at least this often, "+
			"and measure M from your own interruption history (--mtbi).", PlanHumanDuration(p.Input.MTBI), what)
	}
	return rec
}

// planPolicy is one policy at Daly's interval for save cost c, restart r, mean time between
// interruptions m (seconds), notice-save success q and price USD/h.
func planPolicy(c, r, m, q, price float64) PlanPolicy {
	me := m / (1 - q)
	tau := planDaly(c, me)
	return PlanPolicy{
		MTBI:     planDuration(me),
		Young:    planDuration(planYoung(c, me)),
		Daly:     planDuration(tau),
		PlanCost: planCost(c, r, m, q, tau, price),
	}
}

// planCost is the cost of checkpointing every tau seconds (see PlanCost) for save cost c,
// restart r, mean time between interruptions m (seconds), notice-save success q and price USD/h.
func planCost(c, r, m, q, tau, price float64) PlanCost {
	month := PlanMonth.Seconds()
	loss := (1-q)*tau/2 + r
	saving, lost := month*c/tau, month/m*loss
	return PlanCost{
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

// planPercent formats a share as a percentage: one decimal, or two significant digits below 1 %.
func planPercent(share float64) string {
	if v := 100 * share; v != 0 && v < 1 {
		return fmt.Sprintf("%.2g%%", v)
	}
	return fmt.Sprintf("%.1f%%", 100*share)
}

// planLostPercent formats the share of interruptions that lose half an interval: whole percent,
// but under 1 % as planPercent does (0.1 %, not 0 %).
func planLostPercent(share float64) string {
	if v := 100 * share; v < 1 {
		return planPercent(share)
	}
	return fmt.Sprintf("%.0f%%", 100*share)
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

// PlanHumanDuration formats d for people, to about three digits: "45s", "4m 30s", "5m", "1h 57m",
// "6h", "390d 4h", "10d", "79 years".
func PlanHumanDuration(d time.Duration) string {
	two := func(a, b time.Duration, ua, ub string) string {
		if b == 0 {
			return fmt.Sprintf("%d%s", a, ua)
		}
		return fmt.Sprintf("%d%s %d%s", a, ua, b, ub)
	}
	const day = 24 * time.Hour
	switch {
	case d.Round(100*time.Millisecond) < time.Minute:
		return d.Round(100 * time.Millisecond).String()
	case d.Round(time.Second) < time.Hour:
		d = d.Round(time.Second)
		return two(d/time.Minute, d%time.Minute/time.Second, "m", "s")
	case d.Round(time.Minute) < 48*time.Hour:
		d = d.Round(time.Minute)
		return two(d/time.Hour, d%time.Hour/time.Minute, "h", "m")
	case d.Round(time.Hour) < 10*365*day:
		d = d.Round(time.Hour)
		return two(d/day, d%day/time.Hour, "d", "h")
	default:
		return fmt.Sprintf("%.0f years", d.Hours()/(365*24))
	}
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
		want = "a throughput (want e.g. 250MB/s, 1GiB/s, 10Gbit/s or 10Gb/s)"
		s = strings.TrimSuffix(s, "/s")
		if n, ok := strings.CutSuffix(s, "bps"); ok {
			s = n + "bit"
		}
		// A lowercase b after a prefix is bits, as links are written ("100 Gb/s"): read as
		// bytes, a link was 8 times faster than it is (found from outside).
		raw := strings.TrimSuffix(strings.TrimSpace(v), "/s")
		if len(raw) >= 2 && raw[len(raw)-1] == 'b' && strings.ContainsRune("kKmMgGtT", rune(raw[len(raw)-2])) {
			s = s + "it"
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
