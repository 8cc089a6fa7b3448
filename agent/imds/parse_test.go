package imds

import (
	"errors"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"
)

// now is the detection time the parser tests use.
var now = time.Date(2026, 11, 29, 16, 40, 0, 0, time.UTC)

// readTestdata returns the contents of testdata/name.
func readTestdata(t testing.TB, name string) string {
	t.Helper()
	b, err := os.ReadFile(filepath.Join("testdata", name))
	if err != nil {
		t.Fatal(err)
	}
	return string(b)
}

// sameNotice reports whether a and b are equal, comparing times with Equal and ignoring Raw.
func sameNotice(a, b Notice) bool {
	return a.Source == b.Source && a.Action == b.Action && a.EventID == b.EventID &&
		a.Time.Equal(b.Time) && a.Deadline.Equal(b.Deadline) && a.Malformed == b.Malformed
}

func sameNotices(a, b []Notice) bool {
	if len(a) != len(b) {
		return false
	}
	for i := range a {
		if !sameNotice(a[i], b[i]) {
			return false
		}
	}
	return true
}

func utc(s string) time.Time {
	t, err := time.Parse(time.RFC3339, s)
	if err != nil {
		panic(err)
	}
	return t
}

func TestParseSpot(t *testing.T) {
	failSafe := Notice{Source: SourceSpot, Action: "terminate", Deadline: now.Add(2 * time.Minute), Malformed: true}
	tests := []struct {
		name    string
		body    string
		want    Notice
		wantErr bool
	}{
		{"aemm terminate", readTestdata(t, "spot-aemm.json"),
			Notice{Source: SourceSpot, Action: "terminate", Time: utc("2026-11-29T16:44:18Z"), Deadline: utc("2026-11-29T16:44:18Z")}, false},
		{"docs terminate", readTestdata(t, "spot-docs.json"),
			Notice{Source: SourceSpot, Action: "terminate", Time: utc("2017-09-18T08:22:00Z"), Deadline: utc("2017-09-18T08:22:00Z")}, false},
		{"docs stop", `{"action": "stop", "time": "2017-09-18T08:22:00Z"}`,
			Notice{Source: SourceSpot, Action: "stop", Time: utc("2017-09-18T08:22:00Z"), Deadline: utc("2017-09-18T08:22:00Z")}, false},
		{"hibernate upper case, fraction, offset", `{"action":"HIBERNATE","time":"2017-09-18T10:22:00.5+02:00"}`,
			Notice{Source: SourceSpot, Action: "hibernate", Time: utc("2017-09-18T08:22:00.5Z"), Deadline: utc("2017-09-18T08:22:00.5Z")}, false},
		{"extra field", `{"action":"terminate","time":"2017-09-18T08:22:00Z","extra":[1,2]}`,
			Notice{Source: SourceSpot, Action: "terminate", Time: utc("2017-09-18T08:22:00Z"), Deadline: utc("2017-09-18T08:22:00Z")}, false},
		{"empty", ``, failSafe, true},
		{"white space", " \n\t", failSafe, true},
		{"null", `null`, failSafe, true},
		{"empty object", `{}`, failSafe, true},
		{"array", `[{"action":"terminate","time":"2017-09-18T08:22:00Z"}]`, failSafe, true},
		{"truncated", `{"action": "terminate", "time": "2017-09-18T08:2`, failSafe, true},
		{"trailing garbage", `{"action":"terminate","time":"2017-09-18T08:22:00Z"}}`, failSafe, true},
		{"action wrong type", `{"action": 1, "time": "2017-09-18T08:22:00Z"}`, failSafe, true},
		{"time wrong type", `{"action": "terminate", "time": 1505722920}`, failSafe, true},
		{"unknown action", `{"action": "reboot", "time": "2017-09-18T08:22:00Z"}`, failSafe, true},
		{"missing action", `{"time": "2017-09-18T08:22:00Z"}`, failSafe, true},
		{"missing time", `{"action": "stop"}`, failSafe, true},
		{"bad time", `{"action": "terminate", "time": "18 Sep 2017 08:22:00 GMT"}`, failSafe, true},
		{"html error page", readTestdata(t, "error-page.html"), failSafe, true},
		{"plain text", "Terminated", failSafe, true},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			got, err := ParseSpot([]byte(tt.body), now)
			if !sameNotice(got, tt.want) {
				t.Errorf("ParseSpot(%q) = %+v; want %+v", tt.body, got, tt.want)
			}
			if (err != nil) != tt.wantErr {
				t.Errorf("ParseSpot(%q) error = %v; want error: %v", tt.body, err, tt.wantErr)
			}
			if err != nil && !errors.Is(err, ErrMalformed) {
				t.Errorf("ParseSpot(%q) error = %v; want it to wrap ErrMalformed", tt.body, err)
			}
			if got.Raw != tt.body {
				t.Errorf("ParseSpot(%q).Raw = %q; want the body", tt.body, got.Raw)
			}
			if loc := got.Time.Location(); !got.Time.IsZero() && loc != time.UTC {
				// notice.json and /status say it as read: IMDS's offset (found from outside:
				// +01:00) in one, Z in the agent's own times.
				t.Errorf("ParseSpot(%q).Time in %v; want UTC", tt.body, loc)
			}
			if k := got.Key(); k != "spot/"+tt.want.Action {
				t.Errorf("ParseSpot(%q).Key() = %q; want %q", tt.body, k, "spot/"+tt.want.Action)
			}
		})
	}
}

