"""The coordinator's parts, each owning its state (launcher.py's Coordinator routes
between them): the processes and store, the plans, how far the workers got, admission, the
workers' messages, a replayed trace, and the run's end."""
