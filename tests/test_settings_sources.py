"""What the admin reads is what runs (issue 45): each value's source (default, file,
its last good copy, run time) and the file's value beside it; a share section for a
user this node lacks is skipped with a warning, the rest of the file applies; a size
out of range is refused naming its setting; a config problem says what runs."""

from pathlib import Path

import pytest

from nvshare_agent.settings import (
    AntiThrash,
    GpuOverrides,
    Settings,
    SettingsError,
    Share,
    check_setting,
)
from nvshare_agent.settings_files import (
    SettingsStore,
    load_settings,
    overrides_after,
    parse_config,
    parse_config_file,
    settings_at_start,
    settings_over,
)
from nvshare_agent.settings_sources import Source, pin_address, value_sources
from nvshare_agent.settings_store import without_pin

CONFIG = Path("/etc/nvshare/nvshare.conf")
NO_SUCH_USER = "nobody-by-that-name"


def by_name(rows) -> dict:
    return {(row.section, row.key): row for row in rows}


# ---------------------------------------------------------------- a user this node lacks


def test_a_share_for_a_user_this_node_lacks_is_skipped_with_a_warning_naming_it():
    config = parse_config_file(
        f"[scheduler]\ntime_quantum = 20\n\n[share:user:{NO_SUCH_USER}]\nweight = 3\n"
        "[share:user:0]\nweight = 2\n",
        CONFIG,
    )
    assert config.settings.time_quantum_s == 20  # [scheduler] applies
    assert dict(config.settings.shares) == {"user:0": Share(weight=2)}
    (warning,) = config.warnings
    assert warning.startswith(f"config {CONFIG} line 4: [share:user:{NO_SUCH_USER}] skipped: ")
    assert f"no user named '{NO_SUCH_USER}' on this node" in warning and "\n" not in warning


def test_a_skipped_share_section_is_still_checked_for_typos():
    with pytest.raises(SettingsError, match=r"line 2: \[share:user:.*\] weight: a share's weight"):
        parse_config(f"[share:user:{NO_SUCH_USER}]\nweight = 0\n", CONFIG)


def test_the_skipped_section_is_a_warning_at_start(tmp_path):
    config = tmp_path / "nvshare.conf"
    config.write_text(f"[scheduler]\ntime_quantum = 20\n[share:user:{NO_SUCH_USER}]\nweight = 3\n")
    start = settings_at_start(config, SettingsStore(tmp_path / "state"))
    assert start.config_problem == ""
    assert start.settings.time_quantum_s == 20
    assert any(f"[share:user:{NO_SUCH_USER}] skipped" in w for w in start.warnings)
    assert start.origin.warnings == tuple(w for w in start.warnings if "skipped" in w)


# ---------------------------------------------------------------- sizes


@pytest.mark.parametrize(
    "text, message",
    [
        (
            "[scheduler]\nmemory_limit = 1\n",
            "line 2: memory_limit must be 0 (no limit) or 1M..16T (1 MiB..16 TiB), got 1 bytes: "
            "a size without a unit is bytes (write 40G for 40 GiB)",
        ),
        ("[scheduler]\nmemory_limit = 999999T\n", "line 2: memory_limit must be 0 (no limit)"),
        ("[gpu:0]\nmemory_limit = 17T\n", "line 2: [gpu:0] memory_limit must be 0 (no limit)"),
        (
            "[share:user:0]\nmemory_cap = 999999T\n",
            "line 2: [share:user:0] memory_cap: a share's memory_cap must be 0 (no cap) or 1M..16T",
        ),
        (f"[share:user:0]\nmemory_cap = {2**70}\n", "a share's memory_cap must be 0 (no cap)"),
    ],
)
def test_a_size_out_of_range_is_refused_naming_its_setting(text, message):
    with pytest.raises(SettingsError) as error:
        parse_config(text, CONFIG)
    assert message in str(error.value), str(error.value)


def test_sizes_at_the_bounds_are_taken():
    for name in ("memory_limit_bytes", "memory_cap_bytes"):
        for size in (0, 1 << 20, 16 << 40):
            check_setting(name, size)
        for size in (1, (1 << 20) - 1, (16 << 40) + 1, 2**64):
            with pytest.raises(SettingsError):
                check_setting(name, size)


# ---------------------------------------------------------------- sources


