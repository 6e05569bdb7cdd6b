"""Generate text from a run's checkpoint or from a local Hugging Face GPT-2 directory.

    python sample.py --out_dir=out-shakespeare --start="ROMEO:" --num_samples=2
    python sample.py --init_from=/path/to/gpt2 --start="FILE:prompt.txt"
"""
import json
import os

import torch

import configurator
import rundir
import tokendata
from evaluation import generate_text
from parallel import pick_device
from runtime import load_model
from devices import check_dtype, precision
from tokendata import data_dir_of

DEFAULTS = dict(
    out_dir="out",
    init_from="resume",  # 'resume' reads out_dir/ckpt.pt; otherwise a local HF GPT-2 directory
    start="\n",  # prompt text, or FILE:path to read it from a file
    num_samples=3,
    max_new_tokens=300,
    temperature=0.8,
    top_k=200,
    seed=1337,
    device="",
    dtype="",  # 'bfloat16', 'float16', 'float32'; '' picks as train.py does
    data_dir="",  # the data whose tokens the model reads: '' = the run's own (out_dir/config.json), GPT-2's BPE for init_from=DIR
)


def validate(cfg):
    err = configurator.ConfigError
    for key in ("num_samples", "max_new_tokens", "top_k"):
        if cfg[key] < 1:
            raise err(f"{key} must be >= 1, got {cfg[key]}")
    if not cfg["temperature"] >= 0:
        raise err(f"temperature must be >= 0 (0 picks the likeliest token), got {cfg['temperature']}")
    if not cfg["start"]:
        raise err("start is empty: give a prompt (--start=TEXT or --start=FILE:path)")


def text_codec(cfg, model):
    """Text to the model's token ids and back, by the tokenizer of its data (char-level runs included)."""
    data_dir = cfg["data_dir"]
    run_config = os.path.join(cfg["out_dir"], "config.json")
    if not data_dir and cfg["init_from"] == "resume" and os.path.exists(run_config):
        with open(run_config) as f:
            data_dir = data_dir_of(json.load(f))
    return tokendata.text_codec(data_dir, model.config.vocab_size)


def main(argv):
    cfg = configurator.apply_config(DEFAULTS, argv)
    validate(cfg)
    device = pick_device(cfg["device"])
    check_dtype(cfg["dtype"], device)
    torch.manual_seed(cfg["seed"])
    model = load_model(cfg, device)
    codec = text_codec(cfg, model)
    prompt = cfg["start"]
    if prompt.startswith("FILE:"):
        with open(prompt[5:], encoding="utf-8") as f:
            prompt = f.read()
    _, autocast = precision(cfg["dtype"], device)
    for _ in range(cfg["num_samples"]):
        print(generate_text(model, prompt, cfg["max_new_tokens"], device, codec, autocast, cfg["temperature"], cfg["top_k"]))
        print("---------------")


if __name__ == "__main__":
    configurator.run_script(main, FileNotFoundError, rundir.RunDirError)
