package checkpoint

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"maps"
	"math/rand/v2"
	"os"
	"path"
	"path/filepath"
	"slices"
	"sync"
	"syscall"
	"time"

	"github.com/rs/zerolog"
)

// Defaults of UploaderConfig.
const (
	// DefaultBackgroundFiles is how many files are sent at once when no notice is pending: enough
	// to keep up with periodic checkpoints without taking the NIC from training traffic.
	DefaultBackgroundFiles = 2
	// DefaultUrgentFiles is how many files are sent at once after a notice: every connection.
	DefaultUrgentFiles = 16
	// ForecastWarn is the durable-after-notice forecast above which the uploader warns: a
	// 2-minute notice leaves about 100 s once detection and the trainer's reaction are paid.
	ForecastWarn = 100 * time.Second
)

// UploaderConfig configures an Uploader.
type UploaderConfig struct {
	Store Store
	// Job is store.job: the same on every instance of one training run.
	Job string
	// Dir is checkpoint.dir; Marker and Pattern as for the watcher.
	Dir, Marker, Pattern string
	// Keep is how many committed checkpoints to keep in the store (0 keeps all). The one LATEST
	// names is never deleted.
	Keep int
	// Host says which instance wrote a checkpoint; called at each commit (the identity may
	// arrive after start).
	Host func() Host
	// BackgroundFiles and UrgentFiles bound the files in flight without and with a pending
	// notice (defaults DefaultBackgroundFiles and DefaultUrgentFiles).
	BackgroundFiles, UrgentFiles int
	Logger                       zerolog.Logger
	// OnEvent, if not nil, is called (from the uploader's goroutines, never blocking it for
	// long) for each checkpoint that completes or commits, and for each commit that fails.
	OnEvent func(UploadEvent)
}

// UploadEventKind says what happened to a checkpoint.
type UploadEventKind int

// The kinds of UploadEvent.
const (
	// CheckpointComplete: its marker appeared (or the single file was renamed into place).
	CheckpointComplete UploadEventKind = iota + 1
	// CheckpointCommitted: its manifest is in the store; it exists.
	CheckpointCommitted
	// CheckpointFailed: it could not be committed (Err says why); it may be retried.
	CheckpointFailed
)

// UploadEvent reports progress of one checkpoint.
type UploadEvent struct {
	Kind       UploadEventKind
	Checkpoint string
	At         time.Time
	// Manifest is set for CheckpointCommitted.
	Manifest *Manifest
	// Forecast is set for CheckpointCommitted: how long after a notice a checkpoint like this
	// one would be durable (the trainer's write time or the upload time, whichever is longer,
	// plus the commit).
	Forecast time.Duration
	// Throughput is the upload throughput of this checkpoint in bytes per second (0 if it was
	// already in the store).
	Throughput float64
	Err        error
}

// Uploader streams checkpoint files to the Store as the watcher reports them ready, commits each
// checkpoint once it is complete and all its files are stored unchanged, keeps LATEST pointing at
// the newest, and applies retention.
type Uploader struct {
	cfg UploaderConfig
	log zerolog.Logger

	// Owned by the Run loop.
	ckpts     map[string]*ckptState
	queue     []fileRef // files waiting for a slot, urgent ones first
	inflight  int
	urgent    bool
	noticeAt  time.Time // when the first notice arrived
	deadline  time.Time
	noticeKey string
	committed map[string]bool // committed in the store (seen at start or committed since)

	results chan uploadResult
	commits chan commitResult
	requeue chan fileRef
	notices chan struct{} // poke: pending has notices (capacity 1)
	syncs   chan struct{}

	noticeMu sync.Mutex
	pending  []noticeReq
	statusCh chan chan UploaderStatus
	wg       sync.WaitGroup
}

type noticeReq struct {
	key      string
	deadline time.Time
}

type ckptState struct {
	name        string
	files       map[string]*fileState
	complete    bool
	completeAt  time.Time
	firstFileAt time.Time
	committing  bool
	committed   bool
	failures    int
	uploadStart time.Time // first byte of this checkpoint
	uploadBusy  time.Duration
	sent        int64
}

type fileState struct {
	size     int64
	modTime  time.Time
	queued   bool
	inflight bool
	// stored is what was uploaded: the file's size and modification time when it was read, and
	// its checksum. Nil until stored.
	stored   *storedFile
	attempts int
}

type storedFile struct {
	size     int64
	modTime  time.Time
	checksum Checksum
}

type fileRef struct{ ckpt, rel string }

type uploadResult struct {
	ref      fileRef
	stored   *storedFile
	start    time.Time
	duration time.Duration
	err      error
}

