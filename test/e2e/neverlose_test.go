package e2e

// The scenarios of "never lose a checkpoint" (DESIGN.md, Invariants) that need real processes:
// the built agent and CLI, versitygw or the file store, awscli as the independent reader. Each
// test is named after its scenario and asserts on what is in the store and on disk.

import (
	"bytes"
	"crypto/rand"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"fmt"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"sort"
	"strings"
	"syscall"
	"testing"
	"time"
)

// noTrainer makes an agent find no trainer: these tests write the checkpoints themselves.
const noTrainer = "SPOTGUARD_TRAINER_MATCH=no-trainer-in-this-test"

// testStore is a checkpoint store as a test sees it: the store.url the agent and the CLI get,
// and an independent way to read what is in it (awscli for S3, the file system for file://).
type testStore struct {
	url    string    // store.url
	s3     *s3Server // nil for a file store
	prefix string    // the key prefix inside the bucket (S3) ...
	dir    string    // ... or the store's directory (file)
}

// newS3TestStore is prefix in versitygw's bucket.
func newS3TestStore(s3 *s3Server, prefix string) *testStore {
	return &testStore{url: "s3://" + s3Bucket + "/" + prefix, s3: s3, prefix: prefix}
}

func newFileTestStore(t testing.TB) *testStore {
	dir := t.TempDir()
	return &testStore{url: "file://" + dir, dir: dir}
}

// jobEnv is the environment of an agent or a CLI command using job on this store, through
// endpoint (the server's own when empty; S3 only).
func (ts *testStore) jobEnv(job, endpoint string) []string {
	env := []string{"SPOTGUARD_STORE_URL=" + ts.url, "SPOTGUARD_STORE_JOB=" + job}
	if ts.s3 != nil {
		env = append(env, ts.s3.env(endpoint)...)
	}
	return env
}

// cli runs `spotguard <cmd> --config <empty> args...` for job and returns its exit code and output.
func (ts *testStore) cli(t testing.TB, job, cmd string, args ...string) (int, string, string) {
	t.Helper()
	return runSpotguard(t, ts.jobEnv(job, ""), append([]string{cmd, "--config", writeEmptyConfig(t)}, args...)...)
}

// storeObject is what the tests compare of an object: its size and a digest of its content
// (S3: the ETag, which versitygw computes from the bytes; file: SHA-256) and its modification time.
type storeObject struct {
	Size     int64
	Digest   string
	Modified string
}

// objects returns every object under the job's prefix + sub, keyed by its key relative to the
// store's prefix ("J/C/X/path"), as the independent client sees it.
func (ts *testStore) objects(t testing.TB, job, sub string) map[string]storeObject {
	t.Helper()
	out := map[string]storeObject{}
	if ts.s3 != nil {
		base := ts.prefix + "/"
		text := ts.s3.aws(t, "s3api", "list-objects-v2", "--bucket", s3Bucket, "--prefix", base+job+"/"+sub, "--output", "json")
		if strings.TrimSpace(text) == "" {
			return out
		}
		var r struct {
			Contents []struct {
				Key          string
				Size         int64
				ETag         string
				LastModified string
			}
		}
		if err := json.Unmarshal([]byte(text), &r); err != nil {
			t.Fatalf("aws s3api list-objects-v2: %v\n%s", err, text)
		}
		for _, o := range r.Contents {
			out[strings.TrimPrefix(o.Key, base)] = storeObject{o.Size, o.ETag, o.LastModified}
		}
		return out
	}
	root := filepath.Join(ts.dir, job)
	filepath.WalkDir(root, func(p string, d os.DirEntry, err error) error {
		if err != nil {
			if os.IsNotExist(err) {
				return nil
			}
			t.Fatal(err)
		}
		if d.IsDir() {
			return nil
		}
		rel, _ := filepath.Rel(ts.dir, p)
		rel = filepath.ToSlash(rel)
		if !strings.HasPrefix(rel, job+"/"+sub) {
			return nil
		}
		b, err := os.ReadFile(p)
		if err != nil {
			t.Fatal(err)
		}
		fi, err := d.Info()
		if err != nil {
			t.Fatal(err)
		}
		sum := sha256.Sum256(b)
		out[rel] = storeObject{int64(len(b)), hex.EncodeToString(sum[:]), fi.ModTime().UTC().Format(time.RFC3339Nano)}
		return nil
	})
	return out
}

// dataObjects is objects without the store probe's scratch objects (J/_spotguard/...), which
// every agent writes at start.
func (ts *testStore) dataObjects(t testing.TB, job string) map[string]storeObject {
	t.Helper()
	objs := ts.objects(t, job, "")
	for k := range objs {
		if strings.HasPrefix(k, job+"/_spotguard/") {
			delete(objs, k)
		}
	}
	return objs
}

// latestDoc is the JSON of a job's LATEST.
type latestDoc struct {
	Version     int        `json:"version"`
	Checkpoint  string     `json:"checkpoint"`
	Commit      string     `json:"commit"`
	CompleteAt  *time.Time `json:"complete_at,omitempty"`
	CommittedAt time.Time  `json:"committed_at"`
}

// latest reads the job's LATEST with the independent client; ok is false when there is none.
func (ts *testStore) latest(t testing.TB, job string) (latestDoc, string, bool) {
	t.Helper()
	var text string
	if ts.s3 != nil {
		out, err := ts.s3.tryAWS(t, "s3", "cp", "s3://"+s3Bucket+"/"+ts.prefix+"/"+job+"/LATEST", "-")
		if err != nil {
			return latestDoc{}, out, false
		}
		text = out
	} else {
		b, err := os.ReadFile(filepath.Join(ts.dir, job, "LATEST"))
		if err != nil {
			return latestDoc{}, err.Error(), false
		}
		text = string(b)
	}
	var l latestDoc
	if err := json.Unmarshal([]byte(text), &l); err != nil {
		t.Fatalf("LATEST is not JSON: %v\n%s", err, text)
	}
	return l, text, true
}

// putLatest overwrites the job's LATEST with body, as an outside writer would.
func (ts *testStore) putLatest(t testing.TB, job string, body []byte) {
	t.Helper()
	ts.put(t, job+"/LATEST", body)
}

// put writes body at key (relative to the store's prefix) with the independent client, as an
// outside writer would.
func (ts *testStore) put(t testing.TB, key string, body []byte) {
	t.Helper()
	if ts.s3 == nil {
		if err := os.WriteFile(filepath.Join(ts.dir, filepath.FromSlash(key)), body, 0o644); err != nil {
			t.Fatal(err)
		}
		return
	}
	f := filepath.Join(t.TempDir(), "object")
	if err := os.WriteFile(f, body, 0o644); err != nil {
		t.Fatal(err)
	}
	ts.s3.aws(t, "s3", "cp", f, "s3://"+s3Bucket+"/"+ts.prefix+"/"+key)
}

