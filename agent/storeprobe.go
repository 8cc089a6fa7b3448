package agent

import (
	"bytes"
	"context"
	crand "crypto/rand"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"math/rand/v2"
	"net"
	neturl "net/url"
	"os"
	"slices"
	"strings"
	"sync"
	"syscall"
	"time"

	"github.com/aws/aws-sdk-go-v2/aws/retry"
	awshttp "github.com/aws/aws-sdk-go-v2/aws/transport/http"
	"github.com/aws/smithy-go"
	smithyhttp "github.com/aws/smithy-go/transport/http"
	"github.com/rs/zerolog"

	"github.com/spotguard/spotguard/checkpoint"
)

// The reasons a store operation failed, from [StoreErrorReason]: the values of the reason label
// of spotguard_checkpoint_upload_errors_total and of [StoreProbe].Reason. The set is fixed.
const (
	// StoreThrottled: the store asks us to slow down (S3 503 SlowDown, 429, throttling codes).
	StoreThrottled = "throttled"
	// StoreDenied: access refused (AccessDenied, InvalidAccessKeyId, SignatureDoesNotMatch,
	// ExpiredToken, HTTP 401/403, no credentials, a file store without permission).
	StoreDenied = "denied"
	// StoreNotFound: the bucket (NoSuchBucket) or an object is not there (HTTP 404).
	StoreNotFound = "not_found"
	// StoreNetwork: the store could not be reached or did not answer in time (refused or reset
	// connections, DNS, timeouts, 500/502/504).
	StoreNetwork = "network"
	// StoreChanged: a conditional write lost (another writer), or the file changed while it was
	// being sent.
	StoreChanged = "changed"
	// StoreOther: anything else (a wrong region, a full disk, an invalid request, ...).
	StoreOther = "other"
)

// storeReasons lists every reason, for metrics that show each one from the start.
var storeReasons = []string{StoreThrottled, StoreDenied, StoreNotFound, StoreNetwork, StoreChanged, StoreOther}

// deniedCodes are S3 (and STS) error codes that mean access was refused.
var deniedCodes = map[string]bool{
	"AccessDenied": true, "AllAccessDisabled": true, "InvalidAccessKeyId": true, "SignatureDoesNotMatch": true,
	"ExpiredToken": true, "InvalidToken": true, "TokenRefreshRequired": true, "AccountProblem": true,
	"Forbidden": true, "UnauthorizedAccess": true, "InvalidClientTokenId": true, "AccessDeniedException": true,
	"KMS.AccessDeniedException": true, "KMS.DisabledException": true,
}

