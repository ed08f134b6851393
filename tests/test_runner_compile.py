"""model.compile through run.py: the static compiled path decodes exactly what the eager path
decodes, compiles in the untimed warm-up (reported per shape), and keeps its own record file."""

from __future__ import annotations

import pytest

from packedss.errors import PackedSSError
from packedss.records import read_records
from packedss.runner import run_job
from tests.test_fidelity import _compose


# The compiled run's settings; tests/test_job_identity.py's compiled job decodes them too, so that
# whichever of the two runs second finds the other's graphs in inductor's FX graph cache.
COMPILED_RUN = ["schedule=packed", "width=4", "limit=2", "max_new_tokens=24"]


def test_compiled_run_equals_the_eager_run(model_overrides, tmp_path):
    common = [*model_overrides, *COMPILED_RUN, f"out_dir={tmp_path}"]
    eager = run_job(_compose(common))
    compiled = run_job(_compose([*common, "model.compile=default"]))
    assert compiled.path != eager.path and "-compiled-default" in compiled.path.name
    eager_records, _ = read_records(eager.path)
    compiled_records, bad = read_records(compiled.path)
    assert bad == []
    assert [r["output_hash"] for r in compiled_records] == [r["output_hash"] for r in eager_records]
    assert [r["nfe_total"] for r in compiled_records] == [r["nfe_total"] for r in eager_records]
    assert {r["compile"] for r in compiled_records} == {"default"}
    assert all(r["compile_s"] and all(s > 0 for s in r["compile_s"].values()) for r in compiled_records)


def test_compile_without_a_warmup_is_refused(model_overrides, tmp_path):
    cfg = _compose([*model_overrides, "model.compile=default", "warmup=false", f"out_dir={tmp_path}"])
    with pytest.raises(PackedSSError, match="needs warmup=true"):
        run_job(cfg)
