package agent

import (
	"context"
	"encoding/json"
	"errors"
	"io"
	"net"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/rs/zerolog"

	"github.com/spotguard/spotguard/agent/imds"
	"github.com/spotguard/spotguard/checkpoint"
)

func TestParseJobNotice(t *testing.T) {
	now := time.Date(2026, 11, 29, 16, 42, 18, 0, time.UTC)
	tests := []struct {
		name   string
		body   string
		status int    // 0: accepted
		field  string // the field a refusal names
		action string
		dead   time.Time
	}{
		{"deadline only", `{"deadline":"2026-11-29T16:44:18Z"}`, 0, "", "terminate", now.Add(2 * time.Minute)},
		{"every field", `{"source":"job","action":"stop","deadline":"2026-11-29T17:44:18+01:00"}`, 0, "", "stop", now.Add(2 * time.Minute)},
		{"action in any case", `{"action":" TERMINATED ","deadline":"2026-11-29T16:44:18.5Z"}`, 0, "", "Terminated", now.Add(2*time.Minute + 500*time.Millisecond)},
		{"scheduled code", `{"action":"system-reboot","deadline":"2026-12-01T00:00:00Z"}`, 0, "", "system-reboot", time.Date(2026, 12, 1, 0, 0, 0, 0, time.UTC)},
		{"deadline past", `{"deadline":"2020-01-01T00:00:00Z"}`, 0, "", "terminate", time.Date(2020, 1, 1, 0, 0, 0, 0, time.UTC)},
		{"trailing white space", "{\"deadline\":\"2026-11-29T16:44:18Z\"}\n\n", 0, "", "terminate", now.Add(2 * time.Minute)},
		{"empty body", ``, 400, "", "", time.Time{}},
		{"not JSON", `deadline=2026-11-29T16:44:18Z`, 400, "", "", time.Time{}},
		{"cut short", `{"deadline":"2026-11-29T16:44:18Z"`, 400, "", "", time.Time{}},
		{"an array", `[{"deadline":"2026-11-29T16:44:18Z"}]`, 400, "", "", time.Time{}},
		{"null", `null`, 400, "deadline", "", time.Time{}},
		{"two objects", `{"deadline":"2026-11-29T16:44:18Z"}{"deadline":"2026-11-29T16:44:18Z"}`, 400, "", "", time.Time{}},
		{"unknown field", `{"deadline":"2026-11-29T16:44:18Z","time":"x"}`, 400, "time", "", time.Time{}},
		{"deadline missing", `{"action":"terminate"}`, 400, "deadline", "", time.Time{}},
		{"deadline empty", `{"deadline":""}`, 400, "deadline", "", time.Time{}},
		{"deadline null", `{"deadline":null}`, 400, "deadline", "", time.Time{}},
		{"deadline a number", `{"deadline":1795000000}`, 400, "deadline", "", time.Time{}},
		{"deadline not RFC 3339", `{"deadline":"29 Nov 2026 16:44:18 GMT"}`, 400, "deadline", "", time.Time{}},
		{"deadline without zone", `{"deadline":"2026-11-29T16:44:18"}`, 400, "deadline", "", time.Time{}},
		{"deadline too far", `{"deadline":"2027-01-01T00:00:00Z"}`, 400, "deadline", "", time.Time{}},
		{"source spot", `{"source":"spot","deadline":"2026-11-29T16:44:18Z"}`, 400, "source", "", time.Time{}},
		{"source empty", `{"source":"","deadline":"2026-11-29T16:44:18Z"}`, 400, "source", "", time.Time{}},
		{"action unknown", `{"action":"reboot","deadline":"2026-11-29T16:44:18Z"}`, 400, "action", "", time.Time{}},
		{"action a number", `{"action":1,"deadline":"2026-11-29T16:44:18Z"}`, 400, "action", "", time.Time{}},
		// Found from outside: taken, the zero time then in the log and /status; the last of a
		// field given twice taken; a field in another case taken.
		{"deadline the zero time", `{"deadline":"0001-01-01T00:00:00Z"}`, 400, "deadline", "", time.Time{}},
		{"deadline twice", `{"deadline":"2026-11-29T16:44:18Z","deadline":"2026-11-29T16:50:18Z"}`, 400, "deadline", "", time.Time{}},
		{"field in capitals", `{"DEADLINE":"2026-11-29T16:44:18Z"}`, 400, "DEADLINE", "", time.Time{}},
		{"an empty array", `[]`, 400, "", "", time.Time{}},
		{"a string", `"2026-11-29T16:44:18Z"`, 400, "", "", time.Time{}},
		{"source an object", `{"source":{},"deadline":"2026-11-29T16:44:18Z"}`, 400, "source", "", time.Time{}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			n, err := parseJobNotice(strings.NewReader(tt.body), now)
			if tt.status == 0 {
				if err != nil || n.Source != SourceJob || n.Action != tt.action || !n.Deadline.Equal(tt.dead) || n.Key() != "job/"+tt.action {
					t.Errorf("Got(%q) = %+v, %v; want job/%s due %v", tt.body, n, err, tt.action, tt.dead)
				}
				return
			}
			var re *requestError
			if !errors.As(err, &re) || re.status != tt.status || re.field != tt.field {
				t.Errorf("Got(%q) = %v; want a %d naming field %q", tt.body, err, tt.status, tt.field)
			}
			if err != nil && strings.Contains(err.Error(), "struct") {
				t.Errorf("Got(%q) = %v; want words, not a Go type", tt.body, err)
			}
		})
	}
}

