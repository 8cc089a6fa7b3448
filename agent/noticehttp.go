package agent

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"mime"
	"net/http"
	"strings"
	"time"

	"github.com/spotguard/spotguard/agent/imds"
)

// maxNoticeBody bounds the body of POST /notice.
const maxNoticeBody = 4 << 10

// JobNotice is the body of POST /notice.
type JobNotice struct {
	// Source must be "job" (the default when absent).
	Source string `json:"source,omitempty"`
	// Action is one of JobActions (default "terminate").
	Action string `json:"action,omitempty"`
	// Deadline is when the notified instance is expected to go, RFC 3339. Required. One already
	// past is due now.
	Deadline string `json:"deadline"`
}

// requestError is a refused POST /notice: the status to answer and what is wrong, naming the
// field when one is.
type requestError struct {
	status int
	field  string
	msg    string
}

func (e *requestError) Error() string {
	if e.field == "" {
		return e.msg
	}
	return e.field + ": " + e.msg
}

// parseJobNotice reads a POST /notice body into the notice it hands over. It returns a
// *requestError for a body that is not one JSON object of the fields of JobNotice (400, naming
// the field), too large (413), or a source other than job, an unknown action, a deadline that is
// missing, not RFC 3339 or more than MaxJobDeadlineAhead after now (400, naming the field).
func parseJobNotice(body io.Reader, now time.Time) (imds.Notice, error) {
	var raw struct {
		Source   *string `json:"source"`
		Action   *string `json:"action"`
		Deadline *string `json:"deadline"`
	}
	dec := json.NewDecoder(body)
	dec.DisallowUnknownFields()
	if err := dec.Decode(&raw); err != nil {
		return imds.Notice{}, decodeError(err)
	}
	if _, err := dec.Token(); !errors.Is(err, io.EOF) {
		if mbe := (*http.MaxBytesError)(nil); errors.As(err, &mbe) {
			return imds.Notice{}, decodeError(err)
		}
		return imds.Notice{}, &requestError{http.StatusBadRequest, "", "want one JSON object, and nothing after it"}
	}
	n := imds.Notice{Source: SourceJob, Action: "terminate"}
	if raw.Source != nil && *raw.Source != string(SourceJob) {
		return imds.Notice{}, &requestError{http.StatusBadRequest, "source", fmt.Sprintf("%q: want \"job\" (or no source): the agent polls IMDS itself", *raw.Source)}
	}
	if raw.Action != nil {
		a, err := ParseJobAction(*raw.Action)
		if err != nil {
			return imds.Notice{}, &requestError{http.StatusBadRequest, "action", err.Error()}
		}
		n.Action = a
	}
	if raw.Deadline == nil || strings.TrimSpace(*raw.Deadline) == "" {
		return imds.Notice{}, &requestError{http.StatusBadRequest, "deadline", "required: when the notified instance goes, RFC 3339 (e.g. 2026-11-29T16:44:18Z)"}
	}
	d, err := time.Parse(time.RFC3339, strings.TrimSpace(*raw.Deadline))
	if err != nil {
		return imds.Notice{}, &requestError{http.StatusBadRequest, "deadline", fmt.Sprintf("%q is not RFC 3339 (want e.g. 2026-11-29T16:44:18Z)", *raw.Deadline)}
	}
	if d.After(now.Add(MaxJobDeadlineAhead)) {
		return imds.Notice{}, &requestError{http.StatusBadRequest, "deadline", fmt.Sprintf("%s is more than %s ahead: not a notice's deadline", d.Format(time.RFC3339), MaxJobDeadlineAhead)}
	}
	n.Time, n.Deadline = d, d
	return n, nil
}

// PostNotice hands the agent a notice of the job (source job), as POST /notice does: for callers
// in the same process (spotguard drill --nodes). It returns errStopping once the agent stops.
func (a *Agent) PostNotice(ctx context.Context, action string, deadline time.Time) (JobNoticeReply, error) {
	act, err := ParseJobAction(action)
	if err != nil {
		return JobNoticeReply{}, err
	}
	return a.coord.Post(ctx, imds.Notice{Source: SourceJob, Action: act, Time: deadline, Deadline: deadline})
}

