// Package checkpoint makes the trainer's checkpoints durable: it watches checkpoint.dir, streams
// each file to a Store as soon as it is closed, commits a manifest when the checkpoint is
// complete, and restores the newest complete checkpoint, verified, on the next instance.
//
// Store layout, for job J and checkpoint C (keys are relative to the store's prefix):
//
//	J/C/<relative path>              the checkpoint's files
//	J/C/_spotguard/manifest.json     written last and only once: the commit point
//	J/LATEST                         JSON naming the newest committed checkpoint
//
// A checkpoint without a manifest does not exist.
package checkpoint

import (
	"context"
	"errors"
	"io"
	"os"
	"path"
	"time"
)

// ErrNotFound is returned by Store methods for a key that does not exist.
var ErrNotFound = errors.New("checkpoint: not found")

// ErrExists is returned by Store.PutBytes with ifAbsent for a key that already exists.
var ErrExists = errors.New("checkpoint: already exists")

// ChecksumCRC32C is the checksum algorithm of every file in a manifest: CRC-32C (Castagnoli)
// of the whole object, as S3 computes it for a full-object checksum, base64 of the 4 big-endian
// bytes.
const ChecksumCRC32C = "CRC32C"

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
	// PutBytes writes a small object. With ifAbsent it writes only if key does not exist yet
	// (S3: If-None-Match: *) and returns ErrExists if it does; the object is then unchanged.
	PutBytes(ctx context.Context, key string, data []byte, ifAbsent bool) error
	// GetBytes reads a small object whole; ErrNotFound if there is none.
	GetBytes(ctx context.Context, key string) ([]byte, error)
	// Download writes the object at key, which must be size bytes long, into w with parallel
	// ranged reads. ErrNotFound if there is none; an error if its size differs.
	Download(ctx context.Context, key string, w io.WriterAt, size int64) error
	// List returns every object whose key starts with prefix, sorted by key.
	List(ctx context.Context, prefix string) ([]ObjectInfo, error)
	// Delete removes the objects; keys that do not exist are not an error.
	Delete(ctx context.Context, keys ...string) error
	// AbortIncomplete aborts the incomplete multipart uploads under prefix that started before
	// olderThan and returns how many it aborted (always 0 for stores without multipart uploads).
	AbortIncomplete(ctx context.Context, prefix string, olderThan time.Time) (int, error)
}

// DataKey is the key of a checkpoint's file: job/checkpoint/rel.
func DataKey(job, checkpoint, rel string) string { return path.Join(job, checkpoint, rel) }

// ManifestKey is the key of a checkpoint's manifest: job/checkpoint/_spotguard/manifest.json.
func ManifestKey(job, checkpoint string) string {
	return path.Join(job, checkpoint, MetaDir, "manifest.json")
}

// LatestKey is the key of a job's LATEST pointer: job/LATEST.
func LatestKey(job string) string { return path.Join(job, "LATEST") }

// MetaDir is the directory, inside a checkpoint's prefix, that holds spotguard's own files. A
// trainer's file of that name is refused.
const MetaDir = "_spotguard"
