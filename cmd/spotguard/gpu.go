package main

import (
	"cmp"
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"strings"
	"text/tabwriter"
	"time"

	"github.com/rs/zerolog"

	"github.com/spotguard/spotguard/agent"
	"github.com/spotguard/spotguard/nvml"
	"github.com/spotguard/spotguard/nvml/cuda"
)

// Exit codes of `spotguard gpu`, so it can gate a job at launch.
const (
	exitGPUDegraded = 3
	exitNoNVML      = 4
)

// gpuReport is `spotguard gpu --json`.
type gpuReport struct {
	Sampling bool   `json:"sampling"`
	Off      string `json:"off,omitempty"`
	// Hung says which call into NVML did not return in time (a hung GPU or driver); the report
	// has no GPUs then and is not healthy.
	Hung    string      `json:"hung,omitempty"`
	Healthy bool        `json:"healthy"`
	GPUs    []gpuRecord `json:"gpus"`
}

type gpuRecord struct {
	Facts   nvml.Facts   `json:"facts"`
	Sample  nvml.Sample  `json:"sample"`
	Verdict nvml.Verdict `json:"verdict"`
}

// openGPUs is nvml.Open; a variable of the command, not of the package, so tests can pass theirs.
type gpuOpener func(log zerolog.Logger) (gpuSource, error)

// gpuSource is what the command needs from the GPUs.
type gpuSource interface {
	Facts() []nvml.Facts
	Sample(ctx context.Context) []nvml.Sample
	// RunEvents counts XIDs into the samples until ctx ends (nvml.GPUs.RunEvents).
	RunEvents(ctx context.Context) error
	Close()
}

func openNVML(log zerolog.Logger) (gpuSource, error) {
	g, err := nvml.Open(log)
	if err != nil {
		return nil, err
	}
	return g, nil
}

// gpuDeps are what `spotguard gpu` opens; tests pass fakes.
type gpuDeps struct {
	// open opens NVML: openNVML.
	open gpuOpener
	// cudaLibrary is the CUDA driver --probe loads: "" is cuda.DefaultLibrary (libcuda.so.1).
	cudaLibrary string
	// probeSampleEvery is how often --probe samples NVML while the copies run: 0 is
	// probeSampleInterval.
	probeSampleEvery time.Duration
	// answerLimit is how long a call into NVML or the CUDA driver may take: 0 is gpuAnswerLimit.
	answerLimit time.Duration
}

// gpuHelp is the description of `spotguard gpu -h`.
const gpuHelp = `Sample every GPU --samples times, --interval apart, and judge it: clocks now/max, peak and
achieved memory bandwidth, utilization, temperature, power, clock-event reasons, verdict. A reading
of a moment (clocks, throttling, a peer comparison) counts only when it holds in 3 of the samples
(in all of them, with fewer than 3);
ECC, row remapping, critical XIDs and a lost GPU count at once. The report shows the last sample.

--probe is the launch check for the silicon lottery: it times device-to-device copies on every GPU
at once (about 2 s in all) and finds a GPU whose memory bandwidth is more than
gpu.degraded_threshold (10 %) below its peers'. Run it right after launch; on exit 3, replace the
instance.

Exit 0 healthy, 3 degraded (or hung: NVML or the CUDA driver did not answer within 30 s), 4 no
NVML (--probe: or no CUDA driver, with the reason), 1 another failure (--probe: a GPU could not be
probed).`

