"""The command line: ``python -m ringmpi.allreduce`` (benchmark and verify)."""

from __future__ import annotations

if __name__ == "__main__":
    from ringmpi._cli import main

    raise SystemExit(main())
