"""The typed schema of every configuration key: Hydra structured configs under the YAML groups.

Each dataclass below is registered in Hydra's ConfigStore; conf/train.yaml and conf/evaluate.yaml
start from them (`defaults: [train_schema, ...]`), and every data option starts from its own
(`conf/data/<option>.yaml`: `defaults: [/schema/data/<option>@_here_]`). So composing a config
rejects a key that does not exist and a value of the wrong type (`model.qk_norm=flase`,
`eval.every=abc`) before anything runs.

What a type cannot say lives in each field's metadata, read by xsa_exp.config.keys.check_schema() and by
docs/configuration.md's table of keys (`python -m xsa_exp.config.docs`):
  help     what the key does (one line)
  choices  the allowed values of a string key
  ge/gt/le/lt  bounds of a number (None, where the key is Optional, is always allowed)
  hint     what to do instead, appended to the error
  accepts  what a key typed Any (or a string with a pattern) accepts, in words
  missing  the error when a required key (???) is not set
Keys typed Any accept more than one type (xsa.layers: str | int | list[int]; trainer.devices:
int | "auto"); xsa_exp.config.checks.validate() checks them by hand, as it does every combination of keys
(divisibility, layer specs, batch arithmetic, the vocabulary a corpus supports).
"""

from __future__ import annotations

from dataclasses import MISSING as DC_MISSING
from dataclasses import dataclass, field
from typing import Any, Dict, List, Optional

from omegaconf import MISSING

PRECISIONS = ("auto", "32-true", "32", "64-true", "bf16-compute", "bf16-mixed", "16-mixed", "bf16-true", "16-true")


def key(default=DC_MISSING, help: str = "", *, factory=None, **checks):
    """A dataclass field with its documentation and constraints as metadata."""
    metadata = {"help": help, **checks}
    if factory is not None:
        return field(default_factory=factory, metadata=metadata)
    return field(default=default, metadata=metadata)


# ---------------------------------------------------------------- train.yaml

@dataclass
class ModelConfig:
    n_layer: int = key(MISSING, "transformer blocks (from the depth preset)", ge=1)
    n_embd: int = key(MISSING, "residual width; a multiple of n_head", ge=1)
    n_head: int = key(MISSING, "attention heads; head_dim = n_embd / n_head must be even (RoPE)", ge=1)
    n_kv_head: Optional[int] = key(None, "key/value heads (grouped-query attention), a divisor of n_head; "
                                         "null = n_head", ge=1)
    sequence_len: int = key(MISSING, "context length in tokens", ge=2)
    vocab_size: int = key(MISSING, "BPE vocabulary incl. 9 special tokens; data=sample supports at most 21249, "
                          "data=wiki 87522", ge=265,
                          hint="byte-level BPE needs 256 byte tokens + 9 special tokens")
    rope: bool = key(True, "rotary position embeddings")
    rope_base: float = key(100000.0, "RoPE base frequency", gt=0)
    qk_norm: bool = key(True, "RMS-normalize queries and keys")
    mlp_activation: str = key("relu2", "MLP nonlinearity", choices=("relu2", "gelu"))
    value_embeds: bool = key(True, "value embeddings on alternating layers, always including the last")
    ve_gate_channels: int = key(12, "input channels of the value-embedding gate (<= n_embd)", ge=1)
    resid_scalars: bool = key(True, "x = resid_lambda[i] * x + x0_lambda[i] * x0 before each block")
    logit_softcap: float = key(15.0, "tanh cap on the logits; 0 turns it off", ge=0)
    zero_init_proj: bool = key(True, "zero-initialize the output projections")
    tie_embeddings: bool = key(False, "share the token embedding with lm_head")
    window_pattern: str = key("L", "attention window per layer, the pattern tiled over layers: L full context, S "
                              "a quarter of it rounded up to 128 tokens; the last layer is always L",
                              accepts="a string of S and L")
    qk_scale: float = key(1.0, "q and k multiplied by it after QK-norm (sharper attention)", gt=0)
    smear: bool = key(False, "add lambda * sigmoid(gate) of the previous token's embedding to each position "
                             "(lambda from 0)")
    backout: bool = key(False, "subtract lambda x the residual after layer n_layer // 2 before the final norm "
                               "(lambda from 0.2)")
    wte_init_std: float = key(1.0, "std of the token embedding's normal init (untied)", gt=0)
    fc_init_scale: float = key(1.0, "the MLP input matrix's uniform init bound, x the other hidden matrices'", gt=0)
    resid_lambda_init: List[float] = key(help="resid_lambda at the first and the last layer, linear in between",
                                         factory=lambda: [1.0, 1.0])
    x0_lambda_init: List[float] = key(help="x0_lambda at the first and the last layer, linear in between",
                                      factory=lambda: [0.1, 0.1])
    ve_gate_init: float = key(0.0, "value-embedding gate weights ~ U(0, ve_gate_init); 0 = zeros", ge=0)
    fused_loss_head: bool = key(False, "lm_head, soft-cap and cross-entropy a chunk of tokens at a time (on CUDA "
                                       "outside the compiled forward: Liger-Kernel's fused kernel where installed), "
                                       "so the full logits never exist; the unfused head's loss to fp32 rounding")


