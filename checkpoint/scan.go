package checkpoint

import (
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path"
	"path/filepath"
	"slices"
	"strings"
	"time"

	"github.com/rs/zerolog"
)

// LocalCheckpoint is a checkpoint found in the local checkpoint directory.
type LocalCheckpoint struct {
	// Name is the checkpoint's sub-directory name, or the single file's name.
	Name string
	// Files are its regular files, sorted by Path. For a checkpoint directory they are every
	// regular file in it and its nested sub-directories, except the marker and the skipped names
	// (see Scan). For a single-file checkpoint it is the file itself, with Path equal to Name.
	Files []LocalFile
	// Complete is true for a checkpoint directory whose marker is a regular file at its top
	// level and which could be read in full, and always for a single-file checkpoint.
	Complete bool
	// CompleteAt is the marker's modification time (the file's own for a single-file
	// checkpoint); zero when not Complete.
	CompleteAt time.Time
	// Single is true for a single-file checkpoint: a regular file at the top of the directory
	// whose name matches the pattern.
	Single bool
}

// LocalFile is one regular file of a local checkpoint.
type LocalFile struct {
	// Path is relative to the checkpoint's directory and slash-separated; it always passes
	// ValidPath. For a single-file checkpoint it is the file's name.
	Path string
	// Size and ModTime are the file's as Lstat saw it (the same as ID's).
	Size    int64
	ModTime time.Time
	// ID identifies this version of the file (see FileID): a consumer compares it with what
	// it read or stored instead of trusting size and modification time alone.
	ID FileID
}

// scanDefaultMarker is the marker file used when none is configured.
const scanDefaultMarker = "_COMPLETE"

// Scan is one synchronous full scan of dir: every checkpoint in it, sorted by name, with its
// regular files and whether it is complete. It never follows a symbolic link below dir (dir
// itself may be one) and never opens anything but directories.
//
// The agent may run with more privilege than the trainer (as root, or with
// CAP_DAC_READ_SEARCH), so Scan reports only files the trainer could have read itself. It
// takes the owner (uid and gid) of dir itself, as Stat of dir sees it when Scan starts, for
// the trainer, and reports a regular file only if that owner could read it: the owner's uid is
// 0, or the file's uid is the owner's and its mode has 0400, or the file's gid is the owner's
// and its mode has 0040, or its mode has 0004. (Other groups the trainer is in, and ACLs, are
// not known here.)
//
// marker is the name of the file whose presence at the top of a checkpoint directory makes it
// complete ("" means "_COMPLETE"); it must be a single valid path element. pattern, if not
// empty, is a path.Match glob: a regular file at the top of dir whose name matches it is a
// complete single-file checkpoint. Other regular files at the top of dir are not checkpoints
// and are ignored silently.
//
// Skipped, silently, at any depth, files and directories alike (with everything below them):
//   - names that start with "." and end with ".tmp" (files being written before a rename into
//     place);
//   - names that start with ".spotguard-": spotguard's own files, such as restore's staging
//     directory (.spotguard-restore-*) inside dir and the file store's temporary files;
//   - the MetaDir ("_spotguard") directory at the top of dir.
//
// Skipped with one Warn log line each (fields path and type, or path and error):
//   - symbolic links, sockets, devices, FIFOs and other non-regular files, anywhere;
//   - names that fail ValidName (top level: a Watcher withholds such a checkpoint once its
//     marker is there) or ValidPath (inside a checkpoint), such as names with a backslash, and
//     MetaDir at the top of a checkpoint directory (spotguard's own, as
//     in a commit copied from the store with awscli; the only one of these that is not
//     ErrNotStorable);
//   - regular files with more than one hard link that the owner of dir does not own (unless
//     that owner is root): another name of the same file may be one the trainer could not read
//     (a link to a file outside dir); its own files linked (cp -al) are the trainer's;
//   - regular files that the owner of dir could not read (see above);
//   - files and directories inside a checkpoint directory that the agent itself may not look
//     at (permission denied: it runs as another user than the trainer, without root's rights).
//
// A skipped non-regular file is left out of its checkpoint as if it were not there, and a
// skipped single file is no checkpoint. A checkpoint directory with a name or a regular file
// skipped with an error (the last four above) is not complete (ErrNotStorable): it cannot be
// committed whole, and never is without them; one whose marker the agent may not look at is
// returned with the directory standing for its marker, so that it is withheld, not taken for
// one still being written.
//
// A checkpoint directory part of which cannot be read (a directory replaced while it was
// read, an I/O error) is logged at Error level and returned with Complete false, so
// a caller never takes a partial listing for a complete checkpoint. Entries that vanish while
// dir is read are left out without a word.
//
// Scan returns an error only if marker or pattern is invalid or dir itself cannot be read.
func Scan(dir, marker, pattern string, log zerolog.Logger) ([]LocalCheckpoint, error) {
	s, closeRoot, err := newScanWalker(dir, marker, pattern, log)
	if err != nil {
		return nil, err
	}
	defer closeRoot()
	found, err := s.all()
	if err != nil {
		return nil, err
	}
	list := make([]LocalCheckpoint, 0, len(found))
	for _, f := range found {
		if f.err != nil {
			log.Error().Err(f.err).Str("checkpoint", f.name).
				Msg("checkpoint directory could not be read in full; not complete")
		}
		list = append(list, f.local())
	}
	return list, nil
}

