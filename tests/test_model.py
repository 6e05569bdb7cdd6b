"""model.GPT: equivalence with Hugging Face GPT-2, attention implementations, causality,
activation checkpointing, optimizer groups, state-dict prefixes, config checks, generation, FLOPs."""
import itertools
import json
import os
import shutil
import subprocess
import sys
import time
from pathlib import Path

import pytest
import torch
from torch.nn import functional as F

from configurator import ConfigError
from model import GPT, GPTConfig, unwrap_state_dict

REPO = Path(__file__).resolve().parents[1]
TINY = dict(block_size=16, vocab_size=64, n_layer=2, n_head=2, n_embd=32, dropout=0.0)
VARIANTS = list(itertools.product(("pre", "post"), ("sdpa", "manual")))  # ln_placement x attn_impl


def tiny_gpt(seed=0, **overrides):
    torch.manual_seed(seed)
    return GPT(GPTConfig(**{**TINY, **overrides}))


def tokens(shape, seed=1, vocab=TINY["vocab_size"]):
    return torch.randint(0, vocab, shape, generator=torch.Generator().manual_seed(seed))


def grads(model):
    return {name: p.grad.clone() for name, p in model.named_parameters()}


def assert_same_grads(a, b, atol):
    ga, gb = grads(a), grads(b)
    assert ga.keys() == gb.keys()
    for name in ga:
        torch.testing.assert_close(ga[name], gb[name], atol=atol, rtol=1e-4, msg=name)


# ---------------------------------------------------------------- Hugging Face equivalence

HF_SHAPE = dict(n_layer=2, n_head=2, n_embd=32, vocab_size=100, n_positions=32)


def save_hf_checkpoints(root, tie):
    """One random HF GPT-2, saved twice: save_pretrained (safetensors) and a pytorch_model.bin in
    the layout of OpenAI's original gpt2 checkpoint (no 'transformer.' prefix, causal-mask buffers,
    no lm_head when tied). Returns (hf_model, safetensors_dir, bin_dir)."""
    transformers = pytest.importorskip("transformers")
    torch.manual_seed(0)
    hf = transformers.GPT2LMHeadModel(transformers.GPT2Config(
        **HF_SHAPE, tie_word_embeddings=tie, bos_token_id=0, eos_token_id=0))
    with torch.no_grad():  # HF inits LN weights to 1 and biases to 0: perturb all, so each must load
        for p in hf.parameters():
            p.add_(0.05 * torch.randn_like(p))
    hf.eval()
    st_dir, bin_dir = root / f"st_tie{tie}", root / f"bin_tie{tie}"
    hf.save_pretrained(st_dir)
    assert (st_dir / "model.safetensors").exists()
    bin_dir.mkdir()
    shutil.copy(st_dir / "config.json", bin_dir / "config.json")
    state = {k.removeprefix("transformer."): v.clone() for k, v in hf.state_dict().items()}
    if tie:
        state.pop("lm_head.weight")
    T = HF_SHAPE["n_positions"]
    for i in range(HF_SHAPE["n_layer"]):
        state[f"h.{i}.attn.bias"] = torch.tril(torch.ones(T, T)).view(1, 1, T, T)
        state[f"h.{i}.attn.masked_bias"] = torch.tensor(-1e4)
    torch.save(state, bin_dir / "pytorch_model.bin")
    return hf, st_dir, bin_dir


@pytest.fixture(scope="module")
def hf_checkpoints(tmp_path_factory):
    root = tmp_path_factory.mktemp("hf")
    return {tie: save_hf_checkpoints(root, tie) for tie in (True, False)}


