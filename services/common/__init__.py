"""Code every PaddleCloud service shares: config, logging, errors, internal auth, app conventions."""
