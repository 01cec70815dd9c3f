"""lm-evaluation-harness integration: the MC log-likelihood against exact enumeration, GSM8K CoT through
the harness with a scripted student (stop strings, token counts, the harness's answer extraction against
ours), the ``python -m trims_hf.evaluation.harness`` command on a tiny saved student, and early errors."""

from __future__ import annotations

import argparse
import itertools
import json
import math
import os
import shutil
import subprocess
import sys
from pathlib import Path
from types import SimpleNamespace

import pytest
import torch
from conftest import DATA, FULL_DATA, needs_full_data, read_jsonl, tiny_student
from helpers_harness import gsm8k_task_manager
from torch import nn
from transformers import LlamaConfig, LlamaForCausalLM, PreTrainedConfig

from trims_hf import prepare_student, student_logits
from trims_hf.evaluation.harness.likelihood import masked_diffusion_loglikelihood, masked_elbo_terms
from trims_hf.evaluation.tasks import GSM8KTask
from trims_hf.prompts import prompt_token_ids

REPO = Path(__file__).resolve().parents[1]
GEN, BLOCK, CONFIDENCE = 128, 32, 0.95


# --- Monte Carlo log-likelihood ---------------------------------------------------------------------------

def exact_elbo_terms(model: nn.Module, context: list[int], continuation: list[int]) -> dict[tuple, tuple]:
    """Every mask subset M of the continuation -> (its probability under the estimator,
    P(M) = (1/L) / C(L, |M|), and its term (L/|M|) * sum_{i in M} log p(x_i)), one forward each."""
    length, mask_id = len(continuation), model.config.mask_token_id
    terms = {}
    for size in range(1, length + 1):
        for subset in itertools.combinations(range(length), size):
            ids = list(context) + [mask_id if i in subset else t for i, t in enumerate(continuation)]
            log_probs = torch.log_softmax(student_logits(model, torch.tensor([ids]))[0].double(), dim=-1)
            term = length / size * sum(float(log_probs[len(context) + i, continuation[i]]) for i in subset)
            terms[subset] = (1 / length / math.comb(length, size), term)
    return terms


@pytest.mark.parametrize("kind", ["llada", "dream"])
def test_mc_loglikelihood_converges_to_exact_expectation(tokenizer, kind):
    model = tiny_student(tokenizer, kind, seed=3).eval()
    context, continuation = [5, 17, 42, 99, 7], [120, 33, 250]
    with torch.no_grad():
        exact = exact_elbo_terms(model, context, continuation)
        patterns = torch.tensor([[i in subset for i in range(3)] for subset in exact])
        batched = masked_elbo_terms(model, context, continuation, patterns)
    # The batched terms are the enumerated ones (all 7 subsets, one batch).
    assert batched.tolist() == pytest.approx([term for _, term in exact.values()], rel=1e-5)
    assert sum(p for p, _ in exact.values()) == pytest.approx(1.0)
    mean = sum(p * term for p, term in exact.values())
    variance = sum(p * term**2 for p, term in exact.values()) - mean**2
    samples = 6000
    estimate = masked_diffusion_loglikelihood(model, context, continuation, samples=samples, batch_size=1000,
                                              generator=torch.Generator().manual_seed(0))
    standard_error = math.sqrt(variance / samples)
    assert variance > 0 and abs(estimate - mean) < 4 * standard_error, (estimate, mean, standard_error)
    few = masked_diffusion_loglikelihood(model, context, continuation, samples=2,
                                         generator=torch.Generator().manual_seed(1))
    assert few != pytest.approx(estimate, abs=1e-9)  # a real estimate: it moves with the draws


def test_mc_loglikelihood_rejects_empty_inputs(tokenizer):
    model = tiny_student(tokenizer)
    with pytest.raises(ValueError, match="continuation"):
        masked_diffusion_loglikelihood(model, [1, 2], [])
    with pytest.raises(ValueError, match="context"):
        masked_diffusion_loglikelihood(model, [], [3])


