package checkpoint

import (
	"bufio"
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"hash/crc32"
	"io"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"testing/iotest"
	"time"

	"github.com/aws/aws-sdk-go-v2/aws"
	"github.com/aws/aws-sdk-go-v2/service/s3"
	"github.com/aws/aws-sdk-go-v2/service/s3/types"
	"github.com/aws/smithy-go/logging"
)

func TestS3PartPlan(t *testing.T) {
	const mib = 1 << 20
	tests := []struct {
		size, partSize int64
		wantParts      int
		wantFirst      int64
		wantLast       int64
	}{
		{size: 0, partSize: 5 * mib, wantParts: 0},
		{size: 1, partSize: 5 * mib, wantParts: 1, wantFirst: 1, wantLast: 1},
		{size: 5 * mib, partSize: 5 * mib, wantParts: 1, wantFirst: 5 * mib, wantLast: 5 * mib},
		{size: 12*mib + 3, partSize: 5 * mib, wantParts: 3, wantFirst: 5 * mib, wantLast: 2*mib + 3},
		{size: 10000 * 5 * mib, partSize: 5 * mib, wantParts: 10000, wantFirst: 5 * mib, wantLast: 5 * mib},
		// 10,001 parts of 5 MiB would be too many: 6 MiB parts.
		{size: 10001 * 5 * mib, partSize: 5 * mib, wantParts: 8335, wantFirst: 6 * mib, wantLast: 10001*5*mib - 8334*6*mib},
	}
	for _, tc := range tests {
		t.Run(fmt.Sprintf("%d/%d", tc.size, tc.partSize), func(t *testing.T) {
			parts := s3PartPlan(tc.size, tc.partSize)
			if len(parts) != tc.wantParts {
				t.Fatalf("Got(%d) = %d parts; want %d", tc.size, len(parts), tc.wantParts)
			}
			var next int64
			for i, p := range parts {
				if p.num != int32(i+1) || p.off != next || p.n <= 0 {
					t.Fatalf("Got(%d) part %d = %+v; want number %d at %d", tc.size, i, p, i+1, next)
				}
				next += p.n
			}
			if next != tc.size {
				t.Errorf("Got(%d) parts add up to %d; want %d", tc.size, next, tc.size)
			}
			if len(parts) > 0 && (parts[0].n != tc.wantFirst || parts[len(parts)-1].n != tc.wantLast) {
				t.Errorf("Got(%d) first, last = %d, %d; want %d, %d", tc.size, parts[0].n, parts[len(parts)-1].n, tc.wantFirst, tc.wantLast)
			}
		})
	}
}

func TestS3CRC32CCombine(t *testing.T) {
	data := storeTestData(7, 3<<20+17)
	tab := crc32.MakeTable(crc32.Castagnoli)
	for _, cut := range []int{0, 1, 7, 4096, 1 << 20, 3<<20 + 16, len(data)} {
		t.Run(strconv.Itoa(cut), func(t *testing.T) {
			a, b := data[:cut], data[cut:]
			got := s3CRC32CCombine(crc32.Checksum(a, tab), crc32.Checksum(b, tab), int64(len(b)))
			if want := crc32.Checksum(data, tab); got != want {
				t.Errorf("Got(%d) = %08x; want %08x", cut, got, want)
			}
		})
	}
}

// TestS3ServerChecksums records what versitygw does with the checksums the store sends: it
// accepts full-object CRC-32C on multipart uploads and reports the same value as the store
// computed.
func TestS3ServerChecksums(t *testing.T) {
	peer := s3StartPeer(t)
	s := peer.openS3(t, peer.endpoint, "checksums", S3Options{PartSize: 5 << 20, Concurrency: 4})
	for _, size := range []int{0, 1 << 20, 12<<20 + 5} {
		t.Run(strconv.Itoa(size), func(t *testing.T) {
			data := storeTestData(uint64(size), size)
			key := fmt.Sprintf("f%d", size)
			sum, err := s.PutFile(t.Context(), key, storeTestFile(t, data), int64(size), nil)
			if err != nil {
				t.Fatalf("PutFile(%q) = %v; want no error", key, err)
			}
			head, err := peer.client.HeadObject(t.Context(), &s3.HeadObjectInput{
				Bucket: &peer.bucket, Key: aws.String("checksums/" + key), ChecksumMode: types.ChecksumModeEnabled,
			})
			if err != nil {
				t.Fatal(err)
			}
			if got := aws.ToString(head.ChecksumCRC32C); got != sum.Value {
				t.Errorf("Got(%q) server CRC-32C = %q; want %q", key, got, sum.Value)
			}
			if got := head.ChecksumType; got != types.ChecksumTypeFullObject {
				t.Errorf("Got(%q) server checksum type = %q; want %q", key, got, types.ChecksumTypeFullObject)
			}
		})
	}
	if s.composite.Load() {
		t.Errorf("Got(%q) composite fallback = true; want versitygw to accept FULL_OBJECT", s.URL())
	}
}

