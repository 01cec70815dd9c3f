"""The ``trims`` model of lm-evaluation-harness: a masked-diffusion student decoded by trims_hf.

``--model trims --model_args pretrained=PATH[,tokenizer=PATH][,<any ModelConfig field>=VALUE...]
[,end_of_response=TOKEN[ TOKEN...]][,<any DecodingConfig field>=VALUE...]``: the student is a
:class:`~trims_hf.model_config.ModelConfig` (``pretrained`` and ``tokenizer``, the harness's names, are its
``model_name_or_path`` and ``tokenizer_name_or_path``), resolved and loaded as ``trims eval`` does (an adapter is
merged), and ``end_of_response`` is the student's training :class:`~trims_hf.settings.ResponseFormat` setting.
Generation goes through :func:`trims_hf.generation.generate_text` (prompts verbatim: chat formatting is
the harness's ``--apply_chat_template``), answers are cut at the request's ``until`` strings, and a
:class:`~trims_hf.generation.TokensPerStepRecorder` per task counts tokens and forwards the same way
``trims eval`` does. The counts and the decoding settings land in the results file under
``config.trims`` (the harness asks the model for :meth:`TrimsLM.get_model_info` after evaluating).
Under ``accelerate launch`` / ``torchrun`` the harness shares the documents across processes by this model's
``rank`` / ``world_size`` (as with its ``hf`` model), and the counts are gathered over the processes.
Importing this module registers the model; it needs the ``lm_eval`` package.
"""

from __future__ import annotations

import json
import logging
from collections.abc import Sequence
from dataclasses import asdict, fields, replace
from typing import Any

import torch
from accelerate.utils import gather as accelerate_gather
from lm_eval.api.model import TemplateLM
from lm_eval.api.registry import register_model
from lm_eval.models.utils import Collator, normalize_gen_kwargs
from torch import nn
from tqdm.auto import tqdm
from transformers import PreTrainedTokenizerBase

from ...distributed import announce, gather, process_state
from ...errors import InputError, did_you_mean
from ...generation import DecodingConfig, TokensPerStepRecorder, generate, generate_text
from ...generation.decoding import past_the_positions
from ...model_config import ModelConfig, ResolvedStudent, check_model_sources, load_model, resolve_student
from ...prompts import check_end_of_response, prompt_token_ids
from ...settings import ResponseFormat
from ...students import student_spec
from ..evaluate import gather_recorders
from .likelihood import masked_diffusion_loglikelihood

logger = logging.getLogger(__name__)

DECODING_ARGS = frozenset(f.name for f in fields(DecodingConfig))
"""Model arguments (and ``--gen_kwargs`` keys) that set the decoder: every :class:`DecodingConfig` field."""

HARNESS_NAMES = {"model_name_or_path": "pretrained", "tokenizer_name_or_path": "tokenizer"}
"""The :class:`ModelConfig` fields lm-evaluation-harness names its own way; every other field is a model argument."""
MODEL_ARGS = frozenset(f.name for f in fields(ModelConfig)) - set(HARNESS_NAMES)


def harness_name(field: str) -> str:
    """A :class:`ModelConfig` field as a ``--model_args`` key."""
    return HARNESS_NAMES.get(field, field)

ESTIMATOR = "LLaDA Monte Carlo ELBO: l ~ U{1..L} masks on the continuation, (L/l)-weighted log-probs, mean"


OWN_ARGS = ("pretrained", "tokenizer", "device", "batch_size", "max_batch_size", "mc_samples", "mc_batch_size", "mc_seed",
            "end_of_response")
"""The :class:`TrimsLM` arguments that are neither a :class:`ModelConfig` nor a :class:`DecodingConfig` field."""


