"""Share groups' counters in the core (group_totals.py): per GPU, each group's GPU
time and seconds waited by cause are its clients' figures added up, those of the
clients that have gone included, and never go backwards; gone groups are forgotten
within bounds.  Time is an argument: no sleeps."""

from __future__ import annotations

import random
from pathlib import Path

import pytest

from nvshare_agent.core_state import FEATURE_USAGE
from nvshare_agent.group_totals import GONE_GROUP_KEEP_S, MAX_GONE_GROUPS
from nvshare_agent.scheduler import Scheduler
from nvshare_agent.settings import AntiThrash, Settings, Share, ShareBy
from nvshare_agent.snapshot import ShareGroupSnapshot

REPO = Path(__file__).resolve().parents[1]
G0 = b"\x00" * 15 + b"\x01"
ON = Settings(time_quantum_s=3600, anti_thrash=AntiThrash.ON)  # a queue: waits for a turn
US = 1_000_000  # GPU_USAGE counts microseconds


def node(settings: Settings = ON) -> Scheduler:
    """A scheduler with G0 in its inventory: the GPU stays when its clients go."""
    s = Scheduler(settings)
    s.add_gpu(G0, "H100", 80 << 30, 0.0)
    return s


def come(s: Scheduler, client: int, uid: int, now: float) -> None:
    """A measuring shim (its GPU time is what it reports) of uid, pid 100 + client."""
    s.connect(client, 100 + client, uid, uid, now)
    s.hello(client, (G0,), "trainer", now, features=FEATURE_USAGE)


def groups(s: Scheduler, now: float) -> dict[str, ShareGroupSnapshot]:
    return {g.group: g for g in s.snapshot(now).groups}


def own_figures(s: Scheduler, now: float) -> dict[int, tuple[float, dict[str, float]]]:
    """Each client's own figures on G0, by pid: GPU seconds, seconds waited by cause."""
    found = {}
    for client in s.snapshot(now).clients:
        (entry,) = client.gpus
        found[client.pid] = (entry.gpu_seconds, dict(entry.waited_s))
    return found


def test_a_groups_counters_are_its_clients_figures_and_keep_those_that_left():
    s = node()
    for client, uid in ((1, 1000), (2, 1000), (3, 2000)):
        come(s, client, uid, 0.0)
        s.request(client, G0, 0.0)  # 1 holds; 2, then 3 wait their turn
    s.gpu_usage(1, G0, 4 * US, 4.0)
    alice = groups(s, 4.0)["user:1000"]
    assert (alice.gpu_seconds, dict(alice.waited_s), alice.clients) == (4.0, {"turn": 4.0}, 2)
    before = own_figures(s, 5.0)
    assert before[101] == (4.0, {"turn": 0.0}) and before[102] == (0.0, {"turn": 5.0})

    s.disconnect(1, 5.0)  # gone while holding: 2 is granted
    alice = groups(s, 5.0)["user:1000"]
    assert alice.clients == 1
    # What 1 did stays: its last figures and 2's, added up.
    assert (alice.gpu_seconds, dict(alice.waited_s)) == (4.0, {"turn": 5.0})

    s.gpu_usage(2, G0, 2 * US, 7.0)
    s.disconnect(2, 7.0)  # 3 is granted
    come(s, 4, 2000, 7.0)
    s.request(4, G0, 7.0)
    s.disconnect(4, 9.5)  # gone while waiting: its wait so far counts
    shown = groups(s, 10.0)
    alice, bob = shown["user:1000"], shown["user:2000"]
    assert (alice.gpu_seconds, dict(alice.waited_s), alice.clients) == (6.0, {"turn": 5.0}, 0)
    assert (bob.gpu_seconds, dict(bob.waited_s), bob.clients) == (0.0, {"turn": 9.5}, 1)


def test_a_client_that_moves_leaves_what_it_did_with_the_group_it_did_it_in():
    s = node(ON.replaced(share_by=ShareBy.UNIT))
    come(s, 1, 1000, 0.0)  # the user's group until its unit is known
    s.request(1, G0, 0.0)
    s.gpu_usage(1, G0, 2 * US, 2.0)
    s.identified(1, "jupyter-alice.service", "", 2.0)
    s.gpu_usage(1, G0, 5 * US, 5.0)
    shown = groups(s, 5.0)
    assert shown["user:1000"].gpu_seconds == 2.0 and shown["user:1000"].clients == 0
    assert shown["unit:jupyter-alice.service"].gpu_seconds == 3.0
    # share_by changes: each group keeps what it had; the process's counts from now.
    s.change_settings(s.settings.replaced(share_by=ShareBy.PROCESS), 6.0)
    s.gpu_usage(1, G0, 7 * US, 7.0)
    shown = groups(s, 7.0)
    # What its shim had reported when it moved (by 5.0) stays; the rest is the process's.
    assert shown["unit:jupyter-alice.service"].gpu_seconds == 3.0
    assert shown["process:101"].gpu_seconds == 2.0
    assert sum(g.gpu_seconds for g in shown.values()) == own_figures(s, 7.0)[101][0] == 7.0


