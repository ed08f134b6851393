#!/usr/bin/env python
"""Train the shipped tiny dual-mode model (`tiny`) and its proposal-only LoRA (`tiny-lora`).

`tiny` uses the Nemotron-Labs-Diffusion layout: a transformers Ministral3Model backbone plus a
bias-free `diffusion_head`, saved with `packedss.models.nemotron.save_nemotron` and loaded by
the same adapter as the real 3B/8B checkpoints. One forward pass per training sequence holds

  * the clean sequence (causal rows): the AR next-token loss, read through the same head;
  * Nemotron-style draft blocks [x_j @ j, MASK @ j+1..j+W] that see the clean rows at positions
    < j and their whole block (the Linear-SS / Packed-SS drafter): mask row i predicts x_i;
  * pure-mask blocks [MASK @ j+1..j+B] that see the clean rows <= j (the Quadratic-SS drafter),

with a custom additive 4D mask and explicit position ids, W sampled in 1..16 (B <= 17).

Corpus: the generated `arith` train split (the main target; prompt = the arith task's plain
template, exactly what inference feeds, + answer + EOS), GSM8K train (from --data-dir when the
file is there) and Python standard-library source. Held-out evaluation (scripts/eval_tiny.py)
uses test splits only; arith train and test are disjoint by construction.

The tokenizer (byte-level BPE, digits split one by one, special tokens <|endoftext|>, <|mask|>,
<|pad|>) is trained with `tokenizers` on the same corpus and saved as tokenizer.json.

`--lora` trains a small proposal LoRA (attention and MLP projections of every layer) on top of the frozen base: the
LoRA is applied to the draft rows only (packedss.models.lora, the same row-selective code as
inference), and the drafter is distilled towards the verifier's own next-token distribution
(AR rows of the same forward pass, unadapted): KL to its distribution plus cross-entropy on its
greedy token, i.e. the token a greedy verification accepts.

Deterministic from --seed for a fixed --steps (the wall-clock cap --max-minutes only stops a
run early; the model card records the steps actually run). Checkpoints are written every
--save-every steps, so a stopped run still leaves a usable model.

    python scripts/train_tiny.py                       # tiny -> assets/models/tiny
    python scripts/train_tiny.py --lora                # tiny-lora -> assets/models/tiny-lora

    python scripts/train_tiny.py --family setdlm       # tiny-set -> assets/models/tiny-set

`--family setdlm` trains `tiny-set`: the released SetDLM layout (a transformers Qwen3Model
backbone + an untied LM head, saved with `packedss.models.setdlm.save_setdlm`) with the set
objective, on the same corpus, tokenizer (same function, same seed: identical to tiny's),
sampler and optimizer. A set model predicts only from MASK rows; one forward pass per sequence
holds (see `set_layout`):

  * the prompt as clean rows (causal);
  * the answer's clean rows in a decoding order sigma: clean row of rank r sees the prompt and
    the answer's clean rows of rank <= r (rows are placed in sigma order, so this is causal);
  * mask rows at answer positions i, each seeing the prompt, the clean rows of rank < c, and
    itself: a query row per position (c = rank of i: the verifier / AR query) and a draft row
    per position (c = the start of i's block in a random partition of sigma into blocks of
    1..16 ranks: the drafts of Linear-/Packed-/Quadratic-SS and native, which see only R);

loss = cross-entropy of the mask rows predicting their own position's token, with the mask
token's logit at -inf (SetDLM._forward). This is exactly what `set_call` feeds the model.
Orders: identity (order=ltr and AR), block-local permutations of W in {8, 16} consecutive
positions (the confidence order's blocks), and full random permutations (native, any order).
A run the wall-clock cap stopped after K steps is reproduced without the clock by
`--steps N --stop-after K` (the first K steps of the N-step schedule).
"""

from __future__ import annotations

import argparse
import json
import math
import os
import random
import shutil
import sys
import sysconfig
import time
from pathlib import Path

os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
# Idle OpenMP threads sleep instead of spinning: on a shared 2-core machine spinning threads
# made a step 4-7x slower (measured: 2.3-9 s vs 1.2 s per step under load).
os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")

import torch
import torch.nn.functional as F

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO / "src"))

EOS, MASK, PAD = "<|endoftext|>", "<|mask|>", "<|pad|>"
SPECIALS = [EOS, MASK, PAD]  # ids 0, 1, 2
IGNORE = -100


# --------------------------------------------------------------------------- corpus


def arith_template() -> tuple[str, object]:
    """The arith task's plain prompt template (conf/task/arith.yaml), as inference builds it."""
    from packedss.tasks.core import load_task_config

    return load_task_config("arith").prompt_plain, load_task_config


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


