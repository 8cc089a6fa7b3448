package metrics

import (
	"errors"
	"fmt"
	"maps"
	"math"
	"slices"
	"strings"
	"time"

	"github.com/aws/aws-sdk-go-v2/aws"
	"github.com/aws/aws-sdk-go-v2/service/cloudwatch/types"
)

// CloudWatch's limits on PutMetricData.
const (
	// MaxDatumsPerCall is the most datums in one PutMetricData call.
	MaxDatumsPerCall = 1000
	// MaxCallBytes is the budget for one call's request body, by the estimate below:
	// 1,000,000 bytes, under CloudWatch's 1 MB (1,048,576 bytes) for an HTTP POST.
	MaxCallBytes = 1_000_000
	// maxDimensions is the most dimensions per datum.
	maxDimensions = 30
	// maxNameLen and maxDimValueLen bound metric and dimension names, and dimension values.
	maxNameLen     = 255
	maxDimValueLen = 1024
	// maxAge and maxAhead bound timestamps, with margins: CloudWatch rejects data more
	// than two weeks old or more than two hours ahead (and with it the whole call).
	maxAge   = 14*24*time.Hour - time.Hour
	maxAhead = 2*time.Hour - 5*time.Minute
)

// Size estimate. The SDK sends Smithy RPC v2 CBOR: a datum is a CBOR map whose keys are
// the member names. The estimate is an upper bound of that encoding (checked against the
// real SDK in TestPayloadEstimateIsUpperBound), computed from the lengths of the strings
// plus fixed overheads:
//   - datumOverhead covers the map header; the keys "MetricName", "Dimensions", "Unit",
//     "Timestamp", "StorageResolution", "Value" and "StatisticValues" (with "SampleCount",
//     "Sum", "Minimum", "Maximum"); the headers of the strings, of the dimension array and
//     of the timestamp tag; every number at 9 bytes (float64). That is at most 180 bytes.
//   - dimOverhead covers one dimension's map header, keys "Name" and "Value" and two
//     string headers: at most 16 bytes.
//   - callOverhead covers the request map, "Namespace" and "MetricData" keys and headers;
//     the namespace itself (at most 255 bytes) fits in the 48 KiB between MaxCallBytes
//     and 1 MiB.
//
// The 1 MB limit is taken to apply to the uncompressed body (the SDK may gzip it; the
// estimate ignores that, so it holds either way).
const (
	datumOverhead = 200
	dimOverhead   = 24
	callOverhead  = 64
)

// datumSize estimates the encoded size of one datum.
func datumSize(d *types.MetricDatum) int {
	n := datumOverhead + len(aws.ToString(d.MetricName)) + len(d.Unit)
	for _, dim := range d.Dimensions {
		n += dimOverhead + len(aws.ToString(dim.Name)) + len(aws.ToString(dim.Value))
	}
	return n
}

// batch is the content of one PutMetricData call.
type batch struct {
	data    []types.MetricDatum
	samples int // recorded datums the call carries
	size    int // estimated body size
}

// dim is one dimension of a datum.
type dim struct{ name, value string }

// series accumulates the samples of one regular (not HighRes) series.
type series struct {
	name     string
	unit     Unit
	dims     []dim // every dimension (base and own), sorted by name
	n        int
	samples  int // recorded datums whose own series this is (not aggregate copies)
	sum      float64
	min, max float64
	at       time.Time // newest sample
}

// errInvalid marks a datum CloudWatch would reject.
var errInvalid = errors.New("metrics: invalid datum")

// Limits on values: CloudWatch rejects magnitudes above 2^360 and below 2^-360. Read-only.
var (
	maxMagnitude = math.Ldexp(1, 360)
	minMagnitude = math.Ldexp(1, -360)
)

// knownUnits are CloudWatch's standard units; read-only.
var knownUnits = func() map[Unit]bool {
	m := make(map[Unit]bool)
	for _, u := range types.StandardUnit("").Values() {
		m[Unit(u)] = true
	}
	return m
}()

// printable reports whether s is non-blank printable ASCII of at most n bytes.
func printable(s string, n int) bool {
	if len(s) == 0 || len(s) > n || strings.TrimSpace(s) == "" {
		return false
	}
	for i := 0; i < len(s); i++ {
		if s[i] < 0x20 || s[i] > 0x7e {
			return false
		}
	}
	return true
}

