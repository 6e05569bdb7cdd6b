"""A new idea (docs/new-idea.md). QK-norm, the page's worked example: off it is the baseline, on it
keeps the baseline's initial weights and computes its formula. And through the registry alone: a toy
idea (a learned per-head score temperature, 1 at the start) is its class, one ra_model.IDEAS entry,
its key as a config field and a runtime.DEFAULTS key. It starts as the baseline bit for bit and
changes the forward once it moves; sweep.py plans it, runs it as a forked suite (its new parameter
declared through the registry) and report.py reports it. Removing any one of its registrations is
refused in one line. The page's two published examples, judged by outputs: logit soft-capping (a scores step)
composed with reciprocal attention and with gated attention, refused on a fused path, and a composition that
skips a step caught by the smoke check; value residual (a cross-layer idea) at its identity and reading layer
0's values whatever layer 0 runs."""
import dataclasses

import pytest
import torch
import torch.nn as nn

import configurator
import ra_model
import report
import runtime
import sweep
from model import GPT, GPTConfig
from ra_model import RAConfig, RAGPT, Idea
from helpers import in_process, toy_args


TINY = dict(block_size=16, vocab_size=64, n_layer=2, n_head=2, n_embd=16)


def test_qk_norm_starts_from_the_baseline_weights_and_normalizes_each_heads_q_and_k():
    torch.manual_seed(0)
    base = GPT(GPTConfig(**TINY))
    torch.manual_seed(0)
    model = RAGPT(RAConfig(**TINY, qk_norm=True)).double()
    assert model.state_dict().keys() == base.state_dict().keys()  # no new parameter
    assert all(torch.equal(model.state_dict()[n].double(), t.double()) for n, t in base.state_dict().items())
    idx = torch.randint(0, 64, (2, 16), generator=torch.Generator().manual_seed(1))
    assert not torch.allclose(model(idx)[0].float(), base(idx)[0])  # the idea changes the forward
    attn, x = model.transformer.h[0].attn, torch.randn(2, 16, 16, dtype=torch.float64)
    q, k, v = (t.view(2, 16, 2, 8).transpose(1, 2) for t in attn.c_attn(x).split(16, dim=2))
    unit = lambda t: t / t.pow(2).mean(-1, keepdim=True).add(torch.finfo(t.dtype).eps).sqrt()
    scores = (unit(q) @ unit(k).transpose(-2, -1) / 8 ** 0.5).masked_fill(torch.ones(16, 16).triu(1).bool(),
                                                                          float("-inf"))
    heads = (scores.softmax(-1) @ v).transpose(1, 2).reshape(2, 16, 16)
    torch.testing.assert_close(attn(x), attn.c_proj(heads), atol=1e-10, rtol=0)


class ScoreTemperature:
    """The toy idea: each head's queries scaled by a learned temperature before the scores."""

    def __init__(self, config, mode=None, layer=None):
        super().__init__(config, mode, layer)
        self.toy_temperature = nn.Parameter(torch.ones(config.n_head, 1, 1))  # filled: no random draw

    def attend(self, q, k, v):
        return super().attend(q * self.toy_temperature.to(q.dtype), k, v)


@dataclasses.dataclass
class ToyConfig(RAConfig):
    toy_temp: bool = False  # the toy idea's key (in a real idea: a field of RAConfig itself)


TOY = Idea(keys=("toy_temp",), layers=ra_model.all_layers_if("toy_temp"), attention=ScoreTemperature,
           layer_params=lambda config, i: config.n_head, new_parameters=("toy_temperature",), gpt2_function=False,
           example=dict(toy_temp=True), extra_flops=ra_model.no_flops, kept_scores=ra_model.no_scores)
REGISTRATIONS = ("idea", "config field", "default")


@pytest.fixture
def register(monkeypatch):
    """Register the toy idea, leaving out the registrations named."""
    def register_without(*left_out):
        if "idea" not in left_out:
            monkeypatch.setitem(ra_model.IDEAS, "toy temperature", TOY)
        if "config field" not in left_out:
            monkeypatch.setitem(runtime.MODEL_TYPES, "ra", (RAGPT, ToyConfig))
        if "default" not in left_out:
            monkeypatch.setitem(runtime.DEFAULTS, "toy_temp", False)
        monkeypatch.setitem(runtime.MODEL_SWITCHES, "ra", tuple(idea.keys[0] for idea in ra_model.IDEAS.values()))
    return register_without


def toy_model(seed=0, **keys):
    torch.manual_seed(seed)
    return RAGPT(ToyConfig(**TINY, **keys))