@dataclass
class XSAConfig:
    alpha: float = key(1.0, "XSA strength; 0 is standard attention, 1 full XSA; learnable: the initial alpha",
                       ge=0, le=1, hint="use 0 (standard attention) to 1 (full XSA)")
    learnable: bool = key(False, "one alpha per (layer, head), trained by AdamW (lr optim.lr.xsa_theta)")
    parametrization: str = key("sigmoid", "learnable alpha = sigmoid(theta) in (0, 1), or tanh(theta) in (-1, 1)",
                               choices=("sigmoid", "tanh"))
    value_source: str = key("mixed", "v after value-embedding mixing (mixed) or before (plain)",
                            choices=("mixed", "plain"))
    # Any: a selection string, one layer index or a list of them; checked by resolve_layers in validate().
    layers: Any = key("all", "the layers XSA applies to", accepts="all, none, first:K, last:K, every:N, "
                      "ve (layers with value embeddings), non_ve, a layer index or a list of them")
    eps: float = key(1e-6, "the floor on |v_i|^2 that keeps v_i = 0 finite", gt=0,
                     hint="it is the floor on |v_i|^2 that keeps v_i = 0 finite")


@dataclass
class LrConfig:
    matrix: float = key(0.02, "hidden matrices (Muon, or AdamW with optim=adamw)", ge=0)
    embedding: float = key(0.2, "token embedding (AdamW)", ge=0)
    value_embedding: float = key(0.2, "value embeddings (AdamW)", ge=0)
    unembedding: float = key(0.004, "lm_head (AdamW)", ge=0)
    resid_scalar: float = key(0.005, "resid_lambda scalars", ge=0)
    x0_scalar: float = key(0.5, "x0_lambda scalars", ge=0)
    smear_backout: float = key(0.2, "the smear gate and lambda, the backout lambda (model.smear, model.backout)", ge=0)
    xsa_theta: float = key(0.05, "theta of learnable XSA (untuned)", ge=0)


