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

// s3GrowParts is the most parts a file is sent in while it grows: the rest of s3MaxParts is for
// what is left when it is closed. With parts of s3SmallPart, the first 40 GiB of a file can go
// while it is written.
const s3GrowParts = s3MaxParts / 2

var _ GrowingStore = (*S3Store)(nil)

// StartGrowing begins a multipart upload of key that sends each whole part of f (of
// min(s3SmallPart, PartSize) bytes) as soon as the file has grown past it (Grew), on the
// store's limiter like any part, in ctx's rank. Nothing is created until the first part is
// whole. It never returns nil.
//
// Finish reads every part sent again, in parallel, and compares its CRC-32C with the one the
// server verified when it was sent: a part whose bytes changed since is sent again under its
// number. The parts the file has not grown past yet, and the rest of the file when it is larger
// than s3GrowParts parts, are then sent as PutFile sends a file (urgently cut, if ctx says so),
// and the upload is completed with the full-object CRC-32C combined from the parts'. A file now
// shorter than a part sent has it aborted and goes whole with PutFile. So the object is f's bytes
// as Finish read them, as with PutFile, unless a rewritten part has the CRC-32C of its old bytes
// (a chance of one in 2^32 for each part the writer changed after it was sent).
func (s *S3Store) StartGrowing(ctx context.Context, key string, f *os.File) Growing {
	ctx, cancel := context.WithCancel(ctx)
	return &s3Growing{s: s, key: key, f: f, part: min(int64(s3SmallPart), s.opts.PartSize), ctx: ctx, cancel: cancel, sent: map[int32]s3SentPart{}}
}

// s3Growing is a multipart upload begun by StartGrowing.
type s3Growing struct {
	s      *S3Store
	key    string
	f      *os.File // its own handle of the file, read while it grows; closed when it ends
	part   int64
	ctx    context.Context // the parts' context; cancelled by Abort
	cancel context.CancelFunc
	sends  sync.WaitGroup // batches of parts in flight
	ended  sync.Once      // Finish or Abort

	mu         sync.Mutex
	stopped    bool  // no more parts are begun: it ended, or a batch failed
	next       int32 // the number of the next part to send
	okey       string
	uploadID   *string // once created
	fullObject bool
	createErr  error
	sent       map[int32]s3SentPart
}

// s3SentPart is a part the server took: its CRC-32C as sent, and what completes it.
type s3SentPart struct {
	crc  uint32
	done types.CompletedPart
}

// Grew begins sending the parts that now lie wholly below size.
func (g *s3Growing) Grew(size int64) {
	g.mu.Lock()
	defer g.mu.Unlock()
	if g.stopped {
		return
	}
	first := g.next
	if first == 0 {
		first = 1
	}
	var batch []s3Part
	for num := first; num <= s3GrowParts && int64(num)*g.part <= size; num++ {
		batch = append(batch, s3Part{num: num, off: int64(num-1) * g.part, n: g.part})
	}
	if len(batch) == 0 {
		return
	}
	g.next = first + int32(len(batch))
	g.sends.Add(1)
	go g.send(batch)
}

// create creates the upload once; it returns what the first call got.
func (g *s3Growing) create() (*string, error) {
	g.mu.Lock()
	defer g.mu.Unlock()
	if g.uploadID != nil || g.createErr != nil {
		return g.uploadID, g.createErr
	}
	okey, err := g.s.objectKey(g.key)
	if err == nil {
		g.okey = okey
		g.uploadID, g.fullObject, err = g.s.createUpload(g.ctx, okey)
	}
	g.createErr = err
	return g.uploadID, err
}

// send sends a batch of parts and records those the server took. A failed batch stops the
// sending: what is left goes at Finish.
func (g *s3Growing) send(batch []s3Part) {
	defer g.sends.Done()
	id, err := g.create()
	if err == nil {
		completed := make([]types.CompletedPart, len(batch))
		crcs := make([]uint32, len(batch))
		err = g.s.uploadParts(g.ctx, g.okey, id, g.f, batch, completed, crcs, nil)
		g.mu.Lock()
		for i, p := range batch {
			if completed[i].ETag != nil {
				g.sent[p.num] = s3SentPart{crc: crcs[i], done: completed[i]}
			}
		}
		g.mu.Unlock()
	}
	if err != nil {
		g.mu.Lock()
		g.stopped = true
		g.mu.Unlock()
	}
}

