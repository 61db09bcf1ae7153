"""``python -m swiftclient.cli``: the same as the ``swiftclient`` command."""

from swiftclient.cli import main

raise SystemExit(main())
