package main

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"slices"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/spotguard/spotguard/checkpoint"
)

// restoreEnv is a file:// store with job j for restore tests, and its configuration file.
func restoreEnv(t *testing.T) (store, cfgPath string, env []string) {
	t.Helper()
	store = t.TempDir()
	return store, emptyConfigFile(t), []string{"SPOTGUARD_STORE_URL=file://" + store, "SPOTGUARD_STORE_JOB=j"}
}

// A destination restore cannot write is the destination's problem, said with a local fix naming
// it: a read-only or unwritable --to used to get the store's fix (an IAM policy for s3://, the
// permissions of the store's directory for file://).
func TestRestoreToAnUnwritableDestinationNamesIt(t *testing.T) {
	store, cfgPath, env := restoreEnv(t)
	commitForTest(t, store, "j", "step-000100", map[string][]byte{"model.pt": []byte("weights"), "_COMPLETE": nil})
	file := filepath.Join(t.TempDir(), "file")
	if err := os.WriteFile(file, nil, 0o644); err != nil {
		t.Fatal(err)
	}
	readOnly := filepath.Join(t.TempDir(), "ro")
	if err := os.Mkdir(readOnly, 0o555); err != nil {
		t.Fatal(err)
	}
	for _, tc := range []struct {
		name, to, want string
		notRoot        bool // root writes into a directory whatever its mode
	}{
		{"under a regular file", filepath.Join(file, "ckpt"), "fix: cannot write the destination " + filepath.Join(file, "ckpt") + " (not a directory)", false},
		{"without write permission", readOnly, "cannot write the destination " + readOnly + " (permission denied): fix its owner or permissions", true},
	} {
		t.Run(tc.name, func(t *testing.T) {
			if tc.notRoot && asNobody(t) {
				return
			}
			code, _, stderr := runCLI(t, t.Context(), env, "restore", "--config", cfgPath, "--to", tc.to)
			if code != exitFail || !strings.Contains(stderr, tc.want) {
				t.Errorf("Got(restore --to %s) exit %d, stderr:\n%s\nwant 1 and %q", tc.to, code, stderr, tc.want)
			}
			for _, wrong := range []string{"s3:", "cannot write " + store, store + " is a writable directory"} {
				if strings.Contains(stderr, wrong) {
					t.Errorf("Got(restore --to %s) stderr:\n%s\nwant no fix for the store (%q): it is not the store's problem", tc.to, stderr, wrong)
				}
			}
		})
	}
}

// The errors of the destination's file system (a read-only mount, no permission, a full disk,
// as Restore returns them) get a local fix naming the destination, for an S3 store and a file://
// store alike; the store's errors keep the store's fix.
func TestRestoreHintTellsTheDestinationFromTheStore(t *testing.T) {
	const dir = "/mnt/nvme/ckpt"
	restoreErr := func(err error) error {
		return fmt.Errorf("restore job j from s3://b/p: checkpoint %q: %w", "step-000300", err)
	}
	for _, tc := range []struct {
		name string
		err  error
		need int64
		free diskSpace
		want string
	}{
		{"read-only", restoreErr(fmt.Errorf("create staging directory: %w",
			&fs.PathError{Op: "mkdirat", Path: ".spotguard-restore-19586-ABC", Err: syscall.EROFS})), 0, diskSpace{},
			"cannot write the destination " + dir + " (read-only file system): mount it read-write, or choose another --to"},
		{"permission denied", restoreErr(fmt.Errorf("create destination: %w",
			&fs.PathError{Op: "mkdir", Path: dir, Err: syscall.EACCES})), 0, diskSpace{},
			"cannot write the destination " + dir + " (permission denied): fix its owner or permissions"},
		{"disk full", restoreErr(fmt.Errorf("allocate file %q (%d bytes): %w", "shard-3.bin", 20<<20,
			&fs.PathError{Op: "fallocate", Path: dir + "/.spotguard-restore-1-X/shard-3.bin", Err: syscall.ENOSPC})), 80 << 20, diskSpace{ok: true, bytes: 50 << 20, inodes: 1000},
			"the destination " + dir + " is too small: the checkpoint needs 80.0 MiB and 50.0 MiB is free (df -h " + dir + ")"},
		{"no inodes", restoreErr(fmt.Errorf("create file %q: %w", "d19/f00019",
			&fs.PathError{Op: "openat", Path: "d19/f00019", Err: syscall.ENOSPC})), 1 << 20, diskSpace{ok: true, bytes: 50 << 20},
			"has no inode left for another file (df -i " + dir + ")"},
		{"a write in a download", restoreErr(fmt.Errorf("download file %q: %w", "a.bin", markStore(fmt.Errorf("download j/a: %w",
			&destinationFailure{&fs.PathError{Op: "write", Path: "a.bin", Err: syscall.ENOSPC}})))), 80 << 20, diskSpace{ok: true, bytes: 10 << 20, inodes: 5},
			"the checkpoint needs 80.0 MiB and 10.0 MiB is free"},
	} {
		for _, url := range []string{"s3://b/p", "file:///srv/store"} {
			t.Run(tc.name+"/"+strings.SplitN(url, ":", 2)[0], func(t *testing.T) {
				var b strings.Builder
				restoreHint(&b, url, dir, tc.err, "", tc.need, func(string) diskSpace { return tc.free })
				got := b.String()
				if !strings.Contains(got, "spotguard restore: fix: ") || !strings.Contains(got, tc.want) {
					t.Errorf("Got(restoreHint(%v)) = %q; want %q", tc.err, got, tc.want)
				}
				for _, wrong := range []string{"s3:ListBucket", "/srv/store"} {
					if strings.Contains(got, wrong) {
						t.Errorf("Got(restoreHint(%v)) = %q; want no fix for the store (%q)", tc.err, got, wrong)
					}
				}
			})
		}
	}

	// A store's own error, a file store's permission denied included, keeps the store's fix.
	storeErr := restoreErr(markStore(&fs.PathError{Op: "openat", Path: "j/LATEST", Err: syscall.EACCES}))
	var b strings.Builder
	restoreHint(&b, "file:///srv/store", dir, storeErr, "", 0, freeSpace)
	if want := "fix: the agent cannot write /srv/store"; !strings.Contains(b.String(), want) || strings.Contains(b.String(), dir) {
		t.Errorf("Got(restoreHint(%v)) = %q; want %q and not the destination", storeErr, b.String(), want)
	}
}