// check normalises d (empty unit to None, tiny values to 0) and returns its own
// dimensions sorted, without empty values. It returns an error wrapping errInvalid when
// CloudWatch would reject the datum (and with it the call): a bad name, unit, value,
// dimension, or a time more than 14 days before now (less 1 h) or 2 hours after it (less
// 5 min).
func check(d *Datum, now time.Time) ([]dim, error) {
	if !printable(d.Name, maxNameLen) {
		return nil, fmt.Errorf("%w: metric name %q", errInvalid, d.Name)
	}
	if d.Unit == "" {
		d.Unit = UnitNone
	}
	if !knownUnits[d.Unit] {
		return nil, fmt.Errorf("%w: %s: unit %q", errInvalid, d.Name, d.Unit)
	}
	switch v := math.Abs(d.Value); {
	case math.IsNaN(v) || v > maxMagnitude:
		return nil, fmt.Errorf("%w: %s: value %v", errInvalid, d.Name, d.Value)
	case v < minMagnitude:
		d.Value = 0
	}
	if d.At.Before(now.Add(-maxAge)) || d.At.After(now.Add(maxAhead)) {
		return nil, fmt.Errorf("%w: %s: time %s too far from now", errInvalid, d.Name, d.At.Format(time.RFC3339))
	}
	dims := make([]dim, 0, len(d.Dimensions))
	for k, v := range d.Dimensions {
		if v == "" {
			continue
		}
		if !printable(k, maxNameLen) || k[0] == ':' || !printable(v, maxDimValueLen) {
			return nil, fmt.Errorf("%w: %s: dimension %q=%q", errInvalid, d.Name, k, v)
		}
		dims = append(dims, dim{k, v})
	}
	if len(dims) > maxDimensions {
		return nil, fmt.Errorf("%w: %s: %d dimensions", errInvalid, d.Name, len(dims))
	}
	slices.SortFunc(dims, func(a, b dim) int { return strings.Compare(a.name, b.name) })
	return dims, nil
}

// seriesKey identifies a series by name, unit and all its dimensions (sorted by name).
func seriesKey(name string, unit Unit, dims []dim) string {
	var b strings.Builder
	b.WriteString(name)
	b.WriteByte(0)
	b.WriteString(string(unit))
	for _, d := range dims {
		b.WriteByte(0)
		b.WriteString(d.name)
		b.WriteByte(1)
		b.WriteString(d.value)
	}
	return b.String()
}

// mergeDims merges base and own (own wins) into one list sorted by name. It reports false when
// there are more than 30.
func mergeDims(base, own []dim) ([]dim, bool) {
	out := make([]dim, 0, len(base)+len(own))
	for _, b := range base {
		if !slices.ContainsFunc(own, func(o dim) bool { return o.name == b.name }) {
			out = append(out, b)
		}
	}
	out = append(out, own...)
	slices.SortFunc(out, func(a, b dim) int { return strings.Compare(a.name, b.name) })
	return out, len(out) <= maxDimensions
}

// cwDimensions turns dimensions into CloudWatch's.
func cwDimensions(dims []dim) []types.Dimension {
	out := make([]types.Dimension, len(dims))
	for i, d := range dims {
		out[i] = types.Dimension{Name: aws.String(d.name), Value: aws.String(d.value)}
	}
	return out
}

// baseDims turns the base map into valid dimensions sorted by name; invalid entries are
// reported in bad.
func baseDims(m map[string]string) (dims []dim, bad []string) {
	for k, v := range m {
		if v == "" {
			continue
		}
		if !printable(k, maxNameLen) || k[0] == ':' || !printable(v, maxDimValueLen) {
			bad = append(bad, k)
			continue
		}
		dims = append(dims, dim{k, v})
	}
	slices.SortFunc(dims, func(a, b dim) int { return strings.Compare(a.name, b.name) })
	return dims, bad
}

// aggregateBases returns, for each aggregate dimension set, the part of base it keeps.
func aggregateBases(base []dim, sets [][]string) [][]dim {
	out := make([][]dim, len(sets))
	for i, set := range sets {
		out[i] = []dim{}
		for _, b := range base {
			if slices.Contains(set, b.name) {
				out[i] = append(out[i], b)
			}
		}
	}
	return out
}

// variants returns the dimension lists a datum with own dimensions is sent with: first the
// base's (its own series), then, when aggregate is set, one per aggregate base, leaving out a
// list equal to an earlier one so that no series counts the datum twice. ok is false when the
// first has more than 30 dimensions (the datum is invalid; the others are fewer).
func variants(base []dim, aggs [][]dim, own []dim, aggregate bool) (out [][]dim, ok bool) {
	first, ok := mergeDims(base, own)
	if !ok {
		return nil, false
	}
	out = [][]dim{first}
	if !aggregate {
		return out, true
	}
	for _, ab := range aggs {
		v, _ := mergeDims(ab, own)
		if !slices.ContainsFunc(out, func(o []dim) bool { return slices.Equal(o, v) }) {
			out = append(out, v)
		}
	}
	return out, true
}