func runGPU(ctx context.Context, args, environ []string, stdout, stderr io.Writer, deps gpuDeps) int {
	fs, cf := newFlagSet("gpu", gpuHelp, stdout, stderr)
	jsonOut := fs.Bool("json", false, "print the report as JSON")
	nSamples := fs.Int("samples", nvml.DefaultEvidenceN, "how many samples to judge from (1: one reading decides)")
	interval := fs.Duration("interval", time.Second, "time between samples")
	probe := fs.Bool("probe", false, "instead of sampling, measure each GPU's memory bandwidth: device-to-device copies through the CUDA "+
		"driver (libcuda.so.1) on every GPU at once, judged against the other GPUs of its model (a GPU alone of its model: "+
		"against its peak × its architecture's copy efficiency), while NVML is sampled for clocks, slowdowns and XIDs")
	probeBytes := fs.String("probe-bytes", "1GiB", "with --probe: `SIZE` of each of the two buffers a GPU copies between, 64MiB to 64GiB "+
		"(at most a quarter of the GPU's free memory is used)")
	probeDuration := fs.Duration("probe-duration", cuda.DefaultDuration, "with --probe: how long each GPU copies, 100ms to 1m; all GPUs copy at once")
	if code, ok := fs.parse(args); !ok {
		return code
	}
	set := map[string]bool{}
	fs.Visit(func(f *flag.Flag) { set[f.Name] = true })
	pa := probeArgs{json: *jsonOut, duration: *probeDuration}
	switch {
	case *probe && (set["samples"] || set["interval"]):
		return fs.usageError("--samples and --interval are not used with --probe: it samples NVML every %v while the copies run", probeSampleInterval)
	case !*probe && (set["probe-bytes"] || set["probe-duration"]):
		return fs.usageError("--probe-bytes and --probe-duration need --probe")
	case *nSamples < 1 || *nSamples > 60 || *interval < 0:
		return fs.usageError("--samples %d --interval %v: want 1 to 60 samples, an interval of 0 or more", *nSamples, *interval)
	case *probeDuration < minProbeDuration || *probeDuration > maxProbeDuration:
		return fs.usageError("--probe-duration %v: want %v to %v", *probeDuration, minProbeDuration, maxProbeDuration)
	}
	if *probe {
		n, err := agent.ParseSize(*probeBytes)
		if err != nil {
			return fs.usageError("--probe-bytes %q: %v", *probeBytes, err)
		}
		if n < minProbeBytes || n > maxProbeBytes {
			return fs.usageError("--probe-bytes %s: want %s to %s", *probeBytes, iecBytes(minProbeBytes), iecBytes(maxProbeBytes))
		}
		pa.bytes = n
	}
	cfg, err := cf.load(environ)
	if err != nil {
		fmt.Fprintf(stderr, "spotguard gpu: %v\n", err)
		return exitFail
	}
	// A configuration that does not load (bad YAML, an unknown key, a bad value such as a
	// gpu.degraded_threshold of 5%) was passed over, and the GPUs judged at the default
	// threshold without a word (found from outside). Checks across keys (a store) do not apply.
	if probs := cfg.LoadProblems(); len(probs) > 0 {
		fmt.Fprintf(stderr, "spotguard gpu: invalid configuration:\n")
		for _, p := range probs {
			fmt.Fprintf(stderr, "  - %v\n", p)
		}
		return exitFail
	}
	pa.threshold = cfg.GPU.DegradedThreshold
	log := newLogger(stderr, environ, max(cfg.Log.Level, zerolog.WarnLevel))
	watch := &gpuWatch{limit: cmp.Or(deps.answerLimit, gpuAnswerLimit)}
	hung := func() int {
		switch {
		case *jsonOut && *probe:
			rep := offProbe("hung: "+watch.hungCall(), pa)
			rep.Hung = watch.hungCall()
			writeJSON(stdout, rep)
		case *jsonOut:
			writeJSON(stdout, gpuReport{Hung: watch.hungCall(), GPUs: []gpuRecord{}})
		}
		return gpuHung(stderr, watch)
	}
	var gpus gpuSource
	if !watch.do("NVML (nvmlInit)", 0, func() { gpus, err = deps.open(log) }) {
		return hung()
	}
	if err != nil {
		reason := strings.TrimPrefix(err.Error(), nvml.ErrUnavailable.Error()+": ")
		switch {
		case *jsonOut && *probe:
			writeJSON(stdout, offProbe("no NVML: "+reason, pa))
		case *jsonOut:
			writeJSON(stdout, gpuReport{Off: reason, GPUs: []gpuRecord{}})
		}
		fmt.Fprintf(stderr, "spotguard gpu: no NVML: %s\n", reason)
		if !errors.Is(err, nvml.ErrUnavailable) {
			return exitFail
		}
		return exitNoNVML
	}
	defer func() {
		if watch.hungCall() == "" { // closing would wait for the call that hangs
			gpus.Close()
		}
	}()
	if *probe {
		if code, ok := runProbe(ctx, stdout, stderr, gpus, deps, pa, watch); ok {
			return code
		}
		return hung()
	}
	// XIDs are events, not readings: they are counted only while RunEvents runs, so it runs for
	// the whole sampling window (and is stopped, and waited for, before the report and Close).
	evCtx, stopEvents := context.WithCancel(ctx)
	defer stopEvents()
	events := make(chan struct{})
	var eventsErr error
	go func() {
		defer close(events)
		eventsErr = gpus.RunEvents(evCtx)
	}()
	facts := gpus.Facts()
	judge := nvml.Judge{K: min(nvml.DefaultEvidenceK, *nSamples), N: *nSamples}
	var samples []nvml.Sample
	var verdicts []nvml.Verdict
	tick := time.NewTicker(max(*interval, time.Millisecond))
	defer tick.Stop()
	for i := range *nSamples {
		if i > 0 {
			select {
			case <-ctx.Done():
				fmt.Fprintf(stderr, "spotguard gpu: %v\n", ctx.Err())
				stopEvents()
				watch.await("NVML (the XID listener)", 0, events) // before Close, unless it hangs
				return exitFail
			case <-tick.C:
			}
		}
		var got []nvml.Sample
		if !watch.do("NVML (a sample of every GPU)", 0, func() { got = gpus.Sample(ctx) }) {
			return hung()
		}
		samples = got
		verdicts = judge.Judge(time.Now(), nvml.Verdicts(facts, samples, cfg.GPU.DegradedThreshold))
	}
	stopEvents()
	if !watch.await("NVML (the XID listener)", 0, events) {
		return hung()
	}
	if eventsErr != nil {
		fmt.Fprintf(stderr, "spotguard gpu: XIDs were not listened for: %v\n", eventsErr)
	}
	rep := gpuReport{Sampling: true, Healthy: true, GPUs: []gpuRecord{}}
	for i := range facts {
		r := gpuRecord{Facts: facts[i]}
		if i < len(samples) {
			r.Sample = samples[i]
		}
		if i < len(verdicts) {
			r.Verdict = verdicts[i]
			if verdicts[i].Degraded {
				rep.Healthy = false
			}
		}
		rep.GPUs = append(rep.GPUs, r)
	}
	if *jsonOut {
		writeJSON(stdout, rep)
	} else {
		printGPUTable(stdout, rep)
	}
	if !rep.Healthy {
		return exitGPUDegraded
	}
	return exitOK
}

