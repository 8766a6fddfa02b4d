"""Two nodes, as two pods are: two torchrun agents (one worker each, gloo on the CPU) in one c10d
rendezvous, each with its own output directory. A worker crashes mid-run, both agents restart the
group, and both ranks must resume from the same checkpoint with the losses of an uninterrupted run.

Before the group agreed on the resume step, only global rank 0 marked checkpoints complete and only
its node held the model and optimizer: after the crash rank 0 resumed at step 4 while rank 1 began
again at 0, and the group hung in mismatched collectives (here: the agents' timeout fails the test).
"""

from __future__ import annotations

import ast
import contextlib
import json
import os
import re
import shutil
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import IO, Any

import pytest

from dgx_api import checkpoints
from dgx_api.progress import parse_event
from tests.support.ports import free_port
from tests.trainer.conftest import _NOT_INHERITED, OFFLINE, RESUME_CHANGES, config_data, write_config

MAX_STEPS = 12
SAVE_STEPS = 4
FAULT_STEP = 6  # rank 1 dies after step 6: checkpoint-4 is the newest complete one on both nodes
#: Per run of two agents; a hung group fails the test here, not the suite. A hang guard, not a speed
#: target: a run takes about 100 s on two idle cores, and a cold CI run (Go and the images building
#: beside the tests) once took past 150 s with a faulted run's restart and got killed.
TIMEOUT = 330
#: Dropout and a warm-up cosine schedule: every rank's RNG and the scheduler must be restored.
CHANGES = {**RESUME_CHANGES, "training.maxSteps": MAX_STEPS}

pytestmark = pytest.mark.timeout(2 * TIMEOUT + 60)  # at most two runs of two agents per test


@dataclass
class Node:
    """One torchrun agent (a pod) and what it left behind."""

    output_dir: Path
    returncode: int
    events: list[dict[str, Any]]
    stderr: str

    def of(self, kind: str) -> list[dict[str, Any]]:
        return [e for e in self.events if e["event"] == kind]

    def describe(self) -> str:
        hung = f" (killed: still running after {TIMEOUT} s)" if self.returncode == -signal.SIGKILL else ""
        return f"{self.output_dir.name}: exit {self.returncode}{hung}\n{self.stderr[-5000:]}"


#: Called with each progress-contract line as it is printed, and the two agents.
OnEvent = Callable[[dict[str, Any], list["subprocess.Popen[bytes]"]], None]


def run_two_nodes(
    directory: Path, config: Path, *, env: dict[str, str] | None = None, on_event: OnEvent | None = None
) -> list[Node]:
    """Start two agents with separate output directories, wait for both (at most TIMEOUT s).

    ``on_event`` sees the JSON lines live (to act on a run at a given step: a test sends signals
    from it); the agents' stdout then goes through a pipe that a thread copies to the file."""
    port = free_port()
    full_env = {k: v for k, v in os.environ.items() if k not in _NOT_INHERITED}
    full_env.update(OFFLINE)
    full_env.update(
        PYTHONUNBUFFERED="1",
        OMP_NUM_THREADS="1",
        TORCH_DISABLE_SHARE_RDZV_TCP_STORE="1",
        KUBEDGX_LOG_LEVEL="INFO",  # rank 1 logs its resume decision too
        **(env or {}),
    )
    procs: list[tuple[Path, subprocess.Popen[bytes], Path, Path]] = []
    relays: dict[Path, threading.Thread] = {}
    try:
        for index, name in enumerate(("node-a", "node-b")):
            out = directory / name
            logs = directory / f"{name}-logs"
            logs.mkdir(parents=True)
            command = [
                sys.executable,
                "-m",
                "torch.distributed.run",
                "--nnodes=2",
                "--nproc-per-node=1",
                "--rdzv-backend=c10d",
                f"--rdzv-endpoint=127.0.0.1:{port}",
                f"--rdzv-id={directory.name}",
                f"--rdzv-conf=is_host={'true' if index == 0 else 'false'},join_timeout=60",
                "--max-restarts=1",
                "-m",
                "dgx_trainer",
                "--config",
                str(config),
                "--output-dir",
                str(out),
            ]
            stdout, stderr = logs / "stdout.txt", logs / "stderr.txt"
            node_env = {**full_env, "KUBEDGX_TERMINATION_LOG": str(logs / "termination-log")}
            with stdout.open("wb") as so, stderr.open("wb") as se:
                proc = subprocess.Popen(
                    command,
                    cwd=logs,
                    env=node_env,
                    stdout=subprocess.PIPE if on_event else so,
                    stderr=se,
                    start_new_session=True,
                )
            procs.append((out, proc, stdout, stderr))
        if on_event is not None:
            agents = [proc for _, proc, _, _ in procs]
            for _, proc, stdout, _ in procs:
                assert proc.stdout is not None
                relay = threading.Thread(target=_relay, args=(proc.stdout, stdout, on_event, agents), daemon=True)
                relay.start()
                relays[stdout] = relay
        nodes = []
        deadline = time.monotonic() + TIMEOUT
        for out, proc, stdout, stderr in procs:
            try:
                code = proc.wait(timeout=max(0.0, deadline - time.monotonic()))
            except subprocess.TimeoutExpired:  # a hung group
                _stop(proc)
                code = -signal.SIGKILL
            if stdout in relays:
                relays[stdout].join(timeout=30)  # EOF once the agent and its workers are gone
            lines = stdout.read_text(encoding="utf-8").splitlines()
            events = [e for e in map(parse_event, lines) if e is not None]
            nodes.append(Node(out, code, events, stderr.read_text(encoding="utf-8")))
        return nodes
    finally:
        for _, proc, _, _ in procs:
            _stop(proc)


