"""Failures named with their fix (reconcile/diagnosis.py) and the restart policy that acts on them
(planner/restarts.py): what the kubelet keeps of a failed worker, read as a user would want it.

The texts are PyTorch's own where PyTorch can make them here (torchrun's failure summary comes from
torch's ChildFailedError, the watchdog line from the format string in ProcessGroupNCCL.cpp)."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from dgx_operator.api.vocabulary import JOB, REASONS, JobPhase, JobReason
from dgx_operator.reconcile.diagnosis import Fields, diagnose, root_cause, summary
from dgx_operator.render import BuildContext
from tests.conftest import DELETE
from tests.unit.planner_sim import at, phase_reason, sim_of, start_running

#: What PyTorch 2.x prints when its NCCL watchdog gives up on a collective (rank-prefixed by the
#: logger, then the error repeated as the abort's reason), and what the process exits with.
WATCHDOG = (
    "[rank3]:[E1204 10:12:01.123456 88 torch/csrc/distributed/c10d/ProcessGroupNCCL.cpp:632] [Rank 3] Watchdog "
    "caught collective operation timeout: WorkNCCL(SeqNum=1801, OpType=ALLREDUCE, NumelIn=8650752, "
    "NumelOut=8650752, Timeout(ms)=600000) ran for 600094 milliseconds before timing out.\n"
    "[rank3]:[E1204 10:12:01.124000 88 ProcessGroupNCCL.cpp:2168] [PG ID 0 PG GUID 0(default_pg) Rank 3] "
    "failure detected by watchdog at work sequence id: 1801 PG status: last enqueued work: 1801, last "
    "completed work: 1800\n"
    "terminate called after throwing an instance of 'c10::DistBackendError'\n"
)
CUDA_OOM = (
    "Traceback (most recent call last):\n"
    '  File "/app/train.py", line 88, in <module>\n'
    "    loss.backward()\n"
    "[rank0]: torch.OutOfMemoryError: CUDA out of memory. Tried to allocate 2.00 GiB. GPU 0 has a total "
    "capacity of 79.15 GiB of which 1.06 GiB is free.\n"
)
RENDEZVOUS = (
    '  File "/usr/local/lib/python3.11/site-packages/torch/distributed/elastic/rendezvous/dynamic_rendezvous.py", '
    "line 680, in _run\n"
    "    raise RendezvousTimeoutError\n"
    "torch.distributed.elastic.rendezvous.api.RendezvousTimeoutError\n"
)


def torchrun_summary(tmp_path: Path, error: str | None, exitcode: int = 1) -> str:
    """torchrun's failure summary exactly as torch formats it: the failed worker's recorded traceback
    (``error``), or none (a program without @record, or a signal)."""
    from torch.distributed.elastic.multiprocessing.errors import ChildFailedError, ProcessFailure

    error_file = tmp_path / "error.json"
    if error is not None:
        callstack = f'Traceback (most recent call last):\n  File "train.py", line 3, in <module>\n{error}'
        message = {"message": error, "extraInfo": {"py_callstack": callstack, "timestamp": "1733300000"}}
        error_file.write_text(json.dumps({"message": message}))
    failure = ProcessFailure(local_rank=0, pid=4242, exitcode=exitcode, error_file=str(error_file))
    return ChildFailedError("train.py", {1: failure}).format_msg() + "\n"


# -- reading what the kubelet kept -----------------------------------------------------------------


def test_every_reason_a_diagnosis_ends_a_job_with_belongs_to_the_failed_phase() -> None:
    for reason in (JobReason.OUT_OF_MEMORY, JobReason.NCCL_TIMEOUT, JobReason.RENDEZVOUS_TIMEOUT, JobReason.STALLED):
        assert REASONS[JOB, reason].phase == JobPhase.FAILED
    assert REASONS[JOB, JobReason.INTERRUPTED].shows == "event"


def test_the_watchdog_line_is_an_nccl_timeout_with_its_rank_operation_and_the_knob() -> None:
    found = diagnose(WATCHDOG, exit_code=134, fields=Fields(collective_timeout_seconds=600))
    assert found is not None
    assert (found.reason, found.transient) == (JobReason.NCCL_TIMEOUT, True)
    assert found.message.startswith("rank 3: a collective ALLREDUCE did not complete in 600 s (timeout 600 s)")
    assert "raise training.collectiveTimeoutSeconds (now 600)" in found.message
    program = diagnose(WATCHDOG, fields=Fields(builtin_trainer=False))
    assert program is not None
    assert "init_process_group(timeout=...)" in program.message


def test_a_watchdog_line_without_the_rank_bracket_takes_the_loggers_rank_prefix() -> None:
    line = (
        "[rank5]:[E1204 ProcessGroupNCCL.cpp:632] Watchdog caught collective operation timeout: "
        "ran for 1800 milliseconds before timing out."
    )
    found = diagnose(line)
    assert found is not None
    assert found.message.startswith("rank 5: a collective operation did not complete in 2 s")


def test_cuda_out_of_memory_names_the_fields_with_their_values() -> None:
    fields = Fields(per_device_batch_size=8, max_seq_length=4096, gradient_checkpointing=False)
    found = diagnose(CUDA_OOM, exit_code=1, fields=fields)
    assert found is not None
    assert (found.reason, found.transient) == (JobReason.OUT_OF_MEMORY, False)
    assert found.message.startswith("rank 0: GPU out of memory (")
    assert "Tried to allocate 2.00 GiB" in found.message
    for fix in (
        "training.perDeviceBatchSize (now 8)",
        "training.maxSeqLength (now 4096)",
        "training.gradientCheckpointing (now off)",
    ):
        assert fix in found.message


def test_the_trainers_own_words_win_over_patterns_in_them() -> None:
    """The built-in trainer names the cause first; a CUDA OOM quoted in a LossDiverged message is
    not an OOM, and a crash that merely quotes a reason name is not that reason."""
    found = diagnose("OutOfMemory: CUDA out of memory on rank 0 (...); lower training.perDeviceBatchSize (now 4)")
    assert found is not None
    assert found.reason == JobReason.OUT_OF_MEMORY
    assert found.message.startswith("CUDA out of memory on rank 0")
    assert diagnose("RuntimeError: OutOfMemory: not really") is None
    interrupted = diagnose("Interrupted: SIGTERM at step 6 of 12; checkpoint-6 saved", exit_code=143)
    assert interrupted is not None
    assert (interrupted.reason, interrupted.transient) == (JobReason.INTERRUPTED, True)


def test_a_container_killed_at_its_memory_limit_is_host_out_of_memory() -> None:
    found = diagnose(None, reason="OOMKilled", exit_code=137, fields=Fields(memory="64Gi"))
    assert found is not None
    assert (found.reason, found.transient) == (JobReason.OUT_OF_MEMORY, False)
    assert "host memory limit" in found.message
    assert "raise spec.resources.memory (now 64Gi)" in found.message
    assert "training.dataloaderWorkers" in found.message


def test_a_rendezvous_timeout_is_transient() -> None:
    found = diagnose(RENDEZVOUS)
    assert found is not None
    assert (found.reason, found.transient) == (JobReason.RENDEZVOUS_TIMEOUT, True)
    assert "spec.elastic.rendezvous.joinTimeout" in found.message


def test_other_failures_are_not_diagnosed() -> None:
    assert diagnose("ValueError: bad row 3") is None
    assert diagnose("") is None
    assert diagnose(None, reason="Error", exit_code=1) is None


def test_torchruns_summary_shows_the_root_cause_not_its_banner(tmp_path: Path) -> None:
    text = "some output\n" + torchrun_summary(tmp_path, "ValueError: the answer column is empty in row 7")
    assert text.rstrip().splitlines()[-1].startswith("====")  # what the kubelet's last line was
    line = summary(text)
    assert line.startswith("rank 1 (local_rank 0) exited with code 1 on ")
    assert line.endswith(": ValueError: the answer column is empty in row 7")


def test_torchruns_summary_of_a_signal_names_it(tmp_path: Path) -> None:
    line = root_cause(torchrun_summary(tmp_path, None, exitcode=-9))
    assert line is not None
    assert line.startswith("rank 1 (local_rank 0) exited with code -9 (SIGKILL)")
    assert line.endswith(": Signal 9 (SIGKILL) received by PID 4242")


def test_torchruns_summary_without_a_recorded_traceback_says_where_to_look(tmp_path: Path) -> None:
    line = root_cause(torchrun_summary(tmp_path, None, exitcode=1))
    assert line is not None
    assert line.startswith("rank 1 (local_rank 0) exited with code 1 on ")
    assert "no Python traceback recorded (see the worker's log" in line


def test_a_summary_cut_by_the_kubelets_2_kib_still_reads(tmp_path: Path) -> None:
    """The kubelet keeps the last 2 KiB of the log: the top of the summary may be gone."""
    text = torchrun_summary(tmp_path, "RuntimeError: boom")
    cut = text[text.index("Root Cause") :]
    assert summary(cut).endswith(": RuntimeError: boom")
    assert summary("plain last words\n\n") == "plain last words"
    assert summary("error: x\n" + "=" * 40 + "\n") == "error: x"


# -- the restart policy by diagnosis ---------------------------------------------------------------


def failed(
    sim: Any, message: str | None, *, exit_code: int = 1, reason: str = "Error", index: int = 0
) -> dict[str, Any]:
    pod = sim.pod(index, "failed", exit_code=exit_code, message=message)
    pod["status"]["containerStatuses"][0]["state"]["terminated"]["reason"] = reason
    return pod


def condition_message(sim: Any, type_: str) -> str:
    return next(c.message for c in sim.status.conditions if c.type == type_)


@pytest.mark.parametrize("policy", ["OnFailure", "ExitCode"])
def test_out_of_memory_is_not_retried(ctx: BuildContext, policy: str) -> None:
    """Today a runtime OOM was retried up to backoffLimit x maxRestarts times; the same batch runs
    out of memory again, so the job ends at once with the fields to change."""
    sim = sim_of(ctx, {"spec.backoffLimit": 3, "spec.restartPolicy": policy})
    start_running(sim, 1)
    result = sim.reconcile([failed(sim, CUDA_OOM)], at_s=100)
    assert (sim.phase(), phase_reason(sim.status), sim.status.restarts) == ("Failed", "OutOfMemory", 0)
    assert [(e.type, e.reason) for e in result.events] == [("Warning", "OutOfMemory")]
    message = condition_message(sim, "Failed")
    assert message.startswith("job-worker-0 exited with code 1: OutOfMemory: rank 0: GPU out of memory")
    assert "training.perDeviceBatchSize (now " in message
    assert message.endswith("not restarted: the same config would fail the same way")


def test_oomkilled_is_not_retried_by_default_but_an_explicit_exit_code_is(ctx: BuildContext) -> None:
    """ExitCode's default codes (signals) include 137; only a code the user listed retries an OOM."""
    sim = sim_of(ctx, {"spec.backoffLimit": 3, "spec.restartPolicy": "ExitCode"})
    start_running(sim, 1)
    sim.reconcile([failed(sim, None, exit_code=137, reason="OOMKilled")], at_s=100)
    assert (sim.phase(), phase_reason(sim.status)) == ("Failed", "OutOfMemory")
    assert "job-worker-0 exited with code 137 (OOMKilled): OutOfMemory: the container went over" in condition_message(
        sim, "Failed"
    )
    chosen = sim_of(ctx, {"spec.backoffLimit": 3, "spec.restartPolicy": "ExitCode", "spec.retryableExitCodes": [137]})
    start_running(chosen, 1)
    chosen.reconcile([failed(chosen, None, exit_code=137, reason="OOMKilled")], at_s=100)
    assert (chosen.phase(), chosen.status.restarts) == ("Restarting", 1)


