# Logit soft-capping against the baseline, CPU twin of suites/softcap.py with config/ra_shakespeare.py: three
# paired seeds from scratch (docs/new-idea.md).
# python sweep.py suites/softcap_shakespeare.py --plan
# python sweep.py suites/softcap_shakespeare.py
import os

exec(open(os.path.join(os.path.dirname(__file__), "softcap.py")).read())
variants = {name: dict(body, config=[body["config"], "../config/ra_shakespeare.py"]) for name, body in variants.items()}