type commitResult struct {
	ckpt     string
	manifest *Manifest
	missing  []LocalFile // files on disk that are not stored as they are now: upload, then retry
	err      error
	already  bool
}

// NewUploader returns an Uploader. It does nothing until Run.
func NewUploader(cfg UploaderConfig) *Uploader {
	if cfg.BackgroundFiles <= 0 {
		cfg.BackgroundFiles = DefaultBackgroundFiles
	}
	if cfg.UrgentFiles <= 0 {
		cfg.UrgentFiles = DefaultUrgentFiles
	}
	if cfg.Marker == "" {
		cfg.Marker = "_COMPLETE"
	}
	if cfg.Host == nil {
		cfg.Host = func() Host { return Host{} }
	}
	return &Uploader{
		cfg:       cfg,
		log:       cfg.Logger.With().Str("component", "uploader").Str("store", cfg.Store.URL()).Str("job", cfg.Job).Logger(),
		ckpts:     map[string]*ckptState{},
		committed: map[string]bool{},
		results:   make(chan uploadResult),
		commits:   make(chan commitResult),
		requeue:   make(chan fileRef),
		notices:   make(chan struct{}, 1),
		syncs:     make(chan struct{}),
		statusCh:  make(chan chan UploaderStatus),
	}
}

// Notice switches the uploader to urgent mode for a notice: every connection goes to the
// checkpoint, and retries are bounded by deadline (zero: no deadline). It never blocks, so the
// notice path does not wait on the uploader; it may be called from any goroutine, before or
// while Run runs.
func (u *Uploader) Notice(key string, deadline time.Time) {
	u.noticeMu.Lock()
	u.pending = append(u.pending, noticeReq{key: key, deadline: deadline})
	u.noticeMu.Unlock()
	select {
	case u.notices <- struct{}{}:
	default: // a poke is already waiting
	}
}

// Sync asks for every complete checkpoint not yet in the store to be uploaded now: failed
// commits are retried at once. It returns at once if Run is not running.
func (u *Uploader) Sync(ctx context.Context) {
	select {
	case u.syncs <- struct{}{}:
	case <-ctx.Done():
	}
}

// UploaderStatus is a snapshot for /status.
type UploaderStatus struct {
	Urgent      bool               `json:"urgent"`
	Deadline    *time.Time         `json:"deadline,omitempty"`
	InFlight    int                `json:"files_in_flight"`
	Queued      int                `json:"files_queued"`
	Checkpoints []CheckpointStatus `json:"checkpoints"`
}

// CheckpointStatus is one local checkpoint the uploader tracks.
type CheckpointStatus struct {
	Name        string `json:"name"`
	Files       int    `json:"files"`
	FilesStored int    `json:"files_stored"`
	Bytes       int64  `json:"bytes"`
	BytesStored int64  `json:"bytes_stored"`
	Complete    bool   `json:"complete"`
	Committed   bool   `json:"committed"`
}

// Status returns a snapshot of the uploader's state; the zero status if Run is not running.
func (u *Uploader) Status(ctx context.Context) UploaderStatus {
	ch := make(chan UploaderStatus, 1)
	select {
	case u.statusCh <- ch:
		return <-ch
	case <-ctx.Done():
		return UploaderStatus{}
	}
}

