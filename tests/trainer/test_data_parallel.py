"""Data parallel on CPU: 2 gloo processes with FSDP2 give the 1-process RL phase (global sums,
gradients, updated weights after clip + AdamW) on the same kept list, including kept counts that
do not divide by 2 (quirk Q3: no trajectory trained twice) and a rank with nothing to train; and
two whole trainer steps on 2 ranks log the metrics and write the checkpoint of 1 process."""

from __future__ import annotations

import json
import os
import socket

import pytest
import torch
import torch.multiprocessing as mp

from oreal_fast.checkpoint_manager import check_data_parallel
from oreal_fast.config import ConfigError, load_config
from oreal_fast.model.hf_io import load_decoder, load_token_rm
from oreal_fast.model.decoder import Decoder
from oreal_fast.metrics import reproducible_metrics
from oreal_fast.parallel import (
    DataParallel,
    close_data_parallel,
    full_tensor,
    full_weights,
    init_data_parallel,
    load_weights,
    parallelize,
)
from oreal_fast.optimizers import clip_gradients
from oreal_fast.rl_step import RLSettings, rl_phase
from oreal_fast.runtime import Precision, RLModels
from oreal_fast.trainer import Trainer
from oreal_fast.trajectories import Trajectory, plan_micro_batches

from trainer_helpers import K, TEXTS, KeywordRouter, TextRollout, make_tokenizer, write_config

# fp32 on both sides; only the order of the sums differs (ranks' partial sums, shard-wise norms)
RTOL = 2e-5
LR = 1e-2
# AdamW's first step moves a weight by lr * g / (|g| + eps), whose slope in g reaches lr / eps where
# g ~ 0 (the key biases' true gradient is 0, so theirs is rounding noise): an eps of 1e-4 bounds
# that amplification to 100, and the updated weights then agree to 1e-3 lr
ADAM_EPS = 1e-4
WEIGHT_ATOL = 1e-3 * LR
# 5 kept: shares of 3 and 2 (2 and 1 micro-batches: rank 1 pads one); 1 kept: rank 1 only pads;
# 6 kept with a token budget: rank 1 packs 3 micro-batches, rank 0 two (rank 0 pads)
CASES = [(5, 0), (1, 0), (6, 50)]


def _kept(num: int) -> list[Trajectory]:
    gen = torch.Generator().manual_seed(11 + num)
    out = []
    for i in range(num):
        n_prompt, n_resp = (int(x) for x in torch.randint(3, 30, (2,), generator=gen))
        out.append(Trajectory(torch.randint(0, 259, (n_prompt,), generator=gen).tolist(),
                              torch.randint(0, 259, (n_resp,), generator=gen).tolist(),
                              reward=1.0 if i % 2 == 0 else -1.0, advantage=0.6 if i % 2 == 0 else -0.6))
    return out


def _one_step(cfg_path: str, actor_dir: str, ref_dir: str, num_kept: int, budget: int, dp: DataParallel) -> dict:
    """Sums, pre-clip grads, grad norms and updated weights of one RL phase + optimiser step."""
    cfg = load_config(cfg_path)
    dev = torch.device("cpu")
    models = RLModels(load_decoder(actor_dir, dtype=torch.float32, device=dev),
                      load_decoder(ref_dir, dtype=torch.float32, device=dev),
                      load_token_rm(ref_dir, dtype=torch.float32, device=dev))
    with torch.no_grad():  # a non-zero RM head, so the token weights are not all equal
        models.token_rm.score_head.weight.copy_(torch.randn(1, 32, generator=torch.Generator().manual_seed(0)))
    precision = Precision(dev, torch.float32)
    if dp.enabled:
        parallelize(models.actor, models.actor.blocks, precision.fsdp_policy())
        parallelize(models.reference, models.reference.blocks, precision.fsdp_policy())
        parallelize(models.token_rm, models.token_rm.backbone.blocks, precision.fsdp_policy())
    sums = rl_phase(models, _kept(num_kept), RLSettings.from_config(cfg, precision),
                    micro_batch_size=2, token_budget=budget, update_actor=True, dp=dp)
    trained = {"actor": models.actor, "rm": models.token_rm}
    out = {"sums": {k: float(v) for k, v in sums._asdict().items()}}
    out["grads"] = {f"{m}.{n}": full_tensor(p.grad).clone() for m, model in trained.items()
                    for n, p in model.named_parameters()}
    for m, model in trained.items():
        opt = torch.optim.AdamW(model.parameters(), lr=LR, eps=ADAM_EPS, weight_decay=0.1)
        out[f"{m}_norm"] = float(clip_gradients(model, 0.05))  # small enough that it clips
        opt.step()
    out["weights"] = {f"{m}.{n}": full_tensor(p.detach()).clone() for m, model in trained.items()
                      for n, p in model.named_parameters()}
    # the rollout's whole copy of the actor (plain sampler, paged engine) after the step
    copy = Decoder(models.actor.config, attn_backend="auto", device=dev, dtype=torch.float32)
    load_weights(copy, full_weights(models.actor))
    out["rollout_copy"] = {f"actor.{n}": t.clone() for n, t in copy.state_dict().items()}
    return out


