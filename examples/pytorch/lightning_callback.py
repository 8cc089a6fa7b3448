r"""spotguard + PyTorch Lightning (2.x): a Callback that saves <dirpath>/step-NNNNNN/model.ckpt,
then the _COMPLETE marker, when spotguard signals; every rank saves at the same step.

/etc/spotguard/spotguard.yaml:

    trainer:
      match: 'python[0-9.]* (-u )?\S*train\.py'  # every rank (Lightning's own launcher or torchrun's workers)
      signal: SIGUSR1          # SIGUSR2 under SLURM: see README.md
    checkpoint:
      dir: /opt/ml/checkpoints # = dirpath below
      marker: _COMPLETE
    store:
      url: s3://your-bucket/checkpoints
      job: your-run-name

Use (copy dcp_signal.py next to it for SaveRequested and the helpers):

    ckpt = SpotguardCheckpoint("/opt/ml/checkpoints")   # before Trainer.fit: installs the handler
    trainer = L.Trainer(callbacks=[ckpt], ...)
    trainer.fit(model, datamodule=dm, ckpt_path=last_checkpoint("/opt/ml/checkpoints"))
"""

import os

import lightning.pytorch as L  # or: import pytorch_lightning as L

from dcp_signal import SaveRequested, newest_complete, remove_marker, write_marker


class SpotguardCheckpoint(L.Callback):
    def __init__(self, dirpath, marker="_COMPLETE", filename="model.ckpt", **save_requested_kwargs):
        self.dirpath, self.marker, self.filename = dirpath, marker, filename
        # Installed now, in every rank, before Trainer.fit: Lightning then leaves SIGUSR1 alone
        # (it installs its SLURM requeue handler only where no handler is set).
        self.req = SaveRequested(**save_requested_kwargs)

    def on_train_batch_end(self, trainer, pl_module, outputs, batch, batch_idx):
        if (batch_idx + 1) % trainer.accumulate_grad_batches:
            return  # mid gradient accumulation: wait for the optimizer step (same on every rank)
        what = self.req.poll()  # collective: every rank, same batches
        if what == SaveRequested.NONE:
            return
        path = os.path.join(self.dirpath, "step-%06d" % trainer.global_step)
        os.makedirs(path, exist_ok=True)
        if trainer.is_global_zero:
            # A step saved again (a run rolled back): its old marker goes before any rank writes
            # over the files.
            remove_marker(path, self.marker)
        trainer.strategy.barrier()
        # On every rank: rank 0 writes the file (DDP), or every rank its shards (FSDP, sharded).
        trainer.save_checkpoint(os.path.join(path, self.filename))
        trainer.strategy.barrier()  # every rank's part is written
        if trainer.is_global_zero:
            write_marker(path, self.marker)  # last: spotguard commits when it appears
        if what == SaveRequested.EXIT:
            trainer.should_stop = True  # the same on every rank; honoured once min_steps/min_epochs are met


def last_checkpoint(dirpath, marker="_COMPLETE", filename="model.ckpt"):
    """ckpt_path for Trainer.fit: the newest step-*/ with the marker (after `spotguard restore
    --to dirpath`), or None to start from scratch."""
    found = newest_complete(dirpath, marker)
    return os.path.join(found[1], filename) if found else None
