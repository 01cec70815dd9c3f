"""evaluate_task on a tiny random student, exact counts on a scripted student, sweeps, table and frontier plot."""

from __future__ import annotations

import json
import math
from types import SimpleNamespace

import pytest
import torch
from conftest import DATA, read_jsonl, tiny_student
from matplotlib.text import Text
from torch import nn
from transformers import PreTrainedConfig

import trims_hf.evaluation.evaluate as evaluation
from trims_hf import prepare_student
from trims_hf.evaluation.evaluate import EvalResult, EvaluationInterrupted, evaluate_task, sweep, sweep_configs
from trims_hf.evaluation.published import published_results
from trims_hf.evaluation.results import format_table, plot_frontier, save_results
from trims_hf.evaluation.tasks import CodeExecutionDisabled, GSM8KTask
from trims_hf.generation import DecodingConfig, TrajectoryRecorder, cut_at_stop_strings, generate_text
from trims_hf.reports import library_versions

GSM8K_TEST = DATA / "gsm8k" / "test.jsonl"
STOP = "\n\nQuestion:"
GEN, BLOCK, CONFIDENCE = 256, 32, 0.95


class StopStringGSM8K(GSM8KTask):
    """GSM8K whose answers end at a stop string, as in few-shot prompts."""

    stop_strings = (STOP,)


class AnswerStudent(nn.Module):
    """A fake student that, for each question it finds in its input, commits scripted response ids then EOS.

    Every response position gets its scripted token with probability ``CONFIDENCE``, so under a threshold
    below it a block is decoded in one forward, and above it in one forward per position.
    """

    def __init__(self, tokenizer, answers: dict[str, list[int]]) -> None:
        super().__init__()
        self.config = PreTrainedConfig(vocab_size=len(tokenizer), eos_token_id=tokenizer.eos_token_id)
        self.tokenizer, self.answers = tokenizer, answers
        self.anchor = nn.Parameter(torch.zeros(1))  # gives the module a device
        prepare_student(self, "llada", tokenizer.mask_token_id)

    def forward(self, input_ids, attention_mask=None, logits_to_keep=slice(None), **kwargs):
        vocab = self.config.vocab_size
        logits = torch.full((*input_ids.shape, vocab), float(torch.log(torch.tensor((1 - CONFIDENCE) / (vocab - 1)))))
        for row, ids in enumerate(input_ids):
            prompt = self.tokenizer.decode(ids[:-GEN], skip_special_tokens=True)
            answer = next(a for question, a in self.answers.items() if question in prompt)
            script = answer + [self.tokenizer.eos_token_id] * (GEN - len(answer))
            positions = torch.arange(len(ids) - GEN, len(ids))
            logits[row, positions, torch.tensor(script)] = float(torch.log(torch.tensor(CONFIDENCE)))
        return SimpleNamespace(logits=logits[:, logits_to_keep])


@pytest.fixture(scope="module")
def gsm8k_test() -> list[dict]:
    return read_jsonl(GSM8K_TEST, 3)


@pytest.fixture(scope="module")
def scripted(tokenizer, gsm8k_test):
    """Answers: gold (correct), gold + stop string + a wrong tail (correct once cut), wrong number (incorrect)."""
    encode = lambda text: tokenizer(text, add_special_tokens=False)["input_ids"]  # noqa: E731
    gold = [row["answer"] for row in gsm8k_test]
    wrong = gold[2].rsplit("####", 1)[0] + "#### 12345"
    kept = [encode(gold[0]), encode(gold[1]), encode(wrong)]
    tails = [[], encode(STOP + " Tom has 3 apples. #### 99"), []]
    answers = {row["question"]: k + t for row, k, t in zip(gsm8k_test, kept, tails)}
    return SimpleNamespace(model=AnswerStudent(tokenizer, answers), kept=kept, full=[k + t for k, t in zip(kept, tails)],
                           texts=[gold[0], gold[1], wrong])


def run(scripted, tokenizer, **kwargs) -> EvalResult:
    options = dict(config=DecodingConfig(gen_length=GEN, block_length=BLOCK), limit=3, data_file=str(GSM8K_TEST),
                   progress=False) | kwargs
    return evaluate_task(scripted.model, tokenizer, StopStringGSM8K(), **options)


