package checkpoint

import (
	"encoding/json"
	"errors"
	"fmt"
	"io/fs"
	"path"
	"slices"
	"strconv"
	"strings"
	"time"
	"unicode/utf8"
)

// ManifestVersion is the version of the manifest format this package writes. It reads
// version 1 too (the layout before per-commit keys: data at J/C/<path>, manifest at
// J/C/_spotguard/manifest.json, no commit id, no keys or modes).
const ManifestVersion = 2

// Manifest lists a committed checkpoint. It is written last, once, with If-None-Match; its
// presence is what makes the commit exist.
type Manifest struct {
	Version    int    `json:"version"`
	Job        string `json:"job"`
	Checkpoint string `json:"checkpoint"`
	// Commit is the commit's id (version 2): every object of the commit is under
	// J/C/<commit>/. Empty in version 1.
	Commit string `json:"commit,omitempty"`
	// Files are the checkpoint's files, sorted by path. Paths are relative, slash-separated.
	Files      []File `json:"files"`
	TotalBytes int64  `json:"total_bytes"`
	Host       Host   `json:"host"`
	// Trigger says why it was committed: "notice" (written while a notice was in force) or
	// "periodic" (any other: the trainer saved on its own, a sync, one found complete at
	// start-up).
	Trigger string `json:"trigger"`
	// Notice is the key of the notice that triggered it, e.g. "spot/terminate", if any.
	Notice      string    `json:"notice,omitempty"`
	Timings     Timings   `json:"timings"`
	CommittedAt time.Time `json:"committed_at"`

	// Part is set in a part manifest (J/C/<commit>/_spotguard/part.json): one node's files of a
	// multi-node save, the commit being that node's own. A part alone is not a commit.
	Part *Part `json:"part,omitempty"`
	// WorldNodes and Parts are set in a job manifest: the commit of a multi-node save, made of
	// one part per node rank 0 … WorldNodes-1 (sorted by rank). Its Commit is rank 0's part's
	// commit, and its Files are the union of the parts' files, each with the ranks that have it.
	WorldNodes int       `json:"world_nodes,omitempty"`
	Parts      []JobPart `json:"parts,omitempty"`
}

// Part says which node of a multi-node job wrote a part manifest.
type Part struct {
	NodeRank   int `json:"node_rank"`
	WorldNodes int `json:"world_nodes"`
}

// JobPart is one node's part as a job manifest lists it.
type JobPart struct {
	NodeRank    int       `json:"node_rank"`
	Commit      string    `json:"commit"`
	Host        Host      `json:"host,omitzero"`
	Files       int       `json:"files"`
	Bytes       int64     `json:"bytes"`
	CompleteAt  time.Time `json:"complete_at"`
	CommittedAt time.Time `json:"committed_at"`
}

// File is one file of a checkpoint.
type File struct {
	// Path is where the file goes, relative to the checkpoint's directory.
	Path string `json:"path"`
	// Key is the object holding its bytes, relative to the store's prefix (version 2; in
	// version 1 it is J/C/<path>, see Manifest.FileKey).
	Key  string `json:"key,omitempty"`
	Size int64  `json:"size"`
	// Mode is the file's permission bits in octal, e.g. "0644" (version 2; restore never sets
	// setuid, setgid or sticky bits). Empty means 0644.
	Mode     string   `json:"mode,omitempty"`
	Checksum Checksum `json:"checksum"`
	// Nodes are, in a job manifest, the node ranks whose parts have this file (with these
	// bytes), ascending; the key is the first one's. A file every part has is shared.
	Nodes []int `json:"nodes,omitempty"`
}

// FileKey returns the key of f's object: f.Key, or for a version 1 manifest J/C/<path>.
func (m *Manifest) FileKey(f File) string {
	if m.Version == 1 {
		return DataKey(m.Job, m.Checkpoint, "", f.Path)
	}
	return f.Key
}

// Perm returns f's permission bits (0644 when the manifest does not say).
func (f File) Perm() fs.FileMode {
	if f.Mode == "" {
		return 0o644
	}
	v, err := strconv.ParseUint(f.Mode, 8, 32)
	if err != nil {
		return 0o644
	}
	return fs.FileMode(v) & fs.ModePerm
}

