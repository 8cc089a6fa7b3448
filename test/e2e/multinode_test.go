package e2e

import (
	"bytes"
	"encoding/json"
	"fmt"
	"net/http"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"syscall"
	"testing"
	"time"
)

// A job of four nodes on one machine, with real processes: four agents, each with its own
// checkpoint.dir, listener and store.node_rank, one versitygw, one store.job, and two IMDS
// simulators: node 2's announces a reclaim, the other three share one that announces nothing.
// Four example trainers stand in for the job's ranks, a file standing in for their collective:
// node 2's trainer, signalled by its agent, tells the others the notice and the step it saves;
// they hand the notice to their own agents (POST /notice) and save the same step, each its own
// shard. Every node's part and one job manifest are committed before the deadline; the other
// trainers are never signalled; `spotguard list` shows the job checkpoint, and `spotguard restore`
// on a fresh directory returns every node's files, verified and identical.
func TestMultiNodeJob(t *testing.T) {
	needPeers(t)
	s3 := startS3(t)
	quiet := newIMDS(t)
	quiet.start("spot", "-d", "100000", "--rebalance-delay-sec", "100000")
	notified := newIMDS(t)
	trigger := time.Now().Truncate(time.Second).Add(12 * time.Second)
	notified.start("spot", "-a", "terminate", "--mock-trigger-time", trigger.UTC().Format(time.RFC3339), "--rebalance-delay-sec", "100000")

	const world, reclaimed = 4, 2
	storeURL := "s3://" + s3Bucket + "/multinode"
	peer := filepath.Join(t.TempDir(), "collective.json")
	type node struct {
		dir string
		ap  *agentProc
		tp  *trainerProc
	}
	nodes := make([]node, world)
	for rank := range world {
		sim := quiet
		if rank == reclaimed {
			sim = notified
		}
		n := &nodes[rank]
		n.dir = t.TempDir()
		pidfile := filepath.Join(t.TempDir(), "trainer.pid")
		n.ap = startAgent(t, sim, append([]string{"SPOTGUARD_TRAINER_PIDFILE=" + pidfile, "SPOTGUARD_CHECKPOINT_DIR=" + n.dir,
			"SPOTGUARD_STORE_URL=" + storeURL, "SPOTGUARD_STORE_JOB=job4", "SPOTGUARD_STORE_PART_SIZE=5MiB",
			fmt.Sprintf("SPOTGUARD_STORE_NODE_RANK=%d", rank), fmt.Sprintf("SPOTGUARD_STORE_WORLD_NODES=%d", world),
			"SPOTGUARD_NOTICES_REBALANCE=ignore"}, s3.env("")...)...)
		n.tp = startTrainer(t, "--pidfile", pidfile, "--checkpoint-dir", n.dir, "--files", "2", "--checkpoint-mb", "3",
			"--rank", fmt.Sprint(rank), "--run-id", "run-1", "--peer-notice", peer, "--notify-agent", strings.TrimPrefix(n.ap.base, "http://"),
			"--notice-file", filepath.Join(n.ap.runtimeDir, "notice.json"))
	}
	for rank, n := range nodes {
		eventually(t, waitSignal, fmt.Sprintf("agent %d to find its trainer", rank), func() bool { return len(n.ap.status(t).Trainers) == 1 })
	}

	// Every agent's part, then one job manifest: the agents see it (or wrote it).
	eventually(t, 90*time.Second, "every agent to see the job checkpoint committed", func() bool {
		for _, n := range nodes {
			if !hasLine(n.ap.metrics(t), `spotguard_job_checkpoints_committed_total{writer="this"} 1`) &&
				!hasLine(n.ap.metrics(t), `spotguard_job_checkpoints_committed_total{writer="other"} 1`) {
				return false
			}
		}
		return true
	})
	writers := 0
	for _, n := range nodes {
		if hasLine(n.ap.metrics(t), `spotguard_job_checkpoints_committed_total{writer="this"} 1`) {
			writers++
		}
	}
	if writers != 1 {
		t.Errorf("%d agents wrote the job manifest; want exactly one", writers)
	}

	// Only node 2's trainer was signalled; the others were told by the job, and their agents
	// held the notice as source job.
	for rank, n := range nodes {
		sigs := n.tp.signals(t)
		if (rank == reclaimed) != (len(sigs) > 0) {
			t.Errorf("node %d's trainer got %d signals; want them only on node %d", rank, len(sigs), reclaimed)
		}
		if rank == reclaimed {
			continue
		}
		if _, sigs, ok := noticeTransitions(n.ap.status(t), "job/terminate"); !ok || sigs != 0 {
			t.Errorf("agent %d: job/terminate present %v with %d signals; want it, unsignalled", rank, ok, sigs)
		}
	}

	// The job checkpoint as `spotguard list --json` shows it: four parts, every node's shards,
	// committed before the deadline (two minutes after the notice), LATEST.
	env := append([]string{"SPOTGUARD_STORE_URL=" + storeURL, "SPOTGUARD_STORE_JOB=job4"}, s3.env("")...)
	code, stdout, stderr := runSpotguard(t, env, "list", "--json", "--check", "--config", writeEmptyConfig(t))
	if code != 0 {
		t.Fatalf("spotguard list --check: exit %d\n%s%s", code, stdout, stderr)
	}
	var listed []struct {
		Checkpoint  string    `json:"checkpoint"`
		Latest      bool      `json:"latest"`
		WorldNodes  int       `json:"world_nodes"`
		CommittedAt time.Time `json:"committed_at"`
		Parts       []struct {
			NodeRank int `json:"node_rank"`
		} `json:"parts"`
		Files []struct {
			Path  string `json:"path"`
			Nodes []int  `json:"nodes"`
		} `json:"files"`
	}
	if err := json.Unmarshal([]byte(stdout), &listed); err != nil || len(listed) != 1 {
		t.Fatalf("spotguard list --json = %s (%v); want one job checkpoint", stdout, err)
	}
	jc := listed[0]
	if !jc.Latest || jc.WorldNodes != world || len(jc.Parts) != world {
		t.Errorf("job checkpoint %s: latest %v, world_nodes %d, %d parts; want LATEST, 4, 4", jc.Checkpoint, jc.Latest, jc.WorldNodes, len(jc.Parts))
	}
	for rank := range world {
		for i := range 2 {
			want := fmt.Sprintf("shard-%d-%d.bin", rank, i)
			if !slices.ContainsFunc(jc.Files, func(f struct {
				Path  string `json:"path"`
				Nodes []int  `json:"nodes"`
			}) bool {
				return f.Path == want && slices.Equal(f.Nodes, []int{rank})
			}) {
				t.Errorf("the job checkpoint lacks %s of node %d: %+v", want, rank, jc.Files)
			}
		}
	}
	if deadline := trigger.Add(2 * time.Minute); !jc.CommittedAt.Before(deadline) {
		t.Errorf("job checkpoint committed at %s, after the deadline %s", jc.CommittedAt, deadline)
	}

	// A fresh instance restores every node's files, verified; each is what its node wrote.
	to := t.TempDir()
	code, stdout, stderr = runSpotguard(t, env, "restore", "--to", to, "--config", writeEmptyConfig(t))
	if code != 0 {
		t.Fatalf("spotguard restore: exit %d\n%s%s", code, stdout, stderr)
	}
	for rank, n := range nodes {
		for i := range 2 {
			rel := filepath.Join(jc.Checkpoint, fmt.Sprintf("shard-%d-%d.bin", rank, i))
			want, err := os.ReadFile(filepath.Join(n.dir, rel))
			if err != nil {
				t.Fatal(err)
			}
			if got, err := os.ReadFile(filepath.Join(to, rel)); err != nil || !bytes.Equal(got, want) {
				t.Errorf("restored %s differs from node %d's (err %v)", rel, rank, err)
			}
		}
	}
}

