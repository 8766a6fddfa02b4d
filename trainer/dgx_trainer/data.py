"""Training data from local disk (a data mount's cache): checked row by row, then shaped for SFTTrainer.

Every row of the training data and of ``evalPath`` is checked against the template before anything
is trained (:func:`check`, which the pre-launch check also runs once per pod), so a row without an
answer fails with ``file:line: 'output' is missing`` and exit code 2 instead of training on the text
``None``. Rows are read here, not through ``datasets``, so that each problem can name its line.

The templates become what TRL's SFTTrainer trains on, with the loss on the answer by default:

- ``text``: a ``text`` column, every token labelled;
- ``instruction`` and ``prompt_completion``: TRL's ``prompt``/``completion`` columns, so that
  ``completion_only_loss`` (see :func:`completion_only_loss`) gives the prompt tokens label -100;
- ``chat`` and ``sharegpt``: ``messages`` (role/content turns), tokenized here by
  :func:`tokenize_conversations` into ``input_ids`` and ``labels``. TRL's ``assistant_only_loss``
  needs ``{% generation %}`` markers that almost no hub template has, so the assistant turns are
  found by rendering the conversation's prefixes instead, which works with any template that
  renders a prefix the way it renders the whole conversation (nearly all do).

No torch or kubernetes import here; ``datasets`` and ``pyarrow`` are imported where used.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from dgx_api.schema import Problem
from dgx_api.trainer_config import ConfigError, DatasetSource

DATA_SUFFIXES = {".jsonl": "json", ".json": "json", ".parquet": "parquet"}
#: Problems listed before the rest are only counted: enough to see the pattern, not a wall of text.
MAX_PROBLEMS = 20
#: Roles a `chat` turn may have (TRL's conversational format).
ROLES = ("system", "user", "assistant", "tool")
#: ShareGPT's `from` values and the roles they become.
SHAREGPT_ROLES = {"human": "user", "user": "user", "gpt": "assistant", "assistant": "assistant", "system": "system"}

#: Built-in chat templates for `dataset.chatTemplate`, for tokenizers without one (or to replace it).
#: They render a conversation's prefix exactly as the start of the whole conversation, which the
#: assistant-only loss relies on (see :func:`assistant_spans`).
CHAT_TEMPLATES: dict[str, str] = {
    "chatml": (
        "{% for message in messages %}"
        "{{ '<|im_start|>' + message['role'] + '\\n' + message['content'] + '<|im_end|>' + '\\n' }}"
        "{% endfor %}"
        "{% if add_generation_prompt %}{{ '<|im_start|>assistant\\n' }}{% endif %}"
    ),
    "llama3": (
        "{{ bos_token }}"
        "{% for message in messages %}"
        "{{ '<|start_header_id|>' + message['role'] + '<|end_header_id|>\\n\\n' + message['content'] | trim"
        " + '<|eot_id|>' }}"
        "{% endfor %}"
        "{% if add_generation_prompt %}{{ '<|start_header_id|>assistant<|end_header_id|>\\n\\n' }}{% endif %}"
    ),
    "mistral": (
        "{% if messages and messages[0]['role'] == 'system' %}"
        "{% set system = messages[0]['content'] %}{% set turns = messages[1:] %}"
        "{% else %}{% set system = '' %}{% set turns = messages %}{% endif %}"
        "{{ bos_token }}"
        "{% for message in turns %}"
        "{% if message['role'] == 'user' %}"
        "{% if loop.first and system %}{{ '[INST] ' + system + '\\n\\n' + message['content'] + ' [/INST]' }}"
        "{% else %}{{ '[INST] ' + message['content'] + ' [/INST]' }}{% endif %}"
        "{% elif message['role'] == 'assistant' %}{{ ' ' + message['content'] + eos_token }}"
        "{% else %}{{ raise_exception('the mistral template has system (first), user and assistant turns only') }}"
        "{% endif %}"
        "{% endfor %}"
    ),
    "zephyr": (
        "{% for message in messages %}"
        "{{ '<|' + message['role'] + '|>\\n' + message['content'] + eos_token + '\\n' }}"
        "{% endfor %}"
        "{% if add_generation_prompt %}{{ '<|assistant|>\\n' }}{% endif %}"
    ),
}


def _fail(field: str, message: str) -> ConfigError:
    return ConfigError("trainer config", [Problem(f"dataset.{field}", message)])


def resolve_path(path: str, base_dir: Path) -> Path:
    """Relative dataset paths are relative to the trainer's working directory (or ``base_dir``)."""
    candidate = Path(path)
    return candidate if candidate.is_absolute() else (base_dir / candidate)