def _worker(rank: int, port: int, args: tuple, out_path: str) -> None:
    torch.set_num_threads(1)
    os.environ.update(RANK=str(rank), LOCAL_RANK=str(rank), WORLD_SIZE="2", MASTER_ADDR="127.0.0.1",
                      MASTER_PORT=str(port))
    dp = init_data_parallel()
    try:
        results = [_one_step(*args, num_kept, budget, dp) for num_kept, budget in CASES]
        if dp.is_main:
            torch.save(results, out_path)
    finally:
        close_data_parallel()


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def test_share_covers_each_item_once():
    items = list(range(7))
    shares = [DataParallel(r, 3).share(items) for r in range(3)]
    assert shares == [[0, 1, 2], [3, 4], [5, 6]]
    assert [DataParallel(r, 2).share([9]) for r in range(2)] == [[9], []]


def test_cases_pad_a_rank():
    """Each case leaves one rank with fewer micro-batches than the other, so padding runs."""
    for num_kept, budget in CASES:
        shares = [DataParallel(r, 2).share(_kept(num_kept)) for r in range(2)]
        counts = [len(plan_micro_batches([t.num_tokens for t in s], 2, budget)) for s in shares]
        assert counts[0] != counts[1], (num_kept, budget, counts)


@pytest.fixture(scope="module")
def two_rank_results(tmp_path_factory, tiny_model_dir):
    """The CASES run once by 2 gloo processes (one spawn for all cases: start-up dominates)."""
    from transformers import AutoModelForCausalLM

    tmp = tmp_path_factory.mktemp("dp")
    actor_dir = tmp / "actor"  # actor != reference, so the KL terms are not 0
    model = AutoModelForCausalLM.from_pretrained(tiny_model_dir, dtype=torch.float32)
    with torch.no_grad():
        for p in model.parameters():
            p.add_(0.05 * torch.randn(p.shape, generator=torch.Generator().manual_seed(7)))
    model.save_pretrained(actor_dir)
    make_tokenizer().save_pretrained(actor_dir)
    prompts = tmp / "p.jsonl"
    prompts.write_text('{"question": "1+1?", "gold_answer": "2", "pass_rate": 0.25}\n')
    args = (write_config(tmp, str(actor_dir), tiny_model_dir, str(prompts)), str(actor_dir), tiny_model_dir)
    out_path = str(tmp / "rank0.pt")
    mp.spawn(_worker, args=(_free_port(), args, out_path), nprocs=2, join=True)
    return args, torch.load(out_path)


@pytest.mark.parametrize("case", range(len(CASES)), ids=[f"kept{n}-budget{b}" for n, b in CASES])
def test_two_ranks_equal_one_process(two_rank_results, case):
    args, results = two_rank_results
    num_kept, budget = CASES[case]
    single = _one_step(*args, num_kept, budget, DataParallel())
    double = results[case]
    assert single["sums"]["positive_loss"] != 0 and single["sums"]["kl_penalty_loss"] != 0
    assert single["sums"]["num_action_tokens"] == sum(t.num_actions for t in _kept(num_kept))
    for key, value in single["sums"].items():
        assert double["sums"][key] == pytest.approx(value, rel=RTOL, abs=1e-7), key
    for key in ("actor_norm", "rm_norm"):
        assert single[key] > 0.05  # the clip is active
        assert double[key] == pytest.approx(single[key], rel=RTOL), key
    assert double["rollout_copy"].keys() <= double["weights"].keys()
    for name, t in double["rollout_copy"].items():
        assert torch.equal(t, double["weights"][name]), name
    for kind, atol in (("grads", 1e-8), ("weights", WEIGHT_ATOL)):
        assert single[kind].keys() == double[kind].keys()
        for name, ref in single[kind].items():
            err = (double[kind][name] - ref).abs().max()
            assert err <= RTOL * ref.abs().max() + atol, f"{kind} {name}: {err}"


