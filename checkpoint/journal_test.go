package checkpoint

import (
	"fmt"
	"maps"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"
)

func TestJournalRoundTrip(t *testing.T) {
	path := filepath.Join(t.TempDir(), "run", "uploads.jsonl")
	id := FileID{Dev: 1, Ino: 2, Size: 3, ModTime: time.Unix(4, 5), ChangeTime: time.Unix(6, 7)}
	sum := CRC32CChecksum(42)
	entries := map[string]*journalEntry{
		"step-1": {commit: "20261130T000000Z-000000000001", done: true,
			files: map[string]doneFile{"a": {id: id, checksum: sum, key: "J/step-1/20261130T000000Z-000000000001/a"}}},
		"step-2": {commit: "20261130T000000Z-000000000002", files: map[string]doneFile{}},
		"step-7": {commit: "20261130T000000Z-000000000007", sealed: true, files: map[string]doneFile{}},
		"step-3": {commit: "20261130T000000Z-000000000003", adopted: true, done: true, files: map[string]doneFile{}},
	}
	j, err := writeJournal(path, entries)
	if err != nil {
		t.Fatal(err)
	}
	// The run goes on: a file of step-2, and one that left it again (a line that names another
	// commit does not count), an adoption cut short by a kill, a dropped commit, and a torn last
	// line.
	j.file("step-2", "20261130T000000Z-000000000002", "b", doneFile{id: id, checksum: sum, key: "k"})
	j.file("step-2", "20261130T000000Z-000000000002", "c", doneFile{id: id, checksum: sum, key: "kc"})
	j.add(journalLine{Op: journalGone, Checkpoint: "step-2", Commit: "20261130T000000Z-000000000002", Path: "c"})
	j.add(journalLine{Op: journalGone, Checkpoint: "step-2", Commit: "20261130T000000Z-000000000009", Path: "b"})
	j.add(journalLine{Op: journalAdopt, Checkpoint: "step-4", Commit: "20261130T000000Z-000000000004"})
	j.add(journalLine{Op: journalCommit, Checkpoint: "step-5", Commit: "20261130T000000Z-000000000005"})
	j.add(journalLine{Op: journalDrop, Checkpoint: "step-5", Commit: "20261130T000000Z-000000000005"})
	j.add(journalLine{Op: journalFile, Checkpoint: "step-6", Commit: "20261130T000000Z-000000000006", Path: "x"}) // its start was lost
	if err := j.close(); err != nil {
		t.Fatal(err)
	}
	f, _ := os.OpenFile(path, os.O_WRONLY|os.O_APPEND, 0)
	f.WriteString(`{"op":"file","ckpt":"step-2","commit":"20261130T000000Z-0000`)
	f.Close()

	got, err := readJournal(path)
	if err != nil {
		t.Fatal(err)
	}
	if len(got) != 4 {
		t.Fatalf("Got(%q) = %d entries %v; want step-1, step-2, step-3, step-7", "readJournal", len(got), got)
	}
	if e := got["step-7"]; e == nil || !e.sealed || e.done {
		t.Errorf("Got(%q) = %+v; want unfinished and sealed (its manifest PUT may have been sent)", "step-7", e)
	}
	if e := got["step-2"]; e != nil && e.sealed {
		t.Errorf("Got(%q) = %+v; want not sealed", "step-2", e)
	}
	if e := got["step-1"]; e == nil || !e.done || !e.files["a"].id.Same(id) || e.files["a"].checksum != sum {
		t.Errorf("Got(%q) = %+v; want done with file a", "step-1", e)
	}
	if e := got["step-2"]; e == nil || e.done || len(e.files) != 1 || e.files["b"].key != "k" {
		t.Errorf("Got(%q) = %+v; want unfinished with file b", "step-2", e)
	}
	if e := got["step-3"]; e == nil || !e.adopted || !e.done {
		t.Errorf("Got(%q) = %+v; want an adopted commit, done", "step-3", e)
	}
	for _, name := range []string{"step-4", "step-5", "step-6"} {
		if got[name] != nil {
			t.Errorf("Got(%q) = %+v; want nothing (an adoption cut short is never resumed; dropped; no start)", name, got[name])
		}
	}
}

