package checkpoint

import (
	"context"
	"strings"
	"sync"
	"testing"
	"time"
)

// deletingStore deletes a commit, as an agent's retention does (manifest first, then its
// objects), when its prefix is first listed: between CheckJob's read of the job and its look at
// the commit.
type deletingStore struct {
	Store
	t      testing.TB
	mu     sync.Mutex
	delete map[string]*Manifest // by commit prefix
}

func (s *deletingStore) List(ctx context.Context, prefix string) ([]ObjectInfo, error) {
	s.mu.Lock()
	if m := s.delete[prefix]; m != nil {
		delete(s.delete, prefix)
		deleteAsRetention(s.t, s.Store, m)
	}
	s.mu.Unlock()
	return s.Store.List(ctx, prefix)
}

// deleteAsRetention deletes m's commit from s as an agent's retention does: the manifest first,
// then the objects, one at a time.
func deleteAsRetention(t testing.TB, s Store, m *Manifest) {
	keys := []string{ManifestKey(m.Job, m.Checkpoint, m.Commit)}
	for _, f := range m.Files {
		keys = append(keys, f.Key)
	}
	for _, k := range keys {
		if err := s.Delete(context.Background(), k); err != nil {
			t.Errorf("delete %s: %v", k, err)
		}
	}
}

// TestCheckJobWhileRetentionDeletes: a commit deleted while CheckJob looks at it (an agent
// still running the job deletes commits beyond checkpoint.keep) is no violation; a commit whose
// objects are missing while its manifest stays is. (Found from outside: `spotguard list --check`
// in a loop beside an agent with checkpoint.keep 1 reported "I2: commit ... lists ..., which is
// not in the store" for commits retention was deleting.)
func TestCheckJobWhileRetentionDeletes(t *testing.T) {
	mem := newMemStore()
	old := restoreTestCommit(t, mem, restoreTestJob, "step-000100", restoreTestT0, restoreTestFiles(1))
	torn := restoreTestCommit(t, mem, restoreTestJob, "step-000200", restoreTestT0.Add(time.Minute), restoreTestFiles(2))
	restoreTestCommit(t, mem, restoreTestJob, "step-000300", restoreTestT0.Add(2*time.Minute), restoreTestFiles(3))
	restoreTestSetLatest(t, mem, restoreTestJob, "step-000300")
	mem.remove(torn.Files[0].Key) // damage: the manifest stays
	s := &deletingStore{Store: mem, t: t, delete: map[string]*Manifest{CommitPrefix(old.Job, old.Checkpoint, old.Commit): old}}

	problems := CheckJob(t.Context(), s, restoreTestJob, true)
	if len(problems) != 1 || !strings.Contains(problems[0].Error(), "I2: commit step-000200/"+torn.Commit) {
		t.Errorf("CheckJob() = %v; want only step-000200's missing object (step-000100 was deleted while it was checked)", problems)
	}
	if len(s.delete) != 0 {
		t.Fatal("step-000100 was not deleted while CheckJob ran: the test tests nothing")
	}
}

// A manifest that lists another commit's object breaks I1, and that alone is said: only the
// commit's own prefix is listed, so the object was also said "not in the store" whether it was
// or not (found from outside).
func TestCheckCommitSaysAnObjectOutsideItsPrefixOnce(t *testing.T) {
	s := newMemStore()
	at := time.Now().Add(-time.Minute)
	older := putCommit(t, s, "step-000001", "i-a", map[string][]byte{"a.bin": []byte("a")}, at, at, nil)
	m := putCommit(t, s, "step-000002", "i-a", map[string][]byte{"a.bin": []byte("a")}, at.Add(time.Second), at.Add(time.Second), nil)
	m.Files[0].Key = older.Files[0].Key
	problems, err := checkCommit(t.Context(), s, m)
	if err != nil {
		t.Fatal(err)
	}
	var said []string
	for _, p := range problems {
		said = append(said, p.Error())
	}
	if len(said) != 2 || !strings.HasPrefix(said[0], "I1: commit step-000002/"+m.Commit+" lists "+older.Files[0].Key+" outside its prefix") ||
		!strings.HasPrefix(said[1], "I7: commit step-000002/"+m.Commit+" holds "+CommitPrefix("job", "step-000002", m.Commit)+"a.bin, which its manifest does not list") {
		t.Errorf("checkCommit = %q; want I1 for the other commit's object and I7 for its own object unlisted, nothing said missing", said)
	}
	for _, p := range said {
		if strings.Contains(p, "not in the store") {
			t.Errorf("checkCommit says %q; the object is in the store (outside the commit's prefix)", p)
		}
	}
}
