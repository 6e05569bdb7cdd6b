"""The lm-evaluation-harness backend ("workbench") on local fixture tasks: its HellaSwag scores are
hellaswag.py's, its rolling log-likelihood is eval.py's loss, the HF export through lm-eval's own `hf`
backend gives the same numbers, every model type scores like a direct forward pass, and
lm_eval_run.py keeps results and per-item outputs in the run directory, where the report reads them."""
import glob
import importlib
import json
import math
import os
import subprocess
import sys

import numpy as np
import pytest
import torch
import transformers
from torch.nn import functional as F

import lm_eval
from lm_eval.api.instance import Instance
from lm_eval.tasks import TaskManager

import evaluation
import export_checkpoint
import lm_eval_backend
import lm_eval_run
import runtime
import tokendata
from ablation import lm_eval_results
from helpers import REPO, tiny_checkpoint, train_gpt2

eval_script = importlib.import_module("eval")  # the repo's eval.py, not the builtin
FIXTURES = os.path.join(REPO, "tests", "fixtures", "lm_eval")
HELLASWAG = os.path.join(FIXTURES, "hellaswag_fixture.jsonl")
N = tokendata.GPT2_VOCAB_SIZE


@pytest.fixture(autouse=True)
def offline(monkeypatch):
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    monkeypatch.setenv("HF_DATASETS_OFFLINE", "1")
    monkeypatch.setenv("TOKENIZERS_PARALLELISM", "false")


@pytest.fixture(scope="module")
def run(gpt2_data_dir, tmp_path_factory):
    """Four training steps of a GPT-2-vocabulary model without padding rows (vocab_size=50257), so that
    its HF export computes the same distribution. block_size 32 holds every HellaSwag row (no truncation, where
    hellaswag.py and lm-eval keep different amounts of context) and divides the fixture text's 64 tokens."""
    return train_gpt2(gpt2_data_dir, str(tmp_path_factory.mktemp("lm_eval") / "run"), "--vocab_size=50257",
                      "--block_size=32")


def harness(model, model_args, tasks):
    # only the fixture tasks indexed: lm-eval's own ~14,000 task files took half a minute to read per call
    return lm_eval.simple_evaluate(model=model, model_args=model_args, tasks=tasks, log_samples=True,
                                   task_manager=TaskManager(include_path=FIXTURES, include_defaults=False),
                                   batch_size=3)


def ours(run):
    ckpt = torch.load(os.path.join(run, "ckpt.pt"), map_location="cpu", weights_only=True)
    return runtime.build_model(ckpt["config"], ckpt).eval()


def logged_lls(samples):
    """Per item, the log-likelihood of each request (each choice), from lm-eval's per-sample log."""
    first = lambda resp: np.ravel(np.asarray(resp, dtype=object))[0]  # (ll, is_greedy) or ll, wrapped in lists
    return np.array([[first(resp) for resp in s["resps"]] for s in sorted(samples, key=lambda s: s["doc_id"])],
                    dtype=np.float64)


def test_hellaswag_scores_equal_hellaswag_py(run):
    result = harness("workbench", f"out_dir={run},device=cpu", ["hellaswag_fixture"])
    examples = evaluation.load_examples(HELLASWAG)
    reference = evaluation.evaluate_hellaswag(ours(run), examples, "cpu", items=True)
    lls = logged_lls(result["samples"]["hellaswag_fixture"])
    loss_sums = np.array([item["loss_sum"] for item in reference["items"]])
    np.testing.assert_allclose(lls, -loss_sums, rtol=1e-6)
    scores = result["results"]["hellaswag_fixture"]
    labels = np.array([ex["label"] for ex in examples])
    assert scores["acc,none"] == reference["acc"]
    # hellaswag.py's acc_norm normalizes by the ending's tokens, lm-eval's by its characters: each from the other's scores
    tokens = np.array([[len(e) for e in ex["ending_ids"]] for ex in examples])
    chars = np.array([[len(e) for e in ex["endings"]] for ex in examples])
    assert np.mean((lls / tokens).argmax(1) == labels) == reference["acc_norm"]
    assert scores["acc_norm,none"] == np.mean((-loss_sums / chars).argmax(1) == labels)


