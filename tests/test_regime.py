"""The regime study (trims_hf.studies.regime, recipes/regime): the chain problems, the pre-registered rule of the curve, the
seed study's reading and its intervals, and both commands end to end at smoke size."""

from __future__ import annotations

import importlib.util
import json
import math
import random
import re
import statistics
import sys
from pathlib import Path

import pytest

from trims_hf.evaluation.evaluate import EvalResult, SampleRecord
from trims_hf.studies import regime
from trims_hf.studies.arith import ArithTask, draw_unique, make_problem
from trims_hf.studies.protocol import BASE, VARIANTS, with_overrides
from trims_hf.studies.regime import reading as regime_reading
from trims_hf.studies.regime import study as regime_study

RECIPE = Path(__file__).resolve().parents[1] / "recipes" / "regime" / "regime.py"
_spec = importlib.util.spec_from_file_location("regime_recipe", RECIPE)
recipe = sys.modules.setdefault(_spec.name, importlib.util.module_from_spec(_spec))
_spec.loader.exec_module(recipe)


# -- the chain problems ---------------------------------------------------------------------------------------------
@pytest.mark.parametrize("level", [0, 1, 2, 3])
@pytest.mark.parametrize("steps", [1, 3, 5])
def test_chain_problems_solve_themselves_line_by_line(level, steps):
    rng = random.Random(level * 10 + steps)
    for _ in range(200):
        row = make_problem(rng, level, chain_steps=steps)
        *lines, last = row["answer"].split("\n")
        assert len(lines) == steps and row["question"].count("Then ") == steps
        total = int(re.match(r"\w+ has (\d+) ", row["question"]).group(1))
        for line in lines:
            before, op, n, after = re.search(r"(\d+) ([+-]) (\d+) = (\d+)", line).groups()
            assert int(before) == total and int(after) == (int(before) + int(n) if op == "+" else int(before) - int(n))
            assert f" {n}" in row["question"]  # every operand is copied from the question
            total = int(after)
            assert total >= 1
        example = ArithTask([row]).load()[0]
        assert ArithTask([row]).reference(example) == str(total)


def test_one_digit_level_keeps_every_number_one_digit_and_draws_every_fact():
    rng, facts = random.Random(3), set()
    for _ in range(3000):
        row = make_problem(rng, 0, chain_steps=4)
        numbers = [int(n) for n in re.findall(r"\d+", row["question"] + row["answer"])]
        assert all(1 <= n <= 9 for n in numbers), row
        facts |= set(re.findall(r"\d [+-] \d = \d", row["answer"]))
    assert len(facts) == 72  # every one-digit sum and difference with operands and result in 1-9


@pytest.mark.parametrize("level, steps", [(0, 0), (-1, 3), (11, 3), (10**6, 3), (1.5, 3), (True, 3)])
def test_levels_a_problem_cannot_have_are_refused_in_one_line(level, steps):
    with pytest.raises(ValueError, match=rf"^difficulty level {level!r}: levels are whole numbers from 1 to 10, or 0 "):
        make_problem(random.Random(0), level, chain_steps=steps)
    with pytest.raises(ValueError, match=f"^levels: difficulty level {level!r}"):
        regime.RegimeProtocol(levels=(level, 1), chain_steps=steps)


def test_the_hardest_level_draws():
    row = make_problem(random.Random(0), 10, chain_steps=3)
    assert ArithTask([row]).reference(ArithTask([row]).load()[0]).isdigit()


def test_chain_steps_zero_draws_the_demos_problems_unchanged():
    plain, chained = random.Random(5), random.Random(5)
    assert [make_problem(plain, 1) for _ in range(30)] == [make_problem(chained, 1, chain_steps=0) for _ in range(30)]


def test_draw_unique_never_repeats_a_question_across_calls():
    rng, taken = random.Random(0), set()
    first = draw_unique(rng, 1, 50, taken, chain_steps=3)
    second = draw_unique(rng, 2, 50, taken, chain_steps=3)
    questions = [row["question"] for row in first + second]
    assert len(set(questions)) == 100 and taken == set(questions)
    with pytest.raises(ValueError, match="fewer than 10 distinct"):
        draw_unique(_Constant(), 1, 10, set(), chain_steps=3)


class _Constant(random.Random):
    """A generator that always draws the same problem."""

    def random(self) -> float:
        return 0.0

    def randint(self, a: int, b: int) -> int:
        return a

    def choice(self, seq):
        return seq[0]


# -- the rule ---------------------------------------------------------------------------------------------------------
def row(point: str, cost: float, hard_share: float = 0.6, **levels: tuple[float, float]) -> dict:
    return {"point": point, "cost": cost, "hard_share": hard_share, "hidden_size": 64, "batch_size": 16,
            "base_steps": 100, "base_wall_s": 1.0,
            "levels": {int(k[1:]): {"accuracy": acc, "answer_tokens": tokens, "tokens_per_step": 1.5}
                       for k, (acc, tokens) in levels.items()}}


P = regime.RegimeProtocol()