// A full destination may be full of saves that earlier restores moved aside (an incomplete or
// older save of the checkpoint's name, kept for the user to look at, one per restore): the fix
// says which, and how much they take. Other errors do not list them.
func TestRestoreHintNamesTheSavesMovedAside(t *testing.T) {
	dir := t.TempDir()
	torn := filepath.Join(dir, ".spotguard-incomplete-step-000100-20261206T000000Z")
	older := filepath.Join(dir, ".spotguard-older-last.pt-20261206T000000Z")
	for p, data := range map[string]string{
		filepath.Join(torn, "optim", "__0_0.distcp"): "abc",
		older: "12345",
		filepath.Join(dir, ".spotguard-restore-1-X", "model.pt"): "a staging directory is no save",
		filepath.Join(dir, "step-000100", "model.pt"):            "a checkpoint",
	} {
		if err := os.MkdirAll(filepath.Dir(p), 0o755); err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(p, []byte(data), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	full := fmt.Errorf("restore job j from s3://b/p: checkpoint %q: %w", "step-000200",
		&fs.PathError{Op: "fallocate", Path: dir + "/.spotguard-restore-2-Y/model.pt", Err: syscall.ENOSPC})
	var b strings.Builder
	restoreHint(&b, "s3://b/p", dir, full, "", 1<<30, func(string) diskSpace { return diskSpace{ok: true, bytes: 1 << 20, inodes: 100} })
	if want := "2 saves that earlier restores moved aside take 8 B there (" + torn + ", " + older + "): delete what you have looked at"; !strings.Contains(b.String(), want) {
		t.Errorf("Got(restoreHint(a full disk)) = %q; want %q", b.String(), want)
	}
	b.Reset()
	restoreHint(&b, "s3://b/p", dir, fmt.Errorf("create destination: %w", &fs.PathError{Op: "mkdir", Path: dir, Err: syscall.EROFS}), "", 0, freeSpace)
	if strings.Contains(b.String(), "moved aside") {
		t.Errorf("Got(restoreHint(a read-only disk)) = %q; want no list of saves moved aside", b.String())
	}
}

// freeSpace reads the file system of the nearest directory that exists.
func TestFreeSpaceOfADirectoryNotCreatedYet(t *testing.T) {
	if got := freeSpace(filepath.Join(t.TempDir(), "not", "yet")); !got.ok || got.bytes == 0 {
		t.Errorf("Got(freeSpace(a missing directory in TempDir)) = %+v; want the space of TempDir's file system", got)
	}
}

// asNobody, in a test run as root (which writes into a directory whatever its mode), runs the
// test t again as uid and gid 65534, in a copy of this test binary that user may run, and makes
// t pass, fail or skip as it did; it returns true, and the caller returns. As any other user it
// returns false, and the caller goes on.
func asNobody(t *testing.T) bool {
	t.Helper()
	if os.Geteuid() != 0 {
		return false
	}
	if os.Getenv("SPOTGUARD_TEST_AS_NOBODY") != "" {
		t.Fatal("still root as uid 65534")
	}
	exe, err := os.Executable()
	if err != nil {
		t.Fatal(err)
	}
	dir, err := os.MkdirTemp("", "spotguard-nobody-")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { os.RemoveAll(dir) })
	tmp := filepath.Join(dir, "tmp")
	if err := os.Chmod(dir, 0o755); err != nil {
		t.Fatal(err)
	}
	if err := os.Mkdir(tmp, 0o777); err != nil || os.Chmod(tmp, 0o1777) != nil {
		t.Fatalf("a TMPDIR for uid 65534: %v", err)
	}
	bin := filepath.Join(dir, "test")
	data, err := os.ReadFile(exe)
	if err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(bin, data, 0o755); err != nil {
		t.Fatal(err)
	}
	var run []string
	for _, el := range strings.Split(t.Name(), "/") {
		run = append(run, "^"+regexp.QuoteMeta(el)+"$")
	}
	cmd := exec.CommandContext(t.Context(), bin, "-test.run", strings.Join(run, "/"), "-test.v", "-test.count=1")
	cmd.Dir = dir
	cmd.Env = append(os.Environ(), "SPOTGUARD_TEST_AS_NOBODY=1", "TMPDIR="+tmp, "HOME="+tmp)
	cmd.SysProcAttr = &syscall.SysProcAttr{Credential: &syscall.Credential{Uid: 65534, Gid: 65534}}
	out, err := cmd.CombinedOutput()
	var exit *exec.ExitError
	switch {
	case err != nil && !errors.As(err, &exit):
		t.Skipf("cannot run the test as uid 65534: %v", err)
	case strings.Contains(string(out), "--- SKIP: "+t.Name()+" "):
		t.Skipf("as uid 65534:\n%s", out)
	case err != nil || !strings.Contains(string(out), "--- PASS: "+t.Name()+" "):
		t.Errorf("as uid 65534: %v\n%s", err, out)
	}
	return true
}

// hurryStore counts Hurry calls.
type hurryStore struct {
	checkpoint.Store
	hurried int
}

func (h *hurryStore) Hurry() { h.hurried++ }

// restoreSource keeps the store's Hurry, which checkpoint.Restore calls so that a store sends
// the restore's requests at full speed: the wrapper must not hide it.
func TestRestoreSourceHurriesTheStore(t *testing.T) {
	h := &hurryStore{}
	var s checkpoint.Store = restoreSource{h}
	hs, ok := s.(interface{ Hurry() })
	if !ok {
		t.Fatal("Got(restoreSource has Hurry) = false; want true")
	}
	if hs.Hurry(); h.hurried != 1 {
		t.Errorf("Got(hurried) = %d; want 1", h.hurried)
	}
}

// cancelOnWrite is a stderr that cancels the command's context with cause at its first write: a
// signal arriving at that point of the command.
type cancelOnWrite struct {
	mu     sync.Mutex
	buf    bytes.Buffer
	cancel context.CancelCauseFunc
	cause  error
}

func (c *cancelOnWrite) Write(p []byte) (int, error) {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.cancel(c.cause)
	return c.buf.Write(p)
}

// A restore that SIGINT or SIGTERM ends says it was interrupted, by which signal (exit 1, as
// any failed restore), not "context canceled", and leaves nothing in --to.
func TestRestoreInterruptedSaysInterrupted(t *testing.T) {
	store, cfgPath, env := restoreEnv(t)
	commitForTest(t, store, "j", "step-000100", map[string][]byte{"model.pt": []byte("weights"), "_COMPLETE": nil})
	for _, tc := range []struct {
		name   string
		before bool // the signal came before the restore started
	}{
		// No LATEST: the restore's first line on stderr is its warning that it takes the newest
		// commit, which it then downloads. The signal comes with that line.
		{"during the restore", false},
		{"before the restore", true},
	} {
		t.Run(tc.name, func(t *testing.T) {
			ctx, cancel := context.WithCancelCause(t.Context())
			defer cancel(nil)
			cause := errors.New("interrupt signal received") // as signal.NotifyContext's
			if tc.before {
				cancel(cause)
			}
			stderr := &cancelOnWrite{cancel: cancel, cause: cause}
			to := t.TempDir()
			var stdout bytes.Buffer
			code := run(ctx, []string{"restore", "--config", cfgPath, "--to", to}, env, &stdout, stderr)
			got := stderr.buf.String()
			if want := "spotguard restore: interrupted (interrupt signal received); no checkpoint was put in " + to; code != exitFail ||
				!strings.Contains(got, want) || strings.Contains(got, "context canceled") {
				t.Errorf("Got(restore, interrupted) exit %d, stderr:\n%s\nwant 1 and %q, not \"context canceled\"", code, got, want)
			}
			if left, err := os.ReadDir(to); err != nil || len(left) != 0 {
				t.Errorf("Got(--to after an interrupted restore) = %v, %v; want it empty", left, err)
			}
		})
	}
}

// A --checkpoint or --commit that cannot be a name or a commit id is a usage error (exit 2, with
// the hint line), as docs/cli.md says of usage errors; it used to be exit 1 without the hint. One
// that is valid but not in the store is still exit 1.
func TestRestoreRefusesAnInvalidCheckpointOrCommitAsUsage(t *testing.T) {
	_, cfgPath, env := restoreEnv(t)
	for _, args := range [][]string{
		{"--checkpoint", "../x"},
		{"--checkpoint", "a/b"},
		{"--checkpoint", "LATEST"},
		{"--checkpoint", "_spotguard"},
		{"--checkpoint", "step-1", "--commit", "nope"},
	} {
		t.Run(strings.Join(args, " "), func(t *testing.T) {
			code, stdout, stderr := runCLI(t, t.Context(), env, append([]string{"restore", "--config", cfgPath, "--to", t.TempDir()}, args...)...)
			flag := args[len(args)-2]
			if code != exitUsage || stdout != "" || !strings.Contains(stderr, "spotguard restore: "+flag+" ") ||
				!strings.HasSuffix(stderr, "run 'spotguard restore -h' for its flags\n") {
				t.Errorf("Got(restore %s) exit %d, stderr:\n%s\nwant 2, naming %s, and the hint line", strings.Join(args, " "), code, stderr, flag)
			}
		})
	}
	code, _, stderr := runCLI(t, t.Context(), env, "restore", "--config", cfgPath, "--to", t.TempDir(), "--checkpoint", "nope")
	if code != exitFail {
		t.Errorf("Got(restore --checkpoint nope) exit %d, stderr:\n%s\nwant 1: a valid name that is not there is no usage error", code, stderr)
	}
}

// What is in the way at --to/<checkpoint> is said in words ("a symbolic link"), not as Go's mode
// string ("L---------").
func TestRestoreSaysWhatIsInTheWayInWords(t *testing.T) {
	store, cfgPath, env := restoreEnv(t)
	commitForTest(t, store, "j", "step-000100", map[string][]byte{"model.pt": []byte("weights"), "_COMPLETE": nil})
	commitForTest(t, store, "j", "model.pt", map[string][]byte{"model.pt": []byte("weights")}) // a single-file checkpoint
	for _, tc := range []struct {
		name, checkpoint, want string
		make                   func(path string) error
	}{
		{"symlink", "step-000100", "(a symbolic link)", func(p string) error { return os.Symlink("/nowhere", p) }},
		{"file", "step-000100", "(a regular file)", func(p string) error { return os.WriteFile(p, nil, 0o644) }},
		{"symlink for a single file", "model.pt", "(a symbolic link)", func(p string) error { return os.Symlink("/nowhere", p) }},
		{"symlink inside", "step-000100", `"model.pt" is not a regular file (a symbolic link)`, func(p string) error {
			if err := os.Mkdir(p, 0o755); err != nil {
				return err
			}
			if err := os.WriteFile(filepath.Join(p, "_COMPLETE"), nil, 0o644); err != nil {
				return err
			}
			return os.Symlink("/nowhere", filepath.Join(p, "model.pt"))
		}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			to := t.TempDir()
			if err := tc.make(filepath.Join(to, tc.checkpoint)); err != nil {
				t.Fatal(err)
			}
			code, _, stderr := runCLI(t, t.Context(), env, "restore", "--config", cfgPath, "--to", to, "--checkpoint", tc.checkpoint)
			if code != exitFail || !strings.Contains(stderr, tc.want) || strings.Contains(stderr, "---------") {
				t.Errorf("Got(restore into a %s) exit %d, stderr:\n%s\nwant 1 and %q, no mode string", tc.name, code, stderr, tc.want)
			}
		})
	}
}