def test_the_toy_idea_starts_as_the_baseline_and_changes_the_forward_once_it_moves(register):
    register()
    base, toy = toy_model(), toy_model(toy_temp=True)
    idx = torch.randint(0, 64, (2, 16), generator=torch.Generator().manual_seed(1))
    assert all(isinstance(block.attn, ScoreTemperature) for block in toy.transformer.h)
    assert {n for n in toy.state_dict()} - {n for n in base.state_dict()} == \
        {f"transformer.h.{i}.attn.toy_temperature" for i in range(2)}
    assert all(torch.equal(toy.state_dict()[n], t) for n, t in base.state_dict().items())  # same initial weights
    assert torch.equal(toy(idx)[0], base(idx)[0])  # identity start: the baseline bit for bit
    assert RAGPT.count_params(toy.config) == sum(p.numel() for p in toy.parameters())  # the registry's formula
    assert sorted(toy.fork_new_parameters()) == [f"transformer.h.{i}.attn.toy_temperature" for i in range(2)]
    with torch.no_grad():
        toy.transformer.h[1].attn.toy_temperature.fill_(3.0)
    assert not torch.allclose(toy(idx)[0], base(idx)[0])


def write_suite(tmp_path, **extra):
    path = tmp_path / "toy_suite.py"
    path.write_text(f"variants = {{'baseline': {{}}, 'toy': {{'toy_temp': True}}}}\nbaseline = 'baseline'\n"
                    f"seeds = [1, 2]\nmetric = 'val_loss'\nmin_effect = 0.01\nallowed = ['toy_temp']\nfork_at = 2\n"
                    f"overrides = {{'model_type': 'ra', 'learning_rate': 1e-2, 'batch_size': 4}}\n"
                    f"suite_dir = {str(tmp_path / 'out-toy')!r}\n")
    return str(path), str(tmp_path / "out-toy")


def test_the_toy_idea_is_planned_run_as_a_forked_suite_and_reported(register, data_dir, tmp_path, capsys):
    register()
    path, suite_dir = write_suite(tmp_path)
    args = [path, *toy_args(data_dir)]
    planned = sweep.main([*args, "--plan"])
    assert sorted(name for name, _, _ in planned) == ["baseline-seed1", "baseline-seed2", "toy-seed1", "toy-seed2",
                                                      "trunk-seed1", "trunk-seed2"]
    calls = []
    sweep.main(args, launch=in_process(calls))
    assert sorted(calls) == sorted(name for name, _, _ in planned)
    capsys.readouterr()
    report.main([suite_dir, f"--out={tmp_path / 'report'}"])
    text = open(tmp_path / "report" / "report.md").read()
    assert "toy" in text and "not comparable" not in text


@pytest.mark.parametrize("left_out", REGISTRATIONS)
def test_leaving_out_any_one_registration_is_refused_in_one_line(register, data_dir, tmp_path, left_out):
    register(left_out)
    path, _ = write_suite(tmp_path)
    with pytest.raises(configurator.ConfigError) as refused:
        sweep.main([path, *toy_args(data_dir), "--plan"])
    assert "toy_temp" in str(refused.value) and "\n" not in str(refused.value)


def test_a_new_parameter_the_idea_does_not_declare_is_refused_before_any_run(register, data_dir, tmp_path,
                                                                             monkeypatch):
    register()
    monkeypatch.setitem(ra_model.IDEAS, "toy temperature", dataclasses.replace(TOY, new_parameters=()))
    path, _ = write_suite(tmp_path)
    with pytest.raises(configurator.ConfigError, match="toy_temperature") as refused:
        sweep.main([path, *toy_args(data_dir), "--plan"])
    assert "\n" not in str(refused.value)


def test_every_registered_idea_exports_as_what_it_declares(register):
    """An idea that changes GPT-2's function is refused by the Hugging Face export, by its registration."""
    import export_checkpoint
    register()
    cfg = dict(runtime.DEFAULTS, model_type="ra", toy_temp=True)
    assert export_checkpoint.not_gpt2_reason(cfg) == "model_type='ra' with toy temperature"


# ----------------------------------------------------------------------------- the worked examples of issue 60

def sharp(seed=0, **keys):
    """A float64 RA model of TINY's shape whose attention projections are scaled up (O(1) scores, where a soft-cap
    and a reciprocal term matter)."""
    torch.manual_seed(seed)
    model = RAGPT(RAConfig(**TINY, **keys)).double().eval()
    with torch.no_grad():
        for name, p in model.named_parameters():
            if name.endswith(("attn.c_attn.weight", "attn.c_q.weight", "attn.c_kv.weight")):
                p.mul_(15.0)
    return model