def eval_source(source: DatasetSource) -> DatasetSource | None:
    """The evaluation data (``evalPath``) as a source of its own: same format and template."""
    if source.eval_path is None:
        return None
    return source.model_copy(update={"path": source.eval_path, "eval_path": None})


def messages_field(source: DatasetSource) -> str:
    return source.messages_field or ("conversations" if source.template == "sharegpt" else "messages")


def loss_on(source: DatasetSource) -> str:
    """``completion`` or ``all``: ``auto`` is the answer only for every template but ``text``,
    which has no prompt to leave out (asking for that is a config error, not a silent ``all``)."""
    if source.template == "text":
        if source.loss_on == "completion":
            raise _fail(
                "lossOn",
                "completion needs a prompt to leave out of the loss and template: text has none: "
                "use lossOn: all (or auto), or template: instruction, prompt_completion or chat",
            )
        return "all"
    return "all" if source.loss_on == "all" else "completion"


def completion_only_loss(source: DatasetSource) -> bool:
    """SFTConfig.completion_only_loss: the prompt of prompt/completion rows gets label -100.
    Explicit, never TRL's None (which guesses from the columns): ``lossOn: all`` must label all."""
    return source.template in ("instruction", "prompt_completion") and loss_on(source) == "completion"


# --- reading rows ---------------------------------------------------------------------------------


def _files(root: Path, fmt: str, path_field: str = "path") -> tuple[str, list[str]]:
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
        raise _fail(path_field, f"{root} holds no {' or '.join(wanted)} files")
    builders = {DATA_SUFFIXES[Path(f).suffix] for f in files}
    if len(builders) > 1:
        raise _fail("format", f"{root} mixes JSON and Parquet files: set format to pick one")
    return builders.pop(), files


def _is_saved(root: Path) -> bool:
    return root.is_dir() and ((root / "dataset_info.json").exists() or (root / "dataset_dict.json").exists())


def _saved_split(loaded: Any, source: DatasetSource, root: Path, path_field: str, is_eval: bool) -> Any:
    import datasets

    if not isinstance(loaded, datasets.DatasetDict):
        return loaded
    # evalPath may name the same DatasetDict as path: its held-out split is the one meant.
    wanted = [s for s in ("test", "validation") if is_eval and s in loaded] or [source.split]
    if wanted[0] not in loaded:
        raise _fail("split", f"no split {source.split!r} in {root} (splits: {', '.join(loaded)})")
    return loaded[wanted[0]]


def load_records(source: DatasetSource, base_dir: Path, *, is_eval: bool = False) -> Any:
    """The raw records as a datasets.Dataset (the requested split)."""
    import datasets

    path_field = "evalPath" if is_eval else "path"
    root = resolve_path(source.path, base_dir)
    if not root.exists():
        raise _fail(path_field, f"no such file or directory: {root}")
    if source.format == "hf" or (source.format == "auto" and _is_saved(root)):
        return _saved_split(datasets.load_from_disk(str(root)), source, root, path_field, is_eval)
    builder, files = _files(root, source.format, path_field)
    try:
        return datasets.load_dataset(builder, data_files=files, split="train")
    except (ValueError, TypeError, OSError, datasets.exceptions.DatasetGenerationError) as exc:
        # The rows were checked, so this is a column the template does not use, typed differently
        # in different rows (arrow wants one type per column).
        cause = str(exc.__cause__ or exc).splitlines()[0][:300]
        raise _fail(path_field, f"{root}: the data cannot be loaded: {cause} (give each column one type)") from exc


