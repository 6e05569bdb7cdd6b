"""Export a run's checkpoint: a sharded one (out_dir/dcp) as one ordinary ckpt.pt, or any GPT-2 run as a
Hugging Face GPT2LMHeadModel directory.

    python export_checkpoint.py --out_dir=out-gpt2-350M                         # dcp/ -> out_dir/ckpt.pt
    python export_checkpoint.py --out_dir=out-gpt2 --format=hf --out=gpt2-hf    # ckpt.pt or dcp/ -> HF
    python sample.py --init_from=gpt2-hf                                        # reads the export back

format='ckpt': full weights, the optimizer state of a single process, the counters and the config;
sample.py, eval.py and hellaswag.py read it; train.py resumes from it with data_parallel='ddp'. One
process reads every rank's shards, tensor-parallel ones put back together (the whole model and its
optimizer state must fit in CPU memory).

format='hf': config.json, model.safetensors (float32, Conv1D layout), GPT-2's tokenizer files and a
model card (README.md) with the run's config and run_info.json facts. Only models that compute GPT-2's
function are exported: model_type='gpt' with pre-LN (or a reduced_sync model of tp blocks only, the
same function split over ranks). A model without biases gets zero biases, which computes the same
thing. The vocabulary padding (rows 50257.. of the embedding and head) is cut off: the export's
softmax runs over GPT-2's 50,257 tokens, so its log-probabilities are ours minus log(1 - p), p the
probability our model gives the padding rows (never a target: training drives it towards zero). Every other
variant is evaluated through the lm-eval adapter instead (docs/ecosystem.md).
"""
import json
import os
import shutil
import torch

import configurator
import optim
import rundir
import runrecord
import sharding
import tokendata
from model import GPT, GPTConfig, model_config_fields
from ra_model import IDEAS
from reduced_sync_model import layer_types
from runtime import build_model, model_config

DEFAULTS = dict(
    out_dir="out",  # the run directory
    format="ckpt",  # 'ckpt': dcp/ as one ckpt.pt; 'hf': a Hugging Face GPT2LMHeadModel directory
    out="",  # where to write: format='ckpt' a file ('' means out_dir/ckpt.pt), format='hf' a new directory
)
FORMATS = ("ckpt", "hf")

# nn.Linear stores (out, in); Hugging Face's GPT-2 uses Conv1D, which stores (in, out).
CONV1D_WEIGHTS = ("attn.c_attn.weight", "attn.c_proj.weight", "mlp.c_fc.weight", "mlp.c_proj.weight")
VOCAB_ROWS = ("transformer.wte.weight", "lm_head.weight")


def load_sharded(out_dir):
    """(meta, model, optimizer) of out_dir's newest sharded checkpoint, whole on the CPU."""
    path = rundir.checkpoint_path(out_dir, sharded=True)
    if path is None:
        raise FileNotFoundError(f"{out_dir}/dcp/latest not found: train with data_parallel='fsdp' or 'hsdp' first")
    meta = sharding.read_meta(path)
    model = build_model(meta["config"], meta)  # meta holds no weights: a fresh model of the run's shape
    optimizer = optim.build_optimizer(model, meta["config"])
    sharding.load_whole(path, model, optimizer, meta["config"]["tp_size"])
    return meta, model, optimizer


def export(out_dir, out=""):
    """Write the newest sharded checkpoint of out_dir as one file; returns its path."""
    meta, model, optimizer = load_sharded(out_dir)
    out = out or os.path.join(out_dir, rundir.CHECKPOINT_FILE)
    rundir.save_checkpoint(out, dict(meta, model=model.state_dict(), optimizer=optimizer.state_dict()))
    return out


# ----------------------------------------------------------------------------- Hugging Face

