import os
import subprocess
import sys
import zipfile

import pytest
from omegaconf import OmegaConf

from tests.conftest import CONF_DIR, REPO, compose_config
from xsa_exp.config.checks import SAMPLE_CORPUS_MAX_VOCAB, validate
from xsa_exp.errors import ConfigError
from xsa_exp.eval.bundle import BundleError

GROUPS = sorted(p.name for p in CONF_DIR.iterdir() if p.is_dir() and p.name != "hydra")


@pytest.mark.parametrize("group, option", [(g, o.stem) for g in GROUPS for o in sorted((CONF_DIR / g).glob("*.yaml"))])
def test_every_config_group_option_composes_and_validates(group, option, tmp_path, monkeypatch):
    for var in ("HF_HUB_OFFLINE", "HF_DATASETS_OFFLINE"):  # climbmix presets would stream from the hub
        monkeypatch.delenv(var, raising=False)
    # presets that run CORE during training check that a bundle is there
    for name in ("core.yaml", "eval_meta_data.csv"):
        (tmp_path / name).touch()
    extra = []
    if (group, option) == ("data", "local"):  # data=local needs a corpus: two files, the last is validation
        for name in ("a.jsonl", "b.jsonl"):
            (tmp_path / name).write_text('{"text": "In the beginning."}\n')
        extra = [f"data.path={tmp_path}"]
    if option == "sft":  # the SFT stage (and its data) starts from a finished base run with the same settings
        base = tmp_path / "base"
        (base / "checkpoints").mkdir(parents=True)
        zipfile.ZipFile(base / "checkpoints" / "final.ckpt", "w").close()  # a checkpoint is a zip
        (base / "config.yaml").write_text(OmegaConf.to_yaml(compose_config(), resolve=True))
        extra = ["stage=sft", f"init_from={base}"]
    if group == "depth" and compose_config(f"depth={option}").model.vocab_size > SAMPLE_CORPUS_MAX_VOCAB:
        extra = ["data=climbmix"]  # the study's vocabulary is more than the embedded corpus can learn
    cfg = compose_config(f"{group}={option}", f"eval.bundle_dir={tmp_path}", *extra)
    validate(cfg)
    # and validate does check the option's model against its rules (7 divides none of the presets' widths)
    with pytest.raises(ConfigError, match="n_head"):
        validate(compose_config(f"{group}={option}", f"eval.bundle_dir={tmp_path}", *extra, "model.n_head=7"))


def test_depth_presets_have_the_study_sizes():
    d12, d24 = compose_config("depth=d12").model, compose_config("depth=d24").model
    assert (d12.n_layer, d12.n_embd, d12.n_head, d12.sequence_len, d12.vocab_size) == (12, 768, 12, 2048, 32768)
    assert (d24.n_layer, d24.n_embd, d24.n_head, d24.sequence_len, d24.vocab_size) == (24, 1024, 16, 2048, 32768)
    assert compose_config("xsa=off").xsa.alpha == 0.0 and compose_config().xsa.alpha == 1.0


@pytest.mark.parametrize("override, message", [
    ("xsa.alpha=1.5", "xsa.alpha=1.5 is outside [0, 1]"),
    ("xsa.alpha=-0.1", "xsa.alpha=-0.1 is outside [0, 1]"),
    ("xsa.layers=[0,9]", "layer 9 is out of range"),
    ("xsa.layers=middle", "unknown selection 'middle'"),
    ("model.n_embd=130", "model.n_embd=130 is not divisible by model.n_head=4"),
    ("xsa.value_source=post", "xsa.value_source='post' is not an option; allowed: mixed, plain"),
    ("optim.muon.ns_coefficients=cubic", "allowed: quintic, polar_express"),
    ("train.device_batch_size=3", "train.total_batch_tokens=2048 is not a multiple"),
    ("xsa.learnable=true", "xsa.alpha=1.0 is the initial alpha of a learnable run"),
    ("xsa.parametrization=softplus", "xsa.parametrization='softplus' is not an option; allowed: sigmoid, tanh"),
    ("xsa.eps=-1", "xsa.eps=-1 must be > 0"),
    ("optim.lr_scale=0", "optim.lr_scale=0 must be > 0"),
    ("eval.val_tokens=0", "eval.val_tokens=0 must be a positive integer"),
    ("optim.schedule.warmup_steps=100000", "optim.schedule.warmup_steps=100000 + the warmdown"),
])
def test_bad_values_raise_one_line_naming_the_key(override, message):
    with pytest.raises(ConfigError) as info:
        validate(compose_config(override))
    assert message in str(info.value) and "\n" not in str(info.value)


