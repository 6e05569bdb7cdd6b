"""Warmup-and-fork (forking.py, sweep.py's fork_at): a baseline branch is the baseline's own
continuation bit for bit; a variant takes the trunk's tensors and optimizer state by name and keeps
its own new parameters; a fork suite trains one trunk per seed before its branches, resumes exactly
after a crash anywhere, states its design, and is never pooled with runs from scratch; the
separately seeded sources of randomness."""
import json
import os
import re
import shutil
import subprocess
import sys

import pytest
import torch

import configurator
import forking
import optim
import parallel
import rundir
import runtime
import sweep
import tokendata
import train
from ablation import compare, suites
from helpers import LR, Finished, fork_suite, in_process, load_ckpt, suite_args, tiny_args, write_suite

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
RA = ("--model_type=ra", "--dropout=0.1")  # dropout: the trunk's RNG state must carry into the branch


def losses(out_dir):
    return {e["iter"]: e["loss"] for e in rundir.read_events(out_dir) if e["event"] == "train"}


def trunk_and_straight(data_dir, tmp_path, *extra):
    """A 12-step run, and a trunk of the same recipe stopped at step 5 on the 12-step schedule."""
    straight, trunk = str(tmp_path / "straight"), str(tmp_path / "trunk")
    common = (*RA, "--max_iters=12", "--lr_decay_iters=0", *extra)
    train.main(tiny_args(data_dir, straight, *common))
    train.main(tiny_args(data_dir, trunk, *common, "--max_iters=5", "--lr_decay_iters=12"))
    return straight, trunk, common


@pytest.mark.parametrize("extra", [(), ("--optimizer=adamw_spam", "--spam_interval=4", "--spam_warmup=2")],
                         ids=["adamw", "adamw_spam"])  # SPAM: its spike statistics and reset clock carry too
def test_a_baseline_branch_is_the_uninterrupted_run_bit_for_bit(data_dir, tmp_path, extra):
    straight, trunk, common = trunk_and_straight(data_dir, tmp_path, *extra)
    branch = str(tmp_path / "branch")
    train.main(tiny_args(data_dir, branch, *common, f"--fork_from={trunk}"))
    assert sorted(losses(branch)) == list(range(6, 13))
    assert all(losses(branch)[i] == losses(straight)[i] for i in losses(branch))
    a, b = load_ckpt(straight), load_ckpt(branch)
    for key in a["model"]:
        assert torch.equal(a["model"][key], b["model"][key]), key
    same = lambda x, y: torch.equal(x, y) if torch.is_tensor(x) else x == y
    assert all(same(x, y) for s, t in zip(a["optimizer"]["state"].values(), b["optimizer"]["state"].values())
               for x, y in zip(s.values(), t.values()))
    assert a["optimizer"].get("spam") == b["optimizer"].get("spam")
    [event] = [e for e in rundir.read_events(branch) if e["event"] == "fork"]
    assert (event["iter"], event["new"], event["trunk"]) == (5, 0, trunk)


def test_a_branch_on_another_data_order_continues_its_trunk_on_other_batches(data_dir, tmp_path):
    """data_order: the forked true null (the baseline continued on another batch order). 0 is the
    original stream; k >= 1 an independent one; a branch may set it apart from its trunk."""
    cfg = lambda **keys: {**runtime.DEFAULTS, "seed": 1, "batch_size": 4, "block_size": 16, **keys}
    batches = lambda c, it=3: tokendata.train_offsets(c, 10_000, it, 0).tolist()
    assert batches(cfg(data_order=0)) == batches({k: v for k, v in cfg().items() if k != "data_order"})
    assert len({str(batches(cfg(data_order=k), it)) for k in range(4) for it in (3, 4)}) == 8
    straight, trunk, common = trunk_and_straight(data_dir, tmp_path)
    branch = str(tmp_path / "branch")
    train.main(tiny_args(data_dir, branch, *common, f"--fork_from={trunk}", "--data_order=1"))
    [event] = [e for e in rundir.read_events(branch) if e["event"] == "fork"]
    assert event["iter"] == 5 and sorted(losses(branch)) == list(range(6, 13))
    assert all(losses(branch)[i] != losses(straight)[i] for i in losses(branch))  # other batches from step 6
    with pytest.raises(configurator.ConfigError, match="data_order must be an integer >= 0"):
        train.main(tiny_args(data_dir, str(tmp_path / "bad"), "--data_order=-1"))


