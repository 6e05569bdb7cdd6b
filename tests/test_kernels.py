"""The fused RA kernels (kernels/ra_attention.py) against their PyTorch reference,
ra_model.reciprocal_manual (and model.causal_attention for the standard stream).

The kernels run on CPU under Triton's interpreter. TRITON_INTERPRET must be set when triton is
imported and the kernels decorated, so this module loads a private copy of kernels/ra_attention.py
with it set (load_interpreted_ra), and sets it again only while its own tests run: other test
modules (and the subprocesses they start) keep the ordinary import. The interpreter runs a 16 x 16
tile (ra_attention.INTERPRET_TILE), so T = 37 spans three blocks with a ragged tail; one test runs
the unequal tiles the GPU lists hold. Each interpreted call takes ~0.05-0.4 s here.
"""

import collections
import importlib.util
import itertools
import math
import os
import subprocess
import sys
import warnings

import pytest
import torch
import torch.nn.functional as F
from torch.utils._python_dispatch import TorchDispatchMode

from model import causal_attention
from ra_model import reciprocal_manual

_PATH = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "kernels", "ra_attention.py")


def load_interpreted_ra():
    """A private copy of kernels/ra_attention.py whose kernels run under Triton's interpreter.

    Triton reads TRITON_INTERPRET when it is imported (its own tl.sum, tl.max ... are jit
    functions) and when kernels are decorated; so triton is (re)imported with it set. A triton
    imported earlier without it is dropped from sys.modules first, all but its C extension (modules that
    already hold it keep their reference). The variable is restored afterwards.
    """
    old = os.environ.get("TRITON_INTERPRET")
    os.environ["TRITON_INTERPRET"] = "1"
    try:
        if "triton" in sys.modules and type(sys.modules["triton"].language.standard.cdiv).__name__ == "JITFunction":
            # triton._C stays: its C extension loads once per process, and a purged copy comes back without
            # the submodules it registered (triton._C.libtriton.linear_layout), breaking every later import
            for name in [n for n in sys.modules if (n == "triton" or n.startswith("triton."))
                         and not n.startswith("triton._C")]:
                del sys.modules[name]
        pytest.importorskip("triton", reason="triton is not installed (pip install -r requirements-dev.txt)")
        spec = importlib.util.spec_from_file_location("ra_attention_interpreted", _PATH)
        module = importlib.util.module_from_spec(spec)
        spec.loader.exec_module(module)
    finally:
        _restore(old)
    assert module.INTERPRET
    return module


def _restore(old):
    if old is None:
        os.environ.pop("TRITON_INTERPRET", None)
    else:
        os.environ["TRITON_INTERPRET"] = old


ra = load_interpreted_ra()


@pytest.fixture(autouse=True, scope="module")
def _interpreter_env():
    """Triton's runtime also reads TRITON_INTERPRET lazily (first launch imports more of it)."""
    old = os.environ.get("TRITON_INTERPRET")
    os.environ["TRITON_INTERPRET"] = "1"
    yield
    _restore(old)


MODES = ra.MODES
# tolerances against a float64 reference, as (atol, rtol), for outputs and gradients
TOL = {torch.float32: (2e-5, 1e-4), torch.float16: (1e-2, 1e-2), torch.bfloat16: (6e-2, 5e-2),
       torch.float64: (1e-6, 1e-6)}


def reference(q, k, v, mode, alpha=None, gate_logit=None, window=0):
    """The kernel's interface over the one PyTorch reference (per-head values as (1, H, 1, 1))."""
    per_head = lambda x: x.view(1, -1, 1, 1) if torch.is_tensor(x) and x.dim() == 1 else x
    if mode == "standard":
        return causal_attention(q, k, v, "manual", 0.0)
    p = torch.sigmoid(torch.as_tensor(per_head(gate_logit))) if mode == "gate" else None
    return reciprocal_manual(q, k, v, mode, per_head(alpha) if mode == "mix" else 0.0, p, window, 0.0)


def _inputs(shape, dtype, mode, per_head, seed=0):
    g = torch.Generator().manual_seed(seed)
    q, k, v = (torch.randn(shape, generator=g, dtype=torch.float64).to(dtype) for _ in range(3))
    H = shape[1]
    extra = {}
    if mode == "mix":
        extra["alpha"] = torch.linspace(-0.7, 0.9, H, dtype=torch.float64) if per_head else torch.tensor(0.6)
    if mode == "gate":
        extra["gate_logit"] = torch.linspace(-1.0, 1.5, H, dtype=torch.float64) if per_head else torch.tensor(0.3)
    return q, k, v, {name: t.float() for name, t in extra.items()}


def _run(fn, q, k, v, mode, extra, window, do, **options):
    """Output and the gradients of (o * do).sum() with respect to q, k, v and alpha / gate_logit."""
    leaves = [t.detach().clone().requires_grad_() for t in (q, k, v)]
    params = {name: t.detach().clone().requires_grad_() for name, t in extra.items()}
    out = fn(*leaves, mode, window=window, **params, **options)
    grads = torch.autograd.grad((out.double() * do).sum(), leaves + list(params.values()))
    return out, grads


def _assert_close(actual, expected, dtype, what):
    atol, rtol = TOL[dtype]
    err = (actual.double() - expected.double()).abs().max().item()
    torch.testing.assert_close(actual.double(), expected.double(), atol=atol, rtol=rtol,
                               msg=lambda m: f"{what}: max abs err {err:.3g}\n{m}")


# (dtype, (B, H, T, D), window, per_head). T = 37 and 20 are not multiples of the tile; T = 1 is
# a single query; D = 16, 32, 64 and one D = 24 that is not a power of two (masked head lanes).
# Windows 2 and 18 put the band's edge one key past a tile boundary, where skipping whole tiles
# outside the band (swap) would go wrong first.
CASES = [
    (torch.float32, (2, 2, 37, 16), 0, True),
    (torch.float32, (1, 3, 20, 64), 2, False),
    (torch.float32, (1, 2, 1, 32), 0, True),
    (torch.float16, (1, 2, 37, 32), 18, True),
    (torch.bfloat16, (1, 2, 37, 24), 0, False),
]


@pytest.mark.parametrize("dtype,shape,window,per_head", CASES, ids=lambda c: str(c).replace("torch.", ""))
@pytest.mark.parametrize("mode", MODES)
def test_kernel_matches_reference(mode, dtype, shape, window, per_head):
    q, k, v, extra = _inputs(shape, dtype, mode, per_head)
    do = torch.randn(shape, generator=torch.Generator().manual_seed(1), dtype=torch.float64)
    out, grads = _run(ra.reciprocal_attention, q, k, v, mode, extra, window, do)
    ref_extra = {name: t.double() for name, t in extra.items()}
    ref, ref_grads = _run(reference, q.double(), k.double(), v.double(), mode, ref_extra, window, do)
    assert out.dtype == dtype and out.shape == shape
    _assert_close(out, ref, dtype, "output")
    names = ["dq", "dk", "dv"] + ["d" + name for name in extra]
    for name, grad, ref_grad in zip(names, grads, ref_grads):
        _assert_close(grad, ref_grad, dtype, name)


