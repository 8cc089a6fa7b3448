package imds

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"time"

	"github.com/aws/aws-sdk-go-v2/aws"
	sdkimds "github.com/aws/aws-sdk-go-v2/feature/ec2/imds"
	smithyhttp "github.com/aws/smithy-go/transport/http"
)

// Client is a [Getter] over the aws-sdk-go-v2 IMDS client. Create one with [NewClient] and
// keep it for the life of the process: it caches the session token. It is safe for
// concurrent use.
type Client struct {
	api *sdkimds.Client
}

var _ Getter = (*Client)(nil)

// NewClient returns a Client built from cfg with these settings:
//   - IMDSv2 only: EnableFallback is [aws.FalseTernary], so a failed token request is an error
//     and never a silent IMDSv1 request without a token;
//   - the endpoint is endpoint when it is non-empty, else whatever the SDK resolves from cfg and
//     the environment (AWS_EC2_METADATA_SERVICE_ENDPOINT, AWS_EC2_METADATA_SERVICE_ENDPOINT_MODE,
//     shared config), else http://169.254.169.254;
//   - no SDK retries and no SDK backoff, because the [Watcher] backs off itself, with one
//     exception: a request answered 401 (the session token expired or IMDS forgot it) is retried
//     once, at once, after the SDK has dropped the token and fetched a new one. Token expiry is
//     routine every few minutes and is not worth an error streak;
//   - never through an HTTP proxy: IMDS is link-local, and HTTP_PROXY without
//     NO_PROXY=169.254.169.254 would otherwise send every poll to the proxy;
//   - no HTTP timeout but a 1 s dial timeout: the deadline of Get's ctx alone bounds a request,
//     so an IMDS that answers slowly is read, late. (Given its default HTTP client, the SDK
//     gives up on any answer whose headers take over 500 ms, whatever the ctx allows.);
//   - redirects are not followed: a 3xx answer is an error, and the session token is never
//     sent anywhere but the endpoint.
//
// AWS_EC2_METADATA_DISABLED=true makes every Get fail.
func NewClient(cfg aws.Config, endpoint string) *Client {
	api := sdkimds.NewFromConfig(cfg, func(o *sdkimds.Options) {
		if endpoint != "" {
			o.Endpoint = endpoint
		}
		o.EnableFallback = aws.FalseTernary
		o.Retryer = tokenRetryer{}
		o.DisableDefaultMaxBackoff = true
		o.HTTPClient = newHTTPClient()
	})
	return &Client{api: api}
}

// dialTimeout bounds connecting to IMDS. Off EC2 the link-local address may swallow the
// connection attempt; on EC2 a connection takes well under a millisecond.
const dialTimeout = time.Second

// newHTTPClient returns the HTTP client of [NewClient]. It must not be an
// *awshttp.BuildableClient: the SDK's imds.New gives one of those a 250 ms dial timeout and a
// 500 ms ResponseHeaderTimeout, and passes any other client through unchanged.
func newHTTPClient() *http.Client {
	d := &net.Dialer{Timeout: dialTimeout, KeepAlive: 30 * time.Second}
	return &http.Client{
		Transport: cutTransport{&http.Transport{
			Proxy:               nil,
			DialContext:         d.DialContext,
			MaxIdleConns:        len(Sources) * 2,
			MaxIdleConnsPerHost: len(Sources) * 2,
			IdleConnTimeout:     90 * time.Second,
		}},
		CheckRedirect: func(*http.Request, []*http.Request) error { return http.ErrUseLastResponse },
	}
}

