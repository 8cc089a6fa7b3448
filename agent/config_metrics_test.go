package agent

import (
	"reflect"
	"strings"
	"testing"
)

// metrics.cloudwatch_per_gpu and metrics.cloudwatch_aggregate: defaults, good values, and bad ones
// refused with an error naming the key, the value and where it came from.
func TestConfigCloudWatchKeys(t *testing.T) {
	c := mustLoad(t, LoadOptions{Environ: []string{"SPOTGUARD_TRAINER_PIDFILE=/x"}})
	if err := c.Validate(); err != nil {
		t.Fatalf("Validate() = %v; want nil", err)
	}
	if c.Metrics.CloudWatchPerGPU {
		t.Errorf("Got(%q) = true; want false", "metrics.cloudwatch_per_gpu")
	}
	if got, want := c.AggregateDimensions(), [][]string{{"InstanceType"}}; !reflect.DeepEqual(got, want) {
		t.Errorf("Got(%q) = %q; want %q", "metrics.cloudwatch_aggregate", got, want)
	}

	good := []struct {
		env     string
		perGPU  bool
		sets    []string
		dimsets [][]string
	}{
		{"SPOTGUARD_METRICS_CLOUDWATCH_PER_GPU=true", true, []string{"InstanceType"}, [][]string{{"InstanceType"}}},
		{"SPOTGUARD_METRICS_CLOUDWATCH_AGGREGATE=none", false, nil, nil},
		{"SPOTGUARD_METRICS_CLOUDWATCH_AGGREGATE=Region", false, []string{"Region"}, [][]string{{}}},
		{"SPOTGUARD_METRICS_CLOUDWATCH_AGGREGATE=InstanceType, Region", false, []string{"InstanceType", "Region"}, [][]string{{"InstanceType"}, {}}},
		{"SPOTGUARD_METRICS_CLOUDWATCH_AGGREGATE=Region,InstanceType", false, []string{"Region", "InstanceType"}, [][]string{{}, {"InstanceType"}}},
	}
	for _, tt := range good {
		c := mustLoad(t, LoadOptions{Environ: []string{"SPOTGUARD_TRAINER_PIDFILE=/x", tt.env}})
		if err := c.Validate(); err != nil {
			t.Errorf("Got(%q) = %v; want valid", tt.env, err)
			continue
		}
		if c.Metrics.CloudWatchPerGPU != tt.perGPU || !reflect.DeepEqual(c.Metrics.CloudWatchAggregate, tt.sets) {
			t.Errorf("Got(%q) = per GPU %v, sets %q; want %v, %q", tt.env, c.Metrics.CloudWatchPerGPU, c.Metrics.CloudWatchAggregate, tt.perGPU, tt.sets)
		}
		if got := c.AggregateDimensions(); len(got) != len(tt.dimsets) || (len(got) > 0 && !reflect.DeepEqual(normalize(got), normalize(tt.dimsets))) {
			t.Errorf("Got(%q).AggregateDimensions() = %q; want %q", tt.env, got, tt.dimsets)
		}
	}

	bad := []struct{ env, want string }{
		{"SPOTGUARD_METRICS_CLOUDWATCH_PER_GPU=yes please", `metrics.cloudwatch_per_gpu: "yes please" from SPOTGUARD_METRICS_CLOUDWATCH_PER_GPU: want true or false`},
		{"SPOTGUARD_METRICS_CLOUDWATCH_AGGREGATE=", `metrics.cloudwatch_aggregate: "" from SPOTGUARD_METRICS_CLOUDWATCH_AGGREGATE: empty: want InstanceType, Region`},
		{"SPOTGUARD_METRICS_CLOUDWATCH_AGGREGATE=instancetype", `metrics.cloudwatch_aggregate: "instancetype" from SPOTGUARD_METRICS_CLOUDWATCH_AGGREGATE: unknown dimension set "instancetype" (names are case-sensitive)`},
		{"SPOTGUARD_METRICS_CLOUDWATCH_AGGREGATE=InstanceId", `unknown dimension set "InstanceId"`},
		{"SPOTGUARD_METRICS_CLOUDWATCH_AGGREGATE=InstanceType,InstanceType", `metrics.cloudwatch_aggregate: "InstanceType,InstanceType" from SPOTGUARD_METRICS_CLOUDWATCH_AGGREGATE: InstanceType listed twice`},
		{"SPOTGUARD_METRICS_CLOUDWATCH_AGGREGATE=InstanceType,none", "none stands alone"},
		{"SPOTGUARD_METRICS_CLOUDWATCH_AGGREGATE=InstanceType,", "an empty dimension set in the list"},
	}
	for _, tt := range bad {
		c := mustLoad(t, LoadOptions{Environ: []string{"SPOTGUARD_TRAINER_PIDFILE=/x", tt.env}})
		if err := c.Validate(); err == nil || !strings.Contains(err.Error(), tt.want) {
			t.Errorf("Got(%q) = %v; want an error containing %q", tt.env, err, tt.want)
		}
	}

	// From the file, the line is named.
	path := writeConfig(t, "metrics:\n  cloudwatch_aggregate: Fleet\n")
	c = mustLoad(t, LoadOptions{Path: path, Environ: []string{"SPOTGUARD_TRAINER_PIDFILE=/x"}})
	if err := c.Validate(); err == nil || !strings.Contains(err.Error(), `metrics.cloudwatch_aggregate: "Fleet" from `+path+`:2: unknown dimension set "Fleet"`) {
		t.Errorf("Got(%q) = %v; want the key, the value and the file's line", "cloudwatch_aggregate: Fleet", err)
	}
}

// normalize makes empty sets compare equal however they were made.
func normalize(sets [][]string) [][]string {
	out := make([][]string, len(sets))
	for i, s := range sets {
		out[i] = append([]string{}, s...)
	}
	return out
}