// TestJournalLates: a late clean-up begun and not done is read back for the next run, once, with
// only the strays under its own commit's prefix (nothing in the journal is trusted to name another
// key); one done is not, and a done of the abandoned clean-up of a commit leaves its other one,
// as retention's look at a commit it deleted is apart from the commit's own clean-up.
func TestJournalLates(t *testing.T) {
	path := filepath.Join(t.TempDir(), "uploads.jsonl")
	j, err := writeJournal(path, nil)
	if err != nil {
		t.Fatal(err)
	}
	at := time.Date(2026, 12, 2, 4, 0, 0, 0, time.UTC)
	c1, c3, c4 := "20261202T040000Z-000000000001", "20261202T040000Z-000000000003", "20261202T040000Z-000000000004"
	own := DataKey("job", "step-1", c1, "a.tmp")
	j.add(lateCleanup{CommitRef: CommitRef{Checkpoint: "step-1", Commit: c1}, At: at,
		Strays: []string{own, "job/step-2/" + c1 + "/a", CommitPrefix("job", "step-1", c1), CommitPrefix("job", "step-1", c1) + "../../step-2/x"}}.line())
	j.add(lateCleanup{CommitRef: CommitRef{Checkpoint: "step-3", Commit: c3}, At: at, Abandoned: true}.line())
	j.add(journalLine{Op: journalLateDone, Checkpoint: "step-3", Commit: c3, Abandoned: true})
	j.add(lateCleanup{CommitRef: CommitRef{Checkpoint: "step-4", Commit: c4}, At: at}.line())
	j.add(journalLine{Op: journalLateDone, Checkpoint: "step-4", Commit: c4, Abandoned: true})
	j.add(lateCleanup{CommitRef: CommitRef{Checkpoint: "step-1", Commit: c1}, At: at.Add(time.Second), Strays: []string{own}, Listed: true}.line())
	// Retention's looks at commits it deleted: one done, one not (beside step-4's own).
	j.add(lateCleanup{CommitRef: CommitRef{Checkpoint: "step-3", Commit: c3}, At: at, Deleted: true}.line())
	j.add(journalLine{Op: journalLateDone, Checkpoint: "step-3", Commit: c3, Deleted: true})
	j.add(lateCleanup{CommitRef: CommitRef{Checkpoint: "step-4", Commit: c4}, At: at.Add(2 * time.Second), Deleted: true}.line())
	if err := j.close(); err != nil {
		t.Fatal(err)
	}
	got := journalLates(path, "job")
	want := []lateCleanup{
		{CommitRef: CommitRef{Checkpoint: "step-1", Commit: c1}, At: at.Add(time.Second), Strays: []string{own}, Listed: true},
		{CommitRef: CommitRef{Checkpoint: "step-4", Commit: c4}, At: at},
		{CommitRef: CommitRef{Checkpoint: "step-4", Commit: c4}, At: at.Add(2 * time.Second), Deleted: true},
	}
	if len(got) != len(want) {
		t.Fatalf("Got(%q) = %+v; want %+v", "journalLates", got, want)
	}
	for i := range want {
		if got[i].CommitRef != want[i].CommitRef || !got[i].At.Equal(want[i].At) || got[i].Abandoned != want[i].Abandoned ||
			got[i].Deleted != want[i].Deleted || got[i].Listed != want[i].Listed || !slices.Equal(got[i].Strays, want[i].Strays) {
			t.Errorf("Got(%q)[%d] = %+v; want %+v", "journalLates", i, got[i], want[i])
		}
	}
}

// A late clean-up with more strays than the journal keeps is Listed there: a restart lists the
// commit rather than leave the others to retention.
func TestJournalLateOfManyStraysIsListed(t *testing.T) {
	path := filepath.Join(t.TempDir(), "uploads.jsonl")
	j, err := writeJournal(path, nil)
	if err != nil {
		t.Fatal(err)
	}
	c := "20261202T040000Z-000000000001"
	for _, n := range []int{journalLateKeys, journalLateKeys + 1} {
		l := lateCleanup{CommitRef: CommitRef{Checkpoint: fmt.Sprintf("step-%d", n), Commit: c}, At: time.Now()}
		for i := range n {
			l.Strays = append(l.Strays, DataKey("job", l.Checkpoint, c, fmt.Sprintf("f%d.tmp", i)))
		}
		j.add(l.line())
	}
	if err := j.close(); err != nil {
		t.Fatal(err)
	}
	lates := journalLates(path, "job")
	if len(lates) != 2 {
		t.Fatalf("journalLates = %d clean-ups; want 2", len(lates))
	}
	for _, l := range lates {
		if want := l.Checkpoint != fmt.Sprintf("step-%d", journalLateKeys); l.Listed != want || len(l.Strays) != journalLateKeys {
			t.Errorf("%s: Listed %v with %d strays; want Listed %v with %d", l.Checkpoint, l.Listed, len(l.Strays), want, journalLateKeys)
		}
	}
}

func TestJournalMissingIsEmpty(t *testing.T) {
	got, err := readJournal(filepath.Join(t.TempDir(), "none.jsonl"))
	if err != nil || len(got) != 0 {
		t.Errorf("Got(%q) = %v, %v; want empty, nil", "readJournal", got, err)
	}
}

