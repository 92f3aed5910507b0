"""Peer benchmarks: memsched side by side with what a user would pick instead.

Run `python -m bench.peers --help` from the repository root, or `memsched bench peers`.
"""