// ScanCheckpoint is Scan of the one checkpoint name in dir, with its marker among its Files (for
// a single-file checkpoint the file is its own marker): what a commit checks against what was
// stored. It returns the checkpoint, or an error: one wrapping fs.ErrNotExist when dir holds no
// checkpoint name (gone, skipped, or a file that does not match pattern); one saying it is not
// complete (no marker) or could not be read in full; or the error of Scan for an invalid marker
// or pattern or a dir that cannot be read.
func ScanCheckpoint(dir, name, marker, pattern string, log zerolog.Logger) (LocalCheckpoint, error) {
	s, closeRoot, err := newScanWalker(dir, marker, pattern, log)
	if err != nil {
		return LocalCheckpoint{}, err
	}
	defer closeRoot()
	f, ok := s.top(name)
	switch {
	case !ok:
		return LocalCheckpoint{}, fmt.Errorf("checkpoint %s: %w", name, fs.ErrNotExist)
	case errors.Is(f.err, ErrNotStorable):
		return LocalCheckpoint{}, fmt.Errorf("checkpoint %s: %w", name, f.err)
	case f.err != nil:
		return LocalCheckpoint{}, fmt.Errorf("checkpoint %s could not be read in full: %w", name, f.err)
	case f.marker == nil:
		return LocalCheckpoint{}, fmt.Errorf("checkpoint %s has no marker %s: not complete", name, s.marker)
	}
	lc := f.local()
	if !f.single {
		lc.Files = append(lc.Files, newScanFile(s.marker, f.marker).LocalFile)
		slices.SortFunc(lc.Files, func(a, b LocalFile) int { return strings.Compare(a.Path, b.Path) })
	}
	return lc, nil
}

// newScanWalker opens dir for a scan and returns the walker and what closes it.
func newScanWalker(dir, marker, pattern string, log zerolog.Logger) (*scanWalker, func(), error) {
	marker, err := scanCheckNames(marker, pattern)
	if err != nil {
		return nil, nil, err
	}
	root, err := os.OpenRoot(dir)
	if err != nil {
		return nil, nil, fmt.Errorf("open checkpoint dir: %w", err)
	}
	self, err := root.Stat(".")
	if err != nil {
		_ = root.Close()
		return nil, nil, fmt.Errorf("stat checkpoint dir: %w", err)
	}
	s := &scanWalker{
		root:    root,
		dir:     root.Name(),
		marker:  marker,
		pattern: pattern,
		owner:   scanOwnerOfPath(dir, self),
		skip: func(rel, kind string, err error) {
			scanLogSkip(log, filepath.Join(root.Name(), filepath.FromSlash(rel)), kind, err, isMarkerPath(rel, marker))
		},
	}
	return s, func() { _ = root.Close() }, nil
}

// scanCheckNames validates a marker and a pattern and returns the marker, defaulted.
func scanCheckNames(marker, pattern string) (string, error) {
	if marker == "" {
		marker = scanDefaultMarker
	}
	var problems []error
	if err := CheckMarker(marker); err != nil {
		problems = append(problems, fmt.Errorf("marker %q %w", marker, err))
	}
	if err := CheckPattern(pattern); err != nil {
		problems = append(problems, fmt.Errorf("pattern %q %w", pattern, err))
	}
	return marker, errors.Join(problems...)
}