func TestParseRebalance(t *testing.T) {
	tests := []struct {
		name    string
		body    string
		want    Notice
		wantErr bool
	}{
		{"aemm", readTestdata(t, "rebalance-aemm.json"),
			Notice{Source: SourceRebalance, Action: "rebalance", Time: utc("2026-11-29T16:42:18Z")}, false},
		{"docs", readTestdata(t, "rebalance-docs.json"),
			Notice{Source: SourceRebalance, Action: "rebalance", Time: utc("2020-10-27T08:22:00Z")}, false},
		{"offset", `{"noticeTime": "2020-10-27T09:22:00+01:00"}`,
			Notice{Source: SourceRebalance, Action: "rebalance", Time: utc("2020-10-27T08:22:00Z")}, false},
		{"empty", ``, Notice{}, true},
		{"null", `null`, Notice{}, true},
		{"empty object", `{}`, Notice{}, true},
		{"truncated", `{"noticeTime": "2020-10-27T08:2`, Notice{}, true},
		{"wrong type", `{"noticeTime": 1603786920}`, Notice{}, true},
		{"bad time", `{"noticeTime": "yesterday"}`, Notice{}, true},
		{"html error page", readTestdata(t, "error-page.html"), Notice{}, true},
		{"spot body", readTestdata(t, "spot-docs.json"), Notice{}, true},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			got, err := ParseRebalance([]byte(tt.body), now)
			if !sameNotice(got, tt.want) {
				t.Errorf("ParseRebalance(%q) = %+v; want %+v", tt.body, got, tt.want)
			}
			if (err != nil) != tt.wantErr || (err != nil && !errors.Is(err, ErrMalformed)) {
				t.Errorf("ParseRebalance(%q) error = %v; want error wrapping ErrMalformed: %v", tt.body, err, tt.wantErr)
			}
			if !tt.wantErr && !got.Deadline.IsZero() {
				t.Errorf("ParseRebalance(%q).Deadline = %v; want zero", tt.body, got.Deadline)
			}
			if loc := got.Time.Location(); !got.Time.IsZero() && loc != time.UTC {
				t.Errorf("ParseRebalance(%q).Time in %v; want UTC", tt.body, loc)
			}
		})
	}
}

