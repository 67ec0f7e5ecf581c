"""``aiayn recipes`` and ``aiayn presets``: what exists, one line each."""

from __future__ import annotations

import argparse


def add_no_arguments(parser: argparse.ArgumentParser) -> None:
    """These commands take no arguments."""


def run_recipes(args: argparse.Namespace) -> int:
    from aiayn.recipes import recipe_names, recipe_path, recipe_summary

    names = recipe_names()
    width = max(len(n) for n in names)
    for name in names:
        print(f"{name:<{width}}  {recipe_summary(name)}")
    print(f"\ntrain one with: aiayn train NAME [--set key=value]; the files are in {recipe_path(names[0]).parent}")
    return 0


def run_presets(args: argparse.Namespace) -> int:
    from aiayn.models.presets import PRESETS, describe_preset

    width = max(len(n) for n in PRESETS)
    for name in PRESETS:
        print(f"{name:<{width}}  {describe_preset(name)}")
    return 0