// CheckMarker reports why marker cannot be a checkpoint's marker, as words that follow its name
// ("must be a single file name ..."), or nil: it must be a single file name, not one skipped (a
// temporary file, spotguard's own).
func CheckMarker(marker string) error {
	switch {
	case strings.Contains(marker, "/"):
		return errors.New("must be a single file name, with no slash")
	case marker == ".." || marker == ".":
		return errors.New("must be a single file name, not a directory's")
	case marker == MetaDir:
		return fmt.Errorf("must not be %s, spotguard's own in every commit", MetaDir)
	case ValidPath(marker) != nil:
		return fmt.Errorf("must be a single file name: %w", ValidPath(marker))
	case scanSkipName(marker):
		return fmt.Errorf("must not be a name that is never uploaded (starting with %q and ending with %q: a temporary file; starting with %q: spotguard's own)",
			".", ".tmp", scanOwnPrefix)
	}
	return nil
}

// CheckPattern reports why pattern cannot be checkpoint.pattern, as words that follow it, or
// nil: a glob (path.Match) of names at the top of the checkpoint directory, so without a slash.
// The empty pattern (no single-file checkpoints) is valid.
func CheckPattern(pattern string) error {
	if pattern == "" {
		return nil
	}
	if _, err := path.Match(pattern, ""); err != nil {
		return fmt.Errorf("is not a glob: %w", err)
	}
	if strings.Contains(pattern, "/") {
		return errors.New("must not contain a slash: it matches names at the top of checkpoint.dir")
	}
	return nil
}

// scanOwnPrefix begins the name of everything spotguard itself makes in or below a
// checkpoint directory (restore's staging directory, the file store's temporary files).
// Skipping these names is how Scan and the watcher keep invariant I4: nothing spotguard
// writes itself is ever uploaded.
const scanOwnPrefix = ".spotguard-"

// scanSkipName reports whether name is skipped silently, with everything below it: a
// temporary file that a writer will rename into place (it starts with "." and ends with
// ".tmp"), or one of spotguard's own (it starts with ".spotguard-").
func scanSkipName(name string) bool {
	return strings.HasPrefix(name, ".") && (strings.HasSuffix(name, ".tmp") || strings.HasPrefix(name, scanOwnPrefix))
}

// scanSkipPath reports whether any element of the slash-separated path p is skipped by
// scanSkipName.
func scanSkipPath(p string) bool {
	for {
		elem, rest, more := strings.Cut(p, "/")
		if scanSkipName(elem) {
			return true
		}
		if !more {
			return false
		}
		p = rest
	}
}

// scanOwner is whom a file must be readable by to be reported: the owner of the checkpoint
// directory. A zero scanOwner (uid 0, or not known) can read everything.
type scanOwner struct {
	uid, gid uint32
}

// scanOwnerOfPath returns the owner of the checkpoint directory dir, fi its Stat: its own, unless
// the path to it passes through a symbolic link that a user other than root owns, then that
// user: whoever could point checkpoint.dir anywhere is the one whose reading rights count (a
// trainer that replaced its checkpoint.dir by a link to a directory of root's would otherwise
// have root's files uploaded).
func scanOwnerOfPath(dir string, fi fs.FileInfo) scanOwner {
	abs, err := filepath.Abs(dir)
	if err != nil {
		return scanOwnerOf(fi)
	}
	if link, o := userLinkOnPath(abs); link != "" {
		return o
	}
	return scanOwnerOf(fi)
}

// scanOwnerOf returns the owner of the checkpoint directory fi.
func scanOwnerOf(fi fs.FileInfo) scanOwner {
	st, ok := fileStat(fi)
	if !ok {
		return scanOwner{}
	}
	return scanOwner{uid: st.uid, gid: st.gid}
}

// ErrNotStorable is the error of a checkpoint directory holding a name or a regular file that
// cannot be stored (see Scan): it is not complete, since committing it without them would
// present a torn checkpoint as complete.
var ErrNotStorable = errors.New("a file of the checkpoint cannot be stored, so the checkpoint is not committed")

