"""Benchmark tasks: loading the offline copies, prompts, answer extraction and grading."""

from __future__ import annotations

import json
import re
from pathlib import Path
from typing import Any

import pytest
from conftest import DATA, FULL_DATA, needs_full_data

from trims_hf.evaluation.tasks import (
    BOXED_INSTRUCTION,
    CodeExecutionDisabled,
    GSM8KTask,
    HumanEvalTask,
    Math500Task,
    MBPPTask,
    SandboxLimits,
    TaskDataError,
    get_task,
    registry,
)
from trims_hf.evaluation.tasks.extraction import code_block, last_boxed

GSM8K_FILE = str(DATA / "gsm8k" / "test.jsonl")
MATH_FILE = str(DATA / "math500" / "test.jsonl")
MBPP_FILE = str(DATA / "mbpp" / "mbpp.jsonl")
FULL_GSM8K, FULL_MATH, FULL_MBPP = (str(FULL_DATA / name) for name in ("gsm8k/test.jsonl", "math500/test.jsonl",
                                                                         "mbpp/mbpp.jsonl"))
LIMITS = SandboxLimits(timeout_s=5.0)


class ChatTokenizer:
    """Stands in for a tokenizer with a chat template; records how it was called."""

    chat_template = "{{ messages }}"

    def apply_chat_template(self, messages: list[dict[str, str]], **kwargs: Any) -> str:
        self.kwargs = kwargs
        return "<chat>" + "|".join(f"{m['role']}:{m['content']}" for m in messages)


class PlainTokenizer:
    chat_template = None


def test_registry_names_and_unknown_task() -> None:
    assert sorted(registry) == ["gsm8k", "humaneval", "math500", "mbpp"]
    assert isinstance(get_task("mbpp", style="3shot"), MBPPTask)
    with pytest.raises(KeyError, match="known tasks: gsm8k, humaneval, math500, mbpp"):
        get_task("gsm9k")


def test_default_loading_asks_the_hub_for_the_right_dataset(monkeypatch: pytest.MonkeyPatch) -> None:
    """The Hub is unreachable here: check the ids, configs and splits that would be requested."""
    calls = []
    rows = {
        "openai/gsm8k": [{"question": "1+1?", "answer": "#### 2"}],
        "HuggingFaceH4/MATH-500": [{"problem": "p", "answer": "1", "unique_id": "test/x/1.json"}],
        "google-research-datasets/mbpp": [
            {"task_id": i, "text": "t", "code": "c", "test_list": ["assert True"]} for i in (2, 3, 4, 11, 510)
        ],
    }

    def fake_load_dataset(path: str, name: str | None = None, split: str | None = None) -> list[dict]:
        calls.append((path, name, split))
        return rows[path]

    monkeypatch.setattr("datasets.load_dataset", fake_load_dataset)
    assert [e.id for e in GSM8KTask().load()] == ["0"]
    assert [e.id for e in Math500Task().load()] == ["test/x/1.json"]
    assert [e.id for e in MBPPTask(style="3shot").load()] == ["11", "510"]
    assert calls == [
        ("openai/gsm8k", "main", "test"),
        ("HuggingFaceH4/MATH-500", None, "test"),
        ("google-research-datasets/mbpp", "full", "prompt"),
        ("google-research-datasets/mbpp", "full", "test"),
    ]


