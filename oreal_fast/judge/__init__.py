"""Rewards for math samples: the official rule checker (or a strict one) and an LLM verifier.

Public API: `Router`, `JudgeItem`, `JudgeOutcome`, `parse_judger_settings`,
`MathJudgerSettings`. See docs/judger.md for the configuration.
"""

from oreal_fast.judge.router import JudgeItem, JudgeOutcome, Router
from oreal_fast.judge.settings import MathJudgerSettings, parse_judger_settings

__all__ = ["JudgeItem", "JudgeOutcome", "MathJudgerSettings", "Router", "parse_judger_settings"]
