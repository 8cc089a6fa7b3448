//go:build !(linux && cgo)

package cuda

import (
	"errors"
	"testing"
)

func TestOpenUnavailable(t *testing.T) {
	d, err := Open("")
	if d != nil || !errors.Is(err, ErrUnavailable) {
		t.Errorf("Got(Open) = %v, %v; want nil, ErrUnavailable", d, err)
	}
	if _, err := d.Probe(t.Context(), Options{}); !errors.Is(err, ErrUnavailable) {
		t.Errorf("Got(Probe) = %v; want ErrUnavailable", err)
	}
	if d.Devices() != nil || d.Version() != 0 || d.Path() != "" {
		t.Errorf("Got(nil Driver) = %v, %d, %q; want nothing", d.Devices(), d.Version(), d.Path())
	}
}
