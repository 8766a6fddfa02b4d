"""The trainer's configuration: the contract between a DGXTrainingJob and the trainer image.

The operator embeds :class:`TrainerConfig` as ``spec.trainer`` of the CRD and writes it, as YAML,
into a ConfigMap that the trainer reads with ``python -m dgx_trainer --config FILE``. Both sides
validate it with the same schema and CEL rules (:mod:`dgx_api.schema`), so a config the API
server accepted is a config the trainer accepts, and a hand-written one fails the same way.

No torch import here: the operator image does not have it.
"""

from __future__ import annotations

from pathlib import Path
from typing import Annotated, Any, Literal

from pydantic import Field

from dgx_api import manifests
from dgx_api.schema import KubeModel, Problem, cel, pattern, structural_schema, validate

Dtype = Literal["auto", "bfloat16", "float16", "float32"]

ABSOLUTE_PATH = pattern(r"^/[^\x00]*$", "must be an absolute path (starting with /)")
LOCAL_PATH = pattern(r"^[^\x00]+$", "must be a file system path")

#: Mount points and node directories: always absolute.
AbsolutePath = Annotated[str, Field(pattern=ABSOLUTE_PATH, max_length=1024)]
#: Paths the trainer opens. Relative ones are resolved against the trainer's working directory:
#: the manifest's directory under `kubedgx run --local`, /opt/kubedgx/examples in the trainer image.
LocalPath = Annotated[str, Field(pattern=LOCAL_PATH, min_length=1, max_length=1024)]


class ModelSource(KubeModel):
    """The base model to fine-tune."""

    name: str = Field(
        min_length=1,
        max_length=1024,
        description=(
            "Local directory with a saved model (usually under a data mount), a Hugging Face hub id "
            "(used only where the pod may reach the hub; HF_HUB_OFFLINE is respected), or "
            "`builtin:tiny-llama` or `builtin:tiny-mixtral` (mixture-of-experts), tiny models the trainer builds "
            "locally for smoke tests."
        ),
    )
    revision: str | None = Field(
        default=None, max_length=256, description="Hub revision (branch, tag or commit) to pin."
    )
    trust_remote_code: bool = Field(
        default=False,
        description="Run model code shipped with the checkpoint. Off unless you trust its source.",
    )
    dtype: Dtype = Field(
        default="auto",
        description="Dtype of the non-quantized weights; `auto` picks bfloat16 where the hardware has it.",
    )
    attn_implementation: Literal["eager", "sdpa", "flash_attention_2"] | None = Field(
        default=None, description="Attention kernel; unset lets transformers choose."
    )


class DatasetSource(KubeModel):
    """Training data read from local disk: a data mount's cache, never the network."""

    cel_rules = (
        cel(
            "!has(self.messagesField) || "
            "(has(self.template) && (self.template == 'chat' || self.template == 'sharegpt'))",
            "messagesField is used only with template: chat or sharegpt",
            field_path=".messagesField",
        ),
        cel(
            "!has(self.evalPath) || !has(self.evalFraction) || self.evalFraction == 0.0",
            "evalPath and evalFraction both choose the evaluation data: set one",
            field_path=".evalFraction",
        ),
    )

    path: LocalPath = Field(
        description=(
            "File or directory with the data, usually under the mountPath of a DGXDataMount. A relative path "
            "is resolved against the trainer's working directory (the manifest's directory for kubedgx run --local)."
        )
    )
    format: Literal["auto", "jsonl", "parquet", "hf"] = Field(
        default="auto",
        description=(
            "`jsonl`, `parquet`, or `hf` for a dataset saved with save_to_disk; `auto` decides by the files found."
        ),
    )
    split: str = Field(default="train", max_length=64, description="Split to train on.")
    template: Literal["text", "chat", "sharegpt", "instruction", "prompt_completion"] = Field(
        default="text",
        description=(
            "`text` trains on textField as is; `chat` renders messagesField (role/content turns) with the "
            "chat template; `sharegpt` is chat in ShareGPT's form (a `conversations` list of from/value turns); "
            "`instruction` joins instructionField, inputField and outputField (Alpaca style); "
            "`prompt_completion` joins promptField and completionField."
        ),
    )
    text_field: str = Field(default="text", max_length=128, description="Column holding the text (template: text).")
    messages_field: str | None = Field(
        default=None,
        max_length=128,
        description=(
            "Column holding the turns (template: chat or sharegpt). Defaults to `messages` (chat) or "
            "`conversations` (sharegpt)."
        ),
    )
    instruction_field: str = Field(
        default="instruction", max_length=128, description="Instruction column (template: instruction)."
    )
    input_field: str = Field(
        default="input", max_length=128, description="Optional context column (template: instruction)."
    )
    output_field: str = Field(
        default="output", max_length=128, description="Expected answer column (template: instruction)."
    )
    prompt_field: str = Field(
        default="prompt", max_length=128, description="Prompt column (template: prompt_completion)."
    )
    completion_field: str = Field(
        default="completion", max_length=128, description="Completion column (template: prompt_completion)."
    )
    loss_on: Literal["auto", "completion", "all"] = Field(
        default="auto",
        description=(
            "Which tokens the loss is computed on. `completion`: the answer only (outputField, completionField, "
            "the assistant turns of chat data), prompt tokens get label -100, as TRL's completion_only_loss and "
            "assistant_only_loss do; `all`: every token; `auto`: `completion` for every template but `text`."
        ),
    )
    chat_template: str | None = Field(
        default=None,
        min_length=1,
        max_length=1024,
        description=(
            "Chat template for tokenizers without one, or to replace theirs: a built-in name (chatml, llama3, "
            "mistral, zephyr) or the path of a Jinja file (relative paths as for path)."
        ),
    )
    eval_path: LocalPath | None = Field(
        default=None,
        description=(
            "A separate evaluation file or directory, in the same format and template as the training data; "
            "its eval loss is reported in progress and in the job's status."
        ),
    )
    eval_fraction: float = Field(
        default=0.0,
        ge=0.0,
        lt=1.0,
        description="Fraction of the data held out for evaluation; 0 disables it (unless evalPath is set).",
    )
    tokenization_processes: int | None = Field(
        default=None,
        ge=1,
        le=256,
        description=(
            "Processes that render and tokenize the data before training, on every rank of a node at once. "
            "Unset: min(8, CPUs per local rank, rows / 1000), at least 1 (a small dataset is done before more "
            "processes would have started). The rows keep their order whatever the number."
        ),
    )


