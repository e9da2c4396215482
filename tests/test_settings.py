"""Settings per GPU: naming a GPU, validation (agent/settings.py), the config file's [gpu:ID]
sections and the state file's saved changes (agent/settings_files.py); and the node-wide
switch of the fair page (fair_page), which goes the same ways.  No agent runs here; the agent's own
start-up with such files is in tests/agent/test_settings_files.py."""

from __future__ import annotations

import json

import pytest

from nvshare_agent.settings import (
    MAX_GPUS_WITH_SETTINGS,
    AntiThrash,
    FairPage,
    GpuOverrides,
    Settings,
    SettingsError,
    gpu_key,
    parse_gpu_id,
)
from nvshare_agent.settings_files import SettingsStore, load_config, load_settings, overrides_after

UUID = "GPU-5374616e-6469-6e00-0000-000000000001"
UUID_RAW = bytes.fromhex("5374616e64696e000000000000000001")


def entries(settings: Settings) -> dict[str, dict]:
    return {gpu_id: own.given() for gpu_id, own in settings.gpu_overrides}


# ---------------------------------------------------------------- naming a GPU


@pytest.mark.parametrize(
    "text, canonical",
    [
        ("1", "1"),
        (" 01 ", "1"),
        ("0", "0"),
        (UUID, UUID),
        (UUID.upper().replace("GPU-", "gpu-"), UUID),
    ],
)
def test_a_gpu_is_named_by_nvml_index_or_uuid_in_one_spelling(text, canonical):
    assert parse_gpu_id(text) == canonical


@pytest.mark.parametrize(
    "text", ["", "one", "-1", "1.0", "GPU-1234", "MIG-" + UUID[4:], "\uff11", "99999", UUID + "0"]
)
def test_anything_else_is_not_a_gpu(text):
    # (U+FF11 is a fullwidth 1: a digit to str.isdigit, no number to an admin.)
    with pytest.raises(SettingsError, match="a GPU is named by its UUID .* or its NVML index"):
        parse_gpu_id(text)


def test_the_core_matches_uuids_by_their_bytes_and_indices_by_number():
    assert gpu_key(UUID.upper()) == UUID_RAW
    assert gpu_key("007") == 7


# ---------------------------------------------------------------- validation


def test_an_override_is_checked_like_the_node_wide_setting_and_names_the_gpu():
    with pytest.raises(SettingsError) as error:
        Settings().with_gpu_overrides([("1", GpuOverrides(time_quantum_s=0))])
    assert str(error.value) == "GPU 1: time quantum must be 1..86400 seconds, got 0"
    with pytest.raises(
        SettingsError, match=f"^GPU {UUID}: memory_limit must be 0 \\(no limit\\) or 1M..16T"
    ):
        Settings().with_gpu_overrides([(UUID, GpuOverrides(memory_limit_bytes=-1))])


def test_two_names_of_one_gpu_are_refused():
    with pytest.raises(SettingsError, match="^GPU 1 and GPU 01 name the same GPU$"):
        Settings().with_gpu_overrides(
            [("1", GpuOverrides(time_quantum_s=5)), ("01", GpuOverrides(time_quantum_s=6))]
        )
    with pytest.raises(SettingsError, match="name the same GPU"):
        Settings().replaced(
            gpu_overrides=(
                ("1", GpuOverrides(time_quantum_s=5)),
                ("1", GpuOverrides(time_quantum_s=6)),
            )
        )


def test_only_so_many_gpus_may_have_settings_of_their_own():
    many = [(str(i), GpuOverrides(time_quantum_s=5)) for i in range(MAX_GPUS_WITH_SETTINGS + 1)]
    with pytest.raises(SettingsError, match=f"at most {MAX_GPUS_WITH_SETTINGS} GPUs"):
        Settings().with_gpu_overrides(many)


def test_entries_are_kept_canonical_sorted_and_without_empty_ones():
    settings = Settings().with_gpu_overrides(
        [
            (UUID.upper(), GpuOverrides(anti_thrash=AntiThrash.OFF)),
            ("10", GpuOverrides(time_quantum_s=5)),
            ("2", GpuOverrides(memory_limit_bytes=0)),  # 0 is a value: no limit
            ("3", GpuOverrides()),
        ]
    )
    assert list(entries(settings)) == ["2", "10", UUID]
    assert entries(settings)["2"] == {"memory_limit_bytes": 0}
    # A value type: equal settings are equal, and hashable.
    assert hash(settings) == hash(Settings().with_gpu_overrides(settings.gpu_overrides))


