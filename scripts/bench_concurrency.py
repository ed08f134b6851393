#!/usr/bin/env python
"""Host time per round at concurrency C: how much of a batched round is not the model call.

For each schedule and each C, the same questions decode C at a time (packedss.decoding.engine on
the eager batch executor; C = 1 is the runner's own one-at-a-time path, packedss.decoding.driver),
after an untimed warm-up at that C. The levels then take turns, `--repeats` times, and each keeps
its least host time (the machine's other load only ever adds to it).

Host ms per round = (the decode's elapsed time - the model time of its calls) / its batched calls
(at C = 1, its calls), as docs/concurrency.md §2 defines it: elapsed is the wall time of decoding
all the questions, from the first response's start to the last one's end, everything on the host
included (building calls, the host steps, emitters, stop checks, meters, records of the times).
Host CPU ms per round is the same on the main thread's CPU clock (time.thread_time: the CPU time
inside the model calls subtracted), which other processes on a shared machine disturb far less.
Model us per evaluated row is the model time of the calls over the rows the responses evaluated
(each level's least turn): flat or falling with C where the model's work grows linearly in the rows
a batched call carries, rising where it grows faster (a cross-request attention would, as C^2).

A line per schedule gives the model us per evaluated row at each C (and the largest C's over the
next largest), and ends `host ms per round C=<largest>/C=1: X`: the host work of a round at the
largest C against C = 1 (1 would be host work that does not grow with C at all; C would be host
work that grows as C), from each level's least turn; then the same ratio of each rotation's two
turns, least to largest and median (`rotations 4.6-5.6, median 5.0`): how far the machine's state
moved it within the run.

`--replay` adds a line per schedule: the same decodes replayed on the logits each level's decode
recorded, against a model that returns them at no cost (packedss.benchmark.replay: `Replay` at
C = 1, `BatchReplay` above), so no forward pass runs between the host steps; each level's least
turn of wall time over its rounds. That is the host work alone, on caches no forward pass evicted
(on a CPU the forward pass shares the caches with the host; on a GPU it does not), and it moves
far less with the machine's load than the figures above. A replayed decode that does not make the
recorded decode's calls, or emits other tokens, is an error.

`--phases` adds a line per schedule and C > 1: that level's host CPU ms per round split by the
batch engine's phases (packedss.benchmark.phases: the call's assembly, the batched steps' launch
and finish, the decoders' own Python, the meters' shares, the rest), from `--repeats` more
decodes with the phases timed, the one of least host CPU time per round.

    python scripts/bench_concurrency.py --schedules linear,packed --concurrency 1,16,64
    python scripts/bench_concurrency.py --schedules linear,packed --concurrency 1,16,64 --temperature 1
    python scripts/bench_concurrency.py --model tiny-set --schedules linear,packed --order ltr
    python scripts/bench_concurrency.py --schedules linear,packed --concurrency 1,16,64 --replay
`--coroutines` adds, for each C > 1, a turn of the same decodes with every request run as its
coroutine (`decode_batched(..., lockstep=False)`; without it greedy AR, Linear-SS and Packed-SS
requests of the Nemotron and SDAR families are lanes, packedss.decoding.lockstep), in the same
rotation as the levels, and a line per schedule of its host ms per round beside the lanes' (the
same for schedules that have no lanes).

    python scripts/bench_concurrency.py --schedules linear,packed --concurrency 1,64 --phases
    python scripts/bench_concurrency.py --schedules linear,packed --concurrency 1,64 --coroutines
"""

from __future__ import annotations

import os
import statistics
import time

os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")

import torch  # noqa: E402

from packedss.benchmark import cpu_name  # noqa: E402
from packedss.benchmark.phases import PHASES, engine_phases  # noqa: E402
from packedss.benchmark.replay import BatchReplay, Replay, recording  # noqa: E402
from packedss.benchmark.schedules import BenchSettings, load  # noqa: E402
from packedss.decoding.trace import RecordingModel  # noqa: E402
from packedss.decoding import VERIFY_RULES, Sampling, question_seed  # noqa: E402
from packedss.decoding.engine import Request, decode_batched  # noqa: E402
from packedss.errors import ArgumentParser, closest, number, numbers, run_cli  # noqa: E402
from packedss.families import FAMILIES, family_named  # noqa: E402
from packedss.models.batched import BatchedCalls  # noqa: E402
from packedss.paths import CONF_DIR  # noqa: E402
from packedss.runner import end_of_turn_ids, question_prompt_ids, task_config_for  # noqa: E402
from packedss.tasks import TASK_NAMES, DataUnavailable, load_task  # noqa: E402
from packedss.tasks.stops import make_stop_check  # noqa: E402