def test_an_nccl_timeout_is_retried_under_exit_code_whatever_torchruns_exit_code(ctx: BuildContext) -> None:
    """torchrun exits 1 whatever killed its worker: ExitCode's signal codes never matched an NCCL
    abort, which was therefore never retried."""
    sim = sim_of(ctx, {"spec.backoffLimit": 3, "spec.restartPolicy": "ExitCode"})
    start_running(sim, 1)
    result = sim.reconcile([failed(sim, WATCHDOG)], at_s=100)
    assert (sim.phase(), sim.status.restarts) == ("Restarting", 1)
    restarted = next(e for e in result.events if e.reason == "WorkerRestarted")
    assert restarted.message.startswith("job-worker-0 exited with code 1: NCCLTimeout: rank 3: a collective ALLREDUCE")


def test_an_nccl_timeout_past_the_backoff_limit_ends_the_job_named(ctx: BuildContext) -> None:
    sim = sim_of(ctx, {"spec.backoffLimit": 0})
    start_running(sim, 1)
    sim.reconcile([failed(sim, WATCHDOG)], at_s=100)
    assert (sim.phase(), phase_reason(sim.status)) == ("Failed", "NCCLTimeout")
    assert condition_message(sim, "Failed").endswith("backoffLimit 0 reached after 0 restart(s)")


