package checkpoint

import (
	"bytes"
	"fmt"
	"math/rand/v2"
	"os"
	"path"
	"path/filepath"
	"runtime/pprof"
	"slices"
	"strings"
	"testing"
	"time"
)

// growingTestFile is a file being written, and a second handle of it for reading.
type growingTestFile struct {
	w, r *os.File
	data []byte // what w holds so far
}

func newGrowingTestFile(t *testing.T) *growingTestFile {
	t.Helper()
	name := filepath.Join(t.TempDir(), "shard")
	w, err := os.Create(name)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { w.Close() })
	r, err := os.Open(name)
	if err != nil {
		t.Fatal(err)
	}
	return &growingTestFile{w: w, r: r}
}

// write writes data at off (growing the file, or rewriting part of it).
func (f *growingTestFile) write(t *testing.T, off int64, data []byte) {
	t.Helper()
	if _, err := f.w.WriteAt(data, off); err != nil {
		t.Fatal(err)
	}
	if end := off + int64(len(data)); end > int64(len(f.data)) {
		f.data = append(f.data, make([]byte, end-int64(len(f.data)))...)
	}
	copy(f.data[off:], data)
}

// reopen opens the file anew, as the uploader does at its FileReady.
func (f *growingTestFile) reopen(t *testing.T) *os.File {
	t.Helper()
	r, err := os.Open(f.w.Name())
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { r.Close() })
	return r
}

// partsSeen is how many part uploads reached the proxy.
func partsSeen(p *s3FaultProxy) int {
	n := 0
	for _, w := range p.writesSeen() {
		if w.kind == "part" {
			n++
		}
	}
	return n
}

// sentParts is how many parts the transfer has had taken by the server.
func sentParts(g Growing) int {
	sg := g.(*s3Growing)
	sg.mu.Lock()
	defer sg.mu.Unlock()
	return len(sg.sent)
}

// TestS3GrowingRewrittenPartIsSentAgain: a file is sent while it grows; the writer then rewrites
// a part that was sent, grows it further and closes it. The object holds the file's final bytes
// (the rewritten part was sent again, the untouched ones were not), with the checksum PutFile
// would give, and no upload is left behind.
func TestS3GrowingRewrittenPartIsSentAgain(t *testing.T) {
	peer := s3StartPeer(t)
	proxy := s3StartProxy(t, peer.endpoint)
	s := peer.openS3(t, proxy.URL(), "grow", S3Options{PartSize: 5 << 20, Concurrency: 4})
	f := newGrowingTestFile(t)
	g := s.StartGrowing(t.Context(), "step-1/shard", f.r)
	f.write(t, 0, storeTestData(1, 16<<20))
	g.Grew(16 << 20)
	eventuallyUploader(t, "3 whole parts sent", func() bool { return sentParts(g) == 3 })
	if got := partsSeen(proxy); got != 3 {
		t.Fatalf("parts sent while growing = %d; want 3", got)
	}
	f.write(t, 6<<20, []byte("rewritten after it was sent")) // inside part 2
	f.write(t, 16<<20, storeTestData(2, 3<<20+17))
	finishGrowing(t, peer, s, g, f)
	// Part 2 again, and the rest (3 MiB, one part): 5 parts in all.
	if got := partsSeen(proxy); got != 5 {
		t.Errorf("parts sent in all = %d; want 5 (3 while growing, the rewritten one, the end)", got)
	}
	if got := g.Kept(); got != 10<<20 {
		t.Errorf("Kept = %d; want %d (parts 1 and 3)", got, 10<<20)
	}
}

// finishGrowing finishes g, the transfer of f to "step-1/shard" in s, and checks that it
// returns the file's checksum, that the object holds the file's bytes as they are now, and that
// no upload is left.
func finishGrowing(t *testing.T, peer *s3Peer, s *S3Store, g Growing, f *growingTestFile) {
	t.Helper()
	size := int64(len(f.data))
	sum, err := g.Finish(t.Context(), f.reopen(t), size, nil)
	if err != nil {
		t.Fatalf("Finish = %v; want no error", err)
	}
	if want := storeTestWant(t, f.data); sum != want {
		t.Errorf("Finish = %v; want %v", sum, want)
	}
	if got := storeTestDownload(t, s, "step-1/shard", size); !bytes.Equal(got, f.data) {
		t.Errorf("object differs from the file as it was closed")
	}
	if left := peer.incompleteUploads(t, ""); len(left) != 0 {
		t.Errorf("incomplete uploads = %q; want none", left)
	}
}

// startGrowing starts a growing transfer of a file to "step-1/shard" in a store under prefix
// (5 MiB parts), writes mib MiB to the file and waits until the transfer has sent its 2 whole
// parts (mib is 10 to 14).
func startGrowing(t *testing.T, prefix string, mib int64) (*s3Peer, *S3Store, Growing, *growingTestFile) {
	t.Helper()
	peer := s3StartPeer(t)
	s := peer.openS3(t, peer.endpoint, prefix, S3Options{PartSize: 5 << 20, Concurrency: 4})
	f := newGrowingTestFile(t)
	g := s.StartGrowing(t.Context(), "step-1/shard", f.r)
	f.write(t, 0, storeTestData(uint64(mib), int(mib<<20)))
	g.Grew(mib << 20)
	eventuallyUploader(t, "2 whole parts sent", func() bool { return sentParts(g) == 2 })
	return peer, s, g, f
}