def test_core_during_training_needs_a_bundle(tmp_path):
    with pytest.raises(BundleError, match="eval.core_every=2000 needs the eval bundle, "
                                          "not found at .*use eval.core_every=0"):
        validate(compose_config("depth=d12", "model.vocab_size=4096", f"eval.bundle_dir={tmp_path / 'absent'}"))


def test_missing_package_is_named(monkeypatch):
    import importlib.util
    real = importlib.util.find_spec
    monkeypatch.setattr(importlib.util, "find_spec", lambda name, *a: None if name == "wandb" else real(name, *a))
    with pytest.raises(ConfigError, match="`wandb` cannot be imported"):
        validate(compose_config("logger=wandb"))
    validate(compose_config("logger=csv"))


def run_train(*args, tmp_path):
    run_dir = tmp_path / "run"
    result = subprocess.run([sys.executable, "train.py", *args, f"hydra.run.dir={run_dir}",
                             f"hydra.sweep.dir={run_dir}"], cwd=REPO, capture_output=True, text=True, timeout=120)
    return result, run_dir


@pytest.mark.parametrize("args, message", [
    (["xsa.alpha=2"], "config error: xsa.alpha=2 is outside [0, 1]"),
    (["xsa.layers=[7]"], "config error: xsa.layers: layer 7 is out of range; use indices in 0..3"),
    (["model.n_head=3"], "config error: model.n_embd=128 is not divisible by model.n_head=3"),
    (["depth=d13"], "config error: depth=d13 is not an option; allowed: d12, d24, l1_w64, l2_w128"),
    (["-m", "xsa=full,half"], "config error: xsa=half is not an option; allowed: full, learnable, off"),
    (["-m", "trainer=cpu", "trainer.devices=2", "seed=1,2"],
     "config error: multi-device training inside a local Hydra sweep"),
    (["-m", "hydra.sweep.dir=a,b"], "config error: hydra.sweep.dir=a,b: Hydra's own settings cannot be swept"),
    (["stack=nanochat_2604", "optim.adamw.role_betas={}"],
     "config error: optim.adamw.role_betas={} removes nothing: Hydra merges a dict override into the one there "
     "(unembedding, embedding, value_embedding, x0_scalar); to take its entries away, pass "
     "'~optim.adamw.role_betas.unembedding' '~optim.adamw.role_betas.embedding'"),
    (["-m", "stack=nanochat_2604", "seed=1,2", "optim.adamw.role_weight_decay={}"],
     "config error: optim.adamw.role_weight_decay={} removes nothing"),
    (["model.n_layer=${oops}"], "config error: model.n_layer: Interpolation key 'oops' not found"),
    (["-m", "seed=1,2", "data=climbmix", "data.local_dir=~/shards"],  # a ~ the shell did not expand
     "config error: cannot parse the override data.local_dir=~/shards (LexerNoViableAltException); Hydra's override "
     "grammar reserves some characters (a leading ~, brackets, braces, commas, quotes): quote such a value, "
     "'data.local_dir=\"~/shards\"'"),
])
def test_bad_config_exits_before_creating_a_run_directory(args, message, tmp_path):
    result, run_dir = run_train(*args, tmp_path=tmp_path)
    assert result.returncode != 0
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith(message), result.stderr
    assert not run_dir.exists()


