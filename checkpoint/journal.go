package checkpoint

import (
	"bufio"
	"bytes"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"maps"
	"os"
	"path"
	"path/filepath"
	"slices"
	"strings"
	"time"
)

// The journal is how a restarted agent (kill -9, a systemd restart) finds its own work again: for
// each local checkpoint, the commit it is writing (or committed) and the files it has stored
// there, each with the FileID of the version that was read. It lives in the agent's runtime
// directory (UploaderConfig.StateDir), one file per job, checkpoint directory and store, as lines
// of JSON appended as the work goes on and rewritten compactly at start. A line lost in a crash
// only costs a file sent again; nothing in it is trusted without checking: a resumed commit's
// objects are listed and matched by size, and a file counts as stored only while it is the same
// version (FileID) that was sent.

// journalOp is what a journal line records.
type journalOp string

const (
	// journalCommit: the checkpoint's files now go to this commit (before its first PUT).
	journalCommit journalOp = "commit"
	// journalAdopt: the checkpoint is this commit already in the store (not this agent's: it is
	// never resumed or cleaned up), its files follow, then journalDone.
	journalAdopt journalOp = "adopt"
	// journalFile: a file is stored in the commit (or, before journalDone of an adopted commit,
	// matched one of its files).
	journalFile journalOp = "file"
	// journalGone: a file stored in the commit left the checkpoint (removed, renamed away, or
	// found gone) before the commit: it is not part of it.
	journalGone journalOp = "gone"
	// journalDone: the commit is committed (by this agent or found committed and adopted); At
	// is its place in the order (Manifest.Order, this node's part's in a multi-node job), when
	// known (zero in journals written before it was).
	journalDone journalOp = "done"
	// journalSeal: a manifest PUT for the commit may be sent from now on (before the first). A
	// restarted agent treats the commit as one whose manifest may exist or still land: nothing
	// is written into it again, and it is not deleted as abandoned.
	journalSeal journalOp = "seal"
	// journalDrop: the commit was abandoned; its objects are being deleted.
	journalDrop journalOp = "drop"
	// journalCleaned: the dropped commit's objects are deleted. A drop without it is a clean-up
	// a restart does again (journalCleanups).
	journalCleaned journalOp = "cleaned"
	// journalLate: the late clean-up passes of a commit's prefix began (lateCleanup: At, Keys
	// for its strays, Abandoned, Deleted, Sealed). One without journalLateDone is resumed by a
	// restart (journalLates): a write held by the network can land after the agent is gone.
	journalLate journalOp = "late"
	// journalLateDone: the late clean-up of the commit (and Abandoned, Deleted) is over: its
	// last pass succeeded, or its time to try again ran out (lateExpiry).
	journalLateDone journalOp = "late_done"
	// journalStale: a file of the checkpoint was written again after its marker, the version ID
	// (Uploader.reopen): the checkpoint is not complete with that marker. Of the checkpoint, not
	// of a commit (Commit is empty). One without ID ends it (another marker came).
	journalStale journalOp = "stale"
)

// journalLine is one line of the journal.
type journalLine struct {
	Op         journalOp `json:"op"`
	Checkpoint string    `json:"ckpt"`
	Commit     string    `json:"commit"`
	Path       string    `json:"path,omitempty"`
	Key        string    `json:"key,omitempty"`
	ID         *FileID   `json:"id,omitempty"`
	Checksum   Checksum  `json:"checksum,omitzero"`
	ReadAt     time.Time `json:"read_at,omitzero"`
	// At, Keys, Abandoned, Deleted, Sealed and Listed are a journalLate's (lateCleanup);
	// Abandoned and Deleted a journalLateDone's too; At a journalDone's too.
	At        time.Time `json:"at,omitzero"`
	Keys      []string  `json:"keys,omitempty"`
	Abandoned bool      `json:"abandoned,omitempty"`
	Deleted   bool      `json:"deleted,omitempty"`
	Sealed    bool      `json:"sealed,omitempty"`
	Listed    bool      `json:"listed,omitempty"`
}

