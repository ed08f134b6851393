"""Stop strings on token streams: the token-level stop check a decoder calls as tokens arrive,
and the output text a record holds (cut before the first stop string)."""

from __future__ import annotations

from tokenizers import decoders


def make_stop_check(tokenizer, stops: list[str]):
    """Token-level stop for stop strings: keep tokens up to the one that completes a stop string."""
    if not stops:
        return None
    lookback = max(len(s) for s in stops) + 2
    # The fast tokenizer's backend decode skips transformers' argument handling (most of the cost).
    backend = getattr(tokenizer, "backend_tokenizer", None)
    to_text = backend.decode if backend is not None else tokenizer.decode
    marked = _marked_tokens(backend, stops)

    def check(tokens, new):
        start = max(0, len(tokens) - new - lookback)
        window = tokens[start:]
        if marked is not None and marked.isdisjoint(window):
            return None  # no token of the window can put a stop's marker in its text
        text = to_text(window)  # decoded once for every stop string
        if not any(s in text for s in stops):
            return None
        for end in range(len(tokens) - new + 1, len(tokens) + 1):
            text = to_text(tokens[start:end])
            if any(s in text for s in stops):
                return end
        return None

    return check


def _marked_tokens(backend, stops: list[str]) -> frozenset[int] | None:
    """The ids whose text alone holds a stop string's marker, when a window's text can hold a
    marker only through such a token; else None (every check decodes). A stop's marker is the ASCII
    character of it that the fewest tokens' texts hold (the `Q` of a newline then "Question:").

    That holds for a byte-level decoder (GPT-2's, Qwen's): a window's text is its tokens' bytes,
    concatenated, decoded as UTF-8 with the invalid sequences replaced, and an ASCII byte is never
    part of a multi-byte character or of a replaced sequence. So an ASCII character is in the
    window's text exactly when it is in some token's own text, and a window none of whose tokens
    is marked holds no stop string: the check returns what decoding it would, without the decode
    that is most of a step's cost on a CPU (a round's model call leaves the tokenizer's tables out
    of the caches)."""
    if backend is None or not isinstance(backend.decoder, decoders.ByteLevel):
        return None
    if not all(any(c.isascii() for c in stop) for stop in stops):
        return None
    size = backend.get_vocab_size(with_added_tokens=True)
    texts = backend.decode_batch([[token] for token in range(size)])
    holders = {c: frozenset(token for token, text in enumerate(texts) if c in text)
               for c in {c for stop in stops for c in stop if c.isascii()}}  # fmt: skip
    return frozenset().union(*(min((holders[c] for c in stop if c.isascii()), key=len) for stop in stops))


def output_text(tokenizer, tokens: list[int], stops: list[str]) -> str:
    """Detokenized output without special tokens, cut before the first stop string."""
    text = tokenizer.decode(tokens, skip_special_tokens=True)
    cuts = [text.find(s) for s in stops if s in text]
    return text[: min(cuts)] if cuts else text
