"""Fused causal reciprocal attention (RA) in portable Triton, forward and backward.

For (B, H, T, D) tensors q, k, v, scale = 1/sqrt(D), and positions i (query row), j (key column):

    S_ij = q_i . k_j * scale          the ordinary scores
    R_ij = k_i . q_j * scale          the reciprocal scores (S transposed: R_ij = S_ji)
    causal(i, j) = j <= i
    band(i, j)   = causal(i, j) and i - j < window        (band = causal when window = 0)

    standard: out_i = sum_j softmax_j(S_ij | causal) v_j
    swap:     out_i = sum_j softmax_j(R_ij | band) v_j             (window 0: sdpa(k, q, v, is_causal=True))
    mix:      out_i = sum_j softmax_j(S_ij + alpha * [band] R_ij | causal) v_j
              the alpha term is zero outside the band; the S term covers the whole causal range.
              alpha is a scalar or a per-head (H,) tensor and receives its gradient.
    gate:     out = (1 - p) * standard + p * swap,   p = sigmoid(gate_logit), a scalar or per head (H,)
              (the swap branch uses the band). gate_logit receives its gradient.

`window` (ra_window) therefore limits only the reciprocal term; it has no effect on `standard`.
`softmax(x | m)` is the softmax over the positions where m holds.

The Triton path follows FlashAttention-2: the forward walks key blocks with an online softmax (O(T)
memory) and saves each row's log-sum-exp; the backward recomputes the scores from the saved
statistics. Each launch runs one stream: the reciprocal stream is the ordinary one with q and k
exchanged (R = S with q, k swapped), so `gate` runs two launches. mix runs as one stream whose
logits S_ij + alpha R_ij = [q_i, alpha k_i] . [k_j, q_j] are one accumulator per tile (k scaled by
alpha once per program); only the tiles cut by the band's edge keep the alpha term apart. Tiles
inside the causal set (and inside or outside the band) build no mask: each loop runs in masked and
unmasked runs; where T is a multiple of both block sizes and D a power of two up to 64 (EVEN,
_even_tiles; not on CDNA), no load, store or atomic add is masked either, and on Hopper (sm90)
each loop's streamed tiles load by TMA, through tensor descriptors (_tma_tiles; RA_TMA=0 in the
environment keeps the pointer loads, for an A/B comparison). The backward is one
Delta launch (rowsum(dO * O)) and one column-parallel launch (one program per key block) holding dV,
dK and mix's reciprocal half of dQ in registers; the row-side halves (dQ from S, mix's dK from alpha
R) go into float32 buffers by atomic adds, as FlashAttention-2 adds dQ. dalpha is one number per key
row, summed per head after the kernel. `deterministic=True` (or PyTorch's deterministic algorithms)
replaces the atomics by a row-parallel launch: bit-reproducible, one more recomputation of the
scores. Where one column pass holding three accumulators spills (AMD, and windowed mix at D = 128 on
NVIDIA: recip_pass), mix's column kernel runs twice, the S half and then the alpha R half; RDNA3
always takes the row launch instead of atomics (atomic_backward). Every structure sums the same
products in the same order per accumulator: the gradients agree across them (bit for bit on the
deterministic path). On RDNA3 at head size 128 each block runs as two programs of 64 output columns
that compute the scores in 64-column chunks (head_chunk), and the loops are not split (split_loops).
docs/kernels.md has each kernel's registers, spills and matrix instructions per target
(kernels/compile_check.py).

The kernels run when Triton is importable and the inputs are on a GPU (CUDA or ROCm), or under
TRITON_INTERPRET=1 (then on CPU tensors, slowly: that is how the tests prove them right).
`why_not_fused` is the one place that decides it: ra_model asks it and otherwise runs its PyTorch
SDPA path, and `reciprocal_attention` refuses to run without the kernels. The PyTorch reference of
every mode, which materializes the T x T scores, is ra_model.reciprocal_manual (the tests check
the kernels against it in float64).

Dtypes: float32, float16, bfloat16 (accumulation in float32) and float64 (float64 accumulation;
meant for gradcheck under the interpreter). float32 inputs use TF32 dots only where PyTorch allows
TF32 matmuls (torch.backends.cuda.matmul.allow_tf32, NVIDIA). Head sizes up to 128 (padded to a power of two, at least 16); any T >= 1.
"""

import math
import os
from typing import Optional

import torch

MODES = ("standard", "swap", "mix", "gate")

try:
    import triton
    import triton.language as tl
except ImportError:  # ra_model runs its PyTorch paths instead
    triton = None

INTERPRET = os.environ.get("TRITON_INTERPRET") == "1"  # triton.jit reads it at decoration time too


def tma_switch(value):
    """RA_TMA, read once at import: '1' (or unset) lets sm90 launches load by TMA where the tiles allow it
    (_tma_tiles), '0' keeps EVEN's pointer loads everywhere, for an A/B comparison of speed or results.
    gpu_check.py flips the module's USE_TMA between its rows instead (a launch reads it each time)."""
    if value not in (None, "0", "1"):
        raise ValueError(f"RA_TMA={value!r}: use RA_TMA=0 (pointer loads only) or RA_TMA=1 (TMA on sm90, the default)")
    return value != "0"


USE_TMA = tma_switch(os.environ.get("RA_TMA"))


def _per_head(x, like):
    """A scalar or (H,) value as something that broadcasts against (B, H, T, D)."""
    x = torch.as_tensor(x, device=like.device)
    return x.view(1, -1, 1, 1) if x.dim() == 1 else x


# ----------------------------------------------------------------------------------------------
# Triton kernels. Each launch runs one attention stream with row operand A and column operand B:
# logits S_ij = A_i . B_j. The launcher passes (q, k) for the ordinary stream and (k, q) for the
# reciprocal one (R = S with q and k exchanged), so gate runs its two streams as two launches.
# MIX adds alpha * [band] R_ij = alpha * B_i . A_j to the logits (under the causal mask). Since
# S_ij + alpha R_ij = [A_i, alpha B_i] . [B_j, A_j], a program scales its held B rows by alpha once
# and accumulates both products of a tile into one accumulator (one dot of twice the head size);
# only tiles cut by the band's edge keep the alpha term apart, to mask it. Softmax runs in base 2
# (exp2 with log2(e) folded into the scale): the saved log-sum-exp is in log2 units.
#
# Loop split (SPLIT): each program walks its tiles in runs. A tile entirely inside the causal set
# and entirely inside (or outside) the band builds no mask at all; only the diagonal tiles and the
# band's edge tiles do. RDNA3 runs one masked loop instead (SPLIT=False): the extra loop bodies
# cost it registers and it spilled (docs/kernels.md).

# (BLOCK_M, BLOCK_N, warps, stages) lists per GPU target, head size and mode; the first of each is
# the conservative configuration (the smallest tile). Lists: forward (BLOCK_M query rows held,
# BLOCK_N key rows streamed), column backward (BLOCK_N key rows held, BLOCK_M query rows streamed),
# row backward (the deterministic path's second kernel, as the forward). sm90: 128-row tiles,
# 4-8 warps (wgmma takes 64 rows per warpgroup of 4 warps), 3-4 stages. CDNA (gfx942 MI300X):
# 2 stages and its own knobs (cdna_knobs). RDNA3 (gfx1100): registers are the limit, small tiles,
# one stage, the head split at D = 128 (head_chunk). kernels/compile_check.py compiles every list.
def autotune_space(target, block_d=64, mix=False):
    """(forward, column, row) kernel configurations as (BLOCK_M, BLOCK_N, warps, stages) lists for
    a target ('gfx1100', 'gfx942', 'sm90', 'sm80' ...)."""
    if is_cdna(target):
        fwd = [(64, 32, 4, 2), (64, 64, 4, 2), (128, 64, 4, 2), (128, 64, 8, 2)]
        col = [(16, 64, 4, 2), (32, 32, 4, 2)] if mix else [(32, 64, 4, 2), (64, 64, 4, 2), (64, 128, 8, 2)]
        return fwd, col, [(64, 32, 4, 2), (64, 64, 4, 2)]
    if not target.startswith("sm"):  # RDNA3 (wave32): 4 warps spread a 16-row tile's registers further
        row = [(16, 16, 2, 1)] if mix else [(16, 16, 2, 1), (32, 16, 2, 1), (64, 16, 4, 1)]  # mix: 32+ rows spill
        return [(32, 16, 2, 1), (64, 16, 4, 1), (64, 32, 4, 1)], [(16, 16, 4, 1), (16, 32, 4, 1)], row
    if target == "sm80":
        return ([(64, 32, 4, 2), (64, 64, 4, 3), (128, 64, 8, 3)], [(32, 64, 4, 2), (64, 64, 4, 2)],
                [(64, 32, 4, 2), (64, 64, 4, 2)])
    if block_d <= 64:
        fwd = [(64, 64, 4, 3), (128, 64, 8, 3), (128, 64, 8, 4)]
        # mix's 128 held key rows halve the atomic adds of the row halves (each program adds one
        # BLOCK_M x D tile per query block it streams); 32 x 128 spills (8-36 bytes), 16 x 128 does not
        col = ([(16, 64, 4, 2), (32, 64, 8, 2), (16, 128, 8, 2)] if mix
               else [(32, 64, 4, 2), (32, 64, 8, 2), (64, 128, 8, 2)])
        return fwd, col, [(64, 64, 4, 3), (128, 64, 8, 3)]
    # 128-wide rows: the 64-row forward tiles spill in windowed mix, the column kernel holds three
    # 128-wide accumulators (windowed mix still spills 24-52 bytes in every tile, docs/kernels.md);
    # two fit 128 key rows, three do not (mix's 16 x 128 spills 384 bytes)
    col = [(16, 32, 4, 2), (16, 64, 8, 2)] if mix else [(32, 64, 8, 2), (32, 128, 8, 2)]
    return [(128, 64, 8, 3)], col, [(32, 64, 8, 2)] if mix else [(32, 64, 8, 2), (128, 64, 8, 3)]


