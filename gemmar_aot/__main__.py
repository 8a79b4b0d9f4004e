"""``python -m gemmar_aot``: the same as the ``gemmar-aot`` command."""

from gemmar_aot.cli import main

main()
