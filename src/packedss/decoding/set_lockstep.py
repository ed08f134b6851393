"""Greedy Packed-SS of the any-order (set) family in a batch, each request stepped once per round on
flat state, as packedss.decoding.lockstep steps the LTR schedules.

Alone, a set decoder (packedss.decoding.anyorder) hands each round's host work to its driver as a
Host step, `set_round`, and receives Proposed and Emitted objects; in a batch its coroutine resumes
for every call and every step. At T = 0 Packed-SS needs none of that: the tokens a round decides are
argmaxes of its rows, and the block a confidence-ordered request starts is ordered by the
probability each of its draft rows gave its argmax. So one `Readout` of the round (the argmax of
every row, the deciding rows' near-tie flags, the starting blocks' confidences as the float's bits)
gives every request all it needs. A `SetLane` is such a request: its decoder's own state (resolved
tokens, window, drafts, frozen keys, records), stepped by the decoder's plain methods (`window`,
`order`, `resolve`), plus what its next call carries. Its decode is the coroutine's, call for call
(tests/decoding/test_set_lockstep.py holds the records equal field by field, times aside).
"""

from __future__ import annotations

from packedss.decoding.anyorder import _packed_layout, _Packed, _window_layout
from packedss.decoding.calls import Listed
from packedss.decoding.driver import Decoder, finished
from packedss.decoding.lockstep import Readout
from packedss.decoding.rows import Rows
from packedss.decoding.trace import Decoded
from packedss.decoding.verify import DecidedMargins


def set_steps_in_lockstep(decoder: Decoder) -> bool:
    """Whether `decoder`'s decode runs as a SetLane: the set family's Packed-SS, greedy, in either
    verification order."""
    return type(decoder) is _Packed and decoder.settings.sampling.greedy


