"""nvshare node agent: schedules each GPU's lock for processes running under libnvshare.

Modules: scheduler (pure core), protocol (wire format from shim/nvshare_protocol.h),
server (socket adapter), systemd, nvml, settings, daemon (wiring and the Agent facade).
"""