@pytest.mark.parametrize("tie", [True, False])
@pytest.mark.parametrize("fmt", ["safetensors", "bin"])
@pytest.mark.parametrize("attn_impl", ["sdpa", "manual"])
def test_from_pretrained_matches_hf(hf_checkpoints, tie, fmt, attn_impl):
    hf, st_dir, bin_dir = hf_checkpoints[tie]
    model = GPT.from_pretrained(st_dir if fmt == "safetensors" else bin_dir, attn_impl=attn_impl).eval()
    assert model.config.tie_weights == tie
    assert (model.lm_head.weight is model.transformer.wte.weight) == tie
    idx = tokens((2, HF_SHAPE["n_positions"]), vocab=HF_SHAPE["vocab_size"])
    with torch.no_grad():
        expected = hf(idx).logits
        logits, _ = model(idx)
    assert logits.shape == expected.shape == (2, HF_SHAPE["n_positions"], HF_SHAPE["vocab_size"])
    torch.testing.assert_close(logits, expected, atol=1e-5, rtol=1e-5)


@pytest.mark.parametrize("key, value", [
    ("activation_function", "relu"),
    ("scale_attn_weights", False),  # HF then skips the 1/sqrt(d) scaling, which GPT always applies
    ("scale_attn_by_inverse_layer_idx", True),
    ("reorder_and_upcast_attn", True),
    ("layer_norm_epsilon", 1e-6),
])
def test_from_pretrained_rejects_unsupported_variants(hf_checkpoints, tmp_path, key, value):
    _, st_dir, _ = hf_checkpoints[True]
    path = tmp_path / "variant"
    shutil.copytree(st_dir, path)
    config = json.loads((path / "config.json").read_text())
    config[key] = value
    (path / "config.json").write_text(json.dumps(config))
    with pytest.raises(ValueError, match=f"not supported.*{key}"):
        GPT.from_pretrained(path)


def test_from_pretrained_missing_weights_file(hf_checkpoints, tmp_path):
    _, st_dir, _ = hf_checkpoints[True]
    shutil.copy(st_dir / "config.json", tmp_path / "config.json")
    with pytest.raises(FileNotFoundError, match="model.safetensors"):
        GPT.from_pretrained(tmp_path)


# ---------------------------------------------------------------- attention implementations

def forward_backward(model, idx, targets):
    """The loss, gradients in .grad (a training forward returns no logits: the chunked head)."""
    model.zero_grad(set_to_none=True)
    _, loss = model(idx, targets)
    loss.backward()
    return loss.detach()


@pytest.mark.parametrize("ln_placement", ["pre", "post"])
def test_sdpa_equals_manual(ln_placement):
    sdpa = tiny_gpt(ln_placement=ln_placement, attn_impl="sdpa")
    manual = tiny_gpt(seed=5, ln_placement=ln_placement, attn_impl="manual")
    manual.load_state_dict(sdpa.state_dict())
    idx, targets = tokens((2, 16)), tokens((2, 16), seed=2)
    loss_s, loss_m = forward_backward(sdpa, idx, targets), forward_backward(manual, idx, targets)
    with torch.no_grad():
        torch.testing.assert_close(sdpa(idx)[0], manual(idx)[0], atol=1e-5, rtol=1e-5)
    torch.testing.assert_close(loss_s, loss_m, atol=1e-6, rtol=1e-6)
    assert_same_grads(sdpa, manual, atol=1e-6)


@pytest.mark.parametrize("training", [True, False], ids=["train", "eval"])
@pytest.mark.parametrize("ln_placement, attn_impl", VARIANTS)
def test_causality(ln_placement, attn_impl, training):
    model = tiny_gpt(ln_placement=ln_placement, attn_impl=attn_impl).train(training)
    V, T = TINY["vocab_size"], TINY["block_size"]
    idx = tokens((2, T))
    with torch.no_grad():
        base, _ = model(idx)
        for t in (0, 3, 8, T - 2):
            changed = idx.clone()
            changed[:, t + 1:] = (changed[:, t + 1:] + tokens((2, T - t - 1), seed=t) % (V - 1) + 1) % V
            assert (changed[:, t + 1:] != idx[:, t + 1:]).all()
            logits, _ = model(changed)
            torch.testing.assert_close(logits[:, :t + 1], base[:, :t + 1], atol=1e-6, rtol=0)
            assert not torch.allclose(logits[:, t + 1], base[:, t + 1])  # the change is visible later


# ---------------------------------------------------------------- activation checkpointing