// Run consumes watcher events until ctx is done. At start it learns which checkpoints the store
// already holds, so a restart (even after kill -9 mid-upload) finishes what is complete but not
// committed and re-sends nothing that is committed. When ctx ends while a notice's checkpoint is
// still being uploaded, Run keeps going until it is committed or the notice deadline passes
// (stopping is not draining). It returns nil after all its goroutines have exited.
func (u *Uploader) Run(ctx context.Context, events <-chan WatchEvent) error {
	u.loadCommitted(ctx)
	work, cancelWork := context.WithCancel(context.WithoutCancel(ctx))
	defer func() {
		cancelWork()
		u.wg.Wait()
	}()
	done := ctx.Done()
	var drainTimer <-chan time.Time
	for {
		select {
		case <-done:
			if !u.draining() {
				return nil
			}
			done = nil // keep going for the notice, then stop
			u.log.Warn().Time("deadline", u.deadline).Msg("stop requested while a notice's checkpoint is uploading; finishing it first")
			if !u.deadline.IsZero() {
				t := time.NewTimer(time.Until(u.deadline))
				defer t.Stop()
				drainTimer = t.C
			}
		case <-drainTimer:
			u.log.Error().Msg("notice deadline passed before the checkpoint was committed; stopping")
			return nil
		case ev, ok := <-events:
			if !ok {
				events = nil
				continue
			}
			u.handleWatch(work, ev)
		case r := <-u.results:
			u.inflight--
			u.handleResult(work, r)
		case r := <-u.commits:
			u.inflight--
			u.handleCommit(work, r)
		case ref := <-u.requeue:
			u.enqueue(ref)
		case <-u.notices:
			u.noticeMu.Lock()
			reqs := u.pending
			u.pending = nil
			u.noticeMu.Unlock()
			n := reqs[len(reqs)-1]
			// With several notices, the earliest deadline bounds the work.
			for _, r := range reqs {
				if !r.deadline.IsZero() && (n.deadline.IsZero() || r.deadline.Before(n.deadline)) {
					n.deadline = r.deadline
				}
			}
			if !u.deadline.IsZero() && (n.deadline.IsZero() || u.deadline.Before(n.deadline)) {
				n.deadline = u.deadline
			}
			if !u.urgent {
				u.noticeAt = time.Now()
			}
			u.urgent, u.deadline, u.noticeKey = true, n.deadline, n.key
			u.log.Warn().Str("notice", n.key).Time("deadline", n.deadline).Int("files_in_flight", u.inflight).
				Int("files_queued", len(u.queue)).Msg("notice: uploading with every connection")
			// Anything complete and not committed is now worth retrying at once.
			for _, c := range u.ckpts {
				c.failures = 0
			}
		case <-u.syncs:
			pending := 0
			for _, c := range u.ckpts {
				c.failures = 0
				if c.complete && !c.committed {
					pending++
				}
			}
			u.log.Info().Int("complete_not_committed", pending).Int("files_queued", len(u.queue)).Msg("sync requested")
		case ch := <-u.statusCh:
			ch <- u.status()
		}
		if done == nil && !u.draining() {
			u.log.Info().Msg("notice's checkpoint committed; stopping")
			return nil
		}
		u.dispatch(work)
	}
}

// draining reports whether stopping must wait: a notice is pending, its deadline has not passed,
// and either a complete checkpoint is not committed yet, or no checkpoint has been committed since
// the notice while one is being written after it (its marker is still to come). An incomplete
// checkpoint the trainer abandoned before the notice holds nothing up.
func (u *Uploader) draining() bool {
	if !u.urgent {
		return false
	}
	if !u.deadline.IsZero() && time.Now().After(u.deadline) {
		return false
	}
	committedSince := false
	for _, c := range u.ckpts {
		if c.committed && !c.completeAt.Before(u.noticeAt) {
			committedSince = true
		}
	}
	for _, c := range u.ckpts {
		switch {
		case c.committed:
		case c.complete:
			return true
		case !committedSince && len(c.files) > 0 && !c.firstFileAt.Before(u.noticeAt):
			return true
		}
	}
	return false
}

// loadCommitted lists the manifests already in the store.
func (u *Uploader) loadCommitted(ctx context.Context) {
	objs, err := u.cfg.Store.List(ctx, u.cfg.Job+"/")
	if err != nil {
		u.log.Error().Err(err).Msg("cannot list the store; every local checkpoint will be checked at commit")
		return
	}
	for _, o := range objs {
		rel := o.Key[len(u.cfg.Job)+1:]
		name, rest, ok := cutFirst(rel)
		if ok && rest == MetaDir+"/manifest.json" {
			u.committed[name] = true
		}
	}
	u.log.Info().Int("committed", len(u.committed)).Msg("store listed")
}

func cutFirst(p string) (first, rest string, ok bool) {
	for i := 0; i < len(p); i++ {
		if p[i] == '/' {
			return p[:i], p[i+1:], true
		}
	}
	return p, "", false
}

func (u *Uploader) state(name string) *ckptState {
	c, ok := u.ckpts[name]
	if !ok {
		c = &ckptState{name: name, files: map[string]*fileState{}, committed: u.committed[name]}
		u.ckpts[name] = c
	}
	return c
}