def _decoding_config(arguments: dict[str, Any], base: DecodingConfig | None = None) -> DecodingConfig:
    """A :class:`DecodingConfig` from harness arguments (lists become tuples; ``stop_token_ids`` are space-separated,
    as model_args are comma-separated); a value it refuses is an :class:`InputError` naming the argument
    (``threshold=1.5: must be in [0, 1].``)."""
    values = {k: tuple(v) if isinstance(v, list) else v for k, v in arguments.items()}
    if isinstance(stop := values.get("stop_token_ids"), (int, str)):
        if not all(i.isdigit() for i in str(stop).split()):
            raise InputError(f"stop_token_ids={stop}: token ids are whole numbers, separated by spaces.")
        values["stop_token_ids"] = tuple(int(i) for i in str(stop).split())
    try:
        config = replace(base, **values) if base is not None else DecodingConfig(**values)
        config.check_given(values)
    except (TypeError, ValueError) as error:
        raise InputError(str(error)) from None
    return config


def check_arguments(arguments: dict[str, Any]) -> tuple[dict[str, Any], DecodingConfig]:
    """The :class:`ModelConfig` arguments and the :class:`DecodingConfig` of a model's ``arguments`` (the model
    arguments less :data:`OWN_ARGS`); an unknown name is an :class:`InputError` with the closest known one."""
    if unknown := sorted(set(arguments) - MODEL_ARGS - DECODING_ARGS):
        known = {*OWN_ARGS, *MODEL_ARGS, *DECODING_ARGS}
        raise InputError(f"unknown model argument(s) {unknown}{did_you_mean(unknown[0], known)}; accepted: pretrained, "
                         f"tokenizer, the ModelConfig fields {sorted(MODEL_ARGS)}, end_of_response, and the "
                         f"DecodingConfig fields {sorted(DECODING_ARGS)}.")
    return ({k: v for k, v in arguments.items() if k in MODEL_ARGS},
            _decoding_config({k: v for k, v in arguments.items() if k in DECODING_ARGS}))


def resolve(pretrained: str, tokenizer: str | PreTrainedTokenizerBase | None, model_args: dict[str, Any],
            end_of_response: list[str] | None, decoding: DecodingConfig) -> tuple[ModelConfig, ResolvedStudent]:
    """The student of ``pretrained`` as ``trims eval`` resolves it, from its config and tokenizer (no weights), with
    ``end_of_response`` and the decoder's token ids checked against them; a mistake is an :class:`InputError` naming
    the argument."""
    given_tokenizer = tokenizer if isinstance(tokenizer, PreTrainedTokenizerBase) else None
    try:
        config = ModelConfig(pretrained, tokenizer_name_or_path=None if given_tokenizer else tokenizer, **model_args)
    except (TypeError, ValueError) as error:
        raise InputError(str(error)) from None
    check_model_sources(config, harness_name)
    student = resolve_student(config, harness_name, given_tokenizer)
    check_end_of_response(student.tokenizer, end_of_response, "end_of_response")
    if student.vocab_size is not None:
        try:
            decoding.check_token_ids(student.vocab_size)
        except ValueError as error:
            raise InputError(str(error)) from None
    return config, student


def check_batches(batch_size: int | str = 1, mc_samples: int = 128, mc_batch_size: int = 32) -> None:
    """The batch sizes and Monte Carlo draws are positive integers (``batch_size=auto`` is not supported)."""
    if not str(batch_size).isdigit() or int(batch_size) < 1:
        raise InputError(f"batch_size={batch_size!r}: the trims model takes a positive integer batch size")
    if int(mc_samples) < 1 or int(mc_batch_size) < 1:
        raise InputError(f"mc_samples={mc_samples} and mc_batch_size={mc_batch_size} must be positive")


