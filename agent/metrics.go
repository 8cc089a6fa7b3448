package agent

import (
	"context"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/collectors"

	"github.com/spotguard/spotguard/agent/imds"
	"github.com/spotguard/spotguard/agent/trainer"
	"github.com/spotguard/spotguard/checkpoint"
)

// promMetrics are the agent's Prometheus series. They live in a registry of the agent's own, never the
// global one.
type promMetrics struct {
	notices            *prometheus.CounterVec
	signals            *prometheus.CounterVec
	discoveryProblems  *prometheus.CounterVec
	signalLatency      prometheus.Histogram
	trainerProcesses   prometheus.Gauge
	trainerUncaught    prometheus.Gauge
	syncRequests       prometheus.Counter
	reloads            *prometheus.CounterVec
	noticeDeadlineLeft *prometheus.GaugeVec
	checkpointMissing  *prometheus.CounterVec

	committed        *prometheus.CounterVec
	commitFailures   prometheus.Counter
	withheld         prometheus.Counter
	split            prometheus.Counter
	jobCommitted     *prometheus.CounterVec
	jobFailures      prometheus.Counter
	uploadBytes      prometheus.Counter
	uploadEarly      prometheus.Counter
	uploadSeconds    prometheus.Histogram
	uploadThroughput prometheus.Gauge
	forecast         prometheus.Gauge
	newestCommitted  prometheus.Gauge
	writeSeconds     prometheus.Histogram
	timeToDurable    prometheus.Histogram
	deadlineMargin   *prometheus.GaugeVec

	// Health: the store probe, upload errors by reason, the verdict of /healthz.
	storeProbeFailures prometheus.Counter
	uploadErrors       *prometheus.CounterVec
	health             *healthCollector
}

