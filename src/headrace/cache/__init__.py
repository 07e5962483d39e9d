"""headrace.cache: Seneca's tiered sample cache (encoded / decoded / augmented forms).

``config`` (the user's ``Cache``), ``tiers`` (forms and keys, pure), ``codec`` (raw bytes, never
pickles), ``memory_backend`` (one job's cache on tmpfs, in LMDB shards), ``lmdb_store`` (one
LMDB environment: a shard), ``client`` (lookups and inserts where a sample runs), ``session``
(one loader's cache: backend, budget split, per-epoch numbers), ``redis_backend`` and
``redis_scripts`` (the shared server; expiry of stale entries), ``ods``, ``ods_board``,
``ods_epoch`` (Seneca's opportunistic sampling across jobs).
"""
