package main

import "syscall"

// drillChildAttr makes a trainer the drill starts end with the drill: a drill killed (kill -9,
// an OOM kill) left its demo trainer running for ever (found in CI). Linux sends it SIGTERM when
// the drill goes.
func drillChildAttr() *syscall.SysProcAttr {
	return &syscall.SysProcAttr{Pdeathsig: syscall.SIGTERM}
}