# --- GSM8K CoT through the harness with a scripted student ------------------------------------------------

class ScriptedStudent(nn.Module):
    """Finds which test question its prompt ends with and proposes the scripted response (then EOS) with
    probability ``CONFIDENCE`` at every generated position, so a threshold of 0.9 commits a block per forward."""

    def __init__(self, tokenizer, scripts: dict[str, list[int]]) -> None:
        super().__init__()
        self.config = PreTrainedConfig(vocab_size=len(tokenizer), eos_token_id=tokenizer.eos_token_id)
        self.tokenizer, self.scripts = tokenizer, scripts
        self.weight = nn.Parameter(torch.zeros(1))
        prepare_student(self, "llada", tokenizer.mask_token_id)

    def forward(self, input_ids, attention_mask=None, logits_to_keep=None, **kwargs):
        vocab = self.config.vocab_size
        low = math.log((1 - CONFIDENCE) / (vocab - 1))
        logits = torch.full((*input_ids.shape, vocab), low)
        for row, ids in enumerate(input_ids):
            prompt = self.tokenizer.decode(ids[:-GEN], skip_special_tokens=True)
            question = max((q for q in self.scripts if q in prompt), key=prompt.rfind)
            script = self.scripts[question] + [self.tokenizer.eos_token_id] * (GEN - len(self.scripts[question]))
            logits[row, torch.arange(len(ids) - GEN, len(ids)), torch.tensor(script)] = math.log(CONFIDENCE)
        return SimpleNamespace(logits=logits if logits_to_keep is None else logits[:, logits_to_keep])


# Hidden-answer formats for the first GSM8K test problems (gold 18, 3, 70000, 540, 20, 64, 260) and what each
# extractor makes of them: (text, tail after a stop string, harness strict-match, flexible-extract, ours).
CASES = [
    ("Janet sells 16 - 3 - 4 = 9 eggs for $2 each. #### 18", "", False, True, True),
    ("It takes 2 + 1 = 3 bolts. The answer is 3.\n\n", "Q: one more question 99", True, True, True),
    ("The profit is $70,000. The answer is 70,000.", "", True, True, True),
    ("He runs 3 * 3 * 60 = 540 meters, so \\boxed{540}", "", False, True, True),
    ("She needs 20 cups. The answer is 20 cups.", "", True, True, True),
    ("The answer is 64. Check: 64 / 8 = 8", "", True, False, False),
    ("Toulouse has 260 sheep. The answer is $260.", "", False, True, True),
]


@pytest.fixture(scope="module")
def gsm8k_cot_run(tokenizer):
    from lm_eval import simple_evaluate

    from trims_hf.evaluation.harness.model import TrimsLM

    encode = lambda text: tokenizer(text, add_special_tokens=False)["input_ids"]  # noqa: E731
    docs = read_jsonl(DATA / "gsm8k" / "test.jsonl", len(CASES))
    kept = [encode(text) for text, *_ in CASES]
    tails = [encode(tail) if tail else [] for _, tail, *_ in CASES]
    scripts = {doc["question"]: k + t for doc, k, t in zip(docs, kept, tails)}
    lm = TrimsLM(ScriptedStudent(tokenizer, scripts), tokenizer=tokenizer, batch_size=3, device="cpu",
                 gen_length=GEN, block_length=BLOCK)
    manager = gsm8k_task_manager(metadata={"data_dir": str(DATA)})
    results = simple_evaluate(model=lm, tasks=["gsm8k_cot_local"], limit=len(CASES), task_manager=manager,
                              log_samples=True, bootstrap_iters=0)
    return SimpleNamespace(results=results, docs=docs, kept=kept, full=[k + t for k, t in zip(kept, tails)])


