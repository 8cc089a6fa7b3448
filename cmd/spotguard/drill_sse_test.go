package main

import (
	"os"
	"path/filepath"
	"testing"
)

// TestDrillConfigKeepsSSEForS3Only: a drill reads the installed configuration, store.sse and
// store.kms_key_id included: a drill into S3 sends them, as the agent would; a drill into its
// local file:// store leaves them out instead of failing on "store.sse is only for an s3://
// store".
func TestDrillConfigKeepsSSEForS3Only(t *testing.T) {
	dir := t.TempDir()
	conf := filepath.Join(dir, "spotguard.yaml")
	if err := os.WriteFile(conf, []byte("store:\n  sse: aws:kms\n  kms_key_id: alias/ckpt\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	for _, c := range []struct {
		store        string
		wantSSE, key string
	}{
		{"file://" + filepath.Join(dir, "store"), "", ""},
		{"s3://bucket/drills", "aws:kms", "alias/ckpt"},
	} {
		p := drillPlan{store: c.store, job: "drill-1", configFlags: &configFlags{path: conf}}
		cfg, _, err := drillConfig(p, filepath.Join(dir, "pid"), filepath.Join(dir, "ckpt"), filepath.Join(dir, "run"), "http://127.0.0.1:1")
		if err != nil {
			t.Fatalf("Got(%s) drillConfig = %v; want no error", c.store, err)
		}
		if got := cfg.S3Options(); got.SSE != c.wantSSE || got.KMSKeyID != c.key {
			t.Errorf("Got(%s) SSE, KMS key = %q, %q; want %q, %q", c.store, got.SSE, got.KMSKeyID, c.wantSSE, c.key)
		}
	}
}