def test_printing_hydras_node_resolved_names_the_command_that_does():
    """Hydra resolves its node alone for --cfg hydra --resolve, and the run directory names job keys."""
    result = subprocess.run([sys.executable, "train.py", "-c", "hydra", "--resolve"], cwd=REPO, capture_output=True,
                            text=True, timeout=120)
    assert result.returncode == 2 and result.stderr == (
        "config error: --cfg hydra --resolve: Interpolation key 'xsa.alpha' not found: Hydra resolves its node alone, "
        "without the run's keys that hydra.run.dir and hydra.sweep.dir name; print it resolved with --cfg all "
        "--resolve (add -p hydra for Hydra's node only)\n")
    printed = subprocess.run([sys.executable, "train.py", "--cfg", "all", "--resolve", "-p", "hydra.run"], cwd=REPO,
                             capture_output=True, text=True, timeout=120)
    assert printed.returncode == 0 and printed.stdout.startswith("# @package hydra.run\ndir: runs/"), printed.stderr


@pytest.mark.parametrize("entry", ["train", "evaluate"])
def test_help_says_what_the_entry_point_does_and_lists_only_its_groups(entry):
    """--help opens with the command's use and where every key is documented; train.py's group list names the two
    entries that are not choices of their own, and evaluate.py, which takes a run's own model config, lists none."""
    result = subprocess.run([sys.executable, f"{entry}.py", "--help"], cwd=REPO, capture_output=True, text=True,
                            timeout=120)
    assert result.returncode == 0, result.stderr
    assert result.stdout.startswith(f"python {entry}.py ") and "docs/configuration.md" in result.stdout
    assert ("depth: d12, d24" in result.stdout) == (entry == "train")
    if entry == "train":
        assert "experiment=study_base is the setting" in result.stdout and "not schema/data" in result.stdout
    assert result.stdout.rstrip().endswith(f"python {entry}.py --hydra-help")


LAUNCHES = {"torchrun": {"TORCHELASTIC_RUN_ID": "a1", "WORLD_SIZE": "8"}, "srun": {"SLURM_STEP_ID": "0",
                                                                                    "SLURM_NTASKS": "4"}}


@pytest.mark.parametrize("launcher", list(LAUNCHES))
def test_the_ranks_of_torchrun_or_srun_must_be_given_one_folder(launcher, monkeypatch, tmp_path, capsys):
    """Each process composes the command line; Hydra's default folder, by each one's clock, would differ."""
    from tests.hydra_app import compose_base
    from xsa_exp.config.preflight import Preflight, check_launch_shares_a_folder

    for name, value in LAUNCHES[launcher].items():
        monkeypatch.setenv(name, value)
    processes = LAUNCHES[launcher].get("WORLD_SIZE") or LAUNCHES[launcher]["SLURM_NTASKS"]
    for argv, key in ((["seed=1"], "hydra.run.dir"), (["-m", "seed=1,2"], "hydra.sweep.dir")):
        with pytest.raises(ConfigError) as refused:
            check_launch_shares_a_folder(compose_base("train", argv)[0], key)
        assert str(refused.value) == (
            f"this is one of {processes} processes started by {launcher}, and {key} is named by the clock, which each "
            f"process reads for itself; give them all the same {key}=<folder> (with resume=auto, a requeue continues "
            "it)")
        for given in (f"{key}={tmp_path / 'run'}", f"++{key}={tmp_path / 'run'}"):
            check_launch_shares_a_folder(compose_base("train", [*argv, given])[0], key)
        with pytest.raises(ConfigError, match="is named by the clock"):  # a folder given with the clock in it
            check_launch_shares_a_folder(compose_base("train", [*argv, f"{key}={tmp_path}/" + "${now:%H%M%S}"])[0],
                                         key)
    with pytest.raises(SystemExit) as stopped:  # the preflight callback runs it
        Preflight("train").on_run_start(compose_base("train", ["seed=1"])[0])
    assert stopped.value.code == 2 and capsys.readouterr().err.startswith("config error: this is one of")
    monkeypatch.setenv({"torchrun": "LOCAL_RANK", "srun": "SLURM_LOCALID"}[launcher], "1")
    with pytest.raises(SystemExit) as stopped:  # the node's other processes: the same status, the line once
        Preflight("train").on_run_start(compose_base("train", ["seed=1"])[0])
    assert stopped.value.code == 2 and capsys.readouterr().err == ""
    for rank, line in (("0", "config error: model.qk_norm=flase"), ("1", "")):  # a composition error, the same way
        env = {**os.environ, "LOCAL_RANK": rank, "SLURM_LOCALID": rank}
        refused = subprocess.run([sys.executable, "train.py", "model.qk_norm=flase"], cwd=REPO, env=env,
                                 capture_output=True, text=True, timeout=120)
        assert refused.returncode == 2 and refused.stderr.startswith(line) and (line or not refused.stderr)
    monkeypatch.setenv("WORLD_SIZE", "1")  # a one-process torchrun, or salloc's shell: no other process
    monkeypatch.setenv("SLURM_JOB_NAME", "interactive")
    check_launch_shares_a_folder(compose_base("train", ["seed=1"])[0], "hydra.run.dir")