// An invalid store.url is reported as what is wrong with it, not also as "not set".
func TestRestoreReportsOnlyTheRealStoreURLProblem(t *testing.T) {
	cfgPath := emptyConfigFile(t)
	for _, url := range []string{"bogus://x", "s3://", "file://relative"} {
		code, _, stderr := runCLI(t, t.Context(), []string{"SPOTGUARD_STORE_JOB=j"}, "restore", "--config", cfgPath, "--to", t.TempDir(), "--store.url", url)
		if code != exitFail || !strings.Contains(stderr, "store.url: \""+url+"\"") || strings.Contains(stderr, "not set") {
			t.Errorf("Got(restore --store.url %s) exit %d, stderr:\n%s\nwant 1, what is wrong with it, and not \"not set\"", url, code, stderr)
		}
	}
	code, _, stderr := runCLI(t, t.Context(), []string{"SPOTGUARD_STORE_JOB=j"}, "restore", "--config", cfgPath, "--to", t.TempDir())
	if code != exitFail || !strings.Contains(stderr, "store.url: not set") {
		t.Errorf("Got(restore without store.url) exit %d, stderr:\n%s\nwant 1 and \"store.url: not set\"", code, stderr)
	}
}

// restore and list refuse a bad value of a key they read, as run does, naming it, and restore
// nothing. (Found from outside: a restore took a relative checkpoint.dir from its working
// directory, / under the restore unit, and used the default for a checkpoint.marker with a slash
// and no owner for a trainer.user that does not exist, with exit 0.) A bad key they do not read
// is run's concern.
func TestRestoreAndListRefuseBadValuesOfTheKeysTheyRead(t *testing.T) {
	store, cfgPath, env := restoreEnv(t)
	commitForTest(t, store, "j", "step-1", map[string][]byte{"a.bin": []byte("weights")})
	wd := t.TempDir()
	t.Chdir(wd)
	for _, tt := range []struct {
		cmd       []string
		key, want string
	}{
		{[]string{"restore"}, "checkpoint.dir", `checkpoint.dir: "relative/ck" from --checkpoint.dir: must be an absolute path`},
		{[]string{"restore", "--to", t.TempDir()}, "checkpoint.marker", `checkpoint.marker: "a/b" from --checkpoint.marker`},
		{[]string{"restore", "--to", t.TempDir()}, "trainer.user", `trainer.user: "no-such-user-h33" from --trainer.user`},
		{[]string{"restore", "--to", t.TempDir()}, "agent.runtime_dir", `agent.runtime_dir: "rel/rt" from --agent.runtime_dir: must be an absolute path`},
		{[]string{"restore", "--to", t.TempDir()}, "imds.endpoint", `imds.endpoint: "ftp://x" from --imds.endpoint`},
		{[]string{"list"}, "checkpoint.marker", `checkpoint.marker: "a/b" from --checkpoint.marker`},
	} {
		value := map[string]string{"checkpoint.dir": "relative/ck", "checkpoint.marker": "a/b", "trainer.user": "no-such-user-h33",
			"agent.runtime_dir": "rel/rt", "imds.endpoint": "ftp://x"}[tt.key]
		args := append(slices.Clone(tt.cmd), "--config", cfgPath, "--"+tt.key, value)
		code, stdout, stderr := runCLI(t, t.Context(), env, args...)
		if code != exitFail || !strings.Contains(stderr, "invalid configuration") || !strings.Contains(stderr, tt.want) {
			t.Errorf("Got(%v) exit %d, stdout %q, stderr:\n%s\nwant 1 and %q", args, code, stdout, stderr, tt.want)
		}
	}
	if entries, _ := os.ReadDir(wd); len(entries) != 0 {
		t.Errorf("the working directory holds %d entries after the refused restores; want none", len(entries))
	}
	// gpu.* is run's: restore goes on.
	code, _, stderr := runCLI(t, t.Context(), env, "restore", "--config", cfgPath, "--to", t.TempDir(), "--gpu.sample_interval", "often")
	if code != exitOK {
		t.Errorf("Got(restore with a bad gpu.sample_interval) exit %d, stderr:\n%s\nwant 0: restore does not read it", code, stderr)
	}
}

