"""Share settings in the config file and the state file (settings_files.py): what a
good [share:GROUP] section gives, and one line naming the line for a bad one."""

from pathlib import Path

import pytest

from nvshare_agent.settings import SettingsError, Share, ShareBy
from nvshare_agent.settings_files import SettingsStore, load_settings, overrides_after, parse_config

CONFIG = Path("/etc/nvshare/nvshare.conf")


def test_share_sections_give_weights_and_caps_and_share_by():
    settings = parse_config(
        "[scheduler]\nshare_by = unit\n\n[share:user:0]\nweight = 3\nmemory_cap = 4G\n"
        "[share:unit:jupyter-bob.service]\nmemory_cap = none\nweight = 1\n",
        CONFIG,
    )
    assert settings.share_by is ShareBy.UNIT
    assert dict(settings.shares) == {
        "user:0": Share(weight=3, memory_cap_bytes=4 << 30),
        "unit:jupyter-bob.service": Share(weight=1, memory_cap_bytes=0),
    }


@pytest.mark.parametrize(
    "text, message",
    [
        ("[scheduler]\nshare_by = team\n", "line 2: share_by must be user, unit or process"),
        ("[share:user:0]\nweight = 0\n", "line 2: [share:user:0] weight: a share's weight must be"),
        ("[share:user:0]\nweight = two\n", "line 2: [share:user:0] weight must be a whole number"),
        ("[share:user:0]\nmemory_cap = lots\n", "line 2: [share:user:0] memory_cap: a size is"),
        ("[share:user:0]\ncolour = red\n", "line 2: unknown key 'colour' in [share:user:0]"),
        ("[share:process:42]\nweight = 2\n", "line 1: [share:process:42]: a share group is"),
    ],
)
def test_a_bad_share_line_is_one_line_naming_it(text, message):
    with pytest.raises(SettingsError) as error:
        parse_config(text, CONFIG)
    assert message in str(error.value) and "\n" not in str(error.value), str(error.value)


def test_run_time_shares_are_saved_per_group_and_win_over_the_file(tmp_path):
    config = tmp_path / "nvshare.conf"
    config.write_text("[share:user:0]\nweight = 3\n[share:user:1]\nweight = 2\n")
    store = SettingsStore(tmp_path / "state")
    before, overrides, _ = load_settings(config, store)
    after = before.replaced(shares=(("user:1", Share(weight=5)),))  # user:0 reset
    store.save_overrides(overrides_after(overrides, before, after, ["shares"]))
    config.write_text(
        "[share:user:0]\nweight = 3\n[share:user:1]\nweight = 2\n[share:user:2]\nweight = 4\n"
    )
    loaded, _, warning = load_settings(config, store)
    assert warning is None
    # user:0 stays reset, user:1 keeps its run-time weight, user:2 follows the file.
    assert dict(loaded.shares) == {"user:1": Share(weight=5), "user:2": Share(weight=4)}


def test_a_broken_saved_share_is_a_warning_and_the_rest_applies(tmp_path):
    store = SettingsStore(tmp_path)
    store.path.write_text('{"shares": {"user:0": {"weight": 0}, "user:1": {"weight": 2}}}')
    settings, _, warning = load_settings(tmp_path / "absent.conf", store)
    assert "ignoring saved shares" in warning and "\n" not in warning
    assert dict(settings.shares) == {"user:1": Share(weight=2)}
