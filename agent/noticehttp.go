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
	"slices"
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
// *requestError for a body that is not one JSON object of the fields of JobNotice, each at most
// once and spelled exactly so (400, naming the field), too large (413), or a source other than
// job, an unknown action, a deadline that is missing, not RFC 3339 or more than
// MaxJobDeadlineAhead from now (400, naming the field).
func parseJobNotice(body io.Reader, now time.Time) (imds.Notice, error) {
	raw, err := readNoticeFields(body)
	if err != nil {
		return imds.Notice{}, err
	}
	n := imds.Notice{Source: SourceJob, Action: "terminate"}
	if v, ok := raw["source"]; ok && v != string(SourceJob) {
		return imds.Notice{}, &requestError{http.StatusBadRequest, "source", fmt.Sprintf("%q: want \"job\" (or no source): the agent polls IMDS itself", v)}
	}
	if v, ok := raw["action"]; ok {
		a, err := ParseJobAction(v)
		if err != nil {
			return imds.Notice{}, &requestError{http.StatusBadRequest, "action", err.Error()}
		}
		n.Action = a
	}
	v := raw["deadline"]
	if strings.TrimSpace(v) == "" {
		return imds.Notice{}, &requestError{http.StatusBadRequest, "deadline", "required: when the notified instance goes, RFC 3339 (e.g. 2026-11-29T16:44:18Z)"}
	}
	d, err := time.Parse(time.RFC3339, strings.TrimSpace(v))
	if err != nil {
		return imds.Notice{}, &requestError{http.StatusBadRequest, "deadline", fmt.Sprintf("%q is not RFC 3339 (want e.g. 2026-11-29T16:44:18Z)", v)}
	}
	if err := CheckJobDeadline(d, now); err != nil {
		return imds.Notice{}, &requestError{http.StatusBadRequest, "deadline", d.Format(time.RFC3339) + " " + err.Error()}
	}
	n.Time, n.Deadline = d, d
	return n, nil
}

// noticeFields are the fields of JobNotice, as POST /notice spells them.
var noticeFields = []string{"source", "action", "deadline"}

// readNoticeFields reads body as one JSON object of string fields among noticeFields, each at
// most once (a null one is absent), and nothing after it. encoding/json alone would take a field
// in any case ("DEADLINE") and the last of one given twice.
func readNoticeFields(body io.Reader) (map[string]string, error) {
	dec := json.NewDecoder(body)
	const want = "want one JSON object of source, action, deadline"
	tok, err := dec.Token()
	if err != nil {
		return nil, decodeError(err)
	}
	fields := map[string]string{}
	switch tok {
	case nil: // null: an object without fields
		return fields, noticeBodyEnds(dec)
	case json.Delim('{'):
	default:
		return nil, &requestError{http.StatusBadRequest, "", fmt.Sprintf("%s, not %s", want, jsonKind(tok))}
	}
	seen := map[string]bool{}
	for dec.More() {
		tok, err := dec.Token()
		if err != nil {
			return nil, decodeError(err)
		}
		key, _ := tok.(string)
		var v json.RawMessage
		if err := dec.Decode(&v); err != nil {
			return nil, decodeError(err)
		}
		switch {
		case !slices.Contains(noticeFields, key):
			return nil, &requestError{http.StatusBadRequest, key, "unknown field (want source, action, deadline)"}
		case seen[key]:
			return nil, &requestError{http.StatusBadRequest, key, "given twice"}
		}
		seen[key] = true
		var s *string
		if err := json.Unmarshal(v, &s); err != nil {
			return nil, &requestError{http.StatusBadRequest, key, "want a JSON string, not " + jsonKindOf(v)}
		}
		if s != nil {
			fields[key] = *s
		}
	}
	if _, err := dec.Token(); err != nil { // the closing brace
		return nil, decodeError(err)
	}
	return fields, noticeBodyEnds(dec)
}

// noticeBodyEnds returns nil when dec is at the end of the body, else a *requestError.
func noticeBodyEnds(dec *json.Decoder) error {
	_, err := dec.Token()
	switch {
	case errors.Is(err, io.EOF):
		return nil
	case errors.As(err, new(*http.MaxBytesError)):
		return decodeError(err)
	}
	return &requestError{http.StatusBadRequest, "", "want one JSON object, and nothing after it"}
}

// jsonKind names the JSON value that begins with tok, for errors.
func jsonKind(tok json.Token) string {
	switch tok.(type) {
	case json.Delim:
		switch tok {
		case json.Delim('['):
			return "an array"
		case json.Delim('{'):
			return "an object"
		}
	case string:
		return "a string"
	case float64, json.Number:
		return "a number"
	case bool:
		return "a boolean"
	case nil:
		return "null"
	}
	return "a " + fmt.Sprint(tok)
}

// jsonKindOf names the JSON value v, for errors.
func jsonKindOf(v json.RawMessage) string {
	tok, err := json.NewDecoder(bytes.NewReader(v)).Token()
	if err != nil {
		return "valid JSON"
	}
	return jsonKind(tok)
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

// decodeError turns an error of readNoticeFields's reading (a token or a raw value: syntax, the
// body's end or size; types and fields it checks itself) into a requestError.
func decodeError(err error) *requestError {
	var mbe *http.MaxBytesError
	var se *json.SyntaxError
	switch {
	case errors.As(err, &mbe):
		return &requestError{http.StatusRequestEntityTooLarge, "", fmt.Sprintf("body larger than %d bytes", mbe.Limit)}
	case errors.As(err, &se):
		return &requestError{http.StatusBadRequest, "", fmt.Sprintf("not valid JSON: %v", err)}
	case errors.Is(err, io.EOF):
		return &requestError{http.StatusBadRequest, "", `empty body: want {"deadline": "RFC 3339", "action": "terminate"}`}
	case errors.Is(err, io.ErrUnexpectedEOF):
		return &requestError{http.StatusBadRequest, "", "not valid JSON: unexpected end"}
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
	if r.ContentLength > maxNoticeBody {
		// Said before its first byte is read: a body that is not JSON from the start was a 400
		// (found from outside: 100 MB of zero bytes).
		fail(http.StatusRequestEntityTooLarge, "", fmt.Sprintf("body larger than %d bytes", maxNoticeBody))
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
