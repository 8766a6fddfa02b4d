"""SIGTERM (a pod deleted, a spot node reclaimed, a node drained) ends a run with a complete
checkpoint of the step it was at, the termination message ``Interrupted: ...`` and exit 143, and a
replacement resumes from that checkpoint with the losses of an uninterrupted run.

Before the trainer handled SIGTERM, the ranks died at once (torchrun's agent forwards the signal
to its workers): the newest complete checkpoint was the last ``saveSteps`` one, the steps since were
trained again, and the pod's termination message was empty.

The two-node case is two torchrun agents (two pods, one gloo worker each, on the CPU), both
signalled as the kubelet signals each pod's PID 1, once rank 0 has printed a step strictly between
two regular saves (read live from its stdout: the signal is sent on that line, not after a wait).
"""

from __future__ import annotations

import contextlib
import json
import os
import re
import shutil
import signal
import subprocess
import sys
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest

from dgx_api import checkpoints
from tests.trainer.conftest import RESUME_CHANGES, TrainerProcess, config_data, write_config
from tests.trainer.test_multinode_resume import (
    CHANGES,
    MAX_STEPS,
    SAVE_STEPS,
    TIMEOUT,
    Node,
    decisions,
    main_node,
    run_two_nodes,
    uninterrupted,  # noqa: F401 (the uninterrupted two-node run, a fixture)
)

#: The signal goes out once rank 0 has printed this step: after checkpoint-4, before checkpoint-8.
SIGNAL_AFTER = SAVE_STEPS + 1
#: torchrun's agent, signalled itself, stops its workers and exits 1 (a SignalException); the
#: worker's 143 stays inside the pod, its termination message tells the operator what happened.
AGENT_EXIT = 1


def interrupted_message(step: int, total: int) -> str:
    return (
        f"Interrupted: SIGTERM at step {step} of {total}; checkpoint-{step} saved and marked complete; "
        "a replacement resumes from it"
    )


def termination_log(node: Node) -> Path:
    return node.output_dir.parent / f"{node.output_dir.name}-logs" / "termination-log"


def stopped_step(node: Node) -> int:
    """The step the node's worker says it stopped at (every rank logs it)."""
    found = re.findall(r"Interrupted: SIGTERM at step (\d+) of", node.stderr)
    assert len(found) == 1, node.describe()
    return int(found[0])


