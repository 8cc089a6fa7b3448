package checkpoint

import (
	"context"
	"errors"
	"fmt"
	"os"
	"runtime"
	"sync"

	"github.com/aws/aws-sdk-go-v2/aws"
	"github.com/aws/aws-sdk-go-v2/service/s3/types"
	"golang.org/x/sync/errgroup"
)

// s3GrowTiers are the parts a file is sent in while it grows: S3's least part size first, so
// that the parts still in flight when the file is closed, and its end, are short to send (on a
// connection of about 11 MB/s, 5 MiB is half a second); larger ones further on, so that a large
// file has most of its bytes sent before its close: 2000 parts of 5 MiB (about 10 GB), then 2000
// of 20 MiB and 4000 of 100 MiB (about 450 GB in all). The rest of s3MaxParts (2000) is for what
// is left when it is closed.
var s3GrowTiers = []struct {
	count int32
	size  int64
}{{2000, s3MinPart}, {2000, 20 << 20}, {4000, 100 << 20}}

// s3GrowParts is the most parts a file is sent in while it grows (s3GrowTiers).
const s3GrowParts = 8000

// s3GrowPart is part num (from 1) of a file sent while it grows; n is 0 beyond s3GrowParts.
func s3GrowPart(num int32) s3Part {
	off, k := int64(0), num-1
	for _, t := range s3GrowTiers {
		if k < t.count {
			return s3Part{num: num, off: off + int64(k)*t.size, n: t.size}
		}
		off += int64(t.count) * t.size
		k -= t.count
	}
	return s3Part{num: num, off: off}
}

var _ GrowingStore = (*S3Store)(nil)

// StartGrowing begins a multipart upload of key that sends each whole part of f (see
// s3GrowTiers) as soon as the file has grown past it (Grew), on the store's limiter like any
// part, in ctx's rank. Nothing is created until the first part is whole. It never returns nil.
//
// Finish sends the rest of the file (past the last part made whole) as PutFile sends a file
// (cut finer if ctx is urgent) while, once the parts queued or in flight are in, it reads every
// part sent again, in parallel, and compares its CRC-32C with the one the server verified when
// it was sent: a part whose bytes changed since, or that failed, is sent again under its number.
// The upload is then completed with the full-object CRC-32C combined from the parts'. A file now
// shorter than a part made whole has the upload aborted and goes whole with PutFile. So the object is f's bytes
// as Finish read them, as with PutFile, unless a rewritten part has the CRC-32C of its old bytes
// (a chance of one in 2^32 for each part the writer changed after it was sent).
//
// A transfer whose ctx ends before Finish is aborted, as by Abort: an upload in the store's
// running set that nobody aborts would be kept from AbortIncomplete for good.
func (s *S3Store) StartGrowing(ctx context.Context, key string, f *os.File) Growing {
	ctx, cancel := context.WithCancel(ctx)
	g := &s3Growing{s: s, key: key, f: f, ctx: ctx, cancel: cancel, pace: newPartPace(), sent: map[int32]s3SentPart{}}
	context.AfterFunc(ctx, g.Abort) // after Finish or Abort, it does nothing
	return g
}

// s3Growing is a multipart upload begun by StartGrowing.
type s3Growing struct {
	s      *S3Store
	key    string
	f      *os.File        // its own handle of the file, read while it grows; closed when it ends
	ctx    context.Context // the parts' context; cancelled by Abort
	cancel context.CancelFunc
	pace   *partPace      // the file's parts' pace
	sends  sync.WaitGroup // the sending loop and the parts in flight
	ended  sync.Once      // Finish or Abort

	// created creates the upload, once (create); then okey, uploadID and fullObject are set,
	// or createErr.
	created    sync.Once
	okey       string
	uploadID   *string
	fullObject bool
	createErr  error

	mu      sync.Mutex
	stopped bool         // no more parts are queued: it ends, or a part failed
	halted  bool         // no more queued parts are begun either: aborted, or a part failed
	next    int32        // the number of the next part to queue
	queue   []queuedPart // whole parts not begun yet, in order
	sending bool         // the sending loop runs
	sent    map[int32]s3SentPart
	kept    int64 // bytes of the parts sent while it grew and kept (set by complete)
}

// queuedPart is a part made whole, waiting to be sent, and its place among the store's transfers
// (S3Store.nextOrder): that of the Grew that made it whole, so that the parts of files growing
// at once take free slots in the order they became whole, as transfers begun then would.
type queuedPart struct {
	s3Part
	order uint64
}

