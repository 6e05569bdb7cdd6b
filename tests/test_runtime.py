"""runtime.py on its own, without training: each key refused once, in one line that names it; the
derived quantities (accumulation, tokens per step, the last iteration, the decay's end) computed by
settle, last_iter and decay_iters and used by the checks; the model registry; building a model from
a config or a checkpoint's own config."""
import dataclasses

import pytest
import torch

import configurator
import runtime
from model import GPT, GPTConfig
from ra_model import RAGPT
from reduced_sync_model import ReducedSyncGPT

# A tiny run on the CPU (device named: the checks must not depend on the machine's GPUs).
TOY = dict(runtime.DEFAULTS, device="cpu", dtype="float32", n_layer=2, n_head=2, n_embd=32, block_size=16,
           vocab_size=64, batch_size=4, gradient_accumulation_steps=2, max_iters=8, warmup_iters=2)


def refusal(world_size=1, **keys):
    """The one-line ConfigError that resolve raises for TOY with `keys`."""
    with pytest.raises(configurator.ConfigError) as raised:
        runtime.resolve(dict(TOY, **keys), world_size)
    message = str(raised.value)
    assert "\n" not in message, message
    return message


# ----------------------------------------------------------------------------- settle and the derived keys

def test_settle_derives_accumulation_from_tokens_per_iter_and_tokens_per_iter_from_accumulation():
    derived = runtime.settle(dict(TOY, gradient_accumulation_steps=0, tokens_per_iter=256))
    assert (derived["gradient_accumulation_steps"], derived["tokens_per_iter"]) == (4, 256)  # 256 / (4 x 16)
    derived = runtime.settle(dict(TOY, gradient_accumulation_steps=3, tokens_per_iter=0))
    assert derived["tokens_per_iter"] == 3 * 4 * 16


def test_settle_returns_a_copy_and_settling_twice_changes_nothing():
    cfg = dict(TOY, gradient_accumulation_steps=0, tokens_per_iter=128)
    once = runtime.settle(cfg)
    assert cfg["gradient_accumulation_steps"] == 0 and cfg["tokens_per_iter"] == 128  # the input is untouched
    assert runtime.settle(once) == once


def test_last_iter_is_where_the_token_budget_or_max_iters_ends_the_run():
    cfg = runtime.settle(dict(TOY, max_iters=1000))  # 128 tokens per step
    assert runtime.last_iter(cfg) == 1000
    assert runtime.last_iter(dict(cfg, max_tokens=128 * 40)) == 40
    assert runtime.last_iter(dict(cfg, max_tokens=128 * 4000)) == 1000  # max_iters comes first


def test_the_decay_ends_at_lr_decay_iters_else_at_the_last_iteration():
    cfg = runtime.settle(dict(TOY, max_iters=1000, max_tokens=128 * 40))
    assert runtime.decay_iters(cfg) == 40
    assert runtime.decay_iters(dict(cfg, lr_decay_iters=30)) == 30


def test_the_checks_use_the_last_iteration_that_the_token_budget_sets():
    """max_iters is large, the token budget ends the run at iteration 4: warmup and eval_at are
    checked against 4, not against max_iters."""
    short = dict(max_iters=1000, max_tokens=128 * 4)
    assert "warmup_iters=5 exceeds lr_decay_iters=4" in refusal(warmup_iters=5, **short)
    assert "from 1 to the run's last (4)" in refusal(eval_at=[5], **short)
    cfg = runtime.resolve(dict(TOY, eval_at=[4], **short), 1)
    assert runtime.last_iter(cfg) == runtime.decay_iters(cfg) == 4


# ----------------------------------------------------------------------------- every key refused once, named

@pytest.mark.parametrize("keys, named", [
    (dict(out_dir=""), "out_dir is empty"),
    (dict(batch_size=0), "batch_size must be >= 1"),
    (dict(block_size=0), "block_size must be a positive integer"),  # the model config checks it first
    (dict(max_iters=0), "max_iters must be >= 1"),
    (dict(eval_interval=0), "eval_interval must be >= 1"),
    (dict(eval_iters=0), "eval_iters must be >= 1"),
    (dict(log_interval=0), "log_interval must be >= 1"),
    (dict(dist_timeout=0.0), "dist_timeout must be >= 1"),
    (dict(eval_at=[0]), "eval_at=[0]"),
    (dict(eval_at=[2.5]), "eval_at=[2.5]"),
    (dict(final_eval_iters=-1), "final_eval_iters must be >= 0"),
    (dict(seed=-1), "seed must be >= 0"),
    (dict(init_seed=-2), "init_seed must be >= 0, or -1"),
    (dict(data_seed=-2), "data_seed must be >= 0, or -1"),
    (dict(data_order=-1), "data_order must be an integer >= 0"),
    (dict(learning_rate=-1.0), "learning_rate must be >= 0"),
    (dict(weight_decay=-0.1), "weight_decay must be >= 0"),
    (dict(grad_clip=-1.0), "grad_clip must be >= 0"),
    (dict(max_time=-1.0), "max_time must be >= 0"),
    (dict(hellaswag_limit=-1), "hellaswag_limit must be >= 0"),
    (dict(min_lr=1.0), "min_lr=1.0 exceeds learning_rate"),
    (dict(lr_schedule="linear"), "lr_schedule='linear'"),
    (dict(wsd_decay_frac=0.0), "wsd_decay_frac must be in (0, 1]"),
    (dict(fork_optimizer="keep"), "fork_optimizer='keep'"),
    (dict(fork_start="zero"), "fork_start='zero'"),
    (dict(init_from="/nonexistent/gpt2"), "init_from='/nonexistent/gpt2' is neither"),
    (dict(model_type="nope"), "model_type='nope'"),
    (dict(dtype="bf16"), "dtype='bf16'"),
    (dict(dtype="float16"), "dtype='float16' needs a GPU"),
    (dict(attn_gate=True), "attn_gate=True applies to model_type='ra' only"),
    (dict(block_pattern="spd"), "block_pattern='spd' applies to model_type='reduced_sync' only"),
    (dict(model_type="ra", sync_every=2), "sync_every=2 applies to model_type='reduced_sync' only"),
    (dict(max_tokens=1000), "max_tokens=1000 is not a whole number of iterations"),
    (dict(log_act_norm_layers=[2]), "log_act_norm_layers contains 2"),
])
def test_a_bad_key_is_refused_in_one_line_that_names_it(keys, named):
    assert named in refusal(**keys)