@dataclass
class _Scan:
    """What reading every row found: problems (capped), counts, the columns seen."""

    problems: list[Problem] = field(default_factory=list)
    more: int = 0
    columns: list[str] = field(default_factory=list)
    rows: int = 0
    conversational: bool = False
    #: column -> (config field, the first rows' problems, how many) for a required column not seen
    #: yet, kept apart until the end: a column absent from every row is one problem ("not in the
    #: data"), not one per row.
    missing: dict[str, tuple[str, list[Problem], list[int]]] = field(default_factory=dict)

    def add(self, problem: Problem) -> None:
        if len(self.problems) < MAX_PROBLEMS:
            self.problems.append(problem)
        else:
            self.more += 1

    def see(self, keys: Any) -> None:
        for key in keys:
            if key not in self.columns:
                self.columns.append(key)


def _kind(value: Any) -> str:
    if value is None:
        return "null"
    if isinstance(value, bool):
        return "a boolean"
    if isinstance(value, int | float):
        return "a number"
    if isinstance(value, str):
        return "a string"
    if isinstance(value, list | tuple):
        return "a list"
    if isinstance(value, dict):
        return "an object"
    return type(value).__name__


def _string(row: dict[str, Any], key: str, *, optional: bool = False, may_be_empty: bool = False) -> str | None:
    """Why ``row[key]`` is not a usable string, or None when it is."""
    if key not in row:
        return None if optional else f"{key!r} is missing"
    value = row[key]
    if value is None:
        return None if optional else f"{key!r} is null"
    if not isinstance(value, str):
        return f"{key!r} must be a string, got {_kind(value)}"
    if not value.strip() and not (optional or may_be_empty):
        return f"{key!r} is empty"
    return None


def _turns(value: Any, key: str, role_key: str, text_key: str, roles: Any) -> str | None:
    """Why ``value`` is not a non-empty list of ``{role_key, text_key}`` turns, or None."""
    if not isinstance(value, list | tuple):
        return f"{key!r} must be a list of turns, got {_kind(value)}"
    if not value:
        return f"{key!r} has no turns"
    for i, turn in enumerate(value):
        where = f"{key!r}[{i}]"
        if not isinstance(turn, dict):
            return f"{where} must be an object with {role_key!r} and {text_key!r}, got {_kind(turn)}"
        role = turn.get(role_key)
        if role not in roles:
            got = "missing" if role_key not in turn else repr(role)
            return f"{where}: {role_key!r} is {got}, not one of {', '.join(roles)}"
        text = turn.get(text_key)
        if not isinstance(text, str):
            got = "missing" if text_key not in turn else _kind(text)
            return f"{where}: {text_key!r} must be a string, got {got}"
    return None


def _row_problems(row: dict[str, Any], source: DatasetSource, completion: bool) -> list[tuple[str, str, str]]:
    """(config field, column, message) for each thing wrong with one row."""
    out: list[tuple[str, str, str]] = []

    def need(config_field: str, key: str, reason: str | None) -> None:
        if reason is not None:
            out.append((config_field, key, reason))

    t = source.template
    if t == "text":
        need("textField", source.text_field, _string(row, source.text_field))
    elif t == "instruction":
        need("instructionField", source.instruction_field, _string(row, source.instruction_field))
        need("inputField", source.input_field, _string(row, source.input_field, optional=True))
        need("outputField", source.output_field, _string(row, source.output_field))
    elif t == "prompt_completion":
        p, c = source.prompt_field, source.completion_field
        if isinstance(row.get(p), list) or isinstance(row.get(c), list):
            for key, name in ((p, "promptField"), (c, "completionField")):
                if key not in row:
                    need(name, key, f"{key!r} is missing")
                else:
                    need(name, key, _turns(row[key], key, "role", "content", ROLES))
        else:
            need("promptField", p, _string(row, p, may_be_empty=True))
            need("completionField", c, _string(row, c))
    else:
        key = messages_field(source)
        sharegpt = t == "sharegpt"
        if key not in row:
            need("messagesField", key, f"{key!r} is missing")
            return out
        reason = (
            _turns(row[key], key, "from", "value", list(SHAREGPT_ROLES))
            if sharegpt
            else _turns(row[key], key, "role", "content", ROLES)
        )
        if reason is None and completion:
            role_key, answer = ("from", ("gpt", "assistant")) if sharegpt else ("role", ("assistant",))
            if not any(turn[role_key] in answer for turn in row[key]):
                reason = f"{key!r} has no {' or '.join(answer)} turn to train on (or set lossOn: all)"
        need("messagesField", key, reason)
    return out


