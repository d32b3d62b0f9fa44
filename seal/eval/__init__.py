"""Evaluation: ``seal eval`` (:mod:`seal.eval.evaluate`), chat policies, validation-log writer (``logs``), BFCL result export."""

from seal.eval.evaluate import EvalSettings, evaluate_episode, run_eval
from seal.eval.logs import ValidationLogWriter, ValidationRecord, read_log_dir, read_log_file
from seal.eval.policies import ChatPolicy, HFChatPolicy, OpenAIChatPolicy, SamplingSettings

__all__ = [
    "ChatPolicy", "EvalSettings", "evaluate_episode", "HFChatPolicy", "OpenAIChatPolicy", "SamplingSettings",
    "ValidationLogWriter", "ValidationRecord", "read_log_dir", "read_log_file", "run_eval",
]