@pytest.mark.parametrize(("text", "reason"), [(WATCHDOG, "NCCLTimeout"), (RENDEZVOUS, "RendezvousTimeout")])
def test_never_ends_the_job_with_the_diagnosis(ctx: BuildContext, text: str, reason: str) -> None:
    sim = sim_of(ctx, {"spec.restartPolicy": "Never"})
    start_running(sim, 1)
    sim.reconcile([failed(sim, text)], at_s=100)
    assert (sim.phase(), phase_reason(sim.status)) == ("Failed", reason)
    assert condition_message(sim, "Failed").endswith("restartPolicy is Never")


def test_a_command_jobs_failure_shows_torchruns_root_cause(ctx: BuildContext, tmp_path: Path) -> None:
    sim = sim_of(ctx, {"spec.restartPolicy": "Never", "spec.trainer": DELETE, "spec.command": ["torchrun", "t.py"]})
    start_running(sim, 1)
    sim.reconcile([failed(sim, torchrun_summary(tmp_path, "KeyError: 'labels'"))], at_s=100)
    assert (sim.phase(), phase_reason(sim.status)) == ("Failed", "WorkerFailed")
    message = condition_message(sim, "Failed")
    assert message.startswith("job-worker-0 exited with code 1: rank 1 (local_rank 0) exited with code 1 on ")
    assert ": KeyError: 'labels'; restartPolicy is Never" in message


