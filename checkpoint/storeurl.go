package checkpoint

import (
	"context"
	"crypto/tls"
	"crypto/x509"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"path"
	"strings"
	"sync/atomic"
	"time"
	"unicode/utf8"

	"github.com/aws/aws-sdk-go-v2/aws"
	"github.com/aws/aws-sdk-go-v2/aws/ratelimit"
	"github.com/aws/aws-sdk-go-v2/aws/retry"
	awshttp "github.com/aws/aws-sdk-go-v2/aws/transport/http"
	"github.com/aws/aws-sdk-go-v2/service/s3"
)

// ParseStoreURL splits a store URL into its parts:
//
//   - "s3://bucket/prefix" returns "s3", the bucket and the prefix without leading or trailing
//     slashes ("" for "s3://bucket" or "s3://bucket/").
//   - "file:///abs/path" returns "file", "" and the cleaned absolute path.
//
// It returns an error, and empty strings, for any other scheme, an s3 URL without a bucket, a
// file URL with a host or a relative path, a query or fragment, and a prefix or path with a ".."
// or "." element, an empty element, a backslash or a NUL.
func ParseStoreURL(u string) (scheme, bucket, prefix string, err error) {
	if strings.ContainsAny(u, "?#") {
		return "", "", "", fmt.Errorf("store url %q: a query or fragment is not allowed", u)
	}
	if rest, ok := strings.CutPrefix(u, "s3://"); ok {
		bucket, prefix, _ = strings.Cut(rest, "/")
		if bucket == "" {
			return "", "", "", fmt.Errorf("store url %q: missing bucket (want s3://bucket/prefix)", u)
		}
		if strings.ContainsFunc(bucket, func(r rune) bool {
			return !('a' <= r && r <= 'z' || 'A' <= r && r <= 'Z' || '0' <= r && r <= '9' || r == '.' || r == '-' || r == '_')
		}) {
			// A user in it (s3://user@bucket), a port (s3://bucket:9000), a space: the SDK would
			// take it all for the bucket's name. An endpoint goes in AWS_ENDPOINT_URL_S3.
			return "", "", "", fmt.Errorf("store url %q: invalid bucket name %q: a bucket name has letters, digits, dots, hyphens and underscores only (an endpoint or port goes in AWS_ENDPOINT_URL_S3)", u, bucket)
		}
		prefix = strings.TrimSuffix(prefix, "/")
		if prefix != "" {
			if err := checkStoreKey(prefix); err != nil {
				return "", "", "", fmt.Errorf("store url %q: prefix: %w", u, err)
			}
			// It begins every key, as store.job does: what S3's XML lists cannot carry, or
			// carry as written, fails or changes every list (found from outside: a prefix with
			// U+FFFF was taken, and list --check failed on the agent's own commits).
			switch {
			case !utf8.ValidString(prefix):
				return "", "", "", fmt.Errorf("store url %q: prefix is not valid UTF-8 (S3 keys are)", u)
			case hasControl(prefix):
				return "", "", "", fmt.Errorf("store url %q: prefix has a control character (S3 lists such a key changed, or not at all)", u)
			case hasNonXML(prefix):
				return "", "", "", fmt.Errorf("store url %q: prefix has U+FFFE or U+FFFF (S3's XML lists cannot carry them: such a key is listed changed, or fails the whole list)", u)
			}
		}
		return "s3", bucket, prefix, nil
	}
	if rest, ok := strings.CutPrefix(u, "file://"); ok {
		if !strings.HasPrefix(rest, "/") {
			return "", "", "", fmt.Errorf("store url %q: want an absolute path with no host, such as file:///mnt/fsx/checkpoints", u)
		}
		if strings.ContainsAny(rest, "\\\x00") {
			return "", "", "", fmt.Errorf("store url %q: path contains a backslash or NUL", u)
		}
		for _, el := range strings.Split(rest, "/") {
			if el == ".." || el == "." {
				return "", "", "", fmt.Errorf("store url %q: path has a %q element", u, el)
			}
		}
		return "file", "", path.Clean(rest), nil
	}
	scheme, _, found := strings.Cut(u, "://")
	if !found {
		return "", "", "", fmt.Errorf("store url %q: want s3://bucket/prefix or file:///path", u)
	}
	return "", "", "", fmt.Errorf("store url %q: unsupported scheme %q (want s3 or file)", u, scheme)
}

