//go:build !linux

package checkpoint

import "os"

// allocateFile makes f size bytes long.
func allocateFile(f *os.File, size int64) error { return f.Truncate(size) }
