"""Configs of a few well-known Hugging Face models, so ``--model gpt2`` works offline.

Only the architecture matters to autotune (weights are random unless ``--pretrained``), so these
are the published ``config.json`` files' architecture fields. ``builtin_workloads.hf_config``
uses them when ``AutoConfig.from_pretrained`` cannot reach the Hub and the model is not in the
local cache.
"""

from __future__ import annotations

from typing import Any

_GPT2: dict[str, Any] = {
    "model_type": "gpt2",
    "architectures": ["GPT2LMHeadModel"],
    "activation_function": "gelu_new",
    "attn_pdrop": 0.1,
    "bos_token_id": 50256,
    "embd_pdrop": 0.1,
    "eos_token_id": 50256,
    "initializer_range": 0.02,
    "layer_norm_epsilon": 1e-05,
    "n_ctx": 1024,
    "n_embd": 768,
    "n_head": 12,
    "n_layer": 12,
    "n_positions": 1024,
    "resid_pdrop": 0.1,
    "vocab_size": 50257,
}

_BERT_BASE: dict[str, Any] = {
    "model_type": "bert",
    "architectures": ["BertForMaskedLM"],
    "attention_probs_dropout_prob": 0.1,
    "hidden_act": "gelu",
    "hidden_dropout_prob": 0.1,
    "hidden_size": 768,
    "initializer_range": 0.02,
    "intermediate_size": 3072,
    "layer_norm_eps": 1e-12,
    "max_position_embeddings": 512,
    "num_attention_heads": 12,
    "num_hidden_layers": 12,
    "pad_token_id": 0,
    "position_embedding_type": "absolute",
    "type_vocab_size": 2,
    "vocab_size": 30522,
}

KNOWN_CONFIGS: dict[str, dict[str, Any]] = {
    "gpt2": _GPT2,
    "openai-community/gpt2": _GPT2,
    "gpt2-medium": {**_GPT2, "n_embd": 1024, "n_head": 16, "n_layer": 24},
    "openai-community/gpt2-medium": {**_GPT2, "n_embd": 1024, "n_head": 16, "n_layer": 24},
    "distilgpt2": {**_GPT2, "n_layer": 6},
    "distilbert/distilgpt2": {**_GPT2, "n_layer": 6},
    "bert-base-uncased": _BERT_BASE,
    "google-bert/bert-base-uncased": _BERT_BASE,
    "roberta-base": {
        **_BERT_BASE,
        "model_type": "roberta",
        "architectures": ["RobertaForMaskedLM"],
        "bos_token_id": 0,
        "eos_token_id": 2,
        "layer_norm_eps": 1e-05,
        # 514 positions, of which the first two are the padding offset: 512 usable tokens.
        "max_position_embeddings": 514,
        "pad_token_id": 1,
        "type_vocab_size": 1,
        "vocab_size": 50265,
    },
}
"""Model id -> config dict (``model_type`` names the transformers config class)."""


def known_config(name: str) -> dict[str, Any] | None:
    """The shipped config dict for a model id, or None when autotune does not ship one."""
    config = KNOWN_CONFIGS.get(name)
    return dict(config) if config is not None else None
