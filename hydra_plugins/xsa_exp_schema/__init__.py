"""Hydra imports every module of the `hydra_plugins` namespace package when it starts (its mechanism for
libraries); this one registers xsa-exp's structured configs (xsa_exp/config/schema.py) in Hydra's ConfigStore and
its resolvers, so conf/ composes typed under `python train.py`, the compose API or any other Hydra entry point,
with no import of xsa_exp needed first."""

from hydra.core.config_search_path import ConfigSearchPath
from hydra.plugins.search_path_plugin import SearchPathPlugin

from xsa_exp.config.schema import register


class XsaExpSchema(SearchPathPlugin):
    """Hydra imports a plugin module only for its plugin class; the schema itself needs no search path."""

    def manipulate_search_path(self, search_path: ConfigSearchPath) -> None:
        register()
