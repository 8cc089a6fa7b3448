package main

import (
	"context"
	"errors"
	"fmt"
	"os"
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
	// regionErr is why IMDS gave no region, when cfg.Region is "".
	regionErr error
}

// regionPattern is what a region name looks like (us-east-1, us-gov-west-1, cn-north-1, ...).
var regionPattern = regexp.MustCompile(`^[a-z]{2}(-[a-z0-9]+)+-[0-9]+$`)

// loadAWS loads the AWS configuration from the SDK's own sources: the environment, the shared
// config and credentials files and the profile they name. When they name no region it is the
// instance's, IMDS placement/region, read through the same endpoint as the notice watcher's
// (imdsEndpoint, which is imds.endpoint; empty: AWS_EC2_METADATA_SERVICE_ENDPOINT, else the
// default), so an instance needs no AWS_REGION. The error is a problem with the SDK's own sources
// (a profile that does not exist, a file that cannot be read); no region is not an error here:
// needRegion says so where one is needed.
func loadAWS(ctx context.Context, imdsEndpoint string) (awsSetup, error) {
	cfg, err := awsconfig.LoadDefaultConfig(ctx)
	if err != nil {
		return awsSetup{cfg: envOnlyAWS()}, awsConfigError(err)
	}
	s := awsSetup{cfg: cfg, regionFrom: "the AWS environment or shared config"}
	if cfg.Region != "" {
		return s, nil
	}
	rctx, cancel := context.WithTimeout(ctx, imdsRegionTimeout)
	defer cancel()
	body, found, err := imds.NewClient(cfg, imdsEndpoint).Get(rctx, "placement/region")
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
	return s, nil
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

// openS3Store opens the store at url with the AWS configuration s, in the bucket's own region
// when S3 names another one than s's (a bucket in another region than the instance). note, if
// not nil, is told which region the store uses and why. A file store needs no AWS at all.
func openS3Store(ctx context.Context, s awsSetup, url string, opts checkpoint.S3Options, note func(string)) (checkpoint.Store, error) {
	scheme, bucket, _, err := checkpoint.ParseStoreURL(url)
	if err != nil {
		return nil, err
	}
	if scheme != "s3" {
		return checkpoint.OpenStore(url, aws.Config{}, opts)
	}
	cfg := s.cfg.Copy()
	bctx, cancel := context.WithTimeout(ctx, bucketRegionTimeout)
	defer cancel()
	region, berr := checkpoint.BucketRegion(bctx, cfg, bucket)
	switch {
	case region != "" && region != cfg.Region:
		if note != nil && cfg.Region != "" {
			note(fmt.Sprintf("bucket %s is in %s, not in %s (from %s): the store uses %s", bucket, region, cfg.Region, s.regionFrom, region))
		}
		cfg.Region = region
	case region == "":
		if err := s.needRegion(); err != nil {
			return nil, fmt.Errorf("store %s: %w (and S3 did not say where bucket %s is: %v)", url, err, bucket, berr)
		}
		if note != nil {
			note(fmt.Sprintf("could not ask S3 which region bucket %s is in (%v); the store uses %s (from %s)", bucket, berr, cfg.Region, s.regionFrom))
		}
	}
	return checkpoint.OpenStore(url, cfg, opts)
}

// openStore opens the store at url as every command does: AWS settings as `spotguard run` loads
// them (loadAWS, through imdsEndpoint), loaded only for an s3:// store, in the bucket's region.
func openStore(ctx context.Context, url, imdsEndpoint string, opts checkpoint.S3Options) (checkpoint.Store, error) {
	if !strings.HasPrefix(url, "s3://") {
		return checkpoint.OpenStore(url, aws.Config{}, opts)
	}
	s, err := loadAWS(ctx, imdsEndpoint)
	if err != nil {
		return nil, fmt.Errorf("store %s: %w", url, err)
	}
	return openS3Store(ctx, s, url, opts, nil)
}
