package main

import (
	"errors"
	"fmt"
	"io"
	"io/fs"
	"os"

	"github.com/spotguard/spotguard/agent"
)

// configured is `spotguard config --configured`, the ExecCondition= of spotguard.service: it tells
// a configuration nobody has touched yet (the commented default a package ships, or no file at
// the default path) from one somebody set. It returns:
//   - exitFail (1), with one line on stderr saying what to do: cfg loaded without a problem and
//     no key was set by the file, a SPOTGUARD_* variable or a flag. systemd then skips the unit
//     ("condition failed") instead of starting an agent that cannot find the trainer.
//   - exitOK (0), silently: anything else, valid or not. An invalid configuration is not
//     "unconfigured": `spotguard run` then refuses it with every problem, and the unit fails.
//
// A file that cannot be read at all is the caller's case (load fails before this): it is not
// known to be untouched, so runConfig answers exitOK there too, having said why.
func configured(cfg *agent.Config, path string, stderr io.Writer) int {
	if len(cfg.LoadProblems()) > 0 {
		return exitOK
	}
	for _, kv := range cfg.Effective() {
		if kv.Origin != "default" {
			return exitOK
		}
	}
	what := path + " sets no key"
	if _, err := os.Stat(path); errors.Is(err, fs.ErrNotExist) {
		what = "there is no " + path
	}
	// At notice priority: the expected state of an install not configured yet, not an error in
	// journalctl -p err (found from outside).
	fmt.Fprintf(atPriority(stderr, 5), "spotguard config: not configured yet: %s (nor does a SPOTGUARD_* variable or a flag set a key): "+
		"set trainer.* (and checkpoint.dir, store.url, store.job), check it with `spotguard config`, "+
		"then `systemctl enable --now spotguard`\n", what)
	return exitFail
}
