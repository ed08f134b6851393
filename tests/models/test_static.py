"""The static call path (packedss.models.static): its cache and mask invariants against the eager
path in float64 on random checkpoints, whole decodes of every schedule, and one small compiled
shape (the only compile in the suite)."""

from __future__ import annotations

import logging
import subprocess
import sys

import pytest
import torch

from packedss.decoding import AnyOrderSettings, LTRSettings, Sampling, decode_anyorder, decode_ltr
from packedss.decoding.calls import Role, causal_segment, draft_block, pack
from packedss.decoding.schedules import packed_call, quadratic_call
from packedss.errors import PackedSSError
from packedss.families import FAMILIES
from packedss.models.lora import ProposalLoRA
from packedss.models.nemotron import load_nemotron
from packedss.models.setdlm import load_setdlm
from packedss.models.static import (
    attention_windows,
    end_warmup,
    enable_static,
    static_capacity,
    static_twin,
)
from tests.anyorder_fixtures import SET_EOS, write_random_setdlm
from tests.conftest import EOS_ID, MASK_ID, TINY_VOCAB, write_random_nemotron

WIDTH = 3


@pytest.fixture(scope="module")
def checkpoint(tmp_path_factory):
    return write_random_nemotron(tmp_path_factory.mktemp("static-nemotron"), seed=3)


def _pair(checkpoint, capacity=64):
    """(eager adapter, static adapter with compilation closed) over the same float64 weights."""
    eager = load_nemotron(checkpoint, dtype="float64")
    static = enable_static(load_nemotron(checkpoint, dtype="float64"), "default", capacity)
    end_warmup(static)
    return eager, static


def _both(eager, static, call, keep):
    """Run `call` on both, commit `keep` rows on both; the max abs difference of the logits."""
    a, b = eager.run(call), static.run(call)
    eager.commit(keep)
    static.commit(keep)
    assert static.cached_rows == eager.cached_rows
    return (a - b).abs().max().item()


def _tokens(generator, count):
    return torch.randint(4, TINY_VOCAB, (count,), generator=generator)


def test_static_calls_equal_eager_calls_through_commits_and_resets(checkpoint):
    eager, static = _pair(checkpoint)
    generator = torch.Generator().manual_seed(0)
    block = WIDTH + 1
    assert _both(eager, static, pack([causal_segment(_tokens(generator, 9), 0)]), 9) < 1e-9
    position = 9
    # Packed calls (2B rows) with commits of 0 rows, a full commit, and partial commits; then
    # calls of other row counts, whose mask buffers catch up with the commits made meanwhile.
    for keep in (0, 2 * block, 0, 1, 3, block):
        call = packed_call(_tokens(generator, 1), _tokens(generator, WIDTH), position, WIDTH, MASK_ID, True)
        assert _both(eager, static, call, keep) < 1e-9, keep
        position += keep
    call = quadratic_call(_tokens(generator, 1), _tokens(generator, WIDTH), position, MASK_ID)
    assert _both(eager, static, call, 2) < 1e-9
    position += 2
    for keep in (0, block):
        call = pack([draft_block(_tokens(generator, 1), position, WIDTH, MASK_ID)])
        assert _both(eager, static, call, keep) < 1e-9
        position += keep
    # A new response on a shorter prompt: the columns of the old one are masked again.
    eager.reset()
    static.reset()
    assert static.cached_rows == 0
    assert _both(eager, static, pack([causal_segment(_tokens(generator, 4), 0)]), 4) < 1e-9
    call = packed_call(_tokens(generator, 1), _tokens(generator, WIDTH - 1), 4, WIDTH, MASK_ID, True)
    assert _both(eager, static, call, 1) < 1e-9
    assert static.static.calls == {"compiled": 0, "padded": 0, "eager": 10, "prefill": 2}


@pytest.mark.parametrize("schedule", ["ar", "linear", "quadratic", "packed"])
def test_ltr_decodes_on_the_static_path_equal_eager_decodes(checkpoint, schedule):
    eager = load_nemotron(checkpoint, dtype="float64")
    prompts = [[5, 9, 11, 30, 7], [4, 4, 12], list(range(4, 20))]
    max_new = 24
    LTR = FAMILIES["nemotron"].schedule(schedule)
    static = enable_static(load_nemotron(checkpoint, dtype="float64"), "default",
                           static_capacity(max(map(len, prompts)), max_new, LTR.largest_call_rows(WIDTH)))  # fmt: skip
    end_warmup(static)
    settings = LTRSettings(schedule, WIDTH, max_new, (EOS_ID,), Sampling(0.0, "rejection", None))
    for prompt in prompts:
        a, b = decode_ltr(eager, prompt, settings), decode_ltr(static, prompt, settings)
        assert (b.tokens, b.rows_evaluated) == (a.tokens, a.rows_evaluated)
        assert max(b.rows_evaluated[1:]) == LTR.largest_call_rows(WIDTH)  # every LTR call after prefill has one size


