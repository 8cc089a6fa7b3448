//go:build linux && !cgo && !nogpu

package nvml

// On Linux spotguard reads the GPUs through NVML, which needs cgo. This build has cgo off (Go found
// no C compiler, or CGO_ENABLED=0), which would drop GPU support without a word, so it fails
// instead, naming the fix: install gcc (cgo then turns on by itself), or build without GPU support
// on purpose with -tags nogpu.
const _ = spotguard_on_linux_needs_cgo_for_GPU_support__install_gcc_or_build_with_tags_nogpu
