"""``python -m fl_lightning``: ``fit``, ``validate``, ``test``, ``predict`` and ``list``
(:mod:`fl_lightning.cli`), ``sweep`` (:mod:`fl_lightning.sweep`, which reads run arguments with the
command line's parser) and ``report`` (:mod:`fl_lightning.report`: figures from finished runs)."""

from __future__ import annotations

import sys
from typing import Any


def main(args: Any = None) -> None:
    """Entry point of ``python -m fl_lightning`` and of the ``fl-lightning`` script."""
    argv = sys.argv[1:] if args is None else list(args)
    if argv[:1] == ["sweep"]:
        from fl_lightning.sweep import main as sweep

        sweep(argv[1:])  # exits with the sweep's status
        return
    if argv[:1] == ["report"]:
        from fl_lightning.report import main as report

        report(argv[1:])
        return
    from fl_lightning.cli import main as cli

    cli(args)


if __name__ == "__main__":
    main()
