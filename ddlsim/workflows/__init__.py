"""The use cases: predict, search (and verify), execute, profile, validate.

Each is a plain function that takes a typed, frozen request (:mod:`.requests`) and a progress
callback, and returns what it found. The command line, the REST API's job worker and the
benchmarks are thin adapters over these functions; this package imports nothing of theirs.
"""
