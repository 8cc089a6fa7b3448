//go:build !linux

package main

import "syscall"

// drillChildAttr is nil where the kernel cannot end a child with its parent: a drill killed there
// leaves its trainer running.
func drillChildAttr() *syscall.SysProcAttr { return nil }
