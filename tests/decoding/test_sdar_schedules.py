"""The SDAR family's schedules (docs/schedules.md §16) against plain references.

- The lossless schedules (`linear`, `packed` padded and not) emit exactly what `ar` emits, and
  `ar` is SDAR's AR mode: one mask query per token seeing the clean tokens before it, computed
  here by one dense forward from scratch per token (no cache, no Call).
- `sdar-native` and `s2d2` equal dense re-readings of the released decoders (every call
  recomputed from scratch with the release's attention masks); the calls' rows and kinds are
  the stated ones.
- At T = 1 the lossless schedules preserve the AR distribution (chi-square on a toy SDAR model;
  a verifier that accepts every draft fails the same test).
"""

from __future__ import annotations

import itertools
import math

import pytest
import torch

from packedss.decoding import LTRSettings, Sampling
from packedss.decoding import driver, queried
from packedss.decoding.block_steps import low_confidence_dynamic, verify_score
from packedss.decoding.blockdiff import transfer_counts
from packedss.decoding.verify import exponential_race, probabilities
from packedss.families import FAMILIES
from packedss.models.sdar import load_sdar
from tests.sdar_fixtures import SDAR_EOS as EOS
from tests.sdar_fixtures import SDAR_MASK as MASK
from tests.sdar_fixtures import SDAR_VOCAB as VOCAB
from tests.sdar_fixtures import write_random_sdar
from tests.chi_square import CONTROL_RUNS, LEVEL, accept_every_draft, chi_square_p, schedules_and_rules
from tests.toy_ltr import ToyLTRModel

SDAR = FAMILIES["sdar"]
PROMPTS = [list(range(5, 19)), [20, 22, 24, 26, 28, 3, 5, 8, 13], [30, 31, 32, 33, 34, 35, 36, 37, 38, 39, 40, 41, 42, 43, 44, 45]]


@pytest.fixture(scope="module")
def model(tmp_path_factory):
    """A random SDAR-layout checkpoint, loaded in float64 (no near-ties between call shapes)."""
    return load_sdar(write_random_sdar(tmp_path_factory.mktemp("sdar")), dtype="float64")


def settings(schedule: str, width: int, new: int = 24, temperature: float = 0.0, seed: int = 0, **fields):
    sampling = Sampling(temperature, "rejection", torch.Generator().manual_seed(seed))
    return LTRSettings(schedule, width, new, (EOS,), sampling, **fields)


def dense(model, tokens: list[int], positions: list[int], allowed: torch.Tensor) -> torch.Tensor:
    """Logits of every row of one forward from scratch under the boolean rule `allowed`."""
    mask = torch.zeros(allowed.shape, dtype=model.dtype).masked_fill(~allowed, torch.finfo(model.dtype).min)
    out = model.backbone(input_ids=torch.tensor([tokens]), position_ids=torch.tensor([positions]),
                         attention_mask=mask[None, None])  # fmt: skip
    return model.head(out.last_hidden_state[0])


@torch.no_grad()
def plain_ar(model, prompt: list[int], new: int) -> list[int]:
    """SDAR's AR mode from scratch: the sequence so far (causal) plus one mask at the next position."""
    tokens = list(prompt)
    for _ in range(new):
        rows = len(tokens) + 1
        allowed = torch.ones(rows, rows, dtype=torch.bool).tril()
        logits = dense(model, tokens + [MASK], list(range(len(tokens))) + [len(tokens)], allowed)
        tokens.append(int(logits[-1].argmax()))
        if tokens[-1] == EOS:
            break
    return tokens[len(prompt) :]


@pytest.mark.parametrize("width", [1, 2, 3, 6])
def test_lossless_schedules_equal_ar_and_ar_is_the_mask_query_mode(model, width):
    for prompt in PROMPTS:
        ar = SDAR.decode(model, prompt, settings("ar", width))
        assert ar.tokens == plain_ar(model, prompt, 24)
        for schedule, pad in (("linear", True), ("packed", True), ("packed", False)):
            out = SDAR.decode(model, prompt, settings(schedule, width, pad_verify=pad))
            assert out.tokens == ar.tokens, (schedule, pad, width)
            assert out.nfe_total == 1 + SDAR.schedule(schedule).calls_per_iteration * out.iterations


def test_drafts_are_accepted_sometimes_and_not_always(model):
    out = [SDAR.decode(model, p, settings(s, 3)) for p in PROMPTS for s in ("linear", "packed")]
    proposed, accepted = sum(o.draft_proposed for o in out), sum(o.draft_accepted for o in out)
    assert 0 < accepted < proposed


