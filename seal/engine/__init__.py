"""The CPU (or one-GPU) inference engine behind verl's ``server_manager.generate`` contract, for the
local trainer and ``seal eval``: ``hf_server`` batches requests, ``kv_cache`` stores past key/values,
``kv_engine`` prefills and decodes, ``attention`` reads a shared prompt once, ``precision`` picks the
autocast dtype (docs/architecture.md).

Nothing is imported here, so importing one module does not load the others.
"""