// `spotguard drill --nodes 3` rehearses a three-node job on this machine: one node notified, the
// others told by the job; it prints every node's timeline and passes with one job checkpoint of
// three parts, restored and verified. --nodes with a trainer of one's own is a usage error.
func TestDrillNodes(t *testing.T) {
	needPeers(t)
	code, stdout, stderr := runSpotguard(t, nil, "drill", "--nodes", "3", "--size", "12MiB", "--files", "2", "--json", "--config", writeEmptyConfig(t))
	if code != 0 {
		t.Fatalf("drill --nodes 3: exit %d\n%s\n%s", code, stdout, stderr)
	}
	var rep struct {
		Pass     bool    `json:"pass"`
		Verified bool    `json:"verified"`
		DurableS float64 `json:"durable_after_notice_seconds"`
		Nodes    []struct {
			Rank     int  `json:"rank"`
			Notified bool `json:"notified"`
			Timeline []struct {
				Step string `json:"step"`
			} `json:"timeline"`
		} `json:"nodes"`
		Timeline []struct {
			Step   string `json:"step"`
			Detail string `json:"detail"`
		} `json:"timeline"`
	}
	if err := json.Unmarshal([]byte(stdout), &rep); err != nil {
		t.Fatalf("drill --json: %v\n%s", err, stdout)
	}
	if !rep.Pass || !rep.Verified || rep.DurableS <= 0 || len(rep.Nodes) != 3 {
		t.Fatalf("drill --nodes 3 = %+v; want a verified pass with 3 nodes", rep)
	}
	notified := 0
	for _, n := range rep.Nodes {
		var steps []string
		for _, s := range n.Timeline {
			steps = append(steps, s.Step)
		}
		if n.Notified {
			notified++
		}
		if !slices.Contains(steps, "committed") || n.Notified != slices.Contains(steps, "trainer_signalled") {
			t.Errorf("node %d (notified %v) timeline %v; want its part committed, a signal only where notified", n.Rank, n.Notified, steps)
		}
	}
	if notified != 1 {
		t.Errorf("%d nodes notified; want 1", notified)
	}
	if !slices.ContainsFunc(rep.Timeline, func(s struct {
		Step   string `json:"step"`
		Detail string `json:"detail"`
	}) bool {
		return s.Step == "job manifest committed" && strings.HasPrefix(s.Detail, "3 parts")
	}) {
		t.Errorf("timeline %+v lacks the job manifest of 3 parts", rep.Timeline)
	}

	code, _, stderr = runSpotguard(t, nil, "drill", "--nodes", "2", "--trainer-cmd", "true", "--checkpoint-dir", t.TempDir())
	if code != 2 || !strings.Contains(stderr, "--nodes 2: want 1 to 64, and above 1 only with the demo trainers") {
		t.Errorf("drill --nodes with --trainer-cmd: exit %d, %q; want a usage error", code, stderr)
	}
}

