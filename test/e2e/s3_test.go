package e2e

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"github.com/spotguard/spotguard/test/s3model"
)

const (
	s3Access = "spotguardtest"
	s3Secret = "spotguardtestsecret"
	s3Bucket = "checkpoints"
)

// s3Server is versitygw (a real S3 server on a POSIX directory) on 127.0.0.1, with one bucket.
type s3Server struct {
	endpoint string
	region   string // the server's region: requests signed for another are refused
	// certFile and keyFile are the server's throwaway certificate (startS3TLS); "" over plain
	// HTTP. The certificate is its own CA: clients trust it through caEnv.
	certFile, keyFile string
	// data and meta are the posix backend's directories: the bucket's objects, their metadata.
	data, meta string
	cmd        *exec.Cmd
	done       chan struct{}
}

func versitygwBin(t testing.TB) string {
	t.Helper()
	if p, err := exec.LookPath(filepath.Join(repoRoot, "bin", "versitygw")); err == nil {
		return p
	}
	if p, err := exec.LookPath("versitygw"); err == nil {
		return p
	}
	if os.Getenv("CI") != "" {
		t.Fatal("versitygw missing under CI (make tools builds it)")
	}
	t.Skip("versitygw not found in bin/ or PATH; run `make tools`")
	return ""
}

func awsBin(t testing.TB) string {
	t.Helper()
	p, err := exec.LookPath("aws")
	if err != nil {
		if os.Getenv("CI") != "" {
			t.Fatal("awscli missing under CI (.ci/run installs it)")
		}
		t.Skip("awscli not found; apt-get install awscli")
	}
	return p
}

func startS3(t testing.TB) *s3Server {
	t.Helper()
	return startS3In(t, "us-east-1") // the IMDS simulator's placement/region
}

// startS3In is startS3 with the server in region.
func startS3In(t testing.TB, region string) *s3Server {
	t.Helper()
	return startS3Server(t, region, false, false)
}

// startS3Versioned is startS3 with versioning enabled on the bucket: a delete adds a delete
// marker and keeps what was there as a noncurrent version.
func startS3Versioned(t testing.TB) *s3Server {
	t.Helper()
	return startS3Server(t, "us-east-1", false, true)
}

// startS3TLS is startS3 serving HTTPS, with a throwaway self-signed certificate for 127.0.0.1
// (ECDSA P-256) that the clients started with s3Server.env and s3Server.aws trust.
func startS3TLS(t testing.TB) *s3Server {
	t.Helper()
	return startS3Server(t, "us-east-1", true, false)
}

func startS3Server(t testing.TB, region string, withTLS, versioned bool) *s3Server {
	t.Helper()
	bin := versitygwBin(t)
	dir := t.TempDir()
	data, meta := filepath.Join(dir, "data"), filepath.Join(dir, "meta")
	os.MkdirAll(data, 0o755)
	os.MkdirAll(meta, 0o755)
	port := freePort(t)
	s := &s3Server{endpoint: fmt.Sprintf("http://127.0.0.1:%d", port), region: region, data: data, meta: meta, done: make(chan struct{})}
	args := []string{"--access", s3Access, "--secret", s3Secret, "--port", fmt.Sprintf("127.0.0.1:%d", port),
		"--region", region, "--quiet"}
	if withTLS {
		var err error
		if s.certFile, s.keyFile, err = s3model.WriteSelfSignedCert(t.TempDir()); err != nil {
			t.Fatal(err)
		}
		s.endpoint = fmt.Sprintf("https://127.0.0.1:%d", port)
		args = append(args, "--cert", s.certFile, "--key", s.keyFile)
	}
	args = append(args, "posix", "--sidecar", meta)
	if versioned {
		versions := filepath.Join(dir, "versions")
		os.MkdirAll(versions, 0o755)
		args = append(args, "--versioning-dir", versions)
	}
	s.cmd = exec.Command(bin, append(args, data)...)
	logf, _ := os.Create(filepath.Join(dir, "versitygw.log"))
	s.cmd.Stdout, s.cmd.Stderr = logf, logf
	if err := s.cmd.Start(); err != nil {
		t.Fatalf("start versitygw: %v", err)
	}
	go func() { s.cmd.Wait(); logf.Close(); close(s.done) }()
	t.Cleanup(func() { s.cmd.Process.Kill(); <-s.done })
	eventually(t, 20*time.Second, "versitygw to listen", func() bool {
		c, err := net.Dial("tcp", fmt.Sprintf("127.0.0.1:%d", port))
		if err != nil {
			return false
		}
		c.Close()
		return true
	})
	s.aws(t, "s3api", "create-bucket", "--bucket", s3Bucket)
	if versioned {
		s.aws(t, "s3api", "put-bucket-versioning", "--bucket", s3Bucket, "--versioning-configuration", "Status=Enabled")
	}
	return s
}

