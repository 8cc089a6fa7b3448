package checkpoint

import (
	"encoding/base64"
	"encoding/binary"
	"hash"
	"hash/crc32"
	"io"
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
	if _, err := io.Copy(h, r); err != nil {
		return Checksum{}, err
	}
	return CRC32CChecksum(h.Sum32()), nil
}
