package imds

import (
	"errors"
	"os"
	"path/filepath"
	"testing"
	"time"
)

// addSeeds adds every testdata body and a set of malformed bodies to the corpus of f.
func addSeeds(f *testing.F) {
	names, err := filepath.Glob(filepath.Join("testdata", "*.*"))
	if err != nil {
		f.Fatal(err)
	}
	for _, name := range names {
		b, err := os.ReadFile(name)
		if err != nil {
			f.Fatal(err)
		}
		f.Add(b)
	}
	for _, s := range []string{
		"", " ", "null", "{}", "[]", "[{}]", "[null]", "\x00", "\xff\xfe",
		`{"action":"terminate","time":"2017-09-18T08:22:00Z"}`,
		`{"action":"terminate","time":"2017-09-18T08:22:00Z"`,
		`{"action":1,"time":true}`,
		`{"noticeTime":"2020-10-27T08:22:00Z"}`,
		`[{"Code":"system-reboot","State":"active","EventId":"e","NotBefore":"21 Jan 2019 09:00:43 GMT"}]`,
		`[{"Code":"system-reboot","State":"active","EventId":"e","NotBefore":"99 Foo 2019 99:99:99 GMT"}]`,
		"Terminated", "Warmed:Terminated", "In Service",
	} {
		f.Add([]byte(s))
	}
}

// fuzzNow is the detection time of the fuzz tests.
var fuzzNow = time.Date(2026, 11, 29, 16, 40, 0, 0, time.UTC)

func FuzzParseSpot(f *testing.F) {
	addSeeds(f)
	f.Fuzz(func(t *testing.T, body []byte) {
		n, err := ParseSpot(body, fuzzNow)
		if n.Source != SourceSpot {
			t.Fatalf("ParseSpot(%q).Source = %q; want spot", body, n.Source)
		}
		switch n.Action {
		case "terminate", "stop", "hibernate":
		default:
			t.Fatalf("ParseSpot(%q).Action = %q; want terminate, stop or hibernate", body, n.Action)
		}
		if n.Deadline.IsZero() {
			t.Fatalf("ParseSpot(%q).Deadline is zero; every 200 body must give a deadline", body)
		}
		if len(n.Raw) > maxRaw {
			t.Fatalf("ParseSpot(%q).Raw has %d bytes; want at most %d", body, len(n.Raw), maxRaw)
		}
		if err != nil {
			if !errors.Is(err, ErrMalformed) {
				t.Fatalf("ParseSpot(%q) error = %v; want it to wrap ErrMalformed", body, err)
			}
			want := Notice{Source: SourceSpot, Action: "terminate", Deadline: fuzzNow.Add(FailSafeDelay), Malformed: true}
			if !sameNotice(n, want) {
				t.Fatalf("ParseSpot(%q) = %+v, %v; want the fail-safe notice %+v", body, n, err, want)
			}
		} else if n.Malformed || !n.Deadline.Equal(n.Time) {
			t.Fatalf("ParseSpot(%q) = %+v, nil; want Malformed false and Deadline == Time", body, n)
		}
	})
}

func FuzzParseRebalance(f *testing.F) {
	addSeeds(f)
	f.Fuzz(func(t *testing.T, body []byte) {
		n, err := ParseRebalance(body, fuzzNow)
		if err != nil {
			if !errors.Is(err, ErrMalformed) || n != (Notice{}) {
				t.Fatalf("ParseRebalance(%q) = %+v, %v; want zero Notice and ErrMalformed", body, n, err)
			}
			return
		}
		if n.Source != SourceRebalance || n.Action != "rebalance" || !n.Deadline.IsZero() {
			t.Fatalf("ParseRebalance(%q) = %+v; want a rebalance notice without deadline", body, n)
		}
	})
}

func FuzzParseScheduled(f *testing.F) {
	addSeeds(f)
	f.Fuzz(func(t *testing.T, body []byte) {
		ns, err := ParseScheduled(body, fuzzNow)
		if err != nil && !errors.Is(err, ErrMalformed) {
			t.Fatalf("ParseScheduled(%q) = %+v, %v; want errors wrapping ErrMalformed", body, ns, err)
		}
		seen := make(map[string]bool)
		for _, n := range ns {
			switch {
			case n.Source != SourceScheduled || n.Action == "":
				t.Fatalf("ParseScheduled(%q) gave %+v; want a scheduled notice with Action", body, n)
			case n.Malformed && (err == nil || !n.Time.IsZero() || !n.Deadline.Equal(fuzzNow)):
				t.Fatalf("ParseScheduled(%q) gave %+v, %v; want a fail-safe notice due now only with an error", body, n, err)
			case !n.Malformed && (n.Time.IsZero() || !n.Deadline.Equal(n.Time)):
				t.Fatalf("ParseScheduled(%q) gave %+v; want Deadline == Time", body, n)
			}
			if seen[n.Key()] {
				t.Fatalf("ParseScheduled(%q) gave key %q twice", body, n.Key())
			}
			seen[n.Key()] = true
		}
	})
}

func FuzzParseASG(f *testing.F) {
	addSeeds(f)
	f.Fuzz(func(t *testing.T, body []byte) {
		ns, err := ParseASG(body, fuzzNow)
		if err != nil {
			if !errors.Is(err, ErrMalformed) || ns != nil {
				t.Fatalf("ParseASG(%q) = %+v, %v; want nil and ErrMalformed", body, ns, err)
			}
			return
		}
		if len(ns) > 1 {
			t.Fatalf("ParseASG(%q) gave %d notices; want at most 1", body, len(ns))
		}
		for _, n := range ns {
			if n.Key() != "asg/Terminated" || !n.Deadline.Equal(fuzzNow.Add(FailSafeDelay)) {
				t.Fatalf("ParseASG(%q) = %+v; want asg/Terminated due in 2 minutes", body, n)
			}
		}
	})
}
