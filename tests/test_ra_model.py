"""ra_model: reciprocal attention and MLA against direct references, causality, equivalence with the
baseline, SDPA == manual, MLA parameter counts, the configs, logging of learned gates."""
import glob
import itertools
import math
import os
from dataclasses import MISSING, fields

import pytest
import torch
from torch.nn import functional as F

import configurator
import runtime
import train
from helpers import MLA, RA_TINY as TINY, VARIANTS, grads, ra_model, tokens
from model import GPT, GPTConfig
from ra_model import (MLAttention, RAConfig, RAGPT, mla_attention_params, reciprocal_manual,
                      reciprocal_sdpa)

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


# ---------------------------------------------------------------- direct references

def direct(q, k, v, logit, allowed):
    """softmax over the allowed keys of each query, one query at a time: out_i = sum_j w_ij v_j."""
    B, H, T, _ = q.shape
    rows = []
    for i in range(T):
        js = [j for j in range(T) if allowed(i, j)]
        w = F.softmax(torch.stack([logit(i, j) for j in js], dim=-1), dim=-1)  # (B, H, n)
        rows.append((w.unsqueeze(-1) * v[:, :, js]).sum(-2))
    return torch.stack(rows, dim=2)


def dot(a, b, i, j):
    return (a[:, :, i] * b[:, :, j]).sum(-1) / math.sqrt(a.size(-1))


def reference(q, k, v, mode, alpha=0.0, p=None, window=0):
    causal = lambda i, j: j <= i
    near = (lambda i, j: 0 <= i - j < window) if window else causal
    S = lambda i, j: dot(q, k, i, j)  # q_i . k_j
    ST = lambda i, j: dot(k, q, i, j)  # k_i . q_j
    if mode == "swap":
        return direct(q, k, v, ST, near)
    if mode == "gate":
        return (1 - p) * direct(q, k, v, S, causal) + p * direct(q, k, v, ST, near)
    a = alpha if not torch.is_tensor(alpha) else alpha.view(1, -1)
    return direct(q, k, v, lambda i, j: S(i, j) + (a * ST(i, j) if near(i, j) else 0.0), causal)


def qkv(seed=0, B=2, H=3, T=9, d=4, dv=5):
    g = torch.Generator().manual_seed(seed)
    return [torch.randn(B, H, T, n, generator=g, dtype=torch.float64) for n in (d, d, dv)]


CASES = [  # (mode, alpha, gate p, window)
    ("swap", 0.0, None, 0), ("swap", 0.0, None, 3),
    ("mix", 0.5, None, 0), ("mix", -1.3, None, 0), ("mix", 0.5, None, 4), ("mix", 2.0, None, 1),
    ("mix", torch.tensor([0.3, -0.7, 1.1], dtype=torch.float64), None, 0),
    ("mix", torch.tensor([0.3, -0.7, 1.1], dtype=torch.float64), None, 2),
    ("gate", 0.0, torch.tensor([0.3], dtype=torch.float64), 0),
    ("gate", 0.0, torch.tensor([0.8], dtype=torch.float64), 4),
]


@pytest.mark.parametrize("fn", [reciprocal_sdpa, reciprocal_manual], ids=["sdpa", "manual"])
@pytest.mark.parametrize("mode, alpha, p, window", CASES)
def test_mixing_equals_direct_softmax(fn, mode, alpha, p, window):
    """swap = softmax_j(k_i.q_j); mix = softmax_j(S + alpha S^T), S^T only within the window;
    gate = (1-p) attn(S) + p attn(S^T); all over j <= i, computed one query at a time."""
    q, k, v = qkv()
    a = alpha.view(1, -1, 1, 1) if torch.is_tensor(alpha) else alpha
    out = fn(q, k, v, mode, a, p, window, 0.0)
    torch.testing.assert_close(out, reference(q, k, v, mode, alpha, p, window), atol=1e-12, rtol=1e-10)


def test_reference_is_not_the_baseline():
    """The references above would be vacuous if S^T made no difference on this data."""
    q, k, v = qkv()
    base = F.scaled_dot_product_attention(q, k, v, is_causal=True)
    for mode, alpha, p, window in CASES:
        assert (reference(q, k, v, mode, alpha, p, window) - base).abs().max() > 1e-2