// get reads the object at key (relative to the store's prefix) with the independent client.
func (ts *testStore) get(t testing.TB, key string) []byte {
	t.Helper()
	if ts.s3 == nil {
		b, err := os.ReadFile(filepath.Join(ts.dir, filepath.FromSlash(key)))
		if err != nil {
			t.Fatal(err)
		}
		return b
	}
	f := filepath.Join(t.TempDir(), "object")
	ts.s3.aws(t, "s3", "cp", "s3://"+s3Bucket+"/"+ts.prefix+"/"+key, f)
	b, err := os.ReadFile(f)
	if err != nil {
		t.Fatal(err)
	}
	return b
}

// listedCommit is one entry of `spotguard list --json`: a version 2 manifest and whether LATEST
// names it.
type listedCommit struct {
	Version    int    `json:"version"`
	Job        string `json:"job"`
	Checkpoint string `json:"checkpoint"`
	Commit     string `json:"commit"`
	Files      []struct {
		Path     string `json:"path"`
		Key      string `json:"key"`
		Size     int64  `json:"size"`
		Mode     string `json:"mode"`
		Checksum struct {
			Algorithm string `json:"algorithm"`
			Value     string `json:"value"`
		} `json:"checksum"`
	} `json:"files"`
	Trigger string `json:"trigger"`
	Timings struct {
		CompleteAt *time.Time `json:"complete_at"`
	} `json:"timings"`
	CommittedAt time.Time `json:"committed_at"`
	Latest      bool      `json:"latest"`
}

func (c listedCommit) paths() []string {
	var ps []string
	for _, f := range c.Files {
		ps = append(ps, f.Path)
	}
	sort.Strings(ps)
	return ps
}

// commitNames returns "checkpoint/commit" of each of cs, in their order.
func commitNames(cs []listedCommit) []string {
	var names []string
	for _, c := range cs {
		names = append(names, c.Checkpoint+"/"+c.Commit)
	}
	return names
}

// list runs `spotguard list --json` and returns its commits, newest first.
func (ts *testStore) list(t testing.TB, job string) []listedCommit {
	t.Helper()
	code, stdout, stderr := ts.cli(t, job, "list", "--json")
	if code != 0 {
		t.Fatalf("spotguard list --json: exit %d\n%s%s", code, stdout, stderr)
	}
	var cs []listedCommit
	if err := json.Unmarshal([]byte(stdout), &cs); err != nil {
		t.Fatalf("spotguard list --json: %v\n%s", err, stdout)
	}
	return cs
}

// check runs `spotguard list --check` and fails the test unless it exits 0.
func (ts *testStore) check(t testing.TB, job string) {
	t.Helper()
	if code, stdout, stderr := ts.cli(t, job, "list", "--check"); code != 0 {
		t.Errorf("spotguard list --check: exit %d; want 0 (no invariant violated)\n%s%s", code, stdout, stderr)
	}
}

// restore runs `spotguard restore --to to args...` and fails the test unless it exits 0; it
// returns the summary line.
func (ts *testStore) restore(t testing.TB, job, to string, args ...string) string {
	t.Helper()
	code, stdout, stderr := ts.cli(t, job, "restore", append([]string{"--to", to}, args...)...)
	if code != 0 {
		t.Fatalf("spotguard restore --to %s %v: exit %d\n%s%s", to, args, code, stdout, stderr)
	}
	return stdout
}

// quietIMDS is AWS's IMDS simulator with no notice during a test.
func quietIMDS(t testing.TB) *imdsSim {
	t.Helper()
	sim := newIMDS(t)
	sim.start("spot", "-d", "100000", "--rebalance-delay-sec", "100000")
	return sim
}

// startStoreAgent runs an agent watching ckdir and committing to job in ts, with extra env
// (at least how it finds its trainer).
func startStoreAgent(t testing.TB, sim *imdsSim, ckdir string, ts *testStore, job string, extra ...string) *agentProc {
	t.Helper()
	env := append([]string{"SPOTGUARD_CHECKPOINT_DIR=" + ckdir, "SPOTGUARD_STORE_PART_SIZE=5MiB"}, ts.jobEnv(job, "")...)
	return startAgent(t, sim, append(env, extra...)...)
}

// uploadsStatus is the uploader's part of /status.
type uploadsStatus struct {
	InFlight    int                `json:"files_in_flight"`
	Queued      int                `json:"files_queued"`
	Checkpoints []checkpointStatus `json:"checkpoints"`
}

// checkpointStatus is one local checkpoint in the uploader's part of /status.
type checkpointStatus struct {
	Name        string `json:"name"`
	Commit      string `json:"commit"`
	Files       int    `json:"files"`
	FilesStored int    `json:"files_stored"`
	Bytes       int64  `json:"bytes"`
	BytesStored int64  `json:"bytes_stored"`
	Complete    bool   `json:"complete"`
	Committed   bool   `json:"committed"`
	Withheld    bool   `json:"withheld"`
}

// uploads returns the uploader's state from /status (nil while the uploader does not answer).
func (ap *agentProc) uploads(t testing.TB) *uploadsStatus {
	t.Helper()
	client := http.Client{Timeout: 5 * time.Second}
	resp, err := client.Get(ap.base + "/status")
	if err != nil {
		t.Fatalf("GET /status: %v", err)
	}
	defer resp.Body.Close()
	var st struct {
		Uploads *uploadsStatus `json:"uploads"`
	}
	if err := json.NewDecoder(resp.Body).Decode(&st); err != nil {
		t.Fatalf("decode /status: %v", err)
	}
	return st.Uploads
}

// waitCommitted waits until the agent says checkpoint name is committed and LATEST names it,
// and returns its commit.
func waitCommitted(t testing.TB, ap *agentProc, ts *testStore, job, name string, within time.Duration) string {
	t.Helper()
	commit := ""
	eventually(t, within, "the agent to commit "+name, func() bool {
		u := ap.uploads(t)
		if u == nil {
			return false
		}
		for _, c := range u.Checkpoints {
			if c.Name == name && c.Committed {
				commit = c.Commit
				return true
			}
		}
		return false
	})
	eventually(t, 10*time.Second, "LATEST to name "+name+" "+commit, func() bool {
		l, _, ok := ts.latest(t, job)
		return ok && l.Checkpoint == name && l.Commit == commit
	})
	return commit
}

// waitIdle waits until the agent's uploader answers and the agent has then polled IMDS three
// more times (about three seconds in which a checkpoint it found would have been sent), and
// returns the uploader's state.
func waitIdle(t testing.TB, ap *agentProc) *uploadsStatus {
	t.Helper()
	eventually(t, 20*time.Second, "the uploader to answer /status", func() bool { return ap.uploads(t) != nil })
	ap.waitPolls(t, "spot", 3)
	var u *uploadsStatus
	eventually(t, 20*time.Second, "the uploader to be idle", func() bool {
		u = ap.uploads(t)
		return u != nil && u.InFlight == 0 && u.Queued == 0
	})
	return u
}