@pytest.mark.parametrize("dropout", [0.0, 0.1])
@pytest.mark.parametrize("ln_placement, attn_impl", [("pre", "sdpa"), ("post", "manual")])
def test_activation_checkpointing_same_loss_and_grads(ln_placement, attn_impl, dropout):
    cfg = dict(ln_placement=ln_placement, attn_impl=attn_impl, dropout=dropout)
    plain = tiny_gpt(**cfg, activation_checkpointing=False)
    ckpt = tiny_gpt(seed=9, **cfg, activation_checkpointing=True)
    ckpt.load_state_dict(plain.state_dict())
    calls = []  # forward hooks do not fire on recomputation, so count calls of Block.forward
    for block in ckpt.transformer.h:
        block.forward = lambda x, forward=block.forward: calls.append(1) or forward(x)
    idx, targets = tokens((2, 16)), tokens((2, 16), seed=2)
    torch.manual_seed(123)  # same dropout masks: checkpoint replays the RNG state when recomputing
    loss_plain = forward_backward(plain, idx, targets)
    torch.manual_seed(123)
    loss_ckpt = forward_backward(ckpt, idx, targets)
    assert len(calls) == 2 * TINY["n_layer"]  # each block ran again in backward: checkpointing is on
    torch.testing.assert_close(loss_ckpt, loss_plain, atol=1e-6, rtol=1e-6)
    assert_same_grads(ckpt, plain, atol=1e-6)


@pytest.mark.parametrize("dropout", [0.0, 0.1])
def test_attention_recompute_same_loss_and_grads_and_runs_attention_again(dropout):
    plain = tiny_gpt(dropout=dropout)
    recompute = tiny_gpt(seed=9, dropout=dropout, attn_recompute=True)
    recompute.load_state_dict(plain.state_dict())
    calls = []
    for block in recompute.transformer.h:
        block.attn.attend = lambda q, k, v, attend=block.attn.attend: calls.append(1) or attend(q, k, v)
    idx, targets = tokens((2, 16)), tokens((2, 16), seed=2)
    torch.manual_seed(123)
    loss_plain = forward_backward(plain, idx, targets)
    torch.manual_seed(123)
    loss_recompute = forward_backward(recompute, idx, targets)
    assert len(calls) == 2 * TINY["n_layer"]  # the attention core ran again in backward
    assert torch.equal(loss_recompute, loss_plain)
    assert_same_grads(recompute, plain, atol=0)
    recompute.eval()
    calls.clear()
    with torch.no_grad():
        recompute(idx)
    assert len(calls) == TINY["n_layer"]  # nothing to recompute without a backward


def test_attention_recompute_inside_checkpointed_blocks_is_refused():
    with pytest.raises(ValueError, match="attn_recompute=False"):
        GPTConfig(activation_checkpointing=True, attn_recompute=True)


# ---------------------------------------------------------------- weights and parameters

def test_weight_tying():
    tied, untied = tiny_gpt(tie_weights=True), tiny_gpt(tie_weights=False)
    assert tied.lm_head.weight is tied.transformer.wte.weight
    assert untied.lm_head.weight is not untied.transformer.wte.weight
    assert untied.get_num_params() - tied.get_num_params() == TINY["vocab_size"] * TINY["n_embd"]
    with torch.no_grad():
        untied.transformer.wte.weight.add_(1.0)
    assert not torch.equal(untied.lm_head.weight, untied.transformer.wte.weight)


def test_post_ln_has_no_final_layer_norm():
    assert "ln_f" in tiny_gpt(ln_placement="pre").transformer
    post = tiny_gpt(ln_placement="post")
    assert "ln_f" not in post.transformer
    assert not any("ln_f" in name for name in post.state_dict())


@pytest.mark.parametrize("tie_weights", [True, False])
@pytest.mark.parametrize("optimizer, cls", [
    ("adamw", torch.optim.AdamW), ("adam", torch.optim.Adam), ("sgd", torch.optim.SGD)])