def _required(source: DatasetSource) -> dict[str, str]:
    """column -> config field of the columns every row must have."""
    t = source.template
    if t == "text":
        return {source.text_field: "textField"}
    if t == "instruction":
        return {source.instruction_field: "instructionField", source.output_field: "outputField"}
    if t == "prompt_completion":
        return {source.prompt_field: "promptField", source.completion_field: "completionField"}
    return {messages_field(source): "messagesField"}


def _display(source: DatasetSource, root: Path, file: Path) -> str:
    """A file as the config names it: the configured path, or it joined with the file's place in the directory."""
    if root.is_file():
        return source.path
    return f"{source.path.rstrip('/')}/{file.relative_to(root)}"


def _json_rows(file: Path, name: str, path_field: str, scan: _Scan) -> Iterator[tuple[str, dict[str, Any]]]:
    text = file.read_text(encoding="utf-8", errors="replace")
    if not text.strip():
        scan.add(
            Problem(
                f"dataset.{path_field}",
                f"{name}: the file is empty: add rows to it or point dataset.{path_field} elsewhere",
            )
        )
        return
    if text.lstrip().startswith("["):  # a JSON array (a .json file), which datasets also reads
        try:
            items = json.loads(text)
        except json.JSONDecodeError as exc:
            scan.add(Problem(f"dataset.{path_field}", f"{name}:{exc.lineno}: not valid JSON: {exc.msg}"))
            return
        for i, item in enumerate(items):
            yield from _object(item, f"{name}:item {i}", path_field, scan)
        return
    for lineno, line in enumerate(text.splitlines(), start=1):
        if not line.strip():
            continue
        try:
            item = json.loads(line)
        except json.JSONDecodeError as exc:
            scan.add(
                Problem(
                    f"dataset.{path_field}",
                    f"{name}:{lineno}: not valid JSON: {exc.msg} (column {exc.colno}): "
                    "each line must be one JSON object",
                )
            )
            continue
        yield from _object(item, f"{name}:{lineno}", path_field, scan)


def _object(item: Any, where: str, path_field: str, scan: _Scan) -> Iterator[tuple[str, dict[str, Any]]]:
    if isinstance(item, dict):
        yield where, item
    else:
        scan.add(Problem(f"dataset.{path_field}", f"{where}: not a JSON object, got {_kind(item)}"))


def _parquet_rows(
    files: list[Path], names: list[str], path_field: str, scan: _Scan
) -> Iterator[tuple[str, dict[str, Any]]]:
    import pyarrow.parquet as pq  # type: ignore[import-untyped]  # no stubs; not in pyproject's list

    first: tuple[str, Any] | None = None
    for file, name in zip(files, names, strict=True):
        try:
            handle = pq.ParquetFile(file)
        except Exception as exc:  # pyarrow raises its own error types for a file that is not Parquet
            scan.add(Problem(f"dataset.{path_field}", f"{name}: not a readable Parquet file: {exc}"))
            continue
        schema = handle.schema_arrow
        if first is None:
            first = (name, schema)
        elif not schema.remove_metadata().equals(first[1].remove_metadata()):
            scan.add(Problem(f"dataset.{path_field}", _schema_difference(name, schema, *first)))
            continue
        if handle.metadata.num_rows == 0:
            scan.add(
                Problem(
                    f"dataset.{path_field}",
                    f"{name}: the file holds no rows: add rows to it or point dataset.{path_field} elsewhere",
                )
            )
            continue
        index = 0
        for batch in handle.iter_batches():
            for row in batch.to_pylist():
                yield f"{name}:row {index}", row
                index += 1


def _schema_difference(name: str, schema: Any, first_name: str, first: Any) -> str:
    """One line: how a Parquet file's columns differ from the first file's (datasets needs them equal)."""
    here = {f.name: str(f.type) for f in schema}
    there = {f.name: str(f.type) for f in first}
    parts = [f"{c}: {here[c]} here, {there[c]} there" for c in here if c in there and here[c] != there[c]]
    parts += [f"no {c} here" for c in there if c not in here]
    parts += [f"{c} only here" for c in here if c not in there]
    return (
        f"{name}: its columns differ from {first_name}'s ({'; '.join(parts) or 'column order'}): "
        "write every file of the dataset with the same columns and types"
    )