@pytest.mark.parametrize("mode, alpha, p, window", CASES)
def test_sdpa_and_manual_gradients_agree(mode, alpha, p, window):
    q, k, v = (t.requires_grad_() for t in qkv(seed=3))
    a = alpha.view(1, -1, 1, 1) if torch.is_tensor(alpha) else alpha
    results = []
    for fn in (reciprocal_sdpa, reciprocal_manual):
        out = fn(q, k, v, mode, a, p, window, 0.0)
        results.append(torch.autograd.grad((out * torch.linspace(-1, 1, out.numel(), dtype=out.dtype)
                                            .view_as(out)).sum(), (q, k, v)))
    for g_sdpa, g_manual in zip(*results):
        torch.testing.assert_close(g_sdpa, g_manual, atol=1e-12, rtol=1e-10)


# ---------------------------------------------------------------- the model

@pytest.mark.parametrize("name", list(VARIANTS))
def test_sdpa_equals_manual_forward_and_gradients(name):
    sdpa = ra_model(**VARIANTS[name], attn_impl="sdpa")
    manual = ra_model(seed=5, **VARIANTS[name], attn_impl="manual")
    manual.load_state_dict(sdpa.state_dict())
    idx, targets = tokens((2, 12)), tokens((2, 12), seed=2)
    outs = []
    for model in (sdpa, manual):
        _, loss = model(idx, targets)  # a training forward: the chunked head builds no logits
        loss.backward()
        with torch.no_grad():
            logits, _ = model(idx)
        outs.append((logits, loss.detach(), grads(model)))
    torch.testing.assert_close(outs[0][0], outs[1][0], atol=2e-5, rtol=1e-5)
    torch.testing.assert_close(outs[0][1], outs[1][1], atol=1e-6, rtol=1e-6)
    for key in outs[0][2]:
        torch.testing.assert_close(outs[0][2][key], outs[1][2][key], atol=2e-6, rtol=1e-4, msg=key)


@pytest.mark.parametrize("name", list(VARIANTS))
def test_sdpa_path_uses_the_fused_kernel_only(name):
    """With SDPA restricted to the flash kernel, a call that needed the math kernel (which
    materializes the T x T scores: e.g. a value head size differing from q's) would raise."""
    from torch.nn.attention import SDPBackend, sdpa_kernel
    model = ra_model(**VARIANTS[name])
    with sdpa_kernel([SDPBackend.FLASH_ATTENTION]):
        _, loss = model(tokens((2, 12)), tokens((2, 12), seed=2))
        loss.backward()
    assert all(torch.isfinite(p.grad).all() for p in model.parameters())


@pytest.mark.filterwarnings("ignore:.*(Flash attention|kernel not used)")
def test_the_fused_kernel_check_can_fail():
    """The control of the test above: unequal head sizes (the unpadded mix or MLA) do raise."""
    from torch.nn.attention import SDPBackend, sdpa_kernel
    q, k, v = qkv()  # head sizes 4, 4, 5
    with sdpa_kernel([SDPBackend.FLASH_ATTENTION]), pytest.raises(RuntimeError, match="No available kernel"):
        F.scaled_dot_product_attention(q, k, v, is_causal=True)


@pytest.mark.parametrize("training", [True, False], ids=["train", "eval"])
@pytest.mark.parametrize("name", list(VARIANTS))
def test_causality(name, training):
    """Changing tokens after position t never changes the logits at positions <= t (train mode
    runs with dropout; the same seed before each forward gives the same masks)."""
    model = ra_model(**VARIANTS[name], dropout=0.1 if training else 0.0).train(training)
    V, T = TINY["vocab_size"], TINY["block_size"]
    idx = tokens((2, T))

    def forward(x):
        torch.manual_seed(7)
        return model(x)[0]

    with torch.no_grad():
        base = forward(idx)
        for t in (0, 4, T - 2):
            changed = idx.clone()
            changed[:, t + 1:] = (changed[:, t + 1:] + 1 + tokens((2, T - t - 1), seed=t) % (V - 1)) % V
            logits = forward(changed)
            torch.testing.assert_close(logits[:, :t + 1], base[:, :t + 1], atol=1e-6, rtol=0)
            assert not torch.allclose(logits[:, t + 1], base[:, t + 1])


def test_pattern_none_is_exactly_the_baseline_gpt():
    torch.manual_seed(0)
    base = GPT(GPTConfig(**TINY))
    ra = ra_model(sharpen=False, ra_pattern="none")
    assert ra.state_dict().keys() == base.state_dict().keys()
    for key, value in base.state_dict().items():
        assert torch.equal(ra.state_dict()[key], value), key
    idx = tokens((2, 12))
    assert torch.equal(ra(idx)[0], base(idx)[0])


