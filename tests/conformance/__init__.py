"""The backend conformance suite: one contract checked against every backend."""
