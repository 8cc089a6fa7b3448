package agent

import (
	"context"
	"fmt"
	"os"
	"slices"
	"strconv"
	"strings"
	"sync"
	"testing"
	"testing/synctest"
	"time"

	"github.com/aws/aws-sdk-go-v2/aws"
	"github.com/aws/aws-sdk-go-v2/service/cloudwatch"
	"github.com/rs/zerolog"

	"github.com/spotguard/spotguard/checkpoint"
	"github.com/spotguard/spotguard/nvml"
)

// CloudWatch's list prices (us-east-1) that docs/metrics.md's cost table uses.
const (
	pricePerMetricMonth   = 0.30 // USD, the first 10,000 metrics
	pricePer1000Requests  = 0.01 // USD, PutMetricData
	hoursPerMonth         = 730
	periodicFlushesPerMin = 1 // metrics.cloudwatch_interval 60s
)

// gpuModel is what the cost table assumes a GPU model reports: every reading NVML has, GPM
// (achieved bandwidth, DRAM bandwidth utilization) on Hopper only, and the clock event counters.
type gpuModel struct {
	name                    string
	maxSM, maxMem, busWidth uint32
	memTotal                uint64
	gpm                     bool
}

var gpuModels = map[string]gpuModel{
	"A10G": {name: "NVIDIA A10G", maxSM: 1710, maxMem: 6251, busWidth: 384, memTotal: 23028 << 20},
	"A100": {name: "NVIDIA A100-SXM4-40GB", maxSM: 1410, maxMem: 1215, busWidth: 5120, memTotal: 40960 << 20},
	"H100": {name: "NVIDIA H100 80GB HBM3", maxSM: 1980, maxMem: 2619, busWidth: 5120, memTotal: 81559 << 20, gpm: true},
}

// modelGPUs are n healthy GPUs of one model under load, every reading present.
type modelGPUs struct {
	m gpuModel
	n int

	mu       sync.Mutex
	samples  int
	memTotal uint64 // GPU 0's framebuffer size, which the test may change
}

func newModelGPUs(m gpuModel, n int) *modelGPUs {
	return &modelGPUs{m: m, n: n, memTotal: m.memTotal}
}

func (g *modelGPUs) setMemTotal(b uint64) {
	g.mu.Lock()
	defer g.mu.Unlock()
	g.memTotal = b
}

func (g *modelGPUs) Facts() []nvml.Facts {
	out := make([]nvml.Facts, g.n)
	for i := range out {
		out[i] = nvml.Facts{Index: i, UUID: fmt.Sprintf("GPU-%04d", i), Name: g.m.name, MaxSMClockMHz: g.m.maxSM,
			MaxMemClockMHz: g.m.maxMem, MemBusWidthBits: g.m.busWidth, PeakMemBandwidth: nvml.PeakMemBandwidth(g.m.maxMem, g.m.busWidth)}
	}
	return out
}

func (g *modelGPUs) Sample(ctx context.Context) []nvml.Sample {
	g.mu.Lock()
	first := g.samples == 0
	g.samples++
	mem0 := g.memTotal
	g.mu.Unlock()
	now := time.Now()
	out := make([]nvml.Sample, g.n)
	for i := range out {
		mem := g.m.memTotal
		if i == 0 {
			mem = mem0
		}
		s := nvml.Sample{Index: i, UUID: fmt.Sprintf("GPU-%04d", i), At: now,
			SMClockMHz: ptr(g.m.maxSM), MemClockMHz: ptr(g.m.maxMem),
			GPUUtilPercent: ptr(97.0 + float64(i%3)), MemUtilPercent: ptr(41.0),
			MemUsedBytes: ptr(mem / 2), MemTotalBytes: ptr(mem),
			TemperatureC: ptr(61.0 + float64(i%5)), PowerW: ptr(390.0),
			ClockEventReasons:      []string{"sw_power_cap"},
			ECCUncorrectedVolatile: ptr(uint64(0)), RemappedRowsPending: ptr(false), RowRemapFailed: ptr(false),
		}
		if g.m.gpm {
			s.DRAMBandwidthUtilPercent = ptr(62.0)
			s.AchievedMemBandwidth = ptr(0.62 * nvml.PeakMemBandwidth(g.m.maxMem, g.m.busWidth))
			s.BandwidthSource = nvml.BandwidthGPM
		}
		var window time.Duration
		if !first {
			window = 5 * time.Second
		}
		for _, r := range []string{"sw_power_cap", "sync_boost", "board_limit", "low_utilization", "reliability",
			"sw_thermal_slowdown", "hw_thermal_slowdown", "hw_power_brake_slowdown"} {
			s.ClockEventTimes = append(s.ClockEventTimes, nvml.ClockEventTime{Reason: r, Total: time.Minute, Window: window})
		}
		out[i] = s
	}
	return out
}

