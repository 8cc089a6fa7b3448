package agent

import (
	"context"
	"strings"
	"sync"
	"testing"
	"testing/synctest"
	"time"

	"github.com/rs/zerolog"

	"github.com/spotguard/spotguard/agent/imds"
	"github.com/spotguard/spotguard/nvml"
)

// hangingGPUs is fakeGPUs whose calls block from hang until release, whatever their context
// says, as a call into a hung driver does. entered gets a value each time a Sample blocks.
type hangingGPUs struct {
	fakeGPUs
	entered chan struct{}

	mu     sync.Mutex
	stuck  chan struct{} // non-nil while hung
	closed bool
}

func newHangingGPUs() *hangingGPUs { return &hangingGPUs{entered: make(chan struct{}, 16)} }

func (h *hangingGPUs) hang() {
	h.mu.Lock()
	defer h.mu.Unlock()
	h.stuck = make(chan struct{})
}

func (h *hangingGPUs) release() {
	h.mu.Lock()
	defer h.mu.Unlock()
	if h.stuck != nil {
		close(h.stuck)
		h.stuck = nil
	}
}

// block waits while hung; it reports whether it did.
func (h *hangingGPUs) block() bool {
	h.mu.Lock()
	stuck := h.stuck
	h.mu.Unlock()
	if stuck == nil {
		return false
	}
	<-stuck
	return true
}

func (h *hangingGPUs) Sample(ctx context.Context) []nvml.Sample {
	h.mu.Lock()
	hung := h.stuck != nil
	h.mu.Unlock()
	if hung {
		h.entered <- struct{}{}
		h.block()
	}
	return h.fakeGPUs.Sample(ctx)
}

func (h *hangingGPUs) RunEvents(ctx context.Context) error {
	<-ctx.Done()
	h.block()
	return nil
}

func (h *hangingGPUs) Close() {
	h.mu.Lock()
	defer h.mu.Unlock()
	h.closed = true
}

func (h *hangingGPUs) isClosed() bool {
	h.mu.Lock()
	defer h.mu.Unlock()
	return h.closed
}

// TestGPUMonitorNVMLHangs: a sampling step that NVML does not return from is reported once it
// has taken 30 s (log, /status, a /healthz warning, spotguard_gpu_sampling_up 0 and no stale
// readings in /metrics) and cleared when NVML answers again; a stop while it hangs returns
// after the grace, marked hung so that NVML is not closed.
func TestGPUMonitorNVMLHangs(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		cfg := mustLoad(t, LoadOptions{Environ: []string{"SPOTGUARD_HTTP_LISTEN=", "SPOTGUARD_TRAINER_MATCH=x",
			"SPOTGUARD_AGENT_RUNTIME_DIR=" + t.TempDir(), "SPOTGUARD_GPU_SAMPLE_INTERVAL=5s"}})
		gpus := newHangingGPUs()
		logs := &syncBuffer{}
		a, err := New(cfg, Deps{Logger: zerolog.New(logs), IMDS: newFakeIMDS(), OpenGPUs: func(zerolog.Logger) (GPUs, error) { return gpus, nil }})
		if err != nil {
			t.Fatal(err)
		}
		ctx, cancel := context.WithCancel(t.Context())
		defer cancel()
		stopped := make(chan struct{})
		go func() { a.gpu.Run(ctx); close(stopped) }()
		advance := func(d time.Duration) {
			<-time.After(d)
			synctest.Wait()
		}
		nvmlWarning := func() string {
			for _, w := range a.health(time.Now()).Warnings {
				if strings.Contains(w, "NVML") {
					return w
				}
			}
			return ""
		}
		answering := func(when string) {
			t.Helper()
			if st := a.gpu.status(); st.NotAnsweringSince != nil || len(st.GPUs) != 4 || st.GPUs[0].Sample == nil {
				t.Errorf("%s: status = %+v; want 4 GPUs sampled, not_answering_since unset", when, st)
			}
			text := scrape(t, a)
			if !strings.Contains(text, "spotguard_gpu_sampling_up 1") || !strings.Contains(text, "spotguard_gpu_sm_clock_mhz{") {
				t.Errorf("%s: /metrics lacks spotguard_gpu_sampling_up 1 or the readings", when)
			}
			if w := nvmlWarning(); w != "" {
				t.Errorf("%s: health warns %q; want no NVML warning", when, w)
			}
		}
		synctest.Wait()
		answering("NVML answering")

		gpus.hang()
		advance(5 * time.Second) // the next step begins, and blocks
		<-gpus.entered
		began := time.Now()
		advance(gpuStallAfter - time.Second)
		answering("a step 29 s long")

		advance(time.Second)
		st := a.gpu.status()
		if st.NotAnsweringSince == nil || !st.NotAnsweringSince.Equal(began) {
			t.Errorf("a step 30 s long: not_answering_since = %v; want %v", st.NotAnsweringSince, began.UTC())
		}
		text := scrape(t, a)
		if !strings.Contains(text, "spotguard_gpu_sampling_up 0") || strings.Contains(text, "spotguard_gpu_sm_clock_mhz{") {
			t.Errorf("a step 30 s long: /metrics has\n%s\nwant spotguard_gpu_sampling_up 0 and no readings", text)
		}
		if w := nvmlWarning(); !strings.Contains(w, "NVML has not answered for 30s") || !strings.Contains(w, "hangs") {
			t.Errorf("a step 30 s long: NVML warning %q; want it to say NVML has not answered for 30s", w)
		}
		if !strings.Contains(logs.String(), "NVML does not answer") {
			t.Errorf("log lacks the stall:\n%s", logs.String())
		}
		advance(time.Minute)
		if w := nvmlWarning(); !strings.Contains(w, "for 1m30s") {
			t.Errorf("a step 90 s long: NVML warning %q; want for 1m30s", w)
		}

		gpus.release()
		synctest.Wait()
		answering("NVML answering again")
		if !strings.Contains(logs.String(), "NVML answers again") {
			t.Errorf("log lacks the recovery:\n%s", logs.String())
		}

		// A stop while NVML hangs returns after the grace, without the step.
		gpus.hang()
		advance(5 * time.Second)
		<-gpus.entered
		cancel()
		stop := time.Now()
		<-stopped
		if waited := time.Since(stop); waited != gpuStopGrace {
			t.Errorf("Run returned %v after the stop, with a step hung; want %v", waited, gpuStopGrace)
		}
		if !a.gpu.hung() {
			t.Errorf("hung() = false after Run left a step behind; want true")
		}
		gpus.release()
		synctest.Wait()
	})
}

