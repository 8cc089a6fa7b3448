package agent

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"net/http"
	"net/http/httptest"
	"net/url"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"testing/synctest"
	"time"

	smithyhttp "github.com/aws/smithy-go/transport/http"
	"github.com/rs/zerolog"

	"github.com/spotguard/spotguard/checkpoint"
)

// newStoreAgent builds (does not run) an agent whose store is s, logging into logs.
func newStoreAgent(t *testing.T, s checkpoint.Store, logs *syncBuffer) *Agent {
	t.Helper()
	cfg := mustLoad(t, LoadOptions{Environ: []string{"SPOTGUARD_HTTP_LISTEN=", "SPOTGUARD_TRAINER_MATCH=no-such-trainer",
		"SPOTGUARD_AGENT_RUNTIME_DIR=" + t.TempDir(), "SPOTGUARD_CHECKPOINT_DIR=" + t.TempDir(),
		"SPOTGUARD_STORE_URL=s3://nosuchbucket/x", "SPOTGUARD_STORE_JOB=job1", "SPOTGUARD_METRICS_CLOUDWATCH=false"}})
	a, err := New(cfg, Deps{Logger: zerolog.New(logs), IMDS: newFakeIMDS(),
		OpenStore: func(string, checkpoint.S3Options) (checkpoint.Store, error) { return s, nil }})
	if err != nil {
		t.Fatal(err)
	}
	return a
}

// get serves one request of the agent's handler.
func get(a *Agent, path string) (int, string) {
	rec := httptest.NewRecorder()
	a.Handler().ServeHTTP(rec, httptest.NewRequest(http.MethodGet, path, nil))
	return rec.Code, rec.Body.String()
}

// A bucket that does not exist: /healthz 503 naming the store and the error, the same in
// /status, the metrics and the STATUS line.
func TestStoreProbeFailureIsUnhealthy(t *testing.T) {
	s := newFaultyStore(t)
	s.url = "s3://nosuchbucket/x"
	a := newStoreAgent(t, s, &syncBuffer{})
	// Healthy only once the store took a write (DESIGN, Health): not before the first probe.
	if code, body := get(a, "/healthz"); code != http.StatusServiceUnavailable || !strings.Contains(body, "has not finished yet") {
		t.Errorf("/healthz before the first probe = %d %s; want 503, not probed yet", code, body)
	}
	s.set(ProbeList, s3Err(404, "NoSuchBucket", "The specified bucket does not exist"))
	if _, done := a.store.prober.Check(t.Context()); !done {
		t.Fatal("probe not done")
	}

	code, body := get(a, "/healthz")
	var v healthVerdict
	if err := json.Unmarshal([]byte(body), &v); err != nil {
		t.Fatalf("/healthz body %q: %v", body, err)
	}
	if code != http.StatusServiceUnavailable || v.Healthy || len(v.Reasons) != 1 {
		t.Fatalf("/healthz = %d %s; want 503 with one reason", code, body)
	}
	for _, want := range []string{"s3://nosuchbucket/x", "job1", "list", "NoSuchBucket", "create it"} {
		if !strings.Contains(v.Reasons[0], want) {
			t.Errorf("/healthz reason %q lacks %q", v.Reasons[0], want)
		}
	}

	st := a.Status()
	if st.Store == nil || st.Store.OK || st.Store.LastProbe == nil || st.Store.FailedStep != ProbeList ||
		st.Store.Reason != StoreNotFound || !strings.Contains(st.Store.Error, "NoSuchBucket") || st.Store.URL != "s3://nosuchbucket/x" {
		t.Errorf("/status store = %+v; want the failed list with not_found", st.Store)
	}
	if st.Health.Healthy || len(st.Health.Reasons) != 1 {
		t.Errorf("/status health = %+v; want unhealthy", st.Health)
	}
	metrics := scrape(t, a)
	for _, want := range []string{"spotguard_store_up 0", "spotguard_store_probe_failures_total 1", "spotguard_healthy 0",
		`spotguard_checkpoint_upload_errors_total{reason="denied"} 0`} {
		if !strings.Contains(metrics, want) {
			t.Errorf("/metrics lacks %q", want)
		}
	}
	if line := a.statusLine(t.Context()); !strings.HasPrefix(line, "UNHEALTHY: store s3://nosuchbucket/x: list failed: NoSuchBucket; watching") {
		t.Errorf("STATUS line = %q; want the store trouble first", line)
	}

	s.set(ProbeList, nil)
	a.store.prober.Check(t.Context())
	if code, body := get(a, "/healthz"); code != http.StatusOK {
		t.Errorf("/healthz after the store works again = %d %s; want 200", code, body)
	}
	if metrics := scrape(t, a); !strings.Contains(metrics, "spotguard_store_up 1") || !strings.Contains(metrics, "spotguard_healthy 1") {
		t.Errorf("/metrics after recovery lacks spotguard_store_up 1 / spotguard_healthy 1")
	}
}

