"""RA mix through SDPA with c_attn's output laid out per head (RAAttention.per_head_projection): the same
numbers as the concatenating path it replaced, the doubled key a view of the projection, one graph under
torch.compile."""
import math
import re

import pytest
import torch
from torch.nn import functional as F

from model import Block
from ra_model import RAAttention, RAConfig, RAGPT

CONFIG = dict(block_size=16, vocab_size=64, n_layer=1, n_head=2, n_embd=16, dropout=0.0, ra_pattern="all",
              ra_mode="mix")
CASES = {  # name -> RAConfig overrides: fixed and learned alpha, full and windowed
    "fixed": dict(ra_alpha=0.7),
    "fixed-window": dict(ra_alpha=0.7, ra_window=5),
    "learned-layer": dict(ra_alpha_learn="layer"),
    "learned-head-window": dict(ra_alpha_learn="head", ra_window=3),
}


def mix_layer(**overrides):
    torch.manual_seed(0)
    attn = RAAttention(RAConfig(**{**CONFIG, **overrides}), mode="mix")
    with torch.no_grad():
        attn.c_attn.weight.mul_(4.0)  # scores of order 1, not near-uniform attention
        attn.c_attn.bias.normal_()
        if hasattr(attn, "ra_alpha"):  # alphas that differ by head and are no powers of 2
            attn.ra_alpha.copy_(torch.linspace(-0.6, 0.9, attn.ra_alpha.numel()))
    return attn


def concatenating_attention(attn, x):
    """The path the per-head layout replaced, written out: c_attn(x) split into q, k, v heads, both doubled
    operands concatenated ([q, alpha k] . [k, q]), v zero-padded to 2d as for CPU's flash kernel (zero
    columns change nothing); windowed, the keys twice: [k, q] inside the band, [k, 0] outside it."""
    B, T, C = x.shape
    d = C // attn.n_head
    q, k, v = (t.view(B, T, attn.n_head, d).transpose(1, 2) for t in attn.c_attn(x).split(C, dim=2))
    alpha = attn.ra_alpha.view(1, -1, 1, 1) if hasattr(attn, "ra_alpha") else attn.ra_alpha_value
    q2, k2, v = torch.cat([q, alpha * k], dim=-1), torch.cat([k, q], dim=-1), F.pad(v, (0, d))
    if attn.ra_window:
        causal = torch.ones(T, T, dtype=torch.bool).tril()
        near = causal & ~torch.ones(T, T, dtype=torch.bool).tril(-attn.ra_window)  # 0 <= i - j < window
        k2 = torch.cat([k2, torch.cat([k, torch.zeros_like(q)], dim=-1)], dim=-2)
        y = F.scaled_dot_product_attention(q2, k2, torch.cat([v, v], dim=-2), scale=1 / math.sqrt(d),
                                           attn_mask=torch.cat([near, causal & ~near], dim=-1))
    else:
        y = F.scaled_dot_product_attention(q2, k2, v, is_causal=True, scale=1 / math.sqrt(d))
    return attn.c_proj(y[..., :d].transpose(1, 2).reshape(B, T, C))


@pytest.mark.parametrize("name", CASES)
def test_per_head_layout_equals_the_concatenating_path(name):
    """fp32, forward and every gradient (x, c_attn's weight and bias, alpha, c_proj). Bit for bit: the output
    (alpha scales k, as before, not q, so the doubled operands hold the same values; the matmul and the flash
    kernel sum each element in the same order whatever its column or stride) and what only it and the
    doubled operands feed (alpha's and c_proj's gradients). Within 1e-6 of the tensor's largest element
    (a few ulp): sums whose terms come in another order, x's gradient over c_attn's reordered rows, the
    bias's over reordered columns, and windowed, k's gradient from three uses."""
    attn = mix_layer(**CASES[name])
    assert attn.mixes_kq_view()
    g = torch.Generator().manual_seed(1)
    x = torch.randn(3, CONFIG["block_size"], CONFIG["n_embd"], generator=g).requires_grad_()
    weights = torch.randn(x.shape, generator=g)  # a loss that weighs every output differently
    results = []
    for forward in (attn, lambda x: concatenating_attention(attn, x)):
        out = forward(x)
        results.append((out, *torch.autograd.grad((out * weights).sum(), [x, *attn.parameters()])))
    names = ["output", "x", *(name for name, _ in attn.named_parameters())]
    assert len(names) == (7 if "learned" in name else 6)
    for name, layout, concatenated in zip(names, *results):
        if name in ("output", "ra_alpha", "c_proj.weight", "c_proj.bias"):
            assert torch.equal(layout, concatenated), name
        else:
            torch.testing.assert_close(layout, concatenated, rtol=0, atol=1e-6 * concatenated.abs().max().item(),
                                       msg=name)


