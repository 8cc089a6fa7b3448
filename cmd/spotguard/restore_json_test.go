package main

import (
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/spotguard/spotguard/checkpoint"
)

// restore --json prints one JSON object on stdout whenever it exits 0, "restored" saying whether
// a checkpoint is in place: --allow-empty with nothing committed used to print a line of text
// there instead. An error (exit 1) leaves stdout empty and says what went wrong on stderr.
func TestRestoreJSONWhenNothingIsCommitted(t *testing.T) {
	store := t.TempDir()
	cfgPath := emptyConfigFile(t)
	env := []string{"SPOTGUARD_STORE_URL=file://" + store, "SPOTGUARD_STORE_JOB=j"}

	object := func(what, stdout string) map[string]any {
		t.Helper()
		var got map[string]any
		dec := json.NewDecoder(strings.NewReader(stdout))
		if err := dec.Decode(&got); err != nil {
			t.Fatalf("Got(%s) stdout %q: %v; want one JSON object", what, stdout, err)
		}
		if dec.More() {
			t.Errorf("Got(%s) stdout %q; want one JSON object only", what, stdout)
		}
		return got
	}

	// Nothing committed, --allow-empty: exit 0, restored false.
	code, stdout, stderr := runCLI(t, t.Context(), env, "restore", "--config", cfgPath, "--allow-empty", "--json", "--to", t.TempDir())
	if code != exitOK {
		t.Fatalf("Got(restore --allow-empty --json) exit %d; want 0\nstderr: %s", code, stderr)
	}
	got := object("restore --allow-empty --json", stdout)
	if got["restored"] != false || got["store"] != "file://"+store || got["job"] != "j" ||
		!strings.Contains(got["detail"].(string), "nothing to restore") {
		t.Errorf("Got(restore --allow-empty --json) = %v; want restored false, the store, the job and why", got)
	}
	for _, key := range []string{"checkpoint", "commit", "dir"} {
		if _, ok := got[key]; ok {
			t.Errorf("Got(restore --allow-empty --json) has %q: %v; want it absent, nothing was restored", key, got)
		}
	}

	// Nothing committed, no --allow-empty: exit 1, nothing on stdout, the error on stderr.
	code, stdout, stderr = runCLI(t, t.Context(), env, "restore", "--config", cfgPath, "--json", "--to", t.TempDir())
	if code != exitFail || stdout != "" || !strings.Contains(stderr, "spotguard restore: ") {
		t.Errorf("Got(restore --json) exit %d, stdout %q, stderr %q; want 1, nothing on stdout, the error on stderr", code, stdout, stderr)
	}

	// A checkpoint restored: restored true, with what and where.
	commitForTest(t, store, "j", "step-000100", map[string][]byte{"model.pt": []byte("weights"), "_COMPLETE": nil})
	to := t.TempDir()
	code, stdout, stderr = runCLI(t, t.Context(), env, "restore", "--config", cfgPath, "--allow-empty", "--json", "--to", to)
	if code != exitOK {
		t.Fatalf("Got(restore --json) exit %d; want 0\nstderr: %s", code, stderr)
	}
	got = object("restore --json", stdout)
	if got["restored"] != true || got["checkpoint"] != "step-000100" || got["dir"] != filepath.Join(to, "step-000100") || got["files"] != 2.0 || got["deleted_while_restored"] != 0.0 {
		t.Errorf("Got(restore --json) = %v; want restored true, step-000100 in %s, 2 files, none deleted while restored", got, to)
	}
}

// A commit whose file was deleted from the store behind the agent's back cannot be restored:
// restore says so and says how to restore another commit.
func TestRestoreOfADamagedCommitSaysWhatToDo(t *testing.T) {
	store := t.TempDir()
	cfgPath := emptyConfigFile(t)
	env := []string{"SPOTGUARD_STORE_URL=file://" + store, "SPOTGUARD_STORE_JOB=j"}
	commitForTest(t, store, "j", "step-000100", map[string][]byte{"model.pt": []byte("weights"), "_COMPLETE": nil})
	shards, err := filepath.Glob(filepath.Join(store, "j", "step-000100", "*", "model.pt"))
	if err != nil || len(shards) != 1 {
		t.Fatalf("the committed model.pt: %v, %v", shards, err)
	}
	if err := os.Remove(shards[0]); err != nil {
		t.Fatal(err)
	}
	code, _, stderr := runCLI(t, t.Context(), env, "restore", "--config", cfgPath, "--to", t.TempDir())
	if code != exitFail || !strings.Contains(stderr, "the commit is damaged in the store") || !strings.Contains(stderr, "spotguard restore --checkpoint NAME --commit ID") {
		t.Errorf("restore of a damaged commit: exit %d\n%s\nwant 1, saying it is damaged and how to restore another", code, stderr)
	}
}