// Upload failures are counted by reason, a run of identical ones is logged once a minute with a
// count, and a failure asks for a store probe.
func TestUploadErrorsCountedAndLoggedOnce(t *testing.T) {
	logs := &syncBuffer{}
	a := newStoreAgent(t, newFaultyStore(t), logs)
	for range 300 {
		a.noteUploadHealth(checkpoint.UploadEvent{Kind: checkpoint.UploadFailed, Checkpoint: "step-1", At: time.Now(),
			Err: s3Err(503, "SlowDown", "Please reduce your request rate")})
	}
	a.noteUploadHealth(checkpoint.UploadEvent{Kind: checkpoint.CheckpointFailed, Checkpoint: "step-1", At: time.Now(),
		Err: s3Err(403, "AccessDenied", "Access Denied")})
	a.noteUploadHealth(checkpoint.UploadEvent{Kind: checkpoint.UploadFailed, Checkpoint: "step-1", Err: context.Canceled})

	metrics := scrape(t, a)
	for _, want := range []string{`spotguard_checkpoint_upload_errors_total{reason="throttled"} 300`,
		`spotguard_checkpoint_upload_errors_total{reason="denied"} 1`, `spotguard_checkpoint_upload_errors_total{reason="network"} 0`} {
		if !strings.Contains(metrics, want) {
			t.Errorf("/metrics lacks %q", want)
		}
	}
	if n := strings.Count(logs.String(), `"message":"checkpoint upload failing; retrying"`); n != 2 {
		t.Errorf("failure log lines = %d; want 2 (one per kind of failure)\n%s", n, logs.String())
	}
	select {
	case <-a.store.prober.kick:
	default:
		t.Errorf("no store probe asked for after upload failures")
	}
	st := a.Status().Store
	if st.UploadErrors[StoreThrottled] != 300 || st.UploadErrors[StoreDenied] != 1 || st.LastUploadError == nil ||
		st.LastUploadError.Kind != "commit" || st.LastUploadError.Reason != StoreDenied {
		t.Errorf("/status store = %+v; want the errors by reason and the last one", st)
	}

	a.noteUploadHealth(checkpoint.UploadEvent{Kind: checkpoint.CheckpointCommitted, Checkpoint: "step-1", At: time.Now()})
	var rec map[string]any
	for _, l := range strings.Split(logs.String(), "\n") {
		if strings.Contains(l, "checkpoint committed after upload failures") {
			json.Unmarshal([]byte(l), &rec)
		}
	}
	if rec == nil || rec["failures"] != 301.0 || rec["repeats_not_logged"] != 299.0 {
		t.Errorf("recovery log = %v; want failures 301, repeats_not_logged 299", rec)
	}
}

// spotDownIMDS fails every read of the spot source; the other sources answer 404 (no notice).
type spotDownIMDS struct{ down string }

func (g spotDownIMDS) Get(ctx context.Context, path string) ([]byte, bool, error) {
	if path == g.down {
		return nil, false, errors.New("imds: 500 Internal Server Error")
	}
	return nil, false, nil
}

