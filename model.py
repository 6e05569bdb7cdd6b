"""GPT-2, the baseline of every experiment, and the building blocks the other models reuse.

Module names follow GPT-2's checkpoint (transformer.wte, h.N.attn.c_attn, ln_f, ...), so Hugging
Face weights map onto this model one to one (see `GPT.from_pretrained`).
"""
import json
import math
import os
from dataclasses import dataclass, fields

import torch
import torch.nn as nn
from torch.nn import functional as F
from torch.utils.checkpoint import checkpoint

import optim
from configurator import ConfigError
from kernels.linear_cross_entropy import check_head_loss, linear_cross_entropy


@dataclass
class GPTConfig:
    block_size: int = 1024
    vocab_size: int = 50304  # GPT-2's 50257 padded up to a multiple of 64 for faster matmuls
    n_layer: int = 12
    n_head: int = 12
    n_embd: int = 768
    dropout: float = 0.0
    bias: bool = True
    ln_placement: str = "pre"  # 'pre' (GPT-2) or 'post' (original Transformer, no final LN)
    attn_impl: str = "sdpa"  # 'sdpa' (fused kernels) or 'manual' (readable, materializes T x T)
    activation_checkpointing: bool = False  # recompute each block in backward to save memory
    attn_recompute: bool = False  # recompute only the attention core in backward (see attention_core)
    tie_weights: bool = True  # lm_head shares the token embedding matrix, as in GPT-2
    # training loss of the head: 'chunked' never builds the (B, T, vocab) logits; 'full' does (the
    # reference); 'liger' / 'cce' are CUDA kernels from optional packages (kernels/linear_cross_entropy.py);
    # 'auto' is train.py's to settle by memory (ParallelLayout.choose_head_loss); unsettled it computes as 'chunked'
    head_loss: str = "auto"

    attn_impls = ("sdpa", "manual")  # what this model offers; subclasses may add (not a field)

    def __post_init__(self):
        check_model_config(self)


LN_PLACEMENTS = ("pre", "post")


def check_model_config(cfg):
    """Reject impossible model shapes before any weight is allocated."""
    if cfg.n_embd % cfg.n_head:
        raise ConfigError(f"n_embd={cfg.n_embd} is not divisible by n_head={cfg.n_head}: "
                         f"choose n_head among the divisors of n_embd")
    if cfg.ln_placement not in LN_PLACEMENTS:
        raise ConfigError(f"ln_placement={cfg.ln_placement!r}: use one of {LN_PLACEMENTS}")
    if cfg.attn_impl not in cfg.attn_impls:
        hint = "; 'triton' is the fused kernel of model_type='ra'" if cfg.attn_impl == "triton" else ""
        raise ConfigError(f"attn_impl={cfg.attn_impl!r}: use one of {cfg.attn_impls}{hint}")
    for name in ("block_size", "vocab_size", "n_layer", "n_head", "n_embd"):
        if getattr(cfg, name) < 1:
            raise ConfigError(f"{name} must be a positive integer, got {getattr(cfg, name)}")
    if not 0.0 <= cfg.dropout < 1.0:
        raise ConfigError(f"dropout must be in [0, 1), got {cfg.dropout}")
    check_head_loss(cfg.head_loss)
    if cfg.activation_checkpointing and cfg.attn_recompute:
        raise ConfigError("activation_checkpointing already recomputes the attention core with the rest of "
                         "each block: set attn_recompute=False (or activation_checkpointing=False)")


class LayerNorm(nn.Module):
    """LayerNorm with an optional bias (nn.LayerNorm only lets both or neither be learned)."""

    def __init__(self, ndim, bias):
        super().__init__()
        self.weight = nn.Parameter(torch.ones(ndim))
        self.bias = nn.Parameter(torch.zeros(ndim)) if bias else None

    def forward(self, x):
        return F.layer_norm(x, self.weight.shape, self.weight, self.bias, 1e-5)


def causal_attention(q, k, v, attn_impl, dropout_p, score_mod=None):
    """softmax(q k^T / sqrt(d)) v under the causal mask, for (B, H, T, D) tensors. Every attn_impl
    but 'manual' runs SDPA: an RA model's standard layers get 'triton' or 'auto', which are RA's own.
    score_mod: a function of the scaled logits before the mask (the RA model's scores step), manual only."""
    if attn_impl != "manual":
        return F.scaled_dot_product_attention(q, k, v, dropout_p=dropout_p, is_causal=True)
    T = q.size(-2)
    scores = (q @ k.transpose(-2, -1)) * (1.0 / math.sqrt(q.size(-1)))
    if score_mod is not None:
        scores = score_mod(scores)
    future = torch.ones(T, T, dtype=torch.bool, device=q.device).triu(1)
    weights = F.softmax(scores.masked_fill(future, float("-inf")), dim=-1)
    return F.dropout(weights, p=dropout_p) @ v


