package checkpoint

import (
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"testing"

	"github.com/rs/zerolog"
)

// TestScanOwnerThroughALinkAUserOwns: a trainer that replaced its checkpoint.dir by a symbolic
// link to a directory of root's must not have root's files uploaded: the owner whose reading
// rights count is the link's. (Found from outside: a root-owned 0600 file was committed.)
func TestScanOwnerThroughALinkAUserOwns(t *testing.T) {
	if os.Geteuid() != 0 {
		t.Skip("needs root: the link must belong to another user")
	}
	target := t.TempDir() // root's
	scanWrite(t, filepath.Join(target, "step-1", "secret"), "root's")
	if err := os.Chmod(filepath.Join(target, "step-1", "secret"), 0o600); err != nil {
		t.Fatal(err)
	}
	scanWrite(t, filepath.Join(target, "step-1", "open"), "anyone's")
	scanWrite(t, filepath.Join(target, "step-1", "_COMPLETE"), "")
	link := filepath.Join(t.TempDir(), "ckpt")
	if err := os.Symlink(target, link); err != nil {
		t.Fatal(err)
	}
	if err := os.Lchown(link, 65534, 65534); err != nil {
		t.Fatal(err)
	}
	list, err := Scan(link, "", "", zerolog.Nop())
	if err != nil {
		t.Fatal(err)
	}
	if got, want := skipNames(list), []string{"step-1 complete=false", "step-1/open"}; !slices.Equal(got, want) {
		t.Errorf("Scan through a link nobody owns = %v; want %v (root's 0600 file left out, and so not complete)", got, want)
	}
	// A link root owns (an administrator's) changes nothing.
	if err := os.Lchown(link, 0, 0); err != nil {
		t.Fatal(err)
	}
	list, _ = Scan(link, "", "", zerolog.Nop())
	if got := skipNames(list); !slices.Contains(got, "step-1/secret") {
		t.Errorf("Scan through root's link = %v; want the secret (root reads everything)", got)
	}
}

// skipNames returns the names of the checkpoints in list and the paths of their files, as
// "name" and "name/path", for comparisons.
func skipNames(list []LocalCheckpoint) []string {
	var got []string
	for _, c := range list {
		got = append(got, fmt.Sprintf("%s complete=%v", c.Name, c.Complete))
		for _, f := range c.Files {
			got = append(got, c.Name+"/"+f.Path)
		}
	}
	return got
}

// What the owner of checkpoint.dir could not read is refused when the agent opens it to send
// it, not only when the scan saw it: a trainer that swapped its own file with another user's
// 0600 file between the scan and the open (RENAME_EXCHANGE in a directory both can write) got
// that file's bytes into the store (found from outside, 4 of 14). A file it may read, below
// directories it may search, opens.
func TestOpenLocalRefusesWhatTheOwnerCouldNotRead(t *testing.T) {
	if os.Geteuid() != 0 {
		t.Skip("needs root: the files must belong to another user than the trainer")
	}
	dir := t.TempDir()
	if err := os.Chown(dir, 12345, 12345); err != nil { // the trainer's user owns checkpoint.dir
		t.Fatal(err)
	}
	write := func(rel string, mode os.FileMode, uid int) {
		t.Helper()
		p := filepath.Join(dir, rel)
		scanWrite(t, p, "secret of "+rel)
		if err := os.Chmod(p, mode); err != nil {
			t.Fatal(err)
		}
		if err := os.Chown(p, uid, uid); err != nil {
			t.Fatal(err)
		}
	}
	write("step-1/own", 0o600, 12345)
	write("step-1/root-0600", 0o600, 0)
	write("step-1/root-0644", 0o644, 0)
	write("step-1/locked/in", 0o644, 0)
	if err := os.Chmod(filepath.Join(dir, "step-1", "locked"), 0o700); err != nil { // root's, 0700
		t.Fatal(err)
	}
	for rel, want := range map[string]error{
		"step-1/own":       nil,
		"step-1/root-0644": nil,
		"step-1/root-0600": errScanUnreadable,
		"step-1/locked/in": errScanUnreadable,
	} {
		f, _, err := openLocal(dir, rel)
		if f != nil {
			f.Close()
		}
		if want == nil && err != nil || want != nil && (!errors.Is(err, want) || !errors.Is(err, errUnusable)) {
			t.Errorf("openLocal(%s) = %v; want %v", rel, err, want)
		}
		if _, err := hashFile(t.Context(), dir, rel); (err == nil) != (want == nil) {
			t.Errorf("hashFile(%s) = %v; want it read only if the owner could", rel, err)
		}
	}
}
