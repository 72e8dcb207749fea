"""`python -m rlvr ...` is the `rlvr` command (so `torchrun ... -m rlvr train` launches it too)."""

import sys

from rlvr.cli import main

sys.exit(main())
