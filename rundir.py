"""A run directory (out_dir) that survives faults: one process at a time, checkpoints that cannot
run code, write errors said in one line, and a log.jsonl whose torn last line is cut off before
the next record is appended (readers skip it: rundir.read_events).

train.py locks out_dir and writes ckpt.pt (through parallel.ParallelLayout) and log.jsonl (RunLog)
through here; every script that loads a checkpoint reads it through here.
"""
import contextlib
import errno
import fcntl
import glob
import hashlib
import json
import math
import os
import pickle
import re
import time
import zipfile

LOCK_FILE = "lock"
HELLASWAG_ITEMS = "hellaswag_items.jsonl"  # train.py's per-example HellaSwag scores in a run directory


class RunDirError(RuntimeError):
    """A fault in the run directory the user must act on; its message is the one line to show."""


# ----------------------------------------------------------------------------- one run per out_dir

@contextlib.contextmanager
def out_dir_lock(out_dir, holder="run"):
    """Hold an exclusive lock on out_dir for the block: a second run on it is refused. The kernel
    releases a flock when its process dies, kill -9 included, so a stale lock never needs cleaning.
    Leftover temporary files of a dead writer are removed: while the lock is held, no other
    process can be writing them."""
    try:
        os.makedirs(out_dir, exist_ok=True)
        f = open(os.path.join(out_dir, LOCK_FILE), "a+")
    except OSError as e:  # read-only file system, no permission, a file in the way
        raise RunDirError(f"cannot write in {out_dir or repr(out_dir)} ({e.strerror}): choose a writable "
                          f"out_dir") from None
    try:
        fcntl.flock(f, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        f.seek(0)
        owner = f.read().strip() or "unknown"
        f.close()
        raise RunDirError(f"{out_dir} is in use by another {holder} (pid {owner}): wait for it to end, stop it, "
                          f"or choose another {'sweep_dir' if holder == 'sweep' else 'out_dir'}") from None
    f.seek(0)
    f.truncate()
    f.write(str(os.getpid()))
    f.flush()
    for stale in glob.glob(os.path.join(glob.escape(out_dir), "*.tmp")):
        os.remove(stale)
    try:
        yield
    finally:
        f.close()


# ----------------------------------------------------------------------------- directories a tool owns

TOOL_MANIFEST = ".written_by.json"  # {"tool", "files"}: what a tool wrote in its --out, the only files it may remove


def check_output_dir(path, option="--out"):
    """An output directory named on a command line: not empty, not a file; one line otherwise."""
    if not path:
        raise RunDirError(f"{option} is empty: name a directory")
    if os.path.exists(path) and not os.path.isdir(path):
        raise RunDirError(f"{option}={path} is a file: name a directory")


@contextlib.contextmanager
def tool_output_dir(path, tool):
    """A directory for `tool`'s output, listed in its manifest when the block ends (however it ends).
    An existing directory must hold the manifest this tool wrote, and only the files it lists go (then
    the directories they leave empty): a copied directory keeps the notes added to it, and any other
    existing directory (--out=. would be the checkout) is refused with nothing deleted. No tool ever
    removes a directory because a marker file says it may."""
    check_output_dir(path)
    if os.path.isdir(path):
        remove_listed_files(path, tool)
    else:
        try:
            os.makedirs(path)
        except OSError as e:
            raise RunDirError(f"cannot create {path} ({e.strerror}): choose a writable --out") from None
    kept = files_under(path)  # the user's: never listed as the tool's
    try:
        yield
    finally:
        with atomic_write(os.path.join(path, TOOL_MANIFEST), "w") as f:
            json.dump(dict(tool=tool, files=sorted(files_under(path) - kept - {TOOL_MANIFEST})), f, indent=1)


REPO_DIR = os.path.dirname(os.path.abspath(__file__))


def in_repository(path, repo=REPO_DIR, start=None):
    """An absolute path inside the repository `repo` relative to `start` (its root by default), so a committed
    record names no directory of the machine that ran it; any other path as given."""
    inside = os.path.isabs(path) and not os.path.relpath(path, repo).startswith("..")
    return os.path.relpath(path, start or repo) if inside else path


def files_under(path):
    """Every file below path, relative to it (symbolic links to directories are not followed)."""
    return {os.path.relpath(os.path.join(d, name), path) for d, _, names in os.walk(path) for name in names}


def remove_listed_files(path, tool):
    """Remove the files tool's manifest in path lists, each only inside path, then the directories
    they leave empty; refused in one line, with nothing deleted, when path holds no manifest of tool's."""
    try:
        with open(os.path.join(path, TOOL_MANIFEST), encoding="utf-8") as f:
            listed = json.load(f)
    except (OSError, ValueError):
        listed = None
    if not isinstance(listed, dict) or listed.get("tool") != tool or not isinstance(listed.get("files"), list):
        raise RunDirError(f"--out={path} exists and holds no list of files written by {tool}: nothing was deleted; "
                          f"choose a new --out (the tool removes only the files it listed as its own)")
    root = os.path.realpath(path)
    emptied = set()
    for name in listed["files"]:
        folder = os.path.realpath(os.path.join(root, os.path.dirname(str(name))))
        target = os.path.join(folder, os.path.basename(str(name)))
        if os.path.commonpath([root, folder]) == root and (os.path.isfile(target) or os.path.islink(target)):
            os.remove(target)  # a listed path that leads out of the directory is never followed
            while folder != root:
                emptied.add(folder)
                folder = os.path.dirname(folder)
    for folder in sorted(emptied, key=len, reverse=True):  # the deepest first
        if not os.listdir(folder):
            os.rmdir(folder)


# ----------------------------------------------------------------------------- checkpoints

CHECKPOINT_FILE = "ckpt.pt"


def checkpoint_root(out_dir):
    """Where sharded ranks write their checkpoints (sharding.py)."""
    return os.path.join(out_dir, "dcp")


def latest_checkpoint(out_dir):
    """The newest complete sharded checkpoint's directory, or None."""
    pointer = os.path.join(checkpoint_root(out_dir), "latest")
    if not os.path.exists(pointer):
        return None
    with open(pointer) as f:
        return os.path.join(checkpoint_root(out_dir), f.read().strip())


def checkpoint_path(out_dir, sharded=None):
    """out_dir's checkpoint, or None: ckpt.pt (sharded=False), the newest complete sharded one named
    by dcp/latest (sharded=True), or whichever exists, ckpt.pt first (None). train.py, its resume
    check, export_checkpoint.py, eval.py, sample.py, hellaswag.py, sweep.py and slurm/train_job.sh all
    ask here (it imports no torch: a Slurm job asks before train.py starts)."""
    file = os.path.join(out_dir, CHECKPOINT_FILE)
    if sharded is not True and os.path.exists(file):
        return file
    return latest_checkpoint(out_dir) if sharded is not False else None


@contextlib.contextmanager
def atomic_write(path, mode="wb"):
    """A file opened as `path.<pid>.tmp`, fsynced and renamed over `path` when the block ends
    cleanly and deleted on any error (KeyboardInterrupt included): readers never see a
    half-written file, and a crash leaves the previous one intact. Token files, checkpoints and run records use it."""
    tmp = f"{path}.{os.getpid()}.tmp"  # unique: two processes never write into each other's file
    try:
        with open(tmp, mode) as f:
            yield f
            f.flush()
            os.fsync(f.fileno())
    except BaseException:
        if os.path.exists(tmp):
            os.remove(tmp)
        raise
    os.replace(tmp, path)


def describe_write_error(error, path, consequence):
    """One line from an OSError: 'no space left on device while writing ckpt.pt; <consequence>'."""
    cause = (error.strerror or errno.errorcode.get(error.errno, "write error")).lower()
    return f"{cause} while writing {path}; {consequence}"


@contextlib.contextmanager
def write_errors_named(path, consequence):
    """An OSError inside the block (a full disk, a quota, a file-size limit) becomes a RunDirError
    whose one line names the cause, the file and what it means for the run."""
    try:
        yield
    except OSError as e:
        raise RunDirError(describe_write_error(e, path, consequence)) from None


def save_checkpoint(path, state):
    """torch.save through a uniquely named temporary file and a rename, so a crash, a signal or a
    full disk mid-save keeps the previous checkpoint. torch's zip writer reports a failed write of
    the file as `RuntimeError: [enforce fail at inline_container.cc] ...`; the real cause (an
    OSError, or the exception a signal handler raised) is its __context__, and that is what we raise."""
    import torch  # here, not above: the comparison engine reads run directories without torch
    had_one = os.path.exists(path)
    state = dict(state, **{DIGEST_KEY: state_digest(state)})  # checked by every load: a flipped byte is named
    try:
        with atomic_write(path) as f:
            torch.save(state, f)
    except (RuntimeError, OSError) as e:
        cause = e.__context__ if isinstance(e, RuntimeError) and e.__context__ is not None else e
        if isinstance(cause, OSError):
            kept = "the previous checkpoint is intact" if had_one else "no checkpoint was written yet"
            raise RunDirError(describe_write_error(cause, path, kept)) from None
        if cause is not e:
            raise cause from None
        raise


def load_checkpoint_file(path):
    """A checkpoint's contents, loaded with weights_only=True: tensors and plain containers only,
    so a crafted file cannot execute code when unpickled. Anything else is refused in one line."""
    import torch
    try:
        state = torch.load(path, map_location="cpu", weights_only=True)
    except pickle.UnpicklingError as e:
        # torch names the offending global ("Trying to load unsupported GLOBAL posix.system ..."): quote it
        found = re.search(r"GLOBAL (\S+)", str(e))
        detail = f" ({found.group(1)})" if found else ""
        raise RunDirError(f"{path} holds objects other than tensors and plain values{detail}: refused, because "
                          f"loading them could run arbitrary code; only load checkpoints written by train.py") from None
    except (RuntimeError, zipfile.BadZipFile, EOFError) as e:
        raise RunDirError(f"{path} is not a readable checkpoint ({str(e).splitlines()[0][:120]}): "
                          f"restore it from a copy or start a new run") from None
    recorded = state.pop(DIGEST_KEY, None) if isinstance(state, dict) else None  # None: written before digests
    if recorded is not None and recorded != state_digest(state):
        raise RunDirError(f"{path} is damaged: its contents do not match the sha256 recorded when it was written "
                          f"(a flipped byte, a bad disk or copy): restore it from a copy, or delete it and train again")
    return state


DIGEST_KEY = "sha256"  # inside every checkpoint: written with it, in one atomic file, so the two never disagree


def state_digest(state):
    """sha256 over a checkpoint's contents in order: every tensor's dtype, shape and bytes, every other
    value's repr (a digest of the file itself could not live inside it). torch.load checks no checksum:
    without this, bytes flipped inside a tensor load silently as other weights."""
    import torch
    h = hashlib.sha256()

    def walk(x):
        if torch.is_tensor(x):
            flat = x.detach().to("cpu").contiguous().reshape(-1)
            h.update(f"tensor {flat.dtype} {tuple(x.shape)}".encode())
            h.update(flat.view(torch.uint8).numpy())
        elif isinstance(x, dict):
            h.update(b"{")
            for k, v in x.items():
                h.update(repr(k).encode() + b":")
                walk(v)
            h.update(b"}")
        elif isinstance(x, (list, tuple)):
            h.update(b"[")
            for v in x:
                walk(v)
            h.update(b"]")
        else:
            h.update(repr(x).encode() + b",")
    walk({k: v for k, v in state.items() if k != DIGEST_KEY})
    return h.hexdigest()


# ----------------------------------------------------------------------------- log.jsonl

class RunLog:
    """log.jsonl for scripts, log.txt and the console for people, W&B when asked (master only).

    Records are strict JSON (a NaN is written as null). A torn last line left by a kill or a full
    disk is cut off before appending, so no record is ever glued to a fragment. Files are written
    unbuffered: a failed write raises at once, with its cause, and leaves nothing to flush later."""

    def __init__(self, cfg, master):
        self.master = master
        self.wandb = None
        if not master:
            return
        os.makedirs(cfg["out_dir"], exist_ok=True)
        torn = {name: repair_torn_line(os.path.join(cfg["out_dir"], name)) for name in ("log.jsonl", "log.txt")}
        self.jsonl = open(os.path.join(cfg["out_dir"], "log.jsonl"), "ab", buffering=0)
        self.text = open(os.path.join(cfg["out_dir"], "log.txt"), "ab", buffering=0)
        if torn["log.jsonl"]:
            self.event("log_repaired", f"cut a torn last line off log.jsonl ({len(torn['log.jsonl'])} characters "
                       f"of an unfinished record)", torn=torn["log.jsonl"][:200])
        if cfg["wandb_log"]:
            import wandb
            mode = cfg["wandb_mode"] or ("online" if os.environ.get("WANDB_API_KEY") else "offline")
            self.wandb = wandb.init(project=cfg["wandb_project"], config=cfg, mode=mode, dir=cfg["out_dir"],
                                    name=cfg["wandb_run_name"] or os.path.basename(os.path.abspath(cfg["out_dir"])),
                                    group=cfg["wandb_group"] or None)

    def event(self, kind, line, **fields):
        if not self.master:
            return
        record = {"event": kind, "time": time.time(), **fields}
        self.write(self.jsonl, strict_json(record) + "\n")
        self.say(line)
        if self.wandb is not None and "iter" in fields:
            numbers = {f"{kind}/{k}": v for k, v in fields.items()
                       if isinstance(v, (int, float)) and not isinstance(v, bool) and k != "iter"}
            self.wandb.log(numbers, step=fields["iter"])

    def say(self, line):
        if not self.master:
            return
        print(line, flush=True)
        self.write(self.text, line + "\n")

    @staticmethod
    def write(f, text):
        data = text.encode()
        try:
            while data:  # an unbuffered write may be partial (a disk filling up): write the rest or fail
                data = data[f.write(data):]
        except OSError as e:
            raise RunDirError(describe_write_error(
                e, f.name, "the run stopped there; ckpt.pt holds the last checkpoint (resume with "
                "--init_from=resume once there is room)")) from None

    def close(self):
        if self.master:
            self.jsonl.close()
            self.text.close()
            if self.wandb is not None:
                self.wandb.finish()



def strict_json(record):
    """record as one line of strict JSON: NaN and infinities (which json.dumps writes as the
    non-JSON words NaN and Infinity) become null."""
    def finite(value):
        if isinstance(value, float) and not math.isfinite(value):
            return None
        if isinstance(value, dict):
            return {k: finite(v) for k, v in value.items()}
        if isinstance(value, (list, tuple)):
            return [finite(v) for v in value]
        return value
    return json.dumps(finite(record), allow_nan=False)


def repair_torn_line(path):
    """Cut a partial last line (a kill or a full disk mid-write) off a JSON-lines file, so the next
    record starts on a line of its own. Returns the text removed ('' when the file was whole)."""
    if not os.path.exists(path):
        return ""
    with open(path, "rb+") as f:
        data = f.read()
        if not data or data.endswith(b"\n"):
            return ""
        keep = data.rfind(b"\n") + 1
        f.truncate(keep)
    return data[keep:].decode("utf-8", errors="replace")


def finished(events):
    """The end events of a run that reached its budget; one stopped by a signal is only paused."""
    return [e for e in events if e["event"] == "end" and e.get("stop_reason") != "signal"]


def run_status(events):
    """'finished', 'diverged' (it would only diverge again), 'preempted' (its latest attempt stopped
    for a signal after a checkpoint: a sweep resumes it), 'failed' (its latest attempt died without an
    `end`, even after earlier preemptions) or 'not run', from a run's log.jsonl events."""
    if finished(events):
        return "finished"
    kinds = [e["event"] for e in events]
    if "diverged" in kinds:
        return "diverged"
    if "end" in kinds and "checklist" not in kinds[len(kinds) - kinds[::-1].index("end"):]:
        return "preempted"
    return "failed" if events else "not run"


# ----------------------------------------------------------------------------- reading a finished run

def read_events(out_dir, damage=None):
    """The records of log.jsonl. A line that is not a JSON record (torn by a kill or a full disk,
    bytes that are not UTF-8) or that holds a non-finite token or iteration count is skipped, so a
    reader never fails on, or glues together, a partial record; pass a list as `damage` to have
    each skipped line named there."""
    path = os.path.join(out_dir, "log.jsonl")
    if not os.path.exists(path):
        return []
    events = []
    with open(path, "rb") as f:
        for number, raw in enumerate(f, 1):
            try:
                record = json.loads(raw.decode("utf-8"))
                if not isinstance(record, dict):
                    raise ValueError("not a record")
                if any(not math.isfinite(record[k]) for k in ("tokens", "iter") if isinstance(record.get(k), float)):
                    raise ValueError("a non-finite token or iteration count")
            except (UnicodeDecodeError, ValueError) as e:
                if damage is not None:
                    reason = "not UTF-8" if isinstance(e, UnicodeDecodeError) else str(e) if "non-finite" in str(e) \
                        else "not a whole JSON record"
                    damage.append(f"{path}:{number}: {reason}: line skipped")
                continue
            events.append(record)
    return events


def read_run_info(out_dir):
    """out_dir's run_info.json, or {} when it has none; a damaged one is an error that names it."""
    path = os.path.join(out_dir, "run_info.json")
    if not os.path.exists(path):
        return {}
    try:
        with open(path, encoding="utf-8") as f:
            return json.load(f)
    except (UnicodeDecodeError, ValueError) as e:
        raise RunDirError(f"{path} is damaged ({type(e).__name__}): restore it, or move it away to go on "
                                 f"without the run's recorded facts") from None


def read_run(out_dir):
    """Everything a report needs from one run directory: its resolved config, run_info and events,
    and `damage`: each damaged file or line and what was done about it (a damaged JSON file is read
    as missing, so no fact is taken from it)."""
    damage = []

    def load(name):
        path = os.path.join(out_dir, name)
        if not os.path.exists(path):
            return None
        try:
            with open(path, encoding="utf-8") as f:
                return json.load(f)
        except (UnicodeDecodeError, ValueError) as e:
            damage.append(f"{path} is damaged ({type(e).__name__}): read as missing")
            return None
    config, info = load("config.json"), load("run_info.json")
    return dict(out_dir=out_dir, config=config, info=info, events=read_events(out_dir, damage), damage=damage)