@dataclass
class MuonConfig:
    momentum: float = key(0.95, "Muon momentum", ge=0, lt=1)
    momentum_start: float = key(0.85, "momentum at step 0, warmed up linearly to momentum", ge=0, lt=1)
    momentum_warmup_steps: int = key(300, "steps of the momentum warmup; 0 = none", ge=0)
    momentum_warmdown: Optional[float] = key(None, "momentum at the end of the lr warmdown, linear from momentum over "
                                             "it (after the warmup); null = constant", ge=0, lt=1)
    nesterov: bool = key(True, "Nesterov momentum")
    ns_steps: int = key(5, "Newton-Schulz iterations", ge=1)
    ns_coefficients: str = key("quintic", "Newton-Schulz polynomial", choices=("quintic", "polar_express"))
    ns_dtype: str = key("auto", "Newton-Schulz dtype; auto = bfloat16 (nanochat's) on CUDA and on CPUs with native "
                                "bf16 matmul, float32 on other CPUs", choices=("auto", "bfloat16", "float32"))
    sharded: bool = key(True, "under DDP, each rank orthogonalizes its share of each shape of matrix, then one "
                              "all_gather per shape (the same update; no effect on one device)")
    compile: Optional[bool] = key(None, "Muon's step as one torch.compile graph per shape group; null = as "
                                        "train.compile; false keeps it eager where a device's compiler fails on it")
    weight_decay: float = key(0.0, "Muon weight decay", ge=0)
    cautious_weight_decay: bool = key(False, "decay only where the update and the weight agree in sign, by the "
                                             "shape-adjusted lr (nanochat); false: every weight, by lr "
                                             "(torch.optim.Muon)")
    weight_decay_schedule: str = key("constant", "Muon weight decay over the run: constant, or cosine from "
                                                 "weight_decay to 0", choices=("constant", "cosine"))
    variance_reduction: bool = key(False, "NorMuon-style: after orthogonalization, each row (column of a wide matrix) "
                                          "divided by its running RMS, the update's norm kept")
    beta2: float = key(0.9, "decay of variance_reduction's running mean square", ge=0, lt=1)


@dataclass
class AdamWConfig:
    betas: List[float] = key(help="[beta1, beta2], each in [0, 1)", factory=lambda: [0.8, 0.95])
    eps: float = key(1e-10, "AdamW epsilon", gt=0)
    weight_decay: float = key(0.0, "weight decay of the AdamW groups", ge=0)
    matrix_weight_decay: float = key(0.0, "weight decay of hidden matrices when matrix_algorithm=adamw", ge=0)
    role_betas: Dict[str, List[float]] = key(help="betas of single AdamW roles (the keys of optim.lr), over betas; "
                                                  "+key.role=[b1,b2] adds one, ~key.role drops one",
                                             factory=dict)
    role_weight_decay: Dict[str, float] = key(help="weight decay of single AdamW roles (the keys of optim.lr), over "
                                                   "weight_decay and matrix_weight_decay; ~key.role drops one",
                                              factory=dict)
    fused: bool = key(True, "torch's fused AdamW kernel (one pass; skips a non-finite update on the device); false: "
                            "torch's foreach path, which differs from it in the last bit (the committed study's)")


@dataclass
class ScheduleConfig:
    warmup_steps: int = key(0, "steps warming the lr up linearly", ge=0)
    warmdown_frac: float = key(0.4, "fraction of steps decaying linearly to final_lr_frac", ge=0, le=1)
    final_lr_frac: float = key(0.0, "lr at the end, as a fraction of the peak", ge=0, le=1)


@dataclass
class TransferConfig:
    """Read-only: what optim.nanochat_transfer derives for this run (null when off), as config, so that
    `--cfg job --resolve` and wandb's config show it. Each key is ${nanochat_transfer:<key>}."""
    batch_tokens: Optional[int] = key("${nanochat_transfer:batch_tokens}",
                                      "read-only: tokens per update (derived, or as given)")
    batch_derived: Optional[bool] = key("${nanochat_transfer:batch_derived}",
                                        "read-only: whether nanochat's batch rule gave it")
    lr_factor: Optional[float] = key("${nanochat_transfer:lr_factor}", "read-only: the lrs' factor, sqrt(batch / 2^19)")
    muon_weight_decay: Optional[float] = key("${nanochat_transfer:muon_weight_decay}", "read-only: Muon's weight decay")
    horizon_tokens: Optional[int] = key("${nanochat_transfer:horizon_tokens}",
                                        "read-only: the run's horizon D in tokens")
    reference_tokens: Optional[float] = key("${nanochat_transfer:reference_tokens}",
                                            "read-only: nanochat's d12's horizon D_ref")


