package main

import (
	"context"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/spotguard/spotguard/checkpoint"
)

// countingStore counts the reads of a store by kind: whole-object reads by key, and listings.
type countingStore struct {
	checkpoint.Store
	mu    sync.Mutex
	gets  map[string]int
	lists int
}

func (s *countingStore) GetBytes(ctx context.Context, key string) ([]byte, string, error) {
	s.mu.Lock()
	s.gets[key]++
	s.mu.Unlock()
	return s.Store.GetBytes(ctx, key)
}

func (s *countingStore) ListDir(ctx context.Context, prefix string) ([]string, []checkpoint.ObjectInfo, error) {
	s.mu.Lock()
	if prefix == "j/" {
		s.lists++
	}
	s.mu.Unlock()
	return s.Store.ListDir(ctx, prefix)
}

// `spotguard list` read the whole job twice (the list, then the saves waiting for parts), and
// `list --check` three times: each manifest and LATEST read that often, against store-layout.md's
// one reading (I8). Each is read once now.
func TestListReadsTheJobOnce(t *testing.T) {
	store, cfgPath, env := restoreEnv(t)
	commitForTest(t, store, "j", "step-000100", map[string][]byte{"model.pt": []byte("a"), "_COMPLETE": nil})
	commitForTest(t, store, "j", "step-000200", map[string][]byte{"model.pt": []byte("b"), "_COMPLETE": nil})
	for _, args := range [][]string{{"list"}, {"list", "--check"}, {"list", "--json"}} {
		var cs *countingStore
		open := openStoreToRead
		openStoreToRead = func(ctx context.Context, url, imdsEndpoint string, opts checkpoint.S3Options) (checkpoint.Store, error) {
			s, err := open(ctx, url, imdsEndpoint, opts)
			if err != nil {
				return nil, err
			}
			cs = &countingStore{Store: s, gets: map[string]int{}}
			return cs, nil
		}
		code, stdout, stderr := runCLI(t, t.Context(), env, append(args, "--config", cfgPath)...)
		openStoreToRead = open
		// (No LATEST here: --check says so, exit 1.)
		if code != exitOK && (args[len(args)-1] != "--check" || code != exitFail) || !strings.Contains(stdout, "step-000200") {
			t.Fatalf("%v: exit %d, stdout %q, stderr %q", args, code, stdout, stderr)
		}
		manifests := 0
		for key, n := range cs.gets {
			if n > 1 {
				t.Errorf("%v read %s %d times; want once", args, key, n)
			}
			if strings.HasSuffix(key, "/manifest.json") {
				manifests++
			}
		}
		if manifests != 2 || cs.gets["j/LATEST"] != 1 || cs.lists != 1 {
			t.Errorf("%v: %d manifests read, LATEST %d times, the job listed %d times; want 2, 1, 1", args, manifests, cs.gets["j/LATEST"], cs.lists)
		}
	}
}

// slowStore answers the job's listing after wait.
type slowStore struct {
	checkpoint.Store
	wait time.Duration
}

func (s *slowStore) ListDir(ctx context.Context, prefix string) ([]string, []checkpoint.ObjectInfo, error) {
	select {
	case <-time.After(s.wait):
	case <-ctx.Done():
		return nil, nil, ctx.Err()
	}
	return s.Store.ListDir(ctx, prefix)
}

// A store that does not answer: list said nothing until the S3 client's attempts failed, 214 s
// later (found from outside). It says it is waiting, and then lists as usual.
func TestListSaysAStoreThatDoesNotAnswer(t *testing.T) {
	store, cfgPath, env := restoreEnv(t)
	commitForTest(t, store, "j", "step-000100", map[string][]byte{"model.pt": []byte("a"), "_COMPLETE": nil})
	defer func(d time.Duration) { listSlowRead = d }(listSlowRead)
	listSlowRead = 10 * time.Millisecond
	open := openStoreToRead
	defer func() { openStoreToRead = open }()
	openStoreToRead = func(ctx context.Context, url, imdsEndpoint string, opts checkpoint.S3Options) (checkpoint.Store, error) {
		s, err := open(ctx, url, imdsEndpoint, opts)
		return &slowStore{Store: s, wait: 5 * listSlowRead}, err // the timer runs out during the listing
	}
	code, stdout, stderr := runCLI(t, t.Context(), env, "list", "--config", cfgPath)
	if code != exitOK || !strings.Contains(stdout, "step-000100") || !strings.Contains(stderr, "the store has not answered for") {
		t.Errorf("list with a store answering late: exit %d, stdout %q, stderr %q; want the list, and a line that it waited", code, stdout, stderr)
	}
}

// `list` of a job with nothing in the store names the jobs that are there, as restore does: a
// mistyped store.job listed nothing and exit 0, with no hint (found from outside).
func TestListOfAnEmptyJobNamesTheOtherJobs(t *testing.T) {
	store, cfgPath, env := restoreEnv(t)
	commitForTest(t, store, "j", "step-000100", map[string][]byte{"model.pt": []byte("a"), "_COMPLETE": nil})
	fs, err := checkpoint.NewFileStore(store)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := fs.PutBytes(t.Context(), checkpoint.LatestKey("j"), []byte(`{"checkpoint":"step-000100"}`), checkpoint.Cond{}); err != nil {
		t.Fatal(err)
	}
	code, stdout, stderr := runCLI(t, t.Context(), env, "list", "--config", cfgPath, "--store.job", "k")
	if code != exitOK || !strings.Contains(stdout, "no committed checkpoint of job k") ||
		!strings.Contains(stdout, `the store holds the checkpoints of other jobs: "j" (is store.job the training run's name?)`) {
		t.Errorf("list --store.job k: exit %d, stdout %q, stderr %q; want exit 0 naming job j", code, stdout, stderr)
	}
}
