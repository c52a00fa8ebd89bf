"""Running experiments: the run lifecycle, exp grids, dry runs, benchmarks.

Importing the package registers the config schemas in Hydra's ConfigStore
(:mod:`viasd.harness.config`), so every composition of ``conf/config.yaml`` is typed.
"""

from viasd.harness.config import register_configs

register_configs()
