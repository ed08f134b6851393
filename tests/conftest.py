"""Shared fixtures: tiny random-weight checkpoints written in the real formats (never downloaded)."""

from __future__ import annotations

import os
import sys
from dataclasses import dataclass
from pathlib import Path

# Inductor's CPU graphs are the suite's largest cold cost (docs/development.md, "Compiled graphs in
# the suite"). The tests assert what a compiled graph computes against the eager path, not its
# speed, so they compile scalar C++ (no vector ISA) at -O1. Set before torch and transformers are
# imported (transformers' models import inductor's config, which reads both), and inherited by
# every run.py, script and gpu_check step the suite starts.
os.environ.setdefault("TORCHINDUCTOR_VEC_ISA_OK", "0")
os.environ.setdefault("CXX", str(Path(__file__).resolve().parent / "g++-O1"))

import pytest
import torch
from torch import nn
from transformers import Ministral3Config, Ministral3Model

from packedss.models.nemotron import load_nemotron, save_nemotron
from packedss.paths import PROJECT_ROOT
from tests.hydra_leftovers import hydra_run_dirs, leftovers, report_lines

# Tiny models and toy calls are dominated by per-op overhead; extra intra-op threads only
# oversubscribe the cores (measured: 25x slower sampling tests with the default thread count).
torch.set_num_threads(1)

SHARED_DATA = Path(__file__).resolve().parents[2] / "shared" / "data"

TINY_VOCAB = 40
MASK_ID = 3
EOS_ID = 2


def write_random_nemotron(path: Path, seed: int = 0, vocab: int = TINY_VOCAB, layers: int = 2) -> Path:
    torch.manual_seed(seed)
    config = Ministral3Config(
        vocab_size=vocab,
        hidden_size=32,
        intermediate_size=64,
        num_hidden_layers=layers,
        num_attention_heads=4,
        num_key_value_heads=2,
        head_dim=8,
        max_position_embeddings=1024,
        rope_parameters={"rope_type": "default", "rope_theta": 10000.0, "llama_4_scaling_beta": 0.1, "original_max_position_embeddings": 1024},
        pad_token_id=0,
        bos_token_id=1,
        eos_token_id=EOS_ID,
    )
    backbone = Ministral3Model(config)
    head = nn.Linear(config.hidden_size, vocab, bias=False)
    # Larger weights give a peakier, more repetitive random model, so drafts sometimes match.
    with torch.no_grad():
        head.weight.mul_(8.0)
    save_nemotron(path, backbone, head, {"mask_token_id": MASK_ID, "block_size": 32})
    return path


@pytest.fixture(scope="session")
def tiny_checkpoint(tmp_path_factory) -> Path:
    return write_random_nemotron(tmp_path_factory.mktemp("tiny-nemotron"))


@pytest.fixture(scope="session")
def tiny_model(tiny_checkpoint):
    return load_nemotron(tiny_checkpoint, device="cpu", dtype="float64")


# The shipped tiny models in float32, one instance per test module (a module's tests may change
# its adapter, e.g. build a batch executor on it).
SHIPPED = PROJECT_ROOT / "assets" / "models"


@pytest.fixture(scope="module")
def tiny():
    return load_nemotron(SHIPPED / "tiny", dtype="float32")


@pytest.fixture(scope="module")
def tiny_set():
    from packedss.models.setdlm import load_setdlm

    return load_setdlm(SHIPPED / "tiny-set", dtype="float32")


@pytest.fixture(scope="module")
def tiny_sdar():
    from packedss.models.sdar import load_sdar

    return load_sdar(SHIPPED / "tiny-sdar", dtype="float32")


