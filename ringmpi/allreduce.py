"""``python -m ringmpi.allreduce``: the benchmark's command line, run as a program only.

Its code is :mod:`ringmpi.tools.allreduce` (also ``python -m ringmpi allreduce``);
``ringmpi.allreduce`` is the function.
"""

if __name__ == "__main__":
    from ringmpi.tools.allreduce import main

    raise SystemExit(main(command="python -m ringmpi.allreduce"))

raise ImportError(
    "ringmpi/allreduce.py is the command line (python -m ringmpi.allreduce), not a module "
    "to import: the function is ringmpi.allreduce (from ringmpi import allreduce), the "
    "command line's code ringmpi.tools.allreduce"
)