// randomBytes returns n random bytes.
func randomBytes(t testing.TB, n int) []byte {
	t.Helper()
	b := make([]byte, n)
	if _, err := rand.Read(b); err != nil {
		t.Fatal(err)
	}
	return b
}

// writeSynced writes data to path, a new file, fsyncs and closes it.
func writeSynced(t testing.TB, path string, data []byte) {
	t.Helper()
	writeSyncedFlag(t, path, os.O_CREATE|os.O_EXCL, data)
}

// writeInPlace writes data over the file at path, the same file cut short and written again
// (as torch.save(obj, path) does), fsyncs and closes it.
func writeInPlace(t testing.TB, path string, data []byte) {
	t.Helper()
	writeSyncedFlag(t, path, os.O_TRUNC, data)
}

// writeSyncedFlag writes data to path opened write-only with flag, fsyncs and closes it.
func writeSyncedFlag(t testing.TB, path string, flag int, data []byte) {
	t.Helper()
	f, err := os.OpenFile(path, os.O_WRONLY|flag, 0o644)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := f.Write(data); err != nil {
		t.Fatal(err)
	}
	if err := f.Sync(); err != nil {
		t.Fatal(err)
	}
	if err := f.Close(); err != nil {
		t.Fatal(err)
	}
}

func syncDir(t testing.TB, dir string) {
	t.Helper()
	d, err := os.Open(dir)
	if err != nil {
		t.Fatal(err)
	}
	defer d.Close()
	if err := d.Sync(); err != nil {
		t.Fatal(err)
	}
}

// writeCheckpoint writes dir/name/ as the example trainer does: each file to a dot-prefixed
// temporary name, fsync, rename; then the marker _COMPLETE (holding marker) the same way.
func writeCheckpoint(t testing.TB, dir, name string, files map[string][]byte, marker string) {
	t.Helper()
	ck := filepath.Join(dir, name)
	if err := os.MkdirAll(ck, 0o755); err != nil {
		t.Fatal(err)
	}
	put := func(rel string, data []byte) {
		tmp := filepath.Join(ck, "."+rel+".tmp")
		writeSynced(t, tmp, data)
		if err := os.Rename(tmp, filepath.Join(ck, rel)); err != nil {
			t.Fatal(err)
		}
	}
	names := make([]string, 0, len(files))
	for rel := range files {
		names = append(names, rel)
	}
	sort.Strings(names)
	for _, rel := range names {
		put(rel, files[rel])
	}
	syncDir(t, ck)
	put("_COMPLETE", []byte(marker))
	syncDir(t, ck)
	syncDir(t, dir)
}

// singleRig is versitygw (the store at prefix), AWS's IMDS simulator with no notice, and job,
// whose trainer saves a single-file checkpoint, name (*.pt).
type singleRig struct {
	t         *testing.T
	ts        *testStore
	sim       *imdsSim
	job, name string
}

func newSingleRig(t *testing.T, prefix, job, name string) *singleRig {
	needPeers(t)
	return &singleRig{t: t, ts: newS3TestStore(startS3(t), prefix), sim: quietIMDS(t), job: job, name: name}
}

// agent starts an agent watching dir.
func (r *singleRig) agent(dir string) *agentProc {
	return startStoreAgent(r.t, r.sim, dir, r.ts, r.job, noTrainer, "SPOTGUARD_CHECKPOINT_PATTERN=*.pt")
}

// firstCommit starts an agent watching dir, saves 2 MiB there, and waits for its commit.
func (r *singleRig) firstCommit(dir string) (*agentProc, []byte, string) {
	r.t.Helper()
	ap := r.agent(dir)
	data := randomBytes(r.t, 2<<20)
	r.save(dir, data)
	return ap, data, waitCommitted(r.t, ap, r.ts, r.job, r.name, 15*time.Second)
}

// save plays the trainer's save: data written under a dot-.tmp name, then renamed into dir.
func (r *singleRig) save(dir string, data []byte) {
	r.t.Helper()
	tmp := filepath.Join(dir, "."+r.name+".tmp")
	writeSynced(r.t, tmp, data)
	if err := os.Rename(tmp, filepath.Join(dir, r.name)); err != nil {
		r.t.Fatalf("the trainer's save: %v", err)
	}
	syncDir(r.t, dir)
}

// spotguardProc is a spotguard command running in the background.
type spotguardProc struct {
	cmd  *exec.Cmd
	done chan struct{}
	out  bytes.Buffer // stdout and stderr; read it only after done
	err  error
}

// startSpotguard starts a spotguard command with env and returns at once; the test's cleanup
// kills it if it still runs.
func startSpotguard(t testing.TB, env []string, args ...string) *spotguardProc {
	t.Helper()
	p := &spotguardProc{done: make(chan struct{})}
	p.cmd = exec.Command(spotguardBin, args...)
	p.cmd.Env = append([]string{"PATH=" + os.Getenv("PATH"), "HOME=" + t.TempDir()}, env...)
	p.cmd.Stdout, p.cmd.Stderr = &p.out, &p.out
	if err := p.cmd.Start(); err != nil {
		t.Fatalf("start spotguard %v: %v", args, err)
	}
	go func() { p.err = p.cmd.Wait(); close(p.done) }()
	t.Cleanup(func() { p.kill() })
	return p
}

func (p *spotguardProc) exited() bool {
	select {
	case <-p.done:
		return true
	default:
		return false
	}
}

// kill sends SIGKILL and waits until the process is gone (reaped: its pid is free).
func (p *spotguardProc) kill() {
	if !p.exited() {
		p.cmd.Process.Signal(syscall.SIGKILL)
	}
	<-p.done
}

// logLines returns the agent's JSON log lines with message msg.
func (ap *agentProc) logLines(t testing.TB, msg string) []map[string]any {
	t.Helper()
	var found []map[string]any
	for _, l := range strings.Split(ap.log(t), "\n") {
		var m map[string]any
		if json.Unmarshal([]byte(l), &m) == nil && m["message"] == msg {
			found = append(found, m)
		}
	}
	return found
}

// diffObjects describes how after differs from before; "" when they are the same.
func diffObjects(before, after map[string]storeObject) string {
	var b strings.Builder
	keys := map[string]bool{}
	for k := range before {
		keys[k] = true
	}
	for k := range after {
		keys[k] = true
	}
	sorted := make([]string, 0, len(keys))
	for k := range keys {
		sorted = append(sorted, k)
	}
	sort.Strings(sorted)
	for _, k := range sorted {
		o, inBefore := before[k]
		n, inAfter := after[k]
		switch {
		case !inAfter:
			fmt.Fprintf(&b, "  removed %s\n", k)
		case !inBefore:
			fmt.Fprintf(&b, "  added   %s (%d bytes)\n", k, n.Size)
		case o != n:
			fmt.Fprintf(&b, "  changed %s: %+v → %+v\n", k, o, n)
		}
	}
	return b.String()
}

