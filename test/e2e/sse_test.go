package e2e

import (
	"net/http"
	"net/http/httptest"
	"net/http/httputil"
	"net/url"
	"strings"
	"sync"
	"testing"
	"time"
)

// sseRecorder is an HTTP proxy in front of an S3 server that records, for every write request,
// its kind and its server-side encryption headers.
type sseRecorder struct {
	srv *httptest.Server

	mu     sync.Mutex
	writes []sseWrite
}

type sseWrite struct{ kind, path, sse, kmsKeyID string }

func startSSERecorder(t testing.TB, target string) *sseRecorder {
	t.Helper()
	u, err := url.Parse(target)
	if err != nil {
		t.Fatal(err)
	}
	tr := http.DefaultTransport.(*http.Transport).Clone()
	rp := &httputil.ReverseProxy{
		Rewrite: func(pr *httputil.ProxyRequest) {
			pr.SetURL(u)
			pr.Out.Host = pr.In.Host // the client signed the proxy's host
		},
		Transport: tr,
	}
	r := &sseRecorder{}
	r.srv = httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, req *http.Request) {
		q := req.URL.Query()
		kind := ""
		switch {
		case req.Method == http.MethodPut && q.Has("partNumber"):
			kind = "part"
		case req.Method == http.MethodPut && !q.Has("uploadId"):
			kind = "put"
		case req.Method == http.MethodPost && q.Has("uploads"):
			kind = "create"
		case req.Method == http.MethodPost && q.Has("uploadId"):
			kind = "complete"
		}
		if kind != "" {
			r.mu.Lock()
			r.writes = append(r.writes, sseWrite{kind: kind, path: req.URL.Path,
				sse: req.Header.Get("X-Amz-Server-Side-Encryption"), kmsKeyID: req.Header.Get("X-Amz-Server-Side-Encryption-Aws-Kms-Key-Id")})
			r.mu.Unlock()
		}
		rp.ServeHTTP(w, req)
	}))
	t.Cleanup(func() {
		r.srv.Close()
		tr.CloseIdleConnections()
	})
	return r
}

// check fails the test unless the recorder saw at least one write of each kind in want, every
// put and create carrying sse and kmsKeyID, and no part or completion carrying either. It
// returns how many writes of each kind it saw, and forgets them.
func (r *sseRecorder) check(t *testing.T, what, sse, kmsKeyID string, want ...string) map[string]int {
	t.Helper()
	r.mu.Lock()
	writes := r.writes
	r.writes = nil
	r.mu.Unlock()
	kinds := map[string]int{}
	for _, w := range writes {
		kinds[w.kind]++
		wantSSE, wantKey := "", ""
		if w.kind == "put" || w.kind == "create" {
			wantSSE, wantKey = sse, kmsKeyID
		}
		if w.sse != wantSSE || w.kmsKeyID != wantKey {
			t.Errorf("%s: %s %s carried x-amz-server-side-encryption %q, kms key %q; want %q, %q", what, w.kind, w.path, w.sse, w.kmsKeyID, wantSSE, wantKey)
		}
	}
	for _, k := range want {
		if kinds[k] == 0 {
			t.Errorf("%s: no %s request seen (writes %v)", what, k, kinds)
		}
	}
	t.Logf("%s: writes %v", what, kinds)
	return kinds
}

// TestServerSideEncryptionEveryCommand: store.sse and store.kms_key_id reach every command that
// writes to the store — the agent (the store probe, the checkpoint's files in one PutObject and
// in a multipart upload, the manifest, LATEST), `spotguard doctor` (its probe object) and
// `spotguard drill --store s3://...` — on each PutObject and CreateMultipartUpload, read at a
// proxy in front of versitygw. versitygw ignores the headers (see checkpoint's
// TestS3ServerSideEncryptionHeaders), so this shows what spotguard sends, not that S3 encrypts.
func TestServerSideEncryptionEveryCommand(t *testing.T) {
	needPeers(t)
	s3 := startS3(t)
	rec := startSSERecorder(t, s3.endpoint)
	const key = "arn:aws:kms:us-east-1:111122223333:key/1234abcd-12ab-34cd-56ef-1234567890ab"
	sseEnv := append(s3.env(rec.srv.URL), "SPOTGUARD_STORE_SSE=aws:kms", "SPOTGUARD_STORE_KMS_KEY_ID="+key)

	t.Run("run", func(t *testing.T) {
		sim := newIMDS(t)
		sim.startSpotTermination()
		ckdir := t.TempDir()
		// 4 files of 6 MiB with 5 MiB parts: every file is a multipart upload; the marker and the
		// manifest are single PutObjects.
		tp := startTrainer(t, "--checkpoint-dir", ckdir, "--files", "4", "--checkpoint-mb", "24", "--write-seconds", "1")
		ap := startAgent(t, sim, append([]string{"SPOTGUARD_TRAINER_PIDFILE=" + tp.pidfile, "SPOTGUARD_NOTICES_REBALANCE=ignore",
			"SPOTGUARD_CHECKPOINT_DIR=" + ckdir, "SPOTGUARD_STORE_URL=s3://" + s3Bucket + "/sse", "SPOTGUARD_STORE_JOB=e2e-sse",
			"SPOTGUARD_STORE_PART_SIZE=5MiB"}, sseEnv...)...)
		ap.waitNoticeState(t, "spot/terminate", "committed", 60*time.Second)
		rec.check(t, "spotguard run", "aws:kms", key, "put", "create", "part", "complete")

		// What the agent committed restores, through the same proxy, and reads send nothing.
		code, stdout, stderr := runSpotguard(t, append([]string{"SPOTGUARD_STORE_URL=s3://" + s3Bucket + "/sse", "SPOTGUARD_STORE_JOB=e2e-sse"}, sseEnv...),
			"restore", "--config", ap.configPath, "--to", t.TempDir())
		if code != 0 || !strings.Contains(stdout, "every checksum verified") {
			t.Errorf("spotguard restore: exit %d\n%s%s", code, stdout, stderr)
		}
		if kinds := rec.check(t, "spotguard restore", "aws:kms", key); len(kinds) != 0 {
			t.Errorf("spotguard restore wrote to the store: %v", kinds)
		}
	})

	t.Run("doctor", func(t *testing.T) {
		sim := quietIMDS(t)
		env := append([]string{"AWS_EC2_METADATA_SERVICE_ENDPOINT=" + sim.endpoint(), "SPOTGUARD_STORE_JOB=e2e-sse-doctor",
			"SPOTGUARD_TRAINER_MATCH=no-trainer-here", "SPOTGUARD_METRICS_CLOUDWATCH=false", "SPOTGUARD_CHECKPOINT_DIR=" + t.TempDir(),
			"SPOTGUARD_STORE_URL=s3://" + s3Bucket + "/sse"}, sseEnv...)
		code, stdout, stderr := runSpotguard(t, env, "doctor", "--config", writeEmptyConfig(t))
		if !strings.Contains(stdout, "PASS  store") {
			t.Errorf("doctor: exit %d; want the store check to pass\n%s%s", code, stdout, stderr)
		}
		rec.check(t, "spotguard doctor", "aws:kms", key, "put")
	})

	t.Run("drill", func(t *testing.T) {
		code, r, stderr := runDrill(t, append(sseEnv, "SPOTGUARD_STORE_PART_SIZE=5MiB"), "--size", "48MiB", "--store", "s3://"+s3Bucket+"/sse-drill")
		checkDrillPass(t, code, r, 48<<20, stderr)
		rec.check(t, "spotguard drill", "aws:kms", key, "put", "create", "part", "complete")
	})
}