GREEDY = Sampling(0.0, "rejection", None)
MODELS = sorted(path.stem for path in (CONF_DIR / "model").glob("*.yaml"))
ORDERS = sorted({order for family in FAMILIES.values() for order in family.orders})


class ModelCPU:
    """The main thread's CPU time inside a model's calls: `run` of an adapter or a batch executor
    is wrapped (on the instance) to add it up."""

    def __init__(self):
        self.ns = 0

    def wrap(self, model) -> None:
        run = model.run

        def timed(*args):
            started = time.thread_time_ns()
            try:
                return run(*args)
            finally:
                self.ns += time.thread_time_ns() - started

        model.run = timed


def main(argv=None) -> int:
    ap = ArgumentParser(prog="scripts/bench_concurrency.py", description=__doc__.split("\n\n")[0])
    ap.add_argument("--model", default="tiny", help="a conf/model name (tiny, tiny-set, ...)")
    ap.add_argument("--task", default="arith", choices=TASK_NAMES)
    ap.add_argument("--data-dir", default=None)
    ap.add_argument("--limit", type=number(int, 1), default=64, help="first N questions")
    ap.add_argument("--width", type=number(int, 1), default=8, help="W")
    ap.add_argument("--schedules", default="ar,linear,quadratic,packed", help="comma separated, of the model family's")
    ap.add_argument("--concurrency", type=numbers(1), default=[1, 16, 64], help="comma separated C, 1 among them")
    ap.add_argument("--order", default=None, choices=ORDERS, help="any-order models: the verification order (default ltr)")
    ap.add_argument("--temperature", type=number(float, 0.0), default=0.0, help="T (0: greedy)")
    ap.add_argument("--rule", default="rejection", choices=VERIFY_RULES, help="the verification rule at T > 0")
    ap.add_argument("--threads", type=number(int, 1), default=1, help="CPU intra-op threads")
    ap.add_argument("--repeats", type=number(int, 1), default=5, help="turns of every level; each keeps its least")
    ap.add_argument("--replay", action="store_true",
                    help="also time the host work alone: the decodes replayed on recorded logits, no forward pass")  # fmt: skip
    ap.add_argument("--phases", action="store_true", help="also split each C > 1's host CPU time per round by the engine's phases")
    ap.add_argument("--coroutines", action="store_true",
                    help="also time each C > 1 with every request as its coroutine (no lanes), in the same turns")  # fmt: skip
    args = ap.parse_args(argv)
    if args.model not in MODELS:
        ap.error(f"unknown --model {args.model}{closest(args.model, MODELS)}; valid: {', '.join(MODELS)}")
    levels = sorted(set(args.concurrency))
    if levels[0] != 1:
        ap.error(f"--concurrency {','.join(map(str, levels))} lacks 1, the reference of the ratio; add it")
    for flag in ("phases", "coroutines"):
        if getattr(args, flag) and len(levels) == 1:
            ap.error(f"--{flag} times the rounds of a C > 1, but --concurrency holds only 1; add a C > 1 (e.g. 1,64)")
    torch.set_num_threads(args.threads)

    cfg, adapter, tokenizer, label = load(BenchSettings(model=args.model, task=args.task), torch.device("cpu"), "float32")
    family = family_named(cfg.model.family)
    valid = [decoder.name for decoder in family.decoders]
    schedules = [name.strip() for name in args.schedules.split(",") if name.strip()]
    unknown = [name for name in schedules if name not in valid]
    if unknown or not schedules:
        ap.error(f"--schedules: unknown {','.join(unknown) or 'none given'} for the {family.name} family; "
                 f"valid: {', '.join(valid)}")  # fmt: skip
    try:
        task = load_task(task_config_for(cfg), data_dir=args.data_dir)
        questions = task.questions(args.limit)
    except DataUnavailable as err:
        raise DataUnavailable(err.message("--data-dir DIR")) from None
    chat = bool(cfg.model.chat)
    prompts = [question_prompt_ids(task, tokenizer, q, chat) for q in questions]
    stop_check = make_stop_check(tokenizer, task.stop_for(chat))
    eos = adapter.eos_token_ids + end_of_turn_ids(cfg.model, tokenizer)
    options = {"pad_verify": True, "order": args.order}
    executors = {c: BatchedCalls(adapter, c) for c in levels if c > 1}  # before the adapter's run is wrapped
    model_cpu = ModelCPU()
    for model in (adapter, *executors.values()):
        model_cpu.wrap(model)
    sampled = "greedy" if args.temperature == 0 else f"T={args.temperature:g} ({args.rule})"
    print(f"regime: {label}, {args.task}, {len(prompts)} questions, W={args.width}, {sampled}, eager calls, float32, "
          f"{torch.get_num_threads()} intra-op thread(s), cpu ({cpu_name()}, {os.cpu_count()} cores), "
          f"torch {torch.__version__}, {args.repeats} turns per level, load average {os.getloadavg()[0]:.1f} at the "
          "start")  # fmt: skip

    for schedule in schedules:
        fields = {"schedule": schedule, "width": args.width, "max_new_tokens": task.max_new_tokens, "eos_token_ids": eos}
        fields |= family.settings_fields(schedule, options, adapter.block_size)

        def settings(k):
            """Question k's settings: at T > 0 its own generator, seeded as the runner seeds it."""
            if args.temperature == 0:
                return family.settings_type(**fields, sampling=GREEDY)
            generator = torch.Generator().manual_seed(question_seed(0, str(k)))
            return family.settings_type(**fields, sampling=Sampling(args.temperature, args.rule, generator))

        def decode(ids_list, concurrency, models=None, executor=None, lockstep=True):
            """Each question's response, at C = 1 on adapter (or on models[k]), else C at a time on
            the level's executor (or on `executor`), as lanes where they can be (else every request as
            its coroutine); in the order of ids_list."""
            if concurrency == 1:
                return [family.decode(adapter if models is None else models[k], ids, settings(k), stop_check)
                        for k, ids in enumerate(ids_list)]  # fmt: skip
            requests = [Request(k, lambda model, k=k, ids=ids: family.response(model, ids, settings(k), stop_check))
                        for k, ids in enumerate(ids_list)]  # fmt: skip
            executor = executors[concurrency] if executor is None else executor
            done = dict(decode_batched(executor, requests, concurrency, lockstep))
            return [done[request] for request in requests]

        # Each turn: (C, lanes where they can be); with --coroutines each C > 1 once more as coroutines.
        turns = [(c, lockstep) for c in levels for lockstep in (True, False) if lockstep or (c > 1 and args.coroutines)]
        for concurrency, lockstep in turns:
            decode(prompts[:concurrency], concurrency, lockstep=lockstep)  # warm-up: layouts, biases and the allocator
        host: dict[tuple, list[float]] = {turn: [] for turn in turns}
        host_cpu: dict[tuple, list[float]] = {turn: [] for turn in turns}
        model_row: dict[tuple, list[float]] = {turn: [] for turn in turns}
        for _ in range(args.repeats):
            for turn in turns:
                concurrency, lockstep = turn
                before_model, started, started_cpu = model_cpu.ns, time.perf_counter(), time.thread_time_ns()
                outs = decode(prompts, concurrency, lockstep=lockstep)
                elapsed, cpu_ns = time.perf_counter() - started, time.thread_time_ns() - started_cpu
                model_s = sum(out.model_s for out in outs)
                rounds = batched_calls(outs)
                ms = (elapsed - model_s) / rounds * 1000
                cpu_ms = (cpu_ns - (model_cpu.ns - before_model)) / rounds / 1e6
                row_us = model_s / sum(sum(out.rows_evaluated) for out in outs) * 1e6
                host[turn].append(ms)
                host_cpu[turn].append(cpu_ms)
                model_row[turn].append(row_us)
                label = f"C={concurrency:<3d}" + ("" if lockstep else " coroutines")
                print(f"  {schedule:9s} {label} rounds {rounds:6.0f}  elapsed {elapsed:6.2f} s  model "
                      f"{model_s:6.2f} s  model us per row {row_us:7.2f}  host ms per round {ms:7.3f}  "
                      f"host CPU ms per round {cpu_ms:7.3f}")  # fmt: skip
        top = levels[-1]
        least = {c: min(host[c, True]) for c in levels}
        least_cpu = {c: min(host_cpu[c, True]) for c in levels}
        cells = ", ".join(f"C={c} {least[c]:.3f}" for c in levels)
        cpu_cells = ", ".join(f"C={c} {least_cpu[c]:.3f}" for c in levels)
        rows = {c: min(model_row[c, True]) for c in levels}
        row_cells = ", ".join(f"C={c} {rows[c]:.2f}" for c in levels)
        below = levels[-2] if len(levels) > 1 else top
        # Each rotation's own ratio: how far the machine's state moved the figure within this run.
        rotations = sorted(one_top / one for one, one_top in zip(host[1, True], host[top, True]))
        spread = (f" (rotations {rotations[0]:.1f}-{rotations[-1]:.1f}, median {statistics.median(rotations):.1f})"
                  if top > 1 else "")  # fmt: skip
        print(f"{schedule}: model us per evaluated row {row_cells} (C={top}/C={below}: {rows[top] / rows[below]:.2f}); "
              f"host CPU ms per round {cpu_cells} (C={top}/C=1: {least_cpu[top] / least_cpu[1]:.1f}); "
              f"host ms per round {cells}; host ms per round C={top}/C=1: {least[top] / least[1]:.1f}{spread}")  # fmt: skip
        if args.coroutines:
            cells = ", ".join(f"C={c} {min(host[c, False]):.3f} (CPU {min(host_cpu[c, False]):.3f}; lanes / coroutines "
                              f"{least[c] / min(host[c, False]):.2f})" for c in levels[1:])  # fmt: skip
            top_coroutines = min(host[top, False])
            print(f"{schedule}: as coroutines, host ms per round {cells}; host ms per round C={top}/C=1: "
                  f"{top_coroutines / least[1]:.1f}")  # fmt: skip
        if args.phases:
            for concurrency in levels[1:]:
                round_ms, phase_ms = phases_ms(lambda: decode(prompts, concurrency), model_cpu, args.repeats)
                cells = ", ".join(f"{phase} {phase_ms[phase]:.3f}" for phase in PHASES)
                print(f"{schedule}: C={concurrency} host CPU ms per round by phase: {cells}, the rest "
                      f"{round_ms - sum(phase_ms.values()):.3f} (round {round_ms:.3f})")  # fmt: skip
        if args.replay:
            replayed = replayed_host_ms(decode, prompts, levels, args.repeats, adapter, executors)
            cells = ", ".join(f"C={c} {replayed[c]:.3f}" for c in levels)
            print(f"{schedule}: replayed host ms per round (no forward pass) {cells}; "
                  f"C={top}/C=1: {replayed[top] / replayed[1]:.1f}")  # fmt: skip
    print(f"load average {os.getloadavg()[0]:.1f} at the end")
    return 0


