"""Data is checked before training: every row of the training and eval files against the template,
each problem as ``file:line: field`` under the config field it concerns (exit code 2 from the CLI);
ShareGPT and prompt/completion rows; a separate eval file whose loss reaches the progress reports."""

from __future__ import annotations

import io
import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from dgx_api.progress import Reporter
from dgx_api.trainer_config import ConfigError, parse_config
from tests.trainer.conftest import DATA, OFFLINE, config_data, write_config

GOOD = {"instruction": "Add the two numbers.", "input": "6 + 20", "output": "6 + 20 = 26."}
CHAT = [{"role": "user", "content": "Add 6 + 20."}, {"role": "assistant", "content": "26"}]


def jsonl(path: Path, lines: list[Any]) -> Path:
    """Rows as JSON lines; a str entry is written as the line itself (to write broken lines)."""
    path.write_text("".join((x if isinstance(x, str) else json.dumps(x)) + "\n" for x in lines), encoding="utf-8")
    return path


def problems(tmp_path: Path, changes: dict[str, Any], tokenizer: Any = None) -> list[tuple[str, str]]:
    from dgx_trainer import data

    cfg = parse_config(config_data(tmp_path / "out", changes))
    with pytest.raises(ConfigError) as info:
        data.check(cfg, tmp_path, tokenizer)
    return [(p.path, p.message) for p in info.value.problems]


# --- rows of the instruction template -----------------------------------------------------------


def test_every_bad_row_is_named_by_file_line_and_field(tmp_path: Path) -> None:
    jsonl(
        tmp_path / "train.jsonl",
        [
            GOOD,
            {"instruction": "Add.", "input": "1 + 1"},
            {"instruction": "Add.", "output": None},
            {"instruction": "Add.", "output": 2},
            {"instruction": "", "input": 5, "output": "2"},
            "",  # blank lines are skipped, as datasets skips them
            '{"instruction": "Add.", "output": "2"',
            '["not", "an", "object"]',
        ],
    )
    assert problems(tmp_path, {"dataset.path": "train.jsonl"}) == [
        ("dataset.outputField", "train.jsonl:2: 'output' is missing"),
        ("dataset.outputField", "train.jsonl:3: 'output' is null"),
        ("dataset.outputField", "train.jsonl:4: 'output' must be a string, got a number"),
        ("dataset.instructionField", "train.jsonl:5: 'instruction' is empty"),
        ("dataset.inputField", "train.jsonl:5: 'input' must be a string, got a number"),
        (
            "dataset.path",
            "train.jsonl:7: not valid JSON: Expecting ',' delimiter (column 38): each line must be one JSON object",
        ),
        ("dataset.path", "train.jsonl:8: not a JSON object, got a list"),
    ]


def test_the_example_data_passes(tmp_path: Path) -> None:
    from dgx_trainer import data

    checked = data.check(parse_config(config_data(tmp_path)), tmp_path)
    assert checked == data.Checked(rows=len(DATA.read_text().splitlines()), eval_rows=None, conversational=False)


def test_twenty_problems_then_a_count(tmp_path: Path) -> None:
    jsonl(tmp_path / "train.jsonl", [GOOD] + [{"instruction": "Add.", "output": None}] * 45)
    found = problems(tmp_path, {"dataset.path": "train.jsonl"})
    assert len(found) == 21
    assert found[0] == ("dataset.outputField", "train.jsonl:2: 'output' is null")
    assert found[19] == ("dataset.outputField", "train.jsonl:21: 'output' is null")
    assert found[20] == ("dataset", "... and 25 more problems like these (every row was checked)")


def test_a_column_no_row_has_is_one_problem(tmp_path: Path) -> None:
    jsonl(tmp_path / "train.jsonl", [{"instruction": "Add.", "answer": "2"}] * 30)
    assert problems(tmp_path, {"dataset.path": "train.jsonl"}) == [
        ("dataset.outputField", "column 'output' is not in the data (columns: instruction, answer)")
    ]


