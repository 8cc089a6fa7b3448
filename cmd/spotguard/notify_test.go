package main

import (
	"context"
	"encoding/json"
	"fmt"
	"net"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/rs/zerolog"

	"github.com/spotguard/spotguard/agent"
)

// startNoticeAgent runs a real agent (no trainer, no store, an IMDS that announces nothing) on a
// free port until the test ends, and returns its listener's address and notice.json's path.
func startNoticeAgent(t *testing.T) (addr, noticeFile string) {
	t.Helper()
	runtime := t.TempDir()
	cfg, err := agent.Load(agent.LoadOptions{Environ: []string{"SPOTGUARD_HTTP_LISTEN=127.0.0.1:0", "SPOTGUARD_AGENT_RUNTIME_DIR=" + runtime,
		"SPOTGUARD_TRAINER_MATCH=no-such-trainer-anywhere"}})
	if err != nil {
		t.Fatal(err)
	}
	ready := make(chan net.Addr, 1)
	a, err := agent.New(cfg, agent.Deps{Logger: zerolog.Nop(), IMDS: mapIMDS{bodies: map[string]string{}},
		Ready: func(addr net.Addr) { ready <- addr }})
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- a.Run(ctx) }()
	t.Cleanup(func() {
		cancel()
		if err := <-done; err != nil {
			t.Errorf("agent Run() = %v", err)
		}
	})
	select {
	case ad := <-ready:
		return ad.String(), filepath.Join(runtime, agent.NoticeFile)
	case err := <-done:
		t.Fatalf("agent stopped before it was ready: %v", err)
	case <-time.After(10 * time.Second):
		t.Fatal("agent not ready within 10 s")
	}
	return "", ""
}

// spotguard notify against a real agent: the notice is taken (then refreshed), the answer
// printed, and the agent's notice.json names it; the listener comes from --listen, from the
// configuration file or from a key flag.
func TestNotifyRealAgent(t *testing.T) {
	addr, noticePath := startNoticeAgent(t)
	deadline := time.Now().Add(2 * time.Minute).UTC().Truncate(time.Second)

	code, stdout, stderr := runCLI(t, t.Context(), nil, "notify", "--deadline", deadline.Format(time.RFC3339), "--listen", addr)
	if code != exitOK || !strings.HasPrefix(stdout, "notice job/terminate taken (new): deadline "+deadline.Format(time.RFC3339)) ||
		!strings.Contains(stdout, "state detected, policy checkpoint") || stderr != "" {
		t.Fatalf("notify = %d, stdout %q, stderr %q; want 0 and the new notice", code, stdout, stderr)
	}
	b, err := os.ReadFile(noticePath)
	if err != nil {
		t.Fatal(err)
	}
	var nf struct {
		Source, Action string
		Deadline       time.Time
	}
	if err := json.Unmarshal(b, &nf); err != nil || nf.Source != "job" || nf.Action != "terminate" || !nf.Deadline.Equal(deadline) {
		t.Errorf("notice.json = %s (%v); want job terminate due %v", b, err, deadline)
	}

	// The address from the configuration file, the answer as JSON: the same notice, refreshed.
	conf := filepath.Join(t.TempDir(), "spotguard.yaml")
	os.WriteFile(conf, []byte("http:\n  listen: "+addr+"\ntrainer:\n  bogus_key: 1\n"), 0o644) // other keys' problems do not matter
	code, stdout, stderr = runCLI(t, t.Context(), nil, "notify", "--config", conf, "--deadline", deadline.Add(time.Hour).Format(time.RFC3339), "--json")
	var reply agent.JobNoticeReply
	if err := json.Unmarshal([]byte(stdout), &reply); code != exitOK || err != nil || reply.Result != agent.JobNoticeRefreshed ||
		reply.Notice.Posts != 2 || !reply.Notice.Deadline.Equal(deadline) {
		t.Errorf("notify --config --json = %d, %+v (%v), stderr %q; want 0, refreshed, posted twice, the earlier deadline", code, reply, err, stderr)
	}
	// A --config that does not exist was asked for: an error, as for the other commands.
	code, _, stderr = runCLI(t, t.Context(), nil, "notify", "--config", filepath.Join(t.TempDir(), "none.yaml"), "--http.listen", addr,
		"--action", "STOP", "--deadline", "2020-01-01T00:00:00Z")
	if code != exitFail || !strings.Contains(stderr, "none.yaml") {
		t.Errorf("notify with a --config that does not exist = %d, stderr %q; want 1 naming the file", code, stderr)
	}
	// From the key flag, another action (any case), a deadline already past.
	code, stdout, stderr = runCLI(t, t.Context(), []string{"SPOTGUARD_HTTP_LISTEN=" + addr}, "notify", "--config", conf, "--http.listen", addr,
		"--action", "STOP", "--deadline", "2020-01-01T00:00:00Z")
	if code != exitOK || !strings.HasPrefix(stdout, "notice job/stop taken (new): deadline 2020-01-01T00:00:00Z (passed ") ||
		!strings.Contains(stdout, "due now") || !strings.Contains(stdout, "notice.json names job/terminate first") {
		t.Errorf("notify --http.listen --action STOP (past) = %d, stdout %q, stderr %q; want job/stop, due now, under job/terminate", code, stdout, stderr)
	}
}

