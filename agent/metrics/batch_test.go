package metrics

import (
	"errors"
	"fmt"
	"math"
	"strings"
	"testing"
	"testing/synctest"
	"time"

	"github.com/aws/aws-sdk-go-v2/aws"
	"github.com/rs/zerolog"
)

// TestBuildChecksDatums runs every datum through build both as a notice datum and as a
// regular one: what CloudWatch would reject is dropped and counted, the rest is fixed up.
func TestBuildChecksDatums(t *testing.T) {
	manyDims := func(n int) map[string]string {
		m := map[string]string{}
		for i := range n {
			m[fmt.Sprintf("D%02d", i)] = "v"
		}
		return m
	}
	tests := []struct {
		name      string
		d         Datum
		wantValid bool
		wantValue float64
		wantUnit  string
		wantDims  map[string]string // checked when valid
	}{
		{name: "plain", d: Datum{Name: "A", Unit: UnitSeconds, Value: 2}, wantValid: true, wantValue: 2, wantUnit: "Seconds", wantDims: baseWith()},
		{name: "empty unit is None", d: Datum{Name: "A", Value: 2}, wantValid: true, wantValue: 2, wantUnit: "None", wantDims: baseWith()},
		{name: "other standard unit", d: Datum{Name: "A", Unit: "Kilobytes", Value: 2}, wantValid: true, wantValue: 2, wantUnit: "Kilobytes", wantDims: baseWith()},
		{name: "tiny value is 0", d: Datum{Name: "A", Value: 1e-200}, wantValid: true, wantValue: 0, wantUnit: "None", wantDims: baseWith()},
		{name: "empty dimension value skipped", d: Datum{Name: "A", Value: 1, Dimensions: map[string]string{"GPU": ""}}, wantValid: true, wantValue: 1, wantUnit: "None", wantDims: baseWith()},
		{name: "own dimension overrides base", d: Datum{Name: "A", Value: 1, Dimensions: map[string]string{"InstanceType": "g6e.xlarge"}}, wantValid: true, wantValue: 1, wantUnit: "None",
			wantDims: map[string]string{"InstanceId": "i-0123456789abcdef0", "InstanceType": "g6e.xlarge"}},
		{name: "28 own dimensions", d: Datum{Name: "A", Value: 1, Dimensions: manyDims(28)}, wantValid: true, wantValue: 1, wantUnit: "None"},
		{name: "NaN", d: Datum{Name: "A", Value: math.NaN()}},
		{name: "+Inf", d: Datum{Name: "A", Value: math.Inf(1)}},
		{name: "above 2^360", d: Datum{Name: "A", Value: -math.Ldexp(1, 361)}},
		{name: "empty name", d: Datum{Value: 1}},
		{name: "blank name", d: Datum{Name: "  ", Value: 1}},
		{name: "name too long", d: Datum{Name: strings.Repeat("n", 256), Value: 1}},
		{name: "non-ASCII name", d: Datum{Name: "Température", Value: 1}},
		{name: "unknown unit", d: Datum{Name: "GPUSMClock", Unit: "Megahertz", Value: 1}},
		{name: "dimension name with colon", d: Datum{Name: "A", Value: 1, Dimensions: map[string]string{":GPU": "0"}}},
		{name: "dimension value too long", d: Datum{Name: "A", Value: 1, Dimensions: map[string]string{"GPU": strings.Repeat("v", 1025)}}},
		{name: "31 own dimensions", d: Datum{Name: "A", Value: 1, Dimensions: manyDims(31)}},
		{name: "29 own dimensions and the base", d: Datum{Name: "A", Value: 1, Dimensions: manyDims(29)}},
		{name: "13 days old", d: Datum{Name: "A", Value: 1, At: time.Now().Add(-13 * 24 * time.Hour)}, wantValid: true, wantValue: 1, wantUnit: "None"},
		{name: "15 days old", d: Datum{Name: "A", Value: 1, At: time.Now().Add(-15 * 24 * time.Hour)}},
		{name: "1 hour ahead", d: Datum{Name: "A", Value: 1, At: time.Now().Add(time.Hour)}, wantValid: true, wantValue: 1, wantUnit: "None"},
		{name: "3 hours ahead", d: Datum{Name: "A", Value: 1, At: time.Now().Add(3 * time.Hour)}},
	}
	base, _ := baseDims(testBase())
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			if tt.d.At.IsZero() {
				tt.d.At = time.Now()
			}
			for _, highRes := range []bool{true, false} {
				d := tt.d
				d.HighRes = highRes
				var hi, lo []Datum
				if highRes {
					hi = []Datum{d}
				} else {
					lo = []Datum{d}
				}
				b := build(hi, lo, base, nil)
				if !tt.wantValid {
					if b.invalid != 1 || len(b.batches) != 0 || !errors.Is(b.firstErr, errInvalid) {
						t.Errorf("HighRes=%v: Got(build) = %d invalid (%v), %d batches; want 1 invalid, none", highRes, b.invalid, b.firstErr, len(b.batches))
					}
					continue
				}
				if b.invalid != 0 || len(b.batches) != 1 || len(b.batches[0].data) != 1 {
					t.Fatalf("HighRes=%v: Got(build) = %d invalid (%v), %d batches; want 1 datum", highRes, b.invalid, b.firstErr, len(b.batches))
				}
				md := b.batches[0].data[0]
				if got := aws.ToFloat64(md.Value); got != tt.wantValue || string(md.Unit) != tt.wantUnit {
					t.Errorf("HighRes=%v: Got(value, unit) = %v, %q; want %v, %q", highRes, got, md.Unit, tt.wantValue, tt.wantUnit)
				}
				if highRes != (aws.ToInt32(md.StorageResolution) == 1) {
					t.Errorf("HighRes=%v: Got(StorageResolution) = %v", highRes, aws.ToInt32(md.StorageResolution))
				}
				if tt.wantDims != nil {
					got := map[string]string{}
					for _, dd := range md.Dimensions {
						got[*dd.Name] = *dd.Value
					}
					if fmt.Sprint(got) != fmt.Sprint(tt.wantDims) {
						t.Errorf("HighRes=%v: Got(dimensions) = %v; want %v", highRes, got, tt.wantDims)
					}
				}
			}
		})
	}
}