// built is the result of build.
type built struct {
	batches  []batch
	invalid  int   // recorded datums dropped as invalid
	firstErr error // why the first of them was invalid
}

// build turns buffered datums into calls: every HighRes datum on its own (StorageResolution
// 1, own timestamp), in the order recorded, each followed by its aggregate copies; then one
// datum per regular series (same name, unit and dimensions) in key order: a plain Value for a
// single sample, a StatisticSet for more, stamped with the newest sample's time. A datum with
// Aggregate set goes into one series more per dimension set in aggs whose dimensions differ
// from those before (see variants); only its own series counts it in the batch's samples.
// Calls hold at most MaxDatumsPerCall datums and at most MaxCallBytes by the estimate (a datum
// never exceeds it: 30 dimensions of maximal length estimate to under 40 KB).
func build(hi, lo []Datum, base []dim, aggs [][]string) built {
	now := time.Now()
	aggBases := aggregateBases(base, aggs)
	var out built
	invalid := func(err error) {
		out.invalid++
		if out.firstErr == nil {
			out.firstErr = err
		}
	}
	tooMany := func(d *Datum) error {
		return fmt.Errorf("%w: %s: more than %d dimensions with the base", errInvalid, d.Name, maxDimensions)
	}
	var data []types.MetricDatum
	var samples []int
	for _, d := range hi {
		own, err := check(&d, now)
		if err != nil {
			invalid(err)
			continue
		}
		vs, ok := variants(base, aggBases, own, d.Aggregate)
		if !ok {
			invalid(tooMany(&d))
			continue
		}
		for i, dims := range vs {
			data = append(data, types.MetricDatum{
				MetricName:        aws.String(d.Name),
				Unit:              types.StandardUnit(d.Unit),
				Value:             aws.Float64(d.Value),
				Dimensions:        cwDimensions(dims),
				Timestamp:         aws.Time(d.At),
				StorageResolution: aws.Int32(1),
			})
			samples = append(samples, b2i(i == 0))
		}
	}

	agg := make(map[string]*series)
	for _, d := range lo {
		own, err := check(&d, now)
		if err != nil {
			invalid(err)
			continue
		}
		vs, ok := variants(base, aggBases, own, d.Aggregate)
		if !ok {
			invalid(tooMany(&d))
			continue
		}
		for i, dims := range vs {
			k := seriesKey(d.Name, d.Unit, dims)
			s := agg[k]
			if s == nil {
				s = &series{name: d.Name, unit: d.Unit, dims: dims, min: d.Value, max: d.Value, at: d.At}
				agg[k] = s
			}
			s.n++
			s.samples += b2i(i == 0)
			s.sum += d.Value
			s.min = min(s.min, d.Value)
			s.max = max(s.max, d.Value)
			if d.At.After(s.at) {
				s.at = d.At
			}
		}
	}
	keys := slices.Sorted(maps.Keys(agg))
	for _, k := range keys {
		s := agg[k]
		md := types.MetricDatum{
			MetricName: aws.String(s.name),
			Unit:       types.StandardUnit(s.unit),
			Dimensions: cwDimensions(s.dims),
			Timestamp:  aws.Time(s.at),
		}
		if s.n == 1 {
			md.Value = aws.Float64(s.sum)
		} else {
			md.StatisticValues = &types.StatisticSet{
				SampleCount: aws.Float64(float64(s.n)),
				Sum:         aws.Float64(s.sum),
				Minimum:     aws.Float64(s.min),
				Maximum:     aws.Float64(s.max),
			}
		}
		data = append(data, md)
		samples = append(samples, s.samples)
	}

	var cur batch
	for i := range data {
		size := datumSize(&data[i])
		if len(cur.data) == MaxDatumsPerCall || (len(cur.data) > 0 && cur.size+size > MaxCallBytes) {
			out.batches = append(out.batches, cur)
			cur = batch{}
		}
		if len(cur.data) == 0 {
			cur.size = callOverhead
		}
		cur.data = append(cur.data, data[i])
		cur.samples += samples[i]
		cur.size += size
	}
	if len(cur.data) > 0 {
		out.batches = append(out.batches, cur)
	}
	return out
}

func b2i(b bool) int {
	if b {
		return 1
	}
	return 0
}
