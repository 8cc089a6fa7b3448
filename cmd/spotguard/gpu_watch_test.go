package main

import (
	"bytes"
	"context"
	"encoding/json"
	"os"
	"path/filepath"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/rs/zerolog"

	"github.com/spotguard/spotguard/nvml"
)

// stuckGPUs is one H100 whose driver hangs: the calls named in stuck block until release is
// closed, whatever their context says, as a call into a hung driver does.
type stuckGPUs struct {
	stuck   map[string]bool // "Sample", "RunEvents"
	release chan struct{}
	closed  atomic.Bool
}

func (g *stuckGPUs) Facts() []nvml.Facts {
	return []nvml.Facts{{Index: 0, UUID: "GPU-a", Name: "NVIDIA H100 80GB HBM3", MaxSMClockMHz: 1980}}
}

func (g *stuckGPUs) Sample(ctx context.Context) []nvml.Sample {
	if g.stuck["Sample"] {
		<-g.release
	}
	return []nvml.Sample{{Index: 0, UUID: "GPU-a"}}
}

func (g *stuckGPUs) RunEvents(ctx context.Context) error {
	<-ctx.Done()
	if g.stuck["RunEvents"] {
		<-g.release
	}
	return nil
}

func (g *stuckGPUs) Close() { g.closed.Store(true) }

// `spotguard gpu` with a hung GPU or driver: a call into NVML that does not return within the
// limit ends the command with exit 3 (replace the instance), naming the call on stderr and in
// --json's hung, and NVML is left open (closing it would block too). Before, the command
// waited for ever, and a launch check with it.
func TestGPUHungNVML(t *testing.T) {
	cfg := filepath.Join(t.TempDir(), "empty.yaml")
	os.WriteFile(cfg, nil, 0o644)
	for _, c := range []struct {
		name  string
		stuck string // "open", or a stuckGPUs call
		args  []string
		want  string
	}{
		{"nvmlInit", "open", nil, "NVML (nvmlInit) has not returned after 0.05 s"},
		{"a sample", "Sample", nil, "NVML (a sample of every GPU) has not returned after 0.05 s"},
		{"the XID listener", "RunEvents", []string{"--samples", "2", "--interval", "1ms"}, "NVML (the XID listener) has not returned after 0.05 s"},
		{"nvmlInit, probing", "open", []string{"--probe"}, "NVML (nvmlInit) has not returned after 0.05 s"},
	} {
		for _, asJSON := range []bool{false, true} {
			t.Run(c.name+map[bool]string{false: "", true: " --json"}[asJSON], func(t *testing.T) {
				g := &stuckGPUs{stuck: map[string]bool{c.stuck: true}, release: make(chan struct{})}
				defer close(g.release)
				open := func(zerolog.Logger) (gpuSource, error) {
					if c.stuck == "open" {
						<-g.release
					}
					return g, nil
				}
				args := append([]string{"--config", cfg}, c.args...)
				if asJSON {
					args = append(args, "--json")
				}
				var stdout, stderr bytes.Buffer
				code := runGPU(t.Context(), args, nil, &stdout, &stderr, gpuDeps{open: open, answerLimit: 50 * time.Millisecond})
				if code != exitGPUDegraded || !strings.Contains(stderr.String(), c.want+": a GPU or its driver hangs") {
					t.Errorf("exit %d, stderr %q; want %d saying %q", code, stderr.String(), exitGPUDegraded, c.want)
				}
				if g.closed.Load() {
					t.Errorf("NVML closed while a call into it hangs; want it left open")
				}
				if !asJSON {
					if stdout.Len() != 0 {
						t.Errorf("stdout %q; want nothing", stdout.String())
					}
					return
				}
				var rep struct {
					Hung    string `json:"hung"`
					Healthy bool   `json:"healthy"`
					GPUs    []any  `json:"gpus"`
				}
				if err := json.Unmarshal(stdout.Bytes(), &rep); err != nil || rep.Hung != c.want || rep.Healthy || rep.GPUs == nil || len(rep.GPUs) != 0 {
					t.Errorf("--json = %s (%v); want hung %q, not healthy, no GPUs", stdout.String(), err, c.want)
				}
			})
		}
	}
}

// A GPU that answers: nothing is reported hung, and NVML is closed.
func TestGPUAnsweringNVMLClosed(t *testing.T) {
	cfg := filepath.Join(t.TempDir(), "empty.yaml")
	os.WriteFile(cfg, nil, 0o644)
	g := &stuckGPUs{release: make(chan struct{})}
	var stdout, stderr bytes.Buffer
	code := runGPU(t.Context(), []string{"--config", cfg, "--samples", "2", "--interval", "1ms"}, nil, &stdout, &stderr,
		gpuDeps{open: func(zerolog.Logger) (gpuSource, error) { return g, nil }, answerLimit: 50 * time.Millisecond})
	if code != exitOK || strings.Contains(stderr.String(), "hangs") || !g.closed.Load() {
		t.Errorf("exit %d, stderr %q, closed %v; want 0, nothing hung, NVML closed", code, stderr.String(), g.closed.Load())
	}
}

// cancellingGPUs is xidGPUs whose first sample cancels the command's context (Ctrl-C while it
// waits for the next sample).
type cancellingGPUs struct {
	*xidGPUs
	cancel context.CancelFunc
}

func (g cancellingGPUs) Sample(ctx context.Context) []nvml.Sample {
	defer g.cancel()
	return g.xidGPUs.Sample(ctx)
}

// Interrupted between samples, `spotguard gpu` still stops the XID listener and waits for it
// before it closes NVML.
func TestGPUInterruptedClosesAfterTheListener(t *testing.T) {
	cfg := filepath.Join(t.TempDir(), "empty.yaml")
	os.WriteFile(cfg, nil, 0o644)
	ctx, cancel := context.WithCancel(t.Context())
	g := cancellingGPUs{xidGPUs: &xidGPUs{listening: make(chan struct{})}, cancel: cancel}
	var stdout, stderr bytes.Buffer
	code := runGPU(ctx, []string{"--config", cfg, "--samples", "3", "--interval", "1h"}, nil, &stdout, &stderr,
		gpuDeps{open: func(zerolog.Logger) (gpuSource, error) { return g, nil }})
	if code != exitFail || !strings.Contains(stderr.String(), "context canceled") {
		t.Errorf("interrupted: exit %d, stderr %q; want %d, context canceled", code, stderr.String(), exitFail)
	}
	if !g.stopped.Load() || !g.closed.Load() || g.lateClose.Load() {
		t.Errorf("Got(RunEvents stopped, Close, Close before RunEvents returned) = %v, %v, %v; want true, true, false", g.stopped.Load(), g.closed.Load(), g.lateClose.Load())
	}
}