// StoreErrorReason classifies err, an error from a [checkpoint.Store] (S3 or file), into one of
// the Store* reasons. It returns "" for nil. The S3 error code decides first (the HTTP status
// when there is no code), then the error's kind: checkpoint.ErrPrecondition and ErrExists are
// changed, ErrNotFound is not_found, missing credentials and fs.ErrPermission are denied,
// network errors and deadlines are network; anything else is other.
func StoreErrorReason(err error) string {
	if err == nil {
		return ""
	}
	if errors.Is(err, checkpoint.ErrPrecondition) || errors.Is(err, checkpoint.ErrExists) {
		return StoreChanged
	}
	if code := storeErrorCode(err); code != "" {
		switch {
		case code == "NoSuchBucket" || code == "NoSuchKey" || code == "NotFound":
			return StoreNotFound
		case code == "RequestTimeTooSkewed" || code == "SecondLevelDomainForbidden":
			return StoreOther // 403, but no permission to grant: a clock, an addressing style (found from outside)
		case deniedCodes[code]:
			return StoreDenied
		case code == "PreconditionFailed" || code == "ConditionalRequestConflict":
			return StoreChanged
		case isThrottleCode(code):
			return StoreThrottled
		case code == "InternalError" || code == "ServiceUnavailable" || code == "RequestTimeout":
			return StoreNetwork
		}
	}
	switch status := storeHTTPStatus(err); {
	case status == 429 || status == 503:
		return StoreThrottled
	case status == 401 || status == 403:
		return StoreDenied
	case status == 404:
		return StoreNotFound
	case status == 412 || status == 409:
		return StoreChanged
	case status == 500 || status == 502 || status == 504:
		return StoreNetwork
	case status != 0:
		return StoreOther
	}
	msg := err.Error()
	switch {
	case errors.Is(err, checkpoint.ErrNotFound):
		return StoreNotFound
	case strings.Contains(msg, "changed while"):
		return StoreChanged
	case strings.Contains(msg, "credentials") || strings.Contains(msg, "no EC2 IMDS role"):
		return StoreDenied
	case errors.Is(err, fs.ErrPermission) || errors.Is(err, syscall.EROFS):
		return StoreDenied
	case errors.Is(err, context.DeadlineExceeded) || errors.Is(err, io.ErrUnexpectedEOF) || errors.Is(err, io.EOF) ||
		errors.Is(err, syscall.ECONNREFUSED) || errors.Is(err, syscall.ECONNRESET) || errors.Is(err, syscall.EPIPE) ||
		errors.Is(err, syscall.ETIMEDOUT) || errors.Is(err, syscall.EHOSTUNREACH) || errors.Is(err, syscall.ENETUNREACH):
		return StoreNetwork
	}
	// Not net.Error alone: every syscall.Errno (ENOSPC too) implements it.
	var (
		op   *net.OpError
		dns  *net.DNSError
		send *smithyhttp.RequestSendError
	)
	if errors.As(err, &op) || errors.As(err, &dns) || errors.As(err, &send) {
		return StoreNetwork
	}
	return StoreOther
}

func isThrottleCode(code string) bool {
	_, ok := retry.DefaultThrottleErrorCodes[code]
	return ok
}

// storeErrorCode is the API error code of err ("NoSuchBucket", "SlowDown", ...), or "".
func storeErrorCode(err error) string {
	var ae smithy.APIError
	if errors.As(err, &ae) {
		return ae.ErrorCode()
	}
	return ""
}

// storeHTTPStatus is the HTTP status of the response behind err, or 0.
func storeHTTPStatus(err error) int {
	var re *awshttp.ResponseError
	if errors.As(err, &re) {
		return re.HTTPStatusCode()
	}
	return 0
}

// StoreErrorSummary is err in a few words for /healthz, the STATUS line and doctor: the S3 error
// code and message with the HTTP status ("NoSuchBucket: The specified bucket does not exist
// (HTTP 404)") when there is one, else the error's text.
func StoreErrorSummary(err error) string {
	if err == nil {
		return ""
	}
	var ae smithy.APIError
	if errors.As(err, &ae) {
		s := ae.ErrorCode()
		if m := ae.ErrorMessage(); m != "" {
			s += ": " + m
		}
		if st := storeHTTPStatus(err); st != 0 {
			s += fmt.Sprintf(" (HTTP %d)", st)
		}
		return s
	}
	return err.Error()
}

// codeFixes say what to do about S3 error codes whose fix does not follow from their reason
// (most are "other"), given the bucket.
var codeFixes = map[string]func(bucket string) string{
	"PermanentRedirect":                  storeFixRegion,
	"AuthorizationHeaderMalformed":       storeFixRegion,
	"IllegalLocationConstraintException": storeFixRegion,
	"InvalidBucketName": func(bucket string) string {
		return fmt.Sprintf("S3 does not take %q as a bucket name (3 to 63 lowercase letters, digits, dots and hyphens): fix the bucket in store.url", bucket)
	},
	// Found from outside, each given advice on IAM or store.url before.
	"RequestTimeTooSkewed": func(string) string {
		return "this instance's clock is too far from the store's for a signed request: " + ClockFix
	},
	"NotImplemented":             storeFixUnsupported,
	"SecondLevelDomainForbidden": storeFixVirtualHost,
}

// storeFixUnsupported is the fix for a server that does not implement a request the store sends.
func storeFixUnsupported(string) string {
	return "the S3-compatible server does not implement a request spotguard needs: conditional writes (If-None-Match, If-Match) and CRC-32C checksums (x-amz-checksum-crc32c), as AWS S3 has them; upgrade the server, or use one that has them (docs/s3.md)"
}