func TestParseScheduled(t *testing.T) {
	aemmBefore := time.Date(2026, 11, 29, 16, 42, 16, 0, time.UTC)
	docsBefore := time.Date(2019, 1, 21, 9, 0, 43, 0, time.UTC)
	aemm := Notice{Source: SourceScheduled, Action: "system-reboot", EventID: "instance-event-1234567890abcdef0", Time: aemmBefore, Deadline: aemmBefore}
	docs := Notice{Source: SourceScheduled, Action: "system-reboot", EventID: "instance-event-0d59937288b749b32", Time: docsBefore, Deadline: docsBefore}
	stop := Notice{Source: SourceScheduled, Action: "instance-stop", EventID: "instance-event-2", Time: time.Date(2019, 1, 5, 7, 0, 0, 0, time.UTC), Deadline: time.Date(2019, 1, 5, 7, 0, 0, 0, time.UTC)}
	dueNow := Notice{Source: SourceScheduled, Action: "system-reboot", EventID: "e", Deadline: now, Malformed: true}
	tests := []struct {
		name    string
		body    string
		want    []Notice
		wantErr bool
	}{
		{"aemm active", readTestdata(t, "scheduled-aemm.json"), []Notice{aemm}, false},
		{"docs active, no NotBeforeDeadline", readTestdata(t, "scheduled-docs-active.json"), []Notice{docs}, false},
		{"docs canceled", readTestdata(t, "scheduled-docs-canceled.json"), nil, false},
		{"docs completed", readTestdata(t, "scheduled-docs-completed.json"), nil, false},
		{"empty array", `[]`, nil, false},
		{"empty state is active", `[{"Code":"instance-stop","EventId":"instance-event-2","NotBefore":"5 Jan 2019 07:00:00 GMT"}]`, []Notice{stop}, false},
		{"mixed states and duplicate", `[
			{"Code":"system-reboot","State":"completed","EventId":"instance-event-1","NotBefore":"1 Jan 2019 07:00:00 GMT"},
			{"Code":"instance-stop","State":"Active","EventId":"instance-event-2","NotBefore":"05 Jan 2019 07:00:00 GMT"},
			{"Code":"instance-stop","State":"active","EventId":"instance-event-2","NotBefore":"05 Jan 2019 07:00:00 GMT"},
			{"Code":"system-maintenance","State":"canceled","EventId":"instance-event-3","NotBefore":"garbage"}]`, []Notice{stop}, false},
		{"RFC 3339 time", `[{"Code":"instance-stop","State":"active","EventId":"instance-event-2","NotBefore":"2019-01-05T07:00:00Z"}]`, []Notice{stop}, false},
		{"empty", ``, nil, true},
		{"null", `null`, nil, true},
		{"object", `{"Code":"system-reboot"}`, nil, true},
		{"truncated", readTestdata(t, "scheduled-aemm.json")[:120], nil, true},
		{"wrong type", `[{"Code": 5, "State": "active", "NotBefore": "21 Jan 2019 09:00:43 GMT"}]`, nil, true},
		{"array of strings", `["system-reboot"]`, nil, true},
		{"active without code", `[{"State":"active","EventId":"e","NotBefore":"21 Jan 2019 09:00:43 GMT"}]`, nil, true},
		// Fail safe: an event whose start cannot be read is due now, and says so.
		{"active without NotBefore", `[{"Code":"system-reboot","State":"active","EventId":"e"}]`, []Notice{dueNow}, true},
		{"active with bad NotBefore", `[{"Code":"system-reboot","State":"active","EventId":"e","NotBefore":"Jan 21 2019"}]`, []Notice{dueNow}, true},
		// One bad event hides no other.
		{"a bad event among good ones", `[
			{"State":"active","EventId":"nameless","NotBefore":"21 Jan 2019 09:00:43 GMT"},
			{"Code":"instance-stop","State":"active","EventId":"instance-event-2","NotBefore":"05 Jan 2019 07:00:00 GMT"},
			{"Code":"system-reboot","State":"active","EventId":"e","NotBefore":"soon"}]`, []Notice{stop, dueNow}, true},
		{"html error page", readTestdata(t, "error-page.html"), nil, true},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			got, err := ParseScheduled([]byte(tt.body), now)
			if !sameNotices(got, tt.want) {
				t.Errorf("ParseScheduled(%q) = %+v; want %+v", tt.body, got, tt.want)
			}
			if (err != nil) != tt.wantErr || (err != nil && !errors.Is(err, ErrMalformed)) {
				t.Errorf("ParseScheduled(%q) error = %v; want error wrapping ErrMalformed: %v", tt.body, err, tt.wantErr)
			}
		})
	}
	t.Run("key", func(t *testing.T) {
		if got, want := aemm.Key(), "scheduled/system-reboot/instance-event-1234567890abcdef0"; got != want {
			t.Errorf("Key() = %q; want %q", got, want)
		}
	})
}

