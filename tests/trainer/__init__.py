"""Tests of longctx.trainer."""
