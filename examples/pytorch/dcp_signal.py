#!/usr/bin/env python3
r"""spotguard + PyTorch: save with torch.distributed.checkpoint (DCP) when spotguard signals.

The pieces, each usable on its own (see README.md beside this file):

- SaveRequested: catches spotguard's signal in every rank and, at each step boundary, makes all
  ranks agree (one tiny all-reduce) to save at the same step, and whether to exit afterwards.
  Multi-node: each node's local rank 0 then hands the notice to its own agent (POST /notice), so
  that the agents that got no notice from their IMDS upload urgently too.
- save() / resume(): DCP into checkpoint.dir/step-NNNNNN/ and back from the newest directory that
  holds .metadata (what `spotguard restore --to checkpoint.dir` puts there).
- save_files() / resume_files(): torch.save, a file per rank, into checkpoint.dir/step-NNNNNN/ with a
  _COMPLETE marker, and back; any PyTorch version.
- write_marker() / newest_complete(): for trainers that mark a checkpoint with _COMPLETE.

/etc/spotguard/spotguard.yaml for this script:

    trainer:
      match: 'python[0-9.]* -u \S*dcp_signal\.py'  # torchrun's workers, not torchrun
      signal: SIGUSR1
    checkpoint:
      dir: /opt/ml/checkpoints
      marker: .metadata        # DCP renames .metadata into place last, after every rank wrote
    store:
      url: s3://your-bucket/checkpoints
      job: your-run-name

Run:  torchrun --nproc-per-node=8 dcp_signal.py --checkpoint-dir /opt/ml/checkpoints
(without a GPU it runs on CPU with gloo; try `kill -USR1 <pid of one worker>`).
save()/resume() (DCP) need PyTorch 2.3 or later (dcp.save/load with checkpoint_id,
distributed.checkpoint.state_dict); the rest works with any version: with an older one, run with
--save-with torch (torch.save, a file per rank; checkpoint.marker: _COMPLETE).
"""

import argparse
import json
import math
import os
import re
import signal
import sys
import time
import urllib.error
import urllib.request
from datetime import datetime, timezone

import torch
import torch.distributed as dist

try:  # PyTorch 2.3 or later; SaveRequested, save_files() and the markers work with any version
    import torch.distributed.checkpoint as dcp
    from torch.distributed.checkpoint.state_dict import get_state_dict, set_state_dict
    from torch.distributed.checkpoint.stateful import Stateful
except ImportError as e:
    dcp, _NO_DCP, Stateful = None, e, object

# spotguard writes this before it signals (agent.runtime_dir; SPOTGUARD_AGENT_RUNTIME_DIR is the
# agent's variable for it, honoured here too if you set it for the trainer).
NOTICE = os.path.join(os.environ.get("SPOTGUARD_AGENT_RUNTIME_DIR", "/run/spotguard"), "notice.json")

# This node's agent's listener (http.listen; SPOTGUARD_HTTP_LISTEN is honoured here too).
AGENT = os.environ.get("SPOTGUARD_HTTP_LISTEN", "127.0.0.1:9402")

# The actions a notice may carry, least severe first, as spotguard ranks them in notice.json (the
# scheduled event codes rank alike). poll() all-reduces an index into it (MAX), so every rank knows
# the most severe notice of the job.
ACTIONS = ("rebalance", "Terminated", "system-maintenance", "system-reboot", "instance-reboot",
           "instance-retirement", "instance-stop", "hibernate", "stop", "terminate")


# A signal at most this long after the job decided to save, for the same notices, is part of that
# decision (see SaveRequested._seen).
SAME_SIGNAL = 1.0


