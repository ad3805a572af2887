"""`recycle agent` (registered by recycle/cli.py)."""
from __future__ import annotations

import signal
from typing import Optional

import typer

from recycle.commands.errors import die


def register(app: typer.Typer) -> None:
    app.command("agent")(agent_cmd)


def agent_cmd(
    service: str = typer.Option(..., "--service", help="the plan service (`recycle serve`) URL"),
    job_id: str = typer.Option(..., "--job-id", help="the job's id at --service"),
    node_rank: Optional[int] = typer.Option(None, "--node-rank", help="this machine's node (torchrun's --node-rank); omitted: a new instance, which asks the service for a vacant node (a node add)"),
    token: Optional[str] = typer.Option(None, "--token", envvar="RECYCLE_TOKEN", help="the job's worker token (better: RECYCLE_TOKEN)"),
    workers_per_node: int = typer.Option(8, "--workers-per-node", help="workers per node (torchrun's --nproc-per-node); node N runs ranks N*K .. N*K+K-1"),
    store: Optional[str] = typer.Option(None, "--store", envvar="RECYCLE_STORE", help="the coordinator's store HOST:PORT (`recycle train --external --store-port`)"),
    attach: bool = typer.Option(False, "--attach", help="start no workers: serve those torchrun starts with RECYCLE_AGENT=http://127.0.0.1:LOCAL_PORT"),
    local_port: int = typer.Option(0, "--local-port", help="loopback port of the local channel (0: any; set it with --attach)"),
    interval: float = typer.Option(1.0, "--interval", help="seconds between the node's heartbeats"),
    max_restarts: int = typer.Option(0, "--max-restarts", help="restart a dead worker up to this many times (it rejoins as a new incarnation)"),
    run_dir: Optional[str] = typer.Option(None, "--run-dir", help="worker logs (default: a temp dir)"),
):
    """Run one node's workers and speak for them to the service: one heartbeat and one
    long-poll per node, and a worker's death reported the moment its process exits."""
    from executor.node.agent import AgentError, NodeAgent

    if node_rank is not None and node_rank < 0:
        die(f"--node-rank must be 0 or more, not {node_rank}")
    if node_rank is None and attach:
        die("--attach needs --node-rank: torchrun's --node-rank says which node it started")
    if not 1 <= workers_per_node <= 4096:
        die(f"--workers-per-node must be between 1 and 4096, not {workers_per_node}")
    if not 0.05 <= interval <= 60:
        die(f"--interval must be between 0.05 and 60 seconds, not {interval:g}")
    if max_restarts < 0 or not 0 <= local_port <= 65535:
        die("--max-restarts must be 0 or more and --local-port a port number")
    if not token:
        die("no worker token: set RECYCLE_TOKEN (or pass --token)")
    try:
        agent = NodeAgent(service, job_id, token, node_rank, per_node=workers_per_node,
                          store=store, attach=attach, local_port=local_port,
                          interval_s=interval, run_dir=run_dir, max_restarts=max_restarts)
        # SIGTERM (a spot instance's preemption notice, an orchestrator stopping the
        # machine): a node remove for its workers, then stop them and give the node back
        signal.signal(signal.SIGTERM, lambda *_: agent.preempt())
        code = agent.run()
    except AgentError as e:
        die(str(e))
    except OSError as e:  # e.g. the local port is taken
        die(f"cannot start the agent: {e}")
    raise typer.Exit(code)
