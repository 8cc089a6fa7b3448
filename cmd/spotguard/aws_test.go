package main

import (
	"context"
	"errors"
	"fmt"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/aws/aws-sdk-go-v2/aws"
	"github.com/aws/aws-sdk-go-v2/credentials"
	"github.com/aws/aws-sdk-go-v2/service/cloudwatch"
	cwtypes "github.com/aws/aws-sdk-go-v2/service/cloudwatch/types"

	"github.com/spotguard/spotguard/checkpoint"
)

// fakeIMDS answers IMDSv2 tokens and placement/region.
func fakeIMDS(t *testing.T, region string) string {
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		switch {
		case r.Method == http.MethodPut && r.URL.Path == "/latest/api/token":
			w.Header().Set("X-Aws-Ec2-Metadata-Token-Ttl-Seconds", "21600")
			w.Write([]byte("token"))
		case r.URL.Path == "/latest/meta-data/placement/region" && r.Header.Get("X-Aws-Ec2-Metadata-Token") == "token":
			w.Write([]byte(region))
		default:
			http.NotFound(w, r)
		}
	}))
	t.Cleanup(srv.Close)
	return srv.URL
}

// fakeS3 refuses anonymous requests without naming a region (as some S3-compatible servers do)
// and answers a signed ListObjectsV2 with an empty listing; it records the region each signed
// request was signed for.
type fakeS3 struct {
	mu      sync.Mutex
	regions []string
}

func (f *fakeS3) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	auth := r.Header.Get("Authorization")
	if auth == "" {
		w.WriteHeader(http.StatusForbidden)
		return
	}
	// Credential=AKID/20261130/REGION/s3/aws4_request
	_, cred, _ := strings.Cut(auth, "Credential=")
	if parts := strings.Split(cred, "/"); len(parts) > 2 {
		f.mu.Lock()
		f.regions = append(f.regions, parts[2])
		f.mu.Unlock()
	}
	w.Header().Set("Content-Type", "application/xml")
	w.Write([]byte(`<?xml version="1.0" encoding="UTF-8"?><ListBucketResult><Name>b</Name><KeyCount>0</KeyCount><IsTruncated>false</IsTruncated></ListBucketResult>`))
}

func isolateAWS(t *testing.T) {
	dir := t.TempDir()
	for _, k := range []string{"AWS_REGION", "AWS_DEFAULT_REGION", "AWS_PROFILE", "AWS_ENDPOINT_URL", "AWS_EC2_METADATA_DISABLED"} {
		t.Setenv(k, "")
		os.Unsetenv(k)
	}
	t.Setenv("AWS_CONFIG_FILE", filepath.Join(dir, "config"))
	t.Setenv("AWS_SHARED_CREDENTIALS_FILE", filepath.Join(dir, "credentials"))
	t.Setenv("AWS_ACCESS_KEY_ID", "AKIDTEST")
	t.Setenv("AWS_SECRET_ACCESS_KEY", "secret")
}

// A store whose server does not say where the bucket is uses the instance's region, read from
// IMDS placement/region through imds.endpoint: requests are signed for it, with no AWS_REGION
// anywhere.
func TestStoreRegionFromIMDSWhenS3DoesNotSay(t *testing.T) {
	isolateAWS(t)
	s3 := &fakeS3{}
	srv := httptest.NewServer(s3)
	defer srv.Close()
	t.Setenv("AWS_ENDPOINT_URL_S3", srv.URL)
	endpoint := fakeIMDS(t, "ap-south-1")

	store, err := openStore(t.Context(), "s3://b/p", endpoint, checkpoint.S3Options{})
	if err != nil {
		t.Fatalf("openStore: %v", err)
	}
	if _, _, err := checkpoint.ListCommitted(context.Background(), store, "job"); err != nil {
		t.Fatalf("ListCommitted: %v", err)
	}
	s3.mu.Lock()
	defer s3.mu.Unlock()
	if len(s3.regions) == 0 || s3.regions[0] != "ap-south-1" {
		t.Errorf("signed for %q; want ap-south-1 (from IMDS)", s3.regions)
	}
}

// Neither the SDK's sources, nor S3, nor IMDS name a region: the error says how to give one.
func TestStoreWithoutAnyRegion(t *testing.T) {
	isolateAWS(t)
	srv := httptest.NewServer(&fakeS3{})
	defer srv.Close()
	t.Setenv("AWS_ENDPOINT_URL_S3", srv.URL)
	noIMDS := httptest.NewServer(http.NotFoundHandler())
	defer noIMDS.Close()
	_, err := openStore(t.Context(), "s3://b/p", noIMDS.URL, checkpoint.S3Options{})
	if err == nil || !strings.Contains(err.Error(), "no AWS region") || !strings.Contains(err.Error(), "set AWS_REGION") {
		t.Errorf("openStore = %v; want an error saying there is no region and how to set one", err)
	}
}