def test_accumulation_must_divide_over_the_data_parallel_ranks():
    assert refusal(world_size=3).startswith("gradient_accumulation_steps=2 is the total over all processes and must "
                                            "be divisible by the world size 3")
    assert runtime.resolve(dict(TOY), 2)["gradient_accumulation_steps"] == 2


def test_a_good_config_passes_unchanged_but_for_the_derived_keys():
    cfg = dict(TOY, gradient_accumulation_steps=0, tokens_per_iter=256)
    resolved = runtime.resolve(cfg, 1)
    # compile=None settles by the device (False on this CPU), gradient_accumulation_steps=0 from tokens_per_iter
    assert {k for k in cfg if resolved[k] != cfg[k]} == {"gradient_accumulation_steps", "compile"}
    assert resolved["compile"] is False and resolved["gradient_accumulation_steps"] == 256 // (4 * 16)


# ----------------------------------------------------------------------------- the model registry

def test_every_model_types_config_fields_and_switches_are_keys_of_the_defaults():
    for name, (model_cls, config_cls) in runtime.MODEL_TYPES.items():
        assert issubclass(model_cls, GPT) and dataclasses.is_dataclass(config_cls), name
        assert {f.name for f in dataclasses.fields(config_cls)} <= set(runtime.DEFAULTS), name
    for model_type, keys in runtime.MODEL_SWITCHES.items():
        assert model_type in runtime.MODEL_TYPES and set(keys) <= set(runtime.DEFAULTS), model_type


def test_a_config_field_that_is_no_key_is_refused_naming_it(monkeypatch):
    """A field no config file could set would silently build its default."""
    @dataclasses.dataclass
    class Extra(GPTConfig):
        secret_width: int = 3
    monkeypatch.setitem(runtime.MODEL_TYPES, "gpt", (GPT, Extra))
    with pytest.raises(configurator.ConfigError, match=r"Extra has the fields \['secret_width'\], which are no keys"):
        runtime.model_config(TOY)


def test_a_checkpoint_config_without_model_type_is_a_gpt():
    assert runtime.model_classes({}) == (GPT, GPTConfig)


# ----------------------------------------------------------------------------- building a model

@pytest.mark.parametrize("keys, cls", [
    (dict(), GPT),
    (dict(model_type="ra", ra_pattern="late", ra_mode="swap"), RAGPT),
    (dict(model_type="reduced_sync", block_pattern="tp,spd"), ReducedSyncGPT)])
def test_build_model_builds_the_type_and_shape_the_config_names(keys, cls):
    cfg = dict(TOY, **keys)
    model = runtime.build_model(cfg)
    assert type(model) is cls
    assert dataclasses.asdict(model.config) == dataclasses.asdict(runtime.model_config(cfg))
    assert sum(p.numel() for p in model.parameters()) == runtime.count_params(cfg)
    assert runtime.flops_per_token(cfg) == model.flops_per_token()


def test_a_checkpoint_builds_from_its_own_config_with_its_weights():
    """The caller's config is not the checkpoint's (sample.py and eval.py pass their own): the model is
    the checkpoint's shape, and its weights load although torch.compile and DDP prefixed their names."""
    saved_cfg = dict(TOY, n_layer=3)
    torch.manual_seed(0)
    saved = runtime.build_model(saved_cfg)
    prefixed = {f"_orig_mod.module.{k}": v for k, v in saved.state_dict().items()}
    model = runtime.build_model(dict(TOY, n_layer=1), dict(config=saved_cfg, model=prefixed))
    assert model.config.n_layer == 3
    assert all(torch.equal(model.state_dict()[k], v) for k, v in saved.state_dict().items())


def test_the_meta_model_is_built_once_per_model_config():
    """Keys that do not shape the model (out_dir, learning_rate) share the one meta model."""
    first = runtime.meta_model(TOY)
    assert runtime.meta_model(dict(TOY, out_dir="elsewhere", learning_rate=1.0)) is first
    assert runtime.meta_model(dict(TOY, n_layer=3)) is not first
    assert next(first.parameters()).is_meta