def corpus(args) -> dict:
    from packedss.tasks.arith import generate

    template, _ = arith_template()
    arith = generate("train", args.arith_n, args.seed)
    gsm_template = template
    try:
        from packedss.tasks.core import load_task_config

        gsm_template = load_task_config("gsm8k").prompt_plain
    except Exception as err:  # the gsm8k config may not exist yet: fall back to the arith template
        print(f"[corpus] gsm8k template unavailable ({err}); using the arith template", flush=True)
    gsm = gsm8k_rows(args.data_dir)
    code = stdlib_sources(args.code_bytes)
    print(
        f"[corpus] arith train {len(arith)}, gsm8k train {len(gsm)}, stdlib files {len(code)} "
        f"({sum(len(t) for _, t in code)} chars); arith template {template!r}",
        flush=True,
    )
    return {
        # conf/task/arith.yaml: the tiny models are trained on build_prompt(q) + " " + answer.
        "arith": [(build_prompt(template, r["question"]), " " + r["answer"]) for r in arith],
        "gsm8k": [(build_prompt(gsm_template, r["question"]), " " + r["answer"]) for r in gsm],
        "code": code,
        "template": template,
    }


# --------------------------------------------------------------------------- tokenizer


def train_tokenizer(data: dict, vocab_size: int, out_dir: Path):
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
        for prompt, answer in data["arith"][:20000]:
            yield prompt + answer
        for prompt, answer in data["gsm8k"]:
            yield prompt + answer
        for _, source in data["code"]:
            yield source

    tok.train_from_iterator(texts(), trainer=trainer)
    fast = PreTrainedTokenizerFast(
        tokenizer_object=tok, eos_token=EOS, pad_token=PAD, mask_token=MASK, model_max_length=4096
    )
    fast.save_pretrained(str(out_dir))
    return fast


# --------------------------------------------------------------------------- examples


def encode_examples(tok, data: dict, max_len: int, code_len: int = 128) -> dict:
    """Token sequences with the index where the loss starts (the answer; 0 for code)."""
    eos = tok.convert_tokens_to_ids(EOS)

    def qa(pairs):
        out = []
        for prompt, answer in pairs:
            p = tok.encode(prompt, add_special_tokens=False)
            a = tok.encode(answer, add_special_tokens=False) + [eos]
            if len(p) + len(a) <= max_len:  # never truncate: the model must see every EOS
                out.append((p + a, len(p)))
        return out

    code = []
    for _, source in data["code"]:
        ids = tok.encode(source, add_special_tokens=False)
        for start in range(0, max(1, len(ids) - 32), code_len):
            chunk = ids[start : start + code_len]
            if len(chunk) >= 32:
                code.append((chunk, 0))
    return {"arith": qa(data["arith"]), "gsm8k": qa(data["gsm8k"]), "code": code}


def sample_width(rng: random.Random) -> int:
    u = rng.random()
    if u < 0.35:
        return 8
    if u < 0.5:
        return 16
    return rng.randint(1, 16)


def layout(ids: list[int], start: int, rng: random.Random, mask_id: int, draft_ratio: float, mask_blocks: float):
    """Rows of one training sequence: tokens, positions, targets, and the attention rule as
    (visible clean prefix length, block id) per row; see the module docstring."""
    length = len(ids)
    tokens = list(ids)
    positions = list(range(length))
    targets = ids[1:] + [IGNORE]
    ar_target = [t if i >= start - 1 else IGNORE for i, t in enumerate(targets)]
    sees_clean = list(range(1, length + 1))  # causal: clean row i sees clean rows 0..i
    block_of = [-1] * length
    first_anchor = max(start - 1, 0)
    budget = max(4, int(draft_ratio * (length - first_anchor)))
    diff_target: list[int] = [IGNORE] * length
    block = 0
    while budget > 0 and first_anchor <= length - 2:
        width = sample_width(rng)
        j = rng.randint(first_anchor, length - 2)
        if rng.random() < mask_blocks:  # pure-mask block: B = W+1 masks at j+1..j+B, sees clean <= j
            rows = [(mask_id, j + 1 + r) for r in range(width + 1)]
            visible = j + 1
        else:  # Nemotron block: anchor x_j @ j then W masks, sees clean < j
            rows = [(ids[j], j)] + [(mask_id, j + 1 + r) for r in range(width)]
            visible = j
        for r, (token, pos) in enumerate(rows):
            tokens.append(token)
            positions.append(pos)
            ar_target.append(IGNORE)
            is_anchor = token != mask_id and r == 0
            diff_target.append(ids[pos] if (not is_anchor and pos < length) else IGNORE)
            sees_clean.append(visible)
            block_of.append(block)
        block += 1
        budget -= len(rows)
    return tokens, positions, ar_target, diff_target, sees_clean, block_of, length


