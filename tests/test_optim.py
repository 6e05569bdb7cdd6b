"""optim.py: pruning scores, schedules and masks, AdamW-SPAM, their train.py integration and resume."""
import copy
import math
import os

import pytest
import torch

import configurator
import optim
import runtime
import train
from model import GPT, GPTConfig
from helpers import events, load_ckpt, tiny_args

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def direct_score(name, w, m, v):
    """The formulas of docs/experiments.md, one element at a time in float64."""
    eps = 1e-8
    if name in ("magnitude", "bitter1", "bitter2"):
        return abs(w)
    if name == "bitter0":
        return abs(w * m) * abs(w) / (math.sqrt(v) + eps)
    if name in ("bitter3", "bitter4"):
        return abs(w) * math.sqrt(abs(m) + eps)
    if name == "bitter5":
        movement = -math.copysign(1.0, w) * m / (math.sqrt(v) + eps) if w else 0.0
        return -movement + 0.1 * abs(w)
    if name == "bitter6":
        return abs(w) * math.sqrt(abs(m) + eps) * math.sqrt(m * m / (v + eps))
    if name == "bitter7":
        return abs(w) * (abs(v) + eps) ** 0.25
    raise KeyError(name)


@pytest.mark.parametrize("name", sorted(optim.SCORES))
def test_each_score_matches_a_direct_computation(name):
    g = torch.Generator().manual_seed(0)
    w, m = torch.randn(5, 7, generator=g, dtype=torch.float64), torch.randn(5, 7, generator=g, dtype=torch.float64)
    v = torch.rand(5, 7, generator=g, dtype=torch.float64) * 1e-3
    w[0, 0] = 0.0  # a pruned weight
    got = optim.SCORES[name](w, m, v)
    want = torch.tensor([[direct_score(name, *(t[i, j].item() for t in (w, m, v))) for j in range(7)]
                         for i in range(5)], dtype=torch.float64)
    torch.testing.assert_close(got, want, rtol=1e-12, atol=0)


def test_ramps_reach_the_target_at_ramp_end():
    for ramp, mid in (("linear", 0.25), ("cubic", 0.0625)):
        values = [optim.sparsity_at(t, 0.5, 100, 300, ramp) for t in range(0, 400)]
        assert values[99] == values[100] == 0.0 and values[200] == pytest.approx(mid)
        assert values[300] == values[399] == 0.5 and values[299] < 0.5
        assert all(a <= b for a, b in zip(values, values[1:]))


def prune_cfg(**kw):
    cfg = dict(runtime.DEFAULTS, pruning="state", prune_score="bitter7", target_sparsity=0.6, prune_start=4,
               prune_interval=5, prune_ramp_end=36, prune_ramp="cubic", max_iters=50)
    cfg.update(kw)
    return cfg


def train_tiny(cfg, steps, check, tie_weights=True):
    """A 2-layer model on random tokens, with the train.py order of pruning calls around each step."""
    torch.manual_seed(0)
    model = GPT(GPTConfig(n_layer=2, n_head=2, n_embd=16, block_size=8, vocab_size=32, bias=False,
                          tie_weights=tie_weights))
    optimizer = optim.build_optimizer(model, dict(cfg, learning_rate=1e-2, weight_decay=0.1))
    pruner = optim.Pruner(model, optimizer, cfg, cfg["max_iters"])
    for step in range(1, steps + 1):
        x = torch.randint(0, 32, (4, 8))
        _, loss = model(x, torch.roll(x, 1, 1))
        loss.backward()
        pruner.mask_grads()
        check(pruner, "grads", step)
        grad_norm = torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        optimizer.step(**optim.step_kwargs(optimizer, grad_norm))
        optimizer.zero_grad(set_to_none=True)
        pruner.step(step)
        check(pruner, "step", step)
    return model, optimizer, pruner