// post sends body to POST /notice of srv with contentType and returns the status, the headers and
// the decoded JSON answer.
func post(t *testing.T, url, contentType, body string) (int, http.Header, map[string]any) {
	t.Helper()
	req, err := http.NewRequest(http.MethodPost, url+"/notice", strings.NewReader(body))
	if err != nil {
		t.Fatal(err)
	}
	if contentType != "" {
		req.Header.Set("Content-Type", contentType)
	}
	return do(t, req)
}

func do(t *testing.T, req *http.Request) (int, http.Header, map[string]any) {
	t.Helper()
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	b, _ := io.ReadAll(resp.Body)
	var m map[string]any
	if err := json.Unmarshal(b, &m); err != nil {
		t.Fatalf("%s %s answered %d with %q: not JSON: %v", req.Method, req.URL, resp.StatusCode, b, err)
	}
	return resp.StatusCode, resp.Header, m
}

// Every refusal of POST /notice is JSON with the status that says why, naming the field.
func TestNoticeEndpointRefuses(t *testing.T) {
	ta := startAgent(t, "SPOTGUARD_TRAINER_MATCH=no-such-trainer")
	srv := httptest.NewServer(ta.a.Handler())
	defer srv.Close()

	for _, method := range []string{http.MethodGet, http.MethodPut, http.MethodDelete} {
		req, _ := http.NewRequest(method, srv.URL+"/notice", nil)
		code, h, m := do(t, req)
		if code != http.StatusMethodNotAllowed || h.Get("Allow") != http.MethodPost || m["error"] == "" {
			t.Errorf("Got(%q) = %d Allow %q %v; want 405, Allow: POST, an error", method, code, h.Get("Allow"), m)
		}
	}
	good := `{"deadline":"2099-01-01T00:00:00Z"}`
	for _, ct := range []string{"", "text/plain", "application/x-www-form-urlencoded"} {
		if code, _, m := post(t, srv.URL, ct, good); code != http.StatusUnsupportedMediaType || !strings.Contains(m["error"].(string), "application/json") {
			t.Errorf("Got(Content-Type %q) = %d %v; want 415 asking for application/json", ct, code, m)
		}
	}
	big := `{"deadline":"2099-01-01T00:00:00Z","action":"` + strings.Repeat("x", maxNoticeBody) + `"}`
	if code, _, m := post(t, srv.URL, "application/json", big); code != http.StatusRequestEntityTooLarge || m["error"] == "" {
		t.Errorf("Got(%q) = %d %v; want 413", "a large body", code, m)
	}
	// Too large and not JSON from its first byte: still too large.
	if code, _, m := post(t, srv.URL, "application/json", strings.Repeat("\x00", 2*maxNoticeBody)); code != http.StatusRequestEntityTooLarge || m["error"] == "" {
		t.Errorf("Got(%q) = %d %v; want 413", "a large body of zero bytes", code, m)
	}
	for body, field := range map[string]string{
		`{}`:                      "deadline",
		`{"deadline":"tomorrow"}`: "deadline",
		`{"deadline":"2099-01-01T00:00:00Z","action":"nap"}`:    "action",
		`{"deadline":"2099-01-01T00:00:00Z","source":"spot"}`:   "source",
		`{"deadline":"2099-01-01T00:00:00Z","urgent":true}`:     "urgent",
		`{"deadline":"2099-01-01T00:00:00Z"} and more`:          "",
		`{"deadline":"2099-01-01T00:00:00Z","action":["stop"]}`: "action",
	} {
		code, _, m := post(t, srv.URL, "application/json; charset=utf-8", body)
		f, _ := m["field"].(string)
		if code != http.StatusBadRequest || f != field || !strings.HasPrefix(m["error"].(string), field) {
			t.Errorf("Got(%q) = %d %v; want 400 naming field %q", body, code, m, field)
		}
	}
	if st := ta.a.Status(); len(st.Notices) != 0 {
		t.Errorf("/status notices after refused posts = %+v; want none", st.Notices)
	}
	if _, err := os.Stat(filepath.Join(ta.runtime, NoticeFile)); !errors.Is(err, os.ErrNotExist) {
		t.Errorf("notice.json after refused posts: %v; want none", err)
	}
}