// list and restore against a bucket that does not exist say what S3 answered, in short, and
// the fix, as doctor does; not only the SDK's error chain.
func TestListAndRestoreSayTheFixForAStoreError(t *testing.T) {
	for _, args := range [][]string{{"list"}, {"restore", "--to", t.TempDir()}} {
		if code, _, stderr := runCLIWithStore(t, args...); code != exitFail ||
			!strings.Contains(stderr, "S3 said NoSuchBucket: The specified bucket does not exist (HTTP 404)") ||
			!strings.Contains(stderr, "fix: the bucket nosuchbucket does not exist") {
			t.Errorf("%s against a missing bucket: exit %d\n%s", args[0], code, stderr)
		}
	}
}

// runCLIWithStore runs the command against an S3 endpoint that answers every request 404
// NoSuchBucket, as S3 does for a bucket that does not exist.
func runCLIWithStore(t *testing.T, args ...string) (int, string, string) {
	t.Helper()
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		w.Header().Set("Content-Type", "application/xml")
		w.WriteHeader(http.StatusNotFound)
		io.WriteString(w, `<?xml version="1.0" encoding="UTF-8"?><Error><Code>NoSuchBucket</Code><Message>The specified bucket does not exist</Message><BucketName>nosuchbucket</BucketName></Error>`)
	}))
	t.Cleanup(srv.Close)
	for k, v := range map[string]string{
		"AWS_ENDPOINT_URL_S3": srv.URL, "AWS_ENDPOINT_URL": "", "AWS_REGION": "us-east-1", "AWS_ACCESS_KEY_ID": "k",
		"AWS_SECRET_ACCESS_KEY": "s", "AWS_SESSION_TOKEN": "", "AWS_PROFILE": "", "AWS_CONFIG_FILE": filepath.Join(t.TempDir(), "none"),
		"AWS_SHARED_CREDENTIALS_FILE": filepath.Join(t.TempDir(), "none"), "AWS_EC2_METADATA_DISABLED": "true",
	} {
		t.Setenv(k, v)
	}
	env := []string{"SPOTGUARD_STORE_URL=s3://nosuchbucket/x", "SPOTGUARD_STORE_JOB=j"}
	return runCLI(t, t.Context(), env, append(args, "--config", emptyConfigFile(t))...)
}

// emptyConfigFile returns the path of an empty configuration file: defaults and the environment.
func emptyConfigFile(t *testing.T) string {
	t.Helper()
	p := filepath.Join(t.TempDir(), "empty.yaml")
	if err := os.WriteFile(p, nil, 0o644); err != nil {
		t.Fatal(err)
	}
	return p
}

