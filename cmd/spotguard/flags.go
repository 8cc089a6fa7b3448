package main

import (
	"errors"
	"flag"
	"fmt"
	"io"
	"regexp"
	"strings"

	"github.com/spotguard/spotguard/agent"
)

// flagSet is one command's flags. -h lists the command's own flags (those it defines on the
// flag set) after a usage line and its description. A command that loads the configuration
// also takes --config and one flag per configuration key (--store.url, --log.level, ...): they
// are parsed like its own but listed only by `spotguard config -h`, so that each command's help
// fits in a screen.
//
// Help goes to stdout (exit 0). A usage error is one line naming the problem and one hint line,
// on stderr (exit 2).
type flagSet struct {
	*flag.FlagSet
	name    string // the command: "restore"
	summary string
	// use is what follows the command in the usage line: "[flags]" unless the command says more.
	use    string
	stdout io.Writer
	stderr io.Writer
	cf     *configFlags // nil: the command takes no configuration
	// hidden are the flags -h does not list: --config, every key and the old spellings.
	hidden map[string]bool
	// refused are the key flags the command takes from a flag of its own, each with what to
	// use instead; refusal is what the first one given said.
	refused map[string]string
	refusal string
}

// newFlagSet returns the flag set of a command that loads the configuration: --config, one flag
// per configuration key, and --log-level, the old spelling of --log.level (accepted, not listed).
func newFlagSet(name, summary string, stdout, stderr io.Writer) (*flagSet, *configFlags) {
	fs := newPlainFlagSet(name, summary, stdout, stderr)
	cf := &configFlags{}
	fs.cf = cf
	fs.StringVar(&cf.path, "config", agent.DefaultConfigPath, "configuration `FILE` (YAML)")
	fs.hidden["config"] = true
	fs.Func("log-level", "the old spelling of --log.level", func(v string) error {
		cf.overrides = append(cf.overrides, agent.KeyValue{Key: "log.level", Value: v})
		return nil
	})
	fs.hidden["log-level"] = true
	for _, k := range agent.Keys() {
		fs.Func(k.Name, k.Help, func(v string) error {
			if why, ok := fs.refused[k.Name]; ok {
				if fs.refusal == "" {
					fs.refusal = fmt.Sprintf("--%s is not used by %s: %s", k.Name, fs.name, why)
				}
				return errors.New(why)
			}
			cf.overrides = append(cf.overrides, agent.KeyValue{Key: k.Name, Value: v})
			return nil
		})
		fs.hidden[k.Name] = true
	}
	return fs, cf
}

// newPlainFlagSet returns the flag set of a command that takes no configuration.
func newPlainFlagSet(name, summary string, stdout, stderr io.Writer) *flagSet {
	fs := &flagSet{
		FlagSet: flag.NewFlagSet("spotguard "+name, flag.ContinueOnError),
		name:    name, summary: summary, use: "[flags]",
		stdout: stdout, stderr: stderr,
		hidden: map[string]bool{}, refused: map[string]string{},
	}
	// The flag package's own messages and usage are replaced by parse's.
	fs.SetOutput(io.Discard)
	fs.Usage = func() {}
	return fs
}

// refuseKey makes the key flag --key a usage error on this command, which takes the same thing
// from a flag of its own: why says which.
func (fs *flagSet) refuseKey(key, why string) {
	if fs.Lookup(key) == nil {
		panic("refuseKey: no configuration key " + key)
	}
	fs.refused[key] = why
}

// parse parses args. It returns true when the command goes on; otherwise the exit code: 0 after
// -h (help printed on stdout), 2 after a usage error (said on stderr).
func (fs *flagSet) parse(args []string) (int, bool) {
	err := fs.Parse(args)
	switch {
	case errors.Is(err, flag.ErrHelp):
		fs.printHelp(fs.stdout)
		return exitOK, false
	case fs.refusal != "":
		return fs.usageError("%s", fs.refusal), false
	case err != nil:
		msg := dashDash(err.Error())
		if name, ok := strings.CutPrefix(msg, "flag provided but not defined: --"); ok && strings.Contains(name, ".") && fs.cf != nil {
			fmt.Fprintf(fs.stderr, "spotguard %s: %s\nrun 'spotguard config -h' for the configuration keys\n", fs.name, msg)
			return exitUsage, false
		}
		return fs.usageError("%s", msg), false
	case fs.NArg() > 0:
		return fs.usageError("unexpected argument %q", fs.Arg(0)), false
	case fs.cf != nil && fs.cf.path == "":
		// An unset variable in a script (--config "$CFG"): no file read at all, every key at its
		// default, with no word (found from outside).
		return fs.usageError("--config is empty: give the configuration file, or leave the flag out for %s", agent.DefaultConfigPath), false
	}
	return exitOK, true
}