// ErrWrittenAfterMarker is the error of a complete checkpoint directory, not committed yet, into
// which a file was written (again, or new) after its marker: a marker written first, or a save
// into the directory again without removing it. It is not complete until its marker is written
// again (CheckpointWithheld).
var ErrWrittenAfterMarker = errors.New("a file of the checkpoint was written after its marker, so the checkpoint is not complete until its marker is written again")

// ErrNameNotStorable is the error of a checkpoint whose own name the store cannot hold (see
// ValidName): it is never committed under that name.
var ErrNameNotStorable = errors.New("the checkpoint's name cannot be stored, so the checkpoint is not committed")

// scanRefused counts the names and regular files a walk of one checkpoint directory skipped
// with an error, and keeps the first: what makes it ErrNotStorable.
type scanRefused struct {
	n     int
	first string // relative to the checkpoint directory
	err   error  // why first was skipped
}

// add counts the path rel, skipped because of err.
func (r *scanRefused) add(rel string, err error) {
	if r.n == 0 {
		r.first, r.err = rel, err
	}
	r.n++
}

// error returns the ErrNotStorable of the checkpoint directory ckpt, or nil if nothing was
// skipped with an error.
func (r *scanRefused) error(ckpt string) error {
	if r.n == 0 {
		return nil
	}
	more := ""
	if r.n > 1 {
		more = fmt.Sprintf(" (and %d more)", r.n-1)
	}
	p := ckpt
	if r.first != "" {
		p += "/" + r.first
	}
	return &notStorableError{path: r.first, err: fmt.Errorf("%w: %s: %w%s; %s", ErrNotStorable, p, r.err, more, notStorableFixFor(r.err))}
}

// notStorableError is scanRefused's error: ErrNotStorable, with path, the first file refused
// (relative to the checkpoint directory; "" for the directory itself).
type notStorableError struct {
	path string
	err  error
}

func (e *notStorableError) Error() string { return e.err.Error() }
func (e *notStorableError) Unwrap() error { return e.err }

// refusedPath returns the first file a scan refused in err (a notStorableError), if it names one.
func refusedPath(err error) (string, bool) {
	if e, ok := errors.AsType[*notStorableError](err); ok && e.path != "" {
		return e.path, true
	}
	return "", false
}

// notStorableFix says what to do about a checkpoint that is ErrNotStorable; notStorableFixFor
// picks it or keyTooLongFix. The watcher sees the fix within 2 s and the checkpoint commits: the
// marker need not be written again (found from outside: the text asked for that).
const notStorableFix = "fix the file (make it readable by the owner of checkpoint.dir, give it its own name or " +
	"a name the store can hold, put the file itself in place of a symbolic link) or delete it: the checkpoint is then committed as it is"

// keyTooLongFix is notStorableFix for a key too long for the store, which is found only when the
// file is sent: the checkpoint is looked at again only when its marker is written again.
const keyTooLongFix = "give the file a shorter path (or the checkpoint a shorter name, or store.url and store.job shorter prefixes), " +
	"then write the checkpoint's marker again"

// notStorableFixFor returns the fix for a file that cannot be stored because of err.
func notStorableFixFor(err error) string {
	switch {
	case errors.Is(err, errKeyTooLong):
		return keyTooLongFix
	case errors.Is(err, ErrAgentDenied):
		return agentDeniedFix
	}
	return notStorableFix
}

// Why a file is skipped; fixed texts, so that the watcher logs each path once.
var (
	errScanHardLink   = errors.New("checkpoint: more than one hard link, and not the owner's; another name of the file may not be the trainer's")
	errScanUnreadable = errors.New("checkpoint: the owner of the checkpoint directory could not read it")
	// errScanSymlink: a symbolic link in a checkpoint directory is a file of the checkpoint
	// that is never followed; committed without what it names, the checkpoint would be torn
	// (found from outside: a link to the weights, committed without them, restored "complete").
	errScanSymlink = errors.New("checkpoint: a symbolic link, which is never followed; the checkpoint without the file it names would be torn")
)

// ErrAgentDenied is the error of a file or directory of a checkpoint that the agent itself may
// not read (permission denied): it runs as a user other than the trainer's, without root's
// rights. Its checkpoint is withheld (ErrNotStorable). (Found from outside: an agent run as
// nobody never committed a trainer's 0700 checkpoint directory, with a warning alone, and took a
// 0600 file for the store refusing.)
var ErrAgentDenied = errors.New("checkpoint: the agent may not read it (permission denied)")