@pytest.mark.parametrize("schedule", ["ar", "linear", "packed"])
def test_rows_of_every_call(model, schedule):
    width, prompt = 3, PROMPTS[0]
    length, block = len(prompt), width + 1
    for pad in (True, False):
        out = SDAR.decode(model, prompt, settings(schedule, width, pad_verify=pad))
        rows = out.rows_evaluated
        if schedule == "ar":
            assert rows == [length + 1] + [2] * out.iterations
        elif schedule == "linear":
            assert rows == [length + 1] + [block, 2 * block] * out.iterations
        else:
            assert rows[0] == length + 1 + block
            drafts = [width - 1] + [width - a for a in out.accepted[:-1]]  # m before each call
            expected = [2 * width + block if pad else 2 * (m + 1) + block for m in drafts]
            assert rows[1:] == expected
            assert out.rows_useful[1:] == [2 * (m + 1) + block for m in drafts]
        decoder = SDAR.schedule(schedule)
        if pad:
            assert max(rows[1:]) == decoder.largest_call_rows(width)
            assert sum(rows[1:]) == decoder.rows_per_iteration(width) * out.iterations


# ---- the block-diffusion decoders against dense re-readings of the releases ----


def without_mask(logits: torch.Tensor) -> torch.Tensor:
    """The harness's one departure from both releases: the mask token is never proposed."""
    logits = logits.clone()
    logits[:, MASK] = -torch.inf
    return logits


def block_rule(rows: int, block: int) -> torch.Tensor:
    index = torch.arange(rows) // block
    return index[None, :] <= index[:, None]


def greedy_rows(logits: torch.Tensor):
    probs = probabilities(without_mask(logits), 1.0)
    tokens = probs.argmax(dim=-1)
    return tokens, probs.gather(-1, tokens[:, None])[:, 0], probs