@dataclass
class OptimConfig:
    matrix_algorithm: str = key("muon", "optimizer of the hidden matrices", choices=("muon", "adamw"))
    lr_scale: float = key(1.0, "multiplies every learning rate (the stability sweep's knob)", gt=0,
                          hint="it multiplies every learning rate")
    width_lr_scaling: bool = key(True, "embedding/value-embedding/lm_head lrs x (n_embd / 768)^-0.5")
    nanochat_transfer: bool = key(False, "nanochat's transfer from its d12 at 2^19 tokens: the batch where "
                                         "train.total_batch_tokens is null (x (horizon / d12's)^0.383, a power of 2), "
                                         "lrs x sqrt(batch / 2^19), Muon weight decay x sqrt(batch / 2^19) x d12's "
                                         "horizon / this run's")
    transfer: TransferConfig = field(default_factory=TransferConfig)
    lr: LrConfig = field(default_factory=LrConfig)
    muon: MuonConfig = field(default_factory=MuonConfig)
    adamw: AdamWConfig = field(default_factory=AdamWConfig)
    schedule: ScheduleConfig = field(default_factory=ScheduleConfig)


@dataclass
class DataConfig:
    """The data group: each option (conf/data/*.yaml) has its own schema below."""
    name: str = key(MISSING, "the corpus", choices=("sample", "wiki", "climbmix", "local", "sft"))


@dataclass
class SampleDataConfig(DataConfig):
    name: str = key("sample", "the embedded corpus (KJV)", choices=("sample",))
    tokenizer_chars: Optional[int] = key(None, "characters the tokenizer learns from; null = its whole training "
                                              "split (3.9M)", ge=1)


@dataclass
class WikiDataConfig(DataConfig):
    name: str = key("wiki", "the embedded corpus (Wikipedia vital articles' leads)", choices=("wiki",))
    tokenizer_chars: Optional[int] = key(None, "characters the tokenizer learns from; null = its whole training "
                                              "split (4.8M)", ge=1)


DOC_CHARS_HELP = "the tokenizer learns from each document's first N characters (nanochat's 10,000); null = all"
PACKING_HELP = ("rows, training and validation: bestfit = nanochat's (each row starts at a document; documents "
                "best fitted from a buffer of 1,000, the last one cropped), concat = documents cut into rows")


@dataclass
class ClimbmixDataConfig(DataConfig):
    name: str = key("climbmix", "ClimbMix-400B, streamed", choices=("climbmix",))
    repo: str = key("karpathy/climbmix-400b-shuffle", "hub dataset of the shards")
    num_shards: int = key(6543, "shards in the repo; the last is validation", ge=2)
    num_train_shards: Optional[int] = key(None, "the first N shards are the training set; null = all but the last",
                                          ge=1)
    local_dir: Optional[str] = key(None, "a folder holding the shards; null = stream from the hub")
    tokenizer_chars: int = key(2_000_000_000, "characters of training text the tokenizer learns from", ge=1)
    tokenizer_doc_chars: Optional[int] = key(10_000, DOC_CHARS_HELP, ge=1)
    packing: str = key("bestfit", PACKING_HELP, choices=("bestfit", "concat"))
    shuffle_rows: int = key(4096, "rows shuffled in a buffer per reader", ge=1)
    num_workers: int = key(1, "DataLoader workers per rank; 0 = read in the training process", ge=0)


@dataclass
class LocalDataConfig(DataConfig):
    name: str = key("local", "your own .parquet/.jsonl/.json/.txt files, streamed", choices=("local",))
    path: str = key(MISSING, "a folder, a file or a glob (** recurses); files sorted by path",
                    missing="data=local needs data.path: a folder, file or glob of .parquet, .jsonl/.json or "
                            ".txt files")
    val_path: Optional[str] = key(None, "validation file(s); null = the last file of path")
    text_column: str = key("text", "the parquet column / json field that holds a document")
    txt_sample_by: str = key("document", "a .txt document: the whole file, a paragraph or a line",
                             choices=("document", "paragraph", "line"))
    tokenizer_chars: int = key(2_000_000_000, "characters of training text the tokenizer learns from", ge=1)
    tokenizer_doc_chars: Optional[int] = key(None, DOC_CHARS_HELP, ge=1)
    packing: str = key("concat", PACKING_HELP, choices=("bestfit", "concat"))
    shuffle_rows: int = key(4096, "rows shuffled in a buffer per reader", ge=1)
    num_workers: int = key(1, "DataLoader workers per rank; 0 = read in the training process", ge=0)