func (g *modelGPUs) RunEvents(ctx context.Context) error { <-ctx.Done(); return nil }
func (g *modelGPUs) Close()                              {}

// sentDatum is one datum of one PutMetricData call.
type sentDatum struct {
	series   string // name and dimensions, sorted (seriesName)
	name     string
	dims     []string // name=value
	instance bool     // has the dimension InstanceId
	highRes  bool     // StorageResolution 1
	samples  float64  // SampleCount, 1 for a value
}

// recordingCW is a PutMetricDataAPI that keeps every call, stamped with the (bubble's) time.
type recordingCW struct {
	mu    sync.Mutex
	calls []sentCall
}

type sentCall struct {
	at   time.Time
	data []sentDatum
}

func (r *recordingCW) PutMetricData(ctx context.Context, in *cloudwatch.PutMetricDataInput, _ ...func(*cloudwatch.Options)) (*cloudwatch.PutMetricDataOutput, error) {
	c := sentCall{at: time.Now()}
	for _, d := range in.MetricData {
		var dims []string
		sd := sentDatum{name: aws.ToString(d.MetricName), highRes: aws.ToInt32(d.StorageResolution) == 1, samples: 1}
		for _, dim := range d.Dimensions {
			dims = append(dims, aws.ToString(dim.Name)+"="+aws.ToString(dim.Value))
			sd.instance = sd.instance || aws.ToString(dim.Name) == "InstanceId"
		}
		sd.dims = dims
		sd.series = seriesName(sd.name, dims)
		if d.StatisticValues != nil {
			sd.samples = aws.ToFloat64(d.StatisticValues.SampleCount)
		}
		c.data = append(c.data, sd)
	}
	r.mu.Lock()
	defer r.mu.Unlock()
	r.calls = append(r.calls, c)
	return &cloudwatch.PutMetricDataOutput{}, nil
}

// seriesName names a series by its metric name and its dimensions (name=value), sorted.
func seriesName(name string, dims []string) string {
	dims = slices.Sorted(slices.Values(dims))
	return name + " [" + strings.Join(dims, ",") + "]"
}

func (r *recordingCW) got() []sentCall {
	r.mu.Lock()
	defer r.mu.Unlock()
	return slices.Clone(r.calls)
}

// seriesCount is what one instance sends to CloudWatch, in distinct series (metric name and
// dimension set), as the cost table counts them.
type seriesCount struct {
	Own       int // sent in every interval, with InstanceId: billed every hour
	Aggregate int // sent in every interval without InstanceId (metrics.cloudwatch_aggregate): shared by the instance type
	Constants int // sent once (per-GPU constants), with InstanceId: billed for one hour per start
	Notice    int // sent for a notice (own and aggregate): billed for the notice's hour
	Calls     int // PutMetricData calls per periodic flush
	// OwnNames are the names of Own, sorted, without repeats.
	OwnNames []string
}

// costPerInstanceMonth is the list price of a month of an instance's own series and calls.
func (c seriesCount) costPerInstanceMonth() float64 {
	return float64(c.Own)*pricePerMetricMonth + float64(c.Calls*periodicFlushesPerMin*60*hoursPerMonth)/1000*pricePer1000Requests
}