def collate(seqs, pad_id: int, dtype=torch.float32):
    """Batch tensors plus the additive 4D mask (N, 1, R, R)."""
    rows = max(len(s[0]) for s in seqs)
    n = len(seqs)
    tokens = torch.full((n, rows), pad_id, dtype=torch.long)
    positions = torch.zeros((n, rows), dtype=torch.long)
    ar_t = torch.full((n, rows), IGNORE, dtype=torch.long)
    df_t = torch.full((n, rows), IGNORE, dtype=torch.long)
    allowed = torch.zeros((n, rows, rows), dtype=torch.bool)
    draft_rows = torch.zeros((n, rows), dtype=torch.bool)
    for b, (tok, pos, art, dft, sees, blk, length) in enumerate(seqs):
        r = len(tok)
        tokens[b, :r] = torch.tensor(tok)
        positions[b, :r] = torch.tensor(pos)
        ar_t[b, :r] = torch.tensor(art)
        df_t[b, :r] = torch.tensor(dft)
        sees_t = torch.tensor(sees)
        blk_t = torch.tensor(blk)
        col = torch.arange(r)
        clean_part = (col[None, :length] < sees_t[:, None])  # (r, length)
        allowed[b, :r, :length] = clean_part
        in_block = (blk_t[:, None] == blk_t[None, length:]) & (blk_t[:, None] >= 0)
        allowed[b, :r, length:r] = in_block
        draft_rows[b, length:r] = True
        idx = torch.arange(r, rows)
        allowed[b, idx, idx] = True  # padding rows see themselves only
    mask = torch.zeros((n, 1, rows, rows), dtype=dtype)
    mask.masked_fill_(~allowed[:, None], torch.finfo(dtype).min)
    return tokens, positions, mask, ar_t, df_t, draft_rows


class Sampler:
    """Batches drawn from one source at a time (by the mix weights) and from a window of
    similar lengths within it, so that a batch carries little padding."""

    def __init__(self, examples: dict, mix: dict, seed: int, window: int = 1024):
        self.rng = random.Random(seed)
        self.examples = {k: sorted(v, key=lambda x: len(x[0])) for k, v in examples.items() if v}
        names = [k for k in mix if k in self.examples and mix[k] > 0]
        total = sum(mix[k] for k in names)
        self.names = names
        self.weights = [mix[k] / total for k in names]
        self.window = window

    def draw(self, n: int):
        pool = self.examples[self.rng.choices(self.names, self.weights)[0]]
        width = min(len(pool), max(n, self.window))
        start = self.rng.randint(0, len(pool) - width)
        return [pool[start + self.rng.randrange(width)] for _ in range(n)]


# --------------------------------------------------------------------------- model


def make_config(args, vocab: int, ids: dict):
    from transformers import Ministral3Config

    config = Ministral3Config(
        vocab_size=vocab,
        hidden_size=args.hidden,
        intermediate_size=args.intermediate,
        num_hidden_layers=args.layers,
        num_attention_heads=args.heads,
        num_key_value_heads=args.kv_heads,
        head_dim=args.hidden // args.heads,
        max_position_embeddings=4096,
        rope_parameters={
            "rope_type": "default",
            "rope_theta": 10000.0,
            "llama_4_scaling_beta": 0.1,
            "original_max_position_embeddings": 4096,
        },
        tie_word_embeddings=False,
        pad_token_id=ids["pad"],
        bos_token_id=ids["eos"],
        eos_token_id=ids["eos"],
        initializer_range=0.02,
    )
    config._attn_implementation = "sdpa"
    return config


def save_checkpoint(out_dir: Path, backbone, head, tok, extra: dict, writer=None) -> None:
    """Write the checkpoint next to out_dir and swap it in (a crash never leaves half a model).
    `writer(tmp_dir, backbone, head, extra)` writes the weights (default: the Nemotron layout)."""
    from packedss.models.nemotron import save_nemotron

    tmp = out_dir.with_name(out_dir.name + ".tmp")
    if tmp.exists():
        shutil.rmtree(tmp)
    (writer or save_nemotron)(tmp, backbone, head, extra)
    tok.save_pretrained(str(tmp))
    card = out_dir / "README.md"
    if card.exists():
        shutil.copy(card, tmp / "README.md")
    old = out_dir.with_name(out_dir.name + ".old")
    if out_dir.exists():
        if old.exists():
            shutil.rmtree(old)
        out_dir.rename(old)
    tmp.rename(out_dir)
    if old.exists():
        shutil.rmtree(old)


def lr_at(step: int, steps: int, peak: float, warmup: int) -> float:
    if step < warmup:
        return peak * (step + 1) / warmup
    progress = min(1.0, (step - warmup) / max(1, steps - warmup))
    return peak * (0.1 + 0.9 * 0.5 * (1 + math.cos(math.pi * progress)))


def seed_all(seed: int) -> None:
    random.seed(seed)
    torch.manual_seed(seed)
    try:
        import numpy as np

        np.random.seed(seed)
    except ImportError:
        pass


# --------------------------------------------------------------------------- base training


def make_sampler(examples, args) -> "Sampler":
    return Sampler(examples, {"arith": args.mix_arith, "gsm8k": args.mix_gsm8k, "code": args.mix_code}, args.seed)