def test_rule_takes_the_cheapest_qualifying_point_and_on_a_tie_the_harder_level():
    rows = [row("dear", 8.0, L1=(0.95, 60), L2=(0.9, 60)),
            row("cheap", 2.0, L1=(0.7, 55), L2=(0.61, 58)),
            row("cheapest-but-short", 1.0, L1=(0.9, 40), L2=(0.2, 50))]
    assert regime.choose(rows, P) == {"point": "cheap", "level": 2, "meets_target": True}


def test_rule_conditions_each_can_disqualify():
    assert regime.choose([row("a", 1.0, L1=(0.59, 60))], P)["meets_target"] is False  # accuracy
    assert regime.choose([row("a", 1.0, L1=(0.9, 47.9))], P) is None  # answers too short
    assert regime.choose([row("a", 1.0, hard_share=0.49, L1=(0.9, 60))], P) is None  # not mixed
    assert regime.meets(row("a", 1.0, L1=(0.6, 48)), 1, P) == {"accuracy": True, "long": True, "mixed": True}


def test_rule_without_a_qualifying_point_flags_the_most_accurate_long_mixed_one():
    rows = [row("a", 1.0, L1=(0.3, 60), L2=(0.1, 60)), row("b", 4.0, L1=(0.5, 60), L2=(0.55, 40))]
    assert regime.choose(rows, P) == {"point": "b", "level": 1, "meets_target": False}
    assert "NO point met the rule" in regime.format_curve(rows, P)


def test_grid_points_run_cheapest_first_and_cost_scales_with_steps_batch_and_width():
    points = regime.CurveGrid(sizes=((64, 4, 4), (128, 4, 4)), batch_sizes=(16, 32), base_steps=(500, 1000)).points(P)
    costs = [p.cost() for p in points]
    assert costs == sorted(costs) and len(points) == 8
    small = regime.RegimeProtocol(hidden_size=64, batch_size=16, base_steps=500, pretrain_steps=250)  # 8,000 rows each
    assert regime.RegimeProtocol(hidden_size=128, batch_size=16, base_steps=500, pretrain_steps=250).cost() == 4 * small.cost()
    assert regime.RegimeProtocol(hidden_size=64, batch_size=32, base_steps=1000, pretrain_steps=1000).cost() == 4 * small.cost()
    grid = regime.CurveGrid(sizes=((64, 4, 4),), batch_sizes=(16,), base_steps=(500,), pretrain_steps=(3000, 1500))
    assert [p.pretrain_steps for p in grid.points(P)] == [1500, 3000]  # the cheaper pretrained model first
    assert [regime.point_name(p) for p in grid.points(P)] == ["h64-L4-p1500-b16-s500", "h64-L4-p3000-b16-s500"]
    assert regime.point_name(small) == "h64-L4-p250-b16-s500" and regime.point_name(P) == "h64-L4-b16-s1000"


def test_protocol_rejects_a_test_level_it_does_not_draw():
    with pytest.raises(ValueError, match="test_level=3"):
        regime.RegimeProtocol(levels=(1, 2), test_level=3)


# -- copies or computes ------------------------------------------------------------------------------------------------
ANSWER = "Mia finds 7, so 12 + 7 = 19 pens.\nThen 19 - 3 = 16 pens.\n#### 16"


@pytest.fixture(scope="module")
def chain_tokenizer():
    from trims_hf.studies.tiny import build_tokenizer

    return build_tokenizer([f"Mia has 12 pens.\n{ANSWER}"])


def _tokenized(tokenizer):
    from trims_hf.data.preparation import tokenize_example
    from trims_hf.settings import StudentFormat

    return tokenize_example(tokenizer, "Mia has 12 pens.", ANSWER, StudentFormat(max_length=64))


def test_result_views_mask_the_result_then_every_later_number_then_everything_after(chain_tokenizer):
    example = _tokenized(chain_tokenizer)
    ids, length = example.input_ids, len(example.input_ids)
    text = lambda positions: chain_tokenizer.decode([ids[p] for p in positions]).replace(" ", "")  # noqa: E731
    cases = regime.result_masks(example.completion_spans, ANSWER, example.prompt_length, length)
    assert [text(positions) for positions, _ in cases] == ["19", "16"]  # every digit token, the spaced one too
    (first, views), (second, later) = cases
    assert views["rest visible"] == first
    assert text(views["later numbers masked"]) == "19193" + "1616"  # not 12 or 7 (before it), every number after
    assert views["left to right"] == list(range(first[0], length))
    assert later["later numbers masked"][0] == second[0] and text(later["later numbers masked"]) == "1616"