def _rows(source: DatasetSource, base_dir: Path, path_field: str, is_eval: bool, scan: _Scan) -> Iterator[Any]:
    """(where, row) for every row of the data, problems with the files themselves added to ``scan``."""
    root = resolve_path(source.path, base_dir)
    if not root.exists():
        raise _fail(path_field, f"no such file or directory: {root}")
    if source.format == "hf" or (source.format == "auto" and _is_saved(root)):
        import datasets

        records = _saved_split(datasets.load_from_disk(str(root)), source, root, path_field, is_eval)
        scan.see(records.column_names)
        for i, row in enumerate(records):
            yield f"{source.path}:row {i}", row
        return
    builder, names = _files(root, source.format, path_field)
    files = [Path(f) for f in names]
    shown = [_display(source, root, f) for f in files]
    if builder == "parquet":
        yield from _parquet_rows(files, shown, path_field, scan)
    else:
        for file, name in zip(files, shown, strict=True):
            yield from _json_rows(file, name, path_field, scan)


@dataclass(frozen=True)
class Checked:
    """What :func:`check` learnt about the data: how many rows, and whether they hold turns
    (then a chat template is needed)."""

    rows: int
    eval_rows: int | None
    conversational: bool


def check_rows(source: DatasetSource, base_dir: Path, *, is_eval: bool = False) -> tuple[int, bool]:
    """Every row against the template; (rows, conversational) or a ConfigError with the problems."""
    path_field = "evalPath" if is_eval else "path"
    completion = loss_on(source) == "completion"
    required = _required(source)
    scan = _Scan()
    for where, row in _rows(source, base_dir, path_field, is_eval, scan):
        scan.rows += 1
        scan.see(row)
        for config_field, key, message in _row_problems(row, source, completion):
            problem = Problem(f"dataset.{config_field}", f"{where}: {message}")
            if key in required and key not in scan.columns:
                _, first, count = scan.missing.setdefault(key, (config_field, [], [0]))
                count[0] += 1
                if len(first) < MAX_PROBLEMS:
                    first.append(problem)
            else:
                scan.add(problem)
        if source.template in ("chat", "sharegpt") or any(isinstance(row.get(k), list) for k in required):
            scan.conversational = True
    problems: list[Problem] = []
    for key, (config_field, first, count) in scan.missing.items():
        if key in scan.columns:  # missing from the first rows only: each of them is a problem
            problems += first
            scan.more += count[0] - len(first)
        else:
            columns = ", ".join(scan.columns) or "none"
            problems.append(
                Problem(f"dataset.{config_field}", f"column {key!r} is not in the data (columns: {columns})")
            )
    problems += scan.problems
    more = scan.more + max(0, len(problems) - MAX_PROBLEMS)
    problems = problems[:MAX_PROBLEMS]
    if more:
        problems.append(Problem("dataset", f"... and {more} more problems like these (every row was checked)"))
    if not problems and scan.rows == 0:
        problems.append(Problem(f"dataset.{path_field}", f"{source.path}: no rows: point it at data"))
    if problems:
        raise ConfigError("trainer config", problems)
    return scan.rows, scan.conversational


def check(cfg: Any, base_dir: Path, tokenizer: Any | None = None) -> Checked:
    """Every data problem as a ConfigError before any worker starts (the pre-launch check calls
    this once per pod, and train.run again): the training data and the evaluation data, every row,
    against the template; the chat template when the data needs one.

    ``tokenizer`` is the job's tokenizer when the check has it: without one, only a
    ``dataset.chatTemplate`` file's existence can be checked."""
    source: DatasetSource = cfg.dataset
    resolve_chat_template(source, base_dir)
    rows, conversational = check_rows(source, base_dir)
    eval_rows = None
    evaluation = eval_source(source)
    if evaluation is not None:
        eval_rows, eval_conversational = check_rows(evaluation, base_dir, is_eval=True)
        conversational = conversational or eval_conversational
    checked = Checked(rows=rows, eval_rows=eval_rows, conversational=conversational)
    if tokenizer is not None:
        use_chat_template(source, base_dir, tokenizer, checked)
    return checked


