# Gated attention (arXiv 2505.06708: a per-head sigmoid gate on the attention output, computed from
# the block's input) against the RA baseline recipe, CPU twin: suites/gated_attn.py
# with config/ra_shakespeare.py; three paired seeds.
# docs/experiments.md: when the RA question was asked again, with paired seeds, it improved quality reproducibly.
# python sweep.py suites/gated_attn_shakespeare.py
import os

exec(open(os.path.join(os.path.dirname(__file__), "gated_attn.py")).read())
variants = {name: {"config": [body["config"], "../config/ra_shakespeare.py"]} for name, body in variants.items()}
