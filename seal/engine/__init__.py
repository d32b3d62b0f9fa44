"""The CPU (or one-GPU) inference engine behind verl's ``server_manager.generate`` contract.

The episode runner (:mod:`seal.rollout`) asks for tokens; this package produces them with a
Hugging Face model, for the local trainer and ``seal eval``:

* :mod:`seal.engine.hf_server` — ``HFServerManager``, batching concurrent episodes' requests;
* :mod:`seal.engine.kv_cache` — the store of past key/values (chained entries sharing storage);
* :mod:`seal.engine.kv_engine` — prefill past the stored prefix, batched decode;
* :mod:`seal.engine.attention` — shared-prefix attention (rows sharing a prompt read it once);
* :mod:`seal.engine.precision` — the autocast dtype the device runs natively.

Nothing is imported here, so importing one module does not load the others.
"""
