# 12 all-reduces per forward pass: 12 SPD blocks, one sync each.
# torchrun --standalone --nproc_per_node=8 train.py config/train_gpt2_12comm.py
import os

exec(open(os.path.join(os.path.dirname(__file__), "_reduced_sync_common.py")).read())

block_pattern = "spd"
out_dir = "out-gpt2-124M-12comm"
wandb_run_name = "gpt2-124M-12comm"
