#!/usr/bin/env python3
"""spotguard + PyTorch: save with torch.distributed.checkpoint (DCP) when spotguard signals.

The pieces, each usable on its own (see README.md beside this file):

- SaveRequested: catches spotguard's signal in every rank and, at each step boundary, makes all
  ranks agree (one tiny all-reduce) to save at the same step, and whether to exit afterwards.
- save() / resume(): DCP into checkpoint.dir/step-NNNNNN/ and back from the newest directory that
  holds .metadata (what `spotguard restore --to checkpoint.dir` puts there).
- write_marker() / newest_complete(): for trainers that mark a checkpoint with _COMPLETE.

/etc/spotguard/spotguard.yaml for this script:

    trainer:
      match: 'python[0-9.]* -u \\S*dcp_signal\\.py'  # torchrun's workers, not torchrun
      signal: SIGUSR1
    checkpoint:
      dir: /opt/ml/checkpoints
      marker: .metadata        # DCP renames .metadata into place last, after every rank wrote
    store:
      url: s3://your-bucket/checkpoints
      job: your-run-name

Run:  torchrun --nproc-per-node=8 dcp_signal.py --checkpoint-dir /opt/ml/checkpoints
(without a GPU it runs on CPU with gloo; try `kill -USR1 <pid of one worker>`).
Requires PyTorch 2.3 or later (dcp.save/load with checkpoint_id, distributed.checkpoint.state_dict).
"""

import argparse
import json
import math
import os
import re
import signal
import time
from datetime import datetime

import torch
import torch.distributed as dist
import torch.distributed.checkpoint as dcp
from torch.distributed.checkpoint.state_dict import get_state_dict, set_state_dict
from torch.distributed.checkpoint.stateful import Stateful

# spotguard writes this before it signals (agent.runtime_dir; SPOTGUARD_AGENT_RUNTIME_DIR is the
# agent's variable for it, honoured here too if you set it for the trainer).
NOTICE = os.path.join(os.environ.get("SPOTGUARD_AGENT_RUNTIME_DIR", "/run/spotguard"), "notice.json")


class SaveRequested:
    """spotguard's signal, turned into a decision that every rank agrees on.

    Create it first thing in every rank: it installs the handlers, and spotguard sends its signal
    only to processes that catch it (a notice during a slow start-up is then kept for the first
    poll instead of being lost). Then call poll() at every step boundary, on every rank, the same
    number of times: it is a collective (one all-reduce of two float64 numbers) and returns

      NONE  nothing asked;
      SAVE  save now and keep training: a rebalance recommendation, a manual `kill -USR1`
            (no notice.json), or a notice whose deadline is more than exit_within away (a
            scheduled event; the exit then comes by itself exit_within before that deadline);
      EXIT  save now, then exit 0: spot terminate/stop/hibernate, ASG termination, a deadline
            within exit_within seconds, or SIGTERM (if sigterm=True).

    A rank that got no signal takes the highest answer of any rank (MAX), so when one node is
    reclaimed every rank of the job saves at the same step. After a non-NONE answer,
    self.deadline is the earliest notice deadline any rank knows (Unix seconds) or None, and
    self.notice this rank's notice.json (or None).
    """

    NONE, SAVE, EXIT = 0, 1, 2

    def __init__(self, signum=signal.SIGUSR1, notice_path=NOTICE, exit_within=300.0,
                 sigterm=True, every=1, device=None):
        self.notice_path = notice_path
        self.exit_within = exit_within
        self.every = max(1, int(every))  # poll the collective only every N calls (a host sync each)
        self.device = device
        self.deadline = None
        self.notice = None
        self._signalled = False
        self._term = False
        self._exit_at = math.inf
        self._calls = 0
        signal.signal(signum, self._on_signal)
        if sigterm:
            signal.signal(signal.SIGTERM, self._on_term)

    # Handlers only set a flag: Python runs them in the main thread between two bytecodes, so
    # they must not touch CUDA, NCCL or files.
    def _on_signal(self, signum, frame):
        self._signalled = True

    def _on_term(self, signum, frame):
        self._term = True

    def _local(self):
        """(answer, deadline) as this rank sees it; consumes its signal."""
        code, deadline = self.NONE, math.inf
        if self._signalled:
            self._signalled = False
            code = self.SAVE
            self.notice = _read_json(self.notice_path)
            notice = self.notice or {}
            when = _parse_time(notice.get("deadline"))
            if when is not None:
                deadline = when
            if notice and notice.get("source") != "rebalance":
                if when is None or when - time.time() <= self.exit_within:
                    code = self.EXIT
                else:  # far away (scheduled event): save now, exit when it comes near
                    self._exit_at = min(self._exit_at, when - self.exit_within)
        if time.time() >= self._exit_at:
            code, deadline = self.EXIT, min(deadline, self._exit_at + self.exit_within)
        if self._term:
            code = self.EXIT
        return code, deadline

    def poll(self):
        self._calls += 1
        if self._calls % self.every:
            return self.NONE
        code, deadline = self._local()
        if dist.is_available() and dist.is_initialized():
            # MAX of [answer, -deadline]: the highest answer and the earliest deadline of all ranks.
            t = torch.tensor([float(code), -deadline], dtype=torch.float64, device=self._device())
            dist.all_reduce(t, op=dist.ReduceOp.MAX)
            answer, neg = t.tolist()
            code, deadline = int(answer), -neg
        self.deadline = None if math.isinf(deadline) else deadline
        return code

    def _device(self):
        if self.device is None:
            backend = str(dist.get_backend())
            # NCCL alone needs a CUDA tensor (on the device set with torch.cuda.set_device);
            # gloo, or "cuda:nccl,cpu:gloo", takes a CPU one.
            if "nccl" in backend and "gloo" not in backend:
                self.device = torch.device("cuda", torch.cuda.current_device())
            else:
                self.device = torch.device("cpu")
        return self.device


