"""Runnable examples for joblease (not part of the installed package)."""
