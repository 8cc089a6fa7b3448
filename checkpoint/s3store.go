package checkpoint

import (
	"bytes"
	"context"
	"encoding/binary"
	"errors"
	"fmt"
	"hash/crc32"
	"io"
	"net"
	"net/http/httptrace"
	"os"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/aws/aws-sdk-go-v2/aws"
	awshttp "github.com/aws/aws-sdk-go-v2/aws/transport/http"
	"github.com/aws/aws-sdk-go-v2/service/s3"
	"github.com/aws/aws-sdk-go-v2/service/s3/types"
	"github.com/aws/smithy-go"
	"github.com/aws/smithy-go/middleware"
	"golang.org/x/sync/errgroup"
)

// S3Store is a Store in an S3 bucket under a prefix (s3://bucket/prefix); key k is the object
// prefix/k. It runs its own multipart pipeline: parts are read straight from the file with
// io.SectionReader (nothing is buffered, so memory stays small whatever the file size) and at
// most Concurrency parts are in flight across all PutFile and Download calls: fewer while the
// limiter (limiter.go) finds that more do not move more bytes, or the server throttles.
//
// Every object carries a CRC-32C that the server verifies: PutObject and each UploadPart send
// the CRC-32C of their bytes, computed locally before sending, and a multipart upload is created
// with a full-object CRC-32C (ChecksumType FULL_OBJECT), which CompleteMultipartUpload sends and
// the server checks against the parts. A server that refuses FULL_OBJECT gets composite
// checksums (a CRC-32C of the parts' CRC-32Cs) instead, from then on; PutFile still returns the
// full-object CRC-32C, combined from the parts'. A server that returns no checksum at all is
// trusted with the locally computed one.
//
// Every object it writes asks for the server-side encryption of S3Options.SSE (and KMSKeyID):
// each PutObject and CreateMultipartUpload carries it; UploadPart and CompleteMultipartUpload
// need not, as a part is encrypted as its upload says.
//
// The store remembers the multipart uploads it is running (created, not yet completed or
// aborted), so that AbortIncomplete never aborts one of them, whatever the server reports about
// their age.
type S3Store struct {
	client *s3.Client
	bucket string
	prefix string // without slashes at either end; "" for the whole bucket
	opts   S3Options
	// lim bounds the requests that move data (parts, single puts, ranged reads) in flight.
	lim   *limiter
	order atomic.Uint64 // the last transfer's number (nextOrder)
	// composite is set once the server refused a FULL_OBJECT multipart checksum.
	composite atomic.Bool

	// createMu is held shared by every CreateMultipartUpload until its upload is in running,
	// and taken exclusively by AbortIncomplete to wait for those (see ownedUploads).
	createMu sync.RWMutex
	// mu guards running.
	mu sync.Mutex
	// running holds the IDs of the multipart uploads this store created and has not yet
	// completed or aborted.
	running map[string]struct{}
	// attemptFailed, if set (OnAttemptError), is told of every failed attempt of every request.
	attemptFailed atomic.Pointer[func(error)]
	// creds is the client's credentials cache, if it has one: emptied when S3 says the
	// credentials have expired (noteAttempt).
	creds *aws.CredentialsCache
}

var _ Store = (*S3Store)(nil)

// s3MaxParts is the most parts one multipart upload may have.
const s3MaxParts = 10000

// s3AbortTimeout bounds the AbortMultipartUpload (and clean-up DeleteObject) that a failed
// PutFile sends after its context is done.
const s3AbortTimeout = 10 * time.Second

// s3CopyBuffer is the buffer each request in flight reads through (a part's checksum, a ranged
// read into the file): with store.concurrency requests in flight, that many buffers.
const s3CopyBuffer = 256 << 10

// s3DeleteBatch is the most keys one DeleteObjects request may carry.
const s3DeleteBatch = 1000

// NewS3Store returns the store in bucket under prefix (leading and trailing slashes are
// ignored), using client as it is configured (OpenStore configures retries and addressing; see
// there). It returns an error for an empty bucket, an invalid prefix and opts out of range.
func NewS3Store(client *s3.Client, bucket, prefix string, opts S3Options) (*S3Store, error) {
	if bucket == "" {
		return nil, errors.New("s3 store: empty bucket name")
	}
	prefix = strings.Trim(prefix, "/")
	if prefix != "" {
		if err := checkStoreKey(prefix); err != nil {
			return nil, fmt.Errorf("s3 store prefix: %w", err)
		}
	}
	opts, err := opts.withDefaults()
	if err != nil {
		return nil, fmt.Errorf("s3 store: %w", err)
	}
	s := &S3Store{
		bucket: bucket,
		prefix: prefix,
		opts:   opts,
		lim:    newLimiter(opts.Concurrency),
	}
	s.creds, _ = client.Options().Credentials.(*aws.CredentialsCache)
	// Every request's every attempt is seen (OnAttemptError): the SDK retries a request that
	// is never answered for minutes before the caller hears of it.
	s.client = s3.New(client.Options(), func(o *s3.Options) {
		if r, ok := o.Retryer.(aws.RetryerV2); ok {
			o.Retryer = observingRetryer{RetryerV2: r, observe: s.noteAttempt}
		}
	})
	return s, nil
}

// expiredCredentialCodes are S3's error codes for credentials that are no longer good.
var expiredCredentialCodes = map[string]bool{"ExpiredToken": true, "TokenRefreshRequired": true, "InvalidToken": true}

// OnAttemptError has f told of every failed attempt of every request, the SDK's retries
// included (not of requests the caller cancelled), as it fails: a store that stops answering is
// seen after one attempt's timeout, not after the SDK has given up. f must not block.
func (s *S3Store) OnAttemptError(f func(error)) { s.attemptFailed.Store(&f) }

func (s *S3Store) noteAttempt(err error) {
	if err == nil || errors.Is(err, context.Canceled) {
		return
	}
	var ae smithy.APIError
	if s.creds != nil && errors.As(err, &ae) && expiredCredentialCodes[ae.ErrorCode()] {
		// The cache holds them until the time they said they expire; S3 says they have
		// (an instance's clock behind, credentials revoked): the next request gets new ones
		// (found from outside: a notice's checkpoint was retried with the old ones until the
		// cache's time, while IMDS served new ones).
		s.creds.Invalidate()
	}
	if f := s.attemptFailed.Load(); f != nil {
		(*f)(err)
	}
}

// URL returns "s3://bucket/prefix", or "s3://bucket" for a store without a prefix.
func (s *S3Store) URL() string {
	if s.prefix == "" {
		return "s3://" + s.bucket
	}
	return "s3://" + s.bucket + "/" + s.prefix
}

// keyPrefix is what every object key of the store starts with: "prefix/", or "".
func (s *S3Store) keyPrefix() string {
	if s.prefix == "" {
		return ""
	}
	return s.prefix + "/"
}

// s3MaxKeyBytes is the longest object key S3 accepts, in bytes of UTF-8.
const s3MaxKeyBytes = 1024

// objectKey validates key and returns the S3 object key for it; one longer than S3 accepts fails
// with errKeyTooLong, without a request.
func (s *S3Store) objectKey(key string) (string, error) {
	if err := checkStoreKey(key); err != nil {
		return "", err
	}
	okey := s.keyPrefix() + key
	if len(okey) > s3MaxKeyBytes {
		return "", fmt.Errorf("key %q is %d bytes with the store's prefix; S3 accepts %d: %w", key, len(okey), s3MaxKeyBytes, errKeyTooLong)
	}
	return okey, nil
}

