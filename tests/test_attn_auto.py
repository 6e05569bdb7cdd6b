"""attn_impl='auto' (ra_model.auto_impl): on a CPU it is SDPA bit for bit and says why; the chooser keeps
the faster path by its measurement, records both times, and falls back to SDPA when the fused kernel
fails; the model runs what was chosen; torch.compile never measures; train.py's checklist reports it."""
import pytest
import torch

import ra_model
import train
from helpers import VARIANTS, events, grads, ra_model as tiny_ra_model, tiny_args, tokens


@pytest.fixture(autouse=True)
def no_choices(monkeypatch):
    """Every test starts with nothing measured (the choices are the process's)."""
    monkeypatch.setattr(ra_model, "AUTO_CHOICES", {})


def forward_backward(model):
    _, loss = model(tokens((2, 12)), tokens((2, 12), seed=2))
    loss.backward()
    with torch.no_grad():
        logits, _ = model(tokens((2, 12)))
    return logits, loss.detach(), grads(model)


def assert_same_bits(a, b):
    (logits_a, loss_a, grads_a), (logits_b, loss_b, grads_b) = a, b
    assert torch.equal(logits_a, logits_b) and torch.equal(loss_a, loss_b)
    for name in grads_a:
        assert torch.equal(grads_a[name], grads_b[name]), name


@pytest.mark.parametrize("name", ["late-mix", "all-mix-window", "learned", "all-mix-alpha-head", "ra-mla"])
def test_auto_on_a_cpu_is_sdpa_bit_for_bit_and_says_why(name):
    """late-mix's standard layers too: they once ran the manual path under any attn_impl but 'sdpa'."""
    runs = [forward_backward(tiny_ra_model(**VARIANTS[name], attn_impl=impl)) for impl in ("sdpa", "auto")]
    assert_same_bits(*runs)
    records = list(ra_model.AUTO_CHOICES.values())
    assert records and all(r["impl"] == "sdpa" and r["sdpa_ms"] is r["fused_ms"] is None for r in records)
    assert all(r["reason"] == "the fused kernel runs on GPUs only, not cpu" and r["device"] == "cpu" for r in records)
    assert {r["dtype"] for r in records} == {"float32"}


def test_triton_on_a_cpu_runs_sdpa_in_the_standard_layers_too(monkeypatch):
    monkeypatch.setattr(ra_model.fused_kernels(), "INTERPRET", False)  # a CPU without the interpreter
    monkeypatch.setattr(ra_model, "_warned", set())
    sdpa = forward_backward(tiny_ra_model(**VARIANTS["late-mix"], attn_impl="sdpa"))
    with pytest.warns(UserWarning, match="running the PyTorch SDPA path"):
        assert_same_bits(sdpa, forward_backward(tiny_ra_model(**VARIANTS["late-mix"], attn_impl="triton")))


def test_auto_with_dropout_is_sdpa_untimed_while_training():
    model = tiny_ra_model(**VARIANTS["late-mix"], attn_impl="auto", dropout=0.1)
    model(tokens((2, 12)), tokens((2, 12), seed=2))
    (record,) = ra_model.AUTO_CHOICES.values()
    assert record["dropout"] and record["impl"] == "sdpa" and record["fused_ms"] is None
    assert record["reason"] == "the fused kernel has no attention dropout"


@pytest.mark.parametrize("sdpa_ms, fused_ms, impl", [(2.0, 1.0, "triton"), (1.0, 2.0, "sdpa"), (1.5, 1.5, "sdpa")],
                         ids=["fused-faster", "sdpa-faster", "tie"])
def test_the_faster_path_is_chosen_and_both_times_recorded(sdpa_ms, fused_ms, impl):
    record = ra_model.choose_faster(lambda: sdpa_ms, lambda: fused_ms)
    assert record["impl"] == impl and record["sdpa_ms"] == sdpa_ms and record["fused_ms"] == fused_ms
    assert f"fused {fused_ms:.3f} ms, SDPA {sdpa_ms:.3f} ms" in record["reason"]


def test_a_failing_fused_kernel_leaves_sdpa_with_the_failure_as_reason():
    def fused_fails():
        raise RuntimeError("out of resources: shared memory\n(pages of compiler output)")

    record = ra_model.choose_faster(lambda: 3.0, fused_fails)
    assert record == dict(impl="sdpa", sdpa_ms=3.0, fused_ms=None,
                          reason="the fused kernel failed (RuntimeError: out of resources: shared memory)")