def test_result_recall_reads_each_view_from_the_aligned_logits(chain_tokenizer):
    """An oracle (the true tokens' logits, shifted as a Dream student's) recalls every result in every view; a student
    that predicts its input recalls none, since every view masks the result."""
    from types import SimpleNamespace

    import torch

    from trims_hf import prepare_student
    from trims_hf.studies.tiny import tiny_llama

    model = prepare_student(tiny_llama(chain_tokenizer, 16, 1, 2, 64, seed=0), "dream", chain_tokenizer.mask_token_id)
    truth = torch.tensor(_tokenized(chain_tokenizer).input_ids)
    vocab = len(chain_tokenizer)
    oracle = torch.nn.functional.one_hot(torch.cat([truth[1:], truth[-1:]]), vocab).float()  # logit i-1 -> token i
    rows = [{"question": "Mia has 12 pens.", "answer": ANSWER}] * 2
    model.forward = lambda input_ids, **_: SimpleNamespace(logits=oracle.expand(len(input_ids), -1, -1))
    assert regime.result_recall(model, chain_tokenizer, rows, None) == {
        "results": 4, "problems": 2, **dict.fromkeys(regime.RECALL_VIEWS, 1.0)}
    model.forward = lambda input_ids, **_: SimpleNamespace(
        logits=torch.nn.functional.one_hot(torch.cat([input_ids[:, 1:], input_ids[:, -1:]], 1), vocab).float())
    assert regime.result_recall(model, chain_tokenizer, rows, None) == {
        "results": 4, "problems": 2, **dict.fromkeys(regime.RECALL_VIEWS, 0.0)}


# -- the reading ------------------------------------------------------------------------------------------------------
def evaluation(model: str, tau: float, tokens_per_step: float, correct: list[bool]) -> EvalResult:
    samples = [SampleRecord(str(i), "q", "1", "a", "1", c, None, 50, 50, 10, 0.1) for i, c in enumerate(correct)]
    return EvalResult(model=model, task="chain-L1", accuracy=sum(correct) / len(correct), tokens_per_step=tokens_per_step,
                      tokens_per_forward_non_eos=tokens_per_step, tokens_per_second=1.0, nfe=10, generated_tokens=50,
                      non_eos_tokens=50, num_samples=len(correct), decode_time_s=1.0, wall_time_s=1.0, early_stop=True,
                      prompt_format={}, decoding={"strategy": "threshold", "threshold": tau}, samples=samples)


def seeds_of(ratios: list[float], trims_correct: list[bool], mdlm_correct: list[bool]) -> list:
    results = []
    for seed, ratio in enumerate(ratios):
        results += [(seed, evaluation("MDLM", 0.9, 2.0, mdlm_correct)),
                    (seed, evaluation("TRIMS hard-to-easy", 0.9, 2.0 * ratio, trims_correct)),
                    (seed, evaluation(BASE, 0.9, 1.0, mdlm_correct))]
    return results


def test_claim_holds_with_four_of_five_seeds_above_and_equal_accuracy():
    same = [True, False] * 50
    (claim,) = regime.claim_rows(seeds_of([1.2, 1.1, 1.3, 0.9, 1.05], same, same))
    assert claim["seeds_above"] == 4 and claim["holds"] and claim["paired_problems"] == 500
    assert claim["accuracy_difference"] == 0.0 and claim["difference_interval"][1] >= 0
    assert math.isclose(claim["mean_ratio"], (1.2 + 1.1 + 1.3 + 0.9 + 1.05) / 5)


def test_claim_fails_with_three_seeds_above_or_an_interval_below_zero():
    same = [True, False] * 50
    (three,) = regime.claim_rows(seeds_of([1.2, 1.1, 1.3, 0.9, 0.95], same, same))
    assert three["seeds_above"] == 3 and not three["holds"]
    worse = [True, False, False, False] * 25  # 25% against MDLM's 50%: the whole interval below 0
    (costly,) = regime.claim_rows(seeds_of([1.5] * 5, worse, same))
    assert costly["difference_interval"][1] < 0 and not costly["holds"]
    better = [True, True, True, False] * 25
    (favoured,) = regime.claim_rows(seeds_of([1.5] * 5, better, same))
    assert favoured["difference_interval"][0] > 0 and favoured["holds"]


def test_wilson_interval_stays_in_range_and_holds_the_estimate():
    assert regime.wilson(0, 100)[0] == pytest.approx(0.0, abs=1e-12) and regime.wilson(100, 100)[1] == pytest.approx(1.0)
    low, high = regime.wilson(300, 500)
    assert low < 0.6 < high and high - low == pytest.approx(2 * 1.96 * math.sqrt(0.6 * 0.4 / 500), rel=0.02)


def test_wilson_matches_scipy_and_refuses_more_correct_than_problems():
    stats = pytest.importorskip("scipy.stats")
    for n in (1, 2, 7, 40, 113):
        for correct in range(n + 1):
            expected = stats.binomtest(correct, n).proportion_ci(method="wilson")
            low, high = regime.wilson(correct, n)
            assert 0.0 <= low <= high <= 1.0
            assert (low, high) == pytest.approx((expected.low, expected.high), abs=2e-4)  # z 1.96, scipy's 1.959964
    assert regime.wilson(0, 10)[0] == 0.0 and regime.wilson(10, 10)[1] == 1.0  # not -0.0 / 1.0000000000000002
    for correct, n in ((5, 3), (-1, 3)):
        with pytest.raises(ValueError, match=rf"^wilson: {correct} correct of {n}; needs 0 <= correct <= n\.$"):
            regime.wilson(correct, n)