// Get reads path below /latest/meta-data/ with ctx (which should carry a deadline; without
// one the SDK applies 5 s). It returns:
//   - body, true, nil: the body of a 2xx response;
//   - nil, false, nil: a 404 answer to the metadata GET itself (not to the token request);
//   - body, true, err: a 2xx response whose body could not be read whole (what was read; err
//     wraps [ErrBodyCut]);
//   - nil, false, err: anything else: the token request failed (including 403/404/405, where
//     an IMDSv1-capable client would have fallen back), timeout, connection error, a status
//     other than 2xx or 404 (a 401 after the one retry with a fresh token).
func (c *Client) Get(ctx context.Context, path string) ([]byte, bool, error) {
	out, err := c.api.GetMetadata(ctx, &sdkimds.GetMetadataInput{Path: path})
	if err != nil {
		if isMetadataNotFound(err) {
			return nil, false, nil
		}
		if bc, ok := errors.AsType[*bodyCutError](err); ok {
			return bc.read, true, fmt.Errorf("%w: %w", ErrBodyCut, err)
		}
		return nil, false, err
	}
	defer out.Content.Close()
	body, err := io.ReadAll(out.Content)
	if err != nil {
		return body, true, fmt.Errorf("read imds %s: %w: %w", path, ErrBodyCut, err)
	}
	return body, true, nil
}

// cutTransport lets Client.Get tell a 2xx answer whose body could not be read whole from a
// request that failed: the SDK reads the body before it looks at the status, and its error says
// neither. A 2xx answer to a GET gets a body whose read error (not EOF) is a *bodyCutError
// carrying what was read, which the SDK's error wraps.
type cutTransport struct{ next http.RoundTripper }

func (t cutTransport) RoundTrip(r *http.Request) (*http.Response, error) {
	resp, err := t.next.RoundTrip(r)
	if err == nil && r.Method == http.MethodGet && resp.StatusCode/100 == 2 {
		resp.Body = &cutReader{body: resp.Body}
	}
	return resp, err
}

// maxCutKept bounds what a cutReader keeps of a body: a notice is a few hundred bytes.
const maxCutKept = 64 << 10

// cutReader is the body of a 2xx answer (see cutTransport).
type cutReader struct {
	body io.ReadCloser
	read []byte // the start of what was read, up to maxCutKept bytes
}

func (c *cutReader) Read(p []byte) (int, error) {
	n, err := c.body.Read(p)
	if keep := min(n, maxCutKept-len(c.read)); keep > 0 {
		c.read = append(c.read, p[:keep]...)
	}
	if err != nil && !errors.Is(err, io.EOF) {
		return n, &bodyCutError{read: c.read, err: err}
	}
	return n, err
}

func (c *cutReader) Close() error { return c.body.Close() }

// bodyCutError is the read error of a cutReader: what was read before it.
type bodyCutError struct {
	read []byte
	err  error
}

func (e *bodyCutError) Error() string { return e.err.Error() }
func (e *bodyCutError) Unwrap() error { return e.err }

// isMetadataNotFound reports whether err is a 404 answer to a metadata GET. A 404 answer to
// the token PUT (an IMDS that does not offer v2) must stay an error, so the request method is
// checked rather than trusting that the SDK hides the token request's status.
func isMetadataNotFound(err error) bool {
	var re *smithyhttp.ResponseError
	if !errors.As(err, &re) || re.HTTPStatusCode() != http.StatusNotFound {
		return false
	}
	return re.Response != nil && re.Response.Response != nil &&
		re.Response.Request != nil && re.Response.Request.Method == http.MethodGet
}

// tokenRetryer is an [aws.Retryer] that retries nothing but a 401, once, without delay. The
// SDK's token provider marks a 401 answer as retryable after dropping the cached token, so
// the second attempt carries a fresh token.
type tokenRetryer struct{ aws.NopRetryer }

// IsErrorRetryable reports whether err is the SDK's retryable 401 marker.
func (tokenRetryer) IsErrorRetryable(err error) bool {
	var r interface{ RetryableError() bool }
	return errors.As(err, &r) && r.RetryableError()
}

// MaxAttempts allows the one retry.
func (tokenRetryer) MaxAttempts() int { return 2 }

// RetryDelay is zero: the token has already been replaced.
func (tokenRetryer) RetryDelay(int, error) (time.Duration, error) { return 0, nil }
