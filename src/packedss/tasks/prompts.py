"""Prompt token ids. Plain prompts (the tiny models) are tokenized as they were in training.
Chat prompts follow the released evaluations: the chat-templated text is tokenized with the
tokenizer's special tokens added (`tokenizer(text)`), and a tokenizer that has a BOS token gets
exactly one at the start, whether the chat template, the tokenizer, both or neither put it there."""

from __future__ import annotations


def encode_prompt(tokenizer, text: str, chat: bool) -> list[int]:
    if not chat:
        return tokenizer(text, add_special_tokens=True)["input_ids"]
    ids = list(tokenizer(text, add_special_tokens=True)["input_ids"])
    bos = tokenizer.bos_token_id
    if bos is None:
        return ids
    start = 0
    while start < len(ids) and ids[start] == bos:
        start += 1
    return [bos, *ids[start:]]
