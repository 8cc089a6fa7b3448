package checkpoint

import (
	"bufio"
	"bytes"
	"encoding/json"
	"fmt"
	"os"
	"path/filepath"
	"reflect"
	"sync"
	"testing"

	"github.com/rs/zerolog"
)

// scanLogs collects zerolog JSON output; it is safe for concurrent use.
type scanLogs struct {
	mu sync.Mutex
	b  bytes.Buffer
}

func (l *scanLogs) Write(p []byte) (int, error) {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.b.Write(p)
}

// lines returns the parsed log lines with the given level and message.
func (l *scanLogs) lines(t testing.TB, level, msg string) []map[string]any {
	t.Helper()
	l.mu.Lock()
	defer l.mu.Unlock()
	var out []map[string]any
	sc := bufio.NewScanner(bytes.NewReader(l.b.Bytes()))
	for sc.Scan() {
		var m map[string]any
		if err := json.Unmarshal(sc.Bytes(), &m); err != nil {
			t.Fatalf("log line %q is not JSON: %v", sc.Text(), err)
		}
		if m["level"] == level && m["message"] == msg {
			out = append(out, m)
		}
	}
	return out
}

// countPaths counts the lines by their "path" field.
func (l *scanLogs) countPaths(t testing.TB, level, msg string) map[string]int {
	t.Helper()
	n := map[string]int{}
	for _, m := range l.lines(t, level, msg) {
		p, _ := m["path"].(string)
		n[p]++
	}
	return n
}

func (l *scanLogs) String() string {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.b.String()
}

// The fixed log messages the tests look for.
const (
	scanMsgSpecial = "skipping a file that is not a regular file or directory"
	scanMsgBadName = "skipping a file that cannot be used"
)

// scanWrite writes data to path, making its parent directories.
func scanWrite(t testing.TB, path, data string) {
	t.Helper()
	if err := os.MkdirAll(filepath.Dir(path), 0o755); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(path, []byte(data), 0o644); err != nil {
		t.Fatal(err)
	}
}

// scanFileOf returns the LocalFile for the file at dir/rel, as Lstat sees it.
func scanFileOf(t testing.TB, dir, rel string) LocalFile {
	t.Helper()
	fi, err := os.Lstat(filepath.Join(dir, filepath.FromSlash(rel)))
	if err != nil {
		t.Fatal(err)
	}
	return LocalFile{Path: rel, Size: fi.Size(), ModTime: fi.ModTime(), ID: FileIDOf(fi)}
}

