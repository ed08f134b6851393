"""`arith`: generated multi-step arithmetic word problems with GSM8K-style worked solutions.

Every problem has 2-4 steps, each written ``a op b = <<a op b=c>>c``, and ends with a
``#### N`` line. Numbers stay small so that a model of a few million parameters trained for
half an hour on a CPU can learn the arithmetic (the tiny models are trained on the train
split): products and quotients are times-table facts (factors 2-9) and every intermediate
result and the answer are whole numbers in [0, 100). Train and test are disjoint by construction: a problem belongs to
the test split iff a hash of its question text falls in bucket 0 of 10, so no seed or
size can make them overlap. ``generate(split, n, seed)`` is deterministic.
"""

from __future__ import annotations

import hashlib
import random
import re
from typing import Callable

SPLITS = ("train", "test")
NAMES = ["Tom", "Ann", "Sam", "Mia", "Ben", "Lily", "Max", "Eva", "Leo", "Zoe", "Jack", "Amy"]
ITEMS = ["apples", "pears", "eggs", "cards", "pens", "books", "stamps", "shells", "cookies", "marbles"]
CONTAINERS = ["boxes", "bags", "baskets", "packs", "jars"]
LIMIT = 100
RESULT = re.compile(r"=(-?\d+)>>")


def _step(a: int, op: str, b: int) -> tuple[int, str]:
    c = {"+": a + b, "-": a - b, "*": a * b, "/": a // b}[op]
    return c, f"{a} {op} {b} = <<{a}{op}{b}={c}>>{c}"


def _t_buy_give(r: random.Random):
    name, item, box = r.choice(NAMES), r.choice(ITEMS), r.choice(CONTAINERS)
    a, b, c = r.randint(2, 30), r.randint(2, 9), r.randint(2, 9)
    x, s1 = _step(b, "*", c)
    y, s2 = _step(a, "+", x)
    q = f"{name} has {a} {item}. {name} buys {b} {box} with {c} {item} in each."
    steps = [f"The {box} hold {s1} {item}.", f"{name} now has {s2} {item}."]
    if r.random() < 0.6:
        d = r.randint(1, y - 1)
        z, s3 = _step(y, "-", d)
        q += f" Then {name} gives away {d} {item}."
        steps.append(f"After giving some away, {name} has {s3} {item}.")
        y = z
    return q + f" How many {item} does {name} have now?", steps, y


def _t_price(r: random.Random):
    name, item = r.choice(NAMES), r.choice(ITEMS)
    p, n, extra = r.randint(2, 9), r.randint(2, 9), r.randint(1, 20)
    x, s1 = _step(n, "*", p)
    y, s2 = _step(x, "+", extra)
    q = f"One of the {item} costs {p} dollars. {name} buys {n} {item} and a bag for {extra} dollars."
    steps = [f"The {item} cost {s1} dollars.", f"In total {name} spends {s2} dollars."]
    if r.random() < 0.5:
        paid = (y // 10 + 1 + r.randint(0, 2)) * 10
        z, s3 = _step(paid, "-", y)
        q += f" {name} pays with {paid} dollars. How much change does {name} get?"
        steps.append(f"The change is {s3} dollars.")
        return q, steps, z
    return q + f" How much does {name} spend?", steps, y


def _t_share(r: random.Random):
    name, item = r.choice(NAMES), r.choice(ITEMS)
    k, each = r.randint(2, 9), r.randint(2, 9)
    total = k * each
    eat = r.randint(1, each - 1)
    x, s1 = _step(total, "/", k)
    y, s2 = _step(x, "-", eat)
    q = (
        f"{name} has {total} {item} and shares them equally among {k} friends. "
        f"Each friend uses {eat} {item}. How many {item} does each friend have left?"
    )
    return q, [f"Each friend gets {s1} {item}.", f"Each friend has {s2} {item} left."], y


def _t_rows(r: random.Random):
    item, box = r.choice(ITEMS), r.choice(CONTAINERS)
    b, c = r.randint(2, 9), r.randint(2, 9)
    x, s1 = _step(b, "*", c)
    red = r.randint(1, x - 1)
    y, s2 = _step(x, "-", red)
    q = f"There are {b} {box} with {c} {item} in each. {red} of the {item} are red."
    steps = [f"There are {s1} {item}.", f"The {item} that are not red are {s2}."]
    if r.random() < 0.5:
        more = r.randint(2, 20)
        z, s3 = _step(y, "+", more)
        q += f" Then {more} blue {item} are added. How many {item} are not red now?"
        steps.append(f"Now {s3} {item} are not red.")
        return q, steps, z
    return q + f" How many {item} are not red?", steps, y


def _t_save(r: random.Random):
    name = r.choice(NAMES)
    w, k = r.randint(2, 9), r.randint(2, 9)
    x, s1 = _step(w, "*", k)
    spend = r.randint(1, x - 1)
    y, s2 = _step(x, "-", spend)
    gift = r.randint(1, 20)
    z, s3 = _step(y, "+", gift)
    q = (
        f"{name} saves {w} dollars each week for {k} weeks. {name} spends {spend} dollars "
        f"on a game and then gets {gift} dollars as a gift. How many dollars does {name} have?"
    )
    steps = [f"{name} saves {s1} dollars.", f"After the game {name} has {s2} dollars.", f"With the gift {name} has {s3} dollars."]
    if r.random() < 0.4 and z % 2 == 0:
        h, s4 = _step(z, "/", 2)
        q = q[: -len(f"How many dollars does {name} have?")] + f"{name} gives half to a sister. How many dollars does {name} keep?"
        steps.append(f"{name} keeps {s4} dollars.")
        return q, steps, h
    return q, steps, z


def _t_trip(r: random.Random):
    name = r.choice(NAMES)
    s, h, extra = r.randint(2, 9), r.randint(2, 9), r.randint(1, 20)
    x, s1 = _step(s, "*", h)
    y, s2 = _step(x, "+", extra)
    q = f"{name} rides {s} miles each hour for {h} hours and then walks {extra} more miles. How many miles does {name} go in total?"
    return q, [f"Riding covers {s1} miles.", f"In total {name} goes {s2} miles."], y


TEMPLATES: list[Callable[[random.Random], tuple]] = [_t_buy_give, _t_price, _t_share, _t_rows, _t_save, _t_trip]


def split_of(question: str) -> str:
    """The split a question text belongs to (hash bucket 0 of 10 = test)."""
    bucket = int.from_bytes(hashlib.sha256(question.encode("utf-8")).digest()[:4], "big") % 10
    return "test" if bucket == 0 else "train"


def generate(split: str, n: int, seed: int = 0) -> list[dict]:
    """``n`` distinct problems of ``split`` as dicts with ``question`` and ``answer`` (the
    worked solution ending in ``#### N``). Deterministic in (split, n, seed); the first k of
    generate(split, n, seed) are generate(split, k, seed)."""
    if split not in SPLITS:
        raise ValueError(f"arith split must be one of {SPLITS}, got {split!r}")
    r = random.Random(f"packedss-arith-{seed}")
    out: list[dict] = []
    seen: set[str] = set()
    tries = 0
    while len(out) < n:
        tries += 1
        if tries > 200 * max(n, 100):
            raise RuntimeError(f"arith: cannot generate {n} distinct {split} problems")
        q, steps, ans = r.choice(TEMPLATES)(r)
        results = [int(v) for v in RESULT.findall("\n".join(steps))]
        if not all(0 <= v < LIMIT for v in results) or q in seen or split_of(q) != split:
            continue
        seen.add(q)
        out.append({"question": q, "answer": "\n".join(steps) + f"\n#### {ans}"})
    return out
