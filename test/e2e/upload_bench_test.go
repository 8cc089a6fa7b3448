package e2e

import (
	"crypto/rand"
	"fmt"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"
)

// The upload and restore benchmarks compare spotguard with awscli (an independent client,
// Debian's or pip's) side by side on the same S3 server (versitygw on 127.0.0.1) and the same data:
// BENCH_CKPT_MIB MiB (default 2048) in 8 files. On a 2-core machine the local server is itself the
// ceiling, so the figures that matter are the ratios.
//
//	go test -run '^$' -bench 'UploadVsAWSCLI|RestoreVsAWSCLI' -benchtime 1x -timeout 30m ./test/e2e/

// benchData writes a checkpoint of total bytes in 8 random files plus the marker into
// dir/name and returns its size.
func benchData(b *testing.B, dir, name string) int64 {
	b.Helper()
	total := int64(2048) << 20
	if s := os.Getenv("BENCH_CKPT_MIB"); s != "" {
		n, err := strconv.Atoi(s)
		if err != nil {
			b.Fatalf("BENCH_CKPT_MIB=%q: %v", s, err)
		}
		total = int64(n) << 20
	}
	ck := filepath.Join(dir, name)
	os.MkdirAll(ck, 0o755)
	per := total / 8
	for i := range 8 {
		f, err := os.Create(filepath.Join(ck, fmt.Sprintf("shard-%d.bin", i)))
		if err != nil {
			b.Fatal(err)
		}
		if _, err := io.CopyN(f, rand.Reader, per); err != nil {
			b.Fatal(err)
		}
		f.Close()
	}
	os.WriteFile(filepath.Join(ck, "_COMPLETE"), []byte("{}\n"), 0o644)
	return per * 8
}

// usage is what a finished child process cost.
type usage struct {
	wall   time.Duration
	cpu    time.Duration // user + system
	maxRSS int64         // bytes
}

func (u usage) String() string {
	return fmt.Sprintf("wall %.2fs, cpu %.2fs, peak RSS %d MiB", u.wall.Seconds(), u.cpu.Seconds(), u.maxRSS>>20)
}

func runMeasured(b *testing.B, cmd *exec.Cmd) usage {
	b.Helper()
	start := time.Now()
	out, err := cmd.CombinedOutput()
	wall := time.Since(start)
	if err != nil {
		b.Fatalf("%s: %v\n%s", strings.Join(cmd.Args, " "), err, out)
	}
	ru := cmd.ProcessState.SysUsage().(*syscall.Rusage)
	return usage{wall: wall, cpu: cmd.ProcessState.UserTime() + cmd.ProcessState.SystemTime(), maxRSS: ru.Maxrss << 10}
}

func (s *s3Server) awsCmd(b *testing.B, args ...string) *exec.Cmd {
	cmd := exec.Command(awsBin(b), append([]string{"--endpoint-url", s.endpoint}, args...)...)
	cmd.Env = append(os.Environ(), s.env("")...)
	cmd.Env = append(cmd.Env, "HOME="+b.TempDir(), "AWS_EC2_METADATA_DISABLED=true")
	return cmd
}

// uploadWithAgent runs `spotguard run` on a checkpoint directory that holds one complete,
// uncommitted checkpoint and measures it from start until the checkpoint is committed; the agent
// is then stopped. CPU and peak RSS are the agent's own (from /proc while it runs).
func uploadWithAgent(b *testing.B, s3 *s3Server, ckdir, prefix string) usage {
	b.Helper()
	sim := newIMDS(b)
	sim.start("spot", "-d", "100000", "--rebalance-delay-sec", "100000")
	start := time.Now()
	ap := startAgent(b, sim, append([]string{"SPOTGUARD_TRAINER_MATCH=no-trainer-for-this-benchmark",
		"SPOTGUARD_CHECKPOINT_DIR=" + ckdir, "SPOTGUARD_STORE_URL=s3://" + s3Bucket + "/" + prefix,
		"SPOTGUARD_STORE_JOB=bench", "SPOTGUARD_LOG_LEVEL=warn"}, s3.env("")...)...)
	pid := ap.cmd.Process.Pid
	var hwm int
	eventually(b, 10*time.Minute, "the checkpoint to be committed", func() bool {
		hwm = max(hwm, procStatusKB(b, pid, "VmHWM"))
		return hasLine(ap.metrics(b), `spotguard_checkpoints_committed_total{trigger="periodic"} 1`)
	})
	wall := time.Since(start)
	cpu := cpuSeconds(b, pid)
	hwm = max(hwm, procStatusKB(b, pid, "VmHWM"))
	ap.stop(b)
	sim.stop()
	return usage{wall: wall, cpu: time.Duration(cpu * float64(time.Second)), maxRSS: int64(hwm) << 10}
}