// The summary says "1 file", not "1 files".
func TestRestoreSummaryOfOneFile(t *testing.T) {
	store, cfgPath, env := restoreEnv(t)
	commitForTest(t, store, "j", "model.pt", map[string][]byte{"model.pt": []byte("weights")})
	code, stdout, stderr := runCLI(t, t.Context(), env, "restore", "--config", cfgPath, "--to", t.TempDir())
	if code != exitOK || !strings.Contains(stdout, "restored model.pt (1 file, ") {
		t.Errorf("Got(restore of a single file) exit %d, stdout %q, stderr:\n%s\nwant 0 and \"(1 file, \"", code, stdout, stderr)
	}
}

// A relative --to is restored into, and reported as, the absolute directory.
func TestRestoreJSONDirIsAbsolute(t *testing.T) {
	store, cfgPath, env := restoreEnv(t)
	commitForTest(t, store, "j", "step-000100", map[string][]byte{"model.pt": []byte("weights"), "_COMPLETE": nil})
	wd := t.TempDir()
	t.Chdir(wd)
	code, stdout, stderr := runCLI(t, t.Context(), env, "restore", "--config", cfgPath, "--to", "out", "--json")
	var got struct{ Dir string }
	if err := json.Unmarshal([]byte(stdout), &got); code != exitOK || err != nil {
		t.Fatalf("Got(restore --to out --json) exit %d, stdout %q (%v), stderr:\n%s\nwant 0 and an object", code, stdout, err, stderr)
	}
	// wd itself may be reached through a symbolic link (macOS's /var): compare what Getwd says.
	abs, err := os.Getwd()
	if err != nil {
		t.Fatal(err)
	}
	if want := filepath.Join(abs, "out", "step-000100"); got.Dir != want {
		t.Errorf("Got(restore --to out --json) dir %q; want %q", got.Dir, want)
	}
}

