"""The host steps of every request of a round at once (greedy decoding): a request's Host step
(packedss.decoding.driver.Host) of `first_token`, `propose`, `verify` or `proposals_ahead` at T = 0
runs here together with the same step of every other request, as tensor operations over all of
their rows, not one request after another. Each batched form gives exactly what the function gives
one request (argmax and top-2 are row by row), as Rows of the batch's results.

A batched step is `launch(args of each request, device) -> (read, finish)`: `read` is a long tensor
to read back (None: nothing), and `finish(values)` turns the values read into each request's
result. The engine reads back every step of a wave in one transfer, so a round synchronizes once.

At T > 0 each request draws from its own generator, in its own order, so those steps run one
request at a time (the engine calls the function itself) and every request's random stream stays
the one it has alone.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence

import torch

from packedss.decoding.driver import Proposals, proposals_ahead
from packedss.decoding.rows import Rows, concatenated, ranges
from packedss.decoding.verify import DecidedMargins, Emitted, first_token, near_tie_threshold, propose, verify

Finish = Callable[[list[int]], list]


def _offsets(counts: Sequence[int]) -> list[int]:
    out, total = [], 0
    for count in counts:
        out.append(total)
        total += count
    return out


BLOCK = 64  # vocabulary entries per block of the two-pass argmax


class _Greedy:
    """Exactly `argmax` (the first largest entry) of every row of `logits` and, on demand, its
    `topk(2).values`, in two passes, since on a CPU a row's `amax` costs a tenth of its `argmax` or
    `topk`: the largest entry of each block of BLOCK entries, then the first block holding the
    row's largest, then the first largest entry in that block (`max` over a dimension gives the
    first largest, as `argmax` does, at half its cost on these short rows). The second largest of
    a row is the larger of its best block's second largest and the other blocks' largest."""

    def __init__(self, logits: torch.Tensor):
        self.logits, self._top2 = logits, None
        count, vocabulary = logits.shape
        self.blocked = vocabulary % BLOCK == 0 and vocabulary >= 2 * BLOCK
        if not self.blocked:
            self.tokens = logits.argmax(dim=-1)
            return
        blocks = vocabulary // BLOCK
        self.block_max = logits.view(count, blocks, BLOCK).amax(dim=-1)
        self.top, self.best = self.block_max.max(dim=-1)
        # Each row's best block (as rows of a view of BLOCK entries: a gather of whole rows).
        firsts = torch.arange(0, count * blocks, blocks, device=logits.device)
        self.inner = logits.view(count * blocks, BLOCK).index_select(0, firsts + self.best)
        self.first = self.inner.max(dim=-1, keepdim=True).indices
        self.tokens = self.best * BLOCK + self.first[:, 0]

    @property
    def top2(self) -> torch.Tensor:
        if self._top2 is None:
            if not self.blocked:
                self._top2 = self.logits.topk(2, dim=-1).values
            else:
                minimum = float("-inf")
                second = torch.maximum(self.inner.scatter(1, self.first, minimum).amax(dim=-1),
                                       self.block_max.scatter(1, self.best[:, None], minimum).amax(dim=-1))  # fmt: skip
                self._top2 = torch.stack([self.top, second], dim=1)
        return self._top2


def _margins(top2: torch.Tensor, dtype: torch.dtype) -> tuple[torch.Tensor, torch.Tensor]:
    """Each row's top-2 margin (float32) and 1 where it is a near-tie (long, to be read back with
    the round's results): NearTies.read's rule, taken here once for every request's rows (`dtype`
    is the logits')."""
    top2 = top2.float()
    margin = top2[:, 0] - top2[:, 1]
    return margin, (margin <= near_tie_threshold(top2[:, 0], dtype)).long()


# [logits, its _Greedy or None] of the round whose steps ask for its rows: its _Greedy when the
# first step took its rows whole, None when it took them row by row.
_last: list = [None, None]


def end_round() -> None:
    """Forget the round's logits before the next batched call (a round's logits can be most of a
    device's free memory: 1152 rows of a 131k vocabulary are 0.6 GB in float32)."""
    _last[:] = [None, None]


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


