package checkpoint

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"maps"
	"math/rand/v2"
	"os"
	"slices"
	"strings"
	"sync"
	"time"
)

// simBackend is the simulation's S3: objects with ETags, conditional writes, multipart uploads
// that take time and can be left behind by a killed agent, and faults (latency, 503s, answers
// lost after the write happened, outages). Every agent talks to it through a simStore of its own.
// It checks, as writes happen, the invariants only a history shows: no object a manifest lists is
// written again or deleted while the manifest exists (I1, I2), LATEST moves only forward and only
// to a commit that exists (I3), retention never deletes LATEST's target or anything newer (I3),
// and no agent aborts an upload another live agent is running (I7).
type simBackend struct {
	mu sync.Mutex
	// seed and conns (connections made so far) seed each request's draws (simStore.request).
	seed  uint64
	conns int
	// requests, if not nil, gets a line for each request (-sim.requests).
	requests io.Writer
	objs     map[string]*simObject
	uploads  map[int]*simUpload
	nextID   int
	etags    int
	partSize int64
	// covered maps every key a present manifest lists (and the manifest's own key) to the
	// manifest's key.
	covered map[string]string
	latest  *Latest
	faults  simFaults
	late    int // held writes not landed yet
	// landing: a held write that arrived at arrived is landing now; lateKeys are the keys
	// written so.
	landing    bool
	arrived    time.Time
	lateKeys   map[string]bool
	violations []string
	partWrites map[string]int // by checkpoint name
	// everCommitted holds every version ever committed, by name: manifestFingerprint.
	everCommitted map[string][]string
	// deletedBy is the agent that deleted each key deleted and not written since; torn the
	// manifests over deleted objects that the agents must delete (tear).
	deletedBy map[string]string
	torn      map[string]simTear
	tears     int // every one recorded
	// up holds, for each agent running (its name, not an incarnation), when it last started.
	up map[string]time.Time
}

type simObject struct {
	data []byte
	etag string
	at   time.Time // when the write that made it arrived
	by   string    // the agent (incarnation) that wrote it
}

type simUpload struct {
	id    int
	key   string
	owner *simStore
}

func newSimBackend(seed uint64) *simBackend {
	return &simBackend{
		seed:          seed,
		objs:          map[string]*simObject{},
		uploads:       map[int]*simUpload{},
		partSize:      64 << 10,
		covered:       map[string]string{},
		partWrites:    map[string]int{},
		everCommitted: map[string][]string{},
		lateKeys:      map[string]bool{},
		deletedBy:     map[string]string{},
		torn:          map[string]simTear{},
		up:            map[string]time.Time{},
	}
}

// agentUp records that the agent name started now (up) or stopped.
func (b *simBackend) agentUp(name string, up bool) {
	b.mu.Lock()
	defer b.mu.Unlock()
	if up {
		b.up[name] = time.Now()
	} else {
		delete(b.up, name)
	}
}

// violate records a violated invariant. Called with b.mu held.
func (b *simBackend) violate(format string, args ...any) {
	b.violations = append(b.violations, fmt.Sprintf(format, args...))
}

// takeViolations returns and forgets the violations so far.
func (b *simBackend) takeViolations() []string {
	b.mu.Lock()
	defer b.mu.Unlock()
	v := b.violations
	b.violations = nil
	return v
}

// simFaults are the store's faults at one time.
type simFaults struct {
	// errRate of requests fail before anything happens (503 SlowDown); lostRate take effect,
	// then their answer is lost (a reset).
	errRate, lostRate float64
	// lateRate of writes (a PUT, the completion of a multipart upload, a delete) get no answer
	// within simAnswerTimeout, as the network held them, and take effect up to simLateBy after
	// the client gave up: a conditional write is judged when it lands.
	lateRate float64
	// maxLatency is the longest latency of a request.
	maxLatency time.Duration
	// outage: every request is refused at once. hang: every request is answered by nothing,
	// and the client gives up after simAnswerTimeout, as behind a route that drops packets.
	outage, hang bool
}

