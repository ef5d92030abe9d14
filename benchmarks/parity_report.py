"""Prints linear_logprob's relative errors against fp64 at the Qwen2.5-0.5B head shape (GPU).

    python benchmarks/parity_report.py

Uses the helpers of tests/kernels/test_linear_logprob.py (same inputs, same fp64 reference, the
caching allocator poisoned with NaN first); the tests assert, this prints the numbers.
"""

import importlib.util
import pathlib

import torch

_path = pathlib.Path(__file__).parents[1] / "tests" / "kernels" / "test_linear_logprob.py"
_spec = importlib.util.spec_from_file_location("parity", _path)
t = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(t)


def _rel(got: torch.Tensor, ref: torch.Tensor) -> float:
    return float((got.detach().double() - ref).norm() / ref.norm())


def main() -> None:
    T, H, V = 16384, 896, 151936
    for with_ent in (False, True):
        hidden, weight, labels, g_lp, g_ent = t._inputs(T, H, V, "cuda", torch.bfloat16, 0.1)
        g_ent = g_ent if with_ent else None
        t._poison_cuda_allocator()
        got = t._run(hidden, weight, labels, 1.0, g_lp, g_ent, "triton")
        torch.cuda.synchronize()
        nonfinite = sum(int((~torch.isfinite(x)).sum()) for x in got)
        ref = t._reference(hidden, weight, labels, 1.0, g_lp, g_ent, rows=2048)
        errs = ", ".join(f"{n} {_rel(g, r):.2e}"
                         for n, g, r in zip(("logprobs", "entropy", "dH", "dW"), got, ref))
        print(f"bf16 T={T} H={H} V={V} entropy_grad={with_ent}: non-finite {nonfinite}; "
              f"relative error vs fp64: {errs}")


if __name__ == "__main__":
    main()