// costPerTypeMonth is the list price of a month of the aggregate series, which every instance of
// the type shares.
func (c seriesCount) costPerTypeMonth() float64 {
	return float64(c.Aggregate) * pricePerMetricMonth
}

// countCloudWatchSeries runs a whole agent in a synctest bubble with n GPUs of model and the
// real CloudWatch sink on a recording client: a periodic checkpoint committed at start, five
// flush intervals, one spot notice in the fourth (its trainer signalled, its checkpoint written
// and committed), GPU 0's memory size changing in the fifth. It counts the series sent and
// checks how they were sent: every regular series in every minute, except the constants, which
// go once per GPU and again on the change; the per-instance GPU readings once per GPU and
// sample; no aggregate series counting a sample twice.
func countCloudWatchSeries(t *testing.T, model string, n int, perGPU bool) seriesCount {
	t.Helper()
	m, ok := gpuModels[model]
	if !ok {
		t.Fatalf("no GPU model %q", model)
	}
	var out seriesCount
	synctest.Test(t, func(t *testing.T) {
		cfg := mustLoad(t, LoadOptions{Environ: []string{"SPOTGUARD_HTTP_LISTEN=", "SPOTGUARD_TRAINER_MATCH=train",
			"SPOTGUARD_AGENT_RUNTIME_DIR=" + t.TempDir(), "SPOTGUARD_METRICS_CLOUDWATCH_PER_GPU=" + strconv.FormatBool(perGPU)}})
		api := &recordingCW{}
		gpus := newModelGPUs(m, n)
		fimds := newFakeIMDS()
		a, err := New(cfg, Deps{Logger: zerolog.Nop(), IMDS: fimds, CloudWatch: api,
			OpenGPUs: func(zerolog.Logger) (GPUs, error) { return gpus, nil }})
		if err != nil {
			t.Fatal(err)
		}
		a.coord.trainers = &fakeTrainers{}
		start := time.Now()
		commit := func(name, trigger string) {
			now := time.Now()
			a.onUpload(checkpoint.UploadEvent{Kind: checkpoint.CheckpointCommitted, Checkpoint: name, At: now,
				Manifest: &checkpoint.Manifest{Checkpoint: name, Trigger: trigger, CommittedAt: now, TotalBytes: 8 << 30,
					Timings: checkpoint.Timings{UploadSeconds: 20}},
				Throughput: 430e6, Forecast: 45 * time.Second})
		}
		commit("step-000100", "periodic")

		ctx, cancel := context.WithCancel(t.Context())
		done := make(chan error)
		go func() { done <- a.Run(ctx) }()

		passFakeTime(3*time.Minute + 5*time.Second)
		deadline := time.Now().Add(2 * time.Minute).UTC()
		fimds.set("spot/instance-action", `{"action": "terminate", "time": "`+deadline.Format(time.RFC3339)+`"}`)
		passFakeTime(2 * time.Second)
		if n, ok := a.Status().noticeByKey("spot/terminate"); !ok || n.State != StateTrainerSignalled {
			t.Fatalf("Got(%q) = %+v; want the trainer signalled", "spot/terminate", n)
		}
		passFakeTime(20 * time.Second)
		a.onUpload(checkpoint.UploadEvent{Kind: checkpoint.CheckpointComplete, Checkpoint: "step-000200", At: time.Now()})
		passFakeTime(25 * time.Second)
		commit("step-000200", "notice")
		passFakeTime(time.Until(start.Add(4*time.Minute + 30*time.Second)))
		gpus.setMemTotal(m.memTotal - 1<<20) // say, a driver that reserves more
		passFakeTime(time.Until(start.Add(5*time.Minute + 10*time.Second)))
		cancel()
		if err := <-done; err != nil {
			t.Errorf("Run() = %v; want nil", err)
		}

		// Which minutes (1 to 5: a periodic flush at its end, notice flushes within it) carried
		// each series; the final flush, after the fifth, is left out.
		type seen struct {
			d       sentDatum
			minutes []int
			samples float64 // in every call, the final flush's too
		}
		series := map[string]*seen{}
		calls := map[time.Duration]int{} // periodic flush → its calls
		for _, c := range api.got() {
			since := c.at.Sub(start)
			if since%time.Minute == 0 {
				calls[since]++
			}
			minute := int((since + time.Minute - 1) / time.Minute)
			byKey := map[string]sentDatum{}
			for _, d := range c.data {
				byKey[d.series] = d
			}
			for _, d := range c.data {
				s := series[d.series]
				if s == nil {
					s = &seen{d: d}
					series[d.series] = s
				}
				s.samples += d.samples
				if minute <= 5 && !slices.Contains(s.minutes, minute) {
					s.minutes = append(s.minutes, minute)
				}
				if d.instance {
					continue
				}
				// An aggregate copy travels with its instance's datum and has exactly its samples:
				// one instance alone never counts a sample twice.
				ownKey := seriesName(d.name, append(slices.Clone(d.dims), "InstanceId=i-0abc"))
				if o, ok := byKey[ownKey]; !ok || o.samples != d.samples {
					t.Errorf("Got(%q) = %v samples; want the %v of %q in the same call", d.series, d.samples, o.samples, ownKey)
				}
			}
		}
		for _, n := range calls {
			out.Calls = max(out.Calls, n)
		}
		for k := range 5 {
			if calls[time.Duration(k+1)*time.Minute] == 0 {
				t.Errorf("Got(periodic flush at %d min) = no call; want one", k+1)
			}
		}

		// The per-instance GPU readings hold one sample per GPU for each of GPUDegradedCount's.
		ticks := series["GPUDegradedCount [InstanceId=i-0abc,InstanceType=p5.48xlarge]"]
		for _, name := range []string{"GPUSMClockMHz", "GPUTemperatureCelsius", "GPUUtilization", "GPUMemBandwidthAchieved"} {
			s := series[name+" [InstanceId=i-0abc,InstanceType=p5.48xlarge]"]
			if s == nil || ticks == nil {
				if name != "GPUMemBandwidthAchieved" || m.gpm {
					t.Errorf("Got(%q) = not sent; want it in the default set", name)
				}
				continue
			}
			if s.samples != float64(n)*ticks.samples {
				t.Errorf("Got(%q) = %v samples; want %d GPUs × %v samples", name, s.samples, n, ticks.samples)
			}
		}

		own := map[string]bool{}
		for key, s := range series {
			switch {
			case s.d.highRes:
				out.Notice++
			case slices.Equal(s.minutes, []int{1, 2, 3, 4, 5}):
				if s.d.instance {
					out.Own++
					own[s.d.name] = true
				} else {
					out.Aggregate++
				}
			case isConstant(s.d.name):
				want := []int{1}
				if strings.HasPrefix(key, "GPUMemTotal [GPU=0,") {
					want = []int{1, 5}
				}
				if !slices.Equal(s.minutes, want) || s.samples != float64(len(want)) {
					t.Errorf("Got(%q) = sent %v times, in minutes %v; want %d, in %v (a constant goes once, and again when it changes)",
						key, s.samples, s.minutes, len(want), want)
				}
				out.Constants++
			default:
				t.Errorf("Got(%q) = sent in minutes %v; want every minute (or once, for a constant)", key, s.minutes)
			}
		}
		for name := range own {
			out.OwnNames = append(out.OwnNames, name)
		}
		slices.Sort(out.OwnNames)
	})
	return out
}