# --- chat templates -------------------------------------------------------------------------------


def resolve_chat_template(source: DatasetSource, base_dir: Path) -> str | None:
    """The Jinja text ``dataset.chatTemplate`` names (a built-in name or a file), or None if unset."""
    value = source.chat_template
    if value is None:
        return None
    if value in CHAT_TEMPLATES:
        return CHAT_TEMPLATES[value]
    path = resolve_path(value, base_dir)
    if not path.is_file():
        raise _fail(
            "chatTemplate",
            f"{value!r} is neither a built-in template ({', '.join(CHAT_TEMPLATES)}) nor a file (looked at {path})",
        )
    text = path.read_text(encoding="utf-8")
    if not text.strip():
        raise _fail("chatTemplate", f"{path} is empty: it must hold a Jinja chat template")
    return text


_PROBE = [
    {"role": "system", "content": "probe"},
    {"role": "user", "content": "probe"},
    {"role": "assistant", "content": "probe"},
]


def use_chat_template(source: DatasetSource, base_dir: Path, tokenizer: Any, checked: Checked) -> None:
    """Set ``dataset.chatTemplate`` on the tokenizer (it is saved with the adapter, so inference
    renders the way training did) and make sure conversational data has a template that renders."""
    template = resolve_chat_template(source, base_dir)
    if template is not None:
        tokenizer.chat_template = template
    if not checked.conversational:
        return
    if not getattr(tokenizer, "chat_template", None):
        raise _fail(
            "chatTemplate",
            f"the model's tokenizer has no chat template, which template: {source.template} needs: set "
            f"dataset.chatTemplate to a built-in template ({', '.join(CHAT_TEMPLATES)}) or the path of a Jinja file",
        )
    try:
        tokenizer.apply_chat_template(_PROBE, tokenize=False)
    except Exception as exc:  # Jinja syntax errors, raise_exception() in the template, ...
        where = "dataset.chatTemplate" if template is not None else "the tokenizer's chat template"
        raise _fail(
            "chatTemplate",
            f"{where} cannot render a system/user/assistant conversation: {type(exc).__name__}: {exc}",
        ) from exc


# --- shaping for SFTTrainer -----------------------------------------------------------------------


def _require(columns: list[str], name: str, field: str) -> None:
    if name not in columns:
        raise _fail(field, f"column {name!r} is not in the data (columns: {', '.join(columns)})")


def _messages(turns: list[dict[str, Any]], sharegpt: bool) -> list[dict[str, str]]:
    """Turns as plain role/content dicts (arrow fills keys other rows have with None, which
    templates testing ``message.tool_calls is defined`` would misread)."""
    if sharegpt:
        return [{"role": SHAREGPT_ROLES[t["from"]], "content": t["value"]} for t in turns]
    return [{"role": t["role"], "content": t["content"]} for t in turns]


def render(records: Any, source: DatasetSource, eos_token: str, num_proc: int = 1) -> Any:
    """The rows in the columns SFTTrainer reads: ``text`` (text), ``prompt``/``completion``
    (instruction, prompt_completion) or ``messages`` (chat, sharegpt).

    ``eos_token`` ends each text and (string) completion: the built-in tokenizer is trained on
    these texts and must see it where training puts it (TRL appends it when it is missing).
    ``num_proc`` processes share the rows (``dataset.tokenizationProcesses``); each takes a
    contiguous shard and the shards are joined in order, so the rows keep their order."""
    columns = list(records.column_names)
    procs = _procs(records, num_proc)
    if source.template == "text":
        _require(columns, source.text_field, "textField")
        return records.map(lambda r: {"text": r[source.text_field] + eos_token}, remove_columns=columns, num_proc=procs)
    if source.template in ("chat", "sharegpt"):
        key = messages_field(source)
        _require(columns, key, "messagesField")
        sharegpt = source.template == "sharegpt"
        return records.map(lambda r: {"messages": _messages(r[key], sharegpt)}, remove_columns=columns, num_proc=procs)
    if source.template == "prompt_completion":
        p, c = source.prompt_field, source.completion_field
        _require(columns, p, "promptField")
        _require(columns, c, "completionField")

        def pair(r: dict[str, Any]) -> dict[str, Any]:
            if isinstance(r[p], list):
                return {"prompt": _messages(r[p], False), "completion": _messages(r[c], False)}
            return {"prompt": r[p], "completion": r[c] + eos_token}

        return records.map(pair, remove_columns=columns, num_proc=procs)
    _require(columns, source.instruction_field, "instructionField")
    _require(columns, source.output_field, "outputField")
    has_input = source.input_field in columns
    return records.map(
        lambda r: {
            "prompt": instruction_prompt(
                r[source.instruction_field], (r[source.input_field] or "") if has_input else ""
            ),
            "completion": r[source.output_field] + eos_token,
        },
        remove_columns=columns,
        num_proc=procs,
    )


