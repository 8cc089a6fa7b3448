package e2e

import (
	"strings"
	"testing"
)

// The built binary: --version prints what `spotguard version` prints; a usage error is two lines
// on stderr with exit 2; drill refuses the key flags for what it has of its own, naming its
// flag, before anything runs (no temp dir kept, no report).
func TestCLIVersionAndUsageErrors(t *testing.T) {
	_, version, _ := runSpotguard(t, nil, "version")
	code, stdout, stderr := runSpotguard(t, nil, "--version")
	if code != 0 || stdout != version || !strings.HasPrefix(stdout, "spotguard ") || stderr != "" {
		t.Errorf("spotguard --version = %d, %q, %q; want 0 and %q", code, stdout, stderr, version)
	}
	for _, tt := range []struct {
		args []string
		want string
	}{
		{[]string{"restore", "--bogus"}, "spotguard restore: flag provided but not defined: --bogus\nrun 'spotguard restore -h' for its flags\n"},
		{[]string{"drill", "--size", "8MiB", "--store.url", "file:///tmp/x"}, "spotguard drill: --store.url is not used by drill: its store is --store URL\nrun 'spotguard drill -h' for its flags\n"},
		{[]string{"drill", "--size", "8MiB", "--checkpoint.dir", t.TempDir()}, "spotguard drill: --checkpoint.dir is not used by drill: its trainer writes into --checkpoint-dir DIR\nrun 'spotguard drill -h' for its flags\n"},
		{[]string{"restore", "--mount-wait", "5s", "--to", t.TempDir()}, "spotguard restore: --mount-wait needs --no-create (without it a missing DIR is created at once)\nrun 'spotguard restore -h' for its flags\n"},
	} {
		code, stdout, stderr := runSpotguard(t, nil, tt.args...)
		if code != 2 || stdout != "" || stderr != tt.want {
			t.Errorf("Got(%q) = %d, %q, %q; want 2 and %q", tt.args, code, stdout, stderr, tt.want)
		}
	}
}
