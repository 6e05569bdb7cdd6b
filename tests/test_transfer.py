"""How far a fast answer carries (issue 39): a function-preserving start for parameters new at a
fork, the loss jump at the fork, the bridge from forked to from-scratch effects, and the ladder's
power and extrapolation bound."""
import math
import os

import numpy as np
import pytest

import rundir
import train
from ablation import bridge
from test_train import tiny_args

GATE = ("--model_type=ra", "--attn_gate=True")


def first_eval(out_dir):
    return next(e for e in rundir.read_events(out_dir) if e["event"] == "eval")


@pytest.fixture(scope="module")
def gate_branches(data_dir, tmp_path_factory):
    """A baseline trunk stopped at step 4 of 8, its baseline branch, and gated branches started
    'own' (the gate's seeded init) and 'preserve'."""
    tmp = tmp_path_factory.mktemp("gate_fork")
    trunk = str(tmp / "trunk")
    train.main(tiny_args(data_dir, trunk, "--model_type=ra", "--max_iters=4", "--lr_decay_iters=8"))
    out = {}
    for name, extra in (("base", ("--model_type=ra",)), ("own", GATE), ("preserve", (*GATE, "--fork_start=preserve"))):
        out[name] = str(tmp / name)
        train.main(tiny_args(data_dir, out[name], *extra, f"--fork_from={trunk}"))
    return out


def test_a_preserving_start_computes_the_trunks_function_and_the_seeded_gate_jumps(gate_branches):
    base, own, kept = (first_eval(gate_branches[k]) for k in ("base", "own", "preserve"))
    assert base["iter"] == own["iter"] == kept["iter"] == 4
    assert kept["val_loss"] == pytest.approx(base["val_loss"], abs=1e-6)
    assert kept["train_loss"] == pytest.approx(base["train_loss"], abs=1e-6)
    assert abs(own["val_loss"] - base["val_loss"]) > 1e-3  # a gate near 0.5 halves every head's output
    [event] = [e for e in rundir.read_events(gate_branches["preserve"]) if e["event"] == "fork"]
    assert event["start"] == "preserve" and event["new"] > 0


def test_a_preserving_start_is_refused_where_none_is_known(data_dir, tmp_path):
    import configurator
    trunk = str(tmp_path / "trunk")
    train.main(tiny_args(data_dir, trunk, "--model_type=ra", "--max_iters=4", "--lr_decay_iters=8"))
    with pytest.raises(configurator.ConfigError, match="no function-preserving start is known for .*ra_gate_logit"):
        train.main(tiny_args(data_dir, str(tmp_path / "b"), "--model_type=ra", "--ra_pattern=learned",
                             "--fork_start=preserve", f"--fork_from={trunk}"))