// A job notice posted to a running agent: accepted (202, then 200 when posted again), shown in
// /status, notice.json and the metrics under source job, and the trainer, which catches the
// signal, is never signalled.
func TestNoticeEndpointTakesJobNotice(t *testing.T) {
	tr := startShTrainer(t, true)
	ta := startAgent(t, "SPOTGUARD_TRAINER_PIDFILE="+tr.pidfile)
	eventually(t, "the start-up scan", func() bool { return len(ta.a.Status().Trainers) == 1 })
	srv := httptest.NewServer(ta.a.Handler())
	defer srv.Close()

	deadline := time.Now().Add(2 * time.Minute).UTC().Truncate(time.Second)
	body := `{"source":"job","action":"terminate","deadline":"` + deadline.Format(time.RFC3339) + `"}`
	code, _, m := post(t, srv.URL, "application/json", body)
	n, _ := m["notice"].(map[string]any)
	if code != http.StatusAccepted || m["result"] != "new" || n["key"] != "job/terminate" || n["source"] != "job" ||
		n["state"] != StateDetected || n["policy"] != "checkpoint" || n["deadline"] != deadline.Format(time.RFC3339) || m["most_severe"] != "job/terminate" {
		t.Fatalf("first POST = %d %v; want 202, a new job/terminate in state detected with its deadline", code, m)
	}
	nf := readNoticeFile(t, ta.runtime)
	if nf.Source != SourceJob || nf.Action != "terminate" || nf.Deadline == nil || !nf.Deadline.Equal(deadline) || len(nf.Active) != 1 {
		t.Errorf("notice.json = %+v; want the job notice alone", nf)
	}

	later := deadline.Add(time.Minute)
	code, _, m = post(t, srv.URL, "application/json", `{"deadline":"`+later.Format(time.RFC3339)+`"}`)
	n, _ = m["notice"].(map[string]any)
	if code != http.StatusOK || m["result"] != "refreshed" || n["posts"] != 2.0 || n["deadline"] != deadline.Format(time.RFC3339) {
		t.Errorf("second POST = %d %v; want 200, refreshed, posted twice, the earlier deadline kept", code, m)
	}

	// Nothing more comes of it: the trainer catches SIGUSR1 and is never sent one.
	ta.waitPolls(t, imds.SourceSpot, 3)
	if got := tr.signals(); len(got) != 0 {
		t.Errorf("trainer signals = %v; want none (the job notice came from the trainer)", got)
	}
	var job []NoticeStatus
	for _, ns := range ta.a.Status().Notices {
		if ns.Source == SourceJob {
			job = append(job, ns)
		}
	}
	if len(job) != 1 || !job[0].Active || job[0].Posts != 2 || len(job[0].Signals) != 0 || job[0].EndsAt == nil || !job[0].EndsAt.Equal(later.Add(JobNoticeGrace)) {
		t.Errorf("/status job notices = %+v; want one, active, posted twice, no signal, ending at %v", job, later.Add(JobNoticeGrace))
	}
	code, _, _ = do(t, mustRequest(t, http.MethodGet, srv.URL+"/healthz"))
	if code != http.StatusOK {
		t.Errorf("/healthz = %d; want 200", code)
	}
	resp, err := http.Get(srv.URL + "/metrics")
	if err != nil {
		t.Fatal(err)
	}
	b, _ := io.ReadAll(resp.Body)
	resp.Body.Close()
	if !strings.Contains(string(b), `spotguard_notices_total{action="terminate",source="job"} 1`) || !strings.Contains(string(b), `spotguard_trainer_signals_total{outcome="sent"} 0`) {
		t.Errorf("/metrics: want spotguard_notices_total{source=job} 1 and no trainer signal:\n%s", grep(string(b), "spotguard_notices_total", "spotguard_trainer_signals_total"))
	}
	if !tr.alive() {
		t.Error("trainer died")
	}
}

