"""Tests of longctx.pipeline."""