def test_configure_optimizers_groups(optimizer, cls, tie_weights):
    model = tiny_gpt(tie_weights=tie_weights)
    opt = model.configure_optimizers(optimizer, learning_rate=1e-3, weight_decay=0.1)
    assert type(opt) is cls
    decay, no_decay = opt.param_groups
    assert decay["weight_decay"] == 0.1 and no_decay["weight_decay"] == 0.0
    grouped = [id(p) for group in opt.param_groups for p in group["params"]]
    assert len(grouped) == len(set(grouped))  # no parameter twice (tied lm_head/wte included)
    assert set(grouped) == {id(p) for p in model.parameters()}
    decay_ids, no_decay_ids = {id(p) for p in decay["params"]}, {id(p) for p in no_decay["params"]}
    for name, p in model.named_parameters():
        if name.endswith(".bias") or ".ln_" in name:
            assert id(p) in no_decay_ids, name
        if p.dim() == 2:
            assert id(p) in decay_ids, name
    assert {id(model.transformer.wte.weight), id(model.transformer.wpe.weight)} <= decay_ids


def test_configure_optimizers_rejects_unknown_name():
    with pytest.raises(ValueError, match="'lion'.*adamw"):
        tiny_gpt().configure_optimizers("lion", learning_rate=1e-3, weight_decay=0.1)


# ---------------------------------------------------------------- state dicts and wrappers

def test_compiled_state_dict_prefix_and_unwrap():
    model = tiny_gpt()
    compiled = torch.compile(model)  # lazy: nothing is compiled until the first call
    state = compiled.state_dict()
    assert state and all(k.startswith("_orig_mod.") for k in state)
    plain = tiny_gpt(seed=7)
    plain.load_state_dict(unwrap_state_dict(state), strict=True)
    for k, v in model.state_dict().items():
        assert torch.equal(plain.state_dict()[k], v), k


@pytest.mark.parametrize("prefix", ["module.", "_orig_mod.module.", "module._orig_mod."])
def test_unwrap_state_dict_strips_ddp_prefixes(prefix):
    model = tiny_gpt()
    wrapped = {prefix + k: v for k, v in model.state_dict().items()}
    unwrapped = unwrap_state_dict(wrapped)
    assert unwrapped.keys() == model.state_dict().keys()
    tiny_gpt(seed=7).load_state_dict(unwrapped, strict=True)
    assert unwrap_state_dict(model.state_dict()).keys() == model.state_dict().keys()  # no-op when plain


def test_plain_state_dict_loads_into_compiled_model():
    source, target = tiny_gpt(seed=1), tiny_gpt(seed=2)
    compiled = torch.compile(target)
    compiled._orig_mod.load_state_dict(source.state_dict(), strict=True)
    round_trip = unwrap_state_dict(compiled.state_dict())
    assert round_trip.keys() == source.state_dict().keys()
    for k, v in source.state_dict().items():
        assert torch.equal(round_trip[k], v), k


# ---------------------------------------------------------------- config checks

@pytest.mark.parametrize("overrides, key", [
    (dict(n_embd=30, n_head=4), "n_embd"),
    (dict(ln_placement="sandwich"), "ln_placement"),
    (dict(attn_impl="flash3"), "attn_impl"),
    (dict(n_layer=0), "n_layer"),
    (dict(dropout=1.0), "dropout"),
])
def test_config_rejects_bad_values(overrides, key):
    with pytest.raises(ConfigError, match=key):  # the error type of every config key
        GPTConfig(**{**TINY, **overrides})


# ---------------------------------------------------------------- forward, generation, FLOPs

def test_forward_shapes_loss_and_last_only():
    model = tiny_gpt().eval()
    B, T, V = 3, 12, TINY["vocab_size"]
    idx, targets = tokens((B, T)), tokens((B, T), seed=2)
    targets[0, :4] = -1  # ignored positions
    with torch.no_grad():
        logits, loss = model(idx, targets)
        last, no_loss = model(idx, last_only=True)
    assert logits.shape == (B, T, V) and last.shape == (B, 1, V) and no_loss is None
    keep = targets.view(-1) != -1
    expected = F.cross_entropy(logits.view(-1, V)[keep], targets.view(-1)[keep])
    torch.testing.assert_close(loss, expected)
    torch.testing.assert_close(last, logits[:, -1:], atol=1e-6, rtol=0)
    with pytest.raises(ValueError, match="block_size"):
        model(tokens((1, TINY["block_size"] + 1)))


