package e2e

// Trouble visible before it matters (issue 10, items 6 and 7): a store that cannot work and an
// IMDS spot source that keeps failing turn /healthz 503 with the reason, `spotguard doctor` FAILs
// naming it, and `spotguard drill` fails in seconds with the real cause.

import (
	"encoding/json"
	"io"
	"net/http"
	"net/http/httptest"
	"net/http/httputil"
	"net/url"
	"strings"
	"testing"
	"time"
)

const missingBucket = "nosuchbucket-e2e"

// healthz is the status code and body of /healthz.
func (ap *agentProc) healthz(t testing.TB) (int, healthzJSON) {
	t.Helper()
	client := http.Client{Timeout: 5 * time.Second}
	resp, err := client.Get(ap.base + "/healthz")
	if err != nil {
		t.Fatalf("GET /healthz: %v", err)
	}
	defer resp.Body.Close()
	b, _ := io.ReadAll(resp.Body)
	var h healthzJSON
	if err := json.Unmarshal(b, &h); err != nil {
		t.Fatalf("/healthz body %q: %v", b, err)
	}
	return resp.StatusCode, h
}

type healthzJSON struct {
	Healthy  bool     `json:"healthy"`
	Reasons  []string `json:"reasons"`
	Warnings []string `json:"warnings"`
}

// The agent, started against a bucket that does not exist, turns /healthz 503 within 30 s of its
// start with a reason naming the bucket and S3's error; /status, the metrics and the systemd
// STATUS line say the same; the agent keeps running and stops promptly.
func TestMissingBucketIsUnhealthy(t *testing.T) {
	needPeers(t)
	s3 := startS3(t)
	sim := quietIMDS(t)
	ns := listenNotify(t)
	ts := newS3TestStore(s3, "x")
	ts.url = "s3://" + missingBucket + "/x"
	start := time.Now()
	ap := startStoreAgent(t, sim, t.TempDir(), ts, "e2e-health", noTrainer, "NOTIFY_SOCKET="+ns.path)
	var h healthzJSON
	// Until the first probe has its answer, /healthz is 503 for that ("has not finished yet").
	eventually(t, 30*time.Second-time.Since(start), "/healthz 503 with the probe's answer", func() bool {
		var code int
		code, h = ap.healthz(t)
		return code == http.StatusServiceUnavailable && !strings.Contains(strings.Join(h.Reasons, " "), "has not finished yet")
	})
	t.Logf("/healthz 503 %.1f s after start: %q", time.Since(start).Seconds(), h.Reasons)
	if h.Healthy || len(h.Reasons) != 1 || !strings.Contains(h.Reasons[0], "s3://"+missingBucket+"/x") ||
		!strings.Contains(h.Reasons[0], "NoSuchBucket") || !strings.Contains(h.Reasons[0], "aws s3 mb s3://"+missingBucket) {
		t.Errorf("/healthz = %+v; want one reason naming the store, NoSuchBucket and the fix", h)
	}

	resp, err := http.Get(ap.base + "/status")
	if err != nil {
		t.Fatal(err)
	}
	var st struct {
		Store struct {
			URL        string `json:"url"`
			OK         bool   `json:"ok"`
			FailedStep string `json:"failed_step"`
			Reason     string `json:"reason"`
			Error      string `json:"error"`
		} `json:"store"`
		Health healthzJSON `json:"health"`
	}
	json.NewDecoder(resp.Body).Decode(&st)
	resp.Body.Close()
	if st.Store.OK || st.Store.Reason != "not_found" || st.Store.FailedStep != "list" || !strings.Contains(st.Store.Error, "NoSuchBucket") || st.Health.Healthy {
		t.Errorf("/status store = %+v, health %+v; want the failed list, not_found", st.Store, st.Health)
	}
	metrics := ap.metrics(t)
	for _, want := range []string{"spotguard_store_up 0", "spotguard_healthy 0", "spotguard_store_probe_failures_total 1"} {
		if !hasLine(metrics, want) {
			t.Errorf("/metrics lacks %q", want)
		}
	}
	ns.until(t, "a STATUS naming the store trouble", func(m string) bool {
		return strings.Contains(m, "STATUS=UNHEALTHY: store s3://"+missingBucket+"/x: list failed: NoSuchBucket; watching")
	})
	if n := len(ap.logLines(t, "store probe failed: checkpoints cannot be committed")); n != 1 {
		t.Errorf("store probe failure logged %d times; want once", n)
	}
}