// TestGPUMonitorStopsWhenNVMLAnswers: a stop while NVML answers returns at once and leaves
// NVML to be closed.
func TestGPUMonitorStopsWhenNVMLAnswers(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		m := &gpuMonitor{gpus: newHangingGPUs(), interval: 5 * time.Second, log: zerolog.Nop()}
		ctx, cancel := context.WithCancel(t.Context())
		stopped := make(chan struct{})
		go func() { m.Run(ctx); close(stopped) }()
		<-time.After(12 * time.Second)
		cancel()
		stop := time.Now()
		<-stopped
		if waited := time.Since(stop); waited != 0 || m.hung() {
			t.Errorf("Run returned %v after the stop, hung() = %v; want at once, false", waited, m.hung())
		}
	})
}

// TestAgentExitsWhileNVMLHangs: the agent's Run returns after a stop though a call into NVML
// never does, and leaves NVML open (closing it would wait for that call).
func TestAgentExitsWhileNVMLHangs(t *testing.T) {
	gpus := newHangingGPUs()
	gpus.hang()
	defer gpus.release()
	ta := startAgentWith(t, func(d *Deps) { d.OpenGPUs = func(zerolog.Logger) (GPUs, error) { return gpus, nil } }, "SPOTGUARD_TRAINER_MATCH=x")
	<-gpus.entered
	stopWithin(t, ta, time.Minute)
	if gpus.isClosed() {
		t.Error("NVML closed while a call into it hangs; want it left open")
	}
	if !strings.Contains(ta.logs.String(), "GPU sampling stops without it") {
		t.Errorf("the agent's log does not say it stopped without the GPU monitor:\n%s", ta.logs.String())
	}
}