// agentDeniedFix is notStorableFix for a file or directory the agent may not read.
const agentDeniedFix = "run the agent as root, as the spotguard unit does, or as the trainer's user, or have the trainer write files " +
	"the agent's user may read (umask, chmod): the checkpoint is then committed as it is"

// agentDenied returns ErrAgentDenied if err is a permission error, else err.
func agentDenied(err error) error {
	if errors.Is(err, fs.ErrPermission) {
		return ErrAgentDenied
	}
	return err
}

// irregularSkip says how a path of mode inside a checkpoint directory, neither a regular file nor
// a directory, is skipped: with err when it keeps its checkpoint from being committed (a symbolic
// link stands for a file of the checkpoint; not the marker, which then never completes it), else
// with its kind alone (a socket, a device or a FIFO holds no data of the save).
func irregularSkip(mode fs.FileMode, marker bool) (kind string, err error) {
	if mode&fs.ModeSymlink != 0 && !marker {
		return "", errScanSymlink
	}
	return scanKind(mode), nil
}

// check returns why the regular file fi must not be reported, or nil if it may be.
func (o scanOwner) check(fi fs.FileInfo) error {
	st, ok := fileStat(fi)
	if !ok {
		return nil
	}
	if st.nlink > 1 && !o.mayLink(st.uid) {
		return errScanHardLink
	}
	if !o.canRead(st.uid, st.gid, fi.Mode().Perm()) {
		return errScanUnreadable
	}
	return nil
}

// mayLink reports whether a file with owner uid and more than one hard link may be read for o: o
// owns it, or o is root. A trainer that keeps checkpoints as hard links of each other (cp -al,
// rsync --link-dest) owns their files; another user's file with a second name inside dir may be
// one the trainer could not reach by its other name.
func (o scanOwner) mayLink(uid uint32) bool { return o.uid == 0 || uid == o.uid }

// canRead reports whether o could read a file with owner uid, group gid and permission bits
// perm (see may).
func (o scanOwner) canRead(uid, gid uint32, perm fs.FileMode) bool { return o.may(uid, gid, perm, 0o4) }

// canSearch reports whether o could reach what is inside the directory fi (see may): a file
// in a directory the trainer could not enter (a root trainer's 0700 one) is one it could not
// read, whatever its own bits.
func (o scanOwner) canSearch(fi fs.FileInfo) bool {
	st, ok := fileStat(fi)
	return !ok || o.may(st.uid, st.gid, fi.Mode().Perm(), 0o1)
}

// may reports whether o may do what the permission bit bit (0o4 read, 0o1 search) of the
// others allows, on a file with owner uid, group gid and permission bits perm, as the kernel
// decides: o is root; or o owns the file, and the owner's bit says; or o has its group, and the
// group's bit says; or the others' bit says.
func (o scanOwner) may(uid, gid uint32, perm fs.FileMode, bit fs.FileMode) bool {
	switch {
	case o.uid == 0:
		return true
	case uid == o.uid:
		return perm&(bit<<6) != 0
	case gid == o.gid:
		return perm&(bit<<3) != 0
	}
	return perm&bit != 0
}

// fileTypes name the types of files that are neither regular nor directories: kind for log
// fields (scanKind), words for sentences (typeWords). A character device has ModeDevice too, so
// it comes first.
var fileTypes = []struct {
	bit         fs.FileMode
	kind, words string
}{
	{fs.ModeSymlink, "symlink", "a symbolic link"},
	{fs.ModeNamedPipe, "fifo", "a named pipe"},
	{fs.ModeSocket, "socket", "a socket"},
	{fs.ModeCharDevice, "char device", "a character device"},
	{fs.ModeDevice, "block device", "a block device"},
}

// scanKind names the type of a file that is neither regular nor a directory, for log fields.
func scanKind(mode fs.FileMode) string {
	for _, t := range fileTypes {
		if mode&t.bit != 0 {
			return t.kind
		}
	}
	return "irregular"
}

// typeWords says in words the type of a file of mode ("a symbolic link"), for errors.
func typeWords(mode fs.FileMode) string {
	switch {
	case mode.IsRegular():
		return "a regular file"
	case mode.IsDir():
		return "a directory"
	}
	for _, t := range fileTypes {
		if mode&t.bit != 0 {
			return t.words
		}
	}
	return "an irregular file"
}