def test_claim_rows_refuse_a_run_given_twice_and_a_baseline_that_decoded_no_step():
    same = [True, False] * 50
    twice = seeds_of([1.2, 1.1], same, same)
    with pytest.raises(ValueError, match="MDLM at threshold 0.9, seed 0: two results"):
        regime.claim_rows([*twice, twice[0]])
    for rows in (regime.accuracy_rows, regime.frontier_rows):
        with pytest.raises(ValueError, match="two results"):
            rows([*twice, twice[0]])
    stalled = [(0, evaluation("MDLM", 0.9, 0.0, same)), (0, evaluation("TRIMS hard-to-easy", 0.9, 2.0, same))]
    with pytest.raises(ValueError, match=r"MDLM at threshold 0\.9, seed 0: tokens per step 0\.0 \(no step decoded\)"):
        regime.claim_rows(stalled)


def test_accuracy_rows_pool_seeds_and_average_aup():
    results = seeds_of([1.2, 1.1], [True, False] * 50, [True] * 100)
    rows = {(r["model"], r["threshold"]): r for r in regime.accuracy_rows(results)}
    assert rows["MDLM", 0.9]["problems"] == 200 and rows["MDLM", 0.9]["accuracy"] == 1.0
    assert rows["TRIMS hard-to-easy", 0.9]["accuracy"] == 0.5
    assert rows["TRIMS hard-to-easy", 0.9]["tokens_per_step"] == pytest.approx(2.0 * 1.15)


# -- the commands -----------------------------------------------------------------------------------------------------
def test_bad_input_is_one_line_before_anything_runs(tmp_path, capsys):
    assert recipe.main(["curve", "--output", str(tmp_path / "c"), "--sizes", "64x4"]) == 2
    assert "--sizes 64x4: expected HIDDENxLAYERSxHEADS" in capsys.readouterr().err
    assert recipe.main(["curve", "--output", str(tmp_path / "c"), "--sizes", "64x4x4", "64x4x3"]) == 2
    assert capsys.readouterr().err == ("error: --sizes 64x4x3: hidden_size=64, num_heads=3: each head takes hidden_size "
                                       "/ num_heads dimensions, which must be a whole even number (rotary positions "
                                       "pair them).\n")
    assert recipe.main(["study", "--output", str(tmp_path / "s"), "--set", "test_level=3"]) == 2
    assert "--set" in capsys.readouterr().err
    assert not (tmp_path / "c").exists() and not (tmp_path / "s").exists()
    assert recipe.main(["copies", "--model", str(tmp_path / "none"), "--rows", str(tmp_path / "x.jsonl")]) == 2
    assert f"--model {tmp_path / 'none'}: copies needs an existing folder" in capsys.readouterr().err
    rows = tmp_path / "rows.jsonl"
    for row, message in (({"question": "q"}, "row 0 has no field 'answer'"),
                         ({"question": "q", "answer": "Yes.\n#### 4"}, "no answer has a solution line with a result")):
        rows.write_text(json.dumps(row) + "\n")
        assert recipe.main(["copies", "--model", str(tmp_path), "--rows", str(rows)]) == 2  # before any model loads
        assert message in capsys.readouterr().err
    for row in ({"question": "q", "answer": "So 2 + 2 = 4.\n#### 4"}, {"prompt": "q", "completion": "So 2 + 2 = 4.\n#### 4"}):
        rows.write_text(json.dumps(row) + "\n")  # held-out rows, or a study's training rows: both read
        assert recipe.main(["copies", "--model", str(tmp_path), "--rows", str(rows)]) == 2
        assert f"--model {tmp_path}: not a student folder" in capsys.readouterr().err
    assert recipe.main(["curve", "--sizes", "64x4x4"]) == 2
    assert "curve needs --output" in capsys.readouterr().err
    (tmp_path / "seed-0" / "base").mkdir(parents=True)
    assert recipe.main(["mechanism", "--output", str(tmp_path), "--seeds", "0"]) == 2
    assert f"--output {tmp_path}: no trained models of seed 0 there" in capsys.readouterr().err
    assert recipe.main(["mechanism", "--output", str(tmp_path), "--problems", "0"]) == 2
    assert "--problems 0: must be at least 1" in capsys.readouterr().err


def test_ctrl_c_is_one_line_exit_130(tmp_path, monkeypatch, capsys):
    def ctrl_c(self: regime_study.RegimeStudy) -> None:
        raise KeyboardInterrupt

    monkeypatch.setattr(regime_study.RegimeStudy, "stage_pretrained", ctrl_c)
    argv = ["curve", "--smoke", "--output", str(tmp_path), "--sizes", "32x2x2", "--batch-sizes", "8", "--base-steps", "2"]
    assert recipe.main(argv) == 130
    (line,) = capsys.readouterr().err.splitlines()
    assert re.fullmatch(rf"error: interrupted between units; 1 finished unit kept in {re.escape(str(tmp_path))}/\S+: "
                        r"run the same command again to continue\.", line), line
    assert not (tmp_path / "curve.jsonl").exists()

    def ctrl_c_between_studies(*args) -> int:
        raise KeyboardInterrupt

    monkeypatch.setattr(recipe, "run_studies", ctrl_c_between_studies)
    assert recipe.main(argv) == 130
    assert capsys.readouterr().err.splitlines() == [
        f"error: interrupted between studies; their finished units are kept in {tmp_path}: run the same command again to "
        "continue."]