// flagInMessage is a flag's name as the flag package writes it in its errors: one dash.
var flagInMessage = regexp.MustCompile(`(: | for flag | for )-([^-\s:][^\s:]*)`)

// dashDash writes the flag names in an error of the flag package as the help and the docs do,
// with two dashes: "flag provided but not defined: --bogus", not "-bogus".
func dashDash(msg string) string {
	return flagInMessage.ReplaceAllString(msg, "$1--$2")
}

// usageError says what is wrong with the command line in one line, and where its flags are in
// another, on stderr. It returns exitUsage.
func (fs *flagSet) usageError(format string, a ...any) int {
	fmt.Fprintf(fs.stderr, "spotguard %s: %s\nrun 'spotguard %s -h' for its flags\n", fs.name, fmt.Sprintf(format, a...), fs.name)
	return exitUsage
}

// keyFlagsNote ends the help of every command that loads the configuration but `config`.
const keyFlagsNote = `--config FILE is the configuration (default ` + agent.DefaultConfigPath + `).
Every configuration key is also a flag (--store.url URL, --log.level debug, ...):
'spotguard config -h' lists them.`

// printHelp writes the command's help: the usage line, the description, its own flags, and for
// the configuration's keys a note (every command) or their list (`config`).
func (fs *flagSet) printHelp(w io.Writer) {
	fmt.Fprintf(w, "Usage: %s\n\n%s\n", strings.TrimSpace("spotguard "+fs.name+" "+fs.use), fs.summary)
	var own []*flag.Flag
	fs.VisitAll(func(f *flag.Flag) {
		if !fs.hidden[f.Name] {
			own = append(own, f)
		}
	})
	if len(own) > 0 {
		fmt.Fprint(w, "\nFlags:\n")
		for _, f := range own {
			printFlag(w, f)
		}
	}
	switch {
	case fs.cf == nil:
	case fs.name == "config":
		printKeys(w)
	default:
		fmt.Fprintf(w, "\n%s\n", keyFlagsNote)
	}
}

// helpIndent indents a flag's description under its name; helpWidth is the widest line of help.
const (
	helpIndent = "        "
	helpWidth  = 100
)

// printFlag writes one flag as --name ARG, then its description, indented, with its default
// when it is not the zero value.
func printFlag(w io.Writer, f *flag.Flag) {
	arg, usage := flag.UnquoteUsage(f)
	if arg != "" {
		arg = " " + arg
	}
	if !isZeroDefault(f.DefValue) {
		usage += fmt.Sprintf(" (default %s)", f.DefValue)
	}
	fmt.Fprintf(w, "  --%s%s\n", f.Name, arg)
	for _, line := range wrap(usage, helpWidth-len(helpIndent)) {
		fmt.Fprintf(w, "%s%s\n", helpIndent, line)
	}
}

func isZeroDefault(v string) bool {
	switch v {
	case "", "0", "false", "0s":
		return true
	}
	return false
}

// printKeys lists every configuration key with its default, environment variable and meaning:
// the list `spotguard config -h` ends with.
func printKeys(w io.Writer) {
	fmt.Fprintf(w, `
Configuration keys. Each is read from the file (--config FILE, default
%s), then from its environment variable, then from its flag on every
command that reads the configuration (--log.level debug), the last one winning:

`, agent.DefaultConfigPath)
	for _, k := range agent.Keys() {
		def := k.Default
		if def == "" {
			def = "empty"
		}
		fmt.Fprintf(w, "  --%s (default %s, env %s)\n", k.Name, def, k.Env)
		for _, line := range wrap(k.Help, helpWidth-len(helpIndent)) {
			fmt.Fprintf(w, "%s%s\n", helpIndent, line)
		}
	}
}

// wrap breaks text into lines of at most width characters at spaces, the line breaks it had
// included (a longer word stands alone on its line).
func wrap(text string, width int) []string {
	var lines []string
	line := ""
	for _, word := range strings.Fields(text) {
		switch {
		case line == "":
			line = word
		case len(line)+1+len(word) <= width:
			line += " " + word
		default:
			lines = append(lines, line)
			line = word
		}
	}
	if line != "" {
		lines = append(lines, line)
	}
	return lines
}
