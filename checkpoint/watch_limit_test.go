//go:build linux

package checkpoint

import (
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"github.com/fsnotify/fsnotify"
	"github.com/rs/zerolog"
)

// These tests run out of inotify watches without using them up: the Watcher's addWatch fails
// with ENOSPC, as inotify_add_watch does past fs.inotify.max_user_watches, for the directories
// the test says; everything else is real directories and real fsnotify.

// watchLimitAdd returns an addWatch that fails with ENOSPC for every directory for which full
// says so, and adds a real watch otherwise.
func watchLimitAdd(full func(dir string) bool) func(*fsnotify.Watcher, string) error {
	return func(fw *fsnotify.Watcher, dir string) error {
		if full(dir) {
			return syscall.ENOSPC
		}
		return fw.Add(dir)
	}
}

// watchProblems records what a Watcher passes to WatchConfig.Unwatched.
type watchProblems struct {
	mu   sync.Mutex
	said []string
}

func (p *watchProblems) unwatched(problem string) {
	p.mu.Lock()
	defer p.mu.Unlock()
	p.said = append(p.said, problem)
}

// last returns the last problem said, and whether any was.
func (p *watchProblems) last() (string, bool) {
	p.mu.Lock()
	defer p.mu.Unlock()
	if len(p.said) == 0 {
		return "", false
	}
	return p.said[len(p.said)-1], true
}

// watchUnwatched returns the directories r lists as unwatched, sorted.
func watchUnwatched(r *watchRun) []string {
	var dirs []string
	for e := r.unwatched.Front(); e != nil; e = e.Next() {
		dirs = append(dirs, e.Value.(*watchNode).rel)
	}
	slices.Sort(dirs)
	return dirs
}

// watchCheckLimitSaid checks that the inotify watch limit was logged exactly once, naming the
// sysctl and how to raise it, and that no directory was logged on its own.
func watchCheckLimitSaid(t *testing.T, logs *scanLogs) {
	t.Helper()
	lines := logs.lines(t, "error", watchMsgLimit)
	if len(lines) != 1 {
		t.Errorf("error lines %q = %d; want 1\nlog:\n%s", watchMsgLimit, len(lines), logs)
	}
	for _, m := range lines {
		if fix, _ := m["fix"].(string); !strings.Contains(fix, "sysctl -w fs.inotify.max_user_watches=") {
			t.Errorf("limit line has fix %q; want the sysctl that raises it", fix)
		}
	}
	if n := len(logs.lines(t, "error", "cannot watch directory; it is polled instead")); n != 0 {
		t.Errorf("%d directories logged one by one; want them said once, as the limit\nlog:\n%s", n, logs)
	}
}

