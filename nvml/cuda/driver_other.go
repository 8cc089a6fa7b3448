//go:build !(linux && cgo)

package cuda

import (
	"context"
	"fmt"
	"runtime"
)

// Driver is a loaded CUDA driver. This build has none (it needs Linux and cgo), so Open always
// fails and a Driver is always nil.
type Driver struct{}

// Open always returns nil and an error wrapping ErrUnavailable that says why: "not linux" or
// "built without cgo".
func Open(path string) (*Driver, error) {
	reason := "built without cgo"
	if runtime.GOOS != "linux" {
		reason = "not linux (" + runtime.GOOS + ")"
	}
	return nil, fmt.Errorf("%w: %s", ErrUnavailable, reason)
}

// Path returns "": there is no driver in this build.
func (d *Driver) Path() string { return "" }

// Version returns 0: there is no driver in this build.
func (d *Driver) Version() int { return 0 }

// Devices returns nil: there are no devices in this build.
func (d *Driver) Devices() []DeviceInfo { return nil }

// Probe returns an error wrapping ErrUnavailable: there are no devices in this build.
func (d *Driver) Probe(ctx context.Context, opts Options) (Results, error) {
	return Results{}, fmt.Errorf("%w: no driver in this build", ErrUnavailable)
}
