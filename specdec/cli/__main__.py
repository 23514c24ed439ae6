"""``python -m specdec.cli COMMAND ...`` is ``specdec COMMAND ...``."""

from specdec.cli import main

main()
