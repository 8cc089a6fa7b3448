package e2e

import (
	"os"
	"path/filepath"

	"golang.org/x/sys/unix"
)

// evictPageCache asks the kernel to drop the cached pages of every regular file under the
// benchmarks' temporary directories (servers' data, staged checkpoints, restored trees), which
// sync has written back: they are clean, so this costs nothing but their next read. Errors are
// ignored: a file may vanish meanwhile, and an uncached file is what was asked for.
func evictPageCache() {
	roots, _ := filepath.Glob(filepath.Join(os.TempDir(), "Benchmark*"))
	for _, root := range roots {
		_ = forEachFile(root, func(f *os.File) error {
			_ = unix.Fadvise(int(f.Fd()), 0, 0, unix.FADV_DONTNEED)
			return nil
		})
	}
}
