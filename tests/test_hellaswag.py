"""HellaSwag scoring (evaluation.py) and hellaswag.py on a small fixture in the upstream jsonl format, with models whose answers are known."""
import json
import math
import urllib.request
from types import SimpleNamespace

import pytest
import torch
import torch.multiprocessing as mp
from torch.nn import functional as F

import configurator
import evaluation
import hellaswag
from helpers import FIXTURE, HELLASWAG_VOCAB as VOCAB, tiny_gpt, write_jsonl
from model import model_config_fields

LENGTHS = [[4, 2, 3, 5], [3, 3, 4, 6], [2, 5, 6, 3], [4, 4, 4, 1], [5, 2, 3, 4]]


@pytest.fixture(scope="module")
def fixture_path(tmp_path_factory):
    return write_jsonl(tmp_path_factory.mktemp("hellaswag") / "hellaswag_val.jsonl", FIXTURE)


@pytest.fixture(scope="module")
def examples(fixture_path):
    return evaluation.load_examples(fixture_path)


class LookupModel(torch.nn.Module):
    """After any prefix of context + labelled ending, logit `boost` on the true next token; all
    other logits 0. LookupModel([], 0) is the uniform model."""

    def __init__(self, examples, boost, block_size=64):
        super().__init__()
        self.config = SimpleNamespace(block_size=block_size, vocab_size=VOCAB)
        self.boost = boost
        self.next_token = {}
        for ex in examples:
            seq = ex["ctx_ids"] + ex["ending_ids"][ex["label"]]
            for i in range(1, len(seq)):
                self.next_token[tuple(seq[:i])] = seq[i]

    def forward(self, idx, targets=None):
        logits = torch.zeros(*idx.shape, VOCAB)
        for b, row in enumerate(idx.tolist()):
            for t in range(len(row)):
                nxt = self.next_token.get(tuple(row[:t + 1]))
                if nxt is not None:
                    logits[b, t, nxt] = self.boost
        return logits, None


def reference_losses(model, ex):
    """Each ending on its own, unpadded: forward the last block_size tokens, cross-entropy on the
    ending tokens that have a predecessor in the window."""
    sums, means = [], []
    for ending in ex["ending_ids"]:
        ids = torch.tensor((ex["ctx_ids"] + ending)[-model.config.block_size:])
        n = min(len(ending), len(ids) - 1)
        with torch.no_grad():
            logits, _ = model(ids[None])
        loss = F.cross_entropy(logits[0, -n - 1:-1], ids[-n:], reduction="sum").item()
        sums.append(loss)
        means.append(loss / n)
    return sums, means


def test_fixture_lengths(examples):
    assert [[len(e) for e in ex["ending_ids"]] for ex in examples] == LENGTHS
    assert [ex["label"] for ex in examples] == [1, 0, 2, 3, 0]
    assert examples[0]["ending_ids"][1] == evaluation.tokendata.gpt2_encoding().encode(" falls down")


def test_model_knowing_the_answers_scores_100_percent(examples):
    result = evaluation.evaluate_hellaswag(LookupModel(examples, boost=30.0), examples, "cpu", batch_size=2)
    assert result == dict(acc=1.0, acc_norm=1.0, n=5)


def test_uniform_model_scores_the_chance_computed_by_hand(examples):
    # Every token costs log(V), so the summed loss is length * log(V): the shortest ending wins
    # (ties to the lowest index): examples 0 (index 1), 1 (0 ties 1 -> 0) and 3 (index 3) -> 3/5.
    # Mean losses all tie, so acc_norm picks index 0: right for examples 1 and 4 -> 2/5.
    result = evaluation.evaluate_hellaswag(LookupModel([], 0.0), examples, "cpu", batch_size=3)
    assert result == dict(acc=3 / 5, acc_norm=2 / 5, n=5)
    sums, means = evaluation.ending_losses(LookupModel([], 0.0), examples, "cpu")
    expected = torch.tensor(LENGTHS, dtype=torch.float64) * math.log(VOCAB)
    torch.testing.assert_close(sums, expected, rtol=1e-6, atol=0)
    assert (means == means[0, 0]).all()  # exact ties, not rounding noise