def test_a_variant_takes_the_trunks_tensors_and_optimizer_state_and_keeps_its_own_additions(data_dir, tmp_path):
    _, trunk, _ = trunk_and_straight(data_dir, tmp_path)
    ckpt = forking.read_trunk(runtime.settle(dict(configurator.apply_config(runtime.DEFAULTS, tiny_args(
        data_dir, "x", *RA, "--max_iters=12", "--lr_decay_iters=0", "--ra_pattern=learned", "--attn_gate=True")),
        fork_from=trunk)))
    cfg = dict(ckpt["config"], ra_pattern="learned", attn_gate=True)
    torch.manual_seed(7)
    model = runtime.build_model(dict(cfg, init_from="scratch"))
    own_init = {n: p.detach().clone() for n, p in model.named_parameters()}
    loaded, new = forking.load_weights(ckpt, model)
    news = model.fork_new_parameters()
    assert new == len(news) == 3 * 2 and loaded == len(model.state_dict()) - new  # gate logit, c_gate w and b per layer
    for name, p in model.named_parameters():
        want = own_init[name] if name in news else ckpt["model"][name]
        assert torch.equal(p.detach(), want), name
    optimizer = optim.build_optimizer(model, cfg)
    assert parallel.load_optimizer(ckpt, model, optimizer, fresh=False) == len(ckpt["param_names"])
    trunk_state = {n: ckpt["optimizer"]["state"][i] for i, n in enumerate(ckpt["param_names"])}
    for name, p in model.named_parameters():
        state = optimizer.state.get(p, {})
        if name in news:
            assert not state, name  # Adam's moments of a new parameter start at zero
        else:
            assert torch.equal(state["exp_avg"], trunk_state[name]["exp_avg"]), name
            assert torch.equal(state["step"], trunk_state[name]["step"]), name
    fresh = optim.build_optimizer(model, cfg)
    assert parallel.load_optimizer(ckpt, model, fresh, fresh=True) == 0 and not fresh.state


@pytest.mark.parametrize("extra, message", [
    (("--learning_rate=2e-2",), r"training recipe differs from its trunk's \(learning_rate: branch 0.02 vs trunk 0.01\)"),
    (("--lr_decay_iters=20",), r"lr_decay_iters: branch 20 vs trunk 12"),
    (("--mla=True", "--mla_latent_dim=8"), "the branch's model cannot continue the trunk's"),
])
def test_a_branch_the_trunk_cannot_continue_is_refused_in_one_line(data_dir, tmp_path, extra, message):
    _, trunk, common = trunk_and_straight(data_dir, tmp_path)
    with pytest.raises(configurator.ConfigError, match=message) as e:
        train.main(tiny_args(data_dir, str(tmp_path / "b"), *common, f"--fork_from={trunk}", *extra))
    assert "\n" not in str(e.value)


def test_an_unfinished_or_damaged_trunk_is_named_in_one_line(data_dir, tmp_path):
    _, trunk, common = trunk_and_straight(data_dir, tmp_path)
    branch = lambda: train.main(tiny_args(data_dir, str(tmp_path / "b"), *common, f"--fork_from={trunk}"))
    with open(os.path.join(trunk, "ckpt.pt"), "r+b") as f:
        f.truncate(500)
    with pytest.raises(rundir.RunDirError, match=f"trunk checkpoint is damaged: .*delete {trunk} and run the suite"):
        branch()
    shutil.rmtree(trunk)
    with pytest.raises(configurator.ConfigError, match="the trunk is missing, not finished"):
        branch()
    assert not os.path.exists(tmp_path / "b" / "ckpt.pt")


class Crash(Exception):
    pass


def crash_args(data_dir, path):
    """Forked at 10 of 16 steps, checkpoints every 4."""
    return [a for a in suite_args(data_dir, path) if not a.startswith("--eval_interval=")] + ["--eval_interval=4"]


@pytest.fixture(scope="module")
def uninterrupted_fork_suite(data_dir, tmp_path_factory):
    """(suite_dir, run names in launch order) of a fork suite run without a crash."""
    path, suite_dir = fork_suite(tmp_path_factory.mktemp("clean"), fork_at=10)
    calls = []
    sweep.main(crash_args(data_dir, path), launch=in_process(calls))
    return suite_dir, calls


