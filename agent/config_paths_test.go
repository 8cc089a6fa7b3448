package agent

import (
	"net"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"
)

// A file:// store or agent.runtime_dir at or inside checkpoint.dir (also through a symlink) would
// have the agent upload what it writes itself (I4): Validate refuses it, naming both keys, their
// values and where each came from. A checkpoint.dir elsewhere in the store's root is fine, but
// not in the directory the store writes the job into.
func TestStoreOrRuntimeDirInsideCheckpointDirIsRefused(t *testing.T) {
	base := t.TempDir()
	ck := filepath.Join(base, "ckpt")
	if err := os.Mkdir(ck, 0o755); err != nil {
		t.Fatal(err)
	}
	link := filepath.Join(base, "link") // → ckpt
	if err := os.Symlink(ck, link); err != nil {
		t.Fatal(err)
	}
	realCk, err := filepath.EvalSymlinks(ck) // the temp dir may itself be under a symlink
	if err != nil {
		t.Fatal(err)
	}
	other := t.TempDir()
	tests := []struct {
		name            string
		dir, store, run string
		want            []string // every one in a single problem; none: valid
	}{
		{name: "store is checkpoint.dir", dir: ck, store: "file://" + ck, run: filepath.Join(other, "run"),
			want: []string{`store.url: "file://` + ck + `" from SPOTGUARD_STORE_URL is the same directory as checkpoint.dir "` + ck + `" from ` + "%CONFIG%:4",
				"the agent would upload its own store into itself"}},
		{name: "store inside checkpoint.dir", dir: ck, store: "file://" + ck + "/store", run: filepath.Join(other, "run"),
			want: []string{`store.url: "file://` + ck + `/store" from SPOTGUARD_STORE_URL is inside checkpoint.dir "` + ck + `" from %CONFIG%:4`}},
		{name: "store inside checkpoint.dir through a symlink", dir: ck, store: "file://" + link + "/store", run: filepath.Join(other, "run"),
			want: []string{`store.url: "file://` + link + `/store" from SPOTGUARD_STORE_URL is inside checkpoint.dir "` + ck + `"`,
				"(with symlinks resolved: " + realCk + "/store is inside " + realCk + ")"}},
		{name: "checkpoint.dir through a symlink holds the store", dir: link + "/", store: "file://" + ck + "/not-yet/store", run: filepath.Join(other, "run"),
			want: []string{`store.url: "file://` + ck + `/not-yet/store" from SPOTGUARD_STORE_URL is inside checkpoint.dir "` + link + `/"`}},
		{name: "runtime dir is checkpoint.dir", dir: ck, store: "file://" + other, run: ck,
			want: []string{`agent.runtime_dir: "` + ck + `" from SPOTGUARD_AGENT_RUNTIME_DIR is the same directory as checkpoint.dir "` + ck + `" from %CONFIG%:4`,
				"notice.json and upload journal"}},
		{name: "runtime dir inside checkpoint.dir", dir: ck, store: "file://" + other, run: ck + "/run/spotguard",
			want: []string{`agent.runtime_dir: "` + ck + `/run/spotguard" from SPOTGUARD_AGENT_RUNTIME_DIR is inside checkpoint.dir "` + ck + `" from %CONFIG%:4`}},
		{name: "runtime dir inside checkpoint.dir through a symlink", dir: ck, store: "file://" + other, run: link + "/run",
			want: []string{`agent.runtime_dir: "` + link + `/run" from SPOTGUARD_AGENT_RUNTIME_DIR is inside checkpoint.dir`}},
		{name: "checkpoint.dir is where the store writes the job", dir: ck, store: "file://" + base, run: filepath.Join(other, "run"),
			want: []string{`checkpoint.dir: "` + ck + `" from %CONFIG%:4 is the same directory as the store's directory of job ckpt, ` + ck + ` (`,
				`store.url "file://` + base + `" from SPOTGUARD_STORE_URL`, `store.job "ckpt" from %CONFIG%:6`}},
		// Allowed.
		{name: "checkpoint.dir inside the store's root", dir: ck, store: "file://" + filepath.Dir(base), run: filepath.Join(other, "run")},
		{name: "siblings", dir: ck, store: "file://" + base + "/ckpt-store", run: base + "/ckpt-run"},
		{name: "an s3 store", dir: ck, store: "s3://bucket" + ck, run: filepath.Join(other, "run")},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			job := "ckpt"
			path := writeConfig(t, "trainer:\n  match: x\ncheckpoint:\n  dir: "+tt.dir+"\nstore:\n  job: "+job+"\n")
			c := mustLoad(t, LoadOptions{Path: path, Environ: []string{"SPOTGUARD_STORE_URL=" + tt.store, "SPOTGUARD_AGENT_RUNTIME_DIR=" + tt.run}})
			err := c.Validate()
			if len(tt.want) == 0 {
				if err != nil {
					t.Errorf("Got(%s) = %v; want nil", tt.name, err)
				}
				return
			}
			if err == nil {
				t.Fatalf("Got(%s) = nil; want a problem containing %q", tt.name, tt.want)
			}
			lines := strings.Split(err.Error(), "\n")
			if len(lines) != 1 {
				t.Errorf("Got(%s) = %d problems; want 1:\n%s", tt.name, len(lines), err)
			}
			for _, w := range tt.want {
				w = strings.ReplaceAll(w, "%CONFIG%", path)
				if !strings.Contains(lines[0], w) {
					t.Errorf("Got(%s) = %q; want it to contain %q", tt.name, lines[0], w)
				}
			}
		})
	}
}

