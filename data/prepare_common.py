"""The pipeline behind data/<corpus>/prepare.py for Hugging Face corpora: load, tokenize, write.

data/openwebtext, data/finewebedu and data/wikitext2 each call `prepare(...)` with what differs
(dataset id and config, how train/val are formed, how rows become documents); the rest is here:
the common flags, loading through `datasets` (the hub, or local files with --input through the
same `load_dataset` path), GPT-2 tokenization in a process pool, and the atomic writes.

Why a file of its own rather than more of tokendata.py: tokendata is imported by train.py, eval
and sampling and needs only numpy, while this pipeline needs `datasets`, multiprocessing and
argparse and serves the prepare scripts alone. The token-file format itself (`SplitWriter`, which
writes train.bin and val.bin together, all or nothing) belongs with the readers in tokendata.

Output is deterministic: documents are tokenized in order (`Pool.imap` keeps input order), and a
document's split depends only on its index and the seed, never on --num_proc or timing.
"""
import argparse
import contextlib
import hashlib
import multiprocessing
import os
import re
import signal
import sys
import time
from pathlib import Path

import numpy as np

import tokendata

BUILDERS = {".parquet": "parquet", ".json": "json", ".jsonl": "json",
            ".txt": "text", ".text": "text", ".raw": "text"}  # wikitext ships wiki.train.raw
COMPRESSION = {".gz", ".bz2", ".xz", ".zst", ".lz4"}  # datasets decompresses these on the fly
# Words in a local file's path that name its split, as the hub's own file naming does
# (train-00000-of-00001.parquet, wiki.valid.raw ...). Only used when a corpus has upstream splits.
SPLIT_WORDS = {"train": {"train", "training"},
               "validation": {"validation", "valid", "val", "dev"},
               "test": {"test", "testing"}}


class PrepareError(Exception):
    """A problem with the input that the user can fix; reported as one message, no traceback.

    An exception rather than sys.exit because loading runs inside Pool.imap's feeder thread,
    which forwards an Exception to the caller but would swallow SystemExit and hang it.
    """


