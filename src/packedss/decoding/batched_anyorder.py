"""The any-order (set) family's host steps, alone and for every request of a round at once.

A set decoder (packedss.decoding.anyorder) hands each round's host work to its driver as one
Host step, `set_round(logits, parts, sampling)`: the parts are a verification of its drafts
(`Verify`) and proposals from some rows (`Propose`), in the order they draw random numbers. Alone
(C = 1) each part is the plain function: `verify`, `propose`, and the proposals' confidence
(softmax at T, at T = 1 when greedy). In a batch (packedss.decoding.engine) the same step of every
request runs here at once, and reads back once with the round:

- the verifications of all requests are batched_ops' `verify` over their verifier rows, gathered
  into one tensor (a set verifier's rows need not be consecutive: Quadratic-SS's queries are one
  per block, and with every position drafted the last query stands twice);
- the proposals of all requests: one argmax (and, where a row decides an emitted token, its top-2
  margin) over all of their rows, or at T > 0 one softmax and one inverse-CDF sample, each
  request's uniforms drawn from its own generator, part after part, as many as alone; their
  confidences from one softmax, read back as the float's bits with the tokens.

Each request's result is what the plain function gives it alone: its tokens as host integers,
its q rows, its confidences, and what decided an emitted token (its rows alone; DecidedMargins in
a batch, as batched_ops gives them).
"""

from __future__ import annotations

import array
from collections.abc import Sequence
from typing import NamedTuple

import torch

from packedss.decoding.batched_ops import BATCHED, Finish, _Greedy, _sampled
from packedss.decoding.rows import Rows, concatenated, materialized, ranges
from packedss.decoding.verify import (
    DecidedMargins,
    Emitted,
    Sampling,
    inverse_cdf,
    probabilities,
    propose,
    verify,
)


class Verify(NamedTuple):
    """Verify m drafts with the m + 1 verifier rows `runs` (ranges of the step's logits, in rank
    order): the drafts on the device (a tensor, or Rows of a batch's call tokens) and on the host,
    and at T > 0 their q (m, V)."""

    runs: tuple[range, ...]
    drafts: torch.Tensor | Rows
    tokens: list[int]
    probs: torch.Tensor | None


class Propose(NamedTuple):
    """Propose a token from each of the rows `runs`; `confident`: also the probability the drafter
    gave each proposal; `decides`: a proposal may be an emitted token (its row's near-tie kept)."""

    runs: tuple[range, ...]
    confident: bool = False
    decides: bool = False


class Proposed(NamedTuple):
    """Proposals: tokens, their q rows (T > 0), confidences (when asked), and what decided each:
    the rows themselves alone, or their margins (Rows) and near-tie flags in a batch."""

    tokens: list[int]
    probs: torch.Tensor | None
    confidence: list[float] | None
    rows: torch.Tensor | None
    margins: Rows | None = None
    near: list[int] | None = None

    def deciding(self, k: int):
        """What decided proposal k, for Decoder.note: its row, or its margin and flag."""
        if self.margins is not None:
            return DecidedMargins(self.margins[k : k + 1], self.near[k : k + 1])
        return None if self.rows is None else self.rows[k : k + 1]


def runs_of(rows: Sequence[int]) -> tuple[range, ...]:
    """Row indices as runs of consecutive rows."""
    runs: list[range] = []
    for row in rows:
        if runs and runs[-1].stop == row:
            runs[-1] = range(runs[-1].start, row + 1)
        else:
            runs.append(range(row, row + 1))
    return tuple(runs)


def _picked(logits: torch.Tensor, runs: tuple[range, ...]) -> torch.Tensor:
    if len(runs) == 1:
        return logits[runs[0].start : runs[0].stop]
    return torch.cat([logits[run.start : run.stop] for run in runs])


def confidences(rows: torch.Tensor, tokens: torch.Tensor, temperature: float) -> torch.Tensor:
    """The probability each row gave its token: softmax at T, at T = 1 when greedy."""
    return probabilities(rows, temperature or 1.0).gather(1, tokens.view(-1, 1)).view(-1)


def set_round(logits, parts: tuple, sampling: Sampling) -> list:
    """A round's host work for one request: each part's result (an Emitted list for Verify, a
    Proposed for Propose), in order."""
    logits = materialized(logits)
    out = []
    for part in parts:
        rows = _picked(logits, part.runs)
        if type(part) is Verify:
            out.append(verify(rows, materialized(part.drafts), part.probs, sampling))
            continue
        tokens, q = propose(rows, sampling)
        confidence = confidences(rows, tokens, sampling.temperature).tolist() if part.confident else None
        out.append(Proposed(tokens.tolist(), q, confidence, rows))
    return out


def float_bits(values: torch.Tensor) -> torch.Tensor:
    """A float tensor's bits as longs, to be read back with the round's tokens."""
    if values.dtype == torch.float64:
        return values.view(torch.int64)
    return values.float().view(torch.int32).long()


def floats_of(bits: list[int], dtype: torch.dtype) -> list[float]:
    """The floats whose bits `float_bits` read back."""
    wide = dtype == torch.float64
    return array.array("d" if wide else "f", array.array("q" if wide else "i", bits).tobytes()).tolist()


class _Wave(NamedTuple):
    """Every part of every request of a wave, as rows of one source: `index` holds each part's
    rows in turn (request after request, part after part); owners[j] = (request, part index,
    its first and end place in `index`, part)."""

    source: torch.Tensor
    index: torch.Tensor
    total: int
    owners: list[tuple[int, int, int, int, tuple]]


