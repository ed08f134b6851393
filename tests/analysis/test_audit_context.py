"""The divergence audit past SetDLM's context: once a response outgrows `length`, each schedule
drops the oldest cache rows before its own calls (as the released decoder does), so a lossless
schedule and AR see other windows from there on. Such a divergence is `context`, not
`unexplained`; one before the first dropping call still is unexplained."""

from __future__ import annotations

import pytest

from packedss.analysis import audit, load_results
from packedss.runner import run_job
from tests.test_runner import composed  # noqa: F401 (a fixture)
from tests.test_unheld_behaviours import TINY_SET, _setdlm_with_context


@pytest.fixture(scope="module")
def slid(tmp_path_factory, request):
    if not (TINY_SET / "config.json").is_file():
        pytest.skip("the shipped tiny set model is absent")
    root = tmp_path_factory.mktemp("slid")
    checkpoint = _setdlm_with_context(root / "tiny-set-32", 32, 4)  # prompts cut to 7 tokens, outputs of up to 40
    compose = request.getfixturevalue("composed")
    for schedule in ("ar", "packed", "linear"):
        run_job(compose(["model=tiny-set", f"model.path={checkpoint}", f"schedule={schedule}", "width=4", "limit=6",
                         "max_new_tokens=40", "dtype=float32", "progress=false", f"out_dir={root / 'records'}"]))  # fmt: skip
    return load_results(root, n_resamples=50)


def test_divergences_past_the_context_are_explained_by_it(slid):
    audited = audit.audit(slid.per_question)
    counts = audit.counts(audited)
    assert counts["context"] > 0, counts  # the windows did differ: the test holds something
    assert counts["unexplained"] == 0, audit.unexplained_lines(audited)
    assert "past the context (after a call that dropped cache rows)" in audit.note(audited)


def test_the_first_slid_token_is_counted_from_the_first_call_that_dropped_rows(slid):
    for _, row in slid.per_question.iterrows():
        first = audit.slid_from(row)
        dropped = row["cache_rows_dropped"]
        if not any(dropped):
            assert first is None
            continue
        # The prompt, the tokens emitted before the dropping call and that call's rows outgrow the context.
        call = next(k for k, rows in enumerate(dropped) if rows)
        assert row["prompt_tokens"] + first + row["rows_evaluated"][call] > 32 >= row["prompt_tokens"] + first - 1


def test_a_divergence_before_any_dropped_row_is_still_unexplained():
    assert audit.classify([1, 2, 4], [], [1, 2, 3], [], slid_from=3) == ("unexplained", 2)
    assert audit.classify([1, 2, 4], [], [1, 2, 3], [], slid_from=2) == ("context", 2)
    assert audit.classify([1, 2, 4], [], [1, 2, 3], [], slid_from=None) == ("unexplained", 2)
