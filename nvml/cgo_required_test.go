//go:build linux

package nvml

import (
	"os"
	"os/exec"
	"strings"
	"testing"
)

// TestBuildWithoutCgoFailsLoudly: on Linux a build without cgo (no gcc found, or CGO_ENABLED=0)
// fails naming the fix, instead of making a binary without GPU support; -tags nogpu asks for one.
func TestBuildWithoutCgoFailsLoudly(t *testing.T) {
	gobin, err := exec.LookPath("go")
	if err != nil {
		t.Fatalf("go not on PATH: %v", err)
	}
	build := func(tags ...string) (string, error) {
		args := append([]string{"build", "-o", os.DevNull}, tags...)
		cmd := exec.Command(gobin, append(args, ".")...)
		cmd.Env = append(os.Environ(), "CGO_ENABLED=0")
		out, err := cmd.CombinedOutput()
		return string(out), err
	}
	out, err := build()
	if err == nil || !strings.Contains(out, "spotguard_on_linux_needs_cgo_for_GPU_support__install_gcc_or_build_with_tags_nogpu") {
		t.Errorf("CGO_ENABLED=0 go build = %v\n%s\nwant a failure naming the fix", err, out)
	}
	if out, err := build("-tags", "nogpu"); err != nil {
		t.Errorf("CGO_ENABLED=0 go build -tags nogpu = %v\n%s\nwant success (GPU support off on purpose)", err, out)
	}
}
