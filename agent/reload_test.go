package agent

import (
	"maps"
	"slices"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/rs/zerolog"

	"github.com/spotguard/spotguard/agent/imds"
)

// SIGHUP applies each class of key as it can: live keys (how to find and signal the trainer,
// notice policies between checkpoint and ignore, log.level) at once; keys read only at start
// (the store, checkpoint.dir, GPU sampling, IMDS polling, a source turned off) keep their running
// values and are named in the log, /status and /healthz until the file no longer changes them.
func TestReloadKeyClasses(t *testing.T) {
	tr := startShTrainer(t, true)
	var mu sync.Mutex
	var levels []zerolog.Level
	ta := startAgentWith(t, func(d *Deps) {
		d.SetLogLevel = func(l zerolog.Level) { mu.Lock(); levels = append(levels, l); mu.Unlock() }
	}, "SPOTGUARD_TRAINER_MATCH=no-such-trainer-anywhere")
	base := []string{"SPOTGUARD_HTTP_LISTEN=127.0.0.1:0", "SPOTGUARD_AGENT_RUNTIME_DIR=" + ta.runtime, "SPOTGUARD_IMDS_POLL_INTERVAL=100ms"}
	reloadWith := func(env ...string) {
		t.Helper()
		cfg := mustLoad(t, LoadOptions{Environ: append(slices.Clone(base), env...)})
		if err := cfg.Validate(); err != nil {
			t.Fatalf("the reloaded config is invalid: %v", err)
		}
		before := ta.a.Status().Config.ReloadedAt
		ta.reload = func() (*Config, error) { return cfg, nil }
		ta.sigs <- syscall.SIGHUP
		eventually(t, "the reload", func() bool {
			at := ta.a.Status().Config.ReloadedAt
			return at != nil && (before == nil || at.After(*before))
		})
	}

	ckdir := t.TempDir()
	reloadWith("SPOTGUARD_TRAINER_PIDFILE="+tr.pidfile, "SPOTGUARD_TRAINER_SIGNAL=SIGUSR2", "SPOTGUARD_NOTICES_REBALANCE=ignore",
		"SPOTGUARD_LOG_LEVEL=warn",
		"SPOTGUARD_STORE_URL=file://"+t.TempDir(), "SPOTGUARD_STORE_JOB=j", "SPOTGUARD_CHECKPOINT_DIR="+ckdir,
		"SPOTGUARD_GPU_SAMPLE_INTERVAL=10s", "SPOTGUARD_IMDS_SPOT_POLL_INTERVAL=200ms", "SPOTGUARD_NOTICES_ASG=off")

	cfg := ta.a.Config()
	// Live: applied.
	if cfg.Trainer.PIDFile != tr.pidfile || cfg.Trainer.Signal != syscall.SIGUSR2 || cfg.Notices[imds.SourceRebalance] != PolicyIgnore || cfg.Log.Level != zerolog.WarnLevel {
		t.Errorf("live keys not applied: pidfile %q signal %v rebalance %q log %v", cfg.Trainer.PIDFile, cfg.Trainer.Signal, cfg.Notices[imds.SourceRebalance], cfg.Log.Level)
	}
	mu.Lock()
	if !slices.Equal(levels, []zerolog.Level{zerolog.WarnLevel}) {
		t.Errorf("SetLogLevel calls = %v; want [warn]", levels)
	}
	mu.Unlock()
	// Read at start: the running values stay.
	if cfg.Store.URL != "" || cfg.Checkpoint.Dir != "" || cfg.GPU.SampleInterval.String() != "5s" || cfg.IMDS.SpotPollInterval.String() != "250ms" || cfg.Notices[imds.SourceASG] != PolicyCheckpoint {
		t.Errorf("start-only keys changed by a reload: store %q dir %q gpu %v spot %v asg %q", cfg.Store.URL, cfg.Checkpoint.Dir, cfg.GPU.SampleInterval, cfg.IMDS.SpotPollInterval, cfg.Notices[imds.SourceASG])
	}
	want := []string{"checkpoint.dir", "gpu.sample_interval", "imds.spot_poll_interval", "notices.asg", "store.job", "store.url"}
	st := ta.a.Status()
	if !slices.Equal(st.Config.NeedRestart, want) {
		t.Errorf("/status config.need_restart = %q; want %q", st.Config.NeedRestart, want)
	}
	if !st.Health.Healthy || len(st.Health.Warnings) == 0 || !strings.Contains(strings.Join(st.Health.Warnings, "\n"), "which only a restart applies") {
		t.Errorf("/healthz = %+v; want healthy with a warning naming the keys", st.Health)
	}
	if log := ta.logs.String(); !strings.Contains(log, `"need_restart":["checkpoint.dir","gpu.sample_interval","imds.spot_poll_interval","notices.asg","store.job","store.url"]`) ||
		!strings.Contains(log, "keep their running values until a restart") {
		t.Errorf("the log does not name the keys that need a restart:\n%s", log)
	}
	// The trainer found by the new pidfile is signalled with the new signal.
	ta.imds.set("spot/instance-action", spotBody)
	eventually(t, "the trainer to get SIGUSR2", func() bool {
		s := tr.signals()
		return len(s) == 1 && s[0] == "USR2"
	})

	// The file no longer changes them: nothing is pending. (A look for the trainer first: the
	// start's own look, with the match of the start that finds no one, may end after the
	// reload's, and the next is 10 s later.)
	reloadWith("SPOTGUARD_TRAINER_PIDFILE=" + tr.pidfile)
	ta.a.coord.Scan()
	if st := ta.a.Status(); len(st.Config.NeedRestart) != 0 || len(st.Health.Warnings) != 0 {
		t.Errorf("after the file was put back: need_restart %q, warnings %q; want none", st.Config.NeedRestart, st.Health.Warnings)
	}
}