// simAnswerTimeout is how long a request waits for an answer that does not come (S3Store's
// ResponseHeaderTimeout); simLateBy the longest a held write takes to land after that.
const (
	simAnswerTimeout = 20 * time.Second
	simLateBy        = 30 * time.Second
)

// setFaults sets the store's faults.
func (b *simBackend) setFaults(f simFaults) {
	b.mu.Lock()
	defer b.mu.Unlock()
	b.faults = f
}

// arrival is when the request being applied arrived: now, or a held write's.
func (b *simBackend) arrival() time.Time {
	if b.landing {
		return b.arrived
	}
	return time.Now()
}

// write stores data at key. As on S3, of two writes of one key the one that arrived later wins,
// whichever ends last: a held write that arrived before the key was written again changes
// nothing. Called with b.mu held.
func (b *simBackend) write(key string, data []byte, by string) string {
	at := b.arrival()
	if o := b.objs[key]; o != nil && o.at.After(at) {
		return o.etag
	}
	if m, ok := b.covered[key]; ok {
		// The same bytes again (a held write of them landing late) change nothing anyone can
		// read; other bytes would.
		if o := b.objs[key]; o == nil || !bytes.Equal(o.data, data) {
			b.violate("I1: %s written again, with other bytes, while manifest %s lists it", key, m)
		}
	} else if parts := strings.Split(key, "/"); len(parts) > 3 && ValidCommitID(parts[2]) == nil {
		if mk := ManifestKey(parts[0], parts[1], parts[2]); mk != key {
			// A held write of a file that left the checkpoint may land after the manifest: the
			// agent deletes it later (goLateCleanup), and the store check at the end tells
			// apart what it left.
			if _, ok := b.objs[mk]; ok && !b.landing {
				b.violate("I1: %s written into commit %s after its manifest", key, parts[2])
			}
		}
	}
	if b.landing {
		b.lateKeys[key] = true
	}
	b.etags++
	etag := fmt.Sprintf("\"%d\"", b.etags)
	b.objs[key] = &simObject{data: slices.Clone(data), etag: etag, at: at, by: by}
	delete(b.deletedBy, key)
	switch {
	case strings.HasSuffix(key, "/"+MetaDir+"/manifest.json"):
		m, err := ParseManifest(data)
		if err != nil {
			b.violate("manifest %s is invalid: %v", key, err)
			return etag
		}
		b.everCommitted[m.Checkpoint] = append(b.everCommitted[m.Checkpoint], manifestFingerprint(m))
		b.covered[key] = key
		for _, f := range m.Files {
			k := m.FileKey(f)
			o, ok := b.objs[k]
			switch {
			case !ok && b.otherAgent(b.deletedBy[k], by):
				b.tear(key, by, fmt.Sprintf("written by %s, lists %s, which %s deleted", by, k, b.deletedBy[k]))
			case !ok:
				b.violate("I2: manifest %s lists %s, which is not in the store", key, k)
			case int64(len(o.data)) != f.Size:
				b.violate("I2: manifest %s lists %s with %d bytes; the object has %d", key, k, f.Size, len(o.data))
			default:
				if sum, _ := ChecksumOf(bytes.NewReader(o.data)); sum != f.Checksum {
					b.violate("I2: manifest %s lists %s with checksum %s; the object has %s", key, k, f.Checksum.Value, sum.Value)
				}
			}
			b.covered[k] = key
		}
	case strings.HasSuffix(key, "/"+MetaDir+"/part.json"):
		if m, err := ParseManifest(data); err != nil || m.Part == nil {
			b.violate("part %s is invalid: %v", key, err)
		} else {
			b.partWrites[m.Checkpoint]++
		}
	case strings.HasSuffix(key, "/LATEST"):
		var l Latest
		if err := json.Unmarshal(data, &l); err != nil {
			b.violate("I3: LATEST written as %q", data)
			return etag
		}
		if _, ok := b.objs[ManifestKey(strings.TrimSuffix(key, "/LATEST"), l.Checkpoint, l.Commit)]; !ok {
			b.violate("I3: LATEST moved to %s/%s, which has no manifest", l.Checkpoint, l.Commit)
		}
		if err := CheckLatestForward(b.latest, &l); err != nil {
			b.violate("%v", err)
		}
		b.latest = &l
	}
	return etag
}