// acquire takes a slot for a request that moves data of the transfer numbered order (see
// nextOrder), at ctx's rank (withRank); it returns ctx's error if ctx is done first.
func (s *S3Store) acquire(ctx context.Context, order uint64) error {
	return s.lim.acquire(ctx, rankOf(ctx), order)
}

// nextOrder numbers a file's transfer: the parts of a lower number get the free slots first, so
// files finish one after another (see limiter.acquire).
func (s *S3Store) nextOrder() uint64 { return s.order.Add(1) }

// release gives the slot back: a request that moved n bytes since start, ok or not.
func (s *S3Store) release(n int64, start time.Time, ok bool) {
	s.lim.release(n, time.Since(start), ok)
}

// observed is the per-call option that tells the limiter of every failed attempt.
func (s *S3Store) observed(o *s3.Options) {
	if r, ok := o.Retryer.(aws.RetryerV2); ok {
		o.Retryer = observingRetryer{RetryerV2: r, observe: s.lim.observe}
	}
}

// Hurry says that time matters more than sharing the link: a notice is pending, or a restore is
// waiting. The limit of requests in flight starts higher (see limiter.hurry).
func (s *S3Store) Hurry() { s.lim.hurry() }

// Concurrency says how the store's requests in flight have adapted.
func (s *S3Store) Concurrency() LimiterStats { return s.lim.Stats() }

// s3Part is one part of a multipart upload, or one ranged read of a download.
type s3Part struct {
	num int32 // from 1
	off int64
	n   int64
}

// Part sizes: a file is cut into at least s3TargetParts parts, so that even a modest one can have
// many requests in flight (a connection to S3 carries 80–90 MB/s), of at least s3SmallPart (fewer
// requests, each with its own first-byte latency and its own PUT charge) and at most
// S3Options.PartSize: a 256 MiB shard goes in 16 parts of 16 MiB, a 16 GiB one in 256 of 64 MiB.
//
// A file a notice waits for while nothing else is being sent (withUrgency; the uploader says
// when) is cut into as many parts as the limiter lets run at once, if that is more, of at least
// s3MinPart (S3's least): its parts all run at once, and the time from its close to the commit
// is one part's, the shorter the part. (On the scaled model of S3, where a connection carries
// about 11 MB/s, a 128 MiB shard took 0.95 s in 8 MiB parts, 0.65 s in 5 MiB parts, and the
// commit came 0.73-0.75 s after the trainer's marker rather than 0.94-0.98 s.)
const (
	s3TargetParts = 16
	s3SmallPart   = 8 << 20
	s3MinPart     = 5 << 20
)

// partSize is the part size (and the size of one ranged read) for an object of size bytes; an
// object no larger goes in one request. urgent: a notice waits for it (see above).
func (s *S3Store) partSize(size int64, urgent bool) int64 {
	target, least := int64(s3TargetParts), int64(s3SmallPart)
	if urgent && s.lim != nil {
		if l := int64(s.lim.Stats().Limit); l > target {
			target, least = l, s3MinPart
		}
	}
	p := (size/target + 1<<20 - 1) &^ (1<<20 - 1) // whole MiB
	return min(max(p, min(least, s.opts.PartSize)), s.opts.PartSize)
}

// s3PartPlan splits size bytes into parts of partSize bytes (the last may be shorter), raising
// partSize to a multiple of 1 MiB if that would take more than s3MaxParts parts. An empty
// object has no parts.
func s3PartPlan(size, partSize int64) []s3Part {
	return s3PartPlanFrom(0, size, partSize, 1)
}

// s3PartPlanFrom is s3PartPlan for the bytes from off to end, numbered from first: partSize is
// raised so that the parts end at number s3MaxParts at most.
func s3PartPlanFrom(off, end, partSize int64, first int32) []s3Part {
	left := int64(s3MaxParts) - int64(first) + 1
	if least := (end - off + left - 1) / left; partSize < least {
		partSize = (least + 1<<20 - 1) &^ (1<<20 - 1)
	}
	var parts []s3Part
	for ; off < end; off += partSize {
		parts = append(parts, s3Part{num: first + int32(len(parts)), off: off, n: min(partSize, end-off)})
	}
	return parts
}

// s3Body is a request body over a section of a file. It is seekable, so the SDK can sign it
// and re-send it on a retry, and reports progress only for bytes beyond the furthest point read
// so far, so that a re-send is not counted twice. The SDK may read it from the HTTP transport's
// goroutine while rewinding it for the next attempt, hence the mutex.
type s3Body struct {
	mu       sync.Mutex
	r        *io.SectionReader
	high     int64
	progress func(int64)
	stall    *stallWatch // nil: none
}

func newS3Body(f *os.File, off, n int64, progress func(int64), stall *stallWatch) *s3Body {
	return &s3Body{r: io.NewSectionReader(f, off, n), progress: progress, stall: stall}
}

func (b *s3Body) Read(p []byte) (int, error) {
	n, end, err := b.read(p)
	if end {
		// Not under mu: the request may be rewound (Seek) meanwhile, as it is cut.
		b.stall.drain()
		b.stall.idle() // all sent: the wait for the answer is s3ResponseHeaderTimeout's
	}
	return n, err
}

// read is Read but for what it does at the body's end (end: the end is said now).
func (b *s3Body) read(p []byte) (n int, end bool, err error) {
	b.mu.Lock()
	defer b.mu.Unlock()
	n, err = b.r.Read(p)
	pos, _ := b.r.Seek(0, io.SeekCurrent)
	if b.progress != nil && n > 0 && pos > b.high {
		b.progress(pos - b.high)
		b.high = pos
	}
	if b.stall != nil {
		if pos < b.r.Size() {
			b.stall.moved()
		} else if n == 0 && errors.Is(err, io.EOF) {
			return n, true, err
		} else {
			b.stall.idle()
		}
	}
	return n, false, err
}

// errStalled is the cause of a request cut because its body stopped moving.
var errStalled = errors.New("no byte moved for 30 s: the connection stalled")

// errStraggling is the cause of a part upload cut because it took far longer than the other
// parts of its file: a connection that still moves, but trickles. It is a stall, as far as
// trying again goes.
var errStraggling = fmt.Errorf("the part took far longer than the others of its file: %w", errStalled)

// partPace is how long the parts of one multipart upload took. A part that takes more than
// s3StragglerFactor times their median plus s3StragglerSlack, once two are done, is cut and sent
// again on another connection: a connection that trickles (one route of many that is congested,
// a server that reads one request slowly) is no stall, and held a notice's checkpoint for 100 s
// (found from outside).
type partPace struct {
	factor        int
	slack, period time.Duration

	mu   sync.Mutex
	took []time.Duration
}

// newPartPace returns a partPace with the straggler settings as they are now.
func newPartPace() *partPace {
	return &partPace{factor: s3StragglerFactor, slack: s3StragglerSlack, period: s3StragglerCheckPeriod}
}

// Straggling parts (partPace). Variables for tests.
var (
	s3StragglerFactor      = 4
	s3StragglerSlack       = 5 * time.Second
	s3StragglerCheckPeriod = time.Second
)

// done records a part that took d.
func (p *partPace) done(d time.Duration) {
	p.mu.Lock()
	defer p.mu.Unlock()
	p.took = append(p.took, d)
}

// limit is how long a part may take now; 0 while fewer than two parts are done.
func (p *partPace) limit() time.Duration {
	p.mu.Lock()
	defer p.mu.Unlock()
	if len(p.took) < 2 {
		return 0
	}
	sorted := slices.Clone(p.took)
	slices.Sort(sorted)
	return time.Duration(p.factor)*sorted[len(sorted)/2] + p.slack
}