def check_model_args(arguments: dict[str, Any]) -> None:
    """Every check :class:`TrimsLM` makes of its ``--model_args`` before it loads the weights, for the command to make
    before the harness starts; a mistake is an :class:`InputError` naming the argument."""
    if not arguments.get("pretrained"):
        raise InputError("pretrained is missing: pass the student (a folder or Hub id) as pretrained=PATH.")
    own = {k: v for k, v in arguments.items() if k in OWN_ARGS}
    model_args, decoding = check_arguments({k: v for k, v in arguments.items() if k not in OWN_ARGS})
    check_batches(**{k: v for k, v in own.items() if k in ("batch_size", "mc_samples", "mc_batch_size")})
    resolve(str(own["pretrained"]), own.get("tokenizer"), model_args, end_tokens(own.get("end_of_response")), decoding)


def end_tokens(end_of_response: str | list[str] | None) -> list[str] | None:
    """``end_of_response`` as tokens: lm-eval's model_args are comma-separated, so several are separated by spaces."""
    return end_of_response.split() if isinstance(end_of_response, str) else end_of_response


@register_model("trims")
class TrimsLM(TemplateLM):
    """A trims_hf student as an lm-eval model; see the module docstring for the arguments."""

    def __init__(
        self,
        pretrained: str | nn.Module,
        tokenizer: str | PreTrainedTokenizerBase | None = None,
        device: str | None = None,
        batch_size: int | str = 1,
        max_batch_size: int | None = None,
        mc_samples: int = 128,
        mc_batch_size: int = 32,
        mc_seed: int = 0,
        end_of_response: str | list[str] | None = None,
        **arguments: Any,
    ) -> None:
        super().__init__()
        # Every argument is checked before the (possibly 8B) model is loaded.
        model_args, self.decoding = check_arguments(arguments)
        check_batches(batch_size, mc_samples, mc_batch_size)
        self.batch_size = int(batch_size)
        self.mc_samples, self.mc_batch_size = int(mc_samples), int(mc_batch_size)
        self.generator = torch.Generator().manual_seed(int(mc_seed))
        ends = end_tokens(end_of_response)
        self.response_format = ResponseFormat("verbatim", end_of_response=ends)
        if device is None or (str(device).startswith("cuda") and not torch.cuda.is_available()):
            # The harness CLI asks for cuda by default; like its hf model, run where the machine can.
            device = "cuda" if torch.cuda.is_available() else "cpu"
        # Under accelerate launch / torchrun the harness shares the documents by rank::world_size, like its hf model.
        self.state = process_state(device)
        self._rank, self._world_size = self.state.process_index, self.state.num_processes
        announce("the trims harness model", self.state)
        self._device = self.state.device if self._world_size > 1 and self.state.device.type != "cpu" else torch.device(device)
        given_tokenizer = tokenizer if isinstance(tokenizer, PreTrainedTokenizerBase) else None
        if isinstance(pretrained, str):
            config, student = resolve(pretrained, tokenizer, model_args, ends, self.decoding)
            model, self.tokenizer = load_model(config, student), student.tokenizer
        elif given_tokenizer is None or model_args:
            raise ValueError(f"a model object needs its tokenizer object and no model arguments ({sorted(MODEL_ARGS)})")
        else:
            model, self.tokenizer = pretrained, given_tokenizer
        self.model = model.to(self._device).eval()
        self.spec = student_spec(self.model)
        self.names = {"pretrained": pretrained if isinstance(pretrained, str) else type(pretrained).__name__,
                      "adapter": model_args.get("adapter")}
        self.recorders: dict[str, TokensPerStepRecorder] = {}
        self.gathered: dict[str, TokensPerStepRecorder] = {}
        """The recorders with every process's samples: what the tokens-per-step figures are computed from."""
        self.generate_overrides: dict[str, dict[str, Any]] = {}
        self.loglikelihood_forwards = 0
        self.gathered_loglikelihood_forwards = 0
        """Every process's log-likelihood forwards (each draws its own Monte Carlo masks from ``mc_seed``)."""

    @property
    def eot_token_id(self) -> int:
        return self.tokenizer.eos_token_id

    @property
    def tokenizer_name(self) -> str:
        return self.tokenizer.name_or_path.replace("/", "__")

    def tok_encode(self, string: str, add_special_tokens: bool | None = None, **kwargs: Any) -> list[int]:
        """Token ids of ``string``; no special tokens unless asked (chat templates carry their own BOS)."""
        return self.tokenizer(string, add_special_tokens=bool(add_special_tokens))["input_ids"]

    def all_gather(self, tensor: torch.Tensor) -> torch.Tensor:
        return accelerate_gather(tensor)

    def gather_object(self, obj: Any, dst: int = 0) -> list[Any]:
        return gather(obj)

    def barrier(self) -> None:
        self.state.wait_for_everyone()

    def apply_chat_template(self, chat_history: list[dict[str, str]], add_generation_prompt: bool = True) -> str:
        return self.tokenizer.apply_chat_template(
            chat_history, tokenize=False, add_generation_prompt=add_generation_prompt
        )

    def _check_positions(self, requests: list, by_task: dict[str, list[int]]) -> None:
        """Every request's prompt and ``gen_length`` within the student's positions, before the first is decoded
        (:func:`~trims_hf.generation.decoding.past_the_positions`; ``generate`` would refuse one mid-run)."""
        positions = getattr(self.model.config.get_text_config(), "max_position_embeddings", None)
        if positions is None:
            return
        gen_lengths: dict[str, int] = {}  # per distinct generation arguments (each read once, its warnings once)
        for task, indices in by_task.items():
            for index in indices:
                context, gen_kwargs = requests[index].args[:2]
                key = json.dumps(gen_kwargs, sort_keys=True, default=str)
                if key not in gen_lengths:
                    gen_lengths[key] = self._request_config(gen_kwargs)[0].gen_length
                length = len(prompt_token_ids(self.tokenizer, context, self.response_format))
                if problem := past_the_positions(positions, length, gen_lengths[key]):
                    raise InputError(f"--model_args: {task} request {index}: {problem}; generate fewer tokens "
                                     "(gen_length) or give fewer shots (--num_fewshot).")

    def _request_config(self, gen_kwargs: dict[str, Any]) -> tuple[DecodingConfig, list[str]]:
        """Decoding settings and stop strings of one request; its ``DecodingConfig`` keys override the model's."""
        kwargs = normalize_gen_kwargs(gen_kwargs)
        until = kwargs.pop("until")
        # The canvas length is gen_length (a decoding setting that moves accuracy and tokens per step),
        # so the harness's max_gen_toks is not used; sampling is on iff do_sample, as in the harness.
        kwargs.pop("max_gen_toks")
        if not kwargs.pop("do_sample"):
            kwargs["temperature"] = 0.0
        ignored = sorted(set(kwargs) - DECODING_ARGS)
        if ignored:
            logger.warning("trims model ignores generation arguments %s", ignored)
        return _decoding_config({k: v for k, v in kwargs.items() if k in DECODING_ARGS}, self.decoding), until

    def generate_until(self, requests: list, disable_tqdm: bool = False) -> list[str]:
        """Batched parallel decoding, one batch per (task, generation arguments); answers cut at ``until``."""
        by_task: dict[str, list[int]] = {}
        for index, request in enumerate(requests):
            by_task.setdefault(request.task_name or "", []).append(index)
        # lm-eval pads a process's requests to the longest share with copies of its last one: each request is
        # decoded (and counted) only as often as it repeats, and a padding copy takes its original's answer.
        first: dict[int, int] = {}
        padding: dict[int, int] = {}
        for index, request in enumerate(requests):
            first.setdefault(id(request), index)
            if index - first[id(request)] >= request.repeats:
                padding[index] = first[id(request)]
        for indices in by_task.values():
            indices[:] = [i for i in indices if i not in padding]
        self._check_positions(requests, by_task)
        answers: list[str] = [""] * len(requests)
        progress = tqdm(total=len(requests), desc="trims generate_until", disable=disable_tqdm)
        for task, indices in by_task.items():
            recorder = self.recorders.setdefault(task, TokensPerStepRecorder(self.tokenizer))
            collator = Collator(
                [(i, *requests[i].args) for i in indices],
                sort_fn=lambda item: -len(item[1]),
                group_fn=lambda item: item[2],
                group_by="gen_kwargs",
            )
            for batch in collator.get_batched(n=self.batch_size):
                config, until = self._request_config(batch[0][2])
                self.generate_overrides[task] = {
                    k: v for k, v in asdict(config).items() if v != getattr(self.decoding, k)
                }
                recorder.stop_strings = tuple(until)
                contexts = [context for _, context, _ in batch]
                texts = generate_text(self.model, self.tokenizer, contexts, config, [recorder],
                                      prompt_format=self.response_format, stop_strings=until)
                for (index, context, gen_kwargs), text in zip(batch, texts):
                    answers[index] = text
                    self.cache_hook.add_partial("generate_until", (context, gen_kwargs), answers[index])
                progress.update(len(batch))
        progress.close()
        for index, original in padding.items():
            answers[index] = answers[original]
        self.gathered = gather_recorders(self.recorders)
        return answers

    def _loglikelihood_tokens(self, requests: list, disable_tqdm: bool = False, **kwargs: Any) -> list[tuple[float, bool]]:
        """Monte Carlo ELBO (``mc_samples`` draws) and whether the decoder's greedy answer is the continuation."""
        results = []
        for key, context, continuation in tqdm(requests, desc="trims loglikelihood", disable=disable_tqdm):
            score = masked_diffusion_loglikelihood(
                self.model, context, continuation, self.mc_samples, self.mc_batch_size, self.generator
            )
            greedy = self._is_greedy(context, continuation)
            self.loglikelihood_forwards += -(-self.mc_samples // self.mc_batch_size) + len(continuation)
            results.append((score, greedy))
            self.cache_hook.add_partial("loglikelihood", key, (score, greedy))
        self.gathered_loglikelihood_forwards = sum(gather(self.loglikelihood_forwards))
        return results

    def _is_greedy(self, context: Sequence[int], continuation: Sequence[int]) -> bool:
        """Whether LLaDA's one-token-per-step low-confidence decoding of ``len(continuation)`` masks gives it."""
        length = len(continuation)
        config = DecodingConfig(strategy="fixed_steps", gen_length=length, block_length=length, steps=length,
                                early_stop=False, cache="none")
        output = generate(self.model, torch.tensor([list(context)], device=self._device), config=config)
        return output.responses[0].tolist() == list(continuation)

    def loglikelihood_rolling(self, requests: list, disable_tqdm: bool = False) -> list[float]:
        raise NotImplementedError(
            "the trims model has no rolling (perplexity) log-likelihood: a masked-diffusion student only gives "
            "an ELBO of a continuation given a context; use loglikelihood or generate_until tasks"
        )

    def tokens_per_step(self) -> dict[str, dict[str, Any]]:
        """Per task: tokens per step (counted tokens / charged forwards), NFE, forwards and counts so far."""
        return {task: recorder.summary() | {"decoding_overrides": self.generate_overrides.get(task, {})}
                for task, recorder in self.gathered.items()}

    def get_model_info(self) -> dict[str, Any]:
        """What the harness writes under ``config`` of its results file: our settings and counts."""
        return {
            "trims": {
                **self.names,
                "student": self.spec.kind,
                "batch_size": self.batch_size,
                "decoding": asdict(self.decoding),
                "tokens_per_step": self.tokens_per_step(),
                "loglikelihood": {"estimator": ESTIMATOR, "mc_samples": self.mc_samples,
                                  "forwards": self.gathered_loglikelihood_forwards},
            }
        }


__all__ = ["DECODING_ARGS", "ESTIMATOR", "MODEL_ARGS", "TrimsLM"]
