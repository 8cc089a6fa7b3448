package s3model

import (
	"bytes"
	"crypto/rand"
	"encoding/base64"
	"encoding/binary"
	"fmt"
	"hash/crc32"
	"io"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/aws/aws-sdk-go-v2/aws"
	"github.com/aws/aws-sdk-go-v2/service/s3"
	"github.com/aws/aws-sdk-go-v2/service/s3/types"
)

// These tests put the model in front of a real versitygw and drive it with real clients, the Go
// SDK and awscli, over plain HTTP and TLS. They check that objects arrive byte for byte and how
// each client signs its payload (see the package comment).

// signing is what one upload request said about its payload.
type signing struct {
	method, query   string
	contentSHA256   string
	contentEncoding string
}

// signingLog records Observe's requests.
type signingLog struct {
	mu   sync.Mutex
	reqs []signing
}

func (l *signingLog) observe(r *http.Request) {
	l.mu.Lock()
	defer l.mu.Unlock()
	l.reqs = append(l.reqs, signing{method: r.Method, query: r.URL.RawQuery,
		contentSHA256: r.Header.Get("X-Amz-Content-Sha256"), contentEncoding: r.Header.Get("Content-Encoding")})
}

// puts returns the x-amz-content-sha256 of every PUT (PutObject, UploadPart), each as "hex" for
// a signed SHA-256 or the literal value, with ",aws-chunked" for an aws-chunked body.
func (l *signingLog) puts() []string {
	l.mu.Lock()
	defer l.mu.Unlock()
	var out []string
	for _, r := range l.reqs {
		if r.method != http.MethodPut {
			continue
		}
		v := r.contentSHA256
		if regexp.MustCompile(`^[0-9a-f]{64}$`).MatchString(v) {
			v = "hex"
		}
		if strings.Contains(r.contentEncoding, "aws-chunked") {
			v += ",aws-chunked"
		}
		out = append(out, v)
	}
	return out
}

// layout is one way to put the model between a client and versitygw.
type layout struct {
	name                  string
	clientTLS, serverTLS  bool
	wantSDK, wantSDKGiven string // the Go SDK's signing of a part without and with its checksum given
	wantAWSCLI            string
}

var layouts = []layout{
	{name: "http", wantSDK: "hex", wantSDKGiven: "hex", wantAWSCLI: "hex"},
	{name: "tls-to-model", clientTLS: true,
		wantSDK: "STREAMING-UNSIGNED-PAYLOAD-TRAILER,aws-chunked", wantSDKGiven: "UNSIGNED-PAYLOAD",
		wantAWSCLI: "STREAMING-UNSIGNED-PAYLOAD-TRAILER,aws-chunked"},
	{name: "tls-both", clientTLS: true, serverTLS: true,
		wantSDK: "STREAMING-UNSIGNED-PAYLOAD-TRAILER,aws-chunked", wantSDKGiven: "UNSIGNED-PAYLOAD",
		wantAWSCLI: "STREAMING-UNSIGNED-PAYLOAD-TRAILER,aws-chunked"},
}

// setUp starts versitygw and the model in front of it for l, capped at 32 MB/s a connection
// with 20 ms of latency, and returns the model, its endpoint, a client of the server itself
// and the certificate (nil without TLS).
func (l layout) setUp(t *testing.T, log *signingLog) (*Proxy, string, *s3.Client, *testCert) {
	t.Helper()
	var tc *testCert
	if l.clientTLS || l.serverTLS {
		c := newTestCert(t)
		tc = &c
	}
	var serverCert *testCert
	if l.serverTLS {
		serverCert = tc
	}
	server := startVersitygw(t, serverCert)
	opts := Options{Upstream: server, ConnUpRate: 32e6, ConnDownRate: 32e6, FirstByteLatency: DefaultFirstByteLatency, Observe: log.observe}
	if l.serverTLS {
		opts.UpstreamCAs = tc.pool
	}
	if l.clientTLS {
		opts.TLS = tc.cert
	}
	p, endpoint := startProxy(t, opts)
	return p, endpoint, newClient(t, server, serverCert), tc
}

func randomBytes(t *testing.T, n int) []byte {
	b := make([]byte, n)
	if _, err := rand.Read(b); err != nil {
		t.Fatal(err)
	}
	return b
}

