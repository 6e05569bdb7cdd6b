"""data/{openwebtext,finewebedu,wikitext2}/prepare.py and prepare_common, on small offline fixtures.

Each script runs on a fixture corpus through --input (the same `datasets.load_dataset` path as
the hub), in this process for speed; one test runs them as a user would, with the hub offline.
"""
import importlib.util
import json
import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from data import prepare_common
import tokendata
from tokendata import EOT_TOKEN

REPO = Path(__file__).resolve().parents[1]
SCRIPTS = {name: REPO / "data" / name / "prepare.py"
           for name in ("openwebtext", "finewebedu", "wikitext2")}


def load_script(name):
    # data/<name> is not a package, so load the script from its path.
    spec = importlib.util.spec_from_file_location(f"{name}_prepare", SCRIPTS[name])
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


@pytest.fixture(scope="module")
def enc():
    return tokendata.gpt2_encoding()


def run(name, input_path, out_dir, *flags):
    return load_script(name).main(["--input", str(input_path), "--out_dir", str(out_dir), *flags])


def split_documents(tokens):
    """Token lists between EOTs, each with its EOT; the file must end with one."""
    tokens = np.asarray(tokens)
    assert tokens.size and tokens[-1] == EOT_TOKEN
    ends = np.flatnonzero(tokens == EOT_TOKEN) + 1
    return [tokens[start:end].tolist() for start, end in zip(np.r_[0, ends[:-1]], ends)]


def check_output(out_dir, enc, expected_docs):
    """train.bin/val.bin/meta.json hold exactly encode_document of `expected_docs[split]`."""
    meta = json.loads((Path(out_dir) / "meta.json").read_text())
    assert (meta["tokenizer"], meta["dtype"]) == ("gpt2", "uint16")
    for split, docs in expected_docs.items():
        expected = [t for doc in docs for t in tokendata.encode_document(enc, doc)]
        tokens = tokendata.open_split(str(out_dir), split)
        assert meta[f"{split}_tokens"] == tokendata.split_num_tokens(str(out_dir), split)
        assert tokens.tolist() == expected
        assert int((tokens == EOT_TOKEN).sum()) == len(docs) == meta[f"{split}_num_documents"]
    assert not list(Path(out_dir).glob("*.tmp"))
    return meta


def decoded_documents(out_dir, enc, split):
    return [enc.decode(doc[:-1]) for doc in split_documents(tokendata.open_split(out_dir, split))]


# ---------------------------------------------------------------- tokendata.SplitWriter

def test_split_writer_round_trip(tmp_path):
    with tokendata.SplitWriter(str(tmp_path), ("train", "val")) as writer:
        writer.write("train", [1, 2])
        writer.write("val", np.array([EOT_TOKEN], dtype=np.uint16))
        writer.write("train", np.array([3, 2**16 - 1]))
        assert not (tmp_path / "train.bin").exists()  # only .tmp files until the block ends
    assert writer.n_tokens == {"train": 4, "val": 1}
    assert tokendata.open_split(str(tmp_path), "train").tolist() == [1, 2, 3, 2**16 - 1]
    assert tokendata.open_split(str(tmp_path), "val").tolist() == [EOT_TOKEN]
    assert sorted(p.name for p in tmp_path.iterdir()) == ["train.bin", "val.bin"]


@pytest.mark.parametrize("error", [KeyboardInterrupt, SystemExit, ValueError])
def test_split_writer_interrupted_keeps_old_files(tmp_path, error):
    with tokendata.SplitWriter(str(tmp_path)) as writer:
        writer.write("train", [7, 8])
        writer.write("val", [9])
    old = {p.name: p.read_bytes() for p in tmp_path.iterdir()}
    with pytest.raises(error):
        with tokendata.SplitWriter(str(tmp_path)) as writer:
            writer.write("train", [1, 2, 3])
            if error is ValueError:
                writer.write("val", [2**16])  # out of uint16 range: raises
            raise error()
    assert {p.name: p.read_bytes() for p in tmp_path.iterdir()} == old


# ---------------------------------------------------------------- fixtures

def web_documents(n=50):
    """Short distinct documents with the awkward parts of web text."""
    words = ["the", "quick", "naïve", "café", "日本語", "🎭", "don't", "  two", "\ttab", "42"]
    docs = []
    for i in range(n):
        body = " ".join(words[(i * 7 + k) % len(words)] for k in range(3 + i % 9))
        docs.append(f"Page {i}.\n{body}\n" + ("\n<|endoftext|> literal\n" if i == 3 else ""))
    return docs