// Without a way to change the logger's level, log.level needs a restart like any start-only key.
func TestReloadLogLevelWithoutSetter(t *testing.T) {
	ta := startAgent(t, "SPOTGUARD_TRAINER_MATCH=no-such-trainer-anywhere")
	cfg := mustLoad(t, LoadOptions{Environ: []string{"SPOTGUARD_HTTP_LISTEN=127.0.0.1:0", "SPOTGUARD_AGENT_RUNTIME_DIR=" + ta.runtime,
		"SPOTGUARD_IMDS_POLL_INTERVAL=100ms", "SPOTGUARD_TRAINER_MATCH=no-such-trainer-anywhere", "SPOTGUARD_LOG_LEVEL=error"}})
	ta.reload = func() (*Config, error) { return cfg, nil }
	ta.sigs <- syscall.SIGHUP
	eventually(t, "the reload", func() bool { return ta.a.Status().Config.ReloadedAt != nil })
	if got := ta.a.Status().Config.NeedRestart; !slices.Equal(got, []string{"log.level"}) || ta.a.Config().Log.Level != zerolog.InfoLevel {
		t.Errorf("need_restart %q, level %v; want [log.level] and info kept", got, ta.a.Config().Log.Level)
	}
}

// A reload that changes a notice policy leaves a notice already in force as it was detected, and
// says so: it had logged the key as applied and nothing more. (Found from outside.)
func TestReloadPolicyWithANoticeInForceSaysSo(t *testing.T) {
	ta := startAgentWith(t, nil, "SPOTGUARD_TRAINER_MATCH=no-such-trainer-anywhere", "SPOTGUARD_IMDS_POLL_INTERVAL=100ms",
		"SPOTGUARD_NOTICES_REBALANCE=ignore")
	ta.imds.set("events/recommendations/rebalance", `{"noticeTime": "2026-12-01T10:00:00Z"}`)
	eventually(t, "the rebalance notice", func() bool {
		_, ok := ta.a.Status().noticeByKey("rebalance/rebalance")
		return ok
	})
	cfg := mustLoad(t, LoadOptions{Environ: []string{"SPOTGUARD_HTTP_LISTEN=127.0.0.1:0", "SPOTGUARD_AGENT_RUNTIME_DIR=" + ta.runtime,
		"SPOTGUARD_IMDS_POLL_INTERVAL=100ms", "SPOTGUARD_TRAINER_MATCH=no-such-trainer-anywhere"}})
	ta.reload = func() (*Config, error) { return cfg, nil }
	ta.sigs <- syscall.SIGHUP
	eventually(t, "the warning", func() bool {
		return strings.Contains(ta.logs.String(), "the notice keeps the policy it was detected with")
	})
}

// The reload's warning names only the notices whose policy the reload changes: one detected
// under the new policy already keeps it, and naming it said otherwise (found from outside).
func TestActiveOfNamesOnlyTheNoticesOfAnotherPolicy(t *testing.T) {
	tc := newTestCoordinator(t, "SPOTGUARD_NOTICES_JOB=ignore")
	now := time.Now()
	tc.c.TakeJobNotice(jobNotice("stop", now.Add(time.Minute)), now)
	cfg := *tc.c.config()
	cfg.Notices = maps.Clone(cfg.Notices)
	cfg.Notices[SourceJob] = PolicyCheckpoint
	tc.c.config = func() *Config { return &cfg }
	tc.c.TakeJobNotice(jobNotice("terminate", now.Add(time.Minute)), now)
	if got := tc.c.activeOf(SourceJob, PolicyCheckpoint); !slices.Equal(got, []string{"job/stop"}) {
		t.Errorf("activeOf(job, checkpoint) = %q; want [job/stop], the one detected under ignore", got)
	}
}
