"""``python -m dgx_trainer.datasync <command>``; see :mod:`dgx_trainer.datasync.cli`."""

import sys

from dgx_trainer.datasync.cli import main

sys.exit(main())
