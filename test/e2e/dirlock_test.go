package e2e

import (
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"
)

// Two agents on one checkpoint.dir (the service and one started by hand with its own
// agent.runtime_dir, or one in a container beside one on the host) each committed every
// checkpoint, and both signalled the trainer: every save uploaded twice, silently. The second
// is refused at its start, naming the first's PID (exit 1). One whose checkpoint.dir appears after
// it started cannot watch it while the other does: /healthz 503 says why, and it takes over once
// the other stops.
func TestSecondAgentOnOneCheckpointDir(t *testing.T) {
	needPeers(t)
	sim := quietIMDS(t)
	ckdir, storeDir := filepath.Join(t.TempDir(), "ck"), t.TempDir()
	env := []string{noTrainer, "SPOTGUARD_CHECKPOINT_DIR=" + ckdir,
		"SPOTGUARD_STORE_URL=file://" + storeDir, "SPOTGUARD_STORE_JOB=e2e"}

	// checkpoint.dir made after both started: the first to see it watches it.
	first := startAgent(t, sim, env...)
	second := startAgent(t, sim, env...)
	if err := os.Mkdir(ckdir, 0o755); err != nil {
		t.Fatal(err)
	}
	var loser, winner *agentProc
	eventually(t, 30*time.Second, "one agent to watch checkpoint.dir and the other to say it cannot", func() bool {
		c1, h1 := first.healthz(t)
		c2, h2 := second.healthz(t)
		switch {
		case c1 == 200 && c2 == 503 && strings.Contains(strings.Join(h2.Reasons, " "), "watched by another spotguard agent"):
			winner, loser = first, second
		case c2 == 200 && c1 == 503 && strings.Contains(strings.Join(h1.Reasons, " "), "watched by another spotguard agent"):
			winner, loser = second, first
		}
		return winner != nil
	})
	if _, h := loser.healthz(t); !strings.Contains(h.Reasons[0], fmt.Sprintf("(PID %d)", winner.cmd.Process.Pid)) {
		t.Errorf("/healthz reasons %q; want the other agent's PID %d named", h.Reasons, winner.cmd.Process.Pid)
	}
	writeCheckpoint(t, ckdir, "step-1", map[string][]byte{"a.bin": randomBytes(t, 64<<10)}, "")
	eventually(t, 30*time.Second, "step-1 committed", func() bool { return len(manifestsIn(t, storeDir)) == 1 })

	// A third, started while the winner watches it, is refused.
	third := exec.Command(spotguardBin, "run", "--config", first.configPath)
	third.Env = append([]string{"PATH=" + os.Getenv("PATH"), "HOME=" + t.TempDir(), "AWS_EC2_METADATA_SERVICE_ENDPOINT=" + sim.endpoint(),
		"SPOTGUARD_HTTP_LISTEN=127.0.0.1:0", "SPOTGUARD_AGENT_RUNTIME_DIR=" + filepath.Join(t.TempDir(), "run"),
		"SPOTGUARD_METRICS_CLOUDWATCH=false"}, env...)
	out, err := third.CombinedOutput()
	var exit *exec.ExitError
	if !errors.As(err, &exit) || exit.ExitCode() != 1 || !strings.Contains(string(out), fmt.Sprintf("checkpoint.dir %s: watched by another spotguard agent (PID %d)", ckdir, winner.cmd.Process.Pid)) {
		t.Errorf("a third agent on the same checkpoint.dir: %v\n%s\nwant exit 1 naming checkpoint.dir and PID %d", err, out, winner.cmd.Process.Pid)
	}

	// The winner stops: the other takes the directory over and commits what comes next.
	winner.stop(t)
	eventually(t, 45*time.Second, "the other agent to watch checkpoint.dir", func() bool {
		code, _ := loser.healthz(t)
		return code == 200
	})
	writeCheckpoint(t, ckdir, "step-2", map[string][]byte{"a.bin": randomBytes(t, 64<<10)}, "")
	eventually(t, 30*time.Second, "step-2 committed", func() bool { return len(manifestsIn(t, storeDir)) == 2 })
	if got := manifestsIn(t, storeDir); len(got) != 2 {
		t.Errorf("manifests %v; want one commit of each checkpoint", got)
	}
}

// manifestsIn lists the manifests of job e2e in the file store at dir.
func manifestsIn(t testing.TB, dir string) []string {
	got, err := filepath.Glob(filepath.Join(dir, "e2e", "*", "*", "_spotguard", "manifest.json"))
	if err != nil {
		t.Fatal(err)
	}
	return got
}