// drop deletes the objects under prefix in the bucket from the server's disk, behind its back:
// a benchmark that runs many iterations frees what one wrote (some GiB) before the next, so
// that the disk does not fill. Nothing may use prefix afterwards.
func (s *s3Server) drop(t testing.TB, prefix string) {
	t.Helper()
	for _, dir := range []string{s.data, s.meta} {
		if err := os.RemoveAll(filepath.Join(dir, s3Bucket, filepath.FromSlash(prefix))); err != nil {
			t.Fatal(err)
		}
	}
}

// env is the AWS environment for a spotguard client of this server, through endpoint (the
// server's own when empty). It has no region, as under systemd on EC2: spotguard finds the
// bucket's (S3 names it) or the instance's (IMDS placement/region).
func (s *s3Server) env(endpoint string) []string {
	if endpoint == "" {
		endpoint = s.endpoint
	}
	return append([]string{
		"AWS_ACCESS_KEY_ID=" + s3Access, "AWS_SECRET_ACCESS_KEY=" + s3Secret, "AWS_ENDPOINT_URL_S3=" + endpoint,
	}, s.caEnv(false)...)
}

// caEnv is what makes a client trust the server's certificate: nothing over plain HTTP. A Go
// program (spotguard) gets SSL_CERT_FILE, which replaces Go's system roots and leaves the
// SDK's HTTP client alone, as on EC2, where S3's certificate is in the system roots. The SDK
// honours AWS_CA_BUNDLE too (config.LoadDefaultConfig appends it to the roots of the client),
// but only by building an HTTP client of its own (aws/transport/http.BuildableClient, at most
// 10 idle connections a host), which spotguard then keeps instead of its own client sized to
// store.concurrency; forAWSCLI (botocore, which reads no SSL_CERT_FILE) gets AWS_CA_BUNDLE.
func (s *s3Server) caEnv(forAWSCLI bool) []string {
	switch {
	case s.certFile == "":
		return nil
	case forAWSCLI:
		return []string{"AWS_CA_BUNDLE=" + s.certFile}
	default:
		return []string{"SSL_CERT_FILE=" + s.certFile}
	}
}

// aws runs awscli against the server and returns its output; it fails the test if awscli fails.
func (s *s3Server) aws(t testing.TB, args ...string) string {
	t.Helper()
	out, err := s.tryAWS(t, args...)
	if err != nil {
		t.Fatalf("aws %s: %v\n%s", strings.Join(args, " "), err, out)
	}
	return out
}

// tryAWS runs awscli against the server and returns its output and error.
func (s *s3Server) tryAWS(t testing.TB, args ...string) (string, error) {
	t.Helper()
	cmd := exec.Command(awsBin(t), append([]string{"--endpoint-url", s.endpoint}, args...)...)
	cmd.Env = append(os.Environ(), s.env("")...)
	cmd.Env = append(cmd.Env, s.caEnv(true)...)
	cmd.Env = append(cmd.Env, "HOME="+t.TempDir(), "AWS_EC2_METADATA_DISABLED=true", "AWS_REGION="+s.region, "AWS_DEFAULT_REGION="+s.region)
	out, err := cmd.CombinedOutput()
	return string(out), err
}

