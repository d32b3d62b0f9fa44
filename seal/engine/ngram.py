"""Prompt lookup: predict a row's next tokens from its own earlier text (no draft model).

Tool-use episodes repeat themselves: a call's JSON arguments copy spans of the user's message and
of earlier tool results, and a turn's header repeats the previous one's. The most recent earlier
occurrence of a row's last ``n`` tokens (n = ``max_n`` down to ``min_n``) therefore often predicts
what follows it. :class:`NgramIndex` keeps, per n-gram of the row's context and generated tokens,
where the token after its most recent occurrence sits, so a prediction costs a few dict look-ups
(negligible next to a forward of even a 135M model).

The prediction is a pure function of the row's token sequence (and ``max_n`` / ``min_n``):
:meth:`NgramIndex.predict` chains it, each predicted token joining the sequence before the next
look-up, so the ``j``-th predicted token is exactly what a look-up would predict once the ``j - 1``
before it were real. That makes the prediction usable twice: as the speculative decoder's draft
(:mod:`seal.engine.speculative`), and as the token a sampled draw orders first
(:func:`seal.engine.sampling.hinted_draw`), so both engines and both decoders draw the same
token for a seed.
"""

from __future__ import annotations

from collections.abc import Sequence

# Shortest n-gram looked up: a single token predicts its follower too poorly to pay for drafting.
MIN_NGRAM = 2


class NgramIndex:
    """The n-grams (``min_n <= n <= max_n``) of a growing token sequence, each mapped to the index of
    the token that followed its most recent occurrence.

    The sequence's last n-gram has no follower yet and is not indexed, so a look-up of it finds
    its most recent *earlier* occurrence. Grams of different lengths are tuples of different
    lengths and share one dict.
    """

    def __init__(self, tokens: Sequence[int], max_n: int, min_n: int = MIN_NGRAM) -> None:
        if not 1 <= min_n <= max_n:
            raise ValueError(f"n-gram orders must satisfy 1 <= min_n <= max_n, got {min_n}, {max_n}")
        self.tokens = [int(t) for t in tokens]
        self.max_n, self.min_n = max_n, min_n
        self.follow: dict[tuple[int, ...], int] = {}
        toks, size = self.tokens, len(self.tokens)
        for n in range(min_n, max_n + 1):
            # Starts 0 .. size-n-1: every gram that has a follower; later ones overwrite earlier ones.
            grams = zip(*(toks[i:size - n + i] for i in range(n)))
            self.follow.update(zip(grams, range(n, size)))

    def __len__(self) -> int:
        return len(self.tokens)

    def push(self, token: int) -> None:
        """Append ``token``; the grams ending just before it now have it as their follower."""
        toks, size = self.tokens, len(self.tokens)
        for n in range(self.min_n, min(self.max_n, size) + 1):
            self.follow[tuple(toks[size - n:])] = size
        toks.append(int(token))

    def extend(self, tokens: Sequence[int]) -> None:
        for t in tokens:
            self.push(t)

    def predict(self, count: int) -> list[int]:
        """Up to ``count`` predicted next tokens, chained (see the module docstring); fewer when a
        look-up finds no earlier occurrence of any order."""
        toks, base = self.tokens, len(self.tokens)
        extra: list[int] = []
        overlay: dict[tuple[int, ...], int] = {}  # grams ending inside ``extra``: more recent than ``follow``
        for _ in range(count):
            window = (toks[-self.max_n:] + extra)[-self.max_n:]
            nxt = None
            for n in range(min(self.max_n, len(window)), self.min_n - 1, -1):
                gram = tuple(window[-n:])
                at = overlay.get(gram)
                if at is None:
                    at = self.follow.get(gram)
                if at is not None:
                    nxt = toks[at] if at < base else extra[at - base]
                    break
            if nxt is None:
                break
            for n in range(self.min_n, min(self.max_n, len(window)) + 1):
                overlay[tuple(window[-n:])] = base + len(extra)
            extra.append(nxt)
        return extra

    def hint(self) -> int:
        """The next token's prediction, or -1 when there is none (the form a hints tensor takes)."""
        pred = self.predict(1)
        return pred[0] if pred else -1