@pytest.mark.parametrize("optimizer, score, ramp", [
    ("adamw", "bitter7", "cubic"), ("adamw_spam", "bitter0", "linear"), ("adam", "bitter5", "cubic"),
    ("sgd", "magnitude", "linear"),
])
def test_masks_follow_the_schedule_and_masked_entries_stay_zero(optimizer, score, ramp):
    cfg = prune_cfg(optimizer=optimizer, pruning="magnitude" if score == "magnitude" else "state",
                    prune_score=score, prune_ramp=ramp, momentum=0.9)
    total = []
    updates = []

    def check(pruner, when, step):
        n = sum(m.numel() for m in pruner.masks.values())
        total[:] = [n]
        pruned = sum(int((~m).sum()) for m in pruner.masks.values())
        if when == "step" and pruner.is_update_step(step):
            expected = optim.sparsity_at(step, 0.6, 4, 36, ramp) * n
            assert abs(pruned - expected) <= 1, (step, pruned, expected)
            updates.append(step)
        for name, p in pruner.params.items():
            off = ~pruner.masks[name]
            if when == "grads":
                assert p.grad is not None and not p.grad[off].any()
                continue
            assert not p[off].any()
            for key, buf in pruner.optimizer.state[p].items():
                if torch.is_tensor(buf) and buf.shape == p.shape:
                    assert not buf[off].any(), key

    model, optimizer_, pruner = train_tiny(cfg, 50, check)
    assert updates == [4, 9, 14, 19, 24, 29, 34, 36]
    metrics = pruner.metrics()
    assert metrics["sparsity"] == pytest.approx(0.6, abs=1 / total[0])
    assert metrics["sparsity_target"] == 0.6
    assert set(metrics) == {"sparsity", "sparsity_target", "sparsity_layer0", "sparsity_layer1"}
    assert "lm_head.weight" not in pruner.params and "tied" in pruner.describe()
    assert model.lm_head.weight.count_nonzero() == model.lm_head.weight.numel()  # the tied matrix is whole


def test_bitter4_prunes_deeper_layers_more():
    cfg = prune_cfg(prune_score="bitter4", target_sparsity=0.5)
    _, _, pruner = train_tiny(cfg, 36, lambda *a: None)
    m = pruner.metrics()
    # 2 blocks: scale 0.7 for block 0 and 1.3 for block 1, each within one weight.
    assert m["sparsity_layer0"] == pytest.approx(0.35, abs=1e-3) and m["sparsity_layer1"] == pytest.approx(0.65, abs=1e-3)


def test_an_untied_head_is_pruned_like_any_linear():
    _, _, pruner = train_tiny(prune_cfg(target_sparsity=0.5), 36, lambda *a: None, tie_weights=False)
    assert "lm_head.weight" in pruner.params and not pruner.excluded
    m = pruner.metrics()
    assert m["sparsity"] == pytest.approx(0.5, abs=1e-3) and 0 < m["sparsity_head"] < 1


def test_sampled_threshold_is_close_to_the_exact_one():
    scores = torch.randn(100_000, generator=torch.Generator().manual_seed(0))
    exact = optim.prune_count(scores, 30_000)
    assert int((~exact).sum()) == 30_000
    sampled = optim.prune_sampled(scores, torch.ones_like(exact), 30_000, 20_000, torch.Generator().manual_seed(1))
    assert abs(int((~sampled).sum()) - 30_000) < 1500
    ties = optim.prune_count(torch.zeros(10), 4)  # all tied: exactly k, the first positions
    assert ties.tolist() == [False] * 4 + [True] * 6


def spam(**kw):
    w = torch.nn.Parameter(torch.ones(64))
    return w, optim.AdamWSPAM([w], lr=1e-2, betas=(0.9, 0.95), **kw)