// watch cuts the request w watches, with errStraggling, once it has run for longer than limit
// since began; the function it returns ends the watch.
func (p *partPace) watch(w *stallWatch, began time.Time) func() {
	quit := make(chan struct{})
	go func() {
		t := time.NewTicker(p.period)
		defer t.Stop()
		for {
			select {
			case <-quit:
				return
			case <-t.C:
				if l := p.limit(); l > 0 && time.Since(began) > l {
					w.cut(errStraggling)
					return
				}
			}
		}
	}()
	return func() { close(quit) }
}

// s3StallTimeout is how long a request body may go unread, or a response body bring nothing,
// before the request is cut and tried again: a connection whose peer stopped reading or sending
// (a route that drops packets) would otherwise hold its part until the kernel gives up, minutes
// later. A variable for tests.
var s3StallTimeout = 30 * time.Second

// s3StallAttempts is how often a part whose connection stalled is sent or read in all.
const s3StallAttempts = 3

// stallWatch cancels its request's context, with errStalled, when its body has not moved for
// s3StallTimeout.
type stallWatch struct {
	timer  *time.Timer
	d      time.Duration
	ctx    context.Context
	cancel context.CancelCauseFunc

	mu   sync.Mutex
	conn net.Conn // the connection the request is being written to (GotConn), if known
}

// cut cancels the request now, with cause.
func (w *stallWatch) cut(cause error) { w.cancel(cause) }

// watchStall returns ctx for one request, cancelled with errStalled once the body has not moved
// for s3StallTimeout (armed now, unless idle is called), and the function that ends the watch.
// The context also tells the watch which connection the request is written to (drain).
func watchStall(ctx context.Context) (context.Context, *stallWatch, func()) {
	ctx, cancel := context.WithCancelCause(ctx)
	w := &stallWatch{d: s3StallTimeout, cancel: cancel}
	w.timer = time.AfterFunc(w.d, func() { cancel(errStalled) })
	ctx = httptrace.WithClientTrace(ctx, &httptrace.ClientTrace{GotConn: func(i httptrace.GotConnInfo) { w.setConn(i.Conn) }})
	w.ctx = ctx
	return ctx, w, func() { w.timer.Stop(); cancel(nil) }
}

// setConn records the connection the request is written to (nil: none yet).
func (w *stallWatch) setConn(c net.Conn) {
	w.mu.Lock()
	defer w.mu.Unlock()
	w.conn = c
}

// s3DrainPoll is how often, at most, drain looks at what the peer has not acknowledged yet: at
// first every millisecond, then less often (twice the time each time), so that on a fast
// connection the body's end is said within a few milliseconds of its last byte's
// acknowledgement. (The transport reuses a connection only if the request's write ends within
// 50 ms of its answer.)
const s3DrainPoll = 100 * time.Millisecond

// drain returns once the peer has acknowledged every byte of the body written to the request's
// connection (or that cannot be told, or the request is cut), the watch re-armed at every byte
// acknowledged. The HTTP transport starts s3ResponseHeaderTimeout once the body is handed to the
// kernel, which can hold megabytes of it (the socket's buffers): on a connection slower than
// those megabytes in 20 s (a slow route, a server that reads slowly), every attempt was cut
// while its bytes still moved, and sent again from its start, for good (found from outside).
// Called at the body's end, before it says so.
func (w *stallWatch) drain() {
	w.mu.Lock()
	c := w.conn
	w.mu.Unlock()
	if c == nil {
		return // not being written to a connection: read for its hash
	}
	last, wait := -1, time.Millisecond
	t := time.NewTimer(wait)
	defer t.Stop()
	for {
		n, ok := unsentBytes(c)
		if !ok || n == 0 {
			return
		}
		if last < 0 || n < last {
			w.moved()
		}
		last = n
		t.Reset(wait)
		select {
		case <-w.ctx.Done():
			return
		case <-t.C:
		}
		wait = min(2*wait, s3DrainPoll)
	}
}

// moved re-arms the watch: the body moved.
func (w *stallWatch) moved() { w.timer.Reset(w.d) }

// idle stops the watch until the body moves again.
func (w *stallWatch) idle() { w.timer.Stop() }

// stalled returns err, marked as a stall (errors.Is errStalled) when ctx was cut for one.
func stalled(ctx context.Context, err error) error {
	if cause := context.Cause(ctx); err != nil && errors.Is(cause, errStalled) {
		return fmt.Errorf("%w (%w)", cause, err)
	}
	return err
}

func (b *s3Body) Seek(offset int64, whence int) (int64, error) {
	b.mu.Lock()
	defer b.mu.Unlock()
	if b.stall != nil {
		b.stall.setConn(nil) // read again: for a hash, or for the next attempt's connection
	}
	return b.r.Seek(offset, whence)
}

// s3SectionCRC returns the CRC-32C of n bytes of f at off, or an error if f is shorter, a read
// fails, or ctx is done first.
func s3SectionCRC(ctx context.Context, f *os.File, off, n int64) (uint32, error) {
	h := NewCRC32C()
	got, err := io.CopyBuffer(h, fileCtxReader{ctx: ctx, r: io.NewSectionReader(f, off, n)}, make([]byte, s3CopyBuffer))
	if err != nil {
		return 0, err
	}
	if got != n {
		return 0, fmt.Errorf("%s has %d bytes at %d; want %d", f.Name(), got, off, n)
	}
	return h.Sum32(), nil
}

// s3CRC32CValue is the base64 form of a CRC-32C, as S3 sends it.
func s3CRC32CValue(sum uint32) string { return CRC32CChecksum(sum).Value }

// s3CRC32CMulMod returns a(x)·b(x) modulo the CRC-32C polynomial (bit-reflected, as in zlib's
// multmodp).
func s3CRC32CMulMod(a, b uint32) uint32 {
	const poly = 0x82f63b78 // Castagnoli, reflected
	var p uint32
	for m := uint32(1) << 31; m != 0; m >>= 1 {
		if a&m != 0 {
			p ^= b
		}
		if b&1 != 0 {
			b = b>>1 ^ poly
		} else {
			b >>= 1
		}
	}
	return p
}

// s3CRC32CCombine returns the CRC-32C of A followed by B from crcA, crcB and B's length.
func s3CRC32CCombine(crcA, crcB uint32, lenB int64) uint32 {
	// Multiply crcA by x^(8·lenB): square x^8 for each bit of lenB.
	xpow := uint32(1) << 31 // x^0
	sq := uint32(1) << 23   // x^8
	for n := lenB; n > 0; n >>= 1 {
		if n&1 != 0 {
			xpow = s3CRC32CMulMod(sq, xpow)
		}
		sq = s3CRC32CMulMod(sq, sq)
	}
	return s3CRC32CMulMod(xpow, crcA) ^ crcB
}

// s3ErrorCode returns the S3 error code of err ("NoSuchKey", "SlowDown", …), or "".
func s3ErrorCode(err error) string {
	var ae smithy.APIError
	if errors.As(err, &ae) {
		return ae.ErrorCode()
	}
	return ""
}

// s3HTTPStatus returns the HTTP status of the response that caused err, or 0.
func s3HTTPStatus(err error) int {
	var re *awshttp.ResponseError
	if errors.As(err, &re) {
		return re.HTTPStatusCode()
	}
	return 0
}

