"""The gateway: the only public service; authenticates callers and streams requests to the others."""
