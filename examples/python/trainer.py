#!/usr/bin/env python3
"""A stand-in training loop that cooperates with spotguard. Standard library only, Python 3.8+.

When AWS announces that this Spot instance will be reclaimed, spotguard sends the trainer a
signal (SIGUSR1 by default). The pattern to copy into a real training script:

1. Install a handler for that signal before training starts. spotguard refuses to send a
   signal the process does not catch, because the default action of SIGUSR1 ends a Python
   process: no handler, no checkpoint.
2. In the handler, only note that a checkpoint was asked for.
3. At the next step boundary, write the checkpoint into a new directory step-NNNNNN/: every
   file to a temporary name, fsync, rename; the marker file _COMPLETE last. spotguard uploads
   each file as soon as it is closed and commits the checkpoint when the marker appears.
   (--in-place writes each file under its own name instead, as torch DCP does: with a notice
   pending, spotguard then sends a file to S3 while it is still being written.)
4. Keep training: a checkpoint signal is not a stop. SIGTERM saves and exits 0.

Run it:  python3 trainer.py --checkpoint-dir /tmp/ckpt --pidfile /run/trainer.pid
Then:    kill -USR1 "$(cat /run/trainer.pid)"   # what spotguard does on a notice

Several nodes (optional, off by default): only the reclaimed node's agent gets the notice. A real
job passes it on through its collective (examples/pytorch/dcp_signal.py); here a file every node
can read stands in for it (--peer-notice, e.g. on a shared file system). Signalled by its own
agent, the trainer writes that agent's notice there; when another node's notice appears there, it
hands the notice to its own agent (--notify-agent: POST /notice, source "job") and saves as if
signalled. The agent then uploads urgently too, and does not signal the trainer for it.
"""

import argparse
import json
import os
import re
import signal
import socket
import sys
import threading
import time
import urllib.error
import urllib.request

MARKER = "_COMPLETE"  # spotguard's checkpoint.marker (the default)
STEP_DIR = re.compile(r"^step-(\d+)$")
CHUNK = 1 << 20  # write random data 1 MiB at a time


def parse_signal(name):
    """Accept SIGUSR1, USR1, sigusr1, ..."""
    name = name.strip().upper()
    if not name.startswith("SIG"):
        name = "SIG" + name
    try:
        return signal.Signals[name]
    except KeyError:
        raise argparse.ArgumentTypeError("unknown signal %r" % name) from None


def fsync_dir(path):
    """Make renames and new entries in directory path durable."""
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def write_atomic(path, chunks, pause=0.0):
    """Write the byte strings of chunks to path so that nobody ever sees a partial file:
    write a temporary file (dot-prefixed, in the same directory), fsync it, rename it."""
    directory, base = os.path.split(path)
    tmp = os.path.join(directory, "." + base + ".tmp")
    with open(tmp, "wb") as f:
        for chunk in chunks:
            f.write(chunk)
            if pause:
                time.sleep(pause)  # --write-seconds: a slow file system or a large model
        f.flush()
        os.fsync(f.fileno())
    os.replace(tmp, path)


def random_chunks(size):
    """Yield size random bytes in chunks of at most CHUNK bytes: the 'model weights'."""
    while size > 0:
        n = min(size, CHUNK)
        yield os.urandom(n)
        size -= n


def write_in_place(path, chunks, pause=0.0):
    """Write the byte strings of chunks straight to path, as torch DCP's ranks and
    torch.save(obj, path) do: the file is seen growing, and is whole only once the marker says so."""
    with open(path, "wb") as f:
        for chunk in chunks:
            f.write(chunk)
            f.flush()  # in the file as it is written, not when Python's buffer fills
            if pause:
                time.sleep(pause)
        os.fsync(f.fileno())