IDX = torch.randint(0, 64, (2, 16), generator=torch.Generator().manual_seed(1))
MANUAL = dict(attn_impl="manual")
CAP = dict(attn_softcap=2.0, attn_impl="manual")
RA_LATE = dict(ra_pattern="late", ra_mode="mix", ra_alpha=0.5)


def logits(model):
    with torch.no_grad():
        return model(IDX)[0]


def test_soft_capping_caps_every_softmaxs_logits():
    model = sharp(**CAP)
    attn, x = model.transformer.h[0].attn, torch.randn(2, 16, 16, dtype=torch.float64)
    q, k, v = (t.view(2, 16, 2, 8).transpose(1, 2) for t in attn.c_attn(x).split(16, dim=2))
    scores = 2.0 * torch.tanh(q @ k.transpose(-2, -1) / 8 ** 0.5 / 2.0)
    heads = (scores.masked_fill(torch.ones(16, 16).triu(1).bool(), float("-inf")).softmax(-1) @ v)
    torch.testing.assert_close(attn(x), attn.c_proj(heads.transpose(1, 2).reshape(2, 16, 16)), atol=1e-10, rtol=0)


def test_soft_capping_composes_with_reciprocal_attention_by_their_outputs():
    """soft-cap + RA late differs from each alone; RA at a fixed alpha of 0 is soft-cap alone bit for bit, and
    a cap far above every score is RA alone."""
    both, cap, ra = logits(sharp(**CAP, **RA_LATE)), logits(sharp(**CAP)), logits(sharp(**MANUAL, **RA_LATE))
    assert not torch.allclose(both, cap) and not torch.allclose(both, ra)
    assert torch.equal(logits(sharp(**CAP, **dict(RA_LATE, ra_alpha=0.0))), cap)
    torch.testing.assert_close(logits(sharp(**dict(CAP, attn_softcap=1e7), **RA_LATE)), ra, atol=1e-9, rtol=0)


def test_soft_capping_composes_with_gated_attention_by_their_outputs():
    """soft-cap + gated attention differs from each alone; the gate at its function-preserving start (weight 0,
    c_proj doubled) is soft-cap alone bit for bit; a cap far above every score is gated attention alone."""
    both, cap = sharp(**CAP, attn_gate=True), logits(sharp(**CAP))
    assert not torch.allclose(logits(both), cap)
    assert not torch.allclose(logits(both), logits(sharp(**MANUAL, attn_gate=True)))
    torch.testing.assert_close(logits(sharp(**dict(CAP, attn_softcap=1e7), attn_gate=True)),
                               logits(sharp(**MANUAL, attn_gate=True)), atol=1e-9, rtol=0)
    for block in both.transformer.h:
        block.attn.preserve_fork_start()
    assert torch.equal(logits(both), cap)


def test_a_scores_step_on_a_fused_path_is_refused_in_one_line(data_dir, tmp_path):
    with pytest.raises(configurator.ConfigError) as refused:
        RAConfig(**TINY, attn_softcap=30.0, ra_pattern="late")
    assert str(refused.value) == ("attn_softcap=30.0 (logit soft-capping) changes the attention scores before the "
                                  "softmax, which attn_impl='sdpa' cannot apply (its fused kernels take no function "
                                  "of the scores): set attn_impl='manual'")
    path = tmp_path / "capped.py"  # and so at --plan, before anything trains
    path.write_text("variants = {'baseline': {}, 'capped': {'attn_softcap': 30.0}}\nbaseline = 'baseline'\n"
                    "seeds = [1, 2]\nmetric = 'val_loss'\nmin_effect = 0.01\nallowed = ['attn_softcap']\n"
                    f"overrides = {{'model_type': 'ra', 'learning_rate': 1e-2, 'batch_size': 4}}\n"
                    f"suite_dir = {str(tmp_path / 'out')!r}\n")
    with pytest.raises(configurator.ConfigError, match="attn_softcap=30.0 .* set attn_impl='manual'"):
        sweep.main([str(path), *toy_args(data_dir), "--plan"])


class SoftCapByHand:
    """The issue's soft-cap: attention computed in attend itself, so the reciprocal step below it never runs."""

    def attend(self, q, k, v):
        scores = (q @ k.transpose(-2, -1)) / q.size(-1) ** 0.5
        future = torch.ones(q.size(-2), q.size(-2), dtype=torch.bool).triu(1)
        return (self.softcap * torch.tanh(scores / self.softcap)).masked_fill(future, float("-inf")).softmax(-1) @ v

    def __init__(self, config, mode=None, layer=None):
        super().__init__(config, mode, layer)
        self.softcap = config.attn_softcap