// TestS3CompositeFallback: against a server that refuses FULL_OBJECT checksums, multipart
// uploads carry composite CRC-32Cs, and PutFile still returns the full-object CRC-32C.
func TestS3CompositeFallback(t *testing.T) {
	peer := s3StartPeer(t)
	proxy := s3StartProxy(t, peer.endpoint)
	proxy.set(func(p *s3FaultProxy) { p.noFullObject = true })
	s := peer.openS3(t, proxy.URL(), "composite", S3Options{PartSize: 5 << 20, Concurrency: 4})
	for i, size := range []int{12 << 20, 11<<20 + 1} {
		key := fmt.Sprintf("f%d", i)
		data := storeTestData(uint64(20+i), size)
		s3TestRoundTrip(t, peer, s, key, data)
		head, err := peer.client.HeadObject(t.Context(), &s3.HeadObjectInput{
			Bucket: &peer.bucket, Key: aws.String("composite/" + key), ChecksumMode: types.ChecksumModeEnabled,
		})
		if err != nil {
			t.Fatal(err)
		}
		var crcs []uint32
		for off := 0; off < size; off += 5 << 20 {
			crcs = append(crcs, crc32.Checksum(data[off:min(off+5<<20, size)], crc32.MakeTable(crc32.Castagnoli)))
		}
		if got, want := aws.ToString(head.ChecksumCRC32C), s3CompositeValue(crcs); got != want || head.ChecksumType != types.ChecksumTypeComposite {
			t.Errorf("Got(%q) server checksum = %s %q; want COMPOSITE %q", key, head.ChecksumType, got, want)
		}
	}
	if !s.composite.Load() {
		t.Errorf("Got(%q) composite fallback = false; want true", s.URL())
	}
	if got := proxy.count("nofullobject"); got != 1 {
		t.Errorf("Got(%q) FULL_OBJECT uploads refused = %d; want 1 (then composite from the start)", s.URL(), got)
	}
}

// TestS3ServerRejectsBadChecksum: the server verifies the CRC-32C a part carries.
func TestS3ServerRejectsBadChecksum(t *testing.T) {
	peer := s3StartPeer(t)
	bad := s3CRC32CValue(12345)
	_, err := peer.client.PutObject(t.Context(), &s3.PutObjectInput{
		Bucket: &peer.bucket, Key: aws.String("bad"), Body: strings.NewReader("hello"),
		ChecksumAlgorithm: types.ChecksumAlgorithmCrc32c, ChecksumCRC32C: &bad,
	})
	if err == nil {
		t.Errorf("PutObject with a wrong CRC-32C = nil; want the server to refuse it")
	}
}

