//go:build linux

package checkpoint

import (
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"

	"github.com/rs/zerolog"
)

// skipNames returns the names of the checkpoints in list and the paths of their files, as
// "name" and "name/path", for comparisons.
func skipNames(list []LocalCheckpoint) []string {
	var got []string
	for _, c := range list {
		got = append(got, fmt.Sprintf("%s complete=%v", c.Name, c.Complete))
		for _, f := range c.Files {
			got = append(got, c.Name+"/"+f.Path)
		}
	}
	return got
}

// skipOwnFiles writes, below dir, spotguard's own files (a restore's staging directory with a
// complete checkpoint in it, a file store temporary file that matches the pattern, and both
// inside the checkpoint ckpt) and the checkpoint ckpt with one file a.bin, complete.
func skipOwnFiles(t *testing.T, dir, ckpt, suffix string) {
	t.Helper()
	staging := filepath.Join(dir, restoreStagingPrefix+suffix)
	scanWrite(t, filepath.Join(staging, "step-9", "a.bin"), "restored")
	scanWrite(t, filepath.Join(staging, "step-9", "_COMPLETE"), "")
	scanWrite(t, filepath.Join(staging, "b.bin"), "b")
	scanWrite(t, filepath.Join(staging, "_COMPLETE"), "")
	scanWrite(t, filepath.Join(dir, fileTempPrefix+suffix+".pt"), "temp")
	ck := filepath.Join(dir, ckpt)
	scanWrite(t, filepath.Join(ck, restoreStagingPrefix+suffix, "c.bin"), "c")
	scanWrite(t, filepath.Join(ck, "sub", scanOwnPrefix+"anything"), "own")
	scanWrite(t, filepath.Join(ck, "a.bin"), "a")
	scanWrite(t, filepath.Join(ck, "_COMPLETE"), "")
}

// TestSpotguardOwnFilesAreNeverSeen is invariant I4 at its source: nothing spotguard names
// ".spotguard-..." below the checkpoint directory is a checkpoint or a file of one.
func TestSpotguardOwnFilesAreNeverSeen(t *testing.T) {
	for _, prefix := range []string{restoreStagingPrefix, fileTempPrefix} {
		if !strings.HasPrefix(prefix, scanOwnPrefix) || !scanSkipName(prefix+"x") {
			t.Errorf("spotguard's own name %q is not skipped", prefix+"x")
		}
	}
	for _, p := range []string{".spotguard-x", "a/.spotguard-x", ".spotguard-x/a", "a/.b.tmp/c"} {
		if !scanSkipPath(p) {
			t.Errorf("scanSkipPath(%q) = false; want true", p)
		}
	}
	for _, p := range []string{"a", "a/b", "spotguard-x", "a/x.spotguard-", ".spotguard", "a/.tmp.x"} {
		if scanSkipPath(p) {
			t.Errorf("scanSkipPath(%q) = true; want false", p)
		}
	}

	t.Run("Scan", func(t *testing.T) {
		dir := t.TempDir()
		skipOwnFiles(t, dir, "step-1", "x")
		logs := &scanLogs{}
		list, err := Scan(dir, "", "*.pt", zerolog.New(logs))
		if err != nil {
			t.Fatal(err)
		}
		if got, want := skipNames(list), []string{"step-1 complete=true", "step-1/a.bin"}; !slices.Equal(got, want) {
			t.Errorf("Scan() = %v; want %v", got, want)
		}
		if logs.String() != "" {
			t.Errorf("log lines for spotguard's own files:\n%s", logs)
		}
	})
	t.Run("watcher", func(t *testing.T) {
		dir := t.TempDir()
		skipOwnFiles(t, dir, "step-1", "x")
		h, evs := watchStart(t, dir, WatchConfig{})
		watchCheckReady(t, dir, "step-1", "_COMPLETE", evs, "a.bin")
		// After the start, seen by events.
		skipOwnFiles(t, dir, "step-2", "y")
		evs = h.untilComplete("step-2")
		watchCheckReady(t, dir, "step-2", "_COMPLETE", evs, "a.bin")
		if rest := h.barrier(); len(rest) != 0 {
			t.Errorf("events for spotguard's own files: %s", watchFormat(rest))
		}
		// Removing them is nothing either.
		if err := os.RemoveAll(filepath.Join(dir, restoreStagingPrefix+"x")); err != nil {
			t.Fatal(err)
		}
		if err := os.RemoveAll(filepath.Join(dir, "step-2", restoreStagingPrefix+"y")); err != nil {
			t.Fatal(err)
		}
		if rest := h.barrier(); len(rest) != 0 {
			t.Errorf("events for removing spotguard's own files: %s", watchFormat(rest))
		}
		if n := len(h.logs.lines(t, "warn", scanMsgBadName)) + len(h.logs.lines(t, "warn", scanMsgSpecial)); n != 0 {
			t.Errorf("skip lines for spotguard's own files = %d; want 0\n%s", n, h.logs)
		}
	})
}