// A complete save of the checkpoint's name where it goes, with other content: a newer one (a
// save the agent had not committed yet, on an instance stopped and started again) is left for the
// trainer to resume from, exit 0, where restore used to fail and so keep the trainer from starting;
// an older one is moved aside as the commit takes its place. Asked for by --commit, neither is
// touched; and what is not a save is never moved: restore fails naming it, and says what to do.
func TestRestoreOntoASaveOfItsName(t *testing.T) {
	save := map[string]string{"model.pt": "other weights", "_COMPLETE": ""}
	t.Run("newer", func(t *testing.T) {
		cfgPath, env, to, local := restoreOnto(t, save)
		restoreTestAge(t, local, -time.Minute) // written after the commit completed
		code, stdout, stderr := runCLI(t, t.Context(), env, "restore", "--config", cfgPath, "--to", to)
		if want := local + " holds a newer save of step-000100 than its newest commit"; code != exitOK || !strings.Contains(stdout, want) ||
			!strings.Contains(stdout, "left as it is for the trainer to resume from") {
			t.Errorf("restore onto a newer save: exit %d, stdout %q, stderr:\n%s\nwant 0 and %q", code, stdout, stderr, want)
		}
		code, stdout, _ = runCLI(t, t.Context(), env, "restore", "--config", cfgPath, "--to", to, "--json")
		var got struct {
			Restored     bool   `json:"restored"`
			NewerPresent bool   `json:"newer_present"`
			MovedAside   string `json:"moved_aside"`
		}
		if err := json.Unmarshal([]byte(stdout), &got); code != exitOK || err != nil || !got.Restored || !got.NewerPresent || got.MovedAside != "" {
			t.Errorf("restore --json onto a newer save: exit %d, stdout %q (%v); want restored and newer_present true", code, stdout, err)
		}
		restoreTestHolds(t, local, "other weights")
	})
	t.Run("older", func(t *testing.T) {
		cfgPath, env, to, local := restoreOnto(t, save)
		restoreTestAge(t, local, time.Hour) // written before the commit completed
		code, stdout, stderr := runCLI(t, t.Context(), env, "restore", "--config", cfgPath, "--to", to)
		aside, _ := filepath.Glob(filepath.Join(to, ".spotguard-older-step-000100-*"))
		if code != exitOK || len(aside) != 1 || !strings.Contains(stdout, "(an older save of that name was there: moved to "+aside[0]) {
			t.Fatalf("restore onto an older save: exit %d, stdout %q, moved to %q, stderr:\n%s\nwant 0, moved aside and said", code, stdout, aside, stderr)
		}
		restoreTestHolds(t, aside[0], "other weights")
		restoreTestHolds(t, local, "weights")
	})
	t.Run("with --commit", func(t *testing.T) {
		cfgPath, env, to, local := restoreOnto(t, save)
		restoreTestAge(t, local, -time.Minute)
		code, stdout, _ := runCLI(t, t.Context(), env, "list", "--config", cfgPath, "--json")
		var listed []struct{ Commit string }
		if err := json.Unmarshal([]byte(stdout), &listed); code != exitOK || err != nil || len(listed) != 1 {
			t.Fatalf("list --json: exit %d, %q (%v)", code, stdout, err)
		}
		code, _, stderr := runCLI(t, t.Context(), env, "restore", "--config", cfgPath, "--to", to,
			"--checkpoint", "step-000100", "--commit", listed[0].Commit)
		for _, want := range []string{"exists with other content", "not overwriting it",
			"fix: restore never overwrites what is there: move it away and run restore again\n(mv " + local + " " + local + ".old)."} {
			if !strings.Contains(stderr, want) {
				t.Errorf("restore --commit onto a save of its name: stderr lacks %q:\n%s", want, stderr)
			}
		}
		if code != exitFail {
			t.Errorf("restore --commit onto a save of its name: exit %d; want %d", code, exitFail)
		}
		restoreTestHolds(t, local, "other weights")
	})
	t.Run("DCP, checkpoint.marker not the agent's", func(t *testing.T) {
		// A DCP save (.metadata its marker) newer than its commit, restored with the default
		// marker: restore cannot judge it, and says to give it the agent's marker (it said a save
		// of the name was no obstacle); with it, the newer save is left in place.
		store, cfgPath, env := restoreEnv(t)
		commitForTest(t, store, "j", "step-000100", map[string][]byte{"__0_0.distcp": []byte("weights"), ".metadata": []byte("m")})
		to := t.TempDir()
		local := filepath.Join(to, "step-000100")
		for name, data := range map[string]string{"__0_0.distcp": "newer weights", ".metadata": "m2"} {
			if err := os.MkdirAll(local, 0o755); err != nil {
				t.Fatal(err)
			}
			if err := os.WriteFile(filepath.Join(local, name), []byte(data), 0o644); err != nil {
				t.Fatal(err)
			}
		}
		restoreTestAge(t, local, -time.Minute)
		code, _, stderr := runCLI(t, t.Context(), env, "restore", "--config", cfgPath, "--to", to)
		for _, want := range []string{"the commit has no _COMPLETE (checkpoint.marker) at its top", "(at the commit's top: .metadata, __0_0.distcp)",
			"fix: give restore the agent's checkpoint.marker"} {
			if !strings.Contains(stderr, want) {
				t.Errorf("restore with the default marker onto a DCP save: stderr lacks %q:\n%s", want, stderr)
			}
		}
		if code != exitFail || strings.Contains(stderr, "no obstacle") {
			t.Errorf("restore with the default marker onto a DCP save: exit %d, stderr:\n%s\nwant 1, and no word of a save being no obstacle", code, stderr)
		}
		code, stdout, stderr := runCLI(t, t.Context(), append(env, "SPOTGUARD_CHECKPOINT_MARKER=.metadata"), "restore", "--config", cfgPath, "--to", to)
		if code != exitOK || !strings.Contains(stdout, "left as it is for the trainer to resume from") {
			t.Errorf("restore with the agent's marker onto a newer DCP save: exit %d, stdout %q, stderr:\n%s\nwant 0, left in place", code, stdout, stderr)
		}
		if b, err := os.ReadFile(filepath.Join(local, "__0_0.distcp")); err != nil || string(b) != "newer weights" {
			t.Errorf("the newer DCP save's shard is %q (%v); want it untouched", b, err)
		}
	})
	t.Run("no save", func(t *testing.T) {
		cfgPath, env, to, local := restoreOnto(t, nil)
		if err := os.Remove(local); err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(local, []byte("a file"), 0o644); err != nil {
			t.Fatal(err)
		}
		restoreTestAge(t, local, time.Hour)
		code, _, stderr := runCLI(t, t.Context(), env, "restore", "--config", cfgPath, "--to", to)
		if want := "mv " + local + " " + local + ".old"; code != exitFail || !strings.Contains(stderr, "exists and is not a directory") || !strings.Contains(stderr, want) {
			t.Errorf("restore onto a file where the checkpoint's directory goes: exit %d, stderr:\n%s\nwant 1, naming it, and %q", code, stderr, want)
		}
		if b, err := os.ReadFile(local); err != nil || string(b) != "a file" {
			t.Errorf("%s is now %q (%v); want it untouched", local, b, err)
		}
	})
}

