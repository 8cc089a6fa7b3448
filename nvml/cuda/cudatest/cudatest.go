// Package cudatest builds the fake CUDA driver (nvml/cuda/testdata/fakecuda.c) that tests load in
// place of libcuda.so.1: host memory for device memory, and per-device behaviour from FAKE_CUDA_*
// environment variables read at call time (see the C source).
package cudatest

import (
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"testing"
)

// FakeDriver builds the fake driver, with the given -D defines, into a temporary directory of tb
// and returns the shared library's path. Without a C compiler ($CC, else gcc) the test is
// skipped, saying so, except under CI (CI set), where .ci/run installs gcc and its absence is a
// failure.
func FakeDriver(tb testing.TB, defines ...string) string {
	tb.Helper()
	cc := os.Getenv("CC")
	if cc == "" {
		cc = "gcc"
	}
	if _, err := exec.LookPath(cc); err != nil {
		if os.Getenv("CI") != "" {
			tb.Fatalf("no C compiler (%s) to build the fake CUDA driver: %v (.ci/run installs gcc)", cc, err)
		}
		tb.Skipf("no C compiler (%s) to build the fake CUDA driver: %v", cc, err)
	}
	_, self, _, ok := runtime.Caller(0)
	if !ok {
		tb.Fatal("cudatest: cannot find its own source")
	}
	src := filepath.Join(filepath.Dir(self), "..", "testdata", "fakecuda.c")
	lib := filepath.Join(tb.TempDir(), "libfakecuda.so")
	args := []string{"-shared", "-fPIC", "-pthread", "-O1", "-Wall", "-Werror", "-o", lib}
	for _, d := range defines {
		args = append(args, "-D"+d)
	}
	if out, err := exec.Command(cc, append(args, src)...).CombinedOutput(); err != nil {
		tb.Fatalf("build the fake CUDA driver: %v\n%s", err, out)
	}
	return lib
}
