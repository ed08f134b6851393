"""The released JetLM/SDAR-*-Chat checkpoints (github JetAstra/SDAR, training/model/SDAR-*-Chat),
loaded as run.py loads a model: the family table's loader and packedss.models.load_tokenizer,
offline and without the release's code.

The directory written here has the release's files and keys with a tiny Qwen3 shape: config.json
(model_type "sdar", an auto_map to the release's modules, block_size 4, the mask id, one EOS id),
generation_config.json (the EOS list), model.safetensors.index.json over two bfloat16 shards with
the release's tensor names, a byte-level tokenizer (tokenizer.json, vocab.json, merges.txt) whose
special tokens follow Qwen's order, tokenizer_config.json naming Qwen2Tokenizer and the mask
`<|MASK|>`, added_tokens.json and special_tokens_map.json naming it `<MASK>`, and a Qwen3-style
chat_template.jinja. The release's Python modules are present as stubs that fail when imported.
Token ids are the release's shifted into the small vocabulary: <|endoftext|> (151643) is the
first id after the BPE tokens, <|im_start|> and <|im_end|> follow, and the mask is 26 ids after
<|endoftext|> (151669)."""

from __future__ import annotations

import builtins
import json
from dataclasses import dataclass
from pathlib import Path
from types import SimpleNamespace

import pytest
import torch
from hydra import compose, initialize_config_dir
from safetensors.torch import load_file, save_file

from packedss.config import register_configs
from packedss.decoding.calls import causal_segment, pack
from packedss.errors import PackedSSError
from packedss.families import FAMILIES
from packedss.job import job_spec, task_config_for
from packedss.models import load_tokenizer
from packedss.paths import CONF_DIR
from packedss.tasks.core import Question, build_prompt
from packedss.tasks.prompts import encode_prompt

SHAPE = {"hidden_size": 32, "intermediate_size": 64, "num_hidden_layers": 2, "num_attention_heads": 4,
         "num_key_value_heads": 2, "head_dim": 8}  # fmt: skip
# Qwen's special tokens from <|endoftext|> on, in order (151643, 151644, 151645, ...); the ids between
# <|im_end|> and the mask stand for Qwen's other special tokens (object refs, vision, tools, think).
SPECIALS = ["<|endoftext|>", "<|im_start|>", "<|im_end|>"] + [f"<|qwen_special_{i}|>" for i in range(3, 26)] + ["<|MASK|>"]
MASK_OFFSET = 151669 - 151643
SHARDS = ("model-00001-of-00002.safetensors", "model-00002-of-00002.safetensors")
RELEASE_MODULES = ("configuration_sdar.py", "modeling_sdar.py", "tokenization_qwen2.py", "tokenization_qwen2_fast.py",
                   "fused_linear_diffusion_cross_entropy.py")  # fmt: skip
CHAT_TEMPLATE = (
    "{%- for message in messages %}"
    "{{- '<|im_start|>' + message['role'] + '\\n' + message['content'] + '<|im_end|>' + '\\n' }}"
    "{%- endfor %}"
    "{%- if add_generation_prompt %}{{- '<|im_start|>assistant\\n' }}"
    "{%- if enable_thinking is defined and enable_thinking is false %}{{- '<think>\\n\\n</think>\\n\\n' }}{%- endif %}"
    "{%- endif %}"
)


@dataclass(frozen=True)
class Release:
    path: Path
    eot: int  # <|endoftext|>: config.json's bos/eos, the pad token
    im_start: int
    im_end: int
    mask: int
    vocab: int
    tensors: dict  # the release's tensor names -> the values written (bfloat16)


def _tokenizer(directory: Path) -> int:
    """A byte-level BPE tokenizer with the release's special tokens after its BPE ids; returns the
    id of <|endoftext|>."""
    from tokenizers import AddedToken, Tokenizer, decoders, models, pre_tokenizers, trainers

    tokenizer = Tokenizer(models.BPE())
    tokenizer.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tokenizer.decoder = decoders.ByteLevel()
    corpus = ["Tom has 3 apples and buys 4 more. How many apples does he have?", "system user assistant",
              "Please reason step by step, and put your final answer within \\boxed{}."] * 20  # fmt: skip
    trainer = trainers.BpeTrainer(vocab_size=320, initial_alphabet=pre_tokenizers.ByteLevel.alphabet(), show_progress=False)
    tokenizer.train_from_iterator(corpus, trainer)
    eot = tokenizer.get_vocab_size()
    tokenizer.add_special_tokens([AddedToken(token, special=True, normalized=False) for token in SPECIALS])
    tokenizer.save(str(directory / "tokenizer.json"))
    tokenizer.model.save(str(directory))  # vocab.json, merges.txt
    return eot