// storeFixVirtualHost is the fix for a server that takes virtual-hosted-style requests only.
func storeFixVirtualHost(string) string {
	return "the server takes virtual-hosted-style requests only (bucket.endpoint), and with an endpoint set (AWS_ENDPOINT_URL_S3) spotguard sends path-style ones (endpoint/bucket): use an endpoint that serves path-style requests"
}

func storeFixRegion(string) string {
	return "the bucket is in another region: set AWS_REGION (or the profile's region) to the bucket's region"
}

// StoreFixKnown reports whether [StoreFix] knows what to do about err itself (its S3 error code),
// beyond what its reason says: worth saying even for the reason "other".
func StoreFixKnown(err error) bool {
	return codeFixes[storeErrorCode(err)] != nil || errors.Is(err, ErrNoConditionalWrites) || errors.Is(err, ErrNoReadAfterWrite)
}

// StoreFix says what to do about a store failure of reason (see [StoreErrorReason]) on the store
// at url; err, if not nil, refines it (missing credentials, a wrong region).
func StoreFix(reason, url string, err error) string {
	scheme, bucket, prefix, _ := checkpoint.ParseStoreURL(url)
	code := storeErrorCode(err)
	where := "arn:aws:s3:::" + bucket
	objects := where + "/*"
	if prefix != "" {
		objects = where + "/" + prefix + "/*"
	}
	if fix := codeFixes[code]; fix != nil {
		return fix(bucket)
	}
	switch {
	case errors.Is(err, ErrNoConditionalWrites),
		code == "InvalidArgument" && strings.Contains(strings.ToLower(err.Error()), "x-amz-checksum"):
		return storeFixUnsupported(bucket)
	case errors.Is(err, ErrNoReadAfterWrite):
		return "the server does not return an object just written (AWS S3 does: read-after-write consistency); spotguard reads back LATEST and manifests it wrote, so it needs that: use a server or a configuration that has it"
	}
	switch {
	case scheme == "file" && reason == StoreDenied:
		return "the agent cannot write " + prefix + ": fix its owner or permissions, or mount it read-write; under systemd, the unit's sandbox (ProtectSystem=strict) lets it write only where ReadWritePaths= says: add " +
			prefix + " there (sudo systemctl edit spotguard)"
	case scheme == "file":
		return "check that " + prefix + " is a writable directory with free space (a mounted file system: is it mounted?)"
	}
	switch reason {
	case StoreNotFound:
		switch code {
		case "", "NoSuchBucket", "NotFound":
			if name, endpoint, path := endpointPath(); path != "" {
				return fmt.Sprintf("the store's endpoint %s=%s has a path (%s), which goes before the bucket in every request: a server not served under that path takes its first part for the bucket's name; drop the path from %s, or create the bucket %s (aws s3 mb s3://%s)",
					name, endpoint, path, name, bucket, bucket)
			}
			return fmt.Sprintf("the bucket %s does not exist (or not in this account and region): create it (aws s3 mb s3://%s) or fix store.url", bucket, bucket)
		case "NoSuchKey":
			return "an object the job needs is not in the store (deleted by hand, or by a lifecycle rule?): `spotguard list --check` says which"
		default:
			return fmt.Sprintf("S3 answered 404 %s, which is not about the bucket: check the credentials (an S3-compatible server may answer so for an unknown user) and store.url", code)
		}
	case StoreDenied:
		if err != nil && (strings.Contains(err.Error(), "credentials") || strings.Contains(err.Error(), "no EC2 IMDS role")) {
			if proxyWithoutIMDS() {
				// The notices bypass the proxy; the SDK's credentials do not (found from outside).
				return "no AWS credentials: HTTPS_PROXY (or HTTP_PROXY) is set and NO_PROXY does not name 169.254.169.254, so the SDK asks IMDS for the instance profile's credentials through the proxy: add NO_PROXY=169.254.169.254 for the service"
			}
			return "no AWS credentials: attach an instance profile (IAM role) to the instance, or set AWS_PROFILE / AWS_ACCESS_KEY_ID for the service"
		}
		switch code {
		case "SignatureDoesNotMatch":
			return "S3 refused the request's signature: the secret access key does not belong to the access key id (check AWS_SECRET_ACCESS_KEY or the profile's aws_secret_access_key), or the clock is far off"
		case "InvalidAccessKeyId":
			return "S3 does not know the access key id: check AWS_ACCESS_KEY_ID or the profile's aws_access_key_id (and that the key is active), or use the instance profile"
		case "ExpiredToken", "TokenRefreshRequired", "InvalidToken":
			// Not a permission (found from outside: the fix said to grant the role S3's).
			return "S3 says the credentials have expired: new ones are fetched for the next request; if this lasts, check this instance's clock (chronyc tracking), that IMDS answers for the instance profile's credentials " +
				"(with HTTPS_PROXY set, NO_PROXY=169.254.169.254), or the session token in AWS_SESSION_TOKEN or the profile"
		}
		return fmt.Sprintf("grant the instance role s3:ListBucket on %s and s3:PutObject, s3:GetObject, s3:DeleteObject, s3:AbortMultipartUpload on %s; check the bucket policy and, with SSE-KMS, the key policy", where, objects)
	case StoreThrottled:
		return "S3 is throttling this prefix: lower store.concurrency, spread jobs over prefixes, or wait; retries go on"
	case StoreNetwork:
		if err != nil && (strings.Contains(err.Error(), "x509: certificate is valid for") || strings.Contains(err.Error(), "doesn't contain any IP SANs")) {
			// Trusted, for another name: no CA to add (found from outside).
			return "the store's certificate is for another host name than the endpoint's (x509 says which it names): give the endpoint by the name the certificate is for in AWS_ENDPOINT_URL_S3 (or AWS_ENDPOINT_URL), or get a certificate that names the host used"
		}
		if err != nil && (strings.Contains(err.Error(), "x509: ") || strings.Contains(err.Error(), "tls: failed to verify certificate")) {
			return "the store's TLS certificate is not trusted: for a private CA (an S3-compatible server, a proxy that inspects TLS), give the service its CA in SSL_CERT_FILE (or AWS_CA_BUNDLE), or add it to the system's roots (update-ca-certificates); see docs/s3.md"
		}
		if err != nil && strings.Contains(err.Error(), "server gave HTTP response to HTTPS client") {
			return "the endpoint speaks plain HTTP: use http:// in AWS_ENDPOINT_URL_S3 (or AWS_ENDPOINT_URL)"
		}
		return "the store cannot be reached: check AWS_REGION, AWS_ENDPOINT_URL_S3, the route to S3 (VPC endpoint or NAT), DNS and HTTPS_PROXY/NO_PROXY"
	case StoreChanged:
		return "another writer changed the same objects: give every training run its own store.job, and one agent per node"
	default:
		return "check store.url and the AWS settings (spotguard config; aws s3 ls " + url + ")"
	}
}

