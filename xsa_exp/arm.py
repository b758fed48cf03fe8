"""The arm of a run: what distinguishes it in a comparison (its optimizer and lr scale, XSA's strength, form,
layers and value source), for base and SFT runs alike. This one type names the run directory, writes the arm's
keys into run.json and wandb, and labels the report's rows.

No torch here: the report reads arms from run.json.
"""

from __future__ import annotations

from dataclasses import dataclass

from xsa_exp.model.xsa_settings import XSASettings


@dataclass(frozen=True)
class Arm:
    """An arm as a comparison sees it: every run without XSA (a fixed α of 0, or no layers) is one arm,
    "no XSA", whatever its other xsa.* keys say."""
    optim: str
    alpha: float | None  # None: learnable α (alpha_init is then its initial value; different inits, different arms)
    layers: str  # the selection as configured ("all", "last:2", "0,2"); "" when XSA is off
    value_source: str  # "" when XSA is off
    lr_scale: float = 1.0
    alpha_init: float | None = None
    parametrization: str = "sigmoid"  # a learnable α's: sigmoid(θ) | tanh(θ)

    @staticmethod
    def run_keys(*, stage: str, depth: str, alpha: float, learnable: bool, layers, value_source: str, optim: str,
                 lr_scale: float, seed: int) -> dict:
        """run.json's and wandb's top-level keys of a run: its arm as configured, with its stage, depth and seed
        (a seed pairs runs of two arms)."""
        return {"stage": stage, "depth": depth, "alpha": alpha, "learnable": learnable, "layers": layers,
                "value_source": value_source, "optim": optim, "lr_scale": lr_scale, "seed": seed}

    @classmethod
    def run_keys_of(cls, cfg) -> dict:
        """run_keys of a composed config."""
        layers = cfg.xsa.layers if isinstance(cfg.xsa.layers, (str, int)) else list(cfg.xsa.layers)
        return cls.run_keys(stage=cfg.stage_name, depth=cfg.depth_name, alpha=cfg.xsa.alpha,
                            learnable=cfg.xsa.learnable, layers=layers, value_source=cfg.xsa.value_source,
                            optim=cfg.optim.matrix_algorithm, lr_scale=cfg.optim.lr_scale, seed=cfg.seed)

    @classmethod
    def of_run(cls, run: dict, parametrization: str) -> Arm:
        """From run.json (run_keys, and xsa_layers: the layers the selection resolved to) and the run's
        xsa.parametrization (config.yaml)."""
        lr_scale = float(run["lr_scale"])
        if not XSASettings(alpha=float(run["alpha"]), learnable=bool(run["learnable"]),
                           layers=list(run["xsa_layers"])).active:
            return cls(run["optim"], 0.0, "", "", lr_scale)
        layers = run["layers"]
        if not isinstance(layers, str):  # a list of layer indices, or one index
            layers = ",".join(map(str, layers if isinstance(layers, list) else [layers]))
        if run["learnable"]:
            return cls(run["optim"], None, layers, run["value_source"], lr_scale, float(run["alpha"]), parametrization)
        return cls(run["optim"], float(run["alpha"]), layers, run["value_source"], lr_scale)

    @staticmethod
    def run_name(depth: str, alpha, learnable, stage: str) -> str:
        """A run directory's name after its time (train.yaml's hydra.run.dir): the depth preset, the arm (a1.0 for a
        fixed α, learnable_from_a0.5 for a learnable one) and, for a fine-tuning stage, the stage: tiny_a1.0,
        d24_a0.0_sft."""
        arm = f"learnable_from_a{alpha}" if learnable else f"a{alpha}"
        return f"{depth}_{arm}" + ("" if stage == "base" else f"_{stage}")

    @property
    def off(self) -> bool:
        return self.layers == ""

    @property
    def xsa_label(self) -> str:
        """The XSA part of the label: "no XSA", "α=1 · layers=all · value=mixed", "learnable α · ..."."""
        if self.off:
            return "no XSA"
        form = "" if self.parametrization == "sigmoid" else f" = {self.parametrization}(θ)"
        alpha = f"learnable α{form} (init {self.alpha_init:g})" if self.alpha is None else f"α={self.alpha:g}"
        return f"{alpha} · layers={self.layers} · value={self.value_source}"

    @property
    def lr_label(self) -> str:
        return "" if self.lr_scale == 1 else f" · lr×{self.lr_scale:g}"

    @property
    def label(self) -> str:
        """The report's name of the arm: "muon · α=1 · layers=all · value=mixed · lr×8"."""
        return f"{self.optim} · {self.xsa_label}{self.lr_label}"

    @property
    def xsa_key(self) -> tuple:
        """What an arm is apart from its optimizer and learning rate scale."""
        return self.alpha, self.alpha_init, self.parametrization, self.layers, self.value_source