def save_checkpoint(root, step, files, size, write_seconds=0.0, rank=None, parallel=False, in_place=False, run_id=None):
    """Write root/step-NNNNNN/ with files shards of size bytes each, then the marker, taking
    about write_seconds in all. With rank (one node of several), the shards are
    shard-RANK-I.bin, so no two nodes write a file of the same name with other bytes; the marker
    is the same on every node that saves the step: the step, and run_id if given (the same on
    every node, new at every start of the job; without it, a step saved again within a minute
    of an earlier save of it, after a rollback, cannot be told from that save). With parallel, every shard is written at
    once, each by a thread of its own, as the ranks of torch DCP write theirs: they all appear
    at about the end. With in_place, shards are written under their own names rather than renamed
    into place, as DCP and torch.save(obj, path) write them."""
    start = time.monotonic()
    final = os.path.join(root, "step-%06d" % step)
    os.makedirs(final, exist_ok=True)
    per_file = max(1, -(-size // CHUNK))
    chunks = per_file if parallel else files * per_file
    pause = write_seconds / chunks if write_seconds > 0 else 0.0
    names = ["shard-%d.bin" % i if rank is None else "shard-%d-%d.bin" % (rank, i) for i in range(files)]
    write_shard = write_in_place if in_place else write_atomic
    if parallel:
        errors = []

        def write(name):
            try:
                write_shard(os.path.join(final, name), random_chunks(size), pause)
            except Exception as e:  # said by the caller's thread
                errors.append(e)

        threads = [threading.Thread(target=write, args=(name,)) for name in names]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        if errors:
            raise errors[0]
    else:
        for name in names:
            write_shard(os.path.join(final, name), random_chunks(size), pause)
    fsync_dir(final)  # every shard is in place and durable before the marker exists
    body = {"step": step}
    if run_id:
        body["run"] = run_id
    write_atomic(os.path.join(final, MARKER), [json.dumps(body).encode() + b"\n"])
    fsync_dir(final)
    fsync_dir(root)
    print("checkpoint %s written in %.3f s" % (final, time.monotonic() - start), flush=True)


def newest_complete(root):
    """Return (step, path) of the newest step-*/ under root that has the marker, or None."""
    best = None
    try:
        names = os.listdir(root)
    except FileNotFoundError:
        return None
    for name in names:
        m = STEP_DIR.match(name)
        path = os.path.join(root, name)
        if m and os.path.isfile(os.path.join(path, MARKER)):
            if best is None or int(m.group(1)) > best[0]:
                best = (int(m.group(1)), path)
    return best


def default_notice_file():
    """The agent's notice.json (agent.runtime_dir; SPOTGUARD_AGENT_RUNTIME_DIR is honoured)."""
    return os.path.join(os.environ.get("SPOTGUARD_AGENT_RUNTIME_DIR", "/run/spotguard"), "notice.json")


def read_json(path):
    """The JSON in path, or None if it is missing or unreadable."""
    try:
        with open(path) as f:
            return json.load(f)
    except (OSError, ValueError):
        return None


class PeerNotices:
    """A stand-in for a multi-node job's collective: one JSON file, {"source", "action",
    "deadline", "from"}, that every node's trainer reads at each step and the notified node's
    trainer writes. Its own writes are recognised by "from" and not taken as another's."""

    def __init__(self, path):
        self.path = path
        self.me = "%s:%d" % (socket.gethostname(), os.getpid())
        self.seen = None  # (inode, mtime_ns, size) last read

    def publish(self, notice, step):
        """Tell the other nodes of this node's notice (as its agent's notice.json has it) and the
        step it saves for it: every node saves that step, as a collective would have them."""
        body = {k: notice.get(k) for k in ("source", "action", "deadline")}
        body["from"] = self.me
        body["step"] = step
        write_atomic(self.path, [json.dumps(body).encode() + b"\n"])

    def poll(self):
        """Another node's notice, new since the last call, or None."""
        try:
            st = os.stat(self.path)
        except OSError:
            return None
        if (st.st_ino, st.st_mtime_ns, st.st_size) == self.seen:
            return None
        self.seen = (st.st_ino, st.st_mtime_ns, st.st_size)
        notice = read_json(self.path)
        if not isinstance(notice, dict) or notice.get("from") == self.me:
            return None
        return notice


def agent_holds(notice_file, action, deadline):
    """Whether this node's agent already holds a notice with action and deadline (its notice.json
    lists it): then posting it again would only refresh it."""
    held = read_json(notice_file) or {}
    return any(n.get("action") == action and n.get("deadline") == deadline for n in held.get("active") or [])


def notify_agent(addr, action, deadline, timeout=2.0):
    """POST the notice to this node's agent (http.listen, e.g. 127.0.0.1:9402) as source "job".
    Never raises: a failure is printed and training goes on (the save does not depend on it)."""
    body = json.dumps({"source": "job", "action": action, "deadline": deadline}).encode()
    req = urllib.request.Request("http://%s/notice" % addr, data=body, method="POST",
                                 headers={"Content-Type": "application/json"})
    try:
        with urllib.request.urlopen(req, timeout=timeout) as resp:
            answer = json.load(resp)
        print("agent %s took the notice: %s %s" % (addr, answer.get("result"), answer.get("notice", {}).get("key")), flush=True)
        return True
    except urllib.error.HTTPError as e:
        print("agent %s refused the notice: %s %s" % (addr, e.code, e.read(4096).decode(errors="replace").strip()), file=sys.stderr, flush=True)
    except (OSError, ValueError) as e:  # refused, timed out, not JSON
        print("cannot hand the notice to the agent %s: %s" % (addr, e), file=sys.stderr, flush=True)
    return False


class Requests:
    """What the signal handlers ask of the training loop. Python runs handlers in the main
    thread between bytecodes, so plain attributes are enough."""

    def __init__(self, signal_log):
        self.checkpoint = False
        self.stop = False
        self.signal_log = signal_log

    def log(self, signum):
        # One JSON line per received signal, written and flushed at once. The handler opens
        # its own file: printing to stdout here could collide with a print in the main loop.
        if self.signal_log:
            line = {"signal": signal.Signals(signum).name, "pid": os.getpid(), "time_ns": time.time_ns()}
            with open(self.signal_log, "a") as f:
                f.write(json.dumps(line) + "\n")

    def on_checkpoint(self, signum, frame):
        self.log(signum)
        self.checkpoint = True

    def on_stop(self, signum, frame):
        self.log(signum)
        self.stop = True


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--checkpoint-dir", help="write checkpoints here when signalled (none: only log the signal)")
    p.add_argument("--signal-log", help="append one JSON line per received signal to this file")
    p.add_argument("--ready-file", help="write this file (our PID) once the signal handlers are installed")
    p.add_argument("--signal", type=parse_signal, default=signal.SIGUSR1,
                   help="checkpoint signal (default SIGUSR1); SIGTERM saves (with --checkpoint-dir) and exits 0")
    p.add_argument("--no-handler", action="store_true",
                   help="install no handler for --signal (demo: spotguard then refuses to send it)")
    p.add_argument("--step-seconds", type=float, default=0.1, help="duration of one training step (default 0.1)")
    p.add_argument("--checkpoint-mb", type=float, default=1, help="size of each checkpoint file in MiB (default 1)")
    p.add_argument("--files", type=int, default=2, help="files per checkpoint (default 2)")
    p.add_argument("--resume-from", help="continue from the newest complete step-*/ in this directory")
    p.add_argument("--pidfile", help="write our PID to this file")
    p.add_argument("--write-seconds", type=float, default=0.0,
                   help="spread the writing of one checkpoint over this many seconds (default 0: as fast as it goes)")
    p.add_argument("--parallel", action="store_true",
                   help="write a checkpoint's files all at once, a thread each, as torch DCP's ranks do (default: one after another)")
    p.add_argument("--in-place", action="store_true",
                   help="write each shard under its own name, as torch DCP and torch.save(obj, path) do "
                        "(default: a temporary name, then a rename)")
    p.add_argument("--save-every", type=int, default=0,
                   help="also checkpoint every N steps on its own, as trainers do (default 0: only when signalled)")
    p.add_argument("--peer-notice", metavar="FILE",
                   help="several nodes: a file every node's trainer reads, standing in for the job's collective: "
                        "signalled, write the agent's notice there; another node's notice there: save (default: none)")
    p.add_argument("--notify-agent", metavar="HOST:PORT",
                   help="with --peer-notice: hand another node's notice to this node's agent (POST /notice on its "
                        "http.listen, e.g. 127.0.0.1:9402) before saving (default: none)")
    p.add_argument("--rank", type=int, metavar="R",
                   help="several nodes: this node's rank; its shards are shard-R-I.bin, so no two nodes write one file "
                        "name with other bytes (default: none, shard-I.bin)")
    p.add_argument("--run-id", metavar="ID",
                   help="several nodes: written into every marker with the step: the same on every node, new at every start "
                        "of the job (a real job has rank 0 draw it and broadcast it; torchrun's TORCHELASTIC_RUN_ID and "
                        "TORCHELASTIC_RESTART_COUNT make one), so that a step saved again after a rollback is told from its "
                        "earlier save (default: none, the step alone)")
    p.add_argument("--notice-file", default=default_notice_file(),
                   help="this node's agent's notice.json (default: %(default)s)")
    args = p.parse_args(argv)
    peers = PeerNotices(args.peer_notice) if args.peer_notice else None

    step = 0
    if args.resume_from:
        found = newest_complete(args.resume_from)
        if found:
            step = found[0]
            # A real trainer loads its model and optimizer state from found[1] here.
            print("resumed from %s at step %d" % (found[1], step), flush=True)
        else:
            print("no complete checkpoint in %s; starting at step 0" % args.resume_from, flush=True)

    req = Requests(args.signal_log)
    if args.signal == signal.SIGTERM:
        handler = req.on_stop  # the checkpoint signal is SIGTERM: save and stop
    else:
        handler = req.on_checkpoint
        signal.signal(signal.SIGTERM, req.on_stop)
    if not args.no_handler:
        signal.signal(args.signal, handler)

    pid = ("%d\n" % os.getpid()).encode()
    if args.pidfile:
        write_atomic(args.pidfile, [pid])
    if args.ready_file:
        write_atomic(args.ready_file, [pid])
    print("training as pid %d; %s %s" % (
        os.getpid(), "NOT handling" if args.no_handler else "checkpoint on", args.signal.name), flush=True)

    size = int(args.checkpoint_mb * CHUNK)
    save_step = None  # the step another node saves, to save the same one
    while True:
        time.sleep(args.step_seconds)  # one training step; a signal does not cut it short
        step += 1
        periodic = args.save_every > 0 and step % args.save_every == 0
        if peers:
            if req.checkpoint:  # signalled by this node's agent: tell the other nodes its notice
                own = [n for n in (read_json(args.notice_file) or {}).get("active") or [] if n.get("source") != "job"]
                if own:
                    peers.publish(own[0], step)  # the most severe the agent got from its own IMDS
            other = peers.poll()
            if other:
                print("notice from another node: %s %s, deadline %s, step %s" % (
                    other.get("source"), other.get("action"), other.get("deadline"), other.get("step")), flush=True)
                req.checkpoint = True
                if isinstance(other.get("step"), int):
                    save_step = other["step"]  # the step the notified node saves
                action, deadline = other.get("action") or "terminate", other.get("deadline")
                # Before the save, so the agent waits for this checkpoint if it is stopped. A
                # notice without a deadline (rebalance) is not posted: it is not urgent.
                if args.notify_agent and deadline and not agent_holds(args.notice_file, action, deadline):
                    notify_agent(args.notify_agent, action, deadline)
        if req.checkpoint or req.stop or periodic:
            # Clear the request before saving: a signal that comes during the save asks for
            # the next one.
            req.checkpoint = False
            if args.checkpoint_dir:
                save_checkpoint(args.checkpoint_dir, save_step or step, args.files, size, args.write_seconds, args.rank,
                                args.parallel, args.in_place, args.run_id)
            save_step = None
        if req.stop:
            # A SIGTERM that came during a save finds the current state already saved.
            print("stopping at step %d" % step, flush=True)
            return 0


if __name__ == "__main__":
    try:
        sys.exit(main())
    except KeyboardInterrupt:
        sys.exit(130)