func newMetrics(reg prometheus.Registerer, stats func() imds.Stats) *promMetrics {
	m := &promMetrics{
		notices: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "spotguard_notices_total",
			Help: "Interruption notices detected, by source and action.",
		}, []string{"source", "action"}),
		signals: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "spotguard_trainer_signals_total",
			Help: "Trainer processes considered for a notice's signal, by outcome (sent, not_caught, gone, failed).",
		}, []string{"outcome"}),
		discoveryProblems: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "spotguard_trainer_discovery_problems_total",
			Help: "Problems finding the trainer (stale pidfile, no match, unit not found, ...), by reason.",
		}, []string{"reason"}),
		checkpointMissing: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "spotguard_notice_checkpoint_missing_total",
			Help: "Notices whose trainer was signalled but wrote no checkpoint by the deadline (or within 2 minutes), by source and reason (no_marker, trainer_gone, withheld; deleted: the one written was deleted before its commit, and none completed since; renamed_away: it was renamed away before its commit, and nothing completed since; not_signalled: no trainer process could be signalled, none found or none catching the signal, and none completed).",
		}, []string{"source", "reason"}),
		signalLatency: prometheus.NewHistogram(prometheus.HistogramOpts{
			Name:    "spotguard_notice_signal_latency_seconds",
			Help:    "Time from a notice being read from IMDS to the trainer being signalled.",
			Buckets: []float64{0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1},
		}),
		trainerProcesses: prometheus.NewGauge(prometheus.GaugeOpts{
			Name: "spotguard_trainer_processes",
			Help: "Trainer processes found at the last scan.",
		}),
		trainerUncaught: prometheus.NewGauge(prometheus.GaugeOpts{
			Name: "spotguard_trainer_signal_uncaught_processes",
			Help: "Trainer processes found at the last scan that do not catch trainer.signal (they would not be signalled).",
		}),
		syncRequests: prometheus.NewCounter(prometheus.CounterOpts{
			Name: "spotguard_sync_requests_total",
			Help: "Sync-now requests received (SIGUSR1 to the agent).",
		}),
		reloads: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "spotguard_config_reloads_total",
			Help: "Configuration reloads (SIGHUP), by result (ok, invalid).",
		}, []string{"result"}),
		noticeDeadlineLeft: prometheus.NewGaugeVec(prometheus.GaugeOpts{
			Name: "spotguard_notice_deadline_seconds",
			Help: "Seconds from signalling the trainer (posting a job notice) to the notice's deadline, for the newest notice of each source.",
		}, []string{"source"}),
	}
	m.committed = prometheus.NewCounterVec(prometheus.CounterOpts{
		Name: "spotguard_checkpoints_committed_total",
		Help: "Checkpoints committed to the store (manifest written; in a multi-node job, this node's parts written), by trigger (periodic, notice).",
	}, []string{"trigger"})
	m.commitFailures = prometheus.NewCounter(prometheus.CounterOpts{
		Name: "spotguard_checkpoint_commit_failures_total",
		Help: "Failed attempts to commit a checkpoint (it is retried).",
	})
	m.withheld = prometheus.NewCounter(prometheus.CounterOpts{
		Name: "spotguard_checkpoints_withheld_total",
		Help: "Times a checkpoint whose marker is there was not committed because a file of it (or its name) cannot be stored or part of it cannot be read.",
	})
	m.split = prometheus.NewCounter(prometheus.CounterOpts{
		Name: "spotguard_checkpoints_split_total",
		Help: "Commits of this agent's found to be one piece of a save other instances committed pieces of, each with other files (the nodes of a multi-node job at store.world_nodes 1).",
	})
	m.uploadBytes = prometheus.NewCounter(prometheus.CounterOpts{
		Name: "spotguard_checkpoint_upload_bytes_total",
		Help: "Bytes of committed checkpoints uploaded by this agent.",
	})
	m.uploadEarly = prometheus.NewCounter(prometheus.CounterOpts{
		Name: "spotguard_checkpoint_upload_sent_while_written_bytes_total",
		Help: "Bytes of committed checkpoints that were in the store before their files were closed (sent while the trainer wrote them, during a notice).",
	})
	m.uploadSeconds = prometheus.NewHistogram(prometheus.HistogramOpts{
		Name:    "spotguard_checkpoint_upload_seconds",
		Help:    "Time a committed checkpoint's upload took, from the start of its first file's send to the end of its last.",
		Buckets: prometheus.ExponentialBuckets(0.5, 2, 12),
	})
	m.uploadThroughput = prometheus.NewGauge(prometheus.GaugeOpts{
		Name: "spotguard_checkpoint_upload_throughput_bytes_per_second",
		Help: "Upload throughput of the last committed checkpoint.",
	})
	m.forecast = prometheus.NewGauge(prometheus.GaugeOpts{
		Name: "spotguard_checkpoint_durable_forecast_seconds",
		Help: "How long after a notice a checkpoint like the last one would be durable (warned above 100 s).",
	})
	m.newestCommitted = prometheus.NewGauge(prometheus.GaugeOpts{
		Name: "spotguard_checkpoint_newest_committed_timestamp_seconds",
		Help: "Commit time (Unix) of the newest checkpoint this agent committed or found committed, newest by completion; its age is time() minus this.",
	})
	m.writeSeconds = prometheus.NewHistogram(prometheus.HistogramOpts{
		Name:    "spotguard_checkpoint_write_seconds",
		Help:    "From signalling the trainer to its checkpoint's marker appearing.",
		Buckets: prometheus.ExponentialBuckets(0.25, 2, 12),
	})
	m.timeToDurable = prometheus.NewHistogram(prometheus.HistogramOpts{
		Name:    "spotguard_notice_time_to_durable_seconds",
		Help:    "From a notice being detected to its checkpoint's manifest being in the store.",
		Buckets: prometheus.ExponentialBuckets(0.25, 2, 12),
	})
	m.deadlineMargin = prometheus.NewGaugeVec(prometheus.GaugeOpts{
		Name: "spotguard_notice_deadline_margin_seconds",
		Help: "Time left before the notice's deadline when its checkpoint was committed (negative: late), newest per source.",
	}, []string{"source"})
	m.jobCommitted = prometheus.NewCounterVec(prometheus.CounterOpts{
		Name: "spotguard_job_checkpoints_committed_total",
		Help: "Multi-node jobs: checkpoints this node has a part in whose job manifest is in the store, by who wrote it (this, another agent).",
	}, []string{"writer"})
	m.jobFailures = prometheus.NewCounter(prometheus.CounterOpts{
		Name: "spotguard_job_checkpoint_failures_total",
		Help: "Multi-node jobs: attempts to complete a job checkpoint that failed for good reasons (a conflict between nodes, other parts in the job manifest, parts missing after store.part_wait).",
	})
	reg.MustRegister(m.committed, m.commitFailures, m.withheld, m.split, m.jobCommitted, m.jobFailures, m.uploadBytes, m.uploadEarly, m.uploadSeconds, m.uploadThroughput,
		m.forecast, m.newestCommitted, m.writeSeconds, m.timeToDurable, m.deadlineMargin)
	reg.MustRegister(m.notices, m.signals, m.discoveryProblems, m.signalLatency, m.trainerProcesses,
		m.trainerUncaught, m.syncRequests, m.reloads, m.noticeDeadlineLeft, m.checkpointMissing)
	// Counters whose labels are known are there at 0 from the start, so that a rate or an alert
	// on them has a series before the first event.
	for _, o := range []trainer.Outcome{trainer.OutcomeSent, trainer.OutcomeNotCaught, trainer.OutcomeGone, trainer.OutcomeFailed} {
		m.signals.WithLabelValues(string(o))
	}
	for _, r := range []string{"ok", "invalid"} {
		m.reloads.WithLabelValues(r)
	}
	for _, tr := range []string{"periodic", "notice"} {
		m.committed.WithLabelValues(tr)
	}
	for _, r := range trainer.Reasons() {
		m.discoveryProblems.WithLabelValues(r)
	}
	for _, w := range []string{"this", "other"} {
		m.jobCommitted.WithLabelValues(w)
	}
	m.storeProbeFailures = prometheus.NewCounter(prometheus.CounterOpts{
		Name: "spotguard_store_probe_failures_total",
		Help: "Store probes (list, write, conditional write, read, delete of a probe object under J/_spotguard/) that failed.",
	})
	m.uploadErrors = prometheus.NewCounterVec(prometheus.CounterOpts{
		Name: "spotguard_checkpoint_upload_errors_total",
		Help: "Failed checkpoint file uploads and commits (each is retried), by reason (throttled, denied, not_found, network, changed, other).",
	}, []string{"reason"})
	for _, r := range storeReasons {
		m.uploadErrors.WithLabelValues(r)
	}
	m.health = &healthCollector{
		healthy:   prometheus.NewDesc("spotguard_healthy", "1 when /healthz answers 200 (IMDS spot answers, the store probe passed, the checkpoint watcher runs), else 0.", nil, nil),
		storeUp:   prometheus.NewDesc("spotguard_store_up", "1 when the last store probe passed, 0 when it failed; absent without a store or before the first probe.", nil, nil),
		limit:     prometheus.NewDesc("spotguard_store_concurrency_limit", "S3 requests the uploader and restores may have in flight now: it grows while throughput grows, up to store.concurrency, and backs off on throttling; absent for file:// stores.", nil, nil),
		throttled: prometheus.NewDesc("spotguard_store_throttled_total", "Times the S3 store halved its requests in flight on a 503 SlowDown, a reset or a timed-out connection; absent for file:// stores.", nil, nil),
		waiting:   prometheus.NewDesc("spotguard_checkpoints_not_committed", "Complete local checkpoints not committed yet (being uploaded, or waiting for the store); absent without a store.", nil, nil),
		waited:    prometheus.NewDesc("spotguard_checkpoint_not_committed_seconds", "How long the oldest complete local checkpoint not committed yet has been complete (0 when none); absent without a store.", nil, nil),
	}
	reg.MustRegister(m.storeProbeFailures, m.uploadErrors, m.health)
	reg.MustRegister(collectors.NewGoCollector(), collectors.NewProcessCollector(collectors.ProcessCollectorOpts{}))
	reg.MustRegister(&imdsCollector{stats: stats,
		errors: prometheus.NewDesc("spotguard_imds_errors_total", "Failed IMDS reads (timeouts, 5xx, 401, refused connections, unreadable bodies), by source.", []string{"source"}, nil),
		polls:  prometheus.NewDesc("spotguard_imds_polls_total", "IMDS reads, by source.", []string{"source"}, nil),
		up:     prometheus.NewDesc("spotguard_imds_up", "1 when IMDS is up as /healthz judges it: the spot source answered within the last 30 seconds (or has not failed yet; every source when spot is not polled), else 0.", nil, nil),
		sourceUp: prometheus.NewDesc("spotguard_imds_source_up", "1 when this IMDS source answered within the last 30 seconds (or has not failed yet), else 0, by source.",
			[]string{"source"}, nil),
	})
	return m
}