def test_a_gpu_runs_by_its_own_settings_and_the_node_wide_rest():
    node = Settings(time_quantum_s=30, anti_thrash=AntiThrash.AUTO, drop_grace_ms=700)
    own = GpuOverrides(time_quantum_s=1, memory_limit_bytes=1 << 30)
    effective = node.with_gpu_overrides([("0", own)]).for_gpu(own)
    assert (effective.time_quantum_s, effective.anti_thrash) == (1, AntiThrash.AUTO)
    assert (effective.memory_limit_bytes, effective.drop_grace_ms) == (1 << 30, 700)
    assert effective.gpu_overrides == ()


# ---------------------------------------------------------------- the config file

CONFIG = f"""\
[scheduler]
time_quantum = 30
anti_thrash = auto

[gpu:1]
time_quantum = 10
anti_thrash = off

[gpu:{UUID.upper()}]
memory_limit = 40G
"""


def test_gpu_sections_give_gpus_settings_of_their_own(tmp_path):
    config = tmp_path / "nvshare.conf"
    config.write_text(CONFIG)
    settings = load_config(config)
    assert (settings.time_quantum_s, settings.anti_thrash) == (30, AntiThrash.AUTO)
    assert entries(settings) == {
        "1": {"time_quantum_s": 10, "anti_thrash": AntiThrash.OFF},
        UUID: {"memory_limit_bytes": 40 << 30},
    }


@pytest.mark.parametrize(
    "section, message",
    [
        (
            "[gpu:1]\nidle_release_ms = 5\n",
            "line 4: unknown key 'idle_release_ms' in [gpu:1] "
            "(known: time_quantum, anti_thrash, memory_limit, light_wait_ms)",
        ),
        ("[gpu:first]\ntime_quantum = 5\n", "line 3: [gpu:first]: a GPU is named by its UUID"),
        ("[gpu:]\ntime_quantum = 5\n", "line 3: [gpu:]: a GPU is named by its UUID"),
        (
            "[gpu:1]\ntime_quantum = 0\n",
            "line 4: [gpu:1] time_quantum: time quantum must be 1..86400 seconds, got 0",
        ),
        ("[gpu:1]\ntime_quantum = ten\n", "line 4: [gpu:1] time_quantum must be a whole number"),
        (
            "[gpu:1]\n\nanti_thrash = maybe\n",
            "line 5: [gpu:1] anti_thrash: anti-thrash must be on, off",
        ),
        ("[gpu:1]\nmemory_limit = lots\n", "line 4: [gpu:1] memory_limit: a size is a whole"),
        ("[gpu:1]\n[gpu:01]\n", "line 4: [gpu:01] and [gpu:1] name the same GPU"),
        (
            "[GPU:1]\n",
            "line 3: unknown section [GPU:1] (only [scheduler], [gpu:ID] and [share:GROUP])",
        ),
    ],
)
def test_a_bad_gpu_section_is_one_line_naming_it(tmp_path, section, message):
    config = tmp_path / "nvshare.conf"
    config.write_text("[scheduler]\ntime_quantum = 30\n" + section)
    with pytest.raises(SettingsError) as error:
        load_config(config)
    text = str(error.value)
    assert text.startswith(f"config {config} line ") and message in text and "\n" not in text


def test_too_many_gpu_sections_is_one_line_without_a_line_number(tmp_path):
    config = tmp_path / "nvshare.conf"
    config.write_text("".join(f"[gpu:{i}]\ntime_quantum = 5\n" for i in range(300)))
    with pytest.raises(SettingsError, match=f"^config {config}: at most 256 GPUs"):
        load_config(config)


# ---------------------------------------------------------------- changes saved at run time


