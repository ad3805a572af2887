"""Preloaded first by the local workers' forkserver (executor/launch/coordinator/processes.py): the
server dies with the coordinator that started it.

multiprocessing's forkserver exits once its client is gone, but only when it gets back to
its loop: while it still imports torch for its preload (seconds, more on loaded cores) a
SIGKILLed coordinator left it running. Importing this module is the server's first act.
"""
from planner.procs import die_with_parent

die_with_parent()
