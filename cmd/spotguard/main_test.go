package main

import (
	"os"
	"testing"
)

// TestMain sets zerolog's formats as main does, so that what the tests log is what the command
// logs.
func TestMain(m *testing.M) {
	setLogGlobals()
	os.Exit(m.Run())
}
