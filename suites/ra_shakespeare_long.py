# The flagship's question (suites/ra_shakespeare.py: the same recipe, tuning and declared blocked analysis)
# asked until every RA variant is decided at +-0.01: better or worse, or equivalent within the margin, on a
# simultaneous interval at most +-0.01 wide.
# Up to 32 seeds, looks at 8, 16 and 32; an arm decided at a look runs no more seeds. At the flagship's
# measured sds (reports/ra_shakespeare) 0.01 is detectable at 25 seeds, and at 32 the simultaneous
# half-widths are about 0.007. At most 160 runs of ~3 min, two at a time: about 4.5 hours on 2 cores (runs of
# 4-6 min and about 7 hours on an AVX2-only EPYC, the slowest of our CPUs), resumable: the same command again (in another sitting) reuses every finished run and retakes the looks.
# Its finished runs' records (no checkpoints) are committed in runs/ra_shakespeare_long, so it resumes on any
# machine and commit between seeds (a report refuses a pair whose runs ran different code, and names each code
# version's seeds); a run paused elsewhere starts again. Seeds 41-49 ran at ad893fb, seeds 50 on at f9b27af (which
# trains bit for bit the same: baseline-seed41 rerun there); later commits fingerprint the data differently, so
# the suite ends at f9b27af.
# python data/shakespeare/prepare.py --tokenizer=char && python sweep.py suites/ra_shakespeare_long.py
import os

exec(open(os.path.join(os.path.dirname(__file__), "ra_shakespeare.py")).read())
# Seeds 41-72: no tuning run, no earlier report and not the flagship's own seeds (31-36).
seeds = list(range(41, 73))
suite_dir = "runs/ra_shakespeare_long"
looks = [8, 16, 32]
# Decided at a resolution too: an arm stops only when its interval also lies within ±0.01 of its estimate. Set
# after look 1 (8 seeds, no arm stopped), before look 2: arms stop later, never sooner, so the repeated intervals
# keep their coverage (docs/ablation.md, Sequential seeds); the sweep records when it was set.
stop_half_width = 0.01
earlier = earlier + ["reports/ra_shakespeare: this recipe, seeds 31-36, looks at 3 and 6 (the README's hour)"]