class KeyedRollout(TextRollout):
    """Sample j of a prompt's group answers ``TEXTS[(sum of the prompt's ids + j) % len(TEXTS)]``:
    the same responses whichever rank generates the prompt (groups arrive whole and in order).
    Its log-probs are keyed too (-1 - (token mod 97) / 100): no model's, but the same on every
    rank, so the rollout check's gather and MAX over ranks must give the 1-process metrics."""

    def __init__(self, tokenizer, stop_token_id: int) -> None:
        self.tokenizer, self.stop_token_id = tokenizer, stop_token_id
        self.logprobs: list[torch.Tensor] = []

    def generate(self, prompts, params, generator):
        out = []
        for i, prompt in enumerate(prompts):
            text = TEXTS[(sum(prompt) + i % K) % len(TEXTS)]
            out.append(self.tokenizer.encode(text, add_special_tokens=False)[: params.max_new_tokens - 1]
                       + [self.stop_token_id])
        self.logprobs = [-1.0 - (torch.tensor(r, dtype=torch.float32) % 97) / 100 for r in out]
        return out

    def response_logprobs(self):
        return self.logprobs


def _fit(cfg_path: str, dp: DataParallel) -> str:
    tok = make_tokenizer()
    rollout = KeyedRollout(tok, tok.convert_tokens_to_ids("<|im_end|>"))
    return Trainer(load_config(cfg_path), rollout=rollout, router=KeywordRouter("2"), dp=dp).fit()


def _train_worker(rank: int, port: int, cfg_path: str, out_path: str) -> None:
    torch.set_num_threads(1)
    os.environ.update(RANK=str(rank), LOCAL_RANK=str(rank), WORLD_SIZE="2", MASTER_ADDR="127.0.0.1",
                      MASTER_PORT=str(port))
    dp = init_data_parallel()
    try:
        run_dir = _fit(cfg_path, dp)
        with open(f"{out_path}.{rank}", "w") as f:
            f.write(run_dir)
    finally:
        close_data_parallel()


def _rows(run_dir: str) -> list[dict]:
    with open(os.path.join(run_dir, "rank0.log.jsonl")) as f:
        return [reproducible_metrics(json.loads(line)) for line in f]


def _hf_weights(run_dir: str) -> dict[str, torch.Tensor]:
    from safetensors.torch import load_file

    return load_file(os.path.join(run_dir, "hf-2", "model.safetensors"))


def test_two_trainer_steps_on_two_ranks_equal_one_process(tmp_path, tiny_model_dir, perturbed_actor_dir, prompt_file):
    # 2 prompts per step: rank r generates prompt r, so the gathered order is the 1-process order
    runs = {}
    for name in ("single", "double"):
        (tmp_path / name).mkdir()
        runs[name] = write_config(tmp_path / name, perturbed_actor_dir, tiny_model_dir, prompt_file,
                                  total_steps=2, keep_resume_states=0)
    single_dir = _fit(runs["single"], DataParallel())
    out = str(tmp_path / "run_dir")
    mp.spawn(_train_worker, args=(_free_port(), runs["double"], out), nprocs=2, join=True)
    double_dir = open(f"{out}.0").read()
    assert open(f"{out}.1").read() == double_dir  # one run folder for both ranks
    assert os.listdir(os.path.dirname(double_dir)) == [os.path.basename(double_dir)]
    single, double = _rows(single_dir), _rows(double_dir)
    assert [r["step"] for r in double] == [1, 2]
    assert all(r["num_kept"] > 0 for r in single) and single[1]["actor_grad_norm"] > 0
    assert all(r["rollout_logprob_abs_diff_max"] > r["rollout_logprob_abs_diff_mean"] > 0 for r in single)
    for s_row, d_row in zip(single, double):
        assert s_row.keys() == d_row.keys()
        for key, value in s_row.items():
            assert d_row[key] == pytest.approx(value, rel=1e-4, abs=1e-7), (s_row["step"], key)
    ref, got = _hf_weights(single_dir), _hf_weights(double_dir)
    assert ref.keys() == got.keys()
    for name, w in ref.items():  # bf16 files: fp32 values that differ by rounding may round apart by one ulp
        assert torch.allclose(got[name].float(), w.float(), rtol=2**-7, atol=1e-6), name


def test_what_several_processes_cannot_do_is_a_config_error(tmp_path, tiny_model_dir, prompt_file):
    cfg = load_config(write_config(tmp_path, tiny_model_dir, tiny_model_dir, prompt_file, keep_resume_states=2))
    check_data_parallel(cfg, DataParallel())  # one process: anything goes
    with pytest.raises(ConfigError, match="keep_resume_states in .* with 2 processes"):
        check_data_parallel(cfg, DataParallel(0, 2))
