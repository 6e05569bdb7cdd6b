"""Turn a run's sharded checkpoint (out_dir/dcp, written under data_parallel='fsdp' or 'hsdp') into
one ordinary ckpt.pt: full weights, the optimizer state of a single process, the counters and the
config. sample.py, eval.py and hellaswag.py read it; train.py resumes from it with data_parallel='ddp'.

    python export_checkpoint.py --out_dir=out-gpt2-350M
    python sample.py --out_dir=out-gpt2-350M

One process reads every rank's shards, tensor-parallel ones put back together (the whole model and its
optimizer state must fit in CPU memory).
"""
import os

import configurator
import optim
import parallel
import rundir
import sharding
from runtime import build_model

DEFAULTS = dict(
    out_dir="out",  # the run directory holding dcp/
    output="",  # where to write; '' means out_dir/ckpt.pt
)


def export(out_dir, output=""):
    """Write the newest sharded checkpoint of out_dir as one file; returns its path."""
    path = parallel.checkpoint_path(out_dir, sharded=True)
    if path is None:
        raise FileNotFoundError(f"{out_dir}/dcp/latest not found: train with data_parallel='fsdp' or 'hsdp' first")
    meta = sharding.read_meta(path)
    model = build_model(meta["config"], meta)  # meta holds no weights: a fresh model of the run's shape
    optimizer = optim.build_optimizer(model, meta["config"])
    sharding.load_whole(path, model, optimizer, meta["config"]["tp_size"])
    output = output or os.path.join(out_dir, parallel.CHECKPOINT_FILE)
    rundir.save_checkpoint(output, dict(meta, model=model.state_dict(), optimizer=optimizer.state_dict()))
    return output


def main(argv):
    cfg = configurator.apply_config(DEFAULTS, argv)
    print(f"wrote {export(cfg['out_dir'], cfg['output'])}")


if __name__ == "__main__":
    configurator.run_script(main, FileNotFoundError, rundir.RunDirError)