def not_gpt2_reason(cfg):
    """Why the run's model does not compute GPT-2's function (what GPT2LMHeadModel computes), or None."""
    model_type = cfg.get("model_type", "gpt")
    config = model_config(cfg)
    if model_type == "ra":  # each idea declares whether it keeps GPT-2's function (ra_model.IDEAS)
        ideas = [name for name, idea in IDEAS.items() if idea.layers(config) and not idea.gpt2_function]
        if ideas:
            return f"model_type='ra' with {' and '.join(ideas)}"
    if model_type == "reduced_sync" and set(layer_types(config)) != {"tp"}:
        return f"model_type='reduced_sync' with {sorted(set(layer_types(config)) - {'tp'})} blocks"
    if config.ln_placement != "pre":
        return "ln_placement='post' (GPT-2 normalizes before each sublayer and once at the end)"
    if config.vocab_size < tokendata.GPT2_VOCAB_SIZE:
        return f"vocab_size={config.vocab_size}, smaller than GPT-2 BPE's {tokendata.GPT2_VOCAB_SIZE} (another tokenizer)"
    return None


def load_run(out_dir):
    """(config, model) of out_dir's checkpoint (ckpt.pt, else the newest dcp/), refused in one line
    before any weight is built when the model is not a GPT-2."""
    path = rundir.checkpoint_path(out_dir)
    if path is None:
        raise FileNotFoundError(f"{out_dir} holds no checkpoint (ckpt.pt or dcp/latest): train first")
    runrecord.check_gpt2_tokens(out_dir, "a GPT2LMHeadModel export")
    sharded = os.path.isdir(path)
    checkpoint = sharding.read_meta(path) if sharded else rundir.load_checkpoint_file(path)
    reason = not_gpt2_reason(checkpoint["config"])
    if reason:
        raise configurator.ConfigError(f"{out_dir}: {reason} is not a GPT-2 function, so it has no "
                                       f"GPT2LMHeadModel export: evaluate it with the lm-eval adapter "
                                       f"(python lm_eval_run.py --model workbench --model_args out_dir={out_dir} ...)")
    model = load_sharded(out_dir)[1] if sharded else build_model(checkpoint["config"], checkpoint)
    return checkpoint, model


def hf_state_dict(model):
    """The model's weights under GPT2LMHeadModel's names and layout: every weight GPT-2 has (zero
    biases where ours has none), Conv1D matrices transposed, the vocabulary cut to GPT-2's rows,
    and no lm_head.weight when it is tied to the embedding."""
    config = model.config
    ours = model.state_dict()
    with torch.device("meta"):  # the names and shapes of GPT-2 with biases, no memory
        shapes = GPT(GPTConfig(**dict({k: getattr(config, k) for k in model_config_fields()}, bias=True))).state_dict()
    hf = {}
    for name, like in shapes.items():
        if name == "lm_head.weight" and config.tie_weights:
            continue  # GPT2LMHeadModel ties it to transformer.wte.weight on load
        value = ours[name] if name in ours else torch.zeros(like.shape)
        if name in VOCAB_ROWS:
            value = value[:tokendata.GPT2_VOCAB_SIZE]
        if name.endswith(CONV1D_WEIGHTS):
            value = value.t()
        hf[name] = value.detach().to("cpu", torch.float32).contiguous().clone()
    return hf


def hf_config(config):
    return {
        "architectures": ["GPT2LMHeadModel"], "model_type": "gpt2",
        "vocab_size": tokendata.GPT2_VOCAB_SIZE, "n_positions": config.block_size, "n_embd": config.n_embd,
        "n_layer": config.n_layer, "n_head": config.n_head, "n_inner": None,
        "activation_function": "gelu_new", "layer_norm_epsilon": 1e-5, "initializer_range": 0.02,
        "resid_pdrop": config.dropout, "embd_pdrop": config.dropout, "attn_pdrop": config.dropout,
        "scale_attn_weights": True, "scale_attn_by_inverse_layer_idx": False, "reorder_and_upcast_attn": False,
        "tie_word_embeddings": config.tie_weights, "use_cache": True,
        "bos_token_id": tokendata.EOT_TOKEN, "eos_token_id": tokendata.EOT_TOKEN, "torch_dtype": "float32",
    }


def write_tokenizer(out):
    """GPT-2's tokenizer as Hugging Face reads it: the offline BPE files under HF's names."""
    vocab_bpe, encoder_json = tokendata.gpt2_bpe_files()
    shutil.copyfile(encoder_json, os.path.join(out, "vocab.json"))
    shutil.copyfile(vocab_bpe, os.path.join(out, "merges.txt"))
    eot = "<|endoftext|>"
    write_json(os.path.join(out, "tokenizer_config.json"), {
        "tokenizer_class": "GPT2Tokenizer", "model_max_length": 1024, "add_prefix_space": False,
        "bos_token": eot, "eos_token": eot, "unk_token": eot})
    write_json(os.path.join(out, "special_tokens_map.json"), {"bos_token": eot, "eos_token": eot, "unk_token": eot})


