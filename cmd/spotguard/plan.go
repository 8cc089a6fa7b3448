package main

import (
	"bytes"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"io"
	"math"
	"strconv"
	"strings"
	"text/tabwriter"
	"time"

	"github.com/spotguard/spotguard/checkpoint"
)

// Defaults of `spotguard plan`.
const (
	// planDefaultRestart is from the interruption to training again: launching a replacement GPU
	// instance (a few minutes), restoring the checkpoint from S3 and warming up. Measure yours.
	planDefaultRestart = 10 * time.Minute
	planDefaultGPUs    = 8
	// planDefaultNoticeSuccess is the share of interruptions whose 2-minute notice spotguard turns
	// into a committed checkpoint.
	planDefaultNoticeSuccess = 0.9
)

const planSummary = `How often to checkpoint: Young's and Daly's optimum intervals, with and without
notice-triggered saves, the expected work lost per interruption, and what saving and losing
cost a month.

Give how often the instance is interrupted (--mtbi or --interruption-rate), what a save costs
(--save-cost, or --size with --throughput) and, for costs, --price and/or --spot-price.
Durations are Go durations (90s, 5m, 1h30m) or days (1d, 1.5d, 2d12h).`

// planFlags are the parsed flags of `spotguard plan`.
type planFlags struct {
	mtbi       time.Duration
	rate       string  // --interruption-rate as given
	p          float64 // the monthly interruption probability it stands for
	saveCost   time.Duration
	size       float64 // bytes
	throughput float64 // bytes per second
	sizeArg    string  // --size as given
	rateArg    string  // --throughput as given
	restart    time.Duration
	price      float64
	spotPrice  float64
	gpus       int
	q          float64
	json       bool
	set        map[string]bool // flags given on the command line
}