def attention_core(attend, *heads, recompute):
    """attend(*heads): q, k, v (and RA mix's doubled key [k | q] where it is a view). With recompute, what attend
    keeps for backward (softmax statistics, the output, and the doubled, duplicated or padded operands
    of the reciprocal variants) is dropped and attend runs again in backward: Megatron's selective
    recomputation, one more attention forward per layer for the memory of its activations. Dropout
    masks are replayed exactly."""
    if recompute and torch.is_grad_enabled():
        return checkpoint(attend, *heads, use_reentrant=False)
    return attend(*heads)


class CausalSelfAttention(nn.Module):
    def __init__(self, config):
        super().__init__()
        self.c_attn = nn.Linear(config.n_embd, 3 * config.n_embd, bias=config.bias)
        self.c_proj = nn.Linear(config.n_embd, config.n_embd, bias=config.bias)
        self.resid_dropout = nn.Dropout(config.dropout)
        self.n_head = config.n_head
        self.dropout = config.dropout
        self.attn_impl = config.attn_impl
        self.recompute = config.attn_recompute

    def split_heads(self, x):
        B, T, C = x.shape
        return x.view(B, T, self.n_head, C // self.n_head).transpose(1, 2)

    def forward(self, x):
        return self.resid_dropout(self.c_proj(self.heads_output(x)))

    def heads_output(self, x):
        """The heads' outputs side by side, (B, T, C), before the output projection."""
        B, T, C = x.shape
        q, k, v = (self.split_heads(t) for t in self.c_attn(x).split(C, dim=2))
        y = attention_core(self.attend, q, k, v, recompute=self.recompute and self.training)
        return y.transpose(1, 2).contiguous().view(B, T, C)

    def attend(self, q, k, v):
        """The mixing step alone; attention variants override this and keep the projections."""
        return causal_attention(q, k, v, self.attn_impl, self.dropout if self.training else 0.0)


class MLP(nn.Module):
    def __init__(self, config):
        super().__init__()
        self.c_fc = nn.Linear(config.n_embd, 4 * config.n_embd, bias=config.bias)
        self.gelu = nn.GELU(approximate="tanh")  # GPT-2's "gelu_new"
        self.c_proj = nn.Linear(4 * config.n_embd, config.n_embd, bias=config.bias)
        self.dropout = nn.Dropout(config.dropout)

    def forward(self, x):
        return self.dropout(self.c_proj(self.gelu(self.c_fc(x))))


def attention_params(config):
    """Parameters of one CausalSelfAttention: c_attn and c_proj."""
    C, b = config.n_embd, int(config.bias)
    return 4 * C * C + 4 * b * C


def block_params(config):
    """Parameters of one Block without its attention: two LayerNorms and the MLP."""
    C, b = config.n_embd, int(config.bias)
    return 2 * (C + b * C) + 8 * C * C + 5 * b * C


class Block(nn.Module):
    def __init__(self, config, attn=None):
        super().__init__()
        self.ln_1 = LayerNorm(config.n_embd, bias=config.bias)
        self.attn = attn if attn is not None else CausalSelfAttention(config)
        self.ln_2 = LayerNorm(config.n_embd, bias=config.bias)
        self.mlp = MLP(config)
        self.pre_ln = config.ln_placement == "pre"

    def forward(self, x):
        if self.pre_ln:
            x = x + self.attn(self.ln_1(x))
            return x + self.mlp(self.ln_2(x))
        x = self.ln_1(x + self.attn(x))
        return self.ln_2(x + self.mlp(x))


class GPT(nn.Module):
    # forward calls each block as a module, so FSDP can gather one block's weights at a time (sharding.py)
    blocks_run_as_modules = True

    def __init__(self, config):
        super().__init__()
        self.config = config
        self.transformer = nn.ModuleDict(dict(
            wte=nn.Embedding(config.vocab_size, config.n_embd),
            wpe=nn.Embedding(config.block_size, config.n_embd),
            drop=nn.Dropout(config.dropout),
            h=nn.ModuleList([self.make_block(i) for i in range(config.n_layer)]),
        ))
        # Post-LN already normalizes every block's output; a final LN belongs to pre-LN only.
        if config.ln_placement == "pre":
            self.transformer["ln_f"] = LayerNorm(config.n_embd, bias=config.bias)
        self.lm_head = nn.Linear(config.n_embd, config.vocab_size, bias=False)
        if config.tie_weights:
            self.lm_head.weight = self.transformer.wte.weight
        if self.lm_head.weight.is_meta:
            return  # shapes only (runtime.meta_model): drawing on the meta device costs ms per weight for nothing
        self.apply(self._init_weights)
        # GPT-2 scales the residual projections by 1/sqrt(2 * n_layer): two per block.
        for name, p in self.named_parameters():
            if name.endswith("c_proj.weight"):
                nn.init.normal_(p, mean=0.0, std=0.02 / math.sqrt(2 * config.n_layer))

    def make_block(self, layer_idx):
        """Subclasses choose a different block (or attention) per layer here."""
        return Block(self.config)

    @classmethod
    def count_params(cls, config):
        """The parameters of the model built from `config` (tied weights once), by formula: the memory
        check of any size takes microseconds, where building even on the meta device takes minutes
        for 100,000 layers. Subclasses that change a layer's parameters override blocks_params;
        tests/test_model.py checks the formula against every architecture built."""
        C, b = config.n_embd, int(config.bias)
        n = (config.vocab_size + config.block_size) * C + cls.blocks_params(config)
        if config.ln_placement == "pre":
            n += C + b * C  # ln_f
        if not config.tie_weights:
            n += config.vocab_size * C  # lm_head
        return n

    @classmethod
    def blocks_params(cls, config):
        return config.n_layer * (block_params(config) + attention_params(config))

    @staticmethod
    def _init_weights(module):
        if isinstance(module, nn.Linear):
            nn.init.normal_(module.weight, mean=0.0, std=0.02)
            if module.bias is not None:
                nn.init.zeros_(module.bias)
        elif isinstance(module, nn.Embedding):
            nn.init.normal_(module.weight, mean=0.0, std=0.02)

    def residual_layer(self, layer):
        """The first layer at or after `layer` whose output is the whole residual stream (here every
        layer's; a model that keeps per-shard streams between sync points answers otherwise)."""
        return layer

    def residual_module(self, layer):
        """The module whose output is the residual stream after `layer` (a residual_layer)."""
        return self.transformer.h[layer]

    def metrics(self):
        """Scalars the model wants logged with every evaluation (learned gates, sync counts ...)."""
        return {}

    def get_num_params(self, non_embedding=True):
        """Parameters counted once (tied weights once); position embeddings excluded by default,
        as in the GPT-2 papers' counts."""
        n = sum(p.numel() for p in self.parameters())
        if non_embedding:
            n -= self.transformer.wpe.weight.numel()
        return n

    def forward(self, idx, targets=None, last_only=False):
        """Logits for every position (B, T, vocab), and the mean cross-entropy if targets are given.
        A training forward (targets given, gradients on) returns None for the logits unless
        head_loss='full': the loss comes from the head without them (see `head`).

        last_only=True returns logits for the final position alone (B, 1, vocab): what generation
        needs, and much cheaper. Evaluation and HellaSwag need the default.
        """
        x = self.embed(idx)
        for block in self.transformer.h:
            if self.config.activation_checkpointing and self.training and torch.is_grad_enabled():
                x = checkpoint(block, x, use_reentrant=False)
            else:
                x = block(x)
        return self.head(x, targets, last_only)

    def embed(self, idx):
        """Token plus position embeddings: the residual stream entering the first block."""
        T = idx.size(1)
        if T > self.config.block_size:
            raise ValueError(f"sequence length {T} exceeds block_size {self.config.block_size}")
        pos = torch.arange(T, dtype=torch.long, device=idx.device)
        return self.transformer.drop(self.transformer.wte(idx) + self.transformer.wpe(pos))

    def head(self, x, targets=None, last_only=False):
        """Final norm, logits and loss from the residual stream after the last block. When the loss
        will be differentiated, a head_loss other than 'full' computes it and its gradients chunk by
        chunk: the logits, their fp32 copy and their gradient (4 x 6.6 GB at GPT-2's micro-batch 32
        x 1024) never exist. Evaluation, HellaSwag and generation run without gradients and get logits."""
        if "ln_f" in self.transformer:
            x = self.transformer.ln_f(x)
        if last_only:
            x = x[:, -1:, :]
        if targets is not None and torch.is_grad_enabled() and self.config.head_loss != "full":
            return None, linear_cross_entropy(x.flatten(0, 1), self.lm_head.weight, targets.reshape(-1),
                                              self.config.head_loss, ignore_index=-1)
        logits = self.lm_head(x)
        loss = None
        if targets is not None:
            loss = F.cross_entropy(logits.flatten(0, 1).float(), targets.reshape(-1), ignore_index=-1)
        return logits, loss

    def param_groups(self, weight_decay):
        """Weight decay on matrices (Linear weights, embeddings) only, never on biases or norms."""
        params = [p for p in self.parameters() if p.requires_grad]
        return [
            {"params": [p for p in params if p.dim() >= 2], "weight_decay": weight_decay},
            {"params": [p for p in params if p.dim() < 2], "weight_decay": 0.0},
        ]

    def configure_optimizers(self, optimizer, learning_rate, weight_decay, betas=(0.9, 0.95),
                             momentum=0.9, nesterov=False, impl="fused"):
        """The built-in torch optimizers over `param_groups` (optim.py adds AdamW-SPAM on the same
        groups). impl: 'fused' (one kernel for all parameters; CUDA and CPU), 'foreach' (a few
        multi-tensor ops), 'for_loop' (one parameter at a time), '' (torch's default: foreach on
        CUDA, the for-loop on CPU)."""
        return optim.torch_optimizer(self.param_groups(weight_decay), optimizer, learning_rate, betas, momentum,
                                     nesterov, impl)

    def flops_per_token(self):
        """Training FLOPs per token: 6N for the matmuls with weights plus 12*L*H*Q*T for attention
        (PaLM appendix B), as nanoGPT counts them."""
        cfg = self.config
        return 6 * self.get_num_params() + 12 * cfg.n_layer * cfg.n_embd * cfg.block_size

    def estimate_mfu(self, tokens_per_second_per_device, device, peak=None):
        """Model FLOPs utilization against `peak` FLOP/s (a measured one: devices.matmul_peak_flops),
        by default the device's data-sheet dense bf16 peak; None when no peak is known (CPUs,
        unlisted GPUs) rather than a misleading number."""
        peak = peak or peak_flops(device)
        if peak is None:
            return None
        return self.flops_per_token() * tokens_per_second_per_device / peak

    @torch.no_grad()
    def generate(self, idx, max_new_tokens, temperature=1.0, top_k=None):
        for _ in range(max_new_tokens):
            context = idx[:, -self.config.block_size:]
            logits, _ = self(context, last_only=True)
            logits = logits[:, -1, :] / max(temperature, 1e-8)
            if top_k is not None:
                kth = torch.topk(logits, min(top_k, logits.size(-1))).values[:, [-1]]
                logits[logits < kth] = float("-inf")
            next_id = torch.multinomial(F.softmax(logits, dim=-1), num_samples=1)
            idx = torch.cat((idx, next_id), dim=1)
        return idx

    @classmethod
    def from_pretrained(cls, path, **overrides):
        """Load a Hugging Face GPT-2 checkpoint from a local directory, without network access.

        The directory holds config.json and model.safetensors (or pytorch_model.bin), as written by
        `GPT2LMHeadModel.save_pretrained`. `overrides` may set dropout, attn_impl, the recomputation keys or head_loss.
        """
        with open(os.path.join(path, "config.json")) as f:
            hf = json.load(f)
        unsupported = {k: hf[k] for k in ("scale_attn_by_inverse_layer_idx", "reorder_and_upcast_attn")
                       if hf.get(k)}
        if hf.get("activation_function", "gelu_new") not in ("gelu_new", "gelu_pytorch_tanh"):
            unsupported["activation_function"] = hf["activation_function"]
        if not hf.get("scale_attn_weights", True):  # HF would skip the 1/sqrt(head_dim) scaling
            unsupported["scale_attn_weights"] = hf["scale_attn_weights"]
        if abs(hf.get("layer_norm_epsilon", 1e-5) - 1e-5) > 1e-12:
            unsupported["layer_norm_epsilon"] = hf["layer_norm_epsilon"]
        if unsupported:
            raise ValueError(f"{path}: GPT-2 variant not supported by model.GPT: {unsupported}")
        config = GPTConfig(n_layer=hf["n_layer"], n_head=hf["n_head"], n_embd=hf["n_embd"],
                           block_size=hf["n_positions"], vocab_size=hf["vocab_size"], bias=True,
                           tie_weights=hf.get("tie_word_embeddings", True), **overrides)
        model = cls(config)
        hf_state = load_hf_state_dict(path)
        # HF's Conv1D stores weights as (in, out); nn.Linear wants (out, in).
        transposed = ("attn.c_attn.weight", "attn.c_proj.weight", "mlp.c_fc.weight", "mlp.c_proj.weight")
        ours = model.state_dict()
        for key in ours:
            hf_key = key if key in hf_state else key.removeprefix("transformer.")
            if hf_key not in hf_state:
                if key == "lm_head.weight" and config.tie_weights:
                    continue  # tied to wte, which is loaded
                raise KeyError(f"{path}: checkpoint has no weight for {key}")
            w = hf_state[hf_key]
            if key.endswith(transposed):
                w = w.t()
            if w.shape != ours[key].shape:
                raise ValueError(f"{path}: {key} has shape {tuple(w.shape)}, expected {tuple(ours[key].shape)}")
            with torch.no_grad():
                ours[key].copy_(w)
        return model


def load_hf_state_dict(path):
    """Weights of a HF checkpoint with the 'transformer.' prefix normalized away when present."""
    st_file = os.path.join(path, "model.safetensors")
    if os.path.exists(st_file):
        from safetensors.torch import load_file
        state = load_file(st_file)
    else:
        bin_file = os.path.join(path, "pytorch_model.bin")
        if not os.path.exists(bin_file):
            raise FileNotFoundError(f"{path} has neither model.safetensors nor pytorch_model.bin")
        state = torch.load(bin_file, map_location="cpu", weights_only=True)
    return {k.removeprefix("transformer."): v for k, v in state.items()
            if not k.endswith((".attn.bias", ".attn.masked_bias"))}  # causal-mask buffers, not weights


# Dense (not 2:4 sparse) bf16 tensor-core peaks in FLOP/s from the vendors' data sheets, by the exact
# name torch.cuda.get_device_name reports: "L4" is not an L40S, an H100 PCIe (756) or NVL (835) is not
# an SXM (989), and an MI250X shows as two devices, one die each (half the card's 383). Anything
# unlisted, CPUs included, gets no MFU rather than a guess.
PEAK_BF16_FLOPS = {
    "NVIDIA H100 80GB HBM3": 989.4e12,  # SXM5
    "NVIDIA H100 PCIe": 756.5e12,
    "NVIDIA H100 NVL": 835.5e12,
    "NVIDIA H200": 989.4e12,  # SXM
    "NVIDIA H200 NVL": 835.5e12,
    "NVIDIA GH200 480GB": 989.4e12,
    "NVIDIA A100-SXM4-40GB": 312e12,
    "NVIDIA A100-SXM4-80GB": 312e12,
    "NVIDIA A100-PCIE-40GB": 312e12,
    "NVIDIA A100 80GB PCIe": 312e12,
    "NVIDIA A10G": 70e12,
    "NVIDIA L4": 121e12,
    "NVIDIA L40S": 362.05e12,
    "AMD Instinct MI300X": 1307.4e12,
    "AMD Instinct MI300X VF": 1307.4e12,  # the same card as a virtual function (cloud VMs)
    "AMD Instinct MI250X": 191.5e12,  # one of the card's two dies
    "AMD Radeon PRO W7900": 122.6e12,
}


def peak_flops(device):
    """The data-sheet peak of a CUDA (or ROCm) device, by its exact name; None when unlisted."""
    device = torch.device(device)
    if device.type != "cuda" or not torch.cuda.is_available():
        return None
    return PEAK_BF16_FLOPS.get(torch.cuda.get_device_name(device).strip())


def unwrap_state_dict(state_dict):
    """Strip the prefixes torch.compile ('_orig_mod.') and DDP ('module.') add to parameter names,
    so a checkpoint loads into a plain model whichever wrapper saved it."""
    prefixes = ("_orig_mod.", "module.")
    clean = {}
    for key, value in state_dict.items():
        while key.startswith(prefixes):
            key = key.split(".", 1)[1]
        clean[key] = value
    return clean


def model_config_fields(config_cls=GPTConfig):
    return [f.name for f in fields(config_cls)]
