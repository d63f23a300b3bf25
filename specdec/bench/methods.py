"""The methods `specdec bench` compares: this project's engines, transformers' own generate, llama.cpp
(OpenAI-compatible servers, `--endpoint`, are in endpoint.py).

Every method turns prompt ids into new token ids under the same sampling settings; the runner
times it. Transformers methods run the very same float32 weights (the folder the model was loaded
or converted from), so differences are the decoding code's, not the model's. llama.cpp
(`--baseline llama.cpp`, through llama-cpp-python) runs the GGUF file itself, with its own
kernels and numerics, on as many threads as torch uses. Both baselines are built in a process of
their own (`transformers_baselines`, `llama_cpp_baseline`: child.py's factories), so that their
crash is theirs alone.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import torch

from specdec.bench.metrics import LLAMA_CPP
from specdec.decode.engine import Engine, GenerationConfig
from specdec.sampling import SamplingParams
from specdec.records.stats import GenerationStats


@dataclass
class Output:
    token_ids: list[int]  # the new tokens; an endpoint's are counted, not seen ([])
    stats: GenerationStats | None = None  # this project's methods, and an endpoint's when its server reports them
    text: str | None = None  # an endpoint's answer (the runner decodes the other methods' ids)
    new_tokens: int | None = None  # an endpoint's count; None: len(token_ids)
    first_token_seconds: float | None = None  # an endpoint's: request sent → first text
    seconds: float | None = None  # a baseline's, timed in its own process; None: the runner times the call
    peak_memory_bytes: int | None = None  # a baseline's, in its own process; None: the runner measures ours


@dataclass
class SpecdecMethod:
    name: str
    engine: Engine
    gamma: int | str
    max_gamma: int = 8
    ignore_eos: bool = False  # every answer max_new_tokens long (`--ignore-eos`)
    kind: str = field(default="specdec", init=False)

    def generate(self, prompt_ids: list[int], max_new_tokens: int, sampling: SamplingParams) -> Output:
        config = GenerationConfig(max_new_tokens=max_new_tokens, gamma=self.gamma, max_gamma=self.max_gamma,
                                  sampling=sampling, ignore_eos=self.ignore_eos)
        result = self.engine.generate(prompt_ids, config)
        return Output(result.token_ids, result.stats)

    def hold_learning(self) -> None:
        """Drafters that learn from their outputs (suffix) keep them aside until `release_learning`."""
        for drafter in self.engine.drafters:
            drafter.hold_learning()

    def release_learning(self) -> None:
        for drafter in self.engine.drafters:
            drafter.release_learning()


class TransformersMethod:
    """transformers `generate`: plain, or assisted by prompt lookup or by an assistant model."""

    kind = "transformers"

    def __init__(self, name: str, model, eos_token_ids: list[int], lookup_tokens: int = 0, assistant=None,
                 ignore_eos: bool = False) -> None:
        self.name = name
        self.model = model
        self.eos = eos_token_ids
        self.ignore_eos = ignore_eos
        self.extra = {}
        if lookup_tokens:
            self.extra["prompt_lookup_num_tokens"] = lookup_tokens
        if assistant is not None:
            self.extra["assistant_model"] = assistant

    def generate(self, prompt_ids: list[int], max_new_tokens: int, sampling: SamplingParams) -> Output:
        if sampling.greedy:
            options = {"do_sample": False}
        else:
            torch.manual_seed(sampling.seed if sampling.seed is not None else 0)  # transformers draws from the global RNG
            options = {"do_sample": True, "temperature": sampling.temperature, "top_k": sampling.top_k or None,
                       "top_p": sampling.top_p}
        device = self.model.device
        with torch.inference_mode():
            out = self.model.generate(
                torch.tensor([prompt_ids], device=device),
                attention_mask=torch.ones(1, len(prompt_ids), dtype=torch.long, device=device),
                max_new_tokens=max_new_tokens, eos_token_id=self.eos, pad_token_id=self.eos[0],
                min_new_tokens=max_new_tokens if self.ignore_eos else None, **options, **self.extra,
            )
        return Output(out[0, len(prompt_ids):].tolist())  # the end-of-sequence token kept, as our engine does


def transformers_baselines(folder: str, eos_token_ids: list[int], lookup_tokens: int, ignore_eos: bool,
                           device: str = "cpu", dtype: str = "float32", assistant_folder: str | None = None) -> list:
    """hf-generate, hf-lookup and, with an assistant, hf-assisted, sharing one model (a child.py factory)."""
    model = load_transformers_model(folder, device, dtype)
    methods = [TransformersMethod("hf-generate", model, eos_token_ids, ignore_eos=ignore_eos),
               TransformersMethod("hf-lookup", model, eos_token_ids, lookup_tokens=lookup_tokens, ignore_eos=ignore_eos)]
    if assistant_folder is not None:
        methods.append(TransformersMethod("hf-assisted", model, eos_token_ids, ignore_eos=ignore_eos,
                                          assistant=load_transformers_model(assistant_folder, device, dtype)))
    return methods


def load_transformers_model(folder, device: str = "cpu", dtype: str = "float32"):
    from transformers import AutoModelForCausalLM

    from specdec.runtime.loading import parse_dtype

    return AutoModelForCausalLM.from_pretrained(str(folder), dtype=parse_dtype(dtype)).to(device).eval()


LLAMA_CPP_INSTALL = ("pip install llama-cpp-python (a source build of about 10 minutes), "
                     "or pip install -e '.[llamacpp]' in this repository")


def llama_cpp_baseline(gguf_path: str, eos_token_ids: list[int], threads: int, ignore_eos: bool) -> list:
    """llama.cpp's plain decoding of the file (a child.py factory)."""
    return [LlamaCppMethod(gguf_path, eos_token_ids, threads=threads, ignore_eos=ignore_eos)]


class LlamaCppMethod:
    """llama.cpp's plain decoding on a GGUF file: greedy, or sampling with the same temperature,
    top-k, top-p and seed (its sampler and random numbers are its own, so sampled texts differ).
    Every call starts from an empty cache, as ours do: no prompt prefix is reused between calls."""

    kind = "llama.cpp"

    def __init__(self, gguf_path, eos_token_ids: list[int], threads: int, context: int = 4096,
                 ignore_eos: bool = False) -> None:
        try:
            from llama_cpp import Llama
        except ImportError:
            from specdec.errors import SpecdecError

            raise SpecdecError(f"--baseline llama.cpp needs llama-cpp-python: {LLAMA_CPP_INSTALL}") from None
        self.name = LLAMA_CPP
        self.eos = set() if ignore_eos else set(eos_token_ids)
        self.llm = Llama(model_path=str(gguf_path), n_threads=threads, n_ctx=context, verbose=False)

    def generate(self, prompt_ids: list[int], max_new_tokens: int, sampling: SamplingParams) -> Output:
        if sampling.greedy:
            options = {"temp": 0.0, "top_k": 1}
        else:
            self.llm.set_seed(sampling.seed if sampling.seed is not None else 0)
            options = {"temp": sampling.temperature, "top_k": sampling.top_k or 0, "top_p": sampling.top_p,
                       "min_p": 0.0, "repeat_penalty": 1.0}
        self.llm.reset()  # else llama-cpp-python reuses the cache of a previous call's common prefix
        out: list[int] = []
        for token in self.llm.generate(prompt_ids, reset=True, **options):
            out.append(int(token))
            if token in self.eos or len(out) >= max_new_tokens:
                break  # the end-of-sequence token kept, as our engine does
        return Output(out)