def fake_gpu(monkeypatch, sdpa_ms, fused_ms):
    """A CPU dressed as a GPU where the fused kernel can run: device_ms runs a step once and answers the
    next of the given times; the 'fused kernel' is the SDPA path, counting its calls."""
    times, fused_calls = iter([sdpa_ms, fused_ms]), []

    def device_ms(step, repeats, warmup):
        step()
        return next(times)

    def fused(q, k, v, mode, alpha, gate_logit, window, dropout_p, kq=None):
        fused_calls.append(torch.is_grad_enabled())
        p = None if gate_logit is None else torch.sigmoid(gate_logit)
        return ra_model.reciprocal_sdpa(q, k, v, mode, alpha, p, window, dropout_p, kq)

    why_not = ra_model.why_not_auto_fused  # dropout still rules the fused kernel out
    monkeypatch.setattr(ra_model, "why_not_auto_fused", lambda q, k, v, p: why_not(q, k, v, p) if p > 0 else None)
    monkeypatch.setattr(ra_model, "device_ms", device_ms)
    monkeypatch.setattr(ra_model, "reciprocal_triton", fused)
    return fused_calls


@pytest.mark.parametrize("sdpa_ms, fused_ms, impl", [(2.0, 1.0, "triton"), (1.0, 2.0, "sdpa")])
def test_the_model_runs_the_chosen_path(monkeypatch, sdpa_ms, fused_ms, impl):
    """One gate layer (two layers, 'alternate'): the first forward, without gradients, measures both paths
    with gradients on, then every call runs the chosen one."""
    fused_calls = fake_gpu(monkeypatch, sdpa_ms, fused_ms)
    model = tiny_ra_model(**dict(VARIANTS["alternate-gate"], n_layer=2), attn_impl="auto")
    with torch.no_grad():
        model(tokens((2, 12)))
    (record,) = ra_model.AUTO_CHOICES.values()
    assert fused_calls == [True] + ([False] if impl == "triton" else [])  # the measurement's step, then the call
    assert record["impl"] == impl and (record["sdpa_ms"], record["fused_ms"]) == (sdpa_ms, fused_ms)
    assert (record["mode"], record["q_shape"], record["window"]) == ("gate", (2, 2, 12, 8), 0)
    fused_calls.clear()
    model(tokens((2, 12)), tokens((2, 12), seed=2))[1].backward()
    assert fused_calls == ([True] if impl == "triton" else [])


def test_measure_auto_measures_the_training_shape_and_keeps_the_random_state(monkeypatch):
    fake_gpu(monkeypatch, 2.0, 1.0)
    model = tiny_ra_model(**VARIANTS["late-mix"], attn_impl="auto", dropout=0.1)
    state = torch.get_rng_state()
    choices = ra_model.measure_auto(model, 3, "cpu", torch.autocast("cpu", enabled=False))
    assert torch.equal(torch.get_rng_state(), state) and model.training
    by_dropout = {record["dropout"]: record for record in choices.values()}
    assert by_dropout[True]["impl"] == "sdpa" and by_dropout[False]["impl"] == "triton"  # training, evaluation
    assert {record["q_shape"] for record in choices.values()} == {(3, 2, 12, 8)}


def test_a_model_handed_another_ranks_choices_runs_them_unmeasured(monkeypatch):
    """What train.py does under torchrun: rank 0 measures (measure_attn_auto), every rank's model takes
    the choices (use_attn_auto) and runs them without timing anything itself."""
    fused_calls = fake_gpu(monkeypatch, 2.0, 1.0)
    model = tiny_ra_model(**dict(VARIANTS["alternate-gate"], n_layer=2), attn_impl="auto")
    choices = model.measure_attn_auto(2, "cpu", torch.autocast("cpu", enabled=False), False)
    assert {record["impl"] for record in choices.values()} == {"triton"}
    monkeypatch.setattr(ra_model, "AUTO_CHOICES", {})  # another rank: nothing measured there
    monkeypatch.setattr(ra_model, "measure_choice", lambda *a: pytest.fail("a handed-over choice was measured"))
    other = tiny_ra_model(**dict(VARIANTS["alternate-gate"], n_layer=2), attn_impl="auto")
    other.use_attn_auto(choices)
    fused_calls.clear()
    with torch.no_grad():
        other(tokens((2, 12)))
    assert ra_model.AUTO_CHOICES == choices and fused_calls == [False]  # the chosen kernel, untimed


