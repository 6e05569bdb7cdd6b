# The RA ablation of seeds/000 as a CPU twin: baseline, RAEARLY, RALATE, RAALL, RALEARN, three
# paired seeds each, compared on validation loss at equal tokens (config/_ra_shakespeare.py says
# why the twin is sized as it is).
# python data/shakespeare/prepare.py --tokenizer=char && python sweep.py suites/ra_shakespeare.py
import os

_config = lambda name: os.path.join(os.path.dirname(__file__), "..", "config", name)
variants = {name: {"config": _config(f"train_ra_{name}_shakespeare.py")}
            for name in ("baseline", "early", "late", "all", "learn")}
baseline = "baseline"
seeds = [1, 2, 3]
metric = "val_loss"
allowed = ["ra_pattern", "ra_mode", "ra_alpha"]
