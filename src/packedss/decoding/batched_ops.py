"""The host steps of every request of a round at once: a request's Host step
(packedss.decoding.driver.Host) of `first_token`, `propose`, `verify`, `proposals_ahead`,
`verify_ahead` or `verify_lookup` runs here together with the same step of every other request, as tensor operations over all of their
rows, not one request after another. Each batched form gives exactly what the function gives
one request, as Rows of the batch's results: at T = 0 argmax and top-2 are row by row; at T > 0
each request draws its uniforms from its own generator, as many and in the order the function
draws them alone (packedss.decoding.verify.uniforms), and the softmax, the samples (inverse CDF)
and the acceptance tests of every request run as one operation each.

A batched step is `launch(args of each request, device) -> (read, finish)`: `read` is a long tensor
to read back (None: nothing), and `finish(values)` turns the values read into each request's
result. The engine reads back every step of a wave in one transfer, so a round synchronizes once.
Requests whose steps sample at different temperatures or by different rules are different groups
(the engine's `host_wave`). The any-order family's `set_round` (packedss.decoding.batched_anyorder)
and the SDAR steps (packedss.decoding.block_steps) add their batched forms to BATCHED.
"""

from __future__ import annotations

import functools
from collections.abc import Callable, Sequence
from typing import NamedTuple

import numpy as np
import torch

from packedss.decoding.driver import Proposals, proposals_ahead, verify_ahead
from packedss.decoding.pld import point_mass, verify_lookup
from packedss.decoding.rows import Rows, concatenated, ranges, uploaded
from packedss.decoding.verify import (
    DecidedMargins,
    Emitted,
    first_token,
    inverse_cdf,
    near_tie_threshold,
    probabilities,
    propose,
    uniforms,
    verify,
)

Finish = Callable[[list[int]], list]


def _offsets(counts: Sequence[int]) -> list[int]:
    out, total = [], 0
    for count in counts:
        out.append(total)
        total += count
    return out


class _Greedy:
    """Exactly `argmax` (the first largest entry) of every row of `logits` and, on demand, its
    `topk(2).values`. On a CPU in float32, by NumPy: its argmax reads a row once, at several times
    the speed of torch's argmax on a CPU and in one operation, where a batched round's readout is
    otherwise a dozen small operations, each a fixed cost of dispatch (docs/performance.md §12.15).
    A row's second largest is then its largest with its first largest set aside. Elsewhere (a
    GPU, other dtypes, rows that are not one contiguous block) torch's own argmax and topk, a
    kernel each."""

    def __init__(self, logits: torch.Tensor):
        self.logits = logits
        # Contiguous: no two rows share memory, so the top-2's in-place -inf of a row touches no other.
        on_host = logits.device.type == "cpu" and logits.dtype == torch.float32 and logits.is_contiguous()
        self.array = logits.numpy() if on_host else None
        if self.array is None:
            self.tokens = logits.argmax(dim=-1)
        else:
            self.first = self.array.argmax(axis=1)
            self.tokens = torch.from_numpy(self.first)

    @functools.cached_property
    def _top_two(self) -> tuple:
        """Every row's largest and second largest entry: NumPy arrays on the host, else tensors."""
        if self.array is None:
            top2 = self.logits.topk(2, dim=-1).values
            return top2[:, 0], top2[:, 1]
        return _top_two(self.array, self.first)

    @property
    def top_two(self) -> tuple[torch.Tensor, torch.Tensor]:
        """Every row's largest and second largest entry, as tensors."""
        return tuple(torch.from_numpy(x) if self.array is not None else x for x in self._top_two)

    @functools.cached_property
    def margins(self) -> tuple[torch.Tensor, torch.Tensor]:
        """Every row's top-2 margin and near-tie flag (`_margins`, by NumPy on the host), taken once per pass."""
        return _margins(*self._top_two, self.logits.dtype)

    def margins_of(self, rows: list[int]) -> tuple[torch.Tensor, torch.Tensor]:
        """The `margins` of the rows numbered `rows` alone (by torch, on any device)."""
        top2 = self.logits.index_select(0, uploaded(rows, self.logits.device)).topk(2, dim=-1).values
        return _margins(top2[:, 0], top2[:, 1], self.logits.dtype)