// isConstant reports whether a CloudWatch series is one of the GPU constants.
func isConstant(name string) bool {
	for _, g := range gpuSeries {
		if g.cw == name {
			return g.constant
		}
	}
	return false
}

// noticeByKey finds a notice in /status.
func (s Status) noticeByKey(key string) (NoticeStatus, bool) {
	for _, n := range s.Notices {
		if n.Key == key {
			return n, true
		}
	}
	return NoticeStatus{}, false
}

// The default set: what every instance sends every interval whatever its GPUs (the agent and
// checkpoint series, the per-instance GPU aggregates), and per-GPU series only when asked for.
// The numbers are the ones docs/metrics.md's cost table gives (TestCloudWatchCostTableMatchesDocs).
func TestCloudWatchSeriesCount(t *testing.T) {
	defaultNames := []string{"DurableForecastSeconds", "GPUDegradedCount", "GPULostCount", "GPUMemBandwidthAchieved",
		"GPUSMClockMHz", "GPUTemperatureCelsius", "GPUUtilization", "IMDSUp", "NewestCheckpointAgeSeconds",
		"TrainerProcesses", "TrainerSignalUncaught"}
	withoutGPM := slices.DeleteFunc(slices.Clone(defaultNames), func(s string) bool { return s == "GPUMemBandwidthAchieved" })
	tests := []struct {
		model  string
		n      int
		perGPU bool
		want   seriesCount
	}{
		{"A10G", 1, false, seriesCount{Own: 10, Aggregate: 10, Notice: 14, Calls: 1, OwnNames: withoutGPM}},
		{"A100", 8, false, seriesCount{Own: 10, Aggregate: 10, Notice: 14, Calls: 1, OwnNames: withoutGPM}},
		{"H100", 1, false, seriesCount{Own: 11, Aggregate: 11, Notice: 14, Calls: 1, OwnNames: defaultNames}},
		{"H100", 8, false, seriesCount{Own: 11, Aggregate: 11, Notice: 14, Calls: 1, OwnNames: defaultNames}},
		{"H100", 16, false, seriesCount{Own: 11, Aggregate: 11, Notice: 14, Calls: 1, OwnNames: defaultNames}},
		// Per GPU: 14 series more per GPU without GPM, 16 with, and 4 constants each sent once.
		{"A10G", 1, true, seriesCount{Own: 10 + 14, Aggregate: 10, Constants: 4, Notice: 14, Calls: 1}},
		{"A100", 8, true, seriesCount{Own: 10 + 8*14, Aggregate: 10, Constants: 8 * 4, Notice: 14, Calls: 1}},
		{"H100", 1, true, seriesCount{Own: 11 + 16, Aggregate: 11, Constants: 4, Notice: 14, Calls: 1}},
		{"H100", 8, true, seriesCount{Own: 11 + 8*16, Aggregate: 11, Constants: 8 * 4, Notice: 14, Calls: 1}},
		{"H100", 16, true, seriesCount{Own: 11 + 16*16, Aggregate: 11, Constants: 16 * 4, Notice: 14, Calls: 1}},
	}
	for _, tt := range tests {
		t.Run(fmt.Sprintf("%dx%s/per_gpu=%v", tt.n, tt.model, tt.perGPU), func(t *testing.T) {
			got := countCloudWatchSeries(t, tt.model, tt.n, tt.perGPU)
			if !tt.perGPU {
				if !slices.Equal(got.OwnNames, tt.want.OwnNames) {
					t.Errorf("Got(default series) = %q; want %q", got.OwnNames, tt.want.OwnNames)
				}
			}
			got.OwnNames, tt.want.OwnNames = nil, nil
			if fmt.Sprint(got) != fmt.Sprint(tt.want) {
				t.Errorf("Got(%dx%s per_gpu=%v) = %+v; want %+v", tt.n, tt.model, tt.perGPU, got, tt.want)
			}
		})
	}
}

