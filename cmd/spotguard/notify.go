package main

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"strings"
	"syscall"
	"time"

	"github.com/spotguard/spotguard/agent"
)

const notifySummary = `Hand the agent on this instance a notice the job learned from another node (POST /notice on
http.listen): source job, the action and the deadline of the notice another node's agent got.
The agent makes its uploads urgent and lists the notice in notice.json; it does not signal the
trainer (the trainer sent it). Posted again, the same notice is refreshed, never doubled, and
the earliest deadline is kept. Post it before the trainer starts the save.

  spotguard notify --deadline 2026-11-29T16:44:18Z
  spotguard notify --deadline "$(date -u -d '+2 min' +%FT%TZ)" --action stop --listen 127.0.0.1:9402

Exit 0 when the agent took the notice, 1 when it is not running or refused it, 2 for a bad flag.`

// notifyTimeout bounds the whole exchange with the agent: it is on this instance.
const notifyTimeout = 5 * time.Second

func runNotify(ctx context.Context, args, environ []string, stdout, stderr io.Writer) int {
	fs, cf := newFlagSet("notify", notifySummary, stdout, stderr)
	fs.use = "--deadline RFC3339 [flags]"
	deadline := fs.String("deadline", "", "when the notified instance goes, `RFC3339` (required; one already past is due now)")
	action := fs.String("action", "terminate", "the notice's `action`: "+strings.Join(agent.JobActions(), ", "))
	listen := fs.String("listen", "", "the agent's listener, `host:port` (default: http.listen from the configuration, which is then not read)")
	jsonOut := fs.Bool("json", false, "print the agent's answer as it came (JSON)")
	if code, ok := fs.parse(args); !ok {
		return code
	}
	if *deadline == "" {
		return fs.usageError("--deadline is required (RFC 3339, e.g. %s)", time.Now().Add(2*time.Minute).UTC().Format(time.RFC3339))
	}
	d, err := time.Parse(time.RFC3339, strings.TrimSpace(*deadline))
	if err != nil {
		return fs.usageError("--deadline %q is not RFC 3339 (want e.g. %s)", *deadline, time.Now().Add(2*time.Minute).UTC().Format(time.RFC3339))
	}
	if err := agent.CheckJobDeadline(d, time.Now()); err != nil {
		return fs.usageError("--deadline %s %v", d.Format(time.RFC3339), err)
	}
	act, err := agent.ParseJobAction(*action)
	if err != nil {
		return fs.usageError("--action: %v", err)
	}

	addr := *listen
	if addr == "" {
		var ok bool
		if addr, ok = notifyAddr(cf, environ, stderr); !ok {
			return exitFail
		}
	}
	url, err := noticeURL(addr)
	if err != nil {
		return fs.usageError("--listen %q: %v", addr, err)
	}
	body, _ := json.Marshal(agent.JobNotice{Source: string(agent.SourceJob), Action: act, Deadline: d.Format(time.RFC3339Nano)})
	ctx, cancel := context.WithTimeout(ctx, notifyTimeout)
	defer cancel()
	req, err := http.NewRequestWithContext(ctx, http.MethodPost, url, bytes.NewReader(body))
	if err != nil {
		fmt.Fprintf(stderr, "spotguard notify: %v\n", err)
		return exitFail
	}
	req.Header.Set("Content-Type", "application/json")
	resp, err := http.DefaultClient.Do(req)
	switch {
	case errors.Is(err, syscall.ECONNREFUSED):
		fmt.Fprintf(stderr, "spotguard notify: no agent is listening on %s (connection refused): is spotguard running here? "+
			"(systemctl status spotguard; http.listen says where it listens)\n", addr)
		return exitFail
	case errors.Is(err, context.DeadlineExceeded):
		fmt.Fprintf(stderr, "spotguard notify: the agent on %s did not answer within %s\n", addr, notifyTimeout)
		return exitFail
	case err != nil:
		fmt.Fprintf(stderr, "spotguard notify: cannot reach the agent on %s: %v\n", addr, err)
		return exitFail
	}
	defer resp.Body.Close()
	answer, err := io.ReadAll(io.LimitReader(resp.Body, 1<<20))
	if err != nil {
		fmt.Fprintf(stderr, "spotguard notify: reading the agent's answer: %v\n", err)
		return exitFail
	}
	if resp.StatusCode != http.StatusOK && resp.StatusCode != http.StatusAccepted {
		var e struct {
			Error string `json:"error"`
		}
		if json.Unmarshal(answer, &e) != nil || e.Error == "" {
			e.Error = strings.TrimSpace(string(answer))
			if resp.StatusCode == http.StatusNotFound {
				e.Error += " (is this a spotguard agent, of a version that takes notices?)"
			}
		}
		fmt.Fprintf(stderr, "spotguard notify: the agent on %s refused the notice: %s: %s\n", addr, resp.Status, e.Error)
		return exitFail
	}
	var reply agent.JobNoticeReply
	if err := json.Unmarshal(answer, &reply); err != nil || reply.Notice.Key == "" {
		fmt.Fprintf(stderr, "spotguard notify: %s answered %s with something that is not a spotguard agent's answer: %.200q\n", addr, resp.Status, answer)
		return exitFail
	}
	if *jsonOut {
		_, _ = stdout.Write(answer)
		return exitOK
	}
	fmt.Fprintln(stdout, notifyLine(reply, time.Now()))
	return exitOK
}