// The spot source failing makes the agent unhealthy although every other source answers; another
// source failing is a warning. Either is named in the STATUS line.
func TestHealthzPerIMDSSource(t *testing.T) {
	for _, tc := range []struct {
		name, down  string
		wantCode    int
		wantInLine  string
		wantUnsound string // the source /status must show unhealthy
	}{
		{"spot", "spot/instance-action", http.StatusServiceUnavailable, "UNHEALTHY: IMDS spot failing for 31s; watching", "spot"},
		{"rebalance", "events/recommendations/rebalance", http.StatusOK, "IMDS rebalance failing for 31s; watching", "rebalance"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			synctest.Test(t, func(t *testing.T) {
				cfg := mustLoad(t, LoadOptions{Environ: []string{"SPOTGUARD_HTTP_LISTEN=", "SPOTGUARD_TRAINER_MATCH=no-such-trainer",
					"SPOTGUARD_AGENT_RUNTIME_DIR=" + t.TempDir()}})
				a, err := New(cfg, Deps{Logger: zerolog.Nop(), IMDS: spotDownIMDS{down: tc.down}})
				if err != nil {
					t.Fatal(err)
				}
				ctx, cancel := context.WithCancel(t.Context())
				done := make(chan error)
				go func() { done <- a.Run(ctx) }()

				passFakeTime(29 * time.Second)
				if code, body := get(a, "/healthz"); code != http.StatusOK {
					t.Errorf("/healthz after 29 s = %d %s; want 200", code, body)
				}
				passFakeTime(2 * time.Second)
				code, body := get(a, "/healthz")
				if code != tc.wantCode || !strings.Contains(body, "IMDS "+tc.name) || !strings.Contains(body, "500 Internal Server Error") {
					t.Errorf("/healthz after 31 s = %d %s; want %d naming IMDS %s and its error", code, body, tc.wantCode, tc.name)
				}
				st := a.Status()
				for src, s := range st.IMDS.Sources {
					if want := string(src) != tc.wantUnsound; s.Healthy != want {
						t.Errorf("/status imds.sources.%s.healthy = %v; want %v", src, s.Healthy, want)
					}
				}
				metrics := scrape(t, a)
				if !strings.Contains(metrics, `spotguard_imds_source_up{source="`+tc.wantUnsound+`"} 0`) {
					t.Errorf("/metrics lacks spotguard_imds_source_up 0 for %s", tc.wantUnsound)
				}
				// IMDS is up as /healthz judges it, in /metrics and /status alike (it said 1 while
				// the spot source had failed for 40 s, and /healthz 503).
				up := tc.wantCode == http.StatusOK
				if want := fmt.Sprintf("spotguard_imds_up %d", map[bool]int{false: 0, true: 1}[up]); !strings.Contains(metrics, want) {
					t.Errorf("/metrics lacks %q", want)
				}
				if st.IMDS.Healthy != up {
					t.Errorf("/status imds.healthy = %v; want %v", st.IMDS.Healthy, up)
				}
				if line := a.statusLine(ctx); !strings.HasPrefix(line, tc.wantInLine) {
					t.Errorf("STATUS line = %q; want it to start with %q", line, tc.wantInLine)
				}
				cancel()
				if err := <-done; err != nil {
					t.Errorf("Run() = %v; want nil", err)
				}
			})
		})
	}
}

// attemptStore is a faultyStore that tells of failed attempts, as checkpoint.S3Store does.
type attemptStore struct {
	*faultyStore
	onFailed func(error)
}

func (s *attemptStore) OnAttemptError(f func(error)) { s.onFailed = f }

// A store that stops answering: the SDK retries each request for minutes before the uploader
// hears of it, so the agent hears of each failed attempt and has the store probed at once (then
// /healthz says 503 within a probe's time). An answer, such as not found, probes nothing.
// (Found from outside: with the store hung, /healthz said healthy for 2 to 4 minutes, through a
// whole spot notice.)
func TestStoreAttemptFailureProbesTheStore(t *testing.T) {
	s := &attemptStore{faultyStore: newFaultyStore(t)}
	logs := &syncBuffer{}
	a := newStoreAgent(t, s, logs)
	if s.onFailed == nil {
		t.Fatal("the agent did not ask the store for its failed attempts")
	}
	s.onFailed(s3Err(404, "NoSuchKey", "The specified key does not exist."))
	if len(a.store.prober.kick) != 0 {
		t.Error("a not-found answer had the store probed")
	}
	timeout := &url.Error{Op: "Put", URL: "http://s3/x", Err: errors.New("net/http: timeout awaiting response headers")}
	s.onFailed(&smithyhttp.RequestSendError{Err: timeout})
	if len(a.store.prober.kick) != 1 {
		t.Error("a request never answered did not have the store probed")
	}
	s.onFailed(&smithyhttp.RequestSendError{Err: timeout})
	if n := strings.Count(logs.String(), "a store request failed"); n != 1 {
		t.Errorf("%d log lines for two failed attempts within a minute; want 1:\n%s", n, logs)
	}
}

