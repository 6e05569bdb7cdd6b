import os

os.environ.setdefault("OMP_NUM_THREADS", "1")  # must precede torch's import to take effect

import sys

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))  # repo root

try:
    import torch
except ImportError:
    pass
else:
    torch.set_num_threads(1)  # the suite should stay fast on 2 CPU cores