// stop ends the sending of new parts and waits for those in flight.
func (g *s3Growing) stop() {
	g.mu.Lock()
	g.stopped = true
	g.mu.Unlock()
	g.sends.Wait()
}

// Abort stops the sending and aborts the upload, on a clean-up context.
func (g *s3Growing) Abort() {
	g.ended.Do(func() {
		g.cancel()
		g.stop()
		g.f.Close()
		if g.uploadID != nil {
			_ = g.s.abortUpload(g.ctx, g.okey, g.uploadID) // failing, the late clean-up's passes abort it
			g.s.setRunning(aws.ToString(g.uploadID), false)
		}
	})
}

// Finish sends what is left of f and completes the upload (see StartGrowing).
func (g *s3Growing) Finish(ctx context.Context, f *os.File, size int64, progress func(n int64)) (Checksum, error) {
	var sum Checksum
	err := errors.New("growing upload ended already")
	g.ended.Do(func() { sum, err = g.finish(ctx, f, size, progress) })
	return sum, err
}

func (g *s3Growing) finish(ctx context.Context, f *os.File, size int64, progress func(n int64)) (Checksum, error) {
	g.stop()
	g.f.Close()
	defer g.cancel()
	if g.uploadID == nil || len(g.sent) == 0 || g.next == 0 || int64(g.next-1)*g.part > size {
		// Nothing to build on, or the file is shorter now than a part it sent.
		if g.uploadID != nil {
			_ = g.s.abortUpload(ctx, g.okey, g.uploadID) // failing, the late clean-up's passes abort it
			g.s.setRunning(aws.ToString(g.uploadID), false)
		}
		return g.s.PutFile(ctx, g.key, f, size, progress)
	}
	defer g.s.setRunning(aws.ToString(g.uploadID), false)
	sum, err := g.complete(ctx, f, size, progress)
	if err != nil {
		if aerr := g.s.abortUpload(ctx, g.okey, g.uploadID); aerr != nil {
			err = errors.Join(err, aerr)
		}
		return Checksum{}, fmt.Errorf("put %s: %w", g.s.URL()+"/"+g.key, err)
	}
	return sum, nil
}

// complete checks the parts sent, sends the rest and completes the upload.
func (g *s3Growing) complete(ctx context.Context, f *os.File, size int64, progress func(n int64)) (Checksum, error) {
	grown := g.next - 1 // parts 1..grown were begun; each lies wholly below size
	parts := make([]s3Part, 0, grown)
	for num := int32(1); num <= grown; num++ {
		parts = append(parts, s3Part{num: num, off: int64(num-1) * g.part, n: g.part})
	}
	end := int64(grown) * g.part
	parts = append(parts, s3PartPlanFrom(end, size, g.s.partSize(size-end, urgentOf(ctx)), grown+1)...)
	completed := make([]types.CompletedPart, len(parts))
	crcs := make([]uint32, len(parts))
	// Every part sent is read again; the ones whose bytes changed join the ones never sent.
	eg, ectx := errgroup.WithContext(ctx)
	eg.SetLimit(runtime.GOMAXPROCS(0))
	for i := range grown {
		sp, ok := g.sent[i+1]
		if !ok {
			continue
		}
		eg.Go(func() error {
			crc, err := s3SectionCRC(ectx, f, parts[i].off, parts[i].n)
			if err != nil {
				return fmt.Errorf("part %d: %w", i+1, err)
			}
			if crc == sp.crc {
				completed[i], crcs[i] = sp.done, crc
			}
			return nil
		})
	}
	if err := eg.Wait(); err != nil {
		return Checksum{}, err
	}
	var todo []s3Part
	var at []int
	for i, p := range parts {
		if completed[i].ETag == nil {
			todo = append(todo, p)
			at = append(at, i)
		}
	}
	if len(todo) > 0 {
		tc := make([]types.CompletedPart, len(todo))
		tcrcs := make([]uint32, len(todo))
		if err := g.s.uploadParts(ctx, g.okey, g.uploadID, f, todo, tc, tcrcs, progress); err != nil {
			return Checksum{}, err
		}
		for j, i := range at {
			completed[i], crcs[i] = tc[j], tcrcs[j]
		}
	}
	full := s3FullCRC(parts, crcs)
	if err := g.s.complete(ctx, g.okey, g.uploadID, size, completed, crcs, full, g.fullObject); err != nil {
		return Checksum{}, err
	}
	return CRC32CChecksum(full), nil
}