// FormatPerm formats permission bits as a manifest's Mode: "0644".
func FormatPerm(p fs.FileMode) string { return fmt.Sprintf("%04o", uint32(p&fs.ModePerm)) }

// Host is the instance that wrote the checkpoint.
type Host struct {
	InstanceID       string `json:"instance_id,omitempty"`
	InstanceType     string `json:"instance_type,omitempty"`
	AvailabilityZone string `json:"availability_zone,omitempty"`
	Hostname         string `json:"hostname,omitempty"`
}

// Timings are the moments of a checkpoint's life that the agent saw. Zero times are omitted.
type Timings struct {
	// FirstFileAt is when the first file of the checkpoint was ready (closed after writing).
	FirstFileAt *time.Time `json:"first_file_at,omitempty"`
	// CompleteAt is when the trainer completed this version: the latest change time of its files
	// (normally the marker's; see completedAt). It orders commits (Manifest.Order).
	CompleteAt *time.Time `json:"complete_at,omitempty"`
	// CompleteAtHere, when CompleteAt was moved after a commit from a clock ahead (the writer's
	// clock behind: see afterKnown), is the completion by the writer's own clock, as its files'
	// times have it: what a save on the same disk compares with (restore's newer save, a
	// restarted agent's order of its next checkpoint).
	CompleteAtHere *time.Time `json:"complete_at_here,omitempty"`
	// LastByteAt is when the last byte of the last file was stored.
	LastByteAt *time.Time `json:"last_byte_at,omitempty"`
	// UploadSeconds is how long sending the files took: from the start of the first file's send
	// to the end of the last one's (a file sent while it was written counts from its first
	// part), whatever ran at once. 0 when the agent that wrote the manifest sent none of them.
	UploadSeconds float64 `json:"upload_seconds"`
}

// Latest is the JSON of a job's LATEST object. Version 1 (written before per-commit keys) has
// only Checkpoint and CommittedAt and names a version 1 manifest.
type Latest struct {
	Version    int    `json:"version,omitempty"`
	Checkpoint string `json:"checkpoint"`
	// Commit is the commit LATEST names (version 2).
	Commit string `json:"commit,omitempty"`
	// CompleteAt is the commit's completion time, the first half of its order (see
	// Manifest.Order); with Commit it lets a writer compare without reading the manifest.
	CompleteAt  *time.Time `json:"complete_at,omitempty"`
	CommittedAt time.Time  `json:"committed_at"`
	// Host is the instance that wrote it.
	Host Host `json:"host,omitzero"`
}

// ValidName reports whether name can be a job or checkpoint name: one path element, not "." or
// "..", no backslash, NUL or other control character (hasControl), valid UTF-8 (S3 keys and
// manifests are) without U+FFFE or U+FFFF (hasNonXML), not MetaDir or "LATEST"
// (the job's LATEST is J/LATEST: a checkpoint of that name would write its commits under it).
func ValidName(name string) error {
	switch {
	case name == "" || name == "." || name == "..":
		return fmt.Errorf("%q is not a valid name", name)
	case strings.ContainsAny(name, "/\\\x00"):
		return fmt.Errorf("%q must not contain a slash, backslash or NUL", name)
	case !utf8.ValidString(name):
		return fmt.Errorf("%q is not valid UTF-8 (S3 keys and manifests are)", name)
	case hasControl(name):
		return fmt.Errorf("%q has a control character (S3 lists such a key changed, or not at all)", name)
	case hasNonXML(name):
		return fmt.Errorf("%q has U+FFFE or U+FFFF (S3's XML lists cannot carry them: such a key is listed changed, or fails the whole list)", name)
	case name == MetaDir || name == "LATEST":
		return fmt.Errorf("%q is reserved", name)
	}
	return nil
}

// hasControl reports whether s has an ASCII control character (below space, or DEL). S3's XML
// listings cannot carry most of them unless asked to encode keys (versitygw gives U+FFFD in
// their place), so a checkpoint named so could not be found by listing, nor its files deleted by
// retention; and a newline in a name breaks every line of output that shows it.
func hasControl(s string) bool {
	return strings.IndexFunc(s, func(r rune) bool { return r < 0x20 || r == 0x7f }) >= 0
}