// proxyWithoutIMDS reports whether a proxy is set for the SDK's requests with NO_PROXY not
// naming IMDS's address.
func proxyWithoutIMDS() bool {
	proxy := false
	for _, k := range []string{"HTTPS_PROXY", "https_proxy", "HTTP_PROXY", "http_proxy"} {
		proxy = proxy || os.Getenv(k) != ""
	}
	if !proxy {
		return false
	}
	for _, k := range []string{"NO_PROXY", "no_proxy"} {
		for _, h := range strings.Split(os.Getenv(k), ",") {
			if h = strings.TrimSpace(h); h == "*" || h == "169.254.169.254" || h == "169.254.0.0/16" {
				return false
			}
		}
	}
	return true
}

// endpointPath returns the environment variable that sets the S3 endpoint (AWS_ENDPOINT_URL_S3,
// else AWS_ENDPOINT_URL), its value and the path in it, if it has one ("" otherwise).
func endpointPath() (name, endpoint, path string) {
	for _, name := range []string{"AWS_ENDPOINT_URL_S3", "AWS_ENDPOINT_URL"} {
		v := os.Getenv(name)
		if v == "" {
			continue
		}
		if u, err := neturl.Parse(v); err == nil && strings.Trim(u.Path, "/") != "" {
			return name, v, u.Path
		}
		return "", "", ""
	}
	return "", "", ""
}