def train_steps(args, started, backbone, head, losses, names, save, extra):
    """The training loop both families share: learning-rate schedule, AdamW (no decay on
    vectors), gradient clipping at 1.0, a moving average of two losses for the log, periodic
    checkpoints, and the wall-clock / --stop-after caps. `losses()` builds one batch and
    returns (loss to minimize, (two losses to log), rows per sequence). Returns the number of
    steps run and the final moving averages."""
    params_list = list(backbone.parameters()) + list(head.parameters())
    decay = [p for p in params_list if p.dim() >= 2]
    no_decay = [p for p in params_list if p.dim() < 2]
    opt = torch.optim.AdamW(
        [{"params": decay, "weight_decay": args.weight_decay}, {"params": no_decay, "weight_decay": 0.0}],
        lr=args.lr, betas=(0.9, 0.98), eps=1e-8,
    )  # fmt: skip
    backbone.train()
    head.train()
    t0 = time.time()
    ema = None
    steps_run = 0
    for step in range(args.steps):
        if args.max_minutes and time.time() - started > args.max_minutes * 60:
            print(f"[train] wall-clock cap reached after {step} steps", flush=True)
            break
        if args.stop_after and step >= args.stop_after:
            print(f"[train] --stop-after: stopping after {step} of {args.steps} steps", flush=True)
            break
        for group in opt.param_groups:
            group["lr"] = lr_at(step, args.steps, args.lr, args.warmup)
        loss, logged, rows = losses()
        opt.zero_grad(set_to_none=True)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(params_list, 1.0)
        opt.step()
        steps_run = step + 1
        values = torch.stack([value.detach() for value in logged])
        ema = values if ema is None else 0.95 * ema + 0.05 * values
        if step % args.log_every == 0 or step == args.steps - 1:
            rate = (time.time() - t0) / (step + 1)
            print(
                f"[train] step {step} {names[0]} {ema[0]:.3f} {names[1]} {ema[1]:.3f} "
                f"lr {opt.param_groups[0]['lr']:.2e} rows {rows} {rate:.2f}s/step "
                f"elapsed {(time.time() - started) / 60:.1f}min",
                flush=True,
            )
        if args.save_every and (step + 1) % args.save_every == 0:
            extra["packedss_training"].update(steps_run=step + 1, train_minutes=round((time.time() - started) / 60, 1))
            save()
    return steps_run, ema


def train_base(args) -> None:
    from transformers import Ministral3Model

    out_dir = Path(args.out or REPO / "assets/models/tiny")
    out_dir.parent.mkdir(parents=True, exist_ok=True)
    started = time.time()
    data = corpus(args)
    tok_dir = out_dir.with_name(out_dir.name + ".tok")
    if args.init_from:  # continue training a checkpoint (its tokenizer, weights and config)
        from transformers import AutoTokenizer

        tok = AutoTokenizer.from_pretrained(args.init_from)
    else:
        tok = train_tokenizer(data, args.vocab, tok_dir)
    ids = {"eos": tok.convert_tokens_to_ids(EOS), "mask": tok.convert_tokens_to_ids(MASK), "pad": tok.convert_tokens_to_ids(PAD)}
    examples = encode_examples(tok, data, args.max_len)
    lengths = [len(x[0]) for x in examples["arith"]]
    print(
        f"[data] vocab {len(tok)} ids {ids}; examples " + ", ".join(f"{k} {len(v)}" for k, v in examples.items())
        + f"; arith tokens mean {sum(lengths) / max(1, len(lengths)):.1f} max {max(lengths, default=0)}",
        flush=True,
    )
    seed_all(args.seed)
    previous = {}
    if args.init_from:
        from packedss.models.nemotron import load_nemotron

        init = load_nemotron(args.init_from)
        backbone, head = init.backbone, init.head
        for p in list(backbone.parameters()) + list(head.parameters()):
            p.requires_grad_(True)
        previous = json.loads((Path(args.init_from) / "config.json").read_text()).get("packedss_training", {})
    else:
        config = make_config(args, len(tok), ids)
        backbone = Ministral3Model(config)
        head = torch.nn.Linear(args.hidden, len(tok), bias=False)
        torch.nn.init.normal_(head.weight, std=0.02)
    params = sum(p.numel() for p in backbone.parameters()) + head.weight.numel()
    print(f"[model] Ministral3 backbone + head: {params / 1e6:.2f}M parameters", flush=True)
    extra = {
        "mask_token_id": ids["mask"],
        "eos_token_id": ids["eos"],
        "pad_token_id": ids["pad"],
        "block_size": 32,
        "trained_block_max": 17,
        "packedss_training": {
            "script": "scripts/train_tiny.py",
            "seed": args.seed,
            "steps_planned": args.steps,
            "batch": args.batch,
            "lr": args.lr,
            "mix": dict(zip(("arith", "gsm8k", "code"), (args.mix_arith, args.mix_gsm8k, args.mix_code))),
            "arith_template": data["template"],
        },
    }
    if previous:
        extra["packedss_training"]["continued_from"] = previous
    layout_rng = random.Random(args.seed + 1)

    def losses():
        batch = [
            layout(ids_, start, layout_rng, ids["mask"], args.draft_ratio, args.mask_blocks)
            for ids_, start in sampler.draw(args.batch)
        ]
        tokens, positions, mask, ar_t, df_t, _ = collate(batch, ids["pad"])
        hidden = backbone(input_ids=tokens, position_ids=positions, attention_mask=mask, use_cache=False).last_hidden_state
        is_ar = ar_t != IGNORE
        read = is_ar | (df_t != IGNORE)  # the head runs on rows with a target only
        logits = head(hidden[read])
        target = torch.where(is_ar, ar_t, df_t)[read]
        per_row = F.cross_entropy(logits, target, reduction="none")
        ar_rows = is_ar[read]
        ar_loss = per_row[ar_rows].mean()
        df_loss = per_row[~ar_rows].mean()
        return ar_loss + args.diff_weight * df_loss, (ar_loss, df_loss), tokens.shape[1]

    sampler = make_sampler(examples, args)
    steps_run, ema = train_steps(
        args, started, backbone, head, losses, ("ar", "diff"),
        lambda: save_checkpoint(out_dir, backbone, head, tok, extra), extra,
    )  # fmt: skip
    extra["packedss_training"].update(
        steps_run=steps_run,
        train_minutes=round((time.time() - started) / 60, 1),
        final_ar_loss=round(float(ema[0]), 4) if ema is not None else None,
        final_diff_loss=round(float(ema[1]), 4) if ema is not None else None,
        parameters=params,
    )
    save_checkpoint(out_dir, backbone, head, tok, extra)
    shutil.rmtree(tok_dir, ignore_errors=True)
    print(f"[done] saved {out_dir} after {steps_run} steps in {(time.time() - started) / 60:.1f} min", flush=True)


