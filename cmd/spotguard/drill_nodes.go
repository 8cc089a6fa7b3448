package main

import (
	"context"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strconv"
	"syscall"
	"time"

	"github.com/rs/zerolog"

	"github.com/spotguard/spotguard/agent"
	"github.com/spotguard/spotguard/agent/imds"
	"github.com/spotguard/spotguard/checkpoint"
)

// drillNode is one node's part of a multi-node drill, in the report.
type drillNode struct {
	Rank     int         `json:"rank"`
	Notified bool        `json:"notified"`
	Timeline []drillStep `json:"timeline"`
	// PartS is when its notice's checkpoint was durable, in seconds after the notice: when its
	// agent saw the job checkpoint committed.
	PartS float64 `json:"part_committed_seconds"`
}

// drillNodes rehearses a reclaim of one node of an N-node job on this machine: N agents
// (in-process, each with its own checkpoint directory, runtime directory and store.node_rank, one
// store and job), N demo trainers (real processes, each writing its own shards), one IMDS
// simulator that announces the reclaim to the last node and one that announces nothing to the
// others. The drill plays the job's collective: once the notified node's trainer is signalled,
// it hands the notice to every other agent (as POST /notice would) and has every other trainer
// save the same step. It passes when one job checkpoint of every node's part is committed before
// the deadline and restores whole, every node's files identical.
func drillNodes(ctx context.Context, p drillPlan, nodes int, log zerolog.Logger, rep *drillReport) bool {
	fail := func(format string, a ...any) bool {
		rep.Reason = fmt.Sprintf(format, a...)
		return false
	}
	late := func(format string, a ...any) bool {
		rep.late = true
		return fail(format, a...)
	}
	notifiedSim, err := imds.StartSimulator("127.0.0.1:0")
	if err != nil {
		return fail("start the IMDS simulator: %v", err)
	}
	defer notifiedSim.Close()
	quietSim, err := imds.StartSimulator("127.0.0.1:0")
	if err != nil {
		return fail("start the IMDS simulator: %v", err)
	}
	defer quietSim.Close()
	notified := nodes - 1
	self, err := os.Executable()
	if err != nil {
		return fail("find own binary for the demo trainers: %v", err)
	}

	type node struct {
		cfg         *agent.Config
		dir         string
		cmd         *exec.Cmd
		trainerDone chan error
		a           *agent.Agent
	}
	ns := make([]*node, nodes)
	var store checkpoint.Store
	for rank := range nodes {
		base := filepath.Join(p.tmp, fmt.Sprintf("node%d", rank))
		n := &node{dir: filepath.Join(base, "checkpoints")}
		if err := os.MkdirAll(n.dir, 0o755); err != nil {
			return fail("%v", err)
		}
		sim := quietSim
		if rank == notified {
			sim = notifiedSim
		}
		pidfile := filepath.Join(base, "trainer.pid")
		cfg, realEndpoint, err := drillConfig(p, pidfile, n.dir, filepath.Join(base, "run"), sim.Endpoint(),
			agent.KeyValue{Key: "store.node_rank", Value: strconv.Itoa(rank)}, agent.KeyValue{Key: "store.world_nodes", Value: strconv.Itoa(nodes)})
		if err != nil {
			return fail("%v", err)
		}
		n.cfg = cfg
		if store == nil {
			if store, err = drillStore(ctx, p, cfg, realEndpoint, rep); err != nil {
				return fail("%v", err)
			}
		}
		ready := filepath.Join(base, "trainer.ready")
		n.cmd = exec.Command(self, drillTrainerCmd, "--dir", n.dir, "--size", strconv.FormatInt(p.size/int64(nodes), 10),
			"--files", strconv.Itoa(p.files), "--ready", ready, "--rank", strconv.Itoa(rank))
		n.cmd.Stdout, n.cmd.Stderr = p.progress, p.progress
		n.cmd.SysProcAttr = drillChildAttr()
		if err := n.cmd.Start(); err != nil {
			return fail("start the demo trainer of node %d: %v", rank, err)
		}
		n.trainerDone = make(chan error, 1)
		go func() { n.trainerDone <- n.cmd.Wait() }()
		defer func() {
			n.cmd.Process.Signal(syscall.SIGTERM)
			select {
			case <-n.trainerDone:
			case <-time.After(10 * time.Second):
				n.cmd.Process.Kill()
				<-n.trainerDone
			}
		}()
		if err := os.WriteFile(pidfile, []byte(strconv.Itoa(n.cmd.Process.Pid)+"\n"), 0o644); err != nil {
			return fail("write the trainer's pidfile: %v", err)
		}
		if !waitFile(ctx, ready, n.trainerDone, 30*time.Second) {
			return fail("the demo trainer of node %d did not start", rank)
		}
		n.a, err = agent.New(cfg, agent.Deps{
			Logger: log.With().Int("node_rank", rank).Logger(), IMDS: imds.NewClient(envOnlyAWS(), sim.Endpoint()),
			OpenStore:   func(string, checkpoint.S3Options) (checkpoint.Store, error) { return store, nil },
			TrainerTree: n.cmd.Process.Pid,
		})
		if err != nil {
			return fail("%v", err)
		}
		actx, stop := context.WithCancel(ctx)
		agentDone := make(chan error, 1)
		go func() { agentDone <- n.a.Run(actx) }()
		defer func() { stop(); <-agentDone }()
		ns[rank] = n
	}
	for rank, n := range ns {
		if !waitUntil(ctx, 10*time.Second, func() bool { return len(n.a.Status().Trainers) > 0 }) {
			return fail("the agent of node %d did not find its trainer (pid %d)", rank, n.cmd.Process.Pid)
		}
	}
	notifiedSim.Interrupt("terminate", drillWindow)

	// The notified node's agent signals its trainer; then the job's collective tells everyone.
	var spot agent.NoticeStatus
	if !waitUntil(ctx, 30*time.Second, func() bool {
		for _, n := range ns[notified].a.Status().Notices {
			if n.Source == imds.SourceSpot && n.Active {
				spot = n
				return n.State != agent.StateDetected
			}
		}
		return false
	}) {
		return fail("the notified node's agent did not act on the notice")
	}
	if spot.State == agent.StateTrainerNotSignalled {
		return fail("the notified node's trainer was not signalled")
	}
	rep.noticed(spot.Transitions[0].At, spot.Deadline)
	rep.add("notice detected (node "+strconv.Itoa(notified)+")", rep.notice, spot.Key)
	for rank, n := range ns {
		if rank == notified {
			continue
		}
		if _, err := n.a.PostNotice(ctx, "terminate", *rep.Deadline); err != nil {
			return fail("hand the notice to node %d's agent: %v", rank, err)
		}
		if err := n.cmd.Process.Signal(syscall.SIGUSR1); err != nil {
			return fail("tell node %d's trainer to save: %v", rank, err)
		}
	}
	rep.add("job told (every other node's agent and trainer)", time.Now(), "")

	// Wait for the job checkpoint: a job manifest of every node's part.
	var job *checkpoint.Manifest
	waitUntil(ctx, time.Until(*rep.Deadline)+time.Second, func() bool {
		cs, _, err := checkpoint.ListCommitted(ctx, store, p.job)
		if err == nil && len(cs) > 0 && len(cs[0].Manifest.Parts) == nodes {
			job = cs[0].Manifest
			return true
		}
		return false
	})
	// The node's notice: the spot notice on the notified node, the job notice on the others.
	mine := func(rank int, st agent.NoticeStatus) bool {
		return (rank == notified) == (st.Source == imds.SourceSpot) && (rank == notified || st.Source == agent.SourceJob)
	}
	if job != nil {
		// Each agent takes the job checkpoint for committed (its notice's checkpoint durable) when
		// it next looks for the other nodes' parts, within seconds of the job manifest.
		waitUntil(ctx, 15*time.Second, func() bool {
			for rank, n := range ns {
				if !slices.ContainsFunc(n.a.Status().Notices, func(st agent.NoticeStatus) bool {
					return mine(rank, st) && st.State == agent.StateCommitted
				}) {
					return false
				}
			}
			return true
		})
	}
	for rank, n := range ns {
		dn := drillNode{Rank: rank, Notified: rank == notified, Timeline: []drillStep{}}
		for _, st := range n.a.Status().Notices {
			if !mine(rank, st) {
				continue
			}
			for _, tr := range st.Transitions {
				dn.Timeline = append(dn.Timeline, drillStep{Step: tr.State, Seconds: tr.At.Sub(rep.notice).Seconds(), Detail: tr.Detail})
				if tr.State == agent.StateCommitted {
					dn.PartS = tr.At.Sub(rep.notice).Seconds()
				}
			}
		}
		rep.Nodes = append(rep.Nodes, dn)
	}
	if job == nil {
		return late("no job checkpoint of every node's part was committed before the deadline (list shows the parts that came)")
	}
	rep.Checkpoint, rep.Commit, rep.Files, rep.Bytes, rep.manifest = job.Checkpoint, job.Commit, len(job.Files), job.TotalBytes, job
	rep.add("job manifest committed", job.CommittedAt, fmt.Sprintf("%d parts, %d files, %s", len(job.Parts), len(job.Files), checkpoint.HumanBytes(job.TotalBytes)))
	rep.committed(job.CommittedAt)
	if t := job.Timings; t.FirstFileAt != nil && t.LastByteAt != nil && t.LastByteAt.After(*t.FirstFileAt) {
		rep.UploadMBs = float64(job.TotalBytes) / t.LastByteAt.Sub(*t.FirstFileAt).Seconds() / 1e6
	}

	to := filepath.Join(p.tmp, "restored")
	start := time.Now()
	res, err := checkpoint.Restore(ctx, store, checkpoint.RestoreOptions{Job: p.job, Checkpoint: job.Checkpoint, Commit: job.Commit, CommitSet: true, To: to, Logger: log})
	if err != nil {
		return fail("restore: %v", err)
	}
	rep.RestoreMBs = float64(res.Bytes) / max(time.Since(start).Seconds(), 1e-9) / 1e6
	rep.add("restored and verified", time.Now(), checkpoint.HumanBytes(res.Bytes))
	for rank, n := range ns {
		if err := sameFiles(filepath.Join(n.dir, job.Checkpoint), res.Dir); err != nil {
			return fail("the restored checkpoint differs from what node %d's trainer wrote: %v", rank, err)
		}
	}
	rep.Verified = true
	if job.CommittedAt.After(*rep.Deadline) {
		return late("committed %.1f s after the deadline", -*rep.MarginS)
	}
	slices.SortFunc(rep.Nodes, func(a, b drillNode) int { return a.Rank - b.Rank })
	return true
}
