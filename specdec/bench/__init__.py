"""Benchmarks: side-by-side speed comparisons on real prompts."""