// TestJournalStaysSmall: the journal, appended to at every file stored, is written compactly
// again once it has grown (found from outside: 1.6 MB after 31 minutes, 44 MB for one checkpoint
// of 100 000 files, in /run, until a restart). What a restart needs stays in it.
func TestJournalStaysSmall(t *testing.T) {
	t.Cleanup(func(n int64) func() { return func() { journalCompactAt = n } }(journalCompactAt)) // after the uploader stops
	journalCompactAt = 8 << 10
	s, dir, state := newMemStore(), t.TempDir(), t.TempDir()
	r := startUploaderWith(t, dir, s, UploaderConfig{StateDir: state})
	files := map[string][]byte{}
	for i := range 8 {
		files[fmt.Sprintf("shard-%d.bin", i)] = []byte{byte(i)}
	}
	var last *Manifest
	for i := range 30 {
		name := fmt.Sprintf("step-%03d", i)
		writeCheckpoint(t, dir, name, files)
		last = r.waitCommitted(name).Manifest
		if i < 29 {
			if err := os.RemoveAll(filepath.Join(dir, name)); err != nil { // the trainer's rotation
				t.Fatal(err)
			}
		}
	}
	path := JournalPath(state, "job", dir, s.URL())
	// The commit's event comes before the loop writes out the line that says it is done.
	var entries map[string]*journalEntry
	eventuallyUploader(t, "the journal to say step-029 is done", func() bool {
		var err error
		entries, err = readJournal(path)
		return err == nil && entries["step-029"] != nil && entries["step-029"].done
	})
	fi, err := os.Stat(path)
	if err != nil {
		t.Fatal(err)
	}
	if fi.Size() > 4*journalCompactAt {
		t.Errorf("journal is %d bytes after 30 checkpoints; want it written compactly again (at most %d)", fi.Size(), 4*journalCompactAt)
	}
	if e := entries["step-029"]; e == nil || !e.done || e.commit != last.Commit || len(e.files) != len(last.Files) {
		t.Errorf("journal entry of step-029 = %+v; want its commit %s, done, with its %d files", e, last.Commit, len(last.Files))
	}
}

// checkpoint.dir spelled with a trailing slash is the same directory, and the same journal: a
// restart with "ck/" for "ck" forgot the unfinished commit, sent the checkpoint again whole, and
// left the killed run's objects in the store.
func TestJournalPathOfOneDirectorySpelledTwoWays(t *testing.T) {
	if a, b := JournalPath("/run/spotguard", "job", "/data/ck", "s3://b/p"), JournalPath("/run/spotguard", "job", "/data/ck/", "s3://b/p"); a != b {
		t.Errorf("JournalPath of /data/ck = %s, of /data/ck/ = %s; want one", a, b)
	}
	if a, b := JournalPath("/run/spotguard", "job", "/data/ck", "s3://b/p"), JournalPath("/run/spotguard", "job", "/data/ck2", "s3://b/p"); a == b {
		t.Errorf("JournalPath of two directories = %s; want two", a)
	}
	// A journal an agent before this one wrote under "ck/" as configured (before the path was
	// cleaned) is still the journal, while there is none at the cleaned path: an upgrade with
	// checkpoint.dir "ck/" lost it, and the new agent committed a checkpoint rewritten after its
	// marker, torn (found from outside).
	state, ck := t.TempDir(), t.TempDir()
	old := journalAt(state, "job", ck+"/", "s3://b/p")
	if err := os.WriteFile(old, nil, 0o600); err != nil {
		t.Fatal(err)
	}
	if got := JournalPath(state, "job", ck+"/", "s3://b/p"); got != old {
		t.Errorf("JournalPath(%s/) with a journal under the spelling as configured = %s; want it, %s", ck, got, old)
	}
	now := journalAt(state, "job", ck, "s3://b/p")
	if err := os.WriteFile(now, nil, 0o600); err != nil {
		t.Fatal(err)
	}
	if got := JournalPath(state, "job", ck+"/", "s3://b/p"); got != now {
		t.Errorf("JournalPath(%s/) with journals under both spellings = %s; want the cleaned one's, %s", ck, got, now)
	}
}