TORCHRUN_8 = {"TORCHELASTIC_RUN_ID": "a1", "WORLD_SIZE": "8", "LOCAL_WORLD_SIZE": "8"}
SRUN = {"SLURM_STEP_ID": "0", "SLURM_JOB_NAME": "train"}


@pytest.mark.parametrize("launch, overrides, message, fix", [
    (TORCHRUN_8, [], "torchrun started 8 processes on 1 node, but trainer.devices=1 and trainer.num_nodes=1 ask for 1 "
     "on 1 node; set trainer.devices=8 trainer.num_nodes=1 (one process per device)",
     ["trainer.devices=8", "trainer.num_nodes=1"]),
    (TORCHRUN_8, ["trainer.devices=4", "trainer.num_nodes=2"], "torchrun started 8 processes on 1 node, but "
     "trainer.devices=4 and trainer.num_nodes=2 ask for 8 on 2 nodes; set trainer.devices=8 trainer.num_nodes=1 (one "
     "process per device)", ["trainer.devices=8", "trainer.num_nodes=1"]),
    ({**SRUN, "SLURM_NTASKS": "16", "SLURM_NNODES": "2"}, ["trainer.devices=4"], "srun started 16 processes on 2 "
     "nodes, but trainer.devices=4 and trainer.num_nodes=1 ask for 4 on 1 node; set trainer.devices=8 "
     "trainer.num_nodes=2 (one process per device)", ["trainer.devices=8", "trainer.num_nodes=2"]),
    ({**SRUN, "SLURM_NTASKS": "5", "SLURM_NNODES": "2"}, ["trainer.devices=2", "trainer.num_nodes=2"], "srun started "
     "5 processes on 2 nodes, but trainer.devices=2 and trainer.num_nodes=2 ask for 4 on 2 nodes; give every node the "
     "same number of tasks (one process per device)", None),
    ({"SLURM_NTASKS": "8", "SLURM_JOB_NAME": "train"}, ["trainer.devices=8"],  # sbatch -n 8, then python, no srun
     "this SLURM job has 8 tasks (SLURM_NTASKS), but this process was not started by srun: Lightning would wait for 7 "
     "more ranks that never start; start the run with srun (one task per device)", None),
    ({"SLURM_NTASKS": "1", "SLURM_JOB_NAME": "train"}, ["trainer.devices=8"],  # sbatch --ntasks=1, then python
     "this SLURM job has 1 task (SLURM_NTASKS) on 1 node, but trainer.devices=8 and trainer.num_nodes=1 ask for 8 on 1 "
     "node; give the job 8 tasks per node and start the run with srun, or set trainer.devices=1 trainer.num_nodes=1",
     ["trainer.devices=1", "trainer.num_nodes=1"]),
])
def test_the_processes_torchrun_or_slurm_started_must_be_the_runs_devices(launch, overrides, message, fix,
                                                                          monkeypatch, tmp_path, capsys):
    """Each of them is one rank on one device: another count would train copies of the run on one GPU, or one rank
    with the batch of several."""
    from tests.hydra_app import compose_base
    from xsa_exp.config.preflight import Preflight, check_launch_matches_devices

    for name in ("TORCHELASTIC_RUN_ID", "WORLD_SIZE", "LOCAL_WORLD_SIZE", "SLURM_NTASKS", "SLURM_NNODES",
                 "SLURM_NTASKS_PER_NODE", "SLURM_STEP_ID", "SLURM_JOB_NAME"):
        monkeypatch.delenv(name, raising=False)
    for name, value in launch.items():
        monkeypatch.setenv(name, value)
    run = [f"hydra.run.dir={tmp_path / 'run'}", "trainer=cpu", "train.total_batch_tokens=65536"]
    with pytest.raises(SystemExit) as stopped:
        Preflight("train").on_run_start(compose_base("train", [*run, *overrides])[0])
    assert stopped.value.code == 2 and capsys.readouterr().err == f"config error: {message}\n"
    if fix:
        check_launch_matches_devices(compose_base("train", [*run, *fix])[0])
    if "SLURM_NTASKS" in launch:  # salloc's shell: Lightning starts the ranks itself, as many as the run asks for
        monkeypatch.setenv("SLURM_JOB_NAME", "interactive")
        check_launch_matches_devices(compose_base("train", [*run, *overrides])[0])