def _top_two(array: np.ndarray, first: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Each row's largest entry (at `first`, its argmax) and second largest: the row's largest once
    the entry at `first` is -inf. That entry is set in `array` itself, for one read of the rows
    (a copy would be a second), and put back before this returns."""
    rows = np.arange(array.shape[0])
    top = array[rows, first]
    array[rows, first] = -np.inf
    try:
        second = array.max(axis=1, initial=-np.inf)
    finally:
        array[rows, first] = top
    return top, second


def _margins(top, second, dtype: torch.dtype) -> tuple[torch.Tensor, torch.Tensor]:
    """Each row's top-2 margin (float32) from its largest entry `top` and second largest `second`
    (tensors, or float32 NumPy arrays), and 1 where it is a near-tie (long, to be read back with
    the round's results): NearTies.read's rule, taken here once for every request's rows (`dtype`
    is the logits')."""
    if isinstance(top, np.ndarray):
        with np.errstate(invalid="ignore"):  # a row of -inf only: a NaN margin, as torch gives it, never a near-tie
            margin = top - second
        return torch.from_numpy(margin), torch.from_numpy((margin <= near_tie_threshold(top, dtype)).astype(np.int64))
    top = top.float()
    margin = top - second.float()
    return margin, (margin <= near_tie_threshold(top, dtype)).long()


# [logits, its _Greedy or None] of the round whose steps ask for its rows: its _Greedy when the
# first step took its rows whole, None when it took them row by row.
_last: list = [None, None]
# Whether a wave of the round in progress has read back (the engine's `read_back`): a step whose
# read-back is only a saving (greedy proposals, `_proposals`) reads in a round's first wave only,
# so that a round still reads back once.
_read: list[bool] = [False]


def end_round() -> None:
    """Forget the round's logits before the next batched call (a round's logits can be most of a
    device's free memory: 1152 rows of a 131k vocabulary are 0.6 GB in float32)."""
    _last[:] = [None, None]
    _read[0] = False


def read_back() -> None:
    """A wave of the round read back."""
    _read[0] = True


def _round_greedy(rows: Sequence) -> _Greedy | None:
    """The argmax of the whole round when `rows` are rows of one round's logits and the first step
    to ask for that round's rows asked for a quarter of them or more: taken once, its later steps
    (e.g. Packed-SS's next draft) reuse it. None otherwise: each step then takes only the rows it
    asks for (Quadratic-SS reads a tenth of its rows), and no round's rows are taken twice."""
    first = rows[0]
    source = first.source if type(first) is Rows else None
    if source is None or not all(type(r) is Rows and r.source is source for r in rows):
        return None
    if _last[0] is not source:
        whole = 4 * sum(r.stop - r.start for r in rows) >= source.shape[0]
        _last[:] = [source, _Greedy(source) if whole else None]
    return _last[1]


class _Decided(NamedTuple):
    """The argmax, top-2 margin and near-tie flag of a step's rows, and where each request's rows
    start among them: the whole round's, with no gather, when the round's argmax was taken whole
    (`_round_greedy`), else those of the requests' rows concatenated."""

    tokens: torch.Tensor
    margin: torch.Tensor
    near: torch.Tensor
    starts: list[int]


def _decided(rows: Sequence, device: torch.device) -> _Decided:
    """The _Decided of `rows` (Rows or tensors of logits, docs/records.md for the margins)."""
    greedy = _round_greedy(rows)
    if greedy is not None:
        starts = [r.start for r in rows]
    else:
        greedy = _Greedy(concatenated(rows, device))
        starts = _offsets([len(r) for r in rows])
    return _Decided(greedy.tokens, *greedy.margins, starts)


def _argmaxes(rows: Sequence, device: torch.device) -> tuple[torch.Tensor, list[int]]:
    """A tensor holding the argmax of every row of `rows` and where each one's run starts in it:
    the round's own argmax, without a gather, when it was taken whole."""
    greedy = _round_greedy(rows)
    if greedy is not None:
        return greedy.tokens, [r.start for r in rows]
    return _Greedy(concatenated(rows, device)).tokens, _offsets([len(r) for r in rows])


def _sampled(rows: Sequence, args: Sequence[tuple], counts: Sequence[int], device: torch.device):
    """The probabilities of every row of `rows` at the steps' temperature and a sample of each, each
    request's `counts[k]` uniforms drawn from its own generator (args[k]'s Sampling, last)."""
    sampling = args[0][-1]
    probs = probabilities(concatenated(rows, device), sampling.temperature)
    drawn = [uniforms(count, a[-1].generator, device) for a, count in zip(args, counts)]
    return probs, torch.cat(drawn) if drawn else probs.new_zeros(0)


def _first_tokens(args: Sequence[tuple], device: torch.device) -> tuple[torch.Tensor, Finish]:
    if not args[0][-1].greedy:
        probs, uniform = _sampled([a[0] for a in args], args, [1] * len(args), device)
        drawn = inverse_cdf(probs, uniform)
        return drawn, lambda values: [Emitted([values[k]], Rows(drawn, k, k + 1, [values[k]])) for k in range(len(args))]
    decided = _decided([a[0] for a in args], device)
    flags = decided.tokens.shape[0]  # where the near-tie flags start among the values read

    def finish(values: list[int]) -> list:
        out = []
        for start in decided.starts:
            token = values[start : start + 1]
            deciding = DecidedMargins(Rows(decided.margin, start, start + 1), values[flags + start : flags + start + 1])
            out.append(Emitted(token, Rows(decided.tokens, start, start + 1, token), deciding))
        return out

    return torch.cat([decided.tokens, decided.near]), finish


def _drafted(args: Sequence[tuple], device: torch.device) -> tuple[torch.Tensor, torch.Tensor | None, list[int]]:
    """Each request's proposals from its draft rows (args[k][0]): the tokens of all of them, their
    probabilities (None when greedy) and where each request's run starts."""
    rows = [a[0] for a in args]
    if args[0][-1].greedy:
        tokens, starts = _argmaxes(rows, device)
        return tokens, None, starts
    counts = [len(r) for r in rows]
    probs, uniform = _sampled(rows, args, counts, device)
    return inverse_cdf(probs, uniform), probs, _offsets(counts)


def _proposals(args: Sequence[tuple], device: torch.device) -> tuple[torch.Tensor | None, Finish]:
    """`propose` of every request. Greedy, in a round's first wave (Linear-SS's), the proposals
    are read back (their Rows get values), so that the next call is built on the host
    (packedss.decoding.calls.Listed); after a wave that read (Quadratic-SS's verification), they
    stay on the device."""
    counts = [len(a[0]) for a in args]
    tokens, probs, starts = _drafted(args, device)
    if probs is None and not _read[0]:
        return tokens, lambda values: [(Rows(tokens, s, s + c, values[s : s + c]), None) for s, c in zip(starts, counts)]
    return None, lambda values: [(Rows(tokens, s, s + c), None if probs is None else Rows(probs, s, s + c))
                                 for s, c in zip(starts, counts)]  # fmt: skip


def _prefixes(accept: torch.Tensor, counts: Sequence[int], device: torch.device) -> torch.Tensor:
    """Each request's accepted prefix: how many of its counts[k] tests (its run of `accept`) pass
    before the first that fails, for every request from one cumulative product."""
    requests, widest = len(counts), max(counts)
    if not widest:
        return torch.zeros(requests, dtype=torch.long, device=device)
    grid = torch.zeros(requests * widest, dtype=torch.bool, device=device)
    grid[ranges([k * widest for k in range(requests)], counts, device)] = accept
    return grid.view(requests, widest).to(torch.long).cumprod(dim=1).sum(dim=1)


def _verifications(args: Sequence[tuple], device: torch.device) -> tuple[torch.Tensor, Finish]:
    """`verify` of each request's m drafts with its m + 1 verifier rows. Greedy: the verifier rows'
    tokens and near-tie flags are read back (`_greedy_verifications`), and each request's accepted
    prefix h is found on the host."""
    sampling = args[0][-1]
    if not sampling.greedy:
        return (_matched if sampling.rule == "match" else _rejected)(args, device)
    _, read, finish = _greedy_verifications(args, device)
    return read, finish


def _draft_values(drafts: Sequence, device: torch.device) -> tuple[torch.Tensor | None, Callable[[list[int], int], list[list[int]]]]:
    """Each request's drafts as host integers: their own `values` when a read-back gave them
    (Rows.values), else read back with the round, their rows concatenated (a view, no gather,
    when they are one run of one source's rows). Returns the tensor to read (None: nothing) and `lists(values, at)`,
    each request's drafts from the values read, the tensor's first at index `at`."""
    if all(type(d) is Rows and d.values is not None for d in drafts):
        return None, lambda values, at: [d.values for d in drafts]
    starts = _offsets([len(d) for d in drafts])
    return concatenated(drafts, device), lambda values, at: [values[at + s : at + s + len(d)] for s, d in zip(starts, drafts)]


def _greedy_verifications(args: Sequence[tuple], device: torch.device) -> tuple[_Decided, torch.Tensor, Finish]:
    """`verify` of every request's drafts (args[k][1]) by its verifier rows (args[k][0]) at T = 0.
    Read back: the verifier rows' tokens and near-tie flags (`_decided`: the whole round's when it
    was taken whole), then the drafts where they have no values yet (`_draft_values`). A request
    accepts its drafts while they equal its verifier rows' tokens, and emits those and one more."""
    decided = _decided([a[0] for a in args], device)
    drafts = [a[1] for a in args]
    draft_read, draft_lists = _draft_values(drafts, device)
    flags = decided.tokens.shape[0]  # where the near-tie flags start among the values read
    read = [decided.tokens, decided.near] if draft_read is None else [decided.tokens, decided.near, draft_read]

    def finish(values: list[int]) -> list:
        out = []
        for start, proposed in zip(decided.starts, draft_lists(values, 2 * flags)):
            end = start
            for token in proposed:
                if values[end] != token:
                    break
                end += 1
            end += 1  # the h accepted drafts and one more token
            emitted = values[start:end]
            deciding = DecidedMargins(Rows(decided.margin, start, end), values[flags + start : flags + end])
            out.append(Emitted(emitted, Rows(decided.tokens, end - 1, end, emitted[-1:]), deciding))
        return out

    return decided, torch.cat(read), finish


def _matched(args: Sequence[tuple], device: torch.device) -> tuple[torch.Tensor, Finish]:
    """`verify` by `match` for every request: a sample of each verifier row, each request's m + 1
    uniforms its own; the drafts accepted while they equal the samples. Read back: every h, then
    every sample."""
    drafts = [a[1] for a in args]
    counts = [len(d) for d in drafts]
    starts = _offsets([c + 1 for c in counts])
    probs, uniform = _sampled([a[0] for a in args], args, [c + 1 for c in counts], device)
    drawn = inverse_cdf(probs, uniform)
    accepted = _prefixes(drawn.index_select(0, ranges(starts, counts, device)) == concatenated(drafts, device), counts, device)
    requests = len(args)

    def finish(values: list[int]) -> list:
        out = []
        for k, start in enumerate(starts):
            end = start + values[k] + 1
            out.append(Emitted(values[requests + start : requests + end], Rows(drawn, end - 1, end)))
        return out

    return torch.cat([accepted, drawn]), finish


def _rejected(args: Sequence[tuple], device: torch.device) -> tuple[torch.Tensor, Finish]:
    """`verify` by `rejection` for every request: draft i accepted when u_i q_i(d_i) < p_i(d_i),
    then the correction from norm(max(0, p_h - q_h)) or the bonus from p_m, every request's tests
    and draws at once, each request's m + 1 uniforms its own (its m tests', then its draw's). Read
    back: every h, every draft, every last token."""
    drafts, draft_probs = [a[1] for a in args], [a[2] for a in args]
    counts = [len(d) for d in drafts]
    requests, verifying = len(args), sum(counts)
    starts = _offsets([c + 1 for c in counts])
    p, uniform = _sampled([a[0] for a in args], args, [c + 1 for c in counts], device)
    tested = ranges(starts, counts, device)
    tokens = concatenated(drafts, device)
    q = concatenated(draft_probs, device) if verifying else p.new_zeros((0, p.shape[1]))
    vocabulary = p.shape[1]
    p_draft = p.view(-1).index_select(0, tested * vocabulary + tokens)  # one entry of each tested row
    q_draft = q.gather(1, tokens[:, None])[:, 0]
    h = _prefixes(uniform.index_select(0, tested) * q_draft < p_draft, counts, device)
    # Row h of each request's [q; 0]: its residual on a rejection, p_m itself for the bonus.
    firsts = _offsets(counts)  # where each request's drafts start among all of them
    host = uploaded([*starts, *firsts, *counts], device).view(3, -1)
    p_h = p.index_select(0, host[0] + h)
    # Row h of each request's [q; 0], without copying q: a bonus (h = its count) reads a row of q
    # and multiplies it by 0 (q is finite and >= 0, so the product is +0, as the zero row would be).
    rejected = h < host[2]
    q_h = q.index_select(0, torch.where(rejected, host[1] + h, 0)) if verifying else p.new_zeros(p_h.shape)
    residual = (p_h - q_h * rejected[:, None]).clamp_(min=0)
    mass = residual.sum(dim=-1, keepdim=True)
    residual = torch.where(mass > 0, residual / mass.clamp(min=torch.finfo(p.dtype).tiny), p_h)
    last = inverse_cdf(residual, uniform.index_select(0, host[0] + host[2]))

    def finish(values: list[int]) -> list:
        out = []
        for k, (first, count) in enumerate(zip(firsts, counts)):
            accepted = values[k]
            kept = values[requests + first : requests + first + accepted]
            out.append(Emitted(kept + [values[requests + verifying + k]], Rows(last, k, k + 1)))
        return out

    return torch.cat([h, tokens, last]), finish


def _resolved_first(positions, resolved) -> int | None:
    """How many of `positions` `resolved` holds, when both are runs of consecutive positions that
    start together (left to right: the emitted tokens took the draft's first positions); None
    when they are not."""
    if type(positions) is range and type(resolved) is range and positions.step == resolved.step == 1:
        if positions.start == resolved.start:
            return min(len(resolved), len(positions))
    return None


def _proposals_ahead(args: Sequence[tuple], device: torch.device) -> tuple[None, Finish]:
    counts = [len(a[0]) for a in args]
    tokens, probs, starts = _drafted(args, device)

    def kept(source: torch.Tensor | None, start: int, count: int, keep: list[int]):
        """Rows start + keep of `source`: Rows when they are a suffix (always so left to right)."""
        if source is None:
            return None
        first = keep[0] if keep else count
        if keep == list(range(first, count)):
            return Rows(source, start + first, start + count)
        return source[start : start + count][torch.tensor(keep, dtype=torch.long, device=device)]

    def finish(values: list[int]) -> list:
        out = []
        for (rows, positions, resolved, _), start, count in zip(args, starts, counts):
            first = _resolved_first(positions, resolved)
            if first is not None:
                probs_kept = None if probs is None else Rows(probs, start + first, start + count)
                out.append(Proposals(list(positions[first:]), Rows(tokens, start + first, start + count), probs_kept))
                continue
            keep = [k for k, position in enumerate(positions) if position not in resolved]
            out.append(Proposals([positions[k] for k in keep], kept(tokens, start, count, keep), kept(probs, start, count, keep)))
        return out

    return None, finish


def _verified_ahead(args: Sequence[tuple], device: torch.device) -> tuple[torch.Tensor, Finish]:
    """`verify_ahead` of every request: its verification, then its draft rows' proposals, each a
    batched step of its own (so a request's uniforms are drawn in the plain function's order).
    Greedy, the round's argmax is taken whole or not by the rows of both steps (a request's
    verifier rows alone are a fifth of its call), so it is taken once; when whole, the
    verification reads it back whole, so the proposals come with their values (Rows.values) and
    the next call is built on the host."""
    greedy = args[0][-1].greedy
    verifications = [(a[0], a[1], a[2], a[-1]) for a in args]
    if greedy:
        _round_greedy([a[0] for a in args] + [a[3] for a in args])
        decided, read, verified = _greedy_verifications(verifications, device)
    else:
        read, verified = _verifications(verifications, device)
    widths = [len(a[3]) for a in args]
    tokens, probs, starts = _drafted([(a[3], a[-1]) for a in args], device)
    known = greedy and tokens is decided.tokens  # the proposals are among the values read (first)

    def finish(values: list[int]) -> list:
        out = []
        for emitted, a, start, width in zip(verified(values), args, starts, widths):
            first, taken = a[4], min(len(emitted), width)  # the emitted tokens took the draft's first positions
            begin, end = start + taken, start + width
            proposals = Proposals(list(range(first + taken, first + width)), Rows(tokens, begin, end, values[begin:end] if known else None),
                                  None if probs is None else Rows(probs, begin, end))  # fmt: skip
            out.append((emitted, proposals))
        return out

    return read, finish


def _lookup_verifications(args: Sequence[tuple], device: torch.device) -> tuple[torch.Tensor, Finish]:
    """`verify_lookup` of every request's deterministic draft: by `rejection`, `verify` against
    the point mass of every request's drafts (one scatter for all of them, in the dtype the
    function gives its q); greedy and `match`, which read no q, plain `verify`."""
    sampling = args[0][-1]
    if sampling.greedy or sampling.rule != "rejection":
        return _verifications([(a[0], a[1], None, a[-1]) for a in args], device)
    rows, drafts = args[0][0], [a[1] for a in args]
    vocabulary = (rows.source if type(rows) is Rows else rows).shape[-1]
    q = point_mass(concatenated(drafts, device), vocabulary, rows.dtype)
    counts = [len(d) for d in drafts]
    return _rejected([(a[0], d, Rows(q, start, start + count), a[-1])
                      for a, d, start, count in zip(args, drafts, _offsets(counts), counts)], device)  # fmt: skip


# The batched form of each Host step function that has one. Every one of them takes its Sampling
# last; the engine runs together the steps of one function at one temperature and rule.
BATCHED = {first_token: _first_tokens, propose: _proposals, verify: _verifications, proposals_ahead: _proposals_ahead,
           verify_ahead: _verified_ahead, verify_lookup: _lookup_verifications}  # fmt: skip