func TestScan(t *testing.T) {
	dir := t.TempDir()
	outside := t.TempDir()
	scanWrite(t, filepath.Join(outside, "secret"), "secret")

	// step-2: complete, with nested files and things to skip.
	scanWrite(t, filepath.Join(dir, "step-2", "b.bin"), "bb")
	scanWrite(t, filepath.Join(dir, "step-2", "a.bin"), "a")
	scanWrite(t, filepath.Join(dir, "step-2", "sub", "c.bin"), "ccc")
	scanWrite(t, filepath.Join(dir, "step-2", "sub", MetaDir, "y"), "y") // valid below the top
	scanWrite(t, filepath.Join(dir, "step-2", ".a.bin.tmp"), "partial")
	scanWrite(t, filepath.Join(dir, "step-2", ".tmpdir.tmp", "z"), "z")
	scanWrite(t, filepath.Join(dir, "step-2", MetaDir, "manifest.json"), "{}")
	scanWrite(t, filepath.Join(dir, "step-2", "_COMPLETE"), "")
	// step-1: not complete; a marker below the top does not count.
	scanWrite(t, filepath.Join(dir, "step-1", "x.bin"), "x")
	scanWrite(t, filepath.Join(dir, "step-1", "nested", "_COMPLETE"), "")
	// step-3: its marker is a symbolic link, so it is not complete.
	scanWrite(t, filepath.Join(dir, "step-3", "w.bin"), "w")
	if err := os.Symlink(filepath.Join(outside, "secret"), filepath.Join(dir, "step-3", "_COMPLETE")); err != nil {
		t.Skipf("cannot make symbolic links here: %v", err)
	}
	// step-4: a symbolic link in it (to a file, to a directory) stands for a file of the
	// checkpoint that is never stored: not complete, though its marker is there.
	scanWrite(t, filepath.Join(dir, "step-4", "v.bin"), "v")
	scanWrite(t, filepath.Join(dir, "step-4", "_COMPLETE"), "")
	if err := os.Symlink(filepath.Join(outside, "secret"), filepath.Join(dir, "step-4", "link.bin")); err != nil {
		t.Fatal(err)
	}
	if err := os.Symlink(outside, filepath.Join(dir, "step-4", "linkdir")); err != nil {
		t.Fatal(err)
	}
	// Top level: a single-file checkpoint, a file that is none, things to skip.
	scanWrite(t, filepath.Join(dir, "model.pt"), "model")
	scanWrite(t, filepath.Join(dir, "notes.txt"), "notes")
	scanWrite(t, filepath.Join(dir, ".model2.pt.tmp"), "partial")
	scanWrite(t, filepath.Join(dir, MetaDir, "state.json"), "{}")
	if err := os.Symlink(filepath.Join(dir, "step-2"), filepath.Join(dir, "latest")); err != nil {
		t.Fatal(err)
	}
	if err := os.Symlink(filepath.Join(outside, "secret"), filepath.Join(dir, "evil.pt")); err != nil {
		t.Fatal(err)
	}
	backslash := filepath.Join(dir, `back\slash.pt`)
	haveBackslash := os.WriteFile(backslash, []byte("b"), 0o644) == nil

	logs := &scanLogs{}
	got, err := Scan(dir, "", "*.pt", zerolog.New(logs))
	if err != nil {
		t.Fatalf("Scan() error: %v", err)
	}

	marker2, err := os.Lstat(filepath.Join(dir, "step-2", "_COMPLETE"))
	if err != nil {
		t.Fatal(err)
	}
	model := scanFileOf(t, dir, "model.pt")
	want := []LocalCheckpoint{
		{Name: "model.pt", Files: []LocalFile{model}, Complete: true, CompleteAt: model.ModTime, Single: true},
		{Name: "step-1", Files: []LocalFile{
			scanFileOf(t, filepath.Join(dir, "step-1"), "nested/_COMPLETE"),
			scanFileOf(t, filepath.Join(dir, "step-1"), "x.bin"),
		}},
		{Name: "step-2", Files: []LocalFile{
			scanFileOf(t, filepath.Join(dir, "step-2"), "a.bin"),
			scanFileOf(t, filepath.Join(dir, "step-2"), "b.bin"),
			scanFileOf(t, filepath.Join(dir, "step-2"), "sub/_spotguard/y"),
			scanFileOf(t, filepath.Join(dir, "step-2"), "sub/c.bin"),
		}, Complete: true, CompleteAt: marker2.ModTime()},
		{Name: "step-3", Files: []LocalFile{scanFileOf(t, filepath.Join(dir, "step-3"), "w.bin")}},
		{Name: "step-4", Files: []LocalFile{scanFileOf(t, filepath.Join(dir, "step-4"), "v.bin")}},
	}
	if !reflect.DeepEqual(got, want) {
		t.Errorf("Scan() =\n%+v\nwant\n%+v", got, want)
	}

	special := logs.countPaths(t, "warn", scanMsgSpecial)
	for _, rel := range []string{"latest", "evil.pt"} {
		if n := special[filepath.Join(dir, rel)]; n != 1 {
			t.Errorf("warn lines %q for %s = %d; want 1\n%s", scanMsgSpecial, rel, n, logs)
		}
	}
	for _, m := range logs.lines(t, "warn", scanMsgSpecial) {
		if m["type"] != "symlink" {
			t.Errorf("skip line type = %v; want symlink", m["type"])
		}
	}
	// A marker that is a symbolic link is skipped too, and its line says it is the marker.
	markers := logs.countPaths(t, "warn", msgMarkerNotRegular)
	if n := markers[filepath.Join(dir, "step-3", "_COMPLETE")]; n != 1 || len(markers) != 1 {
		t.Errorf("warn lines %q = %v; want 1, for step-3/_COMPLETE\n%s", msgMarkerNotRegular, markers, logs)
	}
	bad := logs.countPaths(t, "warn", scanMsgBadName)
	wantBad := []string{filepath.Join(dir, "step-2", MetaDir), filepath.Join(dir, "step-4", "link.bin"), filepath.Join(dir, "step-4", "linkdir")}
	if haveBackslash {
		wantBad = append(wantBad, backslash)
	}
	for _, p := range wantBad {
		if bad[p] != 1 {
			t.Errorf("warn lines %q for %s = %d; want 1\n%s", scanMsgBadName, p, bad[p], logs)
		}
	}
	if len(special)+len(markers)+len(bad) != 3+len(wantBad) {
		t.Errorf("got %d skip lines; want %d\n%s", len(special)+len(markers)+len(bad), 3+len(wantBad), logs)
	}
}