// kill9 kills the agent at once (SIGKILL: no drain, no clean-up) and waits for it to be gone.
func (ap *agentProc) kill9(t *testing.T) {
	t.Helper()
	if err := ap.cmd.Process.Signal(syscall.SIGKILL); err != nil {
		t.Fatal(err)
	}
	<-ap.done
}

// writeNodeCheckpoint plays a node's trainer: its shard, then the marker every node writes alike.
func writeNodeCheckpoint(t *testing.T, dir, name string, rank int) []byte {
	t.Helper()
	shard := bytes.Repeat([]byte{byte('a' + rank)}, 1<<20+rank)
	if err := os.MkdirAll(filepath.Join(dir, name), 0o755); err != nil {
		t.Fatal(err)
	}
	writeFile(t, filepath.Join(dir, name, fmt.Sprintf("shard-%d.bin", rank)), string(shard))
	writeFile(t, filepath.Join(dir, name, "_COMPLETE"), `{"step": 7}`)
	return shard
}

// A two-node job: node 0's agent commits its part and, waiting for node 1's, is killed (kill -9)
// between its part and the job manifest. `spotguard list` shows the checkpoint as parts 1/2 and
// LATEST is not written. Node 1's agent, the survivor, commits its part and then the job
// checkpoint of both; restore returns both nodes' shards.
func TestMultiNodeKilledAgentBetweenPartAndJob(t *testing.T) {
	needPeers(t)
	s3 := startS3(t)
	sim := newIMDS(t)
	sim.start("spot", "-d", "100000", "--rebalance-delay-sec", "100000")
	storeURL := "s3://" + s3Bucket + "/killed"
	env := func(rank int, dir string) []string {
		return append([]string{"SPOTGUARD_TRAINER_MATCH=no-trainer-here", "SPOTGUARD_CHECKPOINT_DIR=" + dir,
			"SPOTGUARD_STORE_URL=" + storeURL, "SPOTGUARD_STORE_JOB=job2", "SPOTGUARD_STORE_PART_WAIT=1m",
			fmt.Sprintf("SPOTGUARD_STORE_NODE_RANK=%d", rank), "SPOTGUARD_STORE_WORLD_NODES=2"}, s3.env("")...)
	}
	dir0, dir1 := t.TempDir(), t.TempDir()
	a0 := startAgent(t, sim, env(0, dir0)...)
	shard0 := writeNodeCheckpoint(t, dir0, "step-000007", 0)
	listEnv := append([]string{"SPOTGUARD_STORE_URL=" + storeURL, "SPOTGUARD_STORE_JOB=job2"}, s3.env("")...)
	eventually(t, 30*time.Second, "node 0's part to be listed as parts 1/2", func() bool {
		code, stdout, _ := runSpotguard(t, listEnv, "list", "--config", writeEmptyConfig(t))
		return code == 0 && strings.Contains(stdout, "step-000007") && strings.Contains(stdout, "parts 1/2")
	})
	a0.kill9(t)
	if out, err := s3.tryAWS(t, "s3", "ls", "s3://"+s3Bucket+"/killed/job2/LATEST"); err == nil {
		t.Fatalf("LATEST written with one part of two: %s", out)
	}

	a1 := startAgent(t, sim, env(1, dir1)...)
	shard1 := writeNodeCheckpoint(t, dir1, "step-000007", 1)
	eventually(t, 30*time.Second, "the survivor to commit the job checkpoint", func() bool {
		return hasLine(a1.metrics(t), `spotguard_job_checkpoints_committed_total{writer="this"} 1`)
	})
	to := t.TempDir()
	code, stdout, stderr := runSpotguard(t, listEnv, "restore", "--to", to, "--config", writeEmptyConfig(t))
	if code != 0 {
		t.Fatalf("spotguard restore: exit %d\n%s%s", code, stdout, stderr)
	}
	for rank, want := range [][]byte{shard0, shard1} {
		got, err := os.ReadFile(filepath.Join(to, "step-000007", fmt.Sprintf("shard-%d.bin", rank)))
		if err != nil || !bytes.Equal(got, want) {
			t.Errorf("restored shard of node %d differs (err %v)", rank, err)
		}
	}
}