def perplexity_text():
    with open(os.path.join(FIXTURES, "perplexity_fixture.jsonl")) as f:
        return json.loads(f.readline())["text"]


def test_rolling_loglikelihood_equals_eval_py_loss(run, tmp_path):
    """eval.py on [EOT] + the text in windows of block_size 32: the same predictions as lm-eval's rolling
    windows when block_size divides the text's token count (each window then has a full context)."""
    tokens = tokendata.gpt2_encoding().encode_ordinary(perplexity_text())
    assert len(tokens) % 32 == 0
    tokendata.write_split(str(tmp_path / "val.bin"), [[tokendata.EOT_TOKEN] + tokens])
    reference = eval_script.main([f"--out_dir={run}", f"--data_dir={tmp_path}", "--device=cpu", "--dtype=float32"])
    result = harness("workbench", f"out_dir={run},device=cpu", ["perplexity_fixture"])
    (sample,) = result["samples"]["perplexity_fixture"]
    (ll,) = logged_lls([sample])[0]
    assert reference["tokens"] == len(tokens) and reference["windows"] == len(tokens) // 32
    assert -ll / len(tokens) == pytest.approx(reference["loss"], rel=1e-6)
    words = len(perplexity_text().split())
    assert result["results"]["perplexity_fixture"]["word_perplexity,none"] == pytest.approx(math.exp(-ll / words))


def test_hf_export_through_lm_evals_hf_backend_gives_our_numbers(run, tmp_path):
    hf_dir = str(tmp_path / "hf")
    export_checkpoint.main([f"--out_dir={run}", "--format=hf", f"--out={hf_dir}"])
    tasks = ["hellaswag_fixture", "perplexity_fixture"]
    mine = harness("workbench", f"out_dir={run},device=cpu", tasks)
    theirs = harness("hf", f"pretrained={hf_dir},device=cpu,dtype=float32", tasks)
    for task in tasks:
        np.testing.assert_allclose(logged_lls(theirs["samples"][task]), logged_lls(mine["samples"][task]), rtol=1e-5)
        ours, hf = mine["results"][task], theirs["results"][task]
        compared = [m for m in ours if m.endswith(",none") and "stderr" not in m]
        assert compared, ours  # renamed metrics would otherwise compare nothing
        for metric in compared:
            assert hf[metric] == pytest.approx(ours[metric], rel=1e-5), (task, metric)


def direct_loglikelihood(model, context, continuation):
    """Plain float64 log-softmax of one forward pass over context + continuation."""
    ids = torch.tensor([context + continuation])
    with torch.no_grad():
        logits, _ = model(ids[:, :-1])
    log_probs = F.log_softmax(logits[0].double(), -1)[len(context) - 1:]
    return log_probs.gather(1, torch.tensor(continuation)[:, None]).sum().item()


def greedy_reference(model, prompt, steps):
    ids = list(prompt)
    for _ in range(steps):
        with torch.no_grad():
            logits, _ = model(torch.tensor([ids[-model.config.block_size:]]))
        ids.append(int(logits[0, -1, :N].argmax()))
    return ids[len(prompt):]


VARIANTS = {
    "gpt_nobias_post_ln": dict(bias=False, ln_placement="post"),
    "ra_late": dict(model_type="ra", ra_pattern="late"),
    "mla": dict(model_type="ra", mla=True, mla_latent_dim=8),
    "gated": dict(model_type="ra", attn_gate=True),
    "reduced_sync": dict(model_type="reduced_sync", block_pattern="tp,spd,parallel,parallel", n_layer=4, tp_size=2),
}