def test_spam_spike_is_detected_clipped_and_training_stays_finite():
    w, opt = spam(reset_interval=0)
    signs = torch.randn(64, generator=torch.Generator().manual_seed(0)).sign()
    for step in range(1, 41):
        w.grad = (0.01 if step % 2 else 0.012) * signs  # a steady norm (z-scores about 1)
        if step == 30:
            w.grad = w.grad * 1e4  # an injected spike
        v_before = opt.state[w]["exp_avg_sq"].clone() if opt.state else None
        opt.step()
        if step == 29:
            assert opt.spam["spikes"] == 0 and opt.spam["clipped"] == 0
        if step == 30:
            assert opt.spam["spikes"] == 1 and opt.spam["clipped"] == 64  # every entry spiked
            # v *= 0.9, then the clipped g^2 <= theta * v_hat enters: without clipping v would grow ~1e8-fold.
            assert (opt.state[w]["exp_avg_sq"] <= 50 * v_before / (1 - 0.95 ** 29) * 0.05 + v_before).all()
    assert opt.spam["spikes"] == 1
    assert torch.isfinite(w).all() and (w - 1).abs().max() < 1.0


def test_spam_steps_without_reading_the_device():
    """No float(grad_norm), no int(clipped): a step queues its work (issue 59); `spam` reads the device when
    asked, and the counts and history are those of the step-by-step reads (the spike test above)."""
    from torch.utils._python_dispatch import TorchDispatchMode

    class Reads(TorchDispatchMode):  # .item(), float(), int() and .tolist() of a tensor all come here
        count = 0

        def __torch_dispatch__(self, func, types, args=(), kwargs=None):
            Reads.count += func is torch.ops.aten._local_scalar_dense.default
            return func(*args, **(kwargs or {}))

    w, opt = spam(reset_interval=5)
    signs = torch.randn(64, generator=torch.Generator().manual_seed(0)).sign()
    norms = []
    with Reads():
        for step in range(1, 13):
            w.grad = (1e4 if step == 9 else 0.01 + 0.002 * (step % 2)) * signs
            norms.append(torch.linalg.vector_norm(w.grad))
            opt.step(grad_norm=norms[-1])
    assert Reads.count == 0
    assert opt.spam["spikes"] == 1 and opt.spam["clipped"] == 64 and opt.spam["resets"] == 2
    assert opt.spam["norms"] == [float(n) for n in norms] and opt.spam["total_step"] == 12


def test_spam_does_not_freeze_entries_without_gradient_history():
    """An embedding row gets its first gradient only when its token first appears: v == 0 there
    must not mean a clipping limit of 0."""
    w, opt = spam(reset_interval=0)
    for step in range(1, 6):
        w.grad = torch.zeros(64)
        w.grad[: 32 if step < 4 else 64] = 0.1
        opt.step()
    assert (w[32:] < 1).all() and opt.spam["clipped"] == 0


def test_spam_resets_at_the_configured_steps_only():
    w, opt = spam(reset_interval=10, rewarm=4)
    resets, scales = [], []
    for step in range(1, 36):
        w.grad = torch.full((64,), 0.1)
        scales.append(opt.lr_scale())
        before = opt.spam["resets"]
        opt.step()
        if opt.spam["resets"] > before:
            resets.append(step)
            assert opt.state[w]["step"] == 1  # bias correction restarted with the fresh m and v
            assert torch.allclose(opt.state[w]["exp_avg"], torch.full((64,), 0.01))
    assert resets == [11, 21, 31]
    rewarm = [0.5 * (1 - math.cos(math.pi * k / 4)) for k in (1, 2, 3)]
    assert scales[:10] == [1.0] * 10
    assert scales[10:15] == pytest.approx([*rewarm, 1.0, 1.0])  # steps 11..15
    assert scales[20:24] == pytest.approx([*rewarm, 1.0])


def test_spam_state_dict_round_trips_the_history():
    w, opt = spam(reset_interval=3)
    for _ in range(5):
        w.grad = torch.randn(64)
        opt.step()
    w2, opt2 = spam(reset_interval=3)
    opt2.load_state_dict(copy.deepcopy(opt.state_dict()))  # as through torch.save: no shared tensors
    assert opt2.spam == opt.spam and opt2.spam["norms"] is not opt.spam["norms"]
    for o in (opt, opt2):
        o.param_groups[0]["params"][0].grad = torch.ones(64)
    w2.data.copy_(w.data)
    opt.step()
    opt2.step()
    assert torch.equal(w, w2)