// TestS3GrowingFileShrunk: a file truncated below a part that was sent goes whole with PutFile,
// and the growing upload is aborted.
func TestS3GrowingFileShrunk(t *testing.T) {
	peer, s, g, f := startGrowing(t, "shrunk", 11)
	if err := f.w.Truncate(7 << 20); err != nil {
		t.Fatal(err)
	}
	f.data = f.data[:7<<20]
	finishGrowing(t, peer, s, g, f)
	if got := g.Kept(); got != 0 {
		t.Errorf("Kept = %d; want 0 (the file went whole)", got)
	}
}

// TestS3GrowingAbort: an aborted transfer leaves no object and no upload, and ignores what comes
// after.
func TestS3GrowingAbort(t *testing.T) {
	peer, s, g, f := startGrowing(t, "abort", 10)
	g.Abort()
	g.Grew(20 << 20)
	if _, err := g.Finish(t.Context(), f.reopen(t), 10<<20, nil); err == nil {
		t.Errorf("Finish after Abort = nil; want an error")
	}
	if left := peer.incompleteUploads(t, ""); len(left) != 0 {
		t.Errorf("incomplete uploads = %q; want none", left)
	}
	objs, err := s.List(t.Context(), "")
	if err != nil {
		t.Fatal(err)
	}
	if len(objs) != 0 {
		t.Errorf("objects = %v; want none", objs)
	}
	if len(s.running) != 0 {
		t.Errorf("store still counts %d uploads as running; want none", len(s.running))
	}
}

// TestS3GrowingWaitsWithOneGoroutine: a file made whole a part at a time while the store has no
// slot free waits for it with one goroutine, not one for each part; once a slot is free, every
// part goes, and the object is the file.
func TestS3GrowingWaitsWithOneGoroutine(t *testing.T) {
	peer := s3StartPeer(t)
	s := peer.openS3(t, peer.endpoint, "wait", S3Options{PartSize: 5 << 20, Concurrency: 1})
	if err := s.acquire(t.Context(), 0); err != nil { // the one slot, as a busy store's
		t.Fatal(err)
	}
	f := newGrowingTestFile(t)
	g := s.StartGrowing(t.Context(), "step-1/shard", f.r)
	const parts = 12
	f.write(t, 0, storeTestData(3, parts*s3MinPart+123))
	for num := int64(1); num <= parts; num++ {
		g.Grew(num * s3MinPart)
	}
	if loops, sends := growingGoroutines(); loops != 1 || sends != 0 {
		t.Errorf("goroutines sending the file = %d, and %d parts in flight; want 1 and none while no slot is free", loops, sends)
	}
	s.release(0, time.Now(), true)
	eventuallyUploader(t, "every whole part sent", func() bool { return sentParts(g) == parts })
	eventuallyUploader(t, "the sending to end", func() bool { loops, sends := growingGoroutines(); return loops+sends == 0 })
	finishGrowing(t, peer, s, g, f)
	if got := g.Kept(); got != parts*s3MinPart {
		t.Errorf("Kept = %d; want %d (every part sent while it grew)", got, parts*s3MinPart)
	}
}

// TestS3GrowingFilesShareSlotsInOrder: parts of two files growing at once take the store's free
// slots in the order they were made whole, not one file first: a file that began growing first
// must not hold the others' parts back until it is done (their ends would all wait at the close).
func TestS3GrowingFilesShareSlotsInOrder(t *testing.T) {
	peer := s3StartPeer(t)
	proxy := s3StartProxy(t, peer.endpoint)
	s := peer.openS3(t, proxy.URL(), "order", S3Options{PartSize: 5 << 20, Concurrency: 1})
	if err := s.acquire(t.Context(), 0); err != nil { // the one slot, until both files wait
		t.Fatal(err)
	}
	a, b := newGrowingTestFile(t), newGrowingTestFile(t)
	ga := s.StartGrowing(t.Context(), "step-1/a", a.r)
	gb := s.StartGrowing(t.Context(), "step-1/b", b.r)
	a.write(t, 0, storeTestData(1, 2*s3MinPart))
	b.write(t, 0, storeTestData(2, 2*s3MinPart))
	ga.Grew(s3MinPart)
	gb.Grew(s3MinPart)
	ga.Grew(2 * s3MinPart)
	gb.Grew(2 * s3MinPart)
	// Both loops wait on the limiter: their uploads created is not enough (under load, a loop
	// that had not asked for its slot yet lost its turn to the other).
	eventuallyUploader(t, "both files' loops waiting for a slot", func() bool { return s.lim.waiting() == 2 })
	s.release(0, time.Now(), true)
	eventuallyUploader(t, "every part sent", func() bool { return sentParts(ga)+sentParts(gb) == 4 })
	var order []string
	for _, w := range proxy.writesSeen() {
		if w.kind == "part" {
			order = append(order, path.Base(w.key))
		}
	}
	if want := []string{"a", "b", "a", "b"}; !slices.Equal(order, want) {
		t.Errorf("parts sent in the order %v; want %v (as they were made whole)", order, want)
	}
	for _, g := range []Growing{ga, gb} {
		g.Abort()
	}
}

