package e2e

import (
	"crypto/rand"
	"fmt"
	"io"
	"io/fs"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/spotguard/spotguard/test/s3model"
)

// The upload and restore benchmarks compare spotguard with awscli (an independent client,
// Debian's or pip's) side by side on the same S3 server (versitygw on 127.0.0.1) and the same data:
// BENCH_CKPT_MIB MiB (default 2048) in 8 files. On a 2-core machine the local server is itself the
// ceiling, so the figures that matter are the ratios.
//
//	go test -run '^$' -bench 'UploadVsAWSCLI|RestoreVsAWSCLI' -benchtime 1x -timeout 30m ./test/e2e/
//
// BenchmarkS3Model does the same over plain HTTP, TLS and the scaled model of S3 in one run
// (`make bench-s3`; docs/benchmarks.md).

// benchData writes a checkpoint of BENCH_CKPT_MIB MiB (default 2048) in 8 random files plus
// the marker into dir/name and returns its size.
func benchData(b *testing.B, dir, name string) int64 {
	b.Helper()
	return benchDataMiB(b, dir, name, 2048)
}

// benchDataMiB is benchData with defaultMiB when BENCH_CKPT_MIB is not set.
func benchDataMiB(b *testing.B, dir, name string, defaultMiB int) int64 {
	b.Helper()
	total := int64(defaultMiB) << 20
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

// runMeasured runs cmd after settlePageCache(warm...) and returns what it cost.
func runMeasured(b *testing.B, cmd *exec.Cmd, warm ...string) usage {
	b.Helper()
	settlePageCache(b, warm...)
	start := time.Now()
	out, err := cmd.CombinedOutput()
	wall := time.Since(start)
	if err != nil {
		b.Fatalf("%s: %v\n%s", strings.Join(cmd.Args, " "), err, out)
	}
	ru := cmd.ProcessState.SysUsage().(*syscall.Rusage)
	return usage{wall: wall, cpu: cmd.ProcessState.UserTime() + cmd.ProcessState.SystemTime(), maxRSS: ru.Maxrss << 10}
}

// settlePageCache gives each measured run the same page cache to start from. It writes back the
// dirty pages, so that the run does not pay for the gigabytes the run before it wrote (the kernel
// throttles a writer, and charges it CPU, once dirty pages pass its thresholds); it drops the
// benchmarks' own files from the cache (evictPageCache: the clients' programs stay cached) and
// reads warm back in, so that a client reads its source from memory, as it reads a checkpoint
// the trainer has just written. Without the drop each run's writes grew the cache by gigabytes,
// and on a VM whose memory the host backs only when it is first used (this 2-core machine:
// past about 6 GiB of new memory, writing runs 9× slower) the second and third client of every
// iteration ran slow, whichever client it was.
func settlePageCache(b *testing.B, warm ...string) {
	b.Helper()
	syscall.Sync()
	evictPageCache()
	for _, root := range warm {
		err := forEachFile(root, func(f *os.File) error {
			_, err := io.Copy(io.Discard, f)
			return err
		})
		if err != nil {
			b.Fatalf("warm %s: %v", root, err)
		}
	}
}

// forEachFile calls fn with every regular file under root, open for reading, and returns the
// first error of the walk, an open or fn.
func forEachFile(root string, fn func(*os.File) error) error {
	return filepath.WalkDir(root, func(path string, d fs.DirEntry, err error) error {
		if err != nil || !d.Type().IsRegular() {
			return err
		}
		f, err := os.Open(path)
		if err != nil {
			return err
		}
		defer f.Close()
		return fn(f)
	})
}

func (s *s3Server) awsCmd(b *testing.B, args ...string) *exec.Cmd {
	cmd := exec.Command(awsBin(b), append([]string{"--endpoint-url", s.endpoint}, args...)...)
	cmd.Env = append(os.Environ(), s.env("")...)
	cmd.Env = append(cmd.Env, "HOME="+b.TempDir(), "AWS_EC2_METADATA_DISABLED=true")
	return cmd
}

// uploadWithAgent measures `spotguard run` uploading ckdir's step-000001 as users meet it: the
// agent already running, with a periodic checkpoint of the same size uploaded before (as
// training's earlier checkpoints are, so the store's concurrency has adapted to the link), then
// the checkpoint renamed into place; from the rename until it is committed. CPU is the agent's
// over that time, peak RSS its whole life's (from /proc). The agent is then stopped.
func uploadWithAgent(b *testing.B, s3 *s3Server, ckdir, prefix string) usage {
	b.Helper()
	return uploadWithAgentEnv(b, ckdir, prefix, s3.env(""))
}

// uploadWithAgentEnv is uploadWithAgent with the agent's S3 environment env.
func uploadWithAgentEnv(b *testing.B, ckdir, prefix string, env []string) usage {
	b.Helper()
	return uploadWithAgentMode(b, ckdir, prefix, env, false, nil)
}

// uploadWithAgentMode is uploadWithAgentEnv, and with urgent, a spot interruption notice in IMDS
// (seen by the agent) before the checkpoint is renamed into place: it then sends every file at
// once (checkpoint.DefaultUrgentFiles) instead of two at a time in the background
// (checkpoint.DefaultBackgroundFiles), and commits it labelled notice rather than periodic. A
// model the agent reaches its store through, if not nil, counts from the rename on.
func uploadWithAgentMode(b *testing.B, ckdir, prefix string, env []string, urgent bool, model *s3model.Proxy) usage {
	b.Helper()
	src := filepath.Join(ckdir, "step-000001")
	work := b.TempDir()
	dir := filepath.Join(work, "checkpoints")
	if err := os.Mkdir(dir, 0o755); err != nil {
		b.Fatal(err)
	}
	// stage copies src to work/name, on the checkpoint directory's file system, for a rename.
	stage := func(name string) string {
		to := filepath.Join(work, name)
		if out, err := exec.Command("cp", "-r", src, to).CombinedOutput(); err != nil {
			b.Fatalf("cp -r %s %s: %v\n%s", src, to, err, out)
		}
		return to
	}
	sim := newIMDS(b)
	sim.start("spot", "-d", "100000", "--rebalance-delay-sec", "100000")
	ap := startAgent(b, sim, append([]string{"SPOTGUARD_TRAINER_MATCH=no-trainer-for-this-benchmark",
		"SPOTGUARD_CHECKPOINT_DIR=" + dir, "SPOTGUARD_STORE_URL=s3://" + s3Bucket + "/" + prefix,
		"SPOTGUARD_STORE_JOB=bench", "SPOTGUARD_LOG_LEVEL=warn"}, env...)...)
	pid := ap.cmd.Process.Pid
	var hwm int
	committed := func(trigger string, n int) func() bool {
		return func() bool {
			hwm = max(hwm, procStatusKB(b, pid, "VmHWM"))
			return hasLine(ap.metrics(b), fmt.Sprintf(`spotguard_checkpoints_committed_total{trigger=%q} %d`, trigger, n))
		}
	}
	if err := os.Rename(stage("warm-up"), filepath.Join(dir, "step-000000")); err != nil {
		b.Fatal(err)
	}
	eventually(b, 10*time.Minute, "the warm-up checkpoint to be committed", committed("periodic", 1))
	want := committed("periodic", 2)
	if urgent {
		sim.stop()
		sim.start("spot", "-a", "terminate", "--mock-trigger-time", time.Now().Add(-time.Second).UTC().Format(time.RFC3339),
			"--rebalance-delay-sec", "100000")
		eventually(b, time.Minute, "the agent to see the notice", func() bool {
			st := ap.status(b)
			return st.Uploads != nil && st.Uploads.Urgent
		})
		want = committed("notice", 1)
	}
	staged := stage("staged")
	settlePageCache(b, staged)
	if model != nil {
		model.ResetStats()
	}
	cpu0 := cpuSeconds(b, pid)
	start := time.Now()
	if err := os.Rename(staged, filepath.Join(dir, "step-000001")); err != nil {
		b.Fatal(err)
	}
	eventually(b, 10*time.Minute, "the checkpoint to be committed", want)
	wall := time.Since(start)
	cpu := cpuSeconds(b, pid) - cpu0
	hwm = max(hwm, procStatusKB(b, pid, "VmHWM"))
	if c := ap.status(b).Store.Concurrency; c != nil {
		b.Logf("%s: the store's concurrency: %+v", prefix, *c)
	}
	ap.stop(b)
	sim.stop()
	if err := os.RemoveAll(work); err != nil { // 2 GiB an iteration otherwise, until the benchmark ends
		b.Fatal(err)
	}
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
			filepath.Join(ckdir, "step-000001"), fmt.Sprintf("s3://%s/awscli-%d/", s3Bucket, i)), filepath.Join(ckdir, "step-000001"))
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