def test_scripted_student_exact_accuracy_and_tokens_per_step(scripted, tokenizer, gsm8k_test):
    result = run(scripted, tokenizer)
    assert result.accuracy == pytest.approx(2 / 3) and result.num_samples == 3
    assert [s.correct for s in result.samples] == [True, True, False]
    # every record can be checked by eye: the prompt as the model saw it, the gold answer, what was extracted
    assert [s.reference for s in result.samples] == [row["answer"].rsplit("#### ", 1)[1] for row in gsm8k_test]
    assert [s.extracted for s in result.samples] == [s.reference for s in result.samples[:2]] + ["12345"]
    task = StopStringGSM8K()
    assert [s.prompt for s in result.samples] == [task.build_prompt(e, tokenizer)
                                                  for e in task.load(str(GSM8K_TEST), limit=3)]
    assert [s.completion for s in result.samples] == scripted.texts  # the tail after the stop string is cut
    # counted tokens: the scripted answer before EOS and before the stop string
    assert [s.generated_tokens for s in result.samples] == [len(ids) for ids in scripted.kept]
    # every answer is cut at a stop string before its EOS: the peers' non-EOS count is the same here
    assert [s.non_eos_tokens for s in result.samples] == [len(ids) for ids in scripted.kept]
    assert result.tokens_per_forward_non_eos == result.tokens_per_step and result.non_eos_tokens == result.generated_tokens
    # one forward per block up to the block holding the EOS (early stop skips the rest)
    nfe = [len(ids) // BLOCK + 1 for ids in scripted.full]
    assert [s.nfe for s in result.samples] == nfe and result.nfe == sum(nfe)
    expected = sum(len(ids) for ids in scripted.kept) / sum(nfe)
    assert result.tokens_per_step == pytest.approx(expected)
    assert result.tokens_per_step != pytest.approx(sum(len(k) / n for k, n in zip(scripted.kept, nfe)) / 3)
    assert result.early_stop is True and result.tokens_per_second > 0


def test_batching_and_early_stop_off(scripted, tokenizer):
    alone, batched = run(scripted, tokenizer), run(scripted, tokenizer, batch_size=2)
    assert [(s.generated_tokens, s.nfe, s.completion) for s in batched.samples] == \
        [(s.generated_tokens, s.nfe, s.completion) for s in alone.samples]
    no_stop = run(scripted, tokenizer, config=DecodingConfig(gen_length=GEN, block_length=BLOCK, early_stop=False))
    assert no_stop.early_stop is False and no_stop.nfe == 3 * (GEN // BLOCK)
    assert no_stop.generated_tokens == alone.generated_tokens  # the EOS tail is never counted


def test_sweep_over_thresholds(scripted, tokenizer):
    loose, strict = sweep(scripted.model, tokenizer, StopStringGSM8K(), [0.5, 0.99],
                          DecodingConfig(gen_length=GEN, block_length=BLOCK), limit=3, data_file=str(GSM8K_TEST),
                          progress=False)
    assert (loose.setting, strict.setting) == ("threshold 0.5", "threshold 0.99")
    assert loose.tokens_per_step == pytest.approx(run(scripted, tokenizer).tokens_per_step)
    # above the model's confidence: one position per forward, up to the end of the block holding the EOS
    assert strict.nfe == sum((len(ids) // BLOCK + 1) * BLOCK for ids in scripted.full)
    assert strict.accuracy == loose.accuracy


def test_tiny_random_student_on_gsm8k(tokenizer):
    model = tiny_student(tokenizer).eval()
    trajectories = TrajectoryRecorder()
    result = evaluate_task(model, tokenizer, "gsm8k", DecodingConfig(gen_length=32, block_length=16), limit=3,
                           data_file=str(GSM8K_TEST), progress=False, hooks=[trajectories], model_name="tiny")
    assert result.num_samples == 3 and [s.prompt_id for s in result.samples] == ["0", "1", "2"]
    task, examples = GSM8KTask(), GSM8KTask().load(str(GSM8K_TEST), limit=3)
    regraded = [task.grade(example, sample.completion)["correct"] for example, sample in zip(examples, result.samples)]
    assert [sample.correct for sample in result.samples] == regraded
    assert result.accuracy == sum(regraded) / 3
    assert result.nfe == sum(s.nfe for s in result.samples) and all(1 <= s.nfe <= 32 for s in result.samples)
    assert result.generated_tokens == sum(s.generated_tokens for s in result.samples)
    assert result.tokens_per_step == pytest.approx(result.generated_tokens / result.nfe)
    assert result.prompt_format["template"] == "chat_template" and result.prompt_format["shots"] == 0
    assert result.decoding["gen_length"] == 32 and result.decoding["strategy"] == "threshold"
    assert [t.sample_id for t in trajectories.trajectories] == ["0", "1", "2"]
    restored = json.loads(json.dumps(result.to_dict()))
    assert restored["tokens_per_step"] == result.tokens_per_step and len(restored["samples"]) == 3
    assert set(restored["samples"][0]) >= {"prompt", "reference", "completion", "extracted", "correct", "generated_tokens",
                                           "nfe"}


def test_code_task_needs_execution_opt_in(tokenizer):
    with pytest.raises(CodeExecutionDisabled, match="execute_code=True"):
        evaluate_task(tiny_student(tokenizer), tokenizer, "humaneval", limit=1, progress=False)


def test_cut_at_stop_strings():
    assert cut_at_stop_strings("a [DONE] b STOP c", ("STOP", "[DONE]")) == "a "
    assert cut_at_stop_strings("no stop", ("STOP",)) == "no stop"


def result(model: str, task: str, threshold: float, accuracy: float, tokens_per_step: float, n: int = 1) -> EvalResult:
    return EvalResult(model=model, task=task, accuracy=accuracy, tokens_per_step=tokens_per_step,
                      tokens_per_forward_non_eos=tokens_per_step, tokens_per_second=10.0, nfe=10, generated_tokens=10,
                      non_eos_tokens=10, num_samples=n, decode_time_s=1.0, wall_time_s=1.0, early_stop=True,
                      prompt_format={}, decoding={"strategy": "threshold", "threshold": threshold})


def test_table_labels_accuracy_in_percent_with_n():
    results = [result("llada", "gsm8k", 0.9, 0.726, 2.771, 100), result("llada", "math500", 0.9, 0.322, 1.5, 50),
               result("llada", "gsm8k", 0.5, 0.6, 5.0, 100), result("trims", "gsm8k", 0.9, 0.749, 6.26, 100),
               result("trims", "math500", 0.9, 0.3, 1.6, 20)]
    table = format_table(results).splitlines()
    assert table[0] == "| Model | Setting | gsm8k Acc (%, n=100) | gsm8k Tokens/step | math500 Acc (%) | math500 Tokens/step |"
    assert table[2] == "| llada | threshold 0.9 | 72.6 | 2.77 | 32.2 (n=50) | 1.50 |"  # n differs per row: in the cell
    assert table[3] == "| llada | threshold 0.5 | 60.0 | 5.00 | - | - |"
    assert table[4] == "| trims | threshold 0.9 | 74.9 | 6.26 | 30.0 (n=20) | 1.60 |"
    assert "TPS" not in "\n".join(table) and "early stop: on" in table[6] and "percent of the n problems" in table[6]
    # AUP per model and task, y_max the task's best: llada's tau 0.5 point (60.0) is more than 5 below 72.6 and
    # left out, so its gsm8k AUP is 2.771 x 72.6 = 201.2; single points score tokens/step x accuracy.
    assert table[8] == "| Model | gsm8k AUP (y_max 74.9) | math500 AUP (y_max 32.2) |"
    assert table[10:12] == ["| llada | 201.2 | 48.3 |", "| trims | 468.9 | 48.0 |"]
    assert table[-1].startswith("AUP: d3LLM's accuracy under parallelism")


def test_compare_rows_are_labelled_published_in_the_table_plot_and_results_file(tmp_path):
    """--compare's rows of the run's task: table rows with setting "published", their AUP (one point: tokens/step
    x accuracy) weighted by the same y_max as the run's, a square per method on the plot, and the file's AUP rows."""
    run = [result("me", "gsm8k", 0.9, 0.70, 3.0, 50), result("me", "gsm8k", 0.7, 0.68, 4.0, 50)]
    published = published_results("paper:llada")
    table = format_table(run, published)
    assert "| d3LLM (published, TRIMS paper, Table 1) | published | 73.1 | 9.11 |" in table
    assert "math500" not in table and table.count("(published, TRIMS paper, Table 1) | published |") == 6
    # y_max 74.9 (TRIMS's published GSM8K): AUP = 3 x 70 + 1/2 x 1 x (68 e^{-3(1-68/74.9)} + 70 e^{-3(1-70/74.9)}).
    mine = 3 * 70 + 0.5 * (68 * math.exp(-3 * (1 - 68 / 74.9)) + 70 * math.exp(-3 * (1 - 70 / 74.9)))
    assert f"| me | {mine:.1f} |" in table and "| d3LLM (published, TRIMS paper, Table 1) | 665.9 |" in table
    figure = plot_frontier(run, tmp_path / "f.png", published)
    (axis,) = figure.axes
    squares = {line.get_label(): line.get_xydata().tolist() for line in axis.lines if line.get_marker() == "s"}
    assert squares["d3LLM (published, TRIMS paper, Table 1)"] == [[9.11, pytest.approx(73.1)]] and len(squares) == 6
    assert "d3LLM" in {text.get_text() for text in axis.texts}
    save_results(run, tmp_path / "r.json", published)
    rows = {row["model"]: row for row in json.loads((tmp_path / "r.json").read_text())["aup"]["rows"]}
    assert rows["me"]["aup"] == pytest.approx(mine) and rows["me"]["y_max"] == pytest.approx(74.9)
    assert rows["me"]["points"] == 2 and len(rows) == 7


def test_frontier_axes_titles_and_labels(tmp_path):
    """Accuracy stays in [0, 100] (all-zero panels included), n is in each title, and no label collides with
    another label or marker or leaves its panel, even for a crowded cluster of points."""
    crowded = [result(model, "humaneval", tau, 0.0, 1.2 + 0.02 * i + 0.3 * j, 20)
               for i, model in enumerate(("a", "b", "c", "d")) for j, tau in enumerate((0.95, 0.9, 0.7, 0.5))]
    spread = [result("a", "gsm8k", 0.9, 0.726, 2.771, 100), result("a", "gsm8k", 0.5, 0.6, 5.0, 100),
              result("b", "gsm8k", 0.9, 0.749, 6.26, 90)]
    path = tmp_path / "frontier.png"
    figure = plot_frontier(spread + crowded, path)
    assert path.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    gsm8k, humaneval = figure.axes[:2]
    assert (gsm8k.get_title(), humaneval.get_title()) == ("gsm8k (n=90-100)", "humaneval (n=20)")
    for axis in (gsm8k, humaneval):
        low, high = axis.get_ylim()
        assert 0 <= low and high <= 100 and axis.get_ylabel() == "accuracy (%)"
    renderer = figure.canvas.get_renderer()
    for label in humaneval.texts:
        label.update_positions(renderer)  # savefig drew them at its own dpi
    boxes = [Text.get_window_extent(label, renderer) for label in humaneval.texts]
    assert sorted(label.get_text() for label in humaneval.texts) == sorted(["0.95", "0.9", "0.7", "0.5"] * 4)
    frame = humaneval.get_window_extent(renderer)
    assert all(frame.x0 <= b.x0 and b.x1 <= frame.x1 and frame.y0 <= b.y0 and b.y1 <= frame.y1 for b in boxes)
    assert not any(a.overlaps(b) for i, a in enumerate(boxes) for b in boxes[i + 1:])


def test_results_file_has_one_schema_with_units_and_versions(tmp_path):
    single, pair = tmp_path / "one.json", tmp_path / "two.json"
    save_results([result("a", "gsm8k", 0.9, 0.5, 2.0)], single)
    save_results([result("a", "gsm8k", 0.9, 0.5, 2.0), result("a", "gsm8k", 0.5, 0.25, 3.0)], pair)
    one, two = json.loads(single.read_text()), json.loads(pair.read_text())
    assert set(one) == set(two) == {"units", "results", "aup"} and len(one["results"]) == 1 and len(two["results"]) == 2
    assert two["aup"]["rows"] == [{"model": "a", "task": "gsm8k", "aup": 2.0 * 50.0, "y_max": 50.0, "points": 2}]
    assert "fraction" in one["units"]["accuracy"] and two["results"][1]["accuracy"] == 0.25
    assert one["results"][0]["versions"] == library_versions() and set(library_versions()) == {
        "trims_hf", "torch", "transformers", "peft", "datasets"}
    assert not list(tmp_path.glob("*.partial"))


@pytest.mark.parametrize("value", [float("nan"), float("inf"), -float("inf")])
def test_a_results_file_never_holds_nan_or_infinity(tmp_path, value):
    """Bare NaN / Infinity are not JSON: the write refuses before anything is written (the records stay for a rerun)."""
    path = tmp_path / "r.json"
    with pytest.raises(ValueError, match="JSON"):
        save_results([result("a", "gsm8k", 0.9, value, 2.0)], path)
    assert list(tmp_path.iterdir()) == []


NAN, INF = float("nan"), float("inf")


@pytest.mark.parametrize("setting", [
    {"threshold": 1.5}, {"threshold": -0.1}, {"threshold": NAN}, {"entropy_threshold": -0.5},
    {"entropy_threshold": NAN}, {"factor": INF}, {"factor": -1.0}, {"temperature": NAN}, {"temperature": -1.0},
    {"steps": 0, "strategy": "fixed_steps"}, {"eos_token_id": -1}, {"stop_token_ids": [2, -1]},
    {"steps": 512, "strategy": "fixed_steps", "gen_length": 256}, {"steps": 512, "strategy": "threshold_quota"},
    {"seed": 2**64}, {"seed": -1},
])
def test_decoding_settings_out_of_range_are_refused_where_declared(setting):
    """Every decoding setting is checked by DecodingConfig itself (Python, the CLI, recipes, sweeps), naming it."""
    name = next(iter(setting))
    with pytest.raises(ValueError, match=rf"^{name}="):
        DecodingConfig(**setting)
    knob = next((key for key, value in evaluation.SWEEP_PARAMETER.items() if value == name), None)
    if knob is not None and name != "steps":
        with pytest.raises(ValueError, match=rf"^{name}="):
            sweep_configs(DecodingConfig(strategy=knob), [0.5, setting[name]])


@pytest.mark.parametrize("strategy,setting", [
    ("threshold", "steps"), ("threshold", "entropy_threshold"), ("entropy", "threshold"), ("factor", "steps"),
    ("fixed_steps", "factor"), ("threshold_quota", "entropy_threshold"),
])
def test_a_strategy_setting_the_strategy_does_not_read_is_refused(strategy, setting):
    """A knob of another strategy does nothing: refused when given (steps, None by default, always; the others when a
    caller says they were given, as `trims eval` does for its flags), never for a default."""
    config = DecodingConfig(strategy=strategy)
    config.check_given(["gen_length", "temperature", *DecodingConfig.STRATEGY_SETTINGS[strategy]])  # what it reads
    with pytest.raises(ValueError, match=rf"^{setting}=\S+ does nothing with strategy='{strategy}': only "):
        config.check_given([setting])
    if setting == "steps":
        with pytest.raises(ValueError, match=rf"^steps=4 does nothing with strategy='{strategy}'"):
            DecodingConfig(strategy=strategy, steps=4)


def test_stop_ids_outside_the_vocabulary_are_refused_before_decoding(scripted, tokenizer):
    vocab = scripted.model.config.vocab_size
    DecodingConfig(stop_token_ids=[vocab - 1], eos_token_id=vocab - 1).check_token_ids(vocab)
    with pytest.raises(ValueError, match=rf"^stop_token_ids: {vocab} is outside the model's vocabulary \({vocab} "
                                         r"tokens\), so it is never generated"):
        generate_text(scripted.model, tokenizer, ["hi"], DecodingConfig(stop_token_ids=[1, vocab], gen_length=4,
                                                                   block_length=4))
    with pytest.raises(ValueError, match=rf"^eos_token_id={vocab + 5}: outside the model's vocabulary"):
        DecodingConfig(eos_token_id=vocab + 5).check_token_ids(vocab)


def test_a_sweep_value_given_twice_is_refused():
    with pytest.raises(ValueError, match="^0.5 is given twice"):
        sweep_configs(DecodingConfig(), [0.5, 0.9, 0.5])
    with pytest.raises(ValueError, match="^32 is given twice"):
        sweep_configs(DecodingConfig(strategy="fixed_steps"), [32, 32.0])


def count_decoded(monkeypatch) -> list[int]:
    decode, batches = evaluation.generate_text, []

    def counting(model, tokenizer, prompts, *args, **kwargs):
        batches.append(len(prompts))
        return decode(model, tokenizer, prompts, *args, **kwargs)

    monkeypatch.setattr(evaluation, "generate_text", counting)
    return batches


def test_records_are_reused_only_by_the_same_run(scripted, tokenizer, tmp_path, monkeypatch):
    records = tmp_path / "records.jsonl"
    whole = run(scripted, tokenizer, records_file=records)
    decoded = count_decoded(monkeypatch)
    again = run(scripted, tokenizer, records_file=records)
    assert decoded == [] and again.samples == whole.samples  # the same run: nothing decoded again
    other = run(scripted, tokenizer, records_file=records, config=DecodingConfig(gen_length=GEN, block_length=BLOCK,
                                                                                 threshold=0.5))
    assert decoded == [1, 1, 1] and other.decoding["threshold"] == 0.5  # a changed setting decodes everything
    assert len({json.loads(line)["run"] for line in records.read_text().splitlines()}) == 2
    run(scripted, tokenizer, records_file=records, batch_size=3)
    assert decoded == [1, 1, 1, 3]  # so does a changed batch size (left padding moves the numerics)


def test_torn_or_stale_records_are_decoded_again(scripted, tokenizer, tmp_path, monkeypatch):
    records = tmp_path / "records.jsonl"
    whole = run(scripted, tokenizer, records_file=records)
    lines = records.read_text().splitlines()
    stale = json.loads(lines[1]) | {"prompt": "another question"}  # the data file changed under the same id
    records.write_text(lines[0] + "\n" + json.dumps(stale) + "\n" + lines[2][: len(lines[2]) // 2])  # torn last line
    decoded = count_decoded(monkeypatch)
    again = run(scripted, tokenizer, records_file=records)
    assert decoded == [1, 1] and again.samples[1:] != [] and [s.completion for s in again.samples] == \
        [s.completion for s in whole.samples]
    assert json.loads(records.read_text().splitlines()[-1])["prompt_id"] == "2"  # appended after the torn line


def test_a_resumed_run_grades_saved_completions_with_todays_grader(scripted, tokenizer, tmp_path, monkeypatch):
    """Decoding is what resuming saves; a verdict saved by an earlier grader is not reused."""
    records = tmp_path / "records.jsonl"
    whole = run(scripted, tokenizer, records_file=records)
    lines = [json.loads(line) for line in records.read_text().splitlines()]
    lines[0] |= {"correct": False, "extracted": "7", "error": "expected 18"}  # an older grader's verdicts
    lines[2] |= {"correct": True, "extracted": lines[2]["reference"], "error": None}
    records.write_text("".join(json.dumps(line) + "\n" for line in lines))
    decoded = count_decoded(monkeypatch)
    again = run(scripted, tokenizer, records_file=records)
    assert decoded == [] and again.samples == whole.samples and again.accuracy == whole.accuracy


def test_interrupt_raises_with_the_saved_count(scripted, tokenizer, tmp_path, monkeypatch):
    decode = evaluation.generate_text

    def stop_at_the_third(model, tokenizer, prompts, config, hooks, ids, fmt, stop_strings):
        if ids == ["2"]:
            raise KeyboardInterrupt
        return decode(model, tokenizer, prompts, config, hooks, ids, fmt, stop_strings)

    monkeypatch.setattr(evaluation, "generate_text", stop_at_the_third)
    with pytest.raises(EvaluationInterrupted) as stopped:
        run(scripted, tokenizer, records_file=tmp_path / "records.jsonl")
    assert (stopped.value.done, stopped.value.total, stopped.value.setting) == (2, 3, "threshold 0.9")
    with pytest.raises(KeyboardInterrupt) as plain:  # without a records file nothing is saved: a plain Ctrl-C
        run(scripted, tokenizer)
    assert not isinstance(plain.value, EvaluationInterrupted)


def test_a_run_is_keyed_by_its_compiled_blocks_whoever_compiled_them(tokenizer):
    """Records of eager decoding are not reused for a model whose blocks run compiled (compiled by an earlier
    `compile_blocks` decode or by training), nor the reverse; the setting off, the key is what it always was."""
    from trims_hf.evaluation.evaluate import run_fingerprint
    from trims_hf.settings import PromptFormat, settings_record
    from trims_hf.students import compile_blocks

    model, task = tiny_student(tokenizer), GSM8KTask()

    def key(config: DecodingConfig) -> str:
        return run_fingerprint(model, "m", task, tokenizer, config, PromptFormat(), 4)

    assert "compile_blocks" not in settings_record(DecodingConfig())
    eager, asked = key(DecodingConfig()), key(DecodingConfig(compile_blocks=True))
    assert eager != asked
    compile_blocks(model)  # lazy: nothing compiles until a block runs
    assert key(DecodingConfig()) not in (eager, asked)