// growingGoroutines counts the goroutines s3Growing started: its sending loops (started by
// Grew), and those sending a part (started by the loop). By their "created by" lines, which a
// stack trace always has: the outer frames of a deep one (a request in the SDK) are elided.
func growingGoroutines() (loops, sends int) {
	var buf bytes.Buffer
	_ = pprof.Lookup("goroutine").WriteTo(&buf, 2)
	return strings.Count(buf.String(), ".(*s3Growing).Grew in goroutine"), strings.Count(buf.String(), ".(*s3Growing).send in goroutine")
}

// TestS3GrowingRandomWrites: a writer grows a file in random steps, rewrites random ranges of
// it (some sent already) and now and then cuts it shorter, while the transfer hears of the growth
// at random moments, its parts land or not, and the server refuses or cuts some part uploads. Whatever the order, Finish
// stores exactly the file as it is at the close, with PutFile's checksum, keeps no more than whole
// parts of it, and leaves no upload. Seeded: -sim.seed=S replays one, -sim.seeds=N adds random
// ones.
func TestS3GrowingRandomWrites(t *testing.T) {
	peer := s3StartPeer(t)
	proxy := s3StartProxy(t, peer.endpoint)
	seeds := []uint64{1, 2, 3, 4}
	if *simSeed != 0 {
		seeds = []uint64{*simSeed}
	}
	for range *simSeeds {
		seeds = append(seeds, rand.Uint64())
	}
	for _, seed := range seeds {
		t.Run(fmt.Sprint("seed=", seed), func(t *testing.T) {
			rng := rand.New(rand.NewPCG(seed, 0))
			s := peer.openS3(t, proxy.URL(), fmt.Sprint("random-", seed), S3Options{PartSize: 5 << 20, Concurrency: 4})
			f := newGrowingTestFile(t)
			g := s.StartGrowing(t.Context(), "step-1/shard", f.r)
			for range 8 + rng.IntN(16) {
				size := int64(len(f.data))
				switch x := rng.IntN(20); {
				case x < 2 && size > 0:
					n := rng.Int64N(size)
					if err := f.w.Truncate(n); err != nil {
						t.Fatal(err)
					}
					f.data = f.data[:n]
				case x < 6 && size > 0:
					off := rng.Int64N(size)
					f.write(t, off, storeTestData(rng.Uint64(), int(min(1+rng.Int64N(64<<10), size-off))))
				case x < 8:
					// Let the parts in flight land.
					eventuallyUploader(t, "the parts in flight sent", func() bool { loops, sends := growingGoroutines(); return loops+sends == 0 })
				case x < 9:
					proxy.set(func(p *s3FaultProxy) {
						if rng.IntN(2) == 0 {
							p.slowDownParts++
						} else {
							p.resetParts++
						}
					})
				default:
					f.write(t, size, storeTestData(rng.Uint64(), 1+rng.IntN(3<<20)))
				}
				if rng.IntN(3) > 0 {
					g.Grew(int64(len(f.data)))
				}
			}
			sent := sentParts(g)
			finishGrowing(t, peer, s, g, f)
			t.Logf("%d bytes; %d parts sent while it grew, %d bytes of them kept", len(f.data), sent, g.Kept())
			if kept := g.Kept(); kept > int64(len(f.data)) || kept%s3MinPart != 0 {
				t.Errorf("Kept = %d of a file of %d; want whole parts of it", kept, len(f.data))
			}
		})
	}
}

// TestS3GrowPart: the parts of a growing file follow each other without a gap, none is smaller
// than S3 allows, and there are s3GrowParts of them, leaving parts for the end.
func TestS3GrowPart(t *testing.T) {
	var end int64
	for num := int32(1); num <= s3GrowParts; num++ {
		p := s3GrowPart(num)
		if p.num != num || p.off != end || p.n < s3MinPart {
			t.Fatalf("s3GrowPart(%d) = %+v; want part %d at %d of %d bytes at least", num, p, num, end, s3MinPart)
		}
		end += p.n
	}
	if p := s3GrowPart(s3GrowParts + 1); p.n != 0 {
		t.Errorf("s3GrowPart(%d) = %+v; want none (n 0)", s3GrowParts+1, p)
	}
	if want := int64(2000*5+2000*20+4000*100) << 20; end != want {
		t.Errorf("bytes in growing parts = %d; want %d", end, want)
	}
	if left := s3MaxParts - s3GrowParts; left < 1000 {
		t.Errorf("parts left for a file's end = %d; want 1000 at least", left)
	}
}
