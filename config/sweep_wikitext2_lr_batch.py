# The Wikitext-2 template's learning rate x batch size sweep with AdamW. The batch is the tokens per step here,
# so it is what varies; the token budget (max_tokens, 16,384 x 3000 steps) is what is held equal,
# and smaller batches take more steps. (Holding tokens per step fixed while changing batch_size
# would only change the micro-batch split: the same optimization.)
# python sweep.py config/sweep_wikitext2_lr_batch.py
import os

base = [os.path.join(os.path.dirname(__file__), "train_wikitext2.py")]
grid = {"learning_rate": [3e-4, 6e-4, 1e-3, 2e-3], "batch_size": [8, 16, 32, 64]}
overrides = {"tokens_per_iter": 0, "gradient_accumulation_steps": 1, "max_tokens": 16384 * 3000,
             "max_iters": 10**9}
sweep_dir = "out-sweep-wikitext2-lr-batch"