def test_gpu_settings_changed_at_run_time_survive_a_restart_key_by_key(tmp_path):
    config = tmp_path / "nvshare.conf"
    config.write_text(CONFIG)
    store = SettingsStore(tmp_path / "state")
    before, overrides, warning = load_settings(config, store)
    assert warning is None and overrides == {}
    # The admin sets GPU 1's quantum, takes away its anti-thrash, gives GPU 2 a mode,
    # and leaves the UUID's memory limit as the config has it.
    after = before.with_gpu_overrides(
        [
            ("1", GpuOverrides(time_quantum_s=3)),
            ("2", GpuOverrides(anti_thrash=AntiThrash.ON)),
            (UUID, GpuOverrides(memory_limit_bytes=40 << 30)),
        ]
    )
    saved = overrides_after(overrides, before, after, ["gpu_overrides"])
    assert saved == {
        "gpus": {
            "1": {"time_quantum_s": 3, "anti_thrash": None},
            "2": {"anti_thrash": AntiThrash.ON},
        }
    }
    store.save_overrides(saved)
    assert json.loads(store.path.read_text())["gpus"]["2"] == {"anti_thrash": "on"}

    again, _, warning = load_settings(config, store)
    assert warning is None and again == after
    # What was not changed at run time still follows the config file.
    config.write_text(CONFIG.replace("40G", "20G").replace("= 10", "= 12"))
    edited, _, _ = load_settings(config, store)
    assert entries(edited) == {
        "1": {"time_quantum_s": 3},
        "2": {"anti_thrash": AntiThrash.ON},
        UUID: {"memory_limit_bytes": 20 << 30},
    }


def test_node_wide_memory_limit_is_saved_like_the_other_settings(tmp_path):
    store = SettingsStore(tmp_path)
    before = Settings()
    after = before.replaced(memory_limit_bytes=8 << 30)
    store.save_overrides(overrides_after({}, before, after, ["memory_limit_bytes"]))
    settings, _, warning = load_settings(tmp_path / "absent.conf", store)
    assert warning is None and settings.memory_limit_bytes == 8 << 30


@pytest.mark.parametrize(
    "broken, reason",
    [
        ({"1": {"time_quantum_s": 0}}, "GPU 1: time quantum must be 1..86400 seconds, got 0"),
        ({"1": {"colour": "red"}}, "GPU 1: unknown setting 'colour'"),
        ({"1": ["time_quantum_s"]}, "GPU 1: not a JSON object"),
        ({"first": {"time_quantum_s": 5}}, "a GPU is named by its UUID"),
        ({"1": {"anti_thrash": "maybe"}}, "GPU 1: anti-thrash must be on, off or auto"),
    ],
)
def test_a_broken_gpu_entry_in_the_state_file_is_one_warning_and_the_configs_values(
    tmp_path, broken, reason
):
    config = tmp_path / "nvshare.conf"
    config.write_text(CONFIG)
    store = SettingsStore(tmp_path / "state")
    store.path.parent.mkdir()
    good = {"2": {"time_quantum_s": 7}}
    store.path.write_text(json.dumps({"time_quantum_s": 20, "gpus": {**broken, **good}}))
    settings, _, warning = load_settings(config, store)
    assert warning is not None and "\n" not in warning
    assert warning.startswith(f"ignoring saved settings of a GPU in {store.path}: ")
    assert reason in warning
    # The node-wide change and the good entry apply; the broken one's GPU has the config's.
    assert settings.time_quantum_s == 20
    assert entries(settings)["2"] == {"time_quantum_s": 7}
    assert entries(settings)["1"] == {"time_quantum_s": 10, "anti_thrash": AntiThrash.OFF}


def test_saved_gpu_settings_that_are_not_an_object_are_one_warning(tmp_path):
    store = SettingsStore(tmp_path)
    store.path.write_text(json.dumps({"time_quantum_s": 20, "gpus": [1, 2]}))
    settings, _, warning = load_settings(tmp_path / "absent.conf", store)
    assert warning == f"ignoring saved GPU settings in {store.path}: not a JSON object"
    assert settings.time_quantum_s == 20 and settings.gpu_overrides == ()


@pytest.mark.parametrize(
    "text, size",
    [
        ("1048576", 1 << 20),
        ("1024K", 1 << 20),
        ("1600M", 1600 << 20),
        ("40G", 40 << 30),
        ("40GiB", 40 << 30),
        ("1T", 1 << 40),
        ("2 tb", 2 << 40),
        ("none", 0),
        ("0", 0),
    ],
)
def test_the_scheduler_section_reads_memory_limit_with_every_suffix(tmp_path, text, size):
    config = tmp_path / "nvshare.conf"
    config.write_text(f"[scheduler]\nmemory_limit = {text}\n")
    assert load_config(config).memory_limit_bytes == size