// hasNonXML reports whether s has U+FFFE or U+FFFF, valid UTF-8 but no XML 1.0 character: an
// S3-compatible server lists such a key changed (versitygw gives U+FFFD), and S3 itself sends
// it as is, which no XML parser takes, so one such key fails every list of its prefix (found
// from outside: a checkpoint named so was committed, then not found by list, restore or
// retention, and a restore went back to an older checkpoint without a word).
func hasNonXML(s string) bool {
	return strings.ContainsAny(s, "\uFFFE\uFFFF")
}

// StorablePath is ValidPath for a file of a checkpoint being committed: it also refuses a
// control character (hasControl). A manifest committed before this rule, whose files are read
// by their keys, stays valid (ValidPath), so it can be restored.
func StorablePath(rel string) error {
	if err := ValidPath(rel); err != nil {
		return err
	}
	if hasControl(rel) {
		return fmt.Errorf("path %q has a control character (S3 lists such a key changed, or not at all)", rel)
	}
	if hasNonXML(rel) {
		return fmt.Errorf("path %q has U+FFFE or U+FFFF (S3's XML lists cannot carry them: such a key is listed changed, or fails the whole list)", rel)
	}
	return nil
}

// ValidPath reports whether rel is a safe relative file path inside a checkpoint: not absolute,
// clean, no ".." element, no backslash or NUL, valid UTF-8, not inside MetaDir.
func ValidPath(rel string) error {
	switch {
	case rel == "":
		return errors.New("empty path")
	case !utf8.ValidString(rel):
		return fmt.Errorf("path %q is not valid UTF-8 (S3 keys and manifests are)", rel)
	case strings.HasPrefix(rel, "/"):
		return fmt.Errorf("path %q is absolute", rel)
	case strings.ContainsAny(rel, "\\\x00"):
		return fmt.Errorf("path %q contains a backslash or NUL", rel)
	case path.Clean(rel) != rel:
		return fmt.Errorf("path %q is not clean", rel)
	}
	for _, el := range strings.Split(rel, "/") {
		if el == ".." || el == "." {
			return fmt.Errorf("path %q has a %q element", rel, el)
		}
	}
	if rel == MetaDir || strings.HasPrefix(rel, MetaDir+"/") {
		return fmt.Errorf("path %q is inside %s", rel, MetaDir)
	}
	return nil
}

// Validate reports every problem that makes m unusable for a restore: unknown version, bad
// names, a version 2 manifest without a valid commit id or completion time, unsafe or duplicate
// paths, a version 2 file whose key is not inside the job or whose mode is not octal permission
// bits, negative sizes, unknown checksum algorithms, a total that does not add up.
func (m *Manifest) Validate() error {
	var problems []error
	if m.Version != 1 && m.Version != ManifestVersion {
		problems = append(problems, fmt.Errorf("manifest version %d; want 1 or %d", m.Version, ManifestVersion))
	}
	if err := ValidName(m.Job); err != nil {
		problems = append(problems, fmt.Errorf("job: %w", err))
	}
	if err := ValidName(m.Checkpoint); err != nil {
		problems = append(problems, fmt.Errorf("checkpoint: %w", err))
	}
	if m.Version == ManifestVersion {
		if err := ValidCommitID(m.Commit); err != nil {
			problems = append(problems, fmt.Errorf("commit: %w", err))
		}
		if m.Timings.CompleteAt == nil {
			problems = append(problems, errors.New("no complete_at"))
		}
	}
	if len(m.Files) == 0 {
		problems = append(problems, errors.New("no files"))
	}
	seen := map[string]bool{}
	var total int64
	for _, f := range m.Files {
		if err := ValidPath(f.Path); err != nil {
			problems = append(problems, fmt.Errorf("a file's path: %w", err))
			total += f.Size // the total is no problem of its own
			continue
		}
		if seen[f.Path] {
			problems = append(problems, fmt.Errorf("file %q listed twice", f.Path))
		}
		seen[f.Path] = true
		if slices.ContainsFunc(strings.Split(f.Path, "/"), func(el string) bool { return strings.HasPrefix(el, scanOwnPrefix) }) {
			// Never uploaded (I4); restored, it would pass for spotguard's own (a restore's
			// staging, a file store's temporary file).
			problems = append(problems, fmt.Errorf("file %q: names beginning with %s are spotguard's own files", f.Path, scanOwnPrefix))
		}
		if m.Version == ManifestVersion {
			if err := checkStoreKey(f.Key); err != nil || !strings.HasPrefix(f.Key, m.Job+"/") {
				problems = append(problems, fmt.Errorf("file %q: key %q is not a key inside job %s", f.Path, f.Key, m.Job))
			}
			if f.Mode != "" {
				if v, err := strconv.ParseUint(f.Mode, 8, 32); err != nil || v > uint64(fs.ModePerm) {
					problems = append(problems, fmt.Errorf("file %q: mode %q is not octal permission bits", f.Path, f.Mode))
				}
			}
		}
		if f.Size < 0 {
			problems = append(problems, fmt.Errorf("file %q: negative size %d", f.Path, f.Size))
		}
		switch {
		case f.Checksum.Algorithm != ChecksumCRC32C && f.Checksum.Algorithm != ChecksumCRC64NVME:
			problems = append(problems, fmt.Errorf("file %q: unsupported checksum %q", f.Path, f.Checksum.Algorithm))
		case f.Checksum.Value == "":
			problems = append(problems, fmt.Errorf("file %q: checksum %s without a value", f.Path, f.Checksum.Algorithm))
		}
		total += f.Size
	}
	// A file and a directory of the same name cannot both exist.
	for p := range seen {
		for dir := path.Dir(p); dir != "."; dir = path.Dir(dir) {
			if seen[dir] {
				problems = append(problems, fmt.Errorf("file %q is also a directory of %q", dir, p))
			}
		}
	}
	if total != m.TotalBytes {
		problems = append(problems, fmt.Errorf("total_bytes %d; the files add up to %d", m.TotalBytes, total))
	}
	problems = append(problems, m.validateNodes()...)
	if len(problems) == 0 {
		return nil
	}
	return manifestProblems(problems)
}