// TestInvalidDatumsWarnOnce: invalid datums are counted every time but logged once.
func TestInvalidDatumsWarnOnce(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		f := newFakeCW(nil)
		var logs logBuffer
		c := NewCloudWatch(memClient(f), CloudWatchConfig{Interval: time.Hour, Logger: zerolog.New(&logs),
			Base: func() map[string]string { return map[string]string{"InstanceId": "i-1", ":bad": "x"} }})
		stop := startRun(t, c)
		for range 2 {
			c.Record(Datum{Name: "A", Value: math.NaN()}, Datum{Name: "B", Unit: "Megahertz", Value: 1}, Datum{Name: "C", Value: 1})
			c.FlushNow()
			synctest.Wait()
		}
		if err := stop(); err != nil {
			t.Errorf("Run() = %v; want nil", err)
		}
		if st := c.Stats(); st.DroppedInvalid != 4 || st.SentSamples != 2 {
			t.Errorf("Got(Stats) = %+v; want 4 invalid, 2 sent", st)
		}
		for _, msg := range []string{msgInvalid, msgBadBase} {
			if n := len(logs.lines(t, "warn", msg)); n != 1 {
				t.Errorf("got %d %q warnings; want 1\n%s", n, msg, logs.String())
			}
		}
		for _, call := range f.got() {
			if len(call.Data) != 1 || fmt.Sprint(call.Data[0].Dims) != "map[InstanceId:i-1]" {
				t.Errorf("sent %v; want C with InstanceId only", call.Data)
			}
		}
	})
}
