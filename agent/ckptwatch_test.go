package agent

import (
	"context"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/spotguard/spotguard/checkpoint"
)

// The scenario found from outside: checkpoint.dir deleted (rm -r, not moved) and made again. The
// watcher sees it, the agent waits for it (a /healthz warning, as for one not created yet) if it
// is not there again yet, and once it is, what is in it is read in full: step-2 is committed.
func TestDeletedCheckpointDirIsWatchedAgain(t *testing.T) {
	for _, later := range []bool{false, true} {
		t.Run(map[bool]string{false: "made_again_at_once", true: "made_again_later"}[later], func(t *testing.T) {
			tr := startShTrainer(t, true)
			dir := filepath.Join(t.TempDir(), "ck")
			if err := os.Mkdir(dir, 0o755); err != nil {
				t.Fatal(err)
			}
			storeDir := t.TempDir()
			ta := startAgentWith(t, fileStores, "SPOTGUARD_TRAINER_PIDFILE="+tr.pidfile, "SPOTGUARD_CHECKPOINT_DIR="+dir,
				"SPOTGUARD_STORE_URL=file://"+storeDir, "SPOTGUARD_STORE_JOB=j")
			store := mustFileStore(t, storeDir)
			committed := func() []string {
				cs, _, err := checkpoint.ListCommitted(context.Background(), store, "j")
				if err != nil {
					return nil
				}
				var names []string
				for _, c := range cs {
					names = append(names, c.Manifest.Checkpoint)
				}
				slices.Sort(names)
				return names
			}
			write := func(ckpt string) {
				t.Helper()
				if err := os.MkdirAll(filepath.Join(dir, ckpt), 0o755); err != nil {
					t.Fatal(err)
				}
				for name, data := range map[string]string{"a": "weights of " + ckpt} {
					if err := os.WriteFile(filepath.Join(dir, ckpt, name), []byte(data), 0o644); err != nil {
						t.Fatal(err)
					}
				}
				if err := os.WriteFile(filepath.Join(dir, ckpt, "_COMPLETE"), nil, 0o644); err != nil {
					t.Fatal(err)
				}
			}
			write("step-1")
			eventually(t, "step-1 to be committed", func() bool { return slices.Equal(committed(), []string{"step-1"}) })

			if err := os.RemoveAll(dir); err != nil {
				t.Fatal(err)
			}
			if later {
				eventually(t, "the agent to wait for checkpoint.dir", func() bool {
					ok, reason := ta.a.ckptWatcher.health()
					return ok && strings.Contains(reason, "was removed; waiting for it to be made again")
				})
				v := ta.a.health(time.Now())
				if !slices.ContainsFunc(v.Warnings, func(w string) bool { return strings.Contains(w, "waiting for it to be made again") }) {
					t.Errorf("health warnings %q; want checkpoint.dir being waited for", v.Warnings)
				}
			}
			if err := os.Mkdir(dir, 0o755); err != nil {
				t.Fatal(err)
			}
			write("step-2")
			eventually(t, "step-2 to be committed", func() bool { return slices.Equal(committed(), []string{"step-1", "step-2"}) })
			if n := strings.Count(ta.logs.String(), "checkpoint directory was removed or moved"); n != 1 {
				t.Errorf("%q logged %d times; want once", "checkpoint directory was removed or moved", n)
			}
			if ok, reason := ta.a.ckptWatcher.health(); !ok || reason != "" {
				t.Errorf("checkpoint watch health = %v %q; want watching", ok, reason)
			}
		})
	}
}

// unwatchedWatcher is a checkpoint watcher that is in place and then passes on, as the real one
// does past the inotify watch limit, what it says about the directories it cannot watch.
type unwatchedWatcher struct {
	cfg  checkpoint.WatchConfig
	says <-chan string
}

func (u unwatchedWatcher) Run(ctx context.Context, out chan<- checkpoint.WatchEvent) error {
	u.cfg.Ready()
	if u.cfg.ReadDone { // an empty directory, read
		select {
		case out <- checkpoint.WatchEvent{Kind: checkpoint.ReadDone, At: time.Now()}:
		case <-ctx.Done():
			return nil
		}
	}
	for {
		select {
		case <-ctx.Done():
			return nil
		case p := <-u.says:
			u.cfg.Unwatched(p)
		}
	}
}

// Directories the watcher cannot watch (past the inotify watch limit; it polls them) are a
// /healthz warning with what the watcher says, naming the limit, until every one is watched
// again; the agent stays healthy on their account.
func TestUnwatchedDirectoriesAreAHealthWarning(t *testing.T) {
	tr := startShTrainer(t, true)
	says := make(chan string)
	ta := startAgentWith(t, func(d *Deps) {
		fileStores(d)
		d.NewCheckpointWatcher = func(cfg checkpoint.WatchConfig) (CheckpointWatcher, error) {
			return unwatchedWatcher{cfg: cfg, says: says}, nil
		}
	}, "SPOTGUARD_TRAINER_PIDFILE="+tr.pidfile, "SPOTGUARD_CHECKPOINT_DIR="+t.TempDir(),
		"SPOTGUARD_STORE_URL=file://"+t.TempDir(), "SPOTGUARD_STORE_JOB=j")
	const problem = "3 directories of checkpoint.dir cannot be watched: the inotify watch limit (fs.inotify.max_user_watches) is reached"
	says <- problem
	warned := func(v healthVerdict) bool {
		return slices.ContainsFunc(v.Warnings, func(w string) bool { return strings.Contains(w, problem) })
	}
	eventually(t, "the warning", func() bool { return warned(ta.a.health(time.Now())) })
	v := ta.a.health(time.Now())
	if slices.ContainsFunc(v.Reasons, func(r string) bool { return strings.Contains(r, "inotify") }) {
		t.Errorf("health reasons %q; want the watch limit only as a warning", v.Reasons)
	}
	says <- ""
	eventually(t, "the warning to go", func() bool { return !warned(ta.a.health(time.Now())) })
	if ok, reason := ta.a.ckptWatcher.health(); !ok || reason != "" {
		t.Errorf("checkpoint watch health = %v %q; want watching", ok, reason)
	}
}

// A stop waits for the first read of checkpoint.dir (a complete checkpoint there is drained),
// but not for a directory that is not there: the watch says there is nothing to read, and the
// stop is at once.
func TestStopWithCheckpointDirMissingIsAtOnce(t *testing.T) {
	tr := startShTrainer(t, true)
	ta := startAgentWith(t, fileStores, "SPOTGUARD_TRAINER_PIDFILE="+tr.pidfile,
		"SPOTGUARD_CHECKPOINT_DIR="+filepath.Join(t.TempDir(), "not-yet"), "SPOTGUARD_STORE_URL=file://"+t.TempDir(), "SPOTGUARD_STORE_JOB=j")
	eventually(t, "the watch to wait for checkpoint.dir", func() bool {
		_, reason := ta.a.ckptWatcher.health()
		return strings.Contains(reason, "to be created")
	})
	ta.cancel()
	select {
	case err := <-ta.done:
		ta.done <- err // for the cleanup
	case <-time.After(10 * time.Second):
		t.Fatalf("the stop waits with checkpoint.dir missing (the stop budget is %s)\n%s", ta.a.cfg.Load().Agent.StopBudget, ta.logs)
	}
}