def _special(content: str) -> dict:
    return {"content": content, "lstrip": False, "normalized": False, "rstrip": False, "single_word": False, "special": True}


def _tokenizer_files(directory: Path, eot: int) -> None:
    ids = {token: eot + i for i, token in enumerate(SPECIALS)}
    config = {
        "add_bos_token": False,
        "add_prefix_space": False,
        "added_tokens_decoder": {str(i): _special(token) for token, i in ids.items()},
        "additional_special_tokens": ["<|im_start|>", "<|im_end|>", "<|MASK|>"],
        "auto_map": {"AutoTokenizer": ["tokenization_qwen2.Qwen2Tokenizer", None]},
        "bos_token": None,
        "clean_up_tokenization_spaces": False,
        "eos_token": "<|endoftext|>",
        "mask_token": "<|MASK|>",
        "errors": "replace",
        "model_max_length": 131072,
        "pad_token": "<|endoftext|>",
        "split_special_tokens": False,
        "tokenizer_class": "Qwen2Tokenizer",
        "unk_token": None,
    }
    (directory / "tokenizer_config.json").write_text(json.dumps(config, indent=2))
    added = {("<MASK>" if token == "<|MASK|>" else token): i for token, i in ids.items()}
    (directory / "added_tokens.json").write_text(json.dumps(added, indent=2))
    plain = {k: v for k, v in _special("<|endoftext|>").items() if k != "special"}
    special_map = {"additional_special_tokens": ["<|im_start|>", "<|im_end|>", "<MASK>"], "eos_token": plain, "pad_token": plain}
    (directory / "special_tokens_map.json").write_text(json.dumps(special_map, indent=2))
    (directory / "chat_template.jinja").write_text(CHAT_TEMPLATE)


def _config(eot: int, mask: int, vocab: int, tied: bool) -> dict:
    return {
        "architectures": ["SDARForCausalLM"],
        "auto_map": {"AutoConfig": "configuration_sdar.SDARConfig", "AutoModel": "modeling_sdar.SDARModel",
                     "AutoModelForCausalLM": "modeling_sdar.SDARForCausalLM"},  # fmt: skip
        "attention_bias": False,
        "attention_dropout": 0.0,
        "attn_implementation": "flex_attention",
        "bos_token_id": eot,
        "debug": False,
        "eos_token_id": eot,
        "block_size": 4,
        "mask_token_id": mask,
        "ep_size": 1,
        "fuse_cross_entropy": True,
        **SHAPE,
        "hidden_act": "silu",
        "initializer_range": 0.02,
        "max_position_embeddings": 32768,
        "max_window_layers": SHAPE["num_hidden_layers"],
        "micro_forward": False,
        "model_type": "sdar",
        "rms_norm_eps": 1e-06,
        "rope_scaling": None,
        "rope_theta": 1000000,
        "skip_checkpoint": False,
        "sliding_window": None,
        "tie_word_embeddings": tied,
        "torch_dtype": "bfloat16",
        "transformers_version": "4.52.4",
        "use_cache": False,
        "use_deepep": False,
        "use_sliding_window": False,
        "vocab_size": vocab,
    }


