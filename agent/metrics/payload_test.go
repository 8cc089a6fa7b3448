package metrics

import (
	"context"
	"fmt"
	"testing"
	"time"
)

// The series of one minute on an 8-GPU instance with metrics.cloudwatch_per_gpu on, the most
// the agent sends (agent/gpu.go's gpuSeries and gpuDatums, agent.go's agentDatums): 20 per GPU
// (constants recorded every sample here, though the agent sends them only when they change),
// and 11 per instance (the agent's 5, the GPU aggregates' 6), which also go out without the
// instance (Aggregate, the default InstanceType set). All are sampled every 5 s.
var (
	gpuSeries = []struct {
		name string
		unit Unit
	}{
		{"GPUSMClockMHz", UnitNone}, {"GPUSMClockMaxMHz", UnitNone}, {"GPUMemClockMHz", UnitNone},
		{"GPUMemClockMaxMHz", UnitNone}, {"GPUMemBandwidthPeak", UnitBytesPerSecond},
		{"GPUMemBandwidthAchieved", UnitBytesPerSecond}, {"GPUUtilization", UnitPercent},
		{"GPUMemDutyCycle", UnitPercent}, {"GPUDRAMBandwidthUtilization", UnitPercent},
		{"GPUMemUsed", UnitBytes}, {"GPUMemTotal", UnitBytes}, {"GPUTemperatureCelsius", UnitNone},
		{"GPUPowerWatts", UnitNone}, {"GPUClockEventReasons", UnitCount}, {"GPUSlowdownPercent", UnitPercent},
		{"GPUECCUncorrected", UnitCount}, {"GPURemappedRowsPending", UnitCount}, {"GPUXIDCritical", UnitCount},
		{"GPULost", UnitCount}, {"GPUDegraded", UnitCount},
	}
	// instanceSeries are the per-instance series (the agent's sampled every 15 s, the GPU
	// aggregates once per GPU per sample; once every 5 s here, which only changes how many
	// samples their statistic sets hold, not the datums on the wire).
	instanceSeries = []string{
		"IMDSUp", "TrainerProcesses", "TrainerSignalUncaught", "NewestCheckpointAgeSeconds", "DurableForecastSeconds",
		"GPUDegradedCount", "GPULostCount", "GPUSMClockMHz", "GPUTemperatureCelsius", "GPUUtilization", "GPUMemBandwidthAchieved",
	}
	// minuteAggregate is the aggregate dimension set of the payload tests.
	minuteAggregate = [][]string{{"InstanceType"}}
)

const (
	minuteGPUs    = 8
	minuteSamples = 12 // every 5 s
)

// minutePayload is what one periodic flush of a minute of samples sends.
type minutePayload struct {
	Calls     int
	Datums    int // datums on the wire (one statistic set per series)
	Samples   int // datums recorded
	BodyBytes int // request bodies before compression
	WireBytes int // request bodies as sent (gzipped above 10240 bytes)
}

// recordMinute8GPU records one minute of samples starting at start.
func recordMinute8GPU(s Sink, start time.Time) int {
	n := 0
	gpuDims := make([]map[string]string, minuteGPUs)
	for g := range gpuDims {
		gpuDims[g] = map[string]string{"GPU": fmt.Sprint(g)}
	}
	for i := range minuteSamples {
		at := start.Add(time.Duration(i) * 5 * time.Second)
		ds := make([]Datum, 0, minuteGPUs*len(gpuSeries)+len(instanceSeries))
		for g := range minuteGPUs {
			for j, gs := range gpuSeries {
				ds = append(ds, Datum{Name: gs.name, Unit: gs.unit, Value: float64(1000*j + 10*g + i), Dimensions: gpuDims[g], At: at})
			}
		}
		for j, name := range instanceSeries {
			ds = append(ds, Datum{Name: name, Unit: UnitCount, Value: float64(j + i), At: at, Aggregate: true})
		}
		s.Record(ds...)
		n += len(ds)
	}
	return n
}

// measureMinute8GPU records a minute, flushes it as a periodic flush does, and returns what
// the endpoint received for it.
func measureMinute8GPU(tb testing.TB, c *CloudWatch, f *fakeCW, start time.Time) minutePayload {
	before := len(f.got())
	p := minutePayload{Samples: recordMinute8GPU(c, start)}
	if left := c.flush(context.Background(), modePeriodic, nil); left != nil {
		tb.Fatalf("flush left %d batches", len(left))
	}
	for _, call := range f.got()[before:] {
		if call.DecodeErr != nil {
			tb.Fatalf("decode: %v", call.DecodeErr)
		}
		p.Calls++
		p.Datums += len(call.Data)
		p.BodyBytes += call.BodyBytes
		p.WireBytes += call.WireBytes
	}
	return p
}

// TestMinutePayload8GPU reports and checks the CloudWatch traffic of one minute on an
// 8-GPU instance.
func TestMinutePayload8GPU(t *testing.T) {
	f := newFakeCW(nil)
	c := NewCloudWatch(memClient(f), CloudWatchConfig{Base: testBase, Aggregate: minuteAggregate})
	p := measureMinute8GPU(t, c, f, time.Now().Add(-time.Minute))
	t.Logf("per minute: %d calls, %d datums (%d samples), %d bytes body, %d bytes on the wire",
		p.Calls, p.Datums, p.Samples, p.BodyBytes, p.WireBytes)
	recorded := minuteGPUs*len(gpuSeries) + len(instanceSeries)
	wantDatums := recorded + len(instanceSeries) // and the aggregate copies
	if p.Calls != 1 || p.Datums != wantDatums || p.Samples != recorded*minuteSamples {
		t.Errorf("Got(payload) = %+v; want 1 call, %d datums, %d samples", p, wantDatums, recorded*minuteSamples)
	}
	if p.BodyBytes > MaxCallBytes || p.WireBytes >= p.BodyBytes {
		t.Errorf("Got(payload) = %+v; want a gzipped body under %d bytes", p, MaxCallBytes)
	}
}

// BenchmarkCloudWatchMinute8GPU measures recording and flushing one minute of an 8-GPU
// instance with every per-GPU series (20 series per GPU and 11 per instance, every 5 s)
// through the real SDK client to an in-memory endpoint, and reports the traffic per minute.
func BenchmarkCloudWatchMinute8GPU(b *testing.B) {
	f := newFakeCW(nil)
	c := NewCloudWatch(memClient(f), CloudWatchConfig{Base: testBase, Aggregate: minuteAggregate})
	var total minutePayload
	n := 0
	for b.Loop() {
		p := measureMinute8GPU(b, c, f, time.Now().Add(-time.Minute))
		total.Calls += p.Calls
		total.Datums += p.Datums
		total.Samples += p.Samples
		total.BodyBytes += p.BodyBytes
		total.WireBytes += p.WireBytes
		n++
		f.mu.Lock()
		f.calls = f.calls[:0]
		f.mu.Unlock()
	}
	b.ReportMetric(float64(total.WireBytes)/float64(n), "bytes/min")
	b.ReportMetric(float64(total.BodyBytes)/float64(n), "raw-bytes/min")
	b.ReportMetric(float64(total.Datums)/float64(n), "datums/min")
	b.ReportMetric(float64(total.Samples)/float64(n), "samples/min")
	b.ReportMetric(float64(total.Calls)/float64(n), "calls/min")
}
