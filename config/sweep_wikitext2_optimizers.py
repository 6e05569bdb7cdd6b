# The Wikitext-2 template's optimizer sweep: SGD + momentum vs Adam vs AdamW, each over learning rates of its
# own regime, all at 16,384 tokens per step (config/train_wikitext2.py) and the same iterations.
# python sweep.py config/sweep_wikitext2_optimizers.py
# python sweep.py config/sweep_wikitext2_optimizers.py config/small_shakespeare.py   (CPU version)
import os

base = [os.path.join(os.path.dirname(__file__), "train_wikitext2.py")]
grid = [
    {"optimizer": ["sgd"], "learning_rate": [0.03, 0.1, 0.3]},
    {"optimizer": ["adam", "adamw"], "learning_rate": [3e-4, 6e-4, 1e-3]},
]
# min_lr is a fraction of each run's peak: the schedule ends at 0 rather than at a fixed value
# that SGD's large rates would make meaningless.
overrides = {"min_lr": 0.0}
sweep_dir = "out-sweep-wikitext2-optimizers"