# -- extraction helpers ---------------------------------------------------------------------------
@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("first \\boxed{1}, finally \\boxed{2}", "2"),
        ("\\boxed{\\frac{\\sqrt{3}}{2}}", "\\frac{\\sqrt{3}}{2}"),
        ("\\fbox{x^{2}}", "x^{2}"),
        ("\\boxed{\\{1,2\\}}", "\\{1,2\\}"),
        ("\\boxed{7} and then \\boxed{8", "7"),  # the last box was cut off
        ("so \\boxed 5$.", "5"),
        ("so the answer is $\\boxed 6 - 5i$.", "6 - 5i"),  # no braces: to the closing $, as Minerva reads it
        ("\\boxed 7 is the answer\nthen $x$", "7"),  # no $ on its line: the first word
        ("no box here", None),
    ],
)
def test_last_boxed(text: str, expected: str | None) -> None:
    assert last_boxed(text) == expected


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("Here:\n```\nx = 0\n```\n```python\ndef f():\n    return 1\n```\n", "def f():\n    return 1"),
        ("```py\ny = 2\n```", "y = 2"),
        ("Sure!\n```\nz = 3\n```", "z = 3"),
        ("[BEGIN]\ndef g():\n    pass\n[DONE] trailing", "def g():\n    pass"),
        ("def h():\n    pass\n[DONE]", "def h():\n    pass"),
        ("```python\ndef cut():\n    return", "def cut():\n    return"),
    ],
    ids=["python-first", "py", "bare-fence", "begin-done", "done-only", "unclosed"],
)
def test_code_block(text: str, expected: str) -> None:
    assert code_block(text) == expected


# -- GSM8K ----------------------------------------------------------------------------------------
@needs_full_data
def test_gsm8k_loads_the_test_split_and_its_references() -> None:
    task = GSM8KTask()
    examples = task.load(FULL_GSM8K)
    assert len(examples) == 1319
    assert [e.id for e in task.load(FULL_GSM8K, limit=3)] == ["0", "1", "2"]
    assert task.reference(examples[0]) == "18"
    assert all(task.grade(e, e.fields["answer"])["correct"] for e in examples)


@pytest.mark.parametrize(
    ("completion", "expected"),
    [
        ("First \\boxed{12}. Correction: \\boxed{18}", "18"),
        ("The answer is\n#### 1,234", "1234"),
        ("She makes $18.00.", "18"),
        ("\\boxed{\\$18.00}", "18"),
        ("\\boxed{1{,}234}", "1234"),
        ("The temperature drops to -7 degrees.", "-7"),
        ("\\boxed{-3}", "-3"),
        ("\\boxed{18 \\text{ dollars}}", "18"),
        ("\\boxed{\\frac{1}{2}}", "0.5"),
        ("\\boxed{3/4}", "0.75"),
        ("We compute 10-4=6 so 6 apples.", "6"),
        ("I do not know.", None),
        ("\\boxed{\u22123}", "-3"),  # U+2212, the minus sign
        ("\\boxed{120 \\text{ ft}^2}", "120"),  # a unit's power is not the answer
        ("\\boxed{10^6}", "1000000"),
        ("\\boxed{2^{-3}}", "0.125"),
        ("\\boxed{1\\frac{1}{2}}", "1.5"),
        ("\\boxed{1 000 000}", "1000000"),
        ("\\boxed{3/0}", None),  # states no number, and no fragment of it is read instead
        ("\\boxed{1\\frac{1}{0}}", None),
        ("\\boxed{9^{1000}}", None),
        ("He has 18 apples. \\boxed{\\text{eighteen}}", "18"),  # a box without a number: the text outside it
        ("\\boxed{3 \\times 10^6}", "3000000"),
        ("\\boxed{3\\times10^{6}}", "3000000"),
        ("\\boxed{5 ^ 2}", "25"),  # a number's power, though spaced
        ("so 0^{-1} is undefined, the answer is 8", "8"),  # an undefined power is no number, and no crash
        ("\\boxed{0^{-1}}", None),
        ("\\boxed{1" + "0" * 50 + "^{100}}", None),  # 5,000 digits: no answer, and no crash printing it
        ("\\boxed{" + "1" * 5000 + "}", None),
        ("There are 2^{200} ways, but only 42 are valid. The answer is 42.", "42"),  # one huge power loses only itself
        ("\\boxed{2^3^2}", "512"),  # a tower reads from the top
        ("\\boxed{2^{3^{2}}}", "512"),
        ("\\boxed{3 \\times 2^3^2}", "1536"),
        ("\\boxed{(-2)^3}", "-8"),
        ("\\boxed{-2^2}", "-4"),
        ("\\boxed{10^{+6}}", "1000000"),
        ("\\boxed{2^{3^{999}}}", None),  # a power over one that cannot be written out cannot be either
        ("\\boxed{2^3^{999}}", None),
        ("\\boxed{2^{2^{-1}}}", None),  # no whole exponent
        ("\\boxed{10^{10^{10}}}", None),
        ("\\boxed{2^{1.5}}", None),
        ("\\boxed{2^{3}^{2}}", "512"),  # braced exponents of a tower are no unit's power
        ("\\boxed{.5^2}", "0.25"),
        ("\\boxed{(+2)^2}", "4"),
        ("\\boxed{1.000000000000001^{300}}", None),  # 4,500 digits written out: no number, and no crash
        ("\\boxed{" + "1" * 5000 + "/3}", None),
        ("\\boxed{\\text{18}}", "18"),  # a number set as text is the answer, not the reasoning's last number
        ("Step: 5+3=8. \\boxed{\\text{18 cups}}", "18"),
        ("\\boxed{\\mathrm{18}}", "18"),
        ("#### \\text{18}", "18"),
        ("\\boxed{5 \\text{ per 100 g}}", "5"),  # a number beside the text: the text stays a unit
        ("\\boxed{\\frac{10}{2} dollars}", "5"),  # words beside a fraction leave it whole
        ("The answer is \\frac{3}{4}.", "0.75"),
        ("\\boxed{\\frac12}", "0.5"),
        ("\\boxed{-\\dfrac34}", "-0.75"),
        ("\\boxed{1\\frac{1}{2} cups}", "1.5"),
        ("\\boxed{\\frac{1}{2} + 3}", "3"),  # another digit beside it: the last number, as before
        ("\\boxed{\\frac{1}{0} cups}", None),
        ("so 18 total. \\boxed{\\text{see step 3}}", "18"),  # a text that starts with no number states none
        ("It took 6 hours. \\boxed{\\text{6 hours, i.e. 1/4 day}}", "6"),  # a text's own number is its first
        ("\\boxed{1\\frac12}", "1.5"),
        ("\\boxed{.50/2}", "2"),  # no fraction of a number's fragment (.50 is no whole numerator)
        ("\\boxed{-.5/2}", "2"),
    ],
)
def test_gsm8k_extraction(completion: str, expected: str | None) -> None:
    assert GSM8KTask().extract(completion) == expected