def routed_split(docs, out_dir, enc, seed, val_fraction):
    """Which documents each split holds, read back from the files (in file order)."""
    by_text = {doc: i for i, doc in enumerate(docs)}
    split_ids = {s: [by_text[text] for text in decoded_documents(str(out_dir), enc, s)]
                 for s in ("train", "val")}
    # Every document exactly once, order kept within a split, and val is the keyed-hash rule.
    assert sorted(split_ids["train"] + split_ids["val"]) == list(range(len(docs)))
    assert all(ids == sorted(ids) for ids in split_ids.values())
    assert split_ids["val"] == [i for i in range(len(docs))
                                if prepare_common.is_val(i, seed, val_fraction)]
    return {s: [docs[i] for i in ids] for s, ids in split_ids.items()}


@pytest.fixture(scope="module")
def owt_jsonl(tmp_path_factory):
    """OpenWebText-like: one .jsonl file, the text under a non-default field name."""
    path = tmp_path_factory.mktemp("owt_input") / "owt.jsonl"
    docs = web_documents()
    with open(path, "w", encoding="utf-8") as f:
        for i, doc in enumerate(docs):
            f.write(json.dumps({"id": i, "body": doc}) + "\n")
    return path, docs


@pytest.fixture(scope="module")
def fineweb_parquet(tmp_path_factory):
    """fineweb-edu-like: parquet shards in the hub's layout, with its extra columns."""
    root = tmp_path_factory.mktemp("fineweb_input")
    (root / "sample" / "10BT").mkdir(parents=True)
    docs = web_documents()[::-1]
    for shard, start in enumerate((0, 20)):
        part = docs[start:start + (20 if shard == 0 else len(docs))]
        table = pa.table({"text": part, "id": [f"<urn:{start + i}>" for i in range(len(part))],
                          "score": [2.5] * len(part)})
        pq.write_table(table, root / "sample" / "10BT" / f"{shard:03d}_00000.parquet",
                       row_group_size=8)
    return root, docs


def wiki_lines(*lines):
    # Every line of wiki.*.raw ends in " \n" (blank ones too); spelled out so that no editor's
    # trailing-whitespace cleanup can change the fixture.
    return "".join(f"{line} \n" for line in lines)


WIKI_TRAIN = wiki_lines(
    "", " = Valkyria Chronicles III =", "",
    " Senjō no Valkyria 3 is a tactical role @-@ playing game .", "",
    " = = Gameplay = =", "", " As with previous games , the player fights .", "",
    " = = = Units = = =", "", " Troops carry 1 @,@ 000 rounds .", "",
    " = Tower Building of the Little Rock Arsenal =", "",
    " The building is in Little Rock , Arkansas .", "",
    " = Cicely Mary Barker =", "",
    " Cicely Mary Barker was an English illustrator = best known for fairies .", "",
    " = = Early life = =", "", " She was born in 1895 .", "")
WIKI_VALID = wiki_lines(
    "", " = Homarus gammarus =", "", " Homarus gammarus is a lobster .", "",
    " = = Description = =", "", " It is blue .", "",
    " = Ise @-@ class battleship =", "", " The Ise class were battleships .")


@pytest.fixture(scope="module")
def wikitext_raw(tmp_path_factory):
    """WikiText-2 as originally released: wiki.{train,valid,test}.raw in one directory."""
    root = tmp_path_factory.mktemp("wikitext_input")
    (root / "wiki.train.raw").write_text(WIKI_TRAIN, encoding="utf-8")
    (root / "wiki.valid.raw").write_text(WIKI_VALID, encoding="utf-8")
    (root / "wiki.test.raw").write_text(wiki_lines("", " = Test only =", "", " Never read ."),
                                        encoding="utf-8")
    return root


def wiki_articles(text):
    """The articles of a wikitext file, each from its title line up to the next title; blank
    lines before the first title belong to the first article."""
    titles = [i for i, line in enumerate(text.splitlines(keepends=True))
              if line.startswith(" = ") and not line.startswith(" = = ")]
    lines = text.splitlines(keepends=True)
    starts = [0] + titles[1:]
    return ["".join(lines[a:b]) for a, b in zip(starts, starts[1:] + [len(lines)])]


# ---------------------------------------------------------------- openwebtext / finewebedu

def test_openwebtext_tokens_and_routing(owt_jsonl, enc, tmp_path):
    path, docs = owt_jsonl
    meta = run("openwebtext", path, tmp_path, "--text_field", "body", "--val_fraction", "0.2",
               "--num_proc", "1")
    expected = routed_split(docs, tmp_path, enc, seed=2357, val_fraction=0.2)
    assert 0 < len(expected["val"]) < len(docs) / 2
    assert not set(expected["train"]) & set(expected["val"])
    check_output(tmp_path, enc, expected)
    assert meta["train_num_documents"] + meta["val_num_documents"] == len(docs)
    assert "owt.jsonl" in meta["source"] and "seed=2357" in meta["split_rule"]