def _assert_float32_matches_reference(shape, mode, window, **options):
    """float32 output and every gradient (per-head alpha or gate) against the float64 reference."""
    q, k, v, extra = _inputs(shape, torch.float32, mode, per_head=True)
    do = torch.randn(shape, generator=torch.Generator().manual_seed(1), dtype=torch.float64)
    out, grads = _run(ra.reciprocal_attention, q, k, v, mode, extra, window, do, **options)
    ref, ref_grads = _run(reference, q.double(), k.double(), v.double(), mode,
                          {name: t.double() for name, t in extra.items()}, window, do)
    _assert_close(out, ref, torch.float32, f"{mode} window {window} output")
    for name, grad, ref_grad in zip(["dq", "dk", "dv"] + ["d" + n for n in extra], grads, ref_grads):
        _assert_close(grad, ref_grad, torch.float32, f"{mode} window {window} {name}")


@pytest.mark.parametrize("tile,T", [((32, 64), 100), ((64, 32), 100), ((16, 32), 100), ((16, 128), 300)])
def test_unequal_tiles_match_the_reference(tile, T, monkeypatch):
    """The GPU lists hold BLOCK_M != BLOCK_N (the column kernel walks BLOCK_M-row blocks from a
    BLOCK_N-aligned start), up to sm90's 128 held key rows in mix's column kernel; T spans several
    tiles of each shape with a ragged tail (300: three 128-key blocks). One head: the tiles walk
    within a head (heads at other offsets, and their own alpha and gate, are the other tests')."""
    monkeypatch.setattr(ra, "INTERPRET_TILE", tile)
    shape = (1, 1, T, 16)
    for mode, window in (("swap", 40), ("mix", 0), ("mix", 33), ("gate", 7)):
        _assert_float32_matches_reference(shape, mode, window)


@pytest.mark.parametrize("D", [32, 24])
def test_a_head_split_into_column_chunks_matches_the_reference(D, monkeypatch):
    """RDNA3 at D = 128 runs each block as two programs of 64 head columns that compute the
    scores chunk by chunk (head_chunk): here chunks of 16 split D = 32 in two, and D = 24 into a
    full chunk and one with 8 masked lanes; the band, dalpha, the gate and both backward paths."""
    monkeypatch.setattr(ra, "INTERPRET_HEAD_CHUNK", 16)
    assert ra._meta(torch.empty(1, 2, 37, D), 37, False)["BLOCK_DC"] == 16
    shape = (1, 1, 37, D)
    for mode, window in (("swap", 18), ("mix", 7), ("gate", 3)):
        _assert_float32_matches_reference(shape, mode, window)
    _assert_float32_matches_reference(shape, "mix", 0, deterministic=True)


@pytest.mark.parametrize("mode", ["swap", "mix"])
def test_every_band_edge_against_the_reference(mode):
    """The loops walk their tiles in runs (outside the band, cut by its edge, inside it, the
    diagonal), each run with bounds of its own: windows on both sides of every tile boundary
    (16 x 16 tiles, T = 40), the atomic path."""
    for window in (1, 15, 16, 17, 31, 33):
        _assert_float32_matches_reference((1, 1, 40, 16), mode, window)


def test_only_whole_tiles_drop_the_masks(monkeypatch):
    """EVEN (_even_tiles, per autotune configuration): T a multiple of both block sizes and a head size
    that fills BLOCK_D; a ragged T, a T that one block size does not divide, or a padded head keep them,
    and on a GPU so do head sizes above 64 and CDNA (mask_free_tiles: they spilled without them)."""
    even = lambda T, D, block_m, block_n, block_d: ra._even_tiles(dict(T=T, D=D, BLOCK_M=block_m, BLOCK_N=block_n,
                                                                        BLOCK_D=block_d))
    assert even(1024, 64, 128, 64, 64) and even(2048, 128, 16, 128, 128) and even(32, 16, 16, 16, 16)  # interpreter
    assert not even(1000, 64, 16, 64, 64) and not even(96, 64, 32, 64, 64) and not even(1024, 48, 16, 64, 64)
    monkeypatch.setattr(ra, "INTERPRET", False)  # a GPU launch asks its target
    monkeypatch.setattr(torch.cuda, "current_device", lambda: 0)
    for target, block_d, takes in (("sm90", 64, True), ("gfx1100", 32, True), ("sm90", 128, False),
                                   ("gfx942", 64, False)):
        monkeypatch.setattr(ra, "gpu_target", lambda device, target=target: target)
        assert even(1024, block_d, 128, 64, block_d) == takes == ra.mask_free_tiles(target, block_d), target


@pytest.mark.parametrize("T", [32, 37])
def test_even_and_ragged_sequences_match_the_reference(T, monkeypatch):
    """T = 32 fills its 16 x 16 tiles: every launch takes EVEN (loads, stores and atomic adds without
    masks); T = 37 leaves a ragged tail and none does. Every mode, band edges, both backward paths."""
    seen = set()

    def recorded(args):
        seen.add(ra._even_tiles(args))
        return ra._even_tiles(args)

    for tuned in (ra._fwd_tuned, ra._bwd_col_tuned, ra._bwd_row_tuned):  # what each launch decided
        monkeypatch.setitem(tuned.fn.values, "EVEN", recorded)
    for mode, window, deterministic in (("swap", 7, False), ("mix", 0, False), ("mix", 9, False), ("mix", 9, True),
                                        ("gate", 5, False)):
        _assert_float32_matches_reference((1, 2, T, 16), mode, window, deterministic=deterministic)
    assert seen == {T % 16 == 0}


@pytest.mark.parametrize("mode,window,deterministic,dtype", [
    ("standard", 0, False, torch.float32), ("swap", 7, False, torch.float16), ("mix", 0, False, torch.float32),
    ("mix", 9, False, torch.float32), ("mix", 9, True, torch.float32), ("gate", 5, False, torch.float32)])