def test_degenerate_completions_are_read_in_one_pass() -> None:
    """A small student stuck in a loop writes thousands of unclosed boxes or one endless number; each is read in
    one pass over the text (a scan per box or per digit took minutes at these sizes), to the same answers."""
    loop = "\\boxed{7} then " + "\\boxed{" * 40_000
    assert last_boxed(loop) == "7" and GSM8KTask().extract(loop) == "7"
    assert GSM8KTask().extract("\\boxed{" + "9" * 4_000 + "}") == "9" * 4_000
    assert GSM8KTask().extract("so " + "1" * 60_000) is None  # past the digits Python reads into an int


def test_gsm8k_grading_is_numeric() -> None:
    task = GSM8KTask()
    assert task.grade_answer("\\boxed{18.0}", "#### 18")["correct"]
    assert task.grade_answer("so $1,234", "1234")["correct"]
    wrong = task.grade_answer("\\boxed{17}", "18")
    assert not wrong["correct"] and wrong["extracted"] == "17" and "18" in wrong["error"]
    assert task.grade_answer("nothing", "18") == {"correct": False, "extracted": None,
                                                  "error": "no number found in the completion"}


def test_gsm8k_prompt_is_zero_shot_cot_with_boxed_instruction() -> None:
    task = GSM8KTask()
    example = task.load(GSM8K_FILE, limit=1)[0]
    messages = task.build_prompt(example)
    assert messages == [{"role": "user", "content": f"{example.fields['question']}\n{BOXED_INSTRUCTION}"}]
    tokenizer = ChatTokenizer()
    text = task.build_prompt(example, tokenizer)
    assert text.startswith("<chat>user:Janet") and tokenizer.kwargs == {"tokenize": False, "add_generation_prompt": True}
    assert task.build_prompt(example, PlainTokenizer()).endswith("\\boxed{}.")
    fmt = task.prompt_format(tokenizer)
    assert fmt["template"] == "chat_template" and fmt["shots"] == 0 and fmt["boxed_instruction"] == BOXED_INSTRUCTION