# --------------------------------------------------------------------------- set (SetDLM) training


def set_order(length: int, rng: random.Random, ltr: float, local: float) -> list[int]:
    """A decoding order sigma of `length` answer positions (sigma[r] = the position of rank r):
    identity (share `ltr`), random within consecutive blocks of W in {8, 16} positions taken left
    to right (share `local`: the confidence order's blocks), else a uniform permutation."""
    sigma = list(range(length))
    u = rng.random()
    if u < ltr:
        return sigma
    if u < ltr + local:
        width = 8 if rng.random() < 0.7 else 16
        for start in range(0, length, width):
            part = sigma[start : start + width]
            rng.shuffle(part)
            sigma[start : start + width] = part
        return sigma
    rng.shuffle(sigma)
    return sigma


def set_layout(ids: list[int], start: int, rng: random.Random, mask_id: int, eos_id: int, args):
    """Rows of one set-objective training sequence, in `collate`'s format (tokens, positions,
    AR targets (none), mask-row targets, visible clean prefix per row, block id per row, number
    of clean rows). Columns: the prompt (P clean rows, causal), the answer's clean rows in sigma
    order (rank r at column P + r, so "sees ranks <= r" is causal), then the mask rows: each sees
    the clean columns < P + c (c = its level) and itself (a block of its own)."""
    prompt = max(start, 1)  # code chunks: the first token plays the prompt
    answer = list(ids[prompt:])
    if answer and answer[-1] == eos_id and args.set_eos_tail:
        answer += [eos_id] * rng.randint(0, args.set_eos_tail)  # the positions after EOS hold EOS
    length = len(answer)
    sigma = set_order(length, rng, args.set_ltr, args.set_local)
    rank = [0] * length
    for r, a in enumerate(sigma):
        rank[a] = r
    clean = prompt + length
    tokens = list(ids[:prompt]) + [answer[a] for a in sigma]
    positions = list(range(prompt)) + [prompt + a for a in sigma]
    sees = list(range(1, clean + 1))
    block_of = [-1] * clean
    # Draft levels: sigma cut into blocks of random width; a draft row sees the ranks before its block.
    # Half the time a first block of 0..15 ranks (a random phase), so blocks also start mid-answer.
    level = [0] * length
    first = min(rng.randint(0, 15) if rng.random() < 0.5 else 0, length)
    while first < length:
        width = sample_width(rng)
        for k in range(first, min(length, first + width)):
            level[k] = first
        first += width
    block = 0
    for a in range(length):
        for c in (rank[a], level[rank[a]]):
            tokens.append(mask_id)
            positions.append(prompt + a)
            sees.append(prompt + c)
            block_of.append(block)
            block += 1
    targets = [IGNORE] * clean + [answer[a] for a in range(length) for _ in range(2)]
    return tokens, positions, [IGNORE] * len(tokens), targets, sees, block_of, clean