// remove deletes key, for the agent by; a held delete that arrived before the key was written
// again changes nothing. Called with b.mu held.
func (b *simBackend) remove(key, by string) {
	o, ok := b.objs[key]
	if !ok || o.at.After(b.arrival()) {
		return
	}
	if m, ok := b.covered[key]; ok && m != key {
		if om, present := b.objs[m]; present {
			if b.otherAgent(by, om.by) {
				b.tear(m, om.by, fmt.Sprintf("written by %s, lists %s, which %s deleted", om.by, key, by))
			} else {
				b.violate("I2: %s deleted while manifest %s lists it", key, m)
			}
		}
	}
	b.deletedBy[key] = by
	if strings.HasSuffix(key, "/"+MetaDir+"/manifest.json") {
		if m, err := ParseManifest(o.data); err == nil {
			if l := b.latest; l != nil && l.Checkpoint == m.Checkpoint && l.Commit == m.Commit {
				b.violate("I3: %s deleted LATEST's target %s/%s", by, m.Checkpoint, m.Commit)
			} else if l != nil && l.CompleteAt != nil && m.Order().After(CommitOrder{At: *l.CompleteAt, Commit: l.Commit}) {
				b.violate("I3: %s deleted %s/%s (%s), newer than LATEST %s/%s (%s)", by, m.Checkpoint, m.Commit,
					m.Order().At.Format("15:04:05.000000"), l.Checkpoint, l.Commit, l.CompleteAt.Format("15:04:05.000000"))
			}
			for _, f := range m.Files {
				delete(b.covered, m.FileKey(f))
			}
		}
		delete(b.covered, key)
		delete(b.torn, key)
	}
	delete(b.objs, key)
}

// otherAgent reports whether agents (incarnations) x and y are two agents, not one agent's runs.
func (b *simBackend) otherAgent(x, y string) bool {
	bx, _, _ := strings.Cut(x, "#")
	by, _, _ := strings.Cut(y, "#")
	return x != "" && y != "" && bx != by
}

// tear records that manifest key, written by the agent incarnation writer, lists an object
// deleted, in the one race between two agents that S3 cannot exclude: one agent's retention
// deletes a commit, manifest first, while another that lost the answer to its write of that
// manifest writes it again. Both look afterwards (clearRevived, Uploader.commit) and delete the
// manifest; checkTorn holds them to it. Called with b.mu held.
func (b *simBackend) tear(key, writer, why string) {
	if _, ok := b.torn[key]; !ok {
		name, _, _ := strings.Cut(writer, "#")
		b.torn[key] = simTear{at: time.Now(), writer: name, why: why}
		b.tears++
	}
}

// simTear is a manifest over deleted objects (tear), written by the agent writer.
type simTear struct {
	at          time.Time
	writer, why string
}

// tornFor is how long a manifest over deleted objects may stay (tear) while the agent that wrote
// it runs: the agents' looks after their writes and deletes, and the late clean-up of a prefix
// that failed them, 0, 5 and 30 s on. A stopped agent looks again when it starts (its journal
// keeps the clean-up), so the time counts from then.
const tornFor = time.Minute

// checkTorn records a violation for each manifest over deleted objects that has stayed longer
// than tornFor while its writer ran (tornFor), or for each one at all when final.
func (b *simBackend) checkTorn(final bool) {
	b.mu.Lock()
	defer b.mu.Unlock()
	for _, k := range slices.Sorted(maps.Keys(b.torn)) {
		t := b.torn[k]
		since, running := b.up[t.writer]
		if t.at.After(since) {
			since = t.at
		}
		if final || running && time.Since(since) > tornFor {
			b.violate("I2: manifest %s lists deleted objects since %s (%s), not deleted by its agents", k, t.at.Format("15:04:05.000"), t.why)
			delete(b.torn, k)
		}
	}
}

// tornLeft reports whether a manifest over deleted objects is in the store (tear).
func (b *simBackend) tornLeft() bool {
	b.mu.Lock()
	defer b.mu.Unlock()
	return len(b.torn) > 0
}

