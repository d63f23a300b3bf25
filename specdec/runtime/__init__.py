"""Models: the lean Llama-family runtime, its KV cache, loading, tokenizer, transformers adapter."""

from specdec.runtime.config import ModelConfig
from specdec.runtime.kv_cache import StaticKVCache
from specdec.runtime.llama import LlamaModel
from specdec.runtime.loading import DEFAULT_MODEL, LanguageModel, load_model

__all__ = ["DEFAULT_MODEL", "LanguageModel", "LlamaModel", "ModelConfig", "StaticKVCache", "load_model"]
