"""Evaluation: validation runner, validation-log writer (``logs``), BFCL result export."""

from seal.eval.logs import ValidationLogWriter, ValidationRecord, read_log_dir, read_log_file
from seal.eval.policies import ChatPolicy, HFChatPolicy, OpenAIChatPolicy, SamplingSettings
from seal.eval.runner import EvalSettings, run_episode, run_eval

__all__ = [
    "ChatPolicy", "EvalSettings", "HFChatPolicy", "OpenAIChatPolicy", "SamplingSettings",
    "ValidationLogWriter", "ValidationRecord", "read_log_dir", "read_log_file", "run_episode", "run_eval",
]
