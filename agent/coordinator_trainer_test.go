package agent

import (
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"

	"github.com/spotguard/spotguard/agent/trainer"
)

// The agent's discovery takes trainer.user and trainer.container from the config, and
// Deps.TrainerTree confines it.
func TestProcTrainersFromConfig(t *testing.T) {
	const id = "3f4a9c2b7d1e8f605a4b3c2d1e0f9a8b7c6d5e4f3a2b1c0d9e8f7a6b5c4d3e2f"
	proc := t.TempDir()
	// pid → uid, parent, cgroup
	for _, p := range []struct {
		pid, uid, ppid int
		cgroup         string
	}{
		{100, 0, 1, "0::/system.slice/spotguard.service\n"}, // the agent
		{5000, 0, 1, "0::/system.slice/docker-" + id + ".scope\n"},
		{5001, 1000, 5000, "0::/system.slice/docker-" + id + ".scope\n"},
		{5002, 1000, 5001, "0::/system.slice/docker-" + id + ".scope\n"},
	} {
		dir := filepath.Join(proc, fmt.Sprint(p.pid))
		if err := os.MkdirAll(dir, 0o755); err != nil {
			t.Fatal(err)
		}
		status := fmt.Sprintf("Name:\tx\nState:\tS (sleeping)\nPPid:\t%d\nUid:\t%d\t%d\t%d\t%d\nNSpid:\t%d\nSigCgt:\t0000000000000200\n", p.ppid, p.uid, p.uid, p.uid, p.uid, p.pid)
		for name, content := range map[string]string{"status": status, "cmdline": fmt.Sprintf("python3\x00train-%d.py\x00", p.pid), "cgroup": p.cgroup} {
			if err := os.WriteFile(filepath.Join(dir, name), []byte(content), 0o644); err != nil {
				t.Fatal(err)
			}
		}
	}
	tests := []struct {
		env   []string
		under int
		want  []int
	}{
		{[]string{"SPOTGUARD_TRAINER_CONTAINER=" + id[:12]}, 0, []int{5000, 5001, 5002}},
		{[]string{"SPOTGUARD_TRAINER_CONTAINER=" + id[:12], "SPOTGUARD_TRAINER_USER=1000"}, 0, []int{5001, 5002}},
		{[]string{"SPOTGUARD_TRAINER_CONTAINER=" + id[:12]}, 5001, []int{5001, 5002}},
	}
	for _, tt := range tests {
		cfg := mustLoad(t, LoadOptions{Environ: tt.env})
		if err := cfg.Validate(); err != nil {
			t.Fatal(err)
		}
		procs, problems := procTrainers{procRoot: proc, self: 100, under: tt.under}.Find(cfg)
		var got []int
		for _, p := range procs {
			got = append(got, p.PID)
			if p.Via != trainer.ViaContainer && p.Via != trainer.ViaTree {
				t.Errorf("Find(%v): %+v; want via container or tree", tt.env, p)
			}
		}
		if !slices.Equal(got, tt.want) || len(problems) != 0 {
			t.Errorf("Find(%v, under %d) = %v, %v; want %v and no problem", tt.env, tt.under, got, problems, tt.want)
		}
	}
	// Only root's process in the container: trainer.user says why nothing is found.
	cfg := mustLoad(t, LoadOptions{Environ: []string{"SPOTGUARD_TRAINER_CONTAINER=" + id, "SPOTGUARD_TRAINER_USER=4242"}})
	procs, problems := procTrainers{procRoot: proc, self: 100}.Find(cfg)
	if len(procs) != 0 || len(problems) != 1 || problems[0].Reason != trainer.ReasonOtherUser || !strings.Contains(problems[0].Detail, "uid 4242") {
		t.Errorf("Find(user 4242) = %v, %v; want nothing and one other_user problem", procs, problems)
	}
}
