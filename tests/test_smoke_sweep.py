"""End to end: the smoke experiment as a Hydra sweep with two seeds, then the report over it."""

import subprocess
import sys

import pytest

from tests.conftest import REPO, SMALL

pytestmark = pytest.mark.slow


def test_smoke_sweep_with_two_seeds_then_report(tmp_path):
    from tests.hydra_app import preflight
    from xsa_exp.report.cli import main

    sweep = tmp_path / "sweep"
    model = [o for o in SMALL if o.startswith("model.") or o.startswith("train.")]
    argv = ["-m", "experiment=smoke", "seed=1,2", f"hydra.sweep.dir={sweep}", *model, "train.max_steps=3",
            "eval.every=3", "eval.diag_every=3", "eval.val_tokens=512"]
    train = subprocess.run([sys.executable, "train.py", *argv], cwd=REPO, capture_output=True, text=True, timeout=600)
    assert train.returncode == 0, train.stderr[-3000:]
    jobs = sorted(p.name for p in sweep.iterdir() if p.is_dir())
    assert jobs == ["0", "1", "2", "3"]  # xsa.alpha=0,1 x seed=1,2
    assert all((sweep / j / "status.json").is_file() for j in jobs)

    # Continued with resume=auto, each job is the run in its directory; with another value, none is, and the sweep
    # is refused before Hydra rewrites its multirun.yaml.
    preflight("train", [*argv, "resume=auto"])
    written = (sweep / "multirun.yaml").read_text()
    other = subprocess.run([sys.executable, "train.py", *argv, "train.max_steps=4", "resume=auto"], cwd=REPO,
                           capture_output=True, text=True, timeout=120)
    assert other.returncode == 2 and other.stderr == (
        f"config error: hydra.sweep.dir={sweep} holds another sweep's runs: job 0's directory {sweep / '0'} was "
        "started with a different config (sections train differ); nothing was overwritten — continue it with the "
        f"overrides in {sweep}/multirun.yaml (hydra.overrides.task), or choose a new hydra.sweep.dir\n"), other.stderr
    assert (sweep / "multirun.yaml").read_text() == written

    main([str(sweep)])  # `python -m xsa_exp.report <sweep>`, in this process (tests/test_report.py runs the command)
    text = (sweep / "report" / "report.md").read_text()
    assert "no XSA" in text and "α=1" in text
    assert "(n=2)" in text  # two seeds pooled per arm
    assert (sweep / "report" / "numbers.csv").is_file()
    assert any(p.suffix == ".png" and p.stat().st_size > 0 for p in (sweep / "report" / "plots").iterdir())


def test_joblib_sweep_runs_jobs_in_parallel_bit_identical_to_one_at_a_time(tmp_path):
    """hydra/launcher=joblib (one thread per job, two at once) gives every job the rows and weights of the same run
    trained alone (here, in this process, as the basic launcher runs its jobs)."""
    import torch

    from tests.conftest import compose_config
    from tests.test_resume import final_weights, rows
    from xsa_exp.training.run import train

    model = [o for o in SMALL if o.startswith(("model.", "train.", "eval."))]
    settings = ["logger=csv", *model, "train.max_steps=4", "eval.every=2", "train.cpu_threads=1"]
    sweep = tmp_path / "joblib"
    result = subprocess.run([sys.executable, "train.py", "-m", "hydra/launcher=joblib", "hydra.launcher.n_jobs=2",
                             "xsa.alpha=0,1", *settings, f"hydra.sweep.dir={sweep}"], cwd=REPO, capture_output=True,
                            text=True, timeout=600)
    assert result.returncode == 0, result.stderr[-3000:]
    for job, alpha in (("0", 0), ("1", 1)):
        alone = train(compose_config(f"xsa.alpha={alpha}", *settings), tmp_path / "alone" / job)
        assert rows(sweep / job) == rows(alone)
        ours, theirs = final_weights(sweep / job), final_weights(alone)
        assert all(torch.equal(ours[k], theirs[k]) for k in theirs)