// TestS3AbortIncomplete: AbortIncomplete aborts exactly the multipart uploads under the commit's
// prefix that the store value is not running, whatever the server says about their age: not
// its own upload in flight, not an upload whose key merely starts with the same characters.
func TestS3AbortIncomplete(t *testing.T) {
	peer := s3StartPeer(t)
	s := peer.openS3(t, peer.endpoint, "abort", S3Options{PartSize: 5 << 20, Concurrency: 4})
	// A killed run's uploads, created a moment ago behind the store's back.
	for _, key := range []string{
		"abort/j/c/shard_1/stale",
		"abort/j/c/shard_1/sub/stale2",
		"abort/j/c/shard_10",
		"abort/j/c/shard_10/other",
		"abort/j/c/parent",
		"elsewhere/j/c/shard_1/x",
	} {
		if _, err := peer.client.CreateMultipartUpload(t.Context(), &s3.CreateMultipartUploadInput{Bucket: &peer.bucket, Key: &key}); err != nil {
			t.Fatal(err)
		}
	}
	data := storeTestData(41, 12<<20)
	release := storeTestHold(t, s, "j/c/shard_1/big", data)
	if got := peer.incompleteUploads(t, "abort/j/c/shard_1/big"); len(got) != 1 {
		t.Fatalf("incomplete uploads of the held PutFile = %q; want one", got)
	}

	n, err := s.AbortIncomplete(t.Context(), "j/c/shard_1/")
	if err != nil || n != 2 {
		t.Errorf("AbortIncomplete(%q) = %d, %v; want 2", "j/c/shard_1/", n, err)
	}
	want := []string{"abort/j/c/parent", "abort/j/c/shard_10", "abort/j/c/shard_10/other", "abort/j/c/shard_1/big", "elsewhere/j/c/shard_1/x"}
	if got := peer.incompleteUploads(t, ""); !slices.Equal(s3TestSorted(got), s3TestSorted(want)) {
		t.Errorf("incomplete uploads after AbortIncomplete(%q) = %q; want %q", "j/c/shard_1/", got, want)
	}
	if err := release(); err != nil {
		t.Fatalf("PutFile(%q) held during AbortIncomplete = %v; want no error", "j/c/shard_1/big", err)
	}
	if got := storeTestDownload(t, s, "j/c/shard_1/big", int64(len(data))); !bytes.Equal(got, data) {
		t.Errorf("Download(%q) differs from what PutFile sent", "j/c/shard_1/big")
	}
	if n, err := s.AbortIncomplete(t.Context(), "j/"); err != nil || n != 3 {
		t.Errorf("AbortIncomplete(%q) = %d, %v; want 3", "j/", n, err)
	}
	if got := peer.incompleteUploads(t, ""); !slices.Equal(got, []string{"elsewhere/j/c/shard_1/x"}) {
		t.Errorf("incomplete uploads = %q; want [elsewhere/j/c/shard_1/x]", got)
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	if len(s.running) != 0 {
		t.Errorf("uploads the store is running = %v; want none", s.running)
	}
}

// TestS3AbortIncompleteOtherStore: a second store value (another agent's) does not own the
// first one's upload in flight, so its AbortIncomplete aborts it, and the PutFile fails.
func TestS3AbortIncompleteOtherStore(t *testing.T) {
	peer := s3StartPeer(t)
	s := peer.openS3(t, peer.endpoint, "abort", S3Options{PartSize: 5 << 20, Concurrency: 4})
	other := peer.openS3(t, peer.endpoint, "abort", S3Options{PartSize: 5 << 20, Concurrency: 4})
	data := storeTestData(42, 12<<20)
	release := storeTestHold(t, s, "j/c/big", data)
	if n, err := other.AbortIncomplete(t.Context(), "j/c/"); err != nil || n != 1 {
		t.Errorf("AbortIncomplete(%q) by another store = %d, %v; want 1", "j/c/", n, err)
	}
	if err := release(); err == nil {
		t.Errorf("PutFile(%q) whose upload was aborted = nil; want an error", "j/c/big")
	}
	if left := peer.incompleteUploads(t, ""); len(left) != 0 {
		t.Errorf("incomplete uploads = %q; want none", left)
	}
}

// s3TestSorted returns a sorted copy of keys.
func s3TestSorted(keys []string) []string {
	keys = slices.Clone(keys)
	slices.Sort(keys)
	return keys
}

// TestS3ServerConditionalWrites records what versitygw answers to conditional PutObjects, read
// with a plain client: the ETag in quotes, 412 PreconditionFailed for If-None-Match: * on an
// object and for If-Match with another ETag, 404 NoSuchKey for If-Match without an object, 501
// NotImplemented for both headers at once; an If-Match with the ETag, quoted or not, writes.
func TestS3ServerConditionalWrites(t *testing.T) {
	peer := s3StartPeer(t)
	put := func(key, body string, ifNoneMatch, ifMatch *string) (string, error) {
		out, err := peer.client.PutObject(t.Context(), &s3.PutObjectInput{
			Bucket: &peer.bucket, Key: &key, Body: strings.NewReader(body), IfNoneMatch: ifNoneMatch, IfMatch: ifMatch,
		})
		if err != nil {
			return "", err
		}
		return aws.ToString(out.ETag), nil
	}
	etag, err := put("k", "first", aws.String("*"), nil)
	if err != nil || len(etag) < 3 || etag[0] != '"' || etag[len(etag)-1] != '"' {
		t.Fatalf("PutObject(If-None-Match: *) = %q, %v; want a quoted ETag", etag, err)
	}
	head, err := peer.client.HeadObject(t.Context(), &s3.HeadObjectInput{Bucket: &peer.bucket, Key: aws.String("k")})
	if err != nil || aws.ToString(head.ETag) != etag {
		t.Errorf("HeadObject ETag = %q, %v; want %q as PutObject answered", aws.ToString(head.ETag), err, etag)
	}
	tests := []struct {
		name                 string
		key                  string
		ifNoneMatch, ifMatch *string
		wantStatus           int
		wantCode             string
	}{
		{name: "If-None-Match on an object", key: "k", ifNoneMatch: aws.String("*"), wantStatus: 412, wantCode: "PreconditionFailed"},
		{name: "If-Match another ETag", key: "k", ifMatch: aws.String(`"0123456789abcdef0123456789abcdef"`), wantStatus: 412, wantCode: "PreconditionFailed"},
		{name: "If-Match no object", key: "missing", ifMatch: aws.String(etag), wantStatus: 404, wantCode: "NoSuchKey"},
		{name: "both", key: "k", ifNoneMatch: aws.String("*"), ifMatch: aws.String(etag), wantStatus: 501, wantCode: "NotImplemented"},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			_, err := put(tc.key, "refused", tc.ifNoneMatch, tc.ifMatch)
			if got, code := s3HTTPStatus(err), s3ErrorCode(err); got != tc.wantStatus || code != tc.wantCode {
				t.Errorf("Got(%s) = %d %s (%v); want %d %s", tc.name, got, code, err, tc.wantStatus, tc.wantCode)
			}
		})
	}
	second, err := put("k", "second", nil, aws.String(etag))
	if err != nil || second == etag {
		t.Errorf("PutObject(If-Match the ETag) = %q, %v; want a new ETag", second, err)
	}
	if _, err := put("k", "third", nil, aws.String(strings.Trim(second, `"`))); err != nil {
		t.Errorf("PutObject(If-Match the ETag without quotes) = %v; want it to write", err)
	}
}

// s3TestRoundTrip uploads data through s and checks what the server holds, read directly.
func s3TestRoundTrip(t *testing.T, peer *s3Peer, s *S3Store, key string, data []byte) {
	t.Helper()
	var sent atomic.Int64
	sum, err := s.PutFile(t.Context(), key, storeTestFile(t, data), int64(len(data)), func(n int64) { sent.Add(n) })
	if err != nil {
		t.Fatalf("PutFile(%q) = %v; want no error", key, err)
	}
	if want := storeTestWant(t, data); sum != want {
		t.Errorf("PutFile(%q) = %v; want %v", key, sum, want)
	}
	if got := sent.Load(); got != int64(len(data)) {
		t.Errorf("PutFile(%q) progress = %d; want %d (retries counted once)", key, got, len(data))
	}
	direct := &S3Store{client: peer.client, bucket: s.bucket, prefix: s.prefix, opts: s.opts, lim: newLimiter(4)}
	if got := storeTestDownload(t, direct, key, int64(len(data))); !bytes.Equal(got, data) {
		t.Errorf("Download(%q) differs from what PutFile sent", key)
	}
	if left := peer.incompleteUploads(t, ""); len(left) != 0 {
		t.Errorf("incomplete uploads = %q; want none", left)
	}
}

