"""rundir.py on its own, in this process: the out_dir lock, atomic writes, checkpoints saved and loaded
(weights only, digest checked, write errors in one line), RunLog's strict JSON lines, and reading run
directories back (read_events' damage notes, read_run_info, read_run). The same faults end to end,
through train.py in processes of its own: tests/test_faults.py."""
import errno
import json
import math
import os

import pytest
import torch

import rundir


def cfg(out_dir, **keys):
    """What RunLog reads from a run config."""
    return dict(out_dir=str(out_dir), wandb_log=False, **keys)


# ----------------------------------------------------------------------------- one run per out_dir

def test_the_lock_refuses_a_second_holder_naming_the_first_and_frees_on_exit(tmp_path):
    with rundir.out_dir_lock(str(tmp_path)):
        assert open(tmp_path / rundir.LOCK_FILE).read() == str(os.getpid())
        with pytest.raises(rundir.RunDirError) as refused:  # flock refuses a second open file as another process
            with rundir.out_dir_lock(str(tmp_path)):
                pass
        assert str(refused.value) == (f"{tmp_path} is in use by another run (pid {os.getpid()}): wait for it to end, "
                                      f"stop it, or choose another out_dir")
        with pytest.raises(rundir.RunDirError, match="in use by another sweep .*or choose another sweep_dir"):
            with rundir.out_dir_lock(str(tmp_path), holder="sweep"):
                pass
    with rundir.out_dir_lock(str(tmp_path)):  # freed when the block ended
        pass


def test_the_lock_is_freed_when_its_block_raises(tmp_path):
    with pytest.raises(KeyError):
        with rundir.out_dir_lock(str(tmp_path)):
            raise KeyError("a crash inside the run")
    with rundir.out_dir_lock(str(tmp_path)):
        pass


def test_taking_the_lock_removes_a_dead_writers_temporary_files_only(tmp_path):
    (tmp_path / "ckpt.pt.4242.tmp").write_bytes(b"half a checkpoint")
    (tmp_path / "ckpt.pt").write_bytes(b"the last good one")
    with rundir.out_dir_lock(str(tmp_path)):
        assert sorted(os.listdir(tmp_path)) == ["ckpt.pt", rundir.LOCK_FILE]


def test_an_out_dir_that_cannot_be_created_is_one_line(tmp_path):
    (tmp_path / "file").write_text("in the way")
    with pytest.raises(rundir.RunDirError, match=r"^cannot write in .*file/run \(Not a directory\): choose a "
                                                 r"writable out_dir$"):
        with rundir.out_dir_lock(str(tmp_path / "file" / "run")):
            pass


# ----------------------------------------------------------------------------- atomic writes

@pytest.mark.parametrize("error", [ValueError, KeyboardInterrupt])
def test_an_interrupted_atomic_write_leaves_the_old_file_and_no_temporary(tmp_path, error):
    path = tmp_path / "meta.json"
    path.write_text("old")
    with pytest.raises(error):
        with rundir.atomic_write(str(path), "w") as f:
            f.write("new, half")
            raise error()
    assert path.read_text() == "old" and os.listdir(tmp_path) == ["meta.json"]
    with rundir.atomic_write(str(path), "w") as f:
        f.write("new")
    assert path.read_text() == "new" and os.listdir(tmp_path) == ["meta.json"]


# ----------------------------------------------------------------------------- checkpoints

def test_a_saved_checkpoint_loads_back_without_its_digest(tmp_path):
    state = dict(model={"w": torch.arange(6.0).view(2, 3)}, iter_num=7, config={"n_layer": 2, "bias": True})
    path = str(tmp_path / "ckpt.pt")
    rundir.save_checkpoint(path, state)
    assert rundir.DIGEST_KEY in torch.load(path, weights_only=True)
    loaded = rundir.load_checkpoint_file(path)
    assert set(loaded) == set(state) and torch.equal(loaded["model"]["w"], state["model"]["w"])
    assert loaded["iter_num"] == 7 and loaded["config"] == state["config"]


def test_a_checkpoint_written_before_digests_still_loads(tmp_path):
    torch.save(dict(model={"w": torch.ones(2)}), tmp_path / "old.pt")
    assert torch.equal(rundir.load_checkpoint_file(str(tmp_path / "old.pt"))["model"]["w"], torch.ones(2))


def test_the_digest_tells_a_changed_value_dtype_or_order_apart():
    base = dict(model={"a": torch.zeros(3), "b": torch.ones(2)}, iter_num=1)
    digest = rundir.state_digest(base)
    assert rundir.state_digest(dict(base)) == digest
    changed = [dict(base, iter_num=2),
               dict(base, model={"a": torch.zeros(3, dtype=torch.float64), "b": torch.ones(2)}),  # the dtype
               dict(base, model={"b": torch.ones(2), "a": torch.zeros(3)}),  # the order
               dict(base, model={"a": torch.zeros(3).view(3, 1), "b": torch.ones(2)})]  # the shape
    assert all(rundir.state_digest(state) != digest for state in changed)


