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
(O(T) memory) and saves each row's log-sum-exp; `gate` keeps two online-softmax accumulators
(S and R) in the same pass over the key blocks. The backward recomputes the scores from the
saved statistics. Because R_ij = k_i . q_j, the gradient of a score reaches both the row's and
the column's q and k, so the backward runs two kernels without atomics: a column kernel (one
program per key block) accumulating dV and the column halves of dK, dQ (and per-block partial
sums of dalpha), then a row kernel (one program per query block) adding the row halves. The
gate weights p are applied in PyTorch to the two branch outputs (cheap elementwise), so the
kernels only see attention streams.

The kernels run when Triton is importable and the inputs are on a GPU (CUDA or ROCm), or under
TRITON_INTERPRET=1 (then on CPU tensors, slowly: that is how the tests prove them right).
`why_not_fused` is the one place that decides it: ra_model asks it and otherwise runs its PyTorch
SDPA path, and `reciprocal_attention` refuses to run without the kernels. The PyTorch reference of
every mode, which materializes the T x T scores, is ra_model.reciprocal_manual (the tests check
the kernels against it in float64).

Dtypes: float32, float16, bfloat16 (accumulation in float32) and float64 (float64 accumulation;
meant for gradcheck under the interpreter). On NVIDIA GPUs float32 inputs use TF32 in tl.dot,
Triton's default. Head sizes up to 128 (padded to a power of two, at least 16); any T >= 1.
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
# Triton kernels. Streams: stream 1 has logits S (+ alpha [band] R for mix) under the causal
# mask, stream 2 has logits R under the band. standard and mix use stream 1, swap stream 2,
# gate both. Softmax runs in base 2 (exp2 with log2(e) folded into the scale): the saved
# log-sum-exp is in log2 units and only the kernels read it.

# (32, 32, 4 warps, 2 stages) is the conservative configuration every list keeps. On RDNA3
# (gfx1100, wave32) register pressure is the limit. Compiled offline for gfx1100 with triton 3.8
# (kernels/compile_check.py; D = 64, bf16, mix and gate): 64-wide tiles spill 500-2200 VGPRs
# against 90-900 for 32 x 32; 8 warps halve the spills of the row kernel, and 1 stage halves
# them again there; num_stages=1 crashes the compiler (segfault) on the column kernel.
def autotune_space(hip):
    """(forward, column, row) kernel configurations as (BLOCK_M, BLOCK_N, warps, stages) lists."""
    if hip:
        return ([(32, 32, 4, 2), (32, 32, 8, 2), (64, 32, 4, 2)],
                [(32, 32, 4, 2), (32, 32, 8, 2)],
                [(32, 32, 4, 2), (32, 32, 8, 2), (32, 32, 8, 1)])
    bwd = [(32, 32, 4, 2), (64, 32, 4, 2), (32, 64, 4, 2), (64, 64, 4, 2)]
    return [(32, 32, 4, 2), (64, 32, 4, 2), (64, 64, 4, 2), (128, 64, 8, 2)], bwd, bwd