def test_acc_and_acc_norm_differ_when_lengths_differ(tmp_path):
    # A long labelled ending whose every token is mildly likely loses on the sum to a one-token
    # wrong ending, and wins on the mean.
    path = write_jsonl(tmp_path / "h.jsonl", [("The cat sat on the mat and",
                                               ["then it fell asleep in the sun", "ran", "ate", "slept"], 0)])
    examples = evaluation.load_examples(path)
    boost = 2.0
    model = LookupModel(examples, boost)
    right = math.log(1 + (VOCAB - 1) * math.exp(-boost))  # loss of the boosted token
    wrong = math.log(math.exp(boost) + VOCAB - 1)  # loss of any other token after a known prefix
    sums, means = evaluation.ending_losses(model, examples, "cpu")
    assert sums[0].tolist() == pytest.approx([7 * right, wrong, wrong, wrong], rel=1e-5)  # context not scored
    assert means[0].tolist() == pytest.approx([right, wrong, wrong, wrong], rel=1e-5)
    assert evaluation.evaluate_hellaswag(model, examples, "cpu") == dict(acc=0.0, acc_norm=1.0, n=1)


def test_batching_and_padding_match_one_example_at_a_time(examples):
    model = tiny_gpt()
    sums, means = evaluation.ending_losses(model, examples, "cpu")  # one padded batch of 20 rows
    for i, ex in enumerate(examples):
        ref_sums, ref_means = reference_losses(model, ex)
        assert sums[i].tolist() == pytest.approx(ref_sums, rel=1e-5, abs=1e-5)
        assert means[i].tolist() == pytest.approx(ref_means, rel=1e-5, abs=1e-5)
    results = [evaluation.evaluate_hellaswag(model, examples, "cpu", batch_size=b) for b in (1, 2, 5)]
    assert results[0] == results[1] == results[2]
    assert evaluation.evaluate_hellaswag(model, examples, "cpu", limit=2)["n"] == 2


def test_left_truncation_at_block_size(tmp_path):
    rows = FIXTURE[:2] + [("One two", ["a b c d e f g h i j k", "x", "y z", "w"], 0)]  # an ending longer than the block
    examples = evaluation.load_examples(write_jsonl(tmp_path / "h.jsonl", rows))
    model = tiny_gpt(block_size=8)  # GPT.forward raises beyond block_size: truncation must happen
    assert max(len(ex["ctx_ids"]) + len(e) for ex in examples for e in ex["ending_ids"]) > 8
    for ex in examples:
        sums, means = evaluation.ending_losses(model, [ex], "cpu")
        ref_sums, ref_means = reference_losses(model, ex)
        assert sums[0].tolist() == pytest.approx(ref_sums, rel=1e-5)
        assert means[0].tolist() == pytest.approx(ref_means, rel=1e-5)
    assert evaluation.evaluate_hellaswag(model, examples, "cpu", batch_size=3)["n"] == 3


def test_training_mode_restored_and_last_position_logits_rejected(examples):
    model = tiny_gpt().train()
    evaluation.evaluate_hellaswag(model, examples, "cpu")
    assert model.training

    class LastOnly(LookupModel):
        def forward(self, idx, targets=None):
            return super().forward(idx)[0][:, -1:], None

    with pytest.raises(ValueError, match="every position"):
        evaluation.evaluate_hellaswag(LastOnly([], 0.0), examples, "cpu")


def _distributed_worker(rank, world, tmp, fixture_path):
    torch.distributed.init_process_group("gloo", init_method=f"file://{tmp}/rendezvous", rank=rank,
                                         world_size=world)
    try:
        examples = evaluation.load_examples(fixture_path)
        result = evaluation.evaluate_hellaswag(LookupModel([], 0.0), examples, "cpu", batch_size=1)
        with open(f"{tmp}/rank{rank}.json", "w") as f:
            json.dump(result, f)
    finally:
        torch.distributed.destroy_process_group()


def test_ranks_split_examples_and_sum_counts(tmp_path, fixture_path):
    # Rank 0 scores examples 0, 2, 4 and rank 1 examples 1, 3; only the summed counts give 3/5, 2/5.
    # fork: the workers start in milliseconds instead of re-importing torch (seconds).
    mp.start_processes(_distributed_worker, args=(2, str(tmp_path), fixture_path), nprocs=2, start_method="fork")
    for rank in range(2):
        with open(tmp_path / f"rank{rank}.json") as f:
            assert json.load(f) == dict(acc=3 / 5, acc_norm=2 / 5, n=5)


