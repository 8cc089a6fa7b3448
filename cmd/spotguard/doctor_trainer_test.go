package main

import (
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
)

// doctor finds the trainer as the agent does, trainer.user and trainer.container included: a
// trainer of another user than trainer.user is not found, and the check says why.
func TestDoctorTrainerUser(t *testing.T) {
	r := newDoctorRig(t)
	pid := startSignalTrainer(t, true)
	os.WriteFile(filepath.Join(r.tmp, "trainer.pid"), []byte(strconv.Itoa(pid)), 0o644)
	_, out := r.run(t, "--trainer.user", strconv.Itoa(os.Getuid()))
	if want := "PASS  trainer           1 process(es) found, all catch SIGUSR1"; !strings.Contains(out, want) {
		t.Errorf("doctor with trainer.user = us: output lacks %q:\n%s", want, out)
	}
	_, out = r.run(t, "--trainer.user", "4242")
	for _, want := range []string{"WARN  trainer           no trainer process found now: pidfile", "found only processes of other users than trainer.user (uid 4242)", strconv.Itoa(pid), "trainer.user"} {
		if !strings.Contains(out, want) {
			t.Errorf("doctor with trainer.user = 4242: output lacks %q:\n%s", want, out)
		}
	}
	// A container alone is a way to find the trainer; one that does not run is a WARN.
	_, out = r.run(t, "--trainer.pidfile", "", "--trainer.container", "3f4a9c2b7d1e")
	if want := "WARN  trainer           no trainer process found now: no process runs in a container whose ID starts with 3f4a9c2b7d1e"; !strings.Contains(out, want) {
		t.Errorf("doctor with trainer.container: output lacks %q:\n%s", want, out)
	}
}
