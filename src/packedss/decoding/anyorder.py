"""The any-order ("set") family: ar, linear, packed, quadratic and native decoding of a set model
such as SetDLM. The rules and record identities: docs/schedules.md §11-§14.

A set model predicts only from MASK rows. Attention (the set-causal rule): a clean row sees the
committed cache and the clean rows before it in the decoding order; a mask row sees the cache,
the clean rows of its call that rank before it in the verification order, and itself. The KV
cache holds clean rows in decoding order, so committing is a cache crop as in the LTR family.

Vocabulary of this file: R = resolved positions; the active window of W positions starts at the
leftmost unresolved position (order=ltr, native) or is a frozen block of W positions that is
finished before the next one starts (order=confidence); U = its unresolved positions, u = |U|;
p = rows of resolved tokens not yet in the cache that a call writes (the correction of the
previous call, so p in {0, 1}; native writes every token it resolved in the previous call).
"""

from __future__ import annotations

import functools
from collections.abc import Sequence

import torch

from packedss.decoding.batched_anyorder import Propose, Proposed, Verify, runs_of, set_round
from packedss.decoding.calls import Call, CallModel, Layout, Listed, Role, Segment, layout_of, pack
from packedss.decoding.driver import AnyOrderSettings, Decoder, Host, Steps, drive, schedule_named
from packedss.decoding.rows import Rows
from packedss.decoding.trace import Decoded, StopCheck


def _rows(roles: list[Role], attend: torch.Tensor, device: torch.device) -> Segment:
    """Rows of a layout; their tokens and positions are filled in per call (zeros here)."""
    zeros = torch.zeros(len(roles), dtype=torch.long, device=device)
    codes = torch.tensor([int(r) for r in roles], dtype=torch.uint8, device=device)
    return Segment(zeros, zeros, codes, attend, roles.count(Role.PAD), roles.count(Role.DRAFT))


@functools.lru_cache(maxsize=256)
def _set_call_layout(prefix: int, clean_real: tuple[bool, ...], mask_levels: tuple[int, ...],
                     mask_real: tuple[bool, ...], device: torch.device) -> Layout:  # fmt: skip
    """The layout of a set-family call (see `set_call`), built once per shape."""
    n_clean, n_mask = len(clean_real), len(mask_levels)
    causal = torch.ones(prefix + n_clean, prefix + n_clean, dtype=torch.bool, device=device).tril_()
    alone = torch.eye(n_mask, dtype=torch.bool, device=device)
    segments = [
        _rows([Role.VERIFY] * prefix, causal[:prefix, :prefix], device),
        _rows([Role.VERIFY if r else Role.PAD for r in clean_real], causal[prefix:, prefix:], device),
        _rows([Role.DRAFT if r else Role.PAD for r in mask_real], alone, device),
    ]
    real = torch.tensor(mask_real, dtype=torch.bool, device=device).view(n_mask, 1)
    levels = torch.tensor(mask_levels, dtype=torch.long, device=device).view(n_mask, 1)
    ranks = torch.arange(n_clean, device=device).view(1, n_clean)
    sees = {
        (1, 0): causal[prefix:, :prefix],
        (2, 0): real.expand(n_mask, prefix),
        (2, 1): (ranks < levels) & real,
    }
    return layout_of(pack(segments, sees))


@functools.lru_cache(maxsize=1024)
def _window_layout(prefix: int, u: int, device: torch.device) -> Layout:
    """A call of `prefix` rows, then u mask queries that see them (run_window)."""
    return _set_call_layout(prefix, (), (0,) * u, (True,) * u, device)


@functools.lru_cache(maxsize=1024)
def _verify_layout(prefix: int, drafted: int, queries: int, device: torch.device) -> Layout:
    """A verify call: `prefix` rows, the `drafted` clean rows, then the rank queries 0..queries-1,
    all real (Linear-SS's: no prefix, u of each; pld's: p, m and m + 1)."""
    return _set_call_layout(prefix, (True,) * drafted, tuple(range(queries)), (True,) * queries, device)