// An agent that had no region at start (IMDS down then) gets CloudWatch's once IMDS answers:
// each call until then asks again, and fails as a call without a region does (a setup error,
// said once). (Found from outside: CloudWatch failed for the agent's whole life.)
func TestCloudWatchGetsTheRegionOnceIMDSAnswers(t *testing.T) {
	var up atomic.Bool
	imdsSrv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		switch {
		case r.Method == http.MethodPut && r.URL.Path == "/latest/api/token":
			w.Header().Set("X-Aws-Ec2-Metadata-Token-Ttl-Seconds", "21600")
			fmt.Fprint(w, "token")
		case r.URL.Path == "/latest/meta-data/placement/region" && up.Load():
			fmt.Fprint(w, "eu-west-1")
		default:
			http.NotFound(w, r)
		}
	}))
	t.Cleanup(imdsSrv.Close)
	var regions []string
	var mu sync.Mutex
	cwSrv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		auth := r.Header.Get("Authorization") // Credential=KEY/DATE/REGION/monitoring/aws4_request
		mu.Lock()
		regions = append(regions, strings.Split(auth, "/")[2])
		mu.Unlock()
		w.Header().Set("Content-Type", "application/cbor") // CloudWatch's rpc-v2-cbor: an empty map
		w.Header().Set("Smithy-Protocol", "rpc-v2-cbor")
		w.Write([]byte{0xa0})
	}))
	t.Cleanup(cwSrv.Close)
	cfg := aws.Config{BaseEndpoint: aws.String(cwSrv.URL), Credentials: aws.NewCredentialsCache(credentials.NewStaticCredentialsProvider("k", "s", ""))}
	s := awsSetup{cfg: cfg, imdsEndpoint: imdsSrv.URL}
	s.resolveRegion(t.Context())
	if s.cfg.Region != "" || s.regionErr == nil {
		t.Fatalf("resolveRegion with IMDS down: region %q, %v; want none and why", s.cfg.Region, s.regionErr)
	}
	cw := &regionLaterCloudWatch{setup: s}
	in := &cloudwatch.PutMetricDataInput{Namespace: aws.String("SpotGuard"), MetricData: []cwtypes.MetricDatum{{MetricName: aws.String("AgentUp"), Value: aws.Float64(1)}}}
	var mr *aws.MissingRegionError
	if _, err := cw.PutMetricData(t.Context(), in); !errors.As(err, &mr) {
		t.Fatalf("PutMetricData with IMDS down = %v; want a missing region", err)
	}
	up.Store(true)
	if _, err := cw.PutMetricData(t.Context(), in); err != nil {
		t.Fatalf("PutMetricData once IMDS answers = %v; want it sent", err)
	}
	if _, err := cw.PutMetricData(t.Context(), in); err != nil {
		t.Fatalf("PutMetricData again = %v", err)
	}
	mu.Lock()
	defer mu.Unlock()
	if !slices.Equal(regions, []string{"eu-west-1", "eu-west-1"}) {
		t.Errorf("CloudWatch calls signed for regions %v; want eu-west-1 twice, the region IMDS gave", regions)
	}
}

// With imds.endpoint set, the instance profile's credentials come from that IMDS, as the notices
// and the region do (found from outside: the SDK asked its own default endpoint for them, and
// the failure was said as the route to S3).
func TestInstanceProfileCredentialsComeFromIMDSEndpoint(t *testing.T) {
	for _, k := range []string{"AWS_ACCESS_KEY_ID", "AWS_SECRET_ACCESS_KEY", "AWS_SESSION_TOKEN", "AWS_PROFILE", "AWS_EC2_METADATA_SERVICE_ENDPOINT",
		"AWS_CONTAINER_CREDENTIALS_RELATIVE_URI", "AWS_CONTAINER_CREDENTIALS_FULL_URI", "AWS_WEB_IDENTITY_TOKEN_FILE", "AWS_EC2_METADATA_DISABLED"} {
		t.Setenv(k, "")
	}
	t.Setenv("AWS_CONFIG_FILE", filepath.Join(t.TempDir(), "none"))
	t.Setenv("AWS_SHARED_CREDENTIALS_FILE", filepath.Join(t.TempDir(), "none"))
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		switch {
		case r.Method == http.MethodPut && r.URL.Path == "/latest/api/token":
			w.Header().Set("X-Aws-Ec2-Metadata-Token-Ttl-Seconds", "21600")
			fmt.Fprint(w, "token")
		case r.URL.Path == "/latest/meta-data/iam/security-credentials/":
			fmt.Fprint(w, "trainer-role")
		case r.URL.Path == "/latest/meta-data/iam/security-credentials/trainer-role":
			fmt.Fprintf(w, `{"Code": "Success", "Type": "AWS-HMAC", "AccessKeyId": "AKIAFROMTHEENDPOINT", "SecretAccessKey": "s", "Token": "t", "Expiration": %q}`,
				time.Now().Add(time.Hour).UTC().Format(time.RFC3339))
		default:
			http.NotFound(w, r)
		}
	}))
	t.Cleanup(srv.Close)
	s, err := loadAWS(t.Context(), srv.URL)
	if err != nil {
		t.Fatal(err)
	}
	creds, err := s.cfg.Credentials.Retrieve(t.Context())
	if err != nil || creds.AccessKeyID != "AKIAFROMTHEENDPOINT" {
		t.Errorf("credentials with imds.endpoint %s = %+v, %v; want the instance profile's from it", srv.URL, creds, err)
	}
}
