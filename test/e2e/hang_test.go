package e2e

import (
	"io"
	"net"
	"strings"
	"sync"
	"testing"
	"time"
)

// gate is a TCP proxy to target that, while shut, accepts connections and never answers them
// (a store behind a route that drops packets); opened, it closes those it held and passes new
// ones through.
type gate struct {
	ln     net.Listener
	target string
	mu     sync.Mutex
	open   bool
	held   []net.Conn
	wg     sync.WaitGroup
}

func startGate(t testing.TB, target string) *gate {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	g := &gate{ln: ln, target: target}
	g.wg.Go(func() {
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			g.mu.Lock()
			if !g.open {
				g.held = append(g.held, c)
				g.mu.Unlock()
				continue
			}
			g.mu.Unlock()
			g.wg.Go(func() { g.pass(c) })
		}
	})
	t.Cleanup(func() { ln.Close(); g.openUp(); g.wg.Wait() })
	return g
}

func (g *gate) url() string { return "http://" + g.ln.Addr().String() }

// openUp lets new connections through and closes the ones held.
func (g *gate) openUp() {
	g.mu.Lock()
	defer g.mu.Unlock()
	g.open = true
	for _, c := range g.held {
		c.Close()
	}
	g.held = nil
}

func (g *gate) pass(c net.Conn) {
	pipe(c, g.target, func(dst io.Writer, src io.Reader) { io.Copy(dst, src) })
}

// S3 accepts connections and answers nothing when the agent starts, as behind a route that
// drops packets: the agent still polls IMDS and signals the trainer at once on a spot notice
// (asking S3 which region the bucket is in goes on in the background, up to 10 s), and once S3
// answers again, the checkpoint the notice asked for is committed.
func TestStoreThatHangsAtStartDoesNotDelayTheSignal(t *testing.T) {
	needPeers(t)
	s3 := startS3(t)
	g := startGate(t, strings.TrimPrefix(s3.endpoint, "http://"))
	sim := newIMDS(t)
	trigger := time.Now().Truncate(time.Second).Add(3 * time.Second)
	sim.start("spot", "-a", "terminate", "--mock-trigger-time", trigger.UTC().Format(time.RFC3339), "--rebalance-delay-sec", "100000")
	ckdir := t.TempDir()
	tp := startTrainer(t, "--checkpoint-dir", ckdir, "--files", "2", "--checkpoint-mb", "1")
	storeURL := "s3://" + s3Bucket + "/hang"
	ap := startAgent(t, sim, append([]string{"SPOTGUARD_TRAINER_PIDFILE=" + tp.pidfile, "SPOTGUARD_NOTICES_REBALANCE=ignore",
		"SPOTGUARD_CHECKPOINT_DIR=" + ckdir, "SPOTGUARD_STORE_URL=" + storeURL, "SPOTGUARD_STORE_JOB=e2e"}, s3.env(g.url())...)...)
	t.Cleanup(func() {
		if t.Failed() {
			t.Logf("agent log:\n%s", ap.log(t))
		}
	})
	ap.waitNoticeState(t, "spot/terminate", "trainer_signalled", 30*time.Second)
	const regionNote = "S3 did not say which region bucket"
	if log := ap.log(t); strings.Contains(log, regionNote) {
		t.Fatalf("the bucket's region was given up on before the trainer was signalled: the notice waited for S3\n%s", log)
	}
	eventually(t, 30*time.Second, "the agent to give up asking S3 for the bucket's region", func() bool {
		return strings.Contains(ap.log(t), regionNote)
	})
	g.openUp()
	ap.waitNoticeState(t, "spot/terminate", "committed", 90*time.Second)
	code, stdout, stderr := runSpotguard(t, append([]string{"SPOTGUARD_STORE_URL=" + storeURL, "SPOTGUARD_STORE_JOB=e2e"}, s3.env("")...),
		"list", "--config", writeEmptyConfig(t))
	if ckpt := newestLocal(t, ckdir); code != 0 || !strings.Contains(stdout, ckpt) {
		t.Errorf("list: exit %d\n%s%s; want %s", code, stdout, stderr, ckpt)
	}
}