class SaveRequested:
    """spotguard's signal, turned into a decision that every rank agrees on.

    Create it first thing in every rank: it installs the handlers, and spotguard sends its signal
    only to processes that catch it (a notice during a slow start-up is then kept for the first
    poll instead of being lost). Then call poll() at every step boundary, on every rank, the same
    number of times: it is a collective (one all-reduce of three float64 numbers) and returns

      NONE  nothing asked;
      SAVE  save now and keep training: a rebalance recommendation, a manual `kill -USR1`
            (no notice.json), or a notice whose deadline is more than exit_within away (a
            scheduled event; the exit then comes by itself exit_within before that deadline);
      EXIT  save now, then exit 0: spot terminate/stop/hibernate, ASG termination, a deadline
            within exit_within seconds, or SIGTERM (if sigterm=True).

    A rank that got no signal takes the highest answer of any rank (MAX), so when one node is
    reclaimed every rank of the job saves at the same step. After a non-NONE answer,
    self.deadline is the earliest notice deadline any rank knows (Unix seconds) or None,
    self.action the most severe notice's action any rank knows (or None: no notice.json, SIGTERM)
    and self.notice this rank's notice.json (or None).

    Only the reclaimed node's agent got the notice. So after a non-NONE answer with an action and
    a deadline, each node's local rank 0 (LOCAL_RANK, as torchrun sets it) hands it to its own
    agent: POST http://<agent>/notice {"source": "job", "action", "deadline"}, before the save, so
    that agent uploads this node's part urgently (and a stop waits for it) without signalling
    anyone. Not when this node's notice.json already lists that notice (the node that got it, or a
    second poll), and never more than once per notice. It waits at most notify_timeout seconds and
    never raises: a failure is printed and training goes on. agent=None turns it off.
    """

    NONE, SAVE, EXIT = 0, 1, 2

    def __init__(self, signum=signal.SIGUSR1, notice_path=NOTICE, exit_within=300.0,
                 sigterm=True, every=1, device=None, agent=AGENT, local_rank=None, notify_timeout=1.0,
                 same_signal=SAME_SIGNAL):
        self.notice_path = notice_path
        self.exit_within = exit_within
        self.every = max(1, int(every))  # poll the collective only every N calls (a host sync each)
        self.device = device
        self.agent = agent
        self.local_rank = int(os.environ.get("LOCAL_RANK", "0")) if local_rank is None else local_rank
        self.notify_timeout = notify_timeout
        self.same_signal = same_signal
        self.deadline = None
        self.action = None
        self.notice = None
        self._signalled = False
        self._signal_at = 0.0  # time.monotonic() of the last signal
        self._decided = None  # (time.monotonic(), notice.json's list) at the last non-NONE answer
        self._term = False
        self._exit_at = math.inf
        self._exit_severity = 0
        self._handed = None  # (action, deadline) last handed to the agent
        self._calls = 0
        signal.signal(signum, self._on_signal)
        if sigterm:
            signal.signal(signal.SIGTERM, self._on_term)

    # Handlers only set a flag: Python runs them in the main thread between two bytecodes, so
    # they must not touch CUDA, NCCL or files.
    def _on_signal(self, signum, frame):
        self._signal_at = time.monotonic()
        self._signalled = True

    def _on_term(self, signum, frame):
        self._term = True

    def _local(self):
        """(answer, deadline, severity) as this rank sees it; consumes its signal. severity is
        1 + the index of the notice's action in ACTIONS (an unknown one counts as terminate), 0
        for none."""
        code, deadline, severity = self.NONE, math.inf, 0
        if self._signalled:
            self._signalled = False
            notice = _read_json(self.notice_path)
            if not self._seen(notice):  # else the job has saved for it already
                code = self.SAVE
                self.notice = notice
                notice = notice or {}
                when = _parse_time(notice.get("deadline"))
                if when is not None:
                    deadline = when
                if notice:
                    action = notice.get("action")
                    severity = ACTIONS.index(action) + 1 if action in ACTIONS else len(ACTIONS)
                if notice and notice.get("source") != "rebalance":
                    if when is None or when - time.time() <= self.exit_within:
                        code = self.EXIT
                    else:  # far away (scheduled event): save now, exit when it comes near
                        self._exit_at = min(self._exit_at, when - self.exit_within)
                        self._exit_severity = max(self._exit_severity, severity)
        if time.time() >= self._exit_at:
            code, deadline = self.EXIT, min(deadline, self._exit_at + self.exit_within)
            severity = max(severity, self._exit_severity)
        if self._term:
            code = self.EXIT
        return code, deadline, severity

    def poll(self):
        self._calls += 1
        if self._calls % self.every:
            return self.NONE
        code, deadline, severity = self._local()
        if dist.is_available() and dist.is_initialized():
            # MAX of [answer, -deadline, severity]: the highest answer, the earliest deadline and
            # the most severe action of all ranks.
            t = torch.tensor([float(code), -deadline, float(severity)], dtype=torch.float64, device=self._device())
            dist.all_reduce(t, op=dist.ReduceOp.MAX)
            answer, neg, sev = t.tolist()
            code, deadline, severity = int(answer), -neg, int(sev)
        self.deadline = None if math.isinf(deadline) else deadline
        self.action = ACTIONS[severity - 1] if severity else None
        if code != self.NONE:
            # What this rank's own signal read counts too: the agent may be rewriting the file.
            self._decided = (time.monotonic(), _listed(_read_json(self.notice_path)) | _listed(self.notice))
            self._hand_to_agent()
        return code

    def _seen(self, notice):
        """Whether this rank's signal is one the job has saved for already: spotguard signals
        every rank of a notice within milliseconds, so one rank may get it just after another's
        poll() and before its own all-reduce returned. Its next poll() would then save a second
        time, at the next step. A signal that came within same_signal seconds of the last
        non-NONE answer, while notice.json lists no notice it did not list then, is that same
        signal. (The agent rewrites notice.json after it signals, with the processes it signalled,
        and removes it for a moment as it restarts: neither is a new notice.)"""
        d = self._decided
        return d is not None and self._signal_at - d[0] < self.same_signal and _listed(notice) <= d[1]

    def _hand_to_agent(self):
        """On each node's local rank 0: POST the job's notice to this node's agent, unless it is
        off, there is no notice with a deadline (a manual kill, SIGTERM, a rebalance), the agent
        already lists it, or it was handed on already."""
        if self.agent is None or self.local_rank != 0 or self.action is None or self.deadline is None:
            return
        key = (self.action, round(self.deadline, 3))
        if key == self._handed:
            return
        if _agent_holds(self.notice_path, self.action, self.deadline):
            self._handed = key  # this node's own notice, or handed on before
            return
        if post_notice(self.agent, self.action, self.deadline, self.notify_timeout):
            self._handed = key

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