@pytest.mark.parametrize("name", list(VARIANTS))
def test_variants_share_the_baselines_initial_weights(name):
    """Same seed: every weight that the baseline also has starts identical; MLA differs only in
    its attention projections, RA only adds its alphas / gate logits."""
    torch.manual_seed(0)
    base = GPT(GPTConfig(**TINY)).state_dict()
    ra = ra_model(sharpen=False, **VARIANTS[name]).state_dict()
    for key, value in base.items():
        if ".attn.c_attn." in key and VARIANTS[name].get("mla"):
            assert key not in ra
            continue
        assert torch.equal(ra[key], value), key
    extra = set(ra) - set(base)
    allowed = ("ra_alpha", "ra_gate_logit", "c_kv.weight", "c_kv.bias", "c_q.weight", "c_q.bias", "k_up.weight",
               "k_up.bias", "v_up.weight", "v_up.bias", "c_gate.weight", "c_gate.bias")
    assert all(key.endswith(allowed) for key in extra), extra


def test_mix_with_fixed_alpha_zero_is_exactly_the_baseline():
    base = ra_model(ra_pattern="none")
    mix0 = ra_model(ra_pattern="all", ra_mode="mix", ra_alpha=0.0)
    idx = tokens((2, 12))
    assert torch.equal(mix0(idx)[0], base(idx)[0])


def test_swap_only_relabels_query_and_key():
    """S^T alone in every layer = the baseline with W_q and W_k exchanged (the reason swap is a
    control and mix or gate the experiment)."""
    swap = ra_model(ra_pattern="all", ra_mode="swap")
    base = ra_model(seed=3, ra_pattern="none")
    state = swap.state_dict()
    C = TINY["n_embd"]
    for key in state:
        if key.endswith(("attn.c_attn.weight", "attn.c_attn.bias")):
            q, k, v = state[key].split(C, dim=0)
            state[key] = torch.cat([k, q, v], dim=0)
    base.load_state_dict(state)
    idx = tokens((2, 12))
    torch.testing.assert_close(swap(idx)[0], base(idx)[0], atol=1e-5, rtol=1e-5)


@pytest.mark.parametrize("window", [0, 3])
def test_gate_at_infinite_logits_is_a_pure_branch(window):
    """p = sigmoid(+inf) = 1 is the swap model, p = sigmoid(-inf) = 0 the baseline, exactly."""
    gated = ra_model(ra_pattern="learned", ra_window=window)
    swap = ra_model(seed=2, ra_pattern="all", ra_mode="swap", ra_window=window)
    base = ra_model(seed=3, ra_pattern="none")
    shared = {k: v for k, v in gated.state_dict().items() if "ra_gate" not in k}
    swap.load_state_dict(shared)
    base.load_state_dict(shared)
    idx = tokens((2, 12))
    for logit, expected in ((float("inf"), swap), (float("-inf"), base)):
        with torch.no_grad():
            for block in gated.transformer.h:
                block.attn.ra_gate_logit.fill_(logit)
        torch.testing.assert_close(gated(idx)[0], expected(idx)[0], atol=1e-6, rtol=1e-6)
    assert not torch.allclose(swap(idx)[0], base(idx)[0], atol=1e-3)  # the two branches differ


@pytest.mark.parametrize("name", ["learned", "all-mix-alpha-head", "alternate-gate", "ra-mla-learned"])
def test_gradients_reach_gates_and_alphas_and_metrics_report_them(name):
    model = ra_model(**VARIANTS[name])
    _, loss = model(tokens((2, 12)), tokens((2, 12), seed=2))
    loss.backward()
    learned = {n: p for n, p in model.named_parameters() if "ra_gate" in n or "ra_alpha" in n}
    assert learned
    for n, p in learned.items():
        assert p.grad is not None and torch.isfinite(p.grad).all() and p.grad.abs().sum() > 0, n
    metrics = model.metrics()
    for n, p in learned.items():
        layer = int(n.split(".")[2])
        if "ra_gate" in n:
            assert metrics[f"ra_gate_layer{layer}"] == pytest.approx(torch.sigmoid(p).item())
        elif p.numel() == 1:
            assert metrics[f"ra_alpha_layer{layer}"] == pytest.approx(p.item())
        else:
            assert [metrics[f"ra_alpha_layer{layer}_head{h}"] for h in range(p.numel())] == pytest.approx(p.tolist())
    assert len(metrics) == sum(p.numel() for p in learned.values())


def test_alpha_and_gate_parameters_are_not_weight_decayed():
    for kw in (dict(ra_pattern="all", ra_mode="mix", ra_alpha_learn="head"), dict(ra_pattern="learned")):
        model = ra_model(**kw)
        decay, no_decay = model.configure_optimizers("adamw", 1e-3, 0.1).param_groups
        learned = [p for n, p in model.named_parameters() if "ra_" in n]
        assert len(learned) == TINY["n_layer"]
        assert all(any(p is q for q in no_decay["params"]) for p in learned)
        assert not any(p is q for p in learned for q in decay["params"])


