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

The Triton path follows FlashAttention-2: the forward walks key blocks with an online softmax
(O(T) memory) and saves each row's log-sum-exp; the backward recomputes the scores from the saved
statistics. Each launch runs one stream: the reciprocal stream is the ordinary one with q and k
exchanged (R = S with q, k swapped), so `gate` runs two launches and holds one stream's
accumulators at a time. Because mix's R_ij = k_i . q_j, its score gradients reach both the row's
and the column's q and k, so the backward runs without atomics: a column kernel (one program per
key block) for dV and the column half of dK, a row kernel (one program per query block) for the
row half of dQ, and for mix a second pass of each for the reciprocal term's halves of dQ and dK
(and per-block partial sums of dalpha). Every launch writes its own buffers; the halves are added
in PyTorch, and so are the gate weights p (cheap elementwise). On RDNA3 at head size 128 each block
runs as two programs of 64 output columns that compute the scores in 64-column chunks
(head_chunk): no program holds a whole 128-column row, at the price of computing the scores twice. docs/kernels.md has each kernel's
registers, spills and shared memory on gfx1100 and sm90 (kernels/compile_check.py).

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

import torch

MODES = ("standard", "swap", "mix", "gate")

try:
    import triton
    import triton.language as tl
except ImportError:  # ra_model runs its PyTorch paths instead
    triton = None

INTERPRET = os.environ.get("TRITON_INTERPRET") == "1"  # triton.jit reads it at decoration time too


def _per_head(x, like):
    """A scalar or (H,) value as something that broadcasts against (B, H, T, D)."""
    x = torch.as_tensor(x, device=like.device)
    return x.view(1, -1, 1, 1) if x.dim() == 1 else x


# ----------------------------------------------------------------------------------------------
# Triton kernels. Each launch runs one attention stream with logits S_ij = q_i . k_j: the
# launcher passes (q, k) for the ordinary stream and (k, q) for the reciprocal one (R = S with q
# and k exchanged), so gate runs its two streams as two launches and never holds two sets of
# accumulators. Logits: MIX adds alpha * [band] k_i . q_j under the causal mask; otherwise the
# band masks (W = T: the causal mask). Softmax runs in base 2 (exp2 with log2(e) folded into the
# scale): the saved log-sum-exp is in log2 units and only the kernels read it.