SPAM_PRUNE = ("--optimizer=adamw_spam", "--pruning=state", "--prune_score=bitter3", "--prune_start=2",
              "--prune_interval=2", "--spam_interval=3", "--spam_warmup=2", "--dropout=0.1", "--prune_ramp=linear",
              "--prune_ramp_end=8")  # fixed, like tiny_args' lr_decay_iters: the split run stops at 4


def test_resume_with_pruning_and_spam_reproduces_the_uninterrupted_run(data_dir, tmp_path):
    straight, split = str(tmp_path / "straight"), str(tmp_path / "split")
    train.main(tiny_args(data_dir, straight, *SPAM_PRUNE))
    train.main(tiny_args(data_dir, split, *SPAM_PRUNE, "--max_iters=4"))
    train.main(tiny_args(data_dir, split, *SPAM_PRUNE, "--init_from=resume"))
    losses = lambda out: {r["iter"]: r["loss"] for r in events(out, "train")}
    assert losses(split) == losses(straight)
    a, b = load_ckpt(straight), load_ckpt(split)
    for key in a["model"]:
        assert torch.equal(a["model"][key], b["model"][key]), key
    assert a["optimizer"]["spam"] == b["optimizer"]["spam"] and a["optimizer"]["spam"]["resets"] == 2
    assert all(torch.equal(a["pruning"]["masks"][k], b["pruning"]["masks"][k]) for k in a["pruning"]["masks"])
    final = events(straight, "eval")[-1]
    assert final["sparsity"] == pytest.approx(0.5, abs=1e-3) and final["sparsity_target"] == 0.5
    assert {"sparsity_layer0", "sparsity_layer1", "spam_resets", "memory_ratio"} <= set(final)
    assert events(straight, "pruning")[0]["excluded"] == ["lm_head.weight (tied to transformer.wte.weight)"]
    varies = ("time", "memory_ratio", "peak_memory_mib")  # clocks, and the pytest process's RSS
    same = lambda e: {k: v for k, v in e.items() if k not in varies}
    assert same(events(split, "eval")[-1]) == same(final)


def test_spam_catches_a_loss_spike_inside_train(data_dir, tmp_path, monkeypatch):
    """train.py hands SPAM the gradient norm before clipping: a 1e4x loss spike is one more spike."""
    args = lambda out: tiny_args(data_dir, out, "--optimizer=adamw_spam", "--spam_interval=0")
    calm, spiked = str(tmp_path / "calm"), str(tmp_path / "spiked")
    train.main(args(calm))
    real_forward = GPT.forward
    calls = []

    def forward_with_a_spike(self, idx, targets=None, **kwargs):
        logits, loss = real_forward(self, idx, targets, **kwargs)
        if self.training:
            calls.append(1)
            if len(calls) in (11, 12):  # both micro-steps of iteration 6
                loss = loss * 1e4
        return logits, loss

    monkeypatch.setattr(GPT, "forward", forward_with_a_spike)
    train.main(args(spiked))
    assert events(spiked, "train")[5]["grad_norm"] > 1e3
    assert events(spiked, "eval")[-1]["spam_spikes"] == events(calm, "eval")[-1]["spam_spikes"] + 1
    assert all(math.isfinite(r["loss"]) for r in events(spiked, "train")[6:]) and events(spiked, "end")


@pytest.mark.parametrize("extra, message", [
    (["--optimizer=lion"], "optimizer='lion'"),
    (["--pruning=random"], "pruning='random'"),
    (["--pruning=state", "--prune_score=bitter9"], "prune_score='bitter9'"),
    (["--pruning=state", "--optimizer=sgd"], "use an Adam optimizer or pruning='magnitude'"),
    (["--pruning=magnitude", "--target_sparsity=1.0"], "target_sparsity"),
    (["--pruning=magnitude", "--prune_start=8"], "lower prune_start"),
    (["--optimizer=adamw_spam", "--spam_warmup=2000"], "shorten spam_warmup"),
    (["--optimizer=sgd", "--nesterov=True", "--momentum=0.0"], "nesterov"),
])
def test_bad_optimizer_and_pruning_keys_fail_at_startup(data_dir, tmp_path, extra, message):
    with pytest.raises(configurator.ConfigError, match=message):
        train.main(tiny_args(data_dir, str(tmp_path / "run"), *extra))


