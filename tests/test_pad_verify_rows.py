"""schedule.pad_verify for the Nemotron family: false runs Packed-SS calls without padding (every
row evaluated is useful) and says so in the record; true (the paper's counting) pads the verify
segment of short calls to B rows."""

from __future__ import annotations

import pytest
from hydra import compose, initialize_config_dir

from packedss.config import register_configs
from packedss.paths import CONF_DIR
from packedss.records import read_records
from packedss.runner import run_job

WIDTH = 4


def _records(model_overrides, out_dir, pad_verify: bool) -> list[dict]:
    register_configs()
    with initialize_config_dir(config_dir=str(CONF_DIR), version_base="1.3"):
        cfg = compose(config_name="config", overrides=[
            *model_overrides, "schedule=packed", f"width={WIDTH}", f"schedule.pad_verify={str(pad_verify).lower()}",
            "limit=3", "max_new_tokens=21", "warmup=false", f"out_dir={out_dir}",
        ])  # fmt: skip
    records, bad = read_records(run_job(cfg).path)
    assert bad == [] and len(records) == 3
    return records


@pytest.mark.parametrize("pad_verify", [False, True], ids=["nopad", "pad"])
def test_pad_verify_decides_the_rows_of_packed_calls(pad_verify, model_overrides, tmp_path, hub_offline):
    records = _records(model_overrides, tmp_path / "out", pad_verify)
    for record in records:
        assert record["family"] == "nemotron" and record["pad_verify"] is pad_verify
        calls = list(zip(record["rows_evaluated"], record["rows_useful"]))[record["nfe_prefill"]:]
        assert calls, record["question_id"]
        if pad_verify:
            assert all(rows == 2 * (WIDTH + 1) for rows, _ in calls), calls
        else:
            assert all(rows == useful for rows, useful in calls), calls
    # calls after a partly accepted block verify fewer than W drafts: those are what padding changes
    assert any(rows != useful for record in records for rows, useful in zip(record["rows_evaluated"], record["rows_useful"])) is pad_verify