@pytest.mark.parametrize("seed", range(6))
def test_counters_never_go_backwards_and_add_up_to_every_clients_figures(seed):
    """Clients of three users (two units) come, ask, use, release, move and go at random,
    under each mode and share_by: at every step each group's counters are at least
    what they were, and the groups together hold the present clients' figures and the
    last figures of those gone."""
    rng = random.Random(seed)
    settings = Settings(time_quantum_s=2, anti_thrash=rng.choice(list(AntiThrash)))
    s = node(settings)
    used: dict[int, float] = {}  # client -> its GPU time reported so far
    gone_gpu_s, gone_waited = 0.0, 0.0
    last: dict[str, tuple[float, dict[str, float]]] = {}
    ids = iter(range(1, 10_000))
    now = 0.0
    for _ in range(400):
        now += rng.uniform(0.0, 1.0)
        s.tick(now)
        step = rng.random()
        if step < 0.15 or not used:
            client = next(ids)
            come(s, client, rng.choice((1000, 2000, 3000)), now)
            s.memory_report(client, G0, rng.choice((1, 20, 50)) << 30, 0, now)
            used[client] = 0.0
        elif step < 0.35:
            s.request(rng.choice(list(used)), G0, now)
        elif step < 0.55:
            client = rng.choice(list(used))
            held = s.gpus[G0].holders.get(client)
            if held is not None:
                used[client] += rng.uniform(0.0, 1.0)
                s.gpu_usage(client, G0, int(used[client] * US), now)
                s.release(client, G0, held.number, now)
            elif client in s.gpus[G0].waiters:
                s.release(client, G0, 0, now)  # withdrawn: its wait ends
        elif step < 0.7:
            client = rng.choice(list(used))
            used[client] += rng.uniform(0.0, 0.5)
            s.gpu_usage(client, G0, int(used[client] * US), now)
        elif step < 0.8:
            client = rng.choice(list(used))
            s.identified(client, rng.choice(("a.service", "b.service")), "", now)
        elif step < 0.85:
            s.change_settings(s.settings.replaced(share_by=rng.choice(list(ShareBy))), now)
        else:
            client = rng.choice(list(used))
            gpu_s, waited = own_figures(s, now)[100 + client]
            gone_gpu_s, gone_waited = gone_gpu_s + gpu_s, gone_waited + sum(waited.values())
            s.disconnect(client, now)
            del used[client]
        shown = groups(s, now)
        for group, (gpu_s, waited) in last.items():
            if group in shown:  # kept GONE_GROUP_KEEP_S at least: longer than this walk
                assert shown[group].gpu_seconds >= gpu_s, (group, now)
                for cause, seconds in waited.items():
                    assert dict(shown[group].waited_s)[cause] >= seconds, (group, cause)
        assert set(last) <= set(shown)
        last = {g: (row.gpu_seconds, dict(row.waited_s)) for g, row in shown.items()}
        present = own_figures(s, now).values()
        assert sum(row.gpu_seconds for row in shown.values()) == pytest.approx(
            gone_gpu_s + sum(gpu_s for gpu_s, _ in present), abs=1e-4
        )
        assert sum(sum(dict(row.waited_s).values()) for row in shown.values()) == pytest.approx(
            gone_waited + sum(sum(waited.values()) for _, waited in present), abs=1e-4
        )


def test_a_gone_group_is_forgotten_after_gone_group_keep_s_one_with_settings_is_not():
    s = node(ON.replaced(shares=(("user:2000", Share(weight=2)),)))
    come(s, 1, 1000, 0.0)
    come(s, 2, 2000, 0.0)
    s.request(1, G0, 0.0)
    s.gpu_usage(1, G0, 1 * US, 1.0)
    s.disconnect(1, 1.0)
    s.disconnect(2, 1.0)
    assert groups(s, 1.0 + GONE_GROUP_KEEP_S)["user:1000"].gpu_seconds == 1.0
    later = groups(s, 2.0 + GONE_GROUP_KEEP_S)
    assert set(later) == {"user:2000"}  # kept while it has settings of its own
    # Back after it was forgotten: its counters start again, a new series.
    come(s, 3, 1000, 3.0 + GONE_GROUP_KEEP_S)
    assert groups(s, 3.0 + GONE_GROUP_KEEP_S)["user:1000"].gpu_seconds == 0.0


def test_ten_thousand_short_lived_groups_keep_at_most_max_gone_groups():
    s = node(ON.replaced(share_by=ShareBy.PROCESS))
    come(s, 1, 1000, 0.0)  # stays
    now = 0.0
    for client in range(2, 10_002):
        now += 0.01
        come(s, client, 1000, now)
        s.request(client, G0, now)
        s.gpu_usage(client, G0, 1000, now)
        s.release(client, G0, s.gpus[G0].holders[client].number, now)
        s.disconnect(client, now)
    shown = groups(s, now)
    # The stayer's group, and the latest gone: each still with what it did.
    latest = {f"process:{100 + c}" for c in range(10_002 - MAX_GONE_GROUPS, 10_002)}
    assert set(shown) == latest | {"process:101"}
    assert all(shown[g].gpu_seconds == 0.001 for g in latest)


def test_docs_metrics_md_states_the_bounds():
    text = (REPO / "docs/metrics.md").read_text()
    assert f"for {GONE_GROUP_KEEP_S:g} s after their last process" in text
    assert f"at most {MAX_GONE_GROUPS} of them per GPU" in text