def _listed(notice):
    """The notices notice.json lists in force, each as what tells it from another (a notice that
    ends and comes back is read again: a new detected_at); an empty set without one."""
    out = set()
    for n in (notice or {}).get("active") or ():
        if isinstance(n, dict):
            out.add(json.dumps([n.get(k) for k in ("source", "action", "event_id", "detected_at", "posted_at")]))
    return out


def post_notice(agent, action, deadline, timeout=1.0):
    """POST {"source": "job", "action": action, "deadline": deadline (Unix seconds)} to the
    spotguard agent listening on agent (host:port). Returns whether it took the notice; never
    raises (urllib, standard library only)."""
    when = datetime.fromtimestamp(deadline, timezone.utc).isoformat(timespec="milliseconds").replace("+00:00", "Z")
    body = json.dumps({"source": "job", "action": action, "deadline": when}).encode()
    req = urllib.request.Request("http://%s/notice" % agent, data=body, method="POST",
                                 headers={"Content-Type": "application/json"})
    try:
        with urllib.request.urlopen(req, timeout=timeout) as resp:
            answer = json.load(resp)
        print("spotguard agent %s took the job's notice: %s %s (deadline %s)" % (
            agent, answer.get("result"), answer.get("notice", {}).get("key"), when), flush=True)
        return True
    except urllib.error.HTTPError as e:
        print("spotguard agent %s refused the job's notice: %s %s" % (
            agent, e.code, e.read(4096).decode(errors="replace").strip()), file=sys.stderr, flush=True)
    except (OSError, ValueError) as e:  # not running, timed out, not JSON
        print("cannot hand the job's notice to the spotguard agent %s: %s" % (agent, e), file=sys.stderr, flush=True)
    return False


def _agent_holds(notice_path, action, deadline):
    """Whether this node's notice.json lists a notice with action due no later than deadline
    (+1 s for rounding): the agent has it already."""
    held = _read_json(notice_path) or {}
    for n in held.get("active") or []:
        when = _parse_time(n.get("deadline"))
        if n.get("action") == action and when is not None and when <= deadline + 1:
            return True
    return False


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


def remove_marker(directory, name="_COMPLETE"):
    """Before saving into directory again (a run rolled back saves a step it had saved): take its
    marker away first, so that neither spotguard nor a resume takes the files of two saves for one
    checkpoint while the new save is half written. (spotguard also holds a checkpoint whose files
    are written again after its marker until the marker is written again.)"""
    try:
        os.remove(os.path.join(directory, name))
    except FileNotFoundError:
        pass


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


def _need_dcp():
    if dcp is None:
        raise RuntimeError("torch.distributed.checkpoint with get_state_dict needs PyTorch 2.3 or later "
                           "(this is %s: %s); use save_files()/resume_files() (--save-with torch, "
                           "checkpoint.marker: _COMPLETE)" % (torch.__version__, _NO_DCP))


