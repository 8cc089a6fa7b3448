package agent

import (
	"strings"
	"testing"

	"github.com/spotguard/spotguard/checkpoint"
)

// TestStoreSSE: store.sse and store.kms_key_id are validated on their own, against each other
// and against the store (run and the store commands alike), and reach the store's options.
func TestStoreSSE(t *testing.T) {
	dir := t.TempDir()
	base := []string{"SPOTGUARD_TRAINER_UNIT=trainer.service", "SPOTGUARD_CHECKPOINT_DIR=" + dir, "SPOTGUARD_STORE_JOB=run-1"}
	for _, c := range []struct {
		name     string
		env      []string
		want     checkpoint.S3Options // SSE and KMSKeyID of S3Options() when valid
		problems []string             // each a problem Validate and ValidateStore report
	}{
		{name: "default", env: []string{"SPOTGUARD_STORE_URL=s3://b/p"}},
		{name: "sse-s3", env: []string{"SPOTGUARD_STORE_URL=s3://b/p", "SPOTGUARD_STORE_SSE=AES256"}, want: checkpoint.S3Options{SSE: "AES256"}},
		{name: "sse-kms", env: []string{"SPOTGUARD_STORE_URL=s3://b/p", "SPOTGUARD_STORE_SSE=aws:kms"}, want: checkpoint.S3Options{SSE: "aws:kms"}},
		{name: "sse-kms_with_key", env: []string{"SPOTGUARD_STORE_URL=s3://b/p", "SPOTGUARD_STORE_SSE=aws:kms", "SPOTGUARD_STORE_KMS_KEY_ID=alias/ckpt"},
			want: checkpoint.S3Options{SSE: "aws:kms", KMSKeyID: "alias/ckpt"}},
		{name: "unknown_algorithm", env: []string{"SPOTGUARD_STORE_URL=s3://b/p", "SPOTGUARD_STORE_SSE=aes256"},
			problems: []string{`store.sse: "aes256" from SPOTGUARD_STORE_SSE: want empty, AES256 or aws:kms`}},
		{name: "key_without_kms", env: []string{"SPOTGUARD_STORE_URL=s3://b/p", "SPOTGUARD_STORE_SSE=AES256", "SPOTGUARD_STORE_KMS_KEY_ID=alias/ckpt"},
			problems: []string{`store.kms_key_id: "alias/ckpt" from SPOTGUARD_STORE_KMS_KEY_ID is only for store.sse aws:kms; store.sse is "AES256" from SPOTGUARD_STORE_SSE`}},
		{name: "key_alone", env: []string{"SPOTGUARD_STORE_URL=s3://b/p", "SPOTGUARD_STORE_KMS_KEY_ID=alias/ckpt"},
			problems: []string{`store.kms_key_id: "alias/ckpt" from SPOTGUARD_STORE_KMS_KEY_ID is only for store.sse aws:kms; store.sse is "" from `}},
		{name: "key_with_spaces", env: []string{"SPOTGUARD_STORE_URL=s3://b/p", "SPOTGUARD_STORE_SSE=aws:kms", "SPOTGUARD_STORE_KMS_KEY_ID=alias/my key"},
			problems: []string{`store.kms_key_id: "alias/my key" from SPOTGUARD_STORE_KMS_KEY_ID: want a key ID`}},
		{name: "file_store", env: []string{"SPOTGUARD_STORE_URL=file://" + dir + "/store", "SPOTGUARD_STORE_SSE=AES256"},
			problems: []string{"store.sse: AES256 is only for an s3:// store; store.url is file://"}},
	} {
		t.Run(c.name, func(t *testing.T) {
			cfg := mustLoad(t, LoadOptions{Environ: append(append([]string{}, base...), c.env...)})
			for name, err := range map[string]error{"Validate": cfg.Validate(), "ValidateStore": cfg.ValidateStore()} {
				if len(c.problems) == 0 && err != nil {
					t.Errorf("Got(%v) %s() = %v; want nil", c.env, name, err)
				}
				for _, p := range c.problems {
					if err == nil || !strings.Contains(err.Error(), p) {
						t.Errorf("Got(%v) %s() = %v; want a problem containing %q", c.env, name, err, p)
					}
				}
				if err != nil && strings.Count(err.Error(), "store.kms_key_id") > 1 {
					t.Errorf("Got(%v) %s() = %v; want store.kms_key_id named once", c.env, name, err)
				}
			}
			if len(c.problems) > 0 {
				return
			}
			got := cfg.S3Options()
			want := checkpoint.S3Options{PartSize: 64 << 20, Concurrency: 128, SSE: c.want.SSE, KMSKeyID: c.want.KMSKeyID}
			if got != want {
				t.Errorf("Got(%v) S3Options() = %+v; want %+v", c.env, got, want)
			}
		})
	}
}
