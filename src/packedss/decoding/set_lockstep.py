"""Greedy AR, Linear-SS and Packed-SS of the any-order (set) family in a batch, each request stepped
once per round on flat state, as packedss.decoding.lockstep steps the LTR schedules.

Alone, a set decoder (packedss.decoding.anyorder) hands each round's host work to its driver as a
Host step, `set_round`, and receives Proposed and Emitted objects; in a batch its coroutine resumes
for every call and every step. At T = 0 AR, Linear-SS and Packed-SS need none of that: the tokens
a round decides are argmaxes of its rows, and the block a confidence-ordered request starts is
ordered by the probability each of its draft rows gave its argmax. So one `Readout` of the round (the argmax of
every row, the deciding rows' near-tie flags, the starting blocks' confidences as the float's bits)
gives every request all it needs. A `SetLane` is such a request: its decoder's own state (resolved
tokens, window, drafts, frozen keys, records), stepped by the decoder's plain methods (`window`,
`order`, `resolve`, and `ran`, `begin_block` and `accept`, which its coroutine calls too), plus what
its next call carries. Its decode is the coroutine's, call for call
(tests/decoding/test_set_lockstep.py holds the records equal field by field, times aside).
"""

from __future__ import annotations

from packedss.decoding.anyorder import _AR, _Linear, _packed_layout, _Packed, _verify_layout, _window_layout
from packedss.decoding.calls import Listed
from packedss.decoding.driver import Decoder, finished
from packedss.decoding.lockstep import Kind, Readout
from packedss.decoding.trace import Decoded


_AFTER_PREFILL = {_AR: Kind.AR, _Linear: Kind.DRAFT, _Packed: Kind.PACKED}


def set_steps_in_lockstep(decoder: Decoder) -> bool:
    """Whether `decoder`'s decode runs as a SetLane: the set family's AR, Linear-SS or Packed-SS,
    greedy, in either verification order."""
    return type(decoder) in _AFTER_PREFILL and decoder.settings.sampling.greedy