// Probe steps, the values of StoreProbe.Step.
const (
	ProbeList   = "list"
	ProbeWrite  = "write"
	ProbeRead   = "read"
	ProbeDelete = "delete"
	// ProbeConditional is a write of the probe object with If-None-Match: *, which must be
	// refused (it exists): LATEST and a multi-node job's manifest are moved only so.
	ProbeConditional = "conditional write"
)

// ErrNoReadAfterWrite is the probe's error for a server that answered "not found" for the probe
// object it had just written.
var ErrNoReadAfterWrite = errors.New("the probe object just written is not there to read")

// ErrNoConditionalWrites is the probe's error for a server that wrote over an object that exists
// although the write asked for If-None-Match: *.
var ErrNoConditionalWrites = errors.New("the server wrote over the probe object that exists, though the write asked for If-None-Match: * (it ignores conditional writes)")

// probeStale is how old a probe object of this host must be for a later probe to delete it (one
// left behind by an agent killed in the middle of a probe).
const probeStale = 10 * time.Minute

// StoreProbe is the result of one [ProbeStore].
type StoreProbe struct {
	URL, Job string
	// Key is the probe object's key below the store's prefix: J/_spotguard/probe-<host>-<random>.
	Key string
	// At is when the probe started; Took how long it ran.
	At   time.Time
	Took time.Duration
	// Step is the step that failed (ProbeList, ProbeWrite, ProbeRead, ProbeDelete); "" when the
	// probe passed.
	Step string
	// Err is why; nil when the probe passed.
	Err error
	// Reason is StoreErrorReason(Err); "" when the probe passed.
	Reason string
	// ClockOffset is how far this instance's clock is at least from the store's, by the probe
	// object's last-modified time (S3's clock, to the second) and the local times around its
	// write: positive when this clock is behind, negative when ahead, zero within the second and
	// the write's round trip. ClockKnown is false when the probe could not tell (it failed, or the
	// listing did not show the object).
	ClockOffset time.Duration
	ClockKnown  bool
	// listed is the prefix whose list failed, when it is the job's own (J/) rather than J/_spotguard/.
	listed string
}

// OK reports whether the probe passed.
func (p StoreProbe) OK() bool { return p.Err == nil }

// Problem says what failed in one line, naming the store, the job, the step and the error
// ("store s3://b/p job J: list J/_spotguard/ failed: NoSuchBucket: ... (HTTP 404)"); "" when the
// probe passed.
func (p StoreProbe) Problem() string {
	if p.Err == nil {
		return ""
	}
	what := p.Key
	switch {
	case p.Step == ProbeList && p.listed != "":
		what = p.listed
	case p.Step == ProbeList:
		what = p.Job + "/" + checkpoint.MetaDir + "/"
	}
	return fmt.Sprintf("store %s job %s: %s %s failed: %s", p.URL, p.Job, p.Step, what, StoreErrorSummary(p.Err))
}