func TestS3PutFileSlowDown(t *testing.T) {
	peer := s3StartPeer(t)
	proxy := s3StartProxy(t, peer.endpoint)
	s := peer.openS3(t, proxy.URL(), "slowdown", S3Options{PartSize: 5 << 20, Concurrency: 4})
	// A burst on the parts, which are in flight together.
	proxy.set(func(p *s3FaultProxy) { p.slowDownParts = 5 })
	s3TestRoundTrip(t, peer, s, "j/c/big", storeTestData(8, 12<<20+1))
	if got := proxy.count("slowdown"); got != 5 {
		t.Errorf("Got(%q) SlowDown answers = %d; want 5", "j/c/big", got)
	}
	proxy.set(func(p *s3FaultProxy) { p.slowDown = 2 })
	if _, err := s.PutBytes(t.Context(), "j/c/m", []byte("m"), Cond{IfAbsent: true}); err != nil {
		t.Errorf("PutBytes(%q) after 2 SlowDown = %v; want no error", "j/c/m", err)
	}
	if _, err := s.PutBytes(t.Context(), "j/c/m", []byte("m"), Cond{IfAbsent: true}); !errors.Is(err, ErrExists) {
		t.Errorf("PutBytes(%q) again = %v; want ErrExists", "j/c/m", err)
	}
}

// TestS3PutBytesLostAnswer: a conditional write whose first attempt the server applied but
// whose answer was lost is retried by the SDK and then fails its condition against its own
// result; PutBytes sees its bytes in the object and reports success. A retried write that lost
// to another writer still fails.
func TestS3PutBytesLostAnswer(t *testing.T) {
	peer := s3StartPeer(t)
	proxy := s3StartProxy(t, peer.endpoint)
	s := peer.openS3(t, proxy.URL(), "lost", S3Options{})
	const key = "j/LATEST"
	check := func(what, etag string, err error, want string) {
		t.Helper()
		if err != nil {
			t.Fatalf("PutBytes(%q, %s) = %v; want no error (seen: %s)", key, what, err, s3DescribeSeen(proxy))
		}
		data, got, err := s.GetBytes(t.Context(), key)
		if err != nil || string(data) != want || got != etag {
			t.Errorf("GetBytes(%q) after %s = %q, %q, %v; want %q, %q", key, what, data, got, err, want, etag)
		}
	}
	proxy.set(func(p *s3FaultProxy) { p.loseResponses = 1 })
	first, err := s.PutBytes(t.Context(), key, []byte("first"), Cond{IfAbsent: true})
	check("IfAbsent, answer lost", first, err, "first")
	proxy.set(func(p *s3FaultProxy) { p.loseResponses = 1 })
	second, err := s.PutBytes(t.Context(), key, []byte("second"), Cond{IfMatch: first})
	check("IfMatch, answer lost", second, err, "second")
	if got := proxy.count("lose"); got != 2 {
		t.Errorf("Got(%q) answers lost = %d; want 2", key, got)
	}

	// Another writer moves the object on; a retried write (503 first) then loses.
	if _, err := peer.client.PutObject(t.Context(), &s3.PutObjectInput{Bucket: &peer.bucket, Key: aws.String("lost/" + key), Body: strings.NewReader("other")}); err != nil {
		t.Fatal(err)
	}
	proxy.set(func(p *s3FaultProxy) { p.slowDown = 1 })
	if _, err := s.PutBytes(t.Context(), key, []byte("third"), Cond{IfMatch: second}); !errors.Is(err, ErrPrecondition) {
		t.Errorf("PutBytes(%q, IfMatch a stale ETag) retried = %v; want ErrPrecondition", key, err)
	}
	proxy.set(func(p *s3FaultProxy) { p.slowDown = 1 })
	if _, err := s.PutBytes(t.Context(), key, []byte("third"), Cond{IfAbsent: true}); !errors.Is(err, ErrExists) {
		t.Errorf("PutBytes(%q, IfAbsent) retried = %v; want ErrExists", key, err)
	}
	if got := proxy.count("slowdown"); got != 2 {
		t.Errorf("Got(%q) SlowDown answers = %d; want 2", key, got)
	}
	if data, _, err := s.GetBytes(t.Context(), key); err != nil || string(data) != "other" {
		t.Errorf("GetBytes(%q) = %q, %v; want the other writer's %q", key, data, err, "other")
	}
}

func TestS3PutFileConnectionReset(t *testing.T) {
	peer := s3StartPeer(t)
	proxy := s3StartProxy(t, peer.endpoint)
	s := peer.openS3(t, proxy.URL(), "reset", S3Options{PartSize: 5 << 20, Concurrency: 4})
	proxy.set(func(p *s3FaultProxy) { p.resetParts = 2 })
	s3TestRoundTrip(t, peer, s, "j/c/big", storeTestData(9, 16<<20))
	if got := proxy.count("reset"); got != 2 {
		t.Errorf("Got(%q) resets = %d; want 2", "j/c/big", got)
	}
}