// S3Options tune an S3 store.
type S3Options struct {
	// PartSize is the largest part of a multipart upload and ranged read of a download: a
	// file is cut into parts of at least 8 MiB (or PartSize, if smaller) and at most PartSize,
	// 16 of them where those sizes allow; one of at most 8 MiB goes in one PutObject. 0 means 64 MiB; it must be at
	// least 5 MiB and at most 5 GiB. PutFile raises it for a file that would need more than
	// 10,000 parts.
	PartSize int64
	// Concurrency is the most parts (uploads and ranged reads) in flight at once across all
	// PutFile and Download calls of the store. 0 means 16.
	Concurrency int
	// SSE is the server-side encryption every object the store writes asks for
	// (x-amz-server-side-encryption on each PutObject and CreateMultipartUpload; parts follow
	// their upload): "" sends nothing, so the bucket's default encryption applies; "AES256"
	// (SSE-S3) or "aws:kms" (SSE-KMS). Reads need nothing: S3 decrypts for whoever may read
	// the object (and, with SSE-KMS, use its key).
	SSE string
	// KMSKeyID is the KMS key of SSE "aws:kms" (x-amz-server-side-encryption-aws-kms-key-id):
	// a key ID, key ARN, alias name (alias/NAME) or alias ARN; "" is the AWS managed key
	// aws/s3, whatever key the bucket's default encryption names (S3 uses that one only when a
	// write asks for no encryption). Only with SSE "aws:kms".
	KMSKeyID string
}

// The values of S3Options.SSE.
const (
	SSENone = ""
	SSES3   = "AES256"
	SSEKMS  = "aws:kms"
)

// sseValues names the values of S3Options.SSE in messages.
const sseValues = `"" (the bucket's default), AES256 or aws:kms`

// CheckSSE reports whether sse and kmsKeyID are a valid S3Options.SSE and KMSKeyID pair.
func CheckSSE(sse, kmsKeyID string) error {
	var problems []error
	switch sse {
	case SSENone, SSES3, SSEKMS:
	default:
		problems = append(problems, fmt.Errorf("server-side encryption %q: want %s", sse, sseValues))
	}
	if kmsKeyID != "" {
		if sse != SSEKMS {
			problems = append(problems, fmt.Errorf("a KMS key (%s) is only for server-side encryption aws:kms, not %q", kmsKeyID, sse))
		}
		if strings.ContainsFunc(kmsKeyID, func(r rune) bool { return r <= ' ' || r == 0x7f }) || len(kmsKeyID) > 2048 {
			problems = append(problems, fmt.Errorf("KMS key %q: want a key ID, key ARN, alias/NAME or alias ARN", kmsKeyID))
		}
	}
	return errors.Join(problems...)
}

const (
	s3DefaultPartSize    = 64 << 20
	s3MinPartSize        = 5 << 20
	s3MaxPartSize        = 5 << 30
	s3DefaultConcurrency = 16
)

// withDefaults returns o with zero fields set to their defaults, or an error for values out of
// range.
func (o S3Options) withDefaults() (S3Options, error) {
	var problems []error
	switch {
	case o.PartSize == 0:
		o.PartSize = s3DefaultPartSize
	case o.PartSize < s3MinPartSize || o.PartSize > s3MaxPartSize:
		problems = append(problems, fmt.Errorf("part size %d is out of range [%d, %d]", o.PartSize, int64(s3MinPartSize), int64(s3MaxPartSize)))
	}
	switch {
	case o.Concurrency == 0:
		o.Concurrency = s3DefaultConcurrency
	case o.Concurrency < 0:
		problems = append(problems, fmt.Errorf("concurrency %d is negative", o.Concurrency))
	}
	if err := CheckSSE(o.SSE, o.KMSKeyID); err != nil {
		problems = append(problems, err)
	}
	return o, errors.Join(problems...)
}