// runSpotguard runs a spotguard command to completion and returns its exit code and output.
func runSpotguard(t testing.TB, env []string, args ...string) (int, string, string) {
	t.Helper()
	cmd := exec.Command(spotguardBin, args...)
	cmd.Env = append([]string{"PATH=" + os.Getenv("PATH"), "HOME=" + t.TempDir()}, env...)
	var stdout, stderr bytes.Buffer
	cmd.Stdout, cmd.Stderr = &stdout, &stderr
	err := cmd.Run()
	code := 0
	var ee *exec.ExitError
	if errors.As(err, &ee) {
		code = ee.ExitCode()
	} else if err != nil {
		t.Fatalf("run spotguard %v: %v", args, err)
	}
	return code, stdout.String(), stderr.String()
}

// sameTree fails the test unless every regular file under want is in got with the same bytes,
// and got has no others (spotguard's own _spotguard/ aside).
func sameTree(t testing.TB, want, got string) {
	t.Helper()
	wantFiles, gotFiles := treeFiles(t, want), treeFiles(t, got)
	for rel := range gotFiles {
		if strings.HasPrefix(rel, "_spotguard/") {
			delete(gotFiles, rel)
		}
	}
	if len(wantFiles) == 0 {
		t.Fatalf("%s holds no files", want)
	}
	for rel, data := range wantFiles {
		if g, ok := gotFiles[rel]; !ok || !bytes.Equal(g, data) {
			t.Errorf("%s: %s differs from %s (present %v)", rel, got, want, ok)
		}
	}
	for rel := range gotFiles {
		if _, ok := wantFiles[rel]; !ok {
			t.Errorf("%s: extra file %s", got, rel)
		}
	}
}

func treeFiles(t testing.TB, root string) map[string][]byte {
	t.Helper()
	out := map[string][]byte{}
	filepath.WalkDir(root, func(p string, d os.DirEntry, err error) error {
		if err != nil {
			t.Fatal(err)
		}
		if d.Type().IsRegular() {
			rel, _ := filepath.Rel(root, p)
			b, err := os.ReadFile(p)
			if err != nil {
				t.Fatal(err)
			}
			out[filepath.ToSlash(rel)] = b
		}
		return nil
	})
	return out
}

// waitNoticeState waits until /status shows the notice key in state.
func (ap *agentProc) waitNoticeState(t testing.TB, key, state string, within time.Duration) {
	t.Helper()
	eventually(t, within, key+" → "+state, func() bool {
		for _, ns := range ap.status(t).Notices {
			if ns.Key == key && ns.State == state {
				return true
			}
		}
		return false
	})
}

// newestLocal returns the name of the newest complete checkpoint under dir.
func newestLocal(t testing.TB, dir string) string {
	t.Helper()
	entries, _ := os.ReadDir(dir)
	best := ""
	for _, e := range entries {
		if _, err := os.Stat(filepath.Join(dir, e.Name(), "_COMPLETE")); err == nil && e.Name() > best {
			best = e.Name()
		}
	}
	if best == "" {
		t.Fatalf("no complete checkpoint in %s", dir)
	}
	return best
}

// The whole path: a notice arrives, the trainer writes a multi-file checkpoint slowly, the agent
// streams it to a real S3 server and commits it; awscli (an independent client) lists and
// downloads the same bytes, and `spotguard restore` reproduces them bit for bit.
func TestNoticeCheckpointDurableInS3(t *testing.T) {
	needPeers(t)
	s3 := startS3(t)
	storeURL := "s3://" + s3Bucket + "/training"
	testNoticeCheckpoint(t, storeURL, s3.env(""), func(t *testing.T, ckpt, local string) {
		commit := latestCommit(t, s3.aws(t, "s3", "cp", "s3://"+s3Bucket+"/training/e2e/LATEST", "-"), ckpt)
		prefix := "s3://" + s3Bucket + "/training/e2e/" + ckpt + "/" + commit + "/"
		ls := s3.aws(t, "s3", "ls", "--recursive", prefix)
		for _, want := range []string{"shard-0.bin", "shard-3.bin", "_COMPLETE", "_spotguard/manifest.json"} {
			if !strings.Contains(ls, want) {
				t.Errorf("aws s3 ls lacks %s:\n%s", want, ls)
			}
		}
		dl := t.TempDir()
		s3.aws(t, "s3", "cp", "--recursive", "--exclude", "_spotguard/*", prefix, dl)
		sameTree(t, local, dl)
	})
}

