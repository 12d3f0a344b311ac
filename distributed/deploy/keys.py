"""``python -m distributed.deploy.keys``: print a fresh run's CURVE keys to standard output.

For a pipe into ``kubectl create secret ... --from-file=keys=/dev/stdin`` (``troupe deploy k8s``
prints the whole line), so a cluster run's keys are never written to the output folder.
"""

from __future__ import annotations

import sys


def main() -> int:
    from system.streams.security import RunKeys

    if sys.stdout.isatty():
        print("refusing to print keys to a terminal: pipe them into kubectl", file=sys.stderr)
        return 2
    sys.stdout.write(RunKeys.generate().to_text())
    return 0


if __name__ == "__main__":
    sys.exit(main())