def test_tma_loads_give_the_pointer_loads_results_bit_for_bit(mode, window, deterministic, dtype, monkeypatch):
    """TMA (_tma_tiles), forced under the interpreter: every kernel that runs loads its streamed tiles
    through tensor descriptors, the same tiles summed in the same order as the pointer loads, so the
    output and every gradient are bit for bit those of the pointer path. T = 32 fills the 16 x 16 tiles
    (EVEN); windowed mix's deterministic backward adds the row kernel, gate runs two streams."""
    shape = (1, 2, 32, 16)
    q, k, v, extra = _inputs(shape, dtype, mode, per_head=True)
    do = torch.randn(shape, generator=torch.Generator().manual_seed(1), dtype=torch.float64)
    pointer = _run(ra.reciprocal_attention, q, k, v, mode, extra, window, do, deterministic=deterministic)

    names = {id(ra._fwd_tuned): "fwd", id(ra._bwd_col_tuned): "col", id(ra._bwd_row_tuned): "row"}
    running, descriptor_loads = [], collections.Counter()
    launch, builder = ra._launch, ra.triton.runtime.interpreter.interpreter_builder
    load = builder.create_descriptor_load

    def named_launch(tuned, *args):
        running.append(names[id(tuned)])
        launch(tuned, *args)
        running.pop()

    def counted_load(*args, **kwargs):
        descriptor_loads[running[-1]] += 1
        return load(*args, **kwargs)

    monkeypatch.setattr(ra, "_launch", named_launch)
    monkeypatch.setattr(builder, "create_descriptor_load", counted_load)
    monkeypatch.setattr(ra, "INTERPRET_TMA", True)
    tma = _run(ra.reciprocal_attention, q, k, v, mode, extra, window, do, deterministic=deterministic)
    assert set(descriptor_loads) == ({"fwd", "col", "row"} if deterministic else {"fwd", "col"}), descriptor_loads
    assert torch.equal(tma[0], pointer[0])
    for name, t, p in zip(["dq", "dk", "dv"] + ["d" + n for n in extra], tma[1], pointer[1]):
        assert torch.equal(t, p), name


@pytest.mark.parametrize("T,tile,deterministic", [(64, (16, 64), False), (128, (128, 64), True),
                                                   (192, (64, 64), False)])
def test_gpt2s_even_and_tma_path_matches_the_reference_and_the_pointer_loads(T, tile, deterministic, monkeypatch):
    """The path GPT-2 takes on an H100 (T = 1024 at D = 64: EVEN, and TMA on sm90) at T multiples of 64
    under the interpreter, with the sm90 lists' tiles (128 x 64 and 64 x 64 forward, 16 x 64 column) and
    D = 64, q, k, v strided views of one projection as the model passes them: every launch takes EVEN
    (recorded), TMA forced (INTERPRET_TMA) loads by descriptor in every kernel, gives the pointer loads'
    output and gradients bit for bit, and both match the float64 reference. RA_TMA=0 (USE_TMA False)
    turns the forced TMA off again."""
    B, H, D = 1, 2, 64
    monkeypatch.setattr(ra, "INTERPRET_TILE", tile)
    seen = collections.Counter()

    def recorded(name):
        def decide(args):
            taken = ra.__dict__[name](args)
            seen[name, taken] += 1
            return taken
        return decide

    for tuned in (ra._fwd_tuned, ra._bwd_col_tuned, ra._bwd_row_tuned):
        monkeypatch.setitem(tuned.fn.values, "EVEN", recorded("_even_tiles"))
        monkeypatch.setitem(tuned.fn.values, "TMA", recorded("_tma_tiles"))
    monkeypatch.setattr(ra, "INTERPRET_TMA", True)
    g = torch.Generator().manual_seed(T)
    x = torch.randn(B, T, 3 * H * D, generator=g, dtype=torch.float64)
    do = torch.randn(B, H, T, D, generator=g, dtype=torch.float64)
    for mode, window in (("swap", 0), ("mix", 0), ("mix", 80), ("gate", 0)):
        _, _, _, extra = _inputs((B, H, T, D), torch.float32, mode, per_head=True)
        q, k, v = (t.view(B, T, H, D).transpose(1, 2) for t in x.float().split(H * D, dim=2))
        assert not q.is_contiguous() and q.stride(-1) == 1
        runs = {}
        # TMA forced, then off by RA_TMA=0 (USE_TMA False): the pointer loads (that the interpreter's
        # default takes no TMA is test_tma_only_on_hopper_for_whole_aligned_tiles' to assert)
        for use in (True, False):
            monkeypatch.setattr(ra, "USE_TMA", use)
            seen.clear()
            runs[use] = _run(ra.reciprocal_attention, q, k, v, mode, extra, window, do, deterministic=deterministic)
            assert seen[("_even_tiles", False)] == 0 and seen[("_even_tiles", True)] > 0, (mode, seen)
            assert dict(seen)[("_tma_tiles", use)] > 0 and ("_tma_tiles", not use) not in seen
        assert torch.equal(runs[True][0], runs[False][0]), f"{mode} {window} output"
        for name, t, p in zip(["dq", "dk", "dv"] + ["d" + n for n in extra], runs[True][1], runs[False][1]):
            assert torch.equal(t, p), f"{mode} {window} {name}"
        ref, ref_grads = _run(reference, q.double(), k.double(), v.double(), mode,
                              {name: t.double() for name, t in extra.items()}, window, do)
        _assert_close(runs[True][0], ref, torch.float32, f"{mode} window {window} output")
        for name, grad, ref_grad in zip(["dq", "dk", "dv"] + ["d" + n for n in extra], runs[True][1], ref_grads):
            _assert_close(grad, ref_grad, torch.float32, f"{mode} window {window} {name}")


def test_ra_tma_is_read_once_and_refuses_other_values():
    """RA_TMA (the A/B switch): unset or '1' keeps TMA where sm90 takes it, '0' turns it off; anything
    else is refused naming the key."""
    assert ra.tma_switch(None) and ra.tma_switch("1") and not ra.tma_switch("0")
    with pytest.raises(ValueError, match="RA_TMA='off': use RA_TMA=0"):
        ra.tma_switch("off")
    env = dict(os.environ, RA_TMA="0", TRITON_INTERPRET="0")
    code = "import kernels.ra_attention as ra; print(ra.USE_TMA)"
    out = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=120,
                         cwd=os.path.dirname(os.path.dirname(_PATH)))
    assert out.stdout.strip() == "False", out.stderr