// manifests returns every manifest in the store.
func (b *simBackend) manifests() []*Manifest {
	b.mu.Lock()
	defer b.mu.Unlock()
	var out []*Manifest
	for _, k := range slices.Sorted(maps.Keys(b.objs)) {
		if strings.HasSuffix(k, "/"+MetaDir+"/manifest.json") {
			if m, err := ParseManifest(b.objs[k].data); err == nil {
				out = append(out, m)
			}
		}
	}
	return out
}

// incomplete returns the keys of the incomplete uploads.
func (b *simBackend) incomplete() []string {
	b.mu.Lock()
	defer b.mu.Unlock()
	var out []string
	for _, u := range b.uploads {
		out = append(out, u.key)
	}
	slices.Sort(out)
	return out
}

// simStore is one agent's connection to a simBackend. kill makes it behave as the agent's
// process dying: every later call fails without effect, and its multipart uploads in flight stay
// behind, incomplete.
type simStore struct {
	b      *simBackend
	name   string
	conn   int // which connection of the backend's it is
	mu     sync.Mutex
	dead   bool
	active map[int]bool
	// requests counts the requests of each kind made at requestsAt (request).
	requests   map[string]int
	requestsAt time.Time
}

var _ Store = (*simStore)(nil)

func (b *simBackend) connect(name string) *simStore {
	b.mu.Lock()
	defer b.mu.Unlock()
	b.conns++
	return &simStore{b: b, name: name, conn: b.conns, active: map[int]bool{}, requests: map[string]int{}}
}

// request returns the draws for one request: what, its operation and key. They are a function
// of the backend's seed, the connection, the request and the (fake) time it is made, never of
// the order in which concurrent requests arrive, so that a seed replays its run: requests of one
// kind made at one moment (two goroutines reading one listing) share their fate, in whatever
// order they come. Past simSameFate of them, each draws anew, so that a loop that retried at
// once would not meet the same fault for ever.
func (s *simStore) request(what string) *rand.Rand {
	s.mu.Lock()
	if now := time.Now(); !now.Equal(s.requestsAt) {
		clear(s.requests)
		s.requestsAt = now
	}
	s.requests[what]++
	n, at := s.requests[what], s.requestsAt
	s.mu.Unlock()
	name := fmt.Sprintf("%d %s %d", s.conn, what, at.UnixNano())
	if n > simSameFate {
		name += fmt.Sprint(" ", n)
	}
	if s.b.requests != nil {
		fmt.Fprintf(s.b.requests, "{\"request\":%q,\"agent\":%q,\"n\":%d,\"at\":%q}\n", what, s.name, n,
			at.UTC().Format("15:04:05.000000"))
	}
	return seeded(s.b.seed, name)
}

// simSameFate is how many requests of one kind made at one moment share their fate.
const simSameFate = 8

func (s *simStore) kill() {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.dead = true
}

func (s *simStore) isDead() bool {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.dead
}

var (
	errSimDead    = errors.New("sim: the agent is dead")
	errSimFault   = errors.New("sim: 503 SlowDown")
	errSimOutage  = errors.New("sim: connection refused")
	errSimLost    = errors.New("sim: connection reset after the request was sent")
	errSimTimeout = errors.New("sim: timeout awaiting response headers")
)

// simFate is what becomes of one request.
type simFate int

const (
	fateAnswered simFate = iota
	fateLost             // it takes effect, then its answer is lost
	fateLate             // a write: no answer comes; it takes effect later (landLate)
)

// begin waits a random latency and decides the fate of one request, drawn from r (request): an
// error before anything happens, answered, lost, or (write) late.
func (s *simStore) begin(ctx context.Context, r *rand.Rand, write bool) (simFate, error) {
	s.b.mu.Lock()
	d := time.Duration(0)
	if s.b.faults.maxLatency > 0 {
		d = time.Duration(r.Int64N(int64(s.b.faults.maxLatency)))
	}
	hang := s.b.faults.hang
	s.b.mu.Unlock()
	if d > 0 {
		t := time.NewTimer(d)
		select {
		case <-t.C:
		case <-ctx.Done():
			t.Stop()
			return fateAnswered, ctx.Err()
		}
	}
	if s.isDead() {
		return fateAnswered, errSimDead
	}
	if err := ctx.Err(); err != nil {
		return fateAnswered, err
	}
	if hang {
		return fateAnswered, s.noAnswer(ctx)
	}
	s.b.mu.Lock()
	defer s.b.mu.Unlock()
	switch {
	case s.b.faults.outage:
		return fateAnswered, errSimOutage
	case r.Float64() < s.b.faults.errRate:
		return fateAnswered, errSimFault
	case write && s.b.faults.lateRate > 0 && r.Float64() < s.b.faults.lateRate:
		return fateLate, nil
	case r.Float64() < s.b.faults.lostRate:
		return fateLost, nil
	}
	return fateAnswered, nil
}

