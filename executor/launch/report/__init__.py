"""What a run reports as it goes and at its end: losses, progress lines, the run record
the summary is made from, and the peer-memory snapshot figures."""
