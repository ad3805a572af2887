"""The pre-step copy (executor/optim/prestep_copies.py) and the stepper's rollback, redo and settle:
bit-for-bit, including AdamW's lazily created state, with buffers allocated once."""
import dataclasses

import pytest
import torch
import torch.distributed as dist
from torch import nn

from executor.compute.config import TrainingSettings
from executor.optim.clip import NormBoard, coefficient, global_norm, scale_, stage_sq_norm
from executor.runtime.steps.stepper import StageStepper

CFG = TrainingSettings()  # the stepper reads the schedule and the clip


@pytest.fixture(autouse=True)
def one_thread():  # as the workers; idle OpenMP threads spin on a shared machine
    n = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(n)


def stage(seed=0) -> tuple[nn.Module, torch.optim.Optimizer]:
    torch.manual_seed(seed)
    m = nn.Sequential(nn.Linear(6, 8), nn.BatchNorm1d(8), nn.Linear(8, 3))  # with buffers
    return m, torch.optim.AdamW(m.parameters(), lr=CFG.lr, weight_decay=0.1, foreach=False)


def grads(m: nn.Module, it: int) -> list[torch.Tensor]:
    g = torch.Generator().manual_seed(100 + it)
    return [torch.randn(p.shape, generator=g) for p in m.parameters()]


def set_grads(m: nn.Module, gs) -> None:
    for p, g in zip(m.parameters(), gs):
        p.grad = g.clone()


def state(m: nn.Module, opt) -> dict:
    """Everything a rollback must give back, cloned."""
    out = {f"m.{k}": v.clone() for k, v in m.state_dict().items()}
    for i, p in enumerate(m.parameters()):
        for k, v in opt.state.get(p, {}).items():
            out[f"o.{i}.{k}"] = v.clone() if isinstance(v, torch.Tensor) else v
    return out


def same(a: dict, b: dict) -> bool:
    return a.keys() == b.keys() and all(
        torch.equal(a[k], b[k]) if isinstance(a[k], torch.Tensor) else a[k] == b[k] for k in a)


def test_rollback_is_bit_identical_including_the_first_step():
    m, opt = stage()
    st = StageStepper(m, opt, CFG, 0, 1)
    before = [state(m, opt)]
    for it in range(3):
        m(torch.randn(4, 6))  # moves BatchNorm's running statistics (buffers)
        set_grads(m, grads(m, it))
        st.step(it, 0)
        before.append(state(m, opt))
    assert not any(k.startswith("o.") for k in before[0])  # AdamW had no state yet
    st.rollback(2)
    assert same(state(m, opt), before[2])
    st.rollback(0)  # before the first step: the state AdamW created must be gone
    assert same(state(m, opt), before[0]) and not any(opt.state.values())
    st.keep_before(0)
    # re-running from there gives the very same bits as the first time
    set_grads(m, grads(m, 0))
    st.step(0, 1)
    fresh, fopt = stage()
    set_grads(fresh, grads(fresh, 0))
    fopt.step()
    assert same(state(m, opt), state(fresh, fopt))


@pytest.mark.parametrize("idle_at", ["before the forward", "after the forward"])
def test_copy_taken_while_idle_rolls_back_bit_identically(idle_at):
    """On CPU the copy for rollback is taken when a receive is about to block: before the
    forward (a later stage waits for its first activation) or after it (stage 0 waits for
    a gradient, its forward has moved BatchNorm's buffers meanwhile). The step then takes
    no copy of its own; a state loaded after the idle copy is what a rollback gives back."""
    m, opt = stage()
    st = StageStepper(m, opt, CFG, 0, 1)
    fills = []
    fill = st.copies._fill
    st.copies._fill = lambda *a: fills.append(1) or fill(*a)
    before = []
    for it in range(4):
        before.append(state(m, opt))
        if idle_at == "before the forward":
            st.idle()
        m(torch.randn(4, 6))
        if idle_at == "after the forward":
            st.idle()
        st.idle()  # a second wait in the same iteration copies nothing more
        set_grads(m, grads(m, it))
        n = len(fills)
        st.step(it, 0)
        assert len(fills) == n  # the step used the idle copy
    for it in (3, 1, 0):
        st.rollback(it)
        assert same(state(m, opt), before[it])
    st.keep_before(0)
    # a load after the idle copy: that copy is stale, the step copies the loaded state
    other, oopt = stage(seed=1)
    set_grads(other, grads(other, 9))
    oopt.step()
    st.idle()
    m.load_state_dict(other.state_dict())
    opt.load_state_dict(oopt.state_dict())
    loaded = state(m, opt)
    set_grads(m, grads(m, 0))
    st.step(0, 1)
    st.rollback(0)
    assert same(state(m, opt), loaded)