def _tensors(vocab: int, tied: bool, seed: int) -> dict[str, torch.Tensor]:
    """Random values under the release's tensor names; the norms around 1 and each one its own."""
    generator = torch.Generator().manual_seed(seed)
    hidden, inner, dim = SHAPE["hidden_size"], SHAPE["intermediate_size"], SHAPE["head_dim"]
    heads, kv = SHAPE["num_attention_heads"] * dim, SHAPE["num_key_value_heads"] * dim

    def matrix(*shape):
        return (torch.randn(*shape, generator=generator) * 0.3).to(torch.bfloat16)

    def norm(size):
        return (1 + 0.2 * torch.randn(size, generator=generator)).to(torch.bfloat16)

    tensors = {"model.embed_tokens.weight": matrix(vocab, hidden)}
    for n in range(SHAPE["num_hidden_layers"]):
        layer = f"model.layers.{n}."
        tensors |= {
            layer + "input_layernorm.weight": norm(hidden),
            layer + "post_attention_layernorm.weight": norm(hidden),
            layer + "self_attn.q_proj.weight": matrix(heads, hidden),
            layer + "self_attn.k_proj.weight": matrix(kv, hidden),
            layer + "self_attn.v_proj.weight": matrix(kv, hidden),
            layer + "self_attn.o_proj.weight": matrix(hidden, heads),
            layer + "self_attn.q_norm.weight": norm(dim),
            layer + "self_attn.k_norm.weight": norm(dim),
            layer + "mlp.gate_proj.weight": matrix(inner, hidden),
            layer + "mlp.up_proj.weight": matrix(inner, hidden),
            layer + "mlp.down_proj.weight": matrix(hidden, inner),
        }
    tensors["model.norm.weight"] = norm(hidden)
    if not tied:
        tensors["lm_head.weight"] = matrix(vocab, hidden)
    return tensors


def _write_shards(directory: Path, tensors: dict[str, torch.Tensor]) -> None:
    """The release's sharding: an index over two files, layer 0 and the embeddings in the first."""
    first = {k for k in tensors if k.startswith(("model.embed_tokens.", "model.layers.0."))}
    weight_map = {name: SHARDS[0] if name in first else SHARDS[1] for name in tensors}
    for shard in SHARDS:
        save_file({k: v for k, v in tensors.items() if weight_map[k] == shard}, str(directory / shard), metadata={"format": "pt"})
    total = sum(v.numel() * v.element_size() for v in tensors.values())
    index = {"metadata": {"total_size": total}, "weight_map": dict(sorted(weight_map.items()))}
    (directory / "model.safetensors.index.json").write_text(json.dumps(index, indent=2))


def write_release(directory: Path, tied: bool = False, seed: int = 0) -> Release:
    directory.mkdir(parents=True, exist_ok=True)
    eot = _tokenizer(directory)
    _tokenizer_files(directory, eot)
    mask = eot + MASK_OFFSET
    vocab = eot + len(SPECIALS) + 13  # padded past the tokenizer, as 151936 is past 151670
    (directory / "config.json").write_text(json.dumps(_config(eot, mask, vocab, tied), indent=2))
    generation = {"bos_token_id": eot, "do_sample": True, "eos_token_id": [eot + 2, eot], "pad_token_id": eot,
                  "temperature": 0.6, "top_k": 20, "top_p": 0.95, "transformers_version": "4.51.0"}  # fmt: skip
    (directory / "generation_config.json").write_text(json.dumps(generation, indent=2))
    for module in RELEASE_MODULES:  # the release's code: nothing here may run it
        (directory / module).write_text(f"raise RuntimeError('the release code {module} was imported')\n")
    tensors = _tensors(vocab, tied, seed)
    _write_shards(directory, tensors)
    return Release(directory, eot, eot + 1, eot + 2, mask, vocab, tensors)


@pytest.fixture()
def release(tmp_path) -> Release:
    return write_release(tmp_path / "SDAR-8B-Chat")


@pytest.fixture()
def no_remote_code(monkeypatch):
    """Fails on any attempt to run a checkpoint's own code, or to ask whether to (transformers asks
    on the terminal when a directory's auto_map names code and trust_remote_code is unset)."""
    import transformers.dynamic_module_utils as dynamic

    asked: list[str] = []

    def ask(prompt=""):
        asked.append(prompt)
        return "n"

    def refuse(*args, **kwargs):
        raise AssertionError(f"remote code requested: {args}")

    monkeypatch.setattr(builtins, "input", ask)
    monkeypatch.setattr(dynamic, "get_class_from_dynamic_module", refuse)
    monkeypatch.setattr(dynamic, "get_class_in_module", refuse)
    return asked