@functools.lru_cache(maxsize=1024)
def _packed_layout(prefix: int, u: int, m: int, starting: bool, device: torch.device) -> Layout:
    """Packed-SS's call: `prefix` rows, sigma's u clean rows (its first m, the drafted ones, real),
    the u rank queries (ranks 0..m real; none at a block's start, m = 0 there), then the window's
    u draft rows."""
    queries = tuple(r <= m and not starting for r in range(u))
    return _set_call_layout(prefix, (True,) * m + (False,) * (u - m), tuple(range(u)) + (0,) * u, queries + (True,) * u,
                            device)  # fmt: skip


def set_call(
    prefix_tokens: torch.Tensor,
    prefix_positions: torch.Tensor,
    clean_tokens: torch.Tensor,
    clean_positions: torch.Tensor,
    clean_real: Sequence[bool],
    mask_positions: torch.Tensor,
    mask_levels: Sequence[int],
    mask_real: Sequence[bool],
    mask_token_id: int,
) -> Call:
    """One call of the set family. Rows: prefix (resolved tokens written now: the prompt, the
    correction p, or native's new tokens; causal among themselves), then clean draft rows in
    verification order (row r sees the prefix and clean rows 0..r), then mask rows (mask j sees
    the prefix, the clean rows of rank < mask_levels[j], and itself). Rows marked not real
    (placeholders, padding) get Role.PAD; a PAD mask row sees only itself."""
    device = prefix_tokens.device
    shape = (tuple(map(bool, clean_real)), tuple(map(int, mask_levels)), tuple(map(bool, mask_real)))
    layout = _set_call_layout(prefix_tokens.shape[0], *shape, device)
    masks = torch.full((mask_positions.shape[0],), mask_token_id, dtype=torch.long, device=device)
    tokens = torch.cat([prefix_tokens, clean_tokens, masks])
    return layout.call(tokens, torch.cat([prefix_positions, clean_positions, mask_positions]))


