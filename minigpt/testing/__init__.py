"""What the tests and the benchmarks share: the WikiText-shaped fixture corpus and the bugs planted on purpose.
No stage imports this package."""