// A trainer that writes its shards all at once under their own names, as torch DCP's ranks do:
// during the notice the agent sends each shard to S3 while it is written (the log says so for
// every shard), and the commit is the shards as they were closed, bit for bit. With
// checkpoint.send_while_written false, each is sent only once closed.
func TestNoticeCheckpointWrittenInPlaceDurableInS3(t *testing.T) {
	needPeers(t)
	for _, whileWritten := range []bool{true, false} {
		t.Run(fmt.Sprint("send_while_written=", whileWritten), func(t *testing.T) {
			s3 := startS3(t)
			storeURL := "s3://" + s3Bucket + "/inplace"
			sim := newIMDS(t)
			sim.startSpotTermination()
			ckdir := t.TempDir()
			tp := startTrainer(t, "--checkpoint-dir", ckdir, "--files", "4", "--checkpoint-mb", "16", "--write-seconds", "3",
				"--parallel", "--in-place")
			ap := startAgent(t, sim, noticeEnv(tp, ckdir, storeURL,
				append(s3.env(""), fmt.Sprint("SPOTGUARD_CHECKPOINT_SEND_WHILE_WRITTEN=", whileWritten))...)...)
			ap.waitNoticeState(t, "spot/terminate", "committed", 60*time.Second)
			ckpt := newestLocal(t, ckdir)
			grown := map[string]bool{}
			stored := 0
			kept := 0.0 // bytes sent before the files' close, by their "file stored" lines
			for _, l := range ap.logLines(t, "file stored") {
				if l["checkpoint"] == ckpt && strings.HasPrefix(fmt.Sprint(l["file"]), "shard-") {
					stored++
					if l["sent_while_written"] == true {
						grown[fmt.Sprint(l["file"])] = true
					}
					n, _ := l["bytes_sent_while_written"].(float64)
					kept += n
				}
			}
			metric := metricValue(t, ap.metrics(t), "spotguard_checkpoint_upload_sent_while_written_bytes_total")
			t.Logf("bytes sent while written: %.0f of %d", metric, 4*16<<20)
			if metric != kept || (kept > 0) != whileWritten || kept > 4*16<<20 {
				t.Errorf("bytes sent while written: %v by the metric, %v by the files' lines; want them equal, and more than none only when on (at most the 64 MiB written)", metric, kept)
			}
			if stored != 4 {
				t.Errorf("%d shards stored; want 4", stored)
			}
			for i := range 4 {
				if name := fmt.Sprintf("shard-%d.bin", i); grown[name] != whileWritten {
					t.Errorf("%s sent while it was written: %v; want %v", name, grown[name], whileWritten)
				}
			}
			restoreSameTree(t, append([]string{"SPOTGUARD_STORE_URL=" + storeURL, "SPOTGUARD_STORE_JOB=e2e"}, s3.env("")...), ap.configPath, ckdir, ckpt)
			if out := s3.aws(t, "s3api", "list-multipart-uploads", "--bucket", s3Bucket, "--prefix", "inplace/"); strings.Contains(out, "UploadId") {
				t.Errorf("incomplete uploads left:\n%s", out)
			}
		})
	}
}

func TestNoticeCheckpointDurableInFileStore(t *testing.T) {
	needPeers(t)
	storeDir := t.TempDir()
	testNoticeCheckpoint(t, "file://"+storeDir, nil, func(t *testing.T, ckpt, local string) {
		latest, err := os.ReadFile(filepath.Join(storeDir, "e2e", "LATEST"))
		if err != nil {
			t.Fatal(err)
		}
		got := filepath.Join(storeDir, "e2e", ckpt, latestCommit(t, string(latest), ckpt))
		if _, err := os.Stat(filepath.Join(got, "_spotguard", "manifest.json")); err != nil {
			t.Errorf("manifest: %v", err)
		}
		sameTree(t, local, got)
	})
}