// In a multi-node job a notice's checkpoint is durable once the job's checkpoint is committed,
// not when this node's part is: the part alone said "committed", time to durable and the newest
// commit's age were set, while the job checkpoint was given up. (Found from outside.)
func TestMultiNodeNoticeDurableWithTheJobCheckpoint(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		a, _, stop := runAgentWithASpotNotice(t, 2*time.Minute, "SPOTGUARD_STORE_WORLD_NODES=2", "SPOTGUARD_STORE_NODE_RANK=1")
		defer stop()
		a.onUpload(checkpoint.UploadEvent{Kind: checkpoint.CheckpointComplete, Checkpoint: "step-1", At: time.Now()})
		passFakeTime(time.Second)
		now := time.Now()
		a.onUpload(checkpoint.UploadEvent{Kind: checkpoint.CheckpointCommitted, Checkpoint: "step-1", At: now,
			Manifest: &checkpoint.Manifest{Checkpoint: "step-1", Trigger: "notice", CommittedAt: now, Part: &checkpoint.Part{NodeRank: 1, WorldNodes: 2}}})
		if n, _ := a.Status().noticeByKey("spot/terminate"); n.State == StateCommitted {
			t.Errorf("notice state %s once this node's part alone is committed; want it not durable yet", n.State)
		}
		if strings.Contains(scrape(t, a), "spotguard_notice_time_to_durable_seconds_count 1") {
			t.Error("time to durable observed for a part")
		}
		passFakeTime(time.Second)
		now = time.Now()
		a.onUpload(checkpoint.UploadEvent{Kind: checkpoint.JobCheckpointCommitted, Checkpoint: "step-1", At: now,
			Manifest: &checkpoint.Manifest{Checkpoint: "step-1", Trigger: "notice", CommittedAt: now, WorldNodes: 2}})
		if n, _ := a.Status().noticeByKey("spot/terminate"); n.State != StateCommitted {
			t.Errorf("notice state %s once the job checkpoint is committed; want %s", n.State, StateCommitted)
		}
	})
}

// A job checkpoint that cannot be committed is a /healthz 503 until a job checkpoint commits; a
// later look at that old save (until part_wait passes, or its giving up) does not bring the 503
// back once a newer one committed, and one conflict is one failure, not one per look. (Found
// from outside: 503 for an hour while checkpoints committed.)
func TestJobProblemEndsWithANewerJobCheckpoint(t *testing.T) {
	a := newIdleAgent(t, "SPOTGUARD_STORE_WORLD_NODES=2", "SPOTGUARD_STORE_NODE_RANK=0")
	t0 := time.Now().Add(-10 * time.Minute)
	part := func(name string, at time.Time) *checkpoint.Manifest {
		return &checkpoint.Manifest{Checkpoint: name, Commit: "c-" + name, Timings: checkpoint.Timings{CompleteAt: &at},
			Part: &checkpoint.Part{NodeRank: 0, WorldNodes: 2}}
	}
	jobProblem := func() bool {
		return slices.ContainsFunc(a.health(time.Now()).Reasons, func(r string) bool { return strings.Contains(r, "job checkpoint step-100") })
	}
	failed := checkpoint.UploadEvent{Kind: checkpoint.JobCheckpointFailed, Checkpoint: "step-100", At: time.Now(),
		Manifest: part("step-100", t0), Err: errors.New("node rank 1 is claimed by two instances")}
	a.onUpload(failed)
	if !jobProblem() {
		t.Fatal("a job checkpoint that cannot be committed is not a /healthz reason")
	}
	newer := t0.Add(2 * time.Minute)
	a.onUpload(checkpoint.UploadEvent{Kind: checkpoint.JobCheckpointCommitted, Checkpoint: "step-200", At: time.Now(),
		Manifest: &checkpoint.Manifest{Checkpoint: "step-200", Commit: "c-step-200", Timings: checkpoint.Timings{CompleteAt: &newer}, WorldNodes: 2}})
	if jobProblem() {
		t.Error("still unhealthy after a newer job checkpoint committed")
	}
	failed.At = time.Now() // step-100 looked at again, or given up
	a.onUpload(failed)
	if jobProblem() {
		t.Error("an old save looked at again made the agent unhealthy again, after a newer job checkpoint committed")
	}
}

// newIdleAgent builds (does not run) an agent with no store, whose trainer is matched by name,
// configured by env as well, for tests that hand it upload events.
func newIdleAgent(t *testing.T, env ...string) *Agent {
	t.Helper()
	cfg := mustLoad(t, LoadOptions{Environ: append([]string{"SPOTGUARD_HTTP_LISTEN=", "SPOTGUARD_TRAINER_MATCH=train",
		"SPOTGUARD_AGENT_RUNTIME_DIR=" + t.TempDir()}, env...)})
	a, err := New(cfg, Deps{Logger: zerolog.Nop(), IMDS: newFakeIMDS()})
	if err != nil {
		t.Fatal(err)
	}
	return a
}

