# QK-norm against the baseline, CPU twin of suites/qk_norm.py with config/ra_shakespeare.py: three
# paired seeds from scratch (docs/new-idea.md).
# python sweep.py suites/qk_norm_shakespeare.py --plan
# python sweep.py suites/qk_norm_shakespeare.py
import os

exec(open(os.path.join(os.path.dirname(__file__), "qk_norm.py")).read())
variants = {name: {"config": [body["config"], "../config/ra_shakespeare.py"]} for name, body in variants.items()}
