package e2e

import (
	"encoding/json"
	"fmt"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"
)

// objectVersions is what `aws s3api list-object-versions` says of the keys under a prefix.
type objectVersions struct {
	Versions []struct {
		Key, VersionId string
		IsLatest       bool
	}
	DeleteMarkers []struct {
		Key, VersionId string
		IsLatest       bool
	}
}

// A bucket with versioning, as many organisations turn on for every bucket: the agent commits,
// its retention deletes, and list, check and restore see the current versions only. What
// retention deleted stays as noncurrent versions under delete markers (billed until a lifecycle
// rule expires them, docs/s3.md), and removing a commit's delete markers brings it back:
// `spotguard list` shows it and `spotguard restore --commit` restores it, byte for byte.
func TestVersionedBucket(t *testing.T) {
	needPeers(t)
	s3 := startS3Versioned(t)
	ts := newS3TestStore(s3, "ver")
	const job = "versioned"
	sim := quietIMDS(t)

	dir := t.TempDir()
	ap := startStoreAgent(t, sim, dir, ts, job, noTrainer, "SPOTGUARD_CHECKPOINT_KEEP=2")
	commits := map[string]string{}
	for step := 1; step <= 4; step++ {
		name := fmt.Sprintf("step-%d", step)
		writeCheckpoint(t, dir, name, map[string][]byte{"model.bin": randomBytes(t, 6<<20)}, fmt.Sprintf(`{"step": %d}`+"\n", step))
		commits[name] = waitCommitted(t, ap, ts, job, name, 15*time.Second)
	}
	listed := func() []string { return commitNames(ts.list(t, job)) }
	want := []string{"step-4/" + commits["step-4"], "step-3/" + commits["step-3"]}
	eventually(t, 15*time.Second, "retention to keep the two newest", func() bool { return slices.Equal(listed(), want) })
	ap.stop(t)
	ts.check(t, job)
	to := t.TempDir()
	ts.restore(t, job, to)
	sameTree(t, filepath.Join(dir, "step-4"), filepath.Join(to, "step-4"))

	// What retention deleted is still there, under delete markers.
	prefix := "ver/" + job + "/step-1/" + commits["step-1"] + "/"
	var v objectVersions
	if err := json.Unmarshal([]byte(s3.aws(t, "s3api", "list-object-versions", "--bucket", s3Bucket, "--prefix", prefix, "--output", "json")), &v); err != nil {
		t.Fatal(err)
	}
	var kept, markers []string
	for _, o := range v.Versions {
		if !o.IsLatest {
			kept = append(kept, strings.TrimPrefix(o.Key, prefix))
		}
	}
	for _, m := range v.DeleteMarkers {
		if m.IsLatest {
			markers = append(markers, strings.TrimPrefix(m.Key, prefix))
		}
	}
	slices.Sort(kept)
	slices.Sort(markers)
	if objs := []string{"_COMPLETE", "_spotguard/manifest.json", "model.bin"}; !slices.Equal(kept, objs) || !slices.Equal(markers, objs) {
		t.Fatalf("step-1's commit has noncurrent versions of %v under delete markers of %v; want both %v", kept, markers, objs)
	}

	// Removing its delete markers brings the commit back.
	for _, m := range v.DeleteMarkers {
		s3.aws(t, "s3api", "delete-object", "--bucket", s3Bucket, "--key", m.Key, "--version-id", m.VersionId)
	}
	if got, want := listed(), append(want, "step-1/"+commits["step-1"]); !slices.Equal(got, want) {
		t.Errorf("spotguard list after the delete markers went: %v; want %v", got, want)
	}
	ts.check(t, job)
	to = t.TempDir()
	ts.restore(t, job, to, "--checkpoint", "step-1", "--commit", commits["step-1"])
	sameTree(t, filepath.Join(dir, "step-1"), filepath.Join(to, "step-1"))
}