func runPlan(args []string, stdout, stderr io.Writer) int {
	f := planFlags{restart: planDefaultRestart, gpus: planDefaultGPUs, q: planDefaultNoticeSuccess, set: map[string]bool{}}
	fs := newPlainFlagSet("plan", planSummary, stdout, stderr)
	fs.Func("mtbi", "mean time between interruptions, a `duration` such as 24h or 3d", func(v string) (err error) {
		f.mtbi, err = planParsePositiveDuration(v)
		return err
	})
	fs.Func("interruption-rate", "share of instances interrupted in a month: a Spot Instance Advisor `bucket` (<5%, 5-10%, 10-15%,\n15-20%, >20%) or a percentage such as 8.7%", func(v string) (err error) {
		f.rate = v
		f.p, err = checkpoint.ParseInterruptionRate(v)
		return err
	})
	fs.Func("save-cost", "save cost: how long one checkpoint save stalls training, a `duration`", func(v string) (err error) {
		f.saveCost, err = planParsePositiveDuration(v)
		return err
	})
	fs.Func("size", "checkpoint size in `bytes` (e.g. 40GiB, 512MiB, 2.5GB); the save cost is size / throughput", func(v string) (err error) {
		f.sizeArg = strings.TrimSpace(v)
		f.size, err = checkpoint.ParseBytes(v, false)
		return err
	})
	fs.Func("throughput", "upload throughput in `bytes/s` (e.g. 250MB/s, 1GiB/s, 10Gbit/s)", func(v string) (err error) {
		f.rateArg = strings.TrimSpace(v)
		f.throughput, err = checkpoint.ParseBytes(v, true)
		return err
	})
	fs.Func("restart", fmt.Sprintf("restart time: from the interruption to training again on a new instance, a `duration` (default %s)", planHuman(planDefaultRestart)), func(v string) (err error) {
		f.restart, err = planParsePositiveDuration(v)
		return err
	})
	fs.Func("price", "on-demand instance price in `USD/hour`", func(v string) (err error) {
		f.price, err = planParsePrice(v)
		return err
	})
	fs.Func("spot-price", "Spot instance price in `USD/hour`; costs are computed at it when given", func(v string) (err error) {
		f.spotPrice, err = planParsePrice(v)
		return err
	})
	fs.Func("gpus", fmt.Sprintf("`N` GPUs in the instance, for the per-GPU price (default %d)", planDefaultGPUs), func(v string) error {
		n, err := strconv.Atoi(strings.TrimSpace(v))
		if err != nil {
			return errors.New("not a whole number")
		}
		if n <= 0 {
			return errors.New("must be at least 1")
		}
		f.gpus = n
		return nil
	})
	fs.Func("notice-success", fmt.Sprintf("probability `q` that a notice-triggered save succeeds, in [0, 1) or a percentage (default %v)", planDefaultNoticeSuccess), func(v string) (err error) {
		f.q, err = planParseProbability(v)
		return err
	})
	fs.BoolVar(&f.json, "json", false, "print every number as JSON (durations in seconds), with the inputs")
	if code, ok := fs.parse(args); !ok {
		return code
	}
	fs.Visit(func(fl *flag.Flag) { f.set[fl.Name] = true })
	if err := f.check(); err != nil {
		return fs.usageError("%v", err)
	}
	if f.set["interruption-rate"] {
		m, err := checkpoint.MTBIFromMonthlyRate(f.p)
		if err != nil { // ParseInterruptionRate only returns rates in (0, 1)
			fmt.Fprintf(stderr, "spotguard plan: --interruption-rate: %v\n", err)
			return exitUsage
		}
		f.mtbi = m
	}
	if f.set["size"] {
		ns := math.Round(f.size / f.throughput * 1e9)
		if ns < 1 || ns >= math.MaxInt64 {
			fmt.Fprintf(stderr, "spotguard plan: --size %s at --throughput %s is a save cost of %gs: out of range\n", f.sizeArg, f.rateArg, ns/1e9)
			return exitUsage
		}
		f.saveCost = time.Duration(ns)
	}
	plan, err := checkpoint.NewPlan(checkpoint.PlanInput{
		SaveCost:      f.saveCost,
		Restart:       f.restart,
		MTBI:          f.mtbi,
		NoticeSuccess: f.q,
		Price:         f.price,
		SpotPrice:     f.spotPrice,
		GPUs:          f.gpus,
	})
	if err != nil { // every flag is checked above; this is a backstop
		fmt.Fprintf(stderr, "spotguard plan: %v\n", err)
		return exitUsage
	}
	for _, w := range plan.Warnings {
		fmt.Fprintf(stderr, "spotguard plan: warning: %s\n", w)
	}
	if f.json {
		enc := json.NewEncoder(stdout)
		enc.SetIndent("", "  ")
		if err := enc.Encode(planReport(f, plan)); err != nil {
			fmt.Fprintf(stderr, "spotguard plan: %v\n", err)
			return exitFail
		}
		return exitOK
	}
	printPlan(stdout, f, plan)
	return exitOK
}

// check returns the first problem with how the flags combine, naming the flags.
func (f *planFlags) check() error {
	switch {
	case f.set["mtbi"] && f.set["interruption-rate"]:
		return errors.New("--mtbi and --interruption-rate both say how often the instance is interrupted: give one")
	case !f.set["mtbi"] && !f.set["interruption-rate"]:
		return errors.New("need --mtbi or --interruption-rate: how often the instance is interrupted")
	case f.set["save-cost"] && (f.set["size"] || f.set["throughput"]):
		return errors.New("--save-cost and --size/--throughput both give the save cost: give --save-cost, or --size with --throughput")
	case f.set["size"] && !f.set["throughput"]:
		return errors.New("--size needs --throughput to give the save cost")
	case f.set["throughput"] && !f.set["size"]:
		return errors.New("--throughput needs --size to give the save cost")
	case !f.set["save-cost"] && !f.set["size"]:
		return errors.New("need --save-cost, or --size with --throughput: what one checkpoint save costs")
	}
	return nil
}