def test_multi_device_jobs_are_refused_under_joblib(tmp_path):
    result = subprocess.run([sys.executable, "train.py", "-m", "hydra/launcher=joblib", "trainer=ddp",
                             "trainer.accelerator=cpu", "trainer.devices=2", f"hydra.sweep.dir={tmp_path / 'sweep'}"],
                            cwd=REPO, capture_output=True, text=True, timeout=120)
    assert result.returncode == 2 and not (tmp_path / "sweep").exists()
    assert result.stderr.startswith("config error: multi-device training inside a local Hydra sweep is not supported")


def test_a_sweep_whose_job_directories_name_their_keys_is_checked_too(tmp_path):
    """The README's ChatCORE base sweep names its jobs a${xsa.alpha}_s${seed}: started again, it is refused whole."""
    from tests.hydra_app import preflight
    from xsa_exp.errors import ConfigError

    sweep = tmp_path / "sweep"
    (sweep / "a1.0_s2").mkdir(parents=True)
    (sweep / "a1.0_s2" / "config.yaml").write_text("seed: 2\n")
    argv = ["-m", "seed=1,2", f"hydra.sweep.dir={sweep}", "hydra.sweep.subdir=a${xsa.alpha}_s${seed}"]
    with pytest.raises(ConfigError, match=r"already holds runs \(job 1's directory .*a1.0_s2 is one\)"):
        preflight("train", argv)
    with pytest.raises(ConfigError, match=r"another sweep's runs: job 1's directory .*a1.0_s2 was started with a "
                                          r"different config \(sections [a-z_, ]+ differ\)"):
        preflight("train", [*argv, "resume=auto"])  # continued only as the job it holds


def test_a_wandb_sweep_continued_with_resume_auto_keeps_its_group(tmp_path):
    """A sweep's jobs log to one wandb group named like the sweep's folder (train.py), and their config.yaml holds
    it: the same sweep continued with resume=auto is that job, and another group is another experiment."""
    from omegaconf import OmegaConf, open_dict

    from tests.hydra_app import preflight
    from xsa_exp.config.preflight import set_hydra_record
    from xsa_exp.errors import ConfigError

    sweep = tmp_path / "s42"
    argv = ["-m", "logger=wandb", "seed=1,2", f"hydra.sweep.dir={sweep}", "resume=auto"]
    job = preflight("train", argv)[1]
    set_hydra_record(job)
    with open_dict(job):
        del job["hydra"]
    saved = OmegaConf.to_container(job, resolve=True)
    saved["resume"] = None  # the first launch's
    for group, refused in (("s42", False), ("another", True)):
        saved["logger"]["wandb"]["group"] = group
        (sweep / "1").mkdir(parents=True, exist_ok=True)
        (sweep / "1" / "config.yaml").write_text(OmegaConf.to_yaml(saved))
        if refused:
            with pytest.raises(ConfigError, match=r"job 1's directory .* \(sections logger differ\)"):
                preflight("train", argv)
        else:
            preflight("train", argv)


