package s3model

import (
	"crypto/tls"
	"crypto/x509"
	"fmt"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"testing"
	"time"

	"github.com/aws/aws-sdk-go-v2/aws"
	"github.com/aws/aws-sdk-go-v2/aws/retry"
	"github.com/aws/aws-sdk-go-v2/credentials"
	"github.com/aws/aws-sdk-go-v2/service/s3"
	"go.uber.org/goleak"
)

func TestMain(m *testing.M) {
	goleak.VerifyTestMain(m)
}

const (
	peerAccess = "s3modeltest"
	peerSecret = "s3modeltestsecret"
	peerBucket = "model"
)

// needPeer returns the path of a peer program: bin/NAME in the repository (`make tools`), else
// NAME on PATH. A missing peer fails the test when CI is set (CI installs them) and skips it
// elsewhere.
func needPeer(t testing.TB, name string) string {
	t.Helper()
	_, file, _, _ := runtime.Caller(0)
	if p, err := exec.LookPath(filepath.Join(filepath.Dir(file), "..", "..", "bin", name)); err == nil {
		return p
	}
	if p, err := exec.LookPath(name); err == nil {
		return p
	}
	why := fmt.Sprintf("%s not found in bin/ or on PATH (`make tools` builds versitygw; awscli is Debian's awscli)", name)
	if os.Getenv("CI") != "" {
		t.Fatal(why)
	}
	t.Skip(why)
	return ""
}

// poll calls cond every 10 ms until it is true, failing the test after within.
func poll(t testing.TB, within time.Duration, what string, cond func() bool) {
	t.Helper()
	deadline := time.Now().Add(within)
	tick := time.NewTicker(10 * time.Millisecond)
	defer tick.Stop()
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatalf("timed out after %s waiting for %s", within, what)
		}
		<-tick.C
	}
}

// testCert is a throwaway certificate for 127.0.0.1 in a temporary directory.
type testCert struct {
	certFile, keyFile string
	cert              *tls.Certificate
	pool              *x509.CertPool
}

func newTestCert(t testing.TB) testCert {
	t.Helper()
	certFile, keyFile, err := WriteSelfSignedCert(t.TempDir())
	if err != nil {
		t.Fatal(err)
	}
	cert, pool, err := LoadCert(certFile, keyFile)
	if err != nil {
		t.Fatal(err)
	}
	return testCert{certFile: certFile, keyFile: keyFile, cert: cert, pool: pool}
}

// startVersitygw runs versitygw on 127.0.0.1 with one bucket, serving TLS with tc when it is not
// nil, and returns its endpoint.
func startVersitygw(t testing.TB, tc *testCert) string {
	t.Helper()
	bin := needPeer(t, "versitygw")
	dir := t.TempDir()
	data, meta := filepath.Join(dir, "data"), filepath.Join(dir, "meta")
	for _, d := range []string{data, meta} {
		if err := os.MkdirAll(d, 0o755); err != nil {
			t.Fatal(err)
		}
	}
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	addr := ln.Addr().String()
	ln.Close()
	args := []string{"--access", peerAccess, "--secret", peerSecret, "--port", addr, "--region", "us-east-1", "--quiet"}
	scheme := "http"
	if tc != nil {
		args = append(args, "--cert", tc.certFile, "--key", tc.keyFile)
		scheme = "https"
	}
	cmd := exec.Command(bin, append(args, "posix", "--sidecar", meta, data)...)
	logf, err := os.Create(filepath.Join(dir, "versitygw.log"))
	if err != nil {
		t.Fatal(err)
	}
	cmd.Stdout, cmd.Stderr = logf, logf
	if err := cmd.Start(); err != nil {
		t.Fatalf("start versitygw: %v", err)
	}
	done := make(chan struct{})
	go func() { cmd.Wait(); logf.Close(); close(done) }()
	t.Cleanup(func() {
		cmd.Process.Kill()
		<-done
		if t.Failed() {
			log, _ := os.ReadFile(logf.Name())
			t.Logf("versitygw log:\n%s", log)
		}
	})
	poll(t, 20*time.Second, "versitygw to listen", func() bool {
		c, err := net.Dial("tcp", addr)
		if err != nil {
			return false
		}
		c.Close()
		return true
	})
	endpoint := scheme + "://" + addr
	client := newClient(t, endpoint, tc)
	if _, err := client.CreateBucket(t.Context(), &s3.CreateBucketInput{Bucket: aws.String(peerBucket)}); err != nil {
		t.Fatalf("create bucket: %v", err)
	}
	return endpoint
}

// newClient returns an S3 client for endpoint (path style, the peer's credentials), trusting tc
// when it is not nil, with idle connections closed when the test ends and the SDK's standard
// retryer at a short backoff.
func newClient(t testing.TB, endpoint string, tc *testCert, optFns ...func(*s3.Options)) *s3.Client {
	t.Helper()
	tr := http.DefaultTransport.(*http.Transport).Clone()
	tr.Proxy = nil
	tr.MaxIdleConnsPerHost = 64
	if tc != nil {
		tr.TLSClientConfig = &tls.Config{RootCAs: tc.pool}
	}
	t.Cleanup(tr.CloseIdleConnections)
	cfg := aws.Config{
		Region:      "us-east-1",
		Credentials: credentials.NewStaticCredentialsProvider(peerAccess, peerSecret, ""),
		HTTPClient:  &http.Client{Transport: tr},
	}
	return s3.NewFromConfig(cfg, append([]func(*s3.Options){func(o *s3.Options) {
		o.BaseEndpoint = aws.String(endpoint)
		o.UsePathStyle = true
		o.Retryer = retry.NewStandard(func(so *retry.StandardOptions) {
			so.MaxAttempts = 10
			so.MaxBackoff = 200 * time.Millisecond
		})
	}}, optFns...)...)
}

// startProxy runs a Proxy for opts until the test ends: Start.
func startProxy(t testing.TB, opts Options) (*Proxy, string) {
	t.Helper()
	return Start(t, opts)
}
