package checkpoint

import (
	"fmt"
	"os"
	"path"
	"path/filepath"
	"slices"
	"testing"
	"time"

	"github.com/rs/zerolog"
)

// sentOrder lets the files of the checkpoints through one at a time until want are committed, and
// returns the checkpoint of each file in the order they were sent, and the order of the commits.
func sentOrder(t *testing.T, r *uploaderRig, s *gateStore, want int) (sent, committed []string) {
	t.Helper()
	timeout := time.After(30 * time.Second)
	for len(committed) < want {
		select {
		case key := <-s.puts:
			sent = append(sent, path.Base(path.Dir(path.Dir(key)))) // job/<checkpoint>/<commit>/<file>
			s.release <- struct{}{}
		case ev := <-r.events:
			if ev.Kind == CheckpointCommitted {
				committed = append(committed, ev.Checkpoint)
			}
		case <-timeout:
			t.Fatalf("after 30 s: files sent for %v, commits %v; want %d commits", sent, committed, want)
		}
	}
	return sent, committed
}

// firstPut returns the checkpoint of the first file s is asked to store, held there.
func firstPut(t *testing.T, s *gateStore) string {
	t.Helper()
	select {
	case key := <-s.puts:
		return path.Base(path.Dir(path.Dir(key))) // job/<checkpoint>/<commit>/<file>
	case <-time.After(20 * time.Second):
		t.Fatal("no upload began")
	}
	return ""
}

// In urgent mode, the checkpoint the trainer completed after its signal keeps its turn over newer
// ones once its upload has begun: before, the newest went first, always, and a trainer that saves
// faster than the link, signalled and saving on, had each save overtaken by the next, so that a
// notice's 25 s committed nothing, not even the checkpoint it asked for (found from outside:
// 4 MiB saved every second into a 1 MB/s store).
func TestUrgentNoticeCheckpointKeepsItsTurn(t *testing.T) {
	dir := t.TempDir()
	s := &gateStore{memStore: newMemStore(), puts: make(chan string), release: make(chan struct{})}
	r := startUploaderWith(t, dir, s, UploaderConfig{BackgroundFiles: 1, UrgentFiles: 1})
	r.up.SetNotices([]ActiveNotice{{Key: "spot/terminate", Deadline: time.Now().Add(2 * time.Minute), SignalledAt: time.Now()}})
	waitFileClockAfter(t, time.Now())
	writeCheckpoint(t, dir, "step-1", map[string][]byte{"a": randomBytes(t, 4<<10), "b": randomBytes(t, 4<<10)})
	sent := []string{firstPut(t, s)} // step-1's first file, held
	r.waitEvent(CheckpointComplete, "step-1")
	writeCheckpoint(t, dir, "step-2", map[string][]byte{"a": randomBytes(t, 4<<10), "b": randomBytes(t, 4<<10)})
	r.waitEvent(CheckpointComplete, "step-2")
	s.release <- struct{}{}
	more, committed := sentOrder(t, r, s, 2)
	sent = append(sent, more...)
	if i := slices.Index(sent, "step-2"); i < 0 || slices.Contains(sent[i:], "step-1") {
		t.Errorf("files sent for %v; want step-1's three, then step-2's", sent)
	}
	if !slices.Equal(committed, []string{"step-1", "step-2"}) {
		t.Errorf("commits %v; want step-1, then step-2", committed)
	}
}

// With more slots than the notice's checkpoint has files, the checkpoint that keeps its turn is
// sent alone: no newer one's files begin while its last ones are in flight. Before, the free
// slots took the newer ones' files, every save since the signal was in flight at once, sharing
// the link, and with a trainer rotating its saves none was committed during the notice (found
// from outside).
func TestUrgentNoticeCheckpointIsSentAlone(t *testing.T) {
	dir := t.TempDir()
	s := &gateStore{memStore: newMemStore(), puts: make(chan string), release: make(chan struct{})}
	r := startUploaderWith(t, dir, s, UploaderConfig{BackgroundFiles: 4, UrgentFiles: 4})
	r.up.SetNotices([]ActiveNotice{{Key: "spot/terminate", Deadline: time.Now().Add(2 * time.Minute), SignalledAt: time.Now()}})
	waitFileClockAfter(t, time.Now())
	writeCheckpoint(t, dir, "step-1", map[string][]byte{"a": randomBytes(t, 4<<10), "b": randomBytes(t, 4<<10)})
	r.waitEvent(CheckpointComplete, "step-1")
	for range 3 { // a, b and the marker: all in flight, held
		if got := firstPut(t, s); got != "step-1" {
			t.Fatalf("a file of %s sent first; want step-1's", got)
		}
	}
	writeCheckpoint(t, dir, "step-2", map[string][]byte{"a": randomBytes(t, 4<<10), "b": randomBytes(t, 4<<10)})
	r.waitEvent(CheckpointComplete, "step-2")
	if st := r.up.Status(t.Context()); st.InFlight != 3 {
		t.Errorf("files in flight with step-1's three held and step-2 complete: %d; want 3, step-1's alone", st.InFlight)
	}
	for range 3 {
		s.release <- struct{}{}
	}
	sent, committed := sentOrder(t, r, s, 2)
	if slices.Contains(sent, "step-1") {
		t.Errorf("files sent after step-1's three: %v; want step-2's alone", sent)
	}
	if !slices.Equal(committed, []string{"step-1", "step-2"}) {
		t.Errorf("commits %v; want step-1, then step-2", committed)
	}
}

