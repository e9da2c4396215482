"""The core with settings per GPU: each GPU runs by its own time quantum, anti-thrash
mode and memory limit, and a change on one leaves the other alone.  Time is an
argument: nothing here sleeps.  (docs/scheduling.md, "Settings per GPU".)"""

from __future__ import annotations

import pytest

from nvshare_agent.actions import (
    AskToDrop,
    GpuSettingsApplied,
    Grant,
    IndexSettingsUnused,
    ModeChanged,
    Queued,
    Revoke,
)
from nvshare_agent.core_state import FEATURE_YIELD
from nvshare_agent.policy import BUSY_TURN_S
from nvshare_agent.protocol import format_uuid
from nvshare_agent.scheduler import Scheduler
from nvshare_agent.settings import AntiThrash, GpuOverrides, Settings

G0, G1 = b"\x00" * 15 + b"\x01", b"\x00" * 15 + b"\x02"
U0, U1 = format_uuid(G0), format_uuid(G1)
GIB = 1 << 30
GRACE = 2.0
NODE = Settings(
    time_quantum_s=30,
    anti_thrash=AntiThrash.ON,
    idle_release_ms=100,
    drop_grace_ms=int(GRACE * 1000),
)


def of(kind, actions):
    return [a for a in actions if isinstance(a, kind)]


def one(kind, actions, client=None):
    found = [a for a in of(kind, actions) if client is None or a.client == client]
    assert len(found) == 1, actions
    return found[0]


def own(**values) -> GpuOverrides:
    if "anti_thrash" in values:
        values["anti_thrash"] = AntiThrash(values["anti_thrash"])
    return GpuOverrides(**values)


def with_gpus(settings: Settings = NODE, **by_id: GpuOverrides) -> Settings:
    """settings with GPUs' own; ids as keywords: gpu0 for "0", or U0/U1 through **{U0: ...}."""
    return settings.with_gpu_overrides(
        (gpu_id.removeprefix("gpu"), o) for gpu_id, o in by_id.items()
    )


def make(settings: Settings, n_clients: int = 3, inventory: bool = True, capacity: int = 80 * GIB):
    """Clients 1..n on both GPUs; with an inventory, G0 is NVML's GPU 0 and G1 its GPU 1."""
    s = Scheduler(settings, format_gpu=format_uuid)
    if inventory:
        s.add_gpu(G0, "GPU", capacity)
        s.add_gpu(G1, "GPU", capacity)
    for c in range(1, n_clients + 1):
        s.connect(c, pid=100 + c, uid=1000, gid=1000)
        s.hello(c, (G0, G1), f"cmd{c}", now=0.0, features=FEATURE_YIELD)
    return s


def hold_both(s, client: int, now: float = 0.0) -> dict[bytes, int]:
    return {gpu: one(Grant, s.request(client, gpu, now)).lease for gpu in (G0, G1)}


# ---------------------------------------------------------------- one GPU, the other left alone


def test_a_gpus_own_quantum_ends_its_turns_and_the_other_keeps_the_nodes():
    s = make(with_gpus(gpu0=own(time_quantum_s=1)))
    hold_both(s, 1)
    for gpu in (G0, G1):
        s.request(2, gpu, 0.5)
    assert s.next_deadline() == 1.0
    drop = one(AskToDrop, s.tick(1.0))
    assert (drop.gpu, drop.client, drop.reason) == (G0, 1, "quantum over")
    assert s.gpus[G1].holders[1].drop_requested_at is None
    assert s.next_deadline() == 1.0 + GRACE  # G0's revoke comes before G1's quantum
    one(Revoke, s.tick(1.0 + GRACE))
    assert s.next_deadline() == 30.0
    drop = one(AskToDrop, s.tick(30.0))
    assert (drop.gpu, drop.client) == (G1, 1)


def test_a_gpus_own_mode_leaves_the_other_gpu_as_it_was():
    s = make(with_gpus(gpu1=own(anti_thrash="off")))
    one(Grant, s.request(1, G0, 0.0))
    assert of(Queued, s.request(2, G0, 0.0))  # on: one at a time
    for client in (1, 2, 3):
        assert not one(Grant, s.request(client, G1, 0.0)).exclusive  # off: all at once
    snapshot = {g.uuid: g for g in s.snapshot(0.0).gpus}
    assert (snapshot[U0].anti_thrash, snapshot[U0].mode) == ("on", "exclusive")
    assert (snapshot[U1].anti_thrash, snapshot[U1].mode) == ("off", "shared")