// scanLogSkip writes the one log line for a skipped path: kind names its type, or err says
// why its name or it cannot be used. A checkpoint's marker (marker) that is not a regular file
// (a symbolic link, a FIFO) says so: the checkpoint never completes while it is one.
func scanLogSkip(log zerolog.Logger, abs, kind string, err error, marker bool) {
	if err == nil && marker {
		log.Warn().Str("path", abs).Str("type", kind).Str("fix", "write the marker as a regular file, last").
			Msg(msgMarkerNotRegular)
		return
	}
	if err != nil {
		log.Warn().Str("path", abs).Err(err).Msg("skipping a file that cannot be used")
		return
	}
	log.Warn().Str("path", abs).Str("type", kind).Msg("skipping a file that is not a regular file or directory")
}

// msgMarkerNotRegular is scanLogSkip's line for a marker that is not a regular file.
const msgMarkerNotRegular = "the checkpoint's marker is not a regular file: the checkpoint is not complete until it is one"

// isMarkerPath reports whether rel (relative to the checkpoint directory, slash-separated) is the
// marker of a checkpoint directory: marker at its top.
func isMarkerPath(rel, marker string) bool {
	ckpt, name, ok := strings.Cut(rel, "/")
	return ok && ckpt != "" && name == marker
}

// scanFile is a LocalFile with the FileInfo it came from.
type scanFile struct {
	LocalFile
	info fs.FileInfo
}

// newScanFile returns the scanFile for the regular file at p that Lstat described as fi.
func newScanFile(p string, fi fs.FileInfo) scanFile {
	return scanFile{LocalFile: LocalFile{Path: p, Size: fi.Size(), ModTime: fi.ModTime(), ID: FileIDOf(fi)}, info: fi}
}

// scanFound is one checkpoint found by a scanWalker.
type scanFound struct {
	name   string
	single bool
	// files are sorted by path; the marker is not among them.
	files []scanFile
	// marker is the marker's FileInfo (the file's own for a single-file checkpoint); nil if
	// there is none.
	marker fs.FileInfo
	// err is not nil if part of the checkpoint could not be read; it is then not complete.
	err error
}

// complete reports whether f is a complete checkpoint.
func (f scanFound) complete() bool { return f.marker != nil && f.err == nil }

// changedAt is the latest change time among f's files and its marker: when it was last
// written. A checkpoint with neither is zero.
func (f scanFound) changedAt() time.Time {
	var at time.Time
	if f.marker != nil {
		at = FileIDOf(f.marker).ChangeTime
	}
	for _, sf := range f.files {
		if sf.ID.ChangeTime.After(at) {
			at = sf.ID.ChangeTime
		}
	}
	return at
}

// local converts f to a LocalCheckpoint.
func (f scanFound) local() LocalCheckpoint {
	lc := LocalCheckpoint{Name: f.name, Single: f.single, Complete: f.complete()}
	if lc.Complete {
		lc.CompleteAt = f.marker.ModTime()
	}
	for _, sf := range f.files {
		lc.Files = append(lc.Files, sf.LocalFile)
	}
	return lc
}

// scanWalker lists checkpoints below a root, never following a symbolic link: every name
// is looked at with Lstat relative to a directory handle, and a directory is read only through
// a handle whose identity matches what Lstat saw.
type scanWalker struct {
	root    *os.Root
	dir     string // root's name, for messages
	marker  string
	pattern string
	// owner is whom every reported file must be readable by.
	owner scanOwner
	// skip is called once for every path that is skipped with a log line: rel is relative to
	// root and slash-separated; kind names its type, or err says what is wrong with it.
	skip func(rel, kind string, err error)
	// onDir, if not nil, is called with every checkpoint directory and nested sub-directory
	// (relative to root, slash-separated) before it is read.
	onDir func(rel string)
	// opened, if not nil, is called with every directory walkDir opened, before it reads it
	// (tests: a rename in between).
	opened func(rel string)
	// refused, if not nil, counts what walkDir skips with an error (top sets it).
	refused *scanRefused
}

// refuse counts the path rel of a checkpoint directory, skipped because of err, if a count is
// kept.
func (s *scanWalker) refuse(rel string, err error) {
	if s.refused != nil {
		s.refused.add(rel, err)
	}
}