func (u *Uploader) handleWatch(ctx context.Context, ev WatchEvent) {
	if err := ValidName(ev.Checkpoint); err != nil {
		u.log.Warn().Str("checkpoint", ev.Checkpoint).Err(err).Msg("checkpoint name refused")
		return
	}
	switch ev.Kind {
	case FileReady:
		if err := ValidPath(ev.Path); err != nil {
			u.log.Warn().Str("checkpoint", ev.Checkpoint).Err(err).Msg("file refused")
			return
		}
		c := u.state(ev.Checkpoint)
		f, ok := c.files[ev.Path]
		if !ok {
			f = &fileState{}
			c.files[ev.Path] = f
		}
		f.size, f.modTime = ev.Size, ev.ModTime
		if c.firstFileAt.IsZero() {
			c.firstFileAt = ev.At
		}
		if c.committed {
			if f.stored != nil && (f.stored.size != ev.Size || !f.stored.modTime.Equal(ev.ModTime)) {
				u.log.Error().Str("checkpoint", c.name).Str("file", ev.Path).
					Msg("file changed after its checkpoint was committed; the committed copy in the store stays as it was")
			}
			return
		}
		if f.stored != nil && f.stored.size == ev.Size && f.stored.modTime.Equal(ev.ModTime) {
			return // already stored as it is
		}
		u.enqueue(fileRef{c.name, ev.Path})
	case Complete:
		c := u.state(ev.Checkpoint)
		if c.complete {
			return
		}
		c.complete, c.completeAt = true, ev.At
		if ev.Path == u.cfg.Marker && !c.committed {
			// The marker is part of the checkpoint (torch DCP's .metadata is its index): it is
			// sent too, last.
			f, ok := c.files[ev.Path]
			if !ok {
				f = &fileState{}
				c.files[ev.Path] = f
			}
			f.size, f.modTime = ev.Size, ev.ModTime
			u.enqueue(fileRef{c.name, ev.Path})
		}
		u.emit(UploadEvent{Kind: CheckpointComplete, Checkpoint: c.name, At: ev.At})
		if c.committed {
			u.log.Debug().Str("checkpoint", c.name).Msg("already committed")
			return
		}
		u.log.Info().Str("checkpoint", c.name).Int("files", len(c.files)).Int("stored", c.storedCount()).
			Msg("checkpoint complete; committing once every file is stored")
	case Removed:
		if c, ok := u.ckpts[ev.Checkpoint]; ok && !c.inflightAny() {
			delete(u.ckpts, ev.Checkpoint)
			u.queue = slices.DeleteFunc(u.queue, func(r fileRef) bool { return r.ckpt == ev.Checkpoint })
		}
	}
}

func (c *ckptState) storedCount() int {
	n := 0
	for _, f := range c.files {
		if f.stored != nil {
			n++
		}
	}
	return n
}

func (c *ckptState) inflightAny() bool {
	if c.committing {
		return true
	}
	for _, f := range c.files {
		if f.inflight {
			return true
		}
	}
	return false
}

func (u *Uploader) enqueue(ref fileRef) {
	c, ok := u.ckpts[ref.ckpt]
	if !ok {
		return
	}
	f := c.files[ref.rel]
	if f == nil || f.queued {
		return
	}
	f.queued = true
	u.queue = append(u.queue, ref)
}

// dispatch starts queued uploads and ready commits while there are free slots. The newest
// checkpoint goes first: after a notice it is the one that matters.
func (u *Uploader) dispatch(ctx context.Context) {
	limit := u.cfg.BackgroundFiles
	if u.urgent {
		limit = u.cfg.UrgentFiles
	}
	// Commits first: they are small and they are the point.
	for _, name := range slices.Sorted(maps.Keys(u.ckpts)) {
		c := u.ckpts[name]
		if c.complete && !c.committed && !c.committing && c.allStored() && u.inflight < limit+1 {
			c.committing = true
			u.inflight++
			u.goCommit(ctx, c)
		}
	}
	slices.SortStableFunc(u.queue, func(a, b fileRef) int {
		switch {
		case a.ckpt > b.ckpt:
			return -1
		case a.ckpt < b.ckpt:
			return 1
		}
		return 0
	})
	for u.inflight < limit && len(u.queue) > 0 {
		ref := u.queue[0]
		u.queue = u.queue[1:]
		c, ok := u.ckpts[ref.ckpt]
		if !ok {
			continue
		}
		f := c.files[ref.rel]
		if f == nil {
			continue
		}
		f.queued = false
		if f.inflight {
			f.queued = true // re-send after the one in flight; it changed meanwhile
			u.queue = append(u.queue, ref)
			break
		}
		f.inflight = true
		u.inflight++
		u.goUpload(ctx, ref)
	}
}

func (c *ckptState) allStored() bool {
	if len(c.files) == 0 {
		return false
	}
	for _, f := range c.files {
		if f.stored == nil || f.inflight || f.queued {
			return false
		}
	}
	return true
}

// uploadCtx bounds an upload by the notice deadline, if one is pending.
func (u *Uploader) uploadCtx(ctx context.Context) (context.Context, context.CancelFunc) {
	if u.urgent && !u.deadline.IsZero() {
		return context.WithDeadline(ctx, u.deadline)
	}
	return context.WithCancel(ctx)
}