// stagingDirs returns the restore staging directories in dir.
func stagingDirs(t testing.TB, dir string) []string {
	t.Helper()
	m, err := filepath.Glob(filepath.Join(dir, ".spotguard-restore-*"))
	if err != nil {
		t.Fatal(err)
	}
	return m
}

// A restore killed mid-download leaves a staging directory (torn files, and never the marker,
// which comes last) in the checkpoint directory of an agent. The agent commits nothing of it
// (I4), LATEST stays, and the next restore puts the checkpoint in place bit for bit and removes
// the stale staging directory. "agent starts after" is the replacement instance whose agent starts
// once the restore is dead (it finds the staging directory in its first scan); "agent running"
// has the agent watching the directory while both restores write into it (it sees the staging
// directory come and go, and the restored checkpoint appear: the same bytes as the commit, so
// adopted, not committed again).
func TestKilledRestoreIsNeverCommitted(t *testing.T) {
	needPeers(t)
	for _, tc := range []struct {
		name         string
		agentRunning bool
	}{{"agent starts after", false}, {"agent running", true}} {
		t.Run(tc.name, func(t *testing.T) { testKilledRestore(t, tc.agentRunning) })
	}
}

func testKilledRestore(t *testing.T, agentRunning bool) {
	s3 := startS3(t)
	ts := newS3TestStore(s3, "neverlose")
	const job = "killed-restore"
	sim := quietIMDS(t)

	// Instance 1: the trainer saves into A, its agent commits it.
	a := t.TempDir()
	tp := startTrainer(t, "--checkpoint-dir", a, "--files", "3", "--checkpoint-mb", "4")
	ap1 := startStoreAgent(t, sim, a, ts, job, "SPOTGUARD_TRAINER_PIDFILE="+tp.pidfile)
	tp.cmd.Process.Signal(syscall.SIGUSR1)
	eventually(t, 20*time.Second, "the trainer's checkpoint", func() bool {
		m, _ := filepath.Glob(filepath.Join(a, "*", "_COMPLETE"))
		return len(m) == 1
	})
	ckpt := newestLocal(t, a)
	commit := waitCommitted(t, ap1, ts, job, ckpt, 20*time.Second)
	ap1.stop(t)
	listBefore := ts.list(t, job)
	if len(listBefore) != 1 || listBefore[0].Checkpoint != ckpt || listBefore[0].Commit != commit {
		t.Fatalf("spotguard list --json before the restore = %+v; want the one commit %s/%s", listBefore, ckpt, commit)
	}
	objsBefore := ts.dataObjects(t, job)

	// Instance 2: B is the checkpoint directory of its agent.
	b := t.TempDir()
	var ap2 *agentProc
	if agentRunning {
		ap2 = startStoreAgent(t, sim, b, ts, job, noTrainer)
		eventually(t, 20*time.Second, "the uploader to answer /status", func() bool { return ap2.uploads(t) != nil })
	}
	// A restore into B through a slow link (each connection 256 KiB/s: a 4 MiB shard takes
	// 16 s), SIGKILLed while the shards are torn: the marker is not there yet (it comes last).
	slow := startThrottle(t, strings.TrimPrefix(s3.endpoint, "http://"), 256<<10)
	rp := startSpotguard(t, ts.jobEnv(job, slow.url()), "restore", "--config", writeEmptyConfig(t), "--to", b)
	var staging string
	want := treeFiles(t, filepath.Join(a, ckpt))
	eventually(t, 20*time.Second, "the restore to stage part of a shard", func() bool {
		if rp.exited() {
			t.Fatalf("the restore ended before it could be killed (%v):\n%s", rp.err, rp.out.String())
		}
		dirs := stagingDirs(t, b)
		if len(dirs) != 1 {
			return false
		}
		staging = dirs[0]
		for rel, got := range treeFiles(t, staging) {
			if data, ok := want[rel]; ok && len(got) > 0 && !bytes.Equal(got, data) && bytes.ContainsFunc(got, func(r rune) bool { return r != 0 }) {
				return true
			}
		}
		return false
	})
	rp.kill()
	if _, err := os.Stat(filepath.Join(b, ckpt)); !os.IsNotExist(err) {
		t.Fatalf("%s/%s exists after the restore was killed mid-download (%v)", b, ckpt, err)
	}
	staged := treeFiles(t, staging)
	torn := 0
	for rel, data := range treeFiles(t, filepath.Join(a, ckpt)) {
		if got, ok := staged[rel]; ok && !bytes.Equal(got, data) {
			torn++
		}
	}
	if torn == 0 {
		t.Fatalf("the killed restore's staging directory holds no half-written file (%d files); the kill was not mid-download", len(staged))
	}
	t.Logf("killed the restore with %d of %d staged files torn", torn, len(staged))
	if _, ok := staged["_COMPLETE"]; ok {
		t.Errorf("the killed restore's staging directory holds the marker beside %d torn files; it comes last", torn)
	}

	// The agent on B (same job and store) runs until idle.
	if !agentRunning {
		ap2 = startStoreAgent(t, sim, b, ts, job, noTrainer)
	}
	u := waitIdle(t, ap2)
	for _, c := range u.Checkpoints {
		t.Errorf("the agent on B tracks checkpoint %q (%d files, committed %v); B holds only a killed restore's staging directory",
			c.Name, c.Files, c.Committed)
	}
	stopAgent := func(when string) {
		t.Helper()
		for _, l := range strings.Split(ap2.metrics(t), "\n") {
			if strings.HasPrefix(l, "spotguard_checkpoints_committed_total{") && !strings.HasSuffix(l, " 0") {
				t.Errorf("the agent on B committed something %s: %s", when, l)
			}
		}
		ap2.stop(t)
	}
	noNewCommit := func(when string) {
		t.Helper()
		// Nothing was committed or written: the same objects (no .spotguard key), the same
		// commits, LATEST on the original commit.
		if d := diffObjects(objsBefore, ts.dataObjects(t, job)); d != "" {
			t.Errorf("the store's objects of job %s changed %s:\n%s", job, when, d)
		}
		if ls := s3.aws(t, "s3", "ls", "--recursive", "s3://"+s3Bucket+"/"); strings.Contains(ls, ".spotguard") {
			t.Errorf("aws s3 ls has a .spotguard key %s:\n%s", when, ls)
		}
		listAfter := ts.list(t, job)
		if len(listAfter) != 1 || listAfter[0].Checkpoint != ckpt || listAfter[0].Commit != commit {
			t.Errorf("spotguard list --json %s = %v; want only %s/%s", when, commitNames(listAfter), ckpt, commit)
		}
		if l, text, ok := ts.latest(t, job); !ok || l.Checkpoint != ckpt || l.Commit != commit {
			t.Errorf("LATEST %s = %s; want %s commit %s", when, text, ckpt, commit)
		}
	}
	if !agentRunning {
		stopAgent("after it ran on B")
		noNewCommit("after the agent ran on B")
	}

	// The next restore succeeds, bit for bit, and removes the killed restore's staging directory.
	out := ts.restore(t, job, b)
	if !strings.Contains(out, "restored "+ckpt) {
		t.Errorf("restore summary = %q; want restored %s", out, ckpt)
	}
	sameTree(t, filepath.Join(a, ckpt), filepath.Join(b, ckpt))
	if left := stagingDirs(t, b); len(left) != 0 {
		t.Errorf("staging directories left in %s after the next restore: %v", b, left)
	}
	if agentRunning {
		// The running agent sees the restored checkpoint appear: the commit's own bytes, so it
		// is that commit (adopted), not a new one.
		eventually(t, 15*time.Second, "the agent to take the restored "+ckpt+" for its commit", func() bool {
			for _, c := range ap2.uploads(t).Checkpoints {
				if c.Name == ckpt && c.Committed {
					if c.Commit != commit {
						t.Fatalf("the agent committed the restored %s as %s; want it adopted as %s", ckpt, c.Commit, commit)
					}
					return true
				}
			}
			return false
		})
		waitIdle(t, ap2)
		stopAgent("after it watched both restores")
		noNewCommit("after the agent watched both restores")
	}
	ts.check(t, job)
}