def test_a_checkpoint_whose_digest_disagrees_is_named_damaged(tmp_path):
    path = tmp_path / "ckpt.pt"
    other = rundir.state_digest({"model": {"w": torch.zeros(4)}})
    torch.save({"model": {"w": torch.ones(4)}, rundir.DIGEST_KEY: other}, path)
    with pytest.raises(rundir.RunDirError, match=r"ckpt.pt is damaged: its contents do not match the sha256"):
        rundir.load_checkpoint_file(str(path))


class NotATensor:
    pass


def test_a_checkpoint_holding_other_objects_is_refused_naming_the_class(tmp_path):
    path = tmp_path / "ckpt.pt"
    torch.save(dict(model={}, extra=NotATensor()), path)  # a pickled class instance: weights_only refuses it
    with pytest.raises(rundir.RunDirError) as refused:
        rundir.load_checkpoint_file(str(path))
    message = str(refused.value)
    assert "holds objects other than tensors and plain values (test_rundir.NotATensor)" in message
    assert "\n" not in message


def test_a_truncated_checkpoint_is_one_line(tmp_path):
    path = str(tmp_path / "ckpt.pt")
    rundir.save_checkpoint(path, dict(model={"w": torch.ones(1000)}))
    whole = open(path, "rb").read()
    open(path, "wb").write(whole[:len(whole) // 2])  # a copy cut short
    with pytest.raises(rundir.RunDirError) as refused:
        rundir.load_checkpoint_file(path)
    assert str(refused.value).startswith(f"{path} is not a readable checkpoint (") and "\n" not in str(refused.value)


@pytest.mark.parametrize("had_one, kept", [(True, "the previous checkpoint is intact"),
                                           (False, "no checkpoint was written yet")])
def test_a_full_disk_mid_save_is_one_line_and_keeps_the_previous_checkpoint(tmp_path, monkeypatch, had_one, kept):
    path = str(tmp_path / "ckpt.pt")
    if had_one:
        rundir.save_checkpoint(path, dict(iter_num=1))

    def full_disk(state, f):
        f.write(b"part of a checkpoint")
        raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))
    monkeypatch.setattr(torch, "save", full_disk)
    with pytest.raises(rundir.RunDirError) as refused:
        rundir.save_checkpoint(path, dict(iter_num=2))
    assert str(refused.value) == f"no space left on device while writing {path}; {kept}"
    monkeypatch.undo()
    assert os.listdir(tmp_path) == (["ckpt.pt"] if had_one else [])
    if had_one:
        assert rundir.load_checkpoint_file(path)["iter_num"] == 1


# ----------------------------------------------------------------------------- log.jsonl

def test_runlog_writes_one_strict_json_record_per_line_with_non_finite_values_as_null(tmp_path, capsys):
    log = rundir.RunLog(cfg(tmp_path), master=True)
    log.event("train", "iter 1: loss nan", iter=1, loss=float("nan"), grad_norm=float("inf"),
              act=[1.0, float("-inf")], nested={"x": float("nan"), "ok": 2})
    log.event("eval", "iter 2: val 1.5", iter=2, val_loss=1.5)
    log.close()
    lines = (tmp_path / "log.jsonl").read_text().splitlines()
    records = [json.loads(line, parse_constant=lambda word: pytest.fail(f"not strict JSON: {word}")) for line in lines]
    assert [r["event"] for r in records] == ["train", "eval"]
    assert (records[0]["loss"], records[0]["grad_norm"], records[0]["act"], records[0]["nested"]) == (
        None, None, [1.0, None], {"x": None, "ok": 2})
    assert records[1]["val_loss"] == 1.5 and all(isinstance(r["time"], float) for r in records)
    assert (tmp_path / "log.txt").read_text() == "iter 1: loss nan\niter 2: val 1.5\n"
    assert capsys.readouterr().out == "iter 1: loss nan\niter 2: val 1.5\n"


def test_a_runlog_that_is_not_the_master_writes_nothing(tmp_path, capsys):
    log = rundir.RunLog(cfg(tmp_path / "run"), master=False)
    log.event("train", "iter 1", iter=1)
    log.say("a line")
    log.close()
    assert not os.path.exists(tmp_path / "run") and capsys.readouterr().out == ""