// s3IsNotFound reports whether err says the object does not exist (not that the bucket or an
// upload does not).
func s3IsNotFound(err error) bool {
	switch s3ErrorCode(err) {
	case "NoSuchKey", "NotFound":
		return true
	case "NoSuchBucket", "NoSuchUpload":
		return false
	}
	return s3HTTPStatus(err) == 404
}

// s3IsPreconditionFailed reports whether err says a conditional write lost: 412
// PreconditionFailed, or 409 ConditionalRequestConflict (another conditional write to the key is
// in progress).
func s3IsPreconditionFailed(err error) bool {
	switch s3ErrorCode(err) {
	case "PreconditionFailed", "ConditionalRequestConflict":
		return true
	}
	return s3HTTPStatus(err) == 412
}

// s3IsUnsupported reports whether err says the server does not implement a request or one of
// its options, as opposed to a transient or access problem.
func s3IsUnsupported(err error) bool {
	switch s3ErrorCode(err) {
	case "NotImplemented", "InvalidRequest", "InvalidArgument", "MethodNotAllowed":
		return true
	}
	switch s3HTTPStatus(err) {
	case 501, 405:
		return true
	}
	return false
}

// PutFile uploads the first size bytes of f to key and returns its full-object CRC-32C (see
// S3Store). A file of at most PartSize bytes goes in one PutObject, a larger one in a multipart
// upload with parts in parallel. The SDK retries each request (503 SlowDown, 5xx, connection
// resets, re-reading the part from f) until ctx is done. It returns an error for an invalid key,
// a file shorter than size, a checksum the server disagrees with, and any request that fails
// for good or is cut short by ctx; then a multipart upload it created has been aborted (on a
// context that outlives ctx by up to 10 s) and any object it completed with a wrong checksum
// deleted. An object at key from before is replaced only on success (a single PutObject cut
// short after the server stored it may still have replaced it, with the correct bytes).
//
// progress counts bytes as the request bodies are read, each byte once however often a part is
// re-sent. Over HTTPS that is as they are sent; over plain HTTP the SDK reads each body once
// to sign its SHA-256 before sending it, so progress runs a part ahead there.
func (s *S3Store) PutFile(ctx context.Context, key string, f *os.File, size int64, progress func(n int64)) (Checksum, error) {
	okey, err := s.objectKey(key)
	if err != nil {
		return Checksum{}, fmt.Errorf("put %s: %w", key, err)
	}
	if size < 0 {
		return Checksum{}, fmt.Errorf("put %s: negative size %d", key, size)
	}
	var sum Checksum
	if size <= s.partSize(size, false) { // one request; one of at most 8 MiB, urgent or not
		sum, err = s.putSingle(ctx, okey, f, size, progress)
	} else {
		sum, err = s.putMultipart(ctx, okey, f, size, progress)
	}
	if err != nil {
		if s3ErrorCode(err) == "KeyTooLongError" { // a server whose limit is lower than S3's
			err = fmt.Errorf("%w: %w", err, errKeyTooLong)
		}
		return Checksum{}, fmt.Errorf("put %s: %w", s.URL()+"/"+key, err)
	}
	return sum, nil
}

// sse returns the server-side encryption headers of every write that creates an object:
// nothing without S3Options.SSE, else its algorithm and, for aws:kms, the KMS key if one is set.
func (s *S3Store) sse() (types.ServerSideEncryption, *string) {
	if s.opts.SSE == SSENone {
		return "", nil
	}
	var key *string
	if s.opts.SSE == SSEKMS && s.opts.KMSKeyID != "" {
		key = aws.String(s.opts.KMSKeyID)
	}
	return types.ServerSideEncryption(s.opts.SSE), key
}

// putSingle sends f with one PutObject.
func (s *S3Store) putSingle(ctx context.Context, okey string, f *os.File, size int64, progress func(int64)) (Checksum, error) {
	if err := s.acquire(ctx, s.nextOrder()); err != nil {
		return Checksum{}, err
	}
	var start time.Time
	ok := false
	defer func() { s.release(size, start, ok) }()
	crc, err := s3SectionCRC(ctx, f, 0, size)
	if err != nil {
		return Checksum{}, err
	}
	start = time.Now() // the request's time, not the checksum's
	want := s3CRC32CValue(crc)
	rctx, stall, unwatch := watchStall(ctx)
	defer unwatch()
	in := &s3.PutObjectInput{
		Bucket:            &s.bucket,
		Key:               &okey,
		Body:              newS3Body(f, 0, size, progress, stall),
		ContentLength:     aws.Int64(size),
		ChecksumAlgorithm: types.ChecksumAlgorithmCrc32c,
		ChecksumCRC32C:    &want,
	}
	in.ServerSideEncryption, in.SSEKMSKeyId = s.sse()
	out, err := s.client.PutObject(rctx, in, s.observed)
	if err != nil {
		return Checksum{}, stalled(rctx, err)
	}
	ok = true
	if got := aws.ToString(out.ChecksumCRC32C); got != "" && got != want {
		err := fmt.Errorf("server stored CRC-32C %s; sent %s", got, want)
		return Checksum{}, errors.Join(err, s.cleanUpObject(ctx, okey))
	}
	return CRC32CChecksum(crc), nil
}

// putMultipart sends f as a multipart upload.
func (s *S3Store) putMultipart(ctx context.Context, okey string, f *os.File, size int64, progress func(int64)) (Checksum, error) {
	uploadID, fullObject, err := s.createUpload(ctx, okey)
	if err != nil {
		return Checksum{}, err
	}
	// After the completion or the abort below: an upload that could not be aborted is no
	// longer running, so a later AbortIncomplete may abort it.
	defer s.setRunning(aws.ToString(uploadID), false)

	parts := s3PartPlan(size, s.partSize(size, urgentOf(ctx)))
	completed := make([]types.CompletedPart, len(parts))
	crcs := make([]uint32, len(parts))
	err = s.uploadParts(ctx, okey, uploadID, f, parts, completed, crcs, progress)
	full := s3FullCRC(parts, crcs)
	if err == nil {
		err = s.complete(ctx, okey, uploadID, size, completed, crcs, full, fullObject)
	}
	if err != nil {
		if aerr := s.abortUpload(ctx, okey, uploadID); aerr != nil {
			err = errors.Join(err, aerr)
		}
		return Checksum{}, err
	}
	return CRC32CChecksum(full), nil
}

// s3FullCRC is the full-object CRC-32C of an object made of parts, whose CRC-32Cs are crcs.
func s3FullCRC(parts []s3Part, crcs []uint32) uint32 {
	var full uint32
	for i, p := range parts {
		full = s3CRC32CCombine(full, crcs[i], p.n)
	}
	return full
}

// createUpload creates a multipart upload of okey, with a FULL_OBJECT checksum unless the server
// refused one (fullObject says which), and enters it in the running set: the caller removes it
// (setRunning) once the upload is completed or aborted.
func (s *S3Store) createUpload(ctx context.Context, okey string) (uploadID *string, fullObject bool, err error) {
	fullObject = !s.composite.Load()
	create := &s3.CreateMultipartUploadInput{
		Bucket:            &s.bucket,
		Key:               &okey,
		ChecksumAlgorithm: types.ChecksumAlgorithmCrc32c,
	}
	if fullObject {
		create.ChecksumType = types.ChecksumTypeFullObject
	}
	create.ServerSideEncryption, create.SSEKMSKeyId = s.sse()
	s.createMu.RLock()
	created, err := s.client.CreateMultipartUpload(ctx, create)
	if err != nil && fullObject && s3IsUnsupported(err) {
		// Refused for the FULL_OBJECT checksum, or for something else (the encryption it asks
		// for, say): only a retry without it that succeeds tells, and only that turns the store
		// to composite checksums.
		create.ChecksumType = ""
		if created, err = s.client.CreateMultipartUpload(ctx, create); err == nil {
			s.composite.Store(true)
			fullObject = false
		}
	}
	if err == nil {
		s.setRunning(aws.ToString(created.UploadId), true)
	}
	s.createMu.RUnlock()
	if err != nil {
		return nil, false, fmt.Errorf("create multipart upload: %w", err)
	}
	return created.UploadId, fullObject, nil
}