// imdsCollector exports the watcher's counters at scrape time, so the watcher needs no metrics of
// its own.
type imdsCollector struct {
	stats                       func() imds.Stats
	errors, polls, up, sourceUp *prometheus.Desc
}

func (c *imdsCollector) Describe(ch chan<- *prometheus.Desc) {
	ch <- c.errors
	ch <- c.polls
	ch <- c.up
	ch <- c.sourceUp
}

func (c *imdsCollector) Collect(ch chan<- prometheus.Metric) {
	st := c.stats()
	now := time.Now()
	for src, s := range st.Sources {
		ch <- prometheus.MustNewConstMetric(c.errors, prometheus.CounterValue, float64(s.Errors), string(src))
		ch <- prometheus.MustNewConstMetric(c.polls, prometheus.CounterValue, float64(s.Polls), string(src))
		ch <- prometheus.MustNewConstMetric(c.sourceUp, prometheus.GaugeValue, b2f(s.Healthy(now)), string(src))
	}
	ch <- prometheus.MustNewConstMetric(c.up, prometheus.GaugeValue, b2f(imdsUp(st, now)))
}

// healthCollector exports the /healthz verdict and the store probe at scrape time. Its funcs are
// set once, before the agent runs; a nil one exports nothing.
type healthCollector struct {
	verdict     func(now time.Time) healthVerdict
	store       func() storeProbeState
	concurrency func() checkpoint.LimiterStats // the uploader's S3 store; nil for others
	// uploads is the uploader's status (Uploader.Status); nil without a store.
	uploads          func(context.Context) checkpoint.UploaderStatus
	healthy, storeUp *prometheus.Desc
	limit, throttled *prometheus.Desc
	waiting, waited  *prometheus.Desc
}

