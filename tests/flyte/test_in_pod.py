"""The task's body as the worker pods run it: ``pyflyte-execute`` with the operator's PET_* variables,
two "pods" as two local processes of one rendezvous (CPU, gloo). One ``pyflyte-execute`` per pod,
torch elastic inside it (torchrun's own launcher); only the pod that holds global rank 0 writes
``outputs.pb``, the other ends with IgnoreOutputs: exit 0, nothing written."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

from flytekit.core.context_manager import FlyteContextManager
from flytekit.core.type_engine import TypeEngine
from flytekit.core.utils import load_proto_from_file, write_proto_to_file
from flytekit.models.literals import LiteralMap as LiteralMapModel

from tests.flyte.flyte import WORKFLOWS, template, workflows
from tests.support.ports import free_port

BIN = str(Path(sys.executable).parent)


def test_two_pods_one_rendezvous_rank_0_writes_the_output_and_the_other_writes_nothing(tmp_path: Path) -> None:
    from flyteidl.core import literals_pb2

    prefix = tmp_path / "prefix"
    prefix.mkdir()
    ctx = FlyteContextManager.current_context()
    inputs = TypeEngine.dict_to_literal_map(ctx, {"n": 5}, {"n": int})
    write_proto_to_file(inputs.to_flyte_idl(), str(prefix / "inputs.pb"))
    args = list(template(workflows().square, str(prefix)).container.args)
    port = free_port()
    env = os.environ | {
        "PATH": os.pathsep.join([BIN, os.environ.get("PATH", "")]),
        "PET_NNODES": "2",
        "PET_NPROC_PER_NODE": "1",
        "PET_RDZV_BACKEND": "c10d",
        "PET_RDZV_ENDPOINT": f"127.0.0.1:{port}",
        "PET_RDZV_ID": "flyte-in-pod-test",
        "PET_RDZV_CONF": "join_timeout=120,last_call_timeout=5",
        "PET_MAX_RESTARTS": "0",
        "FLYTE_FAIL_ON_ERROR": "true",
        "OMP_NUM_THREADS": "1",
    }
    logs = [tmp_path / f"pod-{i}.log" for i in range(2)]
    procs = []
    for log in logs:
        with log.open("w") as out:
            procs.append(subprocess.Popen(args, env=env, cwd=WORKFLOWS.parent, stdout=out, stderr=subprocess.STDOUT))
    codes = [p.wait(timeout=240) for p in procs]
    texts = [log.read_text(errors="replace") for log in logs]
    assert codes == [0, 0], "\n".join(t[-3000:] for t in texts)
    assert sum("global rank 0 ran on another node" in t for t in texts) == 1, "\n".join(t[-2000:] for t in texts)
    assert not (prefix / "error.pb").exists()
    out = LiteralMapModel.from_flyte_idl(load_proto_from_file(literals_pb2.LiteralMap, str(prefix / "outputs.pb")))
    assert out.literals["o0"].scalar.primitive.integer == 25


def test_one_process_runs_the_function_itself_and_a_raised_error_fails_the_pod(tmp_path: Path) -> None:
    """One node, one process: no launcher. A negative n raises: with FLYTE_FAIL_ON_ERROR (the
    connector sets it) pyflyte-execute exits 1 and error.pb holds the function's message."""
    from flyteidl.core import errors_pb2

    ctx = FlyteContextManager.current_context()
    env = os.environ | {"PATH": os.pathsep.join([BIN, os.environ.get("PATH", "")]), "PET_NNODES": "1",
                        "PET_NPROC_PER_NODE": "1", "FLYTE_FAIL_ON_ERROR": "true"}  # fmt: skip
    results = {}
    for n in (3, -2):
        prefix = tmp_path / f"n{n}"
        prefix.mkdir()
        write_proto_to_file(
            TypeEngine.dict_to_literal_map(ctx, {"n": n}, {"n": int}).to_flyte_idl(), str(prefix / "inputs.pb")
        )
        args = list(template(workflows().square, str(prefix)).container.args)
        results[n] = (subprocess.run(args, env=env, cwd=WORKFLOWS.parent, capture_output=True, text=True, timeout=120,
                                     check=False), prefix)  # fmt: skip
    ok, ok_prefix = results[3]
    assert ok.returncode == 0, ok.stderr[-2000:]
    assert (ok_prefix / "outputs.pb").exists()
    bad, bad_prefix = results[-2]
    assert bad.returncode == 1, bad.stderr[-2000:]
    doc = errors_pb2.ErrorDocument.FromString((bad_prefix / "error.pb").read_bytes())
    assert "n must be >= 0, got -2" in doc.error.message


def test_a_failed_worker_keeps_its_exception_s_kind_and_words() -> None:
    """torch elastic reports a child's failure as its error file's ``Type: text`` (a dict) or a
    hint (a str); the pod raises the child's words, and a FlyteRecoverableException stays one so
    that error.pb says RECOVERABLE and Flyte retries."""
    from flytekit.exceptions.user import FlyteRecoverableException

    from flytekitplugins.dgx.task import worker_failure

    plain = worker_failure(0, {"message": "ValueError: no square for -1", "extraInfo": {"py_callstack": "..."}})
    assert type(plain) is RuntimeError
    assert str(plain) == "worker process of global rank 0 failed: ValueError: no square for -1"
    again = worker_failure(1, {"message": "FlyteRecoverableException: USER:Recoverable: error=try again"})
    assert isinstance(again, FlyteRecoverableException)
    assert "global rank 1 failed: FlyteRecoverableException: USER:Recoverable: error=try again" in str(again)
    hint = worker_failure(0, "To enable traceback see: https://pytorch.org/docs/stable/elastic/errors.html")
    assert type(hint) is RuntimeError
    assert str(hint).endswith("failed: To enable traceback see: https://pytorch.org/docs/stable/elastic/errors.html")