// checkpoint.dir given through a symbolic link to the directory, or as the directory itself, is
// one journal: before, the unfinished commit of an agent restarted with the other spelling was
// sent again in full and the killed run's objects were left in the store (found from outside).
// A journal written under the link's spelling before links were followed is still found.
func TestJournalPathFollowsSymbolicLinks(t *testing.T) {
	root := t.TempDir()
	real := filepath.Join(root, "nvme", "ck")
	if err := os.MkdirAll(real, 0o755); err != nil {
		t.Fatal(err)
	}
	link := filepath.Join(root, "data-ck")
	if err := os.Symlink(real, link); err != nil {
		t.Fatal(err)
	}
	state := t.TempDir()
	a, b := JournalPath(state, "job", link, "s3://b/p"), JournalPath(state, "job", real+"/", "s3://b/p")
	if a != b {
		t.Errorf("JournalPath through the link = %s, of the directory = %s; want one", a, b)
	}
	// A journal under the link's own spelling (an agent before this one) is still the journal.
	old := journalAt(state, "job", link, "s3://b/p")
	if err := os.WriteFile(old, nil, 0o600); err != nil {
		t.Fatal(err)
	}
	if got := JournalPath(state, "job", link, "s3://b/p"); got != old {
		t.Errorf("JournalPath with a journal under the link's spelling = %s; want it, %s", got, old)
	}
	// A missing directory is taken as spelled.
	if got, want := JournalPath(state, "job", filepath.Join(root, "none"), "s3://b/p"), journalAt(state, "job", filepath.Join(root, "none"), "s3://b/p"); got != want {
		t.Errorf("JournalPath of a missing directory = %s; want %s", got, want)
	}
}

// agent.runtime_dir removed under a running agent (an rm -r of /run/spotguard): its journal went
// on being appended to a file no restart finds, in silence, and a restart sent again what was
// stored (found from outside). It is written back at its path, with what it held, at its next
// flush, and the log says so.
func TestJournalRemovedUnderTheAgentIsWrittenAgain(t *testing.T) {
	dir, state := t.TempDir(), filepath.Join(t.TempDir(), "run")
	store := newMemStore()
	r := startUploaderWith(t, dir, store, UploaderConfig{StateDir: state, StopBudget: -1})
	writeCheckpoint(t, dir, "step-1", map[string][]byte{"a": randomBytes(t, 8<<10)})
	r.waitCommitted("step-1")
	if err := os.RemoveAll(state); err != nil {
		t.Fatal(err)
	}
	writeCheckpoint(t, dir, "step-2", map[string][]byte{"a": randomBytes(t, 8<<10)})
	r.waitCommitted("step-2")
	path := JournalPath(state, "job", dir, store.URL())
	// The commit's event comes before the loop writes its journal line out: wait for the line.
	var entries map[string]*journalEntry
	var err error
	eventuallyUploader(t, "step-2 done in the journal written again", func() bool {
		entries, err = readJournal(path)
		return err == nil && entries["step-2"] != nil && entries["step-2"].done
	})
	if entries["step-1"] == nil {
		t.Errorf("journal entries %v; want step-1's and step-2's", slices.Sorted(maps.Keys(entries)))
	}
	if fi, err := os.Stat(state); err != nil || fi.Mode().Perm() != 0o755 {
		t.Errorf("agent.runtime_dir made again: %v, %v; want mode 0755 (the trainer reads notice.json there)", fi, err)
	}
	if !strings.Contains(r.logs.String(), "journal was removed under the agent") {
		t.Errorf("no warning that the journal was removed:\n%s", r.logs)
	}
}

// An agent started with a new store.job (or store.url) on a checkpoint.dir that holds an earlier
// run's checkpoints committed them to the new job without a word, the newest becoming the new
// job's LATEST: a restore of the new job gave the old run's bytes (found from outside). They are
// still committed (a run that resumes from one needs it), but a warning names each, from the
// earlier run's journal; a checkpoint of the new run's own is no such thing.
func TestAnEarlierRunsCheckpointCommittedForANewJobIsSaid(t *testing.T) {
	dir, state := t.TempDir(), filepath.Join(t.TempDir(), "run")
	r := startUploaderWith(t, dir, mustNewFileStore(t), UploaderConfig{StateDir: state, StopBudget: -1})
	writeCheckpoint(t, dir, "step-1", map[string][]byte{"a": randomBytes(t, 8<<10)})
	r.waitCommitted("step-1")
	r.stop()

	r2 := startUploaderWith(t, dir, mustNewFileStore(t), UploaderConfig{StateDir: state, StopBudget: -1})
	r2.waitCommitted("step-1")
	writeCheckpoint(t, dir, "step-2", map[string][]byte{"a": randomBytes(t, 8<<10)})
	r2.waitCommitted("step-2")
	const said = "committed by an earlier run under another store.job or store.url"
	if l := r2.logs.String(); strings.Count(l, said) != 1 || !strings.Contains(l, `"checkpoint":"step-1"`) {
		t.Errorf("log of the new run: want one warning, of step-1:\n%s", l)
	}
	if l := r.logs.String(); strings.Contains(l, said) {
		t.Errorf("log of the first run warns:\n%s", l)
	}
}