// A checkpoint whose marker is there but which cannot be committed (a file that cannot be
// stored) is a /healthz 503 and counted, until it or a checkpoint completed after it commits;
// one older than the newest commit is not trouble now.
func TestWithheldCheckpointIsUnhealthyUntilALaterCommit(t *testing.T) {
	a := newIdleAgent(t)
	t0 := time.Now().Add(-10 * time.Minute)
	commit := func(name string, at time.Time) {
		a.onUpload(checkpoint.UploadEvent{Kind: checkpoint.CheckpointCommitted, Checkpoint: name, At: time.Now(),
			Manifest: &checkpoint.Manifest{Checkpoint: name, Commit: "c-" + name, Trigger: "periodic", CommittedAt: time.Now(),
				Timings: checkpoint.Timings{CompleteAt: &at}}})
	}
	withheld := func() bool {
		return slices.ContainsFunc(a.health(time.Now()).Reasons, func(r string) bool {
			return strings.Contains(r, "checkpoint step-200 has its marker") && strings.Contains(r, "optimizer.pt")
		})
	}
	commit("step-100", t0)
	ev := checkpoint.UploadEvent{Kind: checkpoint.CheckpointWithheld, Checkpoint: "step-200", At: t0.Add(time.Minute),
		Err: fmt.Errorf("%w: step-200/optimizer.pt: the owner could not read it", checkpoint.ErrNotStorable)}
	a.onUpload(ev)
	if !withheld() {
		t.Fatalf("a withheld checkpoint is not a /healthz reason: %v", a.health(time.Now()).Reasons)
	}
	if v := a.health(time.Now()); v.Healthy || !slices.Contains(v.short, "checkpoint step-200 not committed: a file cannot be stored") {
		t.Errorf("health %+v; want unhealthy, saying a file of step-200 cannot be stored", v)
	}
	if !strings.Contains(scrape(t, a), "spotguard_checkpoints_withheld_total 1") {
		t.Error("spotguard_checkpoints_withheld_total is not 1")
	}
	commit("step-150", t0.Add(30*time.Second)) // older than step-200: the trouble stays
	if !withheld() {
		t.Error("healthy again after an older checkpoint committed")
	}
	commit("step-300", t0.Add(2*time.Minute))
	if withheld() {
		t.Error("still unhealthy after a later checkpoint committed")
	}
	ev.Checkpoint = "step-50" // an old one found withheld (a rescan): not trouble now
	ev.At = t0.Add(-time.Minute)
	a.onUpload(ev)
	if v := a.health(time.Now()); !v.Healthy && slices.ContainsFunc(v.Reasons, func(r string) bool { return strings.Contains(r, "step-50") }) {
		t.Errorf("a checkpoint older than the newest commit, withheld, made the agent unhealthy: %v", v.Reasons)
	}
}

// The STATUS line names a notice in force after its checkpoint committed (it said "watching"
// with a reclaim on its way), and a deadline that passed as passed (it said "deadline in -9 s").
// (Found from outside.)
func TestStatusLineNoticeInForceAfterItsCommit(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		a, ctx, stop := runAgentWithASpotNotice(t, time.Minute)
		defer stop()
		a.onUpload(checkpoint.UploadEvent{Kind: checkpoint.CheckpointComplete, Checkpoint: "step-1", At: time.Now()})
		now := time.Now()
		a.onUpload(checkpoint.UploadEvent{Kind: checkpoint.CheckpointCommitted, Checkpoint: "step-1", At: now,
			Manifest: &checkpoint.Manifest{Checkpoint: "step-1", Trigger: "notice", CommittedAt: now}})
		if line := a.statusLine(ctx); !strings.HasPrefix(line, "notice spot/terminate in force: checkpoint step-1 committed (deadline in ") {
			t.Errorf("STATUS line = %q; want the notice in force, committed", line)
		}
		passFakeTime(2 * time.Minute)
		if line := a.statusLine(ctx); !strings.Contains(line, "(deadline passed ") {
			t.Errorf("STATUS line = %q; want the deadline said passed", line)
		}
	})
}

// runAgentWithASpotNotice runs, in a synctest bubble, an agent (a fake trainer found, env added)
// that sees a spot notice due in within; stop ends it and checks Run's error.
func runAgentWithASpotNotice(t *testing.T, within time.Duration, env ...string) (*Agent, context.Context, func()) {
	t.Helper()
	cfg := mustLoad(t, LoadOptions{Environ: append([]string{"SPOTGUARD_HTTP_LISTEN=", "SPOTGUARD_TRAINER_MATCH=train",
		"SPOTGUARD_AGENT_RUNTIME_DIR=" + t.TempDir(), "SPOTGUARD_METRICS_CLOUDWATCH=false"}, env...)})
	fimds := newFakeIMDS()
	a, err := New(cfg, Deps{Logger: zerolog.Nop(), IMDS: fimds})
	if err != nil {
		t.Fatal(err)
	}
	a.coord.trainers = &fakeTrainers{}
	ctx, cancel := context.WithCancel(t.Context())
	done := make(chan error)
	go func() { done <- a.Run(ctx) }()
	passFakeTime(2 * time.Second)
	fimds.set("spot/instance-action", `{"action": "terminate", "time": "`+time.Now().Add(within).UTC().Format(time.RFC3339)+`"}`)
	passFakeTime(2 * time.Second)
	return a, ctx, func() {
		cancel()
		if err := <-done; err != nil {
			t.Errorf("Run() = %v", err)
		}
	}
}

