package s3model

import (
	"bytes"
	"context"
	"crypto/rand"
	"encoding/base64"
	"encoding/binary"
	"errors"
	"fmt"
	"hash/crc32"
	"io"
	"time"

	"github.com/aws/aws-sdk-go-v2/aws"
	v4 "github.com/aws/aws-sdk-go-v2/aws/signer/v4"
	"github.com/aws/aws-sdk-go-v2/service/s3"
	"github.com/aws/aws-sdk-go-v2/service/s3/types"
	"golang.org/x/sync/errgroup"
)

// Calibrate measures the server's ceiling. It uploads size bytes to bucket/key as one multipart
// upload of conns parts, all in flight at once, then reads the object back with conns ranged
// GETs at once, and returns the bytes a second of each (from the first request to the last
// answer). The client should keep conns connections open (its transport's MaxIdleConnsPerHost).
// It may reach the server directly (the server's ceiling), through a Proxy without cap or latency
// (what a client can get through the model on this machine: the benchmarks' ceiling), or through
// the scaled model itself (the most a client can get out of it for one round of parts). The client does as little as it can,
// so that the figure is the server's: every part is the same random bytes, sent with their
// CRC-32C given and unsigned (UNSIGNED-PAYLOAD, over plain HTTP too), and what is read back is
// discarded unchecked. The object is deleted afterwards. size/conns must be at least 5 MiB (S3's
// smallest part).
//
// A single run on a shared machine varies by some tens of percent; callers take the best of a
// few.
func Calibrate(ctx context.Context, client *s3.Client, bucket, key string, size int64, conns int) (Ceiling, error) {
	if conns < 1 || size/int64(conns) < 5<<20 {
		return Ceiling{}, fmt.Errorf("calibrate: %d bytes in %d parts: want parts of at least 5 MiB", size, conns)
	}
	partSize := size / int64(conns)
	size = partSize * int64(conns)
	part := make([]byte, partSize)
	if _, err := rand.Read(part); err != nil {
		return Ceiling{}, fmt.Errorf("calibrate: %w", err)
	}
	var sum [4]byte
	binary.BigEndian.PutUint32(sum[:], crc32.Checksum(part, crc32.MakeTable(crc32.Castagnoli)))
	crc := base64.StdEncoding.EncodeToString(sum[:])
	unsigned := func(o *s3.Options) {
		o.APIOptions = append(o.APIOptions, v4.SwapComputePayloadSHA256ForUnsignedPayloadMiddleware)
	}

	start := time.Now()
	created, err := client.CreateMultipartUpload(ctx, &s3.CreateMultipartUploadInput{
		Bucket: &bucket, Key: &key, ChecksumAlgorithm: types.ChecksumAlgorithmCrc32c,
	})
	if err != nil {
		return Ceiling{}, fmt.Errorf("calibrate: create multipart upload: %w", err)
	}
	completed := make([]types.CompletedPart, conns)
	g, gctx := errgroup.WithContext(ctx)
	for i := range conns {
		g.Go(func() error {
			out, err := client.UploadPart(gctx, &s3.UploadPartInput{
				Bucket: &bucket, Key: &key, UploadId: created.UploadId, PartNumber: aws.Int32(int32(i + 1)),
				Body: bytes.NewReader(part), ContentLength: aws.Int64(partSize),
				ChecksumAlgorithm: types.ChecksumAlgorithmCrc32c, ChecksumCRC32C: &crc,
			}, unsigned)
			if err != nil {
				return fmt.Errorf("upload part %d: %w", i+1, err)
			}
			completed[i] = types.CompletedPart{ETag: out.ETag, PartNumber: aws.Int32(int32(i + 1)), ChecksumCRC32C: &crc}
			return nil
		})
	}
	err = g.Wait()
	if err == nil {
		_, err = client.CompleteMultipartUpload(ctx, &s3.CompleteMultipartUploadInput{
			Bucket: &bucket, Key: &key, UploadId: created.UploadId,
			MultipartUpload: &types.CompletedMultipartUpload{Parts: completed},
		})
		if err != nil {
			err = fmt.Errorf("complete multipart upload: %w", err)
		}
	}
	if err != nil {
		_, aerr := client.AbortMultipartUpload(context.WithoutCancel(ctx), &s3.AbortMultipartUploadInput{
			Bucket: &bucket, Key: &key, UploadId: created.UploadId,
		})
		return Ceiling{}, fmt.Errorf("calibrate: %w", errors.Join(err, aerr))
	}
	up := float64(size) / time.Since(start).Seconds()

	start = time.Now()
	g, gctx = errgroup.WithContext(ctx)
	for i := range int64(conns) {
		g.Go(func() error {
			out, err := client.GetObject(gctx, &s3.GetObjectInput{
				Bucket: &bucket, Key: &key,
				Range: aws.String(fmt.Sprintf("bytes=%d-%d", i*partSize, (i+1)*partSize-1)),
			})
			if err != nil {
				return fmt.Errorf("get range %d: %w", i, err)
			}
			defer out.Body.Close()
			n, err := io.Copy(io.Discard, out.Body)
			if err == nil && n != partSize {
				err = fmt.Errorf("got %d bytes; want %d", n, partSize)
			}
			if err != nil {
				return fmt.Errorf("get range %d: %w", i, err)
			}
			return nil
		})
	}
	err = g.Wait()
	down := float64(size) / time.Since(start).Seconds()
	_, derr := client.DeleteObject(context.WithoutCancel(ctx), &s3.DeleteObjectInput{Bucket: &bucket, Key: &key})
	if err := errors.Join(err, derr); err != nil {
		return Ceiling{}, fmt.Errorf("calibrate: %w", err)
	}
	return Ceiling{Up: up, Down: down}, nil
}
