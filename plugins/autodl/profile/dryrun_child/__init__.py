"""The dry-run child: runs the user's training script itself (``python script.py ARGS``) with hooks, measures each
phase and writes the report (``R``) the parent reads (:mod:`autodl.profile.dryrun`).

It is run by path, ``python .../dryrun_child CONFIG.json`` (:mod:`.__main__`), in the sandbox, a container or a pod,
and imports nothing from autodl: only this folder and ``_flops.py`` next to it are mounted there. Importing its
modules outside that run reads a config from ``sys.argv[1]`` (:mod:`.state`). Details:
docs/reference/estimator.md#autodlprofiledryrun_child.
"""