// denied skips the path rel (relative to root) of a checkpoint directory, sub within it, which
// the agent may not look at (ErrAgentDenied), and counts it.
func (s *scanWalker) denied(rel, sub string) {
	s.skip(rel, "", ErrAgentDenied)
	s.refuse(sub, ErrAgentDenied)
}

// usable reports whether the regular file at rel (relative to root, slash-separated), which
// Lstat described as fi, may be reported; if not, it calls skip.
func (s *scanWalker) usable(rel string, fi fs.FileInfo) bool {
	if err := s.owner.check(fi); err != nil {
		s.skip(rel, "", err)
		return false
	}
	return true
}

// isSingle reports whether a regular file at the top of root named name is a single-file
// checkpoint.
func (s *scanWalker) isSingle(name string) bool {
	if s.pattern == "" {
		return false
	}
	ok, _ := path.Match(s.pattern, name)
	return ok
}

// all lists every checkpoint in root, sorted by name. It returns an error only if root
// cannot be read.
func (s *scanWalker) all() ([]scanFound, error) {
	names, err := scanReadDir(s.root, ".")
	if err != nil {
		return nil, fmt.Errorf("read checkpoint dir %s: %w", s.dir, err)
	}
	var found []scanFound
	for _, name := range names {
		if f, ok := s.top(name); ok {
			found = append(found, f)
		}
	}
	return found, nil
}

// top looks at the entry name at the top of root. It returns false if name is not a
// checkpoint: skipped, gone, or a regular file that does not match the pattern.
func (s *scanWalker) top(name string) (scanFound, bool) {
	if scanSkipName(name) || name == MetaDir {
		return scanFound{}, false
	}
	if err := ValidName(name); err != nil {
		s.skip(name, "", err)
		return scanFound{}, false
	}
	fi, err := s.root.Lstat(name)
	switch {
	case errors.Is(err, fs.ErrNotExist):
		return scanFound{}, false
	case err != nil:
		s.skip(name, "", err)
		return scanFound{}, false
	case fi.IsDir():
		f := scanFound{name: name}
		var files []scanFile
		var refused scanRefused
		s.refused = &refused
		f.err = s.walkDir(s.root, name, fi, name, "", &files)
		s.refused = nil
		if err := refused.error(name); err != nil {
			f.err = errors.Join(err, f.err)
		}
		for _, sf := range files {
			if sf.Path == s.marker {
				f.marker = sf.info
				continue
			}
			f.files = append(f.files, sf)
		}
		if f.marker == nil && errors.Is(f.err, ErrNotStorable) {
			// A marker that cannot be stored itself (a trainer running as root under umask
			// 077 writes every file 0600, the marker too) is there all the same: the
			// checkpoint is withheld, said, not taken for one still being written.
			mfi, err := s.root.Lstat(name + "/" + s.marker)
			switch {
			case err == nil && mfi.Mode().IsRegular():
				f.marker = mfi
			case errors.Is(err, fs.ErrPermission):
				// The agent may not look: the directory stands for its marker, which may be
				// there, so that the checkpoint is withheld, said, never silently left out.
				f.marker = fi
			}
		}
		if f.marker != nil {
			// Read through a handle: a directory renamed away while it was read, and its
			// marker written then (a staging directory renamed into place, the marker written
			// in it after), is not complete under this name (found from outside: "checkpoint
			// complete" said of the staging name in 42 of 534 saves). It is read again under
			// its new one.
			if now, err := s.root.Lstat(name); err != nil || !os.SameFile(fi, now) {
				return scanFound{}, false
			}
		}
		slices.SortFunc(f.files, func(a, b scanFile) int { return strings.Compare(a.Path, b.Path) })
		return f, true
	case fi.Mode().IsRegular():
		if !s.isSingle(name) || !s.usable(name, fi) {
			return scanFound{}, false
		}
		file := newScanFile(name, fi)
		return scanFound{name: name, single: true, files: []scanFile{file}, marker: fi}, true
	default:
		s.skip(name, scanKind(fi.Mode()), nil)
		return scanFound{}, false
	}
}