class SetLane:
    """One request's greedy set-family decode with `decoder` (an AR, Linear-SS or Packed-SS decoder
    that has not started), as flat state: `call()` is its next call, `step(...)` takes that call's
    rows of a round's Readout and returns its record when the decode ended (its slot's cache
    dropped).

    Its calls (packedss.decoding.anyorder): the prefill [prompt, a mask per window position] reads
    the window's rows; AR's [pending, a mask at its next position, or at every position of a block
    that starts] reads the masks; Linear-SS's draft call [pending, a mask per window position] reads
    the masks, its verify call [sigma's drafts, rank queries] the u queries (rank r at row r);
    Packed-SS's [pending, sigma's drafts and masks, rank queries, draft rows] the u rank queries and
    then the u draft rows (by window position)."""

    __slots__ = ("decoder", "kind", "after_prefill", "window", "sigma", "drafted", "written", "starting", "before",
                 "accepted", "drafted_counts", "accepted_drafts")  # fmt: skip

    def __init__(self, decoder: Decoder):
        self.decoder = decoder
        self.kind = Kind.PREFILL
        self.after_prefill = _AFTER_PREFILL[type(decoder)]
        self.window: list[int] = []  # its next call's mask positions (Packed-SS: the window, U)
        self.sigma: list[int] = []  # its next verification's order of the window
        self.drafted = 0  # m: drafts its next verification verifies (sigma's first m)
        self.written = 0  # p: resolved rows its next call writes to the cache
        self.starting = False  # its next call starts a confidence-ordered block
        self.before = (0, 0, 0)  # produced, drafts verified and accepted when the iteration began
        # Per iteration after prefill: tokens produced, drafts verified, drafts accepted (driver._steps).
        self.accepted: list[int] = []
        self.drafted_counts: list[int] = []
        self.accepted_drafts: list[int] = []

    def ordered(self) -> bool:
        return self.decoder.settings.order == "confidence"

    def deciding(self, start: int, rows: int) -> tuple[int, int]:
        """Of its call's `rows` read rows, from row `start` of the round's on, the first and the
        count of those that may decide emitted tokens: a starting block's rows (the most confident
        resolves), the row of a first or an AR token, or the verifier ranks 0..m (m = u: the last
        query stands for rank u too); none in Linear-SS's draft call."""
        kind, u = self.kind, len(self.window)
        if kind is Kind.PACKED:
            return (start + u, u) if self.starting else (start, min(self.drafted + 1, u))
        if kind is Kind.VERIFY:
            return start, u
        if kind is Kind.DRAFT:
            return start, 0
        return start, u if self.starting else 1

    def confident(self, start: int, rows: int) -> tuple[int, int]:
        """The first and count of its call's rows whose confidence it reads: a starting block's rows
        (a call's last u rows in Packed-SS's); none otherwise."""
        if not self.starting or self.kind is Kind.VERIFY:
            return start, 0
        u = len(self.window)
        return (start + u, u) if self.kind is Kind.PACKED else (start, u)

    def call(self) -> Listed:
        """Its next call, as the coroutine's `run` lists it (anyorder's prefill and steps)."""
        decoder, kind = self.decoder, self.kind
        if kind is Kind.PREFILL:
            length = decoder.length
            self.starting = self.ordered()
            if self.starting:
                window = decoder.window()
            else:
                width = decoder.settings.width if self.after_prefill is Kind.PACKED else 1
                window = list(range(length, length + width))
            self.window = window
            ids = decoder.prompt + [decoder.mask] * len(window) + list(range(length)) + window
            return Listed(_window_layout(length, len(window), decoder.device), ids, length)
        if kind is Kind.VERIFY:
            sigma, u = self.sigma, len(self.window)
            ids = [decoder.drafts[i][0] for i in sigma] + [decoder.mask] * u + sigma + sigma
            return Listed(_verify_layout(0, u, u, decoder.device), ids, u)
        window, pending = decoder.window(), decoder.pending
        self.starting, self.written = decoder.starting, len(pending)
        if kind is not Kind.PACKED:
            if kind is Kind.AR and not self.starting:
                window = [decoder.order(window)[0] if self.ordered() else window[0]]
            self.window = window
            ids = [t for _, t in pending] + [decoder.mask] * len(window) + [i for i, _ in pending] + window
            return Listed(_window_layout(len(pending), len(window), decoder.device), ids, len(pending))
        u, drafts = len(window), decoder.drafts
        sigma = decoder.order(window)
        drafted = 0 if self.starting else sum(1 for i in sigma if i in drafts)
        self.window, self.sigma, self.drafted = window, sigma, drafted
        tokens = ([t for _, t in pending] + [drafts[i][0] for i in sigma[:drafted]]
                  + [decoder.mask] * (u - drafted + 2 * u))  # fmt: skip
        positions = [i for i, _ in pending] + sigma + sigma + window
        layout = _packed_layout(len(pending), u, drafted, self.starting, decoder.device)
        return Listed(layout, tokens + positions, len(pending) + u)

    def step(self, readout: Readout, start: int, rows: int, lane: int) -> Decoded | None:
        """Take its call's `rows` read rows, rows start.. of `readout` (its lane k = `lane`); its
        record when it ended."""
        decoder, kind, u = self.decoder, self.kind, len(self.window)
        if kind is Kind.PREFILL:
            decoder.ran("prefill", 0, u)
            decoder.model.commit(decoder.length)
            self.kind = self.after_prefill
            done = self.start_block(readout, start, lane) if self.starting else self.first(readout, start, lane)
            return self.ended() if done else None
        if kind is not Kind.VERIFY:
            self.before = (decoder.produced, decoder.draft_proposed, decoder.draft_accepted)
        if kind is Kind.DRAFT:
            decoder.ran("draft", self.written, u)
            decoder.model.commit(self.written)
            tokens = readout.values[start : start + u]
            for position, token in zip(self.window, tokens):
                decoder.drafts[position] = (token, None)
            if self.starting:
                decoder.keys = dict(zip(self.window, readout.confidences_of(lane, u)))
            self.sigma, self.drafted = decoder.order(self.window), u
            self.kind = Kind.VERIFY
            return None
        if kind is Kind.VERIFY:
            decoder.ran("verify", 0, u)
            done = self.verified(readout, start, lane)
            self.kind = Kind.DRAFT
        elif kind is Kind.AR:
            decoder.ran("ar", self.written, u)
            decoder.model.commit(self.written)
            done = self.start_block(readout, start, lane) if self.starting else self.first(readout, start, lane)
        else:
            decoder.ran("packed", self.written, u)
            if self.starting:
                decoder.model.commit(self.written)
                done = self.start_block(readout, start + u, lane)
            else:
                done = self.verified(readout, start, lane)
                ahead = readout.values[start + u : start + 2 * u]
                decoder.drafts = {position: (token, None) for position, token in zip(self.window, ahead)
                                  if position not in decoder.tokens}  # fmt: skip
        produced, proposed, accepted = self.before
        self.accepted.append(decoder.produced - produced)
        self.drafted_counts.append(decoder.draft_proposed - proposed)
        self.accepted_drafts.append(decoder.draft_accepted - accepted)
        return self.ended() if done else None

    def ended(self) -> Decoded:
        """Its record; its slot's cache dropped."""
        decoder = self.decoder
        record = finished(decoder, len(decoder.prompt), self.accepted, self.drafted_counts, self.accepted_drafts)
        decoder.model.reset()
        return record

    def start_block(self, readout: Readout, start: int, lane: int) -> bool:
        """anyorder._SetDecoder.start_block on the block's rows, rows start.. of the round: every
        row's argmax is a draft, and the decoder's `begin_block` resolves the most confident."""
        decoder, window = self.decoder, self.window
        u = len(window)
        tokens = readout.values[start : start + u]
        for position, token in zip(window, tokens):
            decoder.drafts[position] = (token, None)
        return decoder.begin_block(window, tokens, readout.confidences_of(lane, u),
                                   lambda k: readout.decided(lane, k, 1))  # fmt: skip

    def first(self, readout: Readout, start: int, lane: int) -> bool:
        """The first row's token resolves its position (the prefill's first token left to right, or
        an AR step's); a Packed-SS prefill's other rows give the first drafts."""
        decoder = self.decoder
        tokens = readout.values[start : start + len(self.window)]
        decoder.note([self.window[0] - decoder.length], readout.decided(lane, 0, 1))
        for position, token in zip(self.window[1:], tokens[1:]):
            decoder.drafts[position] = (token, None)
        decoder.pending = [(self.window[0], tokens[0])]
        return decoder.resolve(decoder.pending)

    def verified(self, readout: Readout, start: int, lane: int) -> bool:
        """anyorder._SetDecoder.verify_ranks at T = 0: sigma's m drafts accepted while they equal
        their rank's query argmax, then one more token (the correction, or the bonus when m < u),
        by the decoder's `accept`."""
        decoder, values, sigma = self.decoder, readout.values, self.sigma
        u, m = len(self.window), self.drafted
        accepted = 0
        while accepted < m and decoder.drafts[sigma[accepted]][0] == values[start + accepted]:
            accepted += 1
        decided = min(accepted + 1, u)
        return decoder.accept(sigma, m, accepted, values[start : start + decided], readout.decided(lane, 0, decided))

    def close(self) -> None:
        """Drop its slot's cache (a decode ended early)."""
        self.decoder.model.reset()
