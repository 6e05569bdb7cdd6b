"""What each registered idea declares it costs (ra_model.Idea: layer_params, extra_flops, kept_scores), against
what it measurably costs: the FLOPs of a training forward and backward (torch's FLOP counter) and the peak memory
of a training step (the profiler's allocations, tests/helpers.measured_peak_bytes)."""
import dataclasses

import pytest
import torch
from torch.utils.flop_counter import FlopCounterMode, sdpa_flop_count

import ra_model
import runtime
import sharding
from helpers import measured_peak_bytes
from ra_model import IDEAS, RAConfig, RAGPT

TINY = dict(block_size=16, vocab_size=64, n_layer=4, n_head=2, n_embd=16, bias=False)
ATEN = torch.ops.aten
# The counter knows SDPA's CUDA kernels, not the CPU's flash kernel: counted here as the model counts attention
# (nanoGPT, PaLM appendix B), a backward twice its forward (flash's recomputed scores are not model FLOPs)
CPU_SDPA = {
    ATEN._scaled_dot_product_flash_attention_for_cpu: lambda q, k, v, *_, out_shape=None, **__: sdpa_flop_count(q, k, v),
    ATEN._scaled_dot_product_flash_attention_for_cpu_backward:
        lambda grad, q, k, v, *_, out_shape=None, **__: 2 * sdpa_flop_count(q, k, v),
}
# every idea alone, and compositions (mix is left out: no CPU kernel takes its value head size, so its values are
# padded to the doubled head size here, matmul work the model does not count)
COMPOSED = {name: idea.example for name, idea in IDEAS.items()}
COMPOSED |= {"ra-gate+value-residual+gated": dict(ra_pattern="all", ra_mode="gate", value_residual=True, attn_gate=True),
             "mla+ra-gate": dict(mla=True, mla_latent_dim=8, ra_pattern="late", ra_mode="gate"),
             "softcap+value-residual+gated": dict(attn_softcap=5.0, attn_impl="manual", value_residual=True,
                                                  attn_gate=True)}


def counted_flops_per_token(model):
    idx = torch.randint(0, model.config.vocab_size, (2, model.config.block_size),
                        generator=torch.Generator().manual_seed(1))
    with FlopCounterMode(display=False, custom_mapping=CPU_SDPA) as counter:
        model(idx, idx)[1].backward()
    return counter.get_total_flops() / idx.numel()


@pytest.mark.parametrize("name", COMPOSED)
def test_the_declared_flops_are_the_counted_matmuls(name):
    """flops_per_token (6 per parameter and token, GPT's attention, each idea's extra_flops) is exactly the counted
    matmul FLOPs plus 6 per token for each parameter that enters no matmul (norms' gains, RA's gate logit,
    value residual's lambda): bias=False, so no other parameter is off the counter."""
    torch.manual_seed(0)
    model = RAGPT(RAConfig(**TINY, **COMPOSED[name]))
    elementwise = sum(p.numel() for p in model.parameters() if p.dim() < 2)
    assert counted_flops_per_token(model) == model.flops_per_token() - 6 * elementwise


def test_an_idea_that_adds_attention_work_declares_it():
    """RA's gate runs a second attention: 6*T*(C + C) per token and reciprocal layer, which the count reads from
    the registration and the equal-FLOPs comparison from the count (runtime.flops_per_token)."""
    T, C = TINY["block_size"], TINY["n_embd"]
    cfg = dict(runtime.DEFAULTS, model_type="ra", **TINY)
    gate = dict(cfg, ra_pattern="late", ra_mode="gate")
    assert runtime.flops_per_token(gate) - runtime.flops_per_token(cfg) == 2 * (6 * T * 2 * C + 6)  # + the logits


MEMORY = dict(runtime.DEFAULTS, model_type="ra", n_layer=2, n_head=4, n_embd=128, vocab_size=512, block_size=512,
              batch_size=1, gradient_accumulation_steps=1, dtype="float32")


def peaks(keys):
    """(estimated, measured) bytes at the peak of a training step on the CPU."""
    cfg = dict(MEMORY, **keys)
    return sharding.memory_estimate(cfg, runtime.count_params(cfg), 1, "float32", "cpu")["step"], \
        measured_peak_bytes(cfg)


@pytest.fixture(scope="module")
def baselines():
    return {impl: peaks(dict(attn_impl=impl)) for impl in ("sdpa", "manual")}


@pytest.mark.parametrize("name", [*IDEAS, "softcap+ra-gate"])
def test_the_memory_an_idea_adds_is_the_memory_it_declares(name, baselines):
    """What an idea adds to the baseline's peak on the same attention path, estimated from its declarations
    against measured: within 15% of the baseline's peak (the estimate counts no idea's own small activations:
    the gate's sigmoid, QK-norm's normalized copies), and within 10% of itself where the idea keeps T x T
    scores (soft-capping's tanh beside the softmax: 4 MiB per layer here)."""
    keys = dict(attn_softcap=5.0, attn_impl="manual", ra_pattern="all", ra_mode="gate") \
        if name == "softcap+ra-gate" else IDEAS[name].example
    estimated, measured = peaks(keys)
    base_estimated, base_measured = baselines[keys.get("attn_impl", "sdpa")]
    declared, added = estimated - base_estimated, measured - base_measured
    assert abs(declared - added) <= 0.15 * base_measured
    if "attn_softcap" in keys:
        assert declared == pytest.approx(added, rel=0.10)


def test_soft_capping_without_its_declaration_would_be_undercounted(monkeypatch, baselines):
    """The check above fails for an idea that keeps scores and declares none: soft-capping's extra T x T tensor
    is then missing from the estimate."""
    capped = dict(attn_softcap=5.0, attn_impl="manual")
    estimated, measured = peaks(capped)
    monkeypatch.setitem(IDEAS, "logit soft-capping",
                        dataclasses.replace(IDEAS["logit soft-capping"], kept_scores=ra_model.no_scores))
    undeclared = sharding.memory_estimate(dict(MEMORY, **capped), runtime.count_params(dict(MEMORY, **capped)), 1,
                                          "float32", "cpu")["step"]
    base_estimated, base_measured = baselines["manual"]
    assert undeclared == base_estimated < estimated
    assert measured - base_measured > 0.15 * base_measured  # the tolerance above would catch it
