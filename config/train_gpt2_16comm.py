# 16 all-reduces per forward pass: [TP, SPD, SPD] x 4 = 4 x 2 + 8 x 1.
# torchrun --standalone --nproc_per_node=8 train.py config/train_gpt2_16comm.py
import os

exec(open(os.path.join(os.path.dirname(__file__), "_reduced_sync_common.py")).read())

block_pattern = "tp,spd,spd"
out_dir = "out-gpt2-124M-16comm"
wandb_run_name = "gpt2-124M-16comm"