class _SetDecoder(Decoder):
    """State of one response: resolved tokens by position, the uncached resolved tokens, the
    stored drafts, the frozen confidence keys of the current block, and the per-call records.
    Subclasses are the schedules; `drafts_at_prefill` says whether the prefill call also drafts."""

    settings: AnyOrderSettings
    drafts_at_prefill = False

    def __init__(
        self, model: CallModel, prompt: Sequence[int], settings: AnyOrderSettings, stop_check: StopCheck | None
    ):
        super().__init__(model, prompt, settings, stop_check)
        self.device = model.device
        self.mask = int(model.mask_token_id)
        self.length = len(self.prompt)
        self.tokens: dict[int, int] = {}  # resolved generation position -> token
        self.contiguous = self.length  # every position < this one is resolved
        self.pending: list[tuple[int, int]] = []  # resolved, not yet in the cache (decoding order)
        self.drafts: dict[int, tuple[int, torch.Tensor | None]] = {}  # position -> (token, q row)
        self.keys: dict[int, float] | None = None  # confidence order: frozen keys of the block
        self.block_start = self.length
        self.u: list[int] = []
        self.p: list[int] = []
        self.resolved: list[int] = []
        self.kinds: list[str] = []

    # ----------------------------------------------------------------- window and order
    def window(self) -> list[int]:
        """U: the unresolved positions of the active window, by position."""
        width = self.settings.width if not self.lossy else self.settings.native_window or self.settings.width
        if self.settings.order == "confidence" and self.settings.schedule != "native":
            block = range(self.block_start, self.block_start + width)
            unresolved = [i for i in block if i not in self.tokens]
            if unresolved:
                return unresolved
            self.block_start, self.keys = self.contiguous, None  # the block is done: start the next
            return list(range(self.block_start, self.block_start + width))
        end = self.contiguous + width
        if self.settings.schedule == "native":  # SetDLM's sequence holds max_new_tokens masks, no more
            end = min(end, self.length + self.settings.max_new_tokens)
        return [i for i in range(self.contiguous, end) if i not in self.tokens]

    def order(self, window: list[int]) -> list[int]:
        """Verification order: positions with a stored draft first (by position for ltr, by the
        block's frozen drafter confidence, high first, for confidence), then the rest by position."""
        if self.settings.order == "ltr" or self.keys is None:
            return sorted(window, key=lambda i: (i not in self.drafts, i))
        return sorted(window, key=lambda i: (i not in self.drafts, -self.keys.get(i, float("-inf")), i))

    @property
    def starting(self) -> bool:
        """Confidence order and the block's keys are not frozen yet."""
        return self.settings.order == "confidence" and self.keys is None

    def host(self, logits, *parts) -> Steps:
        """Each part's result on a call's logits (batched with other requests' in a batch)."""
        return (yield Host(set_round, logits, parts, self.settings.sampling))

    # ----------------------------------------------------------------- running calls
    def run(self, kind, prefix, clean_positions, clean_tokens, layout, masks, u, read_from=0) -> Steps:
        """Run one call of `layout` (`_set_call_layout`'s); `prefix` is a list of (position, token),
        written to the cache; the clean rows' positions and tokens, and the masks' positions, are
        lists; logits of rows `read_from`.. come back."""
        written = len(prefix)
        # The tokens (the masks' included) and positions as host integers, copied to the device
        # when the call runs (with every other request's in a batch); the drafts `verify_ranks`
        # verifies are then rows of that copy.
        tokens = [t for _, t in prefix] + clean_tokens + [self.mask] * len(masks)
        call = Listed(layout, tokens + [i for i, _ in prefix] + clean_positions + masks, read_from)
        logits = yield call
        self.call, self.written, self.clean = call, written, clean_tokens
        self.ran(kind, 0 if kind == "prefill" else written, u)
        return logits

    def ran(self, kind: str, written: int, u: int) -> None:
        """The records of a call that ran: its kind, u, p (the resolved rows it wrote to the cache; 0
        for the prefill) and its resolved count, which `resolve` adds to."""
        self.kinds.append(kind)
        self.u.append(u)
        self.p.append(written)
        self.resolved.append(0)

    def clean_rows(self, count: int):
        """The last call's first `count` clean tokens on the device (the drafts it verifies)."""
        return self.call.uploaded[self.written : self.written + count]

    def run_window(self, kind: str, prefix: list[tuple[int, int]], window: list[int]) -> Steps:
        """A call of the prefix and one mask query per window position, seeing the prefix only;
        commits the prefix and returns the queries' logits."""
        u = len(window)
        logits = yield from self.run(kind, prefix, [], [], _window_layout(len(prefix), u, self.device), window, u,
                                     read_from=len(prefix))  # fmt: skip
        self.model.commit(len(prefix))
        return logits

    def resolve(self, items: list[tuple[int, int]]) -> bool:
        """Record resolved tokens of the current call; emit the newly contiguous ones. True = stop."""
        for position, token in items:
            self.tokens[position] = token
            self.drafts.pop(position, None)
        self.resolved[-1] += len(items)
        self.produced += len(items)
        start = self.contiguous
        while self.contiguous in self.tokens:
            self.contiguous += 1
        new = [self.tokens[i] for i in range(start, self.contiguous)]
        return self.emitter.emit(new) if new else False

    def store(self, positions: list[int], proposed: Proposed, keep: list[int] | None = None) -> None:
        """Keep proposals (those of `keep`, else all) as the next drafts."""
        tokens, q = proposed.tokens, proposed.probs
        for k in range(len(tokens)) if keep is None else keep:
            self.drafts[positions[k]] = (tokens[k], None if q is None else q[k])

    def start_block(self, window: list[int], logits, rows: range) -> Steps:
        """Confidence order, no keys yet: the window's mask rows (`rows` of `logits`) saw exactly R,
        so each is also the verifier's first-rank query for its position. Freeze the keys, resolve
        the most confident position with its own proposal, keep the other proposals as drafts."""
        (proposed,) = yield from self.host(logits, Propose((rows,), confident=True, decides=True))
        self.store(window, proposed)
        return self.begin_block(window, proposed.tokens, proposed.confidence, proposed.deciding)

    def begin_block(self, window: list[int], tokens: list[int], confidence: list[float], deciding) -> bool:
        """A block starts from its proposals (`tokens`, stored as drafts): their `confidence` are its
        frozen keys, and the most confident (the leftmost of equals) resolves; `deciding(k)` is what
        decided proposal k. True = stop."""
        self.keys = dict(zip(window, confidence))
        first = min(range(len(window)), key=lambda k: (-confidence[k], window[k]))
        item = (window[first], tokens[first])
        self.note([window[first] - self.length], deciding(first))
        self.pending = [item]
        return self.resolve([item])

    def verify_ranks(self, sigma: list[int], logits, rows: list[int] | None = None, *more: Propose) -> Steps:
        """Verify the stored drafts of sigma (a prefix of it holds drafts), rank r by the query at
        row rows[r] of `logits` (None: row r); returns h (accepted drafts), the stop flag and the
        results of the round's `more` parts. A correction becomes `pending`."""
        u = len(sigma)
        m = sum(1 for i in sigma if i in self.drafts)
        # The call's clean rows hold sigma's drafts, in order (on the device and on the host).
        drafts, tokens = self.clean_rows(m), self.clean[:m]
        q = None
        if not self.settings.sampling.greedy:
            source = logits.source if type(logits) is Rows else logits
            q = torch.stack([self.drafts[i][1] for i in sigma[:m]]) if m else source.new_zeros((0, source.shape[-1]))
        # Ranks 0..m (all drafted: the last query twice, its bonus dropped).
        if rows is None:
            runs = (range(m + 1),) if m < u else (range(u), range(u - 1, u))
        else:
            runs = runs_of(rows[: m + 1] if m < u else rows + rows[-1:])
        part = Verify(runs, drafts, tokens, q)
        emitted, *later = yield from self.host(logits, part, *more)
        h = m if len(emitted) > u else len(emitted) - 1  # m == u and all accepted: no correction
        return h, self.accept(sigma, m, h, emitted, getattr(emitted, "deciding", None)), later

    def accept(self, sigma: list[int], m: int, h: int, emitted: list[int], deciding) -> bool:
        """Of sigma's m drafts, the first h accepted; `emitted` holds them and, unless all of sigma
        was accepted, the correction or bonus at sigma[h] (which becomes `pending`); `deciding` is
        what decided them. Commit the call's written rows and the accepted drafts, resolve them.
        True = stop."""
        self.draft_proposed += m
        self.draft_accepted += h
        items = list(zip(sigma[:h], emitted[:h]))
        self.pending = [] if h == len(sigma) else [(sigma[h], emitted[h])]
        self.note([i - self.length for i, _ in items + self.pending], deciding)
        self.model.commit(self.p[-1] + h)
        return self.resolve(items + self.pending)

    # ----------------------------------------------------------------- prefill and records
    def prefill(self) -> Steps:
        prompt = list(zip(range(self.length), self.prompt))
        if self.settings.order == "confidence":
            window = self.window()
            logits = yield from self.run_window("prefill", prompt, window)
            return (yield from self.start_block(window, logits, range(len(window))))
        width = self.settings.width if self.drafts_at_prefill else 1
        logits = yield from self.run_window("prefill", prompt, list(range(self.length, self.length + width)))
        # The first token (one draw at T > 0), then the first drafts (their own draws).
        drafting = (Propose((range(1, width),)),) if width > 1 else ()
        first, *drafted = yield from self.host(logits, Propose((range(1),), decides=True), *drafting)
        self.note([0], first.deciding(0))
        if drafted:
            self.store(list(range(self.length + 1, self.length + width)), drafted[0])
        self.pending = [(self.length, first.tokens[0])]
        return self.resolve(self.pending)

    def extra(self) -> dict:
        return {"u": self.u, "p": self.p, "resolved": self.resolved, "call_kinds": self.kinds,
                "order": self.settings.order, "lossless": not self.lossy}  # fmt: skip