// journalEntry is what the journal says of one checkpoint: its last commit.
type journalEntry struct {
	commit string
	files  map[string]doneFile
	done   bool
	// completeAt is a done commit's place in the order (journalDone's At), if known.
	completeAt time.Time
	dropped    bool
	// adopted: commit is not this agent's (journalAdopt); only a done one is kept.
	adopted bool
	// sealed: a manifest PUT for commit may have been sent (journalSeal).
	sealed bool
}

// journal appends lines to the journal file. Only the uploader's Run goroutine uses it. A nil
// *journal does nothing (no StateDir, or it could not be opened).
type journal struct {
	path string
	f    *os.File
	w    *bufio.Writer
	err  error // the first write error; the journal is off after it
	// size is the file's size; base what it was when written compactly (writeJournal); looked
	// what it was at the last look for the file gone from its path (gone).
	size, base, looked int64
}

// journalCompactAt is the size from which a journal grown to four times its compact size is
// written compactly again (Uploader.compactJournal): appended to at every file stored, it would
// otherwise grow in memory (/run is a tmpfs) for as long as the agent runs.
var journalCompactAt int64 = 1 << 20

// grown reports whether j is due to be written compactly.
func (j *journal) grown() bool {
	return j != nil && j.err == nil && j.size > journalCompactAt && j.size > 4*j.base
}

// JournalPath is the journal's file for job, dir and store in stateDir: that of the agent with
// agent.runtime_dir stateDir, store.job job, checkpoint.dir dir and the store whose URL is store.
// dir is taken as the directory it names: cleaned ("ck/" and "ck" are one directory) and, where
// it exists, with its symbolic links followed (/data/ck, a link to /mnt/nvme/ck, and
// /mnt/nvme/ck are one). While there is no journal at that path, a journal written by an earlier
// version under the spelling it used is still found: dir cleaned (before links were followed) or
// as configured (before it was cleaned: "ck/"). Without it, an upgraded agent sent its unfinished
// commit again and left the killed run's objects, and committed a checkpoint rewritten after its
// marker, torn (found from outside).
func JournalPath(stateDir, job, dir, store string) string {
	clean := filepath.Clean(dir)
	want := clean
	if real, err := filepath.EvalSymlinks(clean); err == nil {
		want = real
	}
	at := journalAt(stateDir, job, want, store)
	if _, err := os.Lstat(at); !errors.Is(err, fs.ErrNotExist) {
		return at
	}
	for _, old := range []string{clean, dir} {
		if old == want {
			continue
		}
		if p := journalAt(stateDir, job, old, store); fileExists(p) {
			return p
		}
	}
	return at
}

// fileExists reports whether something is at path.
func fileExists(path string) bool {
	_, err := os.Lstat(path)
	return err == nil
}

// journalAt is the journal's file for job, the directory dir and store in stateDir.
func journalAt(stateDir, job, dir, store string) string {
	sum := sha256.Sum256([]byte(job + "\x00" + dir + "\x00" + store))
	return filepath.Join(stateDir, "uploads-"+hex.EncodeToString(sum[:8])+".jsonl")
}

// readJournal reads the journal at path: the last commit of each checkpoint. A missing file is
// an empty journal; a torn or unreadable line is skipped; a dropped commit is left out.
func readJournal(path string) (map[string]*journalEntry, error) {
	entries := map[string]*journalEntry{}
	data, err := os.ReadFile(path)
	if err != nil && !errors.Is(err, fs.ErrNotExist) {
		return entries, fmt.Errorf("read journal: %w", err)
	}
	for line := range bytes.SplitSeq(data, []byte("\n")) {
		var l journalLine
		if len(line) == 0 || json.Unmarshal(line, &l) != nil || ValidName(l.Checkpoint) != nil {
			continue
		}
		e := entries[l.Checkpoint]
		if e == nil || e.commit != l.Commit {
			if l.Op != journalCommit && l.Op != journalAdopt {
				continue // a line of a commit whose start was lost
			}
			e = &journalEntry{commit: l.Commit, files: map[string]doneFile{}, adopted: l.Op == journalAdopt}
			entries[l.Checkpoint] = e
		}
		switch l.Op {
		case journalFile:
			if l.ID != nil && ValidPath(l.Path) == nil {
				e.files[l.Path] = doneFile{id: *l.ID, checksum: l.Checksum, readAt: l.ReadAt, key: l.Key}
			}
		case journalGone:
			delete(e.files, l.Path)
		case journalDone:
			e.done, e.completeAt = true, l.At
		case journalSeal:
			e.sealed = true
		case journalDrop:
			e.dropped = true
		}
	}
	for name, e := range entries {
		if e.dropped || (e.adopted && !e.done) {
			delete(entries, name)
		}
	}
	return entries, nil
}