// docs/metrics.md's cost table says what countCloudWatchSeries counts, and its dollars follow
// from the list prices: the docs cannot drift from the code.
func TestCloudWatchCostTableMatchesDocs(t *testing.T) {
	b, err := os.ReadFile("../docs/metrics.md")
	if err != nil {
		t.Fatal(err)
	}
	const header = "| instance | GPUs | `metrics.cloudwatch_per_gpu` |"
	text := string(b)
	i := strings.Index(text, header)
	if i < 0 {
		t.Fatalf("docs/metrics.md has no cost table starting %q", header)
	}
	table, _, _ := strings.Cut(text[i:], "\n\n")
	lines := strings.Split(strings.TrimSpace(table), "\n")[2:]
	if len(lines) != 8 {
		t.Errorf("Got(cost table rows) = %d; want 8 (4 instances, default and per GPU)", len(lines))
	}
	for _, line := range lines {
		cells := strings.Split(strings.Trim(line, "|"), "|")
		for i := range cells {
			cells[i] = strings.Trim(strings.TrimSpace(cells[i]), "`")
		}
		if len(cells) != 10 {
			t.Errorf("Got(%q) = %d cells; want 10", line, len(cells))
			continue
		}
		t.Run(cells[0]+"/"+cells[2], func(t *testing.T) {
			countText, model, ok := strings.Cut(cells[1], " × ")
			n, err := strconv.Atoi(countText)
			if !ok || err != nil {
				t.Fatalf("Got(%q) = GPUs %q; want N × MODEL", line, cells[1])
			}
			model, _, _ = strings.Cut(model, " ")
			perGPU, err := strconv.ParseBool(cells[2])
			if err != nil {
				t.Fatalf("Got(%q) = per GPU %q; want true or false", line, cells[2])
			}
			c := countCloudWatchSeries(t, model, n, perGPU)
			want := []string{
				strconv.Itoa(c.Own), strconv.Itoa(c.Aggregate), strconv.Itoa(c.Constants), strconv.Itoa(c.Notice),
				strconv.Itoa(c.Calls), fmt.Sprintf("%.2f", c.costPerInstanceMonth()), fmt.Sprintf("%.2f", c.costPerTypeMonth()),
			}
			if got := cells[3:]; !slices.Equal(got, want) {
				t.Errorf("Got(%q) = %q; want %q", line, got, want)
			}
		})
	}
}

