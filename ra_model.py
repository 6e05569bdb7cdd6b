"""Reciprocal attention (RA), multi-head latent attention (MLA), gated attention and QK-norm, built from
model.py's pieces.

Standard causal attention lets token i weigh v_j (j <= i) by softmax_j(S_ij), S_ij = q_i.k_j.
Reciprocal attention uses the transposed scores S^T_ij = k_i.q_j over the same causal set j <= i,
so it is causal: every term comes from positions <= i. Per reciprocal layer (`ra_mode`):

    swap   softmax over S^T alone: sdpa(k, q, v). Alone this only relabels W_q and W_k (a control).
    mix    softmax over S + alpha*S^T. One SDPA call with doubled head dimension:
           [q_i, alpha*k_i] . [k_j, q_j] = q_i.k_j + alpha*k_i.q_j   (scale stays 1/sqrt(d)).
    gate   (1-p)*attn(S) + p*attn(S^T), p = sigmoid(learned per-layer logit): two SDPA calls.

`ra_window` = W > 0 keeps the reciprocal term only where 0 <= i-j < W. No SDPA path materializes
a T x T score matrix: every call can run on the fused (flash) kernel, values being zero-padded
where their head size differs from q's (see `sdpa`); the windowed variants pass a boolean band
mask (T x T, or T x 2T for mix: one byte per entry, shared by the batch and heads).
`attn_impl='manual'` is the readable reference that materializes the scores; 'triton' runs the
fused kernels of kernels/ra_attention.py; 'auto' measures both and keeps the faster (auto_impl).

MLA (`mla=True`, every layer): K and V come from one shared down-projection c = W_dkv x of size
`mla_latent_dim` (what an inference cache would hold). With `mla_per_head_q_latent` each head
projects its query into the latent and scores it against c directly (the key up-projection
absorbed into the query); otherwise a per-head key up-projection brings c back to head size.
`mla_per_head_v_up` gives each head its own value up-projection (else one shared by all heads).
RA+MLA: the pattern's layers add the reciprocal term to the MLA scores, K_i.Q_j with the same
per-head tensors (ra_alpha = 0.0 is pure MLA).

Gated attention (`attn_gate=True`, every layer, with any of the above; Qiu et al. 2025,
arXiv 2505.06708, their best variant): each head's output is multiplied elementwise by
sigmoid(W_g x + b_g) before the output projection, x being the attention's input (the block input
after ln_1), so a head can switch itself off per token (see GatedOutput). It adds n_embd^2 (+ n_embd)
parameters per layer; the other weights keep the baseline's initial values.

QK-norm (`qk_norm=True`, every layer): each head's q and k RMS-normalized before the scores (QKNorm),
the worked example of docs/new-idea.md.

Logit soft-capping (`attn_softcap=c > 0`, every layer; Gemma 2, arXiv 2408.00118): the scores s -> c*tanh(s/c)
before the softmax (SoftCap), through the scores step `score_mod`, which the manual path runs and no fused
path can: a layer whose ideas change the scores needs attn_impl='manual' (check_scores_step).
Value residual (`value_residual=True`; ResFormer, arXiv 2410.17897): layer 0 publishes its values, each later
layer n mixes v_n <- lam_n v_n + (1 - lam_n) v_1 with a learned lam_n (ValueResidual): a cross-layer idea,
reading the model's layer state (Layer).

Each idea is registered in IDEAS (its keys, its layers, its attention class, its parameters, what a
fork and the export must know); RAGPT builds every layer's attention from the ideas that layer runs.
An RA model with ra_pattern='none' is exactly model.GPT: same modules, same initial weights for
the same seed; RA-only parameters (alpha, gate logits) are filled deterministically, so they
draw nothing from the random stream that initializes the shared weights.
"""
import importlib
import math
import warnings
from dataclasses import dataclass, field, fields

import torch
import torch.nn as nn
from torch.nn import functional as F

from configurator import ConfigError
from devices import device_ms, fused_sdpa_takes_unequal_value_size
from model import (GPT, Block, CausalSelfAttention, GPTConfig, attention_core, attention_params,
                   causal_attention)

RA_PATTERNS = ("none", "early", "late", "all", "alternate", "learned", "layers")
RA_MODES = ("swap", "mix", "gate")
RA_ALPHA_LEARN = ("none", "layer", "head")


