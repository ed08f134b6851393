"""The cost twin (packedss.models.cost_twin): outputs are the decoding model's, both models get the
very same calls, commits and resets, the call's model time is the cost model's, and bad settings
fail before anything loads."""

from __future__ import annotations

import json
import logging
import sys

import pytest
import torch

from tests.test_runner import readable_name

from packedss.decoding import LTRSettings, Sampling, decode_ltr
from packedss.decoding.calls import causal_segment, pack
from packedss.decoding.trace import Meter, RecordingModel
from packedss.errors import PackedSSError
from packedss.models import cost_twin
from packedss.models.cost_twin import CostTwin, build_cost_model, cost_spec, parameter_count, random_adapter, shape_config
from packedss.models.nemotron import load_nemotron
from packedss.models.static import static_capacity
from packedss.paths import PROJECT_ROOT
from packedss.records import read_records
from tests.conftest import EOS_ID, write_random_nemotron
from tests import bad_inputs

WIDTH = 3
PROMPTS = [[5, 9, 11, 30, 7], [4, 4, 12], list(range(4, 20))]
MAX_NEW = 24
CPU = torch.device("cpu")


@pytest.fixture(scope="module")
def checkpoint(tmp_path_factory):
    return write_random_nemotron(tmp_path_factory.mktemp("cost-twin"), seed=5)


class Log(RecordingModel):
    """A RecordingModel that also logs commits and resets, in order."""

    def __init__(self, model):
        super().__init__(model)
        self.events = []

    def run(self, call):
        self.events.append(("run", len(self.calls)))
        return super().run(call)

    def commit(self, rows):
        self.events.append(("commit", rows))
        super().commit(rows)

    def reset(self):
        self.events.append(("reset",))
        super().reset()


def _cost_model(decoder, shape="test", layers=1, dtype="bfloat16"):
    return build_cost_model(cost_spec(shape, layers, dtype, CPU), decoder)


def _settings(schedule):
    return LTRSettings(schedule, WIDTH, MAX_NEW, (EOS_ID,), Sampling(0.0, "rejection", None))


@pytest.mark.parametrize("schedule", ["ar", "linear", "quadratic", "packed"])
def test_outputs_equal_the_plain_decode_and_both_models_get_the_same_calls(checkpoint, schedule):
    plain = load_nemotron(checkpoint, dtype="float32")
    decoder = load_nemotron(checkpoint, dtype="float32")
    cost = _cost_model(decoder)
    left, right = Log(decoder), Log(cost)
    twin = CostTwin(left, right, "test")
    for prompt in PROMPTS:
        a, b = decode_ltr(plain, prompt, _settings(schedule)), decode_ltr(twin, prompt, _settings(schedule))
        assert (b.tokens, b.rows_evaluated, b.accepted, b.nfe_total) == (a.tokens, a.rows_evaluated, a.accepted,
                                                                           a.nfe_total)  # fmt: skip
    assert left.events == right.events and len(left.calls) == len(right.calls) > len(PROMPTS)
    for (one, logits), (other, cost_logits) in zip(left.calls, right.calls):
        for name in ("tokens", "positions", "roles", "attend"):
            assert torch.equal(getattr(one, name), getattr(other, name)), name
        assert cost_logits.dtype == torch.float32 and cost_logits.shape[1] >= logits.shape[1]


def test_the_static_path_of_both_models_gives_the_plain_outputs(checkpoint):
    plain = load_nemotron(checkpoint, dtype="float32")
    decoder = load_nemotron(checkpoint, dtype="float32")
    capacity = static_capacity(max(map(len, PROMPTS)), MAX_NEW, 2 * (WIDTH + 1))  # Packed-SS: 2B rows
    twin = CostTwin(decoder, _cost_model(decoder), "test").enable_static("default", capacity)
    assert twin.end_warmup() == {} and not decoder.static.compiling and not twin.cost.static.compiling
    for prompt in PROMPTS:
        a, b = decode_ltr(plain, prompt, _settings("packed")), decode_ltr(twin, prompt, _settings("packed"))
        assert b.tokens == a.tokens
    assert twin.static is twin.cost.static and twin.cost.static.calls["prefill"] == len(PROMPTS)
    assert decoder.static.calls["prefill"] == len(PROMPTS)


