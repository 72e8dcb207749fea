"""`python -m rlvr.config --markdown > docs/config.md`;
`python -m rlvr.config --trl-page docs/migrating-from-trl.md` (its table, in place; `--verl-page
docs/migrating-from-verl.md` the same for verl's keys)."""

import sys

from rlvr.config.reference import main

sys.exit(main(sys.argv[1:]))