// checkpoint.dir and agent.runtime_dir must be absolute: under systemd the working directory is
// /, so a relative one would be watched (or written) somewhere nobody meant.
func TestRelativePathsAreRefused(t *testing.T) {
	path := writeConfig(t, "trainer:\n  match: x\ncheckpoint:\n  dir: ckpt\nstore:\n  url: file:///srv/store\n  job: j\n")
	c := mustLoad(t, LoadOptions{Path: path, Environ: []string{"SPOTGUARD_AGENT_RUNTIME_DIR=./run"}})
	err := c.Validate()
	if err == nil {
		t.Fatal("Validate() = nil; want both relative paths refused")
	}
	for _, want := range []string{
		`checkpoint.dir: "ckpt" from ` + path + `:4: must be an absolute path`,
		`agent.runtime_dir: "./run" from SPOTGUARD_AGENT_RUNTIME_DIR: must be an absolute path`,
	} {
		if !strings.Contains(err.Error(), want) {
			t.Errorf("Validate() lacks %q; got:\n%v", want, err)
		}
	}
	if n := len(strings.Split(err.Error(), "\n")); n != 2 {
		t.Errorf("Validate() gave %d problems; want 2 (nothing more about the same keys):\n%v", n, err)
	}
	// The configuration does not load, for --get and every command alike.
	if n := len(c.LoadProblems()); n != 2 {
		t.Errorf("LoadProblems() = %d; want 2", n)
	}
}

// http.listen is refused by the configuration when `run` could not listen on it (a port out of
// range, not host:port), so that `config` says so instead of `run` failing later; an empty port
// (any free one) and a service name, which net.Listen would take, are refused too: the port is a
// number.
func TestHTTPListenRefusesWhatRunCannotListenOn(t *testing.T) {
	tests := []struct {
		value         string
		want          string // "" = valid
		listenAccepts bool   // net.Listen takes what the configuration refuses
	}{
		{value: "127.0.0.1:99999", want: `http.listen: "127.0.0.1:99999" from SPOTGUARD_HTTP_LISTEN: port "99999": want a number from 0 to 65535`},
		{value: "127.0.0.1:65536", want: `port "65536": want a number from 0 to 65535`},
		{value: "127.0.0.1:-1", want: `port "-1": want a number from 0 to 65535`},
		{value: "127.0.0.1:99999999999999999999", want: `want a number from 0 to 65535`},
		{value: "127.0.0.1", want: "not host:port"},
		{value: "127.0.0.1:", want: `port "": want a number from 0 to 65535`, listenAccepts: true},
		{value: "127.0.0.1:http", want: `port "http": want a number from 0 to 65535`, listenAccepts: true},
		{value: "127.0.0.1:0"},
		{value: "127.0.0.1:65535"},
		{value: "[::1]:9402"},
		{value: "localhost:9402"},
		{value: ""},
	}
	for _, tt := range tests {
		t.Run(tt.value, func(t *testing.T) {
			c := mustLoad(t, LoadOptions{Environ: []string{"SPOTGUARD_TRAINER_MATCH=x", "SPOTGUARD_HTTP_LISTEN=" + tt.value}})
			err := c.Validate()
			switch {
			case tt.want == "" && err != nil:
				t.Errorf("Got(%q) = %v; want nil", tt.value, err)
			case tt.want != "" && (err == nil || !strings.Contains(err.Error(), tt.want)):
				t.Errorf("Got(%q) = %v; want an error containing %q", tt.value, err, tt.want)
			}
			if tt.want != "" && !tt.listenAccepts {
				if ln, err := net.Listen("tcp", tt.value); err == nil {
					ln.Close()
					t.Errorf("net.Listen(%q) succeeded; want it to refuse the address as the configuration does", tt.value)
				}
			}
		})
	}
}