// ProbeStore checks that store works for job as the uploader needs it: it lists
// J/_spotguard/, J/ and one checkpoint's commits, writes a small probe object J/_spotguard/probe-<host>-<random>, reads it
// back (the same bytes), writes it again with If-None-Match: * (which must be refused), lists it (its last-modified time, the store's clock, gives ClockOffset), and
// deletes it; the first step that fails ends the probe (a probe object that
// was written is still deleted, best effort). Probe objects of host older than 10 minutes, left
// by a probe that was killed, are deleted too. host names this machine (the instance id, else the
// host name); characters outside [A-Za-z0-9._-] become '-'. ctx bounds the whole probe: the
// store's own retries go on until it ends.
func ProbeStore(ctx context.Context, store checkpoint.Store, job, host string) StoreProbe {
	host = sanitizeKeyPart(host)
	var rnd [6]byte
	crand.Read(rnd[:])
	dir := job + "/" + checkpoint.MetaDir + "/"
	name := "probe-" + host + "-"
	p := StoreProbe{URL: store.URL(), Job: job, Key: dir + name + hex.EncodeToString(rnd[:]), At: time.Now()}
	fail := func(step string, err error) StoreProbe {
		p.Step, p.Err, p.Reason, p.Took = step, err, StoreErrorReason(err), time.Since(p.At)
		return p
	}
	_, objs, err := store.ListDir(ctx, dir)
	if err != nil {
		return fail(ProbeList, err)
	}
	// The job's checkpoints too, as restore and list read them (found from outside: a policy
	// that let the agent list J/_spotguard/ alone passed the probe, and restore could not list
	// what was committed).
	dirs, _, err := store.ListDir(ctx, job+"/")
	if err != nil {
		p.listed = job + "/"
		return fail(ProbeList, err)
	}
	// And the commits of one checkpoint, as restore lists them (a policy on the checkpoints'
	// prefixes alone, found from outside too).
	for _, d := range slices.Backward(dirs) {
		if d == checkpoint.MetaDir {
			continue
		}
		if _, _, err := store.ListDir(ctx, job+"/"+d+"/"); err != nil {
			p.listed = job + "/" + d + "/"
			return fail(ProbeList, err)
		}
		break
	}
	body, _ := json.Marshal(map[string]any{"probe": "spotguard store probe; safe to delete", "host": host, "at": p.At.UTC()})
	sent := time.Now()
	if _, err := store.PutBytes(ctx, p.Key, body, checkpoint.Cond{}); err != nil {
		return fail(ProbeWrite, err)
	}
	written := time.Now()
	got, _, err := store.GetBytes(ctx, p.Key)
	if err == nil && !bytes.Equal(got, body) {
		err = fmt.Errorf("read back %d bytes that differ from the %d written", len(got), len(body))
	}
	if errors.Is(err, checkpoint.ErrNotFound) {
		err = fmt.Errorf("%w: %w", ErrNoReadAfterWrite, err) // the bucket is there: it was just listed and written
	}
	if err != nil {
		// Best effort, even when ctx ended; a probe object left behind is deleted as stale later.
		dctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), 5*time.Second)
		_ = store.Delete(dctx, p.Key)
		cancel()
		return fail(ProbeRead, err)
	}
	// Conditional writes (found from outside: a server that refused them passed the probe, and
	// no commit was ever made; one that ignores them lets two writers move LATEST back).
	if _, err := store.PutBytes(ctx, p.Key, append(body, '\n'), checkpoint.Cond{IfAbsent: true}); !errors.Is(err, checkpoint.ErrExists) {
		if err == nil {
			err = ErrNoConditionalWrites
		}
		dctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), 5*time.Second)
		_ = store.Delete(dctx, p.Key)
		cancel()
		return fail(ProbeConditional, err)
	}
	if objs, err := store.List(ctx, p.Key); err == nil {
		for _, o := range objs {
			if o.Key == p.Key && !o.LastModified.IsZero() {
				p.ClockOffset, p.ClockKnown = clockOffset(o.LastModified, sent, written), true
			}
		}
	}
	if err := store.Delete(ctx, p.Key); err != nil {
		return fail(ProbeDelete, err)
	}
	var stale []string
	for _, o := range objs {
		base := strings.TrimPrefix(o.Key, dir)
		if strings.HasPrefix(base, name) && !o.LastModified.IsZero() && p.At.Sub(o.LastModified) > probeStale {
			stale = append(stale, o.Key)
		}
	}
	if len(stale) > 0 {
		_ = store.Delete(ctx, stale...) // best effort: the next probe tries again
	}
	p.Took = time.Since(p.At)
	return p
}