// TestS3PutFileServerDown: the server vanishes in the middle of an upload and comes back only
// after the deadline. PutFile gives up at the deadline and aborts the upload once it can.
func TestS3PutFileServerDown(t *testing.T) {
	peer := s3StartPeer(t)
	proxy := s3StartProxy(t, peer.endpoint)
	s := peer.openS3(t, proxy.URL(), "down", S3Options{PartSize: 5 << 20, Concurrency: 4})
	proxy.set(func(p *s3FaultProxy) { p.downOnPart = true })
	data := storeTestData(10, 12<<20)
	ctx, cancel := context.WithCancel(t.Context())
	defer cancel()
	done := make(chan error, 1)
	go func() {
		_, err := s.PutFile(ctx, "j/c/big", storeTestFile(t, data), int64(len(data)), nil)
		done <- err
	}()
	// Cancelled while it retries: once the server has refused two attempts. (A deadline instead
	// would race the SDK's own 10 attempts, whose jittered delays may all be short.)
	eventuallyUploader(t, "the server to refuse two attempts", func() bool { return proxy.count("down") >= 2 })
	cancel()
	proxy.set(func(p *s3FaultProxy) { p.down = false }) // up again for the abort
	err := <-done
	if !errors.Is(err, context.Canceled) {
		t.Errorf("PutFile(%q) = %v; want context.Canceled", "j/c/big", err)
	}
	if got := proxy.count("abort"); got != 1 {
		t.Errorf("Got(%q) aborts = %d; want 1 (seen: %s)", "j/c/big", got, s3DescribeSeen(proxy))
	}
	if left := peer.incompleteUploads(t, ""); len(left) != 0 {
		t.Errorf("incomplete uploads = %q; want none", left)
	}
	if _, err := peer.client.HeadObject(t.Context(), &s3.HeadObjectInput{Bucket: &peer.bucket, Key: aws.String("down/j/c/big")}); !s3IsNotFound(err) {
		t.Errorf("HeadObject(%q) = %v; want not found", "down/j/c/big", err)
	}
}

// TestS3PutFileKeyTooLong: a key longer than S3's 1024 bytes, the store's prefix included, fails
// with errKeyTooLong before any request (S3 would refuse it with KeyTooLongError), one that fits
// is sent, and a server's own KeyTooLongError (a posix backend's 255-byte names) is errKeyTooLong.
func TestS3PutFileKeyTooLong(t *testing.T) {
	peer := s3StartPeer(t)
	proxy := s3StartProxy(t, peer.endpoint)
	s := peer.openS3(t, proxy.URL(), "long", S3Options{})
	data := storeTestData(11, 1<<10)
	// Elements of 100 bytes: a file system under the server holds no longer names.
	fits := strings.Repeat(strings.Repeat("k", 99)+"/", 10) + strings.Repeat("k", s3MaxKeyBytes-len("long/")-1000)
	if _, err := s.PutFile(t.Context(), fits, storeTestFile(t, data), int64(len(data)), nil); err != nil {
		t.Fatalf("PutFile of a %d-byte key = %v", len("long/"+fits), err)
	}
	before := proxy.count("forward")
	_, err := s.PutFile(t.Context(), fits+"k", storeTestFile(t, data), int64(len(data)), nil)
	if !errors.Is(err, errKeyTooLong) || !strings.Contains(err.Error(), "1025 bytes") {
		t.Errorf("PutFile of a 1025-byte key = %v; want errKeyTooLong saying 1025 bytes", err)
	}
	if got := proxy.count("forward"); got != before {
		t.Errorf("PutFile of a 1025-byte key sent %d requests; want none", got-before)
	}
	_, err = s.PutFile(t.Context(), strings.Repeat("n", 300), storeTestFile(t, data), int64(len(data)), nil)
	if !errors.Is(err, errKeyTooLong) {
		t.Errorf("PutFile of a 300-byte name the server refuses = %v; want errKeyTooLong", err)
	}
}

// TestS3PutFileStragglingPart: a part whose connection trickles while the other parts of its
// file are done is cut and sent again once it takes far longer than they did, instead of holding
// the file (and a notice's checkpoint) for as long as it trickles.
func TestS3PutFileStragglingPart(t *testing.T) {
	defer func(f int, d, c time.Duration) { s3StragglerFactor, s3StragglerSlack, s3StragglerCheckPeriod = f, d, c }(
		s3StragglerFactor, s3StragglerSlack, s3StragglerCheckPeriod)
	s3StragglerSlack, s3StragglerCheckPeriod = 500*time.Millisecond, 50*time.Millisecond
	peer := s3StartPeer(t)
	proxy := s3StartProxy(t, peer.endpoint)
	s := peer.openS3(t, proxy.URL(), "straggle", S3Options{PartSize: 5 << 20, Concurrency: 4})
	proxy.set(func(p *s3FaultProxy) { p.trickleParts = 1 }) // 5 MiB at 200 KiB/s: 25 s
	data := storeTestData(12, 20<<20)
	ctx, cancel := context.WithTimeout(t.Context(), 15*time.Second)
	defer cancel()
	start := time.Now()
	if _, err := s.PutFile(ctx, "j/c/x/file", storeTestFile(t, data), int64(len(data)), nil); err != nil {
		t.Fatalf("PutFile with one trickling part = %v; want it sent again and done well within 15 s", err)
	}
	if took := time.Since(start); took > 10*time.Second {
		t.Errorf("PutFile with one trickling part took %v; want the part cut after about 4 times the others' time plus %v", took, s3StragglerSlack)
	}
	if got := proxy.count("trickle"); got != 1 {
		t.Errorf("trickled parts = %d; want 1", got)
	}
	s3TestRoundTrip(t, peer, s, "j/c/x/file", data)
}