// A file reported ready (x.bin.tmp, fsynced, quiet past the debounce) and then renamed
// (x.bin) leaves its checkpoint: the checkpoint is committed in bounded time (I5) with x.bin and
// the marker only, no stray object under the commit, and x.bin restores bit for bit.
func TestRenamedTempFileDoesNotBlockCommit(t *testing.T) {
	needPeers(t)
	for _, kind := range []string{"file", "s3"} {
		t.Run(kind, func(t *testing.T) {
			ts := newFileTestStore(t)
			if kind == "s3" {
				ts = newS3TestStore(startS3(t), "renamed")
			}
			const job = "renamed-temp"
			sim := quietIMDS(t)
			dir := t.TempDir()
			ap := startStoreAgent(t, sim, dir, ts, job, noTrainer)

			ck := filepath.Join(dir, "step-1")
			if err := os.Mkdir(ck, 0o755); err != nil {
				t.Fatal(err)
			}
			data := randomBytes(t, 3<<20)
			writeSynced(t, filepath.Join(ck, "x.bin.tmp"), data)
			// Quiet past the debounce: the agent reports it as part of step-1 and sends it.
			eventually(t, 15*time.Second, "the agent to take up step-1/x.bin.tmp", func() bool {
				u := ap.uploads(t)
				if u == nil {
					return false
				}
				for _, c := range u.Checkpoints {
					if c.Name == "step-1" && c.Files == 1 && c.FilesStored == 1 {
						return true
					}
				}
				return false
			})
			if err := os.Rename(filepath.Join(ck, "x.bin.tmp"), filepath.Join(ck, "x.bin")); err != nil {
				t.Fatal(err)
			}
			syncDir(t, ck)
			writeSynced(t, filepath.Join(ck, "_COMPLETE"), []byte(`{"step": 1}`+"\n"))
			start := time.Now()
			commit := waitCommitted(t, ap, ts, job, "step-1", 15*time.Second)
			t.Logf("committed %s %s after the marker", commit, time.Since(start).Round(time.Millisecond))

			cs := ts.list(t, job)
			if len(cs) != 1 || cs[0].Checkpoint != "step-1" || cs[0].Commit != commit {
				t.Fatalf("spotguard list --json = %+v; want step-1 commit %s only", cs, commit)
			}
			if got, want := cs[0].paths(), []string{"_COMPLETE", "x.bin"}; !slices.Equal(got, want) {
				t.Errorf("committed manifest lists %q; want %q (not x.bin.tmp)", got, want)
			}
			// Every object under the commit is one the manifest lists, or the manifest.
			prefix := job + "/step-1/" + commit + "/"
			listed := map[string]bool{prefix + "_spotguard/manifest.json": true}
			for _, f := range cs[0].Files {
				listed[f.Key] = true
				if !strings.HasPrefix(f.Key, prefix) {
					t.Errorf("file %s has key %s, outside its commit %s", f.Path, f.Key, prefix)
				}
			}
			for k := range ts.objects(t, job, "step-1/"+commit+"/") {
				if !listed[k] {
					t.Errorf("stray object %s under the commit", k)
				}
			}
			ts.check(t, job)

			to := t.TempDir()
			ts.restore(t, job, to)
			sameTree(t, ck, filepath.Join(to, "step-1"))
			if got, err := os.ReadFile(filepath.Join(to, "step-1", "x.bin")); err != nil || !bytes.Equal(got, data) {
				t.Errorf("restored x.bin differs from the bytes written (%v)", err)
			}
		})
	}
}

