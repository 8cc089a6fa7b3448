package imds

import (
	"testing"
	"time"
)

func TestSourceStatsHealthy(t *testing.T) {
	now := time.Date(2030, 1, 1, 12, 0, 0, 0, time.UTC)
	for _, tc := range []struct {
		name string
		s    SourceStats
		want bool
	}{
		{"never polled", SourceStats{}, true},
		{"answering", SourceStats{Polls: 10, LastSuccess: now.Add(-time.Second)}, true},
		{"failing 29 s", SourceStats{Streak: 29, FailingSince: now.Add(-29 * time.Second), LastSuccess: now.Add(-30 * time.Second)}, true},
		{"failing 31 s", SourceStats{Streak: 31, FailingSince: now.Add(-31 * time.Second), LastSuccess: now.Add(-32 * time.Second)}, false},
		{"failing from the start", SourceStats{Streak: 40, FailingSince: now.Add(-40 * time.Second)}, false},
		{"recovered", SourceStats{Streak: 0, LastSuccess: now, LastError: "old"}, true},
	} {
		t.Run(tc.name, func(t *testing.T) {
			if got := tc.s.Healthy(now); got != tc.want {
				t.Errorf("Healthy(%+v) = %v; want %v", tc.s, got, tc.want)
			}
		})
	}
	// One source failing makes that source unhealthy while Stats, which any success satisfies,
	// stays healthy: /healthz must look at the spot source itself.
	st := Stats{Sources: map[Source]SourceStats{
		SourceSpot:      {Streak: 40, FailingSince: now.Add(-40 * time.Second)},
		SourceRebalance: {Polls: 40, LastSuccess: now},
	}, LastSuccess: now}
	if !st.Healthy(now) || st.Sources[SourceSpot].Healthy(now) {
		t.Errorf("Stats.Healthy = %v, spot Healthy = %v; want true, false", st.Healthy(now), st.Sources[SourceSpot].Healthy(now))
	}
}