// Directories whose watch cannot be added (the inotify watch limit) are polled: a file gone, a
// new file and a new directory are seen as their events would have told them, a marker completes
// its checkpoint at the next poll and its removal takes that back, the limit is said once, and
// once watches can be added again every directory gets its watch and that is said too.
func TestWatchPollsWhatItCannotWatch(t *testing.T) {
	dir := t.TempDir()
	scanWrite(t, filepath.Join(dir, "step-1", "a.bin"), "a")
	scanWrite(t, filepath.Join(dir, "step-1", "sub", "b.bin"), "bb")
	scanWrite(t, filepath.Join(dir, "step-2", "c.bin"), "c")
	watchAge(t, dir, time.Hour)
	logs := &scanLogs{}
	problems := &watchProblems{}
	// A debounce long enough that a file just written is one, however slow the machine.
	w, err := NewWatcher(WatchConfig{Dir: dir, Pattern: "*.pt", Debounce: time.Minute, Logger: zerolog.New(logs), Unwatched: problems.unwatched})
	if err != nil {
		t.Fatal(err)
	}
	full := true
	w.addWatch = watchLimitAdd(func(p string) bool {
		return full && (p == filepath.Join(dir, "step-1") || strings.HasPrefix(p, filepath.Join(dir, "step-1")+"/"))
	})
	r := testWatchRun(t, w, dir)
	step := func(what, want string, unwatched ...string) {
		t.Helper()
		if got := watchFormat(r.queue); got != want {
			t.Errorf("%s: events %s; want %s", what, got, want)
		}
		if got := watchUnwatched(r); !slices.Equal(got, unwatched) {
			t.Errorf("%s: unwatched directories %v; want %v", what, got, unwatched)
		}
		if err := r.checkNodes(); err != nil {
			t.Errorf("%s: %v", what, err)
		}
		r.queue = nil
	}
	old := time.Now().Add(-time.Hour)
	writeOld := func(rel, data string) {
		t.Helper()
		p := filepath.Join(dir, filepath.FromSlash(rel))
		scanWrite(t, p, data)
		if err := os.Chtimes(p, old, old); err != nil {
			t.Fatal(err)
		}
	}

	if err := r.rescan(); err != nil {
		t.Fatalf("rescan() error: %v", err)
	}
	r.sayUnwatched()
	step("first scan", "[FileReady step-1 a.bin 1, FileReady step-1 sub/b.bin 2, FileReady step-2 c.bin 1]",
		"step-1", "step-1/sub")
	if got, want := watchWatched(r), []string{"step-2"}; !slices.Equal(got, want) {
		t.Errorf("watched directories = %v; want %v", got, want)
	}
	watchCheckLimitSaid(t, logs)
	if p, _ := problems.last(); !strings.Contains(p, "2 directories") || !strings.Contains(p, "fs.inotify.max_user_watches") {
		t.Errorf("Unwatched(%q); want the 2 directories and the inotify watch limit", p)
	}

	// What no event tells of: a file gone, a new file, a new directory with a file, and a file
	// just written (which may still be being written: a later poll looks again).
	if err := os.Remove(filepath.Join(dir, "step-1", "a.bin")); err != nil {
		t.Fatal(err)
	}
	writeOld("step-1/sub/d.bin", "dddd")
	writeOld("step-1/new/e.bin", "eeeee")
	scanWrite(t, filepath.Join(dir, "step-1", "sub", "fresh.bin"), "ffffff")
	r.poll()
	r.sayUnwatched()
	step("a poll", "[FileGone step-1 a.bin 0]", "step-1", "step-1/new", "step-1/sub")
	for key, want := range map[string]bool{"step-1/sub/d.bin": true, "step-1/new/e.bin": true, "step-1/sub/fresh.bin": false} {
		if got := r.deb.Pending(key); got != want {
			t.Errorf("after a poll, %s waits for its debounce: %v; want %v", key, got, want)
		}
	}

	// The marker: Complete at the next poll, with every file as it is.
	scanWrite(t, filepath.Join(dir, "step-1", "_COMPLETE"), "")
	r.poll()
	step("the marker", "[FileReady step-1 new/e.bin 5, FileReady step-1 sub/d.bin 4, FileReady step-1 sub/fresh.bin 6, Complete step-1 _COMPLETE 0]",
		"step-1", "step-1/new", "step-1/sub")
	if err := os.Remove(filepath.Join(dir, "step-1", "_COMPLETE")); err != nil {
		t.Fatal(err)
	}
	r.poll()
	step("the marker removed", "[FileGone step-1 _COMPLETE 0]", "step-1", "step-1/new", "step-1/sub")
	if err := os.RemoveAll(filepath.Join(dir, "step-1", "new")); err != nil {
		t.Fatal(err)
	}
	r.poll()
	step("a directory removed", "[FileGone step-1 new/e.bin 0]", "step-1", "step-1/sub")
	watchCheckLimitSaid(t, logs)

	// The limit raised: every directory has its watch after the next poll, and that is said.
	full = false
	r.poll()
	r.sayUnwatched()
	step("the limit raised", "[]")
	if got, want := watchWatched(r), []string{"step-1", "step-1/sub", "step-2"}; !slices.Equal(got, want) {
		t.Errorf("watched directories = %v; want %v", got, want)
	}
	if p, ok := problems.last(); !ok || p != "" {
		t.Errorf("last Unwatched(%q); want \"\" once every directory is watched", p)
	}
	if n := len(logs.lines(t, "info", watchMsgAllWatched)); n != 1 {
		t.Errorf("info lines %q = %d; want 1\nlog:\n%s", watchMsgAllWatched, n, logs)
	}
}

