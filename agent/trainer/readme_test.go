package trainer

import (
	"os"
	"strings"
	"testing"
)

// The metrics table (docs/metrics.md) lists every Reason of spotguard_trainer_discovery_problems_total.
func TestREADMEListsEveryReason(t *testing.T) {
	b, err := os.ReadFile("../../docs/metrics.md")
	if err != nil {
		t.Fatal(err)
	}
	var row string
	for line := range strings.SplitSeq(string(b), "\n") {
		if strings.HasPrefix(line, "| `spotguard_trainer_discovery_problems_total` |") {
			row = line
		}
	}
	if row == "" {
		t.Fatal("README has no metrics row for spotguard_trainer_discovery_problems_total")
	}
	for _, r := range Reasons() {
		if !strings.Contains(row, "`"+r+"`") {
			t.Errorf("README's spotguard_trainer_discovery_problems_total row lacks reason %q:\n%s", r, row)
		}
	}
}