func (c *healthCollector) Describe(ch chan<- *prometheus.Desc) {
	ch <- c.healthy
	ch <- c.storeUp
	ch <- c.limit
	ch <- c.throttled
	ch <- c.waiting
	ch <- c.waited
}

// uploadsStatusTimeout bounds a scrape's wait for the uploader's status: its loop answers between
// two events, and a scrape must not hang on a stopped one.
const uploadsStatusTimeout = time.Second

// notCommitted counts the complete checkpoints in st that are not committed (withheld ones
// too: their marker is there), and how long the oldest of them has been complete at now (0 when
// none).
func notCommitted(st checkpoint.UploaderStatus, now time.Time) (n int, oldest time.Duration) {
	for _, c := range st.Checkpoints {
		if !(c.Complete || c.Withheld) || c.Committed {
			continue
		}
		n++
		if c.CompleteSince != nil {
			oldest = max(oldest, now.Sub(*c.CompleteSince))
		}
	}
	return n, oldest
}

func (c *healthCollector) Collect(ch chan<- prometheus.Metric) {
	if c.verdict != nil {
		ch <- prometheus.MustNewConstMetric(c.healthy, prometheus.GaugeValue, b2f(c.verdict(time.Now()).Healthy))
	}
	if c.store != nil {
		if ps := c.store(); ps.Probes > 0 {
			ch <- prometheus.MustNewConstMetric(c.storeUp, prometheus.GaugeValue, b2f(ps.Last.OK()))
		}
	}
	if c.concurrency != nil {
		st := c.concurrency()
		ch <- prometheus.MustNewConstMetric(c.limit, prometheus.GaugeValue, float64(st.Limit))
		ch <- prometheus.MustNewConstMetric(c.throttled, prometheus.CounterValue, float64(st.Throttled))
	}
	if c.uploads != nil {
		ctx, cancel := context.WithTimeout(context.Background(), uploadsStatusTimeout)
		st := c.uploads(ctx)
		answered := ctx.Err() == nil
		cancel()
		if answered {
			n, oldest := notCommitted(st, time.Now())
			ch <- prometheus.MustNewConstMetric(c.waiting, prometheus.GaugeValue, float64(n))
			ch <- prometheus.MustNewConstMetric(c.waited, prometheus.GaugeValue, oldest.Seconds())
		}
	}
}