def test_finewebedu_tokens_and_routing(fineweb_parquet, enc, tmp_path):
    root, docs = fineweb_parquet
    run("finewebedu", root, tmp_path, "--val_fraction", "0.25", "--seed", "7", "--num_proc", "1")
    expected = routed_split(docs, tmp_path, enc, seed=7, val_fraction=0.25)
    assert not set(expected["train"]) & set(expected["val"])
    check_output(tmp_path, enc, expected)


def test_local_parquet_is_read_by_row_group(fineweb_parquet):
    # Read as one shard, a parquet file is decoded ahead of the tokenizer up to its whole size.
    args = prepare_common.parse_args(["--input", str(fineweb_parquet[0])], "", "out",
                                     "HuggingFaceFW/fineweb-edu", "sample-10BT")
    rows, _, _ = prepare_common.load_rows(args, "train", ["train"], True, "document")
    assert rows.num_shards == 3 + 4  # row groups of 8 rows: 20 + 30 documents


@pytest.mark.parametrize("name", ["openwebtext", "finewebedu"])
def test_routed_output_is_deterministic(name, owt_jsonl, fineweb_parquet, tmp_path):
    if name == "openwebtext":
        input_path, flags = owt_jsonl[0], ["--text_field", "body", "--val_fraction", "0.2"]
    else:
        input_path, flags = fineweb_parquet[0], ["--val_fraction", "0.2"]
    for out, num_proc in (("a", "1"), ("b", "2"), ("c", "2")):
        run(name, input_path, tmp_path / out, *flags, "--num_proc", num_proc)
    for file in ("train.bin", "val.bin", "meta.json"):
        first = (tmp_path / "a" / file).read_bytes()
        assert first == (tmp_path / "b" / file).read_bytes() == (tmp_path / "c" / file).read_bytes()


def test_openwebtext_txt_files_are_documents(enc, tmp_path):
    # The original OpenWebText release is one .txt file per document.
    docs = web_documents(12)
    for i, doc in enumerate(docs):
        (tmp_path / "in" / f"urlsf_{i:02d}").mkdir(parents=True)
        (tmp_path / "in" / f"urlsf_{i:02d}" / "page.txt").write_text(doc, encoding="utf-8")
    run("openwebtext", tmp_path / "in", tmp_path / "out", "--val_fraction", "0.3")
    expected = routed_split(docs, tmp_path / "out", enc, seed=2357, val_fraction=0.3)
    check_output(tmp_path / "out", enc, expected)


def test_empty_val_split_is_an_error(owt_jsonl, tmp_path):
    # 50 documents at nanoGPT's 0.0005 almost surely route none to val: say so, write nothing.
    with pytest.raises(SystemExit, match="raise --val_fraction"):
        run("openwebtext", owt_jsonl[0], tmp_path, "--text_field", "body")
    assert not list(tmp_path.iterdir())


def test_tokenizer_pool_keeps_input_order(enc):
    # A slow first chunk (one long document) must still come out first: output order is
    # input order whatever the workers' timing, which is what makes reruns byte-identical.
    items = [("train", "slow " * 50_000)] + [("val", f"doc {i}") for i in range(300)]
    with prepare_common.tokenizer(2) as tokenize:
        out = list(tokenize(iter(items)))
    assert [split for split, _ in out] == [split for split, _ in items]
    assert all(ids.dtype == np.uint16 and ids.tolist() == tokendata.encode_document(enc, text)
               for (_, ids), (_, text) in zip(out, items))


# ---------------------------------------------------------------- wikitext2

def test_wikitext_articles_from_raw_files(wikitext_raw, enc, tmp_path):
    meta = run("wikitext2", wikitext_raw, tmp_path, "--num_proc", "2")
    expected = {"train": wiki_articles(WIKI_TRAIN), "val": wiki_articles(WIKI_VALID)}
    assert [len(docs) for docs in expected.values()] == [3, 2]
    check_output(tmp_path, enc, expected)
    # Verbatim: the articles put back together are the file, and each starts at its title.
    for split, text in (("train", WIKI_TRAIN), ("val", WIKI_VALID)):
        articles = decoded_documents(str(tmp_path), enc, split)
        assert "".join(articles) == text
        assert all(a.lstrip(" \n").startswith("= ") for a in articles)
    assert "Never read" not in "".join(decoded_documents(str(tmp_path), enc, "train"))
    assert "validation" in meta["split_rule"]