// doctor against versitygw: a bucket that does not exist is a FAIL naming it (exit 1); the
// bucket that exists passes the store check and is left as it was.
func TestDoctorStore(t *testing.T) {
	needPeers(t)
	s3 := startS3(t)
	sim := quietIMDS(t)
	env := append(s3.env(""), "AWS_EC2_METADATA_SERVICE_ENDPOINT="+sim.endpoint(), "SPOTGUARD_STORE_JOB=e2e-doctor",
		"SPOTGUARD_TRAINER_MATCH=no-trainer-here", "SPOTGUARD_METRICS_CLOUDWATCH=false", "SPOTGUARD_CHECKPOINT_DIR="+t.TempDir())

	t0 := time.Now()
	code, stdout, stderr := runSpotguard(t, append(env, "SPOTGUARD_STORE_URL=s3://"+missingBucket+"/x"), "doctor", "--config", writeEmptyConfig(t))
	t.Logf("doctor with a missing bucket: exit %d in %.1f s", code, time.Since(t0).Seconds())
	want := "FAIL  store             store s3://" + missingBucket + "/x job e2e-doctor: list e2e-doctor/_spotguard/ failed: NoSuchBucket"
	if code != 1 || !strings.Contains(stdout, want) || !strings.Contains(stdout, "fix: the bucket "+missingBucket+" does not exist") {
		t.Errorf("doctor: exit %d; want 1 and %q with the fix\nstdout:\n%s\nstderr:\n%s", code, want, stdout, stderr)
	}
	if !strings.Contains(stdout, "PASS  imds spot") {
		t.Errorf("doctor did not pass the simulator's spot source:\n%s", stdout)
	}

	code, stdout, stderr = runSpotguard(t, append(env, "SPOTGUARD_STORE_URL=s3://"+s3Bucket+"/doctor"), "doctor", "--config", writeEmptyConfig(t), "--json")
	var rep struct {
		Pass   bool `json:"pass"`
		Checks []struct {
			Name, Status, Detail string
		} `json:"checks"`
	}
	if err := json.Unmarshal([]byte(stdout), &rep); err != nil {
		t.Fatalf("doctor --json %q: %v\n%s", stdout, err, stderr)
	}
	clock := false
	for _, c := range rep.Checks {
		if c.Name == "store" && (c.Status != "PASS" || !strings.Contains(c.Detail, "s3://"+s3Bucket+"/doctor job e2e-doctor")) {
			t.Errorf("store check = %+v; want PASS naming the store", c)
		}
		// The server runs on this clock: the probe object's last-modified time agrees with it.
		if c.Name == "clock" {
			clock = true
			if c.Status != "PASS" {
				t.Errorf("clock check = %+v; want PASS (the S3 server shares this clock)", c)
			}
		}
		if c.Status == "FAIL" {
			t.Errorf("check %s failed: %s", c.Name, c.Detail)
		}
	}
	if !clock {
		t.Errorf("no clock check after the store check passed:\n%s", stdout)
	}
	if code != 0 || !rep.Pass {
		t.Errorf("doctor with a working store: exit %d, pass %v; want 0, true\n%s", code, rep.Pass, stdout)
	}
	if ls, _ := s3.tryAWS(t, "s3", "ls", "--recursive", "s3://"+s3Bucket+"/doctor/"); strings.TrimSpace(ls) != "" {
		t.Errorf("the store check left objects behind:\n%s", ls)
	}
}

// drill against a bucket that does not exist fails in seconds, says why, and advises what fits.
func TestDrillMissingBucketFailsFast(t *testing.T) {
	needPeers(t)
	s3 := startS3(t)
	start := time.Now()
	code, r, stderr := runDrill(t, s3.env(""), "--size", "8MiB", "--store", "s3://"+missingBucket+"/x")
	took := time.Since(start)
	t.Logf("drill with a missing bucket: exit %d in %.1f s: %s", code, took.Seconds(), r.Reason)
	if took > 20*time.Second {
		t.Errorf("drill took %s; want it to fail in seconds", took)
	}
	if code != 1 || r.Pass || !strings.Contains(r.Reason, "NoSuchBucket") || !strings.Contains(r.Reason, missingBucket) {
		t.Errorf("drill: exit %d, %+v; want FAIL naming the bucket and NoSuchBucket\nstderr: %s", code, r, stderr)
	}
	if len(r.Advice) != 1 || !strings.Contains(r.Advice[0], "aws s3 mb s3://"+missingBucket) {
		t.Errorf("drill advice = %q; want the one about creating the bucket", r.Advice)
	}
	if strings.Contains(strings.Join(r.Advice, " "), "smaller checkpoint") {
		t.Errorf("drill blames the checkpoint size for a missing bucket: %q", r.Advice)
	}
}

