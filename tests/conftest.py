import os

os.environ.setdefault("OMP_NUM_THREADS", "1")  # must precede torch's import to take effect

import getpass
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

VOCAB = 64  # the toy corpus's ids; tests/test_train.py's tiny_args sets vocab_size to it


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