def load(path: Path, dtype: str = "float32"):
    """The adapter as run.py gets it: through the family table."""
    return FAMILIES["sdar"].load_adapter(path, "cpu", dtype)


def tokenizer_of(path: Path):
    return load_tokenizer(SimpleNamespace(name="sdar8b"), path)


def composed(overrides: list[str]):
    register_configs()
    with initialize_config_dir(config_dir=str(CONF_DIR), version_base="1.3"):
        return compose(config_name="config", overrides=overrides)


def rewrite_config(path: Path, **changes) -> None:
    config = json.loads((path / "config.json").read_text())
    for key, value in changes.items():
        if value is None:
            config.pop(key, None)
        else:
            config[key] = value
    (path / "config.json").write_text(json.dumps(config))


def drop_tensor(release: Release, name: str) -> None:
    index = json.loads((release.path / "model.safetensors.index.json").read_text())
    shard = release.path / index["weight_map"].pop(name)
    tensors = load_file(str(shard))
    del tensors[name]
    save_file(tensors, str(shard), metadata={"format": "pt"})
    (release.path / "model.safetensors.index.json").write_text(json.dumps(index))


def one_error(raised) -> str:
    message = str(raised.value)
    assert "\n" not in message, message
    return message


# The weights


def test_every_tensor_lands_where_its_name_says(release):
    model = load(release.path)
    state = {f"model.{k}": v for k, v in model.backbone.state_dict().items()} | {"lm_head.weight": model.head.weight}
    assert set(state) == set(release.tensors)
    for name, written in release.tensors.items():
        assert torch.equal(state[name], written.float()), name
    # the ones a renaming could confuse: same shapes, distinct values
    layer = model.backbone.layers[1]
    assert torch.equal(layer.self_attn.q_norm.weight, release.tensors["model.layers.1.self_attn.q_norm.weight"].float())
    assert torch.equal(layer.self_attn.k_norm.weight, release.tensors["model.layers.1.self_attn.k_norm.weight"].float())
    assert not torch.equal(layer.self_attn.q_norm.weight, layer.self_attn.k_norm.weight)
    assert torch.equal(model.head.weight, release.tensors["lm_head.weight"].float())
    assert not torch.equal(model.head.weight, model.backbone.embed_tokens.weight)
    assert model.dtype == torch.float32


def test_the_config_the_backbone_is_built_from(release):
    backbone = FAMILIES["sdar"].backbone_config(release.path)  # what the runner sizes caches with
    loaded = load(release.path).backbone.config
    for config in (backbone, loaded):
        assert (config.hidden_size, config.num_hidden_layers, config.head_dim, config.num_key_value_heads) == (32, 2, 8, 2)
        assert config.vocab_size == release.vocab
        assert config.rope_parameters["rope_theta"] == 1_000_000
        assert config.rms_norm_eps == 1e-6
        assert config._attn_implementation == "packedss"  # not the release's flex_attention
        assert not config.tie_word_embeddings


def test_ar_mode_equals_qwen3_on_the_same_tensors(release):
    """A causal prefill and cached AR steps give the logits of transformers' Qwen3ForCausalLM on the
    written tensors (config.json's use_cache false notwithstanding)."""
    from transformers import Qwen3Config, Qwen3ForCausalLM

    reference = Qwen3ForCausalLM(Qwen3Config(**SHAPE, vocab_size=release.vocab, rms_norm_eps=1e-6, tie_word_embeddings=False,
                                             rope_parameters={"rope_type": "default", "rope_theta": 1e6})).eval()  # fmt: skip
    reference.load_state_dict({k: v.float() for k, v in release.tensors.items()}, strict=True)
    tokens = torch.tensor([release.im_start, 7, 40, 41, 99, release.im_end, 12, 250])
    with torch.no_grad():
        expected = reference(tokens[None]).logits[0]
    model = load(release.path)
    model.reset()
    got = [model.run(pack([causal_segment(tokens[:5], 0)]))]
    model.commit(5)
    for i in range(5, len(tokens)):
        got.append(model.run(pack([causal_segment(tokens[i : i + 1], i)])))
        model.commit(1)
    torch.testing.assert_close(torch.cat(got), expected, rtol=1e-4, atol=1e-4)