def test_a_worker_that_checkpointed_on_sigterm_is_replaced_without_counting(ctx: BuildContext) -> None:
    """The trainer saved and exited 143 on a SIGTERM the operator did not send (a node shutting
    down): the work is kept, nothing is the program's fault."""
    sim = sim_of(ctx, {"spec.backoffLimit": 0})
    start_running(sim, 1)
    message = "Interrupted: SIGTERM at step 6 of 12; checkpoint-6 saved and marked complete"
    result = sim.reconcile([failed(sim, message, exit_code=143)], at_s=100)
    assert (sim.phase(), sim.status.restarts, sim.status.attempt) == ("Restarting", 0, 1)
    assert [(e.type, e.reason) for e in result.events] == [("Normal", "Interrupted"), ("Warning", "NodesBelowMinimum")]


# -- spec.maxIdle ------------------------------------------------------------------------------------


def report(step: int, seconds: float) -> dict[str, Any]:
    return {"step": step, "totalSteps": 100, "loss": 1.5, "updatedAt": at(seconds).strftime("%Y-%m-%dT%H:%M:%SZ")}


def test_a_job_without_progress_for_max_idle_is_restarted_as_stalled(ctx: BuildContext) -> None:
    sim = sim_of(ctx, {"spec.maxIdle": "10m", "spec.backoffLimit": 2, "spec.elastic": {"minNodes": 2}})
    running = start_running(sim, 2)
    quiet = sim.reconcile(running, at_s=120, progress=report(5, 110), progress_live=True)
    assert sim.phase() == "Running"
    assert quiet.requeue_after == pytest.approx(600 - 10)  # wakes when maxIdle after the report is up
    sim.reconcile(running, at_s=500, progress=report(9, 480), progress_live=True)
    assert sim.phase() == "Running"
    assert sim.status.progress is not None
    assert sim.status.progress.step == 9
    result = sim.reconcile(running, at_s=1080, progress_live=True)
    assert (sim.phase(), sim.status.restarts, sim.status.attempt) == ("Restarting", 1, 1)
    assert sorted(result.delete) == ["job-worker-0", "job-worker-1"]
    restarted = next(e for e in result.events if e.reason == "WorkerRestarted")
    assert restarted.message.startswith("Stalled: worker 0 (job-worker-0) reported no progress for spec.maxIdle (10m)")
    assert "its last report: step 9 at " in restarted.message


def test_a_stalled_job_under_never_fails(ctx: BuildContext) -> None:
    sim = sim_of(ctx, {"spec.maxIdle": "5m", "spec.restartPolicy": "Never"})
    running = start_running(sim, 1)
    sim.reconcile(running, at_s=60 + 301, progress_live=True)
    assert (sim.phase(), phase_reason(sim.status)) == ("Failed", "Stalled")
    assert "it has reported no progress since it started" in condition_message(sim, "Failed")


def test_max_idle_needs_the_operator_to_read_progress(ctx: BuildContext) -> None:
    """With progressInterval 0 the operator reads no reports: silence proves nothing."""
    sim = sim_of(ctx, {"spec.maxIdle": "5m"})
    running = start_running(sim, 1)
    sim.reconcile(running, at_s=5000, progress_live=False)
    assert sim.phase() == "Running"


def test_without_max_idle_a_silent_job_runs_on(ctx: BuildContext) -> None:
    sim = sim_of(ctx)
    running = start_running(sim, 1)
    sim.reconcile(running, at_s=50000, progress_live=True)
    assert sim.phase() == "Running"
