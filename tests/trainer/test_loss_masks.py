"""The loss is on the answer: prompt tokens carry label -100 in the batches SFTTrainer trains on.

Every test goes the way train.run goes (data.check, data.training_sets, train.sft_config, then
TRL's SFTTrainer preparing the dataset and its collator batching it) with the built-in
tiny-llama's tokenizer, and reads the labels back as text.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from dgx_api.trainer_config import ConfigError, parse_config
from tests.trainer.conftest import config_data

ADD = {"instruction": "Add the two numbers.", "input": "6 + 20", "output": "6 + 20 = 26."}
CHAT = [
    {"role": "system", "content": "Answer with the sum."},
    {"role": "user", "content": "Add 6 + 20."},
    {"role": "assistant", "content": "6 + 20 = 26."},
    {"role": "user", "content": "And 2 + 2?"},
    {"role": "assistant", "content": "2 + 2 = 4."},
]
SHAREGPT = [
    {"from": {"system": "system", "user": "human", "assistant": "gpt"}[m["role"]], "value": m["content"]} for m in CHAT
]


def write_rows(path: Path, rows: list[dict[str, Any]]) -> Path:
    path.write_text("".join(json.dumps(r) + "\n" for r in rows), encoding="utf-8")
    return path


def sft_trainer(tmp_path: Path, tiny_llama: Path, rows: list[dict[str, Any]], changes: dict[str, Any]) -> Any:
    """An SFTTrainer over ``rows`` built as train.run builds it (no adapters: labels do not need them)."""
    from transformers import AutoModelForCausalLM, AutoTokenizer
    from trl import SFTTrainer

    from dgx_trainer import data, model, train

    file = write_rows(tmp_path / "rows.jsonl", rows)
    # The built-in model's vocabulary spells template markup out in many tokens: room for all of them.
    wide = {"dataset.path": str(file), "training.maxSeqLength": 1024}
    cfg = parse_config(config_data(tmp_path / "out", {**wide, **changes}))
    tokenizer = AutoTokenizer.from_pretrained(tiny_llama)
    checked = data.check(cfg, tmp_path, tokenizer)
    records = data.load_records(cfg.dataset, tmp_path)
    data.use_chat_template(cfg.dataset, tmp_path, tokenizer, checked)
    train_set, eval_set = data.training_sets(cfg, tmp_path, records, tokenizer)
    rt = train.Runtime(base_dir=tmp_path, output_dir=tmp_path / "out", env={})
    args = train.sft_config(cfg, rt, model.precision("fp32", "cpu"), eval_set is not None, "cpu")
    return SFTTrainer(
        model=AutoModelForCausalLM.from_pretrained(tiny_llama),
        args=args,
        train_dataset=train_set,
        processing_class=tokenizer,
    )


def batch(trainer: Any) -> dict[str, Any]:
    return trainer.data_collator([trainer.train_dataset[i] for i in range(len(trainer.train_dataset))])


def labelled_runs(tokenizer: Any, ids: list[int], labels: list[int]) -> list[str]:
    """The labelled stretches of a sequence, decoded; asserting each label is its input id."""
    runs: list[list[int]] = []
    previous = False
    for token, label in zip(ids, labels, strict=True):
        if label != -100:
            assert label == token, "a label is the token at its position (the model shifts them)"
            if not previous:
                runs.append([])
            runs[-1].append(token)
        previous = label != -100
    return [tokenizer.decode(run) for run in runs]


def test_instruction_prompt_tokens_carry_label_minus_100(tmp_path: Path, tiny_llama: Path) -> None:
    from dgx_trainer import data

    trainer = sft_trainer(tmp_path, tiny_llama, [ADD], {})
    tokenizer = trainer.processing_class
    out = batch(trainer)
    ids, labels = out["input_ids"][0].tolist(), out["labels"][0].tolist()
    prompt = tokenizer(data.instruction_prompt(ADD["instruction"], ADD["input"]))["input_ids"]
    assert ids[: len(prompt)] == prompt, "the sequence starts with the prompt (and its BOS)"
    assert labels[: len(prompt)] == [-100] * len(prompt), "no prompt token is trained on"
    assert labelled_runs(tokenizer, ids, labels) == ["6 + 20 = 26.</s>"], "the answer and its EOS are"


def test_loss_on_all_labels_every_token(tmp_path: Path, tiny_llama: Path) -> None:
    trainer = sft_trainer(tmp_path, tiny_llama, [ADD], {"dataset.lossOn": "all"})
    out = batch(trainer)
    assert out["labels"][0].tolist() == out["input_ids"][0].tolist()


def test_prompt_completion_rows_train_on_the_completion(tmp_path: Path, tiny_llama: Path) -> None:
    rows = [{"question": "Add 6 + 20.\n", "answer": "26"}]
    changes = {
        "dataset.template": "prompt_completion",
        "dataset.promptField": "question",
        "dataset.completionField": "answer",
    }
    trainer = sft_trainer(tmp_path, tiny_llama, rows, changes)
    out = batch(trainer)
    runs = labelled_runs(trainer.processing_class, out["input_ids"][0].tolist(), out["labels"][0].tolist())
    assert runs == ["26</s>"]


def test_conversational_prompt_completion_uses_the_chat_template(tmp_path: Path, tiny_llama: Path) -> None:
    rows = [{"prompt": CHAT[:2], "completion": [CHAT[2]]}]
    trainer = sft_trainer(tmp_path, tiny_llama, rows, {"dataset.template": "prompt_completion"})
    out = batch(trainer)
    runs = labelled_runs(trainer.processing_class, out["input_ids"][0].tolist(), out["labels"][0].tolist())
    assert runs == ["6 + 20 = 26.</s>\n"]


@pytest.mark.parametrize(
    ("template", "turns"), [("chat", {"messages": CHAT}), ("sharegpt", {"conversations": SHAREGPT})]
)
def test_every_assistant_turn_is_trained_and_nothing_else(
    tmp_path: Path, tiny_llama: Path, template: str, turns: dict[str, Any]
) -> None:
    trainer = sft_trainer(tmp_path, tiny_llama, [turns], {"dataset.template": template})
    tokenizer = trainer.processing_class
    out = batch(trainer)
    ids, labels = out["input_ids"][0].tolist(), out["labels"][0].tolist()
    assert tokenizer.decode(ids) == tokenizer.apply_chat_template(CHAT, tokenize=False)
    # Both answers with their end of turn, so the model learns to stop; the system and user turns not.
    assert labelled_runs(tokenizer, ids, labels) == ["6 + 20 = 26.</s>\n", "2 + 2 = 4.</s>\n"]


def test_chat_loss_on_all_labels_every_token(tmp_path: Path, tiny_llama: Path) -> None:
    trainer = sft_trainer(
        tmp_path, tiny_llama, [{"messages": CHAT}], {"dataset.template": "chat", "dataset.lossOn": "all"}
    )
    out = batch(trainer)
    assert out["labels"][0].tolist() == out["input_ids"][0].tolist()


def test_packing_keeps_the_masks(tmp_path: Path, tiny_llama: Path) -> None:
    rows = [{**ADD, "output": f"answer {i}."} for i in range(6)]
    trainer = sft_trainer(tmp_path, tiny_llama, rows, {"training.packing": True})
    tokenizer = trainer.processing_class
    assert len(trainer.train_dataset) < len(rows), "the rows were packed into fewer sequences"
    runs = [
        run
        for row in trainer.train_dataset
        for run in labelled_runs(tokenizer, list(row["input_ids"]), list(row["labels"]))
    ]
    assert sorted(runs) == sorted(f"answer {i}.</s>" for i in range(6))


#: How each built-in template ends an assistant turn (and starts one: mistral with a space).
TURNS = {
    "chatml": "{}<|im_end|>\n",
    "llama3": "{}<|eot_id|>",
    "mistral": " {}</s>",
    "zephyr": "{}</s>\n",
}


@pytest.mark.parametrize("name", sorted(TURNS))
def test_builtin_chat_templates_mask_the_assistant_turns(tmp_path: Path, tiny_llama: Path, name: str) -> None:
    from dgx_trainer import data

    changes = {"dataset.template": "chat", "dataset.chatTemplate": name}
    trainer = sft_trainer(tmp_path, tiny_llama, [{"messages": CHAT}], changes)
    tokenizer = trainer.processing_class
    assert tokenizer.chat_template == data.CHAT_TEMPLATES[name]
    out = batch(trainer)
    runs = labelled_runs(tokenizer, out["input_ids"][0].tolist(), out["labels"][0].tolist())
    assert runs == [TURNS[name].format("6 + 20 = 26."), TURNS[name].format("2 + 2 = 4.")]
    assert "Answer with the sum." in tokenizer.decode(out["input_ids"][0]), "the system turn is rendered"


def test_a_chat_template_file_is_used_and_saved_with_the_tokenizer(tmp_path: Path, tiny_llama: Path) -> None:
    from transformers import AutoTokenizer

    template = (
        "{% for m in messages %}[{{ m['role'] }}] {{ m['content'] }}{{ eos_token }}{% endfor %}"
        "{% if add_generation_prompt %}[assistant]{% endif %}"
    )
    (tmp_path / "tmpl.jinja").write_text(template, encoding="utf-8")
    changes = {"dataset.template": "chat", "dataset.chatTemplate": "tmpl.jinja"}
    trainer = sft_trainer(tmp_path, tiny_llama, [{"messages": CHAT}], changes)
    tokenizer = trainer.processing_class
    out = batch(trainer)
    runs = labelled_runs(tokenizer, out["input_ids"][0].tolist(), out["labels"][0].tolist())
    assert runs == [" 6 + 20 = 26.</s>", " 2 + 2 = 4.</s>"]
    tokenizer.save_pretrained(tmp_path / "adapter")  # what train.run does with the adapter
    assert AutoTokenizer.from_pretrained(tmp_path / "adapter").chat_template == template


def test_text_with_completion_loss_is_refused(tmp_path: Path) -> None:
    from dgx_trainer import data

    cfg = parse_config(config_data(tmp_path, {"dataset.template": "text", "dataset.lossOn": "completion"}))
    with pytest.raises(ConfigError) as info:
        data.check(cfg, tmp_path)
    assert [p.path for p in info.value.problems] == ["dataset.lossOn"]
    assert "template: text has none" in info.value.problems[0].message
    assert not data.completion_only_loss(parse_config(config_data(tmp_path, {"dataset.template": "text"})).dataset)
