"""nvshare node agent: schedules each GPU's lock for processes running under libnvshare.

agent/README.md has the file-to-concern table; ARCHITECTURE.md walks a
lock request and a D-Bus Set through the code.
"""