def parse_args(argv, description, out_dir, hub_id, hub_config, val_fraction=None, seed=None):
    parser = argparse.ArgumentParser(description=description,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--out_dir", default=out_dir, help="where train.bin, val.bin, meta.json go")
    parser.add_argument("--input", help="read local files instead of the hub: a .parquet, .jsonl, "
                        ".json or .txt file (optionally .gz/.zst...), or a directory of them")
    parser.add_argument("--text_field", default="text", help="column holding each document's text")
    parser.add_argument("--num_proc", type=int, default=max(1, (os.cpu_count() or 2) // 2),
                        help="tokenizer processes (1: tokenize in this process)")
    parser.add_argument("--hub_id", default=hub_id, help="Hugging Face dataset id, e.g. a mirror")
    parser.add_argument("--hub_config", default=hub_config, help="its config name")
    if val_fraction is not None:
        parser.add_argument("--val_fraction", type=float, default=val_fraction,
                            help="expected fraction of documents routed to val.bin")
        parser.add_argument("--seed", type=int, default=seed, help="seed of the train/val routing")
    args = parser.parse_args(argv)
    if args.num_proc < 1:
        parser.error("--num_proc must be at least 1")
    if val_fraction is not None and not 0 < args.val_fraction < 1:
        parser.error(f"--val_fraction must be in (0, 1), got {args.val_fraction}")
    return args


# ---------------------------------------------------------------- loading

def builder_of(path):
    suffixes = [s.lower() for s in Path(path).suffixes]
    if suffixes and suffixes[-1] in COMPRESSION:
        suffixes.pop()
    return BUILDERS.get(suffixes[-1]) if suffixes else None


def local_data_files(input_path, upstream_splits):
    """(datasets builder, {upstream split: sorted files}) for --input.

    With one upstream split every file belongs to it; with several (wikitext's train and
    validation), each file is assigned by a split word in its path relative to --input.
    """
    root = Path(input_path)
    if root.is_file():
        files = [root]
    elif root.is_dir():
        files = sorted(p for p in root.rglob("*") if p.is_file() and builder_of(p)
                       and not any(part.startswith(".") for part in p.relative_to(root).parts))
    else:
        raise PrepareError(f"--input {input_path}: no such file or directory")
    builders = {builder_of(p) for p in files}
    if len(builders) != 1 or None in builders:
        raise PrepareError(f"--input {input_path}: expected .parquet, .jsonl/.json or .txt files "
                           f"of one kind, found {sorted(str(b) for b in builders) or 'none'}")
    if len(upstream_splits) == 1:
        return builders.pop(), {upstream_splits[0]: [str(p) for p in files]}
    by_split = {split: [] for split in upstream_splits}
    for p in files:
        name = p.relative_to(root) if root.is_dir() else p.name
        words = set(re.split(r"[^a-z]+", str(name).lower()))
        for split in upstream_splits:
            if words & SPLIT_WORDS.get(split, {split}):
                by_split[split].append(str(p))
    missing = [split for split, split_files in by_split.items() if not split_files]
    if missing:
        raise PrepareError(f"--input {input_path}: found no file for split(s) {missing}; put one "
                           f"file per split, named after it (wiki.train.raw, wiki.valid.raw ...) "
                           f"in one directory")
    return builders.pop(), by_split


def load_rows(args, upstream_split, upstream_splits, streaming, text_rows):
    """(rows of one upstream split, the field holding the text, a description of the source).

    The hub and --input both go through datasets.load_dataset, so both take the same code path.
    `text_rows` says how a .txt file becomes rows: "document" (one file, one document, as in
    the original OpenWebText release) or "line" (wikitext, whose documents are groups of lines).
    """
    import datasets
    if args.input:
        builder, data_files = local_data_files(args.input, upstream_splits)
        kwargs = dict(sample_by=text_rows, keep_linebreaks=True) if builder == "text" else {}
        # Streaming reads the files in place: no copy of the corpus in the datasets cache.
        rows = datasets.load_dataset(builder, data_files=data_files, split=upstream_split,
                                     streaming=True, **kwargs)
        # One shard per parquet row group, same order (a no-op for json and text): as one shard,
        # a parquet file is decoded ahead of the slower tokenizer up to its whole size (measured
        # +650 MB of peak memory on a 270 MB file, flat with reshard). Not done for the hub: each
        # row group would cost its own HTTP requests (likely thousands for fineweb-edu).
        rows = rows.reshard()
        n_files = len(data_files[upstream_split])
        source = f"{n_files} local {builder} file(s) under {args.input} as split {upstream_split}"
        return rows, ("text" if builder == "text" else args.text_field), source
    name = args.hub_id + (f" ({args.hub_config})" if args.hub_config else "")
    try:
        rows = datasets.load_dataset(args.hub_id, args.hub_config, split=upstream_split,
                                     streaming=streaming)
    except Exception as e:  # offline, unreachable, gated, renamed, or a legacy loading script
        # from None: the cause is in the message, and its traceback would only bury the fix.
        raise PrepareError(f"could not load {name} from the Hugging Face hub: "
                           f"{type(e).__name__}: {e}\nIf the hub is unreachable from here, "
                           f"download the files elsewhere (`hf download --repo-type dataset "
                           f"{args.hub_id} --include ...`, which files: see --help), copy them "
                           f"over and pass --input PATH (a .parquet, .jsonl or .txt file, or a "
                           f"directory of them).") from None
    return rows, args.text_field, f"{name} split {upstream_split} (datasets {datasets.__version__})"


def num_rows(rows, upstream_split):
    """Row count for the progress bar when the dataset knows it (streaming ones may not)."""
    try:
        return len(rows)
    except TypeError:
        pass
    try:
        return rows.info.splits[upstream_split].num_examples or None
    except (AttributeError, KeyError, TypeError):
        return None


def texts(rows, text_field):
    for i, row in enumerate(rows):
        if text_field not in row:
            raise PrepareError(f"row {i} has no field {text_field!r} (it has {sorted(row)}); "
                               f"pass --text_field")
        text = row[text_field]
        if not isinstance(text, str):
            raise PrepareError(f"row {i}: {text_field!r} is {type(text).__name__}, not text")
        yield text


# ---------------------------------------------------------------- routing and tokenizing

def is_val(index, seed, val_fraction):
    """Whether document `index` goes to val: a keyed hash, identical on every machine and run."""
    digest = hashlib.blake2b(f"{seed}:{index}".encode(), digest_size=8).digest()
    return int.from_bytes(digest, "little") < val_fraction * 2**64


_enc = None  # the GPT-2 encoding, one per tokenizer process


def _init_tokenizer():
    global _enc
    if _enc is None:
        _enc = tokendata.gpt2_encoding()


def _init_worker():
    # Ctrl-C reaches the whole process group: let the parent alone handle it (discarding the
    # .tmp files, then terminating the pool) instead of every worker printing a traceback.
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    _init_tokenizer()


def _tokenize(item):
    split, text = item
    return split, np.array(tokendata.encode_document(_enc, text), dtype=tokendata.TOKEN_DTYPE)


@contextlib.contextmanager
def tokenizer(num_proc):
    """A function mapping (split, text) items to (split, uint16 ids + EOT), in input order.

    The pool is forked here, before `datasets` loads anything (and starts any thread), and is
    terminated when the block exits, an exception included.
    """
    _init_tokenizer()  # before forking, so forked workers inherit it instead of rebuilding it
    if num_proc == 1:
        yield lambda items: map(_tokenize, items)
        return
    with multiprocessing.Pool(num_proc, initializer=_init_worker) as pool:
        # imap pulls items through a pipe, so reading runs only a little ahead of the workers
        # and memory stays bounded; chunksize amortizes the pickling of short documents.
        yield lambda items: pool.imap(_tokenize, items, chunksize=64)


# ---------------------------------------------------------------- the pipeline

def prepare(argv=None, *, description, out_dir, hub_id, hub_config=None, streaming=True,
            upstream_splits=None, val_fraction=None, seed=None, documents=None,
            text_rows="document"):
    """Tokenize one corpus into <out_dir>/train.bin, val.bin and meta.json; returns the meta.

    Train/val come either from `upstream_splits` ({"train": "train", "val": "validation"}) or,
    for a corpus with only a train split, from routing each document by `is_val` with
    `val_fraction` and `seed` (both overridable on the command line).
    `documents(texts)` turns a split's row texts into documents (default: one row, one document).
    """
    from tqdm import tqdm
    args = parse_args(argv, description, out_dir, hub_id, hub_config, val_fraction, seed)
    routed = upstream_splits is None
    if routed:
        upstream_splits = {"train": "train"}
    documents = documents or (lambda texts: texts)
    counts = {"train": 0, "val": 0}
    sources = []

    def items():
        index = 0
        for split, upstream in upstream_splits.items():
            rows, text_field, source = load_rows(args, upstream, list(upstream_splits.values()),
                                                 streaming, text_rows)
            sources.append(source)
            with tqdm(rows, total=num_rows(rows, upstream), unit=" rows", desc=upstream) as bar:
                for text in documents(texts(bar, text_field)):
                    if routed:
                        split = "val" if is_val(index, args.seed, args.val_fraction) else "train"
                    index += 1
                    yield split, text

    t0 = time.time()
    os.makedirs(args.out_dir, exist_ok=True)
    try:
        with tokenizer(args.num_proc) as tokenize, \
                tokendata.SplitWriter(args.out_dir, ("train", "val")) as writer:
            for split, ids in tokenize(items()):
                writer.write(split, ids)
                counts[split] += 1
            empty = [split for split, n in counts.items() if n == 0]
            if empty:  # raised inside the with block, so no .bin file is written
                raise PrepareError(f"no documents for {empty}"
                                   + (" (raise --val_fraction)" if routed else ""))
    except PrepareError as e:
        sys.exit(f"error: {e}")

    if routed:
        rule = (f"document i goes to val when blake2b(f'{{seed}}:{{i}}') / 2**64 < val_fraction "
                f"(seed={args.seed}, val_fraction={args.val_fraction})")
    else:
        rule = "upstream splits: " + ", ".join(f"{s}.bin = {u}" for s, u in upstream_splits.items())
    meta = tokendata.write_meta(
        args.out_dir, source="; ".join(sources), text_field=args.text_field, split_rule=rule,
        train_tokens=writer.n_tokens["train"], val_tokens=writer.n_tokens["val"],
        train_num_documents=counts["train"], val_num_documents=counts["val"])
    print(f"train: {meta['train_tokens']:,} tokens ({counts['train']:,} documents), "
          f"val: {meta['val_tokens']:,} tokens ({counts['val']:,} documents), "
          f"{time.time() - t0:.1f}s -> {args.out_dir}")
    return meta