@torch.no_grad()
def plain_native(model, prompt: list[int], block: int, new: int):
    """generate.py's block_diffusion_generate at T = 0 (confidence: the softmax probability of
    the argmax), every call one dense forward of [committed | current block] under the release's
    block-causal mask. Returns the generated tokens (cut after the first EOS) and the NFE."""
    length = len(prompt)
    total = -(-(length + new) // block) * block
    x = prompt + [MASK] * (total - length)
    prefill = length // block * block
    nfe = 1 if prefill else 0
    counts = transfer_counts(block, block)
    for start in range(prefill, total, block):
        end = start + block
        for step in range(block + 1):
            nfe += 1
            masked = torch.tensor([t == MASK for t in x[start:end]])
            if not masked.any():  # the commit call
                break
            logits = dense(model, x[:end], list(range(end)), block_rule(end, block))[start:end]
            proposal, confidence, _ = greedy_rows(logits)
            chosen = low_confidence_dynamic(confidence, masked, counts[step], 0.85)
            x[start:end] = torch.where(chosen, proposal, torch.tensor(x[start:end])).tolist()
        if EOS in x[length:end]:
            break
    generated = x[length:end]
    return (generated[: generated.index(EOS) + 1] if EOS in generated else generated)[:new], nfe


@pytest.mark.parametrize("width", [3, 5])
def test_sdar_native_is_the_released_block_diffusion(model, width):
    for prompt in PROMPTS:
        out = SDAR.decode(model, prompt, settings("sdar-native", width))
        tokens, nfe = plain_native(model, prompt, width + 1, 24)
        assert (out.tokens, out.nfe_total) == (tokens, nfe)


@torch.no_grad()
def plain_s2d2(model, prompt: list[int], block: int, new: int, penalty: float, generator: torch.Generator):
    """generate_ssd_policy.py's block_diffusion_generate at do_sample=False with --cache_ver
    --draft_ver and the score-threshold policy (tau 0, difference_static, soft_entropy_negexp),
    every call one dense forward: committed rows token-causal, the current block's rows as each
    call's mask (draft: causal before the first mask, the whole block after it; verify: the 2L
    rows). Returns the generated tokens, the NFE and the kinds of the calls."""
    length = len(prompt)
    total = -(-(length + new) // block) * block
    x = prompt + [MASK] * (total - length)
    prefill = length // block * block
    kinds = ["prefill"] if prefill else []
    counts = transfer_counts(block, block)
    for start in range(prefill, total, block):
        end = start + block
        for step in range(block + 1):
            masked = torch.tensor([t == MASK for t in x[start:end]])
            if not masked.any():
                kinds.append("commit")
                break
            first = int(masked.nonzero()[0])
            allowed = torch.ones(end, end, dtype=torch.bool).tril()
            allowed[start + first :, start:end] = True
            logits = dense(model, x[:end], list(range(end)), allowed)[start:end]
            kinds.append("draft")
            proposal, confidence, probs = greedy_rows(logits)
            span = first
            while span < block and masked[span]:
                span += 1
            span = list(range(first, span))
            entropy = [float(-(probs[i] * probs[i].clamp(min=1e-12).log()).sum()) / math.log(VOCAB) for i in span]
            expected, running = 0.0, 1.0
            for h in entropy:
                running *= math.exp(-h)
                expected += running
            block_tokens = torch.tensor(x[start:end])
            if expected - penalty >= 0:
                filled = torch.where(masked, proposal, block_tokens).tolist()
                rows = start + 2 * block
                allowed = torch.zeros(rows, rows, dtype=torch.bool)
                allowed[:, :start] = True
                allowed[:end, :end] = torch.ones(end, end, dtype=torch.bool).tril()
                allowed[end:, start:end] = torch.ones(block, block, dtype=torch.bool).tril(-1)
                allowed[end:, end:] = torch.eye(block, dtype=torch.bool)
                positions = list(range(end)) + list(range(start, end))
                verifier = dense(model, x[:start] + filled + [MASK] * block, positions, allowed)[end:]
                kinds.append("verify")
                q = probabilities(without_mask(verifier[span]), 1.0)
                drafts = proposal[span]
                ratio = (q[range(len(span)), drafts] / confidence[span].clamp(min=1e-12)).clamp(max=1.0)
                accept = torch.rand(len(span), generator=generator, dtype=ratio.dtype) < ratio
                update = block_tokens.clone()
                reject = None if accept.all() else int((~accept).nonzero()[0])
                keep = span if reject is None else span[: reject + 1]
                update[keep] = proposal[keep]
                if reject is not None:
                    residual = (q[reject] - probs[span[reject]]).clamp(min=0)
                    residual = residual if float(residual.sum()) > 0 else q[reject]
                    update[span[reject]] = exponential_race(residual[None], generator)[0]
            else:
                chosen = low_confidence_dynamic(confidence, masked, min(counts[step], int(masked.sum())), 0.85)
                update = torch.where(chosen, proposal, block_tokens)
            x[start:end] = update.tolist()
        if EOS in x[length:end]:
            break
    generated = x[length:end]
    return (generated[: generated.index(EOS) + 1] if EOS in generated else generated)[:new], len(kinds), kinds


@pytest.mark.parametrize("schedule,penalty", [("s2d2", 1.0), ("s2d2-always", 0.0)])
@pytest.mark.parametrize("width", [3, 5])
def test_s2d2_is_the_released_self_speculation(model, schedule, penalty, width):
    verified = 0
    for seed, prompt in enumerate(PROMPTS):
        out = SDAR.decode(model, prompt, settings(schedule, width, seed=seed))
        tokens, nfe, kinds = plain_s2d2(model, prompt, width + 1, 24, penalty, torch.Generator().manual_seed(seed))
        assert (out.tokens, out.nfe_total) == (tokens, nfe)
        verified += kinds.count("verify")
        assert out.nfe_total == 1 + out.iterations
    assert verified > 0


def test_block_decoders_record_their_calls(model):
    prompt, width = PROMPTS[0], 3
    for schedule in ("sdar-native", "s2d2", "s2d2-always"):
        out = SDAR.decode(model, prompt, settings(schedule, width))
        kinds, resolved = out.extra["call_kinds"], out.extra["resolved"]
        assert len(kinds) == len(resolved) == out.nfe_total and kinds[0] == "prefill"
        assert resolved[0] + sum(out.accepted) - out.truncated_tokens == len(out.tokens)
        sizes = {"prefill": len(prompt) // 4 * 4, "denoise": 4, "draft": 4, "verify": 8, "commit": 4}
        assert out.rows_evaluated == [sizes[k] for k in kinds]
        assert set(kinds[1:]) <= ({"denoise", "commit"} if schedule == "sdar-native" else {"draft", "verify", "commit"})


def test_verify_score_is_the_expected_accepted_length_minus_the_penalty():
    certain = torch.zeros(3, 16)
    certain[:, 0] = 1.0
    assert verify_score(certain, 1.0) == pytest.approx(2.0)
    uniform = torch.full((2, 16), 1 / 16)
    assert verify_score(uniform, 0.0) == pytest.approx(math.exp(-1) + math.exp(-2))


def test_low_confidence_dynamic_takes_all_confident_rows_else_the_top_count():
    masked = torch.tensor([True, True, False, True])
    assert low_confidence_dynamic(torch.tensor([0.9, 0.95, 0.99, 0.2]), masked, 1, 0.85).tolist() == [True, True, False, False]
    assert low_confidence_dynamic(torch.tensor([0.3, 0.5, 0.99, 0.2]), masked, 1, 0.85).tolist() == [False, True, False, False]
    assert transfer_counts(4, 4) == [1, 1, 1, 1] and transfer_counts(8, 3) == [3, 3, 2]


# ---- T = 1: the lossless schedules keep the AR distribution ----


class ToySDAR(ToyLTRModel):
    """The toy of the LTR tests in SDAR's reading: a mask row that sees no other mask and exactly
    the clean tokens at 0..i-1 is an AR query (the AR logits of that prefix); any other mask row
    is a drafter row; clean rows predict nothing (their logits are noise)."""

    def run(self, call):
        tokens, positions, attend = call.tokens.tolist(), call.positions.tolist(), call.attend.tolist()
        out = []
        for r in range(call.read_from, call.rows):
            seen = [j for j in range(call.rows) if attend[r][j]]
            visible = list(self.committed) + [(positions[j], tokens[j]) for j in seen if tokens[j] != self.mask_token_id]
            prefix = tuple(t for _, t in sorted(visible))
            masks_seen = [j for j in seen if tokens[j] == self.mask_token_id and j != r]
            if tokens[r] != self.mask_token_id:
                out.append(self._logits(("clean", positions[r]) + prefix))
            elif not masks_seen and sorted(p for p, _ in visible) == list(range(positions[r])):
                out.append(self.ar_logits(prefix))
            else:
                noise = self._logits(("draft", positions[r]) + prefix)
                near = positions[r] == max(p for p, _ in visible) + 1
                out.append(self.agreement * self.ar_logits(prefix) + noise if near else noise)
        self._pending = [(positions[r], tokens[r]) for r in range(call.rows)]
        return torch.stack(out)


TOY_PROMPT, TOY_LENGTH, RUNS = [1, 4, 6], 3, 4000


@pytest.fixture(scope="module")
def exact():
    toy, probs = ToySDAR(), {}
    for seq in itertools.product(range(toy.vocab), repeat=TOY_LENGTH):
        p, prefix = 1.0, tuple(TOY_PROMPT)
        for token in seq:
            p *= float(torch.softmax(toy.ar_logits(prefix), -1)[token])
            prefix += (token,)
        probs[seq] = p
    return probs


def toy_samples(schedule: str, rule: str, runs: int = RUNS) -> list[tuple[int, ...]]:
    toy, samples = ToySDAR(), []
    for seed in range(runs):
        sampling = Sampling(1.0, rule, torch.Generator().manual_seed(seed))
        out = SDAR.decode(toy, TOY_PROMPT, LTRSettings(schedule, 3, TOY_LENGTH, (), sampling))
        samples.append(tuple(out.tokens))
    return samples


@pytest.mark.parametrize(("schedule", "rule"), schedules_and_rules(("linear", "packed")))
def test_sampled_sdar_schedules_preserve_the_ar_distribution(exact, schedule, rule):
    assert chi_square_p(toy_samples(schedule, rule), exact) > LEVEL


def test_sdar_ar_samples_the_same_under_either_rule():
    """Why AR's distribution test runs under one rule (schedules_and_rules)."""
    assert toy_samples("ar", "rejection", runs=200) == toy_samples("ar", "match", runs=200)


@pytest.mark.parametrize("schedule", ["linear", "packed"])
def test_broken_sdar_verifier_fails_the_same_test(exact, schedule, monkeypatch):
    monkeypatch.setattr(queried, "verify", accept_every_draft)
    monkeypatch.setattr(driver, "verify", accept_every_draft)  # Packed-SS's, through verify_ahead
    assert chi_square_p(toy_samples(schedule, "rejection", runs=CONTROL_RUNS), exact) < LEVEL


def test_toy_sdar_drafts_are_accepted_sometimes():
    toy, accepted = ToySDAR(), []
    for seed in range(200):
        sampling = Sampling(1.0, "rejection", torch.Generator().manual_seed(seed))
        accepted += SDAR.decode(toy, TOY_PROMPT, LTRSettings("linear", 3, TOY_LENGTH, (), sampling)).accepted
    assert 1 in accepted and max(accepted) > 1
