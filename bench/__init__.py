"""Benchmarks: `make bench` (python -m bench) prints one table and writes bench/results/latest.md.

Every figure is a median over repeated runs with its spread, next to a baseline measured in the
same run, stated as a ratio: these machines are shared and noisy, absolute numbers are not.
"""
