package e2e

import (
	"context"
	"crypto/rand"
	"crypto/tls"
	"crypto/x509"
	"errors"
	"fmt"
	"math"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/aws/aws-sdk-go-v2/aws"
	"github.com/aws/aws-sdk-go-v2/credentials"
	"github.com/aws/aws-sdk-go-v2/service/s3"
	"github.com/spotguard/spotguard/test/s3model"
)

// s3Endpoint is where a client sends its S3 requests: versitygw itself or the scaled model of
// S3 (test/s3model) in front of it.
type s3Endpoint struct {
	url      string // http(s)://127.0.0.1:PORT
	certFile string // the certificate to trust over https ("" over http); it is its own CA
}

// endpoint is where a client reaches s directly.
func (s *s3Server) at() s3Endpoint { return s3Endpoint{url: s.endpoint, certFile: s.certFile} }

// agentEnv is the AWS environment of a spotguard process using e: the test credentials, the
// endpoint, and trust in its certificate through SSL_CERT_FILE (see s3Server.caEnv), or through
// AWS_CA_BUNDLE when BENCH_AGENT_CA_BUNDLE is set, to see what that changes.
func (e s3Endpoint) agentEnv() []string {
	env := []string{"AWS_ACCESS_KEY_ID=" + s3Access, "AWS_SECRET_ACCESS_KEY=" + s3Secret, "AWS_ENDPOINT_URL_S3=" + e.url}
	switch {
	case e.certFile == "":
	case os.Getenv("BENCH_AGENT_CA_BUNDLE") != "":
		env = append(env, "AWS_CA_BUNDLE="+e.certFile)
	default:
		env = append(env, "SSL_CERT_FILE="+e.certFile)
	}
	return env
}

// awscli returns an awscli command on e with the shared config in configFile ("": none).
func (e s3Endpoint) awscli(t testing.TB, configFile string, args ...string) *exec.Cmd {
	cmd := exec.Command(awsBin(t), append([]string{"--endpoint-url", e.url}, args...)...)
	cmd.Env = append(os.Environ(), "AWS_ACCESS_KEY_ID="+s3Access, "AWS_SECRET_ACCESS_KEY="+s3Secret,
		"HOME="+t.TempDir(), "AWS_EC2_METADATA_DISABLED=true", "AWS_REGION=us-east-1", "AWS_DEFAULT_REGION=us-east-1")
	if configFile != "" {
		cmd.Env = append(cmd.Env, "AWS_CONFIG_FILE="+configFile)
	}
	if e.certFile != "" {
		cmd.Env = append(cmd.Env, "AWS_CA_BUNDLE="+e.certFile)
	}
	return cmd
}

// s3Model is the scaled model of S3 running in this process in front of an s3Server, serving
// TLS to its clients and speaking plain HTTP or TLS (as the server does) to the server.
type s3Model struct {
	proxy *s3model.Proxy
	s3Endpoint
	roots *x509.CertPool // trusts the model's certificate
}

// startModel runs the model with opts in front of server (opts.Upstream and the TLS fields are
// set here), with a throwaway certificate for 127.0.0.1, until the test ends.
func startModel(t testing.TB, server *s3Server, opts s3model.Options) *s3Model {
	t.Helper()
	certFile, keyFile, err := s3model.WriteSelfSignedCert(t.TempDir())
	if err != nil {
		t.Fatal(err)
	}
	cert, roots, err := s3model.LoadCert(certFile, keyFile)
	if err != nil {
		t.Fatal(err)
	}
	opts.Upstream, opts.TLS = server.endpoint, cert
	if server.certFile != "" {
		if _, opts.UpstreamCAs, err = s3model.LoadCert(server.certFile, server.keyFile); err != nil {
			t.Fatal(err)
		}
	}
	p, url := s3model.Start(t, opts)
	return &s3Model{proxy: p, s3Endpoint: s3Endpoint{url: url, certFile: certFile}, roots: roots}
}