def test_a_fork_suite_runs_seed_by_seed_each_trunk_first_and_states_its_design(uninterrupted_fork_suite):
    suite_dir, calls = uninterrupted_fork_suite
    assert calls == ["trunk-seed1", "base-seed1", "learned-seed1", "trunk-seed2", "base-seed2", "learned-seed2"]
    report = json.load(open(os.path.join(suite_dir, "report.json")))
    assert report["design_code"] == "forked" and report["fork_at"] == 10  # from a shared baseline trunk per seed
    assert not report["measurement_problems"] and report["compared_at_tokens"] == 16 * 12 * 16 * 2
    # issue 40: the trunks' cost beside the branches' own. Issue 58: the learned branch (1.07x FLOPs per
    # token) reaches the baseline's budget at 10 + 6 / 1.07 = 15.6 of 16 iterations, mid-schedule: a fork
    # has no run whose schedule ends there, so the equal-FLOPs view says so instead of reading a value
    assert report["trunk_cost"]["runs"] == 2 and report["trunk_cost"]["tokens_per_sec"] > 0
    matched = report["variants"]["learned"]["compute_matched"]
    assert json.load(open(os.path.join(suite_dir, "learned-seed1", "config.json")))["eval_at"] == []
    assert matched["verdict"] == "not evaluated" and matched["reasons"] == [dict(code="no_schedule_end_run")]


CRASHES = [("trunk-seed1", 3), ("trunk-seed1", 7), ("learned-seed1", 11), ("learned-seed1", 14)]


def test_a_fork_suite_resumes_exactly_after_a_crash_anywhere(data_dir, tmp_path, monkeypatch, uninterrupted_fork_suite):
    """A crash in trunk step 3 or branch step 11 finds no checkpoint of the run's own (the trunk starts
    again, the branch forks again); in trunk step 7 or branch step 14 the run resumes from its own.
    One suite crashes at each point in turn, each rerun going on to the next crash (each rerun builds on
    what the last recovery left, so any inexact recovery shows at the end): the suite's numbers are the
    uninterrupted suite's, bit for bit."""
    clean_dir, calls = uninterrupted_fork_suite
    path, crash_dir = fork_suite(tmp_path, fork_at=10)
    real_offsets, seen = train.train_offsets, []

    def crashing(cfg, n_tokens, iter_num, global_micro_step):
        pending = CRASHES[len(seen)] if len(seen) < len(CRASHES) else None
        if pending == (os.path.basename(cfg["out_dir"]), iter_num + 1) and global_micro_step == 1:
            seen.append(pending)  # in the middle of the step, between its two micro-batches
            raise Crash(f"{pending[0]} in step {pending[1]}")
        return real_offsets(cfg, n_tokens, iter_num, global_micro_step)

    monkeypatch.setattr(train, "train_offsets", crashing)
    for _ in CRASHES:
        with pytest.raises(Crash):
            sweep.main(crash_args(data_dir, path), launch=in_process([]))
    sweep.main(crash_args(data_dir, path), launch=in_process([]))
    assert seen == CRASHES
    for name in calls:
        assert losses(os.path.join(crash_dir, name)) == losses(os.path.join(clean_dir, name)), name
    clean, crashed = (json.load(open(os.path.join(d, "report.json"))) for d in (clean_dir, crash_dir))
    assert {v: e.get("differences") for v, e in crashed["variants"].items()} == \
        {v: e.get("differences") for v, e in clean["variants"].items()}


def test_forked_and_scratch_runs_are_never_pooled(data_dir, tmp_path):
    path, forked_dir = fork_suite(tmp_path, seeds=(1,))
    sweep.main(suite_args(data_dir, path), launch=in_process([]))
    scratch = str(tmp_path / "scratch")
    train.main(tiny_args(data_dir, scratch, "--model_type=ra", "--seed=2", "--max_iters=16", "--lr_decay_iters=16",
                         "--eval_interval=8", "--learning_rate=3e-3", "--min_lr=3e-4"))
    runs = {("base", 1): rundir.read_run(os.path.join(forked_dir, "base-seed1")),
            ("base", 2): rundir.read_run(scratch)}
    [problem] = [p for p in compare.measurement_problems(runs, []) if p["code"] == "designs"]
    assert problem["designs"] == [dict(fork_at=6, runs=["base-seed1"]), dict(fork_at=None, runs=["scratch"])]
    with open(path, "a") as f:  # the trunks on disk stopped at 6: another fork point is another suite
        f.write("fork_at = 8\n")
    with pytest.raises(configurator.ConfigError, match="declared fork_at=6 before its runs; this suite says 8"):
        sweep.main(suite_args(data_dir, path), launch=in_process([]))


