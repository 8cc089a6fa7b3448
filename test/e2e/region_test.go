package e2e

import (
	"net/http"
	"net/http/httptest"
	"net/http/httputil"
	"net/url"
	"os"
	"path/filepath"
	"strings"
	"sync/atomic"
	"testing"
	"time"
)

// imdsRegionConfig writes an ec2-metadata-mock config file that puts the instance in region.
func imdsRegionConfig(t *testing.T, region string) string {
	t.Helper()
	p := filepath.Join(t.TempDir(), "aemm-config.json")
	cfg := `{"metadata": {"values": {"placement-region": "` + region + `", "placement-availability-zone": "` + region + `a"}}}`
	if err := os.WriteFile(p, []byte(cfg), 0o644); err != nil {
		t.Fatal(err)
	}
	return p
}

// On an ordinary instance under systemd there is no AWS_REGION: the region is the instance's,
// from IMDS placement/region through the endpoint the notices come from. The S3 server and the
// instance are in eu-central-1 (not the SDK's or anyone's default), and nothing else names it: a
// notice's checkpoint is committed, CloudWatch requests are signed for eu-central-1, and restore
// (with --allow-empty for a first run, and of the commit) works the same way.
func TestRegionOnlyFromIMDS(t *testing.T) {
	needPeers(t)
	const region = "eu-central-1"
	s3 := startS3In(t, region)
	cw := &fakeCloudWatch{got: make(chan struct{}, 1)}
	cwSrv := httptest.NewServer(cw)
	defer cwSrv.Close()
	sim := newIMDS(t)
	sim.startSpotTermination("-c", imdsRegionConfig(t, region))

	// A first run: nothing committed yet, the region only in IMDS.
	storeEnv := append([]string{"SPOTGUARD_STORE_URL=s3://" + s3Bucket + "/region", "SPOTGUARD_STORE_JOB=e2e",
		"AWS_EC2_METADATA_SERVICE_ENDPOINT=" + sim.endpoint()}, s3.env("")...)
	code, stdout, stderr := runSpotguard(t, storeEnv, "restore", "--allow-empty", "--config", writeEmptyConfig(t), "--to", t.TempDir())
	if code != 0 || !strings.Contains(stdout, "nothing to restore") {
		t.Fatalf("restore --allow-empty without AWS_REGION: exit %d\n%s%s", code, stdout, stderr)
	}

	ckdir := t.TempDir()
	tp := startTrainer(t, "--checkpoint-dir", ckdir, "--files", "2", "--checkpoint-mb", "1")
	ap := startAgent(t, sim, append([]string{"SPOTGUARD_TRAINER_PIDFILE=" + tp.pidfile, "SPOTGUARD_NOTICES_REBALANCE=ignore",
		"SPOTGUARD_CHECKPOINT_DIR=" + ckdir, "SPOTGUARD_STORE_URL=s3://" + s3Bucket + "/region", "SPOTGUARD_STORE_JOB=e2e",
		"SPOTGUARD_METRICS_CLOUDWATCH=true", "AWS_ENDPOINT_URL_CLOUDWATCH=" + cwSrv.URL}, s3.env("")...)...)
	ap.waitNoticeState(t, "spot/terminate", "committed", 60*time.Second)
	lines := ap.logLines(t, "AWS region")
	if len(lines) != 1 || lines[0]["region"] != region || lines[0]["from"] != "IMDS placement/region" {
		t.Errorf("log lines %q = %v; want region %s from IMDS placement/region", "AWS region", lines, region)
	}
	eventually(t, 10*time.Second, "the notice's datums at CloudWatch", func() bool { return cw.seen("Notices") })
	if !cw.signedFor(region) {
		t.Errorf("CloudWatch requests not all signed for %s: %q", region, cw.auths)
	}

	ckpt := newestLocal(t, ckdir)
	to := t.TempDir()
	code, stdout, stderr = runSpotguard(t, storeEnv, "restore", "--config", writeEmptyConfig(t), "--to", to)
	if code != 0 || !strings.Contains(stdout, "restored "+ckpt) {
		t.Fatalf("restore without AWS_REGION: exit %d\n%s%s", code, stdout, stderr)
	}
	sameTree(t, filepath.Join(ckdir, ckpt), filepath.Join(to, ckpt))
}