// TestS3DownloadFaults: a Download survives SlowDown answers and ranged reads cut off mid-body.
func TestS3DownloadFaults(t *testing.T) {
	peer := s3StartPeer(t)
	s := peer.openS3(t, peer.endpoint, "dl", S3Options{PartSize: 5 << 20, Concurrency: 4})
	data := storeTestData(11, 11<<20)
	if _, err := s.PutFile(t.Context(), "k", storeTestFile(t, data), int64(len(data)), nil); err != nil {
		t.Fatal(err)
	}
	proxy := s3StartProxy(t, peer.endpoint)
	ps := peer.openS3(t, proxy.URL(), "dl", S3Options{PartSize: 5 << 20, Concurrency: 4})
	proxy.set(func(p *s3FaultProxy) { p.slowDown = 2 })
	if got := storeTestDownload(t, ps, "k", int64(len(data))); !bytes.Equal(got, data) {
		t.Errorf("Download(%q) after SlowDown differs from the object", "k")
	}
	proxy.set(func(p *s3FaultProxy) { p.cutGets = 2 })
	if got := storeTestDownload(t, ps, "k", int64(len(data))); !bytes.Equal(got, data) {
		t.Errorf("Download(%q) after cut-off reads differs from the object", "k")
	}
	if got := proxy.count("cut"); got != 2 {
		t.Errorf("Got(%q) cut-off reads = %d; want 2", "k", got)
	}
	// A read cut off every time fails.
	proxy.set(func(p *s3FaultProxy) { p.cutGets = 100 })
	if err := ps.Download(t.Context(), "k", storeDiscardAt{}, int64(len(data))); err == nil {
		t.Errorf("Download(%q) with every read cut off = nil; want an error", "k")
	}
}

// TestS3DownloadReplaced: an object replaced between the reads of a Download is an error, not
// a mix of both.
func TestS3DownloadReplaced(t *testing.T) {
	peer := s3StartPeer(t)
	s := peer.openS3(t, peer.endpoint, "replaced", S3Options{PartSize: 5 << 20, Concurrency: 1})
	data := storeTestData(13, 11<<20)
	if _, err := s.PutFile(t.Context(), "k", storeTestFile(t, data), int64(len(data)), nil); err != nil {
		t.Fatal(err)
	}
	var replaced atomic.Bool
	w := storeFuncWriterAt(func(p []byte, off int64) (int, error) {
		if replaced.CompareAndSwap(false, true) {
			other := storeTestData(14, len(data))
			if _, err := s.PutFile(context.WithoutCancel(t.Context()), "k", storeTestFile(t, other), int64(len(other)), nil); err != nil {
				return 0, err
			}
		}
		return len(p), nil
	})
	// The replacing PutFile needs a part slot while the Download holds the only one of its
	// store, so the Download gets a store of its own.
	dl := peer.openS3(t, peer.endpoint, "replaced", S3Options{PartSize: 5 << 20, Concurrency: 1})
	err := dl.Download(t.Context(), "k", w, int64(len(data)))
	if err == nil || !strings.Contains(err.Error(), "changed") {
		t.Errorf("Download(%q) of an object replaced meanwhile = %v; want a changed-object error", "k", err)
	}
}

// TestS3DownloadDeleted: an object deleted between the reads of a Download (retention, while a
// restore reads an older commit) is ErrNotFound, as one its HEAD found gone: the restore starts
// again with the newest commit. The 404 of the ranged read was passed on as a failure, and the
// restore exited 1 (found from outside, 5 of about 110 deletions met during restores).
func TestS3DownloadDeleted(t *testing.T) {
	peer := s3StartPeer(t)
	s := peer.openS3(t, peer.endpoint, "deleted", S3Options{PartSize: 5 << 20, Concurrency: 1})
	data := storeTestData(16, 11<<20)
	if _, err := s.PutFile(t.Context(), "k", storeTestFile(t, data), int64(len(data)), nil); err != nil {
		t.Fatal(err)
	}
	var deleted atomic.Bool
	w := storeFuncWriterAt(func(p []byte, off int64) (int, error) {
		if deleted.CompareAndSwap(false, true) {
			if err := s.Delete(context.WithoutCancel(t.Context()), "k"); err != nil {
				return 0, err
			}
		}
		return len(p), nil
	})
	dl := peer.openS3(t, peer.endpoint, "deleted", S3Options{PartSize: 5 << 20, Concurrency: 1})
	if err := dl.Download(t.Context(), "k", w, int64(len(data))); !errors.Is(err, ErrNotFound) {
		t.Errorf("Download(%q) of an object deleted meanwhile = %v; want ErrNotFound", "k", err)
	}
}

