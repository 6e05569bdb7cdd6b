"""The training loop's components on their own: when the Checkpointer saves and the Evaluator evaluates,
when StepMetrics reads the device (and that its deferred reads are the immediate ones), what a
checkpoint restores, and the sentences messages.py writes from their data."""
import types

import pytest
import torch

import messages
import runtime
from parallel import Checkpointer, Fork, ParallelLayout, Position, rng_state
from sharding import HeadChoice
from train import Evaluator, StepMetrics, TrainingDiverged, budget_reached


def cfg_of(**keys):
    return types.MappingProxyType(runtime.settle(dict(runtime.DEFAULTS, out_dir="unused", **keys)))


@pytest.mark.parametrize("enabled, start, checks", [
    (True, 0, {0: False, 3: False, 4: True, 8: True}),  # nothing trained at the start: nothing to save
    (True, 4, {4: False, 5: False, 8: True}),  # resumed at 4: its checkpoint is on disk already
    (False, 0, {4: False, 8: False}),
])
def test_the_checkpointer_saves_at_its_interval_and_at_the_stop(enabled, start, checks):
    checkpointer = Checkpointer(cfg_of(eval_interval=4, save_checkpoint=enabled), ParallelLayout())
    checkpointer.started(Position(iter_num=start))
    assert {it: checkpointer.will_save(it) for it in checks} == checks
    assert checkpointer.will_save(start + 1, "max_time") == enabled  # a stop is always due
    assert checkpointer.due(5, "signal") and not checkpointer.due(5)
    saved = []
    checkpointer.write = lambda *a: saved.append(a[0])
    assert checkpointer.save(Position(iter_num=start + 1), None, None) is False and saved == []


def test_the_evaluator_is_due_at_its_interval_at_eval_at_and_at_the_end_but_not_after_a_signal():
    ev = Evaluator(cfg_of(eval_interval=4, eval_at=[6], max_iters=10), ParallelLayout(), None, torch.nn.Linear(2, 2),
                   None, None, None, None, None)
    assert [it for it in range(11) if ev.due(it)] == [0, 4, 6, 8]
    assert ev.due(7, "max_time") and not ev.due(8, "signal")


def test_budgets_stop_at_the_first_spent():
    cfg = cfg_of(max_iters=10, max_tokens=1000, max_time=5.0)
    assert budget_reached(cfg, Position(3, 100, 1.0)) is None
    assert budget_reached(cfg, Position(10, 2000, 9.0)) == "max_iters"
    assert budget_reached(cfg, Position(3, 1000, 9.0)) == "max_tokens"
    assert budget_reached(cfg, Position(3, 100, 5.0)) == "max_time"


class Log:
    def __init__(self):
        self.events = []

    def event(self, kind, line, **fields):
        self.events.append((kind, line, fields))


def step_metrics(log_interval, scaler_enabled=False):
    cfg = cfg_of(log_interval=log_interval, eval_interval=100, max_iters=100, batch_size=2, block_size=4,
                 gradient_accumulation_steps=1)
    model = types.SimpleNamespace(estimate_mfu=lambda *a, **k: 0.5)
    act_norms = types.SimpleNamespace(read=lambda: {})
    scaler = torch.amp.GradScaler("cpu", enabled=scaler_enabled)
    log = Log()
    return StepMetrics(cfg, ParallelLayout(), model, act_norms, log, "float32", 1e12, scaler), log


def run_steps(metrics, losses, grad_norms):
    position, signals = Position(), types.SimpleNamespace(received=None)
    for loss, norm in zip(losses, grad_norms):
        metrics.start_step()
        metrics.end_step(torch.tensor(loss), torch.tensor(norm), 1e-3, position, signals)
    return position


def test_deferred_reads_log_the_values_an_immediate_read_gives():
    losses, norms = [4.0 + i / 7 for i in range(6)], [1.0 / (i + 3) for i in range(6)]
    every, log_every = step_metrics(1)
    third, log_third = step_metrics(3)
    run_steps(every, losses, norms)
    position = run_steps(third, losses, norms)
    assert third.unread == [] and position.iter_num == 6 and position.tokens_seen == 6 * 8
    values = lambda log: {f["iter"]: (f["loss"], f["grad_norm"]) for _, _, f in log.events}
    assert values(log_third) == {i: values(log_every)[i] for i in (3, 6)}
    assert values(log_every) == {i + 1: (torch.tensor(l).item(), torch.tensor(n).item())
                                 for i, (l, n) in enumerate(zip(losses, norms))}
    assert position.train_time > 0 and all(line.startswith(f"iter {f['iter']}: loss ") for _, line, f in log_third.events)


