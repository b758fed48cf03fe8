"""The smoke chat pipeline: tiny base run -> SFT -> ChatCORE, timed, for each arm.

    python bench/chat_pipeline.py [--arms xsa baseline] [--max-per-task N] [--sft-data DIR] [--mmlu FILE]

Each arm: `python train.py` (the default tiny run), `python train.py stage=sft init_from=<base>` on the
chat files of --sft-data (default: the test fixtures, the only chat data on an offline machine; give
a folder with smoltalk_train.jsonl, mmlu_auxiliary_train.jsonl, gsm8k_train.jsonl, smoltalk_test.jsonl
for more), then `python evaluate.py eval.metrics=[chatcore]` on the eval bundle ($XSA_EXP_EVAL_BUNDLE).
MMLU comes from --mmlu (local file) or the hub; without either ChatCORE covers 4 tasks and says so.
Prints wall time per stage and the per-task accuracies.
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
ARMS = {"xsa": [], "baseline": ["xsa.alpha=0"]}


def run(args: list[str]) -> float:
    start = time.perf_counter()
    result = subprocess.run([sys.executable, *args], cwd=REPO, capture_output=True, text=True)
    if result.returncode:
        sys.exit(f"{' '.join(args)} failed:\n{result.stderr[-3000:]}")
    return time.perf_counter() - start


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--arms", nargs="+", default=list(ARMS), choices=list(ARMS))
    parser.add_argument("--max-per-task", type=int, default=None, help="examples per ChatCORE task (default: all)")
    parser.add_argument("--sft-data", type=Path, default=REPO / "tests" / "fixtures" / "chat")
    parser.add_argument("--mmlu", type=Path, default=None, help="MMLU test rows (.jsonl/.parquet); default: the hub")
    args = parser.parse_args()
    d = args.sft_data.resolve()
    sft_data = [f"data.train_sources.smoltalk.data_files={d / 'smoltalk_train.jsonl'}",
                f"data.train_sources.mmlu_auxiliary.data_files={d / 'mmlu_auxiliary_train.jsonl'}",
                f"data.train_sources.gsm8k.data_files={d / 'gsm8k_train.jsonl'}",
                f"data.val_sources.smoltalk.data_files={d / 'smoltalk_test.jsonl'}"]
    chat = ["eval.metrics=[chatcore]"]
    if args.max_per_task:
        chat.append(f"eval.chatcore.max_per_task={args.max_per_task}")
    if args.mmlu:
        chat.append(f"eval.chatcore.mmlu.data_files={args.mmlu.resolve()}")
    with tempfile.TemporaryDirectory() as tmp:
        for arm in args.arms:
            base, sft = Path(tmp) / f"{arm}-base", Path(tmp) / f"{arm}-sft"
            t_base = run(["train.py", f"hydra.run.dir={base}", *ARMS[arm]])
            t_sft = run(["train.py", "stage=sft", f"init_from={base}", f"hydra.run.dir={sft}", *ARMS[arm], *sft_data])
            t_eval = run(["evaluate.py", f"run={sft}", *chat])
            [summary] = (sft / "eval").glob("*/summary.json")
            metrics = json.loads(summary.read_text())["metrics"]
            steps = json.loads((sft / "run.json").read_text())["max_steps"]
            print(f"{arm}: base {t_base:.0f}s, SFT {t_sft:.0f}s ({steps} steps), chat eval {t_eval:.0f}s")
            for name, value in metrics.items():
                print(f"  {name:<20}{value:>9.4f}")
            missing = json.loads((summary.parent / "chatcore.json").read_text())["missing"]
            for task, reason in missing.items():
                print(f"  {task}: not evaluated ({reason})")


if __name__ == "__main__":
    main()