// restoreTestAge sets the modification time of p and everything in it to ago before now.
func restoreTestAge(t *testing.T, p string, ago time.Duration) {
	t.Helper()
	at := time.Now().Add(-ago)
	if err := filepath.WalkDir(p, func(p string, _ fs.DirEntry, err error) error {
		if err != nil {
			return err
		}
		return os.Chtimes(p, at, at)
	}); err != nil {
		t.Fatal(err)
	}
}

// restoreTestHolds fails t unless dir/model.pt holds want.
func restoreTestHolds(t *testing.T, dir, want string) {
	t.Helper()
	if b, err := os.ReadFile(filepath.Join(dir, "model.pt")); err != nil || string(b) != want {
		t.Errorf("%s/model.pt is %q (%v); want %q", dir, b, err, want)
	}
}

// An incomplete save of the checkpoint's name (no marker: a save cut short on a disk that outlived
// its instance) is moved aside as the commit takes its place, and the summary says where it went;
// one written a moment ago is left alone, and restore says to stop what writes it.
func TestRestoreMovesAnIncompleteSaveAsideAndSaysWhere(t *testing.T) {
	cfgPath, env, to, local := restoreOnto(t, map[string]string{"model.pt": "half"})
	code, _, stderr := runCLI(t, t.Context(), env, "restore", "--config", cfgPath, "--to", to)
	if want := "fix: stop what writes " + local; code != exitFail || !strings.Contains(stderr, "holds an incomplete save") || !strings.Contains(stderr, want) {
		t.Errorf("restore onto an incomplete save written a moment ago: exit %d, stderr:\n%s\nwant 1, saying so, and %q", code, stderr, want)
	}
	old := time.Now().Add(-5 * time.Minute)
	for _, p := range []string{filepath.Join(local, "model.pt"), local} {
		if err := os.Chtimes(p, old, old); err != nil {
			t.Fatal(err)
		}
	}
	code, stdout, stderr := runCLI(t, t.Context(), env, "restore", "--config", cfgPath, "--to", to, "--json")
	var got struct {
		MovedAside string `json:"moved_aside"`
	}
	if err := json.Unmarshal([]byte(stdout), &got); code != exitOK || err != nil || !strings.HasPrefix(got.MovedAside, filepath.Join(to, ".spotguard-incomplete-step-000100-")) {
		t.Fatalf("restore onto an incomplete save: exit %d, stdout %q (%v), stderr:\n%s\nwant 0 and moved_aside", code, stdout, err, stderr)
	}
	if b, err := os.ReadFile(filepath.Join(got.MovedAside, "model.pt")); err != nil || string(b) != "half" {
		t.Errorf("the incomplete save's model.pt, moved aside, is %q (%v); want it kept", b, err)
	}
	if b, err := os.ReadFile(filepath.Join(local, "model.pt")); err != nil || string(b) != "weights" {
		t.Errorf("the restored model.pt is %q (%v); want the commit's", b, err)
	}
}

