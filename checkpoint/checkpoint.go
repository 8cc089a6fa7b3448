// Package checkpoint makes the trainer's checkpoints durable: it watches checkpoint.dir, streams
// each file to a Store as soon as it is closed, commits a manifest when the checkpoint is
// complete, and restores the newest complete checkpoint, verified, on the next instance.
//
// Store layout, for job J, checkpoint C (the trainer's directory name) and commit X (an id of its
// own for every commit of C, see NewCommitID); keys are relative to the store's prefix:
//
//	J/C/X/<relative path>              the checkpoint's files, as committed by X
//	J/C/X/_spotguard/manifest.json     written last and only once: the commit point
//	J/LATEST                           JSON naming the newest commit (C and X)
//
// A commit without a manifest does not exist. The same name committed twice is two commits; the
// one that completed later is the newer (Manifest.Order). Version 1 stores (before commit ids:
// J/C/<path>, J/C/_spotguard/manifest.json) are still read. The protocol and the invariants it
// keeps are in commit.go.
package checkpoint

import (
	"context"
	"errors"
	"fmt"
	"io"
	"os"
	"path"
	"strings"
	"time"

	"github.com/rs/zerolog"
)

// ErrNotFound is returned by Store methods for a key that does not exist.
var ErrNotFound = errors.New("not in the store")

// ErrExists is returned by Store.PutBytes with Cond.IfAbsent for a key that already exists.
var ErrExists = errors.New("checkpoint: already exists")

// ErrPrecondition is returned by Store.PutBytes with Cond.IfMatch when the object at the key
// does not have that ETag: it was replaced, or it is gone.
var ErrPrecondition = errors.New("checkpoint: precondition failed")

// ErrTooLarge is returned by Store.GetBytes for an object larger than any of its kind spotguard
// writes (see smallObjectLimit): not read, so that one written there by mistake (a checkpoint
// copied to J/LATEST) does not take the agent's or a restore's memory. Its ETag is returned with
// it, so that an unusable LATEST can still be replaced.
var ErrTooLarge = errors.New("checkpoint: larger than spotguard writes such an object")

// ErrUnreadableObject is returned by a file:// store's reads of a key whose object cannot be read
// as one: not a regular file (a named pipe, a socket, a device), a symbolic link out of the
// store, or a file this user may not read (a shared file system written by several users). Of
// one manifest, it makes that commit unusable, as a manifest that is not valid does, not the
// whole job unreadable (found from outside: one such manifest of an old commit failed every
// restore and list of the job).
var ErrUnreadableObject = errors.New("checkpoint: not an object this user can read")

// smallObjectLimit is the most bytes GetBytes reads of key: a LATEST pointer is under a KiB, a
// manifest of 100 000 files some tens of MiB.
func smallObjectLimit(key string) int64 {
	if path.Base(key) == "LATEST" {
		return 1 << 20
	}
	return 1 << 30
}

// tooLarge is the error of GetBytes for key, size bytes long (-1: more than the limit).
func tooLarge(key string, size int64) error {
	limit := smallObjectLimit(key)
	what := "a manifest"
	if path.Base(key) == "LATEST" {
		what = "a LATEST pointer"
	}
	if size < 0 {
		return fmt.Errorf("%s is over %s, more than %s can be: %w", key, HumanBytes(limit), what, ErrTooLarge)
	}
	return fmt.Errorf("%s is %s, more than %s can be (%s): %w", key, HumanBytes(size), what, HumanBytes(limit), ErrTooLarge)
}

// Cond makes PutBytes conditional. The zero Cond writes unconditionally.
type Cond struct {
	// IfAbsent writes only if no object exists at the key (S3: If-None-Match: *).
	IfAbsent bool
	// IfMatch writes only if the object at the key exists and has this ETag (S3: If-Match),
	// exactly as GetBytes or PutBytes returned it, quotes included.
	IfMatch string
}

// check returns an error for a Cond that asks for both conditions, or for an If-Match of "*"
// (which S3 reads as "any object", a condition Store does not offer).
func (c Cond) check() error {
	switch {
	case c.IfAbsent && c.IfMatch != "":
		return errors.New("both IfAbsent and IfMatch are set")
	case c.IfMatch == "*":
		return errors.New(`IfMatch "*" is not an ETag`)
	}
	return nil
}