// OpenStore returns the Store for url (see ParseStoreURL):
//
//   - s3://bucket/prefix: an *S3Store on a client made from awsCfg (region, credentials and
//     endpoint come from the SDK's own environment and shared config). The client retries with
//     the SDK's standard retryer, up to 10 attempts with at most 2 s of backoff and no retry
//     quota, so that the caller's context deadline is what bounds a retried request. It uses
//     path-style addressing when an endpoint URL is configured (awsCfg.BaseEndpoint, or
//     AWS_ENDPOINT_URL_S3 or AWS_ENDPOINT_URL in the environment), so local servers work. If
//     awsCfg.HTTPClient is nil or the SDK's own (*BuildableClient, as AWS_CA_BUNDLE makes), the
//     client keeps up to opts.Concurrency idle connections. It
//     does not log a line for every response without a checksum it can validate.
//   - file:///path: a *FileStore at path (created if missing); awsCfg and opts are not used.
//
// It returns an error for a URL ParseStoreURL refuses, for opts out of range, and when the
// file store's directory cannot be created.
func OpenStore(url string, awsCfg aws.Config, opts S3Options) (Store, error) {
	scheme, bucket, prefix, err := ParseStoreURL(url)
	if err != nil {
		return nil, err
	}
	switch scheme {
	case "file":
		return NewFileStore(prefix)
	default: // "s3"
		opts, err := opts.withDefaults()
		if err != nil {
			return nil, fmt.Errorf("store %s: %w", url, err)
		}
		return NewS3Store(s3NewClient(awsCfg, opts.Concurrency), bucket, prefix, opts)
	}
}

// BucketRegion asks S3 which region bucket is in: an anonymous HeadBucket, whose answer carries
// the bucket's region (x-amz-bucket-region) whether it is allowed or refused (403, 301), sent in
// awsCfg's region (us-east-1 when it has none) to awsCfg's endpoint. It returns "" and an error
// when no answer names a region (a network failure, a server that does not say); the caller then
// keeps its own region. Requests signed for a region other than the bucket's fail, so a bucket
// in another region than the instance (common when chasing Spot capacity) needs this.
func BucketRegion(ctx context.Context, awsCfg aws.Config, bucket string) (string, error) {
	if awsCfg.Region == "" {
		awsCfg.Region = "us-east-1"
	}
	awsCfg.Credentials = aws.AnonymousCredentials{} // unsigned: the client turns it into none
	client := s3NewClient(awsCfg, 1)
	out, err := client.HeadBucket(ctx, &s3.HeadBucketInput{Bucket: aws.String(bucket)}, func(o *s3.Options) {
		o.Retryer = retry.AddWithMaxAttempts(o.Retryer, 2)
	})
	if err == nil {
		if out.BucketRegion != nil && *out.BucketRegion != "" {
			return *out.BucketRegion, nil
		}
		return "", errors.New("HeadBucket did not name the bucket's region")
	}
	var re *awshttp.ResponseError
	if errors.As(err, &re) && re.Response != nil {
		if r := re.Response.Header.Get("X-Amz-Bucket-Region"); r != "" {
			return r, nil
		}
	}
	return "", err
}

// s3ResponseHeaderTimeout bounds the wait for the answer to a request once it is sent (its body
// included): S3 answers in milliseconds, and sends the headers of a CompleteMultipartUpload
// before the work. A variable for tests.
var s3ResponseHeaderTimeout = 20 * time.Second

// s3DialTimeout bounds the opening of a connection to the store (the SDK's default is 30 s).
const s3DialTimeout = 5 * time.Second

// s3NewClient returns the S3 client OpenStore uses; see there.
func s3NewClient(awsCfg aws.Config, conns int) *s3.Client {
	pathStyle := awsCfg.BaseEndpoint != nil ||
		os.Getenv("AWS_ENDPOINT_URL_S3") != "" || os.Getenv("AWS_ENDPOINT_URL") != ""
	return s3.NewFromConfig(awsCfg, func(o *s3.Options) {
		o.UsePathStyle = o.UsePathStyle || pathStyle
		// Not a line per response that carries no checksum the SDK can check (ranged reads of a
		// multipart object, small objects put without one): the restore verifies every file's
		// full-object checksum itself.
		o.DisableLogOutputChecksumValidationSkipped = true
		o.Retryer = retry.NewStandard(func(so *retry.StandardOptions) {
			so.MaxAttempts = 10
			so.MaxBackoff = 2 * time.Second
			so.RateLimiter = ratelimit.None
			so.Retryables = append([]retry.IsErrorRetryable{retry.IsErrorRetryableFunc(certificateNotTrusted), retry.IsErrorRetryableFunc(stallRetryable)}, so.Retryables...)
		})
		// The SDK's own client keeps 10 idle connections per host; more requests in flight would
		// open and close a connection each. A client the SDK's config built (AWS_CA_BUNDLE gives
		// one) is sized the same way; one the caller made is left as it is.
		// A request the store never answers (a route that drops packets, a server that hangs)
		// fails after s3ResponseHeaderTimeout and is retried, instead of holding its part, or the
		// commit, for as long as the kernel keeps the connection; the same for a connection that
		// is never accepted, after s3DialTimeout.
		switch c := awsCfg.HTTPClient.(type) {
		case nil:
			o.HTTPClient = awshttp.NewBuildableClient().WithTransportOptions(func(tr *http.Transport) {
				tr.MaxIdleConnsPerHost = conns
				tr.ResponseHeaderTimeout = s3ResponseHeaderTimeout
			}).WithDialerOptions(func(d *net.Dialer) { d.Timeout = s3DialTimeout })
		case *awshttp.BuildableClient:
			o.HTTPClient = c.WithTransportOptions(func(tr *http.Transport) {
				tr.MaxIdleConnsPerHost = max(tr.MaxIdleConnsPerHost, conns)
				if tr.ResponseHeaderTimeout == 0 {
					tr.ResponseHeaderTimeout = s3ResponseHeaderTimeout
				}
			}).WithDialerOptions(func(d *net.Dialer) { d.Timeout = s3DialTimeout })
		}
		// An answer whose body stops coming after its headers is cut as well, and retried:
		// the SDK reads the bodies of lists and of a commit's answers within the call, where
		// nothing else bounds them (found from outside: a body that stalled held the commits,
		// restore and list for as long as the server kept the connection).
		if o.HTTPClient != nil {
			o.HTTPClient = stallingClient{o.HTTPClient}
		}
	})
}