// A bucket in another region than the instance (common when chasing Spot capacity): S3 refuses
// requests signed for the instance's region, so the store asks S3 where the bucket is and uses
// that; the log says so. Commit and list both work.
func TestBucketInAnotherRegion(t *testing.T) {
	needPeers(t)
	s3 := startS3In(t, "eu-west-1") // the instance (the simulator) is in us-east-1
	sim := newIMDS(t)
	sim.startSpotTermination()
	ckdir := t.TempDir()
	tp := startTrainer(t, "--checkpoint-dir", ckdir, "--files", "2", "--checkpoint-mb", "1")
	storeURL := "s3://" + s3Bucket + "/elsewhere"
	ap := startAgent(t, sim, append([]string{"SPOTGUARD_TRAINER_PIDFILE=" + tp.pidfile, "SPOTGUARD_NOTICES_REBALANCE=ignore",
		"SPOTGUARD_CHECKPOINT_DIR=" + ckdir, "SPOTGUARD_STORE_URL=" + storeURL, "SPOTGUARD_STORE_JOB=e2e"}, s3.env("")...)...)
	t.Cleanup(func() {
		if t.Failed() {
			t.Logf("agent log:\n%s", ap.log(t))
		}
	})
	ap.waitNoticeState(t, "spot/terminate", "committed", 60*time.Second)
	if log := ap.log(t); !strings.Contains(log, "bucket "+s3Bucket+" is in eu-west-1, not in us-east-1 (from IMDS placement/region): the store uses eu-west-1") {
		t.Errorf("agent log does not say the bucket is in another region:\n%s", log)
	}
	code, stdout, stderr := runSpotguard(t, append([]string{"SPOTGUARD_STORE_URL=" + storeURL, "SPOTGUARD_STORE_JOB=e2e"}, s3.env("")...),
		"list", "--config", writeEmptyConfig(t))
	if ckpt := newestLocal(t, ckdir); code != 0 || !strings.Contains(stdout, ckpt) {
		t.Errorf("list: exit %d\n%s%s; want %s", code, stdout, stderr, ckpt)
	}
}

// Signal-only mode needs no AWS configuration: with an AWS_PROFILE that does not exist the agent
// still starts, says CloudWatch is off, and signals the trainer on a notice.
func TestSignalOnlyWithUnusableProfile(t *testing.T) {
	needPeers(t)
	sim := newIMDS(t)
	sim.start("spot", "-a", "terminate", "--rebalance-delay-sec", "100000")
	tp := startTrainer(t)
	ap := startAgent(t, sim, "SPOTGUARD_TRAINER_PIDFILE="+tp.pidfile, "SPOTGUARD_NOTICES_REBALANCE=ignore",
		"SPOTGUARD_METRICS_CLOUDWATCH=true", "AWS_PROFILE=nosuch", "AWS_CONFIG_FILE="+writeEmptyConfig(t))
	waitSignals(t, tp, 1)
	if log := ap.log(t); !strings.Contains(log, "CloudWatch metrics are off (everything else runs)") {
		t.Errorf("agent log does not say CloudWatch is off:\n%s", log)
	}
}

// With IMDS slow to give the region (placement/region hangs), the agent polls notices and signals
// the trainer from the start; the region, once IMDS gives it, still reaches CloudWatch. (Found
// from outside: the region read held the start for its 5 s, with no notice polling meanwhile.)
func TestSlowRegionReadDoesNotHoldTheNoticePath(t *testing.T) {
	needPeers(t)
	sim := newIMDS(t)
	sim.startSpotTermination()
	target, err := url.Parse(sim.endpoint())
	if err != nil {
		t.Fatal(err)
	}
	release := make(chan struct{})
	var reads atomic.Int32     // placement/region reads begun
	var firstEnded atomic.Bool // the first (the start's) has had its answer or given up
	forward := httputil.NewSingleHostReverseProxy(target)
	slow := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.URL.Path == "/latest/meta-data/placement/region" {
			n := reads.Add(1)
			select {
			case <-release:
			case <-r.Context().Done():
			}
			if n == 1 {
				firstEnded.Store(true)
			}
		}
		forward.ServeHTTP(w, r)
	}))
	defer slow.Close()
	released := false
	defer func() {
		if !released {
			close(release)
		}
	}()
	cw := &fakeCloudWatch{got: make(chan struct{}, 1)}
	cwSrv := httptest.NewServer(cw)
	defer cwSrv.Close()

	tp := startTrainer(t)
	ap := startAgent(t, sim, "AWS_EC2_METADATA_SERVICE_ENDPOINT="+slow.URL, "SPOTGUARD_TRAINER_PIDFILE="+tp.pidfile,
		"SPOTGUARD_NOTICES_REBALANCE=ignore", "SPOTGUARD_METRICS_CLOUDWATCH=true", "AWS_ENDPOINT_URL_CLOUDWATCH="+cwSrv.URL,
		"AWS_ACCESS_KEY_ID=k", "AWS_SECRET_ACCESS_KEY=s", "AWS_CONFIG_FILE="+writeEmptyConfig(t), "AWS_SHARED_CREDENTIALS_FILE="+writeEmptyConfig(t))
	waitSignals(t, tp, 1)
	if firstEnded.Load() {
		t.Fatalf("the trainer was signalled after the start's region read ended; want it signalled while that read still waits")
	}
	close(release)
	released = true
	eventually(t, 20*time.Second, "the notice's datums at CloudWatch", func() bool { return cw.seen("Notices") })
	if !cw.signedFor("us-east-1") {
		t.Errorf("CloudWatch requests not all signed for the simulator's us-east-1: %q", cw.auths)
	}
	if lines := ap.logLines(t, "AWS region"); len(lines) != 1 || lines[0]["region"] != "us-east-1" {
		t.Errorf("log lines %q = %v; want region us-east-1 from IMDS", "AWS region", lines)
	}
}