@pytest.mark.timeout(3 * TIMEOUT + 60)  # the uninterrupted run (module fixture), the reclaimed one, the replacement
def test_a_reclaimed_group_saves_its_step_and_the_replacement_resumes_there_with_the_same_losses(
    uninterrupted: Node,  # noqa: F811
    tmp_path: Path,
) -> None:
    base = {int(e["step"]): float(e["loss"]) for e in uninterrupted.of("progress")}
    reference = json.loads((uninterrupted.output_dir / "summary.json").read_text(encoding="utf-8"))
    config = write_config(tmp_path, config_data(tmp_path / "unused", CHANGES))
    signalled: list[int] = []

    def reclaim(event: dict[str, Any], agents: list[subprocess.Popen[bytes]]) -> None:
        if event["event"] == "progress" and int(event["step"]) == SIGNAL_AFTER and not signalled:
            signalled.append(SIGNAL_AFTER)
            for agent in agents:  # each pod's PID 1
                with contextlib.suppress(ProcessLookupError):
                    agent.send_signal(signal.SIGTERM)

    reclaimed = run_two_nodes(tmp_path / "reclaimed", config, on_event=reclaim)
    described = "\n".join(n.describe() for n in reclaimed)
    assert signalled == [SIGNAL_AFTER], described
    assert [n.returncode for n in reclaimed] == [AGENT_EXIT, AGENT_EXIT], described
    # Both ranks stopped at the same step, after the one the signal followed and before the end.
    step = stopped_step(reclaimed[0])
    assert stopped_step(reclaimed[1]) == step, described
    assert SIGNAL_AFTER < step < MAX_STEPS, described

    for node in reclaimed:  # each pod's own message: the operator reads each
        assert termination_log(node).read_text(encoding="utf-8") == interrupted_message(step, MAX_STEPS)
    printing = [n for n in reclaimed if n.of("progress")]
    assert len(printing) == 1, described
    main = printing[0]
    # The losses up to the stop are the uninterrupted run's, the stopped step's included (logged).
    before = {int(e["step"]): float(e["loss"]) for e in main.of("progress")}
    assert sorted(before) == list(range(1, step + 1)), described
    for s, loss in before.items():
        assert loss == pytest.approx(base[s], abs=1e-5), f"step {s}: {loss}, uninterrupted {base[s]}"
    assert not main.of("summary")

    regular = list(range(SAVE_STEPS, step + 1, SAVE_STEPS))
    for node in reclaimed:
        assert [s for s, _ in checkpoints.complete(node.output_dir)] == sorted({*regular, step}), node.describe()
        ckpt = node.output_dir / f"checkpoint-{step}"
        for name in ("adapter_model.safetensors", "optimizer.pt", "scheduler.pt", "trainer_state.json"):
            assert (ckpt / name).is_file(), f"{ckpt / name} missing"
        assert sorted(p.name for p in ckpt.glob("rng_state_*.pth")) == ["rng_state_0.pth", "rng_state_1.pth"]
        assert not (node.output_dir / "adapter").exists(), "an interrupted run saves no adapter"
        assert not (node.output_dir / "summary.json").exists(), "nor a summary as if it had succeeded"

    # The replacement pods: the same output directories, a new rendezvous.
    replaced_dir = tmp_path / "replaced"
    for node in reclaimed:
        shutil.copytree(node.output_dir, replaced_dir / node.output_dir.name)
    replaced = run_two_nodes(replaced_dir, config)
    described = "\n".join(n.describe() for n in replaced)
    assert [n.returncode for n in replaced] == [0, 0], described
    for node in replaced:
        assert decisions(node) == [step], node.describe()
    main = main_node(replaced)
    assert [e["step"] for e in main.of("start")] == [step], described
    after = {int(e["step"]): float(e["loss"]) for e in main.of("progress")}
    assert sorted(after) == list(range(step + 1, MAX_STEPS + 1)), described
    for s, loss in after.items():
        assert loss == pytest.approx(base[s], abs=1e-5), f"step {s}: resumed {loss}, uninterrupted {base[s]}"
    summary = json.loads((main.output_dir / "summary.json").read_text(encoding="utf-8"))
    assert summary["resumedFrom"] == str(main.output_dir / f"checkpoint-{step}")
    assert summary["trainLoss"] == pytest.approx(reference["trainLoss"], abs=1e-5)


def test_a_single_process_stops_at_the_end_of_its_step_with_exit_143(tmp_path: Path) -> None:
    """``python -m dgx_trainer`` itself signalled (no torchrun): the process's own exit code."""
    out = tmp_path / "out"
    config = write_config(tmp_path, config_data(out, RESUME_CHANGES))
    process = TrainerProcess(config, tmp_path / "logs", output_dir=out)
    total = int(RESUME_CHANGES["training.maxSteps"])
    try:
        for event in process.events():
            if event["event"] == "progress" and int(event["step"]) == SIGNAL_AFTER:
                process.proc.send_signal(signal.SIGTERM)
        result = process.finish()
    finally:
        process.close()
    assert result.returncode == 143, result.describe()
    step = max(result.losses)
    assert SIGNAL_AFTER < step < total, result.describe()
    assert (out / "termination-log").read_text(encoding="utf-8") == interrupted_message(step, total)
    assert checkpoints.is_complete(out / f"checkpoint-{step}"), result.describe()
    assert not (out / "adapter").exists()
    assert not (out / "summary.json").exists()
    assert not result.of("summary")