// BenchmarkS3Model compares spotguard with awscli, upload (`aws s3 cp --recursive`; the running
// agent from the checkpoint's rename into place to its commit, after an earlier checkpoint (see
// uploadWithAgent), as it uploads in the background, two files at a time, and urgently, with a
// notice pending: spotguard_urgent) and restore (`aws s3 cp --recursive`; `spotguard
// restore`, every checksum verified), on the same BENCH_CKPT_MIB MiB (default 1024) in 8
// files, in three setups:
//
//   - loopback-http: versitygw on 127.0.0.1 over plain HTTP, as BenchmarkUploadVsAWSCLI. Here
//     the server is the bottleneck, and plain HTTP makes both clients hash every byte they
//     upload (SHA-256, see test/s3model), which they do not over TLS.
//   - loopback-tls: the same server over TLS (a throwaway certificate).
//   - model-tls: the scaled model of S3 (test/s3model) in front of the plain server, TLS from the
//     clients to the model: each connection gets 1/50 of the upload ceiling calibrated through
//     the model (modelCeiling) each way (50 = BENCH_S3MODEL_CONNS; BENCH_S3MODEL_CEILING_MBPS
//     skips the calibration),
//     each answer 20 ms more (BENCH_S3MODEL_LATENCY_MS), as one connection gets its share of S3
//     next to a p5's NIC. A client's concurrency shows here.
//
// The sides of each comparison run one after another, the first in turn (inTurn), so that over
// three runs none is always first or last: this machine's speed drifts from run to run. awscli
// runs at its default of 10 concurrent requests (BENCH_AWSCLI_CONCURRENCY, set with `aws
// configure set default.s3.max_concurrent_requests` in a temporary AWS_CONFIG_FILE); spotguard at
// its default store.concurrency and store.part_size unless BENCH_AGENT_CONCURRENCY or
// BENCH_PART_SIZE (SPOTGUARD_STORE_*) say otherwise. Metrics per side (spotguard_, awscli_):
// wall_s and MB/s (awscli: the whole command; the agent: rename to commit), cpu_s and cpu_s/GiB
// (the same span), peak_RSS_MiB; on the
// model also conns (opened), max_conns (open at once), max_in_flight (requests at once), wire_MB/s
// (the data over the time the model was busy), allowed_MB/s (the per-connection cap times
// the connections busy at once, max_conns or max_in_flight, whichever is fewer, at most the
// ceiling) and pct_of_allowed; and reference_MB/s and reference_pct_of_allowed, what the
// calibration's client gets through the model (modelReference). ratio_wall is spotguard's wall
// over awscli's.
func BenchmarkS3Model(b *testing.B) {
	needPeers(b)
	awsBin(b)
	plain, secure := startS3(b), startS3TLS(b)
	ckdir := b.TempDir()
	size := benchDataMiB(b, ckdir, "step-000001", 1024)
	ceiling := modelCeiling(b, plain)
	opts := modelOptions(b, ceiling)
	refParts, ref := modelReference(b, plain, opts, ceiling)
	refAllowed := s3model.Ceiling{Up: min(opts.ConnUpRate*float64(refParts), ceiling.Up), Down: min(opts.ConnDownRate*float64(refParts), ceiling.Down)}
	awsConfig := awscliConfig(b)
	b.Logf("%.2f GiB in 8 files; ceiling through the model (TLS, uncapped) %.0f MB/s up, %.0f MB/s down; model: %.1f MB/s up, %.1f MB/s down a connection, %v first-byte latency; reference (%d parts of 8 MiB at once): %.0f MB/s up (%.0f%% of allowed), %.0f MB/s down (%.0f%%); awscli concurrency %s, agent %s",
		float64(size)/(1<<30), ceiling.Up/1e6, ceiling.Down/1e6, opts.ConnUpRate/1e6, opts.ConnDownRate/1e6, opts.FirstByteLatency,
		refParts, ref.Up/1e6, 100*ref.Up/refAllowed.Up, ref.Down/1e6, 100*ref.Down/refAllowed.Down,
		awscliConcurrency(), strings.Join(benchAgentEnv(), " "))
	setups := []struct {
		name   string
		server *s3Server
		model  bool
	}{
		{"loopback-http", plain, false},
		{"loopback-tls", secure, false},
		{"model-tls", plain, true},
	}
	uploaded := map[*s3Server]string{} // the prefix a spotguard upload committed the checkpoint under
	// The framework may call a sub-benchmark more than once on the same servers (-count, its
	// first run of N=1): every upload goes under a prefix of its own, or the agent would find
	// the checkpoint committed already and rightly send nothing.
	run := 0
	for _, su := range setups {
		open := func(b *testing.B) (s3Endpoint, *s3model.Proxy) {
			if !su.model {
				return su.server.at(), nil
			}
			m := startModel(b, su.server, opts)
			return m.s3Endpoint, m.proxy
		}
		b.Run("upload/"+su.name, func(b *testing.B) {
			for range b.N {
				run++
				i := run
				prefix := fmt.Sprintf("spotguard-%s-%d", su.name, i)
				var awsSide, sgSide, urgentSide benchSide
				inTurn(i, func() {
					at, model := open(b)
					aws := runMeasured(b, at.awscli(b, awsConfig, "s3", "cp", "--recursive", "--only-show-errors",
						filepath.Join(ckdir, "step-000001"), fmt.Sprintf("s3://%s/awscli-%s-%d/", s3Bucket, su.name, i)), filepath.Join(ckdir, "step-000001"))
					awsSide = benchSide{name: "awscli", u: aws, model: model}
				}, func() {
					at, model := open(b)
					sg := uploadWithAgentMode(b, ckdir, prefix, append(at.agentEnv(), benchAgentEnv()...), false, model)
					sgSide = benchSide{name: "spotguard", u: sg, model: model}
				}, func() {
					at, model := open(b)
					urgent := uploadWithAgentMode(b, ckdir, prefix+"-urgent", append(at.agentEnv(), benchAgentEnv()...), true, model)
					urgentSide = benchSide{name: "spotguard_urgent", u: urgent, model: model}
				})
				reportSides(b, size, opts.ConnUpRate, ceiling.Up, awsSide, sgSide, urgentSide)
				if su.model {
					b.ReportMetric(ref.Up/1e6, "reference_MB/s")
					b.ReportMetric(100*ref.Up/refAllowed.Up, "reference_pct_of_allowed")
				}
				// Each iteration stores 5 GiB (warm-ups included); keep only what the restore
				// reads, so that many iterations do not fill the disk.
				su.server.drop(b, fmt.Sprintf("awscli-%s-%d", su.name, i))
				su.server.drop(b, prefix+"-urgent")
				if prev, ok := uploaded[su.server]; ok && prev != prefix {
					su.server.drop(b, prev)
				}
				uploaded[su.server] = prefix
			}
		})
		b.Run("restore/"+su.name, func(b *testing.B) {
			prefix, ok := uploaded[su.server]
			if !ok { // the upload was not run (-bench …/restore/…): upload, unmeasured
				prefix = "restore-" + su.name
				uploadWithAgentEnv(b, ckdir, prefix, append(su.server.at().agentEnv(), benchAgentEnv()...))
				uploaded[su.server] = prefix
			}
			b.ResetTimer()
			for range b.N {
				run++
				var awsSide, sgSide benchSide
				inTurn(run, func() {
					awsDir := b.TempDir()
					at, model := open(b)
					aws := runMeasured(b, at.awscli(b, awsConfig, "s3", "cp", "--recursive", "--only-show-errors",
						fmt.Sprintf("s3://%s/%s/bench/step-000001/", s3Bucket, prefix), awsDir))
					if got := treeBytes(b, awsDir); got < size {
						b.Fatalf("awscli restored %d bytes; want at least %d", got, size)
					}
					if err := os.RemoveAll(awsDir); err != nil { // 1 GiB an iteration otherwise
						b.Fatal(err)
					}
					awsSide = benchSide{name: "awscli", u: aws, model: model}
				}, func() {
					sgDir := b.TempDir()
					at, model := open(b)
					cmd := exec.Command(spotguardBin, "restore", "--config", writeEmptyConfig(b), "--to", sgDir)
					cmd.Env = append(append([]string{"PATH=" + os.Getenv("PATH"), "HOME=" + b.TempDir(),
						"SPOTGUARD_STORE_URL=s3://" + s3Bucket + "/" + prefix, "SPOTGUARD_STORE_JOB=bench"}, at.agentEnv()...), benchAgentEnv()...)
					sg := runMeasured(b, cmd)
					if got := treeBytes(b, sgDir); got < size {
						b.Fatalf("spotguard restored %d bytes; want at least %d", got, size)
					}
					if err := os.RemoveAll(sgDir); err != nil { // 1 GiB an iteration otherwise
						b.Fatal(err)
					}
					sgSide = benchSide{name: "spotguard", u: sg, model: model}
				})
				reportSides(b, size, opts.ConnDownRate, ceiling.Down, awsSide, sgSide)
				if su.model {
					b.ReportMetric(ref.Down/1e6, "reference_MB/s")
					b.ReportMetric(100*ref.Down/refAllowed.Down, "reference_pct_of_allowed")
				}
			}
		})
	}
}