def test_tma_only_on_hopper_for_whole_aligned_tiles(monkeypatch):
    """TMA (_tma_tiles, decided after EVEN): on sm90 only, the target it is compile-checked for (tma_loads), where the tiles are
    EVEN (there: D <= 64, mask_free_tiles) and whole rows, and each operand's rows start 16-byte
    aligned, as a descriptor needs; elsewhere the pointer loads. The interpreter takes it only where
    a test forces it (INTERPRET_TMA)."""
    assert [ra.tma_loads(t) for t in ("sm80", "sm86", "sm89", "sm90", "sm100", "sm120", "gfx942", "gfx1100")] == [
        False, False, False, True, False, False, False, False]

    def tma(x, T=None, **operands):
        T, D = T or x.size(2), x.size(3)
        block_d = max(16, 1 << (D - 1).bit_length())
        args = dict(dict(A=x, B=x, V=x, DO=x), **operands, stride_b=x.stride(0), stride_h=x.stride(1),
                    stride_t=x.stride(2), T=T, D=D, BLOCK_M=128, BLOCK_N=64, BLOCK_D=block_d, BLOCK_DC=block_d)
        args["EVEN"] = ra._even_tiles(args)
        return ra._tma_tiles(args)

    x = torch.empty(1, 2, 1024, 64, dtype=torch.bfloat16)
    assert not tma(x)  # the interpreter's default
    monkeypatch.setattr(ra, "INTERPRET", False)  # a GPU launch asks its target
    monkeypatch.setattr(torch.cuda, "current_device", lambda: 0)
    for target, takes in (("sm90", True), ("sm100", False), ("sm80", False), ("gfx942", False), ("gfx1100", False)):
        monkeypatch.setattr(ra, "gpu_target", lambda device, target=target: target)
        assert tma(x) == takes, target
    monkeypatch.setattr(ra, "gpu_target", lambda device: "sm90")
    unaligned = torch.empty(2 * 1024 * 64 + 1, dtype=torch.bfloat16)[1:].view(1, 2, 1024, 64)
    assert tma(x[:, :, :512]) and not tma(x, T=1000) and not tma(x[:, :, :96])  # T = 96: not a multiple of 128
    assert not tma(torch.empty(1, 2, 1024, 128, dtype=torch.bfloat16))  # no EVEN at D = 128 on NVIDIA
    assert not tma(torch.empty(1, 2, 1024, 48, dtype=torch.bfloat16))  # a padded head
    assert not tma(x, V=unaligned) and not tma(x, DO=unaligned)
    assert not tma(torch.empty(1, 2, 1024, 68, dtype=torch.bfloat16)[..., :64])  # 136-byte rows


@pytest.mark.parametrize("mode,window", [("standard", 0), ("swap", 7), ("mix", 0), ("mix", 18), ("gate", 5)])
def test_the_atomic_and_deterministic_backward_agree(mode, window):
    """deterministic=True replaces the column kernel's atomic adds of the row halves (dQ from S,
    mix's dK from alpha R) by a row-parallel launch: the same gradients up to rounding, and bit for bit
    the same from run to run."""
    shape = (1, 2, 37, 16)
    q, k, v, extra = _inputs(shape, torch.float32, mode, per_head=True)
    do = torch.randn(shape, generator=torch.Generator().manual_seed(1), dtype=torch.float64)
    atomic = _run(ra.reciprocal_attention, q, k, v, mode, extra, window, do, deterministic=False)
    det = _run(ra.reciprocal_attention, q, k, v, mode, extra, window, do, deterministic=True)
    assert torch.equal(atomic[0], det[0])  # one forward
    for name, a, d in zip(["dq", "dk", "dv"] + ["d" + n for n in extra], atomic[1], det[1]):
        torch.testing.assert_close(a, d, atol=1e-6, rtol=1e-5, msg=name)
    again = _run(ra.reciprocal_attention, q, k, v, mode, extra, window, do, deterministic=True)
    assert all(torch.equal(a, b) for a, b in zip(det[1], again[1]))


def test_the_deterministic_path_is_the_default_under_torch_deterministic_algorithms(monkeypatch):
    seen = []
    monkeypatch.setattr(ra, "_fused_forward_op", lambda *a: seen.append(a[-1]) or [a[0]])
    q = torch.randn(1, 1, 4, 16)
    ra.reciprocal_attention(q, q, q, "swap")
    monkeypatch.setattr(torch, "are_deterministic_algorithms_enabled", lambda: True)
    ra.reciprocal_attention(q, q, q, "swap")
    ra.reciprocal_attention(q, q, q, "swap", deterministic=False)
    monkeypatch.setattr(ra, "DETERMINISTIC", True)
    monkeypatch.setattr(torch, "are_deterministic_algorithms_enabled", lambda: False)
    ra.reciprocal_attention(q, q, q, "swap")
    assert seen == [False, True, False, True]


def test_rdna3s_single_masked_loop_matches_the_reference(monkeypatch):
    """SPLIT=False (RDNA3, split_loops): every tile in one masked loop, band or not."""
    monkeypatch.setattr(ra, "INTERPRET_SPLIT", False)
    assert not ra._meta(torch.empty(1, 1, 8, 16), 8, False)["SPLIT"]
    assert not ra.split_loops("gfx1100") and ra.split_loops("gfx942") and ra.split_loops("sm90")
    for mode, window, deterministic in (("swap", 18, False), ("mix", 0, False), ("mix", 7, False), ("gate", 3, False),
                                        ("mix", 7, True)):
        _assert_float32_matches_reference((1, 1, 37, 16), mode, window, deterministic=deterministic)


@pytest.mark.parametrize("split", [True, False])
def test_the_reciprocal_pass_matches_the_reference_and_the_one_pass_backward(split, monkeypatch):
    """recip_pass (AMD, and windowed mix at D = 128 on NVIDIA): mix's column backward as two passes,
    the S half and then the alpha R half into buffers of their own, with and without the loop runs.
    Against the reference on both backward paths and every band edge; the deterministic path's
    gradients bit for bit those of the one-pass kernel (each accumulator sums the same products in
    the same order, and the second pass's buffers only add zeros)."""
    monkeypatch.setattr(ra, "INTERPRET_SPLIT", split)
    shape = (1, 2, 40, 16)
    q, k, v, extra = _inputs(shape, torch.float32, "mix", per_head=True)
    do = torch.randn(shape, generator=torch.Generator().manual_seed(1), dtype=torch.float64)
    names = ["dq", "dk", "dv", "dalpha"]

    def backward(saved, window, deterministic, recip):
        """dq, dk, dv and dalpha of (o * do).sum(), as reciprocal_attention's autograd computes them."""
        monkeypatch.setattr(ra, "INTERPRET_RECIP_PASS", recip)
        grads, dalpha = ra._fused_backward(q, k, v, extra["alpha"], saved, [do.float()], "mix", window, deterministic)
        return [*grads, dalpha]

    for window in (0, 1, 15, 17, 33):
        # the forward does not depend on the backward's structure: one serves the three backwards
        saved = ra._fused_forward(q, k, v, extra["alpha"], "mix", window, True)
        one, two = backward(saved, window, True, False), backward(saved, window, True, True)
        atomic = backward(saved, window, False, True)
        assert all(torch.equal(a, b) for a, b in zip(one, two)), window
        ref, ref_grads = _run(reference, q.double(), k.double(), v.double(), "mix",
                              {name: t.double() for name, t in extra.items()}, window, do)
        _assert_close(saved[0], ref, torch.float32, f"window {window} output")
        for path, grads in (("deterministic", two), ("atomic", atomic)):  # both backward paths, two passes
            for name, grad, ref_grad in zip(names, grads, ref_grads):
                _assert_close(grad, ref_grad, torch.float32, f"window {window} {path} {name}")