@pytest.mark.slow
def test_curve_and_seed_study_run_end_to_end_and_resume(tmp_path):
    curve = tmp_path / "curve"
    # A smoke base meets no other rule; each evaluation of the test problems decodes one batch.
    rule = ["--set", "target_accuracy=0", "--set", "min_hard_share=0", "--set", "test_problems=4"]
    argv = ["curve", "--smoke", "--output", str(curve), "--sizes", "32x2x2", "--batch-sizes", "8", "--base-steps", "2", "4",
            *rule]
    assert recipe.main(argv) == 0
    rows = [json.loads(line) for line in (curve / "curve.jsonl").read_text().splitlines()]
    copies = [probe["copies"] for row in rows for probe in row["levels"].values()]
    assert copies and all(c["results"] >= c["problems"] > 0 and 0 <= c[regime.RECALL_VIEWS[1]] <= 1 for c in copies)
    assert [r["point"] for r in rows] == ["h32-L2-p20-b8-s2"]  # it met the rule: the dearer point is never run
    assert {"train_per_level=48", "target_accuracy=0.0"} <= set(rows[0]["settings"])  # what the study takes up
    assert (curve / "curve.png").is_file() and "| h32-L2-p20-b8-s2 **(chosen)** | 1 |" in (curve / "curve.md").read_text()
    assert recipe.main(argv) == 0  # a rerun skips both points
    assert [json.loads(line)["point"] for line in (curve / "curve.jsonl").read_text().splitlines()] == [r["point"] for r in rows]

    assert json.loads((curve / "choice.json").read_text())["point"] == "h32-L2-p20-b8-s2"  # the cheaper one
    study = tmp_path / "study"
    argv = ["study", "--smoke", "--output", str(study), "--seeds", "0", "1", "--from-curve", str(curve), *rule]
    assert recipe.main(argv) == 0
    report = json.loads((study / "report" / "study.json").read_text())
    assert report["evaluations"] == report["planned"] == 2 * 4 * 2  # 2 seeds x 4 variants x 2 thresholds (the probe
    assert set(report["probes"]) == {"0", "1"}                        # measures each seed's base)
    assert {c["model"] for c in report["claim"]} == {"TRIMS hard-to-easy", "TRIMS easy-to-hard", "TRIMS random"}
    assert all(c["seeds"] == [0, 1] for c in report["claim"])
    bases = [json.loads((study / f"seed-{s}" / "base" / "unit.json").read_text()) for s in (0, 1)]
    assert [b["seed"] for b in bases] == [0, 1] and bases[0]["saved_weights"] != bases[1]["saved_weights"]
    shared = [json.loads((folder / "pretrained" / "unit.json").read_text())["wall_s"]
              for folder in (curve / "h32-L2-p20", study / "seed-0", study / "seed-1")]
    assert shared[0] == shared[1] == shared[2]  # the curve's pretrained model, copied, not retrained
    assert bases[0]["steps"] == 2 and json.loads((study / "seed-0" / "protocol.json").read_text())["protocol"][
        "variant_steps"] == 1  # the chosen point's steps, its variants a quarter of them
    # The same study at another trajectory ratio, lent the first one's stages: its bases are the same files, its
    # variants trained anew at the new ratio.
    again = tmp_path / "again"
    argv = ["study", "--smoke", "--output", str(again), "--seeds", "0", "1", "--from-curve", str(curve), *rule,
            "--reuse", str(study), "--set", "masking.trajectory_ratio=0.5"]
    assert recipe.main(argv) == 0
    for s in (0, 1):
        for stage in ("base", "probe"):
            assert (again / f"seed-{s}" / stage / "unit.json").read_text() == \
                (study / f"seed-{s}" / stage / "unit.json").read_text()
        variant = json.loads((again / f"seed-{s}" / "variants" / f"trims_hard_to_easy-seed{s}" / "unit.json").read_text())
        assert variant["protocol"] == json.loads((again / f"seed-{s}" / "protocol.json").read_text())["fingerprint"]
    assert json.loads((again / "seed-0" / "protocol.json").read_text())["protocol"]["masking.trajectory_ratio"] == 0.5
    # What its trajectory rows taught: every variant read against MDLM in its ordering, each seed measured once.
    argv = ["mechanism", "--smoke", "--output", str(again), "--seeds", "0", "1", "--from-curve", str(curve), *rule,
            "--set", "masking.trajectory_ratio=0.5", "--problems", "3"]
    assert recipe.main(argv) == 0
    report = json.loads((again / "report" / "mechanism.json").read_text())
    assert [row["model"] for row in report["table"]] == ["TRIMS hard-to-easy", "TRIMS easy-to-hard", "TRIMS random"]
    assert all(row["seeds"] == [0, 1] for row in report["table"])
    for seed in ("0", "1"):
        for ordering, models in report["readings"][seed]["gain"].items():
            assert set(models) == {"MDLM", next(n for n, (t, o) in VARIANTS.items() if t and o == ordering)}
            assert all(m["pooled"]["tokens"] > 0 and len(m["per_row"]) == 3 for m in models.values())  # of 4
        commits = report["readings"][seed]["commits"]
        assert set(commits) == {"MDLM", "TRIMS hard-to-easy", "TRIMS easy-to-hard", "TRIMS random"}
        assert all(len(profile) == 4 for profile in commits.values())  # the smoke run's 4 buckets
    assert {row["model"] for row in report["commits"]} == set(commits)
    measured = (again / "seed-0" / "mechanism" / "unit.json").read_text()
    assert recipe.main(argv) == 0 and (again / "seed-0" / "mechanism" / "unit.json").read_text() == measured