// A bucket name S3 refuses (capitals) gets the fix for it from list and restore, against a real
// S3 server: it used to get S3's InvalidBucketName and no fix at all.
func TestInvalidBucketNameIsSaid(t *testing.T) {
	needPeers(t)
	s3 := startS3(t)
	for _, args := range [][]string{{"list"}, {"restore", "--to", t.TempDir()}} {
		code, _, stderr := runSpotguard(t, append(s3.env(""), "AWS_REGION=us-east-1"), append(args, "--store.url", "s3://Checkpoints/x", "--store.job", "j")...)
		want := `fix: S3 does not take "Checkpoints" as a bucket name (3 to 63 lowercase letters, digits, dots and hyphens): fix the bucket in store.url`
		if code != 1 || !strings.Contains(stderr, "InvalidBucketName") || !strings.Contains(stderr, want) {
			t.Errorf("spotguard %s with bucket Checkpoints: exit %d, stderr:\n%s\nwant 1, InvalidBucketName and %q", args[0], code, stderr, want)
		}
	}
}

// failPath is a reverse proxy to target that answers 500 for one path and passes the rest.
func failPath(t *testing.T, target, path string) string {
	t.Helper()
	u, err := url.Parse(target)
	if err != nil {
		t.Fatal(err)
	}
	proxy := httputil.NewSingleHostReverseProxy(u)
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.URL.Path == path {
			http.Error(w, "injected failure", http.StatusInternalServerError)
			return
		}
		proxy.ServeHTTP(w, r)
	}))
	t.Cleanup(srv.Close)
	return srv.URL
}

// The spot source failing while every other source answers: /healthz 503 naming it after 30 s,
// /status shows it per source, STATUS says which source. A source that answers does not hide it.
func TestSpotSourceFailingIsUnhealthy(t *testing.T) {
	needPeers(t)
	sim := quietIMDS(t)
	endpoint := failPath(t, sim.endpoint(), "/latest/meta-data/spot/instance-action")
	ns := listenNotify(t)
	ap := startAgent(t, sim, noTrainer, "SPOTGUARD_IMDS_ENDPOINT="+endpoint, "NOTIFY_SOCKET="+ns.path)
	start := time.Now()
	var h healthzJSON
	eventually(t, 45*time.Second, "/healthz 503", func() bool {
		var code int
		code, h = ap.healthz(t)
		return code == http.StatusServiceUnavailable
	})
	t.Logf("/healthz 503 %.1f s after start: %q", time.Since(start).Seconds(), h.Reasons)
	if len(h.Reasons) != 1 || !strings.Contains(h.Reasons[0], "IMDS spot (spot/instance-action)") || !strings.Contains(h.Reasons[0], "500") {
		t.Errorf("/healthz reasons = %q; want the spot source and its error", h.Reasons)
	}
	resp, err := http.Get(ap.base + "/status")
	if err != nil {
		t.Fatal(err)
	}
	var st struct {
		IMDS struct {
			Sources map[string]struct {
				Healthy bool  `json:"healthy"`
				Polls   int64 `json:"polls"`
				Errors  int64 `json:"errors"`
			} `json:"sources"`
		} `json:"imds"`
	}
	json.NewDecoder(resp.Body).Decode(&st)
	resp.Body.Close()
	if s := st.IMDS.Sources["spot"]; s.Healthy || s.Errors == 0 {
		t.Errorf("/status imds.sources.spot = %+v; want unhealthy with errors", s)
	}
	if s := st.IMDS.Sources["rebalance"]; !s.Healthy || s.Polls == 0 || s.Errors != 0 {
		t.Errorf("/status imds.sources.rebalance = %+v; want healthy, polled, no errors", s)
	}
	if !hasLine(ap.metrics(t), `spotguard_imds_source_up{source="spot"} 0`) {
		t.Errorf(`/metrics lacks spotguard_imds_source_up{source="spot"} 0`)
	}
	ns.until(t, "a STATUS naming the spot source", func(m string) bool {
		return strings.Contains(m, "STATUS=UNHEALTHY: IMDS spot failing for")
	})
}
