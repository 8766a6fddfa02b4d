"""The environment ``spec.debug`` gives a worker, under torchrun: DistributedDataParallel must
still construct and run. With TORCH_DISTRIBUTED_DEBUG=DETAIL, torch 2.13's DDP segfaults in its
constructor (gloo, CPU): an interactive debug worker on a real node crashed there on `launch`
(tests/nodes/test_training.py). The variables come from the operator's own pod builder, so a
change there is tested here."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from tests.unit.render_helpers import one_pod, the_container

SCRIPT = r"""
import torch, torch.distributed as dist
from torch.nn.parallel import DistributedDataParallel as DDP
dist.init_process_group("gloo")
model = DDP(torch.nn.Linear(4, 2))
model(torch.ones(3, 4)).sum().backward()
import sys
sys.stdout.write(f"kubedgx-ddp-ok {dist.get_rank()} {dist.get_world_size()}\n")
sys.stdout.flush()
dist.barrier()  # as the trainer does: without it, gloo's teardown aborts now and then
dist.destroy_process_group()
"""
#: What debug mode sets for the workers' diagnostics (not the job's identity or rendezvous).
DEBUG_NAMES = ("NCCL_DEBUG", "TORCH_DISTRIBUTED_DEBUG", "TORCH_CPP_LOG_LEVEL", "PYTHONFAULTHANDLER")


@pytest.mark.timeout(300)
def test_ddp_runs_with_the_debug_modes_environment(tmp_path: Path) -> None:
    rendered = {e["name"]: e.get("value") for e in the_container(one_pod({"spec.debug": {"enabled": True}}))["env"]}
    debug = {name: rendered[name] for name in DEBUG_NAMES}
    assert debug["NCCL_DEBUG"] == "INFO", debug  # debug mode is on in this pod
    script = tmp_path / "ddp.py"
    script.write_text(SCRIPT)
    env = {k: v for k, v in os.environ.items() if not k.startswith(("PET_", "TORCHELASTIC_"))}
    env |= {**{k: str(v) for k, v in debug.items()}, "OMP_NUM_THREADS": "1"}
    proc = subprocess.run(
        [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node", "2", str(script)],
        capture_output=True,
        text=True,
        timeout=240,
        env=env,
        check=False,
    )
    output = proc.stdout + proc.stderr
    assert proc.returncode == 0, (debug, output[-3000:])
    for rank in (0, 1):
        assert f"kubedgx-ddp-ok {rank} 2" in output, output[-3000:]
