"""Peer benchmarks: memsched side by side with what a user would pick instead.

Run `python -m bench.peers --help` from the repository root (bench/ is never part of the installed package).
"""
