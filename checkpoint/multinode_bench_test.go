package checkpoint

import (
	"context"
	"fmt"
	"sync/atomic"
	"testing"
	"time"
)

// countingStore counts the requests a Store is asked for, by kind (S3 charges per request:
// LIST and PUT at one price, GET at a tenth of it).
type countingStore struct {
	Store
	lists, gets, puts atomic.Int64
}

func (c *countingStore) PutBytes(ctx context.Context, key string, data []byte, cond Cond) (string, error) {
	c.puts.Add(1)
	return c.Store.PutBytes(ctx, key, data, cond)
}

func (c *countingStore) GetBytes(ctx context.Context, key string) ([]byte, string, error) {
	c.gets.Add(1)
	return c.Store.GetBytes(ctx, key)
}

func (c *countingStore) List(ctx context.Context, prefix string) ([]ObjectInfo, error) {
	c.lists.Add(1)
	return c.Store.List(ctx, prefix)
}

func (c *countingStore) ListDir(ctx context.Context, prefix string) ([]string, []ObjectInfo, error) {
	c.lists.Add(1)
	return c.Store.ListDir(ctx, prefix)
}

// BenchmarkJobCommit measures a multi-node checkpoint's commit after its last part, with file
// stores: the last node writes its part and completes the save (lists the checkpoint's commits,
// reads their parts, writes the job manifest, moves LATEST), and every other node, which looked
// once when its own part was in and found parts missing, looks again and finds it committed.
// ms/op is the last node's part to LATEST; the request counts are per checkpoint, every node
// together, the data objects (one PUT per file, as for a single node) left out.
func BenchmarkJobCommit(b *testing.B) {
	for _, nodes := range []int{2, 4, 16} {
		b.Run(fmt.Sprintf("nodes=%d", nodes), func(b *testing.B) {
			fs, err := NewFileStore(b.TempDir())
			if err != nil {
				b.Fatal(err)
			}
			s := &countingStore{Store: fs}
			var elapsed time.Duration
			for i := range b.N {
				name := fmt.Sprintf("step-%06d", i)
				now := time.Now()
				// Each node writes its part and looks once; the last one completes the save.
				var parts []*Manifest
				for rank := range nodes {
					start := time.Now()
					p := putPart(b, fs, name, rank, nodes, fmt.Sprintf("i-node%d", rank), map[string][]byte{
						fmt.Sprintf("shard-%d.bin", rank): {byte(rank)}, "_COMPLETE": nil}, now, now)
					s.puts.Add(1) // the part's PUT, made through fs
					parts = append(parts, p)
					r := completeSaveBench(b, s, p)
					if rank < nodes-1 {
						if r.job != nil {
							b.Fatalf("committed before the last part: %+v", r)
						}
						continue
					}
					if !r.written || !r.latestMoved {
						b.Fatalf("the last node's completeSave = %+v", r)
					}
					elapsed += time.Since(start)
				}
				for _, p := range parts[:nodes-1] {
					if r := completeSaveBench(b, s, p); r.job == nil || r.written {
						b.Fatalf("another node's second look = %+v; want the job checkpoint, written by the last node", r)
					}
				}
			}
			b.ReportMetric(float64(elapsed.Microseconds())/1000/float64(b.N), "ms/last-part-to-latest")
			b.ReportMetric(float64(s.lists.Load())/float64(b.N), "lists/checkpoint")
			b.ReportMetric(float64(s.puts.Load())/float64(b.N), "puts/checkpoint")
			b.ReportMetric(float64(s.gets.Load())/float64(b.N), "gets/checkpoint")
		})
	}
}

func completeSaveBench(b *testing.B, s Store, p *Manifest) saveResult {
	r := completeSave(b.Context(), s, p, "_COMPLETE", Host{InstanceID: "i-x"}, time.Hour, nil)
	if r.err != nil {
		b.Fatal(r.err)
	}
	return r
}
