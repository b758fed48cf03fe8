"""One training run: config in, run directory out (config, metrics.csv, final checkpoint, tokenizer)."""

from __future__ import annotations

import contextlib
import secrets
import warnings
from pathlib import Path

import lightning as L
import torch
from lightning.pytorch.loggers import WandbLogger
from lightning.pytorch.strategies import DDPStrategy
from lightning.pytorch.utilities import rank_zero_info, rank_zero_only, rank_zero_warn
from omegaconf import DictConfig, OmegaConf

from xsa_exp import run_dir as rd
from xsa_exp.arm import Arm
from xsa_exp.cluster import cluster_plugins, device_peak_flops, export_submitit_local_ranks
from xsa_exp.config.arithmetic import (
    Transfer,
    batch_tokens,
    check_schedule,
    grad_accumulation,
    max_steps,
    nanochat_transfer,
    world_size,
)
from xsa_exp.config.schema import TrainConfig
from xsa_exp.console import quiet_wandb_logger, set_up_console, wandb_offline
from xsa_exp.data.datamodule import TextDataModule
from xsa_exp.errors import ConfigError, XsaExpWarning
from xsa_exp.eval.bundle import require_bundle
from xsa_exp.memory import memory_warning
from xsa_exp.model import GPT, GPTConfig
from xsa_exp.precision import BF16_COMPUTE, cpu_has_native_bf16, lightning_precision, newton_schulz_dtype, prepare
from xsa_exp.run_dir import LoadedRun, RunError, load_trained
from xsa_exp.run_lock import LockLost
from xsa_exp.training.checkpoints import (
    PeriodicCheckpoint,
    RunDirCheckpointIO,
    RunTokenizer,
    SameResumeCheckpoint,
    remove_untracked_step_checkpoints,
)
from xsa_exp.training.evaluations import AttentionDiagnostics, CoreEvaluation, ValidationBPB
from xsa_exp.training.host import FrozenGC, keep_freed_host_memory, use_expandable_segments
from xsa_exp.training.metrics_log import HostSync, RunCSVLogger, TrainMetrics, UpdateClock
from xsa_exp.training.module import LanguageModel
from xsa_exp.training.preemption import PreemptionCheckpoint
from xsa_exp.training.sole_writer import LockCheck, RunDirWriter
from xsa_exp.write_failures import write_failure

# On a CPU with native bf16 matmul, the narrowest width at which bf16-mixed was measured faster than fp32
# at no measurable val bpb cost (BENCHMARKS.md, "The default run and precision on CPU"): at 768 wide
# it was; at 128 and 256 wide it cost bpb.
CPU_BF16_MIN_WIDTH = 768


def accelerator_is_cuda(trainer_cfg: DictConfig) -> bool:
    return torch.cuda.is_available() and trainer_cfg.accelerator in ("auto", "gpu", "cuda")


def resolve_precision(trainer_cfg: DictConfig, n_embd: int) -> tuple[str, str]:
    """The precision for trainer.precision (xsa_exp/precision.py), and why it was chosen."""
    if trainer_cfg.precision != "auto":
        return str(trainer_cfg.precision), "trainer.precision"
    if accelerator_is_cuda(trainer_cfg):
        return BF16_COMPUTE, "auto: CUDA"
    if not cpu_has_native_bf16():
        return "32-true", "auto: CPU without native bf16 matmul"
    if n_embd < CPU_BF16_MIN_WIDTH:
        return "32-true", (f"auto: CPU; below model.n_embd={CPU_BF16_MIN_WIDTH} bf16-mixed cost val bpb "
                           "(BENCHMARKS.md), trainer.precision=bf16-mixed to trade")
    return "bf16-mixed", f"auto: CPU with native bf16 matmul and model.n_embd >= {CPU_BF16_MIN_WIDTH}"


