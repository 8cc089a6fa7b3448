package main

import (
	"bytes"
	"fmt"
	"io"
	"os"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"time"
	"unicode"

	"github.com/mattn/go-isatty"
	"github.com/rs/zerolog"
)

// logOutput is what a logger writes to, which decides the format of its lines.
type logOutput int

const (
	// logJSON is a pipe, a file or anything else: one JSON object a line, as it always was.
	logJSON logOutput = iota
	// logConsole is a terminal: zerolog's human console format.
	logConsole
	// logJournal is journald's stream (stderr under systemd): the same JSON line, after the
	// syslog priority prefix "<N>" journald reads (and strips) to set the entry's PRIORITY.
	logJournal
)

func (o logOutput) String() string {
	switch o {
	case logConsole:
		return "console"
	case logJournal:
		return "journal"
	default:
		return "json"
	}
}

// logOutputOf says what w is. It is logJournal when w is a file whose device and inode are the
// ones journalStream names: systemd sets JOURNAL_STREAM to "DEVICE:INODE" of the stream it
// connects stdout/stderr to, and a child whose stderr was redirected since inherits the variable
// but not the stream, so it is checked against fstat, as sd_journal does. Otherwise it is
// logConsole when w is a terminal, else logJSON (a pipe, a file, a buffer).
func logOutputOf(w io.Writer, journalStream string) logOutput {
	if j, ok := w.(*journalLines); ok {
		w = j.w
	}
	f, ok := w.(*os.File)
	if !ok {
		return logJSON
	}
	if journalStream != "" && isJournalStream(f, journalStream) {
		return logJournal
	}
	if isatty.IsTerminal(f.Fd()) {
		return logConsole
	}
	return logJSON
}

// isJournalStream reports whether f is the stream journalStream ("DEVICE:INODE", decimal, as
// systemd writes JOURNAL_STREAM) names. A value that does not parse, or a file that cannot be
// stat'ed, is not.
func isJournalStream(f *os.File, journalStream string) bool {
	devS, inoS, ok := strings.Cut(journalStream, ":")
	if !ok {
		return false
	}
	dev, err1 := strconv.ParseUint(devS, 10, 64)
	ino, err2 := strconv.ParseUint(inoS, 10, 64)
	if err1 != nil || err2 != nil {
		return false
	}
	fi, err := f.Stat()
	if err != nil {
		return false
	}
	st, ok := fi.Sys().(*syscall.Stat_t) // Dev and Ino differ in type between systems
	return ok && uint64(st.Dev) == dev && uint64(st.Ino) == ino
}

// journalPriority is the syslog priority journald gives a line of level l: debug (and trace)
// 7, info (and a line without a level) 6, warn 4, error 3, fatal and panic 2 (crit).
func journalPriority(l zerolog.Level) int {
	switch l {
	case zerolog.TraceLevel, zerolog.DebugLevel:
		return 7
	case zerolog.WarnLevel:
		return 4
	case zerolog.ErrorLevel:
		return 3
	case zerolog.FatalLevel, zerolog.PanicLevel:
		return 2
	default: // info, no level
		return 6
	}
}

// journalWriter writes each line after its "<N>" syslog priority prefix, in one Write, so that
// journald files it under that priority (journalctl -p err shows the errors).
type journalWriter struct{ w io.Writer }

func (j journalWriter) Write(p []byte) (int, error) { return j.WriteLevel(zerolog.NoLevel, p) }

// WriteLevel writes p, one line, after the prefix of level l. It reports len(p) when the whole
// line was written, else how much of p was.
func (j journalWriter) WriteLevel(l zerolog.Level, p []byte) (int, error) {
	line := make([]byte, 0, len(p)+3)
	line = append(line, '<', byte('0'+journalPriority(l)), '>')
	line = append(line, p...)
	n, err := j.w.Write(line)
	return max(n-3, 0), err
}

// journalLines is stderr under journald for what a command writes there itself (its errors,
// usage): each line that does not begin with a priority prefix (the logger's do) gets prio's, so
// that journalctl -p err shows why a command failed, not only its logged errors. A line is
// written in one Write, with the rest of the same Write.
type journalLines struct {
	w    io.Writer
	prio int

	mu  sync.Mutex
	mid bool // the last Write ended inside a line
}

