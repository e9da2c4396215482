"""Where the settings come from, put together at start.

Precedence: built-in defaults < the config file (config_file.py) < changes made
at run time through the control plane, saved as JSON under the state directory
(settings_store.py) so that they survive a restart.  Only what was changed at
run time is saved, per field, so an admin's later edit of the config file still
applies to everything else; where a run-time change hides the file's value, the
agent says so at start, and status shows each value's source
(settings_sources.py).  A config file the agent cannot use is served around
with its last good copy (settings_at_start).

The names of the two files' modules are re-exported here: settings_files is
where the rest of the agent (and the tests) look for them.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from .config_file import (
    DEFAULT_CONFIG_PATH,
    ConfigFile,
    load_config,
    load_config_file,
    one_line,
    parse_config,
    parse_config_file,
    read_config_text,
)
from .settings import Settings, SettingsError
from .settings_sources import (
    SettingsOrigin,
    Source,
    run_time_values,
    shadowed_by_run_time,
    value_sources,
)
from .settings_store import (
    DEFAULT_STATE_DIR,
    GPUS_KEY,
    LAST_GOOD_CONFIG_NAME,
    SHARES_KEY,
    STATE_FILE_NAME,
    SettingsStore,
    overrides_after,
    with_gpu_pins,
    with_share_pins,
)

__all__ = [
    "DEFAULT_CONFIG_PATH",
    "DEFAULT_STATE_DIR",
    "LAST_GOOD_CONFIG_NAME",
    "STATE_FILE_NAME",
    "ConfigFile",
    "SettingsStore",
    "StartSettings",
    "load_config",
    "load_config_file",
    "load_settings",
    "overrides_after",
    "parse_config",
    "parse_config_file",
    "settings_at_start",
    "settings_over",
]


def load_settings(
    config_path: Path, store: SettingsStore
) -> tuple[Settings, dict[str, Any], str | None]:
    """Defaults < config < persisted overrides. Returns (settings, overrides, warning).
    Raises SettingsError for a config file that cannot be used."""
    overrides, warning = store.load_overrides()
    settings, overrides, problem = settings_over(load_config(config_path), overrides, store.path)
    return settings, overrides, _joined(warning, problem)


def settings_over(
    base: Settings, overrides: dict[str, Any], path: Path
) -> tuple[Settings, dict[str, Any], str | None]:
    """The config's settings with the run-time changes over them: (settings, the
    changes that could be applied, a warning for those that could not).  At start,
    and again when a run-time change is taken back (ResetSetting)."""
    warning = None
    node_wide = {k: v for k, v in overrides.items() if k not in (GPUS_KEY, SHARES_KEY)}
    settings = base.replaced(**node_wide)
    share_pins = overrides.get(SHARES_KEY)
    if share_pins:
        try:
            settings = settings.replaced(shares=with_share_pins(base.shares, share_pins))
        except SettingsError as e:  # each fits, together too many groups
            overrides = {k: v for k, v in overrides.items() if k != SHARES_KEY}
            warning = f"ignoring saved shares in {path}: {one_line(e)[:200]}"
    pins = overrides.get(GPUS_KEY)
    if pins:
        try:
            settings = settings.with_gpu_overrides(with_gpu_pins(base.gpu_overrides, pins))
        except SettingsError as e:  # each fits, together too many GPUs have settings
            overrides = {k: v for k, v in overrides.items() if k != GPUS_KEY}
            problem = f"ignoring saved GPU settings in {path}: {one_line(e)[:200]}"
            warning = _joined(warning, problem)
    return settings, overrides, warning


def _joined(first: str | None, second: str | None) -> str | None:
    return f"{first}; {second}" if first and second else first or second


# ---------------------------------------------------------------- at start


@dataclass(frozen=True)
class StartSettings:
    """What the agent starts with.  A config file it cannot use does not stop it:
    a node whose agent does not run is a node whose processes run unscheduled,
    and systemd would restart it until its start limit takes the socket down
    (issue 36).  It serves with the last good config instead and says so."""

    settings: Settings
    overrides: dict[str, Any]
    # Saved settings ignored, the last good copy not kept, config sections skipped,
    # run-time values that hide the file's.
    warnings: tuple[str, ...] = ()
    # "" when the config file was used; else what is wrong with it (which line),
    # and what the agent serves with instead: one line for the journal, STATUS=,
    # D-Bus (ConfigProblem), nvsharectl status and the metrics.
    config_problem: str = ""
    # What the config gives, for each value's source in status.
    origin: SettingsOrigin = field(default_factory=SettingsOrigin)


def settings_at_start(config_path: Path, store: SettingsStore) -> StartSettings:
    """Defaults < config < persisted overrides, where the config is the file or,
    when the file cannot be used, the last good one (a copy kept in the state
    directory each time the file was good), else the defaults."""
    warnings = []
    error = ""
    try:
        text = read_config_text(config_path)
        config = ConfigFile() if text is None else parse_config_file(text, config_path)
        origin = SettingsOrigin(config.settings, config.node_keys, Source.FILE, config.warnings)
    except SettingsError as e:
        error = one_line(e)
        last_good, instead = store.last_good_config()
        origin = SettingsOrigin()
        if last_good is not None:
            origin = SettingsOrigin(
                last_good.settings, last_good.node_keys, Source.LAST_GOOD, last_good.warnings
            )
    else:
        kept = store.keep_good_config(text)
        if kept:
            warnings.append(kept)
    warnings += origin.warnings
    overrides, saved_warning = store.load_overrides()
    settings, overrides, merge_warning = settings_over(origin.settings, overrides, store.path)
    warnings += [w for w in (saved_warning, merge_warning) if w]
    rows = value_sources(origin, overrides, settings)
    problem = ""
    if error:
        # What is served is the last good config (or the defaults) *and* what was
        # set at run time: saying only the first would hide a value that runs.
        run_time = run_time_values(rows)
        if run_time:
            instead += f", and over it the values set at run time ({run_time}; {store.path})"
        problem = (
            f"{error}; serving with {instead}: fix the file, then restart the agent "
            "(systemctl restart nvshare)"
        )
    else:
        warnings += shadowed_by_run_time(rows)
    return StartSettings(settings, overrides, tuple(warnings), problem, origin)
