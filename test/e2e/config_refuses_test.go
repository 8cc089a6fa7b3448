package e2e

import (
	"os"
	"path/filepath"
	"strings"
	"testing"
)

// TestConfigRefusesWhatRunRefuses: for each bad input, the real binary's `spotguard config` exits
// 1 naming the problem, and `spotguard run` on the same file refuses to start with the same words,
// instead of one passing what the other refuses.
func TestConfigRefusesWhatRunRefuses(t *testing.T) {
	dir := t.TempDir()
	ck := filepath.Join(dir, "ckpt")
	os.Mkdir(ck, 0o755)
	// Valid on its own: signal-only, trainer by match; every case breaks one thing.
	const ok = "trainer:\n  match: 'no-such-trainer-xyz'\n"
	for _, c := range []struct {
		name, yaml, want string
	}{
		{"bucket missing", ok + "checkpoint:\n  dir: " + ck + "\nstore:\n  url: 's3://'\n  job: j\n", "store.url"},
		{"poll interval of minutes", ok + "imds:\n  poll_interval: 10m\n", "imds.poll_interval"},
		{"spot poll interval too short", ok + "imds:\n  spot_poll_interval: 10ms\n", "imds.spot_poll_interval"},
		{"endpoint not a URL", ok + "imds:\n  endpoint: 'not a url'\n", "imds.endpoint"},
		{"section twice", ok + "imds:\n  poll_interval: 1s\nimds:\n  poll_interval: 2s\n", "section imds appears twice"},
		{"key twice", "trainer:\n  match: a\n  match: b\n", "trainer.match: set twice"},
		{"no trainer", "log:\n  level: info\n", "no way to find the trainer"},
	} {
		t.Run(c.name, func(t *testing.T) {
			cfg := filepath.Join(t.TempDir(), "spotguard.yaml")
			if err := os.WriteFile(cfg, []byte(c.yaml), 0o644); err != nil {
				t.Fatal(err)
			}
			code, _, stderr := runSpotguard(t, nil, "config", "--config", cfg)
			if code != 1 || !strings.Contains(stderr, c.want) {
				t.Fatalf("spotguard config: exit %d; want 1 naming %q:\n%s", code, c.want, stderr)
			}
			var msg string
			for line := range strings.SplitSeq(stderr, "\n") {
				if strings.Contains(line, c.want) {
					msg = strings.TrimSpace(strings.TrimPrefix(strings.TrimSpace(line), "-"))
					break
				}
			}
			code, _, runErr := runSpotguard(t, []string{"SPOTGUARD_HTTP_LISTEN=127.0.0.1:0"}, "run", "--config", cfg)
			if code != 1 || !strings.Contains(runErr, msg) {
				t.Errorf("spotguard run: exit %d; want 1 with config's words %q:\n%s", code, msg, runErr)
			}
		})
	}
}