class Quantization(KubeModel):
    """How the frozen base weights are stored: 4-bit NF4 is QLoRA; off gives plain LoRA."""

    cel_rules = (
        cel(
            "!(has(self.loadIn4bit) && self.loadIn4bit && has(self.loadIn8bit) && self.loadIn8bit)",
            "loadIn4bit and loadIn8bit are mutually exclusive: pick one (4-bit is QLoRA)",
            field_path=".loadIn8bit",
        ),
    )

    load_in_4bit: bool | None = Field(
        default=None,
        alias="loadIn4bit",
        description="Load the base model in 4 bits (bitsandbytes). Defaults to true unless loadIn8bit is set.",
    )
    load_in_8bit: bool = Field(
        default=False, alias="loadIn8bit", description="Load the base model in 8 bits (bitsandbytes)."
    )
    quant_type: Literal["nf4", "fp4"] = Field(default="nf4", description="4-bit data type; nf4 is QLoRA's.")
    double_quant: bool = Field(
        default=True, description="Quantize the quantization constants too (saves ~0.4 bits/param)."
    )
    compute_dtype: Dtype = Field(
        default="auto", description="Dtype of the matmuls on dequantized weights; `auto` prefers bfloat16."
    )
    allow_fallback: bool = Field(
        default=True,
        description=(
            "When quantized loading is unusable (no bitsandbytes, no supported device), train plain LoRA "
            "in bf16/fp32 with a logged warning instead of failing. The effective mode is reported in progress."
        ),
    )


class Lora(KubeModel):
    """The low-rank adapters that are actually trained."""

    cel_rules = (
        cel(
            "!has(self.targetModules) || size(self.targetModules) > 0 || "
            "(has(self.targetParameters) && size(self.targetParameters) > 0)",
            "set targetModules (e.g. [q_proj, v_proj] or [all-linear]) or targetParameters (MoE experts)",
            field_path=".targetModules",
        ),
        cel(
            "!has(self.targetModules) || !('all-linear' in self.targetModules) || size(self.targetModules) == 1",
            "all-linear already selects every linear layer: list it alone",
            field_path=".targetModules",
        ),
    )

    r: int = Field(default=16, ge=1, le=1024, description="Adapter rank.")
    alpha: int = Field(default=32, ge=1, le=4096, description="Scaling numerator (lora_alpha); scale = alpha / r.")
    dropout: float = Field(default=0.05, ge=0.0, lt=1.0, description="Dropout on the adapter input.")
    target_modules: list[Annotated[str, Field(min_length=1, max_length=128)]] = Field(
        default_factory=lambda: ["all-linear"],
        max_length=64,
        description=(
            'Module names (or suffixes) to adapt, e.g. ["q_proj", "k_proj"]; ["all-linear"] adapts every '
            'linear layer but the output head. Defaults to ["all-linear"].'
        ),
    )
    target_parameters: list[Annotated[str, Field(min_length=1, max_length=128)]] = Field(
        default_factory=list,
        max_length=64,
        description=(
            "Parameter names to adapt directly, for fused MoE experts that are not nn.Linear, e.g. "
            '["experts.gate_up_proj", "experts.down_proj"] for Mixtral.'
        ),
    )
    bias: Literal["none", "all", "lora_only"] = Field(default="none", description="Which biases to train.")
    modules_to_save: list[Annotated[str, Field(min_length=1, max_length=128)]] = Field(
        default_factory=list,
        max_length=16,
        description="Modules trained in full and saved with the adapter (e.g. lm_head for new tokens).",
    )