def test_an_empty_file(tmp_path: Path) -> None:
    (tmp_path / "train.jsonl").write_text("\n", encoding="utf-8")
    assert problems(tmp_path, {"dataset.path": "train.jsonl"}) == [
        ("dataset.path", "train.jsonl: the file is empty: add rows to it or point dataset.path elsewhere")
    ]


def test_files_of_a_directory_are_named_under_the_configured_path(tmp_path: Path) -> None:
    (tmp_path / "data" / "more").mkdir(parents=True)
    jsonl(tmp_path / "data" / "a.jsonl", [GOOD])
    jsonl(tmp_path / "data" / "more" / "b.jsonl", [GOOD, {"instruction": "Add."}])
    assert problems(tmp_path, {"dataset.path": "data", "dataset.format": "auto"}) == [
        ("dataset.outputField", "data/more/b.jsonl:2: 'output' is missing")
    ]


# --- Parquet and save_to_disk -------------------------------------------------------------------


def test_parquet_rows_are_named_by_index_and_schemas_must_match(tmp_path: Path) -> None:
    import pyarrow as pa
    import pyarrow.parquet as pq

    (tmp_path / "pq").mkdir()
    pq.write_table(pa.Table.from_pylist([GOOD, {**GOOD, "output": None}]), tmp_path / "pq" / "a.parquet")
    pq.write_table(pa.Table.from_pylist([{"instruction": "Add.", "output": 3}]), tmp_path / "pq" / "b.parquet")
    assert problems(tmp_path, {"dataset.path": "pq", "dataset.format": "parquet"}) == [
        ("dataset.outputField", "pq/a.parquet:row 1: 'output' is null"),
        (
            "dataset.path",
            "pq/b.parquet: its columns differ from pq/a.parquet's (output: int64 here, string there; no input here): "
            "write every file of the dataset with the same columns and types",
        ),
    ]


def test_saved_datasets_are_checked_by_row_index(tmp_path: Path) -> None:
    import datasets

    datasets.Dataset.from_list([GOOD, {**GOOD, "output": None}]).save_to_disk(str(tmp_path / "saved"))
    assert problems(tmp_path, {"dataset.path": "saved", "dataset.format": "auto"}) == [
        ("dataset.outputField", "saved:row 1: 'output' is null")
    ]


# --- chat, ShareGPT and prompt/completion -------------------------------------------------------


def test_chat_rows(tmp_path: Path) -> None:
    jsonl(
        tmp_path / "chat.jsonl",
        [
            {"messages": CHAT},
            {"messages": [{"role": "bot", "content": "hi"}]},
            {"messages": [{"role": "user", "content": None}, CHAT[1]]},
            {"messages": [CHAT[0]]},
            {"messages": []},
            {"messages": "hello"},
        ],
    )
    assert problems(tmp_path, {"dataset.path": "chat.jsonl", "dataset.template": "chat"}) == [
        (
            "dataset.messagesField",
            "chat.jsonl:2: 'messages'[0]: 'role' is 'bot', not one of system, user, assistant, tool",
        ),
        ("dataset.messagesField", "chat.jsonl:3: 'messages'[0]: 'content' must be a string, got null"),
        ("dataset.messagesField", "chat.jsonl:4: 'messages' has no assistant turn to train on (or set lossOn: all)"),
        ("dataset.messagesField", "chat.jsonl:5: 'messages' has no turns"),
        ("dataset.messagesField", "chat.jsonl:6: 'messages' must be a list of turns, got a string"),
    ]


def test_sharegpt_rows(tmp_path: Path) -> None:
    jsonl(
        tmp_path / "sg.jsonl",
        [
            {"conversations": [{"from": "human", "value": "hi"}, {"from": "gpt", "value": "hello"}]},
            {"conversations": [{"from": "human", "value": "hi"}, {"from": "model", "value": "hello"}]},
            {"conversations": [{"role": "user", "content": "hi"}]},
        ],
    )
    roles = "human, user, gpt, assistant, system"
    assert problems(tmp_path, {"dataset.path": "sg.jsonl", "dataset.template": "sharegpt"}) == [
        ("dataset.messagesField", f"sg.jsonl:2: 'conversations'[1]: 'from' is 'model', not one of {roles}"),
        ("dataset.messagesField", f"sg.jsonl:3: 'conversations'[0]: 'from' is missing, not one of {roles}"),
    ]


