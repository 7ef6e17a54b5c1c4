"""The pfs service: confined, resumable file storage under /pfs/<datacenter>."""