// The listener has no authentication: one that is not on a loopback address is a warning.
func TestHTTPListenNotOnLoopbackWarns(t *testing.T) {
	tests := []struct {
		value string
		warn  bool
	}{
		{"0.0.0.0:9402", true},
		{":9402", true},
		{"[::]:9402", true},
		{"10.0.0.1:9402", true},
		{"ip-10-0-0-1.ec2.internal:9402", true},
		{"127.0.0.1:9402", false},
		{"127.0.0.2:9402", false},
		{"[::1]:9402", false},
		{"localhost:9402", false},
		{"", false},
	}
	for _, tt := range tests {
		t.Run(tt.value, func(t *testing.T) {
			c := mustLoad(t, LoadOptions{Environ: []string{"SPOTGUARD_TRAINER_MATCH=x", "SPOTGUARD_HTTP_LISTEN=" + tt.value}})
			if err := c.Validate(); err != nil {
				t.Fatalf("Validate() = %v; want nil (a warning only)", err)
			}
			w := c.Warnings()
			got := slices.ContainsFunc(w, func(w Warning) bool {
				return strings.HasPrefix(w.Text, "http.listen: "+tt.value+": not a loopback address") && strings.Contains(w.Text, "no authentication") &&
					strings.Contains(w.Fix, "127.0.0.1")
			})
			if got != tt.warn || len(w) > 1 {
				t.Errorf("Got(%q) = %q; want a warning about http.listen: %v", tt.value, w, tt.warn)
			}
		})
	}
	c := mustLoad(t, LoadOptions{Environ: []string{"SPOTGUARD_HTTP_LISTEN=0.0.0.0:9402", "SPOTGUARD_HTTP_PPROF=true"}})
	if w := c.Warnings(); len(w) != 1 || !strings.Contains(w[0].Text, "/debug/pprof/") {
		t.Errorf("Warnings() with http.pprof = %q; want the warning to name the profiles", w)
	}
}

// store.job is the first element of every key the agent writes: white space only, control
// characters (a newline) and names longer than 256 bytes are refused; at most 256 are fine.
func TestStoreJobRefusesBlankControlAndLongNames(t *testing.T) {
	tests := []struct {
		job  string
		want string // "" = valid
	}{
		{"   ", `store.job: "   " from SPOTGUARD_STORE_JOB: want a name, not only white space`},
		{"\t", `want a name, not only white space`},
		{"run\n2", `store.job: "run\n2" from SPOTGUARD_STORE_JOB: must not contain control characters (such as a newline or a tab)`},
		{"run\x7f", `must not contain control characters`},
		{"run\u0085", `must not contain control characters`},
		{"run\uffff", `must not contain U+FFFE or U+FFFF`},
		{"run\xff", `store.job: "run\xff" from SPOTGUARD_STORE_JOB: not valid UTF-8`},
		{strings.Repeat("j", 257), `store.job: "` + strings.Repeat("j", 257) + `" from SPOTGUARD_STORE_JOB: 257 bytes long: want at most 256`},
		{strings.Repeat("é", 129), `258 bytes long: want at most 256`},
		{strings.Repeat("j", 256), ""},
		{strings.Repeat("é", 128), ""},
		{"llama-70b run 3", ""},
		// A file:// store keeps the job as a directory name: 255 bytes at most (found from
		// outside: 256 passed config, then every upload failed "file name too long").
		{"file:" + strings.Repeat("j", 256), `store.job: 256 bytes long: a file:// store keeps it as a directory name, at most 255 bytes (store.url "file:///`},
		{"file:" + strings.Repeat("j", 255), ""},
	}
	for _, tt := range tests {
		t.Run(tt.job, func(t *testing.T) {
			url, job := "s3://b/p", tt.job
			if j, ok := strings.CutPrefix(job, "file:"); ok {
				url, job = "file://"+t.TempDir(), j
			}
			c := mustLoad(t, LoadOptions{Environ: []string{"SPOTGUARD_TRAINER_MATCH=x", "SPOTGUARD_STORE_URL=" + url,
				"SPOTGUARD_CHECKPOINT_DIR=" + t.TempDir(), "SPOTGUARD_STORE_JOB=" + job}})
			for _, err := range []error{c.Validate(), c.ValidateStore()} {
				switch {
				case tt.want == "" && err != nil:
					t.Errorf("Got(%q) = %v; want nil", tt.job, err)
				case tt.want != "" && (err == nil || !strings.Contains(err.Error(), tt.want)):
					t.Errorf("Got(%q) = %v; want an error containing %q", tt.job, err, tt.want)
				case tt.want != "" && len(strings.Split(err.Error(), "\n")) != 1:
					t.Errorf("Got(%q) = %v; want one problem (not also 'required')", tt.job, err)
				}
			}
		})
	}
}