// modelCeiling is the server's ceiling as seen through the model: BENCH_S3MODEL_CEILING_MBPS
// ("UP" or "UP,DOWN", MB/s) when set, else the best of three calibrations (s3model.Calibrate:
// 256 MiB in 32 parts at once each way) through the model without its cap and latency, over TLS
// as the clients reach it: on a small machine the model's TLS and copying share the cores with
// the server and the clients, so the server alone would promise rates no client can get through
// the model.
func modelCeiling(t testing.TB, server *s3Server) s3model.Ceiling {
	t.Helper()
	if v := os.Getenv("BENCH_S3MODEL_CEILING_MBPS"); v != "" {
		upS, downS, found := strings.Cut(v, ",")
		if !found {
			downS = upS
		}
		up, err1 := strconv.ParseFloat(upS, 64)
		down, err2 := strconv.ParseFloat(downS, 64)
		if err := errors.Join(err1, err2); err != nil || up <= 0 || down <= 0 {
			t.Fatalf("BENCH_S3MODEL_CEILING_MBPS=%q: want UP or UP,DOWN in MB/s (%v)", v, err)
		}
		return s3model.Ceiling{Up: up * 1e6, Down: down * 1e6}
	}
	client := calibrationClient(t, startModel(t, server, s3model.Options{}), server.region)
	var best s3model.Ceiling
	for i := range 3 {
		c, err := s3model.Calibrate(context.Background(), client, s3Bucket, fmt.Sprintf("calibrate-%d", i), 256<<20, 32)
		if err != nil {
			t.Fatal(err)
		}
		best.Up, best.Down = max(best.Up, c.Up), max(best.Down, c.Down)
	}
	return best
}

// modelReference is what the calibration's client (every part in flight from the first moment,
// the same bytes from memory every part, nothing checked) gets through the model with opts: parts
// of 8 MiB, as many as fill the ceiling (at least 16), each way. It is the most a client can get
// out of the model on this machine for a transfer of one round of parts; a client that has to
// find its concurrency, read files and check what it moves gets less.
func modelReference(t testing.TB, server *s3Server, opts s3model.Options, ceiling s3model.Ceiling) (parts int, got s3model.Ceiling) {
	t.Helper()
	parts = max(16, int(math.Ceil(ceiling.Up/opts.ConnUpRate)))
	client := calibrationClient(t, startModel(t, server, opts), server.region)
	got, err := s3model.Calibrate(context.Background(), client, s3Bucket, "reference", int64(parts)<<23, parts)
	if err != nil {
		t.Fatal(err)
	}
	return parts, got
}

// calibrationClient is an S3 client for the calibration through m, with a connection for every
// request it may have in flight, until the test ends.
func calibrationClient(t testing.TB, m *s3Model, region string) *s3.Client {
	t.Helper()
	tr := http.DefaultTransport.(*http.Transport).Clone()
	tr.Proxy, tr.MaxIdleConnsPerHost = nil, 256
	tr.TLSClientConfig = &tls.Config{RootCAs: m.roots}
	t.Cleanup(tr.CloseIdleConnections)
	return s3.NewFromConfig(aws.Config{
		Region:      region,
		Credentials: credentials.NewStaticCredentialsProvider(s3Access, s3Secret, ""),
		HTTPClient:  &http.Client{Transport: tr},
	}, func(o *s3.Options) {
		o.BaseEndpoint, o.UsePathStyle = aws.String(m.url), true
	})
}

// modelOptions are the scaled model's options for ceiling: s3model.Scaled, with the
// connections that fill the ceiling from BENCH_S3MODEL_CONNS (default s3model.ConnsToFill: a
// p5's NIC over one S3 connection is nearer 150) and the latency from BENCH_S3MODEL_LATENCY_MS
// (default 20).
func modelOptions(t testing.TB, ceiling s3model.Ceiling) s3model.Options {
	t.Helper()
	conns := float64(s3model.ConnsToFill)
	if v := os.Getenv("BENCH_S3MODEL_CONNS"); v != "" {
		n, err := strconv.ParseFloat(v, 64)
		if err != nil || n < 1 {
			t.Fatalf("BENCH_S3MODEL_CONNS=%q: want a number of connections", v)
		}
		conns = n
	}
	opts := s3model.Scaled("", ceiling)
	opts.ConnUpRate = opts.ConnUpRate * s3model.ConnsToFill / conns
	opts.ConnDownRate = opts.ConnDownRate * s3model.ConnsToFill / conns
	if v := os.Getenv("BENCH_S3MODEL_LATENCY_MS"); v != "" {
		ms, err := strconv.ParseFloat(v, 64)
		if err != nil || ms < 0 {
			t.Fatalf("BENCH_S3MODEL_LATENCY_MS=%q: want milliseconds", v)
		}
		opts.FirstByteLatency = time.Duration(ms * float64(time.Millisecond))
	}
	return opts
}