// inTurn runs sides one after another, starting with side i mod len(sides): over len(sides)
// iterations each side runs in each place once.
func inTurn(i int, sides ...func()) {
	for k := range sides {
		sides[(i+k)%len(sides)]()
	}
}

// benchSide is what one client's run cost, and the model it ran through (nil: none).
type benchSide struct {
	name  string
	u     usage
	model *s3model.Proxy
}

// reportSides reports aws and each of the others side by side for size bytes moved, and each
// other's wall and CPU over aws's (ratio_wall, ratio_cpu, suffixed with what follows
// "spotguard" in its name); connCap and ceiling are the model's per-connection cap and the
// server's ceiling in the direction of the transfer.
func reportSides(b *testing.B, size int64, connCap, ceiling float64, aws benchSide, others ...benchSide) {
	b.Helper()
	gib := float64(size) / (1 << 30)
	for _, s := range append([]benchSide{aws}, others...) {
		line := fmt.Sprintf("%s: %v, %.0f MB/s, %.2f cpu s/GiB", s.name, s.u, float64(size)/s.u.wall.Seconds()/1e6, s.u.cpu.Seconds()/gib)
		b.ReportMetric(s.u.wall.Seconds(), s.name+"_wall_s")
		b.ReportMetric(float64(size)/s.u.wall.Seconds()/1e6, s.name+"_MB/s")
		b.ReportMetric(s.u.cpu.Seconds(), s.name+"_cpu_s")
		b.ReportMetric(s.u.cpu.Seconds()/gib, s.name+"_cpu_s/GiB")
		b.ReportMetric(float64(s.u.maxRSS)/(1<<20), s.name+"_peak_RSS_MiB")
		if s.model != nil {
			st := s.model.Stats()
			wire := float64(size) / st.Busy().Seconds()
			allowed := min(connCap*float64(min(st.MaxConns, st.MaxInFlight)), ceiling)
			line += fmt.Sprintf("; on the model: %d connections (%d at once), %d requests (%d at once, %d SlowDown), %.0f MB/s while busy (%s) of %.0f allowed (%.0f%%)",
				st.Conns, st.MaxConns, st.Requests, st.MaxInFlight, st.SlowDowns, wire/1e6, st.Busy().Round(time.Millisecond), allowed/1e6, 100*wire/allowed)
			b.ReportMetric(float64(st.Conns), s.name+"_conns")
			b.ReportMetric(float64(st.MaxConns), s.name+"_max_conns")
			b.ReportMetric(float64(st.MaxInFlight), s.name+"_max_in_flight")
			b.ReportMetric(wire/1e6, s.name+"_wire_MB/s")
			b.ReportMetric(allowed/1e6, s.name+"_allowed_MB/s")
			b.ReportMetric(100*wire/allowed, s.name+"_pct_of_allowed")
		}
		b.Log(line)
	}
	for _, s := range others {
		suffix := strings.TrimPrefix(s.name, "spotguard")
		b.ReportMetric(s.u.wall.Seconds()/aws.u.wall.Seconds(), "ratio_wall"+suffix)
		b.ReportMetric(s.u.cpu.Seconds()/aws.u.cpu.Seconds(), "ratio_cpu"+suffix)
	}
	if aws.model != nil {
		b.ReportMetric(connCap/1e6, "conn_cap_MB/s")
		b.ReportMetric(ceiling/1e6, "ceiling_MB/s")
	}
}