// walkDir appends to files every regular file below the directory base of parent, which Lstat
// described as want: the sub-directory sub (relative, "" for the top) of checkpoint ckpt. It
// returns an error if part of it could not be read; a directory that has vanished is not an
// error.
func (s *scanWalker) walkDir(parent *os.Root, base string, want fs.FileInfo, ckpt, sub string, files *[]scanFile) error {
	rel := ckpt
	if sub != "" {
		rel = ckpt + "/" + sub
	}
	if s.onDir != nil {
		s.onDir(rel)
	}
	d, err := parent.OpenRoot(base)
	switch {
	case errors.Is(err, fs.ErrNotExist):
		return nil
	case errors.Is(err, fs.ErrPermission):
		s.denied(rel, sub)
		return nil
	case err != nil:
		return fmt.Errorf("open %s: %w", rel, err)
	}
	defer func() { _ = d.Close() }() // a directory: nothing was written
	// OpenRoot follows a symbolic link that stays inside parent; make sure it opened the very
	// directory Lstat saw.
	if got, err := d.Stat("."); err != nil || !os.SameFile(want, got) {
		return fmt.Errorf("%s was replaced while it was read", rel)
	}
	if s.opened != nil {
		s.opened(rel)
	}
	if !s.owner.canSearch(want) {
		// Nothing below it could the owner of dir read (found from outside: a root-owned 0644
		// file in a root trainer's 0700 directory was committed and restored to the user).
		s.skip(rel, "", errScanUnreadable)
		s.refuse(sub, errScanUnreadable)
		return nil
	}
	names, err := scanReadDir(d, ".")
	switch {
	case errors.Is(err, fs.ErrPermission):
		s.denied(rel, sub)
		return nil
	case err != nil:
		return fmt.Errorf("read %s: %w", rel, err)
	}
	var errs []error
	for _, name := range names {
		if scanSkipName(name) {
			continue
		}
		p := path.Join(sub, name)
		if err := StorablePath(p); err != nil {
			s.skip(ckpt+"/"+p, "", err)
			if p != MetaDir { // spotguard's own (a commit copied with awscli), not the trainer's
				s.refuse(p, err)
			}
			continue
		}
		fi, err := d.Lstat(name)
		switch {
		case errors.Is(err, fs.ErrNotExist):
		case errors.Is(err, fs.ErrPermission):
			s.denied(ckpt+"/"+p, p)
		case err != nil:
			errs = append(errs, fmt.Errorf("lstat %s/%s: %w", ckpt, p, err))
		case fi.IsDir():
			if p == s.marker {
				s.skip(ckpt+"/"+p, "directory", nil) // never completes it; its files are the checkpoint's
			}
			errs = append(errs, s.walkDir(d, name, fi, ckpt, p, files))
		case fi.Mode().IsRegular():
			if s.usable(ckpt+"/"+p, fi) {
				*files = append(*files, newScanFile(p, fi))
			} else {
				s.refuse(p, s.owner.check(fi))
			}
		default:
			kind, err := irregularSkip(fi.Mode(), p == s.marker)
			s.skip(ckpt+"/"+p, kind, err)
			if err != nil {
				s.refuse(p, err)
			}
		}
	}
	return errors.Join(errs...)
}

// lstat is Lstat of rel (relative to root, slash-separated) that also refuses a path any of
// whose parents is not a directory, such as a symbolic link: that is reported as not existing;
// and one with a parent the owner of dir could not enter (errScanUnreadable).
func (s *scanWalker) lstat(rel string) (fs.FileInfo, error) {
	for i := range len(rel) {
		if rel[i] != '/' {
			continue
		}
		fi, err := s.root.Lstat(rel[:i])
		if err != nil {
			return nil, err
		}
		if !fi.IsDir() {
			return nil, fmt.Errorf("%s is not a directory: %w", rel[:i], fs.ErrNotExist)
		}
		if !s.owner.canSearch(fi) {
			return nil, fmt.Errorf("%s: %w", rel[:i], errScanUnreadable)
		}
	}
	return s.root.Lstat(rel)
}

// scanReadDir returns the names in the directory name of d, sorted.
func scanReadDir(d *os.Root, name string) ([]string, error) {
	f, err := d.Open(name)
	if err != nil {
		return nil, err
	}
	defer f.Close()
	names, err := f.Readdirnames(-1)
	if err != nil {
		return nil, err
	}
	slices.Sort(names)
	return names, nil
}