def _relay(source: IO[bytes], target: Path, on_event: OnEvent, agents: list[subprocess.Popen[bytes]]) -> None:
    with source, target.open("wb") as copy:
        for line in source:
            copy.write(line)
            copy.flush()
            event = parse_event(line.decode("utf-8", errors="replace"))
            if event is not None:
                on_event(event, agents)


def _stop(proc: subprocess.Popen[bytes]) -> None:
    """End an agent and its workers. torchrun starts each worker in a session of its own, out of
    reach of a signal to the agent's group: SIGTERM lets the agent stop them (it kills the ones
    that do not stop), and SIGKILL to its group is the last resort."""
    if proc.poll() is not None:
        return
    with contextlib.suppress(ProcessLookupError):
        proc.send_signal(signal.SIGTERM)
    try:
        proc.wait(timeout=45)
    except subprocess.TimeoutExpired:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(proc.pid, signal.SIGKILL)
        proc.wait(timeout=30)


def main_node(nodes: list[Node]) -> Node:
    """The node rank 0 ran on (the rendezvous assigns ranks): the one printing progress lines."""
    printing = [n for n in nodes if n.of("summary")]
    assert len(printing) == 1, "\n".join(n.describe() for n in nodes)
    return printing[0]


def decisions(node: Node) -> list[int]:
    """The resume step of each start on this node, from its rank's log line."""
    found = re.findall(r"(?:resume at step (\d+)|start at step 0)", node.stderr)
    return [int(step) if step else 0 for step in found]


@pytest.fixture(scope="module")
def uninterrupted(tmp_path_factory: pytest.TempPathFactory, kubedgx_cache: Path) -> Node:
    base = tmp_path_factory.mktemp("two-nodes-uninterrupted")
    config = write_config(base, config_data(base / "unused", CHANGES))
    nodes = run_two_nodes(base, config)
    assert all(n.returncode == 0 for n in nodes), "\n".join(n.describe() for n in nodes)
    return main_node(nodes)