// benchAgentEnv is the agent's settings from BENCH_AGENT_CONCURRENCY and BENCH_PART_SIZE, when
// set (else the defaults of docs/configuration.md).
func benchAgentEnv() []string {
	var env []string
	if v := os.Getenv("BENCH_AGENT_CONCURRENCY"); v != "" {
		env = append(env, "SPOTGUARD_STORE_CONCURRENCY="+v)
	}
	if v := os.Getenv("BENCH_PART_SIZE"); v != "" {
		env = append(env, "SPOTGUARD_STORE_PART_SIZE="+v)
	}
	return env
}

// awscliConcurrency is BENCH_AWSCLI_CONCURRENCY, else awscli's default, 10.
func awscliConcurrency() string {
	if v := os.Getenv("BENCH_AWSCLI_CONCURRENCY"); v != "" {
		return v
	}
	return "10"
}

// awscliConfig writes an awscli shared config with `aws configure set`: region us-east-1 and
// s3.max_concurrent_requests awscliConcurrency(); it returns its path (for AWS_CONFIG_FILE).
func awscliConfig(b *testing.B) string {
	b.Helper()
	dir := b.TempDir()
	config := filepath.Join(dir, "config")
	for _, kv := range [][2]string{{"default.region", "us-east-1"}, {"default.s3.max_concurrent_requests", awscliConcurrency()}} {
		cmd := exec.Command(awsBin(b), "configure", "set", kv[0], kv[1])
		cmd.Env = append(os.Environ(), "AWS_CONFIG_FILE="+config, "HOME="+dir)
		if out, err := cmd.CombinedOutput(); err != nil {
			b.Fatalf("aws configure set %s %s: %v\n%s", kv[0], kv[1], err, out)
		}
	}
	return config
}