@dataclass
class ChatSourceConfig:
    format: str = key(MISSING, "row format", choices=("messages", "mmlu", "gsm8k"))
    path: Optional[str] = key(None, "hub dataset")
    subset: Optional[str] = key(None, "hub dataset subset")
    split: str = key("train", "split")
    data_files: Optional[str] = key(None, "local .jsonl/.json/.parquet files instead of the hub")
    max_rows: Optional[int] = key(None, "rows used; null = all", ge=1)


@dataclass
class SftDataConfig(DataConfig):
    name: str = key("sft", "the SFT chat mixture (stage=sft)", choices=("sft",))
    train_sources: Dict[str, ChatSourceConfig] = key(help="training sources by name", factory=dict)
    val_sources: Dict[str, ChatSourceConfig] = key(help="validation sources by name", factory=dict)
    gsm8k_tool_calls: bool = key(True, "GSM8K's calculator notes as tool calls, as nanochat (false: dropped)")


@dataclass
class TrainerConfig:
    accelerator: str = key("auto", "Lightning accelerator", choices=("auto", "cpu", "gpu", "cuda", "mps"))
    # Any: a device count or "auto" (also -1: all); checked in validate().
    devices: Any = key(1, "devices per node", accepts="an integer >= 1, auto or -1 (all)")
    num_nodes: int = key(1, "nodes", ge=1)
    precision: str = key("auto", "bf16-compute: nanochat's bf16 (bf16 embeddings and activations, fp32 master "
                                 "matrices cast in each matmul, no autocast); auto = bf16-compute on CUDA, bf16-mixed "
                                 "on native-bf16 CPUs from n_embd 768, else 32-true", choices=PRECISIONS)
    strategy: str = key("auto", "Lightning strategy",
                        choices=("auto", "ddp", "ddp_spawn", "ddp_find_unused_parameters_true", "single_device"),
                        hint="fsdp and deepspeed hand the optimizer flat shards, while Muon needs whole matrices "
                             "and the non-finite check whole gradients; use ddp (optim.muon.sharded splits Muon)")


@dataclass
class WandbConfig:
    project: str = key("xsa-exp", "wandb project")
    group: Optional[str] = key(None, "wandb group; a sweep's default is its directory name")
    name: Optional[str] = key(None, "wandb run name; default: the run directory's name")
    tags: List[str] = key(help="wandb tags", factory=list)


@dataclass
class LoggerConfig:
    wandb: Optional[WandbConfig] = key(None, "Weights & Biases besides metrics.csv (logger=wandb); null = CSV only")


@dataclass
class TrainLoopConfig:
    total_batch_tokens: Optional[int] = key(None, "tokens per optimizer step; null = nanochat's batch rule "
                                                   "(optim.nanochat_transfer)", ge=1)
    device_batch_size: int = key(MISSING, "sequences per micro-batch per device", ge=1)
    max_steps: Optional[int] = key(None, "run length in steps (first set of max_steps, target_tokens, epochs, "
                                         "param_data_ratio)", ge=1)
    target_tokens: Optional[int] = key(None, "run length in tokens", ge=1)
    epochs: Optional[int] = key(None, "passes over a corpus held in memory (data=sample, wiki, sft)", ge=1)
    param_data_ratio: float = key(20, "tokens per scaling parameter (hidden matrices + lm_head): the run's horizon "
                                      "(nanochat's compute-optimal rule)",
                                  gt=0)
    grad_clip: float = key(0.0, "max global grad norm; 0 = off", ge=0)
    skip_nonfinite_steps: int = key(0, "non-finite updates skipped before the run stops; 0 = stop at the first", ge=0)
    compile: bool = key(False, "torch.compile the training forward as one graph (fullgraph: a graph break is an "
                               "error) and Muon's step (one graph per shape of matrix, unless optim.muon.compile "
                               "says otherwise); evaluations run eager")
    cpu_threads: Optional[int] = key(None, "torch threads on CPU; null = torch's default (one per core); fp32 sums, "
                                     "and so results, depend on it", ge=1)
    peak_flops: Optional[float] = key(None, "one device's peak FLOP/s, for train/mfu; null = by CUDA device name "
                                      "(H100, H200, A100, B200 bf16 dense), no MFU on CPU", gt=0)
    ddp_bucket_mb: int = key(25, "DDP's gradient buckets, in MB: each one all-reduced as soon as its gradients are "
                                 "ready (BENCHMARKS.md, \"DDP\")", ge=1)
    checkpoint_every: int = key(0, "resumable checkpoint every N steps; 0 = final only", ge=0)
    keep_checkpoints: int = key(2, "newest periodic checkpoints kept", ge=1)