// localPath is the file's path relative to Dir.
func (u *Uploader) localPath(ckpt, rel string) string {
	if rel == ckpt && u.isSingle(ckpt) {
		return ckpt
	}
	return filepath.Join(ckpt, filepath.FromSlash(rel))
}

// isSingle reports whether ckpt is a single-file checkpoint (a file, not a directory, in Dir).
func (u *Uploader) isSingle(ckpt string) bool {
	fi, err := os.Lstat(filepath.Join(u.cfg.Dir, ckpt))
	return err == nil && fi.Mode().IsRegular()
}

// goUpload sends one file. It reads what is on disk now, and records the size and modification
// time from before and after the read: if they differ, the file changed while being read and the
// result is thrown away.
func (u *Uploader) goUpload(ctx context.Context, ref fileRef) {
	uctx, cancel := u.uploadCtx(ctx)
	local := u.localPath(ref.ckpt, ref.rel)
	key := DataKey(u.cfg.Job, ref.ckpt, ref.rel)
	u.wg.Go(func() {
		defer cancel()
		start := time.Now()
		// TODO(commit layout): abort a previous run's incomplete uploads of this commit with
		// Store.AbortIncomplete(commit prefix + "/") once each commit has a prefix of its own.
		st, err := uploadFile(uctx, u.cfg.Store, u.cfg.Dir, local, key)
		r := uploadResult{ref: ref, stored: st, start: start, duration: time.Since(start), err: err}
		select {
		case u.results <- r:
		case <-ctx.Done():
		}
	})
}

// uploadFile sends the regular file rel below dir to key. It opens it through an os.Root, so
// nothing outside dir is ever read even if the trainer swaps a directory for a symlink; it refuses
// a symlink as the file itself and anything that is not a regular file, and fails if the file
// changed while it was being sent.
func uploadFile(ctx context.Context, s Store, dir, rel, key string) (*storedFile, error) {
	local := filepath.Join(dir, rel)
	root, err := os.OpenRoot(dir)
	if err != nil {
		return nil, fmt.Errorf("open %s: %w", dir, err)
	}
	defer root.Close()
	f, err := root.OpenFile(rel, os.O_RDONLY|syscall.O_NOFOLLOW|syscall.O_NONBLOCK, 0)
	if err != nil {
		return nil, fmt.Errorf("open %s: %w", local, err)
	}
	defer f.Close()
	before, err := f.Stat()
	if err != nil {
		return nil, fmt.Errorf("stat %s: %w", local, err)
	}
	if !before.Mode().IsRegular() {
		return nil, fmt.Errorf("%s is not a regular file", local)
	}
	sum, err := s.PutFile(ctx, key, f, before.Size(), nil)
	if err != nil {
		return nil, fmt.Errorf("upload %s: %w", local, err)
	}
	after, err := f.Stat()
	if err != nil {
		return nil, fmt.Errorf("stat %s: %w", local, err)
	}
	if after.Size() != before.Size() || !after.ModTime().Equal(before.ModTime()) {
		return nil, fmt.Errorf("%s: %w", local, errChangedWhileSending)
	}
	return &storedFile{size: before.Size(), modTime: before.ModTime(), checksum: sum}, nil
}

var errChangedWhileSending = errors.New("file changed while it was being sent")

func (u *Uploader) handleResult(ctx context.Context, r uploadResult) {
	c, ok := u.ckpts[r.ref.ckpt]
	if !ok {
		return
	}
	f := c.files[r.ref.rel]
	if f == nil {
		return
	}
	f.inflight = false
	log := u.log.With().Str("checkpoint", c.name).Str("file", r.ref.rel).Logger()
	if r.err != nil {
		f.attempts++
		if ctx.Err() != nil {
			return
		}
		if u.urgent && !u.deadline.IsZero() && time.Now().After(u.deadline) {
			log.Error().Err(r.err).Msg("upload failed and the notice deadline has passed")
			return
		}
		delay := retryDelay(f.attempts, u.urgent)
		log.Warn().Err(r.err).Int("attempt", f.attempts).Dur("retry_in", delay).Msg("upload failed; retrying")
		u.retryLater(ctx, r.ref, delay)
		return
	}
	f.attempts = 0
	if c.uploadStart.IsZero() || r.start.Before(c.uploadStart) {
		c.uploadStart = r.start
	}
	c.uploadBusy += r.duration
	c.sent += r.stored.size
	if f.modTime.After(r.stored.modTime) {
		// The watcher reported a newer version than the one sent; it is queued again.
		u.enqueue(r.ref)
		return
	}
	// What was sent is what is on disk (it did not change while being sent); an event that saw
	// the file earlier (a marker caught while being written, say) is superseded by it.
	f.size, f.modTime = r.stored.size, r.stored.modTime
	f.stored = r.stored
	log.Debug().Int64("bytes", r.stored.size).Dur("took", r.duration).Msg("file stored")
}

