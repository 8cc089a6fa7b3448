package systemd

import (
	"debug/elf"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strconv"
	"strings"
	"testing"
)

// debLibcDepends reads the glibc version the .deb depends on from systemd/nfpm.yaml
// ("libc6 (>= 2.34)").
func debLibcDepends(t *testing.T) string {
	t.Helper()
	m := regexp.MustCompile(`(?m)^\s*-\s*libc6 \(>= ([0-9.]+)\)\s*$`).FindStringSubmatch(readFile(t, filepath.Join(repoRoot(t), "systemd", "nfpm.yaml")))
	if m == nil {
		t.Fatal("systemd/nfpm.yaml does not depend on libc6 (>= VERSION)")
	}
	return m[1]
}

// compareVersions compares dotted version numbers element by element, as numbers ("2.4" <
// "2.34"): negative, zero or positive as a is older than, the same as or newer than b.
func compareVersions(a, b string) int {
	as, bs := strings.Split(a, "."), strings.Split(b, ".")
	for i := range max(len(as), len(bs)) {
		var x, y int
		if i < len(as) {
			x, _ = strconv.Atoi(as[i])
		}
		if i < len(bs) {
			y, _ = strconv.Atoi(bs[i])
		}
		if x != y {
			return x - y
		}
	}
	return 0
}

// TestDebDependsCoversGlibc builds the agent as `make deb` does (cgo on, for NVML) and checks that
// the .deb's Depends: libc6 (>= V) covers every glibc symbol version the binary needs, so that
// apt refuses a system whose glibc is too old (Ubuntu 20.04: 2.31) instead of installing a binary
// that fails with "GLIBC_2.34 not found". It needs a C compiler (cgo); CI has gcc.
func TestDebDependsCoversGlibc(t *testing.T) {
	out, err := exec.Command("go", "env", "CGO_ENABLED").Output()
	if err != nil {
		t.Fatal(err)
	}
	if strings.TrimSpace(string(out)) != "1" {
		if os.Getenv("CI") != "" {
			t.Fatal("cgo is off under CI (no gcc?): the .deb's binary would have no GPU support")
		}
		t.Skip("cgo is off here (no C compiler): the binary links no glibc")
	}
	bin := buildSpotguard(t)
	f, err := elf.Open(bin)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	needs, err := f.DynamicVersionNeeds()
	if err != nil {
		t.Fatalf("%s: no version needs (built without cgo?): %v", bin, err)
	}
	newest := ""
	for _, n := range needs {
		for _, d := range n.Needs {
			v, ok := strings.CutPrefix(d.Dep, "GLIBC_")
			if !ok || !regexp.MustCompile(`^[0-9.]+$`).MatchString(v) {
				continue
			}
			t.Logf("%s: %s", n.Name, d.Dep)
			if newest == "" || compareVersions(v, newest) > 0 {
				newest = v
			}
		}
	}
	if newest == "" {
		t.Fatalf("%s needs no GLIBC_ version: not the cgo build the .deb ships", bin)
	}
	depends := debLibcDepends(t)
	t.Logf("the binary needs glibc %s; the .deb depends on libc6 (>= %s)", newest, depends)
	if compareVersions(newest, depends) > 0 {
		t.Errorf("the binary needs GLIBC_%s, newer than the .deb's libc6 (>= %s) in systemd/nfpm.yaml", newest, depends)
	}
}

func TestCompareVersions(t *testing.T) {
	for _, c := range []struct {
		a, b string
		want int
	}{{"2.34", "2.34", 0}, {"2.4", "2.34", -1}, {"2.35", "2.34", 1}, {"2.2.5", "2.3", -1}, {"2.34.1", "2.34", 1}} {
		if got := compareVersions(c.a, c.b); (got > 0) != (c.want > 0) || (got < 0) != (c.want < 0) {
			t.Errorf("compareVersions(%q, %q) = %d; want the sign of %d", c.a, c.b, got, c.want)
		}
	}
}