def test_snapshot_slots_are_allocated_once_and_only_uncommitted_ones_kept():
    m, opt = stage()
    st = StageStepper(m, opt, CFG, 0, 1)
    ids = []
    for it in range(6):
        st.forget_committed(it - 2)  # as the agent: it - 1 not committed by everyone yet
        set_grads(m, grads(m, it))
        st.step(it, 0)
        ids.append({id(b) for s in st.copies.held.values() for b in s.bufs})
        assert sorted(st.copies.held) == ([it - 1, it] if it else [0])
    # from the third step on the two slots are recycled: no new buffers
    assert ids[3] | ids[4] | ids[5] == ids[2] | ids[3]
    n = sum(p.numel() for p in m.parameters())
    assert st.snapshot_bytes() >= 2 * 3 * 4 * n  # params + exp_avg + exp_avg_sq, 2 held


def test_optimistic_step_redone_under_the_clip_equals_the_clipped_step():
    """Stage 1 steps before stage 0's norm is in (optimistic), settle() redoes it from the
    snapshot: the result is bit-identical to stepping with clipped gradients at once."""
    cfg = dataclasses.replace(CFG, clip=0.5)
    store = dist.HashStore()
    (m0, o0), (m1, o1) = stage(0), stage(1)
    s0, s1 = StageStepper(m0, o0, cfg, 0, 2, store), StageStepper(m1, o1, cfg, 1, 2, store)
    for it in range(2):
        g0, g1 = grads(m0, it), grads(m1, 10 + it)
        set_grads(m1, g1)
        s1.step(it, 0)  # stage 0's norm is not in: optimistic
        set_grads(m0, g0)
        s0.step(it, 0)  # every norm is in: exact at once
        s1.settle()
    assert (s1.stats.optimistic, s1.stats.redos, s0.stats.exact, s0.stats.redos) == (2, 2, 2, 0)
    # the same two clipped steps, taken directly
    (r0, p0), (r1, p1) = stage(0), stage(1)
    for it in range(2):
        g0, g1 = grads(r0, it), grads(r1, 10 + it)
        c = coefficient(global_norm([stage_sq_norm(g0), stage_sq_norm(g1)]), cfg.clip)
        assert c < 1
        for m, o, g in ((r0, p0, g0), (r1, p1, g1)):
            scale_(g, c)
            set_grads(m, g)
            o.step()
    assert same(state(m1, o1), state(r1, p1)) and same(state(m0, o0), state(r0, p0))
    assert NormBoard(store, 2).ready(0, 1) is not None  # keys: (version, iteration, stage)


def test_settle_never_waits_for_a_norm_that_cannot_come():
    """A stage that failed before publishing its norm: settle() leaves as soon as a newer
    plan is out (agent hook, or the launcher's plan counter), else after its limit; all
    as CommError, which the agent turns into an abort and a rollback."""
    from executor.runtime.transport.comm import CommError
    from executor.runtime.transport.waiting import DEADLINE, NEWER_PLAN
    cfg = dataclasses.replace(CFG, clip=0.5)
    for how in ("hook", "counter", "limit"):
        store = dist.HashStore()
        m, opt = stage()
        st = StageStepper(m, opt, cfg, 1, 2, store, log=lambda msg: None)
        set_grads(m, grads(m, 0))
        st.step(0, 3)  # stage 0 never publishes for (v3, iteration 0)
        st.wait_s = 0.3 if how == "limit" else 60.0
        if how == "hook":
            newer = type("Plan", (), {"version": 4})()
            st.newer = lambda: newer
        elif how == "counter":
            store.add("plan/version", 5)  # rendezvous.publish_plan: newest version + 1
        with pytest.raises(CommError) as err:
            st.settle()
        # a newer plan (the agent's, or the counter's number) ends the wait; else the limit
        assert err.value.reason == (DEADLINE if how == "limit" else NEWER_PLAN), err.value
        assert (err.value.plan is newer) if how == "hook" else True
        st.rollback(0)  # what the agent does on the new plan: the optimistic step is undone
        assert not any(opt.state.values())
    # settled iterations' keys leave the store once committed
    st = StageStepper(*stage(), cfg, 0, 1, store, log=lambda msg: None)
    for it in range(3):
        set_grads(st.module, grads(st.module, it))
        st.step(it, 7)
    st.forget_committed(2)
    assert [store.check([NormBoard.key(7, i, 0)]) for i in range(3)] == [False, False, True]


def test_gradients_changed_before_settle_are_refused_not_used():
    cfg = dataclasses.replace(CFG, clip=0.5)
    store = dist.HashStore()
    m, opt = stage()
    st = StageStepper(m, opt, cfg, 1, 2, store, log=lambda msg: None)
    set_grads(m, grads(m, 0))
    st.step(0, 0)  # optimistic: stage 0's norm is not in
    next(m.parameters()).grad.zero_()  # e.g. a caller reusing the gradient buffer
    NormBoard(store, 2).publish(0, 0, 0, 100.0)  # the clip applies: a redo is due
    with pytest.raises(RuntimeError, match="changed in place"):
        st.settle()
