"""Stop strings on token streams: the token-level stop check a decoder calls as tokens arrive,
and the output text a record holds (cut before the first stop string)."""

from __future__ import annotations


def make_stop_check(tokenizer, stops: list[str]):
    """Token-level stop for stop strings: keep tokens up to the one that completes a stop string."""
    if not stops:
        return None
    lookback = max(len(s) for s in stops) + 2
    # The fast tokenizer's backend decode skips transformers' argument handling (most of the cost).
    backend = getattr(tokenizer, "backend_tokenizer", None)
    to_text = backend.decode if backend is not None else tokenizer.decode

    def check(tokens, new):
        start = max(0, len(tokens) - new - lookback)
        text = to_text(tokens[start:])  # decoded once for every stop string
        if not any(s in text for s in stops):
            return None
        for end in range(len(tokens) - new + 1, len(tokens) + 1):
            text = to_text(tokens[start:end])
            if any(s in text for s in stops):
                return end
        return None

    return check


def output_text(tokenizer, tokens: list[int], stops: list[str]) -> str:
    """Detokenized output without special tokens, cut before the first stop string."""
    text = tokenizer.decode(tokens, skip_special_tokens=True)
    cuts = [text.find(s) for s in stops if s in text]
    return text[: min(cuts)] if cuts else text
