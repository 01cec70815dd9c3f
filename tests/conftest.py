"""Shared test fixtures: the repository's fixtures and data excerpts, the way to ../shared, a tiny tokenizer, tiny students
built in code, and the guard that no test leaves global state behind."""

from __future__ import annotations

import atexit
import json
import os
import shutil
import tempfile
from pathlib import Path

from trims_hf.determinism import PINNED_ENVIRONMENT, usable_cpus

os.environ.update(PINNED_ENVIRONMENT)  # before torch loads: the suite computes on the demo's code paths on any CPU
# The README's test command runs the files on pytest-xdist workers, one process per CPU up to MAX_WORKERS. Each
# computes on its share of the CPUs, as OpenMP threads that outnumber the cores spin against each other (docs/results.md:
# the suite's times). Set before torch loads, so that the processes a test launches inherit it; an OMP_NUM_THREADS the
# caller set is kept.
MAX_WORKERS = 8  # past it the longest files (each on one worker) bound the suite's time, and every worker costs memory
CPUS = usable_cpus()
WORKERS = int(os.environ.get("PYTEST_XDIST_WORKER_COUNT", "1"))
CALLERS_THREADS = os.environ.get("OMP_NUM_THREADS")
if WORKERS > 1:
    os.environ.setdefault("OMP_NUM_THREADS", str(max(1, CPUS // WORKERS)))
# torch.compile's on-disk cache, this session's own (unless one is named): its key leaves ATen's pinned instruction set
# out, so a CPU kernel another process compiled unpinned (a bench run, another torch) and this pinned one loads gives
# wrong logits or crashes it (torch 2.13).
if "TORCHINDUCTOR_CACHE_DIR" not in os.environ:
    os.environ["TORCHINDUCTOR_CACHE_DIR"] = tempfile.mkdtemp(prefix="trims-tests-inductor-")
    atexit.register(shutil.rmtree, os.environ["TORCHINDUCTOR_CACHE_DIR"], ignore_errors=True)

import pytest  # noqa: E402
import torch  # noqa: E402
from helpers_compile import without_codegen  # noqa: E402
from helpers_tokenizers import make_tokenizer  # noqa: E402
from transformers import LlamaConfig, LlamaForCausalLM, Qwen2Config, Qwen2ForCausalLM  # noqa: E402

from trims_hf import prepare_student  # noqa: E402

TESTS = Path(__file__).resolve().parent
FIXTURES = TESTS / "fixtures"
"""The tiny LLaDA/Dream checkpoints, their reference logits and the Fast-dLLM decode traces (README.md there)."""
DATA = TESTS / "data"
"""The first rows of GSM8K, MATH-500 and MBPP (README.md there: sources, licences): the tests that need real rows."""
SHARED = Path(os.environ.get("TRIMS_SHARED") or TESTS.parents[1] / "shared")
"""The one way to ../shared, the full data sets and the paper (CI lays it beside the clone); TRIMS_SHARED names another
copy, e.g. a GPU machine's, carried inside the checkout. A bare clone has none: the tests that need it skip."""
FULL_DATA = SHARED / "data"
GSM8K_TRAIN = DATA / "gsm8k" / "train.jsonl"


def needs_shared(path: Path) -> pytest.MarkDecorator:
    """Skip unless ``path`` (inside SHARED) exists, naming the variable that provides it. The reason says
    TRIMS_SHARED: CI's full-data run fails when a skip reason does, so these tests run there."""
    return pytest.mark.skipif(not path.exists(), reason=f"needs {path}: set TRIMS_SHARED to a copy of ../shared")


needs_full_data = needs_shared(FULL_DATA)
"""For a test that reads whole data sets (their counts, their splits)."""


def needs_module(module: str, install: str) -> pytest.MarkDecorator:
    """Skip unless ``module`` imports, saying how to install it: a test of an extra (DeepSpeed, lm-eval, ...)
    that a user's ``pip install -e ".[dev]"`` may lack; CI's install has every one."""
    import importlib.util

    return pytest.mark.skipif(importlib.util.find_spec(module) is None, reason=f"needs {module}: {install}")


needs_deepspeed = needs_module("deepspeed", 'pip install -e ".[deepspeed]"')


@pytest.hookimpl(optionalhook=True)
def pytest_xdist_auto_num_workers(config) -> int:
    """``-n auto``: one worker per CPU, at most MAX_WORKERS."""
    return min(CPUS, MAX_WORKERS)


LONGEST_FILES = ("test_cuda_correctness.py", "test_real_size.py", "test_data_parallel.py", "test_distributed.py",
                 "test_demo.py", "test_trainer.py", "test_smollm2_recipe.py", "test_regime.py", "test_scoring.py")
"""The test files that take longest, longest first (the suite's ``--durations``, 2026-11-30: 300 s to 70 s of a
worker's time each; the rest under 60 s)."""


def pytest_configure(config) -> None:
    """pytest-xdist's ``--dist loadfile`` hands whole files to whichever worker is free, in the queue's order; by
    default it queues the files with the most tests first, which left the few-but-long files (the bench's, the
    compiled decoders') for the end, one worker running them while the other idled. The queue follows the
    collection's order instead (:func:`pytest_collection_modifyitems`)."""
    if getattr(config.option, "loadscopereorder", False):
        config.option.loadscopereorder = False


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    """The longest files first (:data:`LONGEST_FILES`), the others after them in their usual order."""
    rank = {name: index for index, name in enumerate(LONGEST_FILES)}
    items.sort(key=lambda item: rank.get(item.path.name, len(rank)))


@pytest.fixture(autouse=True)
def no_global_state_left():
    """Undo what a test leaves process-wide, so no later test depends on the order: transformers' DeepSpeed config
    (a half-built one, kept alive by a failed test's traceback, made ``load_student`` raise ``'HfTrainerDeepSpeedConfig'
    object has no attribute 'is_zero3'`` in later tests), environment variables, torch's CPU thread count (the study
    commands set it for their whole process), and a default process group."""
    environment, threads = dict(os.environ), torch.get_num_threads()
    yield
    torch.set_num_threads(threads)
    import sys

    if "transformers.integrations.deepspeed" in sys.modules:
        sys.modules["transformers.integrations.deepspeed"].unset_hf_deepspeed_config()
    if os.environ != environment:
        os.environ.clear()
        os.environ.update(environment)
    if torch.distributed.is_available() and torch.distributed.is_initialized():
        torch.distributed.destroy_process_group()


@pytest.fixture
def compile_without_codegen(monkeypatch):
    """``nn.Module.compile`` (so ``compile_blocks``) lowers without generated code (``helpers_compile``). For a test
    whose claim is what trims_hf decides (which blocks compile, how many graphs, hooks, adapters, gradients through the
    partition); the fused kernels' own roundings stay with the tests that keep inductor:
    ``test_compiled_blocks_commit_the_eager_tokens`` (decoding) and the compiled ZeRO-2 steps of test_distributed.py
    (training)."""
    monkeypatch.setattr(torch.nn.Module, "compile", without_codegen(torch.nn.Module.compile))


@pytest.fixture(scope="session")
def original_checkpoint(tmp_path_factory):
    """``kind`` -> a tiny checkpoint in that family's original layout, with ``parity.safetensors``: LLaDA and Dream from
    tests/fixtures (logits of the original code), LLaDA-MoE and LLaDA 2.x written by the test (logits of the reference)."""
    built = {}

    def folder(kind: str) -> Path:
        if kind in ("llada_moe", "llada2"):
            from helpers_students import write_llada2_checkpoint, write_llada_moe_checkpoint

            write = write_llada_moe_checkpoint if kind == "llada_moe" else write_llada2_checkpoint
            if kind not in built:
                built[kind] = write(tmp_path_factory.mktemp(f"{kind}_tiny"))
            return built[kind]
        return FIXTURES / f"{kind}_tiny"

    return folder


def read_jsonl(path: Path, limit: int) -> list[dict]:
    rows = []
    with path.open() as handle:
        for line in handle:
            rows.append(json.loads(line))
            if len(rows) == limit:
                break
    return rows


@pytest.fixture(scope="session")
def gsm8k_rows() -> list[dict]:
    """The first 64 GSM8K train rows as prompt/completion."""
    return [{"prompt": r["question"], "completion": r["answer"]} for r in read_jsonl(GSM8K_TRAIN, 64)]


@pytest.fixture(scope="session")
def tokenizer(gsm8k_rows):
    texts = [r["prompt"] + "\n" + r["completion"] for r in gsm8k_rows]
    return make_tokenizer(texts, vocab_size=400)


def tiny_student(tokenizer, kind: str = "llada", seed: int = 0, hidden: int = 32, layers: int = 2) -> torch.nn.Module:
    """A random bidirectional Llama (llada), Qwen2 (dream) or ModernBERT (masked_lm) sized for the test tokenizer."""
    torch.manual_seed(seed)
    if kind == "masked_lm":
        from transformers import ModernBertConfig, ModernBertForMaskedLM

        config = ModernBertConfig(vocab_size=len(tokenizer), hidden_size=hidden, intermediate_size=2 * hidden,
                                  num_hidden_layers=layers, num_attention_heads=4, pad_token_id=tokenizer.pad_token_id,
                                  bos_token_id=None, eos_token_id=None, cls_token_id=None, sep_token_id=None)
        return prepare_student(ModernBertForMaskedLM(config), kind, tokenizer.mask_token_id)
    common = dict(
        vocab_size=len(tokenizer), hidden_size=hidden, intermediate_size=2 * hidden, num_hidden_layers=layers,
        num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=2048,  # few-shot prompts reach ~1,400
        eos_token_id=tokenizer.eos_token_id, pad_token_id=tokenizer.pad_token_id,
    )
    model = LlamaForCausalLM(LlamaConfig(**common)) if kind == "llada" else Qwen2ForCausalLM(Qwen2Config(**common))
    return prepare_student(model, kind, tokenizer.mask_token_id)


def synthetic_scored_rows(rows: list[dict], tokenizer, num_buckets: int = 8, seed: int = 0) -> list[dict]:
    """Scored rows as the scorer writes them, with ``tokenizer`` as teacher and random NLLs."""
    import numpy as np

    from trims_hf.data.buckets import equal_mass_buckets

    rng = np.random.default_rng(seed)
    scored = []
    for row in rows:
        offsets = tokenizer(row["completion"], add_special_tokens=False, return_offsets_mapping=True)["offset_mapping"]
        nll = rng.exponential(size=len(offsets)).astype(np.float32)
        scored.append({**row, "teacher_token_start": [s for s, _ in offsets], "teacher_token_end": [e for _, e in offsets],
                       "teacher_nll": nll.tolist(), "teacher_entropy": (nll / 2).tolist()})
    flat = np.concatenate([r["teacher_nll"] for r in scored])
    buckets, _ = equal_mass_buckets(flat, num_buckets)
    for row, part in zip(scored, np.split(buckets, np.cumsum([len(r["teacher_nll"]) for r in scored])[:-1])):
        row["teacher_bucket"] = part.tolist()
    return scored


@pytest.fixture(scope="module")
def saved_student(tmp_path_factory, tokenizer) -> str:
    """A tiny LLaDA-style student and its tokenizer saved to a folder, as a Hub checkpoint is laid out."""
    folder = tmp_path_factory.mktemp("student")
    tiny_student(tokenizer).save_pretrained(folder)
    tokenizer.save_pretrained(folder)
    return str(folder)