def test_generate_lengths_and_cropping():
    model = tiny_gpt().eval()
    prompt = tokens((2, 5))
    out = model.generate(prompt, max_new_tokens=7)
    assert out.shape == (2, 12) and torch.equal(out[:, :5], prompt)
    assert out.min() >= 0 and out.max() < TINY["vocab_size"]
    long_prompt = tokens((2, 3 * TINY["block_size"] + 1), seed=3)
    greedy = model.generate(long_prompt, max_new_tokens=5, top_k=1)
    assert greedy.shape == (2, long_prompt.size(1) + 5) and torch.equal(greedy[:, :long_prompt.size(1)], long_prompt)
    # Only the last block_size tokens are seen: a cropped prompt continues identically.
    cropped = model.generate(long_prompt[:, -TINY["block_size"]:], max_new_tokens=5, top_k=1)
    assert torch.equal(greedy[:, -5:], cropped[:, -5:])


def test_flops_per_token_and_mfu():
    V, C, L, T = TINY["vocab_size"], TINY["n_embd"], TINY["n_layer"], TINY["block_size"]
    model = tiny_gpt()
    # ln_1 + c_attn + attn c_proj + ln_2 + c_fc + mlp c_proj, with biases
    per_layer = 2 * C + (3 * C * C + 3 * C) + (C * C + C) + 2 * C + (4 * C * C + 4 * C) + (4 * C * C + C)
    n = V * C + L * per_layer + 2 * C  # tied wte/lm_head counted once, ln_f; wpe excluded
    assert model.get_num_params() == n
    assert model.get_num_params(non_embedding=False) == n + T * C
    assert model.flops_per_token() == 6 * n + 12 * L * C * T
    assert model.estimate_mfu(1e4, "cpu") is None
    assert model.estimate_mfu(1e4, torch.device("cpu")) is None


@pytest.mark.parametrize("name,peak", [("NVIDIA H100 80GB HBM3", 989.4e12), ("NVIDIA H100 PCIe", 756.5e12),
                                       ("NVIDIA H100 NVL", 835.5e12), ("NVIDIA L4", 121e12),
                                       ("NVIDIA L40S", 362.05e12), ("AMD Instinct MI250X", 191.5e12),
                                       ("NVIDIA L40", None), ("NVIDIA H100 94GB HBM2e", None), ("Tesla V100-SXM2-16GB", None)])
def test_data_sheet_peak_is_looked_up_by_exact_device_name(monkeypatch, name, peak):
    """A substring match gave an L40S the L4's peak and every H100 the SXM's; an unknown name gets none."""
    import model as model_module
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "get_device_name", lambda device=None: name)
    assert model_module.peak_flops("cuda:0") == peak


# The variations a formula could get wrong, each tried on every architecture that accepts it.
SHAPES = [{}, dict(bias=False), dict(tie_weights=False), dict(n_layer=6, n_head=4, n_embd=48, block_size=16),
          dict(ln_placement="post", bias=False, tie_weights=False)]


def test_the_parameter_formula_equals_every_built_architectures_count():
    import test_all_architectures as script
    for name, (family, kwargs) in script.ARCHITECTURES.items():
        counted = 0
        for shape in SHAPES:
            try:
                model = script.BUILDERS[family](**{**script.TINY, **kwargs, **shape})
            except ConfigError:  # e.g. reduced_sync is pre-LN only
                continue
            built = sum(p.numel() for p in model.parameters())
            assert type(model).count_params(model.config) == built, (name, shape)
            counted += 1
        assert counted >= 3, name


