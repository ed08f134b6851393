"""The per-iteration draft counts of a record (`drafted`, `accepted_drafts`) and their identities."""

import pytest

from packedss.records import validate_record
from tests.test_records import GOOD

WITH_DRAFTS = GOOD | {"drafted": [1, 1], "accepted_drafts": [1, 1]}


def test_record_with_draft_counts_is_valid_and_old_records_without_them_too():
    assert validate_record(WITH_DRAFTS) == []
    assert validate_record(GOOD) == []


@pytest.mark.parametrize(
    "change,problem",
    [
        ({"drafted": [1, 1, 0]}, "len(drafted)"),
        ({"accepted_drafts": None}, "len(drafted)"),
        ({"drafted": [2, 1]}, "sum(drafted) != draft_proposed"),
        ({"accepted_drafts": [2, 0]}, "outside 0..drafted"),
        ({"drafted": [0, 3], "accepted_drafts": [0, 3], "draft_proposed": 3, "draft_accepted": 3}, "above its emitted"),
    ],
)
def test_draft_count_violations_are_reported(change, problem):
    assert any(problem in p for p in validate_record(WITH_DRAFTS | change))