// A new run reusing the job commits a name run 1 committed, with other bytes of the same sizes:
// it is a second commit, logged as such, the newest (LATEST, restore) holds the new bytes, and
// run 1's commit is untouched and still restorable (I1, I6).
func TestNameCommittedAgainIsANewCommit(t *testing.T) {
	needPeers(t)
	s3 := startS3(t)
	ts := newS3TestStore(s3, "again")
	const job, name = "reused-job", "step-000100"
	sim := quietIMDS(t)

	// Run 1 commits step-000100 with bytes A.
	shared := randomBytes(t, 2<<20) // the same in both runs: a size-and-content match alone proves nothing
	bytesA := map[string][]byte{"shard-0.bin": shared, "shard-1.bin": randomBytes(t, 2<<20)}
	dir1 := t.TempDir()
	ap1 := startStoreAgent(t, sim, dir1, ts, job, noTrainer)
	writeCheckpoint(t, dir1, name, bytesA, `{"step": 100}`+"\n")
	oldCommit := waitCommitted(t, ap1, ts, job, name, 15*time.Second)
	ap1.stop(t)
	oldObjects := ts.objects(t, job, name+"/"+oldCommit+"/")

	// Run 2, a new run with the same job, writes step-000100 again with bytes B (same sizes, same
	// marker content, a later marker) into a fresh checkpoint directory.
	bytesB := map[string][]byte{"shard-0.bin": shared, "shard-1.bin": randomBytes(t, 2<<20)}
	dir2 := t.TempDir()
	ap2 := startStoreAgent(t, sim, dir2, ts, job, noTrainer)
	waitIdle(t, ap2) // it has read the store
	writeCheckpoint(t, dir2, name, bytesB, `{"step": 100}`+"\n")
	newCommit := waitCommitted(t, ap2, ts, job, name, 15*time.Second)
	ap2.stop(t)
	if newCommit == oldCommit {
		t.Fatalf("run 2's bytes were taken for run 1's commit %s; want a new commit", oldCommit)
	}

	cs := ts.list(t, job)
	commits := commitNames(cs)
	if len(cs) != 2 || cs[0].Checkpoint != name || cs[1].Checkpoint != name || cs[0].Commit != newCommit || cs[1].Commit != oldCommit {
		t.Fatalf("spotguard list --json (newest first) = %v; want %s/%s then %s/%s", commits, name, newCommit, name, oldCommit)
	}
	if !cs[0].Latest || cs[1].Latest {
		t.Errorf("list --json: latest = %v, %v; want the new commit only", cs[0].Latest, cs[1].Latest)
	}
	if a, b := cs[1].Timings.CompleteAt, cs[0].Timings.CompleteAt; a == nil || b == nil || !b.After(*a) {
		t.Errorf("complete_at: old %v, new %v; want the new one later", a, b)
	}
	for _, c := range cs {
		for _, f := range c.Files {
			if !strings.HasPrefix(f.Key, job+"/"+name+"/"+c.Commit+"/") {
				t.Errorf("commit %s: file %s has key %s, outside its own commit", c.Commit, f.Path, f.Key)
			}
		}
	}
	if l, text, _ := ts.latest(t, job); l.Checkpoint != name || l.Commit != newCommit {
		t.Errorf("LATEST = %s; want %s commit %s", text, name, newCommit)
	}

	// The newest is run 2's bytes; run 1's commit is unchanged and still gives A.
	to := t.TempDir()
	ts.restore(t, job, to)
	sameTree(t, filepath.Join(dir2, name), filepath.Join(to, name))
	old := t.TempDir()
	ts.restore(t, job, old, "--checkpoint", name, "--commit", oldCommit)
	sameTree(t, filepath.Join(dir1, name), filepath.Join(old, name))
	if d := diffObjects(oldObjects, ts.objects(t, job, name+"/"+oldCommit+"/")); d != "" {
		t.Errorf("run 1's commit %s changed:\n%s", oldCommit, d)
	}

	// Never silent: the agent said so, at warn level, naming the checkpoint.
	const msg = "checkpoint name already committed with other bytes; committing these as a new commit (the earlier commits stay)"
	lines := ap2.logLines(t, msg)
	if len(lines) != 1 || lines[0]["level"] != "warn" || lines[0]["checkpoint"] != name {
		t.Errorf("run 2's agent logged %v; want one warn line %q with checkpoint %s", lines, msg, name)
	}
	if l := ap1.logLines(t, msg); len(l) != 0 {
		t.Errorf("run 1's agent logged %v; its name was new", l)
	}
	ts.check(t, job)
}

// A single-file checkpoint comes back as the file it was: `spotguard restore` puts model.pt at
// --to/model.pt (not model.pt/model.pt, where torch.load fails and the trainer's next
// os.replace onto model.pt fails with EISDIR), the next instance's agent finds it committed
// already and sends nothing, and the trainer's next save there is committed.
func TestSingleFileCheckpointRestoredAsTheFile(t *testing.T) {
	r := newSingleRig(t, "single", "single-file-job", "model.pt")
	ts, job, save := r.ts, r.job, r.save
	ap1, first, commit := r.firstCommit(t.TempDir())
	ap1.stop(t)

	// The next instance restores into its checkpoint directory before its agent starts.
	dir2 := t.TempDir()
	ts.restore(t, job, dir2)
	fi, err := os.Lstat(filepath.Join(dir2, "model.pt"))
	if err != nil || !fi.Mode().IsRegular() {
		t.Fatalf("restored %s/model.pt: %v, %v; want a regular file", dir2, fi, err)
	}
	if got, _ := os.ReadFile(filepath.Join(dir2, "model.pt")); !bytes.Equal(got, first) {
		t.Fatalf("restored model.pt has %d bytes, not the committed ones", len(got))
	}
	if names := dirNames(t, dir2); !slices.Equal(names, []string{"model.pt"}) {
		t.Errorf("restore left %q in %s; want only model.pt", names, dir2)
	}
	ts.restore(t, job, dir2) // again: already in place, nothing changed

	ap2 := r.agent(dir2)
	waitIdle(t, ap2)
	if cs := ts.list(t, job); len(cs) != 1 || cs[0].Commit != commit {
		t.Fatalf("after the next agent started, the job has %d commits; want only %s (the restored file is committed already)", len(cs), commit)
	}
	second := randomBytes(t, 3<<20)
	save(dir2, second) // the trainer's next save, renamed over the restored file
	eventually(t, 15*time.Second, "the next save to be committed", func() bool {
		l, _, ok := ts.latest(t, job)
		return ok && l.Checkpoint == "model.pt" && l.Commit != commit
	})
	ap2.stop(t)
	to := t.TempDir()
	ts.restore(t, job, to)
	if got, _ := os.ReadFile(filepath.Join(to, "model.pt")); !bytes.Equal(got, second) {
		t.Errorf("the newest model.pt restored has other bytes than the trainer's second save")
	}
	ts.check(t, job)
}