// decodeError turns a JSON decoding error into a requestError naming the field when it can.
func decodeError(err error) *requestError {
	var mbe *http.MaxBytesError
	var te *json.UnmarshalTypeError
	var se *json.SyntaxError
	switch {
	case errors.As(err, &mbe):
		return &requestError{http.StatusRequestEntityTooLarge, "", fmt.Sprintf("body larger than %d bytes", mbe.Limit)}
	case errors.As(err, &te):
		return &requestError{http.StatusBadRequest, te.Field, fmt.Sprintf("want a JSON %s, not a %s", te.Type, te.Value)}
	case errors.As(err, &se):
		return &requestError{http.StatusBadRequest, "", fmt.Sprintf("not valid JSON: %v", err)}
	case errors.Is(err, io.EOF):
		return &requestError{http.StatusBadRequest, "", `empty body: want {"deadline": "RFC 3339", "action": "terminate"}`}
	case errors.Is(err, io.ErrUnexpectedEOF):
		return &requestError{http.StatusBadRequest, "", "not valid JSON: unexpected end"}
	}
	// encoding/json says `json: unknown field "x"`.
	if f, ok := strings.CutPrefix(err.Error(), "json: unknown field "); ok {
		return &requestError{http.StatusBadRequest, strings.Trim(f, `"`), "unknown field (want source, action, deadline)"}
	}
	return &requestError{http.StatusBadRequest, "", fmt.Sprintf("not a JSON object of source, action, deadline: %v", err)}
}

// noticeError is the JSON of a refused POST /notice.
type noticeError struct {
	Error string `json:"error"`
	// Field names the field that is wrong, when one is.
	Field string `json:"field,omitempty"`
}

// handleNotice serves POST /notice: a notice the job hands over (JobNotice). It answers 202 with
// a JobNoticeReply for a new notice, 200 for one refreshed; 400 naming the field for bad input;
// 405 for another method; 413 for a body over 4 KiB; 415 without Content-Type: application/json
// (which also keeps a web page from posting one: a browser asks first, and is not answered);
// 503 while the agent stops. Every error is JSON: {"error", "field"}.
func (a *Agent) handleNotice(w http.ResponseWriter, r *http.Request) {
	fail := func(status int, field, msg string) {
		w.Header().Set("Content-Type", "application/json")
		w.WriteHeader(status)
		json.NewEncoder(w).Encode(noticeError{Error: msg, Field: field})
	}
	if r.Method != http.MethodPost {
		w.Header().Set("Allow", http.MethodPost)
		fail(http.StatusMethodNotAllowed, "", r.Method+" /notice: want POST")
		return
	}
	if mt, _, err := mime.ParseMediaType(r.Header.Get("Content-Type")); err != nil || mt != "application/json" {
		fail(http.StatusUnsupportedMediaType, "", "want Content-Type: application/json")
		return
	}
	n, err := parseJobNotice(http.MaxBytesReader(w, r.Body, maxNoticeBody), time.Now())
	if err != nil {
		var re *requestError
		if errors.As(err, &re) {
			fail(re.status, re.field, re.Error())
			return
		}
		fail(http.StatusBadRequest, "", err.Error())
		return
	}
	ctx, cancel := context.WithTimeout(r.Context(), 10*time.Second)
	defer cancel()
	reply, err := a.coord.Post(ctx, n)
	switch {
	case errors.Is(err, errStopping):
		fail(http.StatusServiceUnavailable, "", err.Error())
		return
	case err != nil:
		fail(http.StatusServiceUnavailable, "", "the notice path did not answer: "+err.Error())
		return
	}
	var b bytes.Buffer
	enc := json.NewEncoder(&b)
	enc.SetIndent("", "  ")
	enc.Encode(reply)
	w.Header().Set("Content-Type", "application/json")
	if reply.Result == JobNoticeNew {
		w.WriteHeader(http.StatusAccepted)
	} else {
		w.WriteHeader(http.StatusOK)
	}
	_, _ = w.Write(b.Bytes())
}