def test_a_fork_suite_refuses_what_it_cannot_fork_before_any_run(data_dir, tmp_path):
    variants = {"base": {"model_type": "ra", **LR}, "lr": {"model_type": "ra", "learning_rate": 1e-3, "min_lr": 1e-4}}
    path, suite_dir = write_suite(tmp_path, variants, ["learning_rate", "min_lr"], seeds=(1,))
    with open(path, "a") as f:
        f.write("fork_at = 6\n")
    with pytest.raises(configurator.ConfigError, match="lr cannot continue the baseline's trunk, its training recipe "
                                                       "differs \\(learning_rate: 0.001 vs 0.003"):
        sweep.main(suite_args(data_dir, path), launch=in_process([]))
    with open(path, "a") as f:
        f.write("fork_at = 16\n")
    with pytest.raises(configurator.ConfigError, match="fork_at=16 is not before the runs' last iteration"):
        sweep.main(suite_args(data_dir, path), launch=in_process([]))
    assert not os.path.exists(suite_dir)


def test_each_source_of_randomness_has_its_own_seed(data_dir, tmp_path):
    cfg = lambda **keys: {**runtime.DEFAULTS, "seed": 1, "batch_size": 4, "block_size": 16, **keys}
    batches = lambda c: tokendata.train_offsets(c, 10_000, 3, 0).tolist()
    assert batches(cfg(data_seed=5)) == batches(cfg(seed=5)) != batches(cfg())
    assert batches(cfg(init_seed=5)) == batches(cfg())
    runs = {}
    for name, keys in (("base", ()), ("init", ("--init_seed=9",)), ("data", ("--data_seed=9",))):
        runs[name] = str(tmp_path / name)
        train.main(tiny_args(data_dir, runs[name], "--seed=1", "--max_iters=2", *keys))
    facts = {n: rundir.read_run_info(d)["facts"] for n, d in runs.items()}
    assert facts["init"]["data_order"] == facts["base"]["data_order"] != facts["data"]["data_order"]
    assert facts["data"]["init_weights"] == facts["base"]["init_weights"] != facts["init"]["init_weights"]
    with pytest.raises(configurator.ConfigError, match="init_seed must be >= 0, or -1 to follow seed"):
        train.main(tiny_args(data_dir, str(tmp_path / "bad"), "--init_seed=-2"))


def test_the_final_evaluation_reads_final_eval_iters_batches(data_dir, tmp_path, monkeypatch):
    out = str(tmp_path / "run")
    read = []
    real = tokendata.eval_offsets
    monkeypatch.setattr(tokendata, "eval_offsets", lambda cfg, n, batches=0: read.append(batches) or real(cfg, n, batches))
    train.main(tiny_args(data_dir, out, "--final_eval_iters=7"))
    # evaluations at steps 0, 4 and 8 (train, val each); only the last val reads 7 batches
    assert read[-6:] == [0, 0, 0, 0, 0, 7]
    info = rundir.read_run_info(out)["facts"]
    other = str(tmp_path / "other")
    train.main(tiny_args(data_dir, other))
    assert rundir.read_run_info(other)["facts"]["eval_windows"] != info["eval_windows"]


def test_eval_at_adds_an_evaluation_read_like_the_final_one(data_dir, tmp_path, monkeypatch):
    """eval_at: an evaluation at a given iteration (off the eval_interval grid) on final_eval_iters
    batches, and no checkpoint."""
    out = str(tmp_path / "run")
    read = []
    real = tokendata.eval_offsets
    monkeypatch.setattr(tokendata, "eval_offsets", lambda cfg, n, batches=0: read.append(batches) or real(cfg, n, batches))
    train.main(tiny_args(data_dir, out, "--final_eval_iters=7", "--eval_at=[6]"))
    evals = [e["iter"] for e in rundir.read_events(out) if e["event"] == "eval"]
    assert evals == [0, 4, 6, 8] and read[-8:] == [0, 0, 0, 0, 0, 7, 0, 7]
    with pytest.raises(configurator.ConfigError, match="eval_at"):
        train.main(tiny_args(data_dir, str(tmp_path / "bad"), "--eval_at=[9]"))


def launched_span(suite_dir):
    """The suite's runs from the first start to the last exit, as the local launcher timed them."""
    lines = [json.loads(line) for line in open(os.path.join(suite_dir, suites.LAUNCHES))]
    return max(e["end"] for e in lines) - min(e["start"] for e in lines)


