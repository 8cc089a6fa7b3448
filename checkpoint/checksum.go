package checkpoint

import (
	"encoding/base64"
	"encoding/binary"
	"hash"
	"hash/crc32"
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
	buf := checksumBuffers.Get().(*[]byte)
	defer checksumBuffers.Put(buf)
	// Through the buffer even where r has a WriteTo: a file's reads 32 KiB at a time.
	if _, err := io.CopyBuffer(h, struct{ io.Reader }{r}, *buf); err != nil {
		return Checksum{}, err
	}
	return CRC32CChecksum(h.Sum32()), nil
}

// checksumBuffers holds ChecksumOf's read buffers, 256 KiB each: an eighth of the reads a 32 KiB
// buffer takes, and not allocated again for each of 100 000 small files.
var checksumBuffers = sync.Pool{New: func() any {
	b := make([]byte, 256<<10)
	return &b
}}
