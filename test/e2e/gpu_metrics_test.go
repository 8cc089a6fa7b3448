package e2e

import (
	"bytes"
	"compress/gzip"
	"encoding/json"
	"io"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync"
	"testing"
	"time"
)

// On this GPU-less machine `spotguard gpu` exits 4 with the reason, in text and JSON.
func TestGPUCommandWithoutNVML(t *testing.T) {
	needPeers(t)
	code, stdout, stderr := runSpotguard(t, nil, "gpu", "--config", writeEmptyConfig(t))
	if code != 4 || !strings.Contains(stderr, "no NVML") {
		t.Errorf("spotguard gpu: exit %d, stderr %q; want 4 and the reason", code, stderr)
	}
	code, stdout, _ = runSpotguard(t, nil, "gpu", "--json", "--config", writeEmptyConfig(t))
	var rep struct {
		Sampling bool   `json:"sampling"`
		Off      string `json:"off"`
	}
	if err := json.Unmarshal([]byte(stdout), &rep); err != nil || code != 4 || rep.Sampling || rep.Off == "" {
		t.Errorf("spotguard gpu --json: exit %d, %q (%v); want 4 and sampling false with a reason", code, stdout, err)
	}
}

// fakeCloudWatch records the PutMetricData bodies it receives (gunzipped).
type fakeCloudWatch struct {
	mu     sync.Mutex
	bodies [][]byte
	auths  []string // the Authorization header of each request
	got    chan struct{}
}

func (f *fakeCloudWatch) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	var body io.Reader = r.Body
	if r.Header.Get("Content-Encoding") == "gzip" {
		zr, err := gzip.NewReader(r.Body)
		if err != nil {
			http.Error(w, err.Error(), http.StatusBadRequest)
			return
		}
		body = zr
	}
	b, _ := io.ReadAll(body)
	f.mu.Lock()
	f.bodies = append(f.bodies, b)
	f.auths = append(f.auths, r.Header.Get("Authorization"))
	f.mu.Unlock()
	select {
	case f.got <- struct{}{}:
	default:
	}
	if r.Header.Get("Smithy-Protocol") == "rpc-v2-cbor" {
		w.Header().Set("Smithy-Protocol", "rpc-v2-cbor")
		w.Header().Set("Content-Type", "application/cbor")
		w.Write([]byte{0xa0}) // an empty CBOR map
		return
	}
	w.Header().Set("Content-Type", "text/xml")
	w.Write([]byte(`<PutMetricDataResponse xmlns="http://monitoring.amazonaws.com/doc/2010-08-01/"><ResponseMetadata><RequestId>1</RequestId></ResponseMetadata></PutMetricDataResponse>`))
}

// signedFor reports whether every request so far was signed for region (and there was one).
func (f *fakeCloudWatch) signedFor(region string) bool {
	f.mu.Lock()
	defer f.mu.Unlock()
	for _, a := range f.auths {
		if !strings.Contains(a, "/"+region+"/monitoring/aws4_request") {
			return false
		}
	}
	return len(f.auths) > 0
}

func (f *fakeCloudWatch) seen(s string) bool {
	f.mu.Lock()
	defer f.mu.Unlock()
	for _, b := range f.bodies {
		if bytes.Contains(b, []byte(s)) {
			return true
		}
	}
	return false
}

// A notice's story reaches CloudWatch at once, not at the next 60 s flush; GPU sampling is off
// on this machine and the agent says so and runs on.
func TestNoticeFlushesToCloudWatch(t *testing.T) {
	needPeers(t)
	cw := &fakeCloudWatch{got: make(chan struct{}, 1)}
	srv := httptest.NewServer(cw)
	defer srv.Close()
	sim := newIMDS(t)
	// The notice comes after the agent has read the instance identity (the base dimensions).
	trigger := time.Now().Truncate(time.Second).Add(3 * time.Second)
	sim.start("spot", "-a", "terminate", "--mock-trigger-time", trigger.UTC().Format(time.RFC3339))
	tp := startTrainer(t)
	ap := startAgent(t, sim, "SPOTGUARD_TRAINER_PIDFILE="+tp.pidfile, "SPOTGUARD_NOTICES_REBALANCE=ignore",
		"SPOTGUARD_METRICS_CLOUDWATCH=true", "AWS_ENDPOINT_URL_CLOUDWATCH="+srv.URL,
		"AWS_ACCESS_KEY_ID=test", "AWS_SECRET_ACCESS_KEY=test")
	eventually(t, 10*time.Second, "the instance identity", func() bool { return ap.status(t).Instance.InstanceID != "" })
	waitSignals(t, tp, 1)
	eventually(t, 10*time.Second, "the notice's datums at CloudWatch", func() bool {
		return cw.seen("Notices") && cw.seen("SignalLatencySeconds") && cw.seen("SpotGuard") && cw.seen("i-1234567890abcdef0")
	})
	if !strings.Contains(ap.log(t), "GPU sampling is off") {
		t.Errorf("agent log does not say GPU sampling is off")
	}
	if !hasLine(ap.metrics(t), "spotguard_gpu_sampling_up 0") {
		t.Errorf("/metrics lacks spotguard_gpu_sampling_up 0")
	}
}
