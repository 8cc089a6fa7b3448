package checkpoint

import (
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