@dataclass
class EvalConfig:
    every: int = key(MISSING, "validation bpb every N steps (and at steps 0 and last); <= 0 = off")
    val_tokens: Optional[int] = key(None, "validation tokens per bpb evaluation; null = the whole split", ge=1)
    core_every: int = key(0, "CORE every N steps; <= 0 = off")
    core_max_per_task: int = key(500, "examples per CORE task during training", ge=1)
    bundle_dir: Optional[str] = key(None, "CORE eval bundle; null: $XSA_EXP_EVAL_BUNDLE, else "
                                          "~/.cache/xsa-exp/eval_bundle")
    diag_every: int = key(MISSING, "attention diagnostics every N steps; <= 0 = off")
    diag_rows: int = key(4, "validation rows in the fixed diagnostics batch", ge=1)


@dataclass
class LogConfig:
    ema_beta: float = key(0.9, "smoothing of train/loss_smooth", ge=0, lt=1)
    print_every: int = key(10, "console line every N steps", ge=1)


@dataclass
class TrainConfig:
    # The group choices, as Hydra records them (kept in config.yaml, so a run's files name its presets).
    depth_name: str = key("${hydra:runtime.choices.depth}", "the depth preset (depth=...)")
    stack_name: str = key("${hydra:runtime.choices.stack}", "the recipe the settings start from (stack=...)")
    stage_name: str = key("${hydra:runtime.choices.stage}", "the stage (stage=...)")
    seed: int = key(42, "seed of initialization and data order", ge=0, le=2**32 - 1)
    init_from: Optional[str] = key(None, "stage=sft: the base run directory it starts from")
    resume: Optional[str] = key(None, "auto: continue the run in hydra.run.dir from its newest valid checkpoint",
                                choices=(None, "auto"), hint="with hydra.run.dir set to the run")
    cache_dir: str = key("${oc.env:XSA_EXP_CACHE,'~/.cache/xsa-exp'}", "tokenizers and other derived data")
    model: ModelConfig = field(default_factory=ModelConfig)
    xsa: XSAConfig = field(default_factory=XSAConfig)
    optim: OptimConfig = field(default_factory=OptimConfig)
    # Any here, a structured node per option: each data option brings its own schema.
    data: Any = key(MISSING, "the corpus (data=sample | wiki | climbmix | local | sft)")
    trainer: TrainerConfig = field(default_factory=TrainerConfig)
    logger: LoggerConfig = field(default_factory=LoggerConfig)
    train: TrainLoopConfig = field(default_factory=TrainLoopConfig)
    eval: EvalConfig = field(default_factory=EvalConfig)
    log: LogConfig = field(default_factory=LogConfig)


# ---------------------------------------------------------------- evaluate.yaml

@dataclass
class MmluConfig:
    path: Optional[str] = key("cais/mmlu", "hub dataset of MMLU's test set")
    subset: Optional[str] = key("all", "hub dataset subset")
    split: str = key("test", "split")
    data_files: Optional[str] = key(None, "local .jsonl/.parquet files with the hub's columns")
    max_rows: Optional[int] = key(None, "rows used; null = all", ge=1)


@dataclass
class ChatCoreConfig:
    max_per_task: Optional[int] = key(None, "examples per task; null = every example", ge=1)
    max_new_tokens: int = key(512, "tokens per GSM8K / HumanEval answer", ge=1)
    tool_use: Optional[bool] = key(None, "calculator tool calls in answers; null = as the run's SFT data")
    batch_size: int = key(8, "prompts per forward pass and per generation batch", ge=1)
    humaneval_timeout_s: float = key(5, "per program, wall clock (and CPU); nanochat's 5", gt=0)
    humaneval_memory_mb: int = key(256, "address space per program, nanochat's 256; Python and HumanEval's tests "
                                   "need about 24", ge=64)
    mmlu: MmluConfig = field(default_factory=MmluConfig)