// stallingClient wraps the bodies of the answers of its client in a [stallBody].
type stallingClient struct {
	c interface {
		Do(*http.Request) (*http.Response, error)
	}
}

func (c stallingClient) Do(req *http.Request) (*http.Response, error) {
	resp, err := c.c.Do(req)
	if err == nil && resp.Body != nil {
		resp.Body = newStallBody(resp.Body, s3StallTimeout)
	}
	return resp, err
}

// stallBody is an answer's body whose every Read that brings nothing for d closes it: the Read
// then fails with errStalled. Only the wait in Read counts, not the reader's own time between
// reads.
type stallBody struct {
	body    io.ReadCloser
	d       time.Duration
	timer   *time.Timer
	stalled atomic.Bool
}

func newStallBody(body io.ReadCloser, d time.Duration) *stallBody {
	b := &stallBody{body: body, d: d}
	b.timer = time.AfterFunc(d, func() {
		b.stalled.Store(true)
		_ = b.body.Close() // unblocks the Read; nothing was written
	})
	b.timer.Stop()
	return b
}

func (b *stallBody) Read(p []byte) (int, error) {
	b.timer.Reset(b.d)
	n, err := b.body.Read(p)
	b.timer.Stop()
	if err != nil && err != io.EOF && b.stalled.Load() {
		err = fmt.Errorf("%w (%w)", errStalled, err)
	}
	return n, err
}

func (b *stallBody) Close() error {
	b.timer.Stop()
	return b.body.Close()
}

// stallRetryable is true (retried) for a request whose answer's body stalled (stallBody).
func stallRetryable(err error) aws.Ternary {
	if errors.Is(err, errStalled) {
		return aws.TrueTernary
	}
	return aws.UnknownTernary
}

// checkStoreKey reports whether key is a safe store key: not empty, not absolute, clean (no
// empty, "." or ".." element, no trailing slash), no backslash or NUL.
func checkStoreKey(key string) error {
	switch {
	case key == "":
		return errors.New("empty key")
	case strings.HasPrefix(key, "/"):
		return fmt.Errorf("key %q is absolute", key)
	case strings.ContainsAny(key, "\\\x00"):
		return fmt.Errorf("key %q contains a backslash or NUL", key)
	}
	for _, el := range strings.Split(key, "/") {
		switch el {
		case "":
			return fmt.Errorf("key %q has an empty element", key)
		case ".", "..":
			return fmt.Errorf("key %q has a %q element", key, el)
		}
	}
	return nil
}

// certificateNotTrusted is false (not retried) for an error of the store's certificate: no try
// again makes it trusted (found from outside: an untrusted certificate was tried 10 times, about
// 15 s, before doctor or a restore said so). Unknown for any other error.
func certificateNotTrusted(err error) aws.Ternary {
	var verify *tls.CertificateVerificationError
	var unknown x509.UnknownAuthorityError
	var host x509.HostnameError
	var invalid x509.CertificateInvalidError
	if errors.As(err, &verify) || errors.As(err, &unknown) || errors.As(err, &host) || errors.As(err, &invalid) {
		return aws.FalseTernary
	}
	return aws.UnknownTernary
}
