"""A compiled call whose committed rows and own rows need exactly one column more than a window
(or exactly a window) runs on the next window (that window) and equals the eager call."""

from __future__ import annotations

import pytest
import torch

from packedss.decoding.calls import causal_segment, pack
from packedss.models.nemotron import load_nemotron
from packedss.models.static import static_twin
from tests.conftest import TINY_VOCAB, write_random_nemotron

ROWS = 4
CAPACITY = 200


@pytest.fixture(scope="module")
def checkpoint(tmp_path_factory):
    return write_random_nemotron(tmp_path_factory.mktemp("static-window-edge"), seed=5)


def test_calls_at_and_one_column_past_each_window_equal_eager(checkpoint):
    eager = load_nemotron(checkpoint, dtype="float64")
    static = static_twin(eager, "default", CAPACITY)
    windows = static.static.windows
    assert windows == [32, 64, 112, 200]
    generator = torch.Generator().manual_seed(11)

    def both(position, keep):
        call = pack([causal_segment(torch.randint(4, TINY_VOCAB, (ROWS,), generator=generator), position)])
        a, b = eager.run(call), static.run(call)
        eager.commit(keep)
        static.commit(keep)
        # (float32 rotary rounding in inductor, as in tests/models/test_static.py)
        return (a - b).abs().max().item()

    prompt = pack([causal_segment(torch.randint(4, TINY_VOCAB, (20,), generator=generator), 0)])
    for model in (eager, static):
        model.run(prompt)
        model.commit(20)
    both(20, 1)  # first sighting: eager
    both(21, 1)  # second: compiled, one graph per window
    assert static.static._graphs == {(ROWS, False): windows}
    # Then one committed row per call: every column count from 26 to the capacity is needed once.
    used = []
    for position in range(22, CAPACITY - ROWS + 1):
        before = dict(static.static.window_calls)
        assert both(position, 1) < 1e-5, position
        used.append(next(w for w in windows if static.static.window_calls[w] == before[w] + 1))
    needed = [position + ROWS for position in range(22, CAPACITY - ROWS + 1)]
    for w in windows[:-1]:
        assert used[needed.index(w)] == w  # exactly a window: that window
        assert used[needed.index(w + 1)] == windows[windows.index(w) + 1]  # one column past it: the next