def test_a_sweep_submitted_from_inside_a_slurm_job_is_not_taken_for_its_ranks(monkeypatch, tmp_path):
    """`python train.py -m hydra/launcher=slurm ...` from an sbatch script or an allocation of several tasks: one
    process, which only submits the jobs, so Hydra's clock-named sweep folder is its alone."""
    from tests.hydra_app import compose_base
    from xsa_exp.config.preflight import check_launch_shares_a_folder

    monkeypatch.delenv("SLURM_STEP_ID", raising=False)
    for name, value in {"SLURM_NTASKS": "8", "SLURM_NNODES": "1", "SLURM_JOB_NAME": "driver"}.items():
        monkeypatch.setenv(name, value)
    check_launch_shares_a_folder(compose_base("train", ["-m", "seed=1,2"])[0], "hydra.sweep.dir")


def test_a_gpu_run_on_a_machine_without_one_is_one_line(tmp_path, monkeypatch):
    """Where it would start: here, not on the SLURM nodes a submitted sweep runs on."""
    from tests.hydra_app import preflight
    from xsa_exp.config import checks
    from xsa_exp.config import preflight as preflight_module

    for module in (checks, preflight_module):
        monkeypatch.setattr(module, "cuda_here", lambda: False)
    with pytest.raises(ConfigError, match=r"^trainer.accelerator=gpu, but torch sees no CUDA GPU on this machine \(a "
                                          r"CPU build of torch, or no GPU visible\); use trainer=cpu here"):
        preflight("train", ["trainer=gpu"])
    preflight("train", ["-m", "hydra/launcher=slurm", "trainer=gpu", "trainer.devices=1", "resume=auto",
                        f"hydra.sweep.dir={tmp_path / 'sweep'}"])
    with pytest.raises(ConfigError, match=r"^device=cuda:1, but torch sees no CUDA GPU on this machine"):
        preflight("evaluate", [f"run={tmp_path}", "device=cuda:1", "eval.metrics=[bpb]"])


