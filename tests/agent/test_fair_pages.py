"""The fair pages' slots (agent/fair_pages.py): a sealed memfd per GPU, as the shim maps it
(struct nvshare_fair_page); and the engine handing them out at grants (engine.py)."""

import asyncio
import fcntl
import mmap
import os

import pytest
from agent_harness import GPU0, FairShimClient, ShimClient

from nvshare_agent import protocol
from nvshare_agent.fair_pages import FairPages
from nvshare_agent.protocol import MessageType
from nvshare_agent.settings import AntiThrash, FairPage, Settings, SettingsError, Share, ShareBy

GPU = bytes(range(16))
STATE = protocol.derived_struct("struct nvshare_fair_state")
SLOTS_AT = protocol.ffi.offsetof("struct nvshare_fair_page", "slots")
NAMES = [name for name, _ in protocol.ffi.typeof("struct nvshare_fair_state").fields]


def slot_fields(fd: int, slot: int) -> dict:
    with mmap.mmap(fd, 0, access=mmap.ACCESS_READ) as page:
        return dict(zip(NAMES, STATE.unpack_from(page, SLOTS_AT + slot * STATE.size)))


def test_a_first_grant_takes_a_slot_with_its_weight_once_and_leaving_frees_it():
    pages = FairPages()
    slot, fd = pages.slot_for(1, GPU, 3)
    assert slot == 0 and slot_fields(fd, 0)["weight"] == 3 and slot_fields(fd, 0)["in_use"] == 1
    assert pages.slot_for(1, GPU, 3) is None  # told once
    assert pages.slot_for(2, GPU, 1)[0] == 1
    pages.client_gone(1)
    assert slot_fields(fd, 0)["in_use"] == 0
    assert pages.slot_for(3, GPU, 0) == (0, fd)  # weight 0 is 1
    assert slot_fields(fd, 0)["weight"] == 1
    pages.close()


def test_a_slot_whose_frame_could_not_go_is_free_again():
    pages = FairPages()
    slot, fd = pages.slot_for(1, GPU, 2)
    pages.give_back(1, GPU)
    assert slot_fields(fd, slot)["in_use"] == 0
    assert pages.slot_for(1, GPU, 2) == (slot, fd)  # asked again at its next grant
    pages.close()


def test_nobody_can_cut_the_page_short():
    """A mapping cut short kills its readers (SIGBUS): the size is sealed."""
    pages = FairPages()
    _, fd = pages.slot_for(1, GPU, 1)
    size = os.fstat(fd).st_size
    assert size == protocol.ffi.sizeof("struct nvshare_fair_page")
    with pytest.raises(PermissionError):
        os.ftruncate(fd, 0)
    assert fcntl.fcntl(fd, fcntl.F_GET_SEALS) & fcntl.F_SEAL_SHRINK
    pages.close()


def test_reweighing_writes_only_the_weights_that_changed_and_leaves_unknown_clients_be():
    pages = FairPages()
    _, fd = pages.slot_for(1, GPU, 2)
    pages.slot_for(2, GPU, 2)
    weights = {1: 3, 2: 2}
    assert pages.reweigh(lambda client, gpu: weights[client]) == [(1, GPU, 3)]
    assert [slot_fields(fd, s)["weight"] for s in (0, 1)] == [3, 2]
    assert pages.reweigh(lambda client, gpu: None) == []  # the core no longer knows them
    assert pages.reweigh(lambda client, gpu: 0) == [(1, GPU, 1), (2, GPU, 1)]  # never 0
    pages.close()


# ---------------------------------------------------------------- over a real socket
# The engine in the test's loop (start_inproc_agent: settings change at run time as D-Bus
# changes them), fake shims that map their pages (FairShimClient) in threads beside it.

SIDE_BY_SIDE = Settings(anti_thrash=AntiThrash.OFF)  # every request granted at once
MINE = f"user:{os.getuid()}"  # share_by = user: the test's processes are one group


async def fair_shim(path) -> FairShimClient:
    return await asyncio.to_thread(FairShimClient, path)


async def granted(client: ShimClient) -> protocol.LockMessage:
    client.request(GPU0)
    return await asyncio.to_thread(grant_past_settings, client)


def grant_past_settings(client: ShimClient) -> protocol.LockMessage:
    """The next frame, a grant on GPU0; SETTINGS on the way skipped (a settings change may
    tell every shim the node-wide ones again)."""
    while isinstance(message := client.recv(), protocol.WireSettings):
        pass
    assert isinstance(message, protocol.LockMessage), message
    assert (message.type, message.gpu) == (MessageType.LOCK_GRANT, GPU0), message
    return message


