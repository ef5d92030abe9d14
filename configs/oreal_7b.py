"""The official OREAL-7B run (reference 2.1): OREAL-7B-SFT with tensor parallel 4, on 32 GPUs.

Everything not set here comes from a100_40g.py, whose values are the official ones (the verifier
hosts too: set judgers_config here to list the run's own servers); this file adds
the 7B models and the official multi-GPU layout. The chat template and stop word are the OREAL
SFT ones that a100_40g.py already holds. The official run uses tp 4 on 32 GPUs: dp = 8 replicas,
each generating 1024 / 8 = 128 samples per step.

In one process this run does not fit a GPU (fp32 masters + AdamW moments of the 7.6B actor and the
7.1B RM backbone are 12 bytes per parameter, about 176 GB, before the bf16 reference and
activations). Under torchrun every process is a data-parallel rank and FSDP2 shards all three
models over them (about 5.5 GB of masters and moments per GPU on 32 GPUs), e.g. on 4 hosts of 8:
  torchrun --nnodes 4 --nproc_per_node 8 --rdzv_backend c10d --rdzv_endpoint HOST0:29500 \
      -m oreal_fast.train configs/oreal_7b.py --keep_resume_states 0
Each rank's rollout engine holds a whole bf16 copy of the actor (about 15 GB). Not run at this size
yet. tp_size is accepted for compatibility and has no effect (the start-up log says so): dp = 32
here, 2 prompts x 16 samples per rank and step, where the official run has 8 replicas of tp 4.
"""

from configs.a100_40g import *  # noqa: F403 (the official values)

actor = "internlm/OREAL-7B-SFT"
reference = actor
token_level_rm = actor
tp_size = 4  # ref 2.1 (the 32B run uses 8)

