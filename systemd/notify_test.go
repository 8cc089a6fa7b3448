package systemd

import (
	"net"
	"path/filepath"
	"testing"
	"time"
)

// listen opens a real unixgram socket in a temp dir, as systemd's NOTIFY_SOCKET.
func listen(t *testing.T) (*net.UnixConn, string) {
	t.Helper()
	path := filepath.Join(t.TempDir(), "notify.sock")
	c, err := net.ListenUnixgram("unixgram", &net.UnixAddr{Name: path, Net: "unixgram"})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { c.Close() })
	return c, path
}

func read(t *testing.T, c *net.UnixConn) string {
	t.Helper()
	c.SetReadDeadline(time.Now().Add(5 * time.Second))
	buf := make([]byte, 4096)
	n, err := c.Read(buf)
	if err != nil {
		t.Fatalf("read notify socket: %v", err)
	}
	return string(buf[:n])
}

func TestNotifierMessages(t *testing.T) {
	c, path := listen(t)
	n := NewNotifier(path)
	defer n.Close()
	steps := []struct {
		send func() error
		want string
	}{
		{func() error { return n.Ready("watching") }, "READY=1\nSTATUS=watching"},
		{func() error { return n.Status("notice: uploading 61 %\nnext") }, "STATUS=notice: uploading 61 % next"},
		{n.Watchdog, "WATCHDOG=1"},
		{n.Reloading, "RELOADING=1"},
		{func() error { return n.Stopping("bye") }, "STOPPING=1\nSTATUS=bye"},
	}
	for _, s := range steps {
		if err := s.send(); err != nil {
			t.Fatalf("send %q: %v", s.want, err)
		}
		if got := read(t, c); got != s.want {
			t.Errorf("Got(%q) = %q; want %q", s.want, got, s.want)
		}
	}
}

func TestNotifierNoop(t *testing.T) {
	n := NewNotifier("")
	if n.Enabled() {
		t.Error("empty socket: Enabled() = true")
	}
	for _, err := range []error{n.Ready("x"), n.Status("x"), n.Watchdog(), n.Stopping("x"), n.Close()} {
		if err != nil {
			t.Errorf("no-op notifier returned %v", err)
		}
	}
	var zero Notifier
	if err := zero.Ready("x"); err != nil {
		t.Errorf("zero notifier: %v", err)
	}
}

func TestNotifierAbsentSocketReconnects(t *testing.T) {
	path := filepath.Join(t.TempDir(), "later.sock")
	n := NewNotifier(path)
	if err := n.Watchdog(); err == nil {
		t.Fatal("send to a missing socket succeeded")
	}
	c, err := net.ListenUnixgram("unixgram", &net.UnixAddr{Name: path, Net: "unixgram"})
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	if err := n.Watchdog(); err != nil {
		t.Fatalf("after the socket appeared: %v", err)
	}
	if got := read(t, c); got != "WATCHDOG=1" {
		t.Errorf("got %q", got)
	}
}

func TestAbstractSocket(t *testing.T) {
	name := "@spotguard-test-" + filepath.Base(t.TempDir())
	c, err := net.ListenUnixgram("unixgram", &net.UnixAddr{Name: "\x00" + name[1:], Net: "unixgram"})
	if err != nil {
		t.Skipf("abstract sockets unavailable: %v", err)
	}
	defer c.Close()
	n := NewNotifier(name)
	if err := n.Ready("ok"); err != nil {
		t.Fatal(err)
	}
	if got := read(t, c); got != "READY=1\nSTATUS=ok" {
		t.Errorf("got %q", got)
	}
}

func TestWatchdogInterval(t *testing.T) {
	tests := []struct {
		usec, pid string
		want      time.Duration
		err       bool
	}{
		{"", "", 0, false},
		{"30000000", "", 15 * time.Second, false},
		{"30000000", "42", 15 * time.Second, false},
		{"30000000", "43", 0, false},
		{"abc", "", 0, true},
		{"-5", "", 0, true},
		{"1000", "x", 0, true},
	}
	for _, tt := range tests {
		got, err := WatchdogInterval(tt.usec, tt.pid, 42)
		if got != tt.want || (err != nil) != tt.err {
			t.Errorf("Got(%q, %q) = %v, %v; want %v, error %v", tt.usec, tt.pid, got, err, tt.want, tt.err)
		}
	}
}