// treeBytes is the size of every regular file under root.
func treeBytes(b *testing.B, root string) int64 {
	b.Helper()
	var n int64
	err := filepath.WalkDir(root, func(p string, d os.DirEntry, err error) error {
		if err != nil {
			return err
		}
		if d.Type().IsRegular() {
			fi, err := d.Info()
			if err != nil {
				return err
			}
			n += fi.Size()
		}
		return nil
	})
	if err != nil {
		b.Fatal(err)
	}
	return n
}

// BenchmarkTimeToDurable: a notice arrives, and the trainer writes S bytes (BENCH_DURABLE_MIB,
// default 1024, in 8 files) spread over about BENCH_WRITE_SECONDS (default 8); W is the time it
// really took (notice → marker, from /status). It reports notice → manifest against
// max(W, S/throughput) + 1 s (the target) and W + S/throughput (uploading after the marker), with
// the throughput measured by uploading the same amount first, urgently (a notice pending), as
// the agent uploads after a notice (uploadWithAgentMode). With BENCH_DURABLE_PARALLEL=1 the
// trainer writes its 8 files at once (trainer.py --parallel), as torch DCP's ranks do, so they all
// appear at about W. With BENCH_DURABLE_IN_PLACE=1 it writes them under their own names
// (trainer.py --in-place), as DCP and torch.save(obj, path) do, rather than renaming each into
// place: the agent sends them while they grow.
func BenchmarkTimeToDurable(b *testing.B) {
	needPeers(b)
	s3 := startS3(b)
	timeToDurable(b, 1, s3, func(b *testing.B) (s3Endpoint, *s3model.Proxy) { return s3.at(), nil })
}

