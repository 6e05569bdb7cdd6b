# The RA study's ablation (docs/experiments.md) as a CPU twin, every run from scratch: baseline, RAEARLY, RALATE,
# RAALL, RALEARN, three paired seeds each, compared on validation loss at equal tokens (the overlay
# config/ra_shakespeare.py says why the twin is sized as it is). It answers "does the variant,
# trained the whole budget, beat the baseline?", but on 2 cores it resolves only ~0.08 nats
# (reports/ra_shakespeare_scratch); suites/ra_shakespeare.py is the design that resolves 0.01.
# python data/shakespeare/prepare.py --tokenizer=char && python sweep.py suites/ra_shakespeare_scratch.py
import os

exec(open(os.path.join(os.path.dirname(__file__), "ra.py")).read())
variants = {name: {"config": [body["config"], "../config/ra_shakespeare.py"]} for name, body in variants.items()}
