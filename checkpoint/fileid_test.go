//go:build linux

package checkpoint

import (
	"io/fs"
	"os"
	"path/filepath"
	"runtime"
	"testing"
	"time"
)

// fileidLstat returns the FileID of path as Lstat sees it.
func fileidLstat(t *testing.T, path string) FileID {
	t.Helper()
	fi, err := os.Lstat(path)
	if err != nil {
		t.Fatal(err)
	}
	return FileIDOf(fi)
}

// fileidClockPast waits until the file system's clock, which stamps change times and may be
// coarser than time.Now, has gone past after: it touches a probe file in dir until its change
// time is later. It never sleeps; it gives up after watchWait.
func fileidClockPast(t *testing.T, dir string, after time.Time) {
	t.Helper()
	probe := filepath.Join(dir, "clock-probe")
	deadline := time.Now().Add(watchWait)
	for time.Now().Before(deadline) {
		if err := os.WriteFile(probe, nil, 0o644); err != nil {
			t.Fatal(err)
		}
		if fileidLstat(t, probe).ChangeTime.After(after) {
			return
		}
		runtime.Gosched()
	}
	t.Fatalf("the file system's clock did not pass %v in %v", after, watchWait)
}

// fileidFakeInfo is a FileInfo without a syscall.Stat_t.
type fileidFakeInfo struct{ fs.FileInfo }

func (fileidFakeInfo) Sys() any { return nil }

func TestFileIDOf(t *testing.T) {
	dir := t.TempDir()
	p := filepath.Join(dir, "a.bin")
	scanWrite(t, p, "aaaa")
	if err := os.Chmod(p, 0o640); err != nil {
		t.Fatal(err)
	}
	if err := os.Link(p, filepath.Join(dir, "b.bin")); err != nil {
		t.Fatal(err)
	}
	fi, err := os.Lstat(p)
	if err != nil {
		t.Fatal(err)
	}
	id := FileIDOf(fi)
	if id.Ino == 0 || id.Size != 4 || !id.ModTime.Equal(fi.ModTime()) || id.ChangeTime.IsZero() ||
		id.Nlink != 2 || id.Perm != 0o640 {
		t.Errorf("FileIDOf() = %+v; want inode, size 4, its mtime, a ctime, 2 links, mode 0640", id)
	}
	if !id.Same(id) || !id.Same(fileidLstat(t, p)) {
		t.Errorf("FileID %+v is not the Same as itself", id)
	}
	if (FileID{}).Same(FileID{}) || id.Same(FileID{}) || (FileID{}).Same(id) {
		t.Error("a zero FileID is the Same as something")
	}
	noSys := FileIDOf(fileidFakeInfo{fi})
	if noSys.Ino != 0 || noSys.Size != 4 || noSys.Same(noSys) || noSys.Same(id) {
		t.Errorf("FileIDOf(a FileInfo without Stat_t) = %+v, Same itself %v; want no inode, size 4, never the same",
			noSys, noSys.Same(noSys))
	}
}

// TestFileIDSeesWhatSizeAndTimeMiss is invariant I2's "change detection does not trust
// size + mtime alone": every change below keeps the size and the modification time.
func TestFileIDSeesWhatSizeAndTimeMiss(t *testing.T) {
	tests := []struct {
		name   string
		change func(t *testing.T, dir, p string)
	}{
		{"rewritten with the time set back", func(t *testing.T, dir, p string) {
			fi, err := os.Lstat(p)
			if err != nil {
				t.Fatal(err)
			}
			scanWrite(t, p, "bbbb")
			if err := os.Chtimes(p, fi.ModTime(), fi.ModTime()); err != nil {
				t.Fatal(err)
			}
		}},
		{"another file renamed over it", func(t *testing.T, dir, p string) {
			fi, err := os.Lstat(p)
			if err != nil {
				t.Fatal(err)
			}
			other := filepath.Join(dir, "other")
			scanWrite(t, other, "bbbb")
			if err := os.Chtimes(other, fi.ModTime(), fi.ModTime()); err != nil {
				t.Fatal(err)
			}
			if err := os.Rename(other, p); err != nil {
				t.Fatal(err)
			}
		}},
		{"chmod", func(t *testing.T, dir, p string) {
			if err := os.Chmod(p, 0o600); err != nil {
				t.Fatal(err)
			}
		}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			dir := t.TempDir()
			p := filepath.Join(dir, "a.bin")
			scanWrite(t, p, "aaaa")
			before := fileidLstat(t, p)
			fileidClockPast(t, dir, before.ChangeTime)
			tt.change(t, dir, p)
			after := fileidLstat(t, p)
			if after.Size != before.Size || !after.ModTime.Equal(before.ModTime) {
				t.Fatalf("size and mtime %d %v; want them unchanged: %d %v", after.Size, after.ModTime, before.Size, before.ModTime)
			}
			if before.Same(after) {
				t.Errorf("Same(%+v, %+v) = true; want false", before, after)
			}
		})
	}
}