// BenchmarkTimeToDurableS3Model is BenchmarkTimeToDurable on the scaled model of S3 (see
// BenchmarkS3Model), against the target max(W, S/throughput) + 1 s.
func BenchmarkTimeToDurableS3Model(b *testing.B) {
	needPeers(b)
	s3 := startS3(b)
	opts := modelOptions(b, modelCeiling(b, s3))
	b.Logf("model: %.1f MB/s up a connection, %v first-byte latency", opts.ConnUpRate/1e6, opts.FirstByteLatency)
	timeToDurable(b, 1, s3, func(b *testing.B) (s3Endpoint, *s3model.Proxy) {
		m := startModel(b, s3, opts)
		return m.s3Endpoint, m.proxy
	})
}

// timeToDurable runs the time-to-durable benchmark with the S3 endpoint that open returns for
// each upload (and the model behind it, if any) in front of server, against the target
// max(W, S/T) + margin s. Each iteration starts with the page cache settled (settlePageCache)
// and frees what it wrote (the trainer's checkpoint, the objects): otherwise each one ran in
// more memory used for the first time, which this machine makes slow (docs/benchmarks.md), and
// the trainer's W and the time after it grew from iteration to iteration (W from 11 to 14 s).
func timeToDurable(b *testing.B, margin float64, server *s3Server, open func(*testing.B) (s3Endpoint, *s3model.Proxy)) {
	wantW := envFloat(b, "BENCH_WRITE_SECONDS", 8)
	mib := envFloat(b, "BENCH_DURABLE_MIB", 1024)
	parallel := envFloat(b, "BENCH_DURABLE_PARALLEL", 0) != 0
	inPlace := envFloat(b, "BENCH_DURABLE_IN_PLACE", 0) != 0
	// Throughput of this server for this size, uploaded after the fact with a notice pending.
	ref := b.TempDir()
	b.Setenv("BENCH_CKPT_MIB", strconv.Itoa(int(mib)))
	size := benchData(b, ref, "step-000001")
	at, _ := open(b)
	up := uploadWithAgentMode(b, ref, "ref", append(at.agentEnv(), benchAgentEnv()...), true, nil)
	throughput := float64(size) / up.wall.Seconds()
	os.RemoveAll(ref)
	server.drop(b, "ref")
	b.ResetTimer()
	for i := range b.N {
		settlePageCache(b)
		sim := newIMDS(b)
		trigger := time.Now().Truncate(time.Second).Add(3 * time.Second)
		sim.start("spot", "-a", "terminate", "--mock-trigger-time", trigger.UTC().Format(time.RFC3339), "--rebalance-delay-sec", "100000")
		ckdir := b.TempDir()
		targs := []string{"--checkpoint-dir", ckdir, "--files", "8", "--checkpoint-mb", strconv.FormatFloat(mib/8, 'f', -1, 64),
			"--write-seconds", strconv.FormatFloat(wantW, 'f', -1, 64)}
		if parallel {
			targs = append(targs, "--parallel")
		}
		if inPlace {
			targs = append(targs, "--in-place")
		}
		tp := startTrainer(b, targs...)
		at, model := open(b)
		ap := startAgent(b, sim, append(append([]string{"SPOTGUARD_TRAINER_PIDFILE=" + tp.pidfile, "SPOTGUARD_NOTICES_REBALANCE=ignore",
			"SPOTGUARD_CHECKPOINT_DIR=" + ckdir, "SPOTGUARD_STORE_URL=s3://" + s3Bucket + fmt.Sprintf("/durable-%d", i),
			"SPOTGUARD_STORE_JOB=bench", "SPOTGUARD_LOG_LEVEL=warn"}, at.agentEnv()...), benchAgentEnv()...)...)
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
		b.Logf("S=%.0f MiB (files written in parallel: %v, in place: %v), trainer took W=%.2fs (asked for %.1fs), throughput %.0f MB/s: notice→durable %.2fs; target max(W,S/T)+%.0f = %.2fs; upload-after-marker W+S/T = %.2fs",
			mib, parallel, inPlace, w, wantW, throughput/1e6, durable, margin, max(w, send)+margin, w+send)
		b.ReportMetric(w, "trainer_write_s")
		b.ReportMetric(durable, "notice_to_durable_s")
		b.ReportMetric(max(w, send)+margin, "target_s")
		b.ReportMetric(w+send, "after_marker_s")
		if model != nil {
			st := model.Stats()
			b.Logf("model: %d requests, at most %d in flight on %d connections", st.Requests, st.MaxInFlight, st.MaxConns)
			b.ReportMetric(float64(st.MaxInFlight), "max_in_flight")
		}
		ap.stop(b)
		tp.cmd.Process.Kill()
		<-tp.done
		sim.stop()
		if err := os.RemoveAll(ckdir); err != nil {
			b.Fatal(err)
		}
		server.drop(b, fmt.Sprintf("durable-%d", i))
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