def test_tied_variant_without_lm_head_loads(tmp_path):
    release = write_release(tmp_path / "SDAR-1.7B-Chat", tied=True, seed=1)
    assert "lm_head.weight" not in release.tensors
    model = load(release.path)
    assert torch.equal(model.head.weight, release.tensors["model.embed_tokens.weight"].float())
    assert model.backbone.config.tie_word_embeddings


# The ids and the block


def test_mask_eos_and_block_come_from_the_config_files(release):
    model = load(release.path)
    assert model.mask_token_id == release.mask  # config.json's mask_token_id (151669 in the release)
    # generation_config.json's list first (<|im_end|>, <|endoftext|>), then config.json's id (already in it)
    assert model.eos_token_ids == (release.im_end, release.eot)
    assert model.block_size == 4
    assert FAMILIES["sdar"].max_block(json.loads((release.path / "config.json").read_text())) is None  # not a limit


def test_the_mask_id_is_config_jsons_not_the_tokenizers(release):
    """The tokenizer names the mask <|MASK|> in one file and <MASK> in two others; config.json's id
    is the one the model runs on, whatever the tokenizer files say."""
    other = release.eot + 25
    rewrite_config(release.path, mask_token_id=other)
    assert load(release.path).mask_token_id == other
    for name in ("tokenizer_config.json", "added_tokens.json", "special_tokens_map.json"):
        (release.path / name).unlink()
    assert load(release.path).mask_token_id == other


def test_without_generation_config_the_eos_is_config_jsons(release):
    (release.path / "generation_config.json").unlink()
    assert load(release.path).eos_token_ids == (release.eot,)


# The tokenizer and the chat prompt


def test_tokenizer_loads_offline_without_the_release_code(release, hub_offline, no_remote_code):
    tokenizer = tokenizer_of(release.path)
    assert no_remote_code == [], "transformers asked whether to run the checkpoint's code"
    assert type(tokenizer).__name__ == "Qwen2Tokenizer"
    assert tokenizer.convert_tokens_to_ids(["<|endoftext|>", "<|im_start|>", "<|im_end|>", "<|MASK|>"]) == [
        release.eot, release.im_start, release.im_end, release.mask]  # fmt: skip
    assert tokenizer.eos_token_id == tokenizer.pad_token_id == release.eot
    assert tokenizer.bos_token_id is None


def test_chat_prompt_of_the_task_code(release, hub_offline, no_remote_code):
    tokenizer = tokenizer_of(release.path)
    cfg = composed(["model=sdar8b", f"model.path={release.path}", "task=gsm8k"])
    question = Question("q0", "Tom has 3 apples and buys 4 more. How many apples does he have?", 7)
    text = build_prompt(task_config_for(cfg), question, tokenizer=tokenizer, chat=cfg.model.chat)
    assert text == ("<|im_start|>user\nTom has 3 apples and buys 4 more. How many apples does he have?\n"
                    "Please reason step by step, and put your final answer within \\boxed{}.<|im_end|>\n"
                    "<|im_start|>assistant\n")  # fmt: skip
    ids = encode_prompt(tokenizer, text, chat=True)
    assert ids[0] == release.im_start  # no BOS added: the tokenizer has none
    assert (ids.count(release.im_start), ids.count(release.im_end)) == (2, 1)  # each special token is one id
    assert tokenizer.decode(ids) == text
    assert no_remote_code == []