@dataclass
class RAConfig(GPTConfig):
    # which layers are reciprocal: 'none', 'early' (first half), 'late' (second half), 'all',
    # 'alternate' (layers 1, 3, 5, ...), 'learned' (every layer, gated: the RA study's RALEARN; ra_mode
    # is not used), or 'layers' (the indices in ra_layers)
    ra_pattern: str = "none"
    ra_layers: list = field(default_factory=list)
    ra_mode: str = "mix"  # 'swap', 'mix', 'gate' (see the module docstring)
    ra_alpha: float = 0.5  # mix: weight of S^T (the initial value when learned)
    ra_alpha_learn: str = "none"  # mix: 'none' (fixed), 'layer' or 'head' (one learned alpha each)
    ra_gate_init: float = 0.0  # gate: initial logit of p (0.0: p = 0.5)
    ra_window: int = 0  # >0: the reciprocal term only where 0 <= i - j < ra_window
    mla: bool = False  # multi-head latent attention in every layer
    mla_latent_dim: int = 128
    mla_per_head_q_latent: bool = True
    mla_per_head_v_up: bool = True
    attn_gate: bool = False  # a sigmoid gate on each head's output, from the block input (GatedOutput)
    qk_norm: bool = False  # each head's q and k RMS-normalized before the scores (QKNorm)
    attn_softcap: float = 0.0  # > 0: the scores s -> attn_softcap * tanh(s / attn_softcap) (SoftCap); 0: off
    value_residual: bool = False  # each layer after the first mixes its values with layer 0's (ValueResidual)

    # triton: the fused kernels of kernels/ra_attention.py; auto: the faster of them and sdpa, measured (auto_impl)
    attn_impls = ("sdpa", "manual", "triton", "auto")

    def __post_init__(self):
        super().__post_init__()
        check_ideas(type(self))
        check_ra_config(self)
        check_ideas_run(self)
        check_scores_step(self)

    def reciprocal_layers(self):
        n = self.n_layer
        return {
            "none": [], "early": list(range(n // 2)), "late": list(range(n // 2, n)),
            "all": list(range(n)), "alternate": list(range(1, n, 2)), "learned": list(range(n)),
            "layers": sorted(self.ra_layers),
        }[self.ra_pattern]

    def layer_mode(self, layer_idx):
        """The reciprocal mode of one layer, None for standard attention."""
        if layer_idx not in self.reciprocal_layers():
            return None
        return self.reciprocal_mode()

    def reciprocal_mode(self):
        """The mode every reciprocal layer runs."""
        return "gate" if self.ra_pattern == "learned" else self.ra_mode


def check_ra_config(cfg):
    if cfg.ra_pattern not in RA_PATTERNS:
        raise ConfigError(f"ra_pattern={cfg.ra_pattern!r}: use one of {RA_PATTERNS}")
    if cfg.ra_mode not in RA_MODES:
        raise ConfigError(f"ra_mode={cfg.ra_mode!r}: use one of {RA_MODES}")
    if cfg.ra_alpha_learn not in RA_ALPHA_LEARN:
        raise ConfigError(f"ra_alpha_learn={cfg.ra_alpha_learn!r}: use one of {RA_ALPHA_LEARN}")
    if cfg.ra_alpha_learn != "none" and (cfg.ra_mode != "mix" or cfg.ra_pattern == "learned"):
        raise ConfigError(f"ra_alpha_learn={cfg.ra_alpha_learn!r} applies to ra_mode='mix' only "
                         f"(ra_mode={cfg.ra_mode!r}, ra_pattern={cfg.ra_pattern!r}): set ra_alpha_learn='none'")
    if cfg.ra_pattern == "layers" and not cfg.ra_layers:
        raise ConfigError("ra_pattern='layers' needs the layer indices in ra_layers, e.g. ra_layers=[6, 7]")
    if cfg.ra_layers and cfg.ra_pattern != "layers":
        raise ConfigError(f"ra_layers={cfg.ra_layers} is only used with ra_pattern='layers' "
                         f"(ra_pattern={cfg.ra_pattern!r}): set one or clear the other")
    for i in cfg.ra_layers:
        if type(i) is not int or not 0 <= i < cfg.n_layer:
            raise ConfigError(f"ra_layers contains {i!r}: use layer indices 0..{cfg.n_layer - 1}")
    if len(set(cfg.ra_layers)) != len(cfg.ra_layers):
        raise ConfigError(f"ra_layers={cfg.ra_layers} lists a layer twice")
    if cfg.ra_window < 0:
        raise ConfigError(f"ra_window must be >= 0 (0: no window), got {cfg.ra_window}")
    if cfg.mla_latent_dim < 1:
        raise ConfigError(f"mla_latent_dim must be a positive integer, got {cfg.mla_latent_dim}")
    if not cfg.attn_softcap >= 0:
        raise ConfigError(f"attn_softcap must be >= 0 (0: off; Gemma 2 caps attention logits at 50.0), "
                          f"got {cfg.attn_softcap}")


# ----------------------------------------------------------------------------- the mixing step

def band(T, window, device):
    """(T, T) bool, True where 0 <= i - j < window: the causal band of the reciprocal term."""
    i = torch.arange(T, device=device)
    dist = i[:, None] - i[None, :]
    return (dist >= 0) & (dist < window)


def sdpa(q, k, v, **kwargs):
    """F.scaled_dot_product_attention, with zero padding when the value head size differs from the
    query/key head size (mix doubles q and k; MLA scores in the latent): the fused kernels (flash,
    on CPU and CUDA) need one head size and PyTorch would otherwise fall back to the math kernel,
    which materializes the T x T scores. Zero columns change neither q.k nor the weighted values."""
    dqk, dv = q.size(-1), v.size(-1)
    if dqk == dv:
        return F.scaled_dot_product_attention(q, k, v, **kwargs)
    if dv < dqk:
        return F.scaled_dot_product_attention(q, k, F.pad(v, (0, dqk - dv)), **kwargs)[..., :dv]
    kwargs.setdefault("scale", 1.0 / math.sqrt(dqk))  # the scale of the unpadded q.k
    return F.scaled_dot_product_attention(F.pad(q, (0, dv - dqk)), F.pad(k, (0, dv - dqk)), v, **kwargs)


_unequal_value_size = {}  # (device, dtype) -> whether a fused SDPA backend takes Dv != Dqk there


def sdpa_takes_unequal_value_size(device, dtype):
    """Whether a fused SDPA backend (flash, memory-efficient, cuDNN; not the math kernel, which
    materializes the T x T scores) runs a value head size different from the query/key one on this
    device and dtype. Probed once with a tiny causal call; where none does, mix pads its values
    (`sdpa`) and a one-line warning says so. Inside torch.compile the tracer calls it as it is and
    keeps its answer as a constant (probe_as_constant, at model build): no graph break."""
    key = (str(device), dtype)
    if key not in _unequal_value_size:
        _unequal_value_size[key] = fused_sdpa_takes_unequal_value_size(device, dtype)
        if not _unequal_value_size[key]:
            warn_once(f"reciprocal_sdpa: no fused SDPA backend takes a value head size unlike q's on {device} "
                      f"({dtype}); mix pads v to the doubled head size")
    return _unequal_value_size[key]


def probe_as_constant():
    """Marks sdpa_takes_unequal_value_size for torch.compile as a function whose answer is a constant:
    Dynamo runs it while tracing (on the call's device and dtype, which the compiled graph is guarded on)
    and bakes in the answer, where a call it traced into, or one it may not trace, would break the
    graph. Done when a layer that mixes through SDPA is built, not at import: importing Dynamo imports
    Triton, whose interpreter mode (TRITON_INTERPRET) a test chooses after importing this module."""
    torch.compiler.assume_constant_result(sdpa_takes_unequal_value_size)


def reciprocal_sdpa(q, k, v, mode, alpha, p, window, dropout_p, kq=None):
    """The RA variants through F.scaled_dot_product_attention; no T x T scores in memory. kq: mix's doubled
    key [k | q] where the caller holds it as a view (RAAttention's per-head layout), else concatenated here."""
    if mode == "mix":
        # without the view: one buffer holding both doubled operands (a cat of [q, alpha k, k, q], or a
        # stack) gave the same bits as two cats and ran slower on a CPU
        return mix_sdpa(torch.cat([k, q], dim=-1) if kq is None else kq, v, alpha, window, dropout_p)
    T = q.size(-2)
    near = band(T, window, q.device) if 0 < window < T else None  # None: the whole causal set

    def recip(q, k, v):  # softmax_j(k_i . q_j): SDPA with the roles of query and key swapped
        if near is None:
            return sdpa(k, q, v, dropout_p=dropout_p, is_causal=True)
        return sdpa(k, q, v, attn_mask=near, dropout_p=dropout_p)

    if mode == "swap":
        return recip(q, k, v)
    y = sdpa(q, k, v, dropout_p=dropout_p, is_causal=True)  # gate
    return torch.lerp(y, recip(q, k, v), p.to(y.dtype))  # (1-p)*y + p*y_recip


def mix_sdpa(kq, v, alpha, window, dropout_p):
    """mix through one SDPA call with doubled head vectors, [q_i, alpha k_i] . [k_j, q_j] = q_i.k_j + alpha k_i.q_j.
    kq = [k | q] (B, H, T, 2d) is the doubled key as it is: a view of c_attn's output where RAAttention lays it
    out per head, so the doubled query is the one copy. That way round rather than [q | k] . [k | alpha q]:
    alpha k_i . q_j and k_i . alpha q_j round differently (unless alpha is a power of 2), and this way the
    operands are bit for bit those of reciprocal_sdpa's concatenated [k | q]."""
    T, d = kq.size(-2), kq.size(-1) // 2
    k, q = kq.split(d, dim=-1)
    # SDPA would scale by 1/sqrt(2d), the head size of the doubled vectors: pass 1/sqrt(d).
    # alpha may be a learned fp32 parameter: cast back so autocast's bf16 operands stay one dtype.
    # v keeps its head size d where a fused backend takes d != 2d (else sdpa pads it: 2d columns
    # of P @ V where d would do).
    attend = F.scaled_dot_product_attention if sdpa_takes_unequal_value_size(q.device, q.dtype) else sdpa
    q2 = torch.cat([q, (alpha * k).to(q.dtype)], dim=-1)
    if not 0 < window < T:
        return attend(q2, kq, v, dropout_p=dropout_p, is_causal=True, scale=1.0 / math.sqrt(d))
    # Windowed mix: each key appears twice, once as [k_j, q_j] (allowed inside the band, so its
    # logit gets alpha*k_i.q_j) and once as [k_j, 0] (allowed outside it: S_ij alone). Every causal
    # pair is allowed exactly once, so one softmax over the 2T keys is exact.
    k2 = torch.cat([kq, F.pad(k, (0, d))], dim=-2)
    v2 = torch.cat([v, v], dim=-2)
    near = band(T, window, q.device)
    causal = torch.ones(T, T, dtype=torch.bool, device=q.device).tril()
    mask = torch.cat([near, causal & ~near], dim=-1)  # (T, 2T) bool
    return attend(q2, k2, v2, attn_mask=mask, dropout_p=dropout_p, scale=1.0 / math.sqrt(d))


def reciprocal_manual(q, k, v, mode, alpha, p, window, dropout_p, score_mod=None):
    """The readable reference: materializes S and S^T (B, H, T, T). alpha and p are floats or
    tensors that broadcast over (B, H, T, T), e.g. one value per head as (1, H, 1, 1). The fused
    kernels (kernels/ra_attention.py) are tested against it. score_mod: the scores step, applied to every
    softmax's scaled logits before the mask (ReciprocalMixing.score_mod); mode None: standard attention."""
    T, d = q.size(-2), q.size(-1)
    scores = (q @ k.transpose(-2, -1)) / math.sqrt(d)  # S_ij = q_i.k_j, not yet masked
    # S^T from the UNMASKED scores, masked afterwards. The RA study's bug transposed an already masked
    # S: its -inf moved to the past and the scores S_ji of future tokens j > i into row i.
    recip = scores.transpose(-2, -1)  # k_i.q_j
    causal = torch.ones(T, T, dtype=torch.bool, device=q.device).tril()
    near = band(T, window, q.device) if window > 0 else causal

    def attend(logits, allowed):
        logits = logits if score_mod is None else score_mod(logits)
        weights = F.softmax(logits.masked_fill(~allowed, float("-inf")), dim=-1)
        return F.dropout(weights, p=dropout_p) @ v

    if mode is None:
        return attend(scores, causal)
    if mode == "swap":
        return attend(recip, near)
    if mode == "gate":
        return (1 - p) * attend(scores, causal) + p * attend(recip, near)
    return attend(scores + alpha * recip.masked_fill(~near, 0.0), causal)


_imported_kernels = []  # kernels/ra_attention.py once imported, which a compiled call reads without importing


def fused_kernels():
    """kernels/ra_attention.py, imported on first use: importing Triton takes seconds and binds its
    interpreter mode (TRITON_INTERPRET) for the life of the process. A layer that may run the kernels
    calls this when it is built (setup_reciprocal): an import inside a compiled block, which Dynamo
    cannot trace, broke its graph at every call; a list lookup it traces."""
    if not _imported_kernels:
        _imported_kernels.append(importlib.import_module("kernels.ra_attention"))
    return _imported_kernels[0]


def reciprocal_triton(q, k, v, mode, alpha, gate_logit, window, dropout_p, kq=None):
    """The fused Triton kernel (kernels/ra_attention.py) where it can run, else the SDPA path (kq: as there)."""
    ra_attention = fused_kernels()
    why = "the fused kernel has no attention dropout" if dropout_p > 0 else ra_attention.why_not_fused(q, k, v)
    if why is not None:
        if not torch.compiler.is_compiling():  # a warning is a graph break: a compiled call falls back quietly
            warn_once(f"attn_impl='triton': {why}; running the PyTorch SDPA path instead")
        p = torch.sigmoid(gate_logit) if gate_logit is not None else None
        return reciprocal_sdpa(q, k, v, mode, alpha, p, window, dropout_p, kq)
    return ra_attention.reciprocal_attention(q, k, v, mode, alpha=alpha if mode == "mix" else None,
                                             gate_logit=gate_logit.view(()) if mode == "gate" else None,
                                             window=window)


# ----------------------------------------------------------------------------- attn_impl='auto'

# Where the fused kernel can run, 'auto' times one forward + backward of each path on the call's own
# inputs (AUTO_WARMUP untimed, the median of AUTO_REPEATS timed, CUDA events) and keeps the faster;
# a tie keeps SDPA, the reference path.
AUTO_WARMUP, AUTO_REPEATS = 3, 10
AUTO_CHOICES = {}  # auto_key -> the record of its choice: the key's fields by name, then choose_faster's
AUTO_KEY_FIELDS = ("device", "dtype", "q_shape", "v_shape", "mode", "window", "dropout")
AUTO_TIMES_COMPILED = [False]  # set by measure_auto(compiled=True) while it measures: the blocks will run compiled


def auto_key(q, v, mode, window, dropout_p):
    """What a choice holds for (AUTO_KEY_FIELDS). The device type, not its index: data-parallel ranks
    adopt rank 0's choices (train.py). Plain values a compiled block can look up without a graph break."""
    return q.device.type, q.dtype, tuple(q.shape), tuple(v.shape), mode, window, dropout_p > 0


def auto_impl(q, k, v, mode, alpha, gate_logit, window, dropout_p):
    """'sdpa' or 'triton' for this call of attn_impl='auto': the recorded choice for its auto_key,
    measured on the first call that runs eagerly. Never measured while torch.compile traces (the
    timing would be traced, not run): an unmeasured call traced there takes SDPA, and train.py
    measures the training shapes before compiling (measure_auto), so the compiled blocks read those."""
    key = auto_key(q, v, mode, window, dropout_p)
    if torch.compiler.is_compiling():
        return AUTO_CHOICES[key]["impl"] if key in AUTO_CHOICES else "sdpa"
    if key not in AUTO_CHOICES:
        fields = dict(zip(AUTO_KEY_FIELDS, key), dtype=str(q.dtype).removeprefix("torch."))  # JSON for the log
        AUTO_CHOICES[key] = dict(fields, **measure_choice(q, k, v, mode, alpha, gate_logit, window, dropout_p))
    return AUTO_CHOICES[key]["impl"]


def why_not_auto_fused(q, k, v, dropout_p):
    """None where 'auto' times the fused kernel, else why it does not (SDPA runs, untimed)."""
    if dropout_p > 0:
        return "the fused kernel has no attention dropout"
    if not q.is_cuda:  # the Triton interpreter runs it on CPUs to prove it right, never faster
        return f"the fused kernel runs on GPUs only, not {q.device.type}"
    return fused_kernels().why_not_fused(q, k, v)


def measure_choice(q, k, v, mode, alpha, gate_logit, window, dropout_p):
    """choose_faster's record for one call, timing both paths on its own inputs (detached)."""
    why = why_not_auto_fused(q, k, v, dropout_p)
    if why is not None:
        return dict(impl="sdpa", sdpa_ms=None, fused_ms=None, reason=why)
    sdpa_path = lambda q, k, v, alpha, logit: reciprocal_sdpa(
        q, k, v, mode, alpha, None if logit is None else torch.sigmoid(logit), window, 0.0)
    fused_path = lambda q, k, v, alpha, logit: reciprocal_triton(q, k, v, mode, alpha, logit, window, 0.0)
    # detached views, not copies: the fused path's timing includes the copy it makes of strided inputs
    inputs = [t.detach().requires_grad_() if isinstance(t, torch.Tensor) else t for t in (q, k, v, alpha, gate_logit)]
    if AUTO_TIMES_COMPILED[0]:  # timed as the compiled blocks run them: Inductor changes the SDPA path's cost
        sdpa_path, fused_path = torch.compile(sdpa_path), torch.compile(fused_path)  # compiled in the warm-up
    return dict(choose_faster(lambda: time_forward_backward(sdpa_path, inputs),
                              lambda: time_forward_backward(fused_path, inputs)), compiled=AUTO_TIMES_COMPILED[0])


def time_forward_backward(attention, inputs):
    """Median device milliseconds of attention(*inputs) and the gradients of its inputs."""
    wrt = [t for t in inputs if isinstance(t, torch.Tensor)]

    def step():
        with torch.enable_grad():  # the first call may come from a no-grad forward (evaluation, measure_auto)
            y = attention(*inputs)
            torch.autograd.grad(y, wrt, torch.ones_like(y))

    return device_ms(step, repeats=AUTO_REPEATS, warmup=AUTO_WARMUP)


def choose_faster(time_sdpa, time_fused):
    """{impl, sdpa_ms, fused_ms, reason} from two timers that return milliseconds: the faster path,
    SDPA on a tie. A fused kernel that fails (a compile error, no resources on this GPU) leaves SDPA,
    with the failure as the reason; SDPA's own failure is the model's and is raised."""
    sdpa_ms = time_sdpa()
    try:
        fused_ms = time_fused()
    except Exception as e:  # whatever stops the fused kernel, SDPA still runs the call
        first_line = next(iter(str(e).splitlines()), "")  # a Triton compile error runs to pages
        return dict(impl="sdpa", sdpa_ms=sdpa_ms, fused_ms=None,
                    reason=f"the fused kernel failed ({type(e).__name__}: {first_line})")
    faster = "triton" if fused_ms < sdpa_ms else "sdpa"
    return dict(impl=faster, sdpa_ms=sdpa_ms, fused_ms=fused_ms,
                reason=f"measured: fused {fused_ms:.3f} ms, SDPA {sdpa_ms:.3f} ms (forward + backward)")


def use_auto_choices(choices):
    """Adopt choices measured elsewhere (another rank's measure_auto): the calls they cover take them."""
    AUTO_CHOICES.update(choices)


def measure_auto(model, batch_size, device, autocast, compiled=False):
    """attn_impl='auto' before training and before torch.compile: no-grad forwards of a batch of the
    training shape, in training mode and in evaluation mode (dropout on and off), in which every
    reciprocal layer's call is chosen (auto_impl), each path timed compiled when the model will be
    (`compiled`: the eager timing would pick for an eager run). The random state is left as it was.
    Returns the choices ({auto_key: record}) for data-parallel ranks to share and the checklist to report."""
    idx = torch.zeros(batch_size, model.config.block_size, dtype=torch.long, device=device)
    was_training = model.training
    AUTO_TIMES_COMPILED[0] = compiled
    try:
        cuda = [torch.device(device)] if device.startswith("cuda") else []
        with torch.no_grad(), torch.random.fork_rng(devices=cuda):
            for training in (True, False):
                model.train(training)
                with autocast:
                    model(idx, last_only=True)
    finally:
        AUTO_TIMES_COMPILED[0] = False  # a call measured later (an eager evaluation's new shape) runs eagerly
    model.train(was_training)
    return dict(AUTO_CHOICES)


_warned = set()


def warn_once(message):
    if message not in _warned:
        _warned.add(message)
        warnings.warn(message, stacklevel=3)


@dataclass
class Layer:
    """Where an attention sits: its layer index and the model's layer state, one dict shared by every layer
    of a model (RAGPT.layer_state), which a cross-layer idea writes in one layer and reads in later ones."""
    index: int = 0
    state: dict = field(default_factory=dict)


class ReciprocalMixing:
    """Mixin for an attention module: adds the RA parameters, the reciprocal `attend` and the scores step."""

    def setup_reciprocal(self, config, mode, layer=None):
        self.layer = Layer() if layer is None else layer
        self.ra_mode = mode  # None: standard attention
        self.ra_window = config.ra_window
        self.ra_alpha_value = config.ra_alpha
        self.attn_impl, self.dropout, self.recompute = config.attn_impl, config.dropout, config.attn_recompute
        # Filled deterministically (no random draws): the shared weights' init is untouched.
        if mode == "mix" and config.ra_alpha_learn != "none":
            n = config.n_head if config.ra_alpha_learn == "head" else 1
            self.ra_alpha = nn.Parameter(torch.full((n,), float(config.ra_alpha)))
        if mode == "gate":
            self.ra_gate_logit = nn.Parameter(torch.full((1,), float(config.ra_gate_init)))
        # What a compiled call must not do (an import, a probe) is done here: each would break its graph
        if mode is not None and self.attn_impl in ("triton", "auto"):
            fused_kernels()
            if self.attn_impl == "triton" and self.dropout > 0:  # said here too: a compiled call cannot say it
                warn_once(f"attn_impl='triton' with dropout={self.dropout}: the fused kernel has no attention "
                          f"dropout; training forwards run the PyTorch SDPA path instead")
        if mode == "mix" and self.attn_impl != "manual":
            probe_as_constant()

    def alpha(self):
        if hasattr(self, "ra_alpha"):
            return self.ra_alpha.view(1, -1, 1, 1)  # (1, 1 or H, 1, 1) broadcasts over heads
        return self.ra_alpha_value

    def is_standard(self):
        """Standard attention: no reciprocal mode, or mix with a fixed alpha of 0."""
        alpha = self.alpha()
        return self.ra_mode is None or (self.ra_mode == "mix" and isinstance(alpha, float) and alpha == 0.0)

    def score_mod(self, logits):
        """The scores step: the scaled logits (B, H, T, T) of each softmax, before the causal mask (applied after
        every idea: none can unmask a future token). An idea that changes the scores overrides it and calls
        super() first: mixins compose in IDEAS order, so the later idea's change applies first. Only the manual
        path runs it (check_scores_step refuses the fused paths for a layer whose ideas override it)."""
        return logits

    def attend(self, q, k, v, kq=None):
        """The mixing step. kq: mix's doubled key [k | q] where the caller holds it as a view (RAAttention's
        per-head layout), which mix through SDPA then reads instead of concatenating k and q."""
        dropout_p = self.dropout if self.training else 0.0
        alpha = self.alpha()
        if self.is_standard():
            if self.attn_impl != "manual":  # the baseline's call (sdpa pads MLA's values only)
                return sdpa(q, k, v, dropout_p=dropout_p, is_causal=True)
            return causal_attention(q, k, v, self.attn_impl, dropout_p, self.score_mod)
        gate_logit = self.ra_gate_logit if self.ra_mode == "gate" else None
        impl = self.attn_impl
        if impl == "auto":
            impl = auto_impl(q, k, v, self.ra_mode, alpha, gate_logit, self.ra_window, dropout_p)
        if impl == "triton":
            return reciprocal_triton(q, k, v, self.ra_mode, alpha, gate_logit, self.ra_window, dropout_p, kq)
        p = torch.sigmoid(gate_logit) if gate_logit is not None else None
        if impl == "sdpa":
            return reciprocal_sdpa(q, k, v, self.ra_mode, alpha, p, self.ra_window, dropout_p, kq)
        return reciprocal_manual(q, k, v, self.ra_mode, alpha, p, self.ra_window, dropout_p, self.score_mod)

    def ra_metrics(self, layer_idx):
        out = {}
        if hasattr(self, "ra_gate_logit"):
            out[f"ra_gate_layer{layer_idx}"] = torch.sigmoid(self.ra_gate_logit).item()
        if hasattr(self, "ra_alpha"):
            values = self.ra_alpha.detach().tolist()
            if len(values) == 1:
                out[f"ra_alpha_layer{layer_idx}"] = values[0]
            else:
                out.update({f"ra_alpha_layer{layer_idx}_head{h}": a for h, a in enumerate(values)})
        return out


class GatedOutput:
    """Attention mixin (the idea 'gated attention', attn_gate): y = heads_output(x) * sigmoid(c_gate(x)),
    elementwise and so per head and channel, then c_proj. The gate reads the same x as the queries;
    sigmoid keeps it in (0, 1), a sparse, input-dependent scaling that the paper credits for removing
    attention sinks and loss spikes."""

    def __init__(self, config, mode=None, layer=None):
        super().__init__(config, mode, layer)
        self.c_gate = nn.Linear(config.n_embd, config.n_embd, bias=config.bias)

    @torch.no_grad()
    def preserve_fork_start(self):
        """fork_start='preserve' (forking.preserve_start): gate weight (and bias) 0, so the gate is
        exactly 0.5 for every input, and the trunk's c_proj weight doubled: c_proj(y * 0.5) with 2W
        is the trunk's c_proj(y) bit for bit (scaling by powers of 2 is exact in floating point).
        The gate starts where sigmoid is steepest (it learns at full speed, not frozen near 1); what
        remains different: c_proj's weights are twice as large, so each Adam step (about lr in size)
        moves them half as much relative to their scale, and the carried moments match the new
        gradients up to Adam's eps (gradient and moments scale alike). RA's mixing needs no start:
        a fixed alpha is the variant itself, and a learned one is refused (its gate logit cannot
        reach p = 0 at a finite value)."""
        self.c_gate.weight.zero_()
        names = ["c_gate.weight"]
        if self.c_gate.bias is not None:
            self.c_gate.bias.zero_()
            names.append("c_gate.bias")
        self.c_proj.weight.mul_(2.0)
        return names, ("output gate: weight 0 (gate = 0.5 exactly), c_proj weight x2: the trunk's function exactly; "
                       "c_proj's relative step size halved")

    def forward(self, x):
        return self.resid_dropout(self.c_proj(self.heads_output(x) * torch.sigmoid(self.c_gate(x))))


class RAAttention(ReciprocalMixing, CausalSelfAttention):
    """model.CausalSelfAttention (same projections, same init) with the reciprocal mixing step
    (mode None: standard attention): the attention every RA-model layer with an idea builds on,
    unless an idea replaces the projections (MLA)."""

    def __init__(self, config, mode=None, layer=None):
        super().__init__(config)
        self.setup_reciprocal(config, mode, layer)

    def mixes_kq_view(self):
        """Whether this layer's mix may run through SDPA (every attn_impl but 'manual': 'auto' and 'triton' fall
        back to it, and their fused kernel reads the same q, k, v views) on q and k as c_attn makes them: then
        heads_output lays c_attn's output out per head. A mixin that changes q or k first (QK-norm overrides
        attend) keeps the baseline's split."""
        return (self.ra_mode == "mix" and self.attn_impl != "manual" and not self.is_standard()
                and type(self).attend is ReciprocalMixing.attend)

    def heads_output(self, x):
        if not self.mixes_kq_view():
            return super().heads_output(x)
        B, T, C = x.shape
        kqv = self.per_head_projection(x)
        k, q, v = kqv.split(C // self.n_head, dim=-1)
        kq = kqv[..., :2 * C // self.n_head]
        y = attention_core(self.attend, q, k, v, kq, recompute=self.recompute and self.training)
        return y.transpose(1, 2).contiguous().view(B, T, C)

    def per_head_projection(self, x):
        """c_attn(x) as (B, H, T, 3d), each head's [k | q | v] side by side: one matmul whose output holds mix's
        doubled key [k | q] as a view (mix_sdpa). c_attn's rows are reordered at each forward (a copy of the
        weight, small next to the activations at training batch sizes; its backward puts the gradient back), so the
        parameter keeps GPT-2's [Q | K | V] rows for checkpoints, forks and the export."""
        B, T, _ = x.shape
        bias = self.c_attn.bias
        out = F.linear(x, rows_per_head(self.c_attn.weight, self.n_head),
                       None if bias is None else rows_per_head(bias, self.n_head))
        return out.view(B, T, self.n_head, -1).transpose(1, 2)


def rows_per_head(t, n_head):
    """c_attn's weight or bias, rows [Q | K | V], reordered head by head as [K_h | Q_h | V_h]."""
    q, k, v = t.unflatten(0, (3, n_head, -1))  # each (H, d, ...)
    return torch.cat([k, q, v], dim=1).flatten(0, 1)


class MLAttention(ReciprocalMixing, nn.Module):
    """Multi-head latent attention: K and V from one shared latent c = c_kv(x)."""

    def __init__(self, config, mode=None, layer=None):
        super().__init__()
        C, H, L = config.n_embd, config.n_head, config.mla_latent_dim
        self.n_head, self.latent = H, L
        self.per_head_q_latent, self.per_head_v_up = config.mla_per_head_q_latent, config.mla_per_head_v_up
        self.c_kv = nn.Linear(C, L, bias=config.bias)
        if self.per_head_q_latent:
            self.c_q = nn.Linear(C, H * L, bias=config.bias)  # each head's query lives in the latent
        else:
            self.c_q = nn.Linear(C, C, bias=config.bias)
            self.k_up = nn.Linear(L, C, bias=config.bias)  # per-head keys from the latent
        self.v_up = nn.Linear(L, C if self.per_head_v_up else C // H, bias=config.bias)
        self.c_proj = nn.Linear(C, C, bias=config.bias)
        self.resid_dropout = nn.Dropout(config.dropout)
        self.setup_reciprocal(config, mode, layer)

    def forward(self, x):
        return self.resid_dropout(self.c_proj(self.heads_output(x)))

    def heads(self, x, size):
        B, T, _ = x.shape
        return x.view(B, T, -1, size).transpose(1, 2).expand(B, self.n_head, T, size)

    def heads_output(self, x):
        B, T, C = x.shape
        hd = C // self.n_head
        c = self.c_kv(x)  # (B, T, L)
        if self.per_head_q_latent:
            q, k = self.heads(self.c_q(x), self.latent), self.heads(c, self.latent)  # k: shared by heads
        else:
            q, k = self.heads(self.c_q(x), hd), self.heads(self.k_up(c), hd)
        v = self.heads(self.v_up(c), hd)  # one shared value head is broadcast when not per head
        # the reciprocal term, if any, is K_i.Q_j with these same tensors
        y = attention_core(self.attend, q, k, v, recompute=self.recompute and self.training)
        return y.transpose(1, 2).contiguous().view(B, T, C)


def mla_attention_params(config):
    """Parameters of one MLAttention, by formula (tests check the module against it)."""
    C, H, L, b = config.n_embd, config.n_head, config.mla_latent_dim, int(config.bias)
    n = C * L + b * L + C * C + b * C  # c_kv, c_proj
    n += C * H * L + b * H * L if config.mla_per_head_q_latent else (C * C + b * C) + (L * C + b * C)
    v_out = C if config.mla_per_head_v_up else C // H
    return n + L * v_out + b * v_out


class QKNorm:
    """Attention mixin (the idea 'QK-norm', qk_norm): each head's queries and keys RMS-normalized over
    the head dimension before the scores (and before any reciprocal term), so a score is sqrt(d) times
    a cosine: bounded whatever the projections' scale. No learned gain: it adds no parameter, and the
    weights start as the baseline's."""

    def attend(self, q, k, v):
        return super().attend(F.rms_norm(q, (q.size(-1),)), F.rms_norm(k, (k.size(-1),)), v)


class SoftCap:
    """Attention mixin (the idea 'logit soft-capping', attn_softcap = c > 0; Gemma 2, arXiv 2408.00118): every
    softmax's scaled logits s -> c * tanh(s / c), so no logit leaves (-c, c), through the scores step (with RA, the
    logits S + alpha S^T of mix, each of gate's two). No parameter; c -> infinity is the baseline."""

    def __init__(self, config, mode=None, layer=None):
        super().__init__(config, mode, layer)
        self.softcap = config.attn_softcap

    def score_mod(self, logits):
        return self.softcap * torch.tanh(super().score_mod(logits) / self.softcap)


class ValueResidual:
    """Attention mixin (the idea 'value residual', value_residual; ResFormer, Zhou et al. 2024, arXiv 2410.17897):
    layer 0 publishes its values v_1 in the model's layer state, and each later layer n attends to
    v_n <- lam_n v_n + (1 - lam_n) v_1, lam_n learned (0.5 at the start, the paper's fixed value; 1 is the
    baseline). In attend, which every path runs (standard, RA mix's per-head view, MLA), so v_1 is layer 0's
    values whatever layer 0 runs; the gradient reaches layer 0's projection through every later layer."""

    def __init__(self, config, mode=None, layer=None):
        super().__init__(config, mode, layer)
        if self.layer.index > 0:
            self.value_lambda = nn.Parameter(torch.full((1,), 0.5))  # filled: no random draw

    def attend(self, q, k, v):
        if self.layer.index == 0:
            self.layer.state["first_values"] = v
        else:  # lerp(v_1, v_n, lam) = v_1 + lam (v_n - v_1): v_n exactly at lam = 1
            v = torch.lerp(self.layer.state["first_values"], v, self.value_lambda.to(v.dtype))
        return super().attend(q, k, v)


# ----------------------------------------------------------------------------- the ideas

@dataclass(frozen=True)
class Idea:
    """Everything the workbench must know of one idea of model_type='ra' (see IDEAS). Every field but
    score_streams is required; each defaults to None only so that an entry leaving one out is named in
    one line by check_ideas when a run starts, not a TypeError traceback when any script imports this."""
    keys: tuple = None  # the RAConfig keys it owns (each also a key of runtime.DEFAULTS); the first switches it on
    layers: object = None  # layers(config): the indices of the layers that run it (none when it is off)
    attention: type = None  # composed into those layers' attention: a mixin that overrides forward, heads_output,
    # attend or score_mod and calls super(), or an nn.Module with its own projections (MLA) in place of RAAttention
    layer_params: object = None  # layer_params(config, layer_idx): parameters it adds to that layer (negative: removes)
    new_parameters: tuple = None  # names of its parameters a baseline trunk lacks: a fork keeps them at their init
    gpt2_function: bool = None  # whether a model running it still computes GPT-2's function (Hugging Face export)
    example: dict = None  # keys that switch it on in a tiny model: test_all_architectures smoke-checks it
    # extra_flops(config, layer_idx): training FLOPs per token of matmuls it adds to that layer beyond its
    # parameters' 6 per token and the baseline's attention (RAGPT.flops_per_token; tests/test_idea_costs.py)
    extra_flops: object = None
    # kept_scores(cfg): the T x T tensors per softmax its layers keep for backward whatever attn_impl says (a scores
    # step runs on the manual path only); 0: it materializes no scores. The memory estimate reads it
    # (sharding.attention_weights; manual attention alone keeps 1, the softmax weights)
    kept_scores: object = None
    score_streams: object = None  # score_streams(cfg): T x T softmax weights per layer where the scores are
    # materialized (sharding.memory_estimate); None: one, as the baseline


def all_layers_if(key):
    return lambda config: range(config.n_layer) if getattr(config, key) else range(0)


def no_flops(config, layer_idx):
    return 0


def reciprocal_params(config, layer_idx):
    """RA's learned alphas (mix) or gate logit (gate) in one reciprocal layer."""
    mode = config.reciprocal_mode()
    if mode == "mix" and config.ra_alpha_learn != "none":
        return config.n_head if config.ra_alpha_learn == "head" else 1
    return int(mode == "gate")


def score_width(config):
    """The summed width of the heads' q.k: C, or each head's latent with MLA's per-head query latent."""
    return config.n_head * config.mla_latent_dim if config.mla and config.mla_per_head_q_latent else config.n_embd


def reciprocal_flops(config, layer_idx):
    """RA's attention matmuls beyond one standard attention (6*T*(width + C) per token: q.k, then the weighted
    values): mix doubles the score width (and, with a window, the keys), gate runs a second attention; a fixed
    alpha of 0 skips the reciprocal term."""
    T, C, qk, mode = config.block_size, config.n_embd, score_width(config), config.layer_mode(layer_idx)
    if mode == "gate":
        return 6 * T * (qk + C)
    if mode != "mix" or (config.ra_alpha == 0.0 and config.ra_alpha_learn == "none"):
        return 0
    keys = 2 * T if 0 < config.ra_window < T else T
    return 6 * keys * (2 * qk + C) - 6 * T * (qk + C)


def no_scores(cfg):
    return 0


# name -> Idea: block construction (RAGPT.make_block), the parameter formula (blocks_params), the FLOPs count
# (RAGPT.flops_per_token), fork rules (fork_new_parameters), Hugging Face export (export_checkpoint.not_gpt2_reason),
# the memory estimate (sharding.attention_weights), the keys' model type (runtime.check_model_keys_apply) and the
# smoke check (test_all_architectures.py) read it. A new idea is its class, one entry here, its keys as RAConfig
# fields and runtime.DEFAULTS keys, and a config file (docs/new-idea.md); check_ideas refuses a key no idea owns.
# The order is the composition's: a layer's attention is the mixins in this order over RAAttention (or MLA).
IDEAS = {
    "reciprocal attention": Idea(
        keys=("ra_pattern", "ra_layers", "ra_mode", "ra_alpha", "ra_alpha_learn", "ra_gate_init", "ra_window"),
        layers=lambda config: config.reciprocal_layers(), attention=ReciprocalMixing, layer_params=reciprocal_params,
        new_parameters=("ra_alpha", "ra_gate_logit"), gpt2_function=False,
        example=dict(ra_pattern="alternate", ra_mode="gate"), extra_flops=reciprocal_flops, kept_scores=no_scores,
        score_streams=lambda cfg: 2 if cfg["ra_pattern"] != "none" and (cfg["ra_mode"] == "gate"
                                                                        or cfg["ra_pattern"] == "learned") else 1),
    "MLA": Idea(
        keys=("mla", "mla_latent_dim", "mla_per_head_q_latent", "mla_per_head_v_up"), layers=all_layers_if("mla"),
        attention=MLAttention, layer_params=lambda config, i: mla_attention_params(config) - attention_params(config),
        new_parameters=(), gpt2_function=False, example=dict(mla=True, mla_latent_dim=8),
        extra_flops=lambda config, i: 6 * config.block_size * (score_width(config) - config.n_embd),
        kept_scores=no_scores),
    "gated attention": Idea(
        keys=("attn_gate",), layers=all_layers_if("attn_gate"), attention=GatedOutput,
        layer_params=lambda config, i: config.n_embd * config.n_embd + int(config.bias) * config.n_embd,
        new_parameters=("c_gate",), gpt2_function=False, example=dict(attn_gate=True), extra_flops=no_flops,
        kept_scores=no_scores),
    "QK-norm": Idea(
        keys=("qk_norm",), layers=all_layers_if("qk_norm"), attention=QKNorm, layer_params=lambda config, i: 0,
        new_parameters=(), gpt2_function=False, example=dict(qk_norm=True), extra_flops=no_flops,
        kept_scores=no_scores),
    # tanh and a scaling per score: elementwise, no matmul FLOPs; the T x T scores it keeps are its cost
    "logit soft-capping": Idea(
        keys=("attn_softcap",), layers=all_layers_if("attn_softcap"), attention=SoftCap,
        layer_params=lambda config, i: 0, new_parameters=(), gpt2_function=False,
        example=dict(attn_softcap=5.0, attn_impl="manual"), extra_flops=no_flops,
        kept_scores=lambda cfg: 2 if cfg["attn_softcap"] > 0 else 0),  # tanh's output beside the softmax weights
    "value residual": Idea(
        keys=("value_residual",), layers=all_layers_if("value_residual"), attention=ValueResidual,
        layer_params=lambda config, i: int(i > 0), new_parameters=("value_lambda",), gpt2_function=False,
        example=dict(value_residual=True), extra_flops=no_flops, kept_scores=no_scores),
}


def check_ideas(config_cls):
    """Every key of the RA model's config (beyond GPTConfig's) is owned by exactly one idea in IDEAS
    and every idea's key is a field: a key no idea reads would build the baseline under a variant's name.
    Every entry gives every required field of Idea."""
    for name, idea in IDEAS.items():
        missing = [f.name for f in fields(Idea) if f.name != "score_streams" and getattr(idea, f.name) is None]
        if missing:
            raise ConfigError(f"idea {name!r} in ra_model.IDEAS lacks {', '.join(missing)}: give its entry every "
                              f"field of Idea (docs/new-idea.md's table says what each is for)")
    own = [f.name for f in fields(config_cls) if f.name not in {g.name for g in fields(GPTConfig)}]
    owners = {key: [name for name, idea in IDEAS.items() if key in idea.keys] for key in own}
    for key, names in owners.items():
        if len(names) != 1:
            raise ConfigError(f"{config_cls.__name__}.{key} is owned by {len(names)} ideas in ra_model.IDEAS "
                              f"({', '.join(names) or 'none'}): register the idea that reads it, once")
    for name, idea in IDEAS.items():
        stray = [key for key in idea.keys if key not in owners]
        if stray:
            raise ConfigError(f"idea {name!r} in ra_model.IDEAS owns {stray}, which {config_cls.__name__} lacks: "
                              f"add the field (and its runtime.DEFAULTS key)")


def check_ideas_run(config):
    """An idea switched on (its first key off its default) runs in at least one layer: one whose layers()
    comes back empty would train the baseline under the variant's name."""
    for name, idea in IDEAS.items():
        switch = next(f for f in fields(config) if f.name == idea.keys[0])
        if getattr(config, switch.name) != switch.default and not list(idea.layers(config)):
            raise ConfigError(f"{switch.name}={getattr(config, switch.name)!r} switches on the idea {name!r}, which "
                              f"runs in none of the {config.n_layer} layers (ra_model.IDEAS[{name!r}].layers is "
                              f"empty): make layers() return the layers that run it, or leave {switch.name} at "
                              f"{switch.default!r}")


def changes_scores(attention):
    """Whether an attention class overrides the scores step (some class in it but ReciprocalMixing defines score_mod)."""
    return any("score_mod" in vars(c) for c in attention.__mro__ if c is not ReciprocalMixing)


def check_scores_step(config):
    """A layer whose ideas change the scores runs them on the manual path only: SDPA and the fused kernels take no
    function of the scores and would silently skip the step."""
    if config.attn_impl == "manual":
        return
    for name, idea in IDEAS.items():
        if list(idea.layers(config)) and changes_scores(idea.attention):
            switch = idea.keys[0]
            raise ConfigError(f"{switch}={getattr(config, switch)!r} ({name}) changes the attention scores before the "
                              f"softmax, which attn_impl={config.attn_impl!r} cannot apply (its fused kernels take "
                              f"no function of the scores): set attn_impl='manual'")


_composed = {}  # (mixins, base) -> the attention class of a layer running those ideas


def attention_class(ideas):
    """The attention of a layer running `ideas` (in IDEAS order): their mixins over RAAttention, or over
    the one idea's module that brings its own projections (MLA)."""
    modules = [idea.attention for idea in ideas if issubclass(idea.attention, nn.Module)]
    if len(modules) > 1:
        raise ConfigError(f"{' and '.join(m.__name__ for m in modules)} both replace the attention's projections: "
                          f"switch one of them off")
    base = modules[0] if modules else RAAttention
    mixins = tuple(idea.attention for idea in ideas if not issubclass(base, idea.attention))
    if (mixins, base) not in _composed:
        _composed[(mixins, base)] = type("".join(m.__name__ for m in (*mixins, base)), (*mixins, base), {}) \
            if mixins else base
    return _composed[(mixins, base)]


# ----------------------------------------------------------------------------- the model

class RAGPT(GPT):
    def __init__(self, config):
        rng = torch.get_rng_state()
        super().__init__(config)
        if any(idea.layers(config) for idea in IDEAS.values()) and not self.lm_head.weight.is_meta:
            self.copy_baseline_init(config, rng)

    def make_block(self, layer_idx):
        if layer_idx == 0:  # GPT.__init__ builds the layers in order: the state they share comes first
            self.layer_state = {}
        ideas = [idea for idea in IDEAS.values() if layer_idx in idea.layers(self.config)]
        if not ideas:
            return Block(self.config)
        layer = Layer(layer_idx, self.layer_state)
        return Block(self.config, attn=attention_class(ideas)(self.config, self.config.layer_mode(layer_idx), layer))

    @classmethod
    def blocks_params(cls, config):
        """make_block's layers by formula: the baseline's, plus what each idea adds to the layers running it."""
        return super().blocks_params(config) + sum(idea.layer_params(config, i)
                                                    for idea in IDEAS.values() for i in idea.layers(config))

    def copy_baseline_init(self, config, rng):
        """An idea's weights (MLA's projections have other shapes than c_attn, the output gate is an extra
        weight) consume a different number of random draws and would shift the init of every later weight.
        Re-draw the baseline GPT from
        the same random state and copy every weight the two models share (embeddings, norms, MLPs,
        attention c_proj): MLA and baseline then differ only in the attention projections. The
        initial weights do not depend on attn_impl, and 'triton' and 'auto' are RA's own: the baseline uses sdpa."""
        torch.set_rng_state(rng)
        base = GPT(GPTConfig(**{**{f.name: getattr(config, f.name) for f in fields(GPTConfig)}, "attn_impl": "sdpa"}))
        own = dict(self.named_parameters())
        with torch.no_grad():
            for name, p in base.named_parameters():
                if name in own and own[name].shape == p.shape:
                    own[name].copy_(p)

    def flops_per_token(self):
        """GPT's 6N + 12*L*C*T plus what each idea declares for each layer running it (Idea.extra_flops)."""
        cfg = self.config
        return super().flops_per_token() + sum(idea.extra_flops(cfg, i)
                                               for idea in IDEAS.values() for i in idea.layers(cfg))

    def measure_attn_auto(self, batch_size, device, autocast, compiled):
        """attn_impl='auto': the choices for this model's training shapes (measure_auto), each path timed
        compiled when the blocks will run compiled."""
        return measure_auto(self, batch_size, device, autocast, compiled)

    def use_attn_auto(self, choices):
        """attn_impl='auto': run with these choices ({auto_key: record}, e.g. rank 0's measure_attn_auto,
        so that every data-parallel rank runs the same kernels); the calls they cover are not measured."""
        use_auto_choices(choices)

    def fork_new_parameters(self):
        """What a baseline trunk lacks and a branch forked from it keeps at its own initialization
        (forking.py): each idea's new_parameters (the learned alphas, the gate logits, the output gates)."""
        own = {part for idea in IDEAS.values() for part in idea.new_parameters}
        return [n for n, _ in self.named_parameters() if any(part in own for part in n.split("."))]

    def metrics(self):
        """Learned gates p and alphas per layer, logged with every evaluation."""
        out = {}
        for i, block in enumerate(self.transformer.h):
            if isinstance(block.attn, ReciprocalMixing):
                out.update(block.attn.ra_metrics(i))
        return out