// setRunning adds the upload id to the running set, or removes it.
func (s *S3Store) setRunning(id string, running bool) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.running == nil {
		s.running = map[string]struct{}{}
	}
	if running {
		s.running[id] = struct{}{}
	} else {
		delete(s.running, id)
	}
}

// ownedUploads returns which of the upload IDs ids this store is running. It first waits for
// every CreateMultipartUpload in flight to enter its upload in the running set, so an upload the
// server listed before the call is either in the set by then or not this store's.
func (s *S3Store) ownedUploads(ids []string) map[string]bool {
	s.createMu.Lock()
	defer s.createMu.Unlock()
	s.mu.Lock()
	defer s.mu.Unlock()
	owned := map[string]bool{}
	for _, id := range ids {
		if _, ok := s.running[id]; ok {
			owned[id] = true
		}
	}
	return owned
}

// uploadParts uploads parts in parallel, filling completed and crcs; it returns the first error.
func (s *S3Store) uploadParts(ctx context.Context, okey string, uploadID *string, f *os.File, parts []s3Part, completed []types.CompletedPart, crcs []uint32, progress func(int64)) error {
	g, gctx := errgroup.WithContext(ctx)
	order := s.nextOrder()
	pace := newPartPace()
	for i, p := range parts {
		if s.acquire(gctx, order) != nil {
			break
		}
		g.Go(func() error {
			var err error
			crcs[i], completed[i], err = s.uploadPart(gctx, okey, uploadID, f, p, pace, progress)
			return err
		})
	}
	if err := g.Wait(); err != nil {
		return err
	}
	return ctx.Err() // set if acquire stopped the loop
}

// uploadPart uploads part p of f, for which a slot was acquired, and releases the slot. It
// returns the part's CRC-32C and what completes it; pace is shared by the parts of one file.
func (s *S3Store) uploadPart(ctx context.Context, okey string, uploadID *string, f *os.File, p s3Part, pace *partPace, progress func(int64)) (uint32, types.CompletedPart, error) {
	var start time.Time
	ok := false
	defer func() { s.release(p.n, start, ok) }()
	crc, err := s3SectionCRC(ctx, f, p.off, p.n)
	if err != nil {
		return 0, types.CompletedPart{}, fmt.Errorf("part %d: %w", p.num, err)
	}
	want := s3CRC32CValue(crc)
	start = time.Now()
	var out *s3.UploadPartOutput
	for attempt := 1; ; attempt++ {
		rctx, stall, unwatch := watchStall(ctx)
		began := time.Now()
		unpace := pace.watch(stall, began)
		out, err = s.client.UploadPart(rctx, &s3.UploadPartInput{
			Bucket:            &s.bucket,
			Key:               &okey,
			UploadId:          uploadID,
			PartNumber:        aws.Int32(p.num),
			Body:              newS3Body(f, p.off, p.n, progress, stall),
			ContentLength:     aws.Int64(p.n),
			ChecksumAlgorithm: types.ChecksumAlgorithmCrc32c,
			ChecksumCRC32C:    &want,
		}, s.observed)
		unpace()
		err = stalled(rctx, err)
		unwatch()
		if err == nil {
			pace.done(time.Since(began))
		}
		if !errors.Is(err, errStalled) || attempt == s3StallAttempts || ctx.Err() != nil {
			break
		}
		s.lim.observe(err) // the SDK's retryer never saw it
	}
	if err != nil {
		return 0, types.CompletedPart{}, fmt.Errorf("upload part %d: %w", p.num, err)
	}
	ok = true
	if got := aws.ToString(out.ChecksumCRC32C); got != "" && got != want {
		return 0, types.CompletedPart{}, fmt.Errorf("upload part %d: server stored CRC-32C %s; sent %s", p.num, got, want)
	}
	return crc, types.CompletedPart{ETag: out.ETag, PartNumber: aws.Int32(p.num), ChecksumCRC32C: &want}, nil
}

// s3CompositeValue is the composite CRC-32C of a multipart object: the CRC-32C of the parts'
// CRC-32Cs, "-" and the number of parts.
func s3CompositeValue(crcs []uint32) string {
	h := NewCRC32C()
	for _, c := range crcs {
		_ = binary.Write(h, binary.BigEndian, c)
	}
	return fmt.Sprintf("%s-%d", s3CRC32CValue(h.Sum32()), len(crcs))
}

// complete completes the upload and checks the checksum the server reports.
func (s *S3Store) complete(ctx context.Context, okey string, uploadID *string, size int64, completed []types.CompletedPart, crcs []uint32, full uint32, fullObject bool) error {
	in := &s3.CompleteMultipartUploadInput{
		Bucket:          &s.bucket,
		Key:             &okey,
		UploadId:        uploadID,
		MultipartUpload: &types.CompletedMultipartUpload{Parts: completed},
		MpuObjectSize:   aws.Int64(size),
	}
	composite := s3CompositeValue(crcs)
	want := composite
	if fullObject {
		want = s3CRC32CValue(full)
		in.ChecksumType = types.ChecksumTypeFullObject
		in.ChecksumCRC32C = &want
	}
	// matches says whether the server's checksum of the object is the one it should be. A server
	// that takes FULL_OBJECT without a word and computes the composite (older S3-compatible
	// ones) checked every part's CRC-32C just as well: its composite of them is as good, and the
	// store sends composite checksums from then on (found from outside: every multipart file was
	// deleted as corrupt and sent again, for ever).
	matches := func(got string) bool {
		if fullObject && got == composite {
			s.composite.Store(true)
			return true
		}
		return got == want
	}
	out, err := s.client.CompleteMultipartUpload(ctx, in)
	var got string
	switch {
	case err == nil:
		got = aws.ToString(out.ChecksumCRC32C)
	case s3ErrorCode(err) == "NoSuchUpload":
		// A retry after a completion whose response was lost: the object may be there.
		head, herr := s.client.HeadObject(ctx, &s3.HeadObjectInput{Bucket: &s.bucket, Key: &okey, ChecksumMode: types.ChecksumModeEnabled})
		if herr != nil || aws.ToInt64(head.ContentLength) != size || !matches(aws.ToString(head.ChecksumCRC32C)) {
			return fmt.Errorf("complete multipart upload: %w", err)
		}
		return nil
	default:
		return fmt.Errorf("complete multipart upload: %w", err)
	}
	if got != "" && !matches(got) {
		err := fmt.Errorf("complete multipart upload: server computed CRC-32C %s; want %s", got, want)
		return errors.Join(err, s.cleanUpObject(ctx, okey))
	}
	return nil
}

// cleanupContext returns a context for clean-up after ctx is done: not cancelled with it, and
// bounded by s3AbortTimeout.
func s3CleanupContext(ctx context.Context) (context.Context, context.CancelFunc) {
	return context.WithTimeout(context.WithoutCancel(ctx), s3AbortTimeout)
}

