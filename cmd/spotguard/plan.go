package main

import (
	"bytes"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"io"
	"math"
	"regexp"
	"strconv"
	"strings"
	"text/tabwriter"
	"time"
	"unicode/utf8"

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
	// planDefaultWriteThroughput is how fast a trainer writes a checkpoint locally when --size
	// gives the stall: about what torch.save reaches on a local NVMe disk (an instance store
	// writes several GB/s; a gp3 EBS volume's baseline is 125 MB/s).
	planDefaultWriteThroughput = "1GB/s"
	// planDefaultCommit is from the last byte uploaded to the commit: the manifest, then LATEST.
	planDefaultCommit = time.Second
)

const planSummary = `How often to checkpoint: the interval to use and why (Daly's optimum, with notice-triggered
saves only when a save can be in the store within the 2-minute notice), the expected work lost
per interruption, what saving and losing cost a month, and how all of it moves when M is half or
twice what you said.

Give how often the instance is interrupted (--mtbi or --interruption-rate), what a save costs
(--save-cost, the stall; and/or --size with --throughput for the upload) and, for costs, --price
and/or --spot-price. Durations are Go durations (90s, 5m, 1h30m) or days (1d, 1.5d, 2d12h).`

// planFlags are the parsed flags of `spotguard plan`.
type planFlags struct {
	mtbi       time.Duration
	rate       string        // --interruption-rate as given
	saveCost   time.Duration // the stall: --save-cost, or size / write
	upload     time.Duration // size / throughput; 0 without --size
	size       float64       // bytes
	throughput float64       // upload, bytes per second
	write      float64       // local write, bytes per second
	sizeArg    string        // --size as given
	rateArg    string        // --throughput as given
	writeArg   string        // --write-throughput as given, or its default
	restart    time.Duration
	price      float64
	spotPrice  float64
	gpus       int
	q          float64
	json       bool
	set        map[string]bool // flags given on the command line
}

