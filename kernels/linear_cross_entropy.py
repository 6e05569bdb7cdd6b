"""Cross-entropy of a linear head without its logits: the loss of `x @ weight.T` against targets,
and the gradients of x and weight, computed chunk by chunk over the tokens (the idea of Liger
Kernel's fused linear cross-entropy and of Cut Cross-Entropy).

At GPT-2's 50k vocabulary the logits are the largest tensors of a training step: (B*T, V) in the
autocast dtype, their fp32 copy for the loss and the gradient of each, 4 x 6.6 GB at micro-batch
32 x 1024. Here only one chunk of them exists at a time. The gradient of the summed loss with
respect to a chunk's logits is known in forward, softmax - one_hot, so forward turns it into the
chunk's share of grad_x and grad_weight right away and backward only scales them by the incoming
gradient / n_valid: no logits are kept and none recomputed, the same matmul FLOPs as the plain
head. Each matmul runs under whatever autocast is active, as the plain head's would.

head_loss implementations (GPTConfig.head_loss):
    'auto'     train.py picks 'full' or 'chunked' by the memory estimate (parallel.ParallelLayout.choose_head_loss);
               a model that is never told trains 'chunked', the head that always fits
    'full'     logits, then F.cross_entropy on their fp32 copy (the reference)
    'chunked'  this file: PyTorch only, any device, traceable by torch.compile
    'liger'    liger-kernel's fused Triton kernel (CUDA; `pip install liger-kernel`)
    'cce'      Apple's Cut Cross-Entropy Triton kernel (CUDA; `pip install cut-cross-entropy`)

torch.nn.functional.linear_cross_entropy (torch 2.13) chunks too, but ignores autocast (fp32 at
half the speed of a bf16 head on CPU) and puts torch.compile back into eager at the op.
"""
import importlib

import torch

from configurator import ConfigError

HEAD_LOSSES = ("full", "chunked", "liger", "cce")  # the implementations
HEAD_LOSS_CHOICES = ("auto",) + HEAD_LOSSES
CUDA_LIBRARIES = {"liger": "liger_kernel", "cce": "cut_cross_entropy"}  # head_loss -> module
# Logits per chunk at most: 2**25 (128 MiB in fp32, ~670 tokens at V=50304; every token at a small
# vocabulary). Smaller chunks starve the grad_weight matmul (its inner dimension is the chunk; the CPU
# twin's step time at 2**23 and 2**25: docs/speed-and-memory.md).
CHUNK_LOGITS = 2**25


def check_head_loss(head_loss):
    """One-line error for an unknown implementation (GPTConfig checks it). The packages are checked only
    for training (check_head_loss_trains): a checkpoint trained with any head is evaluated, sampled and
    exported without them, since nothing but a training step calls the head loss."""
    if head_loss not in HEAD_LOSS_CHOICES:
        raise ConfigError(f"head_loss={head_loss!r}: use one of {HEAD_LOSS_CHOICES}")


def check_head_loss_trains(head_loss, device_type, dtype):
    """A package's kernel for training (runtime.validate): installed, on CUDA, and for CCE, whose
    backward takes only 16-bit activations, a bfloat16 or float16 run ('' is one on a GPU)."""
    if head_loss not in CUDA_LIBRARIES:
        return
    if importlib.util.find_spec(CUDA_LIBRARIES[head_loss]) is None:
        package = CUDA_LIBRARIES[head_loss].replace("_", "-")
        raise ConfigError(f"head_loss={head_loss!r} needs `pip install {package}`; or use head_loss='chunked'")
    if device_type != "cuda":
        raise ConfigError(f"head_loss={head_loss!r} runs Triton kernels on CUDA only; on {device_type} "
                          f"use head_loss='chunked'")
    if head_loss == "cce" and dtype == "float32":
        raise ConfigError("head_loss='cce' trains in bfloat16 or float16 only (its backward refuses float32 "
                          "activations): set dtype='bfloat16', or use head_loss='chunked'")


