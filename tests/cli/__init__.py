"""Tests of the roof: the longctx command, the run config, the demo, and the architecture rules."""