// manifestProblems are the problems of one manifest, said on one line (a restore's error, a
// list's note; found from outside: errors.Join's newline broke the line), each for errors.Is.
type manifestProblems []error

func (p manifestProblems) Error() string {
	var b strings.Builder
	for i, err := range p {
		if i > 0 {
			b.WriteString("; ")
		}
		b.WriteString(err.Error())
	}
	return b.String()
}

func (p manifestProblems) Unwrap() []error { return p }

// validateNodes checks what a part or job manifest adds: a part's rank within its world of at
// least two nodes; a job manifest's parts, one per rank, its commit being rank 0's, and every
// file's nodes and key (under the commit of the first of its nodes).
func (m *Manifest) validateNodes() []error {
	var problems []error
	if m.Part != nil {
		if m.Part.WorldNodes < 2 || m.Part.NodeRank < 0 || m.Part.NodeRank >= m.Part.WorldNodes {
			problems = append(problems, fmt.Errorf("part: node_rank %d of world_nodes %d", m.Part.NodeRank, m.Part.WorldNodes))
		}
		if m.Parts != nil || m.WorldNodes != 0 {
			problems = append(problems, errors.New("a part manifest with parts of its own"))
		}
		return problems
	}
	if m.Parts == nil && m.WorldNodes == 0 {
		for _, f := range m.Files {
			if f.Nodes != nil {
				return append(problems, fmt.Errorf("file %q: nodes in a manifest without parts", f.Path))
			}
		}
		return nil
	}
	if m.Version != ManifestVersion || m.WorldNodes < 2 || len(m.Parts) != m.WorldNodes {
		return append(problems, fmt.Errorf("job manifest: %d parts of world_nodes %d (version %d)", len(m.Parts), m.WorldNodes, m.Version))
	}
	for i, p := range m.Parts {
		if p.NodeRank != i {
			return append(problems, fmt.Errorf("job manifest: part %d has node_rank %d; want the parts sorted by rank, one each", i, p.NodeRank))
		}
		if err := ValidCommitID(p.Commit); err != nil {
			problems = append(problems, fmt.Errorf("part %d: commit: %w", i, err))
		}
	}
	if len(problems) > 0 {
		return problems
	}
	if m.Commit != m.Parts[0].Commit {
		problems = append(problems, fmt.Errorf("job manifest: commit %s is not rank 0's part's, %s", m.Commit, m.Parts[0].Commit))
	}
	for _, f := range m.Files {
		if len(f.Nodes) == 0 || !slices.IsSorted(f.Nodes) || slices.ContainsFunc(f.Nodes, func(n int) bool { return n < 0 || n >= m.WorldNodes }) ||
			len(slices.Compact(slices.Clone(f.Nodes))) != len(f.Nodes) {
			problems = append(problems, fmt.Errorf("file %q: nodes %v of world_nodes %d", f.Path, f.Nodes, m.WorldNodes))
			continue
		}
		if want := CommitPrefix(m.Job, m.Checkpoint, m.Parts[f.Nodes[0]].Commit); !strings.HasPrefix(f.Key, want) {
			problems = append(problems, fmt.Errorf("file %q: key %q is not under the commit of node %d's part, %s", f.Path, f.Key, f.Nodes[0], want))
		}
	}
	if len(problems) > 0 {
		return problems
	}
	// Each part's files and bytes are those the files list for its rank: a job manifest that
	// lost a node's files is not presented as the whole save.
	files, bytes := make([]int, m.WorldNodes), make([]int64, m.WorldNodes)
	for _, f := range m.Files {
		for _, n := range f.Nodes {
			files[n]++
			bytes[n] += f.Size
		}
	}
	for i, p := range m.Parts {
		if files[i] != p.Files || bytes[i] != p.Bytes {
			problems = append(problems, fmt.Errorf("job manifest: part %d has %d files of %d bytes, but %d files of %d bytes list node %d",
				i, p.Files, p.Bytes, files[i], bytes[i], i))
		}
	}
	return problems
}