func TestParseASG(t *testing.T) {
	terminated := []Notice{{Source: SourceASG, Action: "Terminated", Deadline: now.Add(2 * time.Minute)}}
	tests := []struct {
		name    string
		body    string
		want    []Notice
		wantErr bool
	}{
		{"aemm terminated", readTestdata(t, "asg-aemm-terminated.txt"), terminated, false},
		{"terminated with newline", "Terminated\n", terminated, false},
		{"aemm in service", readTestdata(t, "asg-aemm-inservice.txt"), nil, false},
		{"pending wait", "Pending:Wait", nil, false},
		{"warmed terminated", "Warmed:Terminated", nil, false},
		{"warmed running", "Warmed:Running\n", nil, false},
		{"detached", "Detached", nil, false},
		{"empty", "", nil, true},
		{"white space", " \n", nil, true},
		{"html error page", readTestdata(t, "error-page.html"), nil, true},
		{"json", `{"state":"Terminated"}`, nil, true},
		{"two words", "In Service", nil, true},
		{"dangling colon", "Warmed:", nil, true},
		{"two colons", "A:B:C", nil, true},
		{"binary", "\x00\xff", nil, true},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			got, err := ParseASG([]byte(tt.body), now)
			if !sameNotices(got, tt.want) {
				t.Errorf("ParseASG(%q) = %+v; want %+v", tt.body, got, tt.want)
			}
			if (err != nil) != tt.wantErr || (err != nil && !errors.Is(err, ErrMalformed)) {
				t.Errorf("ParseASG(%q) error = %v; want error wrapping ErrMalformed: %v", tt.body, err, tt.wantErr)
			}
		})
	}
}

func TestRawTruncated(t *testing.T) {
	body := `{"action":"terminate","time":"2017-09-18T08:22:00Z","pad":"` + strings.Repeat("x", 10000) + `"}`
	got, err := ParseSpot([]byte(body), now)
	if err != nil {
		t.Fatalf("ParseSpot(long body) error = %v; want nil", err)
	}
	if len(got.Raw) != 4096 || got.Raw != body[:4096] {
		t.Errorf("ParseSpot(long body).Raw has %d bytes; want the first 4096", len(got.Raw))
	}
}

func TestSources(t *testing.T) {
	want := map[Source]string{
		SourceSpot:      "spot/instance-action",
		SourceRebalance: "events/recommendations/rebalance",
		SourceScheduled: "events/maintenance/scheduled",
		SourceASG:       "autoscaling/target-lifecycle-state",
	}
	if len(Sources) != len(want) {
		t.Fatalf("len(Sources) = %d; want %d", len(Sources), len(want))
	}
	for _, s := range Sources {
		if got := s.Path(); got != want[s] {
			t.Errorf("Source(%q).Path() = %q; want %q", s, got, want[s])
		}
		got, err := ParseSource(string(s))
		if got != s || err != nil {
			t.Errorf("ParseSource(%q) = %q, %v; want %q, nil", s, got, err, s)
		}
	}
	for _, name := range []string{"", "Spot", "spot/instance-action", "ASG", "rebalance "} {
		if got, err := ParseSource(name); err == nil {
			t.Errorf("ParseSource(%q) = %q, nil; want an error", name, got)
		}
	}
	if got := Source("nope").Path(); got != "" {
		t.Errorf("Source(%q).Path() = %q; want empty", "nope", got)
	}
}

func TestEventKindString(t *testing.T) {
	for k, want := range map[EventKind]string{Begin: "begin", End: "end", 0: "EventKind(0)", 7: "EventKind(7)"} {
		if got := k.String(); got != want {
			t.Errorf("EventKind(%d).String() = %q; want %q", int(k), got, want)
		}
	}
}

// A deadline the agent makes up (a malformed spot notice, an ASG termination) is in whole seconds
// like IMDS's own, and never later than two minutes on: notice.json and /status showed it to the
// nanosecond.
func TestFailSafeDeadlineInWholeSeconds(t *testing.T) {
	now := time.Date(2026, 12, 1, 17, 13, 3, 886302266, time.UTC)
	spot, err := ParseSpot([]byte("\x00garbage"), now)
	if err == nil || !spot.Malformed {
		t.Fatalf("ParseSpot(garbage) = %+v, %v; want a malformed notice", spot, err)
	}
	asg, err := ParseASG([]byte("Terminated"), now)
	if err != nil || len(asg) != 1 {
		t.Fatalf("ParseASG(Terminated) = %+v, %v", asg, err)
	}
	for _, d := range []time.Time{spot.Deadline, asg[0].Deadline} {
		if d.Nanosecond() != 0 || d.After(now.Add(FailSafeDelay)) || !d.After(now.Add(FailSafeDelay-time.Second)) {
			t.Errorf("deadline %v; want %v to the whole second below", d, now.Add(FailSafeDelay))
		}
	}
}