def test_bad_rows_are_reported_with_file_row_and_field(tmp_path: Path) -> None:
    bad = tmp_path / "bad.jsonl"
    bad.write_text(json.dumps({"question": "q", "answer": "#### 1"}) + "\n" + json.dumps({"question": "q"}) + "\n")
    with pytest.raises(TaskDataError, match=r"bad.jsonl: row 1 has no field 'answer'"):
        GSM8KTask().load(str(bad))
    bad.write_text("{not json}\n")
    with pytest.raises(TaskDataError, match=r"line 1 is not valid JSON"):
        GSM8KTask().load(str(bad))
    with pytest.raises(FileNotFoundError, match="missing.jsonl"):
        GSM8KTask().load(str(tmp_path / "missing.jsonl"))


# -- MATH-500 -------------------------------------------------------------------------------------
@needs_full_data
def test_math500_loads_and_grades_every_reference_solution() -> None:
    task = Math500Task()
    examples = task.load(FULL_MATH)
    assert len(examples) == 500 and len({e.id for e in examples}) == 500
    assert examples[0].id == "test/precalculus/807.json"
    failures = [e.id for e in examples if not task.grade(e, e.fields["solution"])["correct"]]
    assert failures == []


@pytest.mark.parametrize(
    ("completion", "reference", "correct"),
    [
        ("so \\boxed{0.5}", "\\frac{1}{2}", True),
        ("\\boxed{\\frac12}", "\\frac{1}{2}", True),
        ("\\boxed{1} no wait \\boxed{\\frac{1}{3}}", "\\frac{1}{2}", False),
        ("\\boxed{(3,\\frac{\\pi}{2})}", "\\left( 3, \\frac{\\pi}{2} \\right)", True),
        ("\\fbox{x^2+1}", "1+x^2", True),
        ("Final Answer: The final answer is $-4$. I hope it is correct.", "-4", True),
        ("\\boxed{\\text{(C)}}", "\\text{(C)}", True),
        ("\\boxed{3}", "-3", False),
        ("so the answer is $\\boxed 6 - 5i$.", "6 - 5i", True),
        ("\\boxed{3.}", "3", True),  # a full stop inside the box ends the sentence, not the number
        ("\\boxed{\\text{(C)} .}", "\\text{(C)}", True),
        ("\\boxed{4.}", "3", False),
    ],
)
def test_math500_grading_uses_math_verify(completion: str, reference: str, correct: bool) -> None:
    assert Math500Task().grade_answer(completion, reference)["correct"] is correct


def test_math500_prompt_is_minerva_style() -> None:
    task = Math500Task()
    example = task.load(MATH_FILE, limit=1)[0]
    content = task.build_prompt(example)[0]["content"]
    assert content.startswith("Problem:\nConvert the point") and content.endswith(BOXED_INSTRUCTION)
    assert task.build_prompt(example, PlainTokenizer()).endswith("Solution:")
    assert task.prompt_format()["template"] == "messages"
    assert Math500Task().grade_answer("no answer", "1")["error"] == "no \\boxed{} answer in the completion"


# -- HumanEval ------------------------------------------------------------------------------------
def test_humaneval_loads_from_the_package() -> None:
    examples = HumanEvalTask().load()
    assert len(examples) == 164 and examples[0].id == "HumanEval/0"
    with pytest.raises(ValueError, match="only a 'test' split"):
        HumanEvalTask().load(split="train")


def test_humaneval_prompt_asks_for_a_python_block() -> None:
    task = HumanEvalTask()
    example = task.load(limit=1)[0]
    content = task.build_prompt(example)[0]["content"]
    assert "```python\nfrom typing import List" in content and "def has_close_elements(" in content
    assert "code block" in content


