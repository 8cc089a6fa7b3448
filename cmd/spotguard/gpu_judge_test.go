package main

import (
	"bytes"
	"context"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/rs/zerolog"

	"github.com/spotguard/spotguard/nvml"
)

// scriptedGPUs is four H100s whose last one is slow in the samples slowAt says.
type scriptedGPUs struct {
	slowAt func(sample int) bool
	n      int
}

func (g *scriptedGPUs) Facts() []nvml.Facts {
	var out []nvml.Facts
	for i := range 4 {
		out = append(out, nvml.Facts{Index: i, UUID: "GPU-" + string(rune('a'+i)), Name: "NVIDIA H100 80GB HBM3", MaxSMClockMHz: 1980})
	}
	return out
}

func (g *scriptedGPUs) Sample(context.Context) []nvml.Sample {
	var out []nvml.Sample
	for i := range 4 {
		clock, util := uint32(1980), 100.0
		if i == 3 && g.slowAt(g.n) {
			clock = 1600
		}
		out = append(out, nvml.Sample{Index: i, UUID: "GPU-" + string(rune('a'+i)), SMClockMHz: &clock, GPUUtilPercent: &util})
	}
	g.n++
	return out
}

func (g *scriptedGPUs) Close() {}

// `spotguard gpu` judges from several samples: a GPU slow in one of five is healthy (exit 0), one
// slow in every sample is degraded (exit 3) with the evidence; --samples 1 lets one reading decide.
func TestGPUJudgesFromSeveralSamples(t *testing.T) {
	cfg := filepath.Join(t.TempDir(), "empty.yaml")
	os.WriteFile(cfg, nil, 0o644)
	for _, c := range []struct {
		name   string
		slowAt func(int) bool
		args   []string
		want   int
		reason string
	}{
		{"slow once", func(s int) bool { return s == 2 }, nil, exitOK, ""},
		{"slow throughout", func(int) bool { return true }, nil, exitGPUDegraded, "(in 5 of the last 5 samples, since"},
		{"one reading decides", func(int) bool { return true }, []string{"--samples", "1"}, exitGPUDegraded, "19 % below the median"},
	} {
		t.Run(c.name, func(t *testing.T) {
			g := &scriptedGPUs{slowAt: c.slowAt}
			var stdout, stderr bytes.Buffer
			args := append([]string{"--config", cfg, "--interval", "1ms"}, c.args...)
			code := runGPU(t.Context(), args, nil, &stdout, &stderr, func(zerolog.Logger) (gpuSource, error) { return g, nil })
			if code != c.want || !strings.Contains(stdout.String(), c.reason) {
				t.Errorf("exit %d; want %d with %q:\n%s%s", code, c.want, c.reason, stdout.String(), stderr.String())
			}
		})
	}
}