def linear_cross_entropy(x, weight, targets, head_loss="chunked", ignore_index=-1):
    """Mean cross-entropy of x @ weight.T (x: (N, C), weight: (V, C), targets: (N,)) over the
    targets that are not ignore_index; equal to F.cross_entropy(F.linear(x, weight).float(), ...)."""
    if head_loss in ("chunked", "auto"):
        return ChunkedLinearCrossEntropy.apply(x, weight, targets, ignore_index)
    if head_loss == "liger":
        from liger_kernel.transformers.functional import liger_fused_linear_cross_entropy
        # float32 accumulation of the weight's gradient: under FSDP the weight is the bf16 all-gathered
        # copy, and liger would otherwise sum the tied weight's gradient over the chunks in bf16.
        # (liger reads its count of valid targets with .item(): one host sync per call, its own.)
        return liger_fused_linear_cross_entropy(x, weight, targets, ignore_index=ignore_index,
                                                accum_dtype=torch.float32)
    if head_loss == "cce":
        from cut_cross_entropy import linear_cross_entropy as cce
        # CCE's backward asserts bf16/fp16 embeddings, and ln_f's output is float32 under autocast: both
        # operands go in the autocast dtype, as the plain head's matmul would. filter_eps=None: its
        # default ('high') skips gradient blocks below bf16's eps / 32, which the full head keeps.
        dtype = torch.get_autocast_dtype(x.device.type) if torch.is_autocast_enabled(x.device.type) else x.dtype
        return cce(x.to(dtype), weight.to(dtype), targets, ignore_index=ignore_index, filter_eps=None)
    raise ValueError(f"head_loss={head_loss!r} has no chunked implementation: use one of {HEAD_LOSSES[1:]}")


class ChunkedLinearCrossEntropy(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x, weight, targets, ignore_index):
        n_chunks = max(1, -(-x.size(0) * weight.size(0) // CHUNK_LOGITS))
        chunk = max(1, -(-x.size(0) // n_chunks))  # chunks of equal size: a short last one runs its matmuls slowly
        accum_dtype = torch.promote_types(weight.dtype, torch.float32)  # of the loss, softmax and grad_weight
        grad_dtype = weight.dtype
        valid = targets != ignore_index
        scale = 1.0 / valid.sum().to(accum_dtype)  # the mean over valid targets (0/0 = nan when none, as F.cross_entropy)
        safe_targets = targets.masked_fill(~valid, 0)  # any class: its row's gradient is zeroed below
        loss_sum = torch.zeros((), dtype=accum_dtype, device=x.device)
        grad_x = torch.empty_like(x)
        grad_weight = torch.zeros_like(weight, dtype=accum_dtype)
        if torch.is_autocast_enabled(x.device.type):  # cast once, not in every chunk's two matmuls
            weight = weight.to(torch.get_autocast_dtype(x.device.type))
        for start in range(0, x.size(0), chunk):
            rows = slice(start, start + chunk)
            losses, grad_x[rows], grad_weight_chunk = chunk_losses_and_grads(
                x[rows], weight, safe_targets[rows, None], ~valid[rows, None], accum_dtype)
            loss_sum += losses.sum()
            grad_weight += grad_weight_chunk
        ctx.save_for_backward(grad_x, grad_weight.to(grad_dtype), scale)
        return loss_sum * scale

    @staticmethod
    def backward(ctx, grad_loss):
        grad_x, grad_weight, scale = ctx.saved_tensors  # gradients of the summed loss: scale by the incoming one / n_valid
        grad_loss = grad_loss * scale
        return grad_x * grad_loss.to(grad_x.dtype), grad_weight * grad_loss.to(grad_weight.dtype), None, None


def chunk_losses_and_grads(x, weight, target, ignored, accum_dtype):
    """One chunk's per-token losses and the gradients of their sum for x and weight, zero where
    ignored; a function so that the chunk's (chunk, V) tensors are freed before the next chunk's.

    The (chunk, V) passes are the head's cost besides its matmuls, and an exp costs more than the
    memory it touches: one softmax (one exp per logit) gives the gradient softmax - one_hot, and the
    loss lse - target logit takes lse from the largest probability, which never underflows (>= 1/V):
    lse = max logit - log(max probability). No log_softmax, no second exp pass. The ignored rows (and
    the mean's scale, in backward) are applied on the (chunk, C) side, 1/V of the work."""
    logits = x @ weight.t()  # bf16 under autocast
    probs = torch.softmax(logits, dim=-1, dtype=accum_dtype)  # fp32 at least, as the plain head's loss
    lse = logits.amax(dim=-1).to(accum_dtype) - probs.amax(dim=-1).log()
    losses = (lse - logits.gather(1, target).squeeze(1).to(accum_dtype)).masked_fill(ignored.squeeze(1), 0.0)
    # softmax - one_hot: one index per row, so an index_put, which deterministic=True allows on a GPU
    # (scatter_add_ on CUDA has no deterministic kernel there and would refuse to run)
    probs[torch.arange(len(target), device=target.device), target.squeeze(1)] -= 1
    grad_logits = probs.to(logits.dtype)  # as the plain backward casts it for its matmuls
    del probs, logits  # the fp32 probabilities are not needed for the matmuls, where the peak is
    grad_x = (grad_logits @ weight).masked_fill(ignored, 0.0)
    return losses, grad_x, grad_logits.t() @ x.masked_fill(ignored, 0.0)