def test_a_gpus_own_memory_limit_refits_it_alone():
    auto = NODE.replaced(anti_thrash=AntiThrash.AUTO)
    s = make(auto)
    for gpu in (G0, G1):
        for client in (1, 2):
            s.memory_report(client, gpu, 256 << 20, 0, 0.0)
            s.request(client, gpu, 0.0)
    actions = s.change_settings(with_gpus(auto, gpu0=own(memory_limit_bytes=1 * GIB)), 0.2)
    switch = one(ModeChanged, actions)
    assert (switch.gpu, switch.mode, switch.capacity_bytes) == (G0, "exclusive", 1 * GIB)
    assert {(d.gpu, d.client) for d in of(AskToDrop, actions)} == {(G0, 2)}  # beside the turn
    assert s.gpus[G1].fits and s.gpus[G1].capacity_bytes == 80 * GIB
    snapshot = {g.uuid: g for g in s.snapshot(1.0).gpus}
    assert snapshot[U0].memory_limit_bytes == 1 * GIB and snapshot[U1].memory_limit_bytes == 0


def test_a_limit_of_zero_on_one_gpu_lifts_the_nodes_limit_there():
    limited = NODE.replaced(anti_thrash=AntiThrash.AUTO, memory_limit_bytes=512 << 20)
    s = make(with_gpus(limited, gpu1=own(memory_limit_bytes=0)))
    assert s.gpus[G0].capacity_bytes == 512 << 20
    assert s.gpus[G1].capacity_bytes == 80 * GIB


def test_one_process_on_two_gpus_is_asked_to_drop_each_by_that_gpus_quantum():
    # The case: GPU 0 at TQ 1 s, GPU 1 at 30 s; another client waits on both.
    s = make(with_gpus(gpu0=own(time_quantum_s=1), gpu1=own(time_quantum_s=30)), n_clients=2)
    leases = hold_both(s, 1)
    for gpu in (G0, G1):
        s.request(2, gpu, 0.0)
    drop = one(AskToDrop, s.tick(1.0))
    assert drop.gpu == G0 and drop.held_s == 1.0
    grant = one(Grant, s.release(1, G0, leases[G0], 1.1))
    assert (grant.gpu, grant.client) == (G0, 2)
    assert not of(AskToDrop, s.tick(29.9))
    assert 1 in s.gpus[G1].holders and s.gpus[G1].holders[1].drop_requested_at is None
    assert one(AskToDrop, s.tick(30.0)).gpu == G1


@pytest.mark.parametrize(
    "node_ms, own_ms",
    [(100, {"gpu0": 300}), (300, {"gpu1": 100})],
    ids=["300 on GPU 0, the node's 100 on GPU 1", "the node's 300 on GPU 0, 100 on GPU 1"],
)
def test_light_work_waits_each_gpus_own_light_wait(node_ms, own_ms):
    # Nothing fits beside the turn (a tiny limit).  A trainer holds the turn on each GPU;
    # a new notebook, owed GPU time by its nil use, asks on both 100 ms into it (before
    # the turn's BUSY_TURN_S is over).  Each turn is asked to drop the drain (25 ms)
    # before that GPU's light wait is up: +275 ms where it is 300 ms, +75 ms where 100.
    auto = NODE.replaced(
        anti_thrash=AntiThrash.AUTO, memory_limit_bytes=512 << 20, light_wait_ms=node_ms
    )
    s = make(with_gpus(auto, **{gpu: own(light_wait_ms=ms) for gpu, ms in own_ms.items()}))
    assert (s.gpus[G0].settings.light_wait_ms, s.gpus[G1].settings.light_wait_ms) == (300, 100)
    hold_both(s, 1)
    for gpu in (G0, G1):
        assert of(Queued, s.request(2, gpu, 0.1))
    drops = []
    while (now := s.next_deadline()) < BUSY_TURN_S:
        drops += [(now, d) for d in of(AskToDrop, s.tick(now)) if not d.when_idle_ms]
    assert [(d.gpu, d.client, d.reason) for _, d in drops] == [
        (G1, 1, "owed work waits"),
        (G0, 1, "owed work waits"),
    ]
    assert [at for at, _ in drops] == [pytest.approx(0.175), pytest.approx(0.375)]


# ---------------------------------------------------------------- index and UUID


def test_an_entry_by_uuid_wins_over_one_by_index_key_by_key():
    s = make(
        with_gpus(
            **{
                "gpu1": own(time_quantum_s=5, anti_thrash="off"),
                U1: own(time_quantum_s=7),
            }
        )
    )
    g1 = s.gpus[G1].settings
    assert (g1.time_quantum_s, g1.anti_thrash) == (7, AntiThrash.OFF)
    assert s.gpus[G0].settings.time_quantum_s == 30 and s.gpus[G0].index == 0


def test_the_index_is_nvmls_number_not_the_order_of_calls():
    s = Scheduler(with_gpus(gpu2=own(time_quantum_s=9)))
    s.add_gpu(G0, index=0)
    s.add_gpu(G1, index=2)  # NVML's 1 was no whole GPU (a MIG instance)
    assert s.gpus[G1].settings.time_quantum_s == 9 and s.gpus[G0].settings.time_quantum_s == 30
    assert [g.index for g in s.snapshot(0.0).gpus] == [0, 2]