// planParsePositiveDuration reads a Go duration ("90s", "1h30m") or one that starts with a number
// of days ("1d", "1.5d", "2d12h"); it must be positive.
func planParsePositiveDuration(v string) (time.Duration, error) {
	s := strings.TrimSpace(v)
	var d time.Duration
	if days, rest, ok := strings.Cut(s, "d"); ok {
		n, err := strconv.ParseFloat(days, 64)
		if err != nil || math.IsNaN(n) || math.IsInf(n, 0) || math.Abs(n) > 100*365 {
			return 0, errors.New("not a duration (want e.g. 90s, 5m, 1h30m or 2d)")
		}
		d = time.Duration(math.Round(n * 24 * float64(time.Hour)))
		if rest != "" {
			r, err := time.ParseDuration(rest)
			if err != nil || strings.HasPrefix(rest, "-") || strings.HasPrefix(rest, "+") {
				return 0, errors.New("not a duration (want e.g. 90s, 5m, 1h30m or 2d)")
			}
			if n < 0 {
				r = -r
			}
			d += r
		}
	} else {
		var err error
		if d, err = time.ParseDuration(s); err != nil {
			return 0, errors.New("not a duration (want e.g. 90s, 5m, 1h30m or 2d)")
		}
	}
	if d <= 0 {
		return 0, errors.New("must be positive")
	}
	return d, nil
}

// planParsePrice reads a price in USD per hour, with an optional "$" and "/h"; it must be positive.
func planParsePrice(v string) (float64, error) {
	s := strings.TrimSuffix(strings.TrimPrefix(strings.TrimSpace(v), "$"), "/h")
	n, err := strconv.ParseFloat(s, 64)
	if err != nil || math.IsNaN(n) || math.IsInf(n, 0) {
		return 0, errors.New("not a price in USD per hour (want e.g. 32.77)")
	}
	if n < 0 {
		return 0, errors.New("a price cannot be negative")
	}
	if n == 0 {
		return 0, errors.New("a price of 0 leaves nothing to plan: leave the flag out")
	}
	return n, nil
}

// planParseProbability reads a probability in [0, 1), as a fraction (0.9) or a percentage (90%).
func planParseProbability(v string) (float64, error) {
	s, pct := strings.CutSuffix(strings.TrimSpace(v), "%")
	n, err := strconv.ParseFloat(strings.TrimSpace(s), 64)
	if err != nil || math.IsNaN(n) {
		return 0, errors.New("not a probability (want e.g. 0.9 or 90%)")
	}
	if pct {
		n /= 100
	}
	if n < 0 || n >= 1 {
		return 0, errors.New("must be at least 0 and below 1 (a save that always succeeds would make periodic saves pointless)")
	}
	return n, nil
}

// planAssumptions explains each assumption behind the numbers in one line.
func planAssumptions(f planFlags) []string {
	a := []string{
		"Interruptions are a Poisson process: they come independently, at a constant rate 1/M.",
	}
	if f.set["interruption-rate"] {
		a = append(a,
			"A Spot Instance Advisor bucket is taken at its middle (<5% → 2.5%, 5-10% → 7.5%, 10-15% → 12.5%, 15-20% → 17.5%), >20% at 25%.",
			"A monthly probability p of at least one interruption in 730 h is 1 − e^(−730h/M), so M = 730 h / −ln(1 − p).",
			"Observed rates can be far higher (50 % within a 12-hour run is M = 12 h / ln 2 ≈ 17 h): if yours are, give --mtbi.")
	}
	if f.set["size"] {
		a = append(a, "A save stalls training for size / throughput; if yours uploads in the background, give the stall as --save-cost.")
	}
	a = append(a,
		"The interval τ is training time between saves; each save stalls training for C (a blocking save).",
		"Young's τ = sqrt(2CM) is first order; Daly's τ = sqrt(2CM)·[1 + ⅓·sqrt(C/2M) + ⅑·(C/2M)] − C (τ = M when C ≥ 2M) is used for the costs.",
		"An interruption strikes uniformly within an interval, so it loses τ/2 of work, plus the restart R.",
		"A notice-triggered save that succeeds (probability q) loses only R; so only (1 − q) of interruptions lose τ/2, as if M were M/(1 − q).",
		"A notice-triggered save runs in the 2-minute notice, on time the instance loses anyway, so it costs nothing extra.",
		"A month is 730 h of wall time: saving takes C/τ of it, losses take (730 h / M) × loss per interruption (first order, as in Young).",
		"Lost and saving time is billed at the whole instance's price: every GPU waits or redoes work.",
	)
	if f.spotPrice > 0 {
		a = append(a, "Costs are at the spot price; the spot saving is 1 − spot/on-demand.")
	}
	if f.restart == planDefaultRestart && !f.set["restart"] {
		a = append(a, "The restart R defaults to 10 min: launching a replacement, restoring from S3, warming up; measure yours with --restart.")
	}
	return a
}

