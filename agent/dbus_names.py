"""The D-Bus names of nvshare's control API: the one definition that the agent
(which exports them) and nvsharectl (which calls them) both import.

Freedesktop style: reverse-DNS, and the bus name, object path and interface all
end in the API version `1` (as org.freedesktop.login1), so an incompatible API
can later be published as `...Scheduler2` beside this one.  The policy file
systemd/io.github.nvshare.Scheduler1.conf and the activation file
systemd/io.github.nvshare.Scheduler1.service spell the same names; a test
checks that they agree with this module.
"""

BUS_NAME = "io.github.nvshare.Scheduler1"
OBJECT_PATH = "/io/github/nvshare/Scheduler1"
INTERFACE = "io.github.nvshare.Scheduler1"
# The share groups' interface, on the same object (agent/dbus_shares.py).
SHARES_INTERFACE = "io.github.nvshare.Shares1"

# Members, so that no caller spells them twice.
PROP_TIME_QUANTUM = "TimeQuantum"  # u, seconds, read-write
PROP_ANTI_THRASH = "AntiThrash"  # b, read-write: false only when off (clients from before auto)
PROP_ANTI_THRASH_MODE = "AntiThrashMode"  # s, read-write: on, off or auto
PROP_MEMORY_LIMIT = "MemoryLimit"  # t, bytes, read-write: 0 none
PROP_GPU_SETTINGS = "GpuSettings"  # a{sa{sv}}, read-write: GPU id -> GPU_SETTINGS_FIELDS
PROP_FAIR_PAGE = "FairPage"  # s, read-write: on or off
PROP_GPUS = "Gpus"  # GPUS_SIGNATURE, read-only
PROP_CLIENTS = "Clients"  # CLIENTS_SIGNATURE, read-only
PROP_GPU_DETAILS = "GpuDetails"  # a{sa{sv}}, read-only: uuid -> GPU_DETAIL_FIELDS
PROP_CLIENT_DETAILS = "ClientDetails"  # a{ua{sv}}, read-only: pid -> CLIENT_DETAIL_FIELDS
PROP_STATISTICS = "Statistics"  # a{sa{sv}}, read-only, no signal: uuid -> STATISTICS_FIELDS
PROP_CONFIG_PROBLEM = "ConfigProblem"  # s, read-only: why the config file is not used; "" fine
PROP_CONFIG_WARNINGS = "ConfigWarnings"  # as, read-only: config sections not applied
METHOD_GET_GPU = "GetGpu"  # (s uuid) -> GPU_SIGNATURE
METHOD_GET_SETTINGS = "GetSettings"  # () -> aa{sv}: SETTING_SOURCE_FIELDS, each value's source
METHOD_RESET_SETTING = "ResetSetting"  # (s section, s key): back to the config file's value

