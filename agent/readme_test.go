package agent

import (
	"fmt"
	"os"
	"regexp"
	"strings"
	"testing"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/spotguard/spotguard/agent/imds"
)

// The configuration reference (docs/configuration.md) and the metrics table (docs/metrics.md) must
// say what the code does, and the metrics table must be one table (a blank line between rows
// turns the rest into text).
func TestREADMEMatchesCode(t *testing.T) {
	b, err := os.ReadFile("../docs/configuration.md")
	if err != nil {
		t.Fatal(err)
	}
	readme := string(b)
	for _, k := range Keys() {
		def := "(empty)"
		if k.Default != "" {
			def = "`" + k.Default + "`"
		}
		row := fmt.Sprintf("| `%s` | %s | `%s` | %s |", k.Name, def, k.Env, k.Help)
		if !strings.Contains(readme, row) {
			t.Errorf("README lacks the config row:\n%s", row)
		}
	}

	b, err = os.ReadFile("../docs/metrics.md")
	if err != nil {
		t.Fatal(err)
	}
	readme = string(b)
	table, _, _ := strings.Cut(readme[strings.Index(readme, "| name |"):], "\n\n")
	reg := &capture{}
	newMetrics(reg, func() imds.Stats { return imds.Stats{} })
	reg.MustRegister(newGPUCollector(&gpuMonitor{}))
	fqName := regexp.MustCompile(`fqName: "([^"]+)"`)
	for _, c := range reg.collectors {
		ch := make(chan *prometheus.Desc, 16)
		go func() { c.Describe(ch); close(ch) }()
		for d := range ch {
			m := fqName.FindStringSubmatch(d.String())
			if m == nil || !strings.HasPrefix(m[1], "spotguard_") {
				continue
			}
			if !strings.Contains(table, "| `"+m[1]+"` |") {
				t.Errorf("docs/metrics.md's metrics table lacks %s (or it is broken by a blank line before it)", m[1])
			}
		}
	}
}

// capture is a Registerer that only remembers what was registered.
type capture struct{ collectors []prometheus.Collector }

func (c *capture) Register(col prometheus.Collector) error {
	c.collectors = append(c.collectors, col)
	return nil
}

func (c *capture) MustRegister(cols ...prometheus.Collector) {
	c.collectors = append(c.collectors, cols...)
}

func (c *capture) Unregister(prometheus.Collector) bool { return false }
