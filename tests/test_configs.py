"""Every shipped config and every run of every suite resolves to the config pinned in
tests/golden/resolved_configs.json: restructuring config/ or suites/ must not change what runs.

Regenerate the golden file only for a deliberate change of an experiment:
    python tests/test_configs.py --write
"""
import glob
import json
import os
import sys

import pytest

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, REPO)

import configurator  # noqa: E402
import runtime  # noqa: E402
import sweep  # noqa: E402

GOLDEN = os.path.join(REPO, "tests", "golden", "resolved_configs.json")
# A CPU twin that became its GPU config plus its family's overlay: old name -> the files now run.
TWINS = {
    **{f"train_ra_{v}_shakespeare": [f"train_ra_{v}.py", "ra_shakespeare.py"]
       for v in ("baseline", "early", "late", "all", "learn", "mla")},
    "train_mla_shakespeare": ["train_mla.py", "ra_shakespeare.py"],
    "train_gated_attn_shakespeare": ["train_gated_attn.py", "ra_shakespeare.py"],
    **{f"train_gpt2_{n}comm_shakespeare": [f"train_gpt2_{n}comm.py", "reduced_sync_shakespeare.py"]
       for n in (6, 8, 12, 16, 18, 24)},
    **{f"train_grouped_{n}sync_shakespeare": [f"train_grouped_{n}sync.py", "reduced_sync_shakespeare.py"]
       for n in (2, 3, 4, 6)},
    "train_selective_9sync_shakespeare": ["train_selective_9sync.py", "reduced_sync_shakespeare.py"],
    "train_spd_12sync_shakespeare": ["train_spd_12sync.py", "reduced_sync_shakespeare.py"],
}
# Where a twin's runs go is named by the overlay (or --out_dir), no longer by each twin file.
NAMED_BY_THE_RUN = ("out_dir",)


def config_files():
    """Train configs a user passes to train.py (not sweep/suite files, not the shared _*.py parts)."""
    paths = sorted(glob.glob(os.path.join(REPO, "config", "*.py")))
    return {os.path.basename(p)[:-3]: [p] for p in paths
            if not os.path.basename(p).startswith("_") and not sweep.is_sweep_file(p)}


def suite_runs(suite_file):
    """{run name: train.py argv} of a suite, as sweep.py plans it (confounds checked)."""
    spec, _ = sweep.parse_args([suite_file])
    return {name: argv for name, _, argv in sweep.plan(spec)}


def resolved_now():
    out = {}
    for name, files in config_files().items():
        out[f"config/{name}"] = configurator.apply_config(runtime.DEFAULTS, files)
    for old, files in TWINS.items():
        out[f"config/{old}"] = configurator.apply_config(runtime.DEFAULTS, [os.path.join(REPO, "config", f)
                                                                             for f in files])
    for path in sorted(glob.glob(os.path.join(REPO, "suites", "*.py"))):
        stem = os.path.basename(path)[:-3]
        for run, argv in suite_runs(path).items():
            out[f"suites/{stem}/{run}"] = configurator.apply_config(runtime.DEFAULTS, argv)
    return json.loads(json.dumps(out))  # tuples and floats as the golden file holds them


def test_every_shipped_config_and_suite_run_resolves_as_pinned():
    golden = json.load(open(GOLDEN))
    now = resolved_now()
    assert sorted(now) == sorted(golden), f"added {sorted(set(now) - set(golden))}, gone {sorted(set(golden) - set(now))}"
    changed = []
    for name, cfg in golden.items():
        skip = NAMED_BY_THE_RUN if name.removeprefix("config/") in TWINS else ()
        changed += [f"{name}: {k} = {now[name][k]!r}, pinned {v!r}" for k, v in cfg.items()
                    if k not in skip and now[name].get(k) != v]
        changed += [f"{name}: new key {k}" for k in set(now[name]) - set(cfg)]
    assert not changed, "\n".join(changed)


@pytest.mark.parametrize("twin", sorted(TWINS))
def test_a_twin_is_its_gpu_config_plus_one_overlay(twin):
    files = TWINS[twin]
    assert len(files) == 2 and os.path.exists(os.path.join(REPO, "config", files[1]))
    assert not os.path.exists(os.path.join(REPO, "config", f"{twin}.py")), "the parallel twin file is back"


if __name__ == "__main__" and sys.argv[1:] == ["--write"]:
    with open(GOLDEN, "w") as f:
        json.dump(resolved_now(), f, indent=1, sort_keys=True)
