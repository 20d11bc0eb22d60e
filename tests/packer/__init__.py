"""Tests of longctx.packer."""
