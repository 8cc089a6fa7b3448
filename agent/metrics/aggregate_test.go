package metrics

import (
	"fmt"
	"reflect"
	"slices"
	"strings"
	"testing"
	"testing/synctest"
	"time"
)

// TestAggregateDimensionSets sends datums marked Aggregate once more per aggregate dimension
// set, with only the base dimensions the set names (own dimensions kept), and never twice into
// one series: not when a set leaves the base as it is, not when two sets come out the same.
func TestAggregateDimensionSets(t *testing.T) {
	full := map[string]string{"InstanceId": "i-1", "InstanceType": "p5.48xlarge"}
	noID := map[string]string{"InstanceType": "p5.48xlarge"}
	tests := []struct {
		name      string
		base      map[string]string
		sets      [][]string
		datum     Datum
		wantDims  []string // one entry per series sent, dimensions as name=value sorted
		wantStats [4]float64
	}{
		{name: "no sets", base: full, datum: Datum{Name: "A", Aggregate: true},
			wantDims: []string{"InstanceId=i-1,InstanceType=p5.48xlarge"}},
		{name: "not marked", base: full, sets: [][]string{{"InstanceType"}}, datum: Datum{Name: "A"},
			wantDims: []string{"InstanceId=i-1,InstanceType=p5.48xlarge"}},
		{name: "instance type", base: full, sets: [][]string{{"InstanceType"}}, datum: Datum{Name: "A", Aggregate: true},
			wantDims: []string{"InstanceId=i-1,InstanceType=p5.48xlarge", "InstanceType=p5.48xlarge"}},
		{name: "own dimensions kept", base: full, sets: [][]string{{"InstanceType"}, {}},
			datum:    Datum{Name: "A", Aggregate: true, Dimensions: map[string]string{"Source": "spot"}},
			wantDims: []string{"InstanceId=i-1,InstanceType=p5.48xlarge,Source=spot", "InstanceType=p5.48xlarge,Source=spot", "Source=spot"}},
		{name: "identity not known yet", base: map[string]string{"InstanceId": "", "InstanceType": ""}, sets: [][]string{{"InstanceType"}, {}},
			datum: Datum{Name: "A", Aggregate: true}, wantDims: []string{""}},
		{name: "set keeps the whole base", base: noID, sets: [][]string{{"InstanceType"}}, datum: Datum{Name: "A", Aggregate: true},
			wantDims: []string{"InstanceType=p5.48xlarge"}},
		{name: "set listed twice", base: full, sets: [][]string{{"InstanceType"}, {"InstanceType"}}, datum: Datum{Name: "A", Aggregate: true},
			wantDims: []string{"InstanceId=i-1,InstanceType=p5.48xlarge", "InstanceType=p5.48xlarge"}},
		{name: "set naming no base dimension", base: full, sets: [][]string{{"AvailabilityZone"}, {}}, datum: Datum{Name: "A", Aggregate: true},
			wantDims: []string{"", "InstanceId=i-1,InstanceType=p5.48xlarge"}},
	}
	for _, tt := range tests {
		for _, highRes := range []bool{false, true} {
			t.Run(fmt.Sprintf("%s/HighRes=%v", tt.name, highRes), func(t *testing.T) {
				base, _ := baseDims(tt.base)
				d := tt.datum
				d.HighRes = highRes
				var hi, lo []Datum
				for v := range 3 { // three samples: one statistic set per series
					d.Value, d.At = float64(v), time.Now()
					if highRes {
						hi = append(hi, d)
					} else {
						lo = append(lo, d)
					}
				}
				b := build(hi, lo, base, tt.sets)
				if b.invalid != 0 || len(b.batches) != 1 {
					t.Fatalf("Got(build) = %d invalid (%v), %d batches; want none invalid, 1 batch", b.invalid, b.firstErr, len(b.batches))
				}
				if got := b.batches[0].samples; got != 3 {
					t.Errorf("Got(samples) = %d; want 3 (each recorded datum once, copies not counted)", got)
				}
				seen := map[string]int{}
				for _, md := range b.batches[0].data {
					var dims []string
					for _, dd := range md.Dimensions {
						dims = append(dims, *dd.Name+"="+*dd.Value)
					}
					seen[strings.Join(dims, ",")]++
					if highRes {
						if md.StorageResolution == nil || *md.StorageResolution != 1 || md.Value == nil {
							t.Errorf("Got(%q) = a datum of resolution %v; want a value at 1 s", strings.Join(dims, ","), md.StorageResolution)
						}
					} else if s := md.StatisticValues; s == nil || *s.SampleCount != 3 || *s.Sum != 3 || *s.Minimum != 0 || *s.Maximum != 2 {
						t.Errorf("Got(%q) = %+v; want one statistic set of the 3 samples", strings.Join(dims, ","), md.StatisticValues)
					}
				}
				want := 1 // a statistic set
				if highRes {
					want = 3 // each on its own
				}
				var got []string
				for k, n := range seen {
					got = append(got, k)
					if n != want {
						t.Errorf("Got(%q) = %d datums; want %d", k, n, want)
					}
				}
				slices.Sort(got)
				if !reflect.DeepEqual(got, tt.wantDims) {
					t.Errorf("Got(series) = %q; want %q", got, tt.wantDims)
				}
			})
		}
	}
}