class _AR(_SetDecoder):
    name = "ar"  # a window of W positions, resolved one at a time (in confidence order: W matters)
    batched_steps = True  # its host work is Host steps on the logits it slices

    @staticmethod
    def largest_call_rows(width: int) -> int:
        return width + 1  # p + u

    def step(self) -> Steps:
        window = self.window()
        if self.starting:
            logits = yield from self.run_window("ar", self.pending, window)
            return (yield from self.start_block(window, logits, range(len(window))))
        nxt = self.order(window)[0] if self.settings.order == "confidence" else window[0]
        logits = yield from self.run_window("ar", self.pending, [nxt])
        (proposed,) = yield from self.host(logits, Propose((range(1),), decides=True))
        item = (nxt, proposed.tokens[0])
        self.note([nxt - self.length], proposed.deciding(0))
        self.pending = [item]
        return self.resolve([item])


class _Linear(_SetDecoder):
    name = "linear"
    batched_steps = True  # its host work is Host steps on the logits it slices
    calls_per_iteration = 2
    rows_formula = "p+3u_t"  # the paper's maxima take u_t = W and p = 1

    @staticmethod
    def largest_call_rows(width: int) -> int:
        return 2 * width  # the verify call: u clean rows and u masks

    @staticmethod
    def rows_per_iteration(width: int) -> int:
        return 1 + 3 * width

    def step(self) -> Steps:
        window = self.window()
        u = len(window)
        starting = self.starting
        logits = yield from self.run_window("draft", self.pending, window)
        self.pending = []
        (proposed,) = yield from self.host(logits, Propose((range(u),), confident=starting))
        self.store(window, proposed)
        if starting:
            self.keys = dict(zip(window, proposed.confidence))
        sigma = self.order(window)
        clean = [self.drafts[i][0] for i in sigma]
        # Logits of the queries only (the clean rows' are never read).
        logits = yield from self.run("verify", [], sigma, clean, _verify_layout(0, u, u, self.device), sigma, u, read_from=u)
        _, done, _ = yield from self.verify_ranks(sigma, logits)
        return done