// The scenario found from outside: past the inotify watch limit, a new checkpoint whose own
// directory cannot be watched is still seen and completes (it was never committed before), the
// limit is logged once rather than once per directory, and Unwatched says it (the agent's
// /healthz warning) until the watches can be added again.
func TestWatchPastTheInotifyWatchLimit(t *testing.T) {
	dir := t.TempDir()
	for i := range 30 {
		scanWrite(t, filepath.Join(dir, "step-1", fmt.Sprintf("s%02d", i), "x.bin"), "x")
	}
	scanWrite(t, filepath.Join(dir, "step-1", "_COMPLETE"), "")
	watchAge(t, dir, time.Hour)
	var full atomic.Bool
	full.Store(true)
	problems := &watchProblems{}
	h, _ := watchStartWith(t, dir, WatchConfig{Unwatched: problems.unwatched}, func(w *Watcher) {
		w.pollEvery = 20 * time.Millisecond
		w.addWatch = watchLimitAdd(func(p string) bool { return full.Load() && p != dir })
	})
	watchCheckLimitSaid(t, h.logs)
	if p, _ := problems.last(); !strings.Contains(p, "31 directories") || !strings.Contains(p, "fs.inotify.max_user_watches") {
		t.Errorf("Unwatched(%q); want the 31 directories and the inotify watch limit", p)
	}

	ck := filepath.Join(dir, "step-after")
	if err := os.Mkdir(ck, 0o755); err != nil {
		t.Fatal(err)
	}
	scanWrite(t, filepath.Join(ck, "a.bin"), "aaa")
	scanWrite(t, filepath.Join(ck, "sub", "b.bin"), "bbbb")
	scanWrite(t, filepath.Join(ck, "_COMPLETE"), "")
	evs := h.untilComplete("step-after")
	evs = slices.DeleteFunc(evs, func(ev WatchEvent) bool { return ev.Checkpoint != "step-after" })
	watchCheckReady(t, dir, "step-after", "_COMPLETE", evs, "a.bin", "sub/b.bin")

	if err := os.Remove(filepath.Join(dir, "step-1", "_COMPLETE")); err != nil {
		t.Fatal(err)
	}
	h.until("FileGone of step-1's marker", func(ev WatchEvent) bool {
		return ev.Kind == FileGone && ev.Checkpoint == "step-1" && ev.Path == "_COMPLETE"
	})
	watchCheckLimitSaid(t, h.logs)

	full.Store(false)
	deadline := time.Now().Add(watchWait)
	for p, _ := problems.last(); p != ""; p, _ = problems.last() {
		if time.Now().After(deadline) {
			t.Fatalf("Unwatched still says %q %v after watches could be added again\nlog:\n%s", p, watchWait, h.logs)
		}
		h.barrier()
	}
	// Watched again: a file written now is seen by its events.
	scanWrite(t, filepath.Join(ck, "sub", "c.bin"), "ccccc")
	h.until("FileReady of a file in a directory watched again", func(ev WatchEvent) bool {
		return ev.Kind == FileReady && ev.Checkpoint == "step-after" && ev.Path == "sub/c.bin"
	})
	if n := len(h.logs.lines(t, "info", watchMsgAllWatched)); n != 1 {
		t.Errorf("info lines %q = %d; want 1\nlog:\n%s", watchMsgAllWatched, n, h.logs)
	}
}

// Even checkpoint.dir itself past the inotify watch limit: Run does not fail, and its top level
// is polled: a new checkpoint directory and a single-file checkpoint complete, and one removed is
// Removed.
func TestWatchDirItselfPastTheInotifyWatchLimit(t *testing.T) {
	dir := t.TempDir()
	problems := &watchProblems{}
	h, _ := watchStartWith(t, dir, WatchConfig{Unwatched: problems.unwatched}, func(w *Watcher) {
		w.pollEvery = 20 * time.Millisecond
		w.addWatch = watchLimitAdd(func(string) bool { return true })
	})
	scanWrite(t, filepath.Join(dir, "step-1", "a.bin"), "aa")
	scanWrite(t, filepath.Join(dir, "step-1", "_COMPLETE"), "")
	evs := h.untilComplete("step-1")
	evs = slices.DeleteFunc(evs, func(ev WatchEvent) bool { return ev.Checkpoint != "step-1" })
	watchCheckReady(t, dir, "step-1", "_COMPLETE", evs, "a.bin")
	scanWrite(t, filepath.Join(dir, "model.pt"), "model")
	h.untilComplete("model.pt")
	if err := os.RemoveAll(filepath.Join(dir, "step-1")); err != nil {
		t.Fatal(err)
	}
	h.until("Removed step-1", func(ev WatchEvent) bool { return ev.Kind == Removed && ev.Checkpoint == "step-1" })
	watchCheckLimitSaid(t, h.logs)
	if p, _ := problems.last(); !strings.Contains(p, "fs.inotify.max_user_watches") {
		t.Errorf("Unwatched(%q); want the inotify watch limit", p)
	}
}