class _DeviceWork(TorchDispatchMode):
    """Counts the operators of a backward call that run on the device, by name (not views or empty
    allocations), and each Triton launch; the interpreter's own work inside a launch is skipped."""

    def __init__(self, monkeypatch):
        super().__init__()
        self.ops, self.inside = collections.Counter(), False
        launch, self.delta = ra._launch, ra._ra_delta_kernel
        names = {id(ra._bwd_col_tuned): "col", id(ra._bwd_row_tuned): "row"}
        monkeypatch.setattr(ra, "_launch", lambda tuned, *a: self.launch(names[id(tuned)], launch, tuned, *a))
        monkeypatch.setattr(ra, "_ra_delta_kernel", self)

    def launch(self, name, fn, *args, **kwargs):
        self.ops[name] += 1
        self.inside = True
        try:
            fn(*args, **kwargs)
        finally:
            self.inside = False

    def __getitem__(self, grid):  # stands in for _ra_delta_kernel[grid](...)
        return lambda *a, **kw: self.launch("delta", self.delta[grid], *a, **kw)

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        name = func.__name__.split(".")[0]
        if not (self.inside or func.is_view or name.startswith("empty") or name in ("new_empty", "unbind")):
            self.ops[name] += 1
        return func(*args, **(kwargs or {}))


# (mode, deterministic, recip_pass) -> launches, zero fills of one backward call in float32 (4-14
# launches with 3-5 fills before, docs/kernels.md).
# Each stream: Delta, the column kernel (twice with recip), the row kernel (deterministic), one
# fill of the atomic targets (none when deterministic); mix: one add of the second buffer pair
# (recip or deterministic) and dalpha's per-head sum; gate: one add of its streams; a mode without
# mix: dalpha's zeros.
LAUNCHES = {("standard", False, False): (4, 2), ("standard", True, False): (4, 1),
            ("swap", False, False): (4, 2), ("swap", True, False): (4, 1),
            ("mix", False, False): (4, 1), ("mix", False, True): (6, 1),
            ("mix", True, False): (5, 0), ("mix", True, True): (6, 0),
            ("gate", False, False): (8, 3), ("gate", True, False): (8, 1)}


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_the_backward_launches_and_zero_fills_per_call(dtype, monkeypatch):
    """The launches and zero fills of one backward call, counted: a fill that the kernels overwrite,
    a second fill of the atomic targets or a cast per gradient comes back as a failure here. bfloat16
    adds one cast (dq, dk, dv in one tensor)."""
    q, k, v = (torch.randn(1, 2, 9, 16).to(dtype) for _ in range(3))  # one block: the counts are per call
    alpha = ra.alpha_per_head(0.5, 2, q.device, torch.float32)
    # the forward does not depend on the backward's structure: one per mode serves each of its backwards
    forwards = {mode: ra._fused_forward(q, k, v, alpha, mode, 0, False) for mode in MODES}
    seen = {}
    for mode, deterministic, recip in LAUNCHES:
        monkeypatch.setattr(ra, "INTERPRET_RECIP_PASS", recip)
        saved = forwards[mode]
        douts = [torch.randn_like(o) for o in saved[:len(saved) // 2]]
        with monkeypatch.context() as m, _DeviceWork(m) as work:
            ra._fused_backward(q, k, v, alpha, saved, douts, mode, 0, deterministic)
        fills = sum(n for name, n in work.ops.items() if "zero" in name or "fill" in name)
        seen[mode, deterministic, recip] = sum(work.ops.values()), fills
    cast = int(dtype != torch.float32)
    assert seen == {case: (launches + cast, fills) for case, (launches, fills) in LAUNCHES.items()}


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, torch.float16])
def test_strided_inputs_as_the_model_passes_them(dtype):
    """The model's q, k, v are (B, T, H, D) -> (B, H, T, D) transposes of one qkv projection (views
    with a shared stride), in its training dtypes; outputs and gradients, per-head alpha and gate."""
    B, T, H, D = 1, 37, 2, 16
    g = torch.Generator().manual_seed(3)
    qkv = torch.randn(B, T, 3 * H * D, generator=g, dtype=torch.float64).to(dtype)
    q, k, v = (t.view(B, T, H, D).transpose(1, 2) for t in qkv.split(H * D, dim=-1))
    assert not q.is_contiguous() and q.stride() == k.stride() == v.stride()
    do = torch.randn(B, H, T, D, generator=g, dtype=torch.float64)
    cases = (("swap", 5), ("mix", 0), ("mix", 20), ("gate", 0)) if dtype == torch.float32 else (("mix", 20), ("gate", 0))
    for mode, window in cases:
        _, _, _, extra = _inputs((B, H, T, D), dtype, mode, per_head=True)
        out, grads = _run(ra.reciprocal_attention, q, k, v, mode, extra, window, do)
        ref, ref_grads = _run(reference, q.double(), k.double(), v.double(), mode,
                              {n: t.double() for n, t in extra.items()}, window, do)
        assert out.dtype == dtype
        _assert_close(out, ref, dtype, f"{mode} {window} output")
        for name, grad, ref_grad in zip(["dq", "dk", "dv"] + ["d" + n for n in extra], grads, ref_grads):
            _assert_close(grad, ref_grad, dtype, f"{mode} {window} {name}")


@pytest.mark.parametrize("mode", ["mix", "gate"])
def test_compiles_into_one_graph_with_the_eager_results(mode):
    """The kernels are custom ops (torch.library): torch.compile traces one opaque op each way, with
    no graph break (fullgraph), the shapes of both from their fake functions (aot_eager traces the
    backward too), and computes what eager computes."""
    from torch._dynamo.utils import counters
    q, k, v, extra = _inputs((1, 2, 20, 16), torch.float32, mode, per_head=True)
    do = torch.randn(q.shape, generator=torch.Generator().manual_seed(1), dtype=torch.float64)
    out, grads = _run(ra.reciprocal_attention, q, k, v, mode, extra, 0, do)
    torch._dynamo.reset()
    counters.clear()
    compiled = torch.compile(ra.reciprocal_attention, fullgraph=True, backend="aot_eager")
    out_c, grads_c = _run(compiled, q, k, v, mode, extra, 0, do)
    assert not counters["graph_break"]
    torch.testing.assert_close(out_c, out, rtol=0, atol=0)
    for g_c, g in zip(grads_c, grads):
        torch.testing.assert_close(g_c, g, rtol=1e-6, atol=1e-7)


def test_the_delta_kernel_is_rowsum_of_do_times_o():
    o, do = (torch.randn(2, 3, 37, 24, dtype=torch.float64) for _ in range(2))
    torch.testing.assert_close(ra._delta(o, do), (o * do).sum(-1).view(6, 37))


def test_only_rdna3_splits_the_head_and_only_above_64_columns():
    """The split costs a second computation of the scores: NVIDIA and CDNA (MI300X; spill-free at 128
    with whole rows) and D <= 64 keep one program per block."""
    assert [ra.head_chunk(d, "gfx1100") for d in (16, 64, 128)] == [16, 64, 64]
    for target in ("sm90", "gfx942", "gfx90a"):
        assert [ra.head_chunk(d, target) for d in (16, 64, 128)] == [16, 64, 128]