def _procs(dataset: Any, num_proc: int) -> int | None:
    """``num_proc`` for ``datasets.map``: None (this process) for 1, never more than the rows."""
    procs = min(num_proc, len(dataset))
    return procs if procs > 1 else None


def instruction_prompt(instruction: str, context: str) -> str:
    """The Alpaca-style prompt the `instruction` template trains on (and inference must use)."""
    if context:
        return f"### Instruction:\n{instruction}\n\n### Input:\n{context}\n\n### Response:\n"
    return f"### Instruction:\n{instruction}\n\n### Response:\n"


def assistant_spans(tokenizer: Any, messages: list[dict[str, str]]) -> tuple[str, list[tuple[int, int]]] | None:
    """The rendered conversation and the character spans of its assistant turns (each one's text
    and end-of-turn markup), or None when they cannot be found.

    A turn's span is where rendering the turns before it with the generation prompt ends and
    rendering them with the turn ends; a template whose prefix renders differently (some drop
    past reasoning) falls back to finding that rendered turn, then its bare content, in order."""

    def rendered(turns: list[dict[str, str]], generation_prompt: bool) -> str | None:
        try:
            out: Any = tokenizer.apply_chat_template(turns, tokenize=False, add_generation_prompt=generation_prompt)
        except Exception:  # a template that refuses this prefix (say, one that must start with a user turn)
            return None
        return out if isinstance(out, str) else None

    text = rendered(messages, False)
    if text is None:
        return None
    spans: list[tuple[int, int]] = []
    cursor = 0
    for i, message in enumerate(messages):
        if message["role"] != "assistant":
            continue
        before, upto = rendered(messages[:i], True), rendered(messages[: i + 1], False)
        if before is not None and upto is not None and upto.startswith(before) and text.startswith(upto):
            start, end = len(before), len(upto)
        else:
            piece = upto[len(before) :] if before is not None and upto is not None and upto.startswith(before) else ""
            start = text.find(piece, cursor) if piece else -1
            if start < 0:
                piece = message["content"]
                start = text.find(piece, cursor) if piece else -1
            if start < 0:
                return None
            end = start + len(piece)
        if end > start:
            spans.append((max(start, cursor), end))
        cursor = max(cursor, end)
    return text, spans


def conversation_labels(
    tokenizer: Any, messages: list[dict[str, str]], completion: bool
) -> tuple[list[int], list[int]]:
    """(input_ids, labels) of one conversation: labels -100 outside the assistant turns when
    ``completion``, else the ids themselves. Tokenized as TRL tokenizes chats (the rendered text,
    no added special tokens); ([], []) when the assistant turns cannot be found."""
    found = assistant_spans(tokenizer, messages)
    if found is None:
        return [], []
    text, spans = found
    if not completion:
        ids = tokenizer(text, add_special_tokens=False)["input_ids"]
        return list(ids), list(ids)
    if getattr(tokenizer, "is_fast", False):
        enc = tokenizer(text, add_special_tokens=False, return_offsets_mapping=True)
        ids = list(enc["input_ids"])
        # A token that reaches into an answer is the answer's (TRL's prompt/completion rule too).
        labels = [
            tok if any(s < span_end and e > span_start for span_start, span_end in spans) else -100
            for tok, (s, e) in zip(ids, enc["offset_mapping"], strict=True)
        ]
        return ids, labels
    ids, labels, position = [], [], 0  # slow tokenizers have no offsets: tokenize piece by piece
    for span_start, span_end in [*spans, (len(text), len(text))]:
        for piece, trained in ((text[position:span_start], False), (text[span_start:span_end], True)):
            if piece:
                piece_ids = list(tokenizer(piece, add_special_tokens=False)["input_ids"])
                ids += piece_ids
                labels += piece_ids if trained else [-100] * len(piece_ids)
        position = span_end
    return ids, labels


