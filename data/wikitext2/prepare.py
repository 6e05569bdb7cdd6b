"""WikiText-2 (raw) as GPT-2 tokens: train.bin, val.bin and meta.json next to this file.

The corpus is Hugging Face's `Salesforce/wikitext` (formerly `wikitext`), config
`wikitext-2-raw-v1`; its train and validation splits become train.bin and val.bin (test is
left alone). WikiText rows are lines, so lines are regrouped into articles: an article starts
at each top-level heading ` = Title = ` (` = = Section = = ` is a section inside it), and EOT
goes between articles. The text is kept verbatim, tokenizer artifacts such as ` @-@ ` included.
Merity et al. (2016) count 600 train and 60 validation articles; not checked against the hub
here (no network on this machine).

Offline: pass --input with a directory holding wiki.train.raw and wiki.valid.raw (the original
release), or the hub's wikitext-2-raw-v1/ directory of train-*.parquet and validation-*.parquet
(`hf download --repo-type dataset Salesforce/wikitext --include "wikitext-2-raw-v1/*"`; point
--input at that directory, not the repository, which holds every config).

    python data/wikitext2/prepare.py [--input DIR] [--out_dir DIR]
"""
import os
import re
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))  # repo root, for data.prepare_common
from data import prepare_common  # noqa: E402

# " = Valkyria Chronicles III = \n": one '=' each side; " = = Gameplay = = " is a section.
TITLE = re.compile(r" = [^=](?:.*[^=])? = \n?")


def articles(lines):
    """Join wikitext lines into articles, each starting at its title line.

    Blank lines before the first title join the first article, so no document is empty.
    """
    article, has_text = [], False
    for line in lines:
        if TITLE.fullmatch(line) and has_text:
            yield "".join(article)
            article, has_text = [], False
        article.append(line)
        has_text = has_text or bool(line.strip())
    if has_text:
        yield "".join(article)


def main(argv=None):
    here = os.path.dirname(os.path.abspath(__file__))
    return prepare_common.prepare(
        argv, description=__doc__, out_dir=here,
        hub_id="Salesforce/wikitext", hub_config="wikitext-2-raw-v1", streaming=False,
        upstream_splits={"train": "train", "val": "validation"}, documents=articles,
        text_rows="line")


if __name__ == "__main__":
    main()
