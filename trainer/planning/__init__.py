"""Planning: the FLOP and memory models, what fits, and ``longctx plan``'s report."""
