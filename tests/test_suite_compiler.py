"""The suite's inductor settings (tests/conftest.py): scalar C++ compiled by tests/g++-O1, which
passes g++ everything inductor gives it but -O3, turned into -O1. Both are read when inductor's
config is first imported, so they hold only if conftest sets them before anything imports it."""

from __future__ import annotations

import os
import subprocess
from pathlib import Path

WRAPPER = Path(__file__).resolve().parent / "g++-O1"


def test_inductor_reads_the_settings_conftest_leaves():
    """conftest's defaults, or a developer's own CXX and TORCHINDUCTOR_VEC_ISA_OK, are what
    inductor reads: it would read neither if conftest set them after inductor's config was imported."""
    from torch._inductor import config, cpp_builder

    assert config.cpp.vec_isa_ok is (os.environ["TORCHINDUCTOR_VEC_ISA_OK"] == "1")
    assert cpp_builder.get_cpp_compiler() == os.environ["CXX"]
    if Path(os.environ["CXX"]) == WRAPPER:
        assert cpp_builder.is_gcc()  # inductor picks gcc's flags by the compiler's name


def test_the_wrapper_turns_o3_into_o1_and_passes_the_rest(tmp_path):
    echo = tmp_path / "echo-gxx"
    echo.write_text('#!/usr/bin/env bash\nprintf "%s\\n" "$@"\n')
    echo.chmod(0o755)
    given = ["-O3", "-DNDEBUG", "-ffp-contract=off", "-shared", "-fPIC", "a file.cpp", "-o", "out.so"]
    done = subprocess.run([str(WRAPPER), *given], env={**os.environ, "PACKEDSS_TEST_GXX": str(echo)},
                          capture_output=True, text=True, check=True)  # fmt: skip
    assert done.stdout.splitlines() == ["-O1", *given[1:]]
