//go:build !linux

package e2e

// evictPageCache does nothing where the kernel has no fadvise.
func evictPageCache() {}