@pytest.mark.parametrize("arg, message", [
    ("hydra.run.dir=",
     "hydra.run.dir is empty, and Hydra would run in the current folder; give it a folder of its own"),
    ("hydra.run.dir={file}/run",
     "hydra.run.dir={file}/run: {file} is a file, not a folder; choose another hydra.run.dir"),
    ("hydra.sweep.dir={file}",
     "hydra.sweep.dir={file}: {file} is a file, not a folder; choose another hydra.sweep.dir"),
    ("hydra.run.dir={link}/run",  # a link to a file system that is not mounted
     "hydra.run.dir={link}/run: {link} links to {absent}, which does not exist (a file system not mounted?); mount "
     "it, or choose another hydra.run.dir"),
    ("hydra.run.dir=/proc/xsa-exp/run",  # where no folder can be made, as on a read-only or full file system
     "hydra.run.dir=/proc/xsa-exp/run: no folder can be made in /proc ({proc_error}); free space or make it writable "
     "there, or choose another hydra.run.dir"),
    ("hydra.sweep.dir=/proc/xsa-exp/sweep",
     "hydra.sweep.dir=/proc/xsa-exp/sweep: no folder can be made in /proc ({proc_error}); free space or make it "
     "writable there, or choose another hydra.sweep.dir"),
])
def test_a_folder_hydra_cannot_make_or_should_not_use_is_one_line(arg, message, tmp_path):
    """Hydra makes the run's folder before the job starts (and an empty one is the current folder)."""
    file, link, absent = tmp_path / "a-file", tmp_path / "link", tmp_path / "absent"
    file.write_text("")
    link.symlink_to(absent)
    with pytest.raises(OSError) as proc:
        os.mkdir("/proc/xsa-exp")
    names = dict(file=file, link=link, absent=absent, proc_error=proc.value.strerror)
    sweep = ["-m", "seed=1,2"] if arg.startswith("hydra.sweep") else []
    result = subprocess.run([sys.executable, "train.py", *sweep, arg.format(**names)], cwd=REPO, capture_output=True,
                            text=True, timeout=120)
    assert result.returncode == 2
    assert result.stderr.strip().splitlines() == [f"config error: {message.format(**names)}"]


def test_slurm_launcher_composes_with_one_task_per_gpu():
    from hydra import compose, initialize_config_dir
    with initialize_config_dir(config_dir=str(CONF_DIR), version_base="1.3"):
        cfg = compose("train", overrides=["hydra/launcher=slurm", "trainer.devices=8", "trainer.num_nodes=2"],
                      return_hydra_config=True)
    launcher = cfg.hydra.launcher
    assert launcher._target_.endswith("SlurmLauncher")
    assert (launcher.tasks_per_node, launcher.gpus_per_node, launcher.nodes) == (8, 8, 2)


def test_run_directory_names_say_the_arm():
    from xsa_exp.arm import Arm

    assert Arm.run_name("tiny", 1.0, False, "base") == "tiny_a1.0"
    assert Arm.run_name("d12", 0.0, False, "base") == "d12_a0.0"
    assert Arm.run_name("d24", 0.5, True, "sft") == "d24_learnable_from_a0.5_sft"


@pytest.mark.parametrize("native, width, expected", [(True, 768, "bf16-mixed"), (True, 1024, "bf16-mixed"),
                                                     (True, 256, "32-true"), (False, 768, "32-true")])
def test_precision_auto_on_cpu_follows_the_measured_rule(monkeypatch, native, width, expected):
    from xsa_exp.training import run as training

    monkeypatch.setattr(training.torch.cuda, "is_available", lambda: False)
    monkeypatch.setattr(training, "cpu_has_native_bf16", lambda: native)
    precision, reason = training.resolve_precision(compose_config("trainer=cpu").trainer, width)
    assert precision == expected and reason.startswith("auto: CPU")
    assert training.resolve_precision(compose_config("trainer.precision=bf16-mixed").trainer, 128) == (
        "bf16-mixed", "trainer.precision")


@pytest.mark.parametrize("native, cuda, expected", [(True, False, "bfloat16"), (False, False, "float32"),
                                                     (False, True, "bfloat16")])
def test_newton_schulz_dtype_auto_is_bf16_where_bf16_matmul_is_native(monkeypatch, native, cuda, expected):
    from xsa_exp import precision

    monkeypatch.setattr(precision, "cpu_has_native_bf16", lambda: native)
    assert compose_config().optim.muon.ns_dtype == "auto"
    dtype, reason = precision.newton_schulz_dtype("auto", cuda)
    assert dtype == expected and reason.startswith("auto: ")
    assert precision.newton_schulz_dtype("bfloat16", cuda) == ("bfloat16", "optim.muon.ns_dtype")