// A checkpoint or commit that is not in the store, in a bucket that exists, is said to be
// missing, with `spotguard list` to find the ones there are: the fix used to be chosen from "not
// found" alone and said the bucket did not exist (or, for a file:// store, to check the
// directory).
func TestRestoreOfAMissingCheckpointDoesNotBlameTheBucket(t *testing.T) {
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		w.Header().Set("Content-Type", "application/xml")
		switch {
		case r.Method == http.MethodHead && strings.Count(strings.Trim(r.URL.Path, "/"), "/") == 0:
			w.Header().Set("X-Amz-Bucket-Region", "us-east-1") // the bucket exists
		case r.Method == http.MethodGet && r.URL.Query().Get("list-type") == "2":
			io.WriteString(w, `<?xml version="1.0" encoding="UTF-8"?><ListBucketResult xmlns="http://s3.amazonaws.com/doc/2006-03-01/"><Name>ckpt</Name><KeyCount>0</KeyCount><MaxKeys>1000</MaxKeys><IsTruncated>false</IsTruncated></ListBucketResult>`)
		default:
			w.WriteHeader(http.StatusNotFound)
			if r.Method != http.MethodHead {
				io.WriteString(w, `<?xml version="1.0" encoding="UTF-8"?><Error><Code>NoSuchKey</Code><Message>The specified key does not exist.</Message></Error>`)
			}
		}
	}))
	t.Cleanup(srv.Close)
	for k, v := range map[string]string{
		"AWS_ENDPOINT_URL_S3": srv.URL, "AWS_ENDPOINT_URL": "", "AWS_REGION": "us-east-1", "AWS_ACCESS_KEY_ID": "k",
		"AWS_SECRET_ACCESS_KEY": "s", "AWS_SESSION_TOKEN": "", "AWS_PROFILE": "", "AWS_CONFIG_FILE": filepath.Join(t.TempDir(), "none"),
		"AWS_SHARED_CREDENTIALS_FILE": filepath.Join(t.TempDir(), "none"), "AWS_EC2_METADATA_DISABLED": "true",
	} {
		t.Setenv(k, v)
	}
	fileStore := t.TempDir()
	commitForTest(t, fileStore, "j1", "step-000100", map[string][]byte{"model.pt": []byte("weights"), "_COMPLETE": nil})
	cfgPath := emptyConfigFile(t)
	for _, store := range []string{"s3://ckpt/runs", "file://" + fileStore} {
		env := []string{"SPOTGUARD_STORE_URL=" + store, "SPOTGUARD_STORE_JOB=j1"}
		for _, tc := range []struct {
			name string
			args []string
			want string
		}{
			{"checkpoint", []string{"--checkpoint", "nope"}, `fix: job j1 has no valid commit of checkpoint "nope" in ` + store + ": `spotguard list` shows the job's checkpoints and commits"},
			{"commit", []string{"--checkpoint", "nope", "--commit", "20261201T000000Z-000000000000"}, `fix: checkpoint "nope" of job j1 has no commit 20261201T000000Z-000000000000 in ` + store + ": `spotguard list` shows the job's checkpoints and commits"},
		} {
			t.Run(strings.SplitN(store, ":", 2)[0]+"/"+tc.name, func(t *testing.T) {
				args := append([]string{"restore", "--config", cfgPath, "--to", t.TempDir()}, tc.args...)
				code, _, stderr := runCLI(t, t.Context(), env, args...)
				if code != exitFail || !strings.Contains(stderr, tc.want) {
					t.Errorf("Got(restore %s) exit %d, stderr:\n%s\nwant 1 and %q", strings.Join(tc.args, " "), code, stderr, tc.want)
				}
				for _, wrong := range []string{"bucket", "writable directory"} {
					if strings.Contains(stderr, wrong) {
						t.Errorf("Got(restore %s) stderr:\n%s\nwant no advice about the %s: it is there", strings.Join(tc.args, " "), stderr, wrong)
					}
				}
			})
		}
	}
}

// storeHint gives the bucket's fix only when S3 said the bucket does not exist (NoSuchBucket),
// never for an object that is not there, for every command.
func TestStoreHintBlamesTheBucketOnlyForNoSuchBucket(t *testing.T) {
	missing := fmt.Errorf("read job j in s3://ckpt/runs: get j/LATEST: %w", checkpoint.ErrNotFound)
	for _, cmd := range []string{"list", "restore"} {
		var b strings.Builder
		storeHint(&b, cmd, "s3://ckpt/runs", missing, "")
		if strings.Contains(b.String(), "bucket") {
			t.Errorf("Got(storeHint(%s, a missing object)) = %q; want no advice about the bucket", cmd, b.String())
		}
	}
}