// Outside a notice, a complete checkpoint goes before one still being written whose upload has
// begun: before, a checkpoint being written kept its turn while it had files waiting, and a
// complete one waited behind it (found from outside: a directory of 20 000 files being written
// delayed a complete checkpoint's commit from 1 s to 30 s).
func TestCompleteCheckpointGoesBeforeOneBeingWritten(t *testing.T) {
	dir := t.TempDir()
	s := &gateStore{memStore: newMemStore(), puts: make(chan string), release: make(chan struct{})}
	r := startUploaderWith(t, dir, s, UploaderConfig{BackgroundFiles: 1, UrgentFiles: 1})
	// step-1 is being written: two files, no marker.
	for _, f := range []string{"a", "b"} {
		p := dir + "/step-1/" + f
		if err := os.MkdirAll(path.Dir(p), 0o755); err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(p, randomBytes(t, 4<<10), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	sent := []string{firstPut(t, s)} // step-1's first file, held
	waitFileClockAfter(t, time.Now())
	writeCheckpoint(t, dir, "step-0", map[string][]byte{"a": randomBytes(t, 4<<10), "b": randomBytes(t, 4<<10)})
	r.waitEvent(CheckpointComplete, "step-0")
	s.release <- struct{}{}
	more, committed := sentOrder(t, r, s, 1)
	sent = append(sent, more...)
	if len(sent) < 4 || !slices.Equal(sent[1:4], []string{"step-0", "step-0", "step-0"}) {
		t.Errorf("files sent for %v; want step-1's first, then step-0's three", sent)
	}
	if !slices.Equal(committed, []string{"step-0"}) {
		t.Errorf("commits %v; want step-0", committed)
	}
}

// The forecast of how long after a notice a checkpoint would be durable takes in the trainer's
// time from its signal to its save's first file (its step boundary), as measured at the last
// signal: before, it began at the first file, and a trainer whose step takes a minute was
// forecast durable in a second (found from outside: 0.8 s forecast, 4.5 s measured). Later
// checkpoints, periodic ones too, keep it.
func TestForecastTakesInTheTrainersTimeToBegin(t *testing.T) {
	dir := t.TempDir()
	r := startUploaderWith(t, dir, newMemStore(), UploaderConfig{})
	signalled := time.Now().Add(-3 * time.Second) // the trainer reached its step boundary 3 s after its signal
	r.up.SetNotices([]ActiveNotice{{Key: "spot/terminate", Deadline: time.Now().Add(2 * time.Minute), SignalledAt: signalled}})
	writeCheckpoint(t, dir, "step-1", map[string][]byte{"a": randomBytes(t, 4<<10)})
	ev := r.waitCommitted("step-1")
	// (A file found by the uploader's first read is timed by its own time, which may lag the
	// clock by a tick.)
	if ev.Forecast < 3*time.Second-FileTimeLag || ev.Forecast > time.Minute {
		t.Errorf("forecast %v; want the trainer's 3 s to its first file and the rest", ev.Forecast)
	}
	r.up.SetNotices(nil)
	writeCheckpoint(t, dir, "step-2", map[string][]byte{"a": randomBytes(t, 4<<10)})
	// The next checkpoint (the trainer saving on its own, later) keeps the 3 s: its own time
	// from the signal is not the trainer's answer to it.
	if ev := r.waitCommitted("step-2"); ev.Forecast < 3*time.Second-FileTimeLag || ev.Forecast > 3*time.Second+time.Second {
		t.Errorf("forecast of the next checkpoint %v; want it to keep the trainer's 3 s", ev.Forecast)
	}
}

// A restarted agent finds the save its trainer made while it was down: the forecast took the
// time from the previous run's signal to this run's first read as the trainer's (18.7 s for a save
// of a second, found from outside). What the first read finds is timed by its files.
func TestForecastAfterARestartTimesTheSaveByItsFiles(t *testing.T) {
	dir := t.TempDir()
	signalled := time.Now().Add(-time.Minute) // by the agent's previous run
	writeCheckpoint(t, dir, "step-1", map[string][]byte{"a": randomBytes(t, 4<<10)})
	written := signalled.Add(2 * time.Second) // the trainer began 2 s after its signal and took 1 s
	for _, f := range []struct {
		name string
		at   time.Time
	}{{"a", written}, {"_COMPLETE", written.Add(time.Second)}} {
		if err := os.Chtimes(filepath.Join(dir, "step-1", f.name), f.at, f.at); err != nil {
			t.Fatal(err)
		}
	}
	r := newUploaderRig(t, dir, newMemStore(), UploaderConfig{AwaitFirstRead: true})
	// The journal's notice, as the agent hands it over at start.
	r.up.SetNotices([]ActiveNotice{{Key: "spot/terminate", Deadline: signalled.Add(2 * time.Minute), SignalledAt: signalled}})
	w, err := NewWatcher(WatchConfig{Dir: dir, Pattern: "*.pt", Debounce: 30 * time.Millisecond, ReadDone: true, Logger: zerolog.Nop()})
	if err != nil {
		t.Fatal(err)
	}
	r.run(w)
	ev := r.waitCommitted("step-1")
	if ev.Forecast < 3*time.Second || ev.Forecast > 10*time.Second {
		t.Errorf("forecast %v; want the trainer's 2 s to begin, its 1 s to write and the rest, not the minute the agent was down", ev.Forecast)
	}
}

// An agent restarted during a notice whose answer its previous run committed: the trainer's
// next save, a periodic one minutes later, was taken for its answer to the signal (a forecast of
// 105 s for a save of 0.02 s; found from outside). Only the save that answered the signal times
// the trainer's start.
func TestForecastAfterARestartDoesNotTakeALaterSaveForTheAnswer(t *testing.T) {
	dir := t.TempDir()
	store := newMemStore()
	signalled := time.Now().Add(-time.Minute)
	answered := signalled.Add(time.Second)
	putCommit(t, store, "step-1", "i-test", map[string][]byte{"a": randomBytes(t, 4<<10)}, answered, answered, nil)
	r := newUploaderRig(t, dir, store, UploaderConfig{})
	r.up.SetNotices([]ActiveNotice{{Key: "spot/terminate", Deadline: signalled.Add(2 * time.Minute), SignalledAt: signalled}})
	w, err := NewWatcher(WatchConfig{Dir: dir, Pattern: "*.pt", Debounce: 30 * time.Millisecond, Logger: zerolog.Nop()})
	if err != nil {
		t.Fatal(err)
	}
	r.run(w)
	writeCheckpoint(t, dir, "step-2", map[string][]byte{"a": randomBytes(t, 4<<10)})
	if ev := r.waitCommitted("step-2"); ev.Forecast > 10*time.Second {
		t.Errorf("forecast %v; want the periodic save's own time, not the minute since the signal its previous run's save answered", ev.Forecast)
	}
}

// Retention, which reads the whole job, ran after every commit: with checkpoint.keep set, a
// backlog of complete checkpoints (an agent restarted on a disk of a thousand saves, a trainer
// saving faster than the store) took seconds a commit, and a notice's checkpoint waited behind
// them past its deadline (found from outside). It runs after the last commit of a run of them,
// and not during a notice; what it deletes is the same once it has run.
func TestRetentionWaitsForTheEndOfABacklog(t *testing.T) {
	dir := t.TempDir()
	for i := range 12 {
		writeCheckpoint(t, dir, fmt.Sprintf("step-%02d", i), map[string][]byte{"a": randomBytes(t, 1<<10)})
		waitFileClockAfter(t, time.Now())
	}
	s := newMemStore()
	r := startUploader(t, dir, s, 2)
	commits := 0
	for commits < 12 {
		if ev := r.waitEvent(0, ""); ev.Kind == CheckpointCommitted {
			commits++
		}
	}
	eventuallyUploader(t, "retention to keep the newest two", func() bool {
		cs, _, err := ListCommitted(t.Context(), s, "job")
		return err == nil && len(cs) == 2 && cs[0].Manifest.Checkpoint == "step-11"
	})
	s.mu.Lock()
	dirs := s.listed.ListDirs
	s.mu.Unlock()
	// The read of the job at start, each commit's look at its name, and one read of the job per
	// retention: with retention after each of the 12 commits, 169 listings.
	if dirs > 120 {
		t.Errorf("%d delimiter listings for 12 commits in a row; want retention run a few times, not after each", dirs)
	}

	// During a notice, none: the two committed then stay beside the older ones until the next
	// commit after it.
	r.up.SetNotices([]ActiveNotice{{Key: "spot/terminate", Deadline: time.Now().Add(2 * time.Minute), SignalledAt: time.Now()}})
	for _, name := range []string{"step-20", "step-21"} {
		waitFileClockAfter(t, time.Now())
		writeCheckpoint(t, dir, name, map[string][]byte{"a": randomBytes(t, 1<<10)})
		r.waitCommitted(name)
	}
	if cs, _, _ := ListCommitted(t.Context(), s, "job"); len(cs) != 4 {
		t.Errorf("%d commits after two during a notice; want 4, retention left for after it", len(cs))
	}
	r.up.SetNotices(nil)
	waitFileClockAfter(t, time.Now())
	writeCheckpoint(t, dir, "step-22", map[string][]byte{"a": randomBytes(t, 1<<10)})
	r.waitCommitted("step-22")
	eventuallyUploader(t, "retention after the notice", func() bool {
		cs, _, err := ListCommitted(t.Context(), s, "job")
		return err == nil && len(cs) == 2
	})
}
