"""Tests of nsqpy.transport (a package, so its conftest and helpers do not shadow others)."""