def test_the_study_takes_the_chosen_point_and_refuses_a_curve_that_missed(tmp_path, capsys):
    rows = [row("h64-L4-p1600-b16-s1000", 2.0, L1=(0.7, 55), L2=(0.3, 58)) | {"num_layers": 4, "num_heads": 4,
                                                                              "pretrain_steps": 1600, "base_steps": 1000}]
    p = regime.chosen_protocol(P, rows)
    assert (p.hidden_size, p.pretrain_steps, p.batch_size, p.base_steps, p.variant_steps, p.test_level) == \
        (64, 1600, 16, 1000, 250, 1)
    with pytest.raises(ValueError, match="no point that meets the rule"):
        regime.chosen_protocol(P, [row("a", 1.0, L1=(0.3, 60))])
    (tmp_path / "curve.jsonl").write_text(json.dumps(row("a", 1.0, L1=(0.3, 60))) + "\n")
    assert recipe.main(["study", "--output", str(tmp_path / "s"), "--from-curve", str(tmp_path)]) == 2
    assert "no study is run there" in capsys.readouterr().err and not (tmp_path / "s").exists()


def test_the_study_takes_up_the_settings_the_curve_ran_with(tmp_path, capsys):
    point = row("h64-L4-p1600-b16-s1000", 2.0, L0=(0.7, 62), L1=(0.2, 66)) | {
        "num_layers": 4, "num_heads": 4, "pretrain_steps": 1600, "base_steps": 1000,
        "settings": ["levels=0,1", "chain_steps=4", "decoding.threshold=0.8", "base_steps=50"]}
    p = regime.chosen_protocol(P, [point])
    assert (p.levels, p.chain_steps, p.decoding.threshold, p.test_level, p.base_steps) == ((0, 1), 4, 0.8, 0, 1000)
    # A curve whose shared stages were made under other settings than the study's is refused, before anything runs.
    (tmp_path / "curve.jsonl").write_text(json.dumps({**point, "settings": []} | {"levels": {"1": point["levels"][0]}}) + "\n")
    made = regime.chosen_protocol(P, regime.read_curve(tmp_path / "curve.jsonl"))
    data = tmp_path / regime.pretrained_tag(made) / "data"
    data.mkdir(parents=True)
    (data / "unit.json").write_text(json.dumps({"unit": "data", "protocol": made.fingerprint("data")}))
    for settings, refused in ((["--set", "chain_steps=4"], True), ([], False)):
        with pytest.MonkeyPatch.context() as patch:
            patch.setattr(regime, "run_seeds", lambda *args, **kwargs: (_ for _ in ()).throw(SystemExit(7)))
            argv = ["study", "--output", str(tmp_path / "s"), "--from-curve", str(tmp_path), *settings]
            if refused:
                assert recipe.main(argv) == 2
                assert f"its data stage ({data / 'unit.json'}) was made under other settings" in capsys.readouterr().err
            else:
                with pytest.raises(SystemExit, match="7"):  # accepted: it reaches the seeds
                    recipe.main(argv)


def test_a_study_reuses_another_studys_stages_only_where_made_under_its_settings(tmp_path, monkeypatch, capsys):
    """A study at another trajectory ratio takes the other study's bases; one at another base learning rate takes only
    what comes before the base. A seed the other study does not have takes only the shared stages, from the first."""
    from trims_hf.studies.units import KEY_FILE, STUDY_MARK, Units

    old = tmp_path / "old"
    made = regime.RegimeProtocol(seed=0)
    for stage in regime.REUSABLE_STAGES:
        (old / "seed-0" / stage).mkdir(parents=True)
        (old / "seed-0" / stage / KEY_FILE).write_text(json.dumps(Units(made, "cpu").key(stage, stage), indent=2))
    (tmp_path / "ratio" / "seed-0" / "base").mkdir(parents=True)  # a base cut short in an earlier run: replaced
    (tmp_path / "ratio" / "seed-0" / STUDY_MARK).write_text("{}")  # that run's study folder
    ran = []
    monkeypatch.setattr(regime_study, "RegimeStudy", lambda folder, p, deadline: type(
        "Stub", (), {"run": lambda self: ran.append(folder) or True})())
    for name, settings, expected in (("ratio", ["masking.trajectory_ratio=0.5"], list(regime.REUSABLE_STAGES)),
                                     ("lr", ["base_lr=0.002"], list(regime.SHARED_STAGES))):
        output = tmp_path / name
        assert regime.run_seeds(output, with_overrides(P, settings), [0, 1], reuse=old)
        assert sorted(p.name for p in (output / "seed-0").iterdir() if p.is_dir()) == sorted(expected)
        assert all(Units(made, "cpu").finished(output / "seed-0" / stage, stage, stage) or stage not in expected
                   for stage in regime.REUSABLE_STAGES if stage != "base" or name == "ratio")
        assert sorted(p.name for p in (output / "seed-1").iterdir() if p.is_dir()) == sorted(regime.SHARED_STAGES)
        said = capsys.readouterr().out
        assert f"seed 0: from {old}, took {', '.join(expected)}" in said and f"seed 1: from {old}, took no stage" in said
        assert ("not base, probe (made under other settings)" in said) == (name == "lr")
    assert recipe.main(["study", "--output", str(tmp_path / "x"), "--reuse", str(tmp_path / "ratio"), "--seeds",
                        "2"]) == 2
    assert f"--reuse {tmp_path / 'ratio'}: no seed-<s> folder of seeds 2 there." in capsys.readouterr().err
    assert regime.run_seeds(tmp_path / "ratio", with_overrides(P, ["masking.trajectory_ratio=0.5"]), [0], reuse=old)
    assert f"seed 0: from {old}, took no stage; had {', '.join(regime.REUSABLE_STAGES)} already" in capsys.readouterr().out
    for command in (["curve", "--output", str(tmp_path / "x")], ["copies", "--model", str(old), "--rows", str(old)]):
        assert recipe.main([*command, "--reuse", str(tmp_path / "ratio")]) == 2
        assert f"unrecognized arguments: --reuse {tmp_path / 'ratio'}" in capsys.readouterr().err  # the study's flag
    assert not (tmp_path / "x").exists()