def _wave(args: Sequence[tuple], device: torch.device) -> _Wave:
    first = args[0][0]
    if all(type(a[0]) is Rows and a[0].source is first.source for a in args):
        source, bases = first.source, [a[0].start for a in args]
    else:  # tensors (a decoder whose logits are not Rows): pooled
        source, bases, total = concatenated([a[0] for a in args], device), [], 0
        for a in args:
            bases.append(total)
            total += len(a[0])
    starts, counts, owners, total = [], [], [], 0
    for k, (_, parts, _) in enumerate(args):
        base = bases[k]
        for index, part in enumerate(parts):
            begin = total
            for run in part.runs:
                starts.append(base + run.start)
                counts.append(run.stop - run.start)
                total += run.stop - run.start
            owners.append((k, index, begin, total, part))
    return _Wave(source, ranges(starts, counts, device), total, owners)


def _greedy_rounds(args: Sequence[tuple], device: torch.device) -> tuple[torch.Tensor, Finish]:
    """Greedy: one argmax over the wave's rows (the whole round's when they are a quarter of it
    or more, as batched_ops takes it), their top-2 margins where a row decides an emitted token,
    the confidences of the parts that ask; each verification's accepted prefix on the host."""
    wave = _wave(args, device)
    source, index, total = wave.source, wave.index, wave.total
    whole = 4 * total >= source.shape[0]
    greedy = _Greedy(source if whole else source.index_select(0, index))
    tokens = greedy.tokens.index_select(0, index) if whole else greedy.tokens
    read = [tokens]
    deciding = any(type(part) is Verify or part.decides for *_, part in wave.owners)
    if deciding:
        margin, near = greedy.margins
        if whole:
            margin, near = margin.index_select(0, index), near.index_select(0, index)
        read.append(near)
    confident = [(begin, end) for _, _, begin, end, part in wave.owners if type(part) is Propose and part.confident]
    if confident:
        at = ranges([b for b, _ in confident], [e - b for b, e in confident], device)
        chosen = confidences(source.index_select(0, index.index_select(0, at)), tokens.index_select(0, at), 1.0)
        read.append(float_bits(chosen))

    def finish(values: list[int]) -> list:
        flags = values[total : 2 * total] if deciding else None
        bits = values[(2 if deciding else 1) * total :]
        out = [[None] * len(a[1]) for a in args]
        place = 0  # where the next confident part's bits start
        for k, index_, begin, end, part in wave.owners:
            if type(part) is Verify:
                out[k][index_] = _accepted(values, begin, part.tokens, margin, flags)
                continue
            confidence = None
            if part.confident:
                confidence = floats_of(bits[place : place + end - begin], chosen.dtype)
                place += end - begin
            if deciding:
                out[k][index_] = Proposed(values[begin:end], None, confidence, None, Rows(margin, begin, end), flags[begin:end])
            else:
                out[k][index_] = Proposed(values[begin:end], None, confidence, None)
        return out

    return torch.cat(read), finish


def _accepted(values: list[int], begin: int, drafts: list[int], margin: torch.Tensor, flags: list[int]) -> Emitted:
    """`verify` at T = 0 from its verifier rows' tokens (values[begin:]): the drafts accepted while
    they equal them, then one more token (correction or bonus), and the rows that decided them."""
    h = 0
    while h < len(drafts) and drafts[h] == values[begin + h]:
        h += 1
    end = begin + h + 1
    return Emitted(values[begin:end], None, DecidedMargins(Rows(margin, begin, end), flags[begin:end]))


def _sampled_rounds(args: Sequence[tuple], device: torch.device) -> tuple[torch.Tensor, Finish]:
    """At T > 0: the verifications through batched_ops' `verify` (each request's m + 1 uniforms
    its own), then the proposals: one softmax and one inverse-CDF sample over all of their rows,
    each request's uniforms from its own generator, part after part, as many as alone."""
    wave = _wave(args, device)
    rows = wave.source.index_select(0, wave.index)
    verifying = [(k, index, begin, end, part) for k, index, begin, end, part in wave.owners if type(part) is Verify]
    steps = [(Rows(rows, begin, end), part.drafts, part.probs, args[k][-1]) for k, _, begin, end, part in verifying]
    verified, finish_verified = BATCHED[verify](steps, device) if steps else (None, None)
    proposing = [(k, index, begin, end, part) for k, index, begin, end, part in wave.owners if type(part) is Propose]
    reads = [] if verified is None else [verified]
    if proposing:
        probs, uniform = _sampled([Rows(rows, begin, end) for _, _, begin, end, _ in proposing],
                                  [args[k] for k, *_ in proposing], [end - begin for _, _, begin, end, _ in proposing],
                                  device)  # fmt: skip
        tokens = inverse_cdf(probs, uniform)
        chosen = probs.gather(1, tokens[:, None])[:, 0]
        reads += [tokens, float_bits(chosen)]
    before = 0 if verified is None else verified.shape[0]

    def finish(values: list[int]) -> list:
        out = [[None] * len(a[1]) for a in args]
        for (k, index, *_), emitted in zip(verifying, finish_verified(values[:before]) if steps else []):
            out[k][index] = emitted
        values, place = values[before:], 0
        count = len(values) // 2
        for k, index, begin, end, part in proposing:
            size = end - begin
            confidence = floats_of(values[count + place : count + place + size], chosen.dtype) if part.confident else None
            out[k][index] = Proposed(values[place : place + size], probs[place : place + size], confidence, None)
            place += size
        return out

    return torch.cat(reads), finish


def _set_rounds(args: Sequence[tuple], device: torch.device) -> tuple[torch.Tensor, Finish]:
    """`set_round` for every request of a wave at once, one read-back."""
    return (_greedy_rounds if args[0][-1].greedy else _sampled_rounds)(args, device)


BATCHED[set_round] = _set_rounds  # the engine finds a Host step's batched form by its function
