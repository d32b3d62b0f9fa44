"""``seal.types``: the failure-tag vocabulary, at the import path the extending guide first gave
(its home is :mod:`seal_shared.types`, which the environments share)."""

from seal_shared.types import (
    PAPER_LABEL_DESCRIPTIONS, UNKNOWN_TAG, FailureTag, PaperLabel, TurnDiagnosis, category_of, dataclass_from_mapping,
)

__all__ = ["PAPER_LABEL_DESCRIPTIONS", "UNKNOWN_TAG", "FailureTag", "PaperLabel", "TurnDiagnosis", "category_of",
           "dataclass_from_mapping"]
