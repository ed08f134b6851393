"""At T > 0 each sample of a question draws its own random numbers: on a random checkpoint
(whose samples vary, unlike the shipped tiny model's), the samples of a question differ, and a
rerun reproduces each one."""

from __future__ import annotations

from collections import defaultdict

from hydra import compose, initialize_config_dir

from packedss.config import register_configs
from packedss.paths import CONF_DIR
from packedss.records import read_records
from packedss.runner import run_job
from tests.conftest import write_random_nemotron_with_tokenizer

SAMPLES = 4


def _outputs(checkpoint, out_dir) -> dict[str, list[str]]:
    register_configs()
    with initialize_config_dir(config_dir=str(CONF_DIR), version_base="1.3"):
        cfg = compose(config_name="config", overrides=[
            "model=tiny", f"model.path={checkpoint}", "schedule=linear", "width=4", "temperature=1",
            f"samples={SAMPLES}", "limit=2", "max_new_tokens=12", "warmup=false", f"out_dir={out_dir}",
        ])  # fmt: skip
    result = run_job(cfg)
    records, bad = read_records(result.path)
    assert bad == [] and len(records) == 2 * SAMPLES
    outputs = defaultdict(lambda: [None] * SAMPLES)
    for record in records:
        outputs[record["question_id"]][record["sample"]] = record["output_hash"]
    return dict(outputs)


def test_each_sample_of_a_question_has_its_own_seed(tmp_path, hub_offline):
    checkpoint = write_random_nemotron_with_tokenizer(tmp_path / "random", seed=7)
    outputs = _outputs(checkpoint, tmp_path / "out")
    assert len(outputs) == 2
    for question, hashes in outputs.items():
        assert len(set(hashes)) == SAMPLES, (question, hashes)
    assert _outputs(checkpoint, tmp_path / "again") == outputs  # seeded: the same samples again
