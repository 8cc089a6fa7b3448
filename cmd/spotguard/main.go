// Command spotguard keeps GPU training alive on EC2 Spot: it watches the instance metadata
// service for interruption notices and signals the trainer to checkpoint.
package main

import (
	"context"
	"os"
	"os/signal"
	"syscall"
	"time"

	"github.com/rs/zerolog"
)

// setLogGlobals sets zerolog's process-wide formats, once, before anything logs.
func setLogGlobals() {
	// Durations in log lines are seconds, in fields named *_s. Ours are written with logSeconds
	// (TestLogDurationsInSeconds keeps zerolog's Dur out of the code); this covers anything else.
	zerolog.DurationFieldUnit = time.Second
	zerolog.DurationFieldInteger = false
	// Times in UTC to the millisecond: a notice's detection, signal and first file come within a
	// second of each other, and a line's time is how a log tells them apart.
	zerolog.TimeFieldFormat = logTimeFormat
	zerolog.TimestampFunc = func() time.Time { return time.Now().UTC() }
}

func main() {
	setLogGlobals()
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	code := run(ctx, os.Args[1:], os.Environ(), os.Stdout, os.Stderr)
	stop()
	os.Exit(code)
}