def test_a_job_that_fails_in_one_line_does_not_end_the_sweep(tmp_path):
    """A job's one-line error (here a malformed data file) is printed as it happens and kept in its status.json; the
    sweep's other jobs run (Hydra's own rule for a failing job), and the sweep ends on that line with exit status 2.
    Under the joblib launcher, whose jobs run in loky workers: a streamed corpus's data loader worker starts there."""
    import json
    import random

    rng = random.Random(0)
    words = ["".join(rng.choice("abcdefghij") for _ in range(rng.randint(2, 7))) for _ in range(300)]
    for folder in ("good", "bad"):  # each a training file and a validation file
        (tmp_path / folder).mkdir()
        for name, docs in (("a", 600), ("b", 50)):
            (tmp_path / folder / f"{name}.jsonl").write_text("".join(
                json.dumps({"text": " ".join(rng.choice(words) for _ in range(100))}) + "\n" for _ in range(docs)))
    (tmp_path / "bad" / "a.jsonl").write_text('{"text": "one fine row"}\n{not json\n')
    sweep = tmp_path / "sweep"
    model = [o for o in SMALL if o.startswith(("logger", "model.", "train."))]
    result = subprocess.run([sys.executable, "train.py", "-m", "hydra/launcher=joblib", "data=local",
                             f"data.path={tmp_path / 'bad' / '*.jsonl'},{tmp_path / 'good' / '*.jsonl'}", *model,
                             "train.max_steps=2", "eval.every=0", f"hydra.sweep.dir={sweep}"],
                            cwd=REPO, capture_output=True, text=True, timeout=300)
    line = (f"error: cannot read {tmp_path / 'bad' / 'a.jsonl'}: line 2 is not valid JSON (Expecting property name "
            "enclosed in double quotes at column 2); check that the file is readable and in its format, or change "
            "data.path / data.val_path")
    assert result.returncode == 2, result.stderr[-3000:]
    assert result.stderr.splitlines()[-1] == (
        f"{line} (the sweep's first failed job; its other jobs ran, each failed one printing its line (under submitit, "
        "into its job's log); once it is fixed, relaunch with resume=auto to run the failed and unfinished jobs, or "
        "into a new hydra.sweep.dir if the fix changes the config)")
    assert json.loads((sweep / "0" / "status.json").read_text())["status"] == "failed"
    assert json.loads((sweep / "1" / "status.json").read_text())["status"] == "completed"


def test_a_failed_job_is_not_hidden_by_a_signal_that_stops_the_sweep_after_it(monkeypatch, capsys):
    """Under the basic launcher a preemption signal ends a sweep with exit status 0 (training/preemption.py): a job
    that failed before it still ends the command with its line and exit status 2."""
    from xsa_exp import errors
    from xsa_exp.config.preflight import run_app

    monkeypatch.setattr(errors, "FAILED_JOBS", [])
    monkeypatch.setattr("xsa_exp.config.preflight.FAILED_JOBS", errors.FAILED_JOBS)

    def sweep():
        with pytest.raises(errors.JobFailed), errors.one_line_per_job(in_sweep=True):
            raise errors.UserError("cannot read a.jsonl: line 2 is not valid JSON")  # job 0
        raise SystemExit(0)  # job 1's preemption hand-over

    def stopped_sweep():
        raise SystemExit(0)

    with pytest.raises(SystemExit) as ended:
        run_app(sweep, "train")
    assert ended.value.code == 2
    assert capsys.readouterr().err.splitlines() == [
        "error: cannot read a.jsonl: line 2 is not valid JSON",
        "error: cannot read a.jsonl: line 2 is not valid JSON (the sweep's first failed job, before a signal stopped "
        "the sweep; once it is fixed, relaunch with resume=auto to run the failed and unfinished jobs, or into a new "
        "hydra.sweep.dir if the fix changes the config)"]
    errors.FAILED_JOBS.clear()
    with pytest.raises(SystemExit) as ended:  # a sweep stopped with no job failed: status 0, as before
        run_app(stopped_sweep, "train")
    assert ended.value.code == 0


def test_a_sweep_started_again_into_its_directory_is_refused_before_any_job(tmp_path):
    """Each job would refuse its own finished directory; the preflight refuses the whole sweep first, with one
    line, and touches nothing (a sweep relaunched by hand or by a queue script into the directory it filled)."""
    sweep = tmp_path / "sweep"
    (sweep / "1").mkdir(parents=True)
    saved = sweep / "1" / "config.yaml"
    saved.write_text("seed: 2\n")
    result = subprocess.run([sys.executable, "train.py", "-m", "hydra/launcher=joblib", "seed=1,2",
                             f"hydra.sweep.dir={sweep}"], cwd=REPO, capture_output=True, text=True, timeout=120)
    assert result.returncode == 2, result.stderr[-3000:]
    assert result.stderr == (f"config error: hydra.sweep.dir={sweep} already holds runs (job 1's directory "
                             f"{sweep / '1'} is one); nothing was overwritten — choose a new hydra.sweep.dir, or add "
                             "resume=auto to continue them\n")
    assert sorted(p.name for p in sweep.iterdir()) == ["1"] and saved.read_text() == "seed: 2\n"