def make_qwen3_config(args, vocab: int, ids: dict):
    from transformers import Qwen3Config

    config = Qwen3Config(
        vocab_size=vocab,
        hidden_size=args.hidden,
        intermediate_size=args.intermediate,
        num_hidden_layers=args.layers,
        num_attention_heads=args.heads,
        num_key_value_heads=args.kv_heads,
        head_dim=args.hidden // args.heads,
        max_position_embeddings=4096,
        rope_parameters={"rope_type": "default", "rope_theta": 10000.0},
        rms_norm_eps=1e-6,
        tie_word_embeddings=False,
        pad_token_id=ids["pad"],
        bos_token_id=ids["eos"],
        eos_token_id=ids["eos"],
        initializer_range=0.02,
    )
    config._attn_implementation = "sdpa"
    return config


SET_BASE = "none: trained from scratch by scripts/train_tiny.py --family setdlm"


def setdlm_writer(ids: dict, smax: int):
    """save_checkpoint's writer for the SetDLM layout; the training record goes into config.json
    next to the release's fields (the loader ignores it)."""
    from packedss.models.setdlm import save_setdlm

    def write(directory: Path, backbone, head, extra: dict) -> None:
        save_setdlm(directory, backbone, head, mask_token_id=ids["mask"], eos_token_id=ids["eos"], smax=smax, base=SET_BASE)
        config_path = Path(directory) / "config.json"
        config = json.loads(config_path.read_text())
        # No custom code ships here: without the release's auto_map, AutoTokenizer loads the
        # directory offline without asking whether to trust (nonexistent) remote code.
        config.pop("auto_map", None)
        config.update(extra)
        config_path.write_text(json.dumps(config, indent=2, sort_keys=True) + "\n")

    return write


def train_set(args) -> None:
    """tiny-set: the SetDLM layout trained with the set objective (module docstring)."""
    import tempfile

    from transformers import Qwen3Model

    out_dir = Path(args.out or REPO / "assets/models/tiny-set")
    out_dir.parent.mkdir(parents=True, exist_ok=True)
    started = time.time()
    data = corpus(args)
    with tempfile.TemporaryDirectory() as tok_tmp:  # the same tokenizer as tiny's (same function, corpus, seed)
        tok = train_tokenizer(data, args.vocab, Path(tok_tmp))
    ids = {"eos": tok.convert_tokens_to_ids(EOS), "mask": tok.convert_tokens_to_ids(MASK), "pad": tok.convert_tokens_to_ids(PAD)}
    examples = encode_examples(tok, data, args.max_len)
    lengths = [len(x[0]) for x in examples["arith"]]
    print(
        f"[data] vocab {len(tok)} ids {ids}; examples " + ", ".join(f"{k} {len(v)}" for k, v in examples.items())
        + f"; arith tokens mean {sum(lengths) / max(1, len(lengths)):.1f} max {max(lengths, default=0)}",
        flush=True,
    )
    seed_all(args.seed)
    config = make_qwen3_config(args, len(tok), ids)
    backbone = Qwen3Model(config)
    head = torch.nn.Linear(args.hidden, len(tok), bias=False)
    torch.nn.init.normal_(head.weight, std=0.02)
    params = sum(p.numel() for p in backbone.parameters()) + head.weight.numel()
    print(f"[model] Qwen3 backbone + LM head: {params / 1e6:.2f}M parameters", flush=True)
    extra = {
        "packedss_training": {
            "script": "scripts/train_tiny.py --family setdlm",
            "objective": "set: CE of mask rows (query + block-draft level per answer position), mask logit -inf",
            "seed": args.seed,
            "steps_planned": args.steps,
            "batch": args.batch,
            "lr": args.lr,
            "orders": {"ltr": args.set_ltr, "block_local": args.set_local, "random": round(1 - args.set_ltr - args.set_local, 4)},
            "eos_tail": args.set_eos_tail,
            "mix": dict(zip(("arith", "gsm8k", "code"), (args.mix_arith, args.mix_gsm8k, args.mix_code))),
            "arith_template": data["template"],
        }
    }
    writer = setdlm_writer(ids, args.smax)
    layout_rng = random.Random(args.seed + 1)

    def losses():
        batch = [set_layout(ids_, start, layout_rng, ids["mask"], ids["eos"], args) for ids_, start in sampler.draw(args.batch)]
        tokens, positions, mask, _, targets, _ = collate(batch, ids["pad"])
        hidden = backbone(input_ids=tokens, position_ids=positions, attention_mask=mask, use_cache=False).last_hidden_state
        read = targets != IGNORE  # mask rows only: a set model predicts from nothing else
        logits = head(hidden[read])
        logits[:, ids["mask"]] = float("-inf")  # as SetDLM._forward and SetDLMAdapter.run
        per_row = F.cross_entropy(logits, targets[read], reduction="none")
        # rows alternate query, draft per answer position (set_layout)
        kind = torch.cat([torch.arange(int(n)) % 2 for n in read.sum(dim=1)])
        return per_row.mean(), (per_row[kind == 0].mean(), per_row[kind == 1].mean()), tokens.shape[1]

    sampler = make_sampler(examples, args)
    steps_run, ema = train_steps(
        args, started, backbone, head, losses, ("query", "draft"),
        lambda: save_checkpoint(out_dir, backbone, head, tok, extra, writer), extra,
    )  # fmt: skip
    extra["packedss_training"].update(
        steps_run=steps_run,
        train_minutes=round((time.time() - started) / 60, 1),
        final_query_loss=round(float(ema[0]), 4) if ema is not None else None,
        final_draft_loss=round(float(ema[1]), 4) if ema is not None else None,
        parameters=params,
    )
    save_checkpoint(out_dir, backbone, head, tok, extra, writer)
    print(f"[done] saved {out_dir} after {steps_run} steps in {(time.time() - started) / 60:.1f} min", flush=True)