def test_the_backward_runs_the_structure_that_fits_each_target():
    """Where the one-pass column kernel spilled (docs/kernels.md): two passes for mix on AMD and for
    windowed mix at D = 128 on NVIDIA, no atomics on RDNA3; sm90's common case (no window, or D = 64)
    keeps the one atomic pass."""
    assert ra.atomic_backward("sm90") and ra.atomic_backward("gfx942") and not ra.atomic_backward("gfx1100")
    assert not any(ra.recip_pass("sm90", d, band) for d, band in ((64, False), (64, True), (128, False)))
    assert ra.recip_pass("sm90", 128, True) and ra.recip_pass("sm80", 128, True)
    assert all(ra.recip_pass(t, d, band) for t in ("gfx942", "gfx1100") for d in (64, 128) for band in (False, True))


def test_mi300x_is_tuned_apart_from_rdna3():
    """gfx942 (CDNA3, wave64) got the W7900's (gfx1100) one-stage 16-32 column tiles; it runs two
    stages with its own compile knobs."""
    assert ra.autotune_space("gfx942", 128) != ra.autotune_space("gfx1100", 128)
    assert max(m * n for m, n, *_ in ra.autotune_space("gfx942", 128)[0]) == 128 * 64
    assert {c[3] for space in ra.autotune_space("gfx942", 128) for c in space} == {2}
    assert ra.cdna_knobs("gfx942") == {"waves_per_eu": 2, "matrix_instr_nonkdim": 16} and ra.cdna_knobs("sm90") == {}
    assert ra.cdna_knobs("gfx942", 1)["waves_per_eu"] == 1  # the column kernel needs more than 256 VGPRs


def test_hopper_lists_hold_128_row_tiles_with_4_to_8_warps_and_3_to_4_stages():
    """wgmma takes 64 rows per warpgroup of 4 warps: the sm90 forward list reaches 128-row tiles
    with deeper pipelines (kernels/compile_check.py reports wgmma and no spills for them)."""
    for block_d in (64, 128):
        fwd = ra.autotune_space("sm90", block_d)[0]
        assert any(m == 128 and w == 8 and st >= 3 for m, n, w, st in fwd)
        assert all(w in (4, 8) and 3 <= st <= 4 for m, n, w, st in fwd)


def test_autotuning_keys_on_the_power_of_two_bucket_of_T():
    """generate() grows T by one per token and evaluation batches vary it: lengths in one bucket
    share one tuning; and the backward writes fresh buffers, so no trial clones dQ or dK."""
    metas = [ra._meta(torch.empty(1, 2, T, 64), T, False) for T in (513, 700, 1024, 1025)]
    for tuned in (ra._fwd_tuned, ra._bwd_col_tuned, ra._bwd_row_tuned):
        assert "T" not in tuned.keys and "T_BUCKET" in tuned.keys
        key = lambda meta: [meta.get(name, False) for name in tuned.keys]
        assert key(metas[0]) == key(metas[1]) == key(metas[2]) != key(metas[3])
        assert tuned.restore_value == []


ROW_OFFSET_PAST_INT32 = """
import torch
import kernels.ra_attention as ra  # a fresh process with TRITON_INTERPRET=1: the interpreted kernels
assert ra.INTERPRET
tl = ra.tl

@ra.triton.jit
def copy_tile(X, Out, in_off, start, stride_t, T, D, BLOCK: tl.constexpr):
    x = ra._load_tile(X, in_off, start, stride_t, T, D, 0, BLOCK, BLOCK, tl.float32, False)  # masked
    rows = tl.arange(0, BLOCK)
    tl.store(Out + rows[:, None] * BLOCK + rows[None, :], x)

x = torch.arange(16 * 4096, dtype=torch.float32).view(16, 4096)
out = torch.empty(16, 16)
start, stride_t = 2**20, 4096  # start * stride_t = 2**32; the negative head offset brings it back into x
copy_tile[(1,)](x, out, -start * stride_t, start, stride_t, start + 16, 16, BLOCK=16)
assert torch.equal(out, x[:, :16])
"""


def test_row_offsets_past_int32_address_the_right_rows():
    """T x stride may pass 2**31 (long contexts): a tile's row offset is 64-bit. In int32 it would
    wrap to another address (a crash or wrong rows), so the check runs in its own process."""
    env = dict(os.environ, TRITON_INTERPRET="1", PYTHONPATH=os.pathsep.join([os.path.dirname(os.path.dirname(_PATH)),
                                                                                  os.path.dirname(__file__)]))
    done = subprocess.run([sys.executable, "-c", ROW_OFFSET_PAST_INT32], env=env, capture_output=True, text=True,
                          timeout=300)
    assert done.returncode == 0, done.stderr[-2000:]


def test_float32_means_float32_unless_tf32_is_allowed(monkeypatch):
    q = torch.empty(1, 1, 8, 16)
    for allowed, precision in ((False, "ieee"), (True, "ieee" if torch.version.hip else "tf32")):
        monkeypatch.setattr(torch.backends.cuda.matmul, "allow_tf32", allowed)
        assert ra._meta(q, 8, False)["PRECISION"] == precision
        assert ra._meta(q.half(), 8, False)["PRECISION"] == "ieee"  # 16-bit inputs multiply exactly anyway


def test_every_kernel_list_starts_with_a_conservative_config():
    """The first configuration of each list is the one compiled spill-free in test_compile_check,
    and the smallest: it fits where larger tiles do not."""
    for target, block_d, mix in itertools.product(("gfx1100", "gfx942", "sm80", "sm90"), (64, 128), (False, True)):
        for space in ra.autotune_space(target, block_d, mix):
            m, n, warps, stages = space[0]
            assert all(m * n <= cm * cn for cm, cn, *_ in space), space


@pytest.mark.parametrize("target", ["sm90", "sm80", "gfx1100", "gfx942"])
def test_the_autotuner_times_only_the_configurations_listed_for_the_gpu_head_size_and_mode(target, monkeypatch):
    """What spills somewhere (sm90's 64-row backward tiles at D = 128, sm80's 64 x 64 tiles, mix's
    wider column tiles on gfx1100 at 64) is never timed there."""
    monkeypatch.setattr(ra, "gpu_target", lambda device: target)
    monkeypatch.setattr(torch.cuda, "current_device", lambda: 0)
    for tuned, index in ((ra._fwd_tuned, 0), (ra._bwd_col_tuned, 1), (ra._bwd_row_tuned, 2)):
        for block_d, mix in itertools.product((16, 64, 128), (False, True)):
            kept = tuned.early_config_prune(tuned.configs, {}, BLOCK_D=block_d, MIX=mix)
            listed = ra.autotune_space(target, block_d, mix)[index]
            assert [ra._quad(c) for c in kept] == listed, (index, block_d, mix)
        for config in tuned.early_config_prune(tuned.configs, {}, BLOCK_D=64, MIX=True):
            assert ra._knobs(config) == ra.cdna_knobs(target, index)  # MI300X's waves_per_eu, matrix_instr_nonkdim
    assert ra.autotune_space("sm90", 128)[0] != ra.autotune_space("sm90", 64)[0]
    assert ra.autotune_space("sm90", 64, mix=True)[1] != ra.autotune_space("sm90", 64)[1]  # three accumulators
    for block_d, mix in ((64, True), (128, False)):  # 128 key rows: half the atomic adds of 64-key blocks
        assert any(n == 128 for m, n, *_ in ra.autotune_space("sm90", block_d, mix)[1])


