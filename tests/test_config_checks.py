"""A config is checked before the heavy libraries load, so that bad input fails in seconds."""

from __future__ import annotations

import subprocess
import sys

import pytest

from packedss.paths import PROJECT_ROOT

CHECK_WITHOUT_LOADING = """
import sys
from hydra import compose, initialize_config_dir
from packedss.config import check_before_loading, register_configs
from packedss.paths import CONF_DIR
register_configs()
with initialize_config_dir(str(CONF_DIR), version_base="1.3"):
    check_before_loading(compose("config", overrides=["out_dir=" + sys.argv[1]]))
print(sorted(name for name in ("transformers", "torch._inductor") if name in sys.modules))
"""


def test_a_config_is_checked_without_transformers_or_torchs_compiler(tmp_path):
    result = subprocess.run([sys.executable, "-c", CHECK_WITHOUT_LOADING, str(tmp_path / "out")],
                            capture_output=True, text=True, timeout=300, check=True)  # fmt: skip
    assert result.stdout.strip() == "[]"


# Each entry point as a user runs it, in a fresh interpreter (the fork server has torch loaded
# already): `-X importtime` names every module imported before the error line.
HEAVY = ("torch", "transformers")
BEFORE_TORCH = [
    (["run.py", "width=0"], "error: invalid width=0; the speculative width must be >= 1"),
    (["run.py", "width=abc"], "error: invalid value for width: Value 'abc'"),
    (["run.py", "model=tiny-sdar", "model.width=0"], "error: invalid model.width=0"),
    (["run.py", "temperature=nan"], "error: invalid temperature=nan"),
    (["run.py", "schedule=pld", "schedule.max_ngram=0"], "error: invalid schedule.max_ngram=0"),
    (["run.py", "-m", "width=0,abc"], "error: 2 of 2 jobs of this sweep are invalid"),
    (["-m", "packedss.plan", "width=0"], "error: 1 of 1 jobs of this sweep are invalid"),
]


@pytest.mark.parametrize("argv, message", BEFORE_TORCH, ids=[" ".join(case[0]) for case in BEFORE_TORCH])
def test_a_bad_value_is_reported_before_torch_or_transformers_load(argv, message, tmp_path):
    from tests.bad_inputs import offline_env

    if argv[0] == "run.py":
        argv = [str(PROJECT_ROOT / "run.py"), *argv[1:], f"hydra.run.dir={tmp_path}/h", f"hydra.sweep.dir={tmp_path}/m"]
    result = subprocess.run([sys.executable, "-X", "importtime", *argv], capture_output=True, text=True,
                            env=offline_env(tmp_path), cwd=tmp_path, timeout=300)  # fmt: skip
    assert result.returncode == 2, result.stderr[-3000:]
    reported = [line for line in result.stderr.splitlines() if not line.startswith("import time:")]
    assert reported[0].startswith(message), reported
    imported = {line.rsplit("|", 1)[1].strip() for line in result.stderr.splitlines() if line.startswith("import time:")}
    assert "hydra" in imported and not imported & set(HEAVY), sorted(imported & set(HEAVY))
    assert not (tmp_path / "h").exists() and not (tmp_path / "m").exists()