// planHuman formats d for people, to about three digits: "45s", "4m 30s", "5m", "1h 57m", "6h",
// "390d 4h", "10d", "79 years".
func planHuman(d time.Duration) string {
	two := func(a, b time.Duration, ua, ub string) string {
		if b == 0 {
			return fmt.Sprintf("%d%s", a, ua)
		}
		return fmt.Sprintf("%d%s %d%s", a, ua, b, ub)
	}
	const day = 24 * time.Hour
	switch {
	case d < time.Minute:
		return d.Round(100 * time.Millisecond).String()
	case d < time.Hour:
		d = d.Round(time.Second)
		return two(d/time.Minute, d%time.Minute/time.Second, "m", "s")
	case d < 48*time.Hour:
		d = d.Round(time.Minute)
		return two(d/time.Hour, d%time.Hour/time.Minute, "h", "m")
	case d < 10*365*day:
		d = d.Round(time.Hour)
		return two(d/day, d%day/time.Hour, "d", "h")
	default:
		return fmt.Sprintf("%.0f years", d.Hours()/(365*24))
	}
}

// planHours formats a monthly amount of time as hours and as a share of the month.
func planHours(d time.Duration, share float64) string {
	return fmt.Sprintf("%.1f h (%.1f%%)", d.Hours(), 100*share)
}

