"""OpenWebText as GPT-2 tokens: train.bin, val.bin and meta.json next to this file.

The corpus is Hugging Face's `Skylion007/openwebtext` (formerly `openwebtext`): ~8M web pages,
one document each, and only a train split upstream. As in nanoGPT, a val split is carved out
with val_fraction 0.0005 and seed 2357 (~4,000 documents), here by a keyed hash of each
document's index so the corpus can be streamed (no ~54 GB copy in the datasets cache).
nanoGPT reports ~9B train and ~4M val tokens; not measured here (no network on this machine).

The hub repository has shipped a loading script (openwebtext.py), which `datasets` 4+ refuses
to run ("Dataset scripts are no longer supported"); if loading fails that way, point --hub_id at
a parquet copy, or pass --input: the original release's .txt files, one document per file
(extracted twice: each subset .tar holds .xz archives of .txt files), or .jsonl/.parquet files
with a text field.

    python data/openwebtext/prepare.py [--num_proc N] [--input PATH] [--out_dir DIR]
"""
import os
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))  # repo root, for data.prepare_common
from data import prepare_common  # noqa: E402


def main(argv=None):
    here = os.path.dirname(os.path.abspath(__file__))
    return prepare_common.prepare(
        argv, description=__doc__, out_dir=here,
        hub_id="Skylion007/openwebtext", val_fraction=0.0005, seed=2357)


if __name__ == "__main__":
    main()