func printGPUTable(w io.Writer, rep gpuReport) {
	if len(rep.GPUs) == 0 {
		fmt.Fprintln(w, "NVML works but reports no GPU")
		return
	}
	tw := tabwriter.NewWriter(w, 0, 0, 2, ' ', 0)
	fmt.Fprintln(tw, "GPU\tMODEL\tSM MHz\tMEM MHz\tPEAK GB/s\tACHIEVED GB/s\tUTIL %\tMEM BUSY %\tTEMP C\tPOWER W\tREASONS\tVERDICT")
	for _, g := range rep.GPUs {
		f, s := g.Facts, g.Sample
		verdict := "healthy"
		if g.Verdict.Degraded {
			verdict = "DEGRADED: " + strings.Join(g.Verdict.Reasons, "; ")
		}
		if s.Lost {
			verdict = "LOST"
		}
		mig := ""
		if f.MIG {
			mig = " (MIG: parent sampled)"
		}
		fmt.Fprintf(tw, "%d\t%s%s\t%s/%d\t%s/%d\t%s\t%s\t%s\t%s\t%s\t%s\t%s\t%s\n",
			f.Index, f.Name, mig,
			optU32(s.SMClockMHz), f.MaxSMClockMHz, optU32(s.MemClockMHz), f.MaxMemClockMHz,
			gbps(f.PeakMemBandwidth), optGBps(s.AchievedMemBandwidth),
			optF(s.GPUUtilPercent, "%.0f"), optF(s.MemUtilPercent, "%.0f"), optF(s.TemperatureC, "%.0f"), optF(s.PowerW, "%.0f"),
			orDash(strings.Join(s.ClockEventReasons, ",")), verdict)
	}
	tw.Flush()
}

func optU32(p *uint32) string {
	if p == nil {
		return "-"
	}
	return fmt.Sprint(*p)
}

func optF(p *float64, format string) string {
	if p == nil {
		return "-"
	}
	return fmt.Sprintf(format, *p)
}

func gbps(v float64) string {
	if v <= 0 {
		return "-"
	}
	return fmt.Sprintf("%.0f", v/1e9)
}

// optGBps formats an achieved bandwidth: GPM's, or "-" where the GPU has no counter of bytes moved
// (its memory duty cycle is in MEM BUSY %).
func optGBps(p *float64) string {
	if p == nil {
		return "-"
	}
	return gbps(*p)
}

func orDash(s string) string {
	if s == "" {
		return "-"
	}
	return s
}
