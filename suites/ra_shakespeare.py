# The RA ablation of seeds/000 as a CPU twin: baseline, RAEARLY, RALATE, RAALL, RALEARN, three
# paired seeds each, compared on validation loss at equal tokens (the overlay config/ra_shakespeare.py
# says why the twin is sized as it is).
# python data/shakespeare/prepare.py --tokenizer=char && python sweep.py suites/ra_shakespeare.py
import os

exec(open(os.path.join(os.path.dirname(__file__), "ra.py")).read())
variants = {name: {"config": [body["config"], "../config/ra_shakespeare.py"]} for name, body in variants.items()}