// abortUpload aborts a multipart upload on a clean-up context. An upload that is already gone
// is not an error.
func (s *S3Store) abortUpload(ctx context.Context, okey string, uploadID *string) error {
	actx, cancel := s3CleanupContext(ctx)
	defer cancel()
	_, err := s.client.AbortMultipartUpload(actx, &s3.AbortMultipartUploadInput{Bucket: &s.bucket, Key: &okey, UploadId: uploadID})
	if err != nil && s3ErrorCode(err) != "NoSuchUpload" {
		return fmt.Errorf("abort multipart upload %s: %w", aws.ToString(uploadID), err)
	}
	return nil
}

// cleanUpObject deletes an object that was written with a wrong checksum, on a clean-up context.
func (s *S3Store) cleanUpObject(ctx context.Context, okey string) error {
	dctx, cancel := s3CleanupContext(ctx)
	defer cancel()
	if _, err := s.client.DeleteObject(dctx, &s3.DeleteObjectInput{Bucket: &s.bucket, Key: &okey}); err != nil {
		return fmt.Errorf("delete corrupt object: %w", err)
	}
	return nil
}

// PutBytes writes data to key with one PutObject carrying its CRC-32C, and returns the ETag the
// server answered with, verbatim ("" if it sent none). cond.IfAbsent sends If-None-Match: *,
// cond.IfMatch sends If-Match with that ETag. It returns:
//   - the ETag, nil: the server stored data at key;
//   - "", an error wrapping ErrExists: cond.IfAbsent and the server answered 412
//     PreconditionFailed or 409 ConditionalRequestConflict (another conditional write to the key
//     was in progress); the object is unchanged;
//   - "", an error wrapping ErrPrecondition: cond.IfMatch and the server answered 412, 409, or
//     404 NoSuchKey (the object is gone); the store is unchanged;
//   - "", another error: an invalid key or Cond, or a request that failed for good or was cut
//     short by ctx.
//
// The SDK retries a request whose answer it did not get, so an attempt may have been applied
// although its answer was lost, and the retry then fails its condition against that attempt's
// own result. So when a retried conditional write fails its condition, PutBytes reads the
// object: if it holds exactly data, the write is taken as this call's and PutBytes returns the
// object's ETag and nil. (A writer that stored the very same bytes at the same moment cannot be
// told apart; either way the store holds what this call meant to write.)
func (s *S3Store) PutBytes(ctx context.Context, key string, data []byte, cond Cond) (string, error) {
	okey, err := s.objectKey(key)
	if err == nil {
		err = cond.check()
	}
	if err != nil {
		return "", fmt.Errorf("put %s: %w", key, err)
	}
	crc := s3CRC32CValue(crc32.Checksum(data, castagnoli))
	in := &s3.PutObjectInput{
		Bucket:            &s.bucket,
		Key:               &okey,
		Body:              bytes.NewReader(data),
		ContentLength:     aws.Int64(int64(len(data))),
		ChecksumAlgorithm: types.ChecksumAlgorithmCrc32c,
		ChecksumCRC32C:    &crc,
	}
	in.ServerSideEncryption, in.SSEKMSKeyId = s.sse()
	switch {
	case cond.IfAbsent:
		in.IfNoneMatch = aws.String("*")
	case cond.IfMatch != "":
		in.IfMatch = aws.String(cond.IfMatch)
	}
	var attempts atomic.Int32
	out, err := s.client.PutObject(ctx, in, s3CountAttempts(&attempts))
	if err != nil && attempts.Load() > 1 && (cond.IfAbsent || cond.IfMatch != "") &&
		(s3IsPreconditionFailed(err) || s3IsNotFound(err)) {
		if etag, ok := s.holds(ctx, okey, data); ok {
			return etag, nil
		}
	}
	switch {
	case err == nil:
		return aws.ToString(out.ETag), nil
	case cond.IfAbsent && s3IsPreconditionFailed(err):
		return "", fmt.Errorf("put %s: %w: %w", s.URL()+"/"+key, ErrExists, err)
	case cond.IfMatch != "" && (s3IsPreconditionFailed(err) || s3IsNotFound(err)):
		return "", fmt.Errorf("put %s: if-match %s: %w: %w", s.URL()+"/"+key, cond.IfMatch, ErrPrecondition, err)
	}
	return "", fmt.Errorf("put %s: %w", s.URL()+"/"+key, err)
}

// s3CountAttempts returns an option that counts the attempts of one operation (the first and
// every retry) in n.
func s3CountAttempts(n *atomic.Int32) func(*s3.Options) {
	return s3.WithAPIOptions(func(stack *middleware.Stack) error {
		// The deserialize step runs once per attempt, below the retry middleware.
		return stack.Deserialize.Add(middleware.DeserializeMiddlewareFunc("spotguardCountAttempts",
			func(ctx context.Context, in middleware.DeserializeInput, next middleware.DeserializeHandler) (middleware.DeserializeOutput, middleware.Metadata, error) {
				n.Add(1)
				return next.HandleDeserialize(ctx, in)
			}), middleware.After)
	})
}

// holds reports whether the object okey exists and holds exactly data, and returns its ETag.
// Any error reading it counts as no.
func (s *S3Store) holds(ctx context.Context, okey string, data []byte) (string, bool) {
	out, err := s.client.GetObject(ctx, &s3.GetObjectInput{Bucket: &s.bucket, Key: &okey})
	if err != nil {
		return "", false
	}
	defer out.Body.Close()
	got, err := io.ReadAll(io.LimitReader(out.Body, int64(len(data))+1))
	if err != nil || !bytes.Equal(got, data) {
		return "", false
	}
	return aws.ToString(out.ETag), true
}

// GetBytes returns the object at key and its ETag as the server sent it ("" if it sent none).
// It returns ErrNotFound if there is none, and an error for an invalid key and a request that
// fails for good or is cut short by ctx. A body that does not match its checksum, breaks off, or
// brings nothing for s3StallTimeout is read again.
func (s *S3Store) GetBytes(ctx context.Context, key string) ([]byte, string, error) {
	okey, err := s.objectKey(key)
	if err != nil {
		return nil, "", fmt.Errorf("get %s: %w", key, err)
	}
	for try := 1; ; try++ {
		data, etag, again, err := s.getBytes(ctx, key, okey)
		// A body whose checksum is not the one its headers give: a server answering while the
		// object is written over (LATEST, by another agent of the job; versitygw does, found in
		// CI and from outside), or the bytes damaged on the way. A body that broke off, or
		// stalled after its headers (found from outside: a LATEST read whose body never came
		// held every later commit, and restore and list, for as long as the server kept the
		// connection). Read it again.
		if err == nil || !again || try == s3GetBytesTries || ctx.Err() != nil {
			return data, etag, err
		}
	}
}

// s3GetBytesTries is how often GetBytes reads an object whose body does not match its checksum,
// breaks off or stalls.
const s3GetBytesTries = 3

