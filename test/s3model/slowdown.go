package s3model

import (
	"encoding/xml"
	"fmt"
	"net/http"
	"strings"
	"sync"
	"time"
)

// Prefix returns the key prefix that a request for path (path-style: /bucket/key, as clients
// send with an endpoint URL) counts against for SlowDown: the bucket and the key's first n
// "directories", the '/'-terminated segments. With n = 2, the key a/b/c/d counts against
// "bucket/a/b/", a/x against "bucket/a/" and x against "bucket/"; with n = 0 every key of a
// bucket counts against "bucket/". A request that names no key (ListObjectsV2, a bucket
// operation) counts against "bucket/", and one that names no bucket against "/".
func Prefix(path string, n int) string {
	path = strings.TrimPrefix(path, "/")
	bucket, key, _ := strings.Cut(path, "/")
	prefix := bucket + "/"
	for range n {
		seg, rest, ok := strings.Cut(key, "/")
		if !ok {
			break
		}
		prefix += seg + "/"
		key = rest
	}
	return prefix
}

// slowDown is a token bucket for each prefix: each fills at rate tokens a second up to burst;
// a request takes one, and a request that finds none is refused (and takes none).
type slowDown struct {
	rate     float64
	burst    float64
	segments int

	mu      sync.Mutex
	buckets map[string]*tokenBucket
}

type tokenBucket struct {
	tokens float64
	at     time.Time
}

func newSlowDown(rate float64, burst, segments int) *slowDown {
	b := float64(burst)
	if burst <= 0 {
		b = max(1, rate) // a second's worth
	}
	return &slowDown{rate: rate, burst: b, segments: segments, buckets: map[string]*tokenBucket{}}
}

// allow reports whether a request for prefix at now is within its rate, and if so takes its
// token.
func (s *slowDown) allow(prefix string, now time.Time) bool {
	s.mu.Lock()
	defer s.mu.Unlock()
	b, ok := s.buckets[prefix]
	if !ok {
		b = &tokenBucket{tokens: s.burst, at: now}
		s.buckets[prefix] = b
	}
	if now.After(b.at) {
		b.tokens = min(s.burst, b.tokens+now.Sub(b.at).Seconds()*s.rate)
		b.at = now
	}
	if b.tokens < 1 {
		return false
	}
	b.tokens--
	return true
}

// s3Error is the body of an S3 error answer.
type s3Error struct {
	XMLName   xml.Name `xml:"Error"`
	Code      string   `xml:"Code"`
	Message   string   `xml:"Message"`
	Resource  string   `xml:"Resource"`
	RequestID string   `xml:"RequestId"`
}

// writeSlowDown answers 503 SlowDown, as S3 does when a prefix gets more requests than it can
// take: <Error><Code>SlowDown</Code><Message>Please reduce your request rate.</Message>…</Error>.
// The request's body is not read.
func writeSlowDown(w http.ResponseWriter, r *http.Request, requestID string) {
	body, err := xml.Marshal(s3Error{
		Code:      "SlowDown",
		Message:   "Please reduce your request rate.",
		Resource:  r.URL.Path,
		RequestID: requestID,
	})
	if err != nil {
		panic(fmt.Sprintf("marshal s3 error: %v", err)) // a fixed struct of strings always marshals
	}
	body = append([]byte(xml.Header), body...)
	h := w.Header()
	h.Set("Content-Type", "application/xml")
	h.Set("Content-Length", fmt.Sprint(len(body)))
	h.Set("X-Amz-Request-Id", requestID)
	w.WriteHeader(http.StatusServiceUnavailable)
	_, _ = w.Write(body)
}
