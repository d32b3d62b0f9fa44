"""The BFCL multi-turn environment: ``env_service.bfcl`` (episodes, no HTTP) and the service around it.

Start the service with ``python -m env_service --host 127.0.0.1 --port 8082``; talk to it (or run it
in-process) with :class:`env_service.client.EnvClient`. This package never imports torch.
"""