// lateDraw says whether a write is held (with lateRate), for a write begin did not judge.
func (s *simStore) lateDraw(r *rand.Rand) bool {
	s.b.mu.Lock()
	defer s.b.mu.Unlock()
	return s.b.faults.lateRate > 0 && r.Float64() < s.b.faults.lateRate
}

// noAnswer waits for an answer that never comes, until the client gives up.
func (s *simStore) noAnswer(ctx context.Context) error {
	t := time.NewTimer(simAnswerTimeout)
	defer t.Stop()
	select {
	case <-t.C:
		return errSimTimeout
	case <-ctx.Done():
		return ctx.Err()
	}
}

// landLate runs apply (with b.mu held) at a random time within simAnswerTimeout + simLateBy
// from now, as a write the network held lands, while the client waits for an answer that never
// comes and gives up: it returns what the client is told. A killed agent's held writes land
// too.
func (s *simStore) landLate(ctx context.Context, r *rand.Rand, apply func()) error {
	s.b.mu.Lock()
	d := time.Duration(r.Int64N(int64(simAnswerTimeout + simLateBy)))
	s.b.late++
	s.b.mu.Unlock()
	arrived := time.Now()
	go func() {
		<-time.After(d)
		s.b.mu.Lock()
		defer s.b.mu.Unlock()
		s.b.landing, s.b.arrived = true, arrived
		apply()
		s.b.landing = false
		s.b.late--
	}()
	return s.noAnswer(ctx)
}

func (s *simStore) URL() string { base, _, _ := strings.Cut(s.name, "#"); return "s3://sim/" + base }

func (s *simStore) PutFile(ctx context.Context, key string, f *os.File, size int64, progress func(n int64)) (Checksum, error) {
	if err := checkStoreKey(key); err != nil {
		return Checksum{}, err
	}
	r := s.request("put file " + key)
	fate, err := s.begin(ctx, r, size <= s.b.partSize)
	if err != nil {
		return Checksum{}, err
	}
	data := make([]byte, size)
	if size <= s.b.partSize {
		if _, err := f.ReadAt(data, 0); err != nil && (!errors.Is(err, io.EOF) || size != 0) {
			return Checksum{}, err
		}
		if fate == fateLate {
			return Checksum{}, s.landLate(ctx, r, func() { s.b.write(key, data, s.name) })
		}
		s.b.mu.Lock()
		s.b.write(key, data, s.name)
		s.b.mu.Unlock()
	} else {
		up := s.newUpload(key)
		for off := int64(0); off < size; off += s.b.partSize {
			n := min(s.b.partSize, size-off)
			if err := s.sendPart(ctx, up, f, data[off:off+n], off); err != nil {
				return Checksum{}, err
			}
		}
		if err := s.completeUpload(ctx, up, data); err != nil {
			return Checksum{}, err
		}
	}
	if progress != nil {
		progress(size)
	}
	if fate == fateLost {
		return Checksum{}, errSimLost
	}
	return ChecksumOf(bytes.NewReader(data))
}

// newUpload creates a multipart upload of key, running (active) until endUpload.
func (s *simStore) newUpload(key string) *simUpload {
	s.b.mu.Lock()
	s.b.nextID++
	up := &simUpload{id: s.b.nextID, key: key, owner: s}
	s.b.uploads[up.id] = up
	s.b.mu.Unlock()
	s.mu.Lock()
	s.active[up.id] = true
	s.mu.Unlock()
	return up
}