func TestNotifyFailures(t *testing.T) {
	dead := fmt.Sprintf("127.0.0.1:%d", freeTCPPort(t))
	future := time.Now().Add(time.Minute).UTC().Format(time.RFC3339)
	refusing := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		w.Header().Set("Content-Type", "application/json")
		w.WriteHeader(http.StatusServiceUnavailable)
		w.Write([]byte(`{"error":"agent: stopping: no new notice is taken"}` + "\n"))
	}))
	defer refusing.Close()
	notAgent := httptest.NewServer(http.NotFoundHandler())
	defer notAgent.Close()
	garbage := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) { w.Write([]byte("hello")) }))
	defer garbage.Close()
	emptyListen := filepath.Join(t.TempDir(), "spotguard.yaml")
	os.WriteFile(emptyListen, []byte("http:\n  listen: \"\"\n"), 0o644)
	badListen := filepath.Join(t.TempDir(), "spotguard.yaml")
	os.WriteFile(badListen, []byte("http:\n  listen: nonsense\n"), 0o644)
	notYAML := filepath.Join(t.TempDir(), "spotguard.yaml")
	os.WriteFile(notYAML, []byte("http: [\n"), 0o644)

	tests := []struct {
		name string
		args []string
		code int
		want string // in stderr
	}{
		{"no deadline", []string{"--listen", dead}, exitUsage, "--deadline is required"},
		{"deadline not RFC 3339", []string{"--listen", dead, "--deadline", "in 2 minutes"}, exitUsage, `--deadline "in 2 minutes" is not RFC 3339`},
		{"deadline without zone", []string{"--listen", dead, "--deadline", "2026-11-29T16:44:18"}, exitUsage, "is not RFC 3339"},
		{"deadline too far", []string{"--listen", dead, "--deadline", time.Now().AddDate(1, 0, 0).UTC().Format(time.RFC3339)}, exitUsage, "more than 31 days ahead"},
		{"deadline the zero time", []string{"--listen", dead, "--deadline", "0001-01-01T00:00:00Z"}, exitUsage, "--deadline 0001-01-01T00:00:00Z is before 2000"},
		{"unknown action", []string{"--listen", dead, "--deadline", future, "--action", "nap"}, exitUsage, `unknown action "nap"`},
		{"listen not host:port", []string{"--listen", "http://127.0.0.1:9402", "--deadline", future}, exitUsage, "not host:port"},
		{"stray argument", []string{"--deadline", future, "now"}, exitUsage, `unexpected argument "now"`},
		{"unknown flag", []string{"--deadlne", future}, exitUsage, "flag provided but not defined: --deadlne"},
		{"agent not running", []string{"--listen", dead, "--deadline", future}, exitFail, "no agent is listening on " + dead + " (connection refused)"},
		{"agent stopping", []string{"--listen", strings.TrimPrefix(refusing.URL, "http://"), "--deadline", future}, exitFail, "refused the notice: 503 Service Unavailable: agent: stopping"},
		{"not an agent", []string{"--listen", strings.TrimPrefix(notAgent.URL, "http://"), "--deadline", future}, exitFail, "404 Not Found: 404 page not found (is this a spotguard agent"},
		{"garbage answer", []string{"--listen", strings.TrimPrefix(garbage.URL, "http://"), "--deadline", future}, exitFail, "not a spotguard agent's answer"},
		{"http.listen empty", []string{"--config", emptyListen, "--deadline", future}, exitFail, "http.listen is empty"},
		{"http.listen bad", []string{"--config", badListen, "--deadline", future}, exitFail, "http.listen: \"nonsense\""},
		{"config not YAML", []string{"--config", notYAML, "--deadline", future}, exitFail, "not valid YAML"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			code, stdout, stderr := runCLI(t, t.Context(), nil, append([]string{"notify"}, tt.args...)...)
			if code != tt.code || !strings.Contains(stderr, tt.want) || stdout != "" {
				t.Errorf("Got(%q) = %d, stdout %q, stderr %q; want %d and stderr containing %q", tt.args, code, stdout, stderr, tt.code, tt.want)
			}
		})
	}
}

func TestNotifyHelp(t *testing.T) {
	code, stdout, _ := runCLI(t, t.Context(), nil, "notify", "-h")
	for _, want := range []string{"Usage: spotguard notify --deadline RFC3339 [flags]", "--deadline RFC3339", "--action", "--listen host:port", "--config FILE"} {
		if code != exitOK || !strings.Contains(stdout, want) {
			t.Errorf("notify -h = %d; want 0 and %q in:\n%s", code, want, stdout)
		}
	}
	_, stdout, _ = runCLI(t, t.Context(), nil, "help")
	if !strings.Contains(stdout, "\n  notify ") {
		t.Errorf("spotguard help does not list notify:\n%s", stdout)
	}
}

func TestNoticeURL(t *testing.T) {
	for addr, want := range map[string]string{
		"127.0.0.1:9402": "http://127.0.0.1:9402/notice",
		":9402":          "http://127.0.0.1:9402/notice",
		"0.0.0.0:9402":   "http://127.0.0.1:9402/notice",
		"[::]:9402":      "http://[::1]:9402/notice",
		"[::1]:9402":     "http://[::1]:9402/notice",
		"localhost:9402": "http://localhost:9402/notice",
	} {
		if got, err := noticeURL(addr); err != nil || got != want {
			t.Errorf("Got(%q) = %q, %v; want %q", addr, got, err, want)
		}
	}
}

func freeTCPPort(t *testing.T) int {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer ln.Close()
	return ln.Addr().(*net.TCPAddr).Port
}
