package checkpoint

import (
	"crypto/tls"
	"net"
	"syscall"

	"golang.org/x/sys/unix"
)

// unsentBytes returns how many bytes written to c its peer has not acknowledged yet (SIOCOUTQ),
// and whether it could tell (a TCP connection, under TLS or not).
func unsentBytes(c net.Conn) (int, bool) {
	if t, ok := c.(*tls.Conn); ok {
		c = t.NetConn()
	}
	sc, ok := c.(syscall.Conn)
	if !ok {
		return 0, false
	}
	raw, err := sc.SyscallConn()
	if err != nil {
		return 0, false
	}
	n, ierr := 0, error(nil)
	if err := raw.Control(func(fd uintptr) { n, ierr = unix.IoctlGetInt(int(fd), unix.SIOCOUTQ) }); err != nil || ierr != nil {
		return 0, false
	}
	return n, true
}
