//go:build linux && cgo

package nvml

import (
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"

	"github.com/rs/zerolog"
)

// A libnvidia-ml.so.1 that lacks NVML's functions (not NVIDIA's library, a broken install) ended
// the process at Open: "symbol lookup error", exit 127, for the agent, doctor and gpu alike (found
// from outside). Open now looks the functions up first, and says which one is missing: GPU
// sampling is off, and the process goes on. Each library is tried in a child process, as the
// loader reads LD_LIBRARY_PATH once, at start.
func TestOpenOfALibraryWithoutNVMLFunctions(t *testing.T) {
	if os.Getenv("SPOTGUARD_NVML_OPEN_CHILD") == "1" {
		_, err := Open(zerolog.Nop())
		fmt.Printf("unavailable=%v err=%v\n", errors.Is(err, ErrUnavailable), err)
		return
	}
	gcc, err := exec.LookPath("gcc")
	if err != nil {
		t.Fatalf("gcc, which cgo needs, is not on PATH: %v", err)
	}
	for _, tc := range []struct{ name, src, missing string }{
		{"none", "int not_nvml(void) { return 0; }\n", "nvmlInit_v2"},
		{"init only", "int nvmlInit_v2(void) { return 0; }\n", "nvmlShutdown"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			dir := t.TempDir()
			src := filepath.Join(dir, "fake.c")
			if err := os.WriteFile(src, []byte(tc.src), 0o644); err != nil {
				t.Fatal(err)
			}
			if out, err := exec.Command(gcc, "-shared", "-fPIC", "-o", filepath.Join(dir, libraryName), src).CombinedOutput(); err != nil {
				t.Fatalf("build the fake library: %v\n%s", err, out)
			}
			cmd := exec.Command(os.Args[0], "-test.run=^TestOpenOfALibraryWithoutNVMLFunctions$", "-test.count=1")
			cmd.Env = append(os.Environ(), "SPOTGUARD_NVML_OPEN_CHILD=1", "LD_LIBRARY_PATH="+dir)
			out, err := cmd.CombinedOutput()
			if err != nil {
				t.Fatalf("the process died at Open: %v\n%s", err, out)
			}
			want := "unavailable=true err=nvml: GPU sampling is off: init NVML: libnvidia-ml.so.1 lacks the NVML function " + tc.missing
			if !strings.Contains(string(out), want) {
				t.Errorf("Open with a library that lacks %s:\n%s\nwant %q", tc.missing, out, want)
			}
		})
	}
}
