package main

import (
	"bytes"
	"context"
	"os"
	"path/filepath"
	"strings"
	"sync/atomic"
	"testing"
	"time"

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

func (g *scriptedGPUs) RunEvents(context.Context) error { return nil }

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
			code := runGPU(t.Context(), args, nil, &stdout, &stderr, gpuDeps{open: func(zerolog.Logger) (gpuSource, error) { return g, nil }})
			if code != c.want || !strings.Contains(stdout.String(), c.reason) {
				t.Errorf("exit %d; want %d with %q:\n%s%s", code, c.want, c.reason, stdout.String(), stderr.String())
			}
		})
	}
}

// xidGPUs is one H100 whose driver reports a fatal XID (79, fallen off the bus) as soon as
// anyone listens for events; its samples count the XIDs heard until then, as nvml.GPUs's do.
type xidGPUs struct {
	listening chan struct{} // closed when RunEvents starts
	stopped   atomic.Bool   // RunEvents has returned
	closed    atomic.Bool   // Close was called
	lateClose atomic.Bool   // Close was called while RunEvents still ran
	xids      atomic.Uint64
}

func (g *xidGPUs) Facts() []nvml.Facts {
	return []nvml.Facts{{Index: 0, UUID: "GPU-a", Name: "NVIDIA H100 80GB HBM3", MaxSMClockMHz: 1980}}
}

// Sample waits (10 s at most) until someone listens for XIDs, so that a command that never
// does is caught without a race.
func (g *xidGPUs) Sample(ctx context.Context) []nvml.Sample {
	select {
	case <-g.listening:
	case <-ctx.Done():
	case <-time.After(10 * time.Second):
	}
	return []nvml.Sample{{Index: 0, UUID: "GPU-a", XIDCritical: g.xids.Load(), LastXID: 79}}
}

func (g *xidGPUs) RunEvents(ctx context.Context) error {
	g.xids.Add(1)
	close(g.listening)
	<-ctx.Done()
	g.stopped.Store(true)
	return nil
}

func (g *xidGPUs) Close() {
	g.lateClose.Store(!g.stopped.Load())
	g.closed.Store(true)
}

// `spotguard gpu` listens for XIDs while it samples (it used to never listen, so a launch
// check saw no XID, ever): an XID during the window makes the GPU degraded, and the listener is
// stopped and waited for before NVML is closed.
func TestGPUCountsXIDsWhileSampling(t *testing.T) {
	cfg := filepath.Join(t.TempDir(), "empty.yaml")
	os.WriteFile(cfg, nil, 0o644)
	g := &xidGPUs{listening: make(chan struct{})}
	var stdout, stderr bytes.Buffer
	code := runGPU(t.Context(), []string{"--config", cfg, "--samples", "2", "--interval", "1ms"}, nil, &stdout, &stderr,
		gpuDeps{open: func(zerolog.Logger) (gpuSource, error) { return g, nil }})
	if code != exitGPUDegraded || !strings.Contains(stdout.String(), "1 critical XID errors (last XID 79)") {
		t.Errorf("Got(gpu with an XID) = %d; want %d naming XID 79:\n%s%s", code, exitGPUDegraded, stdout.String(), stderr.String())
	}
	if !g.stopped.Load() || !g.closed.Load() || g.lateClose.Load() {
		t.Errorf("Got(RunEvents stopped, Close, Close before RunEvents returned) = %v, %v, %v; want true, true, false", g.stopped.Load(), g.closed.Load(), g.lateClose.Load())
	}
}