def _greedy(rows: Sequence, device: torch.device) -> tuple[torch.Tensor, tuple]:
    """The argmax of every row of `rows` (Rows or tensors of logits), and their near-tie margins
    and flags (`_margins`, docs/records.md)."""
    greedy = _round_greedy(rows)
    if greedy is None:
        greedy = _Greedy(concatenated(rows, device))
        return greedy.tokens, _margins(greedy.top2, greedy.logits.dtype)
    index = ranges([r.start for r in rows], [r.stop - r.start for r in rows], device)
    return greedy.tokens.index_select(0, index), _margins(greedy.top2.index_select(0, index), greedy.logits.dtype)


def _argmaxes(rows: Sequence, device: torch.device) -> tuple[torch.Tensor, list[int]]:
    """A tensor holding the argmax of every row of `rows` and where each one's run starts in it:
    the round's own argmax, without a gather, when it was taken whole."""
    greedy = _round_greedy(rows)
    if greedy is not None:
        return greedy.tokens, [r.start for r in rows]
    return _Greedy(concatenated(rows, device)).tokens, _offsets([len(r) for r in rows])


def _first_tokens(args: Sequence[tuple], device: torch.device) -> tuple[torch.Tensor, Finish]:
    tokens, (margin, near) = _greedy([a[0] for a in args], device)
    requests = len(args)

    def finish(values: list[int]) -> list:
        return [Emitted([values[k]], Rows(tokens, k, k + 1), DecidedMargins(Rows(margin, k, k + 1), values[requests + k : requests + k + 1]))
                for k in range(requests)]  # fmt: skip

    return torch.cat([tokens, near]), finish


def _proposals(args: Sequence[tuple], device: torch.device) -> tuple[None, Finish]:
    counts = [len(a[0]) for a in args]
    tokens, starts = _argmaxes([a[0] for a in args], device)
    return None, lambda values: [(Rows(tokens, s, s + c), None) for s, c in zip(starts, counts)]


def _verifications(args: Sequence[tuple], device: torch.device) -> tuple[torch.Tensor, Finish]:
    """Greedy `verify` of each request's m drafts with its m + 1 verifier rows: the accepted prefix h
    of every request from one comparison over all of their drafts. Read back: every h, then every
    verifier row's token, then its near-tie flag."""
    drafts = [a[1] for a in args]
    counts = [len(d) for d in drafts]
    requests, widest = len(args), max(counts)
    verified, (margin, near) = _greedy([a[0] for a in args], device)
    starts = _offsets([c + 1 for c in counts])
    if widest:
        agree = verified.index_select(0, ranges(starts, counts, device)) == concatenated(drafts, device)
        grid = torch.zeros(requests * widest, dtype=torch.bool, device=device)
        grid[ranges([k * widest for k in range(requests)], counts, device)] = agree
        accepted = grid.view(requests, widest).to(torch.long).cumprod(dim=1).sum(dim=1)
    else:
        accepted = torch.zeros(requests, dtype=torch.long, device=device)
    flags = requests + verified.shape[0]  # where the flags start among the values read

    def finish(values: list[int]) -> list:
        out = []
        for k, start in enumerate(starts):
            end = start + values[k] + 1  # the h accepted drafts and one more token
            deciding = DecidedMargins(Rows(margin, start, end), values[flags + start : flags + end])
            out.append(Emitted(values[requests + start : requests + end], Rows(verified, end - 1, end), deciding))
        return out

    return torch.cat([accepted, verified, near]), finish


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
    tokens, starts = _argmaxes([a[0] for a in args], device)

    def finish(values: list[int]) -> list:
        out = []
        for (rows, positions, resolved, _), start, count in zip(args, starts, counts):
            first = _resolved_first(positions, resolved)
            if first is not None:
                out.append(Proposals(list(positions[first:]), Rows(tokens, start + first, start + count), None))
                continue
            keep = [k for k, position in enumerate(positions) if position not in resolved]
            first = keep[0] if keep else count
            if keep == list(range(first, count)):  # a suffix (always so left to right)
                kept = Rows(tokens, start + first, start + count)
            else:
                kept = tokens[start:start + count][torch.tensor(keep, dtype=torch.long, device=device)]
            out.append(Proposals([positions[k] for k in keep], kept, None))
        return out

    return None, finish


BATCHED = {first_token: _first_tokens, propose: _proposals, verify: _verifications, proposals_ahead: _proposals_ahead}


def batched_form(fn, args: tuple):
    """The batched form of the Host step `fn(*args)`, or None where it runs alone (T > 0, or a
    function without one). Every function of BATCHED takes its Sampling last."""
    launch = BATCHED.get(fn)
    return launch if launch is not None and args[-1].greedy else None