// noticeEnv is the environment of an agent that acts on a spot notice (not a rebalance) for
// trainer tp, whose checkpoints are in ckdir, and stores them in job e2e at storeURL in parts of
// 5 MiB; extra follows.
func noticeEnv(tp *trainerProc, ckdir, storeURL string, extra ...string) []string {
	return append([]string{"SPOTGUARD_TRAINER_PIDFILE=" + tp.pidfile, "SPOTGUARD_NOTICES_REBALANCE=ignore",
		"SPOTGUARD_CHECKPOINT_DIR=" + ckdir, "SPOTGUARD_STORE_URL=" + storeURL, "SPOTGUARD_STORE_JOB=e2e",
		"SPOTGUARD_STORE_PART_SIZE=5MiB"}, extra...)
}

func testNoticeCheckpoint(t *testing.T, storeURL string, storeEnv []string, inspect func(t *testing.T, ckpt, local string)) {
	sim := newIMDS(t)
	sim.startSpotTermination()
	ckdir := t.TempDir()
	tp := startTrainer(t, "--checkpoint-dir", ckdir, "--files", "4", "--checkpoint-mb", "6", "--write-seconds", "2")
	ap := startAgent(t, sim, noticeEnv(tp, ckdir, storeURL, storeEnv...)...)
	ap.waitNoticeState(t, "spot/terminate", "committed", 60*time.Second)

	ckpt := newestLocal(t, ckdir)
	st := ap.status(t)
	for _, ns := range st.Notices {
		if ns.Key != "spot/terminate" {
			continue
		}
		var states []string
		for _, tr := range ns.Transitions {
			states = append(states, tr.State)
		}
		if got := strings.Join(states, " → "); got != "detected → trainer_signalled → checkpoint_written → committed" {
			t.Errorf("transitions: %s", got)
		}
	}
	if u := st.Uploads; u == nil || !u.Urgent || len(u.Checkpoints) != 1 || !u.Checkpoints[0].Committed ||
		u.Checkpoints[0].Files != 5 || u.Checkpoints[0].FilesStored != 5 {
		t.Errorf("/status uploads = %+v; want urgent, %s committed with 5 of 5 files stored", u, ckpt)
	}
	m := ap.metrics(t)
	for _, want := range []string{`spotguard_checkpoints_committed_total{trigger="notice"} 1`, "spotguard_notice_time_to_durable_seconds_count 1"} {
		if !hasLine(m, want) {
			t.Errorf("/metrics lacks %q", want)
		}
	}
	inspect(t, ckpt, filepath.Join(ckdir, ckpt))

	// The next instance restores it, bit for bit.
	stdout := restoreSameTree(t, append([]string{"SPOTGUARD_STORE_URL=" + storeURL, "SPOTGUARD_STORE_JOB=e2e"}, storeEnv...), ap.configPath, ckdir, ckpt)
	if !strings.Contains(stdout, "restored "+ckpt) || !strings.Contains(stdout, "every checksum verified") {
		t.Errorf("restore summary = %q", stdout)
	}

	code, stdout, _ := runSpotguard(t, append([]string{"SPOTGUARD_STORE_URL=" + storeURL, "SPOTGUARD_STORE_JOB=e2e"}, storeEnv...),
		"list", "--config", ap.configPath)
	if code != 0 || !strings.Contains(stdout, ckpt) || !strings.Contains(stdout, "LATEST") || !strings.Contains(stdout, "notice") {
		t.Errorf("spotguard list: exit %d\n%s", code, stdout)
	}
}

// latestCommit returns the commit that LATEST (its JSON) names, failing the test unless it names
// checkpoint ckpt and a commit.
func latestCommit(t testing.TB, latest, ckpt string) string {
	t.Helper()
	var l struct{ Checkpoint, Commit string }
	if err := json.Unmarshal([]byte(latest), &l); err != nil || l.Checkpoint != ckpt || l.Commit == "" {
		t.Fatalf("LATEST = %s (%v); want checkpoint %s and its commit", latest, err, ckpt)
	}
	return l.Commit
}