// TestAggregateThroughRun: the copies reach the endpoint in the same calls, and the counters
// still add up (every recorded datum sent once; Sent counts the copies on the wire).
func TestAggregateThroughRun(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		f := newFakeCW(nil)
		c := NewCloudWatch(memClient(f), CloudWatchConfig{Base: testBase, Aggregate: [][]string{{"InstanceType"}}})
		stop := startRun(t, c)
		c.Record(Datum{Name: "Notices", Unit: UnitCount, Value: 1, Dimensions: map[string]string{"Source": "spot"}, HighRes: true, Aggregate: true})
		for range 4 {
			c.Record(Datum{Name: "IMDSUp", Unit: UnitCount, Value: 1, Aggregate: true},
				Datum{Name: "GPUSMClockMHz", Value: 1980, Dimensions: map[string]string{"GPU": "0"}})
		}
		advance(time.Minute)
		// The periodic flush is due at the same instant: let it finish before the stop, or the
		// stop cuts it after the endpoint got the data and the final flush sends it again.
		synctest.Wait()
		if err := stop(); err != nil {
			t.Errorf("Run() = %v; want nil", err)
		}
		var got []string
		for _, call := range f.got() {
			for _, d := range call.Data {
				got = append(got, d.String())
			}
		}
		at := time.Now().UTC().Add(-time.Minute).Format(time.RFC3339Nano)
		want := []string{
			"{Notices Count [InstanceId=i-0123456789abcdef0,InstanceType=p5.48xlarge,Source=spot] 1 res=1 at=" + at + "}",
			"{Notices Count [InstanceType=p5.48xlarge,Source=spot] 1 res=1 at=" + at + "}",
			"{GPUSMClockMHz None [GPU=0,InstanceId=i-0123456789abcdef0,InstanceType=p5.48xlarge] [4 7920 1980 1980] res=0 at=" + at + "}",
			"{IMDSUp Count [InstanceId=i-0123456789abcdef0,InstanceType=p5.48xlarge] [4 4 1 1] res=0 at=" + at + "}",
			"{IMDSUp Count [InstanceType=p5.48xlarge] [4 4 1 1] res=0 at=" + at + "}",
		}
		if !reflect.DeepEqual(got, want) {
			t.Errorf("Got(datums) =\n%s\nwant\n%s", strings.Join(got, "\n"), strings.Join(want, "\n"))
		}
		if st := c.Stats(); st.Recorded != 9 || st.SentSamples != 9 || st.Sent != 5 || st.Dropped() != 0 {
			t.Errorf("Got(Stats) = %+v; want 9 recorded and sent in 5 datums", st)
		}
	})
}