# --------------------------------------------------------------------------- LoRA training


def train_lora(args) -> None:
    from transformers import AutoTokenizer

    from packedss.models.lora import ProposalLoRA, save_peft_adapter
    from packedss.models.nemotron import load_nemotron

    base_dir = Path(args.base or REPO / "assets/models/tiny")
    out_dir = Path(args.out or REPO / "assets/models/tiny-lora")
    started = time.time()
    seed_all(args.seed)
    adapter = load_nemotron(base_dir)
    backbone, head = adapter.backbone, adapter.head
    for p in list(backbone.parameters()) + list(head.parameters()):
        p.requires_grad_(False)
    tok = AutoTokenizer.from_pretrained(str(base_dir))
    config = json.loads((base_dir / "config.json").read_text())
    template = config.get("packedss_training", {}).get("arith_template") or arith_template()[0]
    data = corpus(args)
    if data["template"] != template:
        print(f"[lora] note: base trained with template {template!r}, task now {data['template']!r}", flush=True)
    examples = encode_examples(tok, data, args.max_len)
    ids = {"eos": adapter.eos_token_ids[0], "mask": adapter.mask_token_id, "pad": tok.pad_token_id}
    lora = ProposalLoRA.create(backbone, rank=args.lora_rank, alpha=args.lora_alpha, targets=args.lora_targets, seed=args.seed)
    sampler = Sampler(examples, {"arith": args.mix_arith, "gsm8k": args.mix_gsm8k, "code": args.mix_code}, args.seed + 7)
    layout_rng = random.Random(args.seed + 8)
    opt = torch.optim.AdamW(lora.parameters(), lr=args.lora_lr, weight_decay=0.0)
    backbone.train()
    ema = None
    t0 = time.time()
    step = 0
    for step in range(args.lora_steps):
        if args.max_minutes and time.time() - started > args.max_minutes * 60:
            print(f"[lora] wall-clock cap reached after {step} steps", flush=True)
            break
        batch = [
            layout(ids_, start, layout_rng, ids["mask"], args.lora_draft_ratio, args.mask_blocks)
            for ids_, start in sampler.draw(args.batch)
        ]
        tokens, positions, mask, ar_t, df_t, draft_rows = collate(batch, ids["pad"])
        for group in opt.param_groups:
            group["lr"] = lr_at(step, args.lora_steps, args.lora_lr, 20)
        lora.select(draft_rows)
        try:
            logits = head(backbone(input_ids=tokens, position_ids=positions, attention_mask=mask, use_cache=False).last_hidden_state)
        finally:
            lora.select(None)
        # Teacher: the verifier (unadapted clean rows of the same pass) at the position each
        # mask row drafts: clean row i-1 predicts position i.
        with torch.no_grad():
            teacher_rows = (positions - 1).clamp(min=0, max=positions.shape[1] - 1)
            teacher = torch.softmax(logits.gather(1, teacher_rows[..., None].expand_as(logits)).detach(), dim=-1)
        valid = df_t != IGNORE
        student = torch.log_softmax(logits[valid], dim=-1)
        kl = F.kl_div(student, teacher[valid], reduction="batchmean")
        ce = F.cross_entropy(logits[valid], teacher[valid].argmax(dim=-1))  # the verifier's greedy token
        loss = kl + args.lora_ce * ce
        opt.zero_grad(set_to_none=True)
        loss.backward()
        opt.step()
        values = torch.stack([kl.detach(), ce.detach()])
        ema = values if ema is None else 0.95 * ema + 0.05 * values
        if step % args.log_every == 0 or step == args.lora_steps - 1:
            rate = (time.time() - t0) / (step + 1)
            print(f"[lora] step {step} kl {ema[0]:.3f} ce {ema[1]:.3f} {rate:.2f}s/step", flush=True)
    steps_run = step + 1
    save_peft_adapter(
        lora,
        out_dir,
        extra={
            "packedss_training": {
                "script": "scripts/train_tiny.py --lora",
                "base": str(base_dir.relative_to(REPO)) if base_dir.is_relative_to(REPO) else str(base_dir),
                "seed": args.seed,
                "steps_run": steps_run,
                "batch": args.batch,
                "lr": args.lora_lr,
                "objective": "KL(verifier || drafter) + %.2f * CE(verifier argmax) on draft rows" % args.lora_ce,
                "train_minutes": round((time.time() - started) / 60, 1),
            }
        },
    )
    print(f"[done] saved {out_dir} after {steps_run} steps in {(time.time() - started) / 60:.1f} min", flush=True)