// journalStales reads the journal at path for the checkpoints whose marker is stale
// (journalStale): by name, the marker version a file was written again after.
func journalStales(path string) map[string]FileID {
	stale := map[string]FileID{}
	data, err := os.ReadFile(path)
	if err != nil {
		return stale
	}
	for line := range bytes.SplitSeq(data, []byte("\n")) {
		var l journalLine
		if len(line) == 0 || json.Unmarshal(line, &l) != nil || l.Op != journalStale || ValidName(l.Checkpoint) != nil {
			continue
		}
		if l.ID == nil {
			delete(stale, l.Checkpoint)
		} else {
			stale[l.Checkpoint] = *l.ID
		}
	}
	return stale
}

// staleLine is the journalStale line of checkpoint name: its marker id is stale, or, with a
// zero id, no longer.
func staleLine(name string, id FileID) journalLine {
	l := journalLine{Op: journalStale, Checkpoint: name}
	if !id.isZero() {
		l.ID = &id
	}
	return l
}

// journalCleanups reads the journal at path for the commits dropped and not cleaned up (the
// agent stopped or was killed while it deleted their objects), oldest first.
func journalCleanups(path string) []CommitRef {
	data, err := os.ReadFile(path)
	if err != nil {
		return nil
	}
	var order []CommitRef
	pending := map[CommitRef]bool{}
	for line := range bytes.SplitSeq(data, []byte("\n")) {
		var l journalLine
		if len(line) == 0 || json.Unmarshal(line, &l) != nil || ValidName(l.Checkpoint) != nil || ValidCommitID(l.Commit) != nil {
			continue
		}
		ref := CommitRef{Checkpoint: l.Checkpoint, Commit: l.Commit}
		switch l.Op {
		case journalDrop:
			if !pending[ref] {
				order = append(order, ref)
			}
			pending[ref] = true
		case journalCleaned:
			delete(pending, ref)
		}
	}
	return slices.DeleteFunc(order, func(r CommitRef) bool { return !pending[r] })
}

// lateCleanup is a commit's late clean-up (Uploader.goLateCleanup): its prefix is cleared of
// incomplete uploads, and of Strays (keys of files that left the committed checkpoint), or, if
// Abandoned, of every object, at each of lateAborts after At. Sealed: a write of the commit's
// manifest (or part manifest) whose answer was lost may still land, after another agent's
// retention deleted the commit; each pass then deletes a manifest that names missing objects.
// Deleted: this agent's retention deleted the commit, which another agent may have written; each
// pass deletes a manifest written there again over deleted objects, and nothing else. Listed: the
// strays are not all known (the commit was begun by an earlier run of this agent, which kept
// them in memory: one resumed, or found committed at start); each pass lists the prefix and
// deletes whatever the commit's manifest does not list (dropUnlisted).
type lateCleanup struct {
	CommitRef
	Strays    []string
	Abandoned bool
	Deleted   bool
	Sealed    bool
	Listed    bool
	At        time.Time
}

// journalLateKeys is how many of a late clean-up's strays the journal keeps: the line is written
// again at each compaction while the clean-up runs, and a trainer that renames 100 000 temporary
// files would make it megabytes. A line that leaves some out is Listed: a restart lists the
// commit instead.
const journalLateKeys = 1000

// line is the journalLate line of l.
func (l lateCleanup) line() journalLine {
	return journalLine{Op: journalLate, Checkpoint: l.Checkpoint, Commit: l.Commit, At: l.At,
		Keys: l.Strays[:min(len(l.Strays), journalLateKeys)], Abandoned: l.Abandoned, Deleted: l.Deleted, Sealed: l.Sealed,
		Listed: l.Listed || len(l.Strays) > journalLateKeys}
}