def test_a_stage_copy_is_whole_or_absent(tmp_path, monkeypatch):
    source, target = tmp_path / "source", tmp_path / "seed-0" / "base"
    source.mkdir()
    for name in ("cache-key.json", "model.safetensors"):
        (source / name).write_text(name)
    real_copytree = regime.seeds.shutil.copytree

    def key_file_then_fail(src, dst, **kwargs):  # a copy cut short after the key file, before the weights
        Path(dst).mkdir()
        (Path(dst) / "cache-key.json").write_text((Path(src) / "cache-key.json").read_text())
        raise OSError("disk full")

    target.parent.mkdir()
    with monkeypatch.context() as patch:
        patch.setattr(regime.seeds.shutil, "copytree", key_file_then_fail)
        with pytest.raises(OSError):
            regime.copy_stage(source, target)
    assert regime.seeds.shutil.copytree is real_copytree
    assert not target.exists()  # no key file without its weights
    regime.copy_stage(source, target)  # again: the partial copy is cleared first
    assert sorted(p.name for p in target.iterdir()) == ["cache-key.json", "model.safetensors"]
    assert [p.name for p in target.parent.iterdir()] == ["base"]


def test_grid_crosses_learning_rates_and_annealing_at_equal_cost():
    grid = regime.CurveGrid(sizes=((64, 4, 4),), batch_sizes=(16,), base_steps=(1000,), pretrain_steps=(1600,),
                            base_lrs=(1e-3, 3e-4), anneal_fractions=(0.0, 0.25))
    points = grid.points(P)
    assert [regime.point_name(p) for p in points] == ["h64-L4-p1600-b16-s1000", "h64-L4-p1600-b16-s1000-a250",
                                                      "h64-L4-p1600-b16-s1000-lr0.0003",
                                                      "h64-L4-p1600-b16-s1000-lr0.0003-a250"]
    assert len({p.cost() for p in points}) == 1 and {p.anneal_steps for p in points} == {0, 250}
    assert len({regime.size_folder(Path("x"), p) for p in points}) == 1  # one pretrained model for all four
    chosen = regime.chosen_protocol(P, [{**row("h64-L4-p1600-b16-s1000-lr0.0003-a250", 1.0, L1=(0.7, 55)),
                                         "num_layers": 4, "base_steps": 1000, "pretrain_steps": 1600, "base_lr": 3e-4,
                                         "anneal_steps": 250}])
    assert (chosen.base_lr, chosen.anneal_steps, chosen.variant_steps) == (3e-4, 250, 250)


# -- the frontier reading ---------------------------------------------------------------------------------------------
def curves(seeds: int, mdlm: list[tuple[float, float, float]], trims: list[tuple[float, float, float]]) -> list:
    """(tau, tokens per step, accuracy share) points of MDLM and TRIMS hard-to-easy, the same in every seed; accuracy
    shares in hundredths (100 problems)."""
    def graded(share: float) -> list[bool]:
        return [i < round(100 * share) for i in range(100)]

    return [(seed, evaluation(name, tau, speed, graded(share))) for seed in range(seeds)
            for name, points in (("MDLM", mdlm), ("TRIMS hard-to-easy", trims)) for tau, speed, share in points]