// retryDelay grows with the attempts: 250 ms doubling, capped at 2 s during a notice and 30 s
// otherwise, with jitter.
func retryDelay(attempt int, urgent bool) time.Duration {
	capd := 30 * time.Second
	if urgent {
		capd = 2 * time.Second
	}
	d := 250 * time.Millisecond << min(attempt-1, 10)
	d = min(d, capd)
	return d/2 + rand.N(d/2+1)
}

// retryLater queues ref again once d has passed.
func (u *Uploader) retryLater(ctx context.Context, ref fileRef, d time.Duration) {
	u.after(ctx, d, func() {
		select {
		case u.requeue <- ref:
		case <-ctx.Done():
		}
	})
}

// after runs send on one of the uploader's goroutines once d has passed, unless ctx ends first.
func (u *Uploader) after(ctx context.Context, d time.Duration, send func()) {
	u.wg.Go(func() {
		t := time.NewTimer(d)
		defer t.Stop()
		select {
		case <-t.C:
			send()
		case <-ctx.Done():
		}
	})
}

// goCommit checks the checkpoint on disk once more and, if every file is stored exactly as it is
// now, writes the manifest (only if absent), then LATEST, then applies retention.
func (u *Uploader) goCommit(ctx context.Context, c *ckptState) {
	uctx, cancel := u.uploadCtx(ctx)
	name := c.name
	stored := map[string]storedFile{}
	for rel, f := range c.files {
		stored[rel] = *f.stored
	}
	timings := Timings{UploadSeconds: c.uploadBusy.Seconds()}
	if !c.firstFileAt.IsZero() {
		t := c.firstFileAt
		timings.FirstFileAt = &t
	}
	if !c.completeAt.IsZero() {
		t := c.completeAt
		timings.CompleteAt = &t
	}
	trigger, notice := "periodic", ""
	if u.urgent {
		trigger, notice = "notice", u.noticeKey
	}
	u.wg.Go(func() {
		defer cancel()
		r := u.commit(uctx, name, stored, timings, trigger, notice)
		select {
		case u.commits <- r:
		case <-ctx.Done():
		}
	})
}

func (u *Uploader) commit(ctx context.Context, name string, stored map[string]storedFile, timings Timings, trigger, notice string) commitResult {
	local, err := u.scanOne(name)
	if err != nil {
		return commitResult{ckpt: name, err: err}
	}
	m := &Manifest{Version: ManifestVersion, Job: u.cfg.Job, Checkpoint: name, Host: u.cfg.Host(), Trigger: trigger, Notice: notice}
	var missing []LocalFile
	for _, lf := range local.Files {
		s, ok := stored[lf.Path]
		if !ok || s.size != lf.Size || !s.modTime.Equal(lf.ModTime) {
			missing = append(missing, lf)
			continue
		}
		m.Files = append(m.Files, File{Path: lf.Path, Size: s.size, Checksum: s.checksum})
		m.TotalBytes += s.size
	}
	if len(missing) > 0 {
		return commitResult{ckpt: name, missing: missing}
	}
	slices.SortFunc(m.Files, func(a, b File) int {
		switch {
		case a.Path < b.Path:
			return -1
		case a.Path > b.Path:
			return 1
		}
		return 0
	})
	now := time.Now()
	last := now
	timings.LastByteAt = &last
	m.Timings = timings
	m.CommittedAt = now
	if err := m.Validate(); err != nil {
		return commitResult{ckpt: name, err: fmt.Errorf("refusing to commit: %w", err)}
	}
	data, err := json.MarshalIndent(m, "", "  ")
	if err != nil {
		return commitResult{ckpt: name, err: err}
	}
	_, err = u.cfg.Store.PutBytes(ctx, ManifestKey(u.cfg.Job, name), data, Cond{IfAbsent: true})
	already := errors.Is(err, ErrExists)
	if err != nil && !already {
		return commitResult{ckpt: name, err: fmt.Errorf("write manifest: %w", err)}
	}
	if already {
		// Committed before (by an earlier run of the agent): that manifest stands.
		if m, err = ReadManifest(ctx, u.cfg.Store, u.cfg.Job, name); err != nil {
			return commitResult{ckpt: name, err: fmt.Errorf("read existing manifest: %w", err)}
		}
	}
	if err := u.updateLatest(ctx, m); err != nil {
		return commitResult{ckpt: name, manifest: m, already: already, err: fmt.Errorf("update LATEST: %w", err)}
	}
	u.applyRetention(ctx)
	return commitResult{ckpt: name, manifest: m, already: already}
}