// restoreOnto commits step-000100 (model.pt "weights" and its marker) and makes the directory
// local, --to/step-000100, holding files: what a restore into to then finds where the checkpoint
// goes.
func restoreOnto(t *testing.T, files map[string]string) (cfgPath string, env []string, to, local string) {
	t.Helper()
	store, cfgPath, env := restoreEnv(t)
	commitForTest(t, store, "j", "step-000100", map[string][]byte{"model.pt": []byte("weights"), "_COMPLETE": nil})
	to = t.TempDir()
	local = filepath.Join(to, "step-000100")
	if err := os.MkdirAll(local, 0o755); err != nil {
		t.Fatal(err)
	}
	for name, data := range files {
		if err := os.WriteFile(filepath.Join(local, name), []byte(data), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	return cfgPath, env, to, local
}

// A list that SIGINT or SIGTERM ends says so, as restore does (found from outside: "context
// canceled", from the S3 client).
func TestListInterruptedSaysInterrupted(t *testing.T) {
	store, cfgPath, env := restoreEnv(t)
	commitForTest(t, store, "j", "step-000100", map[string][]byte{"model.pt": []byte("weights"), "_COMPLETE": nil})
	ctx, cancel := context.WithCancelCause(t.Context())
	cancel(errors.New("terminated signal received"))
	var stdout, stderr bytes.Buffer
	code := run(ctx, []string{"list", "--config", cfgPath}, env, &stdout, &stderr)
	if want := "spotguard list: interrupted (terminated signal received)\n"; code != exitFail || !strings.Contains(stderr.String(), want) ||
		strings.Contains(stderr.String(), "context canceled") {
		t.Errorf("Got(list, interrupted) exit %d, stderr:\n%s\nwant 1 and %q, not \"context canceled\"", code, stderr.String(), want)
	}
}