NEW_CONFIGS = ["train_gpt2_adamw.py", "train_gpt2_adamwspam.py", "train_gpt2_adamwspam_magnitude50.py",
               *(f"train_gpt2_adamwprune_bitter{b}_50.py" for b in (0, 1, 2, 3, 7)), "train_wikitext2.py"]


@pytest.mark.parametrize("name", NEW_CONFIGS)
def test_new_configs_apply_and_validate(name):
    path = os.path.join(REPO, "config", name)
    cfg = configurator.apply_config(runtime.DEFAULTS, [path])
    runtime.resolve(dict(cfg), 1)
    if name.startswith("train_gpt2"):  # the pruning / MLA study's recipe, shared from config/train_gpt2.py
        # the study's step: 128 sequences of 1024 (their micro-batch 32 x 4, ours 16 x 8 to split over 8 GPUs)
        assert (cfg["dataset"], cfg["block_size"], cfg["batch_size"] * cfg["gradient_accumulation_steps"]) == \
            ("finewebedu", 1024, 128)
        assert (cfg["learning_rate"], cfg["weight_decay"], cfg["warmup_iters"], cfg["min_lr"]) == (6e-4, 0.1, 2000, 6e-5)
        assert cfg["max_iters"] == (12100 if "bitter2" in name else 10000) and cfg["eval_interval"] == 500
        assert cfg["dtype"] == "bfloat16" and cfg["compile"] and cfg["out_dir"] != "out-gpt2-124M"
        small = configurator.apply_config(runtime.DEFAULTS, [path, os.path.join(REPO, "config", "small_shakespeare.py")])
        runtime.resolve(small, 1)
        assert (small["dataset"], small["n_layer"], small["compile"], small["max_iters"]) == ("shakespeare", 4, False, 300)
        assert (small["optimizer"], small["pruning"], small["prune_score"]) == \
            (cfg["optimizer"], cfg["pruning"], cfg["prune_score"])
    if "bitter" in name:
        assert cfg["pruning"] == "state" and cfg["prune_score"] == name.split("_")[3] and cfg["target_sparsity"] == 0.5



# ---------------------------------------------------------------- optimizer implementations

@pytest.mark.parametrize("optimizer", ["sgd", "adamw"])
def test_optimizer_impls_are_the_ones_asked_for_and_agree(optimizer):
    """fused, foreach and the for-loop: the implementation each name selects, and (under SGD, where
    a step is linear in the gradient) the same weights after three steps."""
    weights = {}
    for impl in ("fused", "foreach", "for_loop"):
        torch.manual_seed(0)
        model = GPT(GPTConfig(n_layer=2, n_head=2, n_embd=32, block_size=16, vocab_size=64))
        opt = optim.build_optimizer(model, dict(runtime.DEFAULTS, optimizer=optimizer, optimizer_impl=impl,
                                                learning_rate=1e-2))
        assert bool(opt.defaults["fused"]) == (impl == "fused") and bool(opt.defaults["foreach"]) == (impl == "foreach")
        for step in range(3):
            idx = torch.randint(0, 64, (2, 16), generator=torch.Generator().manual_seed(step))
            model(idx, idx)[1].backward()
            opt.step()
            opt.zero_grad(set_to_none=True)
        weights[impl] = model.state_dict()
    if optimizer == "sgd":
        for impl in ("fused", "foreach"):
            for name, w in weights["for_loop"].items():
                torch.testing.assert_close(weights[impl][name], w, rtol=1e-6, atol=1e-7, msg=f"{impl} {name}")


def test_unknown_optimizer_impl_fails_at_start_up():
    with pytest.raises(configurator.ConfigError, match="optimizer_impl='fast'"):
        optim.validate(dict(runtime.DEFAULTS, optimizer_impl="fast"), 100)