def save(root, step, model, optimizer):
    """DCP save into root/step-NNNNNN/ (collective: every rank calls it).

    Every rank writes its own __<rank>_<n>.distcp; then the coordinator (rank 0) writes
    .metadata.tmp and renames it to .metadata (spotguard's marker), and only after that does
    dcp.save return on any rank. spotguard has been streaming the .distcp files meanwhile."""
    _need_dcp()
    path = os.path.join(root, "step-%06d" % step)
    if not dist.is_initialized() or dist.get_rank() == 0:
        os.makedirs(path, exist_ok=True)  # created on rank 0's node: see multinode.md (shared FS)
        remove_marker(path, ".metadata")  # a step saved again: not complete until the new one
    if dist.is_initialized():
        dist.barrier()
    dcp.save({"app": AppState(model, optimizer)}, checkpoint_id=path)
    return path


def _newest_on_rank0(root, marker):
    """newest_complete(root, marker) as rank 0 sees it, on every rank (collective)."""
    found = newest_complete(root, marker)
    if dist.is_initialized():
        box = [found]
        dist.broadcast_object_list(box, src=0)
        found = box[0]
    return found


def resume(root, model, optimizer):
    """Load the newest complete checkpoint under root; return its step (0 if none).
    Rank 0 chooses, so every rank loads the same one."""
    found = _newest_on_rank0(root, ".metadata")
    if found is None:
        return 0
    _need_dcp()
    # Rank 0's choice, under this node's root (node-local disks may be mounted elsewhere).
    dcp.load({"app": AppState(model, optimizer)}, checkpoint_id=os.path.join(root, os.path.basename(found[1])))
    return found[0]


def save_files(root, step, model, optimizer, marker="_COMPLETE", every_node=False):
    """torch.save into root/step-NNNNNN/rank-<rank>.pt, every rank its own file (collective: every
    rank calls it), then, once every rank has written (a barrier), rank 0 writes marker. Any
    PyTorch version; checkpoint.marker: _COMPLETE. spotguard streams each rank's file once it is
    closed, so the upload overlaps the other ranks' writes.

    One node, or several on a shared file system: every_node=False. Several nodes on node-local
    disks (store.world_nodes > 1, docs/multinode.md): every_node=True, and each node's local rank 0
    writes the marker, with the same body on every node (the step and an id rank 0 draws for this
    save), so that the agents tell this save's parts from another save of the same step."""
    path = os.path.join(root, "step-%06d" % step)
    rank = dist.get_rank() if dist.is_initialized() else 0
    marks = rank == 0 or (every_node and int(os.environ.get("LOCAL_RANK", "0")) == 0)
    box = [None]
    if rank == 0:
        os.makedirs(path, exist_ok=True)  # first, on rank 0's node: see multinode.md (shared FS)
        box = [os.urandom(8).hex()]  # this save's id
    if marks:
        os.makedirs(path, exist_ok=True)  # every other node's own, on node-local disks
        remove_marker(path, marker)  # saved again: not complete until this save's marker
    if dist.is_initialized():
        dist.broadcast_object_list(box, src=0)  # the others go on once rank 0 has made path
        if every_node:
            dist.barrier()  # and once every node's old marker is gone
    os.makedirs(path, exist_ok=True)
    torch.save({"step": step, "model": model.state_dict(), "optim": optimizer.state_dict()},
               os.path.join(path, "rank-%d.pt" % rank))
    if dist.is_initialized():
        dist.barrier()  # every rank has written (a broadcast is no barrier for its source)
    if rank == 0 or (every_node and int(os.environ.get("LOCAL_RANK", "0")) == 0):
        write_marker(path, marker, ("step %d save %s\n" % (step, box[0])).encode() if every_node else b"")
    return path


def resume_files(root, model, optimizer, marker="_COMPLETE"):
    """Load what save_files() wrote into the newest root/step-N/ that holds marker; return its
    step (0 if none). Rank 0 chooses, so every rank loads the same one."""
    found = _newest_on_rank0(root, marker)
    if found is None:
        return 0
    rank = dist.get_rank() if dist.is_initialized() else 0
    # Rank 0's choice, under this node's root (node-local disks may be mounted elsewhere).
    path = os.path.join(root, os.path.basename(found[1]), "rank-%d.pt" % rank)
    state = torch.load(path, map_location="cpu")
    model.load_state_dict(state["model"])
    optimizer.load_state_dict(state["optim"])
    return found[0]