// getBytes is one GetObject of GetBytes, of the object okey (key to the caller). again is true
// for a body that does not match its checksum, broke off or stalled: worth reading again.
func (s *S3Store) getBytes(ctx context.Context, key, okey string) (data []byte, etag string, again bool, err error) {
	out, err := s.client.GetObject(ctx, &s3.GetObjectInput{Bucket: &s.bucket, Key: &okey})
	if err != nil {
		if s3IsNotFound(err) {
			return nil, "", false, fmt.Errorf("get %s: %w", s.URL()+"/"+key, ErrNotFound)
		}
		return nil, "", false, fmt.Errorf("get %s: %w", s.URL()+"/"+key, err)
	}
	defer out.Body.Close()
	limit := smallObjectLimit(key)
	if n := aws.ToInt64(out.ContentLength); n > limit {
		return nil, aws.ToString(out.ETag), false, fmt.Errorf("get %s: %w", s.URL()+"/"+key, tooLarge(key, n))
	}
	// (A body that brings nothing for s3StallTimeout fails here: stallBody.)
	data, err = io.ReadAll(io.LimitReader(out.Body, limit+1))
	if err != nil {
		return nil, "", ctx.Err() == nil, fmt.Errorf("get %s: %w", s.URL()+"/"+key, err)
	}
	if int64(len(data)) > limit {
		return nil, aws.ToString(out.ETag), false, fmt.Errorf("get %s: %w", s.URL()+"/"+key, tooLarge(key, -1))
	}
	return data, aws.ToString(out.ETag), false, nil
}

// s3ReadAttempts is how often Download tries one ranged read whose body breaks off.
const s3ReadAttempts = 3

// Download writes the object at key into w with parallel ranged GetObjects of PartSize bytes,
// each conditional on the ETag a HeadObject saw first, so that all of them read the same
// object. It returns ErrNotFound if there is no object, and an error for an invalid key, an
// object whose size is not size, an object replaced during the download, and a request that
// fails for good or is cut short by ctx. A ranged read whose body breaks off is retried.
func (s *S3Store) Download(ctx context.Context, key string, w io.WriterAt, size int64) error {
	okey, err := s.objectKey(key)
	if err != nil {
		return fmt.Errorf("download %s: %w", key, err)
	}
	if err := s.download(ctx, okey, w, size); err != nil {
		return fmt.Errorf("download %s: %w", s.URL()+"/"+key, err)
	}
	return nil
}

func (s *S3Store) download(ctx context.Context, okey string, w io.WriterAt, size int64) error {
	head, err := s.client.HeadObject(ctx, &s3.HeadObjectInput{Bucket: &s.bucket, Key: &okey})
	if err != nil {
		if s3IsNotFound(err) {
			return ErrNotFound
		}
		return err
	}
	if got := aws.ToInt64(head.ContentLength); got != size {
		return fmt.Errorf("%w: object has %d bytes; want %d", ErrDamaged, got, size)
	}
	g, gctx := errgroup.WithContext(ctx)
	order := s.nextOrder()
	for _, p := range s3PartPlan(size, s.partSize(size, false)) {
		if s.acquire(gctx, order) != nil {
			break
		}
		g.Go(func() error {
			start := time.Now()
			var err error
			defer func() { s.release(p.n, start, err == nil) }()
			for range s3ReadAttempts {
				var retry bool
				retry, err = s.getRange(gctx, okey, head.ETag, w, p)
				if !retry || gctx.Err() != nil {
					break
				}
				s.lim.observe(err) // a body that broke off: the SDK's retryer never saw it
			}
			return err
		})
	}
	if err := g.Wait(); err != nil {
		return err
	}
	return ctx.Err()
}

// getRange copies one range of the object into w. retry is true for a body that broke off.
func (s *S3Store) getRange(ctx context.Context, okey string, etag *string, w io.WriterAt, p s3Part) (retry bool, err error) {
	rctx, stall, unwatch := watchStall(ctx)
	defer unwatch()
	stall.idle() // until the answer: that wait is s3ResponseHeaderTimeout's
	out, err := s.client.GetObject(rctx, &s3.GetObjectInput{
		Bucket:  &s.bucket,
		Key:     &okey,
		Range:   aws.String(fmt.Sprintf("bytes=%d-%d", p.off, p.off+p.n-1)),
		IfMatch: etag,
	}, s.observed)
	if err != nil {
		if s3IsPreconditionFailed(err) {
			return false, fmt.Errorf("object changed during the download: %w", err)
		}
		if s3IsNotFound(err) {
			// Deleted since its HEAD (retention, while a restore read it): as gone as one the
			// HEAD found gone (found from outside: restore failed on the 404 instead of
			// starting again with the newest commit).
			return false, fmt.Errorf("get bytes %d-%d: %w (%w)", p.off, p.off+p.n-1, ErrNotFound, err)
		}
		return false, fmt.Errorf("get bytes %d-%d: %w", p.off, p.off+p.n-1, err)
	}
	defer out.Body.Close()
	if got := aws.ToInt64(out.ContentLength); got != p.n {
		return false, fmt.Errorf("get bytes %d-%d: server sent %d bytes; want %d", p.off, p.off+p.n-1, got, p.n)
	}
	stall.moved()
	got, err := s3CopyAt(w, p.off, stallReader{out.Body, stall}, p.n, make([]byte, s3CopyBuffer))
	if err != nil {
		return true, fmt.Errorf("get bytes %d-%d: read %d bytes: %w", p.off, p.off+p.n-1, got, stalled(rctx, err))
	}
	return false, nil
}

// stallReader re-arms its watch at every read that brings bytes.
type stallReader struct {
	r     io.Reader
	stall *stallWatch
}

func (r stallReader) Read(p []byte) (int, error) {
	n, err := r.r.Read(p)
	if n > 0 {
		r.stall.moved()
	}
	return n, err
}

// s3CopyAt copies n bytes from r into w at off, through buf, one full buffer a write: a read from
// a TLS connection returns one record (16 KiB at most), and the file system spends a call's
// overhead and a pass over its locks on every write, so 16 KiB writes cost 1.7 times the CPU of
// 256 KiB ones (ext4, 32 writers). It returns the bytes written and io.ErrUnexpectedEOF if r
// ends before n bytes.
func s3CopyAt(w io.WriterAt, off int64, r io.Reader, n int64, buf []byte) (int64, error) {
	var done int64
	for done < n {
		m, err := io.ReadFull(r, buf[:min(int64(len(buf)), n-done)])
		if m > 0 {
			wrote, werr := w.WriteAt(buf[:m], off+done)
			done += int64(wrote)
			if werr != nil {
				return done, werr
			}
		}
		if err == io.EOF {
			err = io.ErrUnexpectedEOF
		}
		if err != nil {
			return done, err
		}
	}
	return done, nil
}

// List returns every object whose key starts with prefix, sorted by key; "directory" marker
// objects (keys ending in "/") are not listed. It returns an error for a request that fails for
// good or is cut short by ctx.
func (s *S3Store) List(ctx context.Context, prefix string) ([]ObjectInfo, error) {
	kp := s.keyPrefix()
	pages := s3.NewListObjectsV2Paginator(s.client, &s3.ListObjectsV2Input{
		Bucket: &s.bucket,
		Prefix: aws.String(kp + prefix),
	})
	var out []ObjectInfo
	for pages.HasMorePages() {
		page, err := pages.NextPage(ctx)
		if err != nil {
			return nil, fmt.Errorf("list %s/%s: %w", s.URL(), prefix, err)
		}
		if truncatedWithoutToken(page) {
			return nil, fmt.Errorf("list %s/%s: %w", s.URL(), prefix, errTruncatedList)
		}
		for _, o := range page.Contents {
			key, ok := strings.CutPrefix(aws.ToString(o.Key), kp)
			if !ok || key == "" || strings.HasSuffix(key, "/") {
				continue
			}
			out = append(out, ObjectInfo{Key: key, Size: aws.ToInt64(o.Size), LastModified: aws.ToTime(o.LastModified)})
		}
	}
	slices.SortFunc(out, func(a, b ObjectInfo) int { return strings.Compare(a.Key, b.Key) })
	return out, nil
}