def test_humaneval_canonical_solutions_pass_as_body_and_as_full_function() -> None:
    task = HumanEvalTask(limits=LIMITS)
    for example in task.load(limit=5):
        body = example.fields["canonical_solution"]
        full = f"Here you go:\n```python\n{example.fields['prompt']}{body}```\nDone."
        assert task.grade(example, body, execute_code=True)["correct"], example.id
        assert task.grade(example, full, execute_code=True)["correct"], example.id


def test_humaneval_full_def_without_the_stub_imports_still_runs() -> None:
    task = HumanEvalTask(limits=LIMITS)
    example = task.load(limit=1)[0]
    # The model repeats only the def: List comes from the stub's imports.
    completion = (
        "```python\ndef has_close_elements(numbers: List[float], threshold: float) -> bool:\n"
        "    return any(abs(a - b) < threshold for i, a in enumerate(numbers) for b in numbers[i + 1:])\n```"
    )
    assert task.grade(example, completion, execute_code=True)["correct"]


def test_humaneval_wrong_solution_fails_and_execution_needs_opt_in() -> None:
    task = HumanEvalTask(limits=LIMITS)
    example = task.load(limit=1)[0]
    grade = task.grade(example, "```python\ndef has_close_elements(numbers, threshold):\n    return True\n```", execute_code=True)
    assert not grade["correct"] and "AssertionError" in grade["error"]
    with pytest.raises(CodeExecutionDisabled, match="execute_code=True"):
        task.grade(example, "return True")


# -- MBPP -----------------------------------------------------------------------------------------
@needs_full_data
def test_mbpp_test_split_is_task_ids_11_to_510() -> None:
    examples = MBPPTask().load(FULL_MBPP)
    assert [int(e.id) for e in examples] == list(range(11, 511))
    assert len(MBPPTask().load(FULL_MBPP, split="validation")) == 90


def test_mbpp_splits_by_task_id_and_names_the_splits() -> None:
    """On the excerpt (task ids 1-30, 367, 511-512, 601-602): each split takes its own ids."""
    assert [int(e.id) for e in MBPPTask().load(MBPP_FILE)] == [*range(11, 31), 367]
    assert [int(e.id) for e in MBPPTask().load(MBPP_FILE, split="validation")] == [511, 512]
    with pytest.raises(ValueError, match="mbpp split must be one of"):
        MBPPTask().load(MBPP_FILE, split="dev")


def test_mbpp_instruct_prompt_holds_the_task_and_its_asserts() -> None:
    task = MBPPTask()
    example = task.load(MBPP_FILE, limit=1)[0]
    content = task.build_prompt(example)[0]["content"]
    assert example.fields["text"] in content
    assert all(test in content for test in example.fields["test_list"])
    assert "```python" in content and task.stop_strings == ()
    assert task.prompt_format()["shots"] == 0


def test_mbpp_three_shot_prompt_uses_tasks_2_3_4_and_begin_done() -> None:
    task = MBPPTask(style="3shot")
    example = task.load(MBPP_FILE, limit=1)[0]
    assert [s.id for s in task.shots] == ["2", "3", "4"]
    messages = task.build_prompt(example)
    assert [m["role"] for m in messages] == ["user", "assistant"] * 3 + ["user"]
    assert all(m["content"].endswith("\n[BEGIN]\n") for m in messages[::2])  # lm-eval's multi-turn shots
    assert messages[1]["content"] == task.shots[0].fields["code"] + "\n[DONE]"
    plain = task.build_prompt(example, PlainTokenizer())
    assert plain.startswith("You are an expert Python programmer, and here is your task:")
    assert plain.endswith(example.fields["test_list"][-1] + "\n[BEGIN]\n") and plain.count("[DONE]") == 3
    assert task.stop_strings == ("[DONE]",)
    assert task.prompt_format()["shot_task_ids"] == [2, 3, 4]
    with pytest.raises(RuntimeError, match="call load"):
        MBPPTask(style="3shot").build_prompt(example)


