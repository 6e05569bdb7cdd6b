# The pruning matrix's dense baseline: the GPT-2 124M FineWeb-Edu recipe of config/train_gpt2.py
# (the pruning / MLA study's: 16 x 8 x 1024 tokens, lr 6e-4, wd 0.1, warmup 2000, cosine to 6e-5, bf16, compiled),
# cut to the 10k iterations every pruning run of the matrix gets.
# python train.py config/train_gpt2_adamw.py
import os

exec(open(os.path.join(os.path.dirname(__file__), "train_gpt2.py")).read())

out_dir = "out-gpt2-adamw"
wandb_run_name = "gpt2-adamw"
optimizer = "adamw"
max_iters = 10000