// journalLates reads the journal file for the late clean-ups begun and not done (the agent
// stopped or was killed before their last pass), oldest first. Only strays under the commit's
// prefix in job are taken: nothing in the journal is trusted to name another key.
func journalLates(file, job string) []lateCleanup {
	data, err := os.ReadFile(file)
	if err != nil {
		return nil
	}
	type key struct {
		CommitRef
		abandoned, deleted bool
	}
	var order []key
	pending := map[key]*lateCleanup{}
	for line := range bytes.SplitSeq(data, []byte("\n")) {
		var l journalLine
		if len(line) == 0 || json.Unmarshal(line, &l) != nil || ValidName(l.Checkpoint) != nil || ValidCommitID(l.Commit) != nil {
			continue
		}
		k := key{CommitRef{Checkpoint: l.Checkpoint, Commit: l.Commit}, l.Abandoned, l.Deleted}
		switch l.Op {
		case journalLate:
			prefix := CommitPrefix(job, l.Checkpoint, l.Commit)
			strays := slices.DeleteFunc(l.Keys, func(s string) bool {
				return !strings.HasPrefix(s, prefix) || len(s) == len(prefix) || path.Clean(s) != s
			})
			if p := pending[k]; p != nil { // begun again: one clean-up of both
				p.Strays = append(p.Strays, strays...)
				p.At, p.Sealed, p.Listed = l.At, p.Sealed || l.Sealed, p.Listed || l.Listed
				continue
			}
			order = append(order, k)
			pending[k] = &lateCleanup{CommitRef: k.CommitRef, Strays: strays, Abandoned: l.Abandoned, Deleted: l.Deleted, Sealed: l.Sealed,
				Listed: l.Listed, At: l.At}
		case journalLateDone:
			delete(pending, k)
		}
	}
	var out []lateCleanup
	for _, k := range order {
		if p := pending[k]; p != nil {
			slices.Sort(p.Strays)
			p.Strays = slices.Compact(p.Strays)
			out = append(out, *p)
			delete(pending, k) // begun, done and begun again: once
		}
	}
	return out
}

// writeJournal rewrites the journal at path with entries (through a temporary file renamed into
// place) and opens it for appending.
func writeJournal(path string, entries map[string]*journalEntry) (*journal, error) {
	if err := os.MkdirAll(filepath.Dir(path), 0o700); err != nil {
		return nil, fmt.Errorf("create journal directory: %w", err)
	}
	var buf bytes.Buffer
	for name, e := range entries {
		writeJournalEntry(&buf, name, e)
	}
	tmp := path + ".tmp"
	if err := os.WriteFile(tmp, buf.Bytes(), 0o600); err != nil {
		return nil, fmt.Errorf("write journal: %w", err)
	}
	if err := os.Rename(tmp, path); err != nil {
		return nil, fmt.Errorf("write journal: %w", err)
	}
	return openJournal(path, int64(buf.Len()))
}

// openJournal opens the journal at path, size bytes long, written compactly, for appending (and
// reading back: restore).
func openJournal(path string, size int64) (*journal, error) {
	f, err := os.OpenFile(path, os.O_RDWR|os.O_APPEND, 0o600)
	if err != nil {
		return nil, fmt.Errorf("open journal: %w", err)
	}
	return &journal{path: path, f: f, w: bufio.NewWriter(f), size: size, base: size}, nil
}

// gone reports whether j's file is no longer at its path: removed, or agent.runtime_dir with it
// (an rm -r of /run/spotguard under a running agent), or another file put there. Its lines then
// go to a file no restart finds.
func (j *journal) gone() bool {
	if j == nil || j.err != nil || j.size == j.looked {
		return false // nothing written since the last look: the loop flushes at every event
	}
	j.looked = j.size
	open, err := j.f.Stat()
	if err != nil {
		return false
	}
	at, err := os.Stat(j.path)
	return errors.Is(err, fs.ErrNotExist) || err == nil && !os.SameFile(open, at)
}

