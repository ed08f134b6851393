"""Greedy AR, Linear-SS and Packed-SS in a batch, each request stepped once per round on flat state.

In a batch (packedss.decoding.engine) a request's decoder is its coroutine, the one it is alone:
every round it resumes for each call's logits and for each Host step's result, and its results
come as Rows, Emitted and Proposals, one object per request and step. At T = 0 these three
schedules need none of that: every token a round decides is the argmax of a row, so one argmax of
the round's rows, read back once, gives every request all it needs. A `Lane` is such a request:
its decoder's state (position, emitter, meter, near-ties, counts) plus the kind of its next call,
its last token and its drafts as host integers. After each batched call the engine takes the
round's `Readout` and steps every lane on it (`Lane.step`), which builds the lane's next call on
the host (a Listed call, copied with the round's others).

The SDAR family's AR, Linear-SS and Packed-SS (packedss.decoding.queried) are lanes too: the same
steps, on calls that add query rows, so that a call's verifier rows start after its clean rows
(`Lane.verifier_row`) and its prefill is the queried one.

A lane's decode is its coroutine's, step for step: the same calls, commits, emitted tokens,
near-ties and per-iteration counts, so its record is the same (tests/decoding/test_lockstep.py
holds them equal field by field, and the batch equal to C = 1). The coroutines remain the
reference, and run every other schedule and temperature.
"""

from __future__ import annotations

import enum

import torch

from packedss.decoding.batched_anyorder import confidences, float_bits, floats_of
from packedss.decoding.batched_ops import _Greedy
from packedss.decoding.calls import Call, Listed
from packedss.decoding.driver import Decoder, finished
from packedss.decoding.queried import (
    _packed_shape,
    _QueriedAR,
    _QueriedLinear,
    _QueriedPacked,
    _verify_shape,
    queried_prefill,
)
from packedss.decoding.rows import Rows, ranges
from packedss.decoding.schedules import _AR, _Linear, _Packed, _causal_shape, _draft_shape, _packed_of, _prefill_listed
from packedss.decoding.trace import Decoded
from packedss.decoding.verify import DecidedMargins


class Kind(enum.Enum):
    """What a lane's next call is (SDAR's calls add a query row after the clean rows for each row
    that verifies: packedss.decoding.queried)."""

    PREFILL = "prefill"
    AR = "ar"  # the last token (SDAR: and its query)
    DRAFT = "draft"  # Linear-SS's draft call: [last, W masks]
    VERIFY = "verify"  # Linear-SS's verify call: [last, its W drafts], causal (SDAR: and W + 1 queries)
    PACKED = "packed"  # Packed-SS's call: verify rows (SDAR: and their queries), padding, draft block


_AFTER_PREFILL = {_AR: Kind.AR, _Linear: Kind.DRAFT, _Packed: Kind.PACKED,
                  _QueriedAR: Kind.AR, _QueriedLinear: Kind.DRAFT, _QueriedPacked: Kind.PACKED}  # fmt: skip
_QUERIED = (_QueriedAR, _QueriedLinear, _QueriedPacked)


def steps_in_lockstep(decoder: Decoder) -> bool:
    """Whether `decoder`'s decode runs as a Lane: AR, Linear-SS or Packed-SS (the Nemotron family's
    or SDAR's), greedy."""
    return type(decoder) in _AFTER_PREFILL and decoder.settings.sampling.greedy


