package checkpoint

import (
	"encoding/json"
	"errors"
	"fmt"
	"path"
	"strings"
	"time"
)

// ManifestVersion is the version of the manifest format this package writes and reads.
const ManifestVersion = 1

// Manifest lists a committed checkpoint. It is written last, once; its presence is what makes
// the checkpoint exist.
type Manifest struct {
	Version    int    `json:"version"`
	Job        string `json:"job"`
	Checkpoint string `json:"checkpoint"`
	// Files are the checkpoint's files, sorted by path. Paths are relative, slash-separated.
	Files      []File `json:"files"`
	TotalBytes int64  `json:"total_bytes"`
	Host       Host   `json:"host"`
	// Trigger says why it was committed: "periodic" (the trainer saved on its own), "notice"
	// (after an interruption notice), "sync" (asked for with SIGUSR1) or "recovery" (found
	// complete but uncommitted at start-up).
	Trigger string `json:"trigger"`
	// Notice is the key of the notice that triggered it, e.g. "spot/terminate", if any.
	Notice      string    `json:"notice,omitempty"`
	Timings     Timings   `json:"timings"`
	CommittedAt time.Time `json:"committed_at"`
}

// File is one file of a checkpoint.
type File struct {
	Path     string   `json:"path"`
	Size     int64    `json:"size"`
	Checksum Checksum `json:"checksum"`
}

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
	// CompleteAt is when the marker appeared (or the single file was renamed into place).
	CompleteAt *time.Time `json:"complete_at,omitempty"`
	// LastByteAt is when the last byte of the last file was stored.
	LastByteAt *time.Time `json:"last_byte_at,omitempty"`
	// UploadSeconds is the time spent sending, first byte to last byte.
	UploadSeconds float64 `json:"upload_seconds"`
}

// Latest is the JSON of a job's LATEST object.
type Latest struct {
	Checkpoint  string    `json:"checkpoint"`
	CommittedAt time.Time `json:"committed_at"`
}

// ValidName reports whether name can be a job or checkpoint name: one path element, not "." or
// "..", no backslash or NUL, not MetaDir.
func ValidName(name string) error {
	switch {
	case name == "" || name == "." || name == "..":
		return fmt.Errorf("%q is not a valid name", name)
	case strings.ContainsAny(name, "/\\\x00"):
		return fmt.Errorf("%q must not contain a slash, backslash or NUL", name)
	case name == MetaDir:
		return fmt.Errorf("%q is reserved", name)
	}
	return nil
}

// ValidPath reports whether rel is a safe relative file path inside a checkpoint: not absolute,
// clean, no ".." element, no backslash or NUL, not inside MetaDir.
func ValidPath(rel string) error {
	switch {
	case rel == "":
		return errors.New("empty path")
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
// names, unsafe or duplicate paths, negative sizes, unknown checksum algorithms, a total that
// does not add up.
func (m *Manifest) Validate() error {
	var problems []error
	if m.Version != ManifestVersion {
		problems = append(problems, fmt.Errorf("manifest version %d; want %d", m.Version, ManifestVersion))
	}
	if err := ValidName(m.Job); err != nil {
		problems = append(problems, fmt.Errorf("job: %w", err))
	}
	if err := ValidName(m.Checkpoint); err != nil {
		problems = append(problems, fmt.Errorf("checkpoint: %w", err))
	}
	if len(m.Files) == 0 {
		problems = append(problems, errors.New("no files"))
	}
	seen := map[string]bool{}
	var total int64
	for _, f := range m.Files {
		if err := ValidPath(f.Path); err != nil {
			problems = append(problems, fmt.Errorf("file: %w", err))
			continue
		}
		if seen[f.Path] {
			problems = append(problems, fmt.Errorf("file %q listed twice", f.Path))
		}
		seen[f.Path] = true
		if f.Size < 0 {
			problems = append(problems, fmt.Errorf("file %q: negative size %d", f.Path, f.Size))
		}
		if f.Checksum.Algorithm != ChecksumCRC32C || f.Checksum.Value == "" {
			problems = append(problems, fmt.Errorf("file %q: unsupported checksum %q", f.Path, f.Checksum.Algorithm))
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
	return errors.Join(problems...)
}

// ParseManifest decodes and validates a manifest read from the store at key.
func ParseManifest(data []byte) (*Manifest, error) {
	var m Manifest
	if err := json.Unmarshal(data, &m); err != nil {
		return nil, fmt.Errorf("manifest is not valid JSON: %w", err)
	}
	if err := m.Validate(); err != nil {
		return nil, fmt.Errorf("manifest of %s/%s is invalid: %w", m.Job, m.Checkpoint, err)
	}
	return &m, nil
}
