"""The ground floor: code every part of longctx shares (errors, config base, run layout, atomic
writes, output-folder checks, run records, stage runner and its processes' lifetime, progress,
tokenizer loading, histogram buckets).

Nothing here imports ``longctx.pipeline``, ``longctx.packer``, ``longctx.trainer`` or the roof. Import
the modules themselves (``longctx.core.atomic``...); this package imports nothing, so that the
trainer can import the light modules on a machine without datatrove.
"""