// A job notice makes uploads urgent, labels the checkpoint the trainer then writes, and holds a
// stop (SIGTERM) until that checkpoint is committed, as a notice the agent signalled for does; a
// deadline already past changes none of it. A notice posted while the agent stops is refused
// (503), and the drain goes on.
func TestJobNoticeUploadsUrgentlyAndHoldsAStop(t *testing.T) {
	ckdir, storeDir := t.TempDir(), t.TempDir()
	ta := startAgentWith(t, fileStores, "SPOTGUARD_TRAINER_MATCH=no-such-trainer", "SPOTGUARD_CHECKPOINT_DIR="+ckdir,
		"SPOTGUARD_STORE_URL=file://"+storeDir, "SPOTGUARD_STORE_JOB=j", "SPOTGUARD_AGENT_STOP_BUDGET=60s")
	eventually(t, "the checkpoint watch", func() bool { return ta.a.Status().Health.Healthy })
	srv := httptest.NewServer(ta.a.Handler())
	defer srv.Close()

	past := time.Now().Add(-time.Minute).UTC().Truncate(time.Second)
	if code, _, m := post(t, srv.URL, "application/json", `{"action":"stop","deadline":"`+past.Format(time.RFC3339)+`"}`); code != http.StatusAccepted {
		t.Fatalf("POST = %d %v; want 202", code, m)
	}
	eventually(t, "urgent uploads", func() bool { u := ta.a.Status().Uploads; return u != nil && u.Urgent })

	// Stop now, before the trainer has written the checkpoint the notice asked for.
	ta.cancel()
	eventually(t, "the drain to begin", func() bool {
		return strings.Contains(ta.logs.String(), "stop requested while checkpoints are being written or are not committed yet")
	})
	<-ta.a.coord.stopped
	// A reload during the drain is not done, and says so; before, it was dropped in silence.
	ta.sigs <- syscall.SIGHUP
	eventually(t, "the reload during the drain to be refused in the log", func() bool {
		return strings.Contains(ta.logs.String(), "config reload (SIGHUP) not done: the agent is stopping")
	})
	code, _, m := post(t, srv.URL, "application/json", `{"deadline":"`+past.Format(time.RFC3339)+`"}`)
	if e, _ := m["error"].(string); code != http.StatusServiceUnavailable || !strings.Contains(e, "stopping") {
		t.Errorf("POST while stopping = %d %v; want 503 saying the agent stops", code, m)
	}

	step := filepath.Join(ckdir, "step-000100")
	os.MkdirAll(step, 0o755)
	os.WriteFile(filepath.Join(step, "w.bin"), []byte("weights"), 0o644)
	os.WriteFile(filepath.Join(step, "_COMPLETE"), nil, 0o644)
	select {
	case err := <-ta.done:
		ta.done <- err // for the cleanup
	case <-time.After(30 * time.Second):
		t.Fatal("the agent did not stop within 30 s of the checkpoint's marker")
	}
	cs, _, err := checkpoint.ListCommitted(context.Background(), mustFileStore(t, storeDir), "j")
	if err != nil || len(cs) != 1 {
		t.Fatalf("committed = %+v, %v; want step-000100, committed during the drain", cs, err)
	}
	if m := cs[0].Manifest; m == nil || m.Checkpoint != "step-000100" || m.Trigger != "notice" || m.Notice != "job/stop" {
		t.Errorf("manifest = %+v; want step-000100 with trigger notice, notice job/stop", cs[0].Manifest)
	}
	var ns NoticeStatus
	for _, n := range ta.a.Status().Notices {
		if n.Key == "job/stop" {
			ns = n
		}
	}
	if ns.State != StateCommitted {
		t.Errorf("job/stop state = %q (transitions %+v); want committed", ns.State, ns.Transitions)
	}
}