class Charged:
    """A CallModel that states a charge of `charge` seconds per call."""

    device, mask_token_id, charge = CPU, 3, 0.25

    def __init__(self):
        self.charged_s = 0.0
        self.call_stats: dict[str, int] = {}

    def run(self, call):
        self.charged_s = self.charge
        return torch.zeros(call.rows, 4)

    def synchronize(self):
        pass


def test_a_call_is_charged_the_cost_models_time_and_the_rest_leaves_the_wall(checkpoint):
    from packedss.decoding.calls import causal_segment, pack
    from packedss.decoding.trace import Emitter

    meter = Meter(Charged())
    for rows in (3, 1, 1):
        meter.run(pack([causal_segment(torch.arange(rows), 0)]))
    out = meter.finish(Emitter(4, (), None), 3, [1, 1], [0, 0], [0, 0], 0)
    assert out.call_model_s == [0.25] * 3 and out.model_s == 0.75
    assert out.wall_s >= out.model_s and out.nonmodel_s == out.wall_s - out.model_s
    assert out.nonmodel_s < 0.05  # the only other time here is the meter's own bookkeeping


def test_the_twin_times_the_cost_model_not_the_decoding_model(checkpoint, monkeypatch):
    decoder = load_nemotron(checkpoint, dtype="float32")
    twin = CostTwin(decoder, _cost_model(decoder), "test")
    clock = iter(range(100, 1000, 7))  # perf_counter: each reading 7 s after the last
    monkeypatch.setattr(cost_twin.time, "perf_counter", lambda: next(clock))
    from packedss.decoding.calls import causal_segment, pack

    twin.run(pack([causal_segment(torch.tensor([5, 6, 7]), 0)]))
    assert twin.charged_s == 7  # one reading before the cost model's call, one after


class Clocked:
    """A model whose run and synchronize take `run_s` and `sync_s` on a fake clock."""

    def __init__(self, clock: list[float], run_s: float, sync_s: float):
        self.clock, self.run_s, self.sync_s = clock, run_s, sync_s
        self.device, self.mask_token_id = CPU, 0

    def run(self, call):
        self.clock[0] += self.run_s
        return torch.zeros(len(call.tokens), 4)

    def synchronize(self):
        self.clock[0] += self.sync_s


def test_the_charged_interval_holds_only_the_cost_models_run_and_synchronize(monkeypatch):
    from packedss.decoding.calls import causal_segment, pack

    clock = [100.0]  # advanced by the models themselves, not by reading it
    monkeypatch.setattr(cost_twin.time, "perf_counter", lambda: clock[0])
    twin = CostTwin(Clocked(clock, run_s=50.0, sync_s=20.0), Clocked(clock, run_s=3.0, sync_s=0.5), "test")
    twin.run(pack([causal_segment(torch.tensor([5, 6, 7]), 0)]))
    assert twin.charged_s == 3.5 and clock[0] == 173.5  # the deciding model's 70 s ran, uncharged


def test_the_parameter_estimate_counts_what_random_adapter_builds():
    for shape, layers in (("test", None), ("tiny", 2), ("test", 1)):
        config = shape_config(shape, None, layers)
        adapter = random_adapter(config, CPU, torch.float32, vocab_at_least=100)
        built = sum(p.numel() for p in adapter.backbone.parameters()) + adapter.head.weight.numel()
        assert parameter_count(config, vocab_at_least=100) == built


@pytest.mark.parametrize("shape", list(cost_twin.SHAPES))
def test_building_a_named_shape_warns_nothing_about_its_rope(shape):
    heard: list[str] = []
    handler = logging.Handler(logging.WARNING)
    handler.emit = lambda record: heard.append(record.getMessage())
    library = logging.getLogger("transformers")  # its own handler, not propagated to pytest's
    library.addHandler(handler)
    try:
        spec = cost_spec(shape, 1, "bfloat16", CPU)
        random_adapter(spec.config, torch.device("meta"), torch.bfloat16)  # the backbone's config, no memory
    finally:
        library.removeHandler(handler)
    assert not [message for message in heard if "rope" in message.lower()], heard


def _transformers_warnings(build) -> list[str]:
    """The warnings transformers logs while `build()` runs, at the library's own WARNING level."""
    from transformers.utils import logging as transformers_logging

    heard: list[str] = []
    handler = logging.Handler(logging.WARNING)
    handler.emit = lambda record: heard.append(record.getMessage())
    library = logging.getLogger("transformers")
    previous = transformers_logging.get_verbosity()
    transformers_logging.set_verbosity_warning()
    library.addHandler(handler)
    try:
        build()
    finally:
        library.removeHandler(handler)
        transformers_logging.set_verbosity(previous)
    return heard


