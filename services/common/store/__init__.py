"""The repository for users, tokens, jobs, job events and builds, on SQLite or MongoDB."""

from .base import AlreadyExists, Store, StoreError, open_store
from .models import Build, Job, JobEvent, KeptLog, KeptSeries, Quota, Registry, Token, User

__all__ = [
    "AlreadyExists",
    "Build",
    "Job",
    "JobEvent",
    "KeptLog",
    "KeptSeries",
    "Quota",
    "Registry",
    "Store",
    "StoreError",
    "Token",
    "User",
    "open_store",
]
