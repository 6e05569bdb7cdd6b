# Shared by every config of the RA ablation (train_ra_*.py, train_mla.py, train_ra_mla.py): the
# GPT-2 124M FineWeb-Edu recipe of train_gpt2.py, unchanged, so every run of the set has the same
# optimizer, effective batch (16 x 8 sequences = 131,072 tokens per step), schedule and token
# budget, and the same model class (model_type='ra'; ra_pattern='none' is exactly the baseline GPT).
# The runs differ only in the ra_* / mla* keys their own file sets.
# The RA study's 2-hour protocol (docs/experiments.md): add --max_time=7200 (training seconds; the
# log records the tokens each run reached, which then differ across runs and GPUs).
import os

exec(open(os.path.join(os.path.dirname(__file__), "train_gpt2.py")).read())
model_type = "ra"
wandb_project = "gpt2-ra-ablation"