def test_download_failure_points_to_input(tmp_path, monkeypatch, fixture_path):
    def offline(*args, **kwargs):
        raise urllib.error.URLError("no network")

    monkeypatch.setattr(urllib.request, "urlopen", offline)
    with pytest.raises(FileNotFoundError, match="--input="):
        evaluation.load_examples("val", data_dir=str(tmp_path))
    # A cached file is read without the network.
    (tmp_path / "hellaswag_val.jsonl").write_text(open(fixture_path).read())
    assert len(evaluation.load_examples("val", limit=3, data_dir=str(tmp_path))) == 3


def test_command_line_on_a_run_directory(tmp_path, fixture_path):
    model = tiny_gpt()
    config = {k: getattr(model.config, k) for k in model_config_fields()}
    torch.save(dict(model=model.state_dict(), config=config), tmp_path / "ckpt.pt")
    out_json = tmp_path / "hellaswag.json"
    result = hellaswag.main([f"--out_dir={tmp_path}", f"--input={fixture_path}", "--limit=4", "--device=cpu",
                             "--dtype=float32", f"--out_json={out_json}"])
    assert result["n"] == 4
    expected = evaluation.evaluate_hellaswag(model, evaluation.load_examples(fixture_path), "cpu", limit=4)
    assert result == expected
    assert json.loads(out_json.read_text())["acc_norm"] == expected["acc_norm"]
    # The same weights trained on characters would read HellaSwag's BPE ids as other tokens.
    (tmp_path / "run_info.json").write_text(json.dumps({"facts": {"tokenizer": "char"}}))
    with pytest.raises(configurator.ConfigError, match="trained on 'char' tokens but HellaSwag uses GPT-2's BPE"):
        hellaswag.main([f"--out_dir={tmp_path}", f"--input={fixture_path}", "--device=cpu"])


class EqualProbabilityModel(torch.nn.Module):
    """Every ending token gets the same probability: after a prefix that continues into an ending,
    the logits are one fixed random vector rotated so that the ending's next token sits on the
    same entry (the same values in another vocabulary order); at the last context position, shared
    by the four endings, the four first tokens get one equal logit. Exact arithmetic gives every
    ending token the same loss, so endings of equal length tie and all endings' means tie."""

    def __init__(self, examples, block_size=64):
        super().__init__()
        self.config = SimpleNamespace(block_size=block_size, vocab_size=VOCAB)
        self.values = torch.randn(VOCAB, generator=torch.Generator().manual_seed(0)) * 4
        self.next_token, self.first_tokens = {}, {}
        for ex in examples:
            ctx = tuple(ex["ctx_ids"])
            self.first_tokens[ctx] = [ending[0] for ending in ex["ending_ids"]]
            for ending in ex["ending_ids"]:
                seq = ex["ctx_ids"] + ending
                for i in range(len(ex["ctx_ids"]) + 1, len(seq)):
                    self.next_token[tuple(seq[:i])] = seq[i]

    def forward(self, idx, targets=None):
        logits = torch.zeros(*idx.shape, VOCAB)
        for b, row in enumerate(idx.tolist()):
            for t in range(len(row)):
                prefix = tuple(row[:t + 1])
                if prefix in self.next_token:  # the next token lands on entry 0 of the values
                    logits[b, t] = self.values.roll(self.next_token[prefix])
                elif prefix in self.first_tokens:
                    logits[b, t] = self.values
                    logits[b, t, self.first_tokens[prefix]] = 2.5
        return logits, None


def test_endings_with_equal_probability_tie_and_go_to_the_lowest_index(tmp_path):
    rows = [("A man stands in a park. He", ["runs away fast", "eats the cake", "sees a dog", "jumps over it"], 0),
            ("A girl is at home. She", ["opens the door", "walks to school", "reads a book", "drinks some tea"], 2)]
    examples = evaluation.load_examples(write_jsonl(tmp_path / "tie.jsonl", rows))
    assert {len(e) for ex in examples for e in ex["ending_ids"]} == {3}
    sums, means = evaluation.ending_losses(EqualProbabilityModel(examples), examples, "cpu")
    for ex_sums, ex_means in zip(sums, means):
        assert len(set(ex_sums.tolist())) == 1 and len(set(ex_means.tolist())) == 1, (ex_sums, ex_means)
    assert evaluation.evaluate_hellaswag(EqualProbabilityModel(examples), examples, "cpu") == \
        dict(acc=0.5, acc_norm=0.5, n=2)  # ending 0 wins both: right for the first example only
