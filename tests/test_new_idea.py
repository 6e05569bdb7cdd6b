"""A new idea (docs/new-idea.md). QK-norm, the page's worked example: off it is the baseline, on it
keeps the baseline's initial weights and computes its formula. And through the registry alone: a toy
idea (a learned per-head score temperature, 1 at the start) is its class, one ra_model.IDEAS entry,
its key as a config field and a runtime.DEFAULTS key. It starts as the baseline bit for bit and
changes the forward once it moves; sweep.py plans it, runs it as a forked suite (its new parameter
declared through the registry) and report.py reports it. Removing any one of its registrations is
refused in one line."""
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
