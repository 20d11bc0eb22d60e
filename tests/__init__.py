"""The longctx test suite: one folder per package (core, pipeline, packer, trainer) and cli/ for the roof."""
