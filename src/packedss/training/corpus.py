"""The tiny models' training data: the corpus, the tokenizer trained on it, the token sequences
and the batch sampler.

Corpus: the generated `arith` train split (the main target; prompt = the arith task's plain
template, exactly what inference feeds, + answer + EOS), GSM8K train (when the file is in the
data directory) and Python standard-library source. Held-out evaluation uses test splits only;
arith train and test are disjoint by construction.

The tokenizer (byte-level BPE, digits split one by one, special tokens <|endoftext|>, <|mask|>,
<|pad|>) is trained with `tokenizers` on the same corpus.
"""

from __future__ import annotations

import json
import random
import sysconfig
from dataclasses import dataclass
from pathlib import Path

EOS, MASK, PAD = "<|endoftext|>", "<|mask|>", "<|pad|>"
SPECIALS = [EOS, MASK, PAD]  # ids 0, 1, 2
SOURCES = ("arith", "gsm8k", "code")


@dataclass(frozen=True)
class Corpus:
    arith: list[tuple[str, str]]  # (prompt, answer): prompt as inference builds it, answer with a leading space
    gsm8k: list[tuple[str, str]]
    code: list[tuple[str, str]]  # (file name, source)
    template: str  # the arith task's plain prompt template


def build_prompt(template: str, question: str) -> str:
    return template.replace("{question}", question)


def gsm8k_rows(data_dir: str | None) -> list[dict]:
    if not data_dir:
        return []
    path = Path(data_dir) / "gsm8k_train.jsonl"
    if not path.is_file():
        print(f"[corpus] no {path}; GSM8K train left out", flush=True)
        return []
    with open(path, encoding="utf-8") as fh:
        return [json.loads(line) for line in fh if line.strip()]


def stdlib_sources(limit_bytes: int) -> list[tuple[str, str]]:
    """Top-level standard-library modules (sorted by name), up to `limit_bytes` of source."""
    root = Path(sysconfig.get_paths()["stdlib"])
    out, total = [], 0
    for path in sorted(root.glob("*.py")):
        if path.name.startswith(("test", "_")):
            continue
        try:
            text = path.read_text(encoding="utf-8")
        except (OSError, UnicodeDecodeError):
            continue
        out.append((path.name, text))
        total += len(text)
        if total >= limit_bytes:
            break
    return out


def build_corpus(arith_n: int, seed: int, data_dir: str | None, code_bytes: int) -> Corpus:
    from packedss.tasks.arith import generate
    from packedss.tasks.core import load_task_config

    template = load_task_config("arith").prompt_plain
    gsm_template = load_task_config("gsm8k").prompt_plain
    arith = generate("train", arith_n, seed)
    gsm = gsm8k_rows(data_dir)
    code = stdlib_sources(code_bytes)
    print(
        f"[corpus] arith train {len(arith)}, gsm8k train {len(gsm)}, stdlib files {len(code)} "
        f"({sum(len(t) for _, t in code)} chars); arith template {template!r}",
        flush=True,
    )
    return Corpus(
        # conf/task/arith.yaml: the tiny models are trained on build_prompt(q) + " " + answer.
        arith=[(build_prompt(template, r["question"]), " " + r["answer"]) for r in arith],
        gsm8k=[(build_prompt(gsm_template, r["question"]), " " + r["answer"]) for r in gsm],
        code=code,
        template=template,
    )


def train_tokenizer(corpus: Corpus, vocab_size: int, out_dir: Path):
    """Byte-level BPE on the corpus (the first 20000 arith examples, GSM8K, the source files),
    saved to `out_dir` and returned as a transformers fast tokenizer."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
    from transformers import PreTrainedTokenizerFast

    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.Sequence(
        [pre_tokenizers.Digits(individual_digits=True), pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=True)]
    )
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=vocab_size,
        special_tokens=SPECIALS,
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )

    def texts():
        for prompt, answer in corpus.arith[:20000]:
            yield prompt + answer
        for prompt, answer in corpus.gsm8k:
            yield prompt + answer
        for _, source in corpus.code:
            yield source

    tok.train_from_iterator(texts(), trainer=trainer)
    fast = PreTrainedTokenizerFast(
        tokenizer_object=tok, eos_token=EOS, pad_token=PAD, mask_token=MASK, model_max_length=4096
    )
    fast.save_pretrained(str(out_dir))
    return fast


def special_ids(tok) -> dict[str, int]:
    return {name: tok.convert_tokens_to_ids(token) for name, token in (("eos", EOS), ("mask", MASK), ("pad", PAD))}


Example = tuple[list[int], int]  # token ids, index of the first token the loss reads (the answer; 0 for code)


def encode_examples(tok, corpus: Corpus, max_len: int, code_len: int = 128) -> dict[str, list[Example]]:
    """Token sequences per source. Question+answer pairs longer than `max_len` are dropped, never
    truncated (the model must see every EOS); source files are cut into chunks of `code_len`."""
    eos = tok.convert_tokens_to_ids(EOS)

    def qa(pairs):
        out = []
        for prompt, answer in pairs:
            p = tok.encode(prompt, add_special_tokens=False)
            a = tok.encode(answer, add_special_tokens=False) + [eos]
            if len(p) + len(a) <= max_len:
                out.append((p + a, len(p)))
        return out

    code = []
    for _, source in corpus.code:
        ids = tok.encode(source, add_special_tokens=False)
        for start in range(0, max(1, len(ids) - 32), code_len):
            chunk = ids[start : start + code_len]
            if len(chunk) >= 32:
                code.append((chunk, 0))
    return {"arith": qa(corpus.arith), "gsm8k": qa(corpus.gsm8k), "code": code}


def describe_examples(tok, ids: dict[str, int], examples: dict[str, list[Example]]) -> str:
    lengths = [len(x[0]) for x in examples["arith"]]
    return (
        f"[data] vocab {len(tok)} ids {ids}; examples " + ", ".join(f"{k} {len(v)}" for k, v in examples.items())
        + f"; arith tokens mean {sum(lengths) / max(1, len(lengths)):.1f} max {max(lengths, default=0)}"
    )  # fmt: skip


class Sampler:
    """Batches drawn from one source at a time (by the mix weights) and from a window of
    similar lengths within it, so that a batch carries little padding."""

    def __init__(self, examples: dict[str, list[Example]], mix: dict[str, float], seed: int, window: int = 1024):
        self.rng = random.Random(seed)
        self.examples = {k: sorted(v, key=lambda x: len(x[0])) for k, v in examples.items() if v}
        names = [k for k in mix if k in self.examples and mix[k] > 0]
        if not names:
            raise ValueError(f"no examples to sample: every source with a positive mix weight is empty ({mix})")
        total = sum(mix[k] for k in names)
        self.names = names
        self.weights = [mix[k] / total for k in names]
        self.window = window

    def draw(self, n: int) -> list[Example]:
        pool = self.examples[self.rng.choices(self.names, self.weights)[0]]
        width = min(len(pool), max(n, self.window))
        start = self.rng.randint(0, len(pool) - width)
        return [pool[start + self.rng.randrange(width)] for _ in range(n)]