def _config_json_twin(directory):
    spec = cost_spec(str(directory), None, "float32", CPU)
    return random_adapter(spec.config, CPU, torch.float32)


def test_a_twin_of_a_checkpoints_config_json_warns_nothing_and_keeps_its_rope(checkpoint):
    for directory in (PROJECT_ROOT / "assets" / "models" / "tiny", checkpoint):
        built = []
        heard = _transformers_warnings(lambda: built.append(_config_json_twin(directory)))
        assert heard == [], (directory, heard)
        rope = json.loads((directory / "config.json").read_text())["rope_parameters"]
        assert built[0].backbone.config.rope_parameters == rope  # the attention scaling reads all of it
        # a prefill runs: the attention's llama-4 scaling divides by original_max_position_embeddings
        logits = built[0].run(pack([causal_segment(torch.tensor([4, 5, 6]), 0)]))
        assert torch.isfinite(logits).all()


def test_a_stray_rope_key_in_a_config_json_is_still_reported(tmp_path):
    config = json.loads((PROJECT_ROOT / "assets" / "models" / "tiny" / "config.json").read_text())
    config["rope_parameters"]["stray_factor"] = 2.0
    (tmp_path / "config.json").write_text(json.dumps(config))
    heard = _transformers_warnings(lambda: _config_json_twin(tmp_path))
    assert [m for m in heard if "Unrecognized keys in `rope_parameters`" in m and "stray_factor" in m], heard


def test_a_named_shape_is_cut_to_its_layers_and_labelled():
    spec = cost_spec("nemotron3b", 6, "bfloat16", CPU)
    assert spec.label == "nemotron3b:6L:bfloat16:cpu"
    assert 1.45e9 < spec.params < 1.55e9 and spec.bytes == 2 * spec.params
    assert spec.context == 16384


@pytest.mark.parametrize(
    "shape,layers,dtype,message",
    [
        ("nemotron5b", None, "bfloat16", "unknown shape 'nemotron5b'; valid: tiny, nemotron3b, nemotron8b, sdar8b, test"),
        ("nemotron3b", 27, "bfloat16", "invalid layer count 27 for shape nemotron3b; valid: 1..26"),
        ("nemotron3b", 0, "bfloat16", "invalid layer count 0 for shape nemotron3b; valid: 1..26"),
        ("test", None, "int4", "invalid cost dtype 'int4'"),
        ("nemotron8b", None, "float32", "cost model nemotron8b:34L:float32:cpu needs about 31.6 GiB (8.49B parameters)"),
    ],
)
def test_bad_cost_settings_are_one_error(shape, layers, dtype, message, monkeypatch):
    monkeypatch.setattr(cost_twin, "available_bytes", lambda device: 24 * 2**30)
    with pytest.raises(PackedSSError) as err:
        cost_spec(shape, layers, dtype, CPU)
    assert message in str(err.value) and "\n" not in str(err.value)


def test_a_config_directory_is_a_shape_and_its_context_is_checked(checkpoint):
    spec = cost_spec(str(checkpoint), None, "float32", CPU)
    assert spec.context == 1024 and spec.label.endswith(":2L:float32:cpu")
    spec.check_context(1024)
    with pytest.raises(PackedSSError, match="holds 1024 positions, but this run needs 1025"):
        spec.check_context(1025)


@pytest.fixture(scope="module")
def composed():
    from hydra import compose, initialize_config_dir

    from packedss.config import register_configs
    from packedss.paths import CONF_DIR

    register_configs()

    def make(overrides):
        with initialize_config_dir(config_dir=str(CONF_DIR), version_base="1.3"):
            return compose(config_name="config", overrides=overrides)

    return make


def _no_loading(monkeypatch):
    def refuse(*args, **kwargs):
        raise AssertionError("a model was loaded")

    monkeypatch.setattr("packedss.runner.load_adapter", refuse)
    monkeypatch.setattr("packedss.runner.build_cost_model", refuse)


