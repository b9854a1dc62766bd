"""The embedded vision-language policy: images as tokens and pixels through sampling, log-probs and a training round."""

from __future__ import annotations

import io
import re

import pyarrow as pa
import pytest
import torch
import yaml
from PIL import Image

from rl_assets.core.config import ModelParams
from rl_assets.core.logprobs import completion_logprobs
from rl_assets.core.params_file import load_params
from rl_assets.core.policy import load_base_model, load_policy
from rl_assets.core.tokenizer import saved_processor, tokens_per_image
from rl_assets.core.vision import encode_with_images, folder_is_vision_model, pixel_inputs, placeholder_ids, tiny_processor
from rl_assets.data.image_tasks import count_shapes
from rl_assets.rollout.generation import generate

SHAPE = {"tiny": {"hidden_size": 32, "num_layers": 2, "num_heads": 2, "intermediate_size": 64},
         "vision": {"image_size": 32, "patch_size": 8, "hidden_size": 32, "num_layers": 1, "num_heads": 2}}


@pytest.fixture(scope="module")
def vlm():
    model, tokenizer = load_base_model(ModelParams(name_or_path="tiny", **SHAPE), seed=0)
    model.eval()
    return model, tokenizer, tiny_processor(tokenizer, model.config)


def pictures(count: int) -> tuple[list[str], list[list]]:
    rows = count_shapes(count, seed=0)
    return [row["prompt"] for row in rows], [[Image.open(io.BytesIO(row["image"])).convert("RGB")] for row in rows]


