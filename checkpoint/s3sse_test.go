package checkpoint

import (
	"fmt"
	"strings"
	"testing"

	"github.com/aws/aws-sdk-go-v2/aws"
	"github.com/aws/aws-sdk-go-v2/service/s3"
	"github.com/aws/aws-sdk-go-v2/service/s3/types"
)

// TestS3ServerSideEncryptionHeaders: every request that creates an object (PutObject from PutFile
// and PutBytes, CreateMultipartUpload) asks for S3Options.SSE, with the KMS key for aws:kms when
// one is set, and nothing else does (UploadPart, CompleteMultipartUpload); without SSE no request
// carries the headers. The requests are read at a proxy in front of versitygw.
//
// versitygw (v1.8.0, posix backend) accepts these headers and ignores them: the writes succeed,
// HeadObject reports no encryption, and even x-amz-server-side-encryption: bogus is accepted. So
// this proves what the store sends and that a store asking for encryption commits and reads back
// intact; that S3 encrypts, and refuses a key the role may not use, only AWS can show.
func TestS3ServerSideEncryptionHeaders(t *testing.T) {
	peer := s3StartPeer(t)
	for i, c := range []struct {
		name     string
		sse, key string
	}{
		{"none", SSENone, ""},
		{"sse-s3", SSES3, ""},
		{"sse-kms_aws_managed_key", SSEKMS, ""},
		{"sse-kms_own_key", SSEKMS, "arn:aws:kms:us-east-1:111122223333:key/1234abcd-12ab-34cd-56ef-1234567890ab"},
	} {
		t.Run(c.name, func(t *testing.T) {
			proxy := s3StartProxy(t, peer.endpoint)
			prefix := fmt.Sprintf("sse%d", i)
			s := peer.openS3(t, proxy.URL(), prefix, S3Options{PartSize: 5 << 20, Concurrency: 4, SSE: c.sse, KMSKeyID: c.key})
			small, large := storeTestData(uint64(40+i), 1000), storeTestData(uint64(50+i), 12<<20)
			s3TestRoundTrip(t, peer, s, "small", small)
			s3TestRoundTrip(t, peer, s, "large", large)
			if _, err := s.PutBytes(t.Context(), "manifest.json", []byte(`{"v":1}`), Cond{IfAbsent: true}); err != nil {
				t.Fatalf("PutBytes = %v; want no error", err)
			}

			kinds := map[string]int{}
			for _, w := range proxy.writesSeen() {
				kinds[w.kind]++
				wantSSE, wantKey := "", ""
				if w.kind == "put" || w.kind == "create" {
					wantSSE, wantKey = c.sse, c.key
				}
				if w.sse != wantSSE || w.kmsKeyID != wantKey {
					t.Errorf("Got(%s %s) x-amz-server-side-encryption = %q, kms key = %q; want %q, %q",
						w.kind, w.key, w.sse, w.kmsKeyID, wantSSE, wantKey)
				}
			}
			// small and the manifest in one PutObject each; large in 3 parts of one upload.
			if want := map[string]int{"put": 2, "create": 1, "part": 3, "complete": 1}; fmt.Sprint(kinds) != fmt.Sprint(want) {
				t.Errorf("Got(%s) writes = %v; want %v", s.URL(), kinds, want)
			}

			head, err := peer.client.HeadObject(t.Context(), &s3.HeadObjectInput{Bucket: &peer.bucket, Key: aws.String(prefix + "/large")})
			if err != nil {
				t.Fatal(err)
			}
			t.Logf("versitygw answers HeadObject with ServerSideEncryption %q, SSEKMSKeyId %q", head.ServerSideEncryption, aws.ToString(head.SSEKMSKeyId))
		})
	}
}

// TestS3ServerSideEncryptionRefused: a server that refuses the encryption asked for (400
// InvalidArgument, as for an encryption it does not offer) fails the write with its answer. For
// a multipart upload that answer is one s3IsUnsupported also gives for a FULL_OBJECT checksum:
// the retry without it is refused too, so the store does not take the refusal for the checksum's
// and stays on full-object checksums; once the server takes the encryption, uploads are
// FULL_OBJECT again.
func TestS3ServerSideEncryptionRefused(t *testing.T) {
	peer := s3StartPeer(t)
	proxy := s3StartProxy(t, peer.endpoint)
	proxy.set(func(p *s3FaultProxy) { p.refuseSSE = true })
	s := peer.openS3(t, proxy.URL(), "nosse", S3Options{PartSize: 5 << 20, Concurrency: 4, SSE: SSEKMS, KMSKeyID: "alias/ckpt"})
	for _, size := range []int{1000, 12 << 20} {
		data := storeTestData(60, size)
		_, err := s.PutFile(t.Context(), fmt.Sprintf("f%d", size), storeTestFile(t, data), int64(len(data)), nil)
		if err == nil || !strings.Contains(err.Error(), "InvalidArgument") || !strings.Contains(err.Error(), "encryption method") {
			t.Errorf("PutFile(%d bytes) with refused encryption = %v; want the server's InvalidArgument", size, err)
		}
	}
	if _, err := s.PutBytes(t.Context(), "LATEST", []byte("{}"), Cond{IfAbsent: true}); err == nil || !strings.Contains(err.Error(), "InvalidArgument") {
		t.Errorf("PutBytes with refused encryption = %v; want the server's InvalidArgument", err)
	}
	if got := proxy.count("nosse"); got != 4 {
		t.Errorf("requests refused = %d; want 4 (a PutObject, a CreateMultipartUpload and its retry without FULL_OBJECT, a PutObject)", got)
	}
	if s.composite.Load() {
		t.Error("a refused encryption turned the store to composite checksums")
	}
	if left := peer.incompleteUploads(t, ""); len(left) != 0 {
		t.Errorf("incomplete uploads = %q; want none", left)
	}

	proxy.set(func(p *s3FaultProxy) { p.refuseSSE = false })
	data := storeTestData(61, 12<<20)
	s3TestRoundTrip(t, peer, s, "after", data)
	head, err := peer.client.HeadObject(t.Context(), &s3.HeadObjectInput{
		Bucket: &peer.bucket, Key: aws.String("nosse/after"), ChecksumMode: types.ChecksumModeEnabled,
	})
	if err != nil {
		t.Fatal(err)
	}
	if head.ChecksumType != types.ChecksumTypeFullObject {
		t.Errorf("checksum type after the refusals = %q; want FULL_OBJECT", head.ChecksumType)
	}
	if got := proxy.writesSeen(); len(got) == 0 || got[len(got)-1].kind != "complete" {
		t.Errorf("last write = %+v; want the upload's completion", got)
	}
}
