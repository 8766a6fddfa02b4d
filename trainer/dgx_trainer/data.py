"""Training data from local disk (a data mount's cache), rendered to what SFTTrainer consumes.

`text` and `instruction` templates become one `text` column; `chat` keeps a `messages` column,
which TRL renders with the tokenizer's chat template. Every problem names the config field.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from dgx_api.schema import Problem
from dgx_api.trainer_config import ConfigError, DatasetSource

DATA_SUFFIXES = {".jsonl": "json", ".json": "json", ".parquet": "parquet"}


def _fail(field: str, message: str) -> ConfigError:
    return ConfigError("trainer config", [Problem(f"dataset.{field}", message)])


def resolve_path(path: str, base_dir: Path) -> Path:
    """Relative dataset paths are relative to the trainer's working directory (or ``base_dir``)."""
    candidate = Path(path)
    return candidate if candidate.is_absolute() else (base_dir / candidate)


def _files(root: Path, fmt: str) -> tuple[str, list[str]]:
    """(datasets builder, files) for a file or a directory of files."""
    if root.is_file():
        builder = DATA_SUFFIXES.get(root.suffix) if fmt == "auto" else ("json" if fmt == "jsonl" else fmt)
        if builder is None:
            raise _fail("format", f"cannot tell the format of {root.name}: set format to jsonl or parquet")
        return builder, [str(root)]
    kinds = {"jsonl": [".jsonl", ".json"], "parquet": [".parquet"]}
    wanted = kinds.get(fmt, list(DATA_SUFFIXES))
    files = sorted(str(p) for p in root.rglob("*") if p.is_file() and p.suffix in wanted)
    if not files:
        raise _fail("path", f"{root} holds no {' or '.join(wanted)} files")
    builders = {DATA_SUFFIXES[Path(f).suffix] for f in files}
    if len(builders) > 1:
        raise _fail("format", f"{root} mixes JSON and Parquet files: set format to pick one")
    return builders.pop(), files


def load_records(source: DatasetSource, base_dir: Path) -> Any:
    """The raw records as a datasets.Dataset (the requested split)."""
    import datasets

    root = resolve_path(source.path, base_dir)
    if not root.exists():
        raise _fail("path", f"no such file or directory: {root}")
    is_saved = root.is_dir() and ((root / "dataset_info.json").exists() or (root / "dataset_dict.json").exists())
    if source.format == "hf" or (source.format == "auto" and is_saved):
        loaded = datasets.load_from_disk(str(root))
        if isinstance(loaded, datasets.DatasetDict):
            if source.split not in loaded:
                raise _fail("split", f"no split {source.split!r} in {root} (splits: {', '.join(loaded)})")
            return loaded[source.split]
        return loaded
    builder, files = _files(root, source.format)
    return datasets.load_dataset(builder, data_files=files, split="train")


def _require(columns: list[str], name: str, field: str) -> None:
    if name not in columns:
        raise _fail(field, f"column {name!r} is not in the data (columns: {', '.join(columns)})")


def render(records: Any, source: DatasetSource, eos_token: str) -> Any:
    """A dataset with a `text` column (text, instruction) or a `messages` column (chat)."""
    columns = list(records.column_names)
    if source.template == "text":
        _require(columns, source.text_field, "textField")
        return records.map(lambda r: {"text": str(r[source.text_field])}, remove_columns=columns)
    if source.template == "chat":
        field = source.messages_field or "messages"
        _require(columns, field, "messagesField")
        return records.map(lambda r: {"messages": r[field]}, remove_columns=columns)
    _require(columns, source.instruction_field, "instructionField")
    _require(columns, source.output_field, "outputField")
    has_input = source.input_field in columns
    return records.map(
        lambda r: {
            "text": instruction_prompt(
                str(r[source.instruction_field]), str(r[source.input_field] or "") if has_input else ""
            )
            + str(r[source.output_field])
            + eos_token
        },
        remove_columns=columns,
    )


def instruction_prompt(instruction: str, context: str) -> str:
    """The Alpaca-style prompt the `instruction` template trains on (and inference must use)."""
    if context:
        return f"### Instruction:\n{instruction}\n\n### Input:\n{context}\n\n### Response:\n"
    return f"### Instruction:\n{instruction}\n\n### Response:\n"


def split(dataset: Any, eval_fraction: float, seed: int) -> tuple[Any, Any | None]:
    """(train, eval) with a seeded hold-out; no eval set when the fraction is 0."""
    if eval_fraction <= 0 or len(dataset) < 2:
        return dataset, None
    parts = dataset.train_test_split(test_size=eval_fraction, seed=seed)
    return parts["train"], parts["test"]


def sample_texts(dataset: Any, limit: int = 5000) -> list[str]:
    """Texts to train a tokenizer on (the built-in model's), from either column layout."""
    out: list[str] = []
    for row in dataset.select(range(min(limit, len(dataset)))):
        if "text" in row:
            out.append(row["text"])
        else:
            out.extend(str(m.get("content", "")) for m in row["messages"])
    return out


def check(cfg: Any, base_dir: Path, tokenizer: Any | None = None) -> None:
    """Every data problem as a ConfigError before any worker starts (the pre-launch check calls
    this once per pod): the training data and the evaluation data, every row, against the template.

    ``tokenizer`` is the job's tokenizer when the check has it (chat templates need one)."""
    records = load_records(cfg.dataset, base_dir)
    render(records, cfg.dataset, "")
