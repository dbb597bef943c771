"""Helpers shared by the test tiers: real processes and servers on loopback."""