# The interface itself, member by member, is agent/io.github.nvshare.Scheduler1.xml.
# The structs, field by field: D-Bus type and the name that the agent's
# snapshot attributes and nvsharectl's --json keys both use.
GPU_FIELDS = (
    ("uuid", "s"),
    ("name", "s"),
    ("memory_total_bytes", "t"),
    ("holder_pids", "au"),
    ("queue_pids", "au"),
)  # queue in FCFS order
CLIENT_GPU_FIELDS = (
    ("uuid", "s"),
    ("state", "s"),  # idle / waiting / holding / draining
    ("allocated_bytes", "t"),
    ("holding_seconds", "d"),
)
# GpuDetails' keys per GPU (an open dict: keys may be added without a new API).
GPU_DETAIL_FIELDS = (
    ("anti_thrash", "s"),  # what it runs by: its own setting, else the node's
    ("mode", "s"),
    ("memory_capacity_bytes", "t"),
    ("memory_demand_bytes", "t"),
    ("time_quantum_s", "u"),  # its own, else the node's
    ("memory_limit_bytes", "t"),  # its own, else the node's; 0 none
    ("index", "i"),  # NVML's number for it; -1: not in NVML's inventory
)
# GpuSettings' keys per GPU id (a "GPU-..." UUID or an NVML index such as "1"):
# only the settings that GPU has of its own.  The names are the settings'
# field names in agent/settings.py.
GPU_SETTINGS_FIELDS = (
    ("time_quantum_s", "u"),
    ("anti_thrash", "s"),
    ("memory_limit_bytes", "t"),
    ("light_wait_ms", "u"),
)
# GetSettings' keys per value ("value" and "file_value" are of the setting's type:
# SETTING_TYPES, by the config file's key).
SETTING_SOURCE_FIELDS = (
    ("section", "s"),
    ("key", "s"),
    ("value", "v"),
    ("source", "s"),
    ("file_value", "v"),
    ("reset", "s"),
)
SETTING_TYPES = {
    "time_quantum": "u",
    "anti_thrash": "s",
    "idle_release_ms": "u",
    "drop_grace_ms": "u",
    "light_wait_ms": "u",
    "min_slice_ms": "u",
    "memory_limit": "t",
    "share_by": "s",
    "fair_page": "s",
    "weight": "u",
    "memory_cap": "t",
}
CLIENT_DETAIL_FIELDS = (("user", "s"), ("unit", "s"), ("container", "s"))
# ClientDetails' "per_gpu" key (a{sa{sv}}): per GPU uuid, what the client did
# and waited there.  Beside the Clients struct, not in it: a struct field more
# would change Clients' signature, which clients from before would refuse.
CLIENT_PER_GPU_KEY = "per_gpu"
CLIENT_GPU_DETAIL_FIELDS = (
    ("gpu_seconds", "d"),  # its GPU time there since it came (the shim's measure)
    ("recent_use", "d"),  # share of the last ~10 s it kept the GPU busy
    ("wait_cause", "s"),  # waiting: why now (memory, turn, latency work, share); else ""
    ("waited_s", "a{sd}"),  # seconds waited there so far, by cause, the wait under way too
)
# Shares1's Groups (aa{sv}): each share group on each GPU, a dict of these (an open
# dict: keys may be added without a new API).
GROUP_FIELDS = (
    ("gpu", "s"),
    ("group", "s"),  # user:UID, unit:NAME, pod:UID or process:PID
    ("weight", "u"),
    ("memory_cap_bytes", "t"),  # 0: none
    ("use", "d"),  # its clients' recent use together (~10 s)
    ("share", "d"),  # its GPU time over the last minute's time
    ("clients", "u"),
    # Counters since it came to the GPU, its clients that have gone included
    # (agent/group_totals.py): its GPU time there, and seconds waited by cause.
    ("gpu_seconds", "d"),
    ("waited_s", "a{sd}"),
)
# Groups' figures that move with time: they alone are no change (no PropertiesChanged).
GROUP_MOVING_FIELDS = ("use", "share", "gpu_seconds", "waited_s")
STATISTICS_FIELDS = (
    ("grants", "t"),
    ("drops", "t"),
    ("revokes", "t"),
    ("wait_seconds_sum", "d"),
    ("wait_seconds_buckets", "a(dt)"),
)
CLIENT_FIELDS = (
    ("pid", "u"),
    ("uid", "u"),
    ("gid", "u"),
    ("command", "s"),
    ("gpus", "a(" + "".join(t for _, t in CLIENT_GPU_FIELDS) + ")"),
)


def _struct(fields) -> str:
    return "(" + "".join(dbus_type for _, dbus_type in fields) + ")"


GPU_SIGNATURE = _struct(GPU_FIELDS)  # (sstauau)
GPUS_SIGNATURE = "a" + GPU_SIGNATURE
CLIENT_SIGNATURE = _struct(CLIENT_FIELDS)  # (uuusa(sstd))
CLIENTS_SIGNATURE = "a" + CLIENT_SIGNATURE

# Named errors; every one carries a one-line human sentence.
ERROR_PREFIX = INTERFACE + ".Error."
ERROR_INVALID_ARGUMENT = ERROR_PREFIX + "InvalidArgument"
ERROR_ACCESS_DENIED = ERROR_PREFIX + "AccessDenied"
ERROR_UNKNOWN_GPU = ERROR_PREFIX + "UnknownGpu"
ERROR_SAVE_FAILED = ERROR_PREFIX + "SaveFailed"  # the change could not be saved: nothing changed
ERROR_FAILED = ERROR_PREFIX + "Failed"

# Who may change settings, besides root.  The policy file grants the same
# group; the agent checks it again for each call (defence in depth).
ADMIN_GROUP = "nvshare-admin"

# What a caller should run when the agent is not on the bus.
START_HINT = "is nvshare.socket enabled? try: systemctl enable --now nvshare.socket"