// restore writes what j's file holds back at its path (a temporary file renamed into place, its
// directory made again as the agent makes agent.runtime_dir: 0755, notice.json is read there),
// and returns the journal opened there. j is left open: the caller closes it.
func (j *journal) restore() (*journal, error) {
	if err := j.flush(); err != nil {
		return nil, err
	}
	data := make([]byte, j.size)
	n, err := j.f.ReadAt(data, 0)
	if err != nil && !errors.Is(err, io.EOF) {
		return nil, fmt.Errorf("read journal back: %w", err)
	}
	data = data[:n]
	if err := os.MkdirAll(filepath.Dir(j.path), 0o755); err != nil {
		return nil, fmt.Errorf("create journal directory: %w", err)
	}
	tmp := j.path + ".tmp"
	if err := os.WriteFile(tmp, data, 0o600); err != nil {
		return nil, fmt.Errorf("write journal: %w", err)
	}
	if err := os.Rename(tmp, j.path); err != nil {
		return nil, fmt.Errorf("write journal: %w", err)
	}
	nj, err := openJournal(j.path, int64(n))
	if err != nil {
		return nil, err
	}
	nj.base = j.base
	return nj, nil
}

// writeJournalEntry writes e as journal lines to buf.
func writeJournalEntry(buf *bytes.Buffer, name string, e *journalEntry) {
	enc := json.NewEncoder(buf)
	op := journalCommit
	if e.adopted {
		op = journalAdopt
	}
	_ = enc.Encode(journalLine{Op: op, Checkpoint: name, Commit: e.commit})
	for p, d := range e.files {
		id := d.id
		_ = enc.Encode(journalLine{Op: journalFile, Checkpoint: name, Commit: e.commit, Path: p, Key: d.key, ID: &id,
			Checksum: d.checksum, ReadAt: d.readAt})
	}
	if e.sealed {
		_ = enc.Encode(journalLine{Op: journalSeal, Checkpoint: name, Commit: e.commit})
	}
	if e.done {
		_ = enc.Encode(journalLine{Op: journalDone, Checkpoint: name, Commit: e.commit, At: e.completeAt})
	}
}

// add appends a line; it is written out at the next flush.
func (j *journal) add(l journalLine) {
	if j == nil || j.err != nil {
		return
	}
	b, err := json.Marshal(l)
	if err == nil {
		var n int
		n, err = j.w.Write(append(b, '\n'))
		j.size += int64(n)
	}
	j.err = err
}

// file appends a journalFile line for d.
func (j *journal) file(name, commit, rel string, d doneFile) {
	if j == nil {
		return
	}
	id := d.id
	j.add(journalLine{Op: journalFile, Checkpoint: name, Commit: commit, Path: rel, Key: d.key, ID: &id, Checksum: d.checksum, ReadAt: d.readAt})
}

// flush writes out what was added. The journal is on tmpfs (/run), so it is not fsynced: a line
// lost in a crash only costs a file sent again.
func (j *journal) flush() error {
	if j == nil {
		return nil
	}
	if j.err == nil {
		j.err = j.w.Flush()
	}
	return j.err
}

// close flushes and closes the file.
func (j *journal) close() error {
	if j == nil {
		return nil
	}
	return errors.Join(j.flush(), j.f.Close())
}

// holds reports whether lc, a checkpoint on disk, still has the bytes of the version e's commit
// was made of: the same files, each the same file (device and inode) with the size and
// modification time the journal recorded. Its change time is not asked: a chmod -R or chown -R
// (at boot, of the whole checkpoint.dir) changes every file's, and none of their bytes.
func (e *journalEntry) holds(lc LocalCheckpoint) bool {
	if len(lc.Files) != len(e.files) {
		return false
	}
	for _, f := range lc.Files {
		d, ok := e.files[f.Path]
		if !ok || !d.id.sameContent(f.ID) {
			return false
		}
	}
	return true
}

// manifest returns what the journal knows of e's done commit of checkpoint name of job, when it
// knows its place in the order: its files (paths, keys, sizes, checksums) and that place, as
// the commit's manifest has them. nil otherwise.
func (e *journalEntry) manifest(job, name string) *Manifest {
	if !e.done || e.completeAt.IsZero() || ValidCommitID(e.commit) != nil {
		return nil
	}
	at := e.completeAt
	m := &Manifest{Version: ManifestVersion, Job: job, Checkpoint: name, Commit: e.commit}
	m.Timings.CompleteAt = &at
	for _, p := range slices.Sorted(maps.Keys(e.files)) {
		d := e.files[p]
		m.Files = append(m.Files, File{Path: p, Key: d.key, Size: d.id.Size, Checksum: d.checksum})
		m.TotalBytes += d.id.Size
	}
	return m
}
