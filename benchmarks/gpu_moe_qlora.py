"""The prepared GPU check of issue 14: QLoRA on builtin:tiny-mixtral (2 layers, 8 fused experts) through kubedgx's own
trainer (``train.run``), printing one JSON object with memory per parameter, steps per second and
the adapters that trained.

    python benchmarks/gpu_moe_qlora.py                 # CUDA in bf16 where there is a GPU
    python benchmarks/gpu_moe_qlora.py --steps 5       # a CPU smoke run (fp32), as the tests do

Run it once when a session is lent a GPU (one short command, well inside the device budget) and
put the figures into docs/benchmarks.md. Nothing is downloaded: the trainer builds the model from
its recipe (seeded random weights, a tokenizer trained on the example data).

Figures:

- ``bytesPerParameter``: ``moe.bytes_per_parameter`` of the model as ``model.load`` returns it
  (every parameter, buffer and 4-bit quant state, per logical parameter), the issue's <= 0.6;
- ``cudaPeakAllocatedGiB`` / ``cudaPeakReservedGiB``: torch's allocator peaks over the whole run
  (load, staged expert quantization, training), null on the CPU;
- ``stepsPerSecond``: optimizer steps per second of the training loop (HF's
  train_samples_per_second over the samples per step; the load is not in it);
- ``adapters``: LoRA tensors in the saved adapter, and how many of the B matrices (initialised to
  zero) moved away from zero: all of them, or an adapter did not train;
- ``quantization``, ``precision``, ``firstLoss``, ``loss``, ``auxLoss``: what the run reported.
"""

from __future__ import annotations

import argparse
import contextlib
import io
import json
import os
import sys
import tempfile
from pathlib import Path
from typing import Any

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("HF_DATASETS_OFFLINE", "1")
ROOT = Path(__file__).resolve().parents[1]
for sub in ("api", "trainer"):
    sys.path.insert(0, str(ROOT / sub))

import torch  # noqa: E402

DATA = ROOT / "examples" / "data" / "instructions.jsonl"
EXPERTS = ["experts.gate_up_proj", "experts.down_proj"]


def config(out: Path, steps: int, cuda: bool) -> dict[str, Any]:
    return {
        "allowCpu": not cuda,
        "memoryCheck": "off",  # the figures are what this script measures
        "model": {"name": "builtin:tiny-mixtral", "dtype": "bfloat16" if cuda else "float32"},
        "dataset": {"path": str(DATA), "format": "jsonl", "template": "instruction"},
        "quantization": {"loadIn4bit": True, "quantType": "nf4", "doubleQuant": True, "allowFallback": False},
        "lora": {"r": 8, "alpha": 16, "dropout": 0.0, "targetModules": ["all-linear"], "targetParameters": EXPERTS},
        "training": {
            "maxSteps": steps,
            "perDeviceBatchSize": 8,
            "learningRate": 2e-3,
            "lrScheduler": "constant",
            "warmupRatio": 0.0,
            "maxSeqLength": 256,
            "gradientCheckpointing": True,
            "precision": "bf16" if cuda else "fp32",
            "optimizer": "paged_adamw_8bit" if cuda else "adamw_torch",
            "loggingSteps": max(1, steps // 10),
            "saveSteps": 10 * steps,
            "routerAuxLossCoef": 0.02,
        },
        "output": {"dir": str(out)},
    }


def adapter_figures(adapter_dir: Path) -> dict[str, int]:
    from safetensors.torch import load_file

    tensors = load_file(str(adapter_dir / "adapter_model.safetensors"))
    b = {n: t for n, t in tensors.items() if "lora_B" in n}
    return {
        "tensors": len(tensors),
        "loraB": len(b),
        "loraBTrained": sum(1 for t in b.values() if bool(t.float().abs().max() > 0)),
        "expertTensors": sum(1 for n in tensors if ".experts" in n),
    }


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--steps", type=int, default=60)
    args = parser.parse_args(argv)

    from dgx_api.progress import parse_event
    from dgx_api.trainer_config import parse_config
    from dgx_trainer import builtin, data, model, moe, train

    cuda = torch.cuda.is_available()
    with tempfile.TemporaryDirectory(prefix="kubedgx-gpu-check-") as tmp:
        os.environ.setdefault("KUBEDGX_CACHE", str(Path(tmp) / "cache"))
        base = Path(tmp)
        cfg = parse_config(config(base / "out", args.steps, cuda))
        records = data.load_records(cfg.dataset, ROOT)
        path = builtin.ensure(cfg.model.name, builtin.texts(records, cfg.dataset))
        device = "cuda" if cuda else "cpu"
        p = model.precision(cfg.training.precision, device)
        loaded = model.load(cfg, str(path), device, p)
        bytes_per_parameter = moe.bytes_per_parameter(loaded.model)
        parameters = moe.resident_bytes(loaded.model)[1]
        del loaded
        if cuda:
            torch.cuda.empty_cache()
            torch.cuda.reset_peak_memory_stats()
        rt = train.Runtime(base_dir=ROOT, output_dir=base / "out", termination_log=None, env=dict(os.environ))
        stdout = io.StringIO()
        with contextlib.redirect_stdout(stdout):
            summary = train.run(cfg, rt)
        events = [e for e in map(parse_event, stdout.getvalue().splitlines()) if e]
        progress = [e for e in events if e["event"] == "progress"]
        samples_per_step = cfg.training.per_device_batch_size * cfg.training.gradient_accumulation_steps
        samples_per_second = summary.get("samplesPerSecond")
        figures = {
            "device": torch.cuda.get_device_name(0) if cuda else "cpu",
            "torch": torch.__version__,
            "parameters": parameters,
            "bytesPerParameter": round(bytes_per_parameter, 4),
            "cudaPeakAllocatedGiB": round(torch.cuda.max_memory_allocated() / 2**30, 3) if cuda else None,
            "cudaPeakReservedGiB": round(torch.cuda.max_memory_reserved() / 2**30, 3) if cuda else None,
            "steps": summary["step"],
            # HF's train_samples_per_second: the training loop's wall time, without the load.
            "stepsPerSecond": round(samples_per_second / samples_per_step, 3) if samples_per_second else None,
            "samplesPerSecond": samples_per_second,
            "precision": summary["precision"],
            "quantization": summary["quantization"],
            "firstLoss": summary["firstLoss"],
            "loss": summary["loss"],
            "auxLoss": progress[-1].get("auxLoss") if progress else None,
            "adapters": adapter_figures(Path(summary["adapter"])),
        }
    print(json.dumps(figures, indent=2))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