def test_sharegpt_becomes_role_content_messages(tmp_path: Path) -> None:
    from dgx_trainer import data

    turns = [{"from": "system", "value": "s"}, {"from": "human", "value": "q"}, {"from": "gpt", "value": "a"}]
    jsonl(tmp_path / "sg.jsonl", [{"conversations": turns, "id": 7}])
    cfg = parse_config(config_data(tmp_path, {"dataset.path": "sg.jsonl", "dataset.template": "sharegpt"}))
    rendered = data.render(data.load_records(cfg.dataset, tmp_path), cfg.dataset, "</s>")
    assert rendered.to_list() == [
        {
            "messages": [
                {"role": "system", "content": "s"},
                {"role": "user", "content": "q"},
                {"role": "assistant", "content": "a"},
            ]
        }
    ]


def test_prompt_completion_rows(tmp_path: Path) -> None:
    jsonl(
        tmp_path / "pc.jsonl",
        [
            {"prompt": "Q: 1 + 1?\nA: ", "completion": "2"},
            {"prompt": "Q", "completion": ""},
            {"prompt": CHAT[:1], "completion": "2"},
            {"completion": "2"},
        ],
    )
    assert problems(tmp_path, {"dataset.path": "pc.jsonl", "dataset.template": "prompt_completion"}) == [
        ("dataset.completionField", "pc.jsonl:2: 'completion' is empty"),
        ("dataset.completionField", "pc.jsonl:3: 'completion' must be a list of turns, got a string"),
        ("dataset.promptField", "pc.jsonl:4: 'prompt' is missing"),
    ]


# --- chat templates -----------------------------------------------------------------------------


def test_a_tokenizer_without_a_chat_template(tmp_path: Path, tiny_llama: Path) -> None:
    from transformers import AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(tiny_llama)
    tokenizer.chat_template = None
    jsonl(tmp_path / "chat.jsonl", [{"messages": CHAT}])
    assert problems(tmp_path, {"dataset.path": "chat.jsonl", "dataset.template": "chat"}, tokenizer) == [
        (
            "dataset.chatTemplate",
            "the model's tokenizer has no chat template, which template: chat needs: set dataset.chatTemplate to a "
            "built-in template (chatml, llama3, mistral, zephyr) or the path of a Jinja file",
        )
    ]


def test_a_chat_template_that_does_not_render(tmp_path: Path, tiny_llama: Path) -> None:
    from transformers import AutoTokenizer

    (tmp_path / "bad.jinja").write_text("{% for m in messages %}{{ m['content'] }", encoding="utf-8")
    jsonl(tmp_path / "chat.jsonl", [{"messages": CHAT}])
    changes = {"dataset.path": "chat.jsonl", "dataset.template": "chat", "dataset.chatTemplate": "bad.jinja"}
    [(path, message)] = problems(tmp_path, changes, AutoTokenizer.from_pretrained(tiny_llama))
    assert path == "dataset.chatTemplate"
    assert message.startswith("dataset.chatTemplate cannot render a system/user/assistant conversation: ")


def test_an_unknown_chat_template_is_refused_without_a_tokenizer(tmp_path: Path) -> None:
    assert problems(tmp_path, {"dataset.chatTemplate": "vicuna"}) == [
        (
            "dataset.chatTemplate",
            "'vicuna' is neither a built-in template (chatml, llama3, mistral, zephyr) nor a file "
            f"(looked at {tmp_path / 'vicuna'})",
        )
    ]


# --- the eval file ------------------------------------------------------------------------------