// TestGPUMonitorOpensBesideTheAgent: NVML that takes long to open (a hung GPU or driver, or
// many GPUs without persistence mode) is waited for gpuOpenWait, then goes on opening beside
// the agent; it counts as not answering after 30 s, and sampling starts once it has opened.
func TestGPUMonitorOpensBesideTheAgent(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		gpus := newHangingGPUs()
		release := make(chan struct{})
		logs := &syncBuffer{}
		m := &gpuMonitor{interval: 5 * time.Second, log: zerolog.New(logs)}
		start := time.Now()
		m.open(func() (GPUs, error) { <-release; return gpus, nil }, gpuOpenWait)
		if waited := time.Since(start); waited != gpuOpenWait {
			t.Errorf("open waited %v; want %v", waited, gpuOpenWait)
		}
		if st := m.status(); st.Sampling || st.Off != "NVML is being opened" || st.NotAnsweringSince != nil {
			t.Errorf("opening: status = %+v; want off while NVML is being opened", st)
		}
		ctx, cancel := context.WithCancel(t.Context())
		stopped := make(chan struct{})
		go func() { m.Run(ctx); close(stopped) }()
		<-time.After(gpuStallAfter - gpuOpenWait - time.Second)
		synctest.Wait()
		if _, ok := m.notAnswering(); ok {
			t.Errorf("opening for 29 s: not answering; want not yet")
		}
		<-time.After(time.Second)
		synctest.Wait()
		if since, ok := m.notAnswering(); !ok || !since.Equal(start) {
			t.Errorf("opening for 30 s: notAnswering() = %v, %v; want %v, true", since, ok, start)
		}
		if st := m.status(); st.NotAnsweringSince == nil {
			t.Errorf("opening for 30 s: status = %+v; want not_answering_since", st)
		}
		close(release)
		synctest.Wait()
		st := m.status()
		if !st.Sampling || st.NotAnsweringSince != nil || len(st.GPUs) != 4 || st.GPUs[0].Sample == nil {
			t.Errorf("opened: status = %+v; want 4 GPUs sampled", st)
		}
		if !strings.Contains(logs.String(), "NVML answers again") || !strings.Contains(logs.String(), "GPU sampling on") {
			t.Errorf("log lacks the recovery or the start of sampling:\n%s", logs.String())
		}
		cancel()
		<-stopped
		if !gpus.isClosed() {
			t.Errorf("NVML not closed at the end of Run; want closed")
		}
	})
}

// TestGPUMonitorStopsWhileOpening: a stop while NVML is still opening returns after the grace,
// marked hung, and leaves NVML alone; if NVML opens within the grace, Run returns then and
// closes it.
func TestGPUMonitorStopsWhileOpening(t *testing.T) {
	for _, c := range []struct {
		opensAfter time.Duration // after the stop
		returned   time.Duration // Run, after the stop
		hung       bool
	}{
		{time.Minute, gpuStopGrace, true},
		{time.Second, time.Second, false},
	} {
		synctest.Test(t, func(t *testing.T) {
			release := make(chan struct{})
			gpus := newHangingGPUs()
			m := &gpuMonitor{interval: 5 * time.Second, log: zerolog.Nop()}
			m.open(func() (GPUs, error) { <-release; return gpus, nil }, gpuOpenWait)
			ctx, cancel := context.WithCancel(t.Context())
			stopped := make(chan struct{})
			go func() { m.Run(ctx); close(stopped) }()
			<-time.After(time.Minute)
			cancel()
			stop := time.Now()
			opened := make(chan struct{})
			go func() {
				<-time.After(c.opensAfter)
				close(release)
				close(opened)
			}()
			<-stopped
			if waited := time.Since(stop); waited != c.returned || m.hung() != c.hung || gpus.isClosed() == c.hung {
				t.Errorf("NVML opening %v after the stop: Run returned after %v, hung() = %v, closed %v; want %v, %v, %v",
					c.opensAfter, waited, m.hung(), gpus.isClosed(), c.returned, c.hung, !c.hung)
			}
			<-opened
			synctest.Wait()
		})
	}
}

// TestAgentStartsWhileNVMLHangs: an nvmlInit that never returns does not keep the agent from
// starting and watching IMDS, nor from stopping. Before, New waited for it for ever.
func TestAgentStartsWhileNVMLHangs(t *testing.T) {
	release := make(chan struct{})
	defer close(release)
	began := time.Now()
	ta := startAgentWith(t, func(d *Deps) {
		d.OpenGPUs = func(zerolog.Logger) (GPUs, error) { <-release; return newHangingGPUs(), nil }
	}, "SPOTGUARD_TRAINER_MATCH=x")
	if took := time.Since(began); took > 10*time.Second {
		t.Errorf("the agent took %v to start; want about %v", took, gpuOpenWait)
	}
	ta.waitPolls(t, imds.SourceSpot, 2)
	if st := ta.a.Status().GPU; st.Sampling || st.Off != "NVML is being opened" {
		t.Errorf("status gpu = %+v; want off while NVML is being opened", st)
	}
	stopWithin(t, ta, time.Minute)
}

// stopWithin stops the agent and fails the test unless its Run returns within d.
func stopWithin(t *testing.T, ta *testAgent, d time.Duration) {
	t.Helper()
	ta.cancel()
	select {
	case err := <-ta.done:
		ta.done <- err // for the clean-up's check
	case <-time.After(d):
		t.Fatalf("the agent did not return within %v of its stop", d)
	}
}
