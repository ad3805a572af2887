"""Interop with torch.distributed.pipelining: its CSV schedule format, both ways.

`pipelining_csv.export_csv` writes one replica's pipeline of a Plan as the CSV that
`_PipelineScheduleRuntime._load_csv` reads (one row per rank, `{stage}{op}{microbatch}`);
`csv_import.import_csv` turns such a CSV (torch's compute-only or compute+comms form) and a
job spec into a timed, validated Plan. Both are text passes: no torch here.
"""