def test_a_runlog_opened_on_a_torn_log_cuts_the_fragment_and_says_so(tmp_path):
    (tmp_path / "log.jsonl").write_text('{"event": "eval", "iter": 0}\n{"event": "tra')
    log = rundir.RunLog(cfg(tmp_path), master=True)
    log.close()
    records = rundir.read_events(str(tmp_path))
    assert [r["event"] for r in records] == ["eval", "log_repaired"] and records[1]["torn"] == '{"event": "tra'


def test_a_failed_log_write_is_one_line_naming_the_file(tmp_path):
    class FullDisk:
        name = str(tmp_path / "log.jsonl")

        def write(self, data):
            raise OSError(errno.EDQUOT, os.strerror(errno.EDQUOT))
    with pytest.raises(rundir.RunDirError, match=r"^disk quota exceeded while writing .*log.jsonl; the run stopped "
                                                 r"there; ckpt.pt holds the last checkpoint"):
        rundir.RunLog.write(FullDisk(), "text\n")


def test_a_partial_unbuffered_write_is_completed():
    written = []

    class Slow:
        name = "log.jsonl"

        def write(self, data):
            written.append(bytes(data[:3]))
            return min(3, len(data))
    rundir.RunLog.write(Slow(), "0123456789")
    assert b"".join(written) == b"0123456789"


# ----------------------------------------------------------------------------- reading run directories

def test_read_events_names_each_skipped_line_and_why(tmp_path):
    (tmp_path / "log.jsonl").write_bytes(b'{"event": "eval", "iter": 0}\n[1, 2]\n\xff\xfe\n'
                                         b'{"event": "train", "iter": NaN}\n{"event": "end", "iter": 4}\n')
    damage = []
    assert [e["event"] for e in rundir.read_events(str(tmp_path), damage)] == ["eval", "end"]
    path = os.path.join(str(tmp_path), "log.jsonl")
    assert damage == [f"{path}:2: not a whole JSON record: line skipped", f"{path}:3: not UTF-8: line skipped",
                      f"{path}:4: a non-finite token or iteration count: line skipped"]
    assert rundir.read_events(str(tmp_path / "nothing")) == []


def test_run_info_is_empty_when_missing_and_a_damaged_one_is_named(tmp_path):
    assert rundir.read_run_info(str(tmp_path)) == {}
    (tmp_path / "run_info.json").write_text('{"facts": {')
    with pytest.raises(rundir.RunDirError, match=r"run_info.json is damaged \(JSONDecodeError\): restore it"):
        rundir.read_run_info(str(tmp_path))


def test_read_run_reads_a_damaged_file_as_missing_and_says_so(tmp_path):
    (tmp_path / "config.json").write_text(json.dumps(dict(seed=3, learning_rate=1e-3)))
    (tmp_path / "run_info.json").write_text("{")
    (tmp_path / "log.jsonl").write_text('{"event": "eval", "iter": 0, "val_loss": 2.5}\n{"event"\n')
    run = rundir.read_run(str(tmp_path))
    assert run["out_dir"] == str(tmp_path) and run["config"] == dict(seed=3, learning_rate=1e-3)
    assert run["info"] is None and run["events"] == [dict(event="eval", iter=0, val_loss=2.5)]
    assert run["damage"] == [f"{tmp_path / 'run_info.json'} is damaged (JSONDecodeError): read as missing",
                             f"{tmp_path / 'log.jsonl'}:2: not a whole JSON record: line skipped"]


def test_run_status_of_fixture_run_directories(tmp_path):
    """The states sweep.py shows, from a log.jsonl each (a stopped run resumes; a finished one is skipped)."""
    logs = {"finished": [dict(event="checklist"), dict(event="end", stop_reason="max_iters")],
            "preempted": [dict(event="checklist"), dict(event="end", stop_reason="signal")],
            "diverged": [dict(event="checklist"), dict(event="diverged", iter=3)],
            "failed": [dict(event="checklist"), dict(event="train", iter=1)],
            "not run": []}
    for state, events in logs.items():
        log = rundir.RunLog(cfg(tmp_path / state), master=True)
        for event in events:
            log.event(event.pop("event"), "", **event)
        log.close()
        assert rundir.run_status(rundir.read_events(str(tmp_path / state))) == state
    assert [e["stop_reason"] for e in rundir.finished(rundir.read_events(str(tmp_path / "finished")))] == ["max_iters"]
    assert rundir.finished(rundir.read_events(str(tmp_path / "preempted"))) == []


def test_strict_json_leaves_finite_values_and_other_types_alone():
    record = dict(a=1, b=2.5, c="nan", d=True, e=None, f=(1, math.inf))
    assert json.loads(rundir.strict_json(record)) == dict(a=1, b=2.5, c="nan", d=True, e=None, f=[1, None])