@pytest.mark.parametrize("name", VARIANTS)
def test_every_model_type_scores_like_a_direct_forward(tmp_path, name):
    run = tiny_checkpoint(tmp_path / "run", **VARIANTS[name])  # vocab_size 50304: padding rows included
    model = ours(run)
    enc = tokendata.gpt2_encoding()
    pairs = [("A man pours flour into a bowl. He", " stirs it."), ("The river", " runs past the old mill and under "
             "the stone bridge"), ("Short", " one"), ("", " starts a text")]
    requests = [Instance("loglikelihood", {}, pair, i) for i, pair in enumerate(pairs)]
    one_by_one = lm_eval_backend.WorkbenchLM(out_dir=run, device="cpu", dtype="float32", batch_size=1)
    batched = lm_eval_backend.WorkbenchLM(out_dir=run, device="cpu", dtype="float32", batch_size=3)
    got = batched.loglikelihood(requests)
    assert [g[0] for g in got] == pytest.approx([g[0] for g in one_by_one.loglikelihood(requests)], rel=1e-6)
    for (context, continuation), (ll, _) in zip(pairs, got):
        context_ids = enc.encode_ordinary(context) if context else [tokendata.EOT_TOKEN]
        assert ll == pytest.approx(direct_loglikelihood(model, context_ids, enc.encode_ordinary(continuation)), rel=1e-5)
    text = perplexity_text()  # 64 tokens over block_size 16: four windows
    (rolling,) = batched.loglikelihood_rolling([Instance("loglikelihood_rolling", {}, (text,), 0)])
    ids = [tokendata.EOT_TOKEN] + enc.encode_ordinary(text)
    windows = [direct_loglikelihood(model, ids[k:k + 1], ids[k + 1:k + 17]) for k in range(0, 64, 16)]
    assert rolling == pytest.approx(sum(windows), rel=1e-5)
    prompts = ["The river runs", "A man pours flour", "The river ends"]  # two of the same token length share a batch
    generated = batched.generate_until([Instance("generate_until", {}, (p, {"until": ["\n\n"], "max_gen_toks": 20}), i)
                                        for i, p in enumerate(prompts)])
    for prompt, text in zip(prompts, generated):
        expected = enc.decode(greedy_reference(model, enc.encode_ordinary(prompt), 20))
        assert text == lm_eval_backend.cut_at_stops(expected, ["\n\n", "<|endoftext|>"])


def test_generation_stops_at_the_first_stop_string(tmp_path):
    lm = lm_eval_backend.WorkbenchLM(out_dir=tiny_checkpoint(tmp_path / "run"), device="cpu", dtype="float32")
    (free,) = lm.generate_until([Instance("generate_until", {}, ("Once", {"until": [], "max_gen_toks": 12}), 0)])
    stop = free[3:6]  # a string that occurs in the free continuation
    (cut,) = lm.generate_until([Instance("generate_until", {}, ("Once", {"until": [stop], "max_gen_toks": 12}), 0)])
    assert cut == free[:free.index(stop)]
    with pytest.raises(ValueError, match="greedily only"):
        lm.generate_until([Instance("generate_until", {}, ("Once", {"do_sample": True}), 0)])