// ListDir lists one level below prefix with ListObjectsV2 and the delimiter "/", page by page:
// the common prefixes are the dirs (their last element, without the slash), the objects the
// objs (with their whole keys), both sorted. "Directory" marker objects (keys ending in "/")
// and common prefixes that are not a valid key element (from keys with "//") are not listed.
// It returns an error for a prefix that is neither "" nor a valid key followed by "/", and for a
// request that fails for good or is cut short by ctx.
func (s *S3Store) ListDir(ctx context.Context, prefix string) ([]string, []ObjectInfo, error) {
	if err := checkDirPrefix(prefix); err != nil {
		return nil, nil, fmt.Errorf("list %s/%s: %w", s.URL(), prefix, err)
	}
	kp := s.keyPrefix()
	pages := s3.NewListObjectsV2Paginator(s.client, &s3.ListObjectsV2Input{
		Bucket:    &s.bucket,
		Prefix:    aws.String(kp + prefix),
		Delimiter: aws.String("/"),
	})
	var dirs []string
	var objs []ObjectInfo
	for pages.HasMorePages() {
		page, err := pages.NextPage(ctx)
		if err != nil {
			return nil, nil, fmt.Errorf("list %s/%s: %w", s.URL(), prefix, err)
		}
		if truncatedWithoutToken(page) {
			return nil, nil, fmt.Errorf("list %s/%s: %w", s.URL(), prefix, errTruncatedList)
		}
		for _, cp := range page.CommonPrefixes {
			rest, ok := strings.CutPrefix(aws.ToString(cp.Prefix), kp+prefix)
			name, slash := strings.CutSuffix(rest, "/")
			if ok && slash && checkStoreKey(name) == nil && !strings.Contains(name, "/") {
				dirs = append(dirs, name)
			}
		}
		for _, o := range page.Contents {
			key, ok := strings.CutPrefix(aws.ToString(o.Key), kp)
			name, under := strings.CutPrefix(key, prefix)
			if !ok || !under || name == "" || strings.Contains(name, "/") {
				continue
			}
			objs = append(objs, ObjectInfo{Key: key, Size: aws.ToInt64(o.Size), LastModified: aws.ToTime(o.LastModified)})
		}
	}
	slices.Sort(dirs)
	dirs = slices.Compact(dirs)
	slices.SortFunc(objs, func(a, b ObjectInfo) int { return strings.Compare(a.Key, b.Key) })
	return dirs, objs, nil
}

// truncatedWithoutToken reports whether page says there is more and gives no token to ask for
// it: the SDK's paginator stops there, as if the list were whole (found from outside: list
// showed 1 of 3 checkpoints, and list --check said the files of the others were missing).
func truncatedWithoutToken(page *s3.ListObjectsV2Output) bool {
	return aws.ToBool(page.IsTruncated) && aws.ToString(page.NextContinuationToken) == ""
}

// errTruncatedList is the error of a list whose page says there is more, and gives no token to
// ask for it.
var errTruncatedList = errors.New("the server says the list is truncated but gives no continuation token: the rest cannot be listed (a server that does not implement ListObjectsV2 as S3 does)")

// Delete removes the objects with DeleteObjects, 1000 keys a request, or one DeleteObject each
// if the server does not implement DeleteObjects. Keys that do not exist are not an error. It
// returns an error for an invalid key (before deleting anything) and, joined, for every key the
// server would not delete.
func (s *S3Store) Delete(ctx context.Context, keys ...string) error {
	okeys := make([]string, len(keys))
	for i, key := range keys {
		okey, err := s.objectKey(key)
		if err != nil {
			return fmt.Errorf("delete: %w", err)
		}
		okeys[i] = okey
	}
	var problems []error
	for batch := range slices.Chunk(okeys, s3DeleteBatch) {
		ids := make([]types.ObjectIdentifier, len(batch))
		for i := range batch {
			ids[i] = types.ObjectIdentifier{Key: &batch[i]}
		}
		out, err := s.client.DeleteObjects(ctx, &s3.DeleteObjectsInput{
			Bucket: &s.bucket,
			Delete: &types.Delete{Objects: ids, Quiet: aws.Bool(true)},
		})
		if err != nil && s3IsUnsupported(err) {
			problems = append(problems, s.deleteEach(ctx, batch)...)
			continue
		}
		if err != nil {
			return errors.Join(append(problems, fmt.Errorf("delete from %s: %w", s.URL(), err))...)
		}
		for _, e := range out.Errors {
			if aws.ToString(e.Code) == "NoSuchKey" {
				continue
			}
			problems = append(problems, fmt.Errorf("delete %s: %s: %s", aws.ToString(e.Key), aws.ToString(e.Code), aws.ToString(e.Message)))
		}
	}
	return errors.Join(problems...)
}

// deleteEach deletes okeys one request each.
func (s *S3Store) deleteEach(ctx context.Context, okeys []string) []error {
	var problems []error
	for _, okey := range okeys {
		_, err := s.client.DeleteObject(ctx, &s3.DeleteObjectInput{Bucket: &s.bucket, Key: &okey})
		if err != nil && !s3IsNotFound(err) {
			problems = append(problems, fmt.Errorf("delete %s: %w", okey, err))
		}
	}
	return problems
}

// AbortIncomplete aborts the multipart uploads whose key starts with prefix, which must be a
// valid key followed by "/", except those this store value is running now (created by its
// PutFile and not yet completed or aborted), and returns how many it aborted. Uploads that are
// gone meanwhile are not counted and not an error. The age the server reports is not used:
// servers report Initiated to the second, and some (versitygw) move it when a part lands. It
// waits for every CreateMultipartUpload of this store in flight to return first. It returns an
// error for any other prefix, and, with the count so far, for a request that fails for good or
// is cut short by ctx.
func (s *S3Store) AbortIncomplete(ctx context.Context, prefix string) (int, error) {
	if err := checkDirPrefix(prefix); err != nil || prefix == "" {
		if err == nil {
			err = errors.New("empty prefix")
		}
		return 0, fmt.Errorf("abort incomplete uploads in %s/%s: %w", s.URL(), prefix, err)
	}
	full := s.keyPrefix() + prefix
	pages := s3.NewListMultipartUploadsPaginator(s.client, &s3.ListMultipartUploadsInput{
		Bucket: &s.bucket,
		Prefix: &full,
	})
	n := 0
	for pages.HasMorePages() {
		page, err := pages.NextPage(ctx)
		if err != nil {
			return n, fmt.Errorf("list multipart uploads in %s/%s: %w", s.URL(), prefix, err)
		}
		ids := make([]string, len(page.Uploads))
		for i, u := range page.Uploads {
			ids[i] = aws.ToString(u.UploadId)
		}
		owned := s.ownedUploads(ids)
		for _, u := range page.Uploads {
			if owned[aws.ToString(u.UploadId)] || !strings.HasPrefix(aws.ToString(u.Key), full) {
				continue
			}
			_, err := s.client.AbortMultipartUpload(ctx, &s3.AbortMultipartUploadInput{Bucket: &s.bucket, Key: u.Key, UploadId: u.UploadId})
			if s3ErrorCode(err) == "NoSuchUpload" {
				continue
			}
			if err != nil {
				return n, fmt.Errorf("abort multipart upload %s of %s: %w", aws.ToString(u.UploadId), aws.ToString(u.Key), err)
			}
			n++
		}
	}
	return n, nil
}
