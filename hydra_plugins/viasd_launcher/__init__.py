"""The project's Hydra launcher plugin: ``hydra/launcher=viasd_local`` (see :mod:`.viasd_launcher`).

Hydra instantiates launchers only from the ``hydra_plugins`` namespace package, so this one
lives here, next to the project's ``viasd`` package.
"""