class Readout:
    """A round's logits read once: the argmax of every row and, for the rows that decide emitted
    tokens whose near-ties are kept, their near-tie flags and top-2 margins (the coroutines'
    batched steps' own, packedss.decoding.batched_ops); for the rows whose confidence a set lane
    orders its block by (packedss.decoding.set_lockstep), the probability each gave its token, as
    the float's bits. `read` is what the round reads back; the engine reads it into `values`: the
    tokens, then from index `flags` the flags, lane k's from `flags + offsets[k]` on, then from index
    `confidence` the confidences' bits, lane k's from `confidence + confident_offsets[k]` on. `margin`
    stays on the device (a near-tie's is kept as Rows of it)."""

    __slots__ = ("read", "values", "flags", "offsets", "margin", "confidence", "confident_offsets", "confidence_dtype")

    def __init__(self, logits: torch.Tensor, deciding: list[tuple[int, int]],
                 confident: list[tuple[int, int]] | None = None):  # fmt: skip
        """`deciding`: each lane's first read row and how many rows from it on decide tokens;
        `confident`: each lane's first row and count of rows whose confidence it reads (None: none)."""
        greedy = _Greedy(logits)
        self.values: list[int] = []
        self.read, self.flags, self.offsets, self.margin = greedy.tokens, logits.shape[0], [], None
        self.confidence, self.confident_offsets, self.confidence_dtype = 0, [], logits.dtype
        read = [greedy.tokens]
        starts, counts = [start for start, _ in deciding], [count for _, count in deciding]
        total = sum(counts)
        if total:
            # Most rows (Linear-SS's verification), or logits read on the host (NumPy), where the margins
            # of every row cost one more read of the rows, as a gather of some rows and its read do: all
            # of them. Else (Packed-SS's verifier rows on a GPU, a quarter of its calls' rows) those rows.
            if greedy.array is not None or 4 * total >= 3 * logits.shape[0]:
                self.margin, near = greedy.margins
                self.offsets = starts
            else:
                index: list[int] = []
                for start, count in deciding:
                    self.offsets.append(len(index))
                    index += range(start, start + count)
                self.margin, near = greedy.margins_of(index)
            read.append(near)
        if confident is not None and any(count for _, count in confident):
            self.confidence = logits.shape[0] + (near.shape[0] if total else 0)
            at = 0
            for _, count in confident:
                self.confident_offsets.append(at)
                at += count
            rows = ranges([start for start, _ in confident], [count for _, count in confident], logits.device)
            chosen = confidences(logits.index_select(0, rows), greedy.tokens.index_select(0, rows), 1.0)
            self.confidence_dtype = chosen.dtype
            read.append(float_bits(chosen))
        if len(read) > 1:
            self.read = torch.cat(read)

    def near_ties_of(self, lane: int, first: int, count: int) -> list[int]:
        """Lane k's (`lane`) near-tie flags of its deciding rows first..first + count, from the values read."""
        at = self.flags + self.offsets[lane] + first
        return self.values[at : at + count]

    def decided(self, lane: int, first: int, count: int) -> DecidedMargins:
        """What decided lane k's tokens of its deciding rows first..first + count: their margins
        (Rows of `margin`) and near-tie flags."""
        at = self.offsets[lane] + first
        return DecidedMargins(Rows(self.margin, at, at + count), self.near_ties_of(lane, first, count))

    def confidences_of(self, lane: int, count: int) -> list[float]:
        """Lane k's (`lane`) `count` confidences, from the values read."""
        start = self.confidence + self.confident_offsets[lane]
        return floats_of(self.values[start : start + count], self.confidence_dtype)