@pytest.mark.parametrize("mode,window", [("standard", 0), ("swap", 4), ("mix", 0), ("gate", 3)])
def test_kernel_is_causal(mode, window):
    q, k, v, extra = _inputs((1, 2, 37, 16), torch.float32, mode, per_head=True)
    out = ra.reciprocal_attention(q, k, v, mode, window=window, **extra)
    t0 = 21  # perturb every position from t0 on: rows before t0 must not move at all
    q2, k2, v2 = (t.clone() for t in (q, k, v))
    for t in (q2, k2, v2):
        t[:, :, t0:] += 10 * torch.randn_like(t[:, :, t0:])
    out2 = ra.reciprocal_attention(q2, k2, v2, mode, window=window, **extra)
    assert torch.equal(out[:, :, :t0], out2[:, :, :t0])
    assert not torch.allclose(out[:, :, t0:], out2[:, :, t0:])


@pytest.mark.parametrize("mode,window", [("standard", 0), ("swap", 2), ("mix", 2), ("gate", 0)])
def test_kernel_gradcheck_float64(mode, window):
    """Full gradcheck inside one block (T = 3) of one head, fast-mode gradcheck across two blocks
    (T = 20) and, for per-head alpha / gate_logit, two heads (each full gradcheck input costs two
    interpreted forward passes, and a second head doubles both the inputs and the programs)."""
    for H, T, D, fast in ((1, 3, 2, False), (2 if mode in ("mix", "gate") else 1, 20, 4, True)):
        q, k, v, extra = _inputs((1, H, T, D), torch.float64, mode, per_head=True)
        params = [t.double().requires_grad_() for t in extra.values()]
        names = list(extra)
        leaves = [t.requires_grad_() for t in (q, k, v)]

        def f(q, k, v, *params):
            return ra.reciprocal_attention(q, k, v, mode, window=window, **dict(zip(names, params)))

        # atol: the kernel folds scale * log2(e) into a float32 scalar (a ~1e-8 relative error)
        assert torch.autograd.gradcheck(f, leaves + params, atol=1e-5, rtol=1e-4, fast_mode=fast)


def test_strided_views_and_scalar_parameters():
    """The model passes (B, T, H, D).transpose(1, 2) views; alpha may be a plain float or a view."""
    x = torch.randn(2, 19, 3, 16)
    q, k, v = (x + i for i in range(3))  # three distinct (B, T, H, D) tensors
    q, k, v = (t.transpose(1, 2) for t in (q, k, v))
    assert not q.is_contiguous()
    out = ra.reciprocal_attention(q, k, v, "mix", alpha=0.5, window=4)
    ref = reference(q, k, v, "mix", alpha=0.5, window=4)
    torch.testing.assert_close(out, ref, atol=2e-5, rtol=1e-4)
    # ra_model's parameter shapes: alpha viewed as (1, H, 1, 1), a gate logit of shape (1,)
    alpha = torch.tensor([0.2, -0.4, 0.7], requires_grad=True)
    logit = torch.tensor([0.3], requires_grad=True)
    for mode, extra, param in (("mix", {"alpha": alpha.view(1, -1, 1, 1)}, alpha),
                               ("gate", {"gate_logit": logit}, logit)):
        grads = [torch.autograd.grad(fn(q, k, v, mode, **extra).sum(), param)[0]
                 for fn in (ra.reciprocal_attention, reference)]
        assert grads[0].shape == param.shape
        torch.testing.assert_close(grads[0], grads[1], atol=1e-4, rtol=1e-4)


# The reference itself, without the interpreter: the identities of docs/experiments.md ("Reciprocal attention").

def test_reference_identities():
    torch.manual_seed(0)
    q, k, v = (torch.randn(2, 3, 11, 8, dtype=torch.float64) for _ in range(3))
    sdpa = F.scaled_dot_product_attention
    ref = reference
    torch.testing.assert_close(ref(q, k, v, "standard"), sdpa(q, k, v, is_causal=True))
    torch.testing.assert_close(ref(q, k, v, "swap"), sdpa(k, q, v, is_causal=True))
    # S + a S^T under the causal mask is one attention with doubled head size: [q, a k] . [k, q]
    a = 0.5
    doubled = sdpa(torch.cat([q, a * k], -1), torch.cat([k, q], -1), v, is_causal=True, scale=1 / math.sqrt(8))
    torch.testing.assert_close(ref(q, k, v, "mix", alpha=a), doubled)
    gate = ref(q, k, v, "gate", gate_logit=torch.tensor(0.0))
    torch.testing.assert_close(gate, 0.5 * (ref(q, k, v, "standard") + ref(q, k, v, "swap")))
    # a window as wide as the sequence is no window; window 1 leaves swap with the diagonal only
    torch.testing.assert_close(ref(q, k, v, "mix", alpha=a, window=11), ref(q, k, v, "mix", alpha=a))
    torch.testing.assert_close(ref(q, k, v, "swap", window=1), v)


def test_one_function_decides_where_the_kernels_run(monkeypatch):
    """why_not_fused answers for the model, and the kernel refuses what it cannot run."""
    q, k, v = (torch.randn(1, 2, 5, 8) for _ in range(3))
    assert ra.why_not_fused(q, k, v) is None
    assert "one head size" in ra.why_not_fused(q, k, torch.randn(1, 2, 5, 4))
    assert "up to 128" in ra.why_not_fused(*(torch.randn(1, 1, 2, 160) for _ in range(3)))
    monkeypatch.setattr(ra, "INTERPRET", False)
    assert "TRITON_INTERPRET" in ra.why_not_fused(q, k, v)
    with pytest.raises(RuntimeError, match="TRITON_INTERPRET is not 1; ra_model's reciprocal_sdpa"):
        ra.reciprocal_attention(q, k, v, "swap")


def test_bad_arguments_are_named():
    q = torch.randn(1, 1, 4, 8)
    with pytest.raises(ValueError, match="mode="):
        ra.reciprocal_attention(q, q, q, "transpose")
    with pytest.raises(ValueError, match="alpha"):
        ra.reciprocal_attention(q, q, q, "mix")
    with pytest.raises(ValueError, match="gate_logit"):
        ra.reciprocal_attention(q, q, q, "gate")
    with pytest.raises(ValueError, match="one value per head"):
        ra.reciprocal_attention(q, q, q, "mix", alpha=torch.ones(3))
    with pytest.raises(ValueError, match="window"):
        ra.reciprocal_attention(q, q, q, "swap", window=-1)


