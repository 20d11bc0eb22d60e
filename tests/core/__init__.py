"""Tests of the ground floor, longctx.core."""