def cdna_knobs(target, index=0):
    """AMD CDNA compile options of every configuration of list `index` (autotune_space): 16 x 16
    MFMA instructions (FlashAttention's choice on MI300X); two waves per execution unit in the
    forward, one in the backward, whose column kernel needs more than the 256 VGPRs that two waves
    leave (it spilled 353 at D = 128)."""
    if not is_cdna(target):
        return {}
    return {"waves_per_eu": 2 if index == 0 else 1, "matrix_instr_nonkdim": 16}


def split_loops(target):
    """Whether tiles are walked in masked and unmasked runs (all but RDNA3, where it spills)."""
    return not (target.startswith("gfx") and not is_cdna(target))


def atomic_backward(target):
    """Whether the column kernel adds the row halves by atomics where the caller allows them; else
    the row kernel computes them (the deterministic path). Not on RDNA3: the atomics' tiles made the
    column kernel spill there (5-89 VGPRs at D = 64 in its smallest tiles, docs/kernels.md)."""
    return not (target.startswith("gfx") and not is_cdna(target))


def recip_pass(target, block_d, band):
    """Whether mix's column backward runs as two passes, the S half (dV, dK and dQ's row half) then
    the alpha R half (the reciprocal dQ, dK's row half, dalpha), where one pass holding all three
    accumulators spills: AMD (both), and windowed mix at D = 128 on NVIDIA. Each pass recomputes
    the scores: one more S + alpha R and dP product per tile (docs/kernels.md)."""
    return target.startswith("gfx") or (band and block_d > 64)


def mask_free_tiles(target, block_d):
    """Whether launches on the target at this (padded) head size take EVEN where the tiles allow it
    (_even_tiles): up to D = 64, not on CDNA. Without their masks at D = 128, sm90's forward for
    windowed mix (255 registers) spilled 24 bytes and gfx942's column kernel 5 VGPRs, where the masked
    kernels fit; CDNA at 64 is unchecked (docs/kernels.md)."""
    return block_d <= 64 and not is_cdna(target)


def _even_tiles(args):
    """EVEN, decided per configuration from a launch's arguments: every tile lies inside the sequence
    and the head (T a multiple of BLOCK_M and BLOCK_N, D a power of two from 16), so the kernels'
    loads, stores and atomic adds run without masks, where the target fits them (mask_free_tiles).
    GPT-2's T = 1024 at D = 64 takes it."""
    whole = args["T"] % args["BLOCK_M"] == 0 and args["T"] % args["BLOCK_N"] == 0 and args["D"] == args["BLOCK_D"]
    return whole and (INTERPRET or mask_free_tiles(gpu_target(torch.cuda.current_device()), args["BLOCK_D"]))


def tma_loads(target):
    """Whether the kernels load by TMA, the tensor memory accelerator that copies a tile between
    global and shared memory from a descriptor: on Hopper (sm90), the target compile_check compiles
    it for; later NVIDIA targets keep the pointer loads until they are checked."""
    return target == "sm90"


def _tma_tiles(args):
    """TMA, decided per configuration after EVEN: the streamed tiles load through tensor descriptors
    where the tiles are whole (EVEN) and the target has TMA (under the interpreter: INTERPRET_TMA), unless
    RA_TMA=0 (USE_TMA) turns it off.
    A descriptor needs 16-byte aligned rows: each operand's start and its strides."""
    if not (args["EVEN"] and args["BLOCK_DC"] == args["BLOCK_D"]):  # a descriptor loads whole rows of whole tiles
        return False
    operands = [args[name] for name in ("A", "B", "V", "DO") if name in args]
    row_bytes = [args[name] * operands[0].element_size() for name in ("stride_b", "stride_h", "stride_t")]
    aligned = all(x.data_ptr() % 16 == 0 for x in operands) and all(n % 16 == 0 for n in row_bytes)
    tma = INTERPRET_TMA if INTERPRET else tma_loads(gpu_target(torch.cuda.current_device()))
    return aligned and tma and USE_TMA


def is_cdna(target):
    """AMD's data-centre GPUs (gfx90a MI250X, gfx942 MI300X, gfx950): wave64, unlike RDNA's gfx10-12."""
    return target.startswith("gfx9")


def gpu_target(device):
    """The autotune_space target of a CUDA or ROCm device: 'sm90', 'gfx1100' ..."""
    if torch.version.hip:
        return torch.cuda.get_device_properties(device).gcnArchName.split(":")[0]
    major, minor = torch.cuda.get_device_capability(device)
    return f"sm{major}{minor}"