class Lane:
    """One request's greedy decode with `decoder` (an AR, Linear-SS or Packed-SS Decoder that has
    not started), as flat state: `call()` is its next call, `step(...)` takes that call's rows of
    a round's Readout and returns its record when the decode ended (its slot's cache dropped)."""

    __slots__ = ("decoder", "kind", "after_prefill", "queried", "last", "drafts", "accepted", "drafted",
                 "accepted_drafts", "width", "draft_shape", "verify_shape", "packed_shapes", "ties")  # fmt: skip

    def __init__(self, decoder: Decoder):
        self.decoder = decoder
        self.kind = Kind.PREFILL
        self.after_prefill = _AFTER_PREFILL[type(decoder)]
        self.queried = type(decoder) in _QUERIED  # SDAR's: its calls add query rows
        self.last = 0
        self.drafts: list[int] = []
        self.accepted: list[int] = []
        self.drafted: list[int] = []
        self.accepted_drafts: list[int] = []
        self.ties = decoder.ties
        settings, model = decoder.settings, decoder.model
        self.width = settings.width
        if self.after_prefill is Kind.AR:
            self.verify_shape = (_verify_shape(0, model.mask_token_id, model.device) if self.queried
                                 else _causal_shape(1, model.device))  # fmt: skip
        elif self.after_prefill is Kind.DRAFT:
            self.draft_shape = _draft_shape(settings.width, model.mask_token_id, model.device)
            self.verify_shape = (_verify_shape(settings.width, model.mask_token_id, model.device) if self.queried
                                 else _causal_shape(settings.block, model.device))  # fmt: skip
        elif not self.queried:
            self.packed_shapes = decoder.shapes

    def verifier_row(self) -> int:
        """Its next call's first verifier row (or row of a first token) among the rows it reads:
        in SDAR's calls the m + 1 queries after the clean rows [last, d_1..d_m]."""
        return len(self.drafts) + 1 if self.queried and self.kind is not Kind.PREFILL else 0

    def deciding(self, start: int, rows: int) -> tuple[int, int]:
        """Of its call's `rows` read rows, from row `start` of the round's on, the first and the
        count of those that decide emitted tokens whose near-ties are kept: its verifier rows, or
        the row of a first token (none in a draft call)."""
        kind = self.kind
        if self.ties is None or kind is Kind.DRAFT:
            return start, 0
        first = start + self.verifier_row()
        if kind is Kind.VERIFY or kind is Kind.PACKED:
            return first, len(self.drafts) + 1
        return first, 1

    def confident(self, start: int, rows: int) -> tuple[int, int]:
        """None of its rows' confidences is read (a set lane's may be: packedss.decoding.set_lockstep)."""
        return start, 0

    def call(self) -> Listed | Call:
        """Its next call, built on the host by the schedule's own shapes (schedules._Shape.call)."""
        kind, last, position = self.kind, [self.last], self.decoder.position
        if kind is Kind.DRAFT:
            return self.draft_shape.call([last, *self.draft_shape.masks], position)
        if kind is Kind.VERIFY:
            return self.verify_shape.call([last, self.drafts, *self.verify_shape.masks], position)
        if kind is Kind.PACKED:
            if not self.queried:
                return _packed_of(self.packed_shapes[len(self.drafts)], last, self.drafts, position)
            model, settings = self.decoder.model, self.decoder.settings
            shape = _packed_shape(len(self.drafts), self.width, model.mask_token_id, settings.pad_verify, model.device)
            queries, padding, block = shape.masks
            return shape.call([last, self.drafts, queries, padding, last, block], position)
        if kind is Kind.AR:
            return self.verify_shape.call([last, *self.verify_shape.masks], position)
        return self.prefill_call()

    def prefill_call(self) -> Listed | Call:
        """The prompt's L rows; Packed-SS attaches its first draft block [x_{L-1}@L-1, MASK@L..L+W-1],
        which sees the prompt before its anchor (schedules._Packed.prefill). SDAR's adds the query
        MASK@L after the prompt, read first (queried.queried_prefill): its rows read are then
        [query, anchor, W masks] where the Nemotron family's are [x_{L-1}, anchor, W masks]."""
        decoder = self.decoder
        prompt, device = decoder.prompt, decoder.model.device
        if self.queried:
            width = self.width if self.after_prefill is Kind.PACKED else 0
            return queried_prefill(decoder.prompt_ids, decoder.model.mask_token_id, width)
        if self.after_prefill is not Kind.PACKED:
            return _prefill_listed(prompt, [], 0, 0, device)
        length, block = len(prompt), [prompt[-1]] + [decoder.model.mask_token_id] * self.width
        return _prefill_listed(prompt, block, length - 1, length - 1, device)

    def step(self, readout: Readout, start: int, rows: int, lane: int) -> Decoded | None:
        """Take its call's `rows` read rows, rows start.. of `readout` (its lane k = `lane`); its
        record when it ended."""
        kind, decoder, values = self.kind, self.decoder, readout.values
        if kind is Kind.DRAFT:
            decoder.model.commit(0)
            self.drafts = values[start + 1 : start + rows]
            self.kind = Kind.VERIFY
            return None
        if kind is Kind.PREFILL:
            decoder.model.commit(len(decoder.prompt))
            done = self.first(readout, start, lane)
            if self.after_prefill is Kind.PACKED:
                # Its draft rows propose for L..L+W-1; the first token took L (driver.proposals_ahead).
                self.drafts = values[start + 3 : start + rows]
            self.kind = self.after_prefill
        elif kind is Kind.AR:
            decoder.model.commit(1)
            decoder.position += 1
            done = self.first(readout, start + self.verifier_row(), lane)
            self.count(1, 0)
        else:
            done = self.verified(readout, start + self.verifier_row(), start + rows, lane)
        if not done:
            return None
        record = finished(decoder, len(decoder.prompt), self.accepted, self.drafted, self.accepted_drafts)
        decoder.model.reset()
        return record

    def first(self, readout: Readout, start: int, lane: int) -> bool:
        """Emit the token of row `start` (schedules._LTRDecoder.first)."""
        decoder = self.decoder
        token = readout.values[start : start + 1]
        self.last = token[0]
        self.note(readout, lane, [decoder.produced])
        return decoder.emit(token)

    def verified(self, readout: Readout, start: int, end_of_call: int, lane: int) -> bool:
        """Verify its drafts by the verifier rows from `start` (the h drafts equal to their rows'
        argmax and one more token), commit and emit them (schedules._LTRDecoder.verified); a
        Packed-SS call's last W rows (up to row `end_of_call`) propose the next drafts, less the
        positions emitted."""
        decoder, values, drafts = self.decoder, readout.values, self.drafts
        end = start
        for token in drafts:
            if values[end] != token:
                break
            end += 1
        end += 1
        emitted = values[start:end]
        count, proposed = end - start, len(drafts)
        if self.kind is Kind.PACKED:
            self.drafts = values[end_of_call - self.width + min(count, self.width) : end_of_call]
        else:
            self.kind = Kind.DRAFT
        self.last = emitted[-1]
        self.note(readout, lane, range(decoder.produced, decoder.produced + count))
        decoder.model.commit(count)
        decoder.draft_proposed += proposed
        decoder.draft_accepted += count - 1
        decoder.position += count
        self.count(count, proposed)
        return decoder.emit(emitted)

    def count(self, emitted: int, proposed: int) -> None:
        """An iteration's counts: tokens emitted, drafts verified, drafts accepted."""
        self.accepted.append(emitted)
        self.drafted.append(proposed)
        self.accepted_drafts.append(emitted - 1)

    def note(self, readout: Readout, lane: int, indexes) -> None:
        """The near-ties among its deciding rows (lane k = `lane` of `readout`), which decided
        the tokens at output `indexes`, one row each."""
        if self.ties is not None and 1 in readout.near_ties_of(lane, 0, len(indexes)):
            self.ties.note(indexes, readout.decided(lane, 0, len(indexes)))

    def close(self) -> None:
        """Drop its slot's cache (a decode ended early)."""
        self.decoder.model.reset()