def test_the_scheduler_section_reads_the_minimum_slice(tmp_path):
    config = tmp_path / "nvshare.conf"
    config.write_text("[scheduler]\nmin_slice_ms = 250\n")
    assert load_config(config).min_slice_ms == 250
    config.write_text("[scheduler]\nmin_slice_ms = soon\n")
    with pytest.raises(SettingsError, match="min_slice_ms"):
        load_config(config)


def test_the_config_reads_light_wait_ms_node_wide_and_per_gpu(tmp_path):
    config = tmp_path / "nvshare.conf"
    config.write_text("[scheduler]\nlight_wait_ms = 300\n\n[gpu:1]\nlight_wait_ms = 100\n")
    settings = load_config(config)
    assert settings.light_wait_ms == 300
    assert entries(settings) == {"1": {"light_wait_ms": 100}}
    own = dict(settings.gpu_overrides)["1"]
    assert settings.for_gpu(own).light_wait_ms == 100  # GPU 1 runs by its own
    assert settings.for_gpu(GpuOverrides()).light_wait_ms == 300  # the others by the node's


@pytest.mark.parametrize(
    "text, line, fragments",
    [
        ("[scheduler]\nlight_wait_ms = soon\n", 2, ["light_wait_ms must be a whole number"]),
        ("[scheduler]\nlight_wait_ms = 10001\n", 2, ["must be 0..10000 milliseconds, got 10001"]),
        ("[scheduler]\n[gpu:1]\nlight_wait_ms = 2.5\n", 3, ["[gpu:1] light_wait_ms must be a"]),
        ("[scheduler]\n[gpu:1]\nlight_wait_ms = -1\n", 3, ["[gpu:1] light_wait_ms", "got -1"]),
    ],
)
def test_a_bad_light_wait_ms_is_one_line_naming_it(tmp_path, text, line, fragments):
    config = tmp_path / "nvshare.conf"
    config.write_text(text)
    with pytest.raises(SettingsError) as error:
        load_config(config)
    message = str(error.value)
    assert message.startswith(f"config {config} line {line}: ") and "\n" not in message
    for fragment in fragments:
        assert fragment in message, message


# ---------------------------------------------------------------- the fair page's switch


def test_the_fair_page_is_on_unless_the_config_turns_it_off(tmp_path):
    config = tmp_path / "nvshare.conf"
    assert load_config(config).fair_page is FairPage.ON  # no file: the default
    config.write_text("[scheduler]\nfair_page = OFF\n")
    assert load_config(config).fair_page is FairPage.OFF


@pytest.mark.parametrize("text", ["maybe", "yes", "0", ""])
def test_a_bad_fair_page_is_one_line_naming_it_and_nothing_else(tmp_path, text):
    config = tmp_path / "nvshare.conf"
    config.write_text(f"[scheduler]\ntime_quantum = 5\nfair_page = {text}\n")
    with pytest.raises(SettingsError) as error:
        load_config(config)
    assert str(error.value) == (
        f"config {config} line 3: fair_page must be on or off, got {text!r}"
    )
    with pytest.raises(SettingsError, match="fair_page must be on or off, got 'off'"):
        Settings().replaced(fair_page="off")  # the words, not the value: a caller's bug


def test_the_fair_page_switched_at_run_time_is_saved_and_wins_over_the_file(tmp_path):
    config = tmp_path / "nvshare.conf"
    config.write_text("[scheduler]\nfair_page = on\n")
    store = SettingsStore(tmp_path / "state")
    before = load_config(config)
    after = before.replaced(fair_page=FairPage.OFF)
    store.save_overrides(overrides_after({}, before, after, ["fair_page"]))
    assert json.loads(store.path.read_text()) == {"fair_page": "off"}
    settings, overrides, warning = load_settings(config, store)
    assert warning is None and settings.fair_page is FairPage.OFF
    assert overrides == {"fair_page": FairPage.OFF}


def test_a_saved_fair_page_that_is_not_on_or_off_is_one_warning(tmp_path):
    store = SettingsStore(tmp_path)
    store.path.write_text(json.dumps({"time_quantum_s": 20, "fair_page": "sometimes"}))
    settings, _, warning = load_settings(tmp_path / "absent.conf", store)
    assert warning == (
        f"ignoring saved settings {store.path}: fair_page must be on or off, got 'sometimes'"
    )
    assert settings.fair_page is FairPage.ON and settings.time_quantum_s == 30
