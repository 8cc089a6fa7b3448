package checkpoint

import (
	"encoding/base64"
	"encoding/binary"
	"hash"
	"hash/crc32"
	"hash/crc64"
	"io"
	"sync"
)

// castagnoli is the CRC-32C table; crc32 uses the CPU's instruction for it where there is one.
var castagnoli = crc32.MakeTable(crc32.Castagnoli)

// NewCRC32C returns a hash computing CRC-32C.
func NewCRC32C() hash.Hash32 { return crc32.New(castagnoli) }

// CRC32CChecksum returns the Checksum for a CRC-32C value: base64 of its 4 big-endian bytes, as
// S3 writes it.
func CRC32CChecksum(sum uint32) Checksum {
	var b [4]byte
	binary.BigEndian.PutUint32(b[:], sum)
	return Checksum{Algorithm: ChecksumCRC32C, Value: base64.StdEncoding.EncodeToString(b[:])}
}

// ChecksumOf reads r to its end and returns the CRC-32C Checksum of what it read.
func ChecksumOf(r io.Reader) (Checksum, error) {
	h := NewCRC32C()
	if err := checksumCopy(h, r); err != nil {
		return Checksum{}, err
	}
	return CRC32CChecksum(h.Sum32()), nil
}

// nvme is the CRC-64/NVME table (its polynomial reversed, as hash/crc64 takes it): S3's
// CRC64NVME.
var nvme = crc64.MakeTable(0x9a6c9329ac4bc9b5)

// checksumAs reads r to its end and returns the Checksum of what it read with algorithm alg,
// one a manifest may name (ChecksumCRC32C, the agent's own, or ChecksumCRC64NVME): what a file
// restored from a commit is compared with.
func checksumAs(alg string, r io.Reader) (Checksum, error) {
	if alg != ChecksumCRC64NVME {
		return ChecksumOf(r)
	}
	h := crc64.New(nvme)
	if err := checksumCopy(h, r); err != nil {
		return Checksum{}, err
	}
	var b [8]byte
	binary.BigEndian.PutUint64(b[:], h.Sum64())
	return Checksum{Algorithm: ChecksumCRC64NVME, Value: base64.StdEncoding.EncodeToString(b[:])}, nil
}

// checksumCopy reads r to its end into h, through a pooled buffer.
func checksumCopy(h hash.Hash, r io.Reader) error {
	buf := checksumBuffers.Get().(*[]byte)
	defer checksumBuffers.Put(buf)
	// Through the buffer even where r has a WriteTo: a file's reads 32 KiB at a time.
	_, err := io.CopyBuffer(h, struct{ io.Reader }{r}, *buf)
	return err
}

// checksumBuffers holds ChecksumOf's read buffers, 256 KiB each: an eighth of the reads a 32 KiB
// buffer takes, and not allocated again for each of 100 000 small files.
var checksumBuffers = sync.Pool{New: func() any {
	b := make([]byte, 256<<10)
	return &b
}}