class Training(KubeModel):
    """Optimisation hyper-parameters, in the names TRL's SFTConfig uses (camelCased)."""

    epochs: float = Field(default=1.0, gt=0.0, le=1000.0, description="Passes over the data.")
    max_steps: int | None = Field(
        default=None, ge=1, description="Stop after this many optimizer steps; overrides epochs."
    )
    per_device_batch_size: int = Field(default=4, ge=1, le=4096, description="Sequences per GPU per step.")
    gradient_accumulation_steps: int = Field(
        default=1, ge=1, le=4096, description="Micro-batches summed before each optimizer step."
    )
    learning_rate: float = Field(default=2e-4, gt=0.0, le=1.0, description="Peak learning rate.")
    lr_scheduler: Literal["linear", "cosine", "constant", "constant_with_warmup", "cosine_with_restarts"] = Field(
        default="cosine", description="Learning-rate schedule after warm-up."
    )
    warmup_ratio: float = Field(default=0.03, ge=0.0, lt=1.0, description="Fraction of steps spent warming up.")
    weight_decay: float = Field(default=0.0, ge=0.0, le=1.0, description="AdamW weight decay.")
    max_grad_norm: float = Field(default=1.0, ge=0.0, description="Gradient clipping norm; 0 disables clipping.")
    optimizer: Literal["adamw_torch", "adamw_torch_fused", "paged_adamw_8bit", "paged_adamw_32bit", "adafactor"] = (
        Field(default="adamw_torch", description="Optimizer; paged 8-bit AdamW saves memory on GPUs.")
    )
    max_seq_length: int = Field(
        default=2048, ge=1, le=1048576, description="Tokens per sequence; longer examples are truncated."
    )
    packing: bool = Field(default=False, description="Pack several short examples into each maxSeqLength sequence.")
    gradient_checkpointing: bool = Field(
        default=True,
        description="Recompute activations in the backward pass: less memory, ~30% more compute.",
    )
    precision: Literal["auto", "bf16", "fp16", "fp32"] = Field(
        default="auto",
        description=(
            "Mixed precision; `auto` picks bf16 on GPUs that have it, else fp16, fp32 on CPU. bf16 or fp16 on a "
            "run without GPUs (allowCpu) trains in fp32, with a warning and `precision: fp32` in progress; bf16 "
            "on a GPU without it is refused."
        ),
    )
    seed: int = Field(default=42, ge=0, le=2**31 - 1, description="Seed for data order, dropout and adapter init.")
    logging_steps: int = Field(default=10, ge=1, description="Report progress every N optimizer steps.")
    save_steps: int = Field(
        default=100,
        ge=1,
        description="Checkpoint every N steps: a restart or spot reclaim loses at most this many steps.",
    )
    save_total_limit: int = Field(default=3, ge=1, le=1000, description="Checkpoints kept on local disk.")
    eval_steps: int | None = Field(
        default=None, ge=1, description="Evaluate every N steps (needs dataset.evalFraction > 0 or dataset.evalPath)."
    )
    report_to: list[Literal["tensorboard", "mlflow", "wandb"]] = Field(
        default_factory=list,
        max_length=3,
        description=(
            "Experiment trackers. tensorboard writes event files into <output.dir>/runs (archived with the "
            "output); mlflow logs to MLFLOW_TRACKING_URI, else to <output.dir>/mlruns; wandb runs offline into "
            "<output.dir>/wandb unless WANDB_MODE says otherwise. Only global rank 0 reports."
        ),
    )
    collective_timeout_seconds: int | None = Field(
        default=None,
        ge=60,
        le=86400,
        description=(
            "How long a collective (an all-reduce, a barrier) waits for the slowest rank before PyTorch's "
            "watchdog aborts the run. Unset: 1800 s (PyTorch's default) for dense models, 7200 s for "
            "mixture-of-experts models, whose ranks on a node load one after another."
        ),
    )
    stop_on_non_finite_loss: int = Field(
        default=3,
        ge=0,
        le=1000,
        description=(
            "Stop training after this many consecutive progress reports whose loss is NaN or infinite (0: never): "
            "the run has diverged and would only diverge again on a restart. The termination message starts with "
            "LossDiverged and names the steps; lower learningRate, prefer bf16 to fp16, or check the data."
        ),
    )
    dataloader_workers: int | None = Field(
        default=None,
        ge=0,
        le=64,
        description=(
            "Data-loading worker processes per rank (0 loads batches in the training process, between steps). "
            "Unset: min(4, CPUs per local rank - 1), keeping one CPU per rank for the training loop, so 0 "
            "with one CPU per rank; 0 on a run without GPUs, whose CPUs do the training."
        ),
    )
    router_aux_loss_coef: float | None = Field(
        default=None,
        ge=0.0,
        le=1.0,
        description=(
            "Mixture-of-experts models: weight of the router's load-balancing loss added to the training loss "
            "(Mixtral's default is 0.001). Unset keeps the model config's choice; 0 turns the loss off. The aux "
            "loss is reported in progress as auxLoss."
        ),
    )