@pytest.mark.parametrize("schedule,order", [("ar", "confidence"), ("linear", "confidence"), ("packed", "confidence"),
                                            ("quadratic", "confidence"), ("quadratic", "ltr"), ("native", "ltr")])  # fmt: skip
def test_anyorder_decodes_on_the_static_path_equal_eager_decodes(tmp_path, schedule, order):
    directory = write_random_setdlm(tmp_path / "set", seed=2)
    eager = load_setdlm(directory, dtype="float64")
    width, max_new, prompt = 4, 16, [5, 9, 11, 7, 6]
    largest = FAMILIES["setdlm"].schedule(schedule).largest_call_rows(width)
    capacity = static_capacity(len(prompt), max_new, largest)
    static = enable_static(load_setdlm(directory, dtype="float64"), "default", capacity)
    end_warmup(static)
    settings = AnyOrderSettings(schedule, width, max_new, (SET_EOS,), Sampling(0.0, "rejection", None),
                                order=order)  # fmt: skip
    a, b = decode_anyorder(eager, prompt, settings), decode_anyorder(static, prompt, settings)
    assert (b.tokens, b.rows_evaluated) == (a.tokens, a.rows_evaluated)
    assert max(b.rows_evaluated[1:]) <= largest
    logits = static.run(pack([causal_segment(torch.tensor(prompt), 0)]))
    assert torch.isneginf(logits[:, static.mask_token_id]).all()  # SetDLM's rule holds on this path too


def test_a_call_past_the_capacity_is_one_clear_error(checkpoint):
    _, static = _pair(checkpoint, capacity=10)
    static.run(pack([causal_segment(torch.arange(4, 12), 0)]))
    static.commit(8)
    with pytest.raises(PackedSSError, match=r"holds 10 rows, but this call needs 16 \(8 committed \+ 8\)"):
        static.run(packed_call(torch.tensor(5), torch.tensor([6, 7]), 8, WIDTH, MASK_ID, True))


def test_modes_are_checked_and_reduce_overhead_runs_as_default_on_cpu(checkpoint, caplog):
    model = load_nemotron(checkpoint, dtype="float64")
    with pytest.raises(PackedSSError, match="invalid model.compile='fast'; valid: none, default, reduce-overhead"):
        enable_static(model, "fast", 32)
    with caplog.at_level(logging.WARNING, logger="packedss.models.static"):
        enable_static(model, "reduce-overhead", 32)
    assert model.static.mode == "default" and "which need a GPU" in caplog.text
    assert enable_static(model, "none", 32).static is None
    model.run(pack([causal_segment(torch.tensor([4, 5]), 0)]))
    model.commit(2)
    assert model.cached_rows == 2  # the DynamicCache again


def test_compiled_shapes_equal_the_eager_path_with_the_proposal_lora(checkpoint):
    """One compiled graph per (rows, LoRA on/off): a draft block (LoRA on its rows) and a verify
    call of the same B rows, each compiled at its second sighting during the warm-up."""
    eager = load_nemotron(checkpoint, dtype="float64")
    lora = ProposalLoRA.create(eager.backbone, rank=2, alpha=4.0, seed=1)
    with torch.no_grad():
        for b in lora.lora_B.values():  # a trained adapter: B != 0
            b.normal_(0.0, 0.5, generator=torch.Generator().manual_seed(2))
    eager.proposal_lora = lora
    static = static_twin(eager, "default", 32)  # the same weights and LoRA, the static path
    assert static.proposal_lora is lora and eager.static is None
    generator = torch.Generator().manual_seed(4)
    assert _both(eager, static, pack([causal_segment(_tokens(generator, 6), 0)]), 6) < 1e-9
    position = 6
    for _ in range(3):
        draft = pack([draft_block(_tokens(generator, 1), position, WIDTH, MASK_ID)])
        assert draft.roles.eq(int(Role.DRAFT)).all()
        # inductor's float32 cos/sin (rotary embedding, computed in float32 by transformers) may
        # differ from eager's by one ulp, so the float64 logits agree to float32 rounding only.
        assert _both(eager, static, draft, 0) < 1e-5
        verify = pack([causal_segment(_tokens(generator, WIDTH + 1), position)])
        assert _both(eager, static, verify, 2) < 1e-5
        position += 2
    assert set(static.static.compile_s) == {f"{WIDTH + 1} rows", f"{WIDTH + 1} rows lora"}
    # The verify graph got the same tensors on its two calls through dynamo: the third call (and
    # the padded call below) ran it directly. The LoRA graph's row selection is a new tensor per
    # call, so it always goes through dynamo.
    # Both shapes were compiled on a cache of 8 rows, for every window that holds 8 + 4 rows; the
    # calls since ran on the 16-column window.
    assert static.static._graphs == {(WIDTH + 1, False): [16, 32], (WIDTH + 1, True): [16, 32]}
    assert set(static.static._direct) == {(WIDTH + 1, False, 16)}
    assert static.static.calls == {"compiled": 4, "padded": 0, "eager": 2, "prefill": 1}
    lora = {"lora_rows_selected": 0, "lora_rows_evaluated": 0}
    # The last call was a verify call: over a cache, eager on a CPU and on the static path, it takes a mask.
    assert eager.call_stats == static.call_stats == lora | {"attention": "sdpa-mask"}
    compiled = end_warmup(static)
    assert all(seconds > 0 for seconds in compiled.values())
    # After the warm-up no shape is compiled: a 2-row call runs on the 4-row graph, padded; a
    # 6-row call (no larger graph) and a 2-row draft block (the LoRA on) run eagerly.
    later = [
        (pack([causal_segment(_tokens(generator, 2), position)]), "padded"),
        (pack([causal_segment(_tokens(generator, 6), position + 1)]), "eager"),
        (pack([draft_block(_tokens(generator, 1), position + 2, 1, MASK_ID)]), "eager"),
    ]
    for call, path in later:
        before = static.static.calls[path]
        # (a cache the compiled calls wrote: float32 rounding of the rotary embedding, as above)
        assert _both(eager, static, call, 1) < 1e-5
        assert static.static.calls[path] == before + 1
    assert static.static.compile_s == compiled