// TestS3DownloadWritesWholeBuffers: a download writes the file a full copy buffer at a time (the
// last write of each range excepted), however little each read from the connection returns, so
// that the file system is called an eighth as often as a write a TLS record (16 KiB) would.
func TestS3DownloadWritesWholeBuffers(t *testing.T) {
	peer := s3StartPeer(t)
	const partSize = 5 << 20
	s := peer.openS3(t, peer.endpoint, "whole", S3Options{PartSize: partSize, Concurrency: 4})
	data := storeTestData(15, 11<<20+100<<10)
	if _, err := s.PutFile(t.Context(), "k", storeTestFile(t, data), int64(len(data)), nil); err != nil {
		t.Fatal(err)
	}
	ends := map[int64]bool{}
	for _, p := range s3PartPlan(int64(len(data)), partSize) {
		ends[p.off+p.n] = true
	}
	got := make([]byte, len(data))
	var (
		mu     sync.Mutex
		writes int
		short  []string
	)
	w := storeFuncWriterAt(func(p []byte, off int64) (int, error) {
		mu.Lock()
		defer mu.Unlock()
		writes++
		if len(p) != s3CopyBuffer && !ends[off+int64(len(p))] {
			short = append(short, fmt.Sprintf("%d bytes at %d", len(p), off))
		}
		return copy(got[off:], p), nil
	})
	if err := s.Download(t.Context(), "k", w, int64(len(data))); err != nil {
		t.Fatal(err)
	}
	if !bytes.Equal(got, data) {
		t.Errorf("Download(%q) wrote bytes that differ from the object", "k")
	}
	if len(short) > 0 {
		t.Errorf("Download(%q) made %d writes, %d of them short of the %d-byte buffer and not at a range's end: %s",
			"k", writes, len(short), s3CopyBuffer, strings.Join(short[:min(len(short), 5)], ", "))
	}
}

// TestS3CopyAt: s3CopyAt fills its buffer before each write, reports a body that ends early as
// io.ErrUnexpectedEOF with the bytes written so far, and stops at a failed write.
func TestS3CopyAt(t *testing.T) {
	data := storeTestData(16, 10_000)
	type write struct{ off, n int64 }
	record := func(writes *[]write, fail error) io.WriterAt {
		return storeFuncWriterAt(func(p []byte, off int64) (int, error) {
			*writes = append(*writes, write{off, int64(len(p))})
			if fail != nil {
				return 0, fail
			}
			return len(p), nil
		})
	}
	t.Run("whole", func(t *testing.T) {
		var writes []write
		n, err := s3CopyAt(record(&writes, nil), 100, iotest.HalfReader(bytes.NewReader(data)), int64(len(data)), make([]byte, 4096))
		want := []write{{100, 4096}, {4196, 4096}, {8292, 1808}}
		if n != int64(len(data)) || err != nil || !slices.Equal(writes, want) {
			t.Errorf("s3CopyAt = %d, %v, writes %v; want %d, nil, writes %v", n, err, writes, len(data), want)
		}
	})
	t.Run("short body", func(t *testing.T) {
		var writes []write
		n, err := s3CopyAt(record(&writes, nil), 0, bytes.NewReader(data[:5000]), int64(len(data)), make([]byte, 4096))
		if n != 5000 || !errors.Is(err, io.ErrUnexpectedEOF) {
			t.Errorf("s3CopyAt of 5000 bytes for %d = %d, %v; want 5000, %v", len(data), n, err, io.ErrUnexpectedEOF)
		}
	})
	t.Run("empty body", func(t *testing.T) {
		var writes []write
		n, err := s3CopyAt(record(&writes, nil), 0, bytes.NewReader(nil), 10, make([]byte, 4096))
		if n != 0 || !errors.Is(err, io.ErrUnexpectedEOF) || len(writes) != 0 {
			t.Errorf("s3CopyAt of nothing for 10 bytes = %d, %v, writes %v; want 0, %v, none", n, err, writes, io.ErrUnexpectedEOF)
		}
	})
	t.Run("failed write", func(t *testing.T) {
		var writes []write
		full := errors.New("no space left on device")
		n, err := s3CopyAt(record(&writes, full), 0, bytes.NewReader(data), int64(len(data)), make([]byte, 4096))
		if n != 0 || !errors.Is(err, full) || len(writes) != 1 {
			t.Errorf("s3CopyAt into a failing writer = %d, %v after %d writes; want 0, %v after 1", n, err, len(writes), full)
		}
	})
}

// storeFuncWriterAt is an io.WriterAt made of a function.
type storeFuncWriterAt func(p []byte, off int64) (int, error)

func (f storeFuncWriterAt) WriteAt(p []byte, off int64) (int, error) { return f(p, off) }

// BenchmarkS3PutFile uploads a 256 MiB file to versitygw with 64 MiB parts and reports the
// throughput and the growth of the process's peak RSS during the uploads.
func BenchmarkS3PutFile(b *testing.B) {
	peer := s3StartPeer(b)
	s := peer.openS3(b, peer.endpoint, "bench", S3Options{})
	const size = 256 << 20
	name := filepath.Join(b.TempDir(), "src")
	f, err := os.Create(name)
	if err != nil {
		b.Fatal(err)
	}
	defer f.Close()
	chunk := storeTestData(12, 1<<20)
	for range size >> 20 {
		if _, err := f.Write(chunk); err != nil {
			b.Fatal(err)
		}
	}
	s3ResetPeakRSS()
	base := s3PeakRSS()
	b.SetBytes(size)
	b.ResetTimer()
	for i := range b.N {
		if _, err := s.PutFile(b.Context(), fmt.Sprintf("k%d", i), f, size, nil); err != nil {
			b.Fatal(err)
		}
	}
	b.StopTimer()
	if base > 0 {
		b.ReportMetric(float64(s3PeakRSS()-base)/(1<<20), "peak-RSS-growth-MiB")
	}
}