if triton is not None:

    @triton.jit
    def _online_update(x, v, m, l, acc, DOT: tl.constexpr, ACC: tl.constexpr):
        """One key block of the online softmax: rescale the running sums to the new row max."""
        m_new = tl.maximum(m, tl.max(x, 1))
        m_safe = tl.where(m_new == float("-inf"), 0.0, m_new)  # a fully masked row stays 0, not NaN
        p = tl.exp2(x - m_safe[:, None])
        corr = tl.exp2(m - m_safe)
        l = l * corr + tl.sum(p, 1)
        acc = acc * corr[:, None] + tl.dot(p.to(DOT), v, out_dtype=ACC)
        return m_new, l, acc

    @triton.jit
    def _store_stream(O, L, acc, m, l, out_off, bh, offs_m, offs_d, T, D):
        l_safe = tl.where(l == 0.0, 1.0, l)
        o = acc / l_safe[:, None]
        mask = (offs_m[:, None] < T) & (offs_d[None, :] < D)
        tl.store(O + out_off + offs_m[:, None] * D + offs_d[None, :], o.to(O.dtype.element_ty), mask=mask)
        tl.store(L + bh * T + offs_m, m + tl.log2(l_safe), mask=offs_m < T)

    @triton.jit
    def _load_tile(X, in_off, offs_t, offs_d, stride_t, T, D, DOT: tl.constexpr):
        """Rows offs_t of one head of q, k or v (a strided view); zero outside the sequence and head."""
        mask = (offs_t[:, None] < T) & (offs_d[None, :] < D)
        return tl.load(X + in_off + offs_t[:, None] * stride_t + offs_d[None, :], mask=mask, other=0.0).to(DOT)

    @triton.jit
    def _allowed(offs_m, offs_n, T, W):
        """Query rows x key columns: the causal set (j <= i, both in the sequence) and its band i - j < W."""
        causal = (offs_m[:, None] >= offs_n[None, :]) & (offs_n[None, :] < T) & (offs_m[:, None] < T)
        return causal, causal & (offs_m[:, None] - offs_n[None, :] < W)

    @triton.jit
    def _ra_fwd_kernel(Q, K, V, Alpha, O1, O2, L1, L2,
                       stride_b, stride_h, stride_t, H, T, D, W, scale,
                       HAS1: tl.constexpr, MIX: tl.constexpr, HAS2: tl.constexpr,
                       ACC: tl.constexpr, DOT: tl.constexpr,
                       BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_D: tl.constexpr):
        start_m = tl.program_id(0) * BLOCK_M
        bh = tl.program_id(1).to(tl.int64)  # 64-bit offsets: B * H * T * D may pass 2**31
        in_off = (bh // H) * stride_b + (bh % H) * stride_h  # q, k, v may be strided views
        out_off = bh * T * D  # outputs are contiguous
        qk_scale = scale * 1.4426950408889634  # log2(e)
        alpha = tl.load(Alpha + bh % H).to(ACC)

        offs_m = start_m + tl.arange(0, BLOCK_M)
        offs_d = tl.arange(0, BLOCK_D)
        q_i = _load_tile(Q, in_off, offs_m, offs_d, stride_t, T, D, DOT)
        k_i = _load_tile(K, in_off, offs_m, offs_d, stride_t, T, D, DOT)

        m1 = tl.full([BLOCK_M], float("-inf"), ACC)
        l1 = tl.zeros([BLOCK_M], ACC)
        acc1 = tl.zeros([BLOCK_M, BLOCK_D], ACC)
        m2 = tl.full([BLOCK_M], float("-inf"), ACC)
        l2 = tl.zeros([BLOCK_M], ACC)
        acc2 = tl.zeros([BLOCK_M, BLOCK_D], ACC)

        hi = tl.minimum(start_m + BLOCK_M, T)  # causal: no key beyond this block's last row
        lo = 0
        if not HAS1:  # swap alone: key blocks entirely left of the band are skipped
            lo = tl.maximum(start_m - W + 1, 0) // BLOCK_N * BLOCK_N
        for start_n in range(lo, hi, BLOCK_N):
            offs_n = start_n + tl.arange(0, BLOCK_N)
            k_j = _load_tile(K, in_off, offs_n, offs_d, stride_t, T, D, DOT)
            q_j = _load_tile(Q, in_off, offs_n, offs_d, stride_t, T, D, DOT)
            v_j = _load_tile(V, in_off, offs_n, offs_d, stride_t, T, D, DOT)
            causal, band = _allowed(offs_m, offs_n, T, W)
            if HAS1:
                s = tl.dot(q_i, tl.trans(k_j), out_dtype=ACC)
                if MIX:
                    r = tl.dot(k_i, tl.trans(q_j), out_dtype=ACC)
                    s += alpha * tl.where(band, r, 0.0)
                x = tl.where(causal, s * qk_scale, float("-inf"))
                m1, l1, acc1 = _online_update(x, v_j, m1, l1, acc1, DOT, ACC)
            if HAS2:
                r2 = tl.dot(k_i, tl.trans(q_j), out_dtype=ACC)
                x2 = tl.where(band, r2 * qk_scale, float("-inf"))
                m2, l2, acc2 = _online_update(x2, v_j, m2, l2, acc2, DOT, ACC)
        if HAS1:
            _store_stream(O1, L1, acc1, m1, l1, out_off, bh, offs_m, offs_d, T, D)
        if HAS2:
            _store_stream(O2, L2, acc2, m2, l2, out_off, bh, offs_m, offs_d, T, D)

    @triton.jit
    def _load_rows(DO, L, Delta, out_off, bh, offs_m, offs_d, T, D, DOT: tl.constexpr):
        """A query block's output gradient, log-sum-exp and Delta = rowsum(dO * O)."""
        mask = (offs_m[:, None] < T) & (offs_d[None, :] < D)
        do = tl.load(DO + out_off + offs_m[:, None] * D + offs_d[None, :], mask=mask, other=0.0).to(DOT)
        lse = tl.load(L + bh * T + offs_m, mask=offs_m < T, other=0.0)
        delta = tl.load(Delta + bh * T + offs_m, mask=offs_m < T, other=0.0)
        return do, lse, delta

    @triton.jit
    def _score_grad(x, lse, delta, allowed, do, v_j, DOT: tl.constexpr, ACC: tl.constexpr):
        """Recomputed probabilities P and G = dLoss/dlogits = P * (dO.v_j - Delta)."""
        p = tl.where(allowed, tl.exp2(x - lse[:, None]), 0.0)
        dp = tl.dot(do, tl.trans(v_j), out_dtype=ACC)
        return p, p * (dp - delta[:, None])

    @triton.jit
    def _ra_bwd_col_kernel(Q, K, V, Alpha, DO1, DO2, L1, L2, Delta1, Delta2, DQ, DK, DV, DAlpha,
                           stride_b, stride_h, stride_t, H, T, D, W, scale, n_partials,
                           HAS1: tl.constexpr, MIX: tl.constexpr, HAS2: tl.constexpr,
                           ACC: tl.constexpr, DOT: tl.constexpr,
                           BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_D: tl.constexpr):
        """Per key block j: dV_j, and the halves of dK_j (from S_ij) and dQ_j (from R_ij)."""
        pid = tl.program_id(0)
        start_n = pid * BLOCK_N
        bh = tl.program_id(1).to(tl.int64)  # 64-bit offsets: B * H * T * D may pass 2**31
        in_off = (bh // H) * stride_b + (bh % H) * stride_h
        out_off = bh * T * D
        qk_scale = scale * 1.4426950408889634
        alpha = tl.load(Alpha + bh % H).to(ACC)

        offs_n = start_n + tl.arange(0, BLOCK_N)
        offs_d = tl.arange(0, BLOCK_D)
        k_j = _load_tile(K, in_off, offs_n, offs_d, stride_t, T, D, DOT)
        q_j = _load_tile(Q, in_off, offs_n, offs_d, stride_t, T, D, DOT)
        v_j = _load_tile(V, in_off, offs_n, offs_d, stride_t, T, D, DOT)
        dv = tl.zeros([BLOCK_N, BLOCK_D], ACC)
        dk = tl.zeros([BLOCK_N, BLOCK_D], ACC)
        dq = tl.zeros([BLOCK_N, BLOCK_D], ACC)
        dalpha = tl.zeros([BLOCK_N], ACC)

        lo = start_n // BLOCK_M * BLOCK_M  # causal: rows i >= j only
        hi = T
        if not HAS1:  # swap alone: rows beyond the band of this key block are skipped
            hi = tl.minimum(start_n + BLOCK_N + W - 1, T)
        for start_m in range(lo, hi, BLOCK_M):
            offs_m = start_m + tl.arange(0, BLOCK_M)
            q_i = _load_tile(Q, in_off, offs_m, offs_d, stride_t, T, D, DOT)
            k_i = _load_tile(K, in_off, offs_m, offs_d, stride_t, T, D, DOT)
            causal, band = _allowed(offs_m, offs_n, T, W)
            if HAS1:
                do, lse, delta = _load_rows(DO1, L1, Delta1, out_off, bh, offs_m, offs_d, T, D, DOT)
                s = tl.dot(q_i, tl.trans(k_j), out_dtype=ACC)
                if MIX:
                    r = tl.where(band, tl.dot(k_i, tl.trans(q_j), out_dtype=ACC), 0.0)
                    s += alpha * r
                p, g = _score_grad(s * qk_scale, lse, delta, causal, do, v_j, DOT, ACC)
                dv += tl.dot(tl.trans(p.to(DOT)), do, out_dtype=ACC)
                dk += tl.dot(tl.trans(g.to(DOT)), q_i, out_dtype=ACC)  # S_ij = q_i . k_j
                if MIX:
                    gb = tl.where(band, g, 0.0)
                    dq += alpha * tl.dot(tl.trans(gb.to(DOT)), k_i, out_dtype=ACC)  # R_ij = k_i . q_j
                    dalpha += tl.sum(gb * r, 0)
            if HAS2:
                do2, lse2, delta2 = _load_rows(DO2, L2, Delta2, out_off, bh, offs_m, offs_d, T, D, DOT)
                r2 = tl.dot(k_i, tl.trans(q_j), out_dtype=ACC)
                p2, g2 = _score_grad(r2 * qk_scale, lse2, delta2, band, do2, v_j, DOT, ACC)
                dv += tl.dot(tl.trans(p2.to(DOT)), do2, out_dtype=ACC)
                dq += tl.dot(tl.trans(g2.to(DOT)), k_i, out_dtype=ACC)
        out_tile = out_off + offs_n[:, None] * D + offs_d[None, :]
        mask_nd = (offs_n[:, None] < T) & (offs_d[None, :] < D)
        tl.store(DV + out_tile, dv, mask=mask_nd)
        tl.store(DK + out_tile, dk * scale, mask=mask_nd)
        tl.store(DQ + out_tile, dq * scale, mask=mask_nd)
        if MIX:
            tl.store(DAlpha + bh * n_partials + pid, tl.sum(dalpha, 0) * scale)

    @triton.jit
    def _ra_bwd_row_kernel(Q, K, V, Alpha, DO1, DO2, L1, L2, Delta1, Delta2, DQ, DK,
                           stride_b, stride_h, stride_t, H, T, D, W, scale,
                           HAS1: tl.constexpr, MIX: tl.constexpr, HAS2: tl.constexpr,
                           ACC: tl.constexpr, DOT: tl.constexpr,
                           BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_D: tl.constexpr):
        """Per query block i: adds the halves of dQ_i (from S_ij) and dK_i (from R_ij)."""
        start_m = tl.program_id(0) * BLOCK_M
        bh = tl.program_id(1).to(tl.int64)  # 64-bit offsets: B * H * T * D may pass 2**31
        in_off = (bh // H) * stride_b + (bh % H) * stride_h
        out_off = bh * T * D
        qk_scale = scale * 1.4426950408889634
        alpha = tl.load(Alpha + bh % H).to(ACC)

        offs_m = start_m + tl.arange(0, BLOCK_M)
        offs_d = tl.arange(0, BLOCK_D)
        q_i = _load_tile(Q, in_off, offs_m, offs_d, stride_t, T, D, DOT)
        k_i = _load_tile(K, in_off, offs_m, offs_d, stride_t, T, D, DOT)
        if HAS1:
            do, lse, delta = _load_rows(DO1, L1, Delta1, out_off, bh, offs_m, offs_d, T, D, DOT)
        if HAS2:
            do2, lse2, delta2 = _load_rows(DO2, L2, Delta2, out_off, bh, offs_m, offs_d, T, D, DOT)
        dq = tl.zeros([BLOCK_M, BLOCK_D], ACC)
        dk = tl.zeros([BLOCK_M, BLOCK_D], ACC)

        hi = tl.minimum(start_m + BLOCK_M, T)
        lo = 0
        if not HAS1:
            lo = tl.maximum(start_m - W + 1, 0) // BLOCK_N * BLOCK_N
        for start_n in range(lo, hi, BLOCK_N):
            offs_n = start_n + tl.arange(0, BLOCK_N)
            k_j = _load_tile(K, in_off, offs_n, offs_d, stride_t, T, D, DOT)
            q_j = _load_tile(Q, in_off, offs_n, offs_d, stride_t, T, D, DOT)
            v_j = _load_tile(V, in_off, offs_n, offs_d, stride_t, T, D, DOT)
            causal, band = _allowed(offs_m, offs_n, T, W)
            if HAS1:
                s = tl.dot(q_i, tl.trans(k_j), out_dtype=ACC)
                if MIX:
                    s += alpha * tl.where(band, tl.dot(k_i, tl.trans(q_j), out_dtype=ACC), 0.0)
                p, g = _score_grad(s * qk_scale, lse, delta, causal, do, v_j, DOT, ACC)
                dq += tl.dot(g.to(DOT), k_j, out_dtype=ACC)  # S_ij = q_i . k_j
                if MIX:
                    gb = tl.where(band, g, 0.0)
                    dk += alpha * tl.dot(gb.to(DOT), q_j, out_dtype=ACC)  # R_ij = k_i . q_j
            if HAS2:
                r2 = tl.dot(k_i, tl.trans(q_j), out_dtype=ACC)
                p2, g2 = _score_grad(r2 * qk_scale, lse2, delta2, band, do2, v_j, DOT, ACC)
                dk += tl.dot(g2.to(DOT), q_j, out_dtype=ACC)
        out_tile = out_off + offs_m[:, None] * D + offs_d[None, :]
        mask_md = (offs_m[:, None] < T) & (offs_d[None, :] < D)
        dq_col = tl.load(DQ + out_tile, mask=mask_md, other=0.0)  # the column kernel's halves
        dk_col = tl.load(DK + out_tile, mask=mask_md, other=0.0)
        tl.store(DQ + out_tile, dq * scale + dq_col, mask=mask_md)
        tl.store(DK + out_tile, dk * scale + dk_col, mask=mask_md)

    # Autotuning runs on GPUs only (the interpreter has no benchmarker).
    def _configs(quads):
        return [triton.Config({"BLOCK_M": m, "BLOCK_N": n}, num_warps=w, num_stages=st) for m, n, w, st in quads]

    _FWD_CONFIGS, _COL_CONFIGS, _ROW_CONFIGS = map(_configs, autotune_space(bool(torch.version.hip)))
    _KEY = ["T", "BLOCK_D", "HAS1", "MIX", "HAS2", "DOT"]
    _fwd_tuned = triton.autotune(_FWD_CONFIGS, key=_KEY)(_ra_fwd_kernel)
    # the column kernel stores dAlpha partials per key block: zero them between trials; the row
    # kernel adds to dQ, dK in place: restore them between trials
    _bwd_col_tuned = triton.autotune(_COL_CONFIGS, key=_KEY, reset_to_zero=["DAlpha"])(_ra_bwd_col_kernel)
    _bwd_row_tuned = triton.autotune(_ROW_CONFIGS, key=_KEY, restore_value=["DQ", "DK"])(_ra_bwd_row_kernel)

INTERPRET_BLOCK = 16  # fixed tile under the interpreter: small, so tiny test shapes span several blocks
_MIN_BLOCK_N = 16  # the smallest BLOCK_N of any config: sizes the dalpha partial-sum buffer


def _launch(kernel, tuned, grid_rows, B, H, args, meta):
    """Runs the autotuned kernel on a GPU, or the plain one with a fixed tile under the interpreter."""
    T = meta["T"]
    if INTERPRET:
        kernel[(triton.cdiv(T, INTERPRET_BLOCK), B * H)](*args, **meta, BLOCK_M=INTERPRET_BLOCK,
                                                          BLOCK_N=INTERPRET_BLOCK)
    else:
        tuned[lambda cfg: (triton.cdiv(T, cfg[grid_rows]), B * H)](*args, **meta)


def _stream_flags(mode):
    """(HAS1, MIX, HAS2): which attention streams a mode runs (see the kernels' comment)."""
    return {"standard": (True, False, False), "swap": (False, False, True),
            "mix": (True, True, False), "gate": (True, False, True)}[mode]


def _kernel_dtypes(dtype):
    acc = tl.float64 if dtype == torch.float64 else tl.float32
    if dtype == torch.bfloat16 and INTERPRET:
        return acc, tl.float32  # the interpreter's bf16 tl.dot returns garbage (measured, triton 3.8)
    dot = {torch.float16: tl.float16, torch.bfloat16: tl.bfloat16, torch.float32: tl.float32,
           torch.float64: tl.float64}[dtype]
    return acc, dot


def _meta(q, mode, window):
    B, H, T, D = q.shape
    has1, mix, has2 = _stream_flags(mode)
    acc, dot = _kernel_dtypes(q.dtype)
    # W >= T means no band: i - j < T always holds for real rows
    W = window if 0 < window < T else T
    return dict(H=H, T=T, D=D, W=W, scale=1.0 / math.sqrt(D), HAS1=has1, MIX=mix, HAS2=has2,
                ACC=acc, DOT=dot, BLOCK_D=max(16, triton.next_power_of_2(D)))


class _RAFunction(torch.autograd.Function):
    """The fused kernels as one autograd op: returns the (o1, o2) streams (empty when unused)."""

    @staticmethod
    def forward(ctx, q, k, v, alpha, mode, window):
        B, H, T, D = q.shape
        meta = _meta(q, mode, window)
        acc_dtype = torch.float64 if q.dtype == torch.float64 else torch.float32
        o1, o2 = (torch.empty_like(q, memory_format=torch.contiguous_format) if use else q.new_empty(0)
                  for use in (meta["HAS1"], meta["HAS2"]))
        l1, l2 = (torch.empty(B * H, T, device=q.device, dtype=acc_dtype) for _ in range(2))
        args = (q, k, v, alpha, o1 if meta["HAS1"] else o2, o2 if meta["HAS2"] else o1, l1, l2,
                q.stride(0), q.stride(1), q.stride(2))
        _launch(_ra_fwd_kernel, _fwd_tuned, "BLOCK_M", B, H, args, meta)
        ctx.save_for_backward(q, k, v, alpha, o1, o2, l1, l2)
        ctx.meta = meta
        ctx.set_materialize_grads(False)
        for o in (o1, o2):
            if o.numel() == 0:
                ctx.mark_non_differentiable(o)
        return o1, o2

    @staticmethod
    def backward(ctx, do1, do2):
        q, k, v, alpha, o1, o2, l1, l2 = ctx.saved_tensors
        meta = ctx.meta
        B, H, T, D = q.shape

        def prepare(do, o):
            do = torch.zeros_like(o) if do is None else do.contiguous()
            return do, (do.to(l1.dtype) * o.to(l1.dtype)).sum(-1).view(B * H, T)  # Delta = rowsum(dO * O)

        # a mode with one stream passes that stream's tensors in the other's slots (never read)
        do2, delta2 = prepare(do2, o2) if meta["HAS2"] else (None, None)
        do1, delta1 = prepare(do1, o1) if meta["HAS1"] else (do2, delta2)
        do2, delta2 = (do2, delta2) if meta["HAS2"] else (do1, delta1)
        dq, dk, dv = (torch.empty(q.shape, device=q.device, dtype=l1.dtype) for _ in range(3))
        n_partials = triton.cdiv(T, _MIN_BLOCK_N)
        dalpha = torch.zeros(B * H, n_partials, device=q.device, dtype=l1.dtype)
        strides = (q.stride(0), q.stride(1), q.stride(2))
        common = (q, k, v, alpha, do1, do2, l1, l2, delta1, delta2)
        _launch(_ra_bwd_col_kernel, _bwd_col_tuned, "BLOCK_N", B, H,
                common + (dq, dk, dv, dalpha) + strides, dict(meta, n_partials=n_partials))
        _launch(_ra_bwd_row_kernel, _bwd_row_tuned, "BLOCK_M", B, H,
                common + (dq, dk) + strides, meta)
        dalpha = dalpha.view(B, H, n_partials).sum((0, 2)).to(alpha.dtype) if meta["MIX"] else None
        return dq.to(q.dtype), dk.to(k.dtype), dv.to(v.dtype), dalpha, None, None


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
    if mode == "mix":
        alpha = torch.as_tensor(alpha, device=q.device).to(acc_dtype).reshape(-1).expand(H).contiguous()
    else:
        alpha = torch.zeros(H, device=q.device, dtype=acc_dtype)
    o1, o2 = _fused(q, k, v, alpha, mode, int(window))
    if mode == "gate":
        p = torch.sigmoid(_per_head(gate_logit, q)).to(q.dtype)
        return o1 + p * (o2 - o1)  # (1 - p) * o1 + p * o2
    return o2 if mode == "swap" else o1
