"""A small Dockerfile reader for the image tests (test_dockerfiles.py, test_distributions.py):
instructions by stage, continuation lines joined, comments dropped."""

from __future__ import annotations

import json
import re
from dataclasses import dataclass, field
from functools import cache

from tests.conftest import ROOT

OPERATOR = "Dockerfile.operator"
TRAINER = "Dockerfile.trainer"
DOCKERFILES = (OPERATOR, TRAINER)


@dataclass(frozen=True)
class Instruction:
    keyword: str  # upper case: FROM, RUN, COPY, ...
    args: str  # the rest, continuation lines joined
    line: int  # where it starts (1-based)

    def flags(self) -> dict[str, str]:
        """``--from=builder --chown=1:1`` -> {"from": "builder", "chown": "1:1"}."""
        return dict(m.groups() for m in re.finditer(r"(?:^|\s)--([a-z-]+)=(\S+)", self.args))

    def words(self) -> list[str]:
        """The arguments without the leading --flags; the JSON (exec) form is decoded."""
        rest = re.sub(r"^(?:--[a-z-]+(?:=\S+)?\s+)+", "", self.args.strip())
        if rest.startswith("["):
            decoded: list[str] = json.loads(rest)
            return decoded
        return rest.split()


@dataclass
class Stage:
    base: str
    name: str | None
    instructions: list[Instruction] = field(default_factory=list)

    def all(self, keyword: str) -> list[Instruction]:
        return [i for i in self.instructions if i.keyword == keyword]


@cache
def stages(dockerfile: str) -> tuple[Stage, ...]:
    lines = (ROOT / dockerfile).read_text(encoding="utf-8").splitlines()
    instructions: list[Instruction] = []
    pending: list[str] = []
    start = 0
    for number, raw in enumerate(lines, 1):
        text = raw.strip()
        if not pending and (not text or text.startswith("#")):
            continue
        if pending and text.startswith("#"):
            continue  # a comment inside a continued instruction is dropped, as Docker does
        if not pending:
            start = number
        if text.endswith("\\"):
            pending.append(text[:-1].strip())
            continue
        pending.append(text)
        keyword, _, args = " ".join(p for p in pending if p).partition(" ")
        instructions.append(Instruction(keyword.upper(), args.strip(), start))
        pending = []
    assert not pending, f"{dockerfile} ends inside a continued instruction"
    out: list[Stage] = []
    for instruction in instructions:
        if instruction.keyword == "FROM":
            words = instruction.words()
            name = words[2] if len(words) == 3 and words[1].lower() == "as" else None
            out.append(Stage(words[0], name))
        else:
            assert out or instruction.keyword == "ARG", f"{dockerfile}:{instruction.line} comes before any FROM"
            if out:
                out[-1].instructions.append(instruction)
    return tuple(out)


def final(dockerfile: str) -> Stage:
    return stages(dockerfile)[-1]
