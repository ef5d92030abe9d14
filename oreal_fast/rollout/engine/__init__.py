"""The paged rollout engine (see `engine.py`): sequence / block manager / scheduler / model runner / loop."""

from oreal_fast.rollout.engine.engine import EngineConfig, PagedEngine, kv_cache_bytes

__all__ = ["EngineConfig", "PagedEngine", "kv_cache_bytes"]