def peak_tensor_bytes(model, idx):
    """Peak of live tensor bytes over one forward+backward (torch's MemTracker: exact, deterministic)."""
    from torch.distributed._tools.mem_tracker import MemTracker
    tracker = MemTracker()
    tracker.track_external(model)
    with tracker:
        _, loss = model(idx, idx)
        loss.backward()
    return sum(by_device["Total"] for by_device in tracker.get_tracker_snapshot("peak").values())


@pytest.mark.parametrize("name", ["all-mix-window", "ra-mla", "learned"])
def test_attention_recompute_same_gradients_less_memory(name):
    """attn_recompute drops the doubled, duplicated and padded operands the reciprocal variants keep
    for backward (what put the windowed RA+MLA over the memory target) and changes no number."""
    shape = dict(block_size=64, n_embd=32, **({"mla_latent_dim": 16} if "mla" in name else {}))
    plain = ra_model(**{**VARIANTS[name], **shape})
    recompute = ra_model(**{**VARIANTS[name], **shape}, attn_recompute=True)
    idx = tokens((4, 64))
    for model in (plain, recompute):
        _, loss = model(idx, idx)
        loss.backward()
    expected = grads(plain)
    for param, grad in grads(recompute).items():
        assert torch.equal(grad, expected[param]), param
    saved = 1 - peak_tensor_bytes(recompute, idx) / peak_tensor_bytes(plain, idx)
    assert saved > {"learned": 0.05}.get(name, 0.2), saved


@pytest.mark.parametrize("name", ["all-mix-alpha-head", "learned", "ra-mla"])
def test_bf16_autocast_keeps_one_dtype(name):
    """Learned fp32 alphas and gates must not promote bf16 activations (SDPA needs one dtype)."""
    model = ra_model(**VARIANTS[name])
    with torch.autocast("cpu", dtype=torch.bfloat16):
        _, loss = model(tokens((2, 12)), tokens((2, 12), seed=2))
    loss.backward()
    assert math.isfinite(loss.item())


def test_flops_per_token_counts_the_extra_attention_work():
    torch.manual_seed(0)
    assert ra_model(ra_pattern="none").flops_per_token() == GPT(GPTConfig(**TINY)).flops_per_token()
    T, C, L = TINY["block_size"], TINY["n_embd"], TINY["n_layer"]
    attn = 12 * C * T  # GPT's attention term per layer: 6*T*C for q.k, 6*T*C for the values
    # attention work in units of GPT's term: swap 1, mix 1.5 (doubled score width), windowed mix 3
    # (doubled width and doubled keys), gate 2 (two attentions)
    layers = {"early-swap": L, "late-mix": 2 + 2 * 1.5, "all-mix-window": 3 * L, "learned": 2 * L,
              "alternate-gate": 2 + 2 * 2}
    for name, units in layers.items():
        model = ra_model(**VARIANTS[name])
        assert model.flops_per_token() == 6 * model.get_num_params() + units * attn, name
    mla = ra_model(**MLA)
    H, latent = TINY["n_head"], MLA["mla_latent_dim"]
    assert mla.flops_per_token() == 6 * mla.get_num_params() + L * 6 * T * (H * latent + C)
    assert ra_model(**MLA, ra_pattern="all", ra_alpha=0.0).flops_per_token() == mla.flops_per_token()


# ---------------------------------------------------------------- gated attention

def test_gated_attention_follows_its_formula():
    """Layer by layer: x + c_proj(heads(ln_1(x)) * sigmoid(c_gate(ln_1(x)))), then the MLP; the
    heads computed by hand with a plain causal softmax."""
    model = ra_model(attn_gate=True).double()
    x = torch.randn(2, 12, TINY["n_embd"], dtype=torch.float64)
    block = model.transformer.h[1]
    h = block.ln_1(x)
    q, k, v = (t.view(2, 12, 2, 8).transpose(1, 2) for t in block.attn.c_attn(h).split(16, dim=2))
    heads = direct(q, k, v, lambda i, j: dot(q, k, i, j), lambda i, j: j <= i).transpose(1, 2).reshape(2, 12, 16)
    gate = torch.sigmoid(h @ block.attn.c_gate.weight.T + block.attn.c_gate.bias)
    y = x + block.attn.c_proj(heads * gate)
    expected = y + block.mlp(block.ln_2(y))
    torch.testing.assert_close(block(x), expected, atol=1e-12, rtol=0)