@pytest.mark.alone
def test_the_planners_time_for_a_fork_suite_is_within_a_quarter_of_the_measured_suite(data_dir, tmp_path, capsys):
    """A 2-seed pilot (real train.py processes, two at a time) times a seed; --plan for 4 seeds then
    estimates the suite's minutes, and the 4-seed suite is run and timed the same way."""
    pilot_path, pilot_dir = fork_suite(tmp_path / "pilot", seeds=(1, 2))
    args = lambda path: [*suite_args(data_dir, path), "--cpu_runs=2"]
    sweep.main(args(pilot_path))
    path, suite_dir = fork_suite(tmp_path / "suite", seeds=(1, 2, 3, 4))
    capsys.readouterr()
    sweep.main([*args(path), "--plan=True", f"--pilot={pilot_dir}", "--budget=10h"])
    plan = capsys.readouterr().out
    assert f"from pilot {pilot_dir} (forked at step 6 from a shared baseline trunk per seed" in plan
    per_seed = float(re.search(r"wall time per seed: ([\d.]+) s \(2 runs of median [\d.]+ s \+ its trunk", plan).group(1))
    # ten hours fit at least 2 seeds of seconds each on any machine (a budget too short for 2: test_sweep)
    n = int(re.search(r"budget 600 min: (\d+) seeds", plan).group(1))
    # another suite's pilot: the seeds proposed start after the pilot's (disjoint), here 3
    assert n >= 2 and f"so: seeds = list(range(3, {3 + n})) in the suite file (disjoint from the pilot's)" in plan, plan
    estimate = 4 * per_seed / 2
    sweep.main(args(path))
    measured = launched_span(suite_dir)
    assert abs(estimate - measured) <= 0.25 * measured, (estimate, measured)
    # seeds 1 and 2 ran in another order, beside other runs: their numbers are the pilot's, bit for bit
    for name in ("trunk-seed1", "base-seed2", "learned-seed1", "learned-seed2"):
        assert losses(os.path.join(suite_dir, name)) == losses(os.path.join(pilot_dir, name)), name


def test_plan_compares_designs_and_a_budget_chooses_the_seeds(data_dir, tmp_path, capsys):
    """Two pilots, one per design: --plan prints each one's sd, time per seed and what a budget buys."""
    fork_path, fork_dir = fork_suite(tmp_path / "fork")
    sweep.main(suite_args(data_dir, fork_path), launch=in_process([]))
    variants = {"base": {"model_type": "ra", **LR}, "learned": {"model_type": "ra", "ra_pattern": "learned", **LR}}
    scratch_path, scratch_dir = write_suite(tmp_path, variants, ["ra_pattern"], seeds=(1, 2), name="scratch")
    sweep.main(suite_args(data_dir, scratch_path), launch=in_process([]))
    for pilot in (scratch_dir, fork_dir):  # every run took 10 s: the plan's times are the test's, not the machine's load
        with open(os.path.join(pilot, suites.LAUNCHES), "w") as f:
            f.writelines(json.dumps(dict(run=run, start=0.0, end=10.0, exit=0)) + "\n" for run in sorted(os.listdir(pilot))
                         if os.path.exists(os.path.join(pilot, run, "log.jsonl")))
    capsys.readouterr()
    sweep.main([*suite_args(data_dir, fork_path), "--plan=True", f"--pilot={scratch_dir},{fork_dir}", "--budget=2m"])
    plan = capsys.readouterr().out
    assert f"from pilot {scratch_dir} (every run trained from scratch" in plan
    assert f"from pilot {fork_dir} (forked at step 6" in plan
    assert plan.count("wall time per seed") == 2
    assert "wall time per seed: 20 s (2 runs of median 10 s, as timed in the pilot)" in plan
    assert "wall time per seed: 30 s (2 runs of median 10 s + its trunk, 10 s, as timed in the pilot)" in plan
    # each design's seed count fills the budget: its time is at most the budget (the printed minutes
    # are rounded); here a fork's seed costs more (its trunk, as long as a branch), not less
    chosen = [(int(n), int(m)) for n, m in re.findall(r"budget 2 min: (\d+) seeds \(about (\d+) min\)", plan)]
    assert len(chosen) == 2 and all(n >= 2 and m <= 2 for n, m in chosen), plan
    assert plan.splitlines()[-1] == f"  so: seeds = list(range(1, {chosen[1][0] + 1})) in the suite file, declared " \
                                    f"before its runs"
    with pytest.raises(configurator.ConfigError, match="--budget='half an hour': a wall-clock time such as 30m"):
        sweep.main([*suite_args(data_dir, fork_path), "--plan=True", "--budget=half an hour"])


