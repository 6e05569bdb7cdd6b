"""Perplexity of a checkpoint on the start of a dataset's validation split.

    python eval.py --out_dir=out-owt --dataset=openwebtext
    python eval.py --init_from=/path/to/gpt2 --dataset=openwebtext --eval_tokens=1000000 --out_json=gpt2.json
    torchrun --standalone --nproc_per_node=8 eval.py --out_dir=out-owt --dataset=openwebtext

How the windows are cut and shared over ranks is described in evaluation.evaluate_perplexity.
"""
import json
import os

import configurator
import parallel
import rundir
import tokendata
from evaluation import evaluate_perplexity
from runtime import load_model
from devices import check_dtype, precision
from tokendata import check_token_file, data_dir_of

DEFAULTS = dict(
    out_dir="out",
    init_from="resume",  # 'resume' reads out_dir/ckpt.pt; otherwise a local HF GPT-2 directory
    dataset="",  # reads data/<dataset>/val.bin
    data_dir="",  # or this directory's val.bin
    eval_tokens=0,  # tokens to predict from the start of val.bin; 0 means the whole split
    block_size=0,  # window length; 0 means the model's block_size
    batch_size=8,  # windows per forward pass
    device="",
    dtype="",  # 'bfloat16', 'float16', 'float32'; '' picks as train.py does
    out_json="",  # also write the result to this file
)


def main(argv):
    cfg = configurator.apply_config(DEFAULTS, argv)
    if not (cfg["dataset"] or cfg["data_dir"]):
        raise configurator.ConfigError("no data: pass --dataset=NAME (reads data/NAME) or --data_dir=PATH")
    if cfg["batch_size"] < 1 or cfg["eval_tokens"] < 0 or cfg["block_size"] < 0:
        raise configurator.ConfigError(f"batch_size must be >= 1 and eval_tokens, block_size >= 0 (0: all / the "
                                       f"model's), got {cfg['batch_size']}, {cfg['eval_tokens']}, {cfg['block_size']}")
    layout = parallel.data_parallel_layout(cfg["device"])
    device = layout.device
    check_dtype(cfg["dtype"], device)
    dtype, autocast = precision(cfg["dtype"], device)
    data_dir = data_dir_of(cfg)
    check_token_file(os.path.join(data_dir, "val.bin"), cfg["dataset"])  # before the model is loaded
    model = load_model(cfg, device)
    top = tokendata.max_token_id(data_dir, ("val",))["val"]
    if top >= model.config.vocab_size:
        raise configurator.ConfigError(f"{data_dir}/val.bin holds token id {top}, outside the model's vocab_size "
                                       f"{model.config.vocab_size}: evaluate on a dataset with the model's tokenizer")
    block_size = cfg["block_size"] or model.config.block_size
    if block_size > model.config.block_size:
        raise configurator.ConfigError(f"block_size={block_size} exceeds the model's {model.config.block_size}")
    result = evaluate_perplexity(model, data_dir, block_size, cfg["eval_tokens"], device, cfg["batch_size"], autocast)
    source = cfg["out_dir"] if cfg["init_from"] == "resume" else cfg["init_from"]
    result = dict(model=source, data_dir=data_dir, dtype=dtype, **result)
    if layout.master:
        print(f"{source} on {data_dir}/val.bin: loss {result['loss']:.4f}, perplexity {result['ppl']:.2f} "
              f"over {result['tokens']:,} tokens ({result['windows']} windows of {block_size})")
        if cfg["out_json"]:
            with open(cfg["out_json"], "w") as f:
                json.dump(result, f, indent=2)
    if layout.distributed:
        parallel.exit_distributed()
    return result


if __name__ == "__main__":
    configurator.run_script(main, FileNotFoundError, ValueError, rundir.RunDirError)