// endUpload takes up off the running set, and aborts it if abort.
func (s *simStore) endUpload(up *simUpload, abort bool) {
	s.mu.Lock()
	delete(s.active, up.id)
	s.mu.Unlock()
	if abort {
		s.b.mu.Lock()
		delete(s.b.uploads, up.id)
		s.b.mu.Unlock()
	}
}

// sendPart sends one part of up: the bytes of f at off, read into buf. On failure the upload is
// ended (aborted, unless the agent is dead or the answer never came).
func (s *simStore) sendPart(ctx context.Context, up *simUpload, f *os.File, buf []byte, off int64) error {
	if _, err := s.begin(ctx, s.request(fmt.Sprintf("part %s %d", up.key, off)), false); err != nil {
		s.endUpload(up, !errors.Is(err, errSimDead) && !errors.Is(err, errSimTimeout)) // a dead agent aborts nothing
		return err
	}
	if _, err := f.ReadAt(buf, off); err != nil {
		s.endUpload(up, true)
		return err
	}
	s.b.mu.Lock()
	_, ok := s.b.uploads[up.id]
	s.b.mu.Unlock()
	if !ok {
		s.endUpload(up, false)
		return errors.New("sim: NoSuchUpload")
	}
	return nil
}

// completeUpload completes up as the object data; the completion, a write, may be held and land
// later. It ends the upload.
func (s *simStore) completeUpload(ctx context.Context, up *simUpload, data []byte) error {
	complete := func() bool {
		if _, ok := s.b.uploads[up.id]; !ok {
			return false
		}
		delete(s.b.uploads, up.id)
		s.b.write(up.key, data, s.name)
		return true
	}
	if r := s.request("complete " + up.key); s.lateDraw(r) {
		s.endUpload(up, false)
		return s.landLate(ctx, r, func() { complete() })
	}
	s.b.mu.Lock()
	ok := complete()
	s.b.mu.Unlock()
	s.endUpload(up, false)
	if !ok {
		return errors.New("sim: NoSuchUpload")
	}
	return nil
}

func (s *simStore) PutBytes(ctx context.Context, key string, data []byte, cond Cond) (string, error) {
	if err := checkStoreKey(key); err != nil {
		return "", err
	}
	if err := cond.check(); err != nil {
		return "", err
	}
	r := s.request("put " + key)
	fate, err := s.begin(ctx, r, true)
	if err != nil {
		return "", err
	}
	data = slices.Clone(data)
	// put is the write as the store judges it when it lands. Called with b.mu held.
	put := func() (string, error) {
		o, exists := s.b.objs[key]
		switch {
		case cond.IfAbsent && exists:
			return "", fmt.Errorf("put %s: %w", key, ErrExists)
		case cond.IfMatch != "" && (!exists || o.etag != cond.IfMatch):
			return "", fmt.Errorf("put %s: %w", key, ErrPrecondition)
		}
		return s.b.write(key, data, s.name), nil
	}
	if fate == fateLate {
		return "", s.landLate(ctx, r, func() { put() })
	}
	s.b.mu.Lock()
	etag, err := put()
	s.b.mu.Unlock()
	if err != nil {
		return "", err
	}
	if fate == fateLost {
		return "", errSimLost
	}
	return etag, nil
}

func (s *simStore) GetBytes(ctx context.Context, key string) ([]byte, string, error) {
	if _, err := s.begin(ctx, s.request("get "+key), false); err != nil {
		return nil, "", err
	}
	s.b.mu.Lock()
	defer s.b.mu.Unlock()
	o, ok := s.b.objs[key]
	if !ok {
		return nil, "", fmt.Errorf("get %s: %w", key, ErrNotFound)
	}
	return slices.Clone(o.data), o.etag, nil
}

func (s *simStore) Download(ctx context.Context, key string, w io.WriterAt, size int64) error {
	if _, err := s.begin(ctx, s.request("download "+key), false); err != nil {
		return err
	}
	s.b.mu.Lock()
	o, ok := s.b.objs[key]
	var data []byte
	if ok {
		data = slices.Clone(o.data)
	}
	s.b.mu.Unlock()
	switch {
	case !ok:
		return fmt.Errorf("download %s: %w", key, ErrNotFound)
	case int64(len(data)) != size:
		return fmt.Errorf("download %s: object has %d bytes; want %d", key, len(data), size)
	}
	_, err := w.WriteAt(data, 0)
	return err
}