@pytest.mark.slow
def test_gsm8k_cot_through_harness_counts_and_stop_strings(gsm8k_cot_run):
    results = gsm8k_cot_run.results
    samples = sorted((s for s in results["samples"]["gsm8k_cot"] if s["filter"] == "strict-match"),
                     key=lambda s: s["doc_id"])
    assert results["n-shot"]["gsm8k_cot"] == 8  # the leaderboard CoT prompt, from the harness's own config
    responses = [s["resps"][0][0] for s in samples]
    assert responses == [text for text, *_ in CASES]  # the tail after "Q:" is cut, EOS dropped
    trims = results["config"]["trims"]
    counts = trims["tokens_per_step"]["gsm8k_cot"]
    nfe = [len(ids) // BLOCK + 1 for ids in gsm8k_cot_run.full]  # one forward per block up to the EOS block
    assert counts["generated_tokens"] == sum(len(ids) for ids in gsm8k_cot_run.kept)
    assert counts["nfe"] == sum(nfe) and counts["samples"] == len(CASES)
    assert counts["tokens_per_step"] == pytest.approx(counts["generated_tokens"] / counts["nfe"])
    assert trims["decoding"]["gen_length"] == GEN and trims["decoding"]["strategy"] == "threshold"
    assert results["results"]["gsm8k_cot"]["exact_match,strict-match"] == pytest.approx(
        sum(case[2] for case in CASES) / len(CASES))


@pytest.mark.slow
def test_harness_and_trims_extraction_agree_on_hidden_answers(gsm8k_cot_run):
    """Documented in docs/evaluation.md: gsm8k_cot's strict-match reads only "The answer is N" (not "#### N", boxed or "$N");
    flexible-extract and ours take the last number, so a check written after the answer fools both."""
    ours = GSM8KTask()
    by_filter = {(s["doc_id"], s["filter"]): s["exact_match"] for s in gsm8k_cot_run.results["samples"]["gsm8k_cot"]}
    for doc_id, ((text, _, strict, flexible, expected_ours), doc) in enumerate(zip(CASES, gsm8k_cot_run.docs)):
        assert bool(by_filter[(doc_id, "strict-match")]) is strict, text
        assert bool(by_filter[(doc_id, "flexible-extract")]) is flexible, text
        assert ours.grade_answer(text, doc["answer"])["correct"] is expected_ours, text


# --- the command, local data and early errors ---------------------------------------------------------------

@needs_full_data
def test_local_data_loaders_match_hub_splits():
    from trims_hf.evaluation.harness.tasks import local_data

    gsm8k = local_data.gsm8k(data_dir=str(FULL_DATA), pretrained="ignored")
    assert {k: len(v) for k, v in gsm8k.items()} == {"train": 7473, "test": 1319}
    assert {k: len(v) for k, v in local_data.mbpp(data_dir=str(FULL_DATA)).items()} == {
        "prompt": 10, "test": 500, "validation": 90, "train": 374}
    assert len(local_data.math500(data_dir=str(FULL_DATA))["test"]) == 500
    with pytest.raises(FileNotFoundError, match="TRIMS_HARNESS_DATA"):
        local_data.gsm8k()


def test_a_request_past_the_students_positions_is_refused_before_any_is_decoded(tokenizer):
    """lm-eval hands the model every request at once: a few-shot prompt that, with gen_length, runs past the student's
    positions is one InputError naming the request (the command prints it as one line) before the first forward."""
    from trims_hf.errors import InputError
    from trims_hf.evaluation.harness.model import TrimsLM

    model = ScriptedStudent(tokenizer, {"Q": []})
    calls = []
    model.register_forward_pre_hook(lambda *args: calls.append(1))
    lm = TrimsLM(model, tokenizer=tokenizer, batch_size=2, device="cpu", gen_length=GEN, block_length=BLOCK)
    gen_kwargs = {"until": ["Q:"], "do_sample": False}
    short, long = "Q: short? A:", "Q: " + "how many apples are there " * 40 + "? A:"
    requests = [SimpleNamespace(args=(context, gen_kwargs), task_name="gsm8k", repeats=1) for context in (short, long)]
    length = len(prompt_token_ids(tokenizer, long, lm.response_format))
    model.config.max_position_embeddings = length + GEN - 1
    with pytest.raises(InputError, match=rf"^--model_args: gsm8k request 1: gen_length={GEN} after a prompt of {length} "
                                         rf"tokens reaches position {length + GEN - 1}, past the model's "
                                         rf"max_position_embeddings={length + GEN - 1}; generate fewer tokens"):
        lm.generate_until(requests, disable_tqdm=True)
    assert calls == []
    model.config.max_position_embeddings = length + GEN
    assert len(lm.generate_until(requests, disable_tqdm=True)) == 2 and calls


@pytest.mark.slow
def test_harness_command_writes_results_and_tokens_per_step(saved_student, tmp_path):
    model_dir = saved_student
    args = ["--model", "trims", "--model_args",
            f"pretrained={model_dir},dtype=float32,strategy=fixed_steps,gen_length=16,block_length=16,steps=2",
            "--tasks", "gsm8k_cot_local", "--limit", "2", "--batch_size", "2", "--device", "cpu",
            "--output_path", str(tmp_path / "out")]
    env = {**os.environ, "PYTHONPATH": str(REPO), "TRIMS_HARNESS_DATA": str(DATA), "HF_HUB_OFFLINE": "1"}
    done = subprocess.run([sys.executable, "-m", "trims_hf.evaluation.harness", *args], env=env, capture_output=True,
                          text=True, timeout=600)
    assert done.returncode == 0, done.stderr[-3000:]
    results_file = next((tmp_path / "out").rglob("results_*.json"))
    trims_file = results_file.with_name(results_file.name.replace("results_", "trims_"))
    results, trims = json.loads(results_file.read_text()), json.loads(trims_file.read_text())
    assert "exact_match,strict-match" in results["results"]["gsm8k_cot"]
    assert trims["decoding"]["strategy"] == "fixed_steps" and trims["decoding"]["steps"] == 2
    counts = trims["tokens_per_step"]["gsm8k_cot"]
    # fixed_steps with 2 steps on one 16-token block: at most 2 forwards per sample, 1 if EOS ends it early
    assert counts["samples"] == 2 and 2 <= counts["nfe"] <= 4 and counts["model_forwards"] <= 2
    assert counts["tokens_per_step"] == pytest.approx(counts["generated_tokens"] / counts["nfe"])
    assert trims["results_file"] == results_file.name and trims["student"] == "llada"


def test_bad_arguments_fail_before_loading(monkeypatch):
    from trims_hf.evaluation.harness.__main__ import main
    from trims_hf.evaluation.harness.model import TrimsLM

    with pytest.raises(ValueError, match="unknown model argument.*treshold"):
        TrimsLM("/nonexistent/model", treshold=0.9)
    with pytest.raises(ValueError, match=r"unknown model argument\(s\) \['kind'\].*'model_kind'"):
        TrimsLM("/nonexistent/model", kind="llada")
    with pytest.raises(ValueError, match="model_kind='lada'; choose one of llada, llada_moe, llada2, dream, masked_lm"):
        TrimsLM("/nonexistent/model", model_kind="lada")
    with pytest.raises(ValueError, match="pretrained /nonexistent/model: no such file or folder"):
        TrimsLM("/nonexistent/model")
    with pytest.raises(ValueError, match="multiple of block_length"):
        TrimsLM("/nonexistent/model", gen_length=100, block_length=32)
    with pytest.raises(ValueError, match="batch size"):
        TrimsLM("/nonexistent/model", batch_size="auto")
    monkeypatch.delenv("TRIMS_HARNESS_DATA", raising=False)
    assert main(["--model", "trims", "--model_args", "pretrained=/nonexistent", "--tasks", "gsm8k_cot_local"]) == 2


@pytest.mark.parametrize("task, missing", [("gsm8k_cot_local", "gsm8k/train.jsonl"), ("gsm8k_local", "gsm8k/test.jsonl"),
                                           ("minerva_math500_local", "math500/test.jsonl"),
                                           ("mbpp_local", "mbpp/mbpp.jsonl")])
def test_each_file_a_local_task_reads_is_checked_before_any_model(task, missing, tmp_path, capsys, harness_builds_no_model):
    """A data folder with one of a task's files missing (GSM8K's shots come from its train split) is one line, naming
    the file, before the harness builds a model."""
    from trims_hf.evaluation.harness.__main__ import main

    shutil.copytree(DATA, tmp_path / "data")
    (tmp_path / "data" / missing).unlink()
    argv = ["--model", "trims", "--model_args", "pretrained=/nonexistent", "--tasks", task,
            "--metadata", json.dumps({"data_dir": str(tmp_path / "data")})]
    assert main(argv) == 2
    assert capsys.readouterr().err.strip().splitlines() == [
        f"error: local harness task data not found: {tmp_path / 'data' / missing}"]


@pytest.fixture
def harness_builds_no_model(monkeypatch):
    """The command's checks must come before the harness builds (and loads) a model."""
    from lm_eval._cli import HarnessCLI

    from trims_hf.evaluation.harness import model as harness_model

    def never(*args, **kwargs):
        raise AssertionError("the harness ran before the input error was found")

    monkeypatch.setattr(HarnessCLI, "execute", never)
    monkeypatch.setattr(harness_model, "load_model", never)


# model_args after pretrained={model} (or instead of it, with no pretrained), and the error line without "error: "
LM_EVAL_ERRORS = {
    "threshold above 1": ("{model},threshold=1.5", "--model_args: threshold=1.5: must be in [0, 1]."),
    "misspelt argument": ("{model},treshold=0.5", "--model_args: unknown model argument(s) ['treshold'] (did you mean "
                          "threshold?); accepted: pretrained, tokenizer, the ModelConfig fields"),
    "no pretrained": ("dtype=float32", "--model_args: pretrained is missing: pass the student (a folder or Hub id) as "
                      "pretrained=PATH."),
    "plain Llama without model_kind": ("{llama}", "--model_args: pretrained {llama_path} is a plain causal LM ('llama'); "
                                       "say how it was trained"),
    "another strategy's knob": ("{model},entropy_threshold=0.1", "--model_args: entropy_threshold=0.1 does nothing with "
                                "strategy='threshold': only entropy reads it"),
    "stop id outside the vocabulary": ("{model},stop_token_ids=2 99999", "--model_args: stop_token_ids: 99999 is outside "
                                       "the model's vocabulary (400 tokens)"),
    "stop id not a number": ("{model},stop_token_ids=eos", "--model_args: stop_token_ids=eos: token ids are whole "
                             "numbers, separated by spaces."),
    "batch size auto": ("{model},batch_size=auto", "--model_args: batch_size='auto': the trims model takes a positive "
                        "integer batch size"),
}


@pytest.mark.parametrize("case", list(LM_EVAL_ERRORS))
def test_lm_eval_mistakes_are_one_error_line_before_the_model_loads(case, saved_student, tokenizer, tmp_path, capsys,
                                                                    harness_builds_no_model):
    from trims_hf.cli import main

    llama = tmp_path / "llama"
    LlamaForCausalLM(LlamaConfig(vocab_size=len(tokenizer), hidden_size=16, intermediate_size=32, num_hidden_layers=1,
                                 num_attention_heads=2)).save_pretrained(llama)
    tokenizer.save_pretrained(llama)
    model_args, message = LM_EVAL_ERRORS[case]
    names = {"model": f"pretrained={saved_student}", "llama": f"pretrained={llama}", "llama_path": llama}
    capsys.readouterr()
    # a task file is not looked up in the task index: only the model's arguments are checked here
    code = main(["lm-eval", "--model", "trims", "--model_args", model_args.format(**names), "--tasks",
                 str(tmp_path / "task.yaml"), "--device", "cpu"])
    err = capsys.readouterr().err
    assert code == 2 and err.startswith(f"error: {message.format(**names)}") and err.count("\n") == 1, err


@pytest.fixture
def task_indexes(monkeypatch) -> list[bool]:
    """Whether each task index the command's check builds includes the harness's own thousands of tasks; they are
    left out here (seconds to read), so the index holds the package's *_local tasks only."""
    import lm_eval.tasks
    from lm_eval.tasks import TaskManager

    built = []

    def manager(include_path=None, include_defaults=True):
        built.append(include_defaults)
        return TaskManager(include_path=include_path, include_defaults=False)

    monkeypatch.setattr(lm_eval.tasks, "TaskManager", manager)
    return built


def test_lm_eval_unknown_task_is_one_error_line_before_the_model_loads(saved_student, capsys, monkeypatch,
                                                                      harness_builds_no_model, task_indexes):
    from trims_hf.cli import main

    monkeypatch.setenv("TRIMS_HARNESS_DATA", str(DATA))
    code = main(["lm-eval", "--model", "trims", "--model_args", f"pretrained={saved_student}", "--tasks",
                 "gsm8k_local,gsm8k_locall"])
    assert code == 2
    assert capsys.readouterr().err == "error: --tasks gsm8k_locall: no such task (did you mean gsm8k_local?) " \
                                      "(`lm-eval ls tasks` lists them).\n"
    assert task_indexes == [False, True]  # a name not on the include path is looked up among the harness's tasks


def test_tasks_on_the_include_path_are_checked_without_the_harness_index(task_indexes):
    from trims_hf.evaluation.harness import TASKS_DIR
    from trims_hf.evaluation.harness.__main__ import _check_run

    _check_run(argparse.Namespace(tasks="gsm8k_cot_local,mbpp_local", include_path=str(TASKS_DIR), model="hf"))
    assert task_indexes == [False]  # the harness indexes its own tasks once, when it runs


def test_lm_eval_data_that_cannot_be_fetched_is_one_error_line(saved_student, tmp_path, capsys, monkeypatch):
    from lm_eval._cli import HarnessCLI

    from trims_hf.cli import main

    def offline(self, args):
        raise ConnectionError("Couldn't reach 'openai/gsm8k' on the Hub (OfflineModeIsEnabled)")

    monkeypatch.setattr(HarnessCLI, "execute", offline)
    code = main(["lm-eval", "--model", "trims", "--model_args", f"pretrained={saved_student}", "--tasks",
                 str(tmp_path / "gsm8k.yaml"), "--device", "cpu"])
    err = capsys.readouterr().err
    assert code == 2 and err.count("\n") == 1
    assert err.startswith(f"error: --tasks {tmp_path / 'gsm8k.yaml'}: a task's data could not be fetched (Couldn't reach "
                          "'openai/gsm8k' on the Hub (OfflineModeIsEnabled)); connect to the Hugging Face Hub, or run "
                          "with the data set in the Hugging Face cache and HF_DATASETS_OFFLINE=1")


def test_student_arguments_are_the_model_config_and_end_of_response_is_checked_first(tokenizer, tmp_path, monkeypatch):
    from trims_hf.evaluation.harness import model as harness_model

    folder = tmp_path / "tiny"
    tiny_student(tokenizer, "llada").save_pretrained(folder)
    tokenizer.save_pretrained(folder)
    load_model = harness_model.load_model

    def never(*args, **kwargs):
        raise AssertionError("the model was loaded before the input error was found")

    monkeypatch.setattr(harness_model, "load_model", never)
    with pytest.raises(ValueError, match="End-of-response token '<|nope|>' is not a single token"):
        harness_model.TrimsLM(str(folder), end_of_response="<|nope|>")
    monkeypatch.setattr(harness_model, "load_model", load_model)
    lm = harness_model.TrimsLM(str(folder), tokenizer=str(folder), model_kind="llada", dtype="float32", device="cpu",
                               end_of_response=tokenizer.eos_token)
    assert lm.response_format.end_of_response == [tokenizer.eos_token] and lm.spec.kind == "llada"
    assert next(lm.model.parameters()).dtype == torch.float32
