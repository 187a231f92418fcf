"""``python -m ringmpi <command>``: the tools' one entry (:mod:`ringmpi.tools`)."""

from ringmpi.tools import main

if __name__ == "__main__":
    raise SystemExit(main())