async def test_a_fair_shim_hears_its_slot_right_after_its_first_grant_and_only_then(
    start_inproc_agent,
):
    settings = SIDE_BY_SIDE.replaced(shares=((MINE, Share(weight=3)),))
    _, path = await start_inproc_agent(settings)
    first = await fair_shim(path)
    grant = await granted(first)
    told = await asyncio.to_thread(first.expect, MessageType.FAIR_SLOT)  # the next frame
    assert (told.gpu, told.slot, told.weight) == (GPU0, 0, 3)
    assert first.slot_state()["in_use"] == 1 and first.slot_state()["weight"] == 3
    first.release(grant)
    await granted(first)
    assert await asyncio.to_thread(first.nothing_within, 0.3)  # once per GPU
    second = await fair_shim(path)
    await granted(second)
    assert (await asyncio.to_thread(second.expect, MessageType.FAIR_SLOT)).slot == 1
    assert first.slot_state(slot=1)["in_use"] == 1  # second's slot, seen in first's mapping
    for client in (first, second):
        client.close()


async def test_a_shim_that_does_not_take_the_page_is_given_no_slot(start_inproc_agent):
    _, path = await start_inproc_agent(SIDE_BY_SIDE)
    plain = await asyncio.to_thread(ShimClient, path)
    await granted(plain)
    assert await asyncio.to_thread(plain.nothing_within, 0.3)
    fair = await fair_shim(path)
    await granted(fair)
    assert (await asyncio.to_thread(fair.expect, MessageType.FAIR_SLOT)).slot == 0
    for client in (plain, fair):
        client.close()


async def test_switched_off_the_page_holds_nobody_and_on_again_it_is_handed_out_again(
    start_inproc_agent,
):
    """Off: every slot given out is marked free in the page (a shim waits only for slots in
    use, shim/fair_share.c), and no slot is handed out; the slots stay their shims', who
    still write them.  On again: theirs in use again, and the others' at their next grant."""
    agent, path = await start_inproc_agent(SIDE_BY_SIDE)
    first, second = await fair_shim(path), await fair_shim(path)
    for client in (first, second):
        await granted(client)
        await asyncio.to_thread(client.expect, MessageType.FAIR_SLOT)
    await agent.change_settings(fair_page=FairPage.OFF)
    assert [first.slot_state(slot=s)["in_use"] for s in (0, 1)] == [0, 0]
    assert [first.slot_state(slot=s)["weight"] for s in (0, 1)] == [1, 1]
    late = await fair_shim(path)
    late_grant = await granted(late)
    assert await asyncio.to_thread(late.nothing_within, 0.3)  # no slot while off
    await agent.change_settings(fair_page=FairPage.ON)
    assert [first.slot_state(slot=s)["in_use"] for s in (0, 1, 2)] == [1, 1, 0]
    late.release(late_grant)
    await granted(late)
    assert (await asyncio.to_thread(late.expect, MessageType.FAIR_SLOT)).slot == 2
    assert first.slot_state(slot=2)["in_use"] == 1
    for client in (first, second, late):
        client.close()


async def test_a_bad_fair_page_changes_nothing(start_inproc_agent):
    agent, path = await start_inproc_agent(SIDE_BY_SIDE)
    fair = await fair_shim(path)
    await granted(fair)
    await asyncio.to_thread(fair.expect, MessageType.FAIR_SLOT)
    with pytest.raises(SettingsError, match="^fair_page must be on or off, got 'off'$"):
        await agent.change_settings(fair_page="off")  # the word, not the value
    assert agent.settings.fair_page is FairPage.ON and fair.slot_state()["in_use"] == 1
    fair.close()


async def test_a_weight_changed_at_run_time_is_written_in_the_slots_of_its_group(
    start_inproc_agent,
):
    """A shim reads its weight from its slot at each look (shim/fair_share.c): a group's new
    weight, or a client's new group, reaches shims that hold a slot already."""
    settings = SIDE_BY_SIDE.replaced(shares=((MINE, Share(weight=2)),))
    agent, path = await start_inproc_agent(settings)
    first, second = await fair_shim(path), await fair_shim(path)
    for client in (first, second):
        await granted(client)
        assert (await asyncio.to_thread(client.expect, MessageType.FAIR_SLOT)).weight == 2
    await agent.change_settings(shares=((MINE, Share(weight=5)),))
    assert [first.slot_state(slot=s)["weight"] for s in (0, 1)] == [5, 5]
    await agent.change_settings(share_by=ShareBy.PROCESS)  # each its own group, of weight 1
    assert [first.slot_state(slot=s)["weight"] for s in (0, 1)] == [1, 1]
    for client in (first, second):
        client.close()
