"""Five behaviours that users depend on, each held through the path a user takes:

1. SetDLM past its context at C > 1: a batched run.py job whose caches outgrow the model's context
   drops their oldest rows and writes the outputs of the same job at C = 1;
2. the batched cost twin: when a slot takes a new request, the cost model's cache of that slot
   starts empty, as the deciding model's does, so the timed calls are the decoded ones;
3. S2D2's accepted drafts: per verify call, the drafts accepted, not the tokens it resolved (which
   include the resampled one);
4. a SLURM controller that does not answer a poll: the sweep keeps waiting on its jobs;
5. the upload of host integers on CUDA: from pinned memory, without blocking.
"""

from __future__ import annotations

import json
import os
import time
from pathlib import Path

import pytest
import torch

from packedss.decoding import LTRSettings, Sampling
from packedss.decoding.driver import Response, schedule_named
from packedss.decoding.engine import Request, decode_batched
from packedss.decoding.rows import uploaded
from packedss.decoding.schedules import LTR_DECODERS
from packedss.families import FAMILIES
from packedss.models.cost_twin import CostTwin
from packedss.models.executors import batched_executor
from packedss.models.nemotron import load_nemotron
from packedss.models.sdar import load_sdar
from packedss.paths import PROJECT_ROOT
from packedss.runner import run_job
from tests.sdar_fixtures import SDAR_EOS, write_random_sdar
from tests.test_runner import all_records, composed  # noqa: F401 (a fixture)

TINY = PROJECT_ROOT / "assets" / "models" / "tiny"
TINY_SET = PROJECT_ROOT / "assets" / "models" / "tiny-set"
GREEDY = Sampling(0.0, "rejection", None)


# ---- 1. SetDLM past its context at C > 1 ----


def _setdlm_with_context(directory: Path, context: int, smax: int) -> Path:
    """The shipped tiny set model with config.json `length` (its context) cut to `context` and its
    largest window to `smax` (the model's prompts then leave 1 + 2 smax + smax^2 rows for a call)."""
    directory.mkdir()
    for item in TINY_SET.iterdir():
        if item.name != "config.json":
            (directory / item.name).symlink_to(item)
    config = json.loads((TINY_SET / "config.json").read_text())
    noise = config["noise_config"] | {"max_block_size": smax}
    (directory / "config.json").write_text(json.dumps(config | {"length": context, "noise_config": noise}))
    return directory


@pytest.mark.skipif(not (TINY_SET / "config.json").is_file(), reason="the shipped tiny set model is absent")
def test_a_batched_setdlm_job_past_its_context_writes_the_outputs_of_one_at_a_time(composed, tmp_path):  # noqa: F811
    checkpoint = _setdlm_with_context(tmp_path / "tiny-set-32", 32, 4)  # prompts cut to 7 tokens, outputs of up to 40

    def records(concurrency: int) -> dict[str, dict]:
        out = tmp_path / f"c{concurrency}"
        run_job(composed(["model=tiny-set", f"model.path={checkpoint}", "schedule=packed", "width=4", "limit=4",
                          "max_new_tokens=40", "progress=false", f"out_dir={out}", f"concurrency={concurrency}"]))  # fmt: skip
        return {r["question_id"]: r for r in all_records(out)}

    alone, together = records(1), records(2)
    assert sorted(together) == sorted(alone)
    assert sum(sum(r["cache_rows_dropped"]) for r in together.values()) > 0  # the caches did outgrow the context
    for question, record in together.items():
        assert record["output_ids"] == alone[question]["output_ids"]
        assert record["cache_rows_dropped"] == alone[question]["cache_rows_dropped"]


# ---- 2. the batched cost twin's reset ----


@pytest.mark.skipif(not (TINY / "config.json").is_file(), reason="the shipped tiny model is absent")
def test_a_batched_cost_twins_cost_model_starts_each_request_on_an_empty_cache():
    """The cost model is the deciding model's own weights, so each of its calls must give the
    deciding model's logits; a cache kept from a slot's earlier request would change them."""
    deciding, cost = (load_nemotron(TINY, dtype="float32") for _ in range(2))
    logits: dict[str, list[torch.Tensor]] = {"deciding": [], "cost": []}
    for name, model in (("deciding", deciding), ("cost", cost)):
        model.head.register_forward_hook(lambda module, args, out, name=name: logits[name].append(out.detach().clone()))
    prompts = [[5, 17, 33, 8, 91, 12, 7], [9, 4], [40, 41, 42, 43, 44, 45], [61, 62, 63], [7, 7, 7, 7, 7]]
    caps = [14, 6, 10, 5, 8]  # requests end at different times, and later ones take their slots

    def request(key: int) -> Request:
        settings = LTRSettings("linear", 4, caps[key], (2,), GREEDY)
        return Request(key, lambda model: Response(model, prompts[key], settings, None,
                                                   schedule_named(LTR_DECODERS, settings.schedule)))  # fmt: skip

    executor = batched_executor(CostTwin(deciding, cost, "same-weights"), slots=2)
    decoded = list(decode_batched(executor, [request(k) for k in range(len(prompts))], 2))
    assert len(decoded) == len(prompts)
    assert len(logits["cost"]) == len(logits["deciding"]) > len(prompts)
    for deciding_logits, cost_logits in zip(logits["deciding"], logits["cost"]):
        torch.testing.assert_close(cost_logits, deciding_logits, rtol=0, atol=1e-5)


