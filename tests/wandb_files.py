"""Runs wandb offline in a test (:func:`use_offline_wandb`) and reads back the runs it wrote under a run
folder (``<run_dir>/wandb/offline-run-*/run-<id>.wandb``, :func:`offline_runs`), so tests can check what a
later ``wandb sync`` would upload, with no network and no wandb server.

A ``.wandb`` file is wandb's transaction log: a 7-byte header (``:W&B``, magic, version), then protobuf
``Record`` messages framed as in LevelDB's log format (32 KiB blocks; each chunk has a 7-byte header:
CRC32C, little-endian length, type FULL / FIRST / MIDDLE / LAST; a block tail shorter than a header is
padding). wandb has no public reader for it, so this is one.
"""

from __future__ import annotations

import glob
import json
import os
import struct
from dataclasses import dataclass, field
from types import ModuleType

import pytest

_BLOCK = 32 * 1024
_HEADER = 7
_FULL, _FIRST, _MIDDLE, _LAST = 1, 2, 3, 4
# values wandb adds to every history row
_WANDB_KEYS = {"_step", "_runtime", "_timestamp"}


def use_offline_wandb(monkeypatch: pytest.MonkeyPatch, home: str) -> ModuleType:
    """wandb (skipping the test when it is not installed) with no network and nothing written outside
    ``home``: offline mode, its own config and cache folders, no inherited run id, project or key."""
    wandb = pytest.importorskip("wandb")
    for key in ("WANDB_PROJECT", "WANDB_ENTITY", "WANDB_RUN_ID", "WANDB_RESUME", "WANDB_DIR", "WANDB_API_KEY"):
        monkeypatch.delenv(key, raising=False)
    monkeypatch.setenv("WANDB_MODE", "offline")
    monkeypatch.setenv("WANDB_SILENT", "true")
    monkeypatch.setenv("WANDB_CONSOLE", "off")  # leave pytest's capture of stdout / stderr alone
    for key in ("WANDB_CONFIG_DIR", "WANDB_CACHE_DIR", "WANDB_DATA_DIR", "WANDB_ARTIFACT_DIR"):
        monkeypatch.setenv(key, os.path.join(home, key.lower()))
    return wandb


@dataclass
class OfflineRun:
    """One offline run file: the run record and the history rows, in the order they were logged."""

    run_id: str
    name: str
    project: str
    start_us: int
    config: dict = field(default_factory=dict)
    history: list[dict] = field(default_factory=list)


def _records(path: str) -> list[bytes]:
    with open(path, "rb") as f:
        data = f.read()
    assert data[:4] == b":W&B", f"{path} is not a wandb transaction log"
    records, pending, pos = [], b"", _HEADER
    while pos + _HEADER <= len(data):
        left = _BLOCK - pos % _BLOCK
        if left < _HEADER:  # the block's padding
            pos += left
            continue
        _crc, length, kind = struct.unpack("<IHB", data[pos:pos + _HEADER])
        assert kind in (_FULL, _FIRST, _MIDDLE, _LAST), f"{path}: chunk type {kind} at byte {pos}"
        pending += data[pos + _HEADER:pos + _HEADER + length]
        pos += _HEADER + length
        if kind in (_FULL, _LAST):
            records.append(pending)
            pending = b""
    return records


def read_offline_run(path: str) -> OfflineRun:
    """The run record (id, name, project, config at init) and the history rows of one finished ``.wandb``
    file; history values are decoded from their JSON, wandb's own ``_step`` / ``_runtime`` / ``_timestamp``
    dropped."""
    from wandb.proto import wandb_internal_pb2 as pb

    run = None
    history = []
    finished = False
    for data in _records(path):
        record = pb.Record()
        record.ParseFromString(data)
        kind = record.WhichOneof("record_type")
        if kind == "run":
            r = record.run
            config = {item.key: json.loads(item.value_json) for item in r.config.update if item.key != "_wandb"}
            run = OfflineRun(run_id=r.run_id, name=r.display_name, project=r.project,
                             start_us=r.start_time.ToMicroseconds(), config=config)
        elif kind == "history":
            row = {".".join(item.nested_key) or item.key: json.loads(item.value_json) for item in record.history.item}
            history.append({k: v for k, v in row.items() if k not in _WANDB_KEYS})
        finished = finished or kind == "exit"
    assert run is not None and finished, f"{path} lacks its run record or its exit record (not finished)"
    run.history = history
    return run


def offline_runs(run_dir: str) -> list[OfflineRun]:
    """Every offline wandb run under ``run_dir``, oldest first (a resumed run adds one; its folder's name
    has a second's resolution and a ``-1`` suffix on a clash, so the run records' start times order them)."""
    import wandb

    # wandb's service process writes the file on its own after `finish` returns; teardown waits for it
    wandb.teardown()
    paths = glob.glob(os.path.join(run_dir, "wandb", "offline-run-*", "run-*.wandb"))
    return sorted((read_offline_run(p) for p in paths), key=lambda run: run.start_us)