def test_a_fork_suite_refuses_an_mla_variant_and_a_boolean_fork_at_before_any_run(data_dir, tmp_path):
    """Issue 41: an MLA variant was refused only after the trunks had trained; fork_at=True was read as 1."""
    variants = {"base": {"model_type": "ra", **LR}, "mla": {"model_type": "ra", "mla": True, "mla_latent_dim": 16, **LR}}
    path, suite_dir = write_suite(tmp_path, variants, ["mla", "mla_latent_dim"], seeds=(1,))
    with open(path, "a") as f:
        f.write("fork_at = 6\n")
    calls = []
    with pytest.raises(configurator.ConfigError, match="fork_at: mla-seed1: the branch's model cannot continue the "
                                                       "trunk's \\(trunk tensors the branch lacks"):
        sweep.main(suite_args(data_dir, path), launch=in_process(calls))
    assert calls == [] and not os.path.exists(suite_dir)
    with open(path, "a") as f:
        f.write("fork_at = True\n")
    with pytest.raises(configurator.ConfigError, match="fork_at=True: the iteration at which every variant leaves"):
        sweep.main(suite_args(data_dir, path), launch=in_process(calls))


def scripted_runs(calls, outcome):
    """A launcher that writes each run's log as `outcome(name)` says (finished, diverged or paused by a
    signal with exit 3) instead of training."""
    def launch(argv, gpu, log_path):
        cfg = configurator.apply_config(runtime.DEFAULTS, argv)
        name = os.path.basename(cfg["out_dir"])
        calls.append(name)
        with open(os.path.join(cfg["out_dir"], "config.json"), "w") as f:
            json.dump(runtime.resolve(cfg, 1), f)
        log = rundir.RunLog(dict(runtime.DEFAULTS, out_dir=cfg["out_dir"]), True)
        log.event("checklist", "started")
        kind, code = outcome(name), 0
        if kind == "diverged":
            log.event("diverged", "loss became nan", iter=3)
            code = 1
        elif kind == "paused":
            log.event("end", "stopped by SIGTERM", stop_reason="signal", iter=3, tokens=1)
            code = 3
        else:
            log.event("end", "done", stop_reason="max_iters", iter=cfg["max_iters"], tokens=1)
        log.close()
        return Finished(code)
    return launch


def test_a_diverged_trunk_and_a_paused_branch_say_what_to_do(data_dir, tmp_path, capsys):
    """Issue 41: a diverged trunk failed its branches on every rerun with "did not finish" while --status
    said "submit again"; a branch stopped by SIGTERM after its checkpoint showed "FAILED (exit 3)"."""
    path, suite_dir = fork_suite(tmp_path, seeds=(1,))
    with pytest.raises(RuntimeError, match="3 runs failed: trunk-seed1, base-seed1, learned-seed1"):
        sweep.main(suite_args(data_dir, path), launch=scripted_runs([], lambda n: "diverged" if "trunk" in n else ""))
    out = capsys.readouterr().out
    assert f"FAILED base-seed1: its trunk {os.path.join(suite_dir, 'trunk-seed1')} diverged and would diverge again " \
           f"on every rerun: change the recipe" in out
    sweep.main([*suite_args(data_dir, path), "--status"])
    assert "its branches cannot start: its trunk" in capsys.readouterr().out
    path, suite_dir = fork_suite(tmp_path / "again", seeds=(1,))
    with pytest.raises(RuntimeError, match="^1 runs paused by a signal with a checkpoint: base-seed1 \\(run the same "
                                           "command to resume them\\)$"):
        sweep.main(suite_args(data_dir, path), launch=scripted_runs([], lambda n: "paused" if n == "base-seed1" else ""))
    out = capsys.readouterr().out
    assert "paused base-seed1 (stopped by a signal after writing a checkpoint" in out and "FAILED" not in out


