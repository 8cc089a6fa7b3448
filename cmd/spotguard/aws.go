package main

import (
	"context"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"regexp"
	"strings"
	"time"

	"github.com/aws/aws-sdk-go-v2/aws"
	awsconfig "github.com/aws/aws-sdk-go-v2/config"

	"github.com/spotguard/spotguard/agent/imds"
	"github.com/spotguard/spotguard/checkpoint"
)

// imdsRegionTimeout bounds the IMDS read of the instance's region (retries included).
const imdsRegionTimeout = 5 * time.Second

// bucketRegionTimeout bounds the question of which region a bucket is in.
const bucketRegionTimeout = 10 * time.Second

// awsSetup is the AWS configuration of one command.
type awsSetup struct {
	cfg aws.Config
	// regionFrom says where cfg.Region came from, for messages.
	regionFrom string
	// imdsEndpoint is where resolveRegion asks (imds.endpoint; empty: the SDK's choice).
	imdsEndpoint string
	// regionErr is why IMDS gave no region, when cfg.Region is "" after resolveRegion.
	regionErr error
}

// regionPattern is what a region name looks like (us-east-1, us-gov-west-1, cn-north-1, ...).
var regionPattern = regexp.MustCompile(`^[a-z]{2}(-[a-z0-9]+)+-[0-9]+$`)

// loadAWS loads the AWS configuration from the SDK's own sources: the environment, the shared
// config and credentials files and the profile they name. The error is a problem with them (a
// profile that does not exist, a file that cannot be read). The region may still be "":
// resolveRegion asks IMDS.
func loadAWS(ctx context.Context, imdsEndpoint string) (awsSetup, error) {
	var opts []func(*awsconfig.LoadOptions) error
	if imdsEndpoint != "" {
		// The instance profile's credentials from the IMDS the notices come from (found from
		// outside: with imds.endpoint set, the SDK asked its own default for them, and the
		// failure was said as the route to S3).
		opts = append(opts, awsconfig.WithEC2IMDSEndpoint(imdsEndpoint))
	}
	cfg, err := awsconfig.LoadDefaultConfig(ctx, opts...)
	if err != nil {
		return awsSetup{cfg: envOnlyAWS(), imdsEndpoint: imdsEndpoint}, awsConfigError(err)
	}
	return awsSetup{cfg: cfg, regionFrom: "the AWS environment or shared config", imdsEndpoint: imdsEndpoint}, nil
}

// resolveRegion sets the region, when the SDK's sources name none, to the instance's: IMDS
// placement/region, read through the same endpoint as the notice watcher's (imds.endpoint, else
// AWS_EC2_METADATA_SERVICE_ENDPOINT, else the default), so an instance needs no AWS_REGION. When
// IMDS does not answer, the region stays "" and needRegion says why.
func (s *awsSetup) resolveRegion(ctx context.Context) {
	if s.cfg.Region != "" || s.regionErr != nil {
		return
	}
	rctx, cancel := context.WithTimeout(ctx, imdsRegionTimeout)
	defer cancel()
	body, found, err := imds.NewClient(s.cfg, s.imdsEndpoint).Get(rctx, "placement/region")
	region := strings.TrimSpace(string(body))
	switch {
	case err != nil:
		s.regionErr = err
	case !found:
		s.regionErr = errors.New("placement/region: 404 not found")
	case !regionPattern.MatchString(region):
		s.regionErr = fmt.Errorf("placement/region: %q is not a region name", region)
	default:
		s.cfg.Region, s.regionFrom = region, "IMDS placement/region"
	}
}

// needRegion returns an error saying how to give a region when there is none.
func (s awsSetup) needRegion() error {
	if s.cfg.Region != "" {
		return nil
	}
	return fmt.Errorf("no AWS region: none in AWS_REGION, AWS_DEFAULT_REGION or the shared config, and IMDS placement/region did not answer (%v): "+
		"run on EC2 with IMDS reachable, or set AWS_REGION", s.regionErr)
}

// awsConfigError says which of the SDK's settings a load error comes from.
func awsConfigError(err error) error {
	where := "AWS_PROFILE, AWS_CONFIG_FILE, AWS_SHARED_CREDENTIALS_FILE or ~/.aws/config"
	if p := os.Getenv("AWS_PROFILE"); p != "" {
		where = fmt.Sprintf("AWS_PROFILE=%s (a profile in ~/.aws/config or AWS_CONFIG_FILE)", p)
	}
	return fmt.Errorf("cannot load the AWS configuration from %s: %w", where, err)
}

