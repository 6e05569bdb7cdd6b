"""The speed and memory options of a training step: the allocator setting really stops the page
faults, and tools/bench_train_step.py runs as users run it and shows the chunked head's memory saving."""
import json
import os
import subprocess
import sys
import textwrap

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))

FAULTS = textwrap.dedent("""
    import resource, sys, torch
    sys.path.insert(0, {repo!r})
    import devices
    import runtime
    def faults_of_a_step():
        before = resource.getrusage(resource.RUSAGE_SELF).ru_minflt
        for _ in range(3):
            x = torch.ones(2**23)  # 32 MiB, far above glibc's mmap threshold
            del x
        return resource.getrusage(resource.RUSAGE_SELF).ru_minflt - before
    faults_of_a_step()
    default = faults_of_a_step()
    kept = devices.keep_freed_memory()
    faults_of_a_step()
    print(kept, default, faults_of_a_step())
""")


def test_keep_freed_memory_stops_page_faults_of_repeated_allocations():
    """Each fresh 32 MiB tensor costs ~8192 page faults by default; with freed memory kept, the
    heap is reused and the repeated allocations fault (almost) never."""
    out = subprocess.run([sys.executable, "-c", FAULTS.format(repo=REPO)], capture_output=True, text=True, check=True)
    kept, default, after = out.stdout.split()
    assert kept == "True"
    assert int(default) > 3 * 8000 and int(after) < 1000, (default, after)


def bench(tmp_path, *args):
    out = tmp_path / "bench.json"
    subprocess.run([sys.executable, os.path.join(REPO, "tools", "bench_train_step.py"), "--n_layer=1", "--n_head=2", "--n_embd=32",
                    "--block_size=32", "--vocab_size=4096", "--batch_size=4", "--dtype=float32", f"--json={out}", *args],
                   check=True, capture_output=True, text=True, env=dict(os.environ, OMP_NUM_THREADS="1"))
    return {r["option"]: r for r in json.load(open(out))["results"]}


def test_bench_step_memory_only_shows_the_chunked_head_saving(tmp_path):
    # 128 tokens x 4096 logits (2 MiB in fp32): the plain step holds them, their log-softmax and their
    # gradient at once; the chunked head (one chunk here) only the logits and their softmax, briefly
    results = bench(tmp_path, "--memory_only=True", "--options=chunked_head")
    assert set(results) == {"plain", "chunked_head"}
    logits_mib = 128 * 4096 * 4 / 2**20
    assert results["plain"]["peak_mib"] - results["chunked_head"]["peak_mib"] >= 1.5 * logits_mib
    assert results["chunked_head"]["memory_ratio"] < 0.7


def test_bench_step_times_each_option_with_mfu_and_profile(tmp_path):
    results = bench(tmp_path, "--steps=1", "--warmup=1", "--options=all", "--profile=True")
    assert set(results) == {"plain", "all"}
    for r in results.values():
        # no upper bound on mfu: the probe and the step are timed apart, and a busy machine can slow either
        assert r["step_ms"] > 0 and r["matmul_peak_gflops"] > 0 and r["mfu"] > 0 and r["peak_mib"] > 0
        profile = r["profile_ms"]  # every category reported, the matmuls and the head's softmax seen
        assert list(profile)[:2] == ["optimizer (clip, AdamW)", "matmuls"] and min(profile.values()) >= 0
        assert profile["matmuls"] > 0 and profile["softmax + cross-entropy"] > 0 and profile["optimizer (clip, AdamW)"] > 0


def test_profile_on_a_gpu_records_the_kernels(monkeypatch):
    """--profile on a GPU profiles CUDA activity and counts device time (CPU time is launch time there);
    run here on CPU ops with the device calls stood in for."""
    sys.path.insert(0, REPO)
    import torch.profiler

    from tools import bench_train_step
    import devices
    asked, real = [], torch.profiler.profile
    monkeypatch.setattr(torch.profiler, "profile",
                        lambda activities: asked.append(activities) or real(activities=[torch.profiler.ProfilerActivity.CPU]))
    monkeypatch.setattr(devices, "synchronize", lambda device: None)
    import torch
    a = torch.randn(64, 64)
    totals = bench_train_step.profile_by_category(lambda: a @ a, "cuda:0")
    assert torch.profiler.ProfilerActivity.CUDA in asked[0]
    assert "device idle (launch gaps, host syncs)" in totals and totals["matmuls"] == 0.0  # device time: none here
    totals = bench_train_step.profile_by_category(lambda: a @ a, "cpu")
    assert asked[1] == [torch.profiler.ProfilerActivity.CPU] and totals["matmuls"] > 0