// An instance stopped and started again keeps its disk. Its trainer saves into one name every
// time (Lightning's last.ckpt; here last.pt), and its last save was not committed before the
// stop. spotguard-restore.service runs at boot: restore used to fail on that save ("exists with
// other content"), so the trainer, which Requires= it, never started. It leaves the save for the
// trainer now (exit 0, newer_present), and the agent commits it. On a disk holding an older
// commit's bytes of that name (restored a while ago), the newest commit takes its place, and the
// older save is moved aside, kept.
func TestStoppedInstanceResumesFromItsUncommittedSave(t *testing.T) {
	r := newSingleRig(t, "stopped", "stopped-job", "last.pt")
	ts, job, save := r.ts, r.job, r.save
	dir := t.TempDir()
	ap1, first, c1 := r.firstCommit(dir)
	ap1.kill9(t) // the instance stops before its agent sees the next save
	second := randomBytes(t, 2<<20)
	save(dir, second)

	// Boot: the restore unit, then the agent.
	code, stdout, stderr := ts.cli(t, job, "restore", "--to", dir, "--allow-empty", "--json")
	var got struct {
		Restored     bool   `json:"restored"`
		NewerPresent bool   `json:"newer_present"`
		Commit       string `json:"commit"`
	}
	if err := json.Unmarshal([]byte(stdout), &got); code != 0 || err != nil || !got.Restored || !got.NewerPresent || got.Commit != c1 {
		t.Fatalf("spotguard restore onto the uncommitted save: exit %d, %q (%v)\n%s\nwant 0, newer_present, commit %s", code, stdout, err, stderr, c1)
	}
	if b, _ := os.ReadFile(filepath.Join(dir, "last.pt")); !bytes.Equal(b, second) {
		t.Fatalf("last.pt after the restore is not the trainer's last save")
	}
	ap2 := r.agent(dir)
	c2 := ""
	eventually(t, 15*time.Second, "the agent to commit the save it had not committed", func() bool {
		l, _, ok := ts.latest(t, job)
		c2 = l.Commit
		return ok && l.Checkpoint == "last.pt" && l.Commit != c1
	})
	ap2.stop(t)

	// Another disk holds the first commit's bytes, restored a while ago: the newest goes in its
	// place.
	old := t.TempDir()
	ts.restore(t, job, old, "--checkpoint", "last.pt", "--commit", c1)
	ago := time.Now().Add(-5 * time.Minute)
	if err := os.Chtimes(filepath.Join(old, "last.pt"), ago, ago); err != nil {
		t.Fatal(err)
	}
	summary := ts.restore(t, job, old)
	aside, _ := filepath.Glob(filepath.Join(old, ".spotguard-older-last.pt-*"))
	if len(aside) != 1 || !strings.Contains(summary, "an older save of that name was there: moved to "+aside[0]) {
		t.Fatalf("restore onto the older commit's bytes: moved aside %q, summary %q; want it moved aside and said", aside, summary)
	}
	if b, _ := os.ReadFile(aside[0]); !bytes.Equal(b, first) {
		t.Errorf("the older save moved aside is not the first commit's bytes")
	}
	if b, _ := os.ReadFile(filepath.Join(old, "last.pt")); !bytes.Equal(b, second) {
		t.Errorf("last.pt restored is not the newest commit %s's bytes", c2)
	}
	ts.check(t, job)
}

// A reclaim between a manifest and LATEST leaves LATEST on an older commit: restore takes the
// newest commit anyway (and says so), and the next agent repairs LATEST at start (I3).
func TestRestoreTakesCommitNewerThanLatest(t *testing.T) {
	needPeers(t)
	s3 := startS3(t)
	ts := newS3TestStore(s3, "lags")
	const job = "latest-lags"
	sim := quietIMDS(t)

	dir := t.TempDir()
	ap := startStoreAgent(t, sim, dir, ts, job, noTrainer)
	writeCheckpoint(t, dir, "step-1", map[string][]byte{"model.bin": randomBytes(t, 2<<20)}, `{"step": 1}`+"\n")
	c1 := waitCommitted(t, ap, ts, job, "step-1", 15*time.Second)
	writeCheckpoint(t, dir, "step-2", map[string][]byte{"model.bin": randomBytes(t, 2<<20)}, `{"step": 2}`+"\n")
	c2 := waitCommitted(t, ap, ts, job, "step-2", 15*time.Second)
	ap.stop(t)

	// LATEST as a reclaim right after step-2's manifest would have left it: on step-1.
	cs := ts.list(t, job)
	if len(cs) != 2 || cs[0].Commit != c2 || cs[1].Commit != c1 {
		t.Fatalf("spotguard list --json = %+v; want step-2 %s then step-1 %s", cs, c2, c1)
	}
	body, err := json.Marshal(latestDoc{Version: 2, Checkpoint: "step-1", Commit: c1,
		CompleteAt: cs[1].Timings.CompleteAt, CommittedAt: cs[1].CommittedAt})
	if err != nil {
		t.Fatal(err)
	}
	ts.putLatest(t, job, body)
	if l, text, _ := ts.latest(t, job); l.Commit != c1 {
		t.Fatalf("LATEST = %s after the rewrite; want step-1 %s", text, c1)
	}

	to := t.TempDir()
	code, stdout, stderr := ts.cli(t, job, "restore", "--to", to)
	if code != 0 {
		t.Fatalf("spotguard restore: exit %d\n%s%s", code, stdout, stderr)
	}
	if !strings.Contains(stdout, "restored step-2") || !strings.Contains(stdout, "LATEST was missing, unusable or older") {
		t.Errorf("restore summary = %q; want step-2 restored, saying LATEST was older", stdout)
	}
	sameTree(t, filepath.Join(dir, "step-2"), filepath.Join(to, "step-2"))
	if _, err := os.Stat(filepath.Join(to, "step-1")); !os.IsNotExist(err) {
		t.Errorf("restore put step-1 in place too (%v)", err)
	}
	if l, text, _ := ts.latest(t, job); l.Commit != c1 {
		t.Fatalf("LATEST = %s after the restore; want it untouched (step-1 %s): a restore only reads", text, c1)
	}

	// A new agent of the job repairs LATEST at start.
	ap2 := startStoreAgent(t, sim, t.TempDir(), ts, job, noTrainer)
	eventually(t, 15*time.Second, "the agent to repair LATEST to step-2", func() bool {
		l, _, ok := ts.latest(t, job)
		return ok && l.Checkpoint == "step-2" && l.Commit == c2
	})
	ap2.stop(t)
	ts.check(t, job)
}

// shiftTimes adds d to the times named in the JSON object at key (each a path of fields), as the
// clock of an instance d ahead would have written them.
func (ts *testStore) shiftTimes(t testing.TB, key string, d time.Duration, fields ...[]string) {
	t.Helper()
	var doc map[string]any
	if err := json.Unmarshal(ts.get(t, key), &doc); err != nil {
		t.Fatalf("%s: %v", key, err)
	}
	for _, path := range fields {
		obj := doc
		for _, f := range path[:len(path)-1] {
			obj = obj[f].(map[string]any)
		}
		last := path[len(path)-1]
		at, err := time.Parse(time.RFC3339Nano, obj[last].(string))
		if err != nil {
			t.Fatalf("%s: %v: %v", key, path, err)
		}
		obj[last] = at.Add(d).Format(time.RFC3339Nano)
	}
	body, err := json.Marshal(doc)
	if err != nil {
		t.Fatal(err)
	}
	ts.put(t, key, body)
}

