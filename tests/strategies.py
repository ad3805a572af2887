"""Hypothesis strategies for random jobs and failed sets that leave every stage alive."""
from hypothesis import strategies as st

from planner.job import JobSpec


@st.composite
def jobs(draw, max_d=4, max_s=4, max_m=4, memory=True, speed=False):
    D = draw(st.integers(1, max_d))
    S = draw(st.integers(1, max_s))
    M = draw(st.integers(1, max_m))
    dur = st.integers(1, 12)
    spec = {
        "replicas": D, "stages": S, "microbatches": M,
        "cost": {op: draw(st.lists(dur if op != "W" else st.integers(0, 12), min_size=S, max_size=S))
                 for op in ("F", "I", "W", "OPT")},
        "p2p": {"intra": draw(st.integers(0, 3)), "cross": draw(st.integers(0, 5))},
    }
    if memory and draw(st.booleans()):
        act = draw(st.lists(st.integers(1, 4), min_size=S, max_size=S))
        spec["memory"] = {"activation": act,
                          "capacity": [a * draw(st.integers(1, 5)) for a in act]}
    if speed and draw(st.booleans()):
        spec["speed"] = [[draw(st.sampled_from([0.5, 1.0, 1.0, 2.0])) for _ in range(S)]
                         for _ in range(D)]
    return JobSpec.model_validate(spec)


@st.composite
def failed_sets(draw, job, max_failures=3):
    """Failed workers, at most D-1 per stage."""
    cells = [(d, s) for d in range(job.replicas) for s in range(job.stages)]
    chosen = draw(st.lists(st.sampled_from(cells), max_size=max_failures, unique=True))
    per_stage = {}
    out = []
    for d, s in chosen:
        if per_stage.get(s, 0) + 1 < job.replicas:
            per_stage[s] = per_stage.get(s, 0) + 1
            out.append((d, s))
    return sorted(out)


@st.composite
def job_and_failures(draw, **kw):
    job = draw(jobs(**kw))
    return job, draw(failed_sets(job))
