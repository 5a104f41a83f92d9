"""Folder the local launcher puts first on a training's PYTHONPATH (see sitecustomize.py here); a package only so that it ships with autodl."""