if triton is not None:

    @triton.jit
    def _load_tile(X, in_off, start, stride_t, T, D, d0, BLOCK: tl.constexpr, BLOCK_C: tl.constexpr,
                   DOT: tl.constexpr, EVEN: tl.constexpr, VOLATILE: tl.constexpr = False):
        """Rows start .. start + BLOCK and head columns d0 .. d0 + BLOCK_C of one head of q, k, v (a
        strided view) or dO, zero outside the sequence and head (EVEN: the tile lies inside both, no
        mask). The row offset goes into the 64-bit base: T * stride_t may pass 2**31. X may be a
        TMA descriptor of the head's rows instead (_tma_rows), which copies the tile by itself."""
        if isinstance(X, tl.tensor_descriptor):
            x = X.load([start, d0])
        else:
            rows = tl.arange(0, BLOCK)
            cols = d0 + tl.arange(0, BLOCK_C)
            ptrs = X + in_off + tl.cast(start, tl.int64) * stride_t + rows[:, None] * stride_t + cols[None, :]
            if EVEN:
                x = tl.load(ptrs, volatile=VOLATILE)
            else:
                mask = (start + rows[:, None] < T) & (cols[None, :] < D)
                x = tl.load(ptrs, mask=mask, other=0.0, volatile=VOLATILE)
        return x.to(DOT)

    @triton.jit
    def _tma_rows(X, in_off, stride_t, T, BLOCK: tl.constexpr, BLOCK_D: tl.constexpr):
        """A TMA descriptor of one head's T x BLOCK_D rows of X, loaded BLOCK rows at a time."""
        return tl.make_tensor_descriptor(X + in_off, shape=[T, BLOCK_D], strides=[stride_t, 1],
                                         block_shape=[BLOCK, BLOCK_D])

    @triton.jit
    def _load_rows(X, bh, offs, T, EVEN: tl.constexpr):
        """One number per row (a log-sum-exp, Delta) of the rows offs of head bh, 0 past T."""
        if EVEN:
            x = tl.load(X + bh * T + offs)
        else:
            x = tl.load(X + bh * T + offs, mask=offs < T, other=0.0)
        return x

    @triton.jit
    def _scores(a, ra, A, RA, a_off, a_stride, a_start, B, RB, b_off, b_stride, b_start, T, D, alpha,
                R: tl.constexpr, BLOCK_A: tl.constexpr, BLOCK_B: tl.constexpr, BLOCK_D: tl.constexpr,
                BLOCK_DC: tl.constexpr, ACC: tl.constexpr, DOT: tl.constexpr, PRECISION: tl.constexpr,
                EVEN: tl.constexpr):
        """s = a . B_b^T for the held rows a and B's rows b_start ..; R = 1 adds ra . RB_b^T into the
        same accumulator (ra: held rows already scaled by alpha), R = 2 returns that term apart as r
        (to be masked by the band), R = 0 leaves it out. With BLOCK_DC < BLOCK_D (RDNA3's head split)
        no program holds whole rows: the held rows come from A and RA chunk by chunk too, with
        volatile loads (LLVM would hoist the loop-invariant chunks and hold whole rows again)."""
        s = tl.zeros([BLOCK_A, BLOCK_B], ACC)
        r = s
        if BLOCK_DC == BLOCK_D:
            b = _load_tile(B, b_off, b_start, b_stride, T, D, 0, BLOCK_B, BLOCK_D, DOT, EVEN)
            s = tl.dot(a, tl.trans(b), s, input_precision=PRECISION, out_dtype=ACC)
            if R != 0:
                rb = _load_tile(RB, b_off, b_start, b_stride, T, D, 0, BLOCK_B, BLOCK_D, DOT, EVEN)
                if R == 1:
                    s = tl.dot(ra, tl.trans(rb), s, input_precision=PRECISION, out_dtype=ACC)
                else:
                    r = tl.dot(ra, tl.trans(rb), r, input_precision=PRECISION, out_dtype=ACC)
        else:
            for d0 in tl.static_range(0, BLOCK_D, BLOCK_DC):
                a_c = _load_tile(A, a_off, a_start, a_stride, T, D, d0, BLOCK_A, BLOCK_DC, DOT, EVEN, True)
                b_c = _load_tile(B, b_off, b_start, b_stride, T, D, d0, BLOCK_B, BLOCK_DC, DOT, EVEN, True)
                s = tl.dot(a_c, tl.trans(b_c), s, input_precision=PRECISION, out_dtype=ACC)
                if R != 0:
                    ra_c = _load_tile(RA, a_off, a_start, a_stride, T, D, d0, BLOCK_A, BLOCK_DC, ACC, EVEN, True)
                    ra_c = (ra_c * alpha).to(DOT)
                    rb_c = _load_tile(RB, b_off, b_start, b_stride, T, D, d0, BLOCK_B, BLOCK_DC, DOT, EVEN, True)
                    if R == 1:
                        s = tl.dot(ra_c, tl.trans(rb_c), s, input_precision=PRECISION, out_dtype=ACC)
                    else:
                        r = tl.dot(ra_c, tl.trans(rb_c), r, input_precision=PRECISION, out_dtype=ACC)
        return s, r

    @triton.jit
    def _held(A, RA, in_off, stride_t, start, T, D, d0, alpha, MIX: tl.constexpr, BLOCK: tl.constexpr,
              BLOCK_C: tl.constexpr, ACC: tl.constexpr, DOT: tl.constexpr, EVEN: tl.constexpr):
        """A program's own rows, head columns d0 .. d0 + BLOCK_C: A's, and (MIX) RA's scaled by alpha once."""
        a = _load_tile(A, in_off, start, stride_t, T, D, d0, BLOCK, BLOCK_C, DOT, EVEN)
        ra = a
        if MIX:
            ra = (_load_tile(RA, in_off, start, stride_t, T, D, d0, BLOCK, BLOCK_C, ACC, EVEN) * alpha).to(DOT)
        return a, ra

    @triton.jit
    def _mask(s, r, i, j, T, W, MIX: tl.constexpr, R: tl.constexpr):
        """A masked tile's logits: -inf outside the causal set (MIX) or the band; MIX adds the alpha
        term r (R = 2) inside the band only. Also returns the band. Query rows x key columns take
        i, j = offs_m[:, None], offs_n[None, :]; the transposed tile i, j = offs_m[None, :], offs_n[:, None]."""
        causal = (i >= j) & (j < T)
        band = causal & (i - j < W)
        allowed = band
        if MIX:
            allowed = causal
            if R == 2:
                s += tl.where(band, r, 0.0)
        return tl.where(allowed, s, float("-inf")), band

    @triton.jit
    def _store_tile(X, bh, offs, d0, x, T, D, BLOCK_DC: tl.constexpr, EVEN: tl.constexpr):
        offs_d = d0 + tl.arange(0, BLOCK_DC)
        ptrs = X + bh * T * D + offs[:, None] * D + offs_d[None, :]
        if EVEN:
            tl.store(ptrs, x.to(X.dtype.element_ty))
        else:
            tl.store(ptrs, x.to(X.dtype.element_ty), mask=(offs[:, None] < T) & (offs_d[None, :] < D))

    @triton.jit
    def _add_tile(X, bh, offs, d0, x, T, D, BLOCK_DC: tl.constexpr, EVEN: tl.constexpr):
        """x added into a float32 (float64) gradient buffer that other programs add to as well."""
        offs_d = d0 + tl.arange(0, BLOCK_DC)
        ptrs = X + bh * T * D + offs[:, None] * D + offs_d[None, :]
        if EVEN:
            tl.atomic_add(ptrs, x, sem="relaxed")
        else:
            tl.atomic_add(ptrs, x, mask=(offs[:, None] < T) & (offs_d[None, :] < D), sem="relaxed")

    @triton.jit
    def _row_bounds(start_m, T, W, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr):
        """The runs of key blocks for the query block start_m: [0, out_hi) entirely outside the band,
        [out_hi, in_lo) cut by its edge, [in_lo, diag_lo) entirely inside it and causal, [diag_lo, hi)
        the diagonal (some j > i)."""
        hi = tl.minimum(start_m + BLOCK_M, T)
        diag_lo = (start_m + 1) // BLOCK_N * BLOCK_N
        out_hi = tl.minimum(tl.maximum(start_m - W + 1, 0) // BLOCK_N * BLOCK_N, diag_lo)
        in_lo = (tl.maximum(start_m + BLOCK_M - W, 0) + BLOCK_N - 1) // BLOCK_N * BLOCK_N
        in_lo = tl.minimum(tl.maximum(in_lo, out_hi), diag_lo)
        return out_hi, in_lo, diag_lo, hi

    @triton.jit
    def _col_bounds(start_n, T, W, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr):
        """The runs of query blocks for the key block start_n: [lo, diag_hi) the diagonal,
        [diag_hi, in_hi) causal and entirely inside the band, [in_hi, out_lo) cut by its edge,
        [out_lo, T) entirely outside it."""
        lo = start_n // BLOCK_M * BLOCK_M
        diag_hi = (start_n + BLOCK_N - 1 + BLOCK_M - 1) // BLOCK_M * BLOCK_M
        in_hi = tl.maximum((start_n + W) // BLOCK_M * BLOCK_M, diag_hi)
        out_lo = tl.maximum((start_n + BLOCK_N - 1 + W + BLOCK_M - 1) // BLOCK_M * BLOCK_M, in_hi)
        return lo, diag_hi, in_hi, out_lo

    # ------------------------------------------------------------------------------ forward
    @triton.jit
    def _fwd_run(acc, m, l, a, ra, A, B, V, in_off, stride_t, start_m, lo, hi, T, D, W, alpha, qk_scale, d0,
                 MASKED: tl.constexpr, R: tl.constexpr, MIX: tl.constexpr, BLOCK_M: tl.constexpr,
                 BLOCK_N: tl.constexpr, BLOCK_D: tl.constexpr, BLOCK_DC: tl.constexpr, ACC: tl.constexpr,
                 DOT: tl.constexpr, PRECISION: tl.constexpr, EVEN: tl.constexpr):
        """The online softmax over key blocks lo .. hi (one run)."""
        offs_m = start_m + tl.arange(0, BLOCK_M)
        for start_n in range(lo, hi, BLOCK_N):
            s, r = _scores(a, ra, A, B, in_off, stride_t, start_m, B, A, in_off, stride_t, start_n, T, D, alpha,
                           R, BLOCK_M, BLOCK_N, BLOCK_D, BLOCK_DC, ACC, DOT, PRECISION, EVEN)
            if MASKED:
                s, band = _mask(s, r, offs_m[:, None], start_n + tl.arange(0, BLOCK_N)[None, :], T, W, MIX, R)
            x = s * qk_scale
            m_new = tl.maximum(m, tl.max(x, 1))
            m_safe = m_new
            if MASKED:  # a row with nothing allowed yet stays 0, not NaN
                m_safe = tl.where(m_new == float("-inf"), 0.0, m_new)
            p = tl.exp2(x - m_safe[:, None])
            corr = tl.exp2(m - m_safe)
            l = l * corr + tl.sum(p, 1)
            v = _load_tile(V, in_off, start_n, stride_t, T, D, d0, BLOCK_N, BLOCK_DC, DOT, EVEN)
            acc = tl.dot(p.to(DOT), v, acc * corr[:, None], input_precision=PRECISION, out_dtype=ACC)
            m = m_new
        return acc, m, l

    @triton.jit
    def _ra_fwd_kernel(A, B, V, Alpha, O, L,
                       stride_b, stride_h, stride_t, H, T, D, W, scale, T_BUCKET,
                       MIX: tl.constexpr, BAND: tl.constexpr, SPLIT: tl.constexpr, ACC: tl.constexpr,
                       DOT: tl.constexpr, PRECISION: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr,
                       BLOCK_D: tl.constexpr, BLOCK_DC: tl.constexpr, EVEN: tl.constexpr, TMA: tl.constexpr):
        bh = tl.program_id(0).to(tl.int64)  # B * H on axis 0 (axis 1 allows 65,535 programs only)
        start_m = (tl.num_programs(1) - 1 - tl.program_id(1)) * BLOCK_M  # the longest rows first
        d0 = tl.program_id(2) * BLOCK_DC
        in_off = (bh // H) * stride_b + (bh % H) * stride_h  # q, k, v may be strided views
        qk_scale = scale * 1.4426950408889634  # log2(e)
        alpha = 0.0
        if MIX:
            alpha = tl.load(Alpha + bh % H).to(ACC)
        a = 0.0
        ra = 0.0
        if BLOCK_DC == BLOCK_D:
            a, ra = _held(A, B, in_off, stride_t, start_m, T, D, 0, alpha, MIX, BLOCK_M, BLOCK_D, ACC, DOT, EVEN)
        if TMA:  # from here on A, B and V are only streamed, BLOCK_N rows at a time
            if MIX:
                A = _tma_rows(A, in_off, stride_t, T, BLOCK_N, BLOCK_D)
            B = _tma_rows(B, in_off, stride_t, T, BLOCK_N, BLOCK_D)
            V = _tma_rows(V, in_off, stride_t, T, BLOCK_N, BLOCK_D)

        m = tl.full([BLOCK_M], float("-inf"), ACC)
        l = tl.zeros([BLOCK_M], ACC)
        acc = tl.zeros([BLOCK_M, BLOCK_DC], ACC)
        out_hi, in_lo, diag_lo, hi = _row_bounds(start_m, T, W, BLOCK_M, BLOCK_N)
        if not SPLIT:  # one masked loop over every tile with a key in range
            lo = 0
            if not MIX:
                lo = out_hi
            acc, m, l = _fwd_run(acc, m, l, a, ra, A, B, V, in_off, stride_t, start_m, lo, hi, T, D, W, alpha,
                                 qk_scale, d0, True, 2 if BAND else (1 if MIX else 0), MIX, BLOCK_M, BLOCK_N,
                                 BLOCK_D, BLOCK_DC, ACC, DOT, PRECISION, EVEN)
        elif MIX and BAND:
            acc, m, l = _fwd_run(acc, m, l, a, ra, A, B, V, in_off, stride_t, start_m, 0, out_hi, T, D, W, alpha,
                                 qk_scale, d0, False, 0, MIX, BLOCK_M, BLOCK_N, BLOCK_D, BLOCK_DC, ACC, DOT,
                                 PRECISION, EVEN)
            acc, m, l = _fwd_run(acc, m, l, a, ra, A, B, V, in_off, stride_t, start_m, out_hi, in_lo, T, D, W, alpha,
                                 qk_scale, d0, True, 2, MIX, BLOCK_M, BLOCK_N, BLOCK_D, BLOCK_DC, ACC, DOT,
                                 PRECISION, EVEN)
            acc, m, l = _fwd_run(acc, m, l, a, ra, A, B, V, in_off, stride_t, start_m, in_lo, diag_lo, T, D, W,
                                 alpha, qk_scale, d0, False, 1, MIX, BLOCK_M, BLOCK_N, BLOCK_D, BLOCK_DC, ACC, DOT,
                                 PRECISION, EVEN)
            acc, m, l = _fwd_run(acc, m, l, a, ra, A, B, V, in_off, stride_t, start_m, diag_lo, hi, T, D, W, alpha,
                                 qk_scale, d0, True, 2, MIX, BLOCK_M, BLOCK_N, BLOCK_D, BLOCK_DC, ACC, DOT,
                                 PRECISION, EVEN)
        elif MIX:
            acc, m, l = _fwd_run(acc, m, l, a, ra, A, B, V, in_off, stride_t, start_m, 0, diag_lo, T, D, W, alpha,
                                 qk_scale, d0, False, 1, MIX, BLOCK_M, BLOCK_N, BLOCK_D, BLOCK_DC, ACC, DOT,
                                 PRECISION, EVEN)
            acc, m, l = _fwd_run(acc, m, l, a, ra, A, B, V, in_off, stride_t, start_m, diag_lo, hi, T, D, W, alpha,
                                 qk_scale, d0, True, 1, MIX, BLOCK_M, BLOCK_N, BLOCK_D, BLOCK_DC, ACC, DOT,
                                 PRECISION, EVEN)
        else:  # key blocks entirely left of the band are skipped (no band: out_hi = in_lo = 0)
            acc, m, l = _fwd_run(acc, m, l, a, ra, A, B, V, in_off, stride_t, start_m, out_hi, in_lo, T, D, W, alpha,
                                 qk_scale, d0, True, 0, MIX, BLOCK_M, BLOCK_N, BLOCK_D, BLOCK_DC, ACC, DOT,
                                 PRECISION, EVEN)
            acc, m, l = _fwd_run(acc, m, l, a, ra, A, B, V, in_off, stride_t, start_m, in_lo, diag_lo, T, D, W,
                                 alpha, qk_scale, d0, False, 0, MIX, BLOCK_M, BLOCK_N, BLOCK_D, BLOCK_DC, ACC, DOT,
                                 PRECISION, EVEN)
            acc, m, l = _fwd_run(acc, m, l, a, ra, A, B, V, in_off, stride_t, start_m, diag_lo, hi, T, D, W, alpha,
                                 qk_scale, d0, True, 0, MIX, BLOCK_M, BLOCK_N, BLOCK_D, BLOCK_DC, ACC, DOT,
                                 PRECISION, EVEN)
        offs_m = start_m + tl.arange(0, BLOCK_M)
        l_safe = tl.where(l == 0.0, 1.0, l)
        _store_tile(O, bh, offs_m, d0, acc / l_safe[:, None], T, D, BLOCK_DC, EVEN)  # O is contiguous
        tl.store(L + bh * T + offs_m, m + tl.log2(l_safe), mask=(offs_m < T) & (d0 == 0))

    # ------------------------------------------------------------------------------ backward
    @triton.jit
    def _ra_delta_kernel(O, DO, Delta, T, D, ACC: tl.constexpr, BLOCK: tl.constexpr, BLOCK_D: tl.constexpr):
        """Delta_i = rowsum(dO_i * O_i) of contiguous (B * H, T, D) O and dO."""
        bh = tl.program_id(0).to(tl.int64)
        offs = tl.program_id(1) * BLOCK + tl.arange(0, BLOCK)
        cols = tl.arange(0, BLOCK_D)
        mask = (offs[:, None] < T) & (cols[None, :] < D)
        ptrs = bh * T * D + offs[:, None] * D + cols[None, :]
        o = tl.load(O + ptrs, mask=mask, other=0.0).to(ACC)
        do = tl.load(DO + ptrs, mask=mask, other=0.0).to(ACC)
        tl.store(Delta + bh * T + offs, tl.sum(o * do, 1), mask=offs < T)

    @triton.jit
    def _col_run(dv, db, du, b, rb, b_c, rb_c, v, A, B, V, DO, L, Delta, DA, DB, bh, in_off, stride_t, do_off,
                 start_n, lo, hi, T, D, W, alpha, scale, d0,
                 MASKED: tl.constexpr, R: tl.constexpr, MIX: tl.constexpr, ATOMIC: tl.constexpr, GRADS: tl.constexpr,
                 BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_D: tl.constexpr, BLOCK_DC: tl.constexpr,
                 ACC: tl.constexpr, DOT: tl.constexpr, PRECISION: tl.constexpr, EVEN: tl.constexpr):
        """One run of query blocks lo .. hi for the key block start_n, on the transposed tile (key
        rows x query columns), so that the held accumulators need no transposed operand."""
        offs_n = start_n + tl.arange(0, BLOCK_N)
        qk_scale = scale * 1.4426950408889634
        for start_m in range(lo, hi, BLOCK_M):
            offs_m = start_m + tl.arange(0, BLOCK_M)
            # S^T_ji = B_j . A_i and alpha R^T_ji = alpha A_j . B_i
            st, rt = _scores(b, rb, B, A, in_off, stride_t, start_n, A, B, in_off, stride_t, start_m, T, D, alpha,
                             R, BLOCK_N, BLOCK_M, BLOCK_D, BLOCK_DC, ACC, DOT, PRECISION, EVEN)
            band = st > 0  # unused unless masked
            if MASKED:
                st, band = _mask(st, rt, offs_m[None, :], offs_n[:, None], T, W, MIX, R)
            lse = _load_rows(L, bh, offs_m, T, EVEN)
            delta = _load_rows(Delta, bh, offs_m, T, EVEN)
            pt = tl.exp2(st * qk_scale - lse[None, :])  # masked logits are -inf: P = 0 there
            dpt, _ = _scores(v, v, V, V, in_off, stride_t, start_n, DO, DO, do_off, D, start_m, T, D, alpha,
                             0, BLOCK_N, BLOCK_M, BLOCK_D, BLOCK_DC, ACC, DOT, PRECISION, EVEN)  # v_j . dO_i
            gt = pt * (dpt - delta[None, :]) * scale  # d(loss) / d(S_ij), transposed
            if GRADS != 2:  # the S half
                do_i = _load_tile(DO, do_off, start_m, D, T, D, d0, BLOCK_M, BLOCK_DC, DOT, EVEN)
                dv = tl.dot(pt.to(DOT), do_i, dv, input_precision=PRECISION, out_dtype=ACC)
                a_i = _load_tile(A, in_off, start_m, stride_t, T, D, d0, BLOCK_M, BLOCK_DC, DOT, EVEN)
                db = tl.dot(gt.to(DOT), a_i, db, input_precision=PRECISION, out_dtype=ACC)  # S_ij = A_i . B_j
                if ATOMIC:  # the row half of dA_i, added into the shared buffer (FlashAttention-2's dQ)
                    _add_tile(DA, bh, offs_m, d0, tl.dot(tl.trans(gt).to(DOT), b_c, input_precision=PRECISION,
                                                         out_dtype=ACC), T, D, BLOCK_DC, EVEN)
            if R != 0 and GRADS != 1:  # the alpha R half: alpha R_ij = alpha B_i . A_j
                gbt = gt
                if R == 2:
                    gbt = tl.where(band, gt, 0.0)
                b_i = _load_tile(B, in_off, start_m, stride_t, T, D, d0, BLOCK_M, BLOCK_DC, DOT, EVEN)
                du = tl.dot(gbt.to(DOT), b_i, du, input_precision=PRECISION, out_dtype=ACC)  # dA_j / alpha
                if ATOMIC:  # the row half of dB_i: alpha sum_j g_ij A_j (rb_c holds alpha A_j)
                    _add_tile(DB, bh, offs_m, d0, tl.dot(tl.trans(gbt).to(DOT), rb_c, input_precision=PRECISION,
                                                         out_dtype=ACC), T, D, BLOCK_DC, EVEN)
        return dv, db, du

    @triton.jit
    def _ra_bwd_col_kernel(A, B, V, Alpha, DO, L, Delta, DA, DB, DV, DAlpha,
                           stride_b, stride_h, stride_t, H, T, D, W, scale, T_BUCKET,
                           MIX: tl.constexpr, BAND: tl.constexpr, SPLIT: tl.constexpr, ATOMIC: tl.constexpr,
                           GRADS: tl.constexpr, ACC: tl.constexpr, DOT: tl.constexpr, PRECISION: tl.constexpr,
                           BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_D: tl.constexpr, BLOCK_DC: tl.constexpr,
                           EVEN: tl.constexpr, TMA: tl.constexpr):
        """Per key block j, in registers: dV_j, the column half of dB_j (from S) and, MIX, of dA_j
        (from alpha R; also each key row's share of dalpha). ATOMIC: the row halves, dA_i from S and
        (MIX) dB_i from alpha R, are added into DA and DB by fp32 atomics; else _ra_bwd_row_kernel
        computes them. GRADS: 3 both halves, 1 the S half only (dV, dB_j, dA_i), 2 the alpha R half
        only (dA_j, dB_i, dalpha): the reciprocal pass, where three accumulators spill (recip_pass)."""
        bh = tl.program_id(0).to(tl.int64)
        start_n = tl.program_id(1) * BLOCK_N  # the longest columns (from the left) come first already
        d0 = tl.program_id(2) * BLOCK_DC
        in_off = (bh // H) * stride_b + (bh % H) * stride_h
        do_off = bh * T * D  # dO is contiguous
        alpha = 0.0
        if MIX:
            alpha = tl.load(Alpha + bh % H).to(ACC)
        b = 0.0
        rb = 0.0
        v = 0.0
        if BLOCK_DC == BLOCK_D:
            b, rb = _held(B, A, in_off, stride_t, start_n, T, D, 0, alpha, MIX, BLOCK_N, BLOCK_D, ACC, DOT, EVEN)
            v = _load_tile(V, in_off, start_n, stride_t, T, D, 0, BLOCK_N, BLOCK_D, DOT, EVEN)
            b_c = b
            rb_c = rb
        else:
            b_c, rb_c = _held(B, A, in_off, stride_t, start_n, T, D, d0, alpha, MIX, BLOCK_N, BLOCK_DC, ACC, DOT, EVEN)
        A_held = A  # dalpha's key rows, loaded after the loop
        if TMA:  # the loop streams A, (MIX) B and dO, BLOCK_M rows at a time
            A = _tma_rows(A, in_off, stride_t, T, BLOCK_M, BLOCK_D)
            if MIX:
                B = _tma_rows(B, in_off, stride_t, T, BLOCK_M, BLOCK_D)
            DO = _tma_rows(DO, do_off, D, T, BLOCK_M, BLOCK_D)
        dv = tl.zeros([BLOCK_N, BLOCK_DC], ACC)
        db = tl.zeros([BLOCK_N, BLOCK_DC], ACC)
        du = tl.zeros([BLOCK_N, BLOCK_DC], ACC)
        lo, diag_hi, in_hi, out_lo = _col_bounds(start_n, T, W, BLOCK_M, BLOCK_N)
        if not SPLIT:
            hi = T
            if not MIX or GRADS == 2:  # no product of a query block below the band's
                hi = tl.minimum(out_lo, T)
            dv, db, du = _col_run(dv, db, du, b, rb, b_c, rb_c, v, A, B, V, DO, L, Delta, DA, DB, bh, in_off,
                                  stride_t, do_off, start_n, lo, hi, T, D, W, alpha, scale, d0, True,
                                  2 if BAND else (1 if MIX else 0), MIX, ATOMIC, GRADS, BLOCK_M, BLOCK_N, BLOCK_D,
                                  BLOCK_DC, ACC, DOT, PRECISION, EVEN)
        elif MIX and BAND:
            dv, db, du = _col_run(dv, db, du, b, rb, b_c, rb_c, v, A, B, V, DO, L, Delta, DA, DB, bh, in_off,
                                  stride_t, do_off, start_n, lo, tl.minimum(diag_hi, T), T, D, W, alpha, scale, d0,
                                  True, 2, MIX, ATOMIC, GRADS, BLOCK_M, BLOCK_N, BLOCK_D, BLOCK_DC, ACC, DOT,
                                  PRECISION, EVEN)
            dv, db, du = _col_run(dv, db, du, b, rb, b_c, rb_c, v, A, B, V, DO, L, Delta, DA, DB, bh, in_off,
                                  stride_t, do_off, start_n, diag_hi, tl.minimum(in_hi, T), T, D, W, alpha, scale,
                                  d0, False, 1, MIX, ATOMIC, GRADS, BLOCK_M, BLOCK_N, BLOCK_D, BLOCK_DC, ACC, DOT,
                                  PRECISION, EVEN)
            dv, db, du = _col_run(dv, db, du, b, rb, b_c, rb_c, v, A, B, V, DO, L, Delta, DA, DB, bh, in_off,
                                  stride_t, do_off, start_n, in_hi, tl.minimum(out_lo, T), T, D, W, alpha, scale, d0,
                                  True, 2, MIX, ATOMIC, GRADS, BLOCK_M, BLOCK_N, BLOCK_D, BLOCK_DC, ACC, DOT,
                                  PRECISION, EVEN)
            if GRADS != 2:  # below the band: no alpha R term
                dv, db, du = _col_run(dv, db, du, b, rb, b_c, rb_c, v, A, B, V, DO, L, Delta, DA, DB, bh, in_off,
                                      stride_t, do_off, start_n, out_lo, T, T, D, W, alpha, scale, d0, False, 0, MIX,
                                      ATOMIC, GRADS, BLOCK_M, BLOCK_N, BLOCK_D, BLOCK_DC, ACC, DOT, PRECISION, EVEN)
        elif MIX:
            dv, db, du = _col_run(dv, db, du, b, rb, b_c, rb_c, v, A, B, V, DO, L, Delta, DA, DB, bh, in_off,
                                  stride_t, do_off, start_n, lo, tl.minimum(diag_hi, T), T, D, W, alpha, scale, d0,
                                  True, 1, MIX, ATOMIC, GRADS, BLOCK_M, BLOCK_N, BLOCK_D, BLOCK_DC, ACC, DOT,
                                  PRECISION, EVEN)
            dv, db, du = _col_run(dv, db, du, b, rb, b_c, rb_c, v, A, B, V, DO, L, Delta, DA, DB, bh, in_off,
                                  stride_t, do_off, start_n, diag_hi, T, T, D, W, alpha, scale, d0, False, 1, MIX,
                                  ATOMIC, GRADS, BLOCK_M, BLOCK_N, BLOCK_D, BLOCK_DC, ACC, DOT, PRECISION, EVEN)
        else:  # query blocks entirely below the band are skipped (no band: in_hi, out_lo >= T)
            dv, db, du = _col_run(dv, db, du, b, rb, b_c, rb_c, v, A, B, V, DO, L, Delta, DA, DB, bh, in_off,
                                  stride_t, do_off, start_n, lo, tl.minimum(diag_hi, T), T, D, W, alpha, scale, d0,
                                  True, 0, MIX, ATOMIC, GRADS, BLOCK_M, BLOCK_N, BLOCK_D, BLOCK_DC, ACC, DOT,
                                  PRECISION, EVEN)
            dv, db, du = _col_run(dv, db, du, b, rb, b_c, rb_c, v, A, B, V, DO, L, Delta, DA, DB, bh, in_off,
                                  stride_t, do_off, start_n, diag_hi, tl.minimum(in_hi, T), T, D, W, alpha, scale,
                                  d0, False, 0, MIX, ATOMIC, GRADS, BLOCK_M, BLOCK_N, BLOCK_D, BLOCK_DC, ACC, DOT,
                                  PRECISION, EVEN)
            dv, db, du = _col_run(dv, db, du, b, rb, b_c, rb_c, v, A, B, V, DO, L, Delta, DA, DB, bh, in_off,
                                  stride_t, do_off, start_n, in_hi, tl.minimum(out_lo, T), T, D, W, alpha, scale, d0,
                                  True, 0, MIX, ATOMIC, GRADS, BLOCK_M, BLOCK_N, BLOCK_D, BLOCK_DC, ACC, DOT,
                                  PRECISION, EVEN)
        offs_n = start_n + tl.arange(0, BLOCK_N)
        if GRADS != 2:
            _store_tile(DV, bh, offs_n, d0, dv, T, D, BLOCK_DC, EVEN)
            if MIX and ATOMIC:  # other programs add dB's row half to these rows
                _add_tile(DB, bh, offs_n, d0, db, T, D, BLOCK_DC, EVEN)
            else:
                _store_tile(DB, bh, offs_n, d0, db, T, D, BLOCK_DC, EVEN)
        if MIX and GRADS != 1:
            if ATOMIC:
                _add_tile(DA, bh, offs_n, d0, du * alpha, T, D, BLOCK_DC, EVEN)
            else:
                _store_tile(DA, bh, offs_n, d0, du * alpha, T, D, BLOCK_DC, EVEN)
            # dalpha = sum_ij g_ij [band] B_i . A_j = sum_j A_j . du_j: one number per key row here,
            # summed per head after the kernel (no R tile, no extra product in the loop)
            a_j = _load_tile(A_held, in_off, start_n, stride_t, T, D, d0, BLOCK_N, BLOCK_DC, ACC, EVEN)
            tl.store(DAlpha + (tl.program_id(2) * tl.num_programs(0) + bh) * T + offs_n, tl.sum(a_j * du, 1),
                     mask=offs_n < T)

    @triton.jit
    def _row_run(da, db, a, ra, do_h, A, B, V, DO, in_off, stride_t, do_off, start_m, lse, delta, lo, hi,
                 T, D, W, alpha, scale, d0, MASKED: tl.constexpr, R: tl.constexpr, MIX: tl.constexpr,
                 BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_D: tl.constexpr, BLOCK_DC: tl.constexpr,
                 ACC: tl.constexpr, DOT: tl.constexpr, PRECISION: tl.constexpr, EVEN: tl.constexpr):
        offs_m = start_m + tl.arange(0, BLOCK_M)
        qk_scale = scale * 1.4426950408889634
        for start_n in range(lo, hi, BLOCK_N):
            s, r = _scores(a, ra, A, B, in_off, stride_t, start_m, B, A, in_off, stride_t, start_n, T, D, alpha,
                           R, BLOCK_M, BLOCK_N, BLOCK_D, BLOCK_DC, ACC, DOT, PRECISION, EVEN)
            band = s > 0  # unused unless masked
            if MASKED:
                s, band = _mask(s, r, offs_m[:, None], start_n + tl.arange(0, BLOCK_N)[None, :], T, W, MIX, R)
            p = tl.exp2(s * qk_scale - lse[:, None])
            dp, _ = _scores(do_h, do_h, DO, DO, do_off, D, start_m, V, V, in_off, stride_t, start_n, T, D, alpha,
                            0, BLOCK_M, BLOCK_N, BLOCK_D, BLOCK_DC, ACC, DOT, PRECISION, EVEN)  # dO_i . v_j
            g = p * (dp - delta[:, None]) * scale
            b_j = _load_tile(B, in_off, start_n, stride_t, T, D, d0, BLOCK_N, BLOCK_DC, DOT, EVEN)
            da = tl.dot(g.to(DOT), b_j, da, input_precision=PRECISION, out_dtype=ACC)
            if R != 0:
                if R == 2:
                    g = tl.where(band, g, 0.0)
                a_j = _load_tile(A, in_off, start_n, stride_t, T, D, d0, BLOCK_N, BLOCK_DC, DOT, EVEN)
                db = tl.dot(g.to(DOT), a_j, db, input_precision=PRECISION, out_dtype=ACC)
        return da, db

    @triton.jit
    def _ra_bwd_row_kernel(A, B, V, Alpha, DO, L, Delta, DA, DB,
                           stride_b, stride_h, stride_t, H, T, D, W, scale, T_BUCKET,
                           MIX: tl.constexpr, BAND: tl.constexpr, SPLIT: tl.constexpr, ACC: tl.constexpr,
                           DOT: tl.constexpr, PRECISION: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr,
                           BLOCK_D: tl.constexpr, BLOCK_DC: tl.constexpr, EVEN: tl.constexpr, TMA: tl.constexpr):
        """The deterministic path's row halves, per query block i: dA_i from S and (MIX) dB_i from
        alpha R, into their own buffers (the launcher adds the column kernel's halves)."""
        bh = tl.program_id(0).to(tl.int64)
        start_m = (tl.num_programs(1) - 1 - tl.program_id(1)) * BLOCK_M
        d0 = tl.program_id(2) * BLOCK_DC
        in_off = (bh // H) * stride_b + (bh % H) * stride_h
        do_off = bh * T * D
        alpha = 0.0
        if MIX:
            alpha = tl.load(Alpha + bh % H).to(ACC)
        a = 0.0
        ra = 0.0
        do_h = 0.0
        if BLOCK_DC == BLOCK_D:
            a, ra = _held(A, B, in_off, stride_t, start_m, T, D, 0, alpha, MIX, BLOCK_M, BLOCK_D, ACC, DOT, EVEN)
            do_h = _load_tile(DO, do_off, start_m, D, T, D, 0, BLOCK_M, BLOCK_D, DOT, EVEN)
        if TMA:  # from here on A, B and V are only streamed, BLOCK_N rows at a time
            if MIX:
                A = _tma_rows(A, in_off, stride_t, T, BLOCK_N, BLOCK_D)
            B = _tma_rows(B, in_off, stride_t, T, BLOCK_N, BLOCK_D)
            V = _tma_rows(V, in_off, stride_t, T, BLOCK_N, BLOCK_D)
        offs_m = start_m + tl.arange(0, BLOCK_M)
        lse = _load_rows(L, bh, offs_m, T, EVEN)
        delta = _load_rows(Delta, bh, offs_m, T, EVEN)
        da = tl.zeros([BLOCK_M, BLOCK_DC], ACC)
        db = tl.zeros([BLOCK_M, BLOCK_DC], ACC)
        out_hi, in_lo, diag_lo, hi = _row_bounds(start_m, T, W, BLOCK_M, BLOCK_N)
        if not SPLIT:
            lo = 0
            if not MIX:
                lo = out_hi
            da, db = _row_run(da, db, a, ra, do_h, A, B, V, DO, in_off, stride_t, do_off, start_m, lse, delta, lo,
                              hi, T, D, W, alpha, scale, d0, True, 2 if BAND else (1 if MIX else 0), MIX, BLOCK_M,
                              BLOCK_N, BLOCK_D, BLOCK_DC, ACC, DOT, PRECISION, EVEN)
        elif MIX and BAND:
            da, db = _row_run(da, db, a, ra, do_h, A, B, V, DO, in_off, stride_t, do_off, start_m, lse, delta, 0,
                              out_hi, T, D, W, alpha, scale, d0, False, 0, MIX, BLOCK_M, BLOCK_N, BLOCK_D, BLOCK_DC,
                              ACC, DOT, PRECISION, EVEN)
            da, db = _row_run(da, db, a, ra, do_h, A, B, V, DO, in_off, stride_t, do_off, start_m, lse, delta,
                              out_hi, in_lo, T, D, W, alpha, scale, d0, True, 2, MIX, BLOCK_M, BLOCK_N, BLOCK_D,
                              BLOCK_DC, ACC, DOT, PRECISION, EVEN)
            da, db = _row_run(da, db, a, ra, do_h, A, B, V, DO, in_off, stride_t, do_off, start_m, lse, delta, in_lo,
                              diag_lo, T, D, W, alpha, scale, d0, False, 1, MIX, BLOCK_M, BLOCK_N, BLOCK_D, BLOCK_DC,
                              ACC, DOT, PRECISION, EVEN)
            da, db = _row_run(da, db, a, ra, do_h, A, B, V, DO, in_off, stride_t, do_off, start_m, lse, delta,
                              diag_lo, hi, T, D, W, alpha, scale, d0, True, 2, MIX, BLOCK_M, BLOCK_N, BLOCK_D,
                              BLOCK_DC, ACC, DOT, PRECISION, EVEN)
        elif MIX:
            da, db = _row_run(da, db, a, ra, do_h, A, B, V, DO, in_off, stride_t, do_off, start_m, lse, delta, 0,
                              diag_lo, T, D, W, alpha, scale, d0, False, 1, MIX, BLOCK_M, BLOCK_N, BLOCK_D, BLOCK_DC,
                              ACC, DOT, PRECISION, EVEN)
            da, db = _row_run(da, db, a, ra, do_h, A, B, V, DO, in_off, stride_t, do_off, start_m, lse, delta,
                              diag_lo, hi, T, D, W, alpha, scale, d0, True, 1, MIX, BLOCK_M, BLOCK_N, BLOCK_D,
                              BLOCK_DC, ACC, DOT, PRECISION, EVEN)
        else:
            da, db = _row_run(da, db, a, ra, do_h, A, B, V, DO, in_off, stride_t, do_off, start_m, lse, delta,
                              out_hi, in_lo, T, D, W, alpha, scale, d0, True, 0, MIX, BLOCK_M, BLOCK_N, BLOCK_D,
                              BLOCK_DC, ACC, DOT, PRECISION, EVEN)
            da, db = _row_run(da, db, a, ra, do_h, A, B, V, DO, in_off, stride_t, do_off, start_m, lse, delta, in_lo,
                              diag_lo, T, D, W, alpha, scale, d0, False, 0, MIX, BLOCK_M, BLOCK_N, BLOCK_D, BLOCK_DC,
                              ACC, DOT, PRECISION, EVEN)
            da, db = _row_run(da, db, a, ra, do_h, A, B, V, DO, in_off, stride_t, do_off, start_m, lse, delta,
                              diag_lo, hi, T, D, W, alpha, scale, d0, True, 0, MIX, BLOCK_M, BLOCK_N, BLOCK_D,
                              BLOCK_DC, ACC, DOT, PRECISION, EVEN)
        _store_tile(DA, bh, offs_m, d0, da, T, D, BLOCK_DC, EVEN)
        if MIX:
            _store_tile(DB, bh, offs_m, d0, db * alpha, T, D, BLOCK_DC, EVEN)

    # Autotuning runs on GPUs only (the interpreter has no benchmarker).
    def _quad(config):
        return config.kwargs["BLOCK_M"], config.kwargs["BLOCK_N"], config.num_warps, config.num_stages

    def _knobs(config):
        return {k: v for k, v in config.kwargs.items() if k not in ("BLOCK_M", "BLOCK_N")}

    def _tuned(kernel, index, key, **options):
        """The kernel autotuned over the list of the launch's GPU, head size and mode (the launch
        runs under its device; BLOCK_D and MIX are in the key), with that GPU's knobs."""
        targets, sizes = ("gfx1100", "gfx942", "sm80", "sm90"), (16, 32, 64, 128)
        entries = dict.fromkeys((q, tuple(cdna_knobs(t, index).items())) for t in targets for d in sizes
                                for mix in (False, True) for q in autotune_space(t, d, mix)[index])
        configs = [triton.Config({"BLOCK_M": m, "BLOCK_N": n, **dict(knobs)}, num_warps=w, num_stages=st)
                   for (m, n, w, st), knobs in entries]

        def listed(configs, named_args, **meta):
            target = gpu_target(torch.cuda.current_device())
            by_entry = {(_quad(c), tuple(_knobs(c).items())): c for c in configs}
            knobs = tuple(cdna_knobs(target, index).items())
            return [by_entry[(q, knobs)] for q in autotune_space(target, meta["BLOCK_D"], meta["MIX"])[index]]

        kernel = triton.heuristics({"EVEN": _even_tiles, "TMA": _tma_tiles})(kernel)
        return triton.autotune(configs, key=key, prune_configs_by={"early_config_prune": listed}, **options)(kernel)

    # T by its power-of-two bucket: generate() and evaluation batches change T call after call
    _KEY = ["T_BUCKET", "BLOCK_D", "MIX", "BAND", "SPLIT", "DOT", "PRECISION"]
    _fwd_tuned = _tuned(_ra_fwd_kernel, 0, _KEY)
    # the atomic path adds into DA and DB: every trial (and the run after tuning) starts from zeros
    _bwd_col_tuned = _tuned(_ra_bwd_col_kernel, 1, _KEY + ["ATOMIC", "GRADS"], reset_to_zero=["DA", "DB"])
    _bwd_row_tuned = _tuned(_ra_bwd_row_kernel, 2, _KEY)

# (BLOCK_M, BLOCK_N) under the interpreter: small, so tiny test shapes span several blocks
INTERPRET_TILE = (16, 16)
INTERPRET_HEAD_CHUNK = 128  # the interpreter's BLOCK_DC at most (tests lower it to split small heads)
INTERPRET_SPLIT = True  # the interpreter walks the loop runs (tests set False: RDNA3's one loop)
INTERPRET_TMA = False  # tests set True: TMA's descriptor loads where the tiles are EVEN
INTERPRET_RECIP_PASS = False  # tests set True: mix's alpha R half of the backward as a pass of its own
DELTA_ROWS = 64  # rows per program of the Delta kernel
# The backward's default: atomics (fast, run to run noise in the last bits of dQ and dK) unless
# PyTorch's deterministic algorithms are on; `reciprocal_attention(deterministic=...)` overrides.
DETERMINISTIC = False


def head_chunk(block_d, target):
    """BLOCK_DC, the head columns a program accumulates and loads at a time. RDNA3 holds a 16-row
    WMMA operand of 128 columns in 64 VGPRs per lane (twice per wave), so at D = 128 a backward
    program holding whole rows spills whatever its tile; there each program keeps 64 columns of
    the output and computes the scores in 64-column chunks (two programs per block, the scores
    computed twice). NVIDIA and CDNA (MI300X) keep whole rows: spill-free at 128 without the
    recomputation."""
    return min(block_d, 64) if target.startswith("gfx") and not is_cdna(target) else block_d


def _launch(tuned, block, q, args, meta):
    """Runs the autotuned kernel on q's GPU, or the untuned one (tuned.fn, EVEN still decided by
    _even_tiles) with INTERPRET_TILE under the interpreter; one program per (batch x head, block of
    `block` rows, chunk of head columns)."""
    B, H, T = q.shape[:3]
    chunks = meta["BLOCK_D"] // meta["BLOCK_DC"]
    if INTERPRET:
        tile = dict(zip(("BLOCK_M", "BLOCK_N"), INTERPRET_TILE))
        tuned.fn[(B * H, triton.cdiv(T, tile[block]), chunks)](*args, **meta, **tile)
    else:
        with torch.cuda.device(q.device):
            if tma_loads(gpu_target(q.device)):  # set per launch: Triton keeps it per thread (a ContextVar)
                triton.set_allocator(_descriptor_scratch)
            tuned[lambda cfg: (B * H, triton.cdiv(T, cfg[block]), chunks)](*args, **meta)


def _descriptor_scratch(size, alignment, stream):
    """Global memory in which a TMA launch's programs write their tensor descriptors (_tma_rows)."""
    return torch.empty(size, device="cuda", dtype=torch.int8)


def _streams(mode, window, T):
    """(swapped, W, MIX) of each stream a mode runs; a swapped stream scores with k as the query.
    W >= T means no band: i - j < T holds for every real row."""
    W = window if 0 < window < T else T
    return {"standard": [(False, T, False)], "swap": [(True, W, False)], "mix": [(False, W, True)],
            "gate": [(False, T, False), (True, W, False)]}[mode]


def _kernel_dtypes(dtype):
    acc = tl.float64 if dtype == torch.float64 else tl.float32
    if dtype == torch.bfloat16 and INTERPRET:
        return acc, tl.float32  # the interpreter's bf16 tl.dot returns garbage (measured, triton 3.8)
    dot = {torch.float16: tl.float16, torch.bfloat16: tl.bfloat16, torch.float32: tl.float32,
           torch.float64: tl.float64}[dtype]
    return acc, dot


def _meta(q, W, mix):
    B, H, T, D = q.shape
    acc, dot = _kernel_dtypes(q.dtype)
    # fp32 means fp32 unless PyTorch allows TF32 matmuls (NVIDIA)
    tf32 = q.dtype == torch.float32 and torch.version.hip is None and torch.backends.cuda.matmul.allow_tf32
    block_d = max(16, triton.next_power_of_2(D))
    target = None if INTERPRET else gpu_target(q.device)
    return dict(H=H, T=T, D=D, W=W, scale=1.0 / math.sqrt(D), T_BUCKET=triton.next_power_of_2(T), MIX=mix,
                BAND=W < T, SPLIT=INTERPRET_SPLIT if INTERPRET else split_loops(target),
                ACC=acc, DOT=dot, PRECISION="tf32" if tf32 else "ieee", BLOCK_D=block_d,
                BLOCK_DC=min(block_d, INTERPRET_HEAD_CHUNK) if INTERPRET else head_chunk(block_d, target))


def _strides(q):
    return q.stride(0), q.stride(1), q.stride(2)


def _acc_dtype(dtype):
    return torch.float64 if dtype == torch.float64 else torch.float32


def _forward_stream(a, b, v, alpha, W, mix):
    """One stream's output and its rows' log-sum-exp (log2 units)."""
    B, H, T, D = a.shape
    o = torch.empty_like(a, memory_format=torch.contiguous_format)
    lse = torch.empty(B * H, T, device=a.device, dtype=_acc_dtype(a.dtype))
    _launch(_fwd_tuned, "BLOCK_M", a, (a, b, v, alpha, o, lse) + _strides(a), _meta(a, W, mix))
    return o, lse


def _delta(o, do):
    """rowsum(dO * O) per row, one Triton launch."""
    B, H, T, D = o.shape
    delta = torch.empty(B * H, T, device=o.device, dtype=_acc_dtype(o.dtype))
    rows = 16 if INTERPRET else DELTA_ROWS
    grid = (B * H, triton.cdiv(T, rows))
    _ra_delta_kernel[grid](o, do, delta, T, D, ACC=tl.float64 if o.dtype == torch.float64 else tl.float32,
                           BLOCK=rows, BLOCK_D=max(16, triton.next_power_of_2(D)))
    return delta


def _backward_stream(a, b, v, alpha, o, lse, do, W, mix, swapped, deterministic):
    """The stream's dq, dk, dv as one (3, B, H, T, D) tensor in float32 (float64 for float64 inputs),
    whichever of q and k is its row operand a (swapped: k), and mix's dalpha (else None); the
    launcher adds gate's two streams and casts. One Delta launch, one column-parallel launch (two
    for recip_pass); the deterministic path adds one row-parallel launch in place of the atomics."""
    B, H, T, D = a.shape
    meta = _meta(a, W, mix)
    do = do.contiguous()
    delta = _delta(o, do)
    acc = lse.dtype
    chunks = meta["BLOCK_D"] // meta["BLOCK_DC"]
    dalpha = torch.empty(chunks, B * H, T, device=a.device, dtype=acc) if mix else lse  # lse: never written
    common = (a, b, v, alpha, do, lse, delta)
    recip = mix and (INTERPRET_RECIP_PASS if INTERPRET else recip_pass(gpu_target(a.device), meta["BLOCK_D"],
                                                                       meta["BAND"]))
    deterministic = deterministic or not (INTERPRET or atomic_backward(gpu_target(a.device)))
    # The atomic path's second recip pass adds into a pair of its own, added after: each sum keeps
    # its order. It lies in front of dq, dk, so that one fill zeroes every atomic target (float32
    # gradients keep it allocated while they live: recip_pass is AMD's and windowed mix's at D = 128).
    scratch = 2 if recip and not deterministic else 0
    buf = torch.empty((scratch + 3, *a.shape), device=a.device, dtype=acc)
    grads = buf[scratch:]
    da, db, dv = (grads[1], grads[0], grads[2]) if swapped else grads.unbind(0)
    if not deterministic:  # the kernels store every other buffer whole
        (buf[:scratch + 2] if mix else da).zero_()
    rows = torch.empty((2, *a.shape), device=a.device, dtype=acc) if mix and deterministic else None
    _launch(_bwd_col_tuned, "BLOCK_N", a, common + (da, db, dv, dalpha) + _strides(a),
            dict(meta, ATOMIC=not deterministic, GRADS=1 if recip else 3))
    if recip:
        # deterministic: this pass stores dA's column half, which the first left alone, and writes no
        # DB; it gets rows[1], not db, since the autotuner zeroes DB before its trials
        da_r, db_r = (da, rows[1]) if deterministic else buf[:2]
        _launch(_bwd_col_tuned, "BLOCK_N", a, common + (da_r, db_r, dv, dalpha) + _strides(a),
                dict(meta, ATOMIC=not deterministic, GRADS=2))
        if not deterministic:
            grads[:2].add_(buf[:2])
    if deterministic:  # without mix the row kernel's dA is all of dA (the column kernel leaves da alone)
        da_row, db_row = rows.unbind(0) if mix else (da, da)
        _launch(_bwd_row_tuned, "BLOCK_M", a, common + (da_row, db_row) + _strides(a), meta)
        if mix:
            grads[:2].add_(rows)
    return grads, dalpha.view(chunks, B, H, T).sum((0, 1, 3)) if mix else None


# The kernels as two custom ops (torch.library): torch.compile traces one opaque op each way, its shapes
# from the fake functions, instead of breaking the graph around autotuned Triton launches it need not
# see. Under autograd the forward op saves its outputs and the backward op consumes them.

def _fused_forward(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, alpha: torch.Tensor, mode: str,
                   window: int, deterministic: bool) -> list[torch.Tensor]:
    """The output of each stream of the mode, then each stream's log-sum-exp (for the backward);
    deterministic is the backward's choice, carried to it."""
    outs, lses = zip(*(_forward_stream(*((k, q) if swapped else (q, k)), v, alpha, W, mix)
                       for swapped, W, mix in _streams(mode, window, q.size(2))))
    return [*outs, *lses]


def _fused_forward_fake(q, k, v, alpha, mode, window, deterministic):
    """Shapes only, for torch.compile's tracing: what _forward_stream allocates per stream."""
    streams = _streams(mode, window, q.size(2))
    B, H, T, _ = q.shape
    outs = [torch.empty_like(q, memory_format=torch.contiguous_format) for _ in streams]
    return outs + [q.new_empty(B * H, T, dtype=_acc_dtype(q.dtype)) for _ in streams]


def _fused_backward(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, alpha: torch.Tensor, saved: list[torch.Tensor],
                    douts: list[Optional[torch.Tensor]], mode: str, window: int,
                    deterministic: bool) -> list[torch.Tensor]:
    """dq, dk, dv stacked as one (3, B, H, T, D) tensor in q's dtype (one add for gate, one cast;
    a custom op's outputs may not be views of one buffer), and dalpha (zeros but for mix), from the
    forward's saved outputs and log-sum-exps; an output's gradient that is None (or zeros, which
    autograd passes for an unused one) adds zeros."""
    streams = _streams(mode, window, q.size(2))
    n = len(streams)
    grads = dalpha = None
    for (swapped, W, mix), o, lse, do in zip(streams, saved[:n], saved[n:], douts):
        if do is None:
            continue
        g, dalphas = _backward_stream(*((k, q) if swapped else (q, k)), v, alpha, o, lse, do, W, mix, swapped,
                                      deterministic)
        grads = g if grads is None else grads + g
        dalpha = dalphas.to(alpha.dtype) if mix else dalpha
    grads = q.new_zeros((3, *q.shape)) if grads is None else grads.to(q.dtype)
    return [grads, torch.zeros_like(alpha) if dalpha is None else dalpha]


def _fused_backward_fake(q, k, v, alpha, saved, douts, mode, window, deterministic):
    return [q.new_empty((3, *q.shape)), torch.empty_like(alpha)]


def _setup_context(ctx, inputs, output):
    q, k, v, alpha, ctx.mode, ctx.window, ctx.deterministic = inputs
    ctx.save_for_backward(q, k, v, alpha, *output)


def _backward(ctx, grads):
    q, k, v, alpha, *saved = ctx.saved_tensors
    douts = list(grads[:len(saved) // 2])  # the log-sum-exps' gradients are not used
    grads, dalpha = _fused_backward_op(q, k, v, alpha, saved, douts, ctx.mode, ctx.window, ctx.deterministic)
    dq, dk, dv = (g.to(x.dtype) for g, x in zip(grads, (q, k, v)))  # no-ops unless k or v has a dtype of its own
    return dq, dk, dv, dalpha, None, None, None


# One namespace per loaded copy of this file (the tests load an interpreted copy next to the package's).
_LIBRARY = __name__.replace(".", "_")
_fused_forward_op = torch.library.custom_op(f"{_LIBRARY}::fused_forward", _fused_forward, mutates_args=())
_fused_forward_op.register_fake(_fused_forward_fake)
_fused_backward_op = torch.library.custom_op(f"{_LIBRARY}::fused_backward", _fused_backward, mutates_args=())
_fused_backward_op.register_fake(_fused_backward_fake)
_fused_forward_op.register_autograd(_backward, setup_context=_setup_context)


# ----------------------------------------------------------------------------------------------
# Public entry point

def triton_available(x):
    """True when Triton can launch kernels on tensors like x."""
    return triton is not None and (x.is_cuda or INTERPRET)


def why_not_fused(q, k, v):
    """None when the fused kernels can run on q, k, v; else the reason, in words."""
    if triton is None:
        return "Triton is not installed"
    if not triton_available(q):
        return "the inputs are not on a GPU and TRITON_INTERPRET is not 1"
    if not q.shape == k.shape == v.shape:
        return "the fused kernel needs one head size for q, k and v (MLA scoring in the latent)"
    if q.size(-1) > 128:
        return f"the fused kernel takes head sizes up to 128, not {q.size(-1)}"
    return None


def _check_args(q, k, v, mode, alpha, gate_logit, window):
    if mode not in MODES:
        raise ValueError(f"mode={mode!r}: expected one of {MODES}")
    if q.dim() != 4 or q.shape != k.shape or q.shape != v.shape:
        raise ValueError(f"q, k, v must share one (B, H, T, D) shape, got {q.shape}, {k.shape}, {v.shape}")
    if q.size(-1) > 128:
        raise ValueError(f"head size {q.size(-1)} > 128 is not supported by the fused kernel")
    if mode == "mix" and alpha is None:
        raise ValueError("mode='mix' needs alpha (a scalar or a per-head (H,) tensor)")
    if mode == "gate" and gate_logit is None:
        raise ValueError("mode='gate' needs gate_logit (a scalar or a per-head (H,) tensor)")
    for name, value in (("alpha", alpha), ("gate_logit", gate_logit)):
        if value is not None and torch.as_tensor(value).numel() not in (1, q.size(1)):
            raise ValueError(f"{name} must be a scalar or have one value per head ({q.size(1)}), "
                             f"got shape {tuple(torch.as_tensor(value).shape)}")
    if int(window) != window or window < 0:
        raise ValueError(f"window={window}: expected an integer >= 0 (0 means no band)")


def alpha_per_head(alpha, H, device, dtype):
    """alpha (a float, or a 0-dim / (H,) tensor on the device) as the kernels' (H,) buffer. A float is
    filled on the device: torch.as_tensor(float, device=cuda) copies from host memory, which waits for
    the queued work, a host sync in every layer's forward and recompute."""
    if not isinstance(alpha, torch.Tensor):
        return torch.full((H,), float(alpha), device=device, dtype=dtype)
    return alpha.to(dtype).reshape(-1).expand(H).contiguous()


def reciprocal_attention(q, k, v, mode, alpha=None, gate_logit=None, window=0, deterministic=None):
    """Causal reciprocal attention of (B, H, T, D) q, k, v; modes and window as in the module
    docstring. alpha (mix) and gate_logit (gate) are floats or 0-dim / (H,) tensors and receive
    gradients when they require them. deterministic: the backward without atomics (None: the
    module's DETERMINISTIC, or PyTorch's deterministic algorithms when they are on). Only where
    the kernels can run (why_not_fused)."""
    _check_args(q, k, v, mode, alpha, gate_logit, window)
    if not triton_available(q):
        raise RuntimeError(f"reciprocal_attention: {why_not_fused(q, k, v)}; ra_model's reciprocal_sdpa and "
                           f"reciprocal_manual are the PyTorch paths")
    if not (q.stride() == k.stride() == v.stride() and q.stride(-1) == 1):
        q, k, v = q.contiguous(), k.contiguous(), v.contiguous()
    H = q.size(1)
    acc_dtype = torch.float64 if q.dtype == torch.float64 else torch.float32
    if deterministic is None:
        deterministic = DETERMINISTIC or torch.are_deterministic_algorithms_enabled()
    alpha = alpha_per_head(alpha if mode == "mix" else 0.0, H, q.device, acc_dtype)
    outs = _fused_forward_op(q, k, v, alpha, mode, int(window), bool(deterministic))[:len(_streams(mode, window, q.size(2)))]
    if mode == "gate":
        o1, o2 = outs
        p = torch.sigmoid(_per_head(gate_logit, q)).to(q.dtype)
        return o1 + p * (o2 - o1)  # (1 - p) * o1 + p * o2
    return outs[0]
