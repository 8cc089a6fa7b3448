package checkpoint

import (
	"errors"
	"strings"
	"testing"
)

// A store that takes the manifest but not LATEST (a policy on the key, a read of it that breaks):
// the checkpoint is committed (the manifest is the commit; restore takes it), but the commit's
// report waited for LATEST, retried inside it for as long as it failed, so the notice stayed
// "checkpoint written", a stop spent its whole budget on it, and the agent's health never heard
// of the failures (found from outside). The commit is reported at once; LATEST is retried apart,
// each failure reported (LatestFailed) and logged once while it fails alike, and its move is
// reported (LatestMoved).
func TestLatestThatCannotBeMovedDoesNotHoldTheCommit(t *testing.T) {
	dir, store := t.TempDir(), newMemStore()
	denied := errors.New("AccessDenied: Access Denied (HTTP 403)")
	store.failKey(LatestKey("job"), denied)
	r := startUploaderWith(t, dir, store, UploaderConfig{StopBudget: -1})
	writeCheckpoint(t, dir, "step-1", map[string][]byte{"a": randomBytes(t, 8<<10)})
	if ev := r.waitCommitted("step-1"); ev.Manifest == nil {
		t.Fatal("committed without its manifest")
	}
	for range 3 {
		if ev := r.waitEvent(LatestFailed, "step-1"); !errors.Is(ev.Err, denied) || ev.Manifest == nil {
			t.Fatalf("LatestFailed = %+v; want the store's error and the commit", ev)
		}
	}
	if n := strings.Count(r.logs.String(), "LATEST cannot be moved"); n != 1 {
		t.Errorf("%d lines say LATEST cannot be moved after 3 failures alike; want 1:\n%s", n, r.logs)
	}
	store.mu.Lock()
	delete(store.fail, LatestKey("job"))
	store.mu.Unlock()
	r.waitEvent(LatestMoved, "step-1")
	if data, _, err := store.GetBytes(t.Context(), LatestKey("job")); err != nil || !strings.Contains(string(data), `"checkpoint":"step-1"`) {
		t.Errorf("LATEST = %s, %v; want step-1", data, err)
	}
}
