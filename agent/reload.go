package agent

import (
	"fmt"
	"strings"
	"time"

	"github.com/spotguard/spotguard/agent/imds"
)

// liveKeys are the keys a reload applies to the running agent: what the notice path reads at each
// notice (the policies, how to find and signal the trainer). log.level is live when the agent can
// change its logger's level (Deps.SetLogLevel). Every other key is read once at start (the IMDS
// client and its intervals, the listener, the store, the checkpoint watcher and uploader, GPU
// sampling, CloudWatch, the runtime dir) and needs a restart.
var liveKeys = map[string]bool{
	"notices.spot": true, "notices.rebalance": true, "notices.scheduled": true, "notices.asg": true, "notices.job": true,
	"trainer.pidfile": true, "trainer.unit": true, "trainer.match": true, "trainer.signal": true,
	"trainer.user": true, "trainer.container": true,
}

// needsRestart reports whether a change of key from old to next cannot be applied by a reload.
// A notice policy is live between checkpoint and ignore; turning a source off or on changes what
// is polled, so it needs a restart (notices.job has no off: it is always live).
func (a *Agent) needsRestart(key string, old, next *Config) bool {
	if key == "log.level" {
		return a.deps.SetLogLevel == nil
	}
	if src, ok := strings.CutPrefix(key, "notices."); ok {
		s := imds.Source(src)
		return (old.Notices[s] == PolicyOff) != (next.Notices[s] == PolicyOff)
	}
	return !liveKeys[key]
}

// reload answers SIGHUP: it loads the configuration again and, if it is valid, applies every
// change it can and keeps the running value of every other (logged, and shown in /status as
// need_restart until a restart). An invalid configuration is refused with every problem logged,
// and the old one stays.
func (a *Agent) reload() {
	if a.deps.Reload == nil {
		a.log.Warn().Msg("reload requested but this agent has no config source to reload from")
		return
	}
	next, err := a.deps.Reload()
	if err == nil {
		err = next.Validate()
	}
	if err != nil {
		a.metrics.reloads.WithLabelValues("invalid").Inc()
		problems := splitJoined(err)
		for _, p := range problems {
			a.log.Error().Str("problem", p.Error()).Msg("config reload refused; keeping the running config")
		}
		a.mu.Lock()
		a.reloadRefused = fmt.Sprintf("%d problem(s), the first: %v", len(problems), problems[0])
		a.mu.Unlock()
		return
	}
	running := a.cfg.Load()
	var applied, pending []string
	for _, k := range running.Diff(next) {
		if a.needsRestart(k, running, next) {
			// Measured against what runs, so a change undone in the file is no longer pending.
			pending = append(pending, k)
			next.keep(k, running)
			continue
		}
		applied = append(applied, k)
	}
	if next.Log.Level != running.Log.Level && a.deps.SetLogLevel != nil {
		a.deps.SetLogLevel(next.Log.Level)
	}
	a.mu.Lock()
	a.needRestart = pending
	a.reloadedAt = time.Now()
	a.reloadRefused = ""
	a.mu.Unlock()
	a.cfg.Store(next)
	a.metrics.reloads.WithLabelValues("ok").Inc()
	a.log.Info().Strs("applied", applied).Strs("need_restart", pending).Msg("config reloaded")
	if len(pending) > 0 {
		a.log.Warn().Strs("need_restart", pending).
			Msg("config reloaded, but these keys are read only at start and keep their running values until a restart (systemctl restart spotguard)")
	}
	for _, k := range applied {
		src, ok := strings.CutPrefix(k, "notices.")
		if !ok {
			continue
		}
		if keys := a.coord.activeOf(imds.Source(src), next.Notices[imds.Source(src)]); len(keys) > 0 {
			a.log.Warn().Str("key", k).Strs("notices", keys).
				Msg("a notice policy changed while a notice of that source is in force: the notice keeps the policy it was detected with until it ends; the new one applies to the next")
		}
	}
	a.coord.Scan()
}

// keep sets key back to its value in from (value and origin): a reload keeps what runs.
func (c *Config) keep(key string, from *Config) {
	for _, f := range fields {
		if f.key == key {
			v := from.values[key]
			c.values[key] = v
			_ = f.set(c, v.value) // it was valid in from
			return
		}
	}
}
