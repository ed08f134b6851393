"""A config is checked before the heavy libraries load, so that bad input fails in seconds."""

from __future__ import annotations

import subprocess
import sys


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
