"""Locally built stand-ins for real Hugging Face chat models (Qwen2.5, Llama 3.2, GPT-2), for tests.

The embedded `tiny` model has a character-level tokenizer with one end-of-sequence token, a BOS the
tokenizer prepends, a pad token and no chat template. The models users point `model.name_or_path`
at differ in every one of those ways, and each difference has broken RL pipelines before:

- byte-level BPE: tokens do not line up with characters, and the special tokens sit at the END of the
  vocabulary (as in the real files), after the learned merges;
- a chat template (ChatML for Qwen2, header/eot blocks for Llama 3) that the prompts stage renders;
- Llama 3's tokenizer prepends `<|begin_of_text|>` in its post-processor AND its chat template starts
  with `<|begin_of_text|>`: tokenizing the rendered chat prompt with special tokens added gives two BOS;
- Llama 3 (and GPT-2) have no pad token; the project sets pad = eos when missing;
- the checkpoint's generation_config lists MORE THAN ONE end-of-turn id (Qwen2.5: `<|im_end|>` and
  `<|endoftext|>`; Llama 3: `<|eot_id|>` and `<|end_of_text|>`), while `tokenizer.eos_token_id` is one;
- Qwen2.5 and Llama 3.2 use grouped-query attention (fewer KV heads than heads) and tied embeddings.

Nothing here downloads anything: the tokenizers are trained in about a second with the `tokenizers`
library on the project's own text and seeded word-like text (plus the first GSM8K rows when ../shared/datasets/gsm8k is there),
and the models are randomly initialised from a seed at a very small shape, so a whole micro pipeline
runs on them on a CPU. Plain functions, so unit tests and end-to-end tests can share them.
"""

from __future__ import annotations

import json
import random
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
GSM8K = REPO.parent / "shared" / "datasets" / "gsm8k" / "train.jsonl"

STYLES = ("qwen2", "llama3", "gpt2")
ARCHS = ("qwen2", "llama", "gpt2")
TOKENIZER_STYLE = {"qwen2": "qwen2", "llama": "llama3", "gpt2": "gpt2"}
VOCAB_SIZE = 1500  # learned tokens; the special tokens come on top

