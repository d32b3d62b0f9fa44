"""``seal.tags``: the failure-tag registry, at the import path the extending guide first gave (its home
is :mod:`seal_shared.tags`, which the environments' checkers share)."""

from seal_shared.tags import (
    TagDefinition, TurnEvidence, classify_turn, default_guidelines, default_tag_weights, excluded_tags, get_tag,
    guideline_excluded_tags, known_tags, register_tag, tag_definitions, unregister_tag,
)

__all__ = ["TagDefinition", "TurnEvidence", "classify_turn", "default_guidelines", "default_tag_weights",
           "excluded_tags", "get_tag", "guideline_excluded_tags", "known_tags", "register_tag", "tag_definitions",
           "unregister_tag"]
