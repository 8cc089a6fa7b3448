package main

import (
	"fmt"
	"io"
	"sync"
	"time"
)

// gpuAnswerLimit is how long `spotguard gpu` waits for one call into NVML or the CUDA driver
// (opening either, one sample of every GPU; the probe's copies get twice --probe-duration more)
// before it reports the GPUs hung.
const gpuAnswerLimit = 30 * time.Second

// gpuWatch runs the command's calls into NVML and the CUDA driver with a time limit each: they
// cannot be cancelled, and a hung GPU or driver (an Xid 79, a GPU fallen off the bus) blocks one
// for minutes or for good, which would hang a launch check for ever. A call that does not return
// in time is left running; the command reports it (gpuHung) and ends without waiting for it,
// and without closing NVML, which would block as well.
type gpuWatch struct {
	limit time.Duration

	mu   sync.Mutex
	hung string // what did not return, and how long it was waited for; "" while every call has
}

// do runs f, a call into what, and reports whether it returned within the limit and extra.
func (w *gpuWatch) do(what string, extra time.Duration, f func()) bool {
	done := make(chan struct{})
	go func() {
		defer close(done)
		f()
	}()
	return w.await(what, extra, done)
}

// await waits for done, closed when a call into what has returned, and reports whether it was
// within the limit and extra. One that was not marks the watch hung.
func (w *gpuWatch) await(what string, extra time.Duration, done <-chan struct{}) bool {
	t := time.NewTimer(w.limit + extra)
	defer t.Stop()
	select {
	case <-done:
		return true
	case <-t.C:
		w.mu.Lock()
		defer w.mu.Unlock()
		if w.hung == "" {
			w.hung = fmt.Sprintf("%s has not returned after %s", what, seconds(w.limit+extra))
		}
		return false
	}
}

// hungCall says what did not return in time; "" if every call has.
func (w *gpuWatch) hungCall() string {
	w.mu.Lock()
	defer w.mu.Unlock()
	return w.hung
}

// gpuHung says why the command stops without an answer, and returns exit 3, as for a degraded
// GPU: a launch check replaces the instance.
func gpuHung(stderr io.Writer, w *gpuWatch) int {
	fmt.Fprintf(stderr, "spotguard gpu: %s: a GPU or its driver hangs; look for Xid errors in the kernel log (journalctl -k | grep -i xid) and replace the instance\n", w.hungCall())
	return exitGPUDegraded
}
