"""The one primitive every schedule uses: a call.

A call is a packed list of rows, each row = (token id or MASK, position id, role),
plus an attention rule over [KV cache + rows]. Every row sees the whole committed
cache; `attend[i, j]` says whether row i also sees row j of the same call. A model
adapter turns a call into one forward pass and returns one logit vector per row.
The schedule then commits a prefix of the call's rows (a cache crop).
"""

from __future__ import annotations

import enum
from dataclasses import dataclass, field
from typing import NamedTuple, Protocol

import torch

from packedss.decoding.rows import Rows, uploaded


class Role(enum.IntEnum):
    """What a row is for. VERIFY rows are read in AR mode (clean tokens, causal),
    DRAFT rows belong to a diffusion block (proposal rows; the LoRA of the
    proposal-only adapter applies to them), PAD rows only fill a segment to a fixed
    size and are never read."""

    VERIFY = 0
    DRAFT = 1
    PAD = 2


class Rule(enum.Enum):
    """What a call's `attend` is, stated by the builder that made it, so that an adapter can run
    the call without a dense mask where the rule allows it (models.md §2). CUSTOM is always
    correct: the rule is then read from `attend` itself."""

    CAUSAL = "causal"  # row i sees rows 0..i of its call (the lower triangle)
    FULL = "full"  # every row sees every row of its call
    CUSTOM = "custom"  # any other pattern


@dataclass(frozen=True)
class Call:
    tokens: torch.Tensor  # (R,) long: token id, or the model's mask id
    positions: torch.Tensor  # (R,) long: position id of each row
    roles: torch.Tensor  # (R,) uint8: Role of each row
    attend: torch.Tensor  # (R, R) bool: attend[i, j] = row i sees row j of this call
    # Rows that are not padding, and DRAFT rows, when the builder knows them on the host (then
    # `rows_useful` and `draft_rows` do not read `roles` back from the device, which would
    # synchronize a CUDA stream).
    useful: int | None = field(default=None, compare=False)
    drafts: int | None = field(default=None, compare=False)
    # Rows before this one are context (their KV is written, their output never read, e.g. a
    # prompt's rows before its last): a model returns logits for rows read_from.. only.
    read_from: int = field(default=0, compare=False)
    rule: Rule = field(default=Rule.CUSTOM, compare=False)  # what `attend` is (Rule)

    @property
    def rows(self) -> int:
        return int(self.tokens.shape[0])

    @property
    def rows_useful(self) -> int:
        """Rows that are not padding (their output is read or their KV may be committed)."""
        if self.useful is not None:
            return self.useful
        return self.rows - int((self.roles == Role.PAD).sum())

    @property
    def draft_rows(self) -> int:
        """Rows of a diffusion block (the rows the proposal LoRA applies to)."""
        if self.drafts is not None:
            return self.drafts
        return int((self.roles == Role.DRAFT).sum())


class CallModel(Protocol):
    """What a schedule and its call meter need from a model. Implemented by the adapters in
    packedss.models (whose base class, BackboneAdapter, adds what the runner and the static path
    use) and by the tests' toy models."""

    device: torch.device
    mask_token_id: int
    # The model's own statistics of its last call, by name (e.g. the proposal LoRA's rows); the
    # meter appends each to the record's per-call list of that name. Empty when it keeps none.
    call_stats: dict[str, int]

    def run(self, call: Call) -> torch.Tensor:
        """Execute the call in one forward pass; return logits (R - call.read_from, V) of rows
        read_from.. (float32, or the model's dtype when wider). The KV of every row is held
        tentatively until `commit`."""

    def commit(self, rows: int) -> None:
        """Keep the KV of the first `rows` rows of the last call, drop the rest."""

    def reset(self) -> None:
        """Drop the whole cache (a new response)."""

    def synchronize(self) -> None:
        """Wait for the device (CUDA) so that a call's time can be measured."""


@dataclass(frozen=True)
class Segment:
    """Rows of a call under construction; `attend` is the segment's internal rule."""

    tokens: torch.Tensor
    positions: torch.Tensor
    roles: torch.Tensor
    attend: torch.Tensor
    pads: int | None = None  # PAD rows and DRAFT rows, counted on the host (None: not counted)
    drafts: int | None = None
    rule: Rule = Rule.CUSTOM

    @property
    def rows(self) -> int:
        return int(self.tokens.shape[0])


def _segment(tokens: torch.Tensor, positions: torch.Tensor, role: Role, attend: torch.Tensor, rule: Rule) -> Segment:
    rows = tokens.shape[0]
    roles = torch.full((rows,), int(role), dtype=torch.uint8, device=tokens.device)
    return Segment(tokens, positions, roles, attend, rows if role == Role.PAD else 0, rows if role == Role.DRAFT else 0,
                   rule)  # fmt: skip


def causal_segment(tokens: torch.Tensor, first_position: int) -> Segment:
    """Clean rows in AR mode: consecutive positions, each row sees itself and earlier rows."""
    rows = tokens.shape[0]
    positions = torch.arange(first_position, first_position + rows, device=tokens.device)
    attend = torch.ones(rows, rows, dtype=torch.bool, device=tokens.device).tril_()
    return _segment(tokens, positions, Role.VERIFY, attend, Rule.CAUSAL)