// Before the agent has looked for the trainer (READY can come first) the STATUS line does not say
// that none was found: it said "no trainer found" in the second the trainer was found.
func TestStatusLineBeforeTheFirstLookForTheTrainer(t *testing.T) {
	cfg := mustLoad(t, LoadOptions{Environ: []string{"SPOTGUARD_HTTP_LISTEN=", "SPOTGUARD_TRAINER_MATCH=no-such-trainer-anywhere",
		"SPOTGUARD_AGENT_RUNTIME_DIR=" + t.TempDir()}})
	a, err := New(cfg, Deps{Logger: zerolog.Nop(), IMDS: newFakeIMDS()})
	if err != nil {
		t.Fatal(err)
	}
	if line := a.statusLine(t.Context()); strings.Contains(line, "no trainer found") || !strings.Contains(line, "looking for the trainer") {
		t.Errorf("STATUS line before the first look = %q; want it looking for the trainer", line)
	}
	a.coord.Scan()
	if line := a.statusLine(t.Context()); !strings.Contains(line, "no trainer found") {
		t.Errorf("STATUS line after a look that found none = %q; want no trainer found", line)
	}
}

// A commit of this agent's found to be one piece of a save other instances committed pieces of
// makes /healthz 503 naming it, and counts; a commit completed after it and found whole (looked
// at again at the commit after it) makes it healthy again; one found whole that completed
// before it does not.
func TestSplitSaveIsUnhealthyUntilALaterCommitIsWhole(t *testing.T) {
	a := newIdleAgent(t)
	t0 := time.Now().Add(-10 * time.Minute)
	commit := func(name string, at time.Time) *checkpoint.Manifest {
		return &checkpoint.Manifest{Checkpoint: name, Commit: "c-" + name, Trigger: "periodic", CommittedAt: at, Timings: checkpoint.Timings{CompleteAt: &at}}
	}
	split := func() bool {
		return slices.ContainsFunc(a.health(time.Now()).Reasons, func(r string) bool {
			return strings.Contains(r, "pieces of step-200") && strings.Contains(r, "store.world_nodes")
		})
	}
	a.onUpload(checkpoint.UploadEvent{Kind: checkpoint.CheckpointSplit, Checkpoint: "step-200", At: t0, Manifest: commit("step-200", t0),
		Err: errors.New("pieces of step-200")})
	if v := a.health(time.Now()); !split() || v.Healthy || !slices.Contains(v.short, "checkpoint step-200 committed in pieces by several instances") {
		t.Fatalf("health after a save in pieces: %+v; want 503 naming it", v)
	}
	if !strings.Contains(scrape(t, a), "spotguard_checkpoints_split_total 1") {
		t.Error("spotguard_checkpoints_split_total is not 1")
	}
	a.onUpload(checkpoint.UploadEvent{Kind: checkpoint.CheckpointWhole, Checkpoint: "step-100", At: t0.Add(-time.Minute), Manifest: commit("step-100", t0.Add(-time.Minute))})
	if !split() {
		t.Error("healthy again after an older commit was found whole")
	}
	a.onUpload(checkpoint.UploadEvent{Kind: checkpoint.CheckpointWhole, Checkpoint: "step-300", At: t0.Add(time.Minute), Manifest: commit("step-300", t0.Add(time.Minute))})
	if split() {
		t.Error("still unhealthy after a later commit was found whole")
	}
}