func BenchmarkUploadVsAWSCLI(b *testing.B) {
	needPeers(b)
	s3 := startS3(b)
	ckdir := b.TempDir()
	size := benchData(b, ckdir, "step-000001")
	gib := float64(size) / (1 << 30)
	b.ResetTimer()
	for i := range b.N {
		aws := runMeasured(b, s3.awsCmd(b, "s3", "cp", "--recursive", "--only-show-errors",
			filepath.Join(ckdir, "step-000001"), fmt.Sprintf("s3://%s/awscli-%d/", s3Bucket, i)))
		sg := uploadWithAgent(b, s3, ckdir, fmt.Sprintf("spotguard-%d", i))
		b.Logf("%.2f GiB: awscli %v; spotguard %v", gib, aws, sg)
		b.ReportMetric(sg.wall.Seconds()/aws.wall.Seconds(), "wall_ratio_vs_awscli")
		b.ReportMetric(sg.cpu.Seconds()/gib, "spotguard_cpu_s_per_GiB")
		b.ReportMetric(aws.cpu.Seconds()/gib, "awscli_cpu_s_per_GiB")
		b.ReportMetric(sg.cpu.Seconds()/aws.cpu.Seconds(), "cpu_ratio_vs_awscli")
		b.ReportMetric(float64(sg.maxRSS)/(1<<20), "spotguard_peak_RSS_MiB")
		b.ReportMetric(float64(size)/sg.wall.Seconds()/1e6, "spotguard_MB_per_s")
		b.ReportMetric(float64(size)/aws.wall.Seconds()/1e6, "awscli_MB_per_s")
	}
}

func BenchmarkRestoreVsAWSCLI(b *testing.B) {
	needPeers(b)
	s3 := startS3(b)
	ckdir := b.TempDir()
	size := benchData(b, ckdir, "step-000001")
	gib := float64(size) / (1 << 30)
	uploadWithAgent(b, s3, ckdir, "restore")
	b.ResetTimer()
	for range b.N {
		awsDir, sgDir := b.TempDir(), b.TempDir()
		aws := runMeasured(b, s3.awsCmd(b, "s3", "cp", "--recursive", "--only-show-errors",
			"s3://"+s3Bucket+"/restore/bench/step-000001/", awsDir))
		cmd := exec.Command(spotguardBin, "restore", "--config", writeEmptyConfig(b), "--to", sgDir)
		cmd.Env = append([]string{"PATH=" + os.Getenv("PATH"), "HOME=" + b.TempDir(),
			"SPOTGUARD_STORE_URL=s3://" + s3Bucket + "/restore", "SPOTGUARD_STORE_JOB=bench"}, s3.env("")...)
		sg := runMeasured(b, cmd)
		b.Logf("%.2f GiB: awscli %v; spotguard restore (checksums verified) %v", gib, aws, sg)
		b.ReportMetric(sg.wall.Seconds()/aws.wall.Seconds(), "wall_ratio_vs_awscli")
		b.ReportMetric(sg.cpu.Seconds()/aws.cpu.Seconds(), "cpu_ratio_vs_awscli")
		b.ReportMetric(float64(sg.maxRSS)/(1<<20), "spotguard_peak_RSS_MiB")
		b.ReportMetric(float64(size)/sg.wall.Seconds()/1e6, "spotguard_MB_per_s")
		b.ReportMetric(float64(size)/aws.wall.Seconds()/1e6, "awscli_MB_per_s")
	}
}