def block_segment(tokens: torch.Tensor, first_position: int) -> Segment:
    """A diffusion block: consecutive positions, every row sees every row of the block."""
    rows = tokens.shape[0]
    positions = torch.arange(first_position, first_position + rows, device=tokens.device)
    attend = torch.ones(rows, rows, dtype=torch.bool, device=tokens.device)
    return _segment(tokens, positions, Role.DRAFT, attend, Rule.FULL)


def pad_segment(rows: int, mask_token_id: int, position: int, device: torch.device) -> Segment:
    """Padding rows (MASK tokens at one position) that see only themselves; their output is never read."""
    tokens = torch.full((rows,), mask_token_id, dtype=torch.long, device=device)
    positions = torch.full((rows,), position, dtype=torch.long, device=device)
    attend = torch.eye(rows, dtype=torch.bool, device=device)
    return _segment(tokens, positions, Role.PAD, attend, Rule.CUSTOM)


def draft_block(last_token: torch.Tensor, last_position: int, width: int, mask_token_id: int) -> Segment:
    """The LTR drafter's block [last@n, MASK@n+1..n+W] (B = W+1 rows)."""
    masks = torch.full((width,), mask_token_id, dtype=torch.long, device=last_token.device)
    return block_segment(torch.cat([last_token.view(1), masks]), last_position)


def pack(segments: list[Segment], sees: dict[tuple[int, int], torch.Tensor] | None = None, read_from: int = 0) -> Call:
    """Concatenate segments into one call. Segments do not see each other unless `sees`
    maps (i, j) to a bool matrix (rows of segment i x rows of segment j) of extra visibility.
    Logits come back for rows `read_from`.. only (Call.read_from). The call's rule is its one
    segment's (with no `sees`), else CUSTOM."""
    device = segments[0].tokens.device
    sizes = [s.rows for s in segments]
    starts = [sum(sizes[:k]) for k in range(len(sizes))]
    total = sum(sizes)
    attend = torch.zeros(total, total, dtype=torch.bool, device=device)
    for k, seg in enumerate(segments):
        attend[starts[k] : starts[k] + sizes[k], starts[k] : starts[k] + sizes[k]] = seg.attend
    for (i, j), block in (sees or {}).items():
        attend[starts[i] : starts[i] + sizes[i], starts[j] : starts[j] + sizes[j]] = block
    return Call(
        tokens=torch.cat([s.tokens for s in segments]),
        positions=torch.cat([s.positions for s in segments]),
        roles=torch.cat([s.roles for s in segments]),
        attend=attend,
        useful=None if None in (s.pads for s in segments) else total - sum(s.pads for s in segments),
        drafts=None if None in (s.drafts for s in segments) else sum(s.drafts for s in segments),
        read_from=read_from,
        rule=segments[0].rule if len(segments) == 1 and not sees else Rule.CUSTOM,
    )


@dataclass(frozen=True)
class Layout:
    """The fixed part of every call of one shape: the roles, the attention rule (`attend` and what
    it is, `rule`) and the count of useful rows. Built once per shape (and device) with `pack`, then shared by every call of that
    shape, which only fills in its tokens and positions. The tensors are shared: never write to them."""

    roles: torch.Tensor
    attend: torch.Tensor
    useful: int
    drafts: int
    rule: Rule = Rule.CUSTOM

    def call(self, tokens: torch.Tensor, positions: torch.Tensor) -> Call:
        return Call(tokens, positions, self.roles, self.attend, useful=self.useful, drafts=self.drafts, rule=self.rule)


def layout_of(call: Call) -> Layout:
    """The layout of a call built once (its tokens and positions are dropped)."""
    return Layout(call.roles, call.attend, call.rows_useful, call.draft_rows, call.rule)


class Planned(NamedTuple):
    """A call of a shared layout whose tokens are still parts (the filled-in rows, then constant
    masks) and whose positions are `offsets` + `position`. Alone, a driver builds it (one `cat`
    and one add); the batch engine (packedss.decoding.engine) builds every request's planned call
    of a round into one batched call instead, without a tensor op per request."""

    layout: Layout
    offsets: torch.Tensor  # (R,) long: each row's position minus `position`
    parts: list  # token parts, in row order
    position: int

    def build(self) -> Call:
        return self.layout.call(torch.cat(self.parts), self.offsets + self.position)


class Listed:
    """A call of a shared layout whose tokens and positions are still host integers: `ids` holds
    its R tokens, then its R positions. It is copied to the device when it runs: alone by `build`,
    one copy per call; in a batch by the engine (packedss.decoding.engine), one copy for every
    listed call of the round. Either way its tokens are then rows `start`.. of `copy`, and
    `uploaded` names them, for a decoder to slice (its drafts)."""

    __slots__ = ("layout", "ids", "read_from", "copy", "start")

    def __init__(self, layout: Layout, ids: list[int], read_from: int):
        self.layout, self.ids, self.read_from = layout, ids, read_from
        self.copy: torch.Tensor | None = None
        self.start = 0

    @property
    def uploaded(self) -> Rows:
        """Its tokens on the device: Rows of the copy that holds them."""
        return Rows(self.copy, self.start, self.start + (len(self.ids) >> 1))

    def build(self) -> Call:
        rows, layout = len(self.ids) >> 1, self.layout
        self.copy, self.start = uploaded(self.ids, layout.roles.device), 0
        return Call(self.copy[:rows], self.copy[rows:], layout.roles, layout.attend, useful=layout.useful,
                    drafts=layout.drafts, read_from=self.read_from, rule=layout.rule)  # fmt: skip