def write_json(path, obj):
    with open(path, "w") as f:
        json.dump(obj, f, indent=2)


MODEL_CARD_KEYS = ("model_type", "n_layer", "n_head", "n_embd", "block_size", "vocab_size", "bias", "tie_weights",
                   "dropout", "dataset", "max_iters", "batch_size", "gradient_accumulation_steps", "learning_rate",
                   "weight_decay", "optimizer", "dtype", "seed")


def model_card(out_dir, checkpoint, model):
    """README.md of the export: what it is, how it was trained, and what the export changed."""
    cfg = checkpoint["config"]
    info = rundir.read_run_info(out_dir)
    lines = ["---", "library_name: transformers", "tags: [gpt2, nanogpt]", "---", "",
             f"# {os.path.basename(os.path.abspath(out_dir))}", "",
             f"A GPT-2 ({model.get_num_params():,} parameters without position embeddings) trained with the GPT-2 "
             f"ablation workbench, exported from `{out_dir}` at iteration {checkpoint.get('iter_num', '?')} "
             f"(best validation loss {checkpoint.get('best_val_loss', float('nan')):.4f}).", "",
             "Export notes: float32 weights; the vocabulary padding rows were cut to GPT-2's 50,257 tokens "
             "(probabilities renormalize over them)" + ("" if model.config.bias else "; the model had no biases, "
                                                          "zero biases were written") + ".", "",
             "## Run config", "", "| key | value |", "|---|---|"]
    lines += [f"| {k} | {cfg[k]!r} |" for k in MODEL_CARD_KEYS if k in cfg]
    facts = {k: v for k, v in info.get("facts", {}).items() if not isinstance(v, (dict, list))}
    if info:
        facts.update(code_versions=", ".join(info.get("code_versions", [])), repeat=info.get("repeat"))
    if facts:
        lines += ["", "## run_info.json", "", "| fact | value |", "|---|---|"]
        lines += [f"| {k} | `{v}` |" for k, v in facts.items()]
    return "\n".join(lines) + "\n"


def export_hf(out_dir, out):
    """Write out_dir's GPT-2 checkpoint as a Hugging Face GPT2LMHeadModel directory; returns `out`."""
    from safetensors.torch import save_file
    if not out:
        raise configurator.ConfigError("format='hf' needs --out=DIR, the directory to write")
    if os.path.exists(out) and not os.path.isdir(out):
        raise configurator.ConfigError(f"--out={out} is a file: give the directory to write (a new or empty one)")
    if os.path.exists(out) and os.listdir(out):
        raise configurator.ConfigError(f"--out={out} exists and is not empty: choose a new directory")
    checkpoint, model = load_run(out_dir)
    with rundir.write_errors_named(out, "the export is incomplete: choose a --out where you can write"):
        os.makedirs(out, exist_ok=True)
        save_file(hf_state_dict(model), os.path.join(out, "model.safetensors"), metadata={"format": "pt"})
        write_json(os.path.join(out, "config.json"), hf_config(model.config))
        write_json(os.path.join(out, "generation_config.json"),
                   {"bos_token_id": tokendata.EOT_TOKEN, "eos_token_id": tokendata.EOT_TOKEN})
        write_tokenizer(out)
        with open(os.path.join(out, "README.md"), "w") as f:
            f.write(model_card(out_dir, checkpoint, model))
    return out


def main(argv):
    cfg = configurator.apply_config(DEFAULTS, argv)
    if cfg["format"] not in FORMATS:
        raise configurator.ConfigError(f"format={cfg['format']!r}: use one of {FORMATS}")
    if cfg["format"] == "hf":
        print(f"wrote {export_hf(cfg['out_dir'], cfg['out'])} (load it with GPT2LMHeadModel.from_pretrained)")
    else:
        print(f"wrote {export(cfg['out_dir'], cfg['out'])}")


if __name__ == "__main__":
    configurator.run_script(main, FileNotFoundError, rundir.RunDirError)