# The pre-tokenizer regexes of the real tokenizers: Qwen2 splits every digit, Llama 3 groups of 1-3
# digits, GPT-2 uses the ByteLevel pre-tokenizer's own regex (digits in runs).
QWEN2_PATTERN = (r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+")
LLAMA3_PATTERN = (r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+")

QWEN2_SYSTEM = "You are a helpful assistant."
# Qwen2.5's ChatML template without the tool-calling branches: a default system turn when the
# conversation has none, `<|im_start|>role\n...<|im_end|>\n` per turn, no BOS.
QWEN2_CHAT_TEMPLATE = (
    "{%- if messages[0]['role'] == 'system' %}"
    "{{- '<|im_start|>system\\n' + messages[0]['content'] + '<|im_end|>\\n' }}"
    "{%- else %}"
    "{{- '<|im_start|>system\\n" + QWEN2_SYSTEM + "<|im_end|>\\n' }}"
    "{%- endif %}"
    "{%- for message in messages %}"
    "{%- if not (message['role'] == 'system' and loop.first) %}"
    "{{- '<|im_start|>' + message['role'] + '\\n' + message['content'] + '<|im_end|>\\n' }}"
    "{%- endif %}"
    "{%- endfor %}"
    "{%- if add_generation_prompt %}{{- '<|im_start|>assistant\\n' }}{%- endif %}"
)

LLAMA3_SYSTEM = "Cutting Knowledge Date: December 2023\nToday Date: 26 Jul 2024\n\n"
# Llama 3.2's template without tools: it STARTS WITH bos_token (while the tokenizer's post-processor
# also prepends it), always a system header (dates, then the user's system message if any), then
# `<|start_header_id|>role<|end_header_id|>\n\n content<|eot_id|>` per turn.
LLAMA3_CHAT_TEMPLATE = (
    "{{- bos_token }}"
    "{%- if messages[0]['role'] == 'system' %}"
    "{%- set system_message = messages[0]['content'] | trim %}{%- set messages = messages[1:] %}"
    "{%- else %}{%- set system_message = '' %}{%- endif %}"
    "{{- '<|start_header_id|>system<|end_header_id|>\\n\\n' }}"
    "{{- '" + LLAMA3_SYSTEM.replace("\n", "\\n") + "' }}"
    "{{- system_message + '<|eot_id|>' }}"
    "{%- for message in messages %}"
    "{{- '<|start_header_id|>' + message['role'] + '<|end_header_id|>\\n\\n' + message['content'] | trim + '<|eot_id|>' }}"
    "{%- endfor %}"
    "{%- if add_generation_prompt %}{{- '<|start_header_id|>assistant<|end_header_id|>\\n\\n' }}{%- endif %}"
)

# Special tokens in the order the real vocabularies list them (after the learned tokens).
SPECIAL_TOKENS = {
    "qwen2": ["<|endoftext|>", "<|im_start|>", "<|im_end|>"],
    "llama3": ["<|begin_of_text|>", "<|end_of_text|>", "<|start_header_id|>", "<|end_header_id|>", "<|eot_id|>"],
    "gpt2": ["<|endoftext|>"],
}
# Every id the checkpoint's generation_config stops at, the tokenizer's eos_token first.
END_TOKENS = {"qwen2": ["<|im_end|>", "<|endoftext|>"], "llama3": ["<|eot_id|>", "<|end_of_text|>"], "gpt2": ["<|endoftext|>"]}

# Written into every saved folder's generation_config.json ON PURPOSE: settings no RL sampler may
# inherit. With them in effect, greedy decoding is no longer the argmax of the policy (the
# repetition penalty rescales the logits of every token already in the sequence), sampling at T=1
# collapses to greedy (top_k 1, temperature 0.05), and the stored log-probs no longer describe the
# distribution the tokens were drawn from. Real checkpoints carry milder versions of the same thing
# (Qwen2.5-Instruct: repetition_penalty 1.05, top_k 20, top_p 0.8, temperature 0.7).
# do_sample is true so that transformers' strict validation accepts the config: a model whose
# generation config was changed after loading (the Trainer sets its pad_token_id when the tokenizer
# pads with eos) refuses save_pretrained on a config it calls invalid; that case has its own set below.
ODD_GENERATION_DEFAULTS = {"do_sample": True, "top_k": 1, "top_p": 0.5, "temperature": 0.05, "repetition_penalty": 5.0}
# A config transformers' strict validation rejects (sampling flags with do_sample false), as
# Llama-2-chat shipped and many fine-tunes still do; loading warns, saving after a change raises.
STRICTLY_INVALID_GENERATION_DEFAULTS = {"do_sample": False, "temperature": 0.6, "top_p": 0.9, "top_k": 1}


def training_corpus(gsm8k_rows: int = 300, seed: int = 0) -> list[str]:
    """Text to learn merges from: the project's arithmetic data, chat scaffolding, and some GSM8K when present.

    The BPE only needs to be plausible (numbers, operators, English words, the chat templates'
    fixed text), not good; a few thousand short lines train a 1.5k vocabulary in about a second.
    """
    texts = []
    for line in (REPO / "data" / "raw" / "arithmetic_extra.jsonl").read_text().splitlines():
        if line.strip():
            row = json.loads(line)
            texts.append(f"{row['question']}{row['solution']}")
    spec = json.loads((REPO / "data" / "raw" / "math_problems.json").read_text())
    rng = random.Random(seed)
    for template in spec["templates"]:
        for _ in range(40):
            values = {name: rng.randint(low, high) for name, (low, high) in template.get("ranges", {}).items()}
            prompt = template["prompt"]
            for name, value in values.items():
                prompt = prompt.replace("{" + name + "}", str(value))
            texts.append(f"{prompt} {rng.randint(-9, 81)}")
    texts += [f"{rng.randint(0, 999)}{rng.choice('+-*/')}{rng.randint(0, 999)}={rng.randint(0, 9999)}" for _ in range(500)]
    texts += ["system\n" + QWEN2_SYSTEM, "user\n", "assistant\n", LLAMA3_SYSTEM, "system", "user", "assistant"] * 20
    # Word-like text of its own, so that the vocabulary fills up without GSM8K too (a clone without ../shared).
    syllables = [c + v for c in "bcdfghklmnprstvwz" for v in "aeiou"]
    texts += [" ".join("".join(rng.choices(syllables, k=rng.randint(1, 4))) for _ in range(12)) for _ in range(600)]
    if GSM8K.is_file():
        with GSM8K.open() as lines:
            for _, line in zip(range(gsm8k_rows), lines):
                row = json.loads(line)
                texts += [row["question"], row["answer"]]
    return texts


def build_bpe_tokenizer(style: str, vocab_size: int = VOCAB_SIZE):
    """A byte-level BPE `PreTrainedTokenizerFast` shaped like the real `style` tokenizer ("qwen2", "llama3", "gpt2").

    - qwen2: `<|endoftext|>`, `<|im_start|>`, `<|im_end|>`; no BOS; ChatML template; eos `<|im_end|>`,
      pad `<|endoftext|>` (as in Qwen2.5-Instruct's tokenizer_config.json).
    - llama3: `<|begin_of_text|>` prepended by a TemplateProcessing post-processor AND written by the
      chat template; eos `<|eot_id|>`; no pad token (Llama 3 has none).
    - gpt2: `<|endoftext|>` as bos and eos, nothing prepended, no pad, no chat template.
    """
    from tokenizers import AddedToken, Regex, Tokenizer, decoders, models, pre_tokenizers, processors, trainers
    from transformers import PreTrainedTokenizerFast

    if style not in STYLES:
        raise ValueError(f"style must be one of {STYLES}, not {style!r}")
    core = Tokenizer(models.BPE())
    if style == "gpt2":
        core.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    else:
        pattern = QWEN2_PATTERN if style == "qwen2" else LLAMA3_PATTERN
        core.pre_tokenizer = pre_tokenizers.Sequence([pre_tokenizers.Split(Regex(pattern), behavior="isolated"),
                                                      pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False)])
    core.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(vocab_size=vocab_size, min_frequency=2, show_progress=False,
                                  initial_alphabet=pre_tokenizers.ByteLevel.alphabet())
    core.train_from_iterator(training_corpus(), trainer=trainer)
    core.add_special_tokens([AddedToken(t, special=True, normalized=False) for t in SPECIAL_TOKENS[style]])  # ids after the merges
    byte_level = processors.ByteLevel(trim_offsets=False)
    if style == "llama3":
        bos = "<|begin_of_text|>"
        core.post_processor = processors.Sequence([
            byte_level,
            processors.TemplateProcessing(single=f"{bos}:0 $A:0", pair=f"{bos}:0 $A:0 {bos}:1 $B:1",
                                          special_tokens=[(bos, core.token_to_id(bos))]),
        ])
    else:
        core.post_processor = byte_level
    special = {
        "qwen2": {"eos_token": "<|im_end|>", "pad_token": "<|endoftext|>"},
        "llama3": {"bos_token": "<|begin_of_text|>", "eos_token": "<|eot_id|>"},
        "gpt2": {"bos_token": "<|endoftext|>", "eos_token": "<|endoftext|>", "unk_token": "<|endoftext|>"},
    }[style]
    tokenizer = PreTrainedTokenizerFast(tokenizer_object=core, model_max_length=32768, clean_up_tokenization_spaces=False, **special)
    if style != "gpt2":
        tokenizer.chat_template = QWEN2_CHAT_TEMPLATE if style == "qwen2" else LLAMA3_CHAT_TEMPLATE
    return tokenizer


def end_token_ids(tokenizer, style: str) -> list[int]:
    """The ids every generation must stop at for `style`, the tokenizer's own eos first."""
    return [tokenizer.convert_tokens_to_ids(t) for t in END_TOKENS[style]]


def model_config(arch: str, tokenizer, hidden_size: int = 64):
    """A very small config of `arch` ("qwen2", "llama", "gpt2") over `tokenizer`'s vocabulary.

    qwen2 and llama: 2 layers, 4 heads, 2 KV heads (GQA, like Qwen2.5 and Llama 3.2), tied embeddings
    (like Qwen2.5-0.5B and Llama-3.2-1B). gpt2: 2 layers, 2 heads, learned positions, LayerNorm.
    `eos_token_id` in the model config is the list of end-of-turn ids, as in Llama 3.2's config.json.
    """
    from transformers import GPT2Config, LlamaConfig, Qwen2Config

    style = TOKENIZER_STYLE[arch]
    ends = end_token_ids(tokenizer, style)
    common = dict(vocab_size=len(tokenizer), num_hidden_layers=2, max_position_embeddings=1024)
    if arch == "qwen2":
        return Qwen2Config(hidden_size=hidden_size, intermediate_size=2 * hidden_size, num_attention_heads=4, num_key_value_heads=2,
                           tie_word_embeddings=True, bos_token_id=tokenizer.convert_tokens_to_ids("<|endoftext|>"), eos_token_id=ends,
                           pad_token_id=tokenizer.pad_token_id, **common)
    if arch == "llama":
        return LlamaConfig(hidden_size=hidden_size, intermediate_size=2 * hidden_size, num_attention_heads=4, num_key_value_heads=2,
                           tie_word_embeddings=True, bos_token_id=tokenizer.bos_token_id, eos_token_id=ends, **common)
    if arch == "gpt2":
        return GPT2Config(vocab_size=len(tokenizer), n_embd=hidden_size // 2, n_layer=2, n_head=2, n_positions=1024,
                          bos_token_id=tokenizer.bos_token_id, eos_token_id=tokenizer.eos_token_id)
    raise ValueError(f"arch must be one of {ARCHS}, not {arch!r}")


def generation_config_dict(arch: str, tokenizer, defaults: dict | None = None) -> dict:
    """The generation_config.json of a saved folder: every end-of-turn id, plus `defaults` (ODD_GENERATION_DEFAULTS) on purpose."""
    style = TOKENIZER_STYLE[arch]
    config = {"eos_token_id": end_token_ids(tokenizer, style), **(ODD_GENERATION_DEFAULTS if defaults is None else defaults)}
    if tokenizer.bos_token_id is not None:
        config["bos_token_id"] = tokenizer.bos_token_id
    if tokenizer.pad_token_id is not None:
        config["pad_token_id"] = tokenizer.pad_token_id
    return config


def boost_token(model, tokenizer, token: int, scale: float) -> None:
    """Make `token` a likely next token of a random `model` at most positions, in place, keeping the model random.

    At initialisation every logit is within ~0.5 of 0 (near-uniform over the vocabulary), so a random
    model emits a given end id once in ~1500 tokens and a pipeline run never shows what happens after
    it. The token's output row (tied to its input embedding in these configs) is set along the mean
    final hidden state of some prompts: its logit becomes about scale * |h| * cos(h, mean), ~4 * scale
    on average with a spread, so it is sampled at some positions and not at others.
    """
    import torch

    texts = [f"{a}+{b}=" for a in range(5) for b in range(5)] + ["sum of 3 and 4?", "take 2 from 7:", "Natalia sold 48 clips"]
    if tokenizer.chat_template:
        texts = [tokenizer.apply_chat_template([{"role": "user", "content": t}], tokenize=False, add_generation_prompt=True) for t in texts]
    with torch.no_grad():
        hidden = torch.cat([model(**tokenizer(t, return_tensors="pt", add_special_tokens=False), output_hidden_states=True).hidden_states[-1][0]
                            for t in texts])
        direction = hidden.mean(0)
        model.get_output_embeddings().weight[token] = scale * direction / direction.norm()


def save_real_model(path: str | Path, arch: str, seed: int = 0, hidden_size: int = 64, generation_defaults: dict | None = None,
                    end_boost: float = 0.0) -> Path:
    """Save a random `arch` model ("qwen2", "llama", "gpt2") with its BPE tokenizer and generation config into `path`.

    The folder loads with AutoModelForCausalLM / AutoTokenizer.from_pretrained like a downloaded one.
    generation_config.json holds every end-of-turn id and `generation_defaults` (default
    ODD_GENERATION_DEFAULTS). It is written as JSON, not through GenerationConfig.save_pretrained,
    which refuses contradictory settings (STRICTLY_INVALID_GENERATION_DEFAULTS) that checkpoints in
    the wild nonetheless carry. `end_boost` > 0 makes the LAST end id of the generation config (Qwen2's
    `<|endoftext|>`, Llama's `<|end_of_text|>`: not the tokenizer's eos_token) a frequent sample
    (see boost_token), so end-to-end runs produce completions that stop on it.
    """
    import torch
    from transformers import AutoModelForCausalLM

    path = Path(path)
    tokenizer = build_bpe_tokenizer(TOKENIZER_STYLE[arch])
    config = model_config(arch, tokenizer, hidden_size)
    torch.manual_seed(seed)
    model = AutoModelForCausalLM.from_config(config)
    model.eval()
    if end_boost:
        boost_token(model, tokenizer, end_token_ids(tokenizer, TOKENIZER_STYLE[arch])[-1], end_boost)
    model.save_pretrained(path)
    tokenizer.save_pretrained(path)
    (path / "generation_config.json").write_text(json.dumps(generation_config_dict(arch, tokenizer, generation_defaults), indent=2) + "\n")
    return path


def real_vocab_qwen2_config():
    """A Qwen2Config with Qwen2.5's real 151,936-token vocabulary but hidden size 64 and 2 layers.

    For memory measurements: logits and log-softmax over the full vocabulary dominate the memory of
    rollouts and training at small widths (batch x length x 151,936 floats), which a 1.5k test
    vocabulary hides. Builds in seconds (~10M parameters, nearly all in the embedding); needs no tokenizer.
    """
    from transformers import Qwen2Config

    return Qwen2Config(vocab_size=151936, hidden_size=64, intermediate_size=128, num_hidden_layers=2, num_attention_heads=4,
                       num_key_value_heads=2, max_position_embeddings=1024, tie_word_embeddings=True,
                       bos_token_id=151643, eos_token_id=[151645, 151643], pad_token_id=151643)


def expected_prompt_ids(tokenizer, text: str) -> list[int]:
    """The ids the policy must be given for prompt `text`: its tokens with the tokenizer's BOS exactly once.

    The tokenizer adds its special tokens unless the text already starts with the BOS text (a Llama 3
    chat prompt does: its template writes `<|begin_of_text|>`); adding them then would double the BOS.
    """
    bos = tokenizer.bos_token
    if bos is not None and text.startswith(bos):
        return tokenizer(text, add_special_tokens=False)["input_ids"]
    return tokenizer(text)["input_ids"]


def leading_count(ids: list[int], token: int | None) -> int:
    """How many times `token` repeats at the start of `ids` (2 for a doubled BOS)."""
    count = 0
    while token is not None and count < len(ids) and ids[count] == token:
        count += 1
    return count


# A random model never writes a right answer (nor, over a BPE vocabulary, many digits), so every
# group's rewards would be equal and the reward_signal guard would rightly stop a pipeline run before
# training. The decoded length differs between samples of one prompt: a signal GRPO can use. Appended
# to the micro project's reward module by the end-to-end tests that run on these models.
LENGTH_REWARD = '''

def text_length(completions, **kwargs):
    return [len(c) / (len(c) + 8) for c in completions]
'''
