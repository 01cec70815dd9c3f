"""Arithmetic word problems: procedural GSM8K-like problems with step-by-step solutions, in difficulty levels.

Why procedural: ``trims demo`` must run offline and in minutes, yet show where TRIMS can matter, so the data
mixes tokens that are genuinely uncertain for a small model (computed results, written digit by digit; the
wording chosen for each step; the answer-line format; operand order) with many predictable ones (template
words, operands copied from the question). Problems have 2 or 3 arithmetic steps on small numbers (products of
factors 2-5, sums and differences below 40), so a model of about a million parameters trained for
a few minutes on a CPU can learn a share of them; each further level draws larger numbers (:func:`level_scale`),
which is how ``recipes/smollm2`` makes the task hard enough for a pretrained model.

Rows are GSM8K's (``question``, ``answer`` ending in ``#### N`` or "The answer is N."), so :class:`ArithTask` also
wraps real GSM8K rows: grading is GSM8K's (``#### N``, else the last number).
"""

from __future__ import annotations

import random
from collections.abc import Callable, Mapping, Sequence
from typing import Any

from ..evaluation.tasks.base import Example, Messages, TaskDataError, require
from ..evaluation.tasks.gsm8k import GSM8KTask, parse_number

NAMES = ("Mia", "Leo", "Ava", "Sam", "Zoe", "Max", "Ivy", "Ben", "Eva", "Tom", "Lily", "Noah")
ITEMS = ("apples", "pens", "books", "stamps", "cards", "shells", "coins", "stickers", "eggs", "marbles")
GROUPS = ("boxes", "bags", "packs", "jars", "baskets")
ANSWER_LINES = ("#### {n}", "The answer is {n}.")

Problem = tuple[str, list[str], int]  # question, solution lines (without the answer line), answer


def _product(rng: random.Random, groups: int, each: int) -> str:
    """Operand order of a product is a free choice of the writer: a genuinely uncertain token."""
    return f"{groups} * {each}" if rng.random() < 0.5 else f"{each} * {groups}"


def _buy_give(rng: random.Random, name: str, item: str, scale: int = 1) -> Problem:
    """3 steps: start + groups * each - given."""
    start, groups, each = rng.randint(2, 12 * scale), rng.randint(2, 5), rng.randint(2, 5 * scale)
    bought = groups * each
    given = rng.randint(1, start + bought - 1)
    group = rng.choice(GROUPS)
    question = (f"{name} has {start} {item}. {name} buys {groups} {group} with {each} {item} each. "
                f"Then {name} gives {given} {item} to a friend. How many {item} does {name} have now?")
    step1 = rng.choice((f"{name} buys {_product(rng, groups, each)} = {bought} {item}.",
                        f"The {group} hold {_product(rng, groups, each)} = {bought} {item}."))
    step2 = rng.choice((f"Now {name} has {start} + {bought} = {start + bought} {item}.",
                        f"Together that is {start} + {bought} = {start + bought} {item}."))
    step3 = rng.choice((f"After giving {given} away, {start + bought} - {given} = {start + bought - given} {item}.",
                        f"{name} keeps {start + bought} - {given} = {start + bought - given} {item}."))
    return question, [step1, step2, step3], start + bought - given


def _gain_lose(rng: random.Random, name: str, item: str, scale: int = 1) -> Problem:
    """2 steps: start + found - lost."""
    start, found = rng.randint(5, 20 * scale), rng.randint(2, 9 * scale)
    lost = rng.randint(1, start + found - 1)
    question = (f"{name} has {start} {item}. {name} finds {found} more {item} and then loses {lost}. "
                f"How many {item} are left?")
    step1 = rng.choice((f"After finding, {name} has {start} + {found} = {start + found} {item}.",
                        f"First {start} + {found} = {start + found} {item}."))
    step2 = rng.choice((f"After losing {lost}, {start + found} - {lost} = {start + found - lost} {item} are left.",
                        f"Then {start + found} - {lost} = {start + found - lost} {item}."))
    return question, [step1, step2], start + found - lost


