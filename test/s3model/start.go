package s3model

import (
	"context"
	"errors"
	"net"
	"testing"
)

// Start runs a Proxy for opts on 127.0.0.1, on a port it picks, until the test ends (a serving
// error then fails the test), and returns it and its endpoint: https://… when opts.TLS is set,
// else http://….
func Start(tb testing.TB, opts Options) (*Proxy, string) {
	tb.Helper()
	p, err := New(opts)
	if err != nil {
		tb.Fatal(err)
	}
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		tb.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	served := make(chan error, 1)
	go func() { served <- p.Serve(ctx, ln) }()
	tb.Cleanup(func() {
		cancel()
		if err := <-served; err != nil && !errors.Is(err, net.ErrClosed) {
			tb.Errorf("s3 model: %v", err)
		}
	})
	scheme := "http"
	if opts.TLS != nil {
		scheme = "https"
	}
	return p, scheme + "://" + ln.Addr().String()
}