// s3SentPart is a part the server took: its CRC-32C as sent, and what completes it.
type s3SentPart struct {
	crc  uint32
	done types.CompletedPart
}

// Grew queues the parts that now lie wholly below size, and starts the sending loop if it is
// not running.
func (g *s3Growing) Grew(size int64) {
	g.mu.Lock()
	defer g.mu.Unlock()
	if g.stopped {
		return
	}
	first := max(g.next, 1)
	num := first
	order := uint64(0)
	for ; num <= s3GrowParts; num++ {
		p := s3GrowPart(num)
		if p.off+p.n > size {
			break
		}
		if order == 0 {
			order = g.s.nextOrder()
		}
		g.queue = append(g.queue, queuedPart{p, order})
	}
	if num == first {
		return
	}
	g.next = num
	if !g.sending {
		g.sending = true
		g.sends.Add(1)
		go g.send()
	}
}

// create creates the upload the first time it is called; every call returns the result.
func (g *s3Growing) create() (*string, error) {
	g.created.Do(func() {
		g.okey, g.createErr = g.s.objectKey(g.key)
		if g.createErr == nil {
			g.uploadID, g.fullObject, g.createErr = g.s.createUpload(g.ctx, g.okey)
		}
	})
	return g.uploadID, g.createErr
}

// send creates the upload and sends the queued parts, each as soon as the store's limiter
// gives it a slot, until the queue is empty. So a file waiting on a busy store holds one
// goroutine, not one for each part it has made whole. A failed part stops the sending: what is
// left goes at Finish.
func (g *s3Growing) send() {
	defer g.sends.Done()
	id, err := g.create()
	for err == nil {
		p, ok := g.take()
		if !ok {
			return
		}
		if err = g.s.acquire(g.ctx, p.order); err == nil {
			g.sends.Add(1)
			go g.sendPart(id, p.s3Part)
		}
	}
	g.mu.Lock()
	defer g.mu.Unlock()
	g.stopped, g.halted, g.sending, g.queue = true, true, false, nil
}

// take takes the next queued part. With none, or the sending halted, it ends the loop: false.
func (g *s3Growing) take() (queuedPart, bool) {
	g.mu.Lock()
	defer g.mu.Unlock()
	if g.halted || len(g.queue) == 0 {
		g.sending, g.queue = false, nil
		return queuedPart{}, false
	}
	p := g.queue[0]
	g.queue = g.queue[1:]
	return p, true
}

// sendPart sends part p, for which a slot was acquired, and records it if the server took it.
func (g *s3Growing) sendPart(id *string, p s3Part) {
	defer g.sends.Done()
	crc, done, err := g.s.uploadPart(g.ctx, g.okey, id, g.f, p, g.pace, nil)
	g.mu.Lock()
	defer g.mu.Unlock()
	if err != nil {
		g.stopped, g.halted = true, true
		return
	}
	g.sent[p.num] = s3SentPart{crc: crc, done: done}
}

// stop ends the queueing of parts and returns the number of the next part it would have queued
// (0: none was). With halt, the parts queued are not begun either; without, the sending loop
// goes on with them (Finish: they are whole parts of the file, and sending them now costs less
// than after the parts in flight are in).
func (g *s3Growing) stop(halt bool) int32 {
	g.mu.Lock()
	defer g.mu.Unlock()
	g.stopped, g.halted = true, g.halted || halt
	return g.next
}

// Abort stops the sending and aborts the upload, on a clean-up context.
func (g *s3Growing) Abort() {
	g.ended.Do(func() {
		g.cancel()
		next := g.stop(true)
		g.sends.Wait()
		g.f.Close()
		if next > 0 {
			g.drop(g.ctx)
		}
	})
}

// drop aborts the upload if it was created (failing, the late clean-up's passes abort it) and
// takes it off the store's running set. A part must have been begun (its send created the
// upload or failed to), and the sending must have stopped.
func (g *s3Growing) drop(ctx context.Context) {
	if id, err := g.create(); err == nil {
		_ = g.s.abortUpload(ctx, g.okey, id)
		g.s.setRunning(aws.ToString(id), false)
	}
}

// Finish sends what is left of f and completes the upload (see StartGrowing).
func (g *s3Growing) Finish(ctx context.Context, f *os.File, size int64, progress func(n int64)) (Checksum, error) {
	var sum Checksum
	err := errors.New("growing upload ended already")
	g.ended.Do(func() { sum, err = g.finish(ctx, f, size, progress) })
	return sum, err
}