def test_dtype_is_the_runs_and_bad_inputs_are_refused(tmp_path):
    run = tiny_checkpoint(tmp_path / "run")
    (tmp_path / "run" / "config.json").write_text(json.dumps({"dtype": "bfloat16"}))
    lm = lm_eval_backend.WorkbenchLM(out_dir=run, device="cpu")
    assert lm.dtype == "bfloat16"
    assert lm_eval_backend.WorkbenchLM(out_dir=run, device="cpu", dtype="float32").dtype == "float32"
    with pytest.raises(Exception, match="needs a GPU"):
        lm_eval_backend.WorkbenchLM(out_dir=run, device="cpu", dtype="float16")
    with pytest.raises(Exception, match="GPT-2's"):
        lm_eval_backend.WorkbenchLM(out_dir=tiny_checkpoint(tmp_path / "char", vocab_size=65), device="cpu")
    # A char-level run padded to GPT-2's vocabulary size would read GPT-2 BPE ids as characters.
    (tmp_path / "run" / "run_info.json").write_text(json.dumps({"facts": {"tokenizer": "char"}}))
    with pytest.raises(Exception, match="trained on 'char' tokens but lm-eval uses GPT-2's BPE"):
        lm_eval_backend.WorkbenchLM(out_dir=run, device="cpu")
    with pytest.raises(Exception, match="out_dir=RUN_DIR"):
        lm_eval_backend.WorkbenchLM()
    with pytest.raises(Exception, match="batch_size='auto'"):
        lm_eval_backend.WorkbenchLM(out_dir=run, batch_size="auto")


def test_lm_eval_run_keeps_results_and_items_in_the_run_directory(run, monkeypatch):
    monkeypatch.setattr(sys, "argv", sys.argv)  # main() hands lm-eval's command line its argv: ours comes back after
    lm_eval_run.main(["--model", "workbench", "--model_args", f"out_dir={run},device=cpu", "--tasks", "hellaswag_fixture",
                      "--include_path", FIXTURES, "--batch_size", "4"])  # in this process: its output is under test
    (samples,) = glob.glob(os.path.join(run, "lm_eval", "samples_hellaswag_fixture_*.jsonl"))
    items = [json.loads(line) for line in open(samples)]
    assert sorted(item["doc_id"] for item in items) == list(range(6))
    scores, counts = lm_eval_results.read_results(run)
    reference = evaluation.evaluate_hellaswag(ours(run), evaluation.load_examples(HELLASWAG), "cpu")
    assert scores["hellaswag_fixture"]["acc"] == reference["acc"] and counts["hellaswag_fixture"] == 6
    assert np.mean([item["acc"] for item in items]) == reference["acc"]


def write_result(out_dir, date, task, acc, stderr, items=100):
    os.makedirs(os.path.join(out_dir, "lm_eval"), exist_ok=True)
    with open(os.path.join(out_dir, "lm_eval", f"results_{date}.json"), "w") as f:
        json.dump({"results": {task: {"acc,none": acc, "acc_stderr,none": stderr, "alias": task}},
                   "n-samples": {task: {"original": 100, "effective": items}}}, f)


def test_pooled_task_scores_over_seeds(tmp_path):
    from scipy import stats
    seeds = [str(tmp_path / f"seed{s}") for s in range(3)]
    for s, (acc, newer) in enumerate([(0.30, 0.31), (0.34, 0.33), (0.29, 0.32)]):
        write_result(seeds[s], "2026-01-01T00-00-00", "hellaswag", acc, 0.01)
        write_result(seeds[s], "2026-02-01T00-00-00", "hellaswag", newer, 0.01)  # the newest result counts
    pooled = lm_eval_results.pooled_task_scores(seeds)["hellaswag"]["acc"]
    newest = [0.31, 0.33, 0.32]
    low, high = stats.t.interval(0.95, 2, loc=np.mean(newest), scale=stats.sem(newest))
    assert pooled["value"] == pytest.approx(np.mean(newest)) and pooled["seeds"] == 3 == pooled["runs"] and pooled["n"] == 100
    assert pooled["ci95"] == pytest.approx([low, high])
    single = lm_eval_results.pooled_task_scores(seeds[:1])["hellaswag"]["acc"]
    assert single["ci95"] == pytest.approx([0.31 - 1.96 * 0.01, 0.31 + 1.96 * 0.01])
    assert lm_eval_results.pooled_task_scores([str(tmp_path / "none")]) == {}
    report = {"variants": {"base": {"lm_eval": lm_eval_results.pooled_task_scores(seeds)}, "other": {}}}
    assert any("| base | hellaswag | acc | 3 of 3 | 100 | 0.3200 |" in line for line in lm_eval_results.report_lines(report))


