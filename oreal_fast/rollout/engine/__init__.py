"""The paged rollout engine (see `engine.py`): sequence / block manager / scheduler / model runner / loop."""

from oreal_fast.rollout.engine.engine import EngineConfig, PagedEngine
from oreal_fast.rollout.engine.pool_sizing import CudaMemory, PoolSizer, kv_cache_bytes

__all__ = ["CudaMemory", "EngineConfig", "PagedEngine", "PoolSizer", "kv_cache_bytes"]
