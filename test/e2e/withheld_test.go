package e2e

import (
	"maps"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"
)

// A trainer running as root (a container's default) writes into a checkpoint.dir another user
// owns, and one of its files is 0600, as Python's tempfile.mkstemp makes them: the agent never
// uploads what the owner of checkpoint.dir could not read, and so it must not commit that
// checkpoint either, which restore would then present as complete without the file. The
// checkpoint is withheld: an error naming the file, /healthz 503, the counter; the commit before
// stays the newest. Once the file is readable, it is committed whole without the marker being
// written again. (Found from outside: step-2 was committed without optimizer.pt, and `spotguard
// restore` said every checksum verified.)
func TestFileTheOwnerCannotReadWithholdsTheCheckpoint(t *testing.T) {
	needPeers(t)
	if os.Geteuid() != 0 {
		if os.Getenv("CI") != "" {
			t.Fatal("this test needs root, to write files checkpoint.dir's owner cannot read (CI runs as root)")
		}
		t.Skip("needs root, to write files checkpoint.dir's owner cannot read")
	}
	ts := newS3TestStore(startS3(t), "withheld")
	const job = "withheld"
	sim := quietIMDS(t)
	dir := t.TempDir()
	if err := os.Chown(dir, 65534, 65534); err != nil { // the trainer's user owns checkpoint.dir
		t.Fatal(err)
	}
	ap := startStoreAgent(t, sim, dir, ts, job, noTrainer)

	write := func(name string, files map[string]os.FileMode) {
		t.Helper()
		ck := filepath.Join(dir, name)
		if err := os.Mkdir(ck, 0o755); err != nil {
			t.Fatal(err)
		}
		for _, f := range slices.Sorted(maps.Keys(files)) {
			writeSynced(t, filepath.Join(ck, f), randomBytes(t, 1<<20))
			if err := os.Chmod(filepath.Join(ck, f), files[f]); err != nil {
				t.Fatal(err)
			}
		}
		syncDir(t, ck)
		writeSynced(t, filepath.Join(ck, "_COMPLETE"), nil)
	}
	write("step-1", map[string]os.FileMode{"model.pt": 0o644, "optimizer.pt": 0o644})
	waitCommitted(t, ap, ts, job, "step-1", 15*time.Second)

	write("step-2", map[string]os.FileMode{"model.pt": 0o644, "optimizer.pt": 0o600})
	var reasons []string
	eventually(t, 15*time.Second, "/healthz to be 503 naming step-2/optimizer.pt", func() bool {
		code, h := ap.healthz(t)
		reasons = h.Reasons
		return code == 503 && slices.ContainsFunc(h.Reasons, func(r string) bool {
			return strings.Contains(r, "checkpoint step-2") && strings.Contains(r, "step-2/optimizer.pt")
		})
	})
	t.Logf("/healthz reasons: %q", reasons)
	if n := metricValue(t, ap.metrics(t), "spotguard_checkpoints_withheld_total"); n < 1 {
		t.Errorf("spotguard_checkpoints_withheld_total = %v; want at least 1", n)
	}
	if lines := ap.logLines(t, "marker is there but a file of the checkpoint cannot be stored; not complete, and never committed without it"); len(lines) == 0 ||
		lines[0]["level"] != "error" || !strings.Contains(lines[0]["error"].(string), "optimizer.pt") {
		t.Errorf("no error log line names step-2/optimizer.pt: %v", lines)
	}
	for _, c := range ts.list(t, job) {
		if c.Checkpoint == "step-2" {
			t.Fatalf("step-2 was committed without optimizer.pt: %+v", c)
		}
	}
	// LATEST, and so restore, stay on step-1.
	if out := ts.restore(t, job, t.TempDir()); !strings.Contains(out, "step-1") {
		t.Errorf("restore while step-2 is withheld: %s; want step-1", out)
	}

	// Readable now: committed whole, healthy again, and restored byte for byte.
	if err := os.Chmod(filepath.Join(dir, "step-2", "optimizer.pt"), 0o644); err != nil {
		t.Fatal(err)
	}
	waitCommitted(t, ap, ts, job, "step-2", 15*time.Second)
	for _, c := range ts.list(t, job) {
		if got, want := c.paths(), []string{"_COMPLETE", "model.pt", "optimizer.pt"}; c.Checkpoint == "step-2" && !slices.Equal(got, want) {
			t.Errorf("step-2 committed with %q; want %q", got, want)
		}
	}
	eventually(t, 15*time.Second, "/healthz to be 200 again", func() bool {
		code, _ := ap.healthz(t)
		return code == 200
	})
	to := t.TempDir()
	ts.restore(t, job, to)
	sameTree(t, filepath.Join(dir, "step-2"), filepath.Join(to, "step-2"))
}