@pytest.mark.parametrize("pattern,mode,mla", [("late", "mix", {}), ("learned", "gate", {}), ("all", "swap", {}),
                                              ("all", "mix", dict(mla=True, mla_latent_dim=8,
                                                                  mla_per_head_q_latent=False))])
def test_model_trains_with_the_fused_kernel_like_the_pytorch_path(pattern, mode, mla, monkeypatch):
    """attn_impl='triton' (the kernel, interpreted) and attn_impl='sdpa' give the same losses over
    a few SGD steps of a tiny RA model from the same initial weights (SGD's update is linear in the
    gradient; Adam's ~lr * sign(g) would turn the kernel's rounding on near-zero entries into jumps).
    RA+MLA runs the kernel when its heads do not score in the latent (q, k, v of one head size)."""
    import ra_model

    monkeypatch.setattr(ra_model, "fused_kernels", lambda: ra)
    losses = {}
    for impl in ("sdpa", "triton"):
        torch.manual_seed(0)
        cfg = ra_model.RAConfig(n_layer=2, n_head=2, n_embd=32, block_size=20, vocab_size=64, ra_pattern=pattern,
                                ra_mode=mode, ra_alpha_learn="layer" if mode == "mix" else "none", attn_impl=impl,
                                **mla)
        model = ra_model.RAGPT(cfg)
        opt = torch.optim.SGD(model.parameters(), lr=0.3, momentum=0.9)
        # one sequence: a second would only add programs at another batch offset (test_kernel_matches_reference's)
        data = torch.randint(0, 64, (1, 21), generator=torch.Generator().manual_seed(1))
        losses[impl] = []
        for step in range(3):
            with warnings.catch_warnings():  # a fallback to the PyTorch path would warn
                warnings.filterwarnings("error", message=".*running the PyTorch SDPA path")
                _, loss = model(data[:, :-1], data[:, 1:])
            losses[impl].append(loss.item())
            if step < 2:  # the last loss is compared, not trained on
                loss.backward()
                opt.step()
                opt.zero_grad()
    assert losses["triton"] == pytest.approx(losses["sdpa"], rel=1e-4, abs=1e-5)
    assert losses["sdpa"][-1] < losses["sdpa"][0]


def test_triton_falls_back_to_sdpa_without_a_gpu_or_interpreter(monkeypatch):
    import ra_model

    monkeypatch.setattr(ra_model.fused_kernels(), "triton_available", lambda x: False)
    monkeypatch.setattr(ra_model, "_warned", set())
    torch.manual_seed(0)
    model = ra_model.RAGPT(ra_model.RAConfig(n_layer=1, n_head=2, n_embd=16, block_size=8, vocab_size=32,
                                             ra_pattern="all", attn_impl="triton"))
    idx = torch.randint(0, 32, (1, 8))
    with pytest.warns(UserWarning, match="running the PyTorch SDPA path"):
        logits, _ = model(idx)
    model.config.attn_impl = "sdpa"
    for block in model.transformer.h:
        block.attn.attn_impl = "sdpa"
    assert torch.equal(logits, model(idx)[0])


@pytest.mark.parametrize("window", [0, 4])
def test_mix_through_sdpa_without_padding_the_values_equals_the_padded_path(window, monkeypatch):
    """reciprocal_sdpa's mix scores with doubled q and k; where a fused backend takes a value head
    size unlike theirs, v keeps its own (d columns of P @ V, not 2d). CPU's flash kernel does not
    (probed), so the padded path runs; CPU's math kernel takes it, which checks the unpadded call."""
    import ra_model

    monkeypatch.setattr(ra_model, "_unequal_value_size", {})
    monkeypatch.setattr(ra_model, "_warned", set())
    q, k, v = (torch.randn(2, 3, 11, 8, dtype=torch.float64, requires_grad=True) for _ in range(3))
    alpha = torch.tensor([0.5, -0.3, 0.8], dtype=torch.float64, requires_grad=True).view(1, -1, 1, 1)
    results = {}
    for unpadded in (False, True):
        if unpadded:
            monkeypatch.setitem(ra_model._unequal_value_size, (str(q.device), q.dtype), True)
        out = ra_model.reciprocal_sdpa(q, k, v, "mix", alpha, None, window, 0.0)
        results[unpadded] = (out, *torch.autograd.grad(out.sum(), (q, k, v, alpha)))
    for padded, unpadded in zip(results[False], results[True]):
        torch.testing.assert_close(unpadded, padded, atol=1e-12, rtol=1e-10)
    ref = reciprocal_manual(q, k, v, "mix", alpha, None, window, 0.0)
    torch.testing.assert_close(results[True][0], ref, atol=1e-12, rtol=1e-10)


def test_the_value_size_probe_runs_once_and_says_so_in_one_line(monkeypatch):
    import ra_model

    monkeypatch.setattr(ra_model, "_unequal_value_size", {})
    monkeypatch.setattr(ra_model, "_warned", set())
    with pytest.warns(UserWarning, match="mix pads v") as caught:
        assert not ra_model.sdpa_takes_unequal_value_size(torch.device("cpu"), torch.float32)  # CPU flash: no
    assert len(caught) == 1 and "\n" not in str(caught[0].message)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        assert not ra_model.sdpa_takes_unequal_value_size(torch.device("cpu"), torch.float32)  # cached, silent


def test_a_float_alpha_is_filled_on_the_device_without_a_host_copy():
    """torch.as_tensor(float, device=cuda) copies from host memory and waits for the queued work: a
    host sync per layer, forward and recompute. A float alpha is filled on the device instead."""
    from torch.overrides import TorchFunctionMode

    class HostData(TorchFunctionMode):  # tensors made on a device from Python numbers
        def __init__(self):
            super().__init__()
            self.calls = []

        def __torch_function__(self, func, types, args=(), kwargs=None):
            kwargs = kwargs or {}
            if func in (torch.as_tensor, torch.tensor) and str(kwargs.get("device", "cpu")) != "cpu":
                self.calls.append(func.__name__)
            return func(*args, **kwargs)

    with HostData() as seen:
        alpha = ra.alpha_per_head(0.5, 4, torch.device("meta"), torch.float32)
        learned = ra.alpha_per_head(torch.full((1,), 0.25, device="meta"), 4, torch.device("meta"), torch.float32)
    assert seen.calls == [] and alpha.shape == learned.shape == (4,) and alpha.device.type == "meta"
    assert torch.equal(ra.alpha_per_head(0.5, 3, "cpu", torch.float64), torch.full((3,), 0.5, dtype=torch.float64))
