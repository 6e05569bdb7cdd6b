# Overlay: shrinks any recipe given before it to the CPU-sized Shakespeare run of
# config/train_shakespeare.py (4 x 128 model, 300 iterations, ~2 minutes on 2 cores), keeping the
# optimizer and pruning keys of that recipe and scaling their schedules to 300 iterations.
# python train.py config/train_gpt2_adamwprune_bitter7_50.py config/small_shakespeare.py --out_dir=out-small-bitter7
# python sweep.py config/sweep_pruning_matrix.py config/small_shakespeare.py
# (bitter2's longer budget is overridden too: here it is bitter1.)
import os

exec(open(os.path.join(os.path.dirname(__file__), "train_shakespeare.py")).read())

out_dir = "out-small-shakespeare"
wandb_log = False
wandb_run_name = ""
compile = False
dtype = ""
eval_iters = 10
sample_tokens = 0
tokens_per_iter = 0
max_tokens = 0
lr_decay_iters = 0
prune_start = 30  # the pruning / MLA study's 100 of 10k, scaled up so the ramp has room
prune_interval = 10
prune_ramp_end = 0
spam_interval = 100
spam_warmup = 30