def test_a_stale_trunk_after_a_recipe_change_is_named_at_plan_time(data_dir, tmp_path):
    """Issue 41: after a recipe change the finished trunk (old recipe) was kept and its branches failed
    with no what-to-do; a deleted trunk was said to have not finished."""
    path, suite_dir = fork_suite(tmp_path, seeds=(1,))
    calls = []
    sweep.main(suite_args(data_dir, path), launch=scripted_runs(calls, lambda n: ""))
    assert calls == ["trunk-seed1", "base-seed1", "learned-seed1"]
    with pytest.raises(configurator.ConfigError, match=r"3 run\(s\) in .* were started with another recipe than this "
                                                       r"sweep plans: trunk-seed1 \(weight_decay=0.1 there, 0.2 now\)"):
        sweep.main([*suite_args(data_dir, path), "--weight_decay=0.2"], launch=scripted_runs(calls, lambda n: ""))
    assert len(calls) == 3
    assert "is missing (deleted?): run the same command again to retrain it" in sweep.trunk_problem(str(tmp_path / "x"))


# ----------------------------------------------------------------------------- issue 50: round five

def test_a_variant_named_like_a_trunk_is_refused_at_plan_time_not_looped_on(data_dir, tmp_path):
    """Issue 50: a variant named `trunk` makes `trunk-seed1`, its seed's trunk's own name: the branch
    waited for itself and the sweep looped forever, starting nothing."""
    variants = {"base": {"model_type": "ra", **LR}, "trunk": {"model_type": "ra", "ra_pattern": "learned", **LR}}
    path, suite_dir = write_suite(tmp_path, variants, ["ra_pattern"], seeds=(1,))
    with open(path, "a") as f:
        f.write("fork_at = 6\n")
    proc = subprocess.run([sys.executable, "sweep.py", *suite_args(data_dir, path)], cwd=REPO,
                          env=dict(os.environ, OMP_NUM_THREADS="1"), capture_output=True, text=True, timeout=120)
    assert proc.returncode == 1 and "Traceback" not in proc.stderr
    assert [line for line in proc.stderr.splitlines() if line.strip()] == [
        "error: the run 'trunk-seed1' would be planned twice: a variant may not take a name the sweep gives its own "
        "runs (trunk-seed<s>: a fork's trunk, scratch-<variant>-seed<s>: a bridge run, lrcheck-x<f>-seed<s>, "
        "<variant>-flops-seed<s>: a run that ends at the baseline's FLOPs): rename the variant"]
    assert not os.path.exists(suite_dir)
    variants = {"base": {"model_type": "ra", **LR}, "scratch-base": {"model_type": "ra", "ra_pattern": "learned", **LR}}
    path, _ = write_suite(tmp_path, variants, ["ra_pattern"], seeds=(1,), name="bridged")
    with open(path, "a") as f:  # the bridge's own run of base, seed 1, is scratch-base-seed1 too
        f.write("fork_at = 6\nbridge_seeds = [1, 2]\n")
    with pytest.raises(configurator.ConfigError, match="^the run 'scratch-base-seed1' would be planned twice"):
        sweep.main([*suite_args(data_dir, path), "--dry_run=True"])


def test_a_preserving_start_no_variant_has_is_refused_before_any_trunk_trains(data_dir, tmp_path):
    """Issue 50: fork_start='preserve' on RA learn (its gate logit has no preserving start) was refused
    only after the trunk and the baseline branch had trained."""
    path, suite_dir = fork_suite(tmp_path, seeds=(1,))
    calls = []
    with pytest.raises(configurator.ConfigError, match="^fork_at: learned-seed1: fork_start='preserve': no "
                                                       "function-preserving start is known for .*ra_gate_logit") as e:
        sweep.main([*suite_args(data_dir, path), "--fork_start=preserve"], launch=in_process(calls))
    assert "\n" not in str(e.value) and calls == [] and not os.path.exists(suite_dir)


def test_the_pairing_of_a_true_null_on_data_order_holds():
    """Issue 50: every pairing line of the forked true null (allowed = ['data_order']) said "different data
    order", the very difference the suite declares; an undeclared one is still named."""
    run = lambda order: dict(info=dict(facts=dict(data_order=order, init_weights={"w": ["(4,)", "x"]})))
    assert compare.pairing(run("order1"), run("order0"), ["data_order"]) == []
    assert compare.pairing(run("order1"), run("order0"), []) == [dict(code="data_order")]


# ----------------------------------------------------------------------------- the start check (starts_as_trunk)

TINY_RA = dict(runtime.DEFAULTS, model_type="ra", n_layer=4, n_head=2, n_embd=32, vocab_size=64, block_size=16)


@pytest.fixture
def fresh_verdicts(monkeypatch):
    """starts_as_trunk answers each pair of models once per process: a test that changes a model's code starts anew."""
    monkeypatch.setattr(forking, "_verdicts", {})


