"""What StepMetrics costs per step (issue 59): the allocator's peak read and reset only where the host
reads the device anyway, the activation-norm hooks recording only on the steps a log line reads, and
tokens_per_sec by the host's clock between reads (its gaps between steps included)."""
import time
import types

import torch

import devices
import evaluation
import runtime
from model import GPT, GPTConfig
from parallel import ParallelLayout, Position
from train import StepMetrics


class Log:
    def __init__(self):
        self.events = []

    def event(self, kind, line, **fields):
        self.events.append(fields)


def step_metrics(log_interval, act_norms=None, accum=1):
    cfg = types.MappingProxyType(runtime.settle(dict(
        runtime.DEFAULTS, out_dir="unused", log_interval=log_interval, eval_interval=100, max_iters=100, batch_size=2,
        block_size=4, gradient_accumulation_steps=accum)))
    model = types.SimpleNamespace(estimate_mfu=lambda *a, **k: 0.5)
    act_norms = act_norms or types.SimpleNamespace(read=lambda: {})
    log = Log()
    scaler = torch.amp.GradScaler("cpu", enabled=False)
    return StepMetrics(cfg, ParallelLayout(), model, act_norms, log, "float32", 1e12, scaler), log


def test_the_peak_is_read_and_reset_at_reads_not_at_every_step(monkeypatch):
    calls = []
    monkeypatch.setattr(devices, "peak_memory_mib", lambda device: calls.append("read") or 10.0 * len(calls))
    monkeypatch.setattr(devices, "reset_peak_memory", lambda device: calls.append("reset"))
    metrics, log = step_metrics(log_interval=3)
    position, signals = Position(), types.SimpleNamespace(received=None)
    for _ in range(6):
        metrics.start_step()
        metrics.end_step(torch.tensor(1.0), torch.tensor(1.0), 1e-3, position, signals)
    # a reset before the first step, a read at each of the two log lines and a reset at the step after the
    # first: 4 calls for 6 steps (what runs between a read and the next step, an evaluation or a checkpoint, is
    # no step's)
    assert calls == ["reset", "read", "reset", "read"]
    assert [e["peak_memory_mib"] for e in log.events] == [20.0, 40.0]  # each window's own peak
    assert metrics.take_step_peak() == 40.0  # an evaluation next
    metrics.start_step()
    assert calls[-1] == "reset"


def test_activation_norms_are_recorded_on_log_steps_only():
    torch.manual_seed(0)
    model = GPT(GPTConfig(n_layer=2, n_head=2, n_embd=16, block_size=8, vocab_size=32))
    norms = evaluation.ActivationNorms(model, [0, 1])
    recorded = []

    class Counting(dict):
        def __setitem__(self, key, value):
            recorded.append(key)
            super().__setitem__(key, value)

    norms.latest = Counting()
    metrics, log = step_metrics(log_interval=4, act_norms=norms, accum=2)
    position, signals = Position(), types.SimpleNamespace(received=None)
    x = torch.randint(32, (2, 8))
    for _ in range(8):
        metrics.start_step()
        for _ in range(2):  # micro-steps
            model(x, x)
        metrics.end_step(torch.tensor(1.0), torch.tensor(1.0), 1e-3, position, signals)
    # the first step (nothing known yet), then steps 4 and 8: 2 layers x 2 micro-steps each, not 8 steps' worth
    assert len(recorded) == 3 * 2 * 2
    assert [sorted(k for k in e if k.startswith("act_rms")) for e in log.events] == [["act_rms_layer0", "act_rms_layer1"]] * 2
    model(x, x)  # an evaluation's forward after the log line records nothing
    assert len(recorded) == 3 * 2 * 2


def test_tokens_per_sec_counts_the_host_time_between_steps():
    metrics, log = step_metrics(log_interval=2)
    position, signals = Position(), types.SimpleNamespace(received=None)
    for _ in range(2):
        metrics.start_step()
        metrics.end_step(torch.tensor(1.0), torch.tensor(1.0), 1e-3, position, signals)
        time.sleep(0.05)  # the host's work between steps (data, Python), outside the device's laps
    (record,) = log.events
    tokens_per_iter = metrics.cfg["tokens_per_iter"]
    assert record["step_time_ms"] < 20  # the device's laps: almost nothing ran
    # the wall clock from the first step's start to the read after the second: the sleep between them counts
    assert record["tokens_per_sec"] <= 2 * tokens_per_iter / 0.05
    assert tokens_per_iter / (record["step_time_ms"] / 1000) > 10 * record["tokens_per_sec"]  # the laps' rate