def test_wikitext_from_hub_style_parquet(enc, tmp_path):
    # The hub's rows: one line each with its "\n", blank lines as "" (not " \n").
    root = tmp_path / "wikitext-2-raw-v1"
    root.mkdir()
    splits = {"train": WIKI_TRAIN, "validation": WIKI_VALID, "test": " = Test only = \n"}
    for split, text in splits.items():
        rows = ["" if not line.strip() else line for line in text.splitlines(keepends=True)]
        pq.write_table(pa.table({"text": rows}), root / f"{split}-00000-of-00001.parquet")
    run("wikitext2", root, tmp_path / "out", "--num_proc", "1")
    for split, upstream in (("train", "train"), ("val", "validation")):
        rows = ["" if not line.strip() else line for line in splits[upstream].splitlines(True)]
        articles = decoded_documents(str(tmp_path / "out"), enc, split)
        assert "".join(articles) == "".join(rows)
        assert len(articles) == len(wiki_articles(splits[upstream]))


def test_wikitext_article_splitting():
    articles = load_script("wikitext2").articles
    rows = ["", " = A = \n", "", " a .\n", " = = Section = = \n", " s .\n", "",
            " = B = \n", " b = c .\n", " = = = Deep = = = \n", " = C = \n", " = D = \n", ""]
    assert list(articles(rows)) == [
        " = A = \n a .\n = = Section = = \n s .\n", " = B = \n b = c .\n = = = Deep = = = \n",
        " = C = \n", " = D = \n"]
    assert list(articles(["", " \n"])) == []


def test_wikitext_needs_both_splits(wikitext_raw, tmp_path):
    with pytest.raises(SystemExit, match="validation"):
        run("wikitext2", wikitext_raw / "wiki.train.raw", tmp_path)


# ---------------------------------------------------------------- failures

def test_bad_document_midway_leaves_old_files(owt_jsonl, tmp_path):
    path, docs = owt_jsonl
    flags = ["--text_field", "body", "--val_fraction", "0.2"]
    run("openwebtext", path, tmp_path / "out", *flags)
    before = {f: (tmp_path / "out" / f).read_bytes() for f in ("train.bin", "val.bin", "meta.json")}
    bad = tmp_path / "bad.jsonl"
    lines = path.read_text(encoding="utf-8").splitlines()
    lines[30] = json.dumps({"id": 30, "body": None})  # row 30 of 50: halfway through
    bad.write_text("\n".join(lines) + "\n", encoding="utf-8")
    for num_proc in ("1", "2"):
        with pytest.raises(SystemExit, match="row 30"):
            run("openwebtext", bad, tmp_path / "out", *flags, "--num_proc", num_proc)
        after = {f: (tmp_path / "out" / f).read_bytes() for f in before}
        assert after == before
        assert not list((tmp_path / "out").glob("*.tmp"))
        with pytest.raises(SystemExit, match="row 30"):
            run("openwebtext", bad, tmp_path / f"fresh{num_proc}", *flags, "--num_proc", num_proc)
        assert not list((tmp_path / f"fresh{num_proc}").iterdir())


def test_interrupt_leaves_no_train_bin(wikitext_raw, tmp_path, monkeypatch):
    encode, calls = tokendata.encode_document, []

    def interrupted(enc, text):
        calls.append(text)
        if len(calls) == 4:  # the first val article: train's three are all written by now
            raise KeyboardInterrupt
        return encode(enc, text)

    monkeypatch.setattr(tokendata, "encode_document", interrupted)
    with pytest.raises(KeyboardInterrupt):
        run("wikitext2", wikitext_raw, tmp_path, "--num_proc", "1")
    assert len(calls) == 4
    assert not list(tmp_path.iterdir())  # neither train.bin nor its .tmp


def test_missing_text_field_names_the_flag(fineweb_parquet, tmp_path):
    with pytest.raises(SystemExit, match="--text_field"):
        run("finewebedu", fineweb_parquet[0], tmp_path, "--text_field", "content")


@pytest.mark.parametrize("name", ["finewebedu", "wikitext2"])
def test_hub_unreachable_says_use_input(name, tmp_path):
    # As a user runs it, with no --input: the hub is off and nothing is cached.
    env = dict(os.environ, HF_HUB_OFFLINE="1", HF_HOME=str(tmp_path / "hf"))
    proc = subprocess.run([sys.executable, str(SCRIPTS[name]), "--out_dir", str(tmp_path / "out")],
                          cwd=tmp_path, env=env, capture_output=True, text=True, timeout=60)
    assert proc.returncode != 0
    assert "--input" in proc.stderr and "Hugging Face hub" in proc.stderr
    assert "Traceback" not in proc.stderr
    assert not (tmp_path / "out" / "train.bin").exists()
