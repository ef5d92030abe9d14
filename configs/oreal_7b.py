"""The official OREAL-7B run (reference 2.1): OREAL-7B-SFT with tensor parallel 4, on 32 GPUs.

Everything not set here comes from a100_40g.py, whose values are the official ones (the verifier
hosts too: set judgers_config here to list the run's own servers); this file adds
the 7B models and the official multi-GPU layout. The chat template and stop word are the OREAL
SFT ones that a100_40g.py already holds. The official run uses tp 4 on 32 GPUs: dp = 8 replicas,
each generating 1024 / 8 = 128 samples per step.

Not runnable yet: oreal-fast trains in one process until its FSDP2 path lands and refuses
WORLD_SIZE > 1 (torchrun) with a config error, and in one process this run does not fit a GPU
(fp32 masters + AdamW moments of the 7.6B actor and the 7.1B RM backbone are 12 bytes per parameter,
about 176 GB, before the bf16 reference and activations). tp_size is accepted for compatibility and
has no effect (the start-up log says so). The file keeps the official values for when it can run.
"""

from configs.a100_40g import *  # noqa: F403 (the official values)

actor = "internlm/OREAL-7B-SFT"
reference = actor
token_level_rm = actor
tp_size = 4  # ref 2.1 (the 32B run uses 8)