// scanOne returns checkpoint name as it is on disk now, its marker included among its files.
func (u *Uploader) scanOne(name string) (LocalCheckpoint, error) {
	all, err := Scan(u.cfg.Dir, u.cfg.Marker, u.cfg.Pattern, u.log)
	if err != nil {
		return LocalCheckpoint{}, fmt.Errorf("scan %s: %w", u.cfg.Dir, err)
	}
	for _, lc := range all {
		if lc.Name == name {
			if !lc.Complete {
				return LocalCheckpoint{}, fmt.Errorf("checkpoint %s is no longer complete on disk", name)
			}
			if !lc.Single {
				fi, err := os.Lstat(filepath.Join(u.cfg.Dir, name, u.cfg.Marker))
				if err != nil || !fi.Mode().IsRegular() {
					return LocalCheckpoint{}, fmt.Errorf("checkpoint %s: marker is gone or not a regular file", name)
				}
				lc.Files = append(lc.Files, LocalFile{Path: u.cfg.Marker, Size: fi.Size(), ModTime: fi.ModTime()})
			}
			return lc, nil
		}
	}
	return LocalCheckpoint{}, fmt.Errorf("checkpoint %s is gone from %s", name, u.cfg.Dir)
}

// updateLatest points LATEST at m unless it already names a checkpoint that completed later.
func (u *Uploader) updateLatest(ctx context.Context, m *Manifest) error {
	key := LatestKey(u.cfg.Job)
	if b, _, err := u.cfg.Store.GetBytes(ctx, key); err == nil {
		var cur Latest
		if json.Unmarshal(b, &cur) == nil && cur.Checkpoint != m.Checkpoint {
			if cm, err := ReadManifest(ctx, u.cfg.Store, u.cfg.Job, cur.Checkpoint); err == nil && completedAfter(cm, m) {
				return nil
			}
		}
	} else if !errors.Is(err, ErrNotFound) {
		return err
	}
	data, err := json.Marshal(Latest{Checkpoint: m.Checkpoint, CommittedAt: m.CommittedAt})
	if err != nil {
		return err
	}
	_, err = u.cfg.Store.PutBytes(ctx, key, data, Cond{})
	return err
}

// completedAfter reports whether a's checkpoint was completed (written) after b's; commit time
// decides when a completion time is missing.
func completedAfter(a, b *Manifest) bool {
	if a.Timings.CompleteAt != nil && b.Timings.CompleteAt != nil {
		return a.Timings.CompleteAt.After(*b.Timings.CompleteAt)
	}
	return a.CommittedAt.After(b.CommittedAt)
}

// applyRetention deletes all but the newest Keep committed checkpoints, never the one LATEST
// names. The manifest goes first, so a checkpoint stops existing before its data goes.
func (u *Uploader) applyRetention(ctx context.Context) {
	if u.cfg.Keep <= 0 {
		return
	}
	all, problems, err := ListCommitted(ctx, u.cfg.Store, u.cfg.Job)
	if err != nil {
		u.log.Warn().Err(err).Msg("retention: cannot list the store")
		return
	}
	for _, p := range problems {
		u.log.Warn().Err(p).Msg("retention: invalid manifest left alone")
	}
	kept := 0
	for _, c := range all { // newest first
		if kept < u.cfg.Keep || c.Latest {
			kept++
			continue
		}
		name := c.Manifest.Checkpoint
		if err := u.cfg.Store.Delete(ctx, ManifestKey(u.cfg.Job, name)); err != nil {
			u.log.Warn().Err(err).Str("checkpoint", name).Msg("retention: cannot delete manifest")
			continue
		}
		objs, err := u.cfg.Store.List(ctx, path.Join(u.cfg.Job, name)+"/")
		if err == nil {
			keys := make([]string, 0, len(objs))
			for _, o := range objs {
				keys = append(keys, o.Key)
			}
			err = u.cfg.Store.Delete(ctx, keys...)
		}
		if err != nil {
			u.log.Warn().Err(err).Str("checkpoint", name).Msg("retention: manifest deleted but data left behind")
			continue
		}
		u.log.Info().Str("checkpoint", name).Int("keep", u.cfg.Keep).Msg("retention: old checkpoint deleted")
	}
}

