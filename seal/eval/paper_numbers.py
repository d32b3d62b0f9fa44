"""Published numbers of the SEAL paper (arXiv 2605.24426), for side-by-side tables.

Pass rates in percent on the paper's 400 held-in BFCL V3 multi-turn tasks (100 per category),
transcribed from the paper's Table 1 (main results) and Table 3 (ablations, Qwen2.5-7B).
``avg`` is the paper's Avg column (the mean of the four categories).
"""

from __future__ import annotations

from typing import Final

COLUMNS: Final = ("avg", "multi_turn_base", "multi_turn_miss_func", "multi_turn_miss_param",
                  "multi_turn_long_context")


def _row(avg: float, base: float, miss_func: float, miss_param: float, long_ctx: float) -> dict[str, float]:
    return dict(zip(COLUMNS, (avg, base, miss_func, miss_param, long_ctx)))


# Table 1, per backbone: the backbone itself, + Vanilla RL, + SEAL.
TABLE1: Final[dict[str, dict[str, dict[str, float]]]] = {
    "qwen2.5-3b-instruct": {
        "backbone": _row(5.75, 11.00, 6.00, 3.00, 3.00),
        "vanilla_rl": _row(9.25, 16.00, 9.00, 6.00, 6.00),
        "seal": _row(14.00, 19.00, 15.00, 12.00, 10.00),
    },
    "qwen2.5-7b-instruct": {
        "backbone": _row(14.00, 22.00, 14.00, 10.00, 10.00),
        "vanilla_rl": _row(30.75, 46.00, 27.00, 27.00, 23.00),
        "seal": _row(40.25, 58.00, 36.00, 34.00, 33.00),
    },
    "toolace-2-llama-3.1-8b": {
        "backbone": _row(32.00, 45.00, 26.00, 35.00, 22.00),
        "vanilla_rl": _row(38.50, 52.00, 30.00, 40.00, 32.00),
        "seal": _row(46.75, 58.00, 46.00, 44.00, 39.00),
    },
}

# Table 1's reference models (not trained in the paper; listed for context only).
TABLE1_REFERENCE: Final[dict[str, dict[str, float]]] = {
    "Gemini-3-Pro-Preview": _row(60.75, 64.50, 60.00, 54.50, 64.00),
    "Claude-Sonnet-4.5": _row(61.38, 69.00, 65.00, 52.50, 59.00),
    "GPT-4o-2024-11-20": _row(42.50, 55.50, 34.50, 29.00, 51.00),
    "Gemini-2.5-Flash": _row(36.25, 41.50, 36.00, 32.00, 35.50),
    "GLM-4.6 355B": _row(68.00, 74.50, 68.00, 63.00, 66.50),
    "Qwen3-32B": _row(47.88, 56.00, 52.50, 40.00, 43.00),
    "Qwen2.5-14B-Instruct": _row(25.25, 33.00, 26.00, 22.00, 20.00),
    "xLAM-2-3b-fc-r": _row(58.38, 71.50, 59.00, 57.50, 45.50),
}

# Table 3: ablations on Qwen2.5-7B-Instruct. Keys are the row names make_tables.py expects.
TABLE3: Final[dict[str, dict[str, float]]] = {
    "backbone": _row(14.00, 22.00, 14.00, 10.00, 10.00),
    "vanilla_rl": _row(30.75, 46.00, 27.00, 27.00, 23.00),
    "wo_env_adaptation": _row(35.75, 52.00, 31.00, 32.00, 28.00),
    "wo_apatch": _row(32.75, 48.00, 27.00, 31.00, 25.00),
    "wo_closed_loop": _row(33.00, 46.00, 32.00, 28.00, 26.00),
    "seal": _row(40.25, 58.00, 36.00, 34.00, 33.00),
}

ROW_LABELS: Final[dict[str, str]] = {
    "backbone": "Backbone",
    "vanilla_rl": "+ Vanilla RL",
    "seal": "+ SEAL (full)",
    "wo_env_adaptation": "w/o Environment-Side Adaptation",
    "wo_apatch": "w/o Diagnosis-Guided Reweighting (A-Patch off)",
    "wo_closed_loop": "w/o Closed-Loop Update",
}

# Table 2: out-of-distribution transfer (percent), only the two Qwen backbones. V4 Avg is the
# mean of BFCL V4 Web Search and Memory; τ² Avg the mean of τ²-bench Retail, Airline, Telecom.
TABLE2_COLUMNS: Final = ("v4_avg", "web_search", "memory", "tau2_avg", "retail", "airline", "telecom")


def _ood(*values: float) -> dict[str, float]:
    return dict(zip(TABLE2_COLUMNS, values))


TABLE2: Final[dict[str, dict[str, dict[str, float]]]] = {
    "qwen2.5-3b-instruct": {
        "backbone": _ood(4.69, 0.00, 9.38, 9.64, 5.26, 14.00, 9.65),
        "vanilla_rl": _ood(5.98, 0.50, 11.26, 10.60, 6.14, 16.00, 9.65),
        "seal": _ood(8.63, 2.00, 15.26, 11.76, 8.77, 16.00, 10.52),
    },
    "qwen2.5-7b-instruct": {
        "backbone": _ood(9.17, 6.50, 11.83, 16.11, 16.67, 20.00, 11.67),
        "vanilla_rl": _ood(10.26, 7.50, 13.02, 17.19, 19.30, 20.00, 12.28),
        "seal": _ood(12.71, 9.50, 15.92, 20.79, 26.32, 22.00, 14.04),
    },
}