def test_the_sdar8b_config_runs_on_the_release_layout(release, tmp_path, hub_offline, no_remote_code):
    """run.py's job assembly on model=sdar8b with the directory as model.path: the chat prompt, EOS
    ids with <|im_end|> (end_of_turn), the block B = W + 1 past the trained block, one record."""
    from packedss.records import read_records
    from packedss.runner import job_resources, run_job

    cfg = composed(["model=sdar8b", f"model.path={release.path}", "task=arith", "schedule=packed", "width=7",
                    "limit=1", "max_new_tokens=6", "warmup=false", f"out_dir={tmp_path / 'out'}"])  # fmt: skip
    job = job_spec(cfg)  # W = 7: blocks of 8 on a checkpoint trained with block 4
    resources = job_resources(job)
    assert resources.eos_token_ids[:2] == (release.im_end, release.eot)
    assert set(resources.eos_token_ids) == {release.im_end, release.eot}
    (prompt,) = resources.prompts.values()
    text = resources.tokenizer.decode(prompt.ids)
    assert text.startswith("<|im_start|>user\n") and text.endswith("<|im_end|>\n<|im_start|>assistant\n")
    result = run_job(cfg)
    assert result.written == 1
    (record,), bad = read_records(result.path)
    assert bad == [] and record["family"] == "sdar" and record["block"] == 8
    assert no_remote_code == []


# The model configs of the releases

RELEASE_PROMPT = "{question}\nPlease reason step by step, and put your final answer within \\boxed{}."


@pytest.mark.parametrize("name,size", [("sdar1.7b", "1.7B"), ("sdar4b", "4B"), ("sdar8b", "8B")])
def test_the_released_model_configs(name, size, tmp_path, hub_offline):
    cfg = composed([f"model={name}", "task=math500", f"out_dir={tmp_path / 'out'}"])
    model = cfg.model
    assert (model.name, model.family, model.hub_id, model.path, model.download) == (name, "sdar", f"JetLM/SDAR-{size}-Chat", None, False)
    assert model.chat and list(model.end_of_turn) == ["<|im_end|>"] and not model.lora
    # the release's evaluation (opencompass gsm8k_0shot_v2 and math_prm800k_500_0shot_cot): one user message
    assert dict(model.prompts) == {"gsm8k": RELEASE_PROMPT, "math500": RELEASE_PROMPT}
    assert task_config_for(cfg).prompt_chat == RELEASE_PROMPT
    other = composed([f"model={name}", "task=humaneval"])
    assert task_config_for(other).prompt_chat == other.task.prompt_chat
    # without the weights: one error naming how to provide them, before anything loads
    with pytest.raises(PackedSSError) as raised:
        job_spec(cfg)
    message = one_error(raised)
    assert f"model {name}: weights JetLM/SDAR-{size}-Chat are not available locally" in message
    assert "model.path=/local/dir" in message and "model.download=true" in message


# One clear error per problem


def test_missing_mask_token_id(release):
    rewrite_config(release.path, mask_token_id=None)  # the tokenizer still names <|MASK|>
    with pytest.raises(PackedSSError) as raised:
        load(release.path)
    assert "config.json is missing mask_token_id" in one_error(raised)


def test_missing_tensor_is_named(release):
    drop_tensor(release, "model.layers.1.self_attn.k_norm.weight")
    with pytest.raises(PackedSSError) as raised:
        load(release.path)
    assert "missing tensors: backbone.layers.1.self_attn.k_norm.weight" in one_error(raised)


def test_missing_head_when_untied_is_named(release):
    drop_tensor(release, "lm_head.weight")
    with pytest.raises(PackedSSError) as raised:
        load(release.path)
    assert "no LM head weight (expected lm_head.weight) and the embeddings are not tied" in one_error(raised)


def test_missing_shard_is_named(release):
    (release.path / SHARDS[1]).unlink()
    with pytest.raises(PackedSSError) as raised:
        load(release.path)
    assert f"shards listed in model.safetensors.index.json are missing: {SHARDS[1]}" in one_error(raised)


def test_foreign_layouts(tmp_path):
    from tests.conftest import write_random_nemotron

    nemotron = write_random_nemotron(tmp_path / "nemotron")  # encoder.* and diffusion_head
    with pytest.raises(PackedSSError) as raised:
        load(nemotron)
    assert "no backbone tensors found (expected names starting with model." in one_error(raised)

    from transformers import Qwen3Config, Qwen3ForCausalLM

    plain = tmp_path / "qwen3"  # a plain Qwen3 checkpoint: the right tensor names, but no mask token
    Qwen3ForCausalLM(Qwen3Config(**SHAPE, vocab_size=64)).save_pretrained(str(plain))
    with pytest.raises(PackedSSError) as raised:
        load(plain)
    assert "is missing mask_token_id" in one_error(raised)
