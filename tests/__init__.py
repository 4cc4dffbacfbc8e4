"""replaybank's tests (a package, so helpers such as ``tests.roundtrip`` can be imported)."""