def write_test_tokenizer(path: Path) -> int:
    """A small byte-level BPE tokenizer trained on arith text (<pad> 0, <bos> 1, <eos> 2, <mask> 3),
    saved for AutoTokenizer like the shipped models' tokenizers. Returns its vocabulary size."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
    from transformers import PreTrainedTokenizerFast

    from packedss.tasks.arith import generate

    specials = ["<pad>", "<bos>", "<eos>", "<mask>"]
    tokenizer = Tokenizer(models.BPE())
    tokenizer.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tokenizer.decoder = decoders.ByteLevel()
    corpus = [p["question"] + "\n" + p["answer"] for p in generate("train", 200, 0)]
    trainer = trainers.BpeTrainer(vocab_size=300, special_tokens=specials,
                                  initial_alphabet=pre_tokenizers.ByteLevel.alphabet())  # fmt: skip
    tokenizer.train_from_iterator(corpus, trainer)
    fast = PreTrainedTokenizerFast(tokenizer_object=tokenizer, pad_token="<pad>", bos_token="<bos>",
                                   eos_token="<eos>", mask_token="<mask>")  # fmt: skip
    path.mkdir(parents=True, exist_ok=True)
    fast.save_pretrained(str(path))
    return tokenizer.get_vocab_size()


def write_random_nemotron_with_tokenizer(path: Path, seed: int = 0) -> Path:
    """A random Nemotron-format checkpoint with the test tokenizer, loadable like the shipped models."""
    vocab = write_test_tokenizer(path)
    torch.manual_seed(seed)
    config = Ministral3Config(
        vocab_size=vocab, hidden_size=32, intermediate_size=64, num_hidden_layers=2, num_attention_heads=4,
        num_key_value_heads=2, head_dim=8, max_position_embeddings=2048,
        rope_parameters={"rope_type": "default", "rope_theta": 10000.0, "llama_4_scaling_beta": 0.1,
                         "original_max_position_embeddings": 2048},
        pad_token_id=0, bos_token_id=1, eos_token_id=2,
    )  # fmt: skip
    backbone = Ministral3Model(config)
    head = nn.Linear(config.hidden_size, vocab, bias=False)
    with torch.no_grad():
        head.weight.mul_(8.0)
    save_nemotron(path, backbone, head, {"mask_token_id": 3, "block_size": 32})
    return path


SHIPPED_TINY = SHIPPED / "tiny" / "config.json"


@pytest.fixture(scope="module")
def model_overrides(tmp_path_factory) -> list[str]:
    """Overrides for the tiny model: the shipped one when it is present, else a random checkpoint
    in the same format."""
    if SHIPPED_TINY.is_file():
        return ["model=tiny"]
    path = write_random_nemotron_with_tokenizer(tmp_path_factory.mktemp("random-tiny"))
    return ["model=tiny", f"model.path={path}"]


def pytest_addoption(parser):
    parser.addoption("--all-references", action="store_true",
                     help="grade every task of the code data sets with its reference solution (make test-references), "
                          "not the fixed part of tests/tasks/test_reference_solutions.py")  # fmt: skip


@pytest.hookimpl(trylast=True)
def pytest_collection_modifyitems(config, items):
    """`--dist loadgroup` on pytest 9: pytest-xdist 3.8 marks an item's group by appending
    `@<group>` to `item._nodeid`, which pytest 9 no longer reads (the id is `item._id`), so every
    xdist_group would be ignored silently. The suffix goes where pytest reads it, on the workers."""
    if not getattr(config.option, "loadgroup", False):
        return
    from _pytest.nodeid import NodeId

    for item in items:
        names = {str(m.args[0] if m.args else m.kwargs.get("name", "default")) for m in item.iter_markers("xdist_group")}
        suffix = "@" + "_".join(sorted(names))
        if names and not item.nodeid.endswith(suffix):
            item._id = NodeId.parse(item.nodeid + suffix)
            assert item.nodeid.endswith(suffix), "pytest keeps the node id elsewhere now: update this hook"


HYDRA_DIRS_BEFORE = pytest.StashKey[set]()


def pytest_sessionstart(session):
    session.config.stash[HYDRA_DIRS_BEFORE] = hydra_run_dirs(PROJECT_ROOT)


def pytest_sessionfinish(session, exitstatus):
    """Fails the session when its tests left Hydra run directories in the repository; runs of
    the user's own in the meantime are named in a note and not counted (tests/hydra_leftovers.py)."""
    if hasattr(session.config, "workerinput"):  # a pytest-xdist worker: the controller checks once, at the end
        return
    temp_root = session.config._tmp_path_factory.getbasetemp()  # every worker's and test's tmp_path is under it
    error, note = report_lines(leftovers(PROJECT_ROOT, session.config.stash[HYDRA_DIRS_BEFORE], temp_root))
    reporter = session.config.pluginmanager.get_plugin("terminalreporter")
    if reporter is not None and (error or note):
        reporter.ensure_newline()
        for line, colour in ((note, "yellow"), (error, "red")):
            if line:
                reporter.write_line(line, **{colour: True})
    if error:
        session.exitstatus = pytest.ExitCode.TESTS_FAILED


@dataclass
class GpuDryRun:
    report: dict  # the summary, gpu_check.json
    unrehearsed: str  # why the run is not the empty environment's ("": it is)
    site: Path | None = None  # where the run installed the wheels (None: unrehearsed)


@pytest.fixture(scope="session")
def gpu_dry_run(tmp_path_factory) -> GpuDryRun:
    """DRY=1 scripts/gpu_check.sh once for tests/test_gpu_check.py and tests/test_gpu_rehearsal.py
    (one xdist group): from the empty environment of the rehearsal, or with this Python when the
    package index cannot be reached."""
    from tests.test_gpu_check import dry_run
    from tests.test_gpu_rehearsal import empty_environment

    tmp_path = tmp_path_factory.mktemp("gpu-dry-run")
    environment = empty_environment(tmp_path)
    if isinstance(environment, str):
        own = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
        return GpuDryRun(dry_run(tmp_path, sys.executable, own), unrehearsed=environment)
    python, env = environment
    return GpuDryRun(dry_run(tmp_path, python, env), unrehearsed="", site=Path(env["SITE"]))


@pytest.fixture
def hub_offline(monkeypatch, tmp_path):
    """The Hugging Face libraries offline in this process. They read HF_HUB_OFFLINE when first
    imported, so setting the variable alone is too late once another test imported them; without
    it an unreachable hub costs ~20 s of retries per test."""
    import datasets.config
    import huggingface_hub.constants

    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    monkeypatch.setenv("HF_DATASETS_OFFLINE", "1")
    monkeypatch.setenv("HF_HOME", str(tmp_path / "hf"))
    monkeypatch.setattr(huggingface_hub.constants, "HF_HUB_OFFLINE", True)
    monkeypatch.setattr(datasets.config, "HF_HUB_OFFLINE", True)
    monkeypatch.setattr(datasets.config, "HF_DATASETS_OFFLINE", True)