class _Inputs(torch.utils.data.Dataset):
    """64 random inputs: an epoch of two batches."""

    def __len__(self):
        return 64

    def __getitem__(self, i):
        return torch.randn(1024)


def _batches(workers):
    """Batches of 32 random inputs for ever; with workers, from a DataLoader, whose worker
    processes are started again at every epoch (its default). They are forks of the rank, with its
    command line: trainer.match finds them too, and they catch spotguard's signal with the rank's
    handler. It only sets a flag in their copy of SaveRequested, which nothing polls."""
    if not workers:
        while True:
            yield torch.randn(32, 1024)
    loader = torch.utils.data.DataLoader(_Inputs(), batch_size=32, num_workers=workers)
    while True:
        yield from loader


def main():
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--checkpoint-dir", required=True, help="spotguard's checkpoint.dir")
    p.add_argument("--steps", type=int, default=1_000_000)
    p.add_argument("--save-every", type=int, default=1000, help="periodic saves (0: only on a notice)")
    p.add_argument("--save-with", choices=("dcp", "torch"), default="dcp",
                   help="dcp: torch.distributed.checkpoint, marker .metadata (PyTorch 2.3 or later); "
                        "torch: torch.save, a file per rank, marker _COMPLETE (any version)")
    p.add_argument("--same-signal", type=float, default=SAME_SIGNAL,
                   help="seconds after the job decided to save within which a rank's signal, with "
                        "notice.json unchanged, is part of that save (SaveRequested(same_signal=))")
    p.add_argument("--marker-every-node", action="store_true",
                   help="with --save-with torch: a _COMPLETE on every node (several nodes on "
                        "node-local disks, store.world_nodes > 1)")
    p.add_argument("--loader-workers", type=int, default=0,
                   help="draw the inputs from a DataLoader with this many worker processes, started "
                        "again every two steps (0: no DataLoader)")
    args = p.parse_args()

    req = SaveRequested(same_signal=args.same_signal)  # first: spotguard signals only processes that catch it
    if args.save_with == "dcp" and dcp is None:
        p.error("--save-with dcp needs torch.distributed.checkpoint from PyTorch 2.3 or later "
                "(this is %s); use --save-with torch and checkpoint.marker: _COMPLETE" % torch.__version__)
    if args.marker_every_node and args.save_with != "torch":
        p.error("--marker-every-node goes with --save-with torch")
    save_fn, resume_fn = save, resume
    if args.save_with == "torch":
        def save_fn(root, step, model, optimizer):
            return save_files(root, step, model, optimizer, every_node=args.marker_every_node)
        resume_fn = resume_files

    cuda = torch.cuda.is_available()
    if cuda:
        torch.cuda.set_device(int(os.environ.get("LOCAL_RANK", "0")))
    dist.init_process_group("nccl" if cuda else "gloo")
    device = torch.device("cuda", torch.cuda.current_device()) if cuda else torch.device("cpu")
    rank = dist.get_rank()

    model = torch.nn.parallel.DistributedDataParallel(
        torch.nn.Linear(1024, 1024).to(device), device_ids=[device.index] if cuda else None)
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-3)
    step = resume_fn(args.checkpoint_dir, model, optimizer)
    if rank == 0:
        print("starting at step %d" % step, flush=True)

    batches = _batches(args.loader_workers)
    while step < args.steps:
        loss = model(next(batches).to(device)).square().mean()
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
        step += 1

        what = req.poll()  # every rank, every step: the same answer everywhere
        if what != SaveRequested.NONE or (args.save_every and step % args.save_every == 0):
            t0 = time.monotonic()
            path = save_fn(args.checkpoint_dir, step, model, optimizer)
            if rank == 0:
                left = "" if req.deadline is None else "; deadline in %.0f s" % (req.deadline - time.time())
                print("saved %s in %.1f s%s" % (path, time.monotonic() - t0, left), flush=True)
        if what == SaveRequested.EXIT:
            if rank == 0:
                print("exiting after the checkpoint at step %d" % step, flush=True)
            break

    # The DDP model goes before the process group: left to the interpreter's exit, its reducer
    # can deadlock there against gloo's threads (seen with PyTorch 1.13, one run in two).
    del model, optimizer
    dist.destroy_process_group()
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