class _Packed(_SetDecoder):
    name = "packed"
    batched_steps = True  # its host work is Host steps on the logits it slices
    drafts_at_prefill = True
    rows_formula = "p+3u_t"

    @staticmethod
    def largest_call_rows(width: int) -> int:
        return 1 + 3 * width

    @staticmethod
    def rows_per_iteration(width: int) -> int:
        return 1 + 3 * width

    def step(self) -> Steps:
        window = self.window()
        u, p = len(window), len(self.pending)
        starting = self.starting
        sigma = self.order(window)
        drafts = self.drafts
        m = 0 if starting else sum(1 for i in sigma if i in drafts)  # sigma's drafted positions come first
        clean = [drafts[i][0] for i in sigma[:m]] + [self.mask] * (u - m)
        layout = _packed_layout(p, u, m, starting, self.device)
        # Logits of the queries and the draft rows only (the p and clean rows' are never read).
        logits = yield from self.run("packed", self.pending, sigma, clean, layout, sigma + window, u, read_from=p + u)
        draft_rows = range(u, 2 * u)
        if starting:
            self.model.commit(p)
            return (yield from self.start_block(window, logits, draft_rows))
        # One call ahead: every draft row proposes (so the random stream does not depend on what
        # the verification resolved); the proposals at positions it resolved are dropped.
        _, done, (ahead,) = yield from self.verify_ranks(sigma, logits, None, Propose((draft_rows,)))
        self.drafts = {}
        self.store(window, ahead, [k for k, position in enumerate(window) if position not in self.tokens])
        return done


