"""The official OREAL-7B run (reference 2.1): OREAL-7B-SFT with tensor parallel 4, on 32 GPUs.

Everything not set here comes from a100_40g.py, whose values are the official ones (the verifier
hosts too: set judgers_config here to list the run's own servers); this file adds
the 7B models and the official multi-GPU layout. The chat template and stop word are the OREAL
SFT ones that a100_40g.py already holds. With tp 4 on 32 GPUs, dp = 8 replicas each generate
1024 / 8 = 128 samples per step.

Run:  torchrun --nproc-per-node 8 --nnodes 4 ... -m oreal_fast.train configs/oreal_7b.py
"""

from configs.a100_40g import *  # noqa: F403 (the official values)

actor = "internlm/OREAL-7B-SFT"
reference = actor
token_level_rm = actor
tp_size = 4  # ref 2.1 (the 32B run uses 8)