// s3ResetPeakRSS resets the kernel's peak RSS counter of this process (Linux; a no-op
// elsewhere).
func s3ResetPeakRSS() { os.WriteFile("/proc/self/clear_refs", []byte("5"), 0) }

// s3PeakRSS returns this process's peak RSS in bytes (VmHWM), or 0 where unknown.
func s3PeakRSS() int64 {
	f, err := os.Open("/proc/self/status")
	if err != nil {
		return 0
	}
	defer f.Close()
	sc := bufio.NewScanner(f)
	for sc.Scan() {
		if v, ok := strings.CutPrefix(sc.Text(), "VmHWM:"); ok {
			kb, _ := strconv.ParseInt(strings.TrimSpace(strings.TrimSuffix(strings.TrimSpace(v), "kB")), 10, 64)
			return kb << 10
		}
	}
	return 0
}

// TestS3RestoreSDKQuiet: a restore from S3 through the SDK logs nothing per response. Ranged
// reads of a multipart object carry no full-object checksum the SDK can check, and it said so
// once a response ("Response has no supported checksum. Not validating response payload.", a
// DEBUG line on stderr: 32 of them for a 2 GiB restore) unless the client turns that off.
func TestS3RestoreSDKQuiet(t *testing.T) {
	peer := s3StartPeer(t)
	var (
		mu    sync.Mutex
		lines []string
	)
	cfg := s3TestConfig(t, peer.endpoint)
	cfg.Logger = logging.LoggerFunc(func(c logging.Classification, format string, v ...any) {
		mu.Lock()
		defer mu.Unlock()
		lines = append(lines, string(c)+" "+fmt.Sprintf(format, v...))
	})
	// As config.LoadDefaultConfig resolves it when nothing says otherwise (s3TestConfig leaves it unset).
	cfg.ResponseChecksumValidation = aws.ResponseChecksumValidationWhenSupported
	store, err := OpenStore("s3://"+peer.bucket+"/quiet", cfg, S3Options{PartSize: 5 << 20, Concurrency: 4})
	if err != nil {
		t.Fatal(err)
	}
	files := map[string]string{
		"model.pt":     string(storeTestData(21, 11<<20)), // three parts, read in three ranges
		"optim/0.pt":   string(storeTestData(22, 64<<10)),
		"meta/args.js": `{"lr":0.1}`,
	}
	m := restoreTestManifest(t, restoreTestJob, "step-000100", restoreTestT0, files)
	for _, f := range m.Files {
		data := []byte(files[f.Path])
		if _, err := store.PutFile(t.Context(), f.Key, storeTestFile(t, data), int64(len(data)), nil); err != nil {
			t.Fatal(err)
		}
	}
	mj, err := json.Marshal(m)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := store.PutBytes(t.Context(), ManifestKey(restoreTestJob, m.Checkpoint, m.Commit), mj, Cond{IfAbsent: true}); err != nil {
		t.Fatal(err)
	}
	mu.Lock()
	lines = nil // only the restore's
	mu.Unlock()

	_, to := restoreTestDirs(t)
	var log bytes.Buffer
	res, err := Restore(t.Context(), store, restoreTestOpts(to, &log))
	if err != nil {
		t.Fatalf("Restore() error: %v\n%s", err, log.String())
	}
	if d := restoreTestDiff(restoreTestTree(t, res.Dir), restoreTestWant(files)); d != "" {
		t.Errorf("restored tree differs from the checkpoint:%s", d)
	}
	mu.Lock()
	defer mu.Unlock()
	if len(lines) > 0 {
		t.Errorf("the SDK logged %d lines during the restore; want none:\n%s", len(lines), strings.Join(lines, "\n"))
	}
}

// A file a notice waits for goes in finer parts once the limiter lets more than 16 run at once:
// 40 MiB in 8 parts of 5 MiB rather than 5 of 8 MiB (the multipart ETag counts them), to a real
// server, and reads back whole.
func TestS3UrgentFileInFinerParts(t *testing.T) {
	peer := s3StartPeer(t)
	s := peer.openS3(t, peer.endpoint, "urgent", S3Options{Concurrency: 128})
	s.Hurry() // a notice: 32 requests at once
	data := storeTestData(16, 40<<20)
	for _, c := range []struct {
		key   string
		ctx   context.Context
		parts string
	}{
		{"calm", t.Context(), "-5"},
		{"urgent", withUrgency(t.Context()), "-8"},
	} {
		if _, err := s.PutFile(c.ctx, c.key, storeTestFile(t, data), int64(len(data)), nil); err != nil {
			t.Fatal(err)
		}
		head, err := peer.client.HeadObject(t.Context(), &s3.HeadObjectInput{Bucket: &peer.bucket, Key: aws.String("urgent/" + c.key)})
		if err != nil {
			t.Fatal(err)
		}
		if etag := strings.Trim(aws.ToString(head.ETag), `"`); !strings.HasSuffix(etag, c.parts) {
			t.Errorf("%s: ETag %s; want %s parts", c.key, etag, strings.TrimPrefix(c.parts, "-"))
		}
		got, _, err := s.GetBytes(t.Context(), c.key)
		if err != nil || !bytes.Equal(got, data) {
			t.Errorf("%s: read back %d bytes, %v; want the %d written", c.key, len(got), err, len(data))
		}
	}
}