def test_the_smoke_check_finds_a_composition_that_skips_a_step(monkeypatch):
    import test_all_architectures as script
    keys = dict(attn_softcap=1.0, attn_impl="manual", ra_pattern="late", ra_mode="mix")
    script.check("ra", keys)  # the registered soft-cap composes
    monkeypatch.setitem(ra_model.IDEAS, "logit soft-capping",
                        dataclasses.replace(ra_model.IDEAS["logit soft-capping"], attention=SoftCapByHand))
    with pytest.raises(AssertionError, match="'reciprocal attention' changes nothing in this composition"):
        script.check("ra", keys)


def set_value_lambdas(model, value):
    with torch.no_grad():
        for block in model.transformer.h[1:]:
            block.attn.value_lambda.fill_(value)
    return model


@pytest.mark.parametrize("keys", [{}, RA_LATE, dict(ra_pattern="all", ra_mode="mix"), dict(attn_gate=True)])
def test_value_residual_at_lambda_1_is_the_model_without_it(keys):
    """lam = 1 in every layer: the same model without the idea (bit for bit where the attention path is the same:
    value residual's layers split c_attn's output as the baseline does, RA mix's per-head view rounds otherwise)."""
    on = logits(set_value_lambdas(sharp(value_residual=True, **keys), 1.0))
    off = logits(sharp(**keys))
    if keys.get("ra_mode") == "mix":
        torch.testing.assert_close(on, off, atol=1e-10, rtol=0)
    else:
        assert torch.equal(on, off)
    assert not torch.allclose(logits(sharp(value_residual=True, **keys)), off)  # lam = 0.5: the idea acts


@pytest.mark.parametrize("keys", [dict(ra_pattern="all", ra_mode="mix"), dict(mla=True, mla_latent_dim=8)])
def test_value_residual_reads_layer_0s_values_whatever_layer_0_runs(keys):
    """At lam = 0 layer 1 attends with layer 0's values, taken where layer 0 makes them (c_attn's third, or MLA's
    value up-projection), whatever path layer 0's attention takes (RA mix, MLA)."""
    model = set_value_lambdas(sharp(value_residual=True, **keys), 0.0)
    made = {}
    first, second = model.transformer.h[0].attn, model.transformer.h[1].attn
    source = first.v_up if keys.get("mla") else first.c_attn
    source.register_forward_hook(lambda module, args, out: made.update(v=out[..., -16:]))
    second.register_forward_hook(lambda module, args, out: made.update(x=args[0], y=out))
    logits(model)
    first_values = made["v"].view(2, 16, -1, 8).transpose(1, 2).expand(2, 2, 16, 8)
    assert torch.equal(model.layer_state["first_values"], first_values)
    if not keys.get("mla"):
        q, k, _ = (t.view(2, 16, 2, 8).transpose(1, 2) for t in second.c_attn(made["x"]).split(16, dim=2))
        heads = ra_model.ReciprocalMixing.attend(second, q, k, first_values)
        torch.testing.assert_close(made["y"], second.c_proj(heads.transpose(1, 2).reshape(2, 16, 16)),
                                   atol=1e-10, rtol=0)


def test_value_residual_counts_one_lambda_per_layer_but_the_first_and_survives_recomputation():
    model = sharp(value_residual=True)
    assert RAGPT.count_params(model.config) == sum(p.numel() for p in model.parameters())
    assert sorted(model.fork_new_parameters()) == ["transformer.h.1.attn.value_lambda"]
    grads = []
    for keys in ({}, dict(activation_checkpointing=True), dict(attn_recompute=True)):
        model = sharp(value_residual=True, **keys).train()
        model(IDX, IDX)[1].backward()
        grads.append({n: p.grad for n, p in model.named_parameters()})
    for other in grads[1:]:
        assert all(torch.allclose(other[n], g, atol=1e-12, rtol=1e-9) for n, g in grads[0].items())
    assert grads[0]["transformer.h.0.attn.c_attn.weight"].abs().sum() > 0


def test_value_residual_compiles_each_block_to_one_graph_that_computes_what_eager_does():
    """Each block compiled on its own (parallel.compile_model): layer 0's write to the layer state and layer 1's
    read of it trace without a break (Dynamo replays the write), and the compiled model's logits are eager's."""
    torch._dynamo.reset()
    model = sharp(value_residual=True, ra_pattern="all", ra_mode="mix")
    eager = logits(model)
    x = torch.randn(2, 16, 16, dtype=torch.float64)
    for block in model.transformer.h:
        explained = torch._dynamo.explain(block)(x)
        assert (explained.graph_count, explained.graph_break_count) == (1, 0), explained.break_reasons
    for block in model.transformer.h:
        block.forward = torch.compile(block.forward, backend="eager", fullgraph=True)
    torch.testing.assert_close(logits(model), eager, atol=1e-12, rtol=0)