def test_precision_auto_on_cuda_is_bf16_compute_and_the_gpu_presets_set_it_with_the_fused_loss_head(monkeypatch):
    from xsa_exp.training import run as training

    monkeypatch.setattr(training.torch.cuda, "is_available", lambda: True)
    assert training.resolve_precision(compose_config().trainer, 128) == ("bf16-compute", "auto: CUDA")
    for preset in ("xsa_d12", "xsa_d24"):
        cfg = compose_config(f"experiment={preset}")
        assert cfg.trainer.precision == "bf16-compute" and cfg.model.fused_loss_head and cfg.train.compile
    assert not compose_config("experiment=study_x0_path").model.fused_loss_head  # the CPU studies keep their bits


def test_conf_composes_typed_with_the_plain_compose_api_in_a_fresh_process():
    """The schema reaches Hydra through hydra_plugins/xsa_exp_schema, not through an import of xsa_exp."""
    code = f"""
import sys
from hydra import compose, initialize_config_dir
from omegaconf import OmegaConf
with initialize_config_dir(config_dir={str(CONF_DIR)!r}, version_base="1.3"):
    cfg = compose("train", overrides=["depth=d12", "data=climbmix"])
print(OmegaConf.get_type(cfg.model).__name__, OmegaConf.get_type(cfg.data).__name__, cfg.train.compile)
try:
    cfg.xsa.alpha = "strong"
except Exception as e:
    print(type(e).__name__)
"""
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120, cwd="/")
    assert result.returncode == 0, result.stderr[-2000:]
    assert result.stdout.split() == ["ModelConfig", "ClimbmixDataConfig", "True", "ValidationError"]


def yaml_leaves(node: dict, path: tuple = ()):
    for name, value in node.items():
        if isinstance(value, dict):
            yield from yaml_leaves(value, (*path, name))
        else:
            yield (*path, name), value


def schema_default(schema, path: tuple):
    """The schema's value at path (a typed dict's entry gets its element type's defaults); MISSING is '???'."""
    node = schema
    for name in path[:-1]:
        if node.get(name) is None:  # an entry of a typed dict, or an Optional node left at None
            node = OmegaConf.merge(node, {name: {}})
        node = node[name]
    return OmegaConf.to_container(node).get(path[-1], "<not in the schema>")


def test_conf_files_set_only_what_differs_from_the_schema():
    """Each default and its help live once, in xsa_exp/config/schema.py: a group option (or train.yaml, evaluate.yaml)
    that sets a key to the schema's own default repeats it. Stages and experiments are exempt: they override
    the choices of other options (stage=sft's warmup 0 undoes a stack's 40); so is a stack's key that a depth preset
    sets (the April 2026 stack's batch null undoes the d12 preset's 524,288, to derive it)."""
    import yaml

    from xsa_exp.config.schema import DATA_SCHEMAS, EvaluateConfig, TrainConfig
    train, repeats = OmegaConf.structured(TrainConfig), []
    by_depth = {path for file in (CONF_DIR / "depth").glob("*.yaml") for path, _ in yaml_leaves(
        {k: v for k, v in yaml.safe_load(file.read_text()).items() if k != "defaults"})}
    for file in sorted(CONF_DIR.rglob("*.yaml")):
        group, text = file.parent.relative_to(CONF_DIR).parts, file.read_text()
        if group and group[0] in ("experiment", "stage", "hydra"):
            continue
        if file.name == "evaluate.yaml":
            schema = OmegaConf.structured(EvaluateConfig)
        elif group == ("data",):
            schema = OmegaConf.structured(DATA_SCHEMAS[file.stem])
        elif not group or "@package _global_" in text:
            schema = train
        else:
            schema = train[group[0]]
        content = {k: v for k, v in (yaml.safe_load(text) or {}).items() if k not in ("defaults", "hydra")}
        repeats += [f"{file.relative_to(CONF_DIR)}: {'.'.join(path)}={value}" for path, value in yaml_leaves(content)
                    if schema_default(schema, path) == value and not (group == ("stack",) and path in by_depth)]
    assert not repeats, "\n".join(repeats)