// A notice that comes as IMDS comes back, IMDS having failed since the start, is sent to
// CloudWatch with the instance's dimensions: the identity's own fetch, in its backoff, had them
// seconds later, and the notice's datums went without, missed by the alarms per instance and per
// instance type (found from outside, 4 of 4).
func TestNoticeAsIMDSComesBackHasTheInstancesDimensions(t *testing.T) {
	cw := &recordingCW{}
	var fake *fakeIMDS
	tr := startShTrainer(t, true)
	ta := startAgentWith(t, func(d *Deps) {
		d.CloudWatch = cw
		fake = d.IMDS.(*fakeIMDS)
		fake.del("instance-id") // down, for the identity
	}, "SPOTGUARD_TRAINER_PIDFILE="+tr.pidfile)
	<-time.After(2500 * time.Millisecond) // the identity's fetch well into its backoff (2 s at most)
	fake.set("instance-id", "i-0abc")
	ta.imds.set("spot/instance-action", spotBody)
	ta.waitState(t, "spot/terminate", StateTrainerSignalled)
	eventually(t, "the notice's datum sent to CloudWatch", func() bool {
		cw.mu.Lock()
		defer cw.mu.Unlock()
		for _, c := range cw.calls {
			for _, d := range c.data {
				if d.name == "Notices" {
					return true
				}
			}
		}
		return false
	})
	cw.mu.Lock()
	defer cw.mu.Unlock()
	perInstance := false // besides the copy aggregated by InstanceType (metrics.cloudwatch_aggregate)
	for _, c := range cw.calls {
		for _, d := range c.data {
			if d.name != "Notices" {
				continue
			}
			perInstance = perInstance || slices.Contains(d.dims, "InstanceId=i-0abc")
			if !slices.Contains(d.dims, "InstanceType=p5.48xlarge") {
				t.Errorf("Notices datum with dimensions %v; want InstanceType=p5.48xlarge", d.dims)
			}
		}
	}
	if !perInstance {
		t.Errorf("no Notices datum with InstanceId=i-0abc: %+v", cw.calls)
	}
}