func TestScanMarkerAndPattern(t *testing.T) {
	dir := t.TempDir()
	scanWrite(t, filepath.Join(dir, "step-1", "__0_0.distcp"), "rank0")
	scanWrite(t, filepath.Join(dir, "step-1", ".metadata"), "meta")
	scanWrite(t, filepath.Join(dir, "step-1", ".metadata.tmp"), "partial")
	scanWrite(t, filepath.Join(dir, "model.pt"), "model")

	tests := []struct {
		name, marker, pattern string
		want                  []string // name:complete:files
	}{
		{"default marker, no pattern", "", "", []string{"step-1:false:2"}},
		{"dcp marker", ".metadata", "", []string{"step-1:true:1"}},
		{"dcp marker and pattern", ".metadata", "*.pt", []string{"model.pt:true:1", "step-1:true:1"}},
		{"pattern that matches nothing", ".metadata", "*.safetensors", []string{"step-1:true:1"}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			list, err := Scan(dir, tt.marker, tt.pattern, zerolog.Nop())
			if err != nil {
				t.Fatalf("Scan() error: %v", err)
			}
			var got []string
			for _, c := range list {
				got = append(got, fmt.Sprintf("%s:%v:%d", c.Name, c.Complete, len(c.Files)))
			}
			if !reflect.DeepEqual(got, tt.want) {
				t.Errorf("Scan(%q, %q) = %v; want %v", tt.marker, tt.pattern, got, tt.want)
			}
		})
	}
}

func TestScanErrors(t *testing.T) {
	dir := t.TempDir()
	file := filepath.Join(dir, "file")
	scanWrite(t, file, "x")
	tests := []struct {
		name, dir, marker, pattern string
	}{
		{"missing dir", filepath.Join(dir, "missing"), "", ""},
		{"dir is a file", file, "", ""},
		{"bad pattern", dir, "", "[a-"},
		{"pattern with a slash", dir, "", "sub/*.pt"},
		{"marker with a slash", dir, "a/b", ""},
		{"marker dot-dot", dir, "..", ""},
		{"marker skipped as temporary", dir, ".done.tmp", ""},
		{"marker is MetaDir", dir, MetaDir, ""},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			if got, err := Scan(tt.dir, tt.marker, tt.pattern, zerolog.Nop()); err == nil {
				t.Errorf("Scan(%q, %q, %q) = %v, nil; want an error", tt.dir, tt.marker, tt.pattern, got)
			}
		})
	}
}

func TestScanEmpty(t *testing.T) {
	got, err := Scan(t.TempDir(), "", "*.pt", zerolog.Nop())
	if err != nil || len(got) != 0 {
		t.Errorf("Scan(empty) = %v, %v; want nothing, nil", got, err)
	}
}

func TestScanUnreadableDirIsNotComplete(t *testing.T) {
	if os.Geteuid() == 0 {
		t.Skip("running as root: permissions do not stop reading a directory")
	}
	dir := t.TempDir()
	scanWrite(t, filepath.Join(dir, "step-1", "a.bin"), "a")
	scanWrite(t, filepath.Join(dir, "step-1", "locked", "b.bin"), "b")
	scanWrite(t, filepath.Join(dir, "step-1", "_COMPLETE"), "")
	locked := filepath.Join(dir, "step-1", "locked")
	if err := os.Chmod(locked, 0); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { os.Chmod(locked, 0o755) })

	logs := &scanLogs{}
	got, err := Scan(dir, "", "", zerolog.New(logs))
	if err != nil {
		t.Fatalf("Scan() error: %v", err)
	}
	if len(got) != 1 || got[0].Complete {
		t.Errorf("Scan() = %+v; want step-1 not complete", got)
	}
	if n := len(logs.lines(t, "error", "checkpoint directory could not be read in full; not complete")); n != 1 {
		t.Errorf("error lines = %d; want 1\n%s", n, logs)
	}
}

// A staging directory renamed into place while it is read, its marker written in it after the
// rename, is not complete under its staging name: it was read through a handle, and the marker
// came under the new name (found from outside: "checkpoint complete" said of the staging name,
// in 42 of 534 saves). Read again under its new name, it is.
func TestScanOfADirectoryRenamedWhileItIsReadIsNotCompleteUnderItsOldName(t *testing.T) {
	dir := t.TempDir()
	scanWrite(t, filepath.Join(dir, "step-1.tmp", "w.bin"), "weights")
	s, done, err := newScanWalker(dir, "", "", zerolog.Nop())
	if err != nil {
		t.Fatal(err)
	}
	defer done()
	s.opened = func(rel string) {
		if rel != "step-1.tmp" {
			return
		}
		if err := os.Rename(filepath.Join(dir, "step-1.tmp"), filepath.Join(dir, "step-1")); err != nil {
			t.Fatal(err)
		}
		scanWrite(t, filepath.Join(dir, "step-1", scanDefaultMarker), "")
	}
	if f, ok := s.top("step-1.tmp"); ok && f.marker != nil {
		t.Errorf("top(step-1.tmp) = %+v, complete; want it not found: renamed away while it was read, its marker written after", f)
	}
	s.opened = nil
	if f, ok := s.top("step-1"); !ok || f.marker == nil || len(f.files) != 1 {
		t.Errorf("top(step-1) = %+v, %v; want it complete with its file", f, ok)
	}
}