// BenchmarkTimeToDurable: a notice arrives, and the trainer writes S bytes (BENCH_DURABLE_MIB,
// default 1024, in 8 files) spread over about BENCH_WRITE_SECONDS (default 8); W is the time it
// really took (notice → marker, from /status). It reports notice → manifest against
// max(W, S/throughput) + 2 s (the target) and W + S/throughput (uploading after the marker), with
// the throughput measured by uploading the same amount first.
func BenchmarkTimeToDurable(b *testing.B) {
	needPeers(b)
	wantW := envFloat(b, "BENCH_WRITE_SECONDS", 8)
	mib := envFloat(b, "BENCH_DURABLE_MIB", 1024)
	s3 := startS3(b)
	// Throughput of this server for this size, uploaded after the fact.
	ref := b.TempDir()
	b.Setenv("BENCH_CKPT_MIB", strconv.Itoa(int(mib)))
	size := benchData(b, ref, "step-000001")
	up := uploadWithAgent(b, s3, ref, "ref")
	throughput := float64(size) / up.wall.Seconds()
	os.RemoveAll(ref)
	b.ResetTimer()
	for i := range b.N {
		sim := newIMDS(b)
		trigger := time.Now().Truncate(time.Second).Add(3 * time.Second)
		sim.start("spot", "-a", "terminate", "--mock-trigger-time", trigger.UTC().Format(time.RFC3339), "--rebalance-delay-sec", "100000")
		ckdir := b.TempDir()
		tp := startTrainer(b, "--checkpoint-dir", ckdir, "--files", "8", "--checkpoint-mb", strconv.FormatFloat(mib/8, 'f', -1, 64),
			"--write-seconds", strconv.FormatFloat(wantW, 'f', -1, 64))
		ap := startAgent(b, sim, append([]string{"SPOTGUARD_TRAINER_PIDFILE=" + tp.pidfile, "SPOTGUARD_NOTICES_REBALANCE=ignore",
			"SPOTGUARD_CHECKPOINT_DIR=" + ckdir, "SPOTGUARD_STORE_URL=s3://" + s3Bucket + fmt.Sprintf("/durable-%d", i),
			"SPOTGUARD_STORE_JOB=bench", "SPOTGUARD_LOG_LEVEL=warn"}, s3.env("")...)...)
		ap.waitNoticeState(b, "spot/terminate", "committed", 10*time.Minute)
		// W is what the trainer really took: from the notice to its marker (urandom and the
		// shared CPU make it longer than --write-seconds).
		var durable, written float64
		for _, ns := range ap.status(b).Notices {
			if ns.Key != "spot/terminate" {
				continue
			}
			for _, tr := range ns.Transitions {
				switch tr.State {
				case "checkpoint_written":
					written = tr.SinceDetectedMS / 1000
				case "committed":
					durable = tr.SinceDetectedMS / 1000
				}
			}
		}
		w := written
		send := float64(size) / throughput
		b.Logf("S=%.0f MiB, trainer took W=%.2fs (asked for %.1fs), throughput %.0f MB/s: notice→durable %.2fs; target max(W,S/T)+2 = %.2fs; upload-after-marker W+S/T = %.2fs",
			mib, w, wantW, throughput/1e6, durable, max(w, send)+2, w+send)
		b.ReportMetric(w, "trainer_write_s")
		b.ReportMetric(durable, "notice_to_durable_s")
		b.ReportMetric(max(w, send)+2, "target_s")
		b.ReportMetric(w+send, "after_marker_s")
		ap.stop(b)
	}
}

func envFloat(b *testing.B, name string, def float64) float64 {
	s := os.Getenv(name)
	if s == "" {
		return def
	}
	v, err := strconv.ParseFloat(s, 64)
	if err != nil {
		b.Fatalf("%s=%q: %v", name, s, err)
	}
	return v
}
