# MLA and RA+MLA against the baseline (the pruning / MLA study), three paired seeds, CPU twin: suites/mla.py with
# config/ra_shakespeare.py.
# python sweep.py suites/mla_shakespeare.py
import os

exec(open(os.path.join(os.path.dirname(__file__), "mla.py")).read())
variants = {name: {"config": [body["config"], "../config/ra_shakespeare.py"]} for name, body in variants.items()}
