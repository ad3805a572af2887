"""The planner commands' console (rich): one, shared by every command module."""
from rich.console import Console

console = Console()