def _share(rng: random.Random, name: str, item: str, scale: int = 1) -> Problem:
    """2 steps: groups * each - used."""
    groups, each = rng.randint(2, 5), rng.randint(2, 5 * scale)
    total = groups * each
    used = rng.randint(1, total - 1)
    group = rng.choice(GROUPS)
    question = (f"{name} has {groups} {group} of {item} with {each} {item} in each. "
                f"{name} uses {used} {item}. How many {item} remain?")
    step1 = rng.choice((f"{name} has {_product(rng, groups, each)} = {total} {item}.",
                        f"In all there are {_product(rng, groups, each)} = {total} {item}."))
    step2 = rng.choice((f"So {total} - {used} = {total - used} {item} remain.",
                        f"Using {used} leaves {total} - {used} = {total - used} {item}."))
    return question, [step1, step2], total - used


def _two_days(rng: random.Random, name: str, item: str, scale: int = 1) -> Problem:
    """3 steps: first day, more on the second day, total."""
    first, more = rng.randint(2, 15 * scale), rng.randint(1, 9 * scale)
    second = first + more
    question = (f"{name} collects {first} {item} on Monday and {more} more {item} on Tuesday than on Monday. "
                f"How many {item} does {name} collect in the two days?")
    step1 = f"On Monday {name} collects {first} {item}."
    step2 = rng.choice((f"On Tuesday {name} collects {first} + {more} = {second} {item}.",
                        f"Tuesday gives {first} + {more} = {second} {item}."))
    step3 = rng.choice((f"In total {first} + {second} = {first + second} {item}.",
                        f"Both days give {first} + {second} = {first + second} {item}."))
    return question, [step1, step2, step3], first + second


FAMILIES: tuple[Callable[[random.Random, str, str, int], Problem], ...] = (_buy_give, _gain_lose, _share, _two_days)


def level_scale(level: int) -> int:
    """How much a difficulty level widens the number ranges: level 1 is the demo's task, each level 4x more.

    Why numbers and not steps: a pretrained model reads the templates at once, so what makes a level harder
    for it is multi-digit arithmetic (more uncertain digits per result), while the solution's shape stays.
    """
    if level < 1:
        raise ValueError(f"difficulty level {level}: levels start at 1 ({ONE_DIGIT_LEVEL} is for chain problems only).")
    return 4 ** (level - 1)


ONE_DIGIT_LEVEL = 0
"""The chain problems' easiest level: the start, every operand and every running total one digit (1-9), so each result
is one of 72 one-digit sums and differences. Why it exists: from-scratch students trained as MDLMs learn to copy a result
that a later line repeats but compute few of level 1's two-digit ones (docs/regime.md), and a study that judges
"equal accuracy" needs a base that gets most answers right."""


MAX_LEVEL = 10
"""Level 10 draws numbers up to ~5 million (20 x 4**9); beyond it only the digit count grows, and past ~7,000 Python
cannot even print them."""


def check_level(level: int, chain_steps: int = 0) -> None:
    """Refuse, in one line, a level :func:`make_problem` cannot draw: not a whole number, below 0, 0 without chain steps,
    or above :data:`MAX_LEVEL`."""
    if isinstance(level, bool) or not isinstance(level, int) or not ONE_DIGIT_LEVEL <= level <= MAX_LEVEL \
            or (level == ONE_DIGIT_LEVEL and chain_steps < 1):
        raise ValueError(f"difficulty level {level!r}: levels are whole numbers from 1 to {MAX_LEVEL}, or "
                         f"{ONE_DIGIT_LEVEL} for chain problems (chain_steps >= 1).")


CHAIN_EVENTS = {"+": (("finds {n} more", "finding {n} more"), ("gets {n} more", "getting {n} more")),
                "-": (("gives away {n}", "giving away {n}"), ("loses {n}", "losing {n}"))}
"""The events of a chain problem by operation: (what the question says, what the solution says)."""


def _chain(rng: random.Random, name: str, item: str, level: int, steps: int) -> Problem:
    """``steps`` events, each adding or removing a number of items; one solution line per event.

    Why this family: each line is ~15 tokens, most of them template or copied from the question (predictable once the
    format is learned) and a few uncertain (the result's digits, the wording), so a few steps make answers long and
    mixed while the arithmetic stays a one-digit operand on a running total (at level 1) that a small model learns.
    At :data:`ONE_DIGIT_LEVEL` the running total stays below 10 too.
    """
    one_digit = level == ONE_DIGIT_LEVEL
    scale = 1 if one_digit else level_scale(level)
    total = start = rng.randint(2, 9) if one_digit else rng.randint(5, 20 * scale)
    asked, lines = [], []
    for _ in range(steps):
        room = 9 - total if one_digit else 9 * scale  # the most an event may add
        op = "+" if total < 2 or (room > 0 and rng.random() < 0.5) else "-"
        n = rng.randint(1, room) if op == "+" else rng.randint(1, min(9 * scale, total - 1))
        said, done = rng.choice(CHAIN_EVENTS[op])
        after = total + n if op == "+" else total - n
        asked.append(f"Then {name} {said.format(n=n)}.")
        lines.append(rng.choice((f"After {done.format(n=n)}, {name} has {total} {op} {n} = {after} {item}.",
                                 f"{name} {said.format(n=n)}, so {total} {op} {n} = {after} {item}.")))
        total = after
    question = f"{name} has {start} {item}. {' '.join(asked)} How many {item} does {name} have now?"
    return question, lines, total


