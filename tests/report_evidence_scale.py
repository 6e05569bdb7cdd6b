"""Synthetic run records for a report at scale (tests/test_report_evidence.py runs it in a fresh
process, so it imports no training code)."""
import numpy as np


def fake_runs(root, seeds):
    """Two variants x `seeds` seeds as read_run returns them: 50 evaluations, 50 logged windows."""
    rng = np.random.default_rng(0)
    runs = {}
    for variant, shift in (("base", 0.0), ("var", 0.004)):
        for s in range(1, seeds + 1):
            noise = rng.normal(0, 0.01)
            events = [dict(event="checklist", parameters=10, flops_per_token=1000, tokens_per_iter=100)]
            events += [dict(event="eval", tokens=t, val_loss=3.0 - t / 10000 + shift + noise) for t in range(0, 5001, 100)]
            events += [dict(event="train", step_time_ms=100.0, tokens_per_sec=1000.0, peak_memory_mib=64.0,
                            load_average=[0.5, 0, 0]) for _ in range(50)]
            events.append(dict(event="end", tokens=5000, train_time=5.0))
            out_dir = f"{root}/{variant}-seed{s}"
            runs[(variant, s)] = dict(out_dir=out_dir, config=dict(seed=s, out_dir=out_dir), info=None, events=events)
    suite = dict(name="scale", metric="val_loss", baseline="base", allowed=[], min_effect=0.01,
                 variants={"base": list(range(1, seeds + 1)), "var": list(range(1, seeds + 1))})
    return runs, suite