EVAL_METRICS = ("bpb", "core", "diagnostics", "chatcore")


@dataclass
class EvaluateEvalConfig:
    metrics: List[str] = key(help=f"any of {', '.join(EVAL_METRICS)}",
                             factory=lambda: ["bpb", "core", "diagnostics"])
    bundle_dir: Optional[str] = key(None, "CORE / ChatCORE eval bundle; null: $XSA_EXP_EVAL_BUNDLE, else "
                                          "~/.cache/xsa-exp/eval_bundle")
    val_tokens: Optional[int] = key(None, "null: the run's eval.val_tokens", ge=1)
    precision: Optional[str] = key(None, "null: the precision the run trained with",
                                   choices=(None, "32-true", "32", "64-true", "bf16-compute", "bf16-mixed",
                                            "16-mixed"))
    diag_rows: Optional[int] = key(None, "null: the run's eval.diag_rows", ge=1)
    core_max_per_task: Optional[int] = key(None, "null: every example (the published protocol)", ge=1)
    chatcore: ChatCoreConfig = field(default_factory=ChatCoreConfig)


@dataclass
class EvaluateConfig:
    run: str = key(MISSING, "the run directory or checkpoint to evaluate",
                   missing="evaluate.py needs run=<run directory or checkpoint>")
    device: str = key("auto", "the device to evaluate on; auto = cuda when available",
                      accepts="auto, cpu, cuda, cuda:N")
    wandb: bool = key(False, "also log the summary to a wandb run in the training run's project and group")
    eval: EvaluateEvalConfig = field(default_factory=EvaluateEvalConfig)


def typed(node, cls):
    """The schema's dataclass `cls` of a config node: one of a composed config (its interpolations resolved where they
    point, in the whole config), or of a saved config.yaml (merged onto the schema, so its defaults and types
    apply)."""
    from omegaconf import OmegaConf

    return OmegaConf.to_object(OmegaConf.merge(OmegaConf.structured(cls), OmegaConf.to_container(node, resolve=True)))


DATA_SCHEMAS = {"sample": SampleDataConfig, "wiki": WikiDataConfig, "climbmix": ClimbmixDataConfig,
                "local": LocalDataConfig, "sft": SftDataConfig}


def data_settings(node) -> DataConfig:
    """The typed settings of a `data` node, by the option's own schema (DATA_SCHEMAS)."""
    return typed(node, DATA_SCHEMAS[node.name])


def register() -> None:
    """The one start-up point, called by hydra_plugins/xsa_exp_schema whenever Hydra starts (an entry point or the
    compose API): the schema into Hydra's ConfigStore, and the resolvers conf/ uses. Hydra is imported here, not at
    the top: the model and optimizer read the schema's dataclasses without it."""
    from hydra.core.config_store import ConfigStore
    from omegaconf import OmegaConf

    from xsa_exp.arm import Arm
    from xsa_exp.config.arithmetic import nanochat_shape, transfer_figure

    # a run directory's name (train.yaml's hydra.run.dir)
    OmegaConf.register_new_resolver("run_name", Arm.run_name, replace=True)
    # optim.transfer: the figures optim.nanochat_transfer derives, as config (--cfg job --resolve, wandb's config)
    OmegaConf.register_new_resolver("nanochat_transfer", transfer_figure, replace=True)
    # depth=nanochat's shape from its depth: ${nanochat_shape:n_embd,${model.n_layer}}
    OmegaConf.register_new_resolver("nanochat_shape", lambda part, n_layer: nanochat_shape(n_layer)[
        ("n_embd", "n_head").index(part)], replace=True)
    cs = ConfigStore.instance()
    cs.store(name="train_schema", node=TrainConfig)
    cs.store(name="evaluate_schema", node=EvaluateConfig)
    for name, node in DATA_SCHEMAS.items():
        cs.store(group="schema/data", name=name, node=node)