class SetLane:
    """One request's greedy set-family Packed-SS decode with `decoder` (not started), as flat state:
    `call()` is its next call, `step(...)` takes that call's rows of a round's Readout and returns
    its record when the decode ended (its slot's cache dropped).

    Its calls (anyorder._Packed): the prefill [prompt, a mask per window position] reads the window's
    rows; each later call [pending, sigma's drafts and masks, rank queries, draft rows] reads the u
    rank queries (rank r at row r) and then the u draft rows (by window position)."""

    __slots__ = ("decoder", "started", "window", "sigma", "drafted", "written", "starting", "accepted", "drafted_counts",
                 "accepted_drafts")  # fmt: skip

    def __init__(self, decoder: _Packed):
        self.decoder = decoder
        self.started = False  # its prefill ran
        self.window: list[int] = []  # its next call's window (U), by position
        self.sigma: list[int] = []  # its next call's verification order of the window
        self.drafted = 0  # m: drafts its next call verifies (sigma's first m)
        self.written = 0  # p: resolved rows its next call writes to the cache
        self.starting = False  # its next call starts a confidence-ordered block
        # Per iteration after prefill: tokens produced, drafts verified, drafts accepted (driver._steps).
        self.accepted: list[int] = []
        self.drafted_counts: list[int] = []
        self.accepted_drafts: list[int] = []

    def ordered(self) -> bool:
        return self.decoder.settings.order == "confidence"

    def deciding(self, start: int, rows: int) -> tuple[int, int]:
        """Of its call's `rows` read rows, from row `start` of the round's on, the first and the
        count of those that may decide emitted tokens: a starting block's draft rows (the most
        confident resolves), the first token's row, or the verifier ranks 0..m (m = u: the last
        query stands for rank u too)."""
        if not self.started:
            return start, len(self.window) if self.ordered() else 1
        if self.starting:
            return start + len(self.window), len(self.window)
        return start, min(self.drafted + 1, len(self.window))

    def confident(self, start: int, rows: int) -> tuple[int, int]:
        """The first and count of its call's rows whose confidence it reads: a starting block's
        draft rows (the prefill's window rows, or a call's last u rows); none otherwise."""
        if not self.started and self.ordered():
            return start, len(self.window)
        if self.started and self.starting:
            return start + len(self.window), len(self.window)
        return start, 0

    def call(self) -> Listed:
        """Its next call, as the coroutine's `run` lists it (anyorder._Packed.prefill and .step)."""
        decoder = self.decoder
        if not self.started:
            length = decoder.length
            window = decoder.window() if self.ordered() else list(range(length, length + decoder.settings.width))
            self.window = window
            ids = decoder.prompt + [decoder.mask] * len(window) + list(range(length)) + window
            return Listed(_window_layout(length, len(window), decoder.device), ids, length)
        window = decoder.window()
        u, pending, drafts = len(window), decoder.pending, decoder.drafts
        starting = decoder.starting
        sigma = decoder.order(window)
        drafted = 0 if starting else sum(1 for i in sigma if i in drafts)
        self.window, self.sigma, self.drafted, self.written, self.starting = window, sigma, drafted, len(pending), starting
        tokens = ([t for _, t in pending] + [drafts[i][0] for i in sigma[:drafted]]
                  + [decoder.mask] * (u - drafted + 2 * u))  # fmt: skip
        positions = [i for i, _ in pending] + sigma + sigma + window
        layout = _packed_layout(len(pending), u, drafted, starting, decoder.device)
        return Listed(layout, tokens + positions, len(pending) + u)

    def step(self, readout: Readout, start: int, rows: int, lane: int) -> Decoded | None:
        """Take its call's `rows` read rows, rows start.. of `readout` (its lane k = `lane`); its
        record when it ended."""
        decoder = self.decoder
        u = len(self.window)
        if not self.started:
            self.started = True
            self.ran("prefill", 0, u)
            decoder.model.commit(decoder.length)
            done = self.start_block(readout, start, lane) if self.ordered() else self.first(readout, start, lane)
        else:
            before = (decoder.produced, decoder.draft_proposed, decoder.draft_accepted)
            self.ran("packed", self.written, u)
            if self.starting:
                decoder.model.commit(self.written)
                done = self.start_block(readout, start + u, lane)
            else:
                done = self.verified(readout, start, lane)
            self.accepted.append(decoder.produced - before[0])
            self.drafted_counts.append(decoder.draft_proposed - before[1])
            self.accepted_drafts.append(decoder.draft_accepted - before[2])
        if not done:
            return None
        record = finished(decoder, len(decoder.prompt), self.accepted, self.drafted_counts, self.accepted_drafts)
        decoder.model.reset()
        return record

    def ran(self, kind: str, written: int, u: int) -> None:
        """The records of a call that ran (anyorder._SetDecoder.run)."""
        decoder = self.decoder
        decoder.kinds.append(kind)
        decoder.u.append(u)
        decoder.p.append(written)
        decoder.resolved.append(0)

    def decided(self, readout: Readout, lane: int, first: int, count: int) -> DecidedMargins:
        """What decided its tokens of deciding rows first.. (from its first deciding row), `count` of them."""
        at = readout.offsets[lane] + first
        flags = readout.values[readout.flags + at : readout.flags + at + count]
        return DecidedMargins(Rows(readout.margin, at, at + count), flags)

    def start_block(self, readout: Readout, start: int, lane: int) -> bool:
        """anyorder._SetDecoder.start_block on the block's draft rows, rows start.. of the round:
        every row's argmax is a draft, the most confident (the leftmost of equals) resolves, and
        the confidences are the block's frozen keys."""
        decoder, window = self.decoder, self.window
        u = len(window)
        tokens = readout.values[start : start + u]
        confidence = readout.confidences(lane, u)
        for position, token in zip(window, tokens):
            decoder.drafts[position] = (token, None)
        decoder.keys = dict(zip(window, confidence))
        first = min(range(u), key=lambda k: (-confidence[k], window[k]))
        item = (window[first], tokens[first])
        decoder.note([window[first] - decoder.length], self.decided(readout, lane, first, 1))
        decoder.pending = [item]
        return decoder.resolve([item])

    def first(self, readout: Readout, start: int, lane: int) -> bool:
        """Left to right, the prefill's first row gives the first token and its other rows the first
        drafts (anyorder._SetDecoder.prefill)."""
        decoder, length = self.decoder, self.decoder.length
        tokens = readout.values[start : start + len(self.window)]
        decoder.note([0], self.decided(readout, lane, 0, 1))
        for position, token in zip(self.window[1:], tokens[1:]):
            decoder.drafts[position] = (token, None)
        decoder.pending = [(length, tokens[0])]
        return decoder.resolve(decoder.pending)

    def verified(self, readout: Readout, start: int, lane: int) -> bool:
        """anyorder._SetDecoder.verify_ranks at T = 0, then _Packed's next drafts: sigma's m drafts
        accepted while they equal their rank's query argmax, one more token (the correction, or the
        bonus when m < u), and the draft rows' argmaxes at the positions still open."""
        decoder, values, sigma, window = self.decoder, readout.values, self.sigma, self.window
        u, m = len(window), self.drafted
        accepted = 0
        while accepted < m and decoder.drafts[sigma[accepted]][0] == values[start + accepted]:
            accepted += 1
        decoder.draft_proposed += m
        decoder.draft_accepted += accepted
        items = list(zip(sigma[:accepted], values[start : start + accepted]))
        decoder.pending = [] if accepted == u else [(sigma[accepted], values[start + accepted])]
        decided = items + decoder.pending
        decoder.note([i - decoder.length for i, _ in decided], self.decided(readout, lane, 0, len(decided)))
        decoder.model.commit(self.written + accepted)
        done = decoder.resolve(decided)
        ahead = values[start + u : start + 2 * u]
        decoder.drafts = {position: (token, None) for position, token in zip(window, ahead)
                          if position not in decoder.tokens}  # fmt: skip
        return done

    def close(self) -> None:
        """Drop its slot's cache (a decode ended early)."""
        self.decoder.model.reset()