// No inotify instance to be had (fs.inotify.max_user_instances, per user and shared by every
// container of that user): Run failed, and was tried again for ever, so nothing was ever
// uploaded (found from outside, a notice's checkpoint included). Everything is polled now, as
// past the watch limit: checkpoints complete, and the problem is said.
func TestWatchWithoutAnInotifyInstance(t *testing.T) {
	dir := t.TempDir()
	os.MkdirAll(filepath.Join(dir, "step-0", "sub"), 0o755) // there at start: polled too
	problems := &watchProblems{}
	h, _ := watchStartWith(t, dir, WatchConfig{Unwatched: problems.unwatched}, func(w *Watcher) {
		w.pollEvery = 20 * time.Millisecond
		w.newInotify = func() (*fsnotify.Watcher, error) { return nil, syscall.EMFILE }
	})
	scanWrite(t, filepath.Join(dir, "step-0", "sub", "a.bin"), "aa")
	scanWrite(t, filepath.Join(dir, "step-0", "_COMPLETE"), "")
	h.untilComplete("step-0")
	scanWrite(t, filepath.Join(dir, "step-1", "a.bin"), "aa")
	scanWrite(t, filepath.Join(dir, "step-1", "_COMPLETE"), "")
	evs := h.untilComplete("step-1")
	evs = slices.DeleteFunc(evs, func(ev WatchEvent) bool { return ev.Checkpoint != "step-1" })
	watchCheckReady(t, dir, "step-1", "_COMPLETE", evs, "a.bin")
	if p, _ := problems.last(); !strings.Contains(p, "fs.inotify.max_user_instances") {
		t.Errorf("Unwatched(%q); want the inotify instance limit", p)
	}
	if n := len(h.logs.lines(t, "error", watchMsgNoInstance)); n != 1 {
		t.Errorf("error lines saying there is no inotify instance: %d; want 1\nlog:\n%s", n, h.logs)
	}
}

// inUserNamespaceEnv, set, runs TestWatchPastARealLimitInAUserNamespace's inside: the test
// binary in a user namespace of its own.
const inUserNamespaceEnv = "SPOTGUARD_TEST_IN_USER_NAMESPACE"

// The real limit, not ENOSPC made up: in a user namespace of its own (a rootless container) whose
// user.max_inotify_watches is lower than fs.inotify.max_user_watches, real inotify runs out, the
// directories past it are polled, and the line gives both limits (it gave only the host's, which
// was not the one reached).
func TestWatchPastARealLimitInAUserNamespace(t *testing.T) {
	if os.Getenv(inUserNamespaceEnv) == "" {
		if out, err := exec.Command("unshare", "--user", "--map-root-user", "true").CombinedOutput(); err != nil {
			t.Skipf("no user namespace can be made here (unshare: %v: %s)", err, out)
		}
		cmd := exec.Command("unshare", "--user", "--map-root-user", os.Args[0], "-test.run=^TestWatchPastARealLimitInAUserNamespace$", "-test.v", "-test.count=1")
		cmd.Env = append(os.Environ(), inUserNamespaceEnv+"=1")
		out, err := cmd.CombinedOutput()
		if err != nil || !strings.Contains(string(out), "--- PASS: TestWatchPastARealLimitInAUserNamespace") {
			t.Fatalf("in a user namespace: %v\n%s", err, out)
		}
		return
	}
	if err := os.WriteFile("/proc/sys/user/max_inotify_watches", []byte("4\n"), 0); err != nil {
		t.Fatal(err)
	}
	dir := t.TempDir()
	for i := range 8 {
		scanWrite(t, filepath.Join(dir, "step-1", fmt.Sprintf("s%d", i), "x.bin"), "x")
	}
	watchAge(t, dir, time.Hour)
	problems := &watchProblems{}
	h, _ := watchStartWith(t, dir, WatchConfig{Unwatched: problems.unwatched}, func(w *Watcher) { w.pollEvery = 20 * time.Millisecond })
	watchCheckLimitSaid(t, h.logs)
	for _, m := range h.logs.lines(t, "error", watchMsgLimit) {
		if ns, _ := m["user_namespace_max_inotify_watches"].(string); ns != "4" || m["max_user_watches"] == nil {
			t.Errorf("limit line %v; want the host's limit and the namespace's, 4", m)
		}
	}
	if p, _ := problems.last(); !strings.Contains(p, "directories of checkpoint.dir cannot be watched") {
		t.Errorf("Unwatched(%q); want the directories past the limit", p)
	}
	// What is past the limit is still seen: a checkpoint completed there.
	scanWrite(t, filepath.Join(dir, "step-1", "s7", "y.bin"), "yy")
	scanWrite(t, filepath.Join(dir, "step-1", "_COMPLETE"), "")
	h.untilComplete("step-1")
}
