package checkpoint

import (
	"bytes"
	"errors"
	"strings"
	"testing"
	"time"

	"github.com/rs/zerolog"
)

// An object at J/LATEST far larger than any LATEST (a checkpoint file copied there by mistake)
// was read whole into memory, by the agent at every commit and by every restore and list. It is
// not read: it is a problem of the job, as a LATEST that is not JSON is, restore takes the newest
// commit, and the next commit replaces it. Against the file store and a real S3 server.
func TestLatestFarTooLargeIsNotRead(t *testing.T) {
	peer := s3StartPeer(t)
	stores := map[string]func(t *testing.T) Store{
		"file": func(t *testing.T) Store {
			s, err := NewFileStore(t.TempDir())
			if err != nil {
				t.Fatal(err)
			}
			return s
		},
		"s3": func(t *testing.T) Store {
			return peer.openS3(t, peer.endpoint, strings.ReplaceAll(t.Name(), "/", "-"), S3Options{})
		},
	}
	for name, open := range stores {
		t.Run(name, func(t *testing.T) {
			s := open(t)
			t0 := restoreTestT0
			restoreTestCommitTo(t, s, restoreTestJob, "step-1", t0, restoreTestFiles(1))
			restoreTestCommitTo(t, s, restoreTestJob, "step-2", t0.Add(time.Minute), restoreTestFiles(2))
			huge := bytes.Repeat([]byte("not a pointer "), (2<<20)/14)
			if _, err := s.PutBytes(t.Context(), LatestKey(restoreTestJob), huge, Cond{}); err != nil {
				t.Fatal(err)
			}

			data, etag, err := s.GetBytes(t.Context(), LatestKey(restoreTestJob))
			if !errors.Is(err, ErrTooLarge) || data != nil || etag == "" || !strings.Contains(err.Error(), "more than a LATEST pointer can be (1.0 MiB)") {
				t.Errorf("GetBytes(LATEST of %d bytes) = %d bytes, etag %q, %v; want ErrTooLarge with its ETag, saying the limit", len(huge), len(data), etag, err)
			}
			st, err := ReadJob(t.Context(), s, restoreTestJob)
			if err != nil {
				t.Fatalf("ReadJob: %v; want the LATEST as a problem of the job", err)
			}
			if len(st.Problems) != 1 || !strings.Contains(st.Problems[0].Error(), LatestKey(restoreTestJob)+" is 2.0 MiB, more than a LATEST pointer can be") {
				t.Errorf("problems %v; want the LATEST named too large", st.Problems)
			}
			to := t.TempDir()
			res, err := Restore(t.Context(), s, RestoreOptions{Job: restoreTestJob, To: to, Logger: zerolog.Nop()})
			if err != nil || res.Checkpoint != "step-2" {
				t.Errorf("Restore with a LATEST too large = %+v, %v; want step-2, the newest", res, err)
			}

			m3 := restoreTestCommitTo(t, s, restoreTestJob, "step-3", t0.Add(2*time.Minute), restoreTestFiles(3))
			if moved, err := advanceLatest(t.Context(), s, m3, Host{}, nil); !moved || err != nil {
				t.Errorf("advanceLatest over a LATEST too large = %v, %v; want it replaced", moved, err)
			}
			if l := readLatest(t, s); l.Checkpoint != "step-3" {
				t.Errorf("LATEST = %+v; want step-3", l)
			}
		})
	}
}