def warn_if_it_will_not_fit(model: GPT, cfg: DictConfig, precision: str) -> None:
    """Before training, one line if the predicted peak memory exceeds the GPU's (xsa_exp/memory.py); the model in its
    training precision."""
    device = torch.cuda.get_device_properties(torch.cuda.current_device())
    message = memory_warning(model, cfg.train.device_batch_size, precision, cfg.train.compile,
                             cfg.optim.matrix_algorithm == "muon", device.total_memory, device.name,
                             cfg.model.sequence_len * world_size(cfg.trainer), batch_tokens(cfg))
    if message:
        rank_zero_warn(message, category=XsaExpWarning)


def build_loggers(cfg: DictConfig, run_dir: Path, summary: dict, wandb_id: str | None) -> list:
    loggers = [RunCSVLogger(save_dir=str(run_dir), name="", version="")]
    if cfg.logger.wandb is not None:
        w = cfg.logger.wandb
        offline = wandb_offline()
        logger = WandbLogger(project=w.project, group=w.group, name=w.name or run_dir.name, tags=list(w.tags),
                             save_dir=str(run_dir), offline=offline, id=wandb_id, resume="allow")
        quiet_wandb_logger(logger)
        logger.log_hyperparams({**summary, "config": OmegaConf.to_container(cfg, resolve=True)})
        loggers.append(logger)
        if offline:
            rank_zero_info(f"wandb: offline, logged under {run_dir / 'wandb'} (`wandb sync` uploads it)")
    return loggers


def print_start(model: GPT, cfg: DictConfig, run: dict, transfer: Transfer | None) -> None:
    lines = ["parameters:"] + [f"  {name:<28}{count:>14,}" for name, count in model.param_counts().items()]
    xsa = model.config.xsa
    if xsa.learnable:
        arm = f"learnable alpha = {xsa.parametrization}(theta), starting at {xsa.alpha}"
    else:
        arm = f"alpha = {xsa.alpha}" + (" (standard attention)" if xsa.alpha == 0 else "")
    lines.append(f"xsa: {arm}; layers {cfg.xsa.layers} -> {xsa.layers if xsa.layers else 'none'} "
                 f"of {model.config.n_layer}; value source {xsa.value_source}")
    muon = f"Muon for hidden matrices (Newton-Schulz in {run['ns_dtype']}, {run['ns_dtype_reason']}) + AdamW"
    lines.append(f"optimizer: {muon if run['ns_dtype'] else 'AdamW for everything'}")
    lines.append(f"schedule: {run['max_steps']} steps x {run['tokens_per_step']:,} tokens "
                 f"({run['max_steps'] * run['tokens_per_step']:,} tokens), grad accumulation "
                 f"{run['grad_accumulation']}, precision {run['precision']} ({run['precision_reason']})")
    if transfer is not None:
        lines.append(transfer.describe())
    lines.append(f"run directory: {run['run_dir']}")
    rank_zero_info("\n".join(lines))


def train(cfg: DictConfig, run_dir: Path) -> Path:
    """Train one model as configured; returns the run directory. The config is taken as checked: the preflight
    (xsa_exp/config/preflight.py) validates every run of a command line, each sweep job included, before any starts.
    The run holds the run directory's lock from before its first write to its end (training/sole_writer.py)."""
    set_up_console()
    export_submitit_local_ranks()
    if accelerator_is_cuda(cfg.trainer):
        use_expandable_segments()  # before anything initialises CUDA
    else:
        keep_freed_host_memory()
    run_dir = Path(run_dir).resolve()
    with RunDirWriter(run_dir) as writer:
        return train_as_writer(cfg, run_dir, writer)