def test_attention_windows_halve_the_capacity_in_multiples_of_16():
    assert attention_windows(200) == [32, 64, 112, 200]
    assert attention_windows(64) == [16, 32, 64]
    assert attention_windows(10) == [10]
    assert attention_windows(4096, count=2) == [2048, 4096]


def test_a_compiled_call_attends_the_smallest_window_that_holds_it(checkpoint):
    """A shape compiled on a short cache has a graph for each window; as the cache grows its calls
    move to larger windows, and they equal eager calls on the same prefix all along."""
    eager = load_nemotron(checkpoint, dtype="float64")
    static = static_twin(eager, "default", 200)
    assert static.static.windows == [32, 64, 112, 200]
    generator = torch.Generator().manual_seed(6)
    assert _both(eager, static, pack([causal_segment(_tokens(generator, 20), 0)]), 20) < 1e-9
    position = 20
    while position + WIDTH + 1 <= 200:
        verify = pack([causal_segment(_tokens(generator, WIDTH + 1), position)])
        # (float32 rotary rounding in inductor, as in the LoRA test above)
        assert _both(eager, static, verify, WIDTH + 1) < 1e-5, position
        position += WIDTH + 1
    # Compiled at its second sighting (24 rows committed, 28 needed): every window.
    assert static.static._graphs == {(WIDTH + 1, False): [32, 64, 112, 200]}
    # Every later call on the smallest window holding it: 32 up to 8 calls in, then 64, 112, 200.
    assert static.static.window_calls == {32: 1, 64: 8, 112: 12, 200: 22}
    assert static.static.calls["compiled"] == 1 + sum(static.static.window_calls.values())  # + the compiling call


def test_a_failing_compile_is_one_clear_error(checkpoint):
    model = enable_static(load_nemotron(checkpoint, dtype="float64"), "default", 32)

    def no_compiler(*inputs):
        raise RuntimeError("InvalidCxxCompiler: No working C++ compiler found in torch._inductor.config.cpp.cxx")

    model.static._compiled = no_compiler
    model.run(pack([causal_segment(torch.tensor([4, 5, 6]), 0)]))
    model.commit(3)
    call = pack([causal_segment(torch.tensor([7]), 3)])
    model.run(call)  # first sighting: eager
    model.commit(0)
    with pytest.raises(PackedSSError, match=r"torch.compile failed on the 1-row call \(RuntimeError: InvalidCxx.*g\+\+"):
        model.run(call)


def test_an_eager_job_does_not_import_the_compiler():
    """Inductor's compiler (torch._inductor.compile_fx, about a second of every process's start) is
    imported by the first compilation, not by the modules every job imports."""
    probe = ("import sys, packedss.runner, packedss.models.executors, packedss.models.static; "
             "print(sorted(m for m in sys.modules if m.startswith('torch._inductor.compile_fx')))")  # fmt: skip
    done = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True, timeout=300)
    assert done.returncode == 0 and done.stdout.strip() == "[]", done.stdout + done.stderr[-2000:]