// randomFiles returns n files shard-I.bin of size random bytes each.
func randomFiles(t testing.TB, n, size int) map[string][]byte {
	t.Helper()
	files := map[string][]byte{}
	for i := range n {
		data := make([]byte, size)
		if _, err := rand.Read(data); err != nil {
			t.Fatal(err)
		}
		files[fmt.Sprintf("shard-%d.bin", i)] = data
	}
	return files
}

// The agent uploads through the scaled model of S3 over TLS, with each connection capped, 20 ms
// added to every answer and 503 SlowDown above a few requests a second; spotguard restore and
// awscli read the checkpoint back through it, byte for byte. The same straight to versitygw over
// TLS, the clients trusting its throwaway certificate.
func TestAgentAndAWSCLIThroughS3Model(t *testing.T) {
	needPeers(t)
	for _, tc := range []struct {
		name  string
		model bool
	}{
		{"model", true},
		{"tls-server", false},
	} {
		t.Run(tc.name, func(t *testing.T) {
			var at s3Endpoint
			var model *s3Model
			if tc.model {
				model = startModel(t, startS3(t), s3model.Options{ConnUpRate: 16e6, ConnDownRate: 16e6,
					FirstByteLatency: s3model.DefaultFirstByteLatency, SlowDownRate: 10, SlowDownBurst: 4, PrefixSegments: 1})
				at = model.s3Endpoint
			} else {
				at = startS3TLS(t).at()
			}
			ckdir := t.TempDir()
			// 6 MiB files in 5 MiB parts: multipart uploads.
			writeCheckpoint(t, ckdir, "step-000001", randomFiles(t, 3, 6<<20), "{}\n")
			sim := newIMDS(t)
			sim.start("spot", "-d", "100000", "--rebalance-delay-sec", "100000")
			ap := startAgent(t, sim, append([]string{"SPOTGUARD_TRAINER_MATCH=no-trainer-for-this-test",
				"SPOTGUARD_CHECKPOINT_DIR=" + ckdir, "SPOTGUARD_STORE_URL=s3://" + s3Bucket + "/model",
				"SPOTGUARD_STORE_JOB=e2e", "SPOTGUARD_STORE_PART_SIZE=5MiB"}, at.agentEnv()...)...)
			eventually(t, time.Minute, "the checkpoint to be committed", func() bool {
				return hasLine(ap.metrics(t), `spotguard_checkpoints_committed_total{trigger="periodic"} 1`)
			})
			ap.stop(t)

			to := t.TempDir()
			code, stdout, stderr := runSpotguard(t, append([]string{"SPOTGUARD_STORE_URL=s3://" + s3Bucket + "/model", "SPOTGUARD_STORE_JOB=e2e"},
				at.agentEnv()...), "restore", "--to", to, "--config", writeEmptyConfig(t))
			if code != 0 {
				t.Fatalf("spotguard restore: exit %d\n%s%s", code, stdout, stderr)
			}
			sameTree(t, filepath.Join(ckdir, "step-000001"), filepath.Join(to, "step-000001"))

			dl := t.TempDir()
			if out, err := at.awscli(t, "", "s3", "cp", "--recursive", "--only-show-errors",
				"s3://"+s3Bucket+"/model/e2e/step-000001/", dl).CombinedOutput(); err != nil {
				t.Fatalf("awscli: %v\n%s", err, out)
			}
			commits, err := os.ReadDir(dl) // prefix/job/checkpoint/COMMIT/… (docs/store-layout.md)
			if err != nil || len(commits) != 1 {
				t.Fatalf("awscli downloaded %v (%v); want one commit", commits, err)
			}
			sameTree(t, filepath.Join(ckdir, "step-000001"), filepath.Join(dl, commits[0].Name()))

			if model == nil {
				return
			}
			st := model.proxy.Stats()
			t.Logf("model: %+v", st)
			if st.SlowDowns == 0 {
				t.Errorf("the model answered no 503 SlowDown at 10 requests a second; want some, retried")
			}
			if st.UpstreamFailures != 0 {
				t.Errorf("%d requests failed between the model and the server; want none", st.UpstreamFailures)
			}
		})
	}
}