def test_eval_file_rows_are_checked_too(tmp_path: Path) -> None:
    jsonl(tmp_path / "eval.jsonl", [GOOD, {"instruction": "Add."}])
    assert problems(tmp_path, {"dataset.evalPath": "eval.jsonl"}) == [
        ("dataset.outputField", "eval.jsonl:2: 'output' is missing")
    ]
    assert problems(tmp_path, {"dataset.evalPath": "nope.jsonl"}) == [
        ("dataset.evalPath", f"no such file or directory: {tmp_path / 'nope.jsonl'}")
    ]


def test_eval_reports_carry_into_later_progress(tmp_path: Path) -> None:
    stream = io.StringIO()
    r = Reporter(tmp_path, precision="fp32", quantization="none", samples_per_step=4, enabled=True, stream=stream)
    r.log(2, 10, 0.2, {"loss": 3.0, "learning_rate": 0.1})
    r.log(2, 10, 0.2, {"eval_loss": 2.5, "eval_runtime": 0.1})
    assert json.loads((tmp_path / "progress.json").read_text())["evalLoss"] == 2.5, "at once, not at the next log"
    r.log(4, 10, 0.4, {"loss": 2.0, "learning_rate": 0.1})
    events = [json.loads(line) for line in stream.getvalue().splitlines()]
    assert [e["event"] for e in events] == ["progress", "eval", "progress"]
    assert {k: events[1][k] for k in ("step", "totalSteps", "evalLoss", "evalStep")} == {
        "step": 2,
        "totalSteps": 10,
        "evalLoss": 2.5,
        "evalStep": 2,
    }
    assert "evalLoss" not in events[0]
    assert (events[2]["evalLoss"], events[2]["evalStep"], events[2]["step"]) == (2.5, 2, 4)
    assert r.last["evalLoss"] == 2.5  # what the termination message's progress is made of


def test_a_run_with_an_eval_file_reports_eval_loss(tmp_path: Path, tiny_llama: Path, capsys: Any) -> None:
    from dgx_trainer import train

    rows = [json.loads(line) for line in DATA.read_text().splitlines()]
    jsonl(tmp_path / "eval.jsonl", rows[:8])
    out = tmp_path / "out"
    cfg = parse_config(config_data(out, {"dataset.evalPath": "eval.jsonl", "training.evalSteps": 2}))
    rt = train.Runtime(base_dir=tmp_path, output_dir=out, termination_log=tmp_path / "termination-log", env={})
    summary = train.run(cfg, rt)
    events = [json.loads(line) for line in capsys.readouterr().out.splitlines() if line.startswith("{")]
    evals = [e for e in events if e["event"] == "eval"]
    assert [e["evalStep"] for e in evals] == [2, 3], "every evalSteps and at the end, once"
    assert summary["evalLoss"] == evals[-1]["evalLoss"]
    progress = [e for e in events if e["event"] == "progress"]
    assert progress[-1]["evalStep"] == 2, "the step-3 report carries the step-2 evaluation"
    termination = json.loads((tmp_path / "termination-log").read_text())
    assert termination["progress"]["evalLoss"] == summary["evalLoss"]


# --- through the real CLI -----------------------------------------------------------------------


def test_cli_exits_2_on_a_bad_row_before_building_a_model(tmp_path: Path) -> None:
    jsonl(tmp_path / "train.jsonl", [GOOD, {"instruction": "Add.", "output": None}])
    out = tmp_path / "out"
    config = write_config(tmp_path, config_data(out, {"dataset.path": "train.jsonl"}))
    result = subprocess.run(
        [sys.executable, "-m", "dgx_trainer", "--config", str(config)],
        cwd=tmp_path,
        env={**os.environ, **OFFLINE, "KUBEDGX_TERMINATION_LOG": str(tmp_path / "termination-log")},
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    assert result.returncode == 2, result.stderr[-3000:]
    assert "  dataset.outputField: train.jsonl:2: 'output' is null" in result.stderr.splitlines()
    assert "Traceback" not in result.stderr
    assert result.stdout == ""
    assert "train.jsonl:2: 'output' is null" in (tmp_path / "termination-log").read_text()
