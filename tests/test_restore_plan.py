"""Who restores what from where when the job rolls back to a peer-memory snapshot
(executor/runtime/stage_state/entry_plan.py plan_restore, restore_steps). Pure."""
from hypothesis import given, settings
from hypothesis import strategies as st

from executor.runtime.stage_state.entry_plan import (EntryOp, EntryStep, Has, decode, encode,
                                                     plan_restore, restore_steps, tier_of)


def test_2x2_stage_1_lost_its_holder_moves_in_and_the_others_restore_their_own():
    # worker in slot (0,0) kept stage 0 at 3 and 5; the mover, now in (0,1), holds stage 1's
    # snapshot at 3 only (5 was still streaming when stage 1 died)
    members = {(0, 0): Has(0, {0: (5, 3)}), (0, 1): Has(1, {1: (3,)})}
    p = plan_restore(members, 2)
    assert p.iteration == 3 and p.own == ((0, 0), (0, 1)) and p.providers == {}


def test_a_taker_receives_from_a_member_of_its_stage_else_from_a_holder():
    members = {(0, 0): Has(0, {0: (4,), 1: (4,)}), (1, 0): Has(0, {}),
               (0, 1): Has(1, {})}
    p = plan_restore(members, 2)
    assert p.iteration == 4 and p.own == ((0, 0),)
    assert p.providers == {0: (0, 0), 1: (0, 0)}
    assert p.takers == {0: ((1, 0),), 1: ((0, 1),)}
    assert p.sends((0, 0)) == [(0, (1, 0)), (1, (0, 1))]
    # lowered: (0,0) restores its own and sends it to its stage's taker; (0,1) has no
    # member of its stage with a copy: it fetches the snapshot (0,0) holds for it
    steps = {w: restore_steps(p, members, w) for w in members}
    assert steps[(0, 0)] == (EntryStep(EntryOp.RESTORE_OWN, 4),
                             EntryStep(EntryOp.SEND_STATE, peers=((1, 0),)),
                             EntryStep(EntryOp.RESTART_AFTER, 4),
                             EntryStep(EntryOp.TELL_ROLLBACK, 4))
    assert steps[(1, 0)] == (EntryStep(EntryOp.RECV_STATE, peer=(0, 0)),
                             EntryStep(EntryOp.RESTART_AFTER, 4))
    assert steps[(0, 1)] == (EntryStep(EntryOp.FETCH_SNAPSHOT, 4, peer=(0, 0)),
                             EntryStep(EntryOp.RESTART_AFTER, 4))


def test_a_stage_lost_before_any_snapshot_landed_rolls_back_to_the_start():
    # stage 1's only copy died with its workers; a run from its seed rebuilds every stage
    # as at start, so the job goes back to its origin (-1) rather than halting
    members = {(0, 0): Has(0, {0: (5, 3)}, origin=-1), (0, 1): Has(1, {}, origin=-1)}
    p = plan_restore(members, 2)
    assert p.iteration == -1 and p.own == ((0, 0), (0, 1)) and p.providers == {}
    assert decode(encode(members[(0, 1)], 2), 2) == members[(0, 1)]
    # a snapshot every stage has wins over the origin; a resumed run has no origin
    members[(0, 1)] = Has(1, {1: (3,)}, origin=-1)
    assert plan_restore(members, 2).iteration == 3
    assert plan_restore({(0, 0): Has(0, {0: (5,)}), (0, 1): Has(1, {})}, 2) is None
    # a member without the origin receives the stage from one that rebuilds it
    p = plan_restore({(0, 0): Has(0, {}, origin=-1), (1, 0): Has(0, {}),
                      (0, 1): Has(1, {}, origin=-1)}, 2)
    assert p.iteration == -1 and p.providers == {0: (0, 0)} and p.takers == {0: ((1, 0),)}


def test_a_disk_checkpoint_newer_than_every_memory_copy_wins_over_the_seed():
    """Issue 42: peer memory and disk are two tiers of one store; a stage lost before any
    snapshot of it rolled the job back to the seed though iteration 2 was on disk."""
    members = {(0, 0): Has(0, {0: (1,)}, origin=-1, disk=(2, 1)),
               (0, 1): Has(1, {}, origin=-1, disk=(2, 1))}
    p = plan_restore(members, 2)
    assert p.iteration == 2 and p.own == ((0, 0), (0, 1)) and p.providers == {}
    assert tier_of(members, 2) == "the checkpoint on disk of iteration 2"
    assert decode(encode(members[(0, 1)], 2), 2) == members[(0, 1)]
    # a newer snapshot of every stage wins over the disk
    members = {(0, 0): Has(0, {0: (4,)}, disk=(2,)), (0, 1): Has(1, {1: (4,)}, disk=(2,))}
    assert plan_restore(members, 2).iteration == 4
    assert tier_of(members, 4) == "peer-memory snapshots"
    # a member that cannot read the disk receives its stage from one of its stage that can
    p = plan_restore({(0, 0): Has(0, {}, disk=(3,)), (1, 0): Has(0, {}),
                      (0, 1): Has(1, {}, disk=(3,))}, 2)
    assert p.iteration == 3 and p.providers == {0: (0, 0)} and p.takers == {0: ((1, 0),)}


