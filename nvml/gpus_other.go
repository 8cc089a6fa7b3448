//go:build !(linux && cgo)

package nvml

import (
	"context"
	"fmt"
	"runtime"

	"github.com/rs/zerolog"
)

// GPUs samples the NVIDIA GPUs of this host through NVML. This build has
// no NVML (it needs Linux and cgo), so Open always fails and a GPUs is
// always nil; its methods accept a nil *GPUs and do nothing.
type GPUs struct{}

// Open always returns nil and an error wrapping ErrUnavailable that says
// why: "not linux" or "built without cgo".
func Open(log zerolog.Logger) (*GPUs, error) {
	reason := "built without cgo"
	if runtime.GOOS != "linux" {
		reason = "not linux (" + runtime.GOOS + ")"
	}
	return nil, fmt.Errorf("%w: %s", ErrUnavailable, reason)
}

// Facts returns nil: there are no GPUs in this build.
func (g *GPUs) Facts() []Facts { return nil }

// Sample returns nil: there are no GPUs in this build.
func (g *GPUs) Sample(ctx context.Context) []Sample { return nil }

// RunEvents returns nil at once: there are no GPU events in this build.
func (g *GPUs) RunEvents(ctx context.Context) error { return nil }

// Close does nothing.
func (g *GPUs) Close() {}