def test_the_embedded_vlm_expands_its_placeholder_into_one_token_per_patch(vlm):
    model, tokenizer, processor = vlm
    texts, images = pictures(2)
    ids, vision = encode_with_images(processor, [tokenizer.image_token + texts[0], texts[1]], [images[0], []])
    image_token = tokenizer.convert_tokens_to_ids(tokenizer.image_token)
    assert model.config.image_token_id == image_token and placeholder_ids(model.config) == [image_token]
    assert ids[0].count(image_token) == (32 // 8) ** 2 and ids[0][0] == tokenizer.bos_token_id and ids[0][1] == image_token
    assert image_token not in ids[1] and vision[1] == {}
    assert vision[0]["pixel_values"].shape == (1, 3, 32, 32)
    # training reads the stored ids and makes the pixels again: the same tensors
    assert torch.equal(pixel_inputs(processor, [images[0]])[0]["pixel_values"], vision[0]["pixel_values"])


def test_sampling_sees_the_image_and_the_stored_logprobs_are_the_models(vlm):
    model, tokenizer, processor = vlm
    texts, images = pictures(3)
    prompts = [tokenizer.image_token + text for text in texts]
    out = generate(model, tokenizer, prompts, 2, greedy=False, temperature=1.0, max_new_tokens=6, batch_size=4, seed=0,
                   images=images, processor=processor)
    assert len(out.vision) == 6 and out.vision[0] is out.vision[1]  # a prompt's samples share its pixels
    image_token = model.config.image_token_id
    assert not any(image_token in ids for ids in out.completion_ids)  # a placeholder is never sampled
    with torch.no_grad():
        logprobs, mask = completion_logprobs(model, out.prompt_ids, out.completion_ids, tokenizer.pad_token_id, vision=out.vision)
        # the first completion token's log-prob, from a plain forward of the prompt with its pixels
        ids = torch.tensor([out.prompt_ids[0]])
        plain = model(input_ids=ids, pixel_values=out.vision[0]["pixel_values"]).logits[0, -1].log_softmax(-1)
        assert logprobs[0, 0].item() == pytest.approx(plain[out.completion_ids[0][0]].item(), abs=1e-5)
        # the same tokens after another picture: other log-probs (the policy reads the pixels)
        swapped, _ = completion_logprobs(model, out.prompt_ids, out.completion_ids, tokenizer.pad_token_id, vision=out.vision[2:4] * 3)
    assert (swapped[:2] - logprobs[:2]).abs().max().item() > 1e-3
    # greedy decoding with the cache equals decoding by full forwards
    greedy = generate(model, tokenizer, prompts[:1], 1, greedy=True, max_new_tokens=5, images=images[:1], processor=processor)
    ids = list(greedy.prompt_ids[0])
    with torch.no_grad():
        for _ in range(len(greedy.completion_ids[0])):
            logits = model(input_ids=torch.tensor([ids]), pixel_values=greedy.vision[0]["pixel_values"]).logits[0, -1]
            logits[image_token] = float("-inf")
            ids.append(int(logits.argmax()))
    assert ids[len(greedy.prompt_ids[0]):] == greedy.completion_ids[0]


@pytest.mark.parametrize("override, message", [
    ("train.algorithm=ppo train.ppo.critic_init=reward_model", "critic_init: reward_model reads text only, and the policy reads images"),
])
def test_what_does_not_take_images_yet_is_refused_up_front(tmp_path, override, message):
    from rl_assets.core.config import ParamsError

    path = tmp_path / "params.yaml"
    path.write_text(yaml.safe_dump({"model": {"name_or_path": "tiny", "vision": {}}, "train": {"drop_equal_reward_groups": False},
                                    "raw_data": {"sources": [{"kind": "python", "function": "rl_assets.data.image_tasks:count_shapes",
                                                              "count": 10, "columns": {"image": "image"}}]},
                                    "rewards": {"functions": [{"name": "arithmetic_answer"}]}}))
    with pytest.raises(ParamsError, match=message):
        load_params(path, overrides=override.split())


def test_vision_shapes_only_the_embedded_model():
    with pytest.raises(ValueError, match="vision shapes the embedded model only"):
        ModelParams(name_or_path="some/hub-model", vision={})
    with pytest.raises(ValueError, match="patch_size=5 must divide image_size=32"):
        ModelParams(vision={"image_size": 32, "patch_size": 5})


@pytest.mark.e2e  # a whole round per policy
@pytest.mark.parametrize("policy", ["embedded", "folder", "smolvlm folder", "frozen vision", "dpo", "rft", "ppo", "environment"])
def test_a_micro_vlm_round_samples_scores_trains_and_evaluates_with_the_images(tmp_path, policy, vlm):
    """count_shapes through raw_data, prompts, r00, one round and the evaluation, stage by stage: the embedded VLM warm-started
    on the images, or a VLM folder with a processor of its own (as a hub VLM comes), which every checkpoint keeps; GRPO,
    DPO and RFT through TRL's vision collators, or PPO with a value model that sees the images too."""
    from rl_assets.core.checkpoints import read_lineage
    from rl_assets.core.paths import IMAGES, data_dir, output_path
    from rl_assets.core.vision import VISION_MODULES
    from rl_assets.core.schemas import PROMPTS, RAW_DATA, read_table, write_table
    from rl_assets.core.logprobs import completion_values
    from rl_assets.core.tokenizer import load_tokenizer
    from rl_assets.data.images import open_images
    from rl_assets.data.prompts import build_prompts
    from rl_assets.train.critic import load_critic
    from rl_assets.data.raw_data import load_raw_data
    from rl_assets.run.loaded import Loaded
    from rl_assets.run.stages import run_stage

    model = {"name_or_path": "tiny", **SHAPE}
    algorithm = policy if policy in ("dpo", "rft", "ppo") else "grpo"
    folder_vlm = {"folder": vlm, "smolvlm folder": tiny_idefics3() if policy == "smolvlm folder" else None}.get(policy)
    if folder_vlm is not None:
        folder = tmp_path / "my-vlm"
        folder_vlm[0].save_pretrained(folder)
        folder_vlm[2].save_pretrained(folder)  # the processor and its tokenizer
        model = {"name_or_path": str(folder)}
    params_file = tmp_path / "params.yaml"
    params_file.write_text(yaml.safe_dump({
        "seed": 0, "rounds": 2 if policy == "ppo" else 1, "compute": {"nproc": 1, "device": "cpu"},
        "model": model,
        "raw_data": {"sources": [{"kind": "python", "function": "rl_assets.data.image_tasks:count_shapes", "count": 40,
                                  "columns": {"image": "image"}}]},
        "prompts": {"eval_fraction": 0.25, "sft_fraction": 0.3, "max_prompt_tokens": 96},
        "sft": {"enabled": policy == "embedded", "max_steps": 6, "batch_size": 4, "learning_rate": 3.0e-3},
        "rollouts": {"prompts_per_round": 6, "samples_per_prompt": 4, "max_new_tokens": 3, "batch_size": 32,
                     **({"environment": {"name": "guess_the_number", "options": {"low": 1, "high": 6}}, "max_turns": 3}
                        if policy == "environment" else {})},
        "rewards": {"functions": [{"name": "arithmetic_answer", "weight": 1.0},  # a digit anywhere: rewards that differ from the first round
                                  {"name": "format_regex", "weight": 1.0, "options": {"pattern": "[0-9]", "search": True}}]},
        "train": {"algorithm": algorithm, "learning_rate": 1.0e-2, "epochs": 1, "minibatch_size": 8, "freeze_vision": policy == "frozen vision",
                  "dpo": {"batch_size": 2}, "rft": {"batch_size": 2, "top_k": 2}},
        "evaluation": {"max_prompts": 6, "samples_per_prompt": 2, "max_new_tokens": 3},
        "guards": {"kl_max": 100.0, "entropy_min": 0.0},
    }))
    params = load_params(params_file)
    data = data_dir(params.experiment, tmp_path)
    raw, _ = load_raw_data(params.raw_data, params.seed, tmp_path, images_dir=data / IMAGES)
    write_table(raw, output_path("raw_data", data), RAW_DATA, "raw_data")
    prompts, _ = build_prompts(raw, params.prompts, load_tokenizer(params.model), image_tokens=tokens_per_image(params.model),
                               images_dir=data / IMAGES)
    write_table(prompts, output_path("prompts", data), PROMPTS, "prompts")
    assert all(p.startswith("<image>How many") for p in prompts["prompt"].to_pylist())  # one placeholder before the text

    loaded = Loaded()
    metadata = {stage: run_stage(stage, params, round_number, tmp_path, loaded)[0]
                for stage, round_number in (("sft", None), ("rollouts", 1), ("rewards", 1), ("train", 1), ("critic", 1))
                if stage != "critic" or algorithm == "ppo"}
    if algorithm == "ppo":  # a second round: its advantages and value targets come from r01's value model
        metadata.update({f"{stage}2": run_stage(stage, params, 2, tmp_path, loaded)[0] for stage in ("rollouts", "rewards", "train", "critic")})
    run_stage("evaluation", params, None, tmp_path, loaded)
    # the rollouts' materialization shows each sample's picture beside its prompt and completion, by the URL `rl-assets serve` answers
    samples = metadata["rollouts"]["samples"]["raw_value"]
    assert samples.startswith("| image | prompt | completion | answer |") and "&lt;image>How many" in samples
    shown = re.findall(r"!\[([0-9a-f]{12})\]\(http://127\.0\.0\.1:8000/images/([0-9a-f]{64})\.png\)", samples)
    assert len(shown) == 8 and all(short == full[:12] and (data / "images" / f"{full}.png").is_file() for short, full in shown)
    assert len({full for _, full in shown}) > 1  # several prompts' pictures, two samples each
    r00, r01 = output_path("r00/checkpoint", data), output_path("r01/checkpoint", data)
    assert folder_is_vision_model(r00) and folder_is_vision_model(r01)
    if policy == "embedded":  # the warm start read the pictures and fitted the answers
        sft = read_lineage(r00)["metrics"]
        assert sft["sft_steps"] == 6 and sft["sft_loss_last"] < sft["sft_loss_first"]
    if folder_vlm is not None:
        assert type(saved_processor(r00)) is type(saved_processor(r01)) is type(folder_vlm[2])
    else:
        assert saved_processor(r01) is None  # the embedded VLM's, made from the config and tokenizer again
    rollouts = read_table(output_path("r01/rollouts", data), "rollouts")
    shown = rollouts["image_ids"].to_pylist()
    assert all(len(ids) == 1 for ids in shown)
    image_token = load_policy(r00)[0].config.image_token_id
    per_image = 4 if policy == "smolvlm folder" else 16
    assert all(ids.count(image_token) == per_image for ids in rollouts["prompt_ids"].to_pylist())
    length = dict(zip(prompts["prompt_id"].to_pylist(), prompts["n_tokens"].to_pylist()))  # the image's tokens counted, not 1
    assert all(length[pid] == len(ids) for pid, ids in zip(rollouts["prompt_id"].to_pylist(), rollouts["prompt_ids"].to_pylist()))
    if policy == "environment":  # turns after the first: the game's answers, tokens the policy did not write, after the picture
        masks = rollouts["completion_mask"].to_pylist()
        assert max(rollouts["num_turns"].to_pylist()) > 1 and any(0 in mask for mask in masks)
    metrics = read_lineage(r01)["metrics"]
    if algorithm in ("grpo", "ppo"):
        assert metrics["steps"] == 3 and metrics["grad_norm"] > 0 and metrics["equal_reward_group_share"] < 1
        # training recomputed the stored log-probs with the same pixels: the first step's ratio is 1
        assert abs(read_lineage(r01)["history"][0]["kl_old"]) < 1e-5
    else:  # TRL's trainers read what sampling saw: its prompt ids (placeholders expanded, BOS once) and the pixels
        assert metrics["steps"] >= 1 and metrics["pairs" if algorithm == "dpo" else "kept"] >= 1 and metrics["kl"] > 0
        assert_trl_reads_the_sampled_ids(algorithm, rollouts, read_table(output_path("r01/rewards", data), "rewards"), data, params)
    # the vision tower trained: its weights moved in the round
    before, after = load_policy(r00)[0], load_policy(r01)[0]
    moved = {name for name, p in before.named_parameters() if not torch.equal(p, after.get_parameter(name))}
    tower = {name for name, _ in before.named_parameters() if set(name.split(".")) & set(VISION_MODULES)}
    assert tower and moved - tower  # the language model moved
    assert (moved & tower) if policy != "frozen vision" else not (moved & tower)  # train.freeze_vision keeps them
    evaluation = read_table(data / "evaluation.parquet", "evaluation")
    assert sorted(set(evaluation["checkpoint"].to_pylist()))[:2] == ["r00/checkpoint", "r01/checkpoint"]
    if algorithm == "ppo":
        assert_the_value_model_sees_the_images(data, rollouts, metadata["critic"], vlm)
        # round 2's value targets are r01's value model's estimates with each rollout's picture
        second = read_table(output_path("r02/rollouts", data), "rollouts")
        pixels = pixel_inputs(vlm[2], open_images(second["image_ids"].to_pylist(), data / IMAGES))
        critic = load_critic(output_path("r01/critic", data))
        with torch.no_grad():
            seen, mask = completion_values(critic, second["prompt_ids"].to_pylist(), second["completion_ids"].to_pylist(), 0, vision=pixels)
            blind, _ = completion_values(critic, second["prompt_ids"].to_pylist(), second["completion_ids"].to_pylist(), 0)
        assert metadata["critic2"]["value_mean"] == pytest.approx(float((seen * mask).sum() / mask.sum()), abs=1e-5)
        assert metadata["critic2"]["value_mean"] != pytest.approx(float((blind * mask).sum() / mask.sum()), abs=1e-5)


@pytest.mark.parametrize("frozen", [False, True])
def test_lora_on_a_vlm_puts_adapters_on_the_vision_tower_unless_it_is_frozen(tmp_path, vlm, frozen):
    from rl_assets.core.checkpoints import save_checkpoint
    from rl_assets.core.config import LoraParams
    from rl_assets.core.policy import load_trainable_policy

    save_checkpoint(vlm[0], vlm[1], tmp_path / "r00", {"round": 0})
    model, _ = load_trainable_policy(tmp_path / "r00", LoraParams(enabled=True, r=2), tmp_path / "r00", freeze_vision=frozen)
    adapted = {name.split(".lora_")[0] for name, _ in model.named_parameters() if ".lora_" in name}
    in_tower = {name for name in adapted if ".vision_tower." in name or ".multi_modal_projector." in name}
    assert any(".language_model." in name for name in adapted)
    assert not in_tower if frozen else in_tower
    assert all(".lora_" in name for name, p in model.named_parameters() if p.requires_grad)


def test_a_resumed_vlm_round_ends_with_the_weights_of_an_uninterrupted_one(vlm, tmp_path):
    """sample_rollouts shows each prompt its stored picture; a round saved every 2 steps and rerun resumes to the same weights."""
    import copy


    from rl_assets.core.config import RolloutsParams, TrainParams
    from rl_assets.core.schemas import PROMPTS, rewards_schema
    from rl_assets.data.images import image_id, open_images, store_images
    from rl_assets.rollout.sampling import sample_rollouts
    from rl_assets.train.policy_gradient import train_on_rollouts
    from rl_assets_support import prompts_table

    model, tokenizer, processor = vlm
    rows = count_shapes(2, seed=1)
    ids = [image_id(row["image"]) for row in rows]
    store_images({i: (row["image"], "png") for i, row in zip(ids, rows)}, tmp_path / "images")
    table = prompts_table([(tokenizer.image_token + row["prompt"], row["answer"]) for row in rows])
    prompts = pa.Table.from_pylist([{**r, "image_ids": [i]} for r, i in zip(table.to_pylist(), ids)], schema=PROMPTS)
    rollouts = sample_rollouts(model, tokenizer, prompts, RolloutsParams(prompts_per_round=2, samples_per_prompt=2, max_new_tokens=3),
                               round_number=1, seed=0, policy_id="p0", prompts_hash="h", progress=False, images_dir=tmp_path / "images",
                               processor=processor)
    assert sorted(map(tuple, rollouts["image_ids"].to_pylist())) == sorted([(i,) for i in ids for _ in range(2)])
    vision = pixel_inputs(processor, open_images(rollouts["image_ids"].to_pylist(), tmp_path / "images"))
    rewards = pa.table({**{k: rollouts[k] for k in ("round", "prompt_id", "sample_idx", "policy_id")}, "reward": [1.0, 0.0, 0.3, 0.9],
                        "reward_config_hash": ["c"] * 4, "rollouts_hash": ["h"] * 4}, schema=rewards_schema([]))
    params = TrainParams(learning_rate=1e-2, epochs=3, minibatch_size=2, save_steps=2, keep_last=2)
    fingerprint = {"train": {}, "inputs": {}, "parent": "p0", "world_size": 1, "seed": 0}

    def run(state_dir):
        trained, metrics, history, _ = train_on_rollouts(copy.deepcopy(model), rollouts, rewards, params,
                                                   group_size=2, temperature=1.0, pad_id=tokenizer.pad_token_id, seed=0, max_new_tokens=3,
                                                   state_dir=state_dir, fingerprint=fingerprint, progress=False, vision=vision)
        return trained.state_dict(), metrics, history

    uninterrupted, metrics, history = run(None)
    run(tmp_path / "state")  # leaves states at steps 2 and 4
    resumed, resumed_metrics, _ = run(tmp_path / "state")
    assert metrics["steps"] == 6 and resumed_metrics["resumed_from_step"] == 4
    assert abs(history[0]["kl_old"]) < 1e-5  # the stored log-probs were the policy's with these pixels: the first ratio is 1
    assert all(torch.equal(uninterrupted[k], resumed[k]) for k in uninterrupted)


def test_trls_fused_head_gives_a_vlm_the_same_logprobs_as_its_plain_logits(vlm, monkeypatch):
    """Past PLAIN_LOGITS_MAX (and on GPUs) log-probs come from TRL's fused LM head patched onto the model: with the pixels too."""
    import copy

    import rl_assets.core.logprobs as logprobs

    model, tokenizer, processor = vlm
    texts, images = pictures(2)
    out = generate(model, tokenizer, [tokenizer.image_token + t for t in texts], 2, greedy=False, temperature=1.0, max_new_tokens=4,
                   images=images, processor=processor)
    with torch.no_grad():
        plain, mask = completion_logprobs(model, out.prompt_ids, out.completion_ids, tokenizer.pad_token_id, 0.7, vision=out.vision)
        monkeypatch.setattr(logprobs, "PLAIN_LOGITS_MAX", 0)
        fused_model = copy.deepcopy(model)  # the fused head patches the instance
        fused, _ = completion_logprobs(fused_model, out.prompt_ids, out.completion_ids, tokenizer.pad_token_id, 0.7, vision=out.vision)
        swapped, _ = completion_logprobs(fused_model, out.prompt_ids, out.completion_ids, tokenizer.pad_token_id, 0.7, vision=out.vision[::-1])
    assert getattr(fused_model, "_rl_assets_fused", None) is not None
    assert torch.allclose(plain * mask, fused * mask, atol=1e-5)
    assert (swapped - fused).abs().max().item() > 1e-3  # the fused pass reads the pixels as well


def assert_trl_reads_the_sampled_ids(algorithm, rollouts, rewards, data, params):
    """TRL's vision collator, given the round's DPO pairs or RFT picks, gives each example the prompt ids sampling
    stored (and pixels), then the completion's ids where its text tokenizes back to them."""
    from trl.trainer.dpo_trainer import DataCollatorForVisionPreference
    from trl.trainer.sft_trainer import DataCollatorForVisionLanguageModeling

    from rl_assets.core.paths import IMAGES
    from rl_assets.data.images import open_images
    from rl_assets.train.preference import preference_pairs, top_completions, with_images

    model, tokenizer = load_policy(data / "r00" / "checkpoint")
    processor = tiny_processor(tokenizer, model.config)
    images = open_images(rollouts["image_ids"].to_pylist(), data / IMAGES)
    picked = (preference_pairs(rollouts, rewards, params.train.dpo.min_margin) if algorithm == "dpo"
              else top_completions(rollouts, rewards, params.train.rft.top_k, params.train.rft.min_reward))
    examples = with_images(picked, rollouts, tokenizer, images)
    collator = (DataCollatorForVisionPreference(processor=processor) if algorithm == "dpo"
                else DataCollatorForVisionLanguageModeling(processor=processor, completion_only_loss=True))
    batch = collator([dict(example) for example in examples])
    assert batch["pixel_values"].shape[0] == len(examples) * (2 if algorithm == "dpo" else 1)
    prompt_ids, completion_ids = rollouts["prompt_ids"].to_pylist(), rollouts["completion_ids"].to_pylist()
    round_trips = 0
    for i, pick in enumerate(picked):
        row = pick["row"]
        ids = batch["input_ids"][i][batch["attention_mask"][i].bool()].tolist()
        assert ids[: len(prompt_ids[row])] == prompt_ids[row]
        if tokenizer(tokenizer.decode(completion_ids[row], skip_special_tokens=True), add_special_tokens=False).input_ids == \
                [t for t in completion_ids[row] if t not in tokenizer.all_special_ids]:
            round_trips += 1
            assert ids[len(prompt_ids[row]):] == completion_ids[row]  # the end token included, as sampled
    assert round_trips >= 1


def test_dpo_and_rft_examples_carry_the_sampled_bos_end_token_and_images(vlm):
    """TRL's vision collators tokenize without special tokens: each example's text holds the BOS its prompt was sampled
    with and the end token its completion was sampled with (none when truncated), and the row's images."""

    from rl_assets.train.preference import with_images

    tokenizer = vlm[1]
    bos, eos = tokenizer.bos_token_id, tokenizer.eos_token_id
    rollouts = pa.table({"prompt_ids": [[bos, 5], [bos, 5], [5]], "completion_ids": [[7, eos], [8, 9], [7, eos]],
                         "truncated": [False, True, False]})
    pair = {"prompt": "<image>Q", "chosen": "a", "rejected": "b", "row": 0, "rejected_row": 1}
    picks = [{"prompt": "<image>Q", "completion": "b", "row": 1}, {"prompt": "<image>Q", "completion": "c", "row": 2}]
    images = [["picture 0"], ["picture 1"], ["picture 2"]]
    assert with_images([pair], rollouts, tokenizer, images) == [
        {"prompt": tokenizer.bos_token + "<image>Q", "chosen": "a" + tokenizer.eos_token, "rejected": "b", "images": ["picture 0"]}]
    assert with_images(picks, rollouts, tokenizer, images) == [
        {"prompt": tokenizer.bos_token + "<image>Q", "completion": "b", "images": ["picture 1"]},
        {"prompt": "<image>Q", "completion": "c" + tokenizer.eos_token, "images": ["picture 2"]}]  # sampled without a BOS: none added


def assert_the_value_model_sees_the_images(data, rollouts, metrics, vlm):
    """PPO's value model of a VLM is the VLM's body with a value head: it trained (vision tower included) and its estimates
    change with the picture."""
    from rl_assets.core.logprobs import completion_values
    from rl_assets.train.critic import VisionValueModel, load_critic

    assert metrics["steps"] >= 1 and metrics["value_loss"] > 0
    before, after = load_critic(data / "r00" / "checkpoint", start="policy"), load_critic(data / "r01" / "critic")
    assert isinstance(after, VisionValueModel) and after.score.weight.abs().sum() > 0  # the head started at zero
    assert any(not torch.equal(p, before.get_parameter(name)) for name, p in after.named_parameters() if "vision_tower" in name)
    prompt_ids, completion_ids = rollouts["prompt_ids"].to_pylist()[:1], rollouts["completion_ids"].to_pylist()[:1]
    _, shown = pictures(2)
    values = [completion_values(after, prompt_ids, completion_ids, vlm[1].pad_token_id, vision=pixel_inputs(vlm[2], [picture]))[0]
              for picture in shown]
    assert not torch.allclose(values[0], values[1])


def tiny_qwen2_vl(version: str = "qwen2_vl"):
    """A random Qwen2-VL, or Qwen2.5-VL (`version` "qwen2_5_vl": its vision tower attends in windows), with 3-D rotary
    positions and pixel rows with image_grid_thw, on the tiny tokenizer, and a processor that expands its placeholder
    as theirs does (the real processors' video half needs torchvision, not installed here)."""
    from transformers import Qwen2_5_VLConfig, Qwen2_5_VLForConditionalGeneration, Qwen2VLConfig, Qwen2VLForConditionalGeneration
    from transformers.models.qwen2_vl.image_processing_pil_qwen2_vl import Qwen2VLImageProcessorPil

    from rl_assets.core.tokenizer import build_tiny_tokenizer

    tokenizer = build_tiny_tokenizer()
    names = ["<|vision_start|>", "<|vision_end|>", "<|image_pad|>", "<|video_pad|>"]
    tokenizer.add_special_tokens({"additional_special_tokens": names})
    ids = dict(zip(names, tokenizer.convert_tokens_to_ids(names)))
    tower = dict(depth=1, embed_dim=32, hidden_size=32, num_heads=2, patch_size=8, spatial_merge_size=2, temporal_patch_size=2)
    if version == "qwen2_5_vl":
        tower = dict(depth=2, hidden_size=32, intermediate_size=64, out_hidden_size=32, num_heads=2, patch_size=8, spatial_merge_size=2,
                     temporal_patch_size=2, window_size=32, fullatt_block_indexes=[1])
    config_class, model_class = ((Qwen2_5_VLConfig, Qwen2_5_VLForConditionalGeneration) if version == "qwen2_5_vl" else
                                 (Qwen2VLConfig, Qwen2VLForConditionalGeneration))
    config = config_class(
        text_config=dict(vocab_size=len(tokenizer), hidden_size=32, intermediate_size=64, num_hidden_layers=2, num_attention_heads=2,
                         num_key_value_heads=1, rope_parameters={"rope_type": "default", "mrope_section": [2, 3, 3], "rope_theta": 10000.0},
                         bos_token_id=tokenizer.bos_token_id, eos_token_id=tokenizer.eos_token_id, pad_token_id=tokenizer.pad_token_id,
                         initializer_range=0.5),  # sharp attention: positions matter
        vision_config=tower, image_token_id=ids["<|image_pad|>"], video_token_id=ids["<|video_pad|>"],
        vision_start_token_id=ids["<|vision_start|>"], vision_end_token_id=ids["<|vision_end|>"])
    torch.manual_seed(0)
    model = model_class(config).eval()

    class Processor:
        image_processor = Qwen2VLImageProcessorPil(min_pixels=32 * 32, max_pixels=48 * 48, patch_size=8, merge_size=2, temporal_patch_size=2)

        def __init__(self):
            self.tokenizer = tokenizer

        def __call__(self, text, images=None, return_tensors="pt"):
            pixels = dict(self.image_processor(images=images, return_tensors="pt")) if images else {}
            prompt = text[0]
            if images:  # one token per merged 2x2 patch
                prompt = prompt.replace("<|image_pad|>", "<|image_pad|>" * (int(pixels["image_grid_thw"][0].prod()) // 4))
            return {**tokenizer([prompt], return_tensors="pt"), **pixels}

    return model, tokenizer, Processor()


def tiny_idefics3(splitting: bool = False):
    """A random Idefics3 (SmolVLM's family: image tokens framed by marker tokens, pixels with their attention mask) on the
    tiny tokenizer, with its own processor; `splitting`: pictures larger than 32 px are cut into tiles, so a picture's
    size sets its count of image tokens."""
    from transformers import Idefics3Config, Idefics3ForConditionalGeneration, Idefics3ImageProcessor, Idefics3Processor, LlamaConfig

    from rl_assets.core.tokenizer import build_tiny_tokenizer

    tokenizer = build_tiny_tokenizer()
    names = ["<image>", "<fake_token_around_image>", "<global-img>", "<end_of_utterance>"]
    tokenizer.add_special_tokens({"additional_special_tokens": names})
    text = LlamaConfig(vocab_size=len(tokenizer), hidden_size=32, intermediate_size=64, num_hidden_layers=2, num_attention_heads=2,
                       num_key_value_heads=1, bos_token_id=tokenizer.bos_token_id, eos_token_id=tokenizer.eos_token_id,
                       pad_token_id=tokenizer.pad_token_id, initializer_range=0.5)
    config = Idefics3Config(text_config=text.to_dict(), scale_factor=2, image_token_id=tokenizer.convert_tokens_to_ids("<image>"),
                            vision_config=dict(hidden_size=32, intermediate_size=64, num_hidden_layers=1, num_attention_heads=2, image_size=32,
                                               patch_size=8))
    torch.manual_seed(0)
    images = Idefics3ImageProcessor(do_image_splitting=splitting, size={"longest_edge": 64 if splitting else 32}, max_image_size={"longest_edge": 32})
    return Idefics3ForConditionalGeneration(config).eval(), tokenizer, Idefics3Processor(image_processor=images, tokenizer=tokenizer, image_seq_len=4)


@pytest.mark.parametrize("family", ["qwen2_vl", "qwen2_5_vl", "idefics3"])
def test_other_vlm_layouts_sample_and_score_each_row_as_alone(family):
    """Qwen2-VL and Qwen2.5-VL place image tokens at 3-D rotary positions computed from the token types: sampling leaves
    them to generate(), every forward gets `mm_token_type_ids`. Idefics3 frames its image tokens and masks its pixels.
    In each a left-padded batch decodes as each row alone, and the log-probs of a right-padded batch are those of each
    row alone."""
    from rl_assets.core.vision import batched, has_multimodal_positions

    qwen = family.startswith("qwen")
    model, tokenizer, processor = tiny_qwen2_vl(family) if qwen else tiny_idefics3()
    assert has_multimodal_positions(model.config) is qwen
    pictures_ = [[Image.new("RGB", (48, 48), (200, 10, 10))], [Image.new("RGB", (40, 48), (10, 10, 200))]]
    placeholder = "<|vision_start|><|image_pad|><|vision_end|>" if qwen else "<image>"
    prompts = [f"{placeholder}How many?", f"{placeholder}Count them, now!"]
    greedy = generate(model, tokenizer, prompts, 2, greedy=True, max_new_tokens=6, images=pictures_, processor=processor)
    assert len(greedy.prompt_ids[0]) != len(greedy.prompt_ids[2])  # a left-padded batch
    for row in (0, 2):  # greedy decoding in the batch equals decoding one row by full forwards
        ids = list(greedy.prompt_ids[row])
        with torch.no_grad():
            for _ in range(len(greedy.completion_ids[row])):
                tensor = torch.tensor([ids])
                logits = model(input_ids=tensor, **batched([greedy.vision[row]], model, tensor)).logits[0, -1]
                logits[placeholder_ids(model.config)] = float("-inf")
                ids.append(int(logits.argmax()))
        assert ids[len(greedy.prompt_ids[row]):] == greedy.completion_ids[row]
    sampled = generate(model, tokenizer, prompts, 2, greedy=False, max_new_tokens=6, images=pictures_, processor=processor)
    with torch.no_grad():
        logprobs, _ = completion_logprobs(model, sampled.prompt_ids, sampled.completion_ids, tokenizer.pad_token_id, vision=sampled.vision)
        for row in range(4):  # right-padded rows score as each row alone
            ids = torch.tensor([sampled.prompt_ids[row] + sampled.completion_ids[row]])
            alone = model(input_ids=ids, **batched([sampled.vision[row]], model, ids)).logits[0].log_softmax(-1)
            start = len(sampled.prompt_ids[row]) - 1
            expected = [alone[start + j, token].item() for j, token in enumerate(sampled.completion_ids[row])]
            assert logprobs[row, : len(expected)].tolist() == pytest.approx(expected, abs=1e-5)


def test_a_vision_language_policy_samples_with_transformers_where_auto_would_pick_vllm():
    from rl_assets.rollout.vllm_sampling import resolve_engine

    assert resolve_engine("auto", "cuda:0", vision=True) == "transformers"  # on a GPU with vLLM installed too
    with pytest.raises(ValueError, match="vllm does not sample a vision-language policy yet"):
        resolve_engine("vllm", "cuda:0", vision=True)


def test_a_lora_value_model_of_a_vlm_loads_back_with_the_same_estimates(tmp_path, vlm):
    """ppo.critic_lora on a VLM: adapters on its multimodal body and a trainable head, saved as adapters and loaded back on
    the body they started from, give the same estimates of a prompt with its picture."""
    from rl_assets.core.checkpoints import save_checkpoint
    from rl_assets.core.config import LoraParams
    from rl_assets.core.logprobs import completion_values
    from rl_assets.train.critic import VisionValueModel, load_critic

    model, tokenizer, processor = vlm
    save_checkpoint(model, tokenizer, tmp_path / "r00", {"round": 0})
    lora = LoraParams(enabled=True, merge=False)
    critic = load_critic(tmp_path / "r00", start="policy", lora=lora)
    with torch.no_grad():
        for name, parameter in critic.named_parameters():
            if parameter.requires_grad:  # as if trained: the adapters and the head away from their zero starts
                parameter.normal_(0, 0.1)
    save_checkpoint(critic, tokenizer, tmp_path / "critic", {"round": 1, "kind": "critic", "start": "policy"}, lora=lora)
    again = load_critic(tmp_path / "critic")
    assert isinstance(again.get_base_model(), VisionValueModel)
    prompts, shown = pictures(1)
    ids, vision = encode_with_images(processor, ["<image>" + prompts[0]], shown)
    with torch.no_grad():
        before = completion_values(critic, ids, [[5, 6]], tokenizer.pad_token_id, vision=vision)[0]
        after = completion_values(again, ids, [[5, 6]], tokenizer.pad_token_id, vision=vision)[0]
    assert before.abs().sum() > 0 and torch.allclose(before, after, atol=1e-5)


def test_every_turn_of_an_episode_shows_the_policy_its_pictures(vlm, monkeypatch):
    """Episodes with images: each turn's generate() gets every row's pixels, and the first turn decodes as single-turn
    sampling does (which equals decoding by full forwards with the pixels, tested above)."""
    from rl_assets.rollout.environments import load_environment
    from rl_assets.rollout.episodes import sample_episodes

    model, tokenizer, processor = vlm
    prompts, shown = pictures(3)
    rows = [{"prompt_id": f"p{i}", "prompt": "<image>" + prompt, "answer": "3"} for i, prompt in enumerate(prompts)]
    calls = []
    generate_ = model.generate

    def recording(*args, **kwargs):
        calls.append((kwargs["input_ids"].shape[0], kwargs.get("pixel_values")))
        return generate_(*args, **kwargs)

    class Counting:  # the processor, counting its calls
        def __init__(self):
            self.calls = 0

        def __getattr__(self, name):
            return getattr(processor, name)

        def __call__(self, *args, **kwargs):
            self.calls += 1
            return processor(*args, **kwargs)

    monkeypatch.setattr(model, "generate", recording)
    counting = Counting()
    out = sample_episodes(model, tokenizer, rows, 2, load_environment("guess_the_number", {"low": 1, "high": 6}), "guess_the_number",
                          greedy=True, temperature=1.0, top_p=1.0, max_new_tokens=3, max_turns=3, max_tokens=32, batch_size=8, seed=0,
                          eos_ids=[tokenizer.eos_token_id], images=shown, processor=counting)
    assert counting.calls == 3  # a row's two samples start from the same observation: its picture is processed once
    assert len(calls) >= 2  # more than one turn
    assert all(pixels is not None and pixels.shape[0] == rows_ for rows_, pixels in calls)  # one picture a row, every turn
    assert len(out.vision) == 6 and all("pixel_values" in inputs for inputs in out.vision)
    monkeypatch.undo()
    single = generate(model, tokenizer, [row["prompt"] for row in rows], 2, greedy=True, max_new_tokens=3, images=shown, processor=processor)
    assert out.prompt_ids == single.prompt_ids
    for episode, completion, turns in zip(out.completion_ids, single.completion_ids, [t for t in out.turns]):
        first = turns[0]
        assert episode[first["start"] : first["end"]] == completion[: first["end"] - first["start"]]


def test_a_vlm_config_type_has_one_value_model_class(vlm):
    """Made once per config type: every load_critic of a VLM's value model gives instances of one class."""
    import copy

    from rl_assets.train.critic import vision_value_model

    model = vlm[0]
    assert vision_value_model(model.config) is vision_value_model(copy.deepcopy(model.config))
    assert vision_value_model(model.config).__name__ == "LlavaValueModel"


def test_a_vlm_whose_image_tokens_depend_on_the_size_counts_each_stored_picture(tmp_path):
    """Idefics3 splitting large pictures into tiles (as Qwen2-VL's count follows a picture's size): the prompts' lengths
    count each stored picture's tokens as its processor expands them, so max_prompt_tokens drops what is too long."""
    from rl_assets.core.config import PromptsParams
    from rl_assets.core.tokenizer import load_tokenizer
    from rl_assets.data.images import image_id, store_images
    from rl_assets.data.prompts import build_prompts

    model, tokenizer, processor = tiny_idefics3(splitting=True)
    folder = tmp_path / "my-vlm"
    model.save_pretrained(folder)
    processor.save_pretrained(folder)
    stored = {}
    for side in (24, 64):  # 64 x 24 and 64 x 64: two tiles and four
        buffer = io.BytesIO()
        Image.new("RGB", (64, side), (side, 0, 0)).save(buffer, format="PNG")
        stored[side] = image_id(buffer.getvalue())
        store_images({stored[side]: (buffer.getvalue(), "png")}, tmp_path / "images")
    params = ModelParams(name_or_path=str(folder))
    count = tokens_per_image(params)
    small, large = (count(Image.open(tmp_path / "images" / f"{stored[side]}.png").convert("RGB")) for side in (24, 64))
    assert large > small > 1  # cut into more tiles
    raw = pa.table({"prompt": ["How many?", "How many now?"], "answer": ["1", "2"], "image_ids": [[stored[24]], [stored[64]]],
                    "source": ["s", "s"], "source_hash": ["h", "h"], "source_row": [0, 1], "extra": ["{}", "{}"]})
    prompts, dropped = build_prompts(raw, PromptsParams(max_prompt_tokens=10_000), load_tokenizer(params), image_tokens=count,
                                     images_dir=tmp_path / "images")
    for prompt, side, n_tokens in zip(prompts["prompt"].to_pylist(), (24, 64), prompts["n_tokens"].to_pylist()):
        with Image.open(tmp_path / "images" / f"{stored[side]}.png") as picture:
            (ids,), _ = encode_with_images(processor, [prompt], [[picture.convert("RGB")]])
        assert n_tokens == len(ids)  # what sampling will feed the policy
    limit = PromptsParams(max_prompt_tokens=max(prompts["n_tokens"].to_pylist()) - 1)
    kept, dropped = build_prompts(raw, limit, load_tokenizer(params), image_tokens=count, images_dir=tmp_path / "images")
    assert kept["problem"].to_pylist() == ["How many?"] and dropped["too_long"] == 1
