# train_selective_9sync.py's block pattern, small, on 2 CPU ranks:
# torchrun --standalone --nproc_per_node=2 train.py config/train_selective_9sync_shakespeare.py
import os

exec(open(os.path.join(os.path.dirname(__file__), "train_selective_9sync.py")).read())
exec(open(os.path.join(os.path.dirname(__file__), "_reduced_sync_shakespeare.py")).read())

out_dir = "out-shakespeare-selective-9sync"
