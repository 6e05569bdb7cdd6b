# The RA ablation of seeds/000 as a CPU twin: baseline, RAEARLY, RALATE, RAALL, RALEARN, three
# paired seeds each, compared on validation loss at equal tokens (config/_ra_shakespeare.py says
# why the twin is sized as it is).
# python data/shakespeare/prepare.py --tokenizer=char && python sweep.py suites/ra_shakespeare.py
variants = {name: {"config": f"../config/train_ra_{name}_shakespeare.py"}
            for name in ("baseline", "early", "late", "all", "learn")}
baseline = "baseline"
seeds = [1, 2, 3]
metric = "val_loss"
allowed = ["ra_pattern", "ra_mode", "ra_alpha"]