def test_mbpp_three_shot_plain_prompt_is_lm_evals_mbpp_prompt() -> None:
    """The oracle is lm-evaluation-harness's own ``mbpp`` task as installed: its YAML's templates (rendered with
    jinja2, as the harness does) and its list of shots (read from its utils.py without running it)."""
    import ast
    from importlib.resources import files

    import jinja2
    import yaml

    folder = files("lm_eval") / "tasks" / "mbpp"

    class TaskLoader(yaml.SafeLoader):  # the YAML's `!function module.name` tags, kept as text
        pass

    TaskLoader.add_constructor("!function", lambda loader, node: loader.construct_scalar(node))
    spec = yaml.load((folder / "mbpp.yaml").read_text(), Loader=TaskLoader)  # noqa: S506 (SafeLoader subclass)
    utils = ast.parse((folder / "utils.py").read_text())
    shots = next(ast.literal_eval(node.body[-1].value) for node in utils.body
                 if isinstance(node, ast.FunctionDef) and node.name == "list_fewshot_samples")
    text, target = (jinja2.Template(spec[key], keep_trailing_newline=True) for key in ("doc_to_text", "doc_to_target"))
    task = MBPPTask(style="3shot")
    examples = task.load(MBPP_FILE)
    assert [int(s.id) for s in task.shots] == [shot["task_id"] for shot in shots]
    delimiter = spec.get("fewshot_delimiter", "\n\n")  # the harness's default
    context = delimiter.join(text.render(**shot) + spec["target_delimiter"] + target.render(**shot) for shot in shots)
    for example in examples:
        expected = context + delimiter + text.render(**example.fields)
        assert task.build_prompt(example, PlainTokenizer()) == expected


def test_mbpp_reference_code_passes_and_wrong_code_fails() -> None:
    task = MBPPTask(limits=LIMITS)
    examples = {e.id: e for e in task.load(MBPP_FILE)}
    for task_id in ("11", "12", "367"):  # 367 needs its test_setup_code after the solution
        example = examples[task_id]
        assert task.grade(example, f"```python\n{example.fields['code']}\n```", execute_code=True)["correct"], task_id
    assert task.grade(examples["13"], f"{examples['13'].fields['code']}\n[DONE]", execute_code=True)["correct"]
    wrong = task.grade(examples["11"], "```python\ndef remove_Occ(s, ch):\n    return s\n```", execute_code=True)
    assert not wrong["correct"] and wrong["error"].startswith("failed:")


def test_every_task_names_its_gold_answer() -> None:
    """The reference stored with each graded sample: the number, the LaTeX answer, or the reference program."""
    gsm8k = GSM8KTask().load(str(DATA / "gsm8k" / "test.jsonl"), limit=1)[0]
    assert GSM8KTask().reference(gsm8k) == "18"
    math = Math500Task().load(str(DATA / "math500" / "test.jsonl"), limit=1)[0]
    assert Math500Task().reference(math) == math.fields["answer"]
    problem = HumanEvalTask().load(limit=1)[0]
    reference = HumanEvalTask().reference(problem)
    assert reference.startswith(problem.fields["prompt"]) and reference.endswith(problem.fields["canonical_solution"])
    mbpp = MBPPTask().load(str(DATA / "mbpp" / "mbpp.jsonl"), limit=1)[0]
    assert MBPPTask().reference(mbpp) == mbpp.fields["code"] and "def " in mbpp.fields["code"]


@pytest.mark.parametrize("value, kind, said", [(5, str, "is a number, expected a string"),
                                               (None, str, "is null, expected a string"),
                                               ("7", (int, float), "is a string, expected a number"),
                                               ([1], dict, "is a list, expected an object")])
def test_a_field_of_the_wrong_type_is_named_in_the_data_files_terms(value, kind, said):
    from trims_hf.evaluation.tasks.base import TaskDataError, require

    with pytest.raises(TaskDataError, match=rf"^rows\.jsonl: row 3 field 'question' {re.escape(said)}$"):
        require({"question": value}, "question", kind, 3, "rows.jsonl")