class Output(KubeModel):
    """Where checkpoints and the final adapter go."""

    dir: LocalPath = Field(
        default="/workspace/output",
        description=(
            "Directory for checkpoints, the adapter and summary.json; point it at an Out data mount to keep them."
        ),
    )
    save_merged: bool = Field(
        default=False,
        description="Also save the base model with the adapter merged in (full size, in the base dtype).",
    )


class TrainerConfig(KubeModel):
    """A QLoRA (or LoRA) supervised fine-tune run by the trainer image under torchrun."""

    cel_rules = (
        cel(
            "!has(self.training) || !has(self.training.evalSteps) || has(self.dataset.evalPath) || "
            "(has(self.dataset.evalFraction) && self.dataset.evalFraction > 0.0)",
            "evalSteps needs dataset.evalFraction > 0 or dataset.evalPath (there is nothing to evaluate on)",
            field_path=".training.evalSteps",
        ),
    )

    model: ModelSource = Field(description="The base model.")
    dataset: DatasetSource = Field(description="The training data.")
    quantization: Quantization = Field(
        default_factory=Quantization, description="Quantization of the base model (4-bit NF4 by default)."
    )
    lora: Lora = Field(default_factory=Lora, description="Adapter settings.")
    training: Training = Field(default_factory=Training, description="Optimisation hyper-parameters.")
    output: Output = Field(default_factory=Output, description="Checkpoint and artifact location.")
    memory_check: Literal["enforce", "warn", "off"] = Field(
        default="enforce",
        description=(
            "Before loading anything, estimate per-GPU memory from the model's config.json (weights at the "
            "configured quantization, LoRA and optimizer state, activations for the batch and sequence length) "
            "and compare it with the GPUs' memory: `enforce` ends the pod with exit code 2 and the numbers when "
            "it cannot fit, `warn` logs them and trains anyway, `off` skips the estimate."
        ),
    )
    allow_cpu: bool = Field(
        default=False,
        description=(
            "Run without GPUs (slowly) instead of refusing at preflight. For local runs and smoke tests; "
            "a GPU job that lands on a node without working GPUs should fail, not crawl."
        ),
    )

    @property
    def quantization_bits(self) -> int | None:
        """4, 8 or None (no quantization): the mode asked for, before any fallback."""
        q = self.quantization
        if q.load_in_8bit:
            return 8
        return None if q.load_in_4bit is False else 4


class ConfigError(ValueError):
    """A trainer config that cannot run; ``problems`` name each field and what to change."""

    def __init__(self, source: str, problems: list[Problem]) -> None:
        self.source = source
        self.problems = problems
        lines = "\n".join(f"  {p}" for p in problems)
        super().__init__(f"{source}: invalid trainer config:\n{lines}")


def trainer_schema() -> dict[str, Any]:
    """The structural schema of :class:`TrainerConfig`, as embedded in the CRD."""
    return structural_schema(TrainerConfig)


def parse_config(data: Any, source: str = "<config>") -> TrainerConfig:
    """Validate with the CRD's own schema and CEL rules, then build the model."""
    problems = validate(trainer_schema(), data)
    if problems:
        raise ConfigError(source, problems)
    return TrainerConfig.model_validate(data)


def load_config(path: str | Path) -> TrainerConfig:
    """Read a YAML or JSON trainer config file (JSON is YAML)."""
    text = Path(path).read_bytes()
    try:
        data = manifests.load(text)
    except manifests.ManifestError as exc:
        raise ConfigError(str(path), [Problem("", str(exc))]) from exc
    return parse_config(data, str(path))
