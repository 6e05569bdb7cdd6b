import os

os.environ.setdefault("OMP_NUM_THREADS", "1")  # must precede torch's import to take effect

import getpass
import subprocess
import sys
import tempfile

# Inductor's kernel cache does not tell a native run from one under ATEN_CPU_CAPABILITY: kernels that
# an AVX512 run cached crashed the same compiled test under ATEN_CPU_CAPABILITY=avx2. One cache each.
if os.environ.get("ATEN_CPU_CAPABILITY"):
    os.environ.setdefault("TORCHINDUCTOR_CACHE_DIR", os.path.join(
        tempfile.gettempdir(), f"torchinductor_{getpass.getuser()}_{os.environ['ATEN_CPU_CAPABILITY']}"))

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))  # repo root

try:
    import torch
except ImportError:
    pass
else:
    torch.set_num_threads(1)  # the suite should stay fast on 2 CPU cores


import numpy as np  # noqa: E402
import pytest  # noqa: E402

import tokendata  # noqa: E402
from helpers import SET_UP, VOCAB, nodes_up  # noqa: E402


def pytest_configure(config):
    # The README's command runs the suite in a worker per core (pytest-xdist, --dist loadgroup), then
    # the tests marked `alone`: a test that times itself must not share the cores with other workers.
    config.addinivalue_line("markers", "alone: times real processes; runs after the parallel part, by itself")


@pytest.fixture(scope="session")
def data_dir(tmp_path_factory):
    """A learnable toy corpus for train.py runs: noisy counting sequences over 64 ids."""
    d = tmp_path_factory.mktemp("toy")
    rng = np.random.default_rng(0)
    for split, n in (("train", 20000), ("val", 4000)):
        tokens = (np.arange(n) + (rng.random(n) < 0.1) * rng.integers(0, VOCAB, n)) % VOCAB
        tokendata.write_split(str(d / f"{split}.bin"), [tokens])
    return str(d)


@pytest.fixture(scope="session")
def gpt2_data_dir(tmp_path_factory):
    """GPT-2 token ids (every id of the vocabulary can occur) for runs with GPT-2's vocabulary."""
    d = tmp_path_factory.mktemp("gpt2_tokens")
    rng = np.random.default_rng(0)
    for split, n in (("train", 6000), ("val", 2000)):
        tokendata.write_split(str(d / f"{split}.bin"), [rng.integers(0, tokendata.GPT2_VOCAB_SIZE, n)])
    return str(d)


@pytest.fixture(scope="module")
def cluster():
    """A Slurm cluster that answers: started (and installed) by slurm/start_test_cluster.sh when none
    does; a failure says why, never a skip."""
    if not nodes_up():
        done = subprocess.run(SET_UP, capture_output=True, text=True, stdin=subprocess.DEVNULL)
        if done.returncode or not nodes_up():
            pytest.fail(f"no Slurm cluster answers and slurm/start_test_cluster.sh could not start one: "
                        f"{(done.stderr or done.stdout).strip()[-500:]}")


@pytest.fixture
def jobs():
    """Job ids a test submitted: cancelled afterwards, whatever happened."""
    ids = []
    yield ids
    if ids:
        subprocess.run(["scancel", *ids], capture_output=True)