def tokenize_conversations(
    dataset: Any, tokenizer: Any, source: DatasetSource, name: str = "training", num_proc: int = 1
) -> Any:
    """A ``messages`` dataset as ``input_ids`` and ``labels``: SFTTrainer keeps given labels, then
    truncates and packs them with the ids, so the masks hold with packing too. ``num_proc`` as
    for :func:`render`: the rows keep their order."""
    completion = loss_on(source) == "completion"

    def one(row: dict[str, Any]) -> dict[str, Any]:
        ids, labels = conversation_labels(tokenizer, row["messages"], completion)
        return {"input_ids": ids, "labels": labels}

    out = dataset.map(one, remove_columns=dataset.column_names, num_proc=_procs(dataset, num_proc))
    bad = [i for i, ids in enumerate(out["input_ids"]) if not ids]
    if bad:
        rows = ", ".join(str(i) for i in bad[:MAX_PROBLEMS]) + (", ..." if len(bad) > MAX_PROBLEMS else "")
        raise _fail(
            "chatTemplate",
            f"the chat template cannot render the {name} data's row {rows} so that its assistant turns can be "
            f"found ({len(bad)} rows): set dataset.chatTemplate to one of {', '.join(CHAT_TEMPLATES)} or a file, "
            "or lossOn: all",
        )
    return out


def prepare(records: Any, source: DatasetSource, tokenizer: Any, name: str = "training", num_proc: int = 1) -> Any:
    """The records as SFTTrainer gets them (see the module docstring), by ``num_proc`` processes."""
    rendered = render(records, source, tokenizer.eos_token or "", num_proc)
    if source.template in ("chat", "sharegpt"):
        return tokenize_conversations(rendered, tokenizer, source, name, num_proc)
    return rendered


def training_sets(
    cfg: Any, base_dir: Path, records: Any, tokenizer: Any, *, num_proc: int = 1
) -> tuple[Any, Any | None]:
    """(train, eval): eval from ``evalPath`` when set, else the ``evalFraction`` hold-out, else None.
    ``num_proc``: processes that render and tokenize (``dataset.tokenizationProcesses``)."""
    source: DatasetSource = cfg.dataset
    prepared = prepare(records, source, tokenizer, num_proc=num_proc)
    evaluation = eval_source(source)
    if evaluation is None:
        return split(prepared, source.eval_fraction, cfg.training.seed)
    evaluated = load_records(evaluation, base_dir, is_eval=True)
    return prepared, prepare(evaluated, evaluation, tokenizer, "evaluation", num_proc)


def split(dataset: Any, eval_fraction: float, seed: int) -> tuple[Any, Any | None]:
    """(train, eval) with a seeded hold-out; no eval set when the fraction is 0."""
    if eval_fraction <= 0 or len(dataset) < 2:
        return dataset, None
    parts = dataset.train_test_split(test_size=eval_fraction, seed=seed)
    return parts["train"], parts["test"]


def _contents(value: Any) -> list[str]:
    if isinstance(value, list):
        return [str(m.get("content", "")) for m in value]
    return [str(value)]


def sample_texts(dataset: Any, limit: int = 5000) -> list[str]:
    """Texts to train a tokenizer on (the built-in model's), from any rendered layout."""
    out: list[str] = []
    for row in dataset.select(range(min(limit, len(dataset)))):
        if "text" in row:
            out.append(row["text"])
        elif "messages" in row:
            out.extend(_contents(row["messages"]))
        elif isinstance(row["prompt"], str):
            out.append(row["prompt"] + row["completion"])
        else:
            out.extend(_contents(row["prompt"]) + _contents(row["completion"]))
    return out
