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
		Transport: &http.Transport{
			Proxy:               nil,
			DialContext:         d.DialContext,
			MaxIdleConns:        len(Sources) * 2,
			MaxIdleConnsPerHost: len(Sources) * 2,
			IdleConnTimeout:     90 * time.Second,
		},
		CheckRedirect: func(*http.Request, []*http.Request) error { return http.ErrUseLastResponse },
	}
}

// Get reads path below /latest/meta-data/ with ctx (which should carry a deadline; without
// one the SDK applies 5 s). It returns:
//   - body, true, nil: the body of a 2xx response;
//   - nil, false, nil: a 404 answer to the metadata GET itself (not to the token request);
//   - nil, false, err: anything else: the token request failed (including 403/404/405, where
//     an IMDSv1-capable client would have fallen back), timeout, connection error, a status
//     other than 2xx or 404 (a 401 after the one retry with a fresh token), or a failed read.
func (c *Client) Get(ctx context.Context, path string) ([]byte, bool, error) {
	out, err := c.api.GetMetadata(ctx, &sdkimds.GetMetadataInput{Path: path})
	if err != nil {
		if isMetadataNotFound(err) {
			return nil, false, nil
		}
		return nil, false, err
	}
	defer out.Content.Close()
	body, err := io.ReadAll(out.Content)
	if err != nil {
		return nil, false, fmt.Errorf("read imds %s: %w", path, err)
	}
	return body, true, nil
}

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
