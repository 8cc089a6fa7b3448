//go:build !(linux && cgo)

package nvml

import (
	"errors"
	"testing"

	"github.com/rs/zerolog"
)

func TestOpenUnavailable(t *testing.T) {
	g, err := Open(zerolog.Nop())
	if g != nil || !errors.Is(err, ErrUnavailable) {
		t.Errorf("Open() = %v, %v; want nil, ErrUnavailable", g, err)
	}
	if g.Facts() != nil || g.Sample(t.Context()) != nil || g.RunEvents(t.Context()) != nil {
		t.Errorf("nil *GPUs methods returned something; want nil")
	}
	g.Close()
}