def _read_json(path):
    try:
        with open(path) as f:
            return json.load(f)
    except (OSError, ValueError):
        return None


def _parse_time(s):
    """RFC 3339 (Go writes up to 9 fractional digits) to Unix seconds; None if absent or bad."""
    m = re.match(r"(\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d)(\.\d+)?(Z|[+-]\d\d:\d\d)$", s or "")
    if not m:
        return None
    tz = "+00:00" if m.group(3) == "Z" else m.group(3)
    return datetime.fromisoformat(m.group(1) + tz).timestamp() + float("0" + (m.group(2) or ""))


def write_marker(directory, name="_COMPLETE", body=b""):
    """Make directory/name appear at once (temporary name, then rename), after everything else.
    The temporary name starts with "." and ends in ".tmp", which spotguard skips. Keep body the
    same on every node (multinode.md). spotguard reads through the page cache: no fsync is needed
    for the upload; fsync the files first if the local copy must also survive a crash."""
    tmp = os.path.join(directory, "." + name + ".tmp")
    with open(tmp, "wb") as f:
        f.write(body)
    os.replace(tmp, os.path.join(directory, name))


def newest_complete(root, marker=".metadata", prefix="step-"):
    """(step, path) of the newest root/<prefix>N/ that holds marker, or None."""
    pattern = re.compile(re.escape(prefix) + r"(\d+)$")
    best = None
    for name in os.listdir(root) if os.path.isdir(root) else []:
        m = pattern.match(name)
        path = os.path.join(root, name)
        if m and os.path.isfile(os.path.join(path, marker)):
            if best is None or int(m.group(1)) > best[0]:
                best = (int(m.group(1)), path)
    return best


class AppState(Stateful):
    """Model and optimizer for DCP, whatever the wrapping (DDP, FSDP, FSDP2, TP)."""

    def __init__(self, model, optimizer):
        self.model, self.optimizer = model, optimizer

    def state_dict(self):
        model_sd, optim_sd = get_state_dict(self.model, self.optimizer)
        return {"model": model_sd, "optim": optim_sd}

    def load_state_dict(self, state_dict):
        set_state_dict(self.model, self.optimizer,
                       model_state_dict=state_dict["model"], optim_state_dict=state_dict["optim"])


def save(root, step, model, optimizer):
    """DCP save into root/step-NNNNNN/ (collective: every rank calls it).

    Every rank writes its own __<rank>_<n>.distcp; then the coordinator (rank 0) writes
    .metadata.tmp and renames it to .metadata (spotguard's marker), and only after that does
    dcp.save return on any rank. spotguard has been streaming the .distcp files meanwhile."""
    path = os.path.join(root, "step-%06d" % step)
    if not dist.is_initialized() or dist.get_rank() == 0:
        os.makedirs(path, exist_ok=True)  # created on rank 0's node: see multinode.md (shared FS)
    if dist.is_initialized():
        dist.barrier()
    dcp.save({"app": AppState(model, optimizer)}, checkpoint_id=path)
    return path


def resume(root, model, optimizer):
    """Load the newest complete checkpoint under root; return its step (0 if none).
    Rank 0 chooses, so every rank loads the same one."""
    found = newest_complete(root)
    if dist.is_initialized():
        box = [found]
        dist.broadcast_object_list(box, src=0)
        found = box[0]
    if found is None:
        return 0
    dcp.load({"app": AppState(model, optimizer)}, checkpoint_id=found[1])
    return found[0]


def main():
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--checkpoint-dir", required=True, help="spotguard's checkpoint.dir")
    p.add_argument("--steps", type=int, default=1_000_000)
    p.add_argument("--save-every", type=int, default=1000, help="periodic saves (0: only on a notice)")
    args = p.parse_args()

    req = SaveRequested()  # first of all: spotguard signals only processes that catch the signal

    cuda = torch.cuda.is_available()
    if cuda:
        torch.cuda.set_device(int(os.environ.get("LOCAL_RANK", "0")))
    dist.init_process_group("nccl" if cuda else "gloo")
    device = torch.device("cuda", torch.cuda.current_device()) if cuda else torch.device("cpu")
    rank = dist.get_rank()

    model = torch.nn.parallel.DistributedDataParallel(
        torch.nn.Linear(1024, 1024).to(device), device_ids=[device.index] if cuda else None)
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-3)
    step = resume(args.checkpoint_dir, model, optimizer)
    if rank == 0:
        print("starting at step %d" % step, flush=True)

    while step < args.steps:
        loss = model(torch.randn(32, 1024, device=device)).square().mean()
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
        step += 1

        what = req.poll()  # every rank, every step: the same answer everywhere
        if what != SaveRequested.NONE or (args.save_every and step % args.save_every == 0):
            t0 = time.monotonic()
            path = save(args.checkpoint_dir, step, model, optimizer)
            if rank == 0:
                left = "" if req.deadline is None else "; deadline in %.0f s" % (req.deadline - time.time())
                print("saved %s in %.1f s%s" % (path, time.monotonic() - t0, left), flush=True)
        if what == SaveRequested.EXIT:
            if rank == 0:
                print("exiting after the notice's checkpoint at step %d" % step, flush=True)
            break

    dist.destroy_process_group()
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