func printPlan(w io.Writer, f planFlags, p checkpoint.Plan) {
	in := p.Input
	var buf bytes.Buffer
	tw := tabwriter.NewWriter(&buf, 0, 0, 2, ' ', 0)
	fmt.Fprintln(tw, "Inputs\t")
	save := planHuman(in.SaveCost)
	if f.set["size"] {
		save += fmt.Sprintf(" (%s at %s)", f.sizeArg, f.rateArg)
	}
	fmt.Fprintf(tw, "  save cost C\t%s\n", save)
	fmt.Fprintf(tw, "  restart R\t%s\n", planHuman(in.Restart))
	mtbi := planHuman(in.MTBI)
	if f.set["interruption-rate"] {
		mtbi += fmt.Sprintf(" (interruption rate %s a month, taken as %.4g%%)", strings.TrimSpace(f.rate), 100*f.p)
	}
	fmt.Fprintf(tw, "  mean time between interruptions M\t%s\n", mtbi)
	fmt.Fprintf(tw, "  interruptions a month\t%.3g\n", p.InterruptionsPerMonth)
	fmt.Fprintf(tw, "  notice-save success q\t%.2f\n", in.NoticeSuccess)
	fmt.Fprintln(tw, "\t")
	fmt.Fprintf(tw, "Checkpoint interval\tperiodic saves only\twith notice saves (M/(1−q) = %s)\n", planHuman(p.Notice.MTBI))
	pe, no := p.Periodic, p.Notice
	fmt.Fprintf(tw, "  Young sqrt(2CM)\t%s\t%s\n", planHuman(pe.Young), planHuman(no.Young))
	fmt.Fprintf(tw, "  Daly (used below)\t%s\t%s\n", planHuman(pe.Daly), planHuman(no.Daly))
	fmt.Fprintf(tw, "  loss per interruption\t%s = τ/2 + R\t%s = (1−q)·τ/2 + R\n", planHuman(pe.LossPerInterruption), planHuman(no.LossPerInterruption))
	fmt.Fprintf(tw, "  saving a month\t%s\t%s\n", planHours(pe.Saving, pe.SavingShare), planHours(no.Saving, no.SavingShare))
	fmt.Fprintf(tw, "  lost a month\t%s\t%s\n", planHours(pe.Lost, pe.LostShare), planHours(no.Lost, no.LostShare))
	fmt.Fprintf(tw, "  overhead a month\t%s\t%s\n", planHours(pe.Overhead, pe.OverheadShare), planHours(no.Overhead, no.OverheadShare))
	if p.CostPrice > 0 {
		fmt.Fprintf(tw, "  overhead cost a month\t$%.2f\t$%.2f\n", pe.OverheadCost, no.OverheadCost)
	}
	if p.CostPrice > 0 {
		fmt.Fprintln(tw, "\t")
		fmt.Fprintln(tw, "Price\t")
		if in.Price > 0 {
			fmt.Fprintf(tw, "  on-demand\t$%.4g/h = $%.4g per GPU-hour (%d GPUs)\n", in.Price, p.PerGPUHour, in.GPUs)
		}
		if in.SpotPrice > 0 {
			fmt.Fprintf(tw, "  spot\t$%.4g/h = $%.4g per GPU-hour (%d GPUs)\n", in.SpotPrice, p.SpotPerGPUHour, in.GPUs)
		}
		if in.Price > 0 && in.SpotPrice > 0 {
			fmt.Fprintf(tw, "  spot saving\t%.1f%% = 1 − spot/on-demand\n", 100*p.SpotSaving)
		}
		which := "on-demand"
		if in.SpotPrice > 0 {
			which = "spot"
		}
		fmt.Fprintf(tw, "  a month (730 h) at %s\t$%.2f\n", which, p.MonthCost)
	}
	tw.Flush()
	for line := range strings.Lines(buf.String()) {
		fmt.Fprintln(w, strings.TrimRight(line, " \n"))
	}
	fmt.Fprintf(w, "\nCheckpoint every %s (Daly; Young says %s). Each interruption then loses %s on average (τ/2 + R).\n",
		planHuman(pe.Daly), planHuman(pe.Young), planHuman(pe.LossPerInterruption))
	fmt.Fprintf(w, "With notice-triggered saves that succeed with probability %.2f, the interval becomes %s (Young %s)\nand the expected loss per interruption (1−q)·τ/2 + R = %s.\n",
		in.NoticeSuccess, planHuman(no.Daly), planHuman(no.Young), planHuman(no.LossPerInterruption))
	fmt.Fprintln(w, "\nAssumptions:")
	for _, a := range planAssumptions(f) {
		fmt.Fprintf(w, "  - %s\n", a)
	}
}

// planJSON is `spotguard plan --json`. Durations are in seconds, prices in USD; a number that
// needs a flag that was not given is left out.
type planJSON struct {
	Inputs                planJSONInputs `json:"inputs"`
	MonthS                float64        `json:"month_s"`
	InterruptionsPerMonth float64        `json:"interruptions_per_month"`
	Periodic              planJSONPolicy `json:"periodic"`
	WithNotice            planJSONPolicy `json:"with_notice"`
	Prices                *planJSONPrice `json:"prices,omitempty"`
	Warnings              []string       `json:"warnings"`
	Assumptions           []string       `json:"assumptions"`
}

type planJSONInputs struct {
	SaveCostS                      float64  `json:"save_cost_s"`
	SizeBytes                      *float64 `json:"size_bytes,omitempty"`
	ThroughputBytesPerS            *float64 `json:"throughput_bytes_per_s,omitempty"`
	RestartS                       float64  `json:"restart_s"`
	MTBIS                          float64  `json:"mtbi_s"`
	InterruptionRate               string   `json:"interruption_rate,omitempty"`
	MonthlyInterruptionProbability *float64 `json:"monthly_interruption_probability,omitempty"`
	NoticeSuccess                  float64  `json:"notice_success"`
	PricePerHour                   *float64 `json:"price_per_hour,omitempty"`
	SpotPricePerHour               *float64 `json:"spot_price_per_hour,omitempty"`
	GPUs                           int      `json:"gpus"`
}