# (BLOCK_M, BLOCK_N, warps, stages) lists per GPU target, head size and mode; the first of each is
# the conservative configuration. Every configuration listed compiles without register spills on
# its target (kernels/compile_check.py, docs/kernels.md, tests/test_compile_check.py). On RDNA3
# (gfx1100, wave32) registers are the limit: a WMMA operand is held twice per wave and each warp
# takes 16 rows of the output tile, so tiles are 16 x warps rows by 16-32 columns, with one stage;
# D = 128 runs as programs of 64 head columns (head_chunk), so one list serves both sizes.
# CDNA (gfx90a, gfx942 = MI300X, wave64, 512 VGPRs with the accumulation registers) holds whole rows
# at D = 128 and 64 x 64 tiles without spills (compile_check, gfx942): RDNA3's small tiles would
# leave its matrix cores idle. Those lists are compiled, not yet timed on an MI300X.
def autotune_space(target, block_d=64, mix=False):
    """(forward, column, row) kernel configurations as (BLOCK_M, BLOCK_N, warps, stages) lists for
    a target ('gfx1100', 'gfx942', 'sm90', 'sm80' ...)."""
    if is_cdna(target):
        return ([(64, 32, 4, 1), (64, 64, 4, 1), (128, 64, 4, 1)], [(32, 64, 4, 1), (64, 32, 4, 1), (64, 64, 4, 1)],
                [(64, 32, 4, 1), (32, 64, 4, 1), (64, 64, 4, 1)])
    if not target.startswith("sm"):
        col = [(16, 32, 4, 1), (16, 32, 2, 1), (16, 64, 4, 1)]
        if mix and block_d <= 64:  # mix's column kernel holds three whole key rows: the others spill 17-27 VGPRs
            col = col[:1]
        return [(32, 16, 2, 1), (64, 16, 4, 1), (64, 32, 4, 1)], col, [(32, 16, 2, 1), (64, 16, 4, 1)]
    fwd = [(32, 32, 4, 2), (64, 32, 4, 2), (64, 64, 4, 2), (128, 64, 8, 2)]
    bwd = [(32, 32, 4, 2), (64, 32, 4, 2), (32, 64, 4, 2), (64, 64, 4, 2)]
    if block_d > 64:  # 64-row backward tiles spill at 128 columns (ptxas: 8-144 bytes on sm90)
        bwd = [(32, 32, 4, 2), (32, 64, 4, 2)]
    if target == "sm80":  # its 64 x 64 tiles reach 255 registers sooner and spill 8-84 bytes
        bwd = [c for c in bwd if c[:2] != (64, 64)]
        if mix and block_d > 64:
            fwd = [c for c in fwd if c[:2] != (64, 64)]
    return fwd, bwd, bwd


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
                   DOT: tl.constexpr, VOLATILE: tl.constexpr = False):
        """Rows start .. start + BLOCK and head columns d0 .. d0 + BLOCK_C of one head of q, k, v (a
        strided view) or dO, zero outside the sequence and head. The row offset goes into the 64-bit
        base: T * stride_t may pass 2**31."""
        rows = tl.arange(0, BLOCK)
        cols = d0 + tl.arange(0, BLOCK_C)
        base = X + in_off + tl.cast(start, tl.int64) * stride_t
        mask = (start + rows[:, None] < T) & (cols[None, :] < D)
        x = tl.load(base + rows[:, None] * stride_t + cols[None, :], mask=mask, other=0.0, volatile=VOLATILE)
        return x.to(DOT)

    @triton.jit
    def _scores(A, a_off, a_stride, a_start, B, b_off, b_stride, b_start, T, D,
                BLOCK_A: tl.constexpr, BLOCK_B: tl.constexpr, BLOCK_D: tl.constexpr, BLOCK_DC: tl.constexpr,
                ACC: tl.constexpr, DOT: tl.constexpr, PRECISION: tl.constexpr):
        """Rows a_start .. of A dotted with rows b_start .. of B over the whole head, BLOCK_DC
        columns at a time, each chunk loaded here: with BLOCK_DC < BLOCK_D no program holds a
        full-width row (RDNA3 at D = 128, see head_chunk). Those loads are volatile: LLVM would
        otherwise hoist a block's own row chunks, invariant in the loop, out of it and hold whole
        rows again (mix spilled 58-102 VGPRs so); a volatile load is never hoisted, and L2 holds it."""
        s = tl.zeros([BLOCK_A, BLOCK_B], ACC)
        for d0 in tl.static_range(0, BLOCK_D, BLOCK_DC):
            a = _load_tile(A, a_off, a_start, a_stride, T, D, d0, BLOCK_A, BLOCK_DC, DOT, BLOCK_DC < BLOCK_D)
            b = _load_tile(B, b_off, b_start, b_stride, T, D, d0, BLOCK_B, BLOCK_DC, DOT, BLOCK_DC < BLOCK_D)
            s += tl.dot(a, tl.trans(b), out_dtype=ACC, input_precision=PRECISION)
        return s

    @triton.jit
    def _stream_scores(A, B, in_off, stride_t, a_start, b_start, T, D, BLOCK_A: tl.constexpr, BLOCK_B: tl.constexpr,
                       BLOCK_D: tl.constexpr, BLOCK_DC: tl.constexpr, MIX: tl.constexpr, ACC: tl.constexpr,
                       DOT: tl.constexpr, PRECISION: tl.constexpr):
        """A tile's scores, A's rows a_start .. against B's rows b_start .., and (MIX) its reciprocal
        scores, the same rows with the two tensors exchanged (else s again)."""
        s = _scores(A, in_off, stride_t, a_start, B, in_off, stride_t, b_start, T, D,
                    BLOCK_A, BLOCK_B, BLOCK_D, BLOCK_DC, ACC, DOT, PRECISION)
        r = s  # unused unless MIX
        if MIX:
            r = _scores(B, in_off, stride_t, a_start, A, in_off, stride_t, b_start, T, D,
                        BLOCK_A, BLOCK_B, BLOCK_D, BLOCK_DC, ACC, DOT, PRECISION)
        return s, r

    @triton.jit
    def _logits(s, r, alpha, i, j, T, W, qk_scale, MIX: tl.constexpr):
        """Base-2 logits of one tile from its scores s (and, MIX, the reciprocal scores r), -inf where
        masked; the band; and r inside it, which the backward needs for dalpha. Query rows x key
        columns take i, j = offs_m[:, None], offs_n[None, :]; the transposed tile (key rows) takes
        i, j = offs_m[None, :], offs_n[:, None]."""
        causal = (i >= j) & (j < T) & (i < T)
        band = causal & (i - j < W)
        allowed = band
        if MIX:
            r = tl.where(band, r, 0.0)
            s += alpha * r
            allowed = causal
        return tl.where(allowed, s * qk_scale, float("-inf")), band, r

    @triton.jit
    def _row_stats(L, Delta, bh, start_m, T, BLOCK_M: tl.constexpr):
        """A query block's log-sum-exp and Delta = rowsum(dO * O)."""
        offs_m = start_m + tl.arange(0, BLOCK_M)
        lse = tl.load(L + bh * T + offs_m, mask=offs_m < T, other=0.0)
        delta = tl.load(Delta + bh * T + offs_m, mask=offs_m < T, other=0.0)
        return lse, delta

    @triton.jit
    def _store_tile(X, bh, offs, d0, x, T, D, BLOCK_DC: tl.constexpr):
        offs_d = d0 + tl.arange(0, BLOCK_DC)
        mask = (offs[:, None] < T) & (offs_d[None, :] < D)
        tl.store(X + bh * T * D + offs[:, None] * D + offs_d[None, :], x, mask=mask)

    # Every kernel: program ids (batch x head, block of rows, chunk of head columns). A program
    # accumulates BLOCK_DC of the output's head columns (d0 ..) and computes the scores over the
    # whole head; with BLOCK_DC < BLOCK_D the programs of one block recompute the same scores.

    @triton.jit
    def _ra_fwd_kernel(Q, K, V, Alpha, O, L,
                       stride_b, stride_h, stride_t, H, T, D, W, scale, T_BUCKET,
                       MIX: tl.constexpr, ACC: tl.constexpr, DOT: tl.constexpr, PRECISION: tl.constexpr,
                       BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_D: tl.constexpr, BLOCK_DC: tl.constexpr):
        bh = tl.program_id(0).to(tl.int64)  # B * H on axis 0 (axis 1 allows 65,535 programs only)
        start_m = (tl.num_programs(1) - 1 - tl.program_id(1)) * BLOCK_M  # the longest rows first
        d0 = tl.program_id(2) * BLOCK_DC
        in_off = (bh // H) * stride_b + (bh % H) * stride_h  # q, k, v may be strided views
        qk_scale = scale * 1.4426950408889634  # log2(e)
        alpha = 0.0
        if MIX:
            alpha = tl.load(Alpha + bh % H).to(ACC)

        offs_m = start_m + tl.arange(0, BLOCK_M)
        m = tl.full([BLOCK_M], float("-inf"), ACC)
        l = tl.zeros([BLOCK_M], ACC)
        acc = tl.zeros([BLOCK_M, BLOCK_DC], ACC)

        hi = tl.minimum(start_m + BLOCK_M, T)  # causal: no key beyond this block's last row
        lo = 0
        if not MIX:  # key blocks entirely left of the band are skipped (W = T: none)
            lo = tl.maximum(start_m - W + 1, 0) // BLOCK_N * BLOCK_N
        for start_n in range(lo, hi, BLOCK_N):
            offs_n = start_n + tl.arange(0, BLOCK_N)
            s, r = _stream_scores(Q, K, in_off, stride_t, start_m, start_n, T, D, BLOCK_M, BLOCK_N, BLOCK_D, BLOCK_DC,
                                  MIX, ACC, DOT, PRECISION)  # q_i . k_j and k_i . q_j
            x, band, r = _logits(s, r, alpha, offs_m[:, None], offs_n[None, :], T, W, qk_scale, MIX)
            v_j = _load_tile(V, in_off, start_n, stride_t, T, D, d0, BLOCK_N, BLOCK_DC, DOT)
            m_new = tl.maximum(m, tl.max(x, 1))
            m_safe = tl.where(m_new == float("-inf"), 0.0, m_new)  # a fully masked row stays 0, not NaN
            p = tl.exp2(x - m_safe[:, None])
            corr = tl.exp2(m - m_safe)
            l = l * corr + tl.sum(p, 1)
            acc = acc * corr[:, None] + tl.dot(p.to(DOT), v_j, out_dtype=ACC, input_precision=PRECISION)
            m = m_new
        l_safe = tl.where(l == 0.0, 1.0, l)
        _store_tile(O, bh, offs_m, d0, (acc / l_safe[:, None]).to(O.dtype.element_ty), T, D, BLOCK_DC)  # contiguous
        tl.store(L + bh * T + offs_m, m + tl.log2(l_safe), mask=(offs_m < T) & (d0 == 0))

    @triton.jit
    def _ra_bwd_col_kernel(Q, K, V, Alpha, DO, L, Delta, DK, DV, DQ, DAlpha,
                           stride_b, stride_h, stride_t, H, T, D, W, scale, T_BUCKET, n_partials,
                           MIX: tl.constexpr, RECIP: tl.constexpr, ACC: tl.constexpr, DOT: tl.constexpr, PRECISION: tl.constexpr,
                           BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_D: tl.constexpr, BLOCK_DC: tl.constexpr):
        """Per key block j: dV_j and the column half of dK_j (from S_ij); or, RECIP (MIX only), the
        column half of dQ_j (from alpha R_ij) and a partial sum of dalpha."""
        bh = tl.program_id(0).to(tl.int64)
        pid = tl.program_id(1)
        start_n = pid * BLOCK_N  # the longest columns (from the left) come first already
        d0 = tl.program_id(2) * BLOCK_DC
        in_off = (bh // H) * stride_b + (bh % H) * stride_h
        do_off = bh * T * D  # dO is contiguous
        qk_scale = scale * 1.4426950408889634
        alpha = 0.0
        if MIX:
            alpha = tl.load(Alpha + bh % H).to(ACC)

        offs_n = start_n + tl.arange(0, BLOCK_N)
        dv = tl.zeros([BLOCK_N, BLOCK_DC], ACC)
        dk = tl.zeros([BLOCK_N, BLOCK_DC], ACC)
        dq = tl.zeros([BLOCK_N, BLOCK_DC], ACC)
        dalpha = tl.zeros([BLOCK_N], ACC)

        lo = start_n // BLOCK_M * BLOCK_M  # causal: rows i >= j only
        hi = T
        if not MIX:  # rows beyond the band of this key block are skipped (W = T: none)
            hi = tl.minimum(start_n + BLOCK_N + W - 1, T)
        for start_m in range(lo, hi, BLOCK_M):
            offs_m = start_m + tl.arange(0, BLOCK_M)
            # the transposed tile (key rows): dV, dK and dQ then need no transposed operand
            st, rt = _stream_scores(K, Q, in_off, stride_t, start_n, start_m, T, D, BLOCK_N, BLOCK_M, BLOCK_D,
                                    BLOCK_DC, MIX, ACC, DOT, PRECISION)  # k_j . q_i and q_j . k_i
            xt, band_t, rt = _logits(st, rt, alpha, offs_m[None, :], offs_n[:, None], T, W, qk_scale, MIX)
            lse, delta = _row_stats(L, Delta, bh, start_m, T, BLOCK_M)
            pt = tl.exp2(xt - lse[None, :])  # masked logits are -inf: P = 0 there
            dpt = _scores(V, in_off, stride_t, start_n, DO, do_off, D, start_m, T, D,
                          BLOCK_N, BLOCK_M, BLOCK_D, BLOCK_DC, ACC, DOT, PRECISION)  # v_j . dO_i
            gt = pt * (dpt - delta[None, :])
            if not RECIP:
                do = _load_tile(DO, do_off, start_m, D, T, D, d0, BLOCK_M, BLOCK_DC, DOT)
                dv += tl.dot(pt.to(DOT), do, out_dtype=ACC, input_precision=PRECISION)
                q_i = _load_tile(Q, in_off, start_m, stride_t, T, D, d0, BLOCK_M, BLOCK_DC, DOT)
                dk += tl.dot(gt.to(DOT), q_i, out_dtype=ACC, input_precision=PRECISION)  # S_ij = q_i . k_j
            else:
                gbt = tl.where(band_t, gt, 0.0)
                k_i = _load_tile(K, in_off, start_m, stride_t, T, D, d0, BLOCK_M, BLOCK_DC, DOT)
                dq += tl.dot(gbt.to(DOT), k_i, out_dtype=ACC, input_precision=PRECISION)  # R_ij = k_i . q_j
                dalpha += tl.sum(gt * rt, 1)
        if not RECIP:
            _store_tile(DV, bh, offs_n, d0, dv, T, D, BLOCK_DC)
            _store_tile(DK, bh, offs_n, d0, dk * scale, T, D, BLOCK_DC)
        else:
            _store_tile(DQ, bh, offs_n, d0, dq * (alpha * scale), T, D, BLOCK_DC)
            if d0 == 0:  # every column chunk computed the same sum
                tl.store(DAlpha + bh * n_partials + pid, tl.sum(dalpha, 0) * scale)

    @triton.jit
    def _ra_bwd_row_kernel(Q, K, V, Alpha, DO, L, Delta, DQ, DK,
                           stride_b, stride_h, stride_t, H, T, D, W, scale, T_BUCKET,
                           MIX: tl.constexpr, RECIP: tl.constexpr, ACC: tl.constexpr, DOT: tl.constexpr, PRECISION: tl.constexpr,
                           BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_D: tl.constexpr, BLOCK_DC: tl.constexpr):
        """Per query block i: the row half of dQ_i (from S_ij); or, RECIP (MIX only), of dK_i (from
        alpha R_ij). Written to their own buffers: the launcher adds the column kernel's halves."""
        bh = tl.program_id(0).to(tl.int64)
        start_m = (tl.num_programs(1) - 1 - tl.program_id(1)) * BLOCK_M  # the longest rows first
        d0 = tl.program_id(2) * BLOCK_DC
        in_off = (bh // H) * stride_b + (bh % H) * stride_h
        do_off = bh * T * D
        qk_scale = scale * 1.4426950408889634
        alpha = 0.0
        if MIX:
            alpha = tl.load(Alpha + bh % H).to(ACC)

        offs_m = start_m + tl.arange(0, BLOCK_M)
        lse, delta = _row_stats(L, Delta, bh, start_m, T, BLOCK_M)
        dq = tl.zeros([BLOCK_M, BLOCK_DC], ACC)
        dk = tl.zeros([BLOCK_M, BLOCK_DC], ACC)

        hi = tl.minimum(start_m + BLOCK_M, T)
        lo = 0
        if not MIX:
            lo = tl.maximum(start_m - W + 1, 0) // BLOCK_N * BLOCK_N
        for start_n in range(lo, hi, BLOCK_N):
            offs_n = start_n + tl.arange(0, BLOCK_N)
            s, r = _stream_scores(Q, K, in_off, stride_t, start_m, start_n, T, D, BLOCK_M, BLOCK_N, BLOCK_D, BLOCK_DC,
                                  MIX, ACC, DOT, PRECISION)  # q_i . k_j and k_i . q_j
            x, band, r = _logits(s, r, alpha, offs_m[:, None], offs_n[None, :], T, W, qk_scale, MIX)
            p = tl.exp2(x - lse[:, None])  # masked logits are -inf: P = 0 there
            dp = _scores(DO, do_off, D, start_m, V, in_off, stride_t, start_n, T, D,
                         BLOCK_M, BLOCK_N, BLOCK_D, BLOCK_DC, ACC, DOT, PRECISION)  # dO_i . v_j
            g = p * (dp - delta[:, None])
            if not RECIP:
                k_j = _load_tile(K, in_off, start_n, stride_t, T, D, d0, BLOCK_N, BLOCK_DC, DOT)
                dq += tl.dot(g.to(DOT), k_j, out_dtype=ACC, input_precision=PRECISION)  # S_ij = q_i . k_j
            else:
                gb = tl.where(band, g, 0.0)
                q_j = _load_tile(Q, in_off, start_n, stride_t, T, D, d0, BLOCK_N, BLOCK_DC, DOT)
                dk += tl.dot(gb.to(DOT), q_j, out_dtype=ACC, input_precision=PRECISION)  # R_ij = k_i . q_j
        if not RECIP:
            _store_tile(DQ, bh, offs_m, d0, dq * scale, T, D, BLOCK_DC)
        else:
            _store_tile(DK, bh, offs_m, d0, dk * (alpha * scale), T, D, BLOCK_DC)

    # Autotuning runs on GPUs only (the interpreter has no benchmarker).
    def _quad(config):
        return config.kwargs["BLOCK_M"], config.kwargs["BLOCK_N"], config.num_warps, config.num_stages

    def _tuned(kernel, index, key, **options):
        """The kernel autotuned over the list of the launch's GPU, head size and mode (the launch
        runs under its device; BLOCK_D and MIX are in the key)."""
        targets, sizes = ("gfx1100", "gfx942", "sm80", "sm90"), (16, 32, 64, 128)
        quads = dict.fromkeys(q for t in targets for d in sizes for mix in (False, True)
                              for q in autotune_space(t, d, mix)[index])
        configs = [triton.Config({"BLOCK_M": m, "BLOCK_N": n}, num_warps=w, num_stages=st) for m, n, w, st in quads]
        listed = lambda configs, named_args, **meta: [
            c for c in configs
            if _quad(c) in autotune_space(gpu_target(torch.cuda.current_device()), meta["BLOCK_D"], meta["MIX"])[index]]
        return triton.autotune(configs, key=key, prune_configs_by={"early_config_prune": listed}, **options)(kernel)

    # T by its power-of-two bucket: generate() and evaluation batches change T call after call
    _KEY = ["T_BUCKET", "BLOCK_D", "MIX", "DOT", "PRECISION"]
    _BWD_KEY = _KEY + ["RECIP"]
    _fwd_tuned = _tuned(_ra_fwd_kernel, 0, _KEY)
    # each key block writes one dAlpha partial: the slots a wider BLOCK_N leaves out must read zero
    _bwd_col_tuned = _tuned(_ra_bwd_col_kernel, 1, _BWD_KEY, reset_to_zero=["DAlpha"])
    _bwd_row_tuned = _tuned(_ra_bwd_row_kernel, 2, _BWD_KEY)

# (BLOCK_M, BLOCK_N) under the interpreter: small, so tiny test shapes span several blocks
INTERPRET_TILE = (16, 16)
INTERPRET_HEAD_CHUNK = 128  # the interpreter's BLOCK_DC at most (tests lower it to split small heads)


def head_chunk(block_d, target):
    """BLOCK_DC, the head columns a program accumulates and loads at a time. RDNA3 holds a 16-row
    WMMA operand of 128 columns in 64 VGPRs per lane (twice per wave), so at D = 128 a backward
    program holding whole rows spills whatever its tile; there each program keeps 64 columns of
    the output and computes the scores in 64-column chunks (two programs per block, the scores
    computed twice). NVIDIA and CDNA (MI300X) keep whole rows: spill-free at 128 without the
    recomputation."""
    return min(block_d, 64) if target.startswith("gfx") and not is_cdna(target) else block_d


_MIN_BLOCK_N = 16  # the smallest BLOCK_N of any config: sizes the dalpha partial-sum buffer


def _launch(kernel, tuned, block, q, args, meta):
    """Runs the autotuned kernel on q's GPU, or the plain one with INTERPRET_TILE under the
    interpreter; one program per (batch x head, block of `block` rows, chunk of head columns)."""
    B, H, T = q.shape[:3]
    chunks = meta["BLOCK_D"] // meta["BLOCK_DC"]
    if INTERPRET:
        tile = dict(zip(("BLOCK_M", "BLOCK_N"), INTERPRET_TILE))
        kernel[(B * H, triton.cdiv(T, tile[block]), chunks)](*args, **meta, **tile)
    else:
        with torch.cuda.device(q.device):
            tuned[lambda cfg: (B * H, triton.cdiv(T, cfg[block]), chunks)](*args, **meta)


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
    return dict(H=H, T=T, D=D, W=W, scale=1.0 / math.sqrt(D), T_BUCKET=triton.next_power_of_2(T), MIX=mix,
                ACC=acc, DOT=dot, PRECISION="tf32" if tf32 else "ieee", BLOCK_D=block_d,
                BLOCK_DC=min(block_d, INTERPRET_HEAD_CHUNK) if INTERPRET else head_chunk(block_d, gpu_target(q.device)))


def _strides(q):
    return q.stride(0), q.stride(1), q.stride(2)


def _forward_stream(q, k, v, alpha, W, mix):
    """One stream's output and its rows' log-sum-exp (log2 units)."""
    B, H, T, D = q.shape
    o = torch.empty_like(q, memory_format=torch.contiguous_format)
    lse = torch.empty(B * H, T, device=q.device, dtype=torch.float64 if q.dtype == torch.float64 else torch.float32)
    _launch(_ra_fwd_kernel, _fwd_tuned, "BLOCK_M", q, (q, k, v, alpha, o, lse) + _strides(q), _meta(q, W, mix))
    return o, lse


def _backward_stream(q, k, v, alpha, o, lse, do, W, mix):
    """(dq, dk, dv, dalpha or None) of one stream: the column kernel's halves plus the row kernel's.
    MIX runs each kernel twice, the second time (RECIP) for the reciprocal term's gradients, so
    that no launch holds more than two accumulators."""
    B, H, T, D = q.shape
    meta = _meta(q, W, mix)
    do = do.contiguous()
    delta = (do.to(lse.dtype) * o.to(lse.dtype)).sum(-1).view(B * H, T)  # rowsum(dO * O)
    new = lambda: torch.empty(q.shape, device=q.device, dtype=lse.dtype)
    dv, dk_col, dq_row = new(), new(), new()
    n_partials = triton.cdiv(T, _MIN_BLOCK_N)
    dalpha = torch.zeros(B * H, n_partials, device=q.device, dtype=lse.dtype)
    common = (q, k, v, alpha, do, lse, delta)

    def run(recip, dq_col, dk_row):
        _launch(_ra_bwd_col_kernel, _bwd_col_tuned, "BLOCK_N", q, common + (dk_col, dv, dq_col, dalpha) + _strides(q),
                dict(meta, n_partials=n_partials, RECIP=recip))
        _launch(_ra_bwd_row_kernel, _bwd_row_tuned, "BLOCK_M", q, common + (dq_row, dk_row) + _strides(q),
                dict(meta, RECIP=recip))

    run(False, dv, dv)  # the RECIP outputs' slots are never written here
    if not mix:
        return dq_row, dk_col, dv, None
    dq_col, dk_row = new(), new()
    run(True, dq_col, dk_row)
    return dq_row + dq_col, dk_col + dk_row, dv, dalpha.view(B, H, n_partials).sum((0, 2))


class _RAFunction(torch.autograd.Function):
    """The fused kernels as one autograd op: returns the output of each stream of the mode."""

    @staticmethod
    def forward(ctx, q, k, v, alpha, mode, window):
        ctx.streams = _streams(mode, window, q.size(2))
        outs, lses = zip(*(_forward_stream(*((k, q) if swapped else (q, k)), v, alpha, W, mix)
                           for swapped, W, mix in ctx.streams))
        ctx.save_for_backward(q, k, v, alpha, *outs, *lses)
        ctx.set_materialize_grads(False)
        return outs

    @staticmethod
    def backward(ctx, *douts):
        q, k, v, alpha, *saved = ctx.saved_tensors
        n = len(ctx.streams)
        dq = dk = dv = dalpha = None
        add = lambda total, x: x if total is None else total + x
        for (swapped, W, mix), o, lse, do in zip(ctx.streams, saved[:n], saved[n:], douts):
            if do is None:
                continue
            dqs, dks, dvs, dalphas = _backward_stream(*((k, q) if swapped else (q, k)), v, alpha, o, lse, do, W, mix)
            if swapped:  # the stream's query was k
                dqs, dks = dks, dqs
            dq, dk, dv = add(dq, dqs), add(dk, dks), add(dv, dvs)
            dalpha = dalphas if mix else dalpha
        cast = lambda g, like: None if g is None else g.to(like.dtype)
        return cast(dq, q), cast(dk, k), cast(dv, v), cast(dalpha, alpha), None, None


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


@torch.compiler.disable  # a graph break: dynamo need not trace autotuned Triton launches
def _fused(q, k, v, alpha, mode, window):
    return _RAFunction.apply(q, k, v, alpha, mode, window)


def reciprocal_attention(q, k, v, mode, alpha=None, gate_logit=None, window=0):
    """Causal reciprocal attention of (B, H, T, D) q, k, v; modes and window as in the module
    docstring. alpha (mix) and gate_logit (gate) are floats or 0-dim / (H,) tensors and receive
    gradients when they require them. Only where the kernels can run (why_not_fused)."""
    _check_args(q, k, v, mode, alpha, gate_logit, window)
    if not triton_available(q):
        raise RuntimeError(f"reciprocal_attention: {why_not_fused(q, k, v)}; ra_model's reciprocal_sdpa and "
                           f"reciprocal_manual are the PyTorch paths")
    if not (q.stride() == k.stride() == v.stride() and q.stride(-1) == 1):
        q, k, v = q.contiguous(), k.contiguous(), v.contiguous()
    H = q.size(1)
    acc_dtype = torch.float64 if q.dtype == torch.float64 else torch.float32
    outs = _fused(q, k, v, alpha_per_head(alpha if mode == "mix" else 0.0, H, q.device, acc_dtype), mode, int(window))
    if mode == "gate":
        o1, o2 = outs
        p = torch.sigmoid(_per_head(gate_logit, q)).to(q.dtype)
        return o1 + p * (o2 - o1)  # (1 - p) * o1 + p * o2
    return outs[0]
