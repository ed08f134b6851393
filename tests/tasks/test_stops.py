"""The token-level stop check: its shortcut (a window with no marked token is not decoded) gives
what decoding every window gives, for byte-level tokenizers whose characters span tokens, and is
not taken where a window's text can hold a character none of its tokens' texts holds."""

import random

import pytest
from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
from transformers import AutoTokenizer, PreTrainedTokenizerFast

from packedss.tasks.stops import _marked_tokens, make_stop_check
from tests.conftest import SHIPPED

CORPUS = [
    "Question: Tom has 3 apples.\nAnswer: 3 * 4 = 12.\n#### 12",
    "Étape 1: le café: 5 €.\nÉtape 2: 日本の 数 は 7 です。\nQuestion: 9?",
    "def f(x):\n    return x\nclass A:\n    pass\nprint(f(2))\n# done",
]


def _trained(pre_tokenizer, decoder, vocab_size: int) -> PreTrainedTokenizerFast:
    """A small BPE tokenizer on CORPUS, too small to hold most multi-byte characters whole."""
    tokenizer = Tokenizer(models.BPE())
    tokenizer.pre_tokenizer, tokenizer.decoder = pre_tokenizer, decoder
    alphabet = pre_tokenizers.ByteLevel.alphabet() if isinstance(decoder, decoders.ByteLevel) else []
    trainer = trainers.BpeTrainer(vocab_size=vocab_size, special_tokens=["<eos>"], initial_alphabet=alphabet)
    tokenizer.train_from_iterator(CORPUS * 4, trainer)
    return PreTrainedTokenizerFast(tokenizer_object=tokenizer, eos_token="<eos>")


def byte_level() -> PreTrainedTokenizerFast:
    return _trained(pre_tokenizers.ByteLevel(add_prefix_space=False), decoders.ByteLevel(), 300)


def metaspace() -> PreTrainedTokenizerFast:
    return _trained(pre_tokenizers.Metaspace(), decoders.Metaspace(), 120)


def decoded_check(tokenizer, stops: list[str]):
    """The check by its definition: the first of the new tokens whose window's text (the new tokens
    and the lookback before them) holds a stop string."""
    lookback = max(len(s) for s in stops) + 2
    to_text = tokenizer.backend_tokenizer.decode

    def check(tokens, new):
        start = max(0, len(tokens) - new - lookback)
        for end in range(len(tokens) - new + 1, len(tokens) + 1):
            if any(s in to_text(tokens[start:end]) for s in stops):
                return end
        return None

    return check


def streams(tokenizer, count: int, seed: int) -> list[list[int]]:
    """Token streams near the stops: the corpus's lines shuffled and joined, with random tokens
    (byte pieces among them) put in, so that characters split across tokens."""
    rng, vocabulary = random.Random(seed), tokenizer.backend_tokenizer.get_vocab_size(with_added_tokens=True)
    lines = [line for text in CORPUS for line in text.split("\n")]
    out = []
    for _ in range(count):
        text = "\n".join(rng.sample(lines, 4))
        ids = tokenizer(text, add_special_tokens=False)["input_ids"]
        for _ in range(rng.randrange(6)):
            ids.insert(rng.randrange(len(ids) + 1), rng.randrange(vocabulary))
        out.append(ids)
    return out


def agree(tokenizer, stops: list[str], seed: int) -> int:
    """Feed streams to both checks a few tokens at a time; both must cut at the same token. Returns
    how many cuts they agreed on."""
    check, reference = make_stop_check(tokenizer, stops), decoded_check(tokenizer, stops)
    cuts, rng = 0, random.Random(seed)
    for ids in streams(tokenizer, 60, seed):
        end = 0
        while end < len(ids):
            new = min(rng.randint(1, 6), len(ids) - end)
            end += new
            tokens = ids[:end]
            assert check(tokens, new) == reference(tokens, new), (stops, tokens, new)
            if reference(tokens, new) is not None:
                cuts += 1
                break
    return cuts


@pytest.mark.parametrize("stops", [["\nQuestion:"], ["\nclass", "\ndef", "\n#", "\nif", "\nprint"], ["\nÉtape", "の 数"],
                                   ["é:"]])  # fmt: skip
def test_byte_level_shortcut_cuts_where_decoding_does(stops):
    tokenizer = byte_level()
    marked = _marked_tokens(tokenizer.backend_tokenizer, stops)
    assert marked is not None and len(marked) < tokenizer.backend_tokenizer.get_vocab_size() // 2
    assert agree(tokenizer, stops, seed=len(stops)) > 5


def test_shipped_tokenizer_marks_the_rare_character():
    tokenizer = AutoTokenizer.from_pretrained(str(SHIPPED / "tiny"))
    backend = tokenizer.backend_tokenizer
    marked = _marked_tokens(backend, ["\nQuestion:"])
    texts = [backend.decode([t]) for t in range(backend.get_vocab_size(with_added_tokens=True))]
    # Q, not the line break that starts every line of an answer: fewer windows sent to the decoder.
    assert marked == {t for t, text in enumerate(texts) if "Q" in text}
    assert len(marked) < sum("\n" in text for text in texts)
    assert agree(tokenizer, ["\nQuestion:"], seed=0) > 5


def test_shortcut_not_taken_where_token_texts_do_not_add_up():
    """A stop without an ASCII character, and any decoder but the byte-level one (Metaspace's
    first token loses its space), decode every window; the cuts still agree."""
    assert _marked_tokens(byte_level().backend_tokenizer, ["\nQuestion:", "日本"]) is None
    tokenizer = metaspace()
    assert _marked_tokens(tokenizer.backend_tokenizer, [" Answer"]) is None
    assert agree(tokenizer, [" Answer", "\nQuestion:"], seed=1) > 0