@pytest.mark.parametrize(
    "overrides,message",
    [
        (["model.cost_shape=nemotron5b"], "unknown shape 'nemotron5b'"),
        (["model.cost_shape=nemotron3b", "model.cost_layers=40"], "invalid layer count 40"),
        (["model.cost_shape=nemotron3b", "model.cost_layers=6", "model.cost_dtype=bfloat16"], "needs about 2.8 GiB"),
        (["model.cost_layers=4"], "model.cost_layers is set but model.cost_shape is not"),
        (["model.cost_shape=test", "model.lora=true"], "the cost twin has no proposal LoRA"),
        (["model.cost_shape=test", "model.cost_dtype=int8"], "invalid model.cost_dtype='int8'"),
        (["model.cost_shape=test", "model.family=setdlm"], "needs a nemotron- or sdar-family model"),
    ],
)
def test_the_runner_refuses_bad_cost_settings_before_loading(composed, model_overrides, tmp_path, monkeypatch,
                                                             overrides, message):  # fmt: skip
    from packedss.runner import run_job

    _no_loading(monkeypatch)
    monkeypatch.setattr(cost_twin, "available_bytes", lambda device: 2**30)
    cfg = composed([*model_overrides, *overrides, f"out_dir={tmp_path / 'out'}"])
    with pytest.raises(PackedSSError, match=message):
        run_job(cfg)
    assert not (tmp_path / "out").exists()


def test_the_runner_refuses_a_twin_shorter_than_the_run(composed, model_overrides, tmp_path, monkeypatch):
    from packedss.runner import run_job

    short = write_random_nemotron(tmp_path / "short")
    config = json.loads((short / "config.json").read_text())
    (short / "config.json").write_text(json.dumps(config | {"max_position_embeddings": 40}))
    monkeypatch.setattr("packedss.runner.build_cost_model", lambda *a: (_ for _ in ()).throw(AssertionError("built")))
    cfg = composed([*model_overrides, f"model.cost_shape={short}", "limit=2", "max_new_tokens=16",
                    f"out_dir={tmp_path / 'out'}"])  # fmt: skip
    with pytest.raises(PackedSSError, match="holds 40 positions, but this run needs"):
        run_job(cfg)
    assert not (tmp_path / "out").exists()


def test_run_py_with_a_cost_twin_writes_the_plain_outputs_and_says_whose_time(model_overrides, tmp_path):
    def run(*extra):
        return bad_inputs.run(
            [sys.executable, str(PROJECT_ROOT / "run.py"), *model_overrides, "schedule=packed", "limit=2",
             "max_new_tokens=24", f"out_dir={tmp_path / 'out'}", f"hydra.run.dir={tmp_path}/hydra", *extra], tmp_path,
        )  # fmt: skip

    bad = run("model.cost_shape=nosuch")
    assert bad.returncode == 2 and bad.stderr.strip().splitlines()[-1].startswith("error: unknown shape 'nosuch'")
    assert run().returncode == 0
    assert run("model.cost_shape=test", "model.cost_layers=1", "model.cost_dtype=bfloat16").returncode == 0
    paths = {readable_name(p): p for p in (tmp_path / "out").rglob("*.jsonl")}
    assert sorted(paths) == ["packed-W8-T0-s0-cost-test-1L-bfloat16-cpu.jsonl", "packed-W8-T0-s0.jsonl"]
    plain, twin = (read_records(paths[name])[0] for name in ("packed-W8-T0-s0.jsonl", "packed-W8-T0-s0-cost-test-1L-bfloat16-cpu.jsonl"))
    assert [r["output_hash"] for r in twin] == [r["output_hash"] for r in plain]
    assert [r["nfe_total"] for r in twin] == [r["nfe_total"] for r in plain]
    assert {r["cost_model"] for r in plain} == {None} and {r["cost_model"] for r in twin} == {"test:1L:bfloat16:cpu"}
    assert twin[0]["config_hash"] != plain[0]["config_hash"]


def test_a_config_file_is_read_itself_not_its_directorys_config_json(tmp_path):
    (tmp_path / "config.json").write_text(json.dumps(dict(shape_config("test"), num_hidden_layers=2)))
    (tmp_path / "other.json").write_text(json.dumps(dict(shape_config("test"), num_hidden_layers=1)))
    assert shape_config(None, str(tmp_path / "other.json"))["num_hidden_layers"] == 1
    assert shape_config(None, str(tmp_path))["num_hidden_layers"] == 2


def test_a_cost_twin_names_its_size_in_the_unit_that_shows_it():
    assert cost_twin.cost_spec("nemotron3b", 6, "bfloat16", torch.device("cpu")).size == "1.50B"
    assert cost_twin.cost_spec("test", None, "float32", torch.device("cpu")).size.endswith("M")
    assert cost_twin.cost_spec("test", None, "float32", torch.device("cpu")).size != "0.00M"