// clockOffset is how far this clock is at least behind the store's (negative: ahead) for an
// object the store stamped modified (to the second, rounded down) while this clock went from
// sent to written.
func clockOffset(modified, sent, written time.Time) time.Duration {
	switch {
	case modified.After(written):
		return modified.Sub(written)
	case modified.Add(time.Second).Before(sent):
		return modified.Add(time.Second).Sub(sent)
	}
	return 0
}

// ClockFix says how to mend a clock that is off.
const ClockFix = "synchronize the clock: chronyc tracking shows its offset; on EC2 use chrony with the Amazon Time Sync Service (169.254.169.123)"

// ClockWarn is the clock offset from the store's at which the agent and doctor warn: commits
// are ordered by the clock of the instance that writes them, and a synchronized clock (chrony)
// is within milliseconds.
const ClockWarn = 5 * time.Second

// sanitizeKeyPart keeps s usable inside one key element.
func sanitizeKeyPart(s string) string {
	if s == "" {
		return "unknown"
	}
	b := []byte(s)
	for i, c := range b {
		switch {
		case c >= 'a' && c <= 'z', c >= 'A' && c <= 'Z', c >= '0' && c <= '9', c == '.', c == '_', c == '-':
		default:
			b[i] = '-'
		}
	}
	return string(b)
}

// Store probe schedule.
const (
	// storeProbeInterval is the time between probes while the store is healthy.
	storeProbeInterval = 5 * time.Minute
	// storeProbeFailingInterval is the time between probes while the last one failed, so a
	// fixed store turns healthy soon.
	storeProbeFailingInterval = 30 * time.Second
	// storeProbeMinGap is the least time between the starts of two probes when a failure
	// asks for one (Kick): a burst of failed uploads makes one probe, not a probe each.
	storeProbeMinGap = 10 * time.Second
	// storeProbeTimeout bounds one probe, the store's retries included.
	storeProbeTimeout = 20 * time.Second
)

// storeProber probes the store at start, every storeProbeInterval (storeProbeFailingInterval
// while failing; both ± 10 %) and soon after a failure elsewhere (Kick), and keeps the result for
// /healthz, /status, the metrics and the STATUS line. Check and Kick are safe for concurrent use.
type storeProber struct {
	store checkpoint.Store
	job   string
	host  func() string // the instance id once known, else the host name
	log   zerolog.Logger
	// onProbe, if not nil, is called with each result (metrics).
	onProbe func(StoreProbe)
	kick    chan struct{}

	mu           sync.Mutex
	last         StoreProbe // zero until the first probe ends
	lastOK       time.Time
	failingSince time.Time
	// recoveredAt is when a probe last passed after failing ones.
	recoveredAt time.Time
	probes      uint64
	failures    uint64
	streak      int
	limiter     *logLimiter
	clockOff    bool          // the last probe that could tell found the clock ClockWarn or more off
	clockOffset time.Duration // by how much (positive: behind), as of that probe
}

func newStoreProber(store checkpoint.Store, job string, host func() string, log zerolog.Logger) *storeProber {
	return &storeProber{
		store: store, job: job, host: host,
		log:     log.With().Str("component", "store").Logger(),
		kick:    make(chan struct{}, 1),
		limiter: newLogLimiter(time.Minute),
	}
}

// Kick asks for a probe soon (at most one every storeProbeMinGap). It never blocks.
func (p *storeProber) Kick() {
	select {
	case p.kick <- struct{}{}:
	default:
	}
}

// Run probes until ctx is done; it returns nil then.
func (p *storeProber) Run(ctx context.Context) error {
	for {
		select { // a kick from before this probe is answered by it
		case <-p.kick:
		default:
		}
		res, done := p.Check(ctx)
		if !done {
			return nil
		}
		next := storeProbeInterval
		if !res.OK() {
			next = storeProbeFailingInterval
		}
		t := time.NewTimer(probeJitter(next))
		select {
		case <-ctx.Done():
			t.Stop()
			return nil
		case <-t.C:
		case <-p.kick:
			t.Stop()
			if !sleepCtx(ctx, storeProbeMinGap-time.Since(res.At)) {
				return nil
			}
		}
	}
}