type planJSONPolicy struct {
	MTBIS                float64  `json:"mtbi_s"`
	YoungS               float64  `json:"young_interval_s"`
	DalyS                float64  `json:"daly_interval_s"`
	LossPerInterruptionS float64  `json:"loss_per_interruption_s"`
	SavingS              float64  `json:"saving_per_month_s"`
	LostS                float64  `json:"lost_per_month_s"`
	OverheadS            float64  `json:"overhead_per_month_s"`
	SavingShare          float64  `json:"saving_share"`
	LostShare            float64  `json:"lost_share"`
	OverheadShare        float64  `json:"overhead_share"`
	SavingUSD            *float64 `json:"saving_per_month_usd,omitempty"`
	LostUSD              *float64 `json:"lost_per_month_usd,omitempty"`
	OverheadUSD          *float64 `json:"overhead_per_month_usd,omitempty"`
}

type planJSONPrice struct {
	CostPricePerHour float64  `json:"cost_price_per_hour"`
	PerGPUHour       *float64 `json:"per_gpu_hour,omitempty"`
	SpotPerGPUHour   *float64 `json:"spot_per_gpu_hour,omitempty"`
	SpotSaving       *float64 `json:"spot_saving,omitempty"`
	MonthUSD         float64  `json:"month_usd"`
}

func planReport(f planFlags, p checkpoint.Plan) planJSON {
	in := p.Input
	opt := func(ok bool, v float64) *float64 {
		if !ok {
			return nil
		}
		return &v
	}
	hasPrice := p.CostPrice > 0
	policy := func(x checkpoint.PlanPolicy) planJSONPolicy {
		return planJSONPolicy{
			MTBIS:                x.MTBI.Seconds(),
			YoungS:               x.Young.Seconds(),
			DalyS:                x.Daly.Seconds(),
			LossPerInterruptionS: x.LossPerInterruption.Seconds(),
			SavingS:              x.Saving.Seconds(),
			LostS:                x.Lost.Seconds(),
			OverheadS:            x.Overhead.Seconds(),
			SavingShare:          x.SavingShare,
			LostShare:            x.LostShare,
			OverheadShare:        x.OverheadShare,
			SavingUSD:            opt(hasPrice, x.SavingCost),
			LostUSD:              opt(hasPrice, x.LostCost),
			OverheadUSD:          opt(hasPrice, x.OverheadCost),
		}
	}
	r := planJSON{
		Inputs: planJSONInputs{
			SaveCostS:                      in.SaveCost.Seconds(),
			SizeBytes:                      opt(f.set["size"], f.size),
			ThroughputBytesPerS:            opt(f.set["throughput"], f.throughput),
			RestartS:                       in.Restart.Seconds(),
			MTBIS:                          in.MTBI.Seconds(),
			MonthlyInterruptionProbability: opt(f.set["interruption-rate"], f.p),
			NoticeSuccess:                  in.NoticeSuccess,
			PricePerHour:                   opt(in.Price > 0, in.Price),
			SpotPricePerHour:               opt(in.SpotPrice > 0, in.SpotPrice),
			GPUs:                           in.GPUs,
		},
		MonthS:                checkpoint.PlanMonth.Seconds(),
		InterruptionsPerMonth: p.InterruptionsPerMonth,
		Periodic:              policy(p.Periodic),
		WithNotice:            policy(p.Notice),
		Warnings:              append([]string{}, p.Warnings...),
		Assumptions:           planAssumptions(f),
	}
	if f.set["interruption-rate"] {
		r.Inputs.InterruptionRate = strings.TrimSpace(f.rate)
	}
	if hasPrice {
		r.Prices = &planJSONPrice{
			CostPricePerHour: p.CostPrice,
			PerGPUHour:       opt(in.Price > 0, p.PerGPUHour),
			SpotPerGPUHour:   opt(in.SpotPrice > 0, p.SpotPerGPUHour),
			SpotSaving:       opt(in.Price > 0 && in.SpotPrice > 0, p.SpotSaving),
			MonthUSD:         p.MonthCost,
		}
	}
	return r
}