// envOnlyAWS is the AWS configuration of the environment alone, for the IMDS client when the
// shared config cannot be loaded: AWS_EC2_METADATA_SERVICE_ENDPOINT still counts.
func envOnlyAWS() aws.Config {
	var cfg aws.Config
	if env, err := awsconfig.NewEnvConfig(); err == nil {
		cfg.ConfigSources = []any{env}
	}
	return cfg
}

// storeAWS returns the AWS configuration for the store at url: s's, in the bucket's own region,
// which S3 names in its answer to an anonymous HeadBucket (asked in s's region, or us-east-1 when
// s has none yet), so a bucket in another region than the instance is reached. When S3 does not
// name it, the store uses s's region, the instance's if the SDK's sources name none. note, if not
// nil, is told which region the store uses and why. A file store needs no AWS configuration.
func storeAWS(ctx context.Context, s *awsSetup, url string, note func(string)) (aws.Config, error) {
	if !strings.HasPrefix(url, "s3://") {
		return aws.Config{}, nil
	}
	_, bucket, _, err := checkpoint.ParseStoreURL(url)
	if err != nil {
		return aws.Config{}, err
	}
	bctx, cancel := context.WithTimeout(ctx, bucketRegionTimeout)
	defer cancel()
	region, berr := checkpoint.BucketRegion(bctx, s.cfg, bucket)
	cfg := s.cfg.Copy()
	if region == "" {
		s.resolveRegion(ctx)
		if err := s.needRegion(); err != nil {
			return aws.Config{}, fmt.Errorf("store %s: %w (and S3 did not say which region bucket %s is in: %v)", url, err, bucket, berr)
		}
		if note != nil {
			note(fmt.Sprintf("S3 did not say which region bucket %s is in (%v); the store uses %s (from %s)", bucket, berr, s.cfg.Region, s.regionFrom))
		}
		cfg.Region = s.cfg.Region
		return cfg, nil
	}
	if note != nil && region != s.cfg.Region && s.cfg.Region != "" {
		note(fmt.Sprintf("bucket %s is in %s, not in %s (from %s): the store uses %s", bucket, region, s.cfg.Region, s.regionFrom, region))
	}
	cfg.Region = region
	return cfg, nil
}

// openStoreToRead is openStore for the commands that only read the store (list, restore): a
// file:// store's directory must exist. Opened to write, a file store creates it; here a missing
// one is a file system not mounted yet or a mistyped path, and must not pass for an empty store
// (restore --allow-empty would start the trainer from scratch). A variable, so that a test can
// see what a command reads.
var openStoreToRead = openStoreToReadAt

func openStoreToReadAt(ctx context.Context, url, imdsEndpoint string, opts checkpoint.S3Options) (checkpoint.Store, error) {
	if root, ok := strings.CutPrefix(url, "file://"); ok && filepath.IsAbs(root) {
		fi, err := os.Stat(root)
		switch {
		case errors.Is(err, fs.ErrNotExist):
			return nil, fmt.Errorf("store %s: the directory %s does not exist (a file system not mounted yet, or a mistyped store.url?); nothing to read", url, root)
		case err != nil:
			return nil, fmt.Errorf("store %s: %w", url, err)
		case !fi.IsDir():
			return nil, fmt.Errorf("store %s: %s is not a directory", url, root)
		}
	}
	return openStore(ctx, url, imdsEndpoint, opts)
}

// openStore opens the store at url as every command does: AWS settings as `spotguard run` loads
// them (loadAWS, then IMDS through imdsEndpoint for the region if need be), loaded only for an
// s3:// store, in the bucket's region.
func openStore(ctx context.Context, url, imdsEndpoint string, opts checkpoint.S3Options) (checkpoint.Store, error) {
	if !strings.HasPrefix(url, "s3://") {
		return checkpoint.OpenStore(url, aws.Config{}, opts)
	}
	s, err := loadAWS(ctx, imdsEndpoint)
	if err != nil {
		return nil, fmt.Errorf("store %s: %w", url, err)
	}
	cfg, err := storeAWS(ctx, &s, url, nil)
	if err != nil {
		return nil, err
	}
	return checkpoint.OpenStore(url, cfg, opts)
}