class _Quadratic(_SetDecoder):
    name = "quadratic"
    batched_steps = True  # its host work is Host steps on the logits it slices
    drafts_at_prefill = True
    rows_formula = "p+2u_t+u_t^2"

    @staticmethod
    def largest_call_rows(width: int) -> int:
        return 1 + 2 * width + width * width

    @staticmethod
    def rows_per_iteration(width: int) -> int:
        return 1 + 2 * width + width * width

    def step(self) -> Steps:
        window = self.window()
        u, p, width = len(window), len(self.pending), self.settings.width
        starting = self.starting
        sigma = self.order(window)
        real = [i in self.drafts and not starting for i in sigma]
        clean = [self.drafts[i][0] if r else self.mask for i, r in zip(sigma, real)]
        # Block k (k = 0..u) sees the clean ranks < k: its rows are the positions still open after
        # accepting k drafts (row 0 is the rank-k query), filled to u rows.
        blocks, levels, block_real = [], [], []
        for k in range(u + 1):
            if self.settings.order == "ltr":
                rows = list(range(window[0] + k, window[0] + k + width))[:u]
                ok = [True] * u
            elif starting:
                rows, ok = (list(window), [True] * u) if k == 0 else ([window[-1]] * u, [False] * u)
            else:
                rows = sigma[k:] + [window[-1]] * k
                ok = [True] * (u - k) + [False] * k
            blocks.append(rows)
            levels += [k] * u
            block_real += ok
        masks = [i for rows in blocks for i in rows]
        # Logits of the blocks only (the p and clean rows' are never read): block k's rows k u ..
        layout = _set_call_layout(p, tuple(real), tuple(levels), tuple(block_real), self.device)
        logits = yield from self.run("quadratic", self.pending, sigma, clean, layout, masks, u, read_from=p + u)
        if starting:
            self.model.commit(p)
            return (yield from self.start_block(window, logits, range(u)))
        h, done, _ = yield from self.verify_ranks(sigma, logits, [k * u for k in range(u)])
        self.drafts = {}
        rows, ok = blocks[h], block_real[h * u : (h + 1) * u]
        skip = 0 if h == u else 1  # after a correction, row 0 sits at the corrected position
        keep = [k for k in range(skip, u) if ok[k] and rows[k] not in self.tokens]
        if keep:
            (proposed,) = yield from self.host(logits, Propose(runs_of([h * u + k for k in keep])))
            self.store([rows[k] for k in keep], proposed)
        return done


class _Native(_SetDecoder):
    name = "native"
    batched_steps = True  # its host work is Host steps on the logits it slices
    lossy = True

    @staticmethod
    def largest_call_rows(width: int) -> int:
        return 2 * width  # p + u with p <= W (its own window)

    def confidences(self, proposed: Proposed) -> list[float]:
        return proposed.confidence

    def resolve_confident(self, window: list[int], logits) -> Steps:
        """SetDLM's own decoder: propose for every open position of the window; resolve the most
        confident proposal and every proposal at least `confidence_threshold` confident."""
        (proposed,) = yield from self.host(logits, Propose((range(len(window)),), confident=True))
        conf, tokens = self.confidences(proposed), proposed.tokens
        # As the released sampler: of equally confident proposals the rightmost position wins,
        # and the threshold is compared in float32, where a probability of exactly float32(0.9)
        # passes.
        best = max(range(len(window)), key=lambda k: (conf[k], window[k]))
        threshold = torch.tensor(self.settings.confidence_threshold, dtype=torch.float32).item()
        chosen = [k for k in range(len(window)) if k == best or conf[k] >= threshold]
        items = [(window[k], tokens[k]) for k in chosen]
        self.pending = items  # by position: the next call writes them in this order
        return self.resolve(items)

    def prefill(self) -> Steps:
        window = self.window()
        logits = yield from self.run_window("prefill", list(enumerate(self.prompt)), window)
        return (yield from self.resolve_confident(window, logits))

    def step(self) -> Steps:
        window = self.window()
        return (yield from self.resolve_confident(window, (yield from self.run_window("native", self.pending, window))))


ANYORDER_DECODERS: tuple[type[Decoder], ...] = (_AR, _Linear, _Quadratic, _Packed, _Native)
ANYORDER_SCHEDULES = tuple(decoder.name for decoder in ANYORDER_DECODERS)


def decode_anyorder(
    model: CallModel,
    prompt: Sequence[int],
    settings: AnyOrderSettings,
    stop_check: StopCheck | None = None,
) -> Decoded:
    """Decode one response of a set model with the chosen any-order schedule."""
    return drive(model, prompt, settings, stop_check, schedule_named(ANYORDER_DECODERS, settings.schedule))
