"""The full head's memory, measured (issue 59): bytes per logit at its forward and backward peaks, from
a real run of model.GPT.head on CPU, fitted over a few (tokens, vocab) shapes; the memory estimate
(sharding.FULL_HEAD_BYTES_PER_LOGIT, what head_loss='auto' compares) may not count fewer.

The CPU allocator keeps no books, so LiveBytes counts them: every tensor an ATen op returns is added
by its storage's size when it first appears and subtracted when that storage is freed (a weakref on
the storage), which is what a caching allocator's "allocated" counter does, less its rounding. The head
runs as train.train_step calls the model: the logits are not kept once the loss is returned. The table
of docs/speed-and-memory.md comes from

    python -m pytest -q -s tests/test_head_memory.py
"""
import weakref

import numpy as np
import pytest
import torch
from torch.utils._python_dispatch import TorchDispatchMode
from torch.utils._pytree import tree_leaves

import runtime
import sharding
from model import GPT, GPTConfig

SHAPES = [(tokens, vocab) for tokens in (256, 512, 1024) for vocab in (1024, 2048, 4096)]
WIDTH = 16  # n_embd: small beside the vocabulary, so the logits dominate (the fit separates the rest)


class LiveBytes(TorchDispatchMode):
    """The bytes of the CPU tensors alive now (`live`) and at most since reset_peak (`peak`)."""

    def __init__(self):
        super().__init__()
        self.live = self.peak = 0
        self.storages = {}  # data pointer -> weakref of the storage

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        out = func(*args, **(kwargs or {}))
        for t in tree_leaves(out):
            if isinstance(t, torch.Tensor) and t.device.type == "cpu":
                storage = t.untyped_storage()
                key, size = storage.data_ptr(), storage.nbytes()
                if size and key not in self.storages:
                    self.live += size
                    self.storages[key] = weakref.ref(storage, lambda _, key=key, size=size: self.free(key, size))
        self.peak = max(self.peak, self.live)
        return out

    def free(self, key, size):
        self.storages.pop(key, None)
        self.live -= size

    def reset_peak(self):
        self.peak = self.live


def head_peaks(tokens, vocab, dtype):
    """(forward, backward) peak bytes above what existed before, of the full head on `tokens` tokens."""
    torch.manual_seed(0)
    model = GPT(GPTConfig(vocab_size=vocab, n_embd=WIDTH, n_layer=1, n_head=1, block_size=tokens, head_loss="full",
                          tie_weights=False))
    x = torch.randn(1, tokens, WIDTH, requires_grad=True)
    y = torch.randint(vocab, (1, tokens))
    autocast = torch.autocast("cpu", torch.bfloat16, enabled=dtype == "bfloat16")
    with LiveBytes() as mem:
        with autocast:
            loss = model.head(x, y)[1]  # as train_step: the logits are dropped with the tuple
        forward = mem.peak
        mem.reset_peak()
        loss.backward()
        backward = mem.peak
    return forward, backward


def fit_bytes_per_logit(dtype):
    """{'forward': bytes per logit, 'backward': ...}: the tokens x vocab coefficient of a least-squares fit
    of each peak to tokens x vocab, tokens, vocab and a constant (the tokens' and the weight's own tensors)."""
    peaks = np.array([head_peaks(tokens, vocab, dtype) for tokens, vocab in SHAPES], dtype=float)
    terms = np.array([[tokens * vocab, tokens, vocab, 1] for tokens, vocab in SHAPES], dtype=float)
    fit = {}
    for column, name in enumerate(("forward", "backward")):
        coefficients, *_ = np.linalg.lstsq(terms, peaks[:, column], rcond=None)
        fit[name] = round(float(coefficients[0]), 6)  # least squares' rounding off whole bytes
    return fit


@pytest.fixture(scope="module")
def measured():
    found = {dtype: fit_bytes_per_logit(dtype) for dtype in ("float32", "bfloat16")}
    print("\n| logits | forward peak | backward peak |  (bytes per logit, fitted over", SHAPES, ")")
    for dtype, fit in found.items():
        print(f"| {dtype} | {fit['forward']:.2f} | {fit['backward']:.2f} |")
    return found


def test_the_measured_peaks_are_the_ones_the_estimate_states(measured):
    """float32: 8 forward, 12 backward; bfloat16 autocast: 10 forward, 12 backward (whole bytes: each a
    tensor of vocab_size values per token)."""
    assert measured == {"float32": dict(forward=8, backward=12), "bfloat16": dict(forward=10, backward=12)}
    assert sharding.FULL_HEAD_BYTES_PER_LOGIT == {k: max(fit[k] for fit in measured.values())
                                                  for k in ("forward", "backward")}


@pytest.mark.parametrize("dtype", ["float32", "bfloat16"])
def test_the_estimate_never_counts_fewer_bytes_per_logit_than_measured(measured, dtype):
    cfg = dict(runtime.DEFAULTS, n_layer=2, n_head=2, n_embd=64, block_size=256, batch_size=4, vocab_size=4096)
    logits = cfg["batch_size"] * cfg["block_size"] * cfg["vocab_size"]
    full = sharding.memory_estimate(dict(cfg, head_loss="full"), 10**6, 1, dtype)
    assert full["head"] / logits >= max(measured[dtype].values())
    # the step's peak holds the head on top of the activations, which it does not replace
    assert full["step"] - full["activations"] - full["params"] - full["grads"] - full["optimizer"] - full["overhead"] \
        >= max(measured[dtype].values()) * logits


def test_a_kept_logits_tensor_lives_through_backward():
    """Why train_step drops the logits: held (`_, loss = model(x, y)`), float32 logits add their 4 bytes
    to the backward peak."""
    torch.manual_seed(0)
    model = GPT(GPTConfig(vocab_size=2048, n_embd=WIDTH, n_layer=1, n_head=1, block_size=512, head_loss="full",
                          tie_weights=False))
    x, y = torch.randn(1, 512, WIDTH, requires_grad=True), torch.randint(2048, (1, 512))
    with LiveBytes() as mem:
        logits, loss = model.head(x, y)
        mem.reset_peak()
        loss.backward()
    _, dropped = head_peaks(512, 2048, "float32")
    assert mem.peak - dropped == pytest.approx(4 * 512 * 2048, rel=0.01)
    del logits


def test_every_rank_runs_rank_0s_head_choice(monkeypatch):
    """head_loss='auto' is decided on rank 0 and broadcast (issue 59): a rank other than 0 does not choose,
    and runs what the broadcast gives it, whatever its own free memory would have said."""
    import devices
    import train
    from parallel import ParallelLayout
    cfg = runtime.resolve(dict(runtime.DEFAULTS, out_dir="unused", n_layer=1, n_head=2, n_embd=16, block_size=8,
                               vocab_size=32, device="cpu", dtype="float32", compile=False), 1)
    layout = ParallelLayout.plan(cfg, 1).start("cpu")
    sent = []
    monkeypatch.setattr(layout, "broadcast_object", lambda obj: sent.append(obj) or sharding.HeadChoice("full", "fits", 1e9, 2e9, device="cuda:0"))
    monkeypatch.setattr(sharding, "choose_head_loss", lambda *a: pytest.fail("only rank 0 chooses"))
    layout.rank = 1
    _, autocast = devices.precision("float32", "cpu")
    run = train.build_for_training(cfg, layout, "float32", autocast, None, None)
    assert sent == [None] and run.raw_model.config.head_loss == "full" and run.report["head_loss"].startswith("full")
