"""Peer benchmarks: memsched side by side with what a user would pick instead (issue 6).

Run `python -m bench.peers --help` from the repository root, or `memsched bench peers`.
"""