def train_as_writer(cfg: DictConfig, run_dir: Path, writer: RunDirWriter) -> Path:
    completed, resume_from = previous_attempt(cfg, run_dir)
    if completed:
        rank_zero_info(f"run {run_dir} is already complete; nothing to do")
        return run_dir
    if cfg.train.cpu_threads is not None:
        torch.set_num_threads(cfg.train.cpu_threads)
    L.seed_everything(cfg.seed, workers=True, verbose=False)
    settings: TrainConfig = OmegaConf.to_object(cfg)  # typed: the model and optimizer take its parts
    model = GPT(GPTConfig.of(settings.model, settings.xsa))
    base = load_base_run(cfg, model)
    datamodule = TextDataModule(settings.data, settings.model.sequence_len, settings.model.vocab_size,
                                settings.train.device_batch_size, settings.seed, settings.cache_dir,
                                tokenizer_dir=base and base.run_dir / rd.TOKENIZER,
                                local_ranks=world_size(cfg.trainer) // cfg.trainer.num_nodes)
    arm = Arm.run_keys_of(cfg)
    transfer = nanochat_transfer(cfg)
    run = describe_run(cfg, run_dir, model, max_steps(cfg, datamodule), base, arm, transfer)
    if cfg.logger.wandb is not None:  # one wandb run across requeues and resumes: its id is kept in run.json
        run["wandb_id"] = resumed_wandb_id(run_dir) if resume_from else secrets.token_hex(4)
    # before the run's files are written: a run that fails this check leaves nothing that blocks its rerun
    check_schedule(run["max_steps"], cfg.optim.schedule.warmup_steps, cfg.optim.schedule.warmdown_frac)
    print_start(model, cfg, run, transfer)
    if resume_from is None:
        rank_zero_only(rd.set_aside_unfinished_logs)(run_dir)
        save_run_files(run_dir, cfg, run)
    else:
        rank_zero_info(f"resuming from {resume_from}")

    prepare(model, run["precision"])
    if accelerator_is_cuda(cfg.trainer):
        warn_if_it_will_not_fit(model, cfg, run["precision"])
    module = LanguageModel(model, settings.optim, transfer, run["max_steps"],
                           OmegaConf.to_container(cfg, resolve=True), settings.train.skip_nonfinite_steps,
                           compile=settings.train.compile)
    loggers = build_loggers(cfg, run_dir, arm, run.get("wandb_id"))
    callbacks = build_callbacks(cfg, run_dir, model, writer, resume_from)
    trainer = build_trainer(cfg, run, loggers, callbacks)
    if resume_from is not None:
        restore_csv_rows(run_dir, resume_from)
    fit(trainer, module, datamodule, resume_from, run_dir)
    writer.agree(trainer)  # before the writes that end the run
    preemption = next(c for c in callbacks if isinstance(c, PreemptionCheckpoint))
    if trainer.interrupted or preemption.stopped_at is not None:
        save_status(run_dir, "interrupted", trainer.global_step)
        preemption.hand_over()  # under submitit: requeue the job and exit
        return run_dir
    trainer.save_checkpoint(rd.final_checkpoint(run_dir))
    remove_untracked_step_checkpoints(trainer, run_dir)
    update_run_file(run_dir, epoch_tokens=datamodule.epoch_tokens)
    if cfg.eval.every > 0:
        update_run_file(run_dir, val_scope=datamodule.val_scope(cfg.eval.val_tokens))
    save_status(run_dir, "completed", trainer.global_step)
    rank_zero_info(f"done: metrics {run_dir / rd.METRICS}, checkpoint {rd.final_checkpoint(run_dir)}")
    return run_dir


def resumed_wandb_id(run_dir: Path) -> str:
    wandb_id = rd.read_run_info(run_dir).get("wandb_id")
    if wandb_id is None:
        raise RunError(f"{run_dir / rd.RUN} has no wandb_id (written before xsa-exp recorded one), so its wandb run "
                       "cannot be continued; start the run again in a new directory")
    return wandb_id


def previous_attempt(cfg: DictConfig, run_dir: Path) -> tuple[bool, str | None]:
    """(whether the run in run_dir is complete, the checkpoint to resume from): (False, None) for a new run.
    A run already there is an error unless resume=auto, and then its config must be this one."""
    # Under DDP every rank runs this with the same run_dir; only rank 0 creates the run, so only it
    # may find someone else's run there (the others may already see the config rank 0 just wrote).
    if cfg.resume != "auto" and rank_zero_only.rank != 0:
        return False, None
    if not (run_dir / rd.CONFIG).exists():
        found = sorted(p.name for p in rd.checkpoints_dir(run_dir).glob("*.ckpt")) if rank_zero_only.rank == 0 else []
        if found:  # not this project's partial start, which writes config.yaml before any checkpoint
            raise ConfigError(f"run directory {run_dir} holds checkpoints ({', '.join(found)}) but no config.yaml, so "
                              "they can be neither resumed nor checked against this run; nothing was overwritten — "
                              "choose a new hydra.run.dir")
        return False, None
    if cfg.resume != "auto":
        raise ConfigError(f"run directory {run_dir} already holds a run; nothing was overwritten — choose a new "
                          "hydra.run.dir, or add resume=auto to continue it")
    check_same_config(run_dir, cfg)
    rd.read_run_info(run_dir)  # a damaged run.json stops the run now, not when it is updated at the end
    if rd.read_status(run_dir).get("status") == "completed":
        check_final_checkpoint(run_dir)
        return True, None
    checkpoint = rd.newest_checkpoint(run_dir)
    if checkpoint is not None:
        rd.check_checkpoint_is_the_runs(checkpoint, OmegaConf.to_container(cfg, resolve=True))
        if not (run_dir / rd.METRICS).is_file():
            raise RunError(f"{run_dir / rd.METRICS} is missing, so the run's rows up to {checkpoint.name} cannot be "
                           "kept; restore it from a copy, or train the run again in a new hydra.run.dir")
    return False, checkpoint


def check_final_checkpoint(run_dir: Path) -> None:
    """A completed run left alone by resume=auto still has the checkpoint its results come from: one lost or damaged
    since (a failing disk, a copy cut short) is said now, not when the run is next evaluated."""
    final = rd.final_checkpoint(run_dir)
    try:
        rd.check_loads(final)
    except Exception as e:  # missing, truncated, corrupt: any load error
        raise RunError(f"run {run_dir} is complete, but its {final.name} does not load ({type(e).__name__}); restore "
                       "it from a copy, or train the run again in a new hydra.run.dir") from None


def describe_run(cfg: DictConfig, run_dir: Path, model: GPT, max_steps: int, base: LoadedRun | None,
                 arm: dict, transfer: Transfer | None) -> dict:
    """run.json's content: the arm, the schedule, nanochat's transfer, the precision and Newton-Schulz dtype (resolved
    here) and the model's counts."""
    precision, precision_reason = resolve_precision(cfg.trainer, cfg.model.n_embd)
    ns_dtype, ns_dtype_reason = (newton_schulz_dtype(cfg.optim.muon.ns_dtype, accelerator_is_cuda(cfg.trainer))
                                 if cfg.optim.matrix_algorithm == "muon" else (None, "no Muon"))
    if accelerator_is_cuda(cfg.trainer):
        torch.set_float32_matmul_precision("high")  # TF32 for the matmuls left in fp32 (as nanochat)
    return rd.run_info(run_dir=run_dir, max_steps=max_steps, tokens_per_step=batch_tokens(cfg),
                       grad_accumulation=grad_accumulation(cfg), precision=precision, precision_reason=precision_reason,
                       ns_dtype=ns_dtype, ns_dtype_reason=ns_dtype_reason,
                       float32_matmul_precision=torch.get_float32_matmul_precision(),
                       xsa_layers=model.config.xsa.layers, param_counts=model.param_counts(),
                       flops_per_token=model.flops_per_token(), arm=arm,
                       nanochat_transfer=transfer and transfer.as_dict(),
                       init_from=base and {"run": str(base.run_dir), "checkpoint": str(base.checkpoint),
                                           "step": base.step})


def build_strategy(cfg: DictConfig) -> str | DDPStrategy:
    """trainer.strategy, Lightning's DDP (ddp, its variants, or auto on several devices) tuned for these models:
    gradients are views into DDP's buckets (no copy between them, one gradient's memory less), buffers are not
    broadcast before every forward (the model's only buffers are its RoPE tables, the same on every rank), and the
    buckets are train.ddp_bucket_mb."""
    name = cfg.trainer.strategy
    if name not in ("ddp", "ddp_spawn", "ddp_find_unused_parameters_true") and not (
            name == "auto" and world_size(cfg.trainer) > 1):
        return name
    return DDPStrategy(start_method="spawn" if name == "ddp_spawn" else "popen",
                       find_unused_parameters=name == "ddp_find_unused_parameters_true",
                       gradient_as_bucket_view=True, broadcast_buffers=False, bucket_cap_mb=cfg.train.ddp_bucket_mb)


def build_trainer(cfg: DictConfig, run: dict, loggers: list, callbacks: list) -> L.Trainer:
    # conf/trainer/ is passed to the Trainer as it is (precision "auto" resolved in run.json, bf16-compute as the
    # 32-true it is to Lightning, DDP tuned); the rest is the run's.
    trainer = L.Trainer(
        **{**OmegaConf.to_container(cfg.trainer, resolve=True), "precision": lightning_precision(run["precision"]),
           "strategy": build_strategy(cfg)},
        max_steps=run["max_steps"], accumulate_grad_batches=run["grad_accumulation"],
        plugins=[*cluster_plugins(), RunDirCheckpointIO()], gradient_clip_val=cfg.train.grad_clip or None,
        logger=loggers, callbacks=callbacks,
        limit_val_batches=0, num_sanity_val_steps=0, enable_checkpointing=cfg.train.checkpoint_every > 0,
        enable_progress_bar=False, enable_model_summary=False, default_root_dir=run["run_dir"])
    # The run directory is ours: ModelCheckpoint's "not empty" warning is about the checkpoints a resumed run continues
    # from.
    warnings.filterwarnings("ignore", message="Checkpoint directory .* exists and is not empty")
    # torch 2.13 renames broadcast_buffers forward_sync_buffers; torch 2.11 (the GPU image's) has only the old name.
    warnings.filterwarnings("ignore", message="`broadcast_buffers` is deprecated")
    return trainer


def fit(trainer: L.Trainer, module: LanguageModel, datamodule: TextDataModule, resume_from: str | None,
        run_dir: Path) -> None:
    """trainer.fit, with status.json saying why it stopped if it raised; the wandb run finished either way."""
    exit_code = 1
    try:
        trainer.fit(module, datamodule=datamodule, ckpt_path=resume_from)
        exit_code = 0
    except BaseException as e:
        # Recorded so that a sweep's report lists this job as failed instead of reading a partial log as a result;
        # an exit (a launcher's requeue before training started) or Ctrl-C leaves it resumable, as interrupted. A failed
        # write is recorded with its one line by RunDirWriter; after a lost lock the directory is not ours to write.
        if not isinstance(e, LockLost) and write_failure(e, run_dir) is None:
            status = "interrupted" if isinstance(e, (SystemExit, KeyboardInterrupt)) else "failed"
            with contextlib.suppress(OSError):  # a full disk may refuse this too
                save_status(run_dir, status, trainer.global_step, f"{type(e).__name__}: {e}")
        raise
    finally:
        # A sweep's next job in this process (Hydra's basic launcher, a joblib worker) would otherwise log into this
        # wandb run: Lightning's WandbLogger reuses a run in progress. (Rank 0's; the others' is a stand-in.)
        for logger in trainer.loggers:
            if isinstance(logger, WandbLogger):
                logger.experiment.finish(exit_code=exit_code)


def load_base_run(cfg: DictConfig, model: GPT) -> LoadedRun | None:
    """stage=sft: put the base run's final weights into model (config.check_stage has matched the settings): its
    final.ckpt itself, never an earlier checkpoint in its place where that one does not load."""
    if cfg.stage_name != "sft":
        return None
    try:
        base = load_trained(rd.final_checkpoint(Path(cfg.init_from).expanduser().resolve()))
    except RunError as e:
        raise ConfigError(f"init_from: {e}") from None
    model.load_state_dict(base.model.state_dict())
    rank_zero_info(f"stage sft: starting from {base.checkpoint} (step {base.step})")
    return base


def build_callbacks(cfg: DictConfig, run_dir: Path, model: GPT, writer: RunDirWriter,
                    resume_from: str | None) -> list[L.Callback]:
    """The ranks' agreement on the checkpoint they resume from, before anything loads; the lock check next, before
    any callback writes; the run's tokenizer copied in next; train metrics next, so each step's train row precedes
    its evaluation rows; the update clock last, so the next update's time starts after all of them (Lightning runs
    the periodic checkpoint after every callback, so it is taken after every row of its step is logged, and restarts
    the clock itself). Every step with a console line, an evaluation or a checkpoint is a host-sync step; the updates
    between them never wait for the device."""
    tokens = batch_tokens(cfg)
    e = cfg.eval
    bundle = (require_bundle(e.bundle_dir, f"eval.core_every={e.core_every}", "use eval.core_every=0")
              if e.core_every > 0 else None)
    sync = HostSync([cfg.log.print_every, e.every, e.diag_every, e.core_every, cfg.train.checkpoint_every])
    clock = UpdateClock(sync)
    peak = device_peak_flops(torch.device("cuda" if accelerator_is_cuda(cfg.trainer) else "cpu"), cfg.train.peak_flops)
    metrics = TrainMetrics(tokens, cfg.log.ema_beta, cfg.log.print_every, clock, model.flops_per_token(), peak)
    callbacks = [SameResumeCheckpoint(run_dir, resume_from), LockCheck(writer, sync), RunTokenizer(run_dir), metrics,
                 ValidationBPB(e.every, e.val_tokens, tokens),
                 AttentionDiagnostics(e.diag_every, tokens, e.diag_rows, run_dir),
                 CoreEvaluation(e.core_every, tokens, bundle, e.core_max_per_task)]
    if cfg.train.checkpoint_every > 0:
        callbacks.append(PeriodicCheckpoint(run_dir, cfg.train.checkpoint_every, cfg.train.keep_checkpoints, clock))
    callbacks += [PreemptionCheckpoint(run_dir, metrics, sync, cfg.train.checkpoint_every), FrozenGC(), clock]
    return callbacks


def check_same_config(run_dir: Path, cfg: DictConfig) -> None:
    if diff := rd.config_differences(run_dir, OmegaConf.to_container(cfg, resolve=True)):
        raise ConfigError(f"run directory {run_dir} was started with a different config (sections {', '.join(diff)} "
                          "differ); resume with the same overrides or choose a new hydra.run.dir")


@rank_zero_only
def restore_csv_rows(run_dir: Path, checkpoint: Path) -> None:
    """Keep the rows (and diagnostics lines) up to the checkpoint's step, so the logs have no duplicated
    or missing steps after resume; each file is replaced whole, so a kill meanwhile loses nothing."""
    step = torch.load(checkpoint, map_location="cpu", weights_only=False, mmap=True)["global_step"]
    rd.keep_metric_rows(run_dir, step)
    rd.truncate_diagnostics(run_dir, step)


@rank_zero_only
def save_run_files(run_dir: Path, cfg: DictConfig, run: dict) -> None:
    rd.write_run_files(run_dir, OmegaConf.to_yaml(cfg, resolve=True), run)


@rank_zero_only
def update_run_file(run_dir: Path, **entries) -> None:
    rd.update_run_info(run_dir, **entries)


@rank_zero_only
def save_status(run_dir: Path, status: str, step: int, error: str | None = None) -> None:
    rd.write_status(run_dir, status, step, error)
