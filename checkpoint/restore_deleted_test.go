package checkpoint

import (
	"context"
	"errors"
	"fmt"
	"io"
	"os"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/rs/zerolog"
)

// rotatingStore is a store that an agent still running the job writes to while a restore reads
// it, with checkpoint.keep 1: at the first download of the commit it holds as newest, it commits a
// newer checkpoint and then deletes that commit as retention does (manifest first, then data),
// rotations times.
type rotatingStore struct {
	Store
	t         testing.TB
	mu        sync.Mutex
	newest    *Manifest
	step      int
	rotations int
	deleted   []string // commits deleted, in order
}

func newRotatingStore(t testing.TB, s Store, rotations int) *rotatingStore {
	r := &rotatingStore{Store: s, t: t, step: 100, rotations: rotations}
	r.newest = restoreTestCommitTo(t, s, restoreTestJob, fmt.Sprintf("step-%06d", r.step), restoreTestT0, restoreTestFiles(uint64(r.step)))
	return r
}

func (r *rotatingStore) Download(ctx context.Context, key string, w io.WriterAt, size int64) error {
	r.mu.Lock()
	if m := r.newest; r.rotations > 0 && strings.HasPrefix(key, DataKey(m.Job, m.Checkpoint, m.Commit, "")) {
		r.rotations--
		r.step += 100
		at := restoreTestT0.Add(time.Duration(r.step) * time.Second)
		r.newest = restoreTestCommitTo(r.t, r.Store, restoreTestJob, fmt.Sprintf("step-%06d", r.step), at, restoreTestFiles(uint64(r.step)))
		deleteAsRetention(r.t, r.Store, m)
		r.deleted = append(r.deleted, m.Commit)
	}
	r.mu.Unlock()
	return r.Store.Download(ctx, key, w, size)
}

func (r *rotatingStore) state() (newest *Manifest, deleted []string) {
	r.mu.Lock()
	defer r.mu.Unlock()
	return r.newest, append([]string(nil), r.deleted...)
}

// TestRestoreCommitDeletedMidwayRestoresTheNewest: a restore of the newest commit while an agent
// still running the job commits a newer one and its retention (keep 1) deletes the one being
// restored restores the newer one, with a warning: the deleted commit is no damage, and the
// newest complete checkpoint is what was asked for. (Found from outside: spotguard restore of a
// 3 GiB checkpoint while the job's agent, with checkpoint.keep 1, committed a newer one failed
// with "the commit is damaged in the store".) Against memory and against a real S3 server.
func TestRestoreCommitDeletedMidwayRestoresTheNewest(t *testing.T) {
	for _, tc := range []struct {
		name  string
		store func(t *testing.T) Store
	}{
		{"memory", func(t *testing.T) Store { return newMemStore() }},
		{"s3", func(t *testing.T) Store {
			p := s3StartPeer(t)
			return p.openS3(t, p.endpoint, "pfx", S3Options{})
		}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			s := newRotatingStore(t, tc.store(t), 2)
			parent, to := restoreTestDirs(t)
			log := &rigLog{}
			res, err := Restore(t.Context(), s, RestoreOptions{Job: restoreTestJob, To: to, Logger: zerolog.New(log)})
			if err != nil {
				t.Fatalf("Restore() error: %v; want the newest commit restored (log: %s)", err, log.String())
			}
			newest, deleted := s.state()
			if res.Checkpoint != newest.Checkpoint || res.Commit != newest.Commit || res.Deleted != 2 {
				t.Errorf("restored %s commit %s after %d deleted; want the newest, %s commit %s, after 2", res.Checkpoint, res.Commit, res.Deleted, newest.Checkpoint, newest.Commit)
			}
			if d := restoreTestDiff(restoreTestTree(t, res.Dir), restoreTestWant(restoreTestFiles(300))); d != "" {
				t.Errorf("restored tree differs from step-000300:%s", d)
			}
			if names := restoreTestNames(t, parent); len(names) != 1 || names[0] != "restore" {
				t.Errorf("the destination's parent holds %v; want only the destination", names)
			}
			if names := restoreTestNames(t, to); len(names) != 1 || names[0] != "step-000300" {
				t.Errorf("the destination holds %v; want only step-000300 (no staging left)", names)
			}
			warned := 0
			for _, l := range strings.Split(log.String(), "\n") {
				if strings.Contains(l, "the commit being restored was deleted from the store") {
					warned++
				}
			}
			if warned != 2 || len(deleted) != 2 || !strings.Contains(log.String(), deleted[0]) || !strings.Contains(log.String(), deleted[1]) {
				t.Errorf("%d warnings for deleted commits %v; want one naming each (log: %s)", warned, deleted, log.String())
			}
		})
	}
}

