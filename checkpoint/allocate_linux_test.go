package checkpoint

import (
	"errors"
	"os"
	"path/filepath"
	"syscall"
	"testing"
)

// TestAllocateFile: allocateFile sets the size and, where the file system can (ext4, XFS, tmpfs:
// every one CI runs on), gives the file its blocks, so that writing it does not allocate them one
// write at a time.
func TestAllocateFile(t *testing.T) {
	dir := t.TempDir()
	for _, size := range []int64{0, 1, 4<<20 + 123} {
		name := filepath.Join(dir, "f")
		os.Remove(name)
		f, err := os.Create(name)
		if err != nil {
			t.Fatal(err)
		}
		if err := allocateFile(f, size); err != nil {
			t.Fatalf("allocateFile(%d) = %v", size, err)
		}
		fi, err := f.Stat()
		if err != nil {
			t.Fatal(err)
		}
		if fi.Size() != size {
			t.Errorf("allocateFile(%d): size %d", size, fi.Size())
		}
		allocated := fi.Sys().(*syscall.Stat_t).Blocks * 512
		if allocated < size {
			// Only where the file system cannot allocate in advance.
			if err := syscall.Fallocate(int(f.Fd()), 0, 0, size); !errors.Is(err, syscall.EOPNOTSUPP) {
				t.Errorf("allocateFile(%d): %d bytes allocated; the file system's fallocate says %v", size, allocated, err)
			}
		}
		f.Close()
	}
}

// TestAllocateFileKeepsData: allocating a file that already has bytes keeps them and sets the
// size; a smaller size cuts it.
func TestAllocateFileKeepsData(t *testing.T) {
	name := filepath.Join(t.TempDir(), "f")
	if err := os.WriteFile(name, []byte("spotguard"), 0o644); err != nil {
		t.Fatal(err)
	}
	f, err := os.OpenFile(name, os.O_RDWR, 0)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	if err := allocateFile(f, 1<<20); err != nil {
		t.Fatal(err)
	}
	b := make([]byte, 9)
	if _, err := f.ReadAt(b, 0); err != nil || string(b) != "spotguard" {
		t.Errorf("after allocateFile(1 MiB): %q, %v; want %q", b, err, "spotguard")
	}
	if err := allocateFile(f, 4); err != nil {
		t.Fatal(err)
	}
	if fi, _ := f.Stat(); fi.Size() != 4 {
		t.Errorf("allocateFile(4) of a larger file: size %d", fi.Size())
	}
}