func (s *simStore) List(ctx context.Context, prefix string) ([]ObjectInfo, error) {
	if _, err := s.begin(ctx, s.request("list "+prefix), false); err != nil {
		return nil, err
	}
	s.b.mu.Lock()
	defer s.b.mu.Unlock()
	var out []ObjectInfo
	for k, o := range s.b.objs {
		if strings.HasPrefix(k, prefix) {
			out = append(out, ObjectInfo{Key: k, Size: int64(len(o.data))})
		}
	}
	slices.SortFunc(out, func(a, b ObjectInfo) int { return strings.Compare(a.Key, b.Key) })
	return out, nil
}

func (s *simStore) ListDir(ctx context.Context, prefix string) ([]string, []ObjectInfo, error) {
	if err := checkDirPrefix(prefix); err != nil {
		return nil, nil, err
	}
	if _, err := s.begin(ctx, s.request("list dir "+prefix), false); err != nil {
		return nil, nil, err
	}
	s.b.mu.Lock()
	defer s.b.mu.Unlock()
	dirs := map[string]bool{}
	var objs []ObjectInfo
	for k, o := range s.b.objs {
		rest, ok := strings.CutPrefix(k, prefix)
		if !ok {
			continue
		}
		if d, _, deeper := strings.Cut(rest, "/"); deeper {
			dirs[d] = true
		} else {
			objs = append(objs, ObjectInfo{Key: k, Size: int64(len(o.data))})
		}
	}
	slices.SortFunc(objs, func(a, b ObjectInfo) int { return strings.Compare(a.Key, b.Key) })
	return slices.Sorted(maps.Keys(dirs)), objs, nil
}

func (s *simStore) Delete(ctx context.Context, keys ...string) error {
	r := s.request("delete " + strings.Join(slices.Sorted(slices.Values(keys)), " ")) // whatever order they come in
	fate, err := s.begin(ctx, r, true)
	if err != nil {
		return err
	}
	keys = slices.Clone(keys)
	del := func() {
		for _, k := range keys {
			s.b.remove(k, s.name)
		}
	}
	if fate == fateLate {
		return s.landLate(ctx, r, del)
	}
	s.b.mu.Lock()
	defer s.b.mu.Unlock()
	del()
	return nil
}

func (s *simStore) AbortIncomplete(ctx context.Context, prefix string) (int, error) {
	if !strings.HasSuffix(prefix, "/") {
		return 0, fmt.Errorf("prefix %q does not end with a slash", prefix)
	}
	if _, err := s.begin(ctx, s.request("abort "+prefix), false); err != nil {
		return 0, err
	}
	s.mu.Lock()
	mine := maps.Clone(s.active)
	s.mu.Unlock()
	s.b.mu.Lock()
	defer s.b.mu.Unlock()
	n := 0
	for id, up := range s.b.uploads {
		if !strings.HasPrefix(up.key, prefix) || mine[id] {
			continue
		}
		if up.owner != s && !up.owner.isDead() {
			up.owner.mu.Lock()
			running := up.owner.active[id]
			up.owner.mu.Unlock()
			if running {
				s.b.violate("I7: %s aborted an upload of %s that live agent %s is running", s.name, up.key, up.owner.name)
			}
		}
		delete(s.b.uploads, id)
		n++
	}
	return n, nil
}

var _ GrowingStore = (*simStore)(nil)

// StartGrowing is S3Store.StartGrowing in the simulation: whole parts of partSize are sent as the
// file grows past them (their bytes kept as the store took them), and Finish compares each with
// the file's bytes then, sends again those that differ and the rest, and completes the upload
// with the parts as the store holds them: a wrong comparison stores other bytes than the file's.
func (s *simStore) StartGrowing(ctx context.Context, key string, f *os.File) Growing {
	ctx, cancel := context.WithCancel(ctx)
	g := &simGrowing{s: s, key: key, f: f, ctx: ctx, cancel: cancel, parts: map[int64][]byte{}}
	context.AfterFunc(ctx, g.Abort)
	return g
}

