"""Compiled calls checked against eager ones: before a compiled call's time is kept, the same
input runs on the eager adapter and on its compiled twin (same weights, same cache contents,
same device), and their logits must agree within what rounding alone explains
(docs/performance.md §8). A graph that replays stale input buffers, or hands out an output a
later replay overwrote, gives clean timings of a wrong call; this check fails it."""

from __future__ import annotations

import math

import torch

from packedss.models.adapter import BackboneAdapter

GRAPH_ARGMAX_MIN = 0.99
GRAPH_DIFFERS = "graph replay differs from eager"
# Roundings of a layer's outputs on one path that the other may skip: 2 norms, q, k, v, RoPE,
# attention, o, gate, up, SiLU x up, down and the 2 residual adds.
ROUNDINGS_PER_LAYER = 14
TOLERANCE_SIGMAS = 8  # the largest of 64 x 131,072 Gaussian differences is about 5.7 sigmas


def graph_vs_eager(eager: BackboneAdapter, compiled: BackboneAdapter, call, tolerance: float) -> dict:
    """One call's logits on the eager adapter and on its compiled twin (same weights, same cache
    contents, same device), compared by `compare_logits` (`tolerance`: relative to the eager
    logits' RMS)."""
    logits = []
    for adapter in (eager, compiled):
        logits.append(adapter.run(call))
        adapter.commit(0)
    return {"rows": call.rows, **compare_logits(*logits, tolerance)}


def logit_tolerance(layers: int, dtype: torch.dtype) -> float:
    """The largest |compiled - eager| logit a correct graph may show, relative to the eager logits'
    RMS: eager and compiled calls round differently (inductor fuses ops and keeps their
    intermediates in float32, eager rounds each op's output), ROUNDINGS_PER_LAYER roundings
    of at most the dtype's unit roundoff u = eps / 2 per layer (2^-8 in bfloat16), independent, so
    they grow as sqrt(roundings x layers) x u in the residual stream and so in every logit; the
    largest of R x V logit differences is within TOLERANCE_SIGMAS of that."""
    unit = torch.finfo(dtype).eps / 2
    return TOLERANCE_SIGMAS * math.sqrt(ROUNDINGS_PER_LAYER * layers) * unit


def compare_logits(eager: torch.Tensor, compiled: torch.Tensor, tolerance: float) -> dict:
    """max |compiled - eager|, the share of rows whose argmax agrees, and the verdict: the
    difference within `tolerance` x the eager RMS, and the argmax agreement at least
    GRAPH_ARGMAX_MIN unless every row that differs is a near tie (its top two eager logits within
    twice the tolerance: rounding alone may swap them)."""
    eager, compiled = eager.float(), compiled.float()
    rms = eager.pow(2).mean().sqrt().item()
    limit = tolerance * rms
    diff = (compiled - eager).abs().max().item() if compiled.shape == eager.shape else math.inf
    top = eager.topk(min(2, eager.shape[-1]), dim=-1).values
    near = (top[:, 0] - top[:, -1]) <= 2 * limit
    differ = eager.argmax(-1) != compiled.argmax(-1) if compiled.shape == eager.shape else torch.ones_like(near)
    agreement = 1.0 - differ.float().mean().item()
    decided_flips = int((differ & ~near).sum())
    ok = diff <= limit and (agreement >= GRAPH_ARGMAX_MIN or decided_flips == 0)
    return {"max_abs_logit_diff": diff, "argmax_agreement": agreement, "tolerance": limit, "logit_rms": rms,
            "near_tie_rows": int(near.sum()), "flips_not_near_tie": decided_flips, "pass": ok}  # fmt: skip


def graph_difference(checked: list[dict], consequence: str = "its timings would time a wrong call (check the static "
                     "path's buffers, or model.compile=none)") -> str:  # fmt: skip
    """The one line of the compiled calls whose graph differs from eager, ending with `consequence`."""
    bad = [c for c in checked if not c["pass"]]
    return (f"{GRAPH_DIFFERS}: " + "; ".join(
        f"B={c['block']} {c['kind']} ({c['rows']} rows): max |diff| {c['max_abs_logit_diff']:.3g} "
        f"(tolerance {c['tolerance']:.3g}), argmax agreement {c['argmax_agreement']:.3f} at C={c['prefix']}"
        for c in bad) + f"; {consequence}")  # fmt: skip
