"""``python -m local_engine [MODEL_DIR] [--port P] ...``: the OpenAI-compatible server."""

from local_engine.server import main

raise SystemExit(main())