// simGrowing is a transfer begun by simStore.StartGrowing.
type simGrowing struct {
	s      *simStore
	key    string
	f      *os.File
	ctx    context.Context
	cancel context.CancelFunc
	sends  sync.WaitGroup
	ended  sync.Once

	mu      sync.Mutex
	up      *simUpload       // created with the first part
	parts   map[int64][]byte // by offset: the bytes the store took
	next    int64            // offset of the next part to begin
	stopped bool             // a part failed, or it ended
	kept    int64            // bytes of parts kept by Finish
}

func (g *simGrowing) Grew(size int64) {
	g.mu.Lock()
	defer g.mu.Unlock()
	var offs []int64
	for ; !g.stopped && g.next+g.s.b.partSize <= size; g.next += g.s.b.partSize {
		offs = append(offs, g.next)
	}
	if len(offs) == 0 {
		return
	}
	if g.up == nil {
		g.up = g.s.newUpload(g.key)
	}
	up := g.up
	g.sends.Go(func() {
		for _, off := range offs {
			buf := make([]byte, g.s.b.partSize)
			if err := g.s.sendPart(g.ctx, up, g.f, buf, off); err != nil {
				g.mu.Lock()
				g.stopped = true // sendPart ended the upload
				g.mu.Unlock()
				return
			}
			g.mu.Lock()
			g.parts[off] = buf
			g.mu.Unlock()
		}
	})
}

// stop ends the sending and waits for what is in flight; it returns the upload, nil if none
// was created or it failed.
func (g *simGrowing) stop() *simUpload {
	g.mu.Lock()
	g.stopped = true
	g.mu.Unlock()
	g.sends.Wait()
	g.s.mu.Lock()
	running := g.up != nil && g.s.active[g.up.id]
	g.s.mu.Unlock()
	if !running {
		return nil
	}
	return g.up
}

func (g *simGrowing) Kept() int64 {
	g.mu.Lock()
	defer g.mu.Unlock()
	return g.kept
}

func (g *simGrowing) Abort() {
	g.ended.Do(func() {
		g.cancel()
		g.f.Close()
		if up := g.stop(); up != nil {
			g.s.endUpload(up, !g.s.isDead())
		}
	})
}

func (g *simGrowing) Finish(ctx context.Context, f *os.File, size int64, progress func(n int64)) (Checksum, error) {
	sum, err := Checksum{}, errors.New("growing upload ended already")
	g.ended.Do(func() {
		defer g.cancel()
		defer g.f.Close()
		sum, err = g.finish(ctx, f, size, progress)
	})
	return sum, err
}

func (g *simGrowing) finish(ctx context.Context, f *os.File, size int64, progress func(n int64)) (Checksum, error) {
	up := g.stop()
	if up == nil || g.next > size {
		if up != nil {
			g.s.endUpload(up, !g.s.isDead())
		}
		return g.s.PutFile(ctx, g.key, f, size, progress)
	}
	if _, err := g.s.begin(ctx, g.s.request("finish "+g.key), false); err != nil { // reading the file again is local; this stands for the rest
		g.s.endUpload(up, !errors.Is(err, errSimDead) && !errors.Is(err, errSimTimeout))
		return Checksum{}, err
	}
	data := make([]byte, size)
	if _, err := f.ReadAt(data, 0); err != nil && (!errors.Is(err, io.EOF) || size != 0) {
		g.s.endUpload(up, true)
		return Checksum{}, err
	}
	obj := slices.Clone(data)
	kept := int64(0)
	for off, b := range g.parts {
		if bytes.Equal(b, data[off:off+int64(len(b))]) {
			copy(obj[off:], b) // kept as the store took it
			kept += int64(len(b))
		}
	}
	if err := g.s.completeUpload(ctx, up, obj); err != nil {
		return Checksum{}, err
	}
	g.mu.Lock()
	g.kept = kept
	g.mu.Unlock()
	if progress != nil {
		progress(size)
	}
	return ChecksumOf(bytes.NewReader(obj))
}