func (g *s3Growing) finish(ctx context.Context, f *os.File, size int64, progress func(n int64)) (Checksum, error) {
	defer g.cancel()
	defer g.f.Close()
	next := g.stop(false)
	var id *string
	err := errors.New("no part begun")
	if next > 0 {
		id, err = g.create()
	}
	if last := s3GrowPart(next - 1); err != nil || last.off+last.n > size {
		// Nothing to build on, or the file is shorter now than a part begun.
		g.stop(true)
		g.cancel()
		g.sends.Wait()
		if next > 0 {
			g.drop(ctx)
		}
		return g.s.PutFile(ctx, g.key, f, size, progress)
	}
	defer g.s.setRunning(aws.ToString(id), false)
	sum, err := g.complete(ctx, f, size, next-1, progress)
	if err != nil {
		if aerr := g.s.abortUpload(ctx, g.okey, id); aerr != nil {
			err = errors.Join(err, aerr)
		}
		return Checksum{}, fmt.Errorf("put %s: %w", g.s.URL()+"/"+g.key, err)
	}
	return sum, nil
}

// complete sends the parts after the grown ones begun while the file grew, checks those (once
// their sends are done) and sends again any that failed or whose bytes changed, all at once, and
// completes the upload.
func (g *s3Growing) complete(ctx context.Context, f *os.File, size int64, grown int32, progress func(n int64)) (Checksum, error) {
	parts := make([]s3Part, 0, grown)
	for num := int32(1); num <= grown; num++ {
		parts = append(parts, s3GrowPart(num))
	}
	last := parts[grown-1]
	rest := s3PartPlanFrom(last.off+last.n, size, g.s.partSize(size-last.off-last.n, urgentOf(ctx)), grown+1)
	parts = append(parts, rest...)
	completed := make([]types.CompletedPart, len(parts))
	crcs := make([]uint32, len(parts))
	eg, ectx := errgroup.WithContext(ctx)
	if len(rest) > 0 {
		eg.Go(func() error {
			return g.s.uploadParts(ectx, g.okey, g.uploadID, f, rest, completed[grown:], crcs[grown:], progress)
		})
	}
	eg.Go(func() error {
		// Should the rest fail (or ctx end), the parts still queued are not needed.
		stop := context.AfterFunc(ectx, g.cancel)
		g.sends.Wait()
		stop()
		if err := g.check(ectx, f, parts[:grown], completed, crcs); err != nil {
			return err
		}
		var todo []s3Part
		var at []int
		kept := int64(0)
		for i, p := range parts[:grown] {
			if completed[i].ETag == nil {
				todo = append(todo, p)
				at = append(at, i)
			} else {
				kept += p.n
			}
		}
		g.mu.Lock()
		g.kept = kept
		g.mu.Unlock()
		if len(todo) == 0 {
			return nil
		}
		tc := make([]types.CompletedPart, len(todo))
		tcrcs := make([]uint32, len(todo))
		if err := g.s.uploadParts(ectx, g.okey, g.uploadID, f, todo, tc, tcrcs, progress); err != nil {
			return err
		}
		for j, i := range at {
			completed[i], crcs[i] = tc[j], tcrcs[j]
		}
		return nil
	})
	if err := eg.Wait(); err != nil {
		return Checksum{}, err
	}
	full := s3FullCRC(parts, crcs)
	if err := g.s.complete(ctx, g.okey, g.uploadID, size, completed, crcs, full, g.fullObject); err != nil {
		return Checksum{}, err
	}
	return CRC32CChecksum(full), nil
}

// Kept is the bytes of the parts sent while the file grew and kept by Finish.
func (g *s3Growing) Kept() int64 {
	g.mu.Lock()
	defer g.mu.Unlock()
	return g.kept
}

// check reads every part of parts the server took while the file grew again from f, in
// parallel, and fills completed and crcs (by index in parts) for those whose bytes are as sent.
func (g *s3Growing) check(ctx context.Context, f *os.File, parts []s3Part, completed []types.CompletedPart, crcs []uint32) error {
	eg, ectx := errgroup.WithContext(ctx)
	eg.SetLimit(runtime.GOMAXPROCS(0))
	for i, p := range parts {
		sp, ok := g.sent[p.num] // no send is running: no lock needed
		if !ok {
			continue
		}
		eg.Go(func() error {
			crc, err := s3SectionCRC(ectx, f, p.off, p.n)
			if err != nil {
				return fmt.Errorf("part %d: %w", p.num, err)
			}
			if crc == sp.crc {
				completed[i], crcs[i] = sp.done, crc
			}
			return nil
		})
	}
	return eg.Wait()
}