// Check is one probe (bounded by storeProbeTimeout), recorded, logged and reported to onProbe.
// done is false when ctx ended during the probe: the result is then not recorded.
func (p *storeProber) Check(ctx context.Context) (StoreProbe, bool) {
	pctx, cancel := context.WithTimeout(ctx, storeProbeTimeout)
	res := ProbeStore(pctx, p.store, p.job, p.host())
	cancel()
	if ctx.Err() != nil {
		return res, false
	}
	p.record(res)
	if p.onProbe != nil {
		p.onProbe(res)
	}
	return res, true
}

// record keeps res and logs: the first failure of a streak (Error, with the fix), a failure that
// goes on (Warn, once a minute per reason, with the count), the recovery (Info).
func (p *storeProber) record(res StoreProbe) {
	p.mu.Lock()
	p.last = res
	p.probes++
	if !res.OK() {
		p.failures++
		p.streak++
		if p.streak == 1 {
			p.failingSince = res.At
		}
	}
	// The streak that this probe continues or ends.
	streak, since := p.streak, p.failingSince
	if res.OK() {
		if streak > 0 {
			p.recoveredAt = res.At
		}
		p.streak, p.failingSince, p.lastOK = 0, time.Time{}, res.At
	}
	wasOff := p.clockOff
	if res.ClockKnown {
		p.clockOff, p.clockOffset = res.ClockOffset.Abs() >= ClockWarn, res.ClockOffset
	}
	isOff := p.clockOff
	p.mu.Unlock()

	switch {
	case res.ClockKnown && isOff && !wasOff:
		p.log.Warn().Str("store", res.URL).Float64("clock_behind_s", logSeconds(res.ClockOffset)).
			Str("fix", ClockFix).
			Msg("this instance's clock is off from the store's (negative clock_behind_s: ahead): commits are ordered by the clock of the instance that writes them")
	case res.ClockKnown && !isOff && wasOff:
		p.log.Info().Str("store", res.URL).Msg("this instance's clock agrees with the store's again")
	}

	switch {
	case res.OK() && streak > 0:
		p.log.Info().Str("store", res.URL).Int("failed_probes", streak).Float64("failing_for_s", logSeconds(res.At.Sub(since))).
			Msg("store probe passed again")
	case res.OK():
		p.log.Debug().Str("store", res.URL).Float64("took_s", logSeconds(res.Took)).Msg("store probe passed")
	default:
		key := res.Step + "|" + res.Reason + "|" + storeErrorCode(res.Err)
		ok, held := p.limiter.allow(key, time.Now())
		if !ok {
			return
		}
		ev := p.log.Warn()
		if streak == 1 {
			ev = p.log.Error()
		}
		ev.Str("store", res.URL).Str("job", res.Job).Str("step", res.Step).Str("key", res.Key).
			Str("reason", res.Reason).Err(res.Err).Int("failed_probes", streak).Int("repeats_not_logged", held).
			Str("fix", StoreFix(res.Reason, res.URL, res.Err)).Msg("store probe failed: checkpoints cannot be committed")
	}
}

// storeProbeState is a snapshot of the prober for /healthz, /status and metrics.
type storeProbeState struct {
	Last StoreProbe
	// ClockOff: the last probe that could tell found this instance's clock off from the store's
	// by ClockWarn or more, by ClockOffset (positive: behind).
	ClockOff     bool
	ClockOffset  time.Duration
	LastOK       time.Time
	FailingSince time.Time
	RecoveredAt  time.Time // when a probe last passed after failing ones
	Probes       uint64
	Failures     uint64
}

func (p *storeProber) state() storeProbeState {
	p.mu.Lock()
	defer p.mu.Unlock()
	return storeProbeState{Last: p.last, LastOK: p.lastOK, FailingSince: p.failingSince, RecoveredAt: p.recoveredAt, Probes: p.probes, Failures: p.failures,
		ClockOff: p.clockOff, ClockOffset: p.clockOffset}
}

// probeJitter returns d ± 10 %, so the agents of a cluster do not probe in step.
func probeJitter(d time.Duration) time.Duration {
	return d - d/10 + rand.N(d/5+1)
}