def batched_calls(outs) -> float:
    """The batched calls (rounds) the responses `outs` made: each call is shared by the requests
    it carried (at C = 1, every call is one)."""
    return sum(1 / requests for out in outs for requests in out.call_requests)


def phases_ms(decode, model_cpu: ModelCPU, repeats: int) -> tuple[float, dict[str, float]]:
    """Of `repeats` decodes (`decode()`) with the engine's phases timed, the one of least host CPU
    time per round: that time and each phase's, in ms per round on the main thread's CPU clock."""
    least = (float("inf"), {})
    for _ in range(repeats):
        with engine_phases() as ns:
            before_model, started = model_cpu.ns, time.thread_time_ns()
            outs = decode()
            cpu_ns = time.thread_time_ns() - started - (model_cpu.ns - before_model)
        rounds = batched_calls(outs)
        if cpu_ns / rounds / 1e6 < least[0]:
            least = (cpu_ns / rounds / 1e6, {phase: ns[phase] / rounds / 1e6 for phase in PHASES})
    return least


def replayed_host_ms(decode, prompts, levels, repeats, adapter, executors) -> dict[int, float]:
    """Each level's host ms per round with no forward pass: one decode of `prompts` at that level
    records its calls' logits, then the levels take turns replaying them `repeats` times (Replay
    per question at C = 1, BatchReplay above), each keeping its least wall time over its rounds."""
    logs, expected = {}, {}
    for concurrency in levels:
        if concurrency == 1:
            recorders = [RecordingModel(adapter) for _ in prompts]
            outs = decode(prompts, 1, models=recorders)
            logs[1] = [[logits for _, logits in recorder.calls] for recorder in recorders]
        else:
            with recording(executors[concurrency]) as log:
                outs = decode(prompts, concurrency)
            logs[concurrency] = log
        expected[concurrency] = [out.tokens for out in outs]
    least = {c: float("inf") for c in levels}
    for _ in range(repeats):
        for concurrency in levels:
            if concurrency == 1:
                models = [Replay(log, adapter.device, adapter.mask_token_id) for log in logs[1]]
                started = time.perf_counter()
                outs = decode(prompts, 1, models=models)
                replayed_calls = sum(model.index for model in models)
            else:
                executor = BatchReplay(logs[concurrency], adapter.device, adapter.mask_token_id)
                started = time.perf_counter()
                outs = decode(prompts, concurrency, executor=executor)
                replayed_calls = executor.index
            elapsed = time.perf_counter() - started
            recorded_calls = sum(map(len, logs[1])) if concurrency == 1 else len(logs[concurrency])
            if [out.tokens for out in outs] != expected[concurrency] or replayed_calls != recorded_calls:
                raise RuntimeError(f"the replay at C={concurrency} did not make the recorded decode's calls and tokens")
            rounds = batched_calls(outs)
            least[concurrency] = min(least[concurrency], elapsed / rounds * 1000)
    return least


if __name__ == "__main__":
    run_cli(main)