func crc32c(b []byte) string {
	var sum [4]byte
	binary.BigEndian.PutUint32(sum[:], crc32.Checksum(b, crc32.MakeTable(crc32.Castagnoli)))
	return base64.StdEncoding.EncodeToString(sum[:])
}

// getObject reads key from the server itself (not through the model).
func getObject(t *testing.T, c *s3.Client, key string) []byte {
	t.Helper()
	out, err := c.GetObject(t.Context(), &s3.GetObjectInput{Bucket: aws.String(peerBucket), Key: &key})
	if err != nil {
		t.Fatalf("get %s: %v", key, err)
	}
	defer out.Body.Close()
	b, err := io.ReadAll(out.Body)
	if err != nil {
		t.Fatalf("get %s: %v", key, err)
	}
	return b
}

// A multipart upload through the model with the Go SDK arrives byte for byte, over plain HTTP
// and TLS, parts with and without their checksum given; a download through it reads the same.
func TestMultipartGoSDK(t *testing.T) {
	for _, l := range layouts {
		t.Run(l.name, func(t *testing.T) {
			log := &signingLog{}
			p, endpoint, direct, tc := l.setUp(t, log)
			client := newClient(t, endpoint, tc)
			ctx := t.Context()
			data := randomBytes(t, 12<<20)
			parts := [][]byte{data[:5<<20], data[5<<20 : 10<<20], data[10<<20:]}
			key := "sdk/step-1/shard.bin"
			created, err := client.CreateMultipartUpload(ctx, &s3.CreateMultipartUploadInput{
				Bucket: aws.String(peerBucket), Key: &key, ChecksumAlgorithm: types.ChecksumAlgorithmCrc32c})
			if err != nil {
				t.Fatalf("create multipart upload: %v", err)
			}
			completed := make([]types.CompletedPart, len(parts))
			var wg sync.WaitGroup
			errs := make([]error, len(parts))
			for i, part := range parts {
				wg.Go(func() {
					in := &s3.UploadPartInput{Bucket: aws.String(peerBucket), Key: &key, UploadId: created.UploadId,
						PartNumber: aws.Int32(int32(i + 1)), Body: bytes.NewReader(part), ContentLength: aws.Int64(int64(len(part))),
						ChecksumAlgorithm: types.ChecksumAlgorithmCrc32c}
					if i == len(parts)-1 {
						in.ChecksumCRC32C = aws.String(crc32c(part)) // as spotguard sends its parts
					}
					out, err := client.UploadPart(ctx, in)
					if err != nil {
						errs[i] = fmt.Errorf("upload part %d: %w", i+1, err)
						return
					}
					completed[i] = types.CompletedPart{ETag: out.ETag, PartNumber: aws.Int32(int32(i + 1)), ChecksumCRC32C: out.ChecksumCRC32C}
				})
			}
			wg.Wait()
			for _, err := range errs {
				if err != nil {
					t.Fatal(err)
				}
			}
			if _, err := client.CompleteMultipartUpload(ctx, &s3.CompleteMultipartUploadInput{Bucket: aws.String(peerBucket), Key: &key,
				UploadId: created.UploadId, MultipartUpload: &types.CompletedMultipartUpload{Parts: completed}}); err != nil {
				t.Fatalf("complete multipart upload: %v", err)
			}
			if got := getObject(t, direct, key); !bytes.Equal(got, data) {
				t.Fatalf("stored object: %d bytes, equal %v; want the %d bytes sent", len(got), bytes.Equal(got, data), len(data))
			}
			if got := getObject(t, client, key); !bytes.Equal(got, data) {
				t.Fatalf("read through the model: %d bytes, equal %v; want the %d bytes sent", len(got), bytes.Equal(got, data), len(data))
			}
			var sdk, given int
			for _, s := range log.puts() {
				switch s {
				case l.wantSDK:
					sdk++
				case l.wantSDKGiven:
					given++
				default:
					t.Errorf("an UploadPart was signed %q; want %q, or %q with its checksum given", s, l.wantSDK, l.wantSDKGiven)
				}
			}
			if l.wantSDK != l.wantSDKGiven && (sdk != 2 || given != 1) {
				t.Errorf("UploadParts signed %v; want two %q, one %q", log.puts(), l.wantSDK, l.wantSDKGiven)
			}
			if st := p.Stats(); st.UpstreamFailures != 0 || st.BytesIn < int64(len(data)) || st.BytesOut < int64(len(data)) {
				t.Errorf("Stats = %+v; want no failures, at least %d bytes each way", st, len(data))
			}
		})
	}
}