func (u *Uploader) handleCommit(ctx context.Context, r commitResult) {
	c, ok := u.ckpts[r.ckpt]
	if !ok {
		return
	}
	c.committing = false
	log := u.log.With().Str("checkpoint", c.name).Logger()
	if len(r.missing) > 0 {
		for _, lf := range r.missing {
			f, ok := c.files[lf.Path]
			if !ok {
				f = &fileState{}
				c.files[lf.Path] = f
			}
			if f.stored != nil {
				log.Warn().Str("file", lf.Path).Msg("file changed after it was sent; sending it again before committing")
			}
			f.size, f.modTime, f.stored = lf.Size, lf.ModTime, nil
			u.enqueue(fileRef{c.name, lf.Path})
		}
		return
	}
	if errors.Is(r.err, errRetryCommit) {
		return // the pause is over: dispatch commits again
	}
	if r.err != nil {
		c.failures++
		log.Error().Err(r.err).Int("failures", c.failures).Msg("commit failed")
		u.emit(UploadEvent{Kind: CheckpointFailed, Checkpoint: c.name, At: time.Now(), Err: r.err})
		if ctx.Err() == nil {
			u.retryCommit(ctx, c.name, retryDelay(c.failures, u.urgent))
		}
		return
	}
	c.committed = true
	u.committed[c.name] = true
	ev := UploadEvent{Kind: CheckpointCommitted, Checkpoint: c.name, At: time.Now(), Manifest: r.manifest}
	if !r.already {
		ev.Throughput, ev.Forecast = forecast(c, r.manifest)
		ev2 := log.Info()
		if ev.Forecast > ForecastWarn {
			ev2 = log.Warn()
		}
		ev2.Int("files", len(r.manifest.Files)).Int64("bytes", r.manifest.TotalBytes).
			Float64("throughput_mb_s", ev.Throughput/1e6).Dur("durable_after_notice_forecast", ev.Forecast).
			Str("trigger", r.manifest.Trigger).
			Msgf("checkpoint committed; a checkpoint like this one would be durable %.0f s after a notice", ev.Forecast.Seconds())
	} else {
		log.Info().Msg("checkpoint was already committed")
	}
	u.emit(ev)
}

func (u *Uploader) retryCommit(ctx context.Context, name string, d time.Duration) {
	// A commit is retried by dispatch once its pause is over; until then committing stays set.
	c := u.ckpts[name]
	c.committing = true
	u.inflight++
	u.after(ctx, d, func() {
		select {
		case u.commits <- commitResult{ckpt: name, err: errRetryCommit}:
		case <-ctx.Done():
		}
	})
}

var errRetryCommit = errors.New("retry")

// forecast returns the checkpoint's upload throughput (bytes/s) and how long after a notice a
// checkpoint like it would be durable: the trainer's write time (first file ready → marker) or
// the time to send it all at this throughput, whichever is longer, plus the commit.
func forecast(c *ckptState, m *Manifest) (float64, time.Duration) {
	if c.uploadBusy <= 0 || m.TotalBytes == 0 {
		return 0, 0
	}
	wall := c.uploadBusy
	if !c.uploadStart.IsZero() && m.Timings.LastByteAt != nil {
		wall = min(wall, m.Timings.LastByteAt.Sub(c.uploadStart))
	}
	throughput := float64(c.sent) / wall.Seconds()
	send := time.Duration(float64(m.TotalBytes) / throughput * float64(time.Second))
	var write time.Duration
	if m.Timings.FirstFileAt != nil && m.Timings.CompleteAt != nil {
		write = m.Timings.CompleteAt.Sub(*m.Timings.FirstFileAt)
	}
	commit := time.Since(*m.Timings.LastByteAt)
	return throughput, max(write, send) + commit
}

func (u *Uploader) emit(ev UploadEvent) {
	if u.cfg.OnEvent != nil {
		u.cfg.OnEvent(ev)
	}
}

func (u *Uploader) status() UploaderStatus {
	st := UploaderStatus{Urgent: u.urgent, InFlight: u.inflight, Queued: len(u.queue)}
	if !u.deadline.IsZero() {
		d := u.deadline
		st.Deadline = &d
	}
	for _, name := range slices.Sorted(maps.Keys(u.ckpts)) {
		c := u.ckpts[name]
		cs := CheckpointStatus{Name: name, Files: len(c.files), Complete: c.complete, Committed: c.committed}
		for _, f := range c.files {
			cs.Bytes += f.size
			if f.stored != nil {
				cs.FilesStored++
				cs.BytesStored += f.stored.size
			}
		}
		st.Checkpoints = append(st.Checkpoints, cs)
	}
	return st
}
