# 9 all-reduces per forward pass: parallel blocks merged after layers 0-2, 4, 6,
# 8 and 9-11. The first and last layers, where dropping syncs hurts most in the SPD paper's
# sensitivity study, keep one each; the middle shares one per pair.
# torchrun --standalone --nproc_per_node=8 train.py config/train_selective_9sync.py
import os

exec(open(os.path.join(os.path.dirname(__file__), "_reduced_sync_common.py")).read())

block_pattern = "parallel"
sync_layers = [0, 1, 2, 4, 6, 8, 9, 10, 11]
out_dir = "out-gpt2-124M-selective-9sync"
wandb_run_name = "gpt2-124M-selective-9sync"
