"""python -m packedss.preflight: one line of versions, exit 0 here; a backbone whose forward does
not take the adapters' cache keyword (as in transformers before the rename) is refused in one
line, exit 2; hydra-core and omegaconf are reported absent without killing it, and refused only
when asked for."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest
import torch
import transformers

from packedss.errors import run_reporting
from packedss.paths import PROJECT_ROOT
from packedss.preflight import main


def preflight(capsys, *args: str) -> tuple[int, str, str]:
    """`python -m packedss.preflight ARGS` in this process (its exit status, stdout, stderr): the
    changes to the environment are the test's monkeypatches; the module as a fresh interpreter
    runs it is the first test's."""
    capsys.readouterr()
    status = run_reporting(lambda: main(list(args)))
    out = capsys.readouterr()
    return status, out.out, out.err


def test_the_preflight_prints_one_line_of_versions_and_passes_here(tmp_path):
    done = subprocess.run([sys.executable, "-m", "packedss.preflight", "--require", "hydra-core,omegaconf", "--json",
                           str(tmp_path / "preflight.json")], capture_output=True, text=True, timeout=300,
                          env={**os.environ, "PYTHONPATH": str(PROJECT_ROOT / "src")})  # fmt: skip
    assert done.returncode == 0, done.stderr
    (line,) = done.stdout.splitlines()
    assert line.startswith(f"versions: python {sys.version.split()[0]}, torch {torch.__version__} (CUDA ")
    assert f"transformers {transformers.__version__}, hydra-core " in line and ", omegaconf " in line
    assert line.endswith(torch.cuda.get_device_name(0) if torch.cuda.is_available() else "no CUDA device")
    report = json.loads((tmp_path / "preflight.json").read_text())
    assert report["line"] == line and report["refused"] is None
    assert report["backbones"] == {"Ministral3Model": "takes 'cache'", "Qwen3Model": "takes 'cache'"}


def test_a_backbone_without_the_cache_keyword_is_refused_in_one_line(tmp_path, capsys, monkeypatch):
    class Qwen3Model:  # transformers 5.17's signature: the cache is past_key_values, anything else is swallowed
        def forward(self, input_ids=None, attention_mask=None, position_ids=None, past_key_values=None, **kwargs):
            pass

    monkeypatch.setattr(transformers, "Qwen3Model", Qwen3Model)
    status, out, err = preflight(capsys, "--json", str(tmp_path / "preflight.json"))
    assert status == 2 and len(out.splitlines()) == 1  # the versions still come first
    (line,) = err.splitlines()
    assert line.startswith(f"error: transformers {transformers.__version__}: Qwen3Model.forward takes no 'cache' keyword "
                           "(its cache keyword: past_key_values)")  # fmt: skip
    assert "install transformers~=5.24.0" in line
    assert json.loads((tmp_path / "preflight.json").read_text())["refused"] == line.removeprefix("error: ")


def test_absent_hydra_is_reported_and_refused_only_when_required(capsys, monkeypatch):
    for module in ("hydra", "omegaconf"):
        monkeypatch.setitem(sys.modules, module, None)  # an import of it then fails, as where it is not installed
    status, out, err = preflight(capsys)
    assert status == 0, err
    assert "hydra-core absent, omegaconf absent" in out
    status, out, err = preflight(capsys, "--require", "hydra-core,omegaconf")
    assert status == 2 and "hydra-core absent" in out
    (line,) = err.splitlines()
    assert line.startswith("error: hydra-core and omegaconf absent, but the steps after this one import them; ")
    monkeypatch.undo()
    with pytest.raises(SystemExit) as refused:
        preflight(capsys, "--require", "hydra")
    err = capsys.readouterr().err
    assert refused.value.code == 2 and err.startswith("error: argument --require: unknown hydra; valid: hydra-core")
    assert len(err.splitlines()) == 1
