#!/usr/bin/env bash
# The GPU checks for a machine with NVIDIA GPUs (issue 14), run from the repository root on that
# machine. It needs no Go there: build the pieces here first, then carry bin/device:
#
#   test/device/gpu.sh --build          # here: bin/device/{spotguard,nvml.test,ec2-metadata-mock}
#   test/device/gpu.sh                  # there: prints everything, writes $OUT/ (or ./device-out/)
#
# It runs: the NVML adapter's tests against the real libnvidia-ml.so.1 (TestOpenDefaultLibrary logs
# what NVML reports), `spotguard gpu` and `--json`, `spotguard gpu --probe --json` (device-to-device
# bandwidth vs the NVML peak: the per-architecture copy efficiency, measured), GPM as root and as an
# unprivileged user with and without CAP_PERFMON, and the agent's GPU series for 60 s (/metrics,
# /status).
set -uo pipefail
cd "$(dirname "$0")/../.."
B=bin/device

if [ "${1:-}" = "--build" ]; then
	set -e
	mkdir -p "$B"
	export CGO_CFLAGS="${CGO_CFLAGS:--O2 -g -Wno-deprecated-declarations}"
	go build -o "$B/spotguard" ./cmd/spotguard
	go test -c -o "$B/nvml.test" ./nvml
	cp bin/ec2-metadata-mock "$B/" 2>/dev/null || GOBIN="$PWD/$B" go -C test/tools install github.com/aws/amazon-ec2-metadata-mock/cmd/ec2-metadata-mock
	ls -la "$B"
	exit 0
fi

OUT="${OUT:-$PWD/device-out}"
mkdir -p "$OUT"
step() { echo; echo "=== $*"; }
step "machine"; nvidia-smi 2>&1 | head -20; nvidia-smi -q -d CLOCK,PERFORMANCE 2>&1 | head -80 > "$OUT/nvidia-smi-q.txt"
step "NVML adapter against the real library"
"$B/nvml.test" -test.run 'TestOpenDefaultLibrary' -test.v 2>&1 | tail -40
step "spotguard gpu"; time "$B/spotguard" gpu; echo "exit $?"
"$B/spotguard" gpu --json > "$OUT/gpu.json"; echo "exit $? (gpu --json in $OUT/gpu.json)"
step "spotguard gpu --probe --json"
time "$B/spotguard" gpu --probe --json > "$OUT/probe.json"; echo "exit $?"
cat "$OUT/probe.json"
step "GPM: as root, then as nobody without and with CAP_PERFMON"
"$B/spotguard" gpu --samples 2 --json | grep -E '"(DRAMBandwidthUtilPercent|AchievedMemBandwidth)"' | head -4
if command -v setpriv >/dev/null; then
	cp "$B/spotguard" /tmp/spotguard-perfmon && chmod 755 /tmp/spotguard-perfmon
	setpriv --reuid=65534 --regid=65534 --clear-groups /tmp/spotguard-perfmon gpu --samples 2 --json 2>&1 | grep -E '"DRAMBandwidthUtilPercent"|no NVML' | head -2
	setpriv --reuid=65534 --regid=65534 --clear-groups --inh-caps=+perfmon --ambient-caps=+perfmon /tmp/spotguard-perfmon gpu --samples 2 --json 2>&1 | grep -E '"DRAMBandwidthUtilPercent"|no NVML' | head -2
fi
step "the agent's GPU series for 60 s"
"$B/ec2-metadata-mock" -I -x -1 -n 127.0.0.1 -p 18411 > "$OUT/imds.log" 2>&1 &
IMDS=$!
cat > "$OUT/agent.yaml" <<YAML
imds:
  endpoint: http://127.0.0.1:18411
http:
  listen: 127.0.0.1:19402
trainer:
  match: no-trainer-on-this-machine
metrics:
  cloudwatch: false
YAML
"$B/spotguard" run --config "$OUT/agent.yaml" > "$OUT/agent.log" 2>&1 &
AGENT=$!
sleep 60
curl -s 127.0.0.1:19402/metrics | grep '^spotguard_gpu' > "$OUT/metrics.txt"
curl -s 127.0.0.1:19402/status > "$OUT/status.json"
kill $AGENT $IMDS; wait $AGENT $IMDS 2>/dev/null
wc -l "$OUT/metrics.txt"; head -60 "$OUT/metrics.txt"
grep -i gpu "$OUT/agent.log" | head -20