// `spotguard list --check` finds a file of a commit that is missing or has another size, not one
// overwritten with other bytes of the same size: it lists objects, it reads none. Restore reads
// the bytes and verifies every checksum, and then says what list --check does and does not check
// (it used to say that list --check "checks the store", as if it would find this).
func TestListCheckFindsSizesAndRestoreFindsBytes(t *testing.T) {
	store := t.TempDir()
	cfgPath := emptyConfigFile(t)
	env := []string{"SPOTGUARD_STORE_URL=file://" + store, "SPOTGUARD_STORE_JOB=j"}
	commitForTest(t, store, "j", "step-000100", map[string][]byte{"model.pt": []byte("weights"), "_COMPLETE": nil})
	// LATEST, as the agent writes it after the manifest.
	s, err := checkpoint.NewFileStore(store)
	if err != nil {
		t.Fatal(err)
	}
	cs, _, err := checkpoint.ListCommitted(t.Context(), s, "j")
	if err != nil || len(cs) != 1 {
		t.Fatalf("the commit: %v, %v", cs, err)
	}
	m := cs[0].Manifest
	latest, err := json.Marshal(checkpoint.Latest{Version: checkpoint.ManifestVersion, Checkpoint: m.Checkpoint, Commit: m.Commit,
		CompleteAt: m.Timings.CompleteAt, CommittedAt: m.CommittedAt})
	if err != nil {
		t.Fatal(err)
	}
	if _, err := s.PutBytes(t.Context(), checkpoint.LatestKey("j"), latest, checkpoint.Cond{IfAbsent: true}); err != nil {
		t.Fatal(err)
	}
	listCheck := func() (int, string) {
		t.Helper()
		code, _, stderr := runCLI(t, t.Context(), env, "list", "--config", cfgPath, "--check")
		return code, stderr
	}
	if code, stderr := listCheck(); code != exitOK || !strings.Contains(stderr, "spotguard list: check: passed: 1 commit(s) of job j") {
		t.Fatalf("Got(list --check) of a sound commit exit %d; want 0, saying it passed\n%s", code, stderr)
	}

	model := filepath.Join(store, "j", "step-000100", m.Commit, "model.pt")
	if err := os.WriteFile(model, []byte("WEIGHTS"), 0o644); err != nil { // the same size, other bytes
		t.Fatal(err)
	}
	if code, stderr := listCheck(); code != exitOK {
		t.Errorf("Got(list --check) of a file overwritten with as many bytes exit %d; want 0: it checks sizes, not checksums\n%s", code, stderr)
	}
	code, _, stderr := runCLI(t, t.Context(), env, "restore", "--config", cfgPath, "--to", t.TempDir())
	if want := "`spotguard list --check` finds a file missing or of another size, not other bytes of the same size"; code != exitFail ||
		!strings.Contains(stderr, "the commit is damaged in the store") || !strings.Contains(stderr, want) {
		t.Errorf("Got(restore of a file overwritten with as many bytes) exit %d\n%s\nwant 1, damaged, and %q", code, stderr, want)
	}

	if err := os.WriteFile(model, []byte("w"), 0o644); err != nil { // another size
		t.Fatal(err)
	}
	if code, stderr := listCheck(); code != exitFail || strings.Contains(stderr, "passed") || !strings.Contains(stderr, "I2: commit step-000100/"+m.Commit+" lists j/step-000100/"+m.Commit+"/model.pt with 7 bytes; the object has 1") {
		t.Errorf("Got(list --check) of a file of another size exit %d\n%s\nwant 1 and I2 naming it", code, stderr)
	}
}

// --commit - asks for a version 1 checkpoint's commit, which has no id: list shows it so. It is
// not a usage error; restore looks for that commit.
func TestRestoreCommitDashIsTheVersion1Commit(t *testing.T) {
	store := t.TempDir()
	env := []string{"SPOTGUARD_STORE_URL=file://" + store, "SPOTGUARD_STORE_JOB=j"}
	code, _, stderr := runCLI(t, t.Context(), env, "restore", "--config", emptyConfig(t), "--to", t.TempDir(), "--checkpoint", "step-1", "--commit", "-")
	if code != exitFail || strings.Contains(stderr, "is not a commit id") || !strings.Contains(stderr, "step-1") {
		t.Errorf("Got(restore --commit -) exit %d, %q; want 1, the checkpoint not found", code, stderr)
	}
	code, _, stderr = runCLI(t, t.Context(), env, "restore", "--config", emptyConfig(t), "--to", t.TempDir(), "--checkpoint", "step-1", "--commit", "--")
	if code != exitUsage || !strings.Contains(stderr, "is not a commit id") {
		t.Errorf("Got(restore --commit --) exit %d, %q; want a usage error", code, stderr)
	}
}