def test_an_open_gate_is_exactly_the_baseline_and_the_gate_learns():
    """sigmoid(+inf) = 1: with c_gate's weight 0 and bias +inf the gated model computes the
    baseline's logits bit for bit; its parameters add n_embd^2 + n_embd per layer; gradients reach
    the gate."""
    torch.manual_seed(0)
    base = GPT(GPTConfig(**TINY))
    gated = ra_model(sharpen=False, attn_gate=True)
    C, L = TINY["n_embd"], TINY["n_layer"]
    assert gated.get_num_params() == base.get_num_params() + L * (C * C + C)
    idx = tokens((2, 12))
    assert not torch.allclose(gated(idx)[0], base(idx)[0])  # sigmoid(~0) halves each head at init
    _, loss = gated(idx, tokens((2, 12), seed=2))
    loss.backward()
    assert all(b.attn.c_gate.weight.grad.abs().sum() > 0 for b in gated.transformer.h)
    with torch.no_grad():
        for block in gated.transformer.h:
            block.attn.c_gate.weight.zero_()
            block.attn.c_gate.bias.fill_(float("inf"))
    assert torch.equal(gated(idx)[0], base(idx)[0])


@pytest.mark.parametrize("argv, message", [
    (["--attn_gate=True"], "attn_gate=True applies to model_type='ra' only, not 'gpt'"),
    (["--model_type=reduced_sync", "--mla=True"], "mla=True applies to model_type='ra' only"),
    (["--model_type=ra", "--sync_every=2"], "sync_every=2 applies to model_type='reduced_sync' only"),
])
def test_a_model_key_of_another_model_type_is_refused(argv, message):
    """Silently ignored, attn_gate=True on the baseline GPT would make the positive control a null."""
    with pytest.raises(configurator.ConfigError, match=message):
        runtime.resolve(configurator.apply_config(runtime.DEFAULTS, argv), 1)


def test_gated_attention_configs_differ_from_the_ra_baseline_in_the_gate_only():
    for overlay in ("", CPU_TWIN):
        gated, base = load_config("train_gated_attn", overlay), load_config("train_ra_baseline", overlay)
        runtime.resolve(dict(gated), world_size=1)
        assert {k for k in gated if gated[k] != base[k]} == ({"attn_gate"} if overlay else
                                                             {"attn_gate", "out_dir", "wandb_run_name"})
        with torch.device("meta"):  # GPT-2 size: shapes only
            model = runtime.build_model(gated)
        assert gated["attn_gate"] is True and all(hasattr(b.attn, "c_gate") for b in model.transformer.h)


# ---------------------------------------------------------------- MLA