def test_without_an_inventory_an_index_names_no_gpu_and_the_log_says_so_once():
    s = make(with_gpus(gpu0=own(time_quantum_s=1), **{U1: own(time_quantum_s=2)}), inventory=False)
    assert s.gpus[G0].settings.time_quantum_s == 30  # no index to match "0" against
    assert s.gpus[G1].settings.time_quantum_s == 2  # by UUID it applies
    assert one(IndexSettingsUnused, s.inventory_missing()).gpu_ids == ("0",)
    same = s.change_settings(with_gpus(gpu0=own(time_quantum_s=3), **{U1: own()}), 1.0)
    assert not of(IndexSettingsUnused, same)
    more = s.change_settings(with_gpus(gpu0=own(time_quantum_s=3), gpu5=own(time_quantum_s=3)), 2.0)
    assert one(IndexSettingsUnused, more).gpu_ids == ("0", "5")


def test_a_gpu_learned_from_clients_takes_its_settings_by_index_once_nvml_numbers_it():
    s = make(with_gpus(gpu0=own(anti_thrash="off")), inventory=False)
    one(Grant, s.request(1, G0, 0.0))
    assert of(Queued, s.request(2, G0, 0.0))  # node-wide: on
    actions = s.add_gpu(G0, "GPU", 80 * GIB, now=1.0, index=0)
    applied = one(GpuSettingsApplied, actions)
    assert (applied.gpu, applied.index, applied.own) == (G0, 0, ("anti_thrash",))
    assert one(Grant, actions).client == 2  # off: the waiter runs beside the holder


# ---------------------------------------------------------------- switching one GPU's mode


def waiting_on_both(settings: Settings):
    s = make(settings)
    hold_both(s, 1)
    for gpu in (G0, G1):
        s.request(2, gpu, 0.0)
    return s


def test_switching_one_gpu_off_grants_its_waiters_and_forgets_its_drops_only():
    s = waiting_on_both(NODE.replaced(time_quantum_s=10))
    assert len(of(AskToDrop, s.tick(10.0))) == 2
    actions = s.change_settings(
        with_gpus(NODE.replaced(time_quantum_s=10), gpu0=own(anti_thrash="off")), 10.5
    )
    grant = one(Grant, actions)
    assert (grant.gpu, grant.client, grant.exclusive) == (G0, 2, False)
    assert s.gpus[G0].holders[1].drop_requested_at is None
    assert s.gpus[G1].holders[1].drop_requested_at == 10.0
    assert one(Revoke, s.tick(10.0 + GRACE)).gpu == G1


def test_switching_one_gpu_on_drains_its_shared_holders_only():
    off = NODE.replaced(anti_thrash=AntiThrash.OFF)
    s = make(off)
    for client in (1, 2):
        hold_both(s, client)
    actions = s.change_settings(with_gpus(off, gpu1=own(anti_thrash="on")), 1.0)
    assert {(d.gpu, d.client) for d in of(AskToDrop, actions)} == {(G1, 1), (G1, 2)}
    assert not any(h.drop_requested_at for h in s.gpus[G0].holders.values())


def test_switching_one_gpu_from_off_to_auto_asks_its_holders_again():
    off = NODE.replaced(anti_thrash=AntiThrash.OFF)
    s = make(off)
    hold_both(s, 1)
    actions = s.change_settings(with_gpus(off, gpu0=own(anti_thrash="auto")), 1.0)
    drop = one(AskToDrop, actions)
    assert (drop.gpu, drop.reason) == (G0, "anti-thrash auto")
    assert one(ModeChanged, actions).gpu == G0  # auto's verdict, logged for that GPU


def test_taking_a_gpus_own_setting_away_returns_it_to_the_nodes():
    s = waiting_on_both(with_gpus(gpu0=own(anti_thrash="off")))
    assert 2 in s.gpus[G0].holders  # off: granted beside
    actions = s.change_settings(NODE, 1.0)
    assert {(d.gpu, d.client) for d in of(AskToDrop, actions)} == {(G0, 1), (G0, 2)}
    applied = one(GpuSettingsApplied, actions)
    assert (applied.gpu, applied.own, applied.settings.anti_thrash) == (G0, (), AntiThrash.ON)


def test_a_node_wide_change_reaches_the_gpus_that_do_not_set_it_themselves():
    s = make(with_gpus(gpu0=own(time_quantum_s=5)))
    actions = s.change_settings(
        with_gpus(NODE.replaced(time_quantum_s=60), gpu0=own(time_quantum_s=5)), 1.0
    )
    assert not of(GpuSettingsApplied, actions)  # G0's own did not change
    assert s.gpus[G0].settings.time_quantum_s == 5 and s.gpus[G1].settings.time_quantum_s == 60
