# The flagship's question (suites/ra_shakespeare.py: the same recipe, tuning and declared blocked analysis)
# asked until every RA variant is decided at +-0.01: better or worse, or equivalent within the margin.
# Up to 24 seeds, looks at 6, 12 and 24; an arm decided at a look runs no more seeds. At the flagship's
# measured sds the simultaneous half-widths are ~0.045 at 6 seeds, ~0.015 at 12 and ~0.007 at 24.
# At most 120 runs of ~3-3.5 min, two at a time: about 3.5 hours on 2 cores, resumable: the same command
# again (in another sitting) reuses every finished run and retakes the looks from them.
# python data/shakespeare/prepare.py --tokenizer=char && python sweep.py suites/ra_shakespeare_long.py
import os

exec(open(os.path.join(os.path.dirname(__file__), "ra_shakespeare.py")).read())
# Seeds 41-64: no tuning run, no earlier report and not the flagship's own seeds (31-36).
seeds = list(range(41, 65))
looks = [6, 12, 24]
earlier = earlier + ["reports/ra_shakespeare: this recipe, seeds 31-36, looks at 3 and 6 (the README's hour)"]
