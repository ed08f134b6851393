#!/usr/bin/env python
"""Host time per round at concurrency C: how much of a batched round is not the model call.

For each schedule and each C, the same questions decode C at a time (packedss.decoding.engine on
the eager batch executor; C = 1 is the runner's own one-at-a-time path), after an untimed warm-up
at that C; the levels take turns `--repeats` times and each keeps its least host time. Host ms per round = (the decode's elapsed time - the model time of its calls) / its
batched calls (at C = 1, its calls). A line per schedule ends `host ms per round C=<largest>/C=1:
X`: the host work of a round at the largest C against C = 1 (1 would be host work that does not
grow with C at all; C would be host work that grows as C).

    python scripts/bench_concurrency.py --model tiny --task arith --limit 64 --width 8 --concurrency 1,16,64
    python scripts/bench_concurrency.py --model tiny-set --schedules linear,packed --order ltr --width 4
"""

from __future__ import annotations

import argparse
import os
import time

os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")

import torch  # noqa: E402

from packedss.benchmark.schedules import BenchSettings, load  # noqa: E402
from packedss.decoding import Sampling  # noqa: E402
from packedss.decoding.engine import Request, decode_batched  # noqa: E402
from packedss.families import family_named  # noqa: E402
from packedss.models.batched import BatchedCalls  # noqa: E402
from packedss.runner import end_of_turn_ids, question_prompt_ids, task_config_for  # noqa: E402
from packedss.tasks import load_task  # noqa: E402
from packedss.tasks.stops import make_stop_check  # noqa: E402

GREEDY = Sampling(0.0, "rejection", None)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--model", default="tiny")
    parser.add_argument("--task", default="arith")
    parser.add_argument("--data-dir", default=None)
    parser.add_argument("--limit", type=int, default=64)
    parser.add_argument("--width", type=int, default=8)
    parser.add_argument("--schedules", default="ar,linear,quadratic,packed")
    parser.add_argument("--concurrency", default="1,16,64")
    parser.add_argument("--order", default=None, help="any-order models: the verification order")
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--repeats", type=int, default=3)
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    levels = sorted(int(c) for c in args.concurrency.split(","))
    if levels[0] != 1:
        parser.error("--concurrency must include 1 (the reference of the ratio)")

    cfg, adapter, tokenizer, label = load(BenchSettings(model=args.model, task=args.task), torch.device("cpu"), "float32")
    family = family_named(cfg.model.family)
    task = load_task(task_config_for(cfg), data_dir=args.data_dir)
    questions = task.questions(args.limit)
    chat = bool(cfg.model.chat)
    prompts = [question_prompt_ids(task, tokenizer, q, chat) for q in questions]
    stop_check = make_stop_check(tokenizer, task.stop_for(chat))
    eos = adapter.eos_token_ids + end_of_turn_ids(cfg.model, tokenizer)
    options = {"pad_verify": True, "order": args.order}
    print(f"{label}, {args.task}, {len(prompts)} questions, W={args.width}, eager, float32, "
          f"{torch.get_num_threads()} thread(s), cpu, greedy")  # fmt: skip

    for schedule in args.schedules.split(","):
        fields = {"schedule": schedule, "width": args.width, "max_new_tokens": task.max_new_tokens,
                  "eos_token_ids": eos, "sampling": GREEDY}  # fmt: skip
        settings = family.settings_type(**(fields | family.settings_fields(schedule, options, adapter.block_size)))
        host, decoders = {}, {}
        for concurrency in levels:
            executor = BatchedCalls(adapter, concurrency) if concurrency > 1 else None

            def decode(ids_list, executor=executor, concurrency=concurrency):
                if executor is None:
                    return [family.decode(adapter, ids, settings, stop_check) for ids in ids_list]
                requests = [Request(k, lambda model, ids=ids: family.response(model, ids, settings, stop_check))
                            for k, ids in enumerate(ids_list)]  # fmt: skip
                return [out for _, out in decode_batched(executor, requests, concurrency)]

            decoders[concurrency] = decode
            decode(prompts[:concurrency])  # warm-up: layouts, biases and the allocator
        # The levels take turns, `repeats` times; each keeps its least host time per round (the
        # machine's other load only ever adds to it).
        for _ in range(args.repeats):
            for concurrency in levels:
                started = time.perf_counter()
                outs = decoders[concurrency](prompts)
                elapsed = time.perf_counter() - started
                model_s = sum(out.model_s for out in outs)
                rounds = sum(1 / requests for out in outs for requests in out.call_requests)
                ms = (elapsed - model_s) / rounds * 1000
                host[concurrency] = min(ms, host.get(concurrency, ms))
                print(f"  {schedule:9s} C={concurrency:<3d} rounds {rounds:7.0f}  elapsed {elapsed:7.2f} s  "
                      f"model {model_s:7.2f} s  host ms per round {ms:.3f}")  # fmt: skip
        top = levels[-1]
        cells = ", ".join(f"C={c} {host[c]:.3f}" for c in levels)
        print(f"{schedule}: host ms per round {cells}; host ms per round C={top}/C=1: {host[top] / host[1]:.1f}")


if __name__ == "__main__":
    main()
