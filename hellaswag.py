"""HellaSwag, completion style: which of four endings does the model find most likely?

    python hellaswag.py --out_dir=out-gpt2                       # a run's ckpt.pt
    python hellaswag.py --init_from=/path/to/gpt2 --limit=1000   # a local HF GPT-2 directory
    python hellaswag.py --out_dir=out-gpt2 --input=/path/to/hellaswag_val.jsonl  # no network
    python hellaswag.py --out_dir=out-gpt2 --out_items=items.jsonl  # and every example's scores
    torchrun --standalone --nproc_per_node=8 hellaswag.py --out_dir=out-gpt2

Scoring (acc by summed loss, acc_norm by mean loss per token, exact ties) is described in
evaluation.py, which train.py shares.
"""
import json

import configurator
import rundir
import runrecord
from evaluation import SPLITS, evaluate_hellaswag, load_examples, write_items
import parallel
from runtime import load_model
from devices import check_dtype, precision

DEFAULTS = dict(
    out_dir="out",
    init_from="resume",  # 'resume' reads out_dir/ckpt.pt; otherwise a local HF GPT-2 directory
    input="",  # a local hellaswag jsonl; '' downloads `split` once into data/hellaswag/
    split="val",
    limit=0,  # the first `limit` examples only; 0 means all
    batch_size=8,  # examples per forward pass (one row per ending)
    device="",
    dtype="",  # 'bfloat16', 'float16', 'float32'; '' picks as train.py does
    out_json="",  # also write the result to this file
    out_items="",  # also write each example's scores to this file (JSON lines: losses of every ending, right/wrong)
)


def validate(cfg):
    if cfg["split"] not in SPLITS:
        raise configurator.ConfigError(f"split={cfg['split']!r}: use one of {SPLITS}")
    if cfg["batch_size"] < 1:
        raise configurator.ConfigError(f"batch_size must be >= 1, got {cfg['batch_size']}")
    if cfg["limit"] < 0:
        raise configurator.ConfigError(f"limit must be >= 0 (0: every example), got {cfg['limit']}")


# ----------------------------------------------------------------------------- command line

def main(argv):
    cfg = configurator.apply_config(DEFAULTS, argv)
    validate(cfg)
    if cfg["init_from"] == "resume":
        runrecord.check_gpt2_tokens(cfg["out_dir"], "HellaSwag")
    layout = parallel.data_parallel_layout(cfg["device"])
    device = layout.device
    check_dtype(cfg["dtype"], device)
    dtype, autocast = precision(cfg["dtype"], device)
    model = load_model(cfg, device)
    examples = load_examples(cfg["input"] or cfg["split"], limit=cfg["limit"])
    result = evaluate_hellaswag(model, examples, device, cfg["batch_size"], autocast, items=bool(cfg["out_items"]))
    items = result.pop("items", None)
    if layout.master:
        source = cfg["out_dir"] if cfg["init_from"] == "resume" else cfg["init_from"]
        print(f"{source}: HellaSwag acc {result['acc']:.4f}, acc_norm {result['acc_norm']:.4f} "
              f"over {result['n']} examples")
        if cfg["out_json"]:
            with open(cfg["out_json"], "w") as f:
                json.dump(dict(model=source, input=cfg["input"] or cfg["split"], dtype=dtype, **result), f, indent=2)
        if items is not None:
            write_items(cfg["out_items"], items, model=source)
    if layout.distributed:
        parallel.exit_distributed()
    return result


if __name__ == "__main__":
    configurator.run_script(main, FileNotFoundError, ValueError, rundir.RunDirError)