// notifyAddr is http.listen from the configuration. It fails, saying why, when the file cannot be
// read, when http.listen or the file itself has a problem (other keys' problems do not matter
// here), or when http.listen is empty.
func notifyAddr(cf *configFlags, environ []string, stderr io.Writer) (string, bool) {
	cfg, err := cf.load(environ)
	if err != nil {
		fmt.Fprintf(stderr, "spotguard notify: %v (or give the agent's address: --listen host:port)\n", err)
		return "", false
	}
	var problems []string
	for _, p := range cfg.LoadProblems() {
		if text := p.Error(); strings.HasPrefix(text, "http.listen:") || strings.HasPrefix(text, cf.path+":") {
			problems = append(problems, text)
		}
	}
	if len(problems) > 0 {
		fmt.Fprintf(stderr, "spotguard notify: invalid configuration:\n")
		for _, p := range problems {
			fmt.Fprintf(stderr, "  - %s\n", p)
		}
		return "", false
	}
	if cfg.HTTP.Listen == "" {
		fmt.Fprintln(stderr, "spotguard notify: http.listen is empty: the agent has no listener to take a notice (set http.listen, or give --listen host:port)")
		return "", false
	}
	return cfg.HTTP.Listen, true
}

// noticeURL is the URL of POST /notice on the listener addr (host:port). An empty or unspecified
// host (":9402", "0.0.0.0:9402", "[::]:9402") is reached on this machine's loopback.
func noticeURL(addr string) (string, error) {
	host, port, err := net.SplitHostPort(addr)
	if err != nil {
		return "", fmt.Errorf("not host:port: %w", err)
	}
	if ip := net.ParseIP(host); host == "" || (ip != nil && ip.IsUnspecified()) {
		host = "127.0.0.1"
		if ip != nil && ip.To4() == nil {
			host = "::1"
		}
	}
	return "http://" + net.JoinHostPort(host, port) + "/notice", nil
}

// notifyLine says in one line what the agent now holds.
func notifyLine(r agent.JobNoticeReply, now time.Time) string {
	n := r.Notice
	var b strings.Builder
	switch r.Result {
	case agent.JobNoticeNew:
		fmt.Fprintf(&b, "notice %s taken (new)", n.Key)
	default:
		fmt.Fprintf(&b, "notice %s refreshed (posted %d times; the earliest deadline is kept)", n.Key, n.Posts)
	}
	if n.Deadline != nil {
		if left := n.Deadline.Sub(now); left >= 0 {
			fmt.Fprintf(&b, ": deadline %s (in %s)", n.Deadline.UTC().Format(time.RFC3339), left.Round(time.Second))
		} else {
			fmt.Fprintf(&b, ": deadline %s (passed %s ago: due now)", n.Deadline.UTC().Format(time.RFC3339), (-left).Round(time.Second))
		}
	}
	fmt.Fprintf(&b, ", state %s, policy %s", n.State, n.Policy)
	if n.Policy == agent.PolicyIgnore {
		b.WriteString(" (notices.job: recorded only)")
	}
	if n.EndsAt != nil {
		fmt.Fprintf(&b, ", in force until %s", n.EndsAt.UTC().Format(time.RFC3339))
	}
	if r.MostSevere != "" && r.MostSevere != n.Key {
		fmt.Fprintf(&b, "; notice.json names %s first", r.MostSevere)
	}
	return b.String()
}