// A multipart upload through the model with awscli arrives byte for byte, and awscli downloads
// it through the model, over plain HTTP and TLS.
func TestMultipartAWSCLI(t *testing.T) {
	awsBin := needPeer(t, "aws")
	for _, l := range layouts[:2] {
		t.Run(l.name, func(t *testing.T) {
			log := &signingLog{}
			_, endpoint, direct, tc := l.setUp(t, log)
			dir := t.TempDir()
			data := randomBytes(t, 12<<20)
			src, dst := filepath.Join(dir, "src.bin"), filepath.Join(dir, "dst.bin")
			if err := os.WriteFile(src, data, 0o644); err != nil {
				t.Fatal(err)
			}
			config := filepath.Join(dir, "config")
			if err := os.WriteFile(config, []byte("[default]\nregion = us-east-1\ns3 =\n  multipart_threshold = 5MB\n  multipart_chunksize = 5MB\n"), 0o644); err != nil {
				t.Fatal(err)
			}
			env := append(os.Environ(), "HOME="+dir, "AWS_CONFIG_FILE="+config, "AWS_SHARED_CREDENTIALS_FILE="+filepath.Join(dir, "none"),
				"AWS_ACCESS_KEY_ID="+peerAccess, "AWS_SECRET_ACCESS_KEY="+peerSecret, "AWS_EC2_METADATA_DISABLED=true")
			if tc != nil {
				env = append(env, "AWS_CA_BUNDLE="+tc.certFile)
			}
			aws := func(args ...string) {
				t.Helper()
				cmd := exec.Command(awsBin, append([]string{"--endpoint-url", endpoint}, args...)...)
				cmd.Env = env
				if out, err := cmd.CombinedOutput(); err != nil {
					t.Fatalf("aws %s: %v\n%s", strings.Join(args, " "), err, out)
				}
			}
			aws("s3", "cp", "--only-show-errors", src, "s3://"+peerBucket+"/awscli/shard.bin")
			if got := getObject(t, direct, "awscli/shard.bin"); !bytes.Equal(got, data) {
				t.Fatalf("stored object: %d bytes, equal %v; want the %d bytes sent", len(got), bytes.Equal(got, data), len(data))
			}
			aws("s3", "cp", "--only-show-errors", "s3://"+peerBucket+"/awscli/shard.bin", dst)
			if got, err := os.ReadFile(dst); err != nil || !bytes.Equal(got, data) {
				t.Fatalf("downloaded: %d bytes, equal %v, %v; want the %d bytes sent", len(got), bytes.Equal(got, data), err, len(data))
			}
			puts := log.puts()
			if len(puts) != 3 {
				t.Errorf("awscli sent %d PUTs; want 3 parts", len(puts))
			}
			for _, s := range puts {
				if s != l.wantAWSCLI {
					t.Errorf("awscli signed a part %q; want %q", s, l.wantAWSCLI)
				}
			}
		})
	}
}

// The SDK's standard retryer takes a 503 SlowDown from the model as a throttle and retries it
// until the request goes through.
func TestSDKRetriesSlowDown(t *testing.T) {
	server := startVersitygw(t, nil)
	p, endpoint := startProxy(t, Options{Upstream: server, SlowDownRate: 5, SlowDownBurst: 1, PrefixSegments: 1})
	client := newClient(t, endpoint, nil)
	const n = 6
	start := time.Now()
	for i := range n {
		key := fmt.Sprintf("job/step-%d", i)
		if _, err := client.PutObject(t.Context(), &s3.PutObjectInput{Bucket: aws.String(peerBucket), Key: &key,
			Body: strings.NewReader("x")}); err != nil {
			t.Fatalf("put %s: %v", key, err)
		}
	}
	st := p.Stats()
	if st.SlowDowns == 0 || st.Requests != n+st.SlowDowns {
		t.Errorf("Stats = %+v; want SlowDowns answered and retried: Requests = %d + SlowDowns", st, n)
	}
	// Five a second after one: the last of six cannot go before a second has passed.
	if elapsed := time.Since(start); elapsed < time.Second {
		t.Errorf("%d puts at 5 a second took %s; want at least 1s", n, elapsed)
	}
}
