# Value residual against the baseline, CPU twin of suites/value_residual.py with config/ra_shakespeare.py:
# three paired seeds from scratch (docs/new-idea.md).
# python sweep.py suites/value_residual_shakespeare.py --plan
# python sweep.py suites/value_residual_shakespeare.py
import os

exec(open(os.path.join(os.path.dirname(__file__), "value_residual.py")).read())
variants = {name: {"config": [body["config"], "../config/ra_shakespeare.py"]} for name, body in variants.items()}