// withJournalErrors returns stderr as a journalLines of priority 3 (err) when it is journald's
// stream (JOURNAL_STREAM in environ), else stderr as it is.
func withJournalErrors(stderr io.Writer, environ []string) io.Writer {
	if _, ok := stderr.(*journalLines); ok {
		return stderr
	}
	if logOutputOf(stderr, envMap(environ)["JOURNAL_STREAM"]) != logJournal {
		return stderr
	}
	return &journalLines{w: stderr, prio: 3}
}

// atPriority returns w writing at syslog priority prio where w is journald's stream (a
// journalLines), else w: for a line that is not an error, such as a notice that the command waits.
func atPriority(w io.Writer, prio int) io.Writer {
	if j, ok := w.(*journalLines); ok {
		return &journalLines{w: j.w, prio: prio}
	}
	return w
}

func (j *journalLines) Write(p []byte) (int, error) {
	j.mu.Lock()
	defer j.mu.Unlock()
	out := make([]byte, 0, len(p)+8)
	for rest := p; len(rest) > 0; {
		line, after, found := bytes.Cut(rest, []byte{'\n'})
		if !j.mid && !hasPriority(line) {
			out = append(out, '<', byte('0'+j.prio), '>')
		}
		out = append(out, line...)
		if found {
			out = append(out, '\n')
		}
		j.mid = !found
		rest = after
	}
	if _, err := j.w.Write(out); err != nil {
		return 0, err
	}
	return len(p), nil
}

// hasPriority reports whether line begins with a syslog priority prefix, "<0>" to "<7>".
func hasPriority(line []byte) bool {
	return len(line) >= 3 && line[0] == '<' && line[1] >= '0' && line[1] <= '7' && line[2] == '>'
}

// newLogger is the one place that builds a logger; every command logs through it. Its format
// follows where w goes (logOutputOf, with JOURNAL_STREAM from environ): JSON lines after a
// journald priority prefix under systemd, a human console format on a terminal, plain JSON lines
// anywhere else. Writes are serialized: the agent logs from several goroutines. level is the
// logger's own; zerolog's global level (log.level, live on SIGHUP) applies on top.
func newLogger(w io.Writer, environ []string, level zerolog.Level) zerolog.Logger {
	switch logOutputOf(w, envMap(environ)["JOURNAL_STREAM"]) {
	case logJournal:
		w = journalWriter{w}
	case logConsole:
		w = consoleWriter(w)
	}
	return zerolog.New(zerolog.SyncWriter(w)).Level(level).With().Timestamp().Logger()
}

// consoleWriter is zerolog's console format on out, with string values shown as they are:
// zerolog quotes a value with a space, a quote or a backslash by strconv.Quote, which doubled
// every backslash (found from outside: trainer.match's `train\.py` read `train\\.py` on a
// terminal, though the JSON log and doctor showed it right). A value is still quoted when it has
// a space, so that where it ends shows; only a value with a double quote or a control character
// keeps Go's escapes, which are then needed to read it.
func consoleWriter(out io.Writer) zerolog.ConsoleWriter {
	return zerolog.ConsoleWriter{
		Out:              out,
		TimeFormat:       time.TimeOnly,
		FormatFieldValue: consoleValue,
		FormatErrFieldValue: func(i any) string {
			s := consoleValue(i)
			if os.Getenv("NO_COLOR") != "" {
				return s
			}
			return "\x1b[31m\x1b[1m" + s + "\x1b[0m\x1b[0m" // red and bold, as zerolog's own
		},
	}
}

// consoleValue is a field's value on the console: a value zerolog quoted (strconv.Quote) is
// shown between plain double quotes, its backslashes single, unless it holds a double quote or a
// control character.
func consoleValue(i any) string {
	s := fmt.Sprint(i)
	if len(s) < 2 || s[0] != '"' {
		return s
	}
	raw, err := strconv.Unquote(s)
	if err != nil || strings.ContainsFunc(raw, func(r rune) bool { return r == '"' || unicode.IsControl(r) }) {
		return s
	}
	return `"` + raw + `"`
}

// logTimeFormat is the format of times in log lines (the line's "time", and time fields):
// RFC 3339 in UTC to the millisecond.
const logTimeFormat = "2006-01-02T15:04:05.000Z07:00"

// logSeconds is d in seconds, to the millisecond, for a log field whose name ends in _s.
func logSeconds(d time.Duration) float64 { return d.Round(time.Millisecond).Seconds() }
