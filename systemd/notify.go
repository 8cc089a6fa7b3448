// Package systemd is spotguard's side of systemd: the sd_notify protocol (readiness, status
// lines, watchdog pings, stopping), and, beside this file, the unit files, the install script
// and the package definition.
package systemd

import (
	"errors"
	"fmt"
	"net"
	"strconv"
	"strings"
	"sync"
	"time"
)

// Notifier sends sd_notify messages to the service manager. The zero Notifier, and one made
// for an empty socket (not started by systemd), does nothing: every method returns nil.
// It is safe for concurrent use.
type Notifier struct {
	addr *net.UnixAddr // nil: no-op

	mu   sync.Mutex
	conn *net.UnixConn
}

// NewNotifier returns a Notifier for socket, the value of NOTIFY_SOCKET: a file system path, or
// an abstract socket name starting with "@". An empty socket gives a no-op Notifier.
func NewNotifier(socket string) *Notifier {
	if socket == "" {
		return &Notifier{}
	}
	name := socket
	if strings.HasPrefix(name, "@") {
		name = "\x00" + name[1:]
	}
	return &Notifier{addr: &net.UnixAddr{Name: name, Net: "unixgram"}}
}

// Enabled reports whether messages go anywhere.
func (n *Notifier) Enabled() bool { return n != nil && n.addr != nil }

// Notify sends one message of newline-separated VAR=value assignments. It returns nil when the
// Notifier is a no-op or the message was sent, and an error when the socket cannot be reached
// or the send fails (the next call tries to connect again).
func (n *Notifier) Notify(state string) error {
	if !n.Enabled() {
		return nil
	}
	n.mu.Lock()
	defer n.mu.Unlock()
	if n.conn == nil {
		c, err := net.DialUnix("unixgram", nil, n.addr)
		if err != nil {
			return fmt.Errorf("sd_notify: %w", err)
		}
		n.conn = c
	}
	if _, err := n.conn.Write([]byte(state)); err != nil {
		n.conn.Close()
		n.conn = nil
		return fmt.Errorf("sd_notify: %w", err)
	}
	return nil
}

// Ready says start-up is complete, with a status line.
func (n *Notifier) Ready(status string) error { return n.Notify("READY=1\nSTATUS=" + oneLine(status)) }

// Status sets the one-line status systemctl status shows.
func (n *Notifier) Status(status string) error { return n.Notify("STATUS=" + oneLine(status)) }

// Watchdog pings the service manager's watchdog.
func (n *Notifier) Watchdog() error { return n.Notify("WATCHDOG=1") }

// Stopping says the service is stopping, with a status line.
func (n *Notifier) Stopping(status string) error {
	return n.Notify("STOPPING=1\nSTATUS=" + oneLine(status))
}

// Reloading says a configuration reload has begun; Ready ends it.
func (n *Notifier) Reloading() error { return n.Notify("RELOADING=1") }

// Close releases the socket; the Notifier may be used again afterwards.
func (n *Notifier) Close() error {
	if !n.Enabled() {
		return nil
	}
	n.mu.Lock()
	defer n.mu.Unlock()
	if n.conn == nil {
		return nil
	}
	err := n.conn.Close()
	n.conn = nil
	return err
}

func oneLine(s string) string { return strings.ReplaceAll(s, "\n", " ") }

// WatchdogInterval returns how often to ping the watchdog: half of WATCHDOG_USEC, as systemd
// recommends. It returns 0 (no pings) when usec is empty, or when pid is set and is not self
// (the watchdog is meant for another process); and an error when either value is malformed.
func WatchdogInterval(usec, pid string, self int) (time.Duration, error) {
	if usec == "" {
		return 0, nil
	}
	if pid != "" {
		p, err := strconv.Atoi(pid)
		if err != nil {
			return 0, fmt.Errorf("WATCHDOG_PID=%q: not a number", pid)
		}
		if p != self {
			return 0, nil
		}
	}
	us, err := strconv.ParseInt(usec, 10, 64)
	if err != nil || us <= 0 {
		return 0, errors.New("WATCHDOG_USEC=" + strconv.Quote(usec) + ": not a positive number")
	}
	return time.Duration(us) * time.Microsecond / 2, nil
}
