#!/usr/bin/env bash
# Runs the notice path on this machine: AWS's IMDS simulator announces a spot reclaim 5 s after it
# starts, spotguard (built into /tmp/spotguard-demo, run with --config examples/local.yaml) signals
# the example trainer, the trainer writes a checkpoint, spotguard streams it into a file:// store
# and commits it, and `spotguard restore` brings it back, verified. Prints the timeline.
set -euo pipefail
cd "$(dirname "$0")/.."
demo=/tmp/spotguard-demo
# The simulator's port and the agent's listener (examples/local.yaml): an installed agent listens
# on 9402 too, and the demo would read its /status, not its own agent's.
for port in 1338 9402; do
  if (exec 3<>"/dev/tcp/127.0.0.1/$port") 2>/dev/null; then
    echo "FAIL: 127.0.0.1:$port is in use (an installed spotguard listens on 9402: stop it for the demo, sudo systemctl stop spotguard)"
    exit 1
  fi
done
rm -rf "$demo"; mkdir -p "$demo/checkpoints"

echo "== building the IMDS simulator (pinned in test/tools/go.mod) and spotguard"
make -s tools
go build -o "$demo/spotguard" ./cmd/spotguard

pids=()
cleanup() { for p in "${pids[@]}"; do kill "$p" 2>/dev/null || true; done; wait 2>/dev/null || true; }
trap cleanup EXIT

bin/ec2-metadata-mock spot -a terminate -d 5 --rebalance-delay-sec 100000 \
  -I -x -1 -n 127.0.0.1 -p 1338 >"$demo/imds.log" 2>&1 &
pids+=($!)
python3 examples/python/trainer.py --checkpoint-dir "$demo/checkpoints" --pidfile "$demo/trainer.pid" \
  --signal-log "$demo/signals.jsonl" --ready-file "$demo/trainer.ready" >"$demo/trainer.log" 2>&1 &
pids+=($!)
for _ in $(seq 100); do [ -e "$demo/trainer.ready" ] && break; sleep 0.1; done

echo "== spotguard run --config examples/local.yaml (log: $demo/agent.log)"
start=$(date +%s.%N)
"$demo/spotguard" run --config examples/local.yaml >"$demo/agent.log" 2>&1 &
agent=$!
pids+=($agent)

for _ in $(seq 300); do [ -s "$demo/signals.jsonl" ] && break; sleep 0.1; done
if [ ! -s "$demo/signals.jsonl" ]; then
  echo "FAIL: the trainer received no signal within 30 s"; cat "$demo/agent.log"; exit 1
fi
state() { curl -s 127.0.0.1:9402/status | python3 -c 'import json,sys; print(" ".join(n["state"] for n in json.load(sys.stdin)["notices"]))'; }
for _ in $(seq 300); do [ "$(state)" = committed ] && break; sleep 0.1; done
if [ "$(state)" != committed ]; then
  echo "FAIL: the checkpoint was not committed within 30 s"; cat "$demo/agent.log"; exit 1
fi

echo "== what happened"
python3 - "$demo" "$start" <<'PY'
import json, sys, urllib.request, pathlib
demo, start = pathlib.Path(sys.argv[1]), float(sys.argv[2])
st = json.load(urllib.request.urlopen("http://127.0.0.1:9402/status"))
for n in st["notices"]:
    print(f"notice {n['key']}: {n['state']} (deadline {n['deadline']})")
    for t in n["transitions"]:
        print(f"  {t['state']:<24} +{t['since_detected_ms']:.1f} ms  {t.get('detail','')}")
for line in (demo / "signals.jsonl").read_text().splitlines():
    r = json.loads(line)
    print(f"trainer pid {r['pid']} received {r['signal']} {r['time_ns']/1e9 - start:.2f} s after the agent started")
print("notice.json:", (demo / "run" / "notice.json").read_text().strip())
done = sorted(p.parent.name for p in (demo / "checkpoints").glob("*/_COMPLETE"))
print("checkpoints written by the trainer:", ", ".join(done) or "none yet")
PY
kill -TERM "$agent"; wait "$agent" && echo "== spotguard stopped cleanly on SIGTERM"

echo "== the next instance: spotguard restore --to $demo/restored"
"$demo/spotguard" restore --config examples/local.yaml --to "$demo/restored"
ckpt=$(ls "$demo/restored")
diff -r "$demo/checkpoints/$ckpt" "$demo/restored/$ckpt" && echo "== $ckpt restored bit for bit"
"$demo/spotguard" list --config examples/local.yaml