def test_an_absurd_model_is_refused_in_seconds(data_dir, tmp_path):
    """The memory check counts parameters by formula: 100,000 layers are refused before any module
    is built (building them, even on the meta device, took minutes and gigabytes)."""
    for size in ("--n_layer=100000", "--n_embd=786432", "--n_layer=3000"):
        start = time.time()
        proc = subprocess.run([sys.executable, "train.py", f"--data_dir={data_dir}", "--dataset=toy", "--vocab_size=128",
                               f"--out_dir={tmp_path}/run", "--device=cpu", size], cwd=REPO, capture_output=True,
                              text=True, timeout=120)
        assert proc.returncode == 1 and proc.stderr.startswith("error: this run needs at least"), proc.stderr[-2000:]
        assert len(proc.stderr.strip().splitlines()) == 1 and time.time() - start < 30, size
        assert not os.path.exists(tmp_path / "run" / "log.jsonl")


# ---------------------------------------------------------------- the architecture smoke script

def test_all_architectures_script_passes():
    import test_all_architectures as script
    result = subprocess.run([sys.executable, str(REPO / "test_all_architectures.py")],
                            capture_output=True, text=True, cwd=REPO, timeout=120)
    assert result.returncode == 0, result.stdout + result.stderr
    passed = {line.split()[1] for line in result.stdout.splitlines() if line.startswith("PASS ")}
    assert passed == set(script.ARCHITECTURES) | set(script.FSDP_LAYOUTS), result.stdout
    assert all(f"CONFIG config/{name}.py" in result.stdout for name in script.GPT2_SIZE_CONFIGS)
    assert "FAIL" not in result.stdout


def test_all_architectures_only_filter_and_failure(capsys, monkeypatch):
    import test_all_architectures as script
    assert script.main(["--only=post-manual"]) == 0
    out = capsys.readouterr().out
    assert {line.split()[1] for line in out.splitlines() if line.startswith("PASS ")} == {
        "gpt2-post-manual", "gpt2-post-manual-ckpt"}
    # A broken entry is reported as FAIL and the exit code is 1.
    monkeypatch.setitem(script.ARCHITECTURES, "gpt2-broken", ("gpt2", dict(n_head=3)))
    assert script.main(["--only=broken"]) == 1
    assert "FAIL gpt2-broken:" in capsys.readouterr().out


def test_compile_is_per_block_and_ddp_wraps_the_compiled_blocks(monkeypatch):
    """Regional compilation: each block's forward is compiled in place, one graph for all blocks (the
    activation-norm hooks of the first and last run eagerly around it), the embeddings and the head stay
    eager, and DDP wraps the model with its hooks between the blocks' graphs, so each bucket's all-reduce
    overlaps the rest of the backward. A reduced_sync model, whose blocks are not called as modules, is
    compiled whole. (Dynamo's eager backend: the graphs are traced, not compiled into kernels.)"""
    import functools

    import torch.distributed as dist
    from torch._dynamo.utils import counters
    from torch.nn.parallel import DistributedDataParallel as DDP

    import evaluation
    from parallel import ParallelLayout, compile_model
    from reduced_sync_model import ReducedSyncConfig, ReducedSyncGPT
    monkeypatch.setattr(torch, "compile", functools.partial(torch.compile, backend="eager"))
    torch._dynamo.reset()
    counters.clear()
    dist.init_process_group("gloo", rank=0, world_size=1, store=dist.HashStore())
    try:
        layout = ParallelLayout()
        layout.distributed, layout.dp_group = True, dist.group.WORLD
        model = tiny_gpt(n_layer=4)
        norms = evaluation.ActivationNorms(model, [0, -1])
        wrapped = layout.wrap(model, "float32", dict(compile=True))
        assert isinstance(wrapped, DDP) and wrapped.module is model and wrapped.no_sync
        assert model.forward.__func__ is GPT.forward and model.lm_head.forward.__func__ is torch.nn.Linear.forward
        idx = tokens((2, 16))
        for _ in range(2):
            wrapped(idx, idx)[1].backward()
        assert counters["stats"]["unique_graphs"] == 1 and not counters["graph_break"]
        assert set(norms.read()) == {"act_rms_layer0", "act_rms_layer3"}
    finally:
        dist.destroy_process_group()
        torch._dynamo.reset()
    reduced = ReducedSyncGPT(ReducedSyncConfig(block_size=8, vocab_size=32, n_layer=2, n_head=2, n_embd=16))
    assert isinstance(compile_model(reduced), torch._dynamo.eval_frame.OptimizedModule)