// SingleFile reports whether m is a single-file checkpoint (a file renamed into the checkpoint
// directory): one file whose path is the checkpoint's name. A directory checkpoint always holds
// its marker beside its other files, so none has this shape.
func (m *Manifest) SingleFile() bool {
	return len(m.Files) == 1 && m.Files[0].Path == m.Checkpoint
}

// file returns the file of m at path (Files is sorted by path), and whether there is one.
func (m *Manifest) file(path string) (File, bool) {
	i, ok := slices.BinarySearchFunc(m.Files, path, func(f File, p string) int { return strings.Compare(f.Path, p) })
	if !ok {
		return File{}, false
	}
	return m.Files[i], true
}

// PartFiles returns the files of m that node rank has: all of them in a manifest without parts;
// in a job manifest, those whose Nodes include rank (its own and those shared with it).
func (m *Manifest) PartFiles(rank int) []File {
	if m.Parts == nil {
		return m.Files
	}
	var fs []File
	for _, f := range m.Files {
		if slices.Contains(f.Nodes, rank) {
			fs = append(fs, f)
		}
	}
	return fs
}

// Order returns what orders commits, in LATEST, restore and retention alike: the time the
// checkpoint completed (Timings.CompleteAt, the latest change time of its files; a version 1
// manifest without one uses its commit time), then the commit id. A commit is newer than
// another when it completed later; equal times are ordered by commit id, so the order is total
// and every reader agrees on it.
func (m *Manifest) Order() CommitOrder {
	at := m.CommittedAt
	if m.Timings.CompleteAt != nil {
		at = *m.Timings.CompleteAt
	}
	return CommitOrder{At: at, Commit: m.Commit}
}

// CommitOrder is the position of a commit in the order of commits (see Manifest.Order).
type CommitOrder struct {
	At     time.Time
	Commit string
}

// After reports whether o comes after p: later, or as late with a greater commit id.
func (o CommitOrder) After(p CommitOrder) bool {
	if !o.At.Equal(p.At) {
		return o.At.After(p.At)
	}
	return o.Commit > p.Commit
}

// ParseManifest decodes and validates a manifest read from the store, and sorts its files by path.
func ParseManifest(data []byte) (*Manifest, error) {
	var m Manifest
	if err := json.Unmarshal(data, &m); err != nil {
		return nil, fmt.Errorf("manifest is not valid JSON: %w", err)
	}
	if err := m.Validate(); err != nil {
		return nil, fmt.Errorf("manifest of %s/%s is invalid: %w", m.Job, m.Checkpoint, err)
	}
	slices.SortFunc(m.Files, func(a, b File) int { return strings.Compare(a.Path, b.Path) })
	return &m, nil
}