// A store that refuses a checkpoint's writes (a full disk, a quota, a policy on some keys) while
// the probe's tiny write passes was healthy for as long as it lasted: only a warning every minute
// said so. Past a minute of failures without a 2-minute pause, /healthz is 503 naming the checkpoint
// and the error; a pause, or the commit, ends it.
func TestUploadsFailingWhileTheProbePassesAreUnhealthy(t *testing.T) {
	a := newStoreAgent(t, newFaultyStore(t), &syncBuffer{})
	if _, done := a.store.prober.Check(t.Context()); !done {
		t.Fatal("probe not done")
	}
	t0 := time.Now()
	fail := func(at time.Time) {
		a.noteUploadHealth(checkpoint.UploadEvent{Kind: checkpoint.UploadFailed, Checkpoint: "step-1", At: at,
			Err: errors.New("write /store/job/step-1/x/a.bin: no space left on device")})
	}
	for i := range 7 {
		fail(t0.Add(time.Duration(i) * 10 * time.Second)) // 0 s to 60 s
	}
	if v := a.health(t0.Add(60 * time.Second)); !v.Healthy {
		t.Errorf("after 60 s of failures: %q; want healthy still", v.Reasons)
	}
	fail(t0.Add(70 * time.Second))
	v := a.health(t0.Add(70 * time.Second))
	if v.Healthy || !strings.Contains(strings.Join(v.Reasons, "\n"), "the uploads of checkpoint step-1 have failed for 1m10s (other: write /store/job/step-1/x/a.bin: no space left on device), though the store's probe passes") {
		t.Errorf("after 70 s of failures: healthy %v, %q; want unhealthy, naming step-1 and the error", v.Healthy, v.Reasons)
	}
	// Failures 90 s apart are one run: a read whose answer stalls takes that long to fail
	// (found from outside: each was a run of its own, and /healthz stayed 200).
	fail(t0.Add(160 * time.Second))
	if v := a.health(t0.Add(200 * time.Second)); v.Healthy {
		t.Errorf("40 s after a failure 90 s after the last: healthy; want the run going on")
	}
	if v := a.health(t0.Add(281 * time.Second)); !v.Healthy {
		t.Errorf("2m1s after the last failure: %q; want healthy (a pause)", v.Reasons)
	}
	fail(t0.Add(282 * time.Second))
	if v := a.health(t0.Add(282 * time.Second)); !v.Healthy {
		t.Errorf("a failure after the pause: %q; want healthy (a new run)", v.Reasons)
	}
	for i := range 8 {
		fail(t0.Add(282*time.Second + time.Duration(i)*10*time.Second))
	}
	a.noteUploadHealth(checkpoint.UploadEvent{Kind: checkpoint.CheckpointCommitted, Checkpoint: "step-1", At: t0.Add(355 * time.Second)})
	if v := a.health(t0.Add(355 * time.Second)); !v.Healthy {
		t.Errorf("after the commit: %q; want healthy", v.Reasons)
	}
}

// An upload journal the agent cannot use (here its path is a directory; a runtime_dir made
// read-only, or full) was a log line at start and nothing else: a /healthz warning says it now.
func TestUploadJournalOffIsAHealthWarning(t *testing.T) {
	rd, ck, store := t.TempDir(), t.TempDir(), t.TempDir()
	if err := os.MkdirAll(checkpoint.JournalPath(rd, "j", ck, "file://"+store), 0o755); err != nil {
		t.Fatal(err)
	}
	tr := startShTrainer(t, true)
	ta := startAgentWith(t, fileStores, "SPOTGUARD_TRAINER_PIDFILE="+tr.pidfile, "SPOTGUARD_AGENT_RUNTIME_DIR="+rd,
		"SPOTGUARD_CHECKPOINT_DIR="+ck, "SPOTGUARD_STORE_URL=file://"+store, "SPOTGUARD_STORE_JOB=j")
	eventually(t, "a warning that the upload journal is off", func() bool {
		return slices.ContainsFunc(ta.a.health(time.Now()).Warnings, func(w string) bool {
			return strings.Contains(w, "the upload journal in agent.runtime_dir "+rd+" cannot be used")
		})
	})
}

// A checkpoint whose files are all written and stored and whose marker never comes (DCP's
// .metadata while the agent waits for _COMPLETE, or checkpoint.dir a level too high) is never
// committed, and /healthz said nothing (found from outside). After markerWait it is a warning,
// naming it and the fixes; once its marker comes and it commits, the warning goes.
func TestMarkerThatNeverComesIsAHealthWarning(t *testing.T) {
	defer func(d time.Duration) { markerWait = d }(markerWait)
	markerWait = 300 * time.Millisecond
	dir := t.TempDir()
	ta := startAgentWith(t, fileStores, "SPOTGUARD_TRAINER_MATCH=no-such-trainer", "SPOTGUARD_CHECKPOINT_DIR="+dir,
		"SPOTGUARD_STORE_URL=file://"+t.TempDir(), "SPOTGUARD_STORE_JOB=j")
	ck := filepath.Join(dir, "step-000100")
	os.MkdirAll(ck, 0o755)
	os.WriteFile(filepath.Join(ck, "__0_0.distcp"), []byte("weights"), 0o644)
	os.WriteFile(filepath.Join(ck, ".metadata"), []byte("dcp"), 0o644) // not the marker the agent waits for
	warned := func() bool {
		return strings.Contains(strings.Join(ta.a.health(time.Now()).Warnings, " "), "checkpoint step-000100: every file written")
	}
	eventually(t, "a warning that step-000100's marker has not come", warned)
	if v := ta.a.health(time.Now()); !v.Healthy || !strings.Contains(strings.Join(v.Warnings, " "), "set checkpoint.marker") {
		t.Errorf("health = %+v; want healthy, the warning saying to set checkpoint.marker", v)
	}
	os.WriteFile(filepath.Join(ck, "_COMPLETE"), nil, 0o644)
	eventually(t, "the warning gone once the marker came", func() bool { return !warned() })
}

