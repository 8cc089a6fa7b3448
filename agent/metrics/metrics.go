// Package metrics sends spotguard's series to CloudWatch without ever making the notice path wait.
//
// Producers hand [Datum] values to a [Sink]. The [CloudWatch] sink keeps them in a bounded
// buffer and sends them with PutMetricData from its own goroutines ([CloudWatch.Run]):
// every Interval (regular series aggregated into one statistic set per series), at once when
// [CloudWatch.FlushNow] is called on a notice, and one last time when Run's context ends.
// Datums marked [Datum].Aggregate are also sent under aggregate dimension sets without the
// instance ([CloudWatchConfig].Aggregate), for alarms across a fleet.
// [CloudWatch.Record] and [CloudWatch.FlushNow] only touch memory: they return at once even
// when CloudWatch hangs.
package metrics

import "time"

// Unit is a CloudWatch standard unit. CloudWatch has no units for frequency, temperature or
// power: use [UnitNone] and put the unit in the metric name (GPUSMClockMHz, GPUTemperatureC,
// GPUPowerWatts). Any other CloudWatch standard unit (e.g. "Kilobytes") may be used as
// Unit("Kilobytes"); a datum with a unit CloudWatch does not know is dropped before sending
// and counted in [Stats].DroppedInvalid. The empty Unit means [UnitNone].
type Unit string

// The units spotguard uses.
const (
	UnitSeconds            Unit = "Seconds"
	UnitMilliseconds       Unit = "Milliseconds"
	UnitMicroseconds       Unit = "Microseconds"
	UnitBytes              Unit = "Bytes"
	UnitMegabytes          Unit = "Megabytes"
	UnitGigabytes          Unit = "Gigabytes"
	UnitBytesPerSecond     Unit = "Bytes/Second"
	UnitGigabytesPerSecond Unit = "Gigabytes/Second"
	UnitCount              Unit = "Count"
	UnitCountPerSecond     Unit = "Count/Second"
	UnitPercent            Unit = "Percent"
	UnitNone               Unit = "None"
)

// Datum is one sample of one series.
type Datum struct {
	// Name is the CloudWatch metric name, e.g. "NoticeToDurableSeconds", "GPUSMClockMHz":
	// 1 to 255 printable ASCII characters.
	Name string
	// Unit is the CloudWatch unit; empty means [UnitNone].
	Unit Unit
	// Value is the sample. NaN and ±Inf, and magnitudes above 2^360, are dropped before
	// sending (CloudWatch rejects them); non-zero magnitudes below 2^-360 are sent as 0.
	Value float64
	// Dimensions are the datum's own dimensions, beyond the sink's base dimensions
	// (InstanceId, InstanceType), e.g. {"GPU": "0"} or {"Source": "spot"}. A key that is
	// also a base dimension overrides the base value; an empty value means "no such
	// dimension". Together with the base at most 30. Record copies the map.
	Dimensions map[string]string
	// At is when the sample was taken; zero means the time of Record. A datum more than
	// about two weeks old or two hours ahead at the flush is dropped before sending
	// (CloudWatch would reject the whole call).
	At time.Time
	// HighRes marks a notice-path datum: it is sent on its own (never aggregated) with
	// 1-second storage resolution and its own timestamp, and it is the last to be dropped
	// when the buffer is full.
	HighRes bool
	// Aggregate sends the datum also under each of the sink's aggregate dimension sets
	// ([CloudWatchConfig].Aggregate): with only the base dimensions a set names, plus the
	// datum's own, so that one series gathers it from every instance that shares them.
	Aggregate bool
}

// Sink takes datums. Record never blocks: it only appends to a bounded buffer; when the
// buffer is full the oldest datums that are not HighRes are dropped and counted.
type Sink interface {
	Record(ds ...Datum)
}