func mustRequest(t *testing.T, method, url string) *http.Request {
	t.Helper()
	req, err := http.NewRequest(method, url, nil)
	if err != nil {
		t.Fatal(err)
	}
	return req
}

func readNoticeFile(t *testing.T, dir string) noticeFile {
	t.Helper()
	b, err := os.ReadFile(filepath.Join(dir, NoticeFile))
	if err != nil {
		t.Fatalf("notice.json: %v", err)
	}
	var nf noticeFile
	if err := json.Unmarshal(b, &nf); err != nil {
		t.Fatalf("notice.json %s: %v", b, err)
	}
	return nf
}

// grep returns the lines of text that contain any of subs.
func grep(text string, subs ...string) string {
	var out []string
	for _, l := range strings.Split(text, "\n") {
		for _, s := range subs {
			if strings.Contains(l, s) {
				out = append(out, l)
				break
			}
		}
	}
	return strings.Join(out, "\n")
}

// A notice.json an earlier run left (here: naming a job notice, which lives only in the agent
// that took it) is removed when the agent starts: no notice is in force yet.
func TestStaleNoticeFileRemovedAtStart(t *testing.T) {
	runtime := t.TempDir()
	stale := filepath.Join(runtime, NoticeFile)
	os.WriteFile(stale, []byte(`{"source":"job","action":"terminate","deadline":"2026-11-29T16:44:18Z","active":[]}`), 0o644)
	cfg := mustLoad(t, LoadOptions{Environ: []string{"SPOTGUARD_HTTP_LISTEN=", "SPOTGUARD_AGENT_RUNTIME_DIR=" + runtime, "SPOTGUARD_TRAINER_MATCH=no-such-trainer"}})
	ready := make(chan struct{})
	a, err := New(cfg, Deps{Logger: zerolog.Nop(), IMDS: newFakeIMDS(), Ready: func(net.Addr) { close(ready) }})
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(t.Context())
	done := make(chan error, 1)
	go func() { done <- a.Run(ctx) }()
	<-ready
	if _, err := os.Stat(stale); !errors.Is(err, os.ErrNotExist) {
		t.Errorf("notice.json after start: %v; want it removed", err)
	}
	cancel()
	if err := <-done; err != nil {
		t.Errorf("Run() = %v", err)
	}
}