@pytest.mark.parametrize("keys, starts", [
    ({}, True),
    (dict(ra_pattern="all", ra_mode="mix", ra_alpha=0.0), True),  # no reciprocal term
    (dict(attn_gate=True, fork_start="preserve"), True),  # gate 0.5 and c_proj doubled
    (dict(attn_gate=True), False),  # the gate at its own init halves every head
    (dict(value_residual=True), False),  # lambda at its own 0.5
    (dict(qk_norm=True), False),
    (dict(ra_pattern="layers", ra_layers=[3], ra_mode="swap"), False),  # one reciprocal layer, the last
])
def test_a_branch_starts_as_its_trunk_only_where_it_computes_the_trunks_function(fresh_verdicts, keys, starts):
    why = forking.starts_as_trunk(dict(TINY_RA, **keys), TINY_RA)
    assert (why is None) == starts, why


def test_a_preserving_start_that_does_not_preserve_is_caught(fresh_verdicts, monkeypatch):
    """The gate's start without its c_proj doubled: every head's output halved at the fork."""
    import ra_model
    gate = dict(TINY_RA, attn_gate=True, fork_start="preserve")
    assert forking.starts_as_trunk(gate, TINY_RA) is None

    def gate_only(self):  # the gate at 0.5, c_proj as the trunk's
        for p in self.c_gate.parameters():
            p.zero_()
        return [f"c_gate.{n}" for n, _ in self.c_gate.named_parameters()], None

    monkeypatch.setattr(ra_model.GatedOutput, "preserve_fork_start", gate_only)
    forking._verdicts.clear()
    assert "fork_start='preserve'" in forking.starts_as_trunk(gate, TINY_RA)


def test_the_start_check_draws_no_weight_the_fork_overwrites(fresh_verdicts, monkeypatch):
    """At GPT-2 sizes drawing both models' initializations was nearly all of the check's time (issue 60): the trunk's
    random weights are drawn once for all its branches (sweep.py keeps random_trunks over its plan), and a branch
    without new parameters takes them as they are."""
    drawn = []
    for method in ("normal_", "uniform_"):
        draw = getattr(torch.Tensor, method)
        monkeypatch.setattr(torch.Tensor, method, lambda t, *a, _draw=draw, **k: (
            drawn.append(0 if t.is_meta else t.numel()), _draw(t, *a, **k))[1])
    trunk, random_trunks = dict(TINY_RA, n_layer=6), {}
    for pattern in ("late", "all"):  # no new parameter: RA's fixed alpha
        assert forking.starts_as_trunk(dict(trunk, ra_pattern=pattern, ra_mode="mix"), trunk, random_trunks) is not None
    assert sum(drawn) == runtime.count_params(trunk)  # the trunk's weights, once for both (tied ones once)


def test_the_start_check_keeps_a_branchs_new_parameters_at_their_own_init(fresh_verdicts, monkeypatch):
    """fork_start='own': the new parameters start where the branch's own seeded init puts them (the gate's weights
    drawn as GPT's), which is what makes its start differ; every other tensor is the trunk's."""
    gate = dict(TINY_RA, attn_gate=True)
    at_load, load = {}, forking.load_weights

    def recording_load(ckpt, model, **keys):
        at_load.update({n: p.clone() for n, p in model.named_parameters() if n in model.fork_new_parameters()})
        return load(ckpt, model, **keys)

    monkeypatch.setattr(forking, "load_weights", recording_load)
    assert forking.starts_as_trunk(gate, TINY_RA) is not None
    torch.manual_seed(1)
    own = dict(runtime.build_model(dict(gate, init_from="scratch", dropout=0.0)).named_parameters())
    assert sorted(at_load) == sorted(n for n in own if "c_gate" in n)
    assert all(torch.equal(p, own[n]) for n, p in at_load.items())


def test_the_start_check_is_answered_once_per_pair_of_models(fresh_verdicts, monkeypatch):
    checked = []
    monkeypatch.setattr(forking, "fork_gap", lambda branch, trunk: checked.append(branch) or None)
    gate = dict(TINY_RA, attn_gate=True)
    for cfg in (gate, dict(gate, out_dir="elsewhere", learning_rate=1.0), dict(gate, fork_start="preserve"),
                dict(gate, n_layer=3)):
        forking.starts_as_trunk(cfg, TINY_RA)
    assert len(checked) == 3  # another run of the same models is answered from the first
