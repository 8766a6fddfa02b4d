"""What the trainer costs over plain TRL: the same model, data and hyper-parameters run through
`python -m dgx_trainer` and through a minimal TRL SFT script, side by side.

    python benchmarks/trainer_overhead.py            # 3 rounds of each, alternating
    python benchmarks/trainer_overhead.py --rounds 1

Both train builtin:tiny-llama (built once, locally) with QLoRA NF4 on the device present, on
examples/data/instructions.jsonl, for the same steps. Seconds per step are measured inside each
process between its 10th step and its last, so the ~6 s import and the model load are excluded;
peak RSS is each process's own (ru_maxrss). Target: time ratio <= 1.05.

The plain script runs twice per round: as TRL leaves a QLoRA model (adapters cast to bf16, whatever
the run's precision) and with the adapters back in fp32, which is what kubedgx trains in an fp32
run; the second is the like-for-like overhead on a CPU. On a bf16 GPU the two plain rows coincide.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import textwrap
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
DATA = ROOT / "examples" / "data" / "instructions.jsonl"
STEPS = 100
FROM_STEP = 10

HYPER = {
    "r": 16,
    "alpha": 32,
    "batch": 8,
    "lr": 5e-3,
    "max_length": 256,
    "seed": 42,
}

#: Measures seconds per step between FROM_STEP and the end, and the peak RSS; both scripts use it.
TIMER = textwrap.dedent(
    f"""
    import json, resource, time
    from transformers import TrainerCallback

    class StepTimer(TrainerCallback):
        def __init__(self):
            self.t0 = None
            self.s0 = None
        def on_step_end(self, args, state, control, **kw):
            if state.global_step == {FROM_STEP}:
                self.t0, self.s0 = time.perf_counter(), state.global_step
        def on_train_end(self, args, state, control, **kw):
            if self.t0 is not None and state.global_step > self.s0:
                per = (time.perf_counter() - self.t0) / (state.global_step - self.s0)
                print(json.dumps({{"event": "bench", "secondsPerStep": per}}), flush=True)

    def report_rss():
        print(json.dumps({{"event": "bench", "maxRssMb": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024}}),
              flush=True)
    """
)

PLAIN = TIMER + textwrap.dedent(
    f"""
    import sys, torch
    from datasets import load_dataset
    from peft import LoraConfig, prepare_model_for_kbit_training
    from transformers import AutoModelForCausalLM, AutoTokenizer, BitsAndBytesConfig
    from trl import SFTConfig, SFTTrainer

    model_dir, data, out, adapters = sys.argv[1:5]
    cuda = torch.cuda.is_available()
    dtype = torch.bfloat16 if cuda else torch.float32
    tok = AutoTokenizer.from_pretrained(model_dir)
    q = BitsAndBytesConfig(load_in_4bit=True, bnb_4bit_quant_type="nf4", bnb_4bit_use_double_quant=True,
                           bnb_4bit_compute_dtype=dtype, bnb_4bit_quant_storage=dtype)
    model = AutoModelForCausalLM.from_pretrained(model_dir, quantization_config=q, dtype=dtype,
                                                 device_map={{"": 0 if cuda else "cpu"}})
    model = prepare_model_for_kbit_training(model, use_gradient_checkpointing=False)

    def fmt(r):
        ctx = r["input"]
        prompt = f"### Instruction:\\n{{r['instruction']}}\\n\\n" + (f"### Input:\\n{{ctx}}\\n\\n" if ctx else "")
        return {{"text": prompt + "### Response:\\n" + r["output"] + tok.eos_token}}

    ds = load_dataset("json", data_files=data, split="train")
    ds = ds.map(fmt, remove_columns=ds.column_names)
    args = SFTConfig(output_dir=out, max_steps={STEPS}, per_device_train_batch_size={HYPER["batch"]},
                     learning_rate={HYPER["lr"]}, lr_scheduler_type="constant_with_warmup", warmup_steps=0.05,
                     logging_steps=10, save_steps=50, bf16=cuda, fp16=False, use_cpu=not cuda,
                     gradient_checkpointing=False, max_length={HYPER["max_length"]}, report_to=[], disable_tqdm=True,
                     seed={HYPER["seed"]}, data_seed={HYPER["seed"]}, dataset_text_field="text",
                     optim="adamw_torch", weight_decay=0.0, max_grad_norm=1.0)
    lora = LoraConfig(r={HYPER["r"]}, lora_alpha={HYPER["alpha"]}, lora_dropout=0.0, target_modules="all-linear",
                      task_type="CAUSAL_LM")
    trainer = SFTTrainer(model=model, args=args, train_dataset=ds, processing_class=tok, peft_config=lora,
                         callbacks=[StepTimer()])
    if adapters == "fp32":  # undo TRL's bf16 cast of a quantized model's adapters, as kubedgx does in fp32 runs
        for p in trainer.model.parameters():
            if p.requires_grad:
                p.data = p.data.float()
    trainer.train()
    trainer.model.save_pretrained(out + "/adapter")
    report_rss()
    """
)

OURS = TIMER + textwrap.dedent(
    """
    import sys
    import transformers
    from dgx_trainer import __main__ as entry

    # The same timer, added to the trainer's own callbacks.
    original = transformers.Trainer.__init__
    def init(self, *a, **kw):
        kw["callbacks"] = [*(kw.get("callbacks") or []), StepTimer()]
        original(self, *a, **kw)
    transformers.Trainer.__init__ = init
    code = entry.main(sys.argv[1:])
    report_rss()
    sys.exit(code)
    """
)


def config(out: Path) -> dict[str, Any]:
    return {
        "allowCpu": True,
        "model": {"name": "builtin:tiny-llama"},
        "dataset": {"path": str(DATA), "template": "instruction"},
        "quantization": {"loadIn4bit": True},
        "lora": {"r": HYPER["r"], "alpha": HYPER["alpha"], "dropout": 0.0, "targetModules": ["all-linear"]},
        "training": {
            "maxSteps": STEPS,
            "perDeviceBatchSize": HYPER["batch"],
            "learningRate": HYPER["lr"],
            "lrScheduler": "constant_with_warmup",
            "warmupRatio": 0.05,
            "maxSeqLength": HYPER["max_length"],
            "gradientCheckpointing": False,
            "loggingSteps": 10,
            "saveSteps": 50,
            "seed": HYPER["seed"],
            "optimizer": "adamw_torch",
        },
        "output": {"dir": str(out)},
    }


def run(cmd: list[str], env: dict[str, str]) -> dict[str, float]:
    proc = subprocess.run(cmd, env=env, capture_output=True, text=True, check=False)
    if proc.returncode != 0:
        raise SystemExit(f"{cmd[2] if len(cmd) > 2 else cmd}: exit {proc.returncode}\n{proc.stderr[-3000:]}")
    found: dict[str, float] = {}
    for line in proc.stdout.splitlines():
        if line.startswith('{"'):  # the trainers' own dict printouts are not JSON
            record = json.loads(line)
            if record.get("event") == "bench":
                found.update({k: v for k, v in record.items() if k != "event"})
    return found


def _cuda() -> bool:
    import torch

    return bool(torch.cuda.is_available())


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--rounds", type=int, default=3)
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        base = Path(tmp)
        sources = os.pathsep.join(str(ROOT / f) for f in ("trainer", "api"))
        env = {**os.environ, "HF_HUB_OFFLINE": "1", "HF_DATASETS_OFFLINE": "1", "KUBEDGX_CACHE": str(base / "cache"),
               "KUBEDGX_TERMINATION_LOG": "", "PYTHONPATH": sources}  # fmt: skip
        # Build the model once (through the trainer), then point the plain script at it.
        from dgx_api.trainer_config import parse_config
        from dgx_trainer import builtin, data

        cfg = parse_config(config(base / "warmup"))
        texts = builtin.texts(data.load_records(cfg.dataset, ROOT), cfg.dataset)
        os.environ["KUBEDGX_CACHE"] = env["KUBEDGX_CACHE"]
        model_dir = builtin.ensure("builtin:tiny-llama", texts)
        plain_script, ours_script = base / "plain.py", base / "ours.py"
        plain_script.write_text(PLAIN)
        ours_script.write_text(OURS)
        results: dict[str, list[dict[str, float]]] = {"plain": [], "plain-fp32": [], "kubedgx": []}
        for i in range(args.rounds):
            for name, adapters in (("plain", "trl"), ("plain-fp32", "fp32")):
                out = base / f"{name}-{i}"
                command = [sys.executable, str(plain_script), str(model_dir), str(DATA), str(out), adapters]
                results[name].append(run(command, env))
            out = base / f"ours-{i}"
            cfg_path = base / f"ours-{i}.json"
            cfg_path.write_text(json.dumps(config(out)))
            results["kubedgx"].append(run([sys.executable, str(ours_script), "--config", str(cfg_path)], env))
    median = {name: statistics.median(r["secondsPerStep"] for r in rounds) for name, rounds in results.items()}
    labels = {"plain": "plain TRL", "plain-fp32": "plain TRL, fp32 adapters", "kubedgx": "kubedgx"}
    print(f"{'':26} {'s/step (median)':>16} {'peak RSS MB (max)':>18}")
    for name, label in labels.items():
        rss = max(r["maxRssMb"] for r in results[name])
        print(f"{label:26} {median[name]:>16.4f} {rss:>18.0f}")
    ours = median["kubedgx"]
    print(f"time ratio kubedgx / plain TRL: {ours / median['plain']:.3f} (target <= 1.05)")
    print(f"time ratio kubedgx / plain TRL with fp32 adapters: {ours / median['plain-fp32']:.3f}")
    print(f"rounds: {args.rounds}, steps {STEPS}, device: {'cuda' if _cuda() else 'cpu'}")
    for name, rounds in results.items():
        print(f"  {name}: " + ", ".join(f"{r['secondsPerStep']:.4f}" for r in rounds))


if __name__ == "__main__":
    main()
