package agent

import (
	"context"
	"encoding/json"
	"net/http"
	"net/http/pprof"
	"slices"
	"time"

	"github.com/prometheus/client_golang/prometheus/promhttp"

	"github.com/spotguard/spotguard/agent/imds"
	"github.com/spotguard/spotguard/checkpoint"
)

// Status is the JSON document served on /status.
type Status struct {
	Version   string          `json:"version,omitempty"`
	StartedAt time.Time       `json:"started_at"`
	Instance  instanceStatus  `json:"instance"`
	IMDS      imdsStatus      `json:"imds"`
	Trainers  []TrainerStatus `json:"trainers"`
	// TrainerProblems says why the last scan found no trainer, if it did not.
	TrainerProblems string         `json:"trainer_problems,omitempty"`
	Notices         []NoticeStatus `json:"notices"`
	// GPU is the latest sample and verdict of every GPU, or why sampling is off.
	GPU gpuStatus `json:"gpu"`
	// Uploads is the checkpoint uploader's state; absent when no store is configured.
	Uploads *checkpoint.UploaderStatus `json:"uploads,omitempty"`
	// Store is the store probe's verdict and the upload errors by reason; absent when no store
	// is configured.
	Store *storeStatus `json:"store,omitempty"`
	// Health is what /healthz answers.
	Health healthVerdict `json:"health"`
	// Config is what the last reload (SIGHUP) did.
	Config configStatus `json:"config"`
}

// configStatus is what the last reload did.
type configStatus struct {
	// ReloadedAt is when the configuration was last reloaded; null if never.
	ReloadedAt *time.Time `json:"reloaded_at"`
	// NeedRestart lists the keys whose new values the last reload could not apply: they keep
	// their running values until a restart.
	NeedRestart []string `json:"need_restart"`
}

// instanceStatus is the instance identity; empty until IMDS has answered.
type instanceStatus struct {
	InstanceID       string `json:"instance_id"`
	InstanceType     string `json:"instance_type"`
	AvailabilityZone string `json:"availability_zone"`
}

type imdsStatus struct {
	Healthy     bool                         `json:"healthy"`
	LastSuccess *time.Time                   `json:"last_success"`
	Sources     map[imds.Source]sourceStatus `json:"sources"`
}

type sourceStatus struct {
	// Healthy is false when the source has failed for more than 30 s with no success since.
	Healthy      bool       `json:"healthy"`
	Polls        uint64     `json:"polls"`
	Errors       uint64     `json:"errors"`
	Streak       int        `json:"error_streak"`
	LastSuccess  *time.Time `json:"last_success"`
	FailingSince *time.Time `json:"failing_since"`
	LastError    string     `json:"last_error,omitempty"`
}

// timePtr is nil for the zero time, so JSON shows null rather than year 1.
func timePtr(t time.Time) *time.Time {
	if t.IsZero() {
		return nil
	}
	return &t
}

func newIMDSStatus(st imds.Stats, now time.Time) imdsStatus {
	out := imdsStatus{Healthy: imdsUp(st, now), LastSuccess: timePtr(st.LastSuccess), Sources: map[imds.Source]sourceStatus{}}
	for src, s := range st.Sources {
		out.Sources[src] = sourceStatus{
			Healthy: s.Healthy(now), Polls: s.Polls, Errors: s.Errors, Streak: s.Streak,
			LastSuccess: timePtr(s.LastSuccess), FailingSince: timePtr(s.FailingSince), LastError: s.LastError,
		}
	}
	return out
}

// ScanTrainers looks for the trainer processes now, as the agent does every 10 s and at each
// notice, and returns what it found (Status().Trainers from then on).
func (a *Agent) ScanTrainers() []TrainerStatus {
	a.coord.Scan()
	return a.Status().Trainers
}

// Status returns what /status shows.
func (a *Agent) Status() Status {
	a.mu.Lock()
	id := a.identity
	conf := configStatus{ReloadedAt: timePtr(a.reloadedAt), NeedRestart: append([]string{}, a.needRestart...)}
	a.mu.Unlock()
	st := a.watcher.Stats()
	cs := a.coord.status()
	var uploads *checkpoint.UploaderStatus
	if a.uploader != nil {
		// The uploader answers from its own loop; a busy one must not hold /status up.
		ctx, cancel := context.WithTimeout(context.Background(), 500*time.Millisecond)
		us := a.uploadsStatus(ctx)
		cancel()
		uploads = &us
	}
	return Status{
		Version:         a.deps.Version,
		GPU:             a.gpu.status(),
		Uploads:         uploads,
		StartedAt:       a.started,
		Instance:        instanceStatus{id.InstanceID, id.InstanceType, id.AvailabilityZone},
		IMDS:            newIMDSStatus(st, time.Now()),
		Trainers:        cs.Trainers,
		TrainerProblems: cs.TrainerProblems,
		Notices:         cs.Notices,
		Store:           a.storeStatus(),
		Health:          a.health(time.Now()),
		Config:          conf,
	}
}

// uploadsStatus is the uploader's status, with the checkpoint withheld before the uploader took
// it in (its own name cannot be stored), as /healthz names it: /status lists it, and the metrics
// count it not committed (they did not: an alarm on spotguard_checkpoint_not_committed_seconds
// never fired for it; found from outside).
func (a *Agent) uploadsStatus(ctx context.Context) checkpoint.UploaderStatus {
	us := a.uploader.Status(ctx)
	a.mu.Lock()
	w := a.withheld
	a.mu.Unlock()
	if w != nil && !slices.ContainsFunc(us.Checkpoints, func(c checkpoint.CheckpointStatus) bool { return c.Name == w.Checkpoint }) {
		c := checkpoint.CheckpointStatus{Name: w.Checkpoint, Withheld: true}
		if !w.At.IsZero() {
			at := w.At // its marker came then
			c.CompleteSince = &at
		}
		us.Checkpoints = append(us.Checkpoints, c)
	}
	return us
}

// Handler serves /healthz, /status, /metrics and POST /notice, and with http.pprof Go's profiles
// under /debug/pprof/. /healthz answers 200 when the
// agent is healthy and 503 when it is not, both with the JSON of healthVerdict: healthy, reasons
// (every one, naming what failed and the error) and warnings. POST /notice takes a notice from
// the job (handleNotice).
func (a *Agent) Handler() http.Handler {
	mux := http.NewServeMux()
	mux.HandleFunc("/notice", a.handleNotice)
	mux.HandleFunc("GET /healthz", func(w http.ResponseWriter, r *http.Request) {
		v := a.health(time.Now())
		w.Header().Set("Content-Type", "application/json")
		if !v.Healthy {
			w.WriteHeader(http.StatusServiceUnavailable)
		}
		json.NewEncoder(w).Encode(v)
	})
	mux.HandleFunc("GET /status", func(w http.ResponseWriter, r *http.Request) {
		w.Header().Set("Content-Type", "application/json")
		enc := json.NewEncoder(w)
		enc.SetIndent("", "  ")
		enc.Encode(a.Status())
	})
	mux.Handle("GET /metrics", promhttp.HandlerFor(a.registry, promhttp.HandlerOpts{}))
	if a.cfg.Load().HTTP.PProf {
		mux.HandleFunc("GET /debug/pprof/", pprof.Index)
		mux.HandleFunc("GET /debug/pprof/cmdline", pprof.Cmdline)
		mux.HandleFunc("GET /debug/pprof/profile", pprof.Profile)
		mux.HandleFunc("GET /debug/pprof/symbol", pprof.Symbol)
		mux.HandleFunc("GET /debug/pprof/trace", pprof.Trace)
	}
	return mux
}