def test_a_non_finite_loss_read_late_names_its_own_step():
    metrics, _ = step_metrics(4)
    with pytest.raises(TrainingDiverged, match=r"loss became nan \(grad norm 1.0\) at iteration 2") as e:
        run_steps(metrics, [1.0, float("nan"), 1.0, 1.0], [1.0] * 4)
    assert e.value.iter_num == 2
    metrics, _ = step_metrics(2, scaler_enabled=True)  # float16's scaler skips an inf gradient's step
    run_steps(metrics, [1.0, 1.0], [float("inf"), 1.0])


def test_a_checkpoint_restores_the_position_optimizer_and_rng():
    layout = ParallelLayout()
    checkpointer = Checkpointer(cfg_of(), layout)
    model = torch.nn.Linear(3, 2)
    optimizer = torch.optim.AdamW(model.parameters())
    model(torch.ones(1, 3)).sum().backward()
    optimizer.step()
    torch.manual_seed(5)
    state = dict(optimizer=optimizer.state_dict(), rng=[rng_state("cpu")], iter_num=7, tokens_seen=70,
                 train_time=1.5, best_val_loss=2.5, scaler=torch.amp.GradScaler("cpu", enabled=False).state_dict())
    expected = torch.rand(3)
    fresh = torch.optim.AdamW(model.parameters())
    position = checkpointer.restore(state, model, fresh, None, torch.amp.GradScaler("cpu", enabled=False))
    assert position == Position(7, 70, 1.5, 2.5) and checkpointer.start_iter == 7
    assert torch.equal(torch.rand(3), expected)  # the RNG continues where the checkpoint was written
    assert torch.equal(fresh.state_dict()["state"][0]["exp_avg"], optimizer.state_dict()["state"][0]["exp_avg"])


def test_a_fork_is_one_record_its_event_and_its_position():
    fork = Fork(trunk="t", iter=5, tokens=50, train_time=1.0, loaded=9, new=2, optimizer_carried=8, start="own",
                best_val_loss=3.0)
    assert fork.position() == Position(5, 50, 1.0, 3.0)
    assert "best_val_loss" not in fork.event() and fork.event()["optimizer_carried"] == 8
    assert messages.fork(fork) == ("forked from t at iter 5: 9 tensors from the trunk, 2 new, optimizer state of 8 "
                                   "parameters carried")


def test_messages_say_why_from_the_data():
    assert messages.head_choice(HeadChoice("chunked", "cpu")).startswith("chunked (auto: on a CPU")
    exceeds = HeadChoice("chunked", "exceeds", needed=3 * 2**30, available=2**30, device="cuda:0")
    assert messages.head_choice(exceeds) == ("chunked (auto: the estimate with the full head's logits x 1.25, 3.0 GiB, "
                                            "exceeds the 1.0 GiB free on cuda:0)")
    end = dict(stop_reason="signal", signal="SIGTERM", iter=4, tokens=512, train_time=2.0, best_val_loss=3.25)
    assert messages.end(end, saved=True) == ("stopped by SIGTERM (checkpoint written; resume with --init_from=resume) "
                                             "at iter 4, 512 tokens, 2.0 s of training; best val loss 3.2500")
    assert messages.diverged(8, dict(train_loss=float("nan"), val_loss=1.0), kept=None).startswith(
        "iter 8: evaluation loss became train nan, val 1.0: stopping; no checkpoint was written")


def test_a_pretrained_init_is_settled_before_building_and_trains(data_dir, tmp_path):
    """init_from=<HF directory>: the config's model keys are the model's from resolve on (config.json,
    the checkpoint), never updated after the model is built."""
    import dataclasses
    import json
    import os

    import export_checkpoint
    import train
    from model import GPT
    from helpers import golden_args as args
    first, hf, second = (str(tmp_path / name) for name in ("first", "hf", "second"))
    train.main(args(data_dir, first, "--vocab_size=50304", "--n_embd=16", "--max_iters=2", "--lr_decay_iters=2",
                    "--ln_placement=pre"))
    export_checkpoint.main([f"--out_dir={first}", "--format=hf", f"--out={hf}"])
    extra = ("--init_from=" + hf, "--max_iters=2", "--lr_decay_iters=2", "--dropout=0.1", "--head_loss=full")
    settled = runtime.settle(dict(runtime.DEFAULTS, init_from=hf, dropout=0.1, head_loss="full"))
    model = GPT.from_pretrained(hf, **{k: settled[k] for k in runtime.PRETRAINED_OVERRIDES})
    assert {k: settled[k] for k in dataclasses.asdict(model.config)} == dataclasses.asdict(model.config)
    train.main(args(data_dir, second, *extra))
    written = json.load(open(os.path.join(second, "config.json")))
    assert {k: written[k] for k in dataclasses.asdict(model.config)} == dataclasses.asdict(model.config)
    assert written["n_embd"] == 16 and written["vocab_size"] == 50257
