package checkpoint

import (
	"bytes"
	"encoding/base64"
	"encoding/binary"
	"errors"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/rs/zerolog"
)

// CRC-64/NVME's check value (the CRC of "123456789"), as S3 gives it: base64 of 8 big-endian
// bytes.
func TestChecksumAsCRC64NVME(t *testing.T) {
	var b [8]byte
	binary.BigEndian.PutUint64(b[:], 0xAE8B14860A799888)
	want := Checksum{Algorithm: ChecksumCRC64NVME, Value: base64.StdEncoding.EncodeToString(b[:])}
	if got, err := checksumAs(ChecksumCRC64NVME, strings.NewReader("123456789")); err != nil || got != want {
		t.Errorf("checksumAs(CRC64NVME, 123456789) = %+v, %v; want %+v", got, err, want)
	}
	if got, _ := checksumAs(ChecksumCRC32C, strings.NewReader("123456789")); got != CRC32CChecksum(0xE3069283) {
		t.Errorf("checksumAs(CRC32C, 123456789) = %+v; want CRC-32C's check value E3069283", got)
	}
}

// putNVMECommit writes files under a new commit of job/name directly into s with a manifest
// whose checksums are CRC64NVME (sums, by path; computed when nil), as a writer other than the
// agent may, and returns it.
func putNVMECommit(t *testing.T, s Store, name string, files map[string][]byte, sums map[string]Checksum) *Manifest {
	t.Helper()
	now := time.Now()
	commit := NewCommitID(now)
	m := &Manifest{Version: ManifestVersion, Job: "job", Checkpoint: name, Commit: commit, Trigger: "periodic", CommittedAt: now}
	m.Timings.CompleteAt = &now
	for rel, data := range files {
		key := DataKey("job", name, commit, rel)
		if _, err := s.PutBytes(t.Context(), key, data, Cond{}); err != nil {
			t.Fatal(err)
		}
		sum, ok := sums[rel]
		if !ok {
			sum, _ = checksumAs(ChecksumCRC64NVME, bytes.NewReader(data))
		}
		m.Files = append(m.Files, File{Path: rel, Key: key, Size: int64(len(data)), Mode: "0644", Checksum: sum})
		m.TotalBytes += int64(len(data))
	}
	slices.SortFunc(m.Files, func(a, b File) int { return strings.Compare(a.Path, b.Path) })
	if err := m.Validate(); err != nil {
		t.Fatalf("a CRC64NVME manifest is refused: %v", err)
	}
	if err := writeManifest(t.Context(), s, m); err != nil {
		t.Fatal(err)
	}
	return m
}

// DESIGN's manifest lists a full-object checksum, CRC64NVME or CRC32C, for every file: restore
// read only CRC-32C, and refused a commit checksummed with CRC-64/NVME as "unsupported checksum"
// (found from outside). It is restored, verified with it, and a damaged file is still caught.
func TestRestoreVerifiesCRC64NVMEChecksums(t *testing.T) {
	files := map[string][]byte{"model.pt": randomBytes(t, 300<<10), "_COMPLETE": nil}
	t.Run("restored", func(t *testing.T) {
		s := newMemStore()
		putNVMECommit(t, s, "step-1", files, nil)
		to := t.TempDir()
		res, err := Restore(t.Context(), s, RestoreOptions{Job: "job", To: to, Concurrency: 4, Logger: zerolog.Nop()})
		if err != nil {
			t.Fatalf("Restore = %v; want the commit restored", err)
		}
		got, err := os.ReadFile(filepath.Join(to, "step-1", "model.pt"))
		if err != nil || !bytes.Equal(got, files["model.pt"]) || res.Checkpoint != "step-1" {
			t.Errorf("restored %s, model.pt %d bytes (%v); want step-1 with its bytes", res.Checkpoint, len(got), err)
		}
		// Restored again onto itself, it is found there, the same bytes: nothing to do.
		if _, err := Restore(t.Context(), s, RestoreOptions{Job: "job", To: to, Concurrency: 4, Logger: zerolog.Nop()}); err != nil {
			t.Errorf("second Restore onto the restored copy = %v; want it found in place", err)
		}
	})
	t.Run("damaged", func(t *testing.T) {
		s := newMemStore()
		other, _ := checksumAs(ChecksumCRC64NVME, strings.NewReader("other bytes"))
		putNVMECommit(t, s, "step-1", files, map[string]Checksum{"model.pt": other})
		_, err := Restore(t.Context(), s, RestoreOptions{Job: "job", To: t.TempDir(), Concurrency: 4, Logger: zerolog.Nop()})
		if !errors.Is(err, ErrDamaged) || !strings.Contains(err.Error(), "CRC64NVME") {
			t.Errorf("Restore of a file whose CRC64NVME differs = %v; want ErrDamaged naming the checksum", err)
		}
	})
}