func runPlan(args []string, stdout, stderr io.Writer) int {
	f := planFlags{restart: planDefaultRestart, gpus: planDefaultGPUs, q: planDefaultNoticeSuccess, writeArg: planDefaultWriteThroughput, set: map[string]bool{}}
	f.write, _ = checkpoint.ParseBytes(planDefaultWriteThroughput, true) // TestPlanDefaults checks it
	fs := newPlainFlagSet("plan", planSummary, stdout, stderr)
	fs.Func("mtbi", "mean time between interruptions, a `duration` such as 24h or 3d", func(v string) (err error) {
		if f.mtbi, err = planParsePositiveDuration(v); err == nil && f.mtbi < time.Minute {
			err = errors.New("less than a minute between interruptions: no training runs under that; want e.g. 24h or 3d")
		}
		return err
	})
	fs.Func("interruption-rate", "share of instances interrupted in a month: a Spot Instance Advisor `bucket` (<5%, 5-10%, 10-15%,\n15-20%, >20%) or a percentage such as 8.7%", func(v string) (err error) {
		f.rate = v
		_, err = checkpoint.ParseInterruptionRate(v) // NewPlan reads it again
		return err
	})
	fs.Func("save-cost", "save cost C: how long one save stalls training (writing the checkpoint locally; the upload\nruns in the background), a `duration`", func(v string) (err error) {
		f.saveCost, err = planParsePositiveDuration(v)
		return err
	})
	fs.Func("size", "checkpoint size in `bytes` (e.g. 40GiB, 512MiB, 2.5GB), with --throughput: the upload takes\nsize / throughput and, without --save-cost, the stall is size / write throughput", func(v string) (err error) {
		f.sizeArg = strings.TrimSpace(v)
		f.size, err = checkpoint.ParseBytes(v, false)
		return err
	})
	fs.Func("throughput", "upload throughput to the store in `bytes/s` (e.g. 250MB/s, 1GiB/s; 10Gbit/s or 10Gb/s: a lowercase b is bits)", func(v string) (err error) {
		f.rateArg = strings.TrimSpace(v)
		f.throughput, err = checkpoint.ParseBytes(v, true)
		return err
	})
	fs.Func("write-throughput", fmt.Sprintf("how fast the trainer writes a checkpoint locally, in `bytes/s`, for the stall with --size\n(default %s; a gp3 EBS volume's baseline is 125MB/s)", planDefaultWriteThroughput), func(v string) (err error) {
		f.writeArg = strings.TrimSpace(v)
		f.write, err = checkpoint.ParseBytes(v, true)
		return err
	})
	fs.Func("restart", fmt.Sprintf("restart time: from the interruption to training again on a new instance, a `duration` (default %s)", checkpoint.PlanHumanDuration(planDefaultRestart)), func(v string) (err error) {
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
	fs.Func("notice-success", fmt.Sprintf("probability `q` that a notice-triggered save succeeds, 0 to 0.999, or a percentage (default %v)", planDefaultNoticeSuccess), func(v string) (err error) {
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
	if f.set["size"] {
		var err error
		if f.upload, err = planTransfer(f.size, f.throughput); err != nil {
			fmt.Fprintf(stderr, "spotguard plan: --size %s at --throughput %s: %v\n", f.sizeArg, f.rateArg, err)
			return exitUsage
		}
		if !f.set["save-cost"] {
			if f.saveCost, err = planTransfer(f.size, f.write); err != nil {
				fmt.Fprintf(stderr, "spotguard plan: --size %s at --write-throughput %s: %v\n", f.sizeArg, f.writeArg, err)
				return exitUsage
			}
		}
	}
	in := checkpoint.PlanInput{
		SaveCost:      f.saveCost,
		Upload:        f.upload,
		Commit:        planDefaultCommit,
		Restart:       f.restart,
		MTBI:          f.mtbi,
		NoticeSuccess: f.q,
		Price:         f.price,
		SpotPrice:     f.spotPrice,
		GPUs:          f.gpus,
	}
	if f.set["interruption-rate"] {
		in.InterruptionRate = strings.TrimSpace(f.rate)
	}
	plan, err := checkpoint.NewPlan(in)
	if err != nil { // every flag is checked above; this is a backstop
		fmt.Fprintf(stderr, "spotguard plan: %v\n", err)
		return exitUsage
	}
	for _, w := range plan.Warnings {
		fmt.Fprintf(atPriority(stderr, 4), "spotguard plan: warning: %s\n", w)
	}
	if f.json {
		enc := json.NewEncoder(stdout)
		enc.SetIndent("", "  ")
		enc.SetEscapeHTML(false) // "<5%" as it is
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
	case f.set["size"] && !f.set["throughput"]:
		return errors.New("--size needs --throughput: the upload takes size / throughput")
	case f.set["throughput"] && !f.set["size"]:
		return errors.New("--throughput needs --size: the upload takes size / throughput")
	case f.set["write-throughput"] && !f.set["size"]:
		return errors.New("--write-throughput needs --size (and --throughput): the stall is size / write throughput")
	case f.set["write-throughput"] && f.set["save-cost"]:
		return errors.New("--save-cost and --write-throughput both give the stall: give --save-cost, or --size with --write-throughput")
	case !f.set["save-cost"] && !f.set["size"]:
		return errors.New("need --save-cost, or --size with --throughput: what one checkpoint save costs")
	}
	return nil
}

// planTransfer is how long moving size bytes at rate bytes/s takes; an error when that is not a
// Duration from 1 ns up.
func planTransfer(size, rate float64) (time.Duration, error) {
	ns := math.Round(size / rate * 1e9)
	if ns < 1 || ns >= math.MaxInt64 {
		return 0, fmt.Errorf("%gs is out of range", ns/1e9)
	}
	return time.Duration(ns), nil
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

// planMaxPrice bounds a price in USD per hour (a p5.48xlarge costs about 100).
const planMaxPrice = 1e6

// planParsePrice reads a price in USD per hour, with an optional "$" and "/h"; it must be positive
// and at most planMaxPrice.
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
	if n > planMaxPrice {
		// A month's cost, and the JSON, would overflow to +Inf.
		return 0, fmt.Errorf("more than %g USD an hour: not an instance's price", float64(planMaxPrice))
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
	switch {
	case f.set["size"] && !f.set["save-cost"]:
		def := ""
		if !f.set["write-throughput"] {
			def = ", the default"
		}
		a = append(a, fmt.Sprintf("A save stalls training while the trainer writes the checkpoint locally: C = size / write throughput (%s%s); give your disk's rate as --write-throughput, or the stall you measure as --save-cost.", f.writeArg, def))
	case f.set["size"]:
		a = append(a, "A save stalls training for --save-cost C: the local write.")
	default:
		a = append(a, "Without --size and --throughput the upload is not known: a save is taken to be in the store when its stall C ends, plus the commit K.")
	}
	if f.set["size"] {
		a = append(a, "The upload U = size / throughput runs in the background while training goes on: it does not stall training, and it ends before the next save starts (U < τ).")
	}
	a = append(a,
		fmt.Sprintf("A save is in the store max(C, U) + K after it starts: spotguard streams each file as the trainer closes it, then commits (K = %s for the manifest and LATEST).", checkpoint.PlanHumanDuration(planDefaultCommit)),
		"A notice-triggered save counts only when it is in the store within the 2-minute notice; then it runs on time the instance loses anyway and costs nothing extra. Otherwise q is taken as 0.",
		"The interval τ is training time between saves; each save stalls training for C (a blocking save).",
		"Young's τ = sqrt(2CM) is first order; Daly's τ = sqrt(2CM)·[1 + ⅓·sqrt(C/2M) + ⅑·(C/2M)] − C (τ = M when C ≥ 2M) is used for the costs.",
		"An interruption strikes uniformly within an interval, so it loses τ/2 of work, plus the restart R.",
		"A notice-triggered save that succeeds (probability q) loses only R; so only (1 − q) of interruptions lose τ/2, as if M were M/(1 − q).",
		"A month is 730 h of wall time: saving takes C/τ of it, losses take (730 h / M) × loss per interruption (first order, as in Young).",
		"Lost and saving time is billed at the whole instance's price: every GPU waits or redoes work.",
	)
	if f.spotPrice > 0 {
		a = append(a, "Costs are at the spot price; the spot saving is 1 − spot/on-demand.")
	}
	if !f.set["restart"] {
		a = append(a, "The restart R defaults to 10 min: launching a replacement, restoring from S3, warming up; measure yours with --restart.")
	}
	return a
}

// planHours formats a monthly amount of time as hours and as a share of the month.
func planHours(d time.Duration, share float64) string {
	return fmt.Sprintf("%.1f h (%s)", d.Hours(), planPercent(share))
}

// planWrapWidth is the width planWrap fills lines to.
const planWrapWidth = 100

// planWrap writes text after first, broken at spaces into lines of at most planWrapWidth
// characters where the words allow, each further line starting with next. A formula's operator
// (=, ×, +, −, ·, /, →) stays on one line with the words on either side of it, and a duration such as
// "1h 57m" stays whole.
func planWrap(w io.Writer, first, next, text string) {
	var words []string
	glue := false
	for _, word := range strings.Fields(text) {
		op := strings.Contains("= × + − · / →", word)
		if n := len(words); n > 0 && (op || glue || planDurationHead.MatchString(words[n-1]) && planDurationTail.MatchString(word)) {
			words[n-1] += " " + word
		} else {
			words = append(words, word)
		}
		glue = op
	}
	line, n := first, utf8.RuneCountInString(first)
	empty := true
	for _, word := range words {
		wn := utf8.RuneCountInString(word)
		if !empty && n+1+wn > planWrapWidth {
			fmt.Fprintln(w, line)
			line, n, empty = next, utf8.RuneCountInString(next), true
		}
		if !empty {
			line += " "
			n++
		}
		line += word
		n += wn
		empty = false
	}
	fmt.Fprintln(w, line)
}

// planDurationHead and planDurationTail match the two words of a duration PlanHumanDuration
// writes, such as "1h 57m" or "390d 4h".
var (
	planDurationHead = regexp.MustCompile(`[0-9][dhm]$`)
	planDurationTail = regexp.MustCompile(`^[0-9]+(\.[0-9]+)?[hms]\b`)
)

// planPercent formats a share as a percentage: one decimal, or two significant digits below 1 %.
func planPercent(share float64) string {
	if v := 100 * share; v != 0 && v < 1 {
		return fmt.Sprintf("%.2g%%", v)
	}
	return fmt.Sprintf("%.1f%%", 100*share)
}

// planLossFormula is the loss per interruption as a formula: τ/2 + R, or (1−q)·τ/2 + R.
func planLossFormula(q float64) string {
	if q == 0 {
		return "τ/2 + R"
	}
	return "(1−q)·τ/2 + R"
}

// planOverhead formats a month's overhead: hours, share and, with a price, dollars.
func planOverhead(c checkpoint.PlanCost, price bool) string {
	s := planHours(c.Overhead, c.OverheadShare)
	if price {
		s += fmt.Sprintf(", $%.2f", c.OverheadCost)
	}
	return s
}

func printPlan(w io.Writer, f planFlags, p checkpoint.Plan) {
	h := checkpoint.PlanHumanDuration
	in, rec, save := p.Input, p.Recommendation, p.Save
	hasPrice := p.CostPrice > 0

	// The recommendation first: the interval to use, why, what to keep in mind, what it costs.
	policy := "periodic saves only"
	if rec.WithNotice {
		policy = "with notice saves at q = " + checkpoint.PlanQ(rec.NoticeSuccess)
	}
	head := fmt.Sprintf("Recommendation: checkpoint every %s (Daly, %s, M = %s).", h(rec.Daly), policy, h(in.MTBI))
	if rec.UpperBound {
		head = fmt.Sprintf("Recommendation: checkpoint every %s or more often (Daly, %s, M = %s from --interruption-rate %s; both are upper bounds).",
			h(rec.Daly), policy, h(in.MTBI), in.InterruptionRate)
	}
	planWrap(w, "", "  ", head)
	planWrap(w, "  Why:    ", "          ", rec.Reason)
	if rec.Caveat != "" {
		planWrap(w, "  Caveat: ", "          ", rec.Caveat)
	}
	planWrap(w, "  Expect: ", "          ", fmt.Sprintf("each interruption loses %s on average (%s); the overhead is %s a month.",
		h(rec.LossPerInterruption), planLossFormula(rec.NoticeSuccess), planOverhead(rec.PlanCost, hasPrice)))
	fmt.Fprintln(w)

	var buf bytes.Buffer
	tw := tabwriter.NewWriter(&buf, 0, 0, 2, ' ', 0)
	fmt.Fprintln(tw, "Inputs\t")
	stall := h(save.Stall)
	switch {
	case f.set["size"] && !f.set["save-cost"]:
		def := ""
		if !f.set["write-throughput"] {
			def = ", the default --write-throughput"
		}
		stall += fmt.Sprintf(" (%s written at %s%s)", f.sizeArg, f.writeArg, def)
	case f.set["size"]:
		stall += " (--save-cost)"
	}
	fmt.Fprintf(tw, "  save stall C\t%s\n", stall)
	fit := "within"
	if !save.FitsNotice {
		fit = "later than"
	}
	if f.set["size"] {
		fmt.Fprintf(tw, "  upload U\t%s (%s at %s, in the background)\n", h(save.Upload), f.sizeArg, f.rateArg)
		fmt.Fprintf(tw, "  in the store after\t%s = max(C, U) + commit %s: %s the %s notice\n", h(save.Durable), h(save.Commit), fit, h(checkpoint.PlanSpotNotice))
	} else {
		fmt.Fprintf(tw, "  in the store after\t%s = C + commit %s: %s the %s notice\n", h(save.Durable), h(save.Commit), fit, h(checkpoint.PlanSpotNotice))
	}
	fmt.Fprintf(tw, "  restart R\t%s\n", h(in.Restart))
	mtbi := h(in.MTBI)
	if f.set["interruption-rate"] {
		mtbi += fmt.Sprintf(" (interruption rate %s a month, taken as %.4g%%)", in.InterruptionRate, 100*p.MonthlyRate)
	}
	fmt.Fprintf(tw, "  mean time between interruptions M\t%s\n", mtbi)
	fmt.Fprintf(tw, "  interruptions a month\t%.3g\n", p.InterruptionsPerMonth)
	q := checkpoint.PlanQ(in.NoticeSuccess)
	if in.NoticeSuccess > 0 && !save.FitsNotice {
		q += " (not used: a save is not in the store within the notice)"
	}
	fmt.Fprintf(tw, "  notice-save success q\t%s\n", q)

	// The policies side by side; the notice column only when q > 0.
	pe, no := p.Periodic, p.Notice
	row := func(label string, periodic, notice string) {
		if in.NoticeSuccess == 0 {
			fmt.Fprintf(tw, "  %s\t%s\n", label, periodic)
			return
		}
		fmt.Fprintf(tw, "  %s\t%s\t%s\n", label, periodic, notice)
	}
	fmt.Fprintln(tw, "\t")
	periodicHead, noticeHead := "periodic saves only", fmt.Sprintf("with notice saves, q = %s, M/(1−q) = %s", checkpoint.PlanQ(in.NoticeSuccess), h(no.MTBI))
	switch {
	case rec.WithNotice:
		noticeHead += " (recommended)"
	case in.NoticeSuccess > 0:
		periodicHead += " (recommended)"
	}
	if in.NoticeSuccess > 0 && !save.FitsNotice {
		noticeHead = fmt.Sprintf("if a save fitted in the notice, q = %s, M/(1−q) = %s", checkpoint.PlanQ(in.NoticeSuccess), h(no.MTBI))
	}
	fmt.Fprint(tw, "Checkpoint interval")
	row("", periodicHead, noticeHead)
	row("Young sqrt(2CM)", h(pe.Young), h(no.Young))
	row("Daly (used below)", h(pe.Daly), h(no.Daly))
	row("loss per interruption", h(pe.LossPerInterruption)+" = τ/2 + R", h(no.LossPerInterruption)+" = (1−q)·τ/2 + R")
	row("saving a month", planHours(pe.Saving, pe.SavingShare), planHours(no.Saving, no.SavingShare))
	row("lost a month", planHours(pe.Lost, pe.LostShare), planHours(no.Lost, no.LostShare))
	row("overhead a month", planHours(pe.Overhead, pe.OverheadShare), planHours(no.Overhead, no.OverheadShare))
	if hasPrice {
		row("overhead cost a month", fmt.Sprintf("$%.2f", pe.OverheadCost), fmt.Sprintf("$%.2f", no.OverheadCost))
	}

	// How the recommendation moves when M is off by a factor of two either way.
	fmt.Fprintln(tw, "\t")
	fmt.Fprintf(tw, "If M is off (q = %s)\tinterval\toverhead a month\tkeeping every %s\n", checkpoint.PlanQ(rec.NoticeSuccess), h(rec.Daly))
	sens := func(label string, interval time.Duration, optimal, kept checkpoint.PlanCost) {
		fmt.Fprintf(tw, "  %s\t%s\t%s\t%s\n", label, h(interval), planOverhead(optimal, hasPrice), planOverhead(kept, hasPrice))
	}
	lo, hi := p.Sensitivity[0], p.Sensitivity[1]
	sens("M × ½ = "+h(lo.MTBI), lo.Interval, lo.Optimal, lo.AtRecommended)
	sens("M = "+h(in.MTBI), rec.Daly, rec.PlanCost, rec.PlanCost)
	sens("M × 2 = "+h(hi.MTBI), hi.Interval, hi.Optimal, hi.AtRecommended)

	if hasPrice {
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
	_ = tw.Flush() // into a bytes.Buffer, which does not fail
	for line := range strings.Lines(buf.String()) {
		fmt.Fprintln(w, strings.TrimRight(line, " \n"))
	}
	fmt.Fprintln(w, "\nAssumptions:")
	for _, a := range planAssumptions(f) {
		planWrap(w, "  - ", "    ", a)
	}
}

// planJSON is `spotguard plan --json`. Durations are in seconds, prices in USD; a number that
// needs a flag that was not given is left out. recommendation is what to use; with_notice is
// what notice saves at q give, or would give if a save fitted in the notice (save.fits_notice).
type planJSON struct {
	Inputs                planJSONInputs         `json:"inputs"`
	Recommendation        planJSONRecommendation `json:"recommendation"`
	Save                  planJSONSave           `json:"save"`
	MonthS                float64                `json:"month_s"`
	InterruptionsPerMonth float64                `json:"interruptions_per_month"`
	Periodic              planJSONPolicy         `json:"periodic"`
	WithNotice            planJSONPolicy         `json:"with_notice"`
	Sensitivity           []planJSONSensitivity  `json:"sensitivity"`
	Prices                *planJSONPrice         `json:"prices,omitempty"`
	Warnings              []string               `json:"warnings"`
	Assumptions           []string               `json:"assumptions"`
}

type planJSONInputs struct {
	SaveCostS                      float64  `json:"save_cost_s"`
	SizeBytes                      *float64 `json:"size_bytes,omitempty"`
	ThroughputBytesPerS            *float64 `json:"throughput_bytes_per_s,omitempty"`
	WriteThroughputBytesPerS       *float64 `json:"write_throughput_bytes_per_s,omitempty"`
	RestartS                       float64  `json:"restart_s"`
	MTBIS                          float64  `json:"mtbi_s"`
	InterruptionRate               string   `json:"interruption_rate,omitempty"`
	MonthlyInterruptionProbability *float64 `json:"monthly_interruption_probability,omitempty"`
	NoticeSuccess                  float64  `json:"notice_success"`
	PricePerHour                   *float64 `json:"price_per_hour,omitempty"`
	SpotPricePerHour               *float64 `json:"spot_price_per_hour,omitempty"`
	GPUs                           int      `json:"gpus"`
}

// planJSONRecommendation is checkpoint.PlanRecommendation: policy "periodic" or "with_notice",
// interval_s the interval to use (its daly_interval_s), notice_success the q it is for.
type planJSONRecommendation struct {
	Policy        string  `json:"policy"`
	IntervalS     float64 `json:"interval_s"`
	NoticeSuccess float64 `json:"notice_success"`
	planJSONPolicy
	UpperBound bool   `json:"upper_bound"`
	Reason     string `json:"reason"`
	Caveat     string `json:"caveat,omitempty"`
}

type planJSONSave struct {
	StallS     float64  `json:"stall_s"`
	UploadS    *float64 `json:"upload_s,omitempty"`
	CommitS    float64  `json:"commit_s"`
	DurableS   float64  `json:"time_to_durable_s"`
	NoticeS    float64  `json:"notice_s"`
	FitsNotice bool     `json:"fits_notice"`
}

type planJSONCost struct {
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

type planJSONPolicy struct {
	MTBIS  float64 `json:"mtbi_s"`
	YoungS float64 `json:"young_interval_s"`
	DalyS  float64 `json:"daly_interval_s"`
	planJSONCost
}

type planJSONSensitivity struct {
	Factor                float64      `json:"mtbi_factor"`
	MTBIS                 float64      `json:"mtbi_s"`
	InterruptionsPerMonth float64      `json:"interruptions_per_month"`
	IntervalS             float64      `json:"interval_s"`
	Optimal               planJSONCost `json:"optimal"`
	AtRecommended         planJSONCost `json:"at_recommended_interval"`
}

type planJSONPrice struct {
	CostPricePerHour float64  `json:"cost_price_per_hour"`
	PerGPUHour       *float64 `json:"per_gpu_hour,omitempty"`
	SpotPerGPUHour   *float64 `json:"spot_per_gpu_hour,omitempty"`
	SpotSaving       *float64 `json:"spot_saving,omitempty"`
	MonthUSD         float64  `json:"month_usd"`
}

func planReport(f planFlags, p checkpoint.Plan) planJSON {
	in, rec := p.Input, p.Recommendation
	opt := func(ok bool, v float64) *float64 {
		if !ok {
			return nil
		}
		return &v
	}
	hasPrice := p.CostPrice > 0
	cost := func(x checkpoint.PlanCost) planJSONCost {
		return planJSONCost{
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
	policy := func(x checkpoint.PlanPolicy) planJSONPolicy {
		return planJSONPolicy{
			MTBIS:        x.MTBI.Seconds(),
			YoungS:       x.Young.Seconds(),
			DalyS:        x.Daly.Seconds(),
			planJSONCost: cost(x.PlanCost),
		}
	}
	r := planJSON{
		Inputs: planJSONInputs{
			SaveCostS:                      in.SaveCost.Seconds(),
			SizeBytes:                      opt(f.set["size"], f.size),
			ThroughputBytesPerS:            opt(f.set["throughput"], f.throughput),
			WriteThroughputBytesPerS:       opt(f.set["size"] && !f.set["save-cost"], f.write),
			RestartS:                       in.Restart.Seconds(),
			MTBIS:                          in.MTBI.Seconds(),
			InterruptionRate:               in.InterruptionRate,
			MonthlyInterruptionProbability: opt(in.InterruptionRate != "", p.MonthlyRate),
			NoticeSuccess:                  in.NoticeSuccess,
			PricePerHour:                   opt(in.Price > 0, in.Price),
			SpotPricePerHour:               opt(in.SpotPrice > 0, in.SpotPrice),
			GPUs:                           in.GPUs,
		},
		Recommendation: planJSONRecommendation{
			Policy:         "periodic",
			IntervalS:      rec.Daly.Seconds(),
			NoticeSuccess:  rec.NoticeSuccess,
			planJSONPolicy: policy(rec.PlanPolicy),
			UpperBound:     rec.UpperBound,
			Reason:         rec.Reason,
			Caveat:         rec.Caveat,
		},
		Save: planJSONSave{
			StallS:     p.Save.Stall.Seconds(),
			UploadS:    opt(f.set["size"], p.Save.Upload.Seconds()),
			CommitS:    p.Save.Commit.Seconds(),
			DurableS:   p.Save.Durable.Seconds(),
			NoticeS:    checkpoint.PlanSpotNotice.Seconds(),
			FitsNotice: p.Save.FitsNotice,
		},
		MonthS:                checkpoint.PlanMonth.Seconds(),
		InterruptionsPerMonth: p.InterruptionsPerMonth,
		Periodic:              policy(p.Periodic),
		WithNotice:            policy(p.Notice),
		Warnings:              append([]string{}, p.Warnings...),
		Assumptions:           planAssumptions(f),
	}
	if rec.WithNotice {
		r.Recommendation.Policy = "with_notice"
	}
	for _, s := range p.Sensitivity {
		r.Sensitivity = append(r.Sensitivity, planJSONSensitivity{
			Factor:                s.Factor,
			MTBIS:                 s.MTBI.Seconds(),
			InterruptionsPerMonth: s.InterruptionsPerMonth,
			IntervalS:             s.Interval.Seconds(),
			Optimal:               cost(s.Optimal),
			AtRecommended:         cost(s.AtRecommended),
		})
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