def test_each_value_says_whether_it_is_the_default_the_files_or_set_at_run_time(tmp_path):
    config = tmp_path / "nvshare.conf"
    config.write_text(
        "[scheduler]\ntime_quantum = 20\nanti_thrash = on\n[gpu:1]\ntime_quantum = 5\n"
        "[share:user:0]\nweight = 3\n"
    )
    store = SettingsStore(tmp_path / "state")
    before = settings_at_start(config, store)
    after = before.settings.replaced(time_quantum_s=7).with_gpu_overrides(
        [("1", GpuOverrides()), ("2", GpuOverrides(time_quantum_s=9))]
    )
    changed = ["time_quantum_s", "gpu_overrides"]
    store.save_overrides(overrides_after(before.overrides, before.settings, after, changed))

    start = settings_at_start(config, store)
    rows = by_name(value_sources(start.origin, start.overrides, start.settings))
    tq = rows[("scheduler", "time_quantum")]
    assert (tq.value, tq.source, tq.file_value) == (7, Source.RUN_TIME, 20)
    assert tq.reset_command() == "nvsharectl reset-setting time_quantum"
    anti = rows[("scheduler", "anti_thrash")]
    assert (anti.value, anti.source, anti.reset_command()) == (AntiThrash.ON, Source.FILE, "")
    assert rows[("scheduler", "min_slice_ms")].source is Source.DEFAULT
    # GPU 1's own quantum was taken away at run time: the node's applies, the file says 5.
    gpu1 = rows[("gpu:1", "time_quantum")]
    assert (gpu1.value, gpu1.source, gpu1.file_value) == (None, Source.RUN_TIME, 5)
    assert gpu1.reset_command() == "nvsharectl reset-setting time_quantum --gpu 1"
    gpu2 = rows[("gpu:2", "time_quantum")]
    assert (gpu2.value, gpu2.source, gpu2.file_value) == (9, Source.RUN_TIME, None)
    share = rows[("share:user:0", "weight")]
    assert (share.value, share.source) == (3, Source.FILE)
    # At start, the agent says which run-time values hide the file's.
    shadowed = [w for w in start.warnings if "was set at run time" in w]
    assert shadowed == [
        "[scheduler] time_quantum = 7 was set at run time and wins over the config's 20 "
        "(nvsharectl reset-setting time_quantum goes back to it)",
        "[gpu:1] time_quantum = (the node's) was set at run time and wins over the config's 5 "
        "(nvsharectl reset-setting time_quantum --gpu 1 goes back to it)",
    ]


def test_taking_a_run_time_value_back_gives_the_files_again(tmp_path):
    config = tmp_path / "nvshare.conf"
    config.write_text("[scheduler]\ntime_quantum = 20\n[share:user:0]\nweight = 3\n")
    store = SettingsStore(tmp_path / "state")
    base, overrides, _ = load_settings(config, store)
    after = base.replaced(time_quantum_s=7, shares=(("user:0", Share(weight=5)),))
    overrides = overrides_after(overrides, base, after, ["time_quantum_s", "shares"])

    in_file = parse_config(config.read_text(), config)
    kind, entry, name = pin_address("scheduler", "time-quantum")
    left = without_pin(overrides, kind, entry, name)
    settings, left, _ = settings_over(in_file, left, store.path)
    assert settings.time_quantum_s == 20 and dict(settings.shares)["user:0"].weight == 5

    kind, entry, name = pin_address("share:user:0", "weight")
    settings, left, _ = settings_over(in_file, without_pin(left, kind, entry, name), store.path)
    assert dict(settings.shares)["user:0"].weight == 3 and left == {"shares": {}}


@pytest.mark.parametrize(
    "section, key, message",
    [
        ("scheduler", "speed", "[scheduler] has no setting 'speed' (known: time_quantum, "),
        ("gpu:1", "share_by", "[gpu:1] has no setting 'share_by' (known: time_quantum, "),
        ("share:user:0", "time_quantum", "(known: weight, memory_cap)"),
        ("gpu:the-big-one", "time_quantum", "a GPU is named by its UUID"),
        ("schedule", "time_quantum", "a settings section is scheduler, gpu:ID or share:GROUP"),
    ],
)
def test_a_setting_that_is_not_one_is_one_sentence_naming_it(section, key, message):
    with pytest.raises(SettingsError) as error:
        pin_address(section, key)
    assert message in str(error.value), str(error.value)


# ---------------------------------------------------------------- the config problem


def test_a_config_problem_says_the_run_time_values_that_are_served(tmp_path):
    config = tmp_path / "nvshare.conf"
    config.write_text("[scheduler]\ntime_quantum = 20\nspeed = 3\n")
    store = SettingsStore(tmp_path / "state")
    store.save_overrides({"time_quantum_s": 7})
    start = settings_at_start(config, store)
    assert start.settings.time_quantum_s == 7
    assert (
        "; serving with the built-in defaults (no config was good before), and over it the "
        f"values set at run time (time_quantum = 7; {store.path}): fix the file"
    ) in start.config_problem
    rows = by_name(value_sources(start.origin, start.overrides, start.settings))
    assert rows[("scheduler", "time_quantum")].file_value == 30
    assert rows[("scheduler", "anti_thrash")].source is Source.DEFAULT


def test_while_the_file_is_broken_its_last_good_copys_values_say_so(tmp_path):
    config = tmp_path / "nvshare.conf"
    store = SettingsStore(tmp_path / "state")
    config.write_text("[scheduler]\ntime_quantum = 20\n")
    settings_at_start(config, store)
    config.write_text("[scheduler]\ntime_quantum = 20\nspeed = 3\n")
    start = settings_at_start(config, store)
    rows = by_name(value_sources(start.origin, start.overrides, start.settings))
    assert rows[("scheduler", "time_quantum")].source is Source.LAST_GOOD
    assert start.settings == Settings(time_quantum_s=20)
