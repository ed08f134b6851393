"""The any-order ("set") family of SPEC §3: ar, linear, packed, quadratic and native decoding of a
set model such as SetDLM. See the README, "The any-order family", for the rules and record identities.

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

from collections.abc import Sequence
from dataclasses import dataclass

import torch

from packedss.decoding.calls import Call, CallModel, Role
from packedss.decoding.trace import Decoded, Emitter, Meter, StopCheck, check_request
from packedss.decoding.verify import Sampling, next_token, probabilities, propose, verify

ANYORDER_SCHEDULES = ("ar", "linear", "packed", "quadratic", "native")
ORDERS = ("ltr", "confidence")


@dataclass(frozen=True)
class AnyOrderSettings:
    schedule: str  # one of ANYORDER_SCHEDULES
    width: int  # W: the active window
    max_new_tokens: int
    eos_token_ids: tuple[int, ...]
    sampling: Sampling
    order: str = "ltr"  # verification order: "ltr" or "confidence" (native ignores it)
    confidence_threshold: float = 0.9  # native: also resolve every proposal at least this confident
    timing: str = "sync"  # how model time is measured on CUDA: "sync" or "events" (see trace.Meter)


def set_call(
    prefix_tokens: torch.Tensor,
    prefix_positions: torch.Tensor,
    clean_tokens: torch.Tensor,
    clean_positions: torch.Tensor,
    clean_real: torch.Tensor,
    mask_positions: torch.Tensor,
    mask_levels: torch.Tensor,
    mask_real: torch.Tensor,
    mask_token_id: int,
) -> Call:
    """One call of the set family. Rows: prefix (resolved tokens written now: the prompt, the
    correction p, or native's new tokens; causal among themselves), then clean draft rows in
    verification order (row r sees the prefix and clean rows 0..r), then mask rows (mask j sees
    the prefix, the clean rows of rank < mask_levels[j], and itself). Rows marked not real
    (placeholders, padding) get Role.PAD; a PAD mask row sees only itself."""
    device = prefix_tokens.device
    n_prefix, n_clean, n_mask = prefix_tokens.shape[0], clean_tokens.shape[0], mask_positions.shape[0]
    rows = n_prefix + n_clean + n_mask
    attend = torch.zeros(rows, rows, dtype=torch.bool, device=device)
    sees_prefix = n_prefix + n_clean
    attend[:sees_prefix, :sees_prefix] = torch.ones(sees_prefix, sees_prefix, dtype=torch.bool, device=device).tril_()
    masks = slice(sees_prefix, rows)
    attend[masks, :n_prefix] = mask_real[:, None]
    ranks = torch.arange(n_clean, device=device)
    attend[masks, n_prefix:sees_prefix] = (ranks[None, :] < mask_levels[:, None]) & mask_real[:, None]
    attend[masks, masks] = torch.eye(n_mask, dtype=torch.bool, device=device)
    roles = torch.cat(
        [
            torch.full((n_prefix,), int(Role.VERIFY), dtype=torch.uint8, device=device),
            torch.where(clean_real, int(Role.VERIFY), int(Role.PAD)).to(torch.uint8),
            torch.where(mask_real, int(Role.DRAFT), int(Role.PAD)).to(torch.uint8),
        ]
    )
    tokens = torch.cat([prefix_tokens, clean_tokens, torch.full((n_mask,), mask_token_id, dtype=torch.long, device=device)])
    positions = torch.cat([prefix_positions, clean_positions, mask_positions])
    return Call(tokens=tokens, positions=positions, roles=roles, attend=attend)


def _long(values: Sequence[int], device) -> torch.Tensor:
    return torch.tensor(list(values), dtype=torch.long, device=device)


def _bools(values: Sequence[bool], device) -> torch.Tensor:
    return torch.tensor(list(values), dtype=torch.bool, device=device)


class _Decoder:
    """State of one response: resolved tokens by position, the uncached resolved tokens, the
    stored drafts, the frozen confidence keys of the current block, and the per-call records."""

    def __init__(self, model: CallModel, prompt: Sequence[int], s: AnyOrderSettings, stop_check: StopCheck | None):
        self.model, self.s = model, s
        self.device = model.device
        self.mask = int(model.mask_token_id)
        self.prompt = list(prompt)
        self.length = len(self.prompt)
        self.meter = Meter(model, s.timing)
        self.emitter = Emitter(s.max_new_tokens, s.eos_token_ids, stop_check)
        self.tokens: dict[int, int] = {}  # resolved generation position -> token
        self.contiguous = self.length  # every position < this one is resolved
        self.pending: list[tuple[int, int]] = []  # resolved, not yet in the cache (decoding order)
        self.drafts: dict[int, tuple[int, torch.Tensor | None]] = {}  # position -> (token, q row)
        self.keys: dict[int, float] | None = None  # confidence order: frozen keys of the block
        self.block_start = self.length
        self.u: list[int] = []
        self.p: list[int] = []
        self.resolved: list[int] = []
        self.hits: list[int] = []  # per call: drafts accepted by its verification
        self.kinds: list[str] = []
        self.accepted: list[int] = []
        self.proposed = self.drafted_ok = 0

    # ----------------------------------------------------------------- window and order
    def window(self) -> list[int]:
        """U: the unresolved positions of the active window, by position."""
        width = self.s.width
        if self.s.order == "confidence" and self.s.schedule != "native":
            block = range(self.block_start, self.block_start + width)
            unresolved = [i for i in block if i not in self.tokens]
            if unresolved:
                return unresolved
            self.block_start, self.keys = self.contiguous, None  # the block is done: start the next
            return list(range(self.block_start, self.block_start + width))
        end = self.contiguous + width
        if self.s.schedule == "native":  # SetDLM's sequence holds max_new_tokens masks, no more
            end = min(end, self.length + self.s.max_new_tokens)
        return [i for i in range(self.contiguous, end) if i not in self.tokens]

    def order(self, window: list[int]) -> list[int]:
        """Verification order: positions with a stored draft first (by position for ltr, by the
        block's frozen drafter confidence, high first, for confidence), then the rest by position."""
        if self.s.order == "ltr" or self.keys is None:
            return sorted(window, key=lambda i: (i not in self.drafts, i))
        return sorted(window, key=lambda i: (i not in self.drafts, -self.keys.get(i, float("-inf")), i))

    def confidences(self, logits: torch.Tensor, drafts: torch.Tensor) -> list[float]:
        """Drafter confidence: the probability the drafter gave its proposal (softmax at T, or at
        T = 1 when greedy)."""
        temperature = self.s.sampling.temperature or 1.0
        probs = probabilities(logits, temperature)
        return probs.gather(1, drafts.view(-1, 1)).view(-1).tolist()

    # ----------------------------------------------------------------- running calls
    def run(self, kind, prefix, clean, clean_real, masks, levels, mask_real, u):
        """Build and run one call; `prefix` is a list of (position, token) written to the cache."""
        d = self.device
        call = set_call(
            _long([t for _, t in prefix], d),
            _long([i for i, _ in prefix], d),
            _long([t for _, t in clean], d),
            _long([i for i, _ in clean], d),
            _bools(clean_real, d),
            _long(masks, d),
            _long(levels, d),
            _bools(mask_real, d),
            self.mask,
        )
        logits = self.meter.run(call)
        self.kinds.append(kind)
        self.u.append(u)
        self.p.append(0 if kind == "prefill" else len(prefix))
        self.resolved.append(0)
        self.hits.append(0)
        return logits

    def resolve(self, items: list[tuple[int, int]]) -> bool:
        """Record resolved tokens of the current call; emit the newly contiguous ones. True = stop."""
        for position, token in items:
            self.tokens[position] = token
            self.drafts.pop(position, None)
        self.resolved[-1] += len(items)
        start = self.contiguous
        while self.contiguous in self.tokens:
            self.contiguous += 1
        new = [self.tokens[i] for i in range(start, self.contiguous)]
        return self.emitter.emit(new) if new else False

    def store_drafts(self, positions: list[int], logits: torch.Tensor) -> tuple[list[int], list[float]]:
        """Propose for `positions` from their mask rows; keep them as the next drafts."""
        tokens, q = propose(logits, self.s.sampling)
        listed = tokens.tolist()
        for k, position in enumerate(positions):
            self.drafts[position] = (listed[k], None if q is None else q[k])
        return listed, self.confidences(logits, tokens)

    def start_block(self, window: list[int], logits: torch.Tensor) -> bool:
        """Confidence order, no keys yet: the window's mask rows saw exactly R, so each is also the
        verifier's first-rank query for its position. Freeze the keys, resolve the most confident
        position with its own proposal, keep the other proposals as drafts."""
        tokens, conf = self.store_drafts(window, logits)
        self.keys = dict(zip(window, conf))
        first = min(range(len(window)), key=lambda k: (-conf[k], window[k]))
        item = (window[first], tokens[first])
        self.pending = [item]
        return self.resolve([item])

    def verify_ranks(self, sigma: list[int], query_logits: torch.Tensor) -> tuple[int, bool]:
        """Verify the stored drafts of sigma (a prefix of it holds drafts) with one query row per
        rank; returns h (accepted drafts) and the stop flag. A correction becomes `pending`."""
        u = len(sigma)
        m = sum(1 for i in sigma if i in self.drafts)
        drafts = torch.tensor([self.drafts[i][0] for i in sigma[:m]], dtype=torch.long, device=self.device)
        q = None
        if not self.s.sampling.greedy:
            empty = query_logits.new_zeros((0, query_logits.shape[-1]))
            q = torch.stack([self.drafts[i][1] for i in sigma[:m]]) if m else empty
        rows = query_logits[: m + 1] if m < u else torch.cat([query_logits, query_logits[-1:]])
        emitted = verify(rows, drafts, q, self.s.sampling)
        h = m if len(emitted) > u else len(emitted) - 1  # m == u and all accepted: no correction
        self.proposed += m
        self.drafted_ok += h
        self.hits[-1] = h
        items = list(zip(sigma[:h], emitted[:h]))
        self.pending = [] if h == u else [(sigma[h], emitted[h])]
        self.model.commit(self.p[-1] + h)
        return h, self.resolve(items + self.pending)

    # ----------------------------------------------------------------- prefill
    def prefill(self) -> bool:
        prompt = list(zip(range(self.length), self.prompt))
        s = self.s
        if s.schedule == "native":
            window = self.window()
            logits = self.run("prefill", prompt, [], [], window, [0] * len(window), [True] * len(window), len(window))
            self.model.commit(self.length)
            return self.native_resolve(window, logits[self.length :])
        if s.order == "confidence":
            window = self.window()
            logits = self.run("prefill", prompt, [], [], window, [0] * len(window), [True] * len(window), len(window))
            self.model.commit(self.length)
            return self.start_block(window, logits[self.length :])
        one_call = s.schedule in ("packed", "quadratic")
        window = list(range(self.length, self.length + (s.width if one_call else 1)))
        logits = self.run("prefill", prompt, [], [], window, [0] * len(window), [True] * len(window), len(window))
        self.model.commit(self.length)
        first = next_token(logits[self.length], s.sampling).tolist()[0]
        if one_call and s.width > 1:
            self.store_drafts(window[1:], logits[self.length + 1 :])
        self.pending = [(self.length, first)]
        return self.resolve(self.pending)

    # ----------------------------------------------------------------- schedules
    def step_ar(self) -> bool:
        window = self.window()
        if self.s.order == "confidence" and self.keys is None:
            logits = self.run("ar", self.pending, [], [], window, [0] * len(window), [True] * len(window), len(window))
            self.model.commit(len(self.pending))
            return self.start_block(window, logits[self.p[-1] :])
        nxt = self.order(window)[0] if self.s.order == "confidence" else window[0]
        logits = self.run("ar", self.pending, [], [], [nxt], [0], [True], 1)
        self.model.commit(len(self.pending))
        item = (nxt, next_token(logits[-1], self.s.sampling).tolist()[0])
        self.pending = [item]
        return self.resolve([item])

    def step_linear(self) -> bool:
        window = self.window()
        u = len(window)
        logits = self.run("draft", self.pending, [], [], window, [0] * u, [True] * u, u)
        self.model.commit(len(self.pending))
        self.pending = []
        tokens, conf = self.store_drafts(window, logits[self.p[-1] :])
        if self.s.order == "confidence" and self.keys is None:
            self.keys = dict(zip(window, conf))
        sigma = self.order(window)
        clean = [(i, self.drafts[i][0]) for i in sigma]
        logits = self.run("verify", [], clean, [True] * u, sigma, list(range(u)), [True] * u, u)
        _, done = self.verify_ranks(sigma, logits[u:])
        return done

    def step_packed(self) -> bool:
        window = self.window()
        u, p = len(window), len(self.pending)
        starting = self.s.order == "confidence" and self.keys is None
        sigma = self.order(window)
        real = [i in self.drafts and not starting for i in sigma]
        clean = [(i, self.drafts[i][0] if r else self.mask) for i, r in zip(sigma, real)]
        first_missing = real.index(False) if False in real else u
        query_real = [r < first_missing + 1 and not starting for r in range(u)]
        masks = sigma + window
        levels = list(range(u)) + [0] * u
        logits = self.run("packed", self.pending, clean, real, masks, levels, query_real + [True] * u, u)
        draft_logits = logits[p + 2 * u :]
        if starting:
            self.model.commit(p)
            return self.start_block(window, draft_logits)
        h, done = self.verify_ranks(sigma, logits[p + u : p + 2 * u])
        self.drafts = {}
        # One call ahead: the proposals saw R before this call's verification; keep the
        # ones at positions still unresolved as the next drafts.
        self.store_drafts(window, draft_logits)
        for i in list(self.drafts):
            if i in self.tokens:
                del self.drafts[i]
        return done

    def step_quadratic(self) -> bool:
        window = self.window()
        u, p, width = len(window), len(self.pending), self.s.width
        starting = self.s.order == "confidence" and self.keys is None
        sigma = self.order(window)
        real = [i in self.drafts and not starting for i in sigma]
        clean = [(i, self.drafts[i][0] if r else self.mask) for i, r in zip(sigma, real)]
        # Block k (k = 0..u) sees the clean ranks < k: its rows are the positions still open after
        # accepting k drafts (row 0 is the rank-k query), filled to u rows.
        blocks, levels, block_real = [], [], []
        for k in range(u + 1):
            if self.s.order == "ltr":
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
        logits = self.run("quadratic", self.pending, clean, real, masks, levels, block_real, u)
        block_logits = logits[p + u :].view(u + 1, u, -1)
        if starting:
            self.model.commit(p)
            return self.start_block(window, block_logits[0])
        h, done = self.verify_ranks(sigma, block_logits[:u, 0])
        self.drafts = {}
        rows, ok = blocks[h], block_real[h * u : (h + 1) * u]
        skip = 0 if h == u else 1  # after a correction, row 0 sits at the corrected position
        keep = [k for k in range(skip, u) if ok[k] and rows[k] not in self.tokens]
        if keep:
            self.store_drafts([rows[k] for k in keep], block_logits[h, keep])
        return done

    def native_resolve(self, window: list[int], logits: torch.Tensor) -> bool:
        """SetDLM's own decoder: propose for every open position of the window; resolve the most
        confident proposal and every proposal at least `confidence_threshold` confident."""
        tokens, q = propose(logits, self.s.sampling)
        conf = self.confidences(logits, tokens)
        tokens = tokens.tolist()
        best = max(range(len(window)), key=lambda k: (conf[k], -window[k]))
        chosen = [k for k in range(len(window)) if k == best or conf[k] >= self.s.confidence_threshold]
        items = [(window[k], tokens[k]) for k in chosen]
        self.pending = items  # by position: the next call writes them in this order
        return self.resolve(items)

    def step_native(self) -> bool:
        window = self.window()
        u = len(window)
        logits = self.run("native", self.pending, [], [], window, [0] * u, [True] * u, u)
        self.model.commit(len(self.pending))
        return self.native_resolve(window, logits[self.p[-1] :])

    # ----------------------------------------------------------------- driver
    def decode(self) -> Decoded:
        step = {
            "ar": self.step_ar,
            "linear": self.step_linear,
            "packed": self.step_packed,
            "quadratic": self.step_quadratic,
            "native": self.step_native,
        }[self.s.schedule]
        done = self.prefill()
        while not done:
            calls = len(self.resolved)
            done = step()
            self.accepted.append(sum(self.resolved[calls:]))
        output = len(self.emitter.tokens)
        # Resolved tokens that are not in the output: cut by a stop, or resolved beyond its end.
        self.emitter.truncated_tokens = sum(self.resolved) - output
        extra = {
            "u": self.u,
            "p": self.p,
            "resolved": self.resolved,
            "drafts_accepted": self.hits,
            "call_kinds": self.kinds,
            "order": self.s.order,
            "lossless": self.s.schedule != "native",
        }
        return self.meter.finish(self.emitter, self.length, self.accepted, self.proposed, self.drafted_ok, extra)


def decode_anyorder(
    model: CallModel,
    prompt: Sequence[int],
    settings: AnyOrderSettings,
    stop_check: StopCheck | None = None,
) -> Decoded:
    """Decode one response of a set model with the chosen any-order schedule."""
    check_request(settings.schedule, ANYORDER_SCHEDULES, settings.width, settings.max_new_tokens, prompt)
    if settings.order not in ORDERS:
        raise ValueError(f"unknown verification order {settings.order!r}; valid: {ORDERS}")
    model.reset()
    try:
        return _Decoder(model, prompt, settings, stop_check).decode()
    finally:
        model.reset()