def test_no_common_iteration_means_no_restore():
    assert plan_restore({(0, 0): Has(0, {0: (4,)}), (0, 1): Has(1, {1: (2,)})}, 2) is None
    assert plan_restore({(0, 0): Has(0, {0: (4,)})}, 2) is None


@settings(max_examples=200, deadline=None)
@given(st.integers(1, 3), st.data())
def test_every_member_ends_with_its_stage_at_the_chosen_iteration(S, data):
    members = {}
    for w in [(r, s) for r in range(2) for s in range(S)]:
        if data.draw(st.booleans()):
            copies = {s: tuple(sorted(data.draw(st.sets(st.integers(0, 5), max_size=3)),
                                      reverse=True)) for s in range(S)}
            members[w] = Has(data.draw(st.integers(0, S - 1)), {s: c for s, c in copies.items() if c},
                             data.draw(st.sampled_from([None, -1])),
                             tuple(sorted(data.draw(st.sets(st.integers(0, 5), max_size=2)),
                                          reverse=True)))
    for w, h in members.items():
        assert decode(encode(h, S), S) == h
    p = plan_restore(members, S)
    have = {s: set().union(*[h.copies.get(s, ()) for h in members.values()],
                           {h.origin for h in members.values() if h.stage == s} - {None},
                           *[h.disk for h in members.values() if h.stage == s])
            for s in range(S)}
    common = set.intersection(*have.values()) if members else set()
    if not common:
        assert p is None
        return
    assert p.iteration == max(common)
    for w, h in members.items():
        if w in p.own:
            assert h.can_give(h.stage, p.iteration)
        else:
            prov = p.providers[h.stage]
            assert w in p.takers[h.stage] and members[prov].can_give(h.stage, p.iteration)
    # lowered: each member takes its stage's state once, every world receive has its send,
    # and one member tells the coordinator
    steps = {w: restore_steps(p, members, w) for w in members}
    sent = {(w, t) for w, ss in steps.items() for s in ss if s.op is EntryOp.SEND_STATE
            for t in s.peers}
    for w, ss in steps.items():
        takes = [s for s in ss if s.op in (EntryOp.RESTORE_OWN, EntryOp.RECV_STATE,
                                           EntryOp.FETCH_SNAPSHOT)]
        assert len(takes) == 1 and ss[len(takes)].op in (EntryOp.SEND_STATE,
                                                         EntryOp.RESTART_AFTER)
        if takes[0].op is EntryOp.RECV_STATE:
            assert (takes[0].peer, w) in sent and takes[0].peer in p.own
        if takes[0].op is EntryOp.FETCH_SNAPSHOT:
            assert p.iteration in members[takes[0].peer].copies.get(members[w].stage, ())
        assert EntryStep(EntryOp.RESTART_AFTER, p.iteration) in ss
    assert {r for ss in steps.values() for s in ss if s.op is EntryOp.RECV_STATE
            for r in [s.peer]} <= {w for w, _ in sent}
    assert sum(EntryStep(EntryOp.TELL_ROLLBACK, p.iteration) in ss
               for ss in steps.values()) == 1


def test_a_held_snapshot_restored_is_a_copy_the_optimizer_cannot_write_through():
    """`load_state_dict` keeps tensors it is given when dtype and device match: a restore
    from a held snapshot must not hand it views of the holder's payload."""
    import torch

    from executor.runtime.peer_snapshots.host import Held
    from executor.runtime.peer_snapshots.wire import byte_views, flatten, layout
    from executor.runtime.peer_snapshots.wire import held_state

    p = torch.nn.Parameter(torch.ones(4))
    opt = torch.optim.AdamW([p], lr=0.1)
    p.grad = torch.ones(4)
    opt.step()
    tree, tensors = flatten({"optim": opt.state_dict()})
    specs, total = layout(tensors)
    payload = bytearray(total)
    for (_, _, off, n), view in zip(specs, byte_views(tensors)):
        payload[off:off + n] = view
    held = Held(1, {"tree": tree, "tensors": specs}, payload)
    before = bytes(payload)
    opt.load_state_dict(held_state(held)["optim"])
    p.grad = torch.ones(4)
    opt.step()  # moments change in place
    assert bytes(payload) == before