def test_the_frontier_difference_is_each_seeds_aup_against_the_pairs_best_accuracy():
    mdlm = [(0.5, 4.0, 0.78), (0.9, 2.0, 0.80)]  # within 5 points of the slowest point: AUP keeps both
    faster = [(0.5, 5.0, 0.78), (0.9, 2.5, 0.80)]
    (row,) = regime.frontier_rows(curves(5, mdlm, faster))
    weighted_78 = 78 * math.exp(-3 * (1 - 78 / 80))
    aup = {"MDLM": 2.0 * 80 + 0.5 * 2.0 * (weighted_78 + 80), "TRIMS": 2.5 * 80 + 0.5 * 2.5 * (weighted_78 + 80)}
    assert row["aup_difference_per_seed"] == pytest.approx(dict.fromkeys(range(5), aup["TRIMS"] - aup["MDLM"]))
    assert row["frontier"] == "above" and row["interval"][0] == pytest.approx(aup["TRIMS"] - aup["MDLM"])
    assert row["dominated_by_mdlm"] == {0.5: [], 0.9: []}


def test_a_slower_and_less_accurate_point_is_dominated_and_a_curve_below_reads_below():
    mdlm = [(0.5, 4.0, 0.70), (0.9, 2.0, 0.80)]
    worse = [(0.5, 3.5, 0.68), (0.9, 1.9, 0.80)]
    (row,) = regime.frontier_rows(curves(3, mdlm, worse))
    assert row["frontier"] == "below" and row["interval"][1] < 0
    assert row["dominated_by_mdlm"] == {0.5: [0.5], 0.9: [0.9]}
    (same,) = regime.frontier_rows(curves(3, mdlm, mdlm))
    assert same["frontier"] == "not apart" and same["dominated_by_mdlm"] == {0.5: [], 0.9: []}


def test_a_partial_report_compares_points_over_the_seeds_both_runs_have():
    """Seed 2 of MDLM, a fast and accurate one, is finished before TRIMS's seed 2: TRIMS's two seeds are compared with
    MDLM's same two, where MDLM's point is TRIMS's own, so nothing dominates it (pooled over all three MDLM seeds, the
    extra seed would)."""
    mdlm = [(0.5, 4.0, 0.70), (0.9, 2.0, 0.80)]
    results = curves(2, mdlm, mdlm) + [(2, evaluation("MDLM", tau, 9.0, [True] * 100)) for tau in (0.5, 0.9)]
    (row,) = regime.frontier_rows(results)
    assert row["seeds"] == [0, 1] and row["dominated_by_mdlm"] == {0.5: [], 0.9: []}


def test_a_seed_interval_is_students_t_over_the_seeds():
    mean, low, high = regime.seed_interval([1.0, 2.0, 3.0, 4.0, 5.0])
    half = 2.776 * statistics.stdev([1, 2, 3, 4, 5]) / math.sqrt(5)
    assert (mean, low, high) == pytest.approx((3.0, 3.0 - half, 3.0 + half))
    assert math.isnan(regime.seed_interval([2.0])[1])
    assert all(math.isnan(v) for v in regime.seed_interval([0.1, math.nan, 0.2]))  # a seed without a reading
    with pytest.raises(ValueError, match="no values"):
        regime.seed_interval([])


def test_a_seed_interval_over_many_seeds_uses_t_not_the_normal_quantile():
    stats = pytest.importorskip("scipy.stats")
    for degrees in (*range(1, 40), 60, 120, 1000):
        assert regime_reading.t_975(degrees) == pytest.approx(stats.t.ppf(0.975, degrees), abs=5e-4 if degrees <= 10 else 5e-6)
    values = [0.05 * ((7 * i) % 12) - 0.2 for i in range(12)]
    low, high = stats.t.interval(0.95, len(values) - 1, loc=statistics.fmean(values), scale=stats.sem(values))
    assert regime.seed_interval(values)[1:] == pytest.approx((low, high), abs=1e-5)


def test_the_mechanism_reads_each_variant_against_mdlm_in_its_ordering_per_seed():
    def gain(logprob: float, confidence: float) -> dict:
        pooled = {"revealed_logprob": logprob - 1, "masked_logprob": -1.0, "gain_logprob": logprob,
                  "revealed_confidence": confidence + 0.2, "masked_confidence": 0.2, "gain_confidence": confidence}
        return {"pooled": pooled}

    readings = {seed: {"hard_to_easy": {"MDLM": gain(0.2, 0.05), "TRIMS hard-to-easy": gain(0.2 + lift, 0.05)},
                       "random": {"MDLM": gain(0.3, 0.1), "TRIMS random": gain(0.3 - 0.1, 0.1)}}
                for seed, lift in enumerate([0.10, 0.12, 0.08, 0.11, 0.09])}
    rows = {row["model"]: row for row in regime.mechanism_rows(readings)}
    assert set(rows) == {"TRIMS hard-to-easy", "TRIMS random"}  # easy-to-hard was not read
    hard = rows["TRIMS hard-to-easy"]
    assert hard["difference_logprob"]["per_seed"] == pytest.approx(dict(enumerate([0.10, 0.12, 0.08, 0.11, 0.09])))
    assert hard["difference_logprob"]["mean"] == pytest.approx(0.10) and hard["raised"]
    assert hard["mdlm_gain_logprob"] == pytest.approx(0.2) and hard["variant_revealed_logprob"] == pytest.approx(-0.7)
    assert rows["TRIMS random"]["difference_logprob"]["mean"] == pytest.approx(-0.1) and not rows["TRIMS random"]["raised"]
    assert rows["TRIMS random"]["difference_confidence"]["mean"] == pytest.approx(0.0)
