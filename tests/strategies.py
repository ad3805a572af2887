"""Hypothesis strategies for random jobs and failed sets that leave every stage alive."""
from hypothesis import strategies as st

from planner.job import JobSpec
from planner.plan import Mode


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


@st.composite
def small_jobs(draw, max_d=3, max_s=3, max_m=3, max_actions=None, min_d=1, speeds=None):
    """`speeds`: factors to draw each worker's speed from (None: no speeds)."""
    D = draw(st.integers(min_d, max_d))
    S = draw(st.integers(1, max_s))
    M = draw(st.integers(1, max_m))
    if max_actions is not None:
        while 3 * D * S * M > max_actions and M > 1:
            M -= 1
        while 3 * D * S * M > max_actions and S > 1:
            S -= 1
    cost = st.lists(st.integers(1, 9), min_size=S, max_size=S)
    spec = {"replicas": D, "stages": S, "microbatches": M,
            "cost": {op: draw(cost) for op in ("F", "I", "W", "OPT")},
            "p2p": {"intra": draw(st.integers(0, 2)), "cross": draw(st.integers(0, 3))}}
    if speeds is not None:
        spec["speed"] = [[draw(st.sampled_from(speeds)) for _ in range(S)] for _ in range(D)]
    if draw(st.booleans()):
        act = draw(st.lists(st.integers(1, 3), min_size=S, max_size=S))
        spec["memory"] = {"activation": act,
                          "capacity": [a * draw(st.integers(1, 3)) for a in act]}
    job = JobSpec.model_validate(spec)
    # Failed workers, leaving at least one live replica per stage.
    failed = []
    for s in range(S):
        k = draw(st.integers(0, D - 1))
        failed += [(d, s) for d in draw(st.permutations(range(D)))[:k]]
    mode = draw(st.sampled_from([Mode(), Mode(staggered=False), Mode(split_backward=False)]))
    return job, sorted(failed), mode
