"""The runtime decides device and compute dtype once, and both precisions a forward meets follow that
dtype: the autocast around it and FSDP2's parameter gathering. Two gloo processes show that a config
asking for fp32 computes in fp32 under data parallelism (FSDP2 gathers fp32 weights and the forward
matches the unsharded fp32 forward), while a bf16 runtime gathers bf16 weights and drifts from it.

The device comes with its index: torch.cuda's memory queries and caps
(`get_per_process_memory_fraction`, `set_per_process_memory_fraction`) refuse a bare "cuda", and the
paged engine sizes its pool with them."""

from __future__ import annotations

import os
import socket

import pytest
import torch
import torch.multiprocessing as mp

from oreal_fast.config import TrainConfig
from oreal_fast.model.decoder import Decoder, DecoderConfig, TokenRewardModel
from oreal_fast.parallel import close_data_parallel, init_data_parallel
from oreal_fast.runtime import (
    Precision,
    Runtime,
    build_runtime,
    load_rl_models,
    prepare_model,
    resolve_compute_dtype,
    resolve_device,
    resolve_kernel_impl,
)

# ids, positions and boundaries of one packed row of two sequences (5 and 7 tokens)
LENS = (5, 7)


def test_cuda_device_carries_its_index(monkeypatch):
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "current_device", lambda: 3)
    assert resolve_device("auto") == torch.device("cuda", 3)
    assert resolve_device("cuda") == torch.device("cuda", 3)


def test_cpu_stays_cpu(monkeypatch):
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    assert resolve_device("auto") == torch.device("cpu")
    assert resolve_device("cpu") == torch.device("cpu")


@pytest.mark.parametrize("name,dtype", [("fp32", torch.float32), ("bf16", torch.bfloat16), ("fp16", torch.float16)])
def test_fsdp_policy_and_autocast_follow_the_one_dtype(name, dtype):
    """On a GPU too: the policy gathers in the config's dtype (not a fixed bf16), and autocast
    targets the same dtype, or is off for fp32."""
    cuda = torch.device("cuda", 0)
    precision = Precision(cuda, resolve_compute_dtype(name, cuda))
    policy = precision.fsdp_policy()
    assert (policy.param_dtype, policy.reduce_dtype) == (dtype, torch.float32)
    cpu = Precision(torch.device("cpu"), dtype)
    with cpu.autocast():
        assert torch.is_autocast_enabled("cpu") == (dtype != torch.float32)
        if dtype != torch.float32:
            assert torch.get_autocast_dtype("cpu") == dtype


def test_auto_dtype_and_impl_on_cpu():
    cpu = torch.device("cpu")
    assert resolve_compute_dtype("auto", cpu) == torch.float32
    assert resolve_kernel_impl("auto", cpu) == "eager"
    assert resolve_kernel_impl("triton", cpu) == "triton"


TINY = DecoderConfig(family="qwen2", vocab_size=64, hidden_size=32, intermediate_size=64, num_layers=2,
                     num_heads=4, num_kv_heads=2, head_dim=8, qkv_bias=True, tie_embeddings=True)


def _tiny_decoder() -> Decoder:
    torch.manual_seed(0)
    model = Decoder(TINY, device="cpu", dtype=torch.float32)
    model.init_weights()
    return model


def test_the_configs_attention_backend_reaches_the_actor_reference_and_token_rm(monkeypatch):
    """load_rl_models hands ``attention_backend`` to the loader of each of the three models (tiny
    random models stand in for the checkpoints)."""
    asked = {}

    def load_decoder(ref, *, attn_backend, with_lm_head=True, **kwargs):
        asked[ref] = attn_backend
        return Decoder(TINY, attn_backend=attn_backend, with_lm_head=with_lm_head)

    monkeypatch.setattr("oreal_fast.runtime.load_decoder", load_decoder)
    monkeypatch.setattr("oreal_fast.runtime.load_token_rm",
                        lambda ref, **kwargs: TokenRewardModel(load_decoder(ref, with_lm_head=False, **kwargs)))
    cfg = TrainConfig(actor="actor/x", reference="reference/x", token_level_rm="rm/x", datasets="none",
                      device="cpu", attention_backend="sdpa")
    models, _ = load_rl_models(cfg, build_runtime(cfg))
    assert asked == {"actor/x": "sdpa", "reference/x": "sdpa", "rm/x": "sdpa"}
    assert [m.attn_backend for m in (models.actor, models.reference, models.token_rm.backbone)] == ["sdpa"] * 3


def _row() -> tuple[torch.Tensor, ...]:
    ids = torch.randint(0, 64, (sum(LENS),), generator=torch.Generator().manual_seed(1))
    positions = torch.cat([torch.arange(n) for n in LENS])
    cu = torch.tensor([0, LENS[0], sum(LENS)], dtype=torch.int32)
    return ids, positions, cu


def _forward(runtime: Runtime) -> tuple[torch.Tensor, set[torch.dtype]]:
    """The tiny decoder prepared as the runtime says (FSDP2 over the ranks): its final hidden states
    and the dtypes of every linear weight its first block computed with."""
    model = _tiny_decoder()
    prepare_model(model, model, runtime)
    seen: set[torch.dtype] = set()
    linears = [m for m in model.blocks[0].modules() if isinstance(m, torch.nn.Linear)]
    assert linears
    for m in linears:
        m.register_forward_pre_hook(lambda module, args: seen.add(module.weight.dtype))
    ids, positions, cu = _row()
    with torch.no_grad(), runtime.precision.autocast():
        hidden = model(ids, positions, cu, max(LENS))
    return hidden.float(), seen


def _worker(rank: int, port: int, out_path: str) -> None:
    torch.set_num_threads(1)
    os.environ.update(RANK=str(rank), LOCAL_RANK=str(rank), WORLD_SIZE="2", MASTER_ADDR="127.0.0.1",
                      MASTER_PORT=str(port))
    dp = init_data_parallel()
    try:
        fp32 = build_runtime(TrainConfig(actor="tiny/model", datasets="none", dtype="fp32", device="cpu"), dp)
        # bf16 on CPU is no config's choice (it needs a GPU); built by hand, it shows the policy follows it
        bf16 = Runtime(Precision(torch.device("cpu"), torch.bfloat16), dp)
        results = {"fp32": _forward(fp32), "bf16": _forward(bf16), "world_size": dp.world_size}
        if dp.is_main:
            torch.save(results, out_path)
        torch.distributed.barrier()  # neither rank leaves the group while the other still works in it
    finally:
        close_data_parallel()


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def test_fp32_under_data_parallelism_computes_in_fp32(tmp_path, monkeypatch):
    out_path = str(tmp_path / "rank0.pt")
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "")  # CPU ranks (gloo) on a GPU machine too
    mp.spawn(_worker, args=(_free_port(), out_path), nprocs=2, join=True)
    results = torch.load(out_path)
    assert results["world_size"] == 2
    single = Runtime(Precision(torch.device("cpu"), torch.float32))
    expected, seen = _forward(single)
    assert seen == {torch.float32}
    hidden, seen = results["fp32"]
    assert seen == {torch.float32}
    assert (hidden - expected).abs().max() <= 1e-6
    hidden, seen = results["bf16"]
    assert seen == {torch.bfloat16}
    assert (hidden - expected).abs().max() > 1e-3  # what a silent bf16 would have done to the fp32 run
