//go:build !linux

package checkpoint

import (
	"os"

	"github.com/rs/zerolog"
)

// restoreLockStaging does nothing on systems other than Linux: a staging directory is not
// locked there, and restoreRemoveStale judges one by the pid in its name alone.
func restoreLockStaging(*os.Root, string, zerolog.Logger) (func(), error) { return func() {}, nil }

// restoreLockStale says, on systems other than Linux, that a staging directory's lock cannot
// tell (restoreStaleUnknown): the pid in its name does.
func restoreLockStale(*os.Root, string) (func(), restoreStaleState) { return nil, restoreStaleUnknown }
