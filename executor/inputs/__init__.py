"""`recycle train`'s options checked before any process starts (one line, exit code 2)."""
