"""The local backend: every job runs on this machine under its own supervisor process."""