def main(argv=None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--lora", action="store_true", help="train the proposal LoRA on top of --base")
    ap.add_argument(
        "--family", choices=("nemotron", "setdlm"), default="nemotron",
        help="nemotron: tiny (dual-mode, Nemotron layout); setdlm: tiny-set (SetDLM layout, set objective)",
    )
    ap.add_argument("--out", default=None, help="output directory (default assets/models/tiny, tiny-lora or tiny-set)")
    ap.add_argument("--base", default=None, help="--lora: the base checkpoint (default assets/models/tiny)")
    ap.add_argument("--init-from", default=None, help="continue training this checkpoint instead of a fresh model")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--data-dir", default=os.environ.get("PACKEDSS_DATA_DIR", str(REPO.parent / "shared" / "data")))
    ap.add_argument("--arith-n", type=int, default=40000)
    ap.add_argument("--code-bytes", type=int, default=1_500_000)
    ap.add_argument("--vocab", type=int, default=1024)
    ap.add_argument("--max-len", type=int, default=256, help="longest question+answer (longer ones are dropped)")
    ap.add_argument("--hidden", type=int, default=192)
    ap.add_argument("--intermediate", type=int, default=512)
    ap.add_argument("--layers", type=int, default=4)
    ap.add_argument("--heads", type=int, default=4)
    ap.add_argument("--kv-heads", type=int, default=2)
    ap.add_argument("--steps", type=int, default=None, help="default 3800 (nemotron), 2800 (setdlm)")
    ap.add_argument("--batch", type=int, default=16)
    ap.add_argument("--lr", type=float, default=3e-3)
    ap.add_argument("--warmup", type=int, default=60)
    ap.add_argument("--weight-decay", type=float, default=0.05)
    ap.add_argument("--diff-weight", type=float, default=1.0)
    ap.add_argument("--draft-ratio", type=float, default=0.8, help="draft rows per answer token")
    ap.add_argument("--mask-blocks", type=float, default=0.3, help="share of pure-mask (Quadratic-SS) blocks")
    ap.add_argument("--mix-arith", type=float, default=0.9)
    ap.add_argument("--mix-gsm8k", type=float, default=0.05)
    ap.add_argument("--mix-code", type=float, default=0.05)
    ap.add_argument("--max-minutes", type=float, default=43.0, help="wall-clock cap for the whole run (0: none)")
    ap.add_argument("--save-every", type=int, default=200)
    ap.add_argument("--log-every", type=int, default=25)
    ap.add_argument("--smax", type=int, default=16, help="--family setdlm: the model's max block size (W <= smax)")
    ap.add_argument("--set-ltr", type=float, default=0.6, help="--family setdlm: share of left-to-right orders")
    ap.add_argument("--set-local", type=float, default=0.2, help="--family setdlm: share of block-local permutations")
    ap.add_argument(
        "--stop-after", type=int, default=0,
        help="--family setdlm: stop after this many steps of the --steps schedule (0: run it all); "
        "reproduces a run the wall-clock cap stopped, without the clock",
    )
    ap.add_argument("--set-eos-tail", type=int, default=8, help="--family setdlm: up to this many EOS after the answer")
    ap.add_argument("--lora-steps", type=int, default=400)
    ap.add_argument("--lora-lr", type=float, default=2e-3)
    ap.add_argument("--lora-rank", type=int, default=8)
    ap.add_argument("--lora-alpha", type=float, default=16.0)
    ap.add_argument("--lora-ce", type=float, default=0.5)
    ap.add_argument("--lora-draft-ratio", type=float, default=1.5, help="--lora: draft rows per answer token")
    ap.add_argument(
        "--lora-targets", nargs="+", default=["q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj"]
    )
    args = ap.parse_args(argv)
    if args.data_dir and not Path(args.data_dir).is_dir():
        args.data_dir = None
    if args.steps is None:
        args.steps = 2800 if args.family == "setdlm" else 3800
    torch.set_num_threads(args.threads)
    torch.use_deterministic_algorithms(True, warn_only=True)
    if args.lora:
        train_lora(args)
    elif args.family == "setdlm":
        train_set(args)
    else:
        train_base(args)


if __name__ == "__main__":
    main()
