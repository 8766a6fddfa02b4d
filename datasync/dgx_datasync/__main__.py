"""``python -m dgx_datasync <command>``; see :mod:`dgx_datasync.cli`."""

import sys

from dgx_datasync.cli import main

sys.exit(main())
