"""The demo, run long enough to measure held-out accuracy: configs/demo.py with the changes below.

Same model (SmolLM2-135M-Instruct), prompts, chat template, judger and algorithm (RLOO, one-pair
filter, token-level RM with threshold weights, k3 KL) as configs/demo.py; only the run length,
the validation and the outputs differ. 24 steps of 4 prompts x 4 samples, greedy validation on all
64 held-out problems before step 1 and after steps 8, 16 and 24: 11-13 minutes on 2 idle CPU cores.
Results of three seeds: docs/evidence.md.

Run:  python -m oreal_fast.train configs/demo_long.py --seed 0
"""

from demo import *  # noqa: F401,F403  (the loader puts this file's folder on sys.path while it runs)

# 24 steps (the demo has 4): enough actor updates (23, after the one RM-only step) for greedy
# accuracy to move, while one run stays within about 13 minutes on 2 CPU cores (a step takes 10-30 s
# there, a validation of the 64 problems 25-60 s). The cosine LR schedule of demo.py
# is stretched over these steps (warmup 1, floors 2e-6 / 1e-5, as in demo.py).
total_steps = 24

# Validate on all 64 held-out problems (the demo uses 16: +-1 problem would be 6 points of
# accuracy), greedy only (sampled pass@k would cost n x 64 generations per validation), before
# step 1, after steps 8 and 16, and after the last step.
val_max_problems = None
val_interval = 8

# Outputs: no resume states (3.2 GB each, and these runs are not resumed); one hf-24 folder at the end.
work_dir = "work_dirs/demo_long"
keep_resume_states = 0
checkpoint_interval = -1