def test_both_nodes_resume_from_the_same_step_with_the_uninterrupted_losses(
    uninterrupted: Node, tmp_path: Path
) -> None:
    base = {int(e["step"]): float(e["loss"]) for e in uninterrupted.of("progress")}
    assert sorted(base) == list(range(1, MAX_STEPS + 1))

    fault = tmp_path / "fault-fired"
    config = write_config(tmp_path, config_data(tmp_path / "unused", CHANGES))
    fault_env = {
        "KUBEDGX_FAULT_AT_STEP": str(FAULT_STEP),
        "KUBEDGX_FAULT_RANK": "1",
        "KUBEDGX_FAULT_ONCE_FILE": str(fault),
    }
    nodes = run_two_nodes(tmp_path, config, env=fault_env)
    described = "\n".join(n.describe() for n in nodes)
    assert [n.returncode for n in nodes] == [0, 0], described
    assert fault.read_text(encoding="utf-8") == str(FAULT_STEP)
    assert any(f"fault injection: exiting at step {FAULT_STEP}" in n.stderr for n in nodes), described

    # Both nodes: a start from scratch, then the restart at checkpoint-4, agreed.
    for node in nodes:
        assert decisions(node) == [0, SAVE_STEPS], node.describe()
    main = main_node(nodes)
    assert [e["step"] for e in main.of("start")] == [0, SAVE_STEPS], described
    starts = [i for i, e in enumerate(main.events) if e["event"] == "start"]
    after = {int(e["step"]): float(e["loss"]) for e in main.events[starts[1] :] if e["event"] == "progress"}
    assert sorted(after) == list(range(SAVE_STEPS + 1, MAX_STEPS + 1))
    for step, loss in after.items():
        assert loss == pytest.approx(base[step], abs=1e-5), f"step {step}: resumed {loss}, uninterrupted {base[step]}"

    summary = json.loads((main.output_dir / "summary.json").read_text(encoding="utf-8"))
    reference = json.loads((uninterrupted.output_dir / "summary.json").read_text(encoding="utf-8"))
    assert summary["resumedFrom"] == str(main.output_dir / f"checkpoint-{SAVE_STEPS}")
    assert summary["worldSize"] == 2
    assert summary["step"] == MAX_STEPS
    # The whole run's mean loss, not the mean of the 8 steps after the resume.
    assert reference["trainLoss"] == pytest.approx(sum(base.values()) / MAX_STEPS, abs=1e-5)
    assert summary["trainLoss"] == pytest.approx(reference["trainLoss"], abs=1e-5)

    # Each node holds whole, complete checkpoints, with every rank's RNG state.
    for node in nodes:
        assert [step for step, _ in checkpoints.complete(node.output_dir)] == [4, 8, 12], node.describe()
        for step in (4, 8, 12):
            ckpt = node.output_dir / f"checkpoint-{step}"
            for name in ("adapter_model.safetensors", "optimizer.pt", "scheduler.pt", "trainer_state.json"):
                assert (ckpt / name).is_file(), f"{ckpt / name} missing"
            assert sorted(p.name for p in ckpt.glob("rng_state_*.pth")) == ["rng_state_0.pth", "rng_state_1.pth"]
    # ... and exactly one node's copy of each step is for the Out mount's uploader: global rank 0's.
    for step in (4, 8, 12):
        uploaders = [n for n in nodes if checkpoints.for_upload(n.output_dir / f"checkpoint-{step}")]
        assert len(uploaders) == 1, f"checkpoint-{step}: {[n.output_dir for n in uploaders]}"
    assert checkpoints.for_upload(main.output_dir / f"checkpoint-{MAX_STEPS}")


def test_nodes_that_disagree_resume_from_the_newest_checkpoint_they_share(uninterrupted: Node, tmp_path: Path) -> None:
    """Node A has checkpoints 4 and 8; node B, rescheduled, has only checkpoint-4 as an Out mount
    restores it: node A's upload, files and marker. Both resume at 4, node A's checkpoint-8 is
    unmarked and written again, and the losses are the uninterrupted run's."""
    base = {int(e["step"]): float(e["loss"]) for e in uninterrupted.of("progress")}
    source = uninterrupted.output_dir
    node_a, node_b = tmp_path / "node-a", tmp_path / "node-b"
    for step in (4, 8):
        shutil.copytree(source / f"checkpoint-{step}", node_a / f"checkpoint-{step}")
    shutil.copytree(source / "checkpoint-4", node_b / "checkpoint-4")
    config = write_config(tmp_path, config_data(tmp_path / "unused", CHANGES))
    nodes = run_two_nodes(tmp_path, config)
    described = "\n".join(n.describe() for n in nodes)
    assert [n.returncode for n in nodes] == [0, 0], described

    for node in nodes:
        assert decisions(node) == [SAVE_STEPS], node.describe()
    main = main_node(nodes)
    lists = re.search(r"complete checkpoints per rank: (\{.*\})", main.stderr)
    assert lists is not None, main.describe()
    assert sorted(ast.literal_eval(lists[1]).values()) == [[4], [4, 8]]  # ranks follow the rendezvous
    assert f"{node_a / 'checkpoint-8'} is newer than the group's resume step" in nodes[0].stderr, described
    after = {int(e["step"]): float(e["loss"]) for e in main.of("progress")}
    assert sorted(after) == list(range(SAVE_STEPS + 1, MAX_STEPS + 1))
    for step, loss in after.items():
        assert loss == pytest.approx(base[step], abs=1e-5), f"step {step}: resumed {loss}, uninterrupted {base[step]}"
    for node in nodes:
        assert [step for step, _ in checkpoints.complete(node.output_dir)] == [4, 8, 12], node.describe()