# ---- 3. S2D2's accepted drafts ----


def test_s2d2_counts_the_drafts_it_accepts_not_the_tokens_its_verify_call_resolves(tmp_path):
    model = load_sdar(write_random_sdar(tmp_path / "sdar"), dtype="float64")
    prompts = [list(range(5, 19)), [20, 22, 24, 26, 28, 3, 5, 8, 13], list(range(30, 46))]
    rejected_early = 0
    for seed, prompt in enumerate(prompts):
        settings = LTRSettings("s2d2", 3, 24, (SDAR_EOS,), Sampling(0.0, "rejection", torch.Generator().manual_seed(seed)))
        out = FAMILIES["sdar"].decode(model, prompt, settings)
        kinds, resolved = out.extra["call_kinds"][1:], out.extra["resolved"][1:]  # the calls after the prefill
        assert len(kinds) == len(out.drafted) == len(out.accepted_drafts) == out.iterations
        for kind, tokens, drafted, accepted in zip(kinds, resolved, out.drafted, out.accepted_drafts):
            if kind != "verify":
                assert (drafted, accepted) == (0, 0)
                continue
            # every draft accepted resolves the span; else the first rejected one is resampled
            assert tokens == accepted + (1 if accepted < drafted else 0), (tokens, drafted, accepted)
            rejected_early += tokens < drafted
        assert (out.draft_proposed, out.draft_accepted) == (sum(out.drafted), sum(out.accepted_drafts))
    assert rejected_early > 0  # a rejection before a span's last draft: resolved and accepted differ by one


# ---- 4. a controller that does not answer ----

NO_ACCOUNTING = "#!/bin/sh\necho 'Slurm accounting storage is disabled' >&2\nexit 1\n"
# squeue answers from the file ANSWER names: a state, `fail` (the controller is down) or `hang`.
SQUEUE = """#!/bin/sh
case "$(cat "$ANSWER")" in
  fail) echo 'slurm_load_jobs error: Unable to contact slurm controller (connect failure)' >&2; exit 1 ;;
  hang) exec sleep 30 ;;
  *) echo "5|$(cat "$ANSWER")" ;;
esac
"""


def test_a_sweep_keeps_waiting_while_the_slurm_controller_does_not_answer(tmp_path, monkeypatch, capsys):
    from submitit.slurm.slurm import SlurmJob

    from hydra_plugins.packedss_sweeper import launchers

    tools, answer = tmp_path / "bin", tmp_path / "answer"
    tools.mkdir()
    for name, script in (("sacct", NO_ACCOUNTING), ("squeue", SQUEUE)):
        (tools / name).write_text(script)
        (tools / name).chmod(0o755)
    monkeypatch.setenv("PATH", f"{tools}{os.pathsep}{os.environ['PATH']}")
    monkeypatch.setenv("ANSWER", str(answer))
    monkeypatch.setattr(launchers, "POLL_TIMEOUT_S", 0.5)
    watcher = launchers._watcher_class()(delay_s=600)
    with launchers._watched_by(watcher):
        job = SlurmJob(tmp_path / "logs", "5")
        seen = []
        for reply in ("RUNNING", "fail", "hang", "fail", "COMPLETED"):
            answer.write_text(reply)
            time.sleep(0.01)  # submitit ignores a forced poll within 1 ms of the last one
            seen.append((job.done(force_check=True), job.state))
    assert seen == [(False, "RUNNING")] * 4 + [(True, "COMPLETED")]
    assert "polling them with squeue instead" in capsys.readouterr().err


# ---- 5. the pinned, non-blocking upload ----


def test_an_upload_to_cuda_copies_from_pinned_memory_without_blocking(monkeypatch):
    """Host side, without a GPU: the copy `uploaded` makes for a CUDA device is from a pinned
    tensor with non_blocking=True (a pageable or blocking copy waits for the device)."""
    pinned, copies = [], []

    def pin_memory(tensor):
        out = tensor.clone()
        pinned.append(out)
        return out

    def to(tensor, *args, **kwargs):
        copies.append((tensor, args, kwargs))
        return tensor

    monkeypatch.setattr(torch.Tensor, "pin_memory", pin_memory)
    monkeypatch.setattr(torch.Tensor, "to", to)
    out = uploaded([3, 1, 4, 1, 5], torch.device("cuda"))
    assert out.tolist() == [3, 1, 4, 1, 5] and out.dtype == torch.long
    assert len(copies) == 1 and len(pinned) == 1
    source, args, kwargs = copies[0]
    assert source is pinned[0]  # the tensor handed over is the pinned one
    assert torch.device(kwargs.get("device", args[0] if args else None)).type == "cuda"
    assert kwargs.get("non_blocking") is True
    copies.clear()
    assert uploaded([2, 7], torch.device("cpu")).tolist() == [2, 7]
    assert len(pinned) == 1 and all(not kwargs.get("non_blocking") for _, _, kwargs in copies)  # nothing pinned for the CPU