def make_problem(rng: random.Random, level: int = 1, chain_steps: int = 0) -> dict[str, str]:
    """One problem as a GSM8K-style row: ``question`` and ``answer`` (solution lines + answer line).

    ``level`` 1 draws exactly the demo's problems; higher levels draw larger operands (:func:`level_scale`).
    ``chain_steps`` > 0 draws a chain problem of that many steps instead (:func:`_chain`: long, mostly template), which
    also has level :data:`ONE_DIGIT_LEVEL`.
    """
    check_level(level, chain_steps)
    if chain_steps > 0:
        question, lines, answer = _chain(rng, rng.choice(NAMES), rng.choice(ITEMS), level, chain_steps)
    else:
        question, lines, answer = rng.choice(FAMILIES)(rng, rng.choice(NAMES), rng.choice(ITEMS), level_scale(level))
    return {"question": question, "answer": "\n".join([*lines, rng.choice(ANSWER_LINES).format(n=answer)])}


def draw_unique(rng: random.Random, level: int, count: int, taken: set[str], chain_steps: int = 0) -> list[dict[str, str]]:
    """``count`` problems of ``level`` whose questions are new (not in ``taken``, which grows with them): how a study
    draws disjoint train and held-out splits over several levels."""
    rows = []
    for _ in range(100 * count):
        if len(rows) == count:
            break
        row = make_problem(rng, level, chain_steps)
        if row["question"] not in taken:
            taken.add(row["question"])
            rows.append(row)
    if len(rows) < count:
        raise ValueError(f"level {level} has fewer than {count} distinct new problems.")
    return rows


def make_splits(
    num_train: int, num_test: int, seed: int = 0, level: int = 1
) -> tuple[list[dict[str, str]], list[dict[str, str]]]:
    """Seeded train and held-out test rows of one difficulty level; no test question appears in the train split."""
    rng = random.Random(seed)
    test: dict[str, dict[str, str]] = {}
    while len(test) < num_test:
        row = make_problem(rng, level)
        test[row["question"]] = row
    train = []
    while len(train) < num_train:
        row = make_problem(rng, level)
        if row["question"] not in test:
            train.append(row)
    return train, list(test.values())


class ArithTask(GSM8KTask):
    """A GSM8K-graded task over given rows (generated by :func:`make_splits`, or a GSM8K file's); the prompt is the
    bare question, as the study's models were trained on it."""

    def __init__(self, rows: Sequence[Mapping[str, Any]], name: str = "arith") -> None:
        self.rows = list(rows)
        self.name = name

    def load(self, data_file: str | None = None, limit: int | None = None, split: str | None = None) -> list[Example]:
        """The rows given at construction (a study splits its files itself, so ``data_file`` is unused)."""
        examples = [self._to_example(row, index, self.name) for index, row in enumerate(self.rows)]
        return examples if limit is None else examples[:limit]

    def _to_example(self, row: Mapping[str, Any], index: int, source: str) -> Example:
        require(row, "question", str, index, source)
        require(row, "answer", str, index, source)
        example = Example(id=str(index), fields=dict(row))
        if self.reference(example) is None:
            raise TaskDataError(f"{source}: row {index} field 'answer' ends with no '#### N' or 'The answer is N.' line")
        return example

    def reference(self, example: Example) -> str | None:
        """The number of the final line: ``#### N`` (GSM8K) or ``The answer is N.``."""
        return parse_number(example.fields["answer"].rsplit("####", 1)[-1].splitlines()[-1])

    def messages(self, example: Example) -> Messages:
        return [{"role": "user", "content": example.fields["question"]}]

    def prompt_format(self, tokenizer: Any = None) -> dict[str, Any]:
        return {"task": self.name, "template": self.template_name(tokenizer), "style": "question only, trained format",
                "shots": 0}
