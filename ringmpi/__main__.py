"""``python -m ringmpi <command>``: the tools' one entry (:mod:`ringmpi.tools`)."""

from ringmpi.tools import main

raise SystemExit(main())