// Two nodes of one job, both at the default store.world_nodes 1, each an instance of its own:
// each commits its own shard alone as checkpoint step-1, then step-2. No commit is the job's
// checkpoint, and a restore of the newest was a torn checkpoint presented as complete. Now both
// agents say so (an error, spotguard_checkpoints_split_total, /healthz 503), restore refuses
// with the fix, and `list --check` fails naming the save. (Found from outside.)
func TestEveryNodeAtWorldNodesOneIsSaid(t *testing.T) {
	needPeers(t)
	s3 := startS3(t)
	storeURL := "s3://" + s3Bucket + "/split"
	dirs := []string{t.TempDir(), t.TempDir()}
	var agents []*agentProc
	for rank, id := range []string{"i-0aaaaaaaaaaaaaaa0", "i-0bbbbbbbbbbbbbbb1"} {
		cfg := filepath.Join(t.TempDir(), "aemm-config.json")
		writeFile(t, cfg, `{"metadata": {"values": {"instance-id": "`+id+`"}}}`)
		sim := newIMDS(t)
		sim.start("spot", "-d", "100000", "--rebalance-delay-sec", "100000", "-c", cfg)
		agents = append(agents, startAgent(t, sim, append([]string{"SPOTGUARD_CHECKPOINT_DIR=" + dirs[rank],
			"SPOTGUARD_STORE_URL=" + storeURL, "SPOTGUARD_STORE_JOB=nodes-unset", "SPOTGUARD_TRAINER_PIDFILE=" + filepath.Join(t.TempDir(), "none.pid")},
			s3.env("")...)...))
	}
	for i, name := range []string{"step-1", "step-2"} {
		for rank, dir := range dirs {
			writeNodeCheckpoint(t, dir, name, rank)
		}
		for rank, ap := range agents {
			eventually(t, 60*time.Second, fmt.Sprintf("agent %d to commit %s", rank, name), func() bool {
				return metricValue(t, ap.metrics(t), `spotguard_checkpoints_committed_total{trigger="periodic"}`) == float64(i+1)
			})
		}
	}
	for rank, ap := range agents {
		eventually(t, 30*time.Second, fmt.Sprintf("agent %d to find a checkpoint committed in pieces", rank), func() bool {
			return metricValue(t, ap.metrics(t), "spotguard_checkpoints_split_total") >= 1
		})
		code, h := ap.healthz(t)
		if code != http.StatusServiceUnavailable || !strings.Contains(strings.Join(h.Reasons, " "), "committed in 2 pieces by 2 instances") {
			t.Errorf("agent %d: /healthz %d %v; want 503 saying the checkpoint was committed in pieces", rank, code, h.Reasons)
		}
		if log := ap.log(t); !strings.Contains(log, "is one piece of a save other instances committed pieces of") {
			t.Errorf("agent %d logged no error about the save in pieces", rank)
		}
	}

	env := append([]string{"SPOTGUARD_STORE_URL=" + storeURL, "SPOTGUARD_STORE_JOB=nodes-unset"}, s3.env("")...)
	to := t.TempDir()
	code, _, stderr := runSpotguard(t, env, "restore", "--to", to, "--config", writeEmptyConfig(t))
	if code != 1 || !strings.Contains(stderr, "checkpoint step-2 was committed in 2 pieces by 2 instances") ||
		!strings.Contains(stderr, "fix: a multi-node job: set store.world_nodes") {
		t.Errorf("spotguard restore: exit %d, stderr:\n%s\nwant 1, the pieces named, and the fix", code, stderr)
	}
	if entries, _ := os.ReadDir(to); len(entries) != 0 {
		t.Errorf("restore put %v in place; want nothing", entries)
	}
	code, _, stderr = runSpotguard(t, env, "list", "--check", "--config", writeEmptyConfig(t))
	if code != 1 || strings.Count(stderr, "check: checkpoint step-") != 2 {
		t.Errorf("spotguard list --check: exit %d, stderr:\n%s\nwant 1, naming step-1 and step-2", code, stderr)
	}
	code, _, stderr = runSpotguard(t, env, "list", "--config", writeEmptyConfig(t))
	if code != 0 || strings.Count(stderr, "warning: checkpoint step-") != 2 {
		t.Errorf("spotguard list: exit %d, stderr:\n%s\nwant 0, and a warning about step-1 and step-2", code, stderr)
	}
}
