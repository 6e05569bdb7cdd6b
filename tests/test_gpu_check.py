"""gpu_check.py's dry run (--dry_run=True): the command a user runs first on a GPU machine, run here on the CPU
at tiny shapes with the kernels under the Triton interpreter, so its rows, the JSON and the table cannot rot
between the GPU runs. (The verdict logic of its rows is tested in test_entry_points.py.)"""

import json
import os
import subprocess
import sys

import torch

import gpu_check

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def test_the_dry_run_runs_every_section_and_writes_the_json_and_the_table(tmp_path):
    """As users run it, in a fresh process (TRITON_INTERPRET is the dry run's to set, not the caller's): every
    correctness row passes, the new rows are there (the compiled paths' graphs, EVEN + TMA on and off, TMA's
    speed, the step timer's wall clock), the GPU-only sections say so, and each section's seconds are in the JSON
    (a time it reports, not a limit a loaded machine could break)."""
    env = {k: v for k, v in os.environ.items() if k not in ("TRITON_INTERPRET", "RA_TMA")}
    env.update(OMP_NUM_THREADS="1", CUDA_VISIBLE_DEVICES="")
    proc = subprocess.run([sys.executable, os.path.join(REPO, "gpu_check.py"), "--dry_run=True", "--json=dry.json"],
                          cwd=tmp_path, env=env, capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    out = json.loads((tmp_path / "dry.json").read_text())
    assert out["dry_run"] is True and out["device"].startswith("CPU (dry run") and out["exit_status"] == 0
    assert out["counts"]["FAIL"] == 0 and set(out["section_seconds"]) == set(gpu_check.SECTIONS)
    rows = {r["check"]: r for r in out["rows"]}
    for path in gpu_check.COMPILE_PATHS:
        assert rows[f"compiled block: {path}"]["measured"] == "1 graph, 0 breaks", rows[f"compiled block: {path}"]
    assert "runs the fused kernel" in rows["compiled block: RA mix, triton"]["detail"]
    even = [r for name, r in rows.items() if name.startswith("RA kernel EVEN")]
    assert [r["status"] for r in even] == ["pass", "pass"], even
    assert "every launch EVEN=True, TMA=True" in even[0]["detail"] and "TMA=False" in even[1]["detail"]
    assert rows["RA kernel TMA vs pointer loads, T=32"]["measured"] == "bitwise equal"  # the interpreter's contract
    assert rows["fused mix TMA off / on, T=32"]["status"] == "info"
    assert rows["fused mix / RA through SDPA, T=32"]["status"] in ("pass", "WARN")
    assert "wall clock" in rows["step time: DeviceTimer / CUDA events"]["detail"]
    # no matmul peak probe (2048^3 in bf16 on a CPU that emulates bf16, an AVX2-only EPYC, takes ~40 s): GPU only
    assert "matmul peak: measured / data sheet" not in rows
    assert rows["memory rows"]["status"] == rows["determinism rows"]["status"] == "skip"
    assert "check" in proc.stdout and "wrote dry.json" in proc.stdout  # the table, then the file
    assert all(seconds >= 0 for seconds in out["section_seconds"].values())


def test_a_row_whose_launches_did_not_take_its_path_fails():
    """The EVEN + TMA rows record what every kernel launch decided: an attention that never launched the
    kernels (here RA through SDPA) cannot pass for the EVEN path, however accurate it is; a CPU has no TMA."""
    from ra_model import reciprocal_sdpa

    def through_sdpa(q, k, v, mode, alpha=None, gate_logit=None, window=0):
        return reciprocal_sdpa(q, k, v, mode, alpha, None if gate_logit is None else torch.sigmoid(gate_logit),
                               window, 0.0)

    rows = gpu_check.even_tma_rows(through_sdpa, "cpu", lengths=(16,), D=8, H=2, dtype="float32", windows=(0,))
    assert [(r["status"], r["measured"]) for r in rows] == [("FAIL", "path not taken"), ("skip", "no TMA here")]
    assert "expected every launch EVEN=True, TMA=False" in rows[0]["detail"]


def test_the_gpu_run_has_a_check_for_every_section(tmp_path):
    """The GPU's sections are the dry run's, each a function of this module (the dry run skips memory,
    distributed and determinism: a lost function would show only on a GPU)."""
    for dry_run in (False, True):
        checks = gpu_check.section_checks(str(tmp_path), "cuda:0", dry_run)
        assert list(checks) == list(gpu_check.SECTIONS) and all(callable(fn) for fn, *_ in checks.values())
    assert callable(gpu_check.ra_training_rows) and callable(gpu_check.auto_choice_row)