func TestRestoreNothingCommitted(t *testing.T) {
	needPeers(t)
	storeDir := t.TempDir()
	code, _, stderr := runSpotguard(t, []string{"SPOTGUARD_STORE_URL=file://" + storeDir, "SPOTGUARD_STORE_JOB=empty-job"},
		"restore", "--config", writeEmptyConfig(t), "--to", t.TempDir())
	if code != 1 || !strings.Contains(stderr, "empty-job") || !strings.Contains(stderr, storeDir) {
		t.Errorf("restore of nothing: exit %d, stderr %q; want 1 naming the job and the store", code, stderr)
	}
	// A first run under spotguard-restore.service: nothing committed yet is not a failure.
	code, stdout, stderr := runSpotguard(t, []string{"SPOTGUARD_STORE_URL=file://" + storeDir, "SPOTGUARD_STORE_JOB=empty-job"},
		"restore", "--allow-empty", "--config", writeEmptyConfig(t), "--to", t.TempDir())
	if code != 0 || !strings.Contains(stdout, "nothing to restore") {
		t.Errorf("restore --allow-empty of nothing: exit %d, %q %q; want 0", code, stdout, stderr)
	}
	// But a store that cannot be used is still an error.
	code, _, _ = runSpotguard(t, []string{"SPOTGUARD_STORE_URL=file://" + storeDir, "SPOTGUARD_STORE_JOB=a/b"},
		"restore", "--allow-empty", "--config", writeEmptyConfig(t), "--to", t.TempDir())
	if code != 1 {
		t.Errorf("restore --allow-empty with a bad job: exit %d; want 1", code)
	}
	// So is a file store whose directory is missing (its file system not mounted yet, a typo):
	// it is not an empty store, and neither list nor restore creates it.
	missing := filepath.Join(t.TempDir(), "fsx", "checkpoints")
	for _, args := range [][]string{{"restore", "--allow-empty", "--to", t.TempDir()}, {"list"}} {
		code, stdout, stderr = runSpotguard(t, []string{"SPOTGUARD_STORE_URL=file://" + missing, "SPOTGUARD_STORE_JOB=empty-job"},
			append(args, "--config", writeEmptyConfig(t))...)
		if code != 1 || !strings.Contains(stderr, missing+" does not exist") {
			t.Errorf("%s with a missing file store: exit %d, %q %q; want 1 saying %s does not exist", args[0], code, stdout, stderr, missing)
		}
		if _, err := os.Stat(missing); err == nil {
			t.Fatalf("%s created the missing file store %s", args[0], missing)
		}
	}
}

func writeEmptyConfig(t testing.TB) string {
	p := filepath.Join(t.TempDir(), "empty.yaml")
	os.WriteFile(p, nil, 0o644)
	return p
}

// throttle is a TCP proxy to target that passes at most rate bytes per second each way, so an
// upload is still in flight when the test wants it to be.
type throttle struct {
	ln     net.Listener
	target string
	rate   atomic.Int64
	wg     sync.WaitGroup
}

func startThrottle(t testing.TB, target string, rate int64) *throttle {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	th := &throttle{ln: ln, target: target}
	th.rate.Store(rate)
	th.wg.Go(func() {
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			th.wg.Go(func() { th.serve(c) })
		}
	})
	t.Cleanup(func() { ln.Close(); th.wg.Wait() })
	return th
}

func (th *throttle) url() string { return "http://" + th.ln.Addr().String() }

func (th *throttle) serve(c net.Conn) { pipe(c, th.target, th.copy) }

// pipe connects c to target and passes bytes both ways with copy, half-closing each side when
// its source ends; it closes both when done.
func pipe(c net.Conn, target string, copy func(dst io.Writer, src io.Reader)) {
	defer c.Close()
	up, err := net.Dial("tcp", target)
	if err != nil {
		return
	}
	defer up.Close()
	var wg sync.WaitGroup
	wg.Go(func() { copy(up, c); up.(*net.TCPConn).CloseWrite() })
	wg.Go(func() { copy(c, up); c.(*net.TCPConn).CloseWrite() })
	wg.Wait()
}

// copy passes bytes in 16 KiB slices, pacing them to the rate with a timer per slice.
func (th *throttle) copy(dst io.Writer, src io.Reader) {
	buf := make([]byte, 16<<10)
	for {
		n, err := src.Read(buf)
		if n > 0 {
			if _, werr := dst.Write(buf[:n]); werr != nil {
				return
			}
			if r := th.rate.Load(); r > 0 {
				<-time.After(time.Duration(float64(n) / float64(r) * float64(time.Second)))
			}
		}
		if err != nil {
			return
		}
	}
}