def test_the_doubled_key_is_a_view_of_the_projection(monkeypatch):
    """The one copy the layout makes is the doubled query [q | alpha k]: the doubled key SDPA receives shares
    the storage of c_attn's (reordered) matmul output. The control: QK-norm changes q and k before the mixing
    step, so that layer keeps the baseline's split and concatenates the key."""
    linear_outputs, sdpa_operands = [], []
    linear, attention = F.linear, F.scaled_dot_product_attention

    def recorded_linear(*args, **kwargs):
        linear_outputs.append(linear(*args, **kwargs))
        return linear_outputs[-1]

    def recorded_attention(q, k, v, **kwargs):
        sdpa_operands.append((q, k))
        return attention(q, k, v, **kwargs)

    monkeypatch.setattr(F, "linear", recorded_linear)
    monkeypatch.setattr(F, "scaled_dot_product_attention", recorded_attention)
    shares_projection = {}
    for qk_norm in (False, True):
        torch.manual_seed(0)
        block = RAGPT(RAConfig(**CONFIG, qk_norm=qk_norm)).transformer.h[0]
        linear_outputs.clear(), sdpa_operands.clear()
        block.attn(torch.randn(2, CONFIG["block_size"], CONFIG["n_embd"]))
        projection = linear_outputs[0].untyped_storage().data_ptr()  # c_attn's; the second is c_proj
        (query, key), = sdpa_operands
        assert query.size(-1) == key.size(-1) == 2 * CONFIG["n_embd"] // CONFIG["n_head"]
        assert query.untyped_storage().data_ptr() != projection
        shares_projection[qk_norm] = key.untyped_storage().data_ptr() == projection
    assert shares_projection == {False: True, True: False}


def test_a_compiled_block_runs_the_layout_in_one_graph():
    """torch.compile traces the reordering, the doubled query and the SDPA call without a graph break
    (fullgraph) and the compiled block computes what the eager one does, gradients included."""
    config = RAConfig(**CONFIG, ra_alpha_learn="head")
    block = Block(config, attn=mix_layer(ra_alpha_learn="head"))
    x = torch.randn(2, CONFIG["block_size"], CONFIG["n_embd"], generator=torch.Generator().manual_seed(1))
    results = []
    for run in (block, torch.compile(block, backend="aot_eager", fullgraph=True)):
        out = run(x)
        results.append((out, *torch.autograd.grad(out.square().sum(), list(block.parameters()))))
    for eager, compiled in zip(*results):
        torch.testing.assert_close(compiled, eager, atol=1e-6, rtol=1e-6)


def test_the_layout_benchmark_times_both_paths_in_one_run(capsys):
    from tools import bench_ra_layout
    bench_ra_layout.main(["--B=1", "--T=16", "--n_head=2", "--n_embd=16", "--ra_window=4", "--warmup=0", "--reps=2",
                          "--device=cpu"])
    out = capsys.readouterr().out
    assert "B=1 T=16 2 heads of 8, window 4, float32, median of 2" in out
    assert re.search(r"concatenated +\d+\.\d{3} ms  1\.00x\n", out)
    assert re.search(r"per_head +\d+\.\d{3} ms  \d+\.\d\dx\n", out)