def test_the_handler_raises_before_training_flags_during_it_and_is_put_back() -> None:
    from dgx_trainer.train import InterruptedBySignal, _Sigterm

    previous = signal.getsignal(signal.SIGTERM)
    previous_sigchld = signal.getsignal(signal.SIGCHLD)  # a SIGTERM in training leaves it at the default
    sigterm = _Sigterm()
    sigterm.install()
    try:
        assert signal.getsignal(signal.SIGTERM) == sigterm._handle
        # Loading the model, preparing the data: nothing to save, out at once.
        with pytest.raises(InterruptedBySignal, match="before training began"):
            signal.raise_signal(signal.SIGTERM)
        sigterm.on_train_begin(None, None, None)
        signal.raise_signal(signal.SIGTERM)  # mid-step (or mid-save): only noted
        assert sigterm.received
        args = SimpleNamespace(device="cpu")
        control = SimpleNamespace(should_log=False, should_save=False, should_training_stop=False)
        sigterm.on_step_end(args, SimpleNamespace(global_step=6), control)
        assert (control.should_log, control.should_save, control.should_training_stop) == (True, True, True)
        assert sigterm.stopped_at == 6
    finally:
        sigterm.restore()
        signal.signal(signal.SIGCHLD, previous_sigchld)
    assert signal.getsignal(signal.SIGTERM) == previous


def test_a_signal_during_a_regular_save_stops_after_it_without_another_step() -> None:
    from dgx_trainer.train import _Sigterm

    sigterm = _Sigterm()
    sigterm.on_train_begin(None, None, None)
    args = SimpleNamespace(device="cpu")
    control = SimpleNamespace(should_log=False, should_save=False, should_training_stop=False)
    sigterm.on_step_end(args, SimpleNamespace(global_step=8), control)
    assert not control.should_training_stop  # no signal yet: the regular save of step 8 goes on
    previous_sigchld = signal.getsignal(signal.SIGCHLD)
    try:
        sigterm._handle(signal.SIGTERM, None)  # arrives while it is written
    finally:
        signal.signal(signal.SIGCHLD, previous_sigchld)
    sigterm.on_save(args, SimpleNamespace(global_step=8), control)
    assert control.should_training_stop
    assert sigterm.stopped_at == 8


#: A rank with DataLoader workers (GPU runs have them), its stop and its save. The agent signals the
#: rank's process group, so the workers die of the same SIGTERM; the "save" goes on until the kernel
#: has reported both deaths (waitid without reaping: a condition, not a wait), as a real save would.
WORKERS = """
import os, signal, sys, torch
from types import SimpleNamespace
from dgx_trainer.train import _Sigterm

sigterm = _Sigterm()
sigterm.install()
sigterm.on_train_begin(None, None, None)
batches = iter(torch.utils.data.DataLoader(torch.zeros(100000, 4), batch_size=2, num_workers=2))
next(batches)
print("ready", flush=True)
control = SimpleNamespace(should_log=False, should_save=False, should_training_stop=False)
step = 0
while not control.should_training_stop:
    step += 1
    torch.randn(64, 64) @ torch.randn(64, 64)
    sigterm.on_step_end(SimpleNamespace(device="cpu"), SimpleNamespace(global_step=step), control)
pids = [w.pid for w in batches._workers]
flags = os.WEXITED | os.WNOHANG | os.WNOWAIT
while not all(os.waitid(os.P_PID, pid, flags) for pid in pids):
    torch.randn(64, 64) @ torch.randn(64, 64)
print("saved at step", step, flush=True)
sys.exit(143)
"""


def test_dataloader_workers_dying_of_the_same_signal_do_not_break_the_save(tmp_path: Path) -> None:
    """torch's SIGCHLD handler raises "DataLoader worker ... is killed by signal: Terminated" in the
    main thread when a worker dies of a signal: mid-save, that was a crash instead of a checkpoint."""
    proc = subprocess.Popen(
        [sys.executable, "-c", WORKERS],
        cwd=tmp_path,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        start_new_session=True,  # its own process group, as torchrun gives each worker
    )
    try:
        assert proc.stdout is not None
        assert proc.stdout.readline() == "ready\n", proc.stderr.read() if proc.stderr else ""
        os.killpg(proc.pid, signal.SIGTERM)  # what the agent does
        out, err = proc.communicate(timeout=120)
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()
    assert proc.returncode == 143, err
    assert out.startswith("saved at step"), err
