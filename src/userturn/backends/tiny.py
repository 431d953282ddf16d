"""A tiny, deterministic, real transformers chat model built in-process (no download).

Two Qwen2 layers (hidden 64) with a byte-level BPE tokenizer trained here on a fixed corpus and a
ChatML chat template. Its weights are random (seeded), so its text is nonsense, but it exercises
every real code path: tokenization, the template, left-padded batched generation, stop markers,
sampling with seeds. Built in well under a second and byte-identical on rebuild.
"""

from __future__ import annotations

import json
from pathlib import Path

CHATML_TEMPLATE = (
    "{% for message in messages %}"
    "{{ '<|im_start|>' + message['role'] + '\n' + message['content'] + '<|im_end|>' + '\n' }}"
    "{% endfor %}"
    "{% if add_generation_prompt %}{{ '<|im_start|>assistant\n' }}{% endif %}"
)
SPECIAL_TOKENS = ["<|endoftext|>", "<|im_start|>", "<|im_end|>"]
_CORPUS = (
    "A farmer has 12 apples and buys 30 more. How many apples does he have now? "
    "He has 12 + 30 = 42 apples. The answer is 42. Thank you! Why did you add 30? "
    "Can you explain the second step? What is the total cost of the tickets? "
    "The user asked a question and the assistant answered it step by step. "
    "Sarah reads 25 pages a day for 7 days, so she reads 25 * 7 = 175 pages. "
    "Write a short poem about the sea. Please list three colours of the rainbow. "
)


def build_tiny_model(folder: Path) -> Path:
    """Write the tiny model (config, weights, tokenizer, template) into ``folder``."""
    import torch
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
    from transformers import (
        GenerationConfig,
        PreTrainedTokenizerFast,
        Qwen2Config,
        Qwen2ForCausalLM,
    )

    bpe = Tokenizer(models.BPE())
    bpe.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    bpe.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=400,
        special_tokens=SPECIAL_TOKENS,
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    bpe.train_from_iterator([_CORPUS] * 20, trainer=trainer)
    tokenizer = PreTrainedTokenizerFast(
        tokenizer_object=bpe,
        bos_token=None,
        eos_token="<|im_end|>",
        pad_token="<|endoftext|>",
        additional_special_tokens=["<|im_start|>"],
    )
    tokenizer.chat_template = CHATML_TEMPLATE
    vocab = tokenizer.get_vocab()
    config = Qwen2Config(
        vocab_size=len(vocab),
        hidden_size=64,
        intermediate_size=128,
        num_hidden_layers=2,
        num_attention_heads=1,  # head size 64: loadable by fused attention kernels too
        num_key_value_heads=1,
        max_position_embeddings=2048,
        tie_word_embeddings=False,  # tied random embeddings make the model emit only newlines
        eos_token_id=vocab["<|im_end|>"],
        pad_token_id=vocab["<|endoftext|>"],
        bos_token_id=None,
    )
    torch.manual_seed(0)
    model = Qwen2ForCausalLM(config).to(torch.float32).eval()
    # Stray bytes and control tokens make unreadable output; keep printable text and <|im_end|>.
    suppress = sorted(i for token, i in vocab.items() if _unreadable(tokenizer.decode([i]), token))
    model.generation_config = GenerationConfig(
        eos_token_id=config.eos_token_id,
        pad_token_id=config.pad_token_id,
        suppress_tokens=suppress,
    )
    folder.mkdir(parents=True, exist_ok=True)
    model.save_pretrained(folder)
    tokenizer.save_pretrained(folder)
    (folder / "userturn.json").write_text(json.dumps({"built_by": "userturn.tiny", "version": 1}))
    return folder


def _unreadable(text: str, token: str) -> bool:
    if token in ("<|endoftext|>", "<|im_start|>"):
        return True
    return not text or "\ufffd" in text or not all(c.isprintable() or c == " " for c in text) \
        or (len(text) == 1 and not text.isalnum())


def add_end_token(folder: Path, token: str, replaces: int) -> Path:
    """Give a built tiny model a second end-of-generation token, for tests of the backends'
    stopping: ``token`` joins the generation config's EOS ids, is no longer suppressed, and takes
    over the output row of token id ``replaces`` (their lm_head rows are swapped), so the model
    writes ``token`` exactly where it would have written ``replaces``. The tiny model itself is
    left as it is: this rewrites a copy in ``folder``."""
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(folder)
    model = AutoModelForCausalLM.from_pretrained(folder, dtype=torch.float32)
    end = tokenizer.convert_tokens_to_ids(token)
    with torch.no_grad():
        rows = model.lm_head.weight
        rows[[end, replaces]] = rows[[replaces, end]].clone()
    config = model.generation_config
    config.eos_token_id = [config.eos_token_id, end] if isinstance(config.eos_token_id, int) \
        else [*config.eos_token_id, end]
    config.suppress_tokens = [i for i in config.suppress_tokens if i != end]
    model.save_pretrained(folder)
    return folder