@pytest.mark.parametrize("bias", [True, False])
@pytest.mark.parametrize("q_latent, v_up", [(True, True), (True, False), (False, True), (False, False)])
def test_mla_parameter_counts_match_the_formula(q_latent, v_up, bias):
    C, H, L, n = 24, 3, 5, 2
    cfg = RAConfig(**{**TINY, "n_embd": C, "n_head": H, "n_layer": n, "bias": bias}, mla=True, mla_latent_dim=L,
                   mla_per_head_q_latent=q_latent, mla_per_head_v_up=v_up)
    b = int(bias)
    expected = (C * L + b * L) + (C * C + b * C)  # shared KV down-projection, output projection
    expected += (C * H * L + b * H * L) if q_latent else (C * C + b * C) + (L * C + b * C)  # Q (+ K up)
    expected += (L * C + b * C) if v_up else (L * C // H + b * C // H)  # V up-projection
    assert mla_attention_params(cfg) == expected
    assert sum(p.numel() for p in MLAttention(cfg).parameters()) == expected
    torch.manual_seed(0)
    base = GPT(GPTConfig(**{f.name: getattr(cfg, f.name) for f in fields(GPTConfig)}))
    per_layer_attn = 3 * C * C + 3 * b * C + C * C + b * C
    assert RAGPT(cfg).get_num_params() == base.get_num_params() + n * (expected - per_layer_attn)


@pytest.mark.parametrize("q_latent", [True, False])
def test_ra_mla_with_alpha_zero_is_mla(q_latent):
    mla = ra_model(**MLA, mla_per_head_q_latent=q_latent)
    fixed0 = ra_model(**MLA, mla_per_head_q_latent=q_latent, ra_pattern="all", ra_mode="mix", ra_alpha=0.0)
    learned0 = ra_model(**MLA, mla_per_head_q_latent=q_latent, ra_pattern="all", ra_mode="mix", ra_alpha=0.0,
                        ra_alpha_learn="layer")  # the doubled-head-dim path, with a zero alpha
    idx = tokens((2, 12))
    assert torch.equal(fixed0(idx)[0], mla(idx)[0])
    learned0.load_state_dict({**mla.state_dict(), **{k: v for k, v in learned0.state_dict().items() if "ra_" in k}})
    torch.testing.assert_close(learned0(idx)[0], mla(idx)[0], atol=1e-5, rtol=1e-5)
    ra = ra_model(**MLA, mla_per_head_q_latent=q_latent, ra_pattern="all", ra_mode="mix", ra_alpha=0.5)
    assert not torch.allclose(ra(idx)[0], mla(idx)[0], atol=1e-3)


@pytest.mark.parametrize("q_latent, v_up", [(True, True), (False, False)])
@pytest.mark.parametrize("attn_impl", ["sdpa", "manual"])
def test_ra_mla_layer_equals_per_head_reference(q_latent, v_up, attn_impl):
    """One RA+MLA attention against its definition from the weights, head by head: latent
    c = W_dkv x; per-head q; keys c (or W_uk c); logits q_i.k_j + alpha k_i.q_j (the reciprocal
    term is the full dot product K_i.Q_j, not a rank-1 product)."""
    cfg = RAConfig(**TINY, **MLA, mla_per_head_q_latent=q_latent, mla_per_head_v_up=v_up, ra_pattern="all",
                   ra_mode="mix", ra_alpha=0.6, attn_impl=attn_impl)
    torch.manual_seed(0)
    attn = MLAttention(cfg, "mix").double()
    with torch.no_grad():
        for p in attn.parameters():
            p.normal_(0, 0.4)
    x = torch.randn(2, TINY["block_size"], TINY["n_embd"], dtype=torch.float64)
    H, L, C = TINY["n_head"], MLA["mla_latent_dim"], TINY["n_embd"]
    hd = C // H
    c = x @ attn.c_kv.weight.T + attn.c_kv.bias
    heads = []
    for h in range(H):
        if q_latent:
            q = x @ attn.c_q.weight[h * L:(h + 1) * L].T + attn.c_q.bias[h * L:(h + 1) * L]
            k = c
        else:
            q = x @ attn.c_q.weight[h * hd:(h + 1) * hd].T + attn.c_q.bias[h * hd:(h + 1) * hd]
            k = c @ attn.k_up.weight[h * hd:(h + 1) * hd].T + attn.k_up.bias[h * hd:(h + 1) * hd]
        rows = slice(h * hd, (h + 1) * hd) if v_up else slice(0, hd)
        v = c @ attn.v_up.weight[rows].T + attn.v_up.bias[rows]
        heads.append(reference(q[:, None], k[:, None], v[:, None], "mix", alpha=0.6)[:, 0])
    expected = torch.cat(heads, dim=-1) @ attn.c_proj.weight.T + attn.c_proj.bias
    torch.testing.assert_close(attn(x), expected, atol=1e-10, rtol=1e-8)


# ---------------------------------------------------------------- config

def test_every_config_field_is_a_train_default_with_the_same_default():
    assert runtime.MODEL_TYPES["ra"] == (RAGPT, RAConfig)
    for f in fields(RAConfig):
        default = f.default if f.default is not MISSING else f.default_factory()
        assert f.name in runtime.DEFAULTS, f.name
        assert runtime.DEFAULTS[f.name] == default and type(runtime.DEFAULTS[f.name]) is type(default), f.name


def test_patterns_choose_layers_and_modes():
    layers = lambda **kw: [RAConfig(**{**TINY, "n_layer": 6}, **kw).layer_mode(i) for i in range(6)]
    S, M, G = "swap", "mix", "gate"
    assert layers(ra_pattern="none") == [None] * 6
    assert layers(ra_pattern="early", ra_mode=S) == [S, S, S, None, None, None]
    assert layers(ra_pattern="late") == [None, None, None, M, M, M]
    assert layers(ra_pattern="all", ra_mode=G) == [G] * 6
    assert layers(ra_pattern="alternate") == [None, M, None, M, None, M]
    assert layers(ra_pattern="learned") == [G] * 6
    assert layers(ra_pattern="layers", ra_layers=[4, 1]) == [None, M, None, None, M, None]


@pytest.mark.parametrize("overrides, key", [
    (dict(ra_pattern="middle"), "ra_pattern"),
    (dict(ra_mode="both"), "ra_mode"),
    (dict(ra_alpha_learn="token"), "ra_alpha_learn"),
    (dict(ra_pattern="all", ra_mode="swap", ra_alpha_learn="layer"), "ra_alpha_learn"),
    (dict(ra_pattern="layers"), "ra_layers"),
    (dict(ra_pattern="all", ra_layers=[1]), "ra_layers"),
    (dict(ra_pattern="layers", ra_layers=[4]), "ra_layers"),
    (dict(ra_pattern="layers", ra_layers=[1, 1]), "ra_layers"),
    (dict(ra_window=-1), "ra_window"),
    (dict(mla=True, mla_latent_dim=0), "mla_latent_dim"),
    (dict(n_embd=15), "n_embd"),  # the base checks still run
])
def test_config_rejects_bad_values(overrides, key):
    with pytest.raises(configurator.ConfigError, match=key):
        RAConfig(**{**TINY, **overrides})


GPT2_CONFIGS = ["train_ra_baseline", "train_ra_early", "train_ra_late", "train_ra_all", "train_ra_learn",
                "train_mla", "train_ra_mla"]
# attn_recompute changes memory and time, never a number (test_attention_recompute_same_gradients_less_memory)
RA_KEYS = ("out_dir", "wandb_run_name", "attn_recompute") + tuple(
    f.name for f in fields(RAConfig) if f.name.startswith(("ra_", "mla")))


CPU_TWIN = "ra_shakespeare"  # the overlay that makes any RA recipe its CPU twin


def load_config(name, overlay=""):
    files = [name] + ([overlay] if overlay else [])
    return configurator.apply_config(runtime.DEFAULTS, [os.path.join(REPO, "config", f + ".py") for f in files])


def test_every_ra_config_loads_and_builds_its_model_config():
    names = sorted(os.path.basename(p)[:-3] for p in glob.glob(os.path.join(REPO, "config", "train_ra*.py"))
                   + glob.glob(os.path.join(REPO, "config", "train_mla*.py")))
    assert set(GPT2_CONFIGS) == set(names)
    for name, overlay in itertools.product(names, ("", CPU_TWIN)):
        cfg = load_config(name, overlay)
        assert cfg["model_type"] == "ra", name
        runtime.resolve(dict(cfg), world_size=1)
        model_cfg = runtime.model_config(cfg)
        assert isinstance(model_cfg, RAConfig)


def test_ra_ablation_configs_differ_only_in_ra_keys():
    """Identical optimizer, batch, schedule and budget across the set, and the trunk's recipe: GPT-2's
    for the full-size set, the character-level twin's overlay (ra_shakespeare.py) for the CPU set."""
    for overlay, base_file in (("", "train_gpt2"), (CPU_TWIN, CPU_TWIN)):
        configs = {name: load_config(name, overlay) for name in GPT2_CONFIGS}
        reference = configs["train_ra_baseline"]
        for name, cfg in configs.items():
            diff = {k for k in cfg if cfg[k] != reference[k]}
            assert diff <= set(RA_KEYS), (name, diff)
        if not overlay:  # each GPU run has its own directory; the twins' runs are named by the suite
            assert len({cfg["out_dir"] for cfg in configs.values()}) == len(configs)
        trunk = load_config(base_file)
        diff = {k for k in reference if reference[k] != trunk[k]}
        assert diff <= {"model_type", "out_dir", "wandb_run_name", "wandb_project", "sample_tokens",
                        "mla_latent_dim"}, diff
    late = runtime.model_config(load_config("train_ra_late"))
    assert [late.layer_mode(i) for i in range(12)] == [None] * 6 + ["mix"] * 6
    assert runtime.model_config(load_config("train_ra_learn")).layer_mode(0) == "gate"
    mla = runtime.model_config(load_config("train_ra_mla"))
    assert mla.mla and mla.mla_latent_dim == 128 and mla.ra_alpha == 0.5 and mla.ra_window == 64


def test_config_files_can_include_a_neighbour_from_any_directory(tmp_path, monkeypatch):
    (tmp_path / "base.py").write_text("batch_size = 7\nout_dir = 'base'\n")
    (tmp_path / "child.py").write_text(
        "import os\nexec(open(os.path.join(os.path.dirname(__file__), 'base.py')).read())\nout_dir = 'child'\n")
    monkeypatch.chdir(REPO)  # a different directory from the config's
    cfg = configurator.apply_config(runtime.DEFAULTS, [str(tmp_path / "child.py")])
    assert cfg["batch_size"] == 7 and cfg["out_dir"] == "child"


# ---------------------------------------------------------------- train.py

def test_train_logs_learned_gates_into_log_jsonl(tmp_path):
    from helpers import VOCAB, events, tiny_args
    import numpy as np
    import tokendata
    data = tmp_path / "toy"
    data.mkdir()
    rng = np.random.default_rng(0)
    for split, n in (("train", 5000), ("val", 2000)):
        tokendata.write_split(str(data / f"{split}.bin"), [(np.arange(n) + rng.integers(0, 3, n)) % VOCAB])
    out = str(tmp_path / "run")
    train.main(tiny_args(str(data), out, "--model_type=ra", "--ra_pattern=learned", "--ra_window=8",
                         "--max_iters=4", "--lr_decay_iters=4", "--eval_interval=2", "--learning_rate=3e-2"))
    evals = events(out, "eval")
    assert [e["iter"] for e in evals] == [0, 2, 4]
    assert evals[0]["ra_gate_layer0"] == evals[0]["ra_gate_layer1"] == 0.5
    assert all(0.0 < e[f"ra_gate_layer{i}"] < 1.0 for e in evals for i in (0, 1))
    assert evals[-1]["ra_gate_layer0"] != 0.5  # the gate learned something
    assert events(out, "checklist")[0]["model_class"] == "RAGPT"
    ckpt = torch.load(os.path.join(out, "ckpt.pt"), map_location="cpu", weights_only=True)
    assert ckpt["metrics"]["ra_gate_layer1"] == evals[-1]["ra_gate_layer1"]
    model = RAGPT(runtime.model_config(ckpt["config"]))
    model.load_state_dict(ckpt["model"])
    assert model.metrics()["ra_gate_layer0"] == pytest.approx(evals[-1]["ra_gate_layer0"])


@pytest.mark.parametrize("q_latent", [True, False])
def test_ra_mla_config_with_the_triton_kernel_builds_and_trains(data_dir, tmp_path, q_latent, monkeypatch):
    """The documented command `python train.py config/train_ra_mla.py --attn_impl=triton`, shrunk: it
    builds (MLA's baseline init once rebuilt a GPTConfig with attn_impl='triton') and trains a step;
    on a CPU without the interpreter both head layouts take the SDPA path, and say so."""
    import ra_model
    from helpers import events, tiny_args
    monkeypatch.setattr(ra_model, "_warned", set())
    # the claim is about a CPU without the interpreter, whether or not TRITON_INTERPRET=1 is exported
    monkeypatch.setattr(ra_model.fused_kernels(), "INTERPRET", False)
    out = str(tmp_path / "run")
    with pytest.warns(UserWarning, match="running the PyTorch SDPA path"):
        train.main([os.path.join(REPO, "config", "train_ra_mla.py"), os.path.join(REPO, "config", f"{CPU_TWIN}.py"),
                    *tiny_args(data_dir, out, "--attn_impl=triton", "--mla_latent_dim=8", "--max_iters=1",
                               "--lr_decay_iters=1", "--warmup_iters=0", f"--mla_per_head_q_latent={q_latent}")])
    assert [e["iter"] for e in events(out, "eval")] == [0, 1]
    assert events(out, "checklist")[0]["attn_impl"] == "triton"


# ---------------------------------------------------------------- tools/bench_ra_variants.py

def test_bench_measures_what_the_ra_mla_config_runs():
    from tools import bench_ra_variants
    cfg = load_config("train_ra_mla")
    assert cfg["ra_window"] == bench_ra_variants.parse_args([]).ra_window  # what the variant's -1 stands for
    assert all(cfg[k] == v for k, v in bench_ra_variants.VARIANTS["ra_mla"].items() if k != "ra_window")
    assert bench_ra_variants.parse_args(["--preset=gpt2"]).mla_latent_dim == cfg["mla_latent_dim"]


def test_bench_reports_ratios_to_the_baseline(tmp_path, capsys):
    from tools import bench_ra_variants
    out = tmp_path / "bench_ra_variants.json"
    assert bench_ra_variants.main(["--n_layer=2", "--n_head=2", "--n_embd=32", "--block_size=32", "--vocab_size=64",
                       "--batch_size=2", "--steps=1", "--warmup=1", "--variants=ralearn,mla",
                       "--in_process=True", f"--json={out}"]) == 0
    import json
    results = {r["variant"]: r for r in json.loads(out.read_text())["results"]}
    assert list(results) == ["baseline", "ralearn", "mla"]
    assert results["baseline"]["time_ratio"] == results["baseline"]["memory_ratio"] == 1.0
    assert results["ralearn"]["params"] == results["baseline"]["params"] + 2  # one gate logit per layer
    assert results["mla"]["params"] < results["baseline"]["params"]
    for r in results.values():
        assert r["step_ms"] > 0 and r["peak_mib"] > 0 and r["tokens_per_s"] == pytest.approx(64 / (r["step_ms"] / 1000))
        assert r["memory_ratio"] == pytest.approx(r["peak_mib"] / results["baseline"]["peak_mib"])
    table = capsys.readouterr().out
    assert "baseline" in table and "mla" in table and "mem x" in table
