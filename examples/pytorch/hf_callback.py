r"""spotguard + Hugging Face transformers.Trainer: a TrainerCallback that asks the Trainer to save
checkpoint-<step>/ when spotguard signals (every rank at the same step), and writes the
_COMPLETE marker once every rank has finished writing it.

/etc/spotguard/spotguard.yaml:

    trainer:
      match: 'python[0-9.]* -u \S*train\.py'  # torchrun's / accelerate's workers
      signal: SIGUSR1
    checkpoint:
      dir: /opt/ml/output      # = TrainingArguments.output_dir
      marker: _COMPLETE        # not trainer_state.json: see README.md
    store:
      url: s3://your-bucket/checkpoints
      job: your-run-name

Use (copy dcp_signal.py next to it for SaveRequested and the helpers):

    cb = SpotguardCallback()     # first: installs the handler
    args = TrainingArguments(output_dir="/opt/ml/output", logging_dir="/opt/ml/logs", ...)
    trainer = Trainer(model=model, args=args, callbacks=[cb], ...)
    trainer.train(resume_from_checkpoint=last_checkpoint(args.output_dir))
"""

import os

import torch.distributed as dist
from transformers import TrainerCallback

from dcp_signal import SaveRequested, newest_complete, remove_marker, write_marker


class SpotguardCallback(TrainerCallback):
    def __init__(self, marker="_COMPLETE", **save_requested_kwargs):
        self.marker = marker
        self.req = SaveRequested(**save_requested_kwargs)

    def on_step_end(self, args, state, control, **kwargs):
        # After each optimizer step, on every rank: poll() is a collective.
        what = self.req.poll()
        if what != SaveRequested.NONE:
            control.should_save = True  # the Trainer saves checkpoint-<global_step>/ right after this
            if what == SaveRequested.EXIT:
                control.should_training_stop = True  # after that save; train() then returns
        if control.should_save and state.is_world_process_zero:
            # A step saved again (a run rolled back): its old marker goes before the Trainer
            # writes over the files (the Trainer's own flow callback, which runs before this
            # one, has set should_save for a periodic save by now).
            remove_marker(os.path.join(args.output_dir, "checkpoint-%d" % state.global_step), self.marker)
        return control

    def on_save(self, args, state, control, **kwargs):
        # Called on every rank after the Trainer wrote checkpoint-<step>/ (periodic saves too).
        # Ranks finish their own files (rng_state_<rank>.pth, sharded optimizer state) at
        # different times: wait for all, then mark it complete.
        if dist.is_available() and dist.is_initialized():
            dist.barrier()
        if state.is_world_process_zero:
            write_marker(os.path.join(args.output_dir, "checkpoint-%d" % state.global_step), self.marker)
        return control


def last_checkpoint(output_dir, marker="_COMPLETE"):
    """resume_from_checkpoint for train(): the newest checkpoint-*/ with the marker, or None.
    (The Trainer's own resume_from_checkpoint=True takes the newest checkpoint-*/ complete or not.)"""
    found = newest_complete(output_dir, marker, prefix="checkpoint-")
    return found[1] if found else None