// kill -9 of the agent mid-upload, then a restart: the checkpoint is committed afterwards, and it
// is the trainer's bytes.
func TestKillMidUploadThenRestart(t *testing.T) {
	needPeers(t)
	s3 := startS3(t)
	slow := startThrottle(t, strings.TrimPrefix(s3.endpoint, "http://"), 2<<20) // 2 MiB/s
	ckdir := t.TempDir()
	// A complete checkpoint the agent will find at start (as after a reboot), 3 × 12 MiB, so
	// each file is a multipart upload of 5 MiB parts.
	tp := startTrainer(t, "--checkpoint-dir", ckdir, "--files", "3", "--checkpoint-mb", "12")
	tp.cmd.Process.Signal(syscall.SIGUSR1)
	eventually(t, 20*time.Second, "the trainer's checkpoint", func() bool {
		entries, _ := filepath.Glob(filepath.Join(ckdir, "*", "_COMPLETE"))
		return len(entries) == 1
	})
	ckpt := newestLocal(t, ckdir)
	sim := newIMDS(t)
	sim.start("spot", "-d", "100000", "--rebalance-delay-sec", "100000")
	storeURL := "s3://" + s3Bucket + "/kill"
	env := append([]string{"SPOTGUARD_TRAINER_PIDFILE=" + tp.pidfile, "SPOTGUARD_CHECKPOINT_DIR=" + ckdir,
		"SPOTGUARD_STORE_URL=" + storeURL, "SPOTGUARD_STORE_JOB=e2e", "SPOTGUARD_STORE_PART_SIZE=5MiB"}, s3.env(slow.url())...)
	ap := startAgent(t, sim, env...)
	var uploads string
	eventually(t, 30*time.Second, "the upload to be under way", func() bool {
		uploads = s3.aws(t, "s3api", "list-multipart-uploads", "--bucket", s3Bucket)
		return strings.Contains(uploads, "UploadId")
	})
	// The killed run's commit, from its uploads' keys: kill/e2e/<checkpoint>/<commit>/<file>.
	m := regexp.MustCompile(`"kill/e2e/` + regexp.QuoteMeta(ckpt) + `/([^/"]+)/`).FindStringSubmatch(uploads)
	if m == nil {
		t.Fatalf("no upload under kill/e2e/%s/<commit>/:\n%s", ckpt, uploads)
	}
	killedCommit := m[1]
	ap.cmd.Process.Kill()
	<-ap.done
	if ls, _ := s3.tryAWS(t, "s3", "ls", "--recursive", "s3://"+s3Bucket+"/kill/"); strings.Contains(ls, "manifest.json") {
		t.Fatalf("a manifest exists although the agent was killed mid-upload:\n%s", ls)
	}

	// Restart, now at full speed, with the runtime directory the killed run had (as systemd's
	// restart keeps /run/spotguard): the agent resumes its own commit and finishes it.
	ap2 := startAgent(t, sim, append([]string{"SPOTGUARD_TRAINER_PIDFILE=" + tp.pidfile, "SPOTGUARD_CHECKPOINT_DIR=" + ckdir,
		"SPOTGUARD_STORE_URL=" + storeURL, "SPOTGUARD_STORE_JOB=e2e", "SPOTGUARD_STORE_PART_SIZE=5MiB",
		"SPOTGUARD_AGENT_RUNTIME_DIR=" + ap.runtimeDir}, s3.env("")...)...)
	eventually(t, 60*time.Second, "the checkpoint to be committed after the restart", func() bool {
		return hasLine(ap2.metrics(t), `spotguard_checkpoints_committed_total{trigger="periodic"} 1`)
	})
	latest := s3.aws(t, "s3", "cp", "s3://"+s3Bucket+"/kill/e2e/LATEST", "-")
	if got := latestCommit(t, latest, ckpt); got != killedCommit {
		t.Errorf("committed as %s; want the killed run's commit %s resumed", got, killedCommit)
	}
	// The killed run's requests still in the throttle's buffers land after the restart aborted
	// its uploads (versitygw brings an upload back when a part lands in it); the agent aborts
	// again a few seconds later.
	eventually(t, 20*time.Second, "the killed run's multipart uploads to be aborted", func() bool {
		return !strings.Contains(s3.aws(t, "s3api", "list-multipart-uploads", "--bucket", s3Bucket), "UploadId")
	})
	restoreSameTree(t, append([]string{"SPOTGUARD_STORE_URL=" + storeURL, "SPOTGUARD_STORE_JOB=e2e"}, s3.env("")...), ap2.configPath, ckdir, ckpt)
}