// TestRestoreCommitDeletedMidwayFails: a commit asked for by its id that is deleted while it is
// restored, and a newest commit deleted every time a restore starts on it, fail saying so: they
// are no damage in the store, and nothing is left in the destination.
func TestRestoreCommitDeletedMidwayFails(t *testing.T) {
	tests := []struct {
		name      string
		rotations int
		commitSet bool
		named     bool // --checkpoint without --commit
		wants     []string
	}{
		{"commit asked for", 1, true, false, []string{`checkpoint "step-000100" commit`, "was deleted from the store while it was restored", "spotguard list"}},
		// Said as a delete, not as "has no valid manifest" (found from outside).
		{"checkpoint asked for, its only commit deleted", 1, false, true, []string{`checkpoint "step-000100": its commit`, "was deleted from the store while it was restored",
			"it has no other", "spotguard list"}},
		{"deleted faster than restored", restoreDeletedTries, false, false, []string{
			fmt.Sprintf(`checkpoint "step-%06d" commit`, restoreDeletedTries*100), "the newest commit, was deleted from the store while it was restored",
			fmt.Sprintf("so were the %d newest before it", restoreDeletedTries-1), "raise its checkpoint.keep"}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			s := newRotatingStore(t, newMemStore(), tt.rotations)
			parent, to := restoreTestDirs(t)
			before := restoreTestTree(t, parent)
			opts := RestoreOptions{Job: restoreTestJob, To: to, Logger: zerolog.Nop()}
			if tt.commitSet {
				opts.Checkpoint, opts.Commit, opts.CommitSet = s.newest.Checkpoint, s.newest.Commit, true
			}
			if tt.named {
				opts.Checkpoint = s.newest.Checkpoint
			}
			_, err := Restore(t.Context(), s, opts)
			if err == nil {
				t.Fatal("Restore() succeeded; want an error")
			}
			if errors.Is(err, ErrDamaged) {
				t.Errorf("Restore() = %v; want no ErrDamaged: a deleted commit is no damage", err)
			}
			for _, want := range append(tt.wants, restoreTestJob, "mem://bucket/prefix") {
				if !strings.Contains(err.Error(), want) {
					t.Errorf("Restore() = %v; want it to contain %q", err, want)
				}
			}
			if d := restoreTestDiff(restoreTestTree(t, parent), before); d != "" {
				t.Errorf("the failed restore left something behind:%s", d)
			}
		})
	}
}

// A manifest that says a file is far larger than its object does not get that space allocated
// before the download finds the object's size (found from outside: 2 GiB allocated for an object
// of 6 bytes, before the restore said the commit was damaged). The restore fails as damaged.
func TestRestoreAllocatesNothingForAnObjectOfAnotherSize(t *testing.T) {
	var allocated atomic.Int64
	defer func(f func(*os.File, int64) error) { restoreAllocate = f }(restoreAllocate)
	restoreAllocate = func(f *os.File, size int64) error { allocated.Add(size); return allocateFile(f, size) }
	s := newMemStore()
	m := restoreTestManifest(t, restoreTestJob, "step-000100", restoreTestT0, map[string]string{"a.bin": "sixbyt"})
	for _, f := range m.Files {
		s.put(f.Key, []byte("sixbyt"))
	}
	for i := range m.Files {
		if m.Files[i].Path == "a.bin" {
			m.TotalBytes += 2<<30 - m.Files[i].Size
			m.Files[i].Size = 2 << 30
		}
	}
	restoreTestPutJSON(t, s, ManifestKey(restoreTestJob, "step-000100", m.Commit), m)
	_, to := restoreTestDirs(t)
	_, err := Restore(t.Context(), s, RestoreOptions{Job: restoreTestJob, To: to, Logger: zerolog.Nop()})
	if !errors.Is(err, ErrDamaged) {
		t.Errorf("Restore() = %v; want ErrDamaged", err)
	}
	if n := allocated.Load(); n >= 2<<30 {
		t.Errorf("allocated %d bytes; want none of the 2 GiB the manifest says", n)
	}
}
