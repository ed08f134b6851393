"""A fast, exact toy dual-mode model implementing the call protocol in plain Python/torch.

Each row's logits are a deterministic pseudo-random function of what the row can see: an AR
(clean) row at position j gets logits for j+1 from the clean tokens visible to it; a mask row
at position i gets drafter logits from the visible clean tokens and i. The drafter at the first
masked position leans towards the verifier (so drafts are accepted often, but not always).
Used for the statistical tests, where thousands of decodes must run in seconds."""

from __future__ import annotations

import random

import torch

from packedss.decoding.calls import Call


class ToyLTRModel:
    def __init__(self, vocab: int = 8, seed: int = 0, agreement: float = 1.5):
        self.vocab = vocab
        self.mask_token_id = vocab  # outside the predicted vocabulary
        self.device = torch.device("cpu")
        self.call_stats: dict[str, int] = {}
        self.seed = seed
        self.agreement = agreement
        self.committed: list[tuple[int, int]] = []  # (position, token)
        self._pending: list[tuple[int, int, bool]] = []
        self._table: dict[tuple, torch.Tensor] = {}

    def _logits(self, key: tuple) -> torch.Tensor:
        if key not in self._table:
            # seeded by the key's text, not hash(): str hashes change with each process's PYTHONHASHSEED
            rng = random.Random(repr((self.seed,) + key))
            self._table[key] = torch.tensor([rng.gauss(0.0, 1.5) for _ in range(self.vocab)], dtype=torch.float64)
        return self._table[key]

    def ar_logits(self, prefix: tuple[int, ...]) -> torch.Tensor:
        return self._logits(("ar",) + prefix)

    def run(self, call: Call) -> torch.Tensor:
        tokens, positions, attend = call.tokens.tolist(), call.positions.tolist(), call.attend.tolist()
        out = []
        for r in range(call.read_from, call.rows):  # logits of the rows that are read only
            visible = list(self.committed) + [
                (positions[j], tokens[j]) for j in range(call.rows) if attend[r][j] and tokens[j] != self.mask_token_id
            ]
            prefix = tuple(t for _, t in sorted(visible))
            if tokens[r] != self.mask_token_id:
                out.append(self.ar_logits(prefix))
                continue
            last_clean = max(p for p, _ in visible)
            noise = self._logits(("draft", positions[r]) + prefix)
            if positions[r] == last_clean + 1:
                out.append(self.agreement * self.ar_logits(prefix) + noise)
            else:
                out.append(noise)
        self._pending = [(positions[r], tokens[r]) for r in range(call.rows)]
        return torch.stack(out)

    def commit(self, rows: int) -> None:
        self.committed.extend(self._pending[:rows])
        self._pending = []

    def reset(self) -> None:
        self.committed, self._pending = [], []

    def synchronize(self) -> None:
        pass