// ChecksumCRC32C is the checksum algorithm of every file in a manifest the agent writes: CRC-32C (Castagnoli)
// of the whole object, as S3 computes it for a full-object checksum, base64 of the 4 big-endian
// bytes.
const ChecksumCRC32C = "CRC32C"

// ChecksumCRC64NVME is the other full-object checksum a manifest may name (S3's default for new
// objects): CRC-64/NVME of the whole object, base64 of the 8 big-endian bytes. The agent writes
// CRC-32C; restore and list --check read either.
const ChecksumCRC64NVME = "CRC64NVME"

// Checksum is a full-object checksum.
type Checksum struct {
	Algorithm string `json:"algorithm"`
	Value     string `json:"value"`
}

// ObjectInfo describes one object in a store.
type ObjectInfo struct {
	Key          string
	Size         int64
	LastModified time.Time
}

// hurry tells s, if it can adapt its concurrency (S3Store.Hurry), that time matters more than
// sharing the link.
func hurry(s Store) {
	if h, ok := s.(interface{ Hurry() }); ok {
		h.Hurry()
	}
}

// rankKey is the context key of a transfer's rank (withRank).
type rankKey struct{}

// withRank returns ctx for transfers of rank: where a store bounds its requests in flight
// (S3Store), a higher rank gets free slots first. The uploader ranks files by their checkpoint's
// generation, so the newest checkpoint's go before an older one's still in flight.
func withRank(ctx context.Context, rank uint64) context.Context {
	return context.WithValue(ctx, rankKey{}, rank)
}

// rankOf is ctx's rank (withRank), 0 if it has none.
func rankOf(ctx context.Context) uint64 {
	r, _ := ctx.Value(rankKey{}).(uint64)
	return r
}

// urgentKey is the context key of a transfer a notice waits for (withUrgency).
type urgentKey struct{}

// withUrgency returns ctx for the transfer of a file a notice waits for while nothing else is
// being sent: where a store splits a file into requests (S3Store), it splits it finer, so that
// its requests all run at once and the time from its close to the commit is short (see
// S3Store.partSize).
func withUrgency(ctx context.Context) context.Context {
	return context.WithValue(ctx, urgentKey{}, true)
}

// urgentOf reports whether ctx is for transfers a notice waits for (withUrgency).
func urgentOf(ctx context.Context) bool {
	u, _ := ctx.Value(urgentKey{}).(bool)
	return u
}

// Store is where checkpoints go: S3 (s3://bucket/prefix) or a file system (file:///path). Keys
// are slash-separated and relative to the store's prefix; a Store never writes outside it.
// Implementations are safe for concurrent use.
type Store interface {
	// URL returns the store's address, such as "s3://bucket/prefix", for messages.
	URL() string
	// PutFile uploads the first size bytes of f to key (replacing any object there) and returns
	// the object's full-object CRC-32C. It reads f with ReadAt only, so one file may be read by
	// several parts at once. progress, if not nil, is called with byte counts as they are sent
	// (from several goroutines). A failed or cancelled PutFile leaves no object at key and no
	// incomplete multipart upload behind (it aborts what it started, on a context that outlives
	// ctx's cancellation by a few seconds).
	PutFile(ctx context.Context, key string, f *os.File, size int64, progress func(n int64)) (Checksum, error)
	// PutBytes writes a small object under cond and returns its ETag, an opaque string (quotes
	// included) that changes whenever the object's bytes change and that cond.IfMatch takes
	// back verbatim. The write is all or nothing. It returns:
	//   - the ETag, nil: data is now the object at key;
	//   - "", an error wrapping ErrExists: cond.IfAbsent and an object exists; it is unchanged;
	//   - "", an error wrapping ErrPrecondition: cond.IfMatch and the object at key has another
	//     ETag, or there is none; the store is unchanged;
	//   - "", another error: an invalid key, an invalid Cond (both conditions set, or IfMatch
	//     "*"), or a store that failed or ctx ended (the object may or may not have been
	//     written).
	PutBytes(ctx context.Context, key string, data []byte, cond Cond) (etag string, err error)
	// GetBytes reads a small object whole and returns it with its ETag (see PutBytes). It
	// returns ErrNotFound if there is none, and another error for an invalid key, a store that
	// failed, or ctx ended.
	GetBytes(ctx context.Context, key string) (data []byte, etag string, err error)
	// Download writes the object at key, which must be size bytes long, into w with parallel
	// ranged reads. ErrNotFound if there is none; an error wrapping ErrDamaged if its size
	// differs.
	Download(ctx context.Context, key string, w io.WriterAt, size int64) error
	// List returns every object whose key starts with prefix, sorted by key. It reads every
	// object below prefix, so its cost grows with the store's history: prefer ListDir.
	List(ctx context.Context, prefix string) ([]ObjectInfo, error)
	// ListDir lists one level below prefix, which is "" or ends with "/": the names of the
	// "sub-directories" (the next key element of every deeper key, without the slash, each once)
	// and the objects directly under prefix, both sorted. A prefix with nothing below it gives
	// none of either and no error. It returns an error for any other prefix, a store that
	// failed, or ctx ended.
	ListDir(ctx context.Context, prefix string) (dirs []string, objs []ObjectInfo, err error)
	// Delete removes the objects; keys that do not exist are not an error.
	Delete(ctx context.Context, keys ...string) error
	// AbortIncomplete aborts the incomplete uploads under prefix (S3 multipart uploads; the
	// file store's temporary files) that this Store value is not running now, and returns how
	// many. prefix must end with "/" (a commit's prefix, which only one agent writes): keys that
	// merely start with the same characters ("shard_1" vs "shard_10") are never touched. It
	// returns an error for any other prefix, and, with the count so far, for a store that
	// failed or ctx ended.
	AbortIncomplete(ctx context.Context, prefix string) (int, error)
}