// LATEST that the store refuses to move for a minute while the probe passes (a policy on the
// key) was a log line only: /healthz stayed 200 (found from outside). It is a run of failures
// like a checkpoint's uploads, said as LATEST's; its move ends it.
func TestLatestFailingWhileTheProbePassesIsUnhealthy(t *testing.T) {
	a := newStoreAgent(t, newFaultyStore(t), &syncBuffer{})
	if _, done := a.store.prober.Check(t.Context()); !done {
		t.Fatal("probe not done")
	}
	t0 := time.Now()
	m := &checkpoint.Manifest{Checkpoint: "step-1", Commit: "c1"}
	for i := range 8 {
		a.noteUploadHealth(checkpoint.UploadEvent{Kind: checkpoint.LatestFailed, Checkpoint: "step-1", At: t0.Add(time.Duration(i) * 10 * time.Second),
			Manifest: m, Err: errors.New("write job/LATEST: AccessDenied: Access Denied (HTTP 403)")})
	}
	v := a.health(t0.Add(70 * time.Second))
	if v.Healthy || !strings.Contains(strings.Join(v.Reasons, "\n"), "LATEST cannot be moved to the newest commit for 1m10s (other: write job/LATEST: AccessDenied") ||
		!slices.Contains(v.short, "LATEST failing for 1m10s") {
		t.Errorf("after 70 s of LATEST failing: %+v; want unhealthy, naming LATEST and the error", v)
	}
	// The checkpoint's own commit (reported first) does not end LATEST's failures; its move does.
	a.noteUploadHealth(checkpoint.UploadEvent{Kind: checkpoint.CheckpointCommitted, Checkpoint: "step-1", At: t0.Add(70 * time.Second), Manifest: m})
	if v := a.health(t0.Add(70 * time.Second)); v.Healthy {
		t.Error("healthy again at the checkpoint's commit; want LATEST still failing")
	}
	a.noteUploadHealth(checkpoint.UploadEvent{Kind: checkpoint.LatestMoved, Checkpoint: "step-1", At: t0.Add(75 * time.Second), Manifest: m})
	if v := a.health(t0.Add(75 * time.Second)); !v.Healthy {
		t.Errorf("after LATEST moved: %q; want healthy", v.Reasons)
	}
}

// After an outage, the store's probe passing again made /healthz 200, and then 503 for seconds,
// "the uploads of checkpoint X have failed for 1m0s", until the uploader's next retry (up to 30 s
// outside a notice): failures from before the store came back (found from outside). They no
// longer count; a failure after the recovery does.
func TestUploadFailuresBeforeTheStoreRecoveredAreNotUnhealthy(t *testing.T) {
	a := newStoreAgent(t, newFaultyStore(t), &syncBuffer{})
	now := time.Now()
	for at := now.Add(-80 * time.Second); at.Before(now.Add(-5 * time.Second)); at = at.Add(5 * time.Second) {
		a.noteUploadHealth(checkpoint.UploadEvent{Kind: checkpoint.UploadFailed, Checkpoint: "step-1", At: at,
			Err: errors.New("dial tcp 127.0.0.1:9: connect: connection refused")})
	}
	a.store.prober.record(StoreProbe{URL: "s3://nosuchbucket/x", At: now.Add(-70 * time.Second), Step: ProbeList, Err: errors.New("connection refused")})
	a.store.prober.record(StoreProbe{URL: "s3://nosuchbucket/x", At: now.Add(-3 * time.Second)})
	if h := a.health(now); !h.Healthy {
		t.Errorf("health after the store came back, no upload tried since = %+v; want healthy", h)
	}
	a.noteUploadHealth(checkpoint.UploadEvent{Kind: checkpoint.UploadFailed, Checkpoint: "step-1", At: now.Add(-time.Second),
		Err: s3Err(403, "AccessDenied", "Access Denied")})
	if h := a.health(now); h.Healthy || !strings.Contains(strings.Join(h.Reasons, " "), "the uploads of checkpoint step-1 have failed for") {
		t.Errorf("health after an upload failed since the store came back = %+v; want unhealthy, naming step-1", h)
	}
}
