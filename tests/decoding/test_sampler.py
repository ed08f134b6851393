"""The blocked inverse CDF (packedss.decoding.verify.inverse_cdf): the first token whose cumulative
probability exceeds the uniform times the row's total, found through the blocks' masses; never a
zero-probability token, also where a block's float32 mass rounds above its tokens' float64 sum;
each row's token its own whatever rows are drawn beside it; the frequencies its probabilities."""

from __future__ import annotations

import pytest
import torch
from scipy.stats import chisquare

from packedss.decoding.verify import inverse_cdf, vocabulary_block

TOP = 1.0 - 2.0**-24  # the largest float32 uniform below 1


def full_cdf(probs: torch.Tensor, uniform: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """The definition over the whole vocabulary in float64: each row's token, its cumulative
    probabilities and its target."""
    cdf = probs.double().cumsum(dim=-1)
    target = uniform.double() * cdf[:, -1]
    return (cdf > target[:, None]).to(torch.int8).argmax(dim=-1), cdf, target


def rows_with_zeros(generator: torch.Generator, rows: int, vocabulary: int) -> torch.Tensor:
    """Softmax rows with half their entries, and every block's first and last entry, set to 0."""
    probs = torch.softmax(torch.randn(rows, vocabulary, generator=generator) * 3, dim=-1)
    probs[torch.rand(rows, vocabulary, generator=generator) < 0.5] = 0
    block = vocabulary_block(vocabulary)
    probs[:, ::block] = 0
    probs[:, block - 1 :: block] = 0
    probs[:, -1] = 0
    return probs


def test_the_block_is_about_the_square_root_of_the_vocabulary():
    assert [vocabulary_block(v) for v in (2, 17, 1000, 1024, 1025, 151936)] == [2, 8, 32, 32, 64, 512]


@pytest.mark.parametrize("vocabulary", [1024, 1000, 4099])
def test_the_token_is_the_first_whose_cumulative_probability_exceeds_the_target(vocabulary):
    """Against the whole vocabulary's float64 cumulative sum: equal wherever the target is not
    within rounding of a token's boundary (the two sums round apart only there)."""
    generator = torch.Generator().manual_seed(vocabulary)
    probs = rows_with_zeros(generator, 400, vocabulary)
    uniform = torch.rand(400, generator=generator)
    uniform[:4] = torch.tensor([0.0, TOP, 0.5, 2.0**-24])
    drawn, (expected, cdf, target) = inverse_cdf(probs, uniform), full_cdf(probs, uniform)
    boundary = (cdf - target[:, None]).abs().min(dim=-1).values < 1e-12 * cdf[:, -1]
    assert torch.equal(drawn[~boundary], expected[~boundary])
    assert boundary.sum() <= 2
    assert (probs.gather(1, drawn[:, None]) > 0).all()


def test_the_ends_of_the_uniform_draw_the_first_and_the_last_token_with_probability():
    """u = 0 the first token with probability, u just below 1 the last, with zero blocks and zero
    tokens before and after them; and a target exactly on a block's end goes to the next block's
    first token with probability."""
    vocabulary = 1000  # blocks of 32, the last one ragged (8 entries)
    probs = torch.zeros(3, vocabulary)
    probs[:, 70] = 0.25  # block 2, behind two zero blocks and six zero tokens
    probs[:, 100] = 0.25  # block 3
    probs[:, 900] = 0.5  # block 28, followed by zero blocks and the ragged zero block
    drawn = inverse_cdf(probs, torch.tensor([0.0, TOP, 0.5]))
    # 0.5 x 1 is the end of block 3: the target's block is the next with mass
    assert drawn.tolist() == [70, 900, 900]
    # a row without mass (never a softmax's) still draws a token of the vocabulary
    assert 0 <= inverse_cdf(torch.zeros(1, vocabulary), torch.tensor([0.5])).item() < vocabulary


def block_sums(probs: torch.Tensor, block: int) -> torch.Tensor:
    """Each row's block sums in float32, the ragged last block's too, as `inverse_cdf` takes them."""
    whole = probs.shape[1] // block * block
    sums = [probs[:, :whole].reshape(len(probs), -1, block).sum(dim=-1)]
    if whole < probs.shape[1]:
        sums.append(probs[:, whole:].sum(dim=-1, keepdim=True))
    return torch.cat(sums, dim=1)


@pytest.mark.parametrize("vocabulary", [1024, 1000])
def test_a_block_mass_that_rounds_above_its_tokens_never_draws_a_zero_probability_token(vocabulary):
    """A block's float32 mass can exceed its tokens' float64 sum by an ulp or more: a target in
    that sliver still draws a token of the block with probability (here a whole block's last
    token is 0), also in the ragged last block, whose columns past the vocabulary hold no token."""
    block = vocabulary_block(vocabulary)
    generator = torch.Generator().manual_seed(7)
    probs = torch.rand(2048, vocabulary, generator=generator) / 3
    probs[1024:, : (vocabulary - 1) // block * block] /= 1000  # half the rows: most mass in the last block
    probs[:, block - 1 :: block] = 0  # every whole block's last token
    probs[:, -1] = 1 / 3  # the vocabulary's last: a ragged block's columns past it must not repeat it
    masses, inside = block_sums(probs, block).double(), block_sums(probs.double(), block)
    ends = masses.cumsum(dim=-1)
    cases = []
    for row, b in zip(*torch.nonzero(masses > inside, as_tuple=True)):
        sliver_start = (ends[row, b] - masses[row, b] + inside[row, b]).item()
        total = ends[row, -1].item()
        u = torch.tensor([sliver_start / total], dtype=torch.float32)
        while u.double().item() * total < sliver_start:
            u = torch.nextafter(u, torch.ones(1))
        if u.double().item() * total < ends[row, b].item():  # the target lies in the sliver
            cases.append((row.item(), b.item(), u))
    # the construction finds slivers, the last block's among them, or the test tests nothing
    assert len(cases) >= 5 and any(b == masses.shape[1] - 1 for _, b, _ in cases)
    for row, b, u in cases:
        token = inverse_cdf(probs[row : row + 1], u).item()
        assert token // block == b and token < vocabulary and probs[row, token] > 0, (row, b, token)


@pytest.mark.parametrize("vocabulary", [1024, 1000])
def test_a_rows_token_does_not_depend_on_the_rows_beside_it(vocabulary):
    generator = torch.Generator().manual_seed(3)
    probs = rows_with_zeros(generator, 64, vocabulary)
    uniform = torch.rand(64, generator=generator)
    together = inverse_cdf(probs, uniform)
    alone = torch.cat([inverse_cdf(probs[i : i + 1], uniform[i : i + 1]) for i in range(64)])
    order = torch.randperm(64, generator=generator)
    shuffled = inverse_cdf(probs[order], uniform[order])
    assert torch.equal(together, alone) and torch.equal(shuffled, together[order])


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
def test_the_frequencies_are_the_probabilities(dtype):
    """40,000 draws of one row whose mass spreads over several blocks, the last one ragged; a
    fixed seed, so the verdict is the same on every run."""
    vocabulary = 100  # blocks of 16, the last of 4
    weights = torch.zeros(vocabulary, dtype=dtype)
    weights[[0, 15, 16, 17, 50, 63, 96, 99]] = torch.tensor([1, 2, 3, 1, 5, 0.5, 4, 2.5], dtype=dtype)
    draws = 40_000
    generator = torch.Generator().manual_seed(11)
    tokens = inverse_cdf(weights.expand(draws, -1), torch.rand(draws, generator=generator))
    held = weights > 0
    assert held[tokens].all()
    observed = torch.bincount(tokens, minlength=vocabulary)[held].double()
    expected = weights[held].double() / weights.sum().double() * draws
    assert chisquare(observed.numpy(), expected.numpy()).pvalue > 1e-3
