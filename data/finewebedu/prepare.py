"""FineWeb-Edu (10B-token sample) as GPT-2 tokens: train.bin, val.bin and meta.json here.

The corpus is Hugging Face's `HuggingFaceFW/fineweb-edu`, config `sample-10BT`: ~9.7M
educational web pages, ~10B GPT-2 tokens (~20 GB of uint16 train.bin), train split only. It
is streamed: each document is tokenized as it arrives and routed to val when a keyed hash of
its index falls under val_fraction (0.001, ~10M val tokens), so nothing but the two .bin files
ever reaches the disk. Peak memory is bounded by one parquet shard (the hub's files of ~2 GB
are decoded ahead of the tokenizer; --input reads them a row group at a time instead).
Not run end to end here (no network on this machine).

Offline: pass --input with the parquet shards (`hf download --repo-type dataset
HuggingFaceFW/fineweb-edu --include "sample/10BT/*"`) or .jsonl files with a text field.

    python data/finewebedu/prepare.py [--num_proc N] [--input PATH] [--out_dir DIR]
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
        hub_id="HuggingFaceFW/fineweb-edu", hub_config="sample-10BT", val_fraction=0.001, seed=1337)


if __name__ == "__main__":
    main()