def test_compiling_never_measures_and_reads_the_recorded_choice(monkeypatch):
    fused_calls = fake_gpu(monkeypatch, 2.0, 1.0)
    model = tiny_ra_model(**dict(VARIANTS["all-mix-window"], n_layer=1), attn_impl="auto")
    block, x = model.transformer.h[0], torch.randn(2, 12, 16)
    with torch.no_grad():
        unmeasured = torch.compile(block, backend="eager", fullgraph=True)(x)
        assert ra_model.AUTO_CHOICES == {} and fused_calls == []  # traced without a measurement: SDPA
        torch.testing.assert_close(unmeasured, block(x))  # eagerly: measured (with gradients), 'triton' runs
        assert fused_calls == [True, False]
        torch._dynamo.reset()
        torch.compile(block, backend="eager", fullgraph=True)(x)
    assert fused_calls == [True, False, False]  # the compiled block runs the recorded choice


def test_train_reports_the_choice_in_its_checklist(data_dir, tmp_path):
    out = str(tmp_path / "run")
    train.main(tiny_args(data_dir, out, "--model_type=ra", "--ra_pattern=late", "--attn_impl=auto", "--max_iters=1",
                         "--lr_decay_iters=1", "--warmup_iters=0"))
    checklist = events(out, "checklist")[0]
    (record,) = checklist["attn_auto"]
    assert record == dict(device="cpu", dtype="float32", q_shape=[4, 2, 16, 16], v_shape=[4, 2, 16, 16], mode="mix",
                          window=0, dropout=False, impl="sdpa", sdpa_ms=None, fused_ms=None,
                          reason="the fused kernel runs on GPUs only, not cpu")
    assert checklist["sdpa_backend"] != "not used (attn_impl='auto')"


def test_gpu_check_fails_a_slower_or_untimed_choice():
    import gpu_check
    record = dict(mode="mix", q_shape=[8, 4, 256, 64], dropout=False, impl="sdpa", sdpa_ms=1.0, fused_ms=2.0,
                  reason="measured: fused 2.000 ms, SDPA 1.000 ms (forward + backward)")
    assert gpu_check.auto_choice_row([record])["status"] == "pass"
    assert gpu_check.auto_choice_row([dict(record, impl="triton")])["status"] == "FAIL"  # the slower one
    untimed = dict(record, sdpa_ms=None, fused_ms=None, reason="the fused kernel runs on GPUs only, not cpu")
    assert gpu_check.auto_choice_row([record, untimed])["status"] == "FAIL"
    assert gpu_check.auto_choice_row([])["status"] == "FAIL"
    assert gpu_check.auto_choice_row([record])["measured"] == "mix T=256: sdpa"


@pytest.mark.parametrize("compiled", [True, False])
def test_the_auto_measurement_times_the_compiled_paths_when_the_model_compiles(monkeypatch, compiled):
    """train.py compiles the blocks after measure_auto: timing the eager paths chose for a run that never
    happens. With compiled=True each path's timed step runs its torch.compile'd callable (counted here),
    and a call measured after measure_auto (an eager evaluation's new shape) is timed eagerly again."""
    fused_calls = fake_gpu(monkeypatch, 2.0, 1.0)
    compiled_runs = []

    def counting_compile(fn, **options):
        def run(*args):
            compiled_runs.append(fn)
            return fn(*args)
        return run

    monkeypatch.setattr(torch, "compile", counting_compile)
    model = tiny_ra_model(**dict(VARIANTS["alternate-gate"], n_layer=2), attn_impl="auto")
    choices = ra_model.measure_auto(model, 2, "cpu", torch.autocast("cpu", enabled=False), compiled=compiled)
    (record,) = choices.values()
    assert record["impl"] == "triton" and record["compiled"] is compiled
    assert fused_calls == [True, False, False]  # the timed step, then measure_auto's training and evaluation forwards
    assert len(compiled_runs) == (2 if compiled else 0) and len(set(compiled_runs)) == len(compiled_runs)
    fake_gpu(monkeypatch, 2.0, 1.0)
    with torch.no_grad():
        model(tokens((3, 12)))  # another batch size: measured now, outside measure_auto
    assert len(ra_model.AUTO_CHOICES) == 2 and len(compiled_runs) == (2 if compiled else 0)
