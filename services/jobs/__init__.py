"""The jobs service: validates job specs, keeps their history and runs them through a backend."""