// GrowingStore is a Store that can send a file while it is still being written, so that when the
// file is closed only its end and whatever was rewritten are left to send (S3Store: a multipart
// upload whose whole parts go as the file grows past them).
type GrowingStore interface {
	// StartGrowing begins a transfer to key of the file f, which is being written, and takes f
	// over (Growing closes it). It returns nil, and closes nothing, if it cannot: the file is
	// then sent whole with PutFile once it is closed.
	StartGrowing(ctx context.Context, key string, f *os.File) Growing
}

// Growing is a transfer begun by StartGrowing. Its methods may be called from any goroutine, but
// Finish or Abort only once (whichever comes first ends it; later calls do nothing).
type Growing interface {
	// Grew says the file is at least size bytes long now: what lies wholly below that may be
	// sent.
	Grew(size int64)
	// Finish ends the transfer as PutFile would (same result, same guarantees) for the first size
	// bytes of f, the file now that it is closed, opened anew: every byte sent while it grew is
	// read again from f and checked against its checksum, and what differs is sent again, so the
	// object holds f's bytes as Finish read them whatever the writer did meanwhile.
	Finish(ctx context.Context, f *os.File, size int64, progress func(n int64)) (Checksum, error)
	// Abort stops the transfer and throws away what it sent, in the background.
	Abort()
	// Kept is, once Finish has succeeded, how many of the object's bytes were sent while the
	// file grew and kept, not sent again by Finish: what the transfer took off the time after
	// the close. It is 0 when the file went whole.
	Kept() int64
}

// checkDirPrefix returns an error unless prefix is "" or a valid key followed by "/", the
// prefixes ListDir and AbortIncomplete take (AbortIncomplete refuses "" itself).
func checkDirPrefix(prefix string) error {
	if prefix == "" {
		return nil
	}
	dir, ok := strings.CutSuffix(prefix, "/")
	if !ok {
		return fmt.Errorf("prefix %q does not end with a slash", prefix)
	}
	if err := checkStoreKey(dir); err != nil {
		return fmt.Errorf("prefix %q: %w", prefix, err)
	}
	return nil
}

// logSeconds is d in seconds, to the millisecond, for a log field whose name ends in _s (every
// duration this package logs is one).
func logSeconds(d time.Duration) float64 { return d.Round(time.Millisecond).Seconds() }

// logTime adds t to e as key, unless t is the zero time (no notice in force has a deadline: a
// rebalance recommendation): the log never shows 0001-01-01T00:00:00Z.
func logTime(e *zerolog.Event, key string, t time.Time) *zerolog.Event {
	if t.IsZero() {
		return e
	}
	return e.Time(key, t)
}