// The instance that wrote the job's newest commit had its clock ahead of the next instance's (or
// the next one's is behind: not yet synchronized after boot, set back). The next instance's
// checkpoints, saved after it read that commit, are dated before it by their own clock: LATEST
// stayed on the old commit, restore took it, and retention would delete the new checkpoints
// first, so training done on the new instance was lost. They are the newest, with a warning.
func TestCheckpointSavedAfterAClockAheadIsTheNewest(t *testing.T) {
	needPeers(t)
	s3 := startS3(t)
	ts := newS3TestStore(s3, "clock")
	const job = "clock-ahead"
	sim := quietIMDS(t)

	dir1 := t.TempDir()
	ap1 := startStoreAgent(t, sim, dir1, ts, job, noTrainer)
	writeCheckpoint(t, dir1, "step-100", map[string][]byte{"model.bin": randomBytes(t, 2<<20)}, `{"step": 100}`+"\n")
	c1 := waitCommitted(t, ap1, ts, job, "step-100", 15*time.Second)
	ap1.stop(t)
	// Its clock was an hour ahead: its manifest and LATEST say so.
	ts.shiftTimes(t, job+"/step-100/"+c1+"/_spotguard/manifest.json", time.Hour, []string{"timings", "complete_at"}, []string{"committed_at"})
	ts.shiftTimes(t, job+"/LATEST", time.Hour, []string{"complete_at"}, []string{"committed_at"})
	ts.check(t, job)

	// The next instance restores step-100, trains, and saves step-200 and step-300, keeping 2.
	dir2 := t.TempDir()
	ts.restore(t, job, dir2)
	ap2 := startStoreAgent(t, sim, dir2, ts, job, noTrainer, "SPOTGUARD_CHECKPOINT_KEEP=2")
	waitIdle(t, ap2) // it has read the store
	writeCheckpoint(t, dir2, "step-200", map[string][]byte{"model.bin": randomBytes(t, 2<<20)}, `{"step": 200}`+"\n")
	c2 := waitCommitted(t, ap2, ts, job, "step-200", 15*time.Second)
	writeCheckpoint(t, dir2, "step-300", map[string][]byte{"model.bin": randomBytes(t, 2<<20)}, `{"step": 300}`+"\n")
	c3 := waitCommitted(t, ap2, ts, job, "step-300", 15*time.Second)
	ap2.stop(t)

	const msg = "this instance's clock is behind the one that wrote a commit the agent knew of before this checkpoint completed; ordering the checkpoint after that commit, as if this clock were that much ahead"
	lines := ap2.logLines(t, msg)
	if len(lines) != 2 || lines[0]["level"] != "warn" || lines[0]["checkpoint"] != "step-200" || lines[1]["checkpoint"] != "step-300" {
		t.Errorf("the agent logged %v; want two warn lines %q, for step-200 and step-300", lines, msg)
	}
	for _, l := range lines {
		if behind, _ := l["clock_behind_s"].(float64); l["after_commit"] != c1 || behind < 3500 || behind > 3600 {
			t.Errorf("the warning for %v says after_commit %v, clock_behind_s %v; want %s and about 3600", l["checkpoint"], l["after_commit"], l["clock_behind_s"], c1)
		}
	}
	commits := commitNames(ts.list(t, job))
	if want := []string{"step-300/" + c3, "step-200/" + c2}; !slices.Equal(commits, want) {
		t.Errorf("spotguard list --json (newest first) = %v; want %v (retention keeps the two newest)", commits, want)
	}
	to := t.TempDir()
	ts.restore(t, job, to)
	sameTree(t, filepath.Join(dir2, "step-300"), filepath.Join(to, "step-300"))
	ts.check(t, job)
}

// dirNames returns the names in dir, sorted.
func dirNames(t testing.TB, dir string) []string {
	t.Helper()
	entries, err := os.ReadDir(dir)
	if err != nil {
		t.Fatal(err)
	}
	var names []string
	for _, e := range entries {
		names = append(names, e.Name())
	}
	return names
}

// A run rolled back saves a step it had saved into the same directory, in place, with the last
// save's marker still there (as torch DCP saving over its last save, or a trainer that does not
// take the marker away first, leaves it). Half way, the directory holds files of both saves; the
// agent must not commit that, only the new save whole once its marker is written again, and the
// commit of the first save stays as it was.
func TestSaveIntoACompleteDirectoryAgainIsNeverCommittedHalfWay(t *testing.T) {
	needPeers(t)
	s3 := startS3(t)
	ts := newS3TestStore(s3, "again-in-place")
	const job, name = "rolled-back", "step-000100"
	sim := quietIMDS(t)
	dir := t.TempDir()
	ap := startStoreAgent(t, sim, dir, ts, job, noTrainer)
	save1 := map[string][]byte{"shard-0.bin": randomBytes(t, 1<<20), "shard-1.bin": randomBytes(t, 1<<20)}
	writeCheckpoint(t, dir, name, save1, "")
	first := waitCommitted(t, ap, ts, job, name, 15*time.Second)
	firstObjects := ts.objects(t, job, name+"/"+first+"/")

	// The second save writes shard-0.bin over the first one's, in place.
	ck := filepath.Join(dir, name)
	save2 := map[string][]byte{"shard-0.bin": randomBytes(t, 1<<20), "shard-1.bin": randomBytes(t, 1<<20)}
	writeInPlace(t, filepath.Join(ck, "shard-0.bin"), save2["shard-0.bin"])
	waitIdle(t, ap) // three seconds in which a commit of the half-written save would have come
	if cs := ts.list(t, job); len(cs) != 1 || cs[0].Commit != first {
		t.Fatalf("half way through the second save, the job has %d commits (newest %s); want only %s", len(cs), cs[0].Commit, first)
	}
	const msg = "file written again after its checkpoint's marker: the checkpoint is not complete until its marker is written again"
	eventually(t, 15*time.Second, "the agent to see shard-0.bin written again", func() bool { return len(ap.logLines(t, msg)) > 0 })
	if l := ap.logLines(t, msg)[0]; l["level"] != "warn" || l["checkpoint"] != name || l["file"] != "shard-0.bin" {
		t.Errorf("log line %v; want a warning naming %s and shard-0.bin", l, name)
	}
	for _, c := range ap.uploads(t).Checkpoints {
		if c.Name == name && c.Complete {
			t.Errorf("half way through the second save, %s is %+v; want not complete", name, c)
		}
	}
	if cs := ts.list(t, job); len(cs) != 1 {
		t.Fatalf("half way through the second save, the job has %d commits; want only %s", len(cs), first)
	}

	// The second save ends: shard-1.bin, then the marker, renamed into place.
	writeInPlace(t, filepath.Join(ck, "shard-1.bin"), save2["shard-1.bin"])
	tmp := filepath.Join(ck, "._COMPLETE.tmp")
	writeSynced(t, tmp, []byte("save 2\n"))
	if err := os.Rename(tmp, filepath.Join(ck, "_COMPLETE")); err != nil {
		t.Fatal(err)
	}
	eventually(t, 15*time.Second, "the second save's commit", func() bool {
		l, _, ok := ts.latest(t, job)
		return ok && l.Checkpoint == name && l.Commit != first
	})
	ap.stop(t)
	to := t.TempDir()
	ts.restore(t, job, to)
	sameTree(t, ck, filepath.Join(to, name))
	if cs := ts.list(t, job); len(cs) != 2 {
		t.Errorf("the job has %d commits; want 2, one per save", len(cs))
	}
	if d := diffObjects(firstObjects, ts.objects(t, job, name+"/"+first+"/")); d != "" {
		t.Errorf("the first save's commit %s changed:\n%s", first, d)
	}
	ts.check(t, job)
}
