# 24 all-reduces per forward pass: 12 Megatron TP blocks x 2 (the baseline).
# torchrun --standalone --nproc_per_node=8 train.py config/train_gpt2_24comm.py
import os

exec(open(os.path.join(os.path.dirname(__file__), "_reduced_sync_common.py")).read())

block_pattern = "tp"
out_dir = "out-gpt2-124M-24comm"
wandb_run_name = "gpt2-124M-24comm"