// TestKillMidGrowthThenRestart: during a notice, the agent is killed (-9) while the trainer writes
// its shards in place and they are sent as they grow. Restarted with the runtime directory the
// killed run had, it does not signal the trainer again, commits the checkpoint the trainer
// finishes, bit for bit, and leaves none of the killed run's uploads behind.
func TestKillMidGrowthThenRestart(t *testing.T) {
	needPeers(t)
	s3 := startS3(t)
	slow := startThrottle(t, strings.TrimPrefix(s3.endpoint, "http://"), 4<<20) // 4 MiB/s a connection
	storeURL := "s3://" + s3Bucket + "/killgrow"
	sim := newIMDS(t)
	sim.startSpotTermination()
	ckdir := t.TempDir()
	tp := startTrainer(t, "--checkpoint-dir", ckdir, "--files", "4", "--checkpoint-mb", "32", "--write-seconds", "8",
		"--parallel", "--in-place")
	env := func(endpoint string, extra ...string) []string {
		return noticeEnv(tp, ckdir, storeURL, append(s3.env(endpoint), extra...)...)
	}
	ap := startAgent(t, sim, env(slow.url())...)
	eventually(t, 30*time.Second, "a shard to be sent while it is written", func() bool {
		return strings.Contains(s3.aws(t, "s3api", "list-multipart-uploads", "--bucket", s3Bucket, "--prefix", "killgrow/"), "UploadId")
	})
	if markers, _ := filepath.Glob(filepath.Join(ckdir, "*", "_COMPLETE")); len(markers) != 0 {
		t.Fatalf("the trainer finished its checkpoint before the agent was killed (%v); it must still be writing", markers)
	}
	ap.cmd.Process.Kill()
	<-ap.done

	ap2 := startAgent(t, sim, env("", "SPOTGUARD_AGENT_RUNTIME_DIR="+ap.runtimeDir)...)
	ap2.waitNoticeState(t, "spot/terminate", "committed", 60*time.Second)
	if got := tp.signals(t); len(got) != 1 {
		t.Errorf("the trainer was signalled %d times; want once, by the killed run", len(got))
	}
	ckpt := newestLocal(t, ckdir)
	restoreSameTree(t, append([]string{"SPOTGUARD_STORE_URL=" + storeURL, "SPOTGUARD_STORE_JOB=e2e"}, s3.env("")...), ap2.configPath, ckdir, ckpt)
	// The killed run's parts still in the throttle's buffers may land after the restart aborted
	// its uploads, and bring them back; the agent aborts again a few seconds later.
	eventually(t, 30*time.Second, "the killed run's multipart uploads to be aborted", func() bool {
		return !strings.Contains(s3.aws(t, "s3api", "list-multipart-uploads", "--bucket", s3Bucket, "--prefix", "killgrow/"), "UploadId")
	})
}

// restoreSameTree runs `spotguard restore` with env and the configuration at config into a new
// directory, fails the test unless it succeeds with checkpoint ckpt of ckdir restored bit for
// bit, and returns its standard output.
func restoreSameTree(t *testing.T, env []string, config, ckdir, ckpt string) string {
	t.Helper()
	to := t.TempDir()
	code, stdout, stderr := runSpotguard(t, env, "restore", "--config", config, "--to", to)
	if code != 0 {
		t.Fatalf("spotguard restore: exit %d\n%s%s", code, stdout, stderr)
	}
	sameTree(t, filepath.Join(ckdir, ckpt), filepath.Join(to, ckpt))
	return stdout
}