def test_seeds_scored_on_different_items_are_not_pooled_and_missing_seeds_are_counted(tmp_path):
    seeds = [str(tmp_path / f"seed{s}") for s in range(3)]
    write_result(seeds[0], "2026-01-01T00-00-00", "piqa", 0.6, 0.01)
    write_result(seeds[1], "2026-01-01T00-00-00", "piqa", 0.7, 0.05, items=20)  # evaluated with --limit 20
    refused = lm_eval_results.pooled_task_scores(seeds)["piqa"]
    assert "different numbers of items (100, 20)" in refused["refused"]
    report = {"variants": {"base": {"lm_eval": {"piqa": refused}}}}
    assert any("base / piqa: not pooled" in line for line in lm_eval_results.report_lines(report))
    write_result(seeds[1], "2026-02-01T00-00-00", "piqa", 0.7, 0.01)  # seed 2 never evaluated
    pooled = lm_eval_results.pooled_task_scores(seeds)["piqa"]["acc"]
    assert (pooled["seeds"], pooled["runs"]) == (2, 3) and pooled["value"] == pytest.approx(0.65)


def test_the_ablation_report_pools_each_variants_task_scores(tmp_path):
    from ablation import compare
    from ablation import render
    from helpers import synthetic_run
    runs = {}
    for variant, accs in (("base", (0.30, 0.32)), ("wide", (0.36, 0.40))):
        for seed, acc in zip((1, 2), accs):
            run = synthetic_run(variant, seed, 1e-3, 8, lambda t: 3 - t / 1000, final_tokens=300)
            run["out_dir"] = str(tmp_path / f"{variant}-seed{seed}")
            write_result(run["out_dir"], "2026-01-01T00-00-00", "arc_easy", acc, 0.02)
            runs[(variant, seed)] = run
    suite = dict(name="toy", metric="val_loss", baseline="base", allowed=[], variants={"base": [1, 2], "wide": [1, 2]})
    report = compare.compare(suite, runs)
    wide = report["variants"]["wide"]["lm_eval"]["arc_easy"]["acc"]
    assert wide["value"] == pytest.approx(0.38) and wide["seeds"] == 2
    assert wide["ci95"] == pytest.approx(lm_eval_results.pooled_task_scores(
        [runs[("wide", s)]["out_dir"] for s in (1, 2)])["arc_easy"]["acc"]["ci95"])
    assert "| wide | arc_easy | acc | 2 of 2 | 100 | 0.3800 |" in render.markdown(report, [])


def test_a_task_whose_data_is_not_cached_offline_is_one_line(run, tmp_path):
    """Without the Hugging Face hub, `--tasks hellaswag` was a 52-line ConnectionError traceback."""
    env = dict(os.environ, OMP_NUM_THREADS="1", HF_HUB_OFFLINE="1", HF_DATASETS_OFFLINE="1", HF_HOME=str(tmp_path))
    proc = subprocess.run([sys.executable, "lm_eval_run.py", "--model", "workbench", "--model_args",
                           f"out_dir={run},device=cpu", "--tasks", "hellaswag"], cwd=REPO, env=env,
                          capture_output=True, text=True, timeout=300)
    assert proc.returncode == 1 and "Traceback" not in proc.stderr, proc.stderr[-3000:]
    error = [line for line in proc.stderr.splitlines() if line.startswith("error: ")]
    assert error == ["error: the data of --tasks hellaswag is not on this machine and the Hugging Face hub cannot be "
                     "reached (Couldn't reach 'Rowan/hellaswag' on the Hub (OfflineModeIsEnabled)): run it once where "
                     "the hub answers (HF_HOME keeps the data), or give a task of your own with --include_path"], \
        proc.stderr[-3000:]
